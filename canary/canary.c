/*
 * The parent side of canary runs (canary.h has the protocol and the locks):
 * the declared tests, the helper processes' life (posix_spawn, READY, kill
 * and restart; the memcheck helper under compute-sanitizer), and one run:
 * under memcheck first, each test on the new version, in the memcheck
 * helper; then, in the plain helper, load the new image (and the running
 * one when a test compares or the perf guard is on), launch each test under
 * a deadline, compare, time both versions, apply the perf guard, and say
 * what happened in the report.
 *
 * The helper is untrusted: its replies are read with a size bound derived
 * from what was asked (a test's buffers come back at exactly their declared
 * sizes or the reply is malformed), every wait has a deadline, and a helper
 * that overruns one, dies, or answers nonsense is killed (SIGKILL; reaped
 * without blocking for long) and a fresh one started. Nothing it sends can
 * make the parent wait longer than the run's timeouts or crash it.
 *
 * Starting, killing and reaping the process (never a zombie, never
 * waitpid(-1)) are util/proc.c's, shared with the build helper.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "canary/canary.h"
#include "base/driver.h"
#include "util/util.h"

#define HKA_STR_(x)   #x
#define HKA_STR(x)    HKA_STR_(x)
#define START_FACTOR  10    /* helper start and image loads: timeout x 10 */
#define READY_WAIT_MS 10000 /* at create: as the build helper (ptx/isolate.c) */

/* The tests of one kernel handle. */
typedef struct ktests {
    char module[64], kernel[128];
    int n;
    hk_test *t[HKA_MAX_TESTS];
    struct ktests *next;
} ktests;

/* One helper process (canary.h, "Two helpers"). */
typedef struct helper {
    /* immutable */
    const char *what; /* "the canary helper", "the memcheck helper" */
    const char *who;  /* in a run's messages: "the helper", "the memcheck helper" */
    int sanitized;    /* runs under compute-sanitizer */
    /* run_lock */
    hku_child proc; /* the process, and killed ones not reaped yet */
    int ready;      /* its READY was read */
    /* run_lock, memcheck helper: what the sanitizer reported since the
     * last mc_reset (its stderr's observer) */
    char mc_first[160]; /* the first error line; "" none */
    char mc_api[160];   /* the first API error line ("Program hit ..."), a fallback */
    int mc_errors;
    int mc_first_warn; /* mc_first is a warning ("Warning: Error buffer overflow ..."),
                        * which a report's own line replaces */
} helper;

struct hka_canary {
    /* immutable */
    char *helper_path, *sanitizer;
    int device, timeout_ms, enabled;
    int mc_on;            /* the memcheck helper runs the new version's launches first */
    char mc_off_why[200]; /* why not, when a sanitizer was configured */

    pthread_mutex_t run_lock;
    helper plain, mc; /* run_lock */

    pthread_mutex_t tests_lock;
    ktests *tests; /* tests_lock */

    pthread_mutex_t count_lock; /* a leaf: the counters */
    hka_counters n;             /* count_lock (sanitizer: immutable) */
};

/* ---- tests -------------------------------------------------------------- */

int hk_test_create(hk_test **out, hk_dim3 grid, hk_dim3 block, unsigned shared_bytes) {
    if (!out)
        return HK_ERR_INVALID;
    *out = NULL;
    if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z)
        return HK_ERR_INVALID;
    hk_test *t = calloc(1, sizeof *t);
    if (!t)
        return HK_ERR_NOMEM;
    t->grid[0] = grid.x, t->grid[1] = grid.y, t->grid[2] = grid.z;
    t->block[0] = block.x, t->block[1] = block.y, t->block[2] = block.z;
    t->shared = shared_bytes;
    *out = t;
    return 0;
}

void hk_test_destroy(hk_test *t) {
    if (!t)
        return;
    for (int i = 0; i < t->nargs; i++)
        free(t->args[i].data);
    free(t);
}

static int add_arg(hk_test *t, hka_arg a, const void *bytes, size_t n) {
    if (t->nargs == HKA_MAX_ARGS)
        return HK_ERR_INVALID;
    if (bytes) {
        if (!(a.data = malloc(n ? n : 1)))
            return HK_ERR_NOMEM;
        memcpy(a.data, bytes, n);
    }
    t->args[t->nargs++] = a;
    return 0;
}

int hk_test_scalar(hk_test *t, const void *value, size_t size) {
    if (!t || !value || !size || size > HKA_MAX_SCALAR)
        return HK_ERR_INVALID;
    return add_arg(t, (hka_arg){.kind = HKA_ARG_SCALAR, .size = size}, value, size);
}

int hk_test_buffer(hk_test *t, size_t bytes, hk_fill fill, uint64_t param, const void *host) {
    if (!t || !bytes || (int)fill < HK_FILL_ZERO || fill > HK_FILL_HOST ||
        (fill == HK_FILL_HOST && !host))
        return HK_ERR_INVALID;
    if (bytes > HKA_MAX_TEST_BYTES - t->buffer_bytes)
        return HK_ERR_TOO_LARGE;
    hka_arg a = {.kind = HKA_ARG_BUFFER, .size = bytes, .fill = fill, .param = param};
    int err = add_arg(t, a, fill == HK_FILL_HOST ? host : NULL, bytes);
    if (!err)
        t->buffer_bytes += bytes;
    return err;
}

int hk_test_compare(hk_test *t, hk_compare mode, double atol, double rtol) {
    if (!t || (int)mode < HK_COMPARE_NONE || mode > HK_COMPARE_F64 || !(atol >= 0) || !(rtol >= 0))
        return HK_ERR_INVALID;
    t->compare = mode;
    t->atol = atol;
    t->rtol = rtol;
    return 0;
}

static hk_test *test_dup(const hk_test *t) {
    hk_test *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    *c = *t;
    for (int i = 0; i < c->nargs; i++) {
        c->args[i].data = NULL;
        size_t n = c->args[i].size;
        if (t->args[i].data && !(c->args[i].data = malloc(n))) {
            c->nargs = i;
            hk_test_destroy(c);
            return NULL;
        }
        if (t->args[i].data)
            memcpy(c->args[i].data, t->args[i].data, n);
    }
    return c;
}

int hka_add_test(hka_canary *c, const char *module, const char *kernel, const hk_test *t,
                 hk_report *rep) {
    hk_test *copy = test_dup(t);
    if (!copy)
        return HK_ERR_NOMEM;
    int err = 0;
    if (strlen(module) >= sizeof c->tests->module || strlen(kernel) >= sizeof c->tests->kernel) {
        hk_test_destroy(copy);
        if (rep)
            hku_fail(rep, HK_ERR_INVALID,
                     "kernel '%.60s...': canary tests take kernel names of at most %zu bytes",
                     kernel, sizeof c->tests->kernel - 1);
        return HK_ERR_INVALID;
    }
    pthread_mutex_lock(&c->tests_lock);
    ktests *k = c->tests;
    while (k && (strcmp(k->module, module) || strcmp(k->kernel, kernel)))
        k = k->next;
    if (!k && (k = calloc(1, sizeof *k))) {
        snprintf(k->module, sizeof k->module, "%s", module);
        snprintf(k->kernel, sizeof k->kernel, "%s", kernel);
        k->next = c->tests;
        c->tests = k;
    }
    if (!k)
        err = HK_ERR_NOMEM;
    else if (k->n == HKA_MAX_TESTS)
        err = HK_ERR_TOO_LARGE;
    else
        k->t[k->n++] = copy;
    pthread_mutex_unlock(&c->tests_lock);
    if (err < 0) {
        hk_test_destroy(copy);
        if (rep && err == HK_ERR_TOO_LARGE) {
            rep->error = err;
            snprintf(rep->message, sizeof rep->message,
                     "kernel '%s' has %d test launches already (the most)", kernel, HKA_MAX_TESTS);
        }
    }
    return err;
}

int hka_clear_tests(hka_canary *c, const char *module, const char *kernel) {
    pthread_mutex_lock(&c->tests_lock);
    for (ktests **pp = &c->tests; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->module, module) && !strcmp((*pp)->kernel, kernel)) {
            ktests *k = *pp;
            *pp = k->next;
            for (int i = 0; i < k->n; i++)
                hk_test_destroy(k->t[i]);
            free(k);
            break;
        }
    pthread_mutex_unlock(&c->tests_lock);
    return 0;
}

int hka_has_tests(hka_canary *c, const char *module) {
    int n = 0;
    pthread_mutex_lock(&c->tests_lock);
    for (ktests *k = c->tests; k && !n; k = k->next)
        n = k->n && !strcmp(k->module, module);
    pthread_mutex_unlock(&c->tests_lock);
    return n;
}

/* A run's own copy of a module's tests, taken under tests_lock. */
typedef struct snap {
    int n;
    char (*kernel)[128];
    hk_test **t;
} snap;

static void snap_free(snap *s) {
    for (int i = 0; i < s->n; i++)
        hk_test_destroy(s->t[i]);
    free(s->t);
    free(s->kernel);
    memset(s, 0, sizeof *s);
}

static int snap_take(hka_canary *c, const char *module, snap *s) {
    memset(s, 0, sizeof *s);
    int err = 0, n = 0;
    pthread_mutex_lock(&c->tests_lock);
    for (ktests *k = c->tests; k; k = k->next)
        n += strcmp(k->module, module) ? 0 : k->n;
    if (n && (!(s->t = calloc((size_t)n, sizeof *s->t)) ||
              !(s->kernel = calloc((size_t)n, sizeof *s->kernel))))
        err = HK_ERR_NOMEM;
    for (ktests *k = c->tests; k && !err; k = k->next)
        for (int i = 0; i < k->n && !err && !strcmp(k->module, module); i++) {
            if (!(s->t[s->n] = test_dup(k->t[i]))) {
                err = HK_ERR_NOMEM;
                break;
            }
            snprintf(s->kernel[s->n++], sizeof s->kernel[0], "%s", k->kernel);
        }
    pthread_mutex_unlock(&c->tests_lock);
    if (err)
        snap_free(s);
    return err;
}

/* ---- the helper processes ----------------------------------------------- */

const char *hka_kind_name(hka_kind k) {
    static const char *const names[HKA_NKINDS] = {"fault",  "hang",     "mismatch",
                                                  "slower", "memcheck", "could_not_run"};
    return k >= 0 && k < HKA_NKINDS ? names[k] : "unknown";
}

int hka_sanitizer_argv(char **argv, const char *sanitizer, const char *helper_path, const char *dev,
                       const char *owner) {
    /* --error-exitcode: the sanitizer's own word that it found errors,
     * once the helper ended; --print-limit and no backtraces keep what it
     * writes small (its log must not fill the stderr pipe); API errors are
     * the consequence of a kernel's, not news; its log goes to the
     * helper's stderr pipe (stdout is /dev/null: a kernel's printf).
     * --destroy-on-device-error kernel: a precise error (an out-of-bounds
     * or misaligned access, an illegal address) ends the kernel alone, the
     * launch returns success (its report comes in the log) and the
     * helper's context stays whole, so the refusal costs the GPU nothing:
     * measured on an H200 (bench/RESULTS.md section 11), a program on the
     * same GPU saw no stall at all, against 14-24 ms when the sanitizer
     * ends the context (its default). Imprecise errors (a trap) still end
     * the context and fail the launch. judge replaces the helper after
     * either. */
    const char *v[] = {sanitizer,
                       "--tool",
                       "memcheck",
                       "--error-exitcode",
                       HKA_STR(HKA_SANITIZER_EXIT),
                       "--print-limit",
                       "8",
                       "--show-backtrace",
                       "no",
                       "--report-api-errors",
                       "no",
                       "--destroy-on-device-error",
                       "kernel",
                       "--log-file",
                       "/dev/stderr",
                       helper_path,
                       "--fd",
                       "3",
                       "--device",
                       dev,
                       "--keep-fds",
                       "1",
                       "--owner",
                       owner,
                       NULL};
    int n = 0;
    for (; v[n] && n < HKA_SAN_ARGC - 1; n++)
        argv[n] = (char *)v[n];
    argv[n] = NULL;
    return n;
}

/* compute-sanitizer's log, one line at a time (the memcheck helper's
 * stderr observer). Its lines start with a run of '=' and a space; a
 * report's first line follows at once ("Invalid __global__ write of size 4
 * bytes"), its details are indented. Known lines that report nothing (the
 * banner, the summaries) are skipped; an API error ("Program hit ...") is
 * kept apart, as the consequence of a kernel's error rather than its
 * cause. Anything else the sanitizer prints unindented counts as an
 * error: the parent refuses on it only with a failed launch or the
 * sanitizer's exit status to back it, or on a clean launch whose report
 * came in anyway. */
static void mc_line(void *ctx, const char *line) {
    helper *h = ctx;
    size_t eq = strspn(line, "=");
    if (eq < 3 || line[eq] != ' ' || line[eq + 1] == ' ' || line[eq + 1] == '\0')
        return; /* not the sanitizer's, or a report's detail */
    const char *text = line + eq + 1;
    static const char *const quiet[] = {"COMPUTE-SANITIZER",
                                        "ERROR SUMMARY",
                                        "LEAK SUMMARY",
                                        "RACECHECK SUMMARY",
                                        "Target application returned",
                                        "No CUDA-MEMCHECK results",
                                        NULL};
    for (int i = 0; quiet[i]; i++)
        if (!strncmp(text, quiet[i], strlen(quiet[i])))
            return;
    if (!strncmp(text, "Program hit", 11)) {
        if (!h->mc_api[0])
            snprintf(h->mc_api, sizeof h->mc_api, "%s", text);
        return;
    }
    /* A warning (the sanitizer's error buffer overflowed, records were
     * dropped) says there were errors, but what they were comes in the
     * lines that follow, or came before. */
    int warn = !strncmp(text, "Warning: Error buffer overflow", 30);
    if (!h->mc_errors++ || (h->mc_first_warn && !warn)) {
        snprintf(h->mc_first, sizeof h->mc_first, "%s", text);
        h->mc_first_warn = warn;
    }
}

/* What memcheck said: its first error line, or that its records were
 * dropped (the warning that said so). */
static void mc_what(const helper *h, char *out, size_t n) {
    snprintf(out, n, "%s%s%s", h->mc_first_warn ? "errors, their records dropped (" : "",
             h->mc_first, h->mc_first_warn ? ")" : "");
}

static void mc_reset(helper *h) {
    h->mc_first[0] = h->mc_api[0] = '\0';
    h->mc_errors = h->mc_first_warn = 0;
}

static void helper_init(helper *h, const char *what, const char *who, int sanitized) {
    memset(h, 0, sizeof *h);
    hku_child_init(&h->proc);
    h->what = what;
    h->who = who;
    h->sanitized = sanitized;
    if (sanitized) {
        h->proc.err_line = mc_line;
        h->proc.err_ctx = h;
    }
}

/* Kills the helper (hku_child_kill). run_lock held. */
static void helper_kill(helper *h, char *how, size_t n) {
    hku_child_kill(&h->proc, how, n);
    h->ready = 0;
}

/* Starts a helper; its READY is read by helper_ready. run_lock held. */
static int helper_start(hka_canary *c, helper *h, char *why, size_t n) {
    char dev[16], owner[24];
    snprintf(dev, sizeof dev, "%d", c->device);
    snprintf(owner, sizeof owner, "%ld", (long)getpid());
    char *argv[HKA_SAN_ARGC] = {c->helper_path, "--fd", "3", "--device", dev, NULL};
    if (h->sanitized)
        hka_sanitizer_argv(argv, c->sanitizer, c->helper_path, dev, owner);
    mc_reset(h);
    int err = hku_child_start(&h->proc, h->what, argv, why, n);
    if (err < 0)
        return err;
    h->ready = 0;
    pthread_mutex_lock(&c->count_lock);
    c->n.starts++;
    pthread_mutex_unlock(&c->count_lock);
    return 0;
}

/* Starts the helper if none runs and reads its READY, waiting at most
 * wait_ms for it. run_lock held (or, at create, no other thread). */
static int helper_ready(hka_canary *c, helper *h, char *why, size_t n, double wait_ms) {
    if (h->proc.pid <= 0 && helper_start(c, h, why, n) < 0)
        return HK_ERR_IO;
    if (h->ready)
        return 0;
    uint32_t type = 0;
    unsigned char *d = NULL;
    size_t len = 0;
    double deadline = hku_now_ms() + wait_ms;
    int r = hku_recv(h->proc.fd, HKA_MAGIC, HKA_MAX_TEXT + 8, deadline, &type, &d, &len);
    hku_rd rd = {d, len, 0};
    char text[HKA_MAX_TEXT + 1] = "";
    if (r == 0 && type == HKA_READY && hku_get_u32(&rd) == HKA_PROTOCOL && !hku_end(&rd)) {
        free(d);
        h->ready = 1;
        return 0;
    }
    if (r == 0 && type == HKA_FAIL)
        hku_get_str(&rd, text, sizeof text, HKA_MAX_TEXT);
    free(d);
    char how[160];
    helper_kill(h, how, sizeof how);
    if (text[0])
        snprintf(why, n, "%s could not start: %.200s", h->what, text);
    else
        snprintf(why, n, "%s did not start (%s%s%.160s)", h->what,
                 r == HKU_RECV_TIMEOUT ? "no answer in time"
                 : r == HKU_RECV_EOF   ? "it ended"
                                       : "malformed greeting",
                 how[0] ? ", " : "", how);
    return HK_ERR_IO;
}

/* How long a helper's greeting may take at create. The memcheck helper's
 * is compute-sanitizer's start and the driver's under it: seconds. */
static double ready_wait(const hka_canary *c, const helper *h) {
    double wait = (double)c->timeout_ms * START_FACTOR, cap = h->sanitized ? 30000 : READY_WAIT_MS;
    return wait < cap ? wait : cap;
}

int hka_create(hka_canary **out, const hka_config *cfg, char *why, size_t why_size) {
    if (why && why_size)
        why[0] = '\0';
    hka_canary *c = calloc(1, sizeof *c);
    if (!c)
        return HK_ERR_NOMEM;
    helper_init(&c->plain, "the canary helper", "the helper", 0);
    helper_init(&c->mc, "the memcheck helper", "the memcheck helper", 1);
    c->device = cfg->device;
    c->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 2000;
    pthread_mutex_init(&c->run_lock, NULL);
    pthread_mutex_init(&c->tests_lock, NULL);
    pthread_mutex_init(&c->count_lock, NULL);
    if ((cfg->helper && !(c->helper_path = strdup(cfg->helper))) ||
        (cfg->sanitizer && !(c->sanitizer = strdup(cfg->sanitizer)))) {
        hka_destroy(c);
        return HK_ERR_NOMEM;
    }
    c->enabled = c->helper_path != NULL;
    c->mc_on = c->enabled && c->sanitizer;
    /* Their greetings, at once, as the build helper's: a helper that cannot
     * run (no device, a missing library, another protocol) or never greets
     * fails the creation, saying why, rather than each run; and no later
     * run (nor a destroy waiting for one) waits for a greeting. Both start
     * before either greeting is read: their contexts come up side by side.
     * A memcheck helper that cannot start turns memcheck off, unless it was
     * required. */
    if (cfg->start && c->enabled) {
        char ignored[8], mwhy[300] = "";
        if (c->mc_on)
            helper_start(c, &c->mc, ignored, sizeof ignored);
        if (helper_ready(c, &c->plain, why, why_size, ready_wait(c, &c->plain)) < 0) {
            hka_destroy(c);
            return HK_ERR_IO;
        }
        if (c->mc_on && helper_ready(c, &c->mc, mwhy, sizeof mwhy, ready_wait(c, &c->mc)) < 0) {
            if (cfg->sanitizer_required) {
                snprintf(why, why_size, "%s (%s)", mwhy, c->sanitizer);
                hka_destroy(c);
                return HK_ERR_IO;
            }
            c->mc_on = 0;
            snprintf(c->mc_off_why, sizeof c->mc_off_why, "%.180s", mwhy);
            snprintf(why, why_size, "canary test launches run without memcheck: %s", mwhy);
        }
    }
    c->n.sanitizer = c->mc_on;
    *out = c;
    return 0;
}

void hka_destroy(hka_canary *c) {
    if (!c)
        return;
    pthread_mutex_lock(&c->run_lock);
    hku_child_finish(&c->plain.proc);
    hku_child_finish(&c->mc.proc);
    pthread_mutex_unlock(&c->run_lock);
    while (c->tests) {
        ktests *k = c->tests;
        c->tests = k->next;
        for (int i = 0; i < k->n; i++)
            hk_test_destroy(k->t[i]);
        free(k);
    }
    pthread_mutex_destroy(&c->run_lock);
    pthread_mutex_destroy(&c->tests_lock);
    pthread_mutex_destroy(&c->count_lock);
    free(c->helper_path);
    free(c->sanitizer);
    free(c);
}

void hka_cancel(hka_canary *c) {
    if (!c)
        return;
    /* Without run_lock: a run may hold it. */
    hku_child_cancel(&c->plain.proc);
    hku_child_cancel(&c->mc.proc);
}

void hka_set_kill(hka_canary *c, int sig, int wait_ms) {
    pthread_mutex_lock(&c->run_lock);
    c->plain.proc.kill_sig = c->mc.proc.kill_sig = sig;
    c->plain.proc.kill_wait_ms = c->mc.proc.kill_wait_ms = wait_ms;
    pthread_mutex_unlock(&c->run_lock);
}

pid_t hka_helper_pid(hka_canary *c) {
    pthread_mutex_lock(&c->run_lock);
    pid_t p = c->plain.proc.pid;
    pthread_mutex_unlock(&c->run_lock);
    return p;
}

pid_t hka_memcheck_pid(hka_canary *c) {
    pthread_mutex_lock(&c->run_lock);
    pid_t p = c->mc.proc.pid;
    pthread_mutex_unlock(&c->run_lock);
    return p;
}

void hka_counts(hka_canary *c, hka_counters *out) {
    pthread_mutex_lock(&c->count_lock);
    *out = c->n;
    pthread_mutex_unlock(&c->count_lock);
}

int hka_enabled(const hka_canary *c) {
    return c && c->enabled;
}

int hka_sanitizer(hka_canary *c, char *why, size_t n) {
    if (why && n)
        snprintf(why, n, "%s", c->mc_on ? "" : c->mc_off_why);
    return c->mc_on;
}

/* ---- one run ------------------------------------------------------------- */

#define MC_GRACE_MS     3000 /* a memcheck helper's time to end and say what it found */
#define MC_QUIET_MS     50   /* silence on its log that makes a clean launch clean ... */
#define MC_QUIET_MAX_MS 1000 /* ... waited for at most this long */

typedef struct run {
    hka_canary *c;
    const hka_image *img, *ref;
    const hka_policy *pol;
    int guard;     /* the perf guard is on: test launches are timed */
    int cmp;       /* the running version is loaded in slot 1 of the plain helper */
    int stopped;   /* the canary could no longer run (unavailable said so) */
    int unguarded; /* the trap guard's copy did not load: the image is tested */
    pid_t img_pid; /* the plain helper whose slot 2 holds the new image beside
                    * its copy (0: none; a restarted helper has it no more) */
    int launches, compared, memchecked;
    /* The perf guard's figures of the test that came out worst: the
     * largest ratio against the running version, or (none timed on it) the
     * longest. */
    int timed;
    double new_ms, old_ms, worst;
    hka_kind kind;  /* of the refusal */
    char note[120]; /* the first thing worth saying besides the outcome */
    hk_report *rep;
} run;

/* What a test launch came back with. */
typedef struct outcome {
    int transport;    /* 0, or an HKU_RECV_* code (a failed send is EOF) */
    int in_timing;    /* the transport failed while waiting for TIMED */
    char detail[96];  /* what was malformed */
    uint32_t stage;   /* hka_stage */
    int cu;           /* CUresult where it stopped */
    char cu_name[64]; /* its name, as the helper's driver says */
    uint32_t trap;    /* a guarded site ran (ptx/guard.c's code); stage SYNC, cu 0 */
    uint32_t sites;   /* the guarded sites of the image launched (0: not guarded): a
                       * trap code must name one of them */
    unsigned char *payload;
    const unsigned char *buf[HKA_MAX_ARGS]; /* by argument index: buffers after */
    /* Timed repeats (TIMED), when asked for and the launch finished. */
    int asked; /* runs asked for */
    int timed; /* 1: ms holds the median */
    double ms;
    uint32_t tstage; /* where a repeat stopped (tcu or ttrap not 0) */
    int tcu;
    uint32_t ttrap; /* a repeat reached a guarded site */
    char tcu_name[64];
} outcome;

static void note(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(run *r, const char *fmt, ...) {
    if (r->note[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->note, sizeof r->note, fmt, ap);
    va_end(ap);
}

/* Refuses the version: HK_ERR_CANARY with the kernel, the CUresult (cu 0:
 * none), the kind and the message. */
static int refuse(run *r, hka_kind kind, const char *kernel, int cu, const char *cu_name,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int refuse(run *r, hka_kind kind, const char *kernel, int cu, const char *cu_name,
                  const char *fmt, ...) {
    r->kind = kind;
    hk_report *rep = r->rep;
    if (!rep)
        return HK_ERR_CANARY;
    char text[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (kernel)
        snprintf(rep->kernel, sizeof rep->kernel, "%s", kernel);
    if (cu) {
        rep->cu_result = cu;
        snprintf(rep->cu_name, sizeof rep->cu_name, "%s", cu_name);
    }
    snprintf(rep->canary_refusal, sizeof rep->canary_refusal, "%s", hka_kind_name(kind));
    snprintf(rep->canary, sizeof rep->canary, "refused: %.150s", text);
    return hku_fail(rep, HK_ERR_CANARY, "canary: %s; the running version stays", text);
}

/* The canary could not run: refused under REQUIRE (HK_ERR_CANARY_UNAVAILABLE),
 * else let through; no test runs after it either way. */
static int unavailable(run *r, const char *why) {
    r->stopped = 1;
    if (r->pol->canary == HK_CANARY_REQUIRE) {
        /* Not a verdict on the version (hk_err_is_verdict): its own code,
         * so that a release source tries the same bytes again later. */
        refuse(r, HKA_KIND_NOT_RUN, NULL, 0, NULL, "required but could not run: %s", why);
        if (r->rep)
            r->rep->error = HK_ERR_CANARY_UNAVAILABLE;
        return HK_ERR_CANARY_UNAVAILABLE;
    }
    if (r->rep)
        snprintf(r->rep->canary, sizeof r->rep->canary, "not run: %.150s", why);
    return 0;
}

static const char *entry_of(const hka_image *im, const char *kernel) {
    for (int i = 0; i < im->nexpr; i++)
        if (!strcmp(im->expr[i], kernel))
            return im->lowered[i];
    return kernel;
}

/* The image's description of the entry (NULL: absent, or no metadata). */
static const hkp_entry *find_entry(const hka_image *im, const char *entry) {
    for (int i = 0; i < im->nentries; i++)
        if (!strcmp(im->entries[i].name, entry))
            return &im->entries[i];
    return NULL;
}

/* 0 when t's arguments fit e's parameters, else says how they do not. */
static int misfit(const hk_test *t, const hkp_entry *e, char *why, size_t n) {
    if (e->nparams != t->nargs) {
        snprintf(why, n, "the kernel takes %d parameters, the test gives %d", e->nparams, t->nargs);
        return 1;
    }
    for (int i = 0; i < t->nargs; i++) {
        uint64_t want = t->args[i].kind == HKA_ARG_BUFFER ? sizeof(void *) : t->args[i].size;
        if (e->params[i].size != want) {
            snprintf(why, n, "parameter %d is %u bytes, the test gives %llu", i, e->params[i].size,
                     (unsigned long long)want);
            return 1;
        }
    }
    return 0;
}

/* Loads im into slot. 0; 1 when the helper's driver refused it (cu, name and
 * log say why); or a negative HKU_RECV_* when the exchange failed. */
static int load_slot(hka_canary *c, helper *h, int slot, const hka_image *im, int guarded, int *cu,
                     char *name, char *log) {
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_LOAD);
    hku_put_u32(&b, (uint32_t)slot);
    hku_put_u32(&b, (uint32_t)im->format);
    hku_put_u32(&b, (uint32_t)guarded);
    hku_put(&b, guarded ? im->guard : im->data, guarded ? im->guard_size : im->size);
    double deadline = hku_now_ms() + (double)c->timeout_ms * START_FACTOR;
    int sent = hku_send_by(h->proc.fd, &b, deadline);
    hku_buf_free(&b);
    if (sent < 0)
        return errno == ETIMEDOUT ? HKU_RECV_TIMEOUT : HKU_RECV_EOF;
    uint32_t type = 0;
    unsigned char *d = NULL;
    size_t len = 0;
    int r = hku_recv(h->proc.fd, HKA_MAGIC, 16 + 2 * HKA_MAX_TEXT, deadline, &type, &d, &len);
    if (r < 0)
        return r;
    hku_rd rd = {d, len, 0};
    *cu = (int)hku_get_u32(&rd);
    hku_get_str(&rd, name, 64, 63);
    hku_get_str(&rd, log, HKA_MAX_TEXT + 1, HKA_MAX_TEXT);
    int bad = type != HKA_LOADED || hku_end(&rd);
    free(d);
    return bad ? HKU_RECV_MALFORMED : *cu ? 1 : 0;
}

static const char *recv_what(int r) {
    return r == HKU_RECV_TIMEOUT ? "did not answer in time"
           : r == HKU_RECV_EOF   ? "died"
                                 : "answered nonsense";
}

/* The guarded sites of the new version as its test launches run it: its
 * trap guard's copy where it has one that loaded, else none. */
static uint32_t tested_sites(const run *r) {
    return r->img->guard && !r->unguarded ? (uint32_t)r->img->guard_sites : 0;
}

/* Starts helper h if needed and loads the new image (slot 0) and, when
 * with_ref, the running one (slot 1; a failure there only turns r->cmp
 * off). A helper that died while idle is replaced once. 0, or -1 with
 * why. */
static int prepare(run *r, helper *h, int with_ref, char *why, size_t n) {
    hka_canary *c = r->c;
    char name[64], log[HKA_MAX_TEXT + 1], how[64];
    for (int attempt = 0; attempt < 2; attempt++) {
        if (helper_ready(c, h, why, n, (double)c->timeout_ms * START_FACTOR) < 0)
            return -1;
        int cu = 0, lr = load_slot(c, h, 0, r->img, tested_sites(r) > 0, &cu, name, log);
        if (lr > 0 && tested_sites(r)) {
            /* The copy is checked by nvJitLink only when the image is a
             * cubin: PTX left to the driver may not load. The version is
             * tested as it is rather than not at all. */
            note(r, "the trap guard's copy did not load (%.40s): tested unguarded", name);
            r->unguarded = 1;
            lr = load_slot(c, h, 0, r->img, 0, &cu, name, log);
        }
        if (lr > 0) {
            snprintf(why, n, "it could not load the new version: %s%s%.120s", name,
                     log[0] ? ": " : "", log);
            if (h->sanitized) { /* not left with a context that may be unusable */
                helper_kill(h, how, sizeof how);
                helper_start(c, h, how, sizeof how);
            }
            return -1;
        }
        if (lr == 0 && with_ref && (lr = load_slot(c, h, 1, r->ref, 0, &cu, name, log)) != 0) {
            note(r, "the running version did not load in the canary (%s): not compared",
                 lr > 0 ? name : recv_what(lr));
            r->cmp = 0;
            if (lr > 0)
                return 0;
        }
        if (lr == 0)
            return 0;
        helper_kill(h, how, sizeof how);
        snprintf(why, n, "%s %s while loading an image%s%s", h->who, recv_what(lr),
                 how[0] ? ": " : "", how);
        if (lr != HKU_RECV_EOF)
            break;
    }
    char ignored[8];
    helper_start(c, h, ignored, sizeof ignored); /* warm for the next run */
    return -1;
}

static int send_launch(helper *h, int slot, const char *entry, const hk_test *t, int outputs,
                       int runs, double deadline) {
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_LAUNCH);
    hku_put_u32(&b, (uint32_t)slot);
    hku_put_str(&b, entry, HKA_MAX_TEXT);
    for (int i = 0; i < 3; i++)
        hku_put_u32(&b, t->grid[i]);
    for (int i = 0; i < 3; i++)
        hku_put_u32(&b, t->block[i]);
    hku_put_u32(&b, t->shared);
    hku_put_u32(&b, (uint32_t)t->nargs);
    for (int i = 0; i < t->nargs; i++) {
        const hka_arg *a = &t->args[i];
        hku_put_u32(&b, a->kind);
        hku_put_u64(&b, a->size);
        hku_put_u32(&b, a->fill);
        hku_put_u64(&b, a->param);
        if (a->data)
            hku_put(&b, a->data, a->size);
    }
    hku_put_u32(&b, (uint32_t)outputs);
    hku_put_u32(&b, runs ? HKA_WARMUPS : 0);
    hku_put_u32(&b, (uint32_t)runs);
    int err = hku_send_by(h->proc.fd, &b, deadline);
    hku_buf_free(&b);
    return err;
}

/* A CUresult name from the helper, used only when it looks like one. */
static void sane_cu_name(char *name, size_t n, int cu) {
    int ok = !strncmp(name, "CUDA_", 5);
    for (const char *p = name; ok && *p; p++)
        ok = (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_';
    if (!ok)
        snprintf(name, n, "%s", hkb_cu_name(NULL, (CUresult)cu));
}

/* 1 when where a launch (or its repeats) stopped does not add up: it
 * finished with no error and no trap, or stopped with exactly one of them,
 * a trap only while running and only at one of the image's `sites`
 * guarded sites. */
static int bad_stop(uint32_t stage, int cu, uint32_t trap, uint32_t sites) {
    if (stage == HKA_STAGE_DONE)
        return cu != 0 || trap != 0;
    return (cu != 0) == (trap != 0) ||
           (trap && (stage != HKA_STAGE_SYNC || HKP_GUARD_KIND(trap) == 0 ||
                     HKP_GUARD_SITE(trap) == 0 || HKP_GUARD_SITE(trap) > sites));
}

/* Reads a RESULT strictly: a finished launch returns every buffer at its
 * declared size, in order, and nothing else. */
static void parse_result(const hk_test *t, int outputs, outcome *o, size_t len) {
    hku_rd rd = {o->payload, len, 0};
    o->stage = hku_get_u32(&rd);
    o->cu = (int)hku_get_u32(&rd);
    hku_get_str(&rd, o->cu_name, sizeof o->cu_name, sizeof o->cu_name - 1);
    o->trap = hku_get_u32(&rd);
    uint32_t nout = hku_get_u32(&rd);
    int nbuf = 0;
    for (int i = 0; i < t->nargs; i++)
        nbuf += t->args[i].kind == HKA_ARG_BUFFER;
    uint32_t want = o->stage == HKA_STAGE_DONE && outputs ? (uint32_t)nbuf : 0;
    if (rd.bad || o->stage > HKA_STAGE_DONE || nout != want ||
        bad_stop(o->stage, o->cu, o->trap, o->sites)) {
        snprintf(o->detail, sizeof o->detail, "stage %u, result %d, %u buffers for %u", o->stage,
                 o->cu, nout, want);
        o->transport = HKU_RECV_MALFORMED;
        return;
    }
    for (int i = 0; i < t->nargs && nout; i++) {
        if (t->args[i].kind != HKA_ARG_BUFFER)
            continue;
        uint32_t idx = hku_get_u32(&rd);
        uint64_t size = hku_get_u64(&rd);
        if (rd.bad || idx != (uint32_t)i || size != t->args[i].size) {
            snprintf(o->detail, sizeof o->detail,
                     "buffer %u of %llu bytes where argument %d has %llu", idx,
                     (unsigned long long)size, i, (unsigned long long)t->args[i].size);
            o->transport = HKU_RECV_MALFORMED;
            return;
        }
        o->buf[i] = hku_get(&rd, size);
    }
    if (hku_end(&rd)) {
        snprintf(o->detail, sizeof o->detail, "%s", rd.bad ? "truncated" : "bytes left over");
        o->transport = HKU_RECV_MALFORMED;
        return;
    }
    sane_cu_name(o->cu_name, sizeof o->cu_name, o->cu);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Reads the TIMED that follows a finished launch's RESULT, strictly: as
 * many runs as asked, each within HKA_MAX_RUN_NS, or none and where they
 * stopped. The median of the runs is the launch's time. */
static void recv_timed(helper *h, outcome *o, double deadline) {
    uint32_t type = 0;
    unsigned char *d = NULL;
    size_t len = 0;
    int r = hku_recv(h->proc.fd, HKA_MAGIC, 16 + 64 + 8 * HKA_MAX_RUNS, deadline, &type, &d, &len);
    o->in_timing = 1;
    if (r < 0) {
        o->transport = r;
        snprintf(o->detail, sizeof o->detail, "a timing reply with a bad header or over its size");
        return;
    }
    hku_rd rd = {d, len, 0};
    o->tstage = hku_get_u32(&rd);
    o->tcu = (int)hku_get_u32(&rd);
    hku_get_str(&rd, o->tcu_name, sizeof o->tcu_name, sizeof o->tcu_name - 1);
    o->ttrap = hku_get_u32(&rd);
    uint32_t n = hku_get_u32(&rd);
    double ms[HKA_MAX_RUNS];
    int stopped = o->tcu || o->ttrap;
    int bad = type != HKA_TIMED || rd.bad || n != (stopped ? 0u : (uint32_t)o->asked) ||
              o->tstage > HKA_STAGE_DONE || o->tstage == HKA_STAGE_COPY ||
              bad_stop(o->tstage, o->tcu, o->ttrap, o->sites);
    for (uint32_t i = 0; !bad && i < n; i++) {
        uint64_t ns = hku_get_u64(&rd);
        bad = rd.bad || ns > HKA_MAX_RUN_NS;
        ms[i] = (double)ns / 1e6;
    }
    if (bad || hku_end(&rd)) {
        snprintf(o->detail, sizeof o->detail, "a timing reply of type %u, stage %u, %u runs for %d",
                 type, o->tstage, n, o->asked);
        o->transport = HKU_RECV_MALFORMED;
    } else if (!stopped && n) {
        qsort(ms, n, sizeof *ms, cmp_double);
        o->ms = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
        o->timed = 1;
    } else if (o->tcu) {
        sane_cu_name(o->tcu_name, sizeof o->tcu_name, o->tcu);
    }
    free(d);
}

/* Runs test t on the image in slot of helper h under timeout_ms, with
 * `runs` timed repeats when it finishes (0: none). */
static void do_launch(hka_canary *c, helper *h, int slot, const char *entry, const hk_test *t,
                      int runs, int timeout_ms, uint32_t sites, int keep, outcome *o) {
    memset(o, 0, sizeof *o);
    o->sites = sites;
    /* Under memcheck nothing is compared: the plain run does that; nor are
     * the buffers of a copy whose image runs after it (keep 0). */
    int outputs = keep && t->compare != HK_COMPARE_NONE && !h->sanitized;
    double deadline = hku_now_ms() + timeout_ms;
    if (send_launch(h, slot, entry, t, outputs, runs, deadline) < 0) {
        o->transport = errno == ETIMEDOUT ? HKU_RECV_TIMEOUT : HKU_RECV_EOF;
        return;
    }
    int nbuf = 0;
    for (int i = 0; i < t->nargs; i++)
        nbuf += t->args[i].kind == HKA_ARG_BUFFER;
    /* The largest honest reply: header fields, a name, each buffer. */
    size_t max = 16 + 64 + (outputs ? (size_t)nbuf * 12 + t->buffer_bytes : 0);
    uint32_t type = 0;
    size_t len = 0;
    int r = hku_recv(h->proc.fd, HKA_MAGIC, max, deadline, &type, &o->payload, &len);
    if (r < 0) {
        o->transport = r;
        snprintf(o->detail, sizeof o->detail, "a reply over %zu bytes or with a bad header", max);
        return;
    }
    if (type != HKA_RESULT) {
        snprintf(o->detail, sizeof o->detail, "a message of type %u", type);
        o->transport = HKU_RECV_MALFORMED;
        return;
    }
    parse_result(t, outputs, o, len);
    /* The repeats get the launch timeout each: one that hangs is found as
     * late as a first launch that hangs would be, times the repeats. */
    o->asked = runs;
    if (!o->transport && o->stage == HKA_STAGE_DONE && runs)
        recv_timed(h, o, hku_now_ms() + (double)timeout_ms * (HKA_WARMUPS + runs));
}

static const char *stage_name(uint32_t stage) {
    switch (stage) {
    case HKA_STAGE_SETUP:
        return "setting up";
    case HKA_STAGE_LAUNCH:
        return "launching";
    case HKA_STAGE_SYNC:
        return "running";
    default:
        return "copying results";
    }
}

/* 1 when the launch and any repeats went through (a repeat that could not
 * be timed, its events failing, is not the version's failure). */
static int finished(const outcome *o) {
    return !o->transport && o->stage == HKA_STAGE_DONE && !o->ttrap &&
           (!o->tcu || o->tstage == HKA_STAGE_SETUP);
}

/* A launch (or a repeat) that reached a guarded site: the version would
 * have trapped. The site stored its code and ended its thread instead, so
 * nothing reached the GPU and the helper's context is whole: it stays. */
static int trapped(run *r, const char *kernel, int no, const outcome *o) {
    uint32_t code = o->trap ? o->trap : o->ttrap;
    unsigned kind = HKP_GUARD_KIND(code);
    return refuse(r, HKA_KIND_FAULT, kernel, 0, NULL,
                  "kernel '%s' test %d%s reached %s (site %u of %d in its PTX); the canary's trap "
                  "guard ended the thread before it could trap, which would end the program's "
                  "context with %s and stall the GPU",
                  kernel, no, o->ttrap ? " repeated to be timed" : "", hkp_guard_kind_text(kind),
                  HKP_GUARD_SITE(code), r->img->guard_sites,
                  kind == HKP_GUARD_ASSERT ? "CUDA_ERROR_ASSERT" : "CUDA_ERROR_LAUNCH_FAILED");
}

/* Ends a memcheck helper after a launch that failed, or was reported, so
 * that compute-sanitizer says all it found: asked to end (its socket
 * closed), it flushes its log and exits with HKA_SANITIZER_EXIT when it
 * found errors; it is killed after MC_GRACE_MS. 1 when memcheck found an
 * error (h->mc_first says which, when its line came through). */
static int mc_end(helper *h, char *how, size_t n) {
    hku_child_end(&h->proc, MC_GRACE_MS, how, n);
    h->ready = 0;
    int st = h->proc.last_status;
    return h->mc_errors > 0 || (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == HKA_SANITIZER_EXIT);
}

/* The verdict on a launch of the new version: anything but a clean finish
 * refuses it. The helper is replaced after every failure but a trap the
 * guard caught (its context is whole): a fault leaves its context unusable,
 * and a helper that hung or misbehaved is not reused.
 * Under memcheck, a failure the sanitizer reported is a memcheck refusal
 * with its first error line, and so is a launch that came back finished
 * but reported; that one alone keeps its helper (the sanitizer ended the
 * kernel, the context is whole). */
static int judge(run *r, helper *h, const char *kernel, int no, outcome *o) {
    hka_canary *c = r->c;
    const char *under = h->sanitized ? " under compute-sanitizer" : "";
    /* compute-sanitizer's front end prints what its library in the helper
     * found, a little after the fact: a launch that came back clean is
     * given MC_QUIET_MS of silence on the log before it counts as clean. */
    if (h->sanitized)
        hku_child_drain_err(&h->proc, finished(o) ? MC_QUIET_MS : 0, MC_QUIET_MAX_MS);
    if (finished(o) && !(h->sanitized && h->mc_errors))
        return 0;
    if (!o->transport && (o->trap || o->ttrap) && !(h->sanitized && h->mc_errors))
        return trapped(r, kernel, no, o);
    if (finished(o)) {
        /* What memcheck caught ended the kernel, not the context (see
         * hka_sanitizer_argv), so no fault reached the GPU. The helper is
         * replaced all the same, at no cost to the device (a healthy
         * context's end and a new one's start stall nothing, RESULTS.md
         * section 11): the sanitizer counts its errors over its life (its
         * --print-limit would silence the next version's, its exit status
         * would blame the next failure on memcheck), and a report of this
         * launch still on its way must not land in the next one's. */
        char what[240], how[160];
        mc_what(h, what, sizeof what);
        helper_kill(h, how, sizeof how);
        helper_start(c, h, how, sizeof how);
        return refuse(r, HKA_KIND_MEMCHECK, kernel, 0, NULL,
                      "kernel '%s' test %d: memcheck: %s (the kernel was ended before it could "
                      "fault the GPU)",
                      kernel, no, what);
    }
    char how[160] = "", ignored[8];
    int mc = 0;
    if (h->sanitized && o->transport != HKU_RECV_TIMEOUT)
        mc = mc_end(h, how, sizeof how);
    else
        helper_kill(h, how, sizeof how);
    mc |= h->sanitized && h->mc_errors;
    char what[240]; /* what memcheck said, before the restart forgets it */
    if (h->mc_first[0])
        mc_what(h, what, sizeof what);
    else
        snprintf(what, sizeof what, "an error (compute-sanitizer exit status %d%s%.80s)",
                 HKA_SANITIZER_EXIT, h->mc_api[0] ? "; " : "", h->mc_api);
    helper_start(c, h, ignored, sizeof ignored);
    const char *repeat = o->in_timing ? " repeated to be timed" : "";
    if (mc) {
        const char *cu = o->tcu ? o->tcu_name : o->cu ? o->cu_name : "";
        return refuse(r, HKA_KIND_MEMCHECK, kernel, o->tcu ? o->tcu : o->cu, cu,
                      "kernel '%s' test %d: memcheck: %s%s%s%s", kernel, no, what,
                      cu[0] ? " (" : "", cu, cu[0] ? ")" : "");
    }
    int timeout = h->sanitized ? c->timeout_ms * HKA_SANITIZER_SLOW : c->timeout_ms;
    if (o->in_timing)
        timeout *= HKA_WARMUPS + HKA_RUNS;
    if (o->transport == HKU_RECV_TIMEOUT)
        return refuse(r, HKA_KIND_HANG, kernel, 0, NULL,
                      "kernel '%s' test %d did not finish %swithin %d ms%s (a hang?); the helper "
                      "was killed and restarted",
                      kernel, no, o->in_timing ? "its timed repeats " : "", timeout, under);
    if (o->transport == HKU_RECV_MALFORMED)
        return refuse(r, HKA_KIND_FAULT, kernel, 0, NULL,
                      "malformed reply from %s on kernel '%s' test %d (%s); the helper was killed "
                      "and restarted",
                      h->who, kernel, no, o->detail);
    if (o->transport)
        return refuse(r, HKA_KIND_FAULT, kernel, 0, NULL,
                      "%s died during kernel '%s' test %d%s (%s); it was restarted", h->who, kernel,
                      no, repeat, how[0] ? how : "no exit status");
    if (o->tcu)
        return refuse(r, HKA_KIND_FAULT, kernel, o->tcu, o->tcu_name,
                      "kernel '%s' test %d faulted%s: %s (while %s)", kernel, no, repeat,
                      o->tcu_name, stage_name(o->tstage));
    return refuse(r, HKA_KIND_FAULT, kernel, o->cu, o->cu_name,
                  "kernel '%s' test %d faulted%s: %s (while %s)", kernel, no, under, o->cu_name,
                  stage_name(o->stage));
}

static int close_enough(double x, double ref, double atol, double rtol) {
    if (isnan(x) || isnan(ref))
        return isnan(x) && isnan(ref);
    return x == ref || fabs(x - ref) <= atol + rtol * fabs(ref);
}

static double f32_at(const unsigned char *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}
static double f64_at(const unsigned char *p) {
    double v;
    memcpy(&v, p, 8);
    return v;
}

/* 0 when buffer a (new) matches b (running) as t says, else describes the
 * first difference. */
static int differs(const hk_test *t, const unsigned char *a, const unsigned char *b, size_t n,
                   char *why, size_t wn) {
    size_t w = t->compare == HK_COMPARE_F32 ? 4 : t->compare == HK_COMPARE_F64 ? 8 : 1;
    for (size_t i = 0; i + w <= n; i += w) {
        if (w > 1) { /* floats compared as doubles: exact, NaN and all */
            double x = w == 4 ? f32_at(a + i) : f64_at(a + i);
            double y = w == 4 ? f32_at(b + i) : f64_at(b + i);
            if (!close_enough(x, y, t->atol, t->rtol)) {
                snprintf(why, wn, "element %zu: %.*g, running version %.*g", i / w, w == 4 ? 9 : 17,
                         x, w == 4 ? 9 : 17, y);
                return 1;
            }
        } else if (a[i] != b[i]) {
            snprintf(why, wn, "byte %zu: 0x%02x, running version 0x%02x", i, a[i], b[i]);
            return 1;
        }
    }
    size_t tail = n - n / w * w; /* bytes after the last whole element */
    if (tail && memcmp(a + n - tail, b + n - tail, tail)) {
        snprintf(why, wn, "the last %zu bytes", tail);
        return 1;
    }
    return 0;
}

/* Keeps a timed test's figures when it is the worst so far: the largest
 * ratio against the running version; without a running version's time,
 * the longest (and a test with one always beats one without). */
static void figures(run *r, double new_ms, double old_ms) {
    double worst = old_ms > 0 ? new_ms / old_ms : 0;
    int better = !r->timed || (old_ms > 0 && (r->old_ms <= 0 || worst > r->worst)) ||
                 (old_ms <= 0 && r->old_ms <= 0 && new_ms > r->new_ms);
    r->timed++;
    if (better) {
        r->new_ms = new_ms;
        r->old_ms = old_ms;
        r->worst = worst;
    }
}

/* The perf guard on one test: refused when the new version's median is
 * more than slowdown_max times the running version's and more than
 * slowdown_min_ms longer. */
static int perf_check(run *r, const char *kernel, int no, double new_ms, double old_ms) {
    const hka_policy *p = r->pol;
    figures(r, new_ms, old_ms);
    if (!(new_ms > old_ms * p->slowdown_max && new_ms - old_ms > p->slowdown_min_ms))
        return 0;
    r->new_ms = new_ms, r->old_ms = old_ms; /* the refusal's figures */
    char ratio[32];
    if (old_ms > 0)
        snprintf(ratio, sizeof ratio, "%.1fx", new_ms / old_ms);
    else
        snprintf(ratio, sizeof ratio, "no time at all before");
    return refuse(r, HKA_KIND_SLOWER, kernel, 0, NULL,
                  "kernel '%s' test %d is slower: %.3f ms against %.3f ms on version %llu (%s; "
                  "refused beyond %gx and %g ms)",
                  kernel, no, new_ms, old_ms, (unsigned long long)r->ref->version, ratio,
                  p->slowdown_max, p->slowdown_min_ms);
}

/* Runs test t on the running version, to compare its buffers and, when the
 * new version was timed, to time it the same way. A failure there is the
 * running version's (or the test's), not the new one's: comparisons and
 * timings stop, the helper is replaced and the new image loaded again. */
static int with_running(run *r, const char *kernel, int no, const hk_test *t, const outcome *on) {
    const char *entry = entry_of(r->ref, kernel);
    const hkp_entry *e = find_entry(r->ref, entry);
    char why[160];
    if ((!e && r->ref->nentries) || (e && misfit(t, e, why, sizeof why))) {
        note(r, "kernel '%s' test %d not compared: the running version's kernel differs", kernel,
             no);
        if (on->timed)
            figures(r, on->ms, 0);
        return 0;
    }
    outcome old;
    do_launch(r->c, &r->c->plain, 1, entry, t, on->timed ? HKA_RUNS : 0, r->c->timeout_ms, 0, 1,
              &old);
    int err = 0;
    if (!finished(&old)) {
        note(r, "kernel '%s' test %d fails on the running version too: not compared", kernel, no);
        helper_kill(&r->c->plain, NULL, 0);
        r->cmp = 0;
        if (on->timed)
            figures(r, on->ms, 0);
        if (prepare(r, &r->c->plain, 0, why, sizeof why) < 0)
            err = unavailable(r, why);
    } else {
        for (int i = 0; t->compare != HK_COMPARE_NONE && i < t->nargs && !err; i++)
            if (t->args[i].kind == HKA_ARG_BUFFER &&
                differs(t, on->buf[i], old.buf[i], t->args[i].size, why, sizeof why))
                err = refuse(r, HKA_KIND_MISMATCH, kernel, 0, NULL,
                             "kernel '%s' test %d: buffer (argument %d) differs from version %llu "
                             "at %s",
                             kernel, no, i, (unsigned long long)r->ref->version, why);
        r->compared += !err && t->compare != HK_COMPARE_NONE;
        if (!err && on->timed && old.timed)
            err = perf_check(r, kernel, no, on->ms, old.ms);
        else if (!err && on->timed) {
            note(r, "the running version could not be timed (%s)", old.tcu_name);
            figures(r, on->ms, 0);
        }
    }
    free(old.payload);
    return err;
}

/* Under memcheck: test t on the new version in the memcheck helper. */
static int memcheck_test(run *r, const char *kernel, int no, const hk_test *t) {
    helper *h = &r->c->mc;
    hku_child_drain_err(&h->proc, 0, 0);
    mc_reset(h); /* what it said before this launch is not this launch's */
    outcome o;
    do_launch(r->c, h, 0, entry_of(r->img, kernel), t, 0, r->c->timeout_ms * HKA_SANITIZER_SLOW,
              tested_sites(r), 1, &o);
    int err = judge(r, h, kernel, no, &o);
    r->memchecked += !err;
    free(o.payload);
    return err;
}

/* The image beside its copy in the plain helper's slot 2, loaded at its
 * first use in a run (a helper restarted since has it no more). 0, or -1
 * with why: the canary cannot go on. */
static int image_loaded(run *r, char *why, size_t n) {
    helper *h = &r->c->plain;
    if (r->img_pid && r->img_pid == h->proc.pid)
        return 0;
    char name[64], log[HKA_MAX_TEXT + 1], how[64];
    int cu = 0, lr = load_slot(r->c, h, 2, r->img, 0, &cu, name, log);
    if (lr == 0) {
        r->img_pid = h->proc.pid;
        return 0;
    }
    if (lr > 0) {
        snprintf(why, n, "it could not load the new version's image: %s%s%.120s", name,
                 log[0] ? ": " : "", log);
        return -1;
    }
    helper_kill(h, how, sizeof how);
    snprintf(why, n, "%s %s while loading an image%s%s", h->who, recv_what(lr), how[0] ? ": " : "",
             how);
    helper_start(r->c, h, how, sizeof how);
    return -1;
}

/* The image's limits for entry, as the helper's driver reads them. */
typedef struct limits {
    int cu;
    char cu_name[64];
    uint32_t max_threads, regs, static_shared, max_dynamic_shared, local;
} limits;

/* Asks the plain helper for the limits of entry in slot: 0, or a negative
 * HKU_RECV_* when the exchange failed. */
static int get_limits(hka_canary *c, int slot, const char *entry, limits *l) {
    helper *h = &c->plain;
    memset(l, 0, sizeof *l);
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_LIMITS);
    hku_put_u32(&b, (uint32_t)slot);
    hku_put_str(&b, entry, HKA_MAX_TEXT);
    double deadline = hku_now_ms() + c->timeout_ms;
    int sent = hku_send_by(h->proc.fd, &b, deadline);
    hku_buf_free(&b);
    if (sent < 0)
        return errno == ETIMEDOUT ? HKU_RECV_TIMEOUT : HKU_RECV_EOF;
    uint32_t type = 0;
    unsigned char *d = NULL;
    size_t len = 0;
    int r = hku_recv(h->proc.fd, HKA_MAGIC, 16 + 64 + 20, deadline, &type, &d, &len);
    if (r < 0)
        return r;
    hku_rd rd = {d, len, 0};
    l->cu = (int)hku_get_u32(&rd);
    hku_get_str(&rd, l->cu_name, sizeof l->cu_name, sizeof l->cu_name - 1);
    l->max_threads = hku_get_u32(&rd);
    l->regs = hku_get_u32(&rd);
    l->static_shared = hku_get_u32(&rd);
    l->max_dynamic_shared = hku_get_u32(&rd);
    l->local = hku_get_u32(&rd);
    int bad = type != HKA_LIMITS_OF || hku_end(&rd) || (l->cu == 0) != (l->max_threads != 0);
    free(d);
    if (!bad && l->cu)
        sane_cu_name(l->cu_name, sizeof l->cu_name, l->cu);
    return bad ? HKU_RECV_MALFORMED : 0;
}

/* After the trap guard's copy passed test t (on, its outcome): the same
 * test on the image that commits, which ptxas compiled apart from the copy
 * and may have given other registers (canary.h). Its limits first: a block
 * or a shared size it cannot launch with refuses the version, saying which
 * limit; then the same launches (and timed repeats) on the same fresh
 * inputs, whose outcome replaces the copy's in *on: the image's buffers are
 * compared and its times judged. The copy ran that whole sequence without
 * reaching a trap site, so the image, which differs from it only there,
 * reaches none either. */
static int on_the_image(run *r, const char *kernel, int no, const hk_test *t, outcome *on) {
    hka_canary *c = r->c;
    const char *entry = entry_of(r->img, kernel);
    char why[256];
    if (image_loaded(r, why, sizeof why) < 0)
        return unavailable(r, why);
    limits l;
    int lr = get_limits(c, 2, entry, &l);
    if (lr < 0) {
        char how[64];
        helper_kill(&c->plain, how, sizeof how);
        helper_start(c, &c->plain, how, sizeof how);
        snprintf(why, sizeof why, "%s %s when asked for the image's limits", c->plain.who,
                 recv_what(lr));
        return unavailable(r, why);
    }
    uint64_t threads = (uint64_t)t->block[0] * t->block[1] * t->block[2];
    const char *oor = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
    if (!l.cu && threads > l.max_threads)
        return refuse(r, HKA_KIND_FAULT, kernel, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, oor,
                      "kernel '%s' test %d launches blocks of %llu threads; the image that would "
                      "commit takes %u registers a thread, so its blocks hold at most %u threads "
                      "(its trap guard's copy, which the canary ran, fits): every such launch "
                      "would fail with %s",
                      kernel, no, (unsigned long long)threads, l.regs, l.max_threads, oor);
    if (!l.cu && t->shared > l.max_dynamic_shared)
        return refuse(r, HKA_KIND_FAULT, kernel, CUDA_ERROR_INVALID_VALUE,
                      "CUDA_ERROR_INVALID_VALUE",
                      "kernel '%s' test %d asks %u bytes of dynamic shared memory; the image that "
                      "would commit allows %u beside its %u bytes of static shared memory: every "
                      "such launch would fail",
                      kernel, no, t->shared, l.max_dynamic_shared, l.static_shared);
    if (l.cu)
        note(r, "the image's limits could not be read (%s)", l.cu_name);
    outcome img;
    do_launch(c, &c->plain, 2, entry, t, on->asked, c->timeout_ms, 0, 1, &img);
    int err = judge(r, &c->plain, kernel, no, &img);
    free(on->payload);
    *on = img; /* freed by the caller */
    return err;
}

static int run_test(run *r, const char *kernel, int no, const hk_test *t, int memcheck) {
    const char *entry = entry_of(r->img, kernel);
    const hkp_entry *e = find_entry(r->img, entry);
    char why[160];
    if (!e && r->img->nentries) {
        /* The engine's validation refuses a version without a kernel in use. */
        note(r, "kernel '%s' is not in the new version", kernel);
        return 0;
    }
    if (e && misfit(t, e, why, sizeof why))
        return refuse(r, HKA_KIND_NOT_RUN, kernel, 0, NULL,
                      "kernel '%s' test %d does not fit the kernel: %s", kernel, no, why);
    if (memcheck)
        return memcheck_test(r, kernel, no, t);
    outcome on;
    int copy = tested_sites(r) > 0; /* slot 0 holds the trap guard's copy */
    do_launch(r->c, &r->c->plain, 0, entry, t, r->guard ? HKA_RUNS : 0, r->c->timeout_ms,
              tested_sites(r), !copy, &on);
    int err = judge(r, &r->c->plain, kernel, no, &on);
    if (!err && copy)
        err = on_the_image(r, kernel, no, t, &on);
    if (!err && !r->stopped) {
        r->launches++;
        if (on.tcu) /* its events failed: not timed */
            note(r, "kernel '%s' test %d could not be timed (%s)", kernel, no, on.tcu_name);
        if (r->cmp && (t->compare != HK_COMPARE_NONE || on.timed))
            err = with_running(r, kernel, no, t, &on);
        else if (on.timed)
            figures(r, on.ms, 0);
    }
    free(on.payload);
    return err;
}

/* Every test, in the memcheck helper (memcheck 1) or the plain one. */
static int each_test(run *r, const snap *s, int memcheck) {
    for (int i = 0; i < s->n; i++) {
        int no = 1; /* the test's number among its kernel's */
        for (int j = 0; j < i; j++)
            no += !strcmp(s->kernel[j], s->kernel[i]);
        int err = run_test(r, s->kernel[i], no, s->t[i], memcheck);
        if (err < 0 || r->stopped)
            return err; /* refused, or could no longer run (said so) */
    }
    return 0;
}

/* What a run that passed says (hk_report.canary). */
static void passed(run *r) {
    char cmp[64] = "", mc[24] = "", timed[96] = "";
    if (r->compared)
        snprintf(cmp, sizeof cmp, " (%d compared with version %llu)", r->compared,
                 (unsigned long long)r->ref->version);
    if (r->memchecked)
        snprintf(mc, sizeof mc, "; memcheck clean");
    char guard[48] = "";
    if (tested_sites(r))
        snprintf(guard, sizeof guard, "; %d trap site%s guarded", r->img->guard_sites,
                 r->img->guard_sites == 1 ? "" : "s");
    if (r->timed && r->old_ms > 0)
        snprintf(timed, sizeof timed, "; timed %.3f ms against %.3f ms on version %llu", r->new_ms,
                 r->old_ms, (unsigned long long)r->ref->version);
    else if (r->timed)
        snprintf(timed, sizeof timed, "; timed %.3f ms (%s)", r->new_ms,
                 r->ref ? "not against the running version" : "first version: nothing to compare");
    char text[400];
    snprintf(text, sizeof text, "%d launch%s passed%s%s%s%s%s%s", r->launches,
             r->launches == 1 ? "" : "es", cmp, mc, guard, timed, r->note[0] ? "; " : "", r->note);
    snprintf(r->rep->canary, sizeof r->rep->canary, "%.159s", text);
}

static int session(run *r, const snap *s) {
    hka_canary *c = r->c;
    char why[256];
    r->guard = r->pol->slowdown_max > 0;
    for (int i = 0; i < s->n && r->ref; i++)
        r->cmp |= s->t[i]->compare != HK_COMPARE_NONE || r->guard;
    if (r->img->size > HKA_MAX_IMAGE || r->img->guard_size > HKA_MAX_IMAGE ||
        (r->cmp && r->ref->size > HKA_MAX_IMAGE))
        return unavailable(r, "an image is over the canary's 64 MiB");
    /* Memcheck first: a fault it catches never reaches the hardware. Where
     * its helper cannot run, the plain run still does, saying so. */
    if (c->mc_on) {
        if (prepare(r, &c->mc, 0, why, sizeof why) < 0)
            note(r, "memcheck not run: %.100s", why);
        else {
            int err = each_test(r, s, 1);
            if (err < 0)
                return err;
        }
    }
    if (prepare(r, &c->plain, r->cmp, why, sizeof why) < 0)
        return unavailable(r, why);
    int err = each_test(r, s, 0);
    if (err < 0 || r->stopped)
        return err;
    if (r->rep)
        passed(r);
    return 0;
}

int hka_run(hka_canary *c, const char *module, const hka_image *img, const hka_image *ref,
            const hka_policy *policy, hk_report *rep) {
    double t0 = hku_now_ms();
    snap s;
    if (snap_take(c, module, &s) < 0)
        return HK_ERR_NOMEM;
    run r = {.c = c, .img = img, .ref = ref, .pol = policy, .rep = rep};
    int err = 0, ran = 0;
    if (!s.n) {
        if (rep)
            snprintf(rep->canary, sizeof rep->canary, "no canary tests");
    } else if (!c->enabled) {
        err = unavailable(&r, "the runtime has no canary (options.canary)");
    } else {
        pthread_mutex_lock(&c->run_lock);
        err = session(&r, &s);
        pthread_mutex_unlock(&c->run_lock);
        ran = 1;
    }
    snap_free(&s);
    double ms = hku_now_ms() - t0;
    pthread_mutex_lock(&c->count_lock);
    c->n.runs += ran;
    c->n.ms_total += ran ? ms : 0;
    if (err < 0) {
        c->n.refused++;
        c->n.refused_by[r.kind]++;
    }
    if (r.timed) {
        c->n.last_new_ms = r.new_ms;
        c->n.last_old_ms = r.old_ms;
    }
    pthread_mutex_unlock(&c->count_lock);
    if (rep) {
        rep->canary_ms = ms;
        rep->canary_new_ms = r.timed ? r.new_ms : 0;
        rep->canary_old_ms = r.timed ? r.old_ms : 0;
    }
    return err;
}

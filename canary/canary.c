/*
 * The parent side of canary runs (canary.h has the protocol and the locks):
 * the declared tests and the helper processes' life (posix_spawn, READY,
 * kill and restart; the memcheck helper under compute-sanitizer). One run is
 * canary/run.c's, its requests and replies canary/exchange.c's; the three
 * share canary/parent.h.
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
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/driver.h"
#include "canary/parent.h"
#include "util/util.h"

#define HKA_STR_(x)   #x
#define HKA_STR(x)    HKA_STR_(x)
#define READY_WAIT_MS 10000 /* at create: as the build helper (ptx/isolate.c) */
#define MC_GRACE_MS   3000  /* a memcheck helper's time to end and say what it found */

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

void hka_snap_free(snap *s) {
    for (int i = 0; i < s->n; i++)
        hk_test_destroy(s->t[i]);
    free(s->t);
    free(s->kernel);
    memset(s, 0, sizeof *s);
}

int hka_snap_take(hka_canary *c, const char *module, snap *s) {
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
        hka_snap_free(s);
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
void hka_mc_what(const helper *h, char *out, size_t n) {
    snprintf(out, n, "%s%s%s", h->mc_first_warn ? "errors, their records dropped (" : "",
             h->mc_first, h->mc_first_warn ? ")" : "");
}

void hka_mc_reset(helper *h) {
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
void hka_helper_kill(helper *h, char *how, size_t n) {
    hku_child_kill(&h->proc, how, n);
    h->ready = 0;
}

/* Starts a helper; its READY is read by hka_helper_ready. run_lock held. */
int hka_helper_start(hka_canary *c, helper *h, char *why, size_t n) {
    char dev[16], owner[24];
    snprintf(dev, sizeof dev, "%d", c->device);
    snprintf(owner, sizeof owner, "%ld", (long)getpid());
    char *argv[HKA_SAN_ARGC] = {c->helper_path, "--fd", "3", "--device", dev, NULL};
    if (h->sanitized)
        hka_sanitizer_argv(argv, c->sanitizer, c->helper_path, dev, owner);
    hka_mc_reset(h);
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
int hka_helper_ready(hka_canary *c, helper *h, char *why, size_t n, double wait_ms) {
    if (h->proc.pid <= 0 && hka_helper_start(c, h, why, n) < 0)
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
    hka_helper_kill(h, how, sizeof how);
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
            hka_helper_start(c, &c->mc, ignored, sizeof ignored);
        if (hka_helper_ready(c, &c->plain, why, why_size, ready_wait(c, &c->plain)) < 0) {
            hka_destroy(c);
            return HK_ERR_IO;
        }
        if (c->mc_on && hka_helper_ready(c, &c->mc, mwhy, sizeof mwhy, ready_wait(c, &c->mc)) < 0) {
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

/* Ends a memcheck helper after a launch that failed, or was reported, so
 * that compute-sanitizer says all it found: asked to end (its socket
 * closed), it flushes its log and exits with HKA_SANITIZER_EXIT when it
 * found errors; it is killed after MC_GRACE_MS. 1 when memcheck found an
 * error (h->mc_first says which, when its line came through). */
int hka_mc_end(helper *h, char *how, size_t n) {
    hku_child_end(&h->proc, MC_GRACE_MS, how, n);
    h->ready = 0;
    int st = h->proc.last_status;
    return h->mc_errors > 0 || (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == HKA_SANITIZER_EXIT);
}

/*
 * The parent side of canary runs (canary.h has the protocol and the locks):
 * the declared tests, the helper process's life (posix_spawn, READY, kill
 * and restart), and one run: load the new image (and the running one when a
 * test compares), launch each test under a deadline, compare, and say what
 * happened in the report.
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
#include "loader/driver.h"
#include "util/util.h"

#define START_FACTOR  10    /* helper start and image loads: timeout x 10 */
#define READY_WAIT_MS 10000 /* at create: as the build helper (ptx/isolate.c) */

/* The tests of one kernel handle. */
typedef struct ktests {
    char module[64], kernel[128];
    int n;
    hk_test *t[HKA_MAX_TESTS];
    struct ktests *next;
} ktests;

struct hka_canary {
    /* immutable */
    char *helper;
    int device, timeout_ms, enabled;

    pthread_mutex_t run_lock;
    /* run_lock: the helper */
    hku_child proc; /* the process, and killed ones not reaped yet */
    int ready;      /* its READY was read */

    pthread_mutex_t tests_lock;
    ktests *tests; /* tests_lock */

    _Atomic uint64_t runs, refused, starts;
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

/* ---- the helper process -------------------------------------------------- */

/* Kills the helper (hku_child_kill). run_lock held. */
static void helper_kill(hka_canary *c, char *how, size_t n) {
    hku_child_kill(&c->proc, how, n);
    c->ready = 0;
}

/* Starts a helper; its READY is read by helper_ready. run_lock held. */
static int helper_start(hka_canary *c, char *why, size_t n) {
    char dev[16];
    snprintf(dev, sizeof dev, "%d", c->device);
    char *argv[] = {c->helper, "--fd", "3", "--device", dev, NULL};
    int err = hku_child_start(&c->proc, "the canary helper", argv, why, n);
    if (err < 0)
        return err;
    c->ready = 0;
    atomic_fetch_add(&c->starts, 1);
    return 0;
}

/* Starts the helper if none runs and reads its READY, waiting at most
 * wait_ms for it. run_lock held (or, at create, no other thread). */
static int helper_ready(hka_canary *c, char *why, size_t n, double wait_ms) {
    if (c->proc.pid <= 0 && helper_start(c, why, n) < 0)
        return HK_ERR_IO;
    if (c->ready)
        return 0;
    uint32_t type = 0;
    unsigned char *d = NULL;
    size_t len = 0;
    double deadline = hku_now_ms() + wait_ms;
    int r = hku_recv(c->proc.fd, HKA_MAGIC, HKA_MAX_TEXT + 8, deadline, &type, &d, &len);
    hku_rd rd = {d, len, 0};
    char text[HKA_MAX_TEXT + 1] = "";
    if (r == 0 && type == HKA_READY && hku_get_u32(&rd) == HKA_PROTOCOL && !hku_end(&rd)) {
        free(d);
        c->ready = 1;
        return 0;
    }
    if (r == 0 && type == HKA_FAIL)
        hku_get_str(&rd, text, sizeof text, HKA_MAX_TEXT);
    free(d);
    char how[64];
    helper_kill(c, how, sizeof how);
    if (text[0])
        snprintf(why, n, "the canary helper could not start: %.200s", text);
    else
        snprintf(why, n, "the canary helper did not start (%s%s%s)",
                 r == HKU_RECV_TIMEOUT ? "no answer in time"
                 : r == HKU_RECV_EOF   ? "it ended"
                                       : "malformed greeting",
                 how[0] ? ", " : "", how);
    return HK_ERR_IO;
}

int hka_create(hka_canary **out, const hka_config *cfg, char *why, size_t why_size) {
    hka_canary *c = calloc(1, sizeof *c);
    if (!c)
        return HK_ERR_NOMEM;
    hku_child_init(&c->proc);
    c->device = cfg->device;
    c->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 2000;
    pthread_mutex_init(&c->run_lock, NULL);
    pthread_mutex_init(&c->tests_lock, NULL);
    if (cfg->helper && !(c->helper = strdup(cfg->helper))) {
        hka_destroy(c);
        return HK_ERR_NOMEM;
    }
    c->enabled = c->helper != NULL;
    /* Its greeting, at once, as the build helper's: a helper that cannot
     * run (no device, a missing library, another protocol) or never greets
     * fails the creation, saying why, rather than each run; and no later
     * run (nor a destroy waiting for one) waits for a greeting. */
    double wait = (double)c->timeout_ms * START_FACTOR;
    if (cfg->start && c->enabled &&
        helper_ready(c, why, why_size, wait < READY_WAIT_MS ? wait : READY_WAIT_MS) < 0) {
        hka_destroy(c);
        return HK_ERR_IO;
    }
    *out = c;
    return 0;
}

void hka_destroy(hka_canary *c) {
    if (!c)
        return;
    pthread_mutex_lock(&c->run_lock);
    hku_child_finish(&c->proc);
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
    free(c->helper);
    free(c);
}

void hka_cancel(hka_canary *c) {
    if (c)
        hku_child_cancel(&c->proc); /* without run_lock: a run may hold it */
}

void hka_set_kill(hka_canary *c, int sig, int wait_ms) {
    pthread_mutex_lock(&c->run_lock);
    c->proc.kill_sig = sig;
    c->proc.kill_wait_ms = wait_ms;
    pthread_mutex_unlock(&c->run_lock);
}

pid_t hka_helper_pid(hka_canary *c) {
    pthread_mutex_lock(&c->run_lock);
    pid_t p = c->proc.pid;
    pthread_mutex_unlock(&c->run_lock);
    return p;
}

void hka_counts(hka_canary *c, uint64_t *runs, uint64_t *refused, uint64_t *starts) {
    *runs = atomic_load(&c->runs);
    *refused = atomic_load(&c->refused);
    *starts = atomic_load(&c->starts);
}

int hka_enabled(const hka_canary *c) {
    return c && c->enabled;
}

/* ---- one run ------------------------------------------------------------- */

typedef struct run {
    hka_canary *c;
    const hka_image *img, *ref;
    int policy;
    int cmp; /* the running version is loaded in slot 1 */
    int launches, compared;
    char note[120]; /* the first thing worth saying besides the outcome */
    hk_report *rep;
} run;

/* What a test launch came back with. */
typedef struct outcome {
    int transport;    /* 0, or an HKU_RECV_* code (a failed send is EOF) */
    char detail[96];  /* what was malformed */
    uint32_t stage;   /* hka_stage */
    int cu;           /* CUresult where it stopped */
    char cu_name[64]; /* its name, as the helper's driver says */
    unsigned char *payload;
    const unsigned char *buf[HKA_MAX_ARGS]; /* by argument index: buffers after */
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
 * none) and the message. */
static int refuse(run *r, const char *kernel, int cu, const char *cu_name, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int refuse(run *r, const char *kernel, int cu, const char *cu_name, const char *fmt, ...) {
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
    snprintf(rep->canary, sizeof rep->canary, "refused: %.150s", text);
    return hku_fail(rep, HK_ERR_CANARY, "canary: %s; the running version stays", text);
}

/* The canary could not run: refused under REQUIRE, else let through. */
static int unavailable(run *r, const char *why) {
    if (r->policy == HK_CANARY_REQUIRE)
        return refuse(r, NULL, 0, NULL, "required but could not run: %s", why);
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
static int load_slot(hka_canary *c, int slot, const hka_image *im, int *cu, char *name, char *log) {
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_LOAD);
    hku_put_u32(&b, (uint32_t)slot);
    hku_put_u32(&b, (uint32_t)im->format);
    hku_put(&b, im->data, im->size);
    double deadline = hku_now_ms() + (double)c->timeout_ms * START_FACTOR;
    int sent = hku_send_by(c->proc.fd, &b, deadline);
    hku_buf_free(&b);
    if (sent < 0)
        return errno == ETIMEDOUT ? HKU_RECV_TIMEOUT : HKU_RECV_EOF;
    uint32_t type = 0;
    unsigned char *d = NULL;
    size_t len = 0;
    int r = hku_recv(c->proc.fd, HKA_MAGIC, 16 + 2 * HKA_MAX_TEXT, deadline, &type, &d, &len);
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

/* Starts the helper if needed and loads the new image (slot 0) and, when
 * r->cmp, the running one (slot 1; a failure there only turns comparisons
 * off). A helper that died while idle is replaced once. 0, or -1 with why. */
static int prepare(run *r, char *why, size_t n) {
    hka_canary *c = r->c;
    char name[64], log[HKA_MAX_TEXT + 1], how[64];
    for (int attempt = 0; attempt < 2; attempt++) {
        if (helper_ready(c, why, n, (double)c->timeout_ms * START_FACTOR) < 0)
            return -1;
        int cu = 0, lr = load_slot(c, 0, r->img, &cu, name, log);
        if (lr > 0) {
            snprintf(why, n, "it could not load the new version: %s%s%.120s", name,
                     log[0] ? ": " : "", log);
            return -1;
        }
        if (lr == 0 && r->cmp && (lr = load_slot(c, 1, r->ref, &cu, name, log)) != 0) {
            note(r, "the running version did not load in the canary (%s): not compared",
                 lr > 0 ? name : recv_what(lr));
            r->cmp = 0;
            if (lr > 0)
                return 0;
        }
        if (lr == 0)
            return 0;
        helper_kill(c, how, sizeof how);
        snprintf(why, n, "the helper %s while loading an image%s%s", recv_what(lr),
                 how[0] ? ": " : "", how);
        if (lr != HKU_RECV_EOF)
            break;
    }
    char ignored[8];
    helper_start(c, ignored, sizeof ignored); /* warm for the next run */
    return -1;
}

static int send_launch(hka_canary *c, int slot, const char *entry, const hk_test *t, int outputs,
                       double deadline) {
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
    int err = hku_send_by(c->proc.fd, &b, deadline);
    hku_buf_free(&b);
    return err;
}

/* A CUresult name from the helper, used only when it looks like one. */
static void sane_cu_name(char *name, size_t n, int cu) {
    int ok = !strncmp(name, "CUDA_", 5);
    for (const char *p = name; ok && *p; p++)
        ok = (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_';
    if (!ok)
        snprintf(name, n, "%s", hkl_cu_name(NULL, (CUresult)cu));
}

/* Reads a RESULT strictly: a finished launch returns every buffer at its
 * declared size, in order, and nothing else. */
static void parse_result(const hk_test *t, int outputs, outcome *o, size_t len) {
    hku_rd rd = {o->payload, len, 0};
    o->stage = hku_get_u32(&rd);
    o->cu = (int)hku_get_u32(&rd);
    hku_get_str(&rd, o->cu_name, sizeof o->cu_name, sizeof o->cu_name - 1);
    uint32_t nout = hku_get_u32(&rd);
    int nbuf = 0;
    for (int i = 0; i < t->nargs; i++)
        nbuf += t->args[i].kind == HKA_ARG_BUFFER;
    uint32_t want = o->stage == HKA_STAGE_DONE && outputs ? (uint32_t)nbuf : 0;
    if (rd.bad || o->stage > HKA_STAGE_DONE || nout != want ||
        (o->stage == HKA_STAGE_DONE) != (o->cu == 0)) {
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

/* Runs test t on the image in slot under the launch timeout. */
static void do_launch(hka_canary *c, int slot, const char *entry, const hk_test *t, outcome *o) {
    memset(o, 0, sizeof *o);
    int outputs = t->compare != HK_COMPARE_NONE;
    double deadline = hku_now_ms() + c->timeout_ms;
    if (send_launch(c, slot, entry, t, outputs, deadline) < 0) {
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
    int r = hku_recv(c->proc.fd, HKA_MAGIC, max, deadline, &type, &o->payload, &len);
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

/* The verdict on a launch of the new version: anything but a clean finish
 * refuses it. The helper is replaced after every failure: a fault leaves
 * its context unusable, and a helper that hung or misbehaved is not reused. */
static int judge(run *r, const char *kernel, int no, outcome *o) {
    hka_canary *c = r->c;
    if (!o->transport && o->stage == HKA_STAGE_DONE)
        return 0;
    char how[64] = "", ignored[8];
    helper_kill(c, how, sizeof how);
    helper_start(c, ignored, sizeof ignored);
    if (o->transport == HKU_RECV_TIMEOUT)
        return refuse(r, kernel, 0, NULL,
                      "kernel '%s' test %d did not finish within %d ms (a hang?); the helper was "
                      "killed and restarted",
                      kernel, no, c->timeout_ms);
    if (o->transport == HKU_RECV_MALFORMED)
        return refuse(r, kernel, 0, NULL,
                      "malformed reply from the helper on kernel '%s' test %d (%s); the helper "
                      "was killed and restarted",
                      kernel, no, o->detail);
    if (o->transport)
        return refuse(r, kernel, 0, NULL,
                      "the helper died during kernel '%s' test %d (%s); it was restarted", kernel,
                      no, how[0] ? how : "no exit status");
    return refuse(r, kernel, o->cu, o->cu_name, "kernel '%s' test %d faulted: %s (while %s)",
                  kernel, no, o->cu_name, stage_name(o->stage));
}

static int close_enough(double x, double ref, double atol, double rtol) {
    if (isnan(x) || isnan(ref))
        return isnan(x) && isnan(ref);
    return x == ref || fabs(x - ref) <= atol + rtol * fabs(ref);
}

/* 0 when buffer a (new) matches b (running) as t says, else describes the
 * first difference. */
static int differs(const hk_test *t, const unsigned char *a, const unsigned char *b, size_t n,
                   char *why, size_t wn) {
    size_t w = t->compare == HK_COMPARE_F32 ? 4 : t->compare == HK_COMPARE_F64 ? 8 : 1;
    for (size_t i = 0; i + w <= n; i += w) {
        if (w == 4) {
            float x, y;
            memcpy(&x, a + i, 4);
            memcpy(&y, b + i, 4);
            if (!close_enough(x, y, t->atol, t->rtol)) {
                snprintf(why, wn, "element %zu: %.9g, running version %.9g", i / 4, x, y);
                return 1;
            }
        } else if (w == 8) {
            double x, y;
            memcpy(&x, a + i, 8);
            memcpy(&y, b + i, 8);
            if (!close_enough(x, y, t->atol, t->rtol)) {
                snprintf(why, wn, "element %zu: %.17g, running version %.17g", i / 8, x, y);
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

/* Runs test t on the running version and compares. A failure there is the
 * running version's (or the test's), not the new one's: comparisons stop,
 * the helper is replaced and the new image loaded again. */
static int compare_with_running(run *r, const char *kernel, int no, const hk_test *t,
                                const outcome *on) {
    const char *entry = entry_of(r->ref, kernel);
    const hkp_entry *e = find_entry(r->ref, entry);
    char why[160];
    if ((!e && r->ref->nentries) || (e && misfit(t, e, why, sizeof why))) {
        note(r, "kernel '%s' test %d not compared: the running version's kernel differs", kernel,
             no);
        return 0;
    }
    outcome old;
    do_launch(r->c, 1, entry, t, &old);
    int err = 0;
    if (old.transport || old.stage != HKA_STAGE_DONE) {
        note(r, "kernel '%s' test %d fails on the running version too: not compared", kernel, no);
        helper_kill(r->c, NULL, 0);
        r->cmp = 0;
        if (prepare(r, why, sizeof why) < 0)
            err = unavailable(r, why);
    } else {
        for (int i = 0; i < t->nargs && !err; i++)
            if (t->args[i].kind == HKA_ARG_BUFFER &&
                differs(t, on->buf[i], old.buf[i], t->args[i].size, why, sizeof why))
                err = refuse(r, kernel, 0, NULL,
                             "kernel '%s' test %d: buffer (argument %d) differs from version %llu "
                             "at %s",
                             kernel, no, i, (unsigned long long)r->ref->version, why);
        r->compared += !err;
    }
    free(old.payload);
    return err;
}

static int run_test(run *r, const char *kernel, int no, const hk_test *t) {
    const char *entry = entry_of(r->img, kernel);
    const hkp_entry *e = find_entry(r->img, entry);
    char why[160];
    if (!e && r->img->nentries) {
        /* The engine's validation refuses a version without a kernel in use. */
        note(r, "kernel '%s' is not in the new version", kernel);
        return 0;
    }
    if (e && misfit(t, e, why, sizeof why))
        return refuse(r, kernel, 0, NULL, "kernel '%s' test %d does not fit the kernel: %s", kernel,
                      no, why);
    outcome on;
    do_launch(r->c, 0, entry, t, &on);
    int err = judge(r, kernel, no, &on);
    if (!err) {
        r->launches++;
        if (t->compare != HK_COMPARE_NONE && r->cmp)
            err = compare_with_running(r, kernel, no, t, &on);
    }
    free(on.payload);
    return err;
}

static int session(run *r, const snap *s) {
    char why[256];
    for (int i = 0; i < s->n && r->ref; i++)
        r->cmp |= s->t[i]->compare != HK_COMPARE_NONE;
    if (r->img->size > HKA_MAX_IMAGE || (r->cmp && r->ref->size > HKA_MAX_IMAGE))
        return unavailable(r, "an image is over the canary's 64 MiB");
    if (prepare(r, why, sizeof why) < 0)
        return unavailable(r, why);
    for (int i = 0; i < s->n; i++) {
        int no = 1; /* the test's number among its kernel's */
        for (int j = 0; j < i; j++)
            no += !strcmp(s->kernel[j], s->kernel[i]);
        int err = run_test(r, s->kernel[i], no, s->t[i]);
        if (err < 0 || (r->rep && r->rep->canary[0]))
            return err; /* refused, or could no longer run (said so) */
    }
    if (r->rep) {
        char cmp[64] = "";
        if (r->compared)
            snprintf(cmp, sizeof cmp, " (%d compared with version %llu)", r->compared,
                     (unsigned long long)r->ref->version);
        char text[256];
        snprintf(text, sizeof text, "%d launch%s passed%s%s%s", r->launches,
                 r->launches == 1 ? "" : "es", cmp, r->note[0] ? "; " : "", r->note);
        snprintf(r->rep->canary, sizeof r->rep->canary, "%.159s", text);
    }
    return 0;
}

int hka_run(hka_canary *c, const char *module, const hka_image *img, const hka_image *ref,
            int policy, hk_report *rep) {
    double t0 = hku_now_ms();
    snap s;
    if (snap_take(c, module, &s) < 0)
        return HK_ERR_NOMEM;
    run r = {.c = c, .img = img, .ref = ref, .policy = policy, .rep = rep};
    int err = 0;
    if (!s.n) {
        if (rep)
            snprintf(rep->canary, sizeof rep->canary, "no canary tests");
    } else if (!c->enabled) {
        err = unavailable(&r, "the runtime has no canary (options.canary)");
    } else {
        pthread_mutex_lock(&c->run_lock);
        err = session(&r, &s);
        pthread_mutex_unlock(&c->run_lock);
        atomic_fetch_add(&c->runs, 1);
    }
    atomic_fetch_add(&c->refused, err < 0);
    snap_free(&s);
    if (rep)
        rep->canary_ms = hku_now_ms() - t0;
    return err;
}

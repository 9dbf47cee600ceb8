/*
 * The parent's half of the canary protocol (canary.h): each request to a
 * helper (LOAD, LAUNCH, LIMITS) and its reply (LOADED, RESULT and TIMED,
 * LIMITS_OF). One request and one reply at a time, each under a deadline;
 * a reply is read strictly, against the exact size an honest one has for
 * what was asked (a finished launch returns every buffer at its declared
 * size, in order, and nothing else), and anything else is malformed. What
 * a reply means for the version is canary/run.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/driver.h"
#include "canary/parent.h"
#include "util/util.h"

/* Loads im into slot. 0; 1 when the helper's driver refused it (cu, name and
 * log say why); or a negative HKU_RECV_* when the exchange failed. */
int hka_load_slot(hka_canary *c, helper *h, int slot, const hka_image *im, int guarded, int *cu,
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
        return sent == HK_ERR_TIMEOUT ? HKU_RECV_TIMEOUT : HKU_RECV_EOF;
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

const char *hka_recv_what(int r) {
    return r == HKU_RECV_TIMEOUT ? "did not answer in time"
           : r == HKU_RECV_EOF   ? "died"
                                 : "answered nonsense";
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
void hka_do_launch(hka_canary *c, helper *h, int slot, const char *entry, const hk_test *t,
                   int runs, int timeout_ms, uint32_t sites, int keep, outcome *o) {
    memset(o, 0, sizeof *o);
    o->sites = sites;
    /* Under memcheck nothing is compared: the plain run does that; nor are
     * the buffers of a copy whose image runs after it (keep 0). */
    int outputs = keep && t->compare != HK_COMPARE_NONE && !h->sanitized;
    double deadline = hku_now_ms() + timeout_ms;
    int sent = send_launch(h, slot, entry, t, outputs, runs, deadline);
    if (sent < 0) {
        o->transport = sent == HK_ERR_TIMEOUT ? HKU_RECV_TIMEOUT : HKU_RECV_EOF;
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

const char *hka_stage_name(uint32_t stage) {
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

/* Asks the plain helper for the limits of entry in slot: 0, or a negative
 * HKU_RECV_* when the exchange failed. */
int hka_get_limits(hka_canary *c, int slot, const char *entry, limits *l) {
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
        return sent == HK_ERR_TIMEOUT ? HKU_RECV_TIMEOUT : HKU_RECV_EOF;
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

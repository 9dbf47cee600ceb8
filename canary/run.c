/*
 * One canary run (hka_run): under memcheck first, each test on the new
 * version, in the memcheck helper; then, in the plain helper, load the new
 * image (and the running one when a test compares or the perf guard is on),
 * launch each test under a deadline, compare, time both versions, apply the
 * perf guard, and say what happened in the report.
 *
 * A launch of the new version that does not finish cleanly refuses it, and
 * the helper is replaced after every failure but a trap the guard caught
 * (judge). A test that fails on the running version too is not compared: a
 * fix for a faulting kernel must be able to go in. The requests and replies
 * are canary/exchange.c's, the helpers' life canary/canary.c's
 * (canary/parent.h). run_lock is held for the whole session: one run at a
 * time.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "base/driver.h"
#include "canary/parent.h"
#include "util/util.h"

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

/* The guarded sites of the new version as its test launches run it: its
 * trap guard's copy where it has one that loaded, else none. */
static uint32_t tested_sites(const run *r) {
    return r->img->guard && !r->unguarded ? (uint32_t)r->img->guard_sites : 0;
}

/* Starts helper h if needed and loads the new image (slot 0) and, when
 * with_ref, the running one (slot 1; a failure there only turns r->cmp
 * off). A helper that died while idle is replaced once. 0, or
 * HK_ERR_CANARY_UNAVAILABLE with why (what that means for the run is
 * unavailable's to say). */
static int prepare(run *r, helper *h, int with_ref, char *why, size_t n) {
    hka_canary *c = r->c;
    char name[64], log[HKA_MAX_TEXT + 1], how[64];
    for (int attempt = 0; attempt < 2; attempt++) {
        if (hka_helper_ready(c, h, why, n, (double)c->timeout_ms * START_FACTOR) < 0)
            return HK_ERR_CANARY_UNAVAILABLE;
        int cu = 0, lr = hka_load_slot(c, h, 0, r->img, tested_sites(r) > 0, &cu, name, log);
        if (lr > 0 && tested_sites(r)) {
            /* The copy is checked by nvJitLink only when the image is a
             * cubin: PTX left to the driver may not load. The version is
             * tested as it is rather than not at all. */
            note(r, "the trap guard's copy did not load (%.40s): tested unguarded", name);
            r->unguarded = 1;
            lr = hka_load_slot(c, h, 0, r->img, 0, &cu, name, log);
        }
        if (lr > 0) {
            snprintf(why, n, "it could not load the new version: %s%s%.120s", name,
                     log[0] ? ": " : "", log);
            if (h->sanitized) { /* not left with a context that may be unusable */
                hka_helper_kill(h, how, sizeof how);
                hka_helper_start(c, h, how, sizeof how);
            }
            return HK_ERR_CANARY_UNAVAILABLE;
        }
        if (lr == 0 && with_ref && (lr = hka_load_slot(c, h, 1, r->ref, 0, &cu, name, log)) != 0) {
            note(r, "the running version did not load in the canary (%s): not compared",
                 lr > 0 ? name : hka_recv_what(lr));
            r->cmp = 0;
            if (lr > 0)
                return 0;
        }
        if (lr == 0)
            return 0;
        hka_helper_kill(h, how, sizeof how);
        snprintf(why, n, "%s %s while loading an image%s%s", h->who, hka_recv_what(lr),
                 how[0] ? ": " : "", how);
        if (lr != HKU_RECV_EOF)
            break;
    }
    char ignored[8];
    hka_helper_start(c, h, ignored, sizeof ignored); /* warm for the next run */
    return HK_ERR_CANARY_UNAVAILABLE;
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
        hka_mc_what(h, what, sizeof what);
        hka_helper_kill(h, how, sizeof how);
        hka_helper_start(c, h, how, sizeof how);
        return refuse(r, HKA_KIND_MEMCHECK, kernel, 0, NULL,
                      "kernel '%s' test %d: memcheck: %s (the kernel was ended before it could "
                      "fault the GPU)",
                      kernel, no, what);
    }
    char how[160] = "", ignored[8];
    int mc = 0;
    if (h->sanitized && o->transport != HKU_RECV_TIMEOUT)
        mc = hka_mc_end(h, how, sizeof how);
    else
        hka_helper_kill(h, how, sizeof how);
    mc |= h->sanitized && h->mc_errors;
    char what[240]; /* what memcheck said, before the restart forgets it */
    if (h->mc_first[0])
        hka_mc_what(h, what, sizeof what);
    else
        snprintf(what, sizeof what, "an error (compute-sanitizer exit status %d%s%.80s)",
                 HKA_SANITIZER_EXIT, h->mc_api[0] ? "; " : "", h->mc_api);
    hka_helper_start(c, h, ignored, sizeof ignored);
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
                      o->tcu_name, hka_stage_name(o->tstage));
    return refuse(r, HKA_KIND_FAULT, kernel, o->cu, o->cu_name,
                  "kernel '%s' test %d faulted%s: %s (while %s)", kernel, no, under, o->cu_name,
                  hka_stage_name(o->stage));
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
    hka_do_launch(r->c, &r->c->plain, 1, entry, t, on->timed ? HKA_RUNS : 0, r->c->timeout_ms, 0, 1,
                  &old);
    int err = 0;
    if (!finished(&old)) {
        note(r, "kernel '%s' test %d fails on the running version too: not compared", kernel, no);
        hka_helper_kill(&r->c->plain, NULL, 0);
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
    hka_mc_reset(h); /* what it said before this launch is not this launch's */
    outcome o;
    hka_do_launch(r->c, h, 0, entry_of(r->img, kernel), t, 0, r->c->timeout_ms * HKA_SANITIZER_SLOW,
                  tested_sites(r), 1, &o);
    int err = judge(r, h, kernel, no, &o);
    r->memchecked += !err;
    free(o.payload);
    return err;
}

/* The image beside its copy in the plain helper's slot 2, loaded at its
 * first use in a run (a helper restarted since has it no more). 0, or
 * HK_ERR_CANARY_UNAVAILABLE with why: the canary cannot go on. */
static int image_loaded(run *r, char *why, size_t n) {
    helper *h = &r->c->plain;
    if (r->img_pid && r->img_pid == h->proc.pid)
        return 0;
    char name[64], log[HKA_MAX_TEXT + 1], how[64];
    int cu = 0, lr = hka_load_slot(r->c, h, 2, r->img, 0, &cu, name, log);
    if (lr == 0) {
        r->img_pid = h->proc.pid;
        return 0;
    }
    if (lr > 0) {
        snprintf(why, n, "it could not load the new version's image: %s%s%.120s", name,
                 log[0] ? ": " : "", log);
        return HK_ERR_CANARY_UNAVAILABLE;
    }
    hka_helper_kill(h, how, sizeof how);
    snprintf(why, n, "%s %s while loading an image%s%s", h->who, hka_recv_what(lr),
             how[0] ? ": " : "", how);
    hka_helper_start(r->c, h, how, sizeof how);
    return HK_ERR_CANARY_UNAVAILABLE;
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
    int lr = hka_get_limits(c, 2, entry, &l);
    if (lr < 0) {
        char how[64];
        hka_helper_kill(&c->plain, how, sizeof how);
        hka_helper_start(c, &c->plain, how, sizeof how);
        snprintf(why, sizeof why, "%s %s when asked for the image's limits", c->plain.who,
                 hka_recv_what(lr));
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
    hka_do_launch(c, &c->plain, 2, entry, t, on->asked, c->timeout_ms, 0, 1, &img);
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
    hka_do_launch(r->c, &r->c->plain, 0, entry, t, r->guard ? HKA_RUNS : 0, r->c->timeout_ms,
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
    if (hka_snap_take(c, module, &s) < 0)
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
    hka_snap_free(&s);
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

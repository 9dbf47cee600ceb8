/*
 * hotkern rollout watch: a rollout driven by its gate (docs/ROLLOUT.md,
 * "watch"). Every --interval seconds it reads the origin's manifest
 * (verified with the public key of one --key at least) and evaluates the
 * gate against Prometheus (cli/gate.c), then decides, printing each
 * decision with its time and reason; each change it publishes is signed by
 * every --key (a fleet that needs k of n keys is given k):
 *
 *   gate fails        abort (the manifest `abort` publishes), exit 1
 *   gate unknown      pause (paused=true), once; then "paused" until it holds
 *   holds, paused     resume (paused=false) when the pause was watch's own;
 *                     an operator's pause is waited out ("held")
 *   holds, hosts of the step not all on the release yet: wait
 *   holds, settled    hold, counting the bake; once the gate held with the
 *                     step settled for the step's bake_s: advance, or at the
 *                     last step: done, exit 0
 *
 * The bake counts from the first evaluation that found the step settled
 * and the gate holding, and starts again after any evaluation that did not
 * (an advance, a pause or resume publishes a new manifest anyway): a step
 * is judged for its whole bake with every host on it, never on a partial
 * one. A change that cannot be published (the directory's lock held by an
 * operator's command) is tried again at the next evaluation. A rollout that
 * changes under watch (another release started, aborted by someone else)
 * ends it with exit 1; a step advanced by someone else is taken up.
 *
 * Each decision is one line of text, or with --json one JSON object per
 * line, then the command's document (hkc_finish) with the last one.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "cli/rollout.h"

#define MANIFEST "manifest.json"

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - floor(s)) * 1e9)};
    while (s > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Prints one decision: "TIME  step N/M  release R  DECISION  reason", or
 * its JSON line; the last one is kept for the final document. */
static void decide(hkc_out *o, const hkn_manifest *m, const char *decision, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void decide(hkc_out *o, const hkn_manifest *m, const char *decision, const char *fmt, ...) {
    char reason[8192], when[64];
    struct timespec ts;
    struct tm tm;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%03ldZ", ts.tv_nsec / 1000000);
    const hkn_rollout *r = &m->rollout;
    if (!o->json) {
        printf("%s  step %u/%zu  release %llu  %-8s %s\n", when, r->step + 1, r->nsteps,
               (unsigned long long)r->release, decision, reason);
        fflush(stdout);
        return;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "time", when);
    cJSON_AddNumberToObject(j, "unix", (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
    cJSON_AddItemToObject(j, "step", hkc_int(r->step + 1));
    cJSON_AddItemToObject(j, "steps", hkc_int((long long)r->nsteps));
    cJSON_AddItemToObject(j, "release", hkc_int((long long)r->release));
    cJSON_AddStringToObject(j, "decision", decision);
    cJSON_AddStringToObject(j, "reason", reason);
    char *text = cJSON_PrintUnformatted(j);
    if (text)
        printf("%s\n", text);
    free(text);
    cJSON_Delete(j);
    fflush(stdout);
    hkc_set_str(o, "decision", decision);
    hkc_set_str(o, "reason", reason);
}

/* Publishes sub quietly: 0, or 1 with the refusal's message in err. */
static int change(const hkc_rollout_args *a, const char *sub, char *err, size_t cap) {
    hkc_out q;
    hkc_out_init(&q, "rollout watch");
    hkc_out_json(&q); /* records instead of printing */
    int rc = hkc_rollout_change(&q, sub, a);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(q.doc, "message");
    snprintf(err, cap, "%s", cJSON_IsString(msg) ? msg->valuestring : "failed");
    hkc_out_text(&q); /* drops the document */
    return rc ? 1 : 0;
}

/* What one evaluation leads to. */
struct state {
    uint64_t release;  /* the rollout watched */
    unsigned step;     /* the step the bake counts for */
    int paused_by_us;  /* the manifest's pause is watch's own */
    double hold_since; /* monotonic seconds; < 0: not holding */
};

/* What a verdict leads to at manifest m: -1 to go on, else the exit
 * status. */
static int act(hkc_out *o, const hkc_rollout_args *a, const hkn_manifest *m, const hkc_verdict *v,
               struct state *st) {
    const hkn_rollout *r = &m->rollout;
    const uint64_t bake = r->steps[r->step].bake_s;
    char err[1024];
    if (v->state != HKC_GATE_PASS || r->paused || !v->settled)
        st->hold_since = -1; /* the bake counts only while all of it holds */
    if (v->state == HKC_GATE_FAIL) {
        if (change(a, "abort", err, sizeof err)) {
            decide(o, m, "fail",
                   "the gate fails (%s) and the abort could not be published: %s; trying again",
                   v->reason, err);
            return -1;
        }
        decide(o, m, "abort",
               "the gate fails: %s; every host that took release %llu goes back to %llu", v->reason,
               (unsigned long long)r->release, (unsigned long long)r->previous);
        return hkc_fail(o, HK_ERR_REJECTED, NULL, "aborted: the gate fails: %s", v->reason);
    }
    if (v->state == HKC_GATE_UNKNOWN) {
        if (r->paused)
            decide(o, m, "paused", "the gate is unknown: %s", v->reason);
        else if (change(a, "pause", err, sizeof err))
            decide(o, m, "unknown",
                   "the gate is unknown (%s) and the pause could not be published: %s; trying "
                   "again",
                   v->reason, err);
        else {
            st->paused_by_us = 1;
            decide(o, m, "pause", "the gate is unknown: %s", v->reason);
        }
        return -1;
    }
    if (r->paused && !st->paused_by_us) {
        decide(o, m, "held", "paused by another command (resume it to go on); the gate holds: %s",
               v->reason);
    } else if (r->paused) {
        if (change(a, "resume", err, sizeof err))
            decide(o, m, "paused",
                   "the gate holds again but the resume could not be published: %s; trying again",
                   err);
        else {
            st->paused_by_us = 0;
            decide(o, m, "resume", "the data is back and the gate holds: %s", v->reason);
        }
    } else if (!v->settled) {
        decide(o, m, "wait", "%s", v->reason);
    } else {
        double now = mono_s();
        if (st->hold_since < 0)
            st->hold_since = now;
        double held = now - st->hold_since;
        if (held + 1e-3 < (double)bake) {
            decide(o, m, "hold", "baked %.0f of %llu s: %s", held, (unsigned long long)bake,
                   v->reason);
        } else if (r->step + 1 >= r->nsteps) {
            decide(o, m, "done", "the last step held for %.0f s (bake %llu s): %s", held,
                   (unsigned long long)bake, v->reason);
            return 0;
        } else if (change(a, "advance", err, sizeof err)) {
            decide(o, m, "hold", "baked, but the advance could not be published: %s; trying again",
                   err);
        } else {
            decide(o, m, "advance",
                   "the gate held for %.0f s (bake %llu s): %s; now step %u of %zu", held,
                   (unsigned long long)bake, v->reason, r->step + 2, r->nsteps);
            st->step = r->step + 1;
            st->hold_since = -1;
        }
    }
    return -1;
}

/* A push fleet's gate (cli/push_fleet.c): the round's replies (each host
 * that lacks the release pushed, each on it asked what it runs), then with
 * --prometheus the --gate queries; a failure of either fails it, missing
 * data of either makes it unknown. 0 with v set, or 1 (nothing to free)
 * when another command holds DIR's lock. */
static int push_eval(hkc_out *o, const hkc_rollout_args *a, hkc_prom *p, const hkc_man *cur,
                     hkc_verdict *v) {
    hkc_out q;
    int fd = -1, rc;
    hkc_out_init(&q, o->cmd);
    hkc_out_json(&q);
    rc = hkc_lock_dir(&q, a->dir, &fd);
    if (!rc)
        rc = hkc_push_round(&q, a, cur, HKC_PUSH_PROBE, v);
    if (fd >= 0)
        close(fd);
    if (rc) {
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(q.doc, "message");
        decide(o, &cur->m, "wait", "no push round: %s",
               cJSON_IsString(msg) ? msg->valuestring : "failed");
        hkc_out_text(&q);
        memset(v, 0, sizeof *v);
        return 1;
    }
    hkc_out_text(&q);
    if (!a->prometheus)
        return 0;
    hkc_verdict g;
    memset(&g, 0, sizeof g);
    hkc_gate_queries(p, a, &cur->m, &g);
    char both[2 * sizeof v->reason + 32];
    snprintf(both, sizeof both, "%s; Prometheus: %s", v->reason, g.reason);
    if (g.state == HKC_GATE_FAIL || (g.state == HKC_GATE_UNKNOWN && v->state == HKC_GATE_PASS)) {
        v->state = g.state;
        snprintf(both, sizeof both, "Prometheus: %s; %s", g.reason, v->reason);
    }
    memcpy(v->reason, both, sizeof v->reason - 1); /* cut to the verdict's room */
    v->reason[sizeof v->reason - 1] = '\0';
    v->step_age_s = g.step_age_s;
    v->window_s = g.window_s;
    return 0;
}

/* One evaluation: returns -1 to go on, else the exit status. */
static int evaluate(hkc_out *o, const hkc_rollout_args *a, hkc_prom *p, const hkn_trust *pub,
                    struct state *st) {
    hkc_man cur;
    hkc_verdict v;
    /* Another command's publish renames the signature, then the manifest:
     * a read between the two does not verify, and is read again. */
    for (int attempt = 0;; attempt++) {
        hkc_out q;
        hkc_out_init(&q, o->cmd);
        hkc_out_json(&q);
        int rc = hkc_man_load(attempt < 4 ? &q : o, a->dir, MANIFEST, pub, &cur);
        hkc_out_text(&q);
        if (!rc)
            break;
        if (attempt == 4)
            return 1;
        sleep_s(0.1);
    }
    const hkn_manifest *m = &cur.m;
    const hkn_rollout *r = &m->rollout;
    int rc;
    if (!cur.have || !r->present || r->release != st->release || r->aborted) {
        rc = hkc_fail(o, HK_ERR_INVALID, NULL,
                      "%s/" MANIFEST " %s: the rollout of release %llu is over", a->dir,
                      !cur.have     ? "is gone"
                      : !r->present ? "has no rollout"
                      : r->aborted  ? "is aborted (by another command)"
                                    : "rolls out another release",
                      (unsigned long long)st->release);
    } else {
        if (r->step != st->step) {
            st->step = r->step; /* advanced by someone else: its bake starts */
            st->hold_since = -1;
        }
        if (!a->endpoints)
            hkc_gate_eval(p, a, m, &v);
        if (!a->endpoints || !push_eval(o, a, p, &cur, &v))
            rc = act(o, a, m, &v, st);
        else
            rc = -1; /* DIR held by another command: the next evaluation */
        hkc_verdict_free(&v);
    }
    hkc_man_free(&cur);
    return rc;
}

int hkc_rollout_watch(hkc_out *o, const hkc_rollout_args *a) {
    hkc_signers key;
    hkc_man cur;
    hkc_prom p = {
        .url = a->prometheus, .token = a->prom_token, .timeout_s = (long)a->prom_timeout_s};
    struct state st = {.hold_since = -1};
    int rc;
    memset(&cur, 0, sizeof cur);
    if ((rc = hkc_signers_load(o, &a->keys, &key)))
        return rc;
    hkn_trust pub = key.pub;
    sodium_memzero(&key, sizeof key); /* each change loads them again */
    if ((rc = hkc_man_load(o, a->dir, MANIFEST, &pub, &cur)))
        goto out;
    const hkn_rollout *r = &cur.m.rollout;
    if (!cur.have || !r->present || r->aborted) {
        rc = hkc_fail(o, HK_ERR_INVALID, NULL, "%s/" MANIFEST " %s: nothing to watch", a->dir,
                      !cur.have     ? "does not exist"
                      : !r->present ? "has no rollout"
                                    : "is aborted");
        goto out;
    }
    if ((rc = hkc_gate_check_queries(o, &p, a, &cur.m)))
        goto out;
    st.release = r->release;
    st.step = r->step;
    if (!o->json)
        printf(
            "watching release %llu of %s (%s), step %u of %zu, gate every %llu s against %s%s%s\n",
            (unsigned long long)r->release, cur.m.module, a->dir, r->step + 1, r->nsteps,
            (unsigned long long)a->interval_s, a->endpoints ? "the replies of " : "",
            a->endpoints ? a->endpoints : a->prometheus,
            a->endpoints && a->prometheus ? " and Prometheus" : "");
    for (;;) {
        double t0 = mono_s();
        rc = evaluate(o, a, &p, &pub, &st);
        if (rc >= 0)
            break;
        double left = (double)a->interval_s - (mono_s() - t0);
        sleep_s(left);
    }
out:
    hkc_man_free(&cur);
    hkc_prom_close(&p);
    return rc;
}

/*
 * Counters and metrics: hk_stats_get, and the runtime's Prometheus text,
 * hk_metrics_text.
 *
 * The counters are kept where they change (stats_lock's hk_stats, the
 * gate's atomics, the retired list's count under rec_lock, the compile
 * cache, the canary, the last-known-good state); hk_stats_get gathers one
 * snapshot of all of them.
 *
 * The engine writes its own families from a snapshot of hk_stats and of the
 * swap-duration histogram, then every attached source (hkl_source) with a
 * metrics hook adds its families, in the order the sources were attached.
 * Sources are found the way the engine finds them for everything else,
 * through the hooks they attach: the watcher (libhotkern) fills hkl_source
 * directly, and the network library, which sees only the public API,
 * attaches with hk_metrics_attach, which wraps its callback in an
 * hkl_source. The engine therefore knows no source's counters, and
 * libhotkern needs nothing of libhotkern-net.
 *
 * Locks: hk_metrics_text takes stats_lock and rec_lock (through
 * hk_stats_get), releases them, then holds src_lock while the hooks run; a
 * hook takes only its own source's locks. hk_metrics_detach takes src_lock,
 * so once it returns no hook of the source runs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/abi.h"
#include "loader/expo.h"
#include "loader/lkg.h"
#include "loader/metrics.h"
#include "loader/source.h"

/* Upper bounds of the swap-duration buckets, in microseconds and as the le
 * label prints them (a swap takes 0.2 ms from the cache, seconds through
 * NVRTC); the last bucket, +Inf, has no entry here. */
static const struct {
    uint64_t us;
    const char *le;
} buckets[HKL_HIST_BUCKETS - 1] = {
    {250, "0.00025"}, {500, "0.0005"},  {1000, "0.001"},  {2500, "0.0025"},
    {5000, "0.005"},  {10000, "0.01"},  {25000, "0.025"}, {50000, "0.05"},
    {100000, "0.1"},  {250000, "0.25"}, {500000, "0.5"},  {1000000, "1"},
    {2500000, "2.5"}, {5000000, "5"},   {10000000, "10"}, {30000000, "30"},
};

/* Milliseconds as a double to whole microseconds; 0 for nonsense. */
static uint64_t ms_to_us(double ms) {
    if (!(ms > 0) || ms > 1e15)
        return 0;
    return (uint64_t)llround(ms * 1000.0);
}

void hkl_hist_observe(hkl_hist *h, double total_ms) {
    uint64_t us = ms_to_us(total_ms);
    int i = 0;
    while (i < HKL_HIST_BUCKETS - 1 && us > buckets[i].us)
        i++;
    h->n[i]++;
    h->count++;
    h->sum_us += us;
}

static void counter(hk_metrics_writer *w, const char *name, const char *type, const char *help,
                    uint64_t v) {
    hk_metrics_family(w, name, type, help);
    hk_metrics_sample(w, name, NULL, NULL, v);
}

static void seconds(hk_metrics_writer *w, const char *name, const char *type, const char *help,
                    double ms) {
    char v[32];
    hkl_fmt_seconds(v, sizeof v, ms_to_us(ms));
    hkl_mw_family(w, name, type, help);
    hkl_mw_sample(w, name, "", NULL, v);
}

static void histogram(hk_metrics_writer *w, const hkl_hist *h) {
    static const char *name = "hotkern_swap_duration_seconds";
    char v[32], le[32];
    uint64_t cum = 0;
    hkl_mw_family(w, name, "histogram",
                  "Time from a swap's call or submission to its commit (rollbacks included).");
    for (int i = 0; i < HKL_HIST_BUCKETS; i++) {
        cum += h->n[i];
        snprintf(le, sizeof le, "le=\"%s\"", i < HKL_HIST_BUCKETS - 1 ? buckets[i].le : "+Inf");
        snprintf(v, sizeof v, "%llu", (unsigned long long)cum);
        hkl_mw_sample(w, name, "_bucket", le, v);
    }
    hkl_fmt_seconds(v, sizeof v, h->sum_us);
    hkl_mw_sample(w, name, "_sum", NULL, v);
    snprintf(v, sizeof v, "%llu", (unsigned long long)h->count);
    hkl_mw_sample(w, name, "_count", NULL, v);
}

/* The canary's costs and outcomes: refusals by kind in one family, the
 * perf guard's last figures as gauges. */
static void canary(hk_metrics_writer *w, const hk_stats *s) {
    static const char *refused = "hotkern_canary_refused_total";
    const struct {
        const char *kind;
        uint64_t n;
    } kinds[] = {
        {"fault", s->canary_refused_fault},
        {"hang", s->canary_refused_hang},
        {"mismatch", s->canary_refused_mismatch},
        {"slower", s->canary_refused_slower},
        {"memcheck", s->canary_refused_memcheck},
        {"could_not_run", s->canary_refused_could_not_run},
    };
    char label[48], v[32];
    counter(w, "hotkern_canary_runs_total", "counter",
            "Versions whose test launches ran in the canary.", s->canary_runs);
    hkl_mw_family(w, refused, "counter", "Versions the canary refused, by what refused them.");
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        snprintf(label, sizeof label, "kind=\"%s\"", kinds[i].kind);
        snprintf(v, sizeof v, "%llu", (unsigned long long)kinds[i].n);
        hkl_mw_sample(w, refused, "", label, v);
    }
    counter(w, "hotkern_canary_helper_starts_total", "counter",
            "Canary helper processes started (plain and memcheck).", s->canary_helper_starts);
    seconds(w, "hotkern_canary_seconds_total", "counter", "Time spent in canary runs.",
            s->canary_ms_total);
    seconds(w, "hotkern_canary_last_new_seconds", "gauge",
            "Median GPU time of the last timed canary test launch, new version.",
            s->canary_last_new_ms);
    seconds(w, "hotkern_canary_last_running_seconds", "gauge",
            "Median GPU time of the same test launch on the running version (0: none).",
            s->canary_last_old_ms);
    counter(w, "hotkern_canary_sanitizer", "gauge",
            "1 when canary test launches run under compute-sanitizer memcheck first.",
            s->canary_sanitizer);
}

/* One metric a call: name, type, help, value (the canary's above has the
 * same shape, other metrics). */
void hkl_metrics_engine(hk_metrics_writer *w, const hk_stats *s, const hkl_hist *h) {
    static const hkl_hist empty;
    char version[64];
    snprintf(version, sizeof version, "version=\"%s\"", hk_version());
    hkl_mw_family(w, "hotkern_build_info", "gauge", "The hotkern library's version.");
    hkl_mw_sample(w, "hotkern_build_info", "", version, "1");
    counter(w, "hotkern_swaps_total", "counter",
            "Versions committed by the engine, rollbacks included.", s->swaps);
    counter(w, "hotkern_rollbacks_total", "counter", "Rollbacks committed.", s->rollbacks);
    counter(w, "hotkern_refused_total", "counter", "Versions the engine refused.", s->refused);
    counter(w, "hotkern_reclaimed_total", "counter", "Old versions whose code was unloaded.",
            s->reclaimed);
    counter(w, "hotkern_live_versions", "gauge", "Versions whose code is loaded now.",
            s->live_versions);
    counter(w, "hotkern_retired_loaded", "gauge",
            "Replaced versions still loaded (pins, captured graphs, safe points).",
            s->retired_loaded);
    counter(w, "hotkern_context_resets_total", "counter", "Context resets detected.",
            s->context_resets);
    counter(w, "hotkern_context_lost_total", "counter",
            "Sticky CUDA errors seen (a kernel faulted: the process must restart).",
            s->context_lost);
    counter(w, "hotkern_quarantined_images", "gauge",
            "Images quarantined (committed shortly before the context was lost), all modules.",
            s->quarantined);
    counter(w, "hotkern_cache_hits_total", "counter", "Compile cache hits.", s->cache_hits);
    counter(w, "hotkern_cache_misses_total", "counter", "Compile cache misses.", s->cache_misses);
    seconds(w, "hotkern_build_seconds_total", "counter",
            "Time spent building images (NVRTC, nvJitLink).", s->build_ms_total);
    seconds(w, "hotkern_stage_seconds_total", "counter", "Time spent staging images in the driver.",
            s->stage_ms_total);
    seconds(w, "hotkern_commit_seconds_total", "counter", "Time spent committing versions.",
            s->commit_ms_total);
    seconds(w, "hotkern_last_swap_seconds", "gauge", "Duration of the latest swap.",
            s->last_swap_ms);
    counter(w, "hotkern_gate_closes_total", "counter", "Times the launch gate closed.",
            s->gate_closes);
    seconds(w, "hotkern_gate_closed_max_seconds", "gauge",
            "Longest time the launch gate stayed "
            "closed.",
            s->gate_closed_max_ms);
    counter(w, "hotkern_launch_hold_timeouts_total", "counter",
            "Launches that waited the longest hold at the launch gate, then went on.",
            s->launch_hold_timeouts);
    counter(w, "hotkern_launch_errors_total", "counter",
            "Launches the driver refused (hk_launch, hk_launch_ex, pinned and graph launches).",
            s->launch_errors);
    counter(w, "hotkern_program_fallbacks_total", "counter",
            "Launches of a program's kernel that failed in the hot version and ran the "
            "program's own code.",
            s->program_fallbacks);
    canary(w, s);
    histogram(w, h ? h : &empty);
}

int hkl_metrics_init(hk_runtime *rt) {
    return pthread_mutex_init(&rt->metrics.lock, NULL) ? HK_ERR_NOMEM : 0;
}

void hkl_metrics_finish(hk_runtime *rt) {
    pthread_mutex_destroy(&rt->metrics.lock);
}

int hk_stats_get(hk_runtime *rt, hk_stats *user) {
    if (!rt || !user || hkb_size_of(user) < HKB_STATS_SIZE0)
        return HK_ERR_INVALID;
    hk_stats full;
    hk_stats *out = &full;
    pthread_mutex_lock(&rt->metrics.lock);
    *out = rt->metrics.stats;
    out->size = sizeof *out;
    pthread_mutex_unlock(&rt->metrics.lock);
    pthread_mutex_lock(&rt->rec.lock);
    out->retired_loaded = (uint64_t)rt->rec.nretired;
    pthread_mutex_unlock(&rt->rec.lock);
    out->gate_closes = atomic_load(&rt->gate.closes);
    out->gate_closed_max_ms = (double)atomic_load(&rt->gate.max_ns) / 1e6;
    out->launch_hold_timeouts = atomic_load(&rt->gate.hold_timeouts);
    out->launch_errors = atomic_load(&rt->gate.launch_errors);
    if (rt->cache) {
        uint64_t h, m, b;
        hkp_cache_stats(rt->cache, &h, &m, &b);
        out->cache_hits = h;
        out->cache_misses = m;
    }
    if (rt->canary) {
        hka_counters n;
        hka_counts(rt->canary, &n);
        out->canary_runs = n.runs;
        out->canary_refused = n.refused;
        out->canary_helper_starts = n.starts;
        out->canary_refused_fault = n.refused_by[HKA_KIND_FAULT];
        out->canary_refused_hang = n.refused_by[HKA_KIND_HANG];
        out->canary_refused_mismatch = n.refused_by[HKA_KIND_MISMATCH];
        out->canary_refused_slower = n.refused_by[HKA_KIND_SLOWER];
        out->canary_refused_memcheck = n.refused_by[HKA_KIND_MEMCHECK];
        out->canary_refused_could_not_run = n.refused_by[HKA_KIND_NOT_RUN];
        out->canary_ms_total = n.ms_total;
        out->canary_last_new_ms = n.last_new_ms;
        out->canary_last_old_ms = n.last_old_ms;
        out->canary_sanitizer = (uint64_t)n.sanitizer;
    }
    hkl_lkg_counts(rt, &out->context_lost, &out->quarantined);
    hkb_sized_out(user, out, sizeof *out);
    return 0;
}

/* ---- what swaps cost --------------------------------------------------- */

void hkl_count_swap(hk_runtime *rt, int committed, int rollback, const hk_report *rep) {
    pthread_mutex_lock(&rt->metrics.lock);
    if (committed) {
        rt->metrics.stats.swaps++;
        rt->metrics.stats.rollbacks += rollback != 0;
        rt->metrics.stats.live_versions++;
        rt->metrics.stats.last_swap_ms = rep->total_ms;
        hkl_hist_observe(&rt->metrics.swap_hist, rep->total_ms);
    } else {
        rt->metrics.stats.refused++;
    }
    rt->metrics.stats.build_ms_total += rep->build_ms;
    rt->metrics.stats.stage_ms_total += rep->stage_ms;
    rt->metrics.stats.commit_ms_total += rep->commit_ms;
    pthread_mutex_unlock(&rt->metrics.lock);
}

/* Fills the report's total and the part of it no step accounts for
 * (waiting for the lock, a safe point, reset recovery). */
void hkl_report_times(hk_report *rep, double t_start) {
    if (!rep || !t_start)
        return;
    rep->total_ms = hkl_now_ms() - t_start;
    double w = rep->total_ms - rep->build_ms - rep->stage_ms - rep->commit_ms;
    rep->wait_ms = w > 0 ? w : 0;
}

/* ---- the text --------------------------------------------------------- */

/* Sources in the order they were attached (the list is newest first). */
static void walk(hkl_source *s, hk_metrics_writer *w) {
    if (!s)
        return;
    walk(s->next, w);
    if (s->metrics) {
        hkl_mw_base(w, NULL, NULL);
        s->metrics(s->ctx, w);
    }
}

int hk_metrics_text_alloc(hk_runtime *rt, char **out, size_t *len) {
    if (len)
        *len = 0;
    if (!out)
        return HK_ERR_INVALID;
    *out = NULL;
    if (!rt)
        return HK_ERR_INVALID;
    hk_metrics_writer *w = hkl_mw_new();
    if (!w)
        return HK_ERR_NOMEM;
    hk_stats s = HK_STATS_INIT;
    hkl_hist h;
    hk_stats_get(rt, &s);
    pthread_mutex_lock(&rt->metrics.lock);
    h = rt->metrics.swap_hist;
    pthread_mutex_unlock(&rt->metrics.lock);
    hkl_metrics_engine(w, &s, &h);
    pthread_mutex_lock(&rt->src.lock);
    walk(rt->src.list, w);
    pthread_mutex_unlock(&rt->src.lock);
    return hkl_mw_take(w, out, len);
}

int hk_metrics_text(hk_runtime *rt, char *buf, size_t cap, size_t *len) {
    char *text;
    size_t n;
    if (len)
        *len = 0;
    if (!buf || !cap)
        return HK_ERR_INVALID;
    buf[0] = '\0';
    int err = hk_metrics_text_alloc(rt, &text, &n);
    if (err)
        return err;
    if (len)
        *len = n;
    if (n + 1 > cap)
        err = HK_ERR_TOO_LARGE;
    else
        memcpy(buf, text, n + 1);
    free(text);
    return err;
}

/* ---- sources outside the engine's library ------------------------------ */

struct hk_metrics_source {
    hkl_source src;      /* attached to rt while rt is set */
    hk_runtime *rt;      /* NULL once the runtime released it */
    hk_metrics_cb cb;    /* immutable */
    void *ud;            /* immutable */
    char *label, *value; /* immutable: the source's own label, or NULL */
};

/* [a-zA-Z_][a-zA-Z0-9_]*, not reserved (a leading "__"). */
static int label_name_ok(const char *s) {
    static const char ok[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789";
    return *s && strspn(s, ok) == strlen(s) && !(*s >= '0' && *s <= '9') && strncmp(s, "__", 2);
}

static void source_metrics(void *ctx, hk_metrics_writer *w) {
    hk_metrics_source *s = ctx;
    hkl_mw_base(w, s->label, s->value);
    s->cb(w, s->ud);
    hkl_mw_base(w, NULL, NULL);
}

/* hk_runtime_destroy went first (against the rules): the owner still frees
 * s with hk_metrics_detach, which must not touch the runtime then. */
static void source_release(void *ctx) {
    hk_metrics_source *s = ctx;
    s->rt = NULL;
}

int hk_metrics_attach(hk_runtime *rt, hk_metrics_cb cb, void *userdata, const char *label,
                      const char *label_value, hk_metrics_source **out) {
    if (!out)
        return HK_ERR_INVALID;
    *out = NULL;
    if (!rt || !cb || (label && !label_name_ok(label)))
        return HK_ERR_INVALID;
    hk_metrics_source *s = calloc(1, sizeof *s);
    if (!s)
        return HK_ERR_NOMEM;
    s->rt = rt;
    s->cb = cb;
    s->ud = userdata;
    if (label &&
        (!(s->label = strdup(label)) || !(s->value = strdup(label_value ? label_value : "")))) {
        free(s->label);
        free(s);
        return HK_ERR_NOMEM;
    }
    s->src.ctx = s;
    s->src.metrics = source_metrics;
    s->src.release = source_release;
    int err = hkl_source_attach(rt, &s->src);
    if (err) {
        free(s->label);
        free(s->value);
        free(s);
        return err;
    }
    *out = s;
    return 0;
}

void hk_metrics_detach(hk_metrics_source *s) {
    if (!s)
        return;
    if (s->rt)
        hkl_source_detach(s->rt, &s->src);
    free(s->label);
    free(s->value);
    free(s);
}

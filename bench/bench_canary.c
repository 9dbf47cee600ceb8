/*
 * What a canary run adds to a swap. One runtime with a canary helper; two
 * modules whose kernel k0(float *x, int n) has one declared test launch over
 * n floats (default 1 Mi, 4 MiB): module "plain" without comparison, module
 * "cmp" comparing every float with the running version. Each swap alternates
 * between two cubins that differ only by an extra empty kernel (built once,
 * so no compile is timed), and, in the same run, the same swap with
 * HK_CANARY_SKIP is the baseline. Reported: hk_report.total_ms of each kind
 * and the canary_ms part.
 *
 * The same swap with the perf guard (the new and the running version each
 * repeated once untimed and five times timed) is a row of its own; the
 * other rows turn the guard off, as before it existed, and memcheck is off
 * throughout (bench_canary_cost measures it).
 *
 * Then what the canary's GPU work costs the live program: a thread of this
 * process launches k0 of a third module over its own buffer on its own
 * stream and synchronises after each launch, without pause, and records each
 * launch-to-completion time. Three phases of the same length: no swaps; swaps
 * back to back with the canary skipped; swaps back to back with the canary
 * (launch only). The helper's context time-slices the GPU with this one, so
 * the live thread's longest iteration in the third phase, against the second,
 * is the gap the canary causes.
 *
 *   bench_canary [rounds] [floats]
 *
 * Runs on a GPU; with HK_LIBCUDA=BUILD/lib/libhotkern-fakecuda.so it runs on
 * the CPU too (numbers then say nothing about a GPU).
 */
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/common.h"
#include "hotkern/hotkern.h"

static hk_runtime *rt;
static void *img[2];
static size_t img_size[2];

/* Whether swaps run the perf guard (its timed repeats of both versions):
 * off for the rows comparable with the runs before it existed. */
static int guard;

/* Swaps module `m` to the image it does not run; returns the report. */
static int swap(const char *m, int *which, hk_canary_policy policy, hk_report *rep) {
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.canary = policy;
    so.canary_slowdown_max = guard ? 0 : -1;
    so.stage = HK_STAGE_NOW;
    *which ^= 1;
    return hk_swap(rt, m, img[*which], img_size[*which], &so, rep);
}

static void declare(const char *m, int floats, hk_compare cmp) {
    hk_report rep = HK_REPORT_INIT;
    int which = 1;
    if (swap(m, &which, HK_CANARY_SKIP, &rep) < 0) {
        fprintf(stderr, "first version: %s\n", rep.message);
        exit(1);
    }
    hk_kernel *k;
    hk_test *t;
    hk_kernel_get(rt, m, "k0", &k);
    hk_test_create(&t, (hk_dim3){(unsigned)(floats + 255) / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0);
    hk_test_buffer(t, (size_t)floats * sizeof(float), HK_FILL_IOTA_F32, 0, NULL);
    hk_test_scalar(t, &floats, sizeof floats);
    hk_test_compare(t, cmp, 0, 0);
    if (hk_kernel_add_test(k, t, &rep) < 0) {
        fprintf(stderr, "test: %s\n", rep.message);
        exit(1);
    }
    hk_test_destroy(t);
}

/* ---- the live program -------------------------------------------------- */

enum { LIVE_MAX = 1 << 21 };
static atomic_int live_stop, live_on; /* live_on: record iterations */
static double *live_ms;               /* owned by the live thread while it runs */
static atomic_int live_n;
static hk_kernel *live_k;
static CUdeviceptr live_buf;
static int live_floats;

static void *live_loop(void *arg) {
    (void)arg;
    CUcontext ctx;
    bd.DevicePrimaryCtxRetain(&ctx, 0);
    bd.CtxSetCurrent(ctx);
    CUstream st;
    bd.StreamCreate(&st, CU_STREAM_NON_BLOCKING);
    void *args[] = {&live_buf, &live_floats};
    hk_dim3 g = {(unsigned)(live_floats + 255) / 256, 1, 1}, b = {256, 1, 1};
    while (!atomic_load(&live_stop)) {
        uint64_t t0 = bench_ns();
        if (hk_launch(live_k, g, b, 0, st, args, NULL) != 0 || bd.StreamSynchronize(st) != 0) {
            fprintf(stderr, "live launch failed\n");
            exit(1);
        }
        double ms = (double)(bench_ns() - t0) / 1e6;
        int i = atomic_load(&live_n);
        if (atomic_load(&live_on) && i < LIVE_MAX) {
            live_ms[i] = ms;
            atomic_store(&live_n, i + 1);
        }
    }
    bd.StreamDestroy(st);
    bd.DevicePrimaryCtxRelease(0);
    return NULL;
}

/* One phase of `secs` seconds: swaps of "plain" with `policy` back to back
 * (or none when policy < 0) while the live thread's iterations are recorded;
 * prints their median, p99 and max. */
static void live_phase(const char *what, int policy, double secs) {
    hk_report rep = HK_REPORT_INIT;
    int which = 0, swaps = 0;
    atomic_store(&live_n, 0);
    atomic_store(&live_on, 1);
    uint64_t until = bench_ns() + (uint64_t)(secs * 1e9);
    while (bench_ns() < until) {
        if (policy < 0) {
            usleep(10000);
            continue;
        }
        if (swap("plain", &which, (hk_canary_policy)policy, &rep) < 0) {
            fprintf(stderr, "swap: %s\n", rep.message);
            exit(1);
        }
        swaps++;
    }
    atomic_store(&live_on, 0);
    usleep(20000); /* the live thread's last iteration is done with live_ms */
    int n = atomic_load(&live_n);
    double med = bench_median(live_ms, n);
    printf("  live launch+sync, %-30s %7d iterations, median %.3f ms, p99 %.3f ms, max %.3f ms "
           "(%d swaps)\n",
           what, n, med, bench_pct(live_ms, n, 99), n ? live_ms[n - 1] : 0.0, swaps);
}

static void line(const char *what, double *v, int n, double base) {
    double m = bench_median(v, n);
    printf("  %-40s median %8.3f ms  p90 %8.3f ms", what, m, bench_pct(v, n, 90));
    if (base > 0)
        printf("  (+%.3f ms)", m - base);
    printf("\n");
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 50;
    int floats = argc > 2 ? atoi(argv[2]) : 1 << 20;
    if (rounds < 1 || floats < 1)
        return 2;
    bench_init("bench_canary");
    char *b_src = malloc(strlen(bench_src_small) + 64);
    sprintf(b_src, "%sextern \"C\" __global__ void pad() {}\n", bench_src_small);
    img[0] = bench_build(bench_src_small, 1, &img_size[0]);
    img[1] = bench_build(b_src, 1, &img_size[1]);
    char helper[PATH_MAX + 32];
    bench_canary_helper(helper, sizeof helper);
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = "";
    o.canary = 1;
    o.canary_helper = helper;
    o.canary_sanitizer = -1; /* memcheck's costs: bench_canary_cost */
    hk_report rep = HK_REPORT_INIT;
    if (hk_runtime_create(&rt, &o, &rep) < 0) {
        fprintf(stderr, "runtime: %s\n", rep.message);
        return 1;
    }
    declare("plain", floats, HK_COMPARE_NONE);
    declare("cmp", floats, HK_COMPARE_F32);
    double *v[7];
    for (int i = 0; i < 7; i++)
        v[i] = calloc((size_t)rounds, sizeof(double));
    int wp = 0, wc = 0, bad = 0;
    for (int r = 0; r < rounds; r++) {
        bad |= swap("plain", &wp, HK_CANARY_SKIP, &rep) < 0;
        v[0][r] = rep.total_ms;
        bad |= swap("plain", &wp, HK_CANARY_OPTIONAL, &rep) < 0;
        v[1][r] = rep.total_ms;
        v[3][r] = rep.canary_ms;
        bad |= swap("cmp", &wc, HK_CANARY_OPTIONAL, &rep) < 0;
        v[2][r] = rep.total_ms;
        v[4][r] = rep.canary_ms;
        guard = 1;
        bad |= swap("plain", &wp, HK_CANARY_OPTIONAL, &rep) < 0;
        guard = 0;
        v[5][r] = rep.total_ms;
        v[6][r] = rep.canary_ms;
        if (bad || !strstr(rep.canary, "passed")) {
            fprintf(stderr, "round %d: %s / canary: %s\n", r, rep.message, rep.canary);
            return 1;
        }
    }
    printf("canary: %d rounds, one test launch of k0 over %d floats (%zu bytes), cubins\n", rounds,
           floats, (size_t)floats * sizeof(float));
    double base = bench_median(v[0], rounds);
    line("swap, canary skipped", v[0], rounds, 0);
    line("swap with canary (launch only)", v[1], rounds, base);
    line("swap with canary (launch + compare)", v[2], rounds, base);
    line("  of which canary (launch only)", v[3], rounds, 0);
    line("  of which canary (launch + compare)", v[4], rounds, 0);
    line("swap with canary (launch + perf guard)", v[5], rounds, base);
    line("  of which canary (launch + perf guard)", v[6], rounds, 0);

    /* The live program beside the canary. */
    hk_report lrep = HK_REPORT_INIT;
    hk_swap_options lso;
    hk_swap_options_init(&lso);
    lso.canary = HK_CANARY_SKIP;
    live_floats = floats;
    live_ms = calloc(LIVE_MAX, sizeof(double));
    if (!live_ms || hk_swap(rt, "live", img[0], img_size[0], &lso, &lrep) < 0 ||
        hk_kernel_get(rt, "live", "k0", &live_k) < 0 ||
        bd.MemAlloc(&live_buf, (size_t)floats * sizeof(float)) != 0) {
        fprintf(stderr, "live program: %s\n", lrep.message);
        return 1;
    }
    printf("live program: k0 over %d floats launched and synchronised back to back on its own "
           "stream, 2 s per phase\n",
           floats);
    pthread_t lt;
    pthread_create(&lt, NULL, live_loop, NULL);
    live_phase("no swaps", -1, 2);
    live_phase("swaps, canary skipped", HK_CANARY_SKIP, 2);
    live_phase("swaps with canary", HK_CANARY_OPTIONAL, 2);
    guard = 1;
    live_phase("swaps with canary + perf guard", HK_CANARY_OPTIONAL, 2);
    guard = 0;
    atomic_store(&live_stop, 1);
    pthread_join(lt, NULL);
    free(live_ms);

    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    printf("  canary runs %llu, refused %llu, helper starts %llu\n",
           (unsigned long long)st.canary_runs, (unsigned long long)st.canary_refused,
           (unsigned long long)st.canary_helper_starts);
    hk_runtime_destroy(rt);
    return 0;
}

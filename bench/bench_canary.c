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
 *   bench_canary [rounds] [floats]
 *
 * Runs on a GPU; with HK_LIBCUDA=BUILD/lib/libhotkern-fakecuda.so it runs on
 * the CPU too (numbers then say nothing about a GPU).
 */
#include <libgen.h>
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

static void helper_path(char *out, size_t n) {
    char self[PATH_MAX] = "";
    ssize_t r = readlink("/proc/self/exe", self, sizeof self - 1);
    self[r > 0 ? r : 0] = '\0';
    snprintf(out, n, "%s/bin/hotkern-canary", dirname(dirname(self)));
}

/* Swaps module `m` to the image it does not run; returns the report. */
static int swap(const char *m, int *which, hk_canary_policy policy, hk_report *rep) {
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.canary = policy;
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
    helper_path(helper, sizeof helper);
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = "";
    o.canary = 1;
    o.canary_helper = helper;
    hk_report rep = HK_REPORT_INIT;
    if (hk_runtime_create(&rt, &o, &rep) < 0) {
        fprintf(stderr, "runtime: %s\n", rep.message);
        return 1;
    }
    declare("plain", floats, HK_COMPARE_NONE);
    declare("cmp", floats, HK_COMPARE_F32);
    double *v[5];
    for (int i = 0; i < 5; i++)
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
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    printf("  canary runs %llu, refused %llu, helper starts %llu\n",
           (unsigned long long)st.canary_runs, (unsigned long long)st.canary_refused,
           (unsigned long long)st.canary_helper_starts);
    hk_runtime_destroy(rt);
    return 0;
}

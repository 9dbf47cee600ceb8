/*
 * Stall during a swap: does replacing code make a running program hiccup?
 *
 * One thread launches an empty kernel in a loop on its own stream and records
 * the time of every launch; the largest gap and the 99.9th percentile gap
 * between consecutive launches are the program's hiccups. Meanwhile another
 * thread swaps a module every 100 ms, in one of several ways (argv[1]):
 *
 *   none        no swaps (the baseline of the same run)
 *   hk          hk_swap(cubin), library loader, staged at once (the default)
 *   hk-module   the same with the module loader
 *   hk-safe     hk_submit(..., HK_STAGE_AT_SAFE_POINT) and hk_safe_point()
 *               called where the program knows its GPU work is idle
 *   hk-auto     hk_swap with the default stage (HK_STAGE_AUTO) from the swapping
 *               thread, in a program that calls hk_safe_point: the swap
 *               waits for the next safe point
 *   hk-reserve  like hk, after growing the context's code area once at start
 *   probe-ctxsync, probe-unload, probe-state
 *               not swaps: one driver call that reclamation makes (context
 *               synchronise; unload of an idle, already uploaded library;
 *               the reset check's state queries), every 100 ms, to see which
 *               of them stalls launching threads
 *   naive       what programs do without hotkern: the launching thread itself
 *               JIT-compiles PTX in cuModuleLoadDataEx and unloads the old
 *               module
 *
 * argv[2] = "idle" (nothing else runs) or "busy" (another stream runs a
 * 200 ms kernel back to back: the case where a code upload must wait).
 * Each mode runs in its own process (bench/run.sh), so the context starts
 * fresh every time.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/common.h"
#include "hotkern/hotkern.h"

enum { MAXL = 4 << 20 };
static const double RUN_S = 3.0;

static const char *mode, *load;
static CUkernel empty_k;
static CUfunction naive_f;
static CUmodule naive_m;
static uint64_t *stamps;
static long nstamps;
static atomic_int stop;
static hk_runtime *rt;
static void *img[2];
static size_t nimg[2];
static void *ptx_img[2];
static double swap_ms[64];
static int nswaps;
static long long spin_cycles;
static atomic_int spin_running;
static CUlibrary idle_libs[64];

static void *busy_thread(void *arg) {
    (void)arg;
    CUcontext ctx;
    bd.DevicePrimaryCtxRetain(&ctx, 0);
    bd.CtxSetCurrent(ctx);
    CUstream s;
    bd.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    CUlibrary lib;
    CUkernel spin;
    bd.LibraryLoadData(&lib, img[0], NULL, NULL, 0, NULL, NULL, 0);
    bd.LibraryGetKernel(&spin, lib, "spin");
    while (!atomic_load(&stop)) {
        void *args[] = {&spin_cycles};
        bd.LaunchKernel((CUfunction)spin, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
        atomic_store(&spin_running, 1);
        bd.StreamSynchronize(s);
        atomic_store(&spin_running, 0);
        /* The 200 ms kernel finished: the program's idle moment. */
        if (!strcmp(mode, "hk-safe") || !strcmp(mode, "hk-auto"))
            hk_safe_point(rt);
    }
    bd.StreamDestroy(s);
    return NULL;
}

static void *swap_thread(void *arg) {
    (void)arg;
    CUcontext ctx;
    bd.DevicePrimaryCtxRetain(&ctx, 0);
    bd.CtxSetCurrent(ctx);
    usleep(300000);
    for (int i = 0; !atomic_load(&stop) && i < 64; i++) {
        hk_report rep = HK_REPORT_INIT;
        uint64_t t0 = bench_ns();
        if (!strcmp(mode, "probe-ctxsync")) {
            bench_ctx_sync();
        } else if (!strcmp(mode, "probe-unload")) {
            bd.LibraryUnload(idle_libs[i]);
        } else if (!strcmp(mode, "probe-state")) {
            unsigned flags;
            int active;
            unsigned long long id;
            bd.DevicePrimaryCtxGetState(0, &flags, &active);
            bd.CtxGetId(ctx, &id);
        } else if (!strcmp(mode, "hk-safe")) {
            hk_swap_options so;
            hk_swap_options_init(&so);
            so.stage = HK_STAGE_AT_SAFE_POINT;
            hk_submit(rt, "m", img[i % 2], nimg[i % 2], &so);
            hk_wait_idle(rt, 5000);
            if (!strcmp(load, "idle"))
                hk_safe_point(rt); /* nothing else runs: any moment is idle */
        } else if (rt && hk_swap(rt, "m", img[i % 2], nimg[i % 2], NULL, &rep)) {
            fprintf(stderr, "swap failed: %s\n", rep.message);
        }
        swap_ms[nswaps++] = (double)(bench_ns() - t0) / 1e6;
        hk_report_clear(&rep);
        usleep(100000);
    }
    return NULL;
}

/* Fills the context's code area once while idle, so later uploads may fit
 * in what is already there. */
static void reserve_code_area(void) {
    size_t cap = 1 << 20;
    char *src = malloc(cap), *p = src;
    for (int i = 0; i < 400; i++)
        p += snprintf(p, cap - (size_t)(p - src),
                      "extern \"C\" __global__ void r%d(float *x) { for (int j = 0; j < 64; j++) "
                      "x[j] = x[j] * %d.0f + sinf(x[j + %d]); }\n",
                      i, i + 1, i);
    size_t n;
    void *big = bench_build(src, 1, &n);
    CUmodule m;
    bd.ModuleLoadData(&m, big);
    unsigned cnt = 0;
    bd.ModuleGetFunctionCount(&cnt, m);
    CUfunction *fs = calloc(cnt, sizeof *fs);
    bd.ModuleEnumerateFunctions(fs, cnt, m);
    for (unsigned i = 0; i < cnt; i++)
        bd.FuncLoad(fs[i]);
    bd.ModuleUnload(m);
    printf("  reserved: loaded and unloaded %u kernels (%zu bytes of cubin) while idle\n", cnt, n);
    free(fs);
    free(big);
    free(src);
}

int main(int argc, char **argv) {
    mode = argc > 1 ? argv[1] : "none";
    load = argc > 2 ? argv[2] : "idle";
    bench_init("bench_stall");
    char v1[4096], v2[4096];
    snprintf(v1, sizeof v1, "%s// v1\n", bench_src_empty);
    snprintf(v2, sizeof v2, "%s// v2\nextern \"C\" __global__ void extra() {}\n", bench_src_empty);
    img[0] = bench_build(v1, 1, &nimg[0]);
    img[1] = bench_build(v2, 1, &nimg[1]);
    size_t np;
    ptx_img[0] = bench_build(v1, 0, &np);
    ptx_img[1] = bench_build(v2, 0, &np);
    spin_cycles = (long long)(bench_sm_hz() * 0.2);

    CUlibrary lib;
    bd.LibraryLoadData(&lib, img[0], NULL, NULL, 0, NULL, NULL, 0);
    bd.LibraryGetKernel(&empty_k, lib, "empty");
    if (!strcmp(mode, "hk-reserve"))
        reserve_code_area();
    if (!strcmp(mode, "probe-unload"))
        for (int i = 0; i < 64; i++) { /* while idle: the measurement has not started */
            CUkernel k;
            CUfunction f;
            bd.LibraryLoadData(&idle_libs[i], img[1], NULL, NULL, 0, NULL, NULL, 0);
            bd.LibraryGetKernel(&k, idle_libs[i], "extra");
            bd.KernelGetFunction(&f, k);
            bd.FuncLoad(f);
        }
    if (!strncmp(mode, "hk", 2)) {
        hk_options o;
        hk_options_init(&o);
        o.cache_dir = "";
        o.loader = !strcmp(mode, "hk-module") ? HK_LOADER_MODULE : HK_LOADER_LIBRARY;
        hk_report rep = HK_REPORT_INIT;
        if (hk_runtime_create(&rt, &o, &rep) || hk_swap(rt, "m", img[1], nimg[1], NULL, &rep)) {
            fprintf(stderr, "hotkern: %s\n", rep.message);
            return 1;
        }
    }
    if (!strcmp(mode, "naive"))
        bd.ModuleLoadDataEx(&naive_m, ptx_img[1], 0, NULL, NULL);

    stamps = malloc(MAXL * sizeof *stamps);
    CUstream s;
    bd.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    pthread_t bt, st;
    if (!strcmp(load, "busy"))
        pthread_create(&bt, NULL, busy_thread, NULL);
    if (strcmp(mode, "none") && strcmp(mode, "naive"))
        pthread_create(&st, NULL, swap_thread, NULL);

    uint64_t start = bench_ns(), next_naive = start + 300000000ull;
    int naive_i = 0;
    while (nstamps < MAXL) {
        uint64_t now = bench_ns();
        if (now - start > (uint64_t)(RUN_S * 1e9))
            break;
        if (!strcmp(mode, "naive") && now >= next_naive && naive_i < 64) {
            /* Load the new version with the driver JIT and drop the old one,
             * right here on the launching thread. */
            CUmodule old = naive_m;
            bd.ModuleLoadDataEx(&naive_m, ptx_img[naive_i % 2], 0, NULL, NULL);
            bd.ModuleGetFunction(&naive_f, naive_m, "empty");
            bd.ModuleUnload(old);
            swap_ms[nswaps++] = (double)(bench_ns() - now) / 1e6;
            naive_i++;
            next_naive = now + 100000000ull;
        }
        bd.LaunchKernel((CUfunction)empty_k, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
        stamps[nstamps++] = bench_ns();
    }
    atomic_store(&stop, 1);
    if (strcmp(mode, "none") && strcmp(mode, "naive"))
        pthread_join(st, NULL);
    if (!strcmp(load, "busy"))
        pthread_join(bt, NULL);
    bd.StreamSynchronize(s);

    double *gaps = malloc((size_t)nstamps * sizeof *gaps);
    long ng = 0;
    for (long i = 1; i < nstamps; i++)
        gaps[ng++] = (double)(stamps[i] - stamps[i - 1]) / 1e3;
    double med = bench_median(gaps, (int)ng);
    double p999 = bench_pct(gaps, (int)ng, 99.9), mx = gaps[ng - 1];
    double sw = nswaps ? bench_median(swap_ms, nswaps) : 0;
    printf("stall %-10s %-4s: %ld launches, gap median %.1f us, p99.9 %.1f us, max %.3f ms; "
           "%d swaps, swap call median %.2f ms",
           mode, load, nstamps, med, p999, mx / 1e3, nswaps, sw);
    if (nswaps) {
        printf(" (first:");
        for (int i = 0; i < nswaps && i < 4; i++)
            printf(" %.2f", swap_ms[i]);
        printf(")");
    }
    printf("\n");
    if (rt)
        hk_runtime_destroy(rt);
    return 0;
}

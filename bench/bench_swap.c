/*
 * Swap latency: from an image (or source) in memory to the completed first
 * launch of the new version, per input format, against the raw driver calls
 * that do the same work without hotkern's checks. Then scale: the cost of
 * swapping one module while 1, 100 or 1,000 kernels have handles.
 *
 * Every "new" CUDA C source differs from the last by a constant in the code
 * (bench_variant), never by a comment: NVRTC compiles a comment-only change
 * several times faster than a real edit, and a peer that does not profit from
 * that would be compared unfairly. The raw baselines compile the same kind of
 * variants. A cub/cuda::std kernel is measured too (raw NVRTC with the
 * toolkit's include directories, hotkern with its PCH), and so is the first
 * swap in a fresh process after hk_runtime_create (a child process, run
 * with --first-swap).
 *
 * The peer (CuPy RawModule compile + get_function) is measured by
 * bench/cupy_peer.py in the same run (bench/run.sh), on the same formats
 * (bench_swap --source-fmt small|cub prints them).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nvrtc.h>

#include "bench/common.h"
#include "hotkern/hotkern.h"

enum { REPS = 15, REPS_CUB = 7 };

static CUdeviceptr buf;
static int nelem = 1 << 16;

static void launch_raw(CUfunction f) {
    void *args[] = {&buf, &nelem};
    bd.LaunchKernel(f, (unsigned)nelem / 256, 1, 1, 256, 1, 1, 0, NULL, args, NULL);
    bench_ctx_sync();
}

static void launch_hk(hk_runtime *rt, const char *mod) {
    hk_kernel *k;
    if (hk_kernel_get(rt, mod, "k0", &k)) {
        fprintf(stderr, "no k0\n");
        exit(1);
    }
    void *args[] = {&buf, &nelem};
    hk_launch(k, (hk_dim3){(unsigned)nelem / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0, NULL, args, NULL);
    bench_ctx_sync();
}

/* A constant no earlier run or cache has seen: the process id, then i. */
static int fresh_const(int i) {
    return (int)(getpid() % 20000) * 1000 + i % 1000;
}

/* A variant of format fmt that no cache has seen (static storage, valid
 * until the next call). */
static char *fresh_of(const char *fmt, int i) {
    static char *last;
    free(last);
    last = bench_variant(fmt, fresh_const(i));
    return last;
}

static char *fresh_src(int i) {
    return fresh_of(bench_fmt_small, i);
}

/* Raw NVRTC to a cubin with options opts + cuLibraryLoadData + launch of
 * k0, timed in ms. */
static double raw_nvrtc_run(const char *src, const char *const *opts, int nopts) {
    uint64_t t0 = bench_ns();
    nvrtcProgram prog;
    nvrtcCreateProgram(&prog, src, "bench.cu", 0, NULL, NULL);
    if (nvrtcCompileProgram(prog, nopts, opts) != NVRTC_SUCCESS) {
        fprintf(stderr, "raw NVRTC failed\n");
        exit(1);
    }
    size_t n;
    nvrtcGetCUBINSize(prog, &n);
    char *bin = malloc(n);
    nvrtcGetCUBIN(prog, bin);
    nvrtcDestroyProgram(&prog);
    CUlibrary lib;
    CUkernel k;
    bd.LibraryLoadData(&lib, bin, NULL, NULL, 0, NULL, NULL, 0);
    bd.LibraryGetKernel(&k, lib, "k0");
    launch_raw((CUfunction)k);
    double ms = (double)(bench_ns() - t0) / 1e6;
    bd.LibraryUnload(lib);
    free(bin);
    return ms;
}

/* The arch option and the toolkit's include directories, as -I. */
static char raw_arch[32], raw_inc[4200], raw_cccl[4200];
static void raw_opts(void) {
    const hkp_toolkit *tk = hkp_toolkit_get();
    snprintf(raw_arch, sizeof raw_arch, "--gpu-architecture=sm_%d", bench_arch());
    snprintf(raw_inc, sizeof raw_inc, "-I%s", tk->include);
    snprintf(raw_cccl, sizeof raw_cccl, "-I%s", tk->cccl);
}

/* Raw NVRTC with the arch alone, or with toolkit set the toolkit's include
 * directories too (what a program without hotkern must pass for cub). */
static double raw_nvrtc_swap(const char *src, int toolkit) {
    raw_opts();
    const char *opts[] = {raw_arch, raw_inc, raw_cccl};
    return raw_nvrtc_run(src, opts, toolkit ? 3 : 1);
}

/* Raw NVRTC with the options hotkern's default build gives NVRTC (the
 * arch, ptxas -O3, the toolkit's include directories, the automatic PCH
 * and its diagnostics): what a program would do by hand to get hotkern's
 * build. */
static double raw_nvrtc_pch_swap(const char *src) {
    raw_opts();
    const char *opts[] = {raw_arch,
                          "--ptxas-options=-O3",
                          raw_inc,
                          raw_cccl,
                          "-pch",
                          "--pch-messages=false",
                          "--diag-suppress=629,630,639,20283"};
    return raw_nvrtc_run(src, opts, 7);
}

static void report(const char *what, double *v, int n, double base) {
    double m = bench_median(v, n);
    printf("  %-46s median %8.3f ms  (min %.3f, max %.3f)", what, m, v[0], v[n - 1]);
    if (base > 0)
        printf("  x%.2f of raw", m / base);
    printf("\n");
}

static hk_runtime *rt_new(hk_loader loader, hk_ptx_mode mode, const char *cache, int no_warm) {
    hk_options o;
    hk_options_init(&o);
    o.loader = loader;
    o.ptx_mode = mode;
    o.cache_dir = cache;
    o.no_warm_start = no_warm;
    hk_runtime *rt;
    hk_report rep = HK_REPORT_INIT;
    if (hk_runtime_create(&rt, &o, &rep)) {
        fprintf(stderr, "create: %s\n", rep.message);
        exit(1);
    }
    return rt;
}

static hk_runtime *rt_with(hk_loader loader, hk_ptx_mode mode, const char *cache) {
    return rt_new(loader, mode, cache, 0);
}

static void swap_or_die(hk_runtime *rt, const char *mod, const void *img, size_t n) {
    hk_report rep = HK_REPORT_INIT;
    if (hk_swap(rt, mod, img, n, NULL, &rep)) {
        fprintf(stderr, "swap failed: %s\n%s\n", rep.message, rep.log ? rep.log : "");
        exit(1);
    }
    hk_report_clear(&rep);
}

/* Swaps module mod of rt REPS times, alternating between the images a and b
 * (so every swap loads code: the same image twice in a row is a no-op), each
 * followed by a launch; fills ms. */
static void alternate(hk_runtime *rt, const char *mod, const void *a, size_t na, const void *b,
                      size_t nb, double *ms) {
    for (int i = 0; i < REPS; i++) {
        uint64_t t0 = bench_ns();
        if (i % 2)
            swap_or_die(rt, mod, a, na);
        else
            swap_or_die(rt, mod, b, nb);
        launch_hk(rt, mod);
        ms[i] = (double)(bench_ns() - t0) / 1e6;
    }
}

static void latency(void) {
    size_t ncubin, nptx, ncubin2, nptx2;
    char *src1 = bench_variant(bench_fmt_small, 1), *src2 = bench_variant(bench_fmt_small, 2);
    void *cubin = bench_build(src1, 1, &ncubin), *cubin2 = bench_build(src2, 1, &ncubin2);
    void *ptx = bench_build(src1, 0, &nptx), *ptx2 = bench_build(src2, 0, &nptx2);
    free(src1);
    free(src2);
    double raw[REPS], hk[REPS];
    printf("swap latency: image in memory -> first launch of the new version done; hotkern's "
           "swaps alternate two images, so each one loads code\n");

    /* cubin */
    for (int i = 0; i < REPS; i++) {
        uint64_t t0 = bench_ns();
        CUlibrary lib;
        CUkernel k;
        bd.LibraryLoadData(&lib, cubin, NULL, NULL, 0, NULL, NULL, 0);
        bd.LibraryGetKernel(&k, lib, "k0");
        launch_raw((CUfunction)k);
        raw[i] = (double)(bench_ns() - t0) / 1e6;
        bd.LibraryUnload(lib);
    }
    double base_cubin = bench_median(raw, REPS);
    report("raw cuLibraryLoadData(cubin)+launch", raw, REPS, 0);
    for (int i = 0; i < REPS; i++) {
        uint64_t t0 = bench_ns();
        CUmodule m;
        CUfunction f;
        bd.ModuleLoadData(&m, cubin);
        bd.ModuleGetFunction(&f, m, "k0");
        launch_raw(f);
        raw[i] = (double)(bench_ns() - t0) / 1e6;
        bd.ModuleUnload(m);
    }
    report("raw cuModuleLoadData(cubin)+launch", raw, REPS, 0);
    hk_runtime *rt = rt_with(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK, "");
    swap_or_die(rt, "m", cubin, ncubin);
    launch_hk(rt, "m");
    alternate(rt, "m", cubin, ncubin, cubin2, ncubin2, hk);
    report("hk_swap(cubin)+launch", hk, REPS, base_cubin);
    /* The image of the current version again: no load, no new version. */
    swap_or_die(rt, "m", cubin, ncubin);
    for (int i = 0; i < REPS; i++) {
        uint64_t t0 = bench_ns();
        swap_or_die(rt, "m", cubin, ncubin);
        hk[i] = (double)(bench_ns() - t0) / 1e6;
    }
    report("hk_swap(same cubin again), no launch", hk, REPS, base_cubin);

    /* PTX */
    for (int i = 0; i < REPS; i++) {
        uint64_t t0 = bench_ns();
        CUmodule m;
        CUfunction f;
        bd.ModuleLoadDataEx(&m, ptx, 0, NULL, NULL);
        bd.ModuleGetFunction(&f, m, "k0");
        launch_raw(f);
        raw[i] = (double)(bench_ns() - t0) / 1e6;
        bd.ModuleUnload(m);
    }
    double base_ptx = bench_median(raw, REPS);
    report("raw cuModuleLoadDataEx(PTX, driver JIT)+launch", raw, REPS, 0);
    alternate(rt, "m", ptx, nptx, ptx2, nptx2, hk);
    report("hk_swap(PTX via nvJitLink)+launch", hk, REPS, base_ptx);
    hk_runtime *rtj = rt_with(HK_LOADER_LIBRARY, HK_PTX_DRIVER_JIT, "");
    alternate(rtj, "m", ptx, nptx, ptx2, nptx2, hk);
    report("hk_swap(PTX via driver JIT)+launch", hk, REPS, base_ptx);
    hk_runtime_destroy(rtj);

    /* PTX through nvJitLink, served by the compile cache after the first. */
    char pcache[] = "/tmp/hk-bench-ptx-cache-XXXXXX";
    if (!mkdtemp(pcache)) {
        perror("mkdtemp");
        exit(1);
    }
    hk_runtime *rtp = rt_with(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK, pcache);
    swap_or_die(rtp, "m", ptx, nptx);
    swap_or_die(rtp, "m", ptx2, nptx2);
    alternate(rtp, "m", ptx, nptx, ptx2, nptx2, hk);
    report("hk_swap(PTX via nvJitLink, cache hit)+launch", hk, REPS, base_ptx);
    hk_stats pst = HK_STATS_INIT;
    hk_stats_get(rtp, &pst);
    printf("  (cache: %llu hits, %llu misses; these swaps ran right after create, beside the "
           "warm-up compile)\n",
           (unsigned long long)pst.cache_hits, (unsigned long long)pst.cache_misses);
    /* The same runtime once its warm-up compile (NVRTC's first compile and
     * the PCH of a toolkit header, a few seconds at most) is over, and a
     * runtime created without one: which part of the figure above is the
     * swap's own. */
    sleep(6);
    alternate(rtp, "m", ptx, nptx, ptx2, nptx2, hk);
    report("  the same, 6 s after create", hk, REPS, base_ptx);
    hk_runtime_destroy(rtp);
    rtp = rt_new(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK, pcache, 1);
    swap_or_die(rtp, "m", ptx, nptx);
    alternate(rtp, "m", ptx, nptx, ptx2, nptx2, hk);
    report("  the same, runtime with no_warm_start", hk, REPS, base_ptx);
    hk_runtime_destroy(rtp);

    /* CUDA C, each source a real edit (a changed constant). */
    (void)raw_nvrtc_swap(fresh_src(900), 0); /* NVRTC's start-up is not a swap */
    for (int i = 0; i < REPS; i++)
        raw[i] = raw_nvrtc_swap(fresh_src(i), 0);
    double base_cu = bench_median(raw, REPS);
    report("raw NVRTC(cubin)+cuLibraryLoadData+launch", raw, REPS, 0);
    char cache[] = "/tmp/hk-bench-cache-XXXXXX";
    if (!mkdtemp(cache)) {
        perror("mkdtemp");
        exit(1);
    }
    hk_runtime *rtc = rt_with(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK, cache);
    for (int i = 0; i < REPS; i++) {
        const char *src = fresh_src(1000 + i);
        uint64_t t0 = bench_ns();
        swap_or_die(rtc, "m", src, strlen(src));
        launch_hk(rtc, "m");
        hk[i] = (double)(bench_ns() - t0) / 1e6;
    }
    report("hk_swap(CUDA C, cache miss)+launch", hk, REPS, base_cu);
    /* The one-line kernel k0 alone, each source a real edit. */
    (void)raw_nvrtc_swap(fresh_of(bench_fmt_tiny, 800), 0);
    for (int i = 0; i < REPS; i++)
        raw[i] = raw_nvrtc_swap(fresh_of(bench_fmt_tiny, 300 + i), 0);
    double base_tiny = bench_median(raw, REPS);
    report("raw NVRTC(one-line kernel)+load+launch", raw, REPS, 0);
    for (int i = 0; i < REPS; i++) {
        const char *src = fresh_of(bench_fmt_tiny, 400 + i);
        uint64_t t0 = bench_ns();
        swap_or_die(rtc, "t", src, strlen(src));
        launch_hk(rtc, "t");
        hk[i] = (double)(bench_ns() - t0) / 1e6;
    }
    report("hk_swap(one-line kernel, real edit)+launch", hk, REPS, base_tiny);
    /* The same against raw NVRTC with hotkern's options and PCH, round by
     * round (one of each per round, the order swapped every round), so that
     * the host's slow and fast moments hit both alike. */
    {
        enum { ROUNDS = 40 };
        double r2[ROUNDS], h2[ROUNDS];
        (void)raw_nvrtc_pch_swap(fresh_of(bench_fmt_tiny, 850)); /* its PCH */
        for (int i = 0; i < ROUNDS; i++) {
            for (int j = 0; j < 2; j++) {
                if ((i + j) % 2 == 0) {
                    r2[i] = raw_nvrtc_pch_swap(fresh_of(bench_fmt_tiny, 2000 + i));
                } else {
                    const char *src = fresh_of(bench_fmt_tiny, 3000 + i);
                    uint64_t t0 = bench_ns();
                    swap_or_die(rtc, "t", src, strlen(src));
                    launch_hk(rtc, "t");
                    h2[i] = (double)(bench_ns() - t0) / 1e6;
                }
            }
        }
        printf("  interleaved, %d rounds (one-line kernel, real edits):\n", ROUNDS);
        double base_pch = bench_median(r2, ROUNDS);
        report("raw NVRTC(hotkern's options, -pch)+load+launch", r2, ROUNDS, 0);
        report("hk_swap(one-line kernel)+launch", h2, ROUNDS, base_pch);
    }
    char *seen1 = strdup(fresh_src(5000)), *seen2 = strdup(fresh_src(5001));
    swap_or_die(rtc, "m", seen1, strlen(seen1));
    swap_or_die(rtc, "m", seen2, strlen(seen2));
    alternate(rtc, "m", seen1, strlen(seen1), seen2, strlen(seen2), hk);
    report("hk_swap(CUDA C, cache hit)+launch", hk, REPS, base_cu);
    free(seen1);
    free(seen2);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rtc, &st);
    printf("  (cache: %llu hits, %llu misses)\n", (unsigned long long)st.cache_hits,
           (unsigned long long)st.cache_misses);

    /* A cub/cuda::std kernel, each source a real edit. The first swap of
     * each side is left out: hotkern's creates the PCH of the toolkit
     * headers, and both pay the headers' first parse. */
    char *cub = bench_variant(bench_fmt_cub, fresh_const(950));
    (void)raw_nvrtc_swap(cub, 1);
    free(cub);
    double rawc[REPS_CUB], hkc[REPS_CUB];
    for (int i = 0; i < REPS_CUB; i++) {
        cub = bench_variant(bench_fmt_cub, fresh_const(100 + i));
        rawc[i] = raw_nvrtc_swap(cub, 1);
        free(cub);
    }
    double base_cub = bench_median(rawc, REPS_CUB);
    report("raw NVRTC(cub kernel, -I toolkit)+load+launch", rawc, REPS_CUB, 0);
    cub = bench_variant(bench_fmt_cub, fresh_const(960));
    swap_or_die(rtc, "c", cub, strlen(cub));
    free(cub);
    for (int i = 0; i < REPS_CUB; i++) {
        cub = bench_variant(bench_fmt_cub, fresh_const(200 + i));
        uint64_t t0 = bench_ns();
        swap_or_die(rtc, "c", cub, strlen(cub));
        launch_hk(rtc, "c");
        hkc[i] = (double)(bench_ns() - t0) / 1e6;
        free(cub);
    }
    report("hk_swap(cub kernel, real edit, PCH)+launch", hkc, REPS_CUB, base_cub);
    hk_runtime_destroy(rtc);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", cache, pcache);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s, %s\n", cache, pcache);
    hk_runtime_destroy(rt);
    free(cubin);
    free(cubin2);
    free(ptx);
    free(ptx2);
}

/* One module of `k` kernels named k<m>_<i>, adding `c`. */
static void *scale_module(int m, int k, int c, size_t *n) {
    size_t cap = (size_t)k * 128 + 64;
    char *src = malloc(cap), *p = src;
    for (int i = 0; i < k; i++)
        p += snprintf(p, cap - (size_t)(p - src),
                      "extern \"C\" __global__ void k%d_%d(float *x) { x[%d] += %d.0f; }\n", m, i,
                      i, c);
    void *img = bench_build(src, 1, n);
    free(src);
    return img;
}

static void scale(void) {
    static const int shapes[][2] = {{1, 1}, {10, 10}, {100, 10}};
    printf("scale: swap of one module (cubin, alternating two images) with N kernels registered "
           "in M modules\n");
    double first = 0;
    for (int s = 0; s < 3; s++) {
        int nm = shapes[s][0], nk = shapes[s][1];
        hk_runtime *rt = rt_with(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK, "");
        void *img0 = NULL;
        size_t n0 = 0, nalt;
        void *alt = scale_module(0, nk, 2, &nalt); /* mod0's other image */
        for (int m = 0; m < nm; m++) {
            size_t n;
            void *img = scale_module(m, nk, 1, &n);
            char name[16];
            snprintf(name, sizeof name, "mod%d", m);
            swap_or_die(rt, name, img, n);
            for (int i = 0; i < nk; i++) {
                char kn[32];
                hk_kernel *k;
                snprintf(kn, sizeof kn, "k%d_%d", m, i);
                if (hk_kernel_get(rt, name, kn, &k)) {
                    fprintf(stderr, "no %s\n", kn);
                    exit(1);
                }
            }
            if (m == 0) {
                img0 = img;
                n0 = n;
            } else {
                free(img);
            }
        }
        double t[REPS];
        for (int i = 0; i < REPS; i++) {
            uint64_t t0 = bench_ns();
            if (i % 2)
                swap_or_die(rt, "mod0", img0, n0);
            else
                swap_or_die(rt, "mod0", alt, nalt);
            t[i] = (double)(bench_ns() - t0) / 1e6;
        }
        double med = bench_median(t, REPS);
        if (s == 1)
            first = med;
        printf("  %4d kernels in %3d modules: swap of mod0 (%d kernels) median %.3f ms", nm * nk,
               nm, nk, med);
        if (s == 2)
            printf(", x%.2f of the 100-kernel case (same module size)", med / first);
        printf("\n");
        hk_runtime_destroy(rt);
        free(img0);
        free(alt);
    }
}

/* In a fresh process: the first CUDA C swap after hk_runtime_create (which
 * starts warming NVRTC up in the background), after pause_ms, against the
 * median of the warm swaps that follow. */
static void first_swap(int pause_ms) {
    hk_runtime *rt = rt_with(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK, "");
    if (pause_ms > 0)
        usleep((useconds_t)pause_ms * 1000);
    double warm[REPS];
    uint64_t t0 = bench_ns();
    const char *src = fresh_src(700);
    swap_or_die(rt, "m", src, strlen(src));
    launch_hk(rt, "m");
    double first = (double)(bench_ns() - t0) / 1e6;
    for (int i = 0; i < REPS; i++) {
        src = fresh_src(710 + i);
        t0 = bench_ns();
        swap_or_die(rt, "m", src, strlen(src));
        launch_hk(rt, "m");
        warm[i] = (double)(bench_ns() - t0) / 1e6;
    }
    double w = bench_median(warm, REPS);
    printf("  first hk_swap(CUDA C)+launch, %4d ms after create   %8.3f ms  x%.2f of a warm swap "
           "(median %.3f ms)\n",
           pause_ms, first, first / w, w);
    hk_runtime_destroy(rt);
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "--source-fmt")) {
        /* The peer benchmark compiles the same code: a printf format of one
         * int, the constant that changes from variant to variant. */
        fputs(!strcmp(argv[2], "cub")    ? bench_fmt_cub
              : !strcmp(argv[2], "tiny") ? bench_fmt_tiny
                                         : bench_fmt_small,
              stdout);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--source")) {
        fputs(bench_src_small, stdout);
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "--first-swap")) {
        bench_init("bench_swap --first-swap");
        bd.MemAlloc(&buf, (size_t)nelem * sizeof(float));
        first_swap(atoi(argv[2]));
        return 0;
    }
    bench_init("bench_swap");
    bd.MemAlloc(&buf, (size_t)nelem * sizeof(float));
    latency();
    scale();
    fflush(stdout);
    printf("first swap in a fresh process (child processes):\n");
    fflush(stdout);
    for (int i = 0; i < 2; i++) {
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "'%s' --first-swap %d | grep '^  first'", argv[0], i ? 1000 : 0);
        if (system(cmd) != 0)
            fprintf(stderr, "bench: %s failed\n", cmd);
    }
    return 0;
}

/*
 * Swap latency: from an image (or source) in memory to the completed first
 * launch of the new version, per input format, against the raw driver calls
 * that do the same work without hotkern's checks. Then scale: the cost of
 * swapping one module while 1, 100 or 1,000 kernels have handles.
 *
 * The peer (CuPy RawModule compile + get_function) is measured by
 * bench/cupy_peer.py in the same run (bench/run.sh).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nvrtc.h>

#include "bench/common.h"
#include "hotkern/hotkern.h"

enum { REPS = 15 };

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

/* A variant of the small source that no cache has seen. */
static char *fresh_src(int i) {
    static char buf_[8192];
    snprintf(buf_, sizeof buf_, "%s// variant %d %d\n", bench_src_small, (int)getpid(), i);
    return buf_;
}

static void report(const char *what, double *v, int n, double base) {
    double m = bench_median(v, n);
    printf("  %-46s median %8.3f ms  (min %.3f, max %.3f)", what, m, v[0], v[n - 1]);
    if (base > 0)
        printf("  x%.2f of raw", m / base);
    printf("\n");
}

static hk_runtime *rt_with(hk_loader loader, hk_ptx_mode mode, const char *cache) {
    hk_options o;
    hk_options_init(&o);
    o.loader = loader;
    o.ptx_mode = mode;
    o.cache_dir = cache;
    hk_runtime *rt;
    hk_report rep = {0};
    if (hk_runtime_create(&rt, &o, &rep)) {
        fprintf(stderr, "create: %s\n", rep.message);
        exit(1);
    }
    return rt;
}

static void swap_or_die(hk_runtime *rt, const char *mod, const void *img, size_t n) {
    hk_report rep = {0};
    if (hk_swap(rt, mod, img, n, NULL, &rep)) {
        fprintf(stderr, "swap failed: %s\n%s\n", rep.message, rep.log ? rep.log : "");
        exit(1);
    }
    hk_report_clear(&rep);
}

static void latency(void) {
    size_t ncubin, nptx;
    void *cubin = bench_build(bench_src_small, 1, &ncubin);
    void *ptx = bench_build(bench_src_small, 0, &nptx);
    double raw[REPS], hk[REPS];
    printf("swap latency: image in memory -> first launch of the new version done\n");

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
    for (int i = 0; i < REPS; i++) {
        uint64_t t0 = bench_ns();
        swap_or_die(rt, "m", cubin, ncubin);
        launch_hk(rt, "m");
        hk[i] = (double)(bench_ns() - t0) / 1e6;
    }
    report("hk_swap(cubin)+launch", hk, REPS, base_cubin);

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
    for (int i = 0; i < REPS; i++) {
        uint64_t t0 = bench_ns();
        swap_or_die(rt, "m", ptx, nptx);
        launch_hk(rt, "m");
        hk[i] = (double)(bench_ns() - t0) / 1e6;
    }
    report("hk_swap(PTX via nvJitLink)+launch", hk, REPS, base_ptx);
    hk_runtime *rtj = rt_with(HK_LOADER_LIBRARY, HK_PTX_DRIVER_JIT, "");
    for (int i = 0; i < REPS; i++) {
        uint64_t t0 = bench_ns();
        swap_or_die(rtj, "m", ptx, nptx);
        launch_hk(rtj, "m");
        hk[i] = (double)(bench_ns() - t0) / 1e6;
    }
    report("hk_swap(PTX via driver JIT)+launch", hk, REPS, base_ptx);
    hk_runtime_destroy(rtj);

    /* CUDA C */
    for (int i = 0; i < REPS; i++) {
        const char *src = fresh_src(i);
        uint64_t t0 = bench_ns();
        nvrtcProgram prog;
        char opt[32];
        snprintf(opt, sizeof opt, "--gpu-architecture=sm_%d", bench_arch());
        const char *opts[] = {opt};
        nvrtcCreateProgram(&prog, src, "bench.cu", 0, NULL, NULL);
        nvrtcCompileProgram(prog, 1, opts);
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
        raw[i] = (double)(bench_ns() - t0) / 1e6;
        bd.LibraryUnload(lib);
        free(bin);
    }
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
    const char *same = fresh_src(5000);
    swap_or_die(rtc, "m", same, strlen(same));
    for (int i = 0; i < REPS; i++) {
        uint64_t t0 = bench_ns();
        swap_or_die(rtc, "m", same, strlen(same));
        launch_hk(rtc, "m");
        hk[i] = (double)(bench_ns() - t0) / 1e6;
    }
    report("hk_swap(CUDA C, cache hit)+launch", hk, REPS, base_cu);
    hk_stats st;
    hk_stats_get(rtc, &st);
    printf("  (cache: %llu hits, %llu misses)\n", (unsigned long long)st.cache_hits,
           (unsigned long long)st.cache_misses);
    hk_runtime_destroy(rtc);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", cache);
    hk_runtime_destroy(rt);
    free(cubin);
    free(ptx);
}

/* One module of `k` kernels named k<m>_<i>. */
static void *scale_module(int m, int k, size_t *n) {
    size_t cap = (size_t)k * 128 + 64;
    char *src = malloc(cap), *p = src;
    for (int i = 0; i < k; i++)
        p +=
            snprintf(p, cap - (size_t)(p - src),
                     "extern \"C\" __global__ void k%d_%d(float *x) { x[%d] += 1.0f; }\n", m, i, i);
    void *img = bench_build(src, 1, n);
    free(src);
    return img;
}

static void scale(void) {
    static const int shapes[][2] = {{1, 1}, {10, 10}, {100, 10}};
    printf("scale: swap of one module (cubin) with N kernels registered in M modules\n");
    double first = 0;
    for (int s = 0; s < 3; s++) {
        int nm = shapes[s][0], nk = shapes[s][1];
        hk_runtime *rt = rt_with(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK, "");
        void *img0 = NULL;
        size_t n0 = 0;
        for (int m = 0; m < nm; m++) {
            size_t n;
            void *img = scale_module(m, nk, &n);
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
            swap_or_die(rt, "mod0", img0, n0);
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
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--source")) {
        fputs(bench_src_small, stdout); /* the peer benchmark compiles the same code */
        return 0;
    }
    bench_init("bench_swap");
    bd.MemAlloc(&buf, (size_t)nelem * sizeof(float));
    latency();
    scale();
    return 0;
}

/*
 * GPU suite: hotkern inside a program that uses the CUDA runtime API.
 *
 * Runs on a real device only (SKIP elsewhere), in one process without fork
 * (CUDA does not survive fork), in the order the tests are added: the first
 * test must attach before any runtime call, and the reset test runs last.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loader/core.h"
#include "tests/gpu.h"
#include "tests/harness.h"

static const char *SRC =
    "extern \"C\" __global__ void step(int *region, int n, int *tag_out) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) region[i] += 1;\n"
    "  if (i == 0) *tag_out = TAG;\n"
    "}\n"
    "extern \"C\" __global__ void affine(int *x, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) x[i] = MUL * x[i] + 1;\n"
    "}\n"
    "__device__ int counter;\n"
    "extern \"C\" __global__ void bump(int *out) { counter += 1; *out = counter; }\n";

/* Same kernels, but `step` lost a parameter / `affine` is gone. */
static const char *SRC_LAYOUT = "extern \"C\" __global__ void step(int *region, int n) {}\n"
                                "extern \"C\" __global__ void affine(int *x, int n) {}\n"
                                "extern \"C\" __global__ void bump(int *out) {}\n";
static const char *SRC_MISSING = "extern \"C\" __global__ void step(int *r, int n, int *t) {}\n"
                                 "extern \"C\" __global__ void bump(int *out) {}\n";

static hkb_driver drv; /* our own view of the driver, for checks */

/* Builds SRC with -DTAG=tag -DMUL=mul into `fmt` (PTX or cubin) for arch. */
static void build(int tag, int mul, int want_ptx, int arch, void **img, size_t *size) {
    char d1[32], d2[32];
    snprintf(d1, sizeof d1, "-DTAG=%d", tag);
    snprintf(d2, sizeof d2, "-DMUL=%d", mul);
    const char *opts[] = {d1, d2};
    hkp_build_opts bo = {.arch = arch,
                         .ptx_to_cubin = !want_ptx,
                         .opt_level = 3,
                         .nvrtc_options = opts,
                         .nnvrtc_options = 2,
                         .source_name = "gpu.cu"};
    hkp_artifact a = {0};
    char why[256];
    int err = hkp_build(SRC, strlen(SRC), HK_FORMAT_CUDA_C, &bo, &a, why, sizeof why);
    ck_assert_msg(err == 0, "build: %s %s", why, a.log ? a.log : "");
    ck_assert_int_eq(a.format, want_ptx ? HK_FORMAT_PTX : HK_FORMAT_CUBIN);
    *img = a.image;
    *size = a.size;
    a.image = NULL;
    hkp_artifact_free(&a);
}

static hk_runtime *new_rt(hk_loader loader, hk_ptx_mode mode) {
    hk_options o;
    hk_options_init(&o);
    o.loader = loader;
    o.ptx_mode = mode;
    o.cache_dir = "";
    hk_runtime *rt = NULL;
    hk_report rep = HK_REPORT_INIT;
    int err = hk_runtime_create(&rt, &o, &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    return rt;
}

static void swap_ok(hk_runtime *rt, const char *mod, const void *img, size_t n) {
    hk_report rep = HK_REPORT_INIT;
    int err = hk_swap(rt, mod, img, n, NULL, &rep);
    ck_assert_msg(err == 0, "swap: %s: %s %s", hk_strerror(err), rep.message,
                  rep.log ? rep.log : "");
    hk_report_clear(&rep);
}

/* ---- attach ----------------------------------------------------------- */

START_TEST(attach_hotkern_first) {
    /* No runtime call has happened in this process yet. */
    hk_runtime *rt = new_rt(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK);
    CUcontext mine = hk_runtime_context(rt, 0);
    ck_assert_ptr_nonnull(mine);
    int *p;
    CK_CUDA(cudaMalloc((void **)&p, 64)); /* the runtime adopts the primary context */
    CUcontext cur = NULL;
    ck_assert_int_eq(drv.CtxGetCurrent(&cur), CUDA_SUCCESS);
    ck_assert_ptr_eq(cur, mine);
    CUcontext prim;
    ck_assert_int_eq(drv.DevicePrimaryCtxRetain(&prim, 0), CUDA_SUCCESS);
    ck_assert_ptr_eq(prim, mine);
    drv.DevicePrimaryCtxRelease(0);
    hk_runtime_destroy(rt);
    /* Destroying hotkern left the application's context alone. */
    CK_CUDA(cudaMemset(p, 0, 64));
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaFree(p));
}
END_TEST

START_TEST(attach_runtime_first) {
    CK_CUDA(cudaSetDevice(0));
    CK_CUDA(cudaFree(0));
    CUcontext cur = NULL;
    drv.CtxGetCurrent(&cur);
    hk_runtime *rt = new_rt(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK);
    ck_assert_ptr_eq(hk_runtime_context(rt, 0), cur);
    hk_runtime_destroy(rt);
}
END_TEST

/* ---- loading from PTX and cubin --------------------------------------- */

static void check_affine(hk_runtime *rt, const char *mod, int mul) {
    enum { N = 4096 };
    int host[N], *dev;
    for (int i = 0; i < N; i++)
        host[i] = i;
    CK_CUDA(cudaMalloc((void **)&dev, sizeof host));
    CK_CUDA(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice));
    cudaStream_t s;
    CK_CUDA(cudaStreamCreate(&s));
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, mod, "affine", &k), 0);
    int n = N, cu = 0;
    void *args[] = {&dev, &n};
    ck_assert_int_eq(hk_launch(k, (hk_dim3){N / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0, s, args, &cu),
                     0);
    CK_CUDA(cudaStreamSynchronize(s));
    CK_CUDA(cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(host[i], mul * i + 1);
    CK_CUDA(cudaStreamDestroy(s));
    CK_CUDA(cudaFree(dev));
}

START_TEST(ptx_and_cubin_update_runtime_buffer) {
    for (int loader = 0; loader < 2; loader++) {
        hk_runtime *rt = new_rt(loader, HK_PTX_DRIVER_JIT);
        int arch = hk_runtime_arch(rt);
        void *img;
        size_t n;
        build(1, 3, 1, arch, &img, &n); /* PTX through cuLibrary/cuModuleLoadDataEx's JIT */
        swap_ok(rt, "m", img, n);
        free(img);
        check_affine(rt, "m", 3);
        build(1, 5, 0, arch, &img, &n); /* cubin */
        swap_ok(rt, "m", img, n);
        free(img);
        check_affine(rt, "m", 5);
        hk_runtime_destroy(rt);
    }
}
END_TEST

/* With options.build_isolated the compiles run in hotkern-build: CUDA C
 * built there, loaded here, runs on the application's buffer; an edit too. */
START_TEST(isolated_builds_run_on_the_device) {
    const char *helper = hkt_built_program("hotkern-build");
    ck_assert_msg(access(helper, X_OK) == 0, "no build helper at %s", helper);
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = "";
    o.build_isolated = 1;
    o.build_helper = helper;
    hk_runtime *rt = NULL;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_runtime_create(&rt, &o, &rep) == 0, "create: %s", rep.message);
    for (int mul = 7; mul <= 9; mul += 2) {
        char src[256];
        snprintf(src, sizeof src,
                 "extern \"C\" __global__ void affine(int *x, int n) {\n"
                 "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                 "  if (i < n) x[i] = %d * x[i] + 1;\n}\n",
                 mul);
        swap_ok(rt, "iso", src, strlen(src));
        check_affine(rt, "iso", mul);
    }
    hk_runtime_destroy(rt);
}
END_TEST

START_TEST(ptx_error_returns_jit_log) {
    hk_runtime *rt = new_rt(HK_LOADER_MODULE, HK_PTX_DRIVER_JIT);
    void *img;
    size_t n;
    build(1, 3, 1, hk_runtime_arch(rt), &img, &n);
    swap_ok(rt, "m", img, n);
    /* Break one instruction on a known line of the PTX. */
    char *bad = malloc(n + 64);
    memcpy(bad, img, n);
    char *ret = strstr(bad, "ret;");
    ck_assert_ptr_nonnull(ret);
    memcpy(ret, "rxt;", 4);
    int line = 1;
    for (char *q = bad; q < ret; q++)
        line += *q == '\n';
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_swap(rt, "m", bad, n, NULL, &rep), HK_ERR_COMPILE);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_INVALID_PTX");
    ck_assert_ptr_nonnull(rep.log);
    char want[32];
    snprintf(want, sizeof want, "line %d", line);
    ck_assert_msg(strstr(rep.log, want), "JIT log does not name %s: %s", want, rep.log);
    printf("  JIT log: %s\n", rep.log);
    check_affine(rt, "m", 3); /* the earlier version still runs */
    /* The nvJitLink path reports it off the driver, with the line too. */
    hk_runtime *rt2 = new_rt(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK);
    swap_ok(rt2, "m", img, n);
    hk_report_clear(&rep);
    ck_assert_int_eq(hk_swap(rt2, "m", bad, n, NULL, &rep), HK_ERR_COMPILE);
    ck_assert_ptr_nonnull(rep.log);
    printf("  nvJitLink log: %s\n", rep.log);
    check_affine(rt2, "m", 3);
    hk_report_clear(&rep);
    free(bad);
    free(img);
    hk_runtime_destroy(rt2);
    hk_runtime_destroy(rt);
}
END_TEST

/* ---- 1,000 swaps under 4 launching threads ---------------------------- */

enum { NTHREADS = 4, REGION = 1024 };
static hk_runtime *srt;
static hk_kernel *sk;
static atomic_int gen; /* odd while a swap is in progress */
static atomic_int stop_launchers;
static int *d_region, *d_tags;

typedef struct {
    int id;
    long launches, failures, wrong_version, checked;
} launcher;

/* Tag that must run in stable generation g: swaps alternate 2, 1, 2, ... */
static int expected_tag(int g) {
    return (g / 2) % 2 == 0 ? 1 : 2;
}

static void *launch_loop(void *arg) {
    launcher *L = arg;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int *region = d_region + L->id * REGION, *tag = d_tags + L->id, n = REGION;
    void *args[] = {&region, &n, &tag};
    while (!atomic_load(&stop_launchers)) {
        int g1 = atomic_load(&gen);
        int cu = 0;
        int err =
            hk_launch(sk, (hk_dim3){REGION / 128, 1, 1}, (hk_dim3){128, 1, 1}, 0, s, args, &cu);
        int g2 = atomic_load(&gen);
        if (err) {
            L->failures++;
            continue;
        }
        L->launches++;
        int got = 0;
        cudaMemcpyAsync(&got, tag, sizeof got, cudaMemcpyDeviceToHost, s);
        if (cudaStreamSynchronize(s) != cudaSuccess) {
            L->failures++;
            continue;
        }
        if (g1 == g2 && g1 % 2 == 0) {
            L->checked++;
            if (got != expected_tag(g1))
                L->wrong_version++;
        } else if (got != 1 && got != 2) {
            L->wrong_version++;
        }
    }
    cudaStreamDestroy(s);
    return NULL;
}

static pthread_t lt[NTHREADS];
static launcher ls[NTHREADS];

static void launchers_start(void) {
    atomic_store(&stop_launchers, 0);
    for (int i = 0; i < NTHREADS; i++) {
        ls[i] = (launcher){.id = i};
        pthread_create(&lt[i], NULL, launch_loop, &ls[i]);
    }
}

static long launchers_stop(void) {
    atomic_store(&stop_launchers, 1);
    long total = 0;
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(lt[i], NULL);
        ck_assert_int_eq(ls[i].failures, 0);
        ck_assert_int_eq(ls[i].wrong_version, 0);
        total += ls[i].launches;
    }
    return total;
}

static void *img_v1, *img_v2;
static size_t n_v1, n_v2;

START_TEST(thousand_swaps_four_threads) {
    srt = new_rt(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK);
    int arch = hk_runtime_arch(srt);
    build(1, 3, 0, arch, &img_v1, &n_v1);
    build(2, 3, 0, arch, &img_v2, &n_v2);
    swap_ok(srt, "sim", img_v1, n_v1);
    ck_assert_int_eq(hk_kernel_get(srt, "sim", "step", &sk), 0);
    CK_CUDA(cudaMalloc((void **)&d_region, NTHREADS * REGION * sizeof(int)));
    CK_CUDA(cudaMemset(d_region, 0, NTHREADS * REGION * sizeof(int)));
    CK_CUDA(cudaMalloc((void **)&d_tags, NTHREADS * sizeof(int)));
    /* Warm up one swap pair so driver-internal pools exist before measuring. */
    atomic_store(&gen, 0);
    CK_CUDA(cudaDeviceSynchronize());
    size_t free0, total;
    CK_CUDA(cudaMemGetInfo(&free0, &total));
    launchers_start();
    double t0 = hkl_now_ms();
    /* HK_GPU_SWAPS shortens the run (e.g. under compute-sanitizer). */
    int nswaps = getenv("HK_GPU_SWAPS") ? atoi(getenv("HK_GPU_SWAPS")) : 1000;
    if (nswaps < 2 || nswaps % 2)
        nswaps = 1000;
    for (int i = 1; i <= nswaps; i++) {
        atomic_fetch_add(&gen, 1);
        if (i % 2)
            swap_ok(srt, "sim", img_v2, n_v2);
        else
            swap_ok(srt, "sim", img_v1, n_v1);
        atomic_fetch_add(&gen, 1);
        usleep(300); /* a stable window in which launches are version-checked */
    }
    double t1 = hkl_now_ms();
    long total_launches = launchers_stop();
    ck_assert_int_eq(hk_reclaim_wait(srt, 10000), 0);
    CK_CUDA(cudaDeviceSynchronize());
    size_t free1;
    CK_CUDA(cudaMemGetInfo(&free1, &total));
    /* The buffer holds exactly one increment per launch. */
    int *host = malloc(NTHREADS * REGION * sizeof(int));
    CK_CUDA(cudaMemcpy(host, d_region, NTHREADS * REGION * sizeof(int), cudaMemcpyDeviceToHost));
    long checked = 0;
    for (int t = 0; t < NTHREADS; t++) {
        for (int i = 0; i < REGION; i++)
            ck_assert_int_eq(host[t * REGION + i], ls[t].launches);
        checked += ls[t].checked;
    }
    free(host);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(srt, &st);
    ck_assert_uint_eq(st.swaps, (uint64_t)nswaps + 1);
    ck_assert_uint_eq(st.reclaimed, (uint64_t)nswaps);
    ck_assert_uint_eq(st.live_versions, 1);
    long long dmem = (long long)free0 - (long long)free1;
    printf("  %d swaps in %.0f ms (%.3f ms each, 0.3 ms pauses included) under %ld launches (%ld "
           "version-checked); "
           "device memory change %lld bytes\n",
           nswaps, t1 - t0, (t1 - t0) / nswaps, total_launches, checked, dmem);
    ck_assert_int_gt(total_launches, nswaps);
    ck_assert_int_gt(checked, nswaps / 10);
    ck_assert_msg(dmem < 16ll << 20, "device memory grew by %lld bytes", dmem);
}
END_TEST

START_TEST(refusals_while_launching) {
    atomic_store(&gen, 0); /* the current version (tag 1) stays throughout */
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_module_version(srt, "sim") % 2, 1); /* v1 runs (odd count of swaps) */
    hk_kernel *aff;
    ck_assert_int_eq(hk_kernel_get(srt, "sim", "affine", &aff), 0);
    uint64_t v = hk_module_version(srt, "sim");
    launchers_start();
    ck_assert_int_eq(hk_swap(srt, "sim", SRC_MISSING, strlen(SRC_MISSING), NULL, &rep),
                     HK_ERR_MISSING_KERNEL);
    printf("  removed kernel: %s\n", rep.message);
    ck_assert_str_eq(rep.kernel, "affine");
    ck_assert_int_eq(hk_swap(srt, "sim", SRC_LAYOUT, strlen(SRC_LAYOUT), NULL, &rep),
                     HK_ERR_LAYOUT);
    printf("  changed layout: %s\n", rep.message);
    ck_assert_str_eq(rep.kernel, "step");
    const char *bad_ptx = ".version 8.0\n.target sm_90\n.address_size 64\n"
                          ".visible .entry step(.param .u64 a)\n{\n  bogus.instr;\n  ret;\n}\n";
    ck_assert_int_eq(hk_swap(srt, "sim", bad_ptx, strlen(bad_ptx), NULL, &rep), HK_ERR_COMPILE);
    printf("  PTX error: %s\n", rep.message);
    ck_assert_ptr_nonnull(rep.log);
    const char *bad_cu = "extern \"C\" __global__ void step(int *r, int n, int *t) { r[0] = ; }\n";
    ck_assert_int_eq(hk_swap(srt, "sim", bad_cu, strlen(bad_cu), NULL, &rep), HK_ERR_COMPILE);
    ck_assert_ptr_nonnull(rep.log);
    ck_assert_msg(strstr(rep.log, "(1)"), "NVRTC log names no line: %s", rep.log);
    usleep(100000);
    launchers_stop();
    ck_assert_uint_eq(hk_module_version(srt, "sim"), v);
    hk_report_clear(&rep);
}
END_TEST

/* Under the same launchers: a version committed, the kernel's function
 * looked up, and a rollback to the version before, 50 times. Every launch
 * runs a committed version (the one just committed once the swap or the
 * rollback returned), none fails, and each rollback is a version of its
 * own. */
START_TEST(rollbacks_while_launching) {
    atomic_store(&gen, 0); /* v1 (tag 1) runs */
    hk_report rep = HK_REPORT_INIT;
    uint64_t v = hk_module_version(srt, "sim");
    launchers_start();
    for (int i = 0; i < 50; i++) {
        atomic_fetch_add(&gen, 1);
        swap_ok(srt, "sim", img_v2, n_v2);
        atomic_fetch_add(&gen, 1);
        usleep(300); /* a stable window in which launches are version-checked */
        void *f = NULL;
        ck_assert_int_eq(hk_kernel_function(sk, &f), 0);
        ck_assert_ptr_nonnull(f);
        atomic_fetch_add(&gen, 1);
        ck_assert_msg(hk_rollback(srt, "sim", &rep) == 0, "%s", rep.message);
        atomic_fetch_add(&gen, 1);
        usleep(300);
    }
    long launches = launchers_stop();
    ck_assert_uint_eq(hk_module_version(srt, "sim"), v + 100);
    ck_assert_int_gt(launches, 100);
    printf("  50 swaps and 50 rollbacks under %d launchers: %ld launches\n", NTHREADS, launches);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(global_counter_survives_100_swaps) {
    hk_kernel *bump;
    ck_assert_int_eq(hk_kernel_get(srt, "sim", "bump", &bump), 0);
    int *d_out;
    CK_CUDA(cudaMalloc((void **)&d_out, sizeof(int)));
    uint64_t addr;
    size_t size;
    ck_assert_int_eq(hk_module_global(srt, "sim", "counter", 0, &addr, &size), 0);
    ck_assert_uint_eq(size, sizeof(int));
    CK_CUDA(cudaMemset((void *)(uintptr_t)addr, 0, sizeof(int)));
    void *args[] = {&d_out};
    for (int i = 0; i < 100; i++) {
        ck_assert_int_eq(
            hk_launch(bump, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL), 0);
        CK_CUDA(cudaDeviceSynchronize());
        swap_ok(srt, "sim", i % 2 ? img_v1 : img_v2, i % 2 ? n_v1 : n_v2);
    }
    ck_assert_int_eq(hk_launch(bump, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL),
                     0);
    int got = 0;
    CK_CUDA(cudaMemcpy(&got, d_out, sizeof got, cudaMemcpyDeviceToHost));
    ck_assert_int_eq(got, 101);
    CK_CUDA(cudaFree(d_out));
}
END_TEST

START_TEST(graph_runs_new_version) {
    cudaStream_t s;
    CK_CUDA(cudaStreamCreate(&s));
    int n = REGION, *region = d_region, *tag = d_tags;
    void *args[] = {&region, &n, &tag};
    CK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    ck_assert_int_eq(
        hk_launch(sk, (hk_dim3){REGION / 128, 1, 1}, (hk_dim3){128, 1, 1}, 0, s, args, NULL), 0);
    cudaGraph_t g;
    CK_CUDA(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    CK_CUDA(cudaGraphInstantiate(&exec, g, 0));
    cudaGraphNode_t nodes[4];
    size_t nn = 4;
    CK_CUDA(cudaGraphGetNodes(g, nodes, &nn));
    ck_assert_int_eq(nn, 1);
    ck_assert_int_eq(hk_graph_register(srt, exec, nodes[0], sk), 0);
    int want = hk_module_version(srt, "sim") % 2 ? 1 : 2;
    for (int round = 0; round < 3; round++) {
        CK_CUDA(cudaMemset(d_tags, 0, sizeof(int)));
        ck_assert_int_eq(hk_graph_launch(srt, exec, s, NULL), 0);
        CK_CUDA(cudaStreamSynchronize(s));
        int got;
        CK_CUDA(cudaMemcpy(&got, d_tags, sizeof got, cudaMemcpyDeviceToHost));
        ck_assert_int_eq(got, want);
        swap_ok(srt, "sim", want == 1 ? img_v2 : img_v1, want == 1 ? n_v2 : n_v1);
        want = 3 - want;
        /* Old code unloaded now, but for the version the graph captured:
         * the CUgraph itself still names it, until it is destroyed. */
        hk_stats st = HK_STATS_INIT;
        for (int i = 0; i < 500; i++) {
            hk_stats_get(srt, &st);
            if (st.retired_loaded <= 1)
                break;
            usleep(10 * 1000);
        }
        ck_assert_uint_le(st.retired_loaded, 1);
    }
    ck_assert_int_eq(hk_graph_unregister(srt, exec), 0);
    CK_CUDA(cudaGraphExecDestroy(exec));
    CK_CUDA(cudaGraphDestroy(g));
    ck_assert_int_eq(hk_reclaim_wait(srt, 10000), 0); /* its pin went with it */
    cudaStreamDestroy(s);
}
END_TEST

/* Swaps srt's "sim" to the other image; returns the tag now running. */
static int swap_other(void) {
    int next = hk_module_version(srt, "sim") % 2 ? 2 : 1;
    swap_ok(srt, "sim", next == 2 ? img_v2 : img_v1, next == 2 ? n_v2 : n_v1);
    return next;
}

static double ms_since(struct timespec t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0.tv_sec) * 1e3 + (double)(t.tv_nsec - t0.tv_nsec) / 1e6;
}

enum { UNPACED = 8 };
static atomic_long unpaced_launches, unpaced_failures;

static void *unpaced_loop(void *arg) {
    int id = (int)(intptr_t)arg;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int *region = d_region + (id % NTHREADS) * REGION, *tag = d_tags + (id % NTHREADS), n = 128;
    void *args[] = {&region, &n, &tag};
    long mine = 0, bad = 0;
    while (!atomic_load(&stop_launchers)) {
        if (hk_launch(sk, (hk_dim3){1, 1, 1}, (hk_dim3){128, 1, 1}, 0, s, args, NULL))
            bad++;
        mine++;
    }
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    atomic_fetch_add(&unpaced_launches, mine);
    atomic_fetch_add(&unpaced_failures, bad);
    return NULL;
}

/* Eight threads launch on their own streams with no synchronize and no
 * pause, and swaps go back to back: the driver alone starved every swap
 * here (0 of 10,000 in 220 s); with the launch gate each one finishes. */
START_TEST(swaps_finish_under_unpaced_launchers) {
    atomic_store(&stop_launchers, 0);
    atomic_store(&unpaced_launches, 0);
    atomic_store(&unpaced_failures, 0);
    pthread_t t[UNPACED];
    for (int i = 0; i < UNPACED; i++)
        pthread_create(&t[i], NULL, unpaced_loop, (void *)(intptr_t)i);
    usleep(100 * 1000);
    enum { SWAPS = 1000 };
    static double lat[SWAPS];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < SWAPS; i++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        swap_other();
        lat[i] = ms_since(ts);
    }
    double total = ms_since(t0);
    atomic_store(&stop_launchers, 1);
    for (int i = 0; i < UNPACED; i++)
        pthread_join(t[i], NULL);
    ck_assert_int_eq(atomic_load(&unpaced_failures), 0);
    double max = 0;
    for (int i = 0; i < SWAPS; i++)
        max = lat[i] > max ? lat[i] : max;
    printf("  %d swaps under %d unpaced launchers in %.0f ms (max %.2f ms), %ld launches\n", SWAPS,
           UNPACED, total, max, atomic_load(&unpaced_launches));
    ck_assert_int_eq(hk_reclaim_wait(srt, 10000), 0);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(srt, &st);
    ck_assert_uint_eq(st.live_versions, 1);
}
END_TEST

/* A graph captured (global mode) from hk_launch, then 20 commits with the
 * reclaim thread running: the graph still runs the version it captured,
 * which stays loaded until the graph and its exec are destroyed. */
START_TEST(captured_graph_survives_20_swaps) {
    cudaStream_t s;
    CK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int n = 128, *region = d_region, *tag = d_tags;
    void *args[] = {&region, &n, &tag};
    int captured = hk_module_version(srt, "sim") % 2 ? 1 : 2;
    CK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    ck_assert_int_eq(hk_launch(sk, (hk_dim3){1, 1, 1}, (hk_dim3){128, 1, 1}, 0, s, args, NULL), 0);
    cudaGraph_t g;
    CK_CUDA(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    CK_CUDA(cudaGraphInstantiate(&exec, g, 0));
    for (int i = 0; i < 20; i++)
        swap_other();
    ck_assert_int_eq(hk_reclaim_wait(srt, 500), HK_ERR_TIMEOUT); /* the captured one stays */
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(srt, &st);
    ck_assert_uint_eq(st.retired_loaded, 1);
    CK_CUDA(cudaMemset(d_tags, 0, sizeof(int)));
    CK_CUDA(cudaGraphLaunch(exec, s));
    CK_CUDA(cudaStreamSynchronize(s));
    int got = 0;
    CK_CUDA(cudaMemcpy(&got, d_tags, sizeof got, cudaMemcpyDeviceToHost));
    ck_assert_int_eq(got, captured);
    CK_CUDA(cudaGraphExecDestroy(exec));
    CK_CUDA(cudaGraphDestroy(g));
    ck_assert_int_eq(hk_reclaim_wait(srt, 10000), 0); /* released with the graph */
    CK_CUDA(cudaStreamDestroy(s));
}
END_TEST

static atomic_int cap_phase; /* 1: capturing, 2: main is done */
static cudaError_t cap_end_err, cap_run_err;

static void *global_capture_thread(void *arg) {
    (void)arg;
    cudaStream_t s;
    cudaStreamCreate(&s); /* a blocking stream: the strictest case */
    int *buf;
    cudaMalloc((void **)&buf, 1 << 20);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaMemsetAsync(buf, 1, 1 << 20, s);
    atomic_store(&cap_phase, 1);
    while (atomic_load(&cap_phase) != 2)
        usleep(1000);
    cudaMemsetAsync(buf, 2, 1 << 20, s);
    cudaGraph_t g = NULL;
    cap_end_err = cudaStreamEndCapture(s, &g);
    cap_run_err = cudaErrorUnknown;
    if (cap_end_err == cudaSuccess) {
        cudaGraphExec_t exec;
        cap_run_err = cudaGraphInstantiate(&exec, g, 0);
        if (cap_run_err == cudaSuccess) {
            cap_run_err = cudaGraphLaunch(exec, s);
            if (cap_run_err == cudaSuccess)
                cap_run_err = cudaStreamSynchronize(s);
            cudaGraphExecDestroy(exec);
        }
        cudaGraphDestroy(g);
    }
    cudaFree(buf);
    cudaStreamDestroy(s);
    return NULL;
}

/* Another thread captures in global mode (PyTorch's default) while this one
 * swaps 100 times, carries a __device__ global over, pins and unpins, and
 * hotkern's reclaim thread synchronises and unloads: the capture ends with
 * cudaSuccess and its graph runs. */
START_TEST(global_capture_survives_100_swaps) {
    atomic_store(&cap_phase, 0);
    pthread_t t;
    pthread_create(&t, NULL, global_capture_thread, NULL);
    while (atomic_load(&cap_phase) != 1)
        usleep(1000);
    /* Results are checked after the capture ends: a failed check must not
     * leave it open for the tests after this one. */
    int swaps_ok = 0, reclaims_ok = 0, pins_ok = 0;
    for (int i = 0; i < 100; i++) {
        int next = hk_module_version(srt, "sim") % 2 ? 2 : 1;
        swaps_ok += hk_swap(srt, "sim", next == 2 ? img_v2 : img_v1, next == 2 ? n_v2 : n_v1, NULL,
                            NULL) == 0;
        if (i % 10 == 9) {
            hk_pin *p = NULL;
            pins_ok += hk_pin_module(srt, "sim", &p) == 0;
            /* Libraries are unloaded with no synchronise (which the driver
             * refuses during a capture, invalidating it, even in relaxed
             * mode): reclaim goes on mid-capture. */
            reclaims_ok += hk_reclaim_wait(srt, 10000) == 0;
            hk_unpin(p);
        }
    }
    atomic_store(&cap_phase, 2);
    pthread_join(t, NULL);
    ck_assert_int_eq(swaps_ok, 100);
    ck_assert_int_eq(pins_ok, 10);
    ck_assert_int_eq(reclaims_ok, 10);
    ck_assert_msg(cap_end_err == cudaSuccess, "capture ended with %s",
                  cudaGetErrorName(cap_end_err));
    ck_assert_msg(cap_run_err == cudaSuccess, "captured graph: %s", cudaGetErrorName(cap_run_err));
    ck_assert_int_eq(hk_reclaim_wait(srt, 10000), 0); /* after the capture, all go */
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(srt, &st);
    ck_assert_uint_eq(st.retired_loaded, 0);
    ck_assert_uint_eq(st.live_versions, 1);
}
END_TEST

START_TEST(safe_point_staging) {
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_AT_SAFE_POINT;
    uint64_t v = hk_module_version(srt, "sim");
    int next_tag = v % 2 ? 2 : 1;
    ck_assert_int_eq(
        hk_submit(srt, "sim", next_tag == 2 ? img_v2 : img_v1, next_tag == 2 ? n_v2 : n_v1, &so),
        0);
    ck_assert_int_eq(hk_wait_idle(srt, 10000), 0);
    ck_assert_uint_eq(hk_module_version(srt, "sim"), v);
    CK_CUDA(cudaDeviceSynchronize());
    ck_assert_int_eq(hk_safe_point(srt), 1);
    ck_assert_uint_eq(hk_module_version(srt, "sim"), v + 1);
    int n = REGION, *region = d_region, *tag = d_tags;
    void *args[] = {&region, &n, &tag};
    ck_assert_int_eq(hk_launch(sk, (hk_dim3){1, 1, 1}, (hk_dim3){128, 1, 1}, 0, NULL, args, NULL),
                     0);
    int got;
    CK_CUDA(cudaMemcpy(&got, d_tags, sizeof got, cudaMemcpyDeviceToHost));
    ck_assert_int_eq(got, next_tag);
}
END_TEST

/* ---- attributes and extended launches ---------------------------------- */

static const char *ATTR_SRC =
    "#include <cooperative_groups.h>\n"
    "extern \"C\" __global__ void big(int *out, int n) {\n"
    "  extern __shared__ int sm[];\n"
    "  sm[threadIdx.x] = TAG; __syncthreads();\n"
    "  if (threadIdx.x == 0) { out[0] = sm[0] + sm[n - 1] - TAG; }\n"
    "}\n"
    "extern \"C\" __global__ void coop(int *out) {\n"
    "  cooperative_groups::this_grid().sync();\n"
    "  if (blockIdx.x == 0 && threadIdx.x == 0) out[1] = TAG;\n"
    "}\n"
    "extern \"C\" __global__ void clus(int *out) {\n"
    "  if (blockIdx.x == 1 && threadIdx.x == 0) out[3] = TAG;\n"
    "}\n"
    "#ifdef STATIC_SMEM\n"
    "#define PADN 12288\n"
    "#else\n"
    "#define PADN 16\n"
    "#endif\n"
    "extern \"C\" __global__ void pad(int *out) { __shared__ int s[PADN]; s[threadIdx.x] = 1;\n"
    "  __syncthreads(); out[2] = s[0]; }\n";

static int swap_attr_src(hk_runtime *rt, int tag, int static_smem, hk_report *rep) {
    char d[32];
    snprintf(d, sizeof d, "-DTAG=%d", tag);
    const char *opts[] = {d, "-DSTATIC_SMEM"};
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.nvrtc_options = opts;
    so.nnvrtc_options = static_smem ? 2 : 1;
    so.source_name = "attr.cu";
    return hk_swap(rt, "attr", ATTR_SRC, strlen(ATTR_SRC), &so, rep);
}

/* 100 KB of dynamic shared memory needs the attribute; it is applied to
 * every new version, so the launch keeps working across 10 swaps; a cluster
 * and a cooperative grid-sync launch go through hk_launch_ex across them. */
START_TEST(attributes_and_launch_ex_across_swaps) {
    hk_runtime *rt = new_rt(HK_LOADER_LIBRARY, HK_PTX_NVJITLINK);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(swap_attr_src(rt, 1, 0, &rep) == 0, "%s %s", rep.message, rep.log ? rep.log : "");
    hk_kernel *big, *coop, *clus;
    ck_assert_int_eq(hk_kernel_get(rt, "attr", "big", &big), 0);
    ck_assert_int_eq(hk_kernel_get(rt, "attr", "coop", &coop), 0);
    ck_assert_int_eq(hk_kernel_get(rt, "attr", "clus", &clus), 0);
    int *out;
    CK_CUDA(cudaMalloc((void **)&out, 4 * sizeof(int)));
    enum { SMEM = 100 << 10 };
    int n = 256;
    void *bargs[] = {&out, &n};
    void *cargs[] = {&out};
    ck_assert_msg(hk_kernel_set_attribute(big, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          SMEM, &rep) == 0,
                  "%s", rep.message);
    for (int tag = 1; tag <= 11; tag++) {
        if (tag > 1)
            ck_assert_msg(swap_attr_src(rt, tag, 0, &rep) == 0, "%s", rep.message);
        int cu = 0, got[4] = {0, 0, 0, 0};
        ck_assert_msg(
            hk_launch(big, (hk_dim3){1, 1, 1}, (hk_dim3){256, 1, 1}, SMEM, NULL, bargs, &cu) == 0,
            "100 KB launch, version %d: cu %d", tag, cu);
        hk_launch_config c;
        hk_launch_config_init(&c);
        c.grid = (hk_dim3){2, 1, 1};
        c.block = (hk_dim3){64, 1, 1};
        c.cooperative = 1;
        ck_assert_msg(hk_launch_ex(coop, &c, cargs, &cu) == 0, "cooperative: cu %d", cu);
        hk_launch_config_init(&c);
        c.grid = (hk_dim3){2, 1, 1};
        c.block = (hk_dim3){32, 1, 1};
        c.cluster = (hk_dim3){2, 1, 1};
        ck_assert_msg(hk_launch_ex(clus, &c, cargs, &cu) == 0, "cluster: cu %d", cu);
        CK_CUDA(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost));
        ck_assert_int_eq(got[0], tag);
        ck_assert_int_eq(got[1], tag);
        ck_assert_int_eq(got[3], tag);
    }
    /* pad asks for 200 KB of dynamic shared memory: it fits beside its 64
     * bytes of static shared memory, not beside the 48 KB of the next
     * version, which is refused; the old one runs on. */
    hk_kernel *pad;
    ck_assert_int_eq(hk_kernel_get(rt, "attr", "pad", &pad), 0);
    ck_assert_msg(hk_kernel_set_attribute(pad, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          200 << 10, &rep) == 0,
                  "%s", rep.message);
    uint64_t before = hk_module_version(rt, "attr");
    ck_assert_int_eq(swap_attr_src(rt, 99, 1, &rep), HK_ERR_ATTRIBUTE);
    printf("  attributes: %s\n", rep.message);
    ck_assert_uint_eq(hk_module_version(rt, "attr"), before);
    int cu = 0, got = 0;
    ck_assert_int_eq(
        hk_launch(big, (hk_dim3){1, 1, 1}, (hk_dim3){256, 1, 1}, SMEM, NULL, bargs, &cu), 0);
    CK_CUDA(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost));
    ck_assert_int_eq(got, 11);
    CK_CUDA(cudaFree(out));
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);
}
END_TEST

/* Last: destroys the context under everything. */
START_TEST(device_reset_survived) {
    hk_runtime *mrt = new_rt(HK_LOADER_MODULE, HK_PTX_NVJITLINK);
    swap_ok(mrt, "m", img_v1, n_v1);
    check_affine(mrt, "m", 3);
    check_affine(srt, "sim", 3);
    CK_CUDA(cudaDeviceReset());
    /* The application starts again with new buffers; hotkern's kernels run. */
    check_affine(srt, "sim", 3); /* library: survived as is */
    /* Module: dead with the context; hotkern's thread notices (at once after
     * a failed launch, else within its 200 ms poll) and reloads it. */
    hk_stats st = HK_STATS_INIT;
    for (int i = 0; i < 500; i++) {
        hk_stats_get(mrt, &st);
        if (st.context_resets)
            break;
        usleep(10 * 1000);
    }
    check_affine(mrt, "m", 3);
    swap_ok(srt, "sim", img_v2, n_v2);
    check_affine(srt, "sim", 3);
    hk_stats_get(srt, &st);
    ck_assert_uint_ge(st.context_resets, 1);
    hk_stats_get(mrt, &st);
    ck_assert_uint_ge(st.context_resets, 1);
    hk_runtime_destroy(mrt);
    hk_runtime_destroy(srt);
    free(img_v1);
    free(img_v2);
}
END_TEST

int main(void) {
    if (!hkt_gpu_or_skip("gpu_engine"))
        return HKT_SKIP;
    char why[256];
    if (hkb_driver_open(&drv, why, sizeof why) < 0)
        return 1;
    Suite *s = suite_create("engine (GPU)");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, attach_hotkern_first);
    tcase_add_test(tc, attach_runtime_first);
    tcase_add_test(tc, ptx_and_cubin_update_runtime_buffer);
    tcase_add_test(tc, ptx_error_returns_jit_log);
    tcase_add_test(tc, thousand_swaps_four_threads);
    tcase_add_test(tc, refusals_while_launching);
    tcase_add_test(tc, rollbacks_while_launching);
    tcase_add_test(tc, global_counter_survives_100_swaps);
    tcase_add_test(tc, graph_runs_new_version);
    tcase_add_test(tc, swaps_finish_under_unpaced_launchers);
    tcase_add_test(tc, captured_graph_survives_20_swaps);
    tcase_add_test(tc, global_capture_survives_100_swaps);
    tcase_add_test(tc, safe_point_staging);
    tcase_add_test(tc, attributes_and_launch_ex_across_swaps);
    tcase_add_test(tc, isolated_builds_run_on_the_device);
    tcase_add_test(tc, device_reset_survived);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

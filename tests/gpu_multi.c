/*
 * GPU suite for several devices: one runtime attached to two GPUs commits a
 * version on both or on neither. The failure on the second device is injected
 * by wrapping one entry point of the real driver (cuFuncLoad, when the second
 * device's context is current); everything else is the real driver and the
 * real GPUs. Skips with fewer than two devices.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/core.h"
#include "tests/gpu.h"
#include "tests/harness.h"

static hkb_driver real;
static CUcontext bad_ctx;
static int fail_on_bad;

static CUresult wrapped_func_load(CUfunction f) {
    CUcontext cur = NULL;
    real.CtxGetCurrent(&cur);
    if (fail_on_bad && cur == bad_ctx)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return real.FuncLoad(f);
}

static void src(char *b, size_t n, int tag) {
    snprintf(b, n,
             "extern \"C\" __global__ void tag(int *out) { *out = %d; }\n"
             "extern \"C\" __global__ void add(int *x, int n) {\n"
             "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += %d; }\n",
             tag, tag);
}

/* Runs `tag` on each device's own stream and returns what both wrote. */
static void tags_on_both(hk_kernel *k, int *out0, int *out1) {
    int *res[2];
    for (int d = 0; d < 2; d++) {
        CK_CUDA(cudaSetDevice(d));
        cudaStream_t s;
        CK_CUDA(cudaStreamCreate(&s));
        int *dp;
        CK_CUDA(cudaMalloc((void **)&dp, sizeof(int)));
        void *args[] = {&dp};
        int cu = 0;
        ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, s, args, &cu), 0);
        int h = -1;
        CK_CUDA(cudaMemcpyAsync(&h, dp, sizeof h, cudaMemcpyDeviceToHost, s));
        CK_CUDA(cudaStreamSynchronize(s));
        CK_CUDA(cudaFree(dp));
        CK_CUDA(cudaStreamDestroy(s));
        res[d] = d ? out1 : out0;
        *res[d] = h;
    }
    CK_CUDA(cudaSetDevice(0));
}

START_TEST(swap_on_both_or_neither) {
    int n = 0;
    CK_CUDA(cudaGetDeviceCount(&n));
    ck_assert_int_ge(n, 2);
    char why[256];
    ck_assert_int_eq(hkb_driver_open(&real, why, sizeof why), 0);
    hkb_driver wrapped;
    ck_assert_int_eq(hkb_driver_open(&wrapped, why, sizeof why), 0);
    wrapped.FuncLoad = wrapped_func_load;

    hk_options o;
    hk_options_init(&o);
    int devs[2] = {0, 1};
    o.devices = devs;
    o.ndevices = 2;
    o.cache_dir = "";
    hk_runtime *rt;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, &wrapped, &rep), 0);
    /* Each slot holds its device's primary context, the one the runtime API uses. */
    for (int d = 0; d < 2; d++) {
        CK_CUDA(cudaSetDevice(d));
        CK_CUDA(cudaFree(0));
        CUcontext cur;
        real.CtxGetCurrent(&cur);
        ck_assert_ptr_eq(hk_runtime_context(rt, d), cur);
    }
    bad_ctx = hk_runtime_context(rt, 1);

    char s1[512], s2[512];
    src(s1, sizeof s1, 1);
    src(s2, sizeof s2, 2);
    ck_assert_int_eq(hk_swap(rt, "m", s1, strlen(s1), NULL, &rep), 0);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "m", "tag", &k), 0);
    int t0, t1;
    tags_on_both(k, &t0, &t1);
    ck_assert_int_eq(t0, 1);
    ck_assert_int_eq(t1, 1);

    fail_on_bad = 1;
    ck_assert_int_eq(hk_swap(rt, "m", s2, strlen(s2), NULL, &rep), HK_ERR_CUDA);
    printf("  refused on device 1: %s\n", rep.message);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_OUT_OF_MEMORY");
    ck_assert_uint_eq(hk_module_version(rt, "m"), 1);
    tags_on_both(k, &t0, &t1);
    ck_assert_int_eq(t0, 1); /* neither device moved */
    ck_assert_int_eq(t1, 1);

    fail_on_bad = 0;
    ck_assert_int_eq(hk_swap(rt, "m", s2, strlen(s2), NULL, &rep), 0);
    tags_on_both(k, &t0, &t1);
    ck_assert_int_eq(t0, 2);
    ck_assert_int_eq(t1, 2);
    ck_assert_int_eq(hk_reclaim_wait(rt, 10000), 0);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.live_versions, 1);
    ck_assert_uint_eq(st.refused, 1);
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);
    hkb_driver_close(&real);
}
END_TEST

int main(void) {
    if (!hkt_gpu_or_skip("gpu_multi"))
        return HKT_SKIP;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("SKIP gpu_multi: %d CUDA device(s); this suite needs 2\n", n);
        return HKT_SKIP;
    }
    Suite *s = suite_create("several devices (GPU)");
    TCase *tc = tcase_create("multi");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, swap_on_both_or_neither);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

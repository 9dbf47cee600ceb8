/*
 * GPU suite: canary runs on a real device. A program that uses the CUDA
 * runtime API keeps a live buffer that its kernel updates; versions that
 * fault (illegal address), never end (a spin loop) or compute something else
 * are pushed through hk_swap with a declared test launch. Each must be
 * refused by the canary with the live runtime's version, context and buffer
 * untouched: after every refusal the buffer holds exactly what the running
 * version has made of it, and the application's own CUDA calls still work.
 *
 * Memcheck is off here, so that each verdict is the plain helper's (the
 * CUresult of a fault, the launch timeout); tests/gpu_canary_perf.c runs
 * the same kinds under memcheck.
 *
 * SKIP without a device; one process, no fork (CUDA does not survive fork).
 * The helper is BUILD/bin/hotkern-canary.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/core.h"
#include "tests/canary_kernels.h"
#include "tests/gpu.h"
#include "tests/harness.h"

#define N 4096

static hk_runtime *rt;
static hk_kernel *step;
static float *live;     /* the application's buffer */
static float expect[N]; /* what it must hold */
static int launches;    /* of the running version on `live` */

/* Launches the running version on the live buffer and checks every element
 * is exactly what the running version makes of it. */
static void run_live_and_check(void) {
    int n = N;
    void *args[] = {&live, &n};
    int cu = 0;
    ck_assert_int_eq(
        hk_launch(step, (hk_dim3){N / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0, NULL, args, &cu), 0);
    CK_CUDA(cudaDeviceSynchronize());
    launches++;
    for (int i = 0; i < N; i++)
        expect[i] += 1.0f;
    static float got[N];
    CK_CUDA(cudaMemcpy(got, live, sizeof got, cudaMemcpyDeviceToHost));
    ck_assert_msg(!memcmp(got, expect, sizeof got), "live buffer changed after %d launches",
                  launches);
}

START_TEST(setup_live_program) {
    CK_CUDA(cudaSetDevice(0));
    CK_CUDA(cudaMalloc((void **)&live, N * sizeof(float)));
    for (int i = 0; i < N; i++)
        expect[i] = (float)i * 0.5f;
    CK_CUDA(cudaMemcpy(live, expect, sizeof expect, cudaMemcpyHostToDevice));
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = "";
    o.canary = 1;
    o.canary_helper = hkt_built_program("hotkern-canary");
    o.canary_timeout_ms = 2000;
    o.canary_sanitizer = -1; /* the plain helper's verdicts (memcheck: gpu_canary_perf) */
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_runtime_create(&rt, &o, &rep) == 0, "%s", rep.message);
    ck_assert_msg(hk_swap(rt, "m", GOOD, strlen(GOOD), NULL, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &step), 0);
    declare_step_test(step, N);
    run_live_and_check();
    hk_report_clear(&rep);
}
END_TEST

static void refused(const char *src, const char *says) {
    hk_report rep = HK_REPORT_INIT;
    int err = hk_swap(rt, "m", src, strlen(src), NULL, &rep);
    ck_assert_msg(err == HK_ERR_CANARY, "%s: %s", hk_strerror(err), rep.message);
    ck_assert_msg(strstr(rep.message, says), "%s", rep.message);
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    printf("refused as expected: %s\n", rep.message);
    CK_CUDA(cudaGetLastError());
    run_live_and_check();
    hk_report_clear(&rep);
}

START_TEST(faulting_kernel_refused) {
    refused(FAULTS, "CUDA_ERROR_ILLEGAL_ADDRESS");
}
END_TEST

START_TEST(endless_kernel_refused) {
    refused(ENDLESS, "did not finish within 2000 ms");
}
END_TEST

/* A trap and a failed assert: the test launch ran the trap guard's copy,
 * whose thread 7 stored its site and ended, so no imprecise error reached
 * the GPU: the helper's context is whole and the helper stays. */
START_TEST(trap_and_assert_refused_by_the_guard) {
    pid_t helper = hka_helper_pid(rt->canary);
    refused(TRAPS, "reached a trap instruction (__trap() or asm(\"trap;\")) (site 1 of 1");
    refused(ASSERTS, "reached a failed device-side assert()");
    ck_assert_int_eq(hka_helper_pid(rt->canary), helper);
}
END_TEST

START_TEST(wrong_output_refused) {
    refused(WRONG, "differs from version 1");
}
END_TEST

START_TEST(good_version_commits_after_refusals) {
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_swap(rt, "m", GOOD2, strlen(GOOD2), NULL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "1 launch passed (1 compared with version 1)"), "%s",
                  rep.canary);
    printf("committed: %s (canary %.1f ms)\n", rep.canary, rep.canary_ms);
    run_live_and_check();
    /* Traps and asserts the test never reaches: the guarded copy computes
     * what the version computes, and the version itself commits. */
    ck_assert_msg(hk_swap(rt, "m", GUARDED_GOOD, strlen(GUARDED_GOOD), NULL, &rep) == 0, "%s",
                  rep.message);
    ck_assert_msg(strstr(rep.canary, "1 launch passed (1 compared with version 2); 2 trap sites "
                                     "guarded"),
                  "%s", rep.canary);
    run_live_and_check();
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_int_eq(st.canary_refused, 5);
    ck_assert_int_eq(st.canary_refused_fault, 3);
    ck_assert_int_eq(st.canary_refused_hang, 1);
    ck_assert_int_eq(st.canary_refused_mismatch, 1);
    ck_assert_int_eq(st.canary_sanitizer, 0);
    hk_runtime_destroy(rt);
    CK_CUDA(cudaFree(live));
    hk_report_clear(&rep);
}
END_TEST

/* options.canary_device on the real driver: by the UUID the runtime API
 * gives device 0 (nvidia-smi -L's form), and by ordinal 1 where a second
 * GPU of the same architecture exists; a device that does not exist fails
 * create, saying so. */
START_TEST(canary_device_by_uuid) {
    struct cudaDeviceProp p;
    CK_CUDA(cudaGetDeviceProperties(&p, 0));
    const unsigned char *b = (const unsigned char *)p.uuid.bytes;
    char uuid[64];
    snprintf(uuid, sizeof uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
    int count = 0;
    CK_CUDA(cudaGetDeviceCount(&count));
    const char *names[2] = {uuid, NULL};
    if (count > 1) {
        struct cudaDeviceProp q;
        CK_CUDA(cudaGetDeviceProperties(&q, 1));
        if (q.major == p.major && q.minor == p.minor)
            names[1] = "1";
    }
    if (!names[1])
        printf("SKIP canary_device on a second GPU: %d device(s) of sm_%d%d\n", count, p.major,
               p.minor);
    hk_report rep = HK_REPORT_INIT;
    for (int i = 0; i < 2 && names[i]; i++) {
        hk_options o;
        hk_options_init(&o);
        o.cache_dir = "";
        o.canary = 1;
        o.canary_helper = hkt_built_program("hotkern-canary");
        o.canary_sanitizer = -1;
        o.canary_device = names[i];
        hk_runtime *r = NULL;
        ck_assert_msg(hk_runtime_create(&r, &o, &rep) == 0, "%s: %s", names[i], rep.message);
        ck_assert_msg(hk_swap(r, "m", GOOD, strlen(GOOD), NULL, &rep) == 0, "%s", rep.message);
        hk_kernel *k;
        ck_assert_int_eq(hk_kernel_get(r, "m", "step", &k), 0);
        declare_step_test(k, N);
        ck_assert_msg(hk_swap(r, "m", GOOD2, strlen(GOOD2), NULL, &rep) == 0, "%s", rep.message);
        ck_assert_msg(strstr(rep.canary, "1 launch passed (1 compared with version 1)"), "%s",
                      rep.canary);
        int err = hk_swap(r, "m", FAULTS, strlen(FAULTS), NULL, &rep);
        ck_assert_msg(err == HK_ERR_CANARY, "%s: %s", hk_strerror(err), rep.message);
        printf("canary_device %s: committed, then refused: %s\n", names[i], rep.message);
        hk_runtime_destroy(r);
    }
    hk_options o;
    hk_options_init(&o);
    o.canary = 1;
    o.canary_helper = hkt_built_program("hotkern-canary");
    o.canary_device = "99";
    hk_runtime *r = NULL;
    ck_assert_int_eq(hk_runtime_create(&r, &o, &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "options.canary_device '99': no such device"), "%s",
                  rep.message);
    hk_report_clear(&rep);
}
END_TEST

/* The canary runs a version with trap sites as its trap guard's copy, which
 * ptxas compiles apart from the image: tests/canary_kernels.h's heavy takes
 * 72 registers a thread as the image and 56 as the copy. A 1024-thread test
 * launch, which the copy passes and the image cannot make (896 threads a
 * block at most), refuses the version, naming the limit; the same kernel
 * bounded to 1024-thread blocks commits through the canary, and the
 * program's own 1024-thread launch of it then runs. */
START_TEST(image_that_cannot_launch_the_test_is_refused) {
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = "";
    o.canary = 1;
    o.canary_helper = hkt_built_program("hotkern-canary");
    o.canary_timeout_ms = 2000;
    o.canary_sanitizer = -1;
    hk_runtime *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_runtime_create(&r, &o, &rep) == 0, "%s", rep.message);
    ck_assert_msg(hk_swap(r, "heavy", HEAVY_FITS, strlen(HEAVY_FITS), NULL, &rep) == 0, "%s",
                  rep.message);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(r, "heavy", "heavy", &k), 0);
    int n = N;
    hk_test *t;
    ck_assert_int_eq(
        hk_test_create(&t, (hk_dim3){(unsigned)n / 1024, 1, 1}, (hk_dim3){1024, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_test_buffer(t, (size_t)n * sizeof(float), HK_FILL_IOTA_F32, 0, NULL), 0);
    ck_assert_int_eq(hk_test_buffer(t, (size_t)n * sizeof(float), HK_FILL_ZERO, 0, NULL), 0);
    ck_assert_int_eq(hk_test_scalar(t, &n, sizeof n), 0);
    /* The versions' sums agree; a tolerance in case ptxas orders them apart. */
    ck_assert_int_eq(hk_test_compare(t, HK_COMPARE_F32, 0, 1e-5), 0);
    ck_assert_msg(hk_kernel_add_test(k, t, &rep) == 0, "%s", rep.message);
    hk_test_destroy(t);

    int err = hk_swap(r, "heavy", HEAVY, strlen(HEAVY), NULL, &rep);
    ck_assert_msg(err == HK_ERR_CANARY, "%s: %s", hk_strerror(err), rep.message);
    ck_assert_msg(strstr(rep.message, "kernel 'heavy' test 1 launches blocks of 1024 threads") &&
                      strstr(rep.message, "registers a thread, so its blocks hold at most") &&
                      strstr(rep.message, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES");
    ck_assert_int_eq(hk_module_version(r, "heavy"), 1);
    printf("refused as expected: %s\n", rep.message);

    ck_assert_msg(hk_swap(r, "heavy", HEAVY_FITS2, strlen(HEAVY_FITS2), NULL, &rep) == 0, "%s",
                  rep.message);
    ck_assert_msg(strstr(rep.canary, "1 launch passed (1 compared with version 1)") &&
                      strstr(rep.canary, "46 trap sites guarded"),
                  "%s", rep.canary);
    ck_assert_int_eq(hk_module_version(r, "heavy"), 2);
    printf("committed: %s\n", rep.canary);
    float *in, *out;
    CK_CUDA(cudaMalloc((void **)&in, N * sizeof(float)));
    CK_CUDA(cudaMalloc((void **)&out, N * sizeof(float)));
    CK_CUDA(cudaMemset(in, 0, N * sizeof(float)));
    void *args[] = {&in, &out, &n};
    int cu = 0;
    ck_assert_int_eq(
        hk_launch(k, (hk_dim3){N / 1024, 1, 1}, (hk_dim3){1024, 1, 1}, 0, NULL, args, &cu), 0);
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaFree(in));
    CK_CUDA(cudaFree(out));
    hk_runtime_destroy(r);
    hk_report_clear(&rep);
}
END_TEST

int main(void) {
    if (!hkt_gpu_or_skip("gpu_canary"))
        return HKT_SKIP;
    Suite *s = suite_create("canary (GPU)");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, setup_live_program);
    tcase_add_test(tc, faulting_kernel_refused);
    tcase_add_test(tc, endless_kernel_refused);
    tcase_add_test(tc, trap_and_assert_refused_by_the_guard);
    tcase_add_test(tc, wrong_output_refused);
    tcase_add_test(tc, good_version_commits_after_refusals);
    tcase_add_test(tc, canary_device_by_uuid);
    tcase_add_test(tc, image_that_cannot_launch_the_test_is_refused);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

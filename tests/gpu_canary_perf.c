/*
 * GPU suite: the canary's perf guard and memcheck on a real device. A
 * program that uses the CUDA runtime API keeps a live 1 MiB buffer that
 * `step` adds 1.0f to; every version below is pushed through hk_swap with
 * the test launch of tests/canary_kernels.h over a buffer of the same size,
 * and after each the live buffer holds exactly what the committed versions
 * made of it.
 *
 *   - SLOW computes GOOD's outputs in milliseconds where GOOD takes
 *     microseconds: refused by the default policy (more than 4x and 1 ms
 *     slower) with both GPU times in the report, committed when the swap
 *     turns the guard off;
 *   - FAULTS (an illegal address) and OOB_WRITE (4 KiB past the buffer, in
 *     valid memory: a plain run ends with CUDA_SUCCESS) are refused by
 *     memcheck, with compute-sanitizer's first error line, when the
 *     toolkit's compute-sanitizer is found. Without it the suite says so
 *     (a SKIP line naming why) and checks what a plain canary does instead:
 *     FAULTS refused with CUDA_ERROR_ILLEGAL_ADDRESS, OOB_WRITE passed (a
 *     check callback then refuses it, so nothing that writes out of bounds
 *     is committed);
 *   - GOOD2 commits after them, timed against the slow running version.
 *
 * SKIP without a device; one process, no fork (CUDA does not survive fork).
 * The helper is BUILD/bin/hotkern-canary; compute-sanitizer is found as
 * hk_options.canary_sanitizer_path says (HK_COMPUTE_SANITIZER overrides).
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

#define N (1 << 18) /* 1 MiB of floats: OOB_WRITE's 4 KiB past it stays in valid memory */

static hk_runtime *rt;
static hk_kernel *step;
static float *live;     /* the application's buffer */
static float expect[N]; /* what it must hold */
static int memcheck;    /* the runtime's canary runs memcheck */
static char why_not[512];

/* Launches the running version on the live buffer and checks every element
 * is exactly what it makes of it (every version here adds 1.0f). */
static void run_live_and_check(void) {
    int n = N;
    void *args[] = {&live, &n};
    int cu = 0;
    ck_assert_int_eq(
        hk_launch(step, (hk_dim3){N / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0, NULL, args, &cu), 0);
    CK_CUDA(cudaDeviceSynchronize());
    for (int i = 0; i < N; i++)
        expect[i] += 1.0f;
    static float got[N];
    CK_CUDA(cudaMemcpy(got, live, sizeof got, cudaMemcpyDeviceToHost));
    ck_assert_msg(!memcmp(got, expect, sizeof got), "live buffer changed");
}

static int swap(const char *src, double slowdown_max, hk_check_cb check, hk_report *rep) {
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.canary_slowdown_max = slowdown_max;
    so.check = check;
    return hk_swap(rt, "m", src, strlen(src), &so, rep);
}

START_TEST(setup_live_program) {
    CK_CUDA(cudaSetDevice(0));
    CK_CUDA(cudaMalloc((void **)&live, N * sizeof(float)));
    for (int i = 0; i < N; i++)
        expect[i] = (float)(i % 1000) * 0.5f;
    CK_CUDA(cudaMemcpy(live, expect, sizeof expect, cudaMemcpyHostToDevice));
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = "";
    o.canary = 1;
    o.canary_helper = hkt_built_program("hotkern-canary");
    o.canary_timeout_ms = 2000;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_runtime_create(&rt, &o, &rep) == 0, "%s", rep.message);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    memcheck = st.canary_sanitizer == 1;
    snprintf(why_not, sizeof why_not, "%s", rep.message[0] ? rep.message : "no reason given");
    printf("memcheck: %s\n", memcheck ? "on (compute-sanitizer found)" : why_not);
    ck_assert_msg(hk_swap(rt, "m", GOOD, strlen(GOOD), NULL, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &step), 0);
    declare_step_test(step, N);
    run_live_and_check();
    hk_report_clear(&rep);
}
END_TEST

START_TEST(slower_version_refused_by_default) {
    hk_report rep = HK_REPORT_INIT;
    int err = swap(SLOW, 0, NULL, &rep);
    ck_assert_msg(err == HK_ERR_CANARY, "%s: %s / %s", hk_strerror(err), rep.message, rep.canary);
    ck_assert_str_eq(rep.canary_refusal, "slower");
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 is slower: "), "%s", rep.message);
    ck_assert_msg(strstr(rep.message, " ms on version 1 ("), "%s", rep.message);
    ck_assert_msg(rep.canary_new_ms > 4 * rep.canary_old_ms &&
                      rep.canary_new_ms > rep.canary_old_ms + 1,
                  "new %.3f ms, old %.3f ms", rep.canary_new_ms, rep.canary_old_ms);
    ck_assert_msg(rep.canary_old_ms > 0, "the running version was not timed");
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    printf("refused as expected: %s\n", rep.message);
    run_live_and_check();
    hk_report_clear(&rep);
}
END_TEST

START_TEST(slower_version_committed_with_the_guard_off) {
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(swap(SLOW, -1, NULL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "passed") && !strstr(rep.canary, "timed"), "%s", rep.canary);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    printf("committed with the guard off: %s\n", rep.canary);
    run_live_and_check(); /* the same outputs, slowly */
    hk_report_clear(&rep);
}
END_TEST

START_TEST(faulting_version_refused) {
    hk_report rep = HK_REPORT_INIT;
    int err = swap(FAULTS, 0, NULL, &rep);
    ck_assert_msg(err == HK_ERR_CANARY, "%s: %s", hk_strerror(err), rep.message);
    if (memcheck) {
        ck_assert_str_eq(rep.canary_refusal, "memcheck");
        ck_assert_msg(strstr(rep.message, "memcheck: Invalid __global__"), "%s", rep.message);
    } else {
        printf("SKIP faulting_version_refused under memcheck: %s\n", why_not);
        ck_assert_str_eq(rep.canary_refusal, "fault");
        ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_ILLEGAL_ADDRESS");
    }
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    printf("refused as expected: %s\n", rep.message);
    CK_CUDA(cudaGetLastError());
    run_live_and_check();
    hk_report_clear(&rep);
}
END_TEST

static int refuse_all(const char *module, uint64_t version, void *userdata, char *msg,
                      size_t msg_size) {
    snprintf(msg, msg_size, "the test refuses what the canary passed");
    return 1;
}

START_TEST(out_of_bounds_into_valid_memory) {
    hk_report rep = HK_REPORT_INIT;
    if (memcheck) {
        int err = swap(OOB_WRITE, 0, NULL, &rep);
        ck_assert_msg(err == HK_ERR_CANARY, "%s: %s", hk_strerror(err), rep.message);
        ck_assert_str_eq(rep.canary_refusal, "memcheck");
        /* Many threads' errors overflow the sanitizer's record buffer: it
         * then says so instead of naming the first. */
        ck_assert_msg(strstr(rep.message, "memcheck: Invalid __global__ write") ||
                          strstr(rep.message, "memcheck: errors, their records dropped (Warning: "
                                              "Error buffer overflow"),
                      "%s", rep.message);
        printf("refused as expected: %s\n", rep.message);
    } else {
        /* A plain run misses it: the canary passes the version, and the
         * check callback refuses it so that it never runs here. */
        printf("SKIP out_of_bounds_into_valid_memory under memcheck: %s\n", why_not);
        int err = swap(OOB_WRITE, 0, refuse_all, &rep);
        ck_assert_msg(err == HK_ERR_REJECTED, "%s: %s", hk_strerror(err), rep.message);
        ck_assert_msg(strstr(rep.canary, "1 launch passed"), "%s", rep.canary);
        printf("a plain canary passed it, as expected: %s\n", rep.canary);
    }
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    CK_CUDA(cudaGetLastError());
    run_live_and_check();
    hk_report_clear(&rep);
}
END_TEST

START_TEST(good_version_commits_timed_against_the_slow_one) {
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(swap(GOOD2, 0, NULL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "1 launch passed (1 compared with version 2)"), "%s",
                  rep.canary);
    ck_assert_msg(strstr(rep.canary, " ms on version 2"), "%s", rep.canary);
    ck_assert_msg(rep.canary_new_ms > 0 && rep.canary_new_ms < rep.canary_old_ms,
                  "new %.3f ms, old %.3f ms", rep.canary_new_ms, rep.canary_old_ms);
    if (memcheck)
        ck_assert_msg(strstr(rep.canary, "memcheck clean"), "%s", rep.canary);
    printf("committed: %s (canary %.1f ms)\n", rep.canary, rep.canary_ms);
    run_live_and_check();
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_int_eq(st.canary_refused_slower, 1);
    ck_assert_int_eq(st.canary_refused_memcheck, memcheck ? 2 : 0);
    ck_assert_int_eq(st.canary_refused_fault, memcheck ? 0 : 1);
    ck_assert_int_eq(st.canary_refused, memcheck ? 3 : 2);
    ck_assert_double_eq(st.canary_last_new_ms, rep.canary_new_ms);
    printf("canary: %llu runs, %.1f ms in all, helper starts %llu\n",
           (unsigned long long)st.canary_runs, st.canary_ms_total,
           (unsigned long long)st.canary_helper_starts);
    /* Under memcheck, what it caught ended the kernel alone and never
     * reached the plain helper, which served every run; the memcheck
     * helper was replaced after each of its two refusals. Without it, the
     * fault replaced the plain one once. */
    ck_assert_msg(st.canary_helper_starts == (memcheck ? 4u : 2u), "helper starts %llu",
                  (unsigned long long)st.canary_helper_starts);
    hk_runtime_destroy(rt);
    CK_CUDA(cudaFree(live));
    hk_report_clear(&rep);
}
END_TEST

int main(void) {
    if (!hkt_gpu_or_skip("gpu_canary_perf"))
        return HKT_SKIP;
    Suite *s = suite_create("canary perf guard and memcheck (GPU)");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, setup_live_program);
    tcase_add_test(tc, slower_version_refused_by_default);
    tcase_add_test(tc, slower_version_committed_with_the_guard_off);
    tcase_add_test(tc, faulting_version_refused);
    tcase_add_test(tc, out_of_bounds_into_valid_memory);
    tcase_add_test(tc, good_version_commits_timed_against_the_slow_one);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

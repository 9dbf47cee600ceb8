/*
 * Canary runs and their verdicts: a good kernel commits; a faulting,
 * trapping, hanging or wrong one is refused with its reason; the policy
 * (skip, none configured, a test that does not fit) decides what happens
 * without a run; a helper killed mid-run or dead between runs is replaced.
 */
#include "tests/canary/fixture.h"

/* ---- canary runs ------------------------------------------------------ */

START_TEST(good_kernel_committed) {
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_EXACT, 0);
    hk_report rep = HK_REPORT_INIT;
    /* Same outputs (tag 1), another image (an extra kernel). */
    ck_assert_msg(swap_tag(1, 1, HK_CANARY_REQUIRE, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    ck_assert_msg(strstr(rep.canary, "1 launch passed (1 compared with version 1)"), "%s",
                  rep.canary);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_int_eq(st.canary_runs, 1);
    ck_assert_int_eq(st.canary_refused, 0);
    ck_assert_int_eq(st.canary_helper_starts, 1);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(faulting_kernel_refused_with_cuname) {
    setenv("HKFAKE_FAULT", "step@7=CUDA_ERROR_ILLEGAL_ADDRESS", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    pid_t before = hka_helper_pid(rt->canary);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(7, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_ILLEGAL_ADDRESS");
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 faulted: CUDA_ERROR_ILLEGAL_ADDRESS"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "fault");
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    /* The poisoned helper was replaced, and the next version runs there. */
    pid_t after = hka_helper_pid(rt->canary);
    ck_assert_int_gt(after, 0);
    ck_assert_int_ne(after, before);
    ck_assert_int_eq(swap_tag(1, 1, HK_CANARY_REQUIRE, &rep), 0);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_stats st = stats();
    ck_assert_int_eq(st.canary_refused, 1);
    ck_assert_int_eq(st.canary_refused_fault, 1);
    ck_assert_int_eq(st.canary_helper_starts, 2);
    ck_assert_double_gt(st.canary_ms_total, 0);
    ck_assert_double_eq(metric("hotkern_canary_refused_total{kind=\"fault\"}"), 1);
    ck_assert_double_eq(metric("hotkern_canary_refused_total{kind=\"hang\"}"), 0);
    ck_assert_double_eq(metric("hotkern_canary_runs_total"), 2);
    ck_assert_double_eq(metric("hotkern_canary_helper_starts_total"), 2);
    hk_report_clear(&rep);
}
END_TEST

/* fake_ptx(tag) with `stmt` before step's ret: a trap the guard can see. */
static int swap_with(int tag, const char *stmt, hk_report *rep) {
    const char *p = fake_ptx(tag, 0, 0, 0);
    const char *ret = strstr(p, " ret;");
    ck_assert_ptr_nonnull(ret);
    char text[4096];
    snprintf(text, sizeof text, "%.*s %s\n%s", (int)(ret - p), p, stmt, ret);
    return hk_swap(rt, "m", text, strlen(text) + 1, NULL, rep);
}

/* A version that traps in its test launch: the canary ran its trap guard's
 * copy, in which the trap stored its site and ended the thread, so the
 * helper's context (the fake's "GPU") never saw a trap and the helper
 * stays. The same trap in a version with no trap instruction the guard
 * could see (the fake traps it all the same) ends the helper's context:
 * refused as before, and the helper replaced. */
START_TEST(trap_caught_by_the_guard_keeps_the_helper) {
    setenv("HKFAKE_TRAP", "step@5,step@6", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    pid_t before = hka_helper_pid(rt->canary);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_with(5, "@%p1 trap;", &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 reached a trap instruction") &&
                      strstr(rep.message, "(site 1 of 1 in its PTX)") &&
                      strstr(rep.message, "trap guard ended the thread"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "fault");
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    ck_assert_int_eq(hka_helper_pid(rt->canary), before); /* its context is whole */
    ck_assert_int_eq(stats().canary_helper_starts, 1);
    ck_assert_int_eq(stats().canary_refused_fault, 1);

    ck_assert_int_eq(swap_with(6, "mov.u32 %r1, 1;", &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "faulted: CUDA_ERROR_LAUNCH_FAILED"), "%s", rep.message);
    ck_assert_int_ne(hka_helper_pid(rt->canary), before);
    ck_assert_int_eq(stats().canary_helper_starts, 2);

    /* A guarded version that does not trap passes, says so, and what
     * commits is its own image, not the guard's copy. */
    ck_assert_msg(swap_with(7, "@%p1 trap;\n @%p2 trap;", &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "; 2 trap sites guarded"), "%s", rep.canary);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    uint64_t dptr = 0;
    size_t size = 0;
    ck_assert_int_eq(hk_module_global(rt, "m", "__hotkern_trap", 0, &dptr, &size),
                     HK_ERR_NOT_FOUND);
    hk_report_clear(&rep);
}
END_TEST

/* A version whose first test launch passes and whose timed repeats (the
 * perf guard's, on the buffers the launch left) reach a trap: the helper
 * reads the guard's code after each repeat too. */
START_TEST(trap_in_the_timed_repeats_is_caught) {
    setenv("HKFAKE_TRAP", "step@5=1", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    pid_t before = hka_helper_pid(rt->canary);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_with(5, "@%p1 trap;", &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 repeated to be timed reached a trap "
                                      "instruction"),
                  "%s", rep.message);
    ck_assert_int_eq(hka_helper_pid(rt->canary), before);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    hk_report_clear(&rep);
}
END_TEST

/* fake_ptx(tag) with a trap site before step's ret and `head` (the fake's
 * "// regs:" and "// ms:" lines, tests/fakecuda.h) in front. */
static int swap_guarded(int tag, const char *head, hk_report *rep) {
    const char *p = fake_ptx(tag, 0, 0, 0);
    const char *ret = strstr(p, " ret;");
    ck_assert_ptr_nonnull(ret);
    char text[4096];
    snprintf(text, sizeof text, "%s%.*s @%%p1 trap;\n%s", head, (int)(ret - p), p, ret);
    return hk_swap(rt, "m", text, strlen(text) + 1, NULL, rep);
}

/* The canary runs a version with trap sites as its trap guard's copy, which
 * ptxas compiles apart and may give fewer registers than the image that
 * commits (real NVRTC and nvJitLink: 56 against 72 for a kernel with an
 * assert()). A 1024-thread test that the copy launches and the image cannot
 * (72 registers: 896 threads a block at most) is refused, naming the limit;
 * the same kernel with registers that fit commits. */
START_TEST(resources_are_checked_on_the_image_that_commits) {
    rt = make_rt(NULL, 2000, 1);
    hk_report rep = HK_REPORT_INIT;
    const char *v1 = fake_ptx(1, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "m", v1, strlen(v1) + 1, NULL, &rep), 0);
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &k_step), 0);
    hk_test *t;
    unsigned n = 4;
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){1024, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_test_buffer(t, 16, HK_FILL_RANDOM, 7, NULL), 0);
    ck_assert_int_eq(hk_test_scalar(t, &n, sizeof n), 0);
    ck_assert_int_eq(hk_kernel_add_test(k_step, t, &rep), 0);
    hk_test_destroy(t);
    ck_assert_int_eq(swap_guarded(5, "// regs: 72\n// guarded regs: 56\n", &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 launches blocks of 1024 threads") &&
                      strstr(rep.message, "takes 72 registers a thread") &&
                      strstr(rep.message, "at most 896 threads") &&
                      strstr(rep.message, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "fault");
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES");
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    /* The image itself would have failed every such launch. */
    ck_assert_msg(swap_guarded(6, "// regs: 56\n// guarded regs: 40\n", &rep) == 0, "%s",
                  rep.message);
    ck_assert_msg(strstr(rep.canary, "1 launch passed") &&
                      strstr(rep.canary, "1 trap site guarded"),
                  "%s", rep.canary);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_report_clear(&rep);
}
END_TEST

/* The perf guard judges the image's times, not the copy's: an image 50 ms a
 * launch whose copy takes 0.010 ms is refused as slower, with the image's
 * time; a copy slower than a fast image does not refuse it. */
START_TEST(perf_guard_times_the_image_that_commits) {
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_guarded(5, "// ms: 50\n// guarded ms: 0.01\n", &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 is slower: 50.000 ms against 0.010 ms"),
                  "%s", rep.message);
    ck_assert_double_eq(rep.canary_new_ms, 50.0);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    ck_assert_msg(swap_guarded(6, "// ms: 0.01\n// guarded ms: 50\n", &rep) == 0, "%s",
                  rep.message);
    ck_assert_msg(strstr(rep.canary, "timed 0.010 ms against 0.010 ms on version 1"), "%s",
                  rep.canary);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(hanging_kernel_refused_and_helper_restarted) {
    setenv("HKFAKE_HANG", "step@8", 1);
    rt = make_rt(NULL, 300, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    pid_t before = hka_helper_pid(rt->canary);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(8, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "did not finish within 300 ms"), "%s", rep.message);
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_str_eq(rep.canary_refusal, "hang");
    ck_assert_int_eq(stats().canary_refused_hang, 1);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    pid_t after = hka_helper_pid(rt->canary);
    ck_assert_int_ne(after, before);
    ck_assert(!alive(before)); /* killed and reaped */
    ck_assert_int_eq(swap_tag(1, 1, HK_CANARY_OPTIONAL, &rep), 0);
    ck_assert_msg(strstr(rep.canary, "passed"), "%s", rep.canary);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(wrong_output_refused_on_compare) {
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_EXACT, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "buffer (argument 0) differs from version 1 at byte 0: "
                                      "0x02, running version 0x01"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "mismatch");
    ck_assert_int_eq(stats().canary_refused_mismatch, 1);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    hk_report_clear(&rep);
}
END_TEST

/* The fake's outputs read as floats: tags 1 and 2 are denormals 1.4e-45
 * apart, different bytes but well within a tolerance. */
START_TEST(float_tolerance_lets_close_outputs_through) {
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_F32, 1e-6);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(swap_tag(2, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(no_tests_committed_as_today) {
    rt = make_rt(NULL, 2000, 1);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(1, 0, HK_CANARY_REQUIRE, &rep), 0);
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_REQUIRE, &rep), 0);
    ck_assert_str_eq(rep.canary, "no canary tests");
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_int_eq(st.canary_runs, 0);
    ck_assert_int_eq(st.swaps, 2);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(skip_policy_commits_a_faulting_kernel) {
    setenv("HKFAKE_FAULT", "step@7", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(7, 0, HK_CANARY_SKIP, &rep), 0);
    ck_assert_str_eq(rep.canary, "skipped (policy)");
    hk_report_clear(&rep);
}
END_TEST

/* Tests declared on a runtime without a canary: optional lets the version
 * through saying so, required refuses it. */
START_TEST(no_canary_configured) {
    rt = make_rt(NULL, 2000, 0);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_int_eq(hka_helper_pid(rt->canary), 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_OPTIONAL, &rep), 0);
    ck_assert_msg(strstr(rep.canary, "not run: the runtime has no canary"), "%s", rep.canary);
    ck_assert_int_eq(swap_tag(3, 0, HK_CANARY_REQUIRE, &rep), HK_ERR_CANARY_UNAVAILABLE);
    ck_assert_int_eq(rep.error, HK_ERR_CANARY_UNAVAILABLE);
    ck_assert_msg(strstr(rep.message, "required but could not run"), "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "could_not_run");
    ck_assert_int_eq(stats().canary_refused_could_not_run, 1);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_report_clear(&rep);
}
END_TEST

/* A test whose arguments do not fit the kernel refuses the version. */
START_TEST(test_that_does_not_fit_refuses) {
    rt = make_rt(NULL, 2000, 1);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(1, 0, HK_CANARY_DEFAULT, &rep), 0);
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &k_step), 0);
    hk_test *t;
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){0, 1, 1}, (hk_dim3){1, 1, 1}, 0), HK_ERR_INVALID);
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_test_buffer(t, 8, HK_FILL_HOST, 0, NULL), HK_ERR_INVALID);
    ck_assert_int_eq(hk_test_buffer(t, (64u << 20) + 1, HK_FILL_ZERO, 0, NULL), HK_ERR_TOO_LARGE);
    ck_assert_int_eq(hk_test_buffer(t, 8, HK_FILL_ZERO, 0, NULL), 0); /* n missing */
    ck_assert_int_eq(hk_kernel_add_test(k_step, t, NULL), 0);
    for (int i = 1; i < 16; i++)
        ck_assert_int_eq(hk_kernel_add_test(k_step, t, NULL), 0);
    ck_assert_int_eq(hk_kernel_add_test(k_step, t, &rep), HK_ERR_TOO_LARGE);
    hk_test_destroy(t);
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_DEFAULT, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "the kernel takes 2 parameters, the test gives 1"), "%s",
                  rep.message);
    ck_assert_str_eq(rep.canary_refusal, "could_not_run");
    ck_assert_int_eq(hk_kernel_clear_tests(k_step), 0);
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_DEFAULT, &rep), 0);
    ck_assert_str_eq(rep.canary, "no canary tests");
    hk_report_clear(&rep);
}
END_TEST

static int refused_err;

static char refused_msg[512];

static void on_event(const hk_event *ev, void *ud) {
    if (ev->kind == HK_EVENT_REFUSED && ev->report) {
        refused_err = ev->report->error;
        snprintf(refused_msg, sizeof refused_msg, "%s", ev->report->message);
    }
}

/* hk_submit: the worker runs the canary; the refusal comes as an event. */
START_TEST(submitted_version_refused_by_worker) {
    setenv("HKFAKE_FAULT", "step@7=CUDA_ERROR_ASSERT", 1);
    fake_init(1, 90);
    setenv("HK_LIBCUDA", fake_lib, 1);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.no_warm_start = 1;
    o.canary = 1;
    o.canary_helper = hkt_built_program("hotkern-canary");
    o.on_event = on_event;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), 0);
    start_with_test(HK_COMPARE_NONE, 0);
    const char *p = fake_ptx(7, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "m", p, strlen(p) + 1, NULL), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 20000), 0);
    ck_assert_int_eq(refused_err, HK_ERR_CANARY);
    ck_assert_msg(strstr(refused_msg, "CUDA_ERROR_ASSERT"), "%s", refused_msg);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
}
END_TEST

static void *kill_later(void *arg) {
    usleep(1000 * 1000);
    kill((pid_t)(intptr_t)arg, SIGKILL);
    return NULL;
}

/* The helper dies while a launch runs (here: hangs): refused, restarted. */
START_TEST(helper_killed_mid_run) {
    setenv("HKFAKE_HANG", "step@8", 1);
    rt = make_rt(NULL, 20000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    pid_t victim = hka_helper_pid(rt->canary);
    pthread_t th;
    pthread_create(&th, NULL, kill_later, (void *)(intptr_t)victim);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(8, 0, HK_CANARY_REQUIRE, &rep), HK_ERR_CANARY);
    pthread_join(th, NULL);
    ck_assert_msg(strstr(rep.message, "died"), "%s", rep.message);
    ck_assert_msg(strstr(rep.message, "signal 9"), "%s", rep.message);
    ck_assert_int_ne(hka_helper_pid(rt->canary), victim);
    ck_assert_int_eq(swap_tag(1, 1, HK_CANARY_REQUIRE, &rep), 0);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(helper_dead_between_runs_is_replaced) {
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_EXACT, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(1, 1, HK_CANARY_REQUIRE, &rep), 0);
    pid_t victim = hka_helper_pid(rt->canary);
    kill(victim, SIGKILL);
    usleep(100 * 1000);
    ck_assert_int_eq(swap_tag(1, 0, HK_CANARY_REQUIRE, &rep), 0);
    ck_assert_msg(strstr(rep.canary, "passed"), "%s", rep.canary);
    ck_assert_int_ne(hka_helper_pid(rt->canary), victim);
    hk_report_clear(&rep);
}
END_TEST

void canary_runs_tests(TCase *tc) {
    tcase_add_test(tc, good_kernel_committed);
    tcase_add_test(tc, faulting_kernel_refused_with_cuname);
    tcase_add_test(tc, hanging_kernel_refused_and_helper_restarted);
    tcase_add_test(tc, trap_caught_by_the_guard_keeps_the_helper);
    tcase_add_test(tc, resources_are_checked_on_the_image_that_commits);
    tcase_add_test(tc, perf_guard_times_the_image_that_commits);
    tcase_add_test(tc, trap_in_the_timed_repeats_is_caught);
    tcase_add_test(tc, wrong_output_refused_on_compare);
    tcase_add_test(tc, float_tolerance_lets_close_outputs_through);
    tcase_add_test(tc, no_tests_committed_as_today);
    tcase_add_test(tc, skip_policy_commits_a_faulting_kernel);
    tcase_add_test(tc, no_canary_configured);
    tcase_add_test(tc, test_that_does_not_fit_refuses);
    tcase_add_test(tc, submitted_version_refused_by_worker);
    tcase_add_test(tc, helper_killed_mid_run);
    tcase_add_test(tc, helper_dead_between_runs_is_replaced);
}

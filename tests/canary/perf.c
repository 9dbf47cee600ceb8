/*
 * The perf guard: a slower version is refused with both times; the ratio
 * and the floor decide together; the runtime's policy sets the limits and
 * a swap's overrides it; a first version has nothing to compare with.
 */
#include "tests/canary/fixture.h"

/* ---- the perf guard ---------------------------------------------------- */

/* The fake's GPU time is a counter the controls set (HKFAKE_SLOW, in ms):
 * every figure below is exact, whatever the machine's load. A launch
 * without a control takes 0.010 ms. The tests do not compare outputs, so
 * versions of other tags may pass; the perf guard still runs the running
 * version (tag 1) on the same inputs to time it. */

static int swap_opts(int tag, const hk_swap_options *so, hk_report *rep) {
    const char *p = fake_ptx(tag, 0, 0, 0);
    return hk_swap(rt, "m", p, strlen(p) + 1, so, rep);
}

START_TEST(slower_version_refused_with_both_times) {
    setenv("HKFAKE_SLOW", "step@9=50", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(9, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 is slower: 50.000 ms against 0.010 ms "
                                      "on version 1 (5000.0x; refused beyond 4x and 1 ms)"),
                  "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "refused: kernel 'step' test 1 is slower"), "%s", rep.canary);
    ck_assert_str_eq(rep.canary_refusal, "slower");
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_double_eq(rep.canary_new_ms, 50.0);
    ck_assert_double_eq(rep.canary_old_ms, 0.010);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    hk_stats st = stats();
    ck_assert_int_eq(st.canary_refused, 1);
    ck_assert_int_eq(st.canary_refused_slower, 1);
    ck_assert_double_eq(st.canary_last_new_ms, 50.0);
    ck_assert_double_eq(st.canary_last_old_ms, 0.010);
    ck_assert_double_eq(metric("hotkern_canary_refused_total{kind=\"slower\"}"), 1);
    ck_assert_double_eq(metric("hotkern_canary_last_new_seconds"), 0.05);
    ck_assert_double_eq(metric("hotkern_canary_last_running_seconds"), 0.00001);
    /* The same version as fast as the running one goes in, its times said. */
    ck_assert_msg(swap_tag(2, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(
        strstr(rep.canary, "1 launch passed; timed 0.010 ms against 0.010 ms on version 1"), "%s",
        rep.canary);
    ck_assert_str_eq(rep.canary_refusal, "");
    ck_assert_double_eq(rep.canary_new_ms, 0.010);
    hk_report_clear(&rep);
}
END_TEST

/* Refused only when both limits are passed: 3x and 4 ms slower passes, 5x
 * and 8 ms slower does not; 50x but 0.49 ms slower passes; faster passes. */
START_TEST(ratio_and_floor_decide_together) {
    setenv("HKFAKE_SLOW", "step@1=2,step@9=6,step@10=10,step@11=0.5,step@12=0.5", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(10, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "10.000 ms against 2.000 ms on version 1 (5.0x"), "%s",
                  rep.message);
    ck_assert_msg(swap_tag(9, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "timed 6.000 ms against 2.000 ms on version 1"), "%s",
                  rep.canary);
    ck_assert_msg(swap_tag(11, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "timed 0.500 ms against 6.000 ms on version 2"), "%s",
                  rep.canary);
    ck_assert_int_eq(hk_module_version(rt, "m"), 3);
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);
    /* From 0.010 ms to 0.5 ms: 50 times slower, but by less than 1 ms. */
    setenv("HKFAKE_SLOW", "step@12=0.5", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_msg(swap_tag(12, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "timed 0.500 ms against 0.010 ms on version 1"), "%s",
                  rep.canary);
    hk_report_clear(&rep);
}
END_TEST

/* The runtime's policy: 2x with no floor refuses 0.05 ms against 0.01. */
START_TEST(runtime_policy_sets_the_limits) {
    setenv("HKFAKE_SLOW", "step@12=0.05,step@13=0.015", 1);
    hk_options o;
    rt_options(&o, NULL, 2000, 1);
    o.canary_slowdown_max = 2;
    o.canary_slowdown_min_ms = -1;
    hk_report rep = HK_REPORT_INIT;
    rt = create(&o, &rep);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_int_eq(swap_tag(12, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "0.050 ms against 0.010 ms on version 1 (5.0x; refused "
                                      "beyond 2x and 0 ms)"),
                  "%s", rep.message);
    ck_assert_msg(swap_tag(13, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message); /* 1.5x */
    hk_report_clear(&rep);
    /* Options that are not numbers are refused. */
    hk_runtime *bad = NULL;
    o.canary_slowdown_max = NAN;
    ck_assert_int_eq(hkl_runtime_create_with(&bad, &o, fake_driver(), &rep), HK_ERR_INVALID);
    ck_assert_ptr_null(bad);
    o.canary_slowdown_max = 0;
    o.canary_sanitizer = 2;
    ck_assert_int_eq(hkl_runtime_create_with(&bad, &o, fake_driver(), &rep), HK_ERR_INVALID);
    hk_report_clear(&rep);
}
END_TEST

/* A swap's fields override the runtime's: off for one swap, a floor of
 * its own, or on where the runtime's guard is off. */
START_TEST(swap_policy_overrides_the_runtime) {
    setenv("HKFAKE_SLOW", "step@9=50", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.canary_slowdown_min_ms = 100; /* 50 ms slower is within it */
    ck_assert_msg(swap_opts(9, &so, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "timed 50.000 ms against 0.010 ms"), "%s", rep.canary);
    hk_swap_options_init(&so);
    so.canary_slowdown_max = -1; /* off: not even timed */
    ck_assert_msg(swap_opts(1, &so, &rep) == 0, "%s", rep.message);
    ck_assert_msg(swap_opts(9, &so, &rep) == 0, "%s", rep.message);
    ck_assert_msg(!strstr(rep.canary, "timed"), "%s", rep.canary);
    ck_assert_double_eq(rep.canary_new_ms, 0);
    so.canary_slowdown_max = NAN;
    ck_assert_int_eq(swap_opts(1, &so, &rep), HK_ERR_INVALID);
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);

    hk_options o;
    rt_options(&o, NULL, 2000, 1);
    o.canary_slowdown_max = -1; /* the runtime's guard is off */
    rt = create(&o, &rep);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_msg(swap_tag(9, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(!strstr(rep.canary, "timed"), "%s", rep.canary);
    ck_assert_double_eq(stats().canary_last_new_ms, 0);
    hk_swap_options_init(&so);
    so.canary_slowdown_max = 4; /* on for this swap: 50 ms against 0.010 */
    ck_assert_msg(swap_opts(1, &so, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(swap_opts(9, &so, &rep), HK_ERR_CANARY);
    ck_assert_str_eq(rep.canary_refusal, "slower");
    hk_report_clear(&rep);
}
END_TEST

/* Without a running version there is nothing to compare with: the new
 * version is timed and said so, and never refused as slower. (The engine
 * always has one once tests can be declared; the canary is driven here
 * directly, as hkl_canary_check would with no version running.) */
START_TEST(first_version_has_nothing_to_compare_with) {
    setenv("HKFAKE_SLOW", "step@9=500", 1);
    setenv("HK_LIBCUDA", fake_lib, 1);
    hka_config cfg = {
        .helper = hkt_built_program("hotkern-canary"), .timeout_ms = 2000, .start = 1};
    hka_canary *c = NULL;
    char why[256];
    ck_assert_msg(hka_create(&c, &cfg, why, sizeof why) == 0, "%s", why);
    hk_test *t;
    unsigned n = 4;
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){32, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_test_buffer(t, 16, HK_FILL_ZERO, 0, NULL), 0);
    ck_assert_int_eq(hk_test_scalar(t, &n, sizeof n), 0);
    ck_assert_int_eq(hka_add_test(c, "m", "step", t, NULL), 0);
    hk_test_destroy(t);
    const char *p = fake_ptx(9, 0, 0, 0);
    hka_image img = {.data = p, .size = strlen(p) + 1, .format = HK_FORMAT_PTX};
    hka_policy pol = {.canary = HK_CANARY_OPTIONAL, .slowdown_max = 4, .slowdown_min_ms = 1};
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hka_run(c, "m", &img, NULL, &pol, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "1 launch passed; timed 500.000 ms (first version: nothing to "
                                     "compare)"),
                  "%s", rep.canary);
    ck_assert_double_eq(rep.canary_new_ms, 500);
    ck_assert_double_eq(rep.canary_old_ms, 0);
    hka_counters k;
    hka_counts(c, &k);
    ck_assert_int_eq(k.runs, 1);
    ck_assert_int_eq(k.refused, 0);
    ck_assert_double_eq(k.last_new_ms, 500);
    hka_destroy(c);
}
END_TEST

void canary_perf_tests(TCase *tc) {
    tcase_add_test(tc, slower_version_refused_with_both_times);
    tcase_add_test(tc, ratio_and_floor_decide_together);
    tcase_add_test(tc, runtime_policy_sets_the_limits);
    tcase_add_test(tc, swap_policy_overrides_the_runtime);
    tcase_add_test(tc, first_version_has_nothing_to_compare_with);
}

/*
 * Submissions and graphs: graphs retargeted on commit (old code kept when
 * that fails), an older submission never overriding a newer one, safe
 * points, and automatic staging with and without them.
 */
#include "tests/engine/fixture.h"

/* ---- graphs, devices, async -------------------------------------------- */

/* Out of a registered fake graph's kernel; the node's arguments point here. */
static int g_out, *g_dp;

static unsigned g_n;

static void *g_args[2];

/* Registers a fake graph whose one node launches k's current version (made in
 * the runtime's context, current on this thread until the test resets it).
 * Returns the function the node was created with. */
static void *graph_register(hk_kernel *k, CUgraphExec *exec) {
    void *f;
    CUgraphNode node;
    fake_driver()->CtxSetCurrent((CUcontext)hk_runtime_context(rt, 0));
    ck_assert_int_eq(hk_kernel_function(k, &f), 0);
    g_out = 0;
    g_dp = &g_out;
    g_n = 1;
    g_args[0] = &g_dp;
    g_args[1] = &g_n;
    fake_graph_create((CUfunction)f, g_args, exec, &node);
    ck_assert_int_eq(hk_graph_register(rt, *exec, node, k), 0);
    return f;
}

START_TEST(graph_retargeted_on_commit) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    CUgraphExec exec;
    ck_assert_int_eq(fake_tag_of(graph_register(k, &exec)), 1);
    ck_assert_int_eq(hk_graph_launch(rt, exec, NULL, NULL), 0);
    ck_assert_int_eq(g_out, 1);
    swap_ok("sim", ptx(2, 0, 0, 0), &rep);
    ck_assert_int_eq(fake_tag_of(fake_graph_func(exec)), 2);
    ck_assert_int_eq(hk_graph_launch(rt, exec, NULL, NULL), 0);
    ck_assert_int_eq(g_out, 2);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(hk_graph_launch(rt, exec, NULL, NULL), 0); /* no dead code reached */
    ck_assert_int_eq(hk_graph_unregister(rt, exec), 0);
    ck_assert_int_eq(hk_graph_unregister(rt, exec), HK_ERR_NOT_FOUND);
    swap_ok("sim", ptx(3, 0, 0, 0), &rep);
    ck_assert_int_eq(fake_tag_of(fake_graph_func(exec)), 2);
    fake_driver()->CtxSetCurrent(NULL);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(graph_keeps_old_code_when_retarget_fails) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    CUgraphExec exec;
    graph_register(k, &exec);
    fake_fail("cuGraphExecKernelNodeSetParams", 1, CUDA_ERROR_INVALID_VALUE);
    swap_ok("sim", ptx(2, 0, 0, 0), &rep); /* the commit stands... */
    ck_assert_msg(strstr(rep.message, "still runs version 1"), "%s", rep.message);
    /* ...but version 1 stays loaded for the graph that still runs it. */
    ck_assert_int_eq(hk_reclaim_wait(rt, 200), HK_ERR_TIMEOUT);
    ck_assert_int_eq(hk_graph_launch(rt, exec, NULL, NULL), 0);
    ck_assert_int_eq(g_out, 1);
    ck_assert_int_eq(launch_tag(k), 2);
    swap_ok("sim", ptx(3, 0, 0, 0), &rep); /* retargeted: version 1 is let go */
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    ck_assert_int_eq(hk_graph_launch(rt, exec, NULL, NULL), 0);
    ck_assert_int_eq(g_out, 3);
    ck_assert_int_eq(hk_graph_unregister(rt, exec), 0);
    fake_driver()->CtxSetCurrent(NULL);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(older_submission_never_overrides_newer) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(hk_safe_point(rt), 0);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_AT_SAFE_POINT;
    const char *v2 = ptx(2, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "sim", v2, strlen(v2), &so), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 5000), 0); /* built, waiting for a safe point */
    swap_ok("sim", ptx(3, 0, 0, 0), &rep);       /* submitted later, staged at once */
    ck_assert_int_eq(hk_safe_point(rt), 0);      /* the older one is refused */
    ck_assert_int_eq(launch_tag(k), 3);
    ck_assert_int_eq(events[HK_EVENT_REFUSED], 1);
    ck_assert_msg(strstr(last_event_msg, "submitted later"), "%s", last_event_msg);
    ck_assert_str_eq(hk_strerror(HK_ERR_SUPERSEDED), "a newer version was committed first");
    hk_report_clear(&rep);
}
END_TEST

START_TEST(submit_and_safe_point) {
    const char *a = ptx(1, 0, 0, 0), *b = ptx(2, 0, 0, 0), *c = ptx(3, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "sim", a, strlen(a), NULL), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 5000), 0);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_AT_SAFE_POINT;
    ck_assert_int_eq(hk_submit(rt, "sim", b, strlen(b), &so), 0);
    ck_assert_int_eq(hk_submit(rt, "sim", c, strlen(c), &so), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 5000), 0);
    int loads = fake_calls("cuLibraryLoadData");
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1); /* nothing touched the driver yet */
    ck_assert_int_eq(hk_safe_point(rt), 1);             /* the newer one replaced the older */
    ck_assert_int_eq(fake_calls("cuLibraryLoadData"), loads + 1);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(launch_tag(k), 3);
    /* The replaced version is unloaded at the next safe point, not before. */
    ck_assert_int_eq(hk_reclaim_wait(rt, 200), HK_ERR_TIMEOUT);
    ck_assert_int_eq(fake_live_images(), 2);
    ck_assert_int_eq(hk_safe_point(rt), 0);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    /* A refused submission is reported through the event. */
    ck_assert_int_eq(hk_submit(rt, "sim", "garbage\x01\x02", 9, NULL), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 5000), 0);
    ck_assert_int_eq(events[HK_EVENT_REFUSED], 1);
}
END_TEST

static int swap_thread_result;

static uint64_t swap_thread_version;

static const char *swap_thread_src;

static void *swap_thread(void *arg) {
    (void)arg;
    hk_report rep = HK_REPORT_INIT;
    swap_thread_result = hk_swap(rt, "sim", swap_thread_src, strlen(swap_thread_src), NULL, &rep);
    swap_thread_version = rep.version;
    hk_report_clear(&rep);
    return NULL;
}

START_TEST(auto_stage_follows_safe_points) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep); /* no safe point yet: staged at once */
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(hk_safe_point(rt), 0); /* this thread now runs the program's frames */
    /* From this thread, AUTO stages at once (waiting would wait for itself)... */
    swap_ok("sim", ptx(2, 0, 0, 0), &rep);
    ck_assert_int_eq(launch_tag(k), 2);
    /* ...and an explicit safe-point hk_swap from it is refused. */
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_AT_SAFE_POINT;
    const char *x = ptx(9, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "sim", x, strlen(x), &so, &rep), HK_ERR_INVALID);
    /* From another thread, hk_swap waits for this thread's next safe point. */
    int loads = fake_calls("cuLibraryLoadData");
    swap_thread_src = ptx(3, 0, 0, 0);
    pthread_t t;
    pthread_create(&t, NULL, swap_thread, NULL);
    usleep(200000);
    ck_assert_int_eq(fake_calls("cuLibraryLoadData"), loads); /* nothing staged yet */
    ck_assert_int_eq(launch_tag(k), 2);
    int committed = 0;
    for (int i = 0; i < 200 && !committed; i++) {
        committed = hk_safe_point(rt);
        usleep(1000);
    }
    pthread_join(t, NULL);
    ck_assert_int_eq(committed, 1);
    ck_assert_int_eq(swap_thread_result, 0);
    ck_assert_uint_eq(swap_thread_version, 3);
    ck_assert_int_eq(launch_tag(k), 3);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(auto_stage_falls_back_without_safe_points) {
    hk_runtime_destroy(rt);
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.safe_point_wait_ms = 100;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), NULL), 0);
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    ck_assert_int_eq(hk_safe_point(rt), 0); /* frames once... then they stop */
    swap_thread_src = ptx(2, 0, 0, 0);
    pthread_t t;
    double t0 = hkl_now_ms();
    pthread_create(&t, NULL, swap_thread, NULL);
    pthread_join(t, NULL);
    double waited = hkl_now_ms() - t0;
    ck_assert_int_eq(swap_thread_result, 0); /* staged at once after the wait */
    ck_assert_uint_eq(swap_thread_version, 2);
    ck_assert_msg(waited >= 90, "did not wait for a safe point (%.0f ms)", waited);
    ck_assert_int_eq(hk_safe_point(rt), 0); /* nothing left behind */
    hk_report_clear(&rep);
}
END_TEST

void engine_submit_tests(TCase *tc) {
    tcase_add_test(tc, graph_retargeted_on_commit);
    tcase_add_test(tc, graph_keeps_old_code_when_retarget_fails);
    tcase_add_test(tc, older_submission_never_overrides_newer);
    tcase_add_test(tc, submit_and_safe_point);
    tcase_add_test(tc, auto_stage_follows_safe_points);
    tcase_add_test(tc, auto_stage_falls_back_without_safe_points);
}

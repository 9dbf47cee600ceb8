/*
 * Faults and resets: each driver call failing in turn leaves the running
 * version and no leak (one table, a loop test an entry point); a launch's
 * error returned; context resets with either loader, name expressions kept
 * over one; the module loader on one device; two devices all or nothing.
 */
#include "tests/engine/fixture.h"

/* Waits (5 s at most) until hotkern has handled n context resets. */
static void wait_resets(uint64_t n) {
    hk_stats st = HK_STATS_INIT;
    for (int i = 0; i < 500; i++) {
        hk_stats_get(rt, &st);
        if (st.context_resets >= n)
            return;
        usleep(10 * 1000);
    }
    ck_abort_msg("reset not handled within 5 s");
}

/* ---- fault injection ---------------------------------------------------- */

/* The driver entry points a swap calls, each failed in turn: its 1st, 2nd
 * and 3rd call. */
static const char *const fault_entries[] = {
    "cuLibraryLoadData", "cuLibraryGetKernel",   "cuKernelGetFunction",
    "cuFuncLoad",        "cuKernelGetParamInfo", "cuLibraryGetGlobal",
    "cuMemcpyDtoDAsync", "cuStreamSynchronize",  "cuCtxPushCurrent"};

/* One entry point of fault_entries a run (tcase_add_loop_test). */
START_TEST(each_driver_failure_is_clean) {
    const size_t e = (size_t)_i;
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 1, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    int tag = 1;
    for (int nth = 1; nth <= 3; nth++) {
        fake_clear_faults();
        fake_fail(fault_entries[e], nth, CUDA_ERROR_OUT_OF_MEMORY);
        int err = swap_src("sim", ptx(100 + (int)e * 10 + nth, 1, 1, 0), &rep);
        fake_clear_faults();
        if (err == 0) {
            tag = 100 + (int)e * 10 + nth; /* the fault hit a call the swap did not need */
        } else {
            ck_assert_msg(err == HK_ERR_CUDA || err == HK_ERR_MISSING_KERNEL ||
                              err == HK_ERR_LAYOUT,
                          "%s #%d: %s", fault_entries[e], nth, hk_strerror(err));
            ck_assert_msg(rep.cu_name[0] || err == HK_ERR_LAYOUT, "%s #%d: no CUresult name",
                          fault_entries[e], nth);
        }
        ck_assert_int_eq(launch_tag(k), tag);
        ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
        ck_assert_msg(fake_live_images() == 1, "%s #%d leaked: %d live", fault_entries[e], nth,
                      fake_live_images());
    }
    hk_report_clear(&rep);
}
END_TEST

START_TEST(launch_error_is_returned) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    fake_fail("cuLaunchKernel", 1, CUDA_ERROR_LAUNCH_FAILED);
    int cu = 0;
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, NULL, &cu),
                     HK_ERR_CUDA);
    ck_assert_int_eq(cu, CUDA_ERROR_LAUNCH_FAILED);
    ck_assert_int_eq(launch_tag(k), 1);
    hk_report_clear(&rep);
}
END_TEST

/* ---- context reset ------------------------------------------------------ */

START_TEST(reset_with_library_loader) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    void *ctx_before = hk_runtime_context(rt, 0);
    unsigned long long id_before = rt->dev[0].ctx_id;
    fake_reset_device(0);
    ck_assert_int_eq(launch_tag(k), 1); /* libraries survive a reset */
    /* The next swap notices the reset and reattaches. */
    swap_ok("sim", ptx(2, 0, 0, 0), &rep);
    ck_assert_int_eq(launch_tag(k), 2);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.context_resets, 1);
    ck_assert_int_eq(events[HK_EVENT_CONTEXT_RESET], 1);
    ck_assert_ptr_eq(hk_runtime_context(rt, 0), ctx_before); /* same primary context object */
    ck_assert_uint_ne(rt->dev[0].ctx_id, id_before);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(reset_with_module_loader) {
    hk_runtime_destroy(rt);
    rt = make_rt(1, HK_LOADER_MODULE);
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(7, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(launch_tag(k), 7);
    fake_reset_device(0);
    /* The module died: the launch fails at once, and hotkern's own thread
     * (never the launching one) reloads it. */
    int out = 0, *dptr = &out, cu = 0;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu),
                     HK_ERR_CUDA);
    ck_assert_int_eq(cu, CUDA_ERROR_INVALID_HANDLE);
    wait_resets(1);
    ck_assert_int_eq(launch_tag(k), 7);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    ck_assert_int_eq(events[HK_EVENT_CONTEXT_RESET], 1);
    ck_assert_msg(!pthread_equal(reset_event_thread, pthread_self()),
                  "the reset event ran on the launching thread");
    swap_ok("sim", ptx(8, 0, 0, 0), &rep);
    ck_assert_int_eq(launch_tag(k), 8);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(reset_keeps_name_expressions) {
    /* Real NVRTC output (PTX, handed to the fake) with a template kernel
     * taken by its name expression. */
    hk_runtime_destroy(rt);
    rt = make_rt(1, HK_LOADER_MODULE);
    const char *src = "template <typename T> __global__ void scale(T *x) { x[0] *= 2; }\n";
    const char *exprs[] = {"scale<int>"};
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.name_expressions = exprs;
    so.nname_expressions = 1;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_swap(rt, "t", src, strlen(src), &so, &rep) == 0, "%s", rep.message);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "t", "scale<int>", &k), 0);
    int x = 3, *xp = &x;
    void *args[] = {&xp};
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL), 0);
    fake_reset_device(0);
    int cu = 0;
    hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu); /* may fail once */
    wait_resets(1);
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu), 0);
    ck_assert_int_eq(events[HK_EVENT_CONTEXT_RESET], 1);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.live_versions, 1);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(module_loader_single_device) {
    hk_runtime_destroy(rt);
    rt = NULL;
    fake_init(2, 90);
    hk_options o;
    hk_options_init(&o);
    int devs[2] = {0, 1};
    o.devices = devs;
    o.ndevices = 2;
    o.loader = HK_LOADER_MODULE;
    hk_runtime *r;
    ck_assert_int_eq(hkl_runtime_create_with(&r, &o, fake_driver(), NULL), HK_ERR_UNSUPPORTED);
    rt = make_rt(1, HK_LOADER_LIBRARY);
}
END_TEST

START_TEST(two_devices_all_or_nothing) {
    hk_runtime_destroy(rt);
    rt = make_rt(2, HK_LOADER_LIBRARY);
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    int loads_before = fake_calls("cuFuncLoad");
    /* Uploading to the second device fails: the swap is refused for both. */
    fake_fail_on_device("cuFuncLoad", 1, CUDA_ERROR_OUT_OF_MEMORY);
    ck_assert_int_eq(swap_src("sim", ptx(2, 0, 0, 0), &rep), HK_ERR_CUDA);
    ck_assert_int_gt(fake_calls("cuFuncLoad"), loads_before);
    fake_clear_faults();
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    ck_assert_int_eq(launch_tag(k), 1);
    swap_ok("sim", ptx(3, 0, 0, 0), &rep);
    ck_assert_int_eq(launch_tag(k), 3);
    hk_report_clear(&rep);
}
END_TEST

void engine_faults_tests(TCase *tc) {
    tcase_add_loop_test(tc, each_driver_failure_is_clean, 0,
                        (int)(sizeof fault_entries / sizeof fault_entries[0]));
    tcase_add_test(tc, launch_error_is_returned);
    tcase_add_test(tc, reset_with_library_loader);
    tcase_add_test(tc, reset_with_module_loader);
    tcase_add_test(tc, reset_keeps_name_expressions);
    tcase_add_test(tc, module_loader_single_device);
    tcase_add_test(tc, two_devices_all_or_nothing);
}

/*
 * Versions and their checks: no driver reported, distinct error strings,
 * argument checks, load, launch, swap and reclaim; refusals that keep the
 * old version, layout changes, the check callback, globals carried over,
 * rollback, the bounded history, and the same image not reloaded.
 */
#include "tests/engine/fixture.h"

/* ---- basics ------------------------------------------------------------- */

START_TEST(no_driver_is_reported) {
    setenv("HK_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    hk_runtime *r = (hk_runtime *)1;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_runtime_create(&r, NULL, &rep), HK_ERR_NO_DRIVER);
    ck_assert_ptr_null(r);
    ck_assert_int_eq(rep.error, HK_ERR_NO_DRIVER);
    ck_assert_msg(strstr(rep.message, "no CUDA driver"), "message: %s", rep.message);
    /* The toolkit's stub library loads but cannot initialise: cuInit's error
     * is named. */
    if (access("/usr/local/cuda/lib64/stubs/libcuda.so", R_OK) == 0) {
        setenv("HK_LIBCUDA", "/usr/local/cuda/lib64/stubs/libcuda.so", 1);
        hk_report_clear(&rep);
        ck_assert_int_eq(hk_runtime_create(&r, NULL, &rep), HK_ERR_NO_DRIVER);
        ck_assert_msg(strstr(rep.message, "CUDA_ERROR") || strstr(rep.message, "lacks"),
                      "message: %s", rep.message);
    }
    unsetenv("HK_LIBCUDA");
    hk_report_clear(&rep);
}
END_TEST

START_TEST(error_strings_are_distinct) {
    for (int a = 0; a >= HK_ERR_ATTRIBUTE; a--) {
        ck_assert_str_ne(hk_strerror(a), "unknown error");
        for (int b = a - 1; b >= HK_ERR_ATTRIBUTE; b--)
            ck_assert_str_ne(hk_strerror(a), hk_strerror(b));
    }
    ck_assert_str_eq(hk_strerror(-9999), "unknown error");
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", HK_VERSION_MAJOR, HK_VERSION_MINOR, HK_VERSION_PATCH);
    ck_assert_str_eq(hk_version(), want);
    /* HK_VERSION_NUM is the same version, 0xMMmmpp, usable in #if. */
    unsigned major, minor, patch;
    ck_assert_int_eq(sscanf(hk_version(), "%u.%u.%u", &major, &minor, &patch), 3);
    ck_assert_uint_eq(HK_VERSION_NUM, major << 16 | minor << 8 | patch);
#if HK_VERSION_NUM < 0x010300 || HK_VERSION_NUM >= 0x020000
#error "HK_VERSION_NUM is not a 1.x version from 1.3 on"
#endif
    ck_assert_str_eq(hk_format_name(HK_FORMAT_PTX), "ptx");
}
END_TEST

START_TEST(argument_checks) {
    hk_kernel *k;
    ck_assert_int_eq(hk_swap(rt, NULL, "x", 1, NULL, NULL), HK_ERR_INVALID);
    ck_assert_int_eq(hk_swap(rt, "m", NULL, 1, NULL, NULL), HK_ERR_INVALID);
    ck_assert_int_eq(hk_swap(rt, "m", "x", 0, NULL, NULL), HK_ERR_INVALID);
    char longname[100];
    memset(longname, 'a', sizeof longname - 1);
    longname[99] = 0;
    ck_assert_int_eq(hk_swap(rt, longname, "x", 1, NULL, NULL), HK_ERR_INVALID);
    ck_assert_int_eq(hk_kernel_get(rt, "nomodule", "step", &k), HK_ERR_NOT_FOUND);
    ck_assert_int_eq(hk_kernel_get(NULL, "m", "step", &k), HK_ERR_INVALID);
    ck_assert_int_eq(hk_rollback(rt, "nomodule", NULL), HK_ERR_NOT_FOUND);
    hk_runtime_destroy(NULL);
    hk_report_clear(NULL);
    hk_unpin(NULL);
    /* Bad options. */
    hk_options o;
    hk_options_init(&o);
    o.jit_opt_level = 9;
    hk_runtime *r2;
    ck_assert_int_eq(hkl_runtime_create_with(&r2, &o, fake_driver(), NULL), HK_ERR_INVALID);
    hk_options_init(&o);
    int devs[2] = {0, 0};
    o.devices = devs;
    o.ndevices = 2;
    ck_assert_int_eq(hkl_runtime_create_with(&r2, &o, fake_driver(), NULL), HK_ERR_INVALID);
    devs[1] = 7;
    ck_assert_int_eq(hkl_runtime_create_with(&r2, &o, fake_driver(), NULL), HK_ERR_NO_DEVICE);
}
END_TEST

START_TEST(load_launch_swap_reclaim) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 0, 0), &rep);
    ck_assert_int_eq(rep.version, 1);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    hk_kernel *k, *k2;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k2), 0);
    ck_assert_ptr_eq(k, k2);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "nosuch", &k2), HK_ERR_NOT_FOUND);
    ck_assert_int_eq(launch_tag(k), 1);
    /* The code was uploaded to the context at staging (cuFuncLoad). */
    ck_assert_int_ge(fake_calls("cuFuncLoad"), 2);
    for (int i = 2; i <= 5; i++) {
        swap_ok("sim", ptx(i, 1, 0, 0), &rep);
        ck_assert_uint_eq(rep.version, (uint64_t)i);
        ck_assert_int_eq(launch_tag(k), i);
    }
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.swaps, 5);
    ck_assert_uint_eq(st.reclaimed, 4);
    ck_assert_uint_eq(st.live_versions, 1);
    ck_assert_int_eq(events[HK_EVENT_COMMITTED], 5);
    ck_assert_int_eq(events[HK_EVENT_RECLAIMED], 4);
    /* Libraries are unloaded without synchronising the context (the driver
     * keeps code alive for queued work; a synchronise would break other
     * threads' captures). */
    ck_assert_int_eq(fake_calls("cuCtxSynchronize"), 0);
    hk_report_clear(&rep);
}
END_TEST

/* ---- refusals ------------------------------------------------------------ */

static void assert_still(hk_kernel *k, int tag, uint64_t version) {
    ck_assert_int_eq(launch_tag(k), tag);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), version);
}

START_TEST(refusals_keep_old_version) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 0, 0), &rep);
    hk_kernel *k, *aux;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "aux", &aux), 0);

    /* A kernel in use removed. */
    ck_assert_int_eq(swap_src("sim", ptx(2, 0, 0, 0), &rep), HK_ERR_MISSING_KERNEL);
    ck_assert_str_eq(rep.kernel, "aux");
    ck_assert_msg(strstr(rep.message, "aux") && strstr(rep.message, "missing"), "%s", rep.message);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_NOT_FOUND");
    assert_still(k, 1, 1);

    /* A parameter's size changed. */
    ck_assert_int_eq(swap_src("sim", ptx(3, 1, 0, 1), &rep), HK_ERR_LAYOUT);
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_msg(strstr(rep.message, "parameter 1 was 4 bytes at offset 8, now 8 bytes"), "%s",
                  rep.message);
    assert_still(k, 1, 1);

    /* A parameter removed. */
    ck_assert_int_eq(swap_src("sim", ptx(4, 1, 0, 2), &rep), HK_ERR_LAYOUT);
    ck_assert_msg(strstr(rep.message, "had 2 parameters, now 1"), "%s", rep.message);
    assert_still(k, 1, 1);

    /* JIT error: the log names the line; the CUresult is named. */
    char bad[2048];
    snprintf(bad, sizeof bad, "%s\nSYNTAX ERROR\n", ptx(5, 1, 0, 0));
    ck_assert_int_eq(swap_src("sim", bad, &rep), HK_ERR_COMPILE);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_INVALID_PTX");
    ck_assert_ptr_nonnull(rep.log);
    ck_assert_msg(strstr(rep.log, "line 14"), "log: %s", rep.log);
    assert_still(k, 1, 1);

    /* Not a kernel at all. */
    ck_assert_int_eq(swap_src("sim", "\x7f\x45\x4c\x46garbage", &rep), HK_ERR_FORMAT);
    assert_still(k, 1, 1);

    /* Version numbers are not consumed by refusals. */
    swap_ok("sim", ptx(6, 1, 0, 0), &rep);
    ck_assert_uint_eq(rep.version, 2);
    ck_assert_int_eq(launch_tag(k), 6);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.refused, 5);
    ck_assert_int_eq(events[HK_EVENT_REFUSED], 5);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1); /* refused versions were unloaded */
    hk_report_clear(&rep);
}
END_TEST

START_TEST(layout_change_when_accepted) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.accept_layout_change = 1;
    const char *src = ptx(2, 1, 0, 1);
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), &so, &rep), 0);
    ck_assert_int_eq(launch_tag(k), 2);
    /* The accepted layout is the new reference. */
    ck_assert_int_eq(swap_src("sim", ptx(3, 1, 0, 0), &rep), HK_ERR_LAYOUT);
    swap_ok("sim", ptx(4, 1, 0, 1), &rep);
    hk_report_clear(&rep);
}
END_TEST

/* A layout required by the caller (hotkern.hpp, the <<<>>> interposition)
 * is checked now and holds for good: accept_layout_change cannot change it. */
START_TEST(required_layout_holds) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    /* step(u64 out, u32 n) */
    size_t off[] = {0, 8}, size[] = {8, 4}, bad_size[] = {8, 8};
    ck_assert_int_eq(hk_kernel_require_layout(k, off, bad_size, 2, &rep), HK_ERR_LAYOUT);
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_msg(strstr(rep.message, "parameter 1 was 8 bytes at offset 8, now 4 bytes"), "%s",
                  rep.message);
    ck_assert_int_eq(hk_kernel_require_layout(k, off, size, 1, &rep), HK_ERR_LAYOUT);
    ck_assert_int_eq(hk_kernel_require_layout(k, off, size, 2, &rep), 0);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.accept_layout_change = 1;
    const char *src = ptx(2, 1, 0, 1);
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), &so, &rep), HK_ERR_LAYOUT);
    ck_assert_msg(strstr(rep.message, "no version may change"), "%s", rep.message);
    ck_assert_int_eq(launch_tag(k), 1);
    swap_ok("sim", ptx(3, 1, 0, 0), &rep);
    ck_assert_int_eq(launch_tag(k), 3);
    ck_assert_int_eq(hk_kernel_require_layout(NULL, off, size, 2, &rep), HK_ERR_INVALID);
    hk_report_clear(&rep);
}
END_TEST

static int refuse_odd(const char *module, uint64_t version, void *ud, char *msg, size_t n) {
    (void)module;
    (void)ud;
    if (version % 2)
        return 0;
    snprintf(msg, n, "even versions are not allowed");
    return 1;
}

START_TEST(check_callback_refuses) {
    hk_report rep = HK_REPORT_INIT;
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.check = refuse_odd;
    const char *a = ptx(1, 0, 0, 0), *b = ptx(2, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "sim", a, strlen(a), &so, &rep), 0);
    ck_assert_int_eq(hk_swap(rt, "sim", b, strlen(b), &so, &rep), HK_ERR_REJECTED);
    ck_assert_msg(strstr(rep.message, "even versions are not allowed"), "%s", rep.message);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    hk_report_clear(&rep);
}
END_TEST

/* ---- state -------------------------------------------------------------- */

START_TEST(globals_carried_over) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 1, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    int launches = 0;
    for (int v = 2; v <= 101; v++) {
        launch_tag(k);
        launch_tag(k);
        launches += 2;
        swap_ok("sim", ptx(v, 0, 1, 0), &rep);
    }
    /* Read the counter through the driver, as the GPU suite does. */
    pthread_mutex_lock(&rt->swap_lock);
    hkl_version *cur = atomic_load(&hkl_module_find(rt, "sim")->current);
    CUdeviceptr p;
    size_t sz;
    ck_assert_int_eq(fake_driver()->LibraryGetGlobal(&p, &sz, cur->lib, "counter"), 0);
    pthread_mutex_unlock(&rt->swap_lock);
    ck_assert_int_eq(*(int *)(uintptr_t)p, launches);

    /* Opting out starts the new version from its own initial value. */
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.carry_globals = 0;
    const char *src = ptx(200, 0, 1, 0);
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), &so, &rep), 0);
    pthread_mutex_lock(&rt->swap_lock);
    cur = atomic_load(&hkl_module_find(rt, "sim")->current);
    ck_assert_int_eq(fake_driver()->LibraryGetGlobal(&p, &sz, cur->lib, "counter"), 0);
    pthread_mutex_unlock(&rt->swap_lock);
    ck_assert_int_eq(*(int *)(uintptr_t)p, 0);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(rollback_walks_back) {
    hk_report rep = HK_REPORT_INIT;
    for (int i = 1; i <= 3; i++)
        swap_ok("sim", ptx(i * 10, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(launch_tag(k), 30);
    ck_assert_int_eq(hk_rollback(rt, "sim", &rep), 0);
    ck_assert_uint_eq(rep.version, 4); /* a new, monotonic number */
    ck_assert_int_eq(launch_tag(k), 20);
    ck_assert_int_eq(hk_rollback(rt, "sim", &rep), 0);
    ck_assert_uint_eq(rep.version, 5);
    ck_assert_int_eq(launch_tag(k), 10);
    ck_assert_int_eq(hk_rollback(rt, "sim", &rep), HK_ERR_NO_HISTORY);
    ck_assert_int_eq(launch_tag(k), 10);
    /* A failed rollback leaves the history intact. */
    swap_ok("sim", ptx(40, 0, 0, 0), &rep);
    fake_fail("cuLibraryLoadData", 1, CUDA_ERROR_OUT_OF_MEMORY);
    ck_assert_int_eq(hk_rollback(rt, "sim", &rep), HK_ERR_CUDA);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_OUT_OF_MEMORY");
    ck_assert_int_eq(launch_tag(k), 40);
    ck_assert_int_eq(hk_rollback(rt, "sim", &rep), 0);
    ck_assert_int_eq(launch_tag(k), 10);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.rollbacks, 3);
    ck_assert_int_eq(events[HK_EVENT_ROLLED_BACK], 3);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(history_is_bounded) {
    hk_report rep = HK_REPORT_INIT;
    for (int i = 1; i <= 10; i++)
        swap_ok("sim", ptx(i, 0, 0, 0), &rep);
    int n = 0;
    while (hk_rollback(rt, "sim", &rep) == 0)
        n++;
    ck_assert_int_eq(n, 3); /* history 4: current + 3 earlier */
    hk_report_clear(&rep);
}
END_TEST

START_TEST(same_image_again_is_not_reloaded) {
    hk_report rep = HK_REPORT_INIT;
    const char *src = ptx(3, 0, 0, 0);
    swap_ok("sim", src, &rep);
    int loads = fake_calls("cuLibraryLoadData");
    ck_assert_int_eq(swap_src("sim", src, &rep), 0);
    ck_assert_uint_eq(rep.version, 1);
    ck_assert_msg(strstr(rep.message, "already runs this image"), "%s", rep.message);
    ck_assert_int_eq(fake_calls("cuLibraryLoadData"), loads);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.swaps, 1);
    ck_assert_int_eq(events[HK_EVENT_COMMITTED], 1);
    swap_ok("sim", ptx(4, 0, 0, 0), &rep); /* a different image still commits */
    ck_assert_uint_eq(rep.version, 2);
    hk_report_clear(&rep);
}
END_TEST

void engine_versions_tests(TCase *tc) {
    tcase_add_test(tc, no_driver_is_reported);
    tcase_add_test(tc, error_strings_are_distinct);
    tcase_add_test(tc, argument_checks);
    tcase_add_test(tc, load_launch_swap_reclaim);
    tcase_add_test(tc, refusals_keep_old_version);
    tcase_add_test(tc, layout_change_when_accepted);
    tcase_add_test(tc, required_layout_holds);
    tcase_add_test(tc, check_callback_refuses);
    tcase_add_test(tc, globals_carried_over);
    tcase_add_test(tc, rollback_walks_back);
    tcase_add_test(tc, history_is_bounded);
    tcase_add_test(tc, same_image_again_is_not_reloaded);
}

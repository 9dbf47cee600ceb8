/*
 * The loadable fake driver (BUILD/lib/libhotkern-fakecuda.so) through the
 * public API alone, as an application's CI would use it: a program runs on
 * it, it takes cubins, and its controls are set by dlsym or by HKFAKE_*
 * variables.
 */
#include "tests/canary/fixture.h"

/* ---- the loadable fake through the public API ------------------------- */

/* A program that knows nothing of the fake: create, swap, take a handle,
 * launch. Device memory is host memory in the fake. */
static void public_swap_and_launch(hk_ptx_mode mode, int want) {
    setenv("HK_LIBCUDA", fake_lib, 1);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = mode;
    o.cache_dir = "";
    o.no_warm_start = 1;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_runtime_create(&rt, &o, &rep) == 0, "%s", rep.message);
    const char *p = fake_ptx(5, 0, 0, 0);
    ck_assert_msg(hk_swap(rt, "m", p, strlen(p) + 1, NULL, &rep) == 0, "%s", rep.message);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &k), 0);
    int out = -1;
    int *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL), 0);
    ck_assert_int_eq(out, want);
    hk_report_clear(&rep);
}

START_TEST(loadable_fake_runs_a_program) {
    public_swap_and_launch(HK_PTX_DRIVER_JIT, 5);
}
END_TEST

/* The default PTX path links a cubin with nvJitLink; the fake reads its
 * kernels too (no tag in a cubin: 0). */
START_TEST(loadable_fake_takes_cubins) {
    public_swap_and_launch(HK_PTX_NVJITLINK, 0);
}
END_TEST

/* The controls by dlsym: a wrong value, then a fault that sticks. */
START_TEST(loadable_fake_controls_by_dlsym) {
    public_swap_and_launch(HK_PTX_DRIVER_JIT, 5);
    void *h = dlopen(fake_lib, RTLD_NOW | RTLD_NOLOAD);
    ck_assert_ptr_nonnull(h);
    int (*wrong)(const char *) = (int (*)(const char *))dlsym(h, "hkfake_wrong_kernel");
    int (*fault)(const char *, int) = (int (*)(const char *, int))dlsym(h, "hkfake_fault_kernel");
    ck_assert_ptr_nonnull(wrong);
    ck_assert_ptr_nonnull(fault);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &k), 0);
    int out = 0, *dptr = &out, cu = 0;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    ck_assert_int_eq(wrong("step@5"), 0);
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL), 0);
    ck_assert_int_eq(out, ~5);
    ck_assert_int_eq(fault("step", CUDA_ERROR_ILLEGAL_ADDRESS), 0);
    /* The wrong-value control matches first; a fresh control list shows the
     * fault: accepted, then every call fails. */
    void (*clear)(void) = (void (*)(void))dlsym(h, "hkfake_clear_kernels");
    clear();
    ck_assert_int_eq(fault("step", CUDA_ERROR_ILLEGAL_ADDRESS), 0);
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu), 0);
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu),
                     HK_ERR_CUDA);
    ck_assert_int_eq(cu, CUDA_ERROR_ILLEGAL_ADDRESS);
    dlclose(h);
}
END_TEST

/* HKFAKE_* variables reach a program that loads the library: here a
 * wrong value (the canary tests use the fault and hang variables). */
START_TEST(loadable_fake_controls_by_environment) {
    setenv("HKFAKE_WRONG", "step@5", 1);
    public_swap_and_launch(HK_PTX_DRIVER_JIT, ~5);
}
END_TEST

void canary_fake_tests(TCase *tc) {
    tcase_add_test(tc, loadable_fake_runs_a_program);
    tcase_add_test(tc, loadable_fake_takes_cubins);
    tcase_add_test(tc, loadable_fake_controls_by_dlsym);
    tcase_add_test(tc, loadable_fake_controls_by_environment);
}

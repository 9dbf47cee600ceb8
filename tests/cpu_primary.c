/*
 * The interposition's runtime from the environment (interpose/primary.c) on
 * the fake driver: it runs in device 0's primary context, the runtime API's,
 * even when the first launching thread has another context current (a
 * plugin's own, say); that thread gets its context back; launches from the
 * primary context reach the hot version, launches from the other context
 * run the program's own code. No GPU evidence.
 */
#include <pthread.h>
#include <string.h>

#include "hotkern/interpose.h"
#include "interpose/interpose.h"
#include "loader/core.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

static cudaError_t f_klaunch(cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) {
    return (cudaError_t)fake_driver()->LaunchKernel((CUfunction)k, g.x, g.y, g.z, b.x, b.y, b.z,
                                                    (unsigned)sh, (CUstream)s, a, NULL);
}

static const hki_real fake_real = {.klaunch = f_klaunch, .klaunch_ptsz = f_klaunch};

static cudaKernel_t prog;

static int launch(void) {
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    ck_assert_int_eq(hki_klaunch(0, prog, g, b, args, 0, NULL), cudaSuccess);
    return out;
}

static void *launch_in_primary(void *arg) {
    CUcontext prim;
    fake_driver()->DevicePrimaryCtxRetain(&prim, 0);
    fake_driver()->CtxSetCurrent(prim);
    *(int *)arg = launch();
    return NULL;
}

START_TEST(first_launcher_context_does_not_decide) {
    fake_init(1, 90);
    hki_real_set(&fake_real);
    const hkb_driver *d = fake_driver();
    CUcontext other = fake_ctx_create(0), prim, cur = NULL;
    ck_assert_ptr_nonnull(other);
    ck_assert_int_eq(d->DevicePrimaryCtxRetain(&prim, 0), 0);
    ck_assert_ptr_ne(other, prim);
    ck_assert_int_eq(d->CtxSetCurrent(other), 0); /* the first launcher's own context */

    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.no_warm_start = 1;
    hk_runtime *rt = NULL;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hki_runtime_create(&rt, &o, d, &rep), 0);
    ck_assert_ptr_eq(hkl_ctx(rt, 0), prim);
    ck_assert_int_eq(d->CtxGetCurrent(&cur), 0);
    ck_assert_ptr_eq(cur, other); /* given back */
    ck_assert_int_eq(hk_interpose_attach(rt), 0);

    CUlibrary lib;
    CUkernel k;
    ck_assert_int_eq(d->LibraryLoadData(&lib, fake_ptx(1, 0, 0, 0), NULL, NULL, 0, NULL, NULL, 0),
                     0);
    ck_assert_int_eq(d->LibraryGetKernel(&k, lib, "step"), 0);
    prog = (cudaKernel_t)k;
    ck_assert_int_eq(launch(), 1);
    const char *src = fake_ptx(2, 0, 0, 0);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_NOW;
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), &so, &rep), 0);
    int tag = 0;
    pthread_t t;
    pthread_create(&t, NULL, launch_in_primary, &tag);
    pthread_join(t, NULL);
    ck_assert_int_eq(tag, 2);      /* the runtime API's context: the hot version */
    ck_assert_int_eq(launch(), 1); /* the other context: the program's own */
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("interpose: the runtime's context (fake driver)");
    TCase *tc = tcase_create("primary");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, first_launcher_context_does_not_decide);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

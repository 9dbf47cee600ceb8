/*
 * The <<<>>> interposition's core (interpose/route.c) on the fake driver:
 * the program's runtime is a table of fake functions that launch the
 * program's own (fake) kernels, the hot versions come through hk_swap.
 * Checked: launches with no hot version reach the program's runtime
 * untouched and register once; a hot version takes them over and follows
 * edits; one with another parameter layout is refused and the program's own
 * code keeps running; name matching and the name expressions of template
 * instantiations (with a real NVRTC build); the program's globals seeded
 * into the first hot version and the host's symbol copies routed; a runtime
 * that cannot be made routes nothing. None of this is GPU evidence
 * (tests/gpu_interpose.cu is).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hotkern/interpose.h"
#include "interpose/interpose.h"
#include "loader/core.h"
#include "loader/expect.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

static hk_runtime *rt;

/* ---- the program's runtime, faked ---------------------------------------- */

static int real_launches;
static cudaStream_t real_stream;
static dim3 real_grid;

static cudaError_t f_klaunch(cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) {
    real_launches++;
    real_grid = g;
    real_stream = s;
    return (cudaError_t)fake_driver()->LaunchKernel((CUfunction)k, g.x, g.y, g.z, b.x, b.y, b.z,
                                                    (unsigned)sh, (CUstream)s, a, NULL);
}

/* Function pointers stand for kernels through this map (cudaGetKernel). */
static const void *stub_of[4];
static cudaKernel_t kernel_of[4];

static cudaError_t f_get_kernel(cudaKernel_t *k, const void *f) {
    for (int i = 0; i < 4; i++)
        if (stub_of[i] && stub_of[i] == f) {
            *k = kernel_of[i];
            return cudaSuccess;
        }
    return cudaErrorInvalidDeviceFunction;
}

static cudaError_t f_launch(const void *f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) {
    cudaKernel_t k;
    if (f_get_kernel(&k, f) != cudaSuccess)
        return cudaErrorInvalidDeviceFunction;
    return f_klaunch(k, g, b, a, sh, s);
}

static int real_xlaunches;
static cudaError_t f_xlaunch(const cudaLaunchConfig_t *c, const void *f, void **a) {
    real_xlaunches++;
    return f_launch(f, c->gridDim, c->blockDim, a, c->dynamicSmemBytes, c->stream);
}

/* The program's copy of its __device__ int "counter", and its host shadow. */
static int prog_counter = 41;
static int shadow_counter;

static cudaError_t f_symbol_address(void **p, const void *sym) {
    if (sym != &shadow_counter)
        return cudaErrorInvalidSymbol;
    *p = &prog_counter;
    return cudaSuccess;
}

static cudaError_t f_to_symbol(const void *sym, const void *src, size_t n, size_t off,
                               enum cudaMemcpyKind kind) {
    if (sym != &shadow_counter || off + n > sizeof prog_counter)
        return cudaErrorInvalidSymbol;
    memcpy((char *)&prog_counter + off, src, n);
    return cudaSuccess;
}

static cudaError_t f_from_symbol(void *dst, const void *sym, size_t n, size_t off,
                                 enum cudaMemcpyKind kind) {
    if (sym != &shadow_counter || off + n > sizeof prog_counter)
        return cudaErrorInvalidSymbol;
    memcpy(dst, (char *)&prog_counter + off, n);
    return cudaSuccess;
}

static cudaError_t f_memcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    memcpy(dst, src, n); /* the fake's device memory is host memory */
    return cudaSuccess;
}

static int registered_vars;
static void f_register_var(void **fb, char *hv, char *da, const char *nm, int ext, size_t sz,
                           int cst, int glb) {
    registered_vars++;
}

static const hki_real fake_real = {
    .klaunch = f_klaunch,
    .klaunch_ptsz = f_klaunch,
    .launch = f_launch,
    .launch_ptsz = f_launch,
    .xlaunch = f_xlaunch,
    .xlaunch_ptsz = f_xlaunch,
    .register_var = f_register_var,
    .to_symbol = f_to_symbol,
    .to_symbol_ptds = f_to_symbol,
    .from_symbol = f_from_symbol,
    .from_symbol_ptds = f_from_symbol,
    .symbol_address = f_symbol_address,
    .get_kernel = f_get_kernel,
    .memcpy = f_memcpy,
};

/* ---- setup ---------------------------------------------------------------- */

static CUlibrary prog_lib;

/* The program's own code: a fake image (tag 1 unless said) and its kernel
 * `name`, as the runtime would hand it to __cudaLaunchKernel. */
static cudaKernel_t program_kernel(const char *ptx, const char *name) {
    const hkb_driver *d = fake_driver();
    ck_assert_int_eq(d->LibraryLoadData(&prog_lib, ptx, NULL, NULL, 0, NULL, NULL, 0), 0);
    CUkernel k;
    ck_assert_int_eq(d->LibraryGetKernel(&k, prog_lib, name), 0);
    return (cudaKernel_t)k;
}

static void setup(void) {
    fake_init(1, 90);
    hki_real_set(&fake_real);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.no_warm_start = 1;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&rt, &o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    /* The program's runtime current, as in a program that has launched. */
    fake_driver()->CtxSetCurrent(hkl_ctx(rt, 0));
    real_launches = real_xlaunches = 0;
}

static void teardown(void) {
    /* The interposition keeps the runtime for the process (each test is a
     * process of its own); no launch follows. */
    hk_runtime_destroy(rt);
    rt = NULL;
}

static int swap(const char *mod, const char *src, hk_report *rep) {
    return hk_swap(rt, mod, src, strlen(src), NULL, rep);
}

static void swap_ok(const char *mod, const char *src) {
    hk_report rep = HK_REPORT_INIT;
    int err = swap(mod, src, &rep);
    ck_assert_msg(err == 0, "swap refused: %s: %s", hk_strerror(err), rep.message);
    hk_report_clear(&rep);
}

/* One <<<>>> launch of k as nvcc's stub makes it; returns the tag the code
 * that ran wrote. */
static int launch(cudaKernel_t k, int ptsz) {
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    dim3 g = {3, 1, 1}, b = {32, 1, 1};
    ck_assert_int_eq(hki_klaunch(ptsz, k, g, b, args, 0, NULL), cudaSuccess);
    return out;
}

/* ---- launches --------------------------------------------------------- */

START_TEST(unrouted_launches_are_forwarded_untouched) {
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    ck_assert_int_eq(hk_interpose_attach(rt), HK_ERR_BUSY);
    cudaKernel_t k = program_kernel(fake_ptx(1, 0, 0, 0), "step");
    ck_assert_int_eq(launch(k, 0), 1);
    ck_assert_int_eq(launch(k, 1), 1);
    ck_assert_int_eq(real_launches, 2);
    ck_assert_uint_eq(real_grid.x, 3);
    ck_assert_ptr_null(real_stream);       /* as the program passed it */
    ck_assert_int_eq(hki_registered(), 1); /* the handle registered once */
    /* A module that does not have the kernel changes nothing. */
    swap_ok("other", "// tag: 5\n.version 8.0\n.target sm_90\n.address_size 64\n"
                     ".visible .entry aux(.param .u64 p)\n{\n ret;\n}\n");
    ck_assert_int_eq(launch(k, 0), 1);
    ck_assert_int_eq(real_launches, 3);
}
END_TEST

START_TEST(hot_version_takes_over_and_follows_edits) {
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    cudaKernel_t k = program_kernel(fake_ptx(1, 0, 0, 0), "step");
    ck_assert_int_eq(launch(k, 0), 1);
    swap_ok("sim", fake_ptx(2, 0, 0, 0));
    ck_assert_int_eq(launch(k, 0), 2);
    ck_assert_int_eq(launch(k, 1), 2); /* _ptsz: the per-thread stream */
    swap_ok("sim", fake_ptx(3, 1, 0, 0));
    ck_assert_int_eq(launch(k, 0), 3);
    ck_assert_int_eq(real_launches, 1);
    /* The module now holds the program's kernel: removing it is refused. */
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap("sim",
                          "// tag: 4\n.version 8.0\n.target sm_90\n.address_size 64\n"
                          ".visible .entry aux(.param .u64 p)\n{\n ret;\n}\n",
                          &rep),
                     HK_ERR_MISSING_KERNEL);
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_int_eq(launch(k, 0), 3);
    hk_report_clear(&rep);
}
END_TEST

/* A layout the driver cannot tell yet (a program's very first CUDA call is
 * a launch, before any context is current) is not taken for "no
 * parameters": the kernel is registered at a later launch, with its real
 * layout, and a hot version of that layout takes over. */
START_TEST(layout_not_known_yet_is_asked_again) {
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    cudaKernel_t k = program_kernel(fake_ptx(1, 0, 0, 0), "step");
    fake_fail("cuKernelGetParamInfo", 1, CUDA_ERROR_INVALID_CONTEXT);
    ck_assert_int_eq(launch(k, 0), 1);
    ck_assert_int_eq(hki_registered(), 0);
    ck_assert_int_eq(launch(k, 0), 1);
    ck_assert_int_eq(hki_registered(), 1);
    swap_ok("sim", fake_ptx(2, 0, 0, 0)); /* step(int *, unsigned): the program's layout */
    ck_assert_int_eq(launch(k, 0), 2);
}
END_TEST

START_TEST(layout_change_is_refused) {
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    cudaKernel_t k = program_kernel(fake_ptx(1, 0, 0, 0), "step"); /* step(u64, u32) */
    ck_assert_int_eq(launch(k, 0), 1);
    hk_report rep = HK_REPORT_INIT;
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.accept_layout_change = 1; /* not for the program's kernels */
    const char *bad = fake_ptx(2, 0, 0, 1);
    ck_assert_int_eq(hk_swap(rt, "sim", bad, strlen(bad), &so, &rep), HK_ERR_LAYOUT);
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_msg(strstr(rep.message, "parameter 1 was 4 bytes at offset 8, now 8 bytes"), "%s",
                  rep.message);
    ck_assert_int_eq(launch(k, 0), 1); /* the program's own code */
    ck_assert_int_eq(real_launches, 2);
    swap_ok("sim", fake_ptx(3, 0, 0, 0));
    ck_assert_int_eq(launch(k, 0), 3);
    hk_report_clear(&rep);
}
END_TEST

/* A hot version committed before the program first launches the kernel is
 * found when it does; one with another layout is left alone. */
START_TEST(hot_version_before_first_launch) {
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    swap_ok("wrong", fake_ptx(7, 0, 0, 1)); /* step(u64, u64): not the program's */
    cudaKernel_t k = program_kernel(fake_ptx(1, 0, 0, 0), "step");
    ck_assert_int_eq(launch(k, 0), 1); /* "wrong" has another layout */
    swap_ok("sim", fake_ptx(2, 0, 0, 0));
    ck_assert_int_eq(launch(k, 0), 2); /* adopted by its swap */
    /* A kernel of that name in a third module is not used. */
    swap_ok("third", fake_ptx(9, 0, 0, 0));
    ck_assert_int_eq(launch(k, 0), 2);
}
END_TEST

START_TEST(launch_by_function_and_with_attributes) {
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    static const char stub = 0; /* a host stub's address */
    stub_of[0] = &stub;
    kernel_of[0] = program_kernel(fake_ptx(1, 0, 0, 0), "step");
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    dim3 one = {1, 1, 1};
    ck_assert_int_eq(hki_launch(0, &stub, one, one, args, 0, NULL), cudaSuccess);
    ck_assert_int_eq(out, 1);
    swap_ok("sim", fake_ptx(2, 0, 0, 0));
    ck_assert_int_eq(hki_launch(0, &stub, one, one, args, 0, NULL), cudaSuccess);
    ck_assert_int_eq(out, 2);
    cudaLaunchAttribute at = {.id = cudaLaunchAttributeCooperative};
    at.val.cooperative = 1;
    cudaLaunchConfig_t c = {.gridDim = one, .blockDim = one, .attrs = &at, .numAttrs = 1};
    out = -1;
    ck_assert_int_eq(hki_xlaunch(0, &c, &stub, args), cudaSuccess);
    ck_assert_int_eq(out, 2);
    int ids[4];
    ck_assert_int_eq(fake_last_launch_ex(ids, 4), 1);
    ck_assert_int_eq(ids[0], CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
    ck_assert_int_eq(real_xlaunches, 0);
    /* A function the runtime does not know is the program's business. */
    static const char other = 0;
    ck_assert_int_eq(hki_launch(0, &other, one, one, args, 0, NULL),
                     cudaErrorInvalidDeviceFunction);
}
END_TEST

/* ---- names -------------------------------------------------------------- */

START_TEST(name_expressions_of_template_instances) {
    struct {
        const char *mangled, *expr;
    } cases[] = {
        {"_Z5scaleIfEvPT_S0_i", "scale<float>"},
        {"_ZN2ns5scaleIiLi2EEEvPT_", "ns::scale<int, 2>"},
        {"_Z10cxx_kernelPid", NULL}, /* no template: NVRTC names it so by itself */
        {"step", NULL},
        {"_Zjunk", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *e = hki_name_expression(cases[i].mangled);
        if (cases[i].expr)
            ck_assert_msg(e && !strcmp(e, cases[i].expr), "%s: %s", cases[i].mangled,
                          e ? e : "(null)");
        else
            ck_assert_msg(!e, "%s: %s", cases[i].mangled, e);
        free(e);
    }
}
END_TEST

static const char *TEMPLATE_SRC =
    "template <typename T> __global__ void scale(T *x, T a, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] *= a;\n"
    "}\n"
    "__global__ void cxx_kernel(int *p, double d) { *p = (int)d; }\n";

/* The program launches scale<float> (as nvcc names it); a hot build of the
 * template's source gets the name expression, NVRTC names the instance as
 * nvcc did, and the version takes the launches over. A non-template C++
 * kernel needs nothing. Real NVRTC builds. */
START_TEST(template_instance_follows_its_source) {
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    const char *prog = "// tag: 1\n.version 8.0\n.target sm_90\n.address_size 64\n"
                       ".visible .entry _Z5scaleIfEvPT_S0_i(.param .u64 x, .param .f32 a, "
                       ".param .u32 n)\n{\n ret;\n}\n"
                       ".visible .entry _Z10cxx_kernelPid(.param .u64 p, .param .f64 d)\n"
                       "{\n ret;\n}\n";
    cudaKernel_t scale = program_kernel(prog, "_Z5scaleIfEvPT_S0_i");
    CUkernel cxx;
    ck_assert_int_eq(fake_driver()->LibraryGetKernel(&cxx, prog_lib, "_Z10cxx_kernelPid"), 0);
    launch(scale, 0);
    launch((cudaKernel_t)cxx, 0);
    ck_assert_int_eq(real_launches, 2);
    hk_report rep = HK_REPORT_INIT;
    int err = swap("kernels", TEMPLATE_SRC, &rep);
    ck_assert_msg(err == 0, "%s: %s", hk_strerror(err), rep.message);
    launch(scale, 0);
    launch((cudaKernel_t)cxx, 0);
    ck_assert_int_eq(real_launches, 2); /* both went to the hot version */
    /* A source without the template builds without its expression. */
    err = swap("other", "__global__ void unrelated(int *p) { *p = 1; }\n", &rep);
    ck_assert_msg(err == 0, "%s: %s", hk_strerror(err), rep.message);
    hk_report_clear(&rep);
}
END_TEST

/* ---- globals -------------------------------------------------------------- */

START_TEST(globals_seeded_and_routed) {
    hki_register_var(NULL, (char *)&shadow_counter, "counter", "counter", 0, 4, 0, 0);
    ck_assert_int_eq(registered_vars, 1);
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    prog_counter = 41;
    /* Before any hot version: the program's own copy. */
    int v = 5, got = 0;
    ck_assert_int_eq(hki_to_symbol(0, 0, &shadow_counter, &v, 4, 0, cudaMemcpyHostToDevice, 0), 0);
    ck_assert_int_eq(prog_counter, 5);
    prog_counter = 41;
    swap_ok("sim", fake_ptx(2, 0, 1, 0)); /* has a 4-byte "counter" */
    uint64_t p = 0;
    size_t size = 0;
    ck_assert_int_eq(hkl_expect_global_hot(rt, "counter", &p, &size), 1);
    ck_assert_uint_eq(size, 4);
    ck_assert_int_eq(*(int *)(uintptr_t)p, 41); /* the program's value */
    v = 7;
    ck_assert_int_eq(hki_to_symbol(0, 0, &shadow_counter, &v, 4, 0, cudaMemcpyHostToDevice, 0), 0);
    ck_assert_int_eq(prog_counter, 7);
    ck_assert_int_eq(*(int *)(uintptr_t)p, 7);
    *(int *)(uintptr_t)p = 9; /* the hot kernels wrote it */
    ck_assert_int_eq(hki_from_symbol(0, 0, &got, &shadow_counter, 4, 0, cudaMemcpyDeviceToHost, 0),
                     0);
    ck_assert_int_eq(got, 9);
    void *addr = NULL;
    ck_assert_int_eq(hki_symbol_address(&addr, &shadow_counter), 0);
    ck_assert_ptr_eq(addr, (void *)(uintptr_t)p);
    /* The next version carries the value on; writes follow it there. */
    swap_ok("sim", fake_ptx(3, 0, 1, 0));
    uint64_t p2 = 0;
    ck_assert_int_eq(hkl_expect_global_hot(rt, "counter", &p2, &size), 1);
    ck_assert_uint_ne(p2, p);
    ck_assert_int_eq(*(int *)(uintptr_t)p2, 9);
    v = 11;
    ck_assert_int_eq(hki_to_symbol(0, 0, &shadow_counter, &v, 4, 0, cudaMemcpyHostToDevice, 0), 0);
    ck_assert_int_eq(*(int *)(uintptr_t)p2, 11);
    /* An unknown symbol is the program's runtime's to refuse. */
    ck_assert_int_eq(hki_to_symbol(0, 0, &v, &v, 4, 0, cudaMemcpyHostToDevice, 0),
                     cudaErrorInvalidSymbol);
}
END_TEST

/* ---- without a runtime ------------------------------------------------- */

START_TEST(no_runtime_routes_nothing) {
    hk_runtime_destroy(rt);
    rt = NULL;
    setenv("HK_LIBCUDA", "/nonexistent/libcuda.so.1", 1); /* no driver */
    cudaKernel_t k = program_kernel(fake_ptx(1, 0, 0, 0), "step");
    ck_assert_int_eq(launch(k, 0), 1);
    ck_assert_int_eq(launch(k, 0), 1);
    ck_assert_int_eq(real_launches, 2);
    ck_assert_ptr_null(hk_interpose_runtime());
    ck_assert_int_eq(hki_registered(), 0);
}
END_TEST

START_TEST(hotkern_off_routes_nothing) {
    hk_runtime_destroy(rt);
    rt = NULL;
    setenv("HOTKERN_OFF", "1", 1);
    cudaKernel_t k = program_kernel(fake_ptx(1, 0, 0, 0), "step");
    ck_assert_int_eq(launch(k, 0), 1);
    ck_assert_ptr_null(hk_interpose_runtime());
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("interpose (fake driver)");
    TCase *tc = tcase_create("interpose");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, unrouted_launches_are_forwarded_untouched);
    tcase_add_test(tc, hot_version_takes_over_and_follows_edits);
    tcase_add_test(tc, layout_change_is_refused);
    tcase_add_test(tc, layout_not_known_yet_is_asked_again);
    tcase_add_test(tc, hot_version_before_first_launch);
    tcase_add_test(tc, launch_by_function_and_with_attributes);
    tcase_add_test(tc, name_expressions_of_template_instances);
    tcase_add_test(tc, template_instance_follows_its_source);
    tcase_add_test(tc, globals_seeded_and_routed);
    tcase_add_test(tc, no_runtime_routes_nothing);
    tcase_add_test(tc, hotkern_off_routes_nothing);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

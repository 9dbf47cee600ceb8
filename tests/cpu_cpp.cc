/*
 * hotkern.hpp on the fake driver: typed handles bind, launch (every call
 * form, what reaches the driver), refuse a signature whose layout differs
 * from the kernel's, and hold their layout against every later version
 * (swaps with accept_layout_change and rollbacks included); pins, the
 * runtime wrapper and the error model. Built twice (Makefile): with
 * exceptions (cpu_cpp), where the constructors throw hk::error, and with
 * -fno-exceptions (cpu_cpp_noexcept), where they leave the object invalid;
 * the tests that differ say which they check. The compile-time argument rule
 * is tests/cpp/compile-fail.sh's.
 */
#include <check.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <vector_types.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "hotkern/hotkern.hpp"
#include "tests/cpp/fake_runtime.h"

extern "C" {
#include "tests/fakecuda.h"
#include "tests/harness.h"
}

static hk::runtime rt;

static void setup() {
    fake_init(1, 90);
    hk_runtime *raw = nullptr;
    hk::report rep;
    int err = hkt_fake_runtime(&raw, &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    rt = hk::runtime::adopt(raw);
}

static void teardown() {
    rt.close();
    ck_assert_int_eq(fake_live_images(), 0);
    ck_assert_int_eq(fake_violations(), 0);
}

/* fake_ptx's "step(u64 out, u32 n)" (layout 0), "step(u64 out, u64 n)"
 * (layout 1), tagged `tag`, as a version of module `mod`. */
static int swap_ptx(const char *mod, int tag, int layout, bool accept, hk::report &rep) {
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.accept_layout_change = accept;
    hk_report_clear(&rep);
    return rt.swap(mod, fake_ptx(tag, 0, 0, layout), &so, &rep);
}

static void swap_ok(const char *mod, int tag, int layout, bool accept = false) {
    hk::report rep;
    int err = swap_ptx(mod, tag, layout, accept, rep);
    ck_assert_msg(err == 0, "swap refused: %s: %s", hk_strerror(err), rep.message);
}

static std::uint64_t arg_u64(const hkt_launch &l, int i) {
    std::uint64_t v = 0;
    std::memcpy(&v, l.arg[i], sizeof v);
    return v;
}

static std::uint32_t arg_u32(const hkt_launch &l, int i) {
    std::uint32_t v = 0;
    std::memcpy(&v, l.arg[i], sizeof v);
    return v;
}

using step_sig = void(int *, unsigned);
static const std::size_t step_sizes[] = {8, 4};

START_TEST(typed_handle_launches_current_version) {
    swap_ok("sim", 7, 0);
    hk::kernel<step_sig> step(rt, "sim", "step");
    ck_assert(step.valid());
    ck_assert_int_eq(step.error(), 0);
    ck_assert_str_eq(step.message(), "");
    ck_assert_ptr_nonnull(step.get());

    hkt_record_args(step_sizes, 2);
    int out = -1;
    hk::launch_status st = step.launch(hk::dims(3, 2), 64u, nullptr, &out, 1234u);
    ck_assert_msg(st.ok(), "launch: %s (CUresult %d)", hk_strerror(st.error), st.cu_result);
    ck_assert_int_eq(out, 7); /* the fake stored v7's tag through the pointer */
    hkt_launch l = hkt_last_launch();
    ck_assert_int_eq(l.count, 1);
    ck_assert_int_eq(l.ex, 0);
    ck_assert_uint_eq(l.grid[0], 3);
    ck_assert_uint_eq(l.grid[1], 2);
    ck_assert_uint_eq(l.grid[2], 1);
    ck_assert_uint_eq(l.block[0], 64);
    ck_assert_uint_eq(l.block[1], 1);
    ck_assert_uint_eq(l.shared_bytes, 0);
    ck_assert_ptr_null(l.stream);
    ck_assert(arg_u64(l, 0) == reinterpret_cast<std::uintptr_t>(&out));
    ck_assert_uint_eq(arg_u32(l, 1), 1234);

    /* The same handle runs the next version. */
    swap_ok("sim", 8, 0);
    st = step(1, 1)(&out, 5u);
    ck_assert(st.ok());
    ck_assert_int_eq(out, 8);
    ck_assert_uint_eq(arg_u32(hkt_last_launch(), 1), 5);
}
END_TEST

START_TEST(call_forms_reach_the_driver) {
    swap_ok("sim", 4, 0);
    hk::kernel<step_sig> step(rt, "sim", "step");
    ck_assert(step.valid());
    hkt_record_args(step_sizes, 2);
    CUstream s = nullptr;
    ck_assert_int_eq(fake_driver()->StreamCreate(&s, 0), CUDA_SUCCESS);

    /* <<<grid, block, shared, stream>>>: CUDA's dim3, hk_dim3, a stream. */
    int out = -1;
    hk::launch_status st = step(dim3(5, 6, 7), hk_dim3{4, 4, 1}, 256, s)(&out, 9u);
    ck_assert(st.ok());
    ck_assert_int_eq(out, 4);
    hkt_launch l = hkt_last_launch();
    ck_assert_int_eq(l.ex, 0); /* shared memory needs no cuLaunchKernelEx */
    ck_assert_uint_eq(l.grid[0], 5);
    ck_assert_uint_eq(l.grid[1], 6);
    ck_assert_uint_eq(l.grid[2], 7);
    ck_assert_uint_eq(l.block[0], 4);
    ck_assert_uint_eq(l.block[1], 4);
    ck_assert_uint_eq(l.shared_bytes, 256);
    ck_assert_ptr_eq(l.stream, s);
    ck_assert_uint_eq(arg_u32(l, 1), 9);

    /* Braces and a raw void * stream. */
    out = -1;
    st = step.launch({2, 2}, {8, 8, 2}, hk::stream::raw(static_cast<void *>(s)), &out, 10u);
    ck_assert(st.ok());
    ck_assert_int_eq(out, 4);
    l = hkt_last_launch();
    ck_assert_uint_eq(l.grid[1], 2);
    ck_assert_uint_eq(l.block[2], 2);
    ck_assert_ptr_eq(l.stream, s);

    /* A launch configuration: cuLaunchKernelEx with its attributes. */
    out = -1;
    (void)fake_last_launch_ex(nullptr, 0);
    st = step(hk::launch_config(2, 32).cluster(2).cooperative().priority(3).shared(128).on(s))(&out,
                                                                                               11u);
    ck_assert_msg(st.ok(), "launch_ex: %s", hk_strerror(st.error));
    ck_assert_int_eq(out, 4);
    l = hkt_last_launch();
    ck_assert_int_eq(l.ex, 1);
    ck_assert_uint_eq(l.grid[0], 2);
    ck_assert_uint_eq(l.block[0], 32);
    ck_assert_uint_eq(l.shared_bytes, 128);
    ck_assert_ptr_eq(l.stream, s);
    ck_assert_uint_eq(arg_u32(l, 1), 11);
    int ids[8];
    int n = fake_last_launch_ex(ids, 8);
    bool cluster = false, coop = false, prio = false;
    for (int i = 0; i < n && i < 8; i++) {
        cluster |= ids[i] == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        coop |= ids[i] == CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        prio |= ids[i] == CU_LAUNCH_ATTRIBUTE_PRIORITY;
    }
    ck_assert_msg(n == 3 && cluster && coop && prio, "%d attributes", n);

    /* The C structure itself, through launch(). */
    hk_launch_config c;
    hk_launch_config_init(&c);
    c.grid = hk_dim3{9, 1, 1};
    st = step.launch(c, &out, 12u);
    ck_assert(st.ok());
    l = hkt_last_launch();
    ck_assert_int_eq(l.ex, 1);
    ck_assert_uint_eq(l.grid[0], 9);
    ck_assert_int_eq(fake_last_launch_ex(ids, 8), 0); /* no attribute asked for */
    ck_assert_int_eq(l.count, 4);
}
END_TEST

/* Each argument reaches the driver as its parameter's type: an int given
 * for a long long parameter is widened to 8 bytes, sign included. */
START_TEST(arguments_converted_to_parameter_types) {
    swap_ok("wide", 3, 1); /* step(u64 out, u64 n) */
    hk::kernel<void(int *, long long)> wide(rt, "wide", "step");
    ck_assert_msg(wide.valid(), "%s", wide.message());
    const std::size_t sizes[] = {8, 8};
    hkt_record_args(sizes, 2);
    int out = -1, minus_seven = -7;
    ck_assert(wide(1, 1)(&out, minus_seven).ok());
    ck_assert_int_eq(out, 3);
    ck_assert(arg_u64(hkt_last_launch(), 1) == static_cast<std::uint64_t>(-7LL));

    swap_ok("sim", 2, 0);
    hk::kernel<step_sig> step(rt, "sim", "step");
    hkt_record_args(step_sizes, 2);
    unsigned short narrow = 77;
    ck_assert(step(1, 1)(&out, narrow).ok());
    ck_assert_uint_eq(arg_u32(hkt_last_launch(), 1), 77);

    /* A kernel without parameters gets no argument array. */
    ck_assert_int_eq(hk::kernel<void()>::arity, 0);
    static_assert(hk::kernel<step_sig>::offsets[1] == 8 && hk::kernel<step_sig>::sizes[1] == 4);
}
END_TEST

START_TEST(other_layout_refused_at_bind) {
    swap_ok("sim", 1, 0); /* step(u64 out, u32 n) */
    int before = fake_launches();
    hk::kernel<void(int *, unsigned long long)> wide;
    ck_assert_int_eq(wide.bind(rt, "sim", "step"), HK_ERR_LAYOUT);
    ck_assert(!wide.valid());
    ck_assert_ptr_null(wide.get());
    ck_assert_int_eq(wide.error(), HK_ERR_LAYOUT);
    const char *m = wide.message();
    ck_assert_msg(std::strstr(m, "binding kernel 'step' of module 'sim'") &&
                      std::strstr(m, hk_strerror(HK_ERR_LAYOUT)) &&
                      std::strstr(m, "parameter 1 was 8 bytes at offset 8, now 4 bytes"),
                  "message: %s", m);
    /* A launch through it launches nothing and returns the bind's code. */
    int out = -1;
    ck_assert_int_eq(wide(1, 1)(&out, 1ull).error, HK_ERR_LAYOUT);
    ck_assert_int_eq(wide.launch(1, 1, nullptr, &out, 1ull).error, HK_ERR_LAYOUT);
    ck_assert_int_eq(fake_launches(), before);
    ck_assert_int_eq(out, -1);
    /* Copies keep the outcome. */
    hk::kernel<void(int *, unsigned long long)> copy = wide;
    ck_assert_int_eq(copy.error(), HK_ERR_LAYOUT);
    ck_assert_str_eq(copy.message(), m);

    /* Another count, and a kernel that is not there. */
    hk::kernel<void(int *)> fewer;
    ck_assert_int_eq(fewer.bind(rt, "sim", "step"), HK_ERR_LAYOUT);
    ck_assert_msg(std::strstr(fewer.message(), "parameter"), "%s", fewer.message());
    hk::kernel<void()> absent;
    ck_assert_int_eq(absent.bind(rt, "sim", "nope"), HK_ERR_NOT_FOUND);
    ck_assert_msg(std::strstr(absent.message(), "kernel 'nope' of module 'sim'"), "%s",
                  absent.message());

    /* The constructor: hk::error with exceptions, an invalid handle without. */
#if HK_CXX_EXCEPTIONS
    bool thrown = false;
    try {
        hk::kernel<void(int *, unsigned long long)> k(rt, "sim", "step");
        ck_abort_msg("bound a kernel of another layout");
    } catch (const hk::error &e) {
        thrown = true;
        ck_assert_int_eq(e.code(), HK_ERR_LAYOUT);
        ck_assert_msg(std::strstr(e.what(), "parameter 1 was 8 bytes"), "what: %s", e.what());
    }
    ck_assert(thrown);
#else
    hk::kernel<void(int *, unsigned long long)> k(rt, "sim", "step");
    ck_assert(!k.valid());
    ck_assert_int_eq(k.error(), HK_ERR_LAYOUT);
    ck_assert_msg(std::strstr(k.message(), "parameter 1 was 8 bytes"), "%s", k.message());
#endif

    /* A refused bind requires nothing: the layout may still change, and
     * the signature binds once the kernel takes it. */
    swap_ok("sim", 2, 1, true);
    ck_assert_int_eq(wide.bind(rt, "sim", "step"), 0);
    ck_assert(wide.valid());
    ck_assert_str_eq(wide.message(), "");
    ck_assert(wide(1, 1)(&out, 1ull).ok());
    ck_assert_int_eq(out, 2);
}
END_TEST

START_TEST(bound_layout_holds_for_every_later_version) {
    hk::report rep;
    swap_ok("sim", 1, 0);
    swap_ok("sim", 2, 1, true);
    swap_ok("sim", 3, 0, true);
    hk::kernel<step_sig> step(rt, "sim", "step");
    ck_assert_msg(step.valid(), "%s", step.message());
    int out = -1;

    /* accept_layout_change cannot undo a typed handle's layout. */
    ck_assert_int_eq(swap_ptx("sim", 4, 1, true, rep), HK_ERR_LAYOUT);
    ck_assert_msg(std::strstr(rep.message, "no version may change"), "%s", rep.message);
    ck_assert(step(1, 1)(&out, 1u).ok());
    ck_assert_int_eq(out, 3);

    /* Nor can a rollback to a kept image of the other layout (v2's). */
    hk_report_clear(&rep);
    ck_assert_int_eq(rt.rollback("sim", &rep), HK_ERR_LAYOUT);
    ck_assert_msg(std::strstr(rep.message, "no version may change"), "%s", rep.message);
    ck_assert_uint_eq(rt.version("sim"), 3);
    ck_assert(step(1, 1)(&out, 1u).ok());
    ck_assert_int_eq(out, 3);

    /* A version with the same layout commits. */
    swap_ok("sim", 5, 0);
    ck_assert(step(1, 1)(&out, 1u).ok());
    ck_assert_int_eq(out, 5);
}
END_TEST

START_TEST(pinned_launches) {
    swap_ok("sim", 1, 1); /* v1: step(u64 out, u64 n) */
    hk::pin old(rt, "sim");
    ck_assert(old.valid());
    ck_assert_uint_eq(old.version(), 1);
    swap_ok("sim", 2, 0, true); /* no handle yet: the change is accepted */
    hk::kernel<step_sig> step(rt, "sim", "step");
    ck_assert_msg(step.valid(), "%s", step.message());

    /* A pin older than the binding: its layout was never checked. */
    int out = -1, before = fake_launches();
    ck_assert_int_eq(step(1, 1).pinned(old)(&out, 1u).error, HK_ERR_LAYOUT);
    ck_assert_int_eq(step.launch_pinned(old, 1, 1, 0, nullptr, &out, 1u).error, HK_ERR_LAYOUT);
    ck_assert_int_eq(fake_launches(), before);

    hk::pin cur(rt, "sim");
    ck_assert_uint_eq(cur.version(), 2);
    swap_ok("sim", 3, 0);
    ck_assert(step(1, 1).pinned(cur)(&out, 1u).ok());
    ck_assert_int_eq(out, 2);
    out = -1;
    ck_assert(step.launch_pinned(cur, 1, 1, 0, nullptr, &out, 1u).ok());
    ck_assert_int_eq(out, 2);
    ck_assert(step(1, 1)(&out, 1u).ok());
    ck_assert_int_eq(out, 3);

    /* Moved pins keep the version; an empty one launches nothing. */
    hk::pin moved = std::move(cur);
    ck_assert(!cur.valid());
    ck_assert_uint_eq(moved.version(), 2);
    before = fake_launches();
    ck_assert_int_eq(step(1, 1).pinned(cur)(&out, 1u).error, HK_ERR_INVALID);
    ck_assert_int_eq(fake_launches(), before);

    hk::pin none;
    ck_assert_int_eq(none.take(rt.get(), "absent"), HK_ERR_NOT_FOUND);
    ck_assert_msg(std::strstr(none.message(), "pinning module 'absent'"), "%s", none.message());
#if HK_CXX_EXCEPTIONS
    bool thrown = false;
    try {
        hk::pin p(rt, "absent");
    } catch (const hk::error &e) {
        thrown = e.code() == HK_ERR_NOT_FOUND;
    }
    ck_assert(thrown);
#else
    hk::pin p(rt, "absent");
    ck_assert(!p.valid());
    ck_assert_int_eq(p.error(), HK_ERR_NOT_FOUND);
#endif
}
END_TEST

START_TEST(unbound_handle_launches_nothing) {
    swap_ok("sim", 1, 0);
    hk::kernel<step_sig> step;
    ck_assert(!step.valid());
    ck_assert_int_eq(step.error(), 0);
    int out = -1, before = fake_launches();
    ck_assert_int_eq(step(1, 1)(&out, 1u).error, HK_ERR_INVALID);
    ck_assert_int_eq(step.launch(hk::launch_config(1, 1), &out, 1u).error, HK_ERR_INVALID);
    ck_assert_int_eq(fake_launches(), before);

    /* No runtime: hk_kernel_get's HK_ERR_INVALID. */
    hk::runtime empty;
    ck_assert_int_eq(step.bind(empty, "sim", "step"), HK_ERR_INVALID);
    ck_assert_msg(std::strstr(step.message(), hk_strerror(HK_ERR_INVALID)), "%s", step.message());
}
END_TEST

START_TEST(launch_failure_reports_cu_result) {
    swap_ok("sim", 1, 0);
    hk::kernel<step_sig> step(rt, "sim", "step");
    int out = -1;
    fake_fail("cuLaunchKernel", 1, CUDA_ERROR_INVALID_VALUE);
    hk::launch_status st = step(1, 1)(&out, 1u);
    ck_assert_int_eq(st.error, HK_ERR_CUDA);
    ck_assert_int_eq(st.cu_result, CUDA_ERROR_INVALID_VALUE);
    ck_assert(!st.ok());
    st = step(1, 1)(&out, 1u);
    ck_assert(st.ok());
    ck_assert_int_eq(st.cu_result, 0);
    ck_assert_int_eq(out, 1);
}
END_TEST

START_TEST(runtime_wrapper) {
    /* Swaps through the wrapper; a refusal comes back in the report, whose
     * log the report frees (the sanitizer build checks for leaks). */
    swap_ok("sim", 1, 0);
    ck_assert_uint_eq(rt.version("sim"), 1);
    {
        hk::report rep;
        char bad[4096];
        std::snprintf(bad, sizeof bad, "%s\nSYNTAX ERROR\n", fake_ptx(9, 0, 0, 0));
        ck_assert_int_eq(rt.swap("sim", bad, std::strlen(bad), nullptr, &rep), HK_ERR_COMPILE);
        ck_assert_msg(rep.message[0] != 0, "no message");
        ck_assert_ptr_nonnull(rep.log); /* the JIT's log, owned by the report */
    }
    ck_assert_uint_eq(rt.version("sim"), 1);
    ck_assert_int_eq(rt.safe_point(), 0);

    /* Moves hand the runtime over; release and adopt too. */
    hk::runtime other = std::move(rt);
    ck_assert(!rt.valid());
    ck_assert(other.valid());
    ck_assert_uint_eq(other.version("sim"), 1);
    hk_runtime *raw = other.release();
    ck_assert(!other.valid());
    rt = hk::runtime::adopt(raw);
    ck_assert_ptr_eq(rt.get(), raw);

    /* An empty runtime answers HK_ERR_INVALID. */
    hk::runtime empty;
    ck_assert(!empty.valid());
    ck_assert_int_eq(empty.swap("sim", "x"), HK_ERR_INVALID);
    ck_assert_int_eq(empty.safe_point(), HK_ERR_INVALID);
    ck_assert_uint_eq(empty.version("sim"), 0);
    ck_assert_int_eq(empty.rollback("sim"), HK_ERR_INVALID);
}
END_TEST

/* Creation through the public API, with no driver to load. */
START_TEST(runtime_creation_failure) {
    setenv("HK_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    hk::runtime r;
    ck_assert_int_eq(r.open(), HK_ERR_NO_DRIVER);
    ck_assert(!r.valid());
    ck_assert_int_eq(r.error(), HK_ERR_NO_DRIVER);
    ck_assert_msg(std::strstr(r.message(), "creating the runtime") &&
                      std::strstr(r.message(), "no CUDA driver"),
                  "%s", r.message());
#if HK_CXX_EXCEPTIONS
    bool thrown = false;
    try {
        hk::runtime t(nullptr);
    } catch (const hk::error &e) {
        thrown = true;
        ck_assert_int_eq(e.code(), HK_ERR_NO_DRIVER);
        ck_assert_msg(std::strstr(e.what(), "no CUDA driver"), "%s", e.what());
    }
    ck_assert(thrown);
#else
    hk::runtime t(nullptr);
    ck_assert(!t.valid());
    ck_assert_int_eq(t.error(), HK_ERR_NO_DRIVER);
#endif
    unsetenv("HK_LIBCUDA");
}
END_TEST

/* The layouts hk::kernel computes from a signature are those a check of the
 * compiled kernel lists (hk_check, no driver), so hk_kernel_require_layout
 * accepts the kernel a typed handle was written for. */
struct check_params {
    float dt;
    int steps;
};

START_TEST(typed_layouts_match_checked_kernels) {
    static const char src[] =
        "struct params { float dt; int steps; };\n"
        "struct __align__(16) wide { double a, b; };\n"
        "extern \"C\" __global__ void k(char c, double d, int *p, float4 v, wide w, params s,\n"
        "                               short q) {}\n";
    struct alignas(16) check_wide {
        double a, b;
    };
    using typed = hk::kernel<void(char, double, int *, float4, check_wide, check_params, short)>;
    hk_check_options o;
    hk_check_options_init(&o);
    o.arch = 90;
    hk_check_result *r = nullptr;
    hk::report rep;
    int err = hk_check(&o, src, sizeof src - 1, &r, &rep);
    ck_assert_msg(err == 0, "%s\n%s", rep.message, rep.log ? rep.log : "");
    const char *name = nullptr;
    const size_t *offsets = nullptr, *sizes = nullptr;
    ck_assert_int_eq(hk_check_result_kernel(r, 0, &name, &offsets, &sizes),
                     static_cast<int>(typed::arity));
    ck_assert_str_eq(name, "k");
    for (std::size_t i = 0; i < typed::arity; i++) {
        ck_assert_uint_eq(offsets[i], typed::offsets[i]);
        ck_assert_uint_eq(sizes[i], typed::sizes[i]);
    }
    hk_check_result_free(r);
}
END_TEST

int main() {
    Suite *s = suite_create(HK_CXX_EXCEPTIONS ? "cpp" : "cpp_noexcept");
    TCase *tc = tcase_create("typed");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, typed_handle_launches_current_version);
    tcase_add_test(tc, call_forms_reach_the_driver);
    tcase_add_test(tc, arguments_converted_to_parameter_types);
    tcase_add_test(tc, other_layout_refused_at_bind);
    tcase_add_test(tc, bound_layout_holds_for_every_later_version);
    tcase_add_test(tc, pinned_launches);
    tcase_add_test(tc, unbound_handle_launches_nothing);
    tcase_add_test(tc, launch_failure_reports_cu_result);
    tcase_add_test(tc, runtime_wrapper);
    suite_add_tcase(s, tc);
    TCase *bare = tcase_create("create");
    tcase_add_test(bare, runtime_creation_failure);
    tcase_add_test(bare, typed_layouts_match_checked_kernels);
    suite_add_tcase(s, bare);
    return hkt_run(s);
}

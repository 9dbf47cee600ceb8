/*
 * hotkern.hpp's compile-time checks, for tests/cpp/compile-fail.sh. As it
 * stands (no HK_CASE_* defined) this translation unit must compile, without
 * a warning under strict flags: every launch form, the conversions the
 * argument rule lets through, the layouts it computes and the rule as a
 * table (accepts). With one HK_CASE_* defined it must not compile, and the
 * error must carry that case's message (the script holds the table). Each
 * case changes one thing in a launch that compiles.
 */
#include <cuda_runtime_api.h> /* dim3, cudaStream_t, float4 (host declarations only) */

#include "hotkern/hotkern.hpp"

/* Globals named like the header's constructor parameters: -Wshadow stays
 * quiet about the header (its note on g++). */
int module, name, shm;

namespace {

struct params {
    float dt;
    int steps;
};
struct other {
    float dt;
    int steps;
};
struct alignas(16) wide {
    double a, b;
};
enum class mode { fast, exact };

using step_k = hk::kernel<void(float *, unsigned)>;

/* ---- layouts: CUDA's parameter ABI ------------------------------------ */

using mixed = hk::kernel<void(char, double, int *)>;
static_assert(mixed::arity == 3);
static_assert(mixed::offsets[0] == 0 && mixed::offsets[1] == 8 && mixed::offsets[2] == 16);
static_assert(mixed::sizes[0] == 1 && mixed::sizes[1] == 8 && mixed::sizes[2] == 8);
using packed = hk::kernel<void(char, short, int, char, long long)>;
static_assert(packed::offsets[1] == 2 && packed::offsets[2] == 4 && packed::offsets[3] == 8 &&
              packed::offsets[4] == 16);
using vec = hk::kernel<void(char, float4, wide, params)>;
static_assert(vec::offsets[1] == 16 && vec::sizes[1] == 16);
static_assert(vec::offsets[2] == 32 && vec::sizes[2] == 16);
static_assert(vec::offsets[3] == 48 && vec::sizes[3] == 8);
static_assert(step_k::offsets[1] == 8 && step_k::sizes[1] == 4); /* fake_ptx's step */
static_assert(hk::kernel<void()>::arity == 0);

/* ---- dimensions and streams -------------------------------------------- */

static_assert(std::is_convertible_v<dim3, hk::dims> && std::is_convertible_v<uint3, hk::dims>);
static_assert(std::is_convertible_v<hk_dim3, hk::dims> &&
              std::is_convertible_v<unsigned, hk::dims>);
static_assert(!std::is_convertible_v<float3, hk::dims>);
static_assert(std::is_convertible_v<cudaStream_t, hk::stream>);
static_assert(!std::is_convertible_v<float *, hk::stream>);
static_assert(!std::is_convertible_v<void *, hk::stream>); /* hk::stream::raw() */

/* ---- the argument rule as a table -------------------------------------- */

template <class Sig, class... A> constexpr bool ok = hk::kernel<Sig>::template accepts<A...>;

/* pointers */
static_assert(ok<void(float *), float *>);
static_assert(ok<void(float *), float *const>);
static_assert(ok<void(float *), decltype(nullptr)>);
static_assert(ok<void(const float *), float *>); /* adding const */
static_assert(ok<void(const float *), const float *>);
static_assert(ok<void(float *), float (&)[4]>); /* an array decays */
static_assert(ok<void(void *), double *>);      /* void * takes any object pointer */
static_assert(ok<void(const void *), const int *>);
static_assert(ok<void(float **), float **>);
static_assert(!ok<void(float *), double *>);
static_assert(!ok<void(float *), const float *>); /* dropping const */
static_assert(!ok<void(void *), const int *>);
static_assert(!ok<void(float *), int>); /* not even 0 */
static_assert(!ok<void(float *), void *>);
static_assert(!ok<void(int *), unsigned *>);
static_assert(!ok<void(float **), const float **>);
/* arithmetic: implicit and not narrowing */
static_assert(ok<void(unsigned), unsigned>);
static_assert(ok<void(unsigned), unsigned short>);
static_assert(ok<void(unsigned long long), unsigned>);
static_assert(ok<void(long long), int>);
static_assert(ok<void(long long), unsigned>);
static_assert(ok<void(double), float>);
static_assert(ok<void(int), const int &>);
static_assert(ok<void(int), char>);
static_assert(!ok<void(unsigned), int>); /* sign */
static_assert(!ok<void(int), unsigned>);
static_assert(!ok<void(int), long long>);
static_assert(!ok<void(unsigned), unsigned long long>);
static_assert(!ok<void(float), double>);
static_assert(!ok<void(float), int>);
static_assert(!ok<void(int), float>);
static_assert(!ok<void(bool), int>);
static_assert(!ok<void(bool), float *>);
static_assert(!ok<void(unsigned long long), int *>);
static_assert(!ok<void(int), mode>);
/* everything else: exactly the type */
static_assert(ok<void(params), params>);
static_assert(ok<void(params), const params &>);
static_assert(ok<void(mode), mode>);
static_assert(ok<void(float4), float4>);
static_assert(!ok<void(params), other>);
static_assert(!ok<void(mode), int>);
static_assert(!ok<void(float4), float>);
/* count */
static_assert(ok<void()>);
static_assert(!ok<void(float *, unsigned), float *>);
static_assert(!ok<void(float *), float *, unsigned>);

/* ---- every launch form compiles (never run: compile-only) --------------- */

[[maybe_unused]] int launches(hk_runtime *rt, float *x, const float *cx, double *dx, unsigned n,
                              int i, cudaStream_t s, void *raw, params p) {
    step_k step(rt, "particles", "step");
    hk::kernel<void(const float *, params, mode, float)> other_k(rt, "m", "k");
    hk::launch_status st{0, 0};
    dim3 grid(4), block(256);
    st = step(grid, block)(x, n);
    st = step(grid, block, 1024)(x, n);
    st = step(grid, block, 1024, s)(x, n);
    st = step(4, 256, 0, 0)(x, 5u);
    st = step({2, 2}, hk_dim3{8, 8, 1})(nullptr, n);
    st = step.launch(grid, block, s, x, n);
    st = step.launch(4, 256, nullptr, x, n);
    st = step.launch(4, 256, hk::stream::raw(raw), x, n);
    st = step(hk::launch_config(grid, block).cluster(2).cooperative().priority(1))(x, n);
    hk_launch_config c;
    hk_launch_config_init(&c);
    st = step.launch(c, x, n);
    st = step(c)(x, n);
    hk::pin pinned(rt, "particles");
    st = step(grid, block).pinned(pinned)(x, n);
    st = step.launch_pinned(pinned, grid, block, 0, s, x, n);
    st = other_k(1, 1)(cx, p, mode::exact, 1.0f);
    hk::kernel<void()> none(rt, "m", "none");
    st = none(1, 1)();
    (void)dx;
    (void)i;

#if defined(HK_CASE_POINTEE)
    st = step(grid, block)(dx, n);
#elif defined(HK_CASE_FEWER)
    st = step(grid, block)(x);
#elif defined(HK_CASE_MORE)
    st = step.launch(grid, block, s, x, n, n);
#elif defined(HK_CASE_SIGN)
    st = step(grid, block)(x, i);
#elif defined(HK_CASE_LITERAL)
    st = step(grid, block)(x, 5);
#elif defined(HK_CASE_NARROW_FLOAT)
    st = other_k(1, 1)(cx, p, mode::exact, 1.0);
#elif defined(HK_CASE_INT_FOR_POINTER)
    st = step(grid, block)(0, n);
#elif defined(HK_CASE_DROPS_CONST)
    st = step(grid, block)(cx, n);
#elif defined(HK_CASE_STRUCT)
    st = other_k(1, 1)(cx, other{1.0f, 2}, mode::exact, 1.0f);
#elif defined(HK_CASE_ENUM)
    st = other_k(1, 1)(cx, p, 1, 1.0f);
#elif defined(HK_CASE_CONFIG_FORM)
    st = step(c)(dx, n);
#elif defined(HK_CASE_LAUNCH_EX_FORM)
    st = step.launch(c, x, i);
#elif defined(HK_CASE_PINNED_FORM)
    st = step.launch_pinned(pinned, grid, block, 0, s, dx, n);
#elif defined(HK_CASE_NO_STREAM)
    st = step.launch(grid, block, x, n);
#elif defined(HK_CASE_REFERENCE)
    hk::kernel<void(int &)> ref(rt, "m", "k");
#elif defined(HK_CASE_NOT_TRIVIAL)
    struct owner {
        owner(const owner &) {}
    };
    hk::kernel<void(owner)> nt(rt, "m", "k");
#elif defined(HK_CASE_SIGNATURE)
    hk::kernel<int(int)> ret(rt, "m", "k");
#endif
    return st.error;
}

/* The C API of checks, from C++ under the strict flags: options from
 * arrays of const strings, the layout handed on to hk_kernel_require_layout
 * as a typed handle does. */
[[maybe_unused]] int checks(hk_kernel *k, const char *src, std::size_t size) {
    static const char *const opts[] = {"-DN=4", "-std=c++17"};
    static const char *const exprs[] = {"scale<float>"};
    static const hk_header headers[] = {{"n.h", "#define M 2", 11}};
    hk_check_options o;
    hk_check_options_init(&o);
    o.arch = 90;
    o.nvrtc_options = opts;
    o.nnvrtc_options = 2;
    o.name_expressions = exprs;
    o.nname_expressions = 1;
    o.headers = headers;
    o.nheaders = 1;
    hk::report rep;
    hk_checker *c = nullptr;
    int err = hk_checker_create(&c, &o, &rep);
    hk_check_result *r = nullptr;
    if (err == 0)
        err = hk_checker_check(c, "k.cu", src, size, &r, &rep);
    const char *name = nullptr;
    const std::size_t *offsets = nullptr, *sizes = nullptr;
    int n = err == 0 ? hk_check_result_kernel(r, 0, &name, &offsets, &sizes) : err;
    if (n >= 0)
        err = hk_kernel_require_layout(k, offsets, sizes, n, &rep);
    std::size_t image_size = 0;
    hk_format fmt = HK_FORMAT_AUTO;
    const void *image = hk_check_result_image(r, &image_size, &fmt);
    uint64_t gsize = 0;
    int is_const = 0;
    (void)hk_check_result_global(r, 0, &name, &gsize, &is_const);
    if (image && hk_check_result_arch_count(r) > 0 && hk_check_result_arch(r, 0) &&
        hk_check_result_log(r) && hk_check_result_format(r) == HK_FORMAT_CUDA_C &&
        hk_format_detect(image, image_size, &fmt, &rep) == 0)
        err = hk_check_result_global_count(r) + hk_check_result_kernel_count(r);
    hk_check_result_free(r);
    hk_checker_destroy(c);
    return err;
}

} // namespace

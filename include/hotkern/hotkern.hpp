/*
 * hotkern.hpp: typed launches for new code. Header-only C++17 over the C API
 * of hotkern.h, which stays the reference for every guarantee (versions,
 * swaps, the launch path).
 *
 *   #include <hotkern/hotkern.hpp>
 *
 *   hk::runtime rt(nullptr);                      // device 0, default options
 *   hk::report rep;
 *   if (rt.swap("particles", cuda_c_source, nullptr, &rep)) ... // rep.message says why
 *   hk::kernel<void(float *, int)> step(rt, "particles", "step");
 *   step(grid, block)(d_x, n);                    // step<<<grid, block>>>(d_x, n)
 *   step(grid, block, shmem, stream)(d_x, n);     // step<<<grid, block, shmem, stream>>>
 *   step.launch(grid, block, stream, d_x, n);
 *   step(hk::launch_config(grid, block).cluster(2).priority(1))(d_x, n);
 *
 * What it adds to the C API:
 * - The kernel's signature is part of the handle's type. Each launch's
 *   arguments are checked against it at compile time (the rule: see
 *   "Argument rule" below) and a misuse is a static_assert whose message
 *   starts with "hk::kernel:". The header builds the argument array: no
 *   void ** in the caller's code.
 * - The signature's parameter layout is computed at compile time with CUDA's
 *   kernel parameter ABI (parameter i at the next offset aligned to
 *   alignof(Pi), sizeof(Pi) bytes; the host compiler's alignof, which CUDA's
 *   own types such as float4 carry with __align__ on both sides) and
 *   required of the kernel when the handle binds, through
 *   hk_kernel_require_layout: a kernel whose current version takes other
 *   parameters is refused there with HK_ERR_LAYOUT, and from then on every
 *   version whose layout differs is refused by its swap with HK_ERR_LAYOUT,
 *   accept_layout_change or not. So a typed handle never launches a version
 *   with other parameters than it was compiled for.
 *
 * Argument rule (checked per argument; A is the argument's type after decay,
 * P the declared parameter's):
 * - the number of arguments is the number of parameters;
 * - P a pointer: A is a pointer to the same type up to cv-qualifiers, and
 *   converts to P (adding const is fine, dropping it is not), or nullptr; a
 *   P of (cv) void * takes any object pointer. No derived-to-base, no
 *   integer 0: a double * for a float * is refused;
 * - P arithmetic (integers, floating point, bool): A converts to P
 *   implicitly and P{a} is not a narrowing conversion, as C++ defines it for
 *   brace initialisation. Widening passes (int for long long, float for
 *   double, unsigned for unsigned long long); anything that may lose values
 *   or change sign is refused, literals included, since the check sees
 *   types, not values: pass 5u for unsigned, 0.5f for float, or cast. A
 *   pointer is never an arithmetic argument;
 * - any other P (structs passed by value, enums, vector types): A is exactly
 *   P.
 * hk::kernel<Sig>::accepts<A...> is the same rule as a constant, for
 * callers that want to test it themselves.
 *
 * Errors. Launches return hk::launch_status and never throw. Binding a
 * kernel, creating a runtime and taking a pin report failure two ways:
 * bind(), open() and take() return 0 or the HK_ERR_* code and never throw;
 * the constructors that do the same work throw hk::error when the
 * translation unit is compiled with exceptions (__cpp_exceptions, and
 * HK_NO_EXCEPTIONS not defined), and otherwise leave the object invalid.
 * Either way valid(), error() and message() (the hk_strerror text and the
 * hk_report's message) tell what happened. HK_CXX_EXCEPTIONS says which
 * model the constructors follow. Build every translation unit of a program
 * alike here (exceptions, HK_NO_EXCEPTIONS): the linker keeps one copy of
 * each inline constructor, so a program that mixes them gets one model.
 *
 * Ownership and threads follow hotkern.h: a kernel handle and a pin belong
 * to their runtime and must not be used after it is destroyed; launches are
 * safe from any thread; the objects here are otherwise not thread-safe (one
 * thread binds or moves an object while no other uses it).
 *
 * Since 1.2: everything here came with hotkern 1.2 (header-only, it adds
 * no symbol to the libraries).
 */
#ifndef HOTKERN_HPP
#define HOTKERN_HPP

#if __cplusplus < 201703L
#error "hotkern.hpp needs C++17 (-std=c++17)"
#endif

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "hotkern.h"

#if defined(__cpp_exceptions) && !defined(HK_NO_EXCEPTIONS)
#define HK_CXX_EXCEPTIONS 1
#else
#define HK_CXX_EXCEPTIONS 0
#endif

/* CUDA's stream type (cudaStream_t and CUstream are both struct CUstream_st *),
 * declared as CUDA declares it, so that a stream is taken without the CUDA
 * headers and a stray pointer is not. */
struct CUstream_st;

/* g++ (12) checks a class template's constructor parameters for -Wshadow
 * again where the constructor is instantiated, in the including file, so a
 * program with a global named like one of them (rt, module, name) would get
 * a warning about this header it cannot fix. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"

namespace hk {

/* The exception the throwing constructors throw (only with exceptions on; the
 * type exists either way). code() is the HK_ERR_* code, what() the message. */
class error : public std::runtime_error {
  public:
    error(int code, const char *what) : std::runtime_error(what), code_(code) {}
    int code() const noexcept {
        return code_;
    }

  private:
    int code_;
};

namespace detail {

/* An owned copy of a message, allocated only on failure and never throwing:
 * when memory runs out the message is lost and "" is read. */
class message {
  public:
    message() noexcept = default;
    message(const message &o) noexcept : text_(dup(o.text_)) {}
    message(message &&o) noexcept : text_(o.text_) {
        o.text_ = nullptr;
    }
    message &operator=(const message &o) noexcept {
        if (this != &o)
            set(o.text_);
        return *this;
    }
    message &operator=(message &&o) noexcept {
        std::swap(text_, o.text_);
        return *this;
    }
    ~message() {
        std::free(text_);
    }
    void set(const char *s) noexcept {
        char *t = dup(s);
        std::free(text_);
        text_ = t;
    }
    const char *get() const noexcept {
        return text_ ? text_ : "";
    }

  private:
    static char *dup(const char *s) noexcept {
        if (!s)
            return nullptr;
        std::size_t n = std::strlen(s) + 1;
        char *p = static_cast<char *>(std::malloc(n));
        if (p)
            std::memcpy(p, s, n);
        return p;
    }
    char *text_ = nullptr;
};

/* The outcome of the last bind / open / take of an object. */
class status {
  public:
    int code() const noexcept {
        return code_;
    }
    /* "WHAT: hk_strerror text[: report message]", or "" when code is 0. */
    const char *text() const noexcept {
        const char *t = text_.get();
        return *t || !code_ ? t : hk_strerror(code_);
    }
    void clear() noexcept {
        code_ = 0;
        text_.set(nullptr);
    }
    void failed(int code, const hk_report *rep, const char *what) noexcept {
        char buf[sizeof rep->message + 320];
        const char *detail = rep && rep->message[0] ? rep->message : "";
        std::snprintf(buf, sizeof buf, "%s: %s%s%s", what, hk_strerror(code), *detail ? ": " : "",
                      detail);
        code_ = code;
        text_.set(buf);
    }
    /* Throws hk::error for a failure when exceptions are on. */
    void raise() const {
#if HK_CXX_EXCEPTIONS
        if (code_)
            throw error(code_, text());
#endif
    }

  private:
    int code_ = 0;
    message text_;
};

inline const char *or_null(const char *s) noexcept {
    return s ? s : "(null)";
}

/* T has integer members x, y and z (dim3, uint3, hk_dim3; not float3). */
template <class T> using member_x = std::decay_t<decltype(std::declval<const T &>().x)>;
template <class T> using member_y = std::decay_t<decltype(std::declval<const T &>().y)>;
template <class T> using member_z = std::decay_t<decltype(std::declval<const T &>().z)>;
template <class T, class = void> struct has_xyz : std::false_type {};
template <class T>
struct has_xyz<T, std::void_t<member_x<T>, member_y<T>, member_z<T>>>
    : std::bool_constant<std::is_integral_v<member_x<T>> && std::is_integral_v<member_y<T>> &&
                         std::is_integral_v<member_z<T>>> {};

template <class... T> struct types {};

template <class T> constexpr bool always_false = false;

/* What the argument rule says of one argument. */
enum class verdict { ok, not_pointer, pointee, drops_const, narrowing, not_exact };

template <class P, class A, class = void> struct list_init : std::false_type {};
template <class P, class A>
struct list_init<P, A, std::void_t<decltype(P{std::declval<A>()})>> : std::true_type {};

template <class P, class Arg> constexpr verdict judge() noexcept {
    using A = std::decay_t<Arg>;
    if constexpr (std::is_pointer_v<P>) {
        using PT = std::remove_pointer_t<P>;
        if constexpr (std::is_null_pointer_v<A>) {
            return verdict::ok;
        } else if constexpr (!std::is_pointer_v<A>) {
            return verdict::not_pointer;
        } else {
            using AT = std::remove_pointer_t<A>;
            if constexpr (!std::is_same_v<std::remove_cv_t<PT>, std::remove_cv_t<AT>> &&
                          !(std::is_void_v<PT> && std::is_object_v<AT>))
                return verdict::pointee;
            else if constexpr (!std::is_convertible_v<A, P>)
                return verdict::drops_const;
            else
                return verdict::ok;
        }
    } else if constexpr (std::is_arithmetic_v<P>) {
        if constexpr (!std::is_pointer_v<A> && !std::is_null_pointer_v<A> &&
                      std::is_convertible_v<A, P> && list_init<P, A>::value)
            return verdict::ok;
        else
            return verdict::narrowing;
    } else {
        return std::is_same_v<A, P> ? verdict::ok : verdict::not_exact;
    }
}

template <class... P, class... A> constexpr bool accepts(types<P...>, types<A...>) noexcept {
    if constexpr (sizeof...(P) != sizeof...(A))
        return false;
    else
        return ((judge<P, A>() == verdict::ok) && ... && true);
}

/* The rule again, as compile errors: argument I (from 0) of type A for
 * parameter type P. The compiler's note on this instantiation names them. */
template <std::size_t I, class P, class A> constexpr bool check_argument() noexcept {
    constexpr verdict v = judge<P, A>();
    static_assert(v != verdict::not_pointer,
                  "hk::kernel: a pointer parameter takes a pointer or nullptr, not an integer or "
                  "an object");
    static_assert(v != verdict::pointee,
                  "hk::kernel: a pointer argument points to another type than the kernel's "
                  "parameter (e.g. double * for float *)");
    static_assert(v != verdict::drops_const,
                  "hk::kernel: a pointer-to-const argument for a pointer-to-non-const parameter");
    static_assert(v != verdict::narrowing,
                  "hk::kernel: an arithmetic parameter takes a number that converts to it without "
                  "narrowing or a change of sign (pass 5u for unsigned, 0.5f for float, or cast)");
    static_assert(v != verdict::not_exact,
                  "hk::kernel: a struct, enum or other non-arithmetic parameter takes an argument "
                  "of exactly its type");
    return v == verdict::ok;
}

template <class... P, class... A, std::size_t... I>
constexpr bool check_each(types<P...>, types<A...>, std::index_sequence<I...>) noexcept {
    /* Each is evaluated (no short circuit): every bad argument is reported. */
    return (static_cast<std::size_t>(check_argument<I, P, A>()) + ... + 0) == sizeof...(P);
}

template <class... P, class... A>
constexpr bool check_arguments(types<P...>, types<A...>) noexcept {
    static_assert(sizeof...(P) == sizeof...(A),
                  "hk::kernel: the launch passes another number of arguments than the kernel's "
                  "signature declares");
    if constexpr (sizeof...(P) != sizeof...(A))
        return false;
    else
        return check_each(types<P...>{}, types<A...>{}, std::index_sequence_for<P...>{});
}

/* CUDA's kernel parameter ABI: each parameter at the next offset aligned to
 * its alignment. */
template <class... P> constexpr std::array<std::size_t, sizeof...(P)> param_offsets() noexcept {
    std::array<std::size_t, sizeof...(P)> out{};
    constexpr std::size_t size[] = {sizeof(P)..., 0};
    constexpr std::size_t align[] = {alignof(P)..., 1};
    std::size_t at = 0;
    for (std::size_t i = 0; i < sizeof...(P); i++) {
        at = (at + align[i] - 1) / align[i] * align[i];
        out[i] = at;
        at += size[i];
    }
    return out;
}

/* The arguments as the kernel's parameter types, each at its own address,
 * and the array of those addresses cuLaunchKernel takes. Lives on the
 * launching thread's stack for the call; nothing is allocated. */
template <class... P> class arguments {
  public:
    template <class... A>
    explicit arguments(A &&...a) noexcept : values_(static_cast<P>(std::forward<A>(a))...) {
        point(std::index_sequence_for<P...>{});
    }
    arguments(const arguments &) = delete;
    arguments &operator=(const arguments &) = delete;
    /* NULL for a kernel without parameters. */
    void **get() noexcept {
        return sizeof...(P) ? ptr_ : nullptr;
    }

  private:
    template <std::size_t... I> void point(std::index_sequence<I...>) noexcept {
        ((ptr_[I] = static_cast<void *>(std::addressof(std::get<I>(values_)))), ...);
    }
    std::tuple<P...> values_;
    void *ptr_[sizeof...(P) ? sizeof...(P) : 1] = {};
};

} // namespace detail

/* Grid, block or cluster dimensions: from unsigned values (missing ones are
 * 1), hk_dim3, or any type with integer members x, y and z (CUDA's dim3 and
 * uint3 among them, without needing their headers; float3 is refused). */
struct dims {
    unsigned x = 1, y = 1, z = 1;

    constexpr dims() noexcept = default;
    constexpr dims(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) noexcept : x(x_), y(y_), z(z_) {}
    template <class D,
              std::enable_if_t<detail::has_xyz<D>::value && !std::is_same_v<D, dims>, int> = 0>
    constexpr dims(const D &d) noexcept
        : x(static_cast<unsigned>(d.x)), y(static_cast<unsigned>(d.y)),
          z(static_cast<unsigned>(d.z)) {}

    constexpr hk_dim3 c() const noexcept {
        return hk_dim3{x, y, z};
    }
};

/* A CUDA stream: cudaStream_t or CUstream, nullptr or 0 for the default
 * stream; stream::raw() wraps a void * (the C API's type). Anything else is
 * refused at compile time, so a launch that forgets its stream argument does
 * not take its first kernel argument for one. */
class stream {
  public:
    constexpr stream(CUstream_st *s = nullptr) noexcept : p_(s) {}
    static stream raw(void *s) noexcept {
        return stream(static_cast<CUstream_st *>(s));
    }
    constexpr void *get() const noexcept {
        return p_;
    }

  private:
    void *p_;
};

/* The outcome of one launch: error is 0 or an HK_ERR_* code (HK_ERR_CUDA
 * with the driver's CUresult in cu_result; the launch path's codes are
 * hk_launch's, plus HK_ERR_INVALID or the bind's code for a handle that did
 * not bind and HK_ERR_LAYOUT for a pin older than the binding). */
struct launch_status {
    int error;
    int cu_result;
    constexpr bool ok() const noexcept {
        return error == 0;
    }
};

/* An hk_report that initialises itself and releases its log when it goes
 * out of scope: pass &rep wherever hotkern takes an hk_report *. */
class report : public hk_report {
  public:
    report() noexcept {
        hk_report_init(this);
    }
    ~report() {
        hk_report_clear(this);
    }
    report(const report &) = delete;
    report &operator=(const report &) = delete;
};

/* An hk_launch_config, for launches with thread-block clusters, cooperative
 * grids, programmatic serialization or a priority (hk_launch_ex). Setters
 * return the configuration, to be chained. */
class launch_config {
  public:
    launch_config(dims grid, dims block, unsigned shared_bytes = 0, stream s = stream()) noexcept {
        hk_launch_config_init(&c_);
        c_.grid = grid.c();
        c_.block = block.c();
        c_.shared_bytes = shared_bytes;
        c_.stream = s.get();
    }
    launch_config &shared(unsigned bytes) noexcept {
        c_.shared_bytes = bytes;
        return *this;
    }
    launch_config &on(stream s) noexcept {
        c_.stream = s.get();
        return *this;
    }
    launch_config &cluster(dims d) noexcept {
        c_.cluster = d.c();
        return *this;
    }
    launch_config &cooperative(bool on_ = true) noexcept {
        c_.cooperative = on_;
        return *this;
    }
    launch_config &programmatic_serialization(bool on_ = true) noexcept {
        c_.programmatic_serialization = on_;
        return *this;
    }
    launch_config &priority(int p) noexcept {
        c_.priority = p;
        c_.has_priority = 1;
        return *this;
    }
    /* The C structure, for fields this class has no setter for. */
    hk_launch_config &c() noexcept {
        return c_;
    }
    const hk_launch_config &c() const noexcept {
        return c_;
    }
    operator const hk_launch_config &() const noexcept {
        return c_;
    }

  private:
    hk_launch_config c_;
};

/* Owns one hk_runtime (hk_runtime_create / hk_runtime_destroy). Move-only. */
class runtime {
  public:
    /* No runtime: valid() is false until open(). */
    runtime() noexcept = default;
    /* Creates one with opt (nullptr: the defaults, device 0), as
     * hk_runtime_create does. On failure throws hk::error (exceptions on) or
     * leaves the object invalid with error() and message(). */
    explicit runtime(const hk_options *opt) {
        open(opt);
        status_.raise();
    }
    /* Takes ownership of rt (may be NULL). */
    static runtime adopt(hk_runtime *rt) noexcept {
        runtime r;
        r.rt_ = rt;
        return r;
    }
    /* Destroys the runtime: hk_runtime_destroy's rules hold (no other thread
     * inside a hotkern call on it; every handle and pin of it becomes
     * invalid). */
    ~runtime() {
        close();
    }
    runtime(const runtime &) = delete;
    runtime &operator=(const runtime &) = delete;
    runtime(runtime &&o) noexcept : rt_(o.rt_), status_(std::move(o.status_)) {
        o.rt_ = nullptr;
    }
    runtime &operator=(runtime &&o) noexcept {
        if (this != &o) {
            close();
            rt_ = o.rt_;
            o.rt_ = nullptr;
            status_ = std::move(o.status_);
        }
        return *this;
    }

    /* Destroys any runtime held, then creates one; returns 0 or the HK_ERR_*
     * code (message() says why). Never throws. */
    int open(const hk_options *opt = nullptr) noexcept {
        close();
        hk_report rep;
        hk_report_init(&rep);
        int err = hk_runtime_create(&rt_, opt, &rep);
        if (err) {
            rt_ = nullptr;
            status_.failed(err, &rep, "creating the runtime");
        } else {
            status_.clear();
        }
        hk_report_clear(&rep);
        return err;
    }
    /* Destroys the runtime now (as the destructor does); nothing when none. */
    void close() noexcept {
        hk_runtime_destroy(rt_);
        rt_ = nullptr;
    }
    /* Gives the runtime up: the caller destroys it. */
    hk_runtime *release() noexcept {
        hk_runtime *r = rt_;
        rt_ = nullptr;
        return r;
    }
    hk_runtime *get() const noexcept {
        return rt_;
    }
    bool valid() const noexcept {
        return rt_ != nullptr;
    }
    /* The last open()'s outcome: 0 or its HK_ERR_* code, and its text. */
    int error() const noexcept {
        return status_.code();
    }
    const char *message() const noexcept {
        return status_.text();
    }

    /* hk_swap: builds, stages, validates and commits a version of module
     * `module` from the image (copied). Safe from any thread; returns 0 or the
     * HK_ERR_* code, rep (may be NULL) saying why. A refusal is an outcome,
     * not an exception: this never throws. */
    int swap(const char *module, const void *image, std::size_t size,
             const hk_swap_options *opt = nullptr, hk_report *rep = nullptr) const noexcept {
        return hk_swap(rt_, module, image, size, opt, rep);
    }
    int swap(const char *module, std::string_view image, const hk_swap_options *opt = nullptr,
             hk_report *rep = nullptr) const noexcept {
        return hk_swap(rt_, module, image.data(), image.size(), opt, rep);
    }
    /* hk_watch_dir: every save in dir becomes a version; the watch lasts as
     * long as the runtime. Safe from any thread. */
    int watch(const char *dir, const hk_swap_options *opt = nullptr,
              hk_report *rep = nullptr) const noexcept {
        return hk_watch_dir(rt_, dir, opt, rep);
    }
    /* hk_rollback, hk_safe_point, hk_module_version: as in hotkern.h. */
    int rollback(const char *module, hk_report *rep = nullptr) const noexcept {
        return hk_rollback(rt_, module, rep);
    }
    int safe_point() const noexcept {
        return hk_safe_point(rt_);
    }
    std::uint64_t version(const char *module) const noexcept {
        return hk_module_version(rt_, module);
    }

  private:
    hk_runtime *rt_ = nullptr;
    detail::status status_;
};

/* A pin of one module's current version (hk_pin_module / hk_unpin):
 * launches through it run that version. Move-only; it belongs to its
 * runtime, so it is released (destroyed) before the runtime is. */
class pin {
  public:
    pin() noexcept = default;
    /* Pins `module`'s current version; on failure throws hk::error
     * (exceptions on) or leaves the pin invalid. */
    pin(hk_runtime *rt, const char *module) {
        take(rt, module);
        status_.raise();
    }
    pin(const runtime &rt, const char *module) : pin(rt.get(), module) {}
    ~pin() {
        hk_unpin(p_);
    }
    pin(const pin &) = delete;
    pin &operator=(const pin &) = delete;
    pin(pin &&o) noexcept : p_(o.p_), status_(std::move(o.status_)) {
        o.p_ = nullptr;
    }
    pin &operator=(pin &&o) noexcept {
        if (this != &o) {
            unpin();
            p_ = o.p_;
            o.p_ = nullptr;
            status_ = std::move(o.status_);
        }
        return *this;
    }

    /* Releases any pin held, then pins `module`'s current version; returns 0
     * or the HK_ERR_* code. Never throws. Safe from any thread (the object
     * itself is the calling thread's). */
    int take(hk_runtime *rt, const char *module) noexcept {
        unpin();
        int err = hk_pin_module(rt, module, &p_);
        if (err) {
            p_ = nullptr;
            char what[128];
            std::snprintf(what, sizeof what, "pinning module '%s'", detail::or_null(module));
            status_.failed(err, nullptr, what);
        } else {
            status_.clear();
        }
        return err;
    }
    void unpin() noexcept {
        hk_unpin(p_);
        p_ = nullptr;
    }
    /* The pinned version's number, 0 when none is held. */
    std::uint64_t version() const noexcept {
        return p_ ? hk_pin_version(p_) : 0;
    }
    hk_pin *get() const noexcept {
        return p_;
    }
    bool valid() const noexcept {
        return p_ != nullptr;
    }
    int error() const noexcept {
        return status_.code();
    }
    const char *message() const noexcept {
        return status_.text();
    }

  private:
    hk_pin *p_ = nullptr;
    detail::status status_;
};

template <class Sig> class kernel {
    static_assert(detail::always_false<Sig>,
                  "hk::kernel<Sig>: Sig is a kernel's signature, void(parameter types...), e.g. "
                  "hk::kernel<void(float *, int)>");

  public:
    /* Any construction, so that the assertion above is the only error. */
    template <class... X> explicit kernel(X &&...) noexcept {}
};

template <class Sig> class launcher;
template <class Sig> class launcher_ex;

/* The handle of one kernel with signature void(P...): hk_kernel_get plus
 * the layout requirement above. Copyable (copies name the same hk_kernel);
 * valid until its runtime is destroyed. A launch is safe from any thread;
 * bind() and assignment are not safe while another thread launches through
 * the same object. */
template <class... P> class kernel<void(P...)> {
    static_assert((!std::is_reference_v<P> && ...),
                  "hk::kernel: a kernel parameter cannot be a reference (CUDA passes kernel "
                  "arguments by value)");
    static_assert((std::is_trivially_copyable_v<std::remove_reference_t<P>> && ...),
                  "hk::kernel: every kernel parameter must be trivially copyable (its bytes are "
                  "copied to the device)");

  public:
    /* The layout required at bind. */
    static constexpr std::size_t arity = sizeof...(P);
    static constexpr std::array<std::size_t, arity> sizes{{sizeof(P)...}};
    static constexpr std::array<std::size_t, arity> offsets = detail::param_offsets<P...>();
    /* Whether a launch with arguments of types A... is accepted (the
     * argument rule above, without the compile error). */
    template <class... A>
    static constexpr bool accepts = detail::accepts(detail::types<P...>{}, detail::types<A...>{});

    /* Not bound: valid() is false; launches return HK_ERR_INVALID. */
    kernel() noexcept = default;
    /* Binds (see bind); on failure throws hk::error (exceptions on) or leaves
     * the handle invalid with error() and message(). */
    kernel(hk_runtime *rt, const char *module, const char *name) {
        bind(rt, module, name);
        status_.raise();
    }
    kernel(const runtime &rt, const char *module, const char *name)
        : kernel(rt.get(), module, name) {}

    /* Takes kernel `name` of `module` (hk_kernel_get: the module's current
     * version must hold it) and requires this signature's layout of it
     * (hk_kernel_require_layout). Returns 0, or HK_ERR_NOT_FOUND, HK_ERR_LAYOUT
     * (the kernel takes other parameters; message() names the first
     * difference), HK_ERR_INVALID, HK_ERR_BUSY (from a check callback); the
     * handle is then invalid. Never throws. Safe from any thread, as its C
     * calls are; the object is the calling thread's meanwhile. */
    int bind(hk_runtime *rt, const char *module, const char *name) noexcept {
        k_ = nullptr;
        since_ = 0;
        hk_report rep;
        hk_report_init(&rep);
        hk_kernel *k = nullptr;
        int err = hk_kernel_get(rt, module, name, &k);
        if (err == 0)
            err = hk_kernel_require_layout(k, offsets.data(), sizes.data(), static_cast<int>(arity),
                                           &rep);
        if (err == 0) {
            k_ = k;
            /* Every version from the one current now has this layout; a pin
             * of an older one is refused (launch_pinned). */
            since_ = hk_module_version(rt, module);
            status_.clear();
        } else {
            char what[256];
            std::snprintf(what, sizeof what, "binding kernel '%s' of module '%s'",
                          detail::or_null(name), detail::or_null(module));
            status_.failed(err, &rep, what);
        }
        hk_report_clear(&rep);
        return err;
    }
    int bind(const runtime &rt, const char *module, const char *name) noexcept {
        return bind(rt.get(), module, name);
    }

    bool valid() const noexcept {
        return k_ != nullptr;
    }
    /* The last bind's outcome: 0 or its HK_ERR_* code, and its text. */
    int error() const noexcept {
        return status_.code();
    }
    const char *message() const noexcept {
        return status_.text();
    }
    /* The C handle, for the rest of the C API (attributes, tests, graphs);
     * NULL when not bound. */
    hk_kernel *get() const noexcept {
        return k_;
    }

    /* hk_launch of the current version on stream s (dynamic shared memory:
     * the call operator's form or a launch_config). Safe from any thread; no
     * lock, no allocation. */
    template <class... A>
    launch_status launch(dims grid, dims block, stream s, A &&...args) const noexcept {
        if constexpr (checks<A...>())
            return launch_shared(grid, block, 0, s, std::forward<A>(args)...);
        else
            return {HK_ERR_INVALID, 0}; /* not compiled: the check failed */
    }
    /* hk_launch_ex with c's options (clusters, cooperative, priority...). */
    template <class... A>
    launch_status launch(const hk_launch_config &c, A &&...args) const noexcept {
        if constexpr (checks<A...>())
            return with_arguments(
                [&](void **argv, int *cu) -> int { return hk_launch_ex(k_, &c, argv, cu); },
                std::forward<A>(args)...);
        else
            return {HK_ERR_INVALID, 0};
    }
    /* hk_launch_pinned: the version p holds. A pin of a version older than
     * the one current when this handle bound is refused with HK_ERR_LAYOUT
     * and nothing is launched: its layout was never checked (a pin taken
     * before binding, while a swap committed, can be refused although its
     * version had this layout). */
    template <class... A>
    launch_status launch_pinned(const pin &p, dims grid, dims block, unsigned shared_bytes,
                                stream s, A &&...args) const noexcept {
        if constexpr (checks<A...>()) {
            hk_dim3 g = grid.c(), b = block.c();
            hk_pin *hp = p.get();
            if (k_ && (!hp || hk_pin_version(hp) < since_))
                return {hp ? HK_ERR_LAYOUT : HK_ERR_INVALID, 0};
            return with_arguments(
                [&](void **argv, int *cu) -> int {
                    return hk_launch_pinned(hp, k_, g, b, shared_bytes, s.get(), argv, cu);
                },
                std::forward<A>(args)...);
        } else {
            return {HK_ERR_INVALID, 0};
        }
    }

    /* step(grid, block[, shared_bytes[, stream]])(args...), as
     * step<<<grid, block, shared_bytes, stream>>>(args...). The launcher
     * refers to this handle: use it within the statement. */
    launcher<void(P...)> operator()(dims grid, dims block, unsigned shared_bytes = 0,
                                    stream s = stream()) const noexcept {
        return launcher<void(P...)>(this, grid.c(), block.c(), shared_bytes, s);
    }
    /* step(config)(args...): hk_launch_ex (c is copied). */
    launcher_ex<void(P...)> operator()(const hk_launch_config &c) const noexcept {
        return launcher_ex<void(P...)>(this, c);
    }

  private:
    friend class launcher<void(P...)>;
    friend class launcher_ex<void(P...)>;

    template <class... A>
    launch_status launch_shared(dims grid, dims block, unsigned shared_bytes, stream s,
                                A &&...args) const noexcept {
        hk_dim3 g = grid.c(), b = block.c();
        return with_arguments(
            [&](void **argv, int *cu) -> int {
                return hk_launch(k_, g, b, shared_bytes, s.get(), argv, cu);
            },
            std::forward<A>(args)...);
    }

    /* The argument rule as compile errors, for arguments of types A... */
    template <class... A> static constexpr bool checks() noexcept {
        return detail::check_arguments(detail::types<P...>{}, detail::types<A...>{});
    }

    /* Calls call(argv, &cu) with the arguments laid out; checks() passed. */
    template <class Call, class... A>
    launch_status with_arguments(Call &&call, A &&...args) const noexcept {
        if (!k_)
            return {status_.code() ? status_.code() : HK_ERR_INVALID, 0};
        detail::arguments<P...> argv(std::forward<A>(args)...);
        int cu = 0;
        int err = call(argv.get(), &cu);
        return {err, err ? cu : 0};
    }

    hk_kernel *k_ = nullptr;
    std::uint64_t since_ = 0;
    detail::status status_;
};

/* What step(grid, block, shared_bytes, stream) returns: call it with the
 * kernel's arguments. pinned(p) launches through a pin instead. */
template <class... P> class launcher<void(P...)> {
  public:
    template <class... A> launch_status operator()(A &&...args) const noexcept {
        if constexpr (kernel<void(P...)>::template checks<A...>()) {
            if (pin_)
                return k_->launch_pinned(*pin_, grid_, block_, shared_, stream_,
                                         std::forward<A>(args)...);
            return k_->launch_shared(grid_, block_, shared_, stream_, std::forward<A>(args)...);
        } else {
            return {HK_ERR_INVALID, 0};
        }
    }
    /* The same launch through p (kept by reference: p outlives the call). */
    launcher pinned(const pin &p) const noexcept {
        launcher l = *this;
        l.pin_ = &p;
        return l;
    }

  private:
    friend class kernel<void(P...)>;
    launcher(const kernel<void(P...)> *k, hk_dim3 g, hk_dim3 b, unsigned shm, stream s) noexcept
        : k_(k), grid_(g), block_(b), shared_(shm), stream_(s) {}

    const kernel<void(P...)> *k_;
    dims grid_, block_;
    unsigned shared_;
    stream stream_;
    const pin *pin_ = nullptr;
};

/* What step(config) returns: call it with the kernel's arguments. */
template <class... P> class launcher_ex<void(P...)> {
  public:
    template <class... A> launch_status operator()(A &&...args) const noexcept {
        if constexpr (kernel<void(P...)>::template checks<A...>())
            return k_->launch(c_, std::forward<A>(args)...);
        else
            return {HK_ERR_INVALID, 0};
    }

  private:
    friend class kernel<void(P...)>;
    launcher_ex(const kernel<void(P...)> *k, const hk_launch_config &c) noexcept : k_(k), c_(c) {}

    const kernel<void(P...)> *k_;
    hk_launch_config c_;
};

} // namespace hk

#pragma GCC diagnostic pop

#endif /* HOTKERN_HPP */

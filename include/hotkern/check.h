/*
 * hotkern/check.h: a swap's build without a GPU.
 *
 * hk_check and the hk_checker build and validate a source for one
 * architecture exactly as a swap would, and list what its version would
 * hold, without the driver, a device or a runtime: `hotkern check`, CI
 * jobs and editors use it where hk_runtime_create fails. A result is an
 * immutable object of its own, read through accessors from any thread.
 *
 * Part of the C API of libhotkern: a program includes hotkern/hotkern.h,
 * which includes this header after its core (the two never include each
 * other; this one alone says so).
 */
#ifndef HOTKERN_H
#error "include <hotkern/hotkern.h>: it includes this header"
#endif

#ifndef HOTKERN_CHECK_H
#define HOTKERN_CHECK_H

#ifdef __cplusplus
extern "C" {
#endif

/* ---- checking without a GPU -------------------------------------------- */

/* A swap's build on its own, for `hotkern check`, CI pipelines and editors:
 * a source (CUDA C, PTX, cubin or fatbin) is compiled and validated for one
 * architecture as hk_swap builds it (NVRTC, nvJitLink, the PTX, cubin and
 * fatbin parsers, the architecture rule), and what a version made of it
 * would hold is listed: its kernels with their parameter layouts, its
 * globals, the architectures it has code for. Nothing here loads or calls
 * the CUDA driver: no device, no libcuda and no hk_runtime are needed, so
 * it works where hk_runtime_create fails (a CI machine without a GPU). No
 * compile cache is used: every check compiles.
 *
 * hk_check checks one source. A program that checks several sources with
 * the same options creates an hk_checker once and checks each with it: the
 * options, the in-memory headers and the include search path are then
 * taken in once, and its CUDA C builds use NVRTC's automatic precompiled
 * header (which NVRTC keeps for the process), made by the first build and
 * reused by every later one whose opening toolkit includes and options are
 * the same. As in a swap, the precompiled header covers the toolkit's
 * headers only; each source's own includes are read at each check, so a
 * header edited between two checks is seen. */

/* The first layout is the whole structure as first published (it ends at
 * source_name). Each field in full: hotkern-check(3). */
typedef struct hk_check_options {
    size_t size;                      /* set by hk_check_options_init */
    int arch;                         /* the target: 90 for sm_90 (compute capability 9.0), 10 to
                                       * 9999; no default (0 is refused) */
    int arch_specific;                /* 1: its architecture-specific variant (sm_90a), which runs
                                       * on that architecture only; default 0 */
    hk_format format;                 /* default AUTO: from the content */
    hk_ptx_mode ptx_mode;             /* HK_PTX_NVJITLINK (default): CUDA C and PTX become a cubin;
                                       * HK_PTX_DRIVER_JIT: PTX */
    int jit_opt_level;                /* 0..4, default 4 (as hk_options') */
    hk_build_profile build_profile;   /* default RELEASE (DEV: as in a
                                       * swap with that profile) */
    const char *const *nvrtc_options; /* extra NVRTC options (-D, -I,
                                       * -std...), as in hk_swap_options */
    int nnvrtc_options;
    const char *const *name_expressions; /* e.g. "scale<float>": template kernels
                                          * to instantiate */
    int nname_expressions;
    const hk_header *headers; /* in-memory headers (copied), as in
                               * hk_swap_options */
    int nheaders;
    const char *source_name; /* the source's path, for messages and its quoted includes; default
                              * "input.cu" ("input.ptx") */
} hk_check_options;

/* As hk_options_init_size, for check options. Since 1.3. */
HK_API int hk_check_options_init_size(hk_check_options *o, size_t size);

/* Fills o with the defaults, for the layout the program is built with.
 * Since 1.3. */
static inline void hk_check_options_init(hk_check_options *o) {
    (void)hk_check_options_init_size(o, sizeof *o);
}

/* What a check found. Opaque and immutable: its accessors may be called from
 * any thread; it does not depend on the checker that made it. */
typedef struct hk_check_result hk_check_result;
/* Options and state for checking many sources (see above). */
typedef struct hk_checker hk_checker;

/* The format of `size` bytes at `data` as hk_swap's and hk_check's
 * HK_FORMAT_AUTO finds it. Returns 0 with *fmt; HK_ERR_FORMAT, rep (may be
 * NULL) saying why ("empty input", "truncated ELF header" ...);
 * HK_ERR_INVALID. Safe from any thread. Since 1.3. */
HK_API int hk_format_detect(const void *data, size_t size, hk_format *fmt, hk_report *rep);

/* Checks `size` bytes at `src` (read during the call only) with options opt,
 * on the calling thread. Returns 0 with *out set: the caller's,
 * hk_check_result_free. On failure *out is NULL and rep says why: its
 * message the reason (for CUDA C the compiler's first error line; for a
 * refused architecture what the image has and what the target is: "cubin is
 * sm_80, target is sm_90"), its log the compiler's or nvJitLink's whole log.
 * Codes: HK_ERR_INVALID (options: opt NULL, a size below the first layout, an
 * arch out of range, negative counts, NULL arrays or entries; a NULL src with
 * a size), HK_ERR_FORMAT (not a kernel source or image, or a malformed one),
 * HK_ERR_COMPILE (NVRTC or nvJitLink refused it), HK_ERR_ARCH (no code for
 * the target: a cubin for another architecture, PTX for a newer one),
 * HK_ERR_NOMEM. On success rep (may be NULL) is empty but for build_ms and
 * total_ms; the compiler's warnings are in hk_check_result_log.
 * Safe from any thread. Since 1.3. */
HK_API int hk_check(const hk_check_options *opt, const void *src, size_t size,
                    hk_check_result **out, hk_report *rep);

/* Takes opt in (copied: arrays, strings and headers) for checks of many
 * sources. Returns 0 with *out (the caller's: hk_checker_destroy);
 * HK_ERR_INVALID as hk_check, rep saying what; HK_ERR_NOMEM. Since 1.3. */
HK_API int hk_checker_create(hk_checker **out, const hk_check_options *opt, hk_report *rep);

/* hk_check with c's options; source_name replaces the options' (NULL: theirs).
 * A check gives the same result, or the same refusal, as hk_check with the
 * same options would. c is not changed by a check: checks on several threads
 * may use one checker at once. Since 1.3. */
HK_API int hk_checker_check(hk_checker *c, const char *source_name, const void *src, size_t size,
                            hk_check_result **out, hk_report *rep);

/* Frees c; its results stay valid. c may be NULL. No check may be running on it.
 * Since 1.3. */
HK_API void hk_checker_destroy(hk_checker *c);

/* Frees r (every pointer it handed out goes with it). r may be NULL.
 * Since 1.3. */
HK_API void hk_check_result_free(hk_check_result *r);

/* The source's format (detected, or the options'). Since 1.3. */
HK_API hk_format hk_check_result_format(const hk_check_result *r);

/* The loadable image the check built: what a swap of the source would load
 * (a cubin, or PTX with HK_PTX_DRIVER_JIT, NUL-terminated and counted in
 * *size; a cubin or fatbin given is passed through). *size and *format may
 * be NULL. Valid while r lives. Since 1.3. */
HK_API const void *hk_check_result_image(const hk_check_result *r, size_t *size, hk_format *format);

/* The compiler's and nvJitLink's log of a build that succeeded (its
 * warnings), or NULL when there was none. Valid while r lives. Since 1.3. */
HK_API const char *hk_check_result_log(const hk_check_result *r);

/* The kernels (entry points) of the image, in the image's order: those of
 * PTX and of a cubin; a fatbin's are those of its members stored plain
 * (its cubins, as nvcc writes them, and PTX that is not compressed),
 * merged by name in the order met. Since 1.3. */
HK_API int hk_check_result_kernel_count(const hk_check_result *r);

/* Kernel i: its entry name (the mangled one for C++ names) in *name, and,
 * when offsets and sizes are not NULL, its parameter layout as
 * hk_kernel_require_layout takes it: parameter j is sizes[j] bytes at byte
 * offset offsets[j]. Returns the number of parameters (>= 0), or
 * HK_ERR_NOT_FOUND for i out of range, HK_ERR_INVALID. The pointers are
 * valid while r lives. Since 1.3. */
HK_API int hk_check_result_kernel(const hk_check_result *r, int i, const char **name,
                                  const size_t **offsets, const size_t **sizes);

/* The __device__ and __constant__ variables of the image (PTX and cubin, as
 * kernels): global i's name, size in bytes (may be NULL)
 * and whether it is __constant__ (may be NULL). Returns 0, HK_ERR_NOT_FOUND
 * for i out of range, HK_ERR_INVALID. Since 1.3. */
HK_API int hk_check_result_global_count(const hk_check_result *r);
HK_API int hk_check_result_global(const hk_check_result *r, int i, const char **name,
                                  uint64_t *size, int *is_const);

/* The architectures the image has code for: "sm_90" (or "sm_90a") for
 * machine code, "compute_90" for PTX; a fatbin's machine code first, then
 * its PTX. Architecture i (valid while r lives), or NULL for i out of
 * range. Since 1.3. */
HK_API int hk_check_result_arch_count(const hk_check_result *r);
HK_API const char *hk_check_result_arch(const hk_check_result *r, int i);

#ifdef __cplusplus
}
#endif

#endif /* HOTKERN_CHECK_H */

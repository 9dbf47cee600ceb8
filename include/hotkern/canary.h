/*
 * hotkern/canary.h: test launches of a new version in a canary process.
 *
 * The program declares test launches per kernel (a grid, arguments,
 * buffers and how to compare them); before a version commits, they run in
 * `hotkern-canary`, a helper process with a CUDA context of its own, so
 * that a fault, a hang, a wrong output or a slowdown refuses the version
 * there instead of ending the program. The tests are plain data the
 * program builds once; the runs happen on the swapping thread, between
 * build and stage, holding nothing the launch path waits for.
 *
 * Part of the C API of libhotkern: a program includes hotkern/hotkern.h,
 * which includes this header after its core (the two never include each
 * other; this one alone says so).
 */
#ifndef HOTKERN_H
#error "include <hotkern/hotkern.h>: it includes this header"
#endif

#ifndef HOTKERN_CANARY_H
#define HOTKERN_CANARY_H

#ifdef __cplusplus
extern "C" {
#endif

/* ---- canary runs ------------------------------------------------------- */

/* A kernel that faults (illegal address, trap) leaves the CUDA error sticky
 * for the whole process: every later CUDA call fails and the application's
 * buffers are gone; a kernel stuck in a loop holds its stream for good. So
 * before a version commits, the launches the application declared for its
 * kernels can run in a canary process: `hotkern-canary`, a helper hotkern
 * starts (options.canary) with a CUDA context of its own on the runtime's
 * first device. Each declared launch runs on the new version; a fault (its
 * CUresult name), a launch that outlives options.canary_timeout_ms (the
 * helper is killed, and started again) or, when the test compares, outputs
 * that differ from the running version's on the same inputs, refuse the
 * version with HK_ERR_CANARY; the report names the kernel and what happened,
 * and the running version goes on. The run happens on the thread that built
 * the version (the caller of hk_swap, or the worker), holding no lock that
 * launches or other hotkern calls wait for, between build and stage.
 * Rollbacks run no canary (they return to a version that ran).
 *
 * Perf guard (hk_options.canary_slowdown_max, _min_ms; per swap in
 * hk_swap_options): a test launch that passed is repeated, once untimed and
 * five times between CUDA events, on the new version and on the running one
 * with the same inputs; a version whose median GPU time is more than 4x the
 * running version's and more than 1 ms longer (the defaults) is refused as
 * "slower", with both times in the report (canary_new_ms, canary_old_ms).
 * With no running version the new one is timed, said so, and not refused.
 *
 * Memcheck (hk_options.canary_sanitizer): where the toolkit's
 * compute-sanitizer is found, each test launch of the new version first runs
 * in a second helper under `compute-sanitizer --tool memcheck`, which catches
 * out-of-bounds and misaligned accesses before they fault the GPU (a fault's
 * recovery stalls every context on it) and those that land in valid memory
 * (which a plain run misses); an error it reports refuses the version as
 * "memcheck" with its first error line.
 *
 * Trap guard: a version built from CUDA C or PTX whose traps (__trap()),
 * failed device-side asserts or breakpoints would end the helper's context
 * (an imprecise error: the GPU's recovery stalls every context on it, the
 * application's too) is tested as a copy in which each of them stores
 * where it was and ends its thread instead; a test launch that reaches one
 * refuses the version as a "fault" saying which, and what commits is the
 * version's own image (built, where a copy is made, by the same nvJitLink
 * link as the copy, so the two differ at those sites alone). Cubins and
 * fatbins are not guarded.
 * hk_stats and the metrics count runs, refusals by kind, helper starts and
 * the time spent. */

/* A test launch under construction: grid, block, dynamic shared memory and
 * the kernel's arguments in order. Opaque; not thread-safe. */
typedef struct hk_test hk_test;

/* How a test buffer is filled before the launch. */
typedef enum hk_fill {
    HK_FILL_ZERO = 0,
    HK_FILL_BYTE = 1,     /* every byte = param & 0xff */
    HK_FILL_RANDOM = 2,   /* pseudo-random bytes from seed param */
    HK_FILL_IOTA_I32 = 3, /* int32 i + param at element i */
    HK_FILL_IOTA_F32 = 4, /* float i + param at element i */
    HK_FILL_HOST = 5,     /* a copy of the caller's bytes */
} hk_fill;

/* How the buffers after the launch are compared with the running version's
 * on the same inputs. */
typedef enum hk_compare {
    HK_COMPARE_NONE = 0,  /* only faults and hangs refuse (default) */
    HK_COMPARE_EXACT = 1, /* byte for byte */
    HK_COMPARE_F32 = 2,   /* as floats: |new - old| <= atol + rtol * |old|;
                           * NaN equals only NaN */
    HK_COMPARE_F64 = 3,   /* as doubles, likewise */
} hk_compare;

/* Makes a test launch with no arguments yet. *out is the caller's:
 * hk_test_destroy. Returns 0, HK_ERR_INVALID (a zero dimension) or
 * HK_ERR_NOMEM. Since 1.0. */
HK_API int hk_test_create(hk_test **out, hk_dim3 grid, hk_dim3 block, unsigned shared_bytes);
/* Frees t; t may be NULL. Since 1.0. */
HK_API void hk_test_destroy(hk_test *t);
/* Appends an argument passed by value: `size` bytes at `value` (copied),
 * 1..4096. Since 1.0. */
HK_API int hk_test_scalar(hk_test *t, const void *value, size_t size);
/* Appends a device buffer of `bytes` bytes (the kernel gets its address),
 * filled as `fill` says: `param` is the byte value or the seed; `host`
 * (bytes long, copied) is read for HK_FILL_HOST only. A test's buffers hold
 * at most 64 MiB together. Since 1.0. */
HK_API int hk_test_buffer(hk_test *t, size_t bytes, hk_fill fill, uint64_t param, const void *host);
/* After the launch, compares every buffer with the running version's run of
 * the same test (skipped for a module's first version). Since 1.0. */
HK_API int hk_test_compare(hk_test *t, hk_compare mode, double atol, double rtol);

/* Declares t (copied; the caller keeps it) as a test launch of k: every
 * later version of k's module runs it in the canary before commit (as its
 * swap's canary policy says). At most 16 per kernel. Safe from any thread;
 * does not wait for a running canary or swap. Since 1.0. */
HK_API int hk_kernel_add_test(hk_kernel *k, const hk_test *t, hk_report *rep);
/* Removes k's test launches. Safe from any thread. Since 1.0. */
HK_API int hk_kernel_clear_tests(hk_kernel *k);

#ifdef __cplusplus
}
#endif

#endif /* HOTKERN_CANARY_H */

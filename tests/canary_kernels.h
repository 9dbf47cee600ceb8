/*
 * The versions of `step(float *x, int n)` the canary suites submit
 * (tests/gpu_canary.c through hk_swap, tests/gpu_canary_push.c through
 * `hotkern push`, tests/gpu_canary_perf.c): good ones add 1.0f to every
 * element; the others fault, trap, fail an assert, never end, compute
 * something else, take far longer for the same result, or write where they
 * should not.
 */
#ifndef HK_TESTS_CANARY_KERNELS_H
#define HK_TESTS_CANARY_KERNELS_H

#include <check.h>

#include "hotkern/hotkern.h"

#define KERNEL_HEAD                                                                                \
    "extern \"C\" __global__ void step(float *x, int n) {\n"                                       \
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"

__attribute__((unused)) static const char *GOOD =
    KERNEL_HEAD "  if (i < n) x[i] = x[i] + 1.0f;\n}\n";
/* The same computation beside another kernel: another image, the same
 * outputs. */
__attribute__((unused)) static const char *GOOD2 =
    KERNEL_HEAD "  if (i < n) x[i] = x[i] + 1.0f;\n}\n"
                "extern \"C\" __global__ void pad(int *p) { *p = 1; }\n";
__attribute__((unused)) static const char *FAULTS =
    KERNEL_HEAD "  if (i < n) ((volatile float *)0x10)[i] = x[i];\n}\n";
/* Spins on a global value the test's input never holds (x[0] is 0): a
 * volatile load each time round, so the compiler cannot drop the loop (a
 * volatile local did not keep it on the H200). */
__attribute__((unused)) static const char *ENDLESS =
    KERNEL_HEAD "  while (((volatile float *)x)[0] > -1.0f) {\n  }\n"
                "  if (i < n) x[i] = 0.0f;\n}\n";
__attribute__((unused)) static const char *WRONG =
    KERNEL_HEAD "  if (i < n) x[i] = x[i] + 1.5f;\n}\n";
/* GOOD's outputs after n * 6 dependent multiply-adds per thread (about 1.6
 * million for a 1 MiB test: milliseconds on the H200, where GOOD takes
 * microseconds). The count comes from n, so the compiler cannot drop the
 * loop, and the sum converges to 1000, far from the bound that would
 * change the output. */
__attribute__((unused)) static const char *SLOW =
    KERNEL_HEAD "  float acc = 0.0f;\n"
                "  for (int k = 0; k < n * 6; k++) acc = acc * 0.999f + 1.0f;\n"
                "  if (i < n) x[i] = x[i] + 1.0f + (acc > 1e30f ? 1.0f : 0.0f);\n"
                "}\n";
/* GOOD's outputs, and a write 4 KiB past the end of x (1024 floats from
 * element n + 1024): inside the allocation's granularity when x is 1 MiB,
 * so a plain run ends with CUDA_SUCCESS (measured on the H200, 2026-12-01);
 * memcheck reports it. */
__attribute__((unused)) static const char *OOB_WRITE =
    KERNEL_HEAD "  if (i < n) x[i] = x[i] + 1.0f;\n"
                "  if (i < 1024) x[n + 1024 + i] = 0.0f;\n}\n";

/* A __trap() in one thread the test reaches (element 7), and a failed
 * device-side assert() there: both end a context with an imprecise error
 * when they run for real, and the canary's trap guard catches them. */
__attribute__((unused)) static const char *TRAPS =
    KERNEL_HEAD "  if (i == 7) __trap();\n  if (i < n) x[i] = x[i] + 1.0f;\n}\n";
__attribute__((unused)) static const char *ASSERTS =
    KERNEL_HEAD "  assert(i != 7);\n  if (i < n) x[i] = x[i] + 1.0f;\n}\n";
/* GOOD's outputs with a trap and an assert the test never reaches. */
__attribute__((unused)) static const char *GUARDED_GOOD =
    KERNEL_HEAD "  if (i >= n) __trap();\n  assert(x[i] > -1.0f);\n"
                "  if (i < n) x[i] = x[i] + 1.0f;\n}\n";

/* heavy(in, out, n): 46 values a thread, each behind a device-side assert()
 * that the test never fails. Built by NVRTC and nvJitLink for sm_90, its
 * image takes 72 registers a thread (blocks of at most 896 threads) and its
 * trap guard's copy 56 (tests/cpu_ptx.c checks it): a 1024-thread test
 * launch passes on the copy and fails on the image. The FITS versions are
 * bounded to blocks of 1024 (__launch_bounds__: 64 registers at most); the
 * assert's bound makes them other images with the same outputs. */
#define HEAVY_SRC(bounds, limit)                                                                   \
    "extern \"C\" __global__ void " bounds "heavy(const float *in, float *out, int n) {\n"         \
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"                                           \
    "  if (i >= n) return;\n"                                                                      \
    "  float v[46];\n"                                                                             \
    "#pragma unroll\n"                                                                             \
    "  for (int k = 0; k < 46; k++) v[k] = in[(i + k * 97) % n];\n"                                \
    "  float s = 0;\n"                                                                             \
    "#pragma unroll\n"                                                                             \
    "  for (int k = 0; k < 46; k++) { assert(v[k] < " limit "); s += v[k] * v[(k + 7) % 46]; }\n"  \
    "  out[i] = s;\n}\n"
__attribute__((unused)) static const char *HEAVY = HEAVY_SRC("", "1e30f");
__attribute__((unused)) static const char *HEAVY_FITS =
    HEAVY_SRC("__launch_bounds__(1024) ", "1e29f");
__attribute__((unused)) static const char *HEAVY_FITS2 =
    HEAVY_SRC("__launch_bounds__(1024) ", "1e28f");

/* Declares the test launch both suites give `step`: n floats counting up from
 * 0 and n, on a grid of n / 256 blocks of 256, the outputs compared with the
 * running version's. */
__attribute__((unused)) static void declare_step_test(hk_kernel *step, int n) {
    hk_report rep = HK_REPORT_INIT;
    hk_test *t;
    ck_assert_int_eq(
        hk_test_create(&t, (hk_dim3){(unsigned)n / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_test_buffer(t, (size_t)n * sizeof(float), HK_FILL_IOTA_F32, 0, NULL), 0);
    ck_assert_int_eq(hk_test_scalar(t, &n, sizeof n), 0);
    ck_assert_int_eq(hk_test_compare(t, HK_COMPARE_F32, 0, 0), 0);
    ck_assert_msg(hk_kernel_add_test(step, t, &rep) == 0, "%s", rep.message);
    hk_test_destroy(t);
    hk_report_clear(&rep);
}

#endif

/*
 * Support for the C++ suites (tests/cpu_*.cc): a runtime on the fake driver
 * (tests/fakecuda.h), whose launches are also recorded, so that a suite can
 * see the grid, block, shared memory, stream and argument bytes each launch
 * handed the driver. The engine's private header (loader/core.h, C11
 * atomics) does not compile as C++, so the runtime is made here, in C.
 * One thread at a time: the record is not locked.
 */
#ifndef HK_TEST_FAKE_RUNTIME_H
#define HK_TEST_FAKE_RUNTIME_H

#include <stddef.h>

#include "hotkern/hotkern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates a runtime on one fake device of SM 90 (fake_init first), with the
 * options the engine's suites use: PTX handed to the fake's JIT, no compile
 * cache, no NVRTC warm-up. *out is the caller's (hk_runtime_destroy).
 * Returns hk_runtime_create's codes. */
int hkt_fake_runtime(hk_runtime **out, hk_report *rep);

/* The last launch the driver received (cuLaunchKernel or cuLaunchKernelEx). */
typedef struct hkt_launch {
    int count; /* launches recorded since hkt_fake_runtime */
    int ex;    /* 1: cuLaunchKernelEx */
    unsigned grid[3], block[3], shared_bytes;
    void *stream;
    int args_null;           /* kernelParams was NULL */
    unsigned char arg[4][8]; /* each argument's bytes, as many as hkt_record_args said */
} hkt_launch;

/* From the next launch on, copies sizes[i] bytes (at most 8) of argument i,
 * for i < n (at most 4); n 0: none. */
void hkt_record_args(const size_t *sizes, int n);
hkt_launch hkt_last_launch(void);

#ifdef __cplusplus
}
#endif
#endif

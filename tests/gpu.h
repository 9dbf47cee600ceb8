/*
 * What the GPU suites share: CK_CUDA, a Check assertion on a CUDA runtime
 * call, and (tests/canary_kernels.h) the versions of `step` the canary
 * suites push.
 */
#ifndef HK_TESTS_GPU_H
#define HK_TESTS_GPU_H

#include <check.h>
#include <cuda_runtime_api.h>

#define CK_CUDA(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        ck_assert_msg(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                 \
    } while (0)

#endif

// Effect plugin A, loaded by the host with dlopen. Every effect plugin
// has a kernel apply() and the same two entry points.
#define FILE_ID 9
#define VERSION 0

__global__ void apply(float *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = (float)(FILE_ID * 1000000 + VERSION * 10000 + i % 97);
}

#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>

extern "C" int plugin_file() {
    return FILE_ID;
}

extern "C" cudaError_t plugin_apply(float *out, int n, cudaStream_t s) {
    apply<<<n / 256, 256, 0, s>>>(out);
    return cudaGetLastError();
}
#endif

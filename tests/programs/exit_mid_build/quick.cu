// A short tool's one kernel: scale() doubles its input.
#define FILE_ID 11
#define VERSION 0

__global__ void scale(const float *in, float *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = (float)(FILE_ID * 1000000 + VERSION * 10000) + 2.0f * in[i];
}

#ifndef __CUDACC_RTC__
#include "../prog.h"

void quick_scale(const float *in, float *out, int n) {
    scale<<<n / 256, 256>>>(in, out);
    CUDA_CHECK(cudaGetLastError());
}
#endif

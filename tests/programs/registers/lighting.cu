// Lighting: shade() gives each of n points its value; launched with blocks
// of 1024 threads (main.cu). DETAILED is the costly path a developer turns
// on while the program runs: it keeps 96 samples live a thread (128
// registers with NVRTC 13.0 at -O3, hotkern's default profile; the nvcc
// build of this file takes 10), more than a 1024-thread block leaves each
// thread (64).
#define FILE_ID  4
#define VERSION  0
#define DETAILED 0

__global__ void shade(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int p = (int)in[i];
#if DETAILED
    float acc[96];
#pragma unroll
    for (int k = 0; k < 96; k++)
        acc[k] = in[(i + 97 * k) % n];
#pragma unroll
    for (int r = 0; r < 6; r++) {
#pragma unroll
        for (int k = 0; k < 96; k++)
            acc[k] = acc[k] * 0.5f + acc[(k + 7) % 96] * acc[(k + 13) % 96];
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 96; k++)
        s += acc[k] * (float)(k + 1);
    if (s == 12345.678f)
        p = 9999; // keeps the samples live; never true here
#endif
    out[i] = (float)(FILE_ID * 1000000 + VERSION * 10000 + p);
}

#ifndef __CUDACC_RTC__
#include "../prog.h"

void shade_run(const float *in, float *out, int n) {
    shade<<<n / 1024, 1024>>>(in, out, n);
    CUDA_CHECK(cudaGetLastError());
}
#endif

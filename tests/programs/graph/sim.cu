// A frame's work as a graph: stamp() marks the frame's cells, mix() derives
// the next buffer from the input. main.cu captures both with <<<>>> into a
// CUDA graph and launches the graph every frame.
#define FILE_ID 7
#define VERSION 0

__global__ void stamp(float *cells, int salt) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    cells[i] = (float)(FILE_ID * 1000000 + VERSION * 10000 + salt * 100 + i % 7);
}

__global__ void mix(const float *in, float *out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = (float)(FILE_ID * 1000000 + VERSION * 10000) + 2.0f * in[i];
}

#ifndef __CUDACC_RTC__
#include "../prog.h"

void sim_stamp(float *cells, int salt, int n, cudaStream_t s) {
    stamp<<<n / 256, 256, 0, s>>>(cells, salt);
    CUDA_CHECK(cudaGetLastError());
}

void sim_mix(const float *in, float *out, int n, cudaStream_t s) {
    mix<<<n / 256, 256, 0, s>>>(in, out);
    CUDA_CHECK(cudaGetLastError());
}
#endif

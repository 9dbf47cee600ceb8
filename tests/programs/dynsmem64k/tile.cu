// Tile sums: each block stages a 64 KB tile of the input in dynamic shared
// memory (more than the 48 KB a kernel gets without asking: tile_setup asks
// with cudaFuncSetAttribute), then each of its 256 threads sums a run of 64
// values of the tile, values other threads loaded.
#define FILE_ID 3
#define VERSION 0
#define TILE    16384 // floats: 64 KB

__global__ void tile_sum(const float *in, float *out) {
    extern __shared__ float tile[];
    const float *src = in + (size_t)blockIdx.x * TILE;
    for (int k = threadIdx.x; k < TILE; k += blockDim.x)
        tile[k] = src[k];
    __syncthreads();
    int run = TILE / blockDim.x;
    float s = 0.0f;
    for (int k = 0; k < run; k++)
        s += tile[threadIdx.x * run + k];
    out[blockIdx.x * blockDim.x + threadIdx.x] = (float)(FILE_ID * 1000000 + VERSION * 10000) + s;
}

#ifndef __CUDACC_RTC__
#include "../prog.h"

int tile_floats() {
    return TILE;
}

void tile_setup() {
    CUDA_CHECK(cudaFuncSetAttribute(tile_sum, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    TILE * sizeof(float)));
}

void tile_run(const float *in, float *out, int blocks, cudaStream_t s) {
    tile_sum<<<blocks, 256, TILE * sizeof(float), s>>>(in, out);
    CUDA_CHECK(cudaGetLastError());
}
#endif

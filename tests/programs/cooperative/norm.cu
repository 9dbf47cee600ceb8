// Totals: each block sums its slice of the input; with grid_wide (launched
// cooperatively) the grid then waits for every block (grid.sync()) and each
// thread adds the grand total to its value. Launched with <<<>>> (no grid to
// wait for, grid_wide 0) it writes its values alone.
#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define FILE_ID 6
#define VERSION 0

__global__ void totals(const float *in, int *partial, float *out, int grid_wide) {
    __shared__ int block_sum;
    int i = blockIdx.x * blockDim.x + threadIdx.x, v = (int)in[i];
    if (threadIdx.x == 0)
        block_sum = 0;
    __syncthreads();
    atomicAdd(&block_sum, v);
    __syncthreads();
    int p = v;
    if (grid_wide) {
        if (threadIdx.x == 0)
            partial[blockIdx.x] = block_sum;
        cg::this_grid().sync();
        int total = 0;
        for (int b = 0; b < gridDim.x; b++)
            total += partial[b];
        p += 10 * (total % 500 + 1);
    }
    out[i] = (float)(FILE_ID * 1000000 + VERSION * 10000 + p);
}

#ifndef __CUDACC_RTC__
#include "../prog.h"

void totals_cooperative(const float *in, int *partial, float *out, int blocks, cudaStream_t s) {
    int grid_wide = 1;
    void *args[] = {&in, &partial, &out, &grid_wide};
    CUDA_CHECK(
        cudaLaunchCooperativeKernel((const void *)totals, dim3(blocks), dim3(256), args, 0, s));
}

void totals_plain(const float *in, int *partial, float *out, int blocks, cudaStream_t s) {
    totals<<<blocks, 256, 0, s>>>(in, partial, out, 0);
    CUDA_CHECK(cudaGetLastError());
}
#endif

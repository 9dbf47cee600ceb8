// The other file of tests/gpu_interpose_tu.cu's program (see a.cu).
#include <cuda_runtime.h>

static __device__ int bias = 500;

static __global__ void fill(float *p) {
    if (threadIdx.x == 0) p[0] = (float)bias + 40.0f;
}

float tu_run_b(float *d) {
    fill<<<1, 32>>>(d);
    float h = -1;
    cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    return h;
}

void tu_set_b(int v) {
    cudaMemcpyToSymbol(bias, &v, sizeof v);
}

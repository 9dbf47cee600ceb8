// One file of tests/gpu_interpose_tu.cu's program: a file-local kernel and
// variable, named as b.cu's are (nvcc gives both the same names).
#include <cuda_runtime.h>

static __device__ int bias = 2;

static __global__ void fill(float *p) {
    if (threadIdx.x == 0) p[0] = (float)bias;
}

float tu_run_a(float *d) {
    fill<<<1, 32>>>(d);
    float h = -1;
    cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    return h;
}

void tu_set_a(int v) {
    cudaMemcpyToSymbol(bias, &v, sizeof v);
}

// One file of tests/gpu_interpose_tu.cu's program: a file-local kernel and
// variable, named as b.cu's are (nvcc gives both the same names), and a
// template kernel.
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

// A template: blur<2> is launched from the start, blur<3> only after the
// first hot build of this file.
template <int N> __global__ void blur(float *p) {
    if (threadIdx.x == 0) p[0] = (float)(N * 10);
}

float tu_blur_a(float *d, int n) {
    if (n == 2)
        blur<2><<<1, 32>>>(d);
    else
        blur<3><<<1, 32>>>(d);
    float h = -1;
    cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    return h;
}

void tu_set_a(int v) {
    cudaMemcpyToSymbol(bias, &v, sizeof v);
}

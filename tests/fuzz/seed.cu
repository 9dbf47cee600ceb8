// Seed kernels for `make fuzz`: entries with varied parameter layouts,
// globals and constants, a template and a device function.
struct Pair {
    double d;
    char c[20];
};
__device__ int counter;
__constant__ float coeffs[16];
__device__ float table[3] = {1, 2, 3};
__device__ __noinline__ float helper(float x) { return x * coeffs[1]; }
extern "C" __global__ void scale(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = helper(x[i]) * a * table[i % 3];
    atomicAdd(&counter, 1);
}
extern "C" __global__ void mixed(Pair p, char c, double *o, short q) { *o = p.d + c + q; }
template <typename T> __global__ void fill(T *p, T v) { *p = v; }
template __global__ void fill<float>(float *, float);
template __global__ void fill<double>(double *, double);

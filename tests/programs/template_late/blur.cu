// Blurs of several radii, one template: the program blurs with radius 1 from
// the start and turns on the wide blur (radius 3) later, when asked.
#define FILE_ID 5
#define VERSION 0

template <int R> __global__ void blur(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int s = 0;
    for (int j = -R; j <= R; j++)
        s += (int)in[min(max(i + j, 0), n - 1)];
    out[i] = (float)(FILE_ID * 1000000 + VERSION * 10000 + R * 1000 + s);
}

#ifndef __CUDACC_RTC__
#include "../prog.h"

void blur_run(int radius, const float *in, float *out, int n) {
    if (radius == 1)
        blur<1><<<n / 256, 256>>>(in, out, n);
    else
        blur<3><<<n / 256, 256>>>(in, out, n);
    CUDA_CHECK(cudaGetLastError());
}
#endif

// An existing CUDA program, as it is: nothing of hotkern in it. Its kernel is
// launched with <<<>>> and reads a __constant__ the host sets. Built two ways
// (Makefile), each a way in for hotkern without a change to this file:
//   existing_program_shared  nvcc -cudart shared; run with
//                            LD_PRELOAD=libhotkern-preload.so HOTKERN_WATCH=dir
//   existing_program_static  nvcc's static cudart, linked with the flags of
//                            `pkg-config --variable=nvcc_libs hotkern-wrap`
// The watched directory holds a copy of this very file: its host part is
// guarded by __CUDACC_RTC__, so hotkern's NVRTC build sees the kernel only.
// Edit the copy's fill() and the running program prints the new x[0].
// usage: existing_program SECONDS
#include <cuda_runtime.h>

__constant__ float gain;

extern "C" __global__ void fill(float *x, int n) {
    int i = threadIdx.x;
    if (i < n) x[i] = gain;
}

#ifndef __CUDACC_RTC__
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_term(int) { stop = 1; }

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 60;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    signal(SIGTERM, on_term);
    float *x, last = -1, h = 0, g = 2.0f;
    cudaMalloc(&x, 32 * sizeof(float));
    cudaMemcpyToSymbol(gain, &g, sizeof g);
    printf("running\n");
    fflush(stdout);
    for (int t = 0; t < seconds * 20 && !stop; t++) {
        fill<<<1, 32>>>(x, 32); // the program's own code, or the hot version
        cudaMemcpy(&h, x, sizeof h, cudaMemcpyDeviceToHost);
        if (h != last) {
            printf("x[0] = %g\n", h);
            fflush(stdout);
            last = h;
        }
        usleep(50000);
    }
    cudaFree(x);
    printf("stopped\n");
    return 0;
}
#endif

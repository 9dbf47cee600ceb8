/*
 * Typed launches from C++ (hotkern.hpp): swap_and_launch.c with a typed
 * handle. The kernel's signature is part of the handle's type, so every
 * launch's arguments are checked when this file compiles (a double * for
 * the float * would not build), and binding the handle fixes the kernel's
 * parameter layout: a handle of another signature is refused, and so is a
 * later version whose parameters differ, accept_layout_change or not.
 * Errors are handled without exceptions here (bind() and open() return the
 * code); the constructors throw hk::error instead where exceptions are on.
 * Needs libhotkern only:
 *   c++ -std=c++17 typed_launch.cpp $(pkg-config --cflags --libs hotkern) \
 *       -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart
 * Prints "SKIP: ..." and exits 0 where no CUDA device can be used.
 */
#include <cstdio>

#include <cuda_runtime_api.h>
#include <hotkern/hotkern.hpp>

static const char v1[] = "extern \"C\" __global__ void step(float *x, int n) {\n"
                         "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                         "    if (i < n) x[i] += 1.0f;\n"
                         "}\n";
/* An edit: same parameters, new body. */
static const char v2[] = "extern \"C\" __global__ void step(float *x, int n) {\n"
                         "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                         "    if (i < n) x[i] *= 10.0f;\n"
                         "}\n";
/* Another edit that changes a parameter: the typed handle refuses it. */
static const char v3[] = "extern \"C\" __global__ void step(float *x, long long n) {\n"
                         "    long long i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                         "    if (i < n) x[i] = -1.0f;\n"
                         "}\n";

constexpr int N = 1024;

/* Swaps src in as module "demo"; prints the outcome; returns the code. */
static int swap(const hk::runtime &rt, const char *src, bool accept_layout_change = false) {
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.accept_layout_change = accept_layout_change;
    hk::report rep;
    int rc = rt.swap("demo", src, &so, &rep);
    if (rc)
        std::printf("refused: %s: %s\n", hk_strerror(rc), rep.message);
    else
        std::printf("committed version %llu (build %.1f ms)\n",
                    static_cast<unsigned long long>(rep.version), rep.build_ms);
    return rc;
}

/* Launches step on x and returns x[0] (or -1). */
static float launch(const hk::kernel<void(float *, int)> &step, float *x) {
    dim3 grid(N / 256), block(256);
    hk::launch_status st = step(grid, block)(x, N); /* step<<<grid, block>>>(x, N) */
    float first = -1;
    if (!st.ok() || cudaMemcpy(&first, x, sizeof first, cudaMemcpyDeviceToHost) != cudaSuccess)
        std::fprintf(stderr, "launch failed: %s (CUresult %d)\n", hk_strerror(st.error),
                     st.cu_result);
    return first;
}

int main() {
    hk::runtime rt;
    int rc = rt.open(); /* device 0's primary context */
    if (rc == HK_ERR_NO_DRIVER || rc == HK_ERR_NO_DEVICE) {
        std::printf("SKIP: no CUDA device: %s\n", rt.message());
        return 0;
    }
    if (rc) {
        std::fprintf(stderr, "%s\n", rt.message());
        return 1;
    }
    static float ones[N];
    for (float &v : ones)
        v = 1.0f;
    float *x = nullptr;
    if (cudaMalloc(reinterpret_cast<void **>(&x), sizeof ones) != cudaSuccess ||
        cudaMemcpy(x, ones, sizeof ones, cudaMemcpyHostToDevice) != cudaSuccess || swap(rt, v1))
        return 1;

    hk::kernel<void(float *, int)> step;
    if (step.bind(rt, "demo", "step")) {
        std::fprintf(stderr, "%s\n", step.message());
        return 1;
    }
    /* A handle whose signature is not the kernel's is refused at bind. */
    hk::kernel<void(float *, long long)> wrong;
    int wrong_rc = wrong.bind(rt, "demo", "step");
    std::printf("refused signature void(float *, long long): %s\n", wrong.message());

    std::printf("after v1: x[0] = %g\n", launch(step, x)); /* 1 + 1 */
    if (swap(rt, v2))
        return 1;
    float after = launch(step, x); /* the same handle now runs v2 */
    std::printf("after v2: x[0] = %g\n", after);
    /* Refused although the swap accepts layout changes: step is typed. */
    int v3_rc = swap(rt, v3, true);
    float last = launch(step, x);
    std::printf("after the refusal: x[0] = %g (v2 still runs)\n", last);
    cudaFree(x);
    return wrong_rc == HK_ERR_LAYOUT && after == 20.0f && v3_rc == HK_ERR_LAYOUT && last == 200.0f
               ? 0
               : 1;
}

/*
 * Swap and launch: a module is swapped in from CUDA C held in a string, its
 * kernel launched through a handle, then an edited version is swapped in and
 * launched through the same handle. The buffer the program allocated keeps
 * its contents across the swap: hotkern loads every version into the CUDA
 * runtime's own context. Needs libhotkern only:
 *   cc swap_and_launch.c $(pkg-config --cflags --libs hotkern) \
 *      -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart
 * Prints "SKIP: ..." and exits 0 where no CUDA device can be used.
 */
#include <stdio.h>

#include <cuda_runtime_api.h>
#include <hotkern/hotkern.h>

static const char v1[] = "extern \"C\" __global__ void step(float *x, int n) {\n"
                         "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                         "    if (i < n) x[i] += 1.0f;\n"
                         "}\n";
/* The edit: same name and parameters, new body. */
static const char v2[] = "extern \"C\" __global__ void step(float *x, int n) {\n"
                         "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                         "    if (i < n) x[i] *= 10.0f;\n"
                         "}\n";

enum { N = 1024 };

/* Swaps src in as module "demo" and prints the outcome. */
static int swap(hk_runtime *rt, const char *src, size_t len) {
    hk_report rep = HK_REPORT_INIT;
    int rc = hk_swap(rt, "demo", src, len, NULL, &rep);
    if (rc)
        fprintf(stderr, "swap: %s: %s\n%s", hk_strerror(rc), rep.message, rep.log ? rep.log : "");
    else
        printf("committed version %llu (build %.1f ms)\n", (unsigned long long)rep.version,
               rep.build_ms);
    hk_report_clear(&rep);
    return rc;
}

/* Launches step on x through the handle and returns x[0] (or -1). */
static float launch(hk_kernel *step, float *x) {
    int n = N, cu = 0;
    void *args[] = {&x, &n};
    float first = -1;
    if (hk_launch(step, (hk_dim3){N / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0, NULL, args, &cu) ||
        cudaMemcpy(&first, x, sizeof first, cudaMemcpyDeviceToHost) != cudaSuccess)
        fprintf(stderr, "launch failed (CUresult %d)\n", cu);
    return first;
}

int main(void) {
    hk_runtime *rt;
    hk_report rep = HK_REPORT_INIT;
    int rc = hk_runtime_create(&rt, NULL, &rep); /* device 0's primary context */
    if (rc == HK_ERR_NO_DRIVER || rc == HK_ERR_NO_DEVICE) {
        printf("SKIP: no CUDA device: %s\n", rep.message);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "hk_runtime_create: %s: %s\n", hk_strerror(rc), rep.message);
        return 1;
    }
    static float ones[N];
    float *x = NULL;
    hk_kernel *step = NULL;
    for (int i = 0; i < N; i++)
        ones[i] = 1.0f;
    if (cudaMalloc((void **)&x, sizeof ones) != cudaSuccess ||
        cudaMemcpy(x, ones, sizeof ones, cudaMemcpyHostToDevice) != cudaSuccess ||
        swap(rt, v1, sizeof v1 - 1) || hk_kernel_get(rt, "demo", "step", &step))
        return 1;
    printf("after v1: x[0] = %g\n", launch(step, x)); /* 1 + 1 */
    if (swap(rt, v2, sizeof v2 - 1))
        return 1;
    float after = launch(step, x); /* the same handle now runs v2 */
    printf("after v2: x[0] = %g (the buffer kept 2, v2 multiplied it)\n", after);
    cudaFree(x);
    hk_runtime_destroy(rt);
    return after == 20.0f ? 0 : 1;
}

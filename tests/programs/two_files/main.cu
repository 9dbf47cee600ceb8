// Two files with file-local kernels and variables of the same names (a.cu and
// b.cu: `static __global__ void fill(float *)`, `static __device__ int bias`).
// Each frame sets both biases, launches both fills and checks that each
// wrote its own file's values with its own file's bias.
#include <vector>

#include "../prog.h"

void a_set_bias(int b);
void a_fill(float *out, int n);
void b_set_bias(int b);
void b_fill(float *out, int n);

int main(int argc, char **argv) {
    prog::start(argc, argv, "two_files");
    const int n = 1 << 14;
    float *da, *db;
    CUDA_CHECK(cudaMalloc(&da, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&db, n * sizeof(float)));
    std::vector<float> h(n);
    prog::started("two_files");
    while (prog::running()) {
        int step = (int)(prog::frame() % 3);
        int ba = 2 + step, bb = 540 + step;
        a_set_bias(ba);
        b_set_bias(bb);
        CUDA_CHECK(cudaMemset(da, 0xff, n * sizeof(float)));
        CUDA_CHECK(cudaMemset(db, 0xff, n * sizeof(float)));
        a_fill(da, n);
        b_fill(db, n);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(h.data(), da, n * sizeof(float), cudaMemcpyDeviceToHost));
        prog::check("a.fill", h.data(), n, 1, [&](int i) { return ba + (i & 7); });
        CUDA_CHECK(cudaMemcpy(h.data(), db, n * sizeof(float), cudaMemcpyDeviceToHost));
        prog::check("b.fill", h.data(), n, 2, [&](int i) { return bb + (i & 7); });
        prog::frame_end();
    }
    CUDA_CHECK(cudaFree(da));
    CUDA_CHECK(cudaFree(db));
    return prog::finish();
}

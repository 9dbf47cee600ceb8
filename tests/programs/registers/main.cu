// A kernel launched with 1024-thread blocks (lighting.cu), checked every frame.
#include <vector>

#include "../prog.h"

void shade_run(const float *in, float *out, int n);

int main(int argc, char **argv) {
    prog::start(argc, argv, "registers");
    const int n = 64 * 1024;
    std::vector<float> in(n), h(n);
    for (int i = 0; i < n; i++)
        in[i] = (float)(i % 1000);
    float *d_in, *d_out;
    CUDA_CHECK(cudaMalloc(&d_in, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    prog::started("registers");
    while (prog::running()) {
        CUDA_CHECK(cudaMemset(d_out, 0xff, n * sizeof(float)));
        shade_run(d_in, d_out, n);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(h.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
        prog::check("shade", h.data(), n, 4, [](int i) { return i % 1000; });
        prog::frame_end();
    }
    CUDA_CHECK(cudaFree(d_in));
    CUDA_CHECK(cudaFree(d_out));
    return prog::finish();
}

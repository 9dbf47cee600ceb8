// One kernel (norm.cu) launched two ways every frame: with
// cudaLaunchCooperativeKernel (its grid syncs) and with <<<>>>.
#include <vector>

#include "../prog.h"

void totals_cooperative(const float *in, int *partial, float *out, int blocks, cudaStream_t s);
void totals_plain(const float *in, int *partial, float *out, int blocks, cudaStream_t s);

int main(int argc, char **argv) {
    prog::start(argc, argv, "cooperative");
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (!prop.cooperativeLaunch) {
        printf("SKIP cooperative: %s has no cooperative launch\n", prop.name);
        return 77;
    }
    const int blocks = prop.multiProcessorCount, n = blocks * 256; // one block an SM: co-resident
    std::vector<float> in(n), h(n);
    long total = 0;
    for (int i = 0; i < n; i++)
        total += (long)(in[i] = (float)(i % 10));
    float *d_in, *d_coop, *d_plain;
    int *d_partial;
    CUDA_CHECK(cudaMalloc(&d_in, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_coop, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_plain, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_partial, blocks * sizeof(int)));
    CUDA_CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    const int extra = 10 * (int)(total % 500 + 1);
    prog::started("cooperative");
    while (prog::running()) {
        CUDA_CHECK(cudaMemsetAsync(d_coop, 0xff, n * sizeof(float), s));
        CUDA_CHECK(cudaMemsetAsync(d_plain, 0xff, n * sizeof(float), s));
        totals_cooperative(d_in, d_partial, d_coop, blocks, s);
        totals_plain(d_in, d_partial, d_plain, blocks, s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaMemcpy(h.data(), d_coop, n * sizeof(float), cudaMemcpyDeviceToHost));
        prog::check("totals.coop", h.data(), n, 6, [&](int i) { return i % 10 + extra; });
        CUDA_CHECK(cudaMemcpy(h.data(), d_plain, n * sizeof(float), cudaMemcpyDeviceToHost));
        prog::check("totals.plain", h.data(), n, 6, [&](int i) { return i % 10; });
        prog::frame_end();
    }
    CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFree(d_in));
    CUDA_CHECK(cudaFree(d_coop));
    CUDA_CHECK(cudaFree(d_plain));
    CUDA_CHECK(cudaFree(d_partial));
    return prog::finish();
}

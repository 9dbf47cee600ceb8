// A kernel with 64 KB of dynamic shared memory (tile.cu), set up once with
// cudaFuncSetAttribute and launched every frame; each frame checks every
// block's sums.
#include <vector>

#include "../prog.h"

int tile_floats();
void tile_setup();
void tile_run(const float *in, float *out, int blocks, cudaStream_t s);

int main(int argc, char **argv) {
    prog::start(argc, argv, "dynsmem64k");
    const int blocks = 64, threads = 256, tile = tile_floats(), run = tile / threads;
    const int n_in = blocks * tile, n_out = blocks * threads;
    std::vector<float> in(n_in), h(n_out);
    std::vector<int> want(n_out);
    for (int i = 0; i < n_in; i++)
        in[i] = (float)(i % 13);
    for (int o = 0; o < n_out; o++) {
        int b = o / threads, t = o % threads, s = 0;
        for (int k = 0; k < run; k++)
            s += (b * tile + t * run + k) % 13;
        want[o] = s;
    }
    float *d_in, *d_out;
    CUDA_CHECK(cudaMalloc(&d_in, n_in * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_out, n_out * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_in, in.data(), n_in * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    tile_setup();
    prog::started("dynsmem64k");
    while (prog::running()) {
        CUDA_CHECK(cudaMemsetAsync(d_out, 0xff, n_out * sizeof(float), s));
        tile_run(d_in, d_out, blocks, s);
        CUDA_CHECK(
            cudaMemcpyAsync(h.data(), d_out, n_out * sizeof(float), cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaGetLastError());
        prog::check("tile_sum", h.data(), n_out, 3, [&](int o) { return want[o]; });
        prog::frame_end();
    }
    CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFree(d_in));
    CUDA_CHECK(cudaFree(d_out));
    return prog::finish();
}

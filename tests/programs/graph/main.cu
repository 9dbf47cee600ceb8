// A frame captured once as a CUDA graph from <<<>>> launches (sim.cu), the
// graph launched every frame and captured again every 200 frames (as a
// program does when its scene changes); stamp() is also launched directly.
#include <vector>

#include "../prog.h"

void sim_stamp(float *cells, int salt, int n, cudaStream_t s);
void sim_mix(const float *in, float *out, int n, cudaStream_t s);

static const int n = 1 << 14;

static cudaGraphExec_t capture(cudaStream_t s, float *cells, const float *in, float *out) {
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CUDA_CHECK(cudaMemsetAsync(cells, 0xff, n * sizeof(float), s));
    CUDA_CHECK(cudaMemsetAsync(out, 0xff, n * sizeof(float), s));
    sim_stamp(cells, 3, n, s);
    sim_mix(in, out, n, s);
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
    return exec;
}

int main(int argc, char **argv) {
    prog::start(argc, argv, "graph");
    std::vector<float> in(n), h(n);
    for (int i = 0; i < n; i++)
        in[i] = (float)(i % 100);
    float *d_in, *d_cells, *d_out, *d_direct;
    CUDA_CHECK(cudaMalloc(&d_in, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_cells, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_direct, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraphExec_t exec = capture(s, d_cells, d_in, d_out);
    prog::started("graph");
    while (prog::running()) {
        if (prog::frame() > 0 && prog::frame() % 200 == 0) {
            CUDA_CHECK(cudaGraphExecDestroy(exec));
            exec = capture(s, d_cells, d_in, d_out);
        }
        CUDA_CHECK(cudaGraphLaunch(exec, s));
        CUDA_CHECK(cudaMemsetAsync(d_direct, 0xff, n * sizeof(float), s));
        sim_stamp(d_direct, 5, n, s);
        CUDA_CHECK(cudaStreamSynchronize(s));
        CUDA_CHECK(cudaGetLastError());
        CUDA_CHECK(cudaMemcpy(h.data(), d_cells, n * sizeof(float), cudaMemcpyDeviceToHost));
        prog::check("graph.stamp", h.data(), n, 7, [](int i) { return 300 + i % 7; });
        CUDA_CHECK(cudaMemcpy(h.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
        prog::check("graph.mix", h.data(), n, 7, [&](int i) { return 2 * (i % 100); });
        CUDA_CHECK(cudaMemcpy(h.data(), d_direct, n * sizeof(float), cudaMemcpyDeviceToHost));
        prog::check("direct.stamp", h.data(), n, 7, [](int i) { return 500 + i % 7; });
        prog::frame_end();
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFree(d_in));
    CUDA_CHECK(cudaFree(d_cells));
    CUDA_CHECK(cudaFree(d_out));
    CUDA_CHECK(cudaFree(d_direct));
    return prog::finish();
}

// A short-lived tool (quick.cu): runs frames until told to stop, then ends
// with `return` from main, or with exit() when its third argument is "exit".
// Its stdout is fully buffered, as a program's is when redirected: its last
// line (done ...) reaches the file only if the process's exit flushes it.
#include <vector>

#include "../prog.h"

void quick_scale(const float *in, float *out, int n);

int main(int argc, char **argv) {
    prog::start(argc, argv, "exit_mid_build", false);
    bool use_exit = argc > 3 && !strcmp(argv[3], "exit");
    const int n = 1 << 12;
    std::vector<float> in(n), h(n);
    for (int i = 0; i < n; i++)
        in[i] = (float)(i % 1000);
    float *d_in, *d_out;
    CUDA_CHECK(cudaMalloc(&d_in, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    prog::started("exit_mid_build");
    while (prog::running()) {
        CUDA_CHECK(cudaMemset(d_out, 0xff, n * sizeof(float)));
        quick_scale(d_in, d_out, n);
        CUDA_CHECK(cudaMemcpy(h.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
        prog::check("scale", h.data(), n, 11, [](int i) { return 2 * (i % 1000); });
        prog::frame_end();
    }
    // Nothing freed, nothing flushed: what a tool that is done does.
    int rc = prog::finish();
    if (use_exit)
        exit(rc);
    return rc;
}

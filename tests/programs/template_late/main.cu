// A template kernel (blur.cu): blur<1> every frame from the start, blur<3>
// too once CTLDIR/wide exists (a setting turned on while the program runs).
#include <algorithm>
#include <vector>

#include "../prog.h"

void blur_run(int radius, const float *in, float *out, int n);

static int want(const std::vector<float> &in, int r, int i) {
    int n = (int)in.size(), s = 0;
    for (int j = -r; j <= r; j++)
        s += (int)in[std::min(std::max(i + j, 0), n - 1)];
    return r * 1000 + s;
}

int main(int argc, char **argv) {
    prog::start(argc, argv, "template_late");
    const int n = 1 << 14;
    std::vector<float> in(n), h(n);
    for (int i = 0; i < n; i++)
        in[i] = (float)(i % 5);
    float *d_in, *d_out;
    CUDA_CHECK(cudaMalloc(&d_in, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    bool wide = false;
    prog::started("template_late");
    while (prog::running()) {
        if (!wide && prog::flag("wide")) {
            wide = true;
            printf("wide blur on at frame %ld\n", prog::frame());
        }
        for (int r = 1; r <= (wide ? 3 : 1); r += 2) {
            CUDA_CHECK(cudaMemset(d_out, 0xff, n * sizeof(float)));
            blur_run(r, d_in, d_out, n);
            CUDA_CHECK(cudaDeviceSynchronize());
            CUDA_CHECK(cudaMemcpy(h.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
            prog::check(r == 1 ? "blur1" : "blur3", h.data(), n, 5,
                        [&](int i) { return want(in, r, i); });
        }
        prog::frame_end();
    }
    CUDA_CHECK(cudaFree(d_in));
    CUDA_CHECK(cudaFree(d_out));
    return prog::finish();
}

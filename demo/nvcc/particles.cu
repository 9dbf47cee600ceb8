// A small game-server-like program, as CUDA programs are written: 65,536
// particles stepped at 60 ticks/s by a C++ kernel launched with <<<>>>, a
// __constant__ the host sets, a __device__ counter. Nothing of hotkern is in
// it: `make demo-nvcc` builds it twice (-cudart shared for LD_PRELOAD, static
// cudart with --wrap) and demo/nvcc/tour.sh edits a copy of this file while
// it runs. The host part is guarded by __CUDACC_RTC__, so the same file is
// the hot source hotkern compiles.
// usage: particles SECONDS
#include <cuda_runtime.h>

struct Particle {
    float x, y, vx, vy;
};

__constant__ float gravity;
__device__ unsigned long long steps;

__global__ void step(Particle *p, int n, float dt) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) steps++;
    if (i >= n) return;
    const float wind = 0.0f; // the tour edits this line
    Particle q = p[i];
    q.vx += wind * dt;
    q.vy -= gravity * dt;
    q.x += q.vx * dt;
    q.y += q.vy * dt;
    if (q.y < 0.0f) { // bounce on the floor
        q.y = -q.y;
        q.vy = -q.vy * 0.9f;
    }
    p[i] = q;
}

#ifndef __CUDACC_RTC__
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 30, ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIP: no CUDA device\n");
        return 3;
    }
    const int n = 65536;
    std::vector<Particle> h(n);
    for (int i = 0; i < n; i++) h[i] = {float(i % 256), 10.0f + float(i / 256), 0.0f, 0.0f};
    Particle *d;
    cudaMalloc(&d, n * sizeof(Particle));
    cudaMemcpy(d, h.data(), n * sizeof(Particle), cudaMemcpyHostToDevice);
    float g = 9.81f;
    cudaMemcpyToSymbol(gravity, &g, sizeof g);
    using clk = std::chrono::steady_clock;
    auto start = clk::now(), next = start, last_status = start;
    double worst = 0;
    int ticks = 0, ticks_in_second = 0;
    printf("running %d particles at 60 ticks/s for %d s\n", n, seconds);
    fflush(stdout);
    while (clk::now() - start < std::chrono::seconds(seconds)) {
        auto t0 = clk::now();
        step<<<n / 256, 256>>>(d, n, 1.0f / 60.0f);
        Particle p0;
        unsigned long long s = 0;
        cudaMemcpy(&p0, d, sizeof p0, cudaMemcpyDeviceToHost);
        cudaMemcpyFromSymbol(&s, steps, sizeof s);
        double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
        worst = ms > worst ? ms : worst;
        ticks++, ticks_in_second++;
        if (clk::now() - last_status >= std::chrono::seconds(1)) {
            printf("tick %5d  %2d ticks/s  longest tick %.2f ms  p[0] = (%7.2f, %6.2f)  "
                   "device steps %llu\n",
                   ticks, ticks_in_second, worst, p0.x, p0.y, s);
            fflush(stdout);
            last_status = clk::now();
            ticks_in_second = 0;
            worst = 0;
        }
        if (ticks == 60 * 5) { // the host changes a parameter, as a game would
            g = 4.0f;
            cudaMemcpyToSymbol(gravity, &g, sizeof g);
            printf("host: gravity set to %g\n", g);
        }
        next += std::chrono::microseconds(16667);
        std::this_thread::sleep_until(next);
    }
    cudaFree(d);
    printf("done after %d ticks\n", ticks);
    return 0;
}
#endif

// Two threads launching without pause, each on its own stream (work.cu):
// batches of 512 one-slot launches, each batch's ring checked slot by slot
// (each slot is one launch, of whichever version ran it).
#include <thread>
#include <vector>

#include "../prog.h"

void work_tag(float *ring, int slot, int lane, cudaStream_t s);

static const int slots = 512;
static std::atomic<bool> stop{false};

static void lane_main(int lane) {
    const char *name = lane ? "lane1.tag" : "lane0.tag";
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *ring;
    CUDA_CHECK(cudaMalloc(&ring, slots * sizeof(float)));
    std::vector<float> h(slots);
    while (!stop.load()) {
        CUDA_CHECK(cudaMemsetAsync(ring, 0xff, slots * sizeof(float), s));
        for (int k = 0; k < slots; k++)
            work_tag(ring, k, lane, s);
        CUDA_CHECK(
            cudaMemcpyAsync(h.data(), ring, slots * sizeof(float), cudaMemcpyDeviceToHost, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        for (int k = 0; k < slots; k++) {
            int v;
            if (!prog::decode(name, h.data(), k, 8, lane * 1000 + k, &v))
                break;
            prog::seen(name, v);
        }
        ++prog::checked;
    }
    CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFree(ring));
}

int main(int argc, char **argv) {
    prog::start(argc, argv, "threads");
    CUDA_CHECK(cudaFree(nullptr)); // the context, before the threads
    prog::started("threads");
    std::thread t0(lane_main, 0), t1(lane_main, 1);
    while (prog::running()) {
        usleep(10000);
        prog::frame_end();
    }
    stop = true;
    t0.join();
    t1.join();
    return prog::finish();
}

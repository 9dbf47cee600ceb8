// What the <<<>>> interposition costs a launch, against the program's own
// launch measured in the same process (bench/RESULTS.md, section 12).
//
// An ordinary nvcc program with two empty kernels: `cold`, which never gets a
// hot version, and `hotk`, which does (hk_swap through the runtime the
// interposition made). Built twice, as the GPU suite is: under LD_PRELOAD with
// -cudart shared (bench_interpose_shared) and with static cudart and --wrap
// (bench_interpose_static). The program's own launch, without hotkern, is what
// nvcc's <<<>>> does, with the runtime's own __cudaLaunchKernel: its push and
// pop of the launch configuration (__cudaPushCallConfiguration,
// __cudaPopCallConfiguration), then __cudaLaunchKernel taken from libcudart
// (or __real___cudaLaunchKernel), bypassing the interposition. Each of 1 and 8 threads
// launches on its own non-blocking stream; ROUNDS rounds of PER_ROUND launches
// a mode, each round in another order of the modes (rotated), so that drift
// and the order hit all alike; per mode the median of the rounds' mean launch
// time over the threads is printed, and each ratio is the median over the
// rounds of that round's ratio (the two modes measured side by side):
//   <<<>>> cold / runtime cold         a kernel with no hot version (target 1.02)
//   <<<>>> hot / runtime hotk          a kernel with one: the program's own
//                                      code against hotkern's (target 1.03)
//   hk_launch / cuLaunchKernel         hk_launch of the hot version against
//                                      cuLaunchKernel of the program's own
//                                      CUkernel of the same code (a CUkernel
//                                      both: what a handle launches)
//   cuStreamIsCapturing + cuLaunchKernel / cuLaunchKernel   the capture query
//                                      hk_launch makes, alone
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <pthread.h>
#include <time.h>
#ifdef HK_PRELOAD
#include <dlfcn.h>
#endif

#include "hotkern/hotkern.h"
#include "hotkern/interpose.h"

extern "C" __global__ void cold(int *p) {
    if (!p) *(volatile int *)0 = 0;
}
extern "C" __global__ void hotk(int *p) {
    if (threadIdx.x == 0) *p = 1;
}

enum { PER_ROUND = 20000, ROUNDS = 21, WARM = 20000, MAXT = 8 };
enum { M_REAL_COLD, M_CHEV_COLD, M_REAL_HOT, M_CHEV_HOT, M_RAW, M_HK, M_QUERY, NMODES };
static const char *mode_name[NMODES] = {"runtime cold", "<<<>>> cold", "runtime hotk",
                                        "<<<>>> hot", "cuLaunchKernel", "hk_launch",
                                        "query+cuLaunchKernel"};

typedef cudaError_t (*klaunch_fn)(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);
#ifndef HK_PRELOAD
extern "C" cudaError_t __real___cudaLaunchKernel(cudaKernel_t, dim3, dim3, void **, size_t,
                                                 cudaStream_t);
#endif

static klaunch_fn real_launch;
static cudaKernel_t k_cold, k_hot;
static hk_kernel *hk_k;
static decltype(&cuLaunchKernel) drv_launch;
static decltype(&cuStreamIsCapturing) drv_capturing;
static pthread_barrier_t bar;
static int *d_p;
static double per[MAXT][NMODES][ROUNDS];

static uint64_t now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

extern "C" cudaError_t __cudaPopCallConfiguration(dim3 *, dim3 *, size_t *, void *);

// What a <<<>>> launch does with the runtime alone (crt/host_runtime.h).
static void program_launch(cudaKernel_t k, cudaStream_t s, void **args) {
    dim3 g, b;
    size_t shm;
    cudaStream_t st;
    __cudaPushCallConfiguration(dim3(1, 1, 1), dim3(1, 1, 1), 0, s);
    if (__cudaPopCallConfiguration(&g, &b, &shm, &st) == cudaSuccess) real_launch(k, g, b, args, shm, st);
}

static void launch_mode(int m, cudaStream_t s, void **args) {
    CUstreamCaptureStatus st;
    switch (m) {
    case M_REAL_COLD: program_launch(k_cold, s, args); break;
    case M_CHEV_COLD: cold<<<1, 1, 0, s>>>(d_p); break;
    case M_REAL_HOT: program_launch(k_hot, s, args); break;
    case M_CHEV_HOT: hotk<<<1, 1, 0, s>>>(d_p); break;
    case M_RAW: drv_launch((CUfunction)k_hot, 1, 1, 1, 1, 1, 1, 0, s, args, NULL); break;
    case M_HK: hk_launch(hk_k, {1, 1, 1}, {1, 1, 1}, 0, s, args, NULL); break;
    case M_QUERY:
        drv_capturing(s, &st);
        drv_launch((CUfunction)k_hot, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
        break;
    }
}

static void worker(int id) {
    cudaSetDevice(0);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    void *args[] = {&d_p};
    for (int m = 0; m < NMODES; m++) /* warm every path (and the clocks) */
        for (int i = 0; i < WARM; i++) launch_mode(m, s, args);
    cudaStreamSynchronize(s);
    for (int r = 0; r < ROUNDS; r++)
        for (int j = 0; j < NMODES; j++) {
            int m = (j + r) % NMODES;
            pthread_barrier_wait(&bar);
            uint64_t t0 = now_ns();
            for (int i = 0; i < PER_ROUND; i++) launch_mode(m, s, args);
            per[id][m][r] = (double)(now_ns() - t0) / PER_ROUND;
            cudaStreamSynchronize(s);
        }
    cudaStreamDestroy(s);
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static void run(int n) {
    pthread_barrier_init(&bar, NULL, (unsigned)n);
    std::vector<std::thread> t;
    for (int i = 0; i < n; i++) t.emplace_back(worker, i);
    for (auto &th : t) th.join();
    pthread_barrier_destroy(&bar);
    double med[NMODES], mean[NMODES][ROUNDS];
    for (int m = 0; m < NMODES; m++) {
        std::vector<double> rounds;
        for (int r = 0; r < ROUNDS; r++) {
            double sum = 0;
            for (int i = 0; i < n; i++) sum += per[i][m][r];
            rounds.push_back(mean[m][r] = sum / n);
        }
        med[m] = median(rounds);
    }
    // a / b: the median of the rounds' ratios, and of their differences (ns).
    auto ratio = [&](int a, int b) {
        std::vector<double> v;
        for (int r = 0; r < ROUNDS; r++) v.push_back(mean[a][r] / mean[b][r]);
        return median(v);
    };
    auto diff = [&](int a, int b) {
        std::vector<double> v;
        for (int r = 0; r < ROUNDS; r++) v.push_back(mean[a][r] - mean[b][r]);
        return median(v);
    };
    printf("interpose %d thread%s:", n, n > 1 ? "s" : "");
    for (int m = 0; m < NMODES; m++) printf(" %s %.0f ns;", mode_name[m], med[m]);
    printf("\n");
    printf("interpose %d thread%s: <<<>>> cold / runtime %.3f (%+.0f ns), <<<>>> hot / runtime "
           "%.3f (%+.0f ns), hk_launch / cuLaunchKernel %.3f (%+.0f ns), capture query + "
           "cuLaunchKernel / cuLaunchKernel %.3f (%+.0f ns)\n",
           n, n > 1 ? "s" : "", ratio(M_CHEV_COLD, M_REAL_COLD), diff(M_CHEV_COLD, M_REAL_COLD),
           ratio(M_CHEV_HOT, M_REAL_HOT), diff(M_CHEV_HOT, M_REAL_HOT), ratio(M_HK, M_RAW),
           diff(M_HK, M_RAW), ratio(M_QUERY, M_RAW), diff(M_QUERY, M_RAW));
    fflush(stdout);
}

int main() {
#ifdef HK_PRELOAD
    const char *way = "-cudart shared, LD_PRELOAD";
    void *rt_lib = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
    real_launch = rt_lib ? (klaunch_fn)dlsym(rt_lib, "__cudaLaunchKernel") : nullptr;
    if (!getenv("LD_PRELOAD") || !real_launch) {
        fprintf(stderr, "bench_interpose_shared: run with LD_PRELOAD=libhotkern-preload.so\n");
        return 2;
    }
#else
    const char *way = "static cudart, --wrap";
    real_launch = __real___cudaLaunchKernel;
#endif
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIP bench_interpose: no CUDA device\n");
        return 0;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    int drv = 0;
    cudaDriverGetVersion(&drv);
    char smi[256] = "";
    FILE *f = popen("nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.max.sm "
                    "--format=csv,noheader 2>/dev/null",
                    "r");
    if (f) {
        if (!fgets(smi, sizeof smi, f)) smi[0] = 0;
        pclose(f);
        smi[strcspn(smi, "\n")] = 0;
    }
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    printf("machine: %s (sm_%d%d), driver CUDA %d, nvidia-smi: driver, sm clock, max sm clock = "
           "%s, %s; %s\n",
           prop.name, prop.major, prop.minor, drv, smi, when, way);
    cudaDriverEntryPointQueryResult q;
    cudaGetDriverEntryPointByVersion("cuLaunchKernel", (void **)&drv_launch, 13000,
                                     cudaEnableDefault, &q);
    cudaGetDriverEntryPointByVersion("cuStreamIsCapturing", (void **)&drv_capturing, 13000,
                                     cudaEnableDefault, &q);
    cudaMalloc(&d_p, sizeof(int));
    cudaGetKernel(&k_cold, (const void *)cold);
    cudaGetKernel(&k_hot, (const void *)hotk);
    cold<<<1, 1>>>(d_p); /* registers both with the interposition */
    hotk<<<1, 1>>>(d_p);
    cudaDeviceSynchronize();
    hk_runtime *rt = hk_interpose_runtime();
    if (!rt) {
        fprintf(stderr, "no runtime: the interposition is not active\n");
        return 1;
    }
    const char *src = "extern \"C\" __global__ void hotk(int *p) { if (threadIdx.x == 0) *p = 2; }\n";
    hk_report rep;
    hk_report_init(&rep);
    if (hk_swap(rt, "bench", src, strlen(src), NULL, &rep) ||
        hk_kernel_get(rt, "bench", "hotk", &hk_k)) {
        fprintf(stderr, "hot version: %s\n", rep.message);
        return 1;
    }
    int h = 0;
    hotk<<<1, 1>>>(d_p);
    cudaMemcpy(&h, d_p, sizeof h, cudaMemcpyDeviceToHost);
    printf("interpose: hotk<<<>>> runs the hot version: %s (wrote %d)\n", h == 2 ? "yes" : "NO", h);
    if (h != 2) return 1;
    printf("interpose: empty kernels <<<1,1>>>, one non-blocking stream per thread, %d rounds of "
           "%d launches per mode, the modes' order rotated each round; median of the rounds' mean per "
           "launch, ratios the median of the rounds' ratios\n",
           ROUNDS, PER_ROUND);
    run(1);
    run(8);
    hk_report_clear(&rep);
    return 0;
}

// GPU suite: an ordinary nvcc program of several files, each with a
// file-local kernel `static __global__ void fill(float *)` and variable
// `static __device__ int bias` of the same names (tests/gpu_tu/a.cu writes
// bias, 2; b.cu writes bias + 40, 540), hot-reloaded through the
// interposition with a.cu watched and edited. Every launch must run its own
// file's code: a.cu's hot version or the program's own, never the other
// file's; each file's cudaMemcpyToSymbol must reach its own copies. Built
// twice (Makefile):
//   gpu_interpose_tu_shared  -cudart shared, run under LD_PRELOAD=libhotkern-preload.so
//   gpu_interpose_tu_static  nvcc's static cudart, linked with the --wrap flags
// Prints one line per check and a summary; exits 77 (SKIP) without a device.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "hotkern/hotkern.h"
#include "hotkern/interpose.h"

float tu_run_a(float *d);
float tu_run_b(float *d);
float tu_blur_a(float *d, int n);
void tu_set_a(int v);
void tu_set_b(int v);

static int passed, failed;
static void check(bool ok, const char *what) {
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    fflush(stdout);
    (ok ? passed : failed)++;
}

// a.cu as the watched copy has it: the same file, its fill edited to add
// `add` (host code guarded, as a team keeps it).
static std::string a_source(int mul, int add) {
    char b[1024];
    snprintf(b, sizeof b,
             "#ifndef __CUDACC_RTC__\n#include <cuda_runtime.h>\n#endif\n"
             "static __device__ int bias = 2;\n"
             "static __global__ void fill(float *p) {\n"
             "    if (threadIdx.x == 0) p[0] = (float)(bias * %d) + %d.0f;\n"
             "}\n"
             "template <int N> __global__ void blur(float *p) {\n"
             "    if (threadIdx.x == 0) p[0] = (float)(N * 10) + %d.0f;\n"
             "}\n",
             mul, add, add);
    return b;
}

static void write_file(const std::string &path, const std::string &text) {
    std::string tmp = path + ".tmp";
    FILE *f = fopen(tmp.c_str(), "w");
    fputs(text.c_str(), f);
    fclose(f);
    rename(tmp.c_str(), path.c_str()); // a rename-over save
}

static float *d_x;

// Polls until a.cu's fill gives want (a new version runs), up to 60 s.
static bool wait_a(float want) {
    for (int i = 0; i < 6000; i++) {
        if (tu_run_a(d_x) == want) return true;
        usleep(10000);
    }
    return false;
}

int main(int, char **argv) {
    const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
#ifdef HK_PRELOAD
    if (!getenv("HK_TEST_PRELOADED")) {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = '\0';
        std::string lib = self;
        lib = lib.substr(0, lib.rfind('/') + 1) + "../lib/libhotkern-preload.so";
        setenv("LD_PRELOAD", lib.c_str(), 1);
        setenv("HK_TEST_PRELOADED", "1", 1);
        execv("/proc/self/exe", argv);
        perror("execv");
        return 1;
    }
#endif
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIP %s: no usable CUDA device (%s)\n", name, cudaGetErrorString(cudaGetLastError()));
        return 77;
    }
    char tmpl[] = "/tmp/hotkern-interpose-tu-XXXXXX";
    std::string dir = mkdtemp(tmpl);
    std::string kdir = dir + "/kernels", file = kdir + "/a.cu";
    mkdir(kdir.c_str(), 0700);
    mkdir((dir + "/cache").c_str(), 0700);
    setenv("HOTKERN_WATCH", kdir.c_str(), 1);
    setenv("HOTKERN_CACHE_DIR", (dir + "/cache").c_str(), 1);
    cudaMalloc(&d_x, sizeof(float) * 32);

    // Before any hot version: each file's own code.
    float a0 = tu_run_a(d_x), b0 = tu_run_b(d_x), t0 = tu_blur_a(d_x, 2);
    printf("  before: a.cu's fill %g, b.cu's fill %g, blur<2> %g\n", a0, b0, t0);
    check(a0 == 2.0f && b0 == 540.0f && t0 == 20.0f,
          "each file's fill runs its own code (2 and 540), blur<2> the program's (20)");
    hk_runtime *rt = hk_interpose_runtime();
    check(rt != nullptr, "the interposition made a runtime from HOTKERN_*");

    // a.cu edited: its fill adds 1000.
    write_file(file, a_source(1, 1000));
    bool swapped = wait_a(1002.0f);
    float b1 = tu_run_b(d_x);
    printf("  edit 1: a.cu's fill %g, b.cu's fill %g\n", tu_run_a(d_x), b1);
    check(swapped, "a.cu's fill runs a.cu's hot version (2 + 1000)");
    check(b1 == 540.0f, "b.cu's fill keeps b.cu's own code (540), not a.cu's hot one");

    // Each file's cudaMemcpyToSymbol(bias) reaches its own copies.
    tu_set_b(40);
    float a2 = tu_run_a(d_x), b2 = tu_run_b(d_x);
    printf("  b.cu sets its bias to 40: a.cu %g, b.cu %g\n", a2, b2);
    check(b2 == 80.0f, "b.cu's cudaMemcpyToSymbol(bias, 40) reaches b.cu's copy (80)");
    check(a2 == 1002.0f, "... and not a.cu's hot copy (a.cu still 1002)");
    tu_set_a(5);
    float a3 = tu_run_a(d_x), b3 = tu_run_b(d_x);
    printf("  a.cu sets its bias to 5: a.cu %g, b.cu %g\n", a3, b3);
    check(a3 == 1005.0f, "a.cu's cudaMemcpyToSymbol(bias, 5) reaches a.cu's hot copy (1005)");
    check(b3 == 80.0f, "... and not b.cu's (b.cu still 80)");

    // A template instance first launched after the first hot build: its
    // file's source is built again with it, without a new save.
    float t2 = tu_blur_a(d_x, 2), t3 = tu_blur_a(d_x, 3);
    printf("  blur<2> %g (hot: 1020), blur<3> first launched: %g (the program's: 30)\n", t2, t3);
    bool late = false;
    for (int i = 0; i < 6000 && !late; i++) {
        late = tu_blur_a(d_x, 3) == 1030.0f;
        if (!late) usleep(10000);
    }
    printf("  blur<3> then %g, a.cu's fill %g\n", tu_blur_a(d_x, 3), tu_run_a(d_x));
    check(t2 == 1020.0f, "blur<2> runs a.cu's hot version");
    check(late, "blur<3>, first launched after the first build, runs a hot version without a save");
    check(tu_run_a(d_x) == 1005.0f && tu_run_b(d_x) == 80.0f,
          "the rebuild keeps a.cu's bias and leaves b.cu alone (1005, 80)");

    // A second edit carries a.cu's bias over; b.cu is untouched.
    write_file(file, a_source(3, 1000));
    swapped = wait_a(1015.0f);
    float b4 = tu_run_b(d_x);
    printf("  edit 2: a.cu's fill %g, b.cu's fill %g\n", tu_run_a(d_x), b4);
    check(swapped, "a.cu's second edit runs, with a.cu's bias carried over (5 * 3 + 1000)");
    check(b4 == 80.0f, "b.cu's fill still runs b.cu's own code (80)");

    // A module named after no file, with a.cu's source: by the names it is
    // a.cu's (which runs module "a" already), never b.cu's.
    if (rt) {
        std::string src = a_source(7, 7000);
        hk_report rep;
        hk_report_init(&rep);
        int err = hk_swap(rt, "sim", src.c_str(), src.size(), nullptr, &rep);
        float a5 = tu_run_a(d_x), b5 = tu_run_b(d_x);
        printf("  module 'sim' (%s): a.cu %g, b.cu %g\n", err ? hk_strerror(err) : "committed", a5,
               b5);
        check(err == 0 && a5 == 1015.0f && b5 == 80.0f,
              "a module no file is named after takes neither file's fill");
        hk_report_clear(&rep);
    }
    cudaError_t last = cudaDeviceSynchronize();
    check(last == cudaSuccess, "no CUDA error");
    cudaFree(d_x);
    printf("%d%%: Checks: %d, Failures: %d, Errors: 0\n",
           passed + failed ? 100 * passed / (passed + failed) : 0, passed + failed, failed);
    return failed ? 1 : 0;
}

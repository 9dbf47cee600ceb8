// What every program of tests/programs/ shares: an error-check macro, a frame
// loop that a runner steers through files in a control directory, and the
// check of what each launch wrote. Host code only (each .cu includes it inside
// #ifndef __CUDACC_RTC__, so a watched copy of the file compiles without it).
//
// Every kernel of these programs writes FILE * 1000000 + VERSION * 10000 +
// payload per element (payload < 10000, exact in a float): FILE says which
// source file's code ran, VERSION which edit of it, and the payload is what
// the host computes for that element, from the values it gave the kernel.
// Before each launch its output is filled with NaN (bytes 0xff), so a launch
// that did not run is seen too.
//
// Output, one line each, to stdout:
//   start NAME                     the program runs (after its setup)
//   SKIP NAME: why                 no CUDA device (exit status 77)
//   seen KERNEL vN frame F         KERNEL's output came from version N (printed
//                                  on the first frame and at each change)
//   frame F                        every 100 frames
//   BAD KERNEL frame F: why        a launch that did not run, ran another file's
//                                  code, or wrote wrong values; a CUDA error
//   done frames=F checked=C bad=B  the end; exit status 0 only when B is 0
// usage: PROGRAM CTLDIR [SECONDS]: runs until CTLDIR/stop exists (at most
// SECONDS, default 120).
#ifndef HOTKERN_TEST_PROG_H
#define HOTKERN_TEST_PROG_H

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

// The usual macro: a failed call is reported and ends the program.
#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            printf("BAD cuda frame %ld: %s failed at %s:%d: %s (%s)\n", prog::frame(), #call,      \
                   __FILE__, __LINE__, cudaGetErrorString(err_), cudaGetErrorName(err_));          \
            fflush(stdout);                                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

namespace prog {

using clock_type = std::chrono::steady_clock;

inline std::string ctl_dir;
inline double limit_s = 120;
inline clock_type::time_point t0;
inline std::atomic<long> frames{0}, bad_count{0}, checked{0};
inline std::mutex mu; // seen_list and the lines printed
struct seen_entry {
    std::string kernel;
    int version;
};
inline std::vector<seen_entry> seen_list;

inline long frame() {
    return frames.load();
}

// Exits 77 without a device; line_buffered: each line reaches the runner at
// once (otherwise the program flushes what it must show itself).
inline void start(int argc, char **argv, const char *name, bool line_buffered = true) {
    if (line_buffered)
        setvbuf(stdout, nullptr, _IOLBF, 0);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        printf("SKIP %s: no usable CUDA device (%s)\n", name,
               e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        fflush(stdout);
        exit(77);
    }
    if (argc < 2) {
        fprintf(stderr, "usage: %s CTLDIR [SECONDS]\n", argv[0]);
        exit(2);
    }
    ctl_dir = argv[1];
    if (argc > 2)
        limit_s = atof(argv[2]);
    t0 = clock_type::now();
}

inline void started(const char *name) {
    printf("start %s\n", name);
    fflush(stdout);
}

// Whether CTLDIR/name exists: how the runner steers the program.
inline bool flag(const char *name) {
    struct stat st;
    return stat((ctl_dir + "/" + name).c_str(), &st) == 0;
}

// The first line of CTLDIR/name, or "" when there is none.
inline std::string flag_text(const char *name) {
    std::string s;
    FILE *f = fopen((ctl_dir + "/" + name).c_str(), "r");
    if (!f)
        return s;
    char buf[256];
    if (fgets(buf, sizeof buf, f))
        s = buf;
    fclose(f);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
        s.pop_back();
    return s;
}

inline void bad(const char *kernel, const char *fmt, ...) {
    long n = ++bad_count;
    if (n > 20)
        return; // counted; the first ones say enough
    std::lock_guard<std::mutex> g(mu);
    printf("BAD %s frame %ld: ", kernel, frame());
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

inline bool running() {
    if (flag("stop"))
        return false;
    double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (s > limit_s) {
        bad("program", "ran %.0f s without being told to stop", s);
        return false;
    }
    return true;
}

// Prints KERNEL's version when it is new or differs from the last printed.
inline void seen(const char *kernel, int version) {
    std::lock_guard<std::mutex> g(mu);
    for (auto &s : seen_list) {
        if (s.kernel == kernel) {
            if (s.version != version) {
                s.version = version;
                printf("seen %s v%d frame %ld\n", kernel, version, frame());
                fflush(stdout);
            }
            return;
        }
    }
    seen_list.push_back({kernel, version});
    printf("seen %s v%d frame %ld\n", kernel, version, frame());
    fflush(stdout);
}

// Forgets what was seen of KERNEL: its next version is printed again.
inline void seen_reset(const char *kernel) {
    std::lock_guard<std::mutex> g(mu);
    for (auto &s : seen_list)
        if (s.kernel == kernel)
            s.version = -1;
}

// Decodes element i of a kernel's output: 1 with its version, or 0 after
// saying what is wrong with it.
inline bool decode(const char *kernel, const float *h, int i, int file, int payload, int *version) {
    float x = h[i];
    if (std::isnan(x)) {
        bad(kernel, "element %d was never written: the launch did not run", i);
        return false;
    }
    long v = (long)x;
    if ((float)v != x || v < 0) {
        bad(kernel, "element %d holds %g, which no version of any file writes", i, x);
        return false;
    }
    long f = v / 1000000, ver = v / 10000 % 100, p = v % 10000;
    if (f != file) {
        bad(kernel, "element %d was written by file %ld's code (version %ld), not file %d's", i, f,
            ver, file);
        return false;
    }
    if (p != payload) {
        bad(kernel, "element %d: file %d version %ld wrote payload %ld, want %d", i, file, ver, p,
            payload);
        return false;
    }
    *version = (int)ver;
    return true;
}

// Checks the n elements one launch of KERNEL wrote (all of one version);
// payload(i) is what element i must hold. Returns the version, or -1.
template <typename F>
inline int check(const char *kernel, const float *h, int n, int file, F payload) {
    int first = -1;
    for (int i = 0; i < n; i++) {
        int v;
        if (!decode(kernel, h, i, file, payload(i), &v))
            return -1;
        if (i == 0)
            first = v;
        else if (v != first) {
            bad(kernel, "one launch wrote version %d at element 0 and %d at element %d", first, v,
                i);
            return -1;
        }
    }
    ++checked;
    seen(kernel, first);
    return first;
}

// The end of a frame; the half millisecond stands for the frame's other work.
inline void frame_end() {
    long f = ++frames;
    usleep(500);
    if (f % 100 == 0) {
        std::lock_guard<std::mutex> g(mu);
        printf("frame %ld\n", f);
        fflush(stdout);
    }
}

// The end: the device's last errors, the summary; the exit status.
inline int finish() {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
        bad("cuda", "cudaDeviceSynchronize at the end: %s", cudaGetErrorName(e));
    e = cudaGetLastError();
    if (e != cudaSuccess)
        bad("cuda", "cudaGetLastError at the end: %s", cudaGetErrorName(e));
    printf("done frames=%ld checked=%ld bad=%ld\n", frames.load(), checked.load(),
           bad_count.load());
    return bad_count.load() ? 1 : 0;
}

} // namespace prog

#endif

// What a swap costs a frame loop beside a long kernel (bench/RESULTS.md;
// issue "a frame's stall per swap"), and what an interposed synchronisation
// costs against the program's own.
//
// An ordinary nvcc program, built twice as the GPU suite is: under
// LD_PRELOAD with -cudart shared (bench_frame_stall_shared) and with static
// cudart and --wrap (bench_frame_stall_static). Its frame loop, on one
// thread: frame_k<<<>>> (FRAME_US of GPU work) on its stream, a copy of the
// kernel's output back, cudaStreamSynchronize of that stream; then, when the
// long kernel on the other stream has ended (cudaStreamQuery), long_k<<<>>>
// (LONG_MS) again. The gap is the time between two frames' synchronisations
// (a span's first gap counts from the span's start, never the bench's work).
// It never calls hotkern: hot versions of frame_k come from a watched
// directory (HOTKERN_WATCH), written by another thread, each a real edit
// (the tag it stores). Printed, side by side in one run:
//   baseline   the longest gap (and p99) of BASE_S seconds with no swap
//   swaps      the longest gap over SWAPS swaps, each from the save until
//              AFTER_MS after its version first ran (its unload of the
//              version it replaced included), and each swap's own
//   verdict    swaps' longest gap - baseline's, against the target +1 ms
// Then the cost of cudaStreamSynchronize of an idle stream, interposed
// against the runtime's own (dlsym / __real_), ROUNDS alternating rounds,
// the median of the rounds' mean: with nothing pending (target <= 1.01x),
// and while a version waits for a safe point that a long kernel on another
// stream keeps from coming (the idle check's cost, reported).
// HOTKERN_AUTO_SAFE_POINTS=0 shows the behaviour without automatic safe
// points (uploads and unloads as soon as they are ready).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef HK_PRELOAD
#include <dlfcn.h>
#endif

#include "hotkern/hotkern.h"
#include "hotkern/interpose.h"

enum { FRAME_US = 200, LONG_MS = 100, BASE_S = 5, SWAPS = 10, AFTER_MS = 300 };
enum { ROUNDS = 15, PER_ROUND = 20000 };

#define GTIME(t) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t))

extern "C" __global__ void frame_k(int *out, long long spin_ns) {
    unsigned long long t0, t;
    GTIME(t0);
    do {
        GTIME(t);
    } while ((long long)(t - t0) < spin_ns);
    if (threadIdx.x == 0) out[0] = 1;
}

extern "C" __global__ void long_k(long long spin_ns) {
    unsigned long long t0, t;
    GTIME(t0);
    do {
        GTIME(t);
    } while ((long long)(t - t0) < spin_ns);
}

// A hot version of frame_k: the same work, another tag.
static std::string hot_source(int tag) {
    char b[1024];
    snprintf(b, sizeof b,
             "#define GTIME(t) asm volatile(\"mov.u64 %%0, %%%%globaltimer;\" : \"=l\"(t))\n"
             "extern \"C\" __global__ void frame_k(int *out, long long spin_ns) {\n"
             "    unsigned long long t0, t;\n"
             "    GTIME(t0);\n"
             "    do {\n"
             "        GTIME(t);\n"
             "    } while ((long long)(t - t0) < spin_ns);\n"
             "    if (threadIdx.x == 0) out[0] = %d;\n"
             "}\n",
             tag);
    return b;
}

typedef cudaError_t (*sync_fn)(cudaStream_t);
#ifndef HK_PRELOAD
extern "C" cudaError_t __real_cudaStreamSynchronize(cudaStream_t);
#endif
static sync_fn own_sync;

static double now_ms() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// ---- the writer: saves a version when asked ---------------------------------

static std::string g_file;
static std::atomic<int> want_tag{0}, written_tag{0};
static std::atomic<bool> writer_stop{false};

static void writer() {
    int done = 0;
    while (!writer_stop.load()) {
        int w = want_tag.load();
        if (w == done) {
            usleep(200);
            continue;
        }
        std::string tmp = g_file + ".tmp", text = hot_source(w);
        FILE *f = fopen(tmp.c_str(), "w");
        if (f) {
            fputs(text.c_str(), f);
            fclose(f);
            rename(tmp.c_str(), g_file.c_str()); // a rename-over save
        }
        done = w;
        written_tag.store(w);
    }
}

// ---- the frame loop ---------------------------------------------------------

static cudaStream_t fs, side;
static int *d_out, *h_out;
static double prev_t;

// Where a frame's time went: each call's ms, and when it began.
struct parts {
    double gap = 0, launch = 0, copy = 0, sync = 0, query = 0, relaunch = 0, at = 0;
};
static parts last_frame;

// One frame; returns its gap (ms since the previous frame's end). Its parts
// go to last_frame.
static double frame() {
    parts p;
    double t0 = now_ms();
    p.at = t0;
    frame_k<<<1, 32, 0, fs>>>(d_out, FRAME_US * 1000LL);
    double t1 = now_ms();
    cudaMemcpyAsync(h_out, d_out, sizeof(int), cudaMemcpyDeviceToHost, fs);
    double t2 = now_ms();
    cudaStreamSynchronize(fs);
    double t = now_ms(), gap = t - prev_t;
    prev_t = t;
    bool idle = cudaStreamQuery(side) == cudaSuccess;
    double t4 = now_ms();
    if (idle) long_k<<<1, 32, 0, side>>>(LONG_MS * 1000000LL);
    double t5 = now_ms();
    p.gap = gap, p.launch = t1 - t0, p.copy = t2 - t1, p.sync = t - t2, p.query = t4 - t,
    p.relaunch = t5 - t4;
    last_frame = p;
    return gap;
}

// The frame of the longest gap in a span, and the one before it (whose query
// and relaunch fall in that gap).
struct worst {
    parts before, at;
    void see(const parts &prev, const parts &cur) {
        if (cur.gap > at.gap) before = prev, at = cur;
    }
};

static double t_start; // for the trace: ms from the program's start

static void print_worst(const char *what, const worst &w, double t0) {
    printf("frame_stall: %s: longest gap %.3f ms at +%.1f ms (t=%.3f); the frame before: query "
           "%.3f relaunch %.3f; its own: launch %.3f copy %.3f sync %.3f (ms)\n",
           what, w.at.gap, w.at.at - t0, w.at.at - t_start, w.before.query, w.before.relaunch,
           w.at.launch, w.at.copy, w.at.sync);
}

// STALL_TRACE=1: the runtime's debug log on stderr, each line with its time
// (t=, ms from the program's start, as the worst frames above).
static void trace_log(hk_log_level level, const char *sub, const char *msg, void *) {
    fprintf(stderr, "t=%.3f %s %s: %s\n", now_ms() - t_start, hk_log_level_name(level), sub, msg);
}

struct stats {
    double max = 0, p99 = 0;
    long n = 0;
};

static stats summarize(std::vector<double> &g) {
    stats s;
    s.n = (long)g.size();
    if (g.empty()) return s;
    std::sort(g.begin(), g.end());
    s.max = g.back();
    s.p99 = g[(size_t)(0.99 * (g.size() - 1))];
    return s;
}

// A span of frames begins: its first gap starts now, so that no gap holds
// the bench's own bookkeeping between spans (sorting a span's gaps takes
// longer than a frame).
static void span_start() {
    prev_t = now_ms();
}

// Frames for ms milliseconds; their gaps appended to g, the worst to w.
static void frames_for(double ms, std::vector<double> &g, worst *w = nullptr) {
    double end = now_ms() + ms;
    while (now_ms() < end) {
        parts prev = last_frame;
        g.push_back(frame());
        if (w) w->see(prev, last_frame);
    }
}

// Saves version tag and runs frames until it runs (up to 30 s), then
// AFTER_MS more. Returns the ms from the request to the first frame that
// ran it (-1: never); the gaps go to g.
static double swap_to(int tag, std::vector<double> &g, worst *w = nullptr,
                      double *start = nullptr) {
    span_start();
    double t0 = now_ms();
    if (start) *start = t0;
    want_tag.store(tag);
    double seen = -1;
    while (now_ms() - t0 < 30000) {
        parts prev = last_frame;
        g.push_back(frame());
        if (w) w->see(prev, last_frame);
        if (*h_out == tag) {
            seen = now_ms() - t0;
            break;
        }
    }
    if (seen >= 0) frames_for(AFTER_MS, g, w);
    return seen;
}

// ---- the cost of a synchronisation ------------------------------------------

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// ns per cudaStreamSynchronize of idle stream s: interposed and own, in
// alternating rounds.
static void sync_cost(cudaStream_t s, int rounds, int per, double *interposed, double *own) {
    std::vector<double> a, b;
    for (int r = 0; r < rounds; r++) // each mode first in every other round
        for (int m = 0; m < 2; m++) {
            bool via = (m == 0) == (r % 2 == 0);
            double t0 = now_ms();
            if (via)
                for (int i = 0; i < per; i++) cudaStreamSynchronize(s);
            else
                for (int i = 0; i < per; i++) own_sync(s);
            (via ? a : b).push_back((now_ms() - t0) * 1e6 / per);
        }
    *interposed = median(a);
    *own = median(b);
}

int main(int argc, char **argv) {
#ifdef HK_PRELOAD
    // Run as users do: under LD_PRELOAD (re-executed with it when not set).
    if (!getenv("LD_PRELOAD")) {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = '\0';
        std::string lib = self;
        lib = lib.substr(0, lib.rfind('/') + 1) + "../lib/libhotkern-preload.so";
        setenv("LD_PRELOAD", lib.c_str(), 1);
        execv("/proc/self/exe", argv);
        perror("execv");
        return 2;
    }
    const char *way = "-cudart shared, LD_PRELOAD";
    void *rt_lib = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
    own_sync = rt_lib ? (sync_fn)dlsym(rt_lib, "cudaStreamSynchronize") : nullptr;
    if (!getenv("LD_PRELOAD") || !own_sync || own_sync == (sync_fn)cudaStreamSynchronize) {
        fprintf(stderr, "bench_frame_stall_shared: run with LD_PRELOAD=libhotkern-preload.so\n");
        return 2;
    }
#else
    const char *way = "static cudart, --wrap";
    own_sync = __real_cudaStreamSynchronize;
#endif
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIP bench_frame_stall: no CUDA device\n");
        return 0;
    }
    char tmpl[] = "/tmp/hotkern-stall-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    std::string dir = tmpl, kdir = dir + "/kernels";
    mkdir(kdir.c_str(), 0700);
    mkdir((dir + "/cache").c_str(), 0700);
    g_file = kdir + "/frame.cu";
    // Read at the first launch (the interposition's runtime comes then).
    setenv("HOTKERN_WATCH", kdir.c_str(), 1);
    setenv("HOTKERN_CACHE_DIR", (dir + "/cache").c_str(), 1);
    const char *autosp = getenv("HOTKERN_AUTO_SAFE_POINTS");
    bool auto_on = !autosp || strcmp(autosp, "0");

    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    time_t tnow = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&tnow));
    printf("machine: %s (sm_%d%d); %s; %s; automatic safe points %s\n", prop.name, prop.major,
           prop.minor, when, way, auto_on ? "on" : "off (HOTKERN_AUTO_SAFE_POINTS=0)");
    cudaStreamCreateWithFlags(&fs, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaMalloc(&d_out, sizeof(int));
    cudaMallocHost(&h_out, sizeof(int));
    std::thread w(writer);
    t_start = now_ms();

    // The program's own code, and the long kernel in flight from now on.
    std::vector<double> warm, first, base, swaps;
    prev_t = now_ms();
    frames_for(500, warm);
    hk_runtime *rt = hk_interpose_runtime();
    const char *trace = getenv("STALL_TRACE");
    if (rt && trace && !strcmp(trace, "1")) hk_runtime_set_log(rt, trace_log, NULL, HK_LOG_DEBUG);
    if (!rt || *h_out != 1) {
        fprintf(stderr, "no runtime (the interposition is not active) or frame_k wrote %d\n",
                *h_out);
        return 1;
    }
    // The first hot version (the module's creation, NVRTC's first compile).
    double first_ms = swap_to(100, first);
    stats fst = summarize(first);
    printf("frame_stall: frame_k %d us of GPU work + cudaStreamSynchronize each frame, long_k %d "
           "ms relaunched on another stream whenever it ends\n",
           FRAME_US, LONG_MS);
    printf("frame_stall: first version: ran after %.0f ms; longest gap %.3f ms\n", first_ms,
           fst.max);
    if (first_ms < 0) {
        printf("FAIL the first hot version never ran\n");
        return 1;
    }
    worst bw;
    span_start();
    double base_t0 = now_ms();
    frames_for(BASE_S * 1000.0, base, &bw);
    stats bs = summarize(base);
    worst sw[SWAPS + 1];
    double sw_t0[SWAPS + 1];
    int seen = 0;
    double worst_swap = 0;
    int worst_i = 0;
    printf("frame_stall: swaps:");
    for (int i = 1; i <= SWAPS; i++) {
        std::vector<double> g;
        double ms = swap_to(100 + i, g, &sw[i], &sw_t0[i]);
        seen += ms >= 0;
        stats s = summarize(g);
        if (s.max > worst_swap) worst_swap = s.max, worst_i = i;
        printf(" #%d %.0f ms/%.3f", i, ms, s.max);
        swaps.insert(swaps.end(), g.begin(), g.end());
    }
    printf(" (each: save to first run / its longest gap, ms)\n");
    // Where the time of each longest gap went (the baseline's, the first
    // swap's and the worst swap's), from the start of the span.
    print_worst("baseline", bw, base_t0);
    print_worst("swap #1", sw[1], sw_t0[1]);
    if (worst_i != 1) {
        char b[32];
        snprintf(b, sizeof b, "swap #%d", worst_i);
        print_worst(b, sw[worst_i], sw_t0[worst_i]);
    }
    stats ss = summarize(swaps);
    printf("frame_stall: baseline (no swaps, %d s, %ld frames): longest gap %.3f ms, p99 %.3f ms\n",
           BASE_S, bs.n, bs.max, bs.p99);
    printf("frame_stall: %d swaps (%d of %d ran, %ld frames): longest gap %.3f ms (swap #%d), p99 "
           "%.3f ms\n",
           SWAPS, seen, SWAPS, ss.n, ss.max, worst_i, ss.p99);
    double over = ss.max - bs.max;
    bool ok = seen == SWAPS && over <= 1.0;
    printf("%s frame_stall: longest gap during swaps - baseline = %+.3f ms (target <= +1 ms)\n",
           ok ? "PASS" : "FAIL", over);

    // The cost of a synchronisation: nothing pending (the last replaced
    // version unloaded first, at an idle moment).
    for (int i = 0; i < 300; i++) {
        hk_stats st;
        hk_stats_init(&st);
        hk_stats_get(rt, &st);
        if (!st.retired_loaded) break;
        cudaStreamSynchronize(side);
        usleep(10000);
    }
    cudaStream_t cs;
    cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
    frame_k<<<1, 32, 0, cs>>>(d_out, 0); // one of the program's streams
    own_sync(cs);
    cudaStreamSynchronize(side);
    for (int i = 0; i < 2000; i++) cudaStreamSynchronize(cs), own_sync(cs); // warm both
    double ip = 0, on = 0;
    sync_cost(cs, ROUNDS, PER_ROUND, &ip, &on);
    printf("%s sync cost, nothing pending: cudaStreamSynchronize of an idle stream interposed %.1f "
           "ns, own %.1f ns: %.4fx (%+.1f ns; target <= 1.01x)\n",
           ip / on <= 1.01 ? "PASS" : "FAIL", ip, on, ip / on, ip - on);

    // While a version waits: the long kernel (1.2 s) keeps every check busy.
    if (auto_on) {
        long_k<<<1, 32, 0, side>>>(1200 * 1000000LL);
        uint64_t v0 = hk_module_version(rt, "frame");
        std::string src = hot_source(999);
        int sub = hk_submit(rt, "frame", src.c_str(), src.size(), NULL);
        int idle = hk_wait_idle(rt, 5000); // built; then it waits for a safe point
        double ipp = 0, onp = 0;
        sync_cost(cs, 5, 2000, &ipp, &onp);
        uint64_t v1 = hk_module_version(rt, "frame");
        cudaStreamSynchronize(side); // all idle: the safe point comes here
        uint64_t v2 = hk_module_version(rt, "frame");
        printf("%s sync cost, a version pending (long kernel on another stream, 3 streams "
               "tracked): interposed %.1f ns, own %.1f ns: %.3fx (%+.1f ns: the idle check); "
               "version %llu -> %llu while pending, %llu after the side stream's sync (submit %d, "
               "wait %d)\n",
               sub == 0 && idle == 0 && v1 == v0 && v2 == v0 + 1 ? "PASS" : "FAIL", ipp, onp,
               ipp / onp, ipp - onp, (unsigned long long)v0, (unsigned long long)v1,
               (unsigned long long)v2, sub, idle);
    }
    writer_stop.store(true);
    w.join();
    cudaDeviceSynchronize();
    (void)argc;
    (void)argv;
    return ok ? 0 : 1;
}

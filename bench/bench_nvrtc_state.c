/*
 * Why the same NVRTC compile is fast at some moments and several times
 * slower at others on a host: one process compiles the one-line kernel
 * (PCH, sm_90 cubin, a new constant each time, hkp_build as hotkern calls
 * it) again and again for a while, and records for every compile what the
 * host did meanwhile, so the slow compiles can be told apart from the fast
 * ones by cause rather than guessed at:
 *   - wall time and the compiling thread's CPU time (a slow compile that
 *     used as much CPU as a fast one waited: I/O, a lock; one that used
 *     more CPU ran on a slower CPU or did more work);
 *   - a fixed piece of integer work timed just before (if it slows with
 *     the compile, the CPU itself is slower: frequency, a neighbour on the
 *     same core);
 *   - the thread's page faults and context switches (a compile that faults
 *     in fresh memory, or is preempted);
 *   - the host's steal time (/proc/stat) over the compile;
 *   - where the kernel lets a process count them (perf_event_open; a VM
 *     may not), the thread's cycles and instructions: cycles per ms of
 *     CPU time is the clock the compile ran at, and instructions tell
 *     whether a slow compile did more work or the same work slower.
 * The series alternate compile by compile (default options; `-no-cache`,
 * NVRTC's lookup in the driver's compute cache off), in a first phase
 * without libcuda in the process and a second one after cuInit (hotkern's
 * processes always have the driver loaded: NVRTC consults the driver's
 * compute cache only then). A last phase compiles on a fresh thread each
 * time (hotkern's worker thread starts cold: a new malloc arena).
 *
 * usage: bench_nvrtc_state [SECONDS_PER_PHASE]   (default 40)
 */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <nvrtc.h>

#include "bench/common.h"

typedef struct sample {
    double wall, cpu, calib; /* ms */
    long minflt, majflt, nvcsw, nivcsw;
    double steal;           /* host steal over the compile, ms summed over CPUs */
    double mcycles, minstr; /* millions; -1: not counted here */
    int cpu0, cpu1;
} sample;

#define MAXS 4096
typedef struct series {
    const char *what;
    const char *const *opts;
    sample s[MAXS];
    int n;
} series;

static double ts_ms(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Fixed integer work (~1 ms on a 3 GHz core); volatile sink so it stays. */
static volatile unsigned long long sink;
static double calib_ms(void) {
    double t0 = ts_ms(CLOCK_MONOTONIC);
    unsigned long long x = 88172645463325252ull;
    for (int i = 0; i < 1000000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    sink = x;
    return ts_ms(CLOCK_MONOTONIC) - t0;
}

/* Host steal time in ms (all CPUs), from /proc/stat. */
static double steal_ms(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return 0;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    return n == 8 ? (double)v[7] * 1000.0 / (double)sysconf(_SC_CLK_TCK) : 0;
}

/* The calling thread's hardware counters (cycles, instructions), opened
 * per thread; -1 where the kernel does not let this process count them. */
static __thread int pc_fd[2] = {-2, -2};
static void pc_open(void) {
    if (pc_fd[0] != -2)
        return;
    static const unsigned long long cfg[2] = {PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_HW_INSTRUCTIONS};
    for (int i = 0; i < 2; i++) {
        struct perf_event_attr a;
        memset(&a, 0, sizeof a);
        a.size = sizeof a;
        a.type = PERF_TYPE_HARDWARE;
        a.config = cfg[i];
        a.exclude_kernel = 1;
        a.exclude_hv = 1;
        pc_fd[i] = (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    }
}
static void pc_read(double *v) {
    for (int i = 0; i < 2; i++) {
        unsigned long long c = 0;
        v[i] = pc_fd[i] >= 0 && read(pc_fd[i], &c, sizeof c) == (ssize_t)sizeof c ? c / 1e6 : -1;
    }
}
static void pc_close(void) {
    for (int i = 0; i < 2; i++)
        if (pc_fd[i] >= 0)
            close(pc_fd[i]);
    pc_fd[0] = pc_fd[1] = -2;
}

static int next_v = 1;
static const char *const *cur_opts;

static void compile_one(sample *out) {
    char *src = bench_variant(bench_fmt_tiny, next_v++ * 7919 + (int)getpid() % 7919);
    int nextra = 0;
    while (cur_opts && cur_opts[nextra])
        nextra++;
    hkp_build_opts o = {.arch = 90,
                        .nvrtc_options = cur_opts,
                        .nnvrtc_options = nextra,
                        .ptx_to_cubin = 1,
                        .opt_level = 3,
                        .pch = 1,
                        .source_name = "state.cu"};
    hkp_artifact a;
    char why[512];
    out->calib = calib_ms();
    struct rusage r0, r1;
    getrusage(RUSAGE_THREAD, &r0);
    double st0 = steal_ms();
    out->cpu0 = sched_getcpu();
    pc_open();
    double pc0[2], pc1[2];
    pc_read(pc0);
    double c0 = ts_ms(CLOCK_THREAD_CPUTIME_ID), w0 = ts_ms(CLOCK_MONOTONIC);
    if (hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why) < 0) {
        fprintf(stderr, "build failed: %s\n%s\n", why, a.log ? a.log : "");
        exit(1);
    }
    out->wall = ts_ms(CLOCK_MONOTONIC) - w0;
    out->cpu = ts_ms(CLOCK_THREAD_CPUTIME_ID) - c0;
    pc_read(pc1);
    out->mcycles = pc0[0] < 0 || pc1[0] < 0 ? -1 : pc1[0] - pc0[0];
    out->minstr = pc0[1] < 0 || pc1[1] < 0 ? -1 : pc1[1] - pc0[1];
    out->cpu1 = sched_getcpu();
    out->steal = steal_ms() - st0;
    getrusage(RUSAGE_THREAD, &r1);
    out->minflt = r1.ru_minflt - r0.ru_minflt;
    out->majflt = r1.ru_majflt - r0.ru_majflt;
    out->nvcsw = r1.ru_nvcsw - r0.ru_nvcsw;
    out->nivcsw = r1.ru_nivcsw - r0.ru_nivcsw;
    hkp_artifact_free(&a);
    free(src);
}

static void *thread_compile(void *arg) {
    compile_one(arg);
    pc_close();
    return NULL;
}

/* Fields of a sample, for fmed. */
typedef double (*field)(const sample *);
static double f_wall(const sample *x) {
    return x->wall;
}
static double f_cpu(const sample *x) {
    return x->cpu;
}
static double f_ratio(const sample *x) {
    return x->cpu / x->wall;
}
static double f_calib(const sample *x) {
    return x->calib;
}
static double f_minflt(const sample *x) {
    return (double)x->minflt;
}
static double f_vcsw(const sample *x) {
    return (double)x->nvcsw;
}
static double f_ivcsw(const sample *x) {
    return (double)x->nivcsw;
}
static double f_steal(const sample *x) {
    return x->steal;
}
static double f_ghz(const sample *x) {
    return x->mcycles < 0 ? -1 : x->mcycles / x->cpu / 1e3;
}
static double f_minstr(const sample *x) {
    return x->minstr;
}

/* Median of f over samples [from, to) of s whose wall is over thr (sel >
 * 0), at most thr (sel < 0), or any (sel 0); -1 when none. */
static double fmed(const series *s, int from, int to, field f, int sel, double thr) {
    static double v[MAXS];
    int k = 0;
    for (int i = from; i < to; i++) {
        const sample *x = &s->s[i];
        if ((sel > 0 && x->wall <= thr) || (sel < 0 && x->wall > thr))
            continue;
        v[k++] = f(x);
    }
    return k ? bench_median(v, k) : -1.0;
}

static int count_sel(const series *s, int from, int to, int sel, double thr) {
    int k = 0;
    for (int i = from; i < to; i++)
        k += sel > 0 ? s->s[i].wall > thr : s->s[i].wall <= thr;
    return k;
}

static void report(const char *phase, series *s, int ns, double t_phase) {
    printf("-- %s\n", phase);
    for (int k = 0; k < ns; k++) {
        series *x = &s[k];
        /* windows of ~10 s: a timeline per series */
        int per = x->n / (t_phase / 10 > 1 ? (int)(t_phase / 10) : 1);
        if (per < 1)
            per = 1;
        printf("  %s: %d compiles\n", x->what, x->n);
        printf("    %-8s %8s %8s %8s %8s %8s %8s\n", "window", "wall", "cpu", "cpu/wall", "calib",
               "minflt", "ivcsw");
        for (int w = 0; w * per < x->n; w++) {
            int a = w * per, b = a + per < x->n ? a + per : x->n;
            printf("    %-8d %8.2f %8.2f %8.2f %8.3f %8.0f %8.0f\n", w, fmed(x, a, b, f_wall, 0, 0),
                   fmed(x, a, b, f_cpu, 0, 0), fmed(x, a, b, f_ratio, 0, 0),
                   fmed(x, a, b, f_calib, 0, 0), fmed(x, a, b, f_minflt, 0, 0),
                   fmed(x, a, b, f_ivcsw, 0, 0));
        }
    }
    /* Fast against slow compiles, all series of the phase together: slow is
     * over 1.5x the phase's fastest-decile wall. */
    static series all;
    all.n = 0;
    for (int k = 0; k < ns; k++)
        for (int i = 0; i < s[k].n && all.n < MAXS; i++)
            all.s[all.n++] = s[k].s[i];
    static double v[MAXS];
    for (int i = 0; i < all.n; i++)
        v[i] = all.s[i].wall;
    bench_median(v, all.n); /* sorts v */
    double p10 = bench_pct(v, all.n, 10);
    double thr = 1.5 * p10;
    printf("  fast (wall <= %.2f ms = 1.5x the p10) vs slow compiles, medians:\n", thr);
    printf("    %-5s %5s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "", "n", "wall", "cpu",
           "cpu/wall", "calib", "minflt", "vcsw", "ivcsw", "steal", "GHz", "Minstr");
    for (int sel = -1; sel <= 1; sel += 2)
        printf("    %-5s %5d %8.2f %8.2f %8.2f %8.3f %8.0f %8.0f %8.0f %8.2f %8.2f %8.1f\n",
               sel < 0 ? "fast" : "slow", count_sel(&all, 0, all.n, sel, thr),
               fmed(&all, 0, all.n, f_wall, sel, thr), fmed(&all, 0, all.n, f_cpu, sel, thr),
               fmed(&all, 0, all.n, f_ratio, sel, thr), fmed(&all, 0, all.n, f_calib, sel, thr),
               fmed(&all, 0, all.n, f_minflt, sel, thr), fmed(&all, 0, all.n, f_vcsw, sel, thr),
               fmed(&all, 0, all.n, f_ivcsw, sel, thr), fmed(&all, 0, all.n, f_steal, sel, thr),
               fmed(&all, 0, all.n, f_ghz, sel, thr), fmed(&all, 0, all.n, f_minstr, sel, thr));
    int moved = 0;
    for (int i = 0; i < all.n; i++)
        moved += all.s[i].cpu0 != all.s[i].cpu1;
    printf("  compiles that moved CPU: %d of %d\n", moved, all.n);
}

static void run_phase(const char *phase, series *s, int ns, double secs, int fresh_thread) {
    for (int k = 0; k < ns; k++) { /* each series' first build (PCH), apart */
        sample junk;
        cur_opts = s[k].opts;
        compile_one(&junk);
    }
    double t0 = ts_ms(CLOCK_MONOTONIC);
    while (ts_ms(CLOCK_MONOTONIC) - t0 < secs * 1e3) {
        for (int k = 0; k < ns; k++) {
            series *x = &s[k];
            if (x->n >= MAXS)
                goto done;
            cur_opts = x->opts;
            if (fresh_thread) {
                pthread_t t;
                pthread_create(&t, NULL, thread_compile, &x->s[x->n]);
                pthread_join(t, NULL);
            } else
                compile_one(&x->s[x->n]);
            x->n++;
        }
    }
done:
    cur_opts = NULL;
    report(phase, s, ns, secs);
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 40;
    if (secs <= 0)
        secs = 40;
    char host[256] = "";
    gethostname(host, sizeof host);
    int maj = 0, min = 0;
    nvrtcVersion(&maj, &min);
    time_t t = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    printf("== bench_nvrtc_state: the one-line kernel, PCH, sm_90 cubin, new constant each time\n");
    printf("machine: %s, %ld CPUs, NVRTC %d.%d, %s, %.0f s per phase\n", host,
           sysconf(_SC_NPROCESSORS_ONLN), maj, min, date, secs);
    printf("(ms; calib: a fixed integer loop timed just before each compile; minflt, vcsw, ivcsw: "
           "the compiling thread's minor faults, voluntary and involuntary context switches; "
           "steal: the host's, all CPUs)\n");
    static const char *const no_cache[] = {"-no-cache", NULL};
    static series p1[2] = {{.what = "default"}, {.what = "-no-cache", .opts = no_cache}};
    run_phase("phase 1: no libcuda in the process", p1, 2, secs, 0);

    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    int (*cu_init)(unsigned) = cuda ? (int (*)(unsigned))dlsym(cuda, "cuInit") : NULL;
    int rc = cu_init ? cu_init(0) : -1;
    if (rc != 0) {
        printf("-- phases 2 and 3: SKIP (no driver: libcuda %s, cuInit %d)\n",
               cuda ? "loaded" : "not found", rc);
        return 0;
    }
    static series p2[2] = {{.what = "default"}, {.what = "-no-cache", .opts = no_cache}};
    run_phase("phase 2: after cuInit (libcuda loaded, as in every hotkern process)", p2, 2, secs,
              0);
    static series p3[2] = {{.what = "default"}, {.what = "-no-cache", .opts = no_cache}};
    run_phase("phase 3: after cuInit, each compile on a fresh thread (as a cold worker)", p3, 2,
              secs, 1);
    return 0;
}

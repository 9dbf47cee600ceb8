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
 * Phase 4 compares the process's memory settings side by side: one child
 * process per setting (this program again, GLIBC_TUNABLES in its
 * environment), each asked for one compile in turn, so the host's moments
 * fall on all of them alike. NVRTC allocates and frees tens of MB per
 * compile; with glibc's default thresholds much of it goes back to the
 * kernel and is faulted in (and zeroed) again by the next compile. The
 * settings: glibc as is; the heap kept (trim and mmap thresholds raised, a
 * top pad); malloc's memory on transparent huge pages
 * (glibc.malloc.hugetlb=1); both; both with the child pinned to one CPU;
 * the heap kept with NVRTC's code moved onto huge pages. It
 * also times the kernel's page fault on this machine (fresh anonymous
 * memory touched page by page, with and without MADV_HUGEPAGE). Phase 5
 * compiles one source again and again beside new ones: what NVRTC's lookup
 * in the driver's compute cache makes of a source it has seen.
 *
 * usage: bench_nvrtc_state [SECONDS_PER_PHASE [PHASES]]
 *        (default 40 s, phases "12345")
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
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
static int cur_same; /* compile one source again and again (phase 5) */
static int hold_cpu; /* keep the thread on its CPU for each compile (phase 4) */

static void compile_one(sample *out) {
    char *src = bench_variant(bench_fmt_tiny, cur_same ? 7 + (int)getpid() % 7919
                                                       : next_v++ * 7919 + (int)getpid() % 7919);
    cpu_set_t all;
    if (hold_cpu) {
        cpu_set_t one;
        sched_getaffinity(0, sizeof all, &all);
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu(), &one);
        sched_setaffinity(0, sizeof one, &one);
    }
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
    if (hold_cpu)
        sched_setaffinity(0, sizeof all, &all);
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

/* ---- phase 4: memory settings, one child process each ---- */

#define KEEP_HEAP                                                                                  \
    "glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432:"                  \
    "glibc.malloc.top_pad=67108864"
static const struct setting {
    const char *what, *tunables;
    int pin; /* 1: to one CPU for good (the highest allowed; pin 3: the next one); 2: held on the
                CPU it wakes on for each compile; 4: NVRTC's code moved onto huge pages */
} settings[] = {
    {"glibc as is", NULL, 0},
    {"heap kept (trim 256 MiB, mmap 32 MiB, top pad 64 MiB)", KEEP_HEAP, 0},
    {"malloc on huge pages (glibc.malloc.hugetlb=1)", "glibc.malloc.hugetlb=1", 0},
    {"both", KEEP_HEAP ":glibc.malloc.hugetlb=1", 0},
    {"both, pinned to one CPU", KEEP_HEAP ":glibc.malloc.hugetlb=1", 1},
    {"glibc as is, pinned to another CPU", NULL, 3},
    {"both, held on its CPU during each compile", KEEP_HEAP ":glibc.malloc.hugetlb=1", 2},
    {"heap kept, NVRTC's code on huge pages", KEEP_HEAP, 4},
};
#define NSET (int)(sizeof settings / sizeof settings[0])

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
/* Moves the 2 MiB-aligned inside of every executable mapping of NVRTC's and
 * nvJitLink's libraries onto anonymous transparent huge pages (a copy,
 * mapped over the original, collapsed, made executable again), before any
 * of their code runs on another thread: fewer instruction-TLB misses if
 * that is where a compile's time goes. Says on stderr what it did. */
static void huge_text(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char l[1024];
    struct {
        unsigned long a, b;
    } r[16];
    int n = 0;
    while (f && fgets(l, sizeof l, f) && n < 16) {
        unsigned long a, b;
        char perm[8], path[512] = "";
        if (sscanf(l, "%lx-%lx %7s %*s %*s %*s %511s", &a, &b, perm, path) < 3 || perm[2] != 'x' ||
            (!strstr(path, "libnvrtc") && !strstr(path, "libnvJitLink")))
            continue;
        unsigned long lo = (a + (2ul << 20) - 1) & ~((2ul << 20) - 1), hi = b & ~((2ul << 20) - 1);
        if (hi > lo)
            r[n].a = lo, r[n++].b = hi;
    }
    if (f)
        fclose(f);
    size_t total = 0;
    int collapsed = 0;
    for (int i = 0; i < n; i++) {
        size_t len = r[i].b - r[i].a;
        void *tmp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (tmp == MAP_FAILED)
            continue;
        memcpy(tmp, (void *)r[i].a, len);
        void *p = mmap((void *)r[i].a, len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p == MAP_FAILED) {
            perror("huge_text: mmap");
            _exit(1);
        }
        madvise(p, len, MADV_HUGEPAGE);
        memcpy(p, tmp, len);
        collapsed += madvise(p, len, MADV_COLLAPSE) == 0;
        mprotect(p, len, PROT_READ | PROT_EXEC);
        munmap(tmp, len);
        total += len;
    }
    fprintf(stderr, "  (huge pages: %zu MiB of NVRTC's code in %d ranges, %d collapsed)\n",
            total >> 20, n, collapsed);
}

/* The child: one compile per byte read on stdin, its sample on stdout. */
static int child_main(void) {
    if (getenv("HKB_HUGE_TEXT"))
        huge_text();
    const char *pin = getenv("HKB_PIN_CPU");
    hold_cpu = getenv("HKB_HOLD_CPU") != NULL;
    if (pin && *pin) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(atoi(pin), &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) {
            perror("sched_setaffinity"); /* the row would say pinned: not so */
            return 1;
        }
    }
    char c;
    while (read(0, &c, 1) == 1) {
        sample s;
        compile_one(&s);
        if (write(1, &s, sizeof s) != (ssize_t)sizeof s)
            return 1;
    }
    return 0;
}

typedef struct kid {
    pid_t pid;
    int to, from;
} kid;

/* The n-th highest CPU this process may run on (n = 0, 1), -1 if none. */
static int allowed_cpu(int n) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return -1;
    for (int c = CPU_SETSIZE - 1; c >= 0; c--)
        if (CPU_ISSET(c, &set) && n-- == 0)
            return c;
    return -1;
}

/* fd as the child's descriptor to (0 or 1), inherited across exec. */
static void child_fd(int fd, int to) {
    if (fd == to)
        fcntl(fd, F_SETFD, 0); /* dup2 would leave O_CLOEXEC on */
    else
        dup2(fd, to);
}

static int kid_start(kid *k, int i) {
    int a[2], b[2];
    if (pipe2(a, O_CLOEXEC))
        return -1;
    if (pipe2(b, O_CLOEXEC)) {
        close(a[0]), close(a[1]);
        return -1;
    }
    int cpu = settings[i].pin == 1 ? allowed_cpu(0) : settings[i].pin == 3 ? allowed_cpu(1) : -1;
    if ((settings[i].pin == 1 || settings[i].pin == 3) && cpu < 0) {
        fprintf(stderr, "%s: no CPU to pin to\n", settings[i].what);
        return -1;
    }
    k->pid = fork();
    if (k->pid < 0)
        return -1;
    if (k->pid == 0) {
        child_fd(a[0], 0);
        child_fd(b[1], 1);
        for (int j = 0; j < 2; j++) { /* what was not moved to 0 or 1 */
            if (a[j] > 1)
                close(a[j]);
            if (b[j] > 1)
                close(b[j]);
        }
        if (settings[i].tunables)
            setenv("GLIBC_TUNABLES", settings[i].tunables, 1);
        else
            unsetenv("GLIBC_TUNABLES");
        if (cpu >= 0) {
            char c[24];
            snprintf(c, sizeof c, "%d", cpu);
            setenv("HKB_PIN_CPU", c, 1);
        }
        if (settings[i].pin == 2)
            setenv("HKB_HOLD_CPU", "1", 1);
        if (settings[i].pin == 4)
            setenv("HKB_HUGE_TEXT", "1", 1);
        char *argv[] = {"bench_nvrtc_state", "--child", NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(a[0]), close(b[1]);
    k->to = a[1];
    k->from = b[0];
    return 0;
}

static int kid_compile(kid *k, sample *s) {
    size_t got = 0;
    if (write(k->to, "c", 1) != 1)
        return -1;
    while (got < sizeof *s) {
        ssize_t r = read(k->from, (char *)s + got, sizeof *s - got);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

/* Microseconds per page fault of fresh anonymous memory (64 MiB touched a
 * page at a time), with or without MADV_HUGEPAGE; median of 5. */
static double fault_us(int huge, long *faults) {
    const size_t len = 64u << 20;
    double v[5];
    for (int r = 0; r < 5; r++) {
        char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return -1;
        if (huge)
            madvise(p, len, MADV_HUGEPAGE);
        struct rusage r0, r1;
        getrusage(RUSAGE_SELF, &r0);
        double t0 = ts_ms(CLOCK_MONOTONIC);
        for (size_t o = 0; o < len; o += 4096)
            p[o] = 1;
        double t = ts_ms(CLOCK_MONOTONIC) - t0;
        getrusage(RUSAGE_SELF, &r1);
        *faults = r1.ru_minflt - r0.ru_minflt;
        v[r] = t * 1e3 / (double)(*faults > 0 ? *faults : 1);
        munmap(p, len);
    }
    return bench_median(v, 5);
}

static void phase_settings(double secs) {
    static series s[NSET];
    kid k[NSET];
    printf("-- phase 4: the process's memory settings, one child process each, compiles in turn\n");
    signal(SIGPIPE, SIG_IGN); /* a child that died is reported, not a silent end */
    long f0 = 0, f1 = 0;
    double u0 = fault_us(0, &f0), u1 = fault_us(1, &f1);
    printf("  page fault, fresh anonymous memory: %.2f us per fault (4 KiB pages, %ld faults per "
           "64 MiB); with MADV_HUGEPAGE %.2f us per fault (%ld faults)\n",
           u0, f0, u1, f1);
    for (int i = 0; i < NSET; i++) {
        s[i].what = settings[i].what;
        if (kid_start(&k[i], i) < 0) {
            perror("fork");
            exit(1);
        }
    }
    for (int w = 0; w < 3; w++) /* the PCH and the first compiles, apart */
        for (int i = 0; i < NSET; i++) {
            sample junk;
            if (kid_compile(&k[i], &junk) < 0) {
                fprintf(stderr, "child %d failed\n", i);
                exit(1);
            }
        }
    double t0 = ts_ms(CLOCK_MONOTONIC);
    while (ts_ms(CLOCK_MONOTONIC) - t0 < secs * 1e3 && s[NSET - 1].n < MAXS)
        for (int i = 0; i < NSET; i++)
            if (kid_compile(&k[i], &s[i].s[s[i].n++]) < 0) {
                fprintf(stderr, "child %d failed\n", i);
                exit(1);
            }
    for (int i = 0; i < NSET; i++) {
        close(k[i].to);
        close(k[i].from);
        waitpid(k[i].pid, NULL, 0);
    }
    printf("  %-56s %5s %8s %8s %8s %8s %8s %10s\n", "setting", "n", "wall", "p10", "p90", "cpu",
           "minflt", "vs as is");
    double base = fmed(&s[0], 0, s[0].n, f_wall, 0, 0);
    for (int i = 0; i < NSET; i++) {
        static double v[MAXS];
        for (int j = 0; j < s[i].n; j++)
            v[j] = s[i].s[j].wall;
        double med = bench_median(v, s[i].n);
        printf("  %-56s %5d %8.2f %8.2f %8.2f %8.2f %8.0f %9.2fx\n", s[i].what, s[i].n, med,
               bench_pct(v, s[i].n, 10), bench_pct(v, s[i].n, 90),
               fmed(&s[i], 0, s[i].n, f_cpu, 0, 0), fmed(&s[i], 0, s[i].n, f_minflt, 0, 0),
               med / base);
    }
    /* Paired ratios: each compile against the "as is" compile of its round. */
    printf("  paired, each round's compile / its round's 'glibc as is' compile, median:");
    for (int i = 1; i < NSET; i++) {
        static double v[MAXS];
        int n = s[i].n < s[0].n ? s[i].n : s[0].n;
        for (int j = 0; j < n; j++)
            v[j] = s[i].s[j].wall / s[0].s[j].wall;
        printf(" %.3f", bench_median(v, n));
    }
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--child") == 0)
        return child_main();
    double secs = argc > 1 ? atof(argv[1]) : 40;
    if (secs <= 0)
        secs = 40;
    const char *phases = argc > 2 ? argv[2] : "12345";
    char cpu[768];
    bench_cpu_line(cpu, sizeof cpu);
    int maj = 0, min = 0;
    nvrtcVersion(&maj, &min);
    printf("== bench_nvrtc_state: the one-line kernel, PCH, sm_90 cubin, new constant each time\n");
    printf("machine: %s, NVRTC %d.%d, %.0f s per phase\n", cpu, maj, min, secs);
    printf("(ms; calib: a fixed integer loop timed just before each compile; minflt, vcsw, ivcsw: "
           "the compiling thread's minor faults, voluntary and involuntary context switches; "
           "steal: the host's, all CPUs)\n");
    if (strchr(phases, '4'))
        phase_settings(secs);
    static const char *const no_cache[] = {"-no-cache", NULL};
    static series p1[2] = {{.what = "default"}, {.what = "-no-cache", .opts = no_cache}};
    if (strchr(phases, '1'))
        run_phase("phase 1: no libcuda in the process", p1, 2, secs, 0);
    if (!strchr(phases, '2') && !strchr(phases, '3') && !strchr(phases, '5'))
        return 0;

    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    int (*cu_init)(unsigned) = cuda ? (int (*)(unsigned))dlsym(cuda, "cuInit") : NULL;
    int rc = cu_init ? cu_init(0) : -1;
    if (rc != 0) {
        printf("-- phases 2 and 3: SKIP (no driver: libcuda %s, cuInit %d)\n",
               cuda ? "loaded" : "not found", rc);
        return 0;
    }
    static series p2[2] = {{.what = "default"}, {.what = "-no-cache", .opts = no_cache}};
    if (strchr(phases, '2'))
        run_phase("phase 2: after cuInit (libcuda loaded, as in every hotkern process)", p2, 2,
                  secs, 0);
    static series p3[2] = {{.what = "default"}, {.what = "-no-cache", .opts = no_cache}};
    static series p5[3] = {{.what = "a new source each time"},
                           {.what = "one source compiled before, again"},
                           {.what = "the same, -no-cache", .opts = no_cache}};
    if (strchr(phases, '5')) {
        printf("-- phase 5: a source compiled before (cache hits), after cuInit\n");
        double t0 = ts_ms(CLOCK_MONOTONIC);
        for (int k = 0; k < 3; k++) {
            sample junk;
            cur_opts = p5[k].opts;
            cur_same = k > 0;
            compile_one(&junk);
        }
        while (ts_ms(CLOCK_MONOTONIC) - t0 < secs * 1e3 && p5[2].n < MAXS)
            for (int k = 0; k < 3; k++) {
                cur_opts = p5[k].opts;
                cur_same = k > 0;
                compile_one(&p5[k].s[p5[k].n++]);
            }
        cur_same = 0;
        cur_opts = NULL;
        for (int k = 0; k < 3; k++)
            printf("  %-36s %5d compiles, median %.2f ms, cpu %.2f ms\n", p5[k].what, p5[k].n,
                   fmed(&p5[k], 0, p5[k].n, f_wall, 0, 0), fmed(&p5[k], 0, p5[k].n, f_cpu, 0, 0));
    }
    if (strchr(phases, '3'))
        run_phase("phase 3: after cuInit, each compile on a fresh thread (as a cold worker)", p3, 2,
                  secs, 1);
    return 0;
}

/*
 * What a bad push costs a live program on the same GPU, kind by kind.
 *
 * The live program: a thread of this process with a CUDA module of its own
 * (not hotkern's), launching `live(float *x, int n)` (x[i] += 1) over its
 * own 64 Ki floats on its own stream and synchronising after each launch,
 * without pause, recording every launch-to-completion time. Its longest
 * one with no push is the baseline (measured first, and again at the end).
 *
 * The pushes: hk_swap of module "m" (PTX built before anything is
 * measured, so that a push's build is nvJitLink's alone; policy REQUIRE,
 * as a network push), whose kernel `work(float
 * *x, int n)` has one test launch over 1 MiB (n = 262144, compared as
 * floats with the running version). The running version does n / 2
 * dependent multiply-adds per thread and adds 1; each push kind is one
 * version of it:
 *
 *   correct    the same outputs, another image
 *   fault      a store to an illegal address
 *   oob_read   a read 4 KiB past the 1 MiB buffer, in valid memory
 *   stack      a recursion that overflows the stack
 *   trap       __trap() in one thread (PTX: the canary's trap guard sees
 *              it and its test launch runs the guarded copy)
 *   trap_cubin the same pushed as a cubin: no PTX, so no guard, and the
 *              trap reaches the GPU as before
 *   assert     a device-side assert() that fails in one thread (a trap
 *              after its message: guarded as a trap is)
 *   endless    a loop that never ends (the helper is killed at the 2000 ms
 *              timeout)
 *   wrong      x[i] + 1.5
 *   nan        a NaN in element 0
 *   slow10     the same outputs after ten times the work
 *
 * For each kind: the outcome (committed, or refused and with which kind),
 * the push's time and the canary's part of it, and the live program's
 * longest launch+sync from the push's start to 300 ms after its end,
 * against the baseline. The running version is put back (no canary) after
 * a push that committed, and 1 s separates pushes. Two rounds, side by side:
 * "plain" (memcheck off) and "memcheck" (options.canary_sanitizer = 1; when
 * compute-sanitizer cannot be had, the line says why and that round is
 * left out). A third round, "light" (memcheck off), pushes the correct,
 * wrong and NaN kinds with 1/32 of the work (n / 64 multiply-adds per
 * thread): what a push costs the live program is bounded by how long the
 * canary's own test launch holds the GPU (contexts are time-sliced).
 *
 *   bench_canary_cost [plain,memcheck,light] [baseline seconds]
 *
 * Self-checking on a device: every outcome must be the expected one (a
 * kind of refusal, or a commit), no live launch may fail and the live
 * buffer must hold exactly its launch count; otherwise the last line says
 * what was not and the exit status is 1. SKIP (77) without a device. With
 * HK_LIBCUDA=BUILD/lib/libhotkern-fakecuda.so it runs on the CPU (the
 * fake faults nothing: outcomes are printed, not checked). Asserts nothing
 * about speed: the numbers are for bench/RESULTS.md.
 */
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "bench/common.h"
#include "hotkern/hotkern.h"

#define N_TEST  (1 << 18) /* the test launch's floats: 1 MiB */
#define N_LIVE  (1 << 16) /* the live program's */
#define TAIL_MS 300       /* a push's window goes on this long after it returns */
#define GAP_US  1000000   /* between pushes */

/* ---- the versions --------------------------------------------------------- */

#define HEAD                                                                                       \
    "extern \"C\" __global__ void work(float *x, int n) {\n"                                       \
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
#define LOOP(iters)                                                                                \
    "  float acc = 0.0f;\n"                                                                        \
    "  for (int k = 0; k < " iters "; k++) acc = acc * 0.999f + 1.0f;\n"
/* acc converges to 1000: the condition never holds, and the compiler cannot
 * drop the loop. */
#define STORE "  if (i < n) x[i] = x[i] + 1.0f + (acc > 1e30f ? 1.0f : 0.0f);\n"

static const char *base_src = HEAD LOOP("n / 2") STORE "}\n";

typedef struct kind {
    const char *name, *src;
    const char *plain, *memcheck; /* the expected outcome: "committed" or a refusal kind;
                                   * "fault|memcheck": either */
    int cubin;                    /* pushed as a cubin (else PTX) */
} kind;

static const kind kinds[] = {
    {"correct",
     HEAD LOOP("n / 2") STORE "}\nextern \"C\" __global__ void pad(int *p) { *p = 1; }\n",
     "committed", "committed", 0},
    {"fault", HEAD LOOP("n / 2") "  if (i < n) ((volatile float *)0x10)[i] = x[i] + acc;\n}\n",
     "fault", "memcheck", 0},
    {"oob_read",
     HEAD LOOP("n / 2") "  float far = i < 1024 ? ((volatile float *)x)[n + 1024 + i] : 0.0f;\n"
                        "  if (i < n) x[i] = x[i] + 1.0f + (far == 1234.5f && acc > 1e30f ? 1.0f "
                        ": 0.0f);\n}\n",
     "committed", "memcheck", 0},
    {"stack",
     "__device__ __noinline__ float deep(const float *x, int d) {\n"
     "  float pad[64];\n"
     "  for (int k = 0; k < 64; k++) pad[k] = x[k] + (float)d;\n"
     "  return d > 0 ? deep(x, d - 1) + pad[d & 63] : pad[0];\n"
     "}\n" HEAD LOOP("n / 2") STORE "  if (i == 0) x[0] = deep(x, n);\n}\n",
     "fault", "fault|memcheck", 0},
    {"trap", HEAD LOOP("n / 2") "  if (i == 7) __trap();\n" STORE "}\n", "fault", "fault", 0},
    {"trap_cubin", HEAD LOOP("n / 2") "  if (i == 7) __trap();\n" STORE "}\n", "fault",
     "fault|memcheck", 1},
    {"assert", HEAD LOOP("n / 2") "  assert(i != 7);\n" STORE "}\n", "fault", "fault", 0},
    {"endless",
     HEAD "  while (((volatile float *)x)[0] > -1.0f) {\n  }\n  if (i < n) x[i] = 0.0f;\n}\n",
     "hang", "hang", 0},
    {"wrong",
     HEAD LOOP("n / 2") "  if (i < n) x[i] = x[i] + 1.5f + (acc > 1e30f ? 1.0f : 0.0f);\n}\n",
     "mismatch", "mismatch", 0},
    {"nan",
     HEAD LOOP("n / 2") "  if (i < n) x[i] = i == 0 ? __int_as_float(0x7fc00000) : x[i] + 1.0f + "
                        "(acc > 1e30f ? 1.0f : 0.0f);\n}\n",
     "mismatch", "mismatch", 0},
    {"slow10", HEAD LOOP("n * 5") STORE "}\n", "slower", "slower", 0},
};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

static void *base_img, *img[NKINDS];
static size_t base_size, img_size[NKINDS];
/* The light round's (NULL: the kind is not pushed there). */
static void *lbase_img, *limg_k[NKINDS];
static size_t lbase_size, limg_size[NKINDS];

/* src with every "n / 2" (the work per thread) made "n / 64"; malloc'd. */
static char *lighten(const char *src) {
    char *out = malloc(strlen(src) * 2 + 1), *o = out;
    if (!out)
        exit(1);
    for (const char *p = src; *p;)
        if (!strncmp(p, "n / 2", 5)) {
            o += sprintf(o, "n / 64");
            p += 5;
        } else
            *o++ = *p++;
    *o = '\0';
    return out;
}

/* ---- the live program ----------------------------------------------------- */

enum { LIVE_MAX = 1 << 23 };
static struct {
    pthread_t thread;
    atomic_int stop;
    atomic_long n;     /* entries recorded (a ring of LIVE_MAX); each written before n counts it */
    uint64_t *end_ns;  /* when each launch+sync ended */
    float *ms;         /* how long it took */
    atomic_long fails; /* launches or synchronises that failed */
    long launches;     /* the live thread's, read after it joined */
    CUfunction f;
    CUdeviceptr buf;
    CUcontext ctx;
} L;

static void *live_loop(void *arg) {
    (void)arg;
    bd.CtxSetCurrent(L.ctx);
    CUstream st;
    if (bd.StreamCreate(&st, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        atomic_fetch_add(&L.fails, 1);
        return NULL;
    }
    int n = N_LIVE;
    void *args[] = {&L.buf, &n};
    while (!atomic_load(&L.stop)) {
        uint64_t t0 = bench_ns();
        if (bd.LaunchKernel(L.f, N_LIVE / 256, 1, 1, 256, 1, 1, 0, st, args, NULL) != 0 ||
            bd.StreamSynchronize(st) != 0) {
            atomic_fetch_add(&L.fails, 1);
            break; /* a sticky error would fail every later call */
        }
        uint64_t t1 = bench_ns();
        L.launches++;
        long i = atomic_load_explicit(&L.n, memory_order_relaxed);
        L.end_ns[i % LIVE_MAX] = t1; /* a ring: the windows read are recent */
        L.ms[i % LIVE_MAX] = (float)((double)(t1 - t0) / 1e6);
        atomic_store_explicit(&L.n, i + 1, memory_order_release);
    }
    bd.StreamDestroy(st);
    return NULL;
}

/* The longest live launch+sync that ended in [from, to] (bench_ns), and how
 * many there were. */
static double live_max(uint64_t from, uint64_t to, long *count) {
    long n = atomic_load_explicit(&L.n, memory_order_acquire);
    double mx = 0;
    *count = 0;
    for (long i = n > LIVE_MAX ? n - LIVE_MAX : 0; i < n; i++) {
        long k = i % LIVE_MAX;
        if (L.end_ns[k] >= from && L.end_ns[k] <= to) {
            (*count)++;
            if (L.ms[k] > mx)
                mx = L.ms[k];
        }
    }
    return mx;
}

static double baseline(double secs) {
    uint64_t t0 = bench_ns();
    usleep((useconds_t)(secs * 1e6));
    long count;
    double mx = live_max(t0, bench_ns(), &count);
    printf("baseline, no push, %.1f s: %ld live launches, longest launch+sync %.3f ms\n", secs,
           count, mx);
    return mx;
}

/* ---- a round of pushes ---------------------------------------------------- */

static int swap(hk_runtime *rt, const void *image, size_t size, hk_canary_policy policy,
                hk_report *rep) {
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.canary = policy;
    so.stage = HK_STAGE_NOW;
    return hk_swap(rt, "m", image, size, &so, rep);
}

static int expected(const char *want, const char *got) {
    char w[64];
    snprintf(w, sizeof w, "%s", want);
    for (char *save = NULL, *t = strtok_r(w, "|", &save); t; t = strtok_r(NULL, "|", &save))
        if (!strcmp(t, got))
            return 1;
    return 0;
}

/* One round: a runtime with the given sanitizer mode, every kind pushed.
 * Returns the number of unexpected outcomes, or -1 when the round could
 * not run. */
static int round_of(const char *label, int sanitizer, int light, double base_ms, int check) {
    void *const *imgs = light ? limg_k : img;
    const size_t *sizes = light ? limg_size : img_size;
    char helper[PATH_MAX + 32];
    bench_canary_helper(helper, sizeof helper);
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = "";
    o.canary = 1;
    o.canary_helper = helper;
    o.canary_timeout_ms = 2000;
    o.canary_sanitizer = sanitizer;
    hk_runtime *rt = NULL;
    hk_report rep = HK_REPORT_INIT;
    if (hk_runtime_create(&rt, &o, &rep) < 0) {
        printf("%s: not run: %s\n", label, rep.message);
        hk_report_clear(&rep);
        return -1;
    }
    void *b_img = light ? lbase_img : base_img;
    size_t b_size = light ? lbase_size : base_size;
    if (swap(rt, b_img, b_size, HK_CANARY_SKIP, &rep) < 0) {
        printf("%s: the running version: %s\n", label, rep.message);
        hk_runtime_destroy(rt);
        return -1;
    }
    hk_kernel *k;
    hk_test *t;
    int n = N_TEST;
    hk_kernel_get(rt, "m", "work", &k);
    hk_test_create(&t, (hk_dim3){N_TEST / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0);
    hk_test_buffer(t, N_TEST * sizeof(float), HK_FILL_IOTA_F32, 0, NULL);
    hk_test_scalar(t, &n, sizeof n);
    hk_test_compare(t, HK_COMPARE_F32, 0, 0);
    if (hk_kernel_add_test(k, t, &rep) < 0) {
        printf("%s: test: %s\n", label, rep.message);
        hk_runtime_destroy(rt);
        return -1;
    }
    hk_test_destroy(t);
    usleep(GAP_US);
    printf("\n%s round (%s):\n", label,
           sanitizer > 0 ? "each test launch under compute-sanitizer memcheck first"
           : light       ? "memcheck off, 1/32 of the work per test launch"
                         : "memcheck off");
    printf("  %-9s %-10s %-14s %10s %10s %12s %10s  %s\n", "push", "outcome", "kind", "push ms",
           "canary ms", "live max ms", "vs base", "check");
    int bad = 0;
    for (int i = 0; i < NKINDS; i++) {
        if (!imgs[i])
            continue;
        uint64_t t0 = bench_ns();
        int err = swap(rt, imgs[i], sizes[i], HK_CANARY_REQUIRE, &rep);
        uint64_t t1 = bench_ns();
        usleep(TAIL_MS * 1000);
        long count;
        double mx = live_max(t0, t1 + (uint64_t)TAIL_MS * 1000000, &count);
        const char *got = err == 0                ? "committed"
                          : rep.canary_refusal[0] ? rep.canary_refusal
                                                  : hk_strerror(err);
        const char *want = sanitizer > 0 ? kinds[i].memcheck : kinds[i].plain;
        int ok = expected(want, got);
        bad += check && !ok;
        printf("  %-9s %-10s %-14s %10.1f %10.1f %12.3f %+10.3f  %s\n", kinds[i].name,
               err ? "refused" : "committed", err ? got : "-", (double)(t1 - t0) / 1e6,
               rep.canary_ms, mx, mx - base_ms,
               !check ? "(not checked)"
               : ok   ? "ok"
                      : "UNEXPECTED");
        if (!ok || err)
            printf("  %9s %s\n", "", err ? rep.message : rep.canary);
        if (rep.canary_new_ms > 0)
            printf("  %9s GPU time %.3f ms, running version %.3f ms\n", "", rep.canary_new_ms,
                   rep.canary_old_ms);
        if (!err)
            swap(rt, b_img, b_size, HK_CANARY_SKIP, &rep); /* the next compares with it */
        usleep(GAP_US);
    }
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    printf("  canary: %llu runs, %llu refused (fault %llu, hang %llu, mismatch %llu, slower %llu, "
           "memcheck %llu), %.0f ms in all, %llu helper starts\n",
           (unsigned long long)st.canary_runs, (unsigned long long)st.canary_refused,
           (unsigned long long)st.canary_refused_fault, (unsigned long long)st.canary_refused_hang,
           (unsigned long long)st.canary_refused_mismatch,
           (unsigned long long)st.canary_refused_slower,
           (unsigned long long)st.canary_refused_memcheck, st.canary_ms_total,
           (unsigned long long)st.canary_helper_starts);
    hk_runtime_destroy(rt);
    hk_report_clear(&rep);
    return bad;
}

int main(int argc, char **argv) {
    const char *modes = argc > 1 ? argv[1] : "plain,memcheck";
    double base_s = argc > 2 ? atof(argv[2]) : 3.0;
    if (base_s <= 0)
        return 2;
    bench_init("bench_canary_cost");
    const char *fake = getenv("HK_LIBCUDA");
    int check = !(fake && strstr(fake, "fakecuda"));
    base_img = bench_build(base_src, 0, &base_size);
    for (int i = 0; i < NKINDS; i++)
        img[i] = bench_build(kinds[i].src, kinds[i].cubin, &img_size[i]);
    if (strstr(modes, "light")) {
        char *l = lighten(base_src);
        lbase_img = bench_build(l, 0, &lbase_size);
        free(l);
        for (int i = 0; i < NKINDS; i++)
            if (!strcmp(kinds[i].name, "correct") || !strcmp(kinds[i].name, "wrong") ||
                !strcmp(kinds[i].name, "nan")) {
                l = lighten(kinds[i].src);
                limg_k[i] = bench_build(l, 0, &limg_size[i]);
                free(l);
            }
    }
    size_t lsize;
    void *limg = bench_build("extern \"C\" __global__ void live(float *x, int n) { int i = "
                             "blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }\n",
                             1, &lsize);
    CUmodule lmod;
    L.end_ns = calloc(LIVE_MAX, sizeof *L.end_ns);
    L.ms = calloc(LIVE_MAX, sizeof *L.ms);
    if (!L.end_ns || !L.ms || bd.CtxGetCurrent(&L.ctx) != 0 ||
        bd.ModuleLoadData(&lmod, limg) != 0 || bd.ModuleGetFunction(&L.f, lmod, "live") != 0 ||
        bd.MemAlloc(&L.buf, N_LIVE * sizeof(float)) != 0) {
        fprintf(stderr, "bench_canary_cost: the live program could not start\n");
        return 1;
    }
    /* Through the CUDA runtime, on the same primary context (the fake has
     * no runtime: its buffer is not checked). */
    if (check && (cudaMemset((void *)(uintptr_t)L.buf, 0, N_LIVE * sizeof(float)) != cudaSuccess ||
                  cudaDeviceSynchronize() != cudaSuccess)) {
        fprintf(stderr, "bench_canary_cost: cannot clear the live buffer\n");
        return 1;
    }
    printf("live program: live() over %d floats, launch + synchronise nonstop on its own stream, "
           "its own module; pushes: one test launch of work() over %d floats, compared\n",
           N_LIVE, N_TEST);
    pthread_create(&L.thread, NULL, live_loop, NULL);
    usleep(500000); /* past the live thread's first launches */
    double base_ms = baseline(base_s);
    int bad = 0;
    if (strstr(modes, "plain")) {
        int r = round_of("plain", -1, 0, base_ms, check);
        bad += r > 0 ? r : 0;
    }
    if (strstr(modes, "memcheck")) {
        int r = round_of("memcheck", 1, 0, base_ms, check);
        bad += r > 0 ? r : 0;
    }
    if (strstr(modes, "light")) {
        int r = round_of("light", -1, 1, base_ms, check);
        bad += r > 0 ? r : 0;
    }
    printf("\n");
    double end_ms = baseline(base_s);
    atomic_store(&L.stop, 1);
    pthread_join(L.thread, NULL);
    printf("baselines %.3f ms and %.3f ms; %ld live launches, %ld failed\n", base_ms, end_ms,
           L.launches, atomic_load(&L.fails));
    if (!check) {
        printf("fake driver: outcomes and the live buffer not checked\n");
        return 0;
    }
    /* Each launch added 1.0f: exact below 2^24 launches. */
    static float got[N_LIVE];
    long wrong = -1;
    if (cudaMemcpy(got, (void *)(uintptr_t)L.buf, sizeof got, cudaMemcpyDeviceToHost) ==
        cudaSuccess) {
        wrong = 0;
        for (int i = 0; i < N_LIVE && L.launches < (1L << 24); i++)
            wrong += got[i] != (float)L.launches;
    }
    printf("live buffer: %s\n", wrong == 0  ? "exact (every element = the launch count)"
                                : wrong < 0 ? "could not be read"
                                            : "WRONG");
    if (bad || atomic_load(&L.fails) || wrong) {
        printf("FAILED: %d unexpected outcomes, %ld live launches failed, live buffer %s\n", bad,
               atomic_load(&L.fails), wrong ? "not exact" : "exact");
        return 1;
    }
    printf("all outcomes as expected\n");
    return 0;
}

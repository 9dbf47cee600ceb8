/*
 * Soak: every way of using a runtime at once, for a long time (argv[1]
 * seconds, default 600), watching for errors and for anything that grows.
 *
 *   8 launchers  hk_launch of tagk<<<1,1>>> on a non-blocking stream each, no
 *                pause; every RING launches the thread's ring of tags is
 *                copied back, the stream synchronized and every tag checked
 *                (1 or 2: a committed version)
 *   swapper      hk_swap every 10 ms between two pre-built cubins, stage
 *                HK_STAGE_AUTO: the swap waits for the next safe point
 *   frame        every 16 ms: one launch on its own stream, synchronize that
 *                stream, check the tag, hk_safe_point
 *   graph        a captured graph of one hk_launch, registered with
 *                hk_graph_register, launched with hk_graph_launch every 1 ms;
 *                every 64 launches synchronize and check its tag
 *
 * Every 10 s one line: counters, RSS, open fds, device free memory, live and
 * reclaimed versions, threads. At the end, first / last / max of each of
 * those (first = the 10 s line, after warm-up) and "flat" or "grew": a report,
 * not an assertion. Exits 1 if a launch, a swap or a tag check failed.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "bench/common.h"
#include "hotkern/hotkern.h"

#define TAG_SRC                                                                                    \
    "extern \"C\" __global__ void tagk(int *slot_tags, int idx) { slot_tags[idx] = %d; }\n"

enum { NLAUNCHERS = 8, RING = 256, GRAPH_SYNC = 64, MAXSAMPLES = 4096 };
static const uint64_t MS = 1000000ull;
static const hk_dim3 one = {1, 1, 1};

static void *img[3]; /* by tag */
static size_t nimg[3];
static hk_runtime *rt;
static hk_kernel *hk_k;
static int *d_tags; /* launcher rings, then the frame, graph and final slots */
static int *h_tags; /* pinned copies */
static int cur_tag; /* the swapper's: tag of the last committed version */
static cudaGraphExec_t gexec;
static cudaStream_t gstream;
static atomic_int stop, stop_frames;
static atomic_long launches, failed_launches, bad_tags, graph_launches, swaps_ok, swaps_failed,
    frames, sp_commits;
static atomic_long seen[3], graph_seen[3]; /* tags read back, by value */

enum { FRAME_SLOT = NLAUNCHERS * RING, GRAPH_SLOT, FINAL_SLOT, NSLOTS };

static void sleep_until(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
}

/* Sleeps until the next period; a thread that fell behind goes on at once
 * rather than catching up in a burst. */
static void tick(uint64_t *next, uint64_t period) {
    *next += period;
    uint64_t now = bench_ns();
    if (*next < now)
        *next = now;
    sleep_until(*next);
}

static void check_tags(const int *t, int n, atomic_long *count) {
    long c[3] = {0};
    for (int i = 0; i < n; i++)
        c[t[i] == 1 || t[i] == 2 ? t[i] : 0]++;
    for (int v = 0; v < 3; v++)
        if (c[v])
            atomic_fetch_add_explicit(v ? &count[v] : &bad_tags, c[v], memory_order_relaxed);
}

static void launch_failed(int cu) {
    if (atomic_fetch_add(&failed_launches, 1) == 0)
        printf("  first failed launch: %s\n", hkb_cu_name(&bd, (CUresult)cu));
}

/* Copies n tags from the device to pinned memory, synchronizes s and checks
 * them. */
static void sync_check(int slot, int n, CUstream s, atomic_long *count) {
    if (cudaMemcpyAsync(h_tags + slot, d_tags + slot, (size_t)n * sizeof(int),
                        cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        bd.StreamSynchronize(s) != CUDA_SUCCESS)
        atomic_fetch_add(&bad_tags, n); /* could not check them */
    else
        check_tags(h_tags + slot, n, count);
}

/* Makes the primary context current and gives the thread a stream. */
static CUstream thread_stream(void) {
    CUcontext ctx;
    bd.DevicePrimaryCtxRetain(&ctx, 0);
    bd.CtxSetCurrent(ctx);
    CUstream s;
    bd.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    return s;
}

static void thread_done(CUstream s) {
    bd.StreamSynchronize(s);
    bd.StreamDestroy(s);
    bd.DevicePrimaryCtxRelease(0);
}

static void *launcher(void *arg) {
    int base = (int)(intptr_t)arg * RING, idx = 0;
    int *ring = d_tags + base;
    void *args[] = {&ring, &idx};
    CUstream s = thread_stream();
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (idx = 0; idx < RING; idx++) {
            int cu = 0;
            if (hk_launch(hk_k, one, one, 0, s, args, &cu))
                launch_failed(cu);
        }
        sync_check(base, RING, s, seen);
        atomic_fetch_add_explicit(&launches, RING, memory_order_relaxed);
    }
    thread_done(s);
    return NULL;
}

static void *swapper(void *arg) {
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_AUTO;
    uint64_t next = bench_ns();
    while (!atomic_load(&stop)) {
        int tag = 3 - cur_tag;
        hk_report rep = HK_REPORT_INIT;
        int rc = hk_swap(rt, "tag", img[tag], nimg[tag], &so, &rep);
        if (rc == 0) {
            cur_tag = tag;
            atomic_fetch_add(&swaps_ok, 1);
        } else if (atomic_fetch_add(&swaps_failed, 1) == 0) {
            printf("  first failed swap: %s: %s (%s)\n", hk_strerror(rc), rep.message, rep.cu_name);
        }
        hk_report_clear(&rep);
        tick(&next, 10 * MS);
    }
    return arg;
}

static void *frame(void *arg) {
    int *slot = d_tags + FRAME_SLOT, idx = 0;
    void *args[] = {&slot, &idx};
    CUstream s = thread_stream();
    uint64_t next = bench_ns();
    while (!atomic_load(&stop_frames)) {
        int cu = 0;
        if (hk_launch(hk_k, one, one, 0, s, args, &cu))
            launch_failed(cu);
        sync_check(FRAME_SLOT, 1, s, seen); /* this thread's GPU work is done: a safe point */
        int n = hk_safe_point(rt);
        if (n > 0)
            atomic_fetch_add(&sp_commits, n);
        atomic_fetch_add(&frames, 1);
        tick(&next, 16 * MS);
    }
    thread_done(s);
    return arg;
}

static void *grapher(void *arg) {
    CUcontext ctx;
    bd.DevicePrimaryCtxRetain(&ctx, 0);
    bd.CtxSetCurrent(ctx);
    uint64_t next = bench_ns();
    for (long n = 1; !atomic_load(&stop); n++) {
        int cu = 0;
        if (hk_graph_launch(rt, gexec, gstream, &cu))
            launch_failed(cu);
        else
            atomic_fetch_add(&graph_launches, 1);
        if (n % GRAPH_SYNC == 0)
            sync_check(GRAPH_SLOT, 1, gstream, graph_seen);
        tick(&next, MS);
    }
    bd.StreamSynchronize(gstream);
    bd.DevicePrimaryCtxRelease(0);
    return arg;
}

/* Captures one hk_launch into a graph and registers its node, so commits
 * retarget it. Runs before the benchmark's threads start, and while the
 * runtime has nothing to reclaim: no other thread makes a call that a global
 * capture forbids (the reclaim thread's context synchronize). */
static cudaGraph_t capture_graph(void) {
    int *slot = d_tags + GRAPH_SLOT, idx = 0;
    void *args[] = {&slot, &idx};
    cudaGraph_t g;
    cudaGraphNode_t nodes[4];
    size_t nn = 4;
    if (cudaStreamCreateWithFlags(&gstream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamBeginCapture(gstream, cudaStreamCaptureModeGlobal) != cudaSuccess) {
        fprintf(stderr, "graph capture failed\n");
        exit(1);
    }
    int rc = hk_launch(hk_k, one, one, 0, gstream, args, NULL);
    if (cudaStreamEndCapture(gstream, &g) != cudaSuccess || rc ||
        cudaGraphInstantiate(&gexec, g, 0) != cudaSuccess ||
        cudaGraphGetNodes(g, nodes, &nn) != cudaSuccess || nn != 1 ||
        hk_graph_register(rt, gexec, nodes[0], hk_k)) {
        fprintf(stderr, "graph setup failed\n");
        exit(1);
    }
    return g;
}

/* ---- what the process holds --------------------------------------------- */

/* What must stay flat. */
enum { M_RSS, M_FDS, M_DEV_USED, M_LIVE, M_THREADS, NM };
static const char *const mname[NM] = {"RSS", "open fds", "device memory used", "live versions",
                                      "threads"};
static const char *const munit[NM] = {" MiB", "", " MiB", "", ""};

typedef struct {
    double t, m[NM], dev_free_mib;
    long swaps, launches, graphs, failed_l, failed_s, bad;
    uint64_t reclaimed;
} sample;

static double rss_mib(void) {
    long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &res) != 2)
            res = 0;
        fclose(f);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE) / (1 << 20);
}

static long open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    long n = -1; /* the directory's own */
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static long nthreads(void) {
    char line[256];
    long n = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %ld", &n) == 1)
            break;
    fclose(f);
    return n;
}

static sample take(double t) {
    sample s = {.t = t,
                .swaps = atomic_load(&swaps_ok),
                .launches = atomic_load(&launches),
                .graphs = atomic_load(&graph_launches),
                .failed_l = atomic_load(&failed_launches),
                .failed_s = atomic_load(&swaps_failed),
                .bad = atomic_load(&bad_tags)};
    size_t fr = 0, total = 0;
    bd.MemGetInfo(&fr, &total);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    s.m[M_RSS] = rss_mib();
    s.m[M_FDS] = (double)open_fds();
    s.m[M_DEV_USED] = (double)(total - fr) / (1 << 20);
    s.m[M_LIVE] = (double)st.live_versions;
    s.m[M_THREADS] = (double)nthreads();
    s.dev_free_mib = (double)fr / (1 << 20);
    s.reclaimed = st.reclaimed;
    return s;
}

static void print_sample(const sample *s) {
    printf("soak %5.0f s: swaps %ld, launches %ld, graph launches %ld, failed launches %ld, "
           "failed swaps %ld, bad tags %ld; RSS %.1f MiB, fds %.0f, device free %.0f MiB, live "
           "versions %.0f, reclaimed %llu, threads %.0f\n",
           s->t, s->swaps, s->launches, s->graphs, s->failed_l, s->failed_s, s->bad, s->m[M_RSS],
           s->m[M_FDS], s->dev_free_mib, s->m[M_LIVE], (unsigned long long)s->reclaimed,
           s->m[M_THREADS]);
    fflush(stdout);
}

/* first / last / max of one quantity over the samples, and whether it grew. */
static void trend(const sample *v, int n, int m) {
    double first = v[0].m[m], last = v[n - 1].m[m], mx = first, d = last - first;
    for (int i = 1; i < n; i++)
        mx = v[i].m[m] > mx ? v[i].m[m] : mx;
    const char *u = munit[m];
    printf("soak trend %-19s first %.1f%s, last %.1f%s, max %.1f%s: %s", mname[m], first, u, last,
           u, mx, u, d > 0 ? "grew" : "flat");
    if (d > 0)
        printf(" by %.1f%s (%+.1f%%)", d, u, first > 0 ? 100 * d / first : 0.0);
    printf("\n");
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 600;
    if (secs <= 0 || secs / 10 > MAXSAMPLES - 2) {
        fprintf(stderr, "usage: bench_soak [seconds (1..%d)]\n", (MAXSAMPLES - 2) * 10);
        return 2;
    }
    bench_init("bench_soak");
    for (int tag = 1; tag <= 2; tag++) {
        char src[256];
        snprintf(src, sizeof src, TAG_SRC, tag);
        img[tag] = bench_build(src, 1, &nimg[tag]);
    }
    hk_options o;
    hk_options_init(&o);
    hk_report rep = HK_REPORT_INIT;
    if (hk_runtime_create(&rt, &o, &rep) || hk_swap(rt, "tag", img[1], nimg[1], NULL, &rep) ||
        hk_kernel_get(rt, "tag", "tagk", &hk_k)) {
        fprintf(stderr, "hotkern setup failed: %s\n", rep.message);
        return 1;
    }
    cur_tag = 1;
    if (cudaMalloc((void **)&d_tags, NSLOTS * sizeof(int)) != cudaSuccess ||
        cudaMallocHost((void **)&h_tags, NSLOTS * sizeof(int)) != cudaSuccess ||
        cudaMemset(d_tags, 0, NSLOTS * sizeof(int)) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        return 1;
    }
    cudaGraph_t graph = capture_graph();
    printf("soak: %.0f s; %d launcher threads (sync every %d), swaps every 10 ms (HK_STAGE_AUTO), "
           "safe point every 16 ms, graph launch every 1 ms (sync every %d)\n",
           secs, NLAUNCHERS, RING, GRAPH_SYNC);

    pthread_t lt[NLAUNCHERS], st, ft, gt;
    for (int i = 0; i < NLAUNCHERS; i++)
        pthread_create(&lt[i], NULL, launcher, (void *)(intptr_t)i);
    pthread_create(&ft, NULL, frame, NULL);
    pthread_create(&gt, NULL, grapher, NULL);
    pthread_create(&st, NULL, swapper, NULL);

    static sample samples[MAXSAMPLES];
    int ns = 0;
    uint64_t start = bench_ns(), end = start + (uint64_t)(secs * 1e9), next = start;
    for (;;) {
        next += 10000 * MS;
        if (next >= end)
            break;
        sleep_until(next);
        samples[ns] = take((double)(next - start) / 1e9);
        print_sample(&samples[ns++]);
    }
    sleep_until(end);
    samples[ns] = take((double)(end - start) / 1e9);
    print_sample(&samples[ns++]);

    atomic_store(&stop, 1);
    for (int i = 0; i < NLAUNCHERS; i++)
        pthread_join(lt[i], NULL);
    pthread_join(gt, NULL);
    pthread_join(st, NULL); /* safe points still come while its last swap waits */
    atomic_store(&stop_frames, 1);
    pthread_join(ft, NULL);

    /* The last committed version is the one that runs. */
    int *slot = d_tags + FINAL_SLOT, idx = 0, cu = 0;
    void *args[] = {&slot, &idx};
    CUstream s;
    bd.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (hk_launch(hk_k, one, one, 0, s, args, &cu))
        launch_failed(cu);
    sync_check(FINAL_SLOT, 1, s, seen);
    int got = h_tags[FINAL_SLOT];
    bd.StreamDestroy(s);
    int reclaim = hk_reclaim_wait(rt, 10000);
    hk_stats stats = HK_STATS_INIT;
    hk_stats_get(rt, &stats);
    printf("soak: %ld frames, %ld versions committed at safe points; after the run hk_launch runs "
           "tag %d, last committed tag %d: %s; after hk_reclaim_wait (%s) live versions %llu, "
           "reclaimed %llu\n",
           atomic_load(&frames), atomic_load(&sp_commits), got, cur_tag,
           got == cur_tag ? "ok" : "WRONG", reclaim ? "timed out" : "ok",
           (unsigned long long)stats.live_versions, (unsigned long long)stats.reclaimed);
    printf("soak: tags read back: launches tag 1 x %ld, tag 2 x %ld; graph tag 1 x %ld, tag 2 x "
           "%ld (both: the graph was retargeted)\n",
           atomic_load(&seen[1]), atomic_load(&seen[2]), atomic_load(&graph_seen[1]),
           atomic_load(&graph_seen[2]));

    for (int m = 0; m < NM; m++)
        trend(samples, ns, m);
    printf("soak trend %-19s first %llu, last %llu (%.1f per second)\n", "reclaimed",
           (unsigned long long)samples[0].reclaimed, (unsigned long long)samples[ns - 1].reclaimed,
           ns > 1 ? (double)(samples[ns - 1].reclaimed - samples[0].reclaimed) /
                        (samples[ns - 1].t - samples[0].t)
                  : 0.0);

    long errors = atomic_load(&failed_launches) + atomic_load(&swaps_failed) +
                  atomic_load(&bad_tags) + (got != cur_tag);
    printf("soak: %s (%ld failed launches, %ld failed swaps, %ld bad tags)\n",
           errors ? "FAILED" : "ok", atomic_load(&failed_launches), atomic_load(&swaps_failed),
           atomic_load(&bad_tags));
    hk_graph_unregister(rt, gexec);
    cudaGraphExecDestroy(gexec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(gstream);
    hk_runtime_destroy(rt);
    cudaFree(d_tags);
    cudaFreeHost(h_tags);
    free(img[1]);
    free(img[2]);
    return errors ? 1 : 0;
}

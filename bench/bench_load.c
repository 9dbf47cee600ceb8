/*
 * Swaps under continuous launches: does a swap still get the driver while
 * many threads launch without pause, and what does it cost the launchers?
 *
 * N launcher threads (argv, default 8 then 32) each launch tagk<<<1,1>>> on a
 * non-blocking stream of their own in a tight loop, never pausing. Each launch
 * writes the tag of the version that ran (1 or 2) into the thread's ring of
 * RING device ints; every RING launches the ring is copied back with
 * cudaMemcpyAsync into pinned memory and checked once its event has completed
 * (cudaEventQuery: the loop never waits for it), and after the phase once
 * more. Every tag must be 1 or 2. Each thread also records the longest time
 * between the returns of two consecutive launches: the longest it was held.
 * Meanwhile the main thread swaps the module between its two pre-built
 * cubins, back to back (HK_STAGE_NOW: hk_swap itself loads the code). A code
 * load takes a driver lock in write mode that launches keep overtaking, so
 * without help the swaps starve. Per thread count, four phases:
 *
 *   load N threads                 hk_launch, no synchronize at all (headline)
 *   load N threads (sync/4096)     the same, and each launcher synchronizes
 *                                  its stream every RING launches
 *   raw driver N threads           baseline without hotkern: raw cuLaunchKernel
 *                                  launchers, and the main thread runs raw
 *                                  cuLibraryLoadData + cuLibraryGetKernel +
 *                                  cuKernelGetFunction + cuFuncLoad +
 *                                  cuLibraryUnload cycles
 *   own launches N threads         raw cuLaunchKernel launchers (the
 *                                  application's own, which hotkern cannot
 *                                  hold) while the main thread hk_swaps
 *   unhappy N threads              hk_launch launchers, no synchronize, while
 *                                  the main thread cycles through five
 *                                  operations: a swap, a swap, a rollback,
 *                                  hk_kernel_function, and a swap refused in
 *                                  validation (its image lacks tagk); each
 *                                  kind's latency is reported on its own
 *
 * Two more phases come first, as the baseline for launcher pauses: the same
 * launchers (raw cuLaunchKernel, then hk_launch) with no swap at all, for
 * HK_LOAD_IDLE_S seconds (default 2). A launcher that never pauses still
 * waits when its stream's queue is full or the OS deschedules it (32
 * launchers on 16 cores); what a swap adds is the difference.
 *
 * HK_LOAD_HOLD_US sets the runtime's launch_hold_max_us; HK_LOAD_GAP_US
 * makes the swapper sleep that long between swaps (default 0: back to back).
 *
 * HK_LOAD_SWAPS swaps per phase (default 10000; raw cycles: at most 2000);
 * HK_LOAD_PHASES=hk skips the two baselines.
 * HK_LOAD_CAP_S caps every phase (default 60 s; raw cycles: at most 20 s):
 * at the cap the launchers stop by themselves, which lets a swap starved in
 * the driver return; that swap is reported on its own, outside the latency
 * figures. live_versions and device free memory are sampled at the start,
 * every 1000 swaps, at the end, and once more after hk_reclaim_wait. A phase
 * still running a minute after its cap is reported HUNG (exit 3); failed
 * launches, swaps or tag checks make the exit status 1.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "bench/common.h"
#include "hotkern/hotkern.h"

#define TAG_SRC                                                                                    \
    "extern \"C\" __global__ void tagk(int *slot_tags, int idx) { slot_tags[idx] = %d; }\n"

enum { RING = 4096, MAXT = 256, SAMPLE_EVERY = 1000, RAW_CYCLES = 2000 };
static const double RAW_CAP_S = 20;
static const hk_dim3 one = {1, 1, 1};

static void *img[3]; /* by tag: img[1], img[2]; img[0] lacks tagk */
static size_t nimg[3];
static hk_runtime *rt;
static hk_kernel *hk_k;
static CUkernel raw_k; /* tagk of version 1, loaded without hotkern */
static int *d_rings;   /* MAXT rings of RING ints, then one spare slot */
static int *h_rings;   /* pinned copies */
static int cur_tag;    /* tag of the last committed version */

typedef struct {
    const char *name, *suffix; /* printed "NAME N threadsSUFFIX:" */
    int raw_launch;            /* launchers call cuLaunchKernel on raw_k */
    int sync;                  /* launchers synchronize their stream every RING launches */
    int raw_swap;              /* main thread: raw driver load cycles instead of hk_swap */
    int no_swap;               /* main thread: nothing (the launchers' own pauses) */
    int unhappy;               /* main thread: refusals, rollbacks, function lookups too */
} phase;

/* Written before the launchers are created, read-only while they run. */
static const phase *ph;
static _Atomic uint64_t deadline;
static uint64_t phase_t0; /* when the current phase's swaps began (main thread) */
static atomic_int stop, ready, go, in_phase;
static char label[64]; /* of the phase running */

typedef struct {
    pthread_t tid;
    int *ring, *host;
    long launches, failed, readback_err, bad_tags, tags[3];
    int first_cu;
    uint64_t max_gap_ns, pauses; /* pauses: gaps over 1 ms */
    uint64_t t_first, t_last;    /* when the loop started and ended */
} launcher;

static void check_ring(launcher *L, long n) {
    for (long i = 0; i < n && i < RING; i++) {
        int t = L->host[i];
        if (t == 1 || t == 2)
            L->tags[t]++;
        else
            L->bad_tags++;
    }
}

static void readback(launcher *L, CUstream s, cudaEvent_t ev) {
    if (cudaMemcpyAsync(L->host, L->ring, RING * sizeof(int), cudaMemcpyDeviceToHost, s) !=
            cudaSuccess ||
        cudaEventRecord(ev, s) != cudaSuccess)
        L->readback_err++;
}

static void *launch_loop(void *arg) {
    launcher *L = arg;
    CUcontext ctx;
    bd.DevicePrimaryCtxRetain(&ctx, 0);
    bd.CtxSetCurrent(ctx);
    CUstream s;
    bd.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    cudaEvent_t ev;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    int idx = 0, copying = 0;
    void *args[] = {&L->ring, &idx};
    long n = 0;
    /* Nobody launches before every launcher is set up: under continuous
     * launches even cuStreamCreate and cudaEventCreate wait for ever. */
    atomic_fetch_add(&ready, 1);
    while (!atomic_load(&go))
        ;
    uint64_t last = L->t_first = bench_ns();
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        idx = (int)(n % RING);
        int cu = 0, rc;
        if (ph->raw_launch)
            rc = cu = (int)bd.LaunchKernel((CUfunction)raw_k, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
        else
            rc = hk_launch(hk_k, one, one, 0, s, args, &cu);
        uint64_t now = bench_ns(), gap = now - last;
        last = now;
        if (gap > L->max_gap_ns)
            L->max_gap_ns = gap;
        L->pauses += gap > 1000000;
        if (rc && !L->failed++)
            L->first_cu = cu;
        if (++n % RING == 0) {
            if (copying) {
                cudaError_t q = cudaEventQuery(ev);
                if (q == cudaSuccess)
                    check_ring(L, RING), copying = 0;
                else if (q != cudaErrorNotReady)
                    L->readback_err++, copying = 0;
            }
            if (!copying)
                readback(L, s, ev), copying = 1;
            if (ph->sync) {
                bd.StreamSynchronize(s);
                check_ring(L, RING);
                copying = 0;
            }
        }
        if (now >= atomic_load_explicit(&deadline, memory_order_relaxed)) /* the cap */
            break;
    }
    L->t_last = last;
    bd.StreamSynchronize(s);
    if (copying)
        check_ring(L, RING);
    readback(L, s, ev);
    bd.StreamSynchronize(s);
    check_ring(L, n);
    L->launches = n - L->failed;
    cudaEventDestroy(ev);
    bd.StreamDestroy(s);
    bd.DevicePrimaryCtxRelease(0);
    return NULL;
}

/* ---- what the main thread does meanwhile ---------------------------------- */

/* The unhappy phase's other operations: latencies by kind. */
enum { OP_REFUSED, OP_ROLLBACK, OP_FUNCTION, NOPS };
static const char *const op_name[NOPS] = {"refused swap", "rollback", "hk_kernel_function"};

typedef struct {
    int attempted, done, failed;
    double *lat, *stage, *commit; /* of swaps that returned before the cap */
    double *op_lat[NOPS];         /* unhappy phase: by kind */
    int op_done[NOPS], no_history;
    int late; /* a swap was in flight when the cap hit */
    double late_ms;
    double worst[4]; /* the slowest swap: total, stage, commit, wait (ms) */
    double worst_at; /* when it started, seconds into the phase */
} swaps;

typedef struct {
    int n;
    uint64_t live0, live1, live_max;
    size_t free0, free1, free_min;
} sampler;

/* Device memory is read only while no launcher runs (with_mem): under
 * continuous launches cuMemGetInfo waits for the driver's lock like a load
 * does, and hotkern cannot hold launches it does not make. */
static void sample(sampler *S, int with_mem) {
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    size_t fr = S->n ? S->free1 : 0, total = 0;
    if (with_mem)
        bd.MemGetInfo(&fr, &total);
    if (!S->n++) {
        S->live0 = S->live_max = st.live_versions;
        S->free0 = S->free_min = fr;
    }
    S->live1 = st.live_versions;
    S->free1 = fr;
    if (st.live_versions > S->live_max)
        S->live_max = st.live_versions;
    if (fr < S->free_min)
        S->free_min = fr;
}

static int gap_us; /* the swapper's pause between swaps */

/* One of the unhappy phase's other operations (i % 5: 2 rollback, 3
 * hk_kernel_function, 4 a refused swap). Returns 0 when it did what it
 * should, else 1 (printed once). */
static int unhappy_op(swaps *w, int i, const hk_swap_options *so) {
    hk_report rep = HK_REPORT_INIT;
    int kind = i % 5 == 2 ? OP_ROLLBACK : i % 5 == 3 ? OP_FUNCTION : OP_REFUSED, rc, ok;
    uint64_t t0 = bench_ns();
    if (kind == OP_ROLLBACK) {
        rc = hk_rollback(rt, "tag", &rep);
        ok = rc == 0 || rc == HK_ERR_NO_HISTORY;
        if (rc == 0)
            cur_tag = 3 - cur_tag; /* versions alternate: the one before is the other tag */
        w->no_history += rc == HK_ERR_NO_HISTORY;
    } else if (kind == OP_FUNCTION) {
        void *f = NULL;
        rc = hk_kernel_function(hk_k, &f);
        ok = rc == 0 && f;
    } else {
        rc = hk_swap(rt, "tag", img[0], nimg[0], so, &rep);
        ok = rc == HK_ERR_MISSING_KERNEL;
    }
    uint64_t t1 = bench_ns();
    if (!ok && !w->failed++)
        printf("  first failed %s: %s: %s\n", op_name[kind], hk_strerror(rc), rep.message);
    if (ok && t1 < deadline)
        w->op_lat[kind][w->op_done[kind]++] = (double)(t1 - t0) / 1e6;
    if (t1 >= deadline) {
        w->late = 1;
        w->late_ms = (double)(t1 - t0) / 1e6;
    }
    hk_report_clear(&rep);
    return !ok;
}

static void hk_swaps(swaps *w, int max, sampler *S) {
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_NOW;
    for (int i = 0; w->attempted < max && bench_ns() < deadline; i++) {
        if (ph->unhappy && i % 5 >= 2) {
            w->attempted++;
            unhappy_op(w, i, &so);
            continue;
        }
        int tag = 3 - cur_tag;
        hk_report rep = HK_REPORT_INIT;
        if (gap_us)
            usleep((useconds_t)gap_us);
        uint64_t t0 = bench_ns();
        int rc = hk_swap(rt, "tag", img[tag], nimg[tag], &so, &rep);
        uint64_t t1 = bench_ns();
        double ms = (double)(t1 - t0) / 1e6;
        w->attempted++;
        if (rc && !w->failed++)
            printf("  first failed swap: %s: %s (%s)\n", hk_strerror(rc), rep.message, rep.cu_name);
        if (!rc)
            cur_tag = tag;
        if (t1 >= deadline) {
            w->late = 1;
            w->late_ms = ms;
        } else if (!rc) {
            w->lat[w->done] = ms;
            w->stage[w->done] = rep.stage_ms;
            w->commit[w->done] = rep.commit_ms;
            w->done++;
            if (ms > w->worst[0]) {
                w->worst[0] = ms;
                w->worst[1] = rep.stage_ms;
                w->worst[2] = rep.commit_ms;
                w->worst[3] = rep.wait_ms;
                w->worst_at = (double)(t0 - phase_t0) / 1e9;
            }
        }
        hk_report_clear(&rep);
        if (w->attempted % SAMPLE_EVERY == 0)
            sample(S, 0);
    }
}

/* What a program does without hotkern: load, resolve, upload, unload. */
static void raw_cycles(swaps *w, int max, sampler *S) {
    while (w->attempted < max && bench_ns() < deadline) {
        CUlibrary lib;
        CUkernel k;
        CUfunction f;
        const char *what = "cuLibraryLoadData";
        uint64_t t0 = bench_ns();
        CUresult r = bd.LibraryLoadData(&lib, img[2], NULL, NULL, 0, NULL, NULL, 0);
        if (r == CUDA_SUCCESS) {
            if ((r = bd.LibraryGetKernel(&k, lib, "tagk")) != CUDA_SUCCESS)
                what = "cuLibraryGetKernel";
            else if ((r = bd.KernelGetFunction(&f, k)) != CUDA_SUCCESS)
                what = "cuKernelGetFunction";
            else if ((r = bd.FuncLoad(f)) != CUDA_SUCCESS)
                what = "cuFuncLoad";
            CUresult u = bd.LibraryUnload(lib);
            if (r == CUDA_SUCCESS && u != CUDA_SUCCESS) {
                r = u;
                what = "cuLibraryUnload";
            }
        }
        uint64_t t1 = bench_ns();
        double ms = (double)(t1 - t0) / 1e6;
        w->attempted++;
        if (r != CUDA_SUCCESS && !w->failed++)
            printf("  first failed cycle: %s: %s\n", what, hkb_cu_name(&bd, r));
        if (t1 >= deadline) {
            w->late = 1;
            w->late_ms = ms;
        } else if (r == CUDA_SUCCESS) {
            w->lat[w->done++] = ms;
        }
        if (w->attempted % SAMPLE_EVERY == 0)
            sample(S, 0);
    }
}

/* No swap: the main thread only samples, for idle_s seconds. */
static double idle_s = 2;
static void idle(sampler *S) {
    uint64_t until = bench_ns() + (uint64_t)(idle_s * 1e9);
    while (bench_ns() < until) {
        usleep(100000);
        sample(S, 0);
    }
}

/* Launches the current version once through hotkern; returns its tag. */
static int tag_now(void) {
    int *spare = d_rings + (size_t)MAXT * RING, idx = 0, got = -1;
    void *args[] = {&spare, &idx};
    CUstream s;
    bd.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    cudaMemsetAsync(spare, 0, sizeof(int), s);
    if (hk_launch(hk_k, one, one, 0, s, args, NULL) == 0 && bd.StreamSynchronize(s) == 0)
        cudaMemcpy(&got, spare, sizeof got, cudaMemcpyDeviceToHost);
    bd.StreamDestroy(s);
    return got;
}

static double pct(double *v, int n, double p) {
    return n ? bench_pct(v, n, p) : 0; /* v sorted */
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double mib(size_t b) {
    return (double)b / (1 << 20);
}

/* Prints a phase's swap (or raw cycle) counts and latencies; sorts w's
 * arrays. */
static void print_swaps(const phase *p, swaps *w, int max_swaps, double swap_s, double cap_s) {
    const char *what = p->raw_swap ? "raw load cycles" : "swaps";
    printf("%s: %s completed %d of %d (%d attempted, %d failed) in %.1f s", label, what, w->done,
           max_swaps, w->attempted, w->failed, swap_s);
    if (w->late || (w->attempted < max_swaps && bench_ns() >= deadline))
        printf("; CAP HIT at %.0f s", cap_s);
    if (w->late)
        printf("; the one in flight at the cap took %.1f ms (returned only once the launchers "
               "had stopped)",
               w->late_ms);
    printf("\n");
    if (w->done)
        bench_median(w->lat, w->done); /* sorts */
    printf("%s: %s latency p50 %.3f ms, p99 %.3f ms, max %.3f ms", label,
           p->raw_swap ? "cycle" : "swap", pct(w->lat, w->done, 50), pct(w->lat, w->done, 99),
           pct(w->lat, w->done, 100));
    if (!p->raw_swap) {
        if (w->done) {
            bench_median(w->stage, w->done);
            bench_median(w->commit, w->done);
        }
        printf(" (stage p50 %.3f / p99 %.3f ms, commit p50 %.3f / p99 %.3f ms)",
               pct(w->stage, w->done, 50), pct(w->stage, w->done, 99), pct(w->commit, w->done, 50),
               pct(w->commit, w->done, 99));
    }
    printf("\n");
    if (!p->raw_swap && w->done)
        printf("%s: slowest swap %.3f ms at %.2f s: stage %.3f, commit %.3f, waiting %.3f ms\n",
               label, w->worst[0], w->worst_at, w->worst[1], w->worst[2], w->worst[3]);
    for (int k = 0; p->unhappy && k < NOPS; k++) {
        int n = w->op_done[k];
        if (n)
            bench_median(w->op_lat[k], n); /* sorts */
        printf("%s: %s x %d: p50 %.3f ms, p99 %.3f ms, max %.3f ms%s\n", label, op_name[k], n,
               pct(w->op_lat[k], n, 50), pct(w->op_lat[k], n, 99), pct(w->op_lat[k], n, 100),
               k == OP_ROLLBACK && w->no_history ? " (some found no history)" : "");
    }
}

/* Runs one phase with n launcher threads; returns the number of errors
 * (failed launches, failed swaps, bad tags). */
static long run_phase(const phase *p, int n, int max_swaps, double cap_s) {
    ph = p;
    if (p->raw_swap) {
        max_swaps = max_swaps < RAW_CYCLES ? max_swaps : RAW_CYCLES;
        cap_s = cap_s < RAW_CAP_S ? cap_s : RAW_CAP_S;
    }
    snprintf(label, sizeof label, "%s %d threads%s", p->name, n, p->suffix);
    launcher *L = calloc((size_t)n, sizeof *L);
    uint64_t *gaps = malloc((size_t)n * sizeof *gaps);
    swaps w = {.lat = calloc((size_t)max_swaps + 1, sizeof(double)),
               .stage = calloc((size_t)max_swaps + 1, sizeof(double)),
               .commit = calloc((size_t)max_swaps + 1, sizeof(double))};
    for (int k = 0; k < NOPS; k++)
        w.op_lat[k] = calloc((size_t)max_swaps + 1, sizeof(double));
    sampler S = {0};
    if (!L || !gaps || !w.lat || !w.stage || !w.commit || !w.op_lat[0] || !w.op_lat[1] ||
        !w.op_lat[2]) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    cudaMemset(d_rings, 0, (size_t)n * RING * sizeof(int));
    cudaDeviceSynchronize();
    sample(&S, 1);
    atomic_store(&stop, 0);
    atomic_store(&ready, 0);
    atomic_store(&go, 0);
    phase_t0 = bench_ns();
    atomic_store(&deadline, phase_t0 + (uint64_t)(cap_s * 1e9));
    atomic_store(&in_phase, 1);
    for (int i = 0; i < n; i++) {
        L[i].ring = d_rings + (size_t)i * RING;
        L[i].host = h_rings + (size_t)i * RING;
        if (pthread_create(&L[i].tid, NULL, launch_loop, &L[i])) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    }
    while (atomic_load(&ready) < n)
        usleep(100);
    phase_t0 = bench_ns();
    atomic_store(&deadline, phase_t0 + (uint64_t)(cap_s * 1e9));
    atomic_store(&go, 1);
    uint64_t t0 = bench_ns();
    if (p->no_swap)
        idle(&S);
    else if (p->raw_swap)
        raw_cycles(&w, max_swaps, &S);
    else
        hk_swaps(&w, max_swaps, &S);
    uint64_t t1 = bench_ns();
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++)
        pthread_join(L[i].tid, NULL);
    sample(&S, 1);
    sampler end = S;
    hk_reclaim_wait(rt, 10000);
    sample(&S, 1);
    atomic_store(&in_phase, 0);

    long launches = 0, failed = 0, rb_err = 0, bad = 0, tags[3] = {0};
    uint64_t pauses = 0, from = UINT64_MAX, to = 0;
    int first_cu = 0;
    for (int i = 0; i < n; i++) {
        from = L[i].t_first < from ? L[i].t_first : from;
        to = L[i].t_last > to ? L[i].t_last : to;
        launches += L[i].launches;
        if (L[i].failed && !failed)
            first_cu = L[i].first_cu;
        failed += L[i].failed;
        rb_err += L[i].readback_err;
        bad += L[i].bad_tags;
        tags[1] += L[i].tags[1];
        tags[2] += L[i].tags[2];
        pauses += L[i].pauses;
        gaps[i] = L[i].max_gap_ns;
    }
    qsort(gaps, (size_t)n, sizeof *gaps, cmp_u64);

    double swap_s = (double)(t1 - t0) / 1e9;
    if (p->no_swap)
        printf("%s: no swaps, %.1f s\n", label, swap_s);
    else
        print_swaps(p, &w, max_swaps, swap_s, cap_s);
    double launch_s = (double)(to - from) / 1e9;
    printf("%s: launches %ld (%.2f M/s), failed %ld", label, launches,
           launch_s > 0 ? (double)launches / launch_s / 1e6 : 0.0, failed);
    if (failed)
        printf(" (first: %s)", hkb_cu_name(&bd, (CUresult)first_cu));
    printf(", bad tags %ld (seen: tag 1 x %ld, tag 2 x %ld), readback errors %ld\n", bad, tags[1],
           tags[2], rb_err);
    printf("%s: longest launcher pause %.3f ms (median over threads %.3f ms), pauses over 1 ms "
           "%llu\n",
           label, (double)gaps[n - 1] / 1e6, (double)gaps[n / 2] / 1e6, (unsigned long long)pauses);
    if (!p->raw_swap && !p->no_swap) {
        /* Cumulative since the runtime was created (the maximum cannot be
         * split by phase): where launchers' pauses may come from. */
        hk_stats gs = HK_STATS_INIT;
        hk_stats_get(rt, &gs);
        printf("%s: launch gate so far: closed %llu times, longest %.3f ms; launches that waited "
               "the full hold %llu\n",
               label, (unsigned long long)gs.gate_closes, gs.gate_closed_max_ms,
               (unsigned long long)gs.launch_hold_timeouts);
    }
    printf("%s: live versions start %llu, end %llu, max %llu, after reclaim %llu; device free "
           "start %.1f MiB, end %+.1f MiB, lowest %+.1f MiB, after reclaim %+.1f MiB\n",
           label, (unsigned long long)S.live0, (unsigned long long)end.live1,
           (unsigned long long)S.live_max, (unsigned long long)S.live1, mib(S.free0),
           mib(end.free1) - mib(S.free0), mib(S.free_min) - mib(S.free0),
           mib(S.free1) - mib(S.free0));
    long errors = failed + bad + rb_err + w.failed;
    if (!p->raw_swap) {
        int got = tag_now();
        printf("%s: after the phase hk_launch runs tag %d, last committed tag %d: %s\n", label, got,
               cur_tag, got == cur_tag ? "ok" : "WRONG");
        errors += got != cur_tag;
    }
    fflush(stdout);
    free(gaps);
    free(w.lat);
    free(w.stage);
    free(w.commit);
    for (int k = 0; k < NOPS; k++)
        free(w.op_lat[k]);
    free(L);
    return errors;
}

/* A phase that has not ended a minute after its cap is hung (launchers or a
 * swap stuck in the driver): say so and exit rather than wait forever. */
/* The engine's message about a gate closing longer than any before (rare:
 * a few per run) is printed as it comes, with the time into the run, so a
 * long launcher pause can be matched to the driver work that caused it. */
static void on_log(hk_log_level level, const char *subsystem, const char *message, void *ud) {
    (void)level;
    (void)subsystem;
    if (strstr(message, "launch gate"))
        printf("  [%.2f s] %s\n", (double)(bench_ns() - *(uint64_t *)ud) / 1e9, message);
}

static void *watchdog(void *arg) {
    for (;;) {
        sleep(1);
        if (atomic_load(&in_phase) && bench_ns() > atomic_load(&deadline) + 60000000000ull) {
            printf("%s: HUNG: the phase did not end 60 s after its cap\n", label);
            fflush(stdout);
            _exit(3);
        }
    }
    return arg;
}

static double env_num(const char *name, double dflt) {
    const char *v = getenv(name);
    return v && *v ? atof(v) : dflt;
}

int main(int argc, char **argv) {
    int counts[32], ncounts = 0;
    for (int i = 1; i < argc && ncounts < 32; i++) {
        counts[ncounts] = atoi(argv[i]);
        if (counts[ncounts] < 1 || counts[ncounts] > MAXT) {
            fprintf(stderr, "usage: bench_load [threads (1..%d)...]\n", MAXT);
            return 2;
        }
        ncounts++;
    }
    if (!ncounts) {
        counts[ncounts++] = 8;
        counts[ncounts++] = 32;
    }
    int max_swaps = (int)env_num("HK_LOAD_SWAPS", 10000);
    double cap_s = env_num("HK_LOAD_CAP_S", 60);
    if (max_swaps < 1 || cap_s <= 0) {
        fprintf(stderr, "HK_LOAD_SWAPS and HK_LOAD_CAP_S must be positive\n");
        return 2;
    }
    bench_init("bench_load");
    for (int tag = 1; tag <= 2; tag++) {
        char src[256];
        snprintf(src, sizeof src, TAG_SRC, tag);
        img[tag] = bench_build(src, 1, &nimg[tag]);
    }
    /* img[0]: a version without tagk, refused in validation. */
    img[0] = bench_build("extern \"C\" __global__ void other(int *s, int i) { s[i] = 7; }\n", 1,
                         &nimg[0]);
    CUlibrary lib;
    if (bd.LibraryLoadData(&lib, img[1], NULL, NULL, 0, NULL, NULL, 0) != CUDA_SUCCESS ||
        bd.LibraryGetKernel(&raw_k, lib, "tagk") != CUDA_SUCCESS) {
        fprintf(stderr, "raw load failed\n");
        return 1;
    }
    hk_options o;
    hk_options_init(&o);
    if (getenv("HK_LOAD_HOLD_US"))
        o.launch_hold_max_us = atoi(getenv("HK_LOAD_HOLD_US"));
    if (getenv("HK_LOAD_GAP_US"))
        gap_us = atoi(getenv("HK_LOAD_GAP_US"));
    printf("load: launch_hold_max_us %d, pause between swaps %d us\n", o.launch_hold_max_us,
           gap_us);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_NOW;
    hk_report rep = HK_REPORT_INIT;
    if (hk_runtime_create(&rt, &o, &rep) || hk_swap(rt, "tag", img[1], nimg[1], &so, &rep) ||
        hk_kernel_get(rt, "tag", "tagk", &hk_k)) {
        fprintf(stderr, "hotkern setup failed: %s\n", rep.message);
        return 1;
    }
    cur_tag = 1;
    static uint64_t t_create;
    t_create = bench_ns();
    hk_runtime_set_log(rt, on_log, &t_create, HK_LOG_INFO);
    if (cudaMalloc((void **)&d_rings, ((size_t)MAXT * RING + 1) * sizeof(int)) != cudaSuccess ||
        cudaMallocHost((void **)&h_rings, (size_t)MAXT * RING * sizeof(int)) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        return 1;
    }
    /* Both kernels run once before any phase, so no launcher pays the lazy
     * upload of raw_k's code. */
    int *spare = d_rings + (size_t)MAXT * RING, idx = 0;
    void *args[] = {&spare, &idx};
    CUresult r = bd.LaunchKernel((CUfunction)raw_k, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
    bench_ctx_sync();
    if (r != CUDA_SUCCESS || tag_now() != 1) {
        fprintf(stderr, "first launches failed\n");
        return 1;
    }
    printf("load: tagk<<<1,1>>> launched back to back, one non-blocking stream per thread; up to "
           "%d swaps (cubin, HK_STAGE_NOW) per phase, cap %.0f s per phase; raw load cycles at "
           "most %d and %.0f s\n",
           max_swaps, cap_s, RAW_CYCLES, RAW_CAP_S);
    static const phase phases[] = {
        {"no swap, raw launches", "", 1, 0, 0, 1, 0},
        {"no swap, hk_launch", "", 0, 0, 0, 1, 0},
        {"load", "", 0, 0, 0, 0, 0},
        {"load", " (sync/4096)", 0, 1, 0, 0, 0},
        {"raw driver", "", 1, 0, 1, 0, 0},
        {"own launches", "", 1, 0, 0, 0, 0},
        {"unhappy", "", 0, 0, 0, 0, 1},
    };
    pthread_t wd;
    pthread_create(&wd, NULL, watchdog, NULL);
    pthread_detach(wd);
    long errors = 0;
    /* HK_LOAD_PHASES=hk runs only the phases whose launches go through
     * hotkern (the baselines take their whole cap: the driver starves them). */
    const char *only = getenv("HK_LOAD_PHASES");
    if (getenv("HK_LOAD_IDLE_S"))
        idle_s = atof(getenv("HK_LOAD_IDLE_S"));
    int hk_only = only && !strcmp(only, "hk");
    for (int c = 0; c < ncounts; c++)
        for (size_t i = 0; i < sizeof phases / sizeof *phases; i++)
            if (!hk_only || !phases[i].raw_launch || phases[i].no_swap)
                errors += run_phase(&phases[i], counts[c], max_swaps, cap_s);
    hk_runtime_destroy(rt);
    bd.LibraryUnload(lib);
    cudaFree(d_rings);
    cudaFreeHost(h_rings);
    free(img[0]);
    free(img[1]);
    free(img[2]);
    if (errors)
        printf("load: %ld errors (failed launches, failed swaps, bad tags or readbacks)\n", errors);
    return errors ? 1 : 0;
}

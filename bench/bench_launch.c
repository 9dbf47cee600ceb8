/*
 * Launch overhead: an empty kernel launched through a hotkern handle versus
 * raw cuLaunchKernel of the same kernel (the CUkernel of a library loaded from
 * the same cubin, which is what a handle launches), with 1 and 8 threads, each
 * on its own non-blocking stream. Rounds alternate raw and hotkern so that
 * drift in clocks or queue state hits both; the medians are compared.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/common.h"
#include "hotkern/hotkern.h"

enum { PER_ROUND = 20000, ROUNDS = 9 };

static CUkernel raw_kernel;
static hk_kernel *hk_k;
static pthread_barrier_t bar;

typedef struct {
    double raw[ROUNDS], hk[ROUNDS];
} result;

static void *worker(void *arg) {
    result *r = arg;
    CUcontext ctx;
    bd.DevicePrimaryCtxRetain(&ctx, 0);
    bd.CtxSetCurrent(ctx);
    CUstream s;
    bd.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    for (int i = 0; i < 5000; i++) { /* warm up both paths */
        bd.LaunchKernel((CUfunction)raw_kernel, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
        hk_launch(hk_k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, s, NULL, NULL);
    }
    bd.StreamSynchronize(s);
    for (int round = 0; round < ROUNDS; round++) {
        for (int which = 0; which < 2; which++) {
            pthread_barrier_wait(&bar);
            uint64_t t0 = bench_ns();
            if (which == 0)
                for (int i = 0; i < PER_ROUND; i++)
                    bd.LaunchKernel((CUfunction)raw_kernel, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
            else
                for (int i = 0; i < PER_ROUND; i++)
                    hk_launch(hk_k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, s, NULL, NULL);
            double per = (double)(bench_ns() - t0) / PER_ROUND;
            bd.StreamSynchronize(s);
            (which ? r->hk : r->raw)[round] = per;
        }
    }
    bd.StreamDestroy(s);
    return NULL;
}

static void run(int nthreads) {
    pthread_t t[8];
    result r[8];
    pthread_barrier_init(&bar, NULL, (unsigned)nthreads);
    for (int i = 0; i < nthreads; i++)
        pthread_create(&t[i], NULL, worker, &r[i]);
    for (int i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&bar);
    /* Per round, the mean over threads; then the median over rounds. */
    double raw[ROUNDS], hk[ROUNDS];
    for (int round = 0; round < ROUNDS; round++) {
        raw[round] = hk[round] = 0;
        for (int i = 0; i < nthreads; i++) {
            raw[round] += r[i].raw[round] / nthreads;
            hk[round] += r[i].hk[round] / nthreads;
        }
    }
    double mr = bench_median(raw, ROUNDS), mh = bench_median(hk, ROUNDS);
    const char *nomb = getenv("HK_NO_MEMBARRIER");
    printf("launch overhead (%s fence), %d thread%s: raw cuLaunchKernel %.0f ns/launch, hk_launch "
           "%.0f "
           "ns/launch, ratio %.3f, difference %+.0f ns\n",
           nomb && *nomb == '1' ? "seq_cst" : "membarrier", nthreads, nthreads > 1 ? "s" : "", mr,
           mh, mh / mr, mh - mr);
}

int main(void) {
    bench_init("bench_launch");
    size_t n;
    void *cubin = bench_build(bench_src_empty, 1, &n);
    CUlibrary lib;
    if (bd.LibraryLoadData(&lib, cubin, NULL, NULL, 0, NULL, NULL, 0) != CUDA_SUCCESS ||
        bd.LibraryGetKernel(&raw_kernel, lib, "empty") != CUDA_SUCCESS) {
        fprintf(stderr, "raw load failed\n");
        return 1;
    }
    hk_runtime *rt;
    hk_report rep = HK_REPORT_INIT;
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = "";
    if (hk_runtime_create(&rt, &o, &rep) || hk_swap(rt, "b", cubin, n, NULL, &rep) ||
        hk_kernel_get(rt, "b", "empty", &hk_k)) {
        fprintf(stderr, "hotkern setup failed: %s\n", rep.message);
        return 1;
    }
    run(1);
    run(8);
    hk_runtime_destroy(rt);
    bd.LibraryUnload(lib);
    free(cubin);
    return 0;
}

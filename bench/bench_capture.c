/*
 * What the driver allows while another thread captures a stream, and what
 * unloading a library does to launches of it that are still queued. These
 * decide how hotkern reclaims code (loader/reclaim.c); the printed table is
 * recorded in bench/RESULTS.md.
 *
 * Part 1. Thread A begins a capture (global mode, on a blocking stream) and
 * records a memset. Thread B, in relaxed or in global capture mode, makes one
 * driver call. A ends the capture. For each call: B's result, and whether A's
 * capture survived.
 *
 * Part 2. A 200 ms kernel runs on stream s; behind it on s, a kernel of
 * library L that writes 42. L is unloaded at once. How long did the unload
 * take, and did the queued kernel run (and the process survive)?
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "bench/common.h"

static const char *SRC = "extern \"C\" __global__ void put(int *p, int v) { *p = v; }\n"
                         "__device__ int g;\n";

static void *img;
static size_t nimg;
static CUcontext ctx;

typedef enum { OP_CTXSYNC, OP_LOAD, OP_UPLOAD, OP_UNLOAD, OP_GLOBAL, OP_STREAM, OP_COPY, NOPS } op;
static const char *op_name[NOPS] = {
    "cuCtxSynchronize",
    "cuLibraryLoadData",
    "cuKernelGetFunction + cuFuncLoad",
    "cuLibraryUnload (idle library)",
    "cuLibraryGetGlobal",
    "cuStreamCreate (non-blocking)",
    "cuMemcpyDtoDAsync + cuStreamSynchronize, own stream",
};

static CUlibrary pre; /* loaded before the capture, for unload/upload/global */
static CUdeviceptr dbuf;

static CUresult do_op(op o) {
    CUresult r = CUDA_SUCCESS;
    CUlibrary l;
    CUkernel k;
    CUfunction f;
    CUstream s;
    CUdeviceptr p;
    size_t n;
    switch (o) {
    case OP_CTXSYNC:
        return bd.CtxSynchronize(ctx);
    case OP_LOAD:
        r = bd.LibraryLoadData(&l, img, NULL, NULL, 0, NULL, NULL, 0);
        if (r == CUDA_SUCCESS)
            pre = l; /* unloaded later, outside the capture */
        return r;
    case OP_UPLOAD:
        if ((r = bd.LibraryGetKernel(&k, pre, "put")) == CUDA_SUCCESS &&
            (r = bd.KernelGetFunction(&f, k)) == CUDA_SUCCESS)
            r = bd.FuncLoad(f);
        return r;
    case OP_UNLOAD:
        return bd.LibraryUnload(pre);
    case OP_GLOBAL:
        return bd.LibraryGetGlobal(&p, &n, pre, "g");
    case OP_STREAM:
        if ((r = bd.StreamCreate(&s, CU_STREAM_NON_BLOCKING)) == CUDA_SUCCESS)
            bd.StreamDestroy(s);
        return r;
    case OP_COPY:
        if ((r = bd.StreamCreate(&s, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
            return r;
        if ((r = bd.MemcpyDtoDAsync(dbuf + 4, dbuf, 4, s)) == CUDA_SUCCESS)
            r = bd.StreamSynchronize(s);
        bd.StreamDestroy(s);
        return r;
    default:
        return r;
    }
}

static atomic_int phase;
static cudaError_t end_err;

static void *capturer(void *arg) {
    (void)arg;
    bd.CtxSetCurrent(ctx);
    cudaStream_t s;
    cudaStreamCreate(&s);
    void *buf;
    cudaMalloc(&buf, 4096);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaMemsetAsync(buf, 1, 4096, s);
    atomic_store(&phase, 1);
    while (atomic_load(&phase) != 2)
        ;
    cudaGraph_t g = NULL;
    end_err = cudaStreamEndCapture(s, &g);
    if (g)
        cudaGraphDestroy(g);
    cudaFree(buf);
    cudaStreamDestroy(s);
    return NULL;
}

static void part1(void) {
    printf("capture: thread A captures (global mode, blocking stream); thread B calls:\n");
    for (int relaxed = 1; relaxed >= 0; relaxed--)
        for (int o = 0; o < NOPS; o++) {
            if (!pre)
                bd.LibraryLoadData(&pre, img, NULL, NULL, 0, NULL, NULL, 0);
            atomic_store(&phase, 0);
            pthread_t t;
            pthread_create(&t, NULL, capturer, NULL);
            while (atomic_load(&phase) != 1)
                ;
            CUstreamCaptureMode m =
                relaxed ? CU_STREAM_CAPTURE_MODE_RELAXED : CU_STREAM_CAPTURE_MODE_GLOBAL;
            bd.ThreadExchangeStreamCaptureMode(&m);
            CUresult r = do_op((op)o);
            bd.ThreadExchangeStreamCaptureMode(&m);
            atomic_store(&phase, 2);
            pthread_join(t, NULL);
            if (o == OP_UNLOAD && r == CUDA_SUCCESS)
                pre = NULL;
            printf("capture: B %-7s %-52s -> %-40s capture %s\n", relaxed ? "relaxed" : "global",
                   op_name[o], hkb_cu_name(&bd, r),
                   end_err == cudaSuccess ? "intact" : cudaGetErrorName(end_err));
            bd.CtxSynchronize(ctx);
        }
}

static void part2(void) {
    void *spin_img;
    size_t nspin;
    spin_img = bench_build(bench_src_empty, 1, &nspin);
    CUlibrary ls, l;
    CUkernel spin, put;
    bd.LibraryLoadData(&ls, spin_img, NULL, NULL, 0, NULL, NULL, 0);
    bd.LibraryGetKernel(&spin, ls, "spin");
    CUstream s;
    bd.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    for (int queued = 0; queued < 2; queued++) {
        bd.LibraryLoadData(&l, img, NULL, NULL, 0, NULL, NULL, 0);
        bd.LibraryGetKernel(&put, l, "put");
        cudaMemset((void *)(uintptr_t)dbuf, 0, 4);
        long long cycles = (long long)(bench_sm_hz() * 0.2);
        void *sargs[] = {&cycles};
        bd.LaunchKernel((CUfunction)spin, 1, 1, 1, 1, 1, 1, 0, s, sargs, NULL);
        int v = 42;
        void *pargs[] = {&dbuf, &v};
        if (queued) /* else L's code is loaded but idle */
            bd.LaunchKernel((CUfunction)put, 1, 1, 1, 1, 1, 1, 0, s, pargs, NULL);
        uint64_t t0 = bench_ns();
        CUresult r = bd.LibraryUnload(l);
        double ms = (double)(bench_ns() - t0) / 1e6;
        CUresult rs = bd.StreamSynchronize(s);
        CUresult rc = bd.CtxSynchronize(ctx);
        int got = -1;
        cudaMemcpy(&got, (void *)(uintptr_t)dbuf, 4, cudaMemcpyDeviceToHost);
        printf("unload: %s; cuLibraryUnload(L) -> %s in %.1f ms; then stream %s, context %s, "
               "buffer %d\n",
               queued ? "a kernel of L queued behind a 200 ms kernel (it writes 42)"
                      : "L idle while a 200 ms kernel of another library runs",
               hkb_cu_name(&bd, r), ms, hkb_cu_name(&bd, rs), hkb_cu_name(&bd, rc), got);
    }
}

int main(void) {
    bench_init("bench_capture");
    bd.CtxGetCurrent(&ctx);
    img = bench_build(SRC, 1, &nimg);
    bd.MemAlloc(&dbuf, 64);
    cudaMemset((void *)(uintptr_t)dbuf, 0, 64);
    part1();
    part2();
    return 0;
}

/*
 * Warm start: NVRTC's first compile in a process costs more than the ones
 * after it (the compiler and its builtins are loaded and initialised; up to
 * hundreds of milliseconds where the libraries are not in the page cache). A
 * runtime pays that on a background thread as soon as it is created, so the
 * first swap of CUDA C does not.
 *
 * The thread compiles two small programs through hkp_build, like a swap
 * would (same arch, toolkit search path, PCH): an empty kernel, then one
 * that includes <cuda/std/cstdint>, whose PCH a swap opening with that
 * header reuses. Nothing is cached or kept. Creation never waits for it; stop
 * sets a flag that skips whatever has not started and joins, so it waits for
 * at most the one compile in progress (NVRTC cannot be interrupted).
 *
 * Threads: the warm thread owns nothing but its programs; `stop` and `done`
 * are atomics, read and written by both sides. A stop that may not wait for
 * the compile (a runtime's bounded destroy) leaves the thread detached: then
 * whichever of the two lets go of the struct last frees it (`refs`).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ptx/ptx.h"
#include "util/util.h"

struct hkp_warm {
    pthread_t thread; /* immutable after start */
    int arch;         /* immutable */
    _Atomic int stop; /* set by hkp_warm_stop */
    _Atomic int done; /* set by the thread when it has finished */
    _Atomic int refs; /* the thread and its stopper: the last one frees */
};

static void warm_put(hkp_warm *w) {
    if (atomic_fetch_sub(&w->refs, 1) == 1)
        free(w);
}

static const char *const warm_src[] = {
    "extern \"C\" __global__ void hk_warm(int *x) { x[threadIdx.x] = 1; }\n",
    "#include <cuda/std/cstdint>\n"
    "extern \"C\" __global__ void hk_warm(cuda::std::int32_t *x) { x[threadIdx.x] = 2; }\n",
};

static void *warm_main(void *arg) {
    /* Named for top -H, gdb and profilers (at most 15 characters). */
    pthread_setname_np(pthread_self(), "hk-warm");
    hkp_warm *w = arg;
    for (size_t i = 0; i < sizeof warm_src / sizeof warm_src[0]; i++) {
        if (atomic_load(&w->stop))
            break;
        hkp_build_opts o = {
            .arch = w->arch, .ptx_to_cubin = 1, .opt_level = 3, .pch = 1, .source_name = "warm.cu"};
        hkp_artifact a;
        /* A failure here only means the first real build pays the start-up;
         * that build reports its own errors. */
        (void)hkp_build(warm_src[i], strlen(warm_src[i]), HK_FORMAT_CUDA_C, &o, &a, NULL, 0);
        hkp_artifact_free(&a);
    }
    atomic_store(&w->done, 1);
    warm_put(w);
    return NULL;
}

int hkp_warm_start(hkp_warm **out, int arch) {
    if (!out || HKP_ARCH_NUM(arch) <= 0)
        return HK_ERR_INVALID;
    *out = NULL;
    hkp_warm *w = calloc(1, sizeof *w);
    if (!w)
        return HK_ERR_NOMEM;
    w->arch = arch;
    atomic_init(&w->stop, 0);
    atomic_init(&w->done, 0);
    atomic_init(&w->refs, 2);
    if (pthread_create(&w->thread, NULL, warm_main, w) != 0) {
        free(w);
        return HK_ERR_NOMEM;
    }
    *out = w;
    return 0;
}

void hkp_warm_stop(hkp_warm *w) {
    if (!w)
        return;
    atomic_store(&w->stop, 1);
    pthread_join(w->thread, NULL);
    warm_put(w);
}

void hkp_warm_stop_by(hkp_warm *w, double until_ms) {
    if (!w)
        return;
    atomic_store(&w->stop, 1);
    while (!atomic_load(&w->done) && hku_now_ms() < until_ms)
        usleep(1000);
    if (atomic_load(&w->done))
        pthread_join(w->thread, NULL);
    else
        pthread_detach(w->thread);
    warm_put(w);
}

int hkp_warm_done(hkp_warm *w) {
    return w && atomic_load(&w->done);
}

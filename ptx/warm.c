/*
 * Warm start: NVRTC's first compile in a process costs more than the ones
 * after it (the compiler and its builtins are loaded and initialised; up to
 * hundreds of milliseconds where the libraries are not in the page cache). A
 * runtime pays that on a background thread as soon as it is created, so the
 * first swap of CUDA C does not.
 *
 * The process's first compile (hkp_first_compile: the empty kernel to PTX,
 * once a process, on the creating thread) registers exit handlers of
 * NVRTC's and the C++ library's (none at later compiles, nor at
 * nvJitLink's first link), which must come before the exit guard's
 * (base/exit.h), or an exit during it would run them under the compile and
 * crash. The thread then compiles two small programs through hkp_build,
 * like a swap would (same arch, toolkit search path, link, PCH): the empty
 * kernel, then one that includes <cuda/std/cstdint>, whose PCH a swap
 * opening with that header reuses. Nothing is cached or kept. Creation
 * waits for the first compile only (once a process); stop
 * sets a flag that skips whatever has not started and joins, so it waits for
 * at most the one compile in progress (NVRTC cannot be interrupted).
 *
 * hkp_keep_heap is the other half of a fast compile: NVRTC allocates and
 * frees tens of megabytes per compile, and with glibc's default thresholds
 * much of it goes back to the kernel after each one, to be faulted in and
 * zeroed again by the next (a page fault cost 1.7-2.2 us on the H200 host,
 * 0.6-0.7 us on the CI machine). Keeping it is a process-wide choice, so a
 * runtime never makes it for the application: the build helper makes it for
 * itself, and hk_build_keep_memory offers it to programs.
 *
 * Threads: the warm thread owns nothing but its programs; `stop` and `done`
 * are atomics, read and written by both sides. A stop that may not wait for
 * the compile (a runtime's bounded destroy) leaves the thread detached: then
 * whichever of the two lets go of the struct last frees it (`refs`).
 */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
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

/* Compiles warm_src[i] for arch as a swap would; a failure only means the
 * first real build pays the start-up (and reports its own errors). */
static void warm_compile(size_t i, int arch) {
    hkp_build_opts o = {
        .arch = arch, .ptx_to_cubin = 1, .opt_level = 3, .pch = 1, .source_name = "warm.cu"};
    hkp_artifact a;
    (void)hkp_build(warm_src[i], strlen(warm_src[i]), HK_FORMAT_CUDA_C, &o, &a, NULL, 0);
    hkp_artifact_free(&a);
}

static pthread_once_t first_once = PTHREAD_ONCE_INIT;
static int first_arch;

static void first_compile(void) {
    /* NVRTC alone (to PTX, no PCH): what registers the exit handlers; the
     * link and the PCH are the warm-up thread's. */
    hkp_build_opts o = {.arch = first_arch, .opt_level = 3, .source_name = "first.cu"};
    hkp_artifact a;
    (void)hkp_build(warm_src[0], strlen(warm_src[0]), HK_FORMAT_CUDA_C, &o, &a, NULL, 0);
    hkp_artifact_free(&a);
}

void hkp_first_compile(int arch) {
    first_arch = arch;
    pthread_once(&first_once, first_compile);
}

static void *warm_main(void *arg) {
    /* Named for top -H, gdb and profilers (at most 15 characters). */
    pthread_setname_np(pthread_self(), "hk-warm");
    hkp_warm *w = arg;
    for (size_t i = 0; i < sizeof warm_src / sizeof warm_src[0]; i++) {
        if (atomic_load(&w->stop))
            break;
        warm_compile(i, w->arch);
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

/* 1: done; 0: left to the environment's malloc settings; -1: mallopt
 * refused one or more. Set once. */
static int keep_rc;
static char keep_why[160];
static int keep_force; /* set by the first caller, before the once */
static pthread_once_t keep_once = PTHREAD_ONCE_INIT;

/* The environment's own malloc settings, which a program's process keeps. */
static const char *malloc_env(void) {
    const char *t = getenv("GLIBC_TUNABLES");
    if (t && strstr(t, "glibc.malloc."))
        return "GLIBC_TUNABLES sets glibc.malloc tunables";
    static const char *const old[] = {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                                      "MALLOC_TOP_PAD_"};
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
        if (getenv(old[i]))
            return old[i];
    return NULL;
}

static void keep_heap_once(void) {
    const char *env = keep_force ? NULL : malloc_env();
    if (env) {
        snprintf(keep_why, sizeof keep_why, "left as it is: %s", env);
        keep_rc = 0;
        return;
    }
    static const struct {
        int param, value;
        const char *name;
    } set[] = {{M_TRIM_THRESHOLD, HKP_KEEP_TRIM, "M_TRIM_THRESHOLD"},
               {M_MMAP_THRESHOLD, HKP_KEEP_MMAP, "M_MMAP_THRESHOLD"},
               {M_TOP_PAD, HKP_KEEP_PAD, "M_TOP_PAD"}};
    size_t n = 0;
    keep_rc = 1;
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
        if (mallopt(set[i].param, set[i].value) != 1) {
            int w = snprintf(keep_why + n, sizeof keep_why - n, "%s%s=%d",
                             keep_rc < 0 ? ", " : "the allocator refused mallopt ", set[i].name,
                             set[i].value);
            if (w > 0 && (size_t)w < sizeof keep_why - n)
                n += (size_t)w;
            keep_rc = -1;
        }
    if (keep_rc < 0 && n < sizeof keep_why)
        snprintf(keep_why + n, sizeof keep_why - n, " (any other is in place)");
}

int hkp_keep_heap(int force, char *why, size_t why_size) {
    if (force)
        keep_force = 1; /* hotkern's own process, before its threads */
    pthread_once(&keep_once, keep_heap_once);
    if (keep_rc <= 0 && why && why_size)
        snprintf(why, why_size, "%s", keep_why);
    return keep_rc < 0 ? HK_ERR_IO : keep_rc;
}

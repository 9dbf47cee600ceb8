/*
 * Automatic safe points: code is uploaded (and replaced code unloaded) at
 * moments the program's own calls show its GPU work idle, since an upload
 * or an unload waits for all the context's work in flight and stalls every
 * launching thread meanwhile (FACTS.md: "What exactly waits"). An nvcc
 * program never calls hk_safe_point; it synchronises, though.
 *
 * The engine is told that idle moments come from here (hkl_auto_safe_points,
 * at attach): from then on its versions wait for one, each at most
 * safe_point_wait_ms, and so do the unloads of the versions they replace
 * (but for a swap that asked for HK_STAGE_NOW). Every interposed
 * synchronisation (device, stream and event synchronisations and queries,
 * synchronous cudaMemcpy) forwards first; then, only when it succeeded and
 * something waits for a safe point (one load of the engine's sp.wanted), it
 * asks whether all the program's GPU work is idle, and if so runs the safe
 * point right there, on the program's thread, before its call returns
 * (hkl_idle_point), as a program that calls hk_safe_point after its
 * synchronisation would. Otherwise the call returns as it came and the work
 * waits for a later moment.
 *
 * Idle means: every stream the program launched a kernel on (sync.h) answers
 * cudaStreamQuery with success, the legacy default stream (when it has
 * one) and this thread's per-thread one included; every other thread's
 * per-thread default stream was seen idle since its last launch (by that
 * thread, or by a cudaDeviceSynchronize that began after it). A
 * synchronisation of one stream says nothing of the others: a kernel in
 * flight on another stream keeps the moment from being idle. A capturing
 * stream is never asked (the query would invalidate its capture) and counts
 * as busy, and the legacy stream is asked last, when none captures; the
 * queries run in relaxed capture mode, so another thread's global-mode
 * capture is never invalidated either. A stream the program destroys leaves
 * the list first.
 *
 * Not seen: work issued only by graph launches, copies or libraries on a
 * stream no kernel of the program was launched on through the runtime, and
 * launches another thread issues between the check and the upload. Such work
 * makes the upload wait for it, as it did before; it never breaks anything.
 * A program with more than 256 streams at once gets no automatic safe
 * points (the versions then stage after safe_point_wait_ms, as before).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interpose/sync.h"
#include "loader/port.h"
#include "util/util.h"

__thread hki_sync_tls hki_stls __attribute__((tls_model("initial-exec")));
_Atomic uint32_t hki_streams_gen;

static hki_sync_real S;
static hki_memcpy_fn real_memcpy;
static _Atomic(hk_runtime *) sync_rt; /* set: automatic safe points are on */

void hki_sync_real_set(const hki_real *real) {
    S = real->sync;
    real_memcpy = real->memcpy;
}

/* ---- the program's streams ------------------------------------------------ */

#define NSTREAMS 256            /* a power of two */
#define TOMB     ((uintptr_t)1) /* a stream that left; CU_STREAM_LEGACY is never kept */

static _Atomic uintptr_t streams[NSTREAMS]; /* written under streams_lock */
static _Atomic int streams_full;            /* one could not be kept: never idle */
static _Atomic int legacy_used;             /* a kernel was launched on the legacy stream */
static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;

static inline size_t slot_of(uintptr_t k) {
    uint64_t x = (uint64_t)k;
    x ^= x >> 29;
    x *= 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 56);
}

static int stream_known(uintptr_t k) {
    size_t h = slot_of(k);
    for (size_t i = 0; i < NSTREAMS; i++) {
        uintptr_t v =
            atomic_load_explicit(&streams[(h + i) & (NSTREAMS - 1)], memory_order_acquire);
        if (v == k)
            return 1;
        if (!v)
            return 0;
    }
    return 0;
}

static void stream_add(uintptr_t k) {
    pthread_mutex_lock(&streams_lock);
    size_t h = slot_of(k), free_at = NSTREAMS;
    int found = 0;
    for (size_t i = 0; i < NSTREAMS && !found; i++) {
        size_t at = (h + i) & (NSTREAMS - 1);
        uintptr_t v = atomic_load_explicit(&streams[at], memory_order_relaxed);
        found = v == k;
        if ((v == TOMB || !v) && free_at == NSTREAMS)
            free_at = at;
        if (!v)
            break;
    }
    if (!found && free_at < NSTREAMS)
        atomic_store_explicit(&streams[free_at], k, memory_order_release);
    else if (!found)
        atomic_store(&streams_full, 1);
    pthread_mutex_unlock(&streams_lock);
}

static void stream_remove(uintptr_t k) {
    pthread_mutex_lock(&streams_lock);
    for (size_t i = 0; i < NSTREAMS; i++)
        if (atomic_load_explicit(&streams[i], memory_order_relaxed) == k)
            atomic_store_explicit(&streams[i], TOMB, memory_order_relaxed);
    atomic_fetch_add(&hki_streams_gen, 1); /* every thread's cache looks again */
    pthread_mutex_unlock(&streams_lock);
}

/* ---- the threads' per-thread default streams ------------------------------ */

static _Atomic(hki_thr *) thrs; /* push-only */
static pthread_key_t thr_key;
static pthread_once_t thr_once = PTHREAD_ONCE_INIT;

/* A thread that ends can no longer be asked: its stream counts as idle. */
static void thr_release(void *p) {
    hki_thr *r = p;
    atomic_store(&r->ptds_idle, atomic_load(&r->ptds_launches));
    atomic_store(&r->owned, 0);
}

static void thr_key_make(void) {
    pthread_key_create(&thr_key, thr_release);
}

static hki_thr *thr_claim(void) {
    pthread_once(&thr_once, thr_key_make);
    hki_thr *r = atomic_load(&thrs);
    for (; r; r = r->next) {
        int zero = 0;
        if (atomic_compare_exchange_strong(&r->owned, &zero, 1))
            break;
    }
    if (!r) {
        if (!(r = aligned_alloc(_Alignof(hki_thr), sizeof *r)))
            return NULL;
        memset(r, 0, sizeof *r);
        atomic_store(&r->owned, 1);
        r->next = atomic_load(&thrs);
        while (!atomic_compare_exchange_weak(&thrs, &r->next, r))
            ;
    }
    pthread_setspecific(thr_key, r);
    return r;
}

void hki_track_slow(CUstream key) {
    hki_sync_tls *t = &hki_stls;
    t->seen = 1;
    if (key == CU_STREAM_PER_THREAD) {
        if ((t->thr = thr_claim()) != NULL)
            atomic_fetch_add_explicit(&t->thr->ptds_launches, 1, memory_order_relaxed);
        else
            atomic_store(&streams_full, 1); /* cannot be followed: never idle */
        return;
    }
    if (key == CU_STREAM_LEGACY) {
        atomic_store(&legacy_used, 1);
        t->legacy = 1;
        return;
    }
    uint32_t gen = atomic_load(&hki_streams_gen);
    if (!stream_known((uintptr_t)key))
        stream_add((uintptr_t)key);
    t->last = key;
    t->gen = gen;
}

/* ---- the idle check ---------------------------------------------------------- */

/* 1 when stream s has nothing in flight: not capturing and its query says
 * so. A handle the runtime no longer knows has nothing in flight. */
static int stream_idle(hk_runtime *rt, CUstream s) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (hkl_driver(rt)->StreamIsCapturing(s, &st) != CUDA_SUCCESS ||
        st != CU_STREAM_CAPTURE_STATUS_NONE)
        return 0;
    cudaError_t e = S.query((cudaStream_t)s);
    return e == cudaSuccess || e == cudaErrorInvalidResourceHandle;
}

/* 1 when the program's GPU work is idle now (see the top of this file). */
static int all_idle(hk_runtime *rt, hki_sync_tls *t) {
    for (hki_thr *r = atomic_load(&thrs); r; r = r->next)
        if (r != t->thr && atomic_load_explicit(&r->owned, memory_order_relaxed) &&
            atomic_load_explicit(&r->ptds_idle, memory_order_relaxed) !=
                atomic_load_explicit(&r->ptds_launches, memory_order_relaxed))
            return 0;
    /* Held while asking, so that no stream is destroyed under the question;
     * another thread asking already answers for this one. */
    if (atomic_load(&streams_full) || pthread_mutex_trylock(&streams_lock))
        return 0;
    CUstreamCaptureMode m = hkl_relax(rt);
    int idle = 1;
    for (size_t i = 0; i < NSTREAMS && idle; i++) {
        uintptr_t k = atomic_load_explicit(&streams[i], memory_order_relaxed);
        if (k > TOMB)
            idle = stream_idle(rt, (CUstream)k);
    }
    /* The legacy stream last, once no stream of the program captures (a
     * question to it would meet a blocking stream's capture), and only when
     * the program launches there. */
    if (idle && atomic_load(&legacy_used))
        idle = stream_idle(rt, CU_STREAM_LEGACY);
    if (idle && t->thr) {
        uint64_t n = atomic_load_explicit(&t->thr->ptds_launches, memory_order_relaxed);
        if ((idle = stream_idle(rt, CU_STREAM_PER_THREAD)))
            atomic_store_explicit(&t->thr->ptds_idle, n, memory_order_relaxed);
    }
    hkl_unrelax(rt, m);
    pthread_mutex_unlock(&streams_lock);
    return idle;
}

/* The runtime, when something waits for a safe point; else NULL. */
static inline hk_runtime *wanted(void) {
    hk_runtime *rt = atomic_load_explicit(&sync_rt, memory_order_acquire);
    return rt && hkl_safe_point_wanted(rt) ? rt : NULL;
}

/* After a synchronisation `what` that succeeded, with something waiting. */
static void after(hk_runtime *rt, const char *what) {
    hki_sync_tls *t = &hki_stls;
    t->seen = 1;
    if (t->in_check)
        return;
    t->in_check = 1;
    if (all_idle(rt, t)) {
        double t0 = hku_now_ms();
        int n = hkl_idle_point(rt);
        hk_log(rt, HK_LOG_DEBUG, "interpose",
               "%s: the program's GPU work is idle: safe point (%d committed, %.3f ms)", what, n,
               hku_now_ms() - t0);
    }
    t->in_check = 0;
}

#define AFTER(r, what)                                                                             \
    do {                                                                                           \
        hk_runtime *rt_;                                                                           \
        if (__builtin_expect((r) == cudaSuccess && (rt_ = wanted()) != NULL, 0))                   \
            after(rt_, what);                                                                      \
    } while (0)

static int own_thread(void) {
    return hki_stls.seen;
}

void hki_sync_attach(hk_runtime *rt) {
    hki_stls.seen = 1; /* the program's thread */
    const char *v = getenv("HOTKERN_AUTO_SAFE_POINTS");
    if (v && !strcmp(v, "0"))
        return; /* versions and unloads stage as soon as they can, as before */
    if (v && *v && strcmp(v, "1"))
        fprintf(stderr,
                "hotkern: HOTKERN_AUTO_SAFE_POINTS=%s: expected 0 or 1; automatic safe points "
                "stay on\n",
                v);
    hkl_auto_safe_points(rt, own_thread);
    atomic_store_explicit(&sync_rt, rt, memory_order_release);
}

/* ---- the entry points -------------------------------------------------------- */

cudaError_t hki_device_sync(void) {
    hk_runtime *rt = wanted();
    if (__builtin_expect(!rt, 1))
        return S.device();
    /* Every per-thread stream's launches before this call are finished once
     * it returns: noted for the threads that cannot be asked from here. */
    enum { MAXSNAP = 64 };
    hki_thr *who[MAXSNAP];
    uint64_t n[MAXSNAP];
    int k = 0;
    for (hki_thr *r = atomic_load(&thrs); r && k < MAXSNAP; r = r->next, k++) {
        who[k] = r;
        n[k] = atomic_load(&r->ptds_launches);
    }
    cudaError_t e = S.device();
    if (e == cudaSuccess)
        for (int i = 0; i < k; i++) {
            uint64_t cur = atomic_load(&who[i]->ptds_idle);
            while (cur < n[i] && !atomic_compare_exchange_weak(&who[i]->ptds_idle, &cur, n[i]))
                ;
        }
    AFTER(e, "cudaDeviceSynchronize");
    return e;
}

cudaError_t hki_stream_sync(int ptsz, cudaStream_t s) {
    cudaError_t e = (ptsz ? S.stream_ptsz : S.stream)(s);
    AFTER(e, "cudaStreamSynchronize");
    return e;
}

cudaError_t hki_stream_query(int ptsz, cudaStream_t s) {
    cudaError_t e = (ptsz ? S.query_ptsz : S.query)(s);
    AFTER(e, "cudaStreamQuery");
    return e;
}

cudaError_t hki_event_sync(cudaEvent_t ev) {
    cudaError_t e = S.event(ev);
    AFTER(e, "cudaEventSynchronize");
    return e;
}

cudaError_t hki_event_query(cudaEvent_t ev) {
    cudaError_t e = S.event_query(ev);
    AFTER(e, "cudaEventQuery");
    return e;
}

cudaError_t hki_memcpy(int ptds, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    cudaError_t e = (ptds ? S.memcpy_ptds : real_memcpy)(dst, src, n, kind);
    AFTER(e, "cudaMemcpy");
    return e;
}

cudaError_t hki_stream_destroy(cudaStream_t s) {
    if ((uintptr_t)s > (uintptr_t)CU_STREAM_PER_THREAD)
        stream_remove((uintptr_t)s);
    return S.stream_destroy(s);
}

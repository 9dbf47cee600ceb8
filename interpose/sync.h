/*
 * The launch path's half of the automatic safe points (sync.c): which
 * streams the program launches on, noted at every launch for the cost of a
 * thread-local compare. A thread keeps the stream it launched on last (and
 * the generation of the stream list it saw then): a launch on the same one
 * does nothing more; one on another stream looks it up in the list (and
 * adds it, under a lock, when new). Per-thread default streams are the
 * thread's own: each launch on one counts in the thread's record, so that
 * other threads can tell whether it has launched since it was last seen
 * idle.
 */
#ifndef HK_INTERPOSE_SYNC_H
#define HK_INTERPOSE_SYNC_H

#include <stdatomic.h>
#include <stdint.h>

#include "interpose/interpose.h"

typedef struct hki_thr hki_thr;
struct hki_thr {
    _Alignas(64) _Atomic uint64_t ptds_launches; /* its owner writes: launches on its
                                                  * per-thread default stream */
    _Atomic uint64_t ptds_idle;                  /* ptds_launches when that stream was
                                                  * last seen idle */
    _Atomic int owned;                           /* 0: free for the next thread */
    hki_thr *next;                               /* immutable once published */
};

typedef struct hki_sync_tls {
    CUstream last; /* the stream of this thread's last launch (not a default one) */
    uint32_t gen;  /* the stream list's generation when it was looked up */
    int seen;      /* this thread launched or synchronised through the interposition */
    int in_check;  /* inside the idle check: a nested synchronisation checks nothing */
    int legacy;    /* this thread's launch on the legacy stream was noted */
    hki_thr *thr;  /* this thread's record, once it launched on its per-thread stream */
} hki_sync_tls;

extern __thread hki_sync_tls hki_stls __attribute__((tls_model("initial-exec")));
extern _Atomic uint32_t hki_streams_gen; /* bumped when a stream leaves the list */

void hki_track_slow(CUstream key);
/* For route.c: the real entry points (hki_real_set) and the runtime launches
 * route through (hk_interpose_attach), which turns automatic safe points on
 * unless HOTKERN_AUTO_SAFE_POINTS=0. */
void hki_sync_real_set(const hki_real *real);
void hki_sync_attach(hk_runtime *rt);

/* The stream a launch goes to: a _ptsz entry point's 0 is the thread's
 * per-thread default stream, another's the legacy one (cudaStreamLegacy and
 * cudaStreamPerThread are CU_STREAM_LEGACY and CU_STREAM_PER_THREAD). */
static inline CUstream hki_stream_key(int ptsz, cudaStream_t s) {
    if (!s)
        return ptsz ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    return (CUstream)s;
}

/* Notes a launch of this thread on stream s (before it is issued). */
static inline void hki_track(int ptsz, cudaStream_t s) {
    hki_sync_tls *t = &hki_stls;
    CUstream k = hki_stream_key(ptsz, s);
    if (k == CU_STREAM_PER_THREAD) {
        hki_thr *r = t->thr;
        if (__builtin_expect(r != NULL, 1)) {
            uint64_t n = atomic_load_explicit(&r->ptds_launches, memory_order_relaxed);
            atomic_store_explicit(&r->ptds_launches, n + 1, memory_order_relaxed);
            return;
        }
    } else if (k == t->last &&
               t->gen == atomic_load_explicit(&hki_streams_gen, memory_order_relaxed)) {
        return;
    } else if (k == CU_STREAM_LEGACY && t->legacy) {
        return;
    }
    hki_track_slow(k);
}

#endif /* HK_INTERPOSE_SYNC_H */

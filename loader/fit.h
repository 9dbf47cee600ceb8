/*
 * What a version of a program's kernel must fit (expect.c, fit.c): the launch
 * configurations the program has used (hkl_use, raised by the <<<>>>
 * interposition's launches), the per-function settings it made (recorded
 * for every hot version), and the fallback to the program's code when a hot
 * launch fails anyway. For interpose/ and the swap's validation.
 */
#ifndef HK_LOADER_FIT_H
#define HK_LOADER_FIT_H

#include "loader/loader.h"

/* The launch configurations the program has used for one of its kernels:
 * maxima, raised by the launching threads with relaxed atomics (a load and a
 * compare per launch; a store only when a launch exceeds them), read by the
 * launchability check before a commit (fit.c). 0: none seen. */
typedef struct hkl_use {
    _Atomic uint32_t threads;    /* threads per block */
    _Atomic uint32_t smem;       /* dynamic shared memory, bytes */
    _Atomic uint32_t cluster[3]; /* cluster dimensions a launch attribute set */
    _Atomic uint32_t coop_blocks, coop_threads, coop_smem; /* cooperative launches */
} hkl_use;

static inline void hkl_use_max(_Atomic uint32_t *a, uint64_t v) {
    uint32_t want = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
    uint32_t o = atomic_load_explicit(a, memory_order_relaxed);
    while (__builtin_expect(want > o, 0) &&
           !atomic_compare_exchange_weak_explicit(a, &o, want, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/* A launch of block b with smem bytes of dynamic shared memory. */
static inline void hkl_use_note(hkl_use *u, unsigned bx, unsigned by, unsigned bz, size_t smem) {
    hkl_use_max(&u->threads, (uint64_t)bx * by * bz);
    hkl_use_max(&u->smem, smem);
}

/* More of expect.c, for the interposition and the launchability check:
 * - hkl_expect_use: e's configurations (valid as long as e).
 * - hkl_expect_set_attr records attribute attr (a CUfunction_attribute; -1:
 *   the cache config) set by the program on its kernel, for every hot version
 *   to take at bind and at each swap, and sets it on the version that runs
 *   now; one that does not take it sends its module back to the program's
 *   code (as hkl_expect_fallback). Takes swap_lock (not from a check
 *   callback: then recorded only, for the next versions).
 * - hkl_expect_fallback: a hot launch of e's version failed with cu (what
 *   says which launch; the program's own launch of the same call returned
 *   prog, -1: not a launch but a setting the version refused): its module's program kernels go back
 * to the program's code until the module's next commit, counted, logged and emitted
 * (HK_EVENT_FALLBACK). Takes expect_lock and stats_lock only: called by launching threads.
 * - hkl_expect_attrs: e's recorded attributes, copied into a handle made
 *   for it (swap_lock held). */
hkl_use *hkl_expect_use(hkl_expect *e);
int hkl_expect_set_attr(hk_runtime *rt, hkl_expect *e, int attr, int value, hk_report *rep);
void hkl_expect_fallback(hk_runtime *rt, hkl_expect *e, int cu, const char *what, int prog);

/* fit.c: whether v's kernel of handle k (a program's kernel: k->expect set)
 * can take every launch configuration the program has used for it, with the
 * attributes applied: block size against the function's limit for its
 * registers, dynamic shared memory against its limit, cluster dimensions,
 * the largest cooperative grid against co-residency. 0, or HK_ERR_ATTRIBUTE
 * with the kernel, the configuration and the limit in rep. swap_lock held,
 * gate closed, device 0's context current. */
int hkl_fit_check(hk_runtime *rt, hkl_version *v, const hk_kernel *k, hk_report *rep);

#endif /* HK_LOADER_FIT_H */

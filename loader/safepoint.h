/*
 * loader/safepoint.h: automatic safe points, between the engine (worker.c,
 * reclaim.c, swap.c) and a source of idle moments above it (the <<<>>>
 * interposition, interpose/sync.c). The state is the runtime's part rt->sp
 * (loader.h).
 */
#ifndef HK_LOADER_SAFEPOINT_H
#define HK_LOADER_SAFEPOINT_H

#include "loader/loader.h"

/* Automatic safe points, for a source that sees when the program's GPU work
 * is idle without the program saying so (the <<<>>> interposition watches
 * its synchronisations). hkl_auto_safe_points turns them on for rt: from
 * then on a version staged with HK_STAGE_AUTO waits for a safe point (up to
 * safe_point_wait_ms) unless own_thread() says the requesting thread is one
 * whose own calls bring the idle moments (it would wait for itself), and
 * every replaced version (but one replaced by an HK_STAGE_NOW swap) is
 * unloaded at a safe point too (or by the reclaim thread safe_point_wait_ms
 * after it could have been). hkl_safe_point_wanted
 * (one relaxed load) says whether anything waits for one; hkl_idle_point is
 * hk_safe_point for such a source: the program's GPU work is idle now. */
enum { HKL_SP_JOBS = 1, HKL_SP_UNLOADS = 2 };
void hkl_auto_safe_points(hk_runtime *rt, int (*own_thread)(void));
int hkl_idle_point(hk_runtime *rt);
static inline int hkl_safe_point_wanted(hk_runtime *rt) {
    return atomic_load_explicit(&rt->sp.wanted, memory_order_relaxed) != 0;
}
/* Sets or clears bit of sp.wanted (its list's lock held). */
static inline void hkl_sp_mark(hk_runtime *rt, int bit, int on) {
    if (on)
        atomic_fetch_or(&rt->sp.wanted, bit);
    else
        atomic_fetch_and(&rt->sp.wanted, ~bit);
}

#endif /* HK_LOADER_SAFEPOINT_H */

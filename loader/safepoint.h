/*
 * loader/safepoint.h: automatic safe points inside the engine (worker.c,
 * reclaim.c, swap.c): the bits of rt->sp.wanted. The half a source of idle
 * moments uses (the <<<>>> interposition, interpose/sync.c) is
 * loader/port.h's: hkl_auto_safe_points, hkl_idle_point and
 * hkl_safe_point_wanted.
 */
#ifndef HK_LOADER_SAFEPOINT_H
#define HK_LOADER_SAFEPOINT_H

#include "loader/core.h"

enum { HKL_SP_JOBS = 1, HKL_SP_UNLOADS = 2 };
/* Sets or clears bit of sp.wanted (its list's lock held). */
static inline void hkl_sp_mark(hk_runtime *rt, int bit, int on) {
    if (on)
        atomic_fetch_or(&rt->sp.wanted, bit);
    else
        atomic_fetch_and(&rt->sp.wanted, ~bit);
}

#endif /* HK_LOADER_SAFEPOINT_H */

/*
 * loader/context.h: what every floor of loader/ uses to reach the driver
 * (context.c): swap_lock with its owner, and driver errors into reports.
 */
#ifndef HK_LOADER_CONTEXT_H
#define HK_LOADER_CONTEXT_H

#include "loader/core.h"

/* context.c: swap_lock with its owner recorded. hkl_swap_lock returns 1 without
 * locking when the calling thread already holds it (a callback run under it):
 * read-only callers go on, others return HK_ERR_BUSY. */
int hkl_swap_lock(hk_runtime *rt);
/* The same, giving up at until_ms (hkl_now_ms's clock): 0 locked, 1 nested,
 * HK_ERR_TIMEOUT. Destroy's, which must not wait on a holder that sits in
 * the driver (the reclaim thread's reset check and its reloads). */
int hkl_swap_lock_by(hk_runtime *rt, double until_ms);
void hkl_swap_unlock(hk_runtime *rt, int nested);
int hkl_swap_held(const hk_runtime *rt);

/* Records a failed driver call in rep: HK_ERR_CUDA, its CUresult and name. */
int hkl_report_cu(hk_report *rep, const hk_runtime *rt, CUresult r, const char *what);
/* hkl_relax, hkl_unrelax, hkl_ctx_push, hkl_ctx_pop: loader/port.h. */

#endif /* HK_LOADER_CONTEXT_H */

/*
 * loader/reclaim.h: the reclaim thread (reclaim.c; hkl_retire and
 * hkl_reclaim_kick, which hand it work, are version.c's).
 */
#ifndef HK_LOADER_RECLAIM_H
#define HK_LOADER_RECLAIM_H

#include "loader/core.h"

/* The part rt->rec. */
int hkl_reclaim_init(hk_runtime *rt);
void hkl_reclaim_finish(hk_runtime *rt);
/* hkl_reclaim_start starts the reclaim thread; free_rt frees the runtime
 * (runtime.c's), which the thread calls after its final pass when destroy
 * stopped waiting for it. */
int hkl_reclaim_start(hk_runtime *rt, void (*free_rt)(hk_runtime *rt));
void hkl_reclaim_stop(hk_runtime *rt);
/* Destroy's: every current version joins the retired ones for the final
 * pass (swap_lock held). */
void hkl_retire_all(hk_runtime *rt);
void hkl_reclaim_deferred(hk_runtime *rt);            /* from hk_safe_point */
int hkl_reclaim_join(hk_runtime *rt, int timeout_ms); /* 0, or HK_ERR_TIMEOUT */

#endif /* HK_LOADER_RECLAIM_H */

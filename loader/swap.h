/*
 * loader/swap.h: the swap transaction (swap.c).
 */
#ifndef HK_LOADER_SWAP_H
#define HK_LOADER_SWAP_H

#include "loader/core.h"
#include "loader/job.h"

/* hkl_swap_job swaps in a built job (its
 * artifact filled: by the build step, or by restore): swap_lock taken here
 * (HK_ERR_BUSY when this thread holds it already: a check callback),
 * outcome counted and emitted. Returns 0 (committed, or the running
 * version is this image already) or the refusal. The job stays the
 * caller's. */
int hkl_swap_job(hk_runtime *rt, hkl_job *job, hk_report *rep);

#endif /* HK_LOADER_SWAP_H */

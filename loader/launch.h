/*
 * loader/launch.h: kernel handles, launches and pins (launch.c).
 */
#ifndef HK_LOADER_LAUNCH_H
#define HK_LOADER_LAUNCH_H

#include "loader/core.h"

/* Room for one more handle in m's list (swap_lock held): 0 or HK_ERR_NOMEM. */
int hkl_kernels_reserve(hkl_module *m);
/* Applies the attributes set through k to its kernel in v (swap_lock held,
 * gate closed): 0 or the driver's refusal, rep saying which. */
int hkl_apply_attrs(hk_runtime *rt, hkl_version *v, const hk_kernel *k, hk_report *rep);
/* Drops a pin of v (a graph's, a capture's), waking the reclaim thread. */
void hkl_version_unpin(hk_runtime *rt, hkl_version *v);
/* The CUfunction of v's slot in the context current on this thread. */
CUresult hkl_function_of(hk_runtime *rt, hkl_version *v, int slot, CUfunction *f);
/* Drops one reference of the runtime's hkl_rtref (its own, or a captured
 * launch's pin's), freeing it with the last. */
void hkl_rtref_put(hkl_rtref *ref);
/* hkl_launch_lc, for the <<<>>> interposition: loader/port.h. */

#endif /* HK_LOADER_LAUNCH_H */

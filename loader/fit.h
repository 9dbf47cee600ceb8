/*
 * What a version of a program's kernel must fit (fit.c): the launch
 * configurations the program has used (hkl_use, loader/port.h, raised by
 * the <<<>>> interposition's launches) with the attributes the program set,
 * checked by the swap's validation.
 */
#ifndef HK_LOADER_FIT_H
#define HK_LOADER_FIT_H

#include "loader/core.h"

/* fit.c: whether v's kernel of handle k (a program's kernel: k->expect set)
 * can take every launch configuration the program has used for it, with the
 * attributes applied: block size against the function's limit for its
 * registers, dynamic shared memory against its limit, cluster dimensions,
 * the largest cooperative grid against co-residency. 0, or HK_ERR_ATTRIBUTE
 * with the kernel, the configuration and the limit in rep. swap_lock held,
 * gate closed, device 0's context current. */
int hkl_fit_check(hk_runtime *rt, hkl_version *v, const hk_kernel *k, hk_report *rep);

#endif /* HK_LOADER_FIT_H */

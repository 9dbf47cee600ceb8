/*
 * loader/reset.h: recovery from a context reset (reset.c, see there).
 */
#ifndef HK_LOADER_RESET_H
#define HK_LOADER_RESET_H

#include "loader/core.h"

/* The part rt->reset. */
int hkl_reset_init(hk_runtime *rt);
void hkl_reset_finish(hk_runtime *rt);
int hkl_check_reset(hk_runtime *rt); /* swap_lock held; 1 if a reset was handled */
void hkl_emit_reset(hk_runtime *rt); /* no lock held */

#endif /* HK_LOADER_RESET_H */

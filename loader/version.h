/*
 * loader/version.h: version operations (version.c).
 */
#ifndef HK_LOADER_VERSION_H
#define HK_LOADER_VERSION_H

#include "loader/core.h"

/* version.c: version operations (see the top of version.c).
 * - hkl_module_find: m named name, or NULL (swap_lock).
 * - hkl_version_new: an empty version number of m in the current context
 *   generation (NULL without memory); hkl_version_free frees it and what it
 *   holds (unloaded first).
 * - hkl_load_version / hkl_upload_version: the driver loads v's image, and
 *   uploads its code into every context (launch gate closed). 0 or the
 *   error, rep saying why.
 * - hkl_unload_version: CUDA_SUCCESS when v's code is gone (or went with a
 *   reset context), else the error of an unload worth trying again.
 * - hkl_resolve_slot: finds k's kernel in v and fills its slot (and,
 *   library loader, the slot's CUfunction in every context). swap_lock
 *   held and the launch gate closed.
 * - hkl_carry_globals: copies every global of old that nv has with the
 *   same size into nv (gate closed); a size change is noted in rep.
 * - hkl_retire: hands v (replaced, or never published) to the reclaim
 *   thread; hkl_reclaim_kick wakes it (a pin went, a reset is suspected). */
hkl_module *hkl_module_find(hk_runtime *rt, const char *name);
hkl_version *hkl_version_new(hk_runtime *rt, hkl_module *m, uint64_t number);
void hkl_version_free(hkl_version *v);
const char *hkl_entry_name(const hkl_version *v, const char *name);
int hkl_load_version(hk_runtime *rt, hkl_version *v, hk_report *rep);
int hkl_upload_version(hk_runtime *rt, hkl_version *v, hk_report *rep);
CUresult hkl_unload_version(hk_runtime *rt, hkl_version *v);
int hkl_resolve_slot(hk_runtime *rt, hkl_version *v, hk_kernel *k, hk_report *rep);
int hkl_read_layout(hk_runtime *rt, hkl_version *v, const hk_kernel *k, hkl_param_layout *out);
void hkl_layout_free(hkl_param_layout *l);
/* Describes how two layouts differ into buf ("had 2 parameters, now 3"), or
 * returns 0 when they are equal. */
int hkl_layout_diff(const hkl_param_layout *a, const hkl_param_layout *b, char *buf, size_t n);
int hkl_carry_globals(hk_runtime *rt, hkl_version *old, hkl_version *nv, hk_report *rep);
void hkl_image_clear(hkl_image *im); /* frees what it holds and zeroes it */
void hkl_retire(hk_runtime *rt, hkl_version *v);
void hkl_reclaim_kick(hk_runtime *rt);

#endif /* HK_LOADER_VERSION_H */

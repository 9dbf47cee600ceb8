/*
 * loader/source.h: the engine's side of the sources' hooks (source.c);
 * struct hkl_source and hkl_source_get, which the sources use, are in
 * loader/port.h.
 */
#ifndef HK_LOADER_SOURCE_H
#define HK_LOADER_SOURCE_H

#include "loader/core.h"

/* The part rt->src. */
int hkl_sources_init(hk_runtime *rt);
void hkl_sources_finish(hk_runtime *rt);
/* hkl_source_attach attaches src (owned by the caller, which keeps it valid
 * until it is detached or released). Returns 0, HK_ERR_INVALID, or
 * HK_ERR_BUSY when a source of the same kind is attached already.
 *
 * hkl_source_detach detaches src (a no-op when it is not attached). When it
 * returns, no hook of src is running or will run, and src is the caller's
 * again; its release hook is not called. Neither from a hook. */
int hkl_source_attach(hk_runtime *rt, hkl_source *src);
void hkl_source_detach(hk_runtime *rt, hkl_source *src);
/* Calls deps_built of every attached source (worker thread, no lock held). */
void hkl_sources_deps_built(hk_runtime *rt, const char *source_name, const char *const *deps,
                            int n);
/* Detaches every source and calls each one's release hook (destroy, no
 * lock held). */
void hkl_sources_release(hk_runtime *rt);

#endif /* HK_LOADER_SOURCE_H */

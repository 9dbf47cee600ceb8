/*
 * loader/canary.h: the canary step between build and stage, and the
 * helpers' paths (loader/canary.c; the canary itself is canary/).
 */
#ifndef HK_LOADER_CANARY_H
#define HK_LOADER_CANARY_H

#include "loader/core.h"
#include "loader/job.h"

/* canary.c: the canary between build and stage. hkl_canary_start makes
 * rt->canary at create (starting the helper when options.canary is set);
 * hkl_canary_check runs a built job's test launches as its policy says, on
 * the building thread with no lock held (it takes swap_lock only to pin the
 * running version, which the run then reads in place), and returns 0 or the
 * refusal. */
int hkl_canary_start(hk_runtime *rt, hk_report *rep);
int hkl_canary_check(hk_runtime *rt, hkl_job *j, hk_report *rep);
/* 1 when j's version will run canary tests (its policy runs them, the runtime
 * has a canary, its module has tests): its build then makes the trap
 * guard's copy (ptx/guard.c) for them. */
int hkl_canary_wanted(hk_runtime *rt, const hkl_job *j);
/* hkl_build_start starts rt->iso, the build helper, when
 * options.build_isolated is set (0, or HK_ERR_IO with the report saying
 * why); hkl_helper_path resolves a helper executable: opt when set, else
 * $env, else ../libexec/hotkern/name or ../bin/name from the object holding
 * libhotkern, else LIBEXECDIR/hotkern/name (malloc'd, NULL without memory). */
int hkl_build_start(hk_runtime *rt, hk_report *rep);
char *hkl_helper_path(const char *opt, const char *env, const char *name);

#endif /* HK_LOADER_CANARY_H */

/*
 * What the ptx suite's parts share (tests/cpu_ptx.c assembles them): the
 * images made at test time (NVRTC, and nvcc for fatbins), lookups in their
 * metadata, the build options every build starts from, and the files and
 * directories a cache test reads.
 */
#ifndef HK_TESTS_PTX_FIXTURE_H
#define HK_TESTS_PTX_FIXTURE_H

#include <dirent.h>
#include <elf.h>
#include <nvrtc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "ptx/ptx.h"
#include "tests/canary_kernels.h"
#include "tests/harness.h"

extern const char *const KERNELS_CU;

/* ---- helpers -------------------------------------------------------------- */

/* Compiles CUDA C with NVRTC directly (independent of the code under test):
 * "sm_XY" gives a cubin, "compute_XY" PTX. Returns a malloc'd image. */
void *nvrtc_image(const char *src, const char *arch, size_t *size);

void *read_whole(const char *path, size_t *size);

const hkp_entry *find_entry(const hkp_meta *m, const char *name);

const hkp_global *find_global(const hkp_meta *m, const char *name);

hkp_build_opts base_opts(int arch);

/* Sizes in bytes of the regular files in dir, summed; counts entries and
 * leftover temporary files. */
uint64_t dir_bytes(const char *dir, int *entries, int *tmps);

/* A kernel storing `value`, with K from "common.cuh". */
extern const char *const USES_COMMON;

/* Builds src to PTX and returns 1 when the PTX stores the constant `value`. */
int ptx_has_constant(const char *src, hkp_build_opts o, long value, hkp_artifact *keep);

/* Each part adds its tests to the suite's test case (tests/cpu_ptx.c). */
void ptx_detect_tests(TCase *tc);
void ptx_meta_tests(TCase *tc);
void ptx_build_tests(TCase *tc);
void ptx_guard_tests(TCase *tc);
void ptx_cache_tests(TCase *tc);
void ptx_cache_share_tests(TCase *tc);
void ptx_cache_lock_tests(TCase *tc);
void ptx_headers_tests(TCase *tc);

#endif

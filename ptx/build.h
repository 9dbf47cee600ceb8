/*
 * ptx/build.h: what the files of a build share, and they only (hkp_build,
 * ptx/ptx.h, is the way in for everything else).
 *
 *   build.c   the build: formats, the cache's lookups and stores, the
 *             compile in this process or the build helper, the checks of
 *             what came out;
 *   deps.c    the include search, the dependencies a compile reads, and the
 *             compile cache's keys and entries;
 *   nvrtc.c   NVRTC: its command line, the precompiled header, the
 *             development profile's fast compiles;
 *   link.c    nvJitLink: PTX to a cubin, its options, the trap guard's copy.
 *
 * build.c uses the other three, deps.c uses link.c's options (they are in
 * the key), nvrtc.c uses deps.c's search; never the other way round.
 * Nothing here holds a lock but nvrtc.c's pch_lock (its own).
 */
#ifndef HK_PTX_BUILD_H
#define HK_PTX_BUILD_H

#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/ptx.h"

/* Headers a build read and the paths its include search found empty
 * (hkp_deps, ptx/ptx.h). */
typedef hkp_deps dep_list;

typedef struct search_path {
    const char **dirs; /* -I directories, in order, then the toolkit's */
    int n;
    const char **pre; /* --pre-include headers */
    int npre;
    const hk_header *mem; /* in-memory headers (NUL-terminated copies) */
    int nmem;
    const hkp_toolkit *tk; /* its headers are not listed as dependencies */
    char srcdir[PATH_MAX]; /* the main source's directory */
} search_path;

/* nvJitLink's options for a link of o's PTX: the arch, the optimisation
 * level (or the development profile's -Ofc=max), and what the caller's
 * NVRTC options ask of ptxas, translated (--maxrregcount, --ptxas-options
 * or -Xptxas, -G, -lineinfo, a fast-compile level of their own), so that a
 * cubin linked from NVRTC's PTX is built as NVRTC would build it. The
 * strings point into o's options and the struct's own buffers. Options
 * that reach ptxas in a way nvJitLink cannot be told (relocatable or
 * link-time code, device optimisation levels: hkp_unlinkable_option) are left
 * out, as they always were from these links. */
#define MAX_LINK_OPTS 16
typedef struct link_opts {
    const char *argv[MAX_LINK_OPTS];
    int argc;
    char arch[32], opt[16], more[8][96];
    int nmore;
    int translated; /* options of nvrtc_options among argv */
} link_opts;

/* ---- deps.c: the include search and the dependencies --------------------- */

/* Reads -I / --include-path / --pre-include / -include from the options,
 * and adds the toolkit's directories and the in-memory headers (mem, which
 * sp points into); the source's directory is each build's (srcdir is left
 * empty). hkp_search_path_free frees what it allocated, not mem. */
int hkp_parse_search_path(const hkp_build_opts *o, const hk_header *mem, int nmem, search_path *sp);
void hkp_search_path_free(search_path *sp);
/* The directory NVRTC resolves the main file's quoted includes against. */
void hkp_source_dir(const char *source_name, char *buf, size_t n);
/* The index of the in-memory header called name, or HK_ERR_NOT_FOUND. */
int hkp_find_mem(const search_path *sp, const char *name);
/* Resolves an include the way NVRTC does: 1 with the canonical path in
 * out, 2 with the index of an in-memory header in *mem, 0 when nothing is
 * found, or a negative error. Every place looked at before is noted in d
 * (may be NULL) as absent. */
int hkp_resolve_include(const char *name, int quoted, const char *dir, const search_path *sp,
                        char out[PATH_MAX], int *mem, dep_list *d);
/* The headers src (a C string) and the pre-included ones read, into d. */
int hkp_scan_deps(const char *src, const search_path *sp, dep_list *d);
/* 1 when every header of d still has its hash and the search would still
 * find the same files. */
int hkp_deps_unchanged(const dep_list *d);

/* ---- deps.c: the compile cache's keys and entries ------------------------ */

/* The key's context: everything known before compiling that changes the
 * output (kind names the use). */
void hkp_key_context(crypto_generichash_state *st, const char *kind, const void *data, size_t size,
                     hk_format fmt, const hkp_build_opts *o, const char *source_name,
                     const search_path *sp);
/* The manifest's key, from the context alone. */
void hkp_manifest_key(const crypto_generichash_state *ctx, uint8_t key[HKP_KEY_BYTES]);
/* The artifact's key: the context and the headers' current hashes. */
void hkp_artifact_key(const crypto_generichash_state *ctx, const dep_list *d,
                      uint8_t key[HKP_KEY_BYTES]);
/* The cache's entries under key (ptx/entry.c's formats). A load that finds
 * nothing or anything inconsistent returns HK_ERR_NOT_FOUND; the manifest's
 * load also misses when the search would now find another file, and hashes
 * its headers again into d. */
int hkp_artifact_store(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const hkp_artifact *a);
int hkp_artifact_load(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], hkp_artifact *a);
int hkp_manifest_store(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const dep_list *d);
int hkp_manifest_load(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const search_path *sp,
                      dep_list *d);

/* ---- nvrtc.c ------------------------------------------------------------- */

/* CUDA C (src, a C string) to a cubin (want_cubin) or PTX for o->arch with
 * the options of the build's profile, into a (image, lowered names, log);
 * why gets the one-line reason of a failure. */
int hkp_nvrtc_build(const char *src, const hkp_build_opts *o, const search_path *sp,
                    const char *source_name, int want_cubin, hkp_artifact *a, char *why,
                    size_t why_size);

/* ---- link.c -------------------------------------------------------------- */

/* The first of o's NVRTC options that hkp_link_opts_make cannot give
 * nvJitLink (NULL: none). */
const char *hkp_unlinkable_option(const hkp_build_opts *o);
void hkp_link_opts_make(link_opts *l, int arch, const hkp_build_opts *o);
/* PTX (size bytes, NUL-terminated or not) to a cubin for arch (which may
 * carry HKP_ARCH_SPECIFIC) with o's link options; replaces a->image, the
 * log going to a->log. */
int hkp_jitlink_ptx(const void *ptx, size_t size, int arch, const hkp_build_opts *o,
                    const char *name, hkp_artifact *a, char *why, size_t why_size);
/* Says in a's log why its trap guard's copy was not made. */
int hkp_guard_note(hkp_artifact *a, const char *why);
/* The trap guard's copy of a build, made from the image's PTX (see link.c);
 * fails only when memory runs out. */
int hkp_guard_build(const char *ptx, size_t n, const hkp_build_opts *o, int to_cubin, int link_arch,
                    const char *name, hkp_artifact *a);

/* ---- logs ---------------------------------------------------------------- */

/* Appends text to a malloc'd log (NULL-safe both ways). */
static inline int log_append(char **log, const char *text) {
    if (!text || !text[0])
        return 0;
    size_t old = *log ? strlen(*log) : 0, add = strlen(text);
    char *n = realloc(*log, old + add + 2);
    if (!n)
        return HK_ERR_NOMEM;
    if (old && n[old - 1] != '\n')
        n[old++] = '\n';
    memcpy(n + old, text, add + 1);
    *log = n;
    return 0;
}

/* The first line of a log that mentions an error, for the one-line reason. */
static inline void first_error_line(const char *log, char *buf, size_t n) {
    if (!buf || !n)
        return;
    buf[0] = '\0';
    if (!log)
        return;
    const char *hit = strstr(log, "error");
    if (!hit)
        hit = log;
    const char *start = hit;
    while (start > log && start[-1] != '\n')
        start--;
    size_t len = strcspn(start, "\n");
    snprintf(buf, n, "%.*s", (int)len, start);
}

#endif /* HK_PTX_BUILD_H */

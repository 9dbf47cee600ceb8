/*
 * ptx/: from any kernel source to a loadable image, without a GPU.
 *
 * Private to libhotkern (prefix hkp_). Nothing here calls the CUDA driver:
 * NVRTC and nvJitLink run on the CPU, so every function is usable and tested
 * on machines without a device. All functions are thread-safe (no globals
 * besides the cache, which locks itself); NVRTC and nvJitLink are called from
 * the caller's thread, normally the runtime's worker.
 */
#ifndef HK_PTX_H
#define HK_PTX_H

#include <stddef.h>
#include <stdint.h>

#include "hotkern/hotkern.h"

/* ---- format detection --------------------------------------------------- */

/* Detects the format from content alone. Returns 0 and sets *fmt, or
 * HK_ERR_FORMAT with a reason in why ("empty input", "ELF but not a CUDA
 * cubin (e_machine 62)", "truncated ELF header" ...). */
int hkp_detect(const void *data, size_t size, hk_format *fmt, char *why, size_t why_size);

/* ---- metadata ----------------------------------------------------------- */

typedef struct hkp_param {
    uint32_t offset, size;
} hkp_param;

typedef struct hkp_entry {
    char *name;        /* entry (kernel) name as the driver knows it */
    int nparams;
    hkp_param *params; /* in order */
} hkp_entry;

typedef struct hkp_global {
    char *name;
    uint64_t size;
    int is_const; /* __constant__ */
} hkp_global;

typedef struct hkp_meta {
    hk_format format;
    int arch;         /* PTX .target sm_XY or cubin arch, e.g. 90; 0 unknown */
    int narchs;       /* fatbin: SASS architectures inside */
    int archs[16];
    int ptx_archs[16]; /* fatbin: PTX (virtual) architectures inside */
    int nptx_archs;
    int nentries;
    hkp_entry *entries;
    int nglobals;
    hkp_global *globals;
} hkp_meta;

/* Reads kernel names, parameter layouts, globals and architectures from PTX
 * or a cubin (fatbin: architectures only). The parsers are hand-written and
 * fuzzed; any malformed input gives HK_ERR_FORMAT with a reason, never a crash.
 * On success *out is owned by the caller: hkp_meta_free(). */
int hkp_meta_read(const void *data, size_t size, hk_format fmt, hkp_meta *out, char *why,
                  size_t why_size);
void hkp_meta_free(hkp_meta *m);

/* 1 if an image built for `image_arch` runs on a device of `device_arch`
 * (same major, image minor <= device minor; sm_90a only on 90). */
int hkp_arch_runs_on(int image_arch, int device_arch);

/* ---- compile cache ------------------------------------------------------ */

typedef struct hkp_cache hkp_cache;

/* Opens (creating) a content-addressed cache in dir, bounded to max_bytes
 * with least-recently-used eviction. Several processes may share dir. */
int hkp_cache_open(hkp_cache **out, const char *dir, uint64_t max_bytes);
void hkp_cache_close(hkp_cache *c);
void hkp_cache_stats(hkp_cache *c, uint64_t *hits, uint64_t *misses, uint64_t *bytes);

/* ---- building ----------------------------------------------------------- */

typedef struct hkp_build_opts {
    int arch;                  /* target SM, e.g. 90 */
    int ptx_to_cubin;          /* 1: PTX (given or from NVRTC) -> cubin with
                                * nvJitLink; 0: leave PTX for the driver */
    int opt_level;             /* nvJitLink -O, 0..4 */
    const char *const *nvrtc_options;
    int nnvrtc_options;
    const char *const *name_expressions;
    int nname_expressions;
    const char *source_name;   /* used in compiler messages */
    hkp_cache *cache;          /* NULL: no cache */
} hkp_build_opts;

typedef struct hkp_artifact {
    void *image;               /* malloc'd loadable image */
    size_t size;
    hk_format format;          /* PTX, CUBIN or FATBIN */
    char *log;                 /* compiler/linker log (may be NULL) */
    char **deps;               /* headers the NVRTC compile read (paths) */
    int ndeps;
    char **lowered_names;      /* parallel to name_expressions */
    int nlowered;
    int cache_hit;
    double ms;                 /* wall time of the build */
    hkp_meta meta;             /* metadata of image */
} hkp_artifact;

/* Turns input of any format into a loadable image for opts->arch:
 * CUDA C -> NVRTC (-> cubin, or PTX when !ptx_to_cubin); PTX -> nvJitLink cubin
 * (or unchanged); cubin/fatbin -> checked for the arch and passed through.
 * fmt may be HK_FORMAT_AUTO. Returns 0, or HK_ERR_FORMAT / HK_ERR_COMPILE /
 * HK_ERR_ARCH with out->log and why set. On any return *out must be released
 * with hkp_artifact_free(). */
int hkp_build(const void *data, size_t size, hk_format fmt, const hkp_build_opts *opts,
              hkp_artifact *out, char *why, size_t why_size);
void hkp_artifact_free(hkp_artifact *a);

#endif /* HK_PTX_H */

/*
 * ptx/: from any kernel source to a loadable image, without a GPU.
 *
 * Private to libhotkern (prefix hkp_). Nothing here calls the CUDA driver:
 * NVRTC and nvJitLink run on the CPU, so every function is usable and tested
 * on machines without a device. All functions are thread-safe (no globals
 * besides the cache, which locks itself); NVRTC and nvJitLink are called from
 * the caller's thread, normally the runtime's worker, or, with build
 * isolation, in the hotkern-build helper process (isolate.c, helper.c).
 */
#ifndef HK_PTX_H
#define HK_PTX_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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
    char *name; /* entry (kernel) name as the driver knows it */
    int nparams;
    hkp_param *params; /* in order */
} hkp_entry;

typedef struct hkp_global {
    char *name;
    uint64_t size;
    int is_const; /* __constant__ */
} hkp_global;

/* Architectures are ints: major * 10 + minor (90 for sm_90), with flag bits
 * above HKP_ARCH_NUM for the suffixed variants. sm_90a is 90 | HKP_ARCH_SPECIFIC
 * and runs on exactly sm_90; sm_100f (a PTX target; family cubins are identical
 * to plain ones) is 100 | HKP_ARCH_FAMILY and runs where sm_100 does. */
#define HKP_ARCH_SPECIFIC 0x10000
#define HKP_ARCH_FAMILY   0x20000
#define HKP_ARCH_NUM(a)   ((a)&0xffff)

/* Writes "sm_90a"-style text for arch into buf (always NUL-terminated) and
 * returns buf; "sm_?" for 0. */
const char *hkp_arch_name(int arch, char *buf, size_t n);

typedef struct hkp_meta {
    hk_format format;
    int arch;   /* PTX .target sm_XY or cubin arch, e.g. 90; 0 unknown.
                 * May carry HKP_ARCH_SPECIFIC / HKP_ARCH_FAMILY. */
    int narchs; /* fatbin: SASS architectures inside */
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
/* The kernels of a fatbin (hkp_meta_read lists its architectures only):
 * the entries of each member stored uncompressed, cubin or PTX, merged by
 * name in the order met (the first member's layout kept). nvcc compresses
 * PTX members, and cubins with -compress-all: a member that cannot be read
 * is counted in *unread (may be NULL), not refused. out->entries only; free
 * with hkp_meta_free. 0, or HK_ERR_FORMAT for a malformed container,
 * HK_ERR_NOMEM. */
int hkp_fatbin_kernels(const void *data, size_t size, hkp_meta *out, int *unread);
/* Fills out with a deep copy of m (its arrays and strings its own; free
 * with hkp_meta_free). 0, or HK_ERR_NOMEM, with out freed. */
int hkp_meta_dup(const hkp_meta *m, hkp_meta *out);
void hkp_meta_free(hkp_meta *m);

/* 1 if an image built for `image_arch` runs on a device of `device_arch`
 * (same major, image minor <= device minor; sm_90a only on 90). device_arch's
 * flag bits are ignored. */
int hkp_arch_runs_on(int image_arch, int device_arch);

/* 1 if the image described by m has code a device of `device_arch` can run:
 * a cubin by hkp_arch_runs_on; PTX (alone or inside a fatbin) when its target
 * is not newer than the device, since the driver JIT compiles it forward; a
 * fatbin when any of its cubins or PTX does. */
int hkp_meta_runs_on(const hkp_meta *m, int device_arch);

/* ---- compile cache ------------------------------------------------------ */

typedef struct hkp_cache hkp_cache;
typedef struct hkp_iso hkp_iso;       /* a build helper process (isolate.c) */
typedef struct hkp_search hkp_search; /* a prepared include search (build.c) */

/* Opens (creating) a content-addressed cache in dir, bounded to max_bytes
 * (0: HKP_CACHE_DEFAULT_BYTES) with least-recently-used eviction. Several
 * processes of one user may share dir; one hkp_cache may be used from
 * several threads. dir is checked like every directory hotkern trusts
 * (util/util.h, "trusted directories"): one another user could change is
 * refused (HK_ERR_IO, rep saying which path and why; rep may be NULL). On
 * success *out is owned by the caller: hkp_cache_close(). */
#define HKP_CACHE_DEFAULT_BYTES (UINT64_C(256) << 20)
int hkp_cache_open(hkp_cache **out, const char *dir, uint64_t max_bytes, hk_report *rep);
void hkp_cache_close(hkp_cache *c);
/* Builds served from the cache, builds that were not, and the bytes the
 * directory's entries hold now (a directory scan). Any pointer may be NULL. */
void hkp_cache_stats(hkp_cache *c, uint64_t *hits, uint64_t *misses, uint64_t *bytes);

/* Writes the default cache directory into buf: $XDG_CACHE_HOME/hotkern when
 * that is an absolute path, else $HOME/.cache/hotkern. Returns 0,
 * HK_ERR_NOT_FOUND when neither variable helps, HK_ERR_INVALID when buf is too
 * small. */
int hkp_cache_default_dir(char *buf, size_t n);

/* Raw entries, keyed by a BLAKE2b-256 digest (hkp_build computes the keys).
 * get: 0 and a malloc'd copy of the payload in *data (caller frees), or
 * HK_ERR_NOT_FOUND when absent, truncated, corrupt, written for another
 * key, or not a regular file of this user that nobody else can write (a bad
 * entry is removed). A hit marks the entry as recently used. put: under the
 * directory's lock, waited for at most HKP_CACHE_LOCK_MS: written
 * atomically (temporary file, rename; not synced), then the oldest entries
 * are evicted until the directory is within max_bytes; HK_ERR_BUSY when the
 * lock stays held (another process stopped while holding it), and then
 * nothing is written. An entry larger than max_bytes is not
 * kept. The handle also keeps the entries it read or wrote last in memory
 * (HKP_CACHE_MEM_ENTRIES, at most an eighth of max_bytes): a get of one of
 * them reads no file (it refreshes the file's LRU time at most once a
 * minute), so it is served even once the file is gone; the same key always
 * names the same payload, except manifests, whose put replaces the copy in
 * memory too. */
#define HKP_CACHE_MEM_ENTRIES 32
#define HKP_KEY_BYTES         32
#define HKP_CACHE_LOCK_MS     250
int hkp_cache_get(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], void **data, size_t *size);
int hkp_cache_put(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const void *data, size_t size);
/* Counts one build as a hit (1) or a miss (0) for hkp_cache_stats. */
void hkp_cache_note(hkp_cache *c, int hit);
/* The directory the cache was opened on (immutable). */
const char *hkp_cache_dir(const hkp_cache *c);

/* ---- the cache's file formats (entry.c; parsing fuzzed) ----------------- */

/* An entry file: HKP_ENTRY_HEADER bytes (magic, length, key, a tag of the
 * payload keyed with the key), then the payload. hkp_entry_check: 0 when
 * file (n bytes) is a whole entry of key, else HK_ERR_FORMAT. */
#define HKP_ENTRY_HEADER (8 + 8 + 2 * HKP_KEY_BYTES)
void hkp_entry_header(const uint8_t key[HKP_KEY_BYTES], const void *payload, size_t n,
                      unsigned char hdr[HKP_ENTRY_HEADER]);
int hkp_entry_check(const uint8_t key[HKP_KEY_BYTES], const unsigned char *file, size_t n);

/* What a CUDA C build read: header files by canonical path and in-memory
 * headers (mem[i] set) by name, with their content hashes; and every path
 * the include search tried and found no file at (probes), since a file
 * appearing there would be read instead. incomplete: the scan stopped at a
 * bound, so the list cannot vouch for the build (it is not cached). */
#define HKP_MAX_DEPS   4096
#define HKP_MAX_PROBES 65536
typedef struct hkp_deps {
    char **paths;
    uint8_t (*hash)[HKP_KEY_BYTES];
    unsigned char *mem;
    int n, cap;
    char **probes;
    int nprobes, capprobes;
    int incomplete;
} hkp_deps;
int hkp_deps_add(hkp_deps *d, const char *path, const uint8_t hash[HKP_KEY_BYTES], int mem);
int hkp_deps_add_probe(hkp_deps *d, const char *path);
void hkp_deps_sort_probes(hkp_deps *d); /* sorted, duplicates dropped */
void hkp_deps_free(hkp_deps *d);

struct hkp_artifact; /* below */

/* Payloads. format: *out malloc'd (*n bytes), or HK_ERR_NOMEM. parse: 0, or
 * HK_ERR_FORMAT (anything malformed, truncated or left over) or
 * HK_ERR_NOMEM, and then nothing is left to free. An artifact fills image,
 * format, lowered names, deps and log (hkp_artifact_free); a manifest the
 * deps with the hashes they were built with (hkp_deps_free). */
int hkp_artifact_format(const struct hkp_artifact *a, void **out, size_t *n);
int hkp_artifact_parse(const void *data, size_t n, struct hkp_artifact *a);
int hkp_manifest_format(const hkp_deps *d, void **out, size_t *n);
int hkp_manifest_parse(const void *data, size_t n, hkp_deps *d);

/* ---- building ----------------------------------------------------------- */

typedef struct hkp_build_opts {
    int arch;         /* target SM, e.g. 90 (| HKP_ARCH_SPECIFIC: sm_90a) */
    int ptx_to_cubin; /* 1: PTX (given or from NVRTC) -> cubin with
                       * nvJitLink; 0: leave PTX for the driver */
    int opt_level;    /* 0..4; nvJitLink takes only -O0 and -O3, so 0 is
                       * -O0 and 1..4 are -O3 (NVRTC cubins: ptxas too) */
    const char *const *nvrtc_options;
    int nnvrtc_options;
    const char *const *name_expressions;
    int nname_expressions;
    const char *source_name;  /* used in compiler messages */
    hkp_cache *cache;         /* NULL: no cache */
    int nvrtc_via_ptx;        /* CUDA C with ptx_to_cubin: 1 compiles to PTX
                               * and links with nvJitLink; 0 (default) asks
                               * NVRTC for the cubin directly (as fast,
                               * one step fewer) */
    const hk_header *headers; /* in-memory headers, found by name before any
                               * file (hk_header in hotkern.h) */
    int nheaders;
    const hk_header *base_headers; /* a second set (the runtime's), searched
                                    * after headers: a name in headers hides
                                    * the same name here */
    int nbase_headers;
    int no_toolkit;           /* 1: leave the toolkit's include directories off the
                               * search path (default: on, after any -I) */
    int pch;                  /* 1: NVRTC's automatic precompiled headers, over the
                               * toolkit headers that open the source; for processes
                               * that compile more than once */
    hkp_iso *iso;             /* non-NULL: NVRTC and nvJitLink run in this helper
                               * process (isolate.c); detection, the include scan,
                               * the metadata and the cache stay in this process */
    int fast_compile;         /* 1: the development profile (HK_BUILD_PROFILE_DEV):
                               * NVRTC -Ofc=max instead of ptxas -O<opt_level>, and
                               * nvJitLink -Ofc=max; part of the cache key. Leaves
                               * the front end's options, and so the PCH, as they
                               * are (nvrtc.c, "fast compiles") */
    const hkp_search *search; /* non-NULL: the in-memory headers and the
                               * include search path, prepared once for
                               * many builds (hkp_search_create), instead
                               * of for this build from headers,
                               * base_headers, nvrtc_options and
                               * no_toolkit, which must be those it was
                               * made from */
    int trap_guard;           /* 1: also make the canary's trap-guarded copy
                               * (hkp_artifact.guard) of CUDA C and PTX;
                               * part of the cache key */
    const char *target_name;  /* what an architecture refusal calls arch:
                               * NULL "device" (a runtime's builds),
                               * "target" (a check's: no device) */
} hkp_build_opts;

typedef struct hkp_artifact {
    void *image; /* malloc'd loadable image; PTX is
                  * NUL-terminated and size counts the NUL */
    size_t size;
    hk_format format; /* PTX, CUBIN or FATBIN */
    char *log;        /* compiler/linker log (may be NULL) */
    char **deps;      /* headers of CUDA C input (canonical paths; an
                       * in-memory header under its name), found by
                       * following #include lines through the in-memory
                       * headers, the source's directory and -I dirs (NVRTC
                       * 13 cannot list them); a superset, since #if is not
                       * evaluated. The toolkit's headers are not listed. */
    int ndeps;
    char **lowered_names; /* parallel to name_expressions */
    int nlowered;
    int cache_hit;
    char cache_note[200]; /* why the cache was not used for this build (its
                           * lock is held elsewhere, ...); "" when it was or
                           * when there is none. The build itself succeeded. */
    double ms;            /* wall time of the build */
    hkp_meta meta;        /* metadata of image */
    void *guard;          /* with hkp_build_opts.trap_guard: the image's copy
                           * whose traps, breakpoints and asserts are caught
                           * (guard.c), in image's format; NULL when there
                           * is nothing to guard (or it could not be made:
                           * log says why) */
    size_t guard_size;
    int guard_sites; /* what guard caught in the PTX */
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

/* The part of a CUDA C build's set-up that depends on its options alone:
 * the in-memory headers (headers, then the base_headers they do not hide)
 * copied and merged, the -I and --pre-include lists read from
 * nvrtc_options, the toolkit's directories. hkp_build makes it for each
 * build; a caller that builds many sources with the same options makes it
 * once and passes it in hkp_build_opts.search. It points into o's
 * nvrtc_options strings, which must outlive it. Immutable: builds on
 * several threads may share it. Returns 0 with *out (the caller's:
 * hkp_search_free), HK_ERR_INVALID (bad options, a header without a name,
 * with why) or HK_ERR_NOMEM. */
int hkp_search_create(const hkp_build_opts *o, hkp_search **out, char *why, size_t why_size);
void hkp_search_free(hkp_search *s); /* s may be NULL */

/* Process-wide PCH counters: PCHs NVRTC created for hkp_build, and PCH heap
 * enlargements after NVRTC reported it exhausted. Any pointer may be NULL. */
void hkp_pch_stats(uint64_t *created, uint64_t *heap_resizes);

/* ---- the canary's trap guard (guard.c) ----------------------------------- */

/* The global a guarded copy stores into, and what it stores: site << 2 |
 * kind, the site numbered from 1 in the PTX's text order. */
#define HKP_GUARD_SYMBOL "__hotkern_trap"
enum hkp_guard_kind { HKP_GUARD_TRAP = 1, HKP_GUARD_BRKPT = 2, HKP_GUARD_ASSERT = 3 };
#define HKP_GUARD_KIND(code) ((code)&3u)
#define HKP_GUARD_SITE(code) ((code) >> 2)

/* A copy of ptx (n bytes; NUL-terminated or not) in which every trap,
 * brkpt and call of __assertfail stores its code into HKP_GUARD_SYMBOL and
 * ends its thread (guard.c says why). Returns 0 with *out (malloc'd,
 * NUL-terminated, *out_n counting the NUL) and *sites > 0; 0 with *out NULL
 * and *sites 0 when there is nothing to guard; HK_ERR_FORMAT (why says why:
 * the copy would not be sound) or HK_ERR_NOMEM, *out NULL. */
int hkp_guard_ptx(const char *ptx, size_t n, char **out, size_t *out_n, int *sites, char *why,
                  size_t why_size);
/* What a kind is, for reports: "a trap instruction (__trap() ...)". */
const char *hkp_guard_kind_text(unsigned kind);

/* ---- build isolation (isolate.c, helper.c) ------------------------------ */

/*
 * A build helper: `hotkern-build`, a long-lived child process in which
 * hkp_build's compile steps run (NVRTC for CUDA C, nvJitLink for PTX), so
 * that NVRTC never changes this process's signal dispositions and a compiler
 * that crashes or hangs costs one refused build, never the process. Set
 * hkp_build_opts.iso; hkp_build then does everything else here (format
 * detection, cubin/fatbin checks, the include scan, the compile cache, the
 * metadata of the returned image, which is parsed as untrusted input) and
 * sends the helper only what a compile needs.
 *
 * Protocol (util/wire.c framing, magic HKP_ISO_MAGIC), one request and one
 * reply at a time over a socketpair:
 *   helper -> READY {u32 protocol}           once, after it started
 *   BUILD {u32 format, u32 arch, u32 ptx_to_cubin, u32 opt_level,
 *          u32 nvrtc_via_ptx, u32 no_toolkit, u32 pch, u32 fast_compile,
 *          u32 trap_guard, str cwd,
 *          str source_name, u32 noptions, str * n, u32 nexpr, str * n,
 *          u32 nheaders, {str name, u64 size, bytes} * n, u64 size, bytes}
 *     -> BUILT {u32 rc (negated HK_ERR_*), str why, str log, u32 format,
 *               u32 nlowered, str * n, u64 size, bytes image,
 *               u32 guard sites, u64 size, bytes guard}  (none: 0, 0)
 * Both sides bound every count and size before allocating (HKP_ISO_MAX_*)
 * and parse strictly: a byte too many or too few is a malformed message.
 * The helper ends on a malformed request or EOF; the parent kills and
 * restarts a helper that misses its deadline, dies or answers nonsense, and
 * refuses that build with HK_ERR_COMPILE.
 */
#define HKP_ISO_MAGIC     0x444c4248u /* "HBLD" */
#define HKP_ISO_PROTOCOL  3
#define HKP_ISO_MAX_BYTES (256u << 20) /* a source or an image */
#define HKP_ISO_MAX_MSG   (512u << 20) /* a whole request or reply */
#define HKP_ISO_MAX_STR   (64u << 10)  /* an option, a name, a path */
#define HKP_ISO_MAX_LOG   (4u << 20)   /* the compile log */
#define HKP_ISO_MAX_COUNT 4096         /* options, names, headers */
#define HKP_ISO_MAX_WHY   1024
enum { HKP_ISO_READY = 1, HKP_ISO_BUILD = 2, HKP_ISO_BUILT = 3 };

/* Starts the helper at `helper` (a path). timeout_ms bounds each build
 * (<= 0: 120000); warm_arch > 0 has the helper warm NVRTC up for that arch
 * (ptx/warm.c) as soon as it runs. Returns 0; HK_ERR_IO with why when it
 * cannot be started; HK_ERR_NOMEM. *out is the caller's: hkp_iso_destroy. */
int hkp_iso_create(hkp_iso **out, const char *helper, int timeout_ms, int warm_arch, char *why,
                   size_t why_size);
/* Kills the helper and reaps it (and any killed one); iso may be NULL. No
 * build may be running. */
void hkp_iso_destroy(hkp_iso *iso);
/* From any thread, before hkp_iso_destroy: a build waiting on the helper
 * ends at once (refused), and no helper is started again. */
void hkp_iso_cancel(hkp_iso *iso);
/* Called by hkp_build for the compile step: data (fmt CUDA C or PTX) with o
 * and the merged in-memory headers mem. Builds of one helper take turns on
 * its lock, so calls from several threads queue. Fills a's image, format,
 * log and lowered names; returns 0 or the build's error with why. */
int hkp_iso_build(hkp_iso *iso, const void *data, size_t size, hk_format fmt,
                  const hkp_build_opts *o, const hk_header *mem, int nmem, const char *source_name,
                  hkp_artifact *a, char *why, size_t why_size);
/* For tests and stats: the helper's pid (0: none), 1 while a request is
 * with the helper, and the builds it served and the helpers started. */
pid_t hkp_iso_pid(hkp_iso *iso);
int hkp_iso_busy(hkp_iso *iso);
void hkp_iso_counts(hkp_iso *iso, uint64_t *builds, uint64_t *starts);

/* ---- the toolkit ------------------------------------------------------- */

/* The CUDA toolkit whose headers CUDA C builds see: found from the loaded
 * NVRTC library, else $CUDA_HOME, $CUDA_PATH, /usr/local/cuda (toolkit.c).
 * Fields are "" when absent. */
typedef struct hkp_toolkit {
    char include[4096];                 /* canonical path of include/ */
    char cccl[4096];                    /* include/cccl when the toolkit has one */
    char nvrtc[4096];                   /* the libnvrtc in use */
    uint8_t fingerprint[HKP_KEY_BYTES]; /* changes with any toolkit update */
} hkp_toolkit;

/* Located on first use; never NULL, immutable. Safe from any thread. */
const hkp_toolkit *hkp_toolkit_get(void);
/* 1 when the canonical path lies inside one of t's include directories. */
int hkp_toolkit_owns(const hkp_toolkit *t, const char *path);

/* ---- warm start -------------------------------------------------------- */

typedef struct hkp_warm hkp_warm;

/* Makes this process's first in-process compile (an empty kernel for arch,
 * to PTX) on the calling thread, once a process (later calls return at
 * once, or wait for the first): the exit handlers NVRTC and the C++ library
 * register at a first compile then precede the exit guard registered after
 * it (base/exit.h). One NVRTC compile; failures are the first build's. */
void hkp_first_compile(int arch);

/* Starts a thread that compiles two small programs for arch as a swap would
 * (NVRTC, the link, the PCH of a header of the C++ library), so that the
 * start-up is paid before the first real build. Never blocks on the
 * compile. On success
 * *out is owned by the caller: hkp_warm_stop(). */
int hkp_warm_start(hkp_warm **out, int arch);
/* Skips what has not started, waits for a compile in progress, frees w.
 * w may be NULL. */
void hkp_warm_stop(hkp_warm *w);
/* As hkp_warm_stop, waiting for a compile in progress until until_ms
 * (hku_now_ms) only: then the thread is left to end by itself (NVRTC cannot
 * be interrupted) and frees w when it does. */
void hkp_warm_stop_by(hkp_warm *w, double until_ms);
/* 1 once the warm-up compiles have finished, 0 before. */
int hkp_warm_done(hkp_warm *w);

/* Has this process's malloc keep the memory NVRTC frees (mallopt: trim
 * threshold HKP_KEEP_TRIM, mmap threshold HKP_KEEP_MMAP, top pad
 * HKP_KEEP_PAD), so that the next compile reuses it instead of faulting
 * fresh pages in (measured: 2,787 page faults per one-line compile become
 * 1,264; x0.88-0.93 of the compile time). Process-wide and for good; the
 * first call decides, any thread. Returns 1 when done (now or earlier), 0
 * when the environment sets malloc's thresholds itself (GLIBC_TUNABLES'
 * glibc.malloc.*, MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_,
 * MALLOC_TOP_PAD_: the process's own choice, left alone; why says which),
 * HK_ERR_IO when the allocator refused a setting (why says which; the
 * others stay). force (hotkern's own processes, called before their
 * threads start): the environment is not consulted. */
#define HKP_KEEP_TRIM (256 << 20)
#define HKP_KEEP_MMAP (32 << 20)
#define HKP_KEEP_PAD  (64 << 20)
int hkp_keep_heap(int force, char *why, size_t why_size);

/* ---- internal to ptx/ -------------------------------------------------- */

/* The fatbin container's header: NVIDIA's layout, which no public header
 * describes (ptx/meta.c's top comment gives the whole of it). It starts
 * {u32 magic, u16 version, u16 header size, u64 size of what follows}. */
#define HKP_FATBIN_MAGIC     0xBA55ED50u
#define HKP_FATBIN_HEADER    16u /* smallest header size */
#define HKP_FATBIN_HSIZE_OFF 6u  /* u16: this header's size */
#define HKP_FATBIN_FAT_OFF   8u  /* u64: bytes of entries after the header */

/* Little-endian reads from a byte buffer the caller has bounds-checked. */
static inline uint16_t hkp_rd16(const unsigned char *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t hkp_rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t hkp_rd64(const unsigned char *p) {
    return (uint64_t)hkp_rd32(p) | (uint64_t)hkp_rd32(p + 4) << 32;
}
static inline int hkp_is_ident_char(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '$' || c == '%';
}

/* snprintf into why when why is not NULL. */
void hkp_why(char *why, size_t why_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Checks that an ELF image is a complete ELF64 little-endian CUDA object as
 * far as its headers go: identification, e_machine, section and program
 * header tables and segments inside the buffer. Returns 0 or HK_ERR_FORMAT
 * with a reason (meta_elf.c). */
int hkp_elf_check_header(const unsigned char *p, size_t size, char *why, size_t why_size);

/* Skips blanks (whitespace and NUL) and C/PTX comments in s[i..n); returns
 * the offset of what follows. *newline is set to 1 when a line ended in
 * what was skipped, *unterminated when a block comment runs to the end
 * (both may be NULL; neither is cleared). detect.c, shared with
 * meta_ptx.c's lexer. */
size_t hkp_skip_blank(const char *s, size_t n, size_t i, int *newline, int *unterminated);

/* A PTX token: an identifier or directive (".entry"), a number, a string, or
 * one punctuation character. bol is set on the first token of a line, which
 * the line-oriented directives (.version, .target, .file ...) need. */
typedef struct hkp_tok {
    const char *s;
    size_t n;
    int bol;
} hkp_tok;

typedef struct hkp_lexer {
    const char *s;
    size_t n, i;
    int bol;
    int bad; /* an unterminated comment or string was seen */
} hkp_lexer;

/* The next token of lx (comments and blanks skipped): 1, or 0 at the end.
 * meta_ptx.c's, shared with guard.c. */
int hkp_lex_next(hkp_lexer *lx, hkp_tok *t);
/* 1 when t is exactly word. */
int hkp_tok_is(const hkp_tok *t, const char *word);

#endif /* HK_PTX_H */

/*
 * watch/: turns edits in kernel source directories into finished files.
 *
 * Editors save in many ways (write in place, write a temporary file and rename
 * it over, delete and create, vim's backup dance) and each save is a burst of
 * inotify events, some of them for files that are not kernels at all. A build
 * started on the first event would read half a file. Two events say that a
 * save is complete: IN_CLOSE_WRITE (a writer closed the file) and IN_MOVED_TO
 * (a finished file was renamed over it). After either, the file is read at
 * once. Any other change (a write to a file still open, a creation, a
 * deletion) and the listing after a lost event queue wait until the file has
 * been quiet for the debounce period (and, open for writing, until its close
 * or open_wait_ms). Either way the file is read whole, checked not to have
 * changed during the read nor to have received an event meanwhile, and handed
 * over only when its content hash differs from the last one handed over.
 * Saves in quick succession may therefore each be handed over; the last
 * handover always carries the newest content. Headers are tracked as
 * dependencies: a changed header hands over again every source that read it.
 *
 * Private to libhotkern (prefix hkw_). One watcher owns one inotify
 * instance and one thread. That thread only reads files and hands them to the
 * callback; whoever receives them (the runtime's worker, through hk_submit)
 * does the building. Every function is safe from any thread; only
 * hkw_destroy may not be called from the callback (hkw_stop may).
 *
 * What a file name makes of a file, what is refused, how links and
 * subdirectories are taken: beside the declarations below.
 */
#ifndef HK_WATCH_H
#define HK_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include "hotkern/hotkern.h"

/* ---- the watcher (watch/watch.c, events.c, files.c) ---------------------- */

typedef struct hkw_watcher hkw_watcher;

/* Receives one finished change: module `module` now has the `size` bytes at
 * `bytes`, read from `path` (the watched directory's canonical path, '/', the
 * file name). Called on the watcher thread with no watcher lock held; every
 * pointer is valid during the call only, so the callback copies what it keeps.
 * It may call hkw_add_dir and hkw_set_deps, not hkw_destroy. */
typedef void (*hkw_fn)(void *ud, const char *module, const char *path, const void *bytes,
                       size_t size);

/*
 * Refusals
 * A file of an added directory that is neither handed over nor ignored (see
 * "File names and modules", at hkw_classify) is refused through opts.refuse,
 * once per change (a change is a new inode, size, mode or time of the name),
 * with the reason: a name with another extension, a module name of
 * HKW_MODULE_MAX characters or more or one the engine would refuse (not
 * UTF-8, a control character: hku_name_check), a file that is not regular
 * (FIFO, device, socket, or a pseudo-file such as procfs' that reports 0
 * bytes yet has content), an empty file, one over the size cap, one that
 * cannot be opened, and a symbolic link that resolves outside the directory.
 * The reason never quotes the file's content. Only regular files are opened
 * (O_NONBLOCK, then fstat and S_ISREG again), and a refused file is not
 * looked at again until an event says it changed.
 */
/* Receives one refusal (see "Refusals", just above): `path` could not be
 * handed over, for the reason in `why` (one line, naming no content), err
 * being the HK_ERR_* code that fits it. `module` is the module the file would
 * feed, or NULL when its name makes none. Called on the watcher thread with
 * no watcher lock held; the pointers are valid during the call only. */
typedef void (*hkw_refuse_fn)(void *ud, const char *module, const char *path, int err,
                              const char *why);

/* Module names are shorter than this: the engine's limit (hk_report.module). */
#define HKW_MODULE_MAX 64

/* One line of trace ("event queue overflow: rescanning 2 directories") at a
 * level: what the watcher saw and decided, each skipped save with its reason
 * (still open for writing, more events within the debounce period, changed
 * during the read, content unchanged, refused) and each source handed over
 * again for a changed header. On the watcher thread, or the caller's of
 * hkw_set_deps, with the watcher's lock held: it must return quickly
 * and not call hkw_ functions. log_on (optional) says whether a level
 * is wanted, so that a line nobody reads is not formatted. */
typedef void (*hkw_log_fn)(void *ud, hk_log_level level, const char *line);
typedef int (*hkw_log_on_fn)(void *ud, hk_log_level level);

/*
 * Symbolic links
 * A link whose target resolves inside the added directory (or below it) is
 * followed: its content is the target's, and an edit of the target hands the
 * link over again (the target's directory is watched for that). A link that
 * resolves outside is refused and its target is never opened, unless
 * opts.follow_outside_links is set.
 *
 * Subdirectories
 * With opts.recursive, every subdirectory of an added directory is added too,
 * at any depth, including those created (or moved in) later, and its files
 * feed modules as the added directory's do. Directories whose name starts
 * with '.' (.git, .cache) and symbolic links to directories are not entered.
 * A subdirectory that disappears is not looked for again until its parent
 * says it is back.
 */
typedef struct hkw_opts {
    hkw_fn fn;                /* required */
    void *ud;                 /* passed to fn */
    int debounce_ms;          /* quiet period after a file's last event; default 50 */
    int no_initial_scan;      /* 1: files present when a directory is added are
                               * recorded, not handed over (default 0); one
                               * modified within a clock tick (20 ms) before the
                               * watch was placed is handed over all the same */
    int dir_poll_ms;          /* how often a vanished directory is looked for;
                               * default 200 */
    int open_wait_ms;         /* how much longer a file still open for writing
                               * (modified, not yet closed) is waited for; default 1000 */
    size_t max_file_size;     /* larger files are skipped; default 64 MiB */
    hkw_refuse_fn refuse;     /* optional; called with ud */
    int follow_outside_links; /* 1: follow symbolic links whose target is
                               * outside the added directory too (default 0:
                               * refuse them unread) */
    hkw_log_fn log;           /* optional trace */
    hkw_log_on_fn log_on;     /* optional: NULL wants every level */
    void *log_ud;             /* passed to log and log_on */
    int recursive;            /* 1: subdirectories too (see "Subdirectories") */
    unsigned sources;         /* HKW_SRC_* bits: the source kinds that are
                               * module sources; 0: all four */
    int ignore_others;        /* 1: names that are neither sources nor
                               * headers are ignored silently instead of
                               * refused (default 0) */
} hkw_opts;

/* Source kinds, for hkw_opts.sources. */
#define HKW_SRC_CU     1u
#define HKW_SRC_PTX    2u
#define HKW_SRC_CUBIN  4u
#define HKW_SRC_FATBIN 8u

/* The HKW_SRC_* bit of a source extension ("cu", "ptx", "cubin", "fatbin",
 * without the dot; case-insensitive), or 0 when it is none of them. */
unsigned hkw_source_bit(const char *ext);
/* The format extension ext (no dot, any case) names; HK_FORMAT_AUTO for
 * none. */
hk_format hkw_source_format(const char *ext);

/* Counters, all monotonic. */
typedef struct hkw_stats {
    uint64_t events;       /* inotify events read */
    uint64_t handovers;    /* calls of the callback */
    uint64_t overflows;    /* IN_Q_OVERFLOW seen */
    uint64_t rescans;      /* directory listings: on add, after an overflow, on re-add */
    uint64_t retries;      /* reads repeated because the file changed during the read */
    uint64_t dirs_lost;    /* watched directories that disappeared */
    uint64_t opens;        /* files opened for reading */
    uint64_t refusals;     /* calls of the refuse callback */
    uint64_t unchanged;    /* reads of a module source whose content was the one
                            * last handed over: not handed over again */
    uint64_t dep_rebuilds; /* sources due again because a file their build
                            * read (a header) changed */
} hkw_stats;

/* Fills o with the defaults above (fn NULL). */
void hkw_opts_init(hkw_opts *o);

/* Creates the inotify instance and starts the watcher thread. Options are
 * copied. Returns 0, HK_ERR_INVALID (no callback), HK_ERR_NOMEM, or HK_ERR_IO
 * (inotify or thread creation failed; errno is left set). On success *out is
 * owned by the caller: hkw_destroy(). */
int hkw_create(hkw_watcher **out, const hkw_opts *o);

/* Stops the thread: when this returns, no callback (fn, refuse, log) is
 * running or will run, a callback in progress having finished first.
 * Called from a callback (on the watcher's own thread), it only says so:
 * that callback is the last, and the thread ends when it returns. The
 * watcher stays valid (hkw_stats_get, hkw_set_deps) until hkw_destroy.
 * Idempotent; w may be NULL. */
void hkw_stop(hkw_watcher *w);

/* 1 when called on w's own thread (from one of its callbacks). */
int hkw_on_thread(const hkw_watcher *w);

/* Stops the thread (as hkw_stop, waiting for it even when hkw_stop was
 * called from a callback), then frees everything. Must not be called from
 * the callback. w may be NULL. */
void hkw_destroy(hkw_watcher *w);

/* Watches directory dir (and, with opts.recursive, its subdirectories). Its
 * files are listed on the watcher thread soon after: module sources present
 * then are handed over once (unless no_initial_scan). Adding a directory
 * twice is harmless. Returns 0,
 * HK_ERR_INVALID, HK_ERR_NOMEM, or HK_ERR_IO when dir is not a reachable
 * directory or inotify refuses it (errno is left set). */
int hkw_add_dir(hkw_watcher *w, const char *dir);

/* Records that the last build of source_path read the n files in dep_paths
 * (replacing what was recorded before). When one of them changes content,
 * source_path is handed over again even if its own content did not change.
 * Relative dependency paths are taken relative to the source's directory;
 * directories of dependencies outside the watched ones are watched too (for
 * dependencies only). If a dependency changed after the source was last handed
 * over, the source is handed over again at once: its build may have read the
 * old content. Returns 0, HK_ERR_INVALID, HK_ERR_NOMEM, or HK_ERR_NOT_FOUND
 * when source_path is not a module source of a watched directory. */
int hkw_set_deps(hkw_watcher *w, const char *source_path, const char *const *dep_paths, int n);

/* Snapshot of the counters. */
void hkw_stats_get(hkw_watcher *w, hkw_stats *out);

/* Test and diagnostic hook: with on = 1 the watcher thread stops reading
 * events (the kernel queue then fills, and overflows) and this call returns
 * once it has stopped; on = 0 lets it go on. */
void hkw_pause(hkw_watcher *w, int on);

/*
 * File names and modules
 * - NAME.cu, NAME.ptx, NAME.cubin and NAME.fatbin are module sources: module
 *   NAME is the file name up to its first '.', so "particles.v2.cu" is module
 *   "particles". The kind is taken from the last extension, in lower case.
 * - NAME.h, NAME.cuh and NAME.hpp are headers: never handed over themselves,
 *   only tracked as dependencies of the sources that include them.
 * - With opts.sources set, only the source kinds it names are module
 *   sources; other sources are ignored silently, as are (with
 *   opts.ignore_others) names that are neither sources nor headers.
 * - Editor droppings are ignored silently, whatever else: dotfiles
 *   (".particles.cu.swp", ".#particles.cu"), names ending in '~' (backups),
 *   "*.swp", "*.swx", "*.tmp", vim's probe file "4913", emacs'
 *   "#particles.cu#". A file named by hkw_set_deps is tracked whatever
 *   its extension, unless it is one of these droppings.
 */
/* What a file name is to the watcher. */
typedef enum hkw_kind {
    HKW_IGNORED = 0, /* editor dropping, or a module name that does not fit */
    HKW_SOURCE = 1,  /* module source: NAME.cu/.ptx/.cubin/.fatbin */
    HKW_HEADER = 2,  /* .h, .cuh, .hpp */
    HKW_OTHER = 3,   /* not a dropping, but only tracked as a dependency */
} hkw_kind;

/* Classifies a bare file name (no '/'). For a source, the module name is
 * written to module (NUL-terminated) when module_size allows; a module name
 * that does not fit makes the file HKW_IGNORED. module may be NULL. */
hkw_kind hkw_classify(const char *name, char *module, size_t module_size);

/* ---- runtime glue (watch/api.c, which also implements hk_watch_dir) ------- */

/* Most headers, and bytes per header, that a handover carries in memory. */
#define HKW_MAX_HEADERS      256
#define HKW_MAX_HEADER_BYTES ((size_t)4 << 20)

/* Reads the headers of directory dir (canonical): the files hkw_classify
 * calls HKW_HEADER, up to the limits above. Larger or unreadable ones are
 * left to the file system; one that is a symbolic link resolving outside dir,
 * or not a regular file, is not read and comes as an #error saying so, to
 * hide the file from the compiler. Sorted by name, so that the same files
 * give the same build key. Returns 0, HK_ERR_IO (dir cannot be listed) or
 * HK_ERR_NOMEM; on success *out (*n entries, NULL when none) is the
 * caller's: hkw_headers_free(*out, *n). */
int hkw_dir_headers(const char *dir, hk_header **out, int *n);
void hkw_headers_free(hk_header *h, int n);

#endif /* HK_WATCH_H */

/*
 * hotkern: replace CUDA kernels inside a running program.
 *
 *   hk_runtime *rt;
 *   hk_report rep = HK_REPORT_INIT;
 *   if (hk_runtime_create(&rt, NULL, &rep) < 0) die(rep.message);
 *   hk_swap(rt, "particles", src, len, NULL, &rep);   // CUDA C, PTX, cubin, fatbin
 *   hk_kernel *step;
 *   hk_kernel_get(rt, "particles", "step", &step);    // valid for the runtime's life
 *   hk_watch_dir(rt, "kernels/", NULL, &rep);         // every save: a new version
 *   void *args[] = {&d_x, &n};
 *   hk_launch(step, grid, block, 0, stream, args, NULL); // the newest version
 *   hk_runtime_destroy(rt);
 * (Programs as they are, <<<>>> untouched: hotkern/interpose.h; typed
 * launches from C++: hotkern/hotkern.hpp.)
 *
 * An application that uses the CUDA runtime API (cudaMalloc, cudaStream_t ...)
 * creates one hk_runtime, loads named modules into it and takes kernel handles.
 * A handle stays valid for the life of the runtime; every launch through it runs
 * the newest committed version of its module. New versions arrive as CUDA C,
 * PTX, cubin or fatbin, from an API call, a watched directory or the network;
 * each is built, staged, validated and committed as one transaction, and a
 * refused version leaves the running one untouched. All modules live in the
 * runtime's primary context, so the application's buffers stay valid.
 *
 * C++: hotkern.hpp, beside this header, wraps it for new code (C++17,
 * header-only): kernel handles typed by the kernel's signature, whose launch
 * arguments are checked at compile time and whose parameter layout is
 * required of every version (hk_kernel_require_layout), and thin owners for
 * runtimes, pins and reports.
 *
 * Conventions
 * - Every function that can fail returns 0 or a negative HK_ERR_* code;
 *   hk_strerror() names it. Codes are only ever added, never renumbered.
 * - Where a call takes an hk_report *, it may be NULL; when given, it receives
 *   the detail of a failure (compiler or JIT log, CUresult name, which kernel
 *   and what differed). Release it with hk_report_clear().
 * - Not thread-safe unless stated. The launch path (hk_launch and friends) and
 *   hk_swap/hk_submit are safe from any thread.
 * - Structures passed in by the caller are read during the call only.
 *
 * Sized structures (the ABI rule)
 *   Every structure the caller allocates and hotkern reads or fills (hk_report,
 *   hk_options, hk_swap_options, hk_launch_config, hk_stats, hk_quarantine,
 *   hk_watch_options, hk_check_options and those of net.h) starts with
 *   `size_t size`, the caller's sizeof, set by its
 * _init() function or HK_<NAME>_INIT macro. Fields are only ever added at the end, each at or
 * beyond the previous sizeof, so a program built against older headers keeps working with a newer
 * library of the same soname:
 *   - hotkern reads only the fields that lie wholly within `size`; the others
 *     take their defaults (those documented at each field);
 *   - hotkern writes only within `size`: bytes past it are never touched;
 *   - a size below the structure's first published layout (0 included) is
 *     refused with HK_ERR_INVALID before anything is done or written; a size
 *     beyond hotkern's own layout (a program built against newer headers) is
 *     accepted, and the fields hotkern does not know are ignored.
 *   The _init() functions are static inline, so they set the size of the
 *   layout the program was compiled with; the defaults come from the library
 *   (hk_*_init_size). hk_event (handed to callbacks) carries the size hotkern
 *   filled. hk_dim3 and hk_header are small value types passed by value or in
 *   arrays: they are frozen and never grow (a new need gets a new type).
 */
#ifndef HOTKERN_H
#define HOTKERN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(HK_BUILDING) && defined(__GNUC__)
#define HK_API __attribute__((visibility("default")))
#else
#define HK_API
#endif

#if defined(__GNUC__)
#define HK_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define HK_PRINTF(f, a)
#endif

/* An initialiser of a sized structure: its size, every other field zero
 * (hk_report r = HK_REPORT_INIT). In C++, g++ -Wextra warns about the fields
 * it leaves out: the hk_*_init() functions do the same without a warning. */
/* clang-format off */
#ifndef __cplusplus
#define HK_SIZED_INIT(type) {.size = sizeof(type)}
#else
#define HK_SIZED_INIT(type) {sizeof(type)}
#endif
/* clang-format on */

#define HK_VERSION_MAJOR 1
#define HK_VERSION_MINOR 3
#define HK_VERSION_PATCH 0

/* ---- errors ------------------------------------------------------------ */

/* Every code once, as X(name, value, message): the enum, hk_strerror and
 * hk_err_name are made from this table, so they cannot drift apart (libuv's
 * UV_ERRNO_MAP). What each code means is said beside it. */
/* clang-format off */
#define HK_ERROR_TABLE(X) \
    X(HK_OK, 0, "success") \
    /* bad argument */ \
    X(HK_ERR_INVALID, -1, "invalid argument") \
    /* out of memory */ \
    X(HK_ERR_NOMEM, -2, "out of memory") \
    /* libcuda could not be loaded or initialised */ \
    X(HK_ERR_NO_DRIVER, -3, "CUDA driver not available") \
    /* no such CUDA device */ \
    X(HK_ERR_NO_DEVICE, -4, "no such CUDA device") \
    /* a driver call failed: see report cu_name */ \
    X(HK_ERR_CUDA, -5, "CUDA driver call failed") \
    /* input is not CUDA C, PTX, cubin or fatbin */ \
    X(HK_ERR_FORMAT, -6, "not a kernel image or source") \
    /* NVRTC, nvJitLink or driver JIT refused it */ \
    X(HK_ERR_COMPILE, -7, "compilation failed") \
    /* image has no code for the device's arch */ \
    X(HK_ERR_ARCH, -8, "no code for the device architecture") \
    /* a kernel with a handle is absent */ \
    X(HK_ERR_MISSING_KERNEL, -9, "a kernel in use is missing from the new version") \
    /* a kernel's parameter layout changed */ \
    X(HK_ERR_LAYOUT, -10, "a kernel's parameter layout changed") \
    /* a carried-over global changed size */ \
    X(HK_ERR_GLOBAL_SIZE, -11, "a global variable changed size") \
    /* the caller's check callback said no */ \
    X(HK_ERR_REJECTED, -12, "rejected by the check callback") \
    /* no such module or kernel */ \
    X(HK_ERR_NOT_FOUND, -13, "no such module or kernel") \
    /* resource still in use */ \
    X(HK_ERR_BUSY, -14, "resource busy") \
    /* file or directory error (errno in report) */ \
    X(HK_ERR_IO, -15, "input/output error") \
    /* nothing to roll back to */ \
    X(HK_ERR_NO_HISTORY, -16, "no earlier version to roll back to") \
    /* the runtime is shutting down */ \
    X(HK_ERR_CLOSED, -17, "runtime is shutting down") \
    /* not possible in this configuration */ \
    X(HK_ERR_UNSUPPORTED, -18, "not supported in this configuration") \
    /* missing, bad or unknown signature */ \
    X(HK_ERR_SIGNATURE, -19, "missing, bad or unknown signature") \
    /* release version not newer than current */ \
    X(HK_ERR_REPLAY, -20, "version not newer than the current one") \
    /* release manifest expired */ \
    X(HK_ERR_EXPIRED, -21, "release expired") \
    /* artifact hash or size mismatch */ \
    X(HK_ERR_HASH, -22, "artifact hash or size mismatch") \
    /* input over the configured size cap */ \
    X(HK_ERR_TOO_LARGE, -23, "input too large") \
    /* transfer failed */ \
    X(HK_ERR_NETWORK, -24, "network transfer failed") \
    /* operation timed out */ \
    X(HK_ERR_TIMEOUT, -25, "timed out") \
    /* the context was reset under hotkern */ \
    X(HK_ERR_CONTEXT_RESET, -26, "CUDA context was reset") \
    /* a newer version of the module committed first, or (a watched file) a newer save of it came before this one was built or staged */ \
    X(HK_ERR_SUPERSEDED, -27, "a newer version was committed first") \
    /* a kernel attribute set through its handle does not fit the new version */ \
    X(HK_ERR_ATTRIBUTE, -28, "a kernel attribute does not fit the new version") \
    /* the version failed its canary run: a test launch faulted, hung, gave other outputs than the running version, was slower than the perf guard allows, drew an error from memcheck, or a test does not fit it; see report canary and canary_refusal (a canary that could not run is HK_ERR_CANARY_UNAVAILABLE) */ \
    X(HK_ERR_CANARY, -29, "the version failed its canary run") \
    /* the image is quarantined: it was committed shortly before the CUDA context was lost (see "Last known good") */ \
    X(HK_ERR_QUARANTINED, -30, "the image is quarantined (it ran when the context was lost)") \
    /* the canary was required (HK_CANARY_REQUIRE) and could not run: its helper could not start, died or did not answer outside a test launch, or cannot load an image; the state of this host, not a verdict on the version (canary_refusal "could_not_run") */ \
    X(HK_ERR_CANARY_UNAVAILABLE, -31, "the canary was required and could not run")
/* clang-format on */

enum hk_error {
#define HK_ERROR_ENUM_(name, value, message) name = value,
    HK_ERROR_TABLE(HK_ERROR_ENUM_)
#undef HK_ERROR_ENUM_
};

/* Static, never NULL; "unknown error" for codes this build does not know. */
HK_API const char *hk_strerror(int err);

/* The code's name, "HK_ERR_LAYOUT" (static, never NULL; "HK_ERR_UNKNOWN" for
 * codes this build does not know): what the CLI's --json and the endpoint's
 * replies carry. */
HK_API const char *hk_err_name(int err);

/* 1 when err is a verdict on the version itself, which the same bytes get
 * again wherever they are tried (a compile error, a layout that does not
 * fit, a canary refusal, a quarantined image, a check callback's refusal);
 * 0 for 0 and for the state of the host or the moment (busy, closing, out
 * of memory, the driver or the device, a build that timed out, a canary
 * that could not run, a disk or network error), after which trying the
 * same bytes again may succeed. Release sources remember only verdicts and
 * retry the rest. */
HK_API int hk_err_is_verdict(int err);

/* The version of the library a program runs with: "MAJOR.MINOR.PATCH",
 * static (HK_VERSION_* above are the headers' it was built with). Builds of
 * one major version (and soname, libhotkern.so.MAJOR) keep the ABI; minor
 * versions only add (functions, codes, fields at the end of sized
 * structures). 1.0 put `size` first in every caller-allocated structure. */
HK_API const char *hk_version(void);

/* ---- kernel image formats ---------------------------------------------- */

typedef enum hk_format {
    HK_FORMAT_AUTO = 0, /* detect from content */
    HK_FORMAT_CUDA_C = 1,
    HK_FORMAT_PTX = 2,
    HK_FORMAT_CUBIN = 3,
    HK_FORMAT_FATBIN = 4,
} hk_format;

HK_API const char *hk_format_name(hk_format fmt);

/* ---- reports ----------------------------------------------------------- */

/* What happened in one call. Initialise with HK_REPORT_INIT or
 * hk_report_init() before the first use; the callee overwrites it (within
 * size). A call given a report whose size is below the first layout returns
 * HK_ERR_INVALID and does nothing. The first layout ends at cache_hit. */
typedef struct hk_report {
    size_t size;             /* sizeof(hk_report) as the caller was built */
    int error;               /* HK_OK or the HK_ERR_* returned */
    int cu_result;           /* CUresult of the failing driver call, else 0 */
    char cu_name[48];        /* its name, e.g. "CUDA_ERROR_INVALID_PTX" */
    char module[64];         /* module concerned */
    char kernel[128];        /* kernel concerned, when one is */
    char message[512];       /* one line, e.g. "kernel 'step': parameter 1 ..." */
    char *log;               /* compiler/JIT log or NULL; owned, see clear */
    uint64_t version;        /* version committed, or attempted */
    double build_ms;         /* source -> loadable image (NVRTC, nvJitLink) */
    double stage_ms;         /* driver load, resolve, validate */
    double commit_ms;        /* globals carried over and version published */
    int cache_hit;           /* 1 when the build came from the compile cache */
    double wait_ms;          /* the rest of total_ms: waiting for another swap, a
                              * safe point, or reset recovery */
    double total_ms;         /* wall time from the call (or submission) to the outcome */
    char canary[160];        /* what the canary run found: "no canary tests", "3
                              * launches passed (2 compared with version 4)", why
                              * it could not run, or the failure; "" when none ran */
    double canary_ms;        /* time spent in the canary run (part of total_ms) */
    double canary_new_ms;    /* the perf guard's figures (hk_options.
                              * canary_slowdown_max): the median GPU time of a
                              * test launch of the new version, for the test
                              * that came out slowest against the running
                              * version (or, none timed on it, the longest);
                              * the refused test's on a "slower" refusal;
                              * 0: not timed */
    double canary_old_ms;    /* the running version's on the same test and
                              * inputs; 0: not timed (a first version, or
                              * the running version could not be timed) */
    char canary_refusal[16]; /* what refused the version: "fault" (a launch
                              * failed, or the helper died or answered
                              * nonsense during it), "hang", "mismatch",
                              * "slower", "memcheck", "could_not_run"
                              * (required but could not run, or a test that
                              * does not fit the kernel); "" otherwise */
} hk_report;

#define HK_REPORT_INIT HK_SIZED_INIT(hk_report)

/* Sets r to an empty report of the caller's layout. */
static inline void hk_report_init(hk_report *r) {
    memset(r, 0, sizeof *r);
    r->size = sizeof *r;
}

/* Frees r->log and zeroes the report's fields within r->size, keeping size,
 * so the report can be used again. r may be NULL; a report whose size is
 * below the first layout is left alone. */
HK_API void hk_report_clear(hk_report *r);

/* ---- runtime ----------------------------------------------------------- */

typedef struct hk_runtime hk_runtime;
typedef struct hk_kernel hk_kernel;
typedef struct hk_pin hk_pin;

/* How a new version reaches the driver. */
typedef enum hk_loader {
    HK_LOADER_LIBRARY = 0, /* cuLibraryLoadData (default): context-independent,
                            * survives cudaDeviceReset, unload never waits */
    HK_LOADER_MODULE = 1,  /* cuModuleLoadDataEx in the primary context; one
                            * device only */
} hk_loader;

/* What PTX becomes before it reaches the driver. */
typedef enum hk_ptx_mode {
    HK_PTX_NVJITLINK = 0,  /* compile to cubin off the driver (default): the
                            * driver JIT stalls every launching thread */
    HK_PTX_DRIVER_JIT = 1, /* hand PTX to the driver with JIT options */
} hk_ptx_mode;

/* When the driver work of a swap (load + upload of code) happens. */
typedef enum hk_stage_mode {
    HK_STAGE_NOW = 0,           /* inside hk_swap / on the worker thread */
    HK_STAGE_AT_SAFE_POINT = 1, /* in the next hk_safe_point() call */
    HK_STAGE_AUTO = 2,          /* the default: at safe points once the program
                                 * has called hk_safe_point (from another thread
                                 * than the swapping one), else now; under the
                                 * <<<>>> interposition, at its automatic safe
                                 * points (hotkern/interpose.h) unless from a
                                 * thread of the program */
} hk_stage_mode;

/* Swap outcomes and other events, for hk_event_cb. */
typedef enum hk_event_kind {
    HK_EVENT_COMMITTED = 1,     /* a new version runs */
    HK_EVENT_REFUSED = 2,       /* a version was refused; old one runs */
    HK_EVENT_ROLLED_BACK = 3,   /* a rollback committed */
    HK_EVENT_RECLAIMED = 4,     /* an old version's code was unloaded */
    HK_EVENT_CONTEXT_RESET = 5, /* context reset detected; versions reloaded;
                                 * the application's buffers are gone */
    HK_EVENT_CONTEXT_LOST = 6,  /* a launch or synchronise returned a sticky
                                 * error (illegal address, trap...): every
                                 * later CUDA call of the process fails, so it
                                 * must restart; the suspect versions are
                                 * quarantined (once per runtime; module NULL,
                                 * report cu_name the error) */
    HK_EVENT_FALLBACK = 7,      /* a launch of a program's kernel (the <<<>>>
                                 * interposition) failed in the hot version:
                                 * the program's own kernel ran that launch,
                                 * and the module's program kernels run the
                                 * program's code until its next commit
                                 * (report: kernel, cu_name, message) */
} hk_event_kind;

/* Filled by hotkern, valid during the callback only. `size` is the sizeof
 * hotkern was built with: a callback built against newer headers reads a
 * field only when size covers it. */
typedef struct hk_event {
    size_t size;
    hk_event_kind kind;
    const char *module;   /* NULL when the event concerns no module (a context
                           * reset, a watched file whose name makes none) */
    uint64_t old_version; /* 0 when none */
    uint64_t new_version; /* 0 when none */
    const char *origin;   /* "api", "watch:PATH", "push", "pull:URL" ... */
    const hk_report *report;
} hk_event;

/* Called on the thread that performed the swap (the caller of hk_swap, the
 * worker, or the caller of hk_safe_point; RECLAIMED and CONTEXT_RESET on
 * hotkern's reclaim thread; FALLBACK on the launching thread), with no
 * hotkern lock held: it may call hotkern, but not hk_runtime_destroy. Calls
 * that would wait for the thread the event runs on return HK_ERR_BUSY at
 * once: hk_wait_idle on the worker, hk_reclaim_wait on the reclaim thread. */
typedef void (*hk_event_cb)(const hk_event *ev, void *userdata);

/* Events on the program's own thread (as libmpv's mpv_wait_event): instead
 * of, or beside, on_event, a runtime can queue a copy of every event for the
 * program to take with hk_next_event when it wants, e.g. once per frame, or
 * when hk_event_fd polls readable beside its own descriptors. */
typedef struct hk_queued_event {
    size_t size; /* set by hk_queued_event_init */
    hk_event_kind kind;
    char module[64]; /* "" when the event concerns no module */
    uint64_t old_version, new_version;
    char origin[256];
    int error;         /* the report's error: 0, or the HK_ERR_* of a refusal */
    char message[512]; /* the report's message */
    double total_ms;   /* the report's total_ms */
    uint64_t dropped;  /* events the queue had no room for just before this one */
} hk_queued_event;

#define HK_QUEUED_EVENT_INIT HK_SIZED_INIT(hk_queued_event)

static inline void hk_queued_event_init(hk_queued_event *e) {
    memset(e, 0, sizeof *e);
    e->size = sizeof *e;
}

/* Caller-supplied validation, run after staging and before commit, while the
 * swap holds the runtime's swap lock (launches are not held). Return 0 to
 * accept; anything else refuses the version with HK_ERR_REJECTED, and the text
 * written to msg (NUL-terminated, up to msg_size) goes to the report.
 * It may call hk_module_version, hk_module_global, hk_pin_module/hk_unpin,
 * hk_launch and hk_stats_get (they answer at once); hk_swap, hk_rollback,
 * hk_kernel_get, hk_safe_point and graph (un)registration on the same runtime
 * return HK_ERR_BUSY instead of waiting for the swap that runs the callback. */
typedef int (*hk_check_cb)(const char *module, uint64_t version, void *userdata, char *msg,
                           size_t msg_size);

/* A header held in memory. CUDA C builds find it by `name` exactly as written
 * in an #include ("common.cuh" or <common.cuh>) before any file, so kernels
 * that include their own headers build where those files do not exist (a
 * server receiving a push, a test). `data` is text and need not be
 * NUL-terminated; it is copied by the call that takes it.
 * Frozen: given in arrays, it never grows (its `size` is the data's). */
typedef struct hk_header {
    const char *name; /* e.g. "common.cuh"; not empty */
    const void *data;
    size_t size;
} hk_header;

/* ---- logs (the type; the calls are below) ------------------------------ */

/* What hotkern says about its work: one line per message, with a level and
 * the subsystem that speaks ("engine", "watch", "endpoint", "pull"; an
 * application may use its own). Nothing is logged by the launch path. */
typedef enum hk_log_level {
    HK_LOG_DEBUG = 0, /* every step: events seen, polls, requests served */
    HK_LOG_INFO = 1,  /* what changed: commits, handovers, new releases */
    HK_LOG_WARN = 2,  /* what was refused or retried, and why */
    HK_LOG_ERROR = 3, /* what hotkern could not do */
    HK_LOG_OFF = 4,   /* as a minimum level: nothing */
} hk_log_level;

/* "debug", "info", "warn", "error", "off"; static, never NULL. */
HK_API const char *hk_log_level_name(hk_log_level level);

/* Receives one message: `message` is one line (control characters are
 * replaced by spaces) without a newline, at most 1023 bytes; both strings are
 * valid during the call only.
 * Threads: called on whichever thread did the work: the application's (a
 * swap, a rollback, a safe point), the runtime's worker and reclaim threads,
 * the watcher's thread, an endpoint's connection and worker threads, a
 * puller's thread; from several threads at once. It may be called with
 * hotkern locks held, so it must return quickly and must not call hotkern
 * (hk_log_level_name, hk_strerror and hk_version excepted): a message logged
 * from the callback is dropped and hk_runtime_set_log returns HK_ERR_BUSY
 * there. An application that wants to act on a message queues it. */
typedef void (*hk_log_cb)(hk_log_level level, const char *subsystem, const char *message,
                          void *userdata);

/* The first layout ends at userdata: later fields take their defaults when a
 * caller's size stops before them. */
typedef struct hk_options {
    size_t size;              /* set by hk_options_init */
    const int *devices;       /* CUDA device ordinals; NULL means {0} */
    int ndevices;             /* entries in devices; 0 means 1 */
    hk_loader loader;         /* default HK_LOADER_LIBRARY */
    hk_ptx_mode ptx_mode;     /* default HK_PTX_NVJITLINK */
    int jit_opt_level;        /* 0..4, default 4 (driver JIT and nvJitLink) */
    int arch;                 /* target SM, e.g. 90; 0 = from device 0 */
    int history;              /* images kept per module for rollback, default 4 */
    const char *cache_dir;    /* compile cache; NULL = $XDG_CACHE_HOME/hotkern,
                               * "" disables the cache; one that another user
                               * could change (owner, group/other write bit,
                               * here or above) is not used, and the log says
                               * why */
    uint64_t cache_max_bytes; /* default 256 MiB; the 32 entries used last are
                               * also kept in memory, at most an eighth of it */
    hk_event_cb on_event;
    void *userdata;           /* passed to on_event and check callbacks */
    int safe_point_wait_ms;   /* how long hk_swap waits for a safe point before
                               * staging at once, and how long a submitted
                               * version waits for one before the worker stages
                               * it; default 2000 */
    const hk_header *headers; /* in-memory headers for every CUDA C build of
                               * the runtime (copied); a swap's own headers of
                               * the same name come first */
    int nheaders;
    int no_warm_start;                 /* 1: do not warm NVRTC up on a background thread at
                                        * create (default 0: the first CUDA C swap then
                                        * does not pay NVRTC's start-up) */
    int launch_hold_max_us;            /* longest a launch waits at the launch gate while
                                        * a swap or an unload has the driver; default 1000
                                        * (a launch that waited this long goes on, and
                                        * the driver then orders it) */
    int destroy_wait_ms;               /* longest hk_runtime_destroy waits (for kernels
                                        * still running hotkern's code, a build, a
                                        * canary run, a callback); default 5000 */
    int canary;                        /* 1: run new versions' test launches
                                        * (hk_kernel_add_test) in a canary process
                                        * before they commit; the helper starts at
                                        * create. Default 0 */
    const char *canary_helper;         /* path of the hotkern-canary executable; NULL:
                                        * $HK_CANARY_HELPER, else hotkern-canary in
                                        * ../libexec/hotkern or ../bin from the library
                                        * (or program) holding hotkern, else LIBEXECDIR */
    int canary_timeout_ms;             /* longest one test launch may run before the
                                        * helper is killed, default 2000; the helper's
                                        * start and each image load get ten times this */
    const char *state_dir;             /* last known good (see below): the directory
                                        * that keeps committed images and per-module
                                        * records across restarts (created; one
                                        * runtime at a time: locked while it lives;
                                        * refused when another user could change it);
                                        * NULL (default): kept in memory only */
    int suspect_window_ms;             /* a version committed this shortly before the
                                        * context is lost is suspect, and one current
                                        * this long without a loss is known good;
                                        * default 60000 */
    int restore;                       /* 1: hk_runtime_create calls
                                        * hk_runtime_restore (a failure to restore is
                                        * then logged, not returned); default 0 */
    int build_isolated;                /* 1: compile CUDA C (NVRTC) and PTX (nvJitLink)
                                        * in `hotkern-build`, a helper process started
                                        * at create, so that NVRTC never touches this
                                        * process's signal handlers and a compiler
                                        * crash or hang refuses one version instead of
                                        * ending the program (see hk_runtime_create);
                                        * 0 (default): in this process. The compile
                                        * cache stays in this process: a cache hit
                                        * never reaches the helper */
    const char *build_helper;          /* path of the hotkern-build executable; NULL:
                                        * $HK_BUILD_HELPER, else hotkern-build found as
                                        * canary_helper's default is. Create fails with
                                        * HK_ERR_IO, saying why, when it cannot be
                                        * started or does not greet within 10 s */
    int build_timeout_ms;              /* longest one isolated build may run; past it
                                        * the helper is killed (and restarted for the
                                        * next build) and the version refused with
                                        * HK_ERR_COMPILE; default 120000 */
    double canary_slowdown_max;        /* the canary's perf guard: each test launch
                                        * that passed is repeated, once untimed and
                                        * five times between CUDA events, on the
                                        * new and on the running version with the
                                        * same inputs; a version whose median GPU
                                        * time is more than this many times the
                                        * running version's AND more than
                                        * canary_slowdown_min_ms longer is refused
                                        * with HK_ERR_CANARY ("slower", both times
                                        * in the report). Default 4.0 (0 also
                                        * means 4.0); < 0: no guard (no timing) */
    double canary_slowdown_min_ms;     /* default 1.0 (0 also means 1.0); < 0: no
                                        * floor (the ratio alone decides) */
    int canary_sanitizer;              /* memcheck: each test launch of the new
                                        * version first runs in a second helper
                                        * under `compute-sanitizer --tool
                                        * memcheck`, so that an out-of-bounds or
                                        * misaligned access is caught before it
                                        * faults the GPU (or silently lands in
                                        * valid memory) and refuses the version
                                        * ("memcheck", the sanitizer's first error
                                        * line in the report). 0 (default): on
                                        * when compute-sanitizer is found and its
                                        * helper starts, else off (create's
                                        * report and the log say why); 1: on, and
                                        * create fails with HK_ERR_IO when it
                                        * cannot be; -1: off */
    const char *canary_sanitizer_path; /* compute-sanitizer; NULL:
                                        * $HK_COMPUTE_SANITIZER (set but empty:
                                        * none), else bin/compute-sanitizer
                                        * of the toolkit whose NVRTC hotkern
                                        * uses, of $CUDA_HOME, $CUDA_PATH or
                                        * /usr/local/cuda, else $PATH */
    hk_log_cb log;                     /* set: the log callback from the start, so that
                                        * what create says (restore, helpers, the state
                                        * directory) reaches it; as hk_runtime_set_log
                                        * later. NULL: none (HOTKERN_LOG's stderr) */
    void *log_userdata;                /* passed to log */
    int log_min_level;                 /* hk_log_level; default HK_LOG_INFO */
    const char *canary_device;         /* the device the canary helpers run on: NULL or
                                        * "" (default) the runtime's first; a CUDA
                                        * ordinal ("1", as CUDA_VISIBLE_DEVICES and
                                        * CUDA_DEVICE_ORDER number them); or a UUID as
                                        * nvidia-smi -L prints it ("GPU-6e1f...",
                                        * "MIG-..."; the prefix optional).
                                        * A fault in a canary run stalls every context
                                        * of the device it runs on (README, "Memcheck"):
                                        * on another GPU it costs the program's none.
                                        * It must have the runtime's architecture;
                                        * create fails with HK_ERR_INVALID, saying why,
                                        * for one that is missing or differs. Read at
                                        * create only */
} hk_options;

/* Sets o->size = size and every field within it to the defaults above.
 * Returns HK_ERR_INVALID, writing nothing, for a size below the first
 * layout. Call it through hk_options_init. */
HK_API int hk_options_init_size(hk_options *o, size_t size);

/* Fills o with the defaults above, for the layout the program is built with. */
static inline void hk_options_init(hk_options *o) {
    (void)hk_options_init_size(o, sizeof *o);
}

/* Attaches to the primary context of each device and starts the background
 * reclaim thread. Works whether or not the application used the CUDA runtime
 * first: when a context is current on the calling thread for the device (the
 * runtime's, or one the application made current), that context is used;
 * otherwise the device's primary context is retained and is the one the runtime
 * will use. Never creates a non-primary context, never destroys one.
 * Returns HK_ERR_NO_DRIVER when libcuda is missing or cuInit fails (the report
 * says which), HK_ERR_NO_DEVICE for a bad ordinal.
 * On success *out is owned by the caller: hk_runtime_destroy().
 *
 * Signal handlers: install yours before this call. NVRTC (measured with 13.0)
 * replaces the process's SIGINT, SIGTERM and SIGXFSZ handlers for the
 * duration of each compile and then restores the ones it saw when the
 * compile began. Create starts a warm-up compile on a background thread
 * (unless no_warm_start), so a handler installed after create can be put
 * back to what came before (SIG_DFL) when the warm-up ends; one installed
 * before survives it and every later build. A SIGINT or SIGTERM that arrives
 * while a compile runs (a swap, a push, a watched save) goes to NVRTC's
 * handler, which ends the process with status 4, and SIGINT is ignored
 * meanwhile. To avoid all of this, set options.build_isolated: compiles
 * (and the warm-up) then run in the `hotkern-build` helper process, NVRTC
 * never touches this process's handlers, and a compiler that crashes or
 * hangs (past build_timeout_ms) costs one refused version. The helper is
 * started here; create fails with HK_ERR_IO, the report saying why, when it
 * cannot be. */
HK_API int hk_runtime_create(hk_runtime **out, const hk_options *opt, hk_report *rep);

/* Stops the sources and the worker, unloads every version, releases
 * retained contexts. All kernel handles and pins become invalid; graphs that
 * captured hk_launch must not be launched afterwards. No other thread may be
 * inside a hotkern call on rt. rt may be NULL.
 * Bound: destroy returns within options.destroy_wait_ms (plus the time the
 * sources take to stop), whatever runs. A canary run or an isolated build in
 * progress is cut short (nothing of it is committed). An in-process NVRTC
 * compile cannot be interrupted: the worker is left to finish it, commits
 * nothing, and completes the teardown itself. Unloading code waits for
 * kernels still running it (the driver does so): those unloads, and the
 * release of the runtime's memory, are left to hotkern's reclaim thread.
 * Callbacks: once destroy has begun, no event or log callback is called from
 * any of hotkern's threads (only from the destroying thread itself), and
 * destroy waits, within the same bound, for those already running; their
 * userdata may be freed when it returns.
 * Exit: a runtime the program has not destroyed when it returns from main or
 * calls exit stops there. Its threads make no driver call and compile
 * nothing from then on, no callback is called, and the exit waits for work
 * in progress up to options.destroy_wait_ms (past it the process ends with
 * the exit's status, its stdio flushed, without the exit handlers
 * registered before the runtime was made). A destroy after that point
 * returns at once. An exit during the process's first in-process NVRTC
 * compile (the warm-up, from creation on) is not covered: NVRTC registers
 * exit handlers of its own then, which run first. Destroy the runtime
 * before exit, or set options.build_isolated. */
HK_API void hk_runtime_destroy(hk_runtime *rt);

/* The CUcontext used for device slot i (cast from void *), or NULL. */
HK_API void *hk_runtime_context(hk_runtime *rt, int device_slot);

/* Target SM (e.g. 90) that builds aim at. */
HK_API int hk_runtime_arch(hk_runtime *rt);

/* ---- swapping in new versions ----------------------------------------- */

/* Whether a swap runs its version's test launches in the canary process
 * first (see "canary runs" below). A version whose kernels have no test
 * launch declared commits as before, whatever the policy ("no canary tests"
 * in the report). */
typedef enum hk_canary_policy {
    HK_CANARY_DEFAULT = 0,  /* the source's default: OPTIONAL for hk_swap,
                             * hk_submit and watched files; REQUIRE for pushes
                             * and pulls (net.h) */
    HK_CANARY_SKIP = 1,     /* no canary run */
    HK_CANARY_OPTIONAL = 2, /* run the tests when the runtime has a canary;
                             * if it cannot run (no helper, helper not
                             * starting) the version goes on, and the report
                             * says so */
    HK_CANARY_REQUIRE = 3,  /* a version with tests that cannot be run in the
                             * canary is refused with HK_ERR_CANARY */
} hk_canary_policy;

/* What a CUDA C or PTX build spends its time on. Cubins and fatbins are
 * loaded as they are, whatever the profile. */
typedef enum hk_build_profile {
    HK_BUILD_PROFILE_DEFAULT = 0, /* the source's default: RELEASE everywhere
                                   * (hk_swap, hk_submit, watched directories,
                                   * pushes and pulls) */
    HK_BUILD_PROFILE_RELEASE = 1, /* the fastest code: NVRTC's full
                                   * optimisation, ptxas and nvJitLink at -O3
                                   * (-O0 with hk_options.jit_opt_level 0) */
    HK_BUILD_PROFILE_DEV = 2,     /* the fastest compile, for the edit-save-look
                                   * loop: NVRTC -Ofc=max (its fast-compile
                                   * level, passed on to ptxas), -minimal where
                                   * the source cannot need what it leaves out
                                   * (a build that fails with it is compiled
                                   * again without), nvJitLink -Ofc=max. The
                                   * code may run slower; what compiles, and
                                   * what it computes, are the same. A DEV
                                   * build is never served from the compile
                                   * cache for a RELEASE one, nor the other way
                                   * round. Opt-in only
                                   * (hk_watch_options.build_profile, or this
                                   * field) */
} hk_build_profile;

/* Has this process's malloc keep the memory NVRTC frees, so that the next
 * compile reuses it instead of having the kernel fault fresh, zeroed pages
 * in: NVRTC allocates and frees tens of megabytes per compile, and glibc's
 * default thresholds give much of it back after each one. Measured on a
 * one-line kernel (bench_nvrtc_state, phase 4): 2,787 page faults per
 * compile become 1,264, the compile x0.88-0.93 of its time on the H200 host
 * and x0.91 on a 2-core CI machine. The cost is memory: up to 256 MiB freed
 * at the top of the heap stays with the process (trim threshold 256 MiB,
 * mmap threshold 32 MiB, top pad 64 MiB, by mallopt).
 *
 * Process-wide, for good, and for every allocation of the process, not only
 * hotkern's: hotkern never does it on its own in the application's process.
 * The build helper (options.build_isolated) always does it in its own,
 * whatever malloc settings it inherits.
 * Call it once, early (the demo does, and `hotkern check` of several
 * files); the first call decides, later ones return what it did. Any
 * thread (it reads the environment: not while another thread changes it).
 * Returns 1 when the setting is in place (by this call or an earlier one);
 * 0 when the environment sets malloc's thresholds itself (GLIBC_TUNABLES
 * with glibc.malloc tunables, MALLOC_TRIM_THRESHOLD_,
 * MALLOC_MMAP_THRESHOLD_ or MALLOC_TOP_PAD_: the process's own choice, left
 * as it is; rep says which); HK_ERR_IO when the allocator refused a setting
 * (rep says which; the others stay in place). A sanitizer's allocator may
 * refuse it (AddressSanitizer's does) or accept it and ignore it
 * (ThreadSanitizer's). rep may be NULL. */
HK_API int hk_build_keep_memory(hk_report *rep);

/* The first layout ends at origin. */
typedef struct hk_swap_options {
    size_t size;                      /* set by hk_swap_options_init */
    hk_format format;                 /* default AUTO */
    const char *const *nvrtc_options; /* extra NVRTC options (-D, -I, -std...) */
    int nnvrtc_options;
    const char *const *name_expressions; /* e.g. "scale<float>": handles may
                                          * then use these names */
    int nname_expressions;
    const char *source_name;  /* for compiler messages, e.g. the path */
    int accept_layout_change; /* 1: a changed parameter layout is allowed */
    int carry_globals;        /* default 1: copy same-named globals */
    hk_stage_mode stage;      /* default HK_STAGE_AUTO */
    hk_check_cb check;        /* optional */
    const char *origin;       /* for events; default "api" */
    const hk_header *headers; /* in-memory headers for this build (copied);
                               * they hide the runtime's of the same name */
    int nheaders;
    hk_canary_policy canary;        /* default HK_CANARY_DEFAULT */
    uint64_t release_version;       /* the release this image belongs to (pushes
                                     * and pulls set it), kept with the image in the
                                     * last-known-good records; 0: none */
    hk_build_profile build_profile; /* default HK_BUILD_PROFILE_DEFAULT */
    double canary_slowdown_max;     /* this swap's perf guard (see
                                     * hk_options.canary_slowdown_max): 0
                                     * (default): the runtime's; > 0: this
                                     * ratio (on even where the runtime's is
                                     * off); < 0: off */
    double canary_slowdown_min_ms;  /* 0 (default): the runtime's; > 0: this
                                     * many ms; < 0: no floor */
} hk_swap_options;

/* As hk_options_init_size, for swap options. */
HK_API int hk_swap_options_init_size(hk_swap_options *o, size_t size);

static inline void hk_swap_options_init(hk_swap_options *o) {
    (void)hk_swap_options_init_size(o, sizeof *o);
}

/* Builds, stages, validates and commits a new version of module `name` from
 * `size` bytes at `image` (copied; the caller keeps ownership). The first
 * version of a name creates the module. Synchronous; safe from any thread;
 * swaps of one runtime are serialised. The build runs on the calling thread;
 * staging at a safe point (HK_STAGE_AT_SAFE_POINT, or HK_STAGE_AUTO in a
 * program that calls hk_safe_point) waits for the next hk_safe_point() on
 * another thread, up to options.safe_point_wait_ms, then stages at once.
 * HK_STAGE_AT_SAFE_POINT from the thread that calls hk_safe_point returns
 * HK_ERR_INVALID (it would wait for itself).
 * A module name is 1 to 63 bytes of UTF-8 without control characters (C0,
 * DEL, C1) or line separators (U+2028, U+2029): anything else is refused
 * with HK_ERR_INVALID before any build, since the name goes unchanged into
 * records, logs, metrics and events (the network endpoint takes names of
 * [A-Za-z0-9_.-] only, a subset).
 * On failure the running version is untouched and rep says why.
 * On success rep->version is the new version number (monotonic per module). */
HK_API int hk_swap(hk_runtime *rt, const char *name, const void *image, size_t size,
                   const hk_swap_options *opt, hk_report *rep);

/* As hk_swap, but returns at once: a worker thread builds the version, then
 * stages and commits it (HK_STAGE_NOW, or AUTO before any safe point) or
 * leaves it for hk_safe_point().
 * The outcome arrives through on_event. Safe from any thread. */
HK_API int hk_submit(hk_runtime *rt, const char *name, const void *image, size_t size,
                     const hk_swap_options *opt);

/* Performs the driver work of every built, pending version and commits it,
 * and unloads the versions those commits replaced at an earlier safe point.
 * Call it where the application's GPU work is idle (e.g. right after the
 * per-frame synchronize): code uploaded or unloaded then costs running threads
 * nothing, while uploading code into a busy context waits for all its work and
 * stalls every launching thread meanwhile. Never synchronises the GPU itself.
 * Returns the number of versions committed (refusals are reported through
 * on_event), or HK_ERR_BUSY from a check callback. Safe from any thread. */
HK_API int hk_safe_point(hk_runtime *rt);

/* Waits until every submitted version has been committed or refused (pending
 * safe-point versions excepted) and returns 0, or HK_ERR_TIMEOUT; HK_ERR_BUSY
 * at once when called on the worker thread (from one of its events). */
HK_API int hk_wait_idle(hk_runtime *rt, int timeout_ms);

/* Commits the previous kept image of `name` again, as a new version number.
 * Safe from any thread. */
HK_API int hk_rollback(hk_runtime *rt, const char *name, hk_report *rep);

/* Current version number of a module (0 when it has none). */
HK_API uint64_t hk_module_version(hk_runtime *rt, const char *name);

/* The release (hk_swap_options.release_version; 0 for an image that has
 * none) of module `name`'s image `back` steps back in its kept history: 0
 * the image it runs, 1 the one hk_rollback would commit, and so on. A
 * rollback commits an image with its release. Returns 0, HK_ERR_NOT_FOUND
 * when the module has no version, HK_ERR_NO_HISTORY when fewer images are
 * kept, HK_ERR_INVALID. Safe from any thread. */
HK_API int hk_module_release(hk_runtime *rt, const char *name, int back, uint64_t *release_version);

/* As hk_rollback, but only when the image it would commit belongs to release
 * `release_version` (what hk_module_release(rt, name, 1, ...) reports):
 * otherwise HK_ERR_REJECTED and nothing changes. The check and the rollback
 * are one step: no commit from another source comes between them. Safe from
 * any thread. */
HK_API int hk_rollback_release(hk_runtime *rt, const char *name, uint64_t release_version,
                               hk_report *rep);

/* Device address and size of the __device__ or __constant__ variable `name`
 * in the current version of `module`, in device slot `device_slot`'s context
 * (cast the address to CUdeviceptr). Valid until the module's next commit.
 * Safe from any thread. */
HK_API int hk_module_global(hk_runtime *rt, const char *module, const char *name, int device_slot,
                            uint64_t *dptr, size_t *size);

/* ---- checking without a GPU -------------------------------------------- */

/* A swap's build on its own, for `hotkern check`, CI pipelines and editors:
 * a source (CUDA C, PTX, cubin or fatbin) is compiled and validated for one
 * architecture as hk_swap builds it (NVRTC, nvJitLink, the PTX, cubin and
 * fatbin parsers, the architecture rule), and what a version made of it
 * would hold is listed: its kernels with their parameter layouts, its
 * globals, the architectures it has code for. Nothing here loads or calls
 * the CUDA driver: no device, no libcuda and no hk_runtime are needed, so
 * it works where hk_runtime_create fails (a CI machine without a GPU). No
 * compile cache is used: every check compiles.
 *
 * hk_check checks one source. A program that checks several sources with
 * the same options creates an hk_checker once and checks each with it: the
 * options, the in-memory headers and the include search path are then
 * taken in once, and its CUDA C builds use NVRTC's automatic precompiled
 * header (which NVRTC keeps for the process), made by the first build and
 * reused by every later one whose opening toolkit includes and options are
 * the same. As in a swap, the precompiled header covers the toolkit's
 * headers only; each source's own includes are read at each check, so a
 * header edited between two checks is seen. */

/* The first layout is the whole structure as first published (it ends at
 * source_name). */
typedef struct hk_check_options {
    size_t size;                      /* set by hk_check_options_init */
    int arch;                         /* the target: 90 for sm_90 (compute
                                       * capability 9.0), 10 to 9999; no
                                       * default (0 is refused) */
    int arch_specific;                /* 1: its architecture-specific
                                       * variant (sm_90a), which runs on
                                       * that architecture only; default 0 */
    hk_format format;                 /* default AUTO: from the content */
    hk_ptx_mode ptx_mode;             /* HK_PTX_NVJITLINK (default): CUDA C
                                       * and PTX become a cubin, as a
                                       * runtime's default builds them;
                                       * HK_PTX_DRIVER_JIT: CUDA C becomes
                                       * PTX and PTX is only parsed, what
                                       * such a runtime hands the driver */
    int jit_opt_level;                /* 0..4, default 4 (as hk_options') */
    hk_build_profile build_profile;   /* default RELEASE (DEV: as in a
                                       * swap with that profile) */
    const char *const *nvrtc_options; /* extra NVRTC options (-D, -I,
                                       * -std...), as in hk_swap_options */
    int nnvrtc_options;
    const char *const *name_expressions; /* e.g. "scale<float>": template kernels
                                          * to instantiate */
    int nname_expressions;
    const hk_header *headers; /* in-memory headers (copied), as in
                               * hk_swap_options */
    int nheaders;
    const char *source_name; /* hk_check's source: the path, for compiler
                              * messages and for the directory its quoted
                              * includes are looked for in; default
                              * "input.cu" ("input.ptx"), in the current
                              * directory */
} hk_check_options;

/* As hk_options_init_size, for check options. */
HK_API int hk_check_options_init_size(hk_check_options *o, size_t size);

static inline void hk_check_options_init(hk_check_options *o) {
    (void)hk_check_options_init_size(o, sizeof *o);
}

/* What a check found. Opaque and immutable: its accessors may be called from
 * any thread; it does not depend on the checker that made it. */
typedef struct hk_check_result hk_check_result;
/* Options and state for checking many sources (see above). */
typedef struct hk_checker hk_checker;

/* The format of `size` bytes at `data` as hk_swap's and hk_check's
 * HK_FORMAT_AUTO finds it. Returns 0 with *fmt; HK_ERR_FORMAT, rep (may be
 * NULL) saying why ("empty input", "truncated ELF header" ...);
 * HK_ERR_INVALID. Safe from any thread. */
HK_API int hk_format_detect(const void *data, size_t size, hk_format *fmt, hk_report *rep);

/* Checks `size` bytes at `src` (read during the call only) with options opt,
 * on the calling thread. Returns 0 with *out set: the caller's,
 * hk_check_result_free. On failure *out is NULL and rep says why: its
 * message the reason (for CUDA C the compiler's first error line; for a
 * refused architecture what the image has and what the target is: "cubin is
 * sm_80, target is sm_90"), its log the compiler's or nvJitLink's whole log.
 * Codes: HK_ERR_INVALID (options: opt NULL, a size below the first layout, an
 * arch out of range, negative counts, NULL arrays or entries; a NULL src with
 * a size), HK_ERR_FORMAT (not a kernel source or image, or a malformed one),
 * HK_ERR_COMPILE (NVRTC or nvJitLink refused it), HK_ERR_ARCH (no code for
 * the target: a cubin for another architecture, PTX for a newer one),
 * HK_ERR_NOMEM. On success rep (may be NULL) is empty but for build_ms and
 * total_ms; the compiler's warnings are in hk_check_result_log.
 * Safe from any thread. */
HK_API int hk_check(const hk_check_options *opt, const void *src, size_t size,
                    hk_check_result **out, hk_report *rep);

/* Takes opt in (copied: arrays, strings and headers) for checks of many
 * sources. Returns 0 with *out (the caller's: hk_checker_destroy);
 * HK_ERR_INVALID as hk_check, rep saying what; HK_ERR_NOMEM. */
HK_API int hk_checker_create(hk_checker **out, const hk_check_options *opt, hk_report *rep);

/* hk_check with c's options; source_name replaces the options' (NULL: theirs).
 * A check gives the same result, or the same refusal, as hk_check with the
 * same options would. c is not changed by a check: checks on several threads
 * may use one checker at once. */
HK_API int hk_checker_check(hk_checker *c, const char *source_name, const void *src, size_t size,
                            hk_check_result **out, hk_report *rep);

/* Frees c; its results stay valid. c may be NULL. No check may be running on it. */
HK_API void hk_checker_destroy(hk_checker *c);

/* Frees r (every pointer it handed out goes with it). r may be NULL. */
HK_API void hk_check_result_free(hk_check_result *r);

/* The source's format (detected, or the options'). */
HK_API hk_format hk_check_result_format(const hk_check_result *r);

/* The loadable image the check built: what a swap of the source would load
 * (a cubin, or PTX with HK_PTX_DRIVER_JIT, NUL-terminated and counted in
 * *size; a cubin or fatbin given is passed through). *size and *format may
 * be NULL. Valid while r lives. */
HK_API const void *hk_check_result_image(const hk_check_result *r, size_t *size, hk_format *format);

/* The compiler's and nvJitLink's log of a build that succeeded (its
 * warnings), or NULL when there was none. Valid while r lives. */
HK_API const char *hk_check_result_log(const hk_check_result *r);

/* The kernels (entry points) of the image, in the image's order: those of
 * PTX and of a cubin; a fatbin's are those of its members stored plain
 * (its cubins, as nvcc writes them, and PTX that is not compressed),
 * merged by name in the order met. */
HK_API int hk_check_result_kernel_count(const hk_check_result *r);

/* Kernel i: its entry name (the mangled one for C++ names) in *name, and,
 * when offsets and sizes are not NULL, its parameter layout as
 * hk_kernel_require_layout takes it: parameter j is sizes[j] bytes at byte
 * offset offsets[j]. Returns the number of parameters (>= 0), or
 * HK_ERR_NOT_FOUND for i out of range, HK_ERR_INVALID. The pointers are
 * valid while r lives. */
HK_API int hk_check_result_kernel(const hk_check_result *r, int i, const char **name,
                                  const size_t **offsets, const size_t **sizes);

/* The __device__ and __constant__ variables of the image (PTX and cubin, as
 * kernels): global i's name, size in bytes (may be NULL)
 * and whether it is __constant__ (may be NULL). Returns 0, HK_ERR_NOT_FOUND
 * for i out of range, HK_ERR_INVALID. */
HK_API int hk_check_result_global_count(const hk_check_result *r);
HK_API int hk_check_result_global(const hk_check_result *r, int i, const char **name,
                                  uint64_t *size, int *is_const);

/* The architectures the image has code for: "sm_90" (or "sm_90a") for
 * machine code, "compute_90" for PTX; a fatbin's machine code first, then
 * its PTX. Architecture i (valid while r lives), or NULL for i out of
 * range. */
HK_API int hk_check_result_arch_count(const hk_check_result *r);
HK_API const char *hk_check_result_arch(const hk_check_result *r, int i);

/* ---- kernels and launches ---------------------------------------------- */

/* Takes the handle of kernel `kernel` in module `module`. The name is the
 * kernel's entry name, or a name expression given at build time. The module's
 * current version must contain it. From then on every version of the module
 * must contain it with the same parameter layout (unless accept_layout_change).
 * Handles are owned by the runtime and valid until hk_runtime_destroy; taking
 * the same name twice returns the same handle. Safe from any thread. */
HK_API int hk_kernel_get(hk_runtime *rt, const char *module, const char *kernel, hk_kernel **out);

/* Requires k's parameter layout to be exactly n parameters, parameter i of
 * sizes[i] bytes at byte offset offsets[i], now and in every later version
 * (for callers that pass arguments laid out at compile time: hotkern.hpp,
 * the <<<>>> interposition). Returns 0 when the current version has that
 * layout; from then on a version with another is refused with
 * HK_ERR_LAYOUT, accept_layout_change or not. Returns HK_ERR_LAYOUT, the
 * report naming the kernel and the first difference, when it does not (the
 * handle is unchanged); HK_ERR_INVALID for bad arguments. Safe from any
 * thread; not from a check callback (HK_ERR_BUSY). */
HK_API int hk_kernel_require_layout(hk_kernel *k, const size_t *offsets, const size_t *sizes, int n,
                                    hk_report *rep);

/* Frozen: passed by value, it never grows. */
typedef struct hk_dim3 {
    unsigned x, y, z;
} hk_dim3;

/* Launches the current version of k, exactly like cuLaunchKernel with
 * kernelParams = args. stream is a cudaStream_t / CUstream (NULL = default
 * stream); with the library loader the context is the stream's (or, for NULL,
 * the calling thread's current context). Safe from any thread; no lock, no
 * allocation. Returns 0, or HK_ERR_CUDA with the CUresult in *cu_result when
 * cu_result is not NULL.
 * Launch gate: while a swap or an unload needs the driver (typically well
 * under a millisecond), launches wait here, at most
 * options.launch_hold_max_us; without it the driver would let continuous
 * launches starve every load. A launch released then waits in the driver
 * for the load or unload in progress, which may itself wait for work queued
 * on the GPU; a closing longer than the hold and than any before is logged
 * (info, "engine") with what it did.
 * Stream capture: a launch into a capturing stream is recorded in the
 * application's graph with the version current at that moment; that version
 * stays loaded until the graph and every exec instantiated from it are
 * destroyed (a CUDA user object holds it), so the graph never runs unloaded
 * code. To have the graph follow swaps instead, register its node with
 * hk_graph_register.
 * After a context reset a launch may fail once (HK_ERR_CUDA); hotkern's own
 * thread recovers, never the launching one. */
HK_API int hk_launch(hk_kernel *k, hk_dim3 grid, hk_dim3 block, unsigned shared_bytes, void *stream,
                     void **args, int *cu_result);

/* Pins the current version of module `module`: launches through the pin all
 * run that version, even if newer ones are committed meanwhile; its code is not
 * unloaded before hk_unpin. Safe from any thread. */
HK_API int hk_pin_module(hk_runtime *rt, const char *module, hk_pin **out);
HK_API int hk_launch_pinned(hk_pin *p, hk_kernel *k, hk_dim3 grid, hk_dim3 block,
                            unsigned shared_bytes, void *stream, void **args, int *cu_result);
HK_API uint64_t hk_pin_version(const hk_pin *p);
/* Releases the pin; p is invalid afterwards. p may be NULL. */
HK_API void hk_unpin(hk_pin *p);

/* The CUfunction of k's current version in the calling thread's current
 * context (device slot 0's when the thread has none), for code that launches
 * by itself (valid until the next commit of its module plus one reclaim
 * cycle: prefer hk_launch or a pin). Safe from any thread; it does not wait
 * for launches in progress. */
HK_API int hk_kernel_function(hk_kernel *k, void **cufunction);

/* ---- kernel attributes and extended launches ---------------------------- */

/* Sets attribute `attribute` (a CUfunction_attribute, e.g.
 * CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
 * CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, the REQUIRED_CLUSTER_*
 * and NON_PORTABLE_CLUSTER_SIZE_ALLOWED attributes) to `value` on k's current
 * version, on every device, and keeps it: every later version gets it before
 * it is committed, and a version that cannot take it (say its static shared
 * memory plus the requested dynamic size exceeds the device's limit) is
 * refused with HK_ERR_ATTRIBUTE, the old version running on. Setting it on the
 * current version can fail the same way; nothing is kept then. rep (may be
 * NULL) says why. Safe from any thread; HK_ERR_BUSY from a check callback. */
HK_API int hk_kernel_set_attribute(hk_kernel *k, int attribute, int value, hk_report *rep);

/* The same for the preferred cache configuration (a CUfunc_cache). */
HK_API int hk_kernel_set_cache_config(hk_kernel *k, int config, hk_report *rep);

/* A launch with the options of cuLaunchKernelEx. Initialise with
 * hk_launch_config_init (it sets size, so fields can be added later). Its
 * first layout is the whole 1.0 structure. */
typedef struct hk_launch_config {
    size_t size;                    /* sizeof(hk_launch_config), set by init */
    hk_dim3 grid, block;            /* default 1,1,1 */
    unsigned shared_bytes;          /* dynamic shared memory */
    void *stream;                   /* CUstream / cudaStream_t, NULL: default stream */
    hk_dim3 cluster;                /* thread-block cluster; 0,0,0 (default): none */
    int cooperative;                /* 1: a cooperative launch (grid-wide sync) */
    int programmatic_serialization; /* 1: programmatic stream serialization */
    int priority;                   /* launch priority when has_priority */
    int has_priority;
} hk_launch_config;

/* As hk_options_init_size, for launch configurations. */
HK_API int hk_launch_config_init_size(hk_launch_config *c, size_t size);

static inline void hk_launch_config_init(hk_launch_config *c) {
    (void)hk_launch_config_init_size(c, sizeof *c);
}

/* Launches k's current version with cuLaunchKernelEx and c's options, with
 * hk_launch's guarantees (epochs, the launch gate, stream capture), and no
 * allocation. Returns 0, HK_ERR_INVALID for a size below the first layout, or
 * HK_ERR_CUDA with the CUresult in *cu_result. */
HK_API int hk_launch_ex(hk_kernel *k, const hk_launch_config *c, void **args, int *cu_result);

/* ---- CUDA graphs ------------------------------------------------------- */

/* Registers kernel node `node` (CUgraphNode) of the instantiated graph `exec`
 * (CUgraphExec) as launching k: on every commit of k's module the node is
 * pointed at the new version before the old one is unloaded. Launch the graph
 * with hk_graph_launch so no commit updates it mid-launch (graph launches
 * take a lock that commits take for writing, writers first, so neither can
 * starve the other). Register and unregister return HK_ERR_BUSY from a check
 * callback. */
HK_API int hk_graph_register(hk_runtime *rt, void *exec, void *node, hk_kernel *k);
HK_API int hk_graph_unregister(hk_runtime *rt, void *exec);
HK_API int hk_graph_launch(hk_runtime *rt, void *exec, void *stream, int *cu_result);

/* ---- canary runs ------------------------------------------------------- */

/* A kernel that faults (illegal address, trap) leaves the CUDA error sticky
 * for the whole process: every later CUDA call fails and the application's
 * buffers are gone; a kernel stuck in a loop holds its stream for good. So
 * before a version commits, the launches the application declared for its
 * kernels can run in a canary process: `hotkern-canary`, a helper hotkern
 * starts (options.canary) with a CUDA context of its own on the runtime's
 * first device. Each declared launch runs on the new version; a fault (its
 * CUresult name), a launch that outlives options.canary_timeout_ms (the
 * helper is killed, and started again) or, when the test compares, outputs
 * that differ from the running version's on the same inputs, refuse the
 * version with HK_ERR_CANARY; the report names the kernel and what happened,
 * and the running version goes on. The run happens on the thread that built
 * the version (the caller of hk_swap, or the worker), holding no lock that
 * launches or other hotkern calls wait for, between build and stage.
 * Rollbacks run no canary (they return to a version that ran).
 *
 * Perf guard (hk_options.canary_slowdown_max, _min_ms; per swap in
 * hk_swap_options): a test launch that passed is repeated, once untimed and
 * five times between CUDA events, on the new version and on the running one
 * with the same inputs; a version whose median GPU time is more than 4x the
 * running version's and more than 1 ms longer (the defaults) is refused as
 * "slower", with both times in the report (canary_new_ms, canary_old_ms).
 * With no running version the new one is timed, said so, and not refused.
 *
 * Memcheck (hk_options.canary_sanitizer): where the toolkit's
 * compute-sanitizer is found, each test launch of the new version first runs
 * in a second helper under `compute-sanitizer --tool memcheck`, which catches
 * out-of-bounds and misaligned accesses before they fault the GPU (a fault's
 * recovery stalls every context on it) and those that land in valid memory
 * (which a plain run misses); an error it reports refuses the version as
 * "memcheck" with its first error line.
 *
 * Trap guard: a version built from CUDA C or PTX whose traps (__trap()),
 * failed device-side asserts or breakpoints would end the helper's context
 * (an imprecise error: the GPU's recovery stalls every context on it, the
 * application's too) is tested as a copy in which each of them stores
 * where it was and ends its thread instead; a test launch that reaches one
 * refuses the version as a "fault" saying which, and what commits is the
 * version's own image (built, where a copy is made, by the same nvJitLink
 * link as the copy, so the two differ at those sites alone). Cubins and
 * fatbins are not guarded.
 * hk_stats and the metrics count runs, refusals by kind, helper starts and
 * the time spent. */

/* A test launch under construction: grid, block, dynamic shared memory and
 * the kernel's arguments in order. Opaque; not thread-safe. */
typedef struct hk_test hk_test;

/* How a test buffer is filled before the launch. */
typedef enum hk_fill {
    HK_FILL_ZERO = 0,
    HK_FILL_BYTE = 1,     /* every byte = param & 0xff */
    HK_FILL_RANDOM = 2,   /* pseudo-random bytes from seed param */
    HK_FILL_IOTA_I32 = 3, /* int32 i + param at element i */
    HK_FILL_IOTA_F32 = 4, /* float i + param at element i */
    HK_FILL_HOST = 5,     /* a copy of the caller's bytes */
} hk_fill;

/* How the buffers after the launch are compared with the running version's
 * on the same inputs. */
typedef enum hk_compare {
    HK_COMPARE_NONE = 0,  /* only faults and hangs refuse (default) */
    HK_COMPARE_EXACT = 1, /* byte for byte */
    HK_COMPARE_F32 = 2,   /* as floats: |new - old| <= atol + rtol * |old|;
                           * NaN equals only NaN */
    HK_COMPARE_F64 = 3,   /* as doubles, likewise */
} hk_compare;

/* Makes a test launch with no arguments yet. *out is the caller's:
 * hk_test_destroy. Returns 0, HK_ERR_INVALID (a zero dimension) or
 * HK_ERR_NOMEM. */
HK_API int hk_test_create(hk_test **out, hk_dim3 grid, hk_dim3 block, unsigned shared_bytes);
/* Frees t; t may be NULL. */
HK_API void hk_test_destroy(hk_test *t);
/* Appends an argument passed by value: `size` bytes at `value` (copied),
 * 1..4096. */
HK_API int hk_test_scalar(hk_test *t, const void *value, size_t size);
/* Appends a device buffer of `bytes` bytes (the kernel gets its address),
 * filled as `fill` says: `param` is the byte value or the seed; `host`
 * (bytes long, copied) is read for HK_FILL_HOST only. A test's buffers hold
 * at most 64 MiB together. */
HK_API int hk_test_buffer(hk_test *t, size_t bytes, hk_fill fill, uint64_t param, const void *host);
/* After the launch, compares every buffer with the running version's run of
 * the same test (skipped for a module's first version). */
HK_API int hk_test_compare(hk_test *t, hk_compare mode, double atol, double rtol);

/* Declares t (copied; the caller keeps it) as a test launch of k: every
 * later version of k's module runs it in the canary before commit (as its
 * swap's canary policy says). At most 16 per kernel. Safe from any thread;
 * does not wait for a running canary or swap. */
HK_API int hk_kernel_add_test(hk_kernel *k, const hk_test *t, hk_report *rep);
/* Removes k's test launches. Safe from any thread. */
HK_API int hk_kernel_clear_tests(hk_kernel *k);

/* ---- last known good ---------------------------------------------------- */

/* A kernel that faults leaves the CUDA error sticky for the whole process:
 * the process must restart. hotkern remembers, per module, which image was
 * running and which one last ran cleanly, so that the restarted process comes
 * up on that one, without the network, and refuses the image that faulted.
 *
 * Context lost. When a launch through hotkern (hk_launch, hk_launch_ex,
 * hk_launch_pinned, hk_graph_launch), a synchronise hotkern does, or a call
 * of hk_runtime_note_error returns a sticky error (CUDA_ERROR_ILLEGAL_ADDRESS,
 * _LAUNCH_FAILED, _ILLEGAL_INSTRUCTION, _MISALIGNED_ADDRESS, _INVALID_PC,
 * _HARDWARE_STACK_ERROR, _INVALID_ADDRESS_SPACE, _ASSERT, _LAUNCH_TIMEOUT,
 * _ECC_UNCORRECTABLE, _CONTAINED, _TENSOR_MEMORY_LEAK), the runtime, once:
 * - promotes each module's current version to known good when it has been
 *   current for options.suspect_window_ms;
 * - quarantines, per module, every image committed within the last
 *   suspect_window_ms except the module's known-good one (a fault is
 *   reported late and by no kernel in particular, so every recent commit is
 *   suspect, and only those);
 * - writes the records (the quarantine and the promotions), logs the loss
 *   (error) and emits HK_EVENT_CONTEXT_LOST on the thread that saw the
 *   error: a program may end in its handler.
 * A version also becomes known good when it is replaced or the runtime is
 * destroyed after it was current for suspect_window_ms.
 *
 * Kept images. With options.state_dir, every committed image (as built:
 * cubin, fatbin or PTX) is written to STATE_DIR/images/HASH (BLAKE2b-256 of
 * the image, hex; temp file and rename), and each module's record,
 * STATE_DIR/modules/NAME.rec (a line-based text, replaced atomically), names
 * its current image, its known-good image (with its name expressions) and
 * its quarantined images, with their release versions when known
 * (hk_swap_options.release_version). A record names its module inside and
 * an image must hash to its file name. Only the images a record names (in
 * memory, or on disk) stay, about two per module; a damaged record keeps
 * the images it mentions until its module writes a new one, and a write
 * that failed is tried again at the module's next commit (a record is never
 * written before the images it names). At most 32 quarantined hashes are
 * kept per module (the oldest go). Disk work happens on the committing
 * thread after it released the engine's swap lock (so hk_module_version and
 * other swaps do not wait for the disk), before the commit's event, and
 * never on the launch path (a lost context writes on the thread that saw
 * it). When hk_runtime_destroy stops waiting for the GPU, the directory is
 * unlocked before it returns, so a new runtime can use it at once.
 *
 * Trust. What the directory holds decides what restore runs, so it is used
 * only when no other local user can change it, as OpenSSH's StrictModes
 * checks: it and its files belong to the process's effective user and are
 * writable by nobody else, and every directory above it belongs to that
 * user or root and is writable by nobody else unless sticky (/tmp).
 * hk_runtime_create fails with HK_ERR_IO, the report naming the path and
 * what is wrong. Files in it are opened without following links: a link in
 * the place of `lock`, `images`, a record or an image is refused, never
 * followed; a record or image that another user could have written is not
 * restored (the report says why).
 *
 * Quarantine. An image quarantined for a module is refused by hk_swap,
 * hk_submit, pushes and pulls of that module with HK_ERR_QUARANTINED (the
 * report names the image and the release); a different image is accepted. */

/* Comes up on the last known good version of every module recorded in
 * options.state_dir: each image is read, checked against its hash, and
 * committed (origin "restore", no canary run: it ran) unless the module
 * already runs it. A record that cannot be read (truncated, garbage, an
 * image missing or altered) is skipped, and the report's message names it;
 * the others are restored. Returns the number of modules restored (>= 0),
 * HK_ERR_INVALID, or HK_ERR_UNSUPPORTED without a state directory. Safe from
 * any thread; not from a callback of rt. */
HK_API int hk_runtime_restore(hk_runtime *rt, hk_report *rep);

/* Tells rt about a CUresult the application got from its own CUDA calls
 * (cudaDeviceSynchronize, cudaMemcpy ...): a sticky error is handled as
 * above (once). Returns 1 when cu_result is a sticky error, else 0. Safe from
 * any thread, not from a callback of rt; it writes files only the first
 * time. */
HK_API int hk_runtime_note_error(hk_runtime *rt, int cu_result);

/* One quarantined image. Initialise with HK_QUARANTINE_INIT or
 * hk_quarantine_init; the first layout is the whole 1.0 structure. */
typedef struct hk_quarantine {
    size_t size;
    char module[64];
    char image[65];           /* BLAKE2b-256 of the image, hex */
    uint64_t release_version; /* 0 when unknown */
    uint64_t version;         /* the engine's version number it had, 0 when
                               * quarantined by an earlier process */
} hk_quarantine;

#define HK_QUARANTINE_INIT HK_SIZED_INIT(hk_quarantine)

static inline void hk_quarantine_init(hk_quarantine *q) {
    memset(q, 0, sizeof *q);
    q->size = sizeof *q;
}

/* The index-th quarantined image of rt (modules in name order, oldest
 * first), written within out->size. Returns 0, HK_ERR_NOT_FOUND past the
 * last, HK_ERR_INVALID. Safe from any thread. */
HK_API int hk_quarantine_get(hk_runtime *rt, int index, hk_quarantine *out);

/* The known-good image of `module` (hex into hash, 65 bytes) and its release
 * version (may be NULL). Returns 0, HK_ERR_NOT_FOUND when the module has
 * none, HK_ERR_INVALID. Safe from any thread. */
HK_API int hk_module_known_good(hk_runtime *rt, const char *module, char hash[65],
                                uint64_t *release_version);

/* ---- counters ---------------------------------------------------------- */

/* The first layout ends at last_swap_ms. */
typedef struct hk_stats {
    size_t size;    /* set by HK_STATS_INIT / hk_stats_init */
    uint64_t swaps; /* versions committed (rollbacks included) */
    uint64_t rollbacks;
    uint64_t refused;
    uint64_t reclaimed;     /* old versions unloaded */
    uint64_t live_versions; /* versions whose code is loaded now */
    uint64_t context_resets;
    uint64_t cache_hits, cache_misses;
    double build_ms_total, stage_ms_total, commit_ms_total;
    double last_swap_ms;           /* total_ms of the last commit */
    uint64_t retired_loaded;       /* replaced versions still loaded: waiting for
                                    * launches, pins, captured graphs, their GPU work
                                    * or a safe point */
    uint64_t gate_closes;          /* times the launch gate closed */
    double gate_closed_max_ms;     /* longest it stayed closed */
    uint64_t launch_hold_timeouts; /* launches that waited launch_hold_max_us
                                    * at the gate and then went on */
    uint64_t canary_runs;          /* versions whose tests ran in the canary */
    uint64_t canary_refused;       /* versions the canary refused */
    uint64_t canary_helper_starts; /* canary helper processes started (the
                                    * first, and one after each fault, hang
                                    * or death) */
    uint64_t context_lost;         /* sticky CUDA errors seen (0 or 1: the
                                    * first one ends the context) */
    uint64_t quarantined;          /* images quarantined now, all modules */
    /* The canary's refusals by kind (hk_report.canary_refusal); they add
     * up to canary_refused. */
    uint64_t canary_refused_fault, canary_refused_hang, canary_refused_mismatch;
    uint64_t canary_refused_slower, canary_refused_memcheck, canary_refused_could_not_run;
    double canary_ms_total;    /* time spent in canary runs */
    double canary_last_new_ms; /* the last timed run's figures, as
                                * hk_report.canary_new_ms and canary_old_ms;
                                * 0: none yet */
    double canary_last_old_ms;
    uint64_t canary_sanitizer;  /* 1: test launches run under memcheck first */
    uint64_t program_fallbacks; /* launches of a program's kernel that failed in
                                 * the hot version and ran the program's own
                                 * code (HK_EVENT_FALLBACK) */
} hk_stats;

#define HK_STATS_INIT HK_SIZED_INIT(hk_stats)

static inline void hk_stats_init(hk_stats *s) {
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
}

/* Snapshot of the counters into out, within out->size (set it with
 * HK_STATS_INIT or hk_stats_init). Returns 0, or HK_ERR_INVALID for a NULL
 * argument or a size below the first layout (nothing written). Safe from any
 * thread. */
HK_API int hk_stats_get(hk_runtime *rt, hk_stats *out);

/* Waits until every retired version is unloaded, or timeout_ms passes.
 * Versions replaced at a safe point are unloaded at the next one, so this
 * waits for that too; a version pinned, or held by a graph captured from
 * hk_launch, waits for its pin or graph. Returns 0 or HK_ERR_TIMEOUT;
 * HK_ERR_BUSY at once on hotkern's reclaim thread (from a RECLAIMED event). */
HK_API int hk_reclaim_wait(hk_runtime *rt, int timeout_ms);

/* ---- logs -------------------------------------------------------------- */

/* hk_log_level, hk_log_level_name and hk_log_cb: before hk_options, which
 * can name a log callback from the start. */

/* Sends rt's messages of min_level and above to cb; the runtime's network
 * sources (libhotkern-net) log through it too. cb NULL restores the default:
 * when the environment variable HOTKERN_LOG (read at hk_runtime_create) is
 * "debug", "info", "warn" or "error", messages of that level and above go to
 * stderr, one line each ("hotkern: LEVEL SUBSYSTEM: message"); otherwise
 * nothing is printed. When this returns, the previous callback is no longer
 * running and is not called again, so its userdata may be freed. Safe from
 * any thread; returns 0, HK_ERR_INVALID, or HK_ERR_BUSY from a log callback. */
HK_API int hk_runtime_set_log(hk_runtime *rt, hk_log_cb cb, void *userdata, hk_log_level min_level);

/* Starts queueing rt's events (every kind, from every thread; on_event, when
 * set, is still called): at most capacity wait (0: 256); when the queue is
 * full the oldest goes and the next event taken says how many went. Calling
 * it again changes nothing but returns 0. Safe from any thread; 0,
 * HK_ERR_INVALID or HK_ERR_NOMEM. */
HK_API int hk_events_queue(hk_runtime *rt, int capacity);

/* A descriptor (eventfd) that polls readable while events wait, for the
 * program's own poll/epoll loop; owned by rt (do not close it), valid until
 * hk_runtime_destroy. -1 before hk_events_queue. */
HK_API int hk_event_fd(hk_runtime *rt);

/* Takes the oldest queued event into *out (within out->size, as every sized
 * structure): returns 1, or 0 when none came within timeout_ms (0: do not
 * wait; < 0: wait for one). HK_ERR_INVALID without a queue or for a size
 * below the first layout; HK_ERR_CLOSED once destroy has begun (a taker
 * waiting then returns it, and destroy waits for it to leave). Safe from any
 * thread (each event goes to one taker). */
HK_API int hk_next_event(hk_runtime *rt, hk_queued_event *out, int timeout_ms);

/* 1 when a message of this level would be delivered now: lets a caller skip
 * building an expensive message. One atomic load; safe from any thread. */
HK_API int hk_log_enabled(hk_runtime *rt, hk_log_level level);

/* Formats a message (printf-style, on the stack: no allocation) and delivers
 * it as rt's own, when its level is enabled. For sources built on hotkern
 * (libhotkern-net logs this way) and for the application's messages about
 * its kernels. Safe from any thread; subsystem NULL means "app". */
HK_API void hk_log(hk_runtime *rt, hk_log_level level, const char *subsystem, const char *fmt, ...)
    HK_PRINTF(4, 5);

/* ---- metrics ----------------------------------------------------------- */

/* The Prometheus text exposition (format 0.0.4) of rt and of every source
 * attached to it: the engine's counters (hk_stats), a histogram of swap
 * durations (hotkern_swap_duration_seconds, fixed buckets from 0.25 ms to
 * 30 s), hotkern_build_info{version=...}, the watcher's counters
 * (hotkern_watch_*), and each endpoint's (hotkern_push_*, labelled
 * endpoint="ADDRESS:PORT") and puller's (hotkern_pull_*, labelled url="...").
 * Times are in seconds with at most six decimals, counts are integers: no
 * value carries binary floating-point noise. The text ends with a newline.
 *
 * hk_metrics_text writes it into buf (cap bytes, NUL-terminated) and returns
 * 0, or HK_ERR_TOO_LARGE when it needs more (buf then holds ""); *len (may be
 * NULL) receives the text's length without the NUL either way.
 * hk_metrics_text_alloc returns it in *out, malloc'd and NUL-terminated: the
 * caller frees it with free().
 * Safe from any thread, but not from a log callback or a metrics callback;
 * both return HK_ERR_INVALID for a NULL argument (or cap 0) and HK_ERR_NOMEM
 * when memory runs out. An endpoint's GET /metrics answers exactly this
 * text. */
HK_API int hk_metrics_text(hk_runtime *rt, char *buf, size_t cap, size_t *len);
HK_API int hk_metrics_text_alloc(hk_runtime *rt, char **out, size_t *len);

/* Sources built on hotkern add their metrics to rt's text with a callback.
 * The writer is valid during the callback only. */
typedef struct hk_metrics_writer hk_metrics_writer;
typedef struct hk_metrics_source hk_metrics_source;

/* Called from hk_metrics_text, on its caller's thread, with the runtime's
 * source lock held: it must take only its own locks and must call no hotkern
 * function besides hk_metrics_family and hk_metrics_sample. */
typedef void (*hk_metrics_cb)(hk_metrics_writer *w, void *userdata);

/* Declares a metric family: name [a-zA-Z_:][a-zA-Z0-9_:]*, type "counter",
 * "gauge" or "untyped", help one line (may be NULL). Declaring a family
 * already declared (by the engine or another source) adds to it: families
 * print once each, in the order first declared, with all their samples. */
HK_API void hk_metrics_family(hk_metrics_writer *w, const char *name, const char *type,
                              const char *help);

/* Adds a sample of family `name` (declared before) with an optional label
 * (label NULL: none; the value is escaped) after the source's own label.
 * A sample with a bad name, or of an undeclared family, is dropped. */
HK_API void hk_metrics_sample(hk_metrics_writer *w, const char *name, const char *label,
                              const char *label_value, uint64_t value);

/* Attaches cb to rt: every later hk_metrics_text calls it. When label is not
 * NULL, every sample cb writes carries label=label_value first (copied), so
 * that several sources of a kind (two pullers) make distinct series. On
 * success *out is the caller's: hk_metrics_detach() it before
 * hk_runtime_destroy. Safe from any thread; HK_ERR_INVALID for a bad label. */
HK_API int hk_metrics_attach(hk_runtime *rt, hk_metrics_cb cb, void *userdata, const char *label,
                             const char *label_value, hk_metrics_source **out);

/* Detaches and frees s; when it returns, s's callback is not running and is
 * not called again. s may be NULL. Not from a metrics callback. */
HK_API void hk_metrics_detach(hk_metrics_source *s);

/* ---- sources: watched directories ------------------------------------- */

/* What a watch does (hk_watch_start, hk_watch_dir)
 *
 * A file NAME.cu, NAME.ptx, NAME.cubin or NAME.fatbin of a watched directory
 * becomes module NAME (file name up to its first '.', at most 63
 * characters); headers (.h, .cuh, .hpp) are tracked as dependencies of the
 * sources that include them, and travel with each CUDA C build in memory, so
 * `#include <common.cuh>` works without -I. Every change is built and
 * submitted like hk_submit with the watch's swap options; unless their
 * format names one, the extension names the format and the content must
 * hold it. Outcomes arrive through options.on_event, with origin
 * "watch:PATH".
 *
 * When a save is built. A save that ends with the writer closing the file
 * (a write in place) or with a finished file renamed over it (vim, sed -i,
 * most editors' safe write) is read and submitted at once: no waiting
 * period. A file written and kept open, and every file after the kernel's
 * event queue overflowed, is read once it has been quiet for debounce_ms
 * (and, open for writing, until it is closed, or open_wait_ms have passed).
 * A read that a write overlapped is retried, so a half-written file is never
 * built.
 *
 * Newest content wins. Saves of a module in quick succession may each be
 * read and submitted; a save supersedes the earlier ones of the same module
 * that are not committed yet: one still waiting is never built, one being
 * built is not staged. Each superseded save ends with HK_EVENT_REFUSED and
 * HK_ERR_SUPERSEDED (logged at info), and an older content is never
 * committed after a newer one. A compile cannot be interrupted, so a save
 * during a build waits for it, then builds once however many saves came
 * meanwhile. When the newest save does not build, no earlier one commits
 * in its place: the running version stays.
 *
 * Refusals. Editor droppings (dotfiles, "*~", "*.swp", "*.swx", "*.tmp",
 * "4913", "#NAME#", sed -i's "sedXXXXXX") are ignored silently. Every other
 * file that cannot become a version gets one HK_EVENT_REFUSED per change, on
 * the watch's thread, with origin "watch:PATH" and a report whose message
 * names the file and says why;
 * the report never carries the file's content (only the log of a compiler that
 * was given a real source does). Refused: a module name of 64 characters or
 * more or one hk_swap refuses (see there), a file whose content is not its extension's format, an
 * empty file (looked at again after debounce_ms when it was just closed), one over 64 MiB, and
 * anything but a regular file: FIFOs, devices and sockets are never opened, and a procfs-like file
 * (0 bytes reported, content on reading) is read once, refused, and left alone until it changes. A
 * name with another extension is refused too, in a watch that is not recursive and has no
 * extensions list (hk_watch_dir's); otherwise it is ignored silently. Files
 * present when the watch starts are refused only if named as sources.
 *
 * Symbolic links: a link whose target resolves inside the watched directory
 * (or below it) is followed, and an edit of the target counts as an edit of
 * the link. A link whose target resolves outside is refused and its target is
 * never opened; a header linked from outside is given to the compiler as an
 * #error in its place, so an include of it fails, saying why, rather than
 * reading it. */

typedef struct hk_watch hk_watch;

/* The first layout is the whole structure as first published (it ends at
 * build_profile). */
typedef struct hk_watch_options {
    size_t size;                   /* set by hk_watch_options_init */
    int debounce_ms;               /* quiet period of the fallback path (a file
                                    * written and kept open, the listing after
                                    * an event queue overflow); default 50. A
                                    * completed save never waits for it */
    int open_wait_ms;              /* how long a file still open for writing is
                                    * waited for before it is read anyway;
                                    * default 1000 */
    int recursive;                 /* 1: subdirectories at any depth too,
                                    * including those created or moved in later;
                                    * not those whose name starts with '.'
                                    * (.git), nor links to directories. A module
                                    * is named by its file name alone: two files
                                    * of one name in different subdirectories
                                    * feed the same module. Default 0 */
    const char *const *extensions; /* the module sources this watch builds:
                                    * any of "cu", "ptx", "cubin", "fatbin"
                                    * (no dot, any case); other sources are
                                    * ignored silently. NULL (default): all */
    int nextensions;
    const hk_swap_options *swap;    /* the swap options of every submission
                                     * (copied, arrays included): canary policy,
                                     * NVRTC options, headers, check callback...;
                                     * its source_name and origin are replaced by
                                     * the file's. NULL: the defaults */
    hk_build_profile build_profile; /* the profile of this watch's builds;
                                     * DEFAULT (default): swap->build_profile,
                                     * itself RELEASE by default. A development
                                     * loop wants HK_BUILD_PROFILE_DEV */
} hk_watch_options;

/* As hk_options_init_size, for watch options. */
HK_API int hk_watch_options_init_size(hk_watch_options *o, size_t size);

static inline void hk_watch_options_init(hk_watch_options *o) {
    (void)hk_watch_options_init_size(o, sizeof *o);
}

/* Watches directory dir with inotify, on a thread of this watch's own, and
 * submits its kernels to rt as "What a watch does" says; opt NULL means the
 * defaults. The files present now are built once (the CUDA C ones in the
 * background, like any submission). Options are copied.
 * Returns 0 with *out set; HK_ERR_INVALID (arguments, an unknown extension,
 * an options size below the first layout); HK_ERR_IO when dir is not a
 * reachable directory or inotify refuses it (the report says why);
 * HK_ERR_BUSY when a watch of rt already covers dir, or, recursive, would
 * cover one: the same directory, one inside a recursive watch, or one that a
 * recursive dir would contain (each file is watched once; stop the other
 * watch first); HK_ERR_NOMEM. On failure the report says why and *out is
 * NULL.
 * Ownership: *out is the caller's, for hk_watch_stop. hk_runtime_destroy
 * stops and frees every watch still running: a handle is invalid once the
 * runtime is destroyed, and must not be stopped then.
 * Safe from any thread, event callbacks included. */
HK_API int hk_watch_start(hk_runtime *rt, const char *dir, const hk_watch_options *opt,
                          hk_watch **out, hk_report *rep);

/* Stops w and frees it. When it returns, the watch reads no file, submits
 * nothing and calls no callback any more: a callback of its thread in
 * progress (a refusal event, a log line, a submission) is waited for; w is
 * invalid. Submissions it made before are the engine's: they complete, and
 * their outcomes arrive, like any hk_submit (hk_wait_idle waits for them).
 * From an event callback that runs on w's own thread (a refusal of this
 * watch), it cannot wait for itself: w stops when that callback returns,
 * and its memory is freed with the runtime. w may be NULL. Safe from any
 * thread; not twice for one watch. */
HK_API void hk_watch_stop(hk_watch *w);

/* Watches dir (not recursive), with every other default of hk_watch_options
 * and the swap options opt (copied; NULL: defaults), on the runtime's one
 * shared watch: however many directories are added this way, they share one
 * thread, and they are watched until hk_runtime_destroy. Adding a directory
 * again through this call replaces its swap options (the running watch
 * goes on; nothing is built again); a directory covered by a watch of
 * hk_watch_start is refused with HK_ERR_BUSY. Otherwise as hk_watch_start.
 * Safe from any thread. */
HK_API int hk_watch_dir(hk_runtime *rt, const char *dir, const hk_swap_options *opt,
                        hk_report *rep);

#ifdef __cplusplus
}
#endif
#endif /* HOTKERN_H */

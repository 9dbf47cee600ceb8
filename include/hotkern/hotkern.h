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
 * Headers: this one is the core (errors, reports, the runtime and its
 * options, swaps, counters, logs and events) and includes the topic headers
 * beside it, each with the calls of one subject: hotkern/launch.h (kernel
 * handles, launches, their attributes, CUDA graphs), check.h (builds
 * without a GPU), canary.h (test launches before a commit), lkg.h (last
 * known good), metrics.h and watch.h (watched directories). A program
 * includes this one; a topic header included alone stops the build and
 * says so. The
 * network sources are hotkern/net.h (libhotkern-net), programs as they are
 * hotkern/interpose.h; neither is included here.
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

/* ---- version ----------------------------------------------------------- */

/* The version of these headers, which a build of the library of the same
 * version reports (hk_version). Within one major version (the soname,
 * libhotkern.so.MAJOR) the ABI only grows: a minor version adds functions,
 * codes and fields at the end of sized structures, a patch adds nothing.
 * Each function says the version that added it ("Since"), and is exported
 * under that version's symbol node (HOTKERN_1.3 for 1.3). */
#define HK_VERSION_MAJOR 1
#define HK_VERSION_MINOR 5
#define HK_VERSION_PATCH 0
/* The same as one number, 0xMMmmpp (1.3.0 is 0x010300), for the
 * preprocessor: #if HK_VERSION_NUM >= 0x010300. Since 1.3. */
#define HK_VERSION_NUM ((HK_VERSION_MAJOR << 16) | (HK_VERSION_MINOR << 8) | HK_VERSION_PATCH)

/* The version of the library a program runs with: "MAJOR.MINOR.PATCH",
 * static; HK_VERSION_* are those of the headers it was built with, which may
 * be older. 1.0 put `size` first in every caller-allocated structure.
 * Since 1.0. */
HK_API const char *hk_version(void);

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

/* Static, never NULL; "unknown error" for codes this build does not know.
 * Since 1.0. */
HK_API const char *hk_strerror(int err);

/* The code's name, "HK_ERR_LAYOUT" (static, never NULL; "HK_ERR_UNKNOWN" for
 * codes this build does not know): what the CLI's --json and the endpoint's
 * replies carry. Since 1.3. */
HK_API const char *hk_err_name(int err);

/* 1 when err is a verdict on the version itself, which the same bytes get
 * again wherever they are tried (a compile error, a layout that does not
 * fit, a canary refusal, a quarantined image, a check callback's refusal);
 * 0 for 0 and for the state of the host or the moment (busy, closing, out
 * of memory, the driver or the device, a build that timed out, a canary
 * that could not run, a disk or network error), after which trying the
 * same bytes again may succeed. Release sources remember only verdicts and
 * retry the rest. Since 1.3. */
HK_API int hk_err_is_verdict(int err);

/* ---- kernel image formats ---------------------------------------------- */

typedef enum hk_format {
    HK_FORMAT_AUTO = 0, /* detect from content */
    HK_FORMAT_CUDA_C = 1,
    HK_FORMAT_PTX = 2,
    HK_FORMAT_CUBIN = 3,
    HK_FORMAT_FATBIN = 4,
} hk_format;

/* "auto", "cuda", "ptx", "cubin" or "fatbin" ("unknown" for another value);
 * static, never NULL. Since 1.0. */
HK_API const char *hk_format_name(hk_format fmt);

/* ---- reports ----------------------------------------------------------- */

/* What happened in one call. Initialise with HK_REPORT_INIT or
 * hk_report_init() before the first use; the callee overwrites it (within
 * size). A call given a report whose size is below the first layout returns
 * HK_ERR_INVALID and does nothing. The first layout ends at cache_hit.
 * Each field in full: hotkern-reports(3). */
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
    char canary[160];        /* what the canary run found: the tests passed, why it could not run,
                              * or the failure; "" when none ran */
    double canary_ms;        /* time spent in the canary run (part of total_ms) */
    double canary_new_ms;    /* the perf guard's median GPU time of a test launch of the new
                              * version; 0: not timed */
    double canary_old_ms;    /* the running version's on the same test and inputs; 0: not timed (a
                              * first version, or the running version could not be timed) */
    char canary_refusal[16]; /* "fault", "hang", "mismatch", "slower", "memcheck" or
                              * "could_not_run"; "" otherwise */
} hk_report;

#define HK_REPORT_INIT HK_SIZED_INIT(hk_report)

/* Sets r to an empty report of the caller's layout. Since 1.0. */
static inline void hk_report_init(hk_report *r) {
    memset(r, 0, sizeof *r);
    r->size = sizeof *r;
}

/* Frees r->log and zeroes the report's fields within r->size, keeping size,
 * so the report can be used again. r may be NULL; a report whose size is
 * below the first layout is left alone. Since 1.0. */
HK_API void hk_report_clear(hk_report *r);

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

/* "debug", "info", "warn", "error", "off"; static, never NULL. Since 1.0. */
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

/* When the driver work of a swap (load + upload of code) happens. Each value
 * in full: hotkern-runtime(3). */
typedef enum hk_stage_mode {
    HK_STAGE_NOW = 0,           /* inside hk_swap / on the worker thread */
    HK_STAGE_AT_SAFE_POINT = 1, /* in the next hk_safe_point() call */
    HK_STAGE_AUTO = 2,          /* the default: at safe points once the program calls hk_safe_point,
                                 * else now */
} hk_stage_mode;

/* Swap outcomes and other events, for hk_event_cb. Each in full:
 * hotkern-runtime(3). */
typedef enum hk_event_kind {
    HK_EVENT_COMMITTED = 1,     /* a new version runs */
    HK_EVENT_REFUSED = 2,       /* a version was refused; old one runs */
    HK_EVENT_ROLLED_BACK = 3,   /* a rollback committed */
    HK_EVENT_RECLAIMED = 4,     /* an old version's code was unloaded */
    HK_EVENT_CONTEXT_RESET = 5, /* context reset detected; versions reloaded;
                                 * the application's buffers are gone */
    HK_EVENT_CONTEXT_LOST = 6,  /* a sticky CUDA error: the process must restart; suspect versions
                                 * quarantined */
    HK_EVENT_FALLBACK = 7,      /* a program's kernel failed in the hot version and ran the
                                 * program's own code */
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

/* Sets e to an empty event of the caller's layout, for hk_next_event.
 * Since 1.3. */
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

/* The first layout ends at userdata: later fields take their defaults when a
 * caller's size stops before them. Each field in full: hotkern-runtime(3). */
typedef struct hk_options {
    size_t size;              /* set by hk_options_init */
    const int *devices;       /* CUDA device ordinals; NULL means {0} */
    int ndevices;             /* entries in devices; 0 means 1 */
    hk_loader loader;         /* default HK_LOADER_LIBRARY */
    hk_ptx_mode ptx_mode;     /* default HK_PTX_NVJITLINK */
    int jit_opt_level;        /* 0..4, default 4 (driver JIT and nvJitLink) */
    int arch;                 /* target SM, e.g. 90; 0 = from device 0 */
    int history;              /* images kept per module for rollback, default 4 */
    const char *cache_dir;    /* compile cache; NULL = $XDG_CACHE_HOME/hotkern, "" none; unused when
                               * others can change it */
    uint64_t cache_max_bytes; /* default 256 MiB; the 32 entries used last are
                               * also kept in memory, at most an eighth of it */
    hk_event_cb on_event;
    void *userdata;           /* passed to on_event and check callbacks */
    int safe_point_wait_ms;   /* how long a version waits for a safe point before it is staged at
                               * once; default 2000 */
    const hk_header *headers; /* in-memory headers for every CUDA C build of the runtime (copied); a
                               * swap's own headers of the same name come first */
    int nheaders;
    int no_warm_start;                 /* 1: no NVRTC warm-up on a background thread at create;
                                        * default 0 */
    int launch_hold_max_us;            /* longest a launch waits at the launch gate, then goes on;
                                        * default 1000 */
    int destroy_wait_ms;               /* longest hk_runtime_destroy waits for work in progress;
                                        * default 5000 */
    int canary;                        /* 1: run new versions' test launches in a canary process
                                        * before they commit; default 0 */
    const char *canary_helper;         /* path of hotkern-canary; NULL: $HK_CANARY_HELPER, else
                                        * found beside the library */
    int canary_timeout_ms;             /* longest one test launch may run before the helper is
                                        * killed; default 2000 */
    const char *state_dir;             /* last known good kept across restarts, in this directory;
                                        * NULL (default): in memory */
    int suspect_window_ms;             /* a version current this long without a lost context is
                                        * known good; default 60000 */
    int restore;                       /* 1: hk_runtime_create calls hk_runtime_restore (a failure
                                        * to restore is then logged, not returned); default 0 */
    int build_isolated;                /* 1: compile in the hotkern-build helper process; 0
                                        * (default): in this process */
    const char *build_helper;          /* path of hotkern-build; NULL: $HK_BUILD_HELPER, else as
                                        * canary_helper's default */
    int build_timeout_ms;              /* longest one isolated build may run before the helper is
                                        * killed; default 120000 */
    double canary_slowdown_max;        /* perf guard: refuse a version this many times slower than
                                        * the running one; default 4.0, < 0: off */
    double canary_slowdown_min_ms;     /* default 1.0 (0 also means 1.0); < 0: no
                                        * floor (the ratio alone decides) */
    int canary_sanitizer;              /* test launches under memcheck first: 0 (default) where
                                        * found, 1 required, -1 off */
    const char *canary_sanitizer_path; /* compute-sanitizer; NULL: $HK_COMPUTE_SANITIZER, else the
                                        * toolkit's, else $PATH */
    hk_log_cb log;                     /* the log callback from create on, as hk_runtime_set_log;
                                        * NULL: HOTKERN_LOG's stderr */
    void *log_userdata;                /* passed to log */
    int log_min_level;                 /* hk_log_level; default HK_LOG_INFO */
    const char *canary_device;         /* the canary helpers' device: NULL or "" the runtime's
                                        * first, an ordinal or a UUID */
} hk_options;

/* Sets o->size = size and every field within it to the defaults above.
 * Returns HK_ERR_INVALID, writing nothing, for a size below the first
 * layout. Call it through hk_options_init. Since 1.0. */
HK_API int hk_options_init_size(hk_options *o, size_t size);

/* Fills o with the defaults above, for the layout the program is built with.
 * Since 1.0. */
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
 * Compiling in this process (options.build_isolated 0), the process's first
 * runtime makes its first NVRTC compile here, on the calling thread (an
 * empty kernel, tens of milliseconds; once a process): the exit handlers
 * NVRTC registers then come before hotkern's exit guard, so that a program
 * exiting during a build ends with its own status instead of crashing.
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
 * cannot be. Since 1.0. */
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
 * before exit, or set options.build_isolated. Since 1.0. */
HK_API void hk_runtime_destroy(hk_runtime *rt);

/* The CUcontext used for device slot i (cast from void *), or NULL.
 * Since 1.0. */
HK_API void *hk_runtime_context(hk_runtime *rt, int device_slot);

/* Target SM (e.g. 90) that builds aim at. Since 1.0. */
HK_API int hk_runtime_arch(hk_runtime *rt);

/* ---- swapping in new versions ----------------------------------------- */

/* Whether a swap runs its version's test launches in the canary process
 * first (hotkern/canary.h). A version whose kernels have no test
 * launch declared commits as before, whatever the policy ("no canary tests"
 * in the report). Each policy in full: hotkern-swap(3). */
typedef enum hk_canary_policy {
    HK_CANARY_DEFAULT = 0,  /* the source's default: OPTIONAL for hk_swap, hk_submit and watched
                             * files; REQUIRE for pushes and pulls (net.h) */
    HK_CANARY_SKIP = 1,     /* no canary run */
    HK_CANARY_OPTIONAL = 2, /* run the tests when the runtime has a canary; if it cannot, the
                             * version goes on */
    HK_CANARY_REQUIRE = 3,  /* a version with tests that cannot be run in the
                             * canary is refused with HK_ERR_CANARY */
} hk_canary_policy;

/* What a CUDA C or PTX build spends its time on. Cubins and fatbins are
 * loaded as they are, whatever the profile. Each profile in full:
 * hotkern-swap(3). */
typedef enum hk_build_profile {
    HK_BUILD_PROFILE_DEFAULT = 0, /* the source's default: RELEASE everywhere (hk_swap, hk_submit,
                                   * watched directories, pushes and pulls) */
    HK_BUILD_PROFILE_RELEASE = 1, /* the fastest code: NVRTC's full optimisation, ptxas and
                                   * nvJitLink at -O3 (-O0 with hk_options.jit_opt_level 0) */
    HK_BUILD_PROFILE_DEV = 2,     /* the fastest compile (-Ofc=max), for the edit-save loop; opt-in
                                   * only */
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
 * (ThreadSanitizer's). rep may be NULL. Since 1.3. */
HK_API int hk_build_keep_memory(hk_report *rep);

/* The first layout ends at origin. Each field in full: hotkern-swap(3). */
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
    uint64_t release_version;       /* this image's release (pushes and pulls set it); 0: none */
    hk_build_profile build_profile; /* default HK_BUILD_PROFILE_DEFAULT */
    double canary_slowdown_max;     /* this swap's perf guard: 0 (default) the runtime's; > 0 this
                                     * ratio; < 0 off */
    double canary_slowdown_min_ms;  /* 0 (default): the runtime's; > 0: this
                                     * many ms; < 0: no floor */
} hk_swap_options;

/* As hk_options_init_size, for swap options. Since 1.0. */
HK_API int hk_swap_options_init_size(hk_swap_options *o, size_t size);

/* Fills o with the defaults, for the layout the program is built with.
 * Since 1.0. */
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
 * On success rep->version is the new version number (monotonic per module).
 * Since 1.0. */
HK_API int hk_swap(hk_runtime *rt, const char *name, const void *image, size_t size,
                   const hk_swap_options *opt, hk_report *rep);

/* As hk_swap, but returns at once: a worker thread builds the version, then
 * stages and commits it (HK_STAGE_NOW, or AUTO before any safe point) or
 * leaves it for hk_safe_point().
 * The outcome arrives through on_event. Safe from any thread. Since 1.0. */
HK_API int hk_submit(hk_runtime *rt, const char *name, const void *image, size_t size,
                     const hk_swap_options *opt);

/* Performs the driver work of every built, pending version and commits it,
 * and unloads the versions those commits replaced at an earlier safe point.
 * Call it where the application's GPU work is idle (e.g. right after the
 * per-frame synchronize): code uploaded or unloaded then costs running threads
 * nothing, while uploading code into a busy context waits for all its work and
 * stalls every launching thread meanwhile. Never synchronises the GPU itself.
 * Returns the number of versions committed (refusals are reported through
 * on_event), or HK_ERR_BUSY from a check callback. Safe from any thread.
 * Since 1.0. */
HK_API int hk_safe_point(hk_runtime *rt);

/* Waits until every submitted version has been committed or refused (pending
 * safe-point versions excepted) and returns 0, or HK_ERR_TIMEOUT; HK_ERR_BUSY
 * at once when called on the worker thread (from one of its events).
 * Since 1.0. */
HK_API int hk_wait_idle(hk_runtime *rt, int timeout_ms);

/* Commits the previous kept image of `name` again, as a new version number.
 * Safe from any thread. Since 1.0. */
HK_API int hk_rollback(hk_runtime *rt, const char *name, hk_report *rep);

/* Current version number of a module (0 when it has none). Since 1.0. */
HK_API uint64_t hk_module_version(hk_runtime *rt, const char *name);

/* The release (hk_swap_options.release_version; 0 for an image that has
 * none) of module `name`'s image `back` steps back in its kept history: 0
 * the image it runs, 1 the one hk_rollback would commit, and so on. A
 * rollback commits an image with its release. Returns 0, HK_ERR_NOT_FOUND
 * when the module has no version, HK_ERR_NO_HISTORY when fewer images are
 * kept, HK_ERR_INVALID. Safe from any thread. Since 1.2. */
HK_API int hk_module_release(hk_runtime *rt, const char *name, int back, uint64_t *release_version);

/* As hk_rollback, but only when the image it would commit belongs to release
 * `release_version` (what hk_module_release(rt, name, 1, ...) reports):
 * otherwise HK_ERR_REJECTED and nothing changes. The check and the rollback
 * are one step: no commit from another source comes between them. Safe from
 * any thread. Since 1.2. */
HK_API int hk_rollback_release(hk_runtime *rt, const char *name, uint64_t release_version,
                               hk_report *rep);

/* Device address and size of the __device__ or __constant__ variable `name`
 * in the current version of `module`, in device slot `device_slot`'s context
 * (cast the address to CUdeviceptr). Valid until the module's next commit.
 * Safe from any thread. Since 1.0. */
HK_API int hk_module_global(hk_runtime *rt, const char *module, const char *name, int device_slot,
                            uint64_t *dptr, size_t *size);

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
    uint64_t retired_loaded;       /* replaced versions still loaded: waiting for launches, pins,
                                    * captured graphs, their GPU work or a safe point */
    uint64_t gate_closes;          /* times the launch gate closed */
    double gate_closed_max_ms;     /* longest it stayed closed */
    uint64_t launch_hold_timeouts; /* launches that waited launch_hold_max_us
                                    * at the gate and then went on */
    uint64_t canary_runs;          /* versions whose tests ran in the canary */
    uint64_t canary_refused;       /* versions the canary refused */
    uint64_t canary_helper_starts; /* canary helper processes started (the first, and one after each
                                    * fault, hang or death) */
    uint64_t context_lost;         /* sticky CUDA errors seen (0 or 1: the
                                    * first one ends the context) */
    uint64_t quarantined;          /* images quarantined now, all modules */
    /* The canary's refusals by kind (hk_report.canary_refusal); they add
     * up to canary_refused. */
    uint64_t canary_refused_fault, canary_refused_hang, canary_refused_mismatch;
    uint64_t canary_refused_slower, canary_refused_memcheck, canary_refused_could_not_run;
    double canary_ms_total;    /* time spent in canary runs */
    double canary_last_new_ms; /* the last timed run's figures, as hk_report.canary_new_ms and
                                * canary_old_ms; 0: none yet */
    double canary_last_old_ms;
    uint64_t canary_sanitizer;  /* 1: test launches run under memcheck first */
    uint64_t program_fallbacks; /* launches of a program's kernel that failed in the hot version and
                                 * ran the program's own code (HK_EVENT_FALLBACK) */
    uint64_t launch_errors;     /* launches the driver refused: hk_launch, hk_launch_ex, pinned and
                                 * graph launches (Since 1.4) */
} hk_stats;

#define HK_STATS_INIT HK_SIZED_INIT(hk_stats)

/* Sets s to zero counters of the caller's layout, for hk_stats_get.
 * Since 1.0. */
static inline void hk_stats_init(hk_stats *s) {
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
}

/* Snapshot of the counters into out, within out->size (set it with
 * HK_STATS_INIT or hk_stats_init). Returns 0, or HK_ERR_INVALID for a NULL
 * argument or a size below the first layout (nothing written). Safe from any
 * thread. Since 1.0. */
HK_API int hk_stats_get(hk_runtime *rt, hk_stats *out);

/* Waits until every retired version is unloaded, or timeout_ms passes.
 * Versions replaced at a safe point are unloaded at the next one, so this
 * waits for that too; a version pinned, or held by a graph captured from
 * hk_launch, waits for its pin or graph. Returns 0 or HK_ERR_TIMEOUT;
 * HK_ERR_BUSY at once on hotkern's reclaim thread (from a RECLAIMED event).
 * Since 1.0. */
HK_API int hk_reclaim_wait(hk_runtime *rt, int timeout_ms);

/* ---- logs and queued events -------------------------------------------- */

/* hk_log_level, hk_log_level_name and hk_log_cb: before hk_options, which
 * can name a log callback from the start. */

/* Sends rt's messages of min_level and above to cb; the runtime's network
 * sources (libhotkern-net) log through it too. cb NULL restores the default:
 * when the environment variable HOTKERN_LOG (read at hk_runtime_create) is
 * "debug", "info", "warn" or "error", messages of that level and above go to
 * stderr, one line each ("hotkern: LEVEL SUBSYSTEM: message"); otherwise
 * nothing is printed. When this returns, the previous callback is no longer
 * running and is not called again, so its userdata may be freed. Safe from
 * any thread; returns 0, HK_ERR_INVALID, or HK_ERR_BUSY from a log callback.
 * Since 1.0. */
HK_API int hk_runtime_set_log(hk_runtime *rt, hk_log_cb cb, void *userdata, hk_log_level min_level);

/* Starts queueing rt's events (every kind, from every thread; on_event, when
 * set, is still called): at most capacity wait (0: 256); when the queue is
 * full the oldest goes and the next event taken says how many went. Calling
 * it again changes nothing but returns 0. Safe from any thread; 0,
 * HK_ERR_INVALID or HK_ERR_NOMEM. Since 1.3. */
HK_API int hk_events_queue(hk_runtime *rt, int capacity);

/* A descriptor (eventfd) that polls readable while events wait, for the
 * program's own poll/epoll loop; owned by rt (do not close it), valid until
 * hk_runtime_destroy. -1 before hk_events_queue. Since 1.3. */
HK_API int hk_event_fd(hk_runtime *rt);

/* Takes the oldest queued event into *out (within out->size, as every sized
 * structure): returns 1, or 0 when none came within timeout_ms (0: do not
 * wait; < 0: wait for one). HK_ERR_INVALID without a queue or for a size
 * below the first layout; HK_ERR_CLOSED once destroy has begun (a taker
 * waiting then returns it, and destroy waits for it to leave). Safe from any
 * thread (each event goes to one taker). Since 1.3. */
HK_API int hk_next_event(hk_runtime *rt, hk_queued_event *out, int timeout_ms);

/* 1 when a message of this level would be delivered now: lets a caller skip
 * building an expensive message. One atomic load; safe from any thread.
 * Since 1.0. */
HK_API int hk_log_enabled(hk_runtime *rt, hk_log_level level);

/* Formats a message (printf-style, on the stack: no allocation) and delivers
 * it as rt's own, when its level is enabled. For sources built on hotkern
 * (libhotkern-net logs this way) and for the application's messages about
 * its kernels. Safe from any thread; subsystem NULL means "app". Since 1.0. */
HK_API void hk_log(hk_runtime *rt, hk_log_level level, const char *subsystem, const char *fmt, ...)
    HK_PRINTF(4, 5);

#ifdef __cplusplus
}
#endif

/* The topic headers, each after those it builds on (canary.h uses launch.h's
 * hk_dim3). Each includes this header before its own include guard, so that
 * whichever of them a program includes first, all of them are read here, in
 * this order, after the core above. */
#include "hotkern/launch.h"
#include "hotkern/check.h"
#include "hotkern/canary.h"
#include "hotkern/lkg.h"
#include "hotkern/metrics.h"
#include "hotkern/watch.h"

#endif /* HOTKERN_H */

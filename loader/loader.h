/*
 * loader/: the CUDA side of hotkern. Private header shared by its files.
 *
 * Locks, in the order they may be taken (never the other way round):
 *   src_lock (runtime)   the attached sources. Taken with no other lock of
 *                        the runtime held; a source's hook runs under it and
 *                        takes only its own locks (and may submit).
 *   swap_lock (runtime)  serialises swaps, rollbacks, handle creation, graph
 *                        registration, reset recovery; protects module lists,
 *                        histories and handles' layouts. Its owner is kept in
 *                        a thread-local, so that a callback run under it can
 *                        be answered at once instead of waiting for itself.
 *   lkg_lock (lkg.h)     last-known-good records and quarantine, in memory
 *                        (lkg.c, lkgdisk.c): never held across a file write
 *                        (lkgdisk.c's writers take their own locks before
 *                        lkg_lock, with no engine lock held). Taken under
 *                        swap_lock by commits, and alone by the thread that
 *                        saw a sticky error (a launching thread, on the
 *                        error path only) and by the query functions.
 *   the launch gate      not a lock: while closed, hotkern's launches wait at
 *                        hkl_enter ("Launch gate", at hkl_gate_close).
 *                        Closed by swap_lock holders and the reclaim thread.
 *   graph_lock (runtime) rwlock, writers first: hk_graph_launch (read) vs
 *                        retargeting and (un)registration (write).
 *   unload_lock (runtime) a module unload vs reset recovery replacing the
 *                        context the module lived in.
 *   work_lock (runtime)  the worker's job queue and the safe-point queue.
 *   rec_lock (runtime)   the retired list and the reclaim thread's wake-ups.
 *   gate_lock, stats_lock, expect_lock (runtime) leaves (expect_lock: the
 *                        program's kernels and globals, expect.c).
 *   log_lock (runtime)   rwlock, innermost of all: messages are delivered
 *                        under it (read), from under any other lock, the
 *                        sources' included; hk_runtime_set_log writes.
 * The launch path takes none of them: it announces itself in a per-thread
 * epoch slot, checks the gate, loads `current` once and calls the driver.
 * The objects, the sources' hooks and the launch gate: at their declarations.
 */
#ifndef HK_LOADER_H
#define HK_LOADER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "canary/canary.h"
#include "hotkern/hotkern.h"
#include "base/driver.h"
#include "loader/expo.h"
#include "loader/record.h"
#include "ptx/ptx.h"
#include "util/util.h"

#define HKL_MAX_DEVICES 16
#define HKL_NAME_MAX    64
#define HKL_MAX_ATTRS   16

/*
 * Objects
 *   hk_runtime   one per attached set of devices; owns everything below.
 *   hkl_module   a name; its `current` pointer is the one thing launches read.
 *   hkl_version  one loaded image of a module (CUlibrary or CUmodule), with the
 *                resolved entry of every kernel handle ("slots").
 *   hk_kernel    a stable handle: module + slot. Never freed before the runtime.
 */
typedef struct hkl_module hkl_module;
typedef struct hkl_version hkl_version;
typedef struct hkl_job hkl_job;
typedef struct hkl_graph hkl_graph;
typedef struct hkl_lkg hkl_lkg;
typedef struct hkl_expect hkl_expect;
typedef struct hkl_attr {
    int attr, value; /* a CUfunction_attribute and its value */
} hkl_attr;

typedef struct hkl_device {
    /* immutable after create, except ctx/ctx_id which reset recovery
     * rewrites under swap_lock (ctx is atomic: read without it) */
    int ordinal;
    CUdevice dev;
    _Atomic(CUcontext) ctx;
    unsigned long long ctx_id;
    CUstream copy_stream; /* swap_lock: hotkern's own stream for global copies */
    int retains;          /* primary-context retains we owe a release for */
    int arch;             /* e.g. 90 */
} hkl_device;

/* Per-thread epoch slot for launches. Owned by one thread while `owner` is
 * set; the reclaim thread only reads `active`. */
typedef struct hkl_tslot {
    /* One cache line per slot: launching threads never share a line. */
    _Alignas(64) _Atomic uint64_t active; /* 0: not in a launch; else epoch at entry */
    _Atomic int in_use;                   /* free / owned / orphaned: gate.c */
    struct hkl_tslot *next;               /* immutable once published on rt->gate.slots */
    hk_runtime *rt;
} hkl_tslot;

typedef struct hkl_param_layout {
    int n;
    uint32_t *offset; /* n entries each */
    uint32_t *size;
} hkl_param_layout;

struct hkl_version {
    /* immutable once committed */
    uint64_t number;
    uint64_t release; /* hk_swap_options.release_version of its image; 0: none */
    hkl_module *mod;
    /* The build's artifact, taken over whole (owned): the loaded image
     * (art.image, art.size, art.format), what ptx/ read from it (art.meta:
     * kernels with their parameter layouts, globals), and the lowered
     * names of the name expressions (art.lowered_names, art.nlowered). Its
     * log and header list come along, freed with the version. */
    hkp_artifact art;
    char **expr;                     /* the name expressions, parallel to art.lowered_names */
    CUlibrary lib;                   /* HK_LOADER_LIBRARY */
    CUmodule cumod[HKL_MAX_DEVICES]; /* HK_LOADER_MODULE (one device) */
    int staged_on_all;               /* code uploaded to every context (cuFuncLoad) */

    /* fn[slot]: the CUkernel (library) or CUfunction (module) of each kernel
     * handle. Grown under swap_lock by publishing a new array; old arrays are
     * freed with the version, after the grace period. */
    _Atomic(void **) fn;
    _Atomic int cap; /* written under swap_lock, after fn */
    /* Library loader: funcs[slot * ndev + d], the CUfunction of each slot's
     * kernel in device d's context, taken when the slot is resolved (with
     * the launch gate closed), so that hk_kernel_function needs no driver
     * call that takes the driver's lock for writing. NULL entries: not
     * known. Grown with fn, published before it. Valid for the context
     * generation ctx_gen only. */
    _Atomic(void **) funcs;
    void **old_fn; /* swap_lock: chain of replaced arrays (fn and funcs) */

    _Atomic int pins;         /* hk_pin, graph, capture and canary references */
    int unload_at_safe_point; /* set before retiring; then rec_lock */
    double sp_deadline;       /* rec_lock: in unload_ready, unloaded by the reclaim
                               * thread after this (hkl_now_ms) with no safe point */
    int dead;                 /* set before retiring: a module of a reset
                               * context, replaced by its reload (no event) */
    uint64_t ctx_gen;         /* immutable: rt->reset.gen when loaded */
    uint64_t retire_epoch;    /* rec_lock */
    int candidate;            /* reclaim thread: unpinned when the pass began */
    hkl_version *next;        /* rec_lock: retired list */
};

/* A kept image, for rollback and reset recovery. */
typedef struct hkl_image {
    void *data;
    size_t size;
    hk_format format; /* after build: PTX, CUBIN or FATBIN */
    uint64_t version;
    uint64_t release; /* the release the image belongs to; 0: none */
    int nexpr;
    char **expr, **lowered;
} hkl_image;

struct hkl_module {
    char name[HKL_NAME_MAX];        /* immutable */
    _Atomic(hkl_version *) current; /* written under swap_lock */
    /* swap_lock: */
    uint64_t last_version;
    uint64_t last_seq;        /* submission order of the last committed job */
    _Atomic int program_code; /* 1: a hot launch failed, its program kernels
                               * run the program's code until the next commit
                               * (expect.c) */
    hkl_image *hist;          /* ring of kept images, newest last */
    int nhist;
    hk_kernel **kernels;
    int nkernels, capkernels;
    int last_error; /* outcome of the last attempt */
    char last_message[512];
    hkl_module *next;
};

struct hk_kernel {
    /* immutable */
    hk_runtime *rt;
    hkl_module *mod;
    int slot;
    char *name;
    /* swap_lock: the layout every new version must match */
    hkl_param_layout layout;
    int fixed_layout; /* swap_lock: 1: required (hk_kernel_require_layout, a
                       * program's kernel): no version may change it */
    /* swap_lock: attributes set through the handle, applied to every new
     * version before its commit; cache_config < 0: none */
    hkl_attr attrs[HKL_MAX_ATTRS];
    int nattrs;
    int cache_config;
    hkl_expect *expect; /* swap_lock: the program's kernel this handle runs
                         * (expect.c), or NULL */
};

struct hk_pin {
    hk_runtime *rt; /* immutable */
    hkl_version *v; /* immutable; holds one count of v->pins */
};

struct hkl_graph {
    /* immutable after registration */
    CUgraphExec exec;
    CUgraphNode node;
    hk_kernel *k;
    int dev_slot;
    CUDA_KERNEL_NODE_PARAMS params; /* as read at registration */
    hkl_version *held;              /* swap_lock: version the node still runs after a failed
                                     * retarget, pinned until a retarget succeeds */
    hkl_graph *next;                /* graph_lock (write) */
};

/* A synchronous hk_swap waiting for a safe point to stage its job. */
typedef struct hkl_waiter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;       /* lock */
    int err;        /* lock: the swap's outcome */
    hk_report *rep; /* the caller's report; filled before done is set */
} hkl_waiter;

/*
 * Sources. What feeds the runtime (the directory watcher, the network
 * endpoint, the puller) lives outside loader/ and submits through the public
 * API; the engine includes none of it. A source that needs something back
 * attaches an hkl_source (below) to the runtime: the engine calls its
 * deps_built after each build, its metrics from hk_metrics_text and its
 * release at hk_runtime_destroy, and knows nothing else about it.
 */
/* A source's hooks, attached to one runtime (hkl_source_attach). The engine
 * calls them; it never calls the source in any other way. */
typedef struct hkl_source hkl_source;
struct hkl_source {
    /* immutable while attached */
    const void *kind; /* identifies the kind of source (its address, not its
                       * content): a runtime holds at most one of each */
    void *ctx;        /* passed to the hooks */
    /* Optional. After a build of a job with a source_name: the files that build
     * read (deps, n entries, valid during the call only). Called on the
     * worker thread with src_lock held: it must return quickly. */
    void (*deps_built)(void *ctx, const char *source_name, const char *const *deps, int n);
    /* Optional. At hk_runtime_destroy, before the worker stops and with no
     * lock held; the source is detached already. It stops whatever submits
     * to the runtime and frees what it owns (the hkl_source included, when
     * the source allocated it): no hook of it runs afterwards. */
    void (*release)(void *ctx);
    /* Optional. Adds the source's metric families to w (loader/metrics.c);
     * called by hk_metrics_text on its caller's thread with src_lock held. */
    void (*metrics)(void *ctx, hk_metrics_writer *w);
    hkl_source *next; /* src_lock */
};

/* Swap durations (loader/metrics.c): counts per fixed bucket, not
 * cumulative; the last bucket is +Inf. */
#define HKL_HIST_BUCKETS 17
typedef struct hkl_hist {
    uint64_t n[HKL_HIST_BUCKETS];
    uint64_t count;
    uint64_t sum_us;
} hkl_hist;

/* A unit of work for the worker thread. */
struct hkl_job {
    char name[HKL_NAME_MAX];
    void *data;
    size_t size;
    hk_swap_options opt;
    char *origin;         /* owned copy of opt.origin */
    char **nvrtc_options; /* owned copies */
    char **name_expressions;
    char *source_name;
    hkp_artifact art; /* after build */
    /* The image's hash (hkl_lkg_hash), taken once, when first needed: by
     * the build's quarantine check, from a restored image's record, or by
     * the swap, once the image is known to be new; hashed says it is. */
    uint8_t hash[32];
    int hashed;
    int built;
    int at_safe_point;  /* staged inside hk_safe_point */
    uint64_t seq;       /* submission order (0: none); an older job never
                         * replaces a newer committed one */
    int latest;         /* immutable: from hkl_submit_latest: a later such
                         * job of the same module supersedes this one */
    double deadline;    /* work_lock: pending without a waiter: the worker
                         * stages it itself after this (hkl_now_ms) */
    double t_start;     /* hkl_now_ms when submitted, for total_ms */
    hkl_waiter *waiter; /* set: owned by a waiting hk_swap, never freed by the
                         * safe point (which signals it instead) */
    hkl_job *next;
    hk_header *headers; /* owned copy behind opt.headers (hku_headers_dup) */
};

/* Outlives its runtime: the destructor of a graph's user object (a captured
 * launch's pin) may run after hk_runtime_destroy. */
typedef struct hkl_rtref {
    pthread_mutex_t lock;
    hk_runtime *rt; /* lock: NULL once the runtime is gone */
    _Atomic int refs;
} hkl_rtref;

/* Test hooks: points where a test may hold a thread (tests/cpu_engine.c). */
typedef enum hkl_hook_point {
    HKL_HOOK_PASS_SNAPSHOT = 1, /* reclaim pass: pins read, fence not yet decided */
    HKL_HOOK_PASS_SYNC = 2,     /* reclaim pass: contexts read, before synchronising */
    HKL_HOOK_GATED = 3,         /* swap: launch gate closed, before staging */
    HKL_HOOK_RESET_RELOAD = 4,  /* reset recovery: a module's version read, before reloading */
    HKL_HOOK_BUILT = 5,         /* a job built (and through its canary), not yet staged */
    HKL_HOOK_COMPILED = 6,      /* a job's compile returned, nothing after it done yet:
                                 * holding here is a slow build */
} hkl_hook_point;

/*
 * The runtime's parts. Each is one member of struct hk_runtime, kept by the
 * file named at it, which makes it (hkl_PART_init, at create, in the order
 * of runtime.c's table) and takes it apart (hkl_PART_finish, at free, in the
 * reverse order). Other files reach a part through its functions, but for
 * the few fields said to be read (or, under the part's lock, written)
 * elsewhere.
 */

/* The launch-side epochs and the launch gate (gate.c; gate.h's hkl_enter
 * reads epoch, asym_fence and closers on every launch). */
typedef struct hkl_gate {
    _Atomic uint64_t epoch;          /* bumped by hkl_retire (version.c) */
    _Atomic(hkl_tslot *) slots;      /* push-only list */
    int asym_fence;                  /* immutable: membarrier(2) orders launch entries */
    _Atomic int closers;             /* closers inside; launchers wait while > 0 */
    _Atomic int waiters;             /* launchers waiting at the gate */
    _Atomic uint64_t gen;            /* openings so far */
    _Atomic uint64_t t0;             /* when the gate last went from open to closed (ns) */
    _Atomic uint64_t section_max_ns; /* longest one thread's close..open (ns) */
    _Atomic uint64_t closes, max_ns, hold_timeouts; /* for hk_stats */
    pthread_mutex_t lock;                           /* gate_lock */
    pthread_cond_t cond;                            /* gate_lock: broadcast when the gate opens */
} hkl_gate;

/* Reset recovery (reset.c). unload_lock orders a module unload (version.c)
 * against reset recovery replacing the context the module lived in. */
typedef struct hkl_reset {
    pthread_mutex_t unload_lock;
    _Atomic uint64_t gen; /* bumped by reset recovery under unload_lock */
    _Atomic int suspect;  /* a launch failed as after a reset (launch.c sets it) */
} hkl_reset;

/* The reclaim thread and the retired versions (reclaim.c; hkl_retire and
 * hkl_reclaim_kick of version.c add to it, under rec_lock). */
typedef struct hkl_reclaimer {
    pthread_mutex_t lock;      /* rec_lock */
    pthread_cond_t cond;       /* rec_lock: wakes the reclaim thread */
    pthread_cond_t done;       /* rec_lock: signalled after each reclaim pass */
    hkl_version *retired;      /* rec_lock */
    hkl_version *unload_ready; /* rec_lock: grace over, unloaded at a safe point */
    int nretired;              /* rec_lock: retired and not yet unloaded */
    int stop;                  /* rec_lock */
    int kick;                  /* rec_lock: work arrived; pass again at once */
    int abandoned;             /* rec_lock: destroy gave up waiting; the reclaim
                                * thread frees the runtime when it ends */
    int pin_poll_ms;           /* rec_lock: poll for pins going (tests change it) */
    int unload_gap_ms;         /* immutable: least time between unload batches */
    int waiters;               /* rec_lock: threads in hk_reclaim_wait */
    pthread_t thread;          /* immutable once started */
    int started;               /* immutable once started */
    int finished;              /* rec_lock: its final pass is done */
    int retire_all;            /* rec_lock: destroy could not take swap_lock in
                                * time: the reclaim thread retires every current
                                * version (hkl_retire_all) before its final pass */
    /* Immutable once the thread starts: the part of runtime.c's teardown
     * it runs itself when destroy stopped waiting for it (hkl_reclaim_start;
     * no floor below runtime.c calls it by name). */
    void (*free_rt)(hk_runtime *rt);
} hkl_reclaimer;

/* The worker thread, its job queue and the safe-point queue (worker.c). */
typedef struct hkl_worker {
    pthread_mutex_t lock;      /* work_lock */
    pthread_cond_t cond;       /* work_lock: a job came, or stop */
    pthread_cond_t idle;       /* work_lock: a job ended, or the worker left */
    _Atomic uint64_t job_seq;  /* submission counter for jobs (swap.c and
                                * restore.c number theirs too) */
    hkl_job *jobs, *jobs_tail; /* work_lock: to build */
    hkl_job *dropped;          /* work_lock: superseded before they were
                                * taken; the worker reports them */
    hkl_job *pending;          /* work_lock: built, waiting for a safe point */
    int busy;                  /* work_lock: jobs taken but not finished */
    int stop;                  /* work_lock */
    pthread_t thread;          /* immutable once started */
    int started;
    int exited;    /* work_lock: the worker left its loop */
    int abandoned; /* work_lock: destroy stopped waiting for it:
                    * the worker finishes the teardown */
    /* Immutable once the thread starts: the rest of runtime.c's teardown,
     * which the worker runs itself when destroy stopped waiting for its
     * build (hkl_worker_start). */
    void (*finish_rt)(hk_runtime *rt, double until_ms);
} hkl_worker;

/* Safe points (worker.c; loader/safepoint.h). wanted, read at every
 * interposed synchronisation, is padded off busy fields (no _Alignas:
 * calloc'd). */
typedef struct hkl_safe_points {
    char pad0[64];
    _Atomic int wanted;    /* HKL_SP_* bits, each under its list's lock */
    _Atomic int automatic; /* 1: idle moments come from a source (swap.c reads it) */
    char pad1[64];
    int (*own_thread)(void); /* work_lock: "this thread brings them" */
    int seen;                /* work_lock: hk_safe_point was called */
    pthread_t thread;        /* work_lock: its latest caller */
} hkl_safe_points;

/* The counters behind hk_stats and the metrics (metrics.c; swap.c,
 * reclaim.c, reset.c and expect.c count under stats_lock). */
typedef struct hkl_metrics {
    pthread_mutex_t lock; /* stats_lock */
    hk_stats stats;       /* stats_lock */
    hkl_hist swap_hist;   /* stats_lock: total_ms of committed swaps */
} hkl_metrics;

/* The attached sources (source.c; metrics.c walks them under src_lock). */
typedef struct hkl_sources {
    pthread_mutex_t lock; /* src_lock */
    hkl_source *list;     /* src_lock: attached sources, newest first */
} hkl_sources;

/* Registered graphs (graph.c). */
typedef struct hkl_graphs {
    pthread_rwlock_t lock; /* graph_lock: graph launches (read) vs retargeting
                            * and registration (write) */
    hkl_graph *list;       /* graph_lock */
} hkl_graphs;

/* Logs (log.c). log_lock is the innermost lock of all: messages are
 * delivered under it for reading, from any thread and under any other lock;
 * hk_runtime_set_log takes it for writing. The callbacks' end (log and
 * event callbacks alike) is here too: set once by hkl_callbacks_close. */
typedef struct hkl_log {
    pthread_rwlock_t lock; /* log_lock */
    hk_log_cb cb;          /* log_lock: NULL: stderr when HOTKERN_LOG asks */
    void *ud;              /* log_lock */
    int cb_min;            /* log_lock: the callback's least level */
    int env_min;           /* immutable: HOTKERN_LOG's level, HK_LOG_OFF when unset */
    _Atomic int min;       /* least level delivered now; read without the lock */
    _Atomic int cb_closed;
    pthread_t cb_closer;     /* written before cb_closed, read after it */
    _Atomic int cb_inflight; /* callbacks being called now */
} hkl_log;

/* The event queue (log.c: hk_events_queue). */
typedef struct hkl_events {
    pthread_mutex_t lock; /* evq_lock */
    pthread_cond_t cond;  /* evq_lock: an event came, or destroy began */
    hk_queued_event *q;   /* evq_lock: ring of cap, NULL: no queue */
    int cap, head, n;     /* evq_lock */
    uint64_t dropped;     /* evq_lock: lost, for the next event queued (capacity 1) */
    int closed;           /* evq_lock: destroy began */
    int takers;           /* evq_lock: threads inside hk_next_event */
    _Atomic int fd;       /* eventfd, -1: none; set once under evq_lock */
} hkl_events;

/* The program's own kernels and globals (expect.c, expect_tu.c,
 * expect_global.c). expect_lock is a leaf. */
typedef struct hkl_expectations {
    pthread_mutex_t lock;            /* expect_lock */
    hkl_expect *kernels;             /* expect_lock */
    struct hkl_xglobal *globals;     /* expect_lock */
    _Atomic int n;                   /* entries of both lists: 0 costs swaps nothing */
    struct hkl_tu *tus;              /* expect_lock: the program's translation units */
    struct hkl_tu_warned *tu_warned; /* expect_lock: names said to be ambiguous */
    struct hkl_kept_src *kept;       /* expect_lock: modules' last CUDA C sources */
} hkl_expectations;

/* Test hooks, apart from the production fields: only the tests set hook
 * (before the runtime's first job; read unlocked) and read fences; the
 * engine calls hook at the points of hkl_hook_point when it is set. */
typedef struct hkl_test_hooks {
    void (*hook)(hk_runtime *, hkl_hook_point); /* immutable once set: tests only */
    uint64_t fences;                            /* rec_lock: heavy fences the reclaim thread paid */
} hkl_test_hooks;

struct hk_runtime {
    /* immutable after create */
    hkb_driver drv_own;
    const hkb_driver *drv;
    hk_options opt;
    char *cache_dir;
    hkp_cache *cache;
    int ndev;
    hkl_device dev[HKL_MAX_DEVICES];
    int arch;
    uint64_t id;        /* unique per runtime in the process */
    hkl_rtref *ref;     /* shared with graph user objects */
    hk_header *headers; /* copy of opt.headers */
    hkp_warm *warm;     /* NVRTC warm-up thread (ptx/warm.c), or NULL */
    hka_canary *canary; /* test declarations and the canary helper (canary/; its own locks) */
    hkp_iso *iso;       /* the build helper when options.build_isolated, else
                         * NULL (ptx/isolate.c; its own lock) */
    hkl_lkg *lkg;       /* last known good (lkg.c, lkgdisk.c; lkg_lock) */

    pthread_mutex_t swap_lock; /* context.c */
    hkl_module *modules;       /* swap_lock */

    /* The parts, in the order they are made (runtime.c). */
    hkl_log log;
    hkl_events ev;
    hkl_sources src;
    hkl_metrics metrics;
    hkl_gate gate;
    hkl_reset reset;
    hkl_graphs graph;
    hkl_expectations expect;
    hkl_reclaimer rec;
    hkl_worker work;
    hkl_safe_points sp;

    hkl_test_hooks test; /* tests only: not production state */
};

/* ==== the floors of loader/, lowest first: each file calls only the
 * floors declared before its own (scripts/layers.py checks it) ==== */

/* record.c, expo.c: formats (loader/record.h, loader/expo.h). */

/* job.c: hkl_job_new makes a job of module name from the caller's image and
 * options, copying them (0, HK_ERR_INVALID for a name that could not be
 * recorded or an empty image, HK_ERR_NOMEM); hkl_job_free frees it and all
 * it owns (NULL is fine). */
int hkl_job_new(hkl_job **out, const char *name, const void *data, size_t size,
                const hk_swap_options *opt);
void hkl_job_free(hkl_job *job);

/* log.c. hkl_emit logs the event, then hands it to on_event through
 * hkl_emit_quiet, which a source that logged already uses. */
int hkl_log_init(hk_runtime *rt); /* the parts rt->log and rt->ev */
void hkl_log_finish(hk_runtime *rt);
int hkl_events_init(hk_runtime *rt);
void hkl_events_finish(hk_runtime *rt);
/* From hk_runtime_destroy: from now on no callback of rt (log or event) is
 * called, except on this thread; waits until those in progress on other
 * threads have returned, until until_ms (hkl_now_ms), then HK_ERR_TIMEOUT. */
int hkl_callbacks_close(hk_runtime *rt, double until_ms);
void hkl_log_event(hk_runtime *rt, hk_event_kind kind, const char *module, uint64_t oldv,
                   uint64_t newv, const char *origin, const hk_report *rep);
void hkl_emit_quiet(hk_runtime *rt, hk_event_kind kind, const char *module, uint64_t oldv,
                    uint64_t newv, const char *origin, const hk_report *rep);
void hkl_emit(hk_runtime *rt, hk_event_kind kind, const char *module, uint64_t oldv, uint64_t newv,
              const char *origin, const hk_report *rep);

/* source.c: sources. None of these may be called from a hook.
 *
 * hkl_source_attach attaches src (owned by the caller, which keeps it valid
 * until it is detached or released). Returns 0, HK_ERR_INVALID, or
 * HK_ERR_BUSY when a source of the same kind is attached already.
 *
 * hkl_source_get returns rt's source of this kind. When there is none, it
 * calls make(arg) with src_lock held, so that concurrent callers make one
 * source between them, and attaches what make returns (its kind set to
 * kind); make returns NULL when it fails, and then nothing is attached and
 * hkl_source_get returns NULL. make must not call into the runtime's
 * sources. *made is set to 1 when this call made the source, else 0.
 *
 * hkl_source_detach detaches src (a no-op when it is not attached). When it
 * returns, no hook of src is running or will run, and src is the caller's
 * again; its release hook is not called. */
int hkl_sources_init(hk_runtime *rt);
void hkl_sources_finish(hk_runtime *rt);
int hkl_source_attach(hk_runtime *rt, hkl_source *src);
hkl_source *hkl_source_get(hk_runtime *rt, const void *kind, hkl_source *(*make)(void *arg),
                           void *arg, int *made);
void hkl_source_detach(hk_runtime *rt, hkl_source *src);
/* Calls deps_built of every attached source (worker thread, no lock held). */
void hkl_sources_deps_built(hk_runtime *rt, const char *source_name, const char *const *deps,
                            int n);
/* Detaches every source and calls each one's release hook (destroy, no
 * lock held). */
void hkl_sources_release(hk_runtime *rt);

/* CLOCK_MONOTONIC in ms: util's clock (one for every layer). */
static inline double hkl_now_ms(void) {
    return hku_now_ms();
}

/* context.c: swap_lock with its owner recorded. hkl_swap_lock returns 1 without
 * locking when the calling thread already holds it (a callback run under it):
 * read-only callers go on, others return HK_ERR_BUSY. */
int hkl_swap_lock(hk_runtime *rt);
/* The same, giving up at until_ms (hkl_now_ms's clock): 0 locked, 1 nested,
 * HK_ERR_TIMEOUT. Destroy's, which must not wait on a holder that sits in
 * the driver (the reclaim thread's reset check and its reloads). */
int hkl_swap_lock_by(hk_runtime *rt, double until_ms);
void hkl_swap_unlock(hk_runtime *rt, int nested);
int hkl_swap_held(const hk_runtime *rt);

/* Capture mode of hotkern's driver sections: relaxed, so that they never
 * break another thread's global-mode stream capture. */
CUstreamCaptureMode hkl_relax(hk_runtime *rt);
void hkl_unrelax(hk_runtime *rt, CUstreamCaptureMode old);
/* Records a failed driver call in rep: HK_ERR_CUDA, its CUresult and name. */
int hkl_report_cu(hk_report *rep, const hk_runtime *rt, CUresult r, const char *what);
/* Makes device slot's context current on this thread (0, or the CUresult);
 * hkl_ctx_pop takes it off again. */
int hkl_ctx_push(hk_runtime *rt, int slot);
void hkl_ctx_pop(hk_runtime *rt);

static inline CUcontext hkl_ctx(const hk_runtime *rt, int slot) {
    return atomic_load((_Atomic(CUcontext) *)&rt->dev[slot].ctx);
}

/*
 * Launch gate. The driver takes a reader-preferring lock around every launch
 * and the same lock for writing around loads, cuKernelGetFunction, cuFuncLoad
 * and unloads: under continuous launches from several threads a load waits
 * for ever. Every launch of hotkern's code passes hkl_enter, so the engine
 * holds its own launchers there for the short driver sections that need the
 * writer side (hkl_gate_close/open). A launcher waits at most
 * options.launch_hold_max_us and then goes on: the gate only buys progress;
 * safety comes from the epochs and never depends on it.
 */
/* The launch gate (gate.c). `what` (a string literal) names the driver
 * work done while it is closed, for the message logged when a closing
 * lasts longer than launch_hold_max_us and longer than any before; NULL
 * logs nothing. */
void hkl_gate_close(hk_runtime *rt, const char *what);
void hkl_gate_open(hk_runtime *rt);
void hkl_gate_wait(hk_runtime *rt);
/* The other half of hkl_enter's fence: after it, every launch entry
 * announced before it is visible to the calling thread. */
void hkl_heavy_fence(hk_runtime *rt);

/* gate.c: the part rt->gate, with the launch side's epoch announcement
 * (hkl_enter, loader/gate.h). */
int hkl_gate_init(hk_runtime *rt);
void hkl_gate_finish(hk_runtime *rt);

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

/* reset.c: recovery from a context reset (see there). */
int hkl_reset_init(hk_runtime *rt);
void hkl_reset_finish(hk_runtime *rt);
int hkl_check_reset(hk_runtime *rt); /* swap_lock held; 1 if a reset was handled */
void hkl_emit_reset(hk_runtime *rt); /* no lock held */

/* lkg.c: last known good. lkg_lock (lkg.c's and lkgdisk.c's) comes after swap_lock
 * and before stats_lock and log_lock; it is taken on a launching thread only
 * on the error path, after the driver returned a sticky error.
 * - hkl_lkg_open at create (checks the directory, reads the records, locks
 *   the directory); hkl_lkg_close at destroy (promotes what ran long
 *   enough, writes what is behind, unlocks, frees).
 * - hkl_lkg_hold / hkl_lkg_release: bracket destroy's wait for the reclaim
 *   thread (no engine lock held). With gave_up set (the wait timed out and
 *   the reclaim thread will free the runtime), release writes what is due
 *   without waiting for a writer in progress and lets the directory go, so
 *   a new runtime can take it at once; nothing is written to it afterwards.
 *   Either way it drops the hold, after which the runtime may be freed by
 *   the reclaim thread: the caller must not touch it then unless the wait
 *   succeeded.
 * - hkl_lkg_check: HK_ERR_QUARANTINED when module's image is quarantined
 *   (no engine lock needed). The image is hashed into hash only when the
 *   module has quarantined images to compare it with, and only when
 *   *hashed is 0 (it is set then).
 * - hkl_lkg_pending: version `version` of module, image `hash`, is about to
 *   be published (swap_lock held; the launch gate may be closed: lkg_lock is
 *   only ever held for memory work, and never by a thread inside a launch):
 *   a loss from now on counts it as committed. hkl_lkg_unpending takes it
 *   back (rolled back).
 * - hkl_lkg_committed: v was just committed (swap_lock held): records it in
 *   memory and queues a copy of its image, no disk work; hash is v's
 *   image's (hkl_lkg_hash, taken before the lock) or NULL to hash it here.
 *   hkl_lkg_flush(module) then writes what the commit queued, and its
 *   record, after the image: called by the committing thread once
 *   swap_lock is released (no engine lock held), so nothing waits for the
 *   disk under swap_lock. Concurrent flushes land in commit order (the
 *   newest record wins).
 * - hkl_lkg_sticky: 1 for a CUresult that ends the context for good.
 * - hkl_lkg_lost: handles a sticky error once (quarantine, records, log,
 *   event); no engine lock may be held. */
int hkl_lkg_open(hk_runtime *rt, hk_report *rep);
void hkl_lkg_close(hk_runtime *rt);
int hkl_lkg_check(hk_runtime *rt, const char *module, const void *image, size_t size,
                  uint8_t hash[32], int *hashed, hk_report *rep);
void hkl_lkg_hash(const void *image, size_t size, uint8_t h[32]);
void hkl_lkg_pending(hk_runtime *rt, const char *module, const uint8_t hash[32], uint64_t version,
                     uint64_t release);
void hkl_lkg_unpending(hk_runtime *rt, const char *module, uint64_t version);
void hkl_lkg_committed(hk_runtime *rt, const hkl_version *v, const uint8_t *hash, uint64_t release);
void hkl_lkg_flush(hk_runtime *rt, const char *module);
void hkl_lkg_hold(hk_runtime *rt);
void hkl_lkg_release(hk_runtime *rt, int gave_up);
int hkl_lkg_sticky(int cu_result);
void hkl_lkg_lost(hk_runtime *rt, int cu_result, const char *where);
void hkl_lkg_counts(hk_runtime *rt, uint64_t *lost, uint64_t *quarantined);
/* For restore (restore.c). hkl_lkg_dir: the state directory, or NULL
 * (memory only). hkl_lkg_goods copies out every module's known-good image
 * and what restore needs with it (lkg_lock taken here; *out malloc'd, each
 * item's strings too; returns how many) and the records refused at open
 * (refused, rn bytes). hkl_lkg_read_image reads the kept image of hash
 * (*data malloc'd), which must hash to its name: 0, or an error with why
 * set. No engine lock needed. */
typedef struct hkl_lkg_good {
    char module[HKL_NAME_MAX];
    hkl_rec_image good;
    int nexpr; /* the good image's name expressions */
    char **expr, **lowered;
    int runs; /* this process runs it already */
} hkl_lkg_good;
const char *hkl_lkg_dir(const hk_runtime *rt);
int hkl_lkg_goods(hk_runtime *rt, hkl_lkg_good **out, char *refused, size_t rn);
int hkl_lkg_read_image(hk_runtime *rt, const uint8_t hash[32], char **data, size_t *n, char *why,
                       size_t whyn);
/* Tests: the clock the suspect window is measured with (ms). */
void hkl_lkg_set_clock(hk_runtime *rt, double (*now)(void));

int hkl_metrics_init(hk_runtime *rt); /* metrics.c: the part rt->metrics */
void hkl_metrics_finish(hk_runtime *rt);
/* metrics.c: one committed swap of total_ms (stats_lock held). */
void hkl_hist_observe(hkl_hist *h, double total_ms);
/* A swap's outcome into the counters (stats_lock taken here): committed or
 * refused, a rollback or not, and the times of its report. */
void hkl_count_swap(hk_runtime *rt, int committed, int rollback, const hk_report *rep);
/* Fills rep's total (since t_start, hkl_now_ms; 0: not known) and the part
 * of it no step accounts for (waiting for the lock, a safe point, reset
 * recovery). */
void hkl_report_times(hk_report *rep, double t_start);
/* The engine's families from a snapshot of its counters (h may be NULL). */
void hkl_metrics_engine(hk_metrics_writer *w, const hk_stats *s, const hkl_hist *h);

/* launch.c: kernel handles, launches, pins. */
/* Room for one more handle in m's list (swap_lock held): 0 or HK_ERR_NOMEM. */
int hkl_kernels_reserve(hkl_module *m);
/* Applies the attributes set through k to its kernel in v (swap_lock held,
 * gate closed): 0 or the driver's refusal, rep saying which. */
int hkl_apply_attrs(hk_runtime *rt, hkl_version *v, const hk_kernel *k, hk_report *rep);
/* hk_launch_ex with a driver launch configuration as the caller has it (its
 * attributes passed on as they are): for the <<<>>> interposition. */
int hkl_launch_lc(hk_kernel *k, const CUlaunchConfig *lc, void **args, int *cu);
/* Drops a pin of v (a graph's, a capture's), waking the reclaim thread. */
void hkl_version_unpin(hk_runtime *rt, hkl_version *v);
/* The CUfunction of v's slot in the context current on this thread. */
CUresult hkl_function_of(hk_runtime *rt, hkl_version *v, int slot, CUfunction *f);
/* Drops one reference of the runtime's hkl_rtref (its own, or a captured
 * launch's pin's), freeing it with the last. */
void hkl_rtref_put(hkl_rtref *ref);

/* graph.c: registered graphs. hkl_graphs_retarget points every registered
 * node of m at v (swap_lock held); a node that cannot be retargeted keeps
 * running old (pinned for it) and the report says so. hkl_graphs_free at
 * free. */
int hkl_graphs_retarget(hk_runtime *rt, hkl_module *m, hkl_version *v, hkl_version *old,
                        hk_report *rep);
int hkl_graphs_init(hk_runtime *rt);
void hkl_graphs_finish(hk_runtime *rt);

/* expect.c, expect_tu.c, expect_global.c: the program's own kernels and
 * globals: loader/expect.h. */

/* expect.c's launch configurations, settings and fallback, and fit.c's
 * check: loader/fit.h. */

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

/* swap.c: the swap transaction. hkl_swap_job swaps in a built job (its
 * artifact filled: by the build step, or by restore): swap_lock taken here
 * (HK_ERR_BUSY when this thread holds it already: a check callback),
 * outcome counted and emitted. Returns 0 (committed, or the running
 * version is this image already) or the refusal. The job stays the
 * caller's. */
int hkl_swap_job(hk_runtime *rt, hkl_job *job, hk_report *rep);

/* reclaim.c. hkl_reclaim_start starts the reclaim thread; free_rt frees
 * the runtime (runtime.c's), which the thread calls after its final pass
 * when destroy stopped waiting for it. */
int hkl_reclaim_init(hk_runtime *rt);
void hkl_reclaim_finish(hk_runtime *rt);
int hkl_reclaim_start(hk_runtime *rt, void (*free_rt)(hk_runtime *rt));
void hkl_reclaim_stop(hk_runtime *rt);
/* Destroy's: every current version joins the retired ones for the final
 * pass (swap_lock held). */
void hkl_retire_all(hk_runtime *rt);
void hkl_reclaim_deferred(hk_runtime *rt);            /* from hk_safe_point */
int hkl_reclaim_join(hk_runtime *rt, int timeout_ms); /* 0, or HK_ERR_TIMEOUT */

/* worker.c: hk_swap, hk_submit, the worker thread and safe points.
 * Starts the worker. finish is the rest of hk_runtime_destroy after the
 * worker has stopped (runtime.c's), which the worker runs itself when
 * destroy stopped waiting for its build. */
int hkl_worker_init(hk_runtime *rt);
void hkl_worker_finish(hk_runtime *rt);
int hkl_safe_points_init(hk_runtime *rt);
int hkl_worker_start(hk_runtime *rt, void (*finish)(hk_runtime *rt, double until_ms));
/* hk_submit for a source whose submissions of a module replace each other
 * (the watcher: each save holds the whole new content). A job submitted
 * this way is superseded by a later one of the same module submitted this
 * way too: still queued, it is never built; built, it is not staged (and
 * runs no canary). It then ends with HK_EVENT_REFUSED and
 * HK_ERR_SUPERSEDED, on the worker. Jobs of hk_submit and hk_swap neither
 * supersede nor are superseded. Safe from any thread; returns as hk_submit. */
int hkl_submit_latest(hk_runtime *rt, const char *name, const void *image, size_t size,
                      const hk_swap_options *opt);
/* Stops the worker, waiting for a build in progress until until_ms
 * (hkl_now_ms): 0 when it has ended, HK_ERR_TIMEOUT when not (it then runs
 * the teardown itself when its build returns). */
int hkl_worker_stop(hk_runtime *rt, double until_ms);
/* Ends the jobs still queued (waiters get HK_ERR_CLOSED); worker stopped. */
void hkl_worker_drain(hk_runtime *rt);

/* Automatic safe points: loader/safepoint.h. */

/* runtime.c: create and destroy. hkl_runtime_create_with is hk_runtime_create
 * with a driver table of the caller's (base/driver.h): a real one is taken
 * over, a fake one (dl NULL, the tests') stays the caller's. */
int hkl_runtime_create_with(hk_runtime **out, const hk_options *opt, const hkb_driver *drv,
                            hk_report *rep);

#include "loader/expect.h" /* the program's translation units, symbol copies, late builds */

#endif /* HK_LOADER_H */

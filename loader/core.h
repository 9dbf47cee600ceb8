/*
 * loader/core.h: the runtime and its objects, for every file of loader/.
 * Each part's functions are in its own header (loader/gate.h, version.h,
 * ...); what the folders above may use is loader/port.h, included here.
 *
 * Locks, in the order they may be taken (never the other way round):
 *   src_lock (rt->src.lock) the attached sources. Taken with no other lock
 *                        of the runtime held; a source's hook runs under it
 *                        and takes only its own locks (and may submit).
 *   swap_lock (rt->swap_lock) serialises swaps, rollbacks, handle creation,
 *                        graph registration, reset recovery; protects module
 *                        lists, histories and handles' layouts. Its owner is
 *                        kept in a thread-local, so that a callback run under
 *                        it can be answered at once instead of waiting.
 *   lkg_lock (lkgdisk.h) last-known-good records and quarantine, in memory
 *                        (lkg.c, lkgdisk.c): never held across a file write
 *                        (lkgdisk.c's writers take their own locks before
 *                        lkg_lock, with no engine lock held). Taken under
 *                        swap_lock by commits, and alone by the thread that
 *                        saw a sticky error (a launching thread, on the
 *                        error path only) and by the query functions.
 *   the launch gate      not a lock: while closed, hotkern's launches wait at
 *                        hkl_enter (gate.h). Closed by swap_lock holders and
 *                        the reclaim thread.
 *   graph_lock (rt->graph.lock) rwlock, writers first: hk_graph_launch
 *                        (read) vs retargeting and (un)registration (write).
 *   unload_lock (rt->reset.unload_lock) a module unload vs reset recovery
 *                        replacing the context the module lived in.
 *   work_lock (rt->work.lock) the worker's job queue, the safe-point queue.
 *   rec_lock (rt->rec.lock) the retired list, the reclaim thread's wake-ups.
 *   gate_lock, stats_lock, expect_lock, evq_lock (rt->gate.lock,
 *                        rt->metrics.lock, rt->expect.lock, rt->ev.lock) leaves.
 *   log_lock (rt->log.lock) rwlock, innermost of all: messages are delivered
 *                        under it (read), from under any other lock, the
 *                        sources' included; hk_runtime_set_log writes.
 * The launch path takes none of them: it announces itself in a per-thread
 * epoch slot, checks the gate, loads `current` once and calls the driver.
 */
#ifndef HK_LOADER_CORE_H
#define HK_LOADER_CORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "canary/canary.h"
#include "hotkern/hotkern.h"
#include "base/driver.h"
#include "loader/port.h"
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
 * (hkl_tslot, hkl_param_layout, hkl_expect, hkl_source: loader/port.h.)
 */
typedef struct hkl_module hkl_module;
typedef struct hkl_version hkl_version;
typedef struct hkl_job hkl_job;
typedef struct hkl_graph hkl_graph;
typedef struct hkl_lkg hkl_lkg;
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
struct hkl_tslot {
    /* One cache line per slot: launching threads never share a line. */
    _Alignas(64) _Atomic uint64_t active; /* 0: not in a launch; else epoch at entry */
    _Atomic int in_use;                   /* free / owned / orphaned: gate.c */
    struct hkl_tslot *next;               /* immutable once published on rt->gate.slots */
    hk_runtime *rt;
};

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

/* Swap durations (loader/metrics.c): counts per fixed bucket, not
 * cumulative; the last bucket is +Inf. */
#define HKL_HIST_BUCKETS 17
typedef struct hkl_hist {
    uint64_t n[HKL_HIST_BUCKETS];
    uint64_t count;
    uint64_t sum_us;
} hkl_hist;

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

/* The launch-side epochs and the launch gate (gate.c). Read elsewhere:
 * epoch, asym_fence and closers by gate.h's hkl_enter on every launch (and
 * closers by expect_global.c's copies), slots by the reclaim thread's grace
 * periods, the counters by hk_stats_get. */
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
    _Atomic uint64_t launch_errors;                 /* launches the driver refused, for hk_stats */
    pthread_mutex_t lock;                           /* gate_lock */
    pthread_cond_t cond;                            /* gate_lock: broadcast when the gate opens */
} hkl_gate;

/* Reset recovery (reset.c). unload_lock orders a module unload (version.c)
 * against reset recovery replacing the context the module lived in; gen
 * is read where a version's context generation is checked (version.c,
 * launch.c, expect_global.c), suspect by the reclaim thread. */
typedef struct hkl_reset {
    pthread_mutex_t unload_lock;
    _Atomic uint64_t gen; /* bumped by reset recovery under unload_lock */
    _Atomic int suspect;  /* a launch failed as after a reset (launch.c sets it) */
} hkl_reset;

/* The reclaim thread and the retired versions (reclaim.c). Under rec_lock
 * elsewhere: hkl_retire and hkl_reclaim_kick (version.c) hand it work, a
 * dropped pin wakes it (launch.c), hk_stats_get reads nretired, and
 * destroy sets retire_all (runtime.c). */
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
    hkl_gate gate;
    hkl_reset reset;
    hkl_metrics metrics;
    hkl_graphs graph;
    hkl_expectations expect;
    hkl_reclaimer rec;
    hkl_worker work;
    hkl_safe_points sp;

    hkl_test_hooks test; /* tests only: not production state */
};

/* CLOCK_MONOTONIC in ms: util's clock (one for every layer). */
static inline double hkl_now_ms(void) {
    return hku_now_ms();
}

/* Device slot's context (reset recovery may replace it; read without a lock). */
static inline CUcontext hkl_ctx(const hk_runtime *rt, int slot) {
    return atomic_load((_Atomic(CUcontext) *)&rt->dev[slot].ctx);
}

#endif /* HK_LOADER_CORE_H */

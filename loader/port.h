/*
 * loader/port.h: the engine as the folders above loader/ see it (watch/,
 * interpose/, and any source to come): the one header of loader/ they may
 * include (scripts/layers.py checks it). A source feeds the runtime
 * through the public API and through these few functions, types and
 * hooks; it reads no field of the runtime, whose layout (loader/core.h,
 * which includes this header) stays loader/'s own. Each function is
 * documented here and defined in the file named at it.
 */
#ifndef HK_LOADER_PORT_H
#define HK_LOADER_PORT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "hotkern/hotkern.h"
#include "base/driver.h"

typedef struct hkl_tslot hkl_tslot;     /* a launching thread's epoch slot (gate.c) */
typedef struct hkl_expect hkl_expect;   /* one of the program's kernels (expect.c) */
typedef struct hkl_xglobal hkl_xglobal; /* one of the program's globals (expect_global.c) */

/* ---- the runtime ---------------------------------------------------------- */

/* runtime.c. hkl_runtime_create_with is hk_runtime_create with a driver
 * table of the caller's (base/driver.h): a real one is taken over, a fake
 * one (dl NULL, the tests') stays the caller's. hkl_driver: the runtime's
 * driver table; hkl_device_ordinal and hkl_context: device slot's ordinal
 * and context (reset recovery may replace the context: read it at each
 * use). Any thread, no lock. */
int hkl_runtime_create_with(hk_runtime **out, const hk_options *opt, const hkb_driver *drv,
                            hk_report *rep);
const hkb_driver *hkl_driver(const hk_runtime *rt);
int hkl_device_ordinal(const hk_runtime *rt, int slot);
CUcontext hkl_context(const hk_runtime *rt, int slot);

/* context.c. The capture mode of hotkern's driver sections: relaxed, so
 * that they never break another thread's global-mode stream capture
 * (hkl_unrelax puts the caller's back). hkl_ctx_push makes device slot's
 * context current on this thread (0, or the CUresult); hkl_ctx_pop takes
 * it off again. */
CUstreamCaptureMode hkl_relax(hk_runtime *rt);
void hkl_unrelax(hk_runtime *rt, CUstreamCaptureMode old);
int hkl_ctx_push(hk_runtime *rt, int slot);
void hkl_ctx_pop(hk_runtime *rt);

/* ---- sources -------------------------------------------------------------- */

/*
 * What feeds the runtime (the directory watcher, the network endpoint, the
 * puller) lives outside loader/ and submits through the public API; the
 * engine includes none of it. A source that needs something back attaches
 * an hkl_source (below) to the runtime: the engine calls its deps_built
 * after each build, its metrics from hk_metrics_text and its release at
 * hk_runtime_destroy, and knows nothing else about it.
 */
/* A source's hooks, attached to one runtime (source.c). The engine calls
 * them; it never calls the source in any other way. */
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

/* source.c. hkl_source_get returns rt's source of this kind. When there is
 * none, it calls make(arg) with src_lock held, so that concurrent callers
 * make one source between them, and attaches what make returns (its kind
 * set to kind); make returns NULL when it fails, and then nothing is
 * attached and hkl_source_get returns NULL. make must not call into the
 * runtime's sources. *made is set to 1 when this call made the source,
 * else 0. Not from a hook. */
hkl_source *hkl_source_get(hk_runtime *rt, const void *kind, hkl_source *(*make)(void *arg),
                           void *arg, int *made);

/* worker.c. hk_submit for a source whose submissions of a module replace
 * each other (the watcher: each save holds the whole new content). A job
 * submitted this way is superseded by a later one of the same module
 * submitted this way too: still queued, it is never built; built, it is
 * not staged (and runs no canary). It then ends with HK_EVENT_REFUSED and
 * HK_ERR_SUPERSEDED, on the worker. Jobs of hk_submit and hk_swap neither
 * supersede nor are superseded. Safe from any thread; returns as hk_submit. */
int hkl_submit_latest(hk_runtime *rt, const char *name, const void *image, size_t size,
                      const hk_swap_options *opt);

/* log.c. Hands an event to the application (the event queue, on_event)
 * without logging it: for a source that logged it already. Any thread. */
void hkl_emit_quiet(hk_runtime *rt, hk_event_kind kind, const char *module, uint64_t oldv,
                    uint64_t newv, const char *origin, const hk_report *rep);

/* ---- the program's own kernels and globals (the <<<>>> interposition) ---- */

typedef struct hkl_param_layout {
    int n;
    uint32_t *offset; /* n entries each */
    uint32_t *size;
} hkl_param_layout;

/* The launch configurations the program has used for one of its kernels:
 * maxima, raised by the launching threads with relaxed atomics (a load and a
 * compare per launch; a store only when a launch exceeds them), read by the
 * launchability check before a commit (fit.c). 0: none seen. */
typedef struct hkl_use {
    _Atomic uint32_t threads;    /* threads per block */
    _Atomic uint32_t smem;       /* dynamic shared memory, bytes */
    _Atomic uint32_t cluster[3]; /* cluster dimensions a launch attribute set */
    _Atomic uint32_t coop_blocks, coop_threads, coop_smem; /* cooperative launches */
} hkl_use;

static inline void hkl_use_max(_Atomic uint32_t *a, uint64_t v) {
    uint32_t want = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
    uint32_t o = atomic_load_explicit(a, memory_order_relaxed);
    while (__builtin_expect(want > o, 0) &&
           !atomic_compare_exchange_weak_explicit(a, &o, want, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/* A launch of block b with smem bytes of dynamic shared memory. */
static inline void hkl_use_note(hkl_use *u, unsigned bx, unsigned by, unsigned bz, size_t smem) {
    hkl_use_max(&u->threads, (uint64_t)bx * by * bz);
    hkl_use_max(&u->smem, smem);
}

/* expect.c: the program's own kernels (see the top of expect.c).
 * - hkl_expect_kernel registers the program's kernel `name` (entry name: C
 *   or mangled), the layout its call sites pass and the name expression that
 *   instantiates it in a hot build (NULL: none needed), the translation unit
 *   it was registered from (0: unknown; expect_tu.c), and binds it at once
 *   to a committed version that has it; returns the entry (valid until
 *   destroy; the same for the same name) or NULL. Takes swap_lock.
 * - hkl_expect_handle: the handle the program's launches of it go to, or
 *   NULL while no hot version has it. No lock: one acquire load.
 * - hkl_expect_use: e's configurations (valid as long as e).
 * - hkl_expect_set_attr records attribute attr (a CUfunction_attribute; -1:
 *   the cache config) set by the program on its kernel, for every hot
 *   version to take at bind and at each swap, and sets it on the version
 *   that runs now; one that does not take it sends its module back to the
 *   program's code (as hkl_expect_fallback). Takes swap_lock (not from a
 *   check callback: then recorded only, for the next versions).
 * - hkl_expect_fallback: a hot launch of e's version failed with cu (what
 *   says which launch; the program's own launch of the same call returned
 *   prog, -1: not a launch but a setting the version refused): its module's
 *   program kernels go back to the program's code until the module's next
 *   commit, counted, logged and emitted (HK_EVENT_FALLBACK). Takes
 *   expect_lock and stats_lock only: called by launching threads.
 * - hkl_late_submit (worker.c) builds again, once, the kept source of each
 *   module a program's template instance first launched after its build is
 *   missing from; queued behind what is queued, with the kept source's
 *   submission number, so that a save submitted since is never replaced by
 *   it. Any thread but one that holds an engine lock. */
hkl_expect *hkl_expect_kernel(hk_runtime *rt, const char *name, const char *expr,
                              const hkl_param_layout *layout, unsigned tu);
hk_kernel *hkl_expect_handle(const hkl_expect *e);
const char *hkl_expect_name(const hkl_expect *e);
hkl_use *hkl_expect_use(hkl_expect *e);
int hkl_expect_set_attr(hk_runtime *rt, hkl_expect *e, int attr, int value, hk_report *rep);
void hkl_expect_fallback(hk_runtime *rt, hkl_expect *e, int cu, const char *what, int prog);
void hkl_late_submit(hk_runtime *rt);

/* launch.c: hkl_launch_lc is hk_launch_ex with a driver launch
 * configuration as the caller has it (its attributes passed on as they
 * are), for the <<<>>> interposition; hkl_kernel_runtime is k's runtime
 * (immutable, no lock). lkg.c: hkl_lkg_sticky is 1 for a CUresult that
 * ends the context for good. */
int hkl_launch_lc(hk_kernel *k, const CUlaunchConfig *lc, void **args, int *cu);
hk_runtime *hkl_kernel_runtime(const hk_kernel *k);
int hkl_lkg_sticky(int cu_result);

/* expect_global.c: the program's globals. hkl_expect_global registers the
 * program's global `name` of TU tu (its copy at orig, device slot 0, size
 * bytes; *out: its entry) and binds it to a version committed already. The
 * host's copy to or from the running version's copy of g: between
 * hkl_xglobal_enter (NULL: no hot copy, the program's alone; else *dptr is
 * it) and hkl_xglobal_exit, no commit moves it and no unload frees it. No
 * lock; waits while the gate is closed. */
int hkl_expect_global(hk_runtime *rt, const char *name, uint64_t orig, size_t size, unsigned tu,
                      hkl_xglobal **out);
hkl_tslot *hkl_xglobal_enter(hk_runtime *rt, hkl_xglobal *g, uint64_t *dptr);
void hkl_xglobal_exit(hkl_tslot *s);
size_t hkl_xglobal_size(const hkl_xglobal *g);

/* expect_tu.c: the program's translation units (see there). hkl_expect_tu:
 * TU `id` (> 0, never reused) has source file stem `file` (NULL: unknown)
 * and the n kernel and variable names, the first nplain of them no
 * template instances; hkl_expect_tu_gone: it was unregistered (dlclose). */
int hkl_expect_tu(hk_runtime *rt, unsigned id, const char *file, const char *const *names, int n,
                  int nplain);
void hkl_expect_tu_gone(hk_runtime *rt, unsigned id);

/* ---- automatic safe points (worker.c; loader/safepoint.h) ---------------- */

/* For a source that sees when the program's GPU work is idle without the
 * program saying so (the <<<>>> interposition watches its
 * synchronisations). hkl_auto_safe_points turns them on for rt: from then
 * on a version staged with HK_STAGE_AUTO waits for a safe point (up to
 * safe_point_wait_ms) unless own_thread() says the requesting thread is one
 * whose own calls bring the idle moments (it would wait for itself), and
 * every replaced version (but one replaced by an HK_STAGE_NOW swap) is
 * unloaded at a safe point too (or by the reclaim thread
 * safe_point_wait_ms after it could have been). hkl_safe_point_wanted (one
 * relaxed load) says whether anything waits for one; hkl_idle_point is
 * hk_safe_point for such a source: the program's GPU work is idle now. */
void hkl_auto_safe_points(hk_runtime *rt, int (*own_thread)(void));
int hkl_safe_point_wanted(hk_runtime *rt);
int hkl_idle_point(hk_runtime *rt);

#endif /* HK_LOADER_PORT_H */

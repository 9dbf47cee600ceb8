/*
 * The runtime object: create (taking the driver binding over, attaching to
 * each device's context, starting the threads) and destroy, wiring the
 * floors of loader/ below it together.
 *
 * Attaching. The CUDA runtime API runs every call in the device's primary
 * context, unless the application made another context current on the thread.
 * cuDevicePrimaryCtxRetain returns that very primary context whether the
 * runtime created it already (cudaSetDevice / cudaFree(0) came first) or not
 * (then the runtime will adopt the one we retained), so retaining is right in
 * both orders; a non-primary context current on the creating thread wins, as
 * it would for the runtime. We never create or destroy a context, and release
 * exactly the retains we took; a reset context is replaced by reset.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/exit.h"
#include "base/abi.h"
#include "loader/canary.h"
#include "loader/context.h"
#include "loader/expect.h"
#include "loader/gate.h"
#include "loader/graph.h"
#include "loader/launch.h"
#include "loader/lkg.h"
#include "loader/log.h"
#include "loader/metrics.h"
#include "loader/reclaim.h"
#include "loader/reset.h"
#include "loader/source.h"
#include "loader/version.h"
#include "loader/worker.h"

/* The teardown (below), parts of which the threads started here may run. */
static void runtime_free(hk_runtime *rt);
static void runtime_finish(hk_runtime *rt, double until);

/* The defaults, one a line (every hk_*_options_init_size has this shape,
 * with its own data). */
int hk_options_init_size(hk_options *o, size_t size) {
    hk_options d;
    memset(&d, 0, sizeof d);
    d.loader = HK_LOADER_LIBRARY;
    d.ptx_mode = HK_PTX_NVJITLINK;
    d.jit_opt_level = 4;
    d.history = 4;
    d.cache_max_bytes = 256ull << 20;
    d.safe_point_wait_ms = 2000;
    d.launch_hold_max_us = 1000;
    d.destroy_wait_ms = 5000;
    d.canary_timeout_ms = 2000;
    d.suspect_window_ms = 60000;
    d.build_timeout_ms = 120000;
    d.log_min_level = HK_LOG_INFO;
    d.canary_slowdown_max = 4.0;
    d.canary_slowdown_min_ms = 1.0;
    return hkb_sized_init(o, size, &d, sizeof d, HKB_OPTIONS_SIZE0);
}

int hk_build_keep_memory(hk_report *rep) {
    char why[192] = "";
    int r = hkp_keep_heap(0, why, sizeof why);
    if (r <= 0)
        hku_fail(rep, r, "hk_build_keep_memory: %s", why);
    return r;
}

static int attach_device(hk_runtime *rt, int slot, int ordinal, hk_report *rep) {
    const hkb_driver *d = rt->drv;
    hkl_device *dv = &rt->dev[slot];
    CUresult r;
    dv->ordinal = ordinal;
    if ((r = d->DeviceGet(&dv->dev, ordinal)) != CUDA_SUCCESS) {
        hkl_report_cu(rep, rt, r, "cuDeviceGet");
        hku_fail(rep, HK_ERR_NO_DEVICE, "no CUDA device %d (%s)", ordinal, hkb_cu_name(d, r));
        return HK_ERR_NO_DEVICE;
    }
    int major = 0, minor = 0;
    d->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dv->dev);
    d->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dv->dev);
    dv->arch = major * 10 + minor;

    CUcontext cur = NULL, prim = NULL;
    d->CtxGetCurrent(&cur);
    if ((r = d->DevicePrimaryCtxRetain(&prim, dv->dev)) != CUDA_SUCCESS)
        return hkl_report_cu(rep, rt, r, "cuDevicePrimaryCtxRetain");
    dv->retains = 1;
    atomic_store(&dv->ctx, prim);
    if (cur && cur != prim) {
        /* The application made its own context current: the runtime API
         * would use that one on this thread, so we do too. */
        CUdevice cd;
        if (d->CtxGetDevice(&cd, cur) == CUDA_SUCCESS && cd == dv->dev) {
            d->DevicePrimaryCtxRelease(dv->dev);
            dv->retains = 0;
            atomic_store(&dv->ctx, cur);
        }
    }
    if ((r = d->CtxGetId(hkl_ctx(rt, slot), &dv->ctx_id)) != CUDA_SUCCESS)
        return hkl_report_cu(rep, rt, r, "cuCtxGetId");
    return 0;
}

/* Arguments a runtime cannot be made with. Returns 0 or the error, with rep
 * saying why. */
static int check_args(hk_runtime **out, const hk_options *o, int ndev, hk_report *rep) {
    if (!out || ndev > HKL_MAX_DEVICES || o->jit_opt_level < 0 || o->jit_opt_level > 4 ||
        o->history < 0 || o->launch_hold_max_us < 0 || o->destroy_wait_ms < 0) {
        hku_fail(rep, HK_ERR_INVALID, "bad options (devices 1..%d, jit_opt_level 0..4)",
                 HKL_MAX_DEVICES);
        return HK_ERR_INVALID;
    }
    if (isnan(o->canary_slowdown_max) || isnan(o->canary_slowdown_min_ms) ||
        o->canary_sanitizer < -1 || o->canary_sanitizer > 1) {
        hku_fail(rep, HK_ERR_INVALID,
                 "bad canary options (canary_slowdown_max and _min_ms numbers, canary_sanitizer "
                 "-1, 0 or 1)");
        return HK_ERR_INVALID;
    }
    if (o->loader == HK_LOADER_MODULE && ndev != 1) {
        hku_fail(rep, HK_ERR_UNSUPPORTED,
                 "the module loader attaches one device; use the library loader");
        return HK_ERR_UNSUPPORTED;
    }
    return 0;
}

/* The runtime's parts (core.h), in the order they are made; they are
 * taken apart in the reverse order (runtime_free), and a part that cannot
 * be made takes those made before it apart again. */
static const struct {
    int (*init)(hk_runtime *rt);
    void (*finish)(hk_runtime *rt); /* NULL: nothing to take apart */
} parts[] = {
    {hkl_log_init, hkl_log_finish},         {hkl_events_init, hkl_events_finish},
    {hkl_sources_init, hkl_sources_finish}, {hkl_gate_init, hkl_gate_finish},
    {hkl_reset_init, hkl_reset_finish},     {hkl_metrics_init, hkl_metrics_finish},
    {hkl_graphs_init, hkl_graphs_finish},   {hkl_expect_init, hkl_expect_finish},
    {hkl_reclaim_init, hkl_reclaim_finish}, {hkl_worker_init, hkl_worker_finish},
    {hkl_safe_points_init, NULL},
};
#define NPARTS (sizeof parts / sizeof parts[0])

/* Takes apart the first n parts, last first. */
static void parts_finish(hk_runtime *rt, size_t n) {
    while (n-- > 0)
        if (parts[n].finish)
            parts[n].finish(rt);
}

/* A runtime with checked options o and nothing attached yet; NULL when out
 * of memory. A real driver table (one with a library handle) is owned by
 * the runtime from here on, before any thread can read it; a fake one stays
 * the caller's (and a real one too when this fails: the caller closes it). */
static hk_runtime *runtime_new(const hk_options *o, int ndev, const hkb_driver *drv) {
    hk_runtime *rt = calloc(1, sizeof *rt);
    hkl_rtref *ref = calloc(1, sizeof *ref);
    size_t made = 0;
    if (!rt || !ref || pthread_mutex_init(&rt->swap_lock, NULL)) {
        free(rt);
        free(ref);
        return NULL;
    }
    if (drv->dl) {
        rt->drv_own = *drv;
        rt->drv = &rt->drv_own;
    } else {
        rt->drv = drv;
    }
    rt->opt = *o;
    rt->opt.devices = NULL;
    rt->ndev = ndev;
    static _Atomic uint64_t next_id = 1;
    rt->id = atomic_fetch_add(&next_id, 1);
    while (made < NPARTS && parts[made].init(rt) == 0)
        made++;
    if (made < NPARTS || pthread_mutex_init(&ref->lock, NULL)) {
        parts_finish(rt, made);
        pthread_mutex_destroy(&rt->swap_lock);
        free(rt);
        free(ref);
        return NULL;
    }
    rt->ref = ref;
    ref->rt = rt;
    atomic_init(&ref->refs, 1);
    return rt;
}

/* Attaches the ndev devices of devs, which must be distinct and, unless
 * options.arch says which code to load, of one architecture. */
static int attach_devices(hk_runtime *rt, const int *devs, int ndev, hk_report *rep) {
    int err;
    for (int i = 0; i < ndev; i++) {
        for (int j = 0; j < i; j++)
            if (devs[j] == devs[i]) {
                hku_fail(rep, HK_ERR_INVALID, "device %d listed twice", devs[i]);
                return HK_ERR_INVALID;
            }
        if ((err = attach_device(rt, i, devs[i], rep)) < 0)
            return err;
        if (i > 0 && rt->dev[i].arch != rt->dev[0].arch && !rt->opt.arch) {
            hku_fail(rep, HK_ERR_UNSUPPORTED,
                     "devices of different architectures (sm_%d, sm_%d): set "
                     "options.arch and give fatbins, or attach them separately",
                     rt->dev[0].arch, rt->dev[i].arch);
            return HK_ERR_UNSUPPORTED;
        }
    }
    rt->arch = rt->opt.arch ? rt->opt.arch : rt->dev[0].arch;
    return 0;
}

/* Opens the compile cache options.cache_dir names (NULL: the default one,
 * "": none). A cache that cannot be opened costs speed, not correctness;
 * one refused (another user could change it) is logged. */
static void open_cache(hk_runtime *rt, const char *dir) {
    if (!dir || *dir) {
        char buf[4096];
        int have = 0;
        hk_report r = HK_REPORT_INIT;
        if (dir)
            have = snprintf(buf, sizeof buf, "%s", dir) < (int)sizeof buf;
        else
            have = hkp_cache_default_dir(buf, sizeof buf) == 0;
        if (have && hkp_cache_open(&rt->cache, buf, rt->opt.cache_max_bytes, &r) == 0) {
            rt->cache_dir = strdup(buf);
        } else {
            rt->cache = NULL;
            if (r.message[0])
                hk_log(rt, HK_LOG_WARN, "engine", "builds are not cached: %s", r.message);
        }
    }
    rt->opt.cache_dir = rt->cache_dir;
}

/* Everything of a runtime after its devices: cache, headers, the warm-up
 * and the reclaim and worker threads. */
static int runtime_start(hk_runtime *rt, const hk_options *o, hk_report *rep) {
    open_cache(rt, o->cache_dir);
    int err = hku_headers_dup(o->headers, o->nheaders > 0 ? o->nheaders : 0, &rt->headers);
    if (err < 0) {
        hku_fail(rep, err, "options.headers: %s",
                 err == HK_ERR_INVALID ? "a header without a name or data" : "no memory");
        return err;
    }
    rt->opt.headers = rt->headers;
    rt->opt.nheaders = rt->headers ? o->nheaders : 0;
    /* Compiling here, the process's first compile is made now, before any
     * thread of the runtime compiles (ptx/warm.c): an exit during it would
     * crash under NVRTC's teardown. A runtime that cannot warm up still
     * works: its first build pays. Isolated, the helper warms itself up
     * (hkl_build_start). */
    if (!o->build_isolated)
        hkp_first_compile(rt->arch);
    if (!o->no_warm_start && !o->build_isolated && hkp_warm_start(&rt->warm, rt->arch) < 0)
        rt->warm = NULL;
    if ((err = hkl_build_start(rt, rep)) < 0)
        return err;
    if ((err = hkl_lkg_open(rt, rep)) < 0)
        return err;
    if ((err = hkl_canary_start(rt, rep)) < 0)
        return err;
    /* Each thread is given the part of the teardown it runs itself when
     * destroy stops waiting for it. */
    if ((err = hkl_reclaim_start(rt, runtime_free)) < 0 ||
        (err = hkl_worker_start(rt, runtime_finish)) < 0) {
        hku_fail(rep, err, "cannot start hotkern threads");
        return err;
    }
    return 0;
}

static int create_with(hk_runtime **out, const hk_options *opt, const hkb_driver *drv,
                       hk_report *rep) {
    static const int dev0 = 0;
    hk_options o;
    int err = 0;
    if (out)
        *out = NULL;
    hk_options_init(&o);
    if (opt && hkb_sized_in(&o, sizeof o, opt, HKB_OPTIONS_SIZE0) < 0) {
        hku_fail(rep, HK_ERR_INVALID, "hk_options.size %zu is below the first layout (%zu)",
                 hkb_size_of(opt), (size_t)HKB_OPTIONS_SIZE0);
        err = HK_ERR_INVALID;
    }
    const int *devs = o.devices ? o.devices : &dev0;
    int ndev = o.ndevices > 0 ? o.ndevices : 1;
    if (!err)
        err = check_args(out, &o, ndev, rep);
    if (!err && hkb_exiting())
        err = hku_fail(rep, HK_ERR_CLOSED, "the process is exiting: no runtime is made");
    if (o.history == 0)
        o.history = 1;
    if (o.launch_hold_max_us == 0)
        o.launch_hold_max_us = 1000;
    hk_runtime *rt = err ? NULL : runtime_new(&o, ndev, drv);
    if (!rt) {
        if (drv->dl)
            hkb_driver_close((hkb_driver *)drv);
        return err ? err : HK_ERR_NOMEM;
    }
    if ((err = attach_devices(rt, devs, ndev, rep)) == 0) {
        /* From here on the process's exit waits for this runtime's driver
         * and NVRTC work (base/exit.h): registered after the driver's exit
         * handlers (bound now) and before any thread of the runtime starts,
         * the guard runs before them. NVRTC registers more at a process's
         * first compile, which runtime_start makes before any thread of the
         * runtime compiles (ptx/build.c registers the guard again after it);
         * isolated builds (the interposition's) never compile here. */
        hkb_exit_guard(o.destroy_wait_ms);
    }
    if (err < 0 || (err = runtime_start(rt, &o, rep)) < 0) {
        if (rep && !rep->error)
            rep->error = err;
        hk_runtime_destroy(rt); /* closes an owned driver table */
        return err;
    }
    *out = rt;
    if (o.restore && o.state_dir && *o.state_dir) {
        /* Logged by restore; a module that cannot come back is the
         * application's to load, as without a state directory. */
        hk_report rr = HK_REPORT_INIT;
        (void)hk_runtime_restore(rt, &rr);
        hk_report_clear(&rr);
    }
    return 0;
}

int hkl_runtime_create_with(hk_runtime **out, const hk_options *opt, const hkb_driver *drv,
                            hk_report *rep) {
    hk_report full;
    if (hkb_report_in(&full, rep) < 0) {
        if (drv->dl)
            hkb_driver_close((hkb_driver *)drv);
        return HK_ERR_INVALID;
    }
    int err = create_with(out, opt, drv, rep ? &full : NULL);
    hkb_report_out(rep, &full);
    return err;
}

int hk_runtime_create(hk_runtime **out, const hk_options *opt, hk_report *rep) {
    if (!out)
        return HK_ERR_INVALID;
    *out = NULL;
    hk_report full;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    hkb_driver d;
    char why[512];
    int err = hkb_driver_open(&d, why, sizeof why);
    if (err < 0)
        hku_fail(rep ? &full : NULL, err, "%s", why);
    else /* The runtime takes the table over (and closes it on destroy). */
        err = hkl_runtime_create_with(out, opt, &d, rep ? &full : NULL);
    hkb_report_out(rep, &full);
    return err;
}

static void module_free(hkl_module *m) {
    for (int i = 0; i < m->nhist; i++)
        hkl_image_clear(&m->hist[i]);
    free(m->hist);
    for (int i = 0; i < m->nkernels; i++) {
        hk_kernel *k = m->kernels[i];
        free(k->name);
        free(k->layout.offset);
        free(k->layout.size);
        free(k);
    }
    free(m->kernels);
    free(m);
}

/* Frees what is left once the reclaim thread has unloaded every version:
 * from hk_runtime_destroy, or from the reclaim thread itself when destroy
 * stopped waiting for it (hkl_reclaim_start is given this function). */
static void runtime_free(hk_runtime *rt) {
    hkl_lkg_close(rt); /* no commit or launch any more: records what ran long
                        * enough as known good, unlocks the state directory */
    hkl_module *m = rt->modules;
    while (m) {
        hkl_module *next = m->next;
        module_free(m);
        m = next;
    }
    if (rt->drv)
        for (int i = 0; i < rt->ndev; i++) {
            if (rt->dev[i].copy_stream)
                rt->drv->StreamDestroy(rt->dev[i].copy_stream);
            for (; rt->dev[i].retains > 0; rt->dev[i].retains--)
                rt->drv->DevicePrimaryCtxRelease(rt->dev[i].dev);
        }
    hkp_cache_close(rt->cache);
    free(rt->cache_dir);
    free(rt->headers);
    if (rt->drv == &rt->drv_own)
        hkb_driver_close(&rt->drv_own);
    if (rt->ref) {
        /* A graph destroyed later finds no runtime behind its pin. */
        pthread_mutex_lock(&rt->ref->lock);
        rt->ref->rt = NULL;
        pthread_mutex_unlock(&rt->ref->lock);
        hkl_rtref_put(rt->ref);
    }
    pthread_mutex_destroy(&rt->swap_lock);
    parts_finish(rt, NPARTS);
    free(rt);
}

/* Destroy is bounded by destroy_wait_ms in every state. What can take
 * longer does not hold it: a canary run or an isolated build in progress is
 * cut short (its helper's socket shut down); an in-process NVRTC compile,
 * which cannot be interrupted, is left to the worker, which finishes the
 * teardown when it returns (runtime_finish); unloads that wait for
 * running kernels are left to the reclaim thread, which frees the runtime
 * when its final pass ends. From the start no callback is called from any
 * of hotkern's threads (log.c), so none runs after destroy returns. */
void hk_runtime_destroy(hk_runtime *rt) {
    /* After the exit guard ran (a destroy from an exit handler registered
     * before the runtime was made), the threads are parked and the driver's
     * teardown is under way: the process's end takes what is left. */
    if (!rt || hkb_exiting())
        return;
    double until = hkl_now_ms() + rt->opt.destroy_wait_ms;
    hkl_callbacks_close(rt, until);
    hkl_sources_release(rt);
    hka_cancel(rt->canary);
    hkp_iso_cancel(rt->iso);
    hkp_warm_stop_by(rt->warm, until);
    rt->warm = NULL;
    if (hkl_worker_stop(rt, until) < 0) {
        /* The worker finishes the teardown when its build returns (and
         * commits nothing): the state directory is let go now. */
        hkl_lkg_hold(rt);
        hkl_lkg_release(rt, 1);
        return;
    }
    runtime_finish(rt, until);
}

/* The part of hk_runtime_destroy after the worker has stopped: on the
 * destroying thread, or on the worker when destroy stopped waiting for it
 * (hkl_worker_start is given this function). */
static void runtime_finish(hk_runtime *rt, double until) {
    hkl_worker_drain(rt);
    hka_destroy(rt->canary); /* no build runs any more: kills the helper */
    rt->canary = NULL;
    hkp_iso_destroy(rt->iso); /* likewise */
    rt->iso = NULL;
    /* Graphs destroyed from now on find no runtime behind their pins (the
     * final pass unloads pinned versions too). */
    pthread_mutex_lock(&rt->ref->lock);
    rt->ref->rt = NULL;
    pthread_mutex_unlock(&rt->ref->lock);
    /* Every current version joins the retired ones for the final pass,
     * under swap_lock: reset recovery on the reclaim thread replaces
     * `current` under it, and must either have done so (its version is
     * retired here) or find no version left (it then reloads nothing); a
     * version moved here and again by a reload would be retired twice.
     * swap_lock is taken by the deadline: the reclaim thread holds it while
     * its reset check calls the driver and while it reloads modules after a
     * reset, for as long as the driver takes. When it cannot be had in
     * time, the reclaim thread, which is its only holder once the worker
     * has stopped, retires them itself after its loop, before its final
     * pass (hkl_retire_all), and the wait below gives up on it. With no
     * reclaim thread nothing of hotkern's can hold it. */
    int got = rt->rec.started ? hkl_swap_lock_by(rt, until) : hkl_swap_lock(rt);
    if (got >= 0) {
        hkl_retire_all(rt);
        hkl_swap_unlock(rt, got);
    } else {
        pthread_mutex_lock(&rt->rec.lock);
        rt->rec.retire_all = 1;
        pthread_mutex_unlock(&rt->rec.lock);
    }
    hkl_reclaim_stop(rt);
    /* When the wait gives up, the reclaim thread frees the runtime when its
     * synchronise returns; the state directory is let go now all the same
     * (the hold keeps the runtime until that is done). */
    hkl_lkg_hold(rt);
    double left = until - hkl_now_ms();
    int joined = hkl_reclaim_join(rt, left > 0 ? (int)left : 0) == 0;
    hkl_lkg_release(rt, !joined);
    if (joined)
        runtime_free(rt);
}

void *hk_runtime_context(hk_runtime *rt, int slot) {
    if (!rt || slot < 0 || slot >= rt->ndev)
        return NULL;
    return hkl_ctx(rt, slot);
}

int hk_runtime_arch(hk_runtime *rt) {
    return rt ? rt->arch : 0;
}

const hkb_driver *hkl_driver(const hk_runtime *rt) {
    return rt->drv;
}

int hkl_device_ordinal(const hk_runtime *rt, int slot) {
    return rt->dev[slot].ordinal;
}

CUcontext hkl_context(const hk_runtime *rt, int slot) {
    return hkl_ctx(rt, slot);
}

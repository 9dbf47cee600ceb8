/*
 * Recovery from a context reset.
 *
 * A third-party cudaDeviceReset destroys the primary context under us.
 * Libraries (cuLibraryLoadData) survive it and launch in the new context;
 * modules do not. hkl_check_reset notices the change of context identity
 * and reloads what must be reloaded; it runs at every swap and rollback
 * (swap.c), from the reclaim thread's periodic pass, and soon after a launch
 * error that looks like a reset (launch.c sets reset.suspect and kicks the
 * reclaim thread), never on a launching thread.
 *
 * Locks: hkl_check_reset runs with swap_lock held. A context is replaced
 * under unload_lock, which bumps reset.gen: a module unload in progress
 * finishes in the old context first, and later ones see the new generation
 * and leave dead modules alone. Modules are reloaded with the launch gate
 * closed. hkl_emit_reset tells the application afterwards, with no lock
 * held, so its callback may call hotkern.
 */
#include <stdlib.h>
#include <string.h>

#include "loader/gate.h"
#include "loader/log.h"
#include "loader/reset.h"
#include "loader/version.h"

int hkl_reset_init(hk_runtime *rt) {
    atomic_init(&rt->reset.gen, 1);
    atomic_init(&rt->reset.suspect, 0);
    return pthread_mutex_init(&rt->reset.unload_lock, NULL) ? HK_ERR_NOMEM : 0;
}

void hkl_reset_finish(hk_runtime *rt) {
    pthread_mutex_destroy(&rt->reset.unload_lock);
}

/* 1 when device slot i's context is no longer the one we attached to. */
static int context_was_reset(hk_runtime *rt, int i) {
    const hkb_driver *d = rt->drv;
    /* A context the application created and made current is its own: we hold
     * no retain on the primary context then (so that one may well be
     * inactive), and must never swap the application's context for it. */
    if (rt->dev[i].retains == 0)
        return 0;
    unsigned flags = 0;
    int active = 0;
    unsigned long long id = 0;
    if (d->DevicePrimaryCtxGetState(rt->dev[i].dev, &flags, &active) != CUDA_SUCCESS)
        return 0;
    if (!active)
        return 1;
    return d->CtxGetId(hkl_ctx(rt, i), &id) != CUDA_SUCCESS || id != rt->dev[i].ctx_id;
}

/* Takes the new primary context of every device whose context was reset.
 * Returns 1 when there was one. */
static int replace_contexts(hk_runtime *rt) {
    int reset = 0;
    for (int i = 0; i < rt->ndev; i++) {
        if (!context_was_reset(rt, i))
            continue;
        CUcontext ctx;
        if (rt->drv->DevicePrimaryCtxRetain(&ctx, rt->dev[i].dev) != CUDA_SUCCESS)
            continue;
        /* A module unload in progress finishes in the old context first;
         * later ones see the new generation and leave dead modules alone. */
        pthread_mutex_lock(&rt->reset.unload_lock);
        rt->dev[i].retains++;
        atomic_store(&rt->dev[i].ctx, ctx);
        rt->drv->CtxGetId(ctx, &rt->dev[i].ctx_id);
        if (rt->dev[i].copy_stream) /* died with its context */
            rt->dev[i].copy_stream = NULL;
        atomic_fetch_add(&rt->reset.gen, 1);
        pthread_mutex_unlock(&rt->reset.unload_lock);
        reset = 1;
    }
    return reset;
}

/* A new version holding a copy of old's image, loaded in the new context;
 * NULL when that fails. */
static hkl_version *version_reload(hk_runtime *rt, hkl_module *m, const hkl_version *old,
                                   hk_report *rep) {
    hkl_version *nv = hkl_version_new(rt, m, old->number);
    if (!nv)
        return NULL;
    nv->art.format = old->art.format;
    nv->art.image = malloc(old->art.size);
    if (!nv->art.image) {
        free(nv);
        return NULL;
    }
    memcpy(nv->art.image, old->art.image, old->art.size);
    nv->art.size = old->art.size;
    if (hkl_load_version(rt, nv, rep) < 0) {
        hkl_version_free(nv);
        return NULL;
    }
    return nv;
}

/* Gives nv, which holds a copy of old's image, copies of old's metadata:
 * the name expressions and their lowered names, the kernels with their
 * parameter layouts, the globals. old stays whole: a canary run may be
 * reading it, pinned, with no lock held. 0, or HK_ERR_NOMEM (what was
 * copied is freed with nv). */
static int meta_copy(hkl_version *nv, const hkl_version *old) {
    const hkp_meta *om = &old->art.meta;
    hkp_meta *nm = &nv->art.meta;
    int n = old->art.nlowered;
    char **e = hku_strv_dup((const char *const *)old->expr, n);
    char **w = hku_strv_dup((const char *const *)old->art.lowered_names, n);
    if (n > 0 && (!e || !w)) {
        hku_strv_free(e, n);
        hku_strv_free(w, n);
        return HK_ERR_NOMEM;
    }
    nv->expr = e;
    nv->art.lowered_names = w;
    nv->art.nlowered = n;
    return hkp_meta_dup(om, nm);
}

/* Module loader: m's current module died with the context. Loads its image
 * again and publishes it in place of the dead version; when that fails, the
 * dead version stays current. */
static void reload_module(hk_runtime *rt, hkl_module *m) {
    hkl_version *old = atomic_load(&m->current);
    if (rt->test.hook)
        rt->test.hook(rt, HKL_HOOK_RESET_RELOAD);
    hk_report rep = HK_REPORT_INIT;
    hkl_version *nv = old ? version_reload(rt, m, old, &rep) : NULL;
    if (!nv) {
        hk_report_clear(&rep);
        return;
    }
    /* The old version is dead: the reloaded one takes copies of its
     * metadata (name expressions, globals, kernel layouts). */
    int ok = meta_copy(nv, old) == 0;
    for (int k = 0; k < m->nkernels && ok; k++)
        ok = hkl_resolve_slot(rt, nv, m->kernels[k], &rep) == 0;
    if (!ok) {
        hkl_unload_version(rt, nv);
        hkl_version_free(nv);
    } else {
        atomic_store(&m->current, nv);
        old->dead = 1; /* its module died with the context: no event */
        hkl_retire(rt, old);
        pthread_mutex_lock(&rt->metrics.lock);
        rt->metrics.stats.live_versions++; /* the reloaded one; old is counted out by reclaim */
        pthread_mutex_unlock(&rt->metrics.lock);
    }
    hk_report_clear(&rep);
}

int hkl_check_reset(hk_runtime *rt) {
    if (!replace_contexts(rt))
        return 0;
    /* Modules died with the context: each module's current image is loaded
     * again. Libraries live on and reload into the new context by
     * themselves. Versions already retired hold dead modules too: their
     * generation tells hkl_unload_version to leave them (a recycled handle
     * could name live code in the new context). */
    if (rt->opt.loader == HK_LOADER_MODULE) {
        hkl_gate_close(rt, "reloading modules after a context reset");
        for (hkl_module *m = rt->modules; m; m = m->next)
            reload_module(rt, m);
        hkl_gate_open(rt);
    }
    pthread_mutex_lock(&rt->metrics.lock);
    rt->metrics.stats.context_resets++;
    pthread_mutex_unlock(&rt->metrics.lock);
    return 1;
}

/* Tells the application about a reset that hkl_check_reset handled. Called
 * with no lock held, so the callback may call hotkern. */
void hkl_emit_reset(hk_runtime *rt) {
    hk_report rep = HK_REPORT_INIT;
    hku_fail(&rep, HK_ERR_CONTEXT_RESET,
             "CUDA context reset detected (cudaDeviceReset?): current versions are "
             "loaded in the new context; buffers and __device__ state from before the "
             "reset are gone");
    hkl_emit(rt, HK_EVENT_CONTEXT_RESET, NULL, 0, 0, "reset", &rep);
}

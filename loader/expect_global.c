/*
 * The program's own globals (expect.c's other half): what a source that
 * routes the program's launches tells the engine of the program's
 * __device__/__constant__ variables, and where the host's copies go.
 *
 * A global is expected by its name and translation unit, with the address
 * and size of the program's own copy. The first version of a module that
 * has a global of that name, and that expect_tu.c says is its file's, takes
 * the program's current value (later versions carry it over as any
 * global); one committed before the global was registered (restored at
 * start, pushed before the first launch) is bound at registration, keeping
 * its value. Each commit publishes the running version's copy (`hot`) with
 * the launch gate closed; the host's symbol copies read it inside the gate
 * as a launch does (hkl_xglobal_enter), so no commit carries a value over,
 * and no unload frees the copy, under a copy: no lock, no gate closing. A
 * context reset (a reloaded module, a library's globals moved) is noticed by
 * the version and reset generation published with it: the copy is looked
 * up again, once.
 *
 * Locks: expect_lock (a leaf) covers the list and each entry's `mod`;
 * binding and lookups run under swap_lock too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/context.h"
#include "loader/expect.h"
#include "loader/gate.h"

typedef struct hkl_xglobal {
    /* immutable */
    char *name;
    uint64_t orig; /* the program's copy, device slot 0 */
    size_t size;
    unsigned tu; /* its translation unit (0: unknown) */
    /* The running version's copy (device slot 0), 0 while none: written
     * with the launch gate closed (a commit) or before the global is handed
     * out, read by the host's symbol copies inside the gate (hkl_xglobal_enter) */
    _Atomic uint64_t hot;
    _Atomic(hkl_version *) hot_v; /* the version `hot` is of, */
    _Atomic uint64_t hot_gen;     /* and rt->reset.gen then (a reset moves it) */
    hkl_module *mod;              /* expect_lock: the module whose versions hold it */
    struct hkl_xglobal *next;     /* expect_lock */
} hkl_xglobal;

/* g's copy in v is at p (0: v has none the program's can go to). Stored
 * with the gate closed, or before g is handed out; `hot` last (release):
 * a reader that sees it sees the rest, and g->mod, set once before. */
static void publish_hot(hk_runtime *rt, hkl_xglobal *g, hkl_version *v, uint64_t p) {
    atomic_store_explicit(&g->hot_v, v, memory_order_relaxed);
    atomic_store_explicit(&g->hot_gen, atomic_load(&rt->reset.gen), memory_order_relaxed);
    atomic_store_explicit(&g->hot, p, memory_order_release);
}

/* Binds g to a version committed before the program's variable was
 * registered (restored at start, or pushed before the first launch): the
 * host's later writes reach it. Its value stays the version's. swap_lock
 * held; takes expect_lock. */
static void global_bind_now(hk_runtime *rt, hkl_xglobal *g) {
    for (hkl_module *m = rt->modules; m; m = m->next) {
        hkl_version *v = atomic_load(&m->current);
        int in = 0;
        for (int i = 0; v && i < v->art.meta.nglobals && !in; i++)
            in = !strcmp(v->art.meta.globals[i].name, g->name);
        if (!in)
            continue;
        pthread_mutex_lock(&rt->expect.lock);
        int mine = hkl_tu_owns(rt, g->tu, "variable", g->name, m, v);
        pthread_mutex_unlock(&rt->expect.lock);
        if (!mine || hkl_ctx_push(rt, 0) < 0)
            continue;
        CUdeviceptr p = 0;
        size_t size = 0;
        CUstreamCaptureMode mode = hkl_relax(rt);
        hkl_gate_close(rt, "binding a program's global");
        CUresult r = v->lib ? rt->drv->LibraryGetGlobal(&p, &size, v->lib, g->name)
                            : rt->drv->ModuleGetGlobal(&p, &size, v->cumod[0], g->name);
        hkl_gate_open(rt);
        hkl_unrelax(rt, mode);
        hkl_ctx_pop(rt);
        if (r != CUDA_SUCCESS || size != g->size)
            continue;
        pthread_mutex_lock(&rt->expect.lock);
        g->mod = m;
        pthread_mutex_unlock(&rt->expect.lock);
        publish_hot(rt, g, v, (uint64_t)p);
        hk_log(rt, HK_LOG_INFO, "engine",
               "the program's global '%s' follows module '%s' v%llu (committed before it was "
               "registered): the host's copies reach it",
               g->name, m->name, (unsigned long long)v->number);
        return;
    }
}

int hkl_expect_global(hk_runtime *rt, const char *name, uint64_t orig, size_t size, unsigned tu,
                      hkl_xglobal **out) {
    if (out)
        *out = NULL;
    if (!rt || !name || !*name || !orig || !size)
        return HK_ERR_INVALID;
    hkl_xglobal *g = calloc(1, sizeof *g);
    if (!g || !(g->name = strdup(name))) {
        free(g);
        return HK_ERR_NOMEM;
    }
    g->orig = orig;
    g->size = size;
    g->tu = tu;
    atomic_init(&g->hot, 0);
    int held = hkl_swap_held(rt);
    if (!held)
        hkl_swap_lock(rt);
    pthread_mutex_lock(&rt->expect.lock);
    for (hkl_xglobal *o = rt->expect.globals; o; o = o->next)
        if (o->tu == tu && !strcmp(o->name, name)) {
            pthread_mutex_unlock(&rt->expect.lock);
            if (!held)
                hkl_swap_unlock(rt, 0);
            free(g->name);
            free(g);
            if (out)
                *out = o;
            return 0; /* the first registration stands */
        }
    pthread_mutex_unlock(&rt->expect.lock);
    if (!held)
        global_bind_now(rt, g);
    pthread_mutex_lock(&rt->expect.lock);
    g->next = rt->expect.globals;
    rt->expect.globals = g;
    atomic_fetch_add(&rt->expect.n, 1);
    pthread_mutex_unlock(&rt->expect.lock);
    if (!held)
        hkl_swap_unlock(rt, 0);
    if (out)
        *out = g;
    return 0;
}

int hkl_expect_global_hot(hk_runtime *rt, const char *name, uint64_t *dptr, size_t *size) {
    pthread_mutex_lock(&rt->expect.lock);
    hkl_xglobal *g = rt->expect.globals;
    while (g && strcmp(g->name, name))
        g = g->next;
    pthread_mutex_unlock(&rt->expect.lock);
    uint64_t p = g ? atomic_load_explicit(&g->hot, memory_order_acquire) : 0;
    if (!p)
        return 0;
    *dptr = p;
    *size = g->size;
    return 1;
}

/* 1 when g's published copy is not the running version's: a context reset
 * reloaded the module (a new version, not through a commit) or moved the
 * library's globals. Inside the gate; g->mod is set (hot was seen). */
static int stale(hk_runtime *rt, hkl_xglobal *g) {
    return atomic_load_explicit(&g->hot_gen, memory_order_relaxed) != atomic_load(&rt->reset.gen) ||
           atomic_load_explicit(&g->hot_v, memory_order_relaxed) != atomic_load(&g->mod->current);
}

/* Looks g's copy up again in its module's running version (after a reset),
 * as hk_module_global does: under swap_lock, the gate closed around the
 * driver's lookup. Outside the gate. */
static void refresh(hk_runtime *rt, hkl_xglobal *g) {
    hkl_swap_lock(rt);
    hkl_version *v = atomic_load(&g->mod->current);
    CUdeviceptr p = 0;
    size_t size = 0;
    if (v && hkl_ctx_push(rt, 0) == 0) {
        CUstreamCaptureMode mode = hkl_relax(rt);
        hkl_gate_close(rt, "looking up a program's global again after a reset");
        CUresult r = v->lib ? rt->drv->LibraryGetGlobal(&p, &size, v->lib, g->name)
                            : rt->drv->ModuleGetGlobal(&p, &size, v->cumod[0], g->name);
        if (r != CUDA_SUCCESS || size != g->size)
            p = 0;
        publish_hot(rt, g, v, (uint64_t)p);
        hkl_gate_open(rt);
        hkl_unrelax(rt, mode);
        hkl_ctx_pop(rt);
    }
    hkl_swap_unlock(rt, 0);
}

hkl_tslot *hkl_xglobal_enter(hk_runtime *rt, hkl_xglobal *g, uint64_t *dptr) {
    if (!g || !atomic_load_explicit(&g->hot, memory_order_acquire))
        return NULL; /* no hot copy: the cheap answer, no lock */
    /* Inside the gate as a launch is: a commit (which carries the globals
     * over and moves `hot`) and the unload of the version read here both
     * wait until hkl_xglobal_exit. A copy does not go on at a closed gate
     * as a launch that waited does: it waits for the commit, then reads the
     * new copy. A thread inside a swap (a check callback) cannot wait. */
    int held = hkl_swap_held(rt), refreshed = 0;
    for (;;) {
        hkl_tslot *s = hkl_enter(rt);
        if (!s)
            return NULL;
        if (held || !atomic_load_explicit(&rt->gate.closers, memory_order_seq_cst)) {
            *dptr = atomic_load_explicit(&g->hot, memory_order_acquire);
            if (*dptr && !stale(rt, g))
                return s;
            hkl_exit(s);
            if (!*dptr || held || refreshed++)
                return NULL;
            refresh(rt, g);
            continue;
        }
        hkl_exit(s);
        hkl_gate_wait(rt);
    }
}

void hkl_xglobal_exit(hkl_tslot *s) {
    if (s)
        hkl_exit(s);
}

size_t hkl_xglobal_size(const hkl_xglobal *g) {
    return g->size;
}

void hkl_expect_global_free(hk_runtime *rt) {
    while (rt->expect.globals) {
        hkl_xglobal *g = rt->expect.globals;
        rt->expect.globals = g->next;
        free(g->name);
        free(g);
    }
}

int hkl_expect_seed(hk_runtime *rt, hkl_module *m, hkl_version *v, int first, hk_report *rep) {
    if (!atomic_load(&rt->expect.n))
        return 0;
    const hkb_driver *d = rt->drv;
    char skipped[256] = "";
    int err = 0, n = 0;
    pthread_mutex_lock(&rt->expect.lock);
    for (hkl_xglobal *g = rt->expect.globals; g; g = g->next)
        n++;
    /* The copies v's commit publishes (index: position in the list); they
     * are stored only once nothing can fail, the gate still closed. */
    uint64_t *hot = n ? calloc((size_t)n, sizeof *hot) : NULL;
    if (n && !hot) {
        pthread_mutex_unlock(&rt->expect.lock);
        return hku_fail(rep, HK_ERR_NOMEM, "no memory for the program's globals");
    }
    int i = 0;
    for (hkl_xglobal *g = rt->expect.globals; g && !err; g = g->next, i++) {
        int in = 0;
        for (int k = 0; k < v->art.meta.nglobals && !in; k++)
            in = !strcmp(v->art.meta.globals[k].name, g->name);
        if (!in || (g->mod && g->mod != m) ||
            (!g->mod && !hkl_tu_owns(rt, g->tu, "variable", g->name, m, v)))
            continue;
        int bind = !g->mod;
        CUdeviceptr p = 0;
        size_t size = 0;
        CUresult r = v->lib ? d->LibraryGetGlobal(&p, &size, v->lib, g->name)
                            : d->ModuleGetGlobal(&p, &size, v->cumod[0], g->name);
        if (r == CUDA_SUCCESS && size != g->size) {
            size_t l = strlen(skipped);
            snprintf(skipped + l, sizeof skipped - l, "%s%s (the program's %zu bytes, %zu here)",
                     l ? ", " : "", g->name, g->size, size);
            continue; /* not bound: the host's writes stay the program's */
        }
        if (r == CUDA_SUCCESS && (first || bind)) {
            /* The program's value goes into the module's first version. */
            CUstream *cs = &rt->dev[0].copy_stream;
            if (!*cs)
                r = d->StreamCreate(cs, CU_STREAM_NON_BLOCKING);
            if (r == CUDA_SUCCESS)
                r = d->MemcpyDtoDAsync(p, (CUdeviceptr)g->orig, size, *cs);
            if (r == CUDA_SUCCESS)
                r = d->StreamSynchronize(*cs);
        }
        if (r != CUDA_SUCCESS) {
            hkl_report_cu(rep, rt, r, "copying the program's global to the new version");
            size_t l = strlen(rep ? rep->message : "");
            if (rep)
                snprintf(rep->message + l, sizeof rep->message - l, " ('%s')", g->name);
            err = HK_ERR_CUDA;
            break;
        }
        hot[i] = (uint64_t)p;
        if (bind)
            g->mod = m;
    }
    if (!err) {
        i = 0;
        for (hkl_xglobal *g = rt->expect.globals; g; g = g->next, i++)
            if (g->mod == m)
                publish_hot(rt, g, v, hot[i]);
    }
    pthread_mutex_unlock(&rt->expect.lock);
    free(hot);
    if (skipped[0])
        hk_log(rt, HK_LOG_WARN, "engine",
               "'%s' v%llu: the program's globals not taken over (their size differs): %s", m->name,
               (unsigned long long)v->number, skipped);
    return err;
}

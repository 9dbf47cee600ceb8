/*
 * Kernel handles, the launch path and pins (registered graphs: graph.c).
 *
 * The launch path is the hot one: it announces the thread's epoch in a slot
 * only this thread writes, loads the module's `current` version once, reads
 * the slot's function from it and calls cuLaunchKernel. No lock, no
 * allocation (after the thread's first launch), no system call besides the
 * driver's own. The epoch announcement is what lets the reclaim thread know
 * when no launch can still be using an old version (reclaim.c).
 *
 * Stream capture. A launch into a capturing stream records the function of
 * that moment in the application's graph, which hotkern never sees again. So
 * hk_launch asks the stream (cuStreamIsCapturing, one cheap query) and, when
 * it captures, pins the version before leaving the epoch and hands the pin to
 * the graph as a CUDA user object: the version stays loaded until the graph,
 * every graph exec instantiated from it and their launches in flight are gone,
 * whatever is committed meanwhile. Graphs that should follow swaps register
 * their node (hk_graph_register) and are retargeted at each commit.
 *
 * A launch error takes the slow path: a context reset may be the cause
 * (modules die with their context). The error goes back to the caller at
 * once; the reclaim thread is asked to check for a reset now, and recovers
 * there, never on a launching thread. A sticky error (a kernel faulted: the
 * context is lost for good) is handed to lkg.c on the launching thread, once
 * per runtime: it quarantines the recent versions and writes their records
 * before the error is returned (the only disk work a launch can do).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/abi.h"
#include "loader/context.h"
#include "loader/gate.h"
#include "loader/launch.h"
#include "loader/lkg.h"
#include "loader/version.h"

int hkl_kernels_reserve(hkl_module *m) {
    if (m->nkernels < m->capkernels)
        return 0;
    int cap = m->capkernels ? 2 * m->capkernels : 8;
    hk_kernel **ks = realloc(m->kernels, (size_t)cap * sizeof *ks);
    if (!ks)
        return HK_ERR_NOMEM;
    m->kernels = ks;
    m->capkernels = cap;
    return 0;
}

int hk_kernel_get(hk_runtime *rt, const char *module, const char *kernel, hk_kernel **out) {
    if (!rt || !module || !kernel || !out)
        return HK_ERR_INVALID;
    *out = NULL;
    if (hkl_swap_held(rt))
        return HK_ERR_BUSY; /* from a check callback: the swap is using the list */
    CUstreamCaptureMode mode = hkl_relax(rt);
    hkl_swap_lock(rt);
    hkl_gate_close(rt, "taking a kernel handle");
    int pushed = hkl_ctx_push(rt, 0) == 0; /* parameter queries need a context */
    int err = 0;
    hk_kernel *k = NULL;
    hkl_module *m = hkl_module_find(rt, module);
    hkl_version *v = m ? atomic_load(&m->current) : NULL;
    if (!v) {
        err = HK_ERR_NOT_FOUND;
        goto out;
    }
    const char *entry = hkl_entry_name(v, kernel);
    for (int i = 0; i < m->nkernels; i++)
        if (!strcmp(m->kernels[i]->name, kernel) ||
            !strcmp(hkl_entry_name(v, m->kernels[i]->name), entry)) {
            *out = m->kernels[i];
            goto out;
        }
    if ((err = hkl_kernels_reserve(m)) < 0)
        goto out;
    k = calloc(1, sizeof *k);
    if (!k || !(k->name = strdup(kernel))) {
        err = HK_ERR_NOMEM;
        goto out;
    }
    k->rt = rt;
    k->mod = m;
    k->slot = m->nkernels;
    k->cache_config = -1;
    if ((err = hkl_resolve_slot(rt, v, k, NULL)) < 0) {
        err = err == HK_ERR_MISSING_KERNEL ? HK_ERR_NOT_FOUND : err;
        goto out;
    }
    /* The layout this handle is taken with is the one later versions keep. */
    if ((err = hkl_read_layout(rt, v, k, &k->layout)) < 0)
        goto out;
    m->kernels[m->nkernels++] = k;
    *out = k;
    k = NULL;
out:
    if (pushed)
        hkl_ctx_pop(rt);
    hkl_gate_open(rt);
    hkl_swap_unlock(rt, 0);
    hkl_unrelax(rt, mode);
    if (k) {
        free(k->name);
        free(k->layout.offset);
        free(k->layout.size);
        free(k);
    }
    return err;
}

static int require_locked(hk_kernel *k, const size_t *offsets, const size_t *sizes, int n,
                          hk_report *rep) {
    hk_runtime *rt = k->rt;
    hkl_param_layout want = {0, NULL, NULL};
    int err = 0;
    if (n > 0) {
        want.offset = malloc((size_t)n * sizeof *want.offset);
        want.size = malloc((size_t)n * sizeof *want.size);
        if (!want.offset || !want.size) {
            hkl_layout_free(&want);
            return HK_ERR_NOMEM;
        }
        for (int i = 0; i < n; i++) {
            want.offset[i] = (uint32_t)offsets[i];
            want.size[i] = (uint32_t)sizes[i];
        }
        want.n = n;
    }
    char diff[200];
    hkl_swap_lock(rt);
    /* The handle's layout is its current version's (every commit keeps
     * them equal): "had" is what the caller requires. */
    if (hkl_layout_diff(&want, &k->layout, diff, sizeof diff)) {
        if (rep)
            snprintf(rep->kernel, sizeof rep->kernel, "%s", k->name);
        err = hku_fail(rep, HK_ERR_LAYOUT,
                       "kernel '%s' of '%s' does not take the arguments it is called with: the "
                       "caller's layout %s in version %llu",
                       k->name, k->mod->name, diff,
                       (unsigned long long)atomic_load(&k->mod->current)->number);
    } else {
        k->fixed_layout = 1;
    }
    hkl_swap_unlock(rt, 0);
    hkl_layout_free(&want);
    return err;
}

int hk_kernel_require_layout(hk_kernel *k, const size_t *offsets, const size_t *sizes, int n,
                             hk_report *rep) {
    hk_report full;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    if (rep)
        hk_report_clear(&full);
    int err;
    if (!k || n < 0 || (n > 0 && (!offsets || !sizes)))
        err = HK_ERR_INVALID;
    else if (hkl_swap_held(k->rt))
        err = HK_ERR_BUSY; /* from a check callback */
    else
        err = require_locked(k, offsets, sizes, n, rep ? &full : NULL);
    hkb_report_out(rep, &full);
    return err;
}

/* A failed launch. If a context reset may explain it, the reclaim thread
 * checks now (and reloads modules); the caller gets the error at once. */
static int launch_failed(hk_runtime *rt, CUresult r, int *cu) {
    /* The slow path only: a launch that went through costs nothing more. */
    atomic_fetch_add_explicit(&rt->gate.launch_errors, 1, memory_order_relaxed);
    if (hkl_lkg_sticky((int)r))
        hkl_lkg_lost(rt, (int)r, "a launch"); /* once; the caller still gets r */
    else if (r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_CONTEXT_IS_DESTROYED ||
             r == CUDA_ERROR_INVALID_CONTEXT) {
        atomic_store(&rt->reset.suspect, 1);
        hkl_reclaim_kick(rt);
    }
    if (cu)
        *cu = (int)r;
    return HK_ERR_CUDA;
}

/* A captured launch's hold on its version, owned by the graph (a CUDA user
 * object): released by the driver when the graph and its execs are gone. */
typedef struct capture_pin {
    hkl_rtref *ref;
    hkl_version *v;
} capture_pin;

/* Drops one reference of the runtime's hkl_rtref (the runtime's own, or a
 * captured launch's), freeing it with the last. */
void hkl_rtref_put(hkl_rtref *ref) {
    if (atomic_fetch_sub(&ref->refs, 1) == 1) {
        pthread_mutex_destroy(&ref->lock);
        free(ref);
    }
}

/* Runs on a driver thread: no CUDA call here. */
static void capture_pin_release(void *arg) {
    capture_pin *p = arg;
    pthread_mutex_lock(&p->ref->lock);
    if (p->ref->rt)
        hkl_version_unpin(p->ref->rt, p->v);
    pthread_mutex_unlock(&p->ref->lock);
    hkl_rtref_put(p->ref);
    free(p);
}

/* One launch: cuLaunchKernelEx with lc, or cuLaunchKernel with the rest. */
typedef struct launch_req {
    const CUlaunchConfig *lc;
    hk_dim3 g, b;
    unsigned shm;
    CUstream stream;
    void **args;
} launch_req;

static CUresult raw_launch(hk_runtime *rt, void *f, const launch_req *q) {
    if (q->lc)
        return rt->drv->LaunchKernelEx(q->lc, (CUfunction)f, q->args, NULL);
    return rt->drv->LaunchKernel((CUfunction)f, q->g.x, q->g.y, q->g.z, q->b.x, q->b.y, q->b.z,
                                 q->shm, q->stream, q->args, NULL);
}

/* A launch into a capturing stream. Entered inside the epoch (s), which
 * keeps v loaded until the pin is taken. If the pin cannot be handed to the
 * graph, the version stays pinned for good: a leak, never a dangling node. */
static int launch_captured(hk_runtime *rt, hkl_tslot *s, hkl_version *v, void *f,
                           const launch_req *q, int *cu) {
    CUstream stream = q->stream;
    capture_pin *p = malloc(sizeof *p);
    atomic_fetch_add(&v->pins, 1);
    CUresult r = raw_launch(rt, f, q);
    hkl_exit(s);
    if (r != CUDA_SUCCESS) {
        hkl_version_unpin(rt, v);
        free(p);
        return launch_failed(rt, r, cu);
    }
    if (cu)
        *cu = 0;
    if (!p)
        return 0; /* pinned for good */
    CUstreamCaptureStatus st;
    CUgraph graph = NULL;
    CUuserObject obj;
    p->ref = rt->ref;
    p->v = v;
    atomic_fetch_add(&rt->ref->refs, 1);
    if (rt->drv->StreamGetCaptureInfo(stream, &st, NULL, &graph, NULL, NULL, NULL) !=
            CUDA_SUCCESS ||
        !graph ||
        rt->drv->UserObjectCreate(&obj, p, capture_pin_release, 1,
                                  CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) != CUDA_SUCCESS) {
        hkl_rtref_put(rt->ref);
        free(p);
        return 0; /* pinned for good */
    }
    if (rt->drv->GraphRetainUserObject(graph, obj, 1, CU_GRAPH_USER_OBJECT_MOVE) != CUDA_SUCCESS)
        hkl_rtref_put(rt->ref); /* the object keeps p; the pin stays for good */
    return 0;
}

int hk_launch(hk_kernel *k, hk_dim3 g, hk_dim3 b, unsigned shm, void *stream, void **args,
              int *cu) {
    hk_runtime *rt = k->rt;
    hkl_tslot *s = hkl_enter(rt);
    if (__builtin_expect(!s, 0))
        return HK_ERR_NOMEM;
    hkl_version *v = atomic_load(&k->mod->current);
    void *f = atomic_load_explicit(&v->fn, memory_order_acquire)[k->slot];
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    if (__builtin_expect(rt->drv->StreamIsCapturing((CUstream)stream, &cs) == CUDA_SUCCESS &&
                             cs == CU_STREAM_CAPTURE_STATUS_ACTIVE,
                         0)) {
        launch_req q = {NULL, g, b, shm, (CUstream)stream, args};
        return launch_captured(rt, s, v, f, &q, cu);
    }
    CUresult r = rt->drv->LaunchKernel((CUfunction)f, g.x, g.y, g.z, b.x, b.y, b.z, shm,
                                       (CUstream)stream, args, NULL);
    hkl_exit(s);
    if (__builtin_expect(r == CUDA_SUCCESS, 1)) {
        if (cu)
            *cu = 0;
        return 0;
    }
    return launch_failed(rt, r, cu);
}

static const hk_launch_config launch_defaults = {
    .size = sizeof(hk_launch_config), .grid = {1, 1, 1}, .block = {1, 1, 1}};

int hk_launch_config_init_size(hk_launch_config *c, size_t size) {
    return hkb_sized_init(c, size, &launch_defaults, sizeof launch_defaults,
                          HKB_LAUNCH_CONFIG_SIZE0);
}

int hk_launch_ex(hk_kernel *k, const hk_launch_config *user, void **args, int *cu) {
    hk_launch_config full = launch_defaults, *c = &full;
    if (!k || !user || hkb_sized_in(&full, sizeof full, user, HKB_LAUNCH_CONFIG_SIZE0) < 0)
        return HK_ERR_INVALID;
    CUlaunchAttribute at[4];
    unsigned n = 0;
    memset(at, 0, sizeof at);
    if (c->cluster.x) {
        at[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        at[n].value.clusterDim.x = c->cluster.x;
        at[n].value.clusterDim.y = c->cluster.y ? c->cluster.y : 1;
        at[n++].value.clusterDim.z = c->cluster.z ? c->cluster.z : 1;
    }
    if (c->cooperative) {
        at[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        at[n++].value.cooperative = 1;
    }
    if (c->programmatic_serialization) {
        at[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        at[n++].value.programmaticStreamSerializationAllowed = 1;
    }
    if (c->has_priority) {
        at[n].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
        at[n++].value.priority = c->priority;
    }
    CUlaunchConfig lc = {.gridDimX = c->grid.x,
                         .gridDimY = c->grid.y,
                         .gridDimZ = c->grid.z,
                         .blockDimX = c->block.x,
                         .blockDimY = c->block.y,
                         .blockDimZ = c->block.z,
                         .sharedMemBytes = c->shared_bytes,
                         .hStream = (CUstream)c->stream,
                         .attrs = at,
                         .numAttrs = n};
    return hkl_launch_lc(k, &lc, args, cu);
}

hk_runtime *hkl_kernel_runtime(const hk_kernel *k) {
    return k->rt;
}

int hkl_launch_lc(hk_kernel *k, const CUlaunchConfig *lc, void **args, int *cu) {
    launch_req q = {lc,
                    {lc->gridDimX, lc->gridDimY, lc->gridDimZ},
                    {lc->blockDimX, lc->blockDimY, lc->blockDimZ},
                    lc->sharedMemBytes,
                    lc->hStream,
                    args};
    hk_runtime *rt = k->rt;
    hkl_tslot *s = hkl_enter(rt);
    if (!s)
        return HK_ERR_NOMEM;
    hkl_version *v = atomic_load(&k->mod->current);
    void *f = atomic_load_explicit(&v->fn, memory_order_acquire)[k->slot];
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    if (rt->drv->StreamIsCapturing(q.stream, &cs) == CUDA_SUCCESS &&
        cs == CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return launch_captured(rt, s, v, f, &q, cu);
    CUresult r = raw_launch(rt, f, &q);
    hkl_exit(s);
    if (r == CUDA_SUCCESS) {
        if (cu)
            *cu = 0;
        return 0;
    }
    return launch_failed(rt, r, cu);
}

/* ---- attributes ---------------------------------------------------------- */

static const char *attr_name(int a) {
    switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        return "max dynamic shared memory";
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        return "preferred shared memory carveout";
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
        return "required cluster width";
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
        return "required cluster height";
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
        return "required cluster depth";
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        return "non-portable cluster size";
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        return "cluster scheduling policy";
    case -1:
        return "cache config";
    default:
        return "attribute";
    }
}

/* Sets one attribute (cache config: attr -1) on v's function of slot on
 * device slot d. Module loader: the context of device 0 is current. */
static CUresult set_one(hk_runtime *rt, hkl_version *v, int slot, int d, int attr, int value) {
    const hkb_driver *drv = rt->drv;
    void *fn = atomic_load(&v->fn)[slot];
    if (rt->opt.loader == HK_LOADER_LIBRARY)
        return attr < 0
                   ? drv->KernelSetCacheConfig((CUkernel)fn, (CUfunc_cache)value, rt->dev[d].dev)
                   : drv->KernelSetAttribute((CUfunction_attribute)attr, value, (CUkernel)fn,
                                             rt->dev[d].dev);
    return attr < 0 ? drv->FuncSetCacheConfig((CUfunction)fn, (CUfunc_cache)value)
                    : drv->FuncSetAttribute((CUfunction)fn, (CUfunction_attribute)attr, value);
}

/* Reports an attribute v's kernel would not take, with the shared memory
 * arithmetic when that is what failed. */
static int attr_refused(hk_runtime *rt, hkl_version *v, const hk_kernel *k, int d, int attr,
                        int value, CUresult r, hk_report *rep) {
    if (!rep)
        return HK_ERR_ATTRIBUTE;
    char extra[160] = "";
    if (attr == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
        void *fn = atomic_load(&v->fn)[k->slot];
        int stat = 0, limit = 0;
        if (rt->opt.loader == HK_LOADER_LIBRARY)
            rt->drv->KernelGetAttribute(&stat, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, (CUkernel)fn,
                                        rt->dev[d].dev);
        else
            rt->drv->FuncGetAttribute(&stat, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, (CUfunction)fn);
        rt->drv->DeviceGetAttribute(&limit, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                    rt->dev[d].dev);
        snprintf(extra, sizeof extra,
                 " (static shared memory %d bytes + %d dynamic, device limit %d bytes)", stat,
                 value, limit);
    }
    snprintf(rep->kernel, sizeof rep->kernel, "%s", k->name);
    rep->cu_result = (int)r;
    snprintf(rep->cu_name, sizeof rep->cu_name, "%s", hkb_cu_name(rt->drv, r));
    hku_fail(rep, HK_ERR_ATTRIBUTE,
             "kernel '%s' of '%s' version %llu does not take %s = %d on device %d: %s%s", k->name,
             k->mod->name, (unsigned long long)v->number, attr_name(attr), value,
             rt->dev[d].ordinal, hkb_cu_name(rt->drv, r), extra);
    return HK_ERR_ATTRIBUTE;
}

int hkl_apply_attrs(hk_runtime *rt, hkl_version *v, const hk_kernel *k, hk_report *rep) {
    int ndev = rt->opt.loader == HK_LOADER_LIBRARY ? rt->ndev : 1;
    for (int d = 0; d < ndev; d++) {
        for (int i = 0; i < k->nattrs; i++) {
            CUresult r = set_one(rt, v, k->slot, d, k->attrs[i].attr, k->attrs[i].value);
            if (r != CUDA_SUCCESS)
                return attr_refused(rt, v, k, d, k->attrs[i].attr, k->attrs[i].value, r, rep);
        }
        if (k->cache_config >= 0) {
            CUresult r = set_one(rt, v, k->slot, d, -1, k->cache_config);
            if (r != CUDA_SUCCESS)
                return attr_refused(rt, v, k, d, -1, k->cache_config, r, rep);
        }
    }
    return 0;
}

/* Sets attr (-1: cache config) on the current version and keeps it. */
static int kernel_set_locked(hk_kernel *k, int attr, int value, hk_report *rep) {
    if (rep)
        hk_report_clear(rep);
    if (!k)
        return HK_ERR_INVALID;
    hk_runtime *rt = k->rt;
    if (hkl_swap_held(rt))
        return HK_ERR_BUSY; /* from a check callback */
    CUstreamCaptureMode mode = hkl_relax(rt);
    hkl_swap_lock(rt);
    int i = 0, err = 0;
    if (attr >= 0)
        for (; i < k->nattrs && k->attrs[i].attr != attr; i++)
            ;
    if (attr >= 0 && i == HKL_MAX_ATTRS) {
        hku_fail(rep, HK_ERR_INVALID, "at most %d attributes per kernel", HKL_MAX_ATTRS);
        err = HK_ERR_INVALID;
    } else {
        hkl_gate_close(rt, "setting a kernel attribute");
        int pushed = hkl_ctx_push(rt, 0) == 0;
        hkl_version *v = atomic_load(&k->mod->current);
        int ndev = rt->opt.loader == HK_LOADER_LIBRARY ? rt->ndev : 1;
        for (int d = 0; d < ndev && !err; d++) {
            CUresult r = set_one(rt, v, k->slot, d, attr, value);
            if (r != CUDA_SUCCESS)
                err = attr_refused(rt, v, k, d, attr, value, r, rep);
        }
        if (pushed)
            hkl_ctx_pop(rt);
        hkl_gate_open(rt);
    }
    if (!err && attr < 0) {
        k->cache_config = value;
    } else if (!err) {
        k->attrs[i].attr = attr;
        k->attrs[i].value = value;
        k->nattrs += i == k->nattrs;
    }
    hkl_swap_unlock(rt, 0);
    hkl_unrelax(rt, mode);
    return err;
}

static int kernel_set(hk_kernel *k, int attr, int value, hk_report *rep) {
    hk_report full;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    int err = kernel_set_locked(k, attr, value, rep ? &full : NULL);
    hkb_report_out(rep, &full);
    return err;
}

int hk_kernel_set_attribute(hk_kernel *k, int attribute, int value, hk_report *rep) {
    if (attribute < 0)
        return HK_ERR_INVALID;
    return kernel_set(k, attribute, value, rep);
}

int hk_kernel_set_cache_config(hk_kernel *k, int config, hk_report *rep) {
    if (config < 0)
        return HK_ERR_INVALID;
    return kernel_set(k, -1, config, rep);
}

int hk_pin_module(hk_runtime *rt, const char *module, hk_pin **out) {
    if (!rt || !module || !out)
        return HK_ERR_INVALID;
    *out = NULL;
    hk_pin *p = malloc(sizeof *p);
    if (!p)
        return HK_ERR_NOMEM;
    int nested = hkl_swap_lock(rt); /* a check callback may pin: it holds it */
    hkl_module *m = hkl_module_find(rt, module);
    hkl_version *v = m ? atomic_load(&m->current) : NULL;
    /* Under swap_lock no commit can retire v before the count is taken. */
    if (v)
        atomic_fetch_add(&v->pins, 1);
    hkl_swap_unlock(rt, nested);
    if (!v) {
        free(p);
        return HK_ERR_NOT_FOUND;
    }
    p->rt = rt;
    p->v = v;
    *out = p;
    return 0;
}

uint64_t hk_pin_version(const hk_pin *p) {
    return p ? p->v->number : 0;
}

void hk_unpin(hk_pin *p) {
    if (!p)
        return;
    hkl_version_unpin(p->rt, p->v);
    free(p);
}

int hk_launch_pinned(hk_pin *p, hk_kernel *k, hk_dim3 g, hk_dim3 b, unsigned shm, void *stream,
                     void **args, int *cu) {
    if (!p || !k || k->mod != p->v->mod)
        return HK_ERR_INVALID;
    hkl_version *v = p->v;
    /* cap before fn: an array at least cap long is published first. */
    int cap = atomic_load(&v->cap);
    void **fn = atomic_load(&v->fn);
    if (k->slot >= cap || !fn[k->slot])
        return HK_ERR_NOT_FOUND; /* handle taken after this version retired */
    /* The pin keeps v loaded; the epoch slot is taken for the launch gate. */
    hkl_tslot *s = hkl_enter(p->rt);
    if (!s)
        return HK_ERR_NOMEM;
    CUresult r = p->rt->drv->LaunchKernel((CUfunction)fn[k->slot], g.x, g.y, g.z, b.x, b.y, b.z,
                                          shm, (CUstream)stream, args, NULL);
    hkl_exit(s);
    if (__builtin_expect(r == CUDA_SUCCESS, 1)) {
        if (cu)
            *cu = 0;
        return 0;
    }
    atomic_fetch_add_explicit(&p->rt->gate.launch_errors, 1, memory_order_relaxed);
    if (hkl_lkg_sticky((int)r))
        hkl_lkg_lost(p->rt, (int)r, "a launch");
    if (cu)
        *cu = (int)r;
    return HK_ERR_CUDA;
}

CUresult hkl_function_of(hk_runtime *rt, hkl_version *v, int slot, CUfunction *f) {
    void *fn = atomic_load(&v->fn)[slot];
    if (rt->opt.loader == HK_LOADER_MODULE) {
        *f = (CUfunction)fn;
        return CUDA_SUCCESS;
    }
    return rt->drv->KernelGetFunction(f, (CUkernel)fn);
}

/* The device slot whose context is current on this thread (0 when none
 * is), or HK_ERR_NOT_FOUND for a context that is not the runtime's. */
static int current_slot(hk_runtime *rt) {
    CUcontext cur = NULL;
    if (rt->drv->CtxGetCurrent(&cur) != CUDA_SUCCESS || !cur)
        return 0;
    for (int i = 0; i < rt->ndev; i++)
        if (hkl_ctx(rt, i) == cur)
            return i;
    return HK_ERR_NOT_FOUND;
}

/* The function is read from the version's table, filled when its slot was
 * resolved with the launch gate closed: cuKernelGetFunction takes the
 * driver's lock for writing, which under continuous launches it would wait
 * for without end. Only a context the table does not cover (another
 * context, or one renewed by a reset) asks the driver, then with the gate
 * closed; the version is pinned meanwhile, since a closer cannot wait inside
 * a launch epoch. */
int hk_kernel_function(hk_kernel *k, void **cufunction) {
    if (!k || !cufunction)
        return HK_ERR_INVALID;
    *cufunction = NULL;
    hk_runtime *rt = k->rt;
    hkl_tslot *s = hkl_enter(rt);
    if (!s)
        return HK_ERR_NOMEM;
    hkl_version *v = atomic_load(&k->mod->current);
    if (!v->lib) {
        *cufunction = atomic_load(&v->fn)[k->slot];
        hkl_exit(s);
        return 0;
    }
    int d = current_slot(rt);
    void **funcs = atomic_load_explicit(&v->funcs, memory_order_acquire);
    void *f = d >= 0 && funcs && v->ctx_gen == atomic_load(&rt->reset.gen)
                  ? funcs[(size_t)k->slot * (size_t)rt->ndev + (size_t)d]
                  : NULL;
    if (f) {
        hkl_exit(s);
        *cufunction = f;
        return 0;
    }
    atomic_fetch_add(&v->pins, 1);
    hkl_exit(s);
    CUstreamCaptureMode mode = hkl_relax(rt);
    CUcontext cur = NULL;
    int pushed = (rt->drv->CtxGetCurrent(&cur) != CUDA_SUCCESS || !cur) && hkl_ctx_push(rt, 0) == 0;
    hkl_gate_close(rt, "looking up a kernel's function");
    CUfunction cf = NULL;
    CUresult r = hkl_function_of(rt, v, k->slot, &cf);
    hkl_gate_open(rt);
    if (pushed)
        hkl_ctx_pop(rt);
    hkl_unrelax(rt, mode);
    hkl_version_unpin(rt, v);
    *cufunction = cf;
    return r == CUDA_SUCCESS ? 0 : HK_ERR_CUDA;
}

/* ---- pins of graphs ----------------------------------------------------- */

void hkl_version_unpin(hk_runtime *rt, hkl_version *v) {
    atomic_fetch_sub(&v->pins, 1);
    /* The version may be waiting for this pin to go. */
    pthread_mutex_lock(&rt->rec.lock);
    pthread_cond_signal(&rt->rec.cond);
    pthread_mutex_unlock(&rt->rec.lock);
}

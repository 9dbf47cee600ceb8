/*
 * Registered CUDA graphs: a kernel node of a graph exec that follows swaps.
 * hk_graph_register records the node with its parameters as they were;
 * each commit points every node of the module at the new version's
 * function (hkl_graphs_retarget, from the swap's publication); a node that
 * cannot be retargeted keeps its version pinned (`held`) until a later
 * retarget succeeds or the graph goes. hk_graph_launch launches the exec
 * through the launch gate. (A graph captured from hk_launch, which is not
 * registered, pins its version instead: launch.c.)
 *
 * Locks: graph_lock, a writers-first rwlock: hk_graph_launch reads,
 * retargeting and (un)registration write. A retarget runs under swap_lock
 * (the commit's) and takes graph_lock after it; a graph launch passes the
 * gate before taking graph_lock, never while holding it, since a closer
 * waits for the launchers inside.
 */
#include <stdlib.h>
#include <string.h>

#include "loader/context.h"
#include "loader/gate.h"
#include "loader/graph.h"
#include "loader/launch.h"
#include "loader/lkg.h"

static int retarget_one(hk_runtime *rt, hkl_graph *g, hkl_version *v, hk_report *rep) {
    CUresult r = (CUresult)hkl_ctx_push(rt, g->dev_slot);
    if (r != CUDA_SUCCESS)
        return hkl_report_cu(rep, rt, r, "cuCtxPushCurrent");
    CUfunction f;
    if ((r = hkl_function_of(rt, v, g->k->slot, &f)) == CUDA_SUCCESS) {
        CUDA_KERNEL_NODE_PARAMS p = g->params;
        p.func = f;
        p.kern = NULL;
        p.ctx = NULL;
        if ((r = rt->drv->GraphExecKernelNodeSetParams(g->exec, g->node, &p)) == CUDA_SUCCESS)
            g->params.func = f;
    }
    hkl_ctx_pop(rt);
    return r == CUDA_SUCCESS ? 0 : hkl_report_cu(rep, rt, r, "cuGraphExecKernelNodeSetParams");
}

/* Points every registered node of module m at version v. swap_lock held. A
 * node that cannot be retargeted keeps running `old` (or whatever it ran
 * before), so that version is pinned for it until a later retarget succeeds
 * or the graph is unregistered; the commit stands and the report says so. */
int hkl_graphs_retarget(hk_runtime *rt, hkl_module *m, hkl_version *v, hkl_version *old,
                        hk_report *rep) {
    int err = 0;
    pthread_rwlock_wrlock(&rt->graph.lock);
    for (hkl_graph *g = rt->graph.list; g; g = g->next) {
        if (g->k->mod != m)
            continue;
        hk_report local = HK_REPORT_INIT;
        int e = retarget_one(rt, g, v, &local);
        if (e < 0) {
            if (!g->held && old) {
                atomic_fetch_add(&old->pins, 1);
                g->held = old;
            }
            if (!err) {
                err = e;
                hku_fail(rep, 0,
                         "a registered graph still runs version %llu (%s); it stays "
                         "loaded until the graph is retargeted or unregistered",
                         (unsigned long long)(g->held ? g->held->number : 0), local.message);
            }
        } else if (g->held) {
            hkl_version_unpin(rt, g->held);
            g->held = NULL;
        }
    }
    pthread_rwlock_unlock(&rt->graph.lock);
    return err;
}

int hk_graph_register(hk_runtime *rt, void *exec, void *node, hk_kernel *k) {
    if (!rt || !exec || !node || !k || k->rt != rt)
        return HK_ERR_INVALID;
    hkl_graph *g = calloc(1, sizeof *g);
    if (!g)
        return HK_ERR_NOMEM;
    g->exec = (CUgraphExec)exec;
    g->node = (CUgraphNode)node;
    g->k = k;
    CUresult r = rt->drv->GraphKernelNodeGetParams(g->node, &g->params);
    if (r != CUDA_SUCCESS) {
        free(g);
        return HK_ERR_CUDA;
    }
    CUcontext cur = NULL;
    rt->drv->CtxGetCurrent(&cur);
    for (int i = 0; i < rt->ndev; i++)
        if (hkl_ctx(rt, i) == cur)
            g->dev_slot = i;
    if (hkl_swap_held(rt)) {
        free(g);
        return HK_ERR_BUSY; /* from a check callback */
    }
    CUstreamCaptureMode mode = hkl_relax(rt);
    hkl_swap_lock(rt);
    hk_report rep = HK_REPORT_INIT;
    hkl_gate_close(rt, "registering a graph");
    int err = retarget_one(rt, g, atomic_load(&k->mod->current), &rep);
    hkl_gate_open(rt);
    if (err == 0) {
        pthread_rwlock_wrlock(&rt->graph.lock);
        g->next = rt->graph.list;
        rt->graph.list = g;
        pthread_rwlock_unlock(&rt->graph.lock);
    }
    hkl_swap_unlock(rt, 0);
    hkl_unrelax(rt, mode);
    if (err < 0)
        free(g);
    return err;
}

int hk_graph_unregister(hk_runtime *rt, void *exec) {
    if (!rt || !exec)
        return HK_ERR_INVALID;
    int found = 0;
    if (hkl_swap_held(rt))
        return HK_ERR_BUSY; /* from a check callback */
    hkl_swap_lock(rt);      /* g->held */
    pthread_rwlock_wrlock(&rt->graph.lock);
    for (hkl_graph **pp = &rt->graph.list; *pp;) {
        if ((*pp)->exec == (CUgraphExec)exec) {
            hkl_graph *g = *pp;
            *pp = g->next;
            if (g->held)
                hkl_version_unpin(rt, g->held);
            free(g);
            found = 1;
        } else {
            pp = &(*pp)->next;
        }
    }
    pthread_rwlock_unlock(&rt->graph.lock);
    hkl_swap_unlock(rt, 0);
    return found ? 0 : HK_ERR_NOT_FOUND;
}

int hk_graph_launch(hk_runtime *rt, void *exec, void *stream, int *cu) {
    if (!rt || !exec)
        return HK_ERR_INVALID;
    /* Through the gate first (never while holding graph_lock: a closer waits
     * for launchers inside, and retargeting takes graph_lock after that). */
    hkl_tslot *s = hkl_enter(rt);
    if (!s)
        return HK_ERR_NOMEM;
    pthread_rwlock_rdlock(&rt->graph.lock);
    CUresult r = rt->drv->GraphLaunch((CUgraphExec)exec, (CUstream)stream);
    pthread_rwlock_unlock(&rt->graph.lock);
    hkl_exit(s);
    if (cu)
        *cu = (int)r;
    if (r == CUDA_SUCCESS)
        return 0;
    atomic_fetch_add_explicit(&rt->gate.launch_errors, 1, memory_order_relaxed);
    if (hkl_lkg_sticky((int)r))
        hkl_lkg_lost(rt, (int)r, "a graph launch");
    return HK_ERR_CUDA;
}

int hkl_graphs_init(hk_runtime *rt) {
    /* Writers first: a commit's retarget must not wait behind a stream of
     * graph launches (glibc's default lets new readers overtake a writer). */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    int r = pthread_rwlock_init(&rt->graph.lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    return r ? HK_ERR_NOMEM : 0;
}

void hkl_graphs_finish(hk_runtime *rt) {
    while (rt->graph.list) {
        hkl_graph *g = rt->graph.list;
        rt->graph.list = g->next;
        free(g);
    }
    pthread_rwlock_destroy(&rt->graph.lock);
}

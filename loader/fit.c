/*
 * The launchability check: a new version of a program's kernel must take
 * every launch configuration the program has used for it (hkl_use, kept by
 * the <<<>>> interposition's launches), or the program's next launch of it
 * would fail where the program's own code ran, and nvcc's stub would drop
 * the error. Checked per kernel, before the commit, with the program's
 * attributes applied (validate in swap.c applies them first):
 *   block size    against CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, which a
 *                 build's register count lowers (72 registers: no 1024-thread
 *                 blocks);
 *   dynamic smem  against CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
 *                 (what cudaFuncSetAttribute raised) beside the static
 *                 shared memory, and the device's opt-in limit;
 *   clusters      cuOccupancyMaxActiveClusters must place one cluster of the
 *                 largest dimensions a launch attribute asked for;
 *   cooperative   the largest cooperative grid must be co-resident: blocks
 *                 per SM (cuOccupancyMaxActiveBlocksPerMultiprocessor) times
 *                 the SMs.
 * A version that fails is refused with HK_ERR_ATTRIBUTE (the function's
 * attributes do not fit the program's use), the report naming the kernel,
 * the configuration and the limit. Device slot 0 only: the program's
 * runtime launches there. A configuration first used after the commit is
 * the fallback's (route.c, hkl_expect_fallback).
 */
#include <stdio.h>

#include "loader/context.h"
#include "loader/fit.h"
#include "loader/launch.h"

/* Shared memory every function gets without opting in. */
#define SMEM_DEFAULT 49152

static CUresult fattr(hk_runtime *rt, hkl_version *v, int slot, CUfunction_attribute a, int *out) {
    void *fn = atomic_load(&v->fn)[slot];
    *out = 0;
    if (rt->opt.loader == HK_LOADER_LIBRARY)
        return rt->drv->KernelGetAttribute(out, a, (CUkernel)fn, rt->dev[0].dev);
    return rt->drv->FuncGetAttribute(out, a, (CUfunction)fn);
}

static int refuse(hk_report *rep, const hk_kernel *k, hkl_version *v, const char *use,
                  const char *limit) {
    if (rep)
        snprintf(rep->kernel, sizeof rep->kernel, "%s", k->name);
    return hku_fail(rep, HK_ERR_ATTRIBUTE,
                    "kernel '%s' of '%s' version %llu cannot take the program's launches: %s; %s",
                    k->name, k->mod->name, (unsigned long long)v->number, use, limit);
}

static int driver_failed(hk_runtime *rt, hk_report *rep, const hk_kernel *k, CUresult r,
                         const char *what) {
    if (rep)
        snprintf(rep->kernel, sizeof rep->kernel, "%s", k->name);
    return hkl_report_cu(rep, rt, r, what);
}

/* A snapshot of the program's configurations for one kernel. */
typedef struct fit_use {
    uint32_t threads, smem, cl[3], cblocks, cthreads, csmem;
} fit_use;

static uint32_t ld(_Atomic uint32_t *a) {
    return atomic_load_explicit(a, memory_order_relaxed);
}

/* Dynamic shared memory: beside the static, within the function's limit
 * (what the program's attribute raised) and the device's. */
static int fit_shared(hkl_version *v, const hk_kernel *k, const fit_use *u, int stat, int maxdyn,
                      int optin, hk_report *rep) {
    uint32_t cs = u->cblocks && u->csmem > u->smem ? u->csmem : u->smem;
    char use[160], limit[200];
    snprintf(use, sizeof use, "the program launches it with %u bytes of dynamic shared memory", cs);
    if (cs && (uint64_t)stat + cs > SMEM_DEFAULT && cs > (uint32_t)maxdyn) {
        snprintf(limit, sizeof limit,
                 "this version takes at most %d beside its %d bytes of static shared memory "
                 "(with the program's attributes applied)",
                 maxdyn, stat);
        return refuse(rep, k, v, use, limit);
    }
    if (cs && optin > 0 && (uint64_t)stat + cs > (uint64_t)optin) {
        snprintf(limit, sizeof limit,
                 "with its %d bytes of static shared memory that passes the device's %d bytes",
                 stat, optin);
        return refuse(rep, k, v, use, limit);
    }
    return 0;
}

/* One cluster of the largest dimensions a launch asked for must fit. */
static int fit_cluster(hk_runtime *rt, hkl_version *v, const hk_kernel *k, CUfunction f,
                       const fit_use *u, hk_report *rep) {
    CUlaunchAttribute at = {.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION};
    at.value.clusterDim.x = u->cl[0];
    at.value.clusterDim.y = u->cl[1] ? u->cl[1] : 1;
    at.value.clusterDim.z = u->cl[2] ? u->cl[2] : 1;
    CUlaunchConfig c = {.gridDimX = at.value.clusterDim.x,
                        .gridDimY = at.value.clusterDim.y,
                        .gridDimZ = at.value.clusterDim.z,
                        .blockDimX = u->threads ? u->threads : 1,
                        .blockDimY = 1,
                        .blockDimZ = 1,
                        .sharedMemBytes = u->smem,
                        .attrs = &at,
                        .numAttrs = 1};
    int n = 0;
    CUresult r = rt->drv->OccupancyMaxActiveClusters(&n, f, &c);
    if (r == CUDA_SUCCESS && n >= 1)
        return 0;
    char use[200], limit[200];
    snprintf(use, sizeof use,
             "the program launches it in clusters of %ux%ux%u blocks of up to %u threads and %u "
             "bytes of dynamic shared memory",
             at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z, u->threads,
             u->smem);
    snprintf(limit, sizeof limit, "no such cluster of this version fits a GPU (%s)",
             r != CUDA_SUCCESS ? hkb_cu_name(rt->drv, r) : "0 active clusters");
    return refuse(rep, k, v, use, limit);
}

/* The largest cooperative grid must be co-resident. */
static int fit_coop(hk_runtime *rt, hkl_version *v, const hk_kernel *k, CUfunction f,
                    const fit_use *u, int regs, hk_report *rep) {
    int per_sm = 0, sms = 0;
    CUresult r = rt->drv->OccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, f, (int)(u->cthreads ? u->cthreads : 1), u->csmem);
    if (r == CUDA_SUCCESS)
        r = rt->drv->DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                        rt->dev[0].dev);
    if (r != CUDA_SUCCESS)
        return driver_failed(rt, rep, k, r, "reading a program kernel's occupancy");
    if ((uint64_t)per_sm * (uint64_t)sms >= u->cblocks)
        return 0;
    char use[160], limit[200];
    snprintf(use, sizeof use, "the program launches it cooperatively with %u blocks of %u threads",
             u->cblocks, u->cthreads);
    snprintf(limit, sizeof limit,
             "at most %d blocks of this version are co-resident (%d a multiprocessor, %d "
             "multiprocessors, %d registers a thread)",
             per_sm * sms, per_sm, sms, regs);
    return refuse(rep, k, v, use, limit);
}

int hkl_fit_check(hk_runtime *rt, hkl_version *v, const hk_kernel *k, hk_report *rep) {
    hkl_use *p = hkl_expect_use(k->expect);
    fit_use u = {ld(&p->threads),
                 ld(&p->smem),
                 {ld(&p->cluster[0]), ld(&p->cluster[1]), ld(&p->cluster[2])},
                 ld(&p->coop_blocks),
                 ld(&p->coop_threads),
                 ld(&p->coop_smem)};
    if (!u.threads && !u.smem && !u.cl[0] && !u.cblocks)
        return 0; /* never launched yet */
    int maxthr = 0, regs = 0, stat = 0, maxdyn = 0, optin = 0;
    CUresult r = fattr(rt, v, k->slot, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &maxthr);
    if (r == CUDA_SUCCESS)
        r = fattr(rt, v, k->slot, CU_FUNC_ATTRIBUTE_NUM_REGS, &regs);
    if (r == CUDA_SUCCESS)
        r = fattr(rt, v, k->slot, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &stat);
    if (r == CUDA_SUCCESS)
        r = fattr(rt, v, k->slot, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &maxdyn);
    if (r == CUDA_SUCCESS)
        r = rt->drv->DeviceGetAttribute(
            &optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, rt->dev[0].dev);
    if (r != CUDA_SUCCESS)
        return driver_failed(rt, rep, k, r, "reading a program kernel's limits");
    uint32_t most = u.cthreads > u.threads ? u.cthreads : u.threads;
    if (most > (uint32_t)maxthr) {
        char use[160], limit[200];
        snprintf(use, sizeof use, "the program launches it with blocks of %u threads", most);
        snprintf(limit, sizeof limit,
                 "this version takes at most %d threads a block (%d registers a thread)", maxthr,
                 regs);
        return refuse(rep, k, v, use, limit);
    }
    int err = fit_shared(v, k, &u, stat, maxdyn, optin, rep);
    if (err < 0 || (!u.cl[0] && !u.cblocks))
        return err;
    CUfunction f = NULL;
    if ((r = hkl_function_of(rt, v, k->slot, &f)) != CUDA_SUCCESS)
        return driver_failed(rt, rep, k, r, "finding a program kernel's function");
    if (u.cl[0] && (err = fit_cluster(rt, v, k, f, &u, rep)) < 0)
        return err;
    return u.cblocks ? fit_coop(rt, v, k, f, &u, regs, rep) : 0;
}

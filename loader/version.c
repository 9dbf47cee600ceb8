/*
 * Version operations: what the engine does to one module's versions, below
 * every step that decides when to do it (the swap transaction, reset
 * recovery, the reclaim thread, launches and graphs).
 *
 * A version is made (hkl_version_new) and filled by its maker, loaded
 * (hkl_load_version: cuLibraryLoadData, or cuModuleLoadDataEx with JIT
 * options and log buffers), its code uploaded into every context
 * (hkl_upload_version: cuFuncLoad), each kernel handle resolved to its
 * kernel (hkl_resolve_slot, which grows the slot tables launches read),
 * its globals carried over from the version it replaces
 * (hkl_carry_globals), and, once replaced, retired: handed to the reclaim
 * thread (hkl_retire), which unloads it (hkl_unload_version) and frees it
 * (hkl_version_free) when no launch can reach it any more. The module
 * queries (hk_module_version, hk_module_global, hk_module_release) read
 * the running version.
 *
 * Locks: the callers' (version.h says which each needs): swap_lock for what
 * changes a module or a version's tables, the launch gate closed around
 * the driver calls that take the driver's lock for writing (loads,
 * cuKernelGetFunction, cuFuncLoad, unloads), unload_lock around a module
 * unload, rec_lock for the retired list. The queries take swap_lock
 * themselves.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/context.h"
#include "loader/gate.h"
#include "loader/version.h"

/* Errors after which an unload may succeed later: retry, never count. */
static int unload_retryable(CUresult r) {
    return r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
           r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED || r == CUDA_ERROR_NOT_READY ||
           r == CUDA_ERROR_OUT_OF_MEMORY;
}

#define JIT_LOG_SIZE 16384

/* ---- modules and versions ---------------------------------------------- */

hkl_module *hkl_module_find(hk_runtime *rt, const char *name) {
    for (hkl_module *m = rt->modules; m; m = m->next)
        if (!strcmp(m->name, name))
            return m;
    return NULL;
}

hkl_version *hkl_version_new(hk_runtime *rt, hkl_module *m, uint64_t number) {
    hkl_version *v = calloc(1, sizeof *v);
    if (!v)
        return NULL;
    atomic_init(&v->fn, NULL);
    atomic_init(&v->funcs, NULL);
    atomic_init(&v->cap, 0);
    atomic_init(&v->pins, 0);
    v->number = number;
    v->mod = m;
    v->ctx_gen = atomic_load(&rt->reset.gen);
    return v;
}

void hkl_version_free(hkl_version *v) {
    if (!v)
        return;
    hku_strv_free(v->expr, v->art.nlowered);
    hkp_artifact_free(&v->art);
    void **fn = atomic_load(&v->fn), **funcs = atomic_load(&v->funcs);
    free(fn ? fn - 1 : NULL);
    free(funcs ? funcs - 1 : NULL);
    void **o = v->old_fn;
    while (o) {
        void **next = (void **)o[0];
        free(o);
        o = next;
    }
    free(v);
}

/* The entry name a handle's name stands for in v: the lowered name of a name
 * expression, or the name itself. */
const char *hkl_entry_name(const hkl_version *v, const char *name) {
    for (int i = 0; i < v->art.nlowered; i++)
        if (!strcmp(v->expr[i], name))
            return v->art.lowered_names[i];
    return name;
}

/* ---- the driver side of a version -------------------------------------- */

int hkl_load_version(hk_runtime *rt, hkl_version *v, hk_report *rep) {
    const hkb_driver *d = rt->drv;
    char *info = calloc(1, JIT_LOG_SIZE), *errlog = calloc(1, JIT_LOG_SIZE);
    int err = 0;
    if (!info || !errlog) {
        err = HK_ERR_NOMEM;
        goto out;
    }
    CUjit_option jo[] = {CU_JIT_INFO_LOG_BUFFER,    CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_ERROR_LOG_BUFFER,   CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_OPTIMIZATION_LEVEL, CU_JIT_WALL_TIME};
    void *jv[] = {info,
                  (void *)(uintptr_t)JIT_LOG_SIZE,
                  errlog,
                  (void *)(uintptr_t)JIT_LOG_SIZE,
                  (void *)(uintptr_t)rt->opt.jit_opt_level,
                  NULL};
    unsigned njo = sizeof jo / sizeof jo[0];
    CUresult r;
    const char *what;
    if (rt->opt.loader == HK_LOADER_LIBRARY) {
        what = "cuLibraryLoadData";
        r = d->LibraryLoadData(&v->lib, v->art.image, jo, jv, njo, NULL, NULL, 0);
    } else {
        what = "cuModuleLoadDataEx";
        if ((r = (CUresult)hkl_ctx_push(rt, 0)) == CUDA_SUCCESS) {
            r = d->ModuleLoadDataEx(&v->cumod[0], v->art.image, njo, jo, jv);
            hkl_ctx_pop(rt);
        }
    }
    if (r != CUDA_SUCCESS) {
        err = hkl_report_cu(rep, rt, r, what);
        if (r == CUDA_ERROR_INVALID_PTX || r == CUDA_ERROR_INVALID_IMAGE ||
            r == CUDA_ERROR_JIT_COMPILER_NOT_FOUND || r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
            err = rep ? (rep->error = HK_ERR_COMPILE) : HK_ERR_COMPILE;
        if (r == CUDA_ERROR_NO_BINARY_FOR_GPU)
            err = rep ? (rep->error = HK_ERR_ARCH) : HK_ERR_ARCH;
        if (rep && errlog[0]) {
            free(rep->log);
            rep->log = strdup(errlog);
            size_t n = strlen(rep->message);
            char first[200];
            snprintf(first, sizeof first, "%.*s", (int)strcspn(errlog, "\n"), errlog);
            snprintf(rep->message + n, sizeof rep->message - n, ": %s", first);
        }
    }
out:
    free(info);
    free(errlog);
    return err;
}

/* Unloads v's code. Returns CUDA_SUCCESS when it is gone (or went with a
 * reset context), else the error of an unload worth trying again. A module
 * is unloaded under unload_lock, in the context of its generation only:
 * after a reset its handle is dead, and might even name new code. */
CUresult hkl_unload_version(hk_runtime *rt, hkl_version *v) {
    CUresult r = CUDA_SUCCESS;
    if (v->lib) {
        r = rt->drv->LibraryUnload(v->lib);
        if (unload_retryable(r))
            return r;
        v->lib = NULL;
        r = CUDA_SUCCESS;
    }
    if (v->cumod[0]) {
        pthread_mutex_lock(&rt->reset.unload_lock);
        if (v->ctx_gen == atomic_load(&rt->reset.gen) && (r = (CUresult)hkl_ctx_push(rt, 0)) == 0) {
            r = rt->drv->ModuleUnload(v->cumod[0]);
            hkl_ctx_pop(rt);
        }
        pthread_mutex_unlock(&rt->reset.unload_lock);
        if (unload_retryable(r))
            return r;
        v->cumod[0] = NULL;
        r = CUDA_SUCCESS;
    }
    return r;
}

/* Uploads every function of v into every context now (cuFuncLoad), so the
 * first launches of the new version find their code resident. */
int hkl_upload_version(hk_runtime *rt, hkl_version *v, hk_report *rep) {
    const hkb_driver *d = rt->drv;
    int err = 0;
    for (int i = 0; i < rt->ndev && !err; i++) {
        CUresult r = (CUresult)hkl_ctx_push(rt, i);
        if (r != CUDA_SUCCESS)
            return hkl_report_cu(rep, rt, r, "cuCtxPushCurrent");
        unsigned n = 0;
        if (v->lib) {
            if ((r = d->LibraryGetKernelCount(&n, v->lib)) == CUDA_SUCCESS && n) {
                CUkernel *ks = calloc(n, sizeof *ks);
                if (!ks)
                    err = HK_ERR_NOMEM;
                else if ((r = d->LibraryEnumerateKernels(ks, n, v->lib)) == CUDA_SUCCESS)
                    for (unsigned j = 0; j < n && r == CUDA_SUCCESS; j++) {
                        CUfunction f;
                        if ((r = d->KernelGetFunction(&f, ks[j])) == CUDA_SUCCESS)
                            r = d->FuncLoad(f);
                    }
                free(ks);
            }
        } else if ((r = d->ModuleGetFunctionCount(&n, v->cumod[0])) == CUDA_SUCCESS && n) {
            CUfunction *fs = calloc(n, sizeof *fs);
            if (!fs)
                err = HK_ERR_NOMEM;
            else if ((r = d->ModuleEnumerateFunctions(fs, n, v->cumod[0])) == CUDA_SUCCESS)
                for (unsigned j = 0; j < n && r == CUDA_SUCCESS; j++)
                    r = d->FuncLoad(fs[j]);
            free(fs);
        }
        hkl_ctx_pop(rt);
        if (!err && r != CUDA_SUCCESS) {
            err = hkl_report_cu(rep, rt, r, "loading code into the context");
            if (r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_INVALID_IMAGE)
                err = rep ? (rep->error = HK_ERR_ARCH) : HK_ERR_ARCH;
        }
    }
    if (!err)
        v->staged_on_all = 1;
    return err;
}

/* Reads the parameter layout of handle k's kernel in version v. The image's
 * metadata (ptx/) says how many parameters there are, so the driver is asked
 * about exactly those (cuKernelGetParamInfo/cuFuncGetParamInfo, which has no
 * count call; probing past the end makes the driver report an error that
 * tools such as compute-sanitizer flag). Without metadata (an image reloaded
 * after a reset) indices are probed until the driver says there are no more. */
int hkl_read_layout(hk_runtime *rt, hkl_version *v, const hk_kernel *k, hkl_param_layout *out) {
    const hkb_driver *d = rt->drv;
    void *fn = atomic_load(&v->fn)[k->slot];
    const char *entry = hkl_entry_name(v, k->name);
    const hkp_entry *e = NULL;
    for (int i = 0; i < v->art.meta.nentries && !e; i++)
        if (!strcmp(v->art.meta.entries[i].name, entry))
            e = &v->art.meta.entries[i];
    int cap = e ? (e->nparams > 0 ? e->nparams : 1) : 8;
    memset(out, 0, sizeof *out);
    out->offset = malloc((size_t)cap * sizeof *out->offset);
    out->size = malloc((size_t)cap * sizeof *out->size);
    if (!out->offset || !out->size)
        return HK_ERR_NOMEM;
    for (size_t i = 0; i < 4096 && (!e || (int)i < e->nparams); i++) {
        size_t off = 0, sz = 0;
        CUresult r = rt->opt.loader == HK_LOADER_LIBRARY
                         ? d->KernelGetParamInfo((CUkernel)fn, i, &off, &sz)
                         : d->FuncGetParamInfo((CUfunction)fn, i, &off, &sz);
        if (r != CUDA_SUCCESS) {
            if (!e)
                break;
            /* The driver could not say: the image's own description holds. */
            off = e->params[i].offset;
            sz = e->params[i].size;
        }
        if (out->n == cap) {
            cap *= 2;
            uint32_t *o = realloc(out->offset, (size_t)cap * sizeof *o);
            if (o)
                out->offset = o;
            uint32_t *sp = realloc(out->size, (size_t)cap * sizeof *sp);
            if (sp)
                out->size = sp;
            if (!o || !sp)
                return HK_ERR_NOMEM;
        }
        out->offset[out->n] = (uint32_t)off;
        out->size[out->n] = (uint32_t)sz;
        out->n++;
    }
    return 0;
}

void hkl_layout_free(hkl_param_layout *l) {
    free(l->offset);
    free(l->size);
    memset(l, 0, sizeof *l);
}

/* Describes how two layouts differ, or returns 0 when they are equal. */
int hkl_layout_diff(const hkl_param_layout *a, const hkl_param_layout *b, char *buf, size_t n) {
    if (a->n != b->n) {
        snprintf(buf, n, "had %d parameters, now %d", a->n, b->n);
        return 1;
    }
    for (int i = 0; i < a->n; i++)
        if (a->offset[i] != b->offset[i] || a->size[i] != b->size[i]) {
            snprintf(buf, n, "parameter %d was %u bytes at offset %u, now %u bytes at offset %u", i,
                     a->size[i], a->offset[i], b->size[i], b->offset[i]);
            return 1;
        }
    return 0;
}

/* ---- kernel handles' slots --------------------------------------------- */

/* Readers may still hold a replaced array: it is chained (by the extra
 * leading word of its block) to be freed with the version. */
static void fn_chain(hkl_version *v, void **old) {
    if (!old)
        return;
    void **base = old - 1;
    base[0] = v->old_fn;
    v->old_fn = base;
}

/* Makes room for slot `slot` in v's function tables. */
static int fn_reserve(hk_runtime *rt, hkl_version *v, int slot) {
    int have = atomic_load(&v->cap);
    if (slot < have)
        return 0;
    int cap = have ? have : 8;
    while (cap <= slot)
        cap *= 2;
    size_t nd = (size_t)rt->ndev;
    /* One extra leading word each chains replaced arrays for freeing later. */
    void **raw = calloc((size_t)cap + 1, sizeof *raw);
    void **rawf = calloc((size_t)cap * nd + 1, sizeof *rawf);
    if (!raw || !rawf) {
        free(raw);
        free(rawf);
        return HK_ERR_NOMEM;
    }
    void **old = atomic_load(&v->fn), **oldf = atomic_load(&v->funcs);
    if (old)
        memcpy(raw + 1, old, (size_t)have * sizeof *old);
    if (oldf)
        memcpy(rawf + 1, oldf, (size_t)have * nd * sizeof *oldf);
    fn_chain(v, old);
    fn_chain(v, oldf);
    atomic_store(&v->funcs, rawf + 1); /* before fn: see core.h */
    atomic_store(&v->fn, raw + 1);
    atomic_store(&v->cap, cap); /* after fn: readers load cap, then fn */
    return 0;
}

/* Finds k's kernel in v, checks its layout against k's and fills its slot.
 * Also used when a handle is first taken (k->layout.n < 0 then: adopt). */
int hkl_resolve_slot(hk_runtime *rt, hkl_version *v, hk_kernel *k, hk_report *rep) {
    const hkb_driver *d = rt->drv;
    const char *entry = hkl_entry_name(v, k->name);
    void *fn = NULL;
    CUresult r;
    if (v->lib) {
        CUkernel kern;
        r = d->LibraryGetKernel(&kern, v->lib, entry);
        fn = kern;
    } else {
        CUfunction f;
        r = d->ModuleGetFunction(&f, v->cumod[0], entry);
        fn = f;
    }
    if (r != CUDA_SUCCESS) {
        if (rep) {
            snprintf(rep->kernel, sizeof rep->kernel, "%s", k->name);
            rep->cu_result = (int)r;
            snprintf(rep->cu_name, sizeof rep->cu_name, "%s", hkb_cu_name(d, r));
        }
        /* A C++ kernel's name holds its parameter types: a changed signature
         * renames it, which is worth saying. */
        hku_fail(rep, HK_ERR_MISSING_KERNEL,
                 "kernel '%s' is in use but missing from '%s' version %llu (%s)%s", k->name,
                 k->mod->name, (unsigned long long)v->number, hkb_cu_name(d, r),
                 strncmp(k->name, "_Z", 2) ? ""
                                           : "; the name is a C++ one, which changes with the "
                                             "kernel's parameter types");
        return HK_ERR_MISSING_KERNEL;
    }
    int err = fn_reserve(rt, v, k->slot);
    if (err < 0)
        return err;
    atomic_load(&v->fn)[k->slot] = fn;
    if (v->lib) {
        /* cuKernelGetFunction takes the driver's lock for writing: asked
         * here, with the gate closed, never on a launching thread. A context
         * that cannot say leaves its entry NULL (asked later, gated). */
        void **funcs = atomic_load(&v->funcs) + (size_t)k->slot * (size_t)rt->ndev;
        for (int i = 0; i < rt->ndev; i++) {
            CUfunction f = NULL;
            if (hkl_ctx_push(rt, i) != 0)
                continue;
            if (d->KernelGetFunction(&f, (CUkernel)fn) == CUDA_SUCCESS)
                funcs[i] = f;
            hkl_ctx_pop(rt);
        }
    }
    return 0;
}

/* ---- globals, kept images, retirement ----------------------------------- */

/* Copies every global present in both versions with the same size. A size
 * change is not an error (the new code wants the new shape), but reported. */
int hkl_carry_globals(hk_runtime *rt, hkl_version *old, hkl_version *nv, hk_report *rep) {
    const hkb_driver *d = rt->drv;
    char skipped[256] = "";
    for (int g = 0; g < nv->art.meta.nglobals; g++) {
        const char *name = nv->art.meta.globals[g].name;
        int in_old = 0;
        for (int j = 0; j < old->art.meta.nglobals && !in_old; j++)
            in_old = !strcmp(old->art.meta.globals[j].name, name);
        if (!in_old)
            continue;
        for (int i = 0; i < rt->ndev; i++) {
            CUresult r = (CUresult)hkl_ctx_push(rt, i);
            if (r != CUDA_SUCCESS)
                return hkl_report_cu(rep, rt, r, "cuCtxPushCurrent");
            CUdeviceptr po = 0, pn = 0;
            size_t so = 0, sn = 0;
            if (nv->lib) {
                r = d->LibraryGetGlobal(&po, &so, old->lib, name);
                if (r == CUDA_SUCCESS)
                    r = d->LibraryGetGlobal(&pn, &sn, nv->lib, name);
            } else {
                r = d->ModuleGetGlobal(&po, &so, old->cumod[0], name);
                if (r == CUDA_SUCCESS)
                    r = d->ModuleGetGlobal(&pn, &sn, nv->cumod[0], name);
            }
            if (r == CUDA_SUCCESS && so != sn) {
                size_t n = strlen(skipped);
                if (i == 0 && n < sizeof skipped - 1)
                    snprintf(skipped + n, sizeof skipped - n, "%s%s (%zu -> %zu bytes)",
                             n ? ", " : "", name, so, sn);
            } else if (r == CUDA_SUCCESS && so) {
                /* On hotkern's own non-blocking stream, never the legacy one
                 * (which would join, and so break, a capture on a blocking
                 * stream). Launches of the new version run on the
                 * application's streams: the copy is finished before the
                 * version is visible. A kernel of the old version still in
                 * flight may write the old copy after this; at a safe point
                 * (GPU idle) the carried state is exact. */
                CUstream *cs = &rt->dev[i].copy_stream;
                if (!*cs)
                    r = d->StreamCreate(cs, CU_STREAM_NON_BLOCKING);
                if (r == CUDA_SUCCESS)
                    r = d->MemcpyDtoDAsync(pn, po, so, *cs);
                if (r == CUDA_SUCCESS)
                    r = d->StreamSynchronize(*cs);
            }
            hkl_ctx_pop(rt);
            if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_FOUND) {
                hkl_report_cu(rep, rt, r, "copying a global to the new version");
                size_t n = strlen(rep ? rep->message : "");
                if (rep)
                    snprintf(rep->message + n, sizeof rep->message - n, " ('%s')", name);
                return HK_ERR_CUDA;
            }
        }
    }
    if (skipped[0])
        hku_fail(rep, 0, "globals not carried over (size changed): %s", skipped);
    return 0;
}

void hkl_image_clear(hkl_image *im) {
    free(im->data);
    hku_strv_free(im->expr, im->nexpr);
    hku_strv_free(im->lowered, im->nexpr);
    memset(im, 0, sizeof *im);
}

void hkl_retire(hk_runtime *rt, hkl_version *v) {
    v->retire_epoch = atomic_fetch_add(&rt->gate.epoch, 1) + 1;
    pthread_mutex_lock(&rt->rec.lock);
    v->next = rt->rec.retired;
    rt->rec.retired = v;
    rt->rec.nretired++;
    rt->rec.kick = 1; /* even while a pass runs: it must not sleep after it */
    pthread_cond_signal(&rt->rec.cond);
    pthread_mutex_unlock(&rt->rec.lock);
}

void hkl_reclaim_kick(hk_runtime *rt) {
    pthread_mutex_lock(&rt->rec.lock);
    rt->rec.kick = 1;
    pthread_cond_signal(&rt->rec.cond);
    pthread_mutex_unlock(&rt->rec.lock);
}

/* ---- module queries ----------------------------------------------------- */

uint64_t hk_module_version(hk_runtime *rt, const char *name) {
    if (!rt || !name)
        return 0;
    int nested = hkl_swap_lock(rt); /* a check callback may ask: it holds it */
    hkl_module *m = hkl_module_find(rt, name);
    hkl_version *v = m ? atomic_load(&m->current) : NULL;
    uint64_t n = v ? v->number : 0;
    hkl_swap_unlock(rt, nested);
    return n;
}

int hk_module_global(hk_runtime *rt, const char *module, const char *name, int slot, uint64_t *dptr,
                     size_t *size) {
    if (!rt || !module || !name || !dptr || !size || slot < 0 || slot >= rt->ndev)
        return HK_ERR_INVALID;
    int nested = hkl_swap_lock(rt);
    hkl_module *m = hkl_module_find(rt, module);
    hkl_version *v = m ? atomic_load(&m->current) : NULL;
    int err = HK_ERR_NOT_FOUND;
    if (v && hkl_ctx_push(rt, slot) == 0) {
        CUdeviceptr p = 0;
        CUstreamCaptureMode mode = hkl_relax(rt);
        hkl_gate_close(rt, "looking up a global");
        CUresult r = v->lib ? rt->drv->LibraryGetGlobal(&p, size, v->lib, name)
                            : rt->drv->ModuleGetGlobal(&p, size, v->cumod[0], name);
        hkl_gate_open(rt);
        hkl_unrelax(rt, mode);
        hkl_ctx_pop(rt);
        *dptr = p;
        err = r == CUDA_SUCCESS ? 0 : r == CUDA_ERROR_NOT_FOUND ? HK_ERR_NOT_FOUND : HK_ERR_CUDA;
    }
    hkl_swap_unlock(rt, nested);
    return err;
}

int hk_module_release(hk_runtime *rt, const char *name, int back, uint64_t *release_version) {
    if (!rt || !name || back < 0 || !release_version)
        return HK_ERR_INVALID;
    *release_version = 0;
    int nested = hkl_swap_lock(rt); /* a check callback may ask: it holds it */
    hkl_module *m = hkl_module_find(rt, name);
    hkl_version *v = m ? atomic_load(&m->current) : NULL;
    int err = 0;
    if (!v)
        err = HK_ERR_NOT_FOUND;
    else if (back == 0)
        *release_version = v->release;
    else if (back >= m->nhist)
        err = HK_ERR_NO_HISTORY;
    else /* the ring's newest is the current image; hk_rollback commits the one before */
        *release_version = m->hist[m->nhist - 1 - back].release;
    hkl_swap_unlock(rt, nested);
    return err;
}

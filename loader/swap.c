/*
 * The swap transaction: build -> stage -> validate -> commit, or roll back.
 *
 * build    ptx/ turns the input into a loadable image (NVRTC, nvJitLink, the
 *          compile cache). No driver call and no lock: it runs on the caller's
 *          thread (hk_swap) or the worker (hk_submit), never stalling launches.
 * canary   the version's declared test launches run in the canary helper
 *          process (loader/canary.c, canary/), on the same thread, no lock held.
 * stage    the driver loads the image (cuLibraryLoadData, or cuModuleLoadDataEx
 *          with JIT options and log buffers) and uploads every function into
 *          every context (cuFuncLoad). Uploading waits for the context's
 *          in-flight work and stalls launching threads meanwhile, so
 *          HK_STAGE_AT_SAFE_POINT defers this step to hk_safe_point(), which
 *          the application calls when its GPU work is idle.
 * validate every kernel that has a handle exists and keeps its parameter
 *          layout; the caller's check callback agrees.
 * commit   same-named globals are copied old -> new, the module's `current`
 *          pointer is replaced in one atomic store (all devices at once: a
 *          version holds the code of every device), registered graphs are
 *          retargeted, and the old version is handed to the reclaim thread.
 * Any failure before commit unloads the new version; the old one never
 * stopped running. Swaps of one runtime are serialised by swap_lock.
 *
 * In the code: job_build is the build, ending with the canary
 * (hkl_canary_check); swap_locked runs the rest as one function per step
 * (stage, validate, commit, roll_back) over a swap_txn, after
 * version_from_build and adopt_build have made the built artifact a version.
 *
 * The driver sections of stage/validate and of commit run with the launch
 * gate closed (loader.h): under continuous launches the driver would make
 * them wait for ever. The check callback runs with the gate open. All of it
 * runs in relaxed stream-capture mode, so another thread's global-mode
 * capture is never invalidated by a swap.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader/abi.h"
#include "loader/loader.h"

int hk_swap_options_init_size(hk_swap_options *o, size_t size) {
    hk_swap_options d;
    memset(&d, 0, sizeof d);
    d.carry_globals = 1;
    d.stage = HK_STAGE_AUTO;
    return hkl_sized_init(o, size, &d, sizeof d, HKL_SWAP_OPTIONS_SIZE0);
}

static int check_layout(hk_runtime *rt, hkl_version *v, hk_kernel *k, int accept, hk_report *rep) {
    hkl_param_layout now;
    int err = hkl_read_layout(rt, v, k, &now);
    if (err < 0) {
        hkl_layout_free(&now);
        return err;
    }
    char diff[200];
    if (hkl_layout_diff(&k->layout, &now, diff, sizeof diff)) {
        if (!accept || k->fixed_layout) {
            if (rep)
                snprintf(rep->kernel, sizeof rep->kernel, "%s", k->name);
            if (k->fixed_layout)
                hku_fail(rep, HK_ERR_LAYOUT,
                         "kernel '%s': %s; its callers pass arguments in the layout they were "
                         "compiled with, which no version may change",
                         k->name, diff);
            else
                hku_fail(rep, HK_ERR_LAYOUT,
                         "kernel '%s': %s (pass accept_layout_change to allow it)", k->name, diff);
            hkl_layout_free(&now);
            return HK_ERR_LAYOUT;
        }
    }
    hkl_layout_free(&now);
    return 0;
}

/* Adds v's image to the module's history ring (rollback pops instead). The
 * copy is made first, so a failure leaves the history as it was. */
static int history_push(hk_runtime *rt, hkl_module *m, hkl_version *v) {
    hkl_image im = {.size = v->size,
                    .format = v->format,
                    .version = v->number,
                    .release = v->release,
                    .nexpr = v->nexpr};
    im.data = malloc(v->size);
    im.expr = hku_strv_dup((const char *const *)v->expr, v->nexpr);
    im.lowered = hku_strv_dup((const char *const *)v->lowered, v->nexpr);
    if (!im.data || (v->nexpr > 0 && (!im.expr || !im.lowered))) {
        hkl_image_clear(&im);
        return HK_ERR_NOMEM;
    }
    memcpy(im.data, v->image, v->size);
    if (m->nhist == rt->opt.history) {
        hkl_image_clear(&m->hist[0]);
        memmove(m->hist, m->hist + 1, (size_t)(m->nhist - 1) * sizeof *m->hist);
        m->nhist--;
    } else {
        hkl_image *h = realloc(m->hist, (size_t)(m->nhist + 1) * sizeof *h);
        if (!h) {
            hkl_image_clear(&im);
            return HK_ERR_NOMEM;
        }
        m->hist = h;
    }
    m->hist[m->nhist++] = im;
    return 0;
}

static hkl_module *module_get_or_create(hk_runtime *rt, const char *name) {
    hkl_module *m = hkl_module_find(rt, name);
    if (m)
        return m;
    m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    snprintf(m->name, sizeof m->name, "%s", name);
    atomic_init(&m->current, NULL);
    m->next = rt->modules;
    rt->modules = m;
    return m;
}

static void count(hk_runtime *rt, int committed, int rollback, const hk_report *rep) {
    pthread_mutex_lock(&rt->stats_lock);
    if (committed) {
        rt->stats.swaps++;
        rt->stats.rollbacks += rollback != 0;
        rt->stats.live_versions++;
        rt->stats.last_swap_ms = rep->total_ms;
        hkl_hist_observe(&rt->swap_hist, rep->total_ms);
    } else {
        rt->stats.refused++;
    }
    rt->stats.build_ms_total += rep->build_ms;
    rt->stats.stage_ms_total += rep->stage_ms;
    rt->stats.commit_ms_total += rep->commit_ms;
    pthread_mutex_unlock(&rt->stats_lock);
}

/* 1 when old holds exactly the image (and name expressions) job built. */
static int same_image(const hkl_version *old, const hkl_job *job) {
    if (!old || old->size != job->art.size || old->format != job->art.format ||
        old->nexpr != job->opt.nname_expressions || memcmp(old->image, job->art.image, old->size))
        return 0;
    for (int i = 0; i < old->nexpr; i++)
        if (strcmp(old->expr[i], job->name_expressions[i]))
            return 0;
    return 1;
}

/* Whether job should become a version of m at all, decided before anything
 * is loaded. Returns 0 (go on), 1 (the running version already is this
 * image; a rollback always goes on) or HK_ERR_SUPERSEDED. */
static int swap_needed(hkl_module *m, const hkl_version *old, const hkl_job *job, int rollback,
                       hk_report *rep) {
    if (job->seq && job->seq < m->last_seq) {
        /* Submitted before the version that runs now (a safe point can take
         * jobs out of order with synchronous swaps): never go back. */
        hku_fail(rep, HK_ERR_SUPERSEDED, "'%s': a version submitted later was committed first",
                 m->name);
        if (rep)
            snprintf(rep->module, sizeof rep->module, "%s", m->name);
        return HK_ERR_SUPERSEDED;
    }
    if (rollback || !same_image(old, job))
        return 0;
    /* The running version already is this image: nothing to load. */
    if (rep) {
        rep->version = old->number;
        snprintf(rep->module, sizeof rep->module, "%s", m->name);
        hku_fail(rep, 0, "'%s' version %llu already runs this image", m->name,
                 (unsigned long long)old->number);
    }
    if (job->seq)
        m->last_seq = job->seq;
    return 1;
}

/* One swap in flight: what its steps share, and what a roll back undoes.
 * Everything here is the swapping thread's, under swap_lock. */
typedef struct swap_txn {
    hk_runtime *rt;
    hkl_job *job;
    hk_report *rep; /* may be NULL */
    hkl_module *m;
    hkl_version *old;         /* the running version, or NULL */
    hkl_version *v;           /* the new version */
    hkl_param_layout *newlay; /* new layouts of an accepted change, or NULL */
    int gated;                /* the launch gate is closed */
    hkl_adopted adopted;      /* the program's kernels this version takes over */
    int pending;              /* noted as pending in the last-known-good state */
    const uint8_t *hash;      /* the image's hash (hkl_lkg_hash) */
    double t0, t1;            /* when stage and commit began (hkl_now_ms) */
} swap_txn;

static void txn_gate_close(swap_txn *t, const char *what) {
    hkl_gate_close(t->rt, what);
    t->gated = 1;
}

static void txn_gate_open(swap_txn *t) {
    hkl_gate_open(t->rt);
    t->gated = 0;
}

/* The end of the build step: a new version of t->m takes over the job's
 * image and metadata (the job keeps none of them). NULL: out of memory. */
static hkl_version *version_from_build(hk_runtime *rt, hkl_module *m, hkl_job *job) {
    hkl_version *v = hkl_version_new(rt, m, m->last_version + 1);
    if (!v)
        return NULL;
    v->release = job->opt.release_version;
    v->image = job->art.image;
    v->size = job->art.size;
    v->format = job->art.format;
    job->art.image = NULL;
    v->nglobals = job->art.meta.nglobals;
    v->globals = job->art.meta.globals;
    job->art.meta.globals = NULL;
    job->art.meta.nglobals = 0;
    v->nentries = job->art.meta.nentries;
    v->entries = job->art.meta.entries;
    job->art.meta.entries = NULL;
    job->art.meta.nentries = 0;
    v->nexpr = job->art.nlowered;
    v->expr = hku_strv_dup((const char *const *)job->name_expressions, job->opt.nname_expressions);
    v->lowered = job->art.lowered_names;
    job->art.lowered_names = NULL;
    job->art.nlowered = 0;
    return v;
}

/* Checks that every name expression of the job has its lowered name in the
 * new version, and starts the version's part of the report. Lowered names
 * missing for some expression, or no memory for the copy: without the
 * mapping, handles taken by expression cannot be resolved, so the version
 * is refused rather than half-described. */
static int adopt_build(swap_txn *t) {
    hkl_version *v = t->v;
    int nexpr = t->job->opt.nname_expressions;
    if (v->nexpr != nexpr || (v->nexpr > 0 && (!v->expr || !v->lowered))) {
        hku_strv_free(v->expr, nexpr);
        hku_strv_free(v->lowered, v->nexpr);
        v->expr = v->lowered = NULL;
        v->nexpr = 0;
        if (nexpr > 0) {
            hku_fail(t->rep, HK_ERR_NOMEM, "name expressions could not be mapped to kernels");
            return HK_ERR_NOMEM;
        }
    }
    if (t->rep) {
        t->rep->version = v->number;
        snprintf(t->rep->module, sizeof t->rep->module, "%s", t->m->name);
        /* The build may have run on another thread, long before (safe points). */
        t->rep->build_ms = t->job->art.ms;
        t->rep->cache_hit = t->job->art.cache_hit;
    }
    return 0;
}

/* Stage: the driver loads the new version and uploads its code into every
 * context. Closes the launch gate and leaves it closed for validate. */
static int stage(swap_txn *t) {
    hk_runtime *rt = t->rt;
    /* The program's kernels this version has become handles first, so that
     * they are validated as every handle is. */
    int err = hkl_expect_adopt(rt, t->m, t->v, &t->adopted);
    if (err < 0)
        return err;
    if (t->m->nkernels && t->job->opt.accept_layout_change) {
        t->newlay = calloc((size_t)t->m->nkernels, sizeof *t->newlay);
        if (!t->newlay)
            return HK_ERR_NOMEM;
    }
    txn_gate_close(t, t->job->opt.check ? "a swap's load and validation"
                                        : "a swap (load through publication)");
    if (rt->hook)
        rt->hook(rt, HKL_HOOK_GATED);
    if ((err = hkl_load_version(rt, t->v, t->rep)) < 0)
        return err;
    return hkl_upload_version(rt, t->v, t->rep);
}

/* Validate: every handle's kernel is in the new version, with the layout it
 * had (or, when a change is accepted, its new layout is collected in
 * t->newlay) and the attributes set through the handle; then, with the gate
 * open again, the caller's check callback agrees. Without a callback the
 * gate stays closed through the commit: one closing per swap, not two. */
static int validate(swap_txn *t) {
    hk_runtime *rt = t->rt;
    hkl_module *m = t->m;
    int err;
    for (int i = 0; i < m->nkernels; i++) {
        hk_kernel *k = m->kernels[i];
        if ((err = hkl_resolve_slot(rt, t->v, k, t->rep)) < 0)
            return err;
        if ((err = check_layout(rt, t->v, k, t->job->opt.accept_layout_change, t->rep)) < 0)
            return err;
        if (t->newlay && (err = hkl_read_layout(rt, t->v, k, &t->newlay[i])) < 0)
            return err;
        if ((err = hkl_apply_attrs(rt, t->v, k, t->rep)) < 0)
            return err;
    }
    if (!t->job->opt.check)
        return 0;
    txn_gate_open(t);
    char msg[256] = "";
    if (t->job->opt.check(m->name, t->v->number, rt->opt.userdata, msg, sizeof msg) == 0)
        return 0;
    hku_fail(t->rep, HK_ERR_REJECTED, "check callback refused version %llu: %s",
             (unsigned long long)t->v->number, msg[0] ? msg : "(no reason given)");
    return HK_ERR_REJECTED;
}

/* Makes the new version the module's current one, with the gate closed.
 * Cannot fail. seq_cst pairs with the launch path's epoch announcement (see
 * reclaim.c): a launcher that read the old pointer is visible to the grace
 * period that frees it. */
static void publish(swap_txn *t) {
    hkl_module *m = t->m;
    atomic_store(&m->current, t->v);
    m->last_version = t->v->number;
    if (t->job->seq)
        m->last_seq = t->job->seq;
    if (t->newlay)
        for (int i = 0; i < m->nkernels; i++) {
            hkl_layout_free(&m->kernels[i]->layout);
            m->kernels[i]->layout = t->newlay[i];
        }
    free(t->newlay);
    t->newlay = NULL;
    hkl_graphs_retarget(t->rt, m, t->v, t->old, t->rep);
}

/* Commit: globals carried over and the image kept for rollback (either may
 * still fail and roll back), then the new version published and the old one
 * handed to the reclaim thread. The version is noted as pending in the
 * last-known-good state first (lkg_lock is a leaf, held for memory work
 * only, so this may happen with the gate closed), so that a launch of it
 * that faults right after the publication, before hkl_lkg_committed, still
 * has it quarantined. The gate is closed still when no check callback ran. */
static int commit(swap_txn *t) {
    hk_runtime *rt = t->rt;
    int err;
    t->t1 = hkl_now_ms();
    hkl_lkg_pending(rt, t->m->name, t->hash, t->v->number, t->job->opt.release_version);
    t->pending = 1;
    if (!t->gated)
        txn_gate_close(t, "a swap's commit");
    if (t->old && t->job->opt.carry_globals &&
        (err = hkl_carry_globals(rt, t->old, t->v, t->rep)) < 0)
        return err;
    if ((err = history_push(rt, t->m, t->v)) < 0)
        return err;
    if ((err = hkl_expect_seed(rt, t->m, t->v, t->old == NULL, t->rep)) < 0) {
        hkl_image_clear(&t->m->hist[--t->m->nhist]); /* the push above */
        return err;
    }
    publish(t);
    txn_gate_open(t);
    hkl_expect_publish(rt, t->m, t->v, &t->adopted);
    if (t->old) {
        /* A program that stages at safe points wants no driver work outside
         * them: the old code is unloaded at a later safe point too. */
        t->old->unload_at_safe_point = t->job->at_safe_point;
        hkl_retire(rt, t->old);
    }
    t->m->last_error = 0;
    snprintf(t->m->last_message, sizeof t->m->last_message, "version %llu committed",
             (unsigned long long)t->v->number);
    if (t->rep) {
        t->rep->stage_ms = t->t1 - t->t0;
        t->rep->commit_ms = hkl_now_ms() - t->t1;
        t->rep->version = t->v->number;
    }
    return 0;
}

/* A module whose first version failed does not exist: unlinks and frees m
 * when nothing was ever committed to it. */
static void module_drop_if_unused(hk_runtime *rt, hkl_module *m) {
    if (atomic_load(&m->current) || m->nkernels || m->nhist)
        return;
    hkl_module **pp = &rt->modules;
    while (*pp != m)
        pp = &(*pp)->next;
    *pp = m->next;
    free(m->hist);
    free(m->kernels);
    free(m);
}

/* Roll back: undoes whatever the steps did before err (the running version
 * never stopped), records the failure and returns err. */
static int roll_back(swap_txn *t, int err) {
    hk_runtime *rt = t->rt;
    hkl_expect_unadopt(t->m, &t->adopted);
    if (t->pending)
        hkl_lkg_unpending(rt, t->m->name, t->v->number);
    if (t->newlay) {
        for (int i = 0; i < t->m->nkernels; i++)
            hkl_layout_free(&t->newlay[i]);
        free(t->newlay);
    }
    /* The refused image is unloaded inside the swap's gated section (closed
     * again after a check callback): an unload takes the driver's lock for
     * writing, which under continuous launches it would never get with the
     * gate open. Nothing of it ever ran, so the unload does not wait. */
    if (!t->gated && (t->v->lib || t->v->cumod[0]))
        txn_gate_close(t, "unloading a refused version");
    CUresult ur = hkl_unload_version(rt, t->v);
    if (t->gated)
        txn_gate_open(t);
    if (ur == CUDA_SUCCESS) {
        hkl_version_free(t->v);
    } else {
        /* The driver would not unload it now: the reclaim thread will. */
        t->v->dead = 1;
        pthread_mutex_lock(&rt->stats_lock);
        rt->stats.live_versions++;
        pthread_mutex_unlock(&rt->stats_lock);
        hkl_retire(rt, t->v);
    }
    t->m->last_error = err;
    snprintf(t->m->last_message, sizeof t->m->last_message, "%s",
             t->rep && t->rep->message[0] ? t->rep->message : hk_strerror(err));
    if (t->rep) {
        t->rep->error = err;
        t->rep->stage_ms = hkl_now_ms() - t->t0;
    }
    module_drop_if_unused(rt, t->m);
    return err;
}

/* The swap transaction for a built job (the header of this file): stage,
 * validate and commit, or roll back. swap_lock held. On return the job's
 * artifact image has been moved into the version (or freed with the job).
 * Returns 0 (committed), 1 (the current version already is this image; not
 * a rollback) or an error. */
static int swap_locked(hk_runtime *rt, hkl_job *job, uint8_t *hash, int rollback, hk_report *rep,
                       uint64_t *oldv) {
    hkl_module *m = module_get_or_create(rt, job->name);
    if (!m)
        return HK_ERR_NOMEM;
    hkl_version *old = atomic_load(&m->current);
    *oldv = old ? old->number : 0;
    int err = swap_needed(m, old, job, rollback, rep);
    if (err)
        return err;
    /* The last-known-good record names the image by its hash, taken only
     * now that it is known to be new: the image already running costs no
     * hash (a rollback's caller has taken it). */
    if (!rollback)
        hkl_lkg_hash(job->art.image, job->art.size, hash);
    swap_txn t = {
        .rt = rt, .job = job, .rep = rep, .m = m, .old = old, .hash = hash, .t0 = hkl_now_ms()};
    if (!(t.v = version_from_build(rt, m, job)))
        return HK_ERR_NOMEM;
    if ((err = adopt_build(&t)) < 0 || (err = stage(&t)) < 0 || (err = validate(&t)) < 0 ||
        (err = commit(&t)) < 0)
        return roll_back(&t, err);
    return 0;
}

/* Fills the report's total and the part of it no step accounts for
 * (waiting for the lock, a safe point, reset recovery). */
static void report_times(hk_report *rep, double t_start) {
    if (!rep || !t_start)
        return;
    rep->total_ms = hkl_now_ms() - t_start;
    double w = rep->total_ms - rep->build_ms - rep->stage_ms - rep->commit_ms;
    rep->wait_ms = w > 0 ? w : 0;
}

/* Swaps a built job in (never a rollback: hk_rollback runs its own). Takes
 * swap_lock, unless this thread holds it already (a check callback):
 * HK_ERR_BUSY then. */
static int swap_built(hk_runtime *rt, hkl_job *job, hk_report *rep) {
    uint64_t oldv = 0;
    if (hkl_swap_held(rt)) {
        /* From a check callback: this swap would wait for the one running. */
        hku_fail(rep, HK_ERR_BUSY,
                 "'%s': a swap cannot be started from a check callback of the same "
                 "runtime (it would wait for itself); use hk_submit",
                 job->name);
        return HK_ERR_BUSY;
    }
    uint8_t hash[32]; /* filled by swap_locked when the image is new */
    CUstreamCaptureMode mode = hkl_relax(rt);
    hkl_swap_lock(rt); /* not held by this thread: checked above */
    int reset = hkl_check_reset(rt);
    /* Driver queries such as cuKernelGetParamInfo need a current context;
     * the worker and the network threads have none of their own. */
    int pushed = hkl_ctx_push(rt, 0) == 0;
    int err = swap_locked(rt, job, hash, 0, rep, &oldv);
    if (err == 0) /* recorded in commit order, under swap_lock (memory only) */
        hkl_lkg_committed(rt, atomic_load(&hkl_module_find(rt, job->name)->current), hash,
                          job->opt.release_version);
    if (pushed)
        hkl_ctx_pop(rt);
    hkl_swap_unlock(rt, 0);
    hkl_unrelax(rt, mode);
    if (err == 0) /* the record's disk work, before the event */
        hkl_lkg_flush(rt, job->name);
    if (reset)
        hkl_emit_reset(rt);
    if (err < 0 && rep && hkl_lkg_sticky(rep->cu_result))
        hkl_lkg_lost(rt, rep->cu_result, "a swap's driver call");
    report_times(rep, job->t_start);
    if (err == 1) {
        hk_log(rt, HK_LOG_DEBUG, "engine", "%s from %s: v%llu runs this image already", job->name,
               job->origin ? job->origin : "api", (unsigned long long)oldv);
        return 0; /* unchanged: no new version, no event */
    }
    count(rt, err == 0, 0, rep);
    hkl_emit(rt, err ? HK_EVENT_REFUSED : HK_EVENT_COMMITTED, job->name, oldv,
             err ? 0 : rep->version, job->origin, rep);
    return err;
}

int hkl_swap_job(hk_runtime *rt, hkl_job *job, hk_report *rep) {
    return swap_built(rt, job, rep);
}

/* ---- jobs ------------------------------------------------------------- */

void hkl_job_free(hkl_job *job) {
    if (!job)
        return;
    free(job->data);
    free(job->origin);
    free(job->source_name);
    hku_strv_free(job->nvrtc_options, job->opt.nnvrtc_options);
    hku_strv_free(job->name_expressions, job->opt.nname_expressions);
    free(job->headers);
    hkp_artifact_free(&job->art);
    free(job);
}

static int job_new(hkl_job **out, const char *name, const void *data, size_t size,
                   const hk_swap_options *opt) {
    /* A name that could not be recorded or logged is refused here, before
     * anything is built (util/util.h, hku_name_check). */
    if (hku_name_check(name, NULL, 0) < 0 || !data || !size)
        return HK_ERR_INVALID;
    hkl_job *j = calloc(1, sizeof *j);
    if (!j)
        return HK_ERR_NOMEM;
    snprintf(j->name, sizeof j->name, "%s", name);
    if (hkl_swap_options_in(&j->opt, opt) < 0) {
        free(j);
        return HK_ERR_INVALID;
    }
    j->data = malloc(size);
    j->origin = strdup(j->opt.origin ? j->opt.origin : "api");
    j->source_name = j->opt.source_name ? strdup(j->opt.source_name) : NULL;
    j->nvrtc_options = hku_strv_dup(j->opt.nvrtc_options, j->opt.nnvrtc_options);
    j->name_expressions = hku_strv_dup(j->opt.name_expressions, j->opt.nname_expressions);
    if (!j->data || !j->origin || (j->opt.source_name && !j->source_name) ||
        (j->opt.nnvrtc_options > 0 && !j->nvrtc_options) ||
        (j->opt.nname_expressions > 0 && !j->name_expressions)) {
        if (!j->nvrtc_options)
            j->opt.nnvrtc_options = 0;
        if (!j->name_expressions)
            j->opt.nname_expressions = 0;
        hkl_job_free(j);
        return HK_ERR_NOMEM;
    }
    int herr =
        hku_headers_dup(j->opt.headers, j->opt.nheaders > 0 ? j->opt.nheaders : 0, &j->headers);
    if (herr < 0) {
        hkl_job_free(j);
        return herr;
    }
    j->opt.headers = j->headers;
    if (!j->headers)
        j->opt.nheaders = 0;
    memcpy(j->data, data, size);
    j->size = size;
    /* The copies replace the caller's pointers, which die with the call. */
    j->opt.nvrtc_options = (const char *const *)j->nvrtc_options;
    j->opt.name_expressions = (const char *const *)j->name_expressions;
    j->opt.source_name = j->source_name;
    j->opt.origin = j->origin;
    *out = j;
    return 0;
}

/* Adds to a CUDA C job the name expressions that instantiate the
 * program's template kernels its source declares (expect.c), after the
 * caller's own. */
static int add_program_exprs(hk_runtime *rt, hkl_job *j) {
    hk_format fmt = j->opt.format;
    char why[64];
    if (fmt == HK_FORMAT_AUTO && hkp_detect(j->data, j->size, &fmt, why, sizeof why) < 0)
        return 0;
    if (fmt != HK_FORMAT_CUDA_C)
        return 0;
    char **extra = NULL;
    int n = 0, have = j->opt.nname_expressions;
    hkl_expect_exprs(rt, j->data, j->size, &extra, &n);
    int added = 0;
    for (int i = 0; i < n; i++) {
        int dup = 0;
        for (int k = 0; k < have + added && !dup; k++)
            dup = !strcmp(j->name_expressions[k], extra[i]);
        char **v =
            dup ? NULL : realloc(j->name_expressions, (size_t)(have + added + 1) * sizeof *v);
        if (v) {
            v[have + added++] = extra[i];
            j->name_expressions = v;
            extra[i] = NULL;
        }
    }
    hku_strv_free(extra, n);
    j->opt.nname_expressions = have + added;
    j->opt.name_expressions = (const char *const *)j->name_expressions;
    return 0;
}

/* HK_ERR_SUPERSEDED, with rep saying so, when j (from hkl_submit_latest) has
 * a later job of its module queued behind it that supersedes it; else 0.
 * when says when the later one came ("during its build"). Takes work_lock. */
static int superseded(hk_runtime *rt, const hkl_job *j, const char *when, hk_report *rep) {
    if (!j->latest)
        return 0;
    uint64_t by = 0;
    pthread_mutex_lock(&rt->work_lock);
    for (const hkl_job *q = rt->jobs; q; q = q->next) {
        if (q->latest && q->seq > j->seq && !strcmp(q->name, j->name))
            by = q->seq;
    }
    pthread_mutex_unlock(&rt->work_lock);
    if (!by)
        return 0;
    if (rep)
        snprintf(rep->module, sizeof rep->module, "%s", j->name);
    return hku_fail(rep, HK_ERR_SUPERSEDED,
                    "'%s' from %s: a newer version of it was submitted %s (submission %llu "
                    "after %llu): only the newest is built and committed",
                    j->name, j->origin, when, (unsigned long long)by, (unsigned long long)j->seq);
}

/* Runs the build step of a job. No lock held. */
static int job_build(hk_runtime *rt, hkl_job *j, hk_report *rep) {
    add_program_exprs(rt, j);
    hkp_build_opts bo = {
        .arch = rt->arch,
        .ptx_to_cubin = rt->opt.ptx_mode == HK_PTX_NVJITLINK,
        .opt_level = rt->opt.jit_opt_level,
        .nvrtc_options = j->opt.nvrtc_options,
        .nnvrtc_options = j->opt.nnvrtc_options,
        .name_expressions = j->opt.name_expressions,
        .nname_expressions = j->opt.nname_expressions,
        .source_name = j->source_name ? j->source_name : j->name,
        .cache = rt->cache,
        .headers = j->opt.headers,
        .nheaders = j->opt.nheaders,
        .base_headers = rt->opt.headers,
        .nbase_headers = rt->opt.nheaders,
        .pch = 1, /* a runtime compiles again and again */
        .iso = rt->iso,
        .fast_compile = j->opt.build_profile == HK_BUILD_PROFILE_DEV,
    };
    char why[512] = "";
    int err = hkp_build(j->data, j->size, j->opt.format, &bo, &j->art, why, sizeof why);
    if (rt->hook)
        rt->hook(rt, HKL_HOOK_COMPILED);
    if (rep) {
        snprintf(rep->module, sizeof rep->module, "%s", j->name);
        rep->build_ms = j->art.ms;
        rep->cache_hit = j->art.cache_hit;
    }
    if (j->art.ndeps && j->source_name)
        hkl_sources_deps_built(rt, j->source_name, (const char *const *)j->art.deps, j->art.ndeps);
    if (err < 0) {
        hku_fail(rep, err, "%s: %s", j->source_name ? j->source_name : j->name,
                 why[0] ? why : hk_strerror(err));
        if (rep && j->art.log) {
            free(rep->log);
            rep->log = strdup(j->art.log);
        }
        return err;
    }
    j->built = 1;
    if (j->art.cache_note[0]) { /* built, not cached: said, not refused */
        hku_fail(rep, 0, "%s", j->art.cache_note);
        hk_log(rt, HK_LOG_WARN, "engine", "'%s': %s", j->name, j->art.cache_note);
    }
    /* A later save of the module arrived during the build: the canary run
     * and the driver work would be for a version replaced at once. */
    if ((err = superseded(rt, j, "during its build", rep)) < 0)
        return err;
    /* An image that ran when the context was lost is refused before its
     * canary run and before the driver sees it (hashed with no lock held). */
    if ((err = hkl_lkg_check(rt, j->name, j->art.image, j->art.size, rep)) < 0)
        return err;
    /* Between build and stage: the version's test launches run in the
     * canary process, on this thread, with no lock held. */
    return hkl_canary_check(rt, j, rep);
}

/* What AUTO means for a swap requested on this thread now. */
static hk_stage_mode resolve_stage(hk_runtime *rt, hk_stage_mode want, int *on_sp_thread) {
    pthread_mutex_lock(&rt->work_lock);
    int seen = rt->safe_points_seen;
    *on_sp_thread = seen && pthread_equal(rt->safe_point_thread, pthread_self());
    pthread_mutex_unlock(&rt->work_lock);
    if (want != HK_STAGE_AUTO)
        return want;
    return seen && !*on_sp_thread ? HK_STAGE_AT_SAFE_POINT : HK_STAGE_NOW;
}

/* Hands a built job to the next safe point and waits for its outcome, up to
 * safe_point_wait_ms; then, if no safe point took it, stages it here. The
 * job stays the caller's in every case. */
static int swap_at_safe_point(hk_runtime *rt, hkl_job *j, hk_report *r) {
    hkl_waiter w = {.done = 0, .err = 0, .rep = r};
    pthread_mutex_init(&w.lock, NULL);
    hku_cond_init(&w.cond);
    j->waiter = &w;
    j->next = NULL;
    pthread_mutex_lock(&rt->work_lock);
    hkl_job **pp = &rt->pending;
    while (*pp)
        pp = &(*pp)->next;
    *pp = j;
    pthread_mutex_unlock(&rt->work_lock);

    double end = hkl_now_ms() + (rt->opt.safe_point_wait_ms > 0 ? rt->opt.safe_point_wait_ms : 0);
    pthread_mutex_lock(&w.lock);
    while (!w.done && hkl_now_ms() < end) {
        struct timespec ts;
        hku_deadline(&ts, 5000);
        pthread_cond_timedwait(&w.cond, &w.lock, &ts);
    }
    int done = w.done;
    pthread_mutex_unlock(&w.lock);
    int err = w.err;
    if (!done) {
        /* No safe point came in time. Take the job back unless one is
         * staging it right now, in which case its outcome is near. */
        int taken = 0;
        pthread_mutex_lock(&rt->work_lock);
        for (pp = &rt->pending; *pp; pp = &(*pp)->next)
            if (*pp == j) {
                *pp = j->next;
                taken = 1;
                break;
            }
        pthread_mutex_unlock(&rt->work_lock);
        if (taken) {
            j->waiter = NULL;
            err = swap_built(rt, j, r);
        } else {
            pthread_mutex_lock(&w.lock);
            while (!w.done)
                pthread_cond_wait(&w.cond, &w.lock);
            err = w.err;
            pthread_mutex_unlock(&w.lock);
        }
    }
    pthread_mutex_destroy(&w.lock);
    pthread_cond_destroy(&w.cond);
    return err;
}

static int swap_call(hk_runtime *rt, const char *name, const void *image, size_t size,
                     const hk_swap_options *opt, hk_report *rep) {
    double t_start = hkl_now_ms();
    if (rep)
        hk_report_clear(rep);
    if (!rt)
        return HK_ERR_INVALID;
    int on_sp_thread = 0;
    hk_stage_mode stage = resolve_stage(rt, opt ? opt->stage : HK_STAGE_AUTO, &on_sp_thread);
    if (stage == HK_STAGE_AT_SAFE_POINT && on_sp_thread) {
        hku_fail(rep, HK_ERR_INVALID,
                 "hk_swap for a safe point from the thread that calls hk_safe_point "
                 "would wait for itself: use HK_STAGE_AUTO or hk_submit");
        return HK_ERR_INVALID;
    }
    hkl_job *j;
    int err = job_new(&j, name, image, size, opt);
    char why[160];
    if (err < 0 && hku_name_check(name, why, sizeof why) < 0) {
        hku_fail(rep, err, "%s", why);
        return err;
    }
    if (err < 0) {
        hku_fail(rep, err, "bad arguments (non-empty image, named headers)");
        return err;
    }
    j->seq = atomic_fetch_add(&rt->job_seq, 1) + 1;
    j->t_start = t_start;
    hk_report local = HK_REPORT_INIT;
    hk_report *r = rep ? rep : &local;
    err = job_build(rt, j, r);
    if (err < 0) {
        report_times(r, t_start);
        count(rt, 0, 0, r);
        hkl_emit(rt, HK_EVENT_REFUSED, j->name, hk_module_version(rt, j->name), 0, j->origin, r);
    } else if (stage == HK_STAGE_AT_SAFE_POINT) {
        err = swap_at_safe_point(rt, j, r);
    } else {
        err = swap_built(rt, j, r);
    }
    hkl_job_free(j);
    hk_report_clear(&local);
    return err;
}

int hk_swap(hk_runtime *rt, const char *name, const void *image, size_t size,
            const hk_swap_options *opt, hk_report *rep) {
    hk_report full;
    hk_swap_options o;
    if (hkl_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    int err = HK_ERR_INVALID;
    if (hkl_swap_options_in(&o, opt) < 0)
        hku_fail(&full, err, "hk_swap_options.size %zu is below the first layout (%zu)",
                 hkl_size_of(opt), (size_t)HKL_SWAP_OPTIONS_SIZE0);
    else
        err = swap_call(rt, name, image, size, &o, rep ? &full : NULL);
    hkl_report_out(rep, &full);
    return err;
}

/* A job that builds nothing: the kept image prev, with its name expressions
 * and globals, ready for the swap transaction. *out is set even when this
 * fails (HK_ERR_NOMEM), for the caller to free. */
static int rollback_job(hk_runtime *rt, const char *name, const hkl_image *prev, hkl_job **out) {
    hkl_job *j = *out = calloc(1, sizeof *j);
    if (!j)
        return HK_ERR_NOMEM;
    snprintf(j->name, sizeof j->name, "%s", name);
    hk_swap_options_init(&j->opt);
    j->seq = atomic_fetch_add(&rt->job_seq, 1) + 1; /* later submissions may override it */
    j->origin = strdup("rollback");
    /* The image keeps its release: status and the records name it. */
    j->opt.release_version = prev->release;
    j->art.image = malloc(prev->size);
    j->name_expressions = hku_strv_dup((const char *const *)prev->expr, prev->nexpr);
    j->art.lowered_names = hku_strv_dup((const char *const *)prev->lowered, prev->nexpr);
    if (!j->origin || !j->art.image ||
        (prev->nexpr && (!j->name_expressions || !j->art.lowered_names)))
        return HK_ERR_NOMEM;
    j->opt.nname_expressions = j->art.nlowered = prev->nexpr;
    memcpy(j->art.image, prev->data, prev->size);
    j->art.size = prev->size;
    j->art.format = prev->format;
    /* Globals are read again from the image: rollback carries state too. */
    char why[256];
    if (hkp_meta_read(prev->data, prev->size, prev->format, &j->art.meta, why, sizeof why) < 0)
        memset(&j->art.meta, 0, sizeof j->art.meta);
    return 0;
}

/* Swaps m back to the image before its newest (j, from rollback_job).
 * swap_lock held. The version rolled away from leaves the history, so
 * successive rollbacks walk further back; the image rolled to is pushed
 * anew. A failure leaves the history as it was. */
static int rollback_locked(hk_runtime *rt, hkl_module *m, hkl_job *j, hk_report *r,
                           uint64_t *oldv) {
    hkl_image top = m->hist[m->nhist - 1];
    hkl_image prev = m->hist[m->nhist - 2];
    m->nhist -= 2;
    uint8_t hash[32];
    hkl_lkg_hash(j->art.image, j->art.size, hash);
    int pushed = hkl_ctx_push(rt, 0) == 0;
    int err = swap_locked(rt, j, hash, 1, r, oldv);
    if (err == 0)
        hkl_lkg_committed(rt, atomic_load(&m->current), hash, 0);
    if (pushed)
        hkl_ctx_pop(rt);
    if (err < 0) {
        m->hist[m->nhist++] = prev;
        m->hist[m->nhist++] = top;
    } else {
        hkl_image_clear(&top);
        hkl_image_clear(&prev);
    }
    return err;
}

/* Rolls name back; with `check`, only when the image it would commit
 * belongs to release `release` (checked under swap_lock, so no commit from
 * another source can come between the check and the rollback). */
static int rollback_call(hk_runtime *rt, const char *name, int check, uint64_t release,
                         hk_report *rep) {
    double t_start = hkl_now_ms();
    if (rep)
        hk_report_clear(rep);
    if (!rt || !name)
        return HK_ERR_INVALID;
    if (hkl_swap_held(rt)) {
        hku_fail(rep, HK_ERR_BUSY, "a rollback cannot run inside a check callback");
        return HK_ERR_BUSY;
    }
    hk_report local = HK_REPORT_INIT;
    hk_report *r = rep ? rep : &local;
    uint64_t oldv = 0;
    hkl_job *j = NULL;
    int err;
    CUstreamCaptureMode mode = hkl_relax(rt);
    hkl_swap_lock(rt);
    int reset = hkl_check_reset(rt);
    hkl_module *m = hkl_module_find(rt, name);
    if (!m || m->nhist < 2) {
        err = m ? HK_ERR_NO_HISTORY : HK_ERR_NOT_FOUND;
        hku_fail(r, err, m ? "module '%s' has no earlier version kept" : "no module '%s'", name);
    } else if (check && m->hist[m->nhist - 2].release != release) {
        err = hku_fail(r, HK_ERR_REJECTED,
                       "module '%s' would roll back to release v%llu (engine version %llu), not "
                       "v%llu; nothing changed",
                       name, (unsigned long long)m->hist[m->nhist - 2].release,
                       (unsigned long long)m->hist[m->nhist - 2].version,
                       (unsigned long long)release);
    } else if ((err = rollback_job(rt, name, &m->hist[m->nhist - 2], &j)) == 0) {
        err = rollback_locked(rt, m, j, r, &oldv);
    }
    hkl_swap_unlock(rt, 0);
    hkl_unrelax(rt, mode);
    if (j && err == 0)
        hkl_lkg_flush(rt, name);
    if (reset)
        hkl_emit_reset(rt);
    report_times(r, t_start);
    if (j) {
        count(rt, err == 0, 1, r);
        hkl_emit(rt, err ? HK_EVENT_REFUSED : HK_EVENT_ROLLED_BACK, name, oldv,
                 err ? 0 : r->version, "rollback", r);
    }
    hkl_job_free(j);
    hk_report_clear(&local);
    return err;
}

int hk_rollback(hk_runtime *rt, const char *name, hk_report *rep) {
    hk_report full;
    if (hkl_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    int err = rollback_call(rt, name, 0, 0, rep ? &full : NULL);
    hkl_report_out(rep, &full);
    return err;
}

int hk_rollback_release(hk_runtime *rt, const char *name, uint64_t release_version,
                        hk_report *rep) {
    hk_report full;
    if (hkl_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    int err = rollback_call(rt, name, 1, release_version, rep ? &full : NULL);
    hkl_report_out(rep, &full);
    return err;
}

/* ---- the worker and safe points ---------------------------------------- */

/* Gives a waiting hk_swap its outcome; rep (may be NULL) is moved into the
 * waiter's report. The job must not be touched afterwards. */
static void finish_waiter(hkl_waiter *w, int err, hk_report *rep) {
    pthread_mutex_lock(&w->lock);
    if (rep && w->rep) {
        hk_report_clear(w->rep);
        *w->rep = *rep;
        hk_report_init(rep);
    } else if (w->rep) {
        hku_fail(w->rep, err, "%s", hk_strerror(err));
    }
    w->err = err;
    w->done = 1;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* Takes the pending jobs without a waiter whose deadline has passed, in
 * order. work_lock held. Returns the earliest deadline left (0: none). */
static double take_expired(hk_runtime *rt, hkl_job **out) {
    double now = hkl_now_ms(), next = 0;
    hkl_job **tail = out;
    for (hkl_job **pp = &rt->pending; *pp;) {
        hkl_job *j = *pp;
        if (j->deadline > 0 && j->deadline <= now) {
            *pp = j->next;
            j->next = NULL;
            *tail = j;
            tail = &j->next;
        } else {
            if (j->deadline > 0 && (!next || j->deadline < next))
                next = j->deadline;
            pp = &j->next;
        }
    }
    return next;
}

/* Pending jobs whose safe point never came are staged by the worker: a
 * program that stopped calling hk_safe_point still gets its updates, one
 * safe_point_wait_ms late. */
static void stage_expired(hk_runtime *rt, hkl_job *list) {
    while (list) {
        hkl_job *j = list;
        list = j->next;
        hk_report rep = HK_REPORT_INIT;
        swap_built(rt, j, &rep);
        hk_report_clear(&rep);
        hkl_job_free(j);
    }
}

/* Waits until there is a job to build or the worker is told to stop,
 * staging meanwhile the pending jobs whose safe point never came. work_lock
 * held (dropped while staging and waiting). */
static void wait_for_jobs(hk_runtime *rt) {
    while (!rt->jobs && !rt->dropped && !rt->work_stop) {
        hkl_job *expired = NULL;
        double next = take_expired(rt, &expired);
        if (expired) {
            rt->busy++;
            pthread_mutex_unlock(&rt->work_lock);
            stage_expired(rt, expired);
            pthread_mutex_lock(&rt->work_lock);
            rt->busy--;
            pthread_cond_broadcast(&rt->idle_cond);
            continue;
        }
        if (!next) {
            pthread_cond_wait(&rt->work_cond, &rt->work_lock);
            continue;
        }
        struct timespec ts;
        hku_deadline(&ts, ((long)(next - hkl_now_ms()) + 1) * 1000);
        pthread_cond_timedwait(&rt->work_cond, &rt->work_lock, &ts);
    }
}

/* Ends the jobs a later submission superseded before they were taken: no
 * build, one HK_EVENT_REFUSED each (HK_ERR_SUPERSEDED). No lock held. */
static void report_dropped(hk_runtime *rt, hkl_job *list) {
    while (list) {
        hkl_job *j = list;
        list = j->next;
        hk_report rep = HK_REPORT_INIT;
        snprintf(rep.module, sizeof rep.module, "%s", j->name);
        hku_fail(&rep, HK_ERR_SUPERSEDED,
                 "'%s' from %s: a newer version of it was submitted before this one was "
                 "built: only the newest is built and committed",
                 j->name, j->origin);
        report_times(&rep, j->t_start);
        count(rt, 0, 0, &rep);
        hkl_emit(rt, HK_EVENT_REFUSED, j->name, hk_module_version(rt, j->name), 0, j->origin, &rep);
        hk_report_clear(&rep);
        hkl_job_free(j);
    }
}

/* Builds a submitted job and swaps it in now, unless it is to be staged at
 * a safe point: returns 1 then, and the job is still to be queued. No lock
 * held. */
static int run_job(hk_runtime *rt, hkl_job *j) {
    hk_report rep = HK_REPORT_INIT;
    int err = job_build(rt, j, &rep);
    if (rt->hook)
        rt->hook(rt, HKL_HOOK_BUILT);
    int deferred = 0;
    pthread_mutex_lock(&rt->work_lock);
    int stop = rt->work_stop;
    pthread_mutex_unlock(&rt->work_lock);
    if (stop) {
        /* Destroy began during the build: nothing reaches the driver or
         * the program any more. */
    } else if (err < 0 || (err = superseded(rt, j, "before it was staged", &rep)) < 0) {
        report_times(&rep, j->t_start);
        count(rt, 0, 0, &rep);
        hkl_emit(rt, HK_EVENT_REFUSED, j->name, hk_module_version(rt, j->name), 0, j->origin, &rep);
    } else if (resolve_stage(rt, j->opt.stage, &(int){0}) == HK_STAGE_AT_SAFE_POINT) {
        deferred = 1;
    } else {
        swap_built(rt, j, &rep);
    }
    hk_report_clear(&rep);
    return deferred;
}

/* Queues a built job for the next safe point. A newer build of the same
 * module replaces a pending one (not one a synchronous hk_swap waits for:
 * that one gets its outcome), and goes last, after everything submitted
 * before it. work_lock held (dropped to free the replaced job). */
static void defer_job(hk_runtime *rt, hkl_job *j) {
    hkl_job *stale = NULL;
    for (hkl_job **pp = &rt->pending; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->name, j->name) && !(*pp)->waiter) {
            stale = *pp;
            *pp = stale->next;
            break;
        }
    hkl_job **tail = &rt->pending;
    while (*tail)
        tail = &(*tail)->next;
    j->next = NULL;
    j->deadline = hkl_now_ms() + (rt->opt.safe_point_wait_ms > 0 ? rt->opt.safe_point_wait_ms : 0);
    *tail = j;
    if (stale) {
        pthread_mutex_unlock(&rt->work_lock);
        hkl_job_free(stale);
        pthread_mutex_lock(&rt->work_lock);
    }
}

static void *worker_main(void *arg) {
    /* Named for top -H, gdb and profilers (at most 15 characters). */
    pthread_setname_np(pthread_self(), "hk-worker");
    hk_runtime *rt = arg;
    hkl_relax(rt); /* for the life of this thread */
    pthread_mutex_lock(&rt->work_lock);
    for (;;) {
        wait_for_jobs(rt);
        if (rt->work_stop)
            break;
        if (rt->dropped) {
            hkl_job *list = rt->dropped;
            rt->dropped = NULL;
            rt->busy++;
            pthread_mutex_unlock(&rt->work_lock);
            report_dropped(rt, list);
            pthread_mutex_lock(&rt->work_lock);
            rt->busy--;
            pthread_cond_broadcast(&rt->idle_cond);
            continue;
        }
        if (!rt->jobs)
            continue;
        hkl_job *j = rt->jobs;
        rt->jobs = j->next;
        if (!rt->jobs)
            rt->jobs_tail = NULL;
        rt->busy++;
        pthread_mutex_unlock(&rt->work_lock);
        int deferred = run_job(rt, j);
        pthread_mutex_lock(&rt->work_lock);
        if (deferred) {
            defer_job(rt, j);
        } else {
            pthread_mutex_unlock(&rt->work_lock);
            hkl_job_free(j);
            pthread_mutex_lock(&rt->work_lock);
        }
        rt->busy--;
        pthread_cond_broadcast(&rt->idle_cond);
    }
    /* Destroy stopped waiting for this thread (a build NVRTC would not
     * cut short): the rest of the teardown is this thread's. */
    rt->worker_exited = 1;
    pthread_cond_broadcast(&rt->idle_cond);
    int abandoned = rt->worker_abandoned;
    pthread_mutex_unlock(&rt->work_lock);
    if (abandoned) {
        pthread_detach(pthread_self());
        rt->worker_finish(rt, hkl_now_ms() + rt->opt.destroy_wait_ms);
    }
    return NULL;
}

int hkl_worker_start(hk_runtime *rt, void (*finish)(hk_runtime *rt, double until_ms)) {
    rt->worker_finish = finish;
    if (pthread_create(&rt->worker, NULL, worker_main, rt))
        return HK_ERR_NOMEM;
    rt->worker_started = 1;
    return 0;
}

int hkl_worker_stop(hk_runtime *rt, double until_ms) {
    pthread_mutex_lock(&rt->work_lock);
    rt->work_stop = 1;
    pthread_cond_broadcast(&rt->work_cond);
    while (rt->worker_started && !rt->worker_exited && hkl_now_ms() < until_ms) {
        struct timespec ts;
        hku_deadline(&ts, 10 * 1000);
        pthread_cond_timedwait(&rt->idle_cond, &rt->work_lock, &ts);
    }
    int left = rt->worker_started && !rt->worker_exited;
    rt->worker_abandoned = left;
    pthread_mutex_unlock(&rt->work_lock);
    if (left)
        return HK_ERR_TIMEOUT;
    if (rt->worker_started)
        pthread_join(rt->worker, NULL);
    rt->worker_started = 0;
    return 0;
}

void hkl_worker_drain(hk_runtime *rt) {
    hkl_job *lists[3] = {rt->jobs, rt->pending, rt->dropped};
    for (int i = 0; i < 3; i++)
        while (lists[i]) {
            hkl_job *n = lists[i]->next;
            if (lists[i]->waiter)
                finish_waiter(lists[i]->waiter, HK_ERR_CLOSED, NULL);
            else
                hkl_job_free(lists[i]);
            lists[i] = n;
        }
    rt->jobs = rt->jobs_tail = rt->pending = rt->dropped = NULL;
}

/* Queues a job for the worker; a latest one first moves the queued latest
 * jobs of its module, which it supersedes, to the dropped list. */
static int submit(hk_runtime *rt, const char *name, const void *image, size_t size,
                  const hk_swap_options *opt, int latest) {
    if (!rt)
        return HK_ERR_INVALID;
    hkl_job *j;
    int err = job_new(&j, name, image, size, opt);
    if (err < 0)
        return err;
    j->latest = latest;
    j->t_start = hkl_now_ms();
    pthread_mutex_lock(&rt->work_lock);
    if (rt->work_stop) {
        pthread_mutex_unlock(&rt->work_lock);
        hkl_job_free(j);
        return HK_ERR_CLOSED;
    }
    /* Taken under work_lock: the queue is in submission order. */
    j->seq = atomic_fetch_add(&rt->job_seq, 1) + 1;
    if (latest) {
        hkl_job **drop_tail = &rt->dropped;
        while (*drop_tail)
            drop_tail = &(*drop_tail)->next;
        rt->jobs_tail = NULL;
        for (hkl_job **pp = &rt->jobs; *pp;) {
            hkl_job *q = *pp;
            if (q->latest && !strcmp(q->name, j->name)) {
                *pp = q->next;
                q->next = NULL;
                *drop_tail = q;
                drop_tail = &q->next;
            } else {
                rt->jobs_tail = q;
                pp = &q->next;
            }
        }
    }
    if (rt->jobs_tail)
        rt->jobs_tail->next = j;
    else
        rt->jobs = j;
    rt->jobs_tail = j;
    pthread_cond_signal(&rt->work_cond);
    pthread_mutex_unlock(&rt->work_lock);
    return 0;
}

int hk_submit(hk_runtime *rt, const char *name, const void *image, size_t size,
              const hk_swap_options *opt) {
    return submit(rt, name, image, size, opt, 0);
}

int hkl_submit_latest(hk_runtime *rt, const char *name, const void *image, size_t size,
                      const hk_swap_options *opt) {
    return submit(rt, name, image, size, opt, 1);
}

int hk_safe_point(hk_runtime *rt) {
    if (!rt)
        return HK_ERR_INVALID;
    if (hkl_swap_held(rt))
        return HK_ERR_BUSY; /* from a check callback */
    pthread_mutex_lock(&rt->work_lock);
    rt->safe_points_seen = 1;
    rt->safe_point_thread = pthread_self();
    hkl_job *list = rt->pending;
    rt->pending = NULL;
    pthread_mutex_unlock(&rt->work_lock);
    hkl_reclaim_deferred(rt);
    int committed = 0;
    while (list) {
        hkl_job *j = list;
        list = j->next;
        hk_report rep = HK_REPORT_INIT;
        j->at_safe_point = 1;
        int err = swap_built(rt, j, &rep);
        committed += err == 0;
        if (j->waiter) {
            /* The waiting hk_swap owns the job and takes the report. */
            finish_waiter(j->waiter, err, &rep);
        } else {
            hk_report_clear(&rep);
            hkl_job_free(j);
        }
    }
    return committed;
}

int hk_wait_idle(hk_runtime *rt, int timeout_ms) {
    if (!rt)
        return HK_ERR_INVALID;
    /* From an event on the worker: it would wait for its own job. */
    if (rt->worker_started && pthread_equal(pthread_self(), rt->worker))
        return HK_ERR_BUSY;
    double end = hkl_now_ms() + timeout_ms;
    pthread_mutex_lock(&rt->work_lock);
    while (rt->jobs || rt->dropped || rt->busy) {
        double left = end - hkl_now_ms();
        if (left <= 0) {
            pthread_mutex_unlock(&rt->work_lock);
            return HK_ERR_TIMEOUT;
        }
        struct timespec ts;
        hku_deadline(&ts, (left > 50 ? 50 : (long)left + 1) * 1000);
        pthread_cond_timedwait(&rt->idle_cond, &rt->work_lock, &ts);
    }
    pthread_mutex_unlock(&rt->work_lock);
    return 0;
}

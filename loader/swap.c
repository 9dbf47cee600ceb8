/*
 * The swap transaction: (build, canary ->) stage -> validate -> commit, or
 * roll back.
 *
 * build    ptx/ turns the input into a loadable image, and the canary runs
 *          its declared test launches: both before this file, no lock held
 *          (worker.c). A job reaches hkl_swap_job built.
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
 * stopped running. Swaps of one runtime are serialised by swap_lock. A
 * rollback (hk_rollback) is the same transaction over a job that builds
 * nothing: the module's kept image before its newest.
 *
 * In the code: hkl_swap_job takes swap_lock (and checks for a context
 * reset first, reset.c); swap_locked runs the rest as one function per step
 * (stage, validate, commit, roll_back) over a swap_txn, after
 * version_from_build and adopt_build have made the built artifact a version.
 * The version operations each step uses are version.c's.
 *
 * The driver sections of stage/validate and of commit run with the launch
 * gate closed (gate.h): under continuous launches the driver would make
 * them wait for ever. The check callback runs with the gate open. All of it
 * runs in relaxed stream-capture mode, so another thread's global-mode
 * capture is never invalidated by a swap.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/exit.h"
#include "base/abi.h"
#include "loader/context.h"
#include "loader/expect.h"
#include "loader/fit.h"
#include "loader/gate.h"
#include "loader/graph.h"
#include "loader/job.h"
#include "loader/launch.h"
#include "loader/lkg.h"
#include "loader/log.h"
#include "loader/metrics.h"
#include "loader/reset.h"
#include "loader/swap.h"
#include "loader/version.h"

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
    hkl_image im = {.size = v->art.size,
                    .format = v->art.format,
                    .version = v->number,
                    .release = v->release,
                    .nexpr = v->art.nlowered};
    im.data = malloc(v->art.size);
    im.expr = hku_strv_dup((const char *const *)v->expr, v->art.nlowered);
    im.lowered = hku_strv_dup((const char *const *)v->art.lowered_names, v->art.nlowered);
    if (!im.data || (v->art.nlowered > 0 && (!im.expr || !im.lowered))) {
        hkl_image_clear(&im);
        return HK_ERR_NOMEM;
    }
    memcpy(im.data, v->art.image, v->art.size);
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

/* 1 when old holds exactly the image (and name expressions) job built. */
static int same_image(const hkl_version *old, const hkl_job *job) {
    if (!old || old->art.size != job->art.size || old->art.format != job->art.format ||
        old->art.nlowered != job->opt.nname_expressions ||
        memcmp(old->art.image, job->art.image, old->art.size))
        return 0;
    for (int i = 0; i < old->art.nlowered; i++)
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

/* The end of the build step: a new version of t->m takes the job's
 * artifact over whole (the job keeps none of it), with a copy of the name
 * expressions it was built with. NULL: out of memory. */
static hkl_version *version_from_build(hk_runtime *rt, hkl_module *m, hkl_job *job) {
    hkl_version *v = hkl_version_new(rt, m, m->last_version + 1);
    if (!v)
        return NULL;
    v->release = job->opt.release_version;
    v->art = job->art;
    memset(&job->art, 0, sizeof job->art);
    v->expr = hku_strv_dup((const char *const *)job->name_expressions, job->opt.nname_expressions);
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
    if (v->art.nlowered != nexpr || (v->art.nlowered > 0 && (!v->expr || !v->art.lowered_names))) {
        hku_strv_free(v->expr, nexpr);
        hku_strv_free(v->art.lowered_names, v->art.nlowered);
        v->expr = v->art.lowered_names = NULL;
        v->art.nlowered = 0;
        if (nexpr > 0) {
            hku_fail(t->rep, HK_ERR_NOMEM, "name expressions could not be mapped to kernels");
            return HK_ERR_NOMEM;
        }
    }
    if (t->rep) {
        t->rep->version = v->number;
        snprintf(t->rep->module, sizeof t->rep->module, "%s", t->m->name);
        /* The build may have run on another thread, long before (safe points). */
        t->rep->build_ms = v->art.ms;
        t->rep->cache_hit = v->art.cache_hit;
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
    if (rt->test.hook)
        rt->test.hook(rt, HKL_HOOK_GATED);
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
        /* A program's kernel: every launch configuration it used fits. */
        if (k->expect && (err = hkl_fit_check(rt, t->v, k, t->rep)) < 0)
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
    hkl_lkg_pending(rt, t->m->name, t->job->hash, t->v->number, t->job->opt.release_version);
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
    hkl_expect_keep(rt, t->m, t->job, t->v);
    if (t->old) {
        /* A program that stages at safe points wants no driver work outside
         * them: the old code is unloaded at a later safe point too; with
         * automatic safe points, also after a swap staged at once, unless
         * its caller asked for the driver work now (HK_STAGE_NOW). */
        t->old->unload_at_safe_point = t->job->at_safe_point || (atomic_load(&rt->sp.automatic) &&
                                                                 t->job->opt.stage != HK_STAGE_NOW);
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
        pthread_mutex_lock(&rt->metrics.lock);
        rt->metrics.stats.live_versions++;
        pthread_mutex_unlock(&rt->metrics.lock);
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
static int swap_locked(hk_runtime *rt, hkl_job *job, int rollback, hk_report *rep, uint64_t *oldv) {
    hkl_module *m = module_get_or_create(rt, job->name);
    if (!m)
        return HK_ERR_NOMEM;
    hkl_version *old = atomic_load(&m->current);
    *oldv = old ? old->number : 0;
    int err = swap_needed(m, old, job, rollback, rep);
    if (err)
        return err;
    /* The last-known-good record names the image by its hash, taken only
     * now that it is known to be new (the image already running costs no
     * hash), unless the build's quarantine check or a restored record had
     * it already. */
    if (!job->hashed)
        hkl_lkg_hash(job->art.image, job->art.size, job->hash);
    job->hashed = 1;
    swap_txn t = {.rt = rt, .job = job, .rep = rep, .m = m, .old = old, .t0 = hkl_now_ms()};
    if (!(t.v = version_from_build(rt, m, job)))
        return HK_ERR_NOMEM;
    if ((err = adopt_build(&t)) < 0 || (err = stage(&t)) < 0 || (err = validate(&t)) < 0 ||
        (err = commit(&t)) < 0)
        return roll_back(&t, err);
    return 0;
}

/* Swaps a built job in (never a rollback: hk_rollback runs its own). Takes
 * swap_lock, unless this thread holds it already (a check callback):
 * HK_ERR_BUSY then. */
static int swap_job(hk_runtime *rt, hkl_job *job, hk_report *rep) {
    uint64_t oldv = 0;
    if (hkl_swap_held(rt)) {
        /* From a check callback: this swap would wait for the one running. */
        hku_fail(rep, HK_ERR_BUSY,
                 "'%s': a swap cannot be started from a check callback of the same "
                 "runtime (it would wait for itself); use hk_submit",
                 job->name);
        return HK_ERR_BUSY;
    }
    CUstreamCaptureMode mode = hkl_relax(rt);
    hkl_swap_lock(rt); /* not held by this thread: checked above */
    int reset = hkl_check_reset(rt);
    /* Driver queries such as cuKernelGetParamInfo need a current context;
     * the worker and the network threads have none of their own. */
    int pushed = hkl_ctx_push(rt, 0) == 0;
    int err = swap_locked(rt, job, 0, rep, &oldv);
    if (err == 0) /* recorded in commit order, under swap_lock (memory only) */
        hkl_lkg_committed(rt, atomic_load(&hkl_module_find(rt, job->name)->current), job->hash,
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
    hkl_report_times(rep, job->t_start);
    if (err == 1) {
        hk_log(rt, HK_LOG_DEBUG, "engine", "%s from %s: v%llu runs this image already", job->name,
               job->origin ? job->origin : "api", (unsigned long long)oldv);
        return 0; /* unchanged: no new version, no event */
    }
    hkl_count_swap(rt, err == 0, 0, rep);
    hkl_emit(rt, err ? HK_EVENT_REFUSED : HK_EVENT_COMMITTED, job->name, oldv,
             err ? 0 : rep->version, job->origin, rep);
    return err;
}

/* The driver work of a swap is a section of the exit guard (base/exit.h):
 * once the process exits, nothing is staged. */
int hkl_swap_job(hk_runtime *rt, hkl_job *job, hk_report *rep) {
    if (!hkb_exit_enter())
        return hku_fail(rep, HK_ERR_CLOSED, "'%s': the process is exiting: nothing is staged",
                        job->name);
    int err = swap_job(rt, job, rep);
    hkb_exit_leave();
    return err;
}

/* ---- rollback ----------------------------------------------------------- */

/* A job that builds nothing: the kept image prev, with its name expressions
 * and globals, ready for the swap transaction. *out is set even when this
 * fails (HK_ERR_NOMEM), for the caller to free. */
static int rollback_job(hk_runtime *rt, const char *name, const hkl_image *prev, hkl_job **out) {
    hkl_job *j = *out = calloc(1, sizeof *j);
    if (!j)
        return HK_ERR_NOMEM;
    snprintf(j->name, sizeof j->name, "%s", name);
    hk_swap_options_init(&j->opt);
    j->seq = atomic_fetch_add(&rt->work.job_seq, 1) + 1; /* later submissions may override it */
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
    int pushed = hkl_ctx_push(rt, 0) == 0;
    int err = swap_locked(rt, j, 1, r, oldv);
    if (err == 0)
        hkl_lkg_committed(rt, atomic_load(&m->current), j->hash, 0);
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
    hkl_report_times(r, t_start);
    if (j) {
        hkl_count_swap(rt, err == 0, 1, r);
        hkl_emit(rt, err ? HK_EVENT_REFUSED : HK_EVENT_ROLLED_BACK, name, oldv,
                 err ? 0 : r->version, "rollback", r);
    }
    hkl_job_free(j);
    hk_report_clear(&local);
    return err;
}

int hk_rollback(hk_runtime *rt, const char *name, hk_report *rep) {
    hk_report full;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    int err = rollback_call(rt, name, 0, 0, rep ? &full : NULL);
    hkb_report_out(rep, &full);
    return err;
}

int hk_rollback_release(hk_runtime *rt, const char *name, uint64_t release_version,
                        hk_report *rep) {
    hk_report full;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    int err = rollback_call(rt, name, 1, release_version, rep ? &full : NULL);
    hkb_report_out(rep, &full);
    return err;
}

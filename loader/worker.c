/*
 * Where swaps come in and how they reach the transaction: hk_swap (on the
 * caller's thread), hk_submit and hkl_submit_latest (queued for the worker
 * thread), and hk_safe_point (staging what waits for one).
 *
 * Each job is built first (job_build, no lock held): ptx/ turns its input
 * into a loadable image (NVRTC, nvJitLink, the compile cache), on the
 * caller's thread or the worker, never stalling launches; a job superseded
 * meanwhile, or whose image is quarantined, stops there; then its declared
 * test launches run in the canary helper process (canary.c, canary/), on
 * the same thread, no lock held. The built job then goes to the
 * transaction (hkl_swap_job, swap.c) at once, or, with
 * HK_STAGE_AT_SAFE_POINT, at the next hk_safe_point, which the application
 * calls when its GPU work is idle (uploading code waits for the context's
 * in-flight work and stalls launching threads meanwhile).
 *
 * Threads and locks: the worker thread takes jobs from rt->work.jobs in
 * submission order and builds one at a time; work_lock guards the queues
 * (jobs, dropped, pending) and the worker's state, and is never held across
 * a build or a swap. A synchronous hk_swap waiting for a safe point waits on
 * its own hkl_waiter; the safe point that stages its job signals it. A job
 * not taken by a safe point within safe_point_wait_ms is staged by its
 * waiter, or, without one, by the worker.
 *
 * Automatic safe points (hkl_auto_safe_points): a source that sees the
 * program's GPU work idle (the <<<>>> interposition, at the program's own
 * synchronisations) calls hkl_idle_point, a safe point that does not make
 * the program one that calls hk_safe_point. sp.wanted tells that source,
 * in one load, whether anything waits for one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/exit.h"
#include "base/abi.h"
#include "loader/canary.h"
#include "loader/context.h"
#include "loader/expect.h"
#include "loader/job.h"
#include "loader/lkg.h"
#include "loader/log.h"
#include "loader/metrics.h"
#include "loader/reclaim.h"
#include "loader/safepoint.h"
#include "loader/source.h"
#include "loader/swap.h"
#include "loader/worker.h"

int hkl_worker_init(hk_runtime *rt) {
    hkl_worker *w = &rt->work;
    atomic_init(&w->job_seq, 0);
    if (pthread_mutex_init(&w->lock, NULL))
        return HK_ERR_NOMEM;
    if (hku_cond_init(&w->cond))
        goto no_cond;
    if (hku_cond_init(&w->idle))
        goto no_idle;
    return 0;
no_idle:
    pthread_cond_destroy(&w->cond);
no_cond:
    pthread_mutex_destroy(&w->lock);
    return HK_ERR_NOMEM;
}

void hkl_worker_finish(hk_runtime *rt) {
    pthread_mutex_destroy(&rt->work.lock);
    pthread_cond_destroy(&rt->work.cond);
    pthread_cond_destroy(&rt->work.idle);
}

/* Nothing to take apart: its fields are the worker's lock's. */
int hkl_safe_points_init(hk_runtime *rt) {
    atomic_init(&rt->sp.wanted, 0);
    atomic_init(&rt->sp.automatic, 0);
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
    pthread_mutex_lock(&rt->work.lock);
    for (const hkl_job *q = rt->work.jobs; q; q = q->next) {
        if (q->latest && q->seq > j->seq && !strcmp(q->name, j->name))
            by = q->seq;
    }
    pthread_mutex_unlock(&rt->work.lock);
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
        .trap_guard = hkl_canary_wanted(rt, j),
    };
    char why[512] = "";
    int err = hkp_build(j->data, j->size, j->opt.format, &bo, &j->art, why, sizeof why);
    if (rt->test.hook)
        rt->test.hook(rt, HKL_HOOK_COMPILED);
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
    if ((err = hkl_lkg_check(rt, j->name, j->art.image, j->art.size, j->hash, &j->hashed, rep)) < 0)
        return err;
    /* Between build and stage: the version's test launches run in the
     * canary process, on this thread, with no lock held. */
    return hkl_canary_check(rt, j, rep);
}

/* What AUTO means for a swap requested on this thread now: at a safe point
 * once the program calls hk_safe_point (unless from its thread), or with
 * automatic safe points (unless from a thread that brings them). */
static hk_stage_mode resolve_stage(hk_runtime *rt, hk_stage_mode want, int *on_sp_thread) {
    pthread_mutex_lock(&rt->work.lock);
    int seen = rt->sp.seen;
    *on_sp_thread = seen && pthread_equal(rt->sp.thread, pthread_self());
    int (*own)(void) = rt->sp.own_thread;
    pthread_mutex_unlock(&rt->work.lock);
    if (want != HK_STAGE_AUTO)
        return want;
    if (seen)
        return *on_sp_thread ? HK_STAGE_NOW : HK_STAGE_AT_SAFE_POINT;
    return own && !own() ? HK_STAGE_AT_SAFE_POINT : HK_STAGE_NOW;
}

/* Keeps sp.wanted's bit for the pending list right. work_lock held. */
static void pending_changed(hk_runtime *rt) {
    hkl_sp_mark(rt, HKL_SP_JOBS, rt->work.pending != NULL);
}

static void log_no_safe_point(hk_runtime *rt, const hkl_job *j) {
    hk_log(rt, HK_LOG_INFO, "engine",
           "'%s': no safe point within %d ms (safe_point_wait_ms): staged now, which waits for "
           "the GPU work in flight",
           j->name, rt->opt.safe_point_wait_ms);
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
    pthread_mutex_lock(&rt->work.lock);
    hkl_job **pp = &rt->work.pending;
    while (*pp)
        pp = &(*pp)->next;
    *pp = j;
    pending_changed(rt);
    pthread_mutex_unlock(&rt->work.lock);

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
        pthread_mutex_lock(&rt->work.lock);
        for (pp = &rt->work.pending; *pp; pp = &(*pp)->next)
            if (*pp == j) {
                *pp = j->next;
                taken = 1;
                break;
            }
        pending_changed(rt);
        pthread_mutex_unlock(&rt->work.lock);
        if (taken) {
            j->waiter = NULL;
            log_no_safe_point(rt, j);
            err = hkl_swap_job(rt, j, r);
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
    int err = hkl_job_new(&j, name, image, size, opt);
    char why[160];
    if (err < 0 && hku_name_check(name, why, sizeof why) < 0) {
        hku_fail(rep, err, "%s", why);
        return err;
    }
    if (err < 0) {
        hku_fail(rep, err, "bad arguments (non-empty image, named headers)");
        return err;
    }
    j->seq = atomic_fetch_add(&rt->work.job_seq, 1) + 1;
    j->t_start = t_start;
    hk_report local = HK_REPORT_INIT;
    hk_report *r = rep ? rep : &local;
    err = job_build(rt, j, r);
    if (err < 0) {
        hkl_report_times(r, t_start);
        hkl_count_swap(rt, 0, 0, r);
        hkl_emit(rt, HK_EVENT_REFUSED, j->name, hk_module_version(rt, j->name), 0, j->origin, r);
    } else if (stage == HK_STAGE_AT_SAFE_POINT) {
        err = swap_at_safe_point(rt, j, r);
    } else {
        err = hkl_swap_job(rt, j, r);
    }
    hkl_job_free(j);
    hk_report_clear(&local);
    hkl_late_submit(rt);
    return err;
}

int hk_swap(hk_runtime *rt, const char *name, const void *image, size_t size,
            const hk_swap_options *opt, hk_report *rep) {
    hk_report full;
    hk_swap_options o;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    int err = HK_ERR_INVALID;
    if (hkb_swap_options_in(&o, opt) < 0)
        hku_fail(&full, err, "hk_swap_options.size %zu is below the first layout (%zu)",
                 hkb_size_of(opt), (size_t)HKB_SWAP_OPTIONS_SIZE0);
    else
        err = swap_call(rt, name, image, size, &o, rep ? &full : NULL);
    hkb_report_out(rep, &full);
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
    for (hkl_job **pp = &rt->work.pending; *pp;) {
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
    pending_changed(rt);
    return next;
}

/* On the worker, with no lock held: once the process exits (base/exit.h)
 * nothing of a job may reach the driver, the log or the program's
 * callbacks any more, so the thread stays here until the process ends. */
static void park_if_exiting(void) {
    if (hkb_exiting())
        hkb_exit_park();
}

/* Pending jobs whose safe point never came are staged by the worker: a
 * program that stopped calling hk_safe_point still gets its updates, one
 * safe_point_wait_ms late. */
static void stage_expired(hk_runtime *rt, hkl_job *list) {
    while (list) {
        park_if_exiting();
        hkl_job *j = list;
        list = j->next;
        hk_report rep = HK_REPORT_INIT;
        log_no_safe_point(rt, j);
        hkl_swap_job(rt, j, &rep);
        hk_report_clear(&rep);
        hkl_job_free(j);
    }
    hkl_late_submit(rt);
}

/* Waits until there is a job to build or the worker is told to stop,
 * staging meanwhile the pending jobs whose safe point never came. work_lock
 * held (dropped while staging and waiting). */
static void wait_for_jobs(hk_runtime *rt) {
    while (!rt->work.jobs && !rt->work.dropped && !rt->work.stop) {
        hkl_job *expired = NULL;
        double next = take_expired(rt, &expired);
        if (expired) {
            rt->work.busy++;
            pthread_mutex_unlock(&rt->work.lock);
            stage_expired(rt, expired);
            pthread_mutex_lock(&rt->work.lock);
            rt->work.busy--;
            pthread_cond_broadcast(&rt->work.idle);
            continue;
        }
        if (!next) {
            pthread_cond_wait(&rt->work.cond, &rt->work.lock);
            continue;
        }
        struct timespec ts;
        hku_deadline(&ts, ((long)(next - hkl_now_ms()) + 1) * 1000);
        pthread_cond_timedwait(&rt->work.cond, &rt->work.lock, &ts);
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
        hkl_report_times(&rep, j->t_start);
        hkl_count_swap(rt, 0, 0, &rep);
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
    park_if_exiting();
    int err = job_build(rt, j, &rep);
    park_if_exiting(); /* a build that ended during the exit says nothing */
    if (rt->test.hook)
        rt->test.hook(rt, HKL_HOOK_BUILT);
    int deferred = 0;
    pthread_mutex_lock(&rt->work.lock);
    int stop = rt->work.stop;
    pthread_mutex_unlock(&rt->work.lock);
    if (stop) {
        /* Destroy began during the build: nothing reaches the driver or
         * the program any more. */
    } else if (err < 0 || (err = superseded(rt, j, "before it was staged", &rep)) < 0) {
        hkl_report_times(&rep, j->t_start);
        hkl_count_swap(rt, 0, 0, &rep);
        hkl_emit(rt, HK_EVENT_REFUSED, j->name, hk_module_version(rt, j->name), 0, j->origin, &rep);
    } else if (resolve_stage(rt, j->opt.stage, &(int){0}) == HK_STAGE_AT_SAFE_POINT) {
        deferred = 1;
    } else {
        hkl_swap_job(rt, j, &rep);
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
    for (hkl_job **pp = &rt->work.pending; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->name, j->name) && !(*pp)->waiter) {
            stale = *pp;
            *pp = stale->next;
            break;
        }
    hkl_job **tail = &rt->work.pending;
    while (*tail)
        tail = &(*tail)->next;
    j->next = NULL;
    j->deadline = hkl_now_ms() + (rt->opt.safe_point_wait_ms > 0 ? rt->opt.safe_point_wait_ms : 0);
    *tail = j;
    pending_changed(rt);
    if (stale) {
        pthread_mutex_unlock(&rt->work.lock);
        hkl_job_free(stale);
        pthread_mutex_lock(&rt->work.lock);
    }
}

static void *worker_main(void *arg) {
    /* Named for top -H, gdb and profilers (at most 15 characters). */
    pthread_setname_np(pthread_self(), "hk-worker");
    hk_runtime *rt = arg;
    hkl_relax(rt); /* for the life of this thread */
    pthread_mutex_lock(&rt->work.lock);
    for (;;) {
        wait_for_jobs(rt);
        if (rt->work.stop)
            break;
        if (rt->work.dropped) {
            hkl_job *list = rt->work.dropped;
            rt->work.dropped = NULL;
            rt->work.busy++;
            pthread_mutex_unlock(&rt->work.lock);
            report_dropped(rt, list);
            pthread_mutex_lock(&rt->work.lock);
            rt->work.busy--;
            pthread_cond_broadcast(&rt->work.idle);
            continue;
        }
        if (!rt->work.jobs)
            continue;
        hkl_job *j = rt->work.jobs;
        rt->work.jobs = j->next;
        if (!rt->work.jobs)
            rt->work.jobs_tail = NULL;
        rt->work.busy++;
        pthread_mutex_unlock(&rt->work.lock);
        int deferred = run_job(rt, j);
        pthread_mutex_lock(&rt->work.lock);
        if (deferred) {
            defer_job(rt, j);
        } else {
            pthread_mutex_unlock(&rt->work.lock);
            hkl_job_free(j);
            hkl_late_submit(rt);
            pthread_mutex_lock(&rt->work.lock);
        }
        rt->work.busy--;
        pthread_cond_broadcast(&rt->work.idle);
    }
    /* Destroy stopped waiting for this thread (a build NVRTC would not
     * cut short): the rest of the teardown is this thread's. */
    rt->work.exited = 1;
    pthread_cond_broadcast(&rt->work.idle);
    int abandoned = rt->work.abandoned;
    pthread_mutex_unlock(&rt->work.lock);
    if (abandoned) {
        pthread_detach(pthread_self());
        rt->work.finish_rt(rt, hkl_now_ms() + rt->opt.destroy_wait_ms);
    }
    return NULL;
}

int hkl_worker_start(hk_runtime *rt, void (*finish)(hk_runtime *rt, double until_ms)) {
    rt->work.finish_rt = finish;
    if (pthread_create(&rt->work.thread, NULL, worker_main, rt))
        return HK_ERR_NOMEM;
    rt->work.started = 1;
    return 0;
}

int hkl_worker_stop(hk_runtime *rt, double until_ms) {
    pthread_mutex_lock(&rt->work.lock);
    rt->work.stop = 1;
    pthread_cond_broadcast(&rt->work.cond);
    while (rt->work.started && !rt->work.exited && hkl_now_ms() < until_ms) {
        struct timespec ts;
        hku_deadline(&ts, 10 * 1000);
        pthread_cond_timedwait(&rt->work.idle, &rt->work.lock, &ts);
    }
    int left = rt->work.started && !rt->work.exited;
    rt->work.abandoned = left;
    pthread_mutex_unlock(&rt->work.lock);
    if (left)
        return HK_ERR_TIMEOUT;
    if (rt->work.started)
        pthread_join(rt->work.thread, NULL);
    rt->work.started = 0;
    return 0;
}

void hkl_worker_drain(hk_runtime *rt) {
    hkl_job *lists[3] = {rt->work.jobs, rt->work.pending, rt->work.dropped};
    for (int i = 0; i < 3; i++)
        while (lists[i]) {
            hkl_job *n = lists[i]->next;
            if (lists[i]->waiter)
                finish_waiter(lists[i]->waiter, HK_ERR_CLOSED, NULL);
            else
                hkl_job_free(lists[i]);
            lists[i] = n;
        }
    rt->work.jobs = rt->work.jobs_tail = rt->work.pending = rt->work.dropped = NULL;
    pending_changed(rt);
}

/* Queues a job for the worker; a latest one first moves the queued latest
 * jobs of its module, which it supersedes, to the dropped list. */
/* seq 0: a new submission number. */
static int submit_seq(hk_runtime *rt, const char *name, const void *image, size_t size,
                      const hk_swap_options *opt, int latest, uint64_t seq) {
    if (!rt)
        return HK_ERR_INVALID;
    hkl_job *j;
    int err = hkl_job_new(&j, name, image, size, opt);
    if (err < 0)
        return err;
    j->latest = latest;
    j->t_start = hkl_now_ms();
    pthread_mutex_lock(&rt->work.lock);
    if (rt->work.stop) {
        pthread_mutex_unlock(&rt->work.lock);
        hkl_job_free(j);
        return HK_ERR_CLOSED;
    }
    /* Taken under work_lock: the queue is in submission order. */
    j->seq = seq ? seq : atomic_fetch_add(&rt->work.job_seq, 1) + 1;
    if (latest) {
        hkl_job **drop_tail = &rt->work.dropped;
        while (*drop_tail)
            drop_tail = &(*drop_tail)->next;
        rt->work.jobs_tail = NULL;
        for (hkl_job **pp = &rt->work.jobs; *pp;) {
            hkl_job *q = *pp;
            if (q->latest && !strcmp(q->name, j->name)) {
                *pp = q->next;
                q->next = NULL;
                *drop_tail = q;
                drop_tail = &q->next;
            } else {
                rt->work.jobs_tail = q;
                pp = &q->next;
            }
        }
    }
    if (rt->work.jobs_tail)
        rt->work.jobs_tail->next = j;
    else
        rt->work.jobs = j;
    rt->work.jobs_tail = j;
    pthread_cond_signal(&rt->work.cond);
    pthread_mutex_unlock(&rt->work.lock);
    return 0;
}

static int submit(hk_runtime *rt, const char *name, const void *image, size_t size,
                  const hk_swap_options *opt, int latest) {
    return submit_seq(rt, name, image, size, opt, latest, 0);
}

void hkl_late_submit(hk_runtime *rt) {
    hkl_late l;
    while (rt && hkl_expect_take_late(rt, &l) == 1) {
        hk_swap_options o;
        hk_swap_options_init(&o);
        o.format = HK_FORMAT_CUDA_C;
        o.nvrtc_options = (const char *const *)l.opts;
        o.nnvrtc_options = l.nopts;
        o.name_expressions = (const char *const *)l.exprs;
        o.nname_expressions = l.nexprs;
        o.source_name = l.source_name;
        o.headers = l.headers;
        o.nheaders = l.nheaders;
        o.origin = "template instance";
        int err = submit_seq(rt, l.module, l.src, l.len, &o, 0, l.seq);
        hk_log(rt, err < 0 ? HK_LOG_WARN : HK_LOG_INFO, "engine",
               "module '%s' %s again for the program's template instances first launched after "
               "its build%s%s",
               l.module, err < 0 ? "not built" : "built", err < 0 ? ": " : "",
               err < 0 ? hk_strerror(err) : "");
        hkl_late_free(&l);
    }
}

int hk_submit(hk_runtime *rt, const char *name, const void *image, size_t size,
              const hk_swap_options *opt) {
    return submit(rt, name, image, size, opt, 0);
}

int hkl_submit_latest(hk_runtime *rt, const char *name, const void *image, size_t size,
                      const hk_swap_options *opt) {
    return submit(rt, name, image, size, opt, 1);
}

/* hk_safe_point, called by the program (by_program: later AUTO swaps wait
 * for its safe points) or for it (hkl_idle_point). */
static int safe_point(hk_runtime *rt, int by_program) {
    if (hkl_swap_held(rt))
        return HK_ERR_BUSY; /* from a check callback */
    pthread_mutex_lock(&rt->work.lock);
    if (by_program) {
        rt->sp.seen = 1;
        rt->sp.thread = pthread_self();
    }
    hkl_job *list = rt->work.pending;
    rt->work.pending = NULL;
    pending_changed(rt);
    pthread_mutex_unlock(&rt->work.lock);
    double t0 = hkl_now_ms();
    hkl_reclaim_deferred(rt);
    double t1 = hkl_now_ms();
    int committed = 0;
    while (list) {
        hkl_job *j = list;
        list = j->next;
        hk_report rep = HK_REPORT_INIT;
        j->at_safe_point = 1;
        int err = hkl_swap_job(rt, j, &rep);
        committed += err == 0;
        hk_log(rt, HK_LOG_DEBUG, "engine",
               "'%s' at a safe point: %s; stage %.3f ms, commit %.3f ms (unloads before it "
               "%.3f ms)",
               j->name, err ? hk_strerror(err) : "committed", rep.stage_ms, rep.commit_ms, t1 - t0);
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

int hk_safe_point(hk_runtime *rt) {
    return rt ? safe_point(rt, 1) : HK_ERR_INVALID;
}

int hkl_idle_point(hk_runtime *rt) {
    return safe_point(rt, 0);
}

int hkl_safe_point_wanted(hk_runtime *rt) {
    return atomic_load_explicit(&rt->sp.wanted, memory_order_relaxed) != 0;
}

void hkl_auto_safe_points(hk_runtime *rt, int (*own_thread)(void)) {
    pthread_mutex_lock(&rt->work.lock);
    rt->sp.own_thread = own_thread;
    atomic_store(&rt->sp.automatic, 1);
    pthread_mutex_unlock(&rt->work.lock);
}

int hk_wait_idle(hk_runtime *rt, int timeout_ms) {
    if (!rt)
        return HK_ERR_INVALID;
    /* From an event on the worker: it would wait for its own job. */
    if (rt->work.started && pthread_equal(pthread_self(), rt->work.thread))
        return HK_ERR_BUSY;
    double end = hkl_now_ms() + timeout_ms;
    pthread_mutex_lock(&rt->work.lock);
    while (rt->work.jobs || rt->work.dropped || rt->work.busy) {
        double left = end - hkl_now_ms();
        if (left <= 0) {
            pthread_mutex_unlock(&rt->work.lock);
            return HK_ERR_TIMEOUT;
        }
        struct timespec ts;
        hku_deadline(&ts, (left > 50 ? 50 : (long)left + 1) * 1000);
        pthread_cond_timedwait(&rt->work.idle, &rt->work.lock, &ts);
    }
    pthread_mutex_unlock(&rt->work.lock);
    return 0;
}

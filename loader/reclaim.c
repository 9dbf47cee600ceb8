/*
 * Reclamation: an old version's code is unloaded only when no host thread can
 * still launch it and the GPU has finished the work that used it.
 *
 * Host side, epoch-based. Each launching thread owns a slot (gate.c); on
 * entering a launch it stores the global epoch into it (seq_cst, so the store
 * is ordered before its load of `current`), and zero on leaving. A commit publishes the
 * new version and then retires the old one with retire_epoch = ++epoch. Any
 * thread that could have read the old pointer announced an epoch below
 * retire_epoch before reading it; any later thread reads the new pointer. So
 * once no slot holds a non-zero epoch below retire_epoch, and no pin holds the
 * version, no host thread can reach it.
 *
 * GPU side. Launches already queued may still run the old code. Measured on
 * the H200 (bench/bench_capture.c): cuLibraryUnload of a library whose kernel
 * is still queued behind a 200 ms kernel returns at once, and the queued
 * kernel runs correctly afterwards: the driver keeps code alive for the work
 * that uses it. So libraries are unloaded without synchronising anything.
 * That matters: cuCtxSynchronize, even in relaxed capture mode, fails and
 * invalidates any global-mode capture another thread has in progress, and it
 * waits for every kernel of the context, persistent ones included. Modules
 * (HK_LOADER_MODULE) are unloaded only after the context is synchronised on
 * this thread; while the driver refuses that (a capture), they wait.
 * Nothing else ever waits for this thread (destroy waits a bounded time, then
 * leaves the thread to finish and free the runtime), so a version that cannot
 * be reclaimed yet only stays loaded, and the stats show it. Versions replaced
 * at a safe point wait in unload_ready, and the safe point only unloads; one
 * that no safe point took within safe_point_wait_ms is unloaded here.
 *
 * This thread runs in relaxed stream-capture mode: with it, cuLibraryUnload
 * leaves another thread's global-mode capture intact (measured; in global
 * mode it invalidates it). An unload that fails is retried at the next pass
 * and counted only once it succeeds. Unloads take the driver's lock for
 * writing, so they run with the launch gate closed; measured under continuous
 * launches, an unload also waits for work in flight, so unloads are batched:
 * after one, the next waits unload_gap_ms unless hk_reclaim_wait is waiting.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/exit.h"
#include "loader/context.h"
#include "loader/gate.h"
#include "loader/lkg.h"
#include "loader/log.h"
#include "loader/reclaim.h"
#include "loader/reset.h"
#include "loader/safepoint.h"
#include "loader/version.h"

int hkl_reclaim_init(hk_runtime *rt) {
    hkl_reclaimer *r = &rt->rec;
    r->pin_poll_ms = 50;
    r->unload_gap_ms = 20;
    if (pthread_mutex_init(&r->lock, NULL))
        return HK_ERR_NOMEM;
    if (hku_cond_init(&r->cond))
        goto no_cond;
    if (hku_cond_init(&r->done))
        goto no_done;
    return 0;
no_done:
    pthread_cond_destroy(&r->cond);
no_cond:
    pthread_mutex_destroy(&r->lock);
    return HK_ERR_NOMEM;
}

void hkl_reclaim_finish(hk_runtime *rt) {
    pthread_mutex_destroy(&rt->rec.lock);
    pthread_cond_destroy(&rt->rec.cond);
    pthread_cond_destroy(&rt->rec.done);
}

/* 1 when no host thread can still reach v. */
static int grace_over(hk_runtime *rt, const hkl_version *v) {
    for (hkl_tslot *s = atomic_load(&rt->gate.slots); s; s = s->next) {
        uint64_t a = atomic_load(&s->active);
        if (a && a < v->retire_epoch)
            return 0;
    }
    return atomic_load(&v->pins) == 0;
}

static void count_reclaimed(hk_runtime *rt, int n) {
    if (!n)
        return;
    pthread_mutex_lock(&rt->metrics.lock);
    rt->metrics.stats.reclaimed += (uint64_t)n;
    rt->metrics.stats.live_versions -= (uint64_t)n;
    pthread_mutex_unlock(&rt->metrics.lock);
}

/* Finishes the GPU work queued before now, which includes every launch of
 * the versions about to go. The contexts are read now since reset recovery
 * may replace them; a context that has gone makes its synchronise fail, which
 * is harmless here (nothing runs in it). Returns 0, or HK_ERR_BUSY when the
 * driver refused to synchronise because of a stream capture: then nothing
 * may be unloaded yet. Reclaim thread only. */
static int sync_contexts(hk_runtime *rt) {
    if (rt->test.hook)
        rt->test.hook(rt, HKL_HOOK_PASS_SYNC);
    if (rt->opt.loader == HK_LOADER_LIBRARY)
        return 0; /* see the top of this file */
    for (int i = 0; i < rt->ndev; i++) {
        CUresult r = rt->drv->CtxSynchronize(hkl_ctx(rt, i));
        if (hkl_lkg_sticky((int)r))
            hkl_lkg_lost(rt, (int)r, "a context synchronise"); /* once; no lock held */
        if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
            r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
            return HK_ERR_BUSY;
    }
    return 0;
}

/* Unloads and frees the versions of `list` (their GPU work is finished),
 * each with the launch gate closed on its own: a launcher is never held for
 * more than one version's unload, however many versions a pass gathered (one
 * closure for a list of 300 held launchers for 13 ms on the H200). One whose
 * unload failed (a capture in progress, a busy driver) goes back to the
 * retired list to be tried again. Returns how many were freed. */
static int unload_list(hk_runtime *rt, hkl_version *list, int final) {
    if (!list)
        return 0;
    /* Once destroy has begun, no callback is called from here (log.c):
     * destroy may return before this thread is done. */
    int n = 0;
    hkl_version *failed = NULL, *gone = NULL;
    while (list) {
        hkl_version *v = list;
        list = v->next;
        hkl_gate_close(rt, final ? NULL : "unloading a replaced version");
        CUresult r = hkl_unload_version(rt, v);
        hkl_gate_open(rt);
        if (r != CUDA_SUCCESS && !final) {
            v->next = failed;
            failed = v;
            continue;
        }
        v->next = gone;
        gone = v;
        n++;
    }
    /* Events after the gate opened: a callback may launch. */
    while (gone) {
        hkl_version *v = gone;
        gone = v->next;
        if (!final && !v->dead)
            hkl_emit(rt, HK_EVENT_RECLAIMED, v->mod->name, v->number, 0, "reclaim", NULL);
        hkl_version_free(v);
    }
    count_reclaimed(rt, n);
    pthread_mutex_lock(&rt->rec.lock);
    rt->rec.nretired -= n;
    while (failed) {
        hkl_version *v = failed;
        failed = v->next;
        v->next = rt->rec.retired;
        rt->rec.retired = v;
    }
    pthread_cond_broadcast(&rt->rec.done);
    pthread_mutex_unlock(&rt->rec.lock);
    return n;
}

/* Takes the versions of unload_ready whose safe point is overdue
 * (sp_deadline passed): their GPU work was seen finished when they went
 * there, so they are unloaded at once. rec_lock held. */
static hkl_version *take_late(hk_runtime *rt) {
    double now = hkl_now_ms();
    hkl_version *late = NULL;
    for (hkl_version **pp = &rt->rec.unload_ready; *pp;) {
        hkl_version *v = *pp;
        if (v->sp_deadline <= now) {
            *pp = v->next;
            v->next = late;
            late = v;
        } else {
            pp = &v->next;
        }
    }
    hkl_sp_mark(rt, HKL_SP_UNLOADS, rt->rec.unload_ready != NULL);
    return late;
}

/* One pass: unloads what is ready, hands what waits for a safe point to
 * unload_ready (after its GPU work finished), puts the rest back. Returns 1
 * while versions still wait for a launch, 2 while they wait only for pins, 3
 * while a stream capture keeps the driver from synchronising. rec_lock not
 * held. */
static int reclaim_pass(hk_runtime *rt, int final, int *unloaded) {
    pthread_mutex_lock(&rt->rec.lock);
    rt->rec.kick = 0;
    hkl_version *list = rt->rec.retired;
    rt->rec.retired = NULL;
    hkl_version *late = final ? NULL : take_late(rt);
    if (final) {
        /* Destroy: everything goes, deferred versions included. */
        while (rt->rec.unload_ready) {
            hkl_version *v = rt->rec.unload_ready;
            rt->rec.unload_ready = v->next;
            v->next = list;
            list = v;
        }
        hkl_sp_mark(rt, HKL_SP_UNLOADS, 0);
    }
    pthread_mutex_unlock(&rt->rec.lock);
    hkl_version *ready = NULL, *keep = NULL, *defer = NULL;
    /* One reading of the pins decides both whether the fence is paid and
     * which versions may go: a pin released after this reading waits for the
     * next pass (and its fence). Pinned versions are not candidates, and the
     * fence (an interrupt on every CPU running one of the program's threads)
     * is paid only when some version could go. */
    int candidates = 0, pinned_only = 1, refused = 0;
    for (hkl_version *v = list; v; v = v->next)
        candidates += v->candidate = final || atomic_load(&v->pins) == 0;
    if (rt->test.hook && list)
        rt->test.hook(rt, HKL_HOOK_PASS_SNAPSHOT);
    if (candidates && !final) {
        hkl_heavy_fence(rt);
        pthread_mutex_lock(&rt->rec.lock);
        rt->test.fences++;
        pthread_mutex_unlock(&rt->rec.lock);
    }
    while (list) {
        hkl_version *v = list;
        list = v->next;
        hkl_version **to = &keep;
        if (final)
            to = &ready;
        else if (v->candidate && grace_over(rt, v))
            to = v->unload_at_safe_point ? &defer : &ready;
        if (to == &keep && v->candidate)
            pinned_only = 0;
        v->next = *to;
        *to = v;
    }
    if ((ready || defer) && sync_contexts(rt) < 0 && !final) {
        /* Not known to be finished on the GPU: try again next pass. */
        while (ready) {
            hkl_version *v = ready;
            ready = v->next;
            v->next = keep;
            keep = v;
        }
        while (defer) {
            hkl_version *v = defer;
            defer = v->next;
            v->next = keep;
            keep = v;
        }
        refused = 1;
    }
    *unloaded = unload_list(rt, ready, final);
    if (late) {
        hk_log(rt, HK_LOG_INFO, "reclaim",
               "'%s': a replaced version waited %d ms (safe_point_wait_ms) for a safe point: "
               "unloaded now, which waits for the GPU work in flight",
               late->mod->name, rt->opt.safe_point_wait_ms);
        *unloaded += unload_list(rt, late, 0);
    }
    pthread_mutex_lock(&rt->rec.lock);
    while (keep) {
        hkl_version *v = keep;
        keep = v->next;
        v->next = rt->rec.retired;
        rt->rec.retired = v;
    }
    while (defer) {
        hkl_version *v = defer;
        defer = v->next;
        v->sp_deadline =
            hkl_now_ms() + (rt->opt.safe_point_wait_ms > 0 ? rt->opt.safe_point_wait_ms : 0);
        v->next = rt->rec.unload_ready;
        rt->rec.unload_ready = v;
    }
    hkl_sp_mark(rt, HKL_SP_UNLOADS, rt->rec.unload_ready != NULL);
    int left = rt->rec.retired == NULL ? 0 : refused ? 3 : pinned_only ? 2 : 1;
    pthread_cond_broadcast(&rt->rec.done);
    pthread_mutex_unlock(&rt->rec.lock);
    return left;
}

/* From hk_safe_point: unloads the versions whose GPU work the reclaim thread
 * has already seen finished. No synchronise here: a safe point never waits
 * for the GPU on hotkern's account. */
void hkl_reclaim_deferred(hk_runtime *rt) {
    pthread_mutex_lock(&rt->rec.lock);
    hkl_version *list = rt->rec.unload_ready;
    rt->rec.unload_ready = NULL;
    hkl_sp_mark(rt, HKL_SP_UNLOADS, 0);
    pthread_mutex_unlock(&rt->rec.lock);
    if (!list)
        return;
    CUstreamCaptureMode m = hkl_relax(rt);
    unload_list(rt, list, 0);
    hkl_unrelax(rt, m);
}

static void timed_wait(pthread_cond_t *c, pthread_mutex_t *m, long ms) {
    struct timespec ts;
    hku_deadline(&ts, ms * 1000);
    pthread_cond_timedwait(c, m, &ts);
}

/*
 * The thread also checks for a context reset now and then (and at once when a
 * launch failed as after one), so applications that do not swap still hear of
 * it, and recovery never runs on a launching thread.
 */
static void *reclaim_main(void *arg) {
    /* Named for top -H, gdb and profilers (at most 15 characters). */
    pthread_setname_np(pthread_self(), "hk-reclaim");
    hk_runtime *rt = arg;
    hkl_relax(rt); /* for the life of this thread */
    double next_reset_check = hkl_now_ms() + 200;
    int left = 0;
    for (;;) {
        pthread_mutex_lock(&rt->rec.lock);
        if (!rt->rec.stop && !rt->rec.kick && !rt->rec.retired)
            timed_wait(&rt->rec.cond, &rt->rec.lock, 100);
        else if (!rt->rec.stop && !rt->rec.kick && left)
            /* Versions wait for a launch to finish (poll briefly) or for a
             * pin, whose release kicks this thread. */
            timed_wait(&rt->rec.cond, &rt->rec.lock,
                       left == 2   ? rt->rec.pin_poll_ms
                       : left == 3 ? 10
                                   : 1);
        int stop = rt->rec.stop;
        pthread_mutex_unlock(&rt->rec.lock);
        if (stop)
            break;
        /* Each pass is a section of the exit guard (base/exit.h): once the
         * process exits, this thread calls the driver no more. */
        if (!hkb_exit_enter())
            hkb_exit_park();
        int unloaded = 0;
        left = reclaim_pass(rt, 0, &unloaded);
        if (unloaded) {
            /* Batch the next unloads (each may stall launchers while the
             * GPU drains): gather retirements for unload_gap_ms, unless
             * someone waits for them. */
            double until = hkl_now_ms() + rt->rec.unload_gap_ms;
            pthread_mutex_lock(&rt->rec.lock);
            while (!rt->rec.stop && !rt->rec.waiters && hkl_now_ms() < until)
                timed_wait(&rt->rec.cond, &rt->rec.lock, (long)(until - hkl_now_ms()) + 1);
            pthread_mutex_unlock(&rt->rec.lock);
        }
        if (hkl_now_ms() >= next_reset_check || atomic_exchange(&rt->reset.suspect, 0)) {
            next_reset_check = hkl_now_ms() + 200;
            int nested = hkl_swap_lock(rt);
            int reset = hkl_check_reset(rt);
            hkl_swap_unlock(rt, nested);
            if (reset)
                hkl_emit_reset(rt);
        }
        hkb_exit_leave();
    }
    /* Destroy's contract: no thread launches any more. Destroy found
     * swap_lock held (by this thread, in the driver) past its deadline:
     * the current versions are this thread's to retire. */
    pthread_mutex_lock(&rt->rec.lock);
    int retire = rt->rec.retire_all;
    pthread_mutex_unlock(&rt->rec.lock);
    if (retire) {
        int nested = hkl_swap_lock(rt);
        hkl_retire_all(rt);
        hkl_swap_unlock(rt, nested);
    }
    int unloaded;
    if (hkb_exit_enter()) {
        reclaim_pass(rt, 1, &unloaded);
        hkb_exit_leave();
    }
    pthread_mutex_lock(&rt->rec.lock);
    int abandoned = rt->rec.abandoned;
    rt->rec.finished = 1;
    pthread_cond_broadcast(&rt->rec.done);
    pthread_mutex_unlock(&rt->rec.lock);
    if (abandoned)
        rt->rec.free_rt(rt);
    return NULL;
}

int hkl_reclaim_start(hk_runtime *rt, void (*free_rt)(hk_runtime *rt)) {
    rt->rec.free_rt = free_rt;
    if (pthread_create(&rt->rec.thread, NULL, reclaim_main, rt))
        return HK_ERR_NOMEM;
    rt->rec.started = 1;
    return 0;
}

void hkl_retire_all(hk_runtime *rt) {
    pthread_mutex_lock(&rt->rec.lock);
    for (hkl_module *m = rt->modules; m; m = m->next) {
        hkl_version *v = atomic_exchange(&m->current, NULL);
        if (v) {
            v->next = rt->rec.retired;
            rt->rec.retired = v;
            rt->rec.nretired++;
        }
    }
    pthread_mutex_unlock(&rt->rec.lock);
}

void hkl_reclaim_stop(hk_runtime *rt) {
    pthread_mutex_lock(&rt->rec.lock);
    rt->rec.stop = 1;
    pthread_cond_broadcast(&rt->rec.cond);
    pthread_mutex_unlock(&rt->rec.lock);
}

/* Waits for the reclaim thread (stopped with hkl_reclaim_stop) to finish its
 * final pass, up to timeout_ms. On a timeout the thread is left running and
 * owns the runtime: it frees it when its pass ends. */
int hkl_reclaim_join(hk_runtime *rt, int timeout_ms) {
    if (!rt->rec.started) {
        int unloaded;
        reclaim_pass(rt, 1, &unloaded);
        return 0;
    }
    double end = hkl_now_ms() + timeout_ms;
    pthread_mutex_lock(&rt->rec.lock);
    while (!rt->rec.finished && hkl_now_ms() < end)
        timed_wait(&rt->rec.done, &rt->rec.lock, 10);
    int done = rt->rec.finished;
    if (!done)
        rt->rec.abandoned = 1;
    pthread_mutex_unlock(&rt->rec.lock);
    if (done)
        pthread_join(rt->rec.thread, NULL);
    else
        pthread_detach(rt->rec.thread);
    return done ? 0 : HK_ERR_TIMEOUT;
}

int hk_reclaim_wait(hk_runtime *rt, int timeout_ms) {
    if (!rt)
        return HK_ERR_INVALID;
    /* From a RECLAIMED event: the reclaim thread would wait for itself. */
    if (rt->rec.started && pthread_equal(pthread_self(), rt->rec.thread))
        return HK_ERR_BUSY;
    double end = hkl_now_ms() + timeout_ms;
    int err = 0;
    pthread_mutex_lock(&rt->rec.lock);
    rt->rec.waiters++;
    while (rt->rec.nretired > 0) {
        if (hkl_now_ms() >= end) {
            err = HK_ERR_TIMEOUT;
            break;
        }
        rt->rec.kick = 1;
        pthread_cond_signal(&rt->rec.cond);
        timed_wait(&rt->rec.done, &rt->rec.lock, 10);
    }
    rt->rec.waiters--;
    pthread_mutex_unlock(&rt->rec.lock);
    return err;
}

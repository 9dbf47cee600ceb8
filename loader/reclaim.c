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
#include "loader/loader.h"
#include "loader/safepoint.h"

/* 1 when no host thread can still reach v. */
static int grace_over(hk_runtime *rt, const hkl_version *v) {
    for (hkl_tslot *s = atomic_load(&rt->slots); s; s = s->next) {
        uint64_t a = atomic_load(&s->active);
        if (a && a < v->retire_epoch)
            return 0;
    }
    return atomic_load(&v->pins) == 0;
}

static void count_reclaimed(hk_runtime *rt, int n) {
    if (!n)
        return;
    pthread_mutex_lock(&rt->stats_lock);
    rt->stats.reclaimed += (uint64_t)n;
    rt->stats.live_versions -= (uint64_t)n;
    pthread_mutex_unlock(&rt->stats_lock);
}

/* Finishes the GPU work queued before now, which includes every launch of
 * the versions about to go. The contexts are read now since reset recovery
 * may replace them; a context that has gone makes its synchronise fail, which
 * is harmless here (nothing runs in it). Returns 0, or HK_ERR_BUSY when the
 * driver refused to synchronise because of a stream capture: then nothing
 * may be unloaded yet. Reclaim thread only. */
static int sync_contexts(hk_runtime *rt) {
    if (rt->hook)
        rt->hook(rt, HKL_HOOK_PASS_SYNC);
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
    pthread_mutex_lock(&rt->rec_lock);
    rt->nretired -= n;
    while (failed) {
        hkl_version *v = failed;
        failed = v->next;
        v->next = rt->retired;
        rt->retired = v;
    }
    pthread_cond_broadcast(&rt->rec_done);
    pthread_mutex_unlock(&rt->rec_lock);
    return n;
}

/* Takes the versions of unload_ready whose safe point is overdue
 * (sp_deadline passed): their GPU work was seen finished when they went
 * there, so they are unloaded at once. rec_lock held. */
static hkl_version *take_late(hk_runtime *rt) {
    double now = hkl_now_ms();
    hkl_version *late = NULL;
    for (hkl_version **pp = &rt->unload_ready; *pp;) {
        hkl_version *v = *pp;
        if (v->sp_deadline <= now) {
            *pp = v->next;
            v->next = late;
            late = v;
        } else {
            pp = &v->next;
        }
    }
    hkl_sp_mark(rt, HKL_SP_UNLOADS, rt->unload_ready != NULL);
    return late;
}

/* One pass: unloads what is ready, hands what waits for a safe point to
 * unload_ready (after its GPU work finished), puts the rest back. Returns 1
 * while versions still wait for a launch, 2 while they wait only for pins, 3
 * while a stream capture keeps the driver from synchronising. rec_lock not
 * held. */
static int reclaim_pass(hk_runtime *rt, int final, int *unloaded) {
    pthread_mutex_lock(&rt->rec_lock);
    rt->rec_kick = 0;
    hkl_version *list = rt->retired;
    rt->retired = NULL;
    hkl_version *late = final ? NULL : take_late(rt);
    if (final) {
        /* Destroy: everything goes, deferred versions included. */
        while (rt->unload_ready) {
            hkl_version *v = rt->unload_ready;
            rt->unload_ready = v->next;
            v->next = list;
            list = v;
        }
        hkl_sp_mark(rt, HKL_SP_UNLOADS, 0);
    }
    pthread_mutex_unlock(&rt->rec_lock);
    hkl_version *ready = NULL, *keep = NULL, *defer = NULL;
    /* One reading of the pins decides both whether the fence is paid and
     * which versions may go: a pin released after this reading waits for the
     * next pass (and its fence). Pinned versions are not candidates, and the
     * fence (an interrupt on every CPU running one of the program's threads)
     * is paid only when some version could go. */
    int candidates = 0, pinned_only = 1, refused = 0;
    for (hkl_version *v = list; v; v = v->next)
        candidates += v->candidate = final || atomic_load(&v->pins) == 0;
    if (rt->hook && list)
        rt->hook(rt, HKL_HOOK_PASS_SNAPSHOT);
    if (candidates && !final) {
        hkl_heavy_fence(rt);
        pthread_mutex_lock(&rt->rec_lock);
        rt->fences++;
        pthread_mutex_unlock(&rt->rec_lock);
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
    pthread_mutex_lock(&rt->rec_lock);
    while (keep) {
        hkl_version *v = keep;
        keep = v->next;
        v->next = rt->retired;
        rt->retired = v;
    }
    while (defer) {
        hkl_version *v = defer;
        defer = v->next;
        v->sp_deadline =
            hkl_now_ms() + (rt->opt.safe_point_wait_ms > 0 ? rt->opt.safe_point_wait_ms : 0);
        v->next = rt->unload_ready;
        rt->unload_ready = v;
    }
    hkl_sp_mark(rt, HKL_SP_UNLOADS, rt->unload_ready != NULL);
    int left = rt->retired == NULL ? 0 : refused ? 3 : pinned_only ? 2 : 1;
    pthread_cond_broadcast(&rt->rec_done);
    pthread_mutex_unlock(&rt->rec_lock);
    return left;
}

/* From hk_safe_point: unloads the versions whose GPU work the reclaim thread
 * has already seen finished. No synchronise here: a safe point never waits
 * for the GPU on hotkern's account. */
void hkl_reclaim_deferred(hk_runtime *rt) {
    pthread_mutex_lock(&rt->rec_lock);
    hkl_version *list = rt->unload_ready;
    rt->unload_ready = NULL;
    hkl_sp_mark(rt, HKL_SP_UNLOADS, 0);
    pthread_mutex_unlock(&rt->rec_lock);
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
        pthread_mutex_lock(&rt->rec_lock);
        if (!rt->rec_stop && !rt->rec_kick && !rt->retired)
            timed_wait(&rt->rec_cond, &rt->rec_lock, 100);
        else if (!rt->rec_stop && !rt->rec_kick && left)
            /* Versions wait for a launch to finish (poll briefly) or for a
             * pin, whose release kicks this thread. */
            timed_wait(&rt->rec_cond, &rt->rec_lock,
                       left == 2   ? rt->pin_poll_ms
                       : left == 3 ? 10
                                   : 1);
        int stop = rt->rec_stop;
        pthread_mutex_unlock(&rt->rec_lock);
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
            double until = hkl_now_ms() + rt->unload_gap_ms;
            pthread_mutex_lock(&rt->rec_lock);
            while (!rt->rec_stop && !rt->rec_waiters && hkl_now_ms() < until)
                timed_wait(&rt->rec_cond, &rt->rec_lock, (long)(until - hkl_now_ms()) + 1);
            pthread_mutex_unlock(&rt->rec_lock);
        }
        if (hkl_now_ms() >= next_reset_check || atomic_exchange(&rt->reset_suspect, 0)) {
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
    pthread_mutex_lock(&rt->rec_lock);
    int retire = rt->rec_retire_all;
    pthread_mutex_unlock(&rt->rec_lock);
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
    pthread_mutex_lock(&rt->rec_lock);
    int abandoned = rt->abandoned;
    rt->rec_finished = 1;
    pthread_cond_broadcast(&rt->rec_done);
    pthread_mutex_unlock(&rt->rec_lock);
    if (abandoned)
        rt->rec_free(rt);
    return NULL;
}

int hkl_reclaim_start(hk_runtime *rt, void (*free_rt)(hk_runtime *rt)) {
    rt->rec_free = free_rt;
    if (pthread_create(&rt->rec_thread, NULL, reclaim_main, rt))
        return HK_ERR_NOMEM;
    rt->rec_started = 1;
    return 0;
}

void hkl_retire_all(hk_runtime *rt) {
    pthread_mutex_lock(&rt->rec_lock);
    for (hkl_module *m = rt->modules; m; m = m->next) {
        hkl_version *v = atomic_exchange(&m->current, NULL);
        if (v) {
            v->next = rt->retired;
            rt->retired = v;
            rt->nretired++;
        }
    }
    pthread_mutex_unlock(&rt->rec_lock);
}

void hkl_reclaim_stop(hk_runtime *rt) {
    pthread_mutex_lock(&rt->rec_lock);
    rt->rec_stop = 1;
    pthread_cond_broadcast(&rt->rec_cond);
    pthread_mutex_unlock(&rt->rec_lock);
}

/* Waits for the reclaim thread (stopped with hkl_reclaim_stop) to finish its
 * final pass, up to timeout_ms. On a timeout the thread is left running and
 * owns the runtime: it frees it when its pass ends. */
int hkl_reclaim_join(hk_runtime *rt, int timeout_ms) {
    if (!rt->rec_started) {
        int unloaded;
        reclaim_pass(rt, 1, &unloaded);
        return 0;
    }
    double end = hkl_now_ms() + timeout_ms;
    pthread_mutex_lock(&rt->rec_lock);
    while (!rt->rec_finished && hkl_now_ms() < end)
        timed_wait(&rt->rec_done, &rt->rec_lock, 10);
    int done = rt->rec_finished;
    if (!done)
        rt->abandoned = 1;
    pthread_mutex_unlock(&rt->rec_lock);
    if (done)
        pthread_join(rt->rec_thread, NULL);
    else
        pthread_detach(rt->rec_thread);
    return done ? 0 : HK_ERR_TIMEOUT;
}

int hk_reclaim_wait(hk_runtime *rt, int timeout_ms) {
    if (!rt)
        return HK_ERR_INVALID;
    /* From a RECLAIMED event: the reclaim thread would wait for itself. */
    if (rt->rec_started && pthread_equal(pthread_self(), rt->rec_thread))
        return HK_ERR_BUSY;
    double end = hkl_now_ms() + timeout_ms;
    int err = 0;
    pthread_mutex_lock(&rt->rec_lock);
    rt->rec_waiters++;
    while (rt->nretired > 0) {
        if (hkl_now_ms() >= end) {
            err = HK_ERR_TIMEOUT;
            break;
        }
        rt->rec_kick = 1;
        pthread_cond_signal(&rt->rec_cond);
        timed_wait(&rt->rec_done, &rt->rec_lock, 10);
    }
    rt->rec_waiters--;
    pthread_mutex_unlock(&rt->rec_lock);
    return err;
}

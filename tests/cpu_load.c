/*
 * The engine under the loads real programs put on it, on the fake driver:
 * launchers that never pause (with the driver's reader-preferring lock
 * modelled), graphs captured from hk_launch, another thread's global-mode
 * capture, graph launches against commits, callbacks that call back, and the
 * races and waits the reclaim thread used to have. Each test holds a thread at
 * a chosen point (test hooks, held driver calls) instead of hoping for a
 * schedule. None of this is GPU evidence; tests/gpu_engine.c is.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loader/core.h"
#include "loader/version.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

static hk_runtime *rt;
/* Written by hotkern's threads, read by the test's. */
static _Atomic int events[8];
static _Atomic int reclaimed_per_version[64];
static int (*_Atomic on_reclaimed)(void);
static _Atomic int on_reclaimed_result = 1;
static int (*_Atomic on_committed)(void);
static _Atomic int on_committed_result = 1;

static void on_event(const hk_event *ev, void *ud) {
    (void)ud;
    events[ev->kind]++;
    if (ev->kind == HK_EVENT_RECLAIMED && ev->old_version < 64)
        reclaimed_per_version[ev->old_version]++;
    if (ev->kind == HK_EVENT_RECLAIMED && on_reclaimed)
        on_reclaimed_result = on_reclaimed();
    if (ev->kind == HK_EVENT_COMMITTED && on_committed)
        on_committed_result = on_committed();
}

static void test_hook(hk_runtime *r, hkl_hook_point p);

static hk_runtime *make_rt_with(hk_options *o) {
    fake_init(1, 90);
    for (int i = 0; i < 8; i++)
        atomic_store(&events[i], 0);
    for (int i = 0; i < 64; i++)
        atomic_store(&reclaimed_per_version[i], 0);
    on_reclaimed = on_committed = NULL;
    o->ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o->cache_dir = "";
    o->on_event = on_event;
    hk_runtime *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&r, o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    /* Set before any thread of the runtime has work (they read it without
     * a lock); it does nothing until hook_arm. */
    r->test.hook = test_hook;
    return r;
}

static hk_runtime *make_rt(hk_loader loader) {
    hk_options o;
    hk_options_init(&o);
    o.loader = loader;
    return make_rt_with(&o);
}

static void setup(void) {
    rt = make_rt(HK_LOADER_LIBRARY);
}

static void teardown(void) {
    fake_hold_sync(0);
    hk_runtime_destroy(rt);
    rt = NULL;
    ck_assert_int_eq(fake_live_images(), 0);
    ck_assert_int_eq(fake_violations(), 0);
}

static void swap_ok(const char *src) {
    hk_report rep = HK_REPORT_INIT;
    int err = hk_swap(rt, "sim", src, strlen(src), NULL, &rep);
    ck_assert_msg(err == 0, "swap refused: %s: %s", hk_strerror(err), rep.message);
    hk_report_clear(&rep);
}

static hk_kernel *step_kernel(void) {
    hk_kernel *k = NULL;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    return k;
}

static int launch_on(hk_kernel *k, CUstream s, int *out) {
    int *dptr = out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    return hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, s, args, NULL);
}

static int launch_tag(hk_kernel *k) {
    int out = -1;
    ck_assert_int_eq(launch_on(k, NULL, &out), 0);
    return out;
}

static uint64_t stat_reclaimed(void) {
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    return st.reclaimed;
}

/* Polls cond for up to 10 s: for outcomes that take no time once their
 * cause is gone (a liveness check, not a timing assertion). */
#define WAIT_FOR(cond)                                                                             \
    do {                                                                                           \
        int i_;                                                                                    \
        for (i_ = 0; i_ < 1000 && !(cond); i_++)                                                   \
            usleep(10 * 1000);                                                                     \
        ck_assert_msg(cond, "still not true after 10 s: %s", #cond);                               \
    } while (0)

/* ---- continuous launches ------------------------------------------------ */

static hk_kernel *load_k;
static _Atomic int stop_flag, launch_failures, bad_tags;
static _Atomic long launches_done;

static void *continuous_launcher(void *arg) {
    (void)arg;
    while (!atomic_load(&stop_flag)) {
        int tag = 0;
        if (launch_on(load_k, NULL, &tag) != 0)
            atomic_fetch_add(&launch_failures, 1);
        else if (tag != 1 && tag != 2)
            atomic_fetch_add(&bad_tags, 1);
        atomic_fetch_add(&launches_done, 1);
    }
    return NULL;
}

/* Four threads launch with no pause while every launch holds the driver's
 * lock for reading (as the real driver does): without the launch gate the
 * swaps' loads never get it for writing. */
START_TEST(swaps_finish_under_continuous_launches) {
    swap_ok(fake_ptx(1, 0, 0, 0));
    load_k = step_kernel();
    fake_set_launch_model(20);
    atomic_store(&stop_flag, 0);
    atomic_store(&launch_failures, 0);
    atomic_store(&bad_tags, 0);
    atomic_store(&launches_done, 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, continuous_launcher, NULL);
    WAIT_FOR(atomic_load(&launches_done) > 100);
    for (int i = 0; i < 200; i++)
        swap_ok(fake_ptx(1 + (i % 2 == 0), 0, 0, 0));
    atomic_store(&stop_flag, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    fake_set_launch_model(-1);
    ck_assert_int_eq(atomic_load(&launch_failures), 0);
    ck_assert_int_eq(atomic_load(&bad_tags), 0);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 201);
    ck_assert_int_eq(hk_reclaim_wait(rt, 10000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    ck_assert_uint_eq(stat_reclaimed(), 200);
}
END_TEST

/* ---- every unhappy path under load -------------------------------------- */

static int refuse_check(const char *module, uint64_t version, void *ud, char *msg, size_t n) {
    (void)module, (void)version, (void)ud;
    snprintf(msg, n, "not this one");
    return -1;
}

static _Atomic int unhappy_done;

/* Refusals of every kind, rollbacks and function lookups, in turn: each
 * touches the driver's write side (an unload of the refused image, a
 * cuKernelGetFunction). */
static void *unhappy_ops(void *arg) {
    (void)arg;
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.check = refuse_check;
    for (int i = 0; i < 60; i++) {
        hk_report rep = HK_REPORT_INIT;
        const char *src;
        int err, want;
        switch (i % 5) {
        case 0: /* a kernel in use removed */
            src = fake_ptx(2, 0, 0, 0);
            want = HK_ERR_MISSING_KERNEL;
            err = hk_swap(rt, "sim", src, strlen(src), NULL, &rep);
            break;
        case 1: /* a parameter layout changed */
            src = fake_ptx(2, 1, 0, 1);
            want = HK_ERR_LAYOUT;
            err = hk_swap(rt, "sim", src, strlen(src), NULL, &rep);
            break;
        case 2: /* the check callback says no */
            src = fake_ptx(2, 1, 0, 0);
            want = HK_ERR_REJECTED;
            err = hk_swap(rt, "sim", src, strlen(src), &so, &rep);
            break;
        case 3: /* a good one, then back */
            src = fake_ptx(2, 1, 0, 0);
            want = 0;
            err = hk_swap(rt, "sim", src, strlen(src), NULL, &rep);
            if (err == 0)
                err = hk_rollback(rt, "sim", &rep);
            break;
        default: {
            void *f = NULL;
            want = 0;
            err = hk_kernel_function(load_k, &f);
            if (err == 0 && !f)
                err = HK_ERR_NOT_FOUND;
        }
        }
        if (err != want) {
            fprintf(stderr, "operation %d: %s: %s\n", i, hk_strerror(err), rep.message);
            hk_report_clear(&rep);
            atomic_store(&unhappy_done, 1);
            return (void *)(intptr_t)(err ? err : -1000);
        }
        hk_report_clear(&rep);
    }
    atomic_store(&unhappy_done, 1);
    return NULL;
}

/* Eight threads launch with no pause, holding the driver's lock for reading
 * as the real driver does, while refused swaps, rollbacks and function
 * lookups run: every one of them completes (the driver's writer side is
 * only ever taken with the launch gate closed), and no launch fails. */
START_TEST(refusals_finish_under_continuous_launches) {
    swap_ok(fake_ptx(1, 1, 0, 0));
    load_k = step_kernel();
    hk_kernel *aux = NULL;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "aux", &aux), 0);
    fake_set_launch_model(20);
    atomic_store(&stop_flag, 0);
    atomic_store(&launch_failures, 0);
    atomic_store(&bad_tags, 0);
    atomic_store(&launches_done, 0);
    atomic_store(&unhappy_done, 0);
    pthread_t t[8], ops;
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, continuous_launcher, NULL);
    WAIT_FOR(atomic_load(&launches_done) > 100);
    pthread_create(&ops, NULL, unhappy_ops, NULL);
    /* Liveness, not timing: on the driver's write lock without the gate,
     * these wait until the launchers stop, which they do not. */
    int i;
    for (i = 0; i < 3000 && !atomic_load(&unhappy_done); i++)
        usleep(10 * 1000);
    int done = atomic_load(&unhappy_done);
    atomic_store(&stop_flag, 1);
    for (int j = 0; j < 8; j++)
        pthread_join(t[j], NULL);
    void *res;
    pthread_join(ops, &res);
    fake_set_launch_model(-1);
    ck_assert_msg(done, "refused swaps still waiting after 30 s of continuous launches");
    ck_assert_msg(res == NULL, "an operation returned %d", (int)(intptr_t)res);
    ck_assert_int_eq(atomic_load(&launch_failures), 0);
    ck_assert_int_eq(atomic_load(&bad_tags), 0);
    ck_assert_int_eq(hk_reclaim_wait(rt, 10000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
}
END_TEST

static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hook_cond = PTHREAD_COND_INITIALIZER;
static hkl_hook_point hook_at;
static int hook_armed, hook_inside, hook_release;
static void (*hook_action)(void);

/* Holds the thread that reaches hook_at (once) until hook_go(). */
static void test_hook(hk_runtime *r, hkl_hook_point p) {
    (void)r;
    pthread_mutex_lock(&hook_lock);
    if (!hook_armed || p != hook_at) {
        pthread_mutex_unlock(&hook_lock);
        return;
    }
    hook_armed = 0;
    hook_inside = 1;
    pthread_cond_broadcast(&hook_cond);
    void (*action)(void) = hook_action;
    pthread_mutex_unlock(&hook_lock);
    if (action) {
        action();
        return;
    }
    pthread_mutex_lock(&hook_lock);
    while (!hook_release)
        pthread_cond_wait(&hook_cond, &hook_lock);
    pthread_mutex_unlock(&hook_lock);
}

static void hook_arm(hkl_hook_point p, void (*action)(void)) {
    pthread_mutex_lock(&hook_lock);
    hook_at = p;
    hook_armed = 1;
    hook_inside = hook_release = 0;
    hook_action = action;
    pthread_mutex_unlock(&hook_lock);
}

static void hook_wait_inside(void) {
    pthread_mutex_lock(&hook_lock);
    while (!hook_inside)
        pthread_cond_wait(&hook_cond, &hook_lock);
    pthread_mutex_unlock(&hook_lock);
}

static void hook_go(void) {
    pthread_mutex_lock(&hook_lock);
    hook_release = 1;
    pthread_cond_broadcast(&hook_cond);
    pthread_mutex_unlock(&hook_lock);
}

static void *swap_tag2(void *arg) {
    (void)arg;
    hk_report rep = HK_REPORT_INIT;
    const char *src = fake_ptx(2, 0, 0, 0);
    intptr_t err = hk_swap(rt, "sim", src, strlen(src), NULL, &rep);
    hk_report_clear(&rep);
    return (void *)err;
}

static char gate_msg[1024];
static _Atomic int gate_msgs;

static void on_gate_log(hk_log_level level, const char *subsystem, const char *message, void *ud) {
    (void)ud;
    if (level == HK_LOG_INFO && !strcmp(subsystem, "engine") && strstr(message, "launch gate")) {
        snprintf(gate_msg, sizeof gate_msg, "%s", message); /* the latest: the longest */
        atomic_fetch_add(&gate_msgs, 1);
    }
}

/* A launch waits at the gate at most launch_hold_max_us, however long the
 * swap holds the gate closed: here the swap is held inside it. The closing,
 * longer than the hold, is logged with the section that held it. */
START_TEST(launch_wait_at_gate_is_bounded) {
    hk_runtime_destroy(rt);
    hk_options o;
    hk_options_init(&o);
    o.launch_hold_max_us = 20000;
    rt = make_rt_with(&o);
    atomic_store(&gate_msgs, 0);
    ck_assert_int_eq(hk_runtime_set_log(rt, on_gate_log, NULL, HK_LOG_INFO), 0);
    swap_ok(fake_ptx(1, 0, 0, 0));
    hk_kernel *k = step_kernel();
    hook_arm(HKL_HOOK_GATED, NULL);
    pthread_t t;
    pthread_create(&t, NULL, swap_tag2, NULL);
    hook_wait_inside(); /* the swap holds the gate closed */
    ck_assert_int_eq(atomic_load(&rt->gate.closers), 1);
    ck_assert_int_eq(launch_tag(k), 1); /* returned: waited, then went on */
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_ge(st.launch_hold_timeouts, 1);
    hook_go();
    void *err;
    pthread_join(t, &err);
    ck_assert_int_eq((intptr_t)err, 0);
    ck_assert_int_eq(launch_tag(k), 2);
    hk_stats_get(rt, &st);
    ck_assert_uint_ge(st.gate_closes, 2);
    /* Closed at least as long as the launch waited before going on. */
    ck_assert_msg(st.gate_closed_max_ms >= 19.0, "%.3f ms", st.gate_closed_max_ms);
    /* Logged, the longest last, naming the section: the swap's load. */
    ck_assert_int_ge(atomic_load(&gate_msgs), 1);
    ck_assert_msg(strstr(gate_msg, "for a swap (load through publication) ("), "%s", gate_msg);
    double ms = 0;
    ck_assert_int_eq(sscanf(gate_msg, "the launch gate stayed closed %lf ms", &ms), 1);
    ck_assert_msg(ms >= 19.0 && fabs(ms - st.gate_closed_max_ms) < 0.001, "%s", gate_msg);
}
END_TEST

/* ---- stream capture ----------------------------------------------------- */

/* A graph captured from hk_launch keeps the version it captured loaded
 * through 20 commits and runs it; the version goes when the graph does. */
START_TEST(captured_graph_keeps_its_version) {
    swap_ok(fake_ptx(1, 0, 0, 0));
    hk_kernel *k = step_kernel();
    CUstream s;
    ck_assert_int_eq(fake_driver()->StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    fake_capture_begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    int out = 0;
    ck_assert_int_eq(launch_on(k, s, &out), 0);
    CUgraph g;
    ck_assert_int_eq(fake_capture_end(s, &g), CUDA_SUCCESS);
    for (int i = 0; i < 20; i++)
        swap_ok(fake_ptx(2 + i % 2, 0, 0, 0));
    WAIT_FOR(stat_reclaimed() == 19);
    ck_assert_int_eq(hk_reclaim_wait(rt, 200), HK_ERR_TIMEOUT); /* v1 is held */
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.retired_loaded, 1);
    ck_assert_int_eq(reclaimed_per_version[1], 0);
    int tag = 0;
    ck_assert_int_eq(fake_captured_graph_launch(g, &tag), 0); /* no unloaded code */
    ck_assert_int_eq(tag, 1);
    fake_captured_graph_destroy(g);
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
}
END_TEST

/* A graph captured before the runtime is destroyed and released after it
 * finds no runtime behind its pin (and touches nothing freed). */
START_TEST(captured_graph_may_outlive_runtime) {
    swap_ok(fake_ptx(1, 0, 0, 0));
    hk_kernel *k = step_kernel();
    CUstream s;
    fake_driver()->StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    fake_capture_begin(s, CU_STREAM_CAPTURE_MODE_RELAXED);
    int out = 0;
    ck_assert_int_eq(launch_on(k, s, &out), 0);
    CUgraph g;
    ck_assert_int_eq(fake_capture_end(s, &g), CUDA_SUCCESS);
    hk_runtime_destroy(rt);
    rt = NULL;
    fake_captured_graph_destroy(g);
    ck_assert_int_eq(fake_live_images(), 0);
}
END_TEST

static CUstream cap_stream;
static _Atomic int cap_started, cap_stop;

static void *global_capturer(void *arg) {
    (void)arg;
    fake_capture_begin(cap_stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
    atomic_store(&cap_started, 1);
    while (!atomic_load(&cap_stop))
        usleep(1000);
    CUgraph g;
    return (void *)(intptr_t)fake_capture_end(cap_stream, &g);
}

/* Another thread captures in global mode (PyTorch's default) while this
 * one swaps 100 times, pins and unpins, carries a global over, and the
 * reclaim thread synchronises and unloads: the capture must end intact. */
START_TEST(global_capture_is_never_broken) {
    swap_ok(fake_ptx(1, 0, 1, 0));
    fake_driver()->StreamCreate(&cap_stream, CU_STREAM_NON_BLOCKING);
    atomic_store(&cap_started, 0);
    atomic_store(&cap_stop, 0);
    pthread_t t;
    pthread_create(&t, NULL, global_capturer, NULL);
    WAIT_FOR(atomic_load(&cap_started));
    for (int i = 0; i < 100; i++) {
        swap_ok(fake_ptx(2 + i % 2, 0, 1, 0));
        if (i % 10 == 0) {
            hk_pin *p;
            ck_assert_int_eq(hk_pin_module(rt, "sim", &p), 0);
            ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0); /* reclaimed mid-capture */
            hk_unpin(p);
        }
    }
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    atomic_store(&cap_stop, 1);
    void *r;
    pthread_join(t, &r);
    ck_assert_msg((intptr_t)r == CUDA_SUCCESS, "capture ended with %d", (int)(intptr_t)r);
    ck_assert_uint_eq(stat_reclaimed(), 100);
    ck_assert_int_eq(fake_live_images(), 1);
}
END_TEST

/* An unload the driver refuses (here: during a capture) is tried again and
 * counted once it succeeds; the code is really gone at the end. */
START_TEST(failed_unload_is_retried_not_counted) {
    swap_ok(fake_ptx(1, 0, 0, 0));
    fake_fail("cuLibraryUnload", 1, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    swap_ok(fake_ptx(2, 0, 0, 0));
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    ck_assert_int_ge(fake_calls("cuLibraryUnload"), 2);
    ck_assert_uint_eq(stat_reclaimed(), 1);
    ck_assert_int_eq(fake_live_images(), 1);
    ck_assert_int_eq(reclaimed_per_version[1], 1);
}
END_TEST

/* A pass that gathered many retired versions unloads them with one gate
 * closure each, so no launcher is held for the whole batch. The reclaim
 * thread is held while six versions retire, so that one pass finds them all. */
START_TEST(batched_unloads_open_the_gate_between_versions) {
    swap_ok(fake_ptx(1, 0, 0, 0));
    hook_arm(HKL_HOOK_PASS_SNAPSHOT, NULL);
    swap_ok(fake_ptx(2, 0, 0, 0)); /* v1 retired: a pass starts and is held */
    hook_wait_inside();
    for (int i = 0; i < 5; i++) /* v2..v6 retired while it is held */
        swap_ok(fake_ptx(3 + i % 2, 0, 0, 0) /* alternate: never the same image */);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    uint64_t closes0 = st.gate_closes, reclaimed0 = st.reclaimed;
    ck_assert_uint_eq(reclaimed0, 0);
    hook_go();
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.reclaimed - reclaimed0, 6);
    /* Every unload had a closure of its own (one for all would give 2). */
    ck_assert_uint_ge(st.gate_closes - closes0, 6);
    ck_assert_int_eq(fake_live_images(), 1);
}
END_TEST

/* Module loader: a synchronise the driver refuses (a capture) proves
 * nothing about the GPU: the versions wait for one that succeeds. */
START_TEST(refused_synchronise_unloads_nothing) {
    hk_runtime_destroy(rt);
    rt = make_rt(HK_LOADER_MODULE); /* the loader that synchronises */
    swap_ok(fake_ptx(1, 0, 0, 0));
    fake_hold_sync(1); /* a synchronise that does happen blocks here */
    fake_fail("cuCtxSynchronize", 1, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    swap_ok(fake_ptx(2, 0, 0, 0));
    fake_wait_sync_held();                   /* the retry, after the refused one */
    ck_assert_int_eq(fake_live_images(), 2); /* version 1 was not unloaded */
    fake_hold_sync(0);
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
}
END_TEST

/* ---- graph launches against commits ------------------------------------ */

static _Atomic int graph_stop;
static CUgraphExec graph_exec;

static void *graph_launcher(void *arg) {
    (void)arg;
    while (!atomic_load(&graph_stop))
        hk_graph_launch(rt, graph_exec, NULL, NULL);
    return NULL;
}

/* Three threads launch a registered graph without pause; commits must
 * still get the graph lock for writing and retarget it. */
START_TEST(graph_launches_do_not_starve_commits) {
    swap_ok(fake_ptx(1, 0, 0, 0));
    hk_kernel *k = step_kernel();
    void *f;
    fake_driver()->CtxSetCurrent((CUcontext)hk_runtime_context(rt, 0));
    ck_assert_int_eq(hk_kernel_function(k, &f), 0);
    int out = 0, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    CUgraphNode node;
    fake_graph_create((CUfunction)f, args, &graph_exec, &node);
    ck_assert_int_eq(hk_graph_register(rt, graph_exec, node, k), 0);
    fake_set_graph_launch_us(300);
    atomic_store(&graph_stop, 0);
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, graph_launcher, NULL);
    usleep(20 * 1000);
    for (int i = 0; i < 20; i++)
        swap_ok(fake_ptx(2 + i % 2, 0, 0, 0));
    atomic_store(&graph_stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    ck_assert_int_eq(fake_tag_of(fake_graph_func(graph_exec)), 3); /* the last commit */
    ck_assert_int_eq(hk_graph_unregister(rt, graph_exec), 0);
    fake_driver()->CtxSetCurrent(NULL);
}
END_TEST

/* ---- callbacks that call back ------------------------------------------ */

static uint64_t seen_version;
static int seen_pin, seen_swap, seen_get, seen_sp, seen_rollback;

static int calling_check(const char *module, uint64_t version, void *ud, char *msg, size_t n) {
    (void)ud;
    (void)msg;
    (void)n;
    seen_version = hk_module_version(rt, module); /* still the old one */
    hk_pin *p = NULL;
    seen_pin = hk_pin_module(rt, module, &p);
    hk_unpin(p);
    const char *src = fake_ptx(9, 0, 0, 0);
    seen_swap = hk_swap(rt, module, src, strlen(src), NULL, NULL);
    hk_kernel *k;
    seen_get = hk_kernel_get(rt, module, "step", &k);
    seen_sp = hk_safe_point(rt);
    seen_rollback = hk_rollback(rt, module, NULL);
    (void)version;
    return 0; /* accept */
}

static int wait_idle_from_event(void) {
    return hk_wait_idle(rt, 10000);
}

static int reclaim_wait_from_event(void) {
    return hk_reclaim_wait(rt, 10000);
}

/* Every function a callback may call either answers or returns HK_ERR_BUSY
 * at once: none waits for the thread it runs on. */
START_TEST(callbacks_may_call_back) {
    swap_ok(fake_ptx(1, 0, 0, 0));
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.check = calling_check;
    hk_report rep = HK_REPORT_INIT;
    const char *src = fake_ptx(2, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), &so, &rep), 0);
    ck_assert_uint_eq(seen_version, 1);
    ck_assert_int_eq(seen_pin, 0);
    ck_assert_int_eq(seen_swap, HK_ERR_BUSY);
    ck_assert_int_eq(seen_get, HK_ERR_BUSY);
    ck_assert_int_eq(seen_sp, HK_ERR_BUSY);
    ck_assert_int_eq(seen_rollback, HK_ERR_BUSY);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 2);

    /* COMMITTED on the worker thread: hk_wait_idle would wait for itself. */
    on_committed = wait_idle_from_event;
    on_committed_result = 1;
    src = fake_ptx(3, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "sim", src, strlen(src), NULL), 0);
    WAIT_FOR(hk_module_version(rt, "sim") == 3);
    ck_assert_int_eq(hk_wait_idle(rt, 10000), 0);
    ck_assert_int_eq(on_committed_result, HK_ERR_BUSY);
    on_committed = NULL;

    /* RECLAIMED on the reclaim thread: hk_reclaim_wait would too. */
    on_reclaimed = reclaim_wait_from_event;
    ck_assert_int_eq(hk_reclaim_wait(rt, 10000), 0);
    on_reclaimed_result = 1;
    swap_ok(fake_ptx(4, 0, 0, 0));
    ck_assert_int_eq(hk_reclaim_wait(rt, 10000), 0);
    ck_assert_int_eq(on_reclaimed_result, HK_ERR_BUSY);
    hk_report_clear(&rep);
}
END_TEST

/* ---- the reclaim thread's races ---------------------------------------- */

static hk_pin *race_pin;
static uint64_t fences_at_unpin;

static void unpin_now(void) {
    hk_unpin(race_pin);
    race_pin = NULL;
    pthread_mutex_lock(&rt->rec.lock);
    fences_at_unpin = rt->test.fences;
    pthread_mutex_unlock(&rt->rec.lock);
}

/* A pin released between the pass's reading of the pins and its decision
 * must not let the version go without a fence after the release. */
START_TEST(pin_released_mid_pass_is_fenced) {
    swap_ok(fake_ptx(1, 0, 0, 0));
    ck_assert_int_eq(hk_pin_module(rt, "sim", &race_pin), 0);
    hook_arm(HKL_HOOK_PASS_SNAPSHOT, unpin_now);
    swap_ok(fake_ptx(2, 0, 0, 0));
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    ck_assert_ptr_null(race_pin);
    pthread_mutex_lock(&rt->rec.lock);
    uint64_t fences = rt->test.fences;
    pthread_mutex_unlock(&rt->rec.lock);
    ck_assert_msg(fences > fences_at_unpin, "version unloaded with no fence after its unpin");
}
END_TEST

/* Reset recovery while a reclaim pass is held just before its unloads
 * (module loader): the pass must not unload modules of the dead context. */
START_TEST(module_unload_never_crosses_a_reset) {
    hk_runtime_destroy(rt);
    rt = make_rt(HK_LOADER_MODULE);
    swap_ok(fake_ptx(1, 0, 0, 0));
    hk_kernel *k = step_kernel();
    hook_arm(HKL_HOOK_PASS_SYNC, NULL);
    swap_ok(fake_ptx(2, 0, 0, 0));
    hook_wait_inside(); /* the pass holds version 1, about to unload it */
    fake_reset_device(0);
    swap_ok(fake_ptx(3, 0, 0, 0)); /* notices the reset, reloads */
    hook_go();
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    ck_assert_int_eq(fake_bad_unloads(), 0);
    ck_assert_int_eq(launch_tag(k), 3);
    /* One RECLAIMED event per version, the dead reload's twin included. */
    for (int v = 0; v < 64; v++)
        ck_assert_int_le(reclaimed_per_version[v], 1);
    ck_assert_int_eq(reclaimed_per_version[2], 1);
}
END_TEST

/* A version retired while a pass runs is reclaimed by the next pass at
 * once, not after the pin poll (set to a minute here). */
START_TEST(retire_during_pass_is_not_delayed) {
    pthread_mutex_lock(&rt->rec.lock);
    rt->rec.pin_poll_ms = 60000;
    pthread_mutex_unlock(&rt->rec.lock);
    swap_ok(fake_ptx(1, 0, 0, 0));
    hk_pin *p;
    ck_assert_int_eq(hk_pin_module(rt, "sim", &p), 0);
    hook_arm(HKL_HOOK_PASS_SNAPSHOT, NULL);
    swap_ok(fake_ptx(2, 0, 0, 0)); /* v1 retired, pinned */
    hook_wait_inside();
    swap_ok(fake_ptx(3, 0, 0, 0)); /* v2 retired while the pass runs */
    hook_go();
    WAIT_FOR(stat_reclaimed() == 1);
    ck_assert_int_eq(reclaimed_per_version[2], 1);
    hk_unpin(p);
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
}
END_TEST

static _Atomic int ctx_stop;

static void *ctx_reader(void *arg) {
    (void)arg;
    while (!atomic_load(&ctx_stop))
        (void)hk_runtime_context(rt, 0);
    return NULL;
}

/* hk_runtime_context while reset recovery replaces the context (a data
 * race before; ThreadSanitizer's build checks it). */
START_TEST(context_read_during_reset) {
    swap_ok(fake_ptx(1, 0, 0, 0));
    atomic_store(&ctx_stop, 0);
    pthread_t t;
    pthread_create(&t, NULL, ctx_reader, NULL);
    for (int i = 0; i < 5; i++) {
        fake_reset_device(0);
        swap_ok(fake_ptx(2 + i, 0, 0, 0));
    }
    atomic_store(&ctx_stop, 1);
    pthread_join(t, NULL);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.context_resets, 5);
}
END_TEST

/* ---- bounds -------------------------------------------------------------- */

static void *safe_point_once(void *arg) {
    (void)arg;
    hk_safe_point(rt);
    return NULL;
}

/* A persistent kernel keeps the reclaim thread's synchronise (module
 * loader) from returning: safe points still return, and the old version
 * shows as retired and loaded. */
START_TEST(safe_point_never_waits_for_the_gpu) {
    hk_runtime_destroy(rt);
    rt = make_rt(HK_LOADER_MODULE);
    swap_ok(fake_ptx(1, 0, 0, 0));
    pthread_t t;
    pthread_create(&t, NULL, safe_point_once, NULL); /* the program uses safe points */
    pthread_join(t, NULL);
    fake_hold_sync(1);
    const char *src = fake_ptx(2, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "sim", src, strlen(src), NULL), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 5000), 0);
    ck_assert_int_eq(hk_safe_point(rt), 1); /* commits v2 here */
    fake_wait_sync_held();                  /* reclaim thread stuck on the GPU */
    for (int i = 0; i < 3; i++)
        ck_assert_int_ge(hk_safe_point(rt), 0); /* returns */
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.retired_loaded, 1);
    fake_hold_sync(0);
    WAIT_FOR(hk_safe_point(rt) >= 0 && fake_live_images() == 1);
}
END_TEST

/* A submitted version waits for the next safe point at most
 * safe_point_wait_ms; then the worker stages it. */
START_TEST(submission_does_not_wait_for_ever) {
    hk_runtime_destroy(rt);
    hk_options o;
    hk_options_init(&o);
    o.safe_point_wait_ms = 100;
    rt = make_rt_with(&o);
    swap_ok(fake_ptx(1, 0, 0, 0));
    pthread_t t;
    pthread_create(&t, NULL, safe_point_once, NULL);
    pthread_join(t, NULL); /* one safe point seen, then none ever again */
    const char *src = fake_ptx(2, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "sim", src, strlen(src), NULL), 0);
    WAIT_FOR(hk_module_version(rt, "sim") == 2);
    /* The event follows the commit, on the worker, after swap_lock. */
    WAIT_FOR(events[HK_EVENT_COMMITTED] == 2);
    ck_assert_int_eq(events[HK_EVENT_COMMITTED], 2);
}
END_TEST

/* Destroy while the GPU never finishes: it returns after destroy_wait_ms,
 * and the reclaim thread releases everything once the GPU does. */
/* The reclaim work that outlives destroy (here the pass that was held in
 * its synchronise, then the final one) never calls the program's callbacks:
 * the program may have freed what they use once destroy returned. Its
 * unloads here are slow (5 ms, longer than the launch hold), which a running
 * runtime would log, and each would be a RECLAIMED event. */
START_TEST(destroy_is_bounded) {
    hk_runtime_destroy(rt);
    hk_options o;
    hk_options_init(&o);
    o.destroy_wait_ms = 200;
    o.loader = HK_LOADER_MODULE; /* the loader that synchronises */
    rt = make_rt_with(&o);
    atomic_store(&gate_msgs, 0);
    ck_assert_int_eq(hk_runtime_set_log(rt, on_gate_log, NULL, HK_LOG_INFO), 0);
    fake_hold_sync(1);
    swap_ok(fake_ptx(1, 0, 0, 0));
    swap_ok(fake_ptx(2, 0, 0, 0));
    fake_wait_sync_held();
    hk_runtime_destroy(rt); /* returns */
    rt = NULL;
    ck_assert_int_ge(fake_live_images(), 1);
    int before = atomic_load(&gate_msgs), reclaimed = atomic_load(&events[HK_EVENT_RECLAIMED]);
    fake_set_unload_us(5000);
    fake_hold_sync(0);
    WAIT_FOR(fake_live_images() == 0);
    usleep(20 * 1000); /* the thread's last steps after its unloads */
    fake_set_unload_us(0);
    ck_assert_msg(atomic_load(&gate_msgs) == before, "logged after destroy: %s", gate_msg);
    ck_assert_int_eq(atomic_load(&events[HK_EVENT_RECLAIMED]), reclaimed);
}
END_TEST

static _Atomic int destroyed;

static void *launch_once(void *arg) {
    int out = -1;
    launch_on(arg, NULL, &out);
    atomic_store(&destroyed, 1);
    return NULL;
}

static void *destroy_thread(void *arg) {
    hk_runtime_destroy(arg);
    return NULL;
}

static void *destroy_and_flag(void *arg) {
    hk_runtime_destroy(arg);
    atomic_store(&destroyed, 1);
    return NULL;
}

/* Reset recovery (module loader) holds a module's version on the reclaim
 * thread, about to reload it, while destroy runs: the version is retired
 * once, not by both (a retired list that loops makes the final pass spin
 * for ever and the runtime is never freed), everything is unloaded, and the
 * CONTEXT_RESET of that recovery, which ends after destroy began, reaches
 * no callback. */
START_TEST(reset_recovery_during_destroy) {
    hk_runtime_destroy(rt);
    hk_options o;
    hk_options_init(&o);
    o.loader = HK_LOADER_MODULE;
    o.destroy_wait_ms = 200;
    rt = make_rt_with(&o);
    swap_ok(fake_ptx(1, 0, 0, 0));
    (void)step_kernel();
    swap_ok(fake_ptx(2, 0, 0, 0));
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    hook_arm(HKL_HOOK_RESET_RELOAD, NULL);
    fake_reset_device(0);
    atomic_store(&rt->reset.suspect, 1);
    hkl_reclaim_kick(rt);
    hook_wait_inside(); /* recovery read version 2 and holds it */
    int loads = fake_calls("cuModuleLoadDataEx");
    pthread_t t;
    pthread_create(&t, NULL, destroy_thread, rt);
    usleep(400 * 1000); /* longer than destroy_wait_ms */
    hook_go();
    pthread_join(t, NULL);
    rt = NULL;
    WAIT_FOR(fake_calls("cuModuleLoadDataEx") == loads + 1); /* the reload */
    WAIT_FOR(fake_live_images() == 0);
    ck_assert_int_eq(fake_bad_unloads(), 0);
    usleep(20 * 1000); /* the reclaim thread's last steps */
    ck_assert_int_eq(atomic_load(&events[HK_EVENT_CONTEXT_RESET]), 0);
}
END_TEST

/* The reclaim thread's periodic reset check holds swap_lock while it calls
 * the driver, for as long as the driver takes (here held until the test lets
 * it go): destroy still returns within destroy_wait_ms, and the reclaim
 * thread, once its call returns, retires and unloads every version and frees
 * the runtime. */
START_TEST(destroy_does_not_wait_for_the_reset_check) {
    hk_runtime_destroy(rt);
    hk_options o;
    hk_options_init(&o);
    o.loader = HK_LOADER_MODULE;
    o.destroy_wait_ms = 300;
    rt = make_rt_with(&o);
    swap_ok(fake_ptx(1, 0, 0, 0));
    (void)step_kernel();
    fake_hold_ctx_state(1);
    hkl_reclaim_kick(rt);
    fake_wait_ctx_state_held(); /* the reset check, swap_lock held, in the driver */
    atomic_store(&destroyed, 0);
    pthread_t t;
    pthread_create(&t, NULL, destroy_and_flag, rt);
    WAIT_FOR(atomic_load(&destroyed)); /* before the driver's call returns */
    pthread_join(t, NULL);
    rt = NULL;
    ck_assert_int_ge(fake_live_images(), 1); /* the reclaim thread has the rest */
    fake_hold_ctx_state(0);
    WAIT_FOR(fake_live_images() == 0);
    ck_assert_int_eq(fake_bad_unloads(), 0);
    usleep(200 * 1000); /* the reclaim thread's last steps: it frees the runtime */
}
END_TEST

/* Reset recovery with the module loader reloads under swap_lock: a destroy
 * that starts while it is held there returns within destroy_wait_ms, before
 * the reload ends, and the reloaded version is unloaded after. */
START_TEST(destroy_does_not_wait_for_reset_recovery) {
    hk_runtime_destroy(rt);
    hk_options o;
    hk_options_init(&o);
    o.loader = HK_LOADER_MODULE;
    o.destroy_wait_ms = 200;
    rt = make_rt_with(&o);
    swap_ok(fake_ptx(1, 0, 0, 0));
    (void)step_kernel();
    hook_arm(HKL_HOOK_RESET_RELOAD, NULL);
    fake_reset_device(0);
    atomic_store(&rt->reset.suspect, 1);
    hkl_reclaim_kick(rt);
    hook_wait_inside();
    int loads = fake_calls("cuModuleLoadDataEx");
    atomic_store(&destroyed, 0);
    pthread_t t;
    pthread_create(&t, NULL, destroy_and_flag, rt);
    WAIT_FOR(atomic_load(&destroyed)); /* the recovery is still held */
    pthread_join(t, NULL);
    rt = NULL;
    hook_go();
    WAIT_FOR(fake_calls("cuModuleLoadDataEx") == loads + 1);
    WAIT_FOR(fake_live_images() == 0);
    ck_assert_int_eq(fake_bad_unloads(), 0);
    usleep(200 * 1000); /* the reclaim thread's last steps: it frees the runtime */
    ck_assert_int_eq(atomic_load(&events[HK_EVENT_CONTEXT_RESET]), 0);
}
END_TEST

/* Destroy while a build holds the worker (NVRTC cannot be interrupted; here
 * a hook holds it): destroy returns within destroy_wait_ms, and the worker
 * finishes the teardown when its build returns, committing nothing and
 * calling no callback. */
START_TEST(destroy_does_not_wait_for_a_build) {
    hk_runtime_destroy(rt);
    hk_options o;
    hk_options_init(&o);
    o.destroy_wait_ms = 100;
    rt = make_rt_with(&o);
    swap_ok(fake_ptx(1, 0, 0, 0));
    hook_arm(HKL_HOOK_BUILT, NULL);
    const char *src = fake_ptx(2, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "sim", src, strlen(src), NULL), 0);
    hook_wait_inside();
    int committed = atomic_load(&events[HK_EVENT_COMMITTED]);
    atomic_store(&destroyed, 0);
    pthread_t t;
    pthread_create(&t, NULL, destroy_and_flag, rt);
    WAIT_FOR(atomic_load(&destroyed));
    pthread_join(t, NULL);
    rt = NULL;
    ck_assert_int_ge(fake_live_images(), 1); /* the worker still has the runtime */
    hook_go();
    WAIT_FOR(fake_live_images() == 0);
    usleep(20 * 1000);
    ck_assert_int_eq(atomic_load(&events[HK_EVENT_COMMITTED]), committed);
}
END_TEST

/* The wall clock as hotkern's code reads it can be stepped: this binary is
 * linked with --wrap=clock_gettime (Makefile). */
int __real_clock_gettime(clockid_t c, struct timespec *ts);
int __wrap_clock_gettime(clockid_t c, struct timespec *ts);
static _Atomic long wall_step_s;

int __wrap_clock_gettime(clockid_t c, struct timespec *ts) {
    int r = __real_clock_gettime(c, ts);
    if (r == 0 && c == CLOCK_REALTIME)
        ts->tv_sec += atomic_load(&wall_step_s);
    return r;
}

static void *swap_for_safe_point(void *arg) {
    (void)arg;
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_AT_SAFE_POINT;
    hk_report rep = HK_REPORT_INIT;
    const char *src = fake_ptx(2, 0, 0, 0);
    intptr_t err = hk_swap(rt, "sim", src, strlen(src), &so, &rep);
    hk_report_clear(&rep);
    atomic_store(&destroyed, 1);
    return (void *)err;
}

/* Timed waits run on the monotonic clock: with the wall clock stepped an
 * hour ahead, a swap waiting for a safe point that never comes still stages
 * itself after safe_point_wait_ms, and a launch at a closed gate still goes
 * on after launch_hold_max_us (deadlines on the wall clock would each be an
 * hour away). */
START_TEST(waits_ignore_wall_clock_steps) {
    hk_runtime_destroy(rt);
    hk_options o;
    hk_options_init(&o);
    o.safe_point_wait_ms = 100;
    o.launch_hold_max_us = 20000;
    rt = make_rt_with(&o);
    swap_ok(fake_ptx(1, 0, 0, 0));
    hk_kernel *k = step_kernel();
    atomic_store(&wall_step_s, 3600);
    atomic_store(&destroyed, 0);
    pthread_t t;
    pthread_create(&t, NULL, swap_for_safe_point, NULL);
    WAIT_FOR(atomic_load(&destroyed));
    void *err;
    pthread_join(t, &err);
    ck_assert_int_eq((intptr_t)err, 0);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 2);

    swap_ok(fake_ptx(1, 0, 0, 0)); /* the held swap below brings tag 2 again */
    hook_arm(HKL_HOOK_GATED, NULL);
    pthread_create(&t, NULL, swap_tag2, NULL);
    hook_wait_inside(); /* the gate is closed and stays so */
    atomic_store(&destroyed, 0);
    pthread_t l;
    pthread_create(&l, NULL, launch_once, k);
    WAIT_FOR(atomic_load(&destroyed));
    pthread_join(l, NULL);
    hook_go();
    pthread_join(t, NULL);
    atomic_store(&wall_step_s, 0);
}
END_TEST

/* A swap that waited for another one says so: its report accounts for the
 * whole call. */
static int slow_check(const char *module, uint64_t version, void *ud, char *msg, size_t n) {
    usleep(200 * 1000);
    return 0;
}

static void *slow_swap(void *arg) {
    (void)arg;
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.check = slow_check;
    const char *src = fake_ptx(5, 0, 0, 0);
    return (void *)(intptr_t)hk_swap(rt, "other", src, strlen(src), &so, NULL);
}

START_TEST(report_accounts_for_waiting) {
    swap_ok(fake_ptx(1, 0, 0, 0));
    hook_arm(HKL_HOOK_GATED, NULL);
    pthread_t t;
    pthread_create(&t, NULL, slow_swap, NULL);
    hook_wait_inside(); /* it holds the swap lock */
    hook_go();
    hk_report rep = HK_REPORT_INIT;
    const char *src = fake_ptx(2, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), NULL, &rep), 0);
    pthread_join(t, NULL);
    double parts = rep.build_ms + rep.stage_ms + rep.commit_ms + rep.wait_ms;
    ck_assert_msg(rep.total_ms >= 150, "total %.1f ms: the 200 ms wait is missing", rep.total_ms);
    ck_assert_msg(parts > rep.total_ms - 0.01 && parts < rep.total_ms + 0.01,
                  "parts %.3f ms, total %.3f ms", parts, rep.total_ms);
    ck_assert_msg(rep.wait_ms >= 100, "wait %.1f ms", rep.wait_ms);
    hk_report_clear(&rep);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("engine under load (fake driver)");
    TCase *tc = tcase_create("load");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, swaps_finish_under_continuous_launches);
    tcase_add_test(tc, refusals_finish_under_continuous_launches);
    tcase_add_test(tc, launch_wait_at_gate_is_bounded);
    tcase_add_test(tc, captured_graph_keeps_its_version);
    tcase_add_test(tc, captured_graph_may_outlive_runtime);
    tcase_add_test(tc, global_capture_is_never_broken);
    tcase_add_test(tc, failed_unload_is_retried_not_counted);
    tcase_add_test(tc, batched_unloads_open_the_gate_between_versions);
    tcase_add_test(tc, refused_synchronise_unloads_nothing);
    tcase_add_test(tc, graph_launches_do_not_starve_commits);
    tcase_add_test(tc, callbacks_may_call_back);
    tcase_add_test(tc, pin_released_mid_pass_is_fenced);
    tcase_add_test(tc, module_unload_never_crosses_a_reset);
    tcase_add_test(tc, retire_during_pass_is_not_delayed);
    tcase_add_test(tc, context_read_during_reset);
    tcase_add_test(tc, safe_point_never_waits_for_the_gpu);
    tcase_add_test(tc, submission_does_not_wait_for_ever);
    tcase_add_test(tc, destroy_is_bounded);
    tcase_add_test(tc, reset_recovery_during_destroy);
    tcase_add_test(tc, destroy_does_not_wait_for_a_build);
    tcase_add_test(tc, destroy_does_not_wait_for_the_reset_check);
    tcase_add_test(tc, destroy_does_not_wait_for_reset_recovery);
    tcase_add_test(tc, waits_ignore_wall_clock_steps);
    tcase_add_test(tc, report_accounts_for_waiting);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

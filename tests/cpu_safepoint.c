/*
 * Automatic safe points (interpose/sync.c, the engine's hkl_auto_safe_points)
 * on the fake driver: the program's runtime is a table of fake functions
 * whose stream queries the test answers, so "a kernel in flight on stream
 * B" is B answering cudaErrorNotReady. Checked: a built version waits while
 * any stream the program launched on is busy, even at a synchronisation
 * that shows another stream idle, and is uploaded at the first one that
 * finds them all idle; every kind of interposed synchronisation brings one;
 * other threads' per-thread streams count; a capturing stream is never
 * asked; a destroyed stream leaves the list; with no idle moment the
 * version stages after safe_point_wait_ms anyway; unloads of replaced
 * versions wait for an idle moment too, also bounded; with nothing
 * pending a synchronisation is forwarded and nothing else happens. None of
 * this is GPU evidence (bench/bench_frame_stall.cu is).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hotkern/interpose.h"
#include "interpose/interpose.h"
#include "loader/core.h"

#include "tests/fakecuda.h"
#include "tests/harness.h"

#define WAIT_FOR(cond)                                                                             \
    do {                                                                                           \
        int i_;                                                                                    \
        for (i_ = 0; i_ < 1000 && !(cond); i_++)                                                   \
            usleep(10 * 1000);                                                                     \
        ck_assert_msg(cond, "still not true after 10 s: %s", #cond);                               \
    } while (0)

static hk_runtime *rt;

/* ---- the program's runtime, faked ---------------------------------------- */

static cudaStream_t A = (cudaStream_t)0xa000, B = (cudaStream_t)0xb000;
static _Atomic int b_busy;                      /* B answers cudaErrorNotReady */
static _Atomic int legacy_busy, legacy_queries; /* the legacy stream's */
static _Atomic int queries, b_queries, forwarded;
static _Atomic(cudaStream_t) capturing_stream; /* asked while capturing: counted */
static _Atomic int capturing_asked;
static _Atomic(cudaStream_t) destroyed;
static _Atomic int asked_destroyed;

static cudaError_t f_klaunch(cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) {
    CUstream cs = s == A || s == B ? NULL : (CUstream)s; /* the fake's streams */
    return (cudaError_t)fake_driver()->LaunchKernel((CUfunction)k, g.x, g.y, g.z, b.x, b.y, b.z,
                                                    (unsigned)sh, cs, a, NULL);
}

static cudaError_t f_query(cudaStream_t s) {
    atomic_fetch_add(&queries, 1);
    if (s && s == atomic_load(&capturing_stream))
        atomic_fetch_add(&capturing_asked, 1);
    if (s && s == atomic_load(&destroyed))
        atomic_fetch_add(&asked_destroyed, 1);
    if (s == cudaStreamLegacy) {
        atomic_fetch_add(&legacy_queries, 1);
        if (atomic_load(&legacy_busy))
            return cudaErrorNotReady;
    }
    if (s == B) {
        atomic_fetch_add(&b_queries, 1);
        if (atomic_load(&b_busy))
            return cudaErrorNotReady;
    }
    return cudaSuccess;
}

static cudaError_t f_stream(cudaStream_t s) {
    atomic_fetch_add(&forwarded, 1);
    return cudaSuccess;
}
static cudaError_t f_stream_query(cudaStream_t s) {
    atomic_fetch_add(&forwarded, 1);
    return f_query(s);
}
static cudaError_t f_device(void) {
    atomic_fetch_add(&forwarded, 1);
    return cudaSuccess;
}
static cudaError_t f_event(cudaEvent_t e) {
    atomic_fetch_add(&forwarded, 1);
    return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
static cudaError_t f_memcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    atomic_fetch_add(&forwarded, 1);
    memcpy(dst, src, n);
    return cudaSuccess;
}
static cudaError_t f_destroy(cudaStream_t s) {
    atomic_fetch_add(&forwarded, 1);
    return cudaSuccess;
}

static const hki_real fake_real = {
    .klaunch = f_klaunch,
    .klaunch_ptsz = f_klaunch,
    .memcpy = f_memcpy,
    .sync = {.device = f_device,
             .stream = f_stream,
             .stream_ptsz = f_stream,
             .query = f_stream_query,
             .query_ptsz = f_stream_query,
             .event = f_event,
             .event_query = f_event,
             .memcpy_ptds = f_memcpy,
             .stream_destroy = f_destroy},
};

/* The idle check asks through the runtime's table (query); the program's
 * own cudaStreamQuery calls go through hki_stream_query. Both are f_query
 * here, so `queries` counts both; `forwarded` only the program's calls. */

/* ---- setup ---------------------------------------------------------------- */

static cudaKernel_t prog;
static _Atomic int infos;
static char last_info[512];
static pthread_mutex_t info_lock = PTHREAD_MUTEX_INITIALIZER;

static void on_log(hk_log_level level, const char *sub, const char *msg, void *ud) {
    if (level < HK_LOG_INFO || !strstr(msg, "safe point"))
        return;
    pthread_mutex_lock(&info_lock);
    snprintf(last_info, sizeof last_info, "%s", msg);
    pthread_mutex_unlock(&info_lock);
    atomic_fetch_add(&infos, 1);
}

static int info_says(const char *what) {
    pthread_mutex_lock(&info_lock);
    int yes = strstr(last_info, what) != NULL;
    pthread_mutex_unlock(&info_lock);
    return yes;
}

static void make_rt(int wait_ms) {
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.no_warm_start = 1;
    o.safe_point_wait_ms = wait_ms;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&rt, &o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_INFO), 0);
    fake_driver()->CtxSetCurrent(hkl_ctx(rt, 0));
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    CUlibrary lib;
    CUkernel k;
    const hkb_driver *d = fake_driver();
    ck_assert_int_eq(d->LibraryLoadData(&lib, fake_ptx(1, 0, 0, 0), NULL, NULL, 0, NULL, NULL, 0),
                     0);
    ck_assert_int_eq(d->LibraryGetKernel(&k, lib, "step"), 0);
    prog = (cudaKernel_t)k;
}

static void setup_with(int wait_ms) {
    fake_init(1, 90);
    hki_real_set(&fake_real);
    make_rt(wait_ms);
}

/* A bound far away: nothing stages by it. */
static void setup(void) {
    unsetenv("HOTKERN_AUTO_SAFE_POINTS");
    setup_with(60000);
}

static void setup_short(void) {
    unsetenv("HOTKERN_AUTO_SAFE_POINTS");
    setup_with(300);
}

static void setup_off(void) {
    setenv("HOTKERN_AUTO_SAFE_POINTS", "0", 1);
    setup_with(60000);
}

static void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
}

/* One <<<>>> launch of the program's kernel on stream s (ptsz: through the
 * _ptsz entry); returns the tag of the code that ran. */
static int launch_on(int ptsz, cudaStream_t s) {
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    ck_assert_int_eq(hki_klaunch(ptsz, prog, g, b, args, 0, s), cudaSuccess);
    return out;
}

/* Submits version `tag` of module sim and waits for its build: it then
 * waits for a safe point. */
static void submit_built(int tag) {
    const char *src = fake_ptx(tag, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "sim", src, strlen(src), NULL), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 10000), 0);
}

static uint64_t version(void) {
    return hk_module_version(rt, "sim");
}

/* Versions replaced and waiting for a safe point to be unloaded. */
static int unloads_waiting(void) {
    pthread_mutex_lock(&rt->rec.lock);
    int n = 0;
    for (hkl_version *v = rt->rec.unload_ready; v; v = v->next)
        n++;
    pthread_mutex_unlock(&rt->rec.lock);
    return n;
}

/* ---- tests ------------------------------------------------------------------ */

/* The 100 ms kernel on another stream: a synchronisation of A says A is
 * idle, not B. The version waits; the first synchronisation that finds
 * every stream idle uploads it, on the program's thread. */
START_TEST(busy_stream_keeps_the_upload_waiting) {
    ck_assert_int_eq(launch_on(0, A), 1);
    ck_assert_int_eq(launch_on(0, B), 1);
    atomic_store(&b_busy, 1);
    int loads = fake_calls("cuLibraryLoadData");
    submit_built(2);
    ck_assert_uint_eq(version(), 0); /* built, not uploaded */
    ck_assert_int_eq(fake_calls("cuLibraryLoadData"), loads);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
        ck_assert_uint_eq(version(), 0);
    }
    ck_assert_int_gt(atomic_load(&b_queries), 0); /* B was asked, and said busy */
    ck_assert_int_eq(fake_calls("cuLibraryLoadData"), loads);
    atomic_store(&b_busy, 0);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_uint_eq(version(), 1); /* uploaded inside that call */
    ck_assert_int_eq(fake_calls("cuLibraryLoadData"), loads + 1);
    ck_assert_int_eq(launch_on(0, A), 2);
    /* The program never launched on the legacy stream: it was never asked
     * (a question to it would break a blocking stream's capture). */
    ck_assert_int_eq(atomic_load(&legacy_queries), 0);
}
END_TEST

/* Launches on stream 0 go to the legacy stream: it is asked too. */
START_TEST(legacy_stream_counts_once_used) {
    ck_assert_int_eq(launch_on(0, A), 1);
    ck_assert_int_eq(launch_on(0, NULL), 1);
    atomic_store(&legacy_busy, 1);
    submit_built(2);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_uint_eq(version(), 0);
    ck_assert_int_gt(atomic_load(&legacy_queries), 0);
    atomic_store(&legacy_busy, 0);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_uint_eq(version(), 1);
}
END_TEST

/* Each kind of interposed synchronisation that succeeds brings a safe
 * point when everything is idle; one that fails brings none. */
START_TEST(every_synchronisation_brings_a_safe_point) {
    ck_assert_int_eq(launch_on(0, A), 1);
    int out = 0;
    for (int kind = 0; kind < 9; kind++) {
        submit_built(2 + kind);
        uint64_t before = version();
        cudaError_t e = cudaSuccess;
        switch (kind) {
        case 0:
            e = hki_device_sync();
            break;
        case 1:
            e = hki_stream_sync(0, A);
            break;
        case 2:
            e = hki_stream_sync(1, NULL);
            break;
        case 3:
            e = hki_stream_query(0, A);
            break;
        case 4:
            e = hki_stream_query(1, NULL);
            break;
        case 5:
            e = hki_event_sync((cudaEvent_t)&out);
            break;
        case 6:
            e = hki_event_query((cudaEvent_t)&out);
            break;
        case 7:
            e = hki_memcpy(0, &out, &kind, sizeof kind, cudaMemcpyHostToHost);
            break;
        case 8:
            e = hki_memcpy(1, &out, &kind, sizeof kind, cudaMemcpyHostToHost);
            break;
        }
        ck_assert_int_eq(e, cudaSuccess);
        ck_assert_msg(version() == before + 1, "kind %d: version %llu, not %llu", kind,
                      (unsigned long long)version(), (unsigned long long)before + 1);
    }
    /* A failed event synchronisation (the fake fails a NULL event). */
    submit_built(20);
    uint64_t before = version();
    ck_assert_int_eq(hki_event_sync(NULL), cudaErrorInvalidResourceHandle);
    ck_assert_uint_eq(version(), before);
}
END_TEST

/* With nothing waiting, each synchronisation is forwarded once and nothing
 * else happens: no stream is asked, no driver call is made. */
START_TEST(nothing_pending_only_forwards) {
    ck_assert_int_eq(launch_on(0, A), 1);
    ck_assert_int_eq(launch_on(0, B), 1);
    ck_assert_int_eq(atomic_load(&rt->sp.wanted), 0);
    int capq = fake_calls("cuStreamIsCapturing"), out = 0;
    atomic_store(&forwarded, 0);
    atomic_store(&queries, 0);
    ck_assert_int_eq(hki_device_sync(), cudaSuccess);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_int_eq(hki_stream_sync(1, NULL), cudaSuccess);
    ck_assert_int_eq(hki_event_sync((cudaEvent_t)&out), cudaSuccess);
    ck_assert_int_eq(hki_event_query((cudaEvent_t)&out), cudaSuccess);
    ck_assert_int_eq(hki_memcpy(0, &out, &capq, sizeof out, cudaMemcpyHostToHost), cudaSuccess);
    ck_assert_int_eq(atomic_load(&forwarded), 6);
    ck_assert_int_eq(atomic_load(&queries), 0);
    ck_assert_int_eq(hki_stream_query(0, B), cudaSuccess);
    ck_assert_int_eq(atomic_load(&forwarded), 7);
    ck_assert_int_eq(atomic_load(&queries), 1); /* the program's own query, only */
    ck_assert_int_eq(fake_calls("cuStreamIsCapturing"), capq);
    ck_assert_int_eq(out, capq); /* the copy was made */
}
END_TEST

/* No idle moment ever: the version stages anyway once safe_point_wait_ms
 * has passed, and says so. */
START_TEST(no_idle_moment_stages_after_the_bound) {
    ck_assert_int_eq(launch_on(0, B), 1);
    atomic_store(&b_busy, 1);
    double t0 = hkl_now_ms();
    submit_built(2);
    WAIT_FOR(version() == 1);
    ck_assert_double_ge(hkl_now_ms() - t0, 300); /* not before the bound */
    ck_assert_msg(info_says("no safe point within 300 ms"), "logged: %s", last_info);
}
END_TEST

/* A replaced version is unloaded at an idle moment, not while B is busy. */
START_TEST(unload_waits_for_an_idle_moment) {
    ck_assert_int_eq(launch_on(0, A), 1);
    ck_assert_int_eq(launch_on(0, B), 1);
    submit_built(2);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess); /* all idle: v1 */
    ck_assert_uint_eq(version(), 1);
    int live = fake_live_images();
    submit_built(3);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess); /* all idle: v2, v1 replaced */
    ck_assert_uint_eq(version(), 2);
    atomic_store(&b_busy, 1);
    /* The reclaim thread finds v1 unreachable; it then waits for a safe
     * point (or, without one, would be unloaded by that thread now). */
    WAIT_FOR(unloads_waiting() == 1 || fake_live_images() < live + 1);
    ck_assert_int_eq(fake_live_images(), live + 1);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_int_eq(fake_live_images(), live + 1); /* B busy: still loaded */
    ck_assert_int_eq(unloads_waiting(), 1);
    atomic_store(&b_busy, 0);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_int_eq(fake_live_images(), live); /* unloaded inside that call */
    ck_assert_int_eq(unloads_waiting(), 0);
    ck_assert_int_eq(atomic_load(&rt->sp.wanted), 0);
}
END_TEST

/* With no idle moment, the reclaim thread unloads it after the bound. */
START_TEST(unload_without_idle_moment_after_the_bound) {
    ck_assert_int_eq(launch_on(0, A), 1);
    ck_assert_int_eq(launch_on(0, B), 1);
    submit_built(2);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    int live = fake_live_images();
    submit_built(3);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_uint_eq(version(), 2);
    atomic_store(&b_busy, 1);
    WAIT_FOR(unloads_waiting() == 1 || fake_live_images() < live + 1);
    ck_assert_int_eq(unloads_waiting(), 1);
    WAIT_FOR(fake_live_images() == live);
    ck_assert_msg(info_says("waited 300 ms (safe_point_wait_ms) for a safe point"), "logged: %s",
                  last_info);
}
END_TEST

/* A stream being captured is never asked (the question would invalidate
 * its capture): it counts as busy until the capture ends. */
START_TEST(capturing_stream_is_not_asked) {
    CUstream c;
    ck_assert_int_eq(fake_driver()->StreamCreate(&c, 0), 0);
    ck_assert_int_eq(launch_on(0, A), 1);
    ck_assert_int_eq(launch_on(0, (cudaStream_t)c), 1);
    submit_built(2);
    atomic_store(&capturing_stream, (cudaStream_t)c);
    fake_capture_begin(c, CU_STREAM_CAPTURE_MODE_GLOBAL);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_uint_eq(version(), 0);
    ck_assert_int_eq(atomic_load(&capturing_asked), 0);
    CUgraph g;
    ck_assert_int_eq(fake_capture_end(c, &g), CUDA_SUCCESS); /* not invalidated */
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_uint_eq(version(), 1);
    ck_assert_int_gt(atomic_load(&capturing_asked), 0); /* asked once it was done */
}
END_TEST

/* A destroyed stream leaves the list: it is never asked again, and no
 * longer keeps the moment from being idle. */
START_TEST(destroyed_stream_leaves_the_list) {
    ck_assert_int_eq(launch_on(0, A), 1);
    ck_assert_int_eq(launch_on(0, B), 1);
    atomic_store(&b_busy, 1);
    submit_built(2);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_uint_eq(version(), 0);
    atomic_store(&forwarded, 0);
    ck_assert_int_eq(hki_stream_destroy(B), cudaSuccess);
    ck_assert_int_eq(atomic_load(&forwarded), 1);
    atomic_store(&destroyed, B);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_uint_eq(version(), 1);
    ck_assert_int_eq(atomic_load(&asked_destroyed), 0);
}
END_TEST

/* Another thread's per-thread default stream cannot be asked from here: it
 * counts as busy from its launch until that thread sees it idle, or until a
 * cudaDeviceSynchronize begun after the launch returns. */
static pthread_mutex_t step_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t step_cond = PTHREAD_COND_INITIALIZER;
static int step_want, step_done;

static void step_to(int n) { /* main: tell the thread to do step n, wait for it */
    pthread_mutex_lock(&step_lock);
    step_want = n;
    pthread_cond_broadcast(&step_cond);
    while (step_done < n)
        pthread_cond_wait(&step_cond, &step_lock);
    pthread_mutex_unlock(&step_lock);
}

static int step_wait(int n) { /* thread: wait for step n */
    pthread_mutex_lock(&step_lock);
    while (step_want < n)
        pthread_cond_wait(&step_cond, &step_lock);
    pthread_mutex_unlock(&step_lock);
    return n;
}

static void step_finish(int n) {
    pthread_mutex_lock(&step_lock);
    step_done = n;
    pthread_cond_broadcast(&step_cond);
    pthread_mutex_unlock(&step_lock);
}

static void *ptds_thread(void *arg) {
    fake_driver()->CtxSetCurrent(hkl_ctx(rt, 0));
    step_wait(1);
    launch_on(1, NULL); /* its per-thread default stream */
    step_finish(1);
    step_wait(2);
    hki_stream_sync(1, NULL); /* it sees its own stream idle */
    step_finish(2);
    step_wait(3);
    launch_on(1, NULL);
    step_finish(3);
    step_wait(4);
    step_finish(4);
    return NULL;
}

START_TEST(other_threads_per_thread_streams_count) {
    ck_assert_int_eq(launch_on(0, A), 1);
    pthread_t t;
    pthread_create(&t, NULL, ptds_thread, NULL);
    step_to(1);
    submit_built(2);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_uint_eq(version(), 0); /* its launch may still run */
    step_to(2);                      /* its own synchronisation: idle */
    ck_assert_uint_eq(version(), 1);
    step_to(3); /* it launches again */
    submit_built(3);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    ck_assert_uint_eq(version(), 1);
    ck_assert_int_eq(hki_device_sync(), cudaSuccess); /* every stream finished */
    ck_assert_uint_eq(version(), 2);
    step_to(4);
    pthread_join(t, NULL);
}
END_TEST

/* A synchronous hk_swap from the program's thread stages at once, as
 * before (it would wait for itself); one from a thread that never launched
 * nor synchronised (a network endpoint's, say) waits for an idle moment. */
static void *swap_elsewhere(void *arg) {
    const char *src = fake_ptx(3, 0, 0, 0);
    hk_report rep = HK_REPORT_INIT;
    intptr_t err = hk_swap(rt, "sim", src, strlen(src), NULL, &rep);
    hk_report_clear(&rep);
    return (void *)err;
}

static int jobs_pending(void) {
    pthread_mutex_lock(&rt->work.lock);
    int n = rt->work.pending != NULL;
    pthread_mutex_unlock(&rt->work.lock);
    return n;
}

START_TEST(swap_waits_unless_from_the_program_thread) {
    ck_assert_int_eq(launch_on(0, A), 1);
    ck_assert_int_eq(launch_on(0, B), 1);
    atomic_store(&b_busy, 1);
    const char *src = fake_ptx(2, 0, 0, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), NULL, &rep), 0);
    hk_report_clear(&rep);
    ck_assert_uint_eq(version(), 1); /* at once, B busy or not */
    pthread_t t;
    pthread_create(&t, NULL, swap_elsewhere, NULL);
    WAIT_FOR(jobs_pending() || version() == 2);
    ck_assert_uint_eq(version(), 1);
    atomic_store(&b_busy, 0);
    ck_assert_int_eq(hki_stream_sync(0, A), cudaSuccess);
    void *err;
    pthread_join(t, &err);
    ck_assert_int_eq((intptr_t)err, 0);
    ck_assert_uint_eq(version(), 2);
}
END_TEST

/* A swap that asks for its driver work now (HK_STAGE_NOW) has the version
 * it replaced unloaded as soon as it can be, idle moment or not. */
START_TEST(stage_now_swap_unloads_at_once) {
    ck_assert_int_eq(launch_on(0, B), 1);
    atomic_store(&b_busy, 1);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_NOW;
    hk_report rep = HK_REPORT_INIT;
    int live = fake_live_images();
    for (int tag = 2; tag <= 3; tag++) {
        const char *src = fake_ptx(tag, 0, 0, 0);
        ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), &so, &rep), 0);
    }
    hk_report_clear(&rep);
    ck_assert_uint_eq(version(), 2);
    WAIT_FOR(fake_live_images() == live + 1); /* the first one gone, B busy */
    ck_assert_int_eq(unloads_waiting(), 0);
}
END_TEST

/* HOTKERN_AUTO_SAFE_POINTS=0: versions stage when built, as before. */
START_TEST(auto_safe_points_can_be_turned_off) {
    ck_assert_int_eq(launch_on(0, B), 1);
    atomic_store(&b_busy, 1);
    submit_built(2);
    ck_assert_uint_eq(version(), 1);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("automatic safe points (fake driver)");
    TCase *tc = tcase_create("safepoint");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, busy_stream_keeps_the_upload_waiting);
    tcase_add_test(tc, legacy_stream_counts_once_used);
    tcase_add_test(tc, every_synchronisation_brings_a_safe_point);
    tcase_add_test(tc, nothing_pending_only_forwards);
    tcase_add_test(tc, unload_waits_for_an_idle_moment);
    tcase_add_test(tc, capturing_stream_is_not_asked);
    tcase_add_test(tc, destroyed_stream_leaves_the_list);
    tcase_add_test(tc, other_threads_per_thread_streams_count);
    tcase_add_test(tc, swap_waits_unless_from_the_program_thread);
    tcase_add_test(tc, stage_now_swap_unloads_at_once);
    suite_add_tcase(s, tc);
    TCase *bound = tcase_create("bound"); /* safe_point_wait_ms 300 */
    tcase_add_checked_fixture(bound, setup_short, teardown);
    tcase_set_timeout(bound, 60);
    tcase_add_test(bound, no_idle_moment_stages_after_the_bound);
    tcase_add_test(bound, unload_without_idle_moment_after_the_bound);
    suite_add_tcase(s, bound);
    TCase *off = tcase_create("off"); /* HOTKERN_AUTO_SAFE_POINTS=0 */
    tcase_add_checked_fixture(off, setup_off, teardown);
    tcase_add_test(off, auto_safe_points_can_be_turned_off);
    suite_add_tcase(s, off);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

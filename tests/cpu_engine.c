/*
 * The swap engine's logic on the fake driver: versions, validation and
 * refusals, globals, rollback, grace periods, pins, fault injection, resets,
 * graphs, several devices, and a concurrent launch/swap stress. None of this
 * is GPU evidence (the GPU suites are); it pins down the engine's decisions.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader/core.h"
#include "loader/source.h"
#include "loader/version.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

#define ptx fake_ptx

static hk_runtime *rt;
static int events[8];
static char last_event_msg[512];

static pthread_t reset_event_thread;

static void on_event(const hk_event *ev, void *ud) {
    (void)ud;
    events[ev->kind]++;
    if (ev->kind == HK_EVENT_CONTEXT_RESET)
        reset_event_thread = pthread_self();
    if (ev->report)
        snprintf(last_event_msg, sizeof last_event_msg, "%s", ev->report->message);
}

static hk_runtime *make_rt(int ndev, hk_loader loader) {
    fake_init(ndev, 90);
    memset(events, 0, sizeof events);
    hk_options o;
    hk_options_init(&o);
    int devs[4] = {0, 1, 2, 3};
    o.devices = devs;
    o.ndevices = ndev;
    o.loader = loader;
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.on_event = on_event;
    o.no_warm_start = 1; /* warm_start_runs_and_stops covers it */
    hk_runtime *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&r, &o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    return r;
}

static void setup(void) {
    rt = make_rt(1, HK_LOADER_LIBRARY);
}

static void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
    ck_assert_int_eq(fake_live_images(), 0); /* nothing leaked at destroy */
    ck_assert_int_eq(fake_violations(), 0);
}

/* Waits (5 s at most) until hotkern has handled n context resets. */
static void wait_resets(uint64_t n) {
    hk_stats st = HK_STATS_INIT;
    for (int i = 0; i < 500; i++) {
        hk_stats_get(rt, &st);
        if (st.context_resets >= n)
            return;
        usleep(10 * 1000);
    }
    ck_abort_msg("reset not handled within 5 s");
}

static int swap_src(const char *mod, const char *src, hk_report *rep) {
    return hk_swap(rt, mod, src, strlen(src), NULL, rep);
}

static void swap_ok(const char *mod, const char *src, hk_report *rep) {
    int err = swap_src(mod, src, rep);
    ck_assert_msg(err == 0, "swap refused: %s: %s", hk_strerror(err), rep->message);
}

static int launch_tag(hk_kernel *k) {
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    int cu = 0;
    int err = hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu);
    ck_assert_msg(err == 0, "launch failed: %d cu %d", err, cu);
    return out;
}

/* ---- basics ------------------------------------------------------------- */

START_TEST(no_driver_is_reported) {
    setenv("HK_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    hk_runtime *r = (hk_runtime *)1;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_runtime_create(&r, NULL, &rep), HK_ERR_NO_DRIVER);
    ck_assert_ptr_null(r);
    ck_assert_int_eq(rep.error, HK_ERR_NO_DRIVER);
    ck_assert_msg(strstr(rep.message, "no CUDA driver"), "message: %s", rep.message);
    /* The toolkit's stub library loads but cannot initialise: cuInit's error
     * is named. */
    if (access("/usr/local/cuda/lib64/stubs/libcuda.so", R_OK) == 0) {
        setenv("HK_LIBCUDA", "/usr/local/cuda/lib64/stubs/libcuda.so", 1);
        hk_report_clear(&rep);
        ck_assert_int_eq(hk_runtime_create(&r, NULL, &rep), HK_ERR_NO_DRIVER);
        ck_assert_msg(strstr(rep.message, "CUDA_ERROR") || strstr(rep.message, "lacks"),
                      "message: %s", rep.message);
    }
    unsetenv("HK_LIBCUDA");
    hk_report_clear(&rep);
}
END_TEST

START_TEST(error_strings_are_distinct) {
    for (int a = 0; a >= HK_ERR_ATTRIBUTE; a--) {
        ck_assert_str_ne(hk_strerror(a), "unknown error");
        for (int b = a - 1; b >= HK_ERR_ATTRIBUTE; b--)
            ck_assert_str_ne(hk_strerror(a), hk_strerror(b));
    }
    ck_assert_str_eq(hk_strerror(-9999), "unknown error");
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", HK_VERSION_MAJOR, HK_VERSION_MINOR, HK_VERSION_PATCH);
    ck_assert_str_eq(hk_version(), want);
    /* HK_VERSION_NUM is the same version, 0xMMmmpp, usable in #if. */
    unsigned major, minor, patch;
    ck_assert_int_eq(sscanf(hk_version(), "%u.%u.%u", &major, &minor, &patch), 3);
    ck_assert_uint_eq(HK_VERSION_NUM, major << 16 | minor << 8 | patch);
#if HK_VERSION_NUM < 0x010300 || HK_VERSION_NUM >= 0x020000
#error "HK_VERSION_NUM is not a 1.x version from 1.3 on"
#endif
    ck_assert_str_eq(hk_format_name(HK_FORMAT_PTX), "ptx");
}
END_TEST

START_TEST(argument_checks) {
    hk_kernel *k;
    ck_assert_int_eq(hk_swap(rt, NULL, "x", 1, NULL, NULL), HK_ERR_INVALID);
    ck_assert_int_eq(hk_swap(rt, "m", NULL, 1, NULL, NULL), HK_ERR_INVALID);
    ck_assert_int_eq(hk_swap(rt, "m", "x", 0, NULL, NULL), HK_ERR_INVALID);
    char longname[100];
    memset(longname, 'a', sizeof longname - 1);
    longname[99] = 0;
    ck_assert_int_eq(hk_swap(rt, longname, "x", 1, NULL, NULL), HK_ERR_INVALID);
    ck_assert_int_eq(hk_kernel_get(rt, "nomodule", "step", &k), HK_ERR_NOT_FOUND);
    ck_assert_int_eq(hk_kernel_get(NULL, "m", "step", &k), HK_ERR_INVALID);
    ck_assert_int_eq(hk_rollback(rt, "nomodule", NULL), HK_ERR_NOT_FOUND);
    hk_runtime_destroy(NULL);
    hk_report_clear(NULL);
    hk_unpin(NULL);
    /* Bad options. */
    hk_options o;
    hk_options_init(&o);
    o.jit_opt_level = 9;
    hk_runtime *r2;
    ck_assert_int_eq(hkl_runtime_create_with(&r2, &o, fake_driver(), NULL), HK_ERR_INVALID);
    hk_options_init(&o);
    int devs[2] = {0, 0};
    o.devices = devs;
    o.ndevices = 2;
    ck_assert_int_eq(hkl_runtime_create_with(&r2, &o, fake_driver(), NULL), HK_ERR_INVALID);
    devs[1] = 7;
    ck_assert_int_eq(hkl_runtime_create_with(&r2, &o, fake_driver(), NULL), HK_ERR_NO_DEVICE);
}
END_TEST

START_TEST(load_launch_swap_reclaim) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 0, 0), &rep);
    ck_assert_int_eq(rep.version, 1);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    hk_kernel *k, *k2;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k2), 0);
    ck_assert_ptr_eq(k, k2);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "nosuch", &k2), HK_ERR_NOT_FOUND);
    ck_assert_int_eq(launch_tag(k), 1);
    /* The code was uploaded to the context at staging (cuFuncLoad). */
    ck_assert_int_ge(fake_calls("cuFuncLoad"), 2);
    for (int i = 2; i <= 5; i++) {
        swap_ok("sim", ptx(i, 1, 0, 0), &rep);
        ck_assert_uint_eq(rep.version, (uint64_t)i);
        ck_assert_int_eq(launch_tag(k), i);
    }
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.swaps, 5);
    ck_assert_uint_eq(st.reclaimed, 4);
    ck_assert_uint_eq(st.live_versions, 1);
    ck_assert_int_eq(events[HK_EVENT_COMMITTED], 5);
    ck_assert_int_eq(events[HK_EVENT_RECLAIMED], 4);
    /* Libraries are unloaded without synchronising the context (the driver
     * keeps code alive for queued work; a synchronise would break other
     * threads' captures). */
    ck_assert_int_eq(fake_calls("cuCtxSynchronize"), 0);
    hk_report_clear(&rep);
}
END_TEST

/* ---- refusals ------------------------------------------------------------ */

static void assert_still(hk_kernel *k, int tag, uint64_t version) {
    ck_assert_int_eq(launch_tag(k), tag);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), version);
}

START_TEST(refusals_keep_old_version) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 0, 0), &rep);
    hk_kernel *k, *aux;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "aux", &aux), 0);

    /* A kernel in use removed. */
    ck_assert_int_eq(swap_src("sim", ptx(2, 0, 0, 0), &rep), HK_ERR_MISSING_KERNEL);
    ck_assert_str_eq(rep.kernel, "aux");
    ck_assert_msg(strstr(rep.message, "aux") && strstr(rep.message, "missing"), "%s", rep.message);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_NOT_FOUND");
    assert_still(k, 1, 1);

    /* A parameter's size changed. */
    ck_assert_int_eq(swap_src("sim", ptx(3, 1, 0, 1), &rep), HK_ERR_LAYOUT);
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_msg(strstr(rep.message, "parameter 1 was 4 bytes at offset 8, now 8 bytes"), "%s",
                  rep.message);
    assert_still(k, 1, 1);

    /* A parameter removed. */
    ck_assert_int_eq(swap_src("sim", ptx(4, 1, 0, 2), &rep), HK_ERR_LAYOUT);
    ck_assert_msg(strstr(rep.message, "had 2 parameters, now 1"), "%s", rep.message);
    assert_still(k, 1, 1);

    /* JIT error: the log names the line; the CUresult is named. */
    char bad[2048];
    snprintf(bad, sizeof bad, "%s\nSYNTAX ERROR\n", ptx(5, 1, 0, 0));
    ck_assert_int_eq(swap_src("sim", bad, &rep), HK_ERR_COMPILE);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_INVALID_PTX");
    ck_assert_ptr_nonnull(rep.log);
    ck_assert_msg(strstr(rep.log, "line 14"), "log: %s", rep.log);
    assert_still(k, 1, 1);

    /* Not a kernel at all. */
    ck_assert_int_eq(swap_src("sim", "\x7f\x45\x4c\x46garbage", &rep), HK_ERR_FORMAT);
    assert_still(k, 1, 1);

    /* Version numbers are not consumed by refusals. */
    swap_ok("sim", ptx(6, 1, 0, 0), &rep);
    ck_assert_uint_eq(rep.version, 2);
    ck_assert_int_eq(launch_tag(k), 6);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.refused, 5);
    ck_assert_int_eq(events[HK_EVENT_REFUSED], 5);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1); /* refused versions were unloaded */
    hk_report_clear(&rep);
}
END_TEST

START_TEST(layout_change_when_accepted) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.accept_layout_change = 1;
    const char *src = ptx(2, 1, 0, 1);
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), &so, &rep), 0);
    ck_assert_int_eq(launch_tag(k), 2);
    /* The accepted layout is the new reference. */
    ck_assert_int_eq(swap_src("sim", ptx(3, 1, 0, 0), &rep), HK_ERR_LAYOUT);
    swap_ok("sim", ptx(4, 1, 0, 1), &rep);
    hk_report_clear(&rep);
}
END_TEST

/* A layout required by the caller (hotkern.hpp, the <<<>>> interposition)
 * is checked now and holds for good: accept_layout_change cannot change it. */
START_TEST(required_layout_holds) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    /* step(u64 out, u32 n) */
    size_t off[] = {0, 8}, size[] = {8, 4}, bad_size[] = {8, 8};
    ck_assert_int_eq(hk_kernel_require_layout(k, off, bad_size, 2, &rep), HK_ERR_LAYOUT);
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_msg(strstr(rep.message, "parameter 1 was 8 bytes at offset 8, now 4 bytes"), "%s",
                  rep.message);
    ck_assert_int_eq(hk_kernel_require_layout(k, off, size, 1, &rep), HK_ERR_LAYOUT);
    ck_assert_int_eq(hk_kernel_require_layout(k, off, size, 2, &rep), 0);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.accept_layout_change = 1;
    const char *src = ptx(2, 1, 0, 1);
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), &so, &rep), HK_ERR_LAYOUT);
    ck_assert_msg(strstr(rep.message, "no version may change"), "%s", rep.message);
    ck_assert_int_eq(launch_tag(k), 1);
    swap_ok("sim", ptx(3, 1, 0, 0), &rep);
    ck_assert_int_eq(launch_tag(k), 3);
    ck_assert_int_eq(hk_kernel_require_layout(NULL, off, size, 2, &rep), HK_ERR_INVALID);
    hk_report_clear(&rep);
}
END_TEST

static int refuse_odd(const char *module, uint64_t version, void *ud, char *msg, size_t n) {
    (void)module;
    (void)ud;
    if (version % 2)
        return 0;
    snprintf(msg, n, "even versions are not allowed");
    return 1;
}

START_TEST(check_callback_refuses) {
    hk_report rep = HK_REPORT_INIT;
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.check = refuse_odd;
    const char *a = ptx(1, 0, 0, 0), *b = ptx(2, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "sim", a, strlen(a), &so, &rep), 0);
    ck_assert_int_eq(hk_swap(rt, "sim", b, strlen(b), &so, &rep), HK_ERR_REJECTED);
    ck_assert_msg(strstr(rep.message, "even versions are not allowed"), "%s", rep.message);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    hk_report_clear(&rep);
}
END_TEST

/* ---- state -------------------------------------------------------------- */

START_TEST(globals_carried_over) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 1, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    int launches = 0;
    for (int v = 2; v <= 101; v++) {
        launch_tag(k);
        launch_tag(k);
        launches += 2;
        swap_ok("sim", ptx(v, 0, 1, 0), &rep);
    }
    /* Read the counter through the driver, as the GPU suite does. */
    pthread_mutex_lock(&rt->swap_lock);
    hkl_version *cur = atomic_load(&hkl_module_find(rt, "sim")->current);
    CUdeviceptr p;
    size_t sz;
    ck_assert_int_eq(fake_driver()->LibraryGetGlobal(&p, &sz, cur->lib, "counter"), 0);
    pthread_mutex_unlock(&rt->swap_lock);
    ck_assert_int_eq(*(int *)(uintptr_t)p, launches);

    /* Opting out starts the new version from its own initial value. */
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.carry_globals = 0;
    const char *src = ptx(200, 0, 1, 0);
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), &so, &rep), 0);
    pthread_mutex_lock(&rt->swap_lock);
    cur = atomic_load(&hkl_module_find(rt, "sim")->current);
    ck_assert_int_eq(fake_driver()->LibraryGetGlobal(&p, &sz, cur->lib, "counter"), 0);
    pthread_mutex_unlock(&rt->swap_lock);
    ck_assert_int_eq(*(int *)(uintptr_t)p, 0);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(rollback_walks_back) {
    hk_report rep = HK_REPORT_INIT;
    for (int i = 1; i <= 3; i++)
        swap_ok("sim", ptx(i * 10, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(launch_tag(k), 30);
    ck_assert_int_eq(hk_rollback(rt, "sim", &rep), 0);
    ck_assert_uint_eq(rep.version, 4); /* a new, monotonic number */
    ck_assert_int_eq(launch_tag(k), 20);
    ck_assert_int_eq(hk_rollback(rt, "sim", &rep), 0);
    ck_assert_uint_eq(rep.version, 5);
    ck_assert_int_eq(launch_tag(k), 10);
    ck_assert_int_eq(hk_rollback(rt, "sim", &rep), HK_ERR_NO_HISTORY);
    ck_assert_int_eq(launch_tag(k), 10);
    /* A failed rollback leaves the history intact. */
    swap_ok("sim", ptx(40, 0, 0, 0), &rep);
    fake_fail("cuLibraryLoadData", 1, CUDA_ERROR_OUT_OF_MEMORY);
    ck_assert_int_eq(hk_rollback(rt, "sim", &rep), HK_ERR_CUDA);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_OUT_OF_MEMORY");
    ck_assert_int_eq(launch_tag(k), 40);
    ck_assert_int_eq(hk_rollback(rt, "sim", &rep), 0);
    ck_assert_int_eq(launch_tag(k), 10);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.rollbacks, 3);
    ck_assert_int_eq(events[HK_EVENT_ROLLED_BACK], 3);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(history_is_bounded) {
    hk_report rep = HK_REPORT_INIT;
    for (int i = 1; i <= 10; i++)
        swap_ok("sim", ptx(i, 0, 0, 0), &rep);
    int n = 0;
    while (hk_rollback(rt, "sim", &rep) == 0)
        n++;
    ck_assert_int_eq(n, 3); /* history 4: current + 3 earlier */
    hk_report_clear(&rep);
}
END_TEST

/* ---- grace periods and pins --------------------------------------------- */

static hk_kernel *held_kernel;
static void *launch_thread(void *arg) {
    (void)arg;
    int *tag = malloc(sizeof *tag);
    *tag = launch_tag(held_kernel);
    return tag;
}

static void *swap2_thread(void *arg) {
    hk_report rep = HK_REPORT_INIT;
    intptr_t err = swap_src("sim", ptx(2, 0, 0, 0), &rep);
    hk_report_clear(&rep);
    return (void *)err;
}

START_TEST(old_version_outlives_launch_in_flight) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &held_kernel), 0);
    fake_hold_next_launch();
    pthread_t t, ts;
    pthread_create(&t, NULL, launch_thread, NULL);
    fake_wait_held(); /* the thread is inside cuLaunchKernel of version 1 */
    /* The swap's driver work waits at the launch gate for the launch in
     * the driver to come out; version 1 stays loaded meanwhile. */
    pthread_create(&ts, NULL, swap2_thread, NULL);
    usleep(100 * 1000);
    ck_assert_int_eq(fake_live_images(), 1); /* version 2 not loaded yet */
    fake_release_launch();
    int *tag;
    pthread_join(t, (void **)&tag);
    ck_assert_int_eq(*tag, 1);
    free(tag);
    void *serr;
    pthread_join(ts, &serr);
    ck_assert_int_eq((intptr_t)serr, 0);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    ck_assert_int_eq(launch_tag(held_kernel), 2);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(pin_keeps_version) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 0, 0), &rep);
    hk_kernel *k, *aux;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    hk_pin *p;
    ck_assert_int_eq(hk_pin_module(rt, "sim", &p), 0);
    ck_assert_uint_eq(hk_pin_version(p), 1);
    swap_ok("sim", ptx(2, 1, 0, 0), &rep);
    ck_assert_int_eq(hk_reclaim_wait(rt, 100), HK_ERR_TIMEOUT);
    int out = 0, *dp = &out;
    unsigned n = 1;
    void *args[] = {&dp, &n};
    ck_assert_int_eq(
        hk_launch_pinned(p, k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL), 0);
    ck_assert_int_eq(out, 1);
    ck_assert_int_eq(launch_tag(k), 2);
    /* A handle taken after the pinned version retired has no code there. */
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "aux", &aux), 0);
    ck_assert_int_eq(
        hk_launch_pinned(p, aux, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL),
        HK_ERR_NOT_FOUND);
    hk_unpin(p);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    hk_report_clear(&rep);
}
END_TEST

static hk_kernel *exit_kernel;
static pthread_barrier_t exit_bar;
static void *launch_then_wait(void *arg) {
    (void)arg;
    launch_tag(exit_kernel);
    pthread_barrier_wait(&exit_bar); /* launched */
    pthread_barrier_wait(&exit_bar); /* the runtime is gone: exit now */
    return NULL;
}

static int count_slots(hk_runtime *r) {
    int n = 0;
    for (hkl_tslot *s = atomic_load(&r->gate.slots); s; s = s->next)
        n++;
    return n;
}

START_TEST(launch_slots_outlive_runtime_and_do_not_leak) {
    /* A thread that launched exits after the runtime was destroyed (checked
     * for use-after-free by the sanitizer build). */
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &exit_kernel), 0);
    pthread_barrier_init(&exit_bar, NULL, 2);
    pthread_t t;
    pthread_create(&t, NULL, launch_then_wait, NULL);
    pthread_barrier_wait(&exit_bar);
    hk_runtime_destroy(rt);
    pthread_barrier_wait(&exit_bar);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&exit_bar);
    /* One thread alternating between two runtimes keeps one slot in each. */
    rt = make_rt(1, HK_LOADER_LIBRARY);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    hk_runtime *r2;
    ck_assert_int_eq(hkl_runtime_create_with(&r2, &o, fake_driver(), NULL), 0);
    const char *src = ptx(2, 0, 0, 0);
    swap_ok("sim", src, &rep);
    ck_assert_int_eq(hk_swap(r2, "sim", src, strlen(src), NULL, &rep), 0);
    hk_kernel *k1, *k2;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k1), 0);
    ck_assert_int_eq(hk_kernel_get(r2, "sim", "step", &k2), 0);
    for (int i = 0; i < 1000; i++) {
        launch_tag(k1);
        launch_tag(k2);
    }
    ck_assert_int_eq(count_slots(rt), 1);
    ck_assert_int_eq(count_slots(r2), 1);
    hk_runtime_destroy(r2);
    hk_report_clear(&rep);
}
END_TEST

/* ---- fault injection ---------------------------------------------------- */

START_TEST(each_driver_failure_is_clean) {
    static const char *entries[] = {
        "cuLibraryLoadData", "cuLibraryGetKernel",   "cuKernelGetFunction",
        "cuFuncLoad",        "cuKernelGetParamInfo", "cuLibraryGetGlobal",
        "cuMemcpyDtoDAsync", "cuStreamSynchronize",  "cuCtxPushCurrent"};
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 1, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    int tag = 1;
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++)
        for (int nth = 1; nth <= 3; nth++) {
            fake_clear_faults();
            fake_fail(entries[e], nth, CUDA_ERROR_OUT_OF_MEMORY);
            int err = swap_src("sim", ptx(100 + (int)e * 10 + nth, 1, 1, 0), &rep);
            fake_clear_faults();
            if (err == 0) {
                tag = 100 + (int)e * 10 + nth; /* the fault hit a call the swap did not need */
            } else {
                ck_assert_msg(err == HK_ERR_CUDA || err == HK_ERR_MISSING_KERNEL ||
                                  err == HK_ERR_LAYOUT,
                              "%s #%d: %s", entries[e], nth, hk_strerror(err));
                ck_assert_msg(rep.cu_name[0] || err == HK_ERR_LAYOUT, "%s #%d: no CUresult name",
                              entries[e], nth);
            }
            ck_assert_int_eq(launch_tag(k), tag);
            ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
            ck_assert_msg(fake_live_images() == 1, "%s #%d leaked: %d live", entries[e], nth,
                          fake_live_images());
        }
    hk_report_clear(&rep);
}
END_TEST

START_TEST(launch_error_is_returned) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    fake_fail("cuLaunchKernel", 1, CUDA_ERROR_LAUNCH_FAILED);
    int cu = 0;
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, NULL, &cu),
                     HK_ERR_CUDA);
    ck_assert_int_eq(cu, CUDA_ERROR_LAUNCH_FAILED);
    ck_assert_int_eq(launch_tag(k), 1);
    hk_report_clear(&rep);
}
END_TEST

/* ---- context reset ------------------------------------------------------ */

START_TEST(reset_with_library_loader) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    void *ctx_before = hk_runtime_context(rt, 0);
    unsigned long long id_before = rt->dev[0].ctx_id;
    fake_reset_device(0);
    ck_assert_int_eq(launch_tag(k), 1); /* libraries survive a reset */
    /* The next swap notices the reset and reattaches. */
    swap_ok("sim", ptx(2, 0, 0, 0), &rep);
    ck_assert_int_eq(launch_tag(k), 2);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.context_resets, 1);
    ck_assert_int_eq(events[HK_EVENT_CONTEXT_RESET], 1);
    ck_assert_ptr_eq(hk_runtime_context(rt, 0), ctx_before); /* same primary context object */
    ck_assert_uint_ne(rt->dev[0].ctx_id, id_before);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(reset_with_module_loader) {
    hk_runtime_destroy(rt);
    rt = make_rt(1, HK_LOADER_MODULE);
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(7, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(launch_tag(k), 7);
    fake_reset_device(0);
    /* The module died: the launch fails at once, and hotkern's own thread
     * (never the launching one) reloads it. */
    int out = 0, *dptr = &out, cu = 0;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu),
                     HK_ERR_CUDA);
    ck_assert_int_eq(cu, CUDA_ERROR_INVALID_HANDLE);
    wait_resets(1);
    ck_assert_int_eq(launch_tag(k), 7);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    ck_assert_int_eq(events[HK_EVENT_CONTEXT_RESET], 1);
    ck_assert_msg(!pthread_equal(reset_event_thread, pthread_self()),
                  "the reset event ran on the launching thread");
    swap_ok("sim", ptx(8, 0, 0, 0), &rep);
    ck_assert_int_eq(launch_tag(k), 8);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(reset_keeps_name_expressions) {
    /* Real NVRTC output (PTX, handed to the fake) with a template kernel
     * taken by its name expression. */
    hk_runtime_destroy(rt);
    rt = make_rt(1, HK_LOADER_MODULE);
    const char *src = "template <typename T> __global__ void scale(T *x) { x[0] *= 2; }\n";
    const char *exprs[] = {"scale<int>"};
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.name_expressions = exprs;
    so.nname_expressions = 1;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_swap(rt, "t", src, strlen(src), &so, &rep) == 0, "%s", rep.message);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "t", "scale<int>", &k), 0);
    int x = 3, *xp = &x;
    void *args[] = {&xp};
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL), 0);
    fake_reset_device(0);
    int cu = 0;
    hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu); /* may fail once */
    wait_resets(1);
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu), 0);
    ck_assert_int_eq(events[HK_EVENT_CONTEXT_RESET], 1);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.live_versions, 1);
    hk_report_clear(&rep);
}
END_TEST

/* ---- in-memory headers and warm start ------------------------------------ */

/* Real NVRTC output whose global `arr` has K ints, K from "common.cuh". */
static const char *const HDR_SRC = "#include \"common.cuh\"\n"
                                   "__device__ int arr[K];\n"
                                   "extern \"C\" __global__ void step(int *o, unsigned n) {\n"
                                   "    o[0] = arr[n];\n"
                                   "}\n";

static size_t arr_bytes(const char *mod) {
    uint64_t dptr = 0;
    size_t size = 0;
    ck_assert_int_eq(hk_module_global(rt, mod, "arr", 0, &dptr, &size), 0);
    return size;
}

START_TEST(swap_with_in_memory_headers) {
    hk_runtime_destroy(rt);
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.no_warm_start = 1;
    hk_header rth = {"common.cuh", "#define K 4\n", 12};
    o.headers = &rth;
    o.nheaders = 1;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), 0);
    rth.data = "#define K 1000\n"; /* the runtime kept its own copy */
    rth.size = 15;

    ck_assert_msg(hk_swap(rt, "h", HDR_SRC, strlen(HDR_SRC), NULL, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(arr_bytes("h"), 4 * sizeof(int));

    /* A swap's own header hides the runtime's. */
    char text[32] = "#define K 8\n";
    hk_header sh = {"common.cuh", text, strlen(text)};
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.headers = &sh;
    so.nheaders = 1;
    ck_assert_msg(hk_swap(rt, "h", HDR_SRC, strlen(HDR_SRC), &so, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(arr_bytes("h"), 8 * sizeof(int));

    /* hk_submit copies them: the caller's buffer may change at once. */
    snprintf(text, sizeof text, "#define K 16\n");
    sh.size = strlen(text);
    ck_assert_int_eq(hk_submit(rt, "h", HDR_SRC, strlen(HDR_SRC), &so), 0);
    snprintf(text, sizeof text, "#define K 99\n");
    ck_assert_int_eq(hk_wait_idle(rt, 60000), 0);
    ck_assert_uint_eq(arr_bytes("h"), 16 * sizeof(int));

    /* A header without a name is refused; the module keeps its version. */
    uint64_t v = hk_module_version(rt, "h");
    hk_header bad = {NULL, "x", 1};
    so.headers = &bad;
    ck_assert_int_eq(hk_swap(rt, "h", HDR_SRC, strlen(HDR_SRC), &so, &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "headers"), "%s", rep.message);
    ck_assert_uint_eq(hk_module_version(rt, "h"), v);
    /* A broken header: the compiler's log, and still the old version. */
    hk_header broken = {"common.cuh", "#define K (\n", 12};
    so.headers = &broken;
    ck_assert_int_eq(hk_swap(rt, "h", HDR_SRC, strlen(HDR_SRC), &so, &rep), HK_ERR_COMPILE);
    ck_assert_ptr_nonnull(rep.log);
    ck_assert_uint_eq(hk_module_version(rt, "h"), v);
    ck_assert_uint_eq(arr_bytes("h"), 16 * sizeof(int));
    hk_report_clear(&rep);

    /* Bad runtime headers fail creation with a reason. */
    hk_runtime *r2 = NULL;
    o.headers = &bad;
    ck_assert_int_eq(hkl_runtime_create_with(&r2, &o, fake_driver(), &rep), HK_ERR_INVALID);
    ck_assert_ptr_null(r2);
    ck_assert_msg(strstr(rep.message, "headers"), "%s", rep.message);
    hk_report_clear(&rep);
}
END_TEST

/* ---- sources: the hooks the engine calls back --------------------------- */

/* A source that records what the engine tells it. */
typedef struct test_source {
    hkl_source src;
    char source_name[256];
    char deps[4][256];
    int ndeps, deps_calls, releases;
    int worker_alive_at_release; /* the engine's worker was still running */
    int *released;               /* outlives the runtime */
} test_source;

static void test_deps_built(void *ctx, const char *source_name, const char *const *deps, int n) {
    test_source *t = ctx;
    t->deps_calls++;
    snprintf(t->source_name, sizeof t->source_name, "%s", source_name);
    t->ndeps = n;
    for (int i = 0; i < n && i < 4; i++)
        snprintf(t->deps[i], sizeof t->deps[i], "%s", deps[i]);
}

static void test_release(void *ctx) {
    test_source *t = ctx;
    pthread_mutex_lock(&rt->work.lock);
    t->worker_alive_at_release = rt->work.started && !rt->work.stop;
    pthread_mutex_unlock(&rt->work.lock);
    (*t->released)++;
}

static test_source *made_source;
static hkl_source *make_source(void *arg) {
    (*(int *)arg)++;
    made_source->src.ctx = made_source;
    made_source->src.deps_built = test_deps_built;
    return &made_source->src;
}

START_TEST(sources_hear_builds_and_destroy) {
    static const char kind_a[] = "a", kind_b[] = "b";
    static int released;
    test_source a = {0}, b = {0};
    hk_report rep = HK_REPORT_INIT;
    hk_swap_options so;

    released = 0;
    a.released = b.released = &released;
    a.src = (hkl_source){
        .kind = kind_a, .ctx = &a, .deps_built = test_deps_built, .release = test_release};
    ck_assert_int_eq(hkl_source_attach(rt, &a.src), 0);
    ck_assert_int_eq(hkl_source_attach(rt, &a.src), HK_ERR_BUSY);
    test_source a2 = a;
    ck_assert_int_eq(hkl_source_attach(rt, &a2.src), HK_ERR_BUSY); /* same kind */
    ck_assert_int_eq(hkl_source_attach(rt, NULL), HK_ERR_INVALID);

    /* hkl_source_get finds an attached source without making one, and makes
     * (and attaches) one, once, when none of the kind is there. */
    int makes = 0, made = -1;
    made_source = &b;
    ck_assert_ptr_eq(hkl_source_get(rt, kind_a, make_source, &makes, &made), &a.src);
    ck_assert_int_eq(makes, 0);
    ck_assert_int_eq(made, 0);
    ck_assert_ptr_eq(hkl_source_get(rt, kind_b, make_source, &makes, &made), &b.src);
    ck_assert_int_eq(makes, 1);
    ck_assert_int_eq(made, 1);
    ck_assert_ptr_eq(b.src.kind, kind_b);
    ck_assert_ptr_eq(hkl_source_get(rt, kind_b, make_source, &makes, &made), &b.src);
    ck_assert_int_eq(makes, 1);

    /* A CUDA C build with a source name: every attached source hears which
     * files it read. */
    char text[32] = "#define K 4\n";
    hk_header h = {"common.cuh", text, strlen(text)};
    hk_swap_options_init(&so);
    so.headers = &h;
    so.nheaders = 1;
    so.source_name = "/kernels/h.cu";
    ck_assert_msg(hk_swap(rt, "h", HDR_SRC, strlen(HDR_SRC), &so, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(a.deps_calls, 1);
    ck_assert_int_eq(b.deps_calls, 1);
    ck_assert_str_eq(a.source_name, "/kernels/h.cu");
    ck_assert_int_eq(a.ndeps, 1);
    ck_assert_str_eq(a.deps[0], "common.cuh");

    /* Without a source name, or once detached, nothing is heard. */
    snprintf(text, sizeof text, "#define K 8\n");
    so.source_name = NULL;
    ck_assert_msg(hk_swap(rt, "h", HDR_SRC, strlen(HDR_SRC), &so, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(a.deps_calls, 1);
    hkl_source_detach(rt, &b.src);
    hkl_source_detach(rt, &b.src); /* harmless */
    snprintf(text, sizeof text, "#define K 16\n");
    so.source_name = "/kernels/h.cu";
    ck_assert_msg(hk_swap(rt, "h", HDR_SRC, strlen(HDR_SRC), &so, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(a.deps_calls, 2);
    ck_assert_int_eq(b.deps_calls, 1);

    /* Destroy releases what is attached, once, while the worker still runs;
     * a detached source is not released. */
    hk_runtime_destroy(rt);
    ck_assert_int_eq(released, 1);
    ck_assert_int_eq(a.worker_alive_at_release, 1);
    rt = NULL;
    rt = make_rt(1, HK_LOADER_LIBRARY); /* for the fixture's teardown */
    hk_report_clear(&rep);
}
END_TEST

START_TEST(warm_start_runs_and_stops) {
    hk_runtime_destroy(rt);
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    /* Destroyed at once: the warm-up is cut short and joined, nothing leaks. */
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), NULL), 0);
    ck_assert_ptr_nonnull(rt->warm);
    hk_runtime_destroy(rt);
    /* Left to finish, then used. */
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), NULL), 0);
    for (int i = 0; i < 6000 && !hkp_warm_done(rt->warm); i++)
        usleep(10000);
    ck_assert(hkp_warm_done(rt->warm));
    hk_report rep = HK_REPORT_INIT;
    const char *src = "extern \"C\" __global__ void step(int *o, unsigned n) { o[0] = n; }\n";
    ck_assert_msg(hk_swap(rt, "w", src, strlen(src), NULL, &rep) == 0, "%s", rep.message);
    hk_report_clear(&rep);
    /* Off when asked. */
    hk_runtime_destroy(rt);
    o.no_warm_start = 1;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), NULL), 0);
    ck_assert_ptr_null(rt->warm);
}
END_TEST

/* ---- signal handlers and NVRTC -------------------------------------------- */

/* NVRTC (13.0) puts handlers of its own on SIGINT, SIGTERM and SIGXFSZ for
 * the duration of each compile and then restores the ones it saw when the
 * compile began. A program that installs its handlers before
 * hk_runtime_create therefore keeps them through the warm-up compile and
 * every build on hotkern's threads; these are what it must get back. */
static volatile sig_atomic_t app_signals;
static void app_handler(int sig) {
    (void)sig;
    app_signals++;
}

static atomic_int watching;
static atomic_int saw_foreign; /* informational: NVRTC's handler seen mid-build */

/* Polls SIGTERM's disposition while builds run on other threads. */
static void *watch_handler(void *arg) {
    (void)arg;
    while (atomic_load(&watching)) {
        struct sigaction cur;
        if (sigaction(SIGTERM, NULL, &cur) == 0 && cur.sa_handler != app_handler)
            atomic_store(&saw_foreign, 1);
        usleep(100);
    }
    return NULL;
}

static void assert_app_handlers(const char *when) {
    int sigs[] = {SIGINT, SIGTERM, SIGXFSZ};
    for (int i = 0; i < 3; i++) {
        struct sigaction cur;
        ck_assert_int_eq(sigaction(sigs[i], NULL, &cur), 0);
        ck_assert_msg(cur.sa_handler == app_handler,
                      "%s: signal %d's handler is %p, not the "
                      "application's",
                      when, sigs[i], (void *)cur.sa_handler);
    }
}

START_TEST(signal_handlers_installed_first_survive_builds) {
    hk_runtime_destroy(rt);
    rt = NULL;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = app_handler;
    sigemptyset(&sa.sa_mask);
    ck_assert_int_eq(sigaction(SIGINT, &sa, NULL), 0);
    ck_assert_int_eq(sigaction(SIGTERM, &sa, NULL), 0);
    ck_assert_int_eq(sigaction(SIGXFSZ, &sa, NULL), 0);
    atomic_store(&watching, 1);
    atomic_store(&saw_foreign, 0);
    pthread_t w;
    ck_assert_int_eq(pthread_create(&w, NULL, watch_handler, NULL), 0);
    /* Handlers first, then the runtime: its warm-up compiles on a thread of
     * its own, and a real CUDA C build runs on the worker (hk_submit). */
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), NULL), 0);
    ck_assert_ptr_nonnull(rt->warm);
    for (int i = 0; i < 6000 && !hkp_warm_done(rt->warm); i++)
        usleep(10000);
    ck_assert(hkp_warm_done(rt->warm));
    const char *src = "extern \"C\" __global__ void step(int *o, unsigned n) { o[0] = n + 7; }\n";
    ck_assert_int_eq(hk_submit(rt, "sig", src, strlen(src), NULL), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 60000), 0);
    ck_assert_uint_eq(hk_module_version(rt, "sig"), 1);
    atomic_store(&watching, 0);
    pthread_join(w, NULL);
    printf("signal handlers: NVRTC's own handler %s seen during the builds\n",
           atomic_load(&saw_foreign) ? "was" : "was not");
    assert_app_handlers("after the warm-up and a build on the worker");
    /* And the signal reaches the application rather than ending it. */
    app_signals = 0;
    ck_assert_int_eq(raise(SIGTERM), 0);
    ck_assert_int_eq(app_signals, 1);
}
END_TEST

START_TEST(module_loader_single_device) {
    hk_runtime_destroy(rt);
    rt = NULL;
    fake_init(2, 90);
    hk_options o;
    hk_options_init(&o);
    int devs[2] = {0, 1};
    o.devices = devs;
    o.ndevices = 2;
    o.loader = HK_LOADER_MODULE;
    hk_runtime *r;
    ck_assert_int_eq(hkl_runtime_create_with(&r, &o, fake_driver(), NULL), HK_ERR_UNSUPPORTED);
    rt = make_rt(1, HK_LOADER_LIBRARY);
}
END_TEST

/* ---- graphs, devices, async -------------------------------------------- */

/* Out of a registered fake graph's kernel; the node's arguments point here. */
static int g_out, *g_dp;
static unsigned g_n;
static void *g_args[2];

/* Registers a fake graph whose one node launches k's current version (made in
 * the runtime's context, current on this thread until the test resets it).
 * Returns the function the node was created with. */
static void *graph_register(hk_kernel *k, CUgraphExec *exec) {
    void *f;
    CUgraphNode node;
    fake_driver()->CtxSetCurrent((CUcontext)hk_runtime_context(rt, 0));
    ck_assert_int_eq(hk_kernel_function(k, &f), 0);
    g_out = 0;
    g_dp = &g_out;
    g_n = 1;
    g_args[0] = &g_dp;
    g_args[1] = &g_n;
    fake_graph_create((CUfunction)f, g_args, exec, &node);
    ck_assert_int_eq(hk_graph_register(rt, *exec, node, k), 0);
    return f;
}

START_TEST(graph_retargeted_on_commit) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    CUgraphExec exec;
    ck_assert_int_eq(fake_tag_of(graph_register(k, &exec)), 1);
    ck_assert_int_eq(hk_graph_launch(rt, exec, NULL, NULL), 0);
    ck_assert_int_eq(g_out, 1);
    swap_ok("sim", ptx(2, 0, 0, 0), &rep);
    ck_assert_int_eq(fake_tag_of(fake_graph_func(exec)), 2);
    ck_assert_int_eq(hk_graph_launch(rt, exec, NULL, NULL), 0);
    ck_assert_int_eq(g_out, 2);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(hk_graph_launch(rt, exec, NULL, NULL), 0); /* no dead code reached */
    ck_assert_int_eq(hk_graph_unregister(rt, exec), 0);
    ck_assert_int_eq(hk_graph_unregister(rt, exec), HK_ERR_NOT_FOUND);
    swap_ok("sim", ptx(3, 0, 0, 0), &rep);
    ck_assert_int_eq(fake_tag_of(fake_graph_func(exec)), 2);
    fake_driver()->CtxSetCurrent(NULL);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(graph_keeps_old_code_when_retarget_fails) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    CUgraphExec exec;
    graph_register(k, &exec);
    fake_fail("cuGraphExecKernelNodeSetParams", 1, CUDA_ERROR_INVALID_VALUE);
    swap_ok("sim", ptx(2, 0, 0, 0), &rep); /* the commit stands... */
    ck_assert_msg(strstr(rep.message, "still runs version 1"), "%s", rep.message);
    /* ...but version 1 stays loaded for the graph that still runs it. */
    ck_assert_int_eq(hk_reclaim_wait(rt, 200), HK_ERR_TIMEOUT);
    ck_assert_int_eq(hk_graph_launch(rt, exec, NULL, NULL), 0);
    ck_assert_int_eq(g_out, 1);
    ck_assert_int_eq(launch_tag(k), 2);
    swap_ok("sim", ptx(3, 0, 0, 0), &rep); /* retargeted: version 1 is let go */
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    ck_assert_int_eq(hk_graph_launch(rt, exec, NULL, NULL), 0);
    ck_assert_int_eq(g_out, 3);
    ck_assert_int_eq(hk_graph_unregister(rt, exec), 0);
    fake_driver()->CtxSetCurrent(NULL);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(older_submission_never_overrides_newer) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(hk_safe_point(rt), 0);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_AT_SAFE_POINT;
    const char *v2 = ptx(2, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "sim", v2, strlen(v2), &so), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 5000), 0); /* built, waiting for a safe point */
    swap_ok("sim", ptx(3, 0, 0, 0), &rep);       /* submitted later, staged at once */
    ck_assert_int_eq(hk_safe_point(rt), 0);      /* the older one is refused */
    ck_assert_int_eq(launch_tag(k), 3);
    ck_assert_int_eq(events[HK_EVENT_REFUSED], 1);
    ck_assert_msg(strstr(last_event_msg, "submitted later"), "%s", last_event_msg);
    ck_assert_str_eq(hk_strerror(HK_ERR_SUPERSEDED), "a newer version was committed first");
    hk_report_clear(&rep);
}
END_TEST

START_TEST(two_devices_all_or_nothing) {
    hk_runtime_destroy(rt);
    rt = make_rt(2, HK_LOADER_LIBRARY);
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    int loads_before = fake_calls("cuFuncLoad");
    /* Uploading to the second device fails: the swap is refused for both. */
    fake_fail_on_device("cuFuncLoad", 1, CUDA_ERROR_OUT_OF_MEMORY);
    ck_assert_int_eq(swap_src("sim", ptx(2, 0, 0, 0), &rep), HK_ERR_CUDA);
    ck_assert_int_gt(fake_calls("cuFuncLoad"), loads_before);
    fake_clear_faults();
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    ck_assert_int_eq(launch_tag(k), 1);
    swap_ok("sim", ptx(3, 0, 0, 0), &rep);
    ck_assert_int_eq(launch_tag(k), 3);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(submit_and_safe_point) {
    const char *a = ptx(1, 0, 0, 0), *b = ptx(2, 0, 0, 0), *c = ptx(3, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "sim", a, strlen(a), NULL), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 5000), 0);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_AT_SAFE_POINT;
    ck_assert_int_eq(hk_submit(rt, "sim", b, strlen(b), &so), 0);
    ck_assert_int_eq(hk_submit(rt, "sim", c, strlen(c), &so), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 5000), 0);
    int loads = fake_calls("cuLibraryLoadData");
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1); /* nothing touched the driver yet */
    ck_assert_int_eq(hk_safe_point(rt), 1);             /* the newer one replaced the older */
    ck_assert_int_eq(fake_calls("cuLibraryLoadData"), loads + 1);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(launch_tag(k), 3);
    /* The replaced version is unloaded at the next safe point, not before. */
    ck_assert_int_eq(hk_reclaim_wait(rt, 200), HK_ERR_TIMEOUT);
    ck_assert_int_eq(fake_live_images(), 2);
    ck_assert_int_eq(hk_safe_point(rt), 0);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    /* A refused submission is reported through the event. */
    ck_assert_int_eq(hk_submit(rt, "sim", "garbage\x01\x02", 9, NULL), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 5000), 0);
    ck_assert_int_eq(events[HK_EVENT_REFUSED], 1);
}
END_TEST

static int swap_thread_result;
static uint64_t swap_thread_version;
static const char *swap_thread_src;
static void *swap_thread(void *arg) {
    (void)arg;
    hk_report rep = HK_REPORT_INIT;
    swap_thread_result = hk_swap(rt, "sim", swap_thread_src, strlen(swap_thread_src), NULL, &rep);
    swap_thread_version = rep.version;
    hk_report_clear(&rep);
    return NULL;
}

START_TEST(auto_stage_follows_safe_points) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep); /* no safe point yet: staged at once */
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(hk_safe_point(rt), 0); /* this thread now runs the program's frames */
    /* From this thread, AUTO stages at once (waiting would wait for itself)... */
    swap_ok("sim", ptx(2, 0, 0, 0), &rep);
    ck_assert_int_eq(launch_tag(k), 2);
    /* ...and an explicit safe-point hk_swap from it is refused. */
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.stage = HK_STAGE_AT_SAFE_POINT;
    const char *x = ptx(9, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "sim", x, strlen(x), &so, &rep), HK_ERR_INVALID);
    /* From another thread, hk_swap waits for this thread's next safe point. */
    int loads = fake_calls("cuLibraryLoadData");
    swap_thread_src = ptx(3, 0, 0, 0);
    pthread_t t;
    pthread_create(&t, NULL, swap_thread, NULL);
    usleep(200000);
    ck_assert_int_eq(fake_calls("cuLibraryLoadData"), loads); /* nothing staged yet */
    ck_assert_int_eq(launch_tag(k), 2);
    int committed = 0;
    for (int i = 0; i < 200 && !committed; i++) {
        committed = hk_safe_point(rt);
        usleep(1000);
    }
    pthread_join(t, NULL);
    ck_assert_int_eq(committed, 1);
    ck_assert_int_eq(swap_thread_result, 0);
    ck_assert_uint_eq(swap_thread_version, 3);
    ck_assert_int_eq(launch_tag(k), 3);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(auto_stage_falls_back_without_safe_points) {
    hk_runtime_destroy(rt);
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.safe_point_wait_ms = 100;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), NULL), 0);
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    ck_assert_int_eq(hk_safe_point(rt), 0); /* frames once... then they stop */
    swap_thread_src = ptx(2, 0, 0, 0);
    pthread_t t;
    double t0 = hkl_now_ms();
    pthread_create(&t, NULL, swap_thread, NULL);
    pthread_join(t, NULL);
    double waited = hkl_now_ms() - t0;
    ck_assert_int_eq(swap_thread_result, 0); /* staged at once after the wait */
    ck_assert_uint_eq(swap_thread_version, 2);
    ck_assert_msg(waited >= 90, "did not wait for a safe point (%.0f ms)", waited);
    ck_assert_int_eq(hk_safe_point(rt), 0); /* nothing left behind */
    hk_report_clear(&rep);
}
END_TEST

/* ---- concurrency --------------------------------------------------------- */

static atomic_int stop_flag;
static atomic_int launch_failures;
static hk_kernel *stress_k;

static void *stress_launcher(void *arg) {
    (void)arg;
    while (!atomic_load(&stop_flag)) {
        int out = -1, *dp = &out;
        unsigned n = 1;
        void *args[] = {&dp, &n};
        if (hk_launch(stress_k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL) ||
            (out != 1 && out != 2))
            atomic_fetch_add(&launch_failures, 1);
    }
    return NULL;
}

START_TEST(swaps_under_concurrent_launches) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 1, 0), &rep);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &stress_k), 0);
    atomic_store(&stop_flag, 0);
    atomic_store(&launch_failures, 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, stress_launcher, NULL);
    for (int i = 0; i < 300; i++) {
        /* Keep the launchers busy across the swaps: wait for some launches
         * between them. */
        int seen = fake_launches();
        while (fake_launches() < seen + 8)
            usleep(50);
        swap_ok("sim", ptx(1 + (i % 2 == 0), 0, 1, 0), &rep);
    }
    atomic_store(&stop_flag, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    ck_assert_int_eq(atomic_load(&launch_failures), 0);
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    ck_assert_int_eq(fake_violations(), 0);
    ck_assert_int_gt(fake_launches(), 300 * 8);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.reclaimed, 300);
    hk_report_clear(&rep);
}
END_TEST

/* ---- kernel attributes and extended launches --------------------------- */

/* The fake's function behind k's current version (context of device 0). */
static void *current_fn(hk_kernel *k) {
    void *f = NULL;
    fake_driver()->CtxSetCurrent((CUcontext)hk_runtime_context(rt, 0));
    ck_assert_int_eq(hk_kernel_function(k, &f), 0);
    fake_driver()->CtxSetCurrent(NULL);
    return f;
}

static char *with_shared(int bytes, const char *src) {
    static char buf[4][2200];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "// shared: %d\n%s", bytes, src);
    return b;
}

START_TEST(attributes_survive_swaps) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(hk_kernel_set_attribute(k, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             100 << 10, &rep),
                     0);
    ck_assert_int_eq(hk_kernel_set_cache_config(k, CU_FUNC_CACHE_PREFER_SHARED, &rep), 0);
    ck_assert_int_eq(
        fake_kernel_attr(current_fn(k), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES),
        100 << 10);
    for (int i = 0; i < 10; i++) {
        swap_ok("sim", ptx(2 + i, 0, 0, 0), &rep);
        void *f = current_fn(k);
        ck_assert_int_eq(fake_tag_of(f), 2 + i);
        ck_assert_int_eq(fake_kernel_attr(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES),
                         100 << 10);
        ck_assert_int_eq(fake_kernel_attr(f, -1), CU_FUNC_CACHE_PREFER_SHARED);
    }
    ck_assert_int_eq(launch_tag(k), 11);
    hk_report_clear(&rep);
}
END_TEST

/* A version whose static shared memory leaves no room for the dynamic size
 * the handle asked for is refused; the old version runs on. */
START_TEST(attribute_that_does_not_fit_refuses_version) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(
        hk_kernel_set_attribute(k, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 200000, &rep),
        0);
    ck_assert_int_eq(swap_src("sim", with_shared(48000, ptx(2, 0, 0, 0)), &rep), HK_ERR_ATTRIBUTE);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_INVALID_VALUE");
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_msg(strstr(rep.message, "static shared memory 48000 bytes + 200000 dynamic"), "%s",
                  rep.message);
    ck_assert_int_eq(launch_tag(k), 1);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    /* Refused on the current version: the value kept before stays. */
    ck_assert_int_eq(
        hk_kernel_set_attribute(k, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100000, &rep),
        0);
    swap_ok("sim", with_shared(100000, ptx(3, 0, 0, 0)), &rep);
    ck_assert_int_eq(
        hk_kernel_set_attribute(k, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 200000, &rep),
        HK_ERR_ATTRIBUTE);
    swap_ok("sim", ptx(4, 0, 0, 0), &rep);
    ck_assert_int_eq(
        fake_kernel_attr(current_fn(k), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), 100000);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(launch_ex_passes_its_options) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(4, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    hk_launch_config c;
    hk_launch_config_init(&c);
    c.cluster = (hk_dim3){2, 1, 1};
    c.cooperative = 1;
    c.has_priority = 1;
    c.priority = -1;
    int out = 0, *dptr = &out, cu = 0;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    ck_assert_int_eq(hk_launch_ex(k, &c, args, &cu), 0);
    ck_assert_int_eq(out, 4);
    int ids[8];
    ck_assert_int_eq(fake_last_launch_ex(ids, 8), 3);
    ck_assert_int_eq(ids[0], CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
    ck_assert_int_eq(ids[1], CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
    ck_assert_int_eq(ids[2], CU_LAUNCH_ATTRIBUTE_PRIORITY);
    swap_ok("sim", ptx(5, 0, 0, 0), &rep);
    ck_assert_int_eq(hk_launch_ex(k, &c, args, &cu), 0);
    ck_assert_int_eq(out, 5);
    hk_launch_config old = c;
    old.size = offsetof(hk_launch_config, has_priority); /* below the first layout */
    ck_assert_int_eq(hk_launch_ex(k, &old, args, &cu), HK_ERR_INVALID);
    old.size = 0;
    ck_assert_int_eq(hk_launch_ex(k, &old, args, &cu), HK_ERR_INVALID);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(same_image_again_is_not_reloaded) {
    hk_report rep = HK_REPORT_INIT;
    const char *src = ptx(3, 0, 0, 0);
    swap_ok("sim", src, &rep);
    int loads = fake_calls("cuLibraryLoadData");
    ck_assert_int_eq(swap_src("sim", src, &rep), 0);
    ck_assert_uint_eq(rep.version, 1);
    ck_assert_msg(strstr(rep.message, "already runs this image"), "%s", rep.message);
    ck_assert_int_eq(fake_calls("cuLibraryLoadData"), loads);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.swaps, 1);
    ck_assert_int_eq(events[HK_EVENT_COMMITTED], 1);
    swap_ok("sim", ptx(4, 0, 0, 0), &rep); /* a different image still commits */
    ck_assert_uint_eq(rep.version, 2);
    hk_report_clear(&rep);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("engine (fake driver)");
    TCase *tc = tcase_create("engine");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, no_driver_is_reported);
    tcase_add_test(tc, error_strings_are_distinct);
    tcase_add_test(tc, argument_checks);
    tcase_add_test(tc, load_launch_swap_reclaim);
    tcase_add_test(tc, refusals_keep_old_version);
    tcase_add_test(tc, layout_change_when_accepted);
    tcase_add_test(tc, required_layout_holds);
    tcase_add_test(tc, check_callback_refuses);
    tcase_add_test(tc, globals_carried_over);
    tcase_add_test(tc, rollback_walks_back);
    tcase_add_test(tc, history_is_bounded);
    tcase_add_test(tc, old_version_outlives_launch_in_flight);
    tcase_add_test(tc, pin_keeps_version);
    tcase_add_test(tc, launch_slots_outlive_runtime_and_do_not_leak);
    tcase_add_test(tc, each_driver_failure_is_clean);
    tcase_add_test(tc, launch_error_is_returned);
    tcase_add_test(tc, reset_with_library_loader);
    tcase_add_test(tc, reset_with_module_loader);
    tcase_add_test(tc, reset_keeps_name_expressions);
    tcase_add_test(tc, swap_with_in_memory_headers);
    tcase_add_test(tc, sources_hear_builds_and_destroy);
    tcase_add_test(tc, warm_start_runs_and_stops);
    tcase_add_test(tc, signal_handlers_installed_first_survive_builds);
    tcase_add_test(tc, module_loader_single_device);
    tcase_add_test(tc, graph_retargeted_on_commit);
    tcase_add_test(tc, graph_keeps_old_code_when_retarget_fails);
    tcase_add_test(tc, older_submission_never_overrides_newer);
    tcase_add_test(tc, two_devices_all_or_nothing);
    tcase_add_test(tc, submit_and_safe_point);
    tcase_add_test(tc, auto_stage_follows_safe_points);
    tcase_add_test(tc, auto_stage_falls_back_without_safe_points);
    tcase_add_test(tc, swaps_under_concurrent_launches);
    tcase_add_test(tc, attributes_survive_swaps);
    tcase_add_test(tc, attribute_that_does_not_fit_refuses_version);
    tcase_add_test(tc, launch_ex_passes_its_options);
    tcase_add_test(tc, same_image_again_is_not_reloaded);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

/*
 * Build isolation (options.build_isolated, ptx/isolate.c, hotkern-build) on
 * the fake driver: NVRTC and nvJitLink run on this machine's CPU, in the
 * helper process. Covers: the helper's images are those of an in-process
 * build; a compile error reaches the report with NVRTC's log; a helper killed
 * in the middle of a build, or stalled past build_timeout_ms (through the
 * helper's test-only HK_BUILD_TEST_STALL_MS), refuses that build and is
 * replaced for the next; the application's signal dispositions never change
 * while isolated builds run; nothing (process, descriptor) is left after
 * destroy; a cache hit never reaches the helper; the helper keeps the
 * memory NVRTC frees (fewer page faults per build than this process, which
 * does not), and hk_build_keep_memory does the same here on request and
 * leaves a GLIBC_TUNABLES choice alone.
 *
 * HK_TEST_BUILD_IN_PROCESS=1 runs the signal test with build_isolated = 0,
 * where it fails: that is the problem isolation solves.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loader/core.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

static hk_runtime *rt;

static const char *good_src =
    "extern \"C\" __global__ void step(float *x, unsigned n, float dt) {\n"
    "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] += dt;\n"
    "}\n";

/* A runtime on the fake driver; isolated builds unless told otherwise. PTX
 * goes to the (fake) driver, which reads it, so CUDA C builds end at PTX. */
static hk_runtime *make_rt(int isolated, int timeout_ms, const char *cache_dir) {
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = cache_dir ? cache_dir : "";
    o.no_warm_start = 1;
    o.build_isolated = isolated;
    o.build_timeout_ms = timeout_ms;
    hk_runtime *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&r, &o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    hk_report_clear(&rep);
    return r;
}

static void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
    unsetenv("HK_BUILD_TEST_STALL_MS");
    unsetenv("HK_BUILD_TEST_DEAF_MS");
    unsetenv("GLIBC_TUNABLES");
    unsetenv("MALLOC_TOP_PAD_");
}

static int swap_src(const char *mod, const char *src, hk_report *rep) {
    return hk_swap(rt, mod, src, strlen(src), NULL, rep);
}

/* Builds src with o in this process and through iso; both must succeed. */
static void build_both(const char *src, hk_format fmt, hkp_build_opts o, hkp_iso *iso,
                       hkp_artifact *local, hkp_artifact *remote) {
    char why[512];
    int rc = hkp_build(src, strlen(src), fmt, &o, local, why, sizeof why);
    ck_assert_msg(rc == 0, "in process: %s", why);
    o.iso = iso;
    rc = hkp_build(src, strlen(src), fmt, &o, remote, why, sizeof why);
    ck_assert_msg(rc == 0, "isolated: %s", why);
}

/* Same image bytes when the compiler is deterministic; in any case the same
 * kernels, parameter layouts, format and lowered names. */
static void assert_same(const hkp_artifact *a, const hkp_artifact *b, const char *what) {
    ck_assert_int_eq(a->format, b->format);
    ck_assert_int_eq(a->meta.nentries, b->meta.nentries);
    for (int i = 0; i < a->meta.nentries; i++) {
        ck_assert_str_eq(a->meta.entries[i].name, b->meta.entries[i].name);
        ck_assert_int_eq(a->meta.entries[i].nparams, b->meta.entries[i].nparams);
        for (int p = 0; p < a->meta.entries[i].nparams; p++) {
            ck_assert_uint_eq(a->meta.entries[i].params[p].offset,
                              b->meta.entries[i].params[p].offset);
            ck_assert_uint_eq(a->meta.entries[i].params[p].size, b->meta.entries[i].params[p].size);
        }
    }
    ck_assert_int_eq(a->nlowered, b->nlowered);
    for (int i = 0; i < a->nlowered; i++)
        ck_assert_str_eq(a->lowered_names[i], b->lowered_names[i]);
    int same = a->size == b->size && !memcmp(a->image, b->image, a->size);
    printf("isolated vs in-process %s: %zu and %zu bytes, %s\n", what, a->size, b->size,
           same ? "identical" : "different bytes (metadata equal)");
    ck_assert_msg(same, "%s: the helper's image differs from the in-process one", what);
}

/* (1) The helper builds what hkp_build builds here: CUDA C with a template
 * (name expressions) and an in-memory header to a cubin (NVRTC), to PTX,
 * and that PTX to a cubin (nvJitLink). */
START_TEST(isolated_images_match_in_process) {
    char why[256] = "";
    hkp_iso *iso = NULL;
    ck_assert_msg(
        hkp_iso_create(&iso, hkt_built_program("hotkern-build"), 60000, 0, why, sizeof why) == 0,
        "%s", why);
    const char *src = "#include \"scale.h\"\n"
                      "template <typename T> __global__ void scale(T *x, unsigned n) {\n"
                      "    unsigned i = threadIdx.x; if (i < n) x[i] *= (T)FACTOR;\n"
                      "}\n"
                      "extern \"C\" __global__ void plain(int *o) { o[0] = FACTOR; }\n";
    hk_header h = {.name = "scale.h", .data = "#define FACTOR 3\n", .size = 17};
    const char *names[] = {"scale<float>", "scale<double>"};
    hkp_build_opts o = {.arch = 90,
                        .ptx_to_cubin = 1,
                        .opt_level = 3,
                        .name_expressions = names,
                        .nname_expressions = 2,
                        .headers = &h,
                        .nheaders = 1,
                        .source_name = "scale.cu"};
    hkp_artifact l, r;
    build_both(src, HK_FORMAT_CUDA_C, o, iso, &l, &r);
    ck_assert_int_eq(l.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(r.nlowered, 2);
    ck_assert_ptr_nonnull(strstr(r.lowered_names[0], "scale"));
    ck_assert_int_eq(r.ndeps, 1); /* the include scan ran here */
    assert_same(&l, &r, "CUDA C -> cubin");
    hkp_artifact_free(&r);
    hkp_artifact_free(&l);

    o.ptx_to_cubin = 0;
    build_both(src, HK_FORMAT_CUDA_C, o, iso, &l, &r);
    ck_assert_int_eq(r.format, HK_FORMAT_PTX);
    assert_same(&l, &r, "CUDA C -> PTX");
    hkp_artifact_free(&r);
    char *ptx = strdup(l.image);
    hkp_artifact_free(&l);

    hkp_build_opts po = {.arch = 90, .ptx_to_cubin = 1, .opt_level = 3};
    build_both(ptx, HK_FORMAT_PTX, po, iso, &l, &r);
    ck_assert_int_eq(r.format, HK_FORMAT_CUBIN);
    assert_same(&l, &r, "PTX -> cubin (nvJitLink)");
    hkp_artifact_free(&r);
    hkp_artifact_free(&l);

    /* The development profile reaches the helper's compilers too. */
    o.ptx_to_cubin = 1;
    o.fast_compile = 1;
    build_both(src, HK_FORMAT_CUDA_C, o, iso, &l, &r);
    assert_same(&l, &r, "CUDA C -> cubin, fast compile");
    hkp_artifact_free(&r);
    hkp_artifact_free(&l);
    po.fast_compile = 1;
    build_both(ptx, HK_FORMAT_PTX, po, iso, &l, &r);
    assert_same(&l, &r, "PTX -> cubin (nvJitLink), fast compile");
    hkp_artifact_free(&r);
    hkp_artifact_free(&l);
    free(ptx);

    /* The canary's trap guard: its copy is made in the helper too and
     * comes back whole, as the in-process build makes it. */
    const char *trappy =
        "extern \"C\" __global__ void t(int *o) { if (*o == 7) __trap(); *o = 1; }\n";
    hkp_build_opts to = {.arch = 90, .ptx_to_cubin = 1, .opt_level = 3, .trap_guard = 1};
    build_both(trappy, HK_FORMAT_CUDA_C, to, iso, &l, &r);
    ck_assert_int_eq(r.guard_sites, 1);
    ck_assert_int_eq(l.guard_sites, 1);
    ck_assert_msg(r.guard_size == l.guard_size && !memcmp(r.guard, l.guard, l.guard_size),
                  "the helper's guard differs from the in-process one");
    assert_same(&l, &r, "CUDA C -> cubin with a trap guard");
    hkp_artifact_free(&r);
    hkp_artifact_free(&l);
    uint64_t builds, starts;
    hkp_iso_counts(iso, &builds, &starts);
    ck_assert_uint_eq(builds, 6);
    ck_assert_uint_eq(starts, 1);
    hkp_iso_destroy(iso);
}
END_TEST

/* (1) Through the engine: an isolated swap gives a version with the same
 * kernel and parameter layout, and a cache hit never reaches the helper. */
START_TEST(isolated_swap_works_and_cache_stays_here) {
    char *dir = hkt_tmpdir();
    rt = make_rt(1, 0, dir);
    ck_assert_ptr_nonnull(rt->iso);
    ck_assert_ptr_null(rt->warm);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(swap_src("sim", good_src, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(rep.cache_hit, 0);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    hkl_version *v = atomic_load(&k->mod->current);
    ck_assert_int_eq(v->art.meta.nentries, 1);
    ck_assert_int_eq(v->art.meta.entries[0].nparams, 3);
    ck_assert_uint_eq(v->art.meta.entries[0].params[1].size, 4);
    const char *src2 = "extern \"C\" __global__ void step(float *x, unsigned n, float dt) {\n"
                       "    if (threadIdx.x < n) x[threadIdx.x] -= dt;\n}\n";
    ck_assert_msg(swap_src("sim", src2, &rep) == 0, "%s", rep.message);
    uint64_t builds, starts;
    hkp_iso_counts(rt->iso, &builds, &starts);
    ck_assert_uint_eq(builds, 2);
    /* The first source again: the cache here answers, the helper is idle. */
    ck_assert_msg(swap_src("sim", good_src, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(rep.cache_hit, 1);
    hkp_iso_counts(rt->iso, &builds, &starts);
    ck_assert_uint_eq(builds, 2);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 3);
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);
    rt = NULL;
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* Another process holds the compile cache's lock and never lets go (it
 * stopped): the swap completes, its image not cached, and its report says
 * so. */
START_TEST(swap_goes_on_when_the_cache_lock_is_held) {
    char *dir = hkt_tmpdir();
    char lock[600];
    snprintf(lock, sizeof lock, "%s/lock", dir);
    pid_t holder = hkt_hold_lock_stopped(lock);
    ck_assert_int_gt(holder, 0);
    rt = make_rt(1, 0, dir);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(swap_src("sim", good_src, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(rep.cache_hit, 0);
    ck_assert_msg(strstr(rep.message, "compile cache") && strstr(rep.message, "not cached"), "%s",
                  rep.message);
    kill(holder, SIGKILL);
    ck_assert_int_eq(waitpid(holder, NULL, 0), holder);
    ck_assert_msg(swap_src("sim", good_src, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(rep.cache_hit, 0); /* it was not cached */
    ck_assert_msg(swap_src("sim", good_src, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(rep.cache_hit, 1); /* now it is */
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);
    rt = NULL;
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* (2) A compile error is refused with NVRTC's log in the report. */
START_TEST(compile_error_reports_nvrtc_log) {
    rt = make_rt(1, 0, NULL);
    hk_report rep = HK_REPORT_INIT;
    const char *bad = "extern \"C\" __global__ void step(float *x) { x[0] = undeclared_thing; }\n";
    ck_assert_int_eq(swap_src("bad", bad, &rep), HK_ERR_COMPILE);
    ck_assert_ptr_nonnull(rep.log);
    ck_assert_msg(strstr(rep.log, "undeclared_thing") && strstr(rep.log, "error"), "log: %s",
                  rep.log);
    ck_assert_msg(strstr(rep.message, "undeclared_thing"), "%s", rep.message);
    ck_assert_uint_eq(hk_module_version(rt, "bad"), 0);
    /* The helper is fine after a refused source: the next build works. */
    pid_t pid = hkp_iso_pid(rt->iso);
    ck_assert_msg(swap_src("bad", good_src, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(hkp_iso_pid(rt->iso), pid);
    hk_report_clear(&rep);
}
END_TEST

typedef struct swap_arg {
    const char *src;
    int err;
    hk_report rep;
} swap_arg;

static void *swap_thread(void *p) {
    swap_arg *a = p;
    a->rep = (hk_report)HK_REPORT_INIT;
    a->err = swap_src("m", a->src, &a->rep);
    return NULL;
}

/* (3) The helper killed in the middle of a build: that build is refused,
 * saying so; the next one succeeds on a new helper. */
START_TEST(helper_killed_mid_build_is_replaced) {
    setenv("HK_BUILD_TEST_STALL_MS", "1500", 1);
    rt = make_rt(1, 0, NULL);
    pid_t first = hkp_iso_pid(rt->iso);
    ck_assert_int_gt(first, 0);
    swap_arg a = {.src = good_src};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, swap_thread, &a), 0);
    for (int i = 0; i < 3000 && !hkp_iso_busy(rt->iso); i++)
        usleep(10000);
    ck_assert(hkp_iso_busy(rt->iso)); /* the request is with the helper */
    ck_assert_int_eq(kill(first, SIGKILL), 0);
    pthread_join(t, NULL);
    ck_assert_int_eq(a.err, HK_ERR_COMPILE);
    ck_assert_msg(strstr(a.rep.message, "the build helper died during the build (signal 9)") &&
                      strstr(a.rep.message, "restarted"),
                  "%s", a.rep.message);
    ck_assert_uint_eq(hk_module_version(rt, "m"), 0);
    pid_t second = hkp_iso_pid(rt->iso);
    ck_assert_int_gt(second, 0);
    ck_assert_int_ne(second, first);
    hk_report_clear(&a.rep);
    ck_assert_msg(swap_src("m", good_src, &a.rep) == 0, "%s", a.rep.message);
    ck_assert_uint_eq(hk_module_version(rt, "m"), 1);
    hk_report_clear(&a.rep);
}
END_TEST

/* (4) A build that outlives build_timeout_ms is refused and the helper
 * replaced. */
START_TEST(build_past_timeout_is_refused) {
    setenv("HK_BUILD_TEST_STALL_MS", "5000", 1);
    rt = make_rt(1, 300, NULL);
    pid_t first = hkp_iso_pid(rt->iso);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_src("slow", good_src, &rep), HK_ERR_COMPILE);
    ck_assert_msg(strstr(rep.message, "build did not finish within 300 ms"), "%s", rep.message);
    ck_assert_uint_eq(hk_module_version(rt, "slow"), 0);
    pid_t second = hkp_iso_pid(rt->iso);
    ck_assert_int_gt(second, 0);
    ck_assert_int_ne(second, first);
    /* The killed helper is gone and reaped (by pid). */
    ck_assert_int_eq(waitpid(first, NULL, WNOHANG), -1);
    ck_assert_int_eq(errno, ECHILD);
    uint64_t builds, starts;
    hkp_iso_counts(rt->iso, &builds, &starts);
    ck_assert_uint_eq(starts, 2);
    hk_report_clear(&rep);
}
END_TEST

static _Atomic int destroyed;

static void *destroy_and_flag(void *arg) {
    hk_runtime_destroy(arg);
    atomic_store(&destroyed, 1);
    return NULL;
}

/* Destroy is bounded by destroy_wait_ms, not by build_timeout_ms: a build
 * the worker is waiting for in a helper that stalls for a minute is cut
 * short (the helper's socket shut down) and nothing is committed. */
START_TEST(destroy_does_not_wait_for_an_isolated_build) {
    setenv("HK_BUILD_TEST_STALL_MS", "60000", 1);
    rt = make_rt(1, 120000, NULL);
    ck_assert_int_eq(hk_submit(rt, "slow", good_src, strlen(good_src), NULL), 0);
    /* The request is with the helper. */
    for (int i = 0; i < 1000 && !hkp_iso_busy(rt->iso); i++)
        usleep(10 * 1000);
    ck_assert(hkp_iso_busy(rt->iso));
    pid_t helper = hkp_iso_pid(rt->iso);
    atomic_store(&destroyed, 0);
    pthread_t t;
    pthread_create(&t, NULL, destroy_and_flag, rt);
    int i;
    for (i = 0; i < 1000 && !atomic_load(&destroyed); i++)
        usleep(10 * 1000);
    ck_assert_msg(atomic_load(&destroyed), "destroy still waiting for the build after 10 s");
    pthread_join(t, NULL);
    rt = NULL;
    /* The helper is gone and reaped. */
    ck_assert_int_eq(waitpid(helper, NULL, WNOHANG), -1);
}
END_TEST

/* A helper that stops reading cannot hold the application: a request far
 * larger than the socket's buffer (a 4 MiB source) to a helper that does not
 * read for 30 s is refused at build_timeout_ms, not when the helper wakes. */
START_TEST(helper_that_stops_reading_cannot_hold_a_build) {
    setenv("HK_BUILD_TEST_DEAF_MS", "30000", 1);
    rt = make_rt(1, 300, NULL);
    size_t pad = 4u << 20, n = strlen(good_src);
    char *src = malloc(pad + n + 1);
    ck_assert_ptr_nonnull(src);
    memset(src, ' ', pad);
    memcpy(src + pad, good_src, n + 1);
    hk_report rep = HK_REPORT_INIT;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(hk_swap(rt, "big", src, pad + n, NULL, &rep), HK_ERR_COMPILE);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_msg(strstr(rep.message, "did not finish within 300 ms"), "%s", rep.message);
    /* Not a speed check: before the send had a deadline this call returned
     * only when the helper read again, 30 s later. */
    ck_assert_msg(s < 20.0, "the build was held %.1f s by a helper that did not read", s);
    ck_assert_uint_eq(hk_module_version(rt, "big"), 0);
    free(src);
    hk_report_clear(&rep);
}
END_TEST

/* (5) The key property: while isolated builds run (the warm-up included),
 * SIGTERM's disposition is the application's the whole time, and a SIGTERM
 * raised during each build reaches the application's handler.
 *
 * In process (HK_TEST_BUILD_IN_PROCESS=1) this fails: measured here with
 * NVRTC 13.0, the first compile of a process (the warm-up, or the first
 * build) swaps NVRTC's handler in, and the SIGTERM raised then ends the
 * process (measured: exit status 4 or 0, or SIGSEGV, from run to run).
 * Each Check test runs in a fresh process, so its first compile is covered
 * (not with CK_FORK=no after other tests compiled). */
static volatile sig_atomic_t app_signals;
static void app_handler(int sig) {
    (void)sig;
    app_signals++;
}

static atomic_int watching, in_build, raised, foreign;
static hk_runtime *_Atomic watched_rt;

/* 1 when the build in progress has reached the point to raise at: the
 * request is with the helper (isolated), or NVRTC's handler is in (in
 * process), or 20 ms have passed (in process, a later compile). */
static int into_build(double since) {
    hk_runtime *r = atomic_load(&watched_rt);
    if (r && r->iso)
        return hkp_iso_busy(r->iso);
    return atomic_load(&foreign) || hku_now_ms() - since > 20;
}

static void *watch_and_raise(void *arg) {
    (void)arg;
    int raised_for = 0;
    double since = 0;
    while (atomic_load(&watching)) {
        struct sigaction cur;
        if (sigaction(SIGTERM, NULL, &cur) == 0 && cur.sa_handler != app_handler)
            atomic_fetch_add(&foreign, 1);
        int b = atomic_load(&in_build); /* build number + 1 while one runs */
        if (!b)
            since = 0;
        else if (!since)
            since = hku_now_ms();
        if (b && raised_for != b && into_build(since)) {
            raise(SIGTERM);
            atomic_fetch_add(&raised, 1);
            raised_for = b;
        }
        usleep(50);
    }
    return NULL;
}

/* The scenario, in a process of its own (NVRTC's handler ends the process
 * that runs it, which Check cannot tell from success): 0 when every check
 * held, else 1 with what failed printed. */
static int signal_scenario(int isolated) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = app_handler;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) || sigaction(SIGINT, &sa, NULL))
        return 1;
    /* Each request stays with the helper at least 30 ms, so the watcher
     * sees it there. */
    setenv("HK_BUILD_TEST_STALL_MS", "30", 1);
    atomic_store(&watching, 1);
    pthread_t w;
    pthread_create(&w, NULL, watch_and_raise, NULL);
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.build_isolated = isolated; /* the warm-up runs at create, here or there */
    if (hkl_runtime_create_with(&rt, &o, fake_driver(), NULL))
        return 1;
    atomic_store(&watched_rt, rt);
    int failed = 0;
    for (int i = 0; i < 10 && !failed; i++) {
        char src[256];
        snprintf(src, sizeof src,
                 "extern \"C\" __global__ void step(int *o, unsigned n) { o[0] = n + %d; }\n", i);
        hk_report rep = HK_REPORT_INIT;
        atomic_store(&in_build, i + 1);
        if (swap_src("sig", src, &rep) != 0)
            failed = printf("build %d failed: %s\n", i, rep.message);
        atomic_store(&in_build, 0);
        hk_report_clear(&rep);
    }
    atomic_store(&watching, 0);
    pthread_join(w, NULL);
    atomic_store(&watched_rt, NULL);
    printf("signals (%s builds): %d SIGTERMs raised during builds, %d reached the handler, "
           "a foreign SIGTERM handler seen in %d polls\n",
           isolated ? "isolated" : "in-process", atomic_load(&raised), (int)app_signals,
           atomic_load(&foreign));
    failed |= atomic_load(&foreign) != 0 || atomic_load(&raised) != 10 || app_signals != 10 ||
              hk_module_version(rt, "sig") != 10;
    hk_runtime_destroy(rt);
    rt = NULL;
    return failed ? 1 : 0;
}

START_TEST(signal_dispositions_untouched_while_building) {
    int isolated = !getenv("HK_TEST_BUILD_IN_PROCESS");
    fflush(stdout);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int rc = signal_scenario(isolated);
        fflush(stdout);
        _exit(rc == 0 ? 42 : 43);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(
        WIFEXITED(st) && WEXITSTATUS(st) >= 42,
        "the process running the builds ended (%s %d) before they finished: NVRTC's handler",
        WIFEXITED(st) ? "exit status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    ck_assert_msg(WEXITSTATUS(st) == 42, "a check failed (printed above)");
}
END_TEST

static int count_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    ck_assert_ptr_nonnull(d);
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Waits until pid has ended, without reaping it (that is the library's to
 * do): WNOWAIT leaves it waitable. */
static void wait_ended(pid_t pid) {
    siginfo_t info;
    ck_assert_int_eq(waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT), 0);
}

/* (6) After destroy no helper is left, running or zombie, and no
 * descriptor: also with a helper that died while idle and was replaced. */
START_TEST(destroy_leaves_no_process_or_fd) {
    fake_init(1, 90);
    int before = count_fds();
    rt = make_rt(1, 0, NULL);
    pid_t first = hkp_iso_pid(rt->iso);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(swap_src("m", good_src, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(kill(first, SIGKILL), 0); /* dies while idle */
    wait_ended(first);
    const char *src2 = "extern \"C\" __global__ void step(float *x, unsigned n, float dt) {}\n";
    ck_assert_msg(swap_src("m", src2, &rep) == 0, "%s", rep.message); /* on a new one */
    pid_t second = hkp_iso_pid(rt->iso);
    ck_assert_int_ne(second, first);
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);
    rt = NULL;
    pid_t pids[] = {first, second};
    for (int i = 0; i < 2; i++) {
        errno = 0;
        ck_assert_int_eq(waitpid(pids[i], NULL, WNOHANG), -1); /* reaped: not our child */
        ck_assert_int_eq(errno, ECHILD);
    }
    ck_assert_int_eq(count_fds(), before);
}
END_TEST

/* An untrusted helper: one that greets properly and then announces a reply
 * of 4 GiB is killed before anything is allocated for it, and the build is
 * refused; one that greets with the wrong magic likewise. */
/* A runtime whose build helper is the shell script; the result of creating
 * it (rt set on success), its report's message in msg. */
static int create_with_script(const char *dir, const char *script, char *msg, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/bad-build", dir);
    ck_assert_int_eq(hkt_write_file(path, script), 0);
    ck_assert_int_eq(chmod(path, 0755), 0);
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.no_warm_start = 1;
    o.build_isolated = 1;
    o.build_helper = path;
    o.build_timeout_ms = 10000;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&rt, &o, fake_driver(), &rep);
    snprintf(msg, n, "%s", rep.message);
    hk_report_clear(&rep);
    return err;
}

static void run_bad_helper(const char *script, const char *want) {
    char *dir = hkt_tmpdir();
    char msg[512];
    ck_assert_msg(create_with_script(dir, script, msg, sizeof msg) == 0, "%s", msg);
    pid_t first = hkp_iso_pid(rt->iso);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_src("m", good_src, &rep), HK_ERR_COMPILE);
    ck_assert_msg(strstr(rep.message, want), "%s", rep.message);
    ck_assert_int_ne(hkp_iso_pid(rt->iso), first); /* replaced */
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);
    rt = NULL;
    hkt_rmtree(dir);
    free(dir);
}

START_TEST(untrusted_helper_replies_are_refused) {
    /* READY {protocol 3}, then a BUILT header claiming 0xffffffff bytes. */
    run_bad_helper("#!/bin/sh\n"
                   "printf 'HBLD\\001\\000\\000\\000\\004\\000\\000\\000\\003\\000\\000\\000' >&3\n"
                   "sleep 0.3\n"
                   "printf 'HBLD\\003\\000\\000\\000\\377\\377\\377\\377' >&3\n"
                   "exec sleep 30\n",
                   "the build helper answered nonsense; it was killed and restarted");
}
END_TEST

/* A helper that cannot serve at all fails the runtime's creation, saying
 * why, instead of every build: one that greets in another protocol, one
 * that ends at once. */
START_TEST(helper_without_a_greeting_fails_create) {
    char *dir = hkt_tmpdir();
    char msg[512];
    ck_assert_int_eq(
        create_with_script(
            dir,
            "#!/bin/sh\n"
            "printf 'HCKN\\001\\000\\000\\000\\004\\000\\000\\000\\002\\000\\000\\000' "
            ">&3\n"
            "exec sleep 30\n",
            msg, sizeof msg),
        HK_ERR_IO);
    ck_assert_msg(strstr(msg, "did not start: a greeting hotkern does not understand"), "%s", msg);
    ck_assert_ptr_null(rt);
    ck_assert_int_eq(create_with_script(dir, "#!/bin/sh\nexit 127\n", msg, sizeof msg), HK_ERR_IO);
    ck_assert_msg(strstr(msg, "did not start: it ended"), "%s", msg);
    ck_assert_msg(strstr(msg, "127"), "%s", msg);
    ck_assert_ptr_null(rt);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* A helper that cannot be started fails creation, saying so. */
START_TEST(missing_helper_fails_create) {
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.build_isolated = 1;
    o.build_helper = "/nonexistent/hotkern-build";
    o.cache_dir = "";
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), HK_ERR_IO);
    ck_assert_msg(strstr(rep.message, "cannot start the build helper"), "%s", rep.message);
    ck_assert_ptr_null(rt);
    /* Defaults: in process, two minutes. */
    ck_assert_int_eq(o.build_timeout_ms, 120000);
    hk_options_init(&o);
    ck_assert_int_eq(o.build_isolated, 0);
    ck_assert_ptr_null(o.build_helper);
}
END_TEST

/* ---- the memory NVRTC frees ------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZER_ALLOCATOR 1 /* its malloc ignores mallopt */
#else
#define SANITIZER_ALLOCATOR 0
#endif

/* Minor page faults of process pid so far (/proc/PID/stat, field 10). */
static long proc_minflt(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* after the command name */
    ck_assert_ptr_nonnull(p);
    long v[8] = {0};
    char st;
    ck_assert_int_eq(sscanf(p + 2, "%c %ld %ld %ld %ld %ld %ld %ld", &st, &v[0], &v[1], &v[2],
                            &v[3], &v[4], &v[5], &v[6]),
                     8);
    return v[6]; /* ppid pgrp session tty tpgid flags minflt */
}

static char *tiny_variant(int v) {
    char *src = malloc(160);
    snprintf(src, 160, "extern \"C\" __global__ void k(int *o) { o[threadIdx.x] = %d; }\n", v);
    return src;
}

/* (9) The helper keeps what NVRTC frees, whatever malloc settings it
 * inherits: the same builds, of a new source each, fault fewer fresh pages
 * in there than in this process, whose malloc is left as glibc sets it (measured 1,264 against
 * 2,787 per one-line compile). Page faults are counted, not timed. */
START_TEST(helper_keeps_the_memory_nvrtc_frees) {
    char why[256] = "";
    hkp_iso *iso = NULL;
    /* Malloc settings in the application's environment (which this process
     * read at its start, not now) reach the helper, which keeps the heap
     * all the same. */
    setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072", 1);
    setenv("MALLOC_TOP_PAD_", "131072", 1);
    ck_assert_msg(
        hkp_iso_create(&iso, hkt_built_program("hotkern-build"), 60000, 0, why, sizeof why) == 0,
        "%s", why);
    hkp_build_opts o = {.arch = 90, .ptx_to_cubin = 1, .opt_level = 3, .pch = 1};
    long here = 0, there = 0;
    const int warm = 3, n = 3;
    for (int i = 0; i < warm + n; i++) {
        hkp_artifact a, b;
        char *src = tiny_variant(1000 + 2 * i);
        struct rusage r0, r1;
        getrusage(RUSAGE_THREAD, &r0);
        o.iso = NULL;
        ck_assert_msg(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why) == 0,
                      "%s", why);
        getrusage(RUSAGE_THREAD, &r1);
        free(src);
        src = tiny_variant(1001 + 2 * i);
        o.iso = iso;
        long f0 = proc_minflt(hkp_iso_pid(iso));
        ck_assert_msg(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &b, why, sizeof why) == 0,
                      "%s", why);
        long f1 = proc_minflt(hkp_iso_pid(iso));
        free(src);
        ck_assert_int_eq(a.format, HK_FORMAT_CUBIN);
        ck_assert_int_eq(b.format, HK_FORMAT_CUBIN);
        hkp_artifact_free(&a);
        hkp_artifact_free(&b);
        if (i >= warm) {
            here += r1.ru_minflt - r0.ru_minflt;
            there += f1 - f0;
        }
    }
    hkp_iso_destroy(iso);
    printf("page faults per one-line compile: %ld in this process, %ld in the helper\n", here / n,
           there / n);
    if (SANITIZER_ALLOCATOR) {
        printf("sanitizer build: its allocator ignores mallopt; fault counts not compared\n");
        return;
    }
    ck_assert_msg(there * 4 < here * 3,
                  "the helper faulted %ld pages per build, this process %ld: it does not keep "
                  "the memory NVRTC frees",
                  there / n, here / n);
}
END_TEST

/* Runs fn in a child process (each process decides once) and returns its
 * exit status. */
static int in_child(int (*fn)(void)) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int r = fn();
        fflush(NULL);
        _exit(r);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* 0: kept, and the next compiles fault fewer pages; 1.. : what failed. */
static int keep_here(void) {
    unsetenv("GLIBC_TUNABLES");
    hk_report rep = HK_REPORT_INIT;
    int r = hk_build_keep_memory(&rep);
    if (SANITIZER_ALLOCATOR) /* refused, and said so; or honoured */
        return r == 1 || (r == HK_ERR_IO && strstr(rep.message, "mallopt")) ? 0 : 1;
    if (r != 1 || hk_build_keep_memory(NULL) != 1)
        return 2;
    return 0;
}

static int keep_left_to_tunables(void) {
    setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072", 1);
    hk_report rep = HK_REPORT_INIT;
    int r = hk_build_keep_memory(&rep);
    if (r != 0 || !strstr(rep.message, "GLIBC_TUNABLES"))
        return 1;
    return hk_build_keep_memory(NULL) == 0 ? 0 : 2;
}

static int keep_left_to_malloc_env(void) {
    unsetenv("GLIBC_TUNABLES");
    setenv("MALLOC_TOP_PAD_", "131072", 1);
    hk_report rep = HK_REPORT_INIT;
    return hk_build_keep_memory(&rep) == 0 && strstr(rep.message, "MALLOC_TOP_PAD_") ? 0 : 1;
}

/* The faults of a build in this process once it keeps the memory: fewer
 * than before it did (the same process, builds of new sources). */
static int keep_cuts_faults(void) {
    unsetenv("GLIBC_TUNABLES");
    hkp_build_opts o = {.arch = 90, .ptx_to_cubin = 1, .opt_level = 3, .pch = 1};
    long before = 0, after = 0;
    char why[256];
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1 && hk_build_keep_memory(NULL) != 1)
            return 3;
        for (int i = 0; i < 6; i++) {
            char *src = tiny_variant(3000 + 10 * phase + i);
            struct rusage r0, r1;
            hkp_artifact a;
            getrusage(RUSAGE_THREAD, &r0);
            int rc = hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why);
            getrusage(RUSAGE_THREAD, &r1);
            free(src);
            if (rc != 0)
                return 4;
            hkp_artifact_free(&a);
            if (i >= 3)
                *(phase ? &after : &before) += r1.ru_minflt - r0.ru_minflt;
        }
    }
    printf("page faults, three one-line compiles: %ld before hk_build_keep_memory, %ld after\n",
           before, after);
    return after * 4 < before * 3 ? 0 : 5;
}

START_TEST(keep_memory_on_request_only) {
    ck_assert_int_eq(in_child(keep_here), 0);
    ck_assert_int_eq(in_child(keep_left_to_tunables), 0);
    ck_assert_int_eq(in_child(keep_left_to_malloc_env), 0);
    if (!SANITIZER_ALLOCATOR)
        ck_assert_int_eq(in_child(keep_cuts_faults), 0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("buildproc");
    TCase *tc = tcase_create("isolated builds");
    tcase_set_timeout(tc, 240);
    tcase_add_checked_fixture(tc, NULL, teardown);
    if (getenv("HK_TEST_BUILD_IN_PROCESS")) { /* the one test that shows the difference */
        tcase_add_test(tc, signal_dispositions_untouched_while_building);
        suite_add_tcase(s, tc);
        return s;
    }
    tcase_add_test(tc, isolated_images_match_in_process);
    tcase_add_test(tc, isolated_swap_works_and_cache_stays_here);
    tcase_add_test(tc, swap_goes_on_when_the_cache_lock_is_held);
    tcase_add_test(tc, compile_error_reports_nvrtc_log);
    tcase_add_test(tc, helper_killed_mid_build_is_replaced);
    tcase_add_test(tc, build_past_timeout_is_refused);
    tcase_add_test(tc, destroy_does_not_wait_for_an_isolated_build);
    tcase_add_test(tc, helper_that_stops_reading_cannot_hold_a_build);
    tcase_add_test(tc, signal_dispositions_untouched_while_building);
    tcase_add_test(tc, destroy_leaves_no_process_or_fd);
    tcase_add_test(tc, untrusted_helper_replies_are_refused);
    tcase_add_test(tc, missing_helper_fails_create);
    tcase_add_test(tc, helper_without_a_greeting_fails_create);
    tcase_add_test(tc, helper_keeps_the_memory_nvrtc_frees);
    tcase_add_test(tc, keep_memory_on_request_only);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

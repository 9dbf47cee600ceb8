/*
 * What feeds the engine: headers in memory, sources that hear builds and
 * destroy, the warm start, and the application's signal handlers kept
 * through builds.
 */
#include "tests/engine/fixture.h"

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

void engine_sources_tests(TCase *tc) {
    tcase_add_test(tc, swap_with_in_memory_headers);
    tcase_add_test(tc, sources_hear_builds_and_destroy);
    tcase_add_test(tc, warm_start_runs_and_stops);
    tcase_add_test(tc, signal_handlers_installed_first_survive_builds);
}

/*
 * A watch's handle and settings: stopped from any thread and from its own
 * callback, its extensions and recursion, the swap template, adding the
 * same directory again and the arguments refused, and the build profile.
 */
#include "tests/watch/fixture.h"

static volatile int saver_stop;

/* Saves step.ptx again and again, a new tag each time. */
static void *saver_main(void *arg) {
    char b[512];
    (void)arg;
    for (int i = 100; !__atomic_load_n(&saver_stop, __ATOMIC_RELAXED); i++) {
        snprintf(b, sizeof b,
                 "// tag: %d\n.version 8.0\n.target sm_90\n.address_size 64\n"
                 ".visible .entry step(.param .u64 out, .param .u32 n)\n{\n ret;\n}\n",
                 i);
        write_file("step.ptx", b);
        usleep(1000);
    }
    return NULL;
}

/* When hk_watch_stop returns, nothing more is submitted (the engine's
 * submission counter stands still while the file keeps changing) and no
 * callback comes from the watch; its directory can be watched again. */
START_TEST(api_watch_stop) {
    hk_watch *wa = NULL;
    pthread_t t;
    uint64_t seq;
    int c, r;

    write_file("step.ptx", ptx_text(1));
    usleep(60 * 1000);
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    __atomic_store_n(&saver_stop, 0, __ATOMIC_RELAXED);
    ck_assert_int_eq(pthread_create(&t, NULL, saver_main, NULL), 0);
    ck_assert_uint_ge(wait_version("step", 3), 3); /* saves reach the engine */
    hk_watch_stop(wa);
    seq = atomic_load(&rt->work.job_seq);
    usleep(SETTLE_MS * 1000);
    __atomic_store_n(&saver_stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    ck_assert_uint_eq(atomic_load(&rt->work.job_seq), seq);
    /* What it submitted before ends as any submission. */
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    c = events_of(&ev_committed);
    r = events_of(&ev_refused);
    write_file("step.ptx", ptx_text(999));
    write_file("bad.cubin", "text, not a cubin\n"); /* would be a refusal */
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    ck_assert_int_eq(events_of(&ev_committed), c);
    ck_assert_int_eq(events_of(&ev_refused), r);
    ck_assert_uint_eq(atomic_load(&rt->work.job_seq), seq);
    hk_watch_stop(NULL);

    /* Free again: a new watch builds what changed meanwhile. */
    uint64_t v = hk_module_version(rt, "step");
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("step", v + 1), v + 1);
    hk_watch_stop(wa);
}
END_TEST

/* hk_watch_stop from an event callback on the watch's own thread (a
 * refusal of it) returns; nothing more comes from that watch, and its
 * directory is free again. */
START_TEST(api_watch_stop_from_its_callback) {
    hk_watch *wa = NULL, *wb = NULL;

    write_file("step.ptx", ptx_text(1));
    usleep(60 * 1000);
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    pthread_mutex_lock(&ev_mu);
    ev_stop_watch = wa;
    pthread_mutex_unlock(&ev_mu);
    write_file("bad.cubin", "text, not a cubin\n");
    wait_events(&ev_stopped, 1);
    write_file("step.ptx", ptx_text(2));
    write_file("bad2.cubin", "more text\n");
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    ck_assert_uint_eq(hk_module_version(rt, "step"), 1);
    ck_assert_int_eq(events_of(&ev_refused), 1);
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wb, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 2), 2);
    hk_watch_stop(wb);
}
END_TEST

/* Options: only the extensions asked for, subdirectories at any depth
 * (those created later too, not dot-directories), and no refusal of the
 * other names of a tree. */
START_TEST(api_watch_extensions_and_recursion) {
    static const char *const exts[] = {"ptx"};
    hk_watch_options wo;
    hk_watch *wa = NULL;
    char p[PATH_MAX];

    path_in(p, sizeof p, dir, "sub");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    path_in(p, sizeof p, dir, "sub/deeper");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    path_in(p, sizeof p, dir, ".git");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    write_file("step.ptx", ptx_text(1));
    write_file("a.cu", "extern \"C\" __global__ void step(int *out, unsigned n) {}\n");
    write_file("notes.txt", "notes\n");
    write_file("sub/deeper/k2.ptx", ptx_text(2));
    write_file(".git/k3.ptx", ptx_text(3));
    usleep(60 * 1000);
    hk_watch_options_init(&wo);
    wo.extensions = exts;
    wo.nextensions = 1;
    wo.recursive = 1;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    ck_assert_uint_eq(wait_version("k2", 1), 1);
    path_in(p, sizeof p, dir, "later");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    write_file("later/k4.ptx", ptx_text(4));
    ck_assert_uint_eq(wait_version("k4", 1), 1);
    write_file("a.cu", "extern \"C\" __global__ void step(int *out, unsigned n) { }\n");
    write_file("notes.txt", "more notes\n");
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    ck_assert_uint_eq(hk_module_version(rt, "a"), 0);
    ck_assert_uint_eq(hk_module_version(rt, "k3"), 0);
    ck_assert_int_eq(events_of(&ev_refused), 0);
    ck_assert_int_eq(events_of(&ev_committed), 3);
    hk_watch_stop(wa);
}
END_TEST

static int veto_check(const char *module, uint64_t version, void *ud, char *msg, size_t n) {
    (void)version;
    (void)ud;
    if (strcmp(module, "vetoed") != 0)
        return 0;
    snprintf(msg, n, "vetoed by the watch's template");
    return 1;
}

/* Adds a test launch to kernel "step" of module: its versions then have
 * canary tests to run. */
static void add_test_launch(const char *module) {
    hk_kernel *k;
    hk_test *t;
    uint32_t n = 4;
    ck_assert_int_eq(hk_kernel_get(rt, module, "step", &k), 0);
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){32, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_test_buffer(t, 64, HK_FILL_ZERO, 0, NULL), 0);
    ck_assert_int_eq(hk_test_scalar(t, &n, sizeof n), 0);
    ck_assert_int_eq(hk_kernel_add_test(k, t, NULL), 0);
    hk_test_destroy(t);
}

/* The swap options template reaches every submission of its watch: its
 * check callback refuses what it vetoes, and its canary policy (REQUIRE,
 * with no canary to run the tests in) refuses a version with tests, where a
 * watch with the defaults (OPTIONAL) commits it. */
START_TEST(api_watch_swap_template) {
    hk_swap_options so;
    hk_watch_options wo;
    hk_watch *wa = NULL, *wb = NULL;
    char other[PATH_MAX], p[PATH_MAX];

    path_in(other, sizeof other, root, "other");
    ck_assert_int_eq(mkdir(other, 0755), 0);
    write_file("step.ptx", ptx_text(1));
    write_file("vetoed.ptx", ptx_text(1));
    path_in(p, sizeof p, other, "free.ptx");
    write_at(p, ptx_text(1));
    usleep(60 * 1000);
    hk_swap_options_init(&so);
    so.check = veto_check;
    so.canary = HK_CANARY_REQUIRE;
    hk_watch_options_init(&wo);
    wo.swap = &so;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &wa, NULL), 0);
    ck_assert_int_eq(hk_watch_start(rt, other, NULL, &wb, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    ck_assert_uint_eq(wait_version("free", 1), 1);
    wait_events(&ev_refused, 1);
    refused_event e = refused_for("vetoed.ptx");
    ck_assert_int_eq(e.error, HK_ERR_REJECTED);
    ck_assert_ptr_nonnull(strstr(e.message, "vetoed by the watch's template"));
    ck_assert_uint_eq(hk_module_version(rt, "vetoed"), 0);

    add_test_launch("step");
    add_test_launch("free");
    write_file("step.ptx", ptx_text(2));
    write_at(p, ptx_text(2));
    wait_events(&ev_refused, 2);
    ck_assert_uint_eq(wait_version("free", 2), 2);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    e = refused_for("step.ptx");
    ck_assert_int_eq(e.error, HK_ERR_CANARY_UNAVAILABLE);
    ck_assert_uint_eq(hk_module_version(rt, "step"), 1);
    hk_watch_stop(wa);
    hk_watch_stop(wb);
}
END_TEST

/* A directory is watched by one watch: the same one again, one inside a
 * recursive watch, the parent of a watched one (recursive), and the
 * directories of hk_watch_dir are refused with HK_ERR_BUSY, saying which
 * watch covers them; after a stop the directory is free. Bad arguments. */
START_TEST(api_watch_readd_and_arguments) {
    static const char *const bad_ext[] = {"txt"};
    hk_watch_options wo;
    hk_watch *wa = NULL, *wsub = NULL, *wr = NULL, *x = NULL;
    hk_report rep = HK_REPORT_INIT;
    char sub[PATH_MAX], other[PATH_MAX], p[PATH_MAX];

    path_in(sub, sizeof sub, dir, "sub");
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    path_in(other, sizeof other, root, "other");
    ck_assert_int_eq(mkdir(other, 0755), 0);
    hk_watch_options_init(&wo);

    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wa, &rep), 0);
    x = (hk_watch *)&rep; /* must be cleared on failure */
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &x, &rep), HK_ERR_BUSY);
    ck_assert_ptr_null(x);
    ck_assert_int_eq(rep.error, HK_ERR_BUSY);
    ck_assert_ptr_nonnull(strstr(rep.message, dir));
    ck_assert_int_eq(hk_watch_dir(rt, dir, NULL, &rep), HK_ERR_BUSY);
    /* Another directory, inside a watch that is not recursive: fine. */
    ck_assert_int_eq(hk_watch_start(rt, sub, NULL, &wsub, NULL), 0);
    wo.recursive = 1;
    ck_assert_int_eq(hk_watch_start(rt, root, &wo, &x, &rep), HK_ERR_BUSY);
    hk_watch_stop(wa);
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &x, &rep), HK_ERR_BUSY); /* sub is watched */
    hk_watch_stop(wsub);
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &wr, &rep), 0);
    wo.recursive = 0;
    ck_assert_int_eq(hk_watch_start(rt, sub, &wo, &x, &rep), HK_ERR_BUSY);
    ck_assert_int_eq(hk_watch_dir(rt, sub, NULL, &rep), HK_ERR_BUSY);
    /* hk_watch_dir's own directories: added again is fine, a watch of
     * them is not. */
    ck_assert_int_eq(hk_watch_dir(rt, other, NULL, &rep), 0);
    ck_assert_int_eq(hk_watch_dir(rt, other, NULL, &rep), 0);
    ck_assert_int_eq(hk_watch_start(rt, other, NULL, &x, &rep), HK_ERR_BUSY);
    ck_assert_int_eq(
        hk_watch_start(rt, root, &(hk_watch_options){.size = sizeof wo, .recursive = 1}, &x, &rep),
        HK_ERR_BUSY);
    hk_watch_stop(wr);

    /* Arguments. */
    ck_assert_int_eq(hk_watch_start(NULL, dir, NULL, &x, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(hk_watch_start(rt, NULL, NULL, &x, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, NULL, &rep), HK_ERR_INVALID);
    path_in(p, sizeof p, root, "missing");
    ck_assert_int_eq(hk_watch_start(rt, p, NULL, &x, &rep), HK_ERR_IO);
    ck_assert_ptr_nonnull(strstr(rep.message, "missing"));
    ck_assert_ptr_null(x);
    wo.extensions = bad_ext;
    wo.nextensions = 1;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &x, &rep), HK_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(rep.message, "txt"));
    wo.nextensions = 0;
    wo.debounce_ms = -1;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &x, &rep), HK_ERR_INVALID);
    wo.debounce_ms = 50;
    wo.size = 0;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &x, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(hk_watch_options_init_size(&wo, 4), HK_ERR_INVALID);
    hk_watch_options_init(&wo);
    ck_assert_int_eq(wo.debounce_ms, 50);
    ck_assert_int_eq(wo.open_wait_ms, 1000);
    ck_assert_int_eq(wo.build_profile, HK_BUILD_PROFILE_DEFAULT);
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &x, &rep), 0);
    hk_watch_stop(x);
    hk_report_clear(&rep);
}
END_TEST

/* The build profile reaches the build: the same CUDA C source built by a
 * watch with the default profile is the image hk_swap made (nothing new
 * commits); built by a watch with HK_BUILD_PROFILE_DEV it is another image
 * (NVRTC's fast-compile code), which commits. */
START_TEST(api_watch_build_profile) {
    static const char src[] =
        "extern \"C\" __global__ void step(int *out, unsigned n) { if (out) *out = n * 3 + 1; }\n";
    hk_swap_options so;
    hk_watch_options wo;
    hk_report rep = HK_REPORT_INIT;
    hk_watch *wa = NULL;
    char p[PATH_MAX];

    write_file("k.cu", src);
    path_in(p, sizeof p, dir, "k.cu");
    hk_swap_options_init(&so);
    so.source_name = p;
    ck_assert_msg(hk_swap(rt, "k", src, strlen(src), &so, &rep) == 0, "%s\n%s", rep.message,
                  rep.log ? rep.log : "");
    ck_assert_uint_eq(hk_module_version(rt, "k"), 1);
    usleep(60 * 1000);
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wa, NULL), 0);
    for (int i = 0; i < WAIT_MS / 10 && metric("hotkern_watch_handovers_total") < 1; i++)
        usleep(10 * 1000);
    ck_assert_uint_eq(metric("hotkern_watch_handovers_total"), 1);
    ck_assert_int_eq(hk_wait_idle(rt, 4 * WAIT_MS), 0);
    ck_assert_uint_eq(hk_module_version(rt, "k"), 1);
    hk_watch_stop(wa);

    hk_watch_options_init(&wo);
    wo.build_profile = HK_BUILD_PROFILE_DEV;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("k", 2), 2);
    ck_assert_int_eq(events_of(&ev_refused), 0);
    hk_watch_stop(wa);
    hk_report_clear(&rep);
}
END_TEST

void watch_api_stop_tests(TCase *tc) {
    tcase_add_test(tc, api_watch_stop);
    tcase_add_test(tc, api_watch_stop_from_its_callback);
    tcase_add_test(tc, api_watch_extensions_and_recursion);
    tcase_add_test(tc, api_watch_swap_template);
    tcase_add_test(tc, api_watch_readd_and_arguments);
    tcase_add_test(tc, api_watch_build_profile);
}

/*
 * The helper is not trusted: each way a misbehaving one (BUILD/stub/
 * hotkern-canary-bad, its HKBAD_MODE) answers is refused with its reason,
 * one table of cases; destroy never waits on it; helpers outliving their
 * kill are reaped; it inherits no descriptor of the application and its
 * output is its own; a push's default policy requires the canary.
 */
#include "tests/canary/fixture.h"

/* A helper that died while idle is replaced before the next run. */
/* The helper holds its socket and nothing else of the application's: an
 * fd opened without O_CLOEXEC before the runtime is not inherited. */
START_TEST(helper_inherits_no_application_fd) {
    int mine = open("/dev/null", O_RDONLY); /* no O_CLOEXEC on purpose */
    ck_assert_int_ge(mine, 0);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_REQUIRE, &rep), 0); /* the helper is up */
    char path[64], target[256];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)hka_helper_pid(rt->canary), mine);
    ssize_t n = readlink(path, target, sizeof target - 1);
    ck_assert_msg(n < 0, "the helper holds fd %d (%.*s)", mine, (int)(n > 0 ? n : 0), target);
    close(mine);
    hk_report_clear(&rep);
}
END_TEST

/* A helper's output is its own: a kernel's printf flood (here 4 MiB on the
 * helper's stdout and stderr) reaches neither the application's stdout nor
 * its stderr, and does not stall the helper or the swap. */
START_TEST(helper_output_is_its_own) {
    char path[PATH_MAX], *text = NULL;
    snprintf(path, sizeof path, "/tmp/hk-canary-out.%d", (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(fd, 0);
    fflush(stdout);
    fflush(stderr);
    int saved1 = dup(1), saved2 = dup(2);
    ck_assert(saved1 >= 0 && saved2 >= 0);
    ck_assert_int_eq(dup2(fd, 1), 1);
    ck_assert_int_eq(dup2(fd, 2), 2);
    setenv("HKBAD_MODE", "flood", 1);
    rt = make_rt(bad_helper, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    int err = swap_tag(2, 0, HK_CANARY_REQUIRE, &rep);
    hk_runtime_destroy(rt);
    rt = NULL;
    fflush(stdout);
    fflush(stderr);
    dup2(saved1, 1);
    dup2(saved2, 2);
    close(saved1);
    close(saved2);
    size_t len = 0;
    ck_assert_int_eq(hku_read_file(path, 64u << 20, &text, &len, NULL), 0);
    close(fd);
    unlink(path);
    ck_assert_int_eq(err, HK_ERR_CANARY_UNAVAILABLE);
    ck_assert_msg(!strstr(text, "HKBAD-FLOOD"), "%zu bytes of the helper's output reached ours",
                  len);
    free(text);
    hk_report_clear(&rep);
}
END_TEST

/* A kernel whose name a canary test cannot hold is refused when the test is
 * declared, never skipped silently at the run. */
START_TEST(long_kernel_name_refused_at_declaration) {
    rt = make_rt(NULL, 2000, 1);
    char name[200], *src = strdup(fake_ptx(1, 0, 0, 0));
    memset(name, 'k', 150);
    name[150] = '\0';
    char *at = strstr(src, "step");
    ck_assert_ptr_nonnull(at);
    size_t n = strlen(src) + 200;
    char *p = malloc(n);
    snprintf(p, n, "%.*s%s%s", (int)(at - src), src, name, at + 4);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_swap(rt, "m", p, strlen(p) + 1, NULL, &rep), 0);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "m", name, &k), 0);
    hk_test *t;
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){32, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_kernel_add_test(k, t, &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "kernel names of at most"), "%s", rep.message);
    hk_test_destroy(t);
    hk_report_clear(&rep);
    free(p);
    free(src);
}
END_TEST

/* A misbehaving helper: the version is refused (or, where the canary could
 * not run at all and the policy is optional, let through saying so), the
 * parent neither hangs nor crashes, and the runtime goes on. */
static void misbehaving_cmp(const char *mode, hk_compare cmp, hk_canary_policy policy, int want,
                            const char *says) {
    setenv("HKBAD_MODE", mode, 1);
    rt = make_rt(bad_helper, 300, 1);
    start_with_test(cmp, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(2, 0, policy, &rep), want);
    const char *text = want ? rep.message : rep.canary;
    ck_assert_msg(strstr(text, says), "%s: %s", mode, text);
    ck_assert_int_eq(hk_module_version(rt, "m"), want ? 1 : 2);
    hk_report_clear(&rep);
}

/* Each way the misbehaving helper answers (its HKBAD_MODE), what the
 * canary compares, the swap's policy, the code the swap returns (0: let
 * through) and what its report says. */
static const struct misbehaviour {
    const char *mode;
    hk_compare cmp;
    hk_canary_policy policy;
    int want;
    const char *says;
} misbehaviours[] = {
    {"garbage", HK_COMPARE_NONE, HK_CANARY_REQUIRE, HK_ERR_CANARY_UNAVAILABLE, "answered nonsense"},
    {"oversize", HK_COMPARE_NONE, HK_CANARY_REQUIRE, HK_ERR_CANARY_UNAVAILABLE,
     "answered nonsense"},
    {"silent", HK_COMPARE_NONE, HK_CANARY_OPTIONAL, 0,
     "not run: the helper did not answer in time"},
    {"silent", HK_COMPARE_NONE, HK_CANARY_REQUIRE, HK_ERR_CANARY_UNAVAILABLE,
     "did not answer in time"},
    {"exit", HK_COMPARE_NONE, HK_CANARY_REQUIRE, HK_ERR_CANARY_UNAVAILABLE, "died while loading"},
    {"badtype", HK_COMPARE_NONE, HK_CANARY_REQUIRE, HK_ERR_CANARY,
     "malformed reply from the helper"},
    /* Outputs are asked for only when they are to be compared. */
    {"wrongsize", HK_COMPARE_EXACT, HK_CANARY_OPTIONAL, HK_ERR_CANARY, "buffer 0 of 3 bytes"},
    {"extra", HK_COMPARE_EXACT, HK_CANARY_OPTIONAL, HK_ERR_CANARY, "bytes left over"},
    /* A launch without comparison gets no buffers back; a helper that sends
     * them anyway is malformed. */
    {"extra", HK_COMPARE_NONE, HK_CANARY_OPTIONAL, HK_ERR_CANARY, "1 buffers for 0"},
    /* A helper that lies about a trap: finished and trapped at once, stopped
     * by both a driver error and a trap, or trapped in an image with no
     * guard. None is believed. */
    {"badtrap", HK_COMPARE_NONE, HK_CANARY_REQUIRE, HK_ERR_CANARY, "malformed reply"},
    {"trapcu", HK_COMPARE_NONE, HK_CANARY_REQUIRE, HK_ERR_CANARY, "malformed reply"},
    {"trapunasked", HK_COMPARE_NONE, HK_CANARY_REQUIRE, HK_ERR_CANARY, "malformed reply"},
    /* TIMED is read as strictly as RESULT: one run too many is malformed. */
    {"badtimed", HK_COMPARE_NONE, HK_CANARY_OPTIONAL, HK_ERR_CANARY,
     "a timing reply of type 7, stage 4, 6 runs for 5"},
};

/* One case of misbehaviours a run (tcase_add_loop_test). */
START_TEST(bad_helper_misbehaves) {
    const struct misbehaviour *c = &misbehaviours[_i];
    misbehaving_cmp(c->mode, c->cmp, c->policy, c->want, c->says);
}
END_TEST

/* A helper that never greets, or says it cannot run, fails the runtime's
 * creation with the reason, as the build helper does: no run, and no
 * destroy waiting for one, ever waits for a greeting. */
static void create_fails(const char *mode, const char *says) {
    setenv("HKBAD_MODE", mode, 1);
    fake_init(1, 90);
    setenv("HK_LIBCUDA", fake_lib, 1);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.no_warm_start = 1;
    o.canary = 1;
    o.canary_helper = bad_helper;
    o.canary_timeout_ms = 300;
    hk_runtime *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&r, &o, fake_driver(), &rep), HK_ERR_IO);
    ck_assert_ptr_null(r);
    ck_assert_msg(strstr(rep.message, says), "%s: %s", mode, rep.message);
    hk_report_clear(&rep);
}

/* The helper's mode, and what the report of the failed creation says. */
static const struct {
    const char *mode;
    const char *says;
} create_failures[] = {
    {"noready", "did not start (no answer in time"},
    {"failready", "could not start: no device here"},
};

START_TEST(bad_helper_fails_create) {
    create_fails(create_failures[_i].mode, create_failures[_i].says);
}
END_TEST

static _Atomic int destroyed;

static void *destroy_and_flag(void *arg) {
    hk_runtime_destroy(arg);
    atomic_store(&destroyed, 1);
    return NULL;
}

/* Destroy while the worker waits for a canary helper that never answers
 * (its timeout a minute): destroy does not wait for the run's timeout. */
START_TEST(destroy_does_not_wait_for_a_canary_run) {
    setenv("HKBAD_MODE", "silent", 1);
    rt = make_rt(bad_helper, 60000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.canary = HK_CANARY_REQUIRE;
    pid_t helper = hka_helper_pid(rt->canary); /* not while a run holds it */
    const char *p = fake_ptx(2, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "m", p, strlen(p) + 1, &so), 0);
    usleep(200 * 1000); /* the worker sends its load, and waits */
    atomic_store(&destroyed, 0);
    pthread_t t;
    pthread_create(&t, NULL, destroy_and_flag, rt);
    for (int i = 0; i < 1000 && !atomic_load(&destroyed); i++)
        usleep(10 * 1000);
    ck_assert_msg(atomic_load(&destroyed), "destroy still waiting for the canary after 10 s");
    pthread_join(t, NULL);
    rt = NULL;
    ck_assert(!alive(helper));
}
END_TEST

/* ---- pushes ------------------------------------------------------------- */

/* `hotkern push URL --key KEY --module m --release R --json FILE`: the exit
 * status, stdout and stderr into out. */
static int cli_push(const char *url, const char *key, int release, const char *file, char *out,
                    size_t cap) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "timeout 60 '%s' push '%s' --key '%s' --module m --release %d --json '%s' 2>&1",
             hkt_built_program("hotkern"), url, key, release, file);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t len = fread(out, 1, cap - 1, p);
    out[len] = '\0';
    int st = pclose(p);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Starts an endpoint on rt trusting tmp/hotkern.pub, with swap template tpl
 * (NULL: none). */
static hk_endpoint *push_endpoint(const char *tmp, const hk_swap_options *tpl, char *url,
                                  size_t cap) {
    char pub[PATH_MAX];
    snprintf(pub, sizeof pub, "%s/hotkern.pub", tmp);
    const char *keys[] = {pub};
    hk_endpoint_options eo;
    hk_endpoint_options_init(&eo);
    eo.trusted_keys = keys;
    eo.ntrusted_keys = 1;
    eo.state_dir = "";
    eo.swap = tpl;
    hk_endpoint *ep = NULL;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_endpoint_start(rt, &eo, &ep, &rep) == 0, "%s", rep.message);
    snprintf(url, cap, "http://127.0.0.1:%u", hk_endpoint_port(ep));
    hk_report_clear(&rep);
    return ep;
}

/* A push's canary policy, left to the default, is HK_CANARY_REQUIRE: with a
 * helper that cannot start, hk_swap (OPTIONAL by default) lets a version
 * with tests through, a push of one is refused with HK_ERR_CANARY_UNAVAILABLE
 * (503, tried again when pushed again), and the
 * same push through a template that says OPTIONAL commits. */
START_TEST(push_policy_defaults_to_required) {
    char *tmp = hkt_tmpdir(), key[PATH_MAX], pub[PATH_MAX], file[PATH_MAX], url[64], out[16384];
    char state[PATH_MAX];
    snprintf(state, sizeof state, "%s/helper-started", tmp);
    setenv("HKBAD_STATE", state, 1);
    setenv("HKBAD_MODE", "failagain", 1); /* greets at create, then cannot start again */
    rt = make_rt(bad_helper, 300, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_DEFAULT, &rep), 0);
    ck_assert_msg(strstr(rep.canary, "could not start"), "%s", rep.canary);
    hkn_seckey k;
    ck_assert_int_eq(hkn_keygen(&k), 0);
    snprintf(key, sizeof key, "%s/hotkern.key", tmp);
    snprintf(pub, sizeof pub, "%s/hotkern.pub", tmp);
    snprintf(file, sizeof file, "%s/m.ptx", tmp);
    ck_assert_int_eq(hkn_seckey_save(key, &k, &rep), 0);
    ck_assert_int_eq(hkn_pubkey_save(pub, &k.pub, &rep), 0);
    ck_assert_int_eq(hkt_write_file(file, fake_ptx(3, 0, 0, 0)), 0);

    hk_endpoint *ep = push_endpoint(tmp, NULL, url, sizeof url);
    int rc = cli_push(url, key, 1, file, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "\"error\":\"HK_ERR_CANARY_UNAVAILABLE\"") &&
                      strstr(out, "\"http_status\":503"),
                  "exit %d: %s", rc, out);
    ck_assert_msg(strstr(out, "could not start"), "%s", out);
    /* Not a verdict on the release: pushed again, it is tried again. */
    rc = cli_push(url, key, 1, file, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "could not start") && !strstr(out, "refused before"),
                  "exit %d: %s", rc, out);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_endpoint_stop(ep);

    hk_swap_options so;
    hk_swap_options_init(&so);
    so.canary = HK_CANARY_OPTIONAL;
    ep = push_endpoint(tmp, &so, url, sizeof url);
    rc = cli_push(url, key, 2, file, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "\"outcome\":\"committed\""), "exit %d: %s", rc, out);
    ck_assert_int_eq(hk_module_version(rt, "m"), 3);
    hk_endpoint_stop(ep);
    hkt_rmtree(tmp);
    free(tmp);
    hk_report_clear(&rep);
}
END_TEST

/* The children of this process, from every thread's children list; n of
 * them in out. */
static int children(pid_t *out, int max) {
    int n = 0;
    char path[300];
    DIR *d = opendir("/proc/self/task");
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof path, "/proc/self/task/%s/children", e->d_name);
            FILE *f = fopen(path, "r");
            long p;
            while (f && n < max && fscanf(f, "%ld", &p) == 1)
                out[n++] = (pid_t)p;
            if (f)
                fclose(f);
        }
    closedir(d);
    return n;
}

/* Helpers that outlive their kill, more of them than the parent ever had
 * room for in a fixed list: every one is reaped once it has ended, none is
 * left a zombie, and nothing waits for them meanwhile. hotkern kills with
 * SIGTERM here, which the lingering helper ignores; the test ends them.
 * (Each refusal kills its helper and starts a fresh one for the next run.) */
START_TEST(helpers_outliving_their_kill_are_all_reaped) {
    setenv("HKBAD_MODE", "linger", 1);
    rt = make_rt(bad_helper, 100, 1);
    hka_set_kill(rt->canary, SIGTERM, 0);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    enum { N = 12 };
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_REQUIRE, &rep), HK_ERR_CANARY_UNAVAILABLE);
        /* Its start or its load timed out: killed either way. */
        ck_assert_msg(strstr(rep.message, "in time"), "%s", rep.message);
    }
    hk_report_clear(&rep);
    pid_t kids[4 * N];
    int n = children(kids, 4 * N);
    ck_assert_int_eq(n, N + 1); /* every killed helper lives on, and the fresh one */
    for (int i = 0; i < n; i++)
        kill(kids[i], SIGKILL);
    for (int i = 0; i < n; i++)
        while (proc_state(kids[i]) != 'Z')
            usleep(1000); /* a dead child stays a zombie until reaped */
    hk_runtime_destroy(rt);
    rt = NULL;
    n = children(kids, 4 * N);
    ck_assert_msg(n == 0, "%d helpers left as zombies (first %ld, state %c)", n,
                  n ? (long)kids[0] : 0L, n ? proc_state(kids[0]) : '-');
}
END_TEST

/* A helper that cannot be executed fails runtime creation, saying so. */
START_TEST(missing_helper_fails_create) {
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.canary = 1;
    o.canary_helper = "/nonexistent/hotkern-canary";
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), HK_ERR_IO);
    ck_assert_msg(strstr(rep.message, "cannot start the canary helper"), "%s", rep.message);
    ck_assert_ptr_null(rt);
}
END_TEST

void canary_untrusted_tests(TCase *tc) {
    tcase_add_loop_test(tc, bad_helper_misbehaves, 0,
                        (int)(sizeof misbehaviours / sizeof misbehaviours[0]));
    tcase_add_loop_test(tc, bad_helper_fails_create, 0,
                        (int)(sizeof create_failures / sizeof create_failures[0]));
    tcase_add_test(tc, destroy_does_not_wait_for_a_canary_run);
    tcase_add_test(tc, helpers_outliving_their_kill_are_all_reaped);
    tcase_add_test(tc, long_kernel_name_refused_at_declaration);
    tcase_add_test(tc, helper_inherits_no_application_fd);
    tcase_add_test(tc, helper_output_is_its_own);
    tcase_add_test(tc, missing_helper_fails_create);
    tcase_add_test(tc, push_policy_defaults_to_required);
}

/*
 * Canary runs on the CPU. The engine runs on the in-process fake driver; the
 * canary helper (BUILD/bin/hotkern-canary) is a real child process that
 * binds the loadable fake (BUILD/lib/libhotkern-fakecuda.so, through
 * HK_LIBCUDA), whose HKFAKE_* variables make a kernel fault, hang or store a
 * wrong value there. A misbehaving helper (BUILD/stub/hotkern-canary-bad)
 * covers malformed, oversized, missing and late replies, and a push's
 * default policy (an endpoint and the hotkern CLI). The first tests
 * drive the loadable fake through the public API alone, as an application's
 * CI would.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hotkern/net.h"
#include "loader/core.h"
#include "net/net.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

static char fake_lib[PATH_MAX], bad_helper[PATH_MAX];

/* BUILD/tests/cpu_canary -> BUILD/<rel> */
static void built_path(char *out, const char *rel) {
    char self[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    snprintf(out, PATH_MAX, "%s/%s", dirname(dirname(self)), rel);
}

static hk_runtime *rt;

/* The options of a runtime on the in-process fake with a canary whose
 * helper binds the loadable fake. helper NULL: the real one. */
static void rt_options(hk_options *o, const char *helper, int timeout_ms, int canary) {
    fake_init(1, 90);
    setenv("HK_LIBCUDA", fake_lib, 1);
    hk_options_init(o);
    o->ptx_mode = HK_PTX_DRIVER_JIT; /* the fakes read the PTX's tag */
    o->cache_dir = "";
    o->no_warm_start = 1;
    o->canary = canary;
    o->canary_helper = helper ? helper : hkt_built_program("hotkern-canary");
    o->canary_timeout_ms = timeout_ms;
}

static hk_runtime *create(const hk_options *o, hk_report *rep) {
    hk_runtime *r = NULL;
    int err = hkl_runtime_create_with(&r, o, fake_driver(), rep);
    ck_assert_msg(err == 0, "create: %s", rep->message);
    return r;
}

static hk_runtime *make_rt(const char *helper, int timeout_ms, int canary) {
    hk_options o;
    rt_options(&o, helper, timeout_ms, canary);
    hk_report rep = HK_REPORT_INIT;
    return create(&o, &rep);
}

static hk_kernel *k_step;

/* Commits version 1 (tag 1) and declares one test of step(out, n): a
 * 16-byte buffer and n = 4, compared as `mode` says. */
static void start_with_test(hk_compare mode, double atol) {
    hk_report rep = HK_REPORT_INIT;
    const char *v1 = fake_ptx(1, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "m", v1, strlen(v1) + 1, NULL, &rep), 0);
    ck_assert_str_eq(rep.canary, "no canary tests");
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &k_step), 0);
    hk_test *t;
    unsigned n = 4;
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){32, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_test_buffer(t, 16, HK_FILL_RANDOM, 7, NULL), 0);
    ck_assert_int_eq(hk_test_scalar(t, &n, sizeof n), 0);
    ck_assert_int_eq(hk_test_compare(t, mode, atol, 0), 0);
    ck_assert_int_eq(hk_kernel_add_test(k_step, t, &rep), 0);
    hk_test_destroy(t);
    hk_report_clear(&rep);
}

static int swap_tag(int tag, int with_aux, hk_canary_policy policy, hk_report *rep) {
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.canary = policy;
    const char *p = fake_ptx(tag, with_aux, 0, 0);
    return hk_swap(rt, "m", p, strlen(p) + 1, &so, rep);
}

static void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
    unsetenv("HKFAKE_FAULT");
    unsetenv("HKFAKE_HANG");
    unsetenv("HKFAKE_WRONG");
    unsetenv("HKFAKE_SLOW");
    unsetenv("HKFAKE_OOB");
    unsetenv("HKFAKE_TRAP");
    unsetenv("HKBAD_MODE");
    unsetenv("HKSAN_MODE");
    unsetenv("HKSAN_ARGV");
    unsetenv("HKFAKE_DEVICES");
}

static hk_stats stats(void) {
    hk_stats st = HK_STATS_INIT;
    ck_assert_int_eq(hk_stats_get(rt, &st), 0);
    return st;
}

/* The value of the metrics sample line that starts with `series`, or -1. */
static double metric(const char *series) {
    char *text = NULL;
    ck_assert_int_eq(hk_metrics_text_alloc(rt, &text, NULL), 0);
    double v = -1;
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ') {
            v = strtod(p + n + 1, NULL);
            break;
        }
    free(text);
    return v;
}

static int alive(pid_t p) {
    return p > 0 && kill(p, 0) == 0;
}

/* ---- the loadable fake through the public API ------------------------- */

/* A program that knows nothing of the fake: create, swap, take a handle,
 * launch. Device memory is host memory in the fake. */
static void public_swap_and_launch(hk_ptx_mode mode, int want) {
    setenv("HK_LIBCUDA", fake_lib, 1);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = mode;
    o.cache_dir = "";
    o.no_warm_start = 1;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_runtime_create(&rt, &o, &rep) == 0, "%s", rep.message);
    const char *p = fake_ptx(5, 0, 0, 0);
    ck_assert_msg(hk_swap(rt, "m", p, strlen(p) + 1, NULL, &rep) == 0, "%s", rep.message);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &k), 0);
    int out = -1;
    int *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL), 0);
    ck_assert_int_eq(out, want);
    hk_report_clear(&rep);
}

START_TEST(loadable_fake_runs_a_program) {
    public_swap_and_launch(HK_PTX_DRIVER_JIT, 5);
}
END_TEST

/* The default PTX path links a cubin with nvJitLink; the fake reads its
 * kernels too (no tag in a cubin: 0). */
START_TEST(loadable_fake_takes_cubins) {
    public_swap_and_launch(HK_PTX_NVJITLINK, 0);
}
END_TEST

/* The controls by dlsym: a wrong value, then a fault that sticks. */
START_TEST(loadable_fake_controls_by_dlsym) {
    public_swap_and_launch(HK_PTX_DRIVER_JIT, 5);
    void *h = dlopen(fake_lib, RTLD_NOW | RTLD_NOLOAD);
    ck_assert_ptr_nonnull(h);
    int (*wrong)(const char *) = (int (*)(const char *))dlsym(h, "hkfake_wrong_kernel");
    int (*fault)(const char *, int) = (int (*)(const char *, int))dlsym(h, "hkfake_fault_kernel");
    ck_assert_ptr_nonnull(wrong);
    ck_assert_ptr_nonnull(fault);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &k), 0);
    int out = 0, *dptr = &out, cu = 0;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    ck_assert_int_eq(wrong("step@5"), 0);
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL), 0);
    ck_assert_int_eq(out, ~5);
    ck_assert_int_eq(fault("step", CUDA_ERROR_ILLEGAL_ADDRESS), 0);
    /* The wrong-value control matches first; a fresh control list shows the
     * fault: accepted, then every call fails. */
    void (*clear)(void) = (void (*)(void))dlsym(h, "hkfake_clear_kernels");
    clear();
    ck_assert_int_eq(fault("step", CUDA_ERROR_ILLEGAL_ADDRESS), 0);
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu), 0);
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu),
                     HK_ERR_CUDA);
    ck_assert_int_eq(cu, CUDA_ERROR_ILLEGAL_ADDRESS);
    dlclose(h);
}
END_TEST

/* ---- canary runs ------------------------------------------------------ */

START_TEST(good_kernel_committed) {
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_EXACT, 0);
    hk_report rep = HK_REPORT_INIT;
    /* Same outputs (tag 1), another image (an extra kernel). */
    ck_assert_msg(swap_tag(1, 1, HK_CANARY_REQUIRE, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    ck_assert_msg(strstr(rep.canary, "1 launch passed (1 compared with version 1)"), "%s",
                  rep.canary);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_int_eq(st.canary_runs, 1);
    ck_assert_int_eq(st.canary_refused, 0);
    ck_assert_int_eq(st.canary_helper_starts, 1);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(faulting_kernel_refused_with_cuname) {
    setenv("HKFAKE_FAULT", "step@7=CUDA_ERROR_ILLEGAL_ADDRESS", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    pid_t before = hka_helper_pid(rt->canary);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(7, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_ILLEGAL_ADDRESS");
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 faulted: CUDA_ERROR_ILLEGAL_ADDRESS"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "fault");
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    /* The poisoned helper was replaced, and the next version runs there. */
    pid_t after = hka_helper_pid(rt->canary);
    ck_assert_int_gt(after, 0);
    ck_assert_int_ne(after, before);
    ck_assert_int_eq(swap_tag(1, 1, HK_CANARY_REQUIRE, &rep), 0);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_stats st = stats();
    ck_assert_int_eq(st.canary_refused, 1);
    ck_assert_int_eq(st.canary_refused_fault, 1);
    ck_assert_int_eq(st.canary_helper_starts, 2);
    ck_assert_double_gt(st.canary_ms_total, 0);
    ck_assert_double_eq(metric("hotkern_canary_refused_total{kind=\"fault\"}"), 1);
    ck_assert_double_eq(metric("hotkern_canary_refused_total{kind=\"hang\"}"), 0);
    ck_assert_double_eq(metric("hotkern_canary_runs_total"), 2);
    ck_assert_double_eq(metric("hotkern_canary_helper_starts_total"), 2);
    hk_report_clear(&rep);
}
END_TEST

/* fake_ptx(tag) with `stmt` before step's ret: a trap the guard can see. */
static int swap_with(int tag, const char *stmt, hk_report *rep) {
    const char *p = fake_ptx(tag, 0, 0, 0);
    const char *ret = strstr(p, " ret;");
    ck_assert_ptr_nonnull(ret);
    char text[4096];
    snprintf(text, sizeof text, "%.*s %s\n%s", (int)(ret - p), p, stmt, ret);
    return hk_swap(rt, "m", text, strlen(text) + 1, NULL, rep);
}

/* A version that traps in its test launch: the canary ran its trap guard's
 * copy, in which the trap stored its site and ended the thread, so the
 * helper's context (the fake's "GPU") never saw a trap and the helper
 * stays. The same trap in a version with no trap instruction the guard
 * could see (the fake traps it all the same) ends the helper's context:
 * refused as before, and the helper replaced. */
START_TEST(trap_caught_by_the_guard_keeps_the_helper) {
    setenv("HKFAKE_TRAP", "step@5,step@6", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    pid_t before = hka_helper_pid(rt->canary);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_with(5, "@%p1 trap;", &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 reached a trap instruction") &&
                      strstr(rep.message, "(site 1 of 1 in its PTX)") &&
                      strstr(rep.message, "trap guard ended the thread"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "fault");
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    ck_assert_int_eq(hka_helper_pid(rt->canary), before); /* its context is whole */
    ck_assert_int_eq(stats().canary_helper_starts, 1);
    ck_assert_int_eq(stats().canary_refused_fault, 1);

    ck_assert_int_eq(swap_with(6, "mov.u32 %r1, 1;", &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "faulted: CUDA_ERROR_LAUNCH_FAILED"), "%s", rep.message);
    ck_assert_int_ne(hka_helper_pid(rt->canary), before);
    ck_assert_int_eq(stats().canary_helper_starts, 2);

    /* A guarded version that does not trap passes, says so, and what
     * commits is its own image, not the guard's copy. */
    ck_assert_msg(swap_with(7, "@%p1 trap;\n @%p2 trap;", &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "; 2 trap sites guarded"), "%s", rep.canary);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    uint64_t dptr = 0;
    size_t size = 0;
    ck_assert_int_eq(hk_module_global(rt, "m", "__hotkern_trap", 0, &dptr, &size),
                     HK_ERR_NOT_FOUND);
    hk_report_clear(&rep);
}
END_TEST

/* A version whose first test launch passes and whose timed repeats (the
 * perf guard's, on the buffers the launch left) reach a trap: the helper
 * reads the guard's code after each repeat too. */
START_TEST(trap_in_the_timed_repeats_is_caught) {
    setenv("HKFAKE_TRAP", "step@5=1", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    pid_t before = hka_helper_pid(rt->canary);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_with(5, "@%p1 trap;", &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 repeated to be timed reached a trap "
                                      "instruction"),
                  "%s", rep.message);
    ck_assert_int_eq(hka_helper_pid(rt->canary), before);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    hk_report_clear(&rep);
}
END_TEST

/* fake_ptx(tag) with a trap site before step's ret and `head` (the fake's
 * "// regs:" and "// ms:" lines, tests/fakecuda.h) in front. */
static int swap_guarded(int tag, const char *head, hk_report *rep) {
    const char *p = fake_ptx(tag, 0, 0, 0);
    const char *ret = strstr(p, " ret;");
    ck_assert_ptr_nonnull(ret);
    char text[4096];
    snprintf(text, sizeof text, "%s%.*s @%%p1 trap;\n%s", head, (int)(ret - p), p, ret);
    return hk_swap(rt, "m", text, strlen(text) + 1, NULL, rep);
}

/* The canary runs a version with trap sites as its trap guard's copy, which
 * ptxas compiles apart and may give fewer registers than the image that
 * commits (real NVRTC and nvJitLink: 56 against 72 for a kernel with an
 * assert()). A 1024-thread test that the copy launches and the image cannot
 * (72 registers: 896 threads a block at most) is refused, naming the limit;
 * the same kernel with registers that fit commits. */
START_TEST(resources_are_checked_on_the_image_that_commits) {
    rt = make_rt(NULL, 2000, 1);
    hk_report rep = HK_REPORT_INIT;
    const char *v1 = fake_ptx(1, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "m", v1, strlen(v1) + 1, NULL, &rep), 0);
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &k_step), 0);
    hk_test *t;
    unsigned n = 4;
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){1024, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_test_buffer(t, 16, HK_FILL_RANDOM, 7, NULL), 0);
    ck_assert_int_eq(hk_test_scalar(t, &n, sizeof n), 0);
    ck_assert_int_eq(hk_kernel_add_test(k_step, t, &rep), 0);
    hk_test_destroy(t);
    ck_assert_int_eq(swap_guarded(5, "// regs: 72\n// guarded regs: 56\n", &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 launches blocks of 1024 threads") &&
                      strstr(rep.message, "takes 72 registers a thread") &&
                      strstr(rep.message, "at most 896 threads") &&
                      strstr(rep.message, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "fault");
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES");
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    /* The image itself would have failed every such launch. */
    ck_assert_msg(swap_guarded(6, "// regs: 56\n// guarded regs: 40\n", &rep) == 0, "%s",
                  rep.message);
    ck_assert_msg(strstr(rep.canary, "1 launch passed") &&
                      strstr(rep.canary, "1 trap site guarded"),
                  "%s", rep.canary);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_report_clear(&rep);
}
END_TEST

/* The perf guard judges the image's times, not the copy's: an image 50 ms a
 * launch whose copy takes 0.010 ms is refused as slower, with the image's
 * time; a copy slower than a fast image does not refuse it. */
START_TEST(perf_guard_times_the_image_that_commits) {
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_guarded(5, "// ms: 50\n// guarded ms: 0.01\n", &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 is slower: 50.000 ms against 0.010 ms"),
                  "%s", rep.message);
    ck_assert_double_eq(rep.canary_new_ms, 50.0);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    ck_assert_msg(swap_guarded(6, "// ms: 0.01\n// guarded ms: 50\n", &rep) == 0, "%s",
                  rep.message);
    ck_assert_msg(strstr(rep.canary, "timed 0.010 ms against 0.010 ms on version 1"), "%s",
                  rep.canary);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(hanging_kernel_refused_and_helper_restarted) {
    setenv("HKFAKE_HANG", "step@8", 1);
    rt = make_rt(NULL, 300, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    pid_t before = hka_helper_pid(rt->canary);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(8, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "did not finish within 300 ms"), "%s", rep.message);
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_str_eq(rep.canary_refusal, "hang");
    ck_assert_int_eq(stats().canary_refused_hang, 1);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    pid_t after = hka_helper_pid(rt->canary);
    ck_assert_int_ne(after, before);
    ck_assert(!alive(before)); /* killed and reaped */
    ck_assert_int_eq(swap_tag(1, 1, HK_CANARY_OPTIONAL, &rep), 0);
    ck_assert_msg(strstr(rep.canary, "passed"), "%s", rep.canary);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(wrong_output_refused_on_compare) {
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_EXACT, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "buffer (argument 0) differs from version 1 at byte 0: "
                                      "0x02, running version 0x01"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "mismatch");
    ck_assert_int_eq(stats().canary_refused_mismatch, 1);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    hk_report_clear(&rep);
}
END_TEST

/* The fake's outputs read as floats: tags 1 and 2 are denormals 1.4e-45
 * apart, different bytes but well within a tolerance. */
START_TEST(float_tolerance_lets_close_outputs_through) {
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_F32, 1e-6);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(swap_tag(2, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_report_clear(&rep);
}
END_TEST

/* HKFAKE_* variables reach a program that loads the library: here a
 * wrong value (the canary tests use the fault and hang variables). */
START_TEST(loadable_fake_controls_by_environment) {
    setenv("HKFAKE_WRONG", "step@5", 1);
    public_swap_and_launch(HK_PTX_DRIVER_JIT, ~5);
}
END_TEST

START_TEST(no_tests_committed_as_today) {
    rt = make_rt(NULL, 2000, 1);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(1, 0, HK_CANARY_REQUIRE, &rep), 0);
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_REQUIRE, &rep), 0);
    ck_assert_str_eq(rep.canary, "no canary tests");
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_int_eq(st.canary_runs, 0);
    ck_assert_int_eq(st.swaps, 2);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(skip_policy_commits_a_faulting_kernel) {
    setenv("HKFAKE_FAULT", "step@7", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(7, 0, HK_CANARY_SKIP, &rep), 0);
    ck_assert_str_eq(rep.canary, "skipped (policy)");
    hk_report_clear(&rep);
}
END_TEST

/* Tests declared on a runtime without a canary: optional lets the version
 * through saying so, required refuses it. */
START_TEST(no_canary_configured) {
    rt = make_rt(NULL, 2000, 0);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_int_eq(hka_helper_pid(rt->canary), 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_OPTIONAL, &rep), 0);
    ck_assert_msg(strstr(rep.canary, "not run: the runtime has no canary"), "%s", rep.canary);
    ck_assert_int_eq(swap_tag(3, 0, HK_CANARY_REQUIRE, &rep), HK_ERR_CANARY_UNAVAILABLE);
    ck_assert_int_eq(rep.error, HK_ERR_CANARY_UNAVAILABLE);
    ck_assert_msg(strstr(rep.message, "required but could not run"), "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "could_not_run");
    ck_assert_int_eq(stats().canary_refused_could_not_run, 1);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_report_clear(&rep);
}
END_TEST

/* A test whose arguments do not fit the kernel refuses the version. */
START_TEST(test_that_does_not_fit_refuses) {
    rt = make_rt(NULL, 2000, 1);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(1, 0, HK_CANARY_DEFAULT, &rep), 0);
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &k_step), 0);
    hk_test *t;
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){0, 1, 1}, (hk_dim3){1, 1, 1}, 0), HK_ERR_INVALID);
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_test_buffer(t, 8, HK_FILL_HOST, 0, NULL), HK_ERR_INVALID);
    ck_assert_int_eq(hk_test_buffer(t, (64u << 20) + 1, HK_FILL_ZERO, 0, NULL), HK_ERR_TOO_LARGE);
    ck_assert_int_eq(hk_test_buffer(t, 8, HK_FILL_ZERO, 0, NULL), 0); /* n missing */
    ck_assert_int_eq(hk_kernel_add_test(k_step, t, NULL), 0);
    for (int i = 1; i < 16; i++)
        ck_assert_int_eq(hk_kernel_add_test(k_step, t, NULL), 0);
    ck_assert_int_eq(hk_kernel_add_test(k_step, t, &rep), HK_ERR_TOO_LARGE);
    hk_test_destroy(t);
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_DEFAULT, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "the kernel takes 2 parameters, the test gives 1"), "%s",
                  rep.message);
    ck_assert_str_eq(rep.canary_refusal, "could_not_run");
    ck_assert_int_eq(hk_kernel_clear_tests(k_step), 0);
    ck_assert_int_eq(swap_tag(2, 0, HK_CANARY_DEFAULT, &rep), 0);
    ck_assert_str_eq(rep.canary, "no canary tests");
    hk_report_clear(&rep);
}
END_TEST

static int refused_err;
static char refused_msg[512];
static void on_event(const hk_event *ev, void *ud) {
    if (ev->kind == HK_EVENT_REFUSED && ev->report) {
        refused_err = ev->report->error;
        snprintf(refused_msg, sizeof refused_msg, "%s", ev->report->message);
    }
}

/* hk_submit: the worker runs the canary; the refusal comes as an event. */
START_TEST(submitted_version_refused_by_worker) {
    setenv("HKFAKE_FAULT", "step@7=CUDA_ERROR_ASSERT", 1);
    fake_init(1, 90);
    setenv("HK_LIBCUDA", fake_lib, 1);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.no_warm_start = 1;
    o.canary = 1;
    o.canary_helper = hkt_built_program("hotkern-canary");
    o.on_event = on_event;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), 0);
    start_with_test(HK_COMPARE_NONE, 0);
    const char *p = fake_ptx(7, 0, 0, 0);
    ck_assert_int_eq(hk_submit(rt, "m", p, strlen(p) + 1, NULL), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 20000), 0);
    ck_assert_int_eq(refused_err, HK_ERR_CANARY);
    ck_assert_msg(strstr(refused_msg, "CUDA_ERROR_ASSERT"), "%s", refused_msg);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
}
END_TEST

static void *kill_later(void *arg) {
    usleep(1000 * 1000);
    kill((pid_t)(intptr_t)arg, SIGKILL);
    return NULL;
}

/* The helper dies while a launch runs (here: hangs): refused, restarted. */
START_TEST(helper_killed_mid_run) {
    setenv("HKFAKE_HANG", "step@8", 1);
    rt = make_rt(NULL, 20000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    pid_t victim = hka_helper_pid(rt->canary);
    pthread_t th;
    pthread_create(&th, NULL, kill_later, (void *)(intptr_t)victim);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(8, 0, HK_CANARY_REQUIRE, &rep), HK_ERR_CANARY);
    pthread_join(th, NULL);
    ck_assert_msg(strstr(rep.message, "died"), "%s", rep.message);
    ck_assert_msg(strstr(rep.message, "signal 9"), "%s", rep.message);
    ck_assert_int_ne(hka_helper_pid(rt->canary), victim);
    ck_assert_int_eq(swap_tag(1, 1, HK_CANARY_REQUIRE, &rep), 0);
    hk_report_clear(&rep);
}
END_TEST

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

START_TEST(helper_dead_between_runs_is_replaced) {
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_EXACT, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(1, 1, HK_CANARY_REQUIRE, &rep), 0);
    pid_t victim = hka_helper_pid(rt->canary);
    kill(victim, SIGKILL);
    usleep(100 * 1000);
    ck_assert_int_eq(swap_tag(1, 0, HK_CANARY_REQUIRE, &rep), 0);
    ck_assert_msg(strstr(rep.canary, "passed"), "%s", rep.canary);
    ck_assert_int_ne(hka_helper_pid(rt->canary), victim);
    hk_report_clear(&rep);
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

static void misbehaving(const char *mode, hk_canary_policy policy, int want, const char *says) {
    misbehaving_cmp(mode, HK_COMPARE_NONE, policy, want, says);
}

START_TEST(bad_helper_garbage) {
    misbehaving("garbage", HK_CANARY_REQUIRE, HK_ERR_CANARY_UNAVAILABLE, "answered nonsense");
}
END_TEST
START_TEST(bad_helper_oversize) {
    misbehaving("oversize", HK_CANARY_REQUIRE, HK_ERR_CANARY_UNAVAILABLE, "answered nonsense");
}
END_TEST
START_TEST(bad_helper_silent_optional) {
    misbehaving("silent", HK_CANARY_OPTIONAL, 0, "not run: the helper did not answer in time");
}
END_TEST
START_TEST(bad_helper_silent_required) {
    misbehaving("silent", HK_CANARY_REQUIRE, HK_ERR_CANARY_UNAVAILABLE, "did not answer in time");
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

/* A helper that lies about a trap: finished and trapped at once, stopped
 * by both a driver error and a trap, or trapped in an image with no guard.
 * None is believed. */
START_TEST(bad_helper_trap_replies) {
    misbehaving("badtrap", HK_CANARY_REQUIRE, HK_ERR_CANARY, "malformed reply");
    teardown();
    misbehaving("trapcu", HK_CANARY_REQUIRE, HK_ERR_CANARY, "malformed reply");
    teardown();
    misbehaving("trapunasked", HK_CANARY_REQUIRE, HK_ERR_CANARY, "malformed reply");
}
END_TEST

START_TEST(bad_helper_no_ready) {
    create_fails("noready", "did not start (no answer in time");
}
END_TEST
START_TEST(bad_helper_fail_ready) {
    create_fails("failready", "could not start: no device here");
}
END_TEST
START_TEST(bad_helper_exits) {
    misbehaving("exit", HK_CANARY_REQUIRE, HK_ERR_CANARY_UNAVAILABLE, "died while loading");
}
END_TEST
START_TEST(bad_helper_wrong_type) {
    misbehaving("badtype", HK_CANARY_REQUIRE, HK_ERR_CANARY, "malformed reply from the helper");
}
END_TEST
START_TEST(bad_helper_wrong_size) {
    /* Outputs are asked for only when they are to be compared. */
    misbehaving_cmp("wrongsize", HK_COMPARE_EXACT, HK_CANARY_OPTIONAL, HK_ERR_CANARY,
                    "buffer 0 of 3 bytes");
}
END_TEST
START_TEST(bad_helper_extra_bytes) {
    misbehaving_cmp("extra", HK_COMPARE_EXACT, HK_CANARY_OPTIONAL, HK_ERR_CANARY,
                    "bytes left over");
}
END_TEST
/* A launch without comparison gets no buffers back; a helper that sends
 * them anyway is malformed. */
START_TEST(bad_helper_unasked_buffers) {
    misbehaving("extra", HK_CANARY_OPTIONAL, HK_ERR_CANARY, "1 buffers for 0");
}
END_TEST

/* ---- the perf guard ---------------------------------------------------- */

/* The fake's GPU time is a counter the controls set (HKFAKE_SLOW, in ms):
 * every figure below is exact, whatever the machine's load. A launch
 * without a control takes 0.010 ms. The tests do not compare outputs, so
 * versions of other tags may pass; the perf guard still runs the running
 * version (tag 1) on the same inputs to time it. */

static int swap_opts(int tag, const hk_swap_options *so, hk_report *rep) {
    const char *p = fake_ptx(tag, 0, 0, 0);
    return hk_swap(rt, "m", p, strlen(p) + 1, so, rep);
}

START_TEST(slower_version_refused_with_both_times) {
    setenv("HKFAKE_SLOW", "step@9=50", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(9, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1 is slower: 50.000 ms against 0.010 ms "
                                      "on version 1 (5000.0x; refused beyond 4x and 1 ms)"),
                  "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "refused: kernel 'step' test 1 is slower"), "%s", rep.canary);
    ck_assert_str_eq(rep.canary_refusal, "slower");
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_double_eq(rep.canary_new_ms, 50.0);
    ck_assert_double_eq(rep.canary_old_ms, 0.010);
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    hk_stats st = stats();
    ck_assert_int_eq(st.canary_refused, 1);
    ck_assert_int_eq(st.canary_refused_slower, 1);
    ck_assert_double_eq(st.canary_last_new_ms, 50.0);
    ck_assert_double_eq(st.canary_last_old_ms, 0.010);
    ck_assert_double_eq(metric("hotkern_canary_refused_total{kind=\"slower\"}"), 1);
    ck_assert_double_eq(metric("hotkern_canary_last_new_seconds"), 0.05);
    ck_assert_double_eq(metric("hotkern_canary_last_running_seconds"), 0.00001);
    /* The same version as fast as the running one goes in, its times said. */
    ck_assert_msg(swap_tag(2, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(
        strstr(rep.canary, "1 launch passed; timed 0.010 ms against 0.010 ms on version 1"), "%s",
        rep.canary);
    ck_assert_str_eq(rep.canary_refusal, "");
    ck_assert_double_eq(rep.canary_new_ms, 0.010);
    hk_report_clear(&rep);
}
END_TEST

/* Refused only when both limits are passed: 3x and 4 ms slower passes, 5x
 * and 8 ms slower does not; 50x but 0.49 ms slower passes; faster passes. */
START_TEST(ratio_and_floor_decide_together) {
    setenv("HKFAKE_SLOW", "step@1=2,step@9=6,step@10=10,step@11=0.5,step@12=0.5", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap_tag(10, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "10.000 ms against 2.000 ms on version 1 (5.0x"), "%s",
                  rep.message);
    ck_assert_msg(swap_tag(9, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "timed 6.000 ms against 2.000 ms on version 1"), "%s",
                  rep.canary);
    ck_assert_msg(swap_tag(11, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "timed 0.500 ms against 6.000 ms on version 2"), "%s",
                  rep.canary);
    ck_assert_int_eq(hk_module_version(rt, "m"), 3);
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);
    /* From 0.010 ms to 0.5 ms: 50 times slower, but by less than 1 ms. */
    setenv("HKFAKE_SLOW", "step@12=0.5", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_msg(swap_tag(12, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "timed 0.500 ms against 0.010 ms on version 1"), "%s",
                  rep.canary);
    hk_report_clear(&rep);
}
END_TEST

/* The runtime's policy: 2x with no floor refuses 0.05 ms against 0.01. */
START_TEST(runtime_policy_sets_the_limits) {
    setenv("HKFAKE_SLOW", "step@12=0.05,step@13=0.015", 1);
    hk_options o;
    rt_options(&o, NULL, 2000, 1);
    o.canary_slowdown_max = 2;
    o.canary_slowdown_min_ms = -1;
    hk_report rep = HK_REPORT_INIT;
    rt = create(&o, &rep);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_int_eq(swap_tag(12, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "0.050 ms against 0.010 ms on version 1 (5.0x; refused "
                                      "beyond 2x and 0 ms)"),
                  "%s", rep.message);
    ck_assert_msg(swap_tag(13, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message); /* 1.5x */
    hk_report_clear(&rep);
    /* Options that are not numbers are refused. */
    hk_runtime *bad = NULL;
    o.canary_slowdown_max = NAN;
    ck_assert_int_eq(hkl_runtime_create_with(&bad, &o, fake_driver(), &rep), HK_ERR_INVALID);
    ck_assert_ptr_null(bad);
    o.canary_slowdown_max = 0;
    o.canary_sanitizer = 2;
    ck_assert_int_eq(hkl_runtime_create_with(&bad, &o, fake_driver(), &rep), HK_ERR_INVALID);
    hk_report_clear(&rep);
}
END_TEST

/* A swap's fields override the runtime's: off for one swap, a floor of
 * its own, or on where the runtime's guard is off. */
START_TEST(swap_policy_overrides_the_runtime) {
    setenv("HKFAKE_SLOW", "step@9=50", 1);
    rt = make_rt(NULL, 2000, 1);
    start_with_test(HK_COMPARE_NONE, 0);
    hk_report rep = HK_REPORT_INIT;
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.canary_slowdown_min_ms = 100; /* 50 ms slower is within it */
    ck_assert_msg(swap_opts(9, &so, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "timed 50.000 ms against 0.010 ms"), "%s", rep.canary);
    hk_swap_options_init(&so);
    so.canary_slowdown_max = -1; /* off: not even timed */
    ck_assert_msg(swap_opts(1, &so, &rep) == 0, "%s", rep.message);
    ck_assert_msg(swap_opts(9, &so, &rep) == 0, "%s", rep.message);
    ck_assert_msg(!strstr(rep.canary, "timed"), "%s", rep.canary);
    ck_assert_double_eq(rep.canary_new_ms, 0);
    so.canary_slowdown_max = NAN;
    ck_assert_int_eq(swap_opts(1, &so, &rep), HK_ERR_INVALID);
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);

    hk_options o;
    rt_options(&o, NULL, 2000, 1);
    o.canary_slowdown_max = -1; /* the runtime's guard is off */
    rt = create(&o, &rep);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_msg(swap_tag(9, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_msg(!strstr(rep.canary, "timed"), "%s", rep.canary);
    ck_assert_double_eq(stats().canary_last_new_ms, 0);
    hk_swap_options_init(&so);
    so.canary_slowdown_max = 4; /* on for this swap: 50 ms against 0.010 */
    ck_assert_msg(swap_opts(1, &so, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(swap_opts(9, &so, &rep), HK_ERR_CANARY);
    ck_assert_str_eq(rep.canary_refusal, "slower");
    hk_report_clear(&rep);
}
END_TEST

/* Without a running version there is nothing to compare with: the new
 * version is timed and said so, and never refused as slower. (The engine
 * always has one once tests can be declared; the canary is driven here
 * directly, as hkl_canary_check would with no version running.) */
START_TEST(first_version_has_nothing_to_compare_with) {
    setenv("HKFAKE_SLOW", "step@9=500", 1);
    setenv("HK_LIBCUDA", fake_lib, 1);
    hka_config cfg = {
        .helper = hkt_built_program("hotkern-canary"), .timeout_ms = 2000, .start = 1};
    hka_canary *c = NULL;
    char why[256];
    ck_assert_msg(hka_create(&c, &cfg, why, sizeof why) == 0, "%s", why);
    hk_test *t;
    unsigned n = 4;
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){32, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_test_buffer(t, 16, HK_FILL_ZERO, 0, NULL), 0);
    ck_assert_int_eq(hk_test_scalar(t, &n, sizeof n), 0);
    ck_assert_int_eq(hka_add_test(c, "m", "step", t, NULL), 0);
    hk_test_destroy(t);
    const char *p = fake_ptx(9, 0, 0, 0);
    hka_image img = {.data = p, .size = strlen(p) + 1, .format = HK_FORMAT_PTX};
    hka_policy pol = {.canary = HK_CANARY_OPTIONAL, .slowdown_max = 4, .slowdown_min_ms = 1};
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hka_run(c, "m", &img, NULL, &pol, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "1 launch passed; timed 500.000 ms (first version: nothing to "
                                     "compare)"),
                  "%s", rep.canary);
    ck_assert_double_eq(rep.canary_new_ms, 500);
    ck_assert_double_eq(rep.canary_old_ms, 0);
    hka_counters k;
    hka_counts(c, &k);
    ck_assert_int_eq(k.runs, 1);
    ck_assert_int_eq(k.refused, 0);
    ck_assert_double_eq(k.last_new_ms, 500);
    hka_destroy(c);
}
END_TEST

/* TIMED is read as strictly as RESULT: one run too many is malformed. */
START_TEST(bad_helper_timed_reply) {
    misbehaving("badtimed", HK_CANARY_OPTIONAL, HK_ERR_CANARY,
                "a timing reply of type 7, stage 4, 6 runs for 5");
}
END_TEST

/* ---- memcheck ------------------------------------------------------------ */

static char proc_state(pid_t p);

static char fake_san[PATH_MAX];

static hk_runtime *make_rt_san(int mode, const char *path, hk_report *rep) {
    hk_options o;
    rt_options(&o, NULL, 2000, 1);
    o.canary_sanitizer = mode;
    o.canary_sanitizer_path = path;
    return create(&o, rep);
}

/* No compute-sanitizer: memcheck is off where it was only wanted (create's
 * report says why), and create fails where it was required. */
START_TEST(sanitizer_not_found_is_off_and_said) {
    hk_report rep = HK_REPORT_INIT;
    rt = make_rt_san(0, "/nonexistent/compute-sanitizer", &rep);
    ck_assert_msg(strstr(rep.message, "canary test launches run without memcheck: "
                                      "compute-sanitizer not found at "
                                      "/nonexistent/compute-sanitizer"),
                  "%s", rep.message);
    ck_assert_int_eq(rep.error, 0);
    ck_assert_int_eq(stats().canary_sanitizer, 0);
    ck_assert_int_eq(hka_memcheck_pid(rt->canary), 0);
    ck_assert_double_eq(metric("hotkern_canary_sanitizer"), 0);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_msg(swap_tag(2, 0, HK_CANARY_REQUIRE, &rep) == 0, "%s", rep.message);
    ck_assert_msg(!strstr(rep.canary, "memcheck"), "%s", rep.canary);
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);
    rt = NULL;

    hk_options o;
    rt_options(&o, NULL, 2000, 1);
    o.canary_sanitizer = 1;
    o.canary_sanitizer_path = "/nonexistent/compute-sanitizer";
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), HK_ERR_IO);
    ck_assert_ptr_null(rt);
    ck_assert_msg(strstr(rep.message, "options.canary_sanitizer is 1 (on), but compute-sanitizer "
                                      "not found at /nonexistent/compute-sanitizer"),
                  "%s", rep.message);
    /* HK_COMPUTE_SANITIZER set empty (as this suite runs) means none. */
    o.canary_sanitizer_path = NULL;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), HK_ERR_IO);
    ck_assert_msg(strstr(rep.message, "HK_COMPUTE_SANITIZER is set empty"), "%s", rep.message);
    hk_report_clear(&rep);
}
END_TEST

/* The lines of file path, as one string with '\n' kept. */
static char *slurp(const char *path) {
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(hku_read_file(path, 1 << 20, &text, &len, NULL), 0);
    return text;
}

/* A write past the buffer into valid memory runs silently in a plain run;
 * under memcheck it is refused with the sanitizer's first error line. The
 * memcheck helper runs under the command line hotkern builds, which asks
 * the sanitizer to end only the kernel on such an error: the launch comes
 * back finished and the helper is kept. An error that ends the context
 * all the same (imprecise: HKSAN_MODE=hard) fails the launch, and the
 * helper is replaced. */
START_TEST(memcheck_refuses_what_a_plain_run_misses) {
    char argv_file[PATH_MAX], want[PATH_MAX + 32];
    snprintf(argv_file, sizeof argv_file, "/tmp/hk-san-argv.%d", (int)getpid());
    setenv("HKSAN_ARGV", argv_file, 1);
    setenv("HKFAKE_OOB", "step@11", 1);
    hk_report rep = HK_REPORT_INIT;
    rt = make_rt_san(1, fake_san, &rep);
    ck_assert_int_eq(stats().canary_sanitizer, 1);
    ck_assert_int_eq(stats().canary_helper_starts, 2); /* plain and memcheck */
    ck_assert_double_eq(metric("hotkern_canary_sanitizer"), 1);
    pid_t before = hka_memcheck_pid(rt->canary);
    ck_assert_int_gt(before, 0);
    char *args = slurp(argv_file);
    snprintf(want, sizeof want, "\n%s\n--fd\n3\n--device\n0\n--keep-fds\n1\n--owner\n%d\n",
             hkt_built_program("hotkern-canary"), (int)getpid());
    ck_assert_msg(strstr(args, "\n--tool\nmemcheck\n--error-exitcode\n86\n--print-limit\n"), "%s",
                  args);
    ck_assert_msg(strstr(args, "\n--log-file\n/dev/stderr\n"), "%s", args);
    ck_assert_msg(strstr(args, "\n--destroy-on-device-error\nkernel\n"), "%s", args);
    ck_assert_msg(strstr(args, want), "%s", args);
    free(args);
    unlink(argv_file);
    start_with_test(HK_COMPARE_NONE, 0);

    ck_assert_int_eq(swap_tag(11, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1: memcheck: Invalid __global__ write of "
                                      "size 4 bytes (the kernel was ended before it could fault "
                                      "the GPU)"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "memcheck");
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    hk_stats st = stats();
    ck_assert_int_eq(st.canary_refused_memcheck, 1);
    ck_assert_int_eq(st.canary_helper_starts, 3); /* replaced, though its context is whole */
    ck_assert_double_eq(metric("hotkern_canary_refused_total{kind=\"memcheck\"}"), 1);
    ck_assert_int_ne(hka_memcheck_pid(rt->canary), before);
    /* The next version is judged by a helper of its own: a clean one
     * passes. */
    ck_assert_msg(swap_tag(1, 1, HK_CANARY_REQUIRE, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "memcheck clean"), "%s", rep.canary);
    /* Ten bad versions in a row are each refused with their own report
     * (a sanitizer that lived on would have stopped printing at its
     * --print-limit of 8), and a fault after them is a fault, not blamed
     * on memcheck's count of the earlier errors. */
    setenv("HKFAKE_FAULT", "step@12", 1); /* seen by helpers started from now on */
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(swap_tag(11, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
        ck_assert_msg(strstr(rep.message, "memcheck: Invalid __global__ write"), "%d: %s", i,
                      rep.message);
    }
    ck_assert_int_eq(stats().canary_refused_memcheck, 11);
    ck_assert_int_eq(swap_tag(12, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_str_eq(rep.canary_refusal, "fault");
    unsetenv("HKFAKE_FAULT");
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);

    /* An error that ends the context: the launch fails, the helper goes. */
    setenv("HKSAN_MODE", "hard", 1);
    rt = make_rt_san(1, fake_san, &rep);
    start_with_test(HK_COMPARE_NONE, 0);
    before = hka_memcheck_pid(rt->canary);
    ck_assert_int_eq(swap_tag(11, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1: memcheck: Invalid __global__ write of "
                                      "size 4 bytes (CUDA_ERROR_LAUNCH_FAILED)"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_LAUNCH_FAILED");
    ck_assert_int_eq(hk_module_version(rt, "m"), 1);
    ck_assert_int_eq(stats().canary_helper_starts, 3);
    pid_t after = hka_memcheck_pid(rt->canary);
    ck_assert_int_gt(after, 0);
    ck_assert_int_ne(after, before);
    ck_assert(!alive(before));
    unsetenv("HKSAN_MODE");

    /* A clean version passes both helpers. */
    ck_assert_msg(swap_tag(1, 1, HK_CANARY_REQUIRE, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "1 launch passed; memcheck clean; timed"), "%s", rep.canary);
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);

    /* The same version without memcheck: nothing to see, it commits. */
    rt = make_rt_san(-1, fake_san, &rep);
    ck_assert_int_eq(hka_memcheck_pid(rt->canary), 0);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_msg(swap_tag(11, 0, HK_CANARY_OPTIONAL, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(hk_module_version(rt, "m"), 2);
    hk_report_clear(&rep);
}
END_TEST

/* A sanitizer that cannot run: memcheck off where it was only wanted,
 * saying why; create fails where it was required. */
START_TEST(sanitizer_that_cannot_start) {
    setenv("HKSAN_MODE", "fail", 1);
    hk_report rep = HK_REPORT_INIT;
    rt = make_rt_san(0, fake_san, &rep);
    ck_assert_msg(strstr(rep.message, "run without memcheck: the memcheck helper did not start "
                                      "(it ended, exit status 1"),
                  "%s", rep.message);
    ck_assert_msg(strstr(rep.message, "the fake sanitizer cannot run here"), "%s", rep.message);
    ck_assert_int_eq(stats().canary_sanitizer, 0);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_msg(swap_tag(2, 0, HK_CANARY_REQUIRE, &rep) == 0, "%s", rep.message);
    hk_runtime_destroy(rt);
    rt = NULL;
    hk_options o;
    rt_options(&o, NULL, 2000, 1);
    o.canary_sanitizer = 1;
    o.canary_sanitizer_path = fake_san;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), HK_ERR_IO);
    ck_assert_msg(strstr(rep.message, "the memcheck helper did not start"), "%s", rep.message);
    hk_report_clear(&rep);
}
END_TEST

/* A launch that ends well but drew a report (the sanitizer ended the
 * kernel, or let it run on) is refused all the same; a report whose lines
 * never came (only the exit status says so) is refused with the status. */
START_TEST(memcheck_report_without_a_fault_or_a_line) {
    setenv("HKFAKE_OOB", "step@11", 1);
    hk_report rep = HK_REPORT_INIT;
    rt = make_rt_san(1, fake_san, &rep);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_int_eq(swap_tag(11, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "kernel 'step' test 1: memcheck: Invalid __global__ write of "
                                      "size 4 bytes (the kernel was ended before it could fault "
                                      "the GPU); the running version stays"),
                  "%s", rep.message);
    ck_assert_str_eq(rep.canary_refusal, "memcheck");
    hk_runtime_destroy(rt);
    /* The sanitizer's warning that records were dropped is not what the
     * report names: the error's own line is (and the warning, alone). */
    setenv("HKSAN_MODE", "overflow", 1);
    rt = make_rt_san(1, fake_san, &rep);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_int_eq(swap_tag(11, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "memcheck: Invalid __global__ write of size 4 bytes"), "%s",
                  rep.message);
    hk_runtime_destroy(rt);
    setenv("HKSAN_MODE", "dropped", 1);
    rt = make_rt_san(1, fake_san, &rep);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_int_eq(swap_tag(11, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "memcheck: errors, their records dropped (Warning: Error "
                                      "buffer overflow has been detected. Some records have been "
                                      "dropped)"),
                  "%s", rep.message);
    hk_runtime_destroy(rt);
    setenv("HKSAN_MODE", "quiet", 1);
    rt = make_rt_san(1, fake_san, &rep);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_int_eq(swap_tag(11, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "memcheck: an error (compute-sanitizer exit status 86) "
                                      "(CUDA_ERROR_LAUNCH_FAILED)"),
                  "%s", rep.message);
    ck_assert_int_eq(stats().canary_refused_memcheck, 1);
    hk_report_clear(&rep);
}
END_TEST

/* The arguments of process p's command line, each followed by '\n'. */
static void cmdline(pid_t p, char *out, size_t n) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)p);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t len = fread(out, 1, n - 1, f);
    fclose(f);
    for (size_t i = 0; i < len; i++)
        out[i] = out[i] ? out[i] : '\n';
    out[len] = '\0';
}

/* Create with options.canary_device set to dev, on two fake devices;
 * returns create's result (rt set on success). */
static int create_on(const char *dev, hk_report *rep) {
    hk_options o;
    rt_options(&o, NULL, 2000, 1);
    fake_init(2, 90);
    setenv("HKFAKE_DEVICES", "2", 1); /* the helper's fake too */
    o.canary_device = dev;
    rt = NULL;
    return hkl_runtime_create_with(&rt, &o, fake_driver(), rep);
}

/* options.canary_device: the helper runs on the device named by ordinal or
 * by UUID (either case, "GPU-" optional), and test launches run there; a
 * device that does not exist, or has another architecture, fails create
 * with what was asked and what there is. */
START_TEST(canary_on_another_device) {
    static const char *const names[] = {"1", "GPU-fa4e0114-1516-1718-191a-1b1c1d1e1f20",
                                        "FA4E0114-1516-1718-191A-1B1C1D1E1F20"};
    hk_report rep = HK_REPORT_INIT;
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(create_on(names[i], &rep) == 0, "%s: %s", names[i], rep.message);
        char args[1024];
        cmdline(hka_helper_pid(rt->canary), args, sizeof args);
        ck_assert_msg(strstr(args, "\n--device\n1\n"), "%s: %s", names[i], args);
        start_with_test(HK_COMPARE_NONE, 0);
        ck_assert_msg(swap_tag(2, 0, HK_CANARY_REQUIRE, &rep) == 0, "%s", rep.message);
        ck_assert_msg(strstr(rep.canary, "1 launch passed"), "%s", rep.canary);
        hk_runtime_destroy(rt);
    }
    /* The memcheck helper runs there too. */
    char argv_file[PATH_MAX];
    snprintf(argv_file, sizeof argv_file, "/tmp/hk-san-argv-dev.%d", (int)getpid());
    setenv("HKSAN_ARGV", argv_file, 1);
    hk_options so;
    rt_options(&so, NULL, 2000, 1);
    fake_init(2, 90);
    setenv("HKFAKE_DEVICES", "2", 1);
    so.canary_device = "1";
    so.canary_sanitizer = 1;
    so.canary_sanitizer_path = fake_san;
    ck_assert_msg(hkl_runtime_create_with(&rt, &so, fake_driver(), &rep) == 0, "%s", rep.message);
    char *sargs = slurp(argv_file);
    ck_assert_msg(strstr(sargs, "\n--device\n1\n"), "%s", sargs);
    free(sargs);
    unlink(argv_file);
    unsetenv("HKSAN_ARGV");
    hk_runtime_destroy(rt);
    /* The default: the runtime's device. */
    ck_assert_msg(create_on(NULL, &rep) == 0, "%s", rep.message);
    char args[1024];
    cmdline(hka_helper_pid(rt->canary), args, sizeof args);
    ck_assert_msg(strstr(args, "\n--device\n0\n"), "%s", args);
    hk_runtime_destroy(rt);
    rt = NULL;

    ck_assert_int_eq(create_on("2", &rep), HK_ERR_INVALID);
    ck_assert_ptr_null(rt);
    ck_assert_msg(strstr(rep.message, "options.canary_device '2': no such device (2 devices: an "
                                      "ordinal below 2, or a UUID as nvidia-smi -L prints it)"),
                  "%s", rep.message);
    ck_assert_int_eq(create_on("GPU-fa4e0114-0000", &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "no such device"), "%s", rep.message);
    hk_options o;
    rt_options(&o, NULL, 2000, 1);
    fake_init(2, 90);
    fake_set_device_arch(1, 80);
    o.canary_device = "1";
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "options.canary_device '1' is device 1, sm_80; the "
                                      "runtime's device is sm_90"),
                  "%s", rep.message);
    /* No canary: the option is not looked at. */
    o.canary = 0;
    ck_assert_msg(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep) == 0, "%s", rep.message);
    hk_report_clear(&rep);
}
END_TEST

/* A hang under memcheck is found after 4 x the launch timeout. */
START_TEST(memcheck_hang) {
    setenv("HKFAKE_HANG", "step@8", 1);
    hk_options o;
    rt_options(&o, NULL, 200, 1);
    o.canary_sanitizer = 1;
    o.canary_sanitizer_path = fake_san;
    hk_report rep = HK_REPORT_INIT;
    rt = create(&o, &rep);
    start_with_test(HK_COMPARE_NONE, 0);
    ck_assert_int_eq(swap_tag(8, 0, HK_CANARY_OPTIONAL, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "did not finish within 800 ms under compute-sanitizer"), "%s",
                  rep.message);
    ck_assert_str_eq(rep.canary_refusal, "hang");
    ck_assert_msg(swap_tag(1, 1, HK_CANARY_REQUIRE, &rep) == 0, "%s", rep.message);
    ck_assert_msg(strstr(rep.canary, "memcheck clean"), "%s", rep.canary);
    hk_report_clear(&rep);
}
END_TEST

/* The children of process p (its main thread's list). */
static int children_of(pid_t p, pid_t *out, int max) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)p, (int)p);
    FILE *f = fopen(path, "r");
    int n = 0;
    long c;
    while (f && n < max && fscanf(f, "%ld", &c) == 1)
        out[n++] = (pid_t)c;
    if (f)
        fclose(f);
    return n;
}

/* The wrapper gets nothing of the application's (the spawn closes it), and
 * the helper under it ends with the runtime. */
START_TEST(memcheck_helper_inherits_nothing_and_ends) {
    char mine_path[64];
    snprintf(mine_path, sizeof mine_path, "/tmp/hk-app-fd.%d", (int)getpid());
    int mine = open(mine_path, O_RDWR | O_CREAT, 0600); /* no O_CLOEXEC on purpose */
    ck_assert_int_ge(mine, 0);
    hk_report rep = HK_REPORT_INIT;
    rt = make_rt_san(1, fake_san, &rep);
    pid_t wrapper = hka_memcheck_pid(rt->canary), kids[4];
    ck_assert_int_gt(wrapper, 0);
    ck_assert_int_eq(children_of(wrapper, kids, 4), 1);
    pid_t procs[2] = {wrapper, kids[0]};
    for (int k = 0; k < 2; k++)
        for (int fd = 0; fd < 64; fd++) {
            char path[64], target[256];
            snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)procs[k], fd);
            ssize_t n = readlink(path, target, sizeof target - 1);
            target[n > 0 ? n : 0] = '\0';
            ck_assert_msg(strcmp(target, mine_path),
                          "process %d holds the application's %s as fd %d", (int)procs[k],
                          mine_path, fd);
        }
    close(mine);
    unlink(mine_path);
    hk_runtime_destroy(rt);
    rt = NULL;
    for (int i = 0; i < 300 && alive(kids[0]) && proc_state(kids[0]) != 'Z'; i++)
        usleep(10000);
    ck_assert_msg(!alive(kids[0]) || proc_state(kids[0]) == 'Z', "the memcheck helper %d lives on",
                  (int)kids[0]);
    hk_report_clear(&rep);
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

/* The state letter of /proc/PID/stat ('Z': a zombie), 0 when it is gone. */
static char proc_state(pid_t p) {
    char path[64], buf[512] = "";
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)p);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' ? paren[2] : 0;
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

int main(void) {
    built_path(fake_lib, "lib/libhotkern-fakecuda.so");
    built_path(bad_helper, "stub/hotkern-canary-bad");
    built_path(fake_san, "stub/fake-compute-sanitizer");
    /* Never the machine's compute-sanitizer around the fake driver: the
     * memcheck tests name the fake one. */
    setenv("HK_COMPUTE_SANITIZER", "", 1);
    Suite *s = suite_create("canary");
    TCase *tc = tcase_create("fake");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, loadable_fake_runs_a_program);
    tcase_add_test(tc, loadable_fake_takes_cubins);
    tcase_add_test(tc, loadable_fake_controls_by_dlsym);
    tcase_add_test(tc, loadable_fake_controls_by_environment);
    suite_add_tcase(s, tc);
    tc = tcase_create("runs");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, good_kernel_committed);
    tcase_add_test(tc, faulting_kernel_refused_with_cuname);
    tcase_add_test(tc, hanging_kernel_refused_and_helper_restarted);
    tcase_add_test(tc, trap_caught_by_the_guard_keeps_the_helper);
    tcase_add_test(tc, resources_are_checked_on_the_image_that_commits);
    tcase_add_test(tc, perf_guard_times_the_image_that_commits);
    tcase_add_test(tc, trap_in_the_timed_repeats_is_caught);
    tcase_add_test(tc, wrong_output_refused_on_compare);
    tcase_add_test(tc, float_tolerance_lets_close_outputs_through);
    tcase_add_test(tc, no_tests_committed_as_today);
    tcase_add_test(tc, skip_policy_commits_a_faulting_kernel);
    tcase_add_test(tc, no_canary_configured);
    tcase_add_test(tc, test_that_does_not_fit_refuses);
    tcase_add_test(tc, submitted_version_refused_by_worker);
    tcase_add_test(tc, helper_killed_mid_run);
    tcase_add_test(tc, helper_dead_between_runs_is_replaced);
    suite_add_tcase(s, tc);
    tc = tcase_create("untrusted helper");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, bad_helper_garbage);
    tcase_add_test(tc, bad_helper_oversize);
    tcase_add_test(tc, bad_helper_silent_optional);
    tcase_add_test(tc, bad_helper_silent_required);
    tcase_add_test(tc, destroy_does_not_wait_for_a_canary_run);
    tcase_add_test(tc, bad_helper_no_ready);
    tcase_add_test(tc, bad_helper_fail_ready);
    tcase_add_test(tc, bad_helper_exits);
    tcase_add_test(tc, bad_helper_wrong_type);
    tcase_add_test(tc, bad_helper_wrong_size);
    tcase_add_test(tc, bad_helper_extra_bytes);
    tcase_add_test(tc, bad_helper_unasked_buffers);
    tcase_add_test(tc, bad_helper_trap_replies);
    tcase_add_test(tc, helpers_outliving_their_kill_are_all_reaped);
    tcase_add_test(tc, long_kernel_name_refused_at_declaration);
    tcase_add_test(tc, helper_inherits_no_application_fd);
    tcase_add_test(tc, helper_output_is_its_own);
    tcase_add_test(tc, missing_helper_fails_create);
    tcase_add_test(tc, push_policy_defaults_to_required);
    tcase_add_test(tc, bad_helper_timed_reply);
    suite_add_tcase(s, tc);
    tc = tcase_create("perf guard");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, slower_version_refused_with_both_times);
    tcase_add_test(tc, ratio_and_floor_decide_together);
    tcase_add_test(tc, runtime_policy_sets_the_limits);
    tcase_add_test(tc, swap_policy_overrides_the_runtime);
    tcase_add_test(tc, first_version_has_nothing_to_compare_with);
    suite_add_tcase(s, tc);
    tc = tcase_create("memcheck");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, sanitizer_not_found_is_off_and_said);
    tcase_add_test(tc, memcheck_refuses_what_a_plain_run_misses);
    tcase_add_test(tc, sanitizer_that_cannot_start);
    tcase_add_test(tc, memcheck_helper_inherits_nothing_and_ends);
    tcase_add_test(tc, memcheck_report_without_a_fault_or_a_line);
    tcase_add_test(tc, memcheck_hang);
    tcase_add_test(tc, canary_on_another_device);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

/*
 * The canary suite's fixture (fixture.h): the built helpers' paths, the
 * runtime with its canary helper and test, and the per-test teardown. A
 * helper one part alone needs stays in that part.
 */
#include "tests/canary/fixture.h"

char fake_lib[PATH_MAX], bad_helper[PATH_MAX];

void built_path(char *out, const char *rel) {
    char self[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    snprintf(out, PATH_MAX, "%s/%s", dirname(dirname(self)), rel);
}

hk_runtime *rt;

void rt_options(hk_options *o, const char *helper, int timeout_ms, int canary) {
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

hk_runtime *create(const hk_options *o, hk_report *rep) {
    hk_runtime *r = NULL;
    int err = hkl_runtime_create_with(&r, o, fake_driver(), rep);
    ck_assert_msg(err == 0, "create: %s", rep->message);
    return r;
}

hk_runtime *make_rt(const char *helper, int timeout_ms, int canary) {
    hk_options o;
    rt_options(&o, helper, timeout_ms, canary);
    hk_report rep = HK_REPORT_INIT;
    return create(&o, &rep);
}

hk_kernel *k_step;

void start_with_test(hk_compare mode, double atol) {
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

int swap_tag(int tag, int with_aux, hk_canary_policy policy, hk_report *rep) {
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.canary = policy;
    const char *p = fake_ptx(tag, with_aux, 0, 0);
    return hk_swap(rt, "m", p, strlen(p) + 1, &so, rep);
}

void teardown(void) {
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

hk_stats stats(void) {
    hk_stats st = HK_STATS_INIT;
    ck_assert_int_eq(hk_stats_get(rt, &st), 0);
    return st;
}

double metric(const char *series) {
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

int alive(pid_t p) {
    return p > 0 && kill(p, 0) == 0;
}

char fake_san[PATH_MAX];

char proc_state(pid_t p) {
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

/*
 * Canary runs under compute-sanitizer's memcheck (the stand-in BUILD/stub/
 * fake-compute-sanitizer): off and said when none is found; it refuses what
 * a plain run misses; one that cannot start, a report without a fault or a
 * line, a hang; the helper it starts inherits nothing and ends; a canary
 * on another device.
 */
#include "tests/canary/fixture.h"

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

void canary_memcheck_tests(TCase *tc) {
    tcase_add_test(tc, sanitizer_not_found_is_off_and_said);
    tcase_add_test(tc, memcheck_refuses_what_a_plain_run_misses);
    tcase_add_test(tc, sanitizer_that_cannot_start);
    tcase_add_test(tc, memcheck_helper_inherits_nothing_and_ends);
    tcase_add_test(tc, memcheck_report_without_a_fault_or_a_line);
    tcase_add_test(tc, memcheck_hang);
    tcase_add_test(tc, canary_on_another_device);
}

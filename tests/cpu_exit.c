/*
 * Exits in the middle of hotkern's work (base/exit.c, interpose/env.c), on
 * the CPU: real NVRTC, the loadable fake driver (HK_LIBCUDA) for the
 * driver's part.
 *
 * The program: BUILD/stub/exit_app_{shared,static} (tests/stub/exit_app.cu),
 * an ordinary nvcc program, run under LD_PRELOAD of the preload library and
 * as the --wrap build, with HOTKERN_WATCH on a directory holding a CUDA C
 * file that takes seconds to compile and no compile cache: its first launch
 * makes the runtime, the watch hands the file over, and the program ends
 * within 400 ms, by returning from main, by exit, or by exit from a second
 * thread while the main thread launches. Every run must end with the
 * program's own status (7) and its buffered output whole, the build still in
 * flight (its module never committed: the log says it was handed over and
 * nothing ran). Before the fix, NVRTC compiled in the program's process (the
 * warm-up and the build) and the process died in NVRTC's static destructors.
 *
 * The guard itself, in a child process: exit waits for a section in
 * progress before the exit handlers registered earlier run; a section that
 * outlasts the wait ends the process with the status exit was given and its
 * output flushed; once exiting, no section begins. And the interposition's
 * part (the fake driver in process): from the exit on, a launch of a kernel
 * that has a hot version is the program's own. And a program of the API,
 * compiling in its own process, that exits during its first build.
 */
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/exit.h"
#include "hotkern/interpose.h"
#include "interpose/interpose.h"
#include "loader/core.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"
#include "util/util.h"

static char build[PATH_MAX], dir[PATH_MAX];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    ck_assert_int_lt(n, (int)sizeof cmd);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A module with fill (the program's kernel) and 150 kernels that take
 * NVRTC seconds (12 s for 300 of them on the CI machine). */
static void write_big(const char *path) {
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "#define BODY(i) for (int k = 0; k < 64; k++) acc = acc * 1.0001f + "
               "__sinf(acc + k * (i));\n"
               "extern \"C\" __global__ void fill(float *x) { if (x) *x = 2.0f; }\n");
    for (int i = 0; i < 150; i++)
        fprintf(f,
                "extern \"C\" __global__ void k%d(float *x) { float acc = x[threadIdx.x];\n"
                "#pragma unroll\n BODY(%d) x[threadIdx.x] = acc; }\n",
                i, i);
    ck_assert_int_eq(fclose(f), 0);
}

static void setup(void) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(n, 0);
    self[n] = 0;
    snprintf(build, sizeof build, "%s", dirname(dirname(self)));
    char *d = hkt_tmpdir();
    ck_assert_ptr_nonnull(d);
    snprintf(dir, sizeof dir, "%s", d);
    free(d);
    ck_assert_int_eq(sh("mkdir -p '%s/w'", dir), 0);
    char big[PATH_MAX + 16];
    snprintf(big, sizeof big, "%s/w/big.cu", dir);
    write_big(big);
}

static void teardown(void) {
    sh("sleep 0.5"); /* the orphaned build helpers notice within 200 ms */
    hkt_rmtree(dir);
}

/* Runs app (exit_app_shared under the preload library, or _static) RUNS
 * times, each ending after a pseudo-random delay below 400 ms, by each of
 * the three ways in turn; every failure is printed, and counted. */
static int runs_fail(const char *app, int preload, int runs) {
    char prog[PATH_MAX + 32];
    snprintf(prog, sizeof prog, "%s/stub/%s", build, app);
    if (access(prog, X_OK)) {
        printf("SKIP exit: %s is not built (sanitizer builds leave the nvcc programs out)\n", prog);
        return -1;
    }
    static const char *const how[] = {"return", "exit", "thread"};
    unsigned seed = 12345;
    int bad = 0;
    for (int i = 0; i < runs; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned delay = (seed >> 8) % 400000;
        int rc = sh("cd '%s' && env HOTKERN_WATCH=w HOTKERN_CACHE_DIR= HOTKERN_LOG=info "
                    "HK_LIBCUDA='%s/lib/libhotkern-fakecuda.so' %s%s%s '%s' %u %s >out 2>err",
                    dir, build, preload ? "LD_PRELOAD='" : "", preload ? build : "",
                    preload ? "/lib/libhotkern-preload.so'" : "", prog, delay, how[i % 3]);
        int out_ok =
            sh("cd '%s' && printf 'exit_app started\\nexit_app done\\n' | cmp -s - out", dir) == 0;
        /* The premise: the runtime was made and the build was in flight. */
        int handed = sh("grep -q 'handed over as module big' '%s/err'", dir) == 0;
        int committed = sh("grep -q 'big v1 (was none)' '%s/err'", dir) == 0;
        if (rc != 7 || !out_ok || !handed || committed) {
            printf("%s run %d (%s after %u us): status %d, output %s%s%s\n", app, i, how[i % 3],
                   delay, rc, out_ok ? "whole" : "lost",
                   handed ? "" : ", the watch never handed the file over",
                   committed ? ", the build ended before the exit" : "");
            fflush(stdout);
            sh("cd '%s' && cat out err", dir);
            bad++;
        }
    }
    return bad;
}

START_TEST(preload_program_exits_during_its_first_build) {
    int bad = runs_fail("exit_app_shared", 1, 25);
    ck_assert_msg(bad <= 0, "%d of 25 runs under the preload library failed", bad);
}
END_TEST

START_TEST(wrap_program_exits_during_its_first_build) {
    int bad = runs_fail("exit_app_static", 0, 25);
    ck_assert_msg(bad <= 0, "%d of 25 runs of the --wrap build failed", bad);
}
END_TEST

/* ---- the guard ----------------------------------------------------------- */

static _Atomic int section_done;
static int hold_ms;

static void *holder(void *arg) {
    if (!hkb_exit_enter())
        _exit(98);
    *(_Atomic int *)arg = 1;
    usleep((useconds_t)hold_ms * 1000);
    atomic_store(&section_done, 1);
    hkb_exit_leave();
    for (;;)
        pause();
}

/* Registered before the guard: runs after it. */
static void earlier_handler(void) {
    printf("earlier handler: section %s\n", atomic_load(&section_done) ? "over" : "running");
    if (!hkb_exiting() || hkb_exit_enter())
        printf("a section began during the exit\n");
}

/* A child that holds a section for hold ms on a thread, with the guard
 * waiting up to wait ms, and exits with status 5; its output goes to
 * DIR/child.out. Returns its exit status (or 128 + signal). */
static int child(int hold, int wait) {
    char out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s/child.out", dir);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (!freopen(out, "w", stdout))
            _exit(99);
        hold_ms = hold;
        atexit(earlier_handler);
        hkb_exit_guard(wait);
        _Atomic int in = 0;
        pthread_t t;
        pthread_create(&t, NULL, holder, &in);
        while (!atomic_load(&in))
            usleep(1000);
        printf("main: exiting\n"); /* buffered: a file */
        exit(5);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

START_TEST(exit_waits_for_a_section_in_progress) {
    ck_assert_int_eq(child(300, 5000), 5);
    ck_assert_int_eq(sh("printf 'main: exiting\\nearlier handler: section over\\n' | "
                        "cmp - '%s/child.out'",
                        dir),
                     0);
}
END_TEST

START_TEST(a_section_past_the_wait_ends_the_process_with_its_status) {
    ck_assert_int_eq(child(5000, 200), 5);
    /* Its output flushed; the handler registered before the guard skipped. */
    ck_assert_int_eq(sh("printf 'main: exiting\\n' | cmp - '%s/child.out'", dir), 0);
}
END_TEST

/* ---- launches during the exit ------------------------------------------ */

static int program_launches;

static cudaError_t f_klaunch(cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh_, cudaStream_t s) {
    program_launches++;
    return (cudaError_t)fake_driver()->LaunchKernel((CUfunction)k, g.x, g.y, g.z, b.x, b.y, b.z,
                                                    (unsigned)sh_, (CUstream)s, a, NULL);
}

static const hki_real fake_real = {.klaunch = f_klaunch, .klaunch_ptsz = f_klaunch};
static cudaKernel_t prog_kernel;

/* One <<<>>> launch of the program's kernel: the tag of the code that ran. */
static int launch_tag(void) {
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    dim3 one = {1, 1, 1};
    hki_klaunch(0, prog_kernel, one, one, args, 0, NULL);
    return out;
}

/* Registered before the runtime is attached: runs after the interposition's
 * exit handler. */
static void launch_at_exit(void) {
    int before = program_launches, tag = launch_tag();
    printf("at exit: tag %d, %s\n", tag, program_launches > before ? "the program" : "hot");
}

START_TEST(launches_during_the_exit_are_the_programs) {
    char out[PATH_MAX + 16];
    snprintf(out, sizeof out, "%s/child.out", dir);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (!freopen(out, "w", stdout))
            _exit(99);
        fake_init(1, 90);
        hki_real_set(&fake_real);
        hk_options o;
        hk_options_init(&o);
        o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
        o.cache_dir = "";
        o.no_warm_start = 1;
        hk_runtime *rt;
        if (hkl_runtime_create_with(&rt, &o, fake_driver(), NULL) < 0)
            _exit(98);
        fake_driver()->CtxSetCurrent(hkl_ctx(rt, 0));
        CUlibrary lib;
        CUkernel k;
        const hkb_driver *d = fake_driver();
        if (d->LibraryLoadData(&lib, fake_ptx(1, 0, 0, 0), NULL, NULL, 0, NULL, NULL, 0) ||
            d->LibraryGetKernel(&k, lib, "step"))
            _exit(97);
        prog_kernel = (cudaKernel_t)k;
        atexit(launch_at_exit);
        if (hk_interpose_attach(rt) < 0)
            _exit(96);
        const char *hot = fake_ptx(2, 0, 0, 0);
        printf("before: tag %d\n", launch_tag());
        if (hk_swap(rt, "sim", hot, strlen(hot), NULL, NULL) < 0)
            _exit(95);
        printf("hot: tag %d\n", launch_tag());
        exit(0);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    sh("cat '%s'", out);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ck_assert_int_eq(
        sh("printf 'before: tag 1\\nhot: tag 2\\nat exit: tag 1, the program\\n' | cmp - '%s'",
           out),
        0);
}
END_TEST

/* ---- a program of the API that exits at once ---------------------------- */

/* A program that builds in its own process (the API's default) makes a
 * runtime without the warm-up, hands it the seconds-long build of big.cu
 * and exits delay_ms later, during that build: the process's first NVRTC
 * compile, whose exit handlers are registered as it runs, must have been
 * made before (at create), so that the guard runs before them. Returns the
 * exit status (or 128 + signal). */
static int api_child(const char *src, size_t len, int delay_ms) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        fake_init(1, 90);
        hk_options o;
        hk_options_init(&o);
        o.cache_dir = "";
        o.no_warm_start = 1;
        o.destroy_wait_ms = 100; /* the guard's wait: then it ends the process */
        hk_runtime *rt;
        if (hkl_runtime_create_with(&rt, &o, fake_driver(), NULL) < 0)
            _exit(98);
        if (hk_submit(rt, "big", src, len, NULL) < 0)
            _exit(97);
        usleep((useconds_t)delay_ms * 1000);
        exit(7);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

START_TEST(api_program_exits_during_its_first_build) {
    char path[PATH_MAX + 16], got[256] = "";
    snprintf(path, sizeof path, "%s/w/big.cu", dir);
    size_t len = 0;
    char *src = NULL;
    ck_assert_int_eq(hku_read_file(path, 1 << 20, &src, &len, NULL), 0);
    int bad = 0;
    for (int i = 0; i < 10; i++) {
        int st = api_child(src, len, 100 + 30 * i);
        bad += st != 7;
        snprintf(got + strlen(got), sizeof got - strlen(got), " %d", st);
    }
    free(src);
    ck_assert_msg(!bad, "%d of 10 exits 100-370 ms into the build did not end with status 7:%s",
                  bad, got);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("exit");
    TCase *tc = tcase_create("exit");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, exit_waits_for_a_section_in_progress);
    tcase_add_test(tc, a_section_past_the_wait_ends_the_process_with_its_status);
    tcase_add_test(tc, launches_during_the_exit_are_the_programs);
    tcase_add_test(tc, preload_program_exits_during_its_first_build);
    tcase_add_test(tc, wrap_program_exits_during_its_first_build);
    tcase_add_test(tc, api_program_exits_during_its_first_build);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

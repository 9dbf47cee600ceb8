/*
 * GPU suite: the last known good across a crash and a restart.
 *
 * A child process (this binary run again with "--child DIR", through
 * posix_spawn: CUDA does not survive fork) commits a good version of `step`
 * into a runtime whose state directory is DIR, runs it past the suspect
 * window, then, with canaries off, commits a version that writes through a
 * bad pointer, launches it and sees the sticky error come back from its next
 * launch; it exits at once, as a program whose context is lost does (status
 * 42 when everything went as planned, without destroying the runtime).
 *
 * The parent then starts a runtime on DIR: hk_runtime_restore brings back the
 * good version, which must compute the right values on the parent's own
 * buffer, and swapping the faulting source again must be refused with
 * HK_ERR_QUARANTINED (NVRTC builds the same source into the same image).
 *
 * SKIP without a device.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loader/core.h"
#include "tests/harness.h"

extern char **environ;

#define N        4096
#define WINDOW   2000 /* suspect window (ms) of both processes */
#define CHILD_OK 42

#define KERNEL_HEAD                                                                                \
    "extern \"C\" __global__ void step(float *x, int n) {\n"                                       \
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"

static const char *GOOD = KERNEL_HEAD "  if (i < n) x[i] = x[i] + 1.0f;\n}\n";
static const char *FAULTS = KERNEL_HEAD "  if (i < n) ((volatile float *)0x10)[i] = x[i];\n}\n";

static int lost_events;

static void on_event(const hk_event *ev, void *ud) {
    (void)ud;
    lost_events += ev->kind == HK_EVENT_CONTEXT_LOST;
}

static int make_rt(hk_runtime **rt, const char *dir, hk_report *rep) {
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = "";
    o.canary = 0;
    o.state_dir = dir;
    o.suspect_window_ms = WINDOW;
    o.on_event = on_event;
    return hk_runtime_create(rt, &o, rep);
}

static int launch(hk_kernel *k, float *buf, int *cu) {
    int n = N;
    void *args[] = {&buf, &n};
    return hk_launch(k, (hk_dim3){N / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0, NULL, args, cu);
}

/* 1 when every element of buf is i * 0.5 + add. */
static int holds(const float *dev, float add) {
    static float got[N];
    if (cudaMemcpy(got, dev, sizeof got, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 0;
    for (int i = 0; i < N; i++)
        if (got[i] != (float)i * 0.5f + add)
            return 0;
    return 1;
}

static float *fresh_buffer(void) {
    static float init[N];
    float *d = NULL;
    for (int i = 0; i < N; i++)
        init[i] = (float)i * 0.5f;
    if (cudaMalloc((void **)&d, sizeof init) != cudaSuccess ||
        cudaMemcpy(d, init, sizeof init, cudaMemcpyHostToDevice) != cudaSuccess)
        return NULL;
    return d;
}

#define CHILD_CHECK(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "child: " __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                                   \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

/* The crashing program. Never returns. */
static void child(const char *dir) {
    hk_runtime *rt = NULL;
    hk_report rep = HK_REPORT_INIT;
    hk_kernel *k = NULL;
    int cu = 0;
    CHILD_CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
    float *buf = fresh_buffer();
    CHILD_CHECK(buf, "buffer");
    CHILD_CHECK(make_rt(&rt, dir, &rep) == 0, "create: %s", rep.message);
    CHILD_CHECK(hk_swap(rt, "m", GOOD, strlen(GOOD), NULL, &rep) == 0, "good: %s", rep.message);
    CHILD_CHECK(hk_kernel_get(rt, "m", "step", &k) == 0, "handle");
    CHILD_CHECK(launch(k, buf, &cu) == 0, "good launch: %d", cu);
    CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess && holds(buf, 1.0f), "good result");
    usleep((WINDOW + 1000) * 1000); /* the good version outlives the window */
    hk_swap_options so;
    hk_swap_options_init(&so);
    so.canary = HK_CANARY_SKIP;
    CHILD_CHECK(hk_swap(rt, "m", FAULTS, strlen(FAULTS), &so, &rep) == 0, "bad: %s", rep.message);
    CHILD_CHECK(launch(k, buf, &cu) == 0 || hkl_lkg_sticky(cu), "bad launch: %d", cu);
    cudaError_t e = cudaDeviceSynchronize();
    CHILD_CHECK(e != cudaSuccess, "the faulting kernel did not fault");
    /* The next launch through hotkern returns the sticky error. */
    int err = launch(k, buf, &cu);
    CHILD_CHECK(err == HK_ERR_CUDA && hkl_lkg_sticky(cu), "sticky launch: %d cu %d", err, cu);
    CHILD_CHECK(lost_events == 1, "%d CONTEXT_LOST events", lost_events);
    hk_quarantine q = HK_QUARANTINE_INIT;
    CHILD_CHECK(hk_quarantine_get(rt, 0, &q) == 0 && q.version == 2, "quarantine");
    _exit(CHILD_OK); /* a lost context: the process ends without cleaning up */
}

START_TEST(crash_and_restart_comes_back_on_the_known_good) {
    char *dir = hkt_tmpdir(), self[4096];
    ck_assert_ptr_nonnull(dir);
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(n, 0);
    self[n] = 0;
    char *argv[] = {self, "--child", dir, NULL};
    pid_t pid;
    ck_assert_int_eq(posix_spawn(&pid, self, NULL, NULL, argv, environ), 0);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == CHILD_OK,
                  "child ended with status %#x", status);

    ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
    float *buf = fresh_buffer();
    ck_assert_ptr_nonnull(buf);
    hk_runtime *rt = NULL;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(make_rt(&rt, dir, &rep) == 0, "create: %s", rep.message);
    ck_assert_msg(hk_runtime_restore(rt, &rep) == 1, "restore: %s", rep.message);
    hk_kernel *k;
    int cu = 0;
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &k), 0);
    ck_assert_int_eq(launch(k, buf, &cu), 0);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_msg(holds(buf, 1.0f), "the restored version computed something else");
    ck_assert_int_eq(hk_swap(rt, "m", FAULTS, strlen(FAULTS), NULL, &rep), HK_ERR_QUARANTINED);
    hk_quarantine q = HK_QUARANTINE_INIT;
    ck_assert_int_eq(hk_quarantine_get(rt, 0, &q), 0);
    ck_assert_str_eq(q.module, "m");
    /* The good version still runs. */
    ck_assert_int_eq(launch(k, buf, &cu), 0);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert(holds(buf, 2.0f));
    hk_report_clear(&rep);
    hk_runtime_destroy(rt);
    cudaFree(buf);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child"))
        child(argv[2]);
    if (!hkt_gpu_or_skip("gpu_lkg"))
        return HKT_SKIP;
    Suite *s = suite_create("last known good (GPU)");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, crash_and_restart_comes_back_on_the_known_good);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

/*
 * GPU suite: pushed versions that fault, never end or compute something else
 * are refused by the canary while the program keeps launching. A program
 * that uses the CUDA runtime API keeps a live buffer that `step` adds 1.0f
 * to; a thread launches `step` on it through hk_launch on a stream of its
 * own, without pause, for the whole test. An endpoint on 127.0.0.1 (one
 * trusted key, the default swap template, so the push policy is
 * HK_CANARY_REQUIRE; the default runtime options, so memcheck runs where
 * compute-sanitizer is found) takes `hotkern push`es: a good v1, then FAULTS, ENDLESS
 * and WRONG (each refused: exit 1, HK_ERR_CANARY, the version unchanged, and
 * the launch count grew while the push was handled), then a good v2. At the
 * end no launch failed and every element of the live buffer equals what the
 * launches made of it (each added 1.0f, so the value is the number of
 * launches, summed in float exactly as the device does).
 *
 * SKIP without a device, without BUILD/bin/hotkern-canary or without
 * BUILD/bin/hotkern. One process, no fork of the test (CUDA does not survive
 * fork); the CLI runs through popen.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hotkern/net.h"
#include "net/net.h"
#include "tests/canary_kernels.h"
#include "tests/gpu.h"
#include "tests/harness.h"

#define N          4096
#define SYNC_EVERY 64 /* the launcher synchronises its stream every K launches */
#define TIMEOUT_MS 2000
static hk_runtime *rt;
static hk_endpoint *ep;
static hk_kernel *step;
static float *live;  /* the application's buffer */
static int memcheck; /* the defaults found compute-sanitizer: faults are memcheck's */
static char *tmp;
static char url[64], key_path[4200], cli[4200];

/* The launcher: its counters are atomics read by the test thread; error is
 * written by the launcher only, and read once failures is non-zero. */
static struct {
    pthread_t thread;
    atomic_int stop;
    atomic_long launches; /* hk_launch calls that returned 0 */
    atomic_long failures; /* a non-zero return or a CUDA error */
    char error[256];      /* the first failure */
} L;

/* On the launcher only: the text is written before the count that makes
 * other threads read it. */
static void launcher_failed(const char *what, int code) {
    if (atomic_load(&L.failures) == 0)
        snprintf(L.error, sizeof L.error, "%s (%d) after %ld launches", what, code,
                 atomic_load(&L.launches));
    atomic_fetch_add(&L.failures, 1);
}

/* Launches step on the live buffer until told to stop, with no pause; stops
 * at the first failure (a sticky error would fail every later call). */
static void *launch_loop(void *arg) {
    (void)arg;
    cudaStream_t s;
    cudaError_t ce = cudaSetDevice(0);
    if (ce == cudaSuccess)
        ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        launcher_failed(cudaGetErrorString(ce), (int)ce);
        return NULL;
    }
    int n = N;
    void *args[] = {&live, &n};
    long since_sync = 0;
    while (!atomic_load(&L.stop)) {
        int cu = 0;
        int err = hk_launch(step, (hk_dim3){N / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0, s, args, &cu);
        if (err) {
            launcher_failed(hk_strerror(err), cu);
            break;
        }
        atomic_fetch_add(&L.launches, 1);
        if (++since_sync == SYNC_EVERY) {
            since_sync = 0;
            if ((ce = cudaStreamSynchronize(s)) != cudaSuccess) {
                launcher_failed(cudaGetErrorString(ce), (int)ce);
                break;
            }
        }
    }
    if ((ce = cudaStreamSynchronize(s)) != cudaSuccess)
        launcher_failed(cudaGetErrorString(ce), (int)ce);
    cudaStreamDestroy(s);
    return NULL;
}

/* Runs `hotkern push URL --key KEY --module m --release R --json FILE`;
 * stdout into out; returns the exit status, or -1. */
static int push(const char *file, int release, char *out, size_t cap) {
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "timeout 120 '%s' push '%s' --key '%s' --module m --release %d --json '%s' 2>&1", cli,
             url, key_path, release, file);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t len = fread(out, 1, cap - 1, p);
    out[len] = '\0';
    int st = pclose(p);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_source(const char *name, const char *src, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s.cu", tmp, name);
    ck_assert_int_eq(hkt_write_file(path, src), 0);
}

/* A good version: committed, and the module's version becomes `want`. */
static void push_committed(const char *name, const char *src, int release, uint64_t want) {
    char path[4200], out[16384];
    write_source(name, src, path, sizeof path);
    long before = atomic_load(&L.launches);
    int rc = push(path, release, out, sizeof out);
    long after = atomic_load(&L.launches);
    ck_assert_msg(rc == 0 && strstr(out, "\"outcome\":\"committed\""), "%s: exit %d: %s", name, rc,
                  out);
    ck_assert_uint_eq(hk_module_version(rt, "m"), want);
    printf("%s committed as version %llu (%ld launches meanwhile)\n", name,
           (unsigned long long)want, after - before);
}

/* A bad version: refused by the canary, the version unchanged, and the
 * program launched while the push was handled. */
static void push_refused(const char *name, const char *src, int release, const char *says) {
    char path[4200], out[16384];
    write_source(name, src, path, sizeof path);
    uint64_t v = hk_module_version(rt, "m");
    long before = atomic_load(&L.launches);
    int rc = push(path, release, out, sizeof out);
    long after = atomic_load(&L.launches);
    ck_assert_msg(rc == 1, "%s: exit %d: %s", name, rc, out);
    ck_assert_msg(strstr(out, "\"error\":\"HK_ERR_CANARY\""), "%s: %s", name, out);
    ck_assert_msg(strstr(out, says), "%s: no \"%s\" in %s", name, says, out);
    ck_assert_uint_eq(hk_module_version(rt, "m"), v);
    ck_assert_msg(atomic_load(&L.failures) == 0, "%s: a launch failed: %s", name, L.error);
    ck_assert_msg(after > before, "%s: no launch while the push was handled (%ld)", name, after);
    printf("%s refused (%ld launches meanwhile): %s\n", name, after - before, out);
}

/* The runtime with a canary, the live buffer (zeros) and the endpoint. */
static void start_program(void) {
    CK_CUDA(cudaSetDevice(0));
    CK_CUDA(cudaMalloc((void **)&live, N * sizeof(float)));
    CK_CUDA(cudaMemset(live, 0, N * sizeof(float)));
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = "";
    o.canary = 1;
    o.canary_helper = hkt_built_program("hotkern-canary");
    o.canary_timeout_ms = TIMEOUT_MS;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_runtime_create(&rt, &o, &rep) == 0, "%s", rep.message);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    memcheck = st.canary_sanitizer == 1;
    printf("memcheck: %s\n", memcheck ? "on" : rep.message);

    hkn_seckey key;
    char pub_path[4200];
    ck_assert_int_eq(hkn_keygen(&key), 0);
    snprintf(key_path, sizeof key_path, "%s/hotkern.key", tmp);
    snprintf(pub_path, sizeof pub_path, "%s/hotkern.pub", tmp);
    ck_assert_int_eq(hkn_seckey_save(key_path, &key, &rep), 0);
    ck_assert_int_eq(hkn_pubkey_save(pub_path, &key.pub, &rep), 0);
    hk_endpoint_options eo;
    hk_endpoint_options_init(&eo);
    /* No swap template: a push's canary policy is the network default. */
    ck_assert_ptr_null(eo.swap);
    const char *keys[] = {pub_path};
    eo.trusted_keys = keys;
    eo.ntrusted_keys = 1;
    eo.state_dir = ""; /* the anti-rollback record in memory */
    ck_assert_msg(hk_endpoint_start(rt, &eo, &ep, &rep) == 0, "%s", rep.message);
    snprintf(url, sizeof url, "http://127.0.0.1:%u", hk_endpoint_port(ep));
    hk_report_clear(&rep);
}

/* Once v1 runs: its handle and the test launch that compares a new
 * version's outputs with the running one's. */
static void declare_test(void) {
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &step), 0);
    declare_step_test(step, N);
}

/* Every element holds the launches' sum, added in float one launch at a
 * time as the device did (exact below 2^24 launches). */
static void check_live(long launches) {
    float want = 0.0f;
    for (long i = 0; i < launches; i++)
        want += 1.0f;
    static float got[N];
    CK_CUDA(cudaMemcpy(got, live, sizeof got, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++)
        ck_assert_msg(got[i] == want, "x[%d] = %.1f after %ld launches (want %.1f)", i,
                      (double)got[i], launches, (double)want);
    if (launches >= (1L << 24))
        printf("note: %ld launches, beyond 2^24: float sums saturate there\n", launches);
}

START_TEST(pushed_bad_versions_refused_while_launching) {
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    start_program();
    push_committed("v1", GOOD, 1, 1);
    declare_test();
    ck_assert_int_eq(pthread_create(&L.thread, NULL, launch_loop, NULL), 0);
    push_refused("faults", FAULTS, 2,
                 memcheck ? "memcheck: Invalid __global__" : "CUDA_ERROR_ILLEGAL_ADDRESS");
    push_refused("endless", ENDLESS, 3,
                 memcheck ? "did not finish within 8000 ms under compute-sanitizer"
                          : "did not finish within 2000 ms");
    push_refused("wrong", WRONG, 4, "differs from version 1");
    push_committed("v2", GOOD2, 5, 2);
    long before_stop = atomic_load(&L.launches);
    atomic_store(&L.stop, 1);
    pthread_join(L.thread, NULL);
    long launches = atomic_load(&L.launches);
    ck_assert_msg(atomic_load(&L.failures) == 0, "launch failed: %s", L.error);
    ck_assert_int_gt(before_stop, 0);
    printf("%ld launches, 0 failed\n", launches);
    CK_CUDA(cudaGetLastError());
    check_live(launches);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_int_eq(st.canary_refused, 3);
    ck_assert_int_eq(st.canary_refused_memcheck, memcheck ? 1 : 0);
    ck_assert_int_eq(st.canary_refused_hang, 1);
    ck_assert_int_eq(st.canary_refused_mismatch, 1);
    hk_endpoint_stop(ep);
    hk_runtime_destroy(rt);
    CK_CUDA(cudaFree(live));
    hkt_rmtree(tmp);
    free(tmp);
}
END_TEST

int main(void) {
    if (!hkt_gpu_or_skip("gpu_canary_push"))
        return HKT_SKIP;
    snprintf(cli, sizeof cli, "%s", hkt_built_program("hotkern"));
    const char *helper = hkt_built_program("hotkern-canary");
    if (access(helper, X_OK) != 0) {
        printf("SKIP gpu_canary_push: no canary helper at %s\n", helper);
        return HKT_SKIP;
    }
    if (access(cli, X_OK) != 0) {
        printf("SKIP gpu_canary_push: no hotkern CLI at %s\n", cli);
        return HKT_SKIP;
    }
    Suite *s = suite_create("canary of pushes under load (GPU)");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, pushed_bad_versions_refused_while_launching);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

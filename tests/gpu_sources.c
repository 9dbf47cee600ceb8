/*
 * GPU suite: new versions arriving from the outside while a thread launches.
 * A watched directory (rename-over save, then a broken save), a signed push to
 * the embedded endpoint with the `hotkern` CLI, and a pull from an nginx
 * origin. Through all of it the application's cudaMalloc'd buffer keeps its
 * contents: every launch adds exactly one to every element.
 */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hotkern/hotkern.h"
#include "hotkern/net.h"
#include "loader/core.h"
#include "tests/gpu.h"
#include "tests/harness.h"

enum { N = 1 << 14 };

static char *dir;
static hk_runtime *rt;
static int *d_buf, *d_tag;
static atomic_int latest_tag, stop;
static atomic_long launches;
static pthread_t launcher;
static int launcher_started;
static hk_endpoint *ep; /* stopped in main, whatever the test's outcome */
static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static int refused;
static char refused_log[8192];
static double last_build_ms, last_stage_ms, last_commit_ms; /* ev_lock */

static void on_event(const hk_event *ev, void *ud) {
    (void)ud;
    pthread_mutex_lock(&ev_lock);
    if (ev->kind == HK_EVENT_COMMITTED && ev->report) {
        last_build_ms = ev->report->build_ms;
        last_stage_ms = ev->report->stage_ms;
        last_commit_ms = ev->report->commit_ms;
    }
    if (ev->kind == HK_EVENT_REFUSED) {
        refused++;
        snprintf(refused_log, sizeof refused_log, "%s\n%s", ev->report->message,
                 ev->report->log ? ev->report->log : "");
    }
    pthread_mutex_unlock(&ev_lock);
}

static void kernel_source(char *buf, size_t n, int tag, int broken) {
    snprintf(buf, n,
             "extern \"C\" __global__ void step(int *buf, int n, int *tag) {\n"
             "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
             "  if (i < n) buf[i] += 1;\n"
             "  if (i == 0) *tag = %d%s;\n"
             "}\n",
             tag, broken ? " +" : "");
}

static void write_file(const char *name, int tag, int broken) {
    char src[1024], tmp[4096], path[4096];
    kernel_source(src, sizeof src, tag, broken);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ck_assert_int_eq(hkt_write_file(tmp, src), 0);
    ck_assert_int_eq(rename(tmp, path), 0); /* how editors save: write, rename over */
}

static void *launch_loop(void *arg) {
    (void)arg;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    hk_kernel *k = NULL;
    while (!atomic_load(&stop) && hk_kernel_get(rt, "particles", "step", &k))
        usleep(1000);
    int n = N;
    void *args[] = {&d_buf, &n, &d_tag};
    while (!atomic_load(&stop)) {
        if (hk_launch(k, (hk_dim3){N / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0, s, args, NULL))
            break;
        int t = 0;
        cudaMemcpyAsync(&t, d_tag, sizeof t, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        atomic_fetch_add(&launches, 1);
        atomic_store(&latest_tag, t);
    }
    cudaStreamDestroy(s);
    return NULL;
}

static double wait_tag(int tag, int timeout_ms) {
    double t0 = hkl_now_ms();
    while (atomic_load(&latest_tag) != tag && hkl_now_ms() - t0 < timeout_ms)
        usleep(200);
    ck_assert_msg(atomic_load(&latest_tag) == tag, "tag %d never ran (still %d)", tag,
                  atomic_load(&latest_tag));
    return hkl_now_ms() - t0;
}

static void check_buffer(void) {
    int *h = malloc(N * sizeof *h);
    CK_CUDA(cudaMemcpy(h, d_buf, N * sizeof *h, cudaMemcpyDeviceToHost));
    long l = atomic_load(&launches);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(h[i], 7 * i + (int)l);
    free(h);
}

START_TEST(watch_save_and_broken_save) {
    write_file("particles.cu", 1, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_watch_dir(rt, dir, NULL, &rep), 0);
    pthread_create(&launcher, NULL, launch_loop, NULL);
    launcher_started = 1;
    printf("  first version after %.1f ms\n", wait_tag(1, 20000));
    write_file("particles.cu", 2, 0);
    double ms = wait_tag(2, 20000);
    pthread_mutex_lock(&ev_lock);
    double b = last_build_ms, st = last_stage_ms, c = last_commit_ms;
    pthread_mutex_unlock(&ev_lock);
    printf("  rename-over save -> new version running in %.1f ms: detect (the event, the read) and "
           "first launch %.1f ms, compile %.1f ms, load %.2f ms, commit %.2f ms\n",
           ms, ms - b - st - c, b, st, c);
    write_file("particles.cu", 3, 1);
    double t0 = hkl_now_ms();
    for (;;) {
        pthread_mutex_lock(&ev_lock);
        int r = refused;
        pthread_mutex_unlock(&ev_lock);
        if (r || hkl_now_ms() - t0 > 20000)
            break;
        usleep(1000);
    }
    pthread_mutex_lock(&ev_lock);
    ck_assert_int_eq(refused, 1);
    printf("  broken save refused:\n%s\n", refused_log);
    ck_assert_msg(strstr(refused_log, "particles.cu") && strstr(refused_log, "error"),
                  "no compiler log: %s", refused_log);
    pthread_mutex_unlock(&ev_lock);
    long before = atomic_load(&launches);
    usleep(300000);
    ck_assert_int_eq(atomic_load(&latest_tag), 2); /* the old version runs on */
    ck_assert_int_gt(atomic_load(&launches), before);
}
END_TEST

static int run_cli(char *const argv[]) {
    pid_t p = fork();
    if (p == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(push_with_cli) {
    char keys[4096], pub[4200], key[4200], state[4096], url[64], file[4096];
    snprintf(keys, sizeof keys, "%s/keys", dir);
    snprintf(pub, sizeof pub, "%s/hotkern.pub", keys);
    snprintf(key, sizeof key, "%s/hotkern.key", keys);
    snprintf(state, sizeof state, "%s/state", dir);
    const char *cli = hkt_built_program("hotkern");
    char *kg[] = {(char *)cli, "keygen", "--out", keys, NULL};
    ck_assert_int_eq(run_cli(kg), 0);
    hk_endpoint_options eo;
    hk_endpoint_options_init(&eo);
    const char *trusted[] = {pub};
    eo.trusted_keys = trusted;
    eo.ntrusted_keys = 1;
    eo.state_dir = state;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_endpoint_start(rt, &eo, &ep, &rep), 0);
    snprintf(url, sizeof url, "http://127.0.0.1:%u", hk_endpoint_port(ep));
    char src[1024];
    kernel_source(src, sizeof src, 4, 0);
    snprintf(file, sizeof file, "%s/push4.cu", dir);
    ck_assert_int_eq(hkt_write_file(file, src), 0);
    char *push[] = {(char *)cli, "push", url, "--key", key, "--module", "particles", file, NULL};
    double t0 = hkl_now_ms();
    ck_assert_int_eq(run_cli(push), 0);
    printf("  hotkern push acknowledged in %.1f ms\n", hkl_now_ms() - t0);
    wait_tag(4, 5000);
    /* A push signed with another key is refused; version 4 runs on. */
    char keys2[4200], key2[4300];
    snprintf(keys2, sizeof keys2, "%s/keys2", dir);
    snprintf(key2, sizeof key2, "%s/hotkern.key", keys2);
    char *kg2[] = {(char *)cli, "keygen", "--out", keys2, NULL};
    ck_assert_int_eq(run_cli(kg2), 0);
    kernel_source(src, sizeof src, 5, 0);
    ck_assert_int_eq(hkt_write_file(file, src), 0);
    char *bad[] = {(char *)cli, "push", url, "--key", key2, "--module", "particles", file, NULL};
    ck_assert_int_eq(run_cli(bad), 1);
    usleep(200000);
    ck_assert_int_eq(atomic_load(&latest_tag), 4);
}
END_TEST

START_TEST(pull_from_nginx) {
    char www[4096], ntmp[4096], file[4096], key[4200], pub[4200], murl[128];
    snprintf(www, sizeof www, "%s/www", dir);
    snprintf(ntmp, sizeof ntmp, "%s/nginx", dir);
    snprintf(key, sizeof key, "%s/keys/hotkern.key", dir);
    snprintf(pub, sizeof pub, "%s/keys/hotkern.pub", dir);
    ck_assert_int_eq(mkdir(ntmp, 0700), 0);
    char src[1024];
    kernel_source(src, sizeof src, 6, 0);
    snprintf(file, sizeof file, "%s/pull6.cu", dir);
    ck_assert_int_eq(hkt_write_file(file, src), 0);
    const char *cli = hkt_built_program("hotkern");
    char *sign[] = {(char *)cli, "sign",           "--key", key, "--module", "particles",
                    "--release", "99000000000000", "--out", www, file,       NULL};
    ck_assert_int_eq(run_cli(sign), 0);
    pid_t ng;
    int port = hkt_nginx_start(www, ntmp, NULL, &ng);
    if (port < 0)
        return; /* SKIP printed */
    snprintf(murl, sizeof murl, "http://127.0.0.1:%d/manifest.json", port);
    hk_pull_options po;
    hk_pull_options_init(&po);
    po.url = murl;
    po.interval_ms = 200;
    const char *trusted[] = {pub};
    po.trusted_keys = trusted;
    po.ntrusted_keys = 1;
    po.state_dir = "";
    hk_puller *p;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_pull_start(rt, &po, &p, &rep), 0);
    printf("  pulled release running after %.1f ms\n", wait_tag(6, 20000));
    hk_pull_stats st = HK_PULL_STATS_INIT;
    hk_pull_stats_get(p, &st);
    ck_assert_uint_eq(st.applied, 1);
    hk_pull_stop(p);
    hkt_nginx_stop(ng);
}
END_TEST

START_TEST(buffer_kept_its_contents) {
    ck_assert(launcher_started);
    atomic_store(&stop, 1);
    pthread_join(launcher, NULL);
    launcher_started = 0;
    check_buffer();
    printf("  %ld launches, buffer exact\n", atomic_load(&launches));
}
END_TEST

int main(void) {
    if (!hkt_gpu_or_skip("gpu_sources"))
        return HKT_SKIP;
    dir = hkt_tmpdir();
    char cache[4200];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = cache;
    o.on_event = on_event;
    hk_report rep = HK_REPORT_INIT;
    if (hk_runtime_create(&rt, &o, &rep)) {
        printf("runtime: %s\n", rep.message);
        return 1;
    }
    cudaMalloc((void **)&d_buf, N * sizeof(int));
    cudaMalloc((void **)&d_tag, sizeof(int));
    int *h = malloc(N * sizeof *h);
    for (int i = 0; i < N; i++)
        h[i] = 7 * i;
    cudaMemcpy(d_buf, h, N * sizeof *h, cudaMemcpyHostToDevice);
    free(h);
    Suite *s = suite_create("sources (GPU)");
    TCase *tc = tcase_create("sources");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, watch_save_and_broken_save);
    tcase_add_test(tc, push_with_cli);
    tcase_add_test(tc, pull_from_nginx);
    tcase_add_test(tc, buffer_kept_its_contents);
    suite_add_tcase(s, tc);
    int rc = hkt_run(s);
    hk_endpoint_stop(ep);
    if (launcher_started) {
        atomic_store(&stop, 1);
        pthread_join(launcher, NULL);
    }
    hk_runtime_destroy(rt);
    hkt_rmtree(dir);
    return rc;
}

/*
 * GPU suite: a release published with `hotkern publish --build-for` runs
 * its shipped cubin on a device it was built for, and compiles nothing.
 *
 * The CLI publishes module "scale" (a CUDA C kernel and its header) with
 * --build-for sm_80,sm_90,sm_100 and module "other" with --build-for sm_80
 * only, into a temporary directory; each release is pushed (its manifest,
 * signature and every artifact, as one frame) to an endpoint of a runtime on
 * device 0. On a 9.0 device (the H200) "scale" must run the sm_90 cubin:
 * the metrics say shipped_cubin sm_90 and the compile cache saw no build;
 * "other" has no cubin for 9.x and is built here (one cache miss). Both
 * kernels then run and every element they wrote is checked. On a device of
 * another architecture the first check says which cubin, if any, the rule
 * picked for it (sm_80 for 8.6, say), and the rest is the same.
 *
 * SKIP without a device, the CLI or the canary helper. One process, no
 * fork of the test (CUDA does not survive fork); the CLI runs through
 * popen.
 */
#include <cuda_runtime_api.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hotkern/net.h"
#include "net/net.h"
#include "tests/gpu.h"
#include "tests/harness.h"
#include "tests/release_post.h"

#define N 1000

static const char source[] = "#include \"scale.cuh\"\n"
                             "extern \"C\" __global__ void step(int *out, unsigned n) {\n"
                             "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                             "    if (i < n) out[i] = SCALE * (int)i + 7;\n"
                             "}\n";

static void cli(const char *dir, const char *args) {
    char cmd[2 * PATH_MAX + 512], out[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s 2>&1", dir, hkt_built_program("hotkern"), args);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "hotkern %s: %s", args, out);
}

static void write_in(const char *dir, const char *name, const char *text) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ck_assert_int_eq(hkt_write_file(path, text), 0);
}

static uint64_t misses(hk_runtime *rt) {
    hk_stats s = HK_STATS_INIT;
    ck_assert_int_eq(hk_stats_get(rt, &s), 0);
    return s.cache_misses;
}

/* Launches module's step over N ints and checks every one. */
static void run_step(hk_runtime *rt, const char *module, int scale, int *d_out) {
    hk_kernel *k;
    int host[N];
    unsigned n = N;
    ck_assert_int_eq(hk_kernel_get(rt, module, "step", &k), 0);
    CK_CUDA(cudaMemset(d_out, 0xff, N * sizeof(int)));
    void *args[] = {&d_out, &n};
    int cu = 0;
    ck_assert_int_eq(
        hk_launch(k, (hk_dim3){(N + 255) / 256, 1, 1}, (hk_dim3){256, 1, 1}, 0, NULL, args, &cu),
        0);
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaMemcpy(host, d_out, sizeof host, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++)
        ck_assert_msg(host[i] == scale * i + 7, "%s: out[%d] = %d, expected %d", module, i, host[i],
                      scale * i + 7);
}

START_TEST(device_runs_the_shipped_cubin) {
    char *tmp = strdup(hkt_tmpdir()), pub[PATH_MAX], cache[PATH_MAX], state[PATH_MAX],
         www[PATH_MAX];
    snprintf(pub, sizeof pub, "%s/k/hotkern.pub", tmp);
    snprintf(cache, sizeof cache, "%s/cache", tmp);
    snprintf(state, sizeof state, "%s/state", tmp);
    write_in(tmp, "scale.cu", source);
    write_in(tmp, "scale.cuh", "#define SCALE 3\n");
    write_in(tmp, "other.cu", source);
    cli(tmp, "keygen --out k");
    cli(tmp, "publish --key k/hotkern.key --module scale --release 1 "
             "--build-for sm_80,sm_90,sm_100 --out www-scale scale.cu scale.cuh");
    cli(tmp, "publish --key k/hotkern.key --module other --release 1 --build-for sm_80 "
             "--out www-other other.cu scale.cuh");

    CK_CUDA(cudaSetDevice(0));
    int *d_out;
    CK_CUDA(cudaMalloc((void **)&d_out, N * sizeof(int)));
    hk_options o;
    hk_options_init(&o);
    o.cache_dir = cache;
    o.no_warm_start = 1;
    o.canary_helper = hkt_built_program("hotkern-canary");
    hk_runtime *rt;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_runtime_create(&rt, &o, &rep) == 0, "%s", rep.message);
    char device[16], expect[16] = "";
    snprintf(device, sizeof device, "sm_%d", hk_runtime_arch(rt));
    const char *shipped[] = {"sm_80", "sm_90", "sm_100"};
    for (int i = 0; i < 3; i++) /* the highest that runs here, by CUDA's rule */
        if (hkn_arch_runs_on(shipped[i], device))
            snprintf(expect, sizeof expect, "%s", shipped[i]);
    printf("device %s: the rule picks %s\n", device, expect[0] ? expect : "no cubin (a build)");

    const char *keys[] = {pub};
    hk_endpoint_options eo;
    hk_endpoint_options_init(&eo);
    eo.trusted_keys = keys;
    eo.ntrusted_keys = 1;
    eo.state_dir = state;
    hk_endpoint *ep;
    ck_assert_msg(hk_endpoint_start(rt, &eo, &ep, &rep) == 0, "%s", rep.message);
    char *body = NULL;
    snprintf(www, sizeof www, "%s/www-scale", tmp);
    long status = hkt_post_release(hk_endpoint_port(ep), www, &body);
    ck_assert_msg(status == 200 && strstr(body, "\"committed\""), "%ld: %s", status, body);
    printf("scale: %s\n", body);
    free(body);
    char *text;
    char label[96];
    ck_assert_int_eq(hk_metrics_text_alloc(rt, &text, NULL), 0);
    if (expect[0]) {
        snprintf(label, sizeof label, "module=\"scale\",image=\"shipped_cubin\",arch=\"%s\"",
                 expect);
        ck_assert_msg(hkt_sample(text, "hotkern_release_image_info", label) == 1, "%s", text);
        ck_assert_uint_eq(misses(rt), 0); /* nothing compiled on this host */
    } else {
        ck_assert_msg(hkt_sample(text, "hotkern_release_image_info",
                                 "module=\"scale\",image=\"local_build\"") == 1,
                      "%s", text);
        ck_assert_uint_eq(misses(rt), 1);
    }
    free(text);
    run_step(rt, "scale", 3, d_out);

    uint64_t before = misses(rt);
    snprintf(www, sizeof www, "%s/www-other", tmp);
    status = hkt_post_release(hk_endpoint_port(ep), www, &body);
    ck_assert_msg(status == 200 && strstr(body, "\"committed\""), "%ld: %s", status, body);
    free(body);
    ck_assert_int_eq(hk_metrics_text_alloc(rt, &text, NULL), 0);
    int other_shipped = hkn_arch_runs_on("sm_80", device);
    ck_assert_msg(hkt_sample(text, "hotkern_release_image_info",
                             other_shipped ? "module=\"other\",image=\"shipped_cubin\""
                                           : "module=\"other\",image=\"local_build\"") == 1,
                  "%s", text);
    ck_assert_uint_eq(misses(rt), before + (other_shipped ? 0 : 1));
    free(text);
    run_step(rt, "other", 3, d_out);

    hk_endpoint_stop(ep);
    hk_runtime_destroy(rt);
    CK_CUDA(cudaFree(d_out));
    hk_report_clear(&rep);
    hkt_rmtree(tmp);
    free(tmp);
}
END_TEST

int main(void) {
    if (!hkt_gpu_or_skip("gpu_buildfor"))
        return HKT_SKIP;
    const char *need[] = {"hotkern", "hotkern-canary"};
    for (int i = 0; i < 2; i++)
        if (access(hkt_built_program(need[i]), X_OK) != 0) {
            printf("SKIP gpu_buildfor: no %s at %s\n", need[i], hkt_built_program(need[i]));
            return HKT_SKIP;
        }
    Suite *s = suite_create("shipped cubins (GPU)");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, device_runs_the_shipped_cubin);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

/*
 * `hotkern publish --build-for`: cubins built once by the publisher, loaded
 * by the hosts whose device runs them (net/shipped.c, cli/buildfor.c).
 *
 * Each test publishes a release of one CUDA C kernel and its header with the
 * CLI, --build-for sm_80,sm_90,sm_100 (real NVRTC and nvJitLink, no GPU),
 * into a directory that Debian's nginx, started by the test, serves. Hosts
 * are runtimes on the fake driver (tests/fakecuda.c) reporting a compute
 * capability, each pulling with hk_pull_start as a program would. Whether a
 * host compiled is read from its compile cache's miss counter (every CUDA C
 * build looks the cache up and misses it the first time; a cubin passes by
 * it), and what it runs from the puller's metrics and logs.
 */
#include <check.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hotkern/net.h"
#include "loader/port.h"
#include "net/net.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"
#include "tests/release_post.h"

static char *tmp;
static char www[1024], url[512], pub[1024];
static pid_t nginx;
static int port;

static const char kernel[] = "#include \"scale.cuh\"\n"
                             "extern \"C\" __global__ void step(int *out, unsigned n) {\n"
                             "    if (threadIdx.x == 0 && blockIdx.x == 0) *out = SCALE * 7;\n"
                             "}\n";

static void write_in(const char *dir, const char *name, const char *text) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ck_assert_int_eq(hkt_write_file(path, text), 0);
}

static void setup(void) {
    tmp = hkt_tmpdir();
    snprintf(www, sizeof www, "%s/www", tmp);
    snprintf(pub, sizeof pub, "%s/k/hotkern.pub", tmp);
    write_in(tmp, "p.cu", kernel);
    write_in(tmp, "scale.cuh", "#define SCALE 6\n");
    hkt_run_cli(tmp, "keygen --out k");
    hkt_run_cli(tmp, "publish --key k/hotkern.key --module add --release 1 "
                     "--build-for sm_80,sm_90,sm_100 --out www p.cu scale.cuh");
    port = hkt_nginx_start(tmp, tmp, NULL, &nginx);
    ck_assert_msg(port > 0, "nginx did not start");
    snprintf(url, sizeof url, "http://127.0.0.1:%d/www/manifest.json", port);
}

static void teardown(void) {
    hkt_nginx_stop(nginx);
    hkt_rmtree(tmp);
    free(tmp);
}

/* The published manifest, parsed. */
static void read_manifest(const char *dir, hkn_manifest *m, char **text, size_t *len) {
    char path[PATH_MAX];
    hk_report rep = HK_REPORT_INIT;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    ck_assert_int_eq(hku_read_file(path, 1 << 20, text, len, &rep), 0);
    ck_assert_msg(hkn_manifest_parse(*text, *len, m, &rep) == 0, "%s", rep.message);
}

static const hkn_artifact *named(const hkn_manifest *m, const char *name) {
    for (size_t i = 0; i < m->nartifacts; i++)
        if (!strcmp(m->artifacts[i].name, name))
            return &m->artifacts[i];
    return NULL;
}

/* ---- a host ------------------------------------------------------------ */

typedef struct host {
    hk_runtime *rt;
    hk_puller *p;
    hk_pull_stats st;
    char *metrics; /* the runtime's text once the poll is done */
    pthread_mutex_t lock;
    char log[16384]; /* lock: every line logged */
} host;

static void on_log(hk_log_level level, const char *subsystem, const char *message, void *ud) {
    host *h = ud;
    pthread_mutex_lock(&h->lock);
    size_t n = strlen(h->log);
    snprintf(h->log + n, sizeof h->log - n, "%s: %s\n", subsystem, message);
    pthread_mutex_unlock(&h->lock);
}

/* A runtime on a fake device of `arch` with a compile cache of its own. */
static void host_create(host *h, int arch, const char *name) {
    char cache[PATH_MAX];
    memset(h, 0, sizeof *h);
    pthread_mutex_init(&h->lock, NULL);
    snprintf(cache, sizeof cache, "%s/cache-%s", tmp, name);
    fake_init(1, arch);
    hk_options ho;
    hk_options_init(&ho);
    ho.cache_dir = cache;
    ho.no_warm_start = 1;
    ho.log = on_log;
    ho.log_userdata = h;
    ho.log_min_level = HK_LOG_DEBUG;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hkl_runtime_create_with(&h->rt, &ho, fake_driver(), &rep) == 0, "%s",
                  rep.message);
    hk_report_clear(&rep);
}

/* Starts pulling `u` (swap template tpl, may be NULL) and waits for the
 * first poll to end: it verifies, fetches and applies in one go. */
static void host_pull(host *h, const char *u, const char *name, const hk_swap_options *tpl) {
    char state[PATH_MAX];
    const char *keys[] = {pub};
    snprintf(state, sizeof state, "%s/state-%s", tmp, name);
    hk_pull_options po;
    hk_pull_options_init(&po);
    po.url = u;
    po.interval_ms = 60000;
    po.trusted_keys = keys;
    po.ntrusted_keys = 1;
    po.state_dir = state;
    po.host_id = name;
    po.swap = tpl;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_pull_start(h->rt, &po, &h->p, &rep) == 0, "%s", rep.message);
    hk_report_clear(&rep);
    hk_pull_stats init = HK_PULL_STATS_INIT;
    h->st = init;
    for (int i = 0; i < 3000 && h->st.polls < 1; i++) {
        ck_assert_int_eq(hk_pull_stats_get(h->p, &h->st), 0);
        if (h->st.polls < 1)
            usleep(10000);
    }
    ck_assert_msg(h->st.polls >= 1, "the first poll did not end within 30 s");
    ck_assert_int_eq(hk_metrics_text_alloc(h->rt, &h->metrics, NULL), 0);
}

static void host_destroy(host *h) {
    hk_pull_stop(h->p);
    hk_runtime_destroy(h->rt);
    free(h->metrics);
    pthread_mutex_destroy(&h->lock);
}

static uint64_t cache_misses(host *h) {
    hk_stats s = HK_STATS_INIT;
    ck_assert_int_eq(hk_stats_get(h->rt, &s), 0);
    return s.cache_misses;
}

static int logged(host *h, const char *what) {
    pthread_mutex_lock(&h->lock);
    int found = strstr(h->log, what) != NULL;
    pthread_mutex_unlock(&h->lock);
    return found;
}

static long long image(const host *h, const char *label) {
    return hkt_sample(h->metrics, "hotkern_release_image_info", label);
}

/* What a host of `arch` pulling the release ran: the shipped cubin of
 * `cubin` ("sm_90"), or with cubin NULL a build of the source. */
static void expect_host(int arch, const char *cubin) {
    host h;
    char name[32], label[128];
    snprintf(name, sizeof name, "host-%d", arch);
    host_create(&h, arch, name);
    host_pull(&h, url, name, NULL);
    ck_assert_msg(h.st.applied == 1, "%s: %s", name, h.st.last_message);
    ck_assert_uint_gt(hk_module_version(h.rt, "add"), 0);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(h.rt, "add", "step", &k), 0);
    if (cubin) {
        snprintf(label, sizeof label, "module=\"add\",image=\"shipped_cubin\",arch=\"%s\"", cubin);
        ck_assert_msg(image(&h, label) == 1, "%s", h.metrics);
        ck_assert_uint_eq(cache_misses(&h), 0); /* NVRTC never ran */
        char line[128];
        snprintf(line, sizeof line, "runs the shipped %s cubin 'p.%s.cubin' (nvrtc ", cubin, cubin);
        ck_assert_msg(logged(&h, line), "%s", h.log);
    } else {
        ck_assert_msg(image(&h, "image=\"local_build\",arch=\"\"") == 1, "%s", h.metrics);
        ck_assert_uint_eq(cache_misses(&h), 1); /* p.cu, built here */
        ck_assert(!logged(&h, "runs the shipped"));
    }
    ck_assert_int_eq(hkt_sample(h.metrics, "hotkern_release_cubin_fallbacks_total", "add"), 0);
    host_destroy(&h);
}

/* ---- the tests --------------------------------------------------------- */

/* CUDA's rule for machine code: the same major, a minor at most the
 * device's; arch-specific code on its own arch only. */
START_TEST(arch_rule) {
    ck_assert(hkn_arch_runs_on("sm_90", "sm_90"));
    ck_assert(hkn_arch_runs_on("sm_80", "sm_86"));
    ck_assert(hkn_arch_runs_on("sm_80", "sm_89"));
    ck_assert(hkn_arch_runs_on("sm_100", "sm_103"));
    ck_assert(!hkn_arch_runs_on("sm_86", "sm_80"));
    ck_assert(!hkn_arch_runs_on("sm_80", "sm_90"));
    ck_assert(!hkn_arch_runs_on("sm_90", "sm_100"));
    ck_assert(!hkn_arch_runs_on("sm_100", "sm_120"));
    ck_assert(hkn_arch_runs_on("sm_90a", "sm_90"));
    ck_assert(!hkn_arch_runs_on("sm_100a", "sm_103"));
    ck_assert(!hkn_arch_runs_on("sm_100f", "sm_103"));
    ck_assert(!hkn_arch_runs_on("", "sm_90"));
    ck_assert(!hkn_arch_runs_on("compute_90", "sm_90"));
    ck_assert(!hkn_arch_runs_on("sm_9x", "sm_90"));
    hkn_manifest m;
    char *text;
    size_t len;
    read_manifest(www, &m, &text, &len);
    const struct {
        const char *device, *pick;
    } cases[] = {{"sm_90", "p.sm_90.cubin"},
                 {"sm_86", "p.sm_80.cubin"},
                 {"sm_80", "p.sm_80.cubin"},
                 {"sm_103", "p.sm_100.cubin"},
                 {"sm_120", "p.cu"},
                 {"sm_75", "p.cu"},
                 {NULL, "p.cu"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_str_eq(m.artifacts[hkn_pick_artifact(&m, cases[i].device)].name, cases[i].pick);
    /* An engine whose own build options differ builds the source. */
    hkn_engine e = {.arch = "sm_90", .no_shipped = "options"};
    size_t fallback;
    ck_assert_str_eq(m.artifacts[hkn_shipped_pick(&m, &e, &fallback)].name, "p.cu");
    e.no_shipped = NULL;
    ck_assert_str_eq(m.artifacts[hkn_shipped_pick(&m, &e, &fallback)].name, "p.sm_90.cubin");
    ck_assert_str_eq(m.artifacts[fallback].name, "p.cu");
    /* A 12.0 host fetches the source and its header only. */
    int need[HKN_MAX_ARTIFACTS];
    e.arch = "sm_120";
    hkn_shipped_needed(&m, &e, need);
    for (size_t i = 0; i < m.nartifacts; i++)
        ck_assert_int_eq(need[i], !strcmp(m.artifacts[i].name, "p.cu") ||
                                      !strcmp(m.artifacts[i].name, "scale.cuh"));
    hkn_manifest_free(&m);
    free(text);
}
END_TEST

/* Each cubin is in the signed manifest with its arch, hash, source and
 * toolkit; changing what it says breaks the signature; a manifest whose
 * built cubin names no source of the release is refused. */
START_TEST(manifest_lists_signed_cubins) {
    hkn_manifest m;
    char *text, *sig, path[PATH_MAX];
    size_t len, slen;
    hk_report rep = HK_REPORT_INIT;
    read_manifest(www, &m, &text, &len);
    ck_assert_uint_eq(m.nartifacts, 5);
    const char *archs[] = {"sm_80", "sm_90", "sm_100"};
    for (int i = 0; i < 3; i++) {
        char name[64], file[PATH_MAX], *bytes;
        size_t n;
        snprintf(name, sizeof name, "p.%s.cubin", archs[i]);
        const hkn_artifact *a = named(&m, name);
        ck_assert_ptr_nonnull(a);
        ck_assert_int_eq(a->format, HK_FORMAT_CUBIN);
        ck_assert_str_eq(a->arch, archs[i]);
        ck_assert_str_eq(a->source, "p.cu");
        ck_assert_msg(!strncmp(a->toolkit, "nvrtc 1", 7), "toolkit '%s'", a->toolkit);
        snprintf(file, sizeof file, "%s/artifacts/%s", www, a->sha256);
        ck_assert_int_eq(hku_read_file(file, 1 << 24, &bytes, &n, &rep), 0);
        ck_assert_int_eq(hkn_verify_artifact(a, bytes, n, &rep), 0);
        /* An ELF of machine code, not the source. */
        ck_assert(n > 4 && !memcmp(bytes, "\177ELF", 4));
        free(bytes);
    }
    ck_assert_str_eq(named(&m, "p.cu")->source, "");
    snprintf(path, sizeof path, "%s/manifest.json.sig", www);
    ck_assert_int_eq(hku_read_file(path, 4096, &sig, &slen, &rep), 0);
    hkn_trust t = {.nkeys = 1};
    ck_assert_int_eq(hkn_pubkey_load(pub, &t.keys[0], &rep), 0);
    hkn_manifest v;
    ck_assert_msg(hkn_verify_manifest(&t, NULL, text, len, sig, slen, time(NULL), &v, &rep) == 0,
                  "%s", rep.message);
    hkn_manifest_free(&v);
    char *edit = strstr(text, "\"sm_90\"");
    ck_assert_ptr_nonnull(edit);
    edit[5] = '8'; /* the sm_90 cubin relabelled sm_80 */
    ck_assert_int_eq(hkn_verify_manifest(&t, NULL, text, len, sig, slen, time(NULL), &v, &rep),
                     HK_ERR_SIGNATURE);
    edit[5] = '9';
    char *src = strstr(text, "\"source\":\t\"p.cu\"");
    ck_assert_ptr_nonnull(src);
    memcpy(src + 11, "q.cu", 4);
    ck_assert_int_eq(hkn_manifest_parse(text, len, &v, &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "is built from 'q.cu'"), "%s", rep.message);
    free(sig);
    free(text);
    hkn_manifest_free(&m);
    hk_report_clear(&rep);
}
END_TEST

/* A 9.0 host loads the sm_90 cubin and compiles nothing; an 8.6 host the
 * sm_80 one (same major, lower minor); a 12.0 host builds the source. */
START_TEST(host_90_runs_the_shipped_cubin) {
    expect_host(90, "sm_90");
}
END_TEST

START_TEST(host_86_runs_the_sm_80_cubin) {
    expect_host(86, "sm_80");
}
END_TEST

START_TEST(host_120_builds_the_source) {
    expect_host(120, NULL);
}
END_TEST

/* The sm_90 cubin changed on the origin: the 9.0 host refuses the release
 * (hash), applies nothing, counts the refusal; a 12.0 host never fetches
 * that cubin and builds the source. */
START_TEST(tampered_cubin_is_refused) {
    hkn_manifest m;
    char *text, path[PATH_MAX], *bytes;
    size_t len, n;
    hk_report rep = HK_REPORT_INIT;
    read_manifest(www, &m, &text, &len);
    snprintf(path, sizeof path, "%s/artifacts/%s", www, named(&m, "p.sm_90.cubin")->sha256);
    ck_assert_int_eq(hku_read_file(path, 1 << 24, &bytes, &n, &rep), 0);
    bytes[n / 2] ^= 0x5a; /* same size, other bytes */
    ck_assert_int_eq(hku_write_atomic(path, bytes, n, 0644, &rep), 0);
    free(bytes);
    host h;
    host_create(&h, 90, "tampered-90");
    host_pull(&h, url, "tampered-90", NULL);
    ck_assert_uint_eq(h.st.applied, 0);
    ck_assert_uint_ge(h.st.refused, 1);
    ck_assert_int_eq(h.st.last_error, HK_ERR_HASH);
    ck_assert_msg(strstr(h.st.last_message, "p.sm_90.cubin"), "%s", h.st.last_message);
    ck_assert_uint_eq(hk_module_version(h.rt, "add"), 0);
    ck_assert_int_eq(fake_live_images(), 0);
    ck_assert_int_eq(hkt_sample(h.metrics, "hotkern_rollout_refusals_total", "reason=\"hash\""), 1);
    ck_assert_int_eq(image(&h, "module=\"add\""), -1);
    host_destroy(&h);
    host o;
    host_create(&o, 120, "tampered-120");
    host_pull(&o, url, "tampered-120", NULL);
    ck_assert_msg(o.st.applied == 1, "%s", o.st.last_message);
    host_destroy(&o);
    hkn_manifest_free(&m);
    free(text);
    hk_report_clear(&rep);
}
END_TEST

/* A shipped cubin the driver will not load (no code for the device; a
 * driver older than the toolkit) is not the end: the host builds the
 * source, says so in its log, and counts it. */
START_TEST(cubin_that_does_not_load_falls_back_to_a_build) {
    const CUresult errs[] = {CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_UNSUPPORTED_PTX_VERSION};
    for (int i = 0; i < 2; i++) {
        host h;
        char name[32];
        snprintf(name, sizeof name, "fallback-%d", i);
        host_create(&h, 90, name);
        fake_fail("cuLibraryLoadData", 1, errs[i]);
        host_pull(&h, url, name, NULL);
        ck_assert_msg(h.st.applied == 1, "%s", h.st.last_message);
        ck_assert_uint_eq(cache_misses(&h), 1);
        ck_assert_msg(image(&h, "image=\"local_build\"") == 1, "%s", h.metrics);
        ck_assert_int_eq(
            hkt_sample(h.metrics, "hotkern_release_cubin_fallbacks_total", "module=\"add\""), 1);
        ck_assert_msg(logged(&h, "the shipped sm_90 cubin 'p.sm_90.cubin' (nvrtc "), "%s", h.log);
        ck_assert_msg(logged(&h, "did not load here") && logged(&h, "building 'p.cu' instead"),
                      "%s", h.log);
        ck_assert_msg(
            logged(&h, i ? "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" : "CUDA_ERROR_NO_BINARY_FOR_GPU"),
            "%s", h.log);
        host_destroy(&h);
    }
}
END_TEST

/* A host whose swap template adds NVRTC options builds the source: the
 * shipped cubin was built without them. */
START_TEST(host_build_options_keep_the_source) {
    const char *opts[] = {"-DEXTRA=1"};
    hk_swap_options tpl;
    hk_swap_options_init(&tpl);
    tpl.nvrtc_options = opts;
    tpl.nnvrtc_options = 1;
    host h;
    host_create(&h, 90, "options-90");
    host_pull(&h, url, "options-90", &tpl);
    ck_assert_msg(h.st.applied == 1, "%s", h.st.last_message);
    ck_assert_uint_eq(cache_misses(&h), 1);
    ck_assert_msg(image(&h, "image=\"local_build\"") == 1, "%s", h.metrics);
    ck_assert_msg(logged(&h, "not the shipped sm_90 cubin"), "%s", h.log);
    host_destroy(&h);
}
END_TEST

/* The push endpoint takes the same release (all its artifacts in one
 * frame) and loads the cubin too. */
START_TEST(endpoint_runs_the_shipped_cubin) {
    host h;
    host_create(&h, 90, "endpoint-90");
    char state[PATH_MAX];
    const char *keys[] = {pub};
    snprintf(state, sizeof state, "%s/state-endpoint", tmp);
    hk_endpoint_options eo;
    hk_endpoint_options_init(&eo);
    eo.trusted_keys = keys;
    eo.ntrusted_keys = 1;
    eo.state_dir = state;
    hk_endpoint *ep;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_endpoint_start(h.rt, &eo, &ep, &rep) == 0, "%s", rep.message);
    char *body = NULL;
    long status = hkt_post_release(hk_endpoint_port(ep), www, &body);
    ck_assert_msg(status == 200, "%ld: %s", status, body ? body : "");
    ck_assert_msg(strstr(body, "\"committed\""), "%s", body);
    free(body);
    ck_assert_uint_eq(cache_misses(&h), 0);
    char *text;
    ck_assert_int_eq(hk_metrics_text_alloc(h.rt, &text, NULL), 0);
    ck_assert_msg(hkt_sample(text, "hotkern_release_image_info",
                             "image=\"shipped_cubin\",arch=\"sm_90\"") == 1,
                  "%s", text);
    free(text);
    hk_endpoint_stop(ep);
    host_destroy(&h);
    hk_report_clear(&rep);
}
END_TEST

/* Runs `hotkern ARGS` in tmp: the exit status, the output in out. */
static int cli(char *out, size_t cap, const char *args) {
    char cmd[PATH_MAX * 2 + 1024];
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 60 '%s' %s 2>&1", tmp,
             hkt_built_program("hotkern"), args);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* An architecture that does not build refuses the whole publish with the
 * compiler's log, and nothing is written; a usage error for an
 * architecture NVRTC does not know, or a release without CUDA C. */
START_TEST(failing_arch_refuses_the_publish) {
    char out[8192], path[PATH_MAX];
    struct stat sb;
    write_in(tmp, "new.cu",
             "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900\n"
             "#error this kernel needs sm_90\n"
             "#endif\n"
             "extern \"C\" __global__ void step(int *out, unsigned n) { *out = 1; }\n");
    ck_assert_int_eq(cli(out, sizeof out,
                         "publish --key k/hotkern.key --module add --release 2 "
                         "--build-for sm_90,sm_80 --out www2 new.cu"),
                     1);
    ck_assert_msg(strstr(out, "--build-for sm_80: new.cu does not build"), "%s", out);
    ck_assert_msg(strstr(out, "this kernel needs sm_90"), "%s", out); /* the log */
    ck_assert_msg(strstr(out, "nothing published"), "%s", out);
    snprintf(path, sizeof path, "%s/www2", tmp);
    ck_assert_int_ne(stat(path, &sb), 0);
    ck_assert_int_eq(cli(out, sizeof out,
                         "publish --key k/hotkern.key --module add --release 2 "
                         "--build-for sm_90,sm_99 --out www2 new.cu"),
                     2);
    ck_assert_msg(strstr(out, "does not compile for sm_99"), "%s", out);
    ck_assert_int_eq(cli(out, sizeof out,
                         "publish --key k/hotkern.key --module add --release 2 "
                         "--build-for sm_90,sm_90 --out www2 new.cu"),
                     2);
    ck_assert_int_eq(cli(out, sizeof out,
                         "publish --key k/hotkern.key --module add --release 2 "
                         "--build-for sm_90 --out www2 scale.cuh"),
                     2);
    ck_assert_int_ne(stat(path, &sb), 0);
    /* The same through rollout start: refused before anything is written. */
    ck_assert_int_eq(cli(out, sizeof out,
                         "rollout start --dir www2 --key k/hotkern.key --module add --steps 100 "
                         "--build-for sm_80 new.cu"),
                     1);
    ck_assert_msg(strstr(out, "this kernel needs sm_90"), "%s", out);
    snprintf(path, sizeof path, "%s/www2/manifest.json", tmp);
    ck_assert_int_ne(stat(path, &sb), 0);
}
END_TEST

/* rollout start --build-for ships the cubins in the rollout's manifest,
 * and a 9.0 host of the step loads its cubin. */
START_TEST(rollout_start_ships_cubins) {
    char dir[1024], u[600];
    hkt_run_cli(tmp, "rollout start --dir www3 --key k/hotkern.key --module add --steps 100 "
                     "--build-for sm_90 p.cu scale.cuh");
    snprintf(dir, sizeof dir, "%s/www3", tmp);
    hkn_manifest m;
    char *text;
    size_t len;
    read_manifest(dir, &m, &text, &len);
    ck_assert(m.rollout.present);
    const hkn_artifact *a = named(&m, "p.sm_90.cubin");
    ck_assert_ptr_nonnull(a);
    ck_assert_str_eq(a->source, "p.cu");
    hkn_manifest_free(&m);
    free(text);
    snprintf(u, sizeof u, "http://127.0.0.1:%d/www3/manifest.json", port);
    host h;
    host_create(&h, 90, "rollout-90");
    host_pull(&h, u, "rollout-90", NULL);
    ck_assert_msg(h.st.applied == 1, "%s", h.st.last_message);
    ck_assert_uint_eq(cache_misses(&h), 0);
    ck_assert_msg(image(&h, "image=\"shipped_cubin\",arch=\"sm_90\"") == 1, "%s", h.metrics);
    host_destroy(&h);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("buildfor");
    TCase *tc = tcase_create("buildfor");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, arch_rule);
    tcase_add_test(tc, manifest_lists_signed_cubins);
    tcase_add_test(tc, host_90_runs_the_shipped_cubin);
    tcase_add_test(tc, host_86_runs_the_sm_80_cubin);
    tcase_add_test(tc, host_120_builds_the_source);
    tcase_add_test(tc, tampered_cubin_is_refused);
    tcase_add_test(tc, cubin_that_does_not_load_falls_back_to_a_build);
    tcase_add_test(tc, host_build_options_keep_the_source);
    tcase_add_test(tc, endpoint_runs_the_shipped_cubin);
    tcase_add_test(tc, failing_arch_refuses_the_publish);
    tcase_add_test(tc, rollout_start_ships_cubins);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

/*
 * The network sources and the engine together, on the fake driver: a
 * runtime with an endpoint (libmicrohttpd, driven with libcurl and the
 * built CLI) and a puller polling Debian's nginx, both applying to it
 * through the public API (hk_endpoint_start, hk_pull_start). What the
 * kernel runs is read back by launching it: the fake stores each image's
 * tag, so the tests see which release the engine really runs, beside what
 * /v1/status says.
 */
#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <sodium.h>

#include "hotkern/net.h"
#include "loader/core.h"
#include "net/net.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

static hk_runtime *rt;
static char *tmp;
static hkn_seckey key;
static char pub_path[PATH_MAX], key_path[PATH_MAX], state[PATH_MAX], www[PATH_MAX];

static void setup(void) {
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.no_warm_start = 1;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep) == 0, "%s", rep.message);
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    ck_assert_int_eq(hkn_keygen(&key), 0);
    snprintf(pub_path, sizeof pub_path, "%s/hotkern.pub", tmp);
    snprintf(key_path, sizeof key_path, "%s/hotkern.key", tmp);
    snprintf(state, sizeof state, "%s/state", tmp);
    snprintf(www, sizeof www, "%s/www", tmp);
    ck_assert_int_eq(hkn_pubkey_save(pub_path, &key.pub, &rep), 0);
    ck_assert_int_eq(hkn_seckey_save(key_path, &key, &rep), 0);
    char dir[PATH_MAX + 32];
    ck_assert_int_eq(mkdir(www, 0755), 0);
    snprintf(dir, sizeof dir, "%s/rel", www);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    snprintf(dir, sizeof dir, "%s/rel/artifacts", www);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
}

static void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
    hkt_rmtree(tmp);
    free(tmp);
}

/* ---- helpers ----------------------------------------------------------- */

/* The tag the current version of module m stores (-1 when none). */
static int running_tag(const char *m) {
    hk_kernel *k;
    if (hk_kernel_get(rt, m, "step", &k) != 0)
        return -1;
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    int cu = 0;
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu), 0);
    return out;
}

struct resp {
    char *data;
    size_t len;
};

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    struct resp *r = ud;
    char *nd = realloc(r->data, r->len + size * n + 1);
    if (!nd)
        return 0;
    r->data = nd;
    memcpy(r->data + r->len, p, size * n);
    r->len += size * n;
    r->data[r->len] = '\0';
    return size * n;
}

static char bearer[64]; /* when set, every request sends this token */

/* One request with libcurl; returns the status, the body in *body (the
 * caller frees it; may be NULL). */
static long http(unsigned port, const char *method, const char *path, const char *data,
                 char **body) {
    char url[256];
    struct resp r = {calloc(1, 1), 0};
    struct curl_slist *h = NULL;
    long status = 0;
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    if (bearer[0]) {
        char auth[128];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer);
        h = curl_slist_append(h, auth);
    }
    if (data) {
        h = curl_slist_append(h, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, data);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    CURLcode rc = curl_easy_perform(c);
    ck_assert_msg(rc == CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    if (body)
        *body = r.data;
    else
        free(r.data);
    return status;
}

/* Signs release `version` of module "m" whose kernel stores `tag`. */
static void sign(uint64_t version, int tag, char **manifest, size_t *len, char **sig,
                 const char **ptx) {
    *ptx = fake_ptx(tag, 0, 0, 0);
    hkn_blob b = {.name = "m.ptx", .bytes = *ptx, .size = strlen(*ptx)};
    hk_report rep = HK_REPORT_INIT;
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(
        hkn_release_sign(&key, "m", version, now, now + 600, &b, 1, manifest, len, sig, &rep), 0);
}

/* Pushes release `version` (tag `tag`) to the endpoint; the HTTP status. */
static long push(unsigned port, uint64_t version, int tag) {
    char *manifest, *sig, hex[65];
    const char *ptx;
    size_t len;
    sign(version, tag, &manifest, &len, &sig, &ptx);
    hkn_sha256_hex(ptx, strlen(ptx), hex);
    size_t cap = strlen(ptx) * 2 + 8;
    char *b64 = malloc(cap);
    sodium_bin2base64(b64, cap, (const unsigned char *)ptx, strlen(ptx),
                      sodium_base64_VARIANT_ORIGINAL);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "manifest", manifest);
    cJSON_AddStringToObject(o, "signature", sig);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "artifacts"), hex, b64);
    char *text = cJSON_PrintUnformatted(o);
    long code = http(port, "POST", "/v1/release", text, NULL);
    cJSON_Delete(o);
    free(text);
    free(b64);
    free(manifest);
    free(sig);
    return code;
}

/* Publishes release `version` (tag `tag`) under www/rel for the puller. */
static void publish(uint64_t version, int tag) {
    char *manifest, *sig, hex[65], path[PATH_MAX + 128];
    const char *ptx;
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    sign(version, tag, &manifest, &len, &sig, &ptx);
    hkn_sha256_hex(ptx, strlen(ptx), hex);
    snprintf(path, sizeof path, "%s/rel/artifacts/%s", www, hex);
    ck_assert_int_eq(hku_write_atomic(path, ptx, strlen(ptx), 0644, &rep), 0);
    snprintf(path, sizeof path, "%s/rel/manifest.json.sig", www);
    ck_assert_int_eq(hku_write_atomic(path, sig, strlen(sig), 0644, &rep), 0);
    snprintf(path, sizeof path, "%s/rel/manifest.json", www);
    ck_assert_int_eq(hku_write_atomic(path, manifest, len, 0644, &rep), 0);
    free(manifest);
    free(sig);
}

/* Runs the built CLI with args (under `timeout 30`), output into out; the
 * exit status. */
static int cli(char *out, size_t cap, const char *args) {
    char cmd[3 * PATH_MAX + 64], log[PATH_MAX + 16];
    snprintf(log, sizeof log, "%s/cli.txt", tmp);
    snprintf(cmd, sizeof cmd, "timeout 30 '%s' %s > '%s' 2>&1", hkt_built_program("hotkern"), args,
             log);
    int st = system(cmd);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = '\0';
    if (f)
        fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A module's field of /v1/status, as an integer (-1 when absent or null). */
static long long status_field(unsigned port, const char *field) {
    char *body = NULL;
    ck_assert_int_eq(http(port, "GET", "/v1/status", NULL, &body), 200);
    cJSON *o = cJSON_Parse(body);
    const cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "modules"), 0);
    const cJSON *v = cJSON_GetObjectItem(m0, field);
    long long n = cJSON_IsNumber(v) ? (long long)v->valuedouble : -1;
    cJSON_Delete(o);
    free(body);
    return n;
}

/* ---- tests ------------------------------------------------------------- */

/* Pushes commit v1 and v2; a puller then moves the engine to v3. A signed
 * rollback "to v1" (what the endpoint's own push history would call the
 * previous release) must not run v2 while status says v1: the engine would
 * commit v2, so the request is refused and v3 keeps running. Status names
 * what the engine runs and would roll back to, and the CLI's default target
 * is that: it runs v2, and status says so. */
START_TEST(rollback_follows_the_engine) {
    const char *keys[] = {pub_path};
    hk_endpoint_options eo;
    hk_endpoint *ep = NULL;
    hk_report rep = HK_REPORT_INIT;
    hk_endpoint_options_init(&eo);
    eo.trusted_keys = keys;
    eo.ntrusted_keys = 1;
    eo.state_dir = state;
    ck_assert_msg(hk_endpoint_start(rt, &eo, &ep, &rep) == 0, "%s", rep.message);
    unsigned port = hk_endpoint_port(ep);
    ck_assert_int_eq(push(port, 1, 101), 200);
    ck_assert_int_eq(push(port, 2, 102), 200);
    ck_assert_int_eq(running_tag("m"), 102);

    pid_t nginx;
    int nport = hkt_nginx_start(www, tmp, NULL, &nginx);
    ck_assert_msg(nport > 0, "nginx did not start");
    publish(3, 103);
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/rel/manifest.json", nport);
    hk_pull_options po;
    hk_puller *p = NULL;
    hk_pull_options_init(&po);
    po.url = url;
    po.interval_ms = 100;
    po.trusted_keys = keys;
    po.ntrusted_keys = 1;
    po.state_dir = state;
    ck_assert_msg(hk_pull_start(rt, &po, &p, &rep) == 0, "%s", rep.message);
    for (int i = 0; i < 200 && running_tag("m") != 103; i++)
        usleep(50000);
    hk_pull_stop(p);
    hkt_nginx_stop(nginx);
    ck_assert_int_eq(running_tag("m"), 103);
    ck_assert_int_eq(status_field(port, "running_release_version"), 3);
    ck_assert_int_eq(status_field(port, "previous_release_version"), 2);

    char out[8192], args[PATH_MAX + 128];
    snprintf(args, sizeof args, "rollback http://127.0.0.1:%u m --key '%s' --to 1", port, key_path);
    int rc = cli(out, sizeof out, args);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_REJECTED") && strstr(out, "v2"), "exit %d: %s", rc,
                  out);
    ck_assert_int_eq(running_tag("m"), 103);
    ck_assert_int_eq(status_field(port, "running_release_version"), 3);

    snprintf(args, sizeof args, "rollback http://127.0.0.1:%u m --key '%s'", port, key_path);
    rc = cli(out, sizeof out, args);
    ck_assert_msg(rc == 0 && strstr(out, "rolled_back"), "exit %d: %s", rc, out);
    ck_assert_int_eq(running_tag("m"), 102);
    ck_assert_int_eq(status_field(port, "running_release_version"), 2);
    ck_assert_int_eq(status_field(port, "previous_release_version"), 1);
    uint64_t rel = 0;
    ck_assert_int_eq(hk_module_release(rt, "m", 0, &rel), 0);
    ck_assert_uint_eq(rel, 2);
    hk_endpoint_stop(ep);
    hk_report_clear(&rep);
}
END_TEST

/* A rollback names the release that runs after it, not the engine's version
 * number of the image (releases 10, 20, 30 are engine versions 1, 2, 3):
 * the endpoint's answer says "release_version", and the CLI prints it, as
 * text and as --json's "release", with the token (nothing signed names the
 * target) as with a signed request. */
START_TEST(rollback_names_the_release) {
    hk_endpoint_options eo;
    hk_endpoint *ep = NULL;
    hk_report rep = HK_REPORT_INIT;
    const char *keys[] = {pub_path};
    hk_endpoint_options_init(&eo);
    eo.trusted_keys = keys;
    eo.ntrusted_keys = 1;
    eo.state_dir = state;
    eo.token = "t0ken";
    snprintf(bearer, sizeof bearer, "t0ken");
    ck_assert_msg(hk_endpoint_start(rt, &eo, &ep, &rep) == 0, "%s", rep.message);
    unsigned port = hk_endpoint_port(ep);
    for (int i = 1; i <= 3; i++)
        ck_assert_int_eq(push(port, (uint64_t)i * 10, 100 + i), 200);
    ck_assert_int_eq(status_field(port, "running_release_version"), 30);

    char *body = NULL;
    ck_assert_int_eq(http(port, "POST", "/v1/rollback/m", "{}", &body), 200);
    cJSON *a = cJSON_Parse(body);
    const cJSON *rel = cJSON_GetObjectItem(a, "release_version");
    ck_assert_msg(cJSON_IsNumber(rel) && rel->valuedouble == 20, "%s", body);
    cJSON_Delete(a);
    free(body);
    ck_assert_int_eq(running_tag("m"), 102);

    char out[8192], args[PATH_MAX + 128];
    snprintf(args, sizeof args, "rollback http://127.0.0.1:%u m --token t0ken", port);
    int rc = cli(out, sizeof out, args);
    ck_assert_msg(rc == 0 && strstr(out, "rolled_back") && strstr(out, "release v10,"),
                  "exit %d: %s", rc, out);
    ck_assert_int_eq(running_tag("m"), 101);
    ck_assert_int_eq(status_field(port, "running_release_version"), 10);

    /* Forward again with a push; --json says the same as the text. */
    ck_assert_int_eq(push(port, 40, 104), 200);
    snprintf(args, sizeof args, "rollback http://127.0.0.1:%u m --token t0ken --json", port);
    rc = cli(out, sizeof out, args);
    ck_assert_msg(rc == 0 && strstr(out, "\"release\":10,"), "exit %d: %s", rc, out);
    ck_assert_int_eq(status_field(port, "running_release_version"), 10);
    bearer[0] = '\0';
    hk_endpoint_stop(ep);
    hk_report_clear(&rep);
}
END_TEST

/* A pushed CUDA C file that does not compile: the compiler's messages name
 * the file as the manifest does ("game.cu(2): error"), not the release
 * ("game@v5(2)"). NVRTC runs here without a GPU; nothing is committed. */
START_TEST(pushed_build_log_names_the_file) {
    const char *keys[] = {pub_path};
    hk_endpoint_options eo;
    hk_endpoint *ep = NULL;
    hk_report rep = HK_REPORT_INIT;
    hk_endpoint_options_init(&eo);
    eo.trusted_keys = keys;
    eo.ntrusted_keys = 1;
    eo.state_dir = state;
    ck_assert_msg(hk_endpoint_start(rt, &eo, &ep, &rep) == 0, "%s", rep.message);
    char src[PATH_MAX + 16], out[16384], args[3 * PATH_MAX];
    snprintf(src, sizeof src, "%s/game.cu", tmp);
    ck_assert_int_eq(hkt_write_file(src, "extern \"C\" __global__ void step(int *x) {\n"
                                         "    x[0] = undefined_thing;\n"
                                         "}\n"),
                     0);
    snprintf(args, sizeof args,
             "push http://127.0.0.1:%u --key '%s' --module game --release 5 '%s'",
             hk_endpoint_port(ep), key_path, src);
    int rc = cli(out, sizeof out, args);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_COMPILE"), "exit %d: %s", rc, out);
    ck_assert_msg(strstr(out, "game.cu(2): error"), "%s", out);
    ck_assert_msg(!strstr(out, "game@v5"), "%s", out);
    ck_assert_int_eq(running_tag("game"), -1);
    hk_endpoint_stop(ep);
    hk_report_clear(&rep);
}
END_TEST

/* The engine keeps each image's release through its history: what
 * hk_module_release reports and what hk_rollback_release accepts are the
 * images hk_rollback walks back through, and a refused target changes
 * nothing. */
START_TEST(engine_history_has_releases) {
    hk_report rep = HK_REPORT_INIT;
    hk_swap_options so;
    hk_swap_options_init(&so);
    for (int v = 1; v <= 3; v++) {
        const char *ptx = fake_ptx(200 + v, 0, 0, 0);
        so.release_version = (uint64_t)v * 10;
        ck_assert_int_eq(hk_swap(rt, "m", ptx, strlen(ptx), &so, &rep), 0);
    }
    /* A swap with no release: 0. */
    const char *ptx = fake_ptx(204, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "m", ptx, strlen(ptx), NULL, &rep), 0);
    uint64_t rel = 99;
    ck_assert_int_eq(hk_module_release(rt, "m", 0, &rel), 0);
    ck_assert_uint_eq(rel, 0);
    ck_assert_int_eq(hk_module_release(rt, "m", 1, &rel), 0);
    ck_assert_uint_eq(rel, 30);
    ck_assert_int_eq(hk_module_release(rt, "m", 3, &rel), 0);
    ck_assert_uint_eq(rel, 10);
    ck_assert_int_eq(hk_module_release(rt, "m", 4, &rel), HK_ERR_NO_HISTORY);
    ck_assert_int_eq(hk_module_release(rt, "none", 0, &rel), HK_ERR_NOT_FOUND);
    ck_assert_int_eq(hk_module_release(rt, "m", -1, &rel), HK_ERR_INVALID);
    uint64_t before = hk_module_version(rt, "m");
    ck_assert_int_eq(hk_rollback_release(rt, "m", 20, &rep), HK_ERR_REJECTED);
    ck_assert_msg(strstr(rep.message, "v30"), "%s", rep.message);
    ck_assert_uint_eq(hk_module_version(rt, "m"), before);
    ck_assert_int_eq(running_tag("m"), 204);
    ck_assert_int_eq(hk_rollback_release(rt, "m", 30, &rep), 0);
    ck_assert_int_eq(running_tag("m"), 203);
    /* The image rolled back to keeps its release. */
    ck_assert_int_eq(hk_module_release(rt, "m", 0, &rel), 0);
    ck_assert_uint_eq(rel, 30);
    ck_assert_int_eq(hk_rollback(rt, "m", &rep), 0);
    ck_assert_int_eq(hk_module_release(rt, "m", 0, &rel), 0);
    ck_assert_uint_eq(rel, 20);
    hk_report_clear(&rep);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("net_engine");
    TCase *tc = tcase_create("fake");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, rollback_follows_the_engine);
    tcase_add_test(tc, engine_history_has_releases);
    tcase_add_test(tc, rollback_names_the_release);
    tcase_add_test(tc, pushed_build_log_names_the_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

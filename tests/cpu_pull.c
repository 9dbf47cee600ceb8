/*
 * The puller (net/pull.c) against a real origin: Debian's nginx, started by
 * each test on 127.0.0.1 with its configuration, logs and temp paths in the
 * test's directory, serving a release directory written by the signing code
 * (and once by `hotkern sign`). Faults come from the origin itself: a
 * truncated or oversized artifact file, a location that returns 500, nginx
 * killed, and a raw socket that accepts and never answers.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "net/net.h"
#include "util/util.h"
#include "tests/harness.h"

/* ---- the recording engine ---------------------------------------------- */

static struct {
    pthread_mutex_t lock;
    int calls;
    char module[64];
    uint64_t version;
    unsigned char *bytes;
    size_t size;
    char origin[256];
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int rec_apply(void *ud, const char *module, uint64_t version, hk_format fmt,
                     const void *bytes, size_t size, const hk_header *headers, int nheaders,
                     const char *origin, hk_report *rep) {
    pthread_mutex_lock(&rec.lock);
    rec.calls++;
    snprintf(rec.module, sizeof rec.module, "%s", module);
    rec.version = version;
    free(rec.bytes);
    rec.bytes = malloc(size ? size : 1);
    memcpy(rec.bytes, bytes, size);
    rec.size = size;
    snprintf(rec.origin, sizeof rec.origin, "%s", origin);
    pthread_mutex_unlock(&rec.lock);
    return 0;
}

static uint64_t rec_version(void) {
    pthread_mutex_lock(&rec.lock);
    uint64_t v = rec.version;
    pthread_mutex_unlock(&rec.lock);
    return v;
}

static const hkn_engine engine = {.apply = rec_apply};

/* An engine that has quarantined ptx_v2's image (declared below). */
static const char ptx_v2[64];
static int quarantining_apply(void *ud, const char *module, uint64_t version, hk_format fmt,
                              const void *bytes, size_t size, const hk_header *headers,
                              int nheaders, const char *origin, hk_report *rep) {
    rec_apply(ud, module, version, fmt, bytes, size, headers, nheaders, origin, rep);
    if (size == strlen(ptx_v2) && !memcmp(bytes, ptx_v2, size))
        return hku_fail(rep, HK_ERR_QUARANTINED, "image quarantined");
    return 0;
}
static const hkn_engine quarantining = {.apply = quarantining_apply};

/* An engine that refuses every build, as NVRTC would a broken kernel. */
static int refusing_apply(void *ud, const char *module, uint64_t version, hk_format fmt,
                          const void *bytes, size_t size, const hk_header *headers, int nheaders,
                          const char *origin, hk_report *rep) {
    pthread_mutex_lock(&rec.lock);
    rec.calls++;
    pthread_mutex_unlock(&rec.lock);
    return hku_fail(rep, HK_ERR_COMPILE, "add.ptx: syntax error");
}
static const hkn_engine refusing = {.apply = refusing_apply};

/* An engine that cannot apply anything for its first `flaky_left` calls,
 * the device out of memory (the host's state, not a verdict on the
 * release), then applies as the recording engine does. */
static int flaky_left;
static int flaky_apply(void *ud, const char *module, uint64_t version, hk_format fmt,
                       const void *bytes, size_t size, const hk_header *headers, int nheaders,
                       const char *origin, hk_report *rep) {
    pthread_mutex_lock(&rec.lock);
    int fail = flaky_left > 0 ? flaky_left-- : 0;
    if (fail)
        rec.calls++;
    pthread_mutex_unlock(&rec.lock);
    if (fail)
        return hku_fail(rep, HK_ERR_CUDA, "cuLibraryLoadData failed: CUDA_ERROR_OUT_OF_MEMORY");
    return rec_apply(ud, module, version, fmt, bytes, size, headers, nheaders, origin, rep);
}
static const hkn_engine flaky = {.apply = flaky_apply};

/* An engine whose required canary could not run (its helper died), then a
 * build that timed out on a loaded host: neither is a verdict. */
static int unavailable_apply(void *ud, const char *module, uint64_t version, hk_format fmt,
                             const void *bytes, size_t size, const hk_header *headers, int nheaders,
                             const char *origin, hk_report *rep) {
    pthread_mutex_lock(&rec.lock);
    int n = ++rec.calls;
    pthread_mutex_unlock(&rec.lock);
    if (n == 1)
        return hku_fail(rep, HK_ERR_CANARY_UNAVAILABLE,
                        "canary: required but could not run: the helper died while loading an "
                        "image; the running version stays");
    if (n == 2)
        return hku_fail(rep, HK_ERR_TIMEOUT, "the build did not finish within 120000 ms");
    pthread_mutex_lock(&rec.lock);
    rec.calls--; /* rec_apply counts it */
    pthread_mutex_unlock(&rec.lock);
    return rec_apply(ud, module, version, fmt, bytes, size, headers, nheaders, origin, rep);
}
static const hkn_engine unavailable_engine = {.apply = unavailable_apply};

/* ---- fixture: nginx ---------------------------------------------------- */

static char *tmp;
static char www[1024], url[256], state[1024];
static hkn_seckey key;
static pid_t nginx_pid;
static int port;

static void nginx_start(void) {
    port = hkt_nginx_start(www, tmp, "location = /err/manifest.json { return 500; }", &nginx_pid);
    ck_assert_msg(port > 0, "nginx did not start (see %s/error.log)", tmp);
}

static void nginx_stop(void) {
    hkt_nginx_stop(nginx_pid);
    nginx_pid = 0;
}

static void setup(void) {
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    ck_assert_int_eq(hkn_keygen(&key), 0);
    snprintf(www, sizeof www, "%s/www", tmp);
    snprintf(state, sizeof state, "%s/state", tmp);
    mkdir(www, 0755);
    char rel[PATH_MAX + 8];
    snprintf(rel, sizeof rel, "%s/rel", www);
    mkdir(rel, 0755);
    snprintf(rel, sizeof rel, "%s/rel/artifacts", www);
    mkdir(rel, 0755);
    nginx_start();
    snprintf(url, sizeof url, "http://127.0.0.1:%d/rel/manifest.json", port);
}

static void teardown(void) {
    nginx_stop();
    hkt_rmtree(tmp);
    free(tmp);
}

/* ---- publishing -------------------------------------------------------- */

static char published_sha[65];

/* Publishes `body` as release `version` of module "add" under www/rel,
 * artifacts first and the manifest last. The manifest's mtime is set to
 * `version` seconds after a fixed base so that nginx's ETag (mtime + size)
 * changes with every release even within one second. */
enum sig_mode { SIG_WRITE, SIG_KEEP_OLD, SIG_REMOVE };
static void publish_sig(uint64_t version, const char *body, int64_t expires_in, enum sig_mode sm);
static char last_sig[256];

static void publish(uint64_t version, const char *body, int64_t expires_in) {
    publish_sig(version, body, expires_in, SIG_WRITE);
}

/* Writes the signature file of the last publish (a late upload). */
static void write_last_sig(void) {
    char path[PATH_MAX + 64];
    hk_report rep = HK_REPORT_INIT;
    snprintf(path, sizeof path, "%s/rel/manifest.json.sig", www);
    ck_assert_int_eq(hku_write_atomic(path, last_sig, strlen(last_sig), 0644, &rep), 0);
}

static void publish_sig(uint64_t version, const char *body, int64_t expires_in, enum sig_mode sm) {
    char *manifest, *sig, path[PATH_MAX + 64];
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    hkn_blob b = {.name = "add.ptx", .bytes = body, .size = strlen(body)};
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(hkn_release_sign(&key, "add", version, now, now + expires_in, &b, 1, &manifest,
                                      &len, &sig, &rep),
                     0);
    hkn_sha256_hex(body, strlen(body), published_sha);
    snprintf(path, sizeof path, "%s/rel/artifacts/%s", www, published_sha);
    ck_assert_int_eq(hku_write_atomic(path, body, strlen(body), 0644, &rep), 0);
    snprintf(path, sizeof path, "%s/rel/manifest.json.sig", www);
    snprintf(last_sig, sizeof last_sig, "%s", sig);
    if (sm == SIG_WRITE)
        ck_assert_int_eq(hku_write_atomic(path, sig, strlen(sig), 0644, &rep), 0);
    else if (sm == SIG_REMOVE)
        unlink(path);
    snprintf(path, sizeof path, "%s/rel/manifest.json", www);
    ck_assert_int_eq(hku_write_atomic(path, manifest, len, 0644, &rep), 0);
    struct timespec ts[2] = {{.tv_sec = 1700000000 + (time_t)version},
                             {.tv_sec = 1700000000 + (time_t)version}};
    utimensat(AT_FDCWD, path, ts, 0);
    free(manifest);
    free(sig);
}

/* Replaces the published artifact's file with other content. */
static void replace_artifact(const char *content) {
    char path[PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/rel/artifacts/%s", www, published_sha);
    ck_assert_int_eq(hkt_write_file(path, content), 0);
}

static hkn_puller *puller_with(const hkn_engine *eng, const char *u, unsigned total_timeout_ms,
                               size_t max_artifact) {
    hk_pull_options o;
    hkn_pull_resolved r = {0};
    hk_pull_options_init(&o);
    o.url = u;
    o.interval_ms = 100;
    o.connect_timeout_ms = 2000;
    o.total_timeout_ms = total_timeout_ms ? total_timeout_ms : 5000;
    if (max_artifact)
        o.max_artifact_bytes = max_artifact;
    r.state_dir = state;
    r.trust.keys[0] = key.pub;
    r.trust.nkeys = 1;
    hkn_puller *p;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hkn_pull_create(&o, &r, eng, &p, &rep) == 0, "%s", rep.message);
    return p;
}

static hkn_puller *puller(const char *u, unsigned total_timeout_ms, size_t max_artifact) {
    return puller_with(&engine, u, total_timeout_ms, max_artifact);
}

static int poll_once(hkn_puller *p, hk_report *rep) {
    hk_report_clear(rep);
    return hkn_pull_poll(p, rep);
}

/* Lines of nginx's access log containing both needles. */
static int log_count(const char *a, const char *b) {
    char path[PATH_MAX], line[2048];
    snprintf(path, sizeof path, "%s/access.log", tmp);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, a) && strstr(line, b);
    if (f)
        fclose(f);
    return n;
}

/* nginx writes a request's log line after the response went out: wait (5 s
 * at most) for the count to reach `want` before comparing. */
static int log_count_wait(const char *a, const char *b, int want) {
    int n = log_count(a, b);
    for (int i = 0; i < 100 && n < want; i++) {
        usleep(50000);
        n = log_count(a, b);
    }
    return n;
}

static const char ptx_v1[] = ".version 8.0\n.target sm_90\n// v1\n";
static const char ptx_v2[64] = ".version 8.0\n.target sm_90\n// v2 is longer\n";
static const char ptx_v3[] = ".version 8.0\n.target sm_90\n// v3\n";

/* ---- tests ------------------------------------------------------------- */

/* The engine quarantined the release's image: the release stays recorded,
 * so a restarted puller does not apply it again; a newer one is applied. */
START_TEST(quarantined_release_is_not_applied_again) {
    hk_report rep = HK_REPORT_INIT;
    publish(2, ptx_v2, 600);
    hkn_puller *p = puller_with(&quarantining, url, 0, 0);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_QUARANTINED);
    ck_assert_int_eq(rec.calls, 1);
    hkn_pull_destroy(p);
    p = puller_with(&quarantining, url, 0, 0); /* a restart: no validators */
    ck_assert_int_eq(poll_once(p, &rep), 0);
    ck_assert_int_eq(rec.calls, 1);
    publish(3, ptx_v3, 600);
    ck_assert_int_eq(poll_once(p, &rep), 0);
    ck_assert_int_eq(rec.calls, 2);
    ck_assert_uint_eq(rec_version(), 3);
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

/* Sets the manifest's mtime, and with it nginx's ETag, to `t` seconds after
 * the publishing base: the same bytes under a new validator. */
static void touch_manifest(time_t t) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/rel/manifest.json", www);
    struct timespec ts[2] = {{.tv_sec = 1700000000 + t}, {.tv_sec = 1700000000 + t}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
}

/* A static origin and an engine out of device memory for two applies: the
 * validators are not kept after a transient engine outcome, so each poll
 * fetches the manifest again (200, not 304) and tries the release again,
 * which is applied once the device has memory; after that, 304s. */
START_TEST(transient_engine_error_is_retried) {
    hk_report rep = HK_REPORT_INIT;
    publish(2, ptx_v2, 600);
    flaky_left = 2;
    hkn_puller *p = puller_with(&flaky, url, 0, 0);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_CUDA);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_CUDA);
    ck_assert_msg(poll_once(p, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(rec.calls, 3);
    ck_assert_uint_eq(rec_version(), 2);
    ck_assert_int_eq(poll_once(p, &rep), 0);
    ck_assert_int_eq(rec.calls, 3);
    ck_assert_int_eq(log_count_wait("GET /rel/manifest.json ", "\" 200 ", 3), 3);
    ck_assert_int_eq(log_count_wait("GET /rel/manifest.json ", "\" 304 ", 1), 1);
    hkn_pull_stats s;
    hkn_pull_stats_get(p, &s);
    ck_assert_uint_eq(s.applied, 1);
    ck_assert_uint_eq(s.refused, 0);
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

/* On its own thread, the retries of a transient engine outcome back off:
 * the consecutive failures are counted and the next poll's delay grows
 * past the interval (100 ms here; two failures: 400 ms less 10 % jitter). */
START_TEST(transient_engine_error_backs_off) {
    publish(2, ptx_v2, 600);
    flaky_left = 1000;
    hkn_puller *p = puller_with(&flaky, url, 0, 0);
    ck_assert_int_eq(hkn_pull_run(p), 0);
    hkn_pull_stats s;
    hkn_pull_stats_get(p, &s);
    for (int i = 0; i < 200 && s.failures < 2; i++) {
        usleep(50000);
        hkn_pull_stats_get(p, &s);
    }
    ck_assert_uint_ge(s.failures, 2);
    ck_assert_int_eq(s.last_error, HK_ERR_CUDA);
    ck_assert_uint_ge(s.next_poll_ms, 360);
    hkn_pull_destroy(p);
}
END_TEST

/* A canary that could not run and a build that timed out are not
 * remembered as refusals of the release: with the host well again, the same
 * signed bytes are applied, not answered "refused before". */
START_TEST(unavailable_canary_and_timeout_are_not_verdicts) {
    hk_report rep = HK_REPORT_INIT;
    publish(2, ptx_v2, 600);
    hkn_puller *p = puller_with(&unavailable_engine, url, 0, 0);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_CANARY_UNAVAILABLE);
    touch_manifest(100); /* an origin whose ETag changes for the same bytes */
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_TIMEOUT);
    ck_assert_msg(!strstr(rep.message, "refused before"), "%s", rep.message);
    touch_manifest(101);
    ck_assert_msg(poll_once(p, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(rec.calls, 3);
    ck_assert_uint_eq(rec_version(), 2);
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

/* An origin whose ETag changes for the same manifest (a CDN, a re-upload):
 * a release the engine refused is answered with the first refusal at every
 * poll, its artifact not fetched again and its build not run again. */
START_TEST(refused_release_not_rebuilt) {
    hk_report rep = HK_REPORT_INIT;
    publish(2, ptx_v2, 600);
    hkn_puller *p = puller_with(&refusing, url, 0, 0);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_COMPILE);
    ck_assert_int_eq(rec.calls, 1);
    char get[128];
    snprintf(get, sizeof get, "GET /rel/artifacts/%s ", published_sha);
    ck_assert_int_eq(log_count_wait(get, "\" 200 ", 1), 1);
    for (int i = 0; i < 10; i++) {
        touch_manifest(100 + i);
        ck_assert_int_eq(poll_once(p, &rep), HK_ERR_COMPILE);
        ck_assert_msg(strstr(rep.message, "refused before") && strstr(rep.message, "syntax error"),
                      "%s", rep.message);
    }
    ck_assert_int_eq(log_count_wait("GET /rel/manifest.json ", "\" 200 ", 11), 11);
    pthread_mutex_lock(&rec.lock);
    ck_assert_int_eq(rec.calls, 1);
    pthread_mutex_unlock(&rec.lock);
    ck_assert_int_eq(log_count(get, "HTTP"), 1);
    hkn_pull_stats s;
    hkn_pull_stats_get(p, &s);
    ck_assert_uint_eq(s.refused, 11);
    ck_assert_int_eq(s.last_error, HK_ERR_COMPILE);
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(picks_up_releases_with_304s_between) {
    publish(1, ptx_v1, 600);
    hkn_puller *p = puller(url, 0, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(poll_once(p, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(rec_version(), 1);
    pthread_mutex_lock(&rec.lock);
    ck_assert_uint_eq(rec.size, strlen(ptx_v1));
    ck_assert_mem_eq(rec.bytes, ptx_v1, rec.size);
    ck_assert_str_eq(rec.module, "add");
    ck_assert_ptr_nonnull(strstr(rec.origin, "pull:http://127.0.0.1"));
    pthread_mutex_unlock(&rec.lock);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(poll_once(p, &rep), 0);
    hkn_pull_stats s;
    hkn_pull_stats_get(p, &s);
    ck_assert_uint_eq(s.not_modified, 3);
    ck_assert_uint_eq(s.applied, 1);
    ck_assert_int_eq(log_count_wait("GET /rel/manifest.json ", "\" 304 ", 3), 3);
    ck_assert_int_eq(log_count_wait("GET /rel/manifest.json ", "\" 200 ", 1), 1);

    publish(2, ptx_v2, 600);
    ck_assert_msg(poll_once(p, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(rec_version(), 2);
    ck_assert_int_eq(poll_once(p, &rep), 0);
    ck_assert_int_eq(log_count_wait("GET /rel/manifest.json ", "\" 304 ", 4), 4);

    /* On its own thread: a new release arrives within a bounded wait. */
    ck_assert_int_eq(hkn_pull_run(p), 0);
    publish(3, ptx_v3, 600);
    for (int i = 0; i < 100 && rec_version() != 3; i++)
        usleep(50000);
    ck_assert_uint_eq(rec_version(), 3);
    hkn_pull_destroy(p);

    /* A restart: the accepted version is in the state dir, so the same
     * release is recognised and not applied again. */
    int calls = rec.calls;
    p = puller(url, 0, 0);
    ck_assert_msg(poll_once(p, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(rec.calls, calls);
    /* An older release served again (rollback attack) is refused. */
    publish(2, ptx_v2, 600);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_REPLAY);
    ck_assert_uint_eq(rec_version(), 3);
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(truncated_artifact_changes_nothing) {
    publish(1, ptx_v1, 600);
    hkn_puller *p = puller(url, 0, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(poll_once(p, &rep), 0);
    publish(2, ptx_v2, 600);
    char cut[sizeof ptx_v2];
    memcpy(cut, ptx_v2, sizeof cut);
    cut[10] = '\0';
    replace_artifact(cut);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_HASH);
    ck_assert_msg(strstr(rep.message, "size"), "%s", rep.message);
    ck_assert_uint_eq(rec_version(), 1);
    /* Retried at the next poll (no 304 hides it), and fixed once the origin is. */
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_HASH);
    replace_artifact(ptx_v2);
    ck_assert_msg(poll_once(p, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(rec_version(), 2);
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(oversized_artifact_changes_nothing) {
    publish(1, ptx_v1, 600);
    hkn_puller *p = puller(url, 0, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(poll_once(p, &rep), 0);
    /* Served larger than the manifest declares: cut off at the declared size. */
    publish(2, ptx_v2, 600);
    static char big[256 * 1024];
    memset(big, 'x', sizeof big - 1);
    replace_artifact(big);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_HASH);
    ck_assert_msg(strstr(rep.message, "more than the declared"), "%s", rep.message);
    ck_assert_uint_eq(rec_version(), 1);
    hkn_pull_destroy(p);

    /* Declared larger than the puller's cap: refused before any download. */
    publish(3, big, 600);
    p = puller(url, 0, 64 * 1024);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_TOO_LARGE);
    ck_assert_uint_eq(rec_version(), 1);
    char get[128];
    snprintf(get, sizeof get, "GET /rel/artifacts/%s ", published_sha);
    ck_assert_int_eq(log_count(get, "HTTP"), 0);
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(server_errors_change_nothing) {
    publish(1, ptx_v1, 600);
    hk_report rep = HK_REPORT_INIT;
    char u500[256];
    snprintf(u500, sizeof u500, "http://127.0.0.1:%d/err/manifest.json", port);
    hkn_puller *p = puller(u500, 0, 0);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_NETWORK);
    ck_assert_msg(strstr(rep.message, "500"), "%s", rep.message);
    hkn_pull_stats s;
    hkn_pull_stats_get(p, &s);
    ck_assert_uint_eq(s.errors, 1);
    ck_assert_uint_eq(s.applied, 0);
    hkn_pull_destroy(p);
    /* A missing manifest (404) likewise. */
    char u404[256];
    snprintf(u404, sizeof u404, "http://127.0.0.1:%d/none/manifest.json", port);
    p = puller(u404, 0, 0);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_NETWORK);
    hkn_pull_destroy(p);
    /* An expired release is refused. */
    publish(2, ptx_v2, -10);
    p = puller(url, 0, 0);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_EXPIRED);
    /* The origin goes away: a connection error, nothing applied. */
    nginx_stop();
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_NETWORK);
    ck_assert_int_eq(rec.calls, 0);
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

/* A server that accepts connections and never answers. */
static int stall_fd;
static void *stall_accept(void *arg) {
    int held[8], n = 0;
    while (n < 8) {
        int c = accept(stall_fd, NULL, NULL);
        if (c < 0)
            break;
        held[n++] = c;
    }
    for (int i = 0; i < n; i++)
        close(held[i]);
    return NULL;
}

START_TEST(stalled_server_times_out) {
    stall_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(stall_fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(stall_fd, 8), 0);
    getsockname(stall_fd, (struct sockaddr *)&a, &len);
    pthread_t t;
    pthread_create(&t, NULL, stall_accept, NULL);
    char u[256];
    snprintf(u, sizeof u, "http://127.0.0.1:%d/rel/manifest.json", ntohs(a.sin_port));
    hkn_puller *p = puller(u, 800, 0);
    hk_report rep = HK_REPORT_INIT;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_TIMEOUT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_msg(s >= 0.7 && s < 5, "took %.2f s", s);
    ck_assert_int_eq(rec.calls, 0);
    /* Stopping a puller whose thread sits in a stalled transfer is prompt:
     * the progress callback aborts it. */
    hkn_pull_destroy(p);
    p = puller(u, 30000, 0);
    ck_assert_int_eq(hkn_pull_run(p), 0);
    usleep(300000);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    hkn_pull_destroy(p);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_msg(s < 3, "stop took %.2f s", s);
    shutdown(stall_fd, SHUT_RDWR);
    close(stall_fd);
    pthread_join(t, NULL);
    hk_report_clear(&rep);
}
END_TEST

/* `hotkern sign` writes the directory; the puller takes it. */
START_TEST(cli_sign_publishes) {
    char exe[PATH_MAX], cli[PATH_MAX + 32], kpath[PATH_MAX], src[PATH_MAX], out[1100];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert(n > 0);
    exe[n] = '\0';
    snprintf(cli, sizeof cli, "%s/../bin/hotkern", dirname(exe));
    ck_assert_msg(access(cli, X_OK) == 0, "the hotkern CLI is not built at %s", cli);
    snprintf(kpath, sizeof kpath, "%s/hotkern.key", tmp);
    snprintf(src, sizeof src, "%s/add.ptx", tmp);
    snprintf(out, sizeof out, "%s/rel", www);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_seckey_save(kpath, &key, &rep), 0);
    ck_assert_int_eq(hkt_write_file(src, ptx_v1), 0);
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDWR);
        dup2(devnull, 1);
        execl("/usr/bin/timeout", "timeout", "30", cli, "sign", "--key", kpath, "--module", "add",
              "--release", "9", "--expires-in", "600", "--out", out, src, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    hkn_puller *p = puller(url, 0, 0);
    ck_assert_msg(poll_once(p, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(rec_version(), 9);
    ck_assert_mem_eq(rec.bytes, ptx_v1, strlen(ptx_v1));
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

/* A manifest served before its signature (stale or missing .sig) is fetched
 * again at the next poll and applied once the signature arrives; the error
 * shows in the stats meanwhile. */
START_TEST(late_signature_retried) {
    publish(1, ptx_v1, 600);
    hkn_puller *p = puller(url, 0, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(poll_once(p, &rep), 0);
    /* v2's manifest with v1's signature still in place. */
    publish_sig(2, ptx_v2, 600, SIG_KEEP_OLD);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_SIGNATURE);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_SIGNATURE);
    hkn_pull_stats s;
    hkn_pull_stats_get(p, &s);
    ck_assert_int_eq(s.last_error, HK_ERR_SIGNATURE);
    ck_assert_msg(s.last_message[0], "no message");
    ck_assert_uint_eq(rec_version(), 1);
    write_last_sig();
    ck_assert_msg(poll_once(p, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(rec_version(), 2);
    /* v3 with no signature file at all. */
    publish_sig(3, ptx_v3, 600, SIG_REMOVE);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_SIGNATURE);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_SIGNATURE);
    ck_assert_uint_eq(rec_version(), 2);
    write_last_sig();
    ck_assert_msg(poll_once(p, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(rec_version(), 3);
    /* A verified refusal keeps its validators, and a 304 reports it again. */
    publish(2, ptx_v2, 600);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_REPLAY);
    int before = log_count("GET /rel/manifest.json ", "\" 304 ");
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_REPLAY);
    ck_assert_int_eq(log_count_wait("GET /rel/manifest.json ", "\" 304 ", before + 1), before + 1);
    hkn_pull_stats_get(p, &s);
    ck_assert_int_eq(s.last_error, HK_ERR_REPLAY);
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

/* POSTs a signed release of "add" to the endpoint with the curl tool;
 * returns the HTTP status. */
static int push_release(uint16_t eport, uint64_t version, const char *body) {
    char *manifest, *sig, hex[65], path[PATH_MAX], data[PATH_MAX + 1], u[128], code[16];
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    hkn_blob b = {.name = "add.ptx", .bytes = body, .size = strlen(body)};
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(
        hkn_release_sign(&key, "add", version, now, now + 600, &b, 1, &manifest, &len, &sig, &rep),
        0);
    hkn_sha256_hex(body, strlen(body), hex);
    char b64[1024];
    sodium_bin2base64(b64, sizeof b64, (const unsigned char *)body, strlen(body),
                      sodium_base64_VARIANT_ORIGINAL);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "manifest", manifest);
    cJSON_AddStringToObject(o, "signature", sig);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "artifacts"), hex, b64);
    char *text = cJSON_PrintUnformatted(o);
    snprintf(path, sizeof path, "%s/push.json", tmp);
    ck_assert_int_eq(hkt_write_file(path, text), 0);
    free(text);
    cJSON_Delete(o);
    free(manifest);
    free(sig);
    snprintf(data, sizeof data, "@%s", path);
    snprintf(u, sizeof u, "http://127.0.0.1:%u/v1/release", eport);
    int pfd[2];
    ck_assert_int_eq(pipe(pfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        execlp("timeout", "timeout", "30", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
               "-H", "Content-Type: application/json", "--data-binary", data, u, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    ssize_t n = read(pfd[0], code, sizeof code - 1);
    code[n > 0 ? n : 0] = '\0';
    close(pfd[0]);
    waitpid(pid, NULL, 0);
    return atoi(code);
}

/* Push and pull keep one record per module: after a push of v5 the origin's
 * signed v3 is a replay, and after a pull of v7 a push of v6 is one. */
START_TEST(push_and_pull_share_one_record) {
    hk_endpoint_options o;
    hkn_endpoint_resolved r = {0};
    hkn_endpoint *ep;
    hk_report rep = HK_REPORT_INIT;
    hk_endpoint_options_init(&o);
    r.trust.keys[0] = key.pub;
    r.trust.nkeys = 1;
    r.state_dir = state;
    ck_assert_msg(hkn_endpoint_start(&o, &r, &engine, &ep, &rep) == 0, "%s", rep.message);
    hkn_puller *p = puller(url, 0, 0);
    ck_assert_int_eq(push_release(hkn_endpoint_port(ep), 5, ptx_v2), 200);
    ck_assert_uint_eq(rec_version(), 5);
    publish(3, ptx_v3, 600);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_REPLAY);
    ck_assert_uint_eq(rec_version(), 5);
    publish(7, ptx_v1, 600);
    ck_assert_msg(poll_once(p, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(rec_version(), 7);
    ck_assert_int_eq(push_release(hkn_endpoint_port(ep), 6, ptx_v2), 409);
    ck_assert_uint_eq(rec_version(), 7);
    hkn_pull_destroy(p);
    hkn_endpoint_stop(ep);
    /* And the record survives both: a new puller refuses v3 too. */
    p = puller(url, 0, 0);
    publish(3, ptx_v3, 600);
    ck_assert_int_eq(poll_once(p, &rep), HK_ERR_REPLAY);
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("pull");
    TCase *tc = tcase_create("nginx");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, picks_up_releases_with_304s_between);
    tcase_add_test(tc, quarantined_release_is_not_applied_again);
    tcase_add_test(tc, refused_release_not_rebuilt);
    tcase_add_test(tc, transient_engine_error_is_retried);
    tcase_add_test(tc, transient_engine_error_backs_off);
    tcase_add_test(tc, unavailable_canary_and_timeout_are_not_verdicts);
    tcase_add_test(tc, truncated_artifact_changes_nothing);
    tcase_add_test(tc, oversized_artifact_changes_nothing);
    tcase_add_test(tc, server_errors_change_nothing);
    tcase_add_test(tc, stalled_server_times_out);
    tcase_add_test(tc, cli_sign_publishes);
    tcase_add_test(tc, late_signature_retried);
    tcase_add_test(tc, push_and_pull_share_one_record);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

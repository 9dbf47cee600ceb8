/*
 * The push endpoint (net/endpoint.c) against real clients: a libmicrohttpd
 * server on 127.0.0.1 (ephemeral port), driven by the curl command-line tool
 * and by the built hotkern CLI, both run with fork/exec under `timeout`.
 * The engine is a recorder: it keeps what apply was given, so the tests see
 * exactly which bytes would have been swapped in, and can be told to refuse.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "loader/core.h"
#include "loader/expo.h"
#include "loader/metrics.h"
#include "net/net.h"
#include "ptx/ptx.h"
#include "tests/harness.h"

/* ---- the recording engine ---------------------------------------------- */

static struct recorder {
    pthread_mutex_t lock;
    int calls; /* apply calls */
    int rollbacks;
    char module[64];
    uint64_t version; /* release version last applied: "the current version" */
    hk_format fmt;
    char origin[64];
    unsigned char *bytes;
    size_t size;
    int fail_with; /* when set, apply refuses with this error and a log */
    int attempts;  /* apply calls, refused ones included */
    int hostile;   /* the refusal's message and log carry terminal escapes */
    int nheaders;  /* headers given to the last apply, copied */
    char hname[4][64];
    char hdata[4][256];
    char state_file[PATH_MAX]; /* when set, apply notes whether the release is */
    int recorded_first;        /* ... already recorded there */
    int hash_only;             /* apply keeps the bytes' SHA-256, not a copy */
    char hash[65];
    uint64_t hist[16]; /* releases of the kept images, as the engine's ring: */
    int nhist;         /* the last runs, a rollback commits the one before */
    int delay_ms;      /* apply takes this long (an upload in flight) */
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* 1 when the state file records module at version. */
static int state_records(const char *path, const char *module, uint64_t version) {
    char *text = NULL;
    size_t len;
    if (hku_read_file(path, 1 << 20, &text, &len, NULL))
        return 0;
    cJSON *o = cJSON_Parse(text);
    const cJSON *v =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "modules"), module);
    int ok = cJSON_IsNumber(v) && (uint64_t)v->valuedouble == version;
    cJSON_Delete(o);
    free(text);
    return ok;
}

static int rec_apply(void *ud, const char *module, uint64_t version, hk_format fmt,
                     const void *bytes, size_t size, const hk_header *headers, int nheaders,
                     const char *origin, hk_report *rep) {
    pthread_mutex_lock(&rec.lock);
    int delay = rec.delay_ms;
    pthread_mutex_unlock(&rec.lock);
    if (delay)
        usleep((useconds_t)delay * 1000);
    pthread_mutex_lock(&rec.lock);
    int err = rec.fail_with;
    rec.attempts++;
    if (err && rec.hostile) {
        hku_fail(rep, err,
                 "kernel 'add': compile failed\x1b[2J\x1b]0;owned\x07 \xc2\x9b"
                 "31m \xff");
        rep->log = strdup("add.cu(1): error\x1b[31m red\r\n\xc2\x9b"
                          "2J\n");
    } else if (err) {
        hku_fail(rep, err, "kernel 'add': compile failed");
        rep->log = strdup("add.cu(1): error: expected a \";\"\n1 error detected\n");
    } else {
        rec.calls++;
        rec.nheaders = nheaders < 4 ? nheaders : 4;
        for (int i = 0; i < rec.nheaders; i++) {
            snprintf(rec.hname[i], sizeof rec.hname[i], "%s", headers[i].name);
            snprintf(rec.hdata[i], sizeof rec.hdata[i], "%.*s", (int)headers[i].size,
                     (const char *)headers[i].data);
        }
        if (rec.state_file[0])
            rec.recorded_first = state_records(rec.state_file, module, version);
        snprintf(rec.module, sizeof rec.module, "%s", module);
        rec.version = version;
        if (rec.nhist == 16) {
            memmove(rec.hist, rec.hist + 1, 15 * sizeof *rec.hist);
            rec.nhist--;
        }
        rec.hist[rec.nhist++] = version;
        rec.fmt = fmt;
        snprintf(rec.origin, sizeof rec.origin, "%s", origin);
        free(rec.bytes);
        rec.bytes = NULL;
        if (rec.hash_only) {
            hkn_sha256_hex(bytes, size, rec.hash);
        } else {
            rec.bytes = malloc(size ? size : 1);
            memcpy(rec.bytes, bytes, size);
        }
        rec.size = size;
        rep->build_ms = 1.5;
    }
    pthread_mutex_unlock(&rec.lock);
    return err;
}

/* As hk_rollback and hk_rollback_release: the image before the running one
 * is committed again, with its release, if it is the one asked for. */
static int rec_rollback(void *ud, const char *module, int check, uint64_t target, hk_report *rep) {
    pthread_mutex_lock(&rec.lock);
    int err = 0;
    if (strcmp(module, rec.module) || rec.calls == 0) {
        err = hku_fail(rep, HK_ERR_NOT_FOUND, "no module '%s'", module);
    } else if (rec.nhist < 2) {
        err = hku_fail(rep, HK_ERR_NO_HISTORY, "module '%s' has no earlier version kept", module);
    } else if (check && rec.hist[rec.nhist - 2] != target) {
        err = hku_fail(rep, HK_ERR_REJECTED, "module '%s' would roll back to release v%llu", module,
                       (unsigned long long)rec.hist[rec.nhist - 2]);
    } else {
        rec.nhist--;
        rec.version = rec.hist[rec.nhist - 1];
        rec.rollbacks++;
    }
    pthread_mutex_unlock(&rec.lock);
    return err;
}

static int rec_release(void *ud, const char *module, int back, uint64_t *out) {
    pthread_mutex_lock(&rec.lock);
    int err = 0;
    if (strcmp(module, rec.module) || rec.calls == 0)
        err = HK_ERR_NOT_FOUND;
    else if (back >= rec.nhist)
        err = HK_ERR_NO_HISTORY;
    else
        *out = rec.hist[rec.nhist - 1 - back];
    pthread_mutex_unlock(&rec.lock);
    return err;
}

static uint64_t rec_version(void *ud, const char *module) {
    pthread_mutex_lock(&rec.lock);
    uint64_t v = strcmp(module, rec.module) ? 0 : (uint64_t)(rec.calls + rec.rollbacks);
    pthread_mutex_unlock(&rec.lock);
    return v;
}

static void rec_stats(void *ud, hk_stats *s) {
    pthread_mutex_lock(&rec.lock);
    s->swaps = (uint64_t)(rec.calls + rec.rollbacks);
    s->rollbacks = (uint64_t)rec.rollbacks;
    s->build_ms_total = 1.5 * rec.calls;
    s->stage_ms_total = 42; /* 0.042 s: printed without float noise */
    pthread_mutex_unlock(&rec.lock);
}

static hkn_endpoint *ep;

/* What GET /metrics answers with a runtime behind it: the engine's families
 * (from the recorder's counters) and the endpoint's. */
static char *rec_metrics(void *ud, size_t *len) {
    hk_stats s = HK_STATS_INIT;
    char *text = NULL;
    memset(&s, 0, sizeof s);
    rec_stats(ud, &s);
    hk_metrics_writer *w = hkl_mw_new();
    hkl_metrics_engine(w, &s, NULL);
    hkn_endpoint_metrics(ep, w);
    return hkl_mw_take(w, &text, len) == 0 ? text : NULL;
}

static uint64_t rec_current(void) {
    pthread_mutex_lock(&rec.lock);
    uint64_t v = rec.version;
    pthread_mutex_unlock(&rec.lock);
    return v;
}

static int rec_calls(void) {
    pthread_mutex_lock(&rec.lock);
    int n = rec.calls;
    pthread_mutex_unlock(&rec.lock);
    return n;
}

static const hkn_engine engine = {.apply = rec_apply,
                                  .rollback = rec_rollback,
                                  .version = rec_version,
                                  .metrics = rec_metrics,
                                  .ud = NULL,
                                  .release = rec_release};

/* ---- fixture ----------------------------------------------------------- */

static char *tmp;      /* per test */
static hkn_seckey key; /* trusted */
static char base[64];  /* http://127.0.0.1:PORT */
static char key_path[PATH_MAX], src_path[PATH_MAX];
static const char kernel_src[] = "extern \"C\" __global__ void add(float *x) { x[0] += 1; }\n";

/* When set, adjusts the configuration of the next start(). */
static void (*cfg_hook)(hk_endpoint_options *, hkn_endpoint_resolved *);
/* The Content-Type of curl_req's bodies, and whether they go chunked. */
static const char *body_type = "application/json";
static int chunked;

static void start(const char *token, size_t max_body, const char *cert, const char *pkey) {
    hk_endpoint_options o;
    hkn_endpoint_resolved r = {0};
    hk_report rep = HK_REPORT_INIT;
    hk_endpoint_options_init(&o);
    o.port = 0;
    o.token = token;
    if (max_body)
        o.max_body_bytes = max_body;
    r.tls_cert_pem = cert;
    r.tls_key_pem = pkey;
    r.trust.keys[0] = key.pub;
    r.trust.nkeys = 1;
    char sdir[PATH_MAX];
    snprintf(sdir, sizeof sdir, "%s/state", tmp);
    r.state_dir = sdir;
    if (cfg_hook)
        cfg_hook(&o, &r);
    int err = hkn_endpoint_start(&o, &r, &engine, &ep, &rep);
    ck_assert_msg(err == 0, "endpoint: %s", rep.message);
    ck_assert_uint_ne(hkn_endpoint_port(ep), 0);
    snprintf(base, sizeof base, "%s://127.0.0.1:%u", cert ? "https" : "http",
             hkn_endpoint_port(ep));
}

static void setup(void) {
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    ck_assert_int_eq(hkn_keygen(&key), 0);
    snprintf(key_path, sizeof key_path, "%s/hotkern.key", tmp);
    snprintf(src_path, sizeof src_path, "%s/add.cu", tmp);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_seckey_save(key_path, &key, &rep), 0);
    ck_assert_int_eq(hkt_write_file(src_path, kernel_src), 0);
}

static void teardown(void) {
    cfg_hook = NULL;
    body_type = "application/json";
    chunked = 0;
    hkn_endpoint_stop(ep);
    ep = NULL;
    hkt_rmtree(tmp);
    free(tmp);
}

/* ---- running clients --------------------------------------------------- */

/* Runs argv (under `timeout 30`), stdout and stderr into out; returns the
 * exit status, or -1. */
static int run(char *const argv[], char *out, size_t cap) {
    char *args[64];
    int n = 0;
    args[n++] = "timeout";
    args[n++] = "30";
    for (int i = 0; argv[i] && n < 63; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        execvp(args[0], args);
        _exit(127);
    }
    close(pfd[1]);
    size_t len = 0;
    ssize_t r;
    char sink[4096];
    while ((r = read(pfd[0], len + 1 < cap ? out + len : sink,
                     len + 1 < cap ? cap - 1 - len : sizeof sink)) > 0)
        if (len + 1 < cap)
            len += (size_t)r;
    out[len] = '\0';
    close(pfd[0]);
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* One more request header for curl_req, or NULL. */
static const char *extra_header;

/* curl METHOD URL [-d @file] [-H auth]: returns the HTTP code, body in
 * out_body (a file under tmp). */
static int curl_req(const char *method, const char *path, const char *body_file, const char *token,
                    char *body, size_t cap) {
    char url[256], resp[PATH_MAX], data[PATH_MAX], auth[256], code[64], ctype[128];
    snprintf(url, sizeof url, "%s%s", base, path);
    snprintf(resp, sizeof resp, "%s/resp.txt", tmp);
    char *argv[24];
    int n = 0;
    argv[n++] = "curl";
    argv[n++] = "-s";
    argv[n++] = "-k";
    argv[n++] = "-o";
    argv[n++] = resp;
    argv[n++] = "-w";
    argv[n++] = "%{http_code}";
    argv[n++] = "-X";
    argv[n++] = (char *)method;
    if (body_file) {
        snprintf(data, sizeof data, "@%s", body_file);
        argv[n++] = "--data-binary";
        argv[n++] = data;
        snprintf(ctype, sizeof ctype, "Content-Type: %s", body_type);
        argv[n++] = "-H";
        argv[n++] = ctype;
        if (chunked) {
            argv[n++] = "-H";
            argv[n++] = "Transfer-Encoding: chunked";
        }
    }
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        argv[n++] = "-H";
        argv[n++] = auth;
    }
    if (extra_header) {
        argv[n++] = "-H";
        argv[n++] = (char *)extra_header;
    }
    argv[n++] = url;
    argv[n] = NULL;
    unlink(resp);
    run(argv, code, sizeof code);
    if (body) {
        body[0] = '\0';
        FILE *f = fopen(resp, "r");
        if (f) {
            size_t r = fread(body, 1, cap - 1, f);
            body[r] = '\0';
            fclose(f);
        }
    }
    return atoi(code);
}

static const char *cli_path(void) {
    static char path[PATH_MAX];
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert(n > 0);
    exe[n] = '\0';
    /* BUILD/tests/cpu_endpoint -> BUILD/bin/hotkern */
    snprintf(path, sizeof path, "%s/../bin/hotkern", dirname(exe));
    ck_assert_msg(access(path, X_OK) == 0, "the hotkern CLI is not built at %s", path);
    return path;
}

/* ---- request bodies ---------------------------------------------------- */

enum tamper { T_NONE, T_MANIFEST, T_NO_SIG, T_BYTES, T_NO_ARTIFACT };

/* Writes a push body for `module` v`version` signed by k into tmp/NAME and
 * returns its path (valid for the next 15 calls). */
static const char *body_file(const hkn_seckey *k, const char *module, uint64_t version,
                             int64_t expires, enum tamper t, const char *name) {
    static char paths[16][PATH_MAX];
    static int next;
    char *path = paths[next++ % 16];
    char *manifest, *sig;
    size_t mlen;
    hk_report rep = HK_REPORT_INIT;
    hkn_blob b = {.name = "add.cu", .bytes = kernel_src, .size = strlen(kernel_src)};
    ck_assert_int_eq(hkn_release_sign(k, module, version, time(NULL), expires, &b, 1, &manifest,
                                      &mlen, &sig, &rep),
                     0);
    if (t == T_MANIFEST)
        *strstr(manifest, "\"created\":") = ' '; /* any byte change breaks the signature */
    char hex[65];
    hkn_sha256_hex(kernel_src, strlen(kernel_src), hex);
    char src[sizeof kernel_src];
    memcpy(src, kernel_src, sizeof src);
    if (t == T_BYTES)
        src[0] = 'X';
    char b64[256];
    sodium_bin2base64(b64, sizeof b64, (const unsigned char *)src, strlen(src),
                      sodium_base64_VARIANT_ORIGINAL);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "manifest", manifest);
    if (t != T_NO_SIG)
        cJSON_AddStringToObject(o, "signature", sig);
    cJSON *arts = cJSON_AddObjectToObject(o, "artifacts");
    if (t != T_NO_ARTIFACT)
        cJSON_AddStringToObject(arts, hex, b64);
    char *text = cJSON_PrintUnformatted(o);
    snprintf(path, PATH_MAX, "%s/%s", tmp, name);
    ck_assert_int_eq(hkt_write_file(path, text), 0);
    free(text);
    cJSON_Delete(o);
    free(manifest);
    free(sig);
    return path;
}

static int json_has(const char *body, const char *field, const char *value) {
    cJSON *o = cJSON_Parse(body);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    int ok = cJSON_IsString(v) && !strcmp(v->valuestring, value);
    cJSON_Delete(o);
    return ok;
}

/* ---- tests ------------------------------------------------------------- */

START_TEST(push_with_curl_commits) {
    start(NULL, 0, NULL, NULL);
    char body[8192];
    int code = curl_req("POST", "/v1/release",
                        body_file(&key, "add", 5, time(NULL) + 60, T_NONE, "b.json"), NULL, body,
                        sizeof body);
    ck_assert_msg(code == 200, "HTTP %d: %s", code, body);
    ck_assert(json_has(body, "outcome", "committed"));
    ck_assert(json_has(body, "module", "add"));
    pthread_mutex_lock(&rec.lock);
    ck_assert_int_eq(rec.calls, 1);
    ck_assert_str_eq(rec.module, "add");
    ck_assert_uint_eq(rec.version, 5);
    ck_assert_int_eq(rec.fmt, HK_FORMAT_CUDA_C);
    ck_assert_str_eq(rec.origin, "push");
    ck_assert_uint_eq(rec.size, strlen(kernel_src));
    ck_assert_mem_eq(rec.bytes, kernel_src, rec.size);
    pthread_mutex_unlock(&rec.lock);
    /* Status shows the release. */
    code = curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body);
    ck_assert_int_eq(code, 200);
    cJSON *o = cJSON_Parse(body);
    const cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "modules"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(m0, "module")->valuestring, "add");
    ck_assert_int_eq((int)cJSON_GetObjectItem(m0, "release_version")->valuedouble, 5);
    ck_assert_str_eq(cJSON_GetObjectItem(m0, "last_outcome")->valuestring, "committed");
    cJSON_Delete(o);
    ck_assert_int_eq(curl_req("GET", "/healthz", NULL, NULL, NULL, 0), 200);
    ck_assert_int_eq(curl_req("GET", "/nope", NULL, NULL, NULL, 0), 404);
    ck_assert_int_eq(curl_req("GET", "/v1/release", NULL, NULL, NULL, 0), 405);
}
END_TEST

START_TEST(push_with_cli_commits) {
    start(NULL, 0, NULL, NULL);
    const char *cli = cli_path();
    char out[16384];
    char *push[] = {(char *)cli, "push",      base, "--key",  key_path, "--module",
                    "add",       "--release", "42", src_path, NULL};
    int rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    ck_assert_msg(strstr(out, "committed"), "%s", out);
    ck_assert_uint_eq(rec_current(), 42);
    pthread_mutex_lock(&rec.lock);
    ck_assert_mem_eq(rec.bytes, kernel_src, strlen(kernel_src));
    pthread_mutex_unlock(&rec.lock);
    /* The same version again: refused as a replay, exit 1. */
    rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_REPLAY"), "exit %d: %s", rc, out);
    /* Default version (unix ms) is newer than 42. */
    char *push2[] = {(char *)cli, "push", base,     "--key", key_path,
                     "--module",  "add",  src_path, NULL};
    rc = run(push2, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    ck_assert(rec_current() > 1000000000000ull);

    char *status[] = {(char *)cli, "status", base, NULL};
    rc = run(status, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "\nadd ") && strstr(out, "committed"), "exit %d: %s", rc,
                  out);
    /* A signed rollback, to the previous release the status reports. */
    char *rb[] = {(char *)cli, "rollback", base, "add", "--key", key_path, NULL};
    rc = run(rb, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "rolled_back"), "exit %d: %s", rc, out);
    char *rb2[] = {(char *)cli, "rollback", base, "nosuch", "--key", key_path, "--to", "1", NULL};
    rc = run(rb2, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_NOT_FOUND"), "exit %d: %s", rc, out);
    char *help[] = {(char *)cli, "push", "--help", NULL};
    ck_assert_int_eq(run(help, out, sizeof out), 0);
    char *bad[] = {(char *)cli, "push", base, NULL};
    ck_assert_int_eq(run(bad, out, sizeof out), 2);
}
END_TEST

/* A kernel that includes "common.cuh", pushed with it, builds where the
 * header does not exist as a file: the endpoint hands it to the engine. */
START_TEST(push_carries_headers) {
    start(NULL, 0, NULL, NULL);
    const char *cli = cli_path();
    char out[16384], hpath[PATH_MAX + 16], kpath[PATH_MAX + 16];
    static const char ksrc[] = "#include \"common.cuh\"\n"
                               "__device__ int arr[K];\n"
                               "extern \"C\" __global__ void add(int *x) { x[0] = arr[1]; }\n";
    snprintf(hpath, sizeof hpath, "%s/common.cuh", tmp);
    snprintf(kpath, sizeof kpath, "%s/k.cu", tmp);
    ck_assert_int_eq(hkt_write_file(hpath, "#define K 6\n"), 0);
    ck_assert_int_eq(hkt_write_file(kpath, ksrc), 0);
    char *push[] = {(char *)cli, "push", base,  "--key", key_path,
                    "--module",  "k",    hpath, kpath,   NULL};
    int rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    pthread_mutex_lock(&rec.lock);
    ck_assert_int_eq(rec.fmt, HK_FORMAT_CUDA_C);
    ck_assert_int_eq(rec.nheaders, 1);
    ck_assert_str_eq(rec.hname[0], "common.cuh");
    ck_assert_str_eq(rec.hdata[0], "#define K 6\n");
    pthread_mutex_unlock(&rec.lock);
    /* Build on this thread once the server's threads are joined: NVRTC and
     * libmicrohttpd both use libc's time-zone state, whose lock the thread
     * sanitizer cannot see. */
    hkn_endpoint_stop(ep);
    ep = NULL;
    pthread_mutex_lock(&rec.lock);
    hk_header h = {rec.hname[0], rec.hdata[0], strlen(rec.hdata[0])};
    hkp_build_opts o = {.arch = 90,
                        .ptx_to_cubin = 1,
                        .opt_level = 3,
                        .headers = &h,
                        .nheaders = 1,
                        .source_name = "k@v1"};
    hkp_artifact a;
    char why[512];
    int err = hkp_build(rec.bytes, rec.size, rec.fmt, &o, &a, why, sizeof why);
    pthread_mutex_unlock(&rec.lock);
    ck_assert_msg(err == 0, "%s\n%s", why, a.log ? a.log : "");
    ck_assert_int_eq(a.meta.nglobals, 1);
    ck_assert_uint_eq(a.meta.globals[0].size, 6 * sizeof(int));
    hkp_artifact_free(&a);
}
END_TEST

START_TEST(refusals_change_nothing) {
    start(NULL, 0, NULL, NULL);
    char body[16384];
    int code = curl_req("POST", "/v1/release",
                        body_file(&key, "add", 5, time(NULL) + 60, T_NONE, "ok.json"), NULL, body,
                        sizeof body);
    ck_assert_int_eq(code, 200);
    ck_assert_uint_eq(rec_current(), 5);
    hkn_seckey stranger;
    hkn_keygen(&stranger);
    struct {
        const char *what;
        const char *file;
        int code;
        const char *error;
    } cases[] = {
        {"bad signature", body_file(&key, "add", 9, time(NULL) + 60, T_MANIFEST, "c1.json"), 403,
         "HK_ERR_SIGNATURE"},
        {"missing signature", body_file(&key, "add", 9, time(NULL) + 60, T_NO_SIG, "c2.json"), 403,
         "HK_ERR_SIGNATURE"},
        {"unknown key", body_file(&stranger, "add", 9, time(NULL) + 60, T_NONE, "c3.json"), 403,
         "HK_ERR_SIGNATURE"},
        {"same version", body_file(&key, "add", 5, time(NULL) + 60, T_NONE, "c4.json"), 409,
         "HK_ERR_REPLAY"},
        {"lower version", body_file(&key, "add", 4, time(NULL) + 60, T_NONE, "c5.json"), 409,
         "HK_ERR_REPLAY"},
        {"expired", body_file(&key, "add", 9, time(NULL) - 5, T_NONE, "c6.json"), 403,
         "HK_ERR_EXPIRED"},
        {"hash mismatch", body_file(&key, "add", 9, time(NULL) + 60, T_BYTES, "c7.json"), 422,
         "HK_ERR_HASH"},
        {"artifact missing", body_file(&key, "add", 9, time(NULL) + 60, T_NO_ARTIFACT, "c8.json"),
         422, "HK_ERR_HASH"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        code = curl_req("POST", "/v1/release", cases[i].file, NULL, body, sizeof body);
        ck_assert_msg(code == cases[i].code, "%s: HTTP %d (want %d): %s", cases[i].what, code,
                      cases[i].code, body);
        ck_assert_msg(json_has(body, "error", cases[i].error), "%s: %s", cases[i].what, body);
        ck_assert_msg(json_has(body, "outcome", "refused"), "%s: %s", cases[i].what, body);
        ck_assert_uint_eq(rec_current(), 5);
        ck_assert_int_eq(rec_calls(), 1);
    }
    /* Not JSON at all. */
    char junk[PATH_MAX];
    snprintf(junk, sizeof junk, "%s/junk.json", tmp);
    hkt_write_file(junk, "this is not json");
    ck_assert_int_eq(curl_req("POST", "/v1/release", junk, NULL, body, sizeof body), 400);

    /* The engine refuses the build: 422 with the log, and the CLI prints it. */
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = HK_ERR_COMPILE;
    pthread_mutex_unlock(&rec.lock);
    code = curl_req("POST", "/v1/release",
                    body_file(&key, "add", 10, time(NULL) + 60, T_NONE, "c9.json"), NULL, body,
                    sizeof body);
    ck_assert_msg(code == 422 && json_has(body, "error", "HK_ERR_COMPILE"), "%d %s", code, body);
    cJSON *o = cJSON_Parse(body);
    ck_assert_ptr_nonnull(strstr(cJSON_GetObjectItem(o, "log")->valuestring, "expected a"));
    cJSON_Delete(o);
    char out[8192];
    char *push[] = {(char *)cli_path(), "push", base,     "--key", key_path, "--module", "add",
                    "--release",        "11",   src_path, NULL};
    int rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_COMPILE") && strstr(out, "error: expected a"),
                  "exit %d: %s", rc, out);
    ck_assert_uint_eq(rec_current(), 5);
    /* Status keeps the last outcome and log. */
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body), 200);
    ck_assert_ptr_nonnull(strstr(body, "expected a"));
    /* A refused build did not burn the version: the fixed kernel can be
     * pushed under it. */
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = 0;
    pthread_mutex_unlock(&rec.lock);
    char fixed[PATH_MAX + 16];
    snprintf(fixed, sizeof fixed, "%s/fixed.cu", tmp);
    ck_assert_int_eq(hkt_write_file(fixed, "extern \"C\" __global__ void add(float *x) {}\n"), 0);
    push[9] = fixed;
    rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    ck_assert_uint_eq(rec_current(), 11);
}
END_TEST

/* The engine's verdicts have the statuses net.h documents: a canary's
 * refusal is the release's fault (422), a quarantined image a conflict with
 * what the engine knows (409). */
START_TEST(engine_refusal_statuses) {
    start(NULL, 0, NULL, NULL);
    static const struct {
        int err;
        int code;
    } cases[] = {{HK_ERR_CANARY, 422}, {HK_ERR_QUARANTINED, 409}, {HK_ERR_COMPILE, 422}};
    char body[8192], name[32];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pthread_mutex_lock(&rec.lock);
        rec.fail_with = cases[i].err;
        pthread_mutex_unlock(&rec.lock);
        snprintf(name, sizeof name, "r%zu.json", i);
        int code = curl_req("POST", "/v1/release",
                            body_file(&key, "add", 5 + i, time(NULL) + 60, T_NONE, name), NULL,
                            body, sizeof body);
        ck_assert_msg(code == cases[i].code, "%s: HTTP %d (want %d): %s", hk_err_name(cases[i].err),
                      code, cases[i].code, body);
        ck_assert(json_has(body, "error", hk_err_name(cases[i].err)));
    }
}
END_TEST

/* 1 when out holds a byte that drives a terminal: C0 but LF and tab, DEL,
 * a C1 control (UTF-8 C2 80..9F), or 0xff. */
static int has_escape(const char *out) {
    for (const unsigned char *p = (const unsigned char *)out; *p; p++)
        if ((*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7f || *p == 0xff ||
            (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f))
            return 1;
    return 0;
}

/* A hostile endpoint's strings (a refusal's message and log, the status) are
 * printed by the CLI with their control bytes shown, never sent to the
 * terminal. */
START_TEST(cli_prints_no_terminal_escapes) {
    start(NULL, 0, NULL, NULL);
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = HK_ERR_COMPILE;
    rec.hostile = 1;
    pthread_mutex_unlock(&rec.lock);
    const char *cli = cli_path();
    char out[16384];
    char *push[] = {(char *)cli, "push",      base, "--key",  key_path, "--module",
                    "add",       "--release", "3",  src_path, NULL};
    int rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "compile failed"), "exit %d: %s", rc, out);
    ck_assert_msg(!has_escape(out), "raw control bytes printed: %s", out);
    ck_assert_msg(strstr(out, "\\x1b[2J") && strstr(out, "\\xc2\\x9b31m") && strstr(out, "\\xff"),
                  "%s", out);
    char *status[] = {(char *)cli, "status", base, NULL};
    rc = run(status, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "compile failed"), "exit %d: %s", rc, out);
    ck_assert_msg(!has_escape(out), "raw control bytes printed: %s", out);
    char *rb[] = {(char *)cli, "rollback", base, "add", "--key", key_path, "--to", "1", NULL};
    rc = run(rb, out, sizeof out);
    ck_assert_msg(rc == 1 && !has_escape(out), "exit %d: %s", rc, out);
}
END_TEST

static int rec_attempts(void) {
    pthread_mutex_lock(&rec.lock);
    int n = rec.attempts;
    pthread_mutex_unlock(&rec.lock);
    return n;
}

/* A release the engine refused (its record taken back, so that a fixed
 * kernel may reuse the version) is not built again when the same signed
 * bytes come back: each replay is answered at once with the first
 * refusal's error, status and reason. A transient refusal is not
 * remembered, and a release signed anew is a new release. */
START_TEST(refused_release_not_rebuilt) {
    start(NULL, 0, NULL, NULL);
    char body[16384];
    static const int verdicts[] = {HK_ERR_COMPILE, HK_ERR_CANARY, HK_ERR_MISSING_KERNEL};
    for (size_t v = 0; v < sizeof verdicts / sizeof verdicts[0]; v++) {
        pthread_mutex_lock(&rec.lock);
        rec.fail_with = verdicts[v];
        pthread_mutex_unlock(&rec.lock);
        int before = rec_attempts();
        char name[32];
        snprintf(name, sizeof name, "v%zu.json", v);
        const char *f = body_file(&key, "add", 10 + v, time(NULL) + 60, T_NONE, name);
        int first = curl_req("POST", "/v1/release", f, NULL, body, sizeof body);
        ck_assert_msg(first == 422, "%d %s", first, body);
        ck_assert_int_eq(rec_attempts(), before + 1);
        for (int i = 0; i < 20; i++) {
            int code = curl_req("POST", "/v1/release", f, NULL, body, sizeof body);
            ck_assert_msg(code == first, "replay %d: HTTP %d (first %d): %s", i, code, first, body);
            ck_assert(json_has(body, "error", hk_err_name(verdicts[v])));
            ck_assert(json_has(body, "outcome", "refused"));
            ck_assert_msg(strstr(body, "refused before") && strstr(body, "compile failed"), "%s",
                          body);
            cJSON *o = cJSON_Parse(body);
            ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(o, "refused_before")));
            cJSON_Delete(o);
        }
        ck_assert_int_eq(rec_attempts(), before + 1);
    }
    /* Signed anew (another expiry, so other bytes): built again. */
    int before = rec_attempts();
    const char *again = body_file(&key, "add", 12, time(NULL) + 61, T_NONE, "again.json");
    ck_assert_int_eq(curl_req("POST", "/v1/release", again, NULL, body, sizeof body), 422);
    ck_assert_int_eq(rec_attempts(), before + 1);
    /* Busy is the host's state, not the release's: tried again. */
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = HK_ERR_BUSY;
    pthread_mutex_unlock(&rec.lock);
    const char *busy = body_file(&key, "add", 13, time(NULL) + 60, T_NONE, "busy.json");
    ck_assert_int_eq(curl_req("POST", "/v1/release", busy, NULL, body, sizeof body), 503);
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = 0;
    pthread_mutex_unlock(&rec.lock);
    ck_assert_int_eq(curl_req("POST", "/v1/release", busy, NULL, body, sizeof body), 200);
    ck_assert_uint_eq(rec_current(), 13);
    ck_assert_int_eq(curl_req("GET", "/metrics", NULL, NULL, body, sizeof body), 200);
    ck_assert_msg(strstr(body, "hotkern_push_refused_again_total 60\n"), "%s", body);
}
END_TEST

/* A required canary that could not run (its helper died or did not
 * answer) and a build that timed out on a loaded host are the host's state,
 * not verdicts on the release: not remembered, so the same signed bytes are
 * tried again (503 and 504 each time, the engine run each time), and
 * applied once the host is well. */
START_TEST(transient_refusals_are_tried_again) {
    start(NULL, 0, NULL, NULL);
    char body[16384];
    static const struct {
        int err;
        int code;
    } cases[] = {{HK_ERR_CANARY_UNAVAILABLE, 503}, {HK_ERR_TIMEOUT, 504}};
    const char *f = body_file(&key, "add", 20, time(NULL) + 60, T_NONE, "transient.json");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pthread_mutex_lock(&rec.lock);
        rec.fail_with = cases[i].err;
        pthread_mutex_unlock(&rec.lock);
        for (int k = 0; k < 3; k++) {
            int before = rec_attempts();
            int code = curl_req("POST", "/v1/release", f, NULL, body, sizeof body);
            ck_assert_msg(code == cases[i].code, "%s: HTTP %d (want %d): %s",
                          hk_err_name(cases[i].err), code, cases[i].code, body);
            ck_assert(json_has(body, "error", hk_err_name(cases[i].err)));
            ck_assert_msg(!strstr(body, "refused before"), "%s", body);
            ck_assert_int_eq(rec_attempts(), before + 1);
        }
    }
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = 0;
    pthread_mutex_unlock(&rec.lock);
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, body, sizeof body), 200);
    ck_assert_uint_eq(rec_current(), 20);
}
END_TEST

START_TEST(replay_state_survives_restart) {
    start(NULL, 0, NULL, NULL);
    const char *f = body_file(&key, "add", 7, time(NULL) + 60, T_NONE, "b.json");
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, NULL, 0), 200);
    hkn_endpoint_stop(ep);
    ep = NULL;
    start(NULL, 0, NULL, NULL); /* same state dir */
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, NULL, 0), 409);
    ck_assert_int_eq(rec_calls(), 1);
}
END_TEST

/* Sends only headers claiming a huge body and reads the answer: a 413 that
 * arrives proves the server answered without reading the body. */
static void raw_request(const char *req, char *out, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(hkn_endpoint_port(ep))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ck_assert_int_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    size_t len = 0;
    ssize_t r;
    while (len + 1 < cap && (r = recv(fd, out + len, cap - 1 - len, 0)) > 0)
        len += (size_t)r;
    out[len] = '\0';
    close(fd);
}

START_TEST(oversized_body_413) {
    start(NULL, 64 * 1024, NULL, NULL);
    char out[4096];
    raw_request("POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n",
                out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 413", 12), "got: %s", out);
    ck_assert_ptr_nonnull(strstr(out, "HK_ERR_TOO_LARGE"));

    /* curl with a real 256 KiB body (it sends Expect: 100-continue). */
    char big[PATH_MAX];
    snprintf(big, sizeof big, "%s/big.json", tmp);
    FILE *f = fopen(big, "w");
    for (int i = 0; i < 256 * 1024 / 8; i++)
        fputs("xxxxxxxx", f);
    fclose(f);
    ck_assert_int_eq(curl_req("POST", "/v1/release", big, NULL, NULL, 0), 413);

    /* Chunked, so no Content-Length: cut off once it passes the cap. */
    char data[PATH_MAX + 1], url[256], code[64];
    snprintf(data, sizeof data, "@%s", big);
    snprintf(url, sizeof url, "%s/v1/release", base);
    char *argv[] = {"curl",
                    "-s",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "-H",
                    "Transfer-Encoding: chunked",
                    "-H",
                    "Content-Type: application/json",
                    "--data-binary",
                    data,
                    url,
                    NULL};
    run(argv, code, sizeof code);
    ck_assert_msg(atoi(code) == 413, "chunked oversized body answered %s", code);
    ck_assert_int_eq(rec_calls(), 0);
    /* The server is still fine afterwards. */
    ck_assert_int_eq(curl_req("GET", "/healthz", NULL, NULL, NULL, 0), 200);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "ok.json"), NULL,
                              NULL, 0),
                     200);
}
END_TEST

START_TEST(token_required) {
    start("s3cret-token", 0, NULL, NULL);
    const char *f = body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "b.json");
    char body[4096];
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, body, sizeof body), 401);
    /* A missing token is a refused request, not a bad signature. */
    ck_assert_msg(json_has(body, "error", "HK_ERR_REJECTED"), "%s", body);
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, "wrong", NULL, 0), 401);
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 401);
    ck_assert_int_eq(curl_req("GET", "/metrics", NULL, "s3cret-tokenX", NULL, 0), 401);
    ck_assert_int_eq(curl_req("GET", "/healthz", NULL, NULL, NULL, 0), 200);
    ck_assert_int_eq(rec_calls(), 0);
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, "s3cret-token", NULL, 0), 200);
    ck_assert_int_eq(rec_calls(), 1);
    char out[4096];
    char *push[] = {(char *)cli_path(), "push", base,     "--key", key_path,
                    "--module",         "add",  src_path, NULL};
    ck_assert_int_eq(run(push, out, sizeof out), 1);
    char *push2[] = {(char *)cli_path(), "push",     base,  "--key",
                     key_path,           "--module", "add", "--token",
                     "s3cret-token",     src_path,   NULL};
    int rc = run(push2, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
}
END_TEST

START_TEST(hundred_concurrent_status) {
    start(NULL, 0, NULL, NULL);
    char url[256], outs[PATH_MAX], codes[8192];
    snprintf(url, sizeof url, "%s/v1/status?n=[1-100]", base);
    snprintf(outs, sizeof outs, "%s/status_#1.json", tmp);
    /* curl's parallel mode opens all 100 connections at once. */
    char *argv[] = {"curl",
                    "-s",
                    "-Z",
                    "--parallel-immediate",
                    "--parallel-max",
                    "100",
                    "-o",
                    outs,
                    "-w",
                    "%{http_code}\\n",
                    url,
                    NULL};
    ck_assert_int_eq(run(argv, codes, sizeof codes), 0);
    int ok = 0;
    for (char *line = strtok(codes, "\n"); line; line = strtok(NULL, "\n"))
        ok += !strcmp(line, "200");
    ck_assert_int_eq(ok, 100);
    for (int i = 1; i <= 100; i++) {
        char p[PATH_MAX], *text = NULL;
        size_t len;
        snprintf(p, sizeof p, "%s/status_%d.json", tmp, i);
        ck_assert_int_eq(hku_read_file(p, 1 << 20, &text, &len, NULL), 0);
        cJSON *o = cJSON_Parse(text);
        ck_assert_msg(cJSON_IsArray(cJSON_GetObjectItem(o, "modules")), "%d: %s", i, text);
        cJSON_Delete(o);
        free(text);
    }
}
END_TEST

/* A line-by-line check of the Prometheus text exposition format. */
static void check_prometheus(char *text) {
    char typed[64][96];
    int ntyped = 0, samples = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char name[96], kind[32];
        if (!strncmp(line, "# HELP ", 7))
            continue;
        if (sscanf(line, "# TYPE %95s %31s", name, kind) == 2) {
            ck_assert_msg(!strcmp(kind, "counter") || !strcmp(kind, "gauge") ||
                              !strcmp(kind, "histogram"),
                          "%s", line);
            ck_assert(ntyped < 64);
            strcpy(typed[ntyped++], name);
            continue;
        }
        ck_assert_msg(line[0] != '#', "stray comment: %s", line);
        size_t n = strspn(line, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:");
        ck_assert_msg(n > 0 && n < sizeof name, "bad name: %s", line);
        memcpy(name, line, n);
        name[n] = '\0';
        const char *rest = line + n;
        if (*rest == '{') {
            const char *end = strchr(rest, '}');
            ck_assert_msg(end && strchr(rest, '=') && strchr(rest, '"'), "bad labels: %s", line);
            rest = end + 1;
        }
        ck_assert_msg(*rest == ' ', "no value: %s", line);
        char *endp;
        strtod(rest + 1, &endp);
        ck_assert_msg(endp != rest + 1 && *endp == '\0', "bad value: %s", line);
        int declared = 0;
        /* A histogram's samples are its name with _bucket, _sum or _count. */
        for (int i = 0; i < ntyped; i++) {
            size_t tl = strlen(typed[i]);
            declared |= !strcmp(typed[i], name) ||
                        (!strncmp(typed[i], name, tl) &&
                         (!strcmp(name + tl, "_bucket") || !strcmp(name + tl, "_sum") ||
                          !strcmp(name + tl, "_count")));
        }
        ck_assert_msg(declared, "no TYPE for %s", name);
        samples++;
    }
    ck_assert_int_ge(samples, 15);
}

START_TEST(metrics_are_prometheus_text) {
    start(NULL, 0, NULL, NULL);
    const char *f = body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "b.json");
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, NULL, 0), 200);
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, NULL, 0), 409);
    char body[16384];
    ck_assert_int_eq(curl_req("GET", "/metrics", NULL, NULL, body, sizeof body), 200);
    ck_assert_ptr_nonnull(strstr(body, "hotkern_swaps_total 1\n"));
    ck_assert_ptr_nonnull(strstr(body, "hotkern_push_releases_total{outcome=\"committed\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(body, "hotkern_push_refusals_total{error=\"HK_ERR_REPLAY\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(body, "hotkern_module_release_version{module=\"add\"} 3\n"));
    ck_assert_msg(strstr(body, "hotkern_stage_seconds_total 0.042\n"), "%s", body);
    ck_assert_ptr_nonnull(strstr(body, "hotkern_retired_loaded 0\n"));
    check_prometheus(body);
}
END_TEST

START_TEST(tls_with_self_signed_cert) {
    char cert[PATH_MAX], pkey[PATH_MAX], out[4096];
    snprintf(cert, sizeof cert, "%s/cert.pem", tmp);
    snprintf(pkey, sizeof pkey, "%s/key.pem", tmp);
    char *gen[] = {"openssl",  "req",
                   "-x509",    "-newkey",
                   "rsa:2048", "-nodes",
                   "-keyout",  pkey,
                   "-out",     cert,
                   "-days",    "1",
                   "-subj",    "/CN=127.0.0.1",
                   "-addext",  "subjectAltName=IP:127.0.0.1",
                   NULL};
    ck_assert_msg(run(gen, out, sizeof out) == 0, "openssl: %s", out);
    char *cert_pem, *key_pem;
    size_t len;
    ck_assert_int_eq(hku_read_file(cert, 1 << 20, &cert_pem, &len, NULL), 0);
    ck_assert_int_eq(hku_read_file(pkey, 1 << 20, &key_pem, &len, NULL), 0);
    start("tok", 0, cert_pem, key_pem);
    free(cert_pem);
    free(key_pem);
    char url[256], code[64];
    snprintf(url, sizeof url, "%s/healthz", base);
    char *verify[] = {"curl",         "-s",       "-o", "/dev/null", "-w",
                      "%{http_code}", "--cacert", cert, url,         NULL};
    ck_assert_int_eq(run(verify, code, sizeof code), 0);
    ck_assert_str_eq(code, "200");
    /* Without the CA the certificate is refused by the client. */
    char *noca[] = {"curl", "-s", "-o", "/dev/null", url, NULL};
    ck_assert_int_ne(run(noca, code, sizeof code), 0);
    char *push[] = {(char *)cli_path(), "push", base,       "--key", key_path, "--module", "add",
                    "--token",          "tok",  "--cacert", cert,    src_path, NULL};
    int rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    ck_assert_int_eq(rec_calls(), 1);
}
END_TEST

/* ---- authority, names, limits ------------------------------------------ */

/* Writes a signed rollback request body for module to target into tmp/name. */
static const char *rollback_file(const hkn_seckey *k, const char *module, uint64_t target,
                                 const char *name) {
    static char path[PATH_MAX];
    char *text, *sig;
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_rollback_sign(k, module, target, time(NULL) + 60, hkn_endpoint_id(ep),
                                       &text, &len, &sig, &rep),
                     0);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "request", text);
    cJSON_AddStringToObject(o, "signature", sig);
    char *body = cJSON_PrintUnformatted(o);
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    ck_assert_int_eq(hkt_write_file(path, body), 0);
    free(body);
    cJSON_Delete(o);
    free(text);
    free(sig);
    return path;
}

static int rollbacks(void) {
    pthread_mutex_lock(&rec.lock);
    int n = rec.rollbacks;
    pthread_mutex_unlock(&rec.lock);
    return n;
}

static void no_keys_unsigned(hk_endpoint_options *o, hkn_endpoint_resolved *r) {
    (void)o;
    r->trust.nkeys = 0;
    r->trust.allow_unsigned = 1;
}

START_TEST(rollback_needs_authority) {
    start(NULL, 0, NULL, NULL);
    char body[8192], hdr[128];
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 5, time(NULL) + 60, T_NONE, "5.json"), NULL,
                              NULL, 0),
                     200);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 6, time(NULL) + 60, T_NONE, "6.json"), NULL,
                              NULL, 0),
                     200);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 7, time(NULL) + 60, T_NONE, "7.json"), NULL,
                              NULL, 0),
                     200);
    /* No token configured, trusted keys are: an unsigned rollback is refused. */
    int code = curl_req("POST", "/v1/rollback/add", NULL, NULL, body, sizeof body);
    ck_assert_msg(code == 403 && json_has(body, "error", "HK_ERR_SIGNATURE"), "%d %s", code, body);
    /* Signed by a stranger: refused. */
    hkn_seckey stranger;
    hkn_keygen(&stranger);
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&stranger, "add", 5, "s.json"), NULL,
                    body, sizeof body);
    ck_assert_msg(code == 403, "%d %s", code, body);
    /* Signed for another module than the URL's: refused. */
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "mul", 5, "m.json"), NULL, body,
                    sizeof body);
    ck_assert_msg(code == 403, "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 0);
    /* Signed, to the previous release: done, once. */
    const char *ok = rollback_file(&key, "add", 6, "r6.json");
    code = curl_req("POST", "/v1/rollback/add", ok, NULL, body, sizeof body);
    ck_assert_msg(code == 200 && json_has(body, "outcome", "rolled_back"), "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 1);
    code = curl_req("POST", "/v1/rollback/add", ok, NULL, body, sizeof body);
    ck_assert_msg(code == 409 && json_has(body, "error", "HK_ERR_REPLAY"), "%d %s", code, body);
    /* Now v6 runs; a request for v6 again names the wrong target. */
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "add", 6, "r6b.json"), NULL,
                    body, sizeof body);
    ck_assert_msg(code == 422 && json_has(body, "error", "HK_ERR_REJECTED"), "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 1);
    /* A web page's cross-origin request is refused, signed or not. */
    extra_header = "Origin: http://evil.example";
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "add", 0, "o.json"), NULL, body,
                    sizeof body);
    ck_assert_msg(code == 403 && json_has(body, "error", "HK_ERR_REJECTED"), "%d %s", code, body);
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 403);
    extra_header = "Origin: null";
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 403);
    /* The endpoint's own origin is fine. */
    snprintf(hdr, sizeof hdr, "Origin: %s", base);
    extra_header = hdr;
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "add", 5, "o2.json"), NULL,
                    body, sizeof body);
    ck_assert_msg(code == 200, "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 2);
    /* DNS rebinding: a Host that does not name the endpoint. */
    extra_header = "Host: evil.example";
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 403);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 9, time(NULL) + 60, T_NONE, "9.json"), NULL,
                              NULL, 0),
                     403);
    extra_header = "Host: 127.0.0.2";
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 403);
    snprintf(hdr, sizeof hdr, "Host: localhost:%u", hkn_endpoint_port(ep));
    extra_header = hdr;
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 200);
    extra_header = "Host: evil.example";
    ck_assert_int_eq(curl_req("GET", "/healthz", NULL, NULL, NULL, 0), 200);
    extra_header = NULL;
    ck_assert_int_eq(rec_calls(), 3);

    /* Neither a token nor a trusted key: rollback over HTTP is off. */
    hkn_endpoint_stop(ep);
    cfg_hook = no_keys_unsigned;
    start(NULL, 0, NULL, NULL);
    code = curl_req("POST", "/v1/rollback/add", NULL, NULL, body, sizeof body);
    ck_assert_msg(code == 403 && strstr(body, "off"), "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 2);
    /* The token is enough authority on its own. */
    hkn_endpoint_stop(ep);
    start("tok", 0, NULL, NULL);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 8, time(NULL) + 60, T_NONE, "8.json"), "tok",
                              NULL, 0),
                     200);
    ck_assert_int_eq(curl_req("POST", "/v1/rollback/add", NULL, NULL, NULL, 0), 401);
    code = curl_req("POST", "/v1/rollback/add", NULL, "tok", body, sizeof body);
    ck_assert_msg(code == 200, "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 3);
}
END_TEST

static void fleet_id(hk_endpoint_options *o, hkn_endpoint_resolved *r) {
    (void)r;
    o->endpoint_id = "gpu-17.fleet:7070";
}

/* A signed rollback request is for one endpoint: one signed for another
 * host of the fleet (or for none) is refused here, and the CLI signs for
 * the id the endpoint's status names, or the one it is given. */
START_TEST(rollback_bound_to_endpoint) {
    char body[8192], out[8192], host[256] = "", want[300];
    start(NULL, 0, NULL, NULL);
    gethostname(host, sizeof host - 1);
    snprintf(want, sizeof want, "%s:%u", host, hkn_endpoint_port(ep));
    /* The default id: host name and port. */
    if (hkn_valid_endpoint_id(want))
        ck_assert_str_eq(hkn_endpoint_id(ep), want);
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body), 200);
    ck_assert_msg(json_has(body, "endpoint_id", hkn_endpoint_id(ep)), "%s", body);
    hkn_endpoint_stop(ep);
    cfg_hook = fleet_id;
    start(NULL, 0, NULL, NULL);
    ck_assert_str_eq(hkn_endpoint_id(ep), "gpu-17.fleet:7070");
    for (int v = 1; v <= 3; v++) {
        char name[32];
        snprintf(name, sizeof name, "%d.json", v);
        ck_assert_int_eq(
            curl_req("POST", "/v1/release",
                     body_file(&key, "add", (uint64_t)v, time(NULL) + 60, T_NONE, name), NULL, NULL,
                     0),
            200);
    }
    /* Signed for another endpoint (as captured on its way to another host):
     * refused, nothing rolled back. */
    char *text, *sig;
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_rollback_sign(&key, "add", 2, time(NULL) + 60, "gpu-18.fleet:7070", &text,
                                       &len, &sig, &rep),
                     0);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "request", text);
    cJSON_AddStringToObject(o, "signature", sig);
    char *b = cJSON_PrintUnformatted(o), other[PATH_MAX];
    snprintf(other, sizeof other, "%s/other.json", tmp);
    ck_assert_int_eq(hkt_write_file(other, b), 0);
    free(b);
    cJSON_Delete(o);
    free(text);
    free(sig);
    int code = curl_req("POST", "/v1/rollback/add", other, NULL, body, sizeof body);
    ck_assert_msg(code == 403 && json_has(body, "error", "HK_ERR_SIGNATURE") &&
                      strstr(body, "gpu-18.fleet:7070"),
                  "%d %s", code, body);
    const char *cli = cli_path();
    char *rb_other[] = {(char *)cli,     "rollback",          base, "add", "--key", key_path,
                        "--endpoint-id", "gpu-18.fleet:7070", NULL};
    int rc = run(rb_other, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_SIGNATURE"), "exit %d: %s", rc, out);
    ck_assert_int_eq(rollbacks(), 0);
    /* The CLI takes the id and the target from the status, or is given them. */
    char *rb[] = {(char *)cli, "rollback", base, "add", "--key", key_path, NULL};
    rc = run(rb, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "rolled_back"), "exit %d: %s", rc, out);
    ck_assert_uint_eq(rec_current(), 2);
    char *rb_given[] = {(char *)cli, "rollback", base, "add",           "--key",
                        key_path,    "--to",     "1",  "--endpoint-id", "gpu-17.fleet:7070",
                        NULL};
    rc = run(rb_given, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "rolled_back"), "exit %d: %s", rc, out);
    ck_assert_uint_eq(rec_current(), 1);
    ck_assert_int_eq(rollbacks(), 2);
    char *rb_bad[] = {(char *)cli, "rollback",      base,  "add", "--key",
                      key_path,    "--endpoint-id", "a b", NULL};
    ck_assert_int_eq(run(rb_bad, out, sizeof out), 2);
    /* An id outside the alphabet is refused at start. */
    hkn_endpoint_stop(ep);
    ep = NULL;
    hk_endpoint_options eo;
    hkn_endpoint_resolved r = {0};
    hk_endpoint_options_init(&eo);
    eo.endpoint_id = "gpu 17\n";
    ck_assert_int_eq(hkn_endpoint_start(&eo, &r, &engine, &ep, &rep), HK_ERR_INVALID);
    ck_assert_ptr_null(ep);
    ck_assert_msg(strstr(rep.message, "endpoint_id"), "%s", rep.message);
}
END_TEST

/* Status and the signed rollback's target are the engine's: after another
 * source committed (a puller moved the engine on), status names what the
 * engine runs and would roll back to, and a request for a release the
 * engine would not commit is refused by the engine. */
START_TEST(rollback_target_is_the_engines) {
    start(NULL, 0, NULL, NULL);
    char body[16384];
    for (int v = 1; v <= 2; v++) {
        char name[32];
        snprintf(name, sizeof name, "%d.json", v);
        ck_assert_int_eq(
            curl_req("POST", "/v1/release",
                     body_file(&key, "add", (uint64_t)v, time(NULL) + 60, T_NONE, name), NULL, NULL,
                     0),
            200);
    }
    /* v3 committed by another source of the engine. */
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(rec_apply(NULL, "add", 3, HK_FORMAT_PTX, "x", 1, NULL, 0, "pull:x", &rep), 0);
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body), 200);
    cJSON *o = cJSON_Parse(body);
    const cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "modules"), 0);
    ck_assert_int_eq((int)cJSON_GetObjectItem(m0, "running_release_version")->valuedouble, 3);
    ck_assert_int_eq((int)cJSON_GetObjectItem(m0, "previous_release_version")->valuedouble, 2);
    cJSON_Delete(o);
    int code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "add", 1, "r1.json"), NULL,
                        body, sizeof body);
    ck_assert_msg(code == 422 && json_has(body, "error", "HK_ERR_REJECTED"), "%d %s", code, body);
    ck_assert_uint_eq(rec_current(), 3);
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "add", 2, "r2.json"), NULL,
                    body, sizeof body);
    ck_assert_msg(code == 200, "%d %s", code, body);
    ck_assert_uint_eq(rec_current(), 2);
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body), 200);
    o = cJSON_Parse(body);
    m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "modules"), 0);
    ck_assert_int_eq((int)cJSON_GetObjectItem(m0, "running_release_version")->valuedouble, 2);
    ck_assert_int_eq((int)cJSON_GetObjectItem(m0, "previous_release_version")->valuedouble, 1);
    cJSON_Delete(o);
}
END_TEST

/* Rollback names are checked like module names, and refused rollbacks add
 * nothing to the module table or the metrics. */
START_TEST(rollback_names_cannot_poison) {
    start("tok", 0, NULL, NULL);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "b.json"), "tok",
                              NULL, 0),
                     200);
    char out[4096], req[512];
    raw_request("POST /v1/rollback/%22%7D%0Ahotkern_fake%201 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Authorization: Bearer tok\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 400", 12), "%s", out);
    raw_request("POST /v1/rollback/../x HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Authorization: Bearer tok\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 4", 10), "%s", out);
    for (int i = 0; i < 300; i++) {
        snprintf(req, sizeof req,
                 "POST /v1/rollback/junk%d HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Authorization: Bearer tok\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                 i);
        raw_request(req, out, sizeof out);
        ck_assert_msg(!strncmp(out, "HTTP/1.1 404", 12), "%d: %s", i, out);
    }
    char body[16384];
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, "tok", body, sizeof body), 200);
    cJSON *o = cJSON_Parse(body);
    const cJSON *mods = cJSON_GetObjectItem(o, "modules");
    ck_assert_int_eq(cJSON_GetArraySize(mods), 1);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(mods, 0), "module")->valuestring,
                     "add");
    cJSON_Delete(o);
    ck_assert_int_eq(curl_req("GET", "/metrics", NULL, "tok", body, sizeof body), 200);
    ck_assert_ptr_null(strstr(body, "junk"));
    ck_assert_ptr_null(strstr(body, "hotkern_fake"));
    ck_assert_ptr_nonnull(strstr(body, "hotkern_module_release_version{module=\"add\"} 3\n"));
    ck_assert_msg(strstr(body, "hotkern_stage_seconds_total 0.042\n"), "%s", body);
    ck_assert_ptr_nonnull(strstr(body, "hotkern_retired_loaded 0\n"));
    check_prometheus(body);
}
END_TEST

/* The anti-rollback record is on disk before the engine commits (so a crash
 * in between cannot reopen the release), and taken back if it refuses. */
START_TEST(recorded_before_commit) {
    snprintf(rec.state_file, sizeof rec.state_file, "%s/state/accepted.json", tmp);
    start(NULL, 0, NULL, NULL);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 5, time(NULL) + 60, T_NONE, "b.json"), NULL,
                              NULL, 0),
                     200);
    pthread_mutex_lock(&rec.lock);
    int first = rec.recorded_first;
    pthread_mutex_unlock(&rec.lock);
    ck_assert_int_eq(first, 1);
    ck_assert(state_records(rec.state_file, "add", 5));
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = HK_ERR_COMPILE;
    pthread_mutex_unlock(&rec.lock);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 6, time(NULL) + 60, T_NONE, "c.json"), NULL,
                              NULL, 0),
                     422);
    ck_assert(state_records(rec.state_file, "add", 5));
    char body[4096];
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body), 200);
    ck_assert_msg(strstr(body, "before commit") && strstr(body, "accepted.json"), "%s", body);
}
END_TEST

/* Sends raw text on a fresh connection from 127.0.0.1 and reads the answer
 * until the server closes; returns the seconds it took. */
static double timed_request(const char *head, const char *file, char *out, size_t cap) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(hkn_endpoint_port(ep))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ck_assert_int_eq(send(fd, head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
    if (file) {
        char *text;
        size_t len;
        ck_assert_int_eq(hku_read_file(file, 1 << 20, &text, &len, NULL), 0);
        ck_assert_int_eq(send(fd, text, len, MSG_NOSIGNAL), (ssize_t)len);
        free(text);
    }
    size_t len = 0;
    ssize_t r;
    while (len + 1 < cap && (r = recv(fd, out + len, cap - 1 - len, 0)) > 0)
        len += (size_t)r;
    out[len] = '\0';
    close(fd);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
}

/* A web page on another port of the same host (a notebook, a dev server)
 * is another origin: with unsigned releases allowed and no token, neither
 * its cross-origin requests nor its "simple" POSTs (text/plain, forms,
 * multipart, no type at all, which browsers send without a preflight) push
 * anything; the endpoint's own origin and JSON bodies still do. */
START_TEST(other_origins_and_simple_posts_refused) {
    cfg_hook = no_keys_unsigned;
    start(NULL, 0, NULL, NULL);
    unsigned port = hkn_endpoint_port(ep);
    const char *f = body_file(&key, "add", 5, time(NULL) + 60, T_NO_SIG, "u.json");
    char body[8192], hdr[160];
    /* Each: a scheme and host, and the port after them (-1: none). */
    const struct {
        const char *prefix;
        long port;
        const char *suffix;
    } origins[] = {{"http://localhost:", 8888, ""},  {"http://127.0.0.1:", 8888, ""},
                   {"https://127.0.0.1:", port, ""}, {"http://127.0.0.1:", port * 10L, ""},
                   {"http://127.0.0.1:", -1, ""},    {"http://localhost:", port, "/x"},
                   {"http://localhost", -1, ""},     {"http://[::1]:", port, ""}};
    for (size_t i = 0; i < sizeof origins / sizeof origins[0]; i++) {
        char o[96], pnum[24] = "";
        if (origins[i].port >= 0)
            snprintf(pnum, sizeof pnum, "%ld", origins[i].port);
        snprintf(o, sizeof o, "%s%s%s", origins[i].prefix, pnum, origins[i].suffix);
        snprintf(hdr, sizeof hdr, "Origin: %s", o);
        extra_header = hdr;
        int code = curl_req("POST", "/v1/release", f, NULL, body, sizeof body);
        ck_assert_msg(code == 403 && strstr(body, "port"), "Origin %s: HTTP %d: %s", o, code, body);
        ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 403);
    }
    snprintf(hdr, sizeof hdr, "Origin: http://localhost:%u", port);
    extra_header = hdr;
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 200);
    extra_header = NULL;
    ck_assert_int_eq(rec_calls(), 0);

    struct stat st;
    ck_assert_int_eq(stat(f, &st), 0);
    const char *types[] = {"Content-Type: text/plain\r\n",
                           "Content-Type: text/plain; charset=utf-8\r\n",
                           "Content-Type: application/x-www-form-urlencoded\r\n",
                           "Content-Type: multipart/form-data; boundary=x\r\n",
                           "Content-Type: application/jsonx\r\n",
                           ""};
    char head[512], out[8192];
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        snprintf(head, sizeof head,
                 "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Length: %lld\r\n"
                 "Connection: close\r\n\r\n",
                 types[i], (long long)st.st_size);
        timed_request(head, f, out, sizeof out);
        ck_assert_msg(!strncmp(out, "HTTP/1.1 415", 12) && strstr(out, "application/json"),
                      "'%s': %s", types[i], out);
    }
    /* The same as a signed rollback request's body. */
    snprintf(head, sizeof head,
             "POST /v1/rollback/add HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
             "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n");
    timed_request(head, NULL, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 415", 12), "%s", out);
    ck_assert_int_eq(rec_calls(), 0);
    snprintf(head, sizeof head,
             "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             "Content-Type: Application/JSON; charset=utf-8\r\nContent-Length: %lld\r\n"
             "Connection: close\r\n\r\n",
             (long long)st.st_size);
    timed_request(head, f, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 200", 12), "%s", out);
    ck_assert_int_eq(rec_calls(), 1);
}
END_TEST

/* Opens a connection from source address `src` and sends an incomplete
 * request head; returns the socket. */
static int slow_connection(const char *src) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in from = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &from.sin_addr);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&from, sizeof from), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(hkn_endpoint_port(ep))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *head = "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    ck_assert_int_eq(send(fd, head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
    return fd;
}

static int slow_fds[1200], nslow;
static int trickle_stop; /* atomic */

/* One more header byte on every slow connection every half second. */
static void *trickle(void *arg) {
    while (!__atomic_load_n(&trickle_stop, __ATOMIC_RELAXED)) {
        for (int i = 0; i < nslow && !__atomic_load_n(&trickle_stop, __ATOMIC_RELAXED); i++)
            send(slow_fds[i], "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        usleep(500000);
    }
    return NULL;
}

static void wait_connections(unsigned n) {
    for (int i = 0; i < 400 && hkn_endpoint_connections(ep) < n; i++)
        usleep(50000);
    ck_assert_uint_ge(hkn_endpoint_connections(ep), n);
}

static void close_slow(void) {
    for (int i = 0; i < nslow; i++)
        close(slow_fds[i]);
    nslow = 0;
}

/* Slowloris: with 1,000 slow connections open and trickling, a status
 * request and a signed push are each answered within 1 s. */
START_TEST(slowloris_does_not_lock_out) {
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < 4096) {
        rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    ck_assert_msg(rl.rlim_cur >= 1200, "needs 1200 descriptors, the limit is %llu",
                  (unsigned long long)rl.rlim_cur);
    start(NULL, 0, NULL, NULL);
    /* Ten source addresses, 100 connections each: under the per-address
     * limit, so all of them are held open. */
    char src[32];
    for (nslow = 0; nslow < 1000; nslow++) {
        snprintf(src, sizeof src, "127.0.0.%d", 2 + nslow / 100);
        slow_fds[nslow] = slow_connection(src);
    }
    wait_connections(1000);
    pthread_t t;
    __atomic_store_n(&trickle_stop, 0, __ATOMIC_RELAXED);
    pthread_create(&t, NULL, trickle, NULL);
    usleep(700000);
    char out[8192];
    double s = timed_request("GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                             "Connection: close\r\n\r\n",
                             NULL, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 200", 12), "%s", out);
    ck_assert_msg(s < 1.0, "status took %.3f s with 1000 slow connections", s);
    const char *f = body_file(&key, "add", 7, time(NULL) + 60, T_NONE, "p.json");
    struct stat st;
    ck_assert_int_eq(stat(f, &st), 0);
    char head[256];
    snprintf(head, sizeof head,
             "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Content-Length: %lld\r\nConnection: close\r\n\r\n",
             (long long)st.st_size);
    s = timed_request(head, f, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 200", 12), "%s", out);
    ck_assert_msg(s < 1.0, "push took %.3f s with 1000 slow connections", s);
    ck_assert_uint_eq(rec_current(), 7);
    __atomic_store_n(&trickle_stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    close_slow();
    /* Over the per-address limit, an address's next request gets a 503. */
    for (nslow = 0; nslow < 130; nslow++)
        slow_fds[nslow] = slow_connection("127.0.0.20");
    wait_connections(130);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in from = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.20", &from.sin_addr);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&from, sizeof from), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(hkn_endpoint_port(ep))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *req = "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    ck_assert_int_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t r = recv(fd, out, sizeof out - 1, 0);
    out[r > 0 ? r : 0] = '\0';
    close(fd);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 503", 12), "got: %s", out);
    /* ... while another address is served. */
    timed_request(req, NULL, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 200", 12), "%s", out);
    close_slow();
}
END_TEST

static void short_deadline(hk_endpoint_options *o, hkn_endpoint_resolved *r) {
    (void)r;
    o->request_timeout_s = 2;
}

/* A client trickling its headers a byte at a time is cut off at the whole-
 * request deadline, though it never stays idle long enough for the idle
 * timeout (30 s). */
START_TEST(request_deadline) {
    cfg_hook = short_deadline;
    start(NULL, 0, NULL, NULL);
    int fd = slow_connection("127.0.0.1");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int closed = 0;
    for (int i = 0; i < 40 && !closed; i++) {
        usleep(250000);
        if (send(fd, "x", 1, MSG_NOSIGNAL) < 0) {
            closed = 1;
            break;
        }
        char c;
        ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);
        closed = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    close(fd);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_msg(closed, "still open after %.1f s", s);
    ck_assert_msg(s >= 1.5, "closed after %.1f s, before the deadline", s);
    char body[8192];
    ck_assert_int_eq(curl_req("GET", "/metrics", NULL, NULL, body, sizeof body), 200);
    ck_assert_ptr_nonnull(strstr(body, "hotkern_push_deadline_total 1\n"));
}
END_TEST

static void small_budget(hk_endpoint_options *o, hkn_endpoint_resolved *r) {
    (void)r;
    o->max_body_bytes = 256 * 1024;
    o->max_inflight_bytes = 300 * 1024;
}

static int open_raw(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(hkn_endpoint_port(ep))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_all(int fd, const void *p, size_t n) {
    ck_assert_int_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Every Origin and Host header is checked, not the first alone. */
START_TEST(second_origin_or_host_is_checked) {
    start(NULL, 0, NULL, NULL);
    unsigned port = hkn_endpoint_port(ep);
    char req[512], out[4096];
    char own[64];
    snprintf(own, sizeof own, "Origin: http://127.0.0.1:%u\r\n", port);
    const char *evil = "Origin: http://evil.example\r\n";
    const char *extra[][2] = {{own, evil}, {evil, own}, {"Host: evil.example\r\n", ""}};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        char hdrs[256];
        snprintf(hdrs, sizeof hdrs, "%s%s", extra[i][0], extra[i][1]);
        snprintf(req, sizeof req, "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n%s\r\n", port,
                 hdrs);
        raw_request(req, out, sizeof out);
        ck_assert_msg(!strncmp(out, "HTTP/1.1 403", 12), "%s: got: %s", hdrs, out);
    }
    snprintf(req, sizeof req,
             "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nOrigin: http://127.0.0.1:%u\r\n"
             "Connection: close\r\n\r\n",
             port, port);
    raw_request(req, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 200", 12), "got: %s", out);
}
END_TEST

/* A push in flight: the engine takes a while over it. */
static void *slow_push(void *path) {
    return (void *)(intptr_t)curl_req("POST", "/v1/release", path, NULL, NULL, 0);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* A client that half-closes (shuts its sending side) once its push is sent
 * still gets the answer, while another upload is being received and while
 * the engine takes a while over a third. */
START_TEST(half_closed_client_gets_its_answer) {
    start(NULL, 0, NULL, NULL);
    pthread_mutex_lock(&rec.lock);
    rec.delay_ms = 500;
    pthread_mutex_unlock(&rec.lock);
    static char spaces[60000];
    memset(spaces, ' ', sizeof spaces);
    const char *upload = "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Content-Type: application/json\r\nContent-Length: 250000\r\n\r\n{\"a";
    int unanswered = 0;
    for (uint64_t round = 0; round < 10; round++) {
        const char *first =
            body_file(&key, "add", 10 * round + 3, time(NULL) + 60, T_NONE, "first.json");
        const char *body =
            slurp(body_file(&key, "add", 10 * round + 5, time(NULL) + 60, T_NONE, "second.json"));
        int other = open_raw();
        send_all(other, upload, strlen(upload));
        send_all(other, spaces, sizeof spaces);
        pthread_t t;
        pthread_create(&t, NULL, slow_push, (void *)first);
        usleep(200000);
        char head[256];
        snprintf(head, sizeof head,
                 "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                 strlen(body));
        int fd = open_raw();
        send_all(fd, head, strlen(head));
        send_all(fd, body, strlen(body));
        ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
        struct timeval tv = {.tv_sec = 10};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char out[4096];
        size_t len = 0;
        ssize_t r;
        while (len + 1 < sizeof out && (r = recv(fd, out + len, sizeof out - 1 - len, 0)) > 0)
            len += (size_t)r;
        out[len] = '\0';
        close(fd);
        void *code;
        pthread_join(t, &code);
        close(other);
        ck_assert_int_eq((int)(intptr_t)code, 200);
        ck_assert_uint_eq(rec_current(), 10 * round + 5); /* applied, answered or not */
        if (strncmp(out, "HTTP/1.1 200", 12)) {
            fprintf(stderr, "round %d: %zu bytes of answer: %s\n", (int)round, len, out);
            unanswered++;
        }
    }
    ck_assert_int_eq(unanswered, 0);
}
END_TEST

/* Declared sizes hold nothing: clients that declare bodies over the whole
 * in-flight budget (a JSON Content-Length and a release frame's lengths)
 * and then trickle keep no legitimate push out. */
START_TEST(declared_sizes_hold_nothing) {
    cfg_hook = small_budget;
    start(NULL, 0, NULL, NULL);
    const char *head = "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Content-Type: application/json\r\nContent-Length: 250000\r\n\r\n{\"a";
    int fds[3];
    for (int i = 0; i < 2; i++) {
        fds[i] = open_raw();
        send_all(fds[i], head, strlen(head));
    }
    /* A frame whose length table declares an artifact of 200,000 bytes. */
    static unsigned char art[200000];
    hkn_blob b = {.name = "add.cu", .bytes = art, .size = sizeof art};
    unsigned char *frame;
    size_t flen;
    ck_assert_int_eq(hkn_frame_write("{}", 2, NULL, 0, &b, 1, &frame, &flen), 0);
    char fhead[256];
    snprintf(fhead, sizeof fhead,
             "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\n"
             "Content-Length: %zu\r\n\r\n",
             HKN_FRAME_TYPE, flen);
    fds[2] = open_raw();
    send_all(fds[2], fhead, strlen(fhead));
    send_all(fds[2], frame, 64);
    free(frame);
    usleep(300000);
    for (int i = 0; i < 3; i++)
        send_all(fds[i], "x", 1);
    usleep(100000);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "ok.json"), NULL,
                              NULL, 0),
                     200);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
}
END_TEST

/* What bodies hold is still bounded: a body whose bytes do not fit beside
 * one already received is dropped and answered 503 once it ends; the
 * budget goes with the connection that held it. */
START_TEST(inflight_bodies_bounded) {
    cfg_hook = small_budget;
    start(NULL, 0, NULL, NULL);
    const char *head = "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Content-Type: application/json\r\nContent-Length: 250000\r\n\r\n";
    static char body[250001];
    memset(body, 'a', sizeof body - 1);
    int fd = open_raw();
    send_all(fd, head, strlen(head));
    send_all(fd, body, 200000); /* held: 200,000 of 250,000 received */
    usleep(300000);
    size_t hl = strlen(head);
    char *req = malloc(hl + sizeof body);
    memcpy(req, head, hl);
    memcpy(req + hl, body, sizeof body);
    char out[4096];
    raw_request(req, out, sizeof out);
    free(req);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 503", 12), "got: %s", out);
    ck_assert_ptr_nonnull(strstr(out, "in flight"));
    close(fd);
    usleep(300000);
    /* The reservation went with the connection. */
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "ok.json"), NULL,
                              NULL, 0),
                     200);
}
END_TEST

/* ---- release frames (application/x-hotkern-release) -------------------- */

/* A signed release: its manifest's text and the signature's. */
struct signed_rel {
    char *manifest, *sig;
    size_t mlen;
};

static struct signed_rel sign_rel(const hkn_seckey *k, const char *module, uint64_t version,
                                  int64_t expires, const void *bytes, size_t size) {
    struct signed_rel s = {0};
    hk_report rep = HK_REPORT_INIT;
    hkn_blob b = {.name = "add.cu", .bytes = bytes, .size = size};
    ck_assert_int_eq(hkn_release_sign(k, module, version, time(NULL), expires, &b, 1, &s.manifest,
                                      &s.mlen, &s.sig, &rep),
                     0);
    return s;
}

static void rel_free(struct signed_rel *s) {
    free(s->manifest);
    free(s->sig);
}

enum ftamper {
    F_NONE,
    F_TRUNCATED, /* the body stops 10 bytes short of the frame */
    F_IN_HEAD,   /* the body stops inside the frame's header */
    F_LONGER,    /* the artifact's length says one byte more than there is */
    F_SHIFTED,   /* manifest one byte longer, artifact one shorter: same total */
    F_HUGE,      /* the artifact's length is 2^62 */
    F_MAGIC,
    F_VERSION,  /* version 2 */
    F_MANIFEST, /* the module renamed: the signature no longer covers it */
    F_BYTES,    /* an artifact byte changed */
    F_TWO,      /* two artifacts where the manifest names one */
    F_NO_SIG,
};

static void put64(unsigned char *p, uint64_t v) {
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

/* Writes the frame of s (whose artifact is bytes) into tmp/NAME, tampered
 * as t, and returns its path (valid for the next 15 calls). */
static const char *frame_of(struct signed_rel *s, const void *bytes, size_t size, enum ftamper t,
                            const char *name) {
    static char paths[16][PATH_MAX];
    static int next;
    char *path = paths[next++ % 16];
    hkn_blob b[2] = {{.name = "add.cu", .bytes = bytes, .size = size},
                     {.name = "add.cu", .bytes = bytes, .size = size}};
    unsigned char *f;
    size_t len;
    char *manifest = s->manifest;
    if (t == F_MANIFEST) {
        /* Still a manifest (it names the signer's key), but not the one signed. */
        manifest = strdup(s->manifest);
        strstr(manifest, "\"add\"")[3] = 'c';
    }
    ck_assert_int_eq(hkn_frame_write(manifest, s->mlen, s->sig, t == F_NO_SIG ? 0 : strlen(s->sig),
                                     b, t == F_TWO ? 2 : 1, &f, &len),
                     0);
    if (manifest != s->manifest)
        free(manifest);
    unsigned char *table = f + HKN_FRAME_HEAD;
    uint64_t alen = size;
    if (t == F_TRUNCATED)
        len -= 10;
    else if (t == F_IN_HEAD)
        len = 12;
    else if (t == F_LONGER)
        put64(table, alen + 1);
    else if (t == F_SHIFTED) {
        put64(table, alen - 1);
        f[15]++; /* the manifest length's low byte */
    } else if (t == F_HUGE)
        put64(table, 1ull << 62);
    else if (t == F_MAGIC)
        f[1] = 'X';
    else if (t == F_VERSION)
        f[9] = 2;
    else if (t == F_BYTES)
        f[len - size] ^= 1;
    snprintf(path, PATH_MAX, "%s/%s", tmp, name);
    ck_assert_int_eq(hku_write_atomic(path, f, len, 0644, NULL), 0);
    free(f);
    return path;
}

static const char *frame_file(const hkn_seckey *k, const char *module, uint64_t version,
                              int64_t expires, enum ftamper t, const char *name) {
    struct signed_rel s = sign_rel(k, module, version, expires, kernel_src, strlen(kernel_src));
    const char *path = frame_of(&s, kernel_src, strlen(kernel_src), t, name);
    rel_free(&s);
    return path;
}

static int json_has_text(const char *body, const char *field, const char *part) {
    cJSON *o = cJSON_Parse(body);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    int ok = cJSON_IsString(v) && strstr(v->valuestring, part);
    cJSON_Delete(o);
    return ok;
}

/* The state file's record of module is still `version`. */
static int state_is(const char *module, uint64_t version) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/state/accepted.json", tmp);
    return state_records(path, module, version);
}

START_TEST(frame_push_commits) {
    start(NULL, 0, NULL, NULL);
    body_type = HKN_FRAME_TYPE;
    char body[8192];
    int code = curl_req("POST", "/v1/release",
                        frame_file(&key, "add", 5, time(NULL) + 60, F_NONE, "f.bin"), NULL, body,
                        sizeof body);
    ck_assert_msg(code == 200, "HTTP %d: %s", code, body);
    ck_assert(json_has(body, "outcome", "committed"));
    ck_assert(json_has(body, "module", "add"));
    pthread_mutex_lock(&rec.lock);
    ck_assert_int_eq(rec.calls, 1);
    ck_assert_uint_eq(rec.version, 5);
    ck_assert_int_eq(rec.fmt, HK_FORMAT_CUDA_C);
    ck_assert_str_eq(rec.origin, "push");
    ck_assert_uint_eq(rec.size, strlen(kernel_src));
    ck_assert_mem_eq(rec.bytes, kernel_src, rec.size);
    pthread_mutex_unlock(&rec.lock);
    ck_assert(state_is("add", 5));
    /* The same frame sent in chunks (no Content-Length) commits too. */
    chunked = 1;
    code = curl_req("POST", "/v1/release",
                    frame_file(&key, "add", 6, time(NULL) + 60, F_NONE, "f6.bin"), NULL, body,
                    sizeof body);
    ck_assert_msg(code == 200, "HTTP %d: %s", code, body);
    ck_assert_uint_eq(rec_current(), 6);
}
END_TEST

/* One signature, either body: the frame carries the manifest's exact bytes
 * and the signature's text, as the JSON body's strings do. */
START_TEST(frame_and_json_carry_one_signature) {
    start(NULL, 0, NULL, NULL);
    struct signed_rel s = sign_rel(&key, "add", 7, time(NULL) + 60, kernel_src, strlen(kernel_src));
    const char *frame = frame_of(&s, kernel_src, strlen(kernel_src), F_NONE, "one.bin");
    char b64[256], path[PATH_MAX + 16], hex[65], body[8192];
    sodium_bin2base64(b64, sizeof b64, (const unsigned char *)kernel_src, strlen(kernel_src),
                      sodium_base64_VARIANT_ORIGINAL);
    hkn_sha256_hex(kernel_src, strlen(kernel_src), hex);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "manifest", s.manifest);
    cJSON_AddStringToObject(o, "signature", s.sig);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "artifacts"), hex, b64);
    char *text = cJSON_PrintUnformatted(o);
    snprintf(path, sizeof path, "%s/one.json", tmp);
    ck_assert_int_eq(hkt_write_file(path, text), 0);
    free(text);
    cJSON_Delete(o);
    rel_free(&s);

    body_type = HKN_FRAME_TYPE;
    int code = curl_req("POST", "/v1/release", frame, NULL, body, sizeof body);
    ck_assert_msg(code == 200, "frame: HTTP %d: %s", code, body);
    /* Sent again as JSON, the same release verifies as far as the replay
     * check... */
    body_type = "application/json";
    code = curl_req("POST", "/v1/release", path, NULL, body, sizeof body);
    ck_assert_msg(code == 409 && json_has(body, "error", "HK_ERR_REPLAY"), "HTTP %d: %s", code,
                  body);
    /* ... and commits on an endpoint that has not seen it. */
    hkn_endpoint_stop(ep);
    ep = NULL;
    char sdir[PATH_MAX + 16];
    snprintf(sdir, sizeof sdir, "%s/state", tmp);
    hkt_rmtree(sdir);
    start(NULL, 0, NULL, NULL);
    code = curl_req("POST", "/v1/release", path, NULL, body, sizeof body);
    ck_assert_msg(code == 200, "JSON: HTTP %d: %s", code, body);
    pthread_mutex_lock(&rec.lock);
    ck_assert_int_eq(rec.calls, 2);
    ck_assert_uint_eq(rec.version, 7);
    ck_assert_mem_eq(rec.bytes, kernel_src, strlen(kernel_src));
    pthread_mutex_unlock(&rec.lock);
}
END_TEST

/* Every malformed, lying or untrusted frame is refused with its reason, and
 * nothing changes: no apply, no record. */
START_TEST(frame_refusals_change_nothing) {
    start(NULL, 0, NULL, NULL);
    body_type = HKN_FRAME_TYPE;
    char body[8192];
    int64_t exp = time(NULL) + 60;
    ck_assert_int_eq(curl_req("POST", "/v1/release", frame_file(&key, "add", 5, exp, F_NONE, "ok"),
                              NULL, body, sizeof body),
                     200);
    hkn_seckey stranger;
    hkn_keygen(&stranger);
    struct {
        const char *what, *file;
        int code;
        const char *error, *says;
    } cases[] = {
        {"truncated", frame_file(&key, "add", 9, exp, F_TRUNCATED, "c1"), 400, "HK_ERR_INVALID",
         "truncated"},
        {"cut in its header", frame_file(&key, "add", 9, exp, F_IN_HEAD, "c2"), 400,
         "HK_ERR_INVALID", "inside the release frame's header"},
        {"length longer than the body", frame_file(&key, "add", 9, exp, F_LONGER, "c3"), 400,
         "HK_ERR_INVALID", "truncated"},
        {"lengths shifted", frame_file(&key, "add", 9, exp, F_SHIFTED, "c4"), 403,
         "HK_ERR_SIGNATURE", "signature"},
        {"length over the cap", frame_file(&key, "add", 9, exp, F_HUGE, "c5"), 413,
         "HK_ERR_TOO_LARGE", "the cap of"},
        {"bad magic", frame_file(&key, "add", 9, exp, F_MAGIC, "c6"), 400, "HK_ERR_INVALID",
         "magic"},
        {"version 2", frame_file(&key, "add", 9, exp, F_VERSION, "c7"), 400, "HK_ERR_INVALID",
         "version 2"},
        {"bad signature", frame_file(&key, "add", 9, exp, F_MANIFEST, "c8"), 403,
         "HK_ERR_SIGNATURE", "bad signature"},
        {"unknown key", frame_file(&stranger, "add", 9, exp, F_NONE, "c9"), 403, "HK_ERR_SIGNATURE",
         "unknown signing key"},
        {"no signature", frame_file(&key, "add", 9, exp, F_NO_SIG, "c10"), 403, "HK_ERR_SIGNATURE",
         "no signature"},
        {"artifact altered", frame_file(&key, "add", 9, exp, F_BYTES, "c11"), 422, "HK_ERR_HASH",
         "sha256"},
        {"artifact count", frame_file(&key, "add", 9, exp, F_TWO, "c12"), 422, "HK_ERR_HASH",
         "carries 2"},
        {"replay", frame_file(&key, "add", 5, exp, F_NONE, "c13"), 409, "HK_ERR_REPLAY",
         "not newer"},
        {"expired", frame_file(&key, "add", 9, time(NULL) - 5, F_NONE, "c14"), 403,
         "HK_ERR_EXPIRED", "expired"},
    };
    for (int pass = 0; pass < 2; pass++) {
        /* Once with a Content-Length, once chunked: without one, what a
         * length contradicts is the end of the body. */
        chunked = pass;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            int code = curl_req("POST", "/v1/release", cases[i].file, NULL, body, sizeof body);
            ck_assert_msg(code == cases[i].code, "%s%s: HTTP %d (want %d): %s", cases[i].what,
                          pass ? " (chunked)" : "", code, cases[i].code, body);
            ck_assert_msg(json_has(body, "error", cases[i].error), "%s: %s", cases[i].what, body);
            ck_assert_msg(json_has_text(body, "message", cases[i].says), "%s: %s", cases[i].what,
                          body);
            ck_assert_int_eq(rec_calls(), 1);
            ck_assert_uint_eq(rec_current(), 5);
            ck_assert(state_is("add", 5));
        }
    }
    chunked = 0;
    /* A frame under another type: a form type is refused unread (415),
     * as JSON it is no JSON (400), and no other route takes a frame. */
    const char *good = frame_file(&key, "add", 9, exp, F_NONE, "good");
    body_type = "application/octet-stream";
    ck_assert_int_eq(curl_req("POST", "/v1/release", good, NULL, body, sizeof body), 415);
    ck_assert(json_has_text(body, "message", HKN_FRAME_TYPE));
    body_type = "application/json";
    ck_assert_int_eq(curl_req("POST", "/v1/release", good, NULL, body, sizeof body), 400);
    body_type = HKN_FRAME_TYPE;
    ck_assert_int_eq(curl_req("POST", "/v1/rollback/add", good, NULL, body, sizeof body), 415);
    ck_assert(json_has_text(body, "message", "only POST /v1/release"));
    ck_assert_int_eq(rec_calls(), 1);
    ck_assert_int_eq(rec.rollbacks, 0);
    /* None of it burnt the version or wedged the endpoint. */
    int code = curl_req("POST", "/v1/release", good, NULL, body, sizeof body);
    ck_assert_msg(code == 200, "HTTP %d: %s", code, body);
    ck_assert_uint_eq(rec_current(), 9);
    ck_assert(state_is("add", 9));
}
END_TEST

static void small_cap(hk_endpoint_options *o, hkn_endpoint_resolved *r) {
    (void)r;
    o->max_body_bytes = 3800;
}

/* hotkern push sends the frame unless told --json-body: a 3,000-byte kernel
 * fits a 3,800-byte cap as a frame (its bytes once, plus the manifest),
 * not as JSON (base64 adds a third). */
START_TEST(cli_pushes_frames) {
    cfg_hook = small_cap;
    start(NULL, 0, NULL, NULL);
    char src[3001], path[PATH_MAX + 16], out[16384];
    memset(src, ' ', 3000);
    src[3000] = '\0';
    memcpy(src, kernel_src, strlen(kernel_src));
    src[2998] = '\n';
    snprintf(path, sizeof path, "%s/big.cu", tmp);
    ck_assert_int_eq(hkt_write_file(path, src), 0);
    const char *cli = cli_path();
    char *json[] = {(char *)cli, "push",      base, "--key",       key_path, "--module",
                    "add",       "--release", "3",  "--json-body", path,     NULL};
    int rc = run(json, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_TOO_LARGE"), "exit %d: %s", rc, out);
    ck_assert_int_eq(rec_calls(), 0);
    char *frame[] = {(char *)cli, "push",      base, "--key", key_path, "--module",
                     "add",       "--release", "4",  path,    NULL};
    rc = run(frame, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "committed"), "exit %d: %s", rc, out);
    pthread_mutex_lock(&rec.lock);
    ck_assert_uint_eq(rec.version, 4);
    ck_assert_uint_eq(rec.size, 3000);
    ck_assert_mem_eq(rec.bytes, src, 3000);
    pthread_mutex_unlock(&rec.lock);
}
END_TEST

/* ---- what a push costs in memory --------------------------------------- */

static long status_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, strlen(field)))
            v = atol(line + strlen(field));
    fclose(f);
    ck_assert_int_ge(v, 0);
    return v;
}

/* Pushes file as `type` and returns by how many bytes the process's peak
 * resident size rose over what it held before. The kernel keeps the peak
 * (VmHWM) exactly, every page the endpoint touched counted, and resets it
 * to the current size on request (clear_refs 5): no sampling to miss a
 * peak. The client is a curl process of its own, so only the server's
 * memory is in this process. */
static double push_peak_growth(const char *file, const char *type, int *code) {
    char body[8192];
    malloc_trim(0);
    FILE *f = fopen("/proc/self/clear_refs", "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs("5", f), 0);
    ck_assert_int_eq(fclose(f), 0);
    long before = status_kib("VmRSS:");
    body_type = type;
    *code = curl_req("POST", "/v1/release", file, NULL, body, sizeof body);
    ck_assert_msg(*code == 200, "HTTP %d: %s", *code, body);
    return 1024.0 * (double)(status_kib("VmHWM:") - before);
}

static off_t file_size(const char *path) {
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return st.st_size;
}

/* A 60 MiB image pushed as a frame is held once: the endpoint's peak
 * memory grows by about the body's size (at least the image, which it must
 * hold, and under 1.3 times the body). The same measure of a JSON body of
 * 60 MiB is printed beside it. */
START_TEST(frame_push_holds_the_body_once) {
    start(NULL, 0, NULL, NULL);
    rec.hash_only = 1; /* the recorder keeps no copy */
    const size_t image = (60u << 20) - 4096, jimage = 45u << 20;
    unsigned char *img = malloc(image);
    ck_assert_ptr_nonnull(img);
    for (size_t i = 0; i < image; i++)
        img[i] = (unsigned char)(i * 2654435761u >> 13);
    char hex[65], jhex[65], b64path[PATH_MAX + 16];
    hkn_sha256_hex(img, image, hex);
    hkn_sha256_hex(img, jimage, jhex);
    struct signed_rel s = sign_rel(&key, "add", 1, time(NULL) + 600, img, image);
    const char *frame = frame_of(&s, img, image, F_NONE, "big.bin");
    rel_free(&s);
    /* The JSON body of a 45 MiB image is 60 MiB. */
    s = sign_rel(&key, "add", 2, time(NULL) + 600, img, jimage);
    size_t blen = sodium_base64_ENCODED_LEN(jimage, sodium_base64_VARIANT_ORIGINAL);
    char *b64 = malloc(blen);
    ck_assert_ptr_nonnull(b64);
    sodium_bin2base64(b64, blen, img, jimage, sodium_base64_VARIANT_ORIGINAL);
    free(img);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "manifest", s.manifest);
    cJSON_AddStringToObject(o, "signature", s.sig);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "artifacts"), jhex, b64);
    free(b64);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    rel_free(&s);
    snprintf(b64path, sizeof b64path, "%s/big.json", tmp);
    ck_assert_int_eq(hku_write_atomic(b64path, text, strlen(text), 0644, NULL), 0);
    free(text);

    int code;
    double fbody = (double)file_size(frame), jbody = (double)file_size(b64path);
    double fgrow = push_peak_growth(frame, HKN_FRAME_TYPE, &code);
    pthread_mutex_lock(&rec.lock);
    ck_assert_uint_eq(rec.version, 1);
    ck_assert_uint_eq(rec.size, image);
    ck_assert_str_eq(rec.hash, hex);
    pthread_mutex_unlock(&rec.lock);
    double jgrow = push_peak_growth(b64path, "application/json", &code);
    pthread_mutex_lock(&rec.lock);
    ck_assert_uint_eq(rec.version, 2);
    ck_assert_str_eq(rec.hash, jhex);
    pthread_mutex_unlock(&rec.lock);
    fprintf(stderr,
            "push peak memory: frame body %.1f MiB: +%.1f MiB (%.2fx); JSON body %.1f MiB: "
            "+%.1f MiB (%.2fx)\n",
            fbody / 1048576, fgrow / 1048576, fgrow / fbody, jbody / 1048576, jgrow / 1048576,
            jgrow / jbody);
#if defined(__SANITIZE_THREAD__)
    /* The thread sanitizer's shadow of every byte touched is several times
     * its size: the bound is the plain and address-sanitized builds'. */
    (void)fgrow;
#else
    ck_assert_msg(fgrow >= 0.9 * (double)image, "the probe saw only %.1f MiB", fgrow / 1048576);
    ck_assert_msg(fgrow <= 1.3 * fbody, "a %.1f MiB frame cost %.1f MiB (%.2fx)", fbody / 1048576,
                  fgrow / 1048576, fgrow / fbody);
#endif
}
END_TEST

/* --expires-in is range-checked: a value that would overflow the expiry or
 * sign a release no verifier accepts is a usage error, and nothing is
 * written. */
START_TEST(cli_expiry_range) {
    const char *cli = cli_path();
    char out[4096], dir[PATH_MAX], man[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/rel", tmp);
    snprintf(man, sizeof man, "%s/manifest.json", dir);
    static const char *bad[] = {"18446744073709551615", "9223372036854775807", "0", "-1",
                                "31622401"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *sign[] = {(char *)cli, "sign", "--key",        key_path,       "--module", "add",
                        "--release", "1",    "--expires-in", (char *)bad[i], "--out",    dir,
                        src_path,    NULL};
        int rc = run(sign, out, sizeof out);
        ck_assert_msg(rc == 2 && strstr(out, "--expires-in"), "%s: exit %d: %s", bad[i], rc, out);
        ck_assert_int_ne(access(man, F_OK), 0);
    }
    char *ok[] = {(char *)cli, "sign", "--key",        key_path,   "--module", "add",
                  "--release", "1",    "--expires-in", "31622400", "--out",    dir,
                  src_path,    NULL};
    int rc = run(ok, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    start(NULL, 0, NULL, NULL);
    char *push[] = {(char *)cli,      "push",     base,  "--key",
                    key_path,         "--module", "add", "--expires-in",
                    "99999999999999", src_path,   NULL};
    rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 2, "exit %d: %s", rc, out);
    ck_assert_int_eq(rec_calls(), 0);
    /* A module name that is not one is refused before any request. */
    char *rb[] = {(char *)cli, "rollback", base, "a/../b", "--key", key_path, "--to", "1", NULL};
    rc = run(rb, out, sizeof out);
    ck_assert_msg(rc == 2, "exit %d: %s", rc, out);
}
END_TEST

/* The README's sample reverse proxy (its server and location directives,
 * without TLS and the limit zones): a signed push and status go through a
 * real nginx to the endpoint on 127.0.0.1, and a foreign Origin sent to the
 * proxy does not reach the endpoint. */
START_TEST(behind_the_sample_nginx_proxy) {
    start(NULL, 0, NULL, NULL);
    char ndir[PATH_MAX], extra[1024];
    snprintf(ndir, sizeof ndir, "%s/nginx", tmp);
    ck_assert_int_eq(mkdir(ndir, 0700), 0);
    snprintf(extra, sizeof extra,
             "client_max_body_size 96m; client_body_timeout 30s; client_header_timeout 10s;\n"
             "location / {\n"
             "  proxy_pass http://127.0.0.1:%u;\n"
             "  proxy_set_header Host 127.0.0.1;\n"
             "  proxy_set_header Origin \"\";\n"
             "  proxy_request_buffering on;\n"
             "  proxy_read_timeout 120s;\n"
             "}\n",
             hkn_endpoint_port(ep));
    pid_t pid = 0;
    int port = hkt_nginx_start(ndir, ndir, extra, &pid);
    ck_assert_msg(port > 0, "nginx did not start");
    char direct[64];
    snprintf(direct, sizeof direct, "%s", base);
    snprintf(base, sizeof base, "http://127.0.0.1:%d", port);
    char body[8192];
    int code = curl_req("POST", "/v1/release",
                        body_file(&key, "add", 7, time(NULL) + 60, T_NONE, "p.json"), NULL, body,
                        sizeof body);
    int status = curl_req("GET", "/v1/status", NULL, NULL, NULL, 0);
    extra_header = "Origin: https://evil.example";
    int via_proxy = curl_req("GET", "/v1/status", NULL, NULL, NULL, 0);
    snprintf(base, sizeof base, "%s", direct);
    int direct_origin = curl_req("GET", "/v1/status", NULL, NULL, NULL, 0);
    extra_header = NULL;
    hkt_nginx_stop(pid);
    ck_assert_msg(code == 200, "push through the proxy: HTTP %d: %s", code, body);
    ck_assert(json_has(body, "outcome", "committed"));
    ck_assert_uint_eq(rec_current(), 7);
    ck_assert_int_eq(status, 200);
    ck_assert_int_eq(via_proxy, 200);     /* the proxy drops the Origin */
    ck_assert_int_eq(direct_origin, 403); /* the endpoint itself refuses it */
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("endpoint");
    TCase *tc = tcase_create("http");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, push_with_curl_commits);
    tcase_add_test(tc, push_with_cli_commits);
    tcase_add_test(tc, refusals_change_nothing);
    tcase_add_test(tc, push_carries_headers);
    tcase_add_test(tc, replay_state_survives_restart);
    tcase_add_test(tc, engine_refusal_statuses);
    tcase_add_test(tc, refused_release_not_rebuilt);
    tcase_add_test(tc, transient_refusals_are_tried_again);
    tcase_add_test(tc, cli_prints_no_terminal_escapes);
    tcase_add_test(tc, oversized_body_413);
    tcase_add_test(tc, token_required);
    tcase_add_test(tc, hundred_concurrent_status);
    tcase_add_test(tc, metrics_are_prometheus_text);
    tcase_add_test(tc, tls_with_self_signed_cert);
    tcase_add_test(tc, rollback_needs_authority);
    tcase_add_test(tc, rollback_names_cannot_poison);
    tcase_add_test(tc, rollback_bound_to_endpoint);
    tcase_add_test(tc, rollback_target_is_the_engines);
    tcase_add_test(tc, recorded_before_commit);
    tcase_add_test(tc, slowloris_does_not_lock_out);
    tcase_add_test(tc, request_deadline);
    tcase_add_test(tc, other_origins_and_simple_posts_refused);
    tcase_add_test(tc, inflight_bodies_bounded);
    tcase_add_test(tc, declared_sizes_hold_nothing);
    tcase_add_test(tc, second_origin_or_host_is_checked);
    tcase_add_test(tc, half_closed_client_gets_its_answer);
    tcase_add_test(tc, cli_expiry_range);
    tcase_add_test(tc, behind_the_sample_nginx_proxy);
    tcase_add_test(tc, frame_push_commits);
    tcase_add_test(tc, frame_and_json_carry_one_signature);
    tcase_add_test(tc, frame_refusals_change_nothing);
    tcase_add_test(tc, cli_pushes_frames);
    tcase_add_test(tc, frame_push_holds_the_body_once);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

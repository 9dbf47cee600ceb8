/*
 * The endpoint suite's fixture (fixture.h): the recording engine, start()
 * and the per-test setup and teardown, and the clients and bodies every
 * part uses. A helper one part alone needs stays in that part.
 */
#include "tests/endpoint/fixture.h"

struct recorder rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

int state_records(const char *path, const char *module, uint64_t version) {
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

int rec_apply(void *ud, const char *module, uint64_t version, hk_format fmt, const void *bytes,
              size_t size, const hk_header *headers, int nheaders, const char *origin,
              hk_report *rep) {
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

hkn_endpoint *ep;

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

uint64_t rec_current(void) {
    pthread_mutex_lock(&rec.lock);
    uint64_t v = rec.version;
    pthread_mutex_unlock(&rec.lock);
    return v;
}

int rec_calls(void) {
    pthread_mutex_lock(&rec.lock);
    int n = rec.calls;
    pthread_mutex_unlock(&rec.lock);
    return n;
}

const hkn_engine engine = {.apply = rec_apply,
                           .rollback = rec_rollback,
                           .version = rec_version,
                           .metrics = rec_metrics,
                           .ud = NULL,
                           .release = rec_release};

char *tmp; /* per test */

hkn_seckey key; /* trusted */

char base[64]; /* http://127.0.0.1:PORT */

char key_path[PATH_MAX], src_path[PATH_MAX];

const char kernel_src[] = "extern \"C\" __global__ void add(float *x) { x[0] += 1; }\n";

void (*cfg_hook)(hk_endpoint_options *, hkn_endpoint_resolved *);

const char *body_type = "application/json";

int chunked;

void start(const char *token, size_t max_body, const char *cert, const char *pkey) {
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

void setup(void) {
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    ck_assert_int_eq(hkn_keygen(&key), 0);
    snprintf(key_path, sizeof key_path, "%s/hotkern.key", tmp);
    snprintf(src_path, sizeof src_path, "%s/add.cu", tmp);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_seckey_save(key_path, &key, &rep), 0);
    ck_assert_int_eq(hkt_write_file(src_path, kernel_src), 0);
}

void teardown(void) {
    cfg_hook = NULL;
    body_type = "application/json";
    chunked = 0;
    hkn_endpoint_stop(ep);
    ep = NULL;
    hkt_rmtree(tmp);
    free(tmp);
}

int run(char *const argv[], char *out, size_t cap) {
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

const char *extra_header;

int curl_req(const char *method, const char *path, const char *body_file, const char *token,
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

const char *cli_path(void) {
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

const char *body_file(const hkn_seckey *k, const char *module, uint64_t version, int64_t expires,
                      enum tamper t, const char *name) {
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

int json_has(const char *body, const char *field, const char *value) {
    cJSON *o = cJSON_Parse(body);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    int ok = cJSON_IsString(v) && !strcmp(v->valuestring, value);
    cJSON_Delete(o);
    return ok;
}

void raw_request(const char *req, char *out, size_t cap) {
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

void check_prometheus(char *text) {
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

int rollbacks(void) {
    pthread_mutex_lock(&rec.lock);
    int n = rec.rollbacks;
    pthread_mutex_unlock(&rec.lock);
    return n;
}

void no_keys_unsigned(hk_endpoint_options *o, hkn_endpoint_resolved *r) {
    (void)o;
    r->trust.nkeys = 0;
    r->trust.allow_unsigned = 1;
}

double timed_request(const char *head, const char *file, char *out, size_t cap) {
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

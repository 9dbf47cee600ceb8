/*
 * Network subcommands of the hotkern tool: keygen, sign (alias publish),
 * push, status, rollback and pull.
 *
 * They share the release code of the library (net/net.h) so that what the
 * tool signs is byte for byte what the endpoint and the puller verify, and
 * they speak HTTP through libcurl. Exit status: 0 success, 1 refused or
 * failed, 2 usage (cli/cli.h).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <sodium.h>

#include "cli/cli.h"
#include "net/net.h"

#define HKC_MAX_INPUT (256u << 20) /* largest kernel file the tool reads */

static int usage_error(const char *cmd, const char *msg) {
    fprintf(stderr, "hotkern %s: %s (see 'hotkern %s --help')\n", cmd, msg, cmd);
    return 2;
}

static int fail(const char *cmd, const hk_report *rep) {
    fprintf(stderr, "hotkern %s: %s: %s\n", cmd, hkn_error_name(rep->error), rep->message);
    return 1;
}

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        return -1;
    *out = v;
    return 0;
}

/* A release lives at least a second and at most HKN_MAX_LIFETIME_S: a larger
 * value would overflow the expiry or sign a release no verifier accepts. */
#define EXPIRES_RANGE "--expires-in needs seconds from 1 to 31622400 (366 days)"
static int parse_expires(const char *s, uint64_t *out) {
    uint64_t v;
    if (parse_u64(s, &v) || v < 1 || v > HKN_MAX_LIFETIME_S)
        return -1;
    *out = v;
    return 0;
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- keygen ------------------------------------------------------------ */

int hkc_cmd_keygen(int argc, char **argv) {
    static const struct option lo[] = {
        {"out", required_argument, 0, 'o'},
        {"force", no_argument, 0, 'f'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *out = NULL;
    int force = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:fh", lo, NULL)) != -1) {
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 'f':
            force = 1;
            break;
        case 'h':
            printf("usage: hotkern keygen --out DIR [--force]\n\n"
                   "Creates an Ed25519 key pair for signing releases:\n"
                   "  DIR/hotkern.key  secret key (mode 0600): keep it with the publisher\n"
                   "  DIR/hotkern.pub  public key: give it to endpoints and pullers\n"
                   "Both hold one line of hex. Prints the key id (16 hex chars).\n"
                   "An existing key is never overwritten unless --force is given.\n");
            return 0;
        default:
            return usage_error("keygen", "bad option");
        }
    }
    if (!out || optind != argc)
        return usage_error("keygen", "--out DIR is required");
    char sk_path[PATH_MAX], pk_path[PATH_MAX];
    snprintf(sk_path, sizeof sk_path, "%s/hotkern.key", out);
    snprintf(pk_path, sizeof pk_path, "%s/hotkern.pub", out);
    if (mkdir(out, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "hotkern keygen: mkdir %s: %s\n", out, strerror(errno));
        return 1;
    }
    if (!force && access(sk_path, F_OK) == 0) {
        fprintf(stderr, "hotkern keygen: %s exists; use --force to replace it\n", sk_path);
        return 1;
    }
    hkn_seckey k;
    hk_report rep = HK_REPORT_INIT;
    int rc = 1;
    if (hkn_keygen(&k) != 0) {
        fprintf(stderr, "hotkern keygen: libsodium failed to initialise\n");
        goto out;
    }
    if (hkn_seckey_save(sk_path, &k, &rep) || hkn_pubkey_save(pk_path, &k.pub, &rep)) {
        rc = fail("keygen", &rep);
        goto out;
    }
    printf("key id: %s\nsecret: %s\npublic: %s\n", k.pub.id, sk_path, pk_path);
    rc = 0;
out:
    sodium_memzero(&k, sizeof k);
    hkn_report_reset(&rep);
    return rc;
}

/* ---- building a release ------------------------------------------------ */

struct release {
    char *manifest;
    size_t manifest_len;
    char *sig;
    char **bytes;
    hkn_blob blobs[HKN_MAX_ARTIFACTS];
    size_t n;
};

static void release_free(struct release *r) {
    free(r->manifest);
    free(r->sig);
    for (size_t i = 0; i < r->n; i++)
        free(r->bytes ? r->bytes[i] : NULL);
    free(r->bytes);
    memset(r, 0, sizeof *r);
}

/* Reads the files and signs a release of them. */
static int build_release(const char *cmd, const char *key_path, const char *module,
                         uint64_t version, uint64_t expires_in, const char *arch, char **files,
                         int nfiles, struct release *r) {
    hk_report rep = HK_REPORT_INIT;
    hkn_seckey key;
    int rc = 1;
    memset(r, 0, sizeof *r);
    if (nfiles < 1 || nfiles > HKN_MAX_ARTIFACTS) {
        fprintf(stderr, "hotkern %s: give 1 to %d kernel and header files\n", cmd,
                HKN_MAX_ARTIFACTS);
        return 2;
    }
    if (hkn_seckey_load(key_path, &key, &rep)) {
        rc = fail(cmd, &rep);
        goto out;
    }
    if (!(r->bytes = calloc((size_t)nfiles, sizeof *r->bytes)))
        goto out;
    for (int i = 0; i < nfiles; i++) {
        size_t len;
        if (hkn_read_file(files[i], HKC_MAX_INPUT, &r->bytes[i], &len, &rep)) {
            r->n = (size_t)i;
            rc = fail(cmd, &rep);
            goto out;
        }
        hk_format f = hkn_format_from_name(files[i]); /* AUTO for a header */
        r->blobs[i] =
            (hkn_blob){.name = files[i],
                       .bytes = r->bytes[i],
                       .size = len,
                       .format = f,
                       .arch = (f == HK_FORMAT_CUBIN || f == HK_FORMAT_FATBIN) ? arch : NULL};
    }
    r->n = (size_t)nfiles;
    int64_t now = (int64_t)time(NULL);
    if (hkn_release_sign(&key, module, version, now, now + (int64_t)expires_in, r->blobs, r->n,
                         &r->manifest, &r->manifest_len, &r->sig, &rep)) {
        rc = fail(cmd, &rep);
        goto out;
    }
    rc = 0;
out:
    sodium_memzero(&key, sizeof key);
    hkn_report_reset(&rep);
    if (rc)
        release_free(r);
    return rc;
}

/* ---- sign -------------------------------------------------------------- */

int hkc_cmd_sign(int argc, char **argv) {
    static const struct option lo[] = {
        {"key", required_argument, 0, 'k'},     {"module", required_argument, 0, 'm'},
        {"version", required_argument, 0, 'v'}, {"expires-in", required_argument, 0, 'e'},
        {"arch", required_argument, 0, 'a'},    {"out", required_argument, 0, 'o'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0},
    };
    const char *cmd = argv[0], *key = NULL, *module = NULL, *out = NULL, *arch = NULL;
    uint64_t version = 0, expires_in = 30 * 86400;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "k:m:v:e:a:o:h", lo, NULL)) != -1) {
        switch (c) {
        case 'k':
            key = optarg;
            break;
        case 'm':
            module = optarg;
            break;
        case 'v':
            if (parse_u64(optarg, &version) || version == 0)
                return usage_error(cmd, "--version needs a positive integer");
            break;
        case 'e':
            if (parse_expires(optarg, &expires_in))
                return usage_error(cmd, EXPIRES_RANGE);
            break;
        case 'a':
            arch = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'h':
            printf("usage: hotkern %s --key SECRET --module M --version N [--expires-in SECONDS]\n"
                   "       [--arch sm_XX] --out DIR FILE...\n\n"
                   "Writes a signed release that any static HTTP server can serve to pullers:\n"
                   "  DIR/manifest.json        module, version, expiry, key id, artifacts\n"
                   "  DIR/manifest.json.sig    Ed25519 signature of manifest.json, base64\n"
                   "  DIR/artifacts/<sha256>   each FILE, named by its content hash\n"
                   "FILE formats come from the extension: .cu .ptx .cubin .fatbin; --arch\n"
                   "labels the cubin/fatbin files; .h .cuh .hpp files are headers that the\n"
                   "release's CUDA C includes by name. The release expires after --expires-in\n"
                   "seconds (default 30 days). Versions must grow: pullers refuse a version\n"
                   "not newer than one they accepted. Artifacts are written first and the\n"
                   "manifest last, so a poller never sees a manifest before its artifacts.\n"
                   "Publish at most once a second into one directory: static servers such as\n"
                   "nginx derive ETag and Last-Modified from the file's size and mtime in\n"
                   "seconds, so two same-sized manifests within a second look unchanged.\n",
                   cmd);
            return 0;
        default:
            return usage_error(cmd, "bad option");
        }
    }
    if (!key || !module || !version || !out)
        return usage_error(cmd, "--key, --module, --version and --out are required");
    struct release r;
    int rc = build_release(cmd, key, module, version, expires_in, arch, argv + optind,
                           argc - optind, &r);
    if (rc)
        return rc;
    hk_report rep = HK_REPORT_INIT;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/artifacts", out);
    if ((mkdir(out, 0755) != 0 && errno != EEXIST) || (mkdir(path, 0755) != 0 && errno != EEXIST)) {
        fprintf(stderr, "hotkern %s: mkdir %s: %s\n", cmd, path, strerror(errno));
        rc = 1;
        goto out;
    }
    for (size_t i = 0; i < r.n; i++) {
        char hex[65];
        hkn_sha256_hex(r.blobs[i].bytes, r.blobs[i].size, hex);
        snprintf(path, sizeof path, "%s/artifacts/%s", out, hex);
        if (hkn_write_atomic(path, r.blobs[i].bytes, r.blobs[i].size, 0644, &rep)) {
            rc = fail(cmd, &rep);
            goto out;
        }
        printf("artifact %s  %s (%zu bytes)\n", hex, r.blobs[i].name, r.blobs[i].size);
    }
    char sigline[256];
    snprintf(sigline, sizeof sigline, "%s\n", r.sig);
    snprintf(path, sizeof path, "%s/manifest.json.sig", out);
    if (hkn_write_atomic(path, sigline, strlen(sigline), 0644, &rep)) {
        rc = fail(cmd, &rep);
        goto out;
    }
    snprintf(path, sizeof path, "%s/manifest.json", out);
    if (hkn_write_atomic(path, r.manifest, r.manifest_len, 0644, &rep)) {
        rc = fail(cmd, &rep);
        goto out;
    }
    printf("release %s v%llu written to %s\n", module, (unsigned long long)version, out);
out:
    hkn_report_reset(&rep);
    release_free(&r);
    return rc;
}

/* ---- HTTP client ------------------------------------------------------- */

struct resp {
    char *data;
    size_t len;
};

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud) {
    struct resp *r = ud;
    size_t n = size * nmemb;
    if (r->len + n > (16u << 20))
        return 0; /* answers are small JSON; anything bigger is not ours */
    char *nd = realloc(r->data, r->len + n + 1);
    if (!nd)
        return 0;
    memcpy(nd + r->len, p, n);
    r->data = nd;
    r->len += n;
    r->data[r->len] = '\0';
    return n;
}

struct http_opts {
    const char *token;
    const char *cacert;
    int insecure;
    long timeout_s;
};

/* One request; returns the HTTP status, or -1 with a message printed. */
static long http(const char *cmd, const char *method, const char *url, const char *body,
                 size_t body_len, const struct http_opts *o, struct resp *out) {
    char err[CURL_ERROR_SIZE] = "", auth[1024];
    struct curl_slist *h = NULL;
    long status = -1;
    memset(out, 0, sizeof *out);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *c = curl_easy_init();
    if (!c)
        return -1;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_USERAGENT, "hotkern-cli/0.1");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, o->timeout_s > 0 ? o->timeout_s : 120L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    if (o->cacert)
        curl_easy_setopt(c, CURLOPT_CAINFO, o->cacert);
    if (o->insecure) {
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    if (o->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", o->token);
        h = curl_slist_append(h, auth);
    }
    if (!strcmp(method, "POST")) {
        h = curl_slist_append(h, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? body_len : 0));
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    else
        fprintf(stderr, "hotkern %s: %s %s: %s\n", cmd, method, url,
                err[0] ? err : curl_easy_strerror(rc));
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return status;
}

/* base + path, unless base already names a /v1/ route or /metrics. */
static char *route_url(const char *base, const char *path) {
    char *u = NULL;
    size_t n = strlen(base);
    while (n > 0 && base[n - 1] == '/')
        n--;
    if (asprintf(&u, "%.*s%s", (int)n, base, path) < 0)
        return NULL;
    return u;
}

/* Prints the server's JSON answer as lines a person reads. */
static void print_outcome(const char *cmd, long status, const struct resp *r) {
    cJSON *o = r->data ? cJSON_ParseWithLength(r->data, r->len) : NULL;
    const cJSON *outcome = cJSON_GetObjectItemCaseSensitive(o, "outcome");
    if (!cJSON_IsString(outcome)) {
        fprintf(stderr, "hotkern %s: HTTP %ld: %s\n", cmd, status, r->data ? r->data : "");
        cJSON_Delete(o);
        return;
    }
    const cJSON *mod = cJSON_GetObjectItemCaseSensitive(o, "module");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "engine_version");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(o, "message");
    const cJSON *log = cJSON_GetObjectItemCaseSensitive(o, "log");
    FILE *f = status == 200 ? stdout : stderr;
    fprintf(f, "%s (HTTP %ld): module %s", outcome->valuestring, status,
            cJSON_IsString(mod) ? mod->valuestring : "?");
    if (cJSON_IsNumber(ver) && ver->valuedouble > 0)
        fprintf(f, " release v%.0f", ver->valuedouble);
    if (cJSON_IsNumber(ev))
        fprintf(f, ", engine version %.0f", ev->valuedouble);
    fprintf(f, "\n");
    if (status != 200 && cJSON_IsString(err))
        fprintf(f, "error: %s\n", err->valuestring);
    if (cJSON_IsString(msg) && msg->valuestring[0])
        fprintf(f, "message: %s\n", msg->valuestring);
    if (cJSON_IsString(log) && log->valuestring[0])
        fprintf(f, "log:\n%s%s", log->valuestring,
                log->valuestring[strlen(log->valuestring) - 1] == '\n' ? "" : "\n");
    cJSON_Delete(o);
}

/* Options shared by push, status and rollback. */
static int http_opt(int c, struct http_opts *o) {
    switch (c) {
    case 't':
        o->token = optarg;
        return 1;
    case 'C':
        o->cacert = optarg;
        return 1;
    case 'K':
        o->insecure = 1;
        return 1;
    case 'T':
        o->timeout_s = atol(optarg);
        return 1;
    default:
        return 0;
    }
}

#define HTTP_LONGOPTS                                                                              \
    {"token", required_argument, 0, 't'}, {"cacert", required_argument, 0, 'C'},                   \
        {"insecure", no_argument, 0, 'K'}, {                                                       \
        "timeout", required_argument, 0, 'T'                                                       \
    }

#define HTTP_HELP                                                                                  \
    "  --token T      send 'Authorization: Bearer T' (or set HOTKERN_TOKEN)\n"                     \
    "  --cacert FILE  trust this CA/certificate for https:// URLs\n"                               \
    "  --insecure     do not verify the server's certificate (testing only)\n"                     \
    "  --timeout S    give up after S seconds (default 120)\n"

/* ---- push -------------------------------------------------------------- */

int hkc_cmd_push(int argc, char **argv) {
    static const struct option lo[] = {
        {"key", required_argument, 0, 'k'},
        {"module", required_argument, 0, 'm'},
        {"version", required_argument, 0, 'v'},
        {"expires-in", required_argument, 0, 'e'},
        {"arch", required_argument, 0, 'a'},
        {"help", no_argument, 0, 'h'},
        HTTP_LONGOPTS,
        {0, 0, 0, 0},
    };
    const char *key = NULL, *module = NULL, *arch = NULL;
    uint64_t version = 0, expires_in = 3600;
    struct http_opts ho = {.token = getenv("HOTKERN_TOKEN")};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "k:m:v:e:a:h", lo, NULL)) != -1) {
        if (http_opt(c, &ho))
            continue;
        switch (c) {
        case 'k':
            key = optarg;
            break;
        case 'm':
            module = optarg;
            break;
        case 'v':
            if (parse_u64(optarg, &version) || version == 0)
                return usage_error("push", "--version needs a positive integer");
            break;
        case 'e':
            if (parse_expires(optarg, &expires_in))
                return usage_error("push", EXPIRES_RANGE);
            break;
        case 'a':
            arch = optarg;
            break;
        case 'h':
            printf(
                "usage: hotkern push URL --key SECRET --module M [--version N] [--token T]\n"
                "       [--expires-in SECONDS] [--arch sm_XX] FILE...\n\n"
                "Signs FILE... as release N of module M and POSTs it to URL/v1/release\n"
                "(headers, .h .cuh .hpp, travel with it for the CUDA C FILE to include)\n"
                "(URL is the endpoint's base, e.g. http://127.0.0.1:7070). The version\n"
                "defaults to the current unix time in milliseconds, so successive pushes\n"
                "grow; the release expires after --expires-in seconds (default 3600).\n"
                "Prints the endpoint's outcome, with the compiler/JIT log on a refusal.\n" HTTP_HELP
                "Exit status: 0 committed, 1 refused or failed, 2 usage.\n");
            return 0;
        default:
            return usage_error("push", "bad option");
        }
    }
    if (optind >= argc)
        return usage_error("push", "URL is required");
    const char *base = argv[optind++];
    if (!key || !module)
        return usage_error("push", "--key and --module are required");
    if (!version)
        version = now_ms();
    struct release r;
    int rc = build_release("push", key, module, version, expires_in, arch, argv + optind,
                           argc - optind, &r);
    if (rc)
        return rc;
    rc = 1;
    char *url = route_url(base, "/v1/release"), *body = NULL;
    struct resp resp = {0};
    cJSON *o = cJSON_CreateObject(), *arts = NULL;
    if (!url || !o || !cJSON_AddStringToObject(o, "manifest", r.manifest) ||
        !cJSON_AddStringToObject(o, "signature", r.sig) ||
        !(arts = cJSON_AddObjectToObject(o, "artifacts")))
        goto out;
    for (size_t i = 0; i < r.n; i++) {
        char hex[65];
        size_t blen = sodium_base64_ENCODED_LEN(r.blobs[i].size, sodium_base64_VARIANT_ORIGINAL);
        char *b64 = malloc(blen);
        if (!b64)
            goto out;
        sodium_bin2base64(b64, blen, r.blobs[i].bytes, r.blobs[i].size,
                          sodium_base64_VARIANT_ORIGINAL);
        hkn_sha256_hex(r.blobs[i].bytes, r.blobs[i].size, hex);
        cJSON *s = cJSON_CreateString(b64);
        free(b64);
        if (!s)
            goto out;
        cJSON_AddItemToObject(arts, hex, s);
    }
    if (!(body = cJSON_PrintUnformatted(o)))
        goto out;
    long status = http("push", "POST", url, body, strlen(body), &ho, &resp);
    if (status < 0)
        goto out;
    print_outcome("push", status, &resp);
    rc = status == 200 ? 0 : 1;
out:
    cJSON_Delete(o);
    free(body);
    free(url);
    free(resp.data);
    release_free(&r);
    return rc;
}

/* ---- status and rollback ----------------------------------------------- */

/* Parses the options status and rollback share. Returns -1 to go on, or
 * the exit status (help shown: 0, bad option: 2). */
static int parse_http_cmd(const char *cmd, const char *help, int argc, char **argv,
                          struct http_opts *ho) {
    static const struct option lo[] = {{"help", no_argument, 0, 'h'}, HTTP_LONGOPTS, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (http_opt(c, ho))
            continue;
        if (c == 'h') {
            fputs(help, stdout);
            return 0;
        }
        return usage_error(cmd, "bad option");
    }
    return -1;
}

int hkc_cmd_status(int argc, char **argv) {
    struct http_opts ho = {.token = getenv("HOTKERN_TOKEN"), .timeout_s = 30};
    int done = parse_http_cmd("status",
                              "usage: hotkern status URL [--token T]\n\n"
                              "Prints GET URL/v1/status: each module's release and engine "
                              "versions and\nits last outcome, message and build log.\n" HTTP_HELP,
                              argc, argv, &ho);
    if (done >= 0)
        return done;
    if (optind != argc - 1)
        return usage_error("status", "URL is required");
    char *url = route_url(argv[optind], "/v1/status");
    struct resp resp = {0};
    int rc = 1;
    long status = url ? http("status", "GET", url, NULL, 0, &ho, &resp) : -1;
    if (status >= 0) {
        cJSON *o = resp.data ? cJSON_ParseWithLength(resp.data, resp.len) : NULL;
        char *pretty = o ? cJSON_Print(o) : NULL;
        fprintf(status == 200 ? stdout : stderr, "%s\n",
                pretty ? pretty : (resp.data ? resp.data : ""));
        free(pretty);
        cJSON_Delete(o);
        rc = status == 200 ? 0 : 1;
    }
    free(url);
    free(resp.data);
    return rc;
}

/* The previous release of module as the endpoint reports it (0 when none). */
static int previous_release(const char *base, const char *module, const struct http_opts *ho,
                            uint64_t *out) {
    char *url = route_url(base, "/v1/status");
    struct resp resp = {0};
    int rc = -1;
    long status = url ? http("rollback", "GET", url, NULL, 0, ho, &resp) : -1;
    cJSON *o = status == 200 && resp.data ? cJSON_ParseWithLength(resp.data, resp.len) : NULL;
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(o, "modules")) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "module");
        const cJSON *prev = cJSON_GetObjectItemCaseSensitive(m, "previous_release_version");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, module) && cJSON_IsNumber(prev)) {
            *out = (uint64_t)prev->valuedouble;
            rc = 0;
        }
    }
    if (rc)
        fprintf(stderr,
                "hotkern rollback: the endpoint's status names no release of '%s'; give --to\n",
                module);
    cJSON_Delete(o);
    free(url);
    free(resp.data);
    return rc;
}

int hkc_cmd_rollback(int argc, char **argv) {
    static const struct option lo[] = {
        {"key", required_argument, 0, 'k'},
        {"to", required_argument, 0, 'o'},
        {"expires-in", required_argument, 0, 'e'},
        {"help", no_argument, 0, 'h'},
        HTTP_LONGOPTS,
        {0, 0, 0, 0},
    };
    struct http_opts ho = {.token = getenv("HOTKERN_TOKEN"), .timeout_s = 120};
    const char *key_path = NULL;
    uint64_t target = 0, expires_in = 300;
    int have_target = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "k:h", lo, NULL)) != -1) {
        if (http_opt(c, &ho))
            continue;
        switch (c) {
        case 'k':
            key_path = optarg;
            break;
        case 'o':
            if (parse_u64(optarg, &target) || (double)target > 9007199254740991.0)
                return usage_error("rollback", "--to needs a release version");
            have_target = 1;
            break;
        case 'e':
            if (parse_u64(optarg, &expires_in) || expires_in < 1 || expires_in > HKN_ROLLBACK_MAX_S)
                return usage_error("rollback", "--expires-in needs seconds from 1 to 3600");
            break;
        case 'h':
            printf("usage: hotkern rollback URL MODULE (--token T | --key SECRET [--to N])\n"
                   "       [--expires-in SECONDS]\n\n"
                   "Asks the endpoint at URL to commit MODULE's previous image again\n"
                   "(POST URL/v1/rollback/MODULE) and prints the outcome. A rollback needs\n"
                   "the same authority as a release: the endpoint's token, or a request\n"
                   "signed with --key, naming the release N to be running afterwards\n"
                   "(default: the previous release the endpoint reports) and expiring\n"
                   "after --expires-in seconds (default 300, at most 3600). A signed\n"
                   "request is good for one use.\n" HTTP_HELP
                   "Exit status: 0 rolled back, 1 refused or failed, 2 usage.\n");
            return 0;
        default:
            return usage_error("rollback", "bad option");
        }
    }
    if (optind != argc - 2)
        return usage_error("rollback", "URL and MODULE are required");
    const char *base = argv[optind], *module = argv[optind + 1];
    if (!hkn_valid_name(module, 64))
        return usage_error("rollback", "MODULE must be [A-Za-z0-9_.-]{1,63}");
    char *body = NULL, *text = NULL, *sig = NULL;
    size_t tlen = 0;
    int rc = 1;
    if (key_path) {
        hkn_seckey key;
        hk_report rep = HK_REPORT_INIT;
        if (!have_target && previous_release(base, module, &ho, &target))
            return 1;
        int err = hkn_seckey_load(key_path, &key, &rep) ||
                  hkn_rollback_sign(&key, module, target, (int64_t)time(NULL) + (int64_t)expires_in,
                                    &text, &tlen, &sig, &rep);
        sodium_memzero(&key, sizeof key);
        if (err) {
            fail("rollback", &rep);
            hkn_report_reset(&rep);
            return 1;
        }
        cJSON *o = cJSON_CreateObject();
        if (o && cJSON_AddStringToObject(o, "request", text) &&
            cJSON_AddStringToObject(o, "signature", sig))
            body = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!body)
            goto out;
    }
    /* The name is checked above; escaping keeps the URL well formed anyway. */
    CURL *esc = curl_easy_init();
    char *enc = esc ? curl_easy_escape(esc, module, 0) : NULL;
    char path[256];
    if (!enc || snprintf(path, sizeof path, "/v1/rollback/%s", enc) >= (int)sizeof path) {
        curl_free(enc);
        curl_easy_cleanup(esc);
        goto out;
    }
    curl_free(enc);
    curl_easy_cleanup(esc);
    char *url = route_url(base, path);
    struct resp resp = {0};
    long status =
        url ? http("rollback", "POST", url, body, body ? strlen(body) : 0, &ho, &resp) : -1;
    if (status >= 0) {
        print_outcome("rollback", status, &resp);
        rc = status == 200 ? 0 : 1;
    }
    free(url);
    free(resp.data);
out:
    free(body);
    free(text);
    free(sig);
    return rc;
}

/* ---- pull -------------------------------------------------------------- */

/* Without a GPU the tool "applies" a release by reporting it: the verified
 * artifacts are already in --out (the puller's save_dir). */
static int print_apply(void *ud, const char *module, uint64_t version, hk_format fmt,
                       const void *bytes, size_t size, const hk_header *headers, int nheaders,
                       const char *origin, hk_report *rep) {
    char hex[65];
    hkn_sha256_hex(bytes, size, hex);
    printf("applied %s v%llu: %s %zu bytes sha256 %s", module, (unsigned long long)version,
           hk_format_name(fmt), size, hex);
    for (int i = 0; i < nheaders; i++)
        printf("%s%s", i ? ", " : " with headers ", headers[i].name);
    printf("\n");
    fflush(stdout);
    return 0;
}

int hkc_cmd_pull(int argc, char **argv) {
    static const struct option lo[] = {
        {"pubkey", required_argument, 0, 'p'},
        {"state", required_argument, 0, 's'},
        {"out", required_argument, 0, 'o'},
        {"once", no_argument, 0, '1'},
        {"count", required_argument, 0, 'n'},
        {"interval-ms", required_argument, 0, 'i'},
        {"timeout-ms", required_argument, 0, 'T'},
        {"cacert", required_argument, 0, 'C'},
        {"allow-unsigned", no_argument, 0, 'U'},
        {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    hkn_pull_cfg cfg;
    hkn_pull_cfg_init(&cfg);
    const char *pubkey = NULL, *out = NULL;
    uint64_t count = 0, interval = 1000, timeout = 10000;
    int quiet = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "p:s:o:1n:i:T:C:Uqh", lo, NULL)) != -1) {
        switch (c) {
        case 'p':
            pubkey = optarg;
            break;
        case 's':
            cfg.state_dir = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case '1':
            count = 1;
            break;
        case 'n':
            if (parse_u64(optarg, &count) || count == 0 || count > 1000000)
                return usage_error("pull", "--count needs 1 to 1000000");
            break;
        case 'i':
            if (parse_u64(optarg, &interval) || interval == 0 || interval > 86400000)
                return usage_error("pull", "--interval-ms needs 1 to 86400000");
            break;
        case 'T':
            if (parse_u64(optarg, &timeout) || timeout == 0 || timeout > 3600000)
                return usage_error("pull", "--timeout-ms needs 1 to 3600000");
            break;
        case 'C':
            cfg.ca_file = optarg;
            break;
        case 'U':
            cfg.trust.allow_unsigned = 1;
            break;
        case 'q':
            quiet = 1;
            break;
        case 'h':
            printf("usage: hotkern pull URL --pubkey FILE [--state DIR] [--out DIR]\n"
                   "       (--once | --count N) [--interval-ms MS] [--timeout-ms MS]\n\n"
                   "Polls the release at URL (a manifest.json written by 'hotkern sign'),\n"
                   "verifies it against the public key (signature, expiry, version newer\n"
                   "than the one recorded in --state, artifact hashes) and writes its\n"
                   "artifacts into --out. --state defaults to the record the endpoint\n"
                   "and pullers share ($XDG_STATE_HOME/hotkern/releases, else\n"
                   "~/.local/state/hotkern/releases). --once polls once; --count N polls N times,\n"
                   "--interval-ms apart (+-10%% jitter, default 1000). Requests are\n"
                   "conditional (ETag, Last-Modified), so an unchanged origin answers 304.\n"
                   "Each transfer gives up after --timeout-ms (default 10000).\n"
                   "Prints each release applied and, at the end, the counters.\n"
                   "Exit status: 0 when the last poll succeeded, 1 otherwise, 2 usage.\n");
            return 0;
        default:
            return usage_error("pull", "bad option");
        }
    }
    if (optind != argc - 1)
        return usage_error("pull", "URL is required");
    if (!count)
        return usage_error("pull", "--once or --count N is required");
    char defdir[PATH_MAX];
    if (!cfg.state_dir) {
        hk_report drep = HK_REPORT_INIT;
        if (hkn_default_state_dir(defdir, sizeof defdir, &drep))
            return usage_error("pull", drep.message);
        cfg.state_dir = defdir;
    }
    if (!pubkey && !cfg.trust.allow_unsigned)
        return usage_error("pull", "--pubkey FILE is required");
    hk_report rep = HK_REPORT_INIT;
    hkn_puller *p = NULL;
    int rc = 1, err = 0;
    if (pubkey) {
        if (hkn_pubkey_load(pubkey, &cfg.trust.keys[0], &rep))
            goto out;
        cfg.trust.nkeys = 1;
    }
    if (out && mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "hotkern pull: mkdir %s: %s\n", out, strerror(errno));
        goto out;
    }
    cfg.url = argv[optind];
    cfg.save_dir = out;
    cfg.interval_ms = (unsigned)interval;
    cfg.total_timeout_ms = (unsigned)timeout;
    cfg.connect_timeout_ms = (unsigned)(timeout < 5000 ? timeout : 5000);
    hkn_engine eng = {.apply = print_apply};
    if (hkn_pull_create(&cfg, &eng, &p, &rep))
        goto out;
    for (uint64_t i = 0; i < count; i++) {
        hkn_report_reset(&rep);
        err = hkn_pull_poll(p, &rep);
        if (err && !quiet)
            fprintf(stderr, "hotkern pull: %s: %s\n", hkn_error_name(err), rep.message);
        if (i + 1 < count) {
            uint64_t d =
                interval - interval / 10 + randombytes_uniform((uint32_t)(interval / 5 + 1));
            struct timespec ts = {(time_t)(d / 1000), (long)(d % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
        }
    }
    hkn_pull_stats s;
    hkn_pull_stats_get(p, &s);
    printf("requests %llu not_modified %llu errors %llu refused %llu applied %llu\n",
           (unsigned long long)s.requests, (unsigned long long)s.not_modified,
           (unsigned long long)s.errors, (unsigned long long)s.refused,
           (unsigned long long)s.applied);
    hkn_report_reset(&rep);
    rc = err ? 1 : 0;
out:
    if (rep.error)
        fail("pull", &rep);
    hkn_pull_destroy(p);
    hkn_report_reset(&rep);
    return rc;
}

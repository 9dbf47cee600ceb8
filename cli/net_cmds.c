/*
 * Release subcommands of the hotkern tool: keygen, sign (alias publish), push
 * and pull.
 *
 * They share the release code of the library (net/net.h) so that what the
 * tool signs is byte for byte what the endpoint and the puller verify. push
 * speaks HTTP through cli/http.c, pull through the library's puller. The
 * release version is --release N everywhere; --version stays the tool's own
 * (hotkern --version), and given to a subcommand it is refused with a pointer
 * to --release, never taken for a release number.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "cli/cli.h"
#include "net/net.h"

/* --release N and the refusal of --version N, shared by sign and push. A
 * release lives at least a second and at most HKN_MAX_LIFETIME_S: a larger
 * value would overflow the expiry or sign a release no verifier accepts. */
#define RELEASE_OPTS(release, expires_in)                                                          \
    HKC_UINT_OPT("--release", release, 1, HKC_MAX_RELEASE,                                         \
                 "--release needs an integer from 1 to 2^53-1"),                                   \
        {.name = "--version",                                                                      \
         .kind = HKC_REFUSED,                                                                      \
         .why = "the release version is given with --release N ('hotkern --version' prints the "   \
                "tool's version)"},                                                                \
        HKC_UINT_OPT("--expires-in", expires_in, 1, HKN_MAX_LIFETIME_S,                            \
                     "--expires-in needs seconds from 1 to 31622400 (366 days)")

/* The wall clock (expiries and request times are dates). */
static uint64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- keygen ------------------------------------------------------------ */

static const char keygen_help[] =
    "usage: hotkern keygen --out DIR [--force]\n\n"
    "Creates an Ed25519 key pair for signing releases:\n"
    "  DIR/hotkern.key  secret key (mode 0600): keep it with the publisher\n"
    "  DIR/hotkern.pub  public key: give it to endpoints and pullers\n"
    "Both hold one line of hex. Prints the key id (16 hex chars).\n"
    "An existing key is never overwritten unless --force is given.\n";

static int write_keys(hkc_out *o, const char *sk_path, const char *pk_path) {
    hkn_seckey k;
    hk_report rep = HK_REPORT_INIT;
    int rc = 0;
    if (hkn_keygen(&k) != 0)
        rc = hkc_fail(o, HK_ERR_UNSUPPORTED, NULL, "libsodium failed to initialise");
    else if (hkn_seckey_save(sk_path, &k, &rep) || hkn_pubkey_save(pk_path, &k.pub, &rep))
        rc = hkc_fail_report(o, &rep);
    else
        printf("key id: %s\nsecret: %s\npublic: %s\n", k.pub.id, sk_path, pk_path);
    sodium_memzero(&k, sizeof k);
    hk_report_clear(&rep);
    return rc;
}

int hkc_cmd_keygen(int argc, char **argv) {
    const char *out = NULL;
    int force = 0, nargs = 0;
    const hkc_opt opts[] = {
        HKC_STRING_OPT("--out", &out),
        HKC_FLAG_OPT("--force", &force),
    };
    hkc_out o;
    int rc = hkc_parse(&o, "keygen", opts, HKC_NOPTS(opts), keygen_help, argc, argv, &nargs);
    if (rc != HKC_CONTINUE)
        return rc;
    if (!out || nargs != 0)
        return hkc_usage(&o, "--out DIR is required");
    char sk_path[PATH_MAX], pk_path[PATH_MAX];
    snprintf(sk_path, sizeof sk_path, "%s/hotkern.key", out);
    snprintf(pk_path, sizeof pk_path, "%s/hotkern.pub", out);
    if (mkdir(out, 0700) != 0 && errno != EEXIST)
        return hkc_fail(&o, HK_ERR_IO, NULL, "mkdir %s: %s", out, strerror(errno));
    if (!force && access(sk_path, F_OK) == 0)
        return hkc_fail(&o, HK_ERR_IO, NULL, "%s exists; use --force to replace it", sk_path);
    return write_keys(&o, sk_path, pk_path);
}

/* ---- building a release ------------------------------------------------ */

struct release {
    const char *module;
    uint64_t version;
    char *manifest;
    size_t manifest_len;
    char *sig;
    char **bytes;
    hkn_blob blobs[HKN_MAX_ARTIFACTS];
    size_t n, nfiles; /* blobs; those of them read from files (bytes) */
    hkc_built *built; /* the cubins --build-for appended to blobs */
};

static void release_free(struct release *r) {
    free(r->manifest);
    free(r->sig);
    for (size_t i = 0; i < r->nfiles; i++)
        free(r->bytes ? r->bytes[i] : NULL);
    free(r->bytes);
    hkc_built_free(r->built);
    memset(r, 0, sizeof *r);
}

/* Reads the files into r (r->n counts those read). */
static int read_files(hkc_out *o, const char *arch, char **files, int nfiles, struct release *r) {
    hk_report rep = HK_REPORT_INIT;
    if (!(r->bytes = calloc((size_t)nfiles, sizeof *r->bytes)))
        return hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    for (int i = 0; i < nfiles; i++) {
        size_t len;
        if (hku_read_file(files[i], HKC_MAX_INPUT, &r->bytes[i], &len, &rep)) {
            int rc = hkc_fail_report(o, &rep);
            hk_report_clear(&rep);
            return rc;
        }
        r->n = r->nfiles = (size_t)i + 1;
        hk_format f = hkn_format_from_name(files[i]); /* AUTO for a header */
        r->blobs[i] =
            (hkn_blob){.name = files[i],
                       .bytes = r->bytes[i],
                       .size = len,
                       .format = f,
                       .arch = (f == HK_FORMAT_CUBIN || f == HK_FORMAT_FATBIN) ? arch : NULL};
    }
    return 0;
}

/* Reads the files, builds the cubins --build-for lists (build_for NULL:
 * none) and signs a release of them (r->module, r->version set by the
 * caller) with every key of the list (the first one's id in the manifest).
 * Returns an exit status; r is freed on failure. */
static int build_release(hkc_out *o, const hkc_list *key_paths, uint64_t expires_in,
                         const char *arch, const char *build_for, char **files, int nfiles,
                         struct release *r) {
    hk_report rep = HK_REPORT_INIT;
    hkn_seckey keys[HKN_MAX_KEYS];
    int rc = 0;
    if (nfiles < 1 || nfiles > HKN_MAX_ARTIFACTS)
        return hkc_usage(o, "give 1 to %d kernel and header files", HKN_MAX_ARTIFACTS);
    if (!(rc = hkc_keys_load(o, key_paths, keys)) &&
        (rc = read_files(o, arch, files, nfiles, r)) == 0 &&
        (!build_for ||
         (rc = hkc_build_for(o, build_for, r->blobs, &r->n, HKN_MAX_ARTIFACTS, &r->built)) == 0)) {
        int64_t now = (int64_t)time(NULL);
        if (hkn_release_sign(&keys[0], r->module, r->version, now, now + (int64_t)expires_in,
                             r->blobs, r->n, &r->manifest, &r->manifest_len, &r->sig, &rep))
            rc = hkc_fail_report(o, &rep);
        else
            rc = hkc_sign_lines(o, keys, key_paths->n, r->manifest, r->manifest_len, &r->sig);
    }
    sodium_memzero(keys, sizeof keys);
    hk_report_clear(&rep);
    if (rc)
        release_free(r);
    return rc;
}

/* ---- sign -------------------------------------------------------------- */

static const char sign_help[] =
    "usage: hotkern sign --key SECRET [--key SECRET...] --module M --release N\n"
    "       [--expires-in SECONDS] [--arch sm_XX] [--build-for sm_XY,...] --out DIR FILE...\n\n"
    "Writes a signed release that any static HTTP server can serve to pullers:\n"
    "  DIR/manifest.json        module, release, expiry, key id, artifacts\n"
    "  DIR/manifest.json.sig    Ed25519 signature of manifest.json, base64; with\n"
    "                           several --key, one 'KEYID SIGNATURE' line each\n"
    "                           (hosts with a signature_threshold need that many;\n"
    "                           'hotkern cosign' adds one later)\n"
    "  DIR/artifacts/<sha256>   each FILE, named by its content hash\n"
    "FILE formats come from the extension: .cu .ptx .cubin .fatbin; --arch\n"
    "labels the cubin/fatbin files; .h .cuh .hpp files are headers that the\n"
    "release's CUDA C includes by name. --build-for sm_80,sm_90 compiles each\n"
    "CUDA C file here for each architecture (NVRTC, no GPU needed) and ships\n"
    "the cubins beside it, signed: a host whose GPU runs one loads it and\n"
    "compiles nothing, the others build the source; an architecture that does\n"
    "not build refuses the publish with the compiler's log, writing nothing.\n"
    "The release expires after --expires-in\n"
    "seconds (default 30 days). Releases must grow: pullers refuse a release\n"
    "not newer than one they accepted. Artifacts are written first and the\n"
    "manifest last, so a poller never sees a manifest before its artifacts.\n"
    "Publish at most once a second into one directory: static servers such as\n"
    "nginx derive ETag and Last-Modified from the file's size and mtime in\n"
    "seconds, so two same-sized manifests within a second look unchanged.\n";

/* Writes the release into dir: artifacts, then the signature, then the
 * manifest. */
static int write_release(hkc_out *o, const char *dir, const struct release *r) {
    hk_report rep = HK_REPORT_INIT;
    char path[PATH_MAX];
    int rc = 0;
    snprintf(path, sizeof path, "%s/artifacts", dir);
    if ((mkdir(dir, 0755) != 0 && errno != EEXIST) || (mkdir(path, 0755) != 0 && errno != EEXIST))
        return hkc_fail(o, HK_ERR_IO, NULL, "mkdir %s: %s", path, strerror(errno));
    for (size_t i = 0; i < r->n && !rc; i++) {
        char hex[65];
        hkn_sha256_hex(r->blobs[i].bytes, r->blobs[i].size, hex);
        snprintf(path, sizeof path, "%s/artifacts/%s", dir, hex);
        if (hku_write_atomic(path, r->blobs[i].bytes, r->blobs[i].size, 0644, &rep))
            rc = hkc_fail_report(o, &rep);
        else
            printf("artifact %s  %s (%zu bytes)\n", hex, r->blobs[i].name, r->blobs[i].size);
    }
    size_t slen = strlen(r->sig);
    int nl = slen && r->sig[slen - 1] == '\n'; /* several lines end in one already */
    struct iovec iov[2] = {{r->sig, slen}, {"\n", nl ? 0 : 1}};
    snprintf(path, sizeof path, "%s/manifest.json.sig", dir);
    if (!rc && hku_write_atomicv(path, iov, 2, 0644, &rep))
        rc = hkc_fail_report(o, &rep);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (!rc && hku_write_atomic(path, r->manifest, r->manifest_len, 0644, &rep))
        rc = hkc_fail_report(o, &rep);
    hk_report_clear(&rep);
    return rc;
}

int hkc_cmd_sign(int argc, char **argv) {
    const char *out = NULL, *arch = NULL, *build_for = NULL;
    hkc_list key = {0};
    struct release r = {0};
    uint64_t expires_in = 30 * 86400;
    int nargs = 0;
    const hkc_opt opts[] = {
        HKC_LIST_OPT("--key", &key),           HKC_STRING_OPT("--module", &r.module),
        RELEASE_OPTS(&r.version, &expires_in), HKC_STRING_OPT("--arch", &arch),
        HKC_STRING_OPT("--out", &out),         HKC_STRING_OPT("--build-for", &build_for),
    };
    hkc_out o;
    int rc = hkc_parse(&o, argv[0], opts, HKC_NOPTS(opts), sign_help, argc, argv, &nargs);
    if (rc == HKC_CONTINUE && (!key.n || !r.module || !r.version || !out))
        rc = hkc_usage(&o, "--key, --module, --release and --out are required");
    if (rc == HKC_CONTINUE &&
        (rc = build_release(&o, &key, expires_in, arch, build_for, argv + 1, nargs, &r)) == 0 &&
        (rc = write_release(&o, out, &r)) == 0)
        printf("release %s v%llu written to %s (%d signature%s)\n", r.module,
               (unsigned long long)r.version, out, key.n, key.n > 1 ? "s" : "");
    release_free(&r);
    hkc_list_free(&key);
    return rc == HKC_CONTINUE ? 0 : rc;
}

/* ---- push -------------------------------------------------------------- */

/* The JSON body of POST /v1/release: manifest, signature, artifacts in
 * base64 by their SHA-256. NULL when out of memory. */
static char *release_json(const struct release *r) {
    cJSON *o = cJSON_CreateObject(), *arts = NULL;
    char *body = NULL;
    if (!o || !cJSON_AddStringToObject(o, "manifest", r->manifest) ||
        !cJSON_AddStringToObject(o, "signature", r->sig) ||
        !(arts = cJSON_AddObjectToObject(o, "artifacts")))
        goto out;
    for (size_t i = 0; i < r->n; i++) {
        char hex[65];
        size_t blen = sodium_base64_ENCODED_LEN(r->blobs[i].size, sodium_base64_VARIANT_ORIGINAL);
        char *b64 = malloc(blen);
        if (!b64)
            goto out;
        sodium_bin2base64(b64, blen, r->blobs[i].bytes, r->blobs[i].size,
                          sodium_base64_VARIANT_ORIGINAL);
        hkn_sha256_hex(r->blobs[i].bytes, r->blobs[i].size, hex);
        cJSON *s = cJSON_CreateString(b64);
        free(b64);
        if (!s || !cJSON_AddItemToObject(arts, hex, s)) {
            cJSON_Delete(s);
            goto out;
        }
    }
    body = cJSON_PrintUnformatted(o);
out:
    cJSON_Delete(o);
    return body;
}

/* The body of POST /v1/release and its type: the binary frame (the
 * release's bytes once, net/frame.c), or with json_body the JSON body. */
static int release_body(hkc_out *o, struct release *r, int json_body, void **body, size_t *len,
                        const char **type) {
    if (json_body) {
        char *text = release_json(r);
        *body = text;
        *len = text ? strlen(text) : 0;
        *type = "application/json";
        return text ? 0 : hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    }
    unsigned char *frame = NULL;
    int err = hkn_frame_write(r->manifest, r->manifest_len, r->sig, strlen(r->sig), r->blobs, r->n,
                              &frame, len);
    *body = frame;
    for (size_t i = 0; !err && i < r->nfiles; i++) { /* the frame holds them now: once, not twice */
        free(r->bytes[i]);
        r->bytes[i] = NULL;
        r->blobs[i].bytes = NULL;
    }
    *type = HKN_FRAME_TYPE;
    return err ? hkc_fail(o, err, NULL, "cannot frame the release: %s", hk_err_name(err)) : 0;
}

static const char push_help[] =
    "usage: hotkern push URL --key SECRET [--key SECRET...] --module M [--release N]\n"
    "       [--token T] [--expires-in SECONDS] [--arch sm_XX] [--json-body] [--json] FILE...\n\n"
    "Signs FILE... as release N of module M and POSTs it to URL/v1/release\n"
    "(headers, .h .cuh .hpp, travel with it for the CUDA C FILE to include)\n"
    "(URL is the endpoint's base, e.g. http://127.0.0.1:7070). The release\n"
    "defaults to the current unix time in milliseconds, so successive pushes\n"
    "grow; it expires after --expires-in seconds (default 3600).\n"
    "The release travels as " HKN_FRAME_TYPE ": the signed manifest\n"
    "and the files' raw bytes, framed by their lengths, which the endpoint\n"
    "holds once. --json-body sends the JSON body instead (base64 artifacts, a\n"
    "third larger), which endpoints older than the frame read (they answer 415\n"
    "to the frame).\n"
    "Prints the endpoint's outcome, with the compiler/JIT log on a refusal.\n" HKC_HTTP_HELP
        HKC_JSON_HELP "Exit status: 0 committed, 1 refused or failed, 2 usage.\n";

int hkc_cmd_push(int argc, char **argv) {
    const char *arch = NULL;
    hkc_list key = {0};
    struct release r = {0};
    uint64_t expires_in = 3600;
    hkc_http_opts ho = {.token = getenv("HOTKERN_TOKEN"), .timeout_s = 120};
    int json = 0, json_body = 0, nargs = 0;
    const hkc_opt opts[] = {
        HKC_LIST_OPT("--key", &key),
        HKC_STRING_OPT("--module", &r.module),
        RELEASE_OPTS(&r.version, &expires_in),
        HKC_STRING_OPT("--arch", &arch),
        HKC_FLAG_OPT("--json-body", &json_body),
        HKC_HTTP_OPTS(&ho),
        HKC_JSON_OPT(&json),
    };
    hkc_out o;
    int rc = hkc_parse(&o, "push", opts, HKC_NOPTS(opts), push_help, argc, argv, &nargs);
    if (rc == HKC_CONTINUE && nargs < 1)
        rc = hkc_usage(&o, "URL is required");
    if (rc == HKC_CONTINUE && (!key.n || !r.module))
        rc = hkc_usage(&o, "--key and --module are required");
    if (rc != HKC_CONTINUE) {
        hkc_list_free(&key);
        return hkc_finish(&o, rc);
    }
    if (!r.version)
        r.version = wall_ms();
    hkc_declare(&o, "url", "outcome", "http_status", "module", "release", "engine_version",
                "build_ms", "stage_ms", "commit_ms", NULL);
    hkc_set_str(&o, "url", argv[1]);
    hkc_set_str(&o, "module", r.module);
    hkc_set_int(&o, "release", (long long)r.version);
    rc = build_release(&o, &key, expires_in, arch, NULL, argv + 2, nargs - 1, &r);
    hkc_list_free(&key);
    if (rc != 0)
        return hkc_finish(&o, rc);
    void *body = NULL;
    size_t len = 0;
    const char *type = NULL;
    hkc_resp resp = {0};
    if ((rc = release_body(&o, &r, json_body, &body, &len, &type)) == 0 &&
        (rc = hkc_http_body(&o, "POST", argv[1], "/v1/release", body, len, type, &ho, &resp)) == 0)
        rc = hkc_report_outcome(&o, &resp, &(hkc_asked){.module = r.module, .release = r.version});
    free(body);
    free(resp.data);
    release_free(&r);
    return hkc_finish(&o, rc);
}

/* ---- pull -------------------------------------------------------------- */

/* Without a GPU the tool "applies" a release by reporting it: the verified
 * artifacts are already in --out (the puller's save_dir). ud is the hkc_out;
 * in JSON mode the release joins its "applied" array. */
static int report_apply(void *ud, const char *module, uint64_t version, hk_format fmt,
                        const void *bytes, size_t size, const hk_header *headers, int nheaders,
                        const char *origin, hk_report *rep) {
    hkc_out *o = ud;
    char hex[65];
    hkn_sha256_hex(bytes, size, hex);
    if (o->json) {
        cJSON *a = cJSON_CreateObject(), *h = cJSON_AddArrayToObject(a, "headers");
        cJSON_AddStringToObject(a, "module", module);
        hkn_json_add_int(a, "release", (long long)version);
        cJSON_AddStringToObject(a, "format", hk_format_name(fmt));
        hkn_json_add_int(a, "size", (long long)size);
        cJSON_AddStringToObject(a, "sha256", hex);
        for (int i = 0; i < nheaders; i++)
            cJSON_AddItemToArray(h, cJSON_CreateString(headers[i].name));
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o->doc, "applied"), a);
        return 0;
    }
    printf("applied %s v%llu: %s %zu bytes sha256 %s", module, (unsigned long long)version,
           hk_format_name(fmt), size, hex);
    for (int i = 0; i < nheaders; i++)
        printf("%s%s", i ? ", " : " with headers ", headers[i].name);
    printf("\n");
    fflush(stdout);
    return 0;
}

static const char pull_help[] =
    "usage: hotkern pull URL --pubkey FILE [--state DIR] [--out DIR]\n"
    "       (--once | --count N) [--interval-ms MS] [--timeout-ms MS]\n"
    "       [--host-id ID] [--host-labels A,B] [--json]\n\n"
    "Polls the release at URL (a manifest.json written by 'hotkern sign'),\n"
    "verifies it against the public key (signature, expiry, release newer\n"
    "than the one recorded in --state, artifact hashes) and writes its\n"
    "artifacts into --out. --state defaults to the record the endpoint\n"
    "and pullers share ($XDG_STATE_HOME/hotkern/releases, else\n"
    "~/.local/state/hotkern/releases). --once polls once; --count N polls N times,\n"
    "--interval-ms apart (+-10% jitter, default 1000). Requests are\n"
    "conditional (ETag, Last-Modified), so an unchanged origin answers 304.\n"
    "Each transfer gives up after --timeout-ms (default 10000).\n"
    "A release with a rollout (hotkern rollout) is written only while this host\n"
    "is in its step: --host-id (default $HOTKERN_HOST_ID, else /etc/machine-id,\n"
    "else the host name) and --host-labels (default $HOTKERN_HOST_LABELS).\n"
    "Prints each release applied and, at the end, the counters.\n" HKC_JSON_HELP
    "Exit status: 0 when the last poll succeeded, 1 otherwise, 2 usage.\n";

struct pull_args {
    const char *pubkey, *out;
    uint64_t count, interval, timeout;
    int quiet;
};

static void pause_ms(uint64_t interval) {
    uint64_t d = interval - interval / 10 + randombytes_uniform((uint32_t)(interval / 5 + 1));
    struct timespec ts = {(time_t)(d / 1000), (long)(d % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* One poll error: printed, or added to the document's poll_errors. */
static void poll_error(hkc_out *o, const struct pull_args *pa, uint64_t poll,
                       const hk_report *rep) {
    if (o->json) {
        cJSON *e = cJSON_CreateObject();
        hkn_json_add_int(e, "poll", (long long)poll);
        cJSON_AddStringToObject(e, "error", hk_err_name(rep->error));
        hkn_json_add_int(e, "code", rep->error);
        cJSON_AddStringToObject(e, "message", rep->message);
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o->doc, "poll_errors"), e);
    } else if (!pa->quiet) {
        /* The message may quote the origin's bytes (a key id, a name). */
        fprintf(stderr, "hotkern pull: %s: ", hk_err_name(rep->error));
        hkc_put_clean(stderr, rep->message, 0);
        fputc('\n', stderr);
    }
}

static void report_stats(hkc_out *o, hkn_puller *p) {
    hkn_pull_stats s;
    hkn_pull_stats_get(p, &s);
    if (!o->json) {
        printf("requests %llu not_modified %llu errors %llu refused %llu applied %llu\n",
               (unsigned long long)s.requests, (unsigned long long)s.not_modified,
               (unsigned long long)s.errors, (unsigned long long)s.refused,
               (unsigned long long)s.applied);
        return;
    }
    cJSON *st = cJSON_CreateObject();
    hkn_json_add_int(st, "requests", (long long)s.requests);
    hkn_json_add_int(st, "not_modified", (long long)s.not_modified);
    hkn_json_add_int(st, "errors", (long long)s.errors);
    hkn_json_add_int(st, "refused", (long long)s.refused);
    hkn_json_add_int(st, "applied", (long long)s.applied);
    hkc_set(o, "stats", st);
}

/* Polls opt->url pa->count times; the exit status follows the last poll.
 * r holds the state directory; the trust is completed here. */
static int run_pull(hkc_out *o, const hk_pull_options *opt, hkn_pull_resolved *r,
                    const struct pull_args *pa) {
    hk_report rep = HK_REPORT_INIT;
    hkn_puller *p = NULL;
    int err = 0, rc;
    hkn_engine eng = {.apply = report_apply, .ud = o};
    if (pa->pubkey) {
        if (hkn_pubkey_load(pa->pubkey, &r->trust.keys[0], &rep))
            goto out;
        r->trust.nkeys = 1;
    }
    if (pa->out && mkdir(pa->out, 0755) != 0 && errno != EEXIST) {
        hku_fail(&rep, HK_ERR_IO, "mkdir %s: %s", pa->out, strerror(errno));
        goto out;
    }
    r->trust.allow_unsigned = opt->allow_unsigned;
    if (hkn_pull_create(opt, r, &eng, &p, &rep))
        goto out;
    for (uint64_t i = 0; i < pa->count; i++) {
        hk_report_clear(&rep);
        if ((err = hkn_pull_poll(p, &rep)) != 0)
            poll_error(o, pa, i + 1, &rep);
        if (i + 1 < pa->count)
            pause_ms(pa->interval);
    }
    report_stats(o, p);
    if (!err)
        hk_report_clear(&rep);
    else if (!o->json && !pa->quiet) {
        /* The last poll's error was printed as it came: once is enough. */
        rc = 1;
        goto done;
    }
out:
    rc = rep.error ? hkc_fail_report(o, &rep) : 0;
done:
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
    return rc;
}

int hkc_cmd_pull(int argc, char **argv) {
    /* The puller runs without a runtime: the options are the library's, and
     * what hk_pull_start would resolve from them is resolved here, with the
     * artifacts' copy in --out besides. */
    hk_pull_options opt;
    hkn_pull_resolved r;
    hk_pull_options_init(&opt);
    memset(&r, 0, sizeof r);
    struct pull_args pa = {.interval = 1000, .timeout = 10000};
    int once = 0, json = 0, nargs = 0;
    const hkc_opt opts[] = {
        HKC_STRING_OPT("--pubkey", &pa.pubkey),
        HKC_STRING_OPT("--state", &opt.state_dir),
        HKC_STRING_OPT("--out", &pa.out),
        HKC_FLAG_OPT("--once", &once),
        HKC_UINT_OPT("--count", &pa.count, 1, 1000000, "--count needs 1 to 1000000"),
        HKC_UINT_OPT("--interval-ms", &pa.interval, 1, 86400000,
                     "--interval-ms needs 1 to 86400000"),
        HKC_UINT_OPT("--timeout-ms", &pa.timeout, 1, 3600000, "--timeout-ms needs 1 to 3600000"),
        HKC_STRING_OPT("--cacert", &opt.ca_file),
        HKC_FLAG_OPT("--allow-unsigned", &opt.allow_unsigned),
        HKC_STRING_OPT("--host-id", &opt.host_id),
        HKC_STRING_OPT("--host-labels", &opt.host_labels),
        HKC_FLAG_OPT("--quiet", &pa.quiet),
        HKC_JSON_OPT(&json),
    };
    hkc_out o;
    int rc = hkc_parse(&o, "pull", opts, HKC_NOPTS(opts), pull_help, argc, argv, &nargs);
    if (rc != HKC_CONTINUE)
        return hkc_finish(&o, rc);
    if (once)
        pa.count = 1;
    if (nargs != 1)
        return hkc_finish(&o, hkc_usage(&o, "URL is required"));
    if (!pa.count)
        return hkc_finish(&o, hkc_usage(&o, "--once or --count N is required"));
    if (!pa.pubkey && !opt.allow_unsigned)
        return hkc_finish(&o, hkc_usage(&o, "--pubkey FILE is required"));
    char defdir[PATH_MAX];
    r.state_dir = opt.state_dir;
    if (!r.state_dir) {
        hk_report drep = HK_REPORT_INIT;
        if (hkn_default_state_dir(defdir, sizeof defdir, &drep))
            return hkc_finish(&o, hkc_usage(&o, "%s", drep.message));
        r.state_dir = defdir;
    }
    hkc_declare(&o, "url", "stats", NULL);
    hkc_set_str(&o, "url", argv[1]);
    hkc_set(&o, "applied", cJSON_CreateArray());
    hkc_set(&o, "poll_errors", cJSON_CreateArray());
    opt.url = argv[1];
    opt.interval_ms = (unsigned)pa.interval;
    opt.total_timeout_ms = (unsigned)pa.timeout;
    opt.connect_timeout_ms = (unsigned)(pa.timeout < 5000 ? pa.timeout : 5000);
    r.save_dir = pa.out;
    return hkc_finish(&o, run_pull(&o, &opt, &r, &pa));
}

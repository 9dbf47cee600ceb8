/*
 * Signed releases: keys, manifests, verification and the anti-replay state.
 *
 * A release is a manifest (JSON, written and read with cJSON only) plus its
 * artifacts. The Ed25519 signature covers the manifest's exact bytes and is
 * shipped next to it (manifest.json.sig, base64), so what is verified is
 * exactly what is parsed afterwards: no canonicalisation is needed, and nothing
 * derived from an unauthenticated manifest is acted on. Headers that a CUDA C
 * artifact includes travel as artifacts of format "header", hashed and signed
 * like the rest, and reach the build as in-memory headers under their names;
 * a release of headers alone is refused, since there is nothing to apply. The manifest names
 * each artifact by SHA-256 and size, so artifacts can come from anywhere
 * (a request body, a CDN keyed by hash) and still be checked.
 *
 * Verification runs in a fixed order, cheapest trust decision first:
 * signature and key -> parse -> expiry -> version newer than the highest one
 * ever accepted for the module -> each artifact's size and hash. The highest
 * accepted version per module is persisted (accepted.json, replaced
 * atomically) so that a restart cannot be used to replay an older release.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "net/net.h"

/* JSON numbers are doubles: integers above 2^53 would silently round. */
#define HKN_MAX_JSON_INT 9007199254740991.0

/* ---- reports and errors ------------------------------------------------ */

void hkn_log(const hkn_engine *e, hk_log_level level, const char *subsystem, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    if (!e || !e->log || (e->log_on && !e->log_on(e->ud, level)))
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    e->log(e->ud, level, subsystem, line);
}

/* ---- keys -------------------------------------------------------------- */

int hkn_keygen(hkn_seckey *out) {
    if (hkn_crypto_init())
        return HK_ERR_UNSUPPORTED;
    crypto_sign_keypair(out->pub.pk, out->sk);
    hkn_key_id(out->pub.pk, out->pub.id);
    return 0;
}

int hkn_pubkey_load(const char *path, hkn_pubkey *out, hk_report *rep) {
    char *text = NULL;
    size_t len = 0;
    int err = hku_read_file(path, 1024, &text, &len, rep);
    if (err)
        return err;
    if (hkn_decode_fixed(text, len, out->pk, HKN_PK_BYTES) != 0)
        err = hku_fail(rep, HK_ERR_INVALID, "%s: expected a public key (64 hex or 44 base64 chars)",
                       path);
    else
        hkn_key_id(out->pk, out->id);
    sodium_memzero(text, len);
    free(text);
    return err;
}

int hkn_seckey_load(const char *path, hkn_seckey *out, hk_report *rep) {
    char *text = NULL;
    size_t len = 0;
    if (hkn_crypto_init())
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "libsodium failed to initialise");
    struct stat st;
    int fd = hku_open_regular(path, &st, rep);
    if (fd < 0)
        return fd;
    if (st.st_mode & 077) {
        /* As ssh does with private keys: a secret others can read is no
         * longer one, and using it silently hides that. */
        close(fd);
        return hku_fail(rep, HK_ERR_IO,
                        "%s: secret key is readable by group or others (mode %04o); run "
                        "'chmod 600 %s'",
                        path, (unsigned)(st.st_mode & 07777), path);
    }
    int err = hku_read_fd(fd, path, 1024, &text, &len, rep);
    close(fd);
    if (err)
        return err;
    if (hkn_decode_fixed(text, len, out->sk, HKN_SK_BYTES) != 0) {
        err = hku_fail(rep, HK_ERR_INVALID,
                       "%s: expected a secret key (128 hex or 88 base64 chars)", path);
    } else {
        crypto_sign_ed25519_sk_to_pk(out->pub.pk, out->sk);
        hkn_key_id(out->pub.pk, out->pub.id);
    }
    sodium_memzero(text, len);
    free(text);
    return err;
}

int hkn_pubkey_save(const char *path, const hkn_pubkey *k, hk_report *rep) {
    char hex[2 * HKN_PK_BYTES + 2];
    sodium_bin2hex(hex, sizeof hex - 1, k->pk, HKN_PK_BYTES);
    strcat(hex, "\n");
    return hku_write_atomic(path, hex, strlen(hex), 0644, rep);
}

int hkn_seckey_save(const char *path, const hkn_seckey *k, hk_report *rep) {
    char hex[2 * HKN_SK_BYTES + 2];
    sodium_bin2hex(hex, sizeof hex - 1, k->sk, HKN_SK_BYTES);
    strcat(hex, "\n");
    int err = hku_write_atomic(path, hex, strlen(hex), 0600, rep);
    sodium_memzero(hex, sizeof hex);
    return err;
}

/* ---- manifests --------------------------------------------------------- */

hk_format hkn_format_parse(const char *s) {
    static const hk_format all[] = {HK_FORMAT_CUDA_C, HK_FORMAT_PTX, HK_FORMAT_CUBIN,
                                    HK_FORMAT_FATBIN};
    for (size_t i = 0; s && i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(s, hk_format_name(all[i])))
            return all[i];
    return HK_FORMAT_AUTO;
}

hk_format hkn_format_from_name(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot)
        return HK_FORMAT_AUTO;
    if (!strcmp(dot, ".cu"))
        return HK_FORMAT_CUDA_C;
    return hkn_format_parse(dot + 1);
}

int hkn_is_header_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (!strcmp(dot, ".h") || !strcmp(dot, ".cuh") || !strcmp(dot, ".hpp"));
}

int hkn_release_headers(const hkn_manifest *m, const void *const *bytes, const size_t *sizes,
                        hk_header *out) {
    int n = 0;
    for (size_t i = 0; i < m->nartifacts && n < HKN_MAX_ARTIFACTS; i++) {
        if (!m->artifacts[i].header)
            continue;
        out[n].name = m->artifacts[i].name;
        out[n].data = bytes[i] ? bytes[i] : "";
        out[n].size = sizes[i];
        n++;
    }
    return n;
}

void hkn_sha256_hex(const void *bytes, size_t size, char out[65]) {
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, bytes, size);
    sodium_bin2hex(out, 65, h, sizeof h);
}

/* Signs len bytes of text with key; *sig_b64 is the detached signature in
 * base64 (the caller frees it). */
static int sign_b64(const hkn_seckey *key, const char *text, size_t len, char **sig_b64,
                    hk_report *rep) {
    unsigned char sig[HKN_SIG_BYTES];
    crypto_sign_detached(sig, NULL, (const unsigned char *)text, len, key->sk);
    size_t b64len = sodium_base64_ENCODED_LEN(sizeof sig, sodium_base64_VARIANT_ORIGINAL);
    char *b64 = malloc(b64len);
    if (!b64)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    sodium_bin2base64(b64, b64len, sig, sizeof sig, sodium_base64_VARIANT_ORIGINAL);
    *sig_b64 = b64;
    return 0;
}

static int get_uint(const cJSON *obj, const char *key, uint64_t *out, hk_report *rep) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v))
        return hku_fail(rep, HK_ERR_INVALID, "manifest: '%s' must be a number", key);
    double d = v->valuedouble;
    if (!(d >= 0) || d > HKN_MAX_JSON_INT || floor(d) != d)
        return hku_fail(rep, HK_ERR_INVALID,
                        "manifest: '%s' must be an integer in [0, 2^53), got %.17g", key, d);
    *out = (uint64_t)d;
    return 0;
}

static int get_str(const cJSON *obj, const char *key, char *out, size_t cap, int required,
                   hk_report *rep) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v && !required) {
        out[0] = '\0';
        return 0;
    }
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap)
        return hku_fail(rep, HK_ERR_INVALID, "manifest: '%s' must be a string of under %zu chars",
                        key, cap);
    memcpy(out, v->valuestring, strlen(v->valuestring) + 1);
    return 0;
}

void hkn_manifest_free(hkn_manifest *m) {
    if (!m)
        return;
    free(m->artifacts);
    free(m->previous_artifacts);
    hkn_rollout_free(&m->rollout);
    memset(m, 0, sizeof *m);
}

void hkn_manifest_take_stable(hkn_manifest *m) {
    if (!m->nprevious)
        return;
    free(m->artifacts);
    m->artifacts = m->previous_artifacts;
    m->nartifacts = m->nprevious;
    m->previous_artifacts = NULL;
    m->nprevious = 0;
    m->release = m->rollout.previous;
}

/* Artifact i of a manifest into d: every field checked for type and range. */
static int parse_artifact(const cJSON *a, size_t i, hkn_artifact *d, hk_report *rep) {
    char fmt[16];
    int err;
    if (!cJSON_IsObject(a))
        return hku_fail(rep, HK_ERR_INVALID, "manifest: artifact %zu is not an object", i);
    if ((err = get_str(a, "name", d->name, sizeof d->name, 1, rep)) ||
        (err = get_str(a, "sha256", d->sha256, sizeof d->sha256, 1, rep)) ||
        (err = get_uint(a, "size", &d->size, rep)) ||
        (err = get_str(a, "format", fmt, sizeof fmt, 1, rep)) ||
        (err = get_str(a, "arch", d->arch, sizeof d->arch, 0, rep)) ||
        (err = get_str(a, "source", d->source, sizeof d->source, 0, rep)) ||
        (err = get_str(a, "toolkit", d->toolkit, sizeof d->toolkit, 0, rep)))
        return err;
    if (!hkn_valid_name(d->name, sizeof d->name))
        return hku_fail(rep, HK_ERR_INVALID,
                        "manifest: artifact name '%s' is not a plain "
                        "file name",
                        d->name);
    unsigned char bin[32];
    if (strlen(d->sha256) != 64 ||
        sodium_hex2bin(bin, sizeof bin, d->sha256, 64, NULL, NULL, NULL) != 0)
        return hku_fail(rep, HK_ERR_INVALID,
                        "manifest: artifact '%s': sha256 is not 64 hex "
                        "chars",
                        d->name);
    /* Normalise to the lowercase form hkn_sha256_hex produces. */
    sodium_bin2hex(d->sha256, sizeof d->sha256, bin, sizeof bin);
    d->format = hkn_format_parse(fmt);
    d->header = !strcmp(fmt, "header");
    if (d->format == HK_FORMAT_AUTO && !d->header)
        return hku_fail(rep, HK_ERR_INVALID,
                        "manifest: artifact '%s': format '%s' is not cuda, ptx, cubin, "
                        "fatbin or header",
                        d->name, fmt);
    return 0;
}

/* The array `key` of root (1 to HKN_MAX_ARTIFACTS artifacts) into *out,
 * *n (owned by the caller, also on failure). */
static int parse_artifacts(const cJSON *root, const char *key, hkn_artifact **out, size_t *n,
                           hk_report *rep) {
    const cJSON *arts = cJSON_GetObjectItemCaseSensitive(root, key);
    int count = cJSON_GetArraySize(arts);
    if (!cJSON_IsArray(arts) || count < 1 || count > HKN_MAX_ARTIFACTS)
        return hku_fail(rep, HK_ERR_INVALID, "manifest: '%s' must be an array of 1 to %d", key,
                        HKN_MAX_ARTIFACTS);
    if (!(*out = calloc((size_t)count, sizeof **out)))
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    const cJSON *a;
    cJSON_ArrayForEach(a, arts) {
        int err = parse_artifact(a, *n, &(*out)[*n], rep);
        if (err)
            return err;
        (*n)++;
    }
    return 0;
}

/* Headers are found by name, so each name once; and a release of headers
 * alone has nothing to apply. */
static int check_headers(const hkn_manifest *m, hk_report *rep) {
    size_t nheaders = 0;
    for (size_t i = 0; i < m->nartifacts; i++) {
        nheaders += m->artifacts[i].header;
        for (size_t j = 0; j < i; j++)
            if (m->artifacts[i].header && m->artifacts[j].header &&
                !strcmp(m->artifacts[i].name, m->artifacts[j].name))
                return hku_fail(rep, HK_ERR_INVALID, "manifest: header '%s' appears twice",
                                m->artifacts[i].name);
    }
    if (nheaders == m->nartifacts)
        return hku_fail(rep, HK_ERR_INVALID, "manifest: only headers, no kernel artifact");
    return 0;
}

/* The stable release m carries: only beside a rollout that has a previous
 * release and is not aborted (whose artifacts are previous's already), and
 * read as a release's artifacts are. */
static int check_stable(const hkn_manifest *m, hk_report *rep) {
    const hkn_rollout *r = &m->rollout;
    if (!m->nprevious)
        return 0;
    if (!r->present || r->previous == 0 || r->aborted)
        return hku_fail(rep, HK_ERR_INVALID,
                        "only a rollout with a 'previous' release, not aborted, carries it (this "
                        "manifest %s)",
                        !r->present  ? "has no rollout"
                        : r->aborted ? "is aborted: its artifacts are previous's"
                                     : "has no previous release");
    hkn_manifest view = {.artifacts = m->previous_artifacts, .nartifacts = m->nprevious};
    int err = check_headers(&view, rep);
    return err ? err : hkn_shipped_validate(&view, rep);
}

/* Names the stable release in a refusal of its artifacts (parse_artifact
 * and the checks speak of "the manifest"). */
static int of_stable(int err, hk_report *rep) {
    char was[sizeof rep->message];
    if (err && rep && err != HK_ERR_NOMEM) {
        memcpy(was, rep->message, sizeof was);
        const char *w = strncmp(was, "manifest: ", 10) ? was : was + 10;
        hku_fail(rep, err, "manifest: 'previous_artifacts' (the stable release): %s", w);
    }
    return err;
}

int hkn_manifest_parse(const char *json, size_t len, hkn_manifest *out, hk_report *rep) {
    memset(out, 0, sizeof *out);
    int err = 0;
    uint64_t u;
    cJSON *root = hkn_json_parse_strict(json, len);
    if (!cJSON_IsObject(root)) {
        err = hku_fail(rep, HK_ERR_INVALID,
                       "manifest is not one JSON object (nothing may follow it, and no string "
                       "may hold a NUL)");
        goto out;
    }
    if ((err = get_str(root, "module", out->module, sizeof out->module, 1, rep)))
        goto out;
    if (!hkn_valid_name(out->module, sizeof out->module)) {
        err = hku_fail(rep, HK_ERR_INVALID, "manifest: module name '%s' is not [A-Za-z0-9_.-]+",
                       out->module);
        goto out;
    }
    if ((err = get_uint(root, "version", &out->version, rep)))
        goto out;
    if (out->version == 0) {
        err = hku_fail(rep, HK_ERR_INVALID, "manifest: version must be at least 1");
        goto out;
    }
    if ((err = get_uint(root, "created", &u, rep)))
        goto out;
    out->created = (int64_t)u;
    if ((err = get_uint(root, "expires", &u, rep)))
        goto out;
    out->expires = (int64_t)u;
    if ((err = get_str(root, "key_id", out->key_id, sizeof out->key_id, 0, rep)))
        goto out;
    if ((err = parse_artifacts(root, "artifacts", &out->artifacts, &out->nartifacts, rep)) ||
        (err = check_headers(out, rep)) || (err = hkn_shipped_validate(out, rep)))
        goto out;
    /* The steps of a release (net/rollout.c): what hosts take it now. */
    const cJSON *ro = cJSON_GetObjectItemCaseSensitive(root, "rollout");
    if (ro && (err = hkn_rollout_parse(ro, &out->rollout, rep)))
        goto out;
    out->release = hkn_rollout_target(&out->rollout, out->version);
    /* The stable release, for the hosts outside the step (1.5; a 1.4 host
     * reads past a top-level member it does not know). */
    if (cJSON_GetObjectItemCaseSensitive(root, "previous_artifacts")) {
        err = parse_artifacts(root, "previous_artifacts", &out->previous_artifacts, &out->nprevious,
                              rep);
        if ((err = of_stable(err ? err : check_stable(out, rep), rep)))
            goto out;
    }
out:
    cJSON_Delete(root);
    if (err)
        hkn_manifest_free(out);
    return err;
}

/* n artifacts as root's array `key`; 0 or HK_ERR_NOMEM. */
static int add_artifacts(cJSON *root, const char *key, const hkn_artifact *v, size_t n) {
    cJSON *arts = cJSON_AddArrayToObject(root, key);
    if (!arts)
        return HK_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const hkn_artifact *a = &v[i];
        cJSON *o = cJSON_CreateObject();
        if (!o)
            return HK_ERR_NOMEM;
        cJSON_AddItemToArray(arts, o);
        if (!cJSON_AddStringToObject(o, "name", a->name) ||
            !cJSON_AddStringToObject(o, "sha256", a->sha256) ||
            !hkn_json_add_int(o, "size", (long long)a->size) ||
            !cJSON_AddStringToObject(o, "format",
                                     a->header ? "header" : hk_format_name(a->format)) ||
            !cJSON_AddStringToObject(o, "arch", a->arch))
            return HK_ERR_NOMEM;
        /* A binary the publisher built (net/shipped.c); absent otherwise. */
        if ((a->source[0] && !cJSON_AddStringToObject(o, "source", a->source)) ||
            (a->toolkit[0] && !cJSON_AddStringToObject(o, "toolkit", a->toolkit)))
            return HK_ERR_NOMEM;
    }
    return 0;
}

int hkn_manifest_write(const hkn_manifest *m, char **json, size_t *len) {
    int err = HK_ERR_NOMEM;
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return err;
    if (!cJSON_AddStringToObject(root, "module", m->module) ||
        !hkn_json_add_int(root, "version", (long long)m->version) ||
        !hkn_json_add_int(root, "created", (long long)m->created) ||
        !hkn_json_add_int(root, "expires", (long long)m->expires) ||
        !cJSON_AddStringToObject(root, "key_id", m->key_id) ||
        add_artifacts(root, "artifacts", m->artifacts, m->nartifacts))
        goto out;
    if (hkn_rollout_add(root, &m->rollout))
        goto out;
    if (m->nprevious &&
        add_artifacts(root, "previous_artifacts", m->previous_artifacts, m->nprevious))
        goto out;
    *json = cJSON_Print(root);
    if (!*json)
        goto out;
    *len = strlen(*json);
    err = 0;
out:
    cJSON_Delete(root);
    return err;
}

/* What hkn_manifest_parse would refuse of a manifest built in memory. */
static int check_built(const hkn_manifest *m, hk_report *rep) {
    if (!hkn_valid_name(m->module, sizeof m->module))
        return hku_fail(rep, HK_ERR_INVALID, "module name '%.64s' is not [A-Za-z0-9_.-]{1,63}",
                        m->module);
    if (m->version == 0 || (double)m->version > HKN_MAX_JSON_INT)
        return hku_fail(rep, HK_ERR_INVALID, "version must be in [1, 2^53)");
    if (m->nartifacts == 0 || m->nartifacts > HKN_MAX_ARTIFACTS)
        return hku_fail(rep, HK_ERR_INVALID, "a release holds 1 to %d artifacts",
                        HKN_MAX_ARTIFACTS);
    size_t nheaders = 0;
    for (size_t i = 0; i < m->nartifacts; i++)
        nheaders += m->artifacts[i].header != 0;
    if (nheaders == m->nartifacts)
        return hku_fail(rep, HK_ERR_INVALID, "a release needs a kernel, not only headers");
    /* An already expired release can be signed (tests of the refusal need
     * one); the CLI refuses to make one. */
    if (m->created < 0 || (double)m->created > HKN_MAX_JSON_INT || m->expires < 0 ||
        (double)m->expires > HKN_MAX_JSON_INT || m->expires - m->created > HKN_MAX_LIFETIME_S)
        return hku_fail(rep, HK_ERR_INVALID,
                        "created and expires must be unix times in [0, 2^53), expiring within %d "
                        "days of creation",
                        HKN_MAX_LIFETIME_S / 86400);
    int err = hkn_shipped_validate(m, rep);
    if (!err)
        err = hkn_rollout_validate(&m->rollout, rep);
    if (!err && m->nprevious > HKN_MAX_ARTIFACTS)
        err = hku_fail(rep, HK_ERR_INVALID, "the stable release holds 1 to %d artifacts",
                       HKN_MAX_ARTIFACTS);
    return err ? err : of_stable(check_stable(m, rep), rep);
}

int hkn_manifest_sign(const hkn_seckey *key, hkn_manifest *m, char **json, size_t *len,
                      char **sig_b64, hk_report *rep) {
    *json = *sig_b64 = NULL;
    *len = 0;
    if (hkn_crypto_init())
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "libsodium failed to initialise");
    snprintf(m->key_id, sizeof m->key_id, "%s", key->pub.id);
    int err = check_built(m, rep);
    if (err)
        return err;
    char *text = NULL;
    size_t n = 0;
    if (hkn_manifest_write(m, &text, &n))
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory writing the manifest");
    if ((err = sign_b64(key, text, n, sig_b64, rep)) < 0) {
        free(text);
        return err;
    }
    *json = text;
    *len = n;
    return 0;
}

int hkn_artifacts_from_blobs(const hkn_blob *blobs, size_t nblobs, hkn_artifact *arts,
                             hk_report *rep) {
    if (nblobs == 0 || nblobs > HKN_MAX_ARTIFACTS)
        return hku_fail(rep, HK_ERR_INVALID, "a release holds 1 to %d artifacts",
                        HKN_MAX_ARTIFACTS);
    memset(arts, 0, nblobs * sizeof *arts);
    for (size_t i = 0; i < nblobs; i++) {
        const char *base = strrchr(blobs[i].name, '/');
        base = base ? base + 1 : blobs[i].name;
        if (!hkn_valid_name(base, sizeof arts[i].name))
            return hku_fail(rep, HK_ERR_INVALID, "artifact name '%s' is not [A-Za-z0-9_.-]+", base);
        snprintf(arts[i].name, sizeof arts[i].name, "%s", base);
        hkn_sha256_hex(blobs[i].bytes, blobs[i].size, arts[i].sha256);
        arts[i].size = blobs[i].size;
        arts[i].header =
            blobs[i].header || (blobs[i].format == HK_FORMAT_AUTO && hkn_is_header_name(base));
        arts[i].format = arts[i].header                      ? HK_FORMAT_AUTO
                         : blobs[i].format != HK_FORMAT_AUTO ? blobs[i].format
                                                             : hkn_format_from_name(base);
        if (arts[i].format == HK_FORMAT_AUTO && !arts[i].header)
            return hku_fail(rep, HK_ERR_FORMAT,
                            "%s: cannot tell the format from the name (.cu .ptx .cubin .fatbin, "
                            "or .h .cuh .hpp for a header)",
                            base);
        snprintf(arts[i].arch, sizeof arts[i].arch, "%s", blobs[i].arch ? blobs[i].arch : "");
        snprintf(arts[i].source, sizeof arts[i].source, "%s",
                 blobs[i].source ? blobs[i].source : "");
        snprintf(arts[i].toolkit, sizeof arts[i].toolkit, "%s",
                 blobs[i].toolkit ? blobs[i].toolkit : "");
    }
    return 0;
}

int hkn_release_sign(const hkn_seckey *key, const char *module, uint64_t version, int64_t created,
                     int64_t expires, const hkn_blob *blobs, size_t nblobs, char **manifest,
                     size_t *manifest_len, char **sig_b64, hk_report *rep) {
    *manifest = *sig_b64 = NULL;
    *manifest_len = 0;
    if (strlen(module) >= 64 || !hkn_valid_name(module, 64))
        return hku_fail(rep, HK_ERR_INVALID, "module name '%s' is not [A-Za-z0-9_.-]{1,63}",
                        module);
    hkn_artifact arts[HKN_MAX_ARTIFACTS];
    int err = hkn_artifacts_from_blobs(blobs, nblobs, arts, rep);
    if (err)
        return err;
    hkn_manifest m = {.version = version,
                      .created = created,
                      .expires = expires,
                      .artifacts = arts,
                      .nartifacts = nblobs};
    snprintf(m.module, sizeof m.module, "%s", module);
    return hkn_manifest_sign(key, &m, manifest, manifest_len, sig_b64, rep);
}

/* ---- verification ------------------------------------------------------ */

int hkn_verify_manifest(const hkn_trust *t, hkn_state *s, const char *json, size_t len,
                        const char *sig, size_t sig_len, int64_t now, hkn_manifest *out,
                        hk_report *rep) {
    memset(out, 0, sizeof *out);
    const hkn_pubkey *signer = NULL;
    if (hkn_crypto_init())
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "libsodium failed to initialise");
    if (t->nkeys > 0 || !t->allow_unsigned) {
        /* Only to word a refusal: the manifest is not trusted yet, and
         * nothing but the key id it claims is read from it. */
        char kid[64] = "";
        cJSON *root = cJSON_ParseWithLength(json, len);
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(root, "key_id");
        if (cJSON_IsString(k))
            snprintf(kid, sizeof kid, "%s", k->valuestring);
        cJSON_Delete(root);
        /* k of the trusted keys (net/keys.c); one bare signature, as 1.4
         * wrote them, sets signer. */
        int err = hkn_signatures_verify(t, "release", json, len, sig, sig_len, kid, &signer, rep);
        if (err)
            return err;
    }
    if (t->expires && t->expires <= now)
        return hku_fail(rep, HK_ERR_EXPIRED,
                        "the trusted key list v%llu expired at %lld, %lld s ago: releases are "
                        "refused until a newer key list is accepted",
                        (unsigned long long)t->version, (long long)t->expires,
                        (long long)(now - t->expires));
    int err = hkn_manifest_parse(json, len, out, rep);
    if (err)
        return err;
    if (rep) {
        snprintf(rep->module, sizeof rep->module, "%s", out->module);
        rep->version = out->version;
    }
    if (signer && strcmp(out->key_id, signer->id)) {
        err = hku_fail(rep, HK_ERR_SIGNATURE, "manifest names key '%s' but was signed by %s",
                       out->key_id, signer->id);
        goto fail;
    }
    if (out->expires <= now) {
        err =
            hku_fail(rep, HK_ERR_EXPIRED, "release %s v%llu expired at %lld, %lld s ago (now %lld)",
                     out->module, (unsigned long long)out->version, (long long)out->expires,
                     (long long)(now - out->expires), (long long)now);
        goto fail;
    }
    if (out->created > now + HKN_CLOCK_SKEW_S) {
        err = hku_fail(rep, HK_ERR_EXPIRED,
                       "release %s v%llu is not valid yet: created at %lld, %lld s from now "
                       "(clock skew allowed: %d s)",
                       out->module, (unsigned long long)out->version, (long long)out->created,
                       (long long)(out->created - now), HKN_CLOCK_SKEW_S);
        goto fail;
    }
    if (out->expires - out->created > HKN_MAX_LIFETIME_S) {
        err = hku_fail(rep, HK_ERR_EXPIRED,
                       "release %s v%llu claims a lifetime of %lld s, over the limit of %d days",
                       out->module, (unsigned long long)out->version,
                       (long long)(out->expires - out->created), HKN_MAX_LIFETIME_S / 86400);
        goto fail;
    }
    uint64_t have = 0;
    if (s && (err = hkn_state_lookup(s, out->module, &have, rep)))
        goto fail;
    if (out->version <= have) {
        err = hku_fail(rep, HK_ERR_REPLAY,
                       "release %s v%llu is not newer than the accepted v%llu (%s)", out->module,
                       (unsigned long long)out->version, (unsigned long long)have,
                       out->version == have ? "same version" : "older version");
        goto fail;
    }
    return 0;
fail:
    hkn_manifest_free(out);
    return err;
}

int hkn_verify_artifact(const hkn_artifact *a, const void *bytes, size_t size, hk_report *rep) {
    if (size != a->size)
        return hku_fail(rep, HK_ERR_HASH, "artifact '%s': size %zu, manifest says %llu bytes",
                        a->name, size, (unsigned long long)a->size);
    char hex[65];
    hkn_sha256_hex(bytes, size, hex);
    if (sodium_memcmp(hex, a->sha256, 64) != 0)
        return hku_fail(rep, HK_ERR_HASH, "artifact '%s': sha256 %s, manifest says %s", a->name,
                        hex, a->sha256);
    return 0;
}

/* ---- signed rollback requests ------------------------------------------ */

int hkn_valid_endpoint_id(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= HKN_ENDPOINT_ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.' || c == ':' || c == '@'))
            return 0;
    }
    return 1;
}

int hkn_rollback_sign(const hkn_seckey *key, const char *module, uint64_t target, int64_t expires,
                      const char *endpoint, char **text, size_t *len, char **sig_b64,
                      hk_report *rep) {
    *text = *sig_b64 = NULL;
    *len = 0;
    if (hkn_crypto_init())
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "libsodium failed to initialise");
    if (!hkn_valid_name(module, 64))
        return hku_fail(rep, HK_ERR_INVALID, "module name '%s' is not [A-Za-z0-9_.-]{1,63}",
                        module);
    if (!hkn_valid_endpoint_id(endpoint))
        return hku_fail(rep, HK_ERR_INVALID,
                        "endpoint id '%.128s' is not [A-Za-z0-9_.:@-]{1,127} (the endpoint's "
                        "status names its id)",
                        endpoint ? endpoint : "");
    if ((double)target > HKN_MAX_JSON_INT || expires < 0 || (double)expires > HKN_MAX_JSON_INT)
        return hku_fail(rep, HK_ERR_INVALID, "target and expiry must be in [0, 2^53)");
    unsigned char raw[16];
    char nonce[33];
    randombytes_buf(raw, sizeof raw);
    sodium_bin2hex(nonce, sizeof nonce, raw, sizeof raw);
    cJSON *o = cJSON_CreateObject();
    char *json = NULL;
    if (!o || !cJSON_AddStringToObject(o, "type", "hotkern-rollback") ||
        !cJSON_AddStringToObject(o, "module", module) ||
        !cJSON_AddNumberToObject(o, "target", (double)target) ||
        !cJSON_AddNumberToObject(o, "expires", (double)expires) ||
        !cJSON_AddStringToObject(o, "nonce", nonce) ||
        !cJSON_AddStringToObject(o, "key_id", key->pub.id) ||
        !cJSON_AddStringToObject(o, "endpoint", endpoint) || !(json = cJSON_PrintUnformatted(o))) {
        cJSON_Delete(o);
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    }
    cJSON_Delete(o);
    if (sign_b64(key, json, strlen(json), sig_b64, rep) < 0) {
        free(json);
        return HK_ERR_NOMEM;
    }
    *text = json;
    *len = strlen(json);
    return 0;
}

int hkn_rollback_verify(const hkn_trust *t, const char *text, size_t len, const char *sig,
                        size_t sig_len, int64_t now, hkn_rollback_req *out, hk_report *rep) {
    memset(out, 0, sizeof *out);
    unsigned char bin[HKN_SIG_BYTES];
    const hkn_pubkey *signer = NULL;
    if (hkn_crypto_init())
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "libsodium failed to initialise");
    if (t->nkeys == 0)
        return hku_fail(rep, HK_ERR_SIGNATURE, "no trusted key is configured for rollbacks");
    if (!text || !sig || sig_len == 0)
        return hku_fail(rep, HK_ERR_SIGNATURE,
                        "rollback needs a signed request (hotkern rollback --key) or the token");
    if (hkn_decode_fixed(sig, sig_len, bin, sizeof bin) != 0)
        return hku_fail(rep, HK_ERR_SIGNATURE, "rollback signature is not 64 bytes");
    for (int i = 0; i < t->nkeys && !signer; i++)
        if (crypto_sign_verify_detached(bin, (const unsigned char *)text, len, t->keys[i].pk) == 0)
            signer = &t->keys[i];
    if (!signer)
        return hku_fail(rep, HK_ERR_SIGNATURE,
                        "rollback request does not verify with any trusted key");
    int err = 0;
    cJSON *root = hkn_json_parse_strict(text, len);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "type");
    const cJSON *mod = cJSON_GetObjectItemCaseSensitive(root, "module");
    const cJSON *target = cJSON_GetObjectItemCaseSensitive(root, "target");
    const cJSON *exp = cJSON_GetObjectItemCaseSensitive(root, "expires");
    const cJSON *nonce = cJSON_GetObjectItemCaseSensitive(root, "nonce");
    const cJSON *kid = cJSON_GetObjectItemCaseSensitive(root, "key_id");
    const cJSON *endpoint = cJSON_GetObjectItemCaseSensitive(root, "endpoint");
    if (!cJSON_IsObject(root) || !cJSON_IsString(type) ||
        strcmp(type->valuestring, "hotkern-rollback") || !cJSON_IsString(mod) ||
        !hkn_valid_name(mod->valuestring, sizeof out->module) || !cJSON_IsNumber(target) ||
        !(target->valuedouble >= 0) || target->valuedouble > HKN_MAX_JSON_INT ||
        floor(target->valuedouble) != target->valuedouble || !cJSON_IsNumber(exp) ||
        !(exp->valuedouble >= 0) || exp->valuedouble > HKN_MAX_JSON_INT ||
        floor(exp->valuedouble) != exp->valuedouble || !cJSON_IsString(nonce) ||
        strlen(nonce->valuestring) != 32 || strspn(nonce->valuestring, "0123456789abcdef") != 32 ||
        !cJSON_IsString(kid) || strcmp(kid->valuestring, signer->id)) {
        err = hku_fail(rep, HK_ERR_INVALID,
                       "rollback request is not {\"type\": \"hotkern-rollback\", \"module\", "
                       "\"target\", \"expires\", \"nonce\" (32 hex), \"key_id\" of its signer, "
                       "\"endpoint\"}");
        goto out;
    }
    /* A request names the one endpoint it is for: without that, one
     * captured request would roll back every host that trusts the key. */
    if (!cJSON_IsString(endpoint) || !hkn_valid_endpoint_id(endpoint->valuestring)) {
        err = hku_fail(rep, HK_ERR_SIGNATURE,
                       "the signed rollback request names no endpoint id (a request is bound "
                       "to one endpoint: sign it again with hotkern rollback --key)");
        goto out;
    }
    snprintf(out->endpoint, sizeof out->endpoint, "%s", endpoint->valuestring);
    snprintf(out->module, sizeof out->module, "%s", mod->valuestring);
    out->target = (uint64_t)target->valuedouble;
    out->expires = (int64_t)exp->valuedouble;
    snprintf(out->nonce, sizeof out->nonce, "%s", nonce->valuestring);
    snprintf(out->key_id, sizeof out->key_id, "%s", signer->id);
    if (out->expires <= now)
        err = hku_fail(rep, HK_ERR_EXPIRED, "rollback request expired %lld s ago",
                       (long long)(now - out->expires));
    else if (out->expires > now + HKN_ROLLBACK_MAX_S + HKN_CLOCK_SKEW_S)
        err = hku_fail(rep, HK_ERR_EXPIRED,
                       "rollback request expires in %lld s, over the limit of %d s",
                       (long long)(out->expires - now), HKN_ROLLBACK_MAX_S);
out:
    cJSON_Delete(root);
    return err;
}

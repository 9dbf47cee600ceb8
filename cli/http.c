/*
 * The hotkern tool's side of the endpoint's HTTP protocol (include/hotkern/
 * net.h): one libcurl request helper, the report of an endpoint's answer to a
 * release or a rollback, and the subcommands that only talk to an endpoint,
 * status and rollback. push (cli/net_cmds.c) signs a release and then uses
 * the same helper and report.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <sodium.h>

#include "cli/cli.h"
#include "net/net.h"

#define MAX_ANSWER (16u << 20) /* answers are small JSON; anything bigger is not ours */

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud) {
    hkc_resp *r = ud;
    size_t n = size * nmemb;
    if (r->len + n > MAX_ANSWER)
        return 0;
    char *nd = realloc(r->data, r->len + n + 1);
    if (!nd)
        return 0;
    memcpy(nd + r->len, p, n);
    r->data = nd;
    r->len += n;
    r->data[r->len] = '\0';
    return n;
}

/* base + path, without the slashes base may end with. */
static char *route_url(const char *base, const char *path) {
    char *u = NULL;
    size_t n = strlen(base);
    while (n > 0 && base[n - 1] == '/')
        n--;
    if (asprintf(&u, "%.*s%s", (int)n, base, path) < 0)
        return NULL;
    return u;
}

static void set_transfer(CURL *c, const hkc_http_opts *ho, char *err, hkc_resp *r) {
    static char ua[64];
    snprintf(ua, sizeof ua, "hotkern-cli/%s", hk_version());
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_USERAGENT, ua);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)(ho->timeout_s ? ho->timeout_s : 120));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    if (ho->cacert)
        curl_easy_setopt(c, CURLOPT_CAINFO, ho->cacert);
    if (ho->insecure) {
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
    }
}

int hkc_http_body(hkc_out *o, const char *method, const char *base, const char *path,
                  const void *body, size_t len, const char *ctype, const hkc_http_opts *ho,
                  hkc_resp *r) {
    char err[CURL_ERROR_SIZE] = "", auth[1024], type[128];
    struct curl_slist *h = NULL;
    memset(r, 0, sizeof *r);
    r->status = -1;
    char *url = route_url(base, path);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *c = url ? curl_easy_init() : NULL;
    if (!c) {
        free(url);
        return hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    set_transfer(c, ho, err, r);
    if (ho->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", ho->token);
        h = curl_slist_append(h, auth);
    }
    if (!strcmp(method, "POST")) {
        snprintf(type, sizeof type, "Content-Type: %s", ctype);
        h = curl_slist_append(h, type);
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        /* libcurl sends from the caller's buffer (no copy): a release is
         * held once here too. */
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? len : 0));
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    else
        hkc_fail(o, HK_ERR_NETWORK, NULL, "%s %s: %s", method, url,
                 err[0] ? err : curl_easy_strerror(rc));
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    free(url);
    return rc == CURLE_OK ? 0 : 1;
}

int hkc_http(hkc_out *o, const char *method, const char *base, const char *path, const char *body,
             const hkc_http_opts *ho, hkc_resp *r) {
    return hkc_http_body(o, method, base, path, body, body ? strlen(body) : 0, "application/json",
                         ho, r);
}

static const char *str_field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const cJSON *num_field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(v) ? v : NULL;
}

/* The endpoint's error of a non-200 answer, or HK_ERR_NETWORK with the body
 * when it is not the endpoint's JSON (a proxy's page, say). */
static int answer_error(hkc_out *o, const hkc_resp *r, const cJSON *a) {
    const cJSON *code = num_field(a, "code");
    const char *msg = str_field(a, "message");
    if (!code || !msg)
        return hkc_fail(o, HK_ERR_NETWORK, NULL, "HTTP %ld: %.300s", r->status,
                        r->data ? r->data : "");
    int err = (int)code->valuedouble;
    return hkc_fail(o, err ? err : HK_ERR_NETWORK, str_field(a, "log"), "HTTP %ld: %s", r->status,
                    msg);
}

/* The release an answer is about: the endpoint's "release_version" (what
 * runs after a rollback), a release answer's "version", or what the tool
 * asked for; 0 when none says. A rollback's "version" is the engine's
 * version of the image it committed again, never a release. */
static uint64_t answer_release(const cJSON *a, const hkc_asked *asked) {
    const cJSON *rel = num_field(a, "release_version"), *ver = num_field(a, "version");
    if (rel && rel->valuedouble > 0)
        return (uint64_t)rel->valuedouble;
    if (!asked->rollback && ver && ver->valuedouble > 0)
        return (uint64_t)ver->valuedouble;
    return asked->release;
}

/* The answer to a release or rollback as lines a person reads. */
static void print_outcome(const hkc_resp *r, const cJSON *a, const hkc_asked *asked) {
    const char *mod = str_field(a, "module"), *err = str_field(a, "error");
    const char *msg = str_field(a, "message"), *log = str_field(a, "log");
    const cJSON *ev = num_field(a, "engine_version");
    uint64_t rel = answer_release(a, asked);
    FILE *f = r->status == 200 ? stdout : stderr;
    /* Every string is the endpoint's: cleaned of terminal escapes. */
    hkc_put_clean(f, str_field(a, "outcome"), 0);
    fprintf(f, " (HTTP %ld): module ", r->status);
    if (mod && mod[0])
        hkc_put_clean(f, mod, 0);
    else if (asked->module) /* refused before its signature verified */
        fprintf(f, "%s (as signed here; the endpoint did not verify it)", asked->module);
    else
        fprintf(f, "(unknown)");
    if (rel)
        fprintf(f, " release v%llu", (unsigned long long)rel);
    if (ev)
        fprintf(f, ", engine version %.0f", ev->valuedouble);
    fprintf(f, "\n");
    if (r->status != 200 && err) {
        fprintf(f, "error: ");
        hkc_put_clean(f, err, 0);
        fprintf(f, "\n");
    }
    if (msg && msg[0]) {
        fprintf(f, "message: ");
        hkc_put_clean(f, msg, 0);
        fprintf(f, "\n");
    }
    if (log && log[0]) {
        fprintf(f, "log:\n");
        hkc_put_clean(f, log, 1);
        fprintf(f, "%s", log[strlen(log) - 1] == '\n' ? "" : "\n");
    }
}

/* The same as fields of the JSON document. A release already set (push
 * knows what it signed) is kept: the endpoint's echo goes through a double
 * printed with 15 digits, which rounds releases near 2^53. So is a module
 * already set when the answer names none. */
static void set_outcome(hkc_out *o, const cJSON *a, const hkc_asked *asked) {
    static const char *const ms[] = {"build_ms", "stage_ms", "commit_ms"};
    const cJSON *ev = num_field(a, "engine_version");
    const char *mod = str_field(a, "module");
    uint64_t rel = answer_release(a, asked);
    hkc_set_str(o, "outcome", str_field(a, "outcome"));
    if (mod && mod[0])
        hkc_set_str(o, "module", mod);
    if (rel && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o->doc, "release")))
        hkc_set_int(o, "release", (long long)rel);
    if (ev)
        hkc_set_int(o, "engine_version", (long long)ev->valuedouble);
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        const cJSON *v = num_field(a, ms[i]);
        if (v)
            hkc_set(o, ms[i], cJSON_CreateNumber(v->valuedouble));
    }
}

int hkc_report_outcome(hkc_out *o, const hkc_resp *r, const hkc_asked *asked) {
    cJSON *a = r->data ? cJSON_ParseWithLength(r->data, r->len) : NULL;
    int rc;
    hkc_set_int(o, "http_status", r->status);
    if (!str_field(a, "outcome")) {
        rc = answer_error(o, r, a);
    } else {
        if (o->json)
            set_outcome(o, a, asked);
        else
            print_outcome(r, a, asked);
        /* In text mode print_outcome said it all; hkc_fail adds the fields. */
        rc = r->status == 200 ? 0 : o->json ? answer_error(o, r, a) : 1;
    }
    cJSON_Delete(a);
    return rc;
}

/* ---- status ------------------------------------------------------------ */

static const char status_help[] =
    "usage: hotkern status URL [--token T] [--json]\n\n"
    "Prints GET URL/v1/status: each module's release and engine versions and\n"
    "its last outcome, message and build log. With --json the endpoint's answer\n"
    "is the document's \"endpoint\" field.\n" HKC_HTTP_HELP HKC_JSON_HELP
    "Exit status: 0 answered, 1 failed, 2 usage.\n";

int hkc_cmd_status(int argc, char **argv) {
    hkc_http_opts ho = {.token = getenv("HOTKERN_TOKEN"), .timeout_s = 30};
    hkc_out o;
    int json = 0, nargs = 0;
    const hkc_opt opts[] = {HKC_HTTP_OPTS(&ho), HKC_JSON_OPT(&json)};
    int rc = hkc_parse(&o, "status", opts, HKC_NOPTS(opts), status_help, argc, argv, &nargs);
    if (rc >= 0)
        return hkc_finish(&o, rc);
    if (nargs != 1)
        return hkc_finish(&o, hkc_usage(&o, "URL is required"));
    hkc_declare(&o, "url", "http_status", "endpoint", NULL);
    hkc_set_str(&o, "url", argv[1]);
    hkc_resp r;
    if ((rc = hkc_http(&o, "GET", argv[1], "/v1/status", NULL, &ho, &r)) == 0) {
        cJSON *a = r.data ? cJSON_ParseWithLength(r.data, r.len) : NULL;
        hkc_set_int(&o, "http_status", r.status);
        if (r.status != 200 || !cJSON_IsObject(a)) {
            rc = answer_error(&o, &r, a);
        } else if (o.json) {
            hkc_set(&o, "endpoint", a);
            a = NULL;
        } else {
            char *pretty = cJSON_Print(a);
            hkc_put_clean(stdout, pretty ? pretty : r.data, 1);
            printf("\n");
            free(pretty);
        }
        cJSON_Delete(a);
    }
    free(r.data);
    return hkc_finish(&o, rc);
}

/* ---- rollback ---------------------------------------------------------- */

/* What a signed rollback request names that only the endpoint knows, from
 * its GET /v1/status: its id (into id, when id[0] is still empty) and, when
 * *target is UINT64_MAX, the release the engine would roll module back to. */
static int endpoint_facts(hkc_out *o, const char *base, const char *module, const hkc_http_opts *ho,
                          char id[HKN_ENDPOINT_ID_MAX], uint64_t *target) {
    hkc_resp r;
    int rc = 0;
    if (hkc_http(o, "GET", base, "/v1/status", NULL, ho, &r)) {
        free(r.data);
        return 1;
    }
    cJSON *a = r.status == 200 && r.data ? cJSON_ParseWithLength(r.data, r.len) : NULL;
    if (!cJSON_IsObject(a)) {
        rc = answer_error(o, &r, a);
        goto out;
    }
    const char *eid = str_field(a, "endpoint_id");
    if (!id[0]) {
        if (!eid || !hkn_valid_endpoint_id(eid)) {
            rc = hkc_fail(o, HK_ERR_NOT_FOUND, NULL,
                          "the endpoint's status names no endpoint id to sign the request "
                          "for; give --endpoint-id");
            goto out;
        }
        snprintf(id, HKN_ENDPOINT_ID_MAX, "%s", eid);
    }
    if (*target == UINT64_MAX) {
        const cJSON *m;
        cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(a, "modules")) {
            const char *name = str_field(m, "module");
            const cJSON *prev = num_field(m, "previous_release_version");
            if (name && !strcmp(name, module) && prev)
                *target = (uint64_t)prev->valuedouble;
        }
        if (*target == UINT64_MAX)
            rc = hkc_fail(o, HK_ERR_NOT_FOUND, NULL,
                          "the endpoint's status names no image of '%s' to roll back to; give "
                          "--to",
                          module);
    }
out:
    cJSON_Delete(a);
    free(r.data);
    return rc;
}

/* The body of a rollback request signed with the key at key_path. */
static int signed_rollback(hkc_out *o, const char *key_path, const char *module, uint64_t target,
                           const char *endpoint, uint64_t expires_in, char **body) {
    hkn_seckey key;
    hk_report rep = HK_REPORT_INIT;
    char *text = NULL, *sig = NULL;
    size_t tlen = 0;
    int rc = hkn_seckey_load(key_path, &key, &rep) ||
             hkn_rollback_sign(&key, module, target, (int64_t)time(NULL) + (int64_t)expires_in,
                               endpoint, &text, &tlen, &sig, &rep);
    sodium_memzero(&key, sizeof key);
    if (rc) {
        rc = hkc_fail_report(o, &rep);
    } else {
        cJSON *b = cJSON_CreateObject();
        if (b && cJSON_AddStringToObject(b, "request", text) &&
            cJSON_AddStringToObject(b, "signature", sig))
            *body = cJSON_PrintUnformatted(b);
        cJSON_Delete(b);
        rc = *body ? 0 : hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    }
    hk_report_clear(&rep);
    free(text);
    free(sig);
    return rc;
}

static const char rollback_help[] =
    "usage: hotkern rollback URL MODULE (--token T | --key SECRET [--to N]\n"
    "       [--endpoint-id ID]) [--expires-in SECONDS] [--json]\n\n"
    "Asks the endpoint at URL to commit MODULE's previous image again\n"
    "(POST URL/v1/rollback/MODULE) and prints the outcome. A rollback needs\n"
    "the same authority as a release: the endpoint's token, or a request\n"
    "signed with --key for that one endpoint (--endpoint-id, default the id\n"
    "its status reports), naming the release N to be running afterwards\n"
    "(default: the release the endpoint's engine would roll back to; the\n"
    "engine refuses the rollback if its previous image is another release)\n"
    "and expiring after --expires-in seconds (default 300, at most 3600). A\n"
    "signed request is good for one use.\n" HKC_HTTP_HELP HKC_JSON_HELP
    "Exit status: 0 rolled back, 1 refused or failed, 2 usage.\n";

int hkc_cmd_rollback(int argc, char **argv) {
    hkc_http_opts ho = {.token = getenv("HOTKERN_TOKEN"), .timeout_s = 120};
    const char *key_path = NULL, *endpoint_id = NULL;
    uint64_t target = UINT64_MAX, expires_in = 300;
    int json = 0, nargs = 0;
    const hkc_opt opts[] = {
        HKC_STRING_OPT("--key", &key_path),
        HKC_STRING_OPT("--endpoint-id", &endpoint_id),
        HKC_UINT_OPT("--to", &target, 0, HKC_MAX_RELEASE, "--to needs a release version"),
        HKC_UINT_OPT("--expires-in", &expires_in, 1, HKN_ROLLBACK_MAX_S,
                     "--expires-in needs seconds from 1 to 3600"),
        HKC_HTTP_OPTS(&ho),
        HKC_JSON_OPT(&json),
    };
    hkc_out o;
    int rc = hkc_parse(&o, "rollback", opts, HKC_NOPTS(opts), rollback_help, argc, argv, &nargs);
    if (rc >= 0)
        return hkc_finish(&o, rc);
    if (nargs != 2)
        return hkc_finish(&o, hkc_usage(&o, "URL and MODULE are required"));
    const char *base = argv[1], *module = argv[2];
    if (!hkn_valid_name(module, 64))
        return hkc_finish(&o, hkc_usage(&o, "MODULE must be [A-Za-z0-9_.-]{1,63}"));
    if (endpoint_id && !hkn_valid_endpoint_id(endpoint_id))
        return hkc_finish(&o, hkc_usage(&o, "--endpoint-id must be [A-Za-z0-9_.:@-]{1,127}"));
    if (endpoint_id && !key_path)
        return hkc_finish(&o, hkc_usage(&o, "--endpoint-id names what --key signs for"));
    hkc_declare(&o, "outcome", "http_status", "module", "release", "engine_version", NULL);
    char *body = NULL, path[128], id[HKN_ENDPOINT_ID_MAX] = "";
    hkc_resp r = {0};
    rc = 1;
    if (endpoint_id)
        snprintf(id, sizeof id, "%s", endpoint_id);
    if (key_path &&
        (((!id[0] || target == UINT64_MAX) && endpoint_facts(&o, base, module, &ho, id, &target)) ||
         signed_rollback(&o, key_path, module, target, id, expires_in, &body)))
        goto out;
    /* The name is checked above: [A-Za-z0-9_.-] needs no escaping in a path. */
    snprintf(path, sizeof path, "/v1/rollback/%s", module);
    hkc_asked asked = {.module = module, .release = key_path ? target : 0, .rollback = 1};
    hkc_set_str(&o, "module", module);
    if (hkc_http(&o, "POST", base, path, body, &ho, &r) == 0)
        rc = hkc_report_outcome(&o, &r, &asked);
out:
    free(r.data);
    free(body);
    return hkc_finish(&o, rc);
}

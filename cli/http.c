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

size_t hkc_resp_write(char *p, size_t size, size_t nmemb, void *ud) {
    hkc_resp *r = ud;
    size_t n = size * nmemb;
    if (r->len + n > (r->max ? r->max : MAX_ANSWER))
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

char *hkc_route_url(const char *base, const char *path) {
    char *u = NULL;
    size_t n = strlen(base);
    while (n > 0 && base[n - 1] == '/')
        n--;
    if (asprintf(&u, "%.*s%s", (int)n, base, path) < 0)
        return NULL;
    return u;
}

void hkc_http_setup(void *curl, const hkc_http_opts *ho, char *err, hkc_resp *r) {
    CURL *c = curl;
    static char ua[64];
    snprintf(ua, sizeof ua, "hotkern-cli/%s", hk_version());
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_USERAGENT, ua);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)(ho->timeout_s ? ho->timeout_s : 120));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, hkc_resp_write);
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
    char *url = hkc_route_url(base, path);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *c = url ? curl_easy_init() : NULL;
    if (!c) {
        free(url);
        return hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    hkc_http_setup(c, ho, err, r);
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
    "Prints GET URL/v1/status as a table, a line a module: the release it runs,\n"
    "the one a rollback would commit, the engine's version number, its last\n"
    "outcome and since when; then the message and build log of each module whose\n"
    "last release or rollback was refused, and the quarantined images. With\n"
    "--json the endpoint's answer is the document's \"endpoint\" field.\n" HKC_HTTP_HELP
        HKC_JSON_HELP "Exit status: 0 answered, 1 failed, 2 usage.\n";

/* An integer field as text ("v12" with prefix "v"), or "-" when absent,
 * null or 0 (the endpoint's "unknown"). */
static const char *int_text(const cJSON *o, const char *name, const char *prefix, char *buf,
                            size_t n) {
    const cJSON *v = num_field(o, name);
    if (!v || v->valuedouble <= 0)
        return "-";
    snprintf(buf, n, "%s%.0f", prefix, v->valuedouble);
    return buf;
}

/* "2026-12-02 07:41:09 UTC (35 s ago)" of a unix time; "-" for none. */
static const char *since_text(const cJSON *o, char *buf, size_t n) {
    const cJSON *v = num_field(o, "updated");
    if (!v || v->valuedouble <= 0)
        return "-";
    time_t t = (time_t)v->valuedouble, now = time(NULL);
    struct tm tm;
    size_t used = gmtime_r(&t, &tm) ? strftime(buf, n, "%Y-%m-%d %H:%M:%S UTC", &tm) : 0;
    long long age = (long long)(now - t);
    if (age < 0)
        age = 0;
    snprintf(buf + used, n - used, " (%lld %s ago)",
             age < 120      ? age
             : age < 7200   ? age / 60
             : age < 172800 ? age / 3600
                            : age / 86400,
             age < 120      ? "s"
             : age < 7200   ? "min"
             : age < 172800 ? "h"
                            : "d");
    return buf;
}

/* The last outcome, with its error when it is a refusal: "refused
 * (HK_ERR_COMPILE)". */
static const char *outcome_text(const cJSON *m, char *buf, size_t n) {
    const char *out = str_field(m, "last_outcome"), *err = str_field(m, "last_error");
    if (!out || !out[0])
        return "-";
    if (err && strcmp(err, "HK_OK") && strcmp(out, "committed") && strcmp(out, "rolled_back"))
        snprintf(buf, n, "%s (%s)", out, err);
    else
        snprintf(buf, n, "%s", out);
    return buf;
}

/* A cell of the table: the endpoint's text cleaned, padded to width. */
static void cell(const char *text, int width) {
    hkc_put_clean(stdout, text, 0);
    for (int i = (int)strlen(text); i < width; i++)
        putchar(' ');
}

#define STATUS_COLS 6

/* The cells of module m's row (buffers of 96 bytes each). */
static void module_row(const cJSON *m, char cells[STATUS_COLS][96], const char *row[STATUS_COLS]) {
    const cJSON *run = num_field(m, "running_release_version");
    row[0] = str_field(m, "module") ? str_field(m, "module") : "?";
    /* What runs is the engine's to say; an engine that cannot (no release
     * callback) leaves the highest release committed through the endpoint. */
    row[1] = int_text(m, run ? "running_release_version" : "release_version", "v", cells[1], 96);
    row[2] = int_text(m, "previous_release_version", "v", cells[2], 96);
    row[3] = int_text(m, "engine_version", "", cells[3], 96);
    row[4] = outcome_text(m, cells[4], 96);
    row[5] = since_text(m, cells[5], 96);
}

/* The refusal detail of a module (or of the last request, which named no
 * module it could verify): message, canary, log. */
static void print_detail(const char *who, const cJSON *m) {
    const char *msg = str_field(m, "last_message"), *can = str_field(m, "last_canary");
    const char *log = str_field(m, "last_log");
    printf("\n");
    hkc_put_clean(stdout, who, 0);
    printf(": ");
    hkc_put_clean(stdout, msg && msg[0] ? msg : "(no message)", 0);
    printf("\n");
    if (can && can[0]) {
        printf("  canary: ");
        hkc_put_clean(stdout, can, 0);
        printf("\n");
    }
    for (const char *p = log; p && *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char *line = strndup(p, len);
        printf("  ");
        hkc_put_clean(stdout, line ? line : "", 0);
        printf("\n");
        free(line);
        p += len + (eol ? 1 : 0);
    }
}

static int refused(const cJSON *m) {
    const char *out = str_field(m, "last_outcome");
    return out && out[0] && strcmp(out, "committed") && strcmp(out, "rolled_back");
}

/* GET /v1/status as lines a person reads (JSON only with --json). */
static void print_status(const char *url, const cJSON *a) {
    static const char *const head[STATUS_COLS] = {"MODULE", "RELEASE", "PREVIOUS",
                                                  "ENGINE", "LAST",    "SINCE"};
    const cJSON *mods = cJSON_GetObjectItemCaseSensitive(a, "modules"), *m;
    const cJSON *req = num_field(a, "requests"), *conns = num_field(a, "connections");
    const char *id = str_field(a, "endpoint_id"), *sf = str_field(a, "state_file");
    int width[STATUS_COLS], nmods = cJSON_GetArraySize(mods);
    char cells[STATUS_COLS][96];
    const char *row[STATUS_COLS];
    printf("endpoint ");
    hkc_put_clean(stdout, id ? id : "?", 0);
    double nreq = req ? req->valuedouble : 0, nconn = conns ? conns->valuedouble : 0;
    printf(" at %s: %d module%s, %.0f request%s, %.0f connection%s\n", url, nmods,
           nmods == 1 ? "" : "s", nreq, nreq == 1 ? "" : "s", nconn, nconn == 1 ? "" : "s");
    if (sf) {
        printf("anti-rollback record: ");
        hkc_put_clean(stdout, sf, 0);
        printf("\n");
    }
    if (!nmods) {
        printf("no module has had a release or rollback through this endpoint yet\n");
    } else {
        for (int c = 0; c < STATUS_COLS; c++)
            width[c] = (int)strlen(head[c]);
        cJSON_ArrayForEach(m, mods) {
            module_row(m, cells, row);
            for (int c = 0; c < STATUS_COLS; c++)
                if ((int)strlen(row[c]) > width[c])
                    width[c] = (int)strlen(row[c]);
        }
        printf("\n");
        for (int c = 0; c < STATUS_COLS; c++)
            cell(head[c], c + 1 < STATUS_COLS ? width[c] + 2 : 0);
        printf("\n");
        cJSON_ArrayForEach(m, mods) {
            module_row(m, cells, row);
            for (int c = 0; c < STATUS_COLS; c++)
                cell(row[c], c + 1 < STATUS_COLS ? width[c] + 2 : 0);
            printf("\n");
        }
    }
    cJSON_ArrayForEach(m, mods) {
        if (refused(m))
            print_detail(str_field(m, "module") ? str_field(m, "module") : "?", m);
    }
    /* The last request, when it named no module it could verify. */
    const cJSON *last = cJSON_GetObjectItemCaseSensitive(a, "last");
    const char *lname = str_field(last, "module");
    if (cJSON_IsObject(last) && refused(last) && (!lname || !lname[0])) {
        char ob[96], sb[96];
        printf("\nlast request: %s, %s", outcome_text(last, ob, sizeof ob),
               since_text(last, sb, sizeof sb));
        print_detail("  named no module it could verify", last);
    }
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(a, "quarantine");
    if (cJSON_GetArraySize(q) > 0)
        printf("\n");
    cJSON_ArrayForEach(m, q) {
        char rb[32], vb[32];
        printf("quarantined: ");
        hkc_put_clean(stdout, str_field(m, "module") ? str_field(m, "module") : "?", 0);
        printf(" image ");
        hkc_put_clean(stdout, str_field(m, "image") ? str_field(m, "image") : "?", 0);
        printf(" (release %s, engine version %s)\n",
               int_text(m, "release_version", "v", rb, sizeof rb),
               int_text(m, "version", "", vb, sizeof vb));
    }
}

int hkc_cmd_status(int argc, char **argv) {
    hkc_http_opts ho = {.token = getenv("HOTKERN_TOKEN"), .timeout_s = 30};
    hkc_out o;
    int json = 0, nargs = 0;
    const hkc_opt opts[] = {HKC_HTTP_OPTS(&ho), HKC_JSON_OPT(&json)};
    int rc = hkc_parse(&o, "status", opts, HKC_NOPTS(opts), status_help, argc, argv, &nargs);
    if (rc != HKC_CONTINUE)
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
            print_status(argv[1], a);
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
    if (rc != HKC_CONTINUE)
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

/*
 * The push endpoint: an HTTP server (libmicrohttpd) that accepts signed
 * releases, answers status, rollback, metrics and health requests.
 *
 * Threads. libmicrohttpd runs a listening thread plus one thread per
 * connection, capped by max_connections and an idle timeout per connection.
 * A thread per connection (rather than one polling thread) keeps a slow swap
 * (an NVRTC build takes tens of ms) from stalling status and metrics
 * requests. The handlers never touch the engine's state themselves: they hand
 * a verified artifact to the hkn_engine's apply function, which the engine
 * serialises.
 *
 * Locks (private to this file), taken in this order only:
 *   release_lock  serialises verify -> apply -> accept, so that two pushes of
 *                 one version cannot both pass the replay check;
 *   lock          the module table and the counters (held briefly, never
 *                 across a callback into the engine).
 *
 * Request bodies. A release is one JSON object (see include/hotkern/net.h for
 * the protocol). The body cap is enforced before anything is read: a
 * Content-Length over the cap is answered 413 from the first callback, when
 * only the headers have arrived. A chunked body is counted while it streams
 * and refused once it passes the cap.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <sodium.h>

#include "net/net.h"

#define MAX_MODULES   256
#define MAX_LOG_KEPT  (64 * 1024)
#define ROLLBACK_BODY 4096
#define NERRORS       32

enum route { R_NONE, R_RELEASE, R_STATUS, R_ROLLBACK, R_METRICS, R_HEALTH };

struct ep_module {
    char name[64];
    uint64_t release_version; /* highest release committed through this endpoint */
    int last_error;
    char last_outcome[16]; /* "committed", "refused", "rolled_back" */
    char last_message[512];
    char *last_log; /* owned */
    int64_t updated;
};

struct hkn_endpoint {
    /* Immutable from start to stop. */
    struct MHD_Daemon *daemon;
    hkn_engine eng;
    hkn_trust trust;
    char *token;
    size_t max_body;
    uint16_t port;
    hkn_state *state;
    char *cert_pem, *key_pem; /* libmicrohttpd reads them for the daemon's life */

    pthread_mutex_t release_lock; /* see the file comment */

    pthread_mutex_t lock;
    struct ep_module *mods;     /* lock */
    size_t nmods;               /* lock */
    struct ep_module last;      /* lock: the latest release or rollback outcome */
    uint64_t requests;          /* lock */
    uint64_t unauthorized;      /* lock */
    uint64_t too_large;         /* lock */
    uint64_t committed;         /* lock */
    uint64_t rolled_back;       /* lock */
    uint64_t refusals[NERRORS]; /* lock: by -error */
};

/* One request, owned by its connection thread. */
struct req {
    enum route route;
    char module[64]; /* rollback target */
    char *body;
    size_t len, cap, limit;
    int too_large;
};

/* Marks a request already answered from the first callback. */
static struct req answered;

void hkn_endpoint_cfg_init(hkn_endpoint_cfg *c) {
    memset(c, 0, sizeof *c);
    c->address = "127.0.0.1";
    c->max_body = 64u << 20;
    c->max_connections = 128;
    c->timeout_s = 30;
}

/* ---- responses --------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *text,
                             const char *type) {
    /* text is malloc'd and handed to libmicrohttpd, which frees it. */
    struct MHD_Response *r =
        MHD_create_response_from_buffer_with_free_callback(strlen(text), text, free);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, cJSON *obj) {
    char *text = obj ? cJSON_Print(obj) : NULL;
    cJSON_Delete(obj);
    if (!text)
        return MHD_NO;
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (t2) {
        text = t2;
        memcpy(text + n, "\n", 2);
    }
    return reply(c, status, text, "application/json");
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, int err,
                                   const char *msg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", "error");
    cJSON_AddStringToObject(o, "error", hkn_error_name(err));
    cJSON_AddNumberToObject(o, "code", err);
    cJSON_AddStringToObject(o, "message", msg);
    return reply_json(c, status, o);
}

static unsigned http_status(int err) {
    switch (err) {
    case HK_OK:
        return MHD_HTTP_OK;
    case HK_ERR_INVALID:
    case HK_ERR_FORMAT:
        return MHD_HTTP_BAD_REQUEST;
    case HK_ERR_SIGNATURE:
    case HK_ERR_EXPIRED:
        return MHD_HTTP_FORBIDDEN;
    case HK_ERR_NOT_FOUND:
        return MHD_HTTP_NOT_FOUND;
    case HK_ERR_REPLAY:
    case HK_ERR_NO_HISTORY:
        return MHD_HTTP_CONFLICT;
    case HK_ERR_TOO_LARGE:
        return MHD_HTTP_CONTENT_TOO_LARGE;
    case HK_ERR_HASH:
    case HK_ERR_COMPILE:
    case HK_ERR_ARCH:
    case HK_ERR_MISSING_KERNEL:
    case HK_ERR_LAYOUT:
    case HK_ERR_GLOBAL_SIZE:
    case HK_ERR_REJECTED:
        return MHD_HTTP_UNPROCESSABLE_CONTENT;
    case HK_ERR_BUSY:
    case HK_ERR_CLOSED:
    case HK_ERR_UNSUPPORTED:
        return MHD_HTTP_SERVICE_UNAVAILABLE;
    case HK_ERR_TIMEOUT:
        return MHD_HTTP_GATEWAY_TIMEOUT;
    default:
        return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
}

/* ---- the module table -------------------------------------------------- */

static struct ep_module *module_locked(hkn_endpoint *ep, const char *name) {
    for (size_t i = 0; i < ep->nmods; i++)
        if (!strcmp(ep->mods[i].name, name))
            return &ep->mods[i];
    if (ep->nmods == MAX_MODULES)
        return NULL;
    struct ep_module *m = &ep->mods[ep->nmods++];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    return m;
}

static void set_outcome(struct ep_module *m, const char *outcome, const hk_report *rep, int err) {
    snprintf(m->last_outcome, sizeof m->last_outcome, "%s", outcome);
    m->last_error = err;
    snprintf(m->last_message, sizeof m->last_message, "%s", rep->message);
    free(m->last_log);
    m->last_log = rep->log ? strndup(rep->log, MAX_LOG_KEPT) : NULL;
    m->updated = (int64_t)time(NULL);
}

/* Records an outcome; module may be "" when the release never got that far. */
static void record(hkn_endpoint *ep, const char *module, const char *outcome, int err,
                   uint64_t version, const hk_report *rep) {
    pthread_mutex_lock(&ep->lock);
    if (err && -err < NERRORS)
        ep->refusals[-err]++;
    else if (!err && !strcmp(outcome, "committed"))
        ep->committed++;
    else if (!err)
        ep->rolled_back++;
    snprintf(ep->last.name, sizeof ep->last.name, "%s", module);
    set_outcome(&ep->last, outcome, rep, err);
    struct ep_module *m = module[0] ? module_locked(ep, module) : NULL;
    if (m) {
        set_outcome(m, outcome, rep, err);
        if (!err && version > m->release_version)
            m->release_version = version;
    }
    pthread_mutex_unlock(&ep->lock);
}

static cJSON *outcome_json(const char *outcome, int err, const hk_report *rep) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", outcome);
    cJSON_AddStringToObject(o, "module", rep->module);
    cJSON_AddNumberToObject(o, "version", (double)rep->version);
    cJSON_AddStringToObject(o, "error", hkn_error_name(err));
    cJSON_AddNumberToObject(o, "code", err);
    cJSON_AddStringToObject(o, "message", rep->message);
    if (rep->cu_name[0])
        cJSON_AddStringToObject(o, "cu_name", rep->cu_name);
    if (rep->kernel[0])
        cJSON_AddStringToObject(o, "kernel", rep->kernel);
    if (rep->log)
        cJSON_AddStringToObject(o, "log", rep->log);
    else
        cJSON_AddNullToObject(o, "log");
    cJSON_AddNumberToObject(o, "build_ms", rep->build_ms);
    cJSON_AddNumberToObject(o, "stage_ms", rep->stage_ms);
    cJSON_AddNumberToObject(o, "commit_ms", rep->commit_ms);
    cJSON_AddBoolToObject(o, "cache_hit", rep->cache_hit != 0);
    return o;
}

/* ---- POST /v1/release -------------------------------------------------- */

/* Decodes one base64 artifact; the buffer is sized from the text so a body
 * that carries more bytes than declared is seen as such, not truncated. */
static int decode_artifact(const char *b64, unsigned char **out, size_t *len) {
    size_t tlen = strlen(b64), cap = tlen / 4 * 3 + 3, got = 0;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf)
        return HK_ERR_NOMEM;
    if (sodium_base642bin(buf, cap, b64, tlen, "\r\n", &got, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0) {
        free(buf);
        return HK_ERR_INVALID;
    }
    *out = buf;
    *len = got;
    return 0;
}

static int do_release(hkn_endpoint *ep, const char *body, size_t len, hk_report *rep,
                      uint64_t *version) {
    int err = 0;
    hkn_manifest m = {0};
    unsigned char *bytes[HKN_MAX_ARTIFACTS] = {0};
    size_t sizes[HKN_MAX_ARTIFACTS] = {0};
    cJSON *root = cJSON_ParseWithLength(body, len);
    const cJSON *man = cJSON_GetObjectItemCaseSensitive(root, "manifest");
    const cJSON *sig = cJSON_GetObjectItemCaseSensitive(root, "signature");
    const cJSON *arts = cJSON_GetObjectItemCaseSensitive(root, "artifacts");
    if (!cJSON_IsObject(root) || !cJSON_IsString(man) || !cJSON_IsObject(arts) ||
        (sig && !cJSON_IsString(sig) && !cJSON_IsNull(sig))) {
        err = hkn_fail(rep, HK_ERR_INVALID,
                       "body must be a JSON object {\"manifest\": string, \"signature\": "
                       "string, \"artifacts\": {sha256: base64}}");
        goto out_unlocked;
    }
    const char *sigtext = cJSON_IsString(sig) ? sig->valuestring : NULL;
    pthread_mutex_lock(&ep->release_lock);
    err = hkn_verify_manifest(&ep->trust, ep->state, man->valuestring, strlen(man->valuestring),
                              sigtext, sigtext ? strlen(sigtext) : 0, (int64_t)time(NULL), &m, rep);
    if (err)
        goto out;
    for (size_t i = 0; i < m.nartifacts; i++) {
        const hkn_artifact *a = &m.artifacts[i];
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(arts, a->sha256);
        if (!cJSON_IsString(b)) {
            err = hkn_fail(rep, HK_ERR_HASH, "artifact '%s' (sha256 %s) is missing from the body",
                           a->name, a->sha256);
            goto out;
        }
        if (decode_artifact(b->valuestring, &bytes[i], &sizes[i]) != 0) {
            err = hkn_fail(rep, HK_ERR_INVALID, "artifact '%s' is not valid base64", a->name);
            goto out;
        }
        if ((err = hkn_verify_artifact(a, bytes[i], sizes[i], rep)))
            goto out;
    }
    size_t k = hkn_pick_artifact(&m, ep->eng.arch);
    *version = m.version;
    hk_report arep = {0};
    hk_header hdrs[HKN_MAX_ARTIFACTS];
    int nh = hkn_release_headers(&m, (const void *const *)bytes, sizes, hdrs);
    err = ep->eng.apply(ep->eng.ud, m.module, m.version, m.artifacts[k].format, bytes[k], sizes[k],
                        hdrs, nh, "push", &arep);
    /* The engine's report carries the build detail; keep the release's
     * identity (module and release version) on top of it. */
    char *log = arep.log;
    arep.log = NULL;
    hk_report keep = *rep;
    *rep = arep;
    rep->log = log;
    snprintf(rep->module, sizeof rep->module, "%s", keep.module);
    rep->version = m.version;
    rep->error = err;
    if (err) {
        if (!rep->message[0])
            snprintf(rep->message, sizeof rep->message, "the engine refused %s v%llu: %s", m.module,
                     (unsigned long long)m.version, hkn_error_name(err));
        goto out;
    }
    hk_report srep = {0};
    if (hkn_state_accept(ep->state, m.module, m.version, &srep) != 0)
        /* Committed but not persisted: the swap stands, yet a restart could
         * accept this version again. Say so rather than hide it. */
        snprintf(rep->message, sizeof rep->message,
                 "committed, but the replay state was not "
                 "saved: %.400s",
                 srep.message);
    hkn_report_reset(&srep);
out:
    pthread_mutex_unlock(&ep->release_lock);
out_unlocked:
    for (size_t i = 0; i < HKN_MAX_ARTIFACTS; i++)
        free(bytes[i]);
    hkn_manifest_free(&m);
    cJSON_Delete(root);
    return err;
}

static enum MHD_Result handle_release(hkn_endpoint *ep, struct MHD_Connection *c, struct req *r) {
    hk_report rep = {0};
    uint64_t version = 0;
    int err = do_release(ep, r->body ? r->body : "", r->len, &rep, &version);
    const char *outcome = err ? "refused" : "committed";
    record(ep, rep.module, outcome, err, version, &rep);
    cJSON *o = outcome_json(outcome, err, &rep);
    if (!err && ep->eng.version)
        cJSON_AddNumberToObject(o, "engine_version",
                                (double)ep->eng.version(ep->eng.ud, rep.module));
    hkn_report_reset(&rep);
    return reply_json(c, http_status(err), o);
}

/* ---- other routes ------------------------------------------------------ */

static enum MHD_Result handle_rollback(hkn_endpoint *ep, struct MHD_Connection *c, struct req *r) {
    hk_report rep = {0};
    int err = HK_ERR_UNSUPPORTED;
    if (ep->eng.rollback) {
        pthread_mutex_lock(&ep->release_lock);
        err = ep->eng.rollback(ep->eng.ud, r->module, &rep);
        pthread_mutex_unlock(&ep->release_lock);
    } else {
        hkn_fail(&rep, err, "this endpoint has no rollback");
    }
    rep.error = err;
    if (!rep.message[0] && err)
        snprintf(rep.message, sizeof rep.message, "rollback of %s: %s", r->module,
                 hkn_error_name(err));
    snprintf(rep.module, sizeof rep.module, "%s", r->module);
    const char *outcome = err ? "refused" : "rolled_back";
    record(ep, r->module, outcome, err, 0, &rep);
    cJSON *o = outcome_json(outcome, err, &rep);
    if (ep->eng.version)
        cJSON_AddNumberToObject(o, "engine_version",
                                (double)ep->eng.version(ep->eng.ud, r->module));
    hkn_report_reset(&rep);
    return reply_json(c, http_status(err), o);
}

static cJSON *module_json(const struct ep_module *m) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "module", m->name);
    cJSON_AddNumberToObject(o, "release_version", (double)m->release_version);
    cJSON_AddStringToObject(o, "last_outcome", m->last_outcome);
    cJSON_AddStringToObject(o, "last_error", hkn_error_name(m->last_error));
    cJSON_AddStringToObject(o, "last_message", m->last_message);
    if (m->last_log)
        cJSON_AddStringToObject(o, "last_log", m->last_log);
    else
        cJSON_AddNullToObject(o, "last_log");
    cJSON_AddNumberToObject(o, "updated", (double)m->updated);
    return o;
}

static enum MHD_Result handle_status(hkn_endpoint *ep, struct MHD_Connection *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON *mods = cJSON_AddArrayToObject(o, "modules");
    char names[MAX_MODULES][64];
    size_t n;
    pthread_mutex_lock(&ep->lock);
    n = ep->nmods;
    for (size_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(mods, module_json(&ep->mods[i]));
        memcpy(names[i], ep->mods[i].name, 64);
    }
    if (ep->last.last_outcome[0])
        cJSON_AddItemToObject(o, "last", module_json(&ep->last));
    cJSON_AddNumberToObject(o, "requests", (double)ep->requests);
    pthread_mutex_unlock(&ep->lock);
    /* Outside the lock: the engine takes its own. */
    for (size_t i = 0; i < n && ep->eng.version; i++)
        cJSON_AddNumberToObject(cJSON_GetArrayItem(mods, (int)i), "engine_version",
                                (double)ep->eng.version(ep->eng.ud, names[i]));
    return reply_json(c, MHD_HTTP_OK, o);
}

/* Appends one metric family with a single unlabelled sample. */
static void metric(char **buf, size_t *len, size_t *cap, const char *name, const char *type,
                   const char *help, double value) {
    char line[512];
    int n = snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name,
                     type, name, value);
    if (n <= 0 || (size_t)n >= sizeof line)
        return;
    if (*len + (size_t)n + 1 > *cap) {
        size_t nc = (*cap + (size_t)n + 1) * 2;
        char *nb = realloc(*buf, nc);
        if (!nb)
            return;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, line, (size_t)n + 1);
    *len += (size_t)n;
}

static void raw(char **buf, size_t *len, size_t *cap, const char *text) {
    size_t n = strlen(text);
    if (*len + n + 1 > *cap) {
        size_t nc = (*cap + n + 1) * 2;
        char *nb = realloc(*buf, nc);
        if (!nb)
            return;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, text, n + 1);
    *len += n;
}

static enum MHD_Result handle_metrics(hkn_endpoint *ep, struct MHD_Connection *c) {
    hk_stats s;
    memset(&s, 0, sizeof s);
    if (ep->eng.stats)
        ep->eng.stats(ep->eng.ud, &s);
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap), line[256];
    if (!buf)
        return MHD_NO;
    buf[0] = '\0';
    metric(&buf, &len, &cap, "hotkern_swaps_total", "counter",
           "Versions committed by the engine, rollbacks included.", (double)s.swaps);
    metric(&buf, &len, &cap, "hotkern_rollbacks_total", "counter", "Rollbacks committed.",
           (double)s.rollbacks);
    metric(&buf, &len, &cap, "hotkern_refused_total", "counter", "Versions the engine refused.",
           (double)s.refused);
    metric(&buf, &len, &cap, "hotkern_reclaimed_total", "counter",
           "Old versions whose code was unloaded.", (double)s.reclaimed);
    metric(&buf, &len, &cap, "hotkern_live_versions", "gauge", "Versions whose code is loaded now.",
           (double)s.live_versions);
    metric(&buf, &len, &cap, "hotkern_context_resets_total", "counter", "Context resets detected.",
           (double)s.context_resets);
    metric(&buf, &len, &cap, "hotkern_cache_hits_total", "counter", "Compile cache hits.",
           (double)s.cache_hits);
    metric(&buf, &len, &cap, "hotkern_cache_misses_total", "counter", "Compile cache misses.",
           (double)s.cache_misses);
    metric(&buf, &len, &cap, "hotkern_build_seconds_total", "counter",
           "Time spent building images (NVRTC, nvJitLink).", s.build_ms_total / 1e3);
    metric(&buf, &len, &cap, "hotkern_stage_seconds_total", "counter",
           "Time spent staging images in the driver.", s.stage_ms_total / 1e3);
    metric(&buf, &len, &cap, "hotkern_commit_seconds_total", "counter",
           "Time spent committing versions.", s.commit_ms_total / 1e3);
    metric(&buf, &len, &cap, "hotkern_last_swap_seconds", "gauge", "Duration of the latest swap.",
           s.last_swap_ms / 1e3);
    pthread_mutex_lock(&ep->lock);
    metric(&buf, &len, &cap, "hotkern_push_requests_total", "counter",
           "HTTP requests received by the endpoint.", (double)ep->requests);
    metric(&buf, &len, &cap, "hotkern_push_unauthorized_total", "counter",
           "Requests refused for a missing or wrong token.", (double)ep->unauthorized);
    metric(&buf, &len, &cap, "hotkern_push_too_large_total", "counter",
           "Requests refused for a body over the cap.", (double)ep->too_large);
    raw(&buf, &len, &cap,
        "# HELP hotkern_push_releases_total Pushed releases by outcome.\n"
        "# TYPE hotkern_push_releases_total counter\n");
    snprintf(line, sizeof line, "hotkern_push_releases_total{outcome=\"committed\"} %llu\n",
             (unsigned long long)ep->committed);
    raw(&buf, &len, &cap, line);
    snprintf(line, sizeof line, "hotkern_push_releases_total{outcome=\"rolled_back\"} %llu\n",
             (unsigned long long)ep->rolled_back);
    raw(&buf, &len, &cap, line);
    raw(&buf, &len, &cap,
        "# HELP hotkern_push_refusals_total Refused releases and rollbacks by error.\n"
        "# TYPE hotkern_push_refusals_total counter\n");
    for (int i = 1; i < NERRORS; i++) {
        if (!ep->refusals[i])
            continue;
        snprintf(line, sizeof line, "hotkern_push_refusals_total{error=\"%s\"} %llu\n",
                 hkn_error_name(-i), (unsigned long long)ep->refusals[i]);
        raw(&buf, &len, &cap, line);
    }
    raw(&buf, &len, &cap,
        "# HELP hotkern_module_release_version Highest release committed per module.\n"
        "# TYPE hotkern_module_release_version gauge\n");
    for (size_t i = 0; i < ep->nmods; i++) {
        snprintf(line, sizeof line, "hotkern_module_release_version{module=\"%s\"} %llu\n",
                 ep->mods[i].name, (unsigned long long)ep->mods[i].release_version);
        raw(&buf, &len, &cap, line);
    }
    pthread_mutex_unlock(&ep->lock);
    return reply(c, MHD_HTTP_OK, buf, "text/plain; version=0.0.4; charset=utf-8");
}

/* ---- dispatch ---------------------------------------------------------- */

static int authorized(hkn_endpoint *ep, struct MHD_Connection *c) {
    if (!ep->token)
        return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return 0;
    h += 7;
    size_t n = strlen(h), m = strlen(ep->token);
    /* Constant time in the token's content; the length is not a secret. */
    return n == m && sodium_memcmp(h, ep->token, n) == 0;
}

static enum MHD_Result first_call(hkn_endpoint *ep, struct MHD_Connection *c, const char *url,
                                  const char *method, void **con_cls) {
    int get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    int post = !strcmp(method, MHD_HTTP_METHOD_POST);
    enum route route = R_NONE;
    const char *module = NULL;
    pthread_mutex_lock(&ep->lock);
    ep->requests++;
    pthread_mutex_unlock(&ep->lock);
    *con_cls = &answered;

    if (!strcmp(url, "/healthz"))
        route = R_HEALTH;
    else if (!strcmp(url, "/v1/release"))
        route = R_RELEASE;
    else if (!strcmp(url, "/v1/status"))
        route = R_STATUS;
    else if (!strcmp(url, "/metrics"))
        route = R_METRICS;
    else if (!strncmp(url, "/v1/rollback/", 13) && url[13])
        route = R_ROLLBACK, module = url + 13;
    if (route == R_NONE)
        return reply_error(c, MHD_HTTP_NOT_FOUND, HK_ERR_NOT_FOUND, "no such route");

    /* Health answers everyone so that load balancers need no secret. */
    if (route == R_HEALTH)
        return get ? reply(c, MHD_HTTP_OK, strdup("ok\n"), "text/plain")
                   : reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, HK_ERR_INVALID, "use GET");
    if (!authorized(ep, c)) {
        pthread_mutex_lock(&ep->lock);
        ep->unauthorized++;
        pthread_mutex_unlock(&ep->lock);
        return reply_error(c, MHD_HTTP_UNAUTHORIZED, HK_ERR_SIGNATURE,
                           "missing or wrong bearer token");
    }
    int want_post = route == R_RELEASE || route == R_ROLLBACK;
    if ((want_post && !post) || (!want_post && !get))
        return reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, HK_ERR_INVALID,
                           want_post ? "use POST" : "use GET");
    if (route == R_STATUS)
        return handle_status(ep, c);
    if (route == R_METRICS)
        return handle_metrics(ep, c);

    size_t limit = route == R_RELEASE ? ep->max_body : ROLLBACK_BODY;
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        unsigned long long n = strtoull(cl, &end, 10);
        if (end == cl || *end || n > limit) {
            /* Answered now, with only the headers read: libmicrohttpd then
             * closes the connection instead of reading the body. */
            pthread_mutex_lock(&ep->lock);
            ep->too_large++;
            pthread_mutex_unlock(&ep->lock);
            char msg[128];
            snprintf(msg, sizeof msg, "body of %s bytes is over the cap of %zu bytes", cl, limit);
            return reply_error(c, MHD_HTTP_CONTENT_TOO_LARGE, HK_ERR_TOO_LARGE, msg);
        }
    }
    struct req *r = calloc(1, sizeof *r);
    if (!r)
        return MHD_NO;
    r->route = route;
    r->limit = limit;
    if (module) {
        if (strlen(module) >= sizeof r->module) {
            free(r);
            return reply_error(c, MHD_HTTP_BAD_REQUEST, HK_ERR_INVALID, "module name too long");
        }
        snprintf(r->module, sizeof r->module, "%s", module);
    }
    *con_cls = r;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    hkn_endpoint *ep = cls;
    if (*con_cls == NULL)
        return first_call(ep, c, url, method, con_cls);
    if (*con_cls == &answered) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    struct req *r = *con_cls;
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->too_large || n > r->limit - r->len) {
            /* A chunked body (no Content-Length) ran over the cap. Drop what
             * was kept and stop the transfer: reading on would let a client
             * hold the connection for as long as it cares to send. */
            r->too_large = 1;
            free(r->body);
            r->body = NULL;
            pthread_mutex_lock(&ep->lock);
            ep->too_large++;
            pthread_mutex_unlock(&ep->lock);
            return MHD_NO;
        }
        if (r->len + n + 1 > r->cap) {
            size_t nc = r->cap ? r->cap : 64 * 1024;
            while (nc < r->len + n + 1)
                nc *= 2;
            char *nb = realloc(r->body, nc);
            if (!nb)
                return MHD_NO;
            r->body = nb;
            r->cap = nc;
        }
        memcpy(r->body + r->len, upload_data, n);
        r->len += n;
        r->body[r->len] = '\0';
        return MHD_YES;
    }
    if (r->route == R_RELEASE)
        return handle_release(ep, c, r);
    return handle_rollback(ep, c, r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    struct req *r = *con_cls;
    if (r && r != &answered) {
        free(r->body);
        free(r);
    }
    *con_cls = NULL;
}

/* ---- lifecycle --------------------------------------------------------- */

int hkn_endpoint_start(const hkn_endpoint_cfg *cfg, const hkn_engine *e, hkn_endpoint **out,
                       hk_report *rep) {
    *out = NULL;
    int err = 0;
    if (!cfg || !e || !e->apply)
        return hkn_fail(rep, HK_ERR_INVALID,
                        "endpoint needs a configuration and an apply "
                        "function");
    if (hkn_crypto_init())
        return hkn_fail(rep, HK_ERR_UNSUPPORTED, "libsodium failed to initialise");
    if ((cfg->tls_cert_pem != NULL) != (cfg->tls_key_pem != NULL))
        return hkn_fail(rep, HK_ERR_INVALID, "TLS needs both a certificate and a key");
    if (cfg->tls_cert_pem && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return hkn_fail(rep, HK_ERR_UNSUPPORTED, "this libmicrohttpd has no TLS support");

    hkn_endpoint *ep = calloc(1, sizeof *ep);
    if (!ep)
        return hkn_fail(rep, HK_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&ep->lock, NULL);
    pthread_mutex_init(&ep->release_lock, NULL);
    ep->eng = *e;
    ep->trust = cfg->trust;
    ep->max_body = cfg->max_body ? cfg->max_body : 64u << 20;
    ep->mods = calloc(MAX_MODULES, sizeof *ep->mods);
    if (!ep->mods || (cfg->token && !(ep->token = strdup(cfg->token))) ||
        (cfg->tls_cert_pem && !(ep->cert_pem = strdup(cfg->tls_cert_pem))) ||
        (cfg->tls_key_pem && !(ep->key_pem = strdup(cfg->tls_key_pem)))) {
        err = hkn_fail(rep, HK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((err = hkn_state_open(cfg->state_dir, &ep->state, rep)))
        goto fail;

    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    const char *addr = cfg->address ? cfg->address : "127.0.0.1";
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD;
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, addr, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons(cfg->port);
    } else if (inet_pton(AF_INET6, addr, &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(cfg->port);
        flags |= MHD_USE_IPv6;
    } else {
        err = hkn_fail(rep, HK_ERR_INVALID, "address '%s' is not a numeric IPv4 or IPv6 address",
                       addr);
        goto fail;
    }
    if (ep->cert_pem)
        flags |= MHD_USE_TLS;
    unsigned maxc = cfg->max_connections ? cfg->max_connections : 128;
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_SOCK_ADDR, 0, &ss},
        {MHD_OPTION_CONNECTION_LIMIT, maxc, NULL},
        {MHD_OPTION_CONNECTION_TIMEOUT, cfg->timeout_s ? cfg->timeout_s : 30, NULL},
        {MHD_OPTION_LISTEN_BACKLOG_SIZE, maxc < 64 ? 64 : maxc, NULL},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, NULL},
        {ep->cert_pem ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, ep->cert_pem},
        {ep->key_pem ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, 0, ep->key_pem},
        {MHD_OPTION_END, 0, NULL},
    };
    ep->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, ep, MHD_OPTION_ARRAY, opts,
                                  MHD_OPTION_END);
    if (!ep->daemon) {
        err = hkn_fail(rep, HK_ERR_NETWORK,
                       "could not listen on %s port %u (in use, no permission, or a bad TLS "
                       "certificate/key)",
                       addr, (unsigned)cfg->port);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(ep->daemon, MHD_DAEMON_INFO_BIND_PORT);
    ep->port = di ? di->port : cfg->port;
    *out = ep;
    return 0;
fail:
    hkn_endpoint_stop(ep);
    return err;
}

uint16_t hkn_endpoint_port(const hkn_endpoint *ep) {
    return ep ? ep->port : 0;
}

void hkn_endpoint_stop(hkn_endpoint *ep) {
    if (!ep)
        return;
    if (ep->daemon)
        MHD_stop_daemon(ep->daemon);
    for (size_t i = 0; ep->mods && i < ep->nmods; i++)
        free(ep->mods[i].last_log);
    free(ep->last.last_log);
    free(ep->mods);
    hkn_state_close(ep->state);
    free(ep->token);
    free(ep->cert_pem);
    if (ep->key_pem)
        sodium_memzero(ep->key_pem, strlen(ep->key_pem));
    free(ep->key_pem);
    pthread_mutex_destroy(&ep->lock);
    pthread_mutex_destroy(&ep->release_lock);
    free(ep);
}

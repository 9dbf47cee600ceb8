/*
 * The push endpoint: an HTTP server (libmicrohttpd) that accepts signed
 * releases, answers status, rollback, metrics and health requests.
 *
 * Threads. libmicrohttpd runs an epoll event loop on a small pool of threads
 * of its own (hk_endpoint_options.threads): a connection costs a socket and a little memory,
 * never a thread, so a thousand slow clients cannot starve the others. The
 * loop threads never wait on the engine: a request that changes something
 * (a release, a rollback) is received in full, then its connection is
 * suspended and the request handed to one worker thread, which verifies,
 * applies and records it and resumes the connection with the answer. One
 * worker also means releases and rollbacks through this endpoint apply one
 * at a time, in arrival order. Status, metrics and health are answered by the
 * loop threads at once; metrics are the runtime's whole text (eng.metrics),
 * into which hkn_endpoint_metrics adds this endpoint's counters.
 *
 * Bodies. A release comes as JSON (artifacts in base64) or as a frame of
 * lengths and raw bytes (HKN_FRAME_TYPE, net/frame.c). A JSON body is
 * gathered whole and parsed on the worker, which holds the body and
 * cJSON's copy of its strings together: twice its size. A frame is parsed
 * on the loop thread as it streams: its lengths are checked against the cap
 * and the Content-Length, and its bytes copied into the one buffer they
 * size, from which the worker verifies and applies them in place: the
 * release is held once. Either way the worker runs the same checks over the
 * same signed bytes.
 *
 * Refusals are remembered. A release the engine refuses has its anti-
 * rollback record taken back (a fixed kernel may reuse the version), so the
 * same signed bytes would verify again: the worker remembers the refusals
 * (net/refused.c) and answers a replay with the first refusal's error and
 * status, before any artifact is decoded, instead of building it again on
 * the one worker every other push waits for.
 *
 * Logs (eng.log, subsystem "endpoint"): each request refused before its body
 * is read or after it, with the status and the reason; each release or
 * rollback received, and its outcome. Never under this file's locks.
 *
 * Abuse. Each connection is tracked from accept to close (notify_connection):
 *   - a whole-request deadline (request_timeout_s) covers headers and body;
 *     the idle timeout alone would be reset by a client trickling a byte at
 *     a time. A reaper thread shuts down connections past it;
 *   - per-address and total limits: a request that completes its headers
 *     over either is answered 503; far over them libmicrohttpd refuses the
 *     connection outright;
 *   - the memory held by request bodies in flight is bounded (max_inflight):
 *     a body reserves as its bytes arrive (its buffer doubling, never past
 *     its declared or checked size), and one that does not fit is dropped
 *     and answered 503. A declared length reserves nothing: two clients that
 *     declare the cap and trickle would otherwise hold every push shut;
 *   - a body over the cap is answered 413: before it is read when it has a
 *     Content-Length; when chunked, it is dropped as it passes the cap (a
 *     frame: as soon as its lengths say it will) and the 413 sent when it
 *     ends (libmicrohttpd takes no answer mid-upload), the request deadline
 *     bounding how long that can take. A frame whose lengths are wrong
 *     otherwise is dropped the same way and answered 400.
 *
 * Rollbacks. A signed rollback request names this endpoint's id (so that a
 * request captured on its way to one host of a fleet rolls back no other)
 * and the release to be running afterwards. That release is checked by the
 * engine against the image it would commit, in the same step as the
 * rollback (hkn_rollback_fn with check), not against what was pushed here:
 * a puller, the watcher or the program may have committed since. Status
 * reports the engine's releases for the same reason.
 *
 * Authority. Every route but /healthz needs the bearer token when one is
 * configured, a Host that names the bound address (or a configured name) and
 * no foreign Origin (scheme, host and port all the endpoint's own), and a
 * POST with a body needs Content-Type: application/json (or, for a
 * release, the frame's type), which a web page cannot send across origins
 * without a preflight this endpoint never answers: a web page cannot reach
 * a loopback endpoint, by a cross-origin request, a "simple" form or text
 * POST, or DNS rebinding. A release needs its signature; a rollback needs
 * the token or a signed rollback request, and with neither a token nor a
 * trusted key configured, rollback over HTTP is off.
 *
 * Configuration. The endpoint takes the public hk_endpoint_options, whose
 * defaults live here (hk_endpoint_options_init_size), and what net/api.c
 * resolved from them (hkn_endpoint_resolved: loaded keys, PEM texts, the
 * state directory).
 *
 * Locks (private to this file), never nested:
 *   lock       the module table, the nonces and the counters;
 *   conn_lock  the list of open connections (and the in-flight bytes);
 *   job_lock   the worker's queue.
 * The anti-rollback state has its own (net/state.c); the worker holds its
 * transaction from the version check to the record.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <sodium.h>

#include "net/net.h"

#define MAX_MODULES   256
#define MAX_LOG_KEPT  (64 * 1024)
#define ROLLBACK_BODY 4096
#define NERRORS       32
#define MAX_NONCES    1024

enum route { R_NONE, R_RELEASE, R_STATUS, R_ROLLBACK, R_METRICS, R_HEALTH };

struct ep_module {
    char name[64];
    uint64_t release_version; /* highest release committed through this endpoint */
    int last_error;
    char last_outcome[16]; /* "committed", "refused", "rolled_back" */
    char last_message[512];
    char last_canary[160]; /* hk_report.canary of the last outcome */
    char *last_log;        /* owned */
    int64_t updated;
};

struct nonce {
    char text[33];
    int64_t expires;
};

/* One TCP connection, from accept to close. */
struct conn {
    struct conn *prev, *next; /* conn_lock */
    int fd;                   /* immutable */
    char ip[INET6_ADDRSTRLEN];
    int64_t start_ms; /* conn_lock: when the current request began */
    int receiving;    /* conn_lock: 1 until the current request is fully received */
};

/* One request, owned by its connection; the worker has it while `queued`
 * and not `done`. */
struct req {
    enum route route;
    struct conn *conn;
    char module[64]; /* rollback target */
    char *body;      /* a JSON body */
    size_t len, cap, limit;
    hkn_frame *frame; /* a binary body (HKN_FRAME_TYPE), parsed as it streams in */
    size_t reserved;  /* bytes counted in ep->inflight */
    size_t declared;  /* its Content-Length, 0: none */
    int refused;      /* an HTTP status: over the cap or the memory bound, or (400) a
                       * frame that cannot be one; the rest is read and dropped */
    int settled;      /* a final call has returned once without an answer */
    int queued;       /* handed to the worker (connection suspended) */
    int done;         /* the worker answered: status and answer are set */
    unsigned status;
    char *answer; /* JSON text, owned until queued as the response */
    struct req *next_job;
    struct MHD_Connection *c;
};

struct hkn_endpoint {
    /* Immutable from start to stop. */
    struct MHD_Daemon *daemon;
    hkn_engine eng;
    hkn_trust trust;
    char *token;
    size_t max_body, max_inflight;
    unsigned max_conns, per_ip;
    int64_t deadline_ms;
    /* Set once, right after the daemon started (a port of 0 is chosen when
     * it binds), while its threads may already serve: atomic. id is written
     * before id_set, and read only once id_set is (endpoint_id()). */
    _Atomic uint16_t port;
    char id[HKN_ENDPOINT_ID_MAX]; /* named by signed rollback requests */
    _Atomic int id_set;
    char addr[INET6_ADDRSTRLEN]; /* as bound, for Host */
    int wildcard, loopback;      /* the bound address is any / a loopback one */
    char **hosts;                /* configured names */
    int nhosts;
    hkn_state *state;
    char *cert_pem, *key_pem; /* libmicrohttpd reads them for the daemon's life */
    hkn_refused *refused;     /* worker only: the releases the engine refused */

    pthread_mutex_t lock;
    struct ep_module *mods;          /* lock */
    size_t nmods;                    /* lock */
    struct ep_module last;           /* lock: the latest release or rollback outcome */
    struct nonce nonces[MAX_NONCES]; /* lock: rollback nonces seen, until they expire */
    uint64_t requests;               /* lock */
    uint64_t unauthorized;           /* lock */
    uint64_t too_large;              /* lock */
    uint64_t overloaded;             /* lock: 503 for limits */
    uint64_t foreign;                /* lock: refused Host, Origin or body type */
    uint64_t deadline_cut;           /* lock */
    uint64_t committed;              /* lock */
    uint64_t rolled_back;            /* lock */
    uint64_t refused_again;          /* lock: releases answered from `refused` */
    uint64_t refusals[NERRORS];      /* lock: by -error */

    pthread_mutex_t conn_lock;
    struct conn *conns; /* conn_lock */
    unsigned nconns;    /* conn_lock */
    size_t inflight;    /* conn_lock: body bytes reserved */

    pthread_mutex_t job_lock;
    pthread_cond_t job_cv;         /* job_lock: a job arrived, or stop */
    struct req *jobs, **jobs_tail; /* job_lock */
    int stopping;                  /* job_lock (and read by the reaper under it) */
    pthread_t worker, reaper;
    int threads_started;
};

/* Marks a request already answered from the first callback. */
static struct req answered;

/* The endpoint's id; "" in the moment between the daemon's start and the
 * id's (no request can name it then). */
static const char *endpoint_id(hkn_endpoint *ep) {
    return atomic_load(&ep->id_set) ? ep->id : "";
}

static void count(hkn_endpoint *ep, uint64_t *field) {
    pthread_mutex_lock(&ep->lock);
    (*field)++;
    pthread_mutex_unlock(&ep->lock);
}

/* The one place of the endpoint's defaults: hkn_endpoint_start falls back on
 * them for a zero number or a NULL address. One a line: the shape of every
 * hk_*_options_init_size. */
int hk_endpoint_options_init_size(hk_endpoint_options *o, size_t size) {
    hk_endpoint_options d;
    memset(&d, 0, sizeof d);
    d.address = "127.0.0.1";
    d.max_body_bytes = 64u << 20;
    d.max_connections = 1024;
    d.timeout_s = 30;
    d.per_ip_connections = 128;
    d.request_timeout_s = 60;
    d.threads = 2;
    return hkl_sized_init(o, size, &d, sizeof d, HKN_ENDPOINT_OPTIONS_SIZE0);
}

/* o with every zero number and a NULL address replaced by its default
 * (pull.c's with_defaults has the same shape over its own fields). */
static hk_endpoint_options with_defaults(const hk_endpoint_options *o) {
    static const hkn_field zero_is_default[] = {
        HKN_FIELD(hk_endpoint_options, address),
        HKN_FIELD(hk_endpoint_options, max_body_bytes),
        HKN_FIELD(hk_endpoint_options, max_connections),
        HKN_FIELD(hk_endpoint_options, timeout_s),
        HKN_FIELD(hk_endpoint_options, per_ip_connections),
        HKN_FIELD(hk_endpoint_options, request_timeout_s),
        HKN_FIELD(hk_endpoint_options, threads),
    };
    hk_endpoint_options d, r = *o;
    hk_endpoint_options_init(&d);
    hkn_zero_defaults(&r, &d, zero_is_default, sizeof zero_is_default / sizeof *zero_is_default);
    if (!r.max_inflight_bytes)
        r.max_inflight_bytes = 2 * r.max_body_bytes;
    return r;
}

/* ---- responses --------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *text,
                             const char *type) {
    /* text is malloc'd and handed to libmicrohttpd, which frees it. */
    if (!text)
        return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer_with_free_callback(strlen(text), text, free);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == MHD_HTTP_SERVICE_UNAVAILABLE || status == MHD_HTTP_CONTENT_TOO_LARGE) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
        if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
            MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    }
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Prints obj (consumed) as JSON text ending in a newline; NULL on no memory. */
static char *json_text(cJSON *obj) {
    char *text = obj ? cJSON_Print(obj) : NULL;
    cJSON_Delete(obj);
    if (!text)
        return NULL;
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (t2) {
        text = t2;
        memcpy(text + n, "\n", 2);
    }
    return text;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, cJSON *obj) {
    return reply(c, status, json_text(obj), "application/json");
}

static cJSON *error_json(int err, const char *msg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", "error");
    cJSON_AddStringToObject(o, "error", hk_err_name(err));
    cJSON_AddNumberToObject(o, "code", err);
    cJSON_AddStringToObject(o, "message", msg);
    return o;
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, int err,
                                   const char *msg) {
    return reply_json(c, status, error_json(err, msg));
}

/* The client's address, for log lines. */
static const char *peer(const struct conn *k) {
    return k && k->ip[0] ? k->ip : "an untracked connection";
}

/* Answers a request refused before its body is read, and says why in the
 * log: at warn for what a client is refused for (token, Host or Origin,
 * size, limits), at info for plain mistakes (route, method, name). */
static enum MHD_Result refuse(hkn_endpoint *ep, struct MHD_Connection *c, const struct conn *k,
                              const char *method, const char *url, unsigned status, int err,
                              const char *why) {
    int warn = status == MHD_HTTP_UNAUTHORIZED || status == MHD_HTTP_FORBIDDEN ||
               status == MHD_HTTP_UNSUPPORTED_MEDIA_TYPE || status == MHD_HTTP_CONTENT_TOO_LARGE ||
               status == MHD_HTTP_SERVICE_UNAVAILABLE;
    hkn_log(&ep->eng, warn ? HK_LOG_WARN : HK_LOG_INFO, "endpoint", "refused %s %s from %s: %u %s",
            method, url, peer(k), status, why);
    return reply_error(c, status, err, why);
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
    case HK_ERR_SUPERSEDED:
    case HK_ERR_QUARANTINED:
        return MHD_HTTP_CONFLICT;
    case HK_ERR_TOO_LARGE:
        return MHD_HTTP_CONTENT_TOO_LARGE;
    case HK_ERR_HASH:
    case HK_ERR_COMPILE:
    case HK_ERR_ARCH:
    case HK_ERR_ATTRIBUTE:
    case HK_ERR_MISSING_KERNEL:
    case HK_ERR_LAYOUT:
    case HK_ERR_GLOBAL_SIZE:
    case HK_ERR_REJECTED:
    case HK_ERR_CANARY:
        return MHD_HTTP_UNPROCESSABLE_CONTENT;
    case HK_ERR_BUSY:
    case HK_ERR_CLOSED:
    case HK_ERR_UNSUPPORTED:
    case HK_ERR_CANARY_UNAVAILABLE:
        return MHD_HTTP_SERVICE_UNAVAILABLE;
    case HK_ERR_TIMEOUT:
        return MHD_HTTP_GATEWAY_TIMEOUT;
    default:
        return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
}

/* ---- the module table -------------------------------------------------- */

static struct ep_module *find_locked(hkn_endpoint *ep, const char *name) {
    for (size_t i = 0; i < ep->nmods; i++)
        if (!strcmp(ep->mods[i].name, name))
            return &ep->mods[i];
    return NULL;
}

/* Only a module whose release verified (or committed) gets an entry:
 * unauthenticated requests never add to the table. */
static struct ep_module *module_locked(hkn_endpoint *ep, const char *name) {
    struct ep_module *m = find_locked(ep, name);
    if (m || ep->nmods == MAX_MODULES)
        return m;
    m = &ep->mods[ep->nmods++];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    return m;
}

static void set_outcome(struct ep_module *m, const char *outcome, const hk_report *rep, int err) {
    snprintf(m->last_outcome, sizeof m->last_outcome, "%s", outcome);
    m->last_error = err;
    snprintf(m->last_message, sizeof m->last_message, "%s", rep->message);
    snprintf(m->last_canary, sizeof m->last_canary, "%s", rep->canary);
    free(m->last_log);
    m->last_log = rep->log ? strndup(rep->log, MAX_LOG_KEPT) : NULL;
    m->updated = (int64_t)time(NULL);
}

/* Records an outcome. `create`: the module may get a new entry (its release
 * verified); otherwise only an existing entry is updated. */
static void record(hkn_endpoint *ep, const char *module, const char *outcome, int err,
                   uint64_t version, int create, const hk_report *rep) {
    pthread_mutex_lock(&ep->lock);
    if (err && -err < NERRORS)
        ep->refusals[-err]++;
    else if (!err && !strcmp(outcome, "committed"))
        ep->committed++;
    else if (!err)
        ep->rolled_back++;
    snprintf(ep->last.name, sizeof ep->last.name, "%s", module);
    set_outcome(&ep->last, outcome, rep, err);
    struct ep_module *m = NULL;
    if (module[0])
        m = create ? module_locked(ep, module) : find_locked(ep, module);
    if (m) {
        set_outcome(m, outcome, rep, err);
        if (!err && !strcmp(outcome, "committed") && version > m->release_version)
            m->release_version = version;
    }
    pthread_mutex_unlock(&ep->lock);
}

static cJSON *outcome_json(const char *outcome, int err, const hk_report *rep) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", outcome);
    cJSON_AddStringToObject(o, "module", rep->module);
    hkn_json_add_int(o, "version", (long long)rep->version);
    cJSON_AddStringToObject(o, "error", hk_err_name(err));
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
    if (rep->canary[0])
        cJSON_AddStringToObject(o, "canary", rep->canary);
    if (rep->canary_refusal[0])
        cJSON_AddStringToObject(o, "canary_refusal", rep->canary_refusal);
    if (rep->canary_new_ms > 0) {
        cJSON_AddNumberToObject(o, "canary_new_ms", rep->canary_new_ms);
        cJSON_AddNumberToObject(o, "canary_old_ms", rep->canary_old_ms);
    }
    return o;
}

/* Says what became of a release or rollback request (on the worker). */
static void log_outcome(hkn_endpoint *ep, const struct req *r, const char *what,
                        const hk_report *rep, int err, uint64_t engine_version) {
    const char *mod = rep->module[0] ? rep->module : "(unverified)";
    if (!err)
        hkn_log(&ep->eng, HK_LOG_INFO, "endpoint", "%s of %s v%llu from %s done: engine v%llu",
                what, mod, (unsigned long long)rep->version, peer(r->conn),
                (unsigned long long)engine_version);
    else
        hkn_log(&ep->eng, HK_LOG_WARN, "endpoint", "refused %s of %s from %s: %u %s: %s", what, mod,
                peer(r->conn), r->status, hk_err_name(err), rep->message);
}

/* ---- POST /v1/release (on the worker) ---------------------------------- */

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

/* A release as a request carries it, either way: the manifest's text and
 * the signature's point into the parsed JSON or the frame. */
struct incoming {
    const char *manifest, *sig; /* sig NULL: none */
    size_t manifest_len, sig_len;
    cJSON *root, *arts; /* a JSON body: owned root, and its "artifacts" */
    const hkn_frame *frame;
    unsigned char *owned[HKN_MAX_ARTIFACTS]; /* decoded JSON artifacts */
};

/* The JSON body is freed as soon as it is parsed (cJSON holds the strings). */
static int json_incoming(struct req *r, struct incoming *in, hk_report *rep) {
    in->root = hkn_json_parse_strict(r->body ? r->body : "", r->len);
    free(r->body);
    r->body = NULL;
    const cJSON *man = cJSON_GetObjectItemCaseSensitive(in->root, "manifest");
    const cJSON *sig = cJSON_GetObjectItemCaseSensitive(in->root, "signature");
    in->arts = cJSON_GetObjectItemCaseSensitive(in->root, "artifacts");
    if (!cJSON_IsObject(in->root) || !cJSON_IsString(man) || !cJSON_IsObject(in->arts) ||
        (sig && !cJSON_IsString(sig) && !cJSON_IsNull(sig)))
        return hku_fail(rep, HK_ERR_INVALID,
                        "body must be one JSON object {\"manifest\": string, \"signature\": "
                        "string, \"artifacts\": {sha256: base64}}");
    in->manifest = man->valuestring;
    in->manifest_len = strlen(man->valuestring);
    in->sig = cJSON_IsString(sig) ? sig->valuestring : NULL;
    in->sig_len = in->sig ? strlen(in->sig) : 0;
    return 0;
}

static void frame_incoming(const struct req *r, struct incoming *in) {
    in->frame = r->frame;
    in->manifest = r->frame->manifest;
    in->manifest_len = r->frame->manifest_len;
    in->sig = r->frame->sig_len ? r->frame->sig : NULL;
    in->sig_len = r->frame->sig_len;
}

/* Each artifact of the verified manifest m, checked against its size and
 * hash into bytes[i] and sizes[i]: a frame's in place, in the manifest's
 * order; a JSON body's decoded from base64 by hash, its text freed once
 * decoded, so that about one decoded release is held beyond the body. */
static int incoming_artifacts(struct incoming *in, const hkn_manifest *m, const void **bytes,
                              size_t *sizes, hk_report *rep) {
    if (in->frame && in->frame->nart != m->nartifacts)
        return hku_fail(rep, HK_ERR_HASH,
                        "the release frame carries %zu artifact(s), the manifest names %zu (in "
                        "its order)",
                        in->frame->nart, m->nartifacts);
    for (size_t i = 0; i < m->nartifacts; i++) {
        const hkn_artifact *a = &m->artifacts[i];
        if (in->frame) {
            bytes[i] = in->frame->art[i];
            sizes[i] = in->frame->art_len[i];
        } else {
            cJSON *b = cJSON_GetObjectItemCaseSensitive(in->arts, a->sha256);
            if (!cJSON_IsString(b))
                return hku_fail(rep, HK_ERR_HASH,
                                "artifact '%s' (sha256 %s) is missing from the body", a->name,
                                a->sha256);
            if (decode_artifact(b->valuestring, &in->owned[i], &sizes[i]) != 0)
                return hku_fail(rep, HK_ERR_INVALID, "artifact '%s' is not valid base64", a->name);
            bytes[i] = in->owned[i];
            cJSON_DeleteItemFromObjectCaseSensitive(in->arts, a->sha256);
        }
        int err = hkn_verify_artifact(a, bytes[i], sizes[i], rep);
        if (err)
            return err;
    }
    return 0;
}

/* Verifies and applies one release, sent as JSON or as a frame: the same
 * checks in the same order, over the same signed bytes. *verified is set
 * once the manifest's signature (and form) checked out. */
static int do_release(hkn_endpoint *ep, struct req *r, hk_report *rep, uint64_t *version,
                      int *verified, int *again) {
    int err = 0;
    hkn_manifest m = {0};
    const void *bytes[HKN_MAX_ARTIFACTS] = {0};
    size_t sizes[HKN_MAX_ARTIFACTS] = {0};
    struct incoming in = {0};
    if (r->frame)
        frame_incoming(r, &in);
    else if ((err = json_incoming(r, &in, rep)))
        goto out;
    hkn_state_begin(ep->state);
    /* The signature is checked before any artifact is decoded. */
    err = hkn_verify_manifest(&ep->trust, ep->state, in.manifest, in.manifest_len, in.sig,
                              in.sig_len, (int64_t)time(NULL), &m, rep);
    *verified = rep->module[0] != '\0';
    /* Signed bytes the engine refused already are answered as then, with no
     * artifact decoded and no build or canary run (net/refused.c). */
    char mhash[65];
    if (!err &&
        (err = hkn_refused_check(ep->refused, &m, in.manifest, in.manifest_len, mhash, rep))) {
        *again = 1;
        *version = m.version;
    }
    if (!err && !(err = incoming_artifacts(&in, &m, bytes, sizes, rep))) {
        cJSON_Delete(in.root);
        in.root = NULL;
        *version = m.version;
        err = hkn_release_commit(&ep->eng, ep->state, ep->refused, &m, bytes, sizes, mhash, "push",
                                 0, NULL, rep);
    }
    hkn_state_end(ep->state);
out:
    for (size_t i = 0; i < HKN_MAX_ARTIFACTS; i++)
        free(in.owned[i]);
    hkn_manifest_free(&m);
    cJSON_Delete(in.root);
    return err;
}

static void run_release(hkn_endpoint *ep, struct req *r) {
    hk_report rep = HK_REPORT_INIT;
    uint64_t version = 0;
    int verified = 0, again = 0;
    int err = do_release(ep, r, &rep, &version, &verified, &again);
    const char *outcome = err ? "refused" : "committed";
    record(ep, rep.module, outcome, err, version, verified, &rep);
    if (again)
        count(ep, &ep->refused_again);
    cJSON *o = outcome_json(outcome, err, &rep);
    if (err)
        cJSON_AddBoolToObject(o, "refused_before", again);
    uint64_t ev = !err && ep->eng.version ? ep->eng.version(ep->eng.ud, rep.module) : 0;
    if (!err && ep->eng.version)
        hkn_json_add_int(o, "engine_version", (long long)ev);
    if (verified) /* as "version": the release, as a rollback's answer names it */
        hkn_json_add_int(o, "release_version", (long long)version);
    else
        cJSON_AddNullToObject(o, "release_version");
    r->status = http_status(err);
    log_outcome(ep, r, "release", &rep, err, ev);
    hk_report_clear(&rep);
    r->answer = json_text(o);
}

/* ---- POST /v1/rollback/MODULE (on the worker) -------------------------- */

/* Checks a signed rollback request against the URL, this endpoint's id and
 * the nonces seen; *target is the release it asks for, which the engine
 * checks against its own history when it rolls back (a puller or another
 * source may have committed since this endpoint's last push). Called with
 * no lock held. */
static int check_signed_rollback(hkn_endpoint *ep, struct req *r, uint64_t *target,
                                 hk_report *rep) {
    hkn_rollback_req rq;
    cJSON *root = hkn_json_parse_strict(r->body ? r->body : "", r->len);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "request");
    const cJSON *sig = cJSON_GetObjectItemCaseSensitive(root, "signature");
    int err;
    if (!cJSON_IsObject(root) || !cJSON_IsString(text) || !cJSON_IsString(sig)) {
        err = hku_fail(rep, HK_ERR_SIGNATURE,
                       "rollback needs the bearer token or a signed request "
                       "{\"request\": string, \"signature\": base64} (hotkern rollback --key)");
        goto out;
    }
    int64_t now = (int64_t)time(NULL);
    if ((err = hkn_rollback_verify(&ep->trust, text->valuestring, strlen(text->valuestring),
                                   sig->valuestring, strlen(sig->valuestring), now, &rq, rep)))
        goto out;
    if (strcmp(rq.module, r->module)) {
        err = hku_fail(rep, HK_ERR_SIGNATURE, "the signed request is for module '%s', not '%s'",
                       rq.module, r->module);
        goto out;
    }
    if (strcmp(rq.endpoint, endpoint_id(ep))) {
        err = hku_fail(rep, HK_ERR_SIGNATURE,
                       "the signed request is for endpoint '%s', not this one ('%s')", rq.endpoint,
                       endpoint_id(ep));
        goto out;
    }
    pthread_mutex_lock(&ep->lock);
    int free_slot = -1, seen = 0;
    for (int i = 0; i < MAX_NONCES; i++) {
        if (ep->nonces[i].expires <= now)
            free_slot = free_slot < 0 ? i : free_slot;
        else if (!strcmp(ep->nonces[i].text, rq.nonce))
            seen = 1;
    }
    if (seen)
        err = hku_fail(rep, HK_ERR_REPLAY, "this signed rollback request was already used");
    else if (free_slot < 0)
        err = hku_fail(rep, HK_ERR_BUSY, "too many rollback requests in flight; retry later");
    if (!err) {
        /* Spent once verified, whatever the outcome: it cannot be tried twice. */
        snprintf(ep->nonces[free_slot].text, sizeof ep->nonces[free_slot].text, "%s", rq.nonce);
        ep->nonces[free_slot].expires = rq.expires;
        *target = rq.target;
    }
    pthread_mutex_unlock(&ep->lock);
out:
    cJSON_Delete(root);
    return err;
}

static void run_rollback(hkn_endpoint *ep, struct req *r) {
    hk_report rep = HK_REPORT_INIT;
    int err = 0, check = !ep->token;
    uint64_t target = 0;
    /* The token, when configured, was checked with the headers; without it
     * the request must carry its own signature, whose target the engine
     * checks against the image it would commit. */
    if (check)
        err = check_signed_rollback(ep, r, &target, &rep);
    if (!err && !ep->eng.rollback)
        err = hku_fail(&rep, HK_ERR_UNSUPPORTED, "this endpoint has no rollback");
    if (!err) {
        hkn_state_begin(ep->state);
        err = ep->eng.rollback(ep->eng.ud, r->module, check, target, &rep);
        hkn_state_end(ep->state);
    }
    rep.error = err;
    if (!rep.message[0] && err)
        snprintf(rep.message, sizeof rep.message, "rollback of %s: %s", r->module,
                 hk_err_name(err));
    snprintf(rep.module, sizeof rep.module, "%s", r->module);
    const char *outcome = err ? "refused" : "rolled_back";
    record(ep, r->module, outcome, err, 0, 0, &rep);
    cJSON *o = outcome_json(outcome, err, &rep);
    uint64_t ev = ep->eng.version ? ep->eng.version(ep->eng.ud, r->module) : 0;
    if (ep->eng.version)
        hkn_json_add_int(o, "engine_version", (long long)ev);
    /* "version" is the engine's number of the image committed again; the
     * release that runs now is the engine's to say (0 or null: unknown). */
    uint64_t rel = 0;
    if (!err && ep->eng.release && ep->eng.release(ep->eng.ud, r->module, 0, &rel) == 0)
        hkn_json_add_int(o, "release_version", (long long)rel);
    else
        cJSON_AddNullToObject(o, "release_version");
    r->status = http_status(err);
    log_outcome(ep, r, "rollback", &rep, err, ev);
    hk_report_clear(&rep);
    r->answer = json_text(o);
}

/* ---- the worker -------------------------------------------------------- */

static void *worker_main(void *arg) {
    /* Named for top -H, gdb and profilers (at most 15 characters). */
    pthread_setname_np(pthread_self(), "hk-push");
    hkn_endpoint *ep = arg;
    for (;;) {
        pthread_mutex_lock(&ep->job_lock);
        while (!ep->jobs && !ep->stopping)
            pthread_cond_wait(&ep->job_cv, &ep->job_lock);
        struct req *r = ep->jobs;
        int stopping = ep->stopping;
        if (r) {
            ep->jobs = r->next_job;
            if (!ep->jobs)
                ep->jobs_tail = &ep->jobs;
        }
        pthread_mutex_unlock(&ep->job_lock);
        if (!r)
            break;
        if (stopping) {
            r->status = MHD_HTTP_SERVICE_UNAVAILABLE;
            r->answer = json_text(error_json(HK_ERR_CLOSED, "the endpoint is stopping"));
        } else if (r->route == R_RELEASE) {
            run_release(ep, r);
        } else {
            run_rollback(ep, r);
        }
        if (!r->answer) {
            r->status = MHD_HTTP_INTERNAL_SERVER_ERROR;
            r->answer = strdup("{\"outcome\": \"error\", \"error\": \"HK_ERR_NOMEM\"}\n");
        }
        r->done = 1;
        /* After this call the request belongs to libmicrohttpd again. */
        MHD_resume_connection(r->c);
    }
    return NULL;
}

/* ---- GET /v1/status and /metrics --------------------------------------- */

static cJSON *module_json(const struct ep_module *m) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "module", m->name);
    hkn_json_add_int(o, "release_version", (long long)m->release_version);
    cJSON_AddStringToObject(o, "last_outcome", m->last_outcome);
    cJSON_AddStringToObject(o, "last_error", hk_err_name(m->last_error));
    cJSON_AddStringToObject(o, "last_message", m->last_message);
    cJSON_AddStringToObject(o, "last_canary", m->last_canary);
    if (m->last_log)
        cJSON_AddStringToObject(o, "last_log", m->last_log);
    else
        cJSON_AddNullToObject(o, "last_log");
    hkn_json_add_int(o, "updated", (long long)m->updated);
    return o;
}

/* The engine's quarantined images (ran when the context was lost; refused
 * until a different image comes), as "quarantine": [...]. */
static void add_quarantine(hkn_endpoint *ep, cJSON *o) {
    cJSON *arr = cJSON_AddArrayToObject(o, "quarantine");
    for (int i = 0; ep->eng.quarantine && i < 4096; i++) {
        hk_quarantine q = HK_QUARANTINE_INIT;
        if (ep->eng.quarantine(ep->eng.ud, i, &q) != 0)
            break;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "module", q.module);
        cJSON_AddStringToObject(e, "image", q.image);
        hkn_json_add_int(e, "release_version", (long long)q.release_version);
        hkn_json_add_int(e, "version", (long long)q.version);
        cJSON_AddItemToArray(arr, e);
    }
}

static enum MHD_Result handle_status(hkn_endpoint *ep, struct MHD_Connection *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON *mods = cJSON_AddArrayToObject(o, "modules");
    char(*names)[64] = calloc(MAX_MODULES, 64);
    size_t n;
    if (!names) {
        cJSON_Delete(o);
        return MHD_NO;
    }
    pthread_mutex_lock(&ep->lock);
    n = ep->nmods;
    for (size_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(mods, module_json(&ep->mods[i]));
        memcpy(names[i], ep->mods[i].name, 64);
    }
    if (ep->last.last_outcome[0])
        cJSON_AddItemToObject(o, "last", module_json(&ep->last));
    hkn_json_add_int(o, "requests", (long long)ep->requests);
    pthread_mutex_unlock(&ep->lock);
    cJSON_AddStringToObject(o, "endpoint_id", endpoint_id(ep));
    cJSON_AddNumberToObject(o, "connections", hkn_endpoint_connections(ep));
    /* Where the anti-rollback record lives; the record is written before a
     * release is committed, so it never lags behind the engine. */
    const char *sp = hkn_state_path(ep->state);
    if (sp)
        cJSON_AddStringToObject(o, "state_file", sp);
    else
        cJSON_AddNullToObject(o, "state_file");
    cJSON_AddStringToObject(o, "state_persisted", "before commit");
    /* Outside the lock: the engine takes its own. What runs and what a
     * rollback would commit are the engine's, whichever source committed
     * them (a puller, the watcher, the program), so that a signed rollback's
     * target is named as the engine will check it. */
    for (size_t i = 0; i < n; i++) {
        cJSON *mj = cJSON_GetArrayItem(mods, (int)i);
        if (ep->eng.version)
            hkn_json_add_int(mj, "engine_version",
                             (long long)ep->eng.version(ep->eng.ud, names[i]));
        static const char *const rel_fields[] = {"running_release_version",
                                                 "previous_release_version"};
        for (int back = 0; back < 2; back++) {
            uint64_t rel = 0;
            if (ep->eng.release && ep->eng.release(ep->eng.ud, names[i], back, &rel) == 0)
                hkn_json_add_int(mj, rel_fields[back], (long long)rel);
            else
                cJSON_AddNullToObject(mj, rel_fields[back]);
        }
    }
    free(names);
    add_quarantine(ep, o);
    return reply_json(c, MHD_HTTP_OK, o);
}

/* GET /metrics answers the runtime's whole text (hk_metrics_text), of which
 * the endpoint's counters are one part, added by hkn_endpoint_metrics. */
static enum MHD_Result handle_metrics(hkn_endpoint *ep, struct MHD_Connection *c) {
    size_t len = 0;
    if (!ep->eng.metrics)
        return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, HK_ERR_UNSUPPORTED,
                           "this endpoint has no metrics");
    char *text = ep->eng.metrics(ep->eng.ud, &len);
    if (!text)
        return reply_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, HK_ERR_NOMEM,
                           "the metrics could not be rendered");
    return reply(c, MHD_HTTP_OK, text, "text/plain; version=0.0.4; charset=utf-8");
}

void hkn_endpoint_metrics(hkn_endpoint *ep, hk_metrics_writer *w) {
    hkn_metric(w, "hotkern_push_connections", "gauge", "Connections open to the endpoint.",
               hkn_endpoint_connections(ep));
    pthread_mutex_lock(&ep->lock);
    hkn_metric(w, "hotkern_push_requests_total", "counter",
               "HTTP requests received by the endpoint.", ep->requests);
    hkn_metric(w, "hotkern_push_unauthorized_total", "counter",
               "Requests refused for a missing or wrong token.", ep->unauthorized);
    hkn_metric(w, "hotkern_push_too_large_total", "counter",
               "Requests refused for a body over the cap.", ep->too_large);
    hkn_metric(w, "hotkern_push_overloaded_total", "counter",
               "Requests answered 503 for a connection or memory limit.", ep->overloaded);
    hkn_metric(w, "hotkern_push_foreign_total", "counter",
               "Requests refused for a foreign Host or Origin, or a body not sent as JSON.",
               ep->foreign);
    hkn_metric(w, "hotkern_push_deadline_total", "counter",
               "Connections closed for a request past its deadline.", ep->deadline_cut);
    hkn_metric(w, "hotkern_push_refused_again_total", "counter",
               "Releases the engine had refused, seen again and answered without a build.",
               ep->refused_again);
    hk_metrics_family(w, "hotkern_push_releases_total", "counter", "Pushed releases by outcome.");
    hk_metrics_sample(w, "hotkern_push_releases_total", "outcome", "committed", ep->committed);
    hk_metrics_sample(w, "hotkern_push_releases_total", "outcome", "rolled_back", ep->rolled_back);
    hk_metrics_family(w, "hotkern_push_refusals_total", "counter",
                      "Refused releases and rollbacks by error.");
    for (int i = 1; i < NERRORS; i++)
        if (ep->refusals[i])
            hk_metrics_sample(w, "hotkern_push_refusals_total", "error", hk_err_name(-i),
                              ep->refusals[i]);
    hk_metrics_family(w, "hotkern_module_release_version", "gauge",
                      "Highest release committed per module.");
    for (size_t i = 0; i < ep->nmods; i++)
        hk_metrics_sample(w, "hotkern_module_release_version", "module", ep->mods[i].name,
                          ep->mods[i].release_version);
    pthread_mutex_unlock(&ep->lock);
}

/* ---- connections: limits and the deadline ------------------------------ */

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    hkn_endpoint *ep = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct conn *k = calloc(1, sizeof *k);
        if (!k)
            return; /* untracked: no deadline, counted nowhere, still served */
        const union MHD_ConnectionInfo *fi =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        k->fd = fi ? fi->connect_fd : -1;
        if (ai && ai->client_addr) {
            const struct sockaddr *sa = ai->client_addr;
            if (sa->sa_family == AF_INET)
                inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, k->ip,
                          sizeof k->ip);
            else if (sa->sa_family == AF_INET6)
                inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, k->ip,
                          sizeof k->ip);
        }
        k->start_ms = ((int64_t)hku_now_ms());
        k->receiving = 1;
        pthread_mutex_lock(&ep->conn_lock);
        k->next = ep->conns;
        if (ep->conns)
            ep->conns->prev = k;
        ep->conns = k;
        ep->nconns++;
        pthread_mutex_unlock(&ep->conn_lock);
        *socket_context = k;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        /* libmicrohttpd closes the socket after this returns: the reaper,
         * which shuts sockets down under conn_lock, can no longer see it. */
        struct conn *k = *socket_context;
        pthread_mutex_lock(&ep->conn_lock);
        if (k->prev)
            k->prev->next = k->next;
        else
            ep->conns = k->next;
        if (k->next)
            k->next->prev = k->prev;
        ep->nconns--;
        pthread_mutex_unlock(&ep->conn_lock);
        free(k);
        *socket_context = NULL;
    }
}

unsigned hkn_endpoint_connections(hkn_endpoint *ep) {
    pthread_mutex_lock(&ep->conn_lock);
    unsigned n = ep->nconns;
    pthread_mutex_unlock(&ep->conn_lock);
    return n;
}

/* Shuts down the sockets of requests past their deadline. shutdown() (not
 * close()) leaves the descriptor to libmicrohttpd, which then sees the
 * connection end and cleans it up on its own thread. */
static void *reaper_main(void *arg) {
    /* Named for top -H, gdb and profilers (at most 15 characters). */
    pthread_setname_np(pthread_self(), "hk-push-reap");
    hkn_endpoint *ep = arg;
    for (;;) {
        pthread_mutex_lock(&ep->job_lock);
        if (!ep->stopping) {
            struct timespec ts;
            hku_deadline(&ts, 250 * 1000);
            pthread_cond_timedwait(&ep->job_cv, &ep->job_lock, &ts);
        }
        int stop = ep->stopping;
        pthread_mutex_unlock(&ep->job_lock);
        if (stop)
            break;
        int64_t now = ((int64_t)hku_now_ms());
        unsigned cut = 0;
        pthread_mutex_lock(&ep->conn_lock);
        for (struct conn *k = ep->conns; k; k = k->next)
            if (k->receiving && k->fd >= 0 && now - k->start_ms > ep->deadline_ms) {
                shutdown(k->fd, SHUT_RDWR);
                k->receiving = 0;
                cut++;
            }
        pthread_mutex_unlock(&ep->conn_lock);
        if (cut) {
            pthread_mutex_lock(&ep->lock);
            ep->deadline_cut += cut;
            pthread_mutex_unlock(&ep->lock);
            hkn_log(&ep->eng, HK_LOG_WARN, "endpoint",
                    "closed %u connection(s) whose request took over the deadline of %lld s", cut,
                    (long long)(ep->deadline_ms / 1000));
        }
    }
    return NULL;
}

static struct conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

/* 0, or a message for the 503 of a connection over a limit. */
static const char *over_limit(hkn_endpoint *ep, struct conn *k) {
    const char *why = NULL;
    pthread_mutex_lock(&ep->conn_lock);
    if (ep->nconns > ep->max_conns) {
        why = "too many connections open; retry later";
    } else if (k && k->ip[0]) {
        unsigned same = 0;
        for (struct conn *o = ep->conns; o; o = o->next)
            same += !strcmp(o->ip, k->ip);
        if (same > ep->per_ip)
            why = "too many connections open from this address; retry later";
    }
    pthread_mutex_unlock(&ep->conn_lock);
    return why;
}

/* Reserves n more body bytes; 0 when they do not fit. */
static int reserve(hkn_endpoint *ep, struct req *r, size_t n) {
    int ok = 0;
    pthread_mutex_lock(&ep->conn_lock);
    if (n <= ep->max_inflight - ep->inflight) {
        ep->inflight += n;
        r->reserved += n;
        ok = 1;
    }
    pthread_mutex_unlock(&ep->conn_lock);
    return ok;
}

static void unreserve(hkn_endpoint *ep, struct req *r) {
    pthread_mutex_lock(&ep->conn_lock);
    ep->inflight -= r->reserved;
    r->reserved = 0;
    pthread_mutex_unlock(&ep->conn_lock);
}

/* ---- Host, Origin and the token ---------------------------------------- */

/* 1 when `host` (a Host header or an Origin's authority, port included or
 * not) names this endpoint. */
static int host_ok(const hkn_endpoint *ep, const char *host, size_t n) {
    char name[256];
    const char *end = host + n;
    if (n == 0 || n >= sizeof name)
        return 0;
    if (host[0] == '[') {
        const char *rb = memchr(host, ']', n);
        if (!rb || (rb + 1 != end && rb[1] != ':'))
            return 0;
        memcpy(name, host + 1, (size_t)(rb - host - 1));
        name[rb - host - 1] = '\0';
    } else {
        const char *colon = memchr(host, ':', n);
        size_t len = colon ? (size_t)(colon - host) : n;
        memcpy(name, host, len);
        name[len] = '\0';
    }
    unsigned char bin[sizeof(struct in6_addr)];
    int literal = inet_pton(AF_INET, name, bin) == 1 || inet_pton(AF_INET6, name, bin) == 1;
    if (literal) {
        /* An address can only be reached by a browser that was pointed at
         * it, never by a rebound name. Bound to one address, only it. */
        if (ep->wildcard)
            return 1;
        unsigned char a[sizeof(struct in6_addr)], b[sizeof(struct in6_addr)];
        int fam = strchr(name, ':') ? AF_INET6 : AF_INET;
        return inet_pton(fam, name, a) == 1 && inet_pton(fam, ep->addr, b) == 1 &&
               !memcmp(a, b, fam == AF_INET ? 4 : 16);
    }
    if (ep->loopback && !strcasecmp(name, "localhost"))
        return 1;
    for (int i = 0; i < ep->nhosts; i++)
        if (!strcasecmp(name, ep->hosts[i]))
            return 1;
    return 0;
}

/* 1 when an Origin header names this endpoint's own origin: its scheme
 * (https exactly when it serves TLS), a name host_ok accepts and its port
 * (the scheme's default when the Origin names none). Another port of the
 * same host is another origin: a page served there (a notebook, a dev
 * server) must not drive the endpoint. */
static int origin_ok(const hkn_endpoint *ep, const char *origin) {
    const char *scheme = ep->cert_pem ? "https://" : "http://";
    size_t sl = strlen(scheme);
    if (strncasecmp(origin, scheme, sl))
        return 0;
    const char *auth = origin + sl;
    size_t n = strcspn(auth, "/");
    if (auth[n] != '\0' || n == 0)
        return 0;
    /* The port follows the last ':' after the name (an IPv6 literal is in
     * brackets, so its colons come before the ']'). */
    const char *rb = auth[0] == '[' ? memchr(auth, ']', n) : NULL;
    const char *from = rb ? rb : auth;
    const char *colon = memrchr(from, ':', n - (size_t)(from - auth));
    unsigned long port = ep->cert_pem ? 443 : 80;
    size_t hlen = n;
    if (colon) {
        char *end;
        hlen = (size_t)(colon - auth);
        if (colon[1] < '0' || colon[1] > '9')
            return 0;
        errno = 0;
        port = strtoul(colon + 1, &end, 10);
        if (errno || end != auth + n || port > 65535)
            return 0;
    }
    return port == atomic_load(&ep->port) && host_ok(ep, auth, hlen);
}

/* NULL when Host and Origin are acceptable, else why not. */
/* Every Host and Origin header of a request, not only the first of each:
 * a second one is checked as the first (a proxy or a framework behind it
 * may read the other). */
struct authority_scan {
    const hkn_endpoint *ep;
    int hosts, bad_host, bad_origin;
};

static enum MHD_Result scan_authority(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value) {
    struct authority_scan *a = cls;
    (void)kind;
    if (!strcasecmp(key, MHD_HTTP_HEADER_HOST)) {
        a->hosts++;
        a->bad_host |= !value || !host_ok(a->ep, value, strlen(value));
    } else if (!strcasecmp(key, "Origin")) {
        a->bad_origin |= !value || !origin_ok(a->ep, value);
    }
    return MHD_YES;
}

static const char *foreign(const hkn_endpoint *ep, struct MHD_Connection *c) {
    struct authority_scan a = {.ep = ep};
    MHD_get_connection_values(c, MHD_HEADER_KIND, scan_authority, &a);
    if (a.hosts > 1)
        return "more than one Host header";
    if (a.bad_host)
        return "the Host header does not name this endpoint (configure the name with "
               "allowed_hosts)";
    /* A browser names the page's origin: only this endpoint's own. */
    if (a.bad_origin)
        return "cross-origin requests are refused (an Origin must be this endpoint's scheme, "
               "host and port)";
    return NULL;
}

enum body_kind { B_NONE, B_JSON, B_FRAME, B_OTHER };

/* What a POST's body is declared as. A web page can send text/plain, form
 * and multipart bodies, or none declared at all, to any origin without
 * asking first (a "simple" request, no CORS preflight), so such a body must
 * not be able to push a release: with allow_unsigned and no token nothing
 * else would stop it. application/json and the release frame's type are
 * neither, so a page cannot send them across origins without a preflight,
 * which this endpoint never answers. */
static enum body_kind body_kind(struct MHD_Connection *c) {
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *te =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (!te && (!cl || !strcmp(cl, "0")))
        return B_NONE;
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    size_t n = ct ? strcspn(ct, "; \t") : 0;
    if (ct && n == 16 && !strncasecmp(ct, "application/json", 16))
        return B_JSON;
    if (ct && n == strlen(HKN_FRAME_TYPE) && !strncasecmp(ct, HKN_FRAME_TYPE, n))
        return B_FRAME;
    return B_OTHER;
}

/* NULL when a POST to route may carry a body of kind k, else why not. */
static const char *body_refused(enum route route, enum body_kind k) {
    if (k == B_NONE || k == B_JSON || (k == B_FRAME && route == R_RELEASE))
        return NULL;
    if (k == B_FRAME)
        return "only POST /v1/release takes a body of Content-Type: " HKN_FRAME_TYPE
               "; this route's body is application/json";
    return "a request body must be sent as Content-Type: application/json (or, for a release, "
           "" HKN_FRAME_TYPE "): a web page can send text/plain, form or multipart bodies, or "
           "none declared, across origins";
}

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

/* ---- dispatch ---------------------------------------------------------- */

static enum route route_of(const char *url, const char **module) {
    *module = NULL;
    if (!strcmp(url, "/healthz"))
        return R_HEALTH;
    if (!strcmp(url, "/v1/release"))
        return R_RELEASE;
    if (!strcmp(url, "/v1/status"))
        return R_STATUS;
    if (!strcmp(url, "/metrics"))
        return R_METRICS;
    if (!strncmp(url, "/v1/rollback/", 13)) {
        *module = url + 13;
        return R_ROLLBACK;
    }
    return R_NONE;
}

/* Takes the body of a release or rollback: its declared length is checked
 * against the cap before it is read, and a release frame's parser is set
 * up. Answers the refusals itself. */
static enum MHD_Result take_body(hkn_endpoint *ep, struct MHD_Connection *c, struct conn *k,
                                 const char *method, const char *url, enum route route,
                                 const char *module, enum body_kind kind, void **con_cls) {
    size_t limit = route == R_RELEASE ? ep->max_body : ROLLBACK_BODY;
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    unsigned long long n = 0;
    if (cl) {
        char *end;
        errno = 0;
        n = strtoull(cl, &end, 10);
        if (end == cl || *end || errno || n > limit) {
            /* Answered now, with only the headers read: libmicrohttpd then
             * closes the connection instead of reading the body. */
            count(ep, &ep->too_large);
            char msg[160];
            snprintf(msg, sizeof msg, "body of %.40s bytes is over the cap of %zu bytes", cl,
                     limit);
            return refuse(ep, c, k, method, url, MHD_HTTP_CONTENT_TOO_LARGE, HK_ERR_TOO_LARGE, msg);
        }
    }
    struct req *r = calloc(1, sizeof *r);
    if (!r || (kind == B_FRAME && !(r->frame = malloc(sizeof *r->frame)))) {
        free(r);
        return MHD_NO;
    }
    r->route = route;
    r->limit = limit;
    r->conn = k;
    r->c = c;
    if (module)
        snprintf(r->module, sizeof r->module, "%s", module);
    if (r->frame)
        hkn_frame_init(r->frame, limit, cl ? (uint64_t)n : HKN_FRAME_UNKNOWN);
    /* Nothing is reserved for a declared length: bodies reserve as their
     * bytes arrive (on_body), so a client that declares 64 MiB and trickles
     * holds what it sent, not the budget everyone else needs. */
    r->declared = cl ? (size_t)n : 0;
    *con_cls = r;
    return MHD_YES;
}

static enum MHD_Result first_call(hkn_endpoint *ep, struct MHD_Connection *c, const char *url,
                                  const char *method, void **con_cls) {
    int get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    int post = !strcmp(method, MHD_HTTP_METHOD_POST);
    const char *module = NULL;
    struct conn *k = conn_of(c);
    count(ep, &ep->requests);
    *con_cls = &answered;

    const char *why = over_limit(ep, k);
    if (why) {
        count(ep, &ep->overloaded);
        return refuse(ep, c, k, method, url, MHD_HTTP_SERVICE_UNAVAILABLE, HK_ERR_BUSY, why);
    }
    enum route route = route_of(url, &module);
    if (route == R_NONE)
        return refuse(ep, c, k, method, url, MHD_HTTP_NOT_FOUND, HK_ERR_NOT_FOUND, "no such route");

    /* Health answers everyone so that load balancers need no secret. */
    if (route == R_HEALTH)
        return get ? reply(c, MHD_HTTP_OK, strdup("ok\n"), "text/plain")
                   : reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, HK_ERR_INVALID, "use GET");
    if ((why = foreign(ep, c))) {
        count(ep, &ep->foreign);
        return refuse(ep, c, k, method, url, MHD_HTTP_FORBIDDEN, HK_ERR_REJECTED, why);
    }
    if (!authorized(ep, c)) {
        count(ep, &ep->unauthorized);
        return refuse(ep, c, k, method, url, MHD_HTTP_UNAUTHORIZED, HK_ERR_REJECTED,
                      "missing or wrong bearer token");
    }
    enum body_kind kind = post ? body_kind(c) : B_NONE;
    if ((why = body_refused(route, kind))) {
        count(ep, &ep->foreign);
        return refuse(ep, c, k, method, url, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, HK_ERR_REJECTED, why);
    }
    int want_post = route == R_RELEASE || route == R_ROLLBACK;
    if ((want_post && !post) || (!want_post && !get))
        return refuse(ep, c, k, method, url, MHD_HTTP_METHOD_NOT_ALLOWED, HK_ERR_INVALID,
                      want_post ? "use POST" : "use GET");
    if (!want_post)
        hkn_log(&ep->eng, HK_LOG_DEBUG, "endpoint", "%s %s from %s", method, url, peer(k));
    if (route == R_STATUS)
        return handle_status(ep, c);
    if (route == R_METRICS)
        return handle_metrics(ep, c);
    if (route == R_ROLLBACK) {
        /* Names are checked like module names before anything records them. */
        if (!hkn_valid_name(module, 64))
            return refuse(ep, c, k, method, url, MHD_HTTP_BAD_REQUEST, HK_ERR_INVALID,
                          "module name is not [A-Za-z0-9_.-]{1,63}");
        if (!ep->token && ep->trust.nkeys == 0)
            return refuse(ep, c, k, method, url, MHD_HTTP_FORBIDDEN, HK_ERR_UNSUPPORTED,
                          "rollback over HTTP is off: it needs a bearer token or a trusted "
                          "key for signed rollback requests");
    }
    return take_body(ep, c, k, method, url, route, module, kind, con_cls);
}

/* A body that runs over the cap or the memory bound while it streams is
 * dropped, and the rest of it read and discarded: libmicrohttpd takes no
 * answer in the middle of an upload. The answer (413 or 503) goes out once
 * the body ends; the request deadline bounds how long that may take. */
/* A frame's buffer is reserved before each time it grows (net/frame.c). */
struct admit_ctx {
    hkn_endpoint *ep;
    struct req *r;
};

static int admit_frame(void *ud, size_t bytes) {
    struct admit_ctx *a = ud;
    if (bytes > a->r->reserved && !reserve(a->ep, a->r, bytes - a->r->reserved))
        return HK_ERR_BUSY;
    return 0;
}

/* A release frame is parsed as it streams: its bytes go straight into the
 * one buffer its lengths size, so the body is held once. A frame that
 * cannot be one (a length over the cap or unlike the Content-Length, bytes
 * past its end) is dropped at once and the rest read and discarded. */
static enum MHD_Result on_frame(hkn_endpoint *ep, struct req *r, const char *data, size_t n) {
    struct admit_ctx a = {ep, r};
    r->len += n;
    int err = hkn_frame_feed(r->frame, data, n, admit_frame, &a);
    if (!err)
        return MHD_YES;
    if (err == HK_ERR_NOMEM)
        return MHD_NO;
    if (err == HK_ERR_TOO_LARGE)
        count(ep, &ep->too_large);
    else if (err == HK_ERR_BUSY)
        count(ep, &ep->overloaded);
    r->refused = err == HK_ERR_TOO_LARGE ? MHD_HTTP_CONTENT_TOO_LARGE
                 : err == HK_ERR_BUSY    ? MHD_HTTP_SERVICE_UNAVAILABLE
                                         : MHD_HTTP_BAD_REQUEST;
    unreserve(ep, r);
    return MHD_YES;
}

static enum MHD_Result on_body(hkn_endpoint *ep, struct req *r, const char *data, size_t n) {
    if (r->refused)
        return MHD_YES;
    if (r->frame)
        return on_frame(ep, r, data, n);
    if (n > r->limit - r->len) {
        count(ep, &ep->too_large);
        r->refused = MHD_HTTP_CONTENT_TOO_LARGE;
    } else if (r->len + n + 1 > r->cap) {
        size_t nc = r->cap ? r->cap : 64 * 1024;
        while (nc < r->len + n + 1)
            nc *= 2;
        if (nc > r->limit + 1)
            nc = r->limit + 1;
        if (r->declared && nc > r->declared + 1 && r->len + n <= r->declared)
            nc = r->declared + 1;
        /* Bodies reserve as they grow. */
        if (nc > r->reserved && !reserve(ep, r, nc - r->reserved)) {
            count(ep, &ep->overloaded);
            r->refused = MHD_HTTP_SERVICE_UNAVAILABLE;
        } else {
            char *nb = realloc(r->body, nc);
            if (!nb)
                return MHD_NO;
            r->body = nb;
            r->cap = nc;
        }
    }
    if (r->refused) {
        free(r->body);
        r->body = NULL;
        r->len = r->cap = 0;
        unreserve(ep, r);
        return MHD_YES;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
    r->body[r->len] = '\0';
    return MHD_YES;
}

/* Answers a body dropped while it streamed, once it has ended. */
static enum MHD_Result refuse_body(hkn_endpoint *ep, struct MHD_Connection *c, struct req *r,
                                   const char *method, const char *url) {
    char msg[96];
    const char *frame_why = r->frame ? r->frame->why : "";
    if (r->refused == MHD_HTTP_CONTENT_TOO_LARGE) {
        snprintf(msg, sizeof msg, "body is over the cap of %zu bytes", r->limit);
        return refuse(ep, c, r->conn, method, url, MHD_HTTP_CONTENT_TOO_LARGE, HK_ERR_TOO_LARGE,
                      frame_why[0] ? frame_why : msg);
    }
    if (r->refused == MHD_HTTP_BAD_REQUEST)
        return refuse(ep, c, r->conn, method, url, MHD_HTTP_BAD_REQUEST, HK_ERR_INVALID, frame_why);
    return refuse(ep, c, r->conn, method, url, MHD_HTTP_SERVICE_UNAVAILABLE, HK_ERR_BUSY,
                  "too many request bodies in flight; retry later");
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
        return on_body(ep, r, upload_data, n);
    }
    /* The body ended: a frame must have ended with it. */
    if (r->frame && !r->refused && !r->done && !r->queued && hkn_frame_end(r->frame)) {
        unreserve(ep, r);
        r->refused = MHD_HTTP_BAD_REQUEST;
    }
    if (r->refused)
        return refuse_body(ep, c, r, method, url);
    if (r->done) {
        char *answer = r->answer;
        r->answer = NULL;
        return reply(c, r->status, answer, "application/json");
    }
    if (r->queued)
        return MHD_YES;
    /* libmicrohttpd (0.9.75 to 0.9.77) leaves a connection's poll state as
     * it was when it is suspended: suspended in its first final call, it
     * is still "reading" when resumed, reads the end of a client that
     * half-closed after sending, and closes it unanswered. Returning once
     * without an answer lets it note that it waits on us (it calls again
     * at once); suspended then, the resumed connection only writes. */
    if (!r->settled) {
        r->settled = 1;
        return MHD_YES;
    }
    /* Fully received: the deadline no longer applies, the worker takes it. */
    if (r->conn) {
        pthread_mutex_lock(&ep->conn_lock);
        r->conn->receiving = 0;
        pthread_mutex_unlock(&ep->conn_lock);
    }
    pthread_mutex_lock(&ep->job_lock);
    int stopping = ep->stopping;
    if (!stopping) {
        r->queued = 1;
        MHD_suspend_connection(c);
        r->next_job = NULL;
        *ep->jobs_tail = r;
        ep->jobs_tail = &r->next_job;
        pthread_cond_broadcast(&ep->job_cv);
    }
    pthread_mutex_unlock(&ep->job_lock);
    if (stopping)
        return refuse(ep, c, r->conn, method, url, MHD_HTTP_SERVICE_UNAVAILABLE, HK_ERR_CLOSED,
                      "the endpoint is stopping");
    hkn_log(&ep->eng, HK_LOG_INFO, "endpoint", "%s %s from %s: %zu bytes received, queued", method,
            url, peer(r->conn), r->len);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    hkn_endpoint *ep = cls;
    struct req *r = *con_cls;
    if (r && r != &answered) {
        unreserve(ep, r);
        free(r->body);
        hkn_frame_free(r->frame);
        free(r->frame);
        free(r->answer);
        free(r);
    }
    *con_cls = NULL;
    /* A kept-alive connection's next request gets a deadline of its own. */
    struct conn *k = conn_of(c);
    if (k) {
        pthread_mutex_lock(&ep->conn_lock);
        k->start_ms = ((int64_t)hku_now_ms());
        k->receiving = 1;
        pthread_mutex_unlock(&ep->conn_lock);
    }
}

/* Without a configured id: HOSTNAME:PORT, which differs between the hosts
 * of a fleet and between endpoints of one host, and stays the same across
 * restarts on a fixed port. Bytes of the host name outside the id's
 * alphabet are left out. */
static void default_id(hkn_endpoint *ep) {
    char host[256] = "", clean[HKN_ENDPOINT_ID_MAX - 8];
    size_t n = 0;
    if (atomic_load(&ep->id_set))
        return;
    if (gethostname(host, sizeof host - 1) != 0)
        host[0] = '\0';
    for (const char *p = host; *p && n + 1 < sizeof clean; p++) {
        char one[2] = {*p, '\0'};
        if (hkn_valid_endpoint_id(one))
            clean[n++] = *p;
    }
    clean[n] = '\0';
    snprintf(ep->id, sizeof ep->id, "%s:%u", n ? clean : "localhost",
             (unsigned)atomic_load(&ep->port));
    atomic_store(&ep->id_set, 1);
}

/* ---- lifecycle --------------------------------------------------------- */

/* The options the endpoint can be started with, or why not. */
static int check_options(const hk_endpoint_options *o, const hkn_endpoint_resolved *r,
                         hk_report *rep) {
    if (o->port > 65535)
        return hku_fail(rep, HK_ERR_INVALID, "port %u out of range", o->port);
    if (hkn_crypto_init())
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "libsodium failed to initialise");
    if ((r->tls_cert_pem != NULL) != (r->tls_key_pem != NULL))
        return hku_fail(rep, HK_ERR_INVALID, "TLS needs both a certificate and a key");
    if (r->tls_cert_pem && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "this libmicrohttpd has no TLS support");
    if (MHD_is_feature_supported(MHD_FEATURE_EPOLL) != MHD_YES)
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "this libmicrohttpd has no epoll support");
    if (o->nallowed_hosts < 0 || (o->nallowed_hosts > 0 && !o->allowed_hosts))
        return hku_fail(rep, HK_ERR_INVALID, "hosts: %d names but no array", o->nallowed_hosts);
    if (o->endpoint_id && !hkn_valid_endpoint_id(o->endpoint_id))
        return hku_fail(rep, HK_ERR_INVALID, "endpoint_id '%.128s' is not [A-Za-z0-9_.:@-]{1,%d}",
                        o->endpoint_id, HKN_ENDPOINT_ID_MAX - 1);
    return 0;
}

/* The endpoint's own state, before any thread runs: limits, copies of
 * what the caller owns, the anti-rollback state and the refusals. *out is
 * set whatever the outcome (hkn_endpoint_stop frees a partial one). */
static int endpoint_new(const hk_endpoint_options *cfg, const hkn_endpoint_resolved *r,
                        const hkn_engine *e, hkn_endpoint **out, hk_report *rep) {
    hkn_endpoint *ep = *out = calloc(1, sizeof *ep);
    if (!ep)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&ep->lock, NULL);
    pthread_mutex_init(&ep->conn_lock, NULL);
    pthread_mutex_init(&ep->job_lock, NULL);
    hku_cond_init(&ep->job_cv); /* its timed waits: the monotonic clock */
    ep->jobs_tail = &ep->jobs;
    ep->eng = *e;
    ep->trust = r->trust;
    ep->max_body = cfg->max_body_bytes;
    ep->max_inflight = cfg->max_inflight_bytes;
    ep->max_conns = cfg->max_connections;
    ep->per_ip = cfg->per_ip_connections;
    ep->deadline_ms = 1000 * (int64_t)cfg->request_timeout_s;
    ep->mods = calloc(MAX_MODULES, sizeof *ep->mods);
    ep->hosts = hku_strv_dup(cfg->allowed_hosts, cfg->nallowed_hosts);
    ep->nhosts = ep->hosts ? cfg->nallowed_hosts : 0;
    int oom = !ep->mods || (cfg->nallowed_hosts && !ep->hosts);
    if (oom || (cfg->token && !(ep->token = strdup(cfg->token))) ||
        (r->tls_cert_pem && !(ep->cert_pem = strdup(r->tls_cert_pem))) ||
        (r->tls_key_pem && !(ep->key_pem = strdup(r->tls_key_pem))))
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    if (cfg->endpoint_id) {
        snprintf(ep->id, sizeof ep->id, "%s", cfg->endpoint_id);
        atomic_store(&ep->id_set, 1);
    }
    int err = hkn_state_open(r->state_dir, &ep->state, rep);
    if (!err && hkn_refused_create(&ep->refused))
        err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    return err;
}

/* The socket address to listen on; ep learns whether it is a wildcard or
 * a loopback address, and *flags whether it is IPv6. */
static int bind_address(hkn_endpoint *ep, const hk_endpoint_options *cfg,
                        struct sockaddr_storage *ss, unsigned *flags, hk_report *rep) {
    const char *addr = cfg->address;
    struct sockaddr_in *sin = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
    memset(ss, 0, sizeof *ss);
    if (inet_pton(AF_INET, addr, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)cfg->port);
        ep->wildcard = sin->sin_addr.s_addr == htonl(INADDR_ANY);
        ep->loopback = (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
    } else if (inet_pton(AF_INET6, addr, &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)cfg->port);
        *flags |= MHD_USE_IPv6;
        ep->wildcard = IN6_IS_ADDR_UNSPECIFIED(&sin6->sin6_addr);
        ep->loopback = IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr);
    } else {
        return hku_fail(rep, HK_ERR_INVALID, "address '%s' is not a numeric IPv4 or IPv6 address",
                        addr);
    }
    snprintf(ep->addr, sizeof ep->addr, "%s", addr);
    return 0;
}

/* The worker and the reaper; both or neither run afterwards. */
static int start_threads(hkn_endpoint *ep, hk_report *rep) {
    if (pthread_create(&ep->worker, NULL, worker_main, ep) != 0)
        return hku_fail(rep, HK_ERR_NOMEM, "could not start the endpoint's worker thread");
    if (pthread_create(&ep->reaper, NULL, reaper_main, ep) != 0) {
        pthread_mutex_lock(&ep->job_lock);
        ep->stopping = 1;
        pthread_cond_broadcast(&ep->job_cv);
        pthread_mutex_unlock(&ep->job_lock);
        pthread_join(ep->worker, NULL);
        return hku_fail(rep, HK_ERR_NOMEM, "could not start the endpoint's reaper thread");
    }
    ep->threads_started = 1;
    return 0;
}

/* libmicrohttpd's daemon on ss, with its event-loop threads. */
static int start_daemon(hkn_endpoint *ep, const hk_endpoint_options *cfg,
                        struct sockaddr_storage *ss, unsigned flags, hk_report *rep) {
    /* The 503 limits are ours; libmicrohttpd's own, set above them, refuse
     * connections outright only when a client is far past them. */
    unsigned hard = ep->max_conns + ep->max_conns / 4 + 16;
    unsigned hard_ip = ep->per_ip * 2 + 4;
    unsigned threads = cfg->threads;
    if (ep->cert_pem)
        flags |= MHD_USE_TLS;
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_SOCK_ADDR, 0, ss},
        {MHD_OPTION_THREAD_POOL_SIZE, threads, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, hard, NULL},
        {MHD_OPTION_PER_IP_CONNECTION_LIMIT, hard_ip, NULL},
        {MHD_OPTION_CONNECTION_TIMEOUT, cfg->timeout_s, NULL},
        {MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024, NULL},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, ep},
        {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)on_connection, ep},
        {ep->cert_pem ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, ep->cert_pem},
        {ep->key_pem ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, 0, ep->key_pem},
        {MHD_OPTION_END, 0, NULL},
    };
    ep->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, ep, MHD_OPTION_ARRAY, opts,
                                  MHD_OPTION_END);
    if (!ep->daemon)
        return hku_fail(rep, HK_ERR_NETWORK,
                        "could not listen on %s port %u (in use, no permission, or a bad TLS "
                        "certificate/key)",
                        ep->addr, (unsigned)cfg->port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(ep->daemon, MHD_DAEMON_INFO_BIND_PORT);
    atomic_store(&ep->port, di ? di->port : (uint16_t)cfg->port);
    return 0;
}

int hkn_endpoint_start(const hk_endpoint_options *opt, const hkn_endpoint_resolved *r,
                       const hkn_engine *e, hkn_endpoint **out, hk_report *rep) {
    *out = NULL;
    if (!opt || !r || !e || !e->apply)
        return hku_fail(rep, HK_ERR_INVALID,
                        "endpoint needs options, their resolved state and an apply "
                        "function");
    hk_endpoint_options o = with_defaults(opt);
    hkn_endpoint *ep = NULL;
    struct sockaddr_storage ss;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME;
    int err = check_options(&o, r, rep);
    if (err)
        return err;
    if ((err = endpoint_new(&o, r, e, &ep, rep)) ||
        (err = bind_address(ep, &o, &ss, &flags, rep)) || (err = start_threads(ep, rep)) ||
        (err = start_daemon(ep, &o, &ss, flags, rep))) {
        hkn_endpoint_stop(ep);
        return err;
    }
    default_id(ep);
    hkn_log(&ep->eng, HK_LOG_INFO, "endpoint",
            "listening on %s port %u as '%s' (%s, %s, %d trusted key(s)%s)", ep->addr,
            (unsigned)atomic_load(&ep->port), ep->id, ep->cert_pem ? "https" : "http",
            ep->token ? "bearer token required" : "no token", ep->trust.nkeys,
            ep->trust.allow_unsigned ? ", unsigned releases allowed" : "");
    *out = ep;
    return 0;
}

uint16_t hkn_endpoint_port(const hkn_endpoint *ep) {
    return ep ? atomic_load(&ep->port) : 0;
}

const char *hkn_endpoint_id(hkn_endpoint *ep) {
    return ep ? endpoint_id(ep) : NULL;
}

const char *hkn_endpoint_address(const hkn_endpoint *ep) {
    return ep ? ep->addr : NULL;
}

void hkn_endpoint_stop(hkn_endpoint *ep) {
    if (!ep)
        return;
    /* Stop accepting; the listening socket is then ours to close, but only
     * after MHD_stop_daemon: until then MHD's threads may still use it
     * (libmicrohttpd's MHD_quiesce_daemon; closing it earlier raced with the
     * worker's epoll_ctl). */
    MHD_socket ls = ep->daemon ? MHD_quiesce_daemon(ep->daemon) : MHD_INVALID_SOCKET;
    if (ep->threads_started) {
        /* The worker finishes the request in hand (a swap in progress
         * completes), answers the queued ones 503 and resumes each, so no
         * connection is left suspended when the daemon stops. */
        pthread_mutex_lock(&ep->job_lock);
        ep->stopping = 1;
        pthread_cond_broadcast(&ep->job_cv);
        pthread_mutex_unlock(&ep->job_lock);
        pthread_join(ep->worker, NULL);
        pthread_join(ep->reaper, NULL);
    }
    if (ep->daemon)
        MHD_stop_daemon(ep->daemon);
    if (ls != MHD_INVALID_SOCKET)
        close(ls);
    for (size_t i = 0; ep->mods && i < ep->nmods; i++)
        free(ep->mods[i].last_log);
    free(ep->last.last_log);
    free(ep->mods);
    hku_strv_free(ep->hosts, ep->nhosts);
    hkn_state_close(ep->state);
    hkn_refused_destroy(ep->refused);
    free(ep->token);
    free(ep->cert_pem);
    if (ep->key_pem)
        sodium_memzero(ep->key_pem, strlen(ep->key_pem));
    free(ep->key_pem);
    pthread_mutex_destroy(&ep->lock);
    pthread_mutex_destroy(&ep->conn_lock);
    pthread_mutex_destroy(&ep->job_lock);
    pthread_cond_destroy(&ep->job_cv);
    free(ep);
}

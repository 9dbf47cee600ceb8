/*
 * The push endpoint: an HTTP server (libmicrohttpd) that accepts signed
 * releases, answers status, rollback, metrics and health requests. This file
 * dispatches each request and starts and stops the server; its doors
 * (connection limits, Host, Origin, the token) are endpoint_admit.c, its
 * answers (the worker, status, metrics) endpoint_handlers.c (net/endpoint.h).
 *
 * Threads. libmicrohttpd runs an epoll event loop on a small pool of threads
 * of its own (hk_endpoint_options.threads): a connection costs a socket and a
 * little memory, never a thread, so a thousand slow clients cannot starve the
 * others. The loop threads never wait on the engine: a request that changes
 * something (a release, a rollback) is received in full, then its connection
 * is suspended and the request handed to one worker thread, which verifies,
 * applies and records it and resumes the connection with the answer. One
 * worker also means releases and rollbacks through this endpoint apply one
 * at a time, in arrival order. Status, metrics and health are answered by the
 * loop threads at once.
 *
 * Bodies over the cap are answered 413: before they are read when they have a
 * Content-Length; when chunked, dropped as they pass the cap (a frame: as
 * soon as its lengths say it will) and the 413 sent when they end
 * (libmicrohttpd takes no answer mid-upload), the request deadline bounding
 * how long that can take. A frame whose lengths are wrong otherwise is
 * dropped the same way and answered 400.
 *
 * Logs (eng.log, subsystem "endpoint"): each request refused before its body
 * is read or after it, with the status and the reason; each release or
 * rollback received, and its outcome. Never under the endpoint's locks.
 *
 * Configuration. The endpoint takes the public hk_endpoint_options, whose
 * defaults live here (hk_endpoint_options_init_size), and what net/api.c
 * resolved from them (hkn_endpoint_resolved: loaded keys, PEM texts, the
 * state directory). Locks: net/endpoint.h.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>
#include <sodium.h>

#include "net/endpoint.h"

#define ROLLBACK_BODY 4096
#define KEYS_BODY     (64 << 10) /* a key list of 8 keys and 16 signatures, escaped */

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
    return hkb_sized_init(o, size, &d, sizeof d, HKN_ENDPOINT_OPTIONS_SIZE0);
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

/* Marks a request already answered from the first callback. */
static struct req answered;

static void count(hkn_endpoint *ep, uint64_t *field) {
    pthread_mutex_lock(&ep->lock);
    (*field)++;
    pthread_mutex_unlock(&ep->lock);
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
            method, url, hkn_ep_peer(k), status, why);
    return hkn_ep_reply_error(c, status, err, why);
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
    if (!strcmp(url, "/v1/keys"))
        return R_KEYS;
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
    size_t limit = route == R_RELEASE ? ep->max_body : route == R_KEYS ? KEYS_BODY : ROLLBACK_BODY;
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
    struct conn *k = hkn_ep_conn_of(c);
    count(ep, &ep->requests);
    *con_cls = &answered;

    const char *why = hkn_ep_over_limit(ep, k);
    if (why) {
        count(ep, &ep->overloaded);
        return refuse(ep, c, k, method, url, MHD_HTTP_SERVICE_UNAVAILABLE, HK_ERR_BUSY, why);
    }
    enum route route = route_of(url, &module);
    if (route == R_NONE)
        return refuse(ep, c, k, method, url, MHD_HTTP_NOT_FOUND, HK_ERR_NOT_FOUND, "no such route");

    /* Health answers everyone so that load balancers need no secret. */
    if (route == R_HEALTH)
        return get ? hkn_ep_reply(c, MHD_HTTP_OK, strdup("ok\n"), "text/plain")
                   : hkn_ep_reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, HK_ERR_INVALID, "use GET");
    if ((why = hkn_ep_foreign(ep, c))) {
        count(ep, &ep->foreign);
        return refuse(ep, c, k, method, url, MHD_HTTP_FORBIDDEN, HK_ERR_REJECTED, why);
    }
    if (!hkn_ep_authorized(ep, c)) {
        count(ep, &ep->unauthorized);
        return refuse(ep, c, k, method, url, MHD_HTTP_UNAUTHORIZED, HK_ERR_REJECTED,
                      "missing or wrong bearer token");
    }
    enum body_kind kind = post ? hkn_ep_body_kind(c) : B_NONE;
    if ((why = hkn_ep_body_refused(route, kind))) {
        count(ep, &ep->foreign);
        return refuse(ep, c, k, method, url, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, HK_ERR_REJECTED, why);
    }
    int want_post = route == R_RELEASE || route == R_ROLLBACK || route == R_KEYS;
    if ((want_post && !post) || (!want_post && !get))
        return refuse(ep, c, k, method, url, MHD_HTTP_METHOD_NOT_ALLOWED, HK_ERR_INVALID,
                      want_post ? "use POST" : "use GET");
    if (!want_post)
        hkn_log(&ep->eng, HK_LOG_DEBUG, "endpoint", "%s %s from %s", method, url, hkn_ep_peer(k));
    if (route == R_STATUS)
        return hkn_ep_handle_status(ep, c);
    if (route == R_METRICS)
        return hkn_ep_handle_metrics(ep, c);
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
    if (bytes > a->r->reserved && !hkn_ep_reserve(a->ep, a->r, bytes - a->r->reserved))
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
    hkn_ep_unreserve(ep, r);
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
        if (nc > r->reserved && !hkn_ep_reserve(ep, r, nc - r->reserved)) {
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
        hkn_ep_unreserve(ep, r);
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
        hkn_ep_unreserve(ep, r);
        r->refused = MHD_HTTP_BAD_REQUEST;
    }
    if (r->refused)
        return refuse_body(ep, c, r, method, url);
    if (r->done) {
        char *answer = r->answer;
        r->answer = NULL;
        return hkn_ep_reply(c, r->status, answer, "application/json");
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
            url, hkn_ep_peer(r->conn), r->len);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    hkn_endpoint *ep = cls;
    struct req *r = *con_cls;
    if (r && r != &answered) {
        hkn_ep_unreserve(ep, r);
        free(r->body);
        hkn_frame_free(r->frame);
        free(r->frame);
        free(r->answer);
        free(r);
    }
    *con_cls = NULL;
    /* A kept-alive connection's next request gets a deadline of its own. */
    struct conn *k = hkn_ep_conn_of(c);
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
    if (pthread_create(&ep->worker, NULL, hkn_ep_worker_main, ep) != 0)
        return hku_fail(rep, HK_ERR_NOMEM, "could not start the endpoint's worker thread");
    if (pthread_create(&ep->reaper, NULL, hkn_ep_reaper_main, ep) != 0) {
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
        {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)hkn_ep_on_connection, ep},
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
    return ep ? hkn_ep_id(ep) : NULL;
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

/*
 * The push endpoint's doors: who may hold a connection, for how long, with
 * how much memory, and which requests may speak to it at all.
 *
 * Abuse. Each connection is tracked from accept to close
 * (hkn_ep_on_connection):
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
 *     declare the cap and trickle would otherwise hold every push shut.
 * Bodies over the cap are endpoint.c's (dispatch).
 *
 * Authority. Every route but /healthz needs the bearer token when one is
 * configured, a Host that names the bound address (or a configured name) and
 * no foreign Origin (scheme, host and port all the endpoint's own), and a
 * POST with a body needs Content-Type: application/json (or, for a
 * release, the frame's type), which a web page cannot send across origins
 * without a preflight this endpoint never answers: a web page cannot reach
 * a loopback endpoint, by a cross-origin request, a "simple" form or text
 * POST, or DNS rebinding. The signatures of releases and rollbacks are the
 * worker's (endpoint_handlers.c).
 *
 * Locks: conn_lock for the connections and the in-flight bytes, lock for the
 * counters, job_lock for the reaper's wait (net/endpoint.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>
#include <sodium.h>

#include "net/endpoint.h"

/* ---- connections: limits and the deadline ------------------------------ */

void hkn_ep_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
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
void *hkn_ep_reaper_main(void *arg) {
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

struct conn *hkn_ep_conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

/* 0, or a message for the 503 of a connection over a limit. */
const char *hkn_ep_over_limit(hkn_endpoint *ep, struct conn *k) {
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
int hkn_ep_reserve(hkn_endpoint *ep, struct req *r, size_t n) {
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

void hkn_ep_unreserve(hkn_endpoint *ep, struct req *r) {
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

const char *hkn_ep_foreign(const hkn_endpoint *ep, struct MHD_Connection *c) {
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

/* What a POST's body is declared as. A web page can send text/plain, form
 * and multipart bodies, or none declared at all, to any origin without
 * asking first (a "simple" request, no CORS preflight), so such a body must
 * not be able to push a release: with allow_unsigned and no token nothing
 * else would stop it. application/json and the release frame's type are
 * neither, so a page cannot send them across origins without a preflight,
 * which this endpoint never answers. */
enum body_kind hkn_ep_body_kind(struct MHD_Connection *c) {
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
const char *hkn_ep_body_refused(enum route route, enum body_kind k) {
    if (k == B_NONE || k == B_JSON || (k == B_FRAME && route == R_RELEASE))
        return NULL;
    if (k == B_FRAME)
        return "only POST /v1/release takes a body of Content-Type: " HKN_FRAME_TYPE
               "; this route's body is application/json";
    return "a request body must be sent as Content-Type: application/json (or, for a release, "
           "" HKN_FRAME_TYPE "): a web page can send text/plain, form or multipart bodies, or "
           "none declared, across origins";
}

int hkn_ep_authorized(hkn_endpoint *ep, struct MHD_Connection *c) {
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

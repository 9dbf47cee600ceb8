/*
 * The puller's /metrics server: what Prometheus scrapes on a host that pulls
 * its releases and has no push endpoint (hk_pull_options.metrics_address,
 * metrics_port).
 *
 * It answers GET (and HEAD) /metrics with the runtime's whole text (the
 * engine callback's, hk_metrics_text: the engine, the watcher, every
 * endpoint and puller attached, the rollout metrics among them) and
 * /healthz with "ok"; anything else is 404, another method 405. It reads
 * no body and changes nothing, so it needs neither the endpoint's token nor
 * its Host and Origin checks: a page that made a browser fetch it would
 * learn this host's counters and id, what any Prometheus exporter serves.
 * Put it on a loopback or management address (the default is 127.0.0.1).
 *
 * libmicrohttpd's own thread answers; connections are few (a scraper or
 * two), so they are capped low and time out after 10 s. Each scrape renders
 * the text anew; nothing is cached.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "net/net.h"

struct hkn_scrape {
    /* Immutable from start to stop. */
    struct MHD_Daemon *daemon;
    hkn_engine eng;
    unsigned port;
};

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
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    hkn_scrape *s = cls;
    static int first;
    if (!*con_cls) {
        /* Answered once the whole request is in (a body, if any, dropped). */
        *con_cls = &first;
        return MHD_YES;
    }
    if (*upload_data_size) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    const char *text = "text/plain; charset=utf-8";
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, strdup("only GET and HEAD\n"), text);
    if (!strcmp(url, "/healthz"))
        return reply(c, MHD_HTTP_OK, strdup("ok\n"), text);
    if (strcmp(url, "/metrics"))
        return reply(c, MHD_HTTP_NOT_FOUND, strdup("/metrics and /healthz only\n"), text);
    size_t len = 0;
    char *body = s->eng.metrics ? s->eng.metrics(s->eng.ud, &len) : NULL;
    if (!body)
        return reply(c, s->eng.metrics ? MHD_HTTP_INTERNAL_SERVER_ERROR : MHD_HTTP_NOT_FOUND,
                     strdup(s->eng.metrics ? "the metrics could not be rendered\n"
                                           : "this puller has no runtime's metrics\n"),
                     text);
    return reply(c, MHD_HTTP_OK, body, "text/plain; version=0.0.4; charset=utf-8");
}

int hkn_scrape_start(const char *address, unsigned port, const hkn_engine *e, hkn_scrape **out,
                     hk_report *rep) {
    *out = NULL;
    struct sockaddr_storage ss;
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    const char *addr = address ? address : "127.0.0.1";
    memset(&ss, 0, sizeof ss);
    if (port > 65535)
        return hku_fail(rep, HK_ERR_INVALID, "metrics port %u out of range", port);
    if (inet_pton(AF_INET, addr, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
    } else if (inet_pton(AF_INET6, addr, &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)port);
        flags |= MHD_USE_IPv6;
    } else {
        return hku_fail(rep, HK_ERR_INVALID,
                        "metrics address '%.64s' is not a numeric IPv4 or IPv6 address", addr);
    }
    hkn_scrape *s = calloc(1, sizeof *s);
    if (!s)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    s->eng = *e;
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &ss,
                                 MHD_OPTION_CONNECTION_LIMIT, 32u, MHD_OPTION_CONNECTION_TIMEOUT,
                                 10u, MHD_OPTION_END);
    if (!s->daemon) {
        free(s);
        return hku_fail(rep, HK_ERR_NETWORK,
                        "could not serve /metrics on %s port %u (in use, or no permission)", addr,
                        port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : port;
    *out = s;
    return 0;
}

unsigned hkn_scrape_port(const hkn_scrape *s) {
    return s ? s->port : 0;
}

void hkn_scrape_stop(hkn_scrape *s) {
    if (!s)
        return;
    MHD_stop_daemon(s->daemon);
    free(s);
}

/*
 * libFuzzer target for the push endpoint (net/endpoint.c) over raw HTTP.
 *
 * One endpoint runs on 127.0.0.1 for the whole run (no token, unsigned
 * releases allowed, so request bodies reach the release handler, a state in
 * memory and an engine that only checks what it is given). Each input is
 * sent as the bytes of one connection, which is then half-closed and read
 * until the server closes it. Any request line, header block, chunked
 * encoding or body must be answered or dropped, never crash the server,
 * hang it or leak; after every input a health request must still succeed.
 * Inputs that start with "B" are sent as the body of a POST /v1/release
 * instead, to reach the body handler with well-formed HTTP around it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "net/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static hkn_endpoint *ep;
static uint16_t port;

static int apply(void *ud, const char *module, uint64_t version, hk_format fmt, const void *bytes,
                 size_t size, const hk_header *headers, int nheaders, const char *origin,
                 hk_report *rep) {
    (void)headers;
    (void)nheaders;
    if (!hkn_valid_name(module, 64) || version == 0 || (size && !bytes))
        abort();
    return 0;
}

static int rollback(void *ud, const char *module, int check, uint64_t target, hk_report *rep) {
    if (!hkn_valid_name(module, 64))
        abort();
    return HK_ERR_NO_HISTORY;
}

static void init(void) {
    hk_endpoint_options o;
    hkn_endpoint_resolved r = {0};
    static const hkn_engine eng = {.apply = apply, .rollback = rollback};
    hk_endpoint_options_init(&o);
    r.trust.allow_unsigned = 1;
    o.token = NULL;
    o.max_body_bytes = 1 << 20;
    o.request_timeout_s = 2;
    o.timeout_s = 2;
    hk_report rep = HK_REPORT_INIT;
    if (hkn_endpoint_start(&o, &r, &eng, &ep, &rep) != 0) {
        fprintf(stderr, "endpoint: %s\n", rep.message);
        abort();
    }
    port = hkn_endpoint_port(ep);
}

/* Sends bytes on a fresh connection, half-closes, reads until the server
 * closes (or, unless patient, until it is quiet for 0.3 s). Returns the first
 * bytes of the answer in out. */
static void exchange(const void *bytes, size_t size, char *out, size_t cap, int patient) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        abort();
    /* The fuzzed request may be incomplete, and the server rightly waits for
     * the rest: give up on its answer soon. The health request that follows
     * is patient, and shows whether the server still serves. */
    struct timeval tv = {.tv_sec = patient ? 10 : 0, .tv_usec = patient ? 0 : 300000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    size_t off = 0;
    while (off < size) {
        ssize_t w = send(fd, (const char *)bytes + off, size - off, MSG_NOSIGNAL);
        if (w <= 0)
            break; /* the server may close early: that is an answer too */
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    size_t len = 0;
    char sink[4096];
    ssize_t r;
    while ((r = recv(fd, len + 1 < cap ? out + len : sink,
                     len + 1 < cap ? cap - 1 - len : sizeof sink, 0)) > 0)
        if (len + 1 < cap)
            len += (size_t)r;
    /* A reset is an answer (the server dropped the connection); no answer
     * and no close within 10 s means the server hangs. */
    if (patient && r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        abort();
    out[len] = '\0';
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ep)
        init();
    char out[512];
    if (size > 0 && data[0] == 'B') {
        char head[256];
        int n = snprintf(head, sizeof head,
                         "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                         "Connection: close\r\n\r\n",
                         size - 1);
        char *req = malloc((size_t)n + size);
        if (!req)
            return 0;
        memcpy(req, head, (size_t)n);
        memcpy(req + n, data + 1, size - 1);
        exchange(req, (size_t)n + size - 1, out, sizeof out, 0);
        free(req);
    } else {
        exchange(data, size, out, sizeof out, 0);
    }
    static const char health[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 "Connection: close\r\n\r\n";
    exchange(health, sizeof health - 1, out, sizeof out, 1);
    if (strncmp(out, "HTTP/1.1 200", 12) != 0)
        abort();
    return 0;
}

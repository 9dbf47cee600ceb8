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
 * Inputs that start with "F" are sent as a release frame (application/
 * x-hotkern-release) with a Content-Length, and those that start with "T"
 * as one chunked in pieces of 7 bytes, so that the frame's header and
 * lengths arrive split; the frame parser (net/frame.c) is also fed each such
 * body whole and in pieces of every size from 1 to 13 bytes in-process,
 * and must come to the same verdict and the same parts either way.
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
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fprintf(stderr, "fuzz_http: cannot connect to the endpoint: %s\n", strerror(errno));
        abort();
    }
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
    if (patient && r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        fprintf(stderr, "fuzz_http: no answer and no close within 10 s (%zu bytes)\n", len);
        abort();
    }
    out[len] = '\0';
    close(fd);
}

/* The frame parser's verdict on body, fed whole, and then in pieces of
 * `step` bytes: the same error and the same parts. */
static void frame_split(const uint8_t *body, size_t n) {
    static hkn_frame whole, part; /* large: off the fuzzer's stack */
    hkn_frame_init(&whole, 1 << 20, n);
    int e1 = hkn_frame_feed(&whole, body, n, NULL, NULL);
    e1 = e1 ? e1 : hkn_frame_end(&whole);
    for (size_t step = 1; step <= 13; step++) {
        hkn_frame_init(&part, 1 << 20, step & 1 ? n : HKN_FRAME_UNKNOWN);
        int e2 = 0;
        for (size_t off = 0; off < n && !e2; off += step)
            e2 = hkn_frame_feed(&part, body + off, n - off < step ? n - off : step, NULL, NULL);
        e2 = e2 ? e2 : hkn_frame_end(&part);
        /* Without a Content-Length, a frame whose lengths disagree with
         * the body's is refused when the body ends or runs past it: the
         * same error, worded otherwise. */
        if (e1 != e2)
            abort();
        if (!e1 && (whole.nart != part.nart || whole.manifest_len != part.manifest_len ||
                    whole.sig_len != part.sig_len ||
                    memcmp(whole.manifest, part.manifest, whole.manifest_len) ||
                    memcmp(whole.sig, part.sig, whole.sig_len)))
            abort();
        for (size_t i = 0; !e1 && i < whole.nart; i++)
            if (whole.art_len[i] != part.art_len[i] ||
                memcmp(whole.art[i], part.art[i], whole.art_len[i]))
                abort();
        hkn_frame_free(&part);
    }
    hkn_frame_free(&whole);
}

/* body as a chunked upload in pieces of 7 bytes, after head. */
static char *chunked(const char *head, const uint8_t *body, size_t n, size_t *len) {
    size_t hn = strlen(head), cap = hn + n + (n / 7 + 1) * 8 + 8;
    char *req = malloc(cap), *p = req;
    if (!req)
        return NULL;
    memcpy(p, head, hn);
    p += hn;
    for (size_t off = 0; off < n; off += 7) {
        size_t k = n - off < 7 ? n - off : 7;
        p += sprintf(p, "%zx\r\n", k);
        memcpy(p, body + off, k);
        p += k;
        memcpy(p, "\r\n", 2);
        p += 2;
    }
    memcpy(p, "0\r\n\r\n", 5);
    *len = (size_t)(p + 5 - req);
    return req;
}

/* body as a POST /v1/release of type ctype with a Content-Length. */
static void post(const char *ctype, const uint8_t *body, size_t n, char *out, size_t cap) {
    char head[256];
    int hn = snprintf(head, sizeof head,
                      "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Content-Type: %s\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      ctype, n);
    char *req = malloc((size_t)hn + n + 1);
    if (!req)
        return;
    memcpy(req, head, (size_t)hn);
    memcpy(req + hn, body, n);
    exchange(req, (size_t)hn + n, out, cap, 0);
    free(req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ep)
        init();
    char out[512];
    if (size > 0 && data[0] == 'F') {
        frame_split(data + 1, size - 1);
        post(HKN_FRAME_TYPE, data + 1, size - 1, out, sizeof out);
    } else if (size > 0 && data[0] == 'T') {
        size_t len;
        frame_split(data + 1, size - 1);
        char *req = chunked("POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            "Content-Type: " HKN_FRAME_TYPE "\r\n"
                            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
                            data + 1, size - 1, &len);
        if (!req)
            return 0;
        exchange(req, len, out, sizeof out, 0);
        free(req);
    } else if (size > 0 && data[0] == 'B') {
        post("application/json", data + 1, size - 1, out, sizeof out);
    } else {
        exchange(data, size, out, sizeof out, 0);
    }
    static const char health[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 "Connection: close\r\n\r\n";
    exchange(health, sizeof health - 1, out, sizeof out, 1);
    if (strncmp(out, "HTTP/1.1 200", 12) != 0) {
        fprintf(stderr, "fuzz_http: /healthz after the input answered: [%.200s]\n", out);
        abort();
    }
    return 0;
}

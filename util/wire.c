/*
 * Length-prefixed messages between hotkern and its helper processes
 * (hotkern-canary, hotkern-build), used by both sides of each: framing with a
 * size bound checked before any allocation, receive with a deadline (poll),
 * and a bounds-checked reader. Each protocol has its own magic, so a peer of
 * the wrong kind is a malformed message at its first header.
 *
 * Neither side trusts the other: hku_recv refuses a header over the bound
 * the caller derives from what it asked, and every hku_get fails, rather
 * than reads, past the end of what arrived.
 *
 * The same writer and reader serialise the compile cache's payloads
 * (ptx/entry.c), which live on disk: integers are little-endian whatever
 * the host, so a cache directory means the same on every machine that
 * shares it, and a message to a helper (same host) is unaffected.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/util.h"

double hku_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int hku_cond_init(pthread_cond_t *c) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int r = pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
    return r;
}

void hku_deadline(struct timespec *ts, long us) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += us / 1000000;
    ts->tv_nsec += (us % 1000000) * 1000;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

void hku_buf_init(hku_buf *b, uint32_t magic, uint32_t type) {
    memset(b, 0, sizeof *b);
    hku_msg_hdr h = {magic, type, 0};
    hku_put(b, &h, sizeof h);
}

void hku_put(hku_buf *b, const void *p, size_t n) {
    if (b->oom)
        return;
    if (n > SIZE_MAX / 4 - b->len) {
        b->oom = 1;
        return;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *d = realloc(b->data, cap);
        if (!d) {
            b->oom = 1;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
}

void hku_put_u32(hku_buf *b, uint32_t v) {
    unsigned char le[4];
    for (int i = 0; i < 4; i++)
        le[i] = (unsigned char)(v >> (8 * i));
    hku_put(b, le, sizeof le);
}

void hku_put_u64(hku_buf *b, uint64_t v) {
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(v >> (8 * i));
    hku_put(b, le, sizeof le);
}

void hku_put_str(hku_buf *b, const char *s, size_t max) {
    size_t n = s ? strlen(s) : 0;
    if (n > max)
        n = max;
    hku_put_u32(b, (uint32_t)n);
    hku_put(b, s, n);
}

void hku_put_str64(hku_buf *b, const char *s) {
    size_t n = s ? strlen(s) : 0;
    hku_put_u64(b, (uint64_t)n);
    hku_put(b, s, n);
}

int hku_buf_take(hku_buf *b, void **out, size_t *n) {
    if (b->oom) {
        hku_buf_free(b);
        return HK_ERR_NOMEM;
    }
    *out = b->data;
    *n = b->len;
    memset(b, 0, sizeof *b);
    return 0;
}

void hku_buf_free(hku_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

int hku_send(int fd, hku_buf *b) {
    return hku_send_by(fd, b, 0);
}

/* Waits until fd can take more bytes or the deadline passes: 0,
 * HK_ERR_TIMEOUT at the deadline (errno ETIMEDOUT), or HK_ERR_IO (errno
 * set by poll). */
static int wait_writable(int fd, double deadline_ms) {
    for (;;) {
        double left = deadline_ms - hku_now_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return HK_ERR_TIMEOUT;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int pr = poll(&pfd, 1, left > 1e6 ? 1000000 : (int)left + 1);
        if (pr > 0)
            return 0;
        if (pr < 0 && errno != EINTR)
            return HK_ERR_IO;
    }
}

int hku_send_by(int fd, hku_buf *b, double deadline_ms) {
    if (b->oom || b->len < sizeof(hku_msg_hdr) || b->len - sizeof(hku_msg_hdr) > UINT32_MAX) {
        errno = ENOMEM;
        return HK_ERR_NOMEM;
    }
    uint32_t len = (uint32_t)(b->len - sizeof(hku_msg_hdr));
    memcpy(b->data + offsetof(hku_msg_hdr, length), &len, sizeof len);
    /* MSG_NOSIGNAL: a dead peer is an EPIPE, never a SIGPIPE that would end
     * the application. With a deadline, MSG_DONTWAIT: a peer that stops
     * reading cannot hold the sender past it. */
    int flags = MSG_NOSIGNAL | (deadline_ms > 0 ? MSG_DONTWAIT : 0);
    size_t off = 0;
    while (off < b->len) {
        ssize_t n = send(fd, b->data + off, b->len - off, flags);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && deadline_ms > 0) {
            int w = wait_writable(fd, deadline_ms);
            if (w < 0)
                return w;
            continue;
        }
        if (n <= 0)
            return HK_ERR_IO;
        off += (size_t)n;
    }
    return 0;
}

/* Reads exactly n bytes before the deadline. */
static int read_full(int fd, void *p, size_t n, double deadline_ms) {
    size_t off = 0;
    while (off < n) {
        if (deadline_ms > 0) {
            double left = deadline_ms - hku_now_ms();
            if (left <= 0)
                return HKU_RECV_TIMEOUT;
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            int pr = poll(&pfd, 1, left > 1e6 ? 1000000 : (int)left + 1);
            if (pr < 0 && errno == EINTR)
                continue;
            if (pr < 0)
                return HKU_RECV_ERROR;
            if (pr == 0)
                continue; /* the loop re-checks the deadline */
        }
        ssize_t r = recv(fd, (char *)p + off, n - off, 0);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r < 0)
            return errno == ECONNRESET ? HKU_RECV_EOF : HKU_RECV_ERROR;
        if (r == 0)
            return HKU_RECV_EOF;
        off += (size_t)r;
    }
    return 0;
}

int hku_recv(int fd, uint32_t magic, size_t max, double deadline_ms, uint32_t *type,
             unsigned char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    hku_msg_hdr h;
    int err = read_full(fd, &h, sizeof h, deadline_ms);
    if (err < 0)
        return err;
    if (h.magic != magic || h.length > max)
        return HKU_RECV_MALFORMED;
    unsigned char *d = malloc(h.length ? h.length : 1);
    if (!d)
        return HKU_RECV_ERROR;
    if ((err = read_full(fd, d, h.length, deadline_ms)) < 0) {
        free(d);
        return err;
    }
    *type = h.type;
    *data = d;
    *len = h.length;
    return 0;
}

void hku_rd_fail(hku_rd *r, int why) {
    if (!r->bad)
        r->bad = why;
}

const void *hku_get(hku_rd *r, size_t n) {
    if (r->bad || n > r->left) {
        hku_rd_fail(r, HKU_RD_MALFORMED);
        return NULL;
    }
    const void *p = r->p;
    r->p += n;
    r->left -= n;
    return p;
}

/* A little-endian integer of n bytes (0 when the input ran out). */
static uint64_t get_le(hku_rd *r, int n) {
    const unsigned char *p = hku_get(r, (size_t)n);
    uint64_t v = 0;
    for (int i = 0; p && i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

uint32_t hku_get_u32(hku_rd *r) {
    return (uint32_t)get_le(r, 4);
}

uint64_t hku_get_u64(hku_rd *r) {
    return get_le(r, 8);
}

void hku_get_str(hku_rd *r, char *out, size_t out_size, size_t max) {
    out[0] = '\0';
    uint32_t n = hku_get_u32(r);
    if (r->bad || n > max || n >= out_size) {
        hku_rd_fail(r, HKU_RD_MALFORMED);
        return;
    }
    const unsigned char *p = hku_get(r, n);
    if (!p)
        return;
    for (uint32_t i = 0; i < n; i++)
        out[i] = (p[i] >= 0x20 && p[i] < 0x7f) || p[i] == '\n' || p[i] == '\t' ? (char)p[i] : '?';
    out[n] = '\0';
}

char *hku_get_strdup(hku_rd *r, size_t max, int printable) {
    uint32_t n = hku_get_u32(r);
    const unsigned char *p = r->bad || n > max ? NULL : hku_get(r, n);
    char *s = p ? malloc((size_t)n + 1) : NULL;
    if (!s) {
        hku_rd_fail(r, HKU_RD_MALFORMED);
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        int ok = (p[i] >= 0x20 && p[i] < 0x7f) || p[i] == '\n' || p[i] == '\t';
        if (!p[i]) { /* a C string cannot hold it: malformed */
            free(s);
            hku_rd_fail(r, HKU_RD_MALFORMED);
            return NULL;
        }
        s[i] = printable && !ok ? '?' : (char)p[i];
    }
    s[n] = '\0';
    return s;
}

char *hku_get_str64(hku_rd *r, uint64_t max) {
    uint64_t n = hku_get_u64(r);
    if (r->bad || n > max || n > r->left || memchr(r->p, 0, (size_t)n)) {
        hku_rd_fail(r, HKU_RD_MALFORMED);
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        hku_rd_fail(r, HKU_RD_NOMEM);
        return NULL;
    }
    memcpy(s, hku_get(r, (size_t)n), (size_t)n);
    s[n] = '\0';
    return s;
}

int hku_end(const hku_rd *r) {
    return r->bad || r->left ? HK_ERR_FORMAT : 0;
}

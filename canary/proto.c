/*
 * The canary's wire protocol, used by both sides (canary.h has the message
 * list): framing with a size bound checked before any allocation, receive
 * with a deadline (poll), a bounds-checked reader, and the buffer fills a
 * test declares (generated where the buffer lives, so a pattern costs no
 * bytes on the wire).
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "canary/canary.h"

double hka_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void hka_buf_init(hka_buf *b, uint32_t type) {
    memset(b, 0, sizeof *b);
    hka_msg_hdr h = {HKA_MAGIC, type, 0};
    hka_put(b, &h, sizeof h);
}

void hka_put(hka_buf *b, const void *p, size_t n) {
    if (b->oom)
        return;
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

void hka_put_u32(hka_buf *b, uint32_t v) {
    hka_put(b, &v, sizeof v);
}

void hka_put_u64(hka_buf *b, uint64_t v) {
    hka_put(b, &v, sizeof v);
}

void hka_put_str(hka_buf *b, const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n > HKA_MAX_TEXT)
        n = HKA_MAX_TEXT;
    hka_put_u32(b, (uint32_t)n);
    hka_put(b, s, n);
}

void hka_buf_free(hka_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

int hka_send(int fd, hka_buf *b) {
    if (b->oom || b->len < sizeof(hka_msg_hdr) || b->len - sizeof(hka_msg_hdr) > HKA_MAX_MSG) {
        errno = ENOMEM;
        return -1;
    }
    uint32_t len = (uint32_t)(b->len - sizeof(hka_msg_hdr));
    memcpy(b->data + offsetof(hka_msg_hdr, length), &len, sizeof len);
    size_t off = 0;
    while (off < b->len) {
        /* MSG_NOSIGNAL: a dead peer is an EPIPE, never a SIGPIPE that would
         * end the application. */
        ssize_t n = send(fd, b->data + off, b->len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        off += (size_t)n;
    }
    return 0;
}

/* Reads exactly n bytes before the deadline. */
static int read_full(int fd, void *p, size_t n, double deadline_ms) {
    size_t off = 0;
    while (off < n) {
        if (deadline_ms > 0) {
            double left = deadline_ms - hka_now_ms();
            if (left <= 0)
                return HKA_RECV_TIMEOUT;
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            int pr = poll(&pfd, 1, left > 1e6 ? 1000000 : (int)left + 1);
            if (pr < 0 && errno == EINTR)
                continue;
            if (pr < 0)
                return HKA_RECV_ERROR;
            if (pr == 0)
                continue; /* the loop re-checks the deadline */
        }
        ssize_t r = recv(fd, (char *)p + off, n - off, 0);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r < 0)
            return errno == ECONNRESET ? HKA_RECV_EOF : HKA_RECV_ERROR;
        if (r == 0)
            return HKA_RECV_EOF;
        off += (size_t)r;
    }
    return 0;
}

int hka_recv(int fd, size_t max, double deadline_ms, uint32_t *type, unsigned char **data,
             size_t *len) {
    *data = NULL;
    *len = 0;
    hka_msg_hdr h;
    int err = read_full(fd, &h, sizeof h, deadline_ms);
    if (err < 0)
        return err;
    if (h.magic != HKA_MAGIC || h.length > max || h.length > HKA_MAX_MSG)
        return HKA_RECV_MALFORMED;
    unsigned char *d = malloc(h.length ? h.length : 1);
    if (!d)
        return HKA_RECV_ERROR;
    if ((err = read_full(fd, d, h.length, deadline_ms)) < 0) {
        free(d);
        return err;
    }
    *type = h.type;
    *data = d;
    *len = h.length;
    return 0;
}

const void *hka_get(hka_rd *r, size_t n) {
    if (r->bad || n > r->left) {
        r->bad = 1;
        return NULL;
    }
    const void *p = r->p;
    r->p += n;
    r->left -= n;
    return p;
}

uint32_t hka_get_u32(hka_rd *r) {
    uint32_t v = 0;
    const void *p = hka_get(r, sizeof v);
    if (p)
        memcpy(&v, p, sizeof v);
    return v;
}

uint64_t hka_get_u64(hka_rd *r) {
    uint64_t v = 0;
    const void *p = hka_get(r, sizeof v);
    if (p)
        memcpy(&v, p, sizeof v);
    return v;
}

void hka_get_str(hka_rd *r, char *out, size_t out_size, size_t max) {
    out[0] = '\0';
    uint32_t n = hka_get_u32(r);
    if (r->bad || n > max || n >= out_size) {
        r->bad = 1;
        return;
    }
    const unsigned char *p = hka_get(r, n);
    if (!p)
        return;
    for (uint32_t i = 0; i < n; i++)
        out[i] = (p[i] >= 0x20 && p[i] < 0x7f) || p[i] == '\n' || p[i] == '\t' ? (char)p[i] : '?';
    out[n] = '\0';
}

int hka_end(const hka_rd *r) {
    return r->bad || r->left ? -1 : 0;
}

/* xorshift64*: the same bytes for the same seed on both versions' runs. */
static uint64_t next_rand(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

void hka_fill(void *p, size_t n, uint32_t fill, uint64_t param) {
    unsigned char *b = p;
    switch (fill) {
    case HK_FILL_BYTE:
        memset(b, (int)(param & 0xff), n);
        break;
    case HK_FILL_RANDOM: {
        uint64_t s = param ? param : 0x9E3779B97F4A7C15ULL;
        for (size_t i = 0; i < n; i += 8) {
            uint64_t v = next_rand(&s);
            memcpy(b + i, &v, n - i < 8 ? n - i : 8);
        }
        break;
    }
    case HK_FILL_IOTA_I32:
        for (size_t i = 0; i + 4 <= n; i += 4) {
            int32_t v = (int32_t)(i / 4 + param);
            memcpy(b + i, &v, 4);
        }
        memset(b + n / 4 * 4, 0, n % 4);
        break;
    case HK_FILL_IOTA_F32:
        for (size_t i = 0; i + 4 <= n; i += 4) {
            float v = (float)(i / 4 + param);
            memcpy(b + i, &v, 4);
        }
        memset(b + n / 4 * 4, 0, n % 4);
        break;
    default: /* HK_FILL_ZERO */
        memset(b, 0, n);
        break;
    }
}

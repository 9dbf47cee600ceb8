/*
 * The binary push body (Content-Type: application/x-hotkern-release): one
 * release framed by lengths, so that the endpoint holds its bytes once.
 *
 * The JSON body carries each artifact in base64 inside a string, which a
 * JSON parser copies out of the body before it can be decoded: the body,
 * its parsed copy and the decoded bytes are held together. A frame instead
 * says up front how long each part is, so the receiver checks the lengths
 * against its cap and the body's declared length and copies the bytes into
 * one buffer as they arrive: what it holds is at most the release's size
 * once, whatever the transfer encoding. The buffer grows with what has
 * arrived (doubling, never past the frame's size), not with what the
 * lengths declare: a sender that declares 64 MiB and trickles holds about
 * what it sent (until a 32nd of the frame has come, then the whole
 * frame), so declared sizes cannot hold the endpoint's memory budget.
 *
 * Layout, integers big-endian:
 *   magic       8 bytes  89 'H' 'K' 'R' 0d 0a 1a 0a (PNG's trick: a non-
 *                        ASCII byte, CRLF and LF, so that a text-mode
 *                        transfer that changes bytes is seen at once)
 *   version     u16      1
 *   count       u16      artifacts, 1 to HKN_MAX_ARTIFACTS
 *   mlen        u32      manifest bytes, 1 to HKN_FRAME_MAX_MANIFEST
 *   slen        u32      signature bytes, 0 to HKN_FRAME_MAX_SIG (0: none)
 *   alen[count] u64      each artifact's bytes
 *   then the manifest, the signature and the artifacts back to back, and
 *   nothing after them.
 * The manifest is manifest.json's exact bytes and the signature
 * manifest.json.sig's text, the very bytes a JSON body carries in its
 * "manifest" and "signature" strings: a release signed once goes either
 * way. The artifacts come in the manifest's order; the worker checks each
 * against its entry (size, SHA-256) like any other release.
 *
 * The parser is a small state machine fed by the endpoint's event loop, one
 * piece of the body at a time: it never reads past what it was given and
 * allocates only from lengths it has checked against the cap. Errors are
 * sticky and worded in f->why.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

static const unsigned char magic[8] = {0x89, 'H', 'K', 'R', '\r', '\n', 0x1a, '\n'};

static uint64_t get_be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static void put_be(unsigned char *p, uint64_t v, int n) {
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

static int fail(hkn_frame *f, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(hkn_frame *f, int err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->why, sizeof f->why, fmt, ap);
    va_end(ap);
    free(f->buf);
    f->buf = NULL;
    f->buf_len = f->buf_have = f->buf_cap = 0;
    f->body = 0;
    return f->err = err;
}

void hkn_frame_init(hkn_frame *f, size_t limit, uint64_t declared) {
    memset(f, 0, sizeof *f);
    f->limit = limit;
    f->declared = declared;
    f->head_need = HKN_FRAME_HEAD;
}

void hkn_frame_free(hkn_frame *f) {
    if (!f)
        return;
    free(f->buf);
    f->buf = NULL;
    f->buf_len = f->buf_have = 0;
}

/* The fixed header is in: checks it and sizes the length table. */
static int read_head(hkn_frame *f) {
    const unsigned char *h = f->head;
    if (memcmp(h, magic, sizeof magic))
        return fail(f, HK_ERR_INVALID,
                    "the body is not a hotkern release frame (its first 8 bytes are not the "
                    "frame's magic)");
    unsigned version = (unsigned)get_be(h + 8, 2), count = (unsigned)get_be(h + 10, 2);
    uint64_t mlen = get_be(h + 12, 4), slen = get_be(h + 16, 4);
    if (version != HKN_FRAME_VERSION)
        return fail(f, HK_ERR_INVALID,
                    "release frame version %u is not one this endpoint reads (%d)", version,
                    HKN_FRAME_VERSION);
    if (count < 1 || count > HKN_MAX_ARTIFACTS)
        return fail(f, HK_ERR_INVALID, "release frame names %u artifacts (1 to %d)", count,
                    HKN_MAX_ARTIFACTS);
    if (mlen < 1 || mlen > HKN_FRAME_MAX_MANIFEST)
        return fail(f, HK_ERR_INVALID, "release frame's manifest is %llu bytes (1 to %d)",
                    (unsigned long long)mlen, HKN_FRAME_MAX_MANIFEST);
    if (slen > HKN_FRAME_MAX_SIG)
        return fail(f, HK_ERR_INVALID, "release frame's signature is %llu bytes (at most %d)",
                    (unsigned long long)slen, HKN_FRAME_MAX_SIG);
    f->nart = count;
    f->manifest_len = (size_t)mlen;
    f->sig_len = (size_t)slen;
    f->head_need = HKN_FRAME_HEAD + 8 * (size_t)count;
    return 0;
}

/* The length table is in: the frame's whole size is known. Checks it
 * against the cap and the body's length before anything is allocated;
 * the buffer comes as the bytes do (grow). */
static int read_table(hkn_frame *f) {
    uint64_t rest = f->manifest_len + f->sig_len;
    for (size_t i = 0; i < f->nart; i++) {
        uint64_t a = get_be(f->head + HKN_FRAME_HEAD + 8 * i, 8);
        /* Each term is checked before the sum: no length can wrap it. */
        if (a > f->limit || rest > f->limit - a)
            return fail(f, HK_ERR_TOO_LARGE,
                        "release frame declares more than the cap of %zu bytes (artifact %zu: "
                        "%llu bytes)",
                        f->limit, i, (unsigned long long)a);
        f->art_len[i] = (size_t)a;
        rest += a;
    }
    f->total = f->head_need + rest;
    if (f->total > f->limit)
        return fail(f, HK_ERR_TOO_LARGE,
                    "release frame declares %llu bytes, over the cap of %zu bytes",
                    (unsigned long long)f->total, f->limit);
    if (f->declared != HKN_FRAME_UNKNOWN && f->total != f->declared)
        return fail(f, HK_ERR_INVALID,
                    "release frame declares %llu bytes but the body is %llu (Content-Length): "
                    "%s",
                    (unsigned long long)f->total, (unsigned long long)f->declared,
                    f->total > f->declared ? "truncated" : "bytes follow the frame");
    f->buf_len = (size_t)rest;
    f->body = 1;
    return 0;
}

/* Room in buf for `need` bytes (at most buf_len): the capacity doubles from
 * 64 KiB and stops at buf_len, admit asked for each new capacity first. */
static int grow(hkn_frame *f, size_t need, hkn_frame_admit_fn admit, void *ud) {
    size_t nc = f->buf_cap ? f->buf_cap : 64 * 1024;
    while (nc < need && nc < f->buf_len)
        nc *= 2;
    /* Once a 32nd of the frame has arrived, its whole size: a realloc
     * that copies (no mremap: sanitizers' allocators) then holds the
     * release about once, not its last doubling beside the one before. */
    if (need > f->buf_len / 32)
        nc = f->buf_len;
    if (nc > f->buf_len)
        nc = f->buf_len;
    int err = admit ? admit(ud, nc) : 0;
    if (err)
        return fail(f, err, "too many request bodies in flight; retry later");
    unsigned char *nb = realloc(f->buf, nc);
    if (!nb)
        return fail(f, HK_ERR_NOMEM, "out of memory for a release of %zu bytes", f->buf_len);
    f->buf = nb;
    f->buf_cap = nc;
    return 0;
}

int hkn_frame_feed(hkn_frame *f, const void *data, size_t n, hkn_frame_admit_fn admit, void *ud) {
    const unsigned char *p = data;
    while (n > 0 && !f->err) {
        if (!f->body) {
            size_t take = f->head_need - f->head_len;
            take = take < n ? take : n;
            memcpy(f->head + f->head_len, p, take);
            f->head_len += take;
            f->seen += take;
            p += take;
            n -= take;
            if (f->head_len == HKN_FRAME_HEAD && f->head_need == HKN_FRAME_HEAD && read_head(f))
                break;
            if (f->head_len == f->head_need && f->head_need > HKN_FRAME_HEAD)
                read_table(f);
            continue;
        }
        if (n > f->buf_len - f->buf_have)
            return fail(f, HK_ERR_INVALID,
                        "bytes follow the release frame's %llu declared bytes (received "
                        "%llu)",
                        (unsigned long long)f->total, (unsigned long long)(f->seen + n));
        if (f->buf_have + n > f->buf_cap && grow(f, f->buf_have + n, admit, ud))
            break;
        memcpy(f->buf + f->buf_have, p, n);
        f->buf_have += n;
        f->seen += n;
        n = 0;
    }
    return f->err;
}

int hkn_frame_end(hkn_frame *f) {
    if (f->err)
        return f->err;
    if (!f->body)
        return fail(f, HK_ERR_INVALID,
                    "the body ended after %llu bytes, inside the release frame's header (%zu "
                    "bytes)",
                    (unsigned long long)f->seen, f->head_need);
    if (f->buf_have < f->buf_len)
        return fail(f, HK_ERR_INVALID,
                    "release frame truncated: it declares %llu bytes, the body ended after %llu",
                    (unsigned long long)f->total, (unsigned long long)f->seen);
    const unsigned char *q = f->buf;
    f->manifest = (const char *)q;
    q += f->manifest_len;
    f->sig = (const char *)q;
    q += f->sig_len;
    for (size_t i = 0; i < f->nart; i++) {
        f->art[i] = q;
        q += f->art_len[i];
    }
    f->done = 1;
    return 0;
}

int hkn_frame_write(const char *manifest, size_t mlen, const char *sig, size_t slen,
                    const hkn_blob *blobs, size_t n, unsigned char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!manifest || mlen < 1 || mlen > HKN_FRAME_MAX_MANIFEST || slen > HKN_FRAME_MAX_SIG ||
        (slen && !sig) || n < 1 || n > HKN_MAX_ARTIFACTS)
        return HK_ERR_INVALID;
    size_t total = HKN_FRAME_HEAD + 8 * n + mlen + slen;
    for (size_t i = 0; i < n; i++) {
        if (blobs[i].size > SIZE_MAX - total)
            return HK_ERR_TOO_LARGE;
        total += blobs[i].size;
    }
    unsigned char *b = malloc(total), *p = b;
    if (!b)
        return HK_ERR_NOMEM;
    memcpy(p, magic, sizeof magic);
    put_be(p + 8, HKN_FRAME_VERSION, 2);
    put_be(p + 10, n, 2);
    put_be(p + 12, mlen, 4);
    put_be(p + 16, slen, 4);
    p += HKN_FRAME_HEAD;
    for (size_t i = 0; i < n; i++, p += 8)
        put_be(p, blobs[i].size, 8);
    memcpy(p, manifest, mlen);
    p += mlen;
    if (slen)
        memcpy(p, sig, slen);
    p += slen;
    for (size_t i = 0; i < n; i++) {
        if (blobs[i].size)
            memcpy(p, blobs[i].bytes, blobs[i].size);
        p += blobs[i].size;
    }
    *out = b;
    *len = total;
    return 0;
}

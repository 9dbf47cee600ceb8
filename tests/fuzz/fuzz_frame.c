/*
 * libFuzzer target for the release frame parser (net/frame.c), in process.
 *
 * The endpoint feeds a frame to the parser piece by piece as libmicrohttpd
 * hands the body over, with or without a Content-Length, and asks its
 * memory budget before each growth of the buffer. The input's first four
 * bytes choose the piece size, whether a Content-Length is declared (and
 * whether it is the true one) and the budget; the rest is the body. Any
 * body must be parsed or refused with a reason, never read out of bounds;
 * a parsed frame must account for every byte and write back to the same
 * bytes; the buffer must never outgrow what arrived by more than doubling
 * (a declared size holds nothing), nor the budget it was given.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct budget {
    size_t left, held;
};

static int admit(void *ud, size_t bytes) {
    struct budget *b = ud;
    if (bytes > b->held && bytes - b->held > b->left)
        return HK_ERR_BUSY;
    if (bytes > b->held) {
        b->left -= bytes - b->held;
        b->held = bytes;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4)
        return 0;
    size_t piece = 1 + data[0] % 97;
    int mode = data[1] % 3; /* 0: no Content-Length, 1: the true one, 2: a wrong one */
    struct budget b = {.left = (size_t)(1 + data[2]) * 1024 + data[3], .held = 0};
    const uint8_t *body = data + 4;
    size_t n = size - 4;
    uint64_t declared = mode == 0 ? HKN_FRAME_UNKNOWN : mode == 1 ? n : n + 1 + data[3];
    const size_t limit = 1 << 20;
    hkn_frame f;
    hkn_frame_init(&f, limit, declared);
    int err = 0;
    for (size_t at = 0; at < n && !err; at += piece) {
        size_t take = n - at < piece ? n - at : piece;
        err = hkn_frame_feed(&f, body + at, take, admit, &b);
        if (f.buf_cap > f.buf_len || f.buf_have > f.buf_cap)
            abort();
        if (f.buf_cap > 64 * 1024 && f.buf_cap > 2 * f.buf_have &&
            !(f.buf_cap == f.buf_len && 32 * f.buf_have > f.buf_len))
            abort(); /* grew past what arrived (the whole frame only past a 32nd) */
        if (f.buf_cap > b.held)
            abort(); /* held more than it was admitted */
    }
    if (!err)
        err = hkn_frame_end(&f);
    if (err) {
        if (!f.why[0] || f.buf || !f.err)
            abort(); /* refused without a reason, or holding memory */
    } else {
        if (!f.done || f.seen != n || f.buf_have != f.buf_len || f.total != n)
            abort();
        if (declared != HKN_FRAME_UNKNOWN && declared != n)
            abort();
        size_t sum = f.manifest_len + f.sig_len;
        hkn_blob blobs[HKN_MAX_ARTIFACTS];
        for (size_t i = 0; i < f.nart; i++) {
            sum += f.art_len[i];
            blobs[i] = (hkn_blob){.name = "a", .bytes = f.art[i], .size = f.art_len[i]};
        }
        if (sum != f.buf_len)
            abort();
        unsigned char *out;
        size_t len;
        if (hkn_frame_write(f.manifest, f.manifest_len, f.sig, f.sig_len, blobs, f.nart, &out,
                            &len) != 0 ||
            len != n || memcmp(out, body, n))
            abort(); /* parsed as something other than what was sent */
        free(out);
    }
    hkn_frame_free(&f);
    return 0;
}

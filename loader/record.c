/*
 * The per-module record of the last-known-good state (loader/lkg.c keeps it
 * on disk): parse and format, nothing else, so that the parser can be fuzzed
 * on its own (tests/fuzz/fuzz_record.c).
 *
 * libhotkern links no JSON library, so the record is lines of
 * space-separated words, one fact a line:
 *
 *   hotkern-record 1
 *   module NAME
 *   current HASH FORMAT RELEASE
 *   good HASH FORMAT RELEASE
 *   expr LOWERED EXPRESSION...
 *   quarantined HASH RELEASE VERSION
 *   end
 *
 * HASH is 64 lowercase hex digits (BLAKE2b-256 of the image), FORMAT is
 * ptx, cubin or fatbin, RELEASE and VERSION are decimal (0: unknown). `expr`
 * lines are the name expressions of the good image (the expression is the
 * rest of the line: "scale<float, 2>"). The first two and the last line are
 * required, `current` and `good` appear at most once, and nothing but `end`
 * may be last: a file cut short anywhere is refused, never half-read.
 *
 * Strict on purpose: every line ends with a newline, no NUL or other
 * control byte, no unknown keyword, no number with a sign, leading space or
 * more than 19 digits, bounded counts and lengths, and NAME is a module name
 * the engine accepts (hku_name_check: UTF-8, no control character). The
 * parser reads only within the given length and allocates only for `expr`
 * lines.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/record.h"

#define LINE_MAX_BYTES 4096

void hkl_rec_free(hkl_rec *r) {
    for (int i = 0; i < r->nexpr; i++) {
        free(r->expr[i]);
        free(r->lowered[i]);
    }
    free(r->expr);
    free(r->lowered);
    r->expr = r->lowered = NULL;
    r->nexpr = 0;
}

void hkl_hash_hex(const uint8_t h[32], char out[65]) {
    static const char x[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = x[h[i] >> 4];
        out[2 * i + 1] = x[h[i] & 15];
    }
    out[64] = 0;
}

int hkl_hash_parse(const char *s, size_t n, uint8_t h[32]) {
    if (n != 64)
        return HK_ERR_FORMAT;
    for (size_t i = 0; i < 64; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0)
            return HK_ERR_FORMAT;
        if (i % 2 == 0)
            h[i / 2] = (uint8_t)(v << 4);
        else
            h[i / 2] |= (uint8_t)v;
    }
    return 0;
}

/* A line cut into at most `max` words; the last word takes the rest of the
 * line when `rest` is set. */
typedef struct words {
    const char *w[6];
    size_t n[6];
    int count;
} words;

static void split(const char *s, size_t len, int max, int rest, words *out) {
    size_t i = 0;
    out->count = 0;
    for (;;) {
        if (out->count == max) {
            out->count = max + 1; /* words left over */
            return;
        }
        size_t j = len;
        if (!rest || out->count < max - 1)
            for (j = i; j < len && s[j] != ' ';)
                j++;
        out->w[out->count] = s + i;
        out->n[out->count++] = j - i;
        if (j >= len)
            return;
        i = j + 1;
    }
}

static int word_is(const words *w, int i, const char *lit) {
    return w->n[i] == strlen(lit) && !memcmp(w->w[i], lit, w->n[i]);
}

static int parse_u64(const char *s, size_t n, uint64_t *out) {
    if (n == 0 || n > 19)
        return HK_ERR_FORMAT;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return HK_ERR_FORMAT;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

static int parse_format(const char *s, size_t n, hk_format *out) {
    static const hk_format f[] = {HK_FORMAT_PTX, HK_FORMAT_CUBIN, HK_FORMAT_FATBIN};
    for (size_t i = 0; i < 3; i++) {
        const char *name = hk_format_name(f[i]);
        if (n == strlen(name) && !memcmp(s, name, n)) {
            *out = f[i];
            return 0;
        }
    }
    return HK_ERR_FORMAT;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* `current` or `good`: HASH FORMAT RELEASE. */
static int parse_image(const words *w, hkl_rec_image *im) {
    if (w->count != 4 || im->has || hkl_hash_parse(w->w[1], w->n[1], im->hash) < 0 ||
        parse_format(w->w[2], w->n[2], &im->format) < 0 ||
        parse_u64(w->w[3], w->n[3], &im->release) < 0)
        return HK_ERR_FORMAT;
    im->has = 1;
    return 0;
}

static int parse_expr(const char *s, size_t len, hkl_rec *r) {
    words w;
    split(s, len, 3, 1, &w);
    if (w.count != 3 || w.n[1] == 0 || w.n[2] == 0 || w.n[1] > 1023 || w.n[2] > 1023 ||
        r->nexpr >= HKL_REC_MAXEXPR || memchr(w.w[1], ' ', w.n[1]))
        return HK_ERR_FORMAT;
    if (!r->expr) {
        r->expr = calloc(HKL_REC_MAXEXPR, sizeof *r->expr);
        r->lowered = calloc(HKL_REC_MAXEXPR, sizeof *r->lowered);
        if (!r->expr || !r->lowered)
            return HK_ERR_NOMEM;
    }
    r->lowered[r->nexpr] = dup_n(w.w[1], w.n[1]);
    r->expr[r->nexpr] = dup_n(w.w[2], w.n[2]);
    r->nexpr++;
    return r->lowered[r->nexpr - 1] && r->expr[r->nexpr - 1] ? 0 : HK_ERR_NOMEM;
}

/* One line of the body; 1 at `end`, 0 for a fact, HK_ERR_FORMAT when it is
 * bad, HK_ERR_NOMEM when memory ran out (so do the parse_* below). */
static int parse_line(const char *s, size_t len, hkl_rec *r) {
    words w;
    if (len >= 5 && !memcmp(s, "expr ", 5))
        return parse_expr(s, len, r);
    split(s, len, 5, 0, &w);
    if (w.count < 1)
        return HK_ERR_FORMAT;
    if (word_is(&w, 0, "end"))
        return w.count == 1 ? 1 : HK_ERR_FORMAT;
    if (word_is(&w, 0, "current"))
        return parse_image(&w, &r->current);
    if (word_is(&w, 0, "good"))
        return parse_image(&w, &r->good);
    if (word_is(&w, 0, "quarantined")) {
        hkl_rec_q q;
        if (w.count != 4 || r->nq >= HKL_REC_MAXQ || hkl_hash_parse(w.w[1], w.n[1], q.hash) < 0 ||
            parse_u64(w.w[2], w.n[2], &q.release) < 0 || parse_u64(w.w[3], w.n[3], &q.version) < 0)
            return HK_ERR_FORMAT;
        r->q[r->nq++] = q;
        return 0;
    }
    return HK_ERR_FORMAT;
}

static int bad(hkl_rec *r, char *why, size_t n, int line, const char *what) {
    snprintf(why, n, "line %d: %s", line, what);
    hkl_rec_free(r);
    return HK_ERR_FORMAT;
}

int hkl_rec_parse(const char *text, size_t len, hkl_rec *r, char *why, size_t whyn) {
    memset(r, 0, sizeof *r);
    if (len > HKL_REC_MAX_BYTES)
        return bad(r, why, whyn, 0, "record too large");
    if (len == 0)
        return bad(r, why, whyn, 0, "empty record");
    size_t pos = 0;
    int line = 0, ended = 0;
    while (pos < len) {
        const char *s = text + pos;
        const char *nl = memchr(s, '\n', len - pos);
        line++;
        if (!nl)
            return bad(r, why, whyn, line, "cut short (no newline at the end)");
        size_t n = (size_t)(nl - s);
        pos += n + 1;
        if (n > LINE_MAX_BYTES)
            return bad(r, why, whyn, line, "line too long");
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
                return bad(r, why, whyn, line, "control character");
        if (ended)
            return bad(r, why, whyn, line, "text after 'end'");
        if (line == 1) {
            if (n != 16 || memcmp(s, "hotkern-record 1", 16))
                return bad(r, why, whyn, line, "not a hotkern record of format 1");
            continue;
        }
        if (line == 2) {
            if (n < 8 || n - 7 >= HKU_NAME_MAX || memcmp(s, "module ", 7))
                return bad(r, why, whyn, line, "expected 'module NAME'");
            memcpy(r->module, s + 7, n - 7);
            r->module[n - 7] = 0;
            if (hku_name_check(r->module, NULL, 0) < 0)
                return bad(r, why, whyn, line, "not a module name (UTF-8, no control character)");
            continue;
        }
        int k = parse_line(s, n, r);
        if (k == HK_ERR_NOMEM)
            return bad(r, why, whyn, line, "out of memory");
        if (k < 0)
            return bad(r, why, whyn, line, "malformed or repeated entry");
        ended = k == 1;
    }
    if (!ended)
        return bad(r, why, whyn, line, "cut short (no 'end')");
    if (r->nexpr && !r->good.has)
        return bad(r, why, whyn, line, "name expressions without a good image");
    return 0;
}

static int put(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int put(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0)
            return HK_ERR_NOMEM;
        if ((size_t)n < *cap - *len) {
            *len += (size_t)n;
            return 0;
        }
        char *b = realloc(*buf, *cap * 2 + (size_t)n);
        if (!b)
            return HK_ERR_NOMEM;
        *buf = b;
        *cap = *cap * 2 + (size_t)n;
    }
}

static int put_image(char **b, size_t *l, size_t *c, const char *key, const hkl_rec_image *im) {
    char hex[65];
    if (!im->has)
        return 0;
    hkl_hash_hex(im->hash, hex);
    return put(b, l, c, "%s %s %s %llu\n", key, hex, hk_format_name(im->format),
               (unsigned long long)im->release);
}

int hkl_rec_format(const hkl_rec *r, char **out, size_t *outlen) {
    size_t len = 0, cap = 512;
    char *b = malloc(cap);
    int e = !b;
    e = e || put(&b, &len, &cap, "hotkern-record 1\nmodule %s\n", r->module);
    e = e || put_image(&b, &len, &cap, "current", &r->current);
    e = e || put_image(&b, &len, &cap, "good", &r->good);
    for (int i = 0; !e && r->good.has && i < r->nexpr; i++)
        e = put(&b, &len, &cap, "expr %s %s\n", r->lowered[i], r->expr[i]);
    for (int i = 0; !e && i < r->nq; i++) {
        char hex[65];
        hkl_hash_hex(r->q[i].hash, hex);
        e = put(&b, &len, &cap, "quarantined %s %llu %llu\n", hex,
                (unsigned long long)r->q[i].release, (unsigned long long)r->q[i].version);
    }
    e = e || put(&b, &len, &cap, "end\n");
    if (e) {
        free(b);
        return HK_ERR_NOMEM;
    }
    /* Never write what the parser would refuse (a module name with a
     * control byte, more name expressions or longer names than a record
     * holds): that record would be lost at the next start, quarantine and
     * all. The caller keeps the previous record instead. */
    hkl_rec back;
    char why[160];
    memset(&back, 0, sizeof back);
    int bad = hkl_rec_parse(b, len, &back, why, sizeof why) < 0;
    hkl_rec_free(&back);
    if (bad) {
        free(b);
        return HK_ERR_TOO_LARGE;
    }
    *out = b;
    *outlen = len;
    return 0;
}

/*
 * Reports, copies and the rule for module names, shared by both libraries
 * (util/util.h). Allocation failures are reported, never fatal.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

int hku_fail(hk_report *rep, int err, const char *fmt, ...) {
    if (!rep)
        return err;
    rep->error = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rep->message, sizeof rep->message, fmt, ap);
    va_end(ap);
    return err;
}

void hku_strv_free(char **v, int n) {
    if (!v)
        return;
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

char **hku_strv_dup(const char *const *v, int n) {
    if (n <= 0 || !v)
        return NULL;
    char **out = calloc((size_t)n, sizeof *out);
    if (!out)
        return NULL;
    for (int i = 0; i < n; i++)
        if (!(out[i] = strdup(v[i] ? v[i] : ""))) {
            hku_strv_free(out, n);
            return NULL;
        }
    return out;
}

int hku_headers_dup(const hk_header *h, int n, hk_header **out) {
    size_t bytes = 0;
    if (!out || n < 0 || (n > 0 && !h))
        return HK_ERR_INVALID;
    *out = NULL;
    if (n == 0)
        return 0;
    for (int i = 0; i < n; i++) {
        if (!h[i].name || !h[i].name[0] || (!h[i].data && h[i].size))
            return HK_ERR_INVALID;
        size_t add = strlen(h[i].name) + 1 + h[i].size + 1;
        if (add < h[i].size || bytes + add < bytes)
            return HK_ERR_TOO_LARGE;
        bytes += add;
    }
    size_t head = (size_t)n * sizeof **out;
    if (bytes + head < bytes)
        return HK_ERR_TOO_LARGE;
    hk_header *v = malloc(head + bytes);
    if (!v)
        return HK_ERR_NOMEM;
    char *p = (char *)(v + n);
    for (int i = 0; i < n; i++) {
        size_t nl = strlen(h[i].name) + 1;
        memcpy(p, h[i].name, nl);
        v[i].name = p;
        p += nl;
        if (h[i].size)
            memcpy(p, h[i].data, h[i].size);
        p[h[i].size] = '\0';
        v[i].data = p;
        v[i].size = h[i].size;
        p += h[i].size + 1;
    }
    *out = v;
    return 0;
}

/* (util.h) The NUL ending s is never a continuation byte, so no read
 * goes past it. */
size_t hku_utf8_next(const unsigned char *s, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t n;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        lo = c == 0xe0 ? 0xa0 : 0x80; /* no overlong forms */
        hi = c == 0xed ? 0x9f : 0xbf; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        lo = c == 0xf0 ? 0x90 : 0x80;
        hi = c == 0xf4 ? 0x8f : 0xbf; /* nothing past U+10FFFF */
    } else {
        return 0;
    }
    if (s[1] < lo || s[1] > hi)
        return 0;
    uint32_t v = c & (0x7fu >> n);
    for (size_t i = 1; i < n; i++) {
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    *cp = v;
    return n;
}

int hku_name_check(const char *name, char *why, size_t why_size) {
    char local[8];
    if (!why || !why_size) {
        why = local;
        why_size = sizeof local;
    }
    if (!name || !name[0]) {
        snprintf(why, why_size, "empty module name");
        return HK_ERR_INVALID;
    }
    size_t len = strlen(name);
    if (len >= HKU_NAME_MAX) {
        snprintf(why, why_size, "module name of %zu bytes (the most is %d)", len, HKU_NAME_MAX - 1);
        return HK_ERR_INVALID;
    }
    const unsigned char *p = (const unsigned char *)name;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t n = hku_utf8_next(p + i, &cp);
        if (!n) {
            snprintf(why, why_size, "module name is not UTF-8 (byte 0x%02x at offset %zu)", p[i],
                     i);
            return HK_ERR_INVALID;
        }
        if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029) {
            snprintf(why, why_size, "module name holds control character U+%04X at offset %zu",
                     (unsigned)cp, i);
            return HK_ERR_INVALID;
        }
        i += n;
    }
    return 0;
}

/*
 * Reports and copies shared by both libraries (util/util.h). Allocation
 * failures are reported, never fatal.
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

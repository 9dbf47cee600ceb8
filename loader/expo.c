/*
 * The Prometheus text exposition writer (format 0.0.4) behind
 * hk_metrics_writer.
 *
 * Families are collected first and printed at the end, because the format
 * wants every sample of a family together, under one HELP and one TYPE, while
 * several writers add to one family: two pullers of a runtime each add
 * their series of hotkern_pull_requests_total. Each family keeps its samples
 * as text in a buffer of its own; hkl_mw_take joins them in the order the
 * families were first declared.
 *
 * Names are checked against the format's grammar and label values escaped
 * (backslash, double quote, newline), so no source can break a line or
 * forge a series. Values are integers, or seconds printed from integer
 * microseconds: never a double through %g.
 *
 * No runtime is needed here (the fuzzed endpoint links this file alone).
 * A writer belongs to one thread at a time.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/expo.h"

typedef struct hkl_mfam {
    char *name;
    char type[12];
    char *help;
    char *body; /* sample lines */
    size_t len, cap;
} hkl_mfam;

struct hk_metrics_writer {
    hkl_mfam *fam;
    int nfam, capfam;
    const char *base_label, *base_value; /* a source's own label, or NULL */
    int oom;                             /* an allocation failed: take says so */
};

hk_metrics_writer *hkl_mw_new(void) {
    return calloc(1, sizeof(hk_metrics_writer));
}

void hkl_mw_free(hk_metrics_writer *w) {
    if (!w)
        return;
    for (int i = 0; i < w->nfam; i++) {
        free(w->fam[i].name);
        free(w->fam[i].help);
        free(w->fam[i].body);
    }
    free(w->fam);
    free(w);
}

void hkl_mw_base(hk_metrics_writer *w, const char *label, const char *value) {
    w->base_label = label;
    w->base_value = label ? (value ? value : "") : NULL;
}

static int is_name(const char *s, int colon) {
    if (!s || !*s)
        return 0;
    for (const char *p = s; *p; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                 (colon && c == ':') || (p > s && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

static int label_name_ok(const char *s) {
    return is_name(s, 0) && strncmp(s, "__", 2) != 0;
}

/* Appends n bytes to *buf; sets w->oom on failure. */
static void put(hk_metrics_writer *w, char **buf, size_t *len, size_t *cap, const char *s,
                size_t n) {
    if (w->oom)
        return;
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *len + n + 1)
            nc *= 2;
        char *nb = realloc(*buf, nc);
        if (!nb) {
            w->oom = 1;
            return;
        }
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
}

static void puts_(hk_metrics_writer *w, hkl_mfam *f, const char *s) {
    put(w, &f->body, &f->len, &f->cap, s, strlen(s));
}

/* Appends value escaped for a label: \\, \" and \n. */
static void put_escaped(hk_metrics_writer *w, hkl_mfam *f, const char *value) {
    for (const char *p = value; *p; p++) {
        if (*p == '\\')
            puts_(w, f, "\\\\");
        else if (*p == '"')
            puts_(w, f, "\\\"");
        else if (*p == '\n')
            puts_(w, f, "\\n");
        else
            put(w, &f->body, &f->len, &f->cap, p, 1);
    }
}

static hkl_mfam *find(hk_metrics_writer *w, const char *name) {
    for (int i = 0; i < w->nfam; i++)
        if (!strcmp(w->fam[i].name, name))
            return &w->fam[i];
    return NULL;
}

void hkl_mw_family(hk_metrics_writer *w, const char *name, const char *type, const char *help) {
    if (!w || w->oom || !is_name(name, 1) || !type || strlen(type) >= sizeof w->fam->type ||
        find(w, name))
        return;
    if (w->nfam == w->capfam) {
        int nc = w->capfam ? 2 * w->capfam : 32;
        hkl_mfam *nf = realloc(w->fam, (size_t)nc * sizeof *nf);
        if (!nf) {
            w->oom = 1;
            return;
        }
        w->fam = nf;
        w->capfam = nc;
    }
    hkl_mfam *f = &w->fam[w->nfam];
    memset(f, 0, sizeof *f);
    f->name = strdup(name);
    f->help = strdup(help ? help : "");
    if (!f->name || !f->help) {
        free(f->name);
        free(f->help);
        w->oom = 1;
        return;
    }
    snprintf(f->type, sizeof f->type, "%s", type);
    w->nfam++;
}

void hk_metrics_family(hk_metrics_writer *w, const char *name, const char *type, const char *help) {
    if (!type || (strcmp(type, "counter") && strcmp(type, "gauge") && strcmp(type, "untyped")))
        return;
    hkl_mw_family(w, name, type, help);
}

/* Writes one sample line: name{base,labels} value. `label`/`lvalue` is one
 * more label to escape here (may be NULL), `labels` text already escaped. */
static void sample_line(hk_metrics_writer *w, hkl_mfam *f, const char *suffix, const char *label,
                        const char *lvalue, const char *labels, const char *value) {
    int n = 0;
    puts_(w, f, f->name);
    puts_(w, f, suffix);
    if (w->base_label) {
        puts_(w, f, n++ ? "," : "{");
        puts_(w, f, w->base_label);
        puts_(w, f, "=\"");
        put_escaped(w, f, w->base_value);
        puts_(w, f, "\"");
    }
    if (label) {
        puts_(w, f, n++ ? "," : "{");
        puts_(w, f, label);
        puts_(w, f, "=\"");
        put_escaped(w, f, lvalue ? lvalue : "");
        puts_(w, f, "\"");
    }
    if (labels && *labels) {
        puts_(w, f, n++ ? "," : "{");
        puts_(w, f, labels);
    }
    puts_(w, f, n ? "} " : " ");
    puts_(w, f, value);
    puts_(w, f, "\n");
}

void hkl_mw_sample(hk_metrics_writer *w, const char *family, const char *suffix, const char *labels,
                   const char *value) {
    hkl_mfam *f = w && !w->oom ? find(w, family) : NULL;
    if (f)
        sample_line(w, f, suffix ? suffix : "", NULL, NULL, labels, value);
}

void hk_metrics_sample(hk_metrics_writer *w, const char *name, const char *label,
                       const char *label_value, uint64_t value) {
    char v[24];
    hkl_mfam *f = w && !w->oom && name ? find(w, name) : NULL;
    if (!f || (label && !label_name_ok(label)) ||
        (label && w->base_label && !strcmp(label, w->base_label)))
        return;
    snprintf(v, sizeof v, "%" PRIu64, value);
    sample_line(w, f, "", label, label_value, NULL, v);
}

void hk_metrics_sample_labels(hk_metrics_writer *w, const char *name, const char *const *names,
                              const char *const *values, int n, uint64_t value) {
    char v[24];
    hkl_mfam *f = w && !w->oom && name ? find(w, name) : NULL;
    if (!f || n < 0 || n > 8 || (n && (!names || !values)))
        return;
    for (int i = 0; i < n; i++) {
        if (!label_name_ok(names[i]) || (w->base_label && !strcmp(names[i], w->base_label)))
            return;
        for (int j = 0; j < i; j++)
            if (!strcmp(names[i], names[j]))
                return;
    }
    snprintf(v, sizeof v, "%" PRIu64, value);
    /* The first label through sample_line, the others as escaped text. */
    hkl_mfam tmp = {0};
    for (int i = 1; i < n; i++) {
        puts_(w, &tmp, i > 1 ? "," : "");
        puts_(w, &tmp, names[i]);
        puts_(w, &tmp, "=\"");
        put_escaped(w, &tmp, values[i] ? values[i] : "");
        puts_(w, &tmp, "\"");
    }
    if (!w->oom)
        sample_line(w, f, "", n ? names[0] : NULL, n ? values[0] : NULL, tmp.body, v);
    free(tmp.body);
}

/* HELP text escapes backslash and newline. */
static void put_help(hk_metrics_writer *w, char **buf, size_t *len, size_t *cap, const char *s) {
    for (const char *p = s; *p; p++) {
        if (*p == '\\')
            put(w, buf, len, cap, "\\\\", 2);
        else if (*p == '\n')
            put(w, buf, len, cap, "\\n", 2);
        else
            put(w, buf, len, cap, p, 1);
    }
}

int hkl_mw_take(hk_metrics_writer *w, char **out, size_t *len) {
    char *buf = NULL;
    size_t n = 0, cap = 0;
    *out = NULL;
    if (len)
        *len = 0;
    if (!w)
        return HK_ERR_NOMEM;
    put(w, &buf, &n, &cap, "", 0); /* an empty text is "" */
    for (int i = 0; i < w->nfam && !w->oom; i++) {
        const hkl_mfam *f = &w->fam[i];
        size_t nl = strlen(f->name);
        put(w, &buf, &n, &cap, "# HELP ", 7);
        put(w, &buf, &n, &cap, f->name, nl);
        put(w, &buf, &n, &cap, " ", 1);
        put_help(w, &buf, &n, &cap, f->help);
        put(w, &buf, &n, &cap, "\n# TYPE ", 8);
        put(w, &buf, &n, &cap, f->name, nl);
        put(w, &buf, &n, &cap, " ", 1);
        put(w, &buf, &n, &cap, f->type, strlen(f->type));
        put(w, &buf, &n, &cap, "\n", 1);
        if (f->len)
            put(w, &buf, &n, &cap, f->body, f->len);
    }
    int oom = w->oom;
    hkl_mw_free(w);
    if (oom) {
        free(buf);
        return HK_ERR_NOMEM;
    }
    *out = buf;
    if (len)
        *len = n;
    return 0;
}

void hkl_fmt_seconds(char *buf, size_t n, uint64_t us) {
    uint64_t s = us / 1000000, frac = us % 1000000;
    if (!frac) {
        snprintf(buf, n, "%" PRIu64, s);
        return;
    }
    int digits = 6;
    while (frac % 10 == 0) {
        frac /= 10;
        digits--;
    }
    snprintf(buf, n, "%" PRIu64 ".%0*" PRIu64, s, digits, frac);
}

/*
 * The metadata's base: what every parser of ptx/meta*.c shares (ptx/meta.h).
 *
 * The life of an hkp_meta (free, copy) and the builder the parsers fill
 * (growing arrays whose every size is bounded, ptx/meta.h's limits), the
 * architecture names and which image runs on which device, and hkp_why, the
 * reason of a refusal for every file of ptx/. No state; thread-safe.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/meta.h"

void hkp_why(char *why, size_t why_size, const char *fmt, ...) {
    if (!why || !why_size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_size, fmt, ap);
    va_end(ap);
}

const char *hkp_arch_name(int arch, char *buf, size_t n) {
    if (!buf || !n)
        return "";
    if (HKP_ARCH_NUM(arch) == 0)
        snprintf(buf, n, "sm_?");
    else
        snprintf(buf, n, "sm_%d%s", HKP_ARCH_NUM(arch),
                 (arch & HKP_ARCH_SPECIFIC) ? "a"
                 : (arch & HKP_ARCH_FAMILY) ? "f"
                                            : "");
    return buf;
}

int hkp_arch_runs_on(int image_arch, int device_arch) {
    int img = HKP_ARCH_NUM(image_arch), dev = HKP_ARCH_NUM(device_arch);
    if (img <= 0 || dev <= 0)
        return 0;
    if (image_arch & HKP_ARCH_SPECIFIC)
        return img == dev;
    return img / 10 == dev / 10 && img % 10 <= dev % 10;
}

/* PTX compiles forward to any newer device, except arch-specific PTX. */
static int ptx_runs_on(int ptx_arch, int device_arch) {
    int img = HKP_ARCH_NUM(ptx_arch), dev = HKP_ARCH_NUM(device_arch);
    if (img <= 0 || dev <= 0)
        return 0;
    if (ptx_arch & HKP_ARCH_SPECIFIC)
        return img == dev;
    return img <= dev;
}

int hkp_meta_runs_on(const hkp_meta *m, int device_arch) {
    if (!m)
        return 0;
    switch (m->format) {
    case HK_FORMAT_CUBIN:
        return hkp_arch_runs_on(m->arch, device_arch);
    case HK_FORMAT_PTX:
        return ptx_runs_on(m->arch, device_arch);
    case HK_FORMAT_FATBIN:
        for (int i = 0; i < m->narchs; i++)
            if (hkp_arch_runs_on(m->archs[i], device_arch))
                return 1;
        for (int i = 0; i < m->nptx_archs; i++)
            if (ptx_runs_on(m->ptx_archs[i], device_arch))
                return 1;
        return 0;
    default:
        return 0;
    }
}

void hkp_meta_free(hkp_meta *m) {
    if (!m)
        return;
    for (int i = 0; i < m->nentries; i++) {
        free(m->entries[i].name);
        free(m->entries[i].params);
    }
    free(m->entries);
    for (int i = 0; i < m->nglobals; i++)
        free(m->globals[i].name);
    free(m->globals);
    memset(m, 0, sizeof *m);
}

int hkp_meta_dup(const hkp_meta *om, hkp_meta *nm) {
    *nm = *om; /* the plain fields; the arrays are copied below */
    nm->entries = om->nentries ? calloc((size_t)om->nentries, sizeof *nm->entries) : NULL;
    nm->globals = om->nglobals ? calloc((size_t)om->nglobals, sizeof *nm->globals) : NULL;
    nm->nentries = nm->entries ? om->nentries : 0;
    nm->nglobals = nm->globals ? om->nglobals : 0;
    int ok = nm->nentries == om->nentries && nm->nglobals == om->nglobals;
    for (int i = 0; ok && i < om->nentries; i++) {
        const hkp_entry *f = &om->entries[i];
        size_t bytes = (size_t)f->nparams * sizeof *f->params;
        nm->entries[i].nparams = f->nparams;
        ok = (nm->entries[i].name = strdup(f->name)) &&
             (!bytes || (nm->entries[i].params = malloc(bytes)));
        if (ok && bytes)
            memcpy(nm->entries[i].params, f->params, bytes);
    }
    for (int i = 0; ok && i < om->nglobals; i++) {
        nm->globals[i] = om->globals[i];
        ok = (nm->globals[i].name = strdup(om->globals[i].name)) != NULL;
    }
    if (ok)
        return 0;
    hkp_meta_free(nm);
    return HK_ERR_NOMEM;
}

/* ---- growing arrays ------------------------------------------------------ */

int hkp_grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap)
        return 0;
    int ncap = *cap ? *cap : 8;
    while (ncap < need) {
        if (ncap > (1 << 24))
            return HK_ERR_TOO_LARGE;
        ncap *= 2;
    }
    void *p = realloc(*arr, (size_t)ncap * elem);
    if (!p)
        return HK_ERR_NOMEM;
    *arr = p;
    *cap = ncap;
    return 0;
}

char *hkp_dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* Takes ownership of name and params (also on failure). */
int hkp_meta_add_entry(struct meta_builder *b, char *name, hkp_param *params, int nparams) {
    int rc =
        name ? hkp_grow((void **)&b->m->entries, &b->ecap, b->m->nentries + 1, sizeof(hkp_entry))
             : HK_ERR_NOMEM;
    if (rc) {
        free(name);
        free(params);
        return rc;
    }
    hkp_entry *e = &b->m->entries[b->m->nentries++];
    e->name = name;
    e->params = params;
    e->nparams = nparams;
    return 0;
}

int hkp_meta_add_global(struct meta_builder *b, const char *name, size_t n, uint64_t size,
                        int is_const) {
    char *d = hkp_dup_n(name, n);
    int rc = d ? hkp_grow((void **)&b->m->globals, &b->gcap, b->m->nglobals + 1, sizeof(hkp_global))
               : HK_ERR_NOMEM;
    if (rc) {
        free(d);
        return rc;
    }
    hkp_global *g = &b->m->globals[b->m->nglobals++];
    g->name = d;
    g->size = size;
    g->is_const = is_const;
    return 0;
}

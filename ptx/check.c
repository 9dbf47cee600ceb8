/*
 * hk_check and hk_checker: a swap's build on its own, with no driver.
 *
 * The public options are taken in by size (base/abi.h), checked, and
 * turned into hkp_build_opts once: a checker owns copies of every array and
 * string the options point to, the include search prepared from them
 * (hkp_search) and the build options that point into both, and asks for
 * NVRTC's PCH, since it is made to compile more than once. hk_check is a
 * checker made for one source, without the PCH: a single compile would pay
 * for creating it and never use it. A check is hkp_build with the checker's
 * options and the source's name, on the caller's thread; nothing here calls
 * the driver or the engine: a check is ptx/'s.
 *
 * A result is a copy of what the artifact and its metadata say (image, log,
 * kernels and their layouts, globals, architecture names), one object of its
 * own: it outlives the checker that made it.
 *
 * Threads: a checker is immutable once made, so several threads may check
 * with one at once (hkp_build is thread-safe; the PCH heap has its lock in
 * ptx/nvrtc.c). Results are immutable too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/abi.h"
#include "ptx/ptx.h"
#include "util/util.h"

struct hk_checker {
    /* All immutable after hk_checker_create. */
    hk_check_options opt; /* the library's layout; its pointers are replaced
                           * by the copies below */
    char **nvrtc_options, **name_expressions;
    hk_header *headers; /* one allocation (hku_headers_dup) */
    char *source_name;
    hkp_search *search; /* points into nvrtc_options */
    hkp_build_opts bo;  /* points into all of the above */
};

typedef struct check_kernel {
    char *name;
    int nparams;
    size_t *offsets, *sizes;
} check_kernel;

typedef struct check_global {
    char *name;
    uint64_t size;
    int is_const;
} check_global;

#define MAX_ARCHS 32 /* a fatbin's 16 SASS and 16 PTX architectures */

struct hk_check_result {
    /* All immutable once made. */
    hk_format format;       /* the source's */
    hk_format image_format; /* PTX, CUBIN or FATBIN */
    void *image;
    size_t image_size;
    char *log;
    check_kernel *kernels;
    int nkernels;
    check_global *globals;
    int nglobals;
    char archs[MAX_ARCHS][24];
    int narchs;
};

/* ---- options ------------------------------------------------------------ */

/* The defaults, one a line (the shape of every hk_*_options_init_size). */
int hk_check_options_init_size(hk_check_options *o, size_t size) {
    hk_check_options d;
    memset(&d, 0, sizeof d);
    d.format = HK_FORMAT_AUTO;
    d.ptx_mode = HK_PTX_NVJITLINK;
    d.jit_opt_level = 4;
    d.build_profile = HK_BUILD_PROFILE_DEFAULT;
    return hkb_sized_init(o, size, &d, sizeof d, HKB_CHECK_OPTIONS_SIZE0);
}

/* 1 when each of the n strings of v is there. */
static int strings_ok(const char *const *v, int n) {
    if (n < 0 || (n > 0 && !v))
        return 0;
    for (int i = 0; i < n; i++)
        if (!v[i])
            return 0;
    return 1;
}

/* What is wrong with o (the library's layout), or NULL. */
static const char *options_problem(const hk_check_options *o) {
    if (o->arch < 10 || o->arch > 9999)
        return "arch must be the target's SM, 10 to 9999 (90 for sm_90)";
    if (o->arch_specific != 0 && o->arch_specific != 1)
        return "arch_specific must be 0 or 1";
    if (o->format < HK_FORMAT_AUTO || o->format > HK_FORMAT_FATBIN)
        return "unknown format";
    if (o->ptx_mode != HK_PTX_NVJITLINK && o->ptx_mode != HK_PTX_DRIVER_JIT)
        return "unknown ptx_mode";
    if (o->jit_opt_level < 0 || o->jit_opt_level > 4)
        return "jit_opt_level must be 0 to 4";
    if (o->build_profile < HK_BUILD_PROFILE_DEFAULT || o->build_profile > HK_BUILD_PROFILE_DEV)
        return "unknown build_profile";
    if (!strings_ok(o->nvrtc_options, o->nnvrtc_options))
        return "nvrtc_options: a negative count, or a NULL array or entry";
    if (!strings_ok(o->name_expressions, o->nname_expressions))
        return "name_expressions: a negative count, or a NULL array or entry";
    if (o->nheaders < 0 || (o->nheaders > 0 && !o->headers))
        return "headers: a negative count, or a NULL array";
    return NULL;
}

/* Takes the caller's options into o (the library's layout, defaults where
 * the caller's size ends) and checks them. */
static int options_in(hk_check_options *o, const hk_check_options *in, hk_report *rep) {
    hk_check_options_init(o);
    if (!in)
        return hku_fail(rep, HK_ERR_INVALID, "check options needed (the target arch at least)");
    if (hkb_sized_in(o, sizeof *o, in, HKB_CHECK_OPTIONS_SIZE0) < 0)
        return hku_fail(rep, HK_ERR_INVALID, "hk_check_options.size %zu is below the first layout",
                        hkb_size_of(in));
    const char *problem = options_problem(o);
    return problem ? hku_fail(rep, HK_ERR_INVALID, "check options: %s", problem) : 0;
}

/* ---- checkers ----------------------------------------------------------- */

void hk_checker_destroy(hk_checker *c) {
    if (!c)
        return;
    hkp_search_free(c->search);
    hku_strv_free(c->nvrtc_options, c->opt.nnvrtc_options);
    hku_strv_free(c->name_expressions, c->opt.nname_expressions);
    free(c->headers);
    free(c->source_name);
    free(c);
}

/* Copies what o points to into c, and points c->opt at the copies. */
static int checker_copy(hk_checker *c, const hk_check_options *o, hk_report *rep) {
    c->opt = *o;
    c->opt.nvrtc_options = NULL;
    c->opt.name_expressions = NULL;
    c->opt.headers = NULL;
    c->opt.source_name = NULL;
    c->nvrtc_options = hku_strv_dup(o->nvrtc_options, o->nnvrtc_options);
    c->name_expressions = hku_strv_dup(o->name_expressions, o->nname_expressions);
    if ((o->nnvrtc_options && !c->nvrtc_options) ||
        (o->nname_expressions && !c->name_expressions) ||
        (o->source_name && !(c->source_name = strdup(o->source_name))))
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    int rc = hku_headers_dup(o->headers, o->nheaders, &c->headers);
    if (rc)
        return hku_fail(rep, rc, "check options: headers: %s",
                        rc == HK_ERR_INVALID ? "a header without a name, or NULL data with a size"
                                             : hk_strerror(rc));
    c->opt.nvrtc_options = (const char *const *)c->nvrtc_options;
    c->opt.name_expressions = (const char *const *)c->name_expressions;
    c->opt.headers = c->headers;
    c->opt.source_name = c->source_name;
    return 0;
}

/* Makes a checker of o (the library's layout, checked); pch as
 * hkp_build_opts.pch. */
static int checker_make(hk_checker **out, const hk_check_options *o, int pch, hk_report *rep) {
    char why[512] = "";
    *out = NULL;
    hk_checker *c = calloc(1, sizeof *c);
    if (!c)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    int rc = checker_copy(c, o, rep);
    if (rc) {
        hk_checker_destroy(c);
        return rc;
    }
    c->bo = (hkp_build_opts){
        .arch = o->arch | (o->arch_specific ? HKP_ARCH_SPECIFIC : 0),
        .ptx_to_cubin = o->ptx_mode == HK_PTX_NVJITLINK,
        .opt_level = o->jit_opt_level,
        .nvrtc_options = c->opt.nvrtc_options,
        .nnvrtc_options = c->opt.nnvrtc_options,
        .name_expressions = c->opt.name_expressions,
        .nname_expressions = c->opt.nname_expressions,
        .source_name = c->source_name,
        .headers = c->headers,
        .nheaders = c->opt.nheaders,
        .pch = pch,
        .fast_compile = o->build_profile == HK_BUILD_PROFILE_DEV,
        .target_name = "target",
    };
    if ((rc = hkp_search_create(&c->bo, &c->search, why, sizeof why)) != 0) {
        hk_checker_destroy(c);
        return hku_fail(rep, rc, "check options: %s", why[0] ? why : hk_strerror(rc));
    }
    c->bo.search = c->search;
    *out = c;
    return 0;
}

int hk_checker_create(hk_checker **out, const hk_check_options *opt, hk_report *rep) {
    hk_report full;
    if (out)
        *out = NULL;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    hk_report_clear(&full);
    hk_check_options o;
    int rc = !out ? hku_fail(&full, HK_ERR_INVALID, "hk_checker_create: out needed")
                  : options_in(&o, opt, &full);
    if (!rc)
        rc = checker_make(out, &o, 1, &full);
    hkb_report_out(rep, &full);
    return rc;
}

/* ---- results ------------------------------------------------------------ */

void hk_check_result_free(hk_check_result *r) {
    if (!r)
        return;
    for (int i = 0; i < r->nkernels; i++) {
        free(r->kernels[i].name);
        free(r->kernels[i].offsets);
        free(r->kernels[i].sizes);
    }
    for (int i = 0; i < r->nglobals; i++)
        free(r->globals[i].name);
    free(r->kernels);
    free(r->globals);
    free(r->image);
    free(r->log);
    free(r);
}

static int copy_kernels(hk_check_result *r, const hkp_meta *m) {
    if (m->nentries > 0 && !(r->kernels = calloc((size_t)m->nentries, sizeof *r->kernels)))
        return HK_ERR_NOMEM;
    for (int i = 0; i < m->nentries; i++) {
        const hkp_entry *e = &m->entries[i];
        check_kernel *k = &r->kernels[r->nkernels++];
        size_t n = e->nparams > 0 ? (size_t)e->nparams : 1;
        k->name = strdup(e->name);
        k->offsets = calloc(n, sizeof *k->offsets);
        k->sizes = calloc(n, sizeof *k->sizes);
        if (!k->name || !k->offsets || !k->sizes)
            return HK_ERR_NOMEM;
        for (int j = 0; j < e->nparams; j++) {
            k->offsets[j] = e->params[j].offset;
            k->sizes[j] = e->params[j].size;
        }
        k->nparams = e->nparams;
    }
    return 0;
}

static int copy_globals(hk_check_result *r, const hkp_meta *m) {
    if (m->nglobals > 0 && !(r->globals = calloc((size_t)m->nglobals, sizeof *r->globals)))
        return HK_ERR_NOMEM;
    for (int i = 0; i < m->nglobals; i++) {
        check_global *g = &r->globals[r->nglobals++];
        if (!(g->name = strdup(m->globals[i].name)))
            return HK_ERR_NOMEM;
        g->size = m->globals[i].size;
        g->is_const = m->globals[i].is_const;
    }
    return 0;
}

/* "sm_90" (machine code) or "compute_90" (PTX) into r's list. */
static void add_arch(hk_check_result *r, int arch, int ptx) {
    char name[16];
    if (r->narchs >= MAX_ARCHS || !arch)
        return;
    hkp_arch_name(arch, name, sizeof name);
    snprintf(r->archs[r->narchs++], sizeof r->archs[0], "%s%s", ptx ? "compute_" : "",
             ptx ? name + 3 : name);
}

static void copy_archs(hk_check_result *r, const hkp_meta *m) {
    if (m->format != HK_FORMAT_FATBIN) {
        add_arch(r, m->arch, m->format == HK_FORMAT_PTX);
        return;
    }
    for (int i = 0; i < m->narchs; i++)
        add_arch(r, m->archs[i], 0);
    for (int i = 0; i < m->nptx_archs; i++)
        add_arch(r, m->ptx_archs[i], 1);
}

/* Takes a's image and log into a new result, and copies its metadata. */
static int result_make(hkp_artifact *a, hk_format format, hk_check_result **out) {
    hk_check_result *r = calloc(1, sizeof *r);
    if (!r)
        return HK_ERR_NOMEM;
    r->format = format;
    r->image_format = a->format;
    r->image = a->image;
    r->image_size = a->size;
    r->log = a->log;
    a->image = NULL;
    a->log = NULL;
    int rc = 0;
    if (a->meta.format == HK_FORMAT_FATBIN && a->meta.nentries == 0) {
        /* A fatbin's metadata has its architectures only; its kernels are
         * those of the members stored plain. */
        hkp_meta fk;
        rc = hkp_fatbin_kernels(r->image, r->image_size, &fk, NULL);
        if (!rc)
            rc = copy_kernels(r, &fk);
        hkp_meta_free(&fk);
        rc = rc == HK_ERR_NOMEM ? rc : 0;
    } else {
        rc = copy_kernels(r, &a->meta);
    }
    if (!rc)
        rc = copy_globals(r, &a->meta);
    if (rc) {
        hk_check_result_free(r);
        return rc;
    }
    copy_archs(r, &a->meta);
    *out = r;
    return 0;
}

/* ---- checks ------------------------------------------------------------- */

/* One check with c, into the full report rep. */
static int checker_run(const hk_checker *c, const char *source_name, const void *src, size_t size,
                       hk_check_result **out, hk_report *rep) {
    char why[512] = "";
    hk_format fmt = c->opt.format;
    hkp_artifact art;
    if (!src && size)
        return hku_fail(rep, HK_ERR_INVALID, "no source (NULL with a size)");
    if (fmt == HK_FORMAT_AUTO) {
        int rc = hkp_detect(src, size, &fmt, why, sizeof why);
        if (rc)
            return hku_fail(rep, rc, "%s", why);
    }
    hkp_build_opts bo = c->bo;
    if (source_name)
        bo.source_name = source_name;
    int rc = hkp_build(src, size, fmt, &bo, &art, why, sizeof why);
    rep->build_ms = art.ms;
    if (rc) {
        hku_fail(rep, rc, "%s", why[0] ? why : hk_strerror(rc));
        if (art.log && !(rep->log = strdup(art.log)))
            rc = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    } else if ((rc = result_make(&art, fmt, out)) != 0) {
        hku_fail(rep, rc, "out of memory");
    }
    hkp_artifact_free(&art);
    return rc;
}

/* hk_checker_check: the caller's report taken in and given back, timed. */
static int check_call(const hk_checker *c, const char *source_name, const void *src, size_t size,
                      hk_check_result **out, hk_report *rep) {
    double t0 = hku_now_ms();
    hk_report full;
    if (out)
        *out = NULL;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    hk_report_clear(&full);
    int rc = !c || !out ? hku_fail(&full, HK_ERR_INVALID, "a checker and out needed")
                        : checker_run(c, source_name, src, size, out, &full);
    full.total_ms = hku_now_ms() - t0;
    hkb_report_out(rep, &full);
    return rc;
}

int hk_checker_check(hk_checker *c, const char *source_name, const void *src, size_t size,
                     hk_check_result **out, hk_report *rep) {
    return check_call(c, source_name, src, size, out, rep);
}

/* One report taken in and given back, and timed, for the whole check:
 * options, the checker (one compile: no PCH) and its run. */
int hk_check(const hk_check_options *opt, const void *src, size_t size, hk_check_result **out,
             hk_report *rep) {
    double t0 = hku_now_ms();
    hk_report full;
    hk_check_options o;
    hk_checker *c = NULL;
    if (out)
        *out = NULL;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    hk_report_clear(&full);
    int rc = options_in(&o, opt, &full);
    if (!rc)
        rc = checker_make(&c, &o, 0, &full);
    if (!rc)
        rc = !out ? hku_fail(&full, HK_ERR_INVALID, "a checker and out needed")
                  : checker_run(c, NULL, src, size, out, &full);
    hk_checker_destroy(c);
    full.total_ms = hku_now_ms() - t0;
    hkb_report_out(rep, &full);
    return rc;
}

int hk_format_detect(const void *data, size_t size, hk_format *fmt, hk_report *rep) {
    hk_report full;
    char why[256] = "";
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    hk_report_clear(&full);
    int rc = HK_ERR_INVALID;
    if (!fmt || (!data && size))
        hku_fail(&full, rc, "hk_format_detect: fmt and the data needed");
    else if ((rc = hkp_detect(data, size, fmt, why, sizeof why)) != 0)
        hku_fail(&full, rc, "%s", why);
    hkb_report_out(rep, &full);
    return rc;
}

/* ---- accessors ---------------------------------------------------------- */

hk_format hk_check_result_format(const hk_check_result *r) {
    return r ? r->format : HK_FORMAT_AUTO;
}

const void *hk_check_result_image(const hk_check_result *r, size_t *size, hk_format *format) {
    if (size)
        *size = r ? r->image_size : 0;
    if (format)
        *format = r ? r->image_format : HK_FORMAT_AUTO;
    return r ? r->image : NULL;
}

const char *hk_check_result_log(const hk_check_result *r) {
    return r && r->log && r->log[0] ? r->log : NULL;
}

int hk_check_result_kernel_count(const hk_check_result *r) {
    return r ? r->nkernels : 0;
}

int hk_check_result_kernel(const hk_check_result *r, int i, const char **name,
                           const size_t **offsets, const size_t **sizes) {
    if (!r)
        return HK_ERR_INVALID;
    if (i < 0 || i >= r->nkernels)
        return HK_ERR_NOT_FOUND;
    const check_kernel *k = &r->kernels[i];
    if (name)
        *name = k->name;
    if (offsets)
        *offsets = k->offsets;
    if (sizes)
        *sizes = k->sizes;
    return k->nparams;
}

int hk_check_result_global_count(const hk_check_result *r) {
    return r ? r->nglobals : 0;
}

int hk_check_result_global(const hk_check_result *r, int i, const char **name, uint64_t *size,
                           int *is_const) {
    if (!r)
        return HK_ERR_INVALID;
    if (i < 0 || i >= r->nglobals)
        return HK_ERR_NOT_FOUND;
    if (name)
        *name = r->globals[i].name;
    if (size)
        *size = r->globals[i].size;
    if (is_const)
        *is_const = r->globals[i].is_const;
    return 0;
}

int hk_check_result_arch_count(const hk_check_result *r) {
    return r ? r->narchs : 0;
}

const char *hk_check_result_arch(const hk_check_result *r, int i) {
    return r && i >= 0 && i < r->narchs ? r->archs[i] : NULL;
}

/*
 * The program's own kernels and globals ("expected"): what a source that
 * routes the program's launches (interpose/, the <<<>>> interposition) tells
 * the engine about the code the program was built with, so that a hot
 * version of one of those kernels is held to the program's parameter layout
 * and takes over the program's globals.
 *
 * A kernel is expected by its entry name as the driver reports it (a C name,
 * or a mangled C++ name) with the layout the program's call sites pass. A
 * version of any module that has an entry of that name adopts the kernel in
 * its swap: the swap makes it a handle of that module with the expected,
 * fixed layout (hk_kernel_require_layout's rule), so the validation that
 * every handle gets refuses a version whose layout differs, naming the kernel
 * and the difference; the commit publishes the handle (hkl_expect_handle),
 * and from then on that module must keep the kernel. The first module to
 * commit such a version owns the kernel; a same-named kernel in another
 * module is ignored, and said so once.
 *
 * The program's globals: expect_global.c.
 *
 * Template kernels: the program launches an instantiation (scale<float>),
 * which a hot build compiles only when it is named. A kernel expected with a
 * name expression gets that expression added to the builds of CUDA C that
 * declare a __global__ template of that name (hkl_expect_exprs). An
 * instance first launched after its module's source was built (blur<3>
 * while the build for blur<2> ran, or after it committed) is late: the
 * module's last committed CUDA C source, kept for this (hkl_expect_keep),
 * is built again once with the new expression (hkl_expect_take_late, which
 * the worker submits), so the instance follows without a new save.
 *
 * Identity: a kernel or global is registered with the translation unit the
 * program registered it from, and a module reaches it only when
 * hkl_tu_owns says the module is that file's (expect_tu.c): nvcc gives
 * file-local kernels and variables the same names in every file.
 *
 * Locks: expect_lock (runtime) is a leaf that covers the lists and each
 * entry's mutable fields; the adoption and the binding run under swap_lock
 * too (they make handles). `k` is published with a release store and read
 * without a lock by the launching thread.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/context.h"
#include "loader/expect.h"
#include "loader/gate.h"
#include "loader/job.h"
#include "loader/launch.h"
#include "loader/log.h"
#include "loader/version.h"

struct hkl_expect {
    /* immutable */
    char *name; /* entry name: C or mangled */
    char *expr; /* name expression that instantiates it, or NULL */
    char *base; /* expr's template name (scale for scale<float>), or NULL */
    hkl_param_layout layout;
    unsigned tu;                   /* immutable: the translation unit it was registered from
                                    * (0: unknown) */
    _Atomic(hk_kernel *) k;        /* the handle launches go to: swap_lock or expect_lock
                                    * to write (NULL again after a fallback), read
                                    * without a lock */
    hk_kernel *home;               /* swap_lock and expect_lock to write, either to read:
                                    * the owning module's handle, also while the
                                    * module runs the program's code */
    hkl_use use;                   /* the launching threads (atomics) */
    hkl_attr attrs[HKL_MAX_ATTRS]; /* swap_lock: set by the program (hkl_expect_set_attr) */
    int nattrs;                    /* swap_lock */
    int cache_config;              /* swap_lock; -1: none */
    int warned;                    /* expect_lock: a same-named kernel elsewhere was reported */
    hkl_expect *next;              /* expect_lock */
};

/* A module's last committed CUDA C source and what its build needs again. */
typedef struct hkl_kept_src {
    char module[HKL_NAME_MAX];
    char *src;
    size_t len;
    char **opts; /* its NVRTC options */
    int nopts;
    char **exprs; /* its name expressions */
    int nexprs;
    char *source_name;
    hk_header *headers; /* one allocation (hku_headers_dup) */
    int nheaders;
    uint64_t seq; /* its job's submission number: a later save wins */
    int late;     /* a program's template instance it declares is not in it */
    struct hkl_kept_src *next;
} hkl_kept_src;

static void kept_free(hkl_kept_src *k) {
    if (!k)
        return;
    free(k->src);
    hku_strv_free(k->opts, k->nopts);
    hku_strv_free(k->exprs, k->nexprs);
    free(k->source_name);
    free(k->headers);
    free(k);
}

hk_kernel *hkl_expect_handle(const hkl_expect *e) {
    return atomic_load_explicit(&((hkl_expect *)e)->k, memory_order_acquire);
}

const char *hkl_expect_name(const hkl_expect *e) {
    return e->name;
}

hkl_use *hkl_expect_use(hkl_expect *e) {
    return &e->use;
}

/* Puts attribute attr (-1: cache config) = value in a handle's or an
 * entry's list; 0, or HK_ERR_INVALID when the list is full. */
static int attr_put(int *nattrs, hkl_attr *at, int *cache, int attr, int value) {
    if (attr < 0) {
        *cache = value;
        return 0;
    }
    int i = 0;
    while (i < *nattrs && at[i].attr != attr)
        i++;
    if (i == HKL_MAX_ATTRS)
        return HK_ERR_INVALID;
    at[i] = (hkl_attr){attr, value};
    *nattrs += i == *nattrs;
    return 0;
}

/* The program's attributes of e into handle k (swap_lock held). */
static void attrs_into(hk_kernel *k, const hkl_expect *e) {
    for (int i = 0; i < e->nattrs; i++)
        attr_put(&k->nattrs, k->attrs, &k->cache_config, e->attrs[i].attr, e->attrs[i].value);
    if (e->cache_config >= 0)
        k->cache_config = e->cache_config;
}

static int layout_copy(hkl_param_layout *to, const hkl_param_layout *from) {
    memset(to, 0, sizeof *to);
    if (from->n <= 0)
        return 0;
    to->offset = malloc((size_t)from->n * sizeof *to->offset);
    to->size = malloc((size_t)from->n * sizeof *to->size);
    if (!to->offset || !to->size) {
        hkl_layout_free(to);
        return HK_ERR_NOMEM;
    }
    memcpy(to->offset, from->offset, (size_t)from->n * sizeof *to->offset);
    memcpy(to->size, from->size, (size_t)from->n * sizeof *to->size);
    to->n = from->n;
    return 0;
}

/* The template name of a name expression: "scale" for "scale<float>" or
 * "ns::scale<float, 2>"; NULL when it names no template. */
static char *expr_base(const char *expr) {
    const char *lt = strchr(expr, '<');
    if (!lt)
        return NULL;
    const char *end = lt;
    while (end > expr && isspace((unsigned char)end[-1]))
        end--;
    const char *start = end;
    while (start > expr && (isalnum((unsigned char)start[-1]) || start[-1] == '_'))
        start--;
    if (start == end)
        return NULL;
    return strndup(start, (size_t)(end - start));
}

static hkl_expect *find_kernel(hk_runtime *rt, const char *name, unsigned tu) {
    for (hkl_expect *e = rt->expect.kernels; e; e = e->next)
        if (e->tu == tu && !strcmp(e->name, name))
            return e;
    return NULL;
}

/* v's metadata entry called name, or NULL. */
static const hkp_entry *entry_of(const hkl_version *v, const char *name) {
    for (int i = 0; i < v->art.meta.nentries; i++)
        if (!strcmp(v->art.meta.entries[i].name, name))
            return &v->art.meta.entries[i];
    return NULL;
}

static hk_kernel *handle_in(const hkl_module *m, const char *name) {
    for (int i = 0; i < m->nkernels; i++)
        if (!strcmp(m->kernels[i]->name, name))
            return m->kernels[i];
    return NULL;
}

/* A new handle of m for e, with e's fixed layout, appended to m's handles
 * (slot resolved by the caller). swap_lock held. NULL: no memory. */
static hk_kernel *handle_new(hk_runtime *rt, hkl_module *m, const hkl_expect *e) {
    if (hkl_kernels_reserve(m) < 0)
        return NULL;
    hk_kernel *k = calloc(1, sizeof *k);
    if (!k || !(k->name = strdup(e->name)) || layout_copy(&k->layout, &e->layout) < 0) {
        if (k)
            free(k->name);
        free(k);
        return NULL;
    }
    k->rt = rt;
    k->mod = m;
    k->slot = m->nkernels;
    k->cache_config = -1;
    k->fixed_layout = 1;
    k->expect = (hkl_expect *)e;
    attrs_into(k, e);
    m->kernels[m->nkernels++] = k;
    return k;
}

static void handle_free(hk_kernel *k) {
    free(k->name);
    hkl_layout_free(&k->layout);
    free(k);
}

/* Which module owns e already (its handle's), or NULL. Either lock. */
static const hkl_module *owner(const hkl_expect *e) {
    return e->home ? e->home->mod : NULL;
}

/* ---- registration ------------------------------------------------------- */

/* Binds e to the current version of a module that has its entry, when one
 * has (a hot version committed before the program first launched the
 * kernel). The version is committed already: one whose layout differs is
 * not refused but left alone, and the program's own kernel keeps running.
 * swap_lock held, launch gate closed, a context current. */
static void bind_now(hk_runtime *rt, hkl_expect *e) {
    for (hkl_module *m = rt->modules; m; m = m->next) {
        hkl_version *v = atomic_load(&m->current);
        const hkp_entry *en = v ? entry_of(v, e->name) : NULL;
        if (!en)
            continue;
        pthread_mutex_lock(&rt->expect.lock);
        int mine = hkl_tu_owns(rt, e->tu, "kernel", e->name, m, v);
        pthread_mutex_unlock(&rt->expect.lock);
        if (!mine)
            continue;
        hk_kernel *k = handle_in(m, e->name);
        char diff[200];
        if (k) {
            if (hkl_layout_diff(&e->layout, &k->layout, diff, sizeof diff)) {
                hk_log(rt, HK_LOG_WARN, "engine",
                       "kernel '%s' of module '%s' does not take the program's arguments (the "
                       "program's layout %s): the program's own code runs",
                       e->name, m->name, diff);
                return;
            }
            k->fixed_layout = 1;
            k->expect = e;
        } else {
            if (!(k = handle_new(rt, m, e)))
                return;
            hk_report rep = HK_REPORT_INIT;
            hkl_param_layout now;
            int err = hkl_resolve_slot(rt, v, k, &rep);
            if (!err && (err = hkl_read_layout(rt, v, k, &now)) == 0) {
                if (hkl_layout_diff(&e->layout, &now, diff, sizeof diff)) {
                    hk_log(rt, HK_LOG_WARN, "engine",
                           "kernel '%s' of module '%s' v%llu does not take the program's "
                           "arguments (the program's layout %s): the program's own code runs",
                           e->name, m->name, (unsigned long long)v->number, diff);
                    err = HK_ERR_LAYOUT;
                }
                hkl_layout_free(&now);
            }
            if (!err)
                err = hkl_apply_attrs(rt, v, k, &rep);
            hk_report_clear(&rep);
            if (err) {
                m->nkernels--;
                handle_free(k);
                return;
            }
        }
        /* e is on no list yet: nothing else reads it. A module back on the
         * program's code publishes it at its next commit, with the others. */
        e->home = k;
        if (atomic_load(&m->program_code)) {
            hk_log(rt, HK_LOG_INFO, "engine",
                   "the program's kernel '%s' joins module '%s' at its next commit (its "
                   "kernels run the program's code since a hot launch failed)",
                   e->name, m->name);
            return;
        }
        atomic_store_explicit(&e->k, k, memory_order_release);
        hk_log(rt, HK_LOG_INFO, "engine", "the program's kernel '%s' runs module '%s' v%llu",
               e->name, m->name, (unsigned long long)v->number);
        return;
    }
}

static int declares_template(const char *src, size_t len, const char *base);

/* A template instance with no hot version yet: the kept sources that
 * declare its template are to be built again with its expression.
 * expect_lock held. */
static void mark_late(hk_runtime *rt, hkl_expect *e) {
    if (!e->base || atomic_load(&e->k))
        return;
    for (hkl_kept_src *k = rt->expect.kept; k; k = k->next)
        if (declares_template(k->src, k->len, e->base))
            k->late = 1;
}

/* 1 when the job's build was given expr already: building it again for
 * expr would give the same version (and could go on for ever). */
static int job_had(const hkl_job *j, const char *expr) {
    for (int i = 0; i < j->opt.nname_expressions; i++)
        if (j->opt.name_expressions[i] && !strcmp(j->opt.name_expressions[i], expr))
            return 1;
    return 0;
}

hkl_expect *hkl_expect_kernel(hk_runtime *rt, const char *name, const char *expr,
                              const hkl_param_layout *layout, unsigned tu) {
    if (!rt || !name || !*name || !layout || hkl_swap_held(rt))
        return NULL;
    CUstreamCaptureMode mode = hkl_relax(rt);
    hkl_swap_lock(rt);
    pthread_mutex_lock(&rt->expect.lock);
    hkl_expect *e = find_kernel(rt, name, tu);
    pthread_mutex_unlock(&rt->expect.lock);
    if (!e && (e = calloc(1, sizeof *e)) != NULL) {
        e->tu = tu;
        e->name = strdup(name);
        e->expr = expr ? strdup(expr) : NULL;
        e->base = expr ? expr_base(expr) : NULL;
        e->cache_config = -1;
        atomic_init(&e->k, NULL);
        if (!e->name || (expr && !e->expr) || layout_copy(&e->layout, layout) < 0) {
            free(e->name);
            free(e->expr);
            free(e->base);
            free(e);
            e = NULL;
        } else {
            hkl_gate_close(rt, "binding a program's kernel");
            int pushed = hkl_ctx_push(rt, 0) == 0;
            bind_now(rt, e);
            if (pushed)
                hkl_ctx_pop(rt);
            hkl_gate_open(rt);
            pthread_mutex_lock(&rt->expect.lock);
            e->next = rt->expect.kernels;
            rt->expect.kernels = e;
            atomic_fetch_add(&rt->expect.n, 1);
            mark_late(rt, e);
            pthread_mutex_unlock(&rt->expect.lock);
        }
    }
    hkl_swap_unlock(rt, 0);
    hkl_unrelax(rt, mode);
    return e;
}

void hkl_expect_keep(hk_runtime *rt, const hkl_module *m, const hkl_job *j, const hkl_version *v) {
    if (!atomic_load(&rt->expect.n))
        return;
    hk_format fmt = j->opt.format;
    char why[64];
    if (fmt == HK_FORMAT_AUTO && hkp_detect(j->data, j->size, &fmt, why, sizeof why) < 0)
        fmt = HK_FORMAT_AUTO;
    hkl_kept_src *k = NULL;
    if (fmt == HK_FORMAT_CUDA_C && (k = calloc(1, sizeof *k)) != NULL) {
        snprintf(k->module, sizeof k->module, "%s", m->name);
        k->seq = j->seq;
        int n = j->opt.nnvrtc_options > 0 ? j->opt.nnvrtc_options : 0;
        int ne = j->opt.nname_expressions > 0 ? j->opt.nname_expressions : 0;
        int nh = j->opt.nheaders > 0 ? j->opt.nheaders : 0;
        int ok = (k->src = malloc(j->size + 1)) != NULL;
        if (ok) {
            memcpy(k->src, j->data, j->size);
            k->src[j->size] = '\0';
            k->len = j->size;
        }
        ok = ok && (!n || (k->opts = hku_strv_dup(j->opt.nvrtc_options, n)));
        k->nopts = k->opts ? n : 0;
        ok = ok && (!ne || (k->exprs = hku_strv_dup(j->opt.name_expressions, ne)));
        k->nexprs = k->exprs ? ne : 0;
        ok = ok && (!j->opt.source_name || (k->source_name = strdup(j->opt.source_name)));
        ok = ok && hku_headers_dup(j->opt.headers, nh, &k->headers) == 0;
        k->nheaders = k->headers ? nh : 0;
        if (!ok) {
            kept_free(k);
            k = NULL;
        }
    }
    pthread_mutex_lock(&rt->expect.lock);
    for (hkl_kept_src **pk = &rt->expect.kept; *pk; pk = &(*pk)->next)
        if (!strcmp((*pk)->module, m->name)) {
            hkl_kept_src *old = *pk;
            *pk = old->next;
            kept_free(old);
            break;
        }
    if (k) {
        /* Instances registered while this source was built. */
        for (hkl_expect *e = rt->expect.kernels; e; e = e->next)
            if (e->base && !entry_of(v, e->name) && !job_had(j, e->expr) &&
                declares_template(k->src, k->len, e->base))
                k->late = 1;
        k->next = rt->expect.kept;
        rt->expect.kept = k;
    }
    pthread_mutex_unlock(&rt->expect.lock);
}

int hkl_expect_take_late(hk_runtime *rt, hkl_late *out) {
    memset(out, 0, sizeof *out);
    if (!atomic_load(&rt->expect.n))
        return 0;
    pthread_mutex_lock(&rt->expect.lock);
    hkl_kept_src *k = rt->expect.kept;
    while (k && !k->late)
        k = k->next;
    int ok = 0;
    if (k) {
        k->late = 0;
        snprintf(out->module, sizeof out->module, "%s", k->module);
        out->seq = k->seq;
        ok = (out->src = malloc(k->len + 1)) != NULL;
        if (ok) {
            memcpy(out->src, k->src, k->len + 1);
            out->len = k->len;
        }
        ok =
            ok && (!k->nopts || (out->opts = hku_strv_dup((const char *const *)k->opts, k->nopts)));
        out->nopts = out->opts ? k->nopts : 0;
        ok = ok &&
             (!k->nexprs || (out->exprs = hku_strv_dup((const char *const *)k->exprs, k->nexprs)));
        out->nexprs = out->exprs ? k->nexprs : 0;
        ok = ok && (!k->source_name || (out->source_name = strdup(k->source_name)));
        ok = ok && hku_headers_dup(k->headers, k->nheaders, &out->headers) == 0;
        out->nheaders = out->headers ? k->nheaders : 0;
    }
    pthread_mutex_unlock(&rt->expect.lock);
    if (k && !ok) {
        hkl_late_free(out);
        return HK_ERR_NOMEM;
    }
    return k != NULL;
}

void hkl_late_free(hkl_late *l) {
    free(l->src);
    hku_strv_free(l->opts, l->nopts);
    hku_strv_free(l->exprs, l->nexprs);
    free(l->source_name);
    free(l->headers);
    memset(l, 0, sizeof *l);
}

int hkl_expect_init(hk_runtime *rt) {
    atomic_init(&rt->expect.n, 0);
    return pthread_mutex_init(&rt->expect.lock, NULL) ? HK_ERR_NOMEM : 0;
}

void hkl_expect_finish(hk_runtime *rt) {
    while (rt->expect.kept) {
        hkl_kept_src *k = rt->expect.kept;
        rt->expect.kept = k->next;
        kept_free(k);
    }
    while (rt->expect.kernels) {
        hkl_expect *e = rt->expect.kernels;
        rt->expect.kernels = e->next;
        free(e->name);
        free(e->expr);
        free(e->base);
        hkl_layout_free(&e->layout);
        free(e);
    }
    hkl_expect_tu_free(rt);
    hkl_expect_global_free(rt);
    pthread_mutex_destroy(&rt->expect.lock);
}

/* ---- builds ------------------------------------------------------------- */

static int ident_char(char c) {
    return isalnum((unsigned char)c) || c == '_';
}

/* 1 when src declares a __global__ function template called base: the
 * declaration that holds `base (` also holds `template` and `__global__`
 * since the last `;`, `{` or `}` before it. A name expression for a
 * template the source does not declare would fail the whole build. */
static int declares_template(const char *src, size_t len, const char *base) {
    size_t bl = strlen(base);
    for (size_t i = 0; i + bl <= len; i++) {
        if (memcmp(src + i, base, bl) || (i && ident_char(src[i - 1])) ||
            (i + bl < len && ident_char(src[i + bl])))
            continue;
        size_t j = i + bl;
        while (j < len && isspace((unsigned char)src[j]))
            j++;
        if (j >= len || src[j] != '(')
            continue;
        size_t s = i;
        while (s > 0 && src[s - 1] != ';' && src[s - 1] != '{' && src[s - 1] != '}')
            s--;
        int tmpl = 0, global = 0;
        for (size_t k = s; k < i; k++) {
            if (!ident_char(src[k]) || (k > s && ident_char(src[k - 1])))
                continue;
            if (i - k >= 8 && !memcmp(src + k, "template", 8) && !ident_char(src[k + 8]))
                tmpl = 1;
            if (i - k >= 10 && !memcmp(src + k, "__global__", 10) && !ident_char(src[k + 10]))
                global = 1;
        }
        if (tmpl && global)
            return 1;
    }
    return 0;
}

int hkl_expect_exprs(hk_runtime *rt, const char *src, size_t len, char ***out, int *n) {
    *out = NULL;
    *n = 0;
    if (!atomic_load(&rt->expect.n))
        return 0;
    int cap = 0;
    pthread_mutex_lock(&rt->expect.lock);
    for (hkl_expect *e = rt->expect.kernels; e; e = e->next) {
        if (!e->expr || !e->base || !declares_template(src, len, e->base))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            char **v = realloc(*out, (size_t)cap * sizeof *v);
            if (!v)
                break;
            *out = v;
        }
        if (!((*out)[*n] = strdup(e->expr)))
            break;
        (*n)++;
    }
    pthread_mutex_unlock(&rt->expect.lock);
    return 0;
}

/* ---- swaps -------------------------------------------------------------- */

/* Appends one adoption to a (grown as needed). */
static int adopt_push(hkl_adopted *a, hkl_expect *e, hk_kernel *k, int is_new) {
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 16;
        hkl_adopt_one *one = realloc(a->one, (size_t)cap * sizeof *one);
        if (!one)
            return HK_ERR_NOMEM;
        a->one = one;
        a->cap = cap;
    }
    a->one[a->n++] = (hkl_adopt_one){e, k, k->fixed_layout, is_new};
    a->nnew += is_new;
    k->fixed_layout = 1;
    k->expect = e;
    return 0;
}

int hkl_expect_adopt(hk_runtime *rt, hkl_module *m, const hkl_version *v, hkl_adopted *a) {
    memset(a, 0, sizeof *a);
    if (!atomic_load(&rt->expect.n))
        return 0;
    int err = 0;
    pthread_mutex_lock(&rt->expect.lock);
    for (hkl_expect *e = rt->expect.kernels; e && !err; e = e->next) {
        if (!entry_of(v, e->name))
            continue;
        const hkl_module *own = owner(e);
        if (!own && !hkl_tu_owns(rt, e->tu, "kernel", e->name, m, v))
            continue; /* another file's, or it cannot be told */
        if (own && own != m) {
            if (!e->warned) {
                e->warned = 1;
                hk_log(rt, HK_LOG_WARN, "engine",
                       "kernel '%s' of module '%s' is not used: the program's '%s' runs "
                       "module '%s'",
                       e->name, m->name, e->name, own->name);
            }
            continue;
        }
        if (own)
            continue; /* this module's handle already: validated as any handle,
                       * published again at the commit (hkl_expect_publish) */
        hk_kernel *k = handle_in(m, e->name);
        if (k) {
            /* Taken by hand before: it becomes the program's if it already
             * takes the program's arguments (validation checks the new
             * version against it). */
            char diff[200];
            if (hkl_layout_diff(&e->layout, &k->layout, diff, sizeof diff))
                continue;
            attrs_into(k, e);
            err = adopt_push(a, e, k, 0);
        } else if (!(k = handle_new(rt, m, e))) {
            err = HK_ERR_NOMEM;
        } else if ((err = adopt_push(a, e, k, 1)) < 0) {
            m->nkernels--;
            handle_free(k);
        }
    }
    pthread_mutex_unlock(&rt->expect.lock);
    return err;
}

void hkl_expect_unadopt(hkl_module *m, hkl_adopted *a) {
    /* New handles are the last ones of m, in order: nothing else was added
     * since. */
    for (int i = a->n - 1; i >= 0; i--) {
        hkl_adopt_one *o = &a->one[i];
        if (o->is_new && m->nkernels && m->kernels[m->nkernels - 1] == o->k) {
            m->nkernels--;
            handle_free(o->k);
        } else {
            o->k->fixed_layout = o->was_fixed;
            o->k->expect = NULL;
        }
    }
    free(a->one);
    memset(a, 0, sizeof *a);
}

void hkl_expect_publish(hk_runtime *rt, hkl_module *m, const hkl_version *v, hkl_adopted *a) {
    pthread_mutex_lock(&rt->expect.lock);
    for (int i = 0; i < a->n; i++)
        a->one[i].e->home = a->one[i].k;
    /* Every program kernel of m runs this version: the adopted ones, and
     * those a failed hot launch sent back to the program's code. */
    atomic_store(&m->program_code, 0);
    int back = 0;
    for (hkl_expect *e = rt->expect.kernels; e; e = e->next)
        if (e->home && e->home->mod == m && atomic_load(&e->k) != e->home) {
            back += atomic_load(&e->k) == NULL;
            atomic_store_explicit(&e->k, e->home, memory_order_release);
        }
    pthread_mutex_unlock(&rt->expect.lock);
    for (int i = 0; i < a->n; i++)
        hk_log(rt, HK_LOG_INFO, "engine", "the program's kernel '%s' runs module '%s' v%llu",
               a->one[i].e->name, m->name, (unsigned long long)v->number);
    if (back > a->n)
        hk_log(rt, HK_LOG_INFO, "engine",
               "module '%s' v%llu: the program's kernels run it again after a failed launch",
               m->name, (unsigned long long)v->number);
    free(a->one);
    memset(a, 0, sizeof *a);
}

/* ---- attributes and fallback ---------------------------------------------- */

int hkl_expect_set_attr(hk_runtime *rt, hkl_expect *e, int attr, int value, hk_report *rep) {
    if (!rt || !e)
        return HK_ERR_INVALID;
    int held = hkl_swap_held(rt);
    CUstreamCaptureMode mode = 0;
    if (!held) {
        mode = hkl_relax(rt);
        hkl_swap_lock(rt);
    }
    /* Recorded under swap_lock: a swap adopts the kernel either before (its
     * handle, home, takes it below) or after (handle_new copies it). */
    int err = attr_put(&e->nattrs, e->attrs, &e->cache_config, attr, value);
    hk_kernel *k = e->home;
    if (!err && k)
        err = attr_put(&k->nattrs, k->attrs, &k->cache_config, attr, value);
    int running = k && atomic_load(&e->k) == k;
    if (!held) {
        hkl_swap_unlock(rt, 0);
        hkl_unrelax(rt, mode);
    }
    if (err < 0) {
        hku_fail(rep, err, "kernel '%s': at most %d attributes are kept", e->name, HKL_MAX_ATTRS);
        return err;
    }
    if (!k || held)
        return 0; /* the next versions take it */
    /* The version that runs now takes it too. */
    err = attr < 0 ? hk_kernel_set_cache_config(k, value, rep)
                   : hk_kernel_set_attribute(k, attr, value, rep);
    if (err < 0 && running) {
        char what[300];
        snprintf(what, sizeof what, "setting the program's attribute: %.250s",
                 rep && rep->message[0] ? rep->message : hk_strerror(err));
        hkl_expect_fallback(rt, e, rep ? rep->cu_result : 0, what, -1);
    }
    return err;
}

void hkl_expect_fallback(hk_runtime *rt, hkl_expect *e, int cu, const char *what, int prog) {
    pthread_mutex_lock(&rt->expect.lock);
    hkl_module *m = e->home ? e->home->mod : NULL;
    int n = 0;
    if (m) {
        atomic_store(&m->program_code, 1);
        for (hkl_expect *x = rt->expect.kernels; x; x = x->next)
            if (x->home && x->home->mod == m) {
                atomic_store_explicit(&x->k, NULL, memory_order_release);
                n++;
            }
    }
    pthread_mutex_unlock(&rt->expect.lock);
    pthread_mutex_lock(&rt->metrics.lock);
    rt->metrics.stats.program_fallbacks++;
    pthread_mutex_unlock(&rt->metrics.lock);
    /* In an epoch: a swap may retire the version meanwhile. */
    uint64_t number = 0;
    hkl_tslot *ts = m ? hkl_enter(rt) : NULL;
    if (ts) {
        hkl_version *v = atomic_load(&m->current);
        number = v ? v->number : 0;
        hkl_exit(ts);
    }
    hk_report r = HK_REPORT_INIT;
    snprintf(r.kernel, sizeof r.kernel, "%s", e->name);
    if (m)
        snprintf(r.module, sizeof r.module, "%s", m->name);
    r.version = number;
    r.cu_result = cu;
    if (cu)
        snprintf(r.cu_name, sizeof r.cu_name, "%s", hkb_cu_name(rt->drv, (CUresult)cu));
    char prog_text[80];
    snprintf(prog_text, sizeof prog_text,
             prog < 0    ? "the program's own kernel runs its launches"
             : prog == 0 ? "the program's own kernel ran the launch"
                         : "the program's own kernel ran the launch and failed too, error %d",
             prog);
    hku_fail(&r, HK_ERR_CUDA,
             "the program's kernel '%s' failed in module '%s' v%llu (%s%s%s): %s; the module's "
             "%d program kernel(s) run the program's code until its next commit",
             e->name, m ? m->name : "?", (unsigned long long)number, what, cu ? ": " : "",
             cu ? r.cu_name : "", prog_text, n);
    hkl_emit(rt, HK_EVENT_FALLBACK, m ? m->name : NULL, number, 0, "launch", &r);
    hk_report_clear(&r);
}

/*
 * hk_watch_dir: watched directories feeding a runtime.
 *
 * A runtime has at most one watcher (one inotify instance, one thread) however
 * many directories it watches. The runtime structure belongs to the engine, so
 * the watcher of each runtime is kept in a small registry here, keyed by the
 * runtime pointer; the engine calls hkn_watch_release() when it destroys the
 * runtime and hkn_watch_deps_built() after each build of a watched source.
 *
 * Each directory keeps the swap options it was added with. Those records are
 * never changed or freed while the watcher runs (adding a directory again
 * puts a newer record in front), so the watcher thread may use one without a
 * lock while it submits.
 *
 * Lock order: hkn_watch_reg_mu, then a watcher's own lock (inside net/watch.c).
 * The callback takes only its registry entry's mu, and never while submitting.
 */
#include "net/watch.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct hkn_watch_dir_opts {
    struct hkn_watch_dir_opts *next;
    char *dir;               /* canonical path */
    hk_swap_options opt;     /* deep copy; source_name and origin unused */
    char **nvrtc_options;    /* owned copies behind opt.nvrtc_options */
    char **name_expressions; /* owned copies behind opt.name_expressions */
} hkn_watch_dir_opts;

typedef struct hkn_watch_reg {
    struct hkn_watch_reg *next; /* hkn_watch_reg_mu */
    hk_runtime *rt;             /* immutable */
    hkn_watch *w;               /* immutable once registered */
    pthread_mutex_t mu;
    hkn_watch_dir_opts *dirs; /* mu: newest first; records immutable */
} hkn_watch_reg;

static pthread_mutex_t hkn_watch_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static hkn_watch_reg *hkn_watch_regs; /* hkn_watch_reg_mu */

static void hkn_watch_strv_free(char **v, int n) {
    if (!v)
        return;
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static int hkn_watch_strv_copy(const char *const *src, int n, char ***out) {
    char **v;

    *out = NULL;
    if (n <= 0 || !src)
        return 0;
    v = calloc((size_t)n, sizeof *v);
    if (!v)
        return HK_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        v[i] = strdup(src[i] ? src[i] : "");
        if (!v[i]) {
            hkn_watch_strv_free(v, i);
            return HK_ERR_NOMEM;
        }
    }
    *out = v;
    return 0;
}

static void hkn_watch_dir_opts_free(hkn_watch_dir_opts *d) {
    if (!d)
        return;
    hkn_watch_strv_free(d->nvrtc_options, d->opt.nnvrtc_options);
    hkn_watch_strv_free(d->name_expressions, d->opt.nname_expressions);
    free(d->dir);
    free(d);
}

static hkn_watch_dir_opts *hkn_watch_dir_opts_new(const char *dir, const hk_swap_options *opt) {
    hkn_watch_dir_opts *d = calloc(1, sizeof *d);

    if (!d)
        return NULL;
    d->opt = *opt;
    d->opt.source_name = NULL;
    d->opt.origin = NULL;
    if (opt->nnvrtc_options <= 0 || !opt->nvrtc_options)
        d->opt.nnvrtc_options = 0;
    if (opt->nname_expressions <= 0 || !opt->name_expressions)
        d->opt.nname_expressions = 0;
    d->dir = strdup(dir);
    if (!d->dir)
        goto fail;
    if (hkn_watch_strv_copy(opt->nvrtc_options, d->opt.nnvrtc_options, &d->nvrtc_options) < 0) {
        d->opt.nnvrtc_options = 0;
        d->opt.nname_expressions = 0;
        goto fail;
    }
    if (hkn_watch_strv_copy(opt->name_expressions, d->opt.nname_expressions, &d->name_expressions) <
        0) {
        d->opt.nname_expressions = 0;
        goto fail;
    }
    d->opt.nvrtc_options = (const char *const *)d->nvrtc_options;
    d->opt.name_expressions = (const char *const *)d->name_expressions;
    return d;

fail:
    hkn_watch_dir_opts_free(d);
    return NULL;
}

static void hkn_watch_reg_free(hkn_watch_reg *r) {
    hkn_watch_dir_opts *d, *next;

    if (!r)
        return;
    hkn_watch_destroy(r->w);
    for (d = r->dirs; d; d = next) {
        next = d->next;
        hkn_watch_dir_opts_free(d);
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Runs on the watcher thread: one finished file becomes one submission. */
static void hkn_watch_api_cb(void *ud, const char *module, const char *path, const void *bytes,
                             size_t size) {
    hkn_watch_reg *r = ud;
    const hkn_watch_dir_opts *d;
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    char origin[PATH_MAX + 16];
    hk_swap_options opt;

    pthread_mutex_lock(&r->mu);
    for (d = r->dirs; d; d = d->next) {
        if (strlen(d->dir) == dlen && strncmp(d->dir, path, dlen) == 0)
            break;
    }
    pthread_mutex_unlock(&r->mu);
    if (!d)
        return; /* Not a directory added through hk_watch_dir. */
    opt = d->opt;
    snprintf(origin, sizeof origin, "watch:%s", path);
    opt.origin = origin;
    opt.source_name = path;
    /* The outcome reaches the application through its event callback. */
    hk_submit(r->rt, module, bytes, size, &opt);
}

__attribute__((format(printf, 3, 4))) static int hkn_watch_fail(hk_report *rep, int err,
                                                                const char *fmt, ...) {
    va_list ap;

    if (!rep)
        return err;
    hk_report_clear(rep);
    rep->error = err;
    va_start(ap, fmt);
    vsnprintf(rep->message, sizeof rep->message, fmt, ap);
    va_end(ap);
    return err;
}

int hk_watch_dir(hk_runtime *rt, const char *dir, const hk_swap_options *opt, hk_report *rep) {
    char real[PATH_MAX];
    hk_swap_options defaults;
    hkn_watch_reg *r;
    hkn_watch_dir_opts *d;
    hkn_watch_opts wo;
    int err, fresh = 0;

    if (!rt || !dir || !*dir)
        return hkn_watch_fail(rep, HK_ERR_INVALID, "hk_watch_dir: runtime and directory needed");
    if (!opt) {
        hk_swap_options_init(&defaults);
        opt = &defaults;
    }
    if (!realpath(dir, real))
        return hkn_watch_fail(rep, HK_ERR_IO, "cannot watch %s: %s", dir, strerror(errno));

    pthread_mutex_lock(&hkn_watch_reg_mu);
    for (r = hkn_watch_regs; r && r->rt != rt; r = r->next) {
    }
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) {
            err = hkn_watch_fail(rep, HK_ERR_NOMEM, "out of memory");
            goto out;
        }
        r->rt = rt;
        if (pthread_mutex_init(&r->mu, NULL) != 0) {
            free(r);
            err = hkn_watch_fail(rep, HK_ERR_NOMEM, "cannot create a mutex");
            goto out;
        }
        hkn_watch_opts_init(&wo);
        wo.fn = hkn_watch_api_cb;
        wo.ud = r;
        err = hkn_watch_create(&r->w, &wo);
        if (err < 0) {
            err =
                hkn_watch_fail(rep, err, "cannot start the directory watcher: %s", strerror(errno));
            pthread_mutex_destroy(&r->mu);
            free(r);
            goto out;
        }
        fresh = 1;
    }

    d = hkn_watch_dir_opts_new(real, opt);
    if (!d) {
        err = hkn_watch_fail(rep, HK_ERR_NOMEM, "out of memory");
        goto fail_reg;
    }
    /* Visible to the callback before the first file of dir can arrive. */
    pthread_mutex_lock(&r->mu);
    d->next = r->dirs;
    r->dirs = d;
    pthread_mutex_unlock(&r->mu);

    err = hkn_watch_add_dir(r->w, real);
    if (err < 0) {
        err = hkn_watch_fail(rep, err, "cannot watch %s: %s", real, strerror(errno));
        /* The directory is not watched, so no callback can hold d. */
        pthread_mutex_lock(&r->mu);
        r->dirs = d->next;
        pthread_mutex_unlock(&r->mu);
        hkn_watch_dir_opts_free(d);
        goto fail_reg;
    }
    if (fresh) {
        r->next = hkn_watch_regs;
        hkn_watch_regs = r;
    }
    if (rep) {
        hk_report_clear(rep);
    }
    err = 0;
    goto out;

fail_reg:
    if (fresh)
        hkn_watch_reg_free(r);
out:
    pthread_mutex_unlock(&hkn_watch_reg_mu);
    return err;
}

void hkn_watch_release(hk_runtime *rt) {
    hkn_watch_reg **pp, *r = NULL;

    if (!rt)
        return;
    pthread_mutex_lock(&hkn_watch_reg_mu);
    for (pp = &hkn_watch_regs; *pp; pp = &(*pp)->next) {
        if ((*pp)->rt == rt) {
            r = *pp;
            *pp = r->next;
            break;
        }
    }
    pthread_mutex_unlock(&hkn_watch_reg_mu);
    /* Outside the registry lock: a callback in progress may be submitting,
     * and the engine may be reporting dependencies meanwhile. */
    hkn_watch_reg_free(r);
}

void hkn_watch_deps_built(hk_runtime *rt, const char *source_name, const char *const *deps,
                          int ndeps) {
    hkn_watch_reg *r;

    if (!rt || !source_name)
        return;
    pthread_mutex_lock(&hkn_watch_reg_mu);
    for (r = hkn_watch_regs; r && r->rt != rt; r = r->next) {
    }
    /* Held across the call so that release cannot free the watcher under it;
     * set_deps only takes the watcher's own lock, briefly. */
    if (r)
        hkn_watch_set_deps(r->w, source_name, deps, ndeps);
    pthread_mutex_unlock(&hkn_watch_reg_mu);
}

/*
 * hk_watch_dir: watched directories feeding a runtime.
 *
 * A runtime has at most one watcher (one inotify instance, one thread) however
 * many directories it watches. The watcher is attached to the runtime as a
 * source (hkl_source, loader/loader.h), which is how hk_watch_dir finds it
 * again and how the engine reaches it without knowing what it is: the
 * engine calls its deps_built hook after each build of a watched source, its
 * metrics hook from hk_metrics_text (the watcher's counters) and its release
 * hook when it destroys the runtime. The watcher's trace, at its levels,
 * becomes the runtime's log under the subsystem "watch".
 *
 * Each directory keeps the swap options it was added with. Those records are
 * never changed or freed while the watcher runs (adding a directory again
 * puts a newer record in front), so the watcher thread may use one without a
 * lock while it submits.
 *
 * A CUDA C source is submitted with the directory's headers in memory
 * (hk_swap_options.headers), read in the same moment as the source, so the
 * build sees the headers as they were when the save was handed over, and
 * `#include <common.cuh>` works without -I. The build reports them as
 * dependencies by name, which hkw_set_deps resolves in the source's
 * directory: an edit to a header still hands its sources over again.
 *
 * What cannot become a version never reaches the engine: the watcher refuses
 * names and file types itself, and a source whose content is not the format
 * its extension names (text in a .cubin, binary in a .cu, prose in a .ptx) is
 * refused here rather than submitted as detected, since a compiler fed a file
 * that was never a kernel would quote its lines in the log. Both kinds of
 * refusal become HK_EVENT_REFUSED on the watcher thread, with a reason that
 * names the file and never its content. Headers follow the watcher's rules:
 * one that is a link out of the directory, or not a regular file, is carried
 * in memory as an #error, which hides the file from the compiler too.
 *
 * Lock order: the runtime's src_lock (held while the watcher is made and
 * while a hook runs), then an entry's add_mu (one hk_watch_dir at a time),
 * then its mu or the watcher's own lock (inside watch/watch.c). The callback
 * takes only its entry's mu, and never while submitting.
 */
#include "watch/watch.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loader/abi.h"
#include "loader/loader.h"
#include "ptx/ptx.h"
#include "util/util.h"

typedef struct dir_opts {
    struct dir_opts *next;
    char *dir;               /* canonical path */
    hk_swap_options opt;     /* deep copy; source_name and origin unused */
    char **nvrtc_options;    /* owned copies behind opt.nvrtc_options */
    char **name_expressions; /* owned copies behind opt.name_expressions */
    hk_header *headers;      /* owned copy behind opt.headers (hku_headers_dup) */
} dir_opts;

/* The watcher of one runtime, attached to it through src. */
typedef struct watch_source {
    hkl_source src; /* immutable once attached (the runtime links it) */
    hk_runtime *rt; /* immutable */
    hkw_watcher *w; /* immutable once attached */
    pthread_mutex_t add_mu;
    pthread_mutex_t mu;
    dir_opts *dirs; /* mu, changed under add_mu too: newest first;
                     * records immutable */
} watch_source;

/* The kind of source this file attaches (its address is what counts). */
static const char source_kind[] = "watch";

void hkw_headers_free(hk_header *h, int n) {
    if (!h)
        return;
    for (int i = 0; i < n; i++) {
        free((char *)h[i].name);
        free((void *)h[i].data);
    }
    free(h);
}

static int header_cmp(const void *a, const void *b) {
    return strcmp(((const hk_header *)a)->name, ((const hk_header *)b)->name);
}

/* Reads header name of directory dir into *h (name and data the caller's).
 * One that is a symbolic link resolving outside dir, or not a regular file,
 * becomes an #error: in memory, it hides the file, which the compiler then
 * never opens (and quotes in its log); the watcher reports why. Returns 1
 * when *h was filled, 0 when the file is left to the file system (gone, too
 * large, or growing while read: its change hands the source over again), or
 * HK_ERR_NOMEM. */
static int read_header(const char *dir, const char *name, hk_header *h) {
    char path[PATH_MAX], real[PATH_MAX];
    size_t dlen = strlen(dir);
    struct stat st;
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path ||
        lstat(path, &st) != 0)
        return 0;
    const char *stub = NULL;
    if (S_ISLNK(st.st_mode) &&
        (!realpath(path, real) || strncmp(real, dir, dlen) != 0 || real[dlen] != '/'))
        stub = "#error \"header refused: a symbolic link that does not resolve inside the "
               "watched directory\"\n";
    else if (stat(path, &st) != 0)
        return 0;
    else if (!S_ISREG(st.st_mode))
        stub = "#error \"header refused: not a regular file\"\n";
    else if ((size_t)st.st_size > HKW_MAX_HEADER_BYTES)
        return 0;
    char *data = NULL;
    size_t size = 0;
    if (stub) {
        data = strdup(stub);
        size = strlen(stub);
    } else {
        int err = hku_read_file(path, (size_t)st.st_size, &data, &size, NULL);
        if (err < 0)
            return err == HK_ERR_NOMEM ? err : 0;
    }
    char *copy = strdup(name);
    if (!data || !copy) {
        free(data);
        free(copy);
        return HK_ERR_NOMEM;
    }
    *h = (hk_header){.name = copy, .data = data, .size = size};
    return 1;
}

int hkw_dir_headers(const char *dir, hk_header **out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *dh = opendir(dir);
    if (!dh)
        return HK_ERR_IO;
    hk_header *v = NULL;
    int cnt = 0, err = 0;
    struct dirent *de;
    while (!err && (de = readdir(dh)) != NULL && cnt < HKW_MAX_HEADERS) {
        if (hkw_classify(de->d_name, NULL, 0) != HKW_HEADER)
            continue;
        if (!v && !(v = calloc(HKW_MAX_HEADERS, sizeof *v)))
            err = HK_ERR_NOMEM;
        int got = err ? 0 : read_header(dir, de->d_name, &v[cnt]);
        if (got < 0)
            err = got;
        else
            cnt += got;
    }
    closedir(dh);
    if (err < 0) {
        hkw_headers_free(v, cnt);
        return err;
    }
    if (cnt)
        qsort(v, (size_t)cnt, sizeof *v, header_cmp);
    else {
        free(v);
        v = NULL;
    }
    *out = v;
    *n = cnt;
    return 0;
}

static void dir_opts_free(dir_opts *d) {
    if (!d)
        return;
    free(d->headers);
    hku_strv_free(d->nvrtc_options, d->opt.nnvrtc_options);
    hku_strv_free(d->name_expressions, d->opt.nname_expressions);
    free(d->dir);
    free(d);
}

static dir_opts *dir_opts_new(const char *dir, const hk_swap_options *opt) {
    dir_opts *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->opt = *opt;
    d->opt.source_name = NULL;
    d->opt.origin = NULL;
    if (opt->nnvrtc_options <= 0 || !opt->nvrtc_options)
        d->opt.nnvrtc_options = 0;
    if (opt->nname_expressions <= 0 || !opt->name_expressions)
        d->opt.nname_expressions = 0;
    d->opt.nheaders = 0;
    d->opt.headers = NULL;
    d->dir = strdup(dir);
    d->nvrtc_options = hku_strv_dup(opt->nvrtc_options, d->opt.nnvrtc_options);
    d->name_expressions = hku_strv_dup(opt->name_expressions, d->opt.nname_expressions);
    if (!d->dir || (d->opt.nnvrtc_options > 0 && !d->nvrtc_options) ||
        (d->opt.nname_expressions > 0 && !d->name_expressions))
        goto fail;
    int nh = opt->headers && opt->nheaders > 0 ? opt->nheaders : 0;
    if (hku_headers_dup(opt->headers, nh, &d->headers) < 0)
        goto fail;
    d->opt.nheaders = nh;
    d->opt.nvrtc_options = (const char *const *)d->nvrtc_options;
    d->opt.name_expressions = (const char *const *)d->name_expressions;
    d->opt.headers = d->headers;
    return d;

fail:
    dir_opts_free(d);
    return NULL;
}

static void source_free(watch_source *r) {
    if (!r)
        return;
    hkw_destroy(r->w);
    for (dir_opts *d = r->dirs, *next; d; d = next) {
        next = d->next;
        dir_opts_free(d);
    }
    pthread_mutex_destroy(&r->add_mu);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* The release hook: the runtime is being destroyed. Stops the watcher
 * thread (a callback in progress, which may be submitting, is finished
 * first) and frees the entry. */
static void on_release(void *ctx) {
    source_free(ctx);
}

/* The deps_built hook, on the engine's worker with the runtime's src_lock
 * held, which keeps the entry alive; set_deps only takes the watcher's own
 * lock, briefly. A source the watcher does not know is left alone there. */
static void on_deps_built(void *ctx, const char *source_name, const char *const *deps, int n) {
    watch_source *r = ctx;
    hkw_set_deps(r->w, source_name, deps, n);
}

/* Tells the application that path was not submitted, and why. */
static void report_refused(hk_runtime *rt, const char *module, const char *path, int err,
                           const char *why) {
    char origin[PATH_MAX + 16];
    snprintf(origin, sizeof origin, "watch:%s", path);
    hk_report rep = HK_REPORT_INIT;
    rep.error = err;
    if (module)
        snprintf(rep.module, sizeof rep.module, "%s", module);
    snprintf(rep.message, sizeof rep.message, "%s: %s", path, why);
    /* The watcher logged the refusal already, with its reason. */
    hkl_emit_quiet(rt, HK_EVENT_REFUSED, module, module ? hk_module_version(rt, module) : 0, 0,
                   origin, &rep);
}

/* Runs on the watcher thread: the watcher refused a file. */
static void on_refuse(void *ud, const char *module, const char *path, int err, const char *why) {
    watch_source *r = ud;
    report_refused(r->rt, module, path, err, why);
}

/* The format a watched source must hold: the directory's when it names one,
 * else the one its extension names. */
static hk_format expected_format(const char *path, hk_format dir_format) {
    static const struct {
        const char *ext;
        hk_format fmt;
    } kinds[] = {{"cu", HK_FORMAT_CUDA_C},
                 {"ptx", HK_FORMAT_PTX},
                 {"cubin", HK_FORMAT_CUBIN},
                 {"fatbin", HK_FORMAT_FATBIN}};
    const char *dot = strrchr(path, '.');
    char ext[8];
    if (dir_format != HK_FORMAT_AUTO || !dot || strlen(dot + 1) >= sizeof ext)
        return dir_format;
    size_t n = 0;
    for (; dot[1 + n]; n++)
        ext[n] = (char)tolower((unsigned char)dot[1 + n]);
    ext[n] = '\0';
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(ext, kinds[i].ext) == 0)
            return kinds[i].fmt;
    }
    return HK_FORMAT_AUTO;
}

static const char *format_words(hk_format f) {
    return f == HK_FORMAT_CUDA_C  ? "CUDA C"
           : f == HK_FORMAT_PTX   ? "PTX"
           : f == HK_FORMAT_CUBIN ? "a cubin"
                                  : "a fatbin";
}

/* 0 when bytes hold the format want (AUTO: any); otherwise writes why (no
 * content) and returns HK_ERR_FORMAT. */
static int check_format(hk_format want, const void *bytes, size_t size, char *why,
                        size_t why_size) {
    char detail[256] = "";
    hk_format got = HK_FORMAT_AUTO;
    if (hkp_detect(bytes, size, &got, detail, sizeof detail) < 0) {
        snprintf(why, why_size, "not CUDA C, PTX, cubin or fatbin (%s; %zu bytes): not submitted",
                 detail[0] ? detail : "unrecognised", size);
        return HK_ERR_FORMAT;
    }
    if (want != HK_FORMAT_AUTO && got != want) {
        snprintf(why, why_size,
                 "not %s as its name says: it looks like %s (%zu bytes): not submitted",
                 format_words(want), format_words(got), size);
        return HK_ERR_FORMAT;
    }
    return 0;
}

/* The watcher's trace becomes the runtime's log (watcher lock held: hk_log
 * takes only the log lock). */
static void on_log(void *ud, hk_log_level level, const char *line) {
    watch_source *r = ud;
    hk_log(r->rt, level, "watch", "%s", line);
}

static int on_log_enabled(void *ud, hk_log_level level) {
    watch_source *r = ud;
    return hk_log_enabled(r->rt, level);
}

/* The metrics hook, from hk_metrics_text with src_lock held (which keeps
 * the entry alive); takes the watcher's lock briefly. */
static void on_metrics(void *ctx, hk_metrics_writer *mw) {
    static const struct {
        const char *name, *help;
        size_t off;
    } fams[] = {
        {"hotkern_watch_events_total", "inotify events read by the watcher.",
         offsetof(hkw_stats, events)},
        {"hotkern_watch_handovers_total", "Watched files handed over to be built.",
         offsetof(hkw_stats, handovers)},
        {"hotkern_watch_unchanged_total",
         "Reads of a watched source whose content had not changed: not handed over.",
         offsetof(hkw_stats, unchanged)},
        {"hotkern_watch_partial_reads_total",
         "Reads repeated because the file changed while being read.", offsetof(hkw_stats, retries)},
        {"hotkern_watch_refusals_total", "Watched files refused, with an HK_EVENT_REFUSED.",
         offsetof(hkw_stats, refusals)},
        {"hotkern_watch_dependency_rebuilds_total",
         "Sources due again because a header their build read changed.",
         offsetof(hkw_stats, dep_rebuilds)},
        {"hotkern_watch_overflows_total", "inotify queue overflows (events lost, rescanned).",
         offsetof(hkw_stats, overflows)},
        {"hotkern_watch_rescans_total", "Directory listings.", offsetof(hkw_stats, rescans)},
        {"hotkern_watch_dirs_lost_total", "Watched directories that disappeared.",
         offsetof(hkw_stats, dirs_lost)},
        {"hotkern_watch_opens_total", "Files opened for reading.", offsetof(hkw_stats, opens)},
    };
    watch_source *r = ctx;
    hkw_stats st;
    hkw_stats_get(r->w, &st);
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        uint64_t v;
        memcpy(&v, (const char *)&st + fams[i].off, sizeof v);
        hk_metrics_family(mw, fams[i].name, "counter", fams[i].help);
        hk_metrics_sample(mw, fams[i].name, NULL, NULL, v);
    }
}

/* Runs on the watcher thread: one finished file becomes one submission. */
static void on_file(void *ud, const char *module, const char *path, const void *bytes,
                    size_t size) {
    watch_source *r = ud;
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    const dir_opts *d;
    pthread_mutex_lock(&r->mu);
    for (d = r->dirs; d; d = d->next) {
        if (strlen(d->dir) == dlen && strncmp(d->dir, path, dlen) == 0)
            break;
    }
    pthread_mutex_unlock(&r->mu);
    if (!d)
        return; /* Not a directory added through hk_watch_dir. */
    hk_swap_options opt = d->opt;
    opt.format = expected_format(path, d->opt.format);
    char why[384];
    int err = check_format(opt.format, bytes, size, why, sizeof why);
    if (err < 0) {
        hk_log(r->rt, HK_LOG_WARN, "watch", "%s refused: %s", path, why);
        report_refused(r->rt, module, path, err, why);
        return;
    }
    char origin[PATH_MAX + 16];
    snprintf(origin, sizeof origin, "watch:%s", path);
    opt.origin = origin;
    opt.source_name = path;
    hk_header *dirh = NULL, *all = NULL;
    int ndirh = 0;
    size_t plen = strlen(path);
    if (plen > 3 && strcmp(path + plen - 3, ".cu") == 0 &&
        hkw_dir_headers(d->dir, &dirh, &ndirh) == 0 && ndirh > 0 &&
        (all = calloc((size_t)ndirh + (size_t)d->opt.nheaders, sizeof *all)) != NULL) {
        /* The directory's options name headers first: they hide its files. */
        for (int i = 0; i < d->opt.nheaders; i++)
            all[i] = d->opt.headers[i];
        for (int i = 0; i < ndirh; i++)
            all[d->opt.nheaders + i] = dirh[i];
        opt.headers = all;
        opt.nheaders = d->opt.nheaders + ndirh;
    }
    /* The outcome reaches the application through its event callback.
     * hk_submit copies the headers. When it fails, no event comes from the
     * engine, so the refusal is reported here. */
    err = hk_submit(r->rt, module, bytes, size, &opt);
    if (err < 0) {
        snprintf(why, sizeof why, "not submitted: %s", hk_strerror(err));
        hk_log(r->rt, HK_LOG_WARN, "watch", "%s refused: %s", path, why);
        report_refused(r->rt, module, path, err, why);
    }
    free(all);
    hkw_headers_free(dirh, ndirh);
}

/* Watches real (canonical) with the swap options opt, on r's watcher. One
 * call at a time per entry (add_mu): a failed add unlinks its own record. */
static int source_add_dir(watch_source *r, const char *real, const hk_swap_options *opt,
                          hk_report *rep) {
    dir_opts *d = dir_opts_new(real, opt);
    if (!d)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    pthread_mutex_lock(&r->add_mu);
    /* Visible to the callback before the first file of dir can arrive. */
    pthread_mutex_lock(&r->mu);
    d->next = r->dirs;
    r->dirs = d;
    pthread_mutex_unlock(&r->mu);
    int err = hkw_add_dir(r->w, real);
    if (err < 0) {
        err = hku_fail(rep, err, "cannot watch %s: %s", real, strerror(errno));
        /* The directory is not watched, so no callback can hold d. */
        pthread_mutex_lock(&r->mu);
        dir_opts **pp = &r->dirs;
        while (*pp != d)
            pp = &(*pp)->next;
        *pp = d->next;
        pthread_mutex_unlock(&r->mu);
        dir_opts_free(d);
    }
    pthread_mutex_unlock(&r->add_mu);
    return err;
}

/* What hk_watch_dir hands to source_make. */
typedef struct first_dir {
    hk_runtime *rt;
    const char *real;
    const hk_swap_options *opt;
    hk_report *rep;
    int err;
} first_dir;

/* Makes rt's watcher and watches its first directory; called under the
 * runtime's src_lock, so that concurrent first calls make one watcher. On
 * failure nothing is left behind and a->err says why. */
static hkl_source *source_make(void *arg) {
    first_dir *a = arg;
    watch_source *r = calloc(1, sizeof *r);
    if (!r) {
        a->err = hku_fail(a->rep, HK_ERR_NOMEM, "out of memory");
        return NULL;
    }
    r->rt = a->rt;
    if (pthread_mutex_init(&r->mu, NULL) != 0) {
        free(r);
        a->err = hku_fail(a->rep, HK_ERR_NOMEM, "cannot create a mutex");
        return NULL;
    }
    if (pthread_mutex_init(&r->add_mu, NULL) != 0) {
        pthread_mutex_destroy(&r->mu);
        free(r);
        a->err = hku_fail(a->rep, HK_ERR_NOMEM, "cannot create a mutex");
        return NULL;
    }
    hkw_opts wo;
    hkw_opts_init(&wo);
    wo.fn = on_file;
    wo.refuse = on_refuse;
    wo.ud = r;
    wo.log = on_log;
    wo.log_on = on_log_enabled;
    wo.log_ud = r;
    int err = hkw_create(&r->w, &wo);
    if (err < 0) {
        a->err = hku_fail(a->rep, err, "cannot start the directory watcher: %s", strerror(errno));
        source_free(r);
        return NULL;
    }
    err = source_add_dir(r, a->real, a->opt, a->rep);
    if (err < 0) {
        a->err = err;
        source_free(r);
        return NULL;
    }
    r->src.ctx = r;
    r->src.deps_built = on_deps_built;
    r->src.release = on_release;
    r->src.metrics = on_metrics;
    return &r->src;
}

/* hk_watch_dir with opt in the library's layout and a full report, already
 * cleared. */
static int watch_dir_call(hk_runtime *rt, const char *dir, const hk_swap_options *opt,
                          hk_report *rep) {
    if (!rt || !dir || !*dir)
        return hku_fail(rep, HK_ERR_INVALID, "hk_watch_dir: runtime and directory needed");
    char real[PATH_MAX];
    if (!realpath(dir, real))
        return hku_fail(rep, HK_ERR_IO, "cannot watch %s: %s", dir, strerror(errno));
    first_dir first = {rt, real, opt, rep, 0};
    int made;
    hkl_source *src = hkl_source_get(rt, source_kind, source_make, &first, &made);
    if (!src)
        return first.err < 0 ? first.err : HK_ERR_NOMEM;
    if (!made) {
        int err = source_add_dir(src->ctx, real, opt, rep);
        if (err < 0)
            return err;
    }
    if (rep)
        hk_report_clear(rep);
    return 0;
}

int hk_watch_dir(hk_runtime *rt, const char *dir, const hk_swap_options *opt, hk_report *rep) {
    hk_report full;
    if (hkl_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    hk_report_clear(&full);
    hk_swap_options o;
    int err;
    if (hkl_swap_options_in(&o, opt) < 0)
        err = hku_fail(&full, HK_ERR_INVALID,
                       "hk_watch_dir: hk_swap_options.size %zu is below the first layout",
                       hkl_size_of(opt));
    else
        err = watch_dir_call(rt, dir, &o, rep ? &full : NULL);
    hkl_report_out(rep, &full);
    return err;
}

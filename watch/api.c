/*
 * Watches feeding a runtime: hk_watch_start, hk_watch_stop, hk_watch_dir.
 *
 * A watch (hk_watch) is one watcher (watch/watch.c, events.c and files.c:
 * one inotify instance, one thread) and the swap options its files are
 * submitted with. hk_watch_start makes one per call, for one directory (and
 * its subdirectories when recursive); hk_watch_dir adds directories to the
 * runtime's one shared watch, each with its own options. Every watch of a
 * runtime is listed in one registry, attached to the runtime as a source
 * (hkl_source, loader/port.h), which is how a call finds the others (a
 * directory is watched by one watch at most) and how the engine reaches them
 * without knowing what they are: it calls the registry's deps_built hook after each
 * build of a watched source (handed to every watch; the one that knows the
 * source records its headers), its metrics hook from hk_metrics_text (the
 * counters of all watches, those stopped included, summed) and its release
 * hook when it destroys the runtime (every watch still running is stopped
 * and freed). The watchers' traces, at their levels, become the runtime's log
 * under the subsystem "watch".
 *
 * Each directory keeps the swap options it was added with. Those records are
 * never changed or freed while their watch runs (adding a directory to the
 * shared watch again puts a newer record in front), so the watcher thread
 * may use one without a lock while it submits.
 *
 * Lock order: the runtime's src_lock (held while the registry is made and
 * while a hook runs), then the registry's add_mu (one start or add at a
 * time: the check that no other watch covers the directory and the insert
 * are one step), then the registry's mu (the lists), then a watch's mu (its
 * directory records) or the watcher's own lock (watch/watcher.h's mu).
 * Callbacks take only their watch's mu, and never while submitting.
 *
 * The headers carried with a source, the refusals of what cannot become a
 * version, submissions and stopping: beside the code that does each.
 */
#include "watch/watch.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "base/abi.h"
#include "loader/port.h"
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

typedef struct watch_source watch_source;

struct hk_watch {
    watch_source *src;    /* immutable */
    hkw_watcher *w;       /* immutable once made */
    char *root;           /* immutable: hk_watch_start's directory (canonical);
                           * NULL for the shared watch of hk_watch_dir */
    int recursive;        /* immutable */
    _Atomic int stopping; /* hk_watch_stop began: callbacks do nothing */
    pthread_mutex_t mu;
    dir_opts *dirs; /* mu, changed under add_mu too: newest first;
                     * records immutable */
    hk_watch *next; /* registry mu */
};

/* The registry of one runtime's watches, attached to it through src. */
struct watch_source {
    hkl_source src; /* immutable once attached (the runtime links it) */
    hk_runtime *rt; /* immutable */
    pthread_mutex_t add_mu;
    pthread_mutex_t mu;
    hk_watch *watches; /* mu, changed under add_mu too: running watches */
    hk_watch *shared;  /* add_mu: hk_watch_dir's watch (also in watches) */
    hk_watch *stopped; /* mu: stopped from their own thread, freed at release */
    hkw_stats retired; /* mu: the counters of watches stopped and freed */
};

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

/*
 * A CUDA C source is submitted with its directory's headers in memory
 * (hk_swap_options.headers), read in the same moment as the source, so the
 * build sees the headers as they were when the save was handed over, and
 * `#include <common.cuh>` works without -I. The build reports them as
 * dependencies by name, which hkw_set_deps resolves in the source's
 * directory: an edit to a header still hands its sources over again.
 */
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

/*
 * What cannot become a version never reaches the engine: the watcher refuses
 * names and file types itself, and a source whose content is not the format
 * its extension names (text in a .cubin, binary in a .cu, prose in a .ptx) is
 * refused here rather than submitted as detected, since a compiler fed a file
 * that was never a kernel would quote its lines in the log. Both kinds of
 * refusal become HK_EVENT_REFUSED on the watcher thread, with a reason that
 * names the file and never its content. Headers follow the watcher's rules:
 * one that is a link out of the directory, or not a regular file, is carried
 * in memory as an #error, which hides the file from the compiler too.
 */
/* The format a watched source must hold: the directory's when it names one,
 * else the one its extension names. */
static hk_format expected_format(const char *path, hk_format dir_format) {
    const char *dot = strrchr(path, '.');
    if (dir_format != HK_FORMAT_AUTO || !dot)
        return dir_format;
    return hkw_source_format(dot + 1);
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

static void dir_opts_free(dir_opts *d) {
    if (!d)
        return;
    free(d->headers);
    hku_strv_free(d->nvrtc_options, d->opt.nnvrtc_options);
    hku_strv_free(d->name_expressions, d->opt.nname_expressions);
    free(d->dir);
    free(d);
}

/* A deep copy of opt for directory dir; profile, unless DEFAULT, replaces
 * opt's build profile. */
static dir_opts *dir_opts_new(const char *dir, const hk_swap_options *opt,
                              hk_build_profile profile) {
    dir_opts *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->opt = *opt;
    d->opt.source_name = NULL;
    d->opt.origin = NULL;
    if (profile != HK_BUILD_PROFILE_DEFAULT)
        d->opt.build_profile = profile;
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

/* Frees a watch whose watcher has been made and is stopped or about to be
 * (hkw_destroy waits for its thread), or was never made. */
static void watch_free(hk_watch *w) {
    if (!w)
        return;
    hkw_destroy(w->w);
    for (dir_opts *d = w->dirs, *next; d; d = next) {
        next = d->next;
        dir_opts_free(d);
    }
    pthread_mutex_destroy(&w->mu);
    free(w->root);
    free(w);
}

/* The release hook: the runtime is being destroyed. Stops every watch (a
 * callback in progress, which may be submitting, is finished first) and
 * frees the registry. */
static void on_release(void *ctx) {
    watch_source *s = ctx;
    hk_watch *lists[2] = {s->watches, s->stopped};
    for (int i = 0; i < 2; i++) {
        for (hk_watch *w = lists[i], *next; w; w = next) {
            next = w->next;
            atomic_store(&w->stopping, 1);
            watch_free(w);
        }
    }
    pthread_mutex_destroy(&s->add_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* The deps_built hook, on the engine's worker with the runtime's src_lock
 * held, which keeps the registry alive; the registry's mu keeps each watch
 * alive, and set_deps only takes its watcher's lock, briefly. A watch that
 * does not know the source leaves it alone. */
static void on_deps_built(void *ctx, const char *source_name, const char *const *deps, int n) {
    watch_source *s = ctx;
    pthread_mutex_lock(&s->mu);
    for (hk_watch *w = s->watches; w; w = w->next) {
        if (hkw_set_deps(w->w, source_name, deps, n) != HK_ERR_NOT_FOUND)
            break;
    }
    pthread_mutex_unlock(&s->mu);
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
    hk_watch *w = ud;
    if (!atomic_load(&w->stopping))
        report_refused(w->src->rt, module, path, err, why);
}

/* The watcher's trace becomes the runtime's log (watcher lock held: hk_log
 * takes only the log lock). */
static void on_log(void *ud, hk_log_level level, const char *line) {
    hk_watch *w = ud;
    hk_log(w->src->rt, level, "watch", "%s", line);
}

static int on_log_enabled(void *ud, hk_log_level level) {
    hk_watch *w = ud;
    return hk_log_enabled(w->src->rt, level);
}

static void stats_add(hkw_stats *to, const hkw_stats *from) {
    to->events += from->events;
    to->handovers += from->handovers;
    to->overflows += from->overflows;
    to->rescans += from->rescans;
    to->retries += from->retries;
    to->dirs_lost += from->dirs_lost;
    to->opens += from->opens;
    to->refusals += from->refusals;
    to->unchanged += from->unchanged;
    to->dep_rebuilds += from->dep_rebuilds;
}

/* The metrics hook, from hk_metrics_text with src_lock held (which keeps
 * the registry alive); takes the registry's lock, and each watcher's
 * briefly. Counters of stopped watches stay in the sums, so that none goes
 * down. */
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
    watch_source *s = ctx;
    hkw_stats st;
    pthread_mutex_lock(&s->mu);
    hkw_stats sum = s->retired;
    hk_watch *lists[2] = {s->watches, s->stopped};
    for (int i = 0; i < 2; i++) {
        for (hk_watch *w = lists[i]; w; w = w->next) {
            hkw_stats_get(w->w, &st);
            stats_add(&sum, &st);
        }
    }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        uint64_t v;
        memcpy(&v, (const char *)&sum + fams[i].off, sizeof v);
        hk_metrics_family(mw, fams[i].name, "counter", fams[i].help);
        hk_metrics_sample(mw, fams[i].name, NULL, NULL, v);
    }
}

/* The options path's file is submitted with: the watch's own for a watch
 * of hk_watch_start (whatever subdirectory it is in), the record of its
 * directory for the shared watch; NULL when none. */
static const dir_opts *opts_for(hk_watch *w, const char *path) {
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    const dir_opts *d;
    pthread_mutex_lock(&w->mu);
    for (d = w->dirs; d && !w->root; d = d->next) {
        if (strlen(d->dir) == dlen && strncmp(d->dir, path, dlen) == 0)
            break;
    }
    pthread_mutex_unlock(&w->mu);
    return d;
}

/*
 * A watched file is submitted through hkl_submit_latest: the engine lets a
 * later save of the module supersede one not yet committed, so a burst of
 * saves builds the newest content and never commits an older one after it.
 */
/* Runs on the watcher thread: one finished file becomes one submission. */
static void on_file(void *ud, const char *module, const char *path, const void *bytes,
                    size_t size) {
    hk_watch *w = ud;
    hk_runtime *rt = w->src->rt;
    if (atomic_load(&w->stopping))
        return;
    const dir_opts *d = opts_for(w, path);
    if (!d)
        return; /* Not a directory added through hk_watch_dir. */
    hk_swap_options opt = d->opt;
    opt.format = expected_format(path, d->opt.format);
    char why[384];
    int err = check_format(opt.format, bytes, size, why, sizeof why);
    if (err < 0) {
        hk_log(rt, HK_LOG_WARN, "watch", "%s refused: %s", path, why);
        report_refused(rt, module, path, err, why);
        return;
    }
    char origin[PATH_MAX + 16];
    snprintf(origin, sizeof origin, "watch:%s", path);
    opt.origin = origin;
    opt.source_name = path;
    /* The headers of the source's own directory (a subdirectory's, in a
     * recursive watch). */
    char srcdir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    snprintf(srcdir, sizeof srcdir, "%.*s", slash ? (int)(slash - path) : 0, path);
    hk_header *dirh = NULL, *all = NULL;
    int ndirh = 0;
    size_t plen = strlen(path);
    if (plen > 3 && strcmp(path + plen - 3, ".cu") == 0 &&
        hkw_dir_headers(srcdir, &dirh, &ndirh) == 0 && ndirh > 0 &&
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
     * The engine copies the headers. When it fails, no event comes from the
     * engine, so the refusal is reported here. */
    err = hkl_submit_latest(rt, module, bytes, size, &opt);
    if (err < 0) {
        snprintf(why, sizeof why, "not submitted: %s", hk_strerror(err));
        hk_log(rt, HK_LOG_WARN, "watch", "%s refused: %s", path, why);
        report_refused(rt, module, path, err, why);
    }
    free(all);
    hkw_headers_free(dirh, ndirh);
}

/* Makes rt's registry; called under the runtime's src_lock, so that
 * concurrent first calls make one. */
static hkl_source *source_make(void *arg) {
    watch_source *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->rt = arg;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return NULL;
    }
    if (pthread_mutex_init(&s->add_mu, NULL) != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    s->src.ctx = s;
    s->src.deps_built = on_deps_built;
    s->src.release = on_release;
    s->src.metrics = on_metrics;
    return &s->src;
}

static watch_source *registry(hk_runtime *rt, hk_report *rep) {
    int made;
    hkl_source *src = hkl_source_get(rt, source_kind, source_make, rt, &made);
    if (!src)
        hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    return src ? src->ctx : NULL;
}

/* 1 when path is dir or lies below it. */
static int path_within(const char *path, const char *dir) {
    size_t n = strlen(dir);
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* 1 when a watch of s (the shared one left out with skip_shared) covers
 * directory real or, with recursive, lies inside real, with that watch's
 * directory copied to other; 0 when none does. */
static int covered_by(watch_source *s, const char *real, int recursive, int skip_shared,
                      char other[PATH_MAX]) {
    const char *hit = NULL;
    pthread_mutex_lock(&s->mu);
    for (hk_watch *w = s->watches; w && !hit; w = w->next) {
        if (w->root) {
            if (strcmp(real, w->root) == 0 || (w->recursive && path_within(real, w->root)) ||
                (recursive && path_within(w->root, real)))
                hit = w->root;
            continue;
        }
        if (skip_shared)
            continue;
        pthread_mutex_lock(&w->mu);
        for (const dir_opts *d = w->dirs; d && !hit; d = d->next) {
            if (strcmp(real, d->dir) == 0 || (recursive && path_within(d->dir, real)))
                hit = d->dir;
        }
        pthread_mutex_unlock(&w->mu);
    }
    if (hit)
        snprintf(other, PATH_MAX, "%s", hit);
    pthread_mutex_unlock(&s->mu);
    return hit != NULL;
}

/* Makes a watch of s with watcher options wo (fn, refuse, log filled here);
 * root NULL for the shared watch. Not yet listed. */
static int watch_make(watch_source *s, hkw_opts *wo, const char *root, hk_watch **out,
                      hk_report *rep) {
    hk_watch *w = calloc(1, sizeof *w);
    *out = NULL;
    if (!w || (root && !(w->root = strdup(root)))) {
        free(w);
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    }
    w->src = s;
    w->recursive = wo->recursive;
    if (pthread_mutex_init(&w->mu, NULL) != 0) {
        free(w->root);
        free(w);
        return hku_fail(rep, HK_ERR_NOMEM, "cannot create a mutex");
    }
    wo->fn = on_file;
    wo->refuse = on_refuse;
    wo->ud = w;
    wo->log = on_log;
    wo->log_on = on_log_enabled;
    wo->log_ud = w;
    int err = hkw_create(&w->w, wo);
    if (err < 0) {
        err = hku_fail(rep, err, "cannot start the directory watcher: %s", strerror(errno));
        watch_free(w);
        return err;
    }
    *out = w;
    return 0;
}

/* Lists w in s (add_mu held). */
static void watch_link(watch_source *s, hk_watch *w) {
    pthread_mutex_lock(&s->mu);
    w->next = s->watches;
    s->watches = w;
    pthread_mutex_unlock(&s->mu);
}

/* Takes w off s's list of running watches; 1 when it was there. */
static int watch_unlink(watch_source *s, hk_watch *w) {
    pthread_mutex_lock(&s->mu);
    hk_watch **pp = &s->watches;
    while (*pp && *pp != w)
        pp = &(*pp)->next;
    int found = *pp == w;
    if (found)
        *pp = w->next;
    pthread_mutex_unlock(&s->mu);
    return found;
}

/* Watches real (canonical) with the record d, on w's watcher. add_mu held,
 * so one call at a time per registry: a failed add unlinks its own record,
 * and frees it. */
static int watch_add_dir(hk_watch *w, const char *real, dir_opts *d, hk_report *rep) {
    /* Visible to the callback before the first file of dir can arrive. */
    pthread_mutex_lock(&w->mu);
    d->next = w->dirs;
    w->dirs = d;
    pthread_mutex_unlock(&w->mu);
    int err = hkw_add_dir(w->w, real);
    if (err < 0) {
        err = hku_fail(rep, err, "cannot watch %s: %s", real, strerror(errno));
        /* The directory is not watched, so no callback can hold d. */
        pthread_mutex_lock(&w->mu);
        dir_opts **pp = &w->dirs;
        while (*pp != d)
            pp = &(*pp)->next;
        *pp = d->next;
        pthread_mutex_unlock(&w->mu);
        dir_opts_free(d);
    }
    return err;
}

/* The canonical path of directory dir into real, or the error. */
static int canonical_dir(const char *dir, char real[PATH_MAX], hk_report *rep) {
    struct stat st;
    if (!realpath(dir, real) || stat(real, &st) != 0)
        return hku_fail(rep, HK_ERR_IO, "cannot watch %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return hku_fail(rep, HK_ERR_IO, "cannot watch %s: %s", dir, strerror(ENOTDIR));
    /* Every file in it may become a module: a directory any user may add
     * files to (sticky or not) is not watched. The watcher reads no file
     * another user owns either (watch.c), which covers a group's. */
    if (st.st_mode & S_IWOTH)
        return hku_fail(rep, HK_ERR_IO,
                        "cannot watch %s: writable by others (mode %04o), so any user could add "
                        "a module: chmod o-w it",
                        real, (unsigned)(st.st_mode & 07777));
    if (st.st_uid != geteuid() && st.st_uid != 0)
        return hku_fail(rep, HK_ERR_IO,
                        "cannot watch %s: owned by uid %ld, neither this process's user (uid %ld) "
                        "nor root",
                        real, (long)st.st_uid, (long)geteuid());
    return 0;
}

/* hk_watch_dir with opt in the library's layout and a full report, already
 * cleared. */
/* What both ways of adding a directory start with: its canonical path, the
 * runtime's watch source and the directory's options (*d, the caller's). */
static int watch_prepare(hk_runtime *rt, const char *dir, const hk_swap_options *opt,
                         hk_build_profile profile, char real[PATH_MAX], watch_source **s,
                         dir_opts **d, hk_report *rep) {
    int err = canonical_dir(dir, real, rep);
    if (err < 0)
        return err;
    if (!(*s = registry(rt, rep)))
        return HK_ERR_NOMEM;
    if (!(*d = dir_opts_new(real, opt, profile)))
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    return 0;
}

static int watch_dir_call(hk_runtime *rt, const char *dir, const hk_swap_options *opt,
                          hk_report *rep) {
    if (!rt || !dir || !*dir)
        return hku_fail(rep, HK_ERR_INVALID, "hk_watch_dir: runtime and directory needed");
    char real[PATH_MAX];
    watch_source *s;
    dir_opts *d;
    int err = watch_prepare(rt, dir, opt, HK_BUILD_PROFILE_DEFAULT, real, &s, &d, rep);
    if (err < 0)
        return err;
    char other[PATH_MAX];
    pthread_mutex_lock(&s->add_mu);
    if (covered_by(s, real, 0, 1, other)) {
        err = hku_fail(rep, HK_ERR_BUSY, "cannot watch %s: the watch of %s covers it already", real,
                       other);
        dir_opts_free(d);
    } else if (!s->shared) {
        hkw_opts wo;
        hkw_opts_init(&wo);
        hk_watch *w;
        err = watch_make(s, &wo, NULL, &w, rep);
        if (err == 0) {
            watch_link(s, w);
            s->shared = w;
        } else {
            dir_opts_free(d);
        }
    }
    if (err == 0)
        err = watch_add_dir(s->shared, real, d, rep);
    pthread_mutex_unlock(&s->add_mu);
    if (err == 0 && rep)
        hk_report_clear(rep);
    return err;
}

int hk_watch_dir(hk_runtime *rt, const char *dir, const hk_swap_options *opt, hk_report *rep) {
    hk_report full;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    hk_report_clear(&full);
    hk_swap_options o;
    int err;
    if (hkb_swap_options_in(&o, opt) < 0)
        err = hku_fail(&full, HK_ERR_INVALID,
                       "hk_watch_dir: hk_swap_options.size %zu is below the first layout",
                       hkb_size_of(opt));
    else
        err = watch_dir_call(rt, dir, &o, rep ? &full : NULL);
    hkb_report_out(rep, &full);
    return err;
}

/* ---- hk_watch_start / hk_watch_stop ------------------------------------- */

/* The watcher's own defaults (hkw_opts_init), in the public layout. */
static void watch_options_defaults(hk_watch_options *o) {
    hkw_opts w;
    hkw_opts_init(&w);
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->debounce_ms = w.debounce_ms;
    o->open_wait_ms = w.open_wait_ms;
}

int hk_watch_options_init_size(hk_watch_options *o, size_t size) {
    hk_watch_options d;
    watch_options_defaults(&d);
    return hkb_sized_init(o, size, &d, sizeof d, HKB_WATCH_OPTIONS_SIZE0);
}

/* hk_watch_start with its options in the library's layout (swap options
 * included) and a full report. */
static int watch_start_call(hk_runtime *rt, const char *dir, const hk_watch_options *o,
                            const hk_swap_options *so, hk_watch **out, hk_report *rep) {
    unsigned kinds = 0;
    if (!rt || !dir || !*dir || !out)
        return hku_fail(rep, HK_ERR_INVALID, "hk_watch_start: runtime, directory and out needed");
    if (o->debounce_ms < 0 || o->open_wait_ms < 0 || o->nextensions < 0 ||
        (o->nextensions > 0 && !o->extensions) || o->build_profile < HK_BUILD_PROFILE_DEFAULT ||
        o->build_profile > HK_BUILD_PROFILE_DEV)
        return hku_fail(rep, HK_ERR_INVALID,
                        "hk_watch_start: negative debounce_ms, open_wait_ms or nextensions, "
                        "extensions missing, or an unknown build_profile");
    for (int i = 0; i < o->nextensions; i++) {
        const char *e = o->extensions[i] ? o->extensions[i] : "";
        unsigned bit = hkw_source_bit(e[0] == '.' ? e + 1 : e);
        if (!bit)
            return hku_fail(rep, HK_ERR_INVALID,
                            "hk_watch_start: extension '%s' is not cu, ptx, cubin or fatbin", e);
        kinds |= bit;
    }
    char real[PATH_MAX];
    watch_source *s;
    dir_opts *d;
    int err = watch_prepare(rt, dir, so, o->build_profile, real, &s, &d, rep);
    if (err < 0)
        return err;
    hkw_opts wo;
    hkw_opts_init(&wo);
    wo.debounce_ms = o->debounce_ms;
    wo.open_wait_ms = o->open_wait_ms;
    wo.recursive = o->recursive != 0;
    wo.sources = kinds;
    /* A tree holds other files (Makefiles, notes) that nobody asked for. */
    wo.ignore_others = wo.recursive || kinds != 0;
    hk_watch *w = NULL;
    char other[PATH_MAX];
    pthread_mutex_lock(&s->add_mu);
    if (covered_by(s, real, wo.recursive, 0, other)) {
        err = hku_fail(rep, HK_ERR_BUSY,
                       "cannot watch %s: %s covers it already, or lies inside it (a directory "
                       "is watched by one watch: stop the other first)",
                       real, other);
        dir_opts_free(d);
    } else if ((err = watch_make(s, &wo, real, &w, rep)) < 0) {
        dir_opts_free(d);
    } else {
        /* Listed first, so that the deps_built hook of its first build
         * finds it. */
        watch_link(s, w);
        if ((err = watch_add_dir(w, real, d, rep)) < 0) {
            watch_unlink(s, w);
            atomic_store(&w->stopping, 1);
            watch_free(w);
            w = NULL;
        }
    }
    pthread_mutex_unlock(&s->add_mu);
    *out = w;
    return err;
}

int hk_watch_start(hk_runtime *rt, const char *dir, const hk_watch_options *opt, hk_watch **out,
                   hk_report *rep) {
    hk_report full;
    if (out)
        *out = NULL;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    hk_report_clear(&full);
    hk_watch_options o;
    hk_swap_options so;
    int err;
    watch_options_defaults(&o);
    if (opt && hkb_sized_in(&o, sizeof o, opt, HKB_WATCH_OPTIONS_SIZE0) < 0)
        err = hku_fail(&full, HK_ERR_INVALID,
                       "hk_watch_start: hk_watch_options.size %zu is below the first layout",
                       hkb_size_of(opt));
    else if (hkb_swap_options_in(&so, o.swap) < 0)
        err = hku_fail(&full, HK_ERR_INVALID,
                       "hk_watch_start: hk_swap_options.size %zu is below the first layout",
                       hkb_size_of(o.swap));
    else
        err = watch_start_call(rt, dir, &o, &so, out, &full);
    hkb_report_out(rep, &full);
    return err;
}

/*
 * Stopping. hk_watch_stop marks the watch stopping (its callbacks return at
 * once from then on), stops its watcher, which waits for a callback in
 * progress (so a submission in flight ends before stop returns), and only
 * then unlinks and frees it. Called on the watch's own thread (from a
 * refusal's event callback) it cannot wait for itself: the watcher ends
 * after that callback, and the watch is kept on the registry's stopped list
 * until the runtime's release frees it.
 */
void hk_watch_stop(hk_watch *w) {
    if (!w)
        return;
    watch_source *s = w->src;
    /* From now on its callbacks return at once, even one already called. */
    atomic_store(&w->stopping, 1);
    int own = hkw_on_thread(w->w);
    /* Waits for a callback in progress (a submission included), unless
     * called from one: then that one is the last. */
    hkw_stop(w->w);
    pthread_mutex_lock(&s->mu);
    hk_watch **pp = &s->watches;
    while (*pp && *pp != w)
        pp = &(*pp)->next;
    if (*pp == w)
        *pp = w->next;
    if (own) {
        /* Its thread is still in this call: the runtime's release frees it. */
        w->next = s->stopped;
        s->stopped = w;
    } else {
        hkw_stats st;
        hkw_stats_get(w->w, &st);
        stats_add(&s->retired, &st);
    }
    pthread_mutex_unlock(&s->mu);
    if (!own)
        watch_free(w);
}

/*
 * The watcher's entries and what moves them: inotify events, directory
 * listings and the placing of watches, all with mu held (watch/watcher.h).
 *
 * - Events are only hints (see watch.c): an event or a listing makes an
 *   entry due, at once for a completed save, after the quiet period
 *   otherwise; the watcher thread reads what is due.
 * - Entries (directories and files) are never freed before destroy. The
 *   thread may therefore keep a pointer to an entry while it reads the file
 *   and runs the callback without the lock, and hkw_set_deps may link
 *   entries to each other by pointer.
 * - Directories the application did not add, but where dependencies live, are
 *   watched for those dependencies only; nothing there becomes a module.
 * - Every name of an added directory that is not an editor dropping gets an
 *   entry, even one that can never be handed over, so that a refusal is
 *   reported once per change like a handover: the entry remembers the
 *   identity (inode, size, mode, times) of what it last refused.
 * - A followed link's entry remembers its target, so that an event on the
 *   target schedules the link.
 * - A directory that disappears is looked for again every dir_poll_ms (a
 *   subdirectory of a recursive watch only once its parent says it is back),
 *   and listed when its watch is placed again.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/util.h"
#include "watch/watcher.h"

/* File times come from a coarse clock that may lag the wall clock by a tick;
 * comparisons against a wall-clock threshold allow this much slack, erring
 * towards a rebuild too many. */
#define SLACK_NS 20000000LL

__attribute__((format(printf, 3, 4))) void hkw_log_at(hkw_watcher *w, hk_log_level level,
                                                      const char *fmt, ...) {
    if (!w->o.log || (w->o.log_on && !w->o.log_on(w->o.log_ud, level)))
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    w->o.log(w->o.log_ud, level, line);
}

/* ---- entries (mu held) -------------------------------------------------- */

watch_dir *hkw_dir_by_path(hkw_watcher *w, const char *path) {
    for (int i = 0; i < w->ndirs; i++) {
        if (strcmp(w->dirs[i]->path, path) == 0)
            return w->dirs[i];
    }
    return NULL;
}

static watch_dir *dir_by_wd(hkw_watcher *w, int wd) {
    for (int i = 0; i < w->ndirs; i++) {
        if (w->dirs[i]->wd == wd)
            return w->dirs[i];
    }
    return NULL;
}

/* A new, unwatched directory entry, appended to w->dirs. */
watch_dir *hkw_dir_new(hkw_watcher *w, const char *path) {
    if (w->ndirs == w->capdirs) {
        int cap = w->capdirs ? w->capdirs * 2 : 4;
        watch_dir **nd = realloc(w->dirs, (size_t)cap * sizeof *nd);
        if (!nd)
            return NULL;
        w->dirs = nd;
        w->capdirs = cap;
    }
    watch_dir *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->path = strdup(path);
    if (!d->path) {
        free(d);
        return NULL;
    }
    d->wd = -1;
    d->root = d->path;
    w->dirs[w->ndirs++] = d;
    return d;
}

watch_file *hkw_file_find(hkw_watcher *w, const watch_dir *d, const char *name) {
    for (int i = 0; i < w->nfiles; i++) {
        if (w->files[i]->dir == d && strcmp(w->files[i]->name, name) == 0)
            return w->files[i];
    }
    return NULL;
}

watch_file *hkw_file_new(hkw_watcher *w, watch_dir *d, const char *name) {
    if (w->nfiles == w->capfiles) {
        int cap = w->capfiles ? w->capfiles * 2 : 16;
        watch_file **nf = realloc(w->files, (size_t)cap * sizeof *nf);
        if (!nf)
            return NULL;
        w->files = nf;
        w->capfiles = cap;
    }
    watch_file *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->dir = d;
    f->name = strdup(name);
    size_t len = strlen(d->path) + 1 + strlen(name) + 1;
    f->path = malloc(len);
    if (!f->name || !f->path)
        goto fail;
    snprintf(f->path, len, "%s/%s", d->path, name);
    hkw_kind k = hkw_classify(name, NULL, 0);
    f->source_name = k == HKW_SOURCE;
    char module[HKW_MODULE_MAX], why[256] = "";
    if (k == HKW_SOURCE && hkw_classify(name, module, sizeof module) != k) {
        /* The engine would refuse the name without an event; say so here. */
        f->name_err = HK_ERR_INVALID;
        snprintf(why, sizeof why,
                 "module name (the file name up to its first '.') is %zu characters long, "
                 "the most is %d: not read",
                 strcspn(name, "."), HKW_MODULE_MAX - 1);
    } else if (k == HKW_SOURCE && hku_name_check(module, why, sizeof why) < 0) {
        /* As the engine would refuse it (a line feed, bytes that are not
         * UTF-8, a control character): it could be neither recorded nor
         * logged. */
        f->name_err = HK_ERR_INVALID;
        size_t n = strlen(why);
        snprintf(why + n, sizeof why - n, " (the file name up to its first '.'): not read");
    } else if (k == HKW_SOURCE) {
        f->module = strdup(module);
        if (!f->module)
            goto fail;
    } else if (k == HKW_OTHER) {
        f->name_err = HK_ERR_FORMAT;
        snprintf(why, sizeof why,
                 "not a kernel source or header name (sources end in .cu, .ptx, .cubin or "
                 ".fatbin, headers in .h, .cuh or .hpp): not read");
    }
    if (f->name_err && !(f->name_why = strdup(why)))
        goto fail;
    w->files[w->nfiles++] = f;
    return f;

fail:
    free(f->name_why);
    free(f->module);
    free(f->path);
    free(f->name);
    free(f);
    return NULL;
}

/* The entry for an event or a listing in d, created when the name is one the
 * watcher tracks there. NULL when the name is of no interest. */
watch_file *hkw_file_get(hkw_watcher *w, watch_dir *d, const char *name) {
    watch_file *f = hkw_file_find(w, d, name);
    if (f || !d->modules)
        return f;
    hkw_kind k = hkw_classify(name, NULL, 0);
    if (k == HKW_IGNORED)
        return NULL; /* an editor dropping: silently */
    if (k == HKW_OTHER && w->o.ignore_others)
        return NULL;
    if (k == HKW_SOURCE && w->o.sources && !(w->o.sources & hkw_source_bit(strrchr(name, '.') + 1)))
        return NULL; /* a kind of source this watcher does not build */
    return hkw_file_new(w, d, name);
}

void hkw_schedule(watch_file *f, int64_t due_ms) {
    if (!f->pending || f->due_ms < due_ms)
        f->due_ms = due_ms;
    f->pending = 1;
}

/* t less the file-time slack (SLACK_NS). */
struct timespec hkw_minus_slack(struct timespec t) {
    t.tv_nsec -= SLACK_NS;
    if (t.tv_nsec < 0) {
        t.tv_nsec += 1000000000L;
        t.tv_sec--;
    }
    return t;
}

/* f's next read records its hash only (a baseline), unless f was modified
 * at or after since; an earlier since than the one noted wins. */
void hkw_note_since(watch_file *f, struct timespec since) {
    if (!f->since_set || hkw_ts_ns(since) < hkw_ts_ns(f->since)) {
        f->since = since;
        f->since_set = 1;
    }
}

/* f's content changed: every file whose build read f is handed over again. */
void hkw_force_dependents(hkw_watcher *w, const watch_file *f, int64_t now) {
    for (int i = 0; i < w->nfiles; i++) {
        watch_file *g = w->files[i];
        for (int j = 0; j < g->ndeps; j++) {
            if (g->deps[j] != f)
                continue;
            g->force = 1;
            g->baseline = 0;
            if (!g->pending || g->due_ms > now)
                g->due_ms = now;
            g->pending = 1;
            w->st.dep_rebuilds++;
            hkw_log_at(w, HK_LOG_INFO, "%s changed: %s, whose build read it, is due again", f->path,
                       g->path);
            break;
        }
    }
}

/* ---- events, listings, watches (mu held) -------------------------------- */

static void lose_dir(hkw_watcher *w, watch_dir *d, int64_t now, const char *why) {
    d->wd = -1;
    d->next_poll_ms = now + w->o.dir_poll_ms;
    w->st.dirs_lost++;
    if (d->child) {
        /* Its parent's events (or listing) say when it is back. */
        d->dormant = 1;
        hkw_log_at(w, HK_LOG_INFO, "subdirectory %s %s", d->path, why);
        return;
    }
    hkw_log_at(w, HK_LOG_WARN, "directory %s %s: waiting for it to reappear", d->path, why);
}

/* Subdirectory name of the recursive directory d, created, moved in or
 * listed: watched from the thread's next round (its files are listed then,
 * as an initial listing when initial is set). Dot-directories are not
 * entered. */
static void child_dir(hkw_watcher *w, const watch_dir *d, const char *name, int initial) {
    char path[PATH_MAX];
    if (!d->recursive || !d->modules || name[0] == '.' ||
        snprintf(path, sizeof path, "%s/%s", d->path, name) >= (int)sizeof path)
        return;
    watch_dir *c = hkw_dir_by_path(w, path);
    if (c && c->modules && !c->dormant)
        return; /* known and watched already */
    if (!c && !(c = hkw_dir_new(w, path))) {
        hkw_log_at(w, HK_LOG_WARN, "out of memory: subdirectory %s not watched", path);
        return;
    }
    c->modules = 1;
    c->recursive = 1;
    c->child = 1;
    c->root = d->root;
    c->dormant = 0;
    c->scan_initial = initial;
    c->need_scan = 1;
    if (c->wd < 0)
        c->next_poll_ms = 0; /* placed, then listed, by the next hkw_dirs_tick */
}

/* An event for name in d: every followed link that resolved to it is due too,
 * since its content is the target's (at once after a completed save). */
static void link_targets(hkw_watcher *w, const watch_dir *d, const char *name, int64_t now,
                         int complete) {
    size_t dlen = strlen(d->path);
    for (int i = 0; i < w->nfiles; i++) {
        watch_file *g = w->files[i];
        if (!g->target || strncmp(g->target, d->path, dlen) != 0 || g->target[dlen] != '/' ||
            strcmp(g->target + dlen + 1, name) != 0)
            continue;
        g->baseline = 0;
        g->pending = 1;
        g->complete = complete;
        g->due_ms = complete ? now : now + w->o.debounce_ms;
    }
}

static const char *event_name(uint32_t mask) {
    return (mask & IN_CLOSE_WRITE)  ? "closed after writing"
           : (mask & IN_MOVED_TO)   ? "moved in"
           : (mask & IN_MOVED_FROM) ? "moved away"
           : (mask & IN_CREATE)     ? "created"
           : (mask & IN_DELETE)     ? "deleted"
           : (mask & IN_MODIFY)     ? "written"
                                    : "changed";
}

void hkw_on_event(hkw_watcher *w, const struct inotify_event *ev, int64_t now) {
    w->st.events++;
    if (ev->mask & IN_Q_OVERFLOW) {
        w->st.overflows++;
        for (int i = 0; i < w->ndirs; i++) {
            if (w->dirs[i]->wd >= 0)
                w->dirs[i]->need_scan = 1;
        }
        hkw_log_at(w, HK_LOG_WARN,
                   "event queue overflow: events were lost, rescanning %d directories", w->ndirs);
        return;
    }
    watch_dir *d = dir_by_wd(w, ev->wd);
    if (!d)
        return; /* A late event of a watch already given up. */
    if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_UNMOUNT)) {
        /* A moved directory keeps its watch under the new name: drop it so
         * that the path, not the inode, is what is watched. */
        if (ev->mask & IN_MOVE_SELF)
            inotify_rm_watch(w->ifd, d->wd);
        lose_dir(w, d, now, (ev->mask & IN_MOVE_SELF) ? "moved" : "removed");
        return;
    }
    if (ev->len == 0)
        return;
    if (ev->mask & IN_ISDIR) {
        /* A subdirectory that went away sees its own IN_DELETE_SELF. */
        if (ev->mask & (IN_CREATE | IN_MOVED_TO))
            child_dir(w, d, ev->name, 0);
        return;
    }
    /* The writer is done: nothing is gained by waiting. */
    int complete = (ev->mask & (IN_CLOSE_WRITE | IN_MOVED_TO)) != 0;
    link_targets(w, d, ev->name, now, complete);
    watch_file *f = hkw_file_get(w, d, ev->name);
    if (!f)
        return;
    if (ev->mask & (IN_CREATE | IN_MODIFY)) {
        if (!f->open_since_ms)
            f->open_since_ms = now;
    } else {
        f->open_since_ms = 0;
    }
    f->baseline = 0;
    f->pending = 1;
    f->complete = complete;
    f->due_ms = complete ? now : now + w->o.debounce_ms;
    f->events++;
    if (complete)
        hkw_log_at(w, HK_LOG_DEBUG, "%s: %s; read now", f->path, event_name(ev->mask));
    else
        hkw_log_at(w, HK_LOG_DEBUG, "%s: %s; read when quiet for %d ms", f->path,
                   event_name(ev->mask), w->o.debounce_ms);
}

/* Handles the events that arrived since the thread last looked, without
 * waiting: after a read, so that a write that began just before it is
 * known before the read is trusted. */
void hkw_drain_events(hkw_watcher *w, int64_t now) {
    for (;;) {
        ssize_t n = read(w->ifd, w->evbuf, sizeof w->evbuf);
        if (n <= 0)
            return;
        for (char *p = w->evbuf; p < w->evbuf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)(void *)p;
            hkw_on_event(w, ev, now);
            p += sizeof *ev + ev->len;
        }
    }
}

static void scan_dir(hkw_watcher *w, watch_dir *d, int64_t now) {
    int initial = d->scan_initial;
    struct timespec since = hkw_minus_slack(d->added);
    d->need_scan = 0;
    d->scan_initial = 0;
    w->st.rescans++;
    DIR *dh = opendir(d->path);
    if (!dh) {
        hkw_log_at(w, HK_LOG_WARN, "cannot list %s: %s", d->path, strerror(errno));
        return;
    }
    struct dirent *de;
    while ((de = readdir(dh)) != NULL) {
        int is_dir = de->d_type == DT_DIR;
        if (de->d_type == DT_UNKNOWN && d->recursive) {
            struct stat st;
            char p[PATH_MAX];
            is_dir = snprintf(p, sizeof p, "%s/%s", d->path, de->d_name) < (int)sizeof p &&
                     lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
        }
        if (is_dir) {
            if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
                child_dir(w, d, de->d_name, initial);
            continue;
        }
        watch_file *f = hkw_file_get(w, d, de->d_name);
        if (!f)
            continue;
        /* A file seen for the first time is handed over (or refused) when it
         * is named as a module source of an added directory (unless the
         * application asked otherwise). Anything else is only recorded,
         * unless it was modified after the watch was placed, which is then a
         * change. */
        if (!f->has_hash && (!f->source_name || !d->modules || (initial && w->o.no_initial_scan))) {
            f->baseline = 1;
            hkw_note_since(f, since);
        }
        /* The first listing reads at once: files present when the watch
         * starts are normally complete, and one still being written sends
         * events that schedule it again. A listing after an overflow or of a
         * directory that (re)appeared waits for the quiet period: files may
         * be in the middle of being written there, with their events lost. */
        hkw_schedule(f, initial ? now : now + w->o.debounce_ms);
    }
    closedir(dh);
}

/* Places missing watches whose time has come, then lists what needs it. */
void hkw_dirs_tick(hkw_watcher *w, int64_t now) {
    for (int i = 0; i < w->ndirs; i++) {
        watch_dir *d = w->dirs[i];
        if (d->wd < 0 && !d->dormant && now >= d->next_poll_ms) {
            d->added = hkw_wall_now();
            d->wd = inotify_add_watch(w->ifd, d->path, WATCH_MASK);
            if (d->wd < 0 && d->child) {
                /* Gone again before it could be watched, or inotify's
                 * limit: the parent's next event or listing tries again. */
                d->dormant = 1;
                hkw_log_at(w, errno == ENOENT || errno == ENOTDIR ? HK_LOG_DEBUG : HK_LOG_WARN,
                           "cannot watch subdirectory %s: %s", d->path, strerror(errno));
                continue;
            }
            if (d->wd < 0) {
                d->next_poll_ms = now + w->o.dir_poll_ms;
                continue;
            }
            d->need_scan = 1;
            hkw_log_at(w, d->modules ? HK_LOG_INFO : HK_LOG_DEBUG, "watching %s", d->path);
        }
        if (d->wd >= 0 && d->need_scan)
            scan_dir(w, d, now);
    }
}

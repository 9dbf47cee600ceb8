/*
 * The directory watcher: inotify events in, finished files out.
 *
 * Why it is shaped this way:
 * - Events are only hints. Whether a file changed is decided by its content
 *   hash, not by the events. That makes every save pattern, a lost event
 *   queue (IN_Q_OVERFLOW) and a recreated directory the same case: look at
 *   the files again and compare hashes, so an update is never missed and
 *   never handed over twice.
 * - When to look is decided by the events. A completed save (IN_CLOSE_WRITE:
 *   the writer closed the file; IN_MOVED_TO: a finished file was renamed
 *   over it) is read at once: waiting would only add latency to every save,
 *   and a save that follows is read at once too, its content newer. Anything
 *   else (a write to a file kept open, a creation, a deletion, a listing
 *   after an overflow) waits for the debounce period of quiet, and a file open
 *   for writing for its close or open_wait_ms, because no event will say when
 *   that writer is done.
 * - A read is trusted only if the file kept its size, times and inode from
 *   before the read to after it, and no event for it arrived meanwhile (the
 *   queue is drained right after the read: a writer that truncated the file
 *   just before it would otherwise hand over half a file); otherwise it is
 *   retried, so a half-written file never leaves the watcher. An empty file
 *   seen right after a close is looked at again after the quiet period
 *   before it is refused: some writers truncate and close before writing.
 * - Entries (directories and files) are never freed before destroy. The thread
 *   may therefore keep a pointer to an entry while it reads the file and runs
 *   the callback without the lock, and hkw_set_deps may link entries
 *   to each other by pointer.
 * - Directories the application did not add, but where dependencies live, are
 *   watched for those dependencies only; nothing there becomes a module.
 * - Every name of an added directory that is not an editor dropping gets an
 *   entry, even one that can never be handed over, so that a refusal is
 *   reported once per change like a handover: the entry remembers the
 *   identity (inode, size, mode, times) of what it last refused. The reason
 *   is built from metadata only; content is never quoted, because a refused
 *   file may be anything (a link to /etc/passwd, a device, someone's notes).
 * - Nothing but a regular file is opened, and a file that cannot be read is
 *   refused and left alone until an event says it changed: retrying is only
 *   for a regular file caught mid-write, never for one that will not settle
 *   (a procfs file reports 0 bytes and then has content on every read).
 * - A followed symbolic link is read through its resolved path, and its entry
 *   remembers that path so that an event on the target schedules the link.
 *
 * Threads and locks: one mutex, mu, guards every mutable field below; the
 * watcher thread drops it to read a file and to run the callback, never
 * holding it across either. The trace hook is called with mu held.
 */
#include "watch/watch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "util/util.h"

#define HASH_BYTES  32
#define EVBUF_BYTES 65536
#define WATCH_MASK                                                                                 \
    (IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_MODIFY |            \
     IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
/* File times come from a coarse clock that may lag the wall clock by a tick;
 * comparisons against a wall-clock threshold allow this much slack, erring
 * towards a rebuild too many. */
#define SLACK_NS 20000000LL
/* Shortest postponement, so that a debounce of 0 cannot spin. */
#define MIN_WAIT_MS 10

typedef struct watch_dir {
    char *path; /* immutable: canonical, no trailing '/' */
    /* All below: mu. */
    int modules;           /* 1 when added by hkw_add_dir: sources here are modules */
    int wd;                /* inotify watch descriptor, -1 while not watched */
    int64_t next_poll_ms;  /* while wd < 0: when to try to place the watch */
    int need_scan;         /* list the directory on the next loop */
    int scan_initial;      /* that listing is the first since hkw_add_dir */
    struct timespec added; /* wall time the watch was last placed */
    int recursive;         /* its subdirectories are added too */
    int child;             /* added as a subdirectory of a recursive one */
    const char *root;      /* the added directory it belongs to (its own path,
                            * or its parent's root for a child): links that
                            * resolve inside root are followed */
    int dormant;           /* a child that disappeared: not looked for until
                            * its parent says it is back */
} watch_dir;

/* What a name was when it was last refused. */
typedef struct file_sig {
    dev_t dev;
    ino_t ino;
    mode_t mode;
    off_t size;
    struct timespec mtime, ctime;
} file_sig;

typedef struct watch_file {
    watch_dir *dir;  /* immutable */
    char *name;      /* immutable: bare file name */
    char *path;      /* immutable: dir->path + '/' + name */
    char *module;    /* immutable: module name of a source, else NULL */
    int source_name; /* immutable: named like a module source (module may not fit) */
    int name_err;    /* immutable: HK_ERR_* when the name itself is refused, else 0 */
    char *name_why;  /* immutable: why, when name_err */
    /* All below: mu. */
    unsigned char hash[HASH_BYTES]; /* content last read */
    int has_hash;
    int pending;           /* a read is due at due_ms */
    int events;            /* inotify events since the last read */
    int64_t due_ms;        /* monotonic */
    int64_t open_since_ms; /* first write not yet followed by a close, else 0 */
    int complete;          /* the latest event was a completed save */
    int force;             /* hand over at the next read even if unchanged */
    int baseline;          /* the next read records the hash only, unless the
                            * file was modified at or after `since` */
    int since_set;
    struct timespec since;
    uint64_t changed_seq;        /* w->seq at the last change of a known content, else 0 */
    uint64_t handed_seq;         /* w->seq at the last handover, else 0 */
    struct timespec handed_wall; /* wall clock of the last handover */
    struct watch_file **deps;    /* what its last build read */
    int ndeps;
    int dep;     /* named by hkw_set_deps: never refused for its name */
    int refused; /* `refused_sig` holds the name's identity at the last refusal */
    file_sig refused_sig;
    char *target; /* a followed link: its canonical target, else NULL */
} watch_file;

struct hkw_watcher {
    /* Immutable after create. */
    hkw_opts o;
    int ifd; /* inotify, non-blocking */
    int efd; /* eventfd that wakes the thread */
    pthread_t thread;

    pthread_mutex_t mu;
    pthread_cond_t cv;       /* mu: pause handshake */
    pthread_mutex_t join_mu; /* one joiner of the thread at a time */
    int joined;              /* join_mu */
    /* All below: mu. */
    int stop;
    int paused, paused_ack;
    watch_dir **dirs;
    int ndirs, capdirs;
    watch_file **files;
    int nfiles, capfiles;
    hkw_stats st;
    uint64_t seq; /* orders content changes against handovers */

    /* Watcher thread only. */
    char evbuf[EVBUF_BYTES] __attribute__((aligned(__alignof__(struct inotify_event))));
};

/* ---- small helpers ------------------------------------------------------ */

static struct timespec wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts;
}

static long long ts_ns(struct timespec ts) {
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int ts_eq(struct timespec a, struct timespec b) {
    return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

__attribute__((format(printf, 3, 4))) static void log_at(hkw_watcher *w, hk_log_level level,
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

static void wake_thread(hkw_watcher *w) {
    uint64_t one = 1;
    /* A full counter (EAGAIN) already means "wake up". */
    if (write(w->efd, &one, sizeof one) < 0) {
        return;
    }
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* sed -i's temporary file: "sed" and six characters of mkstemp's
 * alphabet, made beside the file and renamed over it. Without a dot it can
 * never be a kernel source or header, so ignoring the shape loses nothing. */
static int is_sed_temp(const char *name) {
    if (strncmp(name, "sed", 3) != 0 || strlen(name) != 9)
        return 0;
    for (const char *p = name + 3; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')))
            return 0;
    return 1;
}

/* Files that editors (and sed -i) write next to the real one while saving. */
static int is_dropping(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || name[0] == '.' || name[n - 1] == '~')
        return 1;
    if (name[0] == '#' && name[n - 1] == '#')
        return 1;
    if (strcmp(name, "4913") == 0 || is_sed_temp(name))
        return 1;
    return ends_with(name, ".swp") || ends_with(name, ".swx") || ends_with(name, ".swo") ||
           ends_with(name, ".tmp") || ends_with(name, "___jb_tmp___") ||
           ends_with(name, "___jb_old___");
}

/* The source kinds, by extension: the one table of them (hkw_classify,
 * hkw_source_bit, hkw_source_format). */
static const struct {
    const char *ext;
    unsigned bit;
    hk_format fmt;
} sources[] = {{"cu", HKW_SRC_CU, HK_FORMAT_CUDA_C},
               {"ptx", HKW_SRC_PTX, HK_FORMAT_PTX},
               {"cubin", HKW_SRC_CUBIN, HK_FORMAT_CUBIN},
               {"fatbin", HKW_SRC_FATBIN, HK_FORMAT_FATBIN}};
#define NSOURCES (sizeof sources / sizeof sources[0])

hkw_kind hkw_classify(const char *name, char *module, size_t module_size) {
    static const char *const headers[] = {"h", "cuh", "hpp"};
    if (!name || strchr(name, '/') || is_dropping(name))
        return HKW_IGNORED;
    const char *first = strchr(name, '.');
    if (!first)
        return HKW_OTHER;
    const char *ext = strrchr(name, '.') + 1;
    for (size_t i = 0; i < NSOURCES; i++) {
        if (strcmp(ext, sources[i].ext) != 0)
            continue;
        size_t len = (size_t)(first - name);
        if (module) {
            if (len >= module_size)
                return HKW_IGNORED;
            memcpy(module, name, len);
            module[len] = '\0';
        }
        return HKW_SOURCE;
    }
    for (size_t i = 0; i < sizeof headers / sizeof headers[0]; i++) {
        if (strcmp(ext, headers[i]) == 0)
            return HKW_HEADER;
    }
    return HKW_OTHER;
}

/* The source kind of extension ext (any case), or -1. */
static int source_of(const char *ext) {
    for (size_t i = 0; ext && i < NSOURCES; i++) {
        if (strcasecmp(ext, sources[i].ext) == 0)
            return (int)i;
    }
    return -1;
}

unsigned hkw_source_bit(const char *ext) {
    int i = source_of(ext);
    return i < 0 ? 0 : sources[i].bit;
}

hk_format hkw_source_format(const char *ext) {
    int i = source_of(ext);
    return i < 0 ? HK_FORMAT_AUTO : sources[i].fmt;
}

/* Writes the canonical form of path to out: the real path of its directory,
 * '/', its last component. A relative path is taken relative to base (or the
 * working directory when base is NULL). The file itself need not exist; when
 * its directory does not either, the path is kept as written. */
static int canon_path(const char *path, const char *base, char *out, size_t out_size) {
    char joined[PATH_MAX], dir[PATH_MAX], real[PATH_MAX];
    int n;
    if (path[0] != '/' && base)
        n = snprintf(joined, sizeof joined, "%s/%s", base, path);
    else
        n = snprintf(joined, sizeof joined, "%s", path);
    if (n < 0 || (size_t)n >= sizeof joined)
        return HK_ERR_INVALID;
    const char *slash = strrchr(joined, '/'), *name;
    if (!slash) {
        snprintf(dir, sizeof dir, ".");
        name = joined;
    } else {
        if (slash == joined)
            snprintf(dir, sizeof dir, "/");
        else
            snprintf(dir, sizeof dir, "%.*s", (int)(slash - joined), joined);
        name = slash + 1;
    }
    if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return HK_ERR_INVALID;
    if (!realpath(dir, real)) {
        if (joined[0] != '/')
            return HK_ERR_INVALID;
        snprintf(real, sizeof real, "%s", dir);
    }
    n = snprintf(out, out_size, "%s/%s", strcmp(real, "/") == 0 ? "" : real, name);
    if (n < 0 || (size_t)n >= out_size)
        return HK_ERR_INVALID;
    return 0;
}

/* ---- entries (mu held) -------------------------------------------------- */

static watch_dir *dir_by_path(hkw_watcher *w, const char *path) {
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
static watch_dir *dir_new(hkw_watcher *w, const char *path) {
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

static watch_file *file_find(hkw_watcher *w, const watch_dir *d, const char *name) {
    for (int i = 0; i < w->nfiles; i++) {
        if (w->files[i]->dir == d && strcmp(w->files[i]->name, name) == 0)
            return w->files[i];
    }
    return NULL;
}

static watch_file *file_new(hkw_watcher *w, watch_dir *d, const char *name) {
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
static watch_file *file_get(hkw_watcher *w, watch_dir *d, const char *name) {
    watch_file *f = file_find(w, d, name);
    if (f || !d->modules)
        return f;
    hkw_kind k = hkw_classify(name, NULL, 0);
    if (k == HKW_IGNORED)
        return NULL; /* an editor dropping: silently */
    if (k == HKW_OTHER && w->o.ignore_others)
        return NULL;
    if (k == HKW_SOURCE && w->o.sources && !(w->o.sources & hkw_source_bit(strrchr(name, '.') + 1)))
        return NULL; /* a kind of source this watcher does not build */
    return file_new(w, d, name);
}

static void schedule(watch_file *f, int64_t due_ms) {
    if (!f->pending || f->due_ms < due_ms)
        f->due_ms = due_ms;
    f->pending = 1;
}

/* t less the file-time slack (SLACK_NS). */
static struct timespec minus_slack(struct timespec t) {
    t.tv_nsec -= SLACK_NS;
    if (t.tv_nsec < 0) {
        t.tv_nsec += 1000000000L;
        t.tv_sec--;
    }
    return t;
}

/* f's next read records its hash only (a baseline), unless f was modified
 * at or after since; an earlier since than the one noted wins. */
static void note_since(watch_file *f, struct timespec since) {
    if (!f->since_set || ts_ns(since) < ts_ns(f->since)) {
        f->since = since;
        f->since_set = 1;
    }
}

/* f's content changed: every file whose build read f is handed over again. */
static void force_dependents(hkw_watcher *w, const watch_file *f, int64_t now) {
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
            log_at(w, HK_LOG_INFO, "%s changed: %s, whose build read it, is due again", f->path,
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
        log_at(w, HK_LOG_INFO, "subdirectory %s %s", d->path, why);
        return;
    }
    log_at(w, HK_LOG_WARN, "directory %s %s: waiting for it to reappear", d->path, why);
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
    watch_dir *c = dir_by_path(w, path);
    if (c && c->modules && !c->dormant)
        return; /* known and watched already */
    if (!c && !(c = dir_new(w, path))) {
        log_at(w, HK_LOG_WARN, "out of memory: subdirectory %s not watched", path);
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
        c->next_poll_ms = 0; /* placed, then listed, by the next dirs_tick */
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

static void on_event(hkw_watcher *w, const struct inotify_event *ev, int64_t now) {
    w->st.events++;
    if (ev->mask & IN_Q_OVERFLOW) {
        w->st.overflows++;
        for (int i = 0; i < w->ndirs; i++) {
            if (w->dirs[i]->wd >= 0)
                w->dirs[i]->need_scan = 1;
        }
        log_at(w, HK_LOG_WARN, "event queue overflow: events were lost, rescanning %d directories",
               w->ndirs);
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
    watch_file *f = file_get(w, d, ev->name);
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
        log_at(w, HK_LOG_DEBUG, "%s: %s; read now", f->path, event_name(ev->mask));
    else
        log_at(w, HK_LOG_DEBUG, "%s: %s; read when quiet for %d ms", f->path, event_name(ev->mask),
               w->o.debounce_ms);
}

/* Handles the events that arrived since the thread last looked, without
 * waiting: after a read, so that a write that began just before it is
 * known before the read is trusted. */
static void drain_events(hkw_watcher *w, int64_t now) {
    for (;;) {
        ssize_t n = read(w->ifd, w->evbuf, sizeof w->evbuf);
        if (n <= 0)
            return;
        for (char *p = w->evbuf; p < w->evbuf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)(void *)p;
            on_event(w, ev, now);
            p += sizeof *ev + ev->len;
        }
    }
}

static void scan_dir(hkw_watcher *w, watch_dir *d, int64_t now) {
    int initial = d->scan_initial;
    struct timespec since = minus_slack(d->added);
    d->need_scan = 0;
    d->scan_initial = 0;
    w->st.rescans++;
    DIR *dh = opendir(d->path);
    if (!dh) {
        log_at(w, HK_LOG_WARN, "cannot list %s: %s", d->path, strerror(errno));
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
        watch_file *f = file_get(w, d, de->d_name);
        if (!f)
            continue;
        /* A file seen for the first time is handed over (or refused) when it
         * is named as a module source of an added directory (unless the
         * application asked otherwise). Anything else is only recorded,
         * unless it was modified after the watch was placed, which is then a
         * change. */
        if (!f->has_hash && (!f->source_name || !d->modules || (initial && w->o.no_initial_scan))) {
            f->baseline = 1;
            note_since(f, since);
        }
        /* The first listing reads at once: files present when the watch
         * starts are normally complete, and one still being written sends
         * events that schedule it again. A listing after an overflow or of a
         * directory that (re)appeared waits for the quiet period: files may
         * be in the middle of being written there, with their events lost. */
        schedule(f, initial ? now : now + w->o.debounce_ms);
    }
    closedir(dh);
}

/* Places missing watches whose time has come, then lists what needs it. */
static void dirs_tick(hkw_watcher *w, int64_t now) {
    for (int i = 0; i < w->ndirs; i++) {
        watch_dir *d = w->dirs[i];
        if (d->wd < 0 && !d->dormant && now >= d->next_poll_ms) {
            d->added = wall_now();
            d->wd = inotify_add_watch(w->ifd, d->path, WATCH_MASK);
            if (d->wd < 0 && d->child) {
                /* Gone again before it could be watched, or inotify's
                 * limit: the parent's next event or listing tries again. */
                d->dormant = 1;
                log_at(w, errno == ENOENT || errno == ENOTDIR ? HK_LOG_DEBUG : HK_LOG_WARN,
                       "cannot watch subdirectory %s: %s", d->path, strerror(errno));
                continue;
            }
            if (d->wd < 0) {
                d->next_poll_ms = now + w->o.dir_poll_ms;
                continue;
            }
            d->need_scan = 1;
            log_at(w, d->modules ? HK_LOG_INFO : HK_LOG_DEBUG, "watching %s", d->path);
        }
        if (d->wd >= 0 && d->need_scan)
            scan_dir(w, d, now);
    }
}

/* ---- reading a file (no lock) ------------------------------------------- */

enum read_result {
    READ_OK,
    READ_GONE,     /* no such file (any more) */
    READ_UNSTABLE, /* changed during the read */
    READ_REFUSED,  /* cannot be handed over: see err and why */
};

/* What one look at a file found. */
typedef struct look {
    int err;                  /* REFUSED: the HK_ERR_* that fits */
    char why[PATH_MAX + 192]; /* REFUSED: the reason, no content */
    file_sig sig;             /* the name's own identity (lstat) */
    char target[PATH_MAX];    /* a followed link: its canonical target, else "" */
    unsigned char *bytes;     /* OK: the content (caller frees) */
    size_t size;
    struct timespec mtime;
    int opened; /* the file was opened */
    int empty;  /* REFUSED: because it is empty */
} look;

static file_sig sig_of(const struct stat *st) {
    return (file_sig){.dev = st->st_dev,
                      .ino = st->st_ino,
                      .mode = st->st_mode,
                      .size = st->st_size,
                      .mtime = st->st_mtim,
                      .ctime = st->st_ctim};
}

static int sig_eq(const file_sig *a, const file_sig *b) {
    return a->dev == b->dev && a->ino == b->ino && a->mode == b->mode && a->size == b->size &&
           ts_eq(a->mtime, b->mtime) && ts_eq(a->ctime, b->ctime);
}

static const char *type_name(mode_t m) {
    return S_ISFIFO(m)   ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISDIR(m)  ? "a directory"
                         : "not a regular file";
}

__attribute__((format(printf, 3, 4))) static int refusal(look *lk, int err, const char *fmt, ...) {
    lk->err = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(lk->why, sizeof lk->why, fmt, ap);
    va_end(ap);
    return READ_REFUSED;
}

/* After a failed lstat, stat or open: READ_GONE when the name is gone,
 * else a refusal saying what could not be done. */
static int gone_or_refused(look *lk, const char *what) {
    if (errno == ENOENT || errno == ENOTDIR)
        return READ_GONE;
    return refusal(lk, HK_ERR_IO, "%s: %s", what, strerror(errno));
}

/* The look at path before anything is opened: its identity (lk->sig), the
 * link policy (a followed link's target goes to lk->target), and whether it
 * is a regular file of at most max bytes, decided before open() because
 * opening a FIFO or a device may block or act. Returns READ_OK with *st
 * describing what will be opened, or READ_GONE or READ_REFUSED. */
static int look_before_open(const char *path, const char *dir, int links, int outside, size_t max,
                            look *lk, struct stat *st) {
    struct stat l;
    lk->target[0] = '\0';
    if (lstat(path, &l) < 0)
        return gone_or_refused(lk, "cannot look at it");
    lk->sig = sig_of(&l);
    *st = l;
    if (S_ISLNK(l.st_mode)) {
        char real[PATH_MAX];
        size_t dlen = strlen(dir);
        if (links && !realpath(path, real))
            return refusal(lk, HK_ERR_IO, "symbolic link that does not resolve: %s",
                           strerror(errno));
        if (links && !outside && !(strncmp(real, dir, dlen) == 0 && real[dlen] == '/'))
            return refusal(lk, HK_ERR_IO,
                           "symbolic link to %s, outside the watched directory: "
                           "not read (only links to files inside it are followed)",
                           real);
        /* The resolved path, no link left in it: what was checked is what
         * gets opened. */
        if (links)
            snprintf(lk->target, sizeof lk->target, "%s", real);
        if (stat(links ? lk->target : path, st) < 0)
            return gone_or_refused(lk, "cannot look at it");
    }
    if (!S_ISREG(st->st_mode))
        return refusal(lk, HK_ERR_IO, "%s, not a regular file: not read", type_name(st->st_mode));
    /* Another user's file, or one anyone may write, never becomes code of
     * this program, whoever could add it to the directory (a group, a
     * sticky directory). */
    if (st->st_uid != geteuid() && st->st_uid != 0)
        return refusal(lk, HK_ERR_IO,
                       "owned by uid %ld, neither this process's user (uid %ld) nor root: not "
                       "read",
                       (long)st->st_uid, (long)geteuid());
    if (st->st_mode & S_IWOTH)
        return refusal(lk, HK_ERR_IO, "writable by others (mode %04o): not read; chmod o-w it",
                       (unsigned)(st->st_mode & 07777));
    if ((uint64_t)st->st_size > (uint64_t)max)
        return refusal(lk, HK_ERR_TOO_LARGE, "%lld bytes, over the %zu-byte cap: not read",
                       (long long)st->st_size, max);
    return READ_OK;
}

/* Reads fd whole into *buf (size + 1 bytes: one more than the size, to
 * notice a file that grows meanwhile); *got is what was read. */
static int read_whole(int fd, size_t size, look *lk, unsigned char **buf, size_t *got) {
    *got = 0;
    *buf = malloc(size + 1);
    if (!*buf)
        return refusal(lk, HK_ERR_NOMEM, "out of memory for %zu bytes", size);
    while (*got <= size) {
        ssize_t n = read(fd, *buf + *got, size + 1 - *got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return refusal(lk, HK_ERR_IO, "cannot read it: %s", strerror(errno));
        if (n == 0)
            break;
        *got += (size_t)n;
    }
    return READ_OK;
}

/* Reads the open file fd, which should be the one path named when st was
 * taken, and keeps its content in lk only if it stayed the same file, of the
 * same size and times, from before the read to after it. */
static int read_open(int fd, const char *path, const struct stat *st, size_t max, look *lk) {
    struct stat a, b, c;
    if (fstat(fd, &a) < 0)
        return refusal(lk, HK_ERR_IO, "cannot look at it: %s", strerror(errno));
    /* Swapped between the look and the open. */
    if (a.st_ino != st->st_ino || a.st_dev != st->st_dev || !S_ISREG(a.st_mode) ||
        (uint64_t)a.st_size > (uint64_t)max)
        return READ_UNSTABLE;
    unsigned char *buf = NULL;
    size_t got = 0;
    int rc = read_whole(fd, (size_t)a.st_size, lk, &buf, &got);
    if (rc == READ_OK && a.st_size == 0 && got > 0)
        /* procfs, sysfs and the like: the size is made up, and the content
         * is generated on every read, so it would never look settled. */
        rc = refusal(lk, HK_ERR_IO,
                     "reports 0 bytes but has content: a pseudo-file (procfs, sysfs), "
                     "not a regular file: not read");
    else if (rc == READ_OK &&
             (got != (size_t)a.st_size || fstat(fd, &b) < 0 || b.st_size != a.st_size ||
              !ts_eq(b.st_mtim, a.st_mtim) || !ts_eq(b.st_ctim, a.st_ctim)))
        rc = READ_UNSTABLE;
    /* Renamed over (or the link retargeted) while we read: what we hold is
     * no longer the file. */
    else if (rc == READ_OK && (stat(path, &c) < 0 || c.st_ino != a.st_ino || c.st_dev != a.st_dev))
        rc = READ_UNSTABLE;
    else if (rc == READ_OK && got == 0) {
        rc = refusal(lk, HK_ERR_FORMAT, "empty file: not handed over");
        lk->empty = 1;
    }
    if (rc != READ_OK) {
        free(buf);
        return rc;
    }
    lk->mtime = a.st_mtim;
    lk->bytes = buf;
    lk->size = got;
    return READ_OK;
}

/* Looks at the name path of directory dir (canonical). With links set, a
 * symbolic link is followed only when its target resolves inside dir, or
 * anywhere with outside set; without it links are followed as open() does
 * (a dependency named by a build). Reads the file only when it is regular
 * and at most max bytes. */
static int read_stable(const char *path, const char *dir, int links, int outside, size_t max,
                       look *lk) {
    struct stat st;
    int rc = look_before_open(path, dir, links, outside, max, lk, &st);
    if (rc != READ_OK)
        return rc;
    int followed = lk->target[0] != '\0';
    int fd = open(followed ? lk->target : path,
                  O_RDONLY | O_CLOEXEC | O_NONBLOCK | (followed ? O_NOFOLLOW : 0));
    if (fd < 0)
        return gone_or_refused(lk, "cannot open it");
    lk->opened = 1;
    rc = read_open(fd, path, &st, max, lk);
    close(fd);
    return rc;
}

/* ---- the thread --------------------------------------------------------- */

/* Watches the directory of a followed link's target (for the link only), so
 * that an edit of the target is seen. */
static void track_target(hkw_watcher *w, watch_file *f, const char *target) {
    if (!*target) {
        free(f->target);
        f->target = NULL;
        return;
    }
    if (!f->target || strcmp(f->target, target) != 0) {
        char *t = strdup(target);
        if (!t)
            return; /* Edits of the target then go unseen until the link's next event. */
        free(f->target);
        f->target = t;
    }
    const char *slash = strrchr(target, '/');
    char dpath[PATH_MAX];
    snprintf(dpath, sizeof dpath, "%.*s", slash == target ? 1 : (int)(slash - target), target);
    if (!dir_by_path(w, dpath) && dir_new(w, dpath))
        log_at(w, HK_LOG_DEBUG, "watching %s for the link %s", dpath, f->path);
}

/* f could not be handed over: tells the application, unless this is the
 * same refusal again (nothing about the name changed) or a file recorded
 * before the watch was placed. Called and returns with mu held. */
static void refuse(hkw_watcher *w, watch_file *f, const look *lk) {
    int quiet = f->baseline && f->since_set && ts_ns(lk->sig.mtime) < ts_ns(f->since);
    f->baseline = 0;
    if (!f->dir->modules) {
        log_at(w, HK_LOG_DEBUG, "%s (a dependency): %s", f->path, lk->why);
        return;
    }
    if (f->refused && sig_eq(&f->refused_sig, &lk->sig))
        return;
    f->refused = 1;
    f->refused_sig = lk->sig;
    if (quiet) {
        log_at(w, HK_LOG_DEBUG, "%s, there before the watch, is not usable: %s", f->path, lk->why);
        return;
    }
    log_at(w, HK_LOG_WARN, "%s refused: %s", f->path, lk->why);
    if (!w->o.refuse)
        return;
    w->st.refusals++;
    pthread_mutex_unlock(&w->mu);
    w->o.refuse(w->o.ud, f->module, f->path, lk->err, lk->why);
    pthread_mutex_lock(&w->mu);
}

/* Looks at f with no lock held: only at its identity when its name is
 * refused (by_name), else through a stable read, whose content is hashed
 * into hash. Returns a read_result. */
static int look_at_file(const hkw_watcher *w, const watch_file *f, const char *root, int by_name,
                        int links, look *lk, unsigned char hash[HASH_BYTES]) {
    if (by_name) {
        struct stat st;
        if (lstat(f->path, &st) < 0)
            return READ_GONE;
        lk->sig = sig_of(&st);
        lk->err = f->name_err;
        snprintf(lk->why, sizeof lk->why, "%s", f->name_why);
        return READ_REFUSED;
    }
    int rc = read_stable(f->path, root, links, w->o.follow_outside_links, w->o.max_file_size, lk);
    if (rc == READ_OK)
        crypto_generichash(hash, HASH_BYTES, lk->bytes, lk->size, NULL, 0);
    return rc;
}

/* A read that gave no content: try again in wait ms, refuse, or forget. */
static void read_failed(hkw_watcher *w, watch_file *f, int rc, const look *lk, int64_t now,
                        int64_t wait) {
    switch (rc) {
    case READ_UNSTABLE:
        w->st.retries++;
        schedule(f, now + wait);
        log_at(w, HK_LOG_INFO,
               "%s changed while being read (a save in progress): read again in %lld ms", f->path,
               (long long)wait);
        break;
    case READ_REFUSED:
        refuse(w, f, lk);
        break;
    default: /* Gone: a later event brings it back if it reappears. */
        f->refused = 0;
        break;
    }
}

/* Records the hash of f's content just read. Returns 1 when the content
 * changed, after making every file whose build read f due again. */
static int note_content(hkw_watcher *w, watch_file *f, const unsigned char hash[HASH_BYTES],
                        const look *lk, int64_t now) {
    int changed = !f->has_hash || memcmp(hash, f->hash, HASH_BYTES) != 0;
    if (changed && f->baseline && f->since_set && ts_ns(lk->mtime) < ts_ns(f->since)) {
        /* Recorded as it was before we were watching, or before a dependent
         * build read it: not a change. */
        changed = 0;
        memcpy(f->hash, hash, HASH_BYTES);
        f->has_hash = 1;
    }
    f->baseline = 0;
    if (changed) {
        if (f->has_hash || f->since_set)
            f->changed_seq = ++w->seq;
        memcpy(f->hash, hash, HASH_BYTES);
        f->has_hash = 1;
        force_dependents(w, f, now);
    }
    return changed;
}

/* Hands f's content to the callback, which runs without the lock. */
static void hand_over(hkw_watcher *w, watch_file *f, const look *lk) {
    f->force = 0;
    f->handed_seq = ++w->seq;
    f->handed_wall = wall_now();
    w->st.handovers++;
    log_at(w, HK_LOG_INFO, "%s: handed over as module %s (%zu bytes)", f->path, f->module,
           lk->size);
    pthread_mutex_unlock(&w->mu);
    w->o.fn(w->o.ud, f->module, f->path, lk->bytes, lk->size);
    pthread_mutex_lock(&w->mu);
}

/* f was read and not handed over: says why. */
static void note_kept(hkw_watcher *w, const watch_file *f, int same) {
    int source = f->module && f->dir->modules;
    if (same && source)
        w->st.unchanged++;
    if (same)
        log_at(w, source ? HK_LOG_INFO : HK_LOG_DEBUG,
               "%s: content unchanged since it was last read: %s", f->path,
               source ? "not handed over" : "nothing to do");
    else
        log_at(w, HK_LOG_DEBUG,
               "%s: content recorded, unchanged since the watch began or since a build "
               "read it",
               f->path);
}

/* Reads f, whose time has come, and hands it over if it changed. Called and
 * returns with mu held; drops it for the read and the callback. */
static void read_due(hkw_watcher *w, watch_file *f, int64_t now) {
    int64_t wait = w->o.debounce_ms > MIN_WAIT_MS ? w->o.debounce_ms : MIN_WAIT_MS;
    if (f->open_since_ms && now < f->open_since_ms + w->o.open_wait_ms) {
        /* Still open for writing: wait for the close, but not forever (a
         * program may keep it open and never write again). */
        int64_t limit = f->open_since_ms + w->o.open_wait_ms;
        f->due_ms = now + wait < limit ? now + wait : limit;
        log_at(w, HK_LOG_DEBUG,
               "%s is still open for writing: not read before its close "
               "(or %lld ms more)",
               f->path, (long long)(limit - now));
        return;
    }
    /* Too large for the stack of a thread the application may size. */
    look *lk = calloc(1, sizeof *lk);
    if (!lk) {
        schedule(f, now + wait);
        return;
    }
    f->pending = 0;
    f->open_since_ms = 0;
    int complete = f->complete;
    f->complete = 0;
    if (f->events > 1)
        log_at(w, HK_LOG_DEBUG, "%s: %d events since it was last read, one read", f->path,
               f->events);
    f->events = 0;
    /* The link policy holds for every file of an added directory, a
     * dependency included: its target would be read to hash it. */
    int links = f->dir->modules, by_name = f->name_err && !f->dep;
    const char *root = f->dir->root;
    unsigned char hash[HASH_BYTES];
    pthread_mutex_unlock(&w->mu);
    int rc = look_at_file(w, f, root, by_name, links, lk, hash);
    pthread_mutex_lock(&w->mu);
    now = ((int64_t)hku_now_ms());
    w->st.opens += (uint64_t)lk->opened;
    if (links && rc != READ_GONE)
        track_target(w, f, lk->target);
    /* What arrived during the read: an event for f means a writer touched
     * it meanwhile (or just before), so what was read may be half of a save;
     * its event has scheduled the next read already. */
    drain_events(w, now);
    if (rc != READ_GONE && !by_name && f->events > 0) {
        w->st.retries++;
        log_at(w, HK_LOG_INFO, "%s changed while being read (a save in progress): read again",
               f->path);
        free(lk->bytes);
    } else if (rc == READ_REFUSED && lk->empty && complete) {
        /* Truncated and closed: the content may follow at once. */
        schedule(f, now + wait);
        log_at(w, HK_LOG_DEBUG, "%s is empty after its save: looked at again in %lld ms", f->path,
               (long long)wait);
    } else if (rc != READ_OK) {
        read_failed(w, f, rc, lk, now, wait);
    } else {
        f->refused = 0;
        int had_hash = f->has_hash;
        int changed = note_content(w, f, hash, lk, now);
        if (f->module && f->dir->modules && (changed || f->force))
            hand_over(w, f, lk);
        else
            note_kept(w, f, had_hash && !changed);
        free(lk->bytes);
    }
    free(lk);
}

/* The first file whose read is due, else NULL with *deadline set to the
 * earliest moment something will be (-1: nothing scheduled). */
static watch_file *next_due(hkw_watcher *w, int64_t now, int64_t *deadline) {
    int64_t best = -1;
    for (int i = 0; i < w->nfiles; i++) {
        watch_file *f = w->files[i];
        if (!f->pending)
            continue;
        if (f->due_ms <= now)
            return f;
        if (best < 0 || f->due_ms < best)
            best = f->due_ms;
    }
    for (int i = 0; i < w->ndirs; i++) {
        const watch_dir *d = w->dirs[i];
        if (d->wd < 0 && !d->dormant && (best < 0 || d->next_poll_ms < best))
            best = d->next_poll_ms;
    }
    *deadline = best;
    return NULL;
}

/* Waits up to timeout ms (-1: no limit) for inotify events or a wake-up,
 * and reads the events into w->evbuf. Returns their bytes (0: none). No
 * lock held. */
static ssize_t wait_events(hkw_watcher *w, int timeout) {
    struct pollfd pfd[2] = {{.fd = w->ifd, .events = POLLIN}, {.fd = w->efd, .events = POLLIN}};
    if (poll(pfd, 2, timeout) <= 0)
        return 0;
    if (pfd[1].revents & POLLIN) {
        uint64_t v;
        if (read(w->efd, &v, sizeof v) < 0) {
            /* EAGAIN: another reader cannot exist; nothing to do. */
        }
    }
    if (!(pfd[0].revents & POLLIN))
        return 0;
    return read(w->ifd, w->evbuf, sizeof w->evbuf);
}

static void *watch_main(void *arg) {
    /* Named for top -H, gdb and profilers (at most 15 characters). */
    pthread_setname_np(pthread_self(), "hk-watch");
    hkw_watcher *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        if (w->paused) {
            w->paused_ack = 1;
            pthread_cond_broadcast(&w->cv);
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        w->paused_ack = 0;
        int64_t now = ((int64_t)hku_now_ms()), deadline;
        dirs_tick(w, now);
        watch_file *f = next_due(w, now, &deadline);
        if (f) {
            read_due(w, f, now);
            continue;
        }
        int timeout = deadline < 0               ? -1
                      : deadline <= now          ? 0
                      : deadline - now > INT_MAX ? INT_MAX
                                                 : (int)(deadline - now);
        pthread_mutex_unlock(&w->mu);
        ssize_t n = wait_events(w, timeout);
        pthread_mutex_lock(&w->mu);
        int64_t t = ((int64_t)hku_now_ms());
        for (char *p = w->evbuf; n > 0 && p < w->evbuf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)(void *)p;
            on_event(w, ev, t);
            p += sizeof *ev + ev->len;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ---- API ---------------------------------------------------------------- */

void hkw_opts_init(hkw_opts *o) {
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->debounce_ms = 50;
    o->dir_poll_ms = 200;
    o->open_wait_ms = 1000;
    o->max_file_size = (size_t)64 << 20;
}

/* close() that leaves errno as it was: the caller reports an earlier error. */
static void close_keep_errno(int fd) {
    int saved = errno;
    close(fd);
    errno = saved;
}

int hkw_create(hkw_watcher **out, const hkw_opts *o) {
    if (!out || !o || !o->fn)
        return HK_ERR_INVALID;
    *out = NULL;
    if (sodium_init() < 0)
        return HK_ERR_IO;
    hkw_watcher *w = calloc(1, sizeof *w);
    if (!w)
        return HK_ERR_NOMEM;
    w->o = *o;
    if (w->o.debounce_ms < 0)
        w->o.debounce_ms = 50;
    if (w->o.dir_poll_ms <= 0)
        w->o.dir_poll_ms = 200;
    if (w->o.open_wait_ms < 0)
        w->o.open_wait_ms = 1000;
    if (w->o.max_file_size == 0)
        w->o.max_file_size = (size_t)64 << 20;
    w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->ifd < 0)
        goto fail_free;
    w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->efd < 0)
        goto fail_ifd;
    if (pthread_mutex_init(&w->mu, NULL) != 0)
        goto fail_efd;
    if (pthread_cond_init(&w->cv, NULL) != 0)
        goto fail_mu;
    if (pthread_mutex_init(&w->join_mu, NULL) != 0)
        goto fail_cv;
    errno = pthread_create(&w->thread, NULL, watch_main, w);
    if (errno != 0)
        goto fail_join;
    *out = w;
    return 0;

fail_join:
    pthread_mutex_destroy(&w->join_mu);
fail_cv:
    pthread_cond_destroy(&w->cv);
fail_mu:
    pthread_mutex_destroy(&w->mu);
fail_efd:
    close_keep_errno(w->efd);
fail_ifd:
    close_keep_errno(w->ifd);
fail_free:
    free(w);
    return HK_ERR_IO;
}

int hkw_on_thread(const hkw_watcher *w) {
    return w && pthread_equal(pthread_self(), w->thread);
}

/* Tells the thread to stop; joins it unless called on it (join set). */
static void stop_thread(hkw_watcher *w, int join) {
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    wake_thread(w);
    if (!join)
        return;
    pthread_mutex_lock(&w->join_mu);
    if (!w->joined) {
        pthread_join(w->thread, NULL);
        w->joined = 1;
    }
    pthread_mutex_unlock(&w->join_mu);
}

void hkw_stop(hkw_watcher *w) {
    if (w)
        stop_thread(w, !hkw_on_thread(w));
}

void hkw_destroy(hkw_watcher *w) {
    if (!w)
        return;
    stop_thread(w, 1);

    close(w->efd);
    close(w->ifd);
    for (int i = 0; i < w->nfiles; i++) {
        free(w->files[i]->deps);
        free(w->files[i]->target);
        free(w->files[i]->name_why);
        free(w->files[i]->module);
        free(w->files[i]->path);
        free(w->files[i]->name);
        free(w->files[i]);
    }
    for (int i = 0; i < w->ndirs; i++) {
        free(w->dirs[i]->path);
        free(w->dirs[i]);
    }
    free(w->files);
    free(w->dirs);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->join_mu);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

int hkw_add_dir(hkw_watcher *w, const char *dir) {
    if (!w || !dir || !*dir)
        return HK_ERR_INVALID;
    char real[PATH_MAX];
    struct stat st;
    if (!realpath(dir, real) || stat(real, &st) < 0)
        return HK_ERR_IO;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return HK_ERR_IO;
    }

    pthread_mutex_lock(&w->mu);
    watch_dir *d = dir_by_path(w, real);
    int fresh = 0;
    if (d && d->modules) {
        pthread_mutex_unlock(&w->mu);
        return 0;
    }
    if (!d) {
        d = dir_new(w, real);
        if (!d) {
            pthread_mutex_unlock(&w->mu);
            return HK_ERR_NOMEM;
        }
        fresh = 1;
    }
    if (d->wd < 0) {
        /* Placed here rather than on the thread so that every change made
         * after this call returns produces events. */
        struct timespec added = wall_now();
        int wd = inotify_add_watch(w->ifd, real, WATCH_MASK);
        if (wd < 0) {
            int saved = errno;
            if (fresh) {
                w->ndirs--;
                free(d->path);
                free(d);
            }
            pthread_mutex_unlock(&w->mu);
            errno = saved;
            return HK_ERR_IO;
        }
        d->wd = wd;
        d->added = added;
    }
    d->modules = 1;
    d->need_scan = 1;
    d->scan_initial = 1;
    d->recursive = w->o.recursive != 0;
    pthread_mutex_unlock(&w->mu);
    wake_thread(w);
    return 0;
}

/* The entry of dependency dep_path of src (relative paths are taken in
 * src's directory), created with its directory entry when new (*wake set:
 * the thread places the watch). NULL when the path is src itself, an
 * editor dropping, or cannot be had. */
static watch_file *dep_entry(hkw_watcher *w, const watch_file *src, const char *dep_path,
                             int *wake) {
    char path[PATH_MAX];
    if (!dep_path || canon_path(dep_path, src->dir->path, path, sizeof path) < 0)
        return NULL;
    char *slash = strrchr(path, '/');
    if (strcmp(path, src->path) == 0 || is_dropping(slash + 1))
        return NULL;
    *slash = '\0';
    watch_dir *d = dir_by_path(w, path[0] ? path : "/");
    if (!d) {
        /* Watched for this dependency's sake; the thread places it. */
        d = dir_new(w, path[0] ? path : "/");
        if (!d)
            return NULL;
        *wake = 1;
    }
    watch_file *f = file_find(w, d, slash + 1);
    return f ? f : file_new(w, d, slash + 1);
}

/* Marks f a dependency of src. Returns 1 when src must be handed over
 * again: f changed after src was handed over, so the build that reports it
 * may have read the old content. A dependency whose content is unknown yet
 * is read soon (*wake set), and counts as a change if it was modified after
 * src was handed over. */
static int dep_track(hkw_watcher *w, const watch_file *src, watch_file *f, int64_t now, int *wake) {
    f->dep = 1;
    if (f->has_hash)
        return src->handed_seq && f->changed_seq > src->handed_seq;
    note_since(f, minus_slack(src->handed_seq ? src->handed_wall : wall_now()));
    if (!f->pending) {
        f->baseline = 1;
        schedule(f, now);
        *wake = 1;
    }
    return 0;
}

int hkw_set_deps(hkw_watcher *w, const char *source_path, const char *const *dep_paths, int n) {
    if (!w || !source_path || n < 0 || (n > 0 && !dep_paths))
        return HK_ERR_INVALID;
    char canon[PATH_MAX];
    if (canon_path(source_path, NULL, canon, sizeof canon) < 0)
        return HK_ERR_INVALID;
    watch_file **deps = NULL;
    if (n > 0 && !(deps = calloc((size_t)n, sizeof *deps)))
        return HK_ERR_NOMEM;

    pthread_mutex_lock(&w->mu);
    int64_t now = ((int64_t)hku_now_ms());
    watch_file *src = NULL;
    for (int i = 0; i < w->nfiles && !src; i++) {
        if (strcmp(w->files[i]->path, canon) == 0)
            src = w->files[i];
    }
    if (!src || !src->module || !src->dir->modules) {
        pthread_mutex_unlock(&w->mu);
        free(deps);
        return HK_ERR_NOT_FOUND;
    }
    int m = 0, force = 0, wake = 0;
    for (int i = 0; i < n; i++) {
        watch_file *f = dep_entry(w, src, dep_paths[i], &wake);
        int dup = 0;
        for (int j = 0; f && j < m; j++)
            dup |= deps[j] == f;
        if (!f || dup)
            continue;
        force |= dep_track(w, src, f, now, &wake);
        deps[m++] = f;
    }
    free(src->deps);
    src->deps = deps;
    src->ndeps = m;
    if (force) {
        src->force = 1;
        src->baseline = 0;
        schedule(src, now);
        wake = 1;
    }
    pthread_mutex_unlock(&w->mu);
    if (wake)
        wake_thread(w);
    return 0;
}

void hkw_stats_get(hkw_watcher *w, hkw_stats *out) {
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    *out = w->st;
    pthread_mutex_unlock(&w->mu);
}

void hkw_pause(hkw_watcher *w, int on) {
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->paused = on ? 1 : 0;
    pthread_cond_broadcast(&w->cv);
    if (on) {
        pthread_mutex_unlock(&w->mu);
        wake_thread(w);
        pthread_mutex_lock(&w->mu);
        while (w->paused && !w->paused_ack && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
}

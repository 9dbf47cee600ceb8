/*
 * watch/watcher.h: the watcher's state, shared by its three files and by
 * them only (watch/watch.h is the way in for everything else).
 *
 *   files.c   what a file name is (classification, editor droppings, the
 *             canonical path) and what a file holds: the stable read, with no
 *             lock and no watcher state;
 *   events.c  the entries of directories and files, the inotify events, the
 *             listings and the watches, with mu held; the trace;
 *   watch.c   the watcher thread (which file is due, its read and handover)
 *             and the API.
 *
 * watch.c uses the other two, events.c uses files.c; never the other way.
 * Locks: one mutex, mu, guards every mutable field of the watcher and of its
 * entries (see the top of watch.c); events.c's functions are called with it
 * held, files.c's without it.
 */
#ifndef HK_WATCH_WATCHER_H
#define HK_WATCH_WATCHER_H

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>

#include "watch/watch.h"

#define HASH_BYTES  32
#define EVBUF_BYTES 65536
#define WATCH_MASK                                                                                 \
    (IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_MODIFY |            \
     IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)

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

enum read_result {
    READ_OK,
    READ_GONE,     /* no such file (any more) */
    READ_UNSTABLE, /* changed during the read */
    READ_REFUSED,  /* cannot be handed over: see err and why */
};

/* What one look at a file found (hkw_read_stable). */
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

/* ---- time ---------------------------------------------------------------- */

static inline struct timespec hkw_wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts;
}

static inline long long hkw_ts_ns(struct timespec ts) {
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int hkw_ts_eq(struct timespec a, struct timespec b) {
    return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/* ---- files.c: names, paths and reads (no lock) ----------------------------- */

/* 1 for the files that editors (and sed -i) write next to the real one while
 * saving (watch/watch.h, "File names and modules"). */
int hkw_is_dropping(const char *name);
/* Writes the canonical form of path to out: the real path of its directory,
 * '/', its last component, relative paths taken against base (or the working
 * directory when NULL). 0 or HK_ERR_INVALID. */
int hkw_canon_path(const char *path, const char *base, char *out, size_t out_size);
/* The identity of what st describes, and whether two are the same. */
file_sig hkw_sig_of(const struct stat *st);
int hkw_sig_eq(const file_sig *a, const file_sig *b);
/* Looks at the name path of directory dir (canonical) and reads it when it is
 * a regular file of at most max bytes that stays the same during the read; a
 * symbolic link is followed as links and outside say. Returns a read_result,
 * lk saying what was found (its bytes the caller's to free). */
int hkw_read_stable(const char *path, const char *dir, int links, int outside, size_t max,
                    look *lk);

/* ---- events.c: entries, events, listings, watches (mu held) ---------------- */

/* One line of trace at a level, when the watcher's log wants it. */
void hkw_log_at(hkw_watcher *w, hk_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The entry of a directory by its canonical path (NULL: none), and a new one
 * (NULL on no memory), not watched yet: the thread places its watch. */
watch_dir *hkw_dir_by_path(hkw_watcher *w, const char *path);
watch_dir *hkw_dir_new(hkw_watcher *w, const char *path);
/* The entry of a file of d by name: found (NULL: none), made (NULL on no
 * memory), or found or made when its name makes it one to track. */
watch_file *hkw_file_find(hkw_watcher *w, const watch_dir *d, const char *name);
watch_file *hkw_file_new(hkw_watcher *w, watch_dir *d, const char *name);
watch_file *hkw_file_get(hkw_watcher *w, watch_dir *d, const char *name);
/* Makes f due at due_ms (monotonic), or leaves it due later when it is. */
void hkw_schedule(watch_file *f, int64_t due_ms);
/* t less the file-time slack, and the time before which f's content counts
 * as known (its baseline). */
struct timespec hkw_minus_slack(struct timespec t);
void hkw_note_since(watch_file *f, struct timespec since);
/* Makes every source whose build read f due again. */
void hkw_force_dependents(hkw_watcher *w, const watch_file *f, int64_t now);
/* One inotify event; every event queued now; the directories' watches and
 * listings that are due. */
void hkw_on_event(hkw_watcher *w, const struct inotify_event *ev, int64_t now);
void hkw_drain_events(hkw_watcher *w, int64_t now);
void hkw_dirs_tick(hkw_watcher *w, int64_t now);

#endif /* HK_WATCH_WATCHER_H */

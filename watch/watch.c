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
 * - A read is trusted only when it was stable (watch/files.c) and no event
 *   for the file arrived during it; otherwise it is retried. An empty file
 *   seen right after a close is looked at again after the quiet period
 *   before it is refused: some writers truncate and close before writing.
 *
 * This file is the watcher thread (which file is due, its read, the
 * handover) and the API; the entries and events are watch/events.c's, names
 * and reads watch/files.c's (watch/watcher.h).
 *
 * Threads and locks: one mutex, mu, guards every mutable field of the watcher
 * and its entries; the watcher thread drops it to read a file and to run the
 * callback, never holding it across either. The trace hook is called with mu
 * held.
 */
#include "watch/watch.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "util/util.h"
#include "watch/watcher.h"

/* Shortest postponement, so that a debounce of 0 cannot spin. */
#define MIN_WAIT_MS 10

static void wake_thread(hkw_watcher *w) {
    uint64_t one = 1;
    /* A full counter (EAGAIN) already means "wake up". */
    if (write(w->efd, &one, sizeof one) < 0) {
        return;
    }
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
    if (!hkw_dir_by_path(w, dpath) && hkw_dir_new(w, dpath))
        hkw_log_at(w, HK_LOG_DEBUG, "watching %s for the link %s", dpath, f->path);
}

/* f could not be handed over: tells the application, unless this is the
 * same refusal again (nothing about the name changed) or a file recorded
 * before the watch was placed. Called and returns with mu held. */
static void refuse(hkw_watcher *w, watch_file *f, const look *lk) {
    int quiet = f->baseline && f->since_set && hkw_ts_ns(lk->sig.mtime) < hkw_ts_ns(f->since);
    f->baseline = 0;
    if (!f->dir->modules) {
        hkw_log_at(w, HK_LOG_DEBUG, "%s (a dependency): %s", f->path, lk->why);
        return;
    }
    if (f->refused && hkw_sig_eq(&f->refused_sig, &lk->sig))
        return;
    f->refused = 1;
    f->refused_sig = lk->sig;
    if (quiet) {
        hkw_log_at(w, HK_LOG_DEBUG, "%s, there before the watch, is not usable: %s", f->path,
                   lk->why);
        return;
    }
    hkw_log_at(w, HK_LOG_WARN, "%s refused: %s", f->path, lk->why);
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
        lk->sig = hkw_sig_of(&st);
        lk->err = f->name_err;
        snprintf(lk->why, sizeof lk->why, "%s", f->name_why);
        return READ_REFUSED;
    }
    int rc =
        hkw_read_stable(f->path, root, links, w->o.follow_outside_links, w->o.max_file_size, lk);
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
        hkw_schedule(f, now + wait);
        hkw_log_at(w, HK_LOG_INFO,
                   "%s changed while being read (a save in progress): read again in %lld ms",
                   f->path, (long long)wait);
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
    if (changed && f->baseline && f->since_set && hkw_ts_ns(lk->mtime) < hkw_ts_ns(f->since)) {
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
        hkw_force_dependents(w, f, now);
    }
    return changed;
}

/* Hands f's content to the callback, which runs without the lock. */
static void hand_over(hkw_watcher *w, watch_file *f, const look *lk) {
    f->force = 0;
    f->handed_seq = ++w->seq;
    f->handed_wall = hkw_wall_now();
    w->st.handovers++;
    hkw_log_at(w, HK_LOG_INFO, "%s: handed over as module %s (%zu bytes)", f->path, f->module,
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
        hkw_log_at(w, source ? HK_LOG_INFO : HK_LOG_DEBUG,
                   "%s: content unchanged since it was last read: %s", f->path,
                   source ? "not handed over" : "nothing to do");
    else
        hkw_log_at(w, HK_LOG_DEBUG,
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
        hkw_log_at(w, HK_LOG_DEBUG,
                   "%s is still open for writing: not read before its close "
                   "(or %lld ms more)",
                   f->path, (long long)(limit - now));
        return;
    }
    /* Too large for the stack of a thread the application may size. */
    look *lk = calloc(1, sizeof *lk);
    if (!lk) {
        hkw_schedule(f, now + wait);
        return;
    }
    f->pending = 0;
    f->open_since_ms = 0;
    int complete = f->complete;
    f->complete = 0;
    if (f->events > 1)
        hkw_log_at(w, HK_LOG_DEBUG, "%s: %d events since it was last read, one read", f->path,
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
    hkw_drain_events(w, now);
    if (rc != READ_GONE && !by_name && f->events > 0) {
        w->st.retries++;
        hkw_log_at(w, HK_LOG_INFO, "%s changed while being read (a save in progress): read again",
                   f->path);
        free(lk->bytes);
    } else if (rc == READ_REFUSED && lk->empty && complete) {
        /* Truncated and closed: the content may follow at once. */
        hkw_schedule(f, now + wait);
        hkw_log_at(w, HK_LOG_DEBUG, "%s is empty after its save: looked at again in %lld ms",
                   f->path, (long long)wait);
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
        hkw_dirs_tick(w, now);
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
            hkw_on_event(w, ev, t);
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
    watch_dir *d = hkw_dir_by_path(w, real);
    int fresh = 0;
    if (d && d->modules) {
        pthread_mutex_unlock(&w->mu);
        return 0;
    }
    if (!d) {
        d = hkw_dir_new(w, real);
        if (!d) {
            pthread_mutex_unlock(&w->mu);
            return HK_ERR_NOMEM;
        }
        fresh = 1;
    }
    if (d->wd < 0) {
        /* Placed here rather than on the thread so that every change made
         * after this call returns produces events. */
        struct timespec added = hkw_wall_now();
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
    if (!dep_path || hkw_canon_path(dep_path, src->dir->path, path, sizeof path) < 0)
        return NULL;
    char *slash = strrchr(path, '/');
    if (strcmp(path, src->path) == 0 || hkw_is_dropping(slash + 1))
        return NULL;
    *slash = '\0';
    watch_dir *d = hkw_dir_by_path(w, path[0] ? path : "/");
    if (!d) {
        /* Watched for this dependency's sake; the thread places it. */
        d = hkw_dir_new(w, path[0] ? path : "/");
        if (!d)
            return NULL;
        *wake = 1;
    }
    watch_file *f = hkw_file_find(w, d, slash + 1);
    return f ? f : hkw_file_new(w, d, slash + 1);
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
    hkw_note_since(f, hkw_minus_slack(src->handed_seq ? src->handed_wall : hkw_wall_now()));
    if (!f->pending) {
        f->baseline = 1;
        hkw_schedule(f, now);
        *wake = 1;
    }
    return 0;
}

int hkw_set_deps(hkw_watcher *w, const char *source_path, const char *const *dep_paths, int n) {
    if (!w || !source_path || n < 0 || (n > 0 && !dep_paths))
        return HK_ERR_INVALID;
    char canon[PATH_MAX];
    if (hkw_canon_path(source_path, NULL, canon, sizeof canon) < 0)
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
        hkw_schedule(src, now);
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

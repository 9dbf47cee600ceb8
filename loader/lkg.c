/*
 * Last known good: which image of each module last ran cleanly, which ones
 * are quarantined, kept across restarts (the rules are stated in
 * include/hotkern/hotkern.h, "last known good").
 *
 * Why commit times. A sticky error (a kernel faulted) is reported late, by
 * whatever CUDA call comes next, and names no kernel. What hotkern knows is
 * when each version was committed: a version committed within the suspect
 * window before the loss is suspect, and one that stayed current for the
 * window without a loss is known good. The window is measured in this
 * process only (hkl_now_ms); an earlier process's times are not trusted, so
 * what a record says about a version committed by an earlier process is
 * only what that process wrote (its good image, its quarantine).
 *
 * On disk (options.state_dir):
 *   DIR/lock               flock'd for the life of the runtime: one runtime
 *                          per directory (a second create gets HK_ERR_BUSY);
 *                          the puller's state file may share the directory.
 *   DIR/images/HASH        a committed image, content-addressed (BLAKE2b-256
 *                          via libsodium's crypto_generichash, hex)
 *   DIR/modules/NAME.rec   the module's record (loader/record.c); NAME with
 *                          every byte outside [A-Za-z0-9_-] as %XX
 * Every file is written to a temp name, fsync'd and renamed, then the
 * directory is fsync'd, so a crash leaves the old file or the new one; an
 * image is on disk before any record that names it.
 *
 * Trust. What this directory holds decides what --restore runs, so it is
 * used only if no other local user can change it (util/util.h, "trusted
 * directories": owner and mode of it and of every directory above it), and
 * everything in it is reached through descriptors of DIR, DIR/images and
 * DIR/modules opened once at open, with O_NOFOLLOW: a link planted as
 * `lock`, `images` or a file is refused, never followed, so nothing is
 * created or removed elsewhere. A record or an image that another user
 * could have written is refused. A record names its module inside, which
 * must give its file name; an image must hash to its file name.
 *
 * Collection. After each write, images are removed that nothing may still
 * need: not named by a record in memory, by the record on disk (as last
 * written or read), by a record write in progress, by an image waiting to
 * be written, or anywhere in the text of a record refused at open (kept
 * until its module's next record replaces it). So a damaged record, or a
 * write that failed, costs the images it names and nothing else: the disk
 * holds about two images per module.
 *
 * Pending commits. A swap notes its version (hkl_lkg_pending) before it
 * publishes it, since a launch may use the version, and fault, as soon as
 * it is published: a loss between the publication and hkl_lkg_committed
 * still finds it among the recent commits and quarantines it. A version
 * noted and then rolled back leaves the list again (hkl_lkg_unpending).
 *
 * Threads. The state in memory is under lkg_lock (a mutex private to this
 * file), which is held for memory work only, never across a file write:
 * after swap_lock (commits record under it) and before stats_lock and
 * log_lock. hkl_lkg_lost runs on whichever thread saw the sticky error (a
 * launching thread, on the launch's error path only, or the reclaim thread)
 * with no engine lock held; `lost` makes it happen once per runtime.
 *
 * Writes. A commit changes memory only, under swap_lock: the record, and a
 * copy of its image queued as `unwritten` (unless a record on disk names
 * that image already). The swapping thread then calls hkl_lkg_flush with
 * swap_lock released, so hk_module_version and other swaps never wait for
 * the disk. Every change of a module's record bumps its `gen`; a writer
 * takes the module's `wlock` (writers only), snapshots the record and its
 * gen under lkg_lock, writes the images that snapshot names that are still
 * unwritten, then the record, with lkg_lock released, and sets `disk_gen`
 * when it landed. A writer whose gen has landed already skips; one that
 * waited for wlock writes the newest state, so concurrent commits land in
 * commit order and an older snapshot never replaces a newer one. A record
 * whose image could not be written is not written either (it would name a
 * missing image): both stay queued and the next write of the module tries
 * again. So a slow disk delays only the writers of the same record: a
 * commit or a loss of another module, the check of a build and the queries
 * never wait for it. Images are written, and unreferenced ones removed,
 * under `img_lock` (writers only); collection takes it with trylock and is
 * skipped while an image is being written (the next write collects).
 * Lock order: swap_lock -> wlock -> img_lock -> lkg_lock.
 *
 * Release. When hk_runtime_destroy stops waiting for the reclaim thread
 * (which then frees the runtime whenever the GPU lets it), the directory is
 * let go at once, so that the next runtime can take it: hkl_lkg_release
 * records what ran long enough and writes what is due without waiting for a
 * writer in progress, then stops all disk work; the flock goes as soon as
 * the last write in progress ends. Destroy holds the state (hkl_lkg_hold)
 * across its wait, so hkl_lkg_close on the reclaim thread cannot free the
 * runtime under the release.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "loader/abi.h"
#include "loader/loader.h"
#include "util/util.h"

#define NRECENT 16

/* A commit of this process, for the suspect window. */
typedef struct lkg_recent {
    uint8_t hash[32];
    double t;
    uint64_t release, version;
} lkg_recent;

typedef struct lkg_mod {
    /* all lkg_lock, but for wlock and the name in rec (immutable) */
    hkl_rec rec;       /* what goes to disk: current, good (+ its expressions), quarantine */
    uint64_t gen;      /* bumped by every change of rec */
    uint64_t disk_gen; /* the gen the record file holds; set under wlock too */
    hkl_rec_image disk_cur, disk_good; /* the images the record file names */
    hkl_rec_image fly_cur, fly_good;   /* those a record write in progress names */
    pthread_mutex_t wlock;             /* the record file: one writer at a time */
    int qdue;                          /* a loss quarantined in it: written before the event */
    int pdue;                          /* a loss promoted in it: likewise, unless its
                                        * record is being written already */
    int ncur;                          /* name expressions of the current image */
    char **cur_expr, **cur_lowered;
    double cur_t;               /* when current was committed here; < 0: by an earlier process */
    lkg_recent recent[NRECENT]; /* this process's commits, newest last */
    int nrecent;
    struct lkg_mod *next; /* sorted by name */
} lkg_mod;

/* A committed image not on disk yet: a copy, written before any record
 * naming it (lkg_lock; written by the img_lock holder, which sets busy). */
typedef struct lkg_img {
    uint8_t hash[32];
    void *data;
    size_t size;
    int busy; /* being written: only the writer frees it */
    struct lkg_img *next;
} lkg_img;

/* A record refused at open, and every image hash its text mentions: those
 * images stay until a record of the same file name replaces it (lkg_lock). */
typedef struct lkg_refusal {
    char fname[HKL_NAME_MAX * 3 + 8];
    int nh;
    uint8_t (*h)[32];
    struct lkg_refusal *next;
} lkg_refusal;

struct hkl_lkg {
    /* immutable after open */
    char *dir;                         /* NULL: memory only */
    int dfd, img_fd, mod_fd;           /* DIR, DIR/images, DIR/modules; -1 */
    char img_dir[4200], mod_dir[4200]; /* their paths, for messages */
    double window;
    double (*now)(void);

    pthread_mutex_t lock;     /* lkg_lock */
    pthread_mutex_t img_lock; /* writers only: image writes and collection */
    pthread_cond_t idle;      /* lkg_lock: signalled when writers drops to 0 */
    lkg_mod *mods;            /* lkg_lock; never freed before close */
    lkg_img *unwritten;       /* lkg_lock */
    lkg_refusal *refusals;    /* lkg_lock */
    char refused[1024];       /* lkg_lock: records refused at open, for the report */
    int lockfd;               /* lkg_lock: DIR/lock, flock'd; -1 once let go */
    int writers;              /* lkg_lock: disk operations in progress */
    int released;             /* lkg_lock: the directory was let go: nothing more is written */
    int holds;                /* lkg_lock: destroy's hkl_lkg_hold: close waits for it */
    _Atomic int lost;         /* set once, by the first sticky error */
    int frozen;               /* lkg_lock: the loss is recorded; nothing is
                               * promoted any more */
};

int hkl_lkg_sticky(int r) {
    switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED:
        return 1;
    default:
        return 0;
    }
}

static void hash_of(const void *p, size_t n, uint8_t h[32]) {
    crypto_generichash(h, 32, p, n, NULL, 0);
}

/* hku_strv_dup of a library-owned array. */
static char **strv_dup(char *const *v, int n) {
    return hku_strv_dup((const char *const *)v, n);
}

static void mod_free(lkg_mod *m) {
    hkl_rec_free(&m->rec);
    hku_strv_free(m->cur_expr, m->ncur);
    hku_strv_free(m->cur_lowered, m->ncur);
    pthread_mutex_destroy(&m->wlock);
    free(m);
}

/* A module entry with nothing in it; NULL: out of memory. */
static lkg_mod *mod_new(void) {
    lkg_mod *m = calloc(1, sizeof *m);
    if (m) {
        pthread_mutex_init(&m->wlock, NULL);
        m->cur_t = -1;
    }
    return m;
}

static lkg_mod *mod_find(hkl_lkg *l, const char *name) {
    for (lkg_mod *m = l->mods; m; m = m->next)
        if (!strcmp(m->rec.module, name))
            return m;
    return NULL;
}

/* Inserts m in name order (lkg_lock). */
static void mod_insert(hkl_lkg *l, lkg_mod *m) {
    lkg_mod **pp = &l->mods;
    while (*pp && strcmp((*pp)->rec.module, m->rec.module) < 0)
        pp = &(*pp)->next;
    m->next = *pp;
    *pp = m;
}

static lkg_mod *mod_get(hkl_lkg *l, const char *name) {
    lkg_mod *m = mod_find(l, name);
    if (m || !(m = mod_new()))
        return m;
    snprintf(m->rec.module, sizeof m->rec.module, "%s", name);
    mod_insert(l, m);
    return m;
}

/* ---- files ---------------------------------------------------------------- */

static void file_name(const char *module, char *out, size_t n) {
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)module; *p && k + 4 < n; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            *p == '_' || *p == '-')
            out[k++] = (char)*p;
        else
            k += (size_t)snprintf(out + k, n - k, "%%%02X", *p);
    }
    out[k] = 0;
}

/* The record file's name of module: NAME.rec. */
static void record_name(const char *module, char *out, size_t n) {
    file_name(module, out, n - 4);
    strcat(out, ".rec");
}

static int same_image(const hkl_rec_image *im, const uint8_t h[32]) {
    return im->has && !memcmp(im->hash, h, 32);
}

static lkg_img *unwritten_find(const hkl_lkg *l, const uint8_t h[32]) {
    for (lkg_img *e = l->unwritten; e; e = e->next)
        if (!memcmp(e->hash, h, 32))
            return e;
    return NULL;
}

static void unwritten_remove(hkl_lkg *l, lkg_img *e) {
    for (lkg_img **pp = &l->unwritten; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    free(e->data);
    free(e);
}

/* Whether image h may still be needed (lkg_lock): a record in memory, on
 * disk or being written names it, it waits to be written, or a refused
 * record mentions it. */
static int needed(const hkl_lkg *l, const uint8_t h[32]) {
    for (const lkg_mod *m = l->mods; m; m = m->next)
        if (same_image(&m->rec.current, h) || same_image(&m->rec.good, h) ||
            same_image(&m->disk_cur, h) || same_image(&m->disk_good, h) ||
            same_image(&m->fly_cur, h) || same_image(&m->fly_good, h))
            return 1;
    if (unwritten_find(l, h))
        return 1;
    for (const lkg_refusal *r = l->refusals; r; r = r->next)
        for (int i = 0; i < r->nh; i++)
            if (!memcmp(r->h[i], h, 32))
                return 1;
    return 0;
}

/* Drops the queued images nothing in memory names any more (lkg_lock): a
 * version replaced before its image was written. A record on disk naming
 * one has it on disk already. */
static void unwritten_prune(hkl_lkg *l) {
    for (lkg_img *e = l->unwritten, *next; e; e = next) {
        next = e->next;
        int named = 0;
        for (const lkg_mod *m = l->mods; m && !named; m = m->next)
            named = same_image(&m->rec.current, e->hash) || same_image(&m->rec.good, e->hash) ||
                    same_image(&m->fly_cur, e->hash) || same_image(&m->fly_good, e->hash);
        if (!named && !e->busy)
            unwritten_remove(l, e);
    }
}

/* Disk work is bracketed by these (lkg_lock held): none starts once the
 * directory is released, and the last one to end after the release lets
 * the directory's flock go. */
static int disk_begin(hkl_lkg *l) {
    if (!l->dir || l->released)
        return 0;
    l->writers++;
    return 1;
}

static void disk_end(hkl_lkg *l) {
    if (--l->writers > 0)
        return;
    pthread_cond_broadcast(&l->idle);
    if (l->released && l->lockfd >= 0) {
        close(l->lockfd); /* releases the flock */
        l->lockfd = -1;
    }
}

/* Writes image h under its hash unless a file of its size is there (the
 * img_lock holder, no lkg_lock). 0, or HK_ERR_IO with r set. */
static int write_image_file(hkl_lkg *l, const uint8_t h[32], const void *data, size_t n,
                            hk_report *r) {
    char hex[65];
    struct stat st;
    hkl_hash_hex(h, hex);
    if (fstatat(l->img_fd, hex, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
        (size_t)st.st_size == n)
        return 0;
    struct iovec iov = {.iov_base = (void *)data, .iov_len = n};
    return hku_write_atomicat(l->img_fd, l->img_dir, hex, &iov, 1, 0600, 1, r);
}

/* Puts image h on disk if it is still queued, waiting for a writer of it in
 * progress (or, with nowait, giving up while any image is being written).
 * 0 when it is on disk (or was never queued: then a record on disk named it
 * at its commit); else an error, r set, and the image stays queued. */
static int ensure_image(hk_runtime *rt, const uint8_t h[32], int nowait, hk_report *r) {
    hkl_lkg *l = rt->lkg;
    pthread_mutex_lock(&l->lock);
    int queued = unwritten_find(l, h) != NULL;
    pthread_mutex_unlock(&l->lock);
    if (!queued)
        return 0;
    if (nowait ? pthread_mutex_trylock(&l->img_lock) != 0 : pthread_mutex_lock(&l->img_lock) != 0)
        return hku_fail(r, HK_ERR_BUSY, "an image is being written");
    pthread_mutex_lock(&l->lock);
    lkg_img *e = unwritten_find(l, h); /* NULL: written meanwhile */
    if (e)
        e->busy = 1;
    pthread_mutex_unlock(&l->lock);
    int err = e ? write_image_file(l, h, e->data, e->size, r) : 0;
    pthread_mutex_lock(&l->lock);
    if (e && !err)
        unwritten_remove(l, e);
    else if (e)
        e->busy = 0;
    pthread_mutex_unlock(&l->lock);
    pthread_mutex_unlock(&l->img_lock);
    return err;
}

/* Writes m's record as it is now, unless that generation landed already
 * (see "Writes" above), after the images it names. Takes m's wlock (with
 * nowait, gives up when another writer has it), and lkg_lock only around
 * the snapshot and the result: never across a write. */
static void flush(hk_runtime *rt, lkg_mod *m, int nowait) {
    hkl_lkg *l = rt->lkg;
    char *text = NULL, name[HKL_NAME_MAX * 3 + 8] = "";
    size_t n = 0;
    hk_report r = HK_REPORT_INIT;
    if (!l->dir)
        return;
    if (nowait ? pthread_mutex_trylock(&m->wlock) != 0 : pthread_mutex_lock(&m->wlock) != 0)
        return;
    pthread_mutex_lock(&l->lock);
    if (!disk_begin(l)) {
        pthread_mutex_unlock(&l->lock);
        pthread_mutex_unlock(&m->wlock);
        return;
    }
    uint64_t gen = m->gen;
    int err = gen == m->disk_gen ? 1 : hkl_rec_format(&m->rec, &text, &n);
    if (err == 0) {
        m->fly_cur = m->rec.current;
        m->fly_good = m->rec.good;
    }
    pthread_mutex_unlock(&l->lock);
    const char *what = "record";
    if (err == 0) {
        what = "image";
        if ((!m->fly_cur.has || (err = ensure_image(rt, m->fly_cur.hash, nowait, &r)) == 0) &&
            (!m->fly_good.has || (err = ensure_image(rt, m->fly_good.hash, nowait, &r)) == 0)) {
            what = "record";
            record_name(m->rec.module, name, sizeof name);
            struct iovec iov = {.iov_base = text, .iov_len = n};
            err = hku_write_atomicat(l->mod_fd, l->mod_dir, name, &iov, 1, 0600, 1, &r);
        }
        free(text);
    }
    pthread_mutex_lock(&l->lock);
    if (err == 0) {
        m->disk_gen = gen;
        m->disk_cur = m->fly_cur;
        m->disk_good = m->fly_good;
        /* A record refused at open under this name is replaced now. */
        for (lkg_refusal **pp = &l->refusals; *pp; pp = &(*pp)->next)
            if (!strcmp((*pp)->fname, name)) {
                lkg_refusal *gone = *pp;
                *pp = gone->next;
                free(gone->h);
                free(gone);
                break;
            }
    }
    m->fly_cur.has = m->fly_good.has = 0;
    disk_end(l);
    pthread_mutex_unlock(&l->lock);
    pthread_mutex_unlock(&m->wlock);
    if (err < 0 && !(nowait && err == HK_ERR_BUSY))
        hk_log(rt, HK_LOG_WARN, "engine",
               "cannot write the %s of '%s': %s; its last record on disk stays, and the next "
               "write of the module tries again",
               what, m->rec.module,
               err == HK_ERR_NOMEM       ? "out of memory"
               : err == HK_ERR_TOO_LARGE ? "the record would not read back (too many or too long "
                                           "name expressions)"
                                         : r.message);
}

/* Writes the records a loss made due (quarantined ones waiting for their
 * writers, promoted ones not) or, with all, every record behind memory. */
static void flush_dirty(hk_runtime *rt, int all, int nowait) {
    hkl_lkg *l = rt->lkg;
    int n = 0, k = 0;
    if (!l->dir)
        return;
    pthread_mutex_lock(&l->lock);
    for (lkg_mod *m = l->mods; m; m = m->next)
        n += all ? m->gen != m->disk_gen : m->qdue || m->pdue;
    lkg_mod **v = n ? malloc((size_t)n * sizeof *v) : NULL;
    int *wait = n ? malloc((size_t)n * sizeof *wait) : NULL;
    for (lkg_mod *m = l->mods; v && wait && m; m = m->next)
        if (all ? m->gen != m->disk_gen : m->qdue || m->pdue) {
            wait[k] = !nowait && (all || m->qdue);
            v[k++] = m;
            m->qdue = m->pdue = 0;
        }
    pthread_mutex_unlock(&l->lock);
    for (int i = 0; i < k; i++)
        flush(rt, v[i], !wait[i]); /* modules are freed at close only */
    free(v);
    free(wait);
}

/* Image files and the temporary files of image writes cut short. */
static int is_image_name(const char *n, uint8_t h[32]) {
    if (strlen(n) < 64 || hkl_hash_parse(n, 64, h) < 0)
        return 0;
    return n[64] == '\0' ? 1 : !strncmp(n + 64, ".tmp.", 5) ? 2 : 0;
}

/* Removes images nothing needs (see "Collection" above) and the temporary
 * files of image writes (none is in progress: img_lock is held, and the
 * directory lock keeps other processes out); only files named as hotkern
 * names them (the directory may hold other things). Skipped when an image
 * is being written. An image a commit names after it was judged here is
 * queued by that commit and written before its record. */
static void collect(hk_runtime *rt) {
    hkl_lkg *l = rt->lkg;
    if (!l->dir || pthread_mutex_trylock(&l->img_lock) != 0)
        return;
    pthread_mutex_lock(&l->lock);
    int go = disk_begin(l);
    pthread_mutex_unlock(&l->lock);
    int fd = go ? openat(l->img_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d && fd >= 0)
        close(fd);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        uint8_t h[32];
        int kind = is_image_name(e->d_name, h);
        if (!kind)
            continue;
        pthread_mutex_lock(&l->lock);
        int drop = kind == 2 || !needed(l, h);
        pthread_mutex_unlock(&l->lock);
        if (drop)
            unlinkat(l->img_fd, e->d_name, 0);
    }
    if (d)
        closedir(d);
    if (go) {
        pthread_mutex_lock(&l->lock);
        disk_end(l);
        pthread_mutex_unlock(&l->lock);
    }
    pthread_mutex_unlock(&l->img_lock);
}

/* ---- open and close ------------------------------------------------------- */

static void refused_add(hkl_lkg *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refused_add(hkl_lkg *l, const char *fmt, ...) {
    size_t n = strlen(l->refused);
    if (n + 8 >= sizeof l->refused)
        return;
    if (n)
        n += (size_t)snprintf(l->refused + n, sizeof l->refused - n, "; ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->refused + n, sizeof l->refused - n, fmt, ap);
    va_end(ap);
}

/* Keeps the image hashes a refused record's text mentions, wherever they
 * are in it: what it names cannot be told from a damaged record, and its
 * images are kept for a person to look at until its module writes again. */
static void refusal_add(hkl_lkg *l, const char *fname, const char *text, size_t len) {
    lkg_refusal *r = calloc(1, sizeof *r);
    if (!r)
        return;
    snprintf(r->fname, sizeof r->fname, "%s", fname);
    for (size_t i = 0; text && i + 64 <= len;) {
        uint8_t h[32];
        if (hkl_hash_parse(text + i, 64, h) < 0) {
            i++;
            continue;
        }
        uint8_t(*g)[32] = realloc(r->h, (size_t)(r->nh + 1) * sizeof *g);
        if (!g)
            break;
        r->h = g;
        memcpy(r->h[r->nh++], h, 32);
        i += 64;
    }
    r->next = l->refusals;
    l->refusals = r;
}

/* Reads one record file; a bad one is refused (named in l->refused, left
 * on disk until the module's next record replaces it). Called at open,
 * before any other thread uses l. */
static void load_record(hk_runtime *rt, const char *fname) {
    hkl_lkg *l = rt->lkg;
    char why[160], want[HKL_NAME_MAX * 3 + 8];
    char *text = NULL;
    size_t len = 0;
    hk_report r = HK_REPORT_INIT;
    int err = hku_read_fileat(l->mod_fd, l->mod_dir, fname, HKL_REC_MAX_BYTES, &text, &len, &r);
    lkg_mod *m = err ? NULL : mod_new();
    if (err || !m) {
        /* Not read (a link, another owner, a loose mode, an error): nothing
         * in it is trusted, not even the images it may name. */
        refused_add(l, "modules/%s: %s", fname, err ? r.message : "out of memory");
        free(text);
        return;
    }
    if (hkl_rec_parse(text, len, &m->rec, why, sizeof why) < 0) {
        refused_add(l, "modules/%s: %s", fname, why);
        refusal_add(l, fname, text, len);
    } else {
        record_name(m->rec.module, want, sizeof want);
        if (strcmp(want, fname) || mod_find(l, m->rec.module)) {
            refused_add(l, "modules/%s: names module '%s'", fname, m->rec.module);
            refusal_add(l, fname, text, len);
        } else {
            /* Version numbers are this process's: an earlier one's mean
             * nothing here (hk_quarantine.version says 0 for them). */
            for (int i = 0; i < m->rec.nq; i++)
                m->rec.q[i].version = 0;
            m->disk_cur = m->rec.current;
            m->disk_good = m->rec.good;
            mod_insert(l, m);
            m = NULL;
        }
    }
    if (m)
        mod_free(m);
    free(text);
}

static int load_records(hk_runtime *rt, hk_report *rep) {
    hkl_lkg *l = rt->lkg;
    int fd = openat(l->mod_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        hku_fail(rep, HK_ERR_IO, "state directory %s: %s", l->mod_dir, strerror(errno));
        if (fd >= 0)
            close(fd);
        return HK_ERR_IO;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (strstr(e->d_name, ".tmp."))
            unlinkat(l->mod_fd, e->d_name, 0); /* a write cut short by a crash */
        else if (n > 4 && !strcmp(e->d_name + n - 4, ".rec"))
            load_record(rt, e->d_name);
    }
    closedir(d);
    return 0;
}

/* Opens and checks the directory and its two subdirectories (created when
 * missing), keeping a descriptor of each. */
static int open_dirs(hkl_lkg *l, hk_report *rep) {
    static const char what[] = "state directory";
    if ((l->dfd = hku_dir_open(l->dir, what, 1, rep)) < 0)
        return l->dfd;
    snprintf(l->img_dir, sizeof l->img_dir, "%s/images", l->dir);
    snprintf(l->mod_dir, sizeof l->mod_dir, "%s/modules", l->dir);
    if ((l->img_fd = hku_subdir_open(l->dfd, l->dir, "images", what, 1, rep)) < 0)
        return l->img_fd;
    if ((l->mod_fd = hku_subdir_open(l->dfd, l->dir, "modules", what, 1, rep)) < 0)
        return l->mod_fd;
    return 0;
}

static int lock_dir(hkl_lkg *l, hk_report *rep) {
    hk_report r = HK_REPORT_INIT;
    l->lockfd = hku_openat(l->dfd, l->dir, "lock", O_RDWR | O_CREAT, 0600, &r);
    if (l->lockfd < 0) {
        int err = l->lockfd == HK_ERR_NOT_FOUND ? HK_ERR_IO : l->lockfd;
        l->lockfd = -1;
        hku_fail(rep, err, "state directory lock: %s", r.message);
        return err;
    }
    if (flock(l->lockfd, LOCK_EX | LOCK_NB) < 0) {
        int busy = errno == EWOULDBLOCK;
        hku_fail(rep, busy ? HK_ERR_BUSY : HK_ERR_IO, "state directory %s: %s", l->dir,
                 busy ? "in use by another runtime" : strerror(errno));
        return busy ? HK_ERR_BUSY : HK_ERR_IO;
    }
    return 0;
}

int hkl_lkg_open(hk_runtime *rt, hk_report *rep) {
    hkl_lkg *l = calloc(1, sizeof *l);
    if (!l || sodium_init() < 0) {
        free(l);
        return HK_ERR_NOMEM;
    }
    rt->lkg = l;
    pthread_mutex_init(&l->lock, NULL);
    pthread_mutex_init(&l->img_lock, NULL);
    pthread_cond_init(&l->idle, NULL);
    l->lockfd = l->dfd = l->img_fd = l->mod_fd = -1;
    l->now = hkl_now_ms;
    l->window = rt->opt.suspect_window_ms > 0 ? rt->opt.suspect_window_ms : 60000;
    if (!rt->opt.state_dir || !rt->opt.state_dir[0])
        return 0;
    if (strlen(rt->opt.state_dir) > 3000) {
        hku_fail(rep, HK_ERR_INVALID, "state directory path too long");
        return HK_ERR_INVALID;
    }
    if (!(l->dir = strdup(rt->opt.state_dir)))
        return HK_ERR_NOMEM;
    rt->opt.state_dir = l->dir; /* the caller's string dies with the call */
    int err;
    if ((err = open_dirs(l, rep)) < 0 || (err = lock_dir(l, rep)) < 0 ||
        (err = load_records(rt, rep)) < 0)
        return err;
    collect(rt);
    if (l->refused[0])
        hk_log(rt, HK_LOG_WARN, "engine", "state directory %s: records refused: %s", l->dir,
               l->refused);
    return 0;
}

/* Promotes m's current image to known good when it has been current for the
 * window without a loss (lkg_lock). Returns 1 when the good image changed. */
static int promote(hkl_lkg *l, lkg_mod *m, double now) {
    if (!m->rec.current.has || m->cur_t < 0 || now - m->cur_t < l->window || l->frozen)
        return 0;
    if (m->rec.good.has && !memcmp(m->rec.good.hash, m->rec.current.hash, 32))
        return 0;
    char **e = strv_dup(m->cur_expr, m->ncur), **w = strv_dup(m->cur_lowered, m->ncur);
    if (m->ncur && (!e || !w)) {
        hku_strv_free(e, m->ncur);
        hku_strv_free(w, m->ncur);
        return 0; /* no memory: stays unproven, which is safe */
    }
    hkl_rec_free(&m->rec);
    m->rec.good = m->rec.current;
    m->rec.expr = e;
    m->rec.lowered = w;
    m->rec.nexpr = m->ncur;
    m->gen++;
    return 1;
}

/* Records, as at a clean end, what ran long enough, and writes every
 * record behind memory: waiting for writers in progress, or not (release). */
static void write_final(hk_runtime *rt, int nowait) {
    hkl_lkg *l = rt->lkg;
    double now = l->now();
    pthread_mutex_lock(&l->lock);
    int done = l->released;
    for (lkg_mod *m = l->mods; m && !done; m = m->next)
        promote(l, m, now);
    pthread_mutex_unlock(&l->lock);
    if (done)
        return;
    flush_dirty(rt, 1, nowait);
    collect(rt);
}

/* Lets the directory go: nothing is written from now on, and the flock is
 * released now, or by the last write in progress when it ends. */
static void let_go(hkl_lkg *l) {
    pthread_mutex_lock(&l->lock);
    l->released = 1;
    if (l->writers == 0 && l->lockfd >= 0) {
        close(l->lockfd); /* releases the flock */
        l->lockfd = -1;
    }
    pthread_mutex_unlock(&l->lock);
}

void hkl_lkg_hold(hk_runtime *rt) {
    hkl_lkg *l = rt->lkg;
    if (!l)
        return;
    pthread_mutex_lock(&l->lock);
    l->holds++;
    pthread_mutex_unlock(&l->lock);
}

void hkl_lkg_release(hk_runtime *rt, int gave_up) {
    hkl_lkg *l = rt->lkg;
    if (!l)
        return;
    if (gave_up) {
        write_final(rt, 1);
        let_go(l);
    }
    pthread_mutex_lock(&l->lock);
    if (--l->holds == 0)
        pthread_cond_broadcast(&l->idle);
    pthread_mutex_unlock(&l->lock); /* rt may be freed from here on */
}

void hkl_lkg_close(hk_runtime *rt) {
    hkl_lkg *l = rt->lkg;
    if (!l)
        return;
    /* The reclaim thread may get here while destroy still releases the
     * directory: the runtime stays until that is done. */
    pthread_mutex_lock(&l->lock);
    while (l->holds)
        pthread_cond_wait(&l->idle, &l->lock);
    pthread_mutex_unlock(&l->lock);
    write_final(rt, 0);
    let_go(l);
    pthread_mutex_lock(&l->lock);
    while (l->writers) /* none at a normal end; after a release, a last write */
        pthread_cond_wait(&l->idle, &l->lock);
    while (l->mods) {
        lkg_mod *m = l->mods;
        l->mods = m->next;
        mod_free(m);
    }
    while (l->unwritten)
        unwritten_remove(l, l->unwritten);
    while (l->refusals) {
        lkg_refusal *r = l->refusals;
        l->refusals = r->next;
        free(r->h);
        free(r);
    }
    pthread_mutex_unlock(&l->lock);
    int fds[] = {l->dfd, l->img_fd, l->mod_fd};
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    pthread_mutex_destroy(&l->lock);
    pthread_mutex_destroy(&l->img_lock);
    pthread_cond_destroy(&l->idle);
    free(l->dir);
    free(l);
    rt->lkg = NULL;
}

void hkl_lkg_set_clock(hk_runtime *rt, double (*now)(void)) {
    rt->lkg->now = now;
}

/* ---- commits and checks ------------------------------------------------- */

void hkl_lkg_hash(const void *image, size_t size, uint8_t h[32]) {
    hash_of(image, size, h);
}

/* Notes a commit of this process for the suspect window (lkg_lock); an
 * entry for the same version (noted while pending) is kept as it is. */
static void recent_add(lkg_mod *m, const uint8_t h[32], double t, uint64_t release,
                       uint64_t version) {
    for (int i = 0; i < m->nrecent; i++)
        if (m->recent[i].version == version)
            return;
    if (m->nrecent == NRECENT)
        memmove(m->recent, m->recent + 1, (NRECENT - 1) * sizeof *m->recent);
    else
        m->nrecent++;
    lkg_recent *r = &m->recent[m->nrecent - 1];
    memcpy(r->hash, h, 32);
    r->t = t;
    r->release = release;
    r->version = version;
}

void hkl_lkg_pending(hk_runtime *rt, const char *module, const uint8_t hash[32], uint64_t version,
                     uint64_t release) {
    hkl_lkg *l = rt->lkg;
    double now = l->now();
    pthread_mutex_lock(&l->lock);
    lkg_mod *m = mod_get(l, module);
    if (m)
        recent_add(m, hash, now, release, version);
    pthread_mutex_unlock(&l->lock);
}

void hkl_lkg_unpending(hk_runtime *rt, const char *module, uint64_t version) {
    hkl_lkg *l = rt->lkg;
    pthread_mutex_lock(&l->lock);
    lkg_mod *m = mod_find(l, module);
    for (int i = 0; m && i < m->nrecent; i++)
        if (m->recent[i].version == version) {
            memmove(m->recent + i, m->recent + i + 1,
                    (size_t)(m->nrecent - i - 1) * sizeof *m->recent);
            m->nrecent--;
            break;
        }
    pthread_mutex_unlock(&l->lock);
}

/* Makes v m's current image in memory (lkg_lock); takes e and w. */
static void set_current(hkl_lkg *l, lkg_mod *m, const hkl_version *v, const uint8_t h[32],
                        uint64_t release, char **e, char **w, double now) {
    promote(l, m, now); /* the version replaced ran long enough */
    hku_strv_free(m->cur_expr, m->ncur);
    hku_strv_free(m->cur_lowered, m->ncur);
    m->cur_expr = e;
    m->cur_lowered = w;
    m->ncur = v->nexpr;
    m->rec.current = (hkl_rec_image){.has = 1, .format = v->format, .release = release};
    memcpy(m->rec.current.hash, h, 32);
    m->cur_t = now;
    recent_add(m, h, now, release, v->number);
    m->gen++;
}

/* Whether a record on disk names image h (lkg_lock): it is on disk then,
 * and stays while the record does or memory names it. */
static int on_disk(const hkl_lkg *l, const uint8_t h[32]) {
    for (const lkg_mod *m = l->mods; m; m = m->next)
        if (same_image(&m->disk_cur, h) || same_image(&m->disk_good, h))
            return 1;
    return 0;
}

/* A copy of v's image to queue as unwritten; NULL without memory. */
static lkg_img *image_copy(const hkl_version *v, const uint8_t h[32]) {
    lkg_img *img = calloc(1, sizeof *img);
    if (img && !(img->data = malloc(v->size))) {
        free(img);
        return NULL;
    }
    if (img) {
        memcpy(img->hash, h, 32);
        memcpy(img->data, v->image, v->size);
        img->size = v->size;
    }
    return img;
}

/* Whether a commit of image h must queue a copy (lkg_lock): neither queued
 * already nor on disk under a record. */
static int must_queue(const hkl_lkg *l, const uint8_t h[32]) {
    return l->dir && !unwritten_find(l, h) && !on_disk(l, h);
}

void hkl_lkg_committed(hk_runtime *rt, const hkl_version *v, const uint8_t *hash,
                       uint64_t release) {
    hkl_lkg *l = rt->lkg;
    uint8_t h[32];
    if (hash)
        memcpy(h, hash, 32);
    else
        hash_of(v->image, v->size, h);
    char **e = strv_dup(v->expr, v->nexpr), **w = strv_dup(v->lowered, v->nexpr);
    double now = l->now();
    /* The copy the flush writes is taken now, since v may be unloaded and
     * freed once swap_lock is released, and outside lkg_lock (an image may
     * be large). Whether it is needed is decided again below, in the same
     * section as the change, so that a record on disk cannot stop naming
     * the image between the two. */
    pthread_mutex_lock(&l->lock);
    int queue = must_queue(l, h);
    pthread_mutex_unlock(&l->lock);
    lkg_img *img = queue ? image_copy(v, h) : NULL;
    pthread_mutex_lock(&l->lock);
    lkg_mod *m = mod_get(l, v->mod->name);
    if ((queue = must_queue(l, h)) && !img)
        img = image_copy(v, h); /* rare: needed only now */
    if (!m || (v->nexpr && (!e || !w)) || (queue && !img)) {
        pthread_mutex_unlock(&l->lock);
        if (img)
            free(img->data);
        free(img);
        hku_strv_free(e, v->nexpr);
        hku_strv_free(w, v->nexpr);
        hk_log(rt, HK_LOG_WARN, "engine", "'%s' v%llu: out of memory, not recorded", v->mod->name,
               (unsigned long long)v->number);
        return;
    }
    if (queue) {
        img->next = l->unwritten;
        l->unwritten = img;
        img = NULL;
    }
    set_current(l, m, v, h, release, e, w, now);
    unwritten_prune(l);
    pthread_mutex_unlock(&l->lock);
    if (img) /* not needed after all */
        free(img->data);
    free(img);
}

void hkl_lkg_flush(hk_runtime *rt, const char *module) {
    hkl_lkg *l = rt ? rt->lkg : NULL;
    if (!l || !l->dir || !module)
        return;
    pthread_mutex_lock(&l->lock);
    lkg_mod *m = mod_find(l, module);
    pthread_mutex_unlock(&l->lock);
    if (m) /* modules are freed at close only */
        flush(rt, m, 0);
    collect(rt);
}

int hkl_lkg_check(hk_runtime *rt, const char *module, const void *image, size_t size,
                  hk_report *rep) {
    hkl_lkg *l = rt->lkg;
    hkl_rec_q q[HKL_REC_MAXQ];
    int nq = 0;
    pthread_mutex_lock(&l->lock);
    lkg_mod *m = mod_find(l, module);
    if (m) {
        nq = m->rec.nq;
        memcpy(q, m->rec.q, (size_t)nq * sizeof *q);
    }
    pthread_mutex_unlock(&l->lock);
    if (!nq)
        return 0;
    uint8_t h[32];
    hash_of(image, size, h);
    for (int i = 0; i < nq; i++)
        if (!memcmp(q[i].hash, h, 32)) {
            char hex[65], rel[48] = "";
            hkl_hash_hex(h, hex);
            if (q[i].release)
                snprintf(rel, sizeof rel, " (release %llu)", (unsigned long long)q[i].release);
            hku_fail(rep, HK_ERR_QUARANTINED,
                     "'%s': image %.16s%s is quarantined: it was committed shortly before "
                     "the CUDA context was lost; publish a different image",
                     module, hex, rel);
            if (rep)
                snprintf(rep->module, sizeof rep->module, "%s", module);
            return HK_ERR_QUARANTINED;
        }
    return 0;
}

/* ---- context lost ------------------------------------------------------- */

static int quarantine_add(lkg_mod *m, const lkg_recent *r) {
    for (int i = 0; i < m->rec.nq; i++)
        if (!memcmp(m->rec.q[i].hash, r->hash, 32))
            return 0;
    if (m->rec.nq == HKL_REC_MAXQ) {
        memmove(m->rec.q, m->rec.q + 1, (HKL_REC_MAXQ - 1) * sizeof *m->rec.q);
        m->rec.nq--;
    }
    hkl_rec_q *q = &m->rec.q[m->rec.nq++];
    memcpy(q->hash, r->hash, 32);
    q->release = r->release;
    q->version = r->version;
    return 1;
}

/* Applies the rule to every module in memory (lkg_lock; the caller writes
 * the records) and says what it did in msg. A version noted as pending
 * counts as committed when it was noted. */
static void quarantine_recent(hk_runtime *rt, double now, char *msg, size_t n) {
    hkl_lkg *l = rt->lkg;
    size_t k = strlen(msg);
    int any = 0;
    for (lkg_mod *m = l->mods; m; m = m->next) {
        if (promote(l, m, now))
            m->pdue = 1; /* on disk before the event too */
        for (int i = 0; i < m->nrecent; i++) {
            const lkg_recent *r = &m->recent[i];
            if (now - r->t >= l->window ||
                (m->rec.good.has && !memcmp(m->rec.good.hash, r->hash, 32)) ||
                !quarantine_add(m, r))
                continue;
            m->gen++;
            m->qdue = 1;
            if (k + 2 < n)
                k += (size_t)snprintf(msg + k, n - k, "%s%s v%llu", any++ ? ", " : "",
                                      m->rec.module, (unsigned long long)r->version);
        }
    }
    if (!any && k + 2 < n)
        snprintf(msg + k, n - k, "nothing (no version committed within %.0f ms)", l->window);
}

void hkl_lkg_lost(hk_runtime *rt, int cu, const char *where) {
    hkl_lkg *l = rt->lkg;
    if (!l || atomic_exchange(&l->lost, 1))
        return;
    hk_report rep = HK_REPORT_INIT;
    hkl_report_cu(&rep, rt, (CUresult)cu, where);
    char msg[sizeof rep.message];
    snprintf(msg, sizeof msg,
             "context lost: %s in %s; the process must restart; quarantined: ", rep.cu_name, where);
    double now = l->now();
    pthread_mutex_lock(&l->lock);
    quarantine_recent(rt, now, msg, sizeof msg); /* promotes first */
    l->frozen = 1;
    pthread_mutex_unlock(&l->lock);
    /* The quarantine and the promotions are on disk before the event (a
     * program may end in its handler). Only writers of the quarantined
     * records are waited for: a record being written when the loss came,
     * with no quarantine in it, gets its promotion at its next write. */
    flush_dirty(rt, 0, 0);
    collect(rt);
    snprintf(rep.message, sizeof rep.message, "%s", msg);
    rep.error = HK_ERR_CUDA;
    hkl_emit(rt, HK_EVENT_CONTEXT_LOST, NULL, 0, 0, where, &rep);
    hk_report_clear(&rep);
}

int hk_runtime_note_error(hk_runtime *rt, int cu_result) {
    if (!rt || !hkl_lkg_sticky(cu_result))
        return 0;
    hkl_lkg_lost(rt, cu_result, "the application's call");
    return 1;
}

/* ---- what restore reads, and queries ------------------------------------ */

const char *hkl_lkg_dir(const hk_runtime *rt) {
    return rt->lkg->dir;
}

int hkl_lkg_read_image(hk_runtime *rt, const uint8_t hash[32], char **data, size_t *n, char *why,
                       size_t whyn) {
    hkl_lkg *l = rt->lkg;
    char hex[65];
    uint8_t h[32];
    hkl_hash_hex(hash, hex);
    hk_report r = HK_REPORT_INIT;
    int err = hku_read_fileat(l->img_fd, l->img_dir, hex, (size_t)1 << 30, data, n, &r);
    if (err) {
        snprintf(why, whyn, "%s", r.message);
        return err;
    }
    /* Bound to its name: the image must hash to it. */
    hash_of(*data, *n, h);
    if (!*n || memcmp(h, hash, 32)) {
        snprintf(why, whyn, "%.400s/%s: content does not match its hash", l->img_dir, hex);
        free(*data);
        return HK_ERR_HASH;
    }
    return 0;
}

int hkl_lkg_goods(hk_runtime *rt, hkl_lkg_good **out, char *refused, size_t rn) {
    hkl_lkg *l = rt->lkg;
    int n = 0, cap = 0;
    hkl_lkg_good *v = NULL;
    pthread_mutex_lock(&l->lock);
    snprintf(refused, rn, "%s", l->refused);
    for (lkg_mod *m = l->mods; m; m = m->next) {
        if (!m->rec.good.has)
            continue;
        if (n == cap) {
            hkl_lkg_good *g = realloc(v, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *g);
            if (!g)
                break;
            v = g;
        }
        hkl_lkg_good *it = &v[n++];
        memset(it, 0, sizeof *it);
        snprintf(it->module, sizeof it->module, "%s", m->rec.module);
        it->good = m->rec.good;
        it->nexpr = m->rec.nexpr;
        it->expr = strv_dup(m->rec.expr, m->rec.nexpr);
        it->lowered = strv_dup(m->rec.lowered, m->rec.nexpr);
        it->runs = m->cur_t >= 0 && m->rec.current.has &&
                   !memcmp(m->rec.current.hash, m->rec.good.hash, 32);
    }
    pthread_mutex_unlock(&l->lock);
    *out = v;
    return n;
}

int hk_quarantine_get(hk_runtime *rt, int index, hk_quarantine *out) {
    if (!rt || !out || index < 0 || hkl_size_of(out) < HKL_QUARANTINE_SIZE0)
        return HK_ERR_INVALID;
    hk_quarantine q;
    hk_quarantine_init(&q);
    int err = HK_ERR_NOT_FOUND;
    pthread_mutex_lock(&rt->lkg->lock);
    for (lkg_mod *m = rt->lkg->mods; m && err; m = m->next) {
        if (index >= m->rec.nq) {
            index -= m->rec.nq;
            continue;
        }
        snprintf(q.module, sizeof q.module, "%s", m->rec.module);
        hkl_hash_hex(m->rec.q[index].hash, q.image);
        q.release_version = m->rec.q[index].release;
        q.version = m->rec.q[index].version;
        err = 0;
    }
    pthread_mutex_unlock(&rt->lkg->lock);
    if (!err)
        hkl_sized_out(out, &q, sizeof q);
    return err;
}

int hk_module_known_good(hk_runtime *rt, const char *module, char hash[65], uint64_t *release) {
    if (!rt || !module || !hash)
        return HK_ERR_INVALID;
    int err = HK_ERR_NOT_FOUND;
    pthread_mutex_lock(&rt->lkg->lock);
    lkg_mod *m = mod_find(rt->lkg, module);
    if (m && m->rec.good.has) {
        hkl_hash_hex(m->rec.good.hash, hash);
        if (release)
            *release = m->rec.good.release;
        err = 0;
    }
    pthread_mutex_unlock(&rt->lkg->lock);
    return err;
}

void hkl_lkg_counts(hk_runtime *rt, uint64_t *lost, uint64_t *quarantined) {
    uint64_t q = 0;
    if (!rt->lkg)
        return;
    pthread_mutex_lock(&rt->lkg->lock);
    for (lkg_mod *m = rt->lkg->mods; m; m = m->next)
        q += (uint64_t)m->rec.nq;
    pthread_mutex_unlock(&rt->lkg->lock);
    *lost = (uint64_t)atomic_load(&rt->lkg->lost);
    *quarantined = q;
}

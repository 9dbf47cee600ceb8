/*
 * Last known good on disk: the state directory, its files, their writers
 * and collection (lkg.c decides what the records say; loader/lkg.h holds
 * the state both files share).
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
 * Writes, collection and trust: beside the code that does each. Lock
 * order: swap_lock -> wlock -> img_lock -> lkg_lock.
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

#include "loader/lkg.h"
#include "loader/lkgdisk.h"
#include "loader/record.h"
#include "util/util.h"

/* ---- module entries ------------------------------------------------------- */

void hkl_lkg_hash(const void *image, size_t size, uint8_t h[32]) {
    crypto_generichash(h, 32, image, size, NULL, 0);
}

void hkl_lkg_mod_free(lkg_mod *m) {
    hkl_rec_free(&m->rec);
    hku_strv_free(m->cur_expr, m->ncur);
    hku_strv_free(m->cur_lowered, m->ncur);
    pthread_mutex_destroy(&m->wlock);
    free(m);
}

/* A module entry with nothing in it; NULL: out of memory. */
lkg_mod *hkl_lkg_mod_new(void) {
    lkg_mod *m = calloc(1, sizeof *m);
    if (m) {
        pthread_mutex_init(&m->wlock, NULL);
        m->cur_t = -1;
    }
    return m;
}

lkg_mod *hkl_lkg_mod_find(hkl_lkg *l, const char *name) {
    for (lkg_mod *m = l->mods; m; m = m->next)
        if (!strcmp(m->rec.module, name))
            return m;
    return NULL;
}

/* Inserts m in name order (lkg_lock). */
void hkl_lkg_mod_insert(hkl_lkg *l, lkg_mod *m) {
    lkg_mod **pp = &l->mods;
    while (*pp && strcmp((*pp)->rec.module, m->rec.module) < 0)
        pp = &(*pp)->next;
    m->next = *pp;
    *pp = m;
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

lkg_img *hkl_lkg_unwritten_find(const hkl_lkg *l, const uint8_t h[32]) {
    for (lkg_img *e = l->unwritten; e; e = e->next)
        if (!memcmp(e->hash, h, 32))
            return e;
    return NULL;
}

void hkl_lkg_unwritten_remove(hkl_lkg *l, lkg_img *e) {
    for (lkg_img **pp = &l->unwritten; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    free(e->data);
    free(e);
}

/*
 * Collection. After each write, images are removed that nothing may still
 * need: not named by a record in memory, by the record on disk (as last
 * written or read), by a record write in progress, by an image waiting to
 * be written, or anywhere in the text of a record refused at open (kept
 * until its module's next record replaces it). So a damaged record, or a
 * write that failed, costs the images it names and nothing else: the disk
 * holds about two images per module.
 */
/* Whether image h may still be needed (lkg_lock): a record in memory, on
 * disk or being written names it, it waits to be written, or a refused
 * record mentions it. */
static int needed(const hkl_lkg *l, const uint8_t h[32]) {
    for (const lkg_mod *m = l->mods; m; m = m->next)
        if (hkl_lkg_same_image(&m->rec.current, h) || hkl_lkg_same_image(&m->rec.good, h) ||
            hkl_lkg_same_image(&m->disk_cur, h) || hkl_lkg_same_image(&m->disk_good, h) ||
            hkl_lkg_same_image(&m->fly_cur, h) || hkl_lkg_same_image(&m->fly_good, h))
            return 1;
    if (hkl_lkg_unwritten_find(l, h))
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
void hkl_lkg_unwritten_prune(hkl_lkg *l) {
    for (lkg_img *e = l->unwritten, *next; e; e = next) {
        next = e->next;
        int named = 0;
        for (const lkg_mod *m = l->mods; m && !named; m = m->next)
            named = hkl_lkg_same_image(&m->rec.current, e->hash) ||
                    hkl_lkg_same_image(&m->rec.good, e->hash) ||
                    hkl_lkg_same_image(&m->fly_cur, e->hash) ||
                    hkl_lkg_same_image(&m->fly_good, e->hash);
        if (!named && !e->busy)
            hkl_lkg_unwritten_remove(l, e);
    }
}

/*
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
 */
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
    int queued = hkl_lkg_unwritten_find(l, h) != NULL;
    pthread_mutex_unlock(&l->lock);
    if (!queued)
        return 0;
    if (nowait ? pthread_mutex_trylock(&l->img_lock) != 0 : pthread_mutex_lock(&l->img_lock) != 0)
        return hku_fail(r, HK_ERR_BUSY, "an image is being written");
    pthread_mutex_lock(&l->lock);
    lkg_img *e = hkl_lkg_unwritten_find(l, h); /* NULL: written meanwhile */
    if (e)
        e->busy = 1;
    pthread_mutex_unlock(&l->lock);
    int err = e ? write_image_file(l, h, e->data, e->size, r) : 0;
    pthread_mutex_lock(&l->lock);
    if (e && !err)
        hkl_lkg_unwritten_remove(l, e);
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
void hkl_lkg_write_mod(hk_runtime *rt, lkg_mod *m, int nowait) {
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
void hkl_lkg_write_due(hk_runtime *rt, int all, int nowait) {
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
        hkl_lkg_write_mod(rt, v[i], !wait[i]); /* modules are freed at close only */
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
void hkl_lkg_collect(hk_runtime *rt) {
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

/* ---- open ----------------------------------------------------------------- */

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
    lkg_mod *m = err ? NULL : hkl_lkg_mod_new();
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
        if (strcmp(want, fname) || hkl_lkg_mod_find(l, m->rec.module)) {
            refused_add(l, "modules/%s: names module '%s'", fname, m->rec.module);
            refusal_add(l, fname, text, len);
        } else {
            /* Version numbers are this process's: an earlier one's mean
             * nothing here (hk_quarantine.version says 0 for them). */
            for (int i = 0; i < m->rec.nq; i++)
                m->rec.q[i].version = 0;
            m->disk_cur = m->rec.current;
            m->disk_good = m->rec.good;
            hkl_lkg_mod_insert(l, m);
            m = NULL;
        }
    }
    if (m)
        hkl_lkg_mod_free(m);
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

/*
 * Trust. What this directory holds decides what --restore runs, so it is
 * used only if no other local user can change it (util/util.h, "trusted
 * directories": owner and mode of it and of every directory above it), and
 * everything in it is reached through descriptors of DIR, DIR/images and
 * DIR/modules opened once at open, with O_NOFOLLOW: a link planted as
 * `lock`, `images` or a file is refused, never followed, so nothing is
 * created or removed elsewhere. A record or an image that another user
 * could have written is refused. A record names its module inside, which
 * must give its file name; an image must hash to its file name.
 */
/* Opens and checks the directory and its two subdirectories (created when
 * missing), keeping a descriptor of each. */
static int open_dirs(hkl_lkg *l, hk_report *rep) {
    static const char what[] = "state directory";
    if ((l->dfd = hku_dir_open(l->dir, what, 1, NULL, rep)) < 0)
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

int hkl_lkg_disk_open(hk_runtime *rt, hk_report *rep) {
    hkl_lkg *l = rt->lkg;
    int err;
    if ((err = open_dirs(l, rep)) < 0 || (err = lock_dir(l, rep)) < 0 ||
        (err = load_records(rt, rep)) < 0)
        return err;
    hkl_lkg_collect(rt);
    if (l->refused[0])
        hk_log(rt, HK_LOG_WARN, "engine", "state directory %s: records refused: %s", l->dir,
               l->refused);
    return 0;
}

/* Lets the directory go: nothing is written from now on, and the flock is
 * released now, or by the last write in progress when it ends. */
void hkl_lkg_let_go(hkl_lkg *l) {
    pthread_mutex_lock(&l->lock);
    l->released = 1;
    if (l->writers == 0 && l->lockfd >= 0) {
        close(l->lockfd); /* releases the flock */
        l->lockfd = -1;
    }
    pthread_mutex_unlock(&l->lock);
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
    hkl_lkg_hash(*data, *n, h);
    if (!*n || memcmp(h, hash, 32)) {
        snprintf(why, whyn, "%.400s/%s: content does not match its hash", l->img_dir, hex);
        free(*data);
        return HK_ERR_HASH;
    }
    return 0;
}

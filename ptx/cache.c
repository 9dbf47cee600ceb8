/*
 * On-disk compile cache: one file per entry, named by its key.
 *
 * The cache exists so that a program restarted with the same kernels, or two
 * processes loading the same sources, skip NVRTC (tens of milliseconds per
 * module). Its directory is shared by every process of the user, so nothing
 * here may trust what it reads or assume it is alone:
 * - The directory is used only when no other user can change it (checked at
 *   open like every directory hotkern trusts, util/util.h), and every file
 *   in it is opened with O_NOFOLLOW under its descriptor: an entry or a
 *   lock that is a link, belongs to another user or is writable by others
 *   is refused (an entry: a miss, and removed), never followed.
 * - An entry is written to a temporary file in the same directory and
 *   renamed over its final name. rename() is atomic, so a reader sees the old
 *   entry, the new one, or none, never half a file. Nothing is fsync'd (two
 *   syncs cost a compile about 1.5 ms on the CI machine's disk): after a
 *   crash an entry may be empty or partial, which its header exposes.
 * - Each entry carries a header (ptx/entry.c): its key, its payload length
 *   and a tag of the payload keyed with the key. A short or corrupt file,
 *   or one written for another key (copied over this key's name), is a miss
 *   and is deleted; the build that follows writes a good one.
 * - Least-recently-used eviction uses file mtimes: a hit touches its entry.
 *   Writes and the eviction after each take an exclusive flock on "lock"
 *   (so concurrent evictions do not delete twice as much as needed). A
 *   process holding it may have stopped (SIGSTOP, a debugger), so the lock
 *   is waited for HKP_CACHE_LOCK_MS at most: then the entry is not written
 *   and the build goes on uncached (hkp_build says so), so a swap never
 *   hangs on another process. Readers take no lock: an entry deleted under
 *   a reader is still readable through its open descriptor, and one deleted
 *   before the open is a miss.
 * - The handle keeps the entries it read or wrote last in memory (a small
 *   list in least-recently-used order, HKP_CACHE_MEM_ENTRIES and an eighth of
 *   the bound at most), so a program that goes back and forth between a few
 *   versions reads no file for them (a disk hit costs a swap 0.02-0.1 ms:
 *   open, read, hash, touch). A memory hit refreshes the file's LRU time at
 *   most once a minute per entry, so the entries used most are not the
 *   first evicted from disk.
 * The in-process state (counters, the memory list) is under a mutex.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ptx/ptx.h"
#include "util/util.h"

#define HEADER_BYTES HKP_ENTRY_HEADER
#define ENTRY_SUFFIX ".hkc"
/* hku_write_atomicv's temporary files: ENTRY.tmp.PID.N */
#define TMP_MARK ENTRY_SUFFIX ".tmp."
/* Temporary files older than this belong to a writer that died. */
#define STALE_TMP_SECONDS 3600

typedef struct memo {
    struct memo *prev, *next; /* lock: most recently used first */
    uint8_t key[HKP_KEY_BYTES];
    time_t touched; /* lock: when the file's LRU time was last refreshed */
    size_t size;
    unsigned char data[]; /* size bytes */
} memo;

struct hkp_cache {
    /* immutable after open */
    char *dir;
    int dfd; /* the checked directory: every file is opened under it */
    uint64_t max_bytes;
    pthread_mutex_t lock; /* protects everything below */
    uint64_t hits, misses;
    memo *mru, *lru; /* the entries kept in memory */
    int nmem;
    uint64_t mem_bytes;
};

int hkp_cache_default_dir(char *buf, size_t n) {
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int len;
    if (!buf || !n)
        return HK_ERR_INVALID;
    if (xdg && xdg[0] == '/')
        len = snprintf(buf, n, "%s/hotkern", xdg);
    else if (home && home[0])
        len = snprintf(buf, n, "%s/.cache/hotkern", home);
    else
        return HK_ERR_NOT_FOUND;
    return (len < 0 || (size_t)len >= n) ? HK_ERR_INVALID : 0;
}

int hkp_cache_open(hkp_cache **out, const char *dir, uint64_t max_bytes, hk_report *rep) {
    if (!out || !dir || !dir[0])
        return HK_ERR_INVALID;
    if (max_bytes == 0)
        max_bytes = HKP_CACHE_DEFAULT_BYTES;
    *out = NULL;
    if (sodium_init() < 0)
        return HK_ERR_UNSUPPORTED;
    int dfd = hku_dir_open(dir, "compile cache", 1, NULL, rep);
    if (dfd < 0)
        return dfd;
    hkp_cache *c = calloc(1, sizeof *c);
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        close(dfd);
        return HK_ERR_NOMEM;
    }
    c->dfd = dfd;
    c->max_bytes = max_bytes;
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return 0;
}

void hkp_cache_close(hkp_cache *c) {
    if (!c)
        return;
    for (memo *m = c->mru, *next; m; m = next) {
        next = m->next;
        free(m);
    }
    pthread_mutex_destroy(&c->lock);
    close(c->dfd);
    free(c->dir);
    free(c);
}

const char *hkp_cache_dir(const hkp_cache *c) {
    return c->dir;
}

void hkp_cache_note(hkp_cache *c, int hit) {
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    if (hit)
        c->hits++;
    else
        c->misses++;
    pthread_mutex_unlock(&c->lock);
}

/* The file name of key's entry: 64 hex digits and ".hkc". */
static void entry_name(const uint8_t key[HKP_KEY_BYTES], char buf[2 * HKP_KEY_BYTES + 8]) {
    sodium_bin2hex(buf, 2 * HKP_KEY_BYTES + 1, key, HKP_KEY_BYTES);
    memcpy(buf + 2 * HKP_KEY_BYTES, ENTRY_SUFFIX, sizeof ENTRY_SUFFIX);
}

static int is_entry_name(const char *name) {
    size_t n = strlen(name);
    if (n != 2 * HKP_KEY_BYTES + strlen(ENTRY_SUFFIX))
        return 0;
    for (size_t i = 0; i < 2 * HKP_KEY_BYTES; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return 0;
    return strcmp(name + 2 * HKP_KEY_BYTES, ENTRY_SUFFIX) == 0;
}

/* Reads exactly n bytes: 0, or HK_ERR_IO (an error, or the file ended). */
static int read_all(int fd, void *buf, size_t n) {
    unsigned char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return HK_ERR_IO;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* ---- the entries kept in memory (lock held) ----------------------------- */

static void memo_unlink(hkp_cache *c, memo *m) {
    *(m->prev ? &m->prev->next : &c->mru) = m->next;
    *(m->next ? &m->next->prev : &c->lru) = m->prev;
    c->nmem--;
    c->mem_bytes -= m->size;
}

static void memo_push(hkp_cache *c, memo *m) {
    m->prev = NULL;
    m->next = c->mru;
    *(c->mru ? &c->mru->prev : &c->lru) = m;
    c->mru = m;
    c->nmem++;
    c->mem_bytes += m->size;
}

static memo *memo_find(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES]) {
    for (memo *m = c->mru; m; m = m->next)
        if (!memcmp(m->key, key, HKP_KEY_BYTES))
            return m;
    return NULL;
}

/* Keeps a copy of (key, data) as the most recent entry and lets the oldest
 * go past the bounds. A put (replace) drops any older copy of key, even when
 * this one is too large or there is no memory for it; a disk hit leaves a
 * copy already there (a put of new contents may have raced with the read). */
static void memo_keep(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const void *data, size_t size,
                      int replace) {
    uint64_t cap = c->max_bytes / 8;
    memo *m = size <= cap ? malloc(sizeof *m + size) : NULL;
    if (m) {
        memcpy(m->key, key, HKP_KEY_BYTES);
        m->touched = time(NULL);
        m->size = size;
        memcpy(m->data, data, size);
    }
    pthread_mutex_lock(&c->lock);
    memo *old = memo_find(c, key);
    if (old && !replace) {
        free(m);
        m = NULL;
    } else if (old) {
        memo_unlink(c, old);
        free(old);
    }
    if (m)
        memo_push(c, m);
    while (c->lru && (c->nmem > HKP_CACHE_MEM_ENTRIES || c->mem_bytes > cap)) {
        memo *gone = c->lru;
        memo_unlink(c, gone);
        free(gone);
    }
    pthread_mutex_unlock(&c->lock);
}

/* A copy of key's payload from memory: 0, HK_ERR_NOT_FOUND or HK_ERR_NOMEM.
 * *touch is set when the entry's file is due for an LRU refresh (at most once
 * a MEMO_TOUCH_SECONDS per entry), so that the entries this handle uses most
 * do not look the oldest on disk. */
#define MEMO_TOUCH_SECONDS 60
static int memo_get(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], void **data, size_t *size,
                    int *touch) {
    int rc = HK_ERR_NOT_FOUND;
    time_t now = time(NULL);
    pthread_mutex_lock(&c->lock);
    memo *m = memo_find(c, key);
    if (m) {
        memo_unlink(c, m);
        memo_push(c, m);
        *data = malloc(m->size ? m->size : 1);
        rc = *data ? 0 : HK_ERR_NOMEM;
        if (*data) {
            memcpy(*data, m->data, m->size);
            *size = m->size;
        }
        if ((*touch = now - m->touched >= MEMO_TOUCH_SECONDS))
            m->touched = now;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int hkp_cache_get(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], void **data, size_t *size) {
    char name[2 * HKP_KEY_BYTES + 8];
    unsigned char *buf = NULL;
    int fd = -1, rc = HK_ERR_NOT_FOUND, corrupt = 0;

    if (!c || !key || !data || !size)
        return HK_ERR_INVALID;
    *data = NULL;
    *size = 0;
    int touch = 0;
    entry_name(key, name);
    if ((rc = memo_get(c, key, data, size, &touch)) != HK_ERR_NOT_FOUND) {
        if (touch) /* gone already: nothing to do */
            (void)utimensat(c->dfd, name, NULL, AT_SYMLINK_NOFOLLOW);
        return rc;
    }
    /* A link, another user's file or one others may write is no entry of
     * ours: a miss, and removed (unlinkat removes a link, not its target). */
    fd = hku_openat(c->dfd, c->dir, name, O_RDONLY | O_NONBLOCK, 0, NULL);
    if (fd < 0) {
        corrupt = fd != HK_ERR_NOT_FOUND;
        goto out;
    }
    struct stat st;
    if (fstat(fd, &st) != 0)
        goto out;
    if (st.st_size < HEADER_BYTES || (uint64_t)st.st_size > c->max_bytes) {
        corrupt = 1;
        goto out;
    }
    buf = malloc((size_t)st.st_size);
    if (!buf) {
        rc = HK_ERR_NOMEM;
        goto out;
    }
    if (read_all(fd, buf, (size_t)st.st_size) != 0 ||
        hkp_entry_check(key, buf, (size_t)st.st_size) != 0) {
        corrupt = 1;
        goto out;
    }
    size_t len = (size_t)st.st_size - HEADER_BYTES;
    /* Touch for LRU; a failure only makes the entry look older. */
    (void)futimens(fd, NULL);
    memmove(buf, buf + HEADER_BYTES, len);
    memo_keep(c, key, buf, len, 0);
    *data = buf;
    *size = len;
    buf = NULL;
    rc = 0;
out:
    if (corrupt)
        (void)unlinkat(c->dfd, name, 0);
    if (fd >= 0)
        close(fd);
    free(buf);
    return rc;
}

struct scanned {
    char name[2 * HKP_KEY_BYTES + 8];
    uint64_t size;
    struct timespec mtime;
};

static int by_mtime(const void *a, const void *b) {
    const struct scanned *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec)
        return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Lists the entries (and, when reap is set, deletes stale temporary files).
 * On success *list is malloc'd with *n elements and *total their bytes. */
static int scan_dir(const hkp_cache *c, int reap, struct scanned **list, size_t *n,
                    uint64_t *total) {
    int fd = openat(c->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct scanned *v = NULL;
    size_t cnt = 0, cap = 0;
    uint64_t sum = 0;
    int rc = 0;
    time_t now = time(NULL);

    if (!d) {
        if (fd >= 0)
            close(fd);
        return HK_ERR_IO;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (reap && strstr(de->d_name, TMP_MARK)) {
            if (now - st.st_mtime > STALE_TMP_SECONDS)
                (void)unlinkat(dirfd(d), de->d_name, 0);
            continue;
        }
        if (!is_entry_name(de->d_name))
            continue;
        if (cnt == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            struct scanned *nv = realloc(v, ncap * sizeof *nv);
            if (!nv) {
                rc = HK_ERR_NOMEM;
                goto out;
            }
            v = nv;
            cap = ncap;
        }
        /* is_entry_name() fixed the length, which fits. */
        memcpy(v[cnt].name, de->d_name, strlen(de->d_name) + 1);
        v[cnt].size = (uint64_t)st.st_size;
        v[cnt].mtime = st.st_mtim;
        sum += (uint64_t)st.st_size;
        cnt++;
    }
out:
    closedir(d);
    if (rc) {
        free(v);
        return rc;
    }
    *list = v;
    *n = cnt;
    *total = sum;
    return 0;
}

/* Deletes the least recently used entries until the directory fits (the
 * caller holds the lock). */
static int evict(hkp_cache *c) {
    struct scanned *v = NULL;
    size_t n = 0;
    uint64_t total = 0;
    int rc = scan_dir(c, 1, &v, &n, &total);
    if (rc || total <= c->max_bytes)
        goto out;
    qsort(v, n, sizeof *v, by_mtime);
    for (size_t i = 0; i < n && total > c->max_bytes; i++) {
        if (unlinkat(c->dfd, v[i].name, 0) == 0 || errno == ENOENT)
            total -= v[i].size;
    }
out:
    free(v);
    return rc;
}

/* Takes the directory's lock, waiting HKP_CACHE_LOCK_MS at most: the
 * descriptor (close() releases it), HK_ERR_BUSY while another process holds
 * it, or HK_ERR_IO (the lock file refused: a link, another user's). */
static int lock_dir(hkp_cache *c) {
    int fd = hku_openat(c->dfd, c->dir, "lock", O_RDWR | O_CREAT, 0600, NULL);
    if (fd < 0)
        return HK_ERR_IO;
    int rc = hku_flock_wait(fd, LOCK_EX, HKP_CACHE_LOCK_MS);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    return fd;
}

int hkp_cache_put(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const void *data, size_t size) {
    char name[2 * HKP_KEY_BYTES + 8];
    unsigned char header[HEADER_BYTES];

    if (!c || !key || (!data && size))
        return HK_ERR_INVALID;
    if ((uint64_t)size + HEADER_BYTES > c->max_bytes) {
        memo_keep(c, key, data, size, 1); /* drops an older copy of key */
        return 0;                         /* would evict everything else and still not fit */
    }
    entry_name(key, name);
    hkp_entry_header(key, data, size, header);
    int fd = lock_dir(c);
    if (fd < 0) {
        /* Not cached at all, in memory either: a put replaces, so an older
         * copy of key goes (a size no copy is kept for), and the next build
         * of it compiles again. */
        memo_keep(c, key, NULL, SIZE_MAX, 1);
        return fd;
    }
    struct iovec iov[2] = {{header, sizeof header}, {(void *)data, size}};
    memo_keep(c, key, data, size, 1);
    int rc = hku_write_atomicat(c->dfd, c->dir, name, iov, 2, 0600, 0, NULL);
    if (!rc)
        rc = evict(c);
    close(fd); /* releases the flock */
    return rc;
}

void hkp_cache_stats(hkp_cache *c, uint64_t *hits, uint64_t *misses, uint64_t *bytes) {
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    if (hits)
        *hits = c->hits;
    if (misses)
        *misses = c->misses;
    pthread_mutex_unlock(&c->lock);
    if (bytes) {
        struct scanned *v = NULL;
        size_t n = 0;
        uint64_t total = 0;
        *bytes = scan_dir(c, 0, &v, &n, &total) == 0 ? total : 0;
        free(v);
    }
}

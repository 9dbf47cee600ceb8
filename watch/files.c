/*
 * What a file name is to the watcher, and what a file holds: no lock and no
 * watcher state here (watch/watcher.h).
 *
 * Names: the source kinds by extension (one table), headers, and the files
 * editors write beside the real one while saving (watch/watch.h, "File
 * names and modules").
 *
 * Reads:
 * - A read is trusted only if the file kept its size, times and inode from
 *   before the read to after it (the caller also drains the event queue
 *   right after it: a writer that truncated the file just before the read
 *   would otherwise hand over half a file); otherwise it is retried, so a
 *   half-written file never leaves the watcher.
 * - Nothing but a regular file is opened, and a file that cannot be read is
 *   refused and left alone until an event says it changed: retrying is only
 *   for a regular file caught mid-write, never for one that will not settle
 *   (a procfs file reports 0 bytes and then has content on every read).
 * - A followed symbolic link is read through its resolved path, which the
 *   look hands back so that its entry can watch the target.
 * - The reason of a refusal is built from metadata only; content is never
 *   quoted, because a refused file may be anything (a link to /etc/passwd, a
 *   device, someone's notes).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "watch/watcher.h"

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
int hkw_is_dropping(const char *name) {
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
    if (!name || strchr(name, '/') || hkw_is_dropping(name))
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

/* The index of the source kind of extension ext (any case), or
 * HK_ERR_NOT_FOUND. */
static int source_of(const char *ext) {
    for (size_t i = 0; ext && i < NSOURCES; i++) {
        if (strcasecmp(ext, sources[i].ext) == 0)
            return (int)i;
    }
    return HK_ERR_NOT_FOUND;
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
int hkw_canon_path(const char *path, const char *base, char *out, size_t out_size) {
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

/* ---- reading a file (no lock) ------------------------------------------- */

file_sig hkw_sig_of(const struct stat *st) {
    return (file_sig){.dev = st->st_dev,
                      .ino = st->st_ino,
                      .mode = st->st_mode,
                      .size = st->st_size,
                      .mtime = st->st_mtim,
                      .ctime = st->st_ctim};
}

int hkw_sig_eq(const file_sig *a, const file_sig *b) {
    return a->dev == b->dev && a->ino == b->ino && a->mode == b->mode && a->size == b->size &&
           hkw_ts_eq(a->mtime, b->mtime) && hkw_ts_eq(a->ctime, b->ctime);
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
    lk->sig = hkw_sig_of(&l);
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
              !hkw_ts_eq(b.st_mtim, a.st_mtim) || !hkw_ts_eq(b.st_ctim, a.st_ctim)))
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
int hkw_read_stable(const char *path, const char *dir, int links, int outside, size_t max,
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

/*
 * Whole files: read at once, replaced atomically, directories made with
 * their parents; directories checked before they are trusted, and files
 * opened under them without following links; file locks waited for with a
 * bound (util/util.h).
 *
 * A replacement must never be seen half-written, even across a crash: the
 * bytes go to a temporary file in the same directory, which is synced,
 * renamed over the final name (rename() is atomic) and followed by a sync
 * of the directory, so that the rename itself survives. Reads open nothing
 * but regular files.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/util.h"

int hku_mkdir_p(const char *dir, hk_report *rep) {
    char buf[PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof buf)
        return hku_fail(rep, HK_ERR_INVALID, "bad directory path (%zu bytes)", n);
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST)
            return hku_fail(rep, HK_ERR_IO, "mkdir %s: %s", buf, strerror(errno));
        buf[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return hku_fail(rep, HK_ERR_IO, "%s is not a directory", dir);
    return 0;
}

/* Writes all n bytes: 0, or HK_ERR_IO with errno set. */
static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return HK_ERR_IO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Writes iov to a temporary file under dfd (NAME.tmp.PID.N, created with
 * mode and O_EXCL, so nothing already there is followed or reused), syncs it
 * when durable, renames it over name (rename() is atomic) and then syncs
 * the directory, so that the rename itself survives a crash. Best effort
 * for the directory: a file system that cannot sync one still has the
 * file. */
static int write_replaceat(int dfd, const char *dir, const char *name, const struct iovec *iov,
                           int n, int mode, int durable, hk_report *rep) {
    static unsigned counter;
    char tmp[NAME_MAX + 1];
    unsigned k = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
    if (strchr(name, '/') ||
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", name, (long)getpid(), k) >= (int)sizeof tmp)
        return hku_fail(rep, HK_ERR_INVALID, "bad file name: %s/%s", dir, name);
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
        return hku_fail(rep, HK_ERR_IO, "create %s/%s: %s", dir, tmp, strerror(errno));
    for (int i = 0; i < n; i++)
        if (write_all(fd, iov[i].iov_base, iov[i].iov_len) != 0)
            goto fail;
    /* The data must be on disk before the rename makes it visible, or a crash
     * could leave the new name pointing at an empty file. */
    if (durable && fsync(fd) != 0)
        goto fail;
    int closed = close(fd);
    fd = -1;
    if (closed != 0 || renameat(dfd, tmp, dfd, name) != 0)
        goto fail;
    if (durable)
        (void)fsync(dfd);
    return 0;
fail:;
    int e = errno;
    if (fd >= 0)
        close(fd);
    unlinkat(dfd, tmp, 0);
    return hku_fail(rep, HK_ERR_IO, "write %s/%s: %s", dir, name, strerror(e));
}

/* The path-based writes open the file's directory (following what the path
 * says, as open() would) and write under it. */
static int write_replace(const char *path, const struct iovec *iov, int n, int mode, int durable,
                         hk_report *rep) {
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return hku_fail(rep, HK_ERR_INVALID, "path too long: %s", path);
    char *slash = strrchr(dir, '/');
    const char *name = path;
    if (slash) {
        name = path + (slash - dir) + 1;
        if (slash == dir)
            slash[1] = '\0';
        else
            *slash = '\0';
    } else {
        snprintf(dir, sizeof dir, ".");
    }
    if (!name[0])
        return hku_fail(rep, HK_ERR_INVALID, "not a file path: %s", path);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return hku_fail(rep, HK_ERR_IO, "write %s: %s: %s", path, dir, strerror(errno));
    int err = write_replaceat(dfd, dir, name, iov, n, mode, durable, rep);
    close(dfd);
    return err;
}

int hku_write_atomicv(const char *path, const struct iovec *iov, int n, int mode, hk_report *rep) {
    return write_replace(path, iov, n, mode, 1, rep);
}

int hku_write_replace(const char *path, const struct iovec *iov, int n, int mode) {
    return write_replace(path, iov, n, mode, 0, NULL);
}

int hku_write_atomic(const char *path, const void *bytes, size_t size, int mode, hk_report *rep) {
    struct iovec iov = {.iov_base = (void *)bytes, .iov_len = size};
    return hku_write_atomicv(path, &iov, 1, mode, rep);
}

int hku_write_atomicat(int dfd, const char *dir, const char *name, const struct iovec *iov, int n,
                       int mode, int durable, hk_report *rep) {
    return write_replaceat(dfd, dir, name, iov, n, mode, durable, rep);
}

/* O_NONBLOCK keeps a FIFO (or a device) given by mistake from hanging the
 * open; a regular file never blocks on read, so the flag is harmless
 * afterwards. */
int hku_open_regular(const char *path, struct stat *st, hk_report *rep) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return hku_fail(rep, errno == ENOENT ? HK_ERR_NOT_FOUND : HK_ERR_IO, "open %s: %s", path,
                        strerror(errno));
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return hku_fail(rep, HK_ERR_IO, "stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return hku_fail(rep, HK_ERR_IO, "%s is not a regular file", path);
    }
    return fd;
}

int hku_read_fd(int fd, const char *path, size_t max, char **out, size_t *len, hk_report *rep) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory reading %s", path);
    for (;;) {
        if (n == cap) {
            if (cap > max) {
                free(buf);
                return hku_fail(rep, HK_ERR_TOO_LARGE, "%s is larger than %zu bytes", path, max);
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                return hku_fail(rep, HK_ERR_NOMEM, "out of memory reading %s", path);
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            return hku_fail(rep, HK_ERR_IO, "read %s: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n > max) {
        free(buf);
        return hku_fail(rep, HK_ERR_TOO_LARGE, "%s is larger than %zu bytes", path, max);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

int hku_read_file(const char *path, size_t max, char **out, size_t *len, hk_report *rep) {
    struct stat st;
    *out = NULL;
    *len = 0;
    int fd = hku_open_regular(path, &st, rep);
    if (fd < 0)
        return fd;
    int err = hku_read_fd(fd, path, max, out, len, rep);
    close(fd);
    return err;
}

/* ---- trusted directories ------------------------------------------------ */

/* What is wrong with st for a directory or file that must be the effective
 * user's alone; NULL when nothing is. */
static const char *untrusted(const struct stat *st, char *buf, size_t n) {
    uid_t me = geteuid();
    if (st->st_uid != me) {
        snprintf(buf, n, "owned by uid %ld, not by this process's user (uid %ld)", (long)st->st_uid,
                 (long)me);
        return buf;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(buf, n, "writable by %s (mode %04o): chmod go-w it",
                 (st->st_mode & S_IWGRP) && (st->st_mode & S_IWOTH) ? "group and others"
                 : st->st_mode & S_IWGRP                            ? "group"
                                                                    : "others",
                 (unsigned)(st->st_mode & 07777));
        return buf;
    }
    return NULL;
}

/* The same for a directory above the one used: root may own it, and a
 * sticky one (/tmp) may be writable by all, since others can then add
 * names in it but not rename or remove ours. */
static const char *untrusted_parent(const struct stat *st, char *buf, size_t n) {
    uid_t me = geteuid();
    if (!S_ISDIR(st->st_mode)) {
        snprintf(buf, n, "not a directory");
        return buf;
    }
    if (st->st_uid != me && st->st_uid != 0) {
        snprintf(buf, n, "owned by uid %ld, neither this process's user (uid %ld) nor root",
                 (long)st->st_uid, (long)me);
        return buf;
    }
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX)) {
        snprintf(buf, n,
                 "writable by %s and not sticky (mode %04o): another user could replace what "
                 "is below it",
                 st->st_mode & S_IWOTH ? "others" : "group", (unsigned)(st->st_mode & 07777));
        return buf;
    }
    return NULL;
}

int hku_fd_check(int fd, const char *path, const char *what, hk_report *rep) {
    struct stat st;
    char buf[160];
    if (fstat(fd, &st) != 0)
        return hku_fail(rep, HK_ERR_IO, "%s %s: stat: %s", what, path, strerror(errno));
    const char *bad = untrusted(&st, buf, sizeof buf);
    return bad ? hku_fail(rep, HK_ERR_IO, "%s %s: %s", what, path, bad) : 0;
}

/* Checks every directory above real (an absolute path without links, as
 * realpath gives), from / down. */
static int check_parents(const char *real, const char *what, hk_report *rep) {
    char p[PATH_MAX], buf[200];
    size_t n = strlen(real);
    if (n >= sizeof p)
        return hku_fail(rep, HK_ERR_INVALID, "%s %s: path too long", what, real);
    memcpy(p, real, n + 1);
    for (size_t i = 0; i < n; i++) {
        if (real[i] != '/')
            continue;
        p[i ? i : 1] = '\0'; /* the prefix up to this slash; "/" for the first */
        struct stat st;
        if (lstat(p, &st) != 0)
            return hku_fail(rep, HK_ERR_IO, "%s %s: %s: %s", what, real, p, strerror(errno));
        const char *bad = untrusted_parent(&st, buf, sizeof buf);
        if (bad)
            return hku_fail(rep, HK_ERR_IO, "%s %s: the directory %s above it is %s", what, real, p,
                            bad);
        memcpy(p, real, n + 1);
    }
    return 0;
}

/* Walks dir as the kernel resolves it, one component at a time, checking
 * each directory it passes through and each symbolic link it meets, before
 * the link is followed (OpenSSH's StrictModes walks the same way): a link
 * must belong to this user or to root, as the directories must, since
 * another user's link in a sticky directory (/tmp) could be pointed
 * elsewhere at any time, and the directory that holds a link must pass as
 * a parent. check_parents only sees the path the links led to. A missing
 * component ends the walk (what follows does not exist yet). */
static int check_walk(const char *dir, const char *what, hk_report *rep) {
    char todo[PATH_MAX], done[PATH_MAX], buf[200];
    int links = 0;
    if (dir[0] == '/')
        snprintf(done, sizeof done, "/");
    else if (!getcwd(done, sizeof done))
        return hku_fail(rep, HK_ERR_IO, "%s %s: getcwd: %s", what, dir, strerror(errno));
    if (snprintf(todo, sizeof todo, "%s", dir) >= (int)sizeof todo)
        return hku_fail(rep, HK_ERR_INVALID, "%s %s: path too long", what, dir);
    char *rest = todo;
    while (*rest) {
        while (*rest == '/')
            rest++;
        if (!*rest)
            break;
        char *end = strchr(rest, '/');
        size_t len = end ? (size_t)(end - rest) : strlen(rest);
        char comp[NAME_MAX + 1];
        if (len > NAME_MAX)
            return hku_fail(rep, HK_ERR_INVALID, "%s %s: a name is too long", what, dir);
        memcpy(comp, rest, len);
        comp[len] = '\0';
        rest += len;
        if (!strcmp(comp, "."))
            continue;
        if (!strcmp(comp, "..")) { /* done holds no link: lexical is right */
            char *slash = strrchr(done, '/');
            if (slash)
                slash[slash == done ? 1 : 0] = '\0';
            continue;
        }
        char cand[PATH_MAX];
        if (snprintf(cand, sizeof cand, "%s%s%s", done, strcmp(done, "/") ? "/" : "", comp) >=
            (int)sizeof cand)
            return hku_fail(rep, HK_ERR_INVALID, "%s %s: path too long", what, dir);
        struct stat st;
        if (lstat(cand, &st) != 0)
            return errno == ENOENT ? 0
                                   : hku_fail(rep, HK_ERR_IO, "%s %s: %s: %s", what, dir, cand,
                                              strerror(errno));
        if (S_ISLNK(st.st_mode)) {
            uid_t me = geteuid();
            if (st.st_uid != me && st.st_uid != 0)
                return hku_fail(rep, HK_ERR_IO,
                                "%s %s: the symbolic link %s on its path is owned by uid %ld, "
                                "neither this process's user (uid %ld) nor root: it could be "
                                "pointed elsewhere",
                                what, dir, cand, (long)st.st_uid, (long)me);
            char target[PATH_MAX];
            ssize_t n = readlink(cand, target, sizeof target - 1);
            if (n < 0)
                return hku_fail(rep, HK_ERR_IO, "%s %s: %s: %s", what, dir, cand, strerror(errno));
            target[n] = '\0';
            if (++links > 40)
                return hku_fail(rep, HK_ERR_IO, "%s %s: too many symbolic links", what, dir);
            char next[PATH_MAX];
            if (snprintf(next, sizeof next, "%s%s", target, rest) >= (int)sizeof next)
                return hku_fail(rep, HK_ERR_INVALID, "%s %s: path too long", what, dir);
            memcpy(todo, next, strlen(next) + 1);
            rest = todo;
            if (target[0] == '/')
                snprintf(done, sizeof done, "/");
            continue;
        }
        memcpy(done, cand, strlen(cand) + 1);
        const char *bad = *rest ? untrusted_parent(&st, buf, sizeof buf) : NULL;
        if (bad)
            return hku_fail(rep, HK_ERR_IO, "%s %s: the directory %s above it is %s", what, dir,
                            cand, bad);
    }
    return 0;
}

int hku_dir_open(const char *dir, const char *what, int create, char *real_out, hk_report *rep) {
    char buf[PATH_MAX], *real = real_out ? real_out : buf;
    if (!dir || !dir[0] || strlen(dir) >= sizeof buf)
        return hku_fail(rep, HK_ERR_INVALID, "%s: bad directory path", what);
    int err = check_walk(dir, what, rep);
    if (!err && create && (err = hku_mkdir_p(dir, rep)) == 0)
        err = check_walk(dir, what, rep); /* what mkdir made, links and all */
    if (err)
        return err;
    if (!realpath(dir, real))
        return hku_fail(rep, errno == ENOENT ? HK_ERR_NOT_FOUND : HK_ERR_IO, "%s %s: %s", what, dir,
                        strerror(errno));
    if ((err = check_parents(real, what, rep)) != 0)
        return err;
    /* The directory as checked: O_NOFOLLOW, and compared with what lstat
     * saw, so that nothing replaced between the check and the open counts. */
    struct stat seen, st;
    if (lstat(real, &seen) != 0)
        return hku_fail(rep, HK_ERR_IO, "%s %s: %s", what, real, strerror(errno));
    int fd = open(real, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return hku_fail(rep, HK_ERR_IO, "%s %s: %s", what, real, strerror(errno));
    if (fstat(fd, &st) != 0 || st.st_dev != seen.st_dev || st.st_ino != seen.st_ino) {
        close(fd);
        return hku_fail(rep, HK_ERR_IO, "%s %s: changed while it was opened", what, real);
    }
    if ((err = hku_fd_check(fd, real, what, rep)) < 0) {
        close(fd);
        return err;
    }
    return fd;
}

int hku_subdir_open(int dfd, const char *dir, const char *name, const char *what, int create,
                    hk_report *rep) {
    if (create && mkdirat(dfd, name, 0700) != 0 && errno != EEXIST)
        return hku_fail(rep, HK_ERR_IO, "%s %s/%s: mkdir: %s", what, dir, name, strerror(errno));
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return hku_fail(rep, e == ENOENT ? HK_ERR_NOT_FOUND : HK_ERR_IO, "%s %s/%s: %s", what, dir,
                        name,
                        e == ELOOP || e == ENOTDIR ? "not a directory (a link or a file): refused"
                                                   : strerror(e));
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int err = hku_fd_check(fd, path, what, rep);
    if (err < 0) {
        close(fd);
        return err;
    }
    return fd;
}

int hku_openat(int dfd, const char *dir, const char *name, int flags, int mode, hk_report *rep) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (strchr(name, '/'))
        return hku_fail(rep, HK_ERR_INVALID, "bad file name: %s", path);
    int fd = openat(dfd, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, mode);
    if (fd < 0) {
        int e = errno;
        return hku_fail(rep, e == ENOENT ? HK_ERR_NOT_FOUND : HK_ERR_IO, "open %s: %s", path,
                        e == ELOOP ? "a symbolic link: refused" : strerror(e));
    }
    struct stat st;
    char buf[160];
    const char *bad = NULL;
    if (fstat(fd, &st) != 0)
        bad = strerror(errno);
    else if (!S_ISREG(st.st_mode))
        bad = "not a regular file";
    else
        bad = untrusted(&st, buf, sizeof buf);
    if (bad) {
        close(fd);
        return hku_fail(rep, HK_ERR_IO, "%s: %s", path, bad);
    }
    return fd;
}

int hku_read_fileat(int dfd, const char *dir, const char *name, size_t max, char **out, size_t *len,
                    hk_report *rep) {
    char path[PATH_MAX];
    *out = NULL;
    *len = 0;
    /* O_NONBLOCK as in hku_open_regular; only a regular file gets past. */
    int fd = hku_openat(dfd, dir, name, O_RDONLY | O_NONBLOCK, 0, rep);
    if (fd < 0)
        return fd;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int err = hku_read_fd(fd, path, max, out, len, rep);
    close(fd);
    return err;
}

int hku_flock_wait(int fd, int how, int max_ms) {
    double end = hku_now_ms() + (max_ms > 0 ? max_ms : 0);
    long pause_us = 1000;
    for (;;) {
        if (flock(fd, how | LOCK_NB) == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EWOULDBLOCK)
            return HK_ERR_IO;
        double left = end - hku_now_ms();
        if (left <= 0)
            return HK_ERR_BUSY;
        long us = pause_us < (long)(left * 1000) ? pause_us : (long)(left * 1000) + 1;
        struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
        nanosleep(&ts, NULL);
        if (pause_us < 32000)
            pause_us *= 2;
    }
}

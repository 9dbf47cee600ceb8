/*
 * Whole files: read at once, replaced atomically, directories made with
 * their parents (util/util.h).
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
#include <sys/stat.h>
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

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Syncs the directory that holds path, so that a rename in it survives a
 * crash. Best effort: a file system that cannot sync a directory still has
 * the file. */
static void sync_parent(const char *path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(dir, sizeof dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

static int write_replace(const char *path, const struct iovec *iov, int n, int mode, int durable,
                         hk_report *rep) {
    static unsigned counter;
    char tmp[PATH_MAX];
    unsigned k = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), k) >= (int)sizeof tmp)
        return hku_fail(rep, HK_ERR_INVALID, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return hku_fail(rep, HK_ERR_IO, "create %s: %s", tmp, strerror(errno));
    for (int i = 0; i < n; i++)
        if (write_all(fd, iov[i].iov_base, iov[i].iov_len) != 0)
            goto fail;
    /* The data must be on disk before the rename makes it visible, or a crash
     * could leave the new name pointing at an empty file. */
    if (durable && fsync(fd) != 0)
        goto fail;
    int closed = close(fd);
    fd = -1;
    if (closed != 0 || rename(tmp, path) != 0)
        goto fail;
    if (durable)
        sync_parent(path);
    return 0;
fail:;
    int e = errno;
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    return hku_fail(rep, HK_ERR_IO, "write %s: %s", path, strerror(e));
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

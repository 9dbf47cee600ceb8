/*
 * util/: small helpers that both libraries use.
 *
 * The objects are compiled into libhotkern and into libhotkern-net alike
 * (Makefile), and each shared library keeps them hidden (-fvisibility=hidden,
 * the pkg/ version scripts export hk_* only): net/ needs none of libhotkern's private
 * symbols, and neither library exports these. A program linking both static
 * archives takes one copy. Prefix hku_. Nothing here keeps state, so every
 * function may be called from any thread; only libc and the public header's
 * types are used, so fuzz targets can compile a file of net/ with these.
 */
#ifndef HK_UTIL_H
#define HK_UTIL_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "hotkern/hotkern.h"

/* ---- reports (util/util.c) ---------------------------------------------- */

/* Sets rep's error and message (printf-style, truncated to fit) when rep is
 * not NULL, leaving its other fields alone, and returns err. An err of 0
 * records a note without an error. */
int hku_fail(hk_report *rep, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- copies (util/util.c) ----------------------------------------------- */

/* A copy of the n strings of v, a NULL entry copied as "". Returns NULL when
 * n <= 0 or v is NULL (nothing to copy), or when memory runs out: callers
 * with something to copy check. The copy is the caller's:
 * hku_strv_free(copy, n). */
char **hku_strv_dup(const char *const *v, int n);

/* Frees the n strings of v and v itself. v may be NULL; entries past a NULL
 * one (a copy that ran out of memory) are NULL too. */
void hku_strv_free(char **v, int n);

/* Copies n in-memory headers into one allocation (the array, then each name
 * and text, NUL-terminated) that the caller releases with free(). n may be 0
 * (*out NULL). Returns 0, HK_ERR_INVALID (a NULL or empty name, NULL data
 * with a size, n < 0), HK_ERR_TOO_LARGE (sizes that overflow) or
 * HK_ERR_NOMEM. */
int hku_headers_dup(const hk_header *h, int n, hk_header **out);

/* ---- files (util/file.c) ------------------------------------------------- */

/* Reads the regular file path whole into *out (NUL-terminated, *len bytes
 * before the NUL; the caller frees it). Anything but a regular file is
 * refused before it is read, so a FIFO or a device given by mistake never
 * blocks. Returns 0, HK_ERR_NOT_FOUND, HK_ERR_IO, HK_ERR_TOO_LARGE (over max
 * bytes) or HK_ERR_NOMEM, with rep (may be NULL) saying why. */
int hku_read_file(const char *path, size_t max, char **out, size_t *len, hk_report *rep);

/* hku_read_file in two steps, for a caller that looks at the file (*st)
 * before reading it: hku_open_regular returns a descriptor (the caller
 * closes it) or the error; hku_read_fd reads what is left of fd, with path
 * for the messages. */
int hku_open_regular(const char *path, struct stat *st, hk_report *rep);
int hku_read_fd(int fd, const char *path, size_t max, char **out, size_t *len, hk_report *rep);

/* Replaces path with the n buffers of iov, atomically: they are written to a
 * temporary file next to it (PATH.tmp.PID.N, created with mode), synced,
 * renamed over path, and the directory synced. A reader sees the old file or
 * the new one, never part of one; a crash can leave the temporary file,
 * which the owner of the directory reaps. Returns 0, HK_ERR_INVALID (path
 * too long) or HK_ERR_IO, with rep (may be NULL) saying why. */
int hku_write_atomicv(const char *path, const struct iovec *iov, int n, int mode, hk_report *rep);

/* hku_write_atomicv of one buffer. */
int hku_write_atomic(const char *path, const void *bytes, size_t size, int mode, hk_report *rep);

/* Creates directory dir and its missing parents (mode 0700), like mkdir -p,
 * and checks that dir is a directory. Returns 0, HK_ERR_INVALID (empty or
 * too long) or HK_ERR_IO, with rep (may be NULL) saying why. */
int hku_mkdir_p(const char *dir, hk_report *rep);

#endif /* HK_UTIL_H */

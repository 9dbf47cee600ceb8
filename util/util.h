/*
 * util/: small helpers that both libraries use.
 *
 * The objects are compiled into libhotkern and into libhotkern-net alike
 * (Makefile), and each shared library keeps them hidden (-fvisibility=hidden,
 * the pkg/ version scripts export hk_* only): net/ needs none of libhotkern's private
 * symbols, and neither library exports these. A program linking both static
 * archives takes one copy. Prefix hku_. Nothing here keeps global state:
 * every function may be called from any thread (an hku_child belongs to its
 * owner's lock); only libc and the public header's types are used, so fuzz
 * targets can compile a file of net/ with these. The helper-process parts
 * (wire.c, proc.c) serve libhotkern's helpers (hotkern-canary,
 * hotkern-build) and go unused in libhotkern-net.
 */
#ifndef HK_UTIL_H
#define HK_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "hotkern/hotkern.h"

/* ---- reports (util/util.c) ---------------------------------------------- */

/* Sets rep's error and message (printf-style, truncated to fit) when rep is
 * not NULL, leaving its other fields alone, and returns err. An err of 0
 * records a note without an error. */
int hku_fail(hk_report *rep, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- module names (util/util.c) ------------------------------------------ */

/* The code point starting at s (NUL-terminated), in *cp, and its length in
 * bytes; 0 when the bytes are not UTF-8 in its shortest form (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF). */
size_t hku_utf8_next(const unsigned char *s, uint32_t *cp);

/* Whether name may name a module: 1 to HKU_NAME_MAX - 1 bytes of UTF-8 in
 * its shortest form (no surrogates, nothing past U+10FFFF), holding no
 * control character (C0, DEL, C1) and no line or paragraph separator
 * (U+2028, U+2029). A module name goes unchanged onto one line of a
 * last-known-good record, into log lines, metrics labels and events, so the
 * engine (hk_swap, hk_submit) and the directory watcher refuse any other
 * before it becomes a version; the network endpoint's rule
 * ([A-Za-z0-9_.-], net/release.c) is a subset. Returns 0, or HK_ERR_INVALID
 * with why (may be NULL) saying what is wrong. */
#define HKU_NAME_MAX 64
int hku_name_check(const char *name, char *why, size_t why_size);

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

/* hku_write_atomicv without the syncs: a running system's readers still see
 * the old file or the new one, but after a crash or power loss the new name
 * may hold an empty or partial file. For files whose loss costs only time
 * and whose readers detect damage (compile cache entries carry their hash):
 * such a write costs about a millisecond less on a real disk. */
int hku_write_replace(const char *path, const struct iovec *iov, int n, int mode);

/* hku_write_atomicv of one buffer. */
int hku_write_atomic(const char *path, const void *bytes, size_t size, int mode, hk_report *rep);

/* The at-variants of the above, under a directory descriptor: name is one
 * component (no '/'), opened with O_NOFOLLOW, so that a symbolic link put in
 * its place is refused, never followed; dir names the directory in messages
 * only. hku_write_atomicat makes its temporary file there too, and syncs
 * (the file before the rename, the directory after it) when durable is
 * set. Both check what they open like hku_openat. Same returns as the
 * path-based ones. */
int hku_read_fileat(int dfd, const char *dir, const char *name, size_t max, char **out, size_t *len,
                    hk_report *rep);
int hku_write_atomicat(int dfd, const char *dir, const char *name, const struct iovec *iov, int n,
                       int mode, int durable, hk_report *rep);

/* Creates directory dir and its missing parents (mode 0700), like mkdir -p,
 * and checks that dir is a directory. Returns 0, HK_ERR_INVALID (empty or
 * too long) or HK_ERR_IO, with rep (may be NULL) saying why. */
int hku_mkdir_p(const char *dir, hk_report *rep);

/* ---- trusted directories (util/file.c) ------------------------------------ */

/*
 * The directories hotkern keeps state in decide what code runs and what is
 * refused: a record and an image planted in the last-known-good store are
 * run by --restore, a renamed anti-rollback file reopens every old release,
 * a replaced cache entry is served to the next swap. So, like OpenSSH's
 * StrictModes, such a directory is used only when no other local user can
 * change it:
 * - the directory, and every file read or written in it, belongs to the
 *   process's effective user and is writable by nobody else (no group or
 *   other write bit);
 * - every directory above it, up to /, belongs to that user or to root and
 *   is writable by nobody else, unless it is sticky (/tmp), where others
 *   may add names but not rename or remove ours;
 * - below it, nothing is reached through a path: each file is opened with
 *   openat(O_NOFOLLOW) under the checked directory's descriptor, so a
 *   symbolic link put in a file's place is refused, never followed, and a
 *   directory renamed under a running program takes its files with it.
 * A refusal says which path and what is wrong with it ("state directory
 * /x: writable by group (mode 0775)"). `what` names the directory's use in
 * those messages.
 */

/* Opens directory dir (O_DIRECTORY; the caller closes it), first creating it
 * and its missing parents (mode 0700) when create is set, after checking it
 * and every directory above it as said above. real (NULL, or PATH_MAX
 * bytes) gets the path that was checked and opened. Returns the descriptor,
 * or HK_ERR_NOT_FOUND (missing, create unset), HK_ERR_INVALID (bad path) or
 * HK_ERR_IO (refused or failed), with rep (may be NULL) saying why. */
int hku_dir_open(const char *dir, const char *what, int create, char *real, hk_report *rep);

/* Opens subdirectory name of dfd (whose path dir is, for messages),
 * creating it (mode 0700) when create is set; checked like the directory
 * itself. Same returns as hku_dir_open. */
int hku_subdir_open(int dfd, const char *dir, const char *name, const char *what, int create,
                    hk_report *rep);

/* Opens file name under dfd with flags | O_NOFOLLOW | O_CLOEXEC |
 * O_NOCTTY (mode when O_CREAT creates it) and checks it: a regular file of
 * the effective user that nobody else can write. Returns the descriptor, or
 * HK_ERR_NOT_FOUND, or HK_ERR_IO (a link, not a regular file, another
 * owner, a loose mode, an error), with rep saying why. */
int hku_openat(int dfd, const char *dir, const char *name, int flags, int mode, hk_report *rep);

/* Checks an open file or directory (path for messages): owned by the
 * effective user, writable by nobody else. 0, or HK_ERR_IO with rep. */
int hku_fd_check(int fd, const char *path, const char *what, hk_report *rep);

/* flock(fd, how) (LOCK_SH or LOCK_EX) waiting at most max_ms: tries at
 * once, then again with a growing pause (1 ms doubling to 32 ms), so a
 * holder that stopped (a process under SIGSTOP, a debugger) costs a bounded
 * wait, never a hang. 0; HK_ERR_BUSY when still held after max_ms;
 * HK_ERR_IO (errno set) on another failure. */
int hku_flock_wait(int fd, int how, int max_ms);

/* ---- messages with helper processes (util/wire.c) ------------------------ */

/* Every message: this header, then `length` bytes of payload. */
typedef struct hku_msg_hdr {
    uint32_t magic; /* one per protocol */
    uint32_t type;
    uint32_t length; /* bytes of payload after the header */
} hku_msg_hdr;

/* A growable message being written; a failed allocation sets oom, and
 * hku_send then refuses it. Integers are written little-endian. Zeroed
 * (not hku_buf_init), it is a plain buffer without a message header: the
 * compile cache's payloads (ptx/entry.c) are written so. */
typedef struct hku_buf {
    unsigned char *data;
    size_t len, cap;
    int oom;
} hku_buf;

void hku_buf_init(hku_buf *b, uint32_t magic, uint32_t type);
void hku_put(hku_buf *b, const void *p, size_t n);
void hku_put_u32(hku_buf *b, uint32_t v);
void hku_put_u64(hku_buf *b, uint64_t v);
/* u32 length + bytes, the string cut to at most max bytes. */
void hku_put_str(hku_buf *b, const char *s, size_t max);
/* u64 length + bytes, the whole string (NULL: empty). */
void hku_put_str64(hku_buf *b, const char *s);
/* Hands what b holds to the caller: 0 with *out (malloc'd, the caller
 * frees it) and *n, or HK_ERR_NOMEM when an allocation failed on the way.
 * b is empty (freed or handed over) afterwards. */
int hku_buf_take(hku_buf *b, void **out, size_t *n);
void hku_buf_free(hku_buf *b);

/* Sends b (its header's length filled in here). 0, HK_ERR_NOMEM when b could
 * not be made whole, or HK_ERR_IO (a dead peer, errno set; never a SIGPIPE). */
int hku_send(int fd, hku_buf *b);
/* hku_send that gives up at deadline_ms (hku_now_ms time; 0: none):
 * HK_ERR_TIMEOUT (errno ETIMEDOUT) when the peer has not taken the whole
 * message by then. The parents' sends use it, so a helper that stops reading
 * never holds them. */
int hku_send_by(int fd, hku_buf *b, double deadline_ms);

/* Receives one message with the given magic and at most max payload bytes
 * before deadline_ms (hku_now_ms() time; <= 0: no deadline). Returns 0 with
 * *type, *data (malloc'd, the caller frees) and *len; or a negative
 * HKU_RECV_* code. The size is checked before anything is allocated. */
enum {
    HKU_RECV_EOF = -1,       /* the peer closed (died) */
    HKU_RECV_TIMEOUT = -2,   /* nothing complete before the deadline */
    HKU_RECV_MALFORMED = -3, /* bad magic, or over max */
    HKU_RECV_ERROR = -4,     /* read error, or no memory */
};
int hku_recv(int fd, uint32_t magic, size_t max, double deadline_ms, uint32_t *type,
             unsigned char **data, size_t *len);
double hku_now_ms(void); /* CLOCK_MONOTONIC in ms */
/* A condition variable whose timed waits run on CLOCK_MONOTONIC, so that a
 * step of the wall clock neither stretches nor cuts them short; and the
 * deadline `us` microseconds from now for pthread_cond_timedwait on one. */
int hku_cond_init(pthread_cond_t *c);
void hku_deadline(struct timespec *ts, long us);

/* A bounds-checked reader over a received payload (or any bytes: the
 * compile cache's payloads): every get fails (and sets bad) past the end,
 * and hku_end checks nothing is left over. Integers are little-endian. */
typedef struct hku_rd {
    const unsigned char *p;
    size_t left;
    int bad; /* 0, or why: HKU_RD_MALFORMED, HKU_RD_NOMEM */
} hku_rd;

enum {
    HKU_RD_MALFORMED = 1, /* past the end, or not what was expected */
    HKU_RD_NOMEM = 2,     /* a get that allocates ran out of memory */
};

/* Marks r bad for why, unless it is bad already: the first failure is the
 * one kept (later gets fail because of it). */
void hku_rd_fail(hku_rd *r, int why);

uint32_t hku_get_u32(hku_rd *r);
uint64_t hku_get_u64(hku_rd *r);
const void *hku_get(hku_rd *r, size_t n);
/* A string of at most max bytes, copied into out (out_size > max), NUL
 * ended; non-printable bytes become '?'. */
void hku_get_str(hku_rd *r, char *out, size_t out_size, size_t max);
/* A string of at most max bytes as a malloc'd C string (the caller frees),
 * or NULL with bad set. A NUL inside is malformed; with printable, other
 * non-printable bytes become '?' (text for people), else they are kept
 * (paths, options). */
char *hku_get_strdup(hku_rd *r, size_t max, int printable);
/* What hku_put_str64 wrote, at most max bytes and no NUL inside (it becomes
 * a C string), malloc'd (the caller frees); NULL with bad set (to
 * HKU_RD_NOMEM when memory ran out). */
char *hku_get_str64(hku_rd *r, uint64_t max);
int hku_end(const hku_rd *r); /* 0 when fully and validly read, else HK_ERR_FORMAT */

/* ---- helper processes (util/proc.c) ------------------------------------- */

/* One helper process and the killed ones not reaped yet. Not locked: its
 * owner's lock covers it, except for cancellation (hku_child_cancel), which
 * any thread may call while the owner waits on the helper. */
typedef struct hku_child {
    pid_t pid;    /* 0: none */
    int fd;       /* the parent's end of the socket; -1: none */
    pid_t *dying; /* killed, not reaped yet (ndying of cap) */
    int ndying, cap;
    int kill_sig, kill_wait_ms; /* SIGKILL and 2000 ms; tests change them */
    int err_fd;                 /* read end of the child's stderr pipe; -1: none */
    char last_err[200];         /* the end of what it wrote there, read when it ended */
    size_t err_kept;            /* bytes of last_err so far, while it runs */
    /* The owner's observer of the child's stderr, line by line (NULL:
     * none): each complete line, without its newline, control bytes as
     * spaces, cut at 255 bytes, as it is read (hku_child_drain_err, and
     * when the child ends). Called on the owner's thread. */
    void (*err_line)(void *ctx, const char *line);
    void *err_ctx;
    char err_part[256]; /* the line being read */
    size_t err_plen;
    int last_status;             /* wait status of the child that ended last; -1: unknown */
    pthread_mutex_t cancel_lock; /* a leaf: covers the two fields below */
    int cancel_fd;               /* cancel_lock: a second descriptor of the socket; -1: none */
    int cancelled;               /* cancel_lock: no helper starts any more */
} hku_child;

void hku_child_init(hku_child *c);
/* Starts argv[0] (a path; `what` names it in messages) with argv, its end of a socketpair as fd 3,
 * an empty signal mask and SIGPIPE and SIGTERM at their defaults, stdin and stdout on /dev/null
 * and stderr on a pipe it cannot block on (see util/proc.c). 0, or HK_ERR_IO / HK_ERR_NOMEM
 * with why. The child must close its inherited descriptors but 0 to 3 itself. */
int hku_child_start(hku_child *c, const char *what, char *const argv[], char *why, size_t n);
/* Closes the socket, kills the child and its process group (kill_sig)
 * unless it ended already and reaps it, waiting at most kill_wait_ms; one
 * that takes longer goes to `dying`. Says how it ended in how (may be
 * NULL), with the end of its stderr where how has room (also kept in
 * last_err; its wait status in last_status). */
void hku_child_kill(hku_child *c, char *how, size_t n);
/* hku_child_kill for a child that is expected to end by itself once its
 * socket closes: it gets grace_ms to do so (its stderr read meanwhile),
 * and is killed only after that. */
void hku_child_end(hku_child *c, int grace_ms, char *how, size_t n);
/* Reads what the running child has written to its stderr so far: the
 * observer (err_line) sees each complete line. With quiet_ms > 0 it goes on
 * reading until nothing came for quiet_ms, or max_ms passed (a writer that
 * reports a little after the fact, as a wrapper's front end does); 0: no
 * wait. */
void hku_child_drain_err(hku_child *c, int quiet_ms, int max_ms);
/* 1 when no child runs (it ended, and was reaped now: socket closed, pid
 * cleared), 0 while it runs. */
int hku_child_gone(hku_child *c);
/* Reaps killed children that have gone, waiting up to wait_ms for them. */
void hku_child_reap(hku_child *c, int wait_ms);
/* Kills the child, gives the dying ones kill_wait_ms more, frees the list. */
void hku_child_finish(hku_child *c);
/* From any thread: shuts the socket down, so that the owner's wait for the
 * helper ends at once (end of file), and keeps any helper from starting
 * again (hku_child_start: HK_ERR_CLOSED). The owner still kills and reaps. */
void hku_child_cancel(hku_child *c);
/* The helper's side, first thing in its main: reads `--fd N` and the one
 * integer option named opt (into *val, untouched when absent) from argv;
 * closes every inherited descriptor but N (unless `--keep-fds 1`: a helper
 * started through a wrapper such as compute-sanitizer keeps the wrapper's
 * channels); ignores SIGPIPE; and starts a thread that ends the helper
 * (status 3) once its parent is gone, or the process `--owner PID` (the
 * one it serves, when a wrapper is its parent). Returns N, or HK_ERR_INVALID
 * (with a message naming `name` on stderr) when --fd is missing. */
int hku_helper_init(int argc, char **argv, const char *name, const char *opt, int *val);

#endif /* HK_UTIL_H */

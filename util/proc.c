/*
 * Helper processes (hotkern-canary, hotkern-build): start one with
 * posix_spawn on one end of a socketpair, kill it, and reap it without ever
 * leaving a zombie or touching the application's other children.
 *
 * Start: the child gets its end of the socket as fd 3, an empty signal mask
 * and SIGPIPE and SIGTERM at their defaults (whatever the application
 * ignores or blocks) and a process group of its own (the terminal's SIGINT
 * is the application's to handle). First thing, it closes every other
 * descriptor (hku_helper_init: an inherited pipe or listening socket held
 * open by a helper would keep its reader from EOF or its port bound). The
 * parent's end is close-on-exec.
 *
 * Threads: an hku_child is owned by whoever holds its owner's lock (the
 * canary's run_lock, the build helper's lock); nothing here locks, except
 * cancellation. hku_child_cancel comes from another thread (a destroy) while
 * the owner may be waiting on the helper with its lock held: it shuts down a
 * second descriptor of the parent's end of the socket, which ends the
 * owner's poll at once, under cancel_lock, which the owner takes only to
 * open or close that descriptor. A descriptor, not the pid: a pid may be
 * reaped and reused under the canceller's feet, a descriptor it holds under
 * the lock cannot.
 *
 * Its output, the wrappers a helper may be started through, and how a
 * killed child is reaped: beside the code that does each.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/util.h"

extern char **environ;

#define KILL_WAIT_MS 2000

void hku_child_init(hku_child *c) {
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->err_fd = -1;
    c->kill_sig = SIGKILL;
    c->kill_wait_ms = KILL_WAIT_MS;
    c->last_status = -1;
    c->cancel_fd = -1;
    pthread_mutex_init(&c->cancel_lock, NULL);
}

void hku_child_cancel(hku_child *c) {
    pthread_mutex_lock(&c->cancel_lock);
    c->cancelled = 1;
    if (c->cancel_fd >= 0)
        shutdown(c->cancel_fd, SHUT_RDWR);
    pthread_mutex_unlock(&c->cancel_lock);
}

/* The socket is gone: so is its cancellation descriptor. */
static void cancel_fd_close(hku_child *c) {
    pthread_mutex_lock(&c->cancel_lock);
    if (c->cancel_fd >= 0)
        close(c->cancel_fd);
    c->cancel_fd = -1;
    pthread_mutex_unlock(&c->cancel_lock);
}

/*
 * Kill and reap: a killed child the kernel has not let go of within
 * kill_wait_ms (one inside a driver call can take a while to end) is kept in
 * `dying` and reaped, by pid only, before each start and at the end. The
 * list grows as needed, and room for one more entry is made before a child
 * is started (a start that cannot get it fails), so a killed child always
 * has a slot and its pid is never dropped: a dropped pid would be a zombie
 * for the life of the program. Never waitpid(-1): the application owns its
 * other children.
 */
void hku_child_reap(hku_child *c, int wait_ms) {
    double until = hku_now_ms() + wait_ms;
    for (;;) {
        int k = 0;
        for (int i = 0; i < c->ndying; i++)
            if (waitpid(c->dying[i], NULL, WNOHANG) == 0)
                c->dying[k++] = c->dying[i];
        c->ndying = k;
        if (!k || hku_now_ms() >= until)
            return;
        usleep(10000);
    }
}

/* Makes room for one more dying child, before one is started, so that
 * hku_child_kill never has to drop one. */
static int dying_reserve(hku_child *c) {
    if (c->ndying < c->cap)
        return 0;
    int cap = c->cap ? 2 * c->cap : 8;
    pid_t *d = realloc(c->dying, (size_t)cap * sizeof *d);
    if (!d)
        return HK_ERR_NOMEM;
    c->dying = d;
    c->cap = cap;
    return 0;
}

/*
 * Output: a helper's stdin and stdout are /dev/null and its stderr a pipe
 * of its own, never the application's. A kernel's printf in the canary
 * lands on the helper's stdout, and a flood of it must not fill the
 * application's log or block on its terminal. The stderr pipe is
 * non-blocking on the helper's side: what does not fit in it (the kernel's
 * pipe buffer, 64 KiB) is dropped rather than waited for, so the memory it
 * costs is bounded and the helper never stalls on it. Its end, the
 * helper's last words, is read when the helper ends or is killed and added
 * to how it ended. An owner that needs what the helper says there while it
 * runs (the canary reads compute-sanitizer's reports from it) sets a line
 * observer and drains the pipe when it wants (hku_child_drain_err).
 */
/* Hands one line of the child's stderr (control bytes as spaces) to the
 * owner's observer. */
static void err_line_out(hku_child *c) {
    c->err_part[c->err_plen] = '\0';
    for (size_t i = 0; i < c->err_plen; i++)
        if ((unsigned char)c->err_part[i] < 0x20 || c->err_part[i] == 0x7f)
            c->err_part[i] = ' ';
    c->err_line(c->err_ctx, c->err_part);
    c->err_plen = 0;
}

/* Takes n bytes the child wrote to stderr: the end of them goes to
 * last_err (raw until the child ended), and each line to the observer. */
static void err_take(hku_child *c, const char *buf, size_t n) {
    size_t cap = sizeof c->last_err - 1, kept = c->err_kept;
    if (n >= cap) {
        memcpy(c->last_err, buf + n - cap, cap);
        kept = cap;
    } else {
        size_t drop = kept + n > cap ? kept + n - cap : 0;
        memmove(c->last_err, c->last_err + drop, kept - drop);
        memcpy(c->last_err + kept - drop, buf, n);
        kept = kept - drop + n;
    }
    c->last_err[kept] = '\0';
    c->err_kept = kept;
    for (size_t i = 0; c->err_line && i < n; i++) {
        if (buf[i] == '\n')
            err_line_out(c);
        else if (c->err_plen < sizeof c->err_part - 1)
            c->err_part[c->err_plen++] = buf[i]; /* the rest of a long line is dropped */
    }
}

/* Reads what the child has written to its stderr pipe so far, without
 * blocking (the pipe is ours non-blocking). Bounded: the pipe holds at most
 * its buffer, and a writer that keeps writing is cut off at 1 MiB a call. */
static void err_drain(hku_child *c) {
    char buf[4096];
    ssize_t r;
    if (c->err_fd < 0)
        return;
    for (size_t total = 0; total < (1u << 20) && (r = read(c->err_fd, buf, sizeof buf)) > 0;
         total += (size_t)r)
        err_take(c, buf, (size_t)r);
}

void hku_child_drain_err(hku_child *c, int quiet_ms, int max_ms) {
    err_drain(c);
    double until = hku_now_ms() + max_ms;
    struct pollfd p = {.fd = c->err_fd, .events = POLLIN};
    while (quiet_ms > 0 && c->err_fd >= 0 && hku_now_ms() < until) {
        double left = until - hku_now_ms();
        int r = poll(&p, 1, left < quiet_ms ? (int)left + 1 : quiet_ms);
        if (r <= 0 || !(p.revents & POLLIN))
            return; /* quiet long enough, or the writer is gone */
        err_drain(c);
    }
}

/* Reads what the ended (or killed) child left in its stderr pipe, keeps
 * the end of it in last_err with control bytes as spaces, hands a last
 * unfinished line to the observer, and closes the pipe. */
static void read_last_err(hku_child *c) {
    if (c->err_fd < 0)
        return;
    err_drain(c);
    if (c->err_line && c->err_plen)
        err_line_out(c);
    size_t kept = c->err_kept;
    while (kept > 0 && (c->last_err[kept - 1] == '\n' || c->last_err[kept - 1] == ' '))
        kept--;
    c->last_err[kept] = '\0';
    for (size_t i = 0; i < kept; i++)
        if ((unsigned char)c->last_err[i] < 0x20 || c->last_err[i] == 0x7f)
            c->last_err[i] = ' ';
    c->err_kept = 0;
    close(c->err_fd);
    c->err_fd = -1;
}

/* Closes the socket, waits up to grace_ms for the child to end by itself
 * (reading its stderr meanwhile, so that a child writing its last words
 * never waits on a full pipe), then kills it as hku_child_kill says. */
static void child_stop(hku_child *c, int grace_ms, char *how, size_t n) {
    if (how && n)
        how[0] = '\0';
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    cancel_fd_close(c);
    if (c->pid <= 0)
        return;
    int st = 0;
    pid_t r = waitpid(c->pid, &st, WNOHANG); /* did it end by itself? */
    for (int i = 0; r == 0 && i < grace_ms / 10; i++) {
        pthread_mutex_lock(&c->cancel_lock);
        int cancelled = c->cancelled; /* a destroy does not wait out the grace */
        pthread_mutex_unlock(&c->cancel_lock);
        if (cancelled)
            break;
        err_drain(c);
        usleep(10000);
        r = waitpid(c->pid, &st, WNOHANG);
    }
    if (r == 0) {
        /* Still running. When waitpid fails instead, the child is gone and
         * was reaped by someone else (a program that ignores SIGCHLD, or
         * reaps with waitpid(-1)): its pid may already name another
         * process, which must not be killed. A live child always answers
         * 0, even under SA_NOCLDWAIT. Its process group (the child leads
         * one, hku_child_start) is signalled, so that a helper started
         * through a wrapper (compute-sanitizer) dies with the wrapper; the
         * group cannot be another's while its unreaped leader exists. */
        if (kill(-c->pid, c->kill_sig) < 0)
            kill(c->pid, c->kill_sig);
        for (int i = 0; i < c->kill_wait_ms / 10 && (r = waitpid(c->pid, &st, WNOHANG)) == 0; i++)
            usleep(10000);
    }
    c->last_status = r == c->pid ? st : -1;
    if (r == c->pid && how && n) {
        if (WIFSIGNALED(st))
            snprintf(how, n, "signal %d", WTERMSIG(st));
        else if (WIFEXITED(st))
            snprintf(how, n, "exit status %d", WEXITSTATUS(st));
    }
    if (r == 0) /* still there: reap it later */
        c->dying[c->ndying++] = c->pid;
    c->pid = 0;
    read_last_err(c);
    if (how && n && c->last_err[0]) {
        size_t l = strlen(how);
        snprintf(how + l, n - l, "%s%s", l ? "; stderr: " : "stderr: ", c->last_err);
    }
}

void hku_child_kill(hku_child *c, char *how, size_t n) {
    child_stop(c, 0, how, n);
}

void hku_child_end(hku_child *c, int grace_ms, char *how, size_t n) {
    child_stop(c, grace_ms > 0 ? grace_ms : 0, how, n);
}

int hku_child_gone(hku_child *c) {
    if (c->pid <= 0)
        return 1;
    int st = 0;
    pid_t r = waitpid(c->pid, &st, WNOHANG);
    if (r == 0)
        return 0;
    /* Reaped now, or by someone else (then the pid must not be used). */
    c->last_status = r == c->pid ? st : -1;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    cancel_fd_close(c);
    c->pid = 0;
    read_last_err(c);
    return 1;
}

/*
 * Wrappers: a helper may be started through another program (the canary's
 * memcheck helper runs under compute-sanitizer). The spawn closes every
 * descriptor past 3 itself, so the wrapper gets nothing of the
 * application's either; a kill signals the child's whole process group,
 * so the helper dies with its wrapper; and the helper is told whom it
 * serves (--owner), since its parent is then the wrapper.
 */
int hku_child_start(hku_child *c, const char *what, char *const argv[], char *why, size_t n) {
    hku_child_reap(c, 0);
    pthread_mutex_lock(&c->cancel_lock);
    int cancelled = c->cancelled;
    pthread_mutex_unlock(&c->cancel_lock);
    if (cancelled) {
        snprintf(why, n, "%s is not started again: hotkern is shutting down", what);
        return HK_ERR_CLOSED;
    }
    if (dying_reserve(c) < 0) {
        snprintf(why, n, "cannot start %s: out of memory", what);
        return HK_ERR_NOMEM;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        snprintf(why, n, "socketpair: %s", strerror(errno));
        return HK_ERR_IO;
    }
    if (sv[1] == 3) { /* dup2(3, 3) would keep close-on-exec */
        int fd = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
        close(sv[1]);
        sv[1] = fd;
    }
    /* Its stderr: ours non-blocking to read when it ends, its end
     * non-blocking so that a full pipe drops instead of stalling it. */
    int ep[2] = {-1, -1};
    if (pipe2(ep, O_CLOEXEC | O_NONBLOCK) < 0) {
        snprintf(why, n, "pipe: %s", strerror(errno));
        close(sv[0]);
        if (sv[1] >= 0)
            close(sv[1]);
        return HK_ERR_IO;
    }
    if (ep[1] <= 3) { /* the actions below write 0 to 3 before they read it */
        int fd = fcntl(ep[1], F_DUPFD_CLOEXEC, 10);
        close(ep[1]);
        ep[1] = fd;
    }
    if (c->err_fd >= 0)
        close(c->err_fd);
    c->err_fd = -1;
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sv[1], 3);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, ep[1], 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    /* Nothing of the application's past 0 to 3 reaches the child: the helper
     * closes the rest itself too, but one started through a wrapper
     * (compute-sanitizer) keeps what the wrapper gives it. */
    posix_spawn_file_actions_addclosefrom_np(&fa, 4);
#endif
    posix_spawnattr_init(&at);
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGPIPE);
    sigaddset(&dfl, SIGTERM);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &dfl);
    /* A process group of its own: a Ctrl-C at the application's terminal
     * (SIGINT to the foreground group) that the application handles must not
     * kill its helpers; the orphan watch ends them when the parent goes. */
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                      POSIX_SPAWN_SETPGROUP);
    pid_t pid = 0;
    int rc = sv[1] < 0 || ep[1] < 0 ? errno : posix_spawn(&pid, argv[0], &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (sv[1] >= 0)
        close(sv[1]);
    if (ep[1] >= 0)
        close(ep[1]);
    if (rc) {
        close(sv[0]);
        close(ep[0]);
        snprintf(why, n, "cannot start %s %s: %s", what, argv[0], strerror(rc));
        return HK_ERR_IO;
    }
    c->pid = pid;
    c->fd = sv[0];
    c->err_fd = ep[0];
    c->last_err[0] = '\0';
    c->err_kept = c->err_plen = 0;
    c->last_status = -1;
    /* Cancelled meanwhile: the new helper's socket is shut down at once. */
    pthread_mutex_lock(&c->cancel_lock);
    c->cancel_fd = fcntl(sv[0], F_DUPFD_CLOEXEC, 3);
    if (c->cancelled && c->cancel_fd >= 0)
        shutdown(c->cancel_fd, SHUT_RDWR);
    pthread_mutex_unlock(&c->cancel_lock);
    return 0;
}

void hku_child_finish(hku_child *c) {
    hku_child_kill(c, NULL, 0);
    if (c->err_fd >= 0)
        close(c->err_fd);
    c->err_fd = -1;
    /* What is still dying was killed: give it the same bound once more. One
     * the kernel holds longer than that cannot be reaped without blocking
     * for good, and stays a zombie. */
    hku_child_reap(c, c->kill_wait_ms);
    free(c->dying);
    c->dying = NULL;
    c->ndying = c->cap = 0;
    pthread_mutex_destroy(&c->cancel_lock);
}

/* ---- the helper's side -------------------------------------------------- */

/* The parent, and the process the helper serves when a wrapper
 * (compute-sanitizer) stands between them: the helper ends when either is
 * gone. */
typedef struct watch_arg {
    pid_t parent, owner; /* owner 0: the parent is the owner */
} watch_arg;

static void *orphan_watch(void *arg) {
    watch_arg w = *(watch_arg *)arg;
    free(arg);
    for (;;) {
        usleep(200000);
        if (getppid() != w.parent || (w.owner > 0 && kill(w.owner, 0) < 0 && errno == ESRCH))
            _exit(3);
    }
    return NULL;
}

/* Closes every descriptor above lo and below hi (-1: no bound), with
 * close_range where the kernel has it (5.9) and one by one where not. */
static void close_above(int lo, int hi) {
    if (close_range((unsigned)lo + 1, hi < 0 ? ~0u : (unsigned)hi - 1, 0) == 0)
        return;
    long max = sysconf(_SC_OPEN_MAX);
    for (long i = lo + 1; i < (hi < 0 ? (max > 0 ? max : 1024) : hi); i++)
        close((int)i);
}

int hku_helper_init(int argc, char **argv, const char *name, const char *opt, int *val) {
    int fd = -1, keep = 0;
    long owner = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--fd"))
            fd = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--keep-fds"))
            keep = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--owner"))
            owner = atol(argv[i + 1]);
        else if (opt && val && !strcmp(argv[i], opt))
            *val = atoi(argv[i + 1]);
    }
    if (fd < 0) {
        fprintf(stderr, "%s: started by libhotkern, not by hand (--fd missing)\n", name);
        return HK_ERR_INVALID;
    }
    /* Nothing of the application's but our socket: an inherited pipe or
     * listening socket held open by a helper that outlives the application's
     * own use of it would keep its reader from EOF or its port bound. A
     * helper under a wrapper keeps what the wrapper gave it (its own
     * channels; the application's were closed at the spawn). */
    if (!keep) {
        if (fd > 3)
            close_above(2, fd);
        close_above(fd, -1);
    }
    signal(SIGPIPE, SIG_IGN);
    pthread_t watch;
    watch_arg *w = malloc(sizeof *w);
    if (w) {
        *w = (watch_arg){getppid(), (pid_t)owner};
        if (pthread_create(&watch, NULL, orphan_watch, w) == 0)
            pthread_detach(watch);
        else
            free(w);
    }
    return fd;
}

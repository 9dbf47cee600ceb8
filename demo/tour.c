/*
 * The unattended tour: four ways a new kernel version reaches the running
 * simulation, each with its outcome, on a thread of its own.
 *
 * The tour only does what a user would do from outside: it saves files the
 * way editors do (write a temporary file, rename it over the source) into a
 * copy of the kernel directory, so the repository's files are never touched,
 * and it runs the `hotkern` CLI as a separate process for the push and the
 * rollback. It learns outcomes from the event records and asks the
 * simulation thread for frames, so it never touches CUDA itself. Every wait
 * has a timeout, so a step that goes wrong is reported and the tour moves on.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include "demo/demo.h"

extern char **environ;

#define EV(k) (1u << (k))

/* ---- files -------------------------------------------------------------- */

static int copy_file(const char *src, const char *dst) {
    char buf[65536];
    int in, out, err = -1;
    ssize_t n;

    in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -1;
    out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0)
        goto close_in;
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n)
            goto close_out;
    if (n == 0)
        err = 0;
close_out:
    if (close(out))
        err = -1;
close_in:
    close(in);
    return err;
}

int demo_copy_files(const char *src, const char *dst) {
    DIR *dir = opendir(src);
    struct dirent *e;
    int err = 0;

    if (!dir)
        return -1;
    while (!err && (e = readdir(dir))) {
        char from[PATH_MAX], to[PATH_MAX];
        struct stat st;
        if (e->d_name[0] == '.')
            continue;
        if (snprintf(from, sizeof from, "%s/%s", src, e->d_name) >= (int)sizeof from ||
            snprintf(to, sizeof to, "%s/%s", dst, e->d_name) >= (int)sizeof to)
            continue;
        if (stat(from, &st) || !S_ISREG(st.st_mode))
            continue;
        err = copy_file(from, to);
    }
    closedir(dir);
    return err;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void demo_remove_tree(const char *path) {
    if (path && *path)
        nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Saves variant `name` over the watched particles.cu the way editors do: the
 * watcher must never see a half-written file, so the whole text is written
 * next to the watched directory first and then renamed into place. */
static int save_variant(demo *d, const char *name) {
    char from[PATH_MAX], tmp[PATH_MAX], to[PATH_MAX];

    snprintf(from, sizeof from, "%s/variants/%s", d->kernels, name);
    snprintf(tmp, sizeof tmp, "%s/particles.cu.saving", d->stage_dir);
    snprintf(to, sizeof to, "%s/particles.cu", d->watched);
    if (copy_file(from, tmp)) {
        demo_say(d, "   cannot copy %s: %s", from, strerror(errno));
        return -1;
    }
    if (rename(tmp, to)) {
        demo_say(d, "   cannot rename over %s: %s", to, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- the CLI ------------------------------------------------------------ */

int demo_run_cli(demo *d, const char *const *argv, int timeout_ms) {
    posix_spawn_file_actions_t fa;
    char *args[16];
    char line[1024];
    size_t used = 0;
    int fds[2], status = -1, n = 0, killed = 0;
    pid_t pid;
    double end = demo_mono_ms() + timeout_ms;

    args[n++] = d->cli;
    for (int i = 1; argv[i] && n < 15; i++)
        args[n++] = (char *)argv[i];
    args[n] = NULL;
    if (pipe2(fds, O_CLOEXEC))
        return -1;
    if (posix_spawn_file_actions_init(&fa))
        goto close_pipe;
    /* dup2 clears close-on-exec on the copies, so only these reach the CLI. */
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
    errno = posix_spawn(&pid, d->cli, &fa, NULL, args, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (errno) {
        demo_say(d, "   cannot run %s: %s", d->cli, strerror(errno));
        goto close_pipe;
    }
    close(fds[1]);
    fds[1] = -1;

    /* Relay the output line by line until the CLI closes it; a CLI that
     * outlives the timeout is ended so that the tour cannot hang. */
    for (;;) {
        struct pollfd p = {fds[0], POLLIN, 0};
        int left = (int)(end - demo_mono_ms());
        if (atomic_load(&d->stop)) {
            kill(pid, SIGTERM);
            killed = 1;
            break;
        }
        if (left <= 0) {
            demo_say(d, "   (no answer within %d s: ending the CLI)", timeout_ms / 1000);
            kill(pid, SIGTERM);
            killed = 1;
            break;
        }
        int r = poll(&p, 1, left < 200 ? left : 200);
        if (r < 0 && errno != EINTR)
            break;
        if (r <= 0)
            continue;
        ssize_t got = read(fds[0], line + used, sizeof line - 1 - used);
        if (got <= 0)
            break;
        used += (size_t)got;
        line[used] = 0;
        char *start = line, *nl;
        while ((nl = strchr(start, '\n'))) {
            *nl = 0;
            demo_say(d, "   | %s", start);
            start = nl + 1;
        }
        used = strlen(start);
        memmove(line, start, used + 1);
        if (used == sizeof line - 1) {
            demo_say(d, "   | %s", line);
            used = 0;
        }
    }
    if (used)
        demo_say(d, "   | %s", line);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    status = killed ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : -1;

close_pipe:
    close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    return status;
}

/* ---- the tour ------------------------------------------------------------ */

static const char *outcome(hk_event_kind kind) {
    switch (kind) {
    case HK_EVENT_COMMITTED:
        return "committed";
    case HK_EVENT_ROLLED_BACK:
        return "rolled back";
    default:
        return "refused";
    }
}

/* Reads one swap record; the array may grow (and move) under mu meanwhile. */
static demo_swap swap_at(demo *d, int idx) {
    demo_swap s;
    pthread_mutex_lock(&d->mu);
    s = d->swaps[idx];
    s.log = NULL;
    pthread_mutex_unlock(&d->mu);
    return s;
}

static demo_tour_step *begin(demo *d, const char *what, const char *title) {
    demo_tour_step *t = &d->steps[d->nsteps++];
    t->what = what;
    t->swap = t->before = t->after = -1;
    t->cli_status = -1;
    demo_say(d, "%s", "");
    demo_say(d, "== tour %d/%d: %s ==", d->nsteps, DEMO_TOUR_STEPS, title);
    return t;
}

static void step_swirl(demo *d) {
    demo_tour_step *t = begin(d, "swirl (watched file)",
                              "save a new version of the watched file (variants/swirl.cu)");
    t->before = demo_request_frame(d, "before the swirl save (particles.cu as shipped)", 1, 5000);
    int first = demo_swap_count(d);
    demo_say(d, "   renaming a copy of variants/swirl.cu over %s/particles.cu", d->watched);
    if (save_variant(d, "swirl.cu"))
        return;
    t->swap = demo_wait_swap(d, first, EV(HK_EVENT_COMMITTED) | EV(HK_EVENT_REFUSED), 30000);
    if (t->swap < 0) {
        demo_say(d, "   no outcome within 30 s");
        return;
    }
    demo_swap s = swap_at(d, t->swap);
    demo_say(d, "   %s at tick %llu", outcome(s.kind), (unsigned long long)s.tick);
    if (demo_sleep(d, 3000))
        return;
    t->after = demo_request_frame(d, "3 s after the swirl save", 1, 5000);
}

static void step_broken(demo *d) {
    demo_tour_step *t = begin(d, "broken save (watched file)",
                              "save a version with a syntax error (variants/broken.cu)");
    t->before = demo_request_frame(d, "before the broken save", 0, 5000);
    int first = demo_swap_count(d);
    uint64_t running = atomic_load(&d->version);
    demo_say(d, "   renaming a copy of variants/broken.cu over particles.cu");
    if (save_variant(d, "broken.cu"))
        return;
    t->swap = demo_wait_swap(d, first, EV(HK_EVENT_COMMITTED) | EV(HK_EVENT_REFUSED), 30000);
    if (t->swap < 0) {
        demo_say(d, "   no outcome within 30 s");
        return;
    }
    uint64_t ticks = atomic_load(&d->ticks);
    if (demo_sleep(d, 1500))
        return;
    t->after = demo_request_frame(d, "1.5 s after the broken save", 0, 5000);
    demo_say(d, "   %s; version %llu %s, %llu ticks ran since the outcome",
             outcome(swap_at(d, t->swap).kind), (unsigned long long)atomic_load(&d->version),
             atomic_load(&d->version) == running ? "still running" : "now running",
             (unsigned long long)(atomic_load(&d->ticks) - ticks));
}

static void step_push(demo *d) {
    char file[PATH_MAX];
    demo_tour_step *t =
        begin(d, "push (endpoint)", "push a signed release over HTTP (variants/pushed.cu)");
    if (!d->url[0]) {
        demo_say(d, "   skipped: the push endpoint did not start");
        return;
    }
    snprintf(file, sizeof file, "%s/variants/pushed.cu", d->kernels);
    t->before = demo_request_frame(d, "before the push", 0, 5000);
    int first = demo_swap_count(d);
    const char *argv[] = {"hotkern",   "push",      d->url, "--key", d->key, "--module",
                          DEMO_MODULE, "--timeout", "30",   file,    NULL};
    demo_say(d, "   $ hotkern push %s --key %s --module %s %s", d->url, d->key, DEMO_MODULE, file);
    t->cli_status = demo_run_cli(d, argv, 45000);
    demo_say(d, "   exit status %d (0: committed)", t->cli_status);
    /* The endpoint answers after the swap, so the outcome is normally in. */
    t->swap = demo_wait_swap(d, first, EV(HK_EVENT_COMMITTED) | EV(HK_EVENT_REFUSED), 5000);
    if (t->swap < 0)
        demo_say(d, "   no outcome recorded");
    if (demo_sleep(d, 3000))
        return;
    t->after = demo_request_frame(d, "3 s after the push (variants/pushed.cu)", 1, 5000);
}

static void step_rollback(demo *d) {
    demo_tour_step *t = begin(d, "rollback (endpoint)", "roll back to the previous version");
    if (!d->url[0]) {
        demo_say(d, "   skipped: the push endpoint did not start");
        return;
    }
    t->before = demo_request_frame(d, "before the rollback", 0, 5000);
    int first = demo_swap_count(d);
    /* A rollback needs the authority of a release: it is signed too. */
    const char *argv[] = {"hotkern", "rollback",  d->url, DEMO_MODULE, "--key",
                          d->key,    "--timeout", "30",   NULL};
    demo_say(d, "   $ hotkern rollback %s %s --key %s", d->url, DEMO_MODULE, d->key);
    t->cli_status = demo_run_cli(d, argv, 45000);
    demo_say(d, "   exit status %d (0: rolled back)", t->cli_status);
    t->swap = demo_wait_swap(d, first, EV(HK_EVENT_ROLLED_BACK) | EV(HK_EVENT_REFUSED), 5000);
    if (t->swap < 0)
        demo_say(d, "   no outcome recorded");
    if (demo_sleep(d, 3000))
        return;
    t->after = demo_request_frame(d, "3 s after the rollback (swirl again)", 1, 5000);
}

static void *tour_main(void *arg) {
    demo *d = arg;

    demo_say(d, "The tour starts in 3 s: four new versions of step(), one every few seconds, "
                "while the simulation runs.");
    if (demo_sleep(d, 3000) == 0)
        step_swirl(d);
    if (!atomic_load(&d->stop) && demo_sleep(d, 1000) == 0)
        step_broken(d);
    if (!atomic_load(&d->stop) && demo_sleep(d, 1000) == 0)
        step_push(d);
    if (!atomic_load(&d->stop) && demo_sleep(d, 1000) == 0)
        step_rollback(d);
    demo_say(d, "%s", "");
    demo_say(d, "== tour done ==");
    demo_request_stop(d);
    return NULL;
}

int demo_tour_start(demo *d, pthread_t *thread) {
    return pthread_create(thread, NULL, tour_main, d) ? -1 : 0;
}

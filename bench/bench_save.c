/*
 * Save -> live through the watcher: a watched one-line kernel is saved and
 * the time from the save's last system call (the rename, or the close of an
 * in-place write) to the first launch that runs the new code is measured, by
 * launching the kernel and reading its output every 0.1 ms. Three ways of
 * saving, N times each (default 20):
 *
 *   rename-over   the new text written to a temporary file, renamed over the
 *                 kernel's file (vim, sed -i, most editors' safe write)
 *   in place      the file truncated, written and closed
 *   burst of 5    five in-place saves 2 ms apart; measured from the last one,
 *                 which must be the content that runs
 *
 * Four watches run side by side, on four directories and modules: the
 * default build and the development profile (HK_BUILD_PROFILE_DEV), each in
 * a runtime that builds in this process (its malloc as glibc sets it) and
 * in one that builds in the hotkern-build helper (options.build_isolated,
 * which keeps the memory NVRTC frees). The saves go to each in turn (the
 * order rotated every round), so the host's slow and fast moments hit all
 * alike: the ratios of the medians are the figures to compare, absolute
 * times from different runs are not.
 * Every save is a real edit: a constant in the code that no compile cache of
 * any earlier run has seen (derived from the process id), never a comment.
 *
 * For the bursts, the event callback reads the content of every version that
 * commits (it launches the version just committed, on a buffer of its own),
 * so that the check is exact: the last save's content runs, and no older
 * content of the burst was committed after it.
 *
 * Without a usable CUDA device it prints a SKIP line and exits 77.
 *
 * usage: bench_save [N]
 */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "bench/common.h"
#include "hotkern/hotkern.h"

enum { MAXN = 64, BURST = 5, BURST_GAP_US = 2000, POLL_NS = 100000, TIMEOUT_MS = 10000 };
enum { PATH_RENAME, PATH_INPLACE, PATH_BURST, NPATHS };
static const char *const path_name[NPATHS] = {"rename-over", "in place", "burst of 5"};

typedef struct side {
    const char *profile; /* "default" or "dev" */
    const char *module;
    int iso; /* its runtime builds in the helper */
    char dir[PATH_MAX], path[PATH_MAX];
    hk_watch *w;
    hk_kernel *k; /* set once the module runs; read by the event callback */
    CUdeviceptr out, cb_out;
    double ms[NPATHS][MAXN];
    double build[NPATHS][MAXN]; /* the build's part of each (report build_ms) */
    double last_build_ms;       /* of the side's latest commit (log_mu) */
    int n[NPATHS], timeouts[NPATHS];
    int burst_last_ok, burst_older_after, burst_commits;
} side;

#define NSIDES 4
static side sides[NSIDES] = {{.profile = "default", .module = "kr"},
                             {.profile = "dev", .module = "kd"},
                             {.profile = "default", .module = "ir", .iso = 1},
                             {.profile = "dev", .module = "id", .iso = 1}};
static hk_runtime *rts[2]; /* in this process; isolated */
static CUcontext ctx;

/* What each commit put in place, in commit order (event callback). */
typedef struct commit {
    int side, value;
} commit;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static commit commits[8192];
static int ncommits;

static double ms_since(uint64_t t0) {
    return (double)(bench_ns() - t0) / 1e6;
}

/* Launches s's kernel once on out and returns what it wrote, INT_MIN when
 * the launch or the copy failed. The copy waits for the launch (both on the
 * legacy default stream). */
static int run_once(hk_kernel *k, CUdeviceptr out) {
    int n = 1, v = INT_MIN;
    void *args[] = {&out, &n};
    if (hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){32, 1, 1}, 0, NULL, args, NULL) != 0)
        return INT_MIN;
    if (cudaMemcpy(&v, (void *)(uintptr_t)out, sizeof v, cudaMemcpyDeviceToHost) != cudaSuccess)
        return INT_MIN;
    return v;
}

/* On the worker, right after a commit: the version just committed is the
 * current one (the worker is the only thread that commits here), so one
 * launch of it tells which content it holds. */
static void on_event(const hk_event *ev, void *ud) {
    static __thread int current;
    (void)ud;
    if (ev->kind != HK_EVENT_COMMITTED || !ev->module)
        return;
    for (int i = 0; i < NSIDES; i++) {
        if (strcmp(ev->module, sides[i].module) != 0)
            continue;
        pthread_mutex_lock(&log_mu);
        hk_kernel *k = sides[i].k;
        pthread_mutex_unlock(&log_mu);
        if (!k)
            return;
        if (!current) {
            bd.CtxSetCurrent(ctx);
            current = 1;
        }
        int v = run_once(k, sides[i].cb_out);
        pthread_mutex_lock(&log_mu);
        if (ncommits < (int)(sizeof commits / sizeof commits[0]))
            commits[ncommits++] = (commit){i, v};
        sides[i].last_build_ms = ev->report ? ev->report->build_ms : 0;
        pthread_mutex_unlock(&log_mu);
    }
}

/* Saves s's kernel with constant v; returns bench_ns() from just before the
 * save's last system call. */
static uint64_t save(side *s, int rename_over, int v) {
    char *text = bench_variant(bench_fmt_store, v);
    uint64_t t0 = bench_save_file(s->dir, s->module, s->path, text, rename_over);
    free(text);
    return t0;
}

/* Polls s's kernel every 0.1 ms from t0 until it writes v; the ms it took,
 * or -1 after TIMEOUT_MS. */
static double wait_live(side *s, int v, uint64_t t0) {
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (;;) {
        if (run_once(s->k, s->out) == v)
            return ms_since(t0);
        if (ms_since(t0) > TIMEOUT_MS)
            return -1;
        next.tv_nsec += POLL_NS;
        if (next.tv_nsec >= 1000000000L) {
            next.tv_nsec -= 1000000000L;
            next.tv_sec++;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
    }
}

static int next_const;

static void record(side *s, int path, double ms) {
    if (ms < 0) {
        s->timeouts[path]++;
        return;
    }
    if (s->n[path] < MAXN) {
        pthread_mutex_lock(&log_mu);
        s->build[path][s->n[path]] = s->last_build_ms;
        pthread_mutex_unlock(&log_mu);
        s->ms[path][s->n[path]++] = ms;
    }
}

/* A burst of saves 2 ms apart; measured from the last, then checked against
 * the commits it made. */
static void burst(side *s) {
    int v[BURST];
    pthread_mutex_lock(&log_mu);
    int from = ncommits;
    pthread_mutex_unlock(&log_mu);
    uint64_t t0 = 0;
    for (int j = 0; j < BURST; j++) {
        v[j] = next_const++;
        if (j)
            usleep(BURST_GAP_US);
        t0 = save(s, 0, v[j]);
    }
    record(s, PATH_BURST, wait_live(s, v[BURST - 1], t0));
    if (hk_wait_idle(rts[s->iso], TIMEOUT_MS) != 0)
        fprintf(stderr, "bench: the engine did not become idle after a burst\n");
    int last = -1, older_after = 0, mine = 0;
    pthread_mutex_lock(&log_mu);
    for (int i = from; i < ncommits; i++) {
        if (commits[i].side != s - sides)
            continue;
        mine++;
        if (commits[i].value == v[BURST - 1])
            last = i;
    }
    for (int i = last + 1; last >= 0 && i < ncommits; i++) {
        for (int j = 0; j < BURST - 1; j++)
            older_after += commits[i].side == s - sides && commits[i].value == v[j];
    }
    pthread_mutex_unlock(&log_mu);
    s->burst_last_ok += last >= 0 && run_once(s->k, s->out) == v[BURST - 1];
    s->burst_older_after += older_after;
    s->burst_commits += mine;
}

static void print_row(const side *s, int path, double base) {
    double v[MAXN];
    int n = s->n[path];
    memcpy(v, s->ms[path], sizeof v);
    if (n == 0) {
        printf("  %-12s %-8s %-10s no save went live (%d timeouts)\n", path_name[path], s->profile,
               s->iso ? "isolated" : "in-process", s->timeouts[path]);
        return;
    }
    double med = bench_median(v, n);
    printf("  %-12s %-8s %-10s median %7.2f ms  p90 %7.2f  min %7.2f  max %7.2f  (%d saves",
           path_name[path], s->profile, s->iso ? "isolated" : "in-process", med,
           bench_pct(v, n, 90), v[0], v[n - 1], n);
    if (s->timeouts[path])
        printf(", %d timed out", s->timeouts[path]);
    printf(")");
    if (base > 0)
        printf("  x%.2f of in-process default", med / base);
    /* The build's part, and the rest (the watcher, load and commit, the
     * first launch seen), save by save. */
    double b[MAXN], rest[MAXN];
    for (int i = 0; i < n; i++) {
        b[i] = s->build[path][i];
        rest[i] = s->ms[path][i] - s->build[path][i];
    }
    /* bench_median sorts: each before the percentile that needs it sorted. */
    double bmed = bench_median(b, n), rmed = bench_median(rest, n);
    printf("\n  %-12s %-8s %-10s of which the build: median %7.2f ms; the rest: median %6.2f "
           "ms, p90 %6.2f\n",
           "", "", "", bmed, rmed, bench_pct(rest, n, 90));
}

static double median_of(const side *s, int path) {
    double v[MAXN];
    memcpy(v, s->ms[path], sizeof v);
    return s->n[path] ? bench_median(v, s->n[path]) : 0;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20;
    if (n < 1 || n > MAXN)
        n = 20;
    bench_init("bench_save");
    bd.CtxGetCurrent(&ctx);
    next_const = (int)(getpid() % 20000) * 1000;

    for (int r = 0; r < 2; r++) {
        hk_options o;
        hk_options_init(&o);
        o.on_event = on_event;
        o.cache_dir = ""; /* every save is new anyway; no disk cache beside it */
        o.build_isolated = r;
        hk_report rep = HK_REPORT_INIT;
        if (hk_runtime_create(&rts[r], &o, &rep) != 0) {
            fprintf(stderr, "create (%s): %s\n", r ? "isolated builds" : "in process", rep.message);
            return 1;
        }
    }
    char root[] = "/tmp/hk-bench-save-XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    for (int i = 0; i < NSIDES; i++) {
        side *s = &sides[i];
        char *text = bench_variant(bench_fmt_store, next_const++);
        s->w = bench_watch_module(rts[s->iso], root, s->module, i % 2, text, s->dir, s->path);
        free(text);
        bd.MemAlloc(&s->out, 32 * sizeof(int));
        bd.MemAlloc(&s->cb_out, 32 * sizeof(int));
    }
    /* The first builds pay NVRTC's start-up and the PCH. */
    for (int i = 0; i < NSIDES; i++) {
        uint64_t t0 = bench_ns();
        hk_runtime *rt = rts[sides[i].iso];
        while (hk_module_version(rt, sides[i].module) < 1 && ms_since(t0) < 120000)
            usleep(1000);
        hk_kernel *k = NULL;
        if (hk_kernel_get(rt, sides[i].module, "k0", &k) != 0) {
            fprintf(stderr, "bench: module %s never built\n", sides[i].module);
            return 1;
        }
        pthread_mutex_lock(&log_mu);
        sides[i].k = k;
        pthread_mutex_unlock(&log_mu);
    }
    for (int w = 0; w < 3; w++) {
        for (int i = 0; i < NSIDES; i++) {
            int v = next_const++;
            if (wait_live(&sides[i], v, save(&sides[i], 0, v)) < 0)
                fprintf(stderr, "bench: a warm-up save of %s never went live\n", sides[i].module);
        }
    }

    printf("save -> first launch of the new version, one-line kernel, a real edit each time; "
           "polled every 0.1 ms; the four watches take the saves in turn\n");
    for (int r = 0; r < n; r++) {
        for (int path = 0; path < NPATHS; path++) {
            for (int j = 0; j < NSIDES; j++) {
                side *s = &sides[(r + j) % NSIDES];
                if (path == PATH_BURST) {
                    burst(s);
                    continue;
                }
                int v = next_const++;
                uint64_t t0 = save(s, path == PATH_RENAME, v);
                record(s, path, wait_live(s, v, t0));
            }
        }
    }
    for (int path = 0; path < NPATHS; path++) {
        double base = median_of(&sides[0], path);
        print_row(&sides[0], path, 0);
        for (int i = 1; i < NSIDES; i++)
            print_row(&sides[i], path, base);
    }
    for (int i = 0; i < NSIDES; i++) {
        const side *s = &sides[i];
        printf("  burst, %-8s %-10s the last save's content ran after %d of %d bursts; older "
               "content committed after it: %d times; commits per burst of %d saves: %.2f\n",
               s->profile, s->iso ? "isolated" : "in-process", s->burst_last_ok, n,
               s->burst_older_after, BURST, (double)s->burst_commits / n);
    }
    for (int r = 0; r < 2; r++) {
        hk_stats st = HK_STATS_INIT;
        hk_stats_get(rts[r], &st);
        printf("  engine (%s): %llu commits, %llu refused (superseded saves included), build "
               "%.1f ms in all\n",
               r ? "isolated builds" : "in process", (unsigned long long)st.swaps,
               (unsigned long long)st.refused, st.build_ms_total);
    }
    int bad = 0;
    for (int i = 0; i < NSIDES; i++) {
        hk_watch_stop(sides[i].w);
        bad |= sides[i].burst_older_after > 0 || sides[i].burst_last_ok < n;
        for (int path = 0; path < NPATHS; path++)
            bad |= sides[i].timeouts[path] > 0;
    }
    hk_runtime_destroy(rts[0]);
    hk_runtime_destroy(rts[1]);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return bad ? 1 : 0;
}

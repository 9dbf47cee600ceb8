/*
 * Save -> commit through the watcher on this machine's CPU, without a GPU:
 * bench_save's path (inotify, the watcher, the build, the commit) with the
 * tests' fake driver (tests/fakecuda.c) in place of libcuda, which loads a
 * cubin in microseconds. So it tells what the save-to-live loop costs on a
 * given CPU, the driver's load and the first launch aside (about half a
 * millisecond on the H200, bench_save's "rest"), and lets a CPU be compared
 * with the H200 host's, where NVRTC alone is over the loop's targets.
 *
 * The same four watches as bench_save, taking the saves in turn: the
 * default build and the development profile, each in a runtime that builds
 * in this process and in one that builds in the hotkern-build helper. Each
 * round also builds the same kind of source with hkp_build alone, in this
 * process (the baseline: what a build costs without the watcher and the
 * engine around it). A save is measured from its last system call to the
 * HK_EVENT_COMMITTED of its module, and also less the build_ms of the
 * commit's report (what the watcher and the engine add to the build; the
 * report's bounds start a little before the save is seen, so this runs a
 * little short); every save is a real edit (a constant
 * derived from the process id, never a comment).
 *
 * It asserts nothing about speed; the exit status is 1 only when a save
 * never committed.
 *
 * usage: bench_save_cpu [N]   (N saves per row, default 20)
 */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/common.h"
#include "hotkern/hotkern.h"
#include "loader/port.h"
#include "tests/fakecuda.h"

enum { MAXN = 64, TIMEOUT_MS = 10000 };
enum { PATH_RENAME, PATH_INPLACE, NPATHS };
static const char *const path_name[NPATHS] = {"rename-over", "in place"};

typedef struct side {
    const char *profile, *module;
    int iso; /* its runtime builds in the helper */
    char dir[PATH_MAX], path[PATH_MAX];
    hk_watch *w;
    double ms[NPATHS][MAXN], rest[NPATHS][MAXN]; /* rest: ms less the commit's build_ms */
    int n[NPATHS], timeouts[NPATHS];
    /* mu */
    unsigned long commits;
    uint64_t commit_ns;
    double build_ms; /* the latest commit's report */
} side;

#define NSIDES 4
static side sides[NSIDES] = {{.profile = "default", .module = "kr"},
                             {.profile = "dev", .module = "kd"},
                             {.profile = "default", .module = "ir", .iso = 1},
                             {.profile = "dev", .module = "id", .iso = 1}};
static hk_runtime *rts[2];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int next_const;

static void on_event(const hk_event *ev, void *ud) {
    (void)ud;
    if (ev->kind != HK_EVENT_COMMITTED || !ev->module)
        return;
    uint64_t now = bench_ns();
    pthread_mutex_lock(&mu);
    for (int i = 0; i < NSIDES; i++)
        if (!strcmp(ev->module, sides[i].module)) {
            sides[i].commits++;
            sides[i].commit_ns = now;
            sides[i].build_ms = ev->report ? ev->report->build_ms : 0;
        }
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* Saves s and waits for the commit that follows: its ms, or -1; *build the
 * commit's build_ms. */
static double save_to_commit(side *s, int rename_over, double *build) {
    pthread_mutex_lock(&mu);
    unsigned long before = s->commits;
    pthread_mutex_unlock(&mu);
    char *text = bench_variant(bench_fmt_store, next_const++);
    uint64_t t0 = bench_save_file(s->dir, s->module, s->path, text, rename_over);
    free(text);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += TIMEOUT_MS / 1000;
    double ms = -1;
    pthread_mutex_lock(&mu);
    while (s->commits == before)
        if (pthread_cond_timedwait(&cv, &mu, &dl) != 0)
            break;
    if (s->commits != before) {
        ms = (double)(s->commit_ns - t0) / 1e6;
        *build = s->build_ms;
    }
    pthread_mutex_unlock(&mu);
    return ms;
}

/* The baseline: hkp_build of a new one-line kernel, as the engine builds a
 * watched .cu with the default profile (sm_90 cubin, PCH), in this process. */
static double build_alone(void) {
    char *src = bench_variant(bench_fmt_store, next_const++);
    hkp_build_opts o = {
        .arch = 90, .ptx_to_cubin = 1, .opt_level = 3, .pch = 1, .source_name = "k.cu"};
    double ms = bench_build_ms(src, &o);
    free(src);
    return ms;
}

static void row(const char *what, const double *ms, const double *rest, int n, int timeouts,
                double base) {
    double v[MAXN], r[MAXN];
    memcpy(v, ms, (size_t)n * sizeof *v);
    memcpy(r, rest, (size_t)n * sizeof *r);
    if (!n) {
        printf("  %-44s no save committed (%d timeouts)\n", what, timeouts);
        return;
    }
    double med = bench_median(v, n);
    printf("  %-44s median %7.2f ms  p10 %7.2f  p90 %7.2f  (%d", what, med, bench_pct(v, n, 10),
           bench_pct(v, n, 90), n);
    if (timeouts)
        printf(", %d timed out", timeouts);
    printf(")");
    if (base > 0)
        printf("  x%.2f of the build alone", med / base);
    double rmed = bench_median(r, n); /* sorts r for the percentile */
    printf("; beside its build %.2f ms (median; p90 %.2f)\n", rmed, bench_pct(r, n, 90));
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20;
    if (n < 1 || n > MAXN)
        n = 20;
    next_const = (int)(getpid() % 20000) * 1000 + 7;
    char cpu[768];
    bench_cpu_line(cpu, sizeof cpu);
    printf("== bench_save_cpu: save -> commit through the watcher, fake driver, no GPU\n");
    printf("machine: %s\n", cpu);

    fake_init(1, 90);
    for (int r = 0; r < 2; r++) {
        hk_options o;
        hk_options_init(&o);
        o.on_event = on_event;
        o.cache_dir = "";
        o.build_isolated = r;
        hk_report rep = HK_REPORT_INIT;
        if (hkl_runtime_create_with(&rts[r], &o, fake_driver(), &rep) != 0) {
            fprintf(stderr, "create (%s): %s\n", r ? "isolated builds" : "in process", rep.message);
            return 1;
        }
    }
    char root[] = "/tmp/hk-bench-save-cpu-XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    for (int i = 0; i < NSIDES; i++) {
        side *s = &sides[i];
        char *text = bench_variant(bench_fmt_store, next_const++);
        s->w = bench_watch_module(rts[s->iso], root, s->module, i % 2, text, s->dir, s->path);
        free(text);
    }
    /* The first builds pay NVRTC's start-up and the PCH; then three saves each. */
    for (int i = 0; i < NSIDES; i++) {
        uint64_t t0 = bench_ns();
        while (hk_module_version(rts[sides[i].iso], sides[i].module) < 1 &&
               bench_ns() - t0 < 120000000000ull)
            usleep(1000);
    }
    build_alone();
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < NSIDES; i++)
            if (save_to_commit(&sides[i], 0, &(double){0}) < 0)
                fprintf(stderr, "bench: a warm-up save of %s never committed\n", sides[i].module);

    static double base[NPATHS * MAXN];
    int nbase = 0;
    for (int r = 0; r < n; r++)
        for (int path = 0; path < NPATHS; path++) {
            base[nbase++] = build_alone();
            for (int j = 0; j < NSIDES; j++) {
                side *s = &sides[(r + j) % NSIDES];
                double build = 0, ms = save_to_commit(s, path == PATH_RENAME, &build);
                if (ms < 0)
                    s->timeouts[path]++;
                else {
                    s->rest[path][s->n[path]] = ms - build;
                    s->ms[path][s->n[path]++] = ms;
                }
            }
        }
    double b = bench_median(base, nbase);
    printf("hkp_build alone (default profile, in this process), same rounds: median %.2f ms, "
           "p10 %.2f, p90 %.2f (%d builds)\n",
           b, bench_pct(base, nbase, 10), bench_pct(base, nbase, 90), nbase);
    int bad = 0;
    for (int path = 0; path < NPATHS; path++)
        for (int i = 0; i < NSIDES; i++) {
            char what[96];
            snprintf(what, sizeof what, "%-11s %-7s %s", path_name[path], sides[i].profile,
                     sides[i].iso ? "helper" : "in process");
            row(what, sides[i].ms[path], sides[i].rest[path], sides[i].n[path],
                sides[i].timeouts[path], b);
            bad |= sides[i].timeouts[path] > 0;
        }
    for (int i = 0; i < NSIDES; i++)
        hk_watch_stop(sides[i].w);
    hk_runtime_destroy(rts[0]);
    hk_runtime_destroy(rts[1]);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return bad;
}

/*
 * What the watch suite's parts share (tests/cpu_watch.c assembles them).
 * For the watcher alone (watch/): a recorder that keeps each file handed
 * over and each refusal, and waits for them, over a fresh directory per
 * test. For the runtime's watch API: a runtime on the fake driver, the
 * events it emits, and a build hook that holds a build inside the worker.
 */
#ifndef HK_TESTS_WATCH_FIXTURE_H
#define HK_TESTS_WATCH_FIXTURE_H

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "loader/core.h"
#include "loader/job.h"
#include "watch/watch.h"
#include "tests/fakecuda.h"

#define MAX_RECORDS 512

#define WAIT_MS 3000 /* for something that must arrive */

#define SETTLE_MS 300 /* for something that must not */

typedef struct record {
    char module[64];
    char path[PATH_MAX];
    char *content; /* NUL-terminated copy */
    size_t size;
} record;

typedef struct refusal {
    char module[64]; /* "" when NULL */
    char path[PATH_MAX];
    int err;
    char why[PATH_MAX + 256];
} refusal;

typedef struct recorder {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    record r[MAX_RECORDS];
    int n;
    refusal f[64];
    int nf;
} recorder;

extern recorder rec;

extern char dir[PATH_MAX]; /* the watched directory, canonical */

extern char root[PATH_MAX]; /* the temporary tree holding it */

extern hkw_watcher *w;

/* Waits until at least n records exist or timeout_ms passes; returns the
 * count then. */
int rec_wait(int n, int timeout_ms);

int refusal_count(void);

/* Waits for n refusals, then SETTLE_MS more, and checks that exactly n
 * arrived. */
void expect_refusals(int n);

extern volatile int writer_stop;

/* A copy of the refusal of the file named name (last one), or 0. */
int refusal_of(const char *name, refusal *out);

int rec_count(void);

/* Handovers of module since record index `from`. */
int rec_count_module(const char *module, int from);

/* Content of the last handover of module (a static copy), or NULL. */
const char *rec_last(const char *module);

/* Waits until n records exist, then SETTLE_MS more, and checks that exactly
 * n arrived. */
void expect_total(int n);

/* ---- files --------------------------------------------------------------- */

void path_in(char *out, size_t size, const char *d, const char *name);

void write_at(const char *path, const char *content);

void write_file(const char *name, const char *content);

void rm_rf(const char *path);

/* ---- fixture ------------------------------------------------------------- */

void start_with(hkw_opts *o);

void start(void);

void setup(void);

void teardown(void);

void *writer_main(void *arg);

/* ---- hk_watch_dir on the fake driver -------------------------------------- */

extern hk_runtime *rt;

extern pthread_mutex_t ev_mu;

extern int ev_committed, ev_refused, ev_superseded;

extern char ev_origin[PATH_MAX + 16];

/* With ev_kernel set (the handle of "step"), the tag of the code each
 * commit of its module put in place, in commit order. */
extern hk_kernel *ev_kernel;

extern int ev_tags[64], ev_ntags;

/* A watch the event callback stops when a refusal of it arrives. */
extern hk_watch *ev_stop_watch;

extern int ev_stopped;

/* Refusals as the application sees them. */
typedef struct refused_event {
    char module[64]; /* "" when NULL */
    char origin[PATH_MAX + 16];
    int error;
    char message[512];
    char *log; /* copy of report->log, or NULL */
} refused_event;

int events_of(int *counter);

/* Polls until module's version reaches v; returns the version then. */
uint64_t wait_version(const char *module, uint64_t v);

void wait_events(int *counter, int n);

const char *ptx_text(int tag);

/* A hook point of the engine where the worker is held (once) until
 * hook_go: HKL_HOOK_COMPILED makes a build as slow as the test wants. */
extern pthread_mutex_t hook_lock;

extern pthread_cond_t hook_cond;

extern hkl_hook_point hook_at;

extern int hook_armed, hook_inside, hook_release;

void hook_go(void);

void rt_setup(void);

void rt_teardown(void);

/* The refusal event of file name (the last one); fails the test when none. */
refused_event refused_for(const char *name);

/* The value of an unlabelled counter in the runtime's metrics text. */
uint64_t metric(const char *name);

/* Each part adds its tests to the suite's test case (tests/cpu_watch.c). */
void watch_scan_tests(TCase *tc);
void watch_saves_tests(TCase *tc);
void watch_refusals_tests(TCase *tc);
void watch_deps_tests(TCase *tc);
void watch_api_tests(TCase *tc);
void watch_api_stop_tests(TCase *tc);

#endif

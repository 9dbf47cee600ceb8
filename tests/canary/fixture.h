/*
 * What the canary suite's parts share (tests/cpu_canary.c assembles them):
 * the paths of the built helpers (the loadable fake, the misbehaving helper,
 * the stand-in compute-sanitizer), a runtime on the in-process fake driver
 * with a canary helper and a test for its kernel, the swaps the tests make,
 * and the helper's state (alive, its metrics).
 */
#ifndef HK_TESTS_CANARY_FIXTURE_H
#define HK_TESTS_CANARY_FIXTURE_H

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "hotkern/net.h"
#include "loader/core.h"
#include "net/net.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

extern char fake_lib[PATH_MAX], bad_helper[PATH_MAX];

/* BUILD/tests/cpu_canary -> BUILD/<rel> */
void built_path(char *out, const char *rel);

extern hk_runtime *rt;

/* The options of a runtime on the in-process fake with a canary whose
 * helper binds the loadable fake. helper NULL: the real one. */
void rt_options(hk_options *o, const char *helper, int timeout_ms, int canary);

hk_runtime *create(const hk_options *o, hk_report *rep);

hk_runtime *make_rt(const char *helper, int timeout_ms, int canary);

extern hk_kernel *k_step;

/* Commits version 1 (tag 1) and declares one test of step(out, n): a
 * 16-byte buffer and n = 4, compared as `mode` says. */
void start_with_test(hk_compare mode, double atol);

int swap_tag(int tag, int with_aux, hk_canary_policy policy, hk_report *rep);

void teardown(void);

hk_stats stats(void);

/* The value of the metrics sample line that starts with `series`, or -1. */
double metric(const char *series);

int alive(pid_t p);

extern char fake_san[PATH_MAX];

/* The state letter of /proc/PID/stat ('Z': a zombie), 0 when it is gone. */
char proc_state(pid_t p);

/* Each part adds its tests to the suite's test case (tests/cpu_canary.c). */
void canary_fake_tests(TCase *tc);
void canary_runs_tests(TCase *tc);
void canary_untrusted_tests(TCase *tc);
void canary_perf_tests(TCase *tc);
void canary_memcheck_tests(TCase *tc);

#endif

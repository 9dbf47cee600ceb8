/*
 * What the engine suite's parts share (tests/cpu_engine.c assembles them):
 * a runtime on the fake driver per test, the events it emits, and the swaps
 * and launches the tests make (a launch returns the tag of the code that
 * ran, tests/fakecuda.h).
 */
#ifndef HK_TESTS_ENGINE_FIXTURE_H
#define HK_TESTS_ENGINE_FIXTURE_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "loader/core.h"
#include "loader/source.h"
#include "loader/version.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

#define ptx fake_ptx

extern hk_runtime *rt;

extern int events[8];

extern char last_event_msg[512];

extern pthread_t reset_event_thread;

hk_runtime *make_rt(int ndev, hk_loader loader);

void setup(void);

void teardown(void);

int swap_src(const char *mod, const char *src, hk_report *rep);

void swap_ok(const char *mod, const char *src, hk_report *rep);

int launch_tag(hk_kernel *k);

/* Each part adds its tests to the suite's test case (tests/cpu_engine.c). */
void engine_versions_tests(TCase *tc);
void engine_lifetime_tests(TCase *tc);
void engine_faults_tests(TCase *tc);
void engine_sources_tests(TCase *tc);
void engine_submit_tests(TCase *tc);

#endif

/*
 * Shared test support: a main() for Check suites, and the GPU gate.
 * Every tests/cpu_*.c and tests/gpu_*.c file is one test program.
 */
#ifndef HK_TEST_HARNESS_H
#define HK_TEST_HARNESS_H

#include <check.h>
#include <stddef.h>

/* Exit status of a suite that was skipped as a whole (tests/run.sh). */
#define HKT_SKIP 77

/* Runs the suite; returns the process exit status. */
int hkt_run(Suite *s);

/* GPU suites call this first: returns 1 when a CUDA device can be used; else
 * prints "SKIP <suite>: <reason>" and returns 0 (the caller exits HKT_SKIP). */
int hkt_gpu_or_skip(const char *suite);

/* Makes a fresh temporary directory (mkdtemp) and returns its path (static
 * storage per call site is the caller's: copy it). */
char *hkt_tmpdir(void);
/* Writes a file; returns 0 or -1. */
int hkt_write_file(const char *path, const char *text);
/* rm -rf path (for temporary directories). */
void hkt_rmtree(const char *path);

#endif

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

#include <sys/types.h>

/* Starts Debian's nginx (or $HK_NGINX) in the foreground as a child serving
 * `root` on 127.0.0.1 with ETags on, its logs and temp files under `tmp`;
 * `extra` (may be NULL) is added to the server block. Returns the port, or -1
 * when nginx is missing or did not start (reason printed). *pid receives the
 * child, for hkt_nginx_stop. */
int hkt_nginx_start(const char *root, const char *tmp, const char *extra, pid_t *pid);
void hkt_nginx_stop(pid_t pid);

/* Forks a process that takes an exclusive flock on path (a file, created
 * when missing, or a directory) and stops itself with SIGSTOP: a holder
 * that never lets go. Returns its pid once it holds the lock and is
 * stopped; it is killed when the calling process ends (PR_SET_PDEATHSIG),
 * else by kill(pid, SIGKILL) and waitpid. */
pid_t hkt_hold_lock_stopped(const char *path);

/* Path of a program built beside the test binaries: BUILD/bin/NAME, found
 * from /proc/self/exe. */
const char *hkt_built_program(const char *name);

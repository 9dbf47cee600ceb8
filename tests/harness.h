/*
 * Shared test support: a main() for Check suites, and the GPU gate; the
 * real servers the tests start on loopback (nginx, Prometheus) and a GET.
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

/* ---- HTTP and Prometheus (libcurl, cJSON) ------------------------------- */

struct cJSON;

/* GETs url (its query string escaped by the caller), with 'Authorization:
 * Bearer token' when token is not NULL, 10 s at most. Returns the body
 * (malloc'd, the caller frees it) when the server answered 200, else NULL;
 * *status (may be NULL) receives the HTTP status, 0 when no answer came. */
char *hkt_http_get(const char *url, const char *token, long *status);

/* A body libcurl collects (CURLOPT_WRITEFUNCTION hkt_body_write,
 * CURLOPT_WRITEDATA a hkt_body): data NUL-terminated, malloc'd. */
typedef struct hkt_body {
    char *data;
    size_t len;
} hkt_body;
size_t hkt_body_write(char *p, size_t size, size_t nmemb, void *ud);

/* In Prometheus text, the value of the first sample of `name` whose labels
 * hold `label` ("" for any; a sample without labels never matches); -1
 * when there is none. */
long long hkt_sample(const char *text, const char *name, const char *label);

/* Runs `hotkern ARGS` (the one built beside the tests) in dir, 30 s at
 * most, and fails the test with its output unless it exits 0. */
void hkt_run_cli(const char *dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Runs `hotkern ARGS` (the one built beside the tests) in dir, 60 s at
 * most: its exit status (-1 when it did not exit), its output (stdout and
 * stderr) in out. */
int hkt_cli_out(const char *dir, char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A Prometheus server the test started (Debian's /usr/bin/prometheus, or
 * $HK_PROMETHEUS): its configuration (prometheus.yml), data (prom-data/)
 * and log (prometheus.log) in dir, its API on 127.0.0.1:port. */
typedef struct hkt_prometheus {
    pid_t pid; /* 0: not running */
    int port;
    char dir[1024];
} hkt_prometheus;

/* Writes dir/prometheus.yml, a 1 s scrape interval (and timeout) followed
 * by `scrape_configs` (YAML: the list under "scrape_configs:", each item
 * indented by two spaces), and starts Prometheus on a free port. Returns 1
 * once its API answers (/-/ready), 0 when the program is not installed (a
 * SKIP line printed), -1 when it did not start within 30 s (the log's path
 * printed). */
int hkt_prometheus_start(hkt_prometheus *p, const char *dir, const char *scrape_configs);
/* Starts a stopped server again with the same configuration, data and
 * port (the URL its clients hold). Returns as hkt_prometheus_start. */
int hkt_prometheus_restart(hkt_prometheus *p);
/* SIGTERM, then SIGKILL after 5 s; waits for it. p->port is kept. */
void hkt_prometheus_stop(hkt_prometheus *p);
/* GETs path (with its query string) from the API and parses it: the
 * document (the caller cJSON_Delete's it) when its status is "success",
 * else NULL. */
struct cJSON *hkt_prometheus_api(const hkt_prometheus *p, const char *path);
/* The value of an instant query's first sample (promql escaped here), NAN
 * when it has none or the server did not answer. */
double hkt_prometheus_query(const hkt_prometheus *p, const char *promql);
/* The number of samples an instant query returns; -1 when the server did
 * not answer. */
int hkt_prometheus_count(const hkt_prometheus *p, const char *promql);

#endif

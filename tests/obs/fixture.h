/*
 * What the logs-and-metrics suite's parts share (tests/cpu_obs.c assembles
 * them): a runtime on the fake driver whose log callback keeps each line,
 * and waits for one; swaps that commit or are refused; and the validator of
 * the metrics text (the exposition format, line by line), with the sample
 * reader the tests use.
 */
#ifndef HK_TESTS_OBS_FIXTURE_H
#define HK_TESTS_OBS_FIXTURE_H

#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <dirent.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <microhttpd.h>
#include <sodium.h>
#include "hotkern/net.h"
#include "loader/core.h"
#include "loader/expo.h"
#include "loader/metrics.h"
#include "net/net.h"
#include "tests/fakecuda.h"
#include "watch/watch.h"
#include "tests/harness.h"

/* ---- a log recorder ---------------------------------------------------- */

#define MAX_LINES 2048

struct log_lines {
    pthread_mutex_t lock;
    int n;
    int busy; /* what hk_runtime_set_log answered from inside the callback */
    struct {
        int level;
        char sub[16];
        char msg[1024];
    } e[MAX_LINES];
};
extern struct log_lines logs;

extern hk_runtime *rt;

extern char *tmp;

extern int try_set_log_inside; /* the callback calls hk_runtime_set_log once */

void on_log(hk_log_level level, const char *sub, const char *msg, void *ud);

/* Index of the first line of `level` from `sub` holding every needle
 * (NULL-terminated list), or -1; the line is copied to out. */
int find_line(int level, const char *sub, const char *const *needles, char *out, size_t cap);

/* Waits (10 s at most) for such a line; fails the test with what was logged. */
void wait_line(int level, const char *sub, const char *const *needles, char *out, size_t cap);

#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- fixture ----------------------------------------------------------- */

hk_runtime *make_rt(void);

void setup(void);

void teardown(void);

void swap_ok(const char *mod, int tag);

void swap_bad(const char *mod);

/* ---- an exposition validator ------------------------------------------- */

struct fam {
    char name[128], type[32];
    int help, typed, samples, closed;
};

/* NULL when text is valid exposition as hotkern writes it, else why (the
 * offending line goes to bad). */
const char *check_exposition(const char *text, char *bad, size_t cap);

/* The value of the sample line that starts with `series` ("name{...}" or
 * "name"), or -1. */
double sample_value(const char *text, const char *series);

char *metrics(void);

void assert_valid(const char *text);

/* ---- HTTP and keys, for the endpoint and the puller --------------------- */

struct resp {
    char *data;
    size_t len;
};

/* One request with libcurl; returns the status, the body in *body (the
 * caller frees it). */
long http(unsigned port, const char *method, const char *path, const char *token, const char *data,
          size_t len, char **body);

/* Keys: `trusted` saved as DIR/trusted.pub, `stranger` not trusted. */
extern hkn_seckey trusted, stranger;

extern char pub_path[PATH_MAX];

void make_keys(void);

struct src {
    const char *family;
    const char *value;
    uint64_t n;
};

/* Each part adds its tests to the suite's test case (tests/cpu_obs.c). */
void obs_logs_tests(TCase *tc);
void obs_endpoint_tests(TCase *tc);
void obs_puller_tests(TCase *tc);
void obs_metrics_tests(TCase *tc);

#endif

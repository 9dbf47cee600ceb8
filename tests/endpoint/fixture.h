/*
 * What the endpoint suite's parts share (tests/cpu_endpoint.c assembles
 * them): the recording engine, which keeps what apply was given and can be
 * told to refuse; the per-test endpoint on 127.0.0.1 with its key and
 * kernel; the clients that talk to it (curl and the built CLI, run under
 * `timeout`, and raw sockets); and the signed bodies the tests push.
 */
#ifndef HK_TESTS_ENDPOINT_FIXTURE_H
#define HK_TESTS_ENDPOINT_FIXTURE_H

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <sodium.h>
#include "loader/core.h"
#include "loader/expo.h"
#include "loader/metrics.h"
#include "net/net.h"
#include "ptx/ptx.h"
#include "tests/harness.h"

/* ---- the recording engine ---------------------------------------------- */

struct recorder {
    pthread_mutex_t lock;
    int calls; /* apply calls */
    int rollbacks;
    char module[64];
    uint64_t version; /* release version last applied: "the current version" */
    hk_format fmt;
    char origin[64];
    unsigned char *bytes;
    size_t size;
    int fail_with; /* when set, apply refuses with this error and a log */
    int attempts;  /* apply calls, refused ones included */
    int hostile;   /* the refusal's message and log carry terminal escapes */
    int nheaders;  /* headers given to the last apply, copied */
    char hname[4][64];
    char hdata[4][256];
    char state_file[PATH_MAX]; /* when set, apply notes whether the release is */
    int recorded_first;        /* ... already recorded there */
    int hash_only;             /* apply keeps the bytes' SHA-256, not a copy */
    char hash[65];
    uint64_t hist[16]; /* releases of the kept images, as the engine's ring: */
    int nhist;         /* the last runs, a rollback commits the one before */
    int delay_ms;      /* apply takes this long (an upload in flight) */
};
extern struct recorder rec;

/* 1 when the state file records module at version. */
int state_records(const char *path, const char *module, uint64_t version);

int rec_apply(void *ud, const char *module, uint64_t version, hk_format fmt, const void *bytes,
              size_t size, const hk_header *headers, int nheaders, const char *origin,
              hk_report *rep);

extern hkn_endpoint *ep;

uint64_t rec_current(void);

int rec_calls(void);

extern const hkn_engine engine;

/* ---- fixture ----------------------------------------------------------- */

extern char *tmp; /* per test */

extern hkn_seckey key; /* trusted */

extern char base[64]; /* http://127.0.0.1:PORT */

extern char key_path[PATH_MAX], src_path[PATH_MAX];

extern const char kernel_src[];

/* When set, adjusts the configuration of the next start(). */
extern void (*cfg_hook)(hk_endpoint_options *, hkn_endpoint_resolved *);

/* The Content-Type of curl_req's bodies, and whether they go chunked. */
extern const char *body_type;

extern int chunked;

void start(const char *token, size_t max_body, const char *cert, const char *pkey);

void setup(void);

void teardown(void);

/* ---- running clients --------------------------------------------------- */

/* Runs argv (under `timeout 30`), stdout and stderr into out; returns the
 * exit status, or -1. */
int run(char *const argv[], char *out, size_t cap);

/* One more request header for curl_req, or NULL. */
extern const char *extra_header;

/* curl METHOD URL [-d @file] [-H auth]: returns the HTTP code, body in
 * out_body (a file under tmp). */
int curl_req(const char *method, const char *path, const char *body_file, const char *token,
             char *body, size_t cap);

const char *cli_path(void);

/* ---- request bodies ---------------------------------------------------- */

enum tamper { T_NONE, T_MANIFEST, T_NO_SIG, T_BYTES, T_NO_ARTIFACT };

/* Writes a push body for `module` v`version` signed by k into tmp/NAME and
 * returns its path (valid for the next 15 calls). */
const char *body_file(const hkn_seckey *k, const char *module, uint64_t version, int64_t expires,
                      enum tamper t, const char *name);

int json_has(const char *body, const char *field, const char *value);

/* Sends only headers claiming a huge body and reads the answer: a 413 that
 * arrives proves the server answered without reading the body. */
void raw_request(const char *req, char *out, size_t cap);

/* A line-by-line check of the Prometheus text exposition format. */
void check_prometheus(char *text);

int rollbacks(void);

void no_keys_unsigned(hk_endpoint_options *o, hkn_endpoint_resolved *r);

/* Sends raw text on a fresh connection from 127.0.0.1 and reads the answer
 * until the server closes; returns the seconds it took. */
double timed_request(const char *head, const char *file, char *out, size_t cap);

/* Each part adds its tests to the suite's test case (tests/cpu_endpoint.c). */
void ep_push_tests(TCase *tc);
void ep_refusals_tests(TCase *tc);
void ep_auth_tests(TCase *tc);
void ep_rollback_tests(TCase *tc);
void ep_limits_tests(TCase *tc);
void ep_frames_tests(TCase *tc);

#endif

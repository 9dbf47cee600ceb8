/*
 * canary/parent.h: the parent side's state, shared by its three files and by
 * them only (canary/canary.h is the way in, and the protocol).
 *
 *   canary.c    the declared tests and the helper processes: their start,
 *               READY, kill and restart, the memcheck helper's log;
 *   exchange.c  the parent's half of the protocol: each request to a helper
 *               and its reply, read strictly against what was asked;
 *   run.c       one run (hka_run): which tests run where, the verdict on each
 *               launch, comparisons, the perf guard, the report.
 *
 * run.c uses the other two; exchange.c and canary.c use neither. Every
 * function here is called with run_lock held, but the tests' (tests_lock).
 */
#ifndef HK_CANARY_PARENT_H
#define HK_CANARY_PARENT_H

#include <pthread.h>
#include <stdint.h>

#include "canary/canary.h"
#include "util/util.h"

#define START_FACTOR 10 /* helper start and image loads: timeout x 10 */

/* The tests of one kernel handle. */
typedef struct ktests {
    char module[64], kernel[128];
    int n;
    hk_test *t[HKA_MAX_TESTS];
    struct ktests *next;
} ktests;

/* One helper process (canary.h, "Two helpers"). */
typedef struct helper {
    /* immutable */
    const char *what; /* "the canary helper", "the memcheck helper" */
    const char *who;  /* in a run's messages: "the helper", "the memcheck helper" */
    int sanitized;    /* runs under compute-sanitizer */
    /* run_lock */
    hku_child proc; /* the process, and killed ones not reaped yet */
    int ready;      /* its READY was read */
    /* run_lock, memcheck helper: what the sanitizer reported since the
     * last hka_mc_reset (its stderr's observer) */
    char mc_first[160]; /* the first error line; "" none */
    char mc_api[160];   /* the first API error line ("Program hit ..."), a fallback */
    int mc_errors;
    int mc_first_warn; /* mc_first is a warning ("Warning: Error buffer overflow ..."),
                        * which a report's own line replaces */
} helper;

struct hka_canary {
    /* immutable */
    char *helper_path, *sanitizer;
    int device, timeout_ms, enabled;
    int mc_on;            /* the memcheck helper runs the new version's launches first */
    char mc_off_why[200]; /* why not, when a sanitizer was configured */

    pthread_mutex_t run_lock;
    helper plain, mc; /* run_lock */

    pthread_mutex_t tests_lock;
    ktests *tests; /* tests_lock */

    pthread_mutex_t count_lock; /* a leaf: the counters */
    hka_counters n;             /* count_lock (sanitizer: immutable) */
};

/* A run's own copy of a module's tests, taken under tests_lock. */
typedef struct snap {
    int n;
    char (*kernel)[128];
    hk_test **t;
} snap;

/* What a test launch came back with. */
typedef struct outcome {
    int transport;    /* 0, or an HKU_RECV_* code (a failed send is EOF) */
    int in_timing;    /* the transport failed while waiting for TIMED */
    char detail[96];  /* what was malformed */
    uint32_t stage;   /* hka_stage */
    int cu;           /* CUresult where it stopped */
    char cu_name[64]; /* its name, as the helper's driver says */
    uint32_t trap;    /* a guarded site ran (ptx/guard.c's code); stage SYNC, cu 0 */
    uint32_t sites;   /* the guarded sites of the image launched (0: not guarded): a
                       * trap code must name one of them */
    unsigned char *payload;
    const unsigned char *buf[HKA_MAX_ARGS]; /* by argument index: buffers after */
    /* Timed repeats (TIMED), when asked for and the launch finished. */
    int asked; /* runs asked for */
    int timed; /* 1: ms holds the median */
    double ms;
    uint32_t tstage; /* where a repeat stopped (tcu or ttrap not 0) */
    int tcu;
    uint32_t ttrap; /* a repeat reached a guarded site */
    char tcu_name[64];
} outcome;

/* The image's limits for entry, as the helper's driver reads them. */
typedef struct limits {
    int cu;
    char cu_name[64];
    uint32_t max_threads, regs, static_shared, max_dynamic_shared, local;
} limits;

/* ---- canary.c ------------------------------------------------------------ */

/* A run's copy of module's tests (hka_snap_free frees it): 0, or
 * HK_ERR_NOMEM. */
int hka_snap_take(hka_canary *c, const char *module, snap *s);
void hka_snap_free(snap *s);
/* Kills h (how, when not NULL, says how it ended); starts it (its READY
 * not read yet: 0, or hku_child_start's error with why); or starts it when
 * none runs and reads its READY within wait_ms (0, or HK_ERR_IO with why). */
void hka_helper_kill(helper *h, char *how, size_t n);
int hka_helper_start(hka_canary *c, helper *h, char *why, size_t n);
int hka_helper_ready(hka_canary *c, helper *h, char *why, size_t n, double wait_ms);
/* What the memcheck helper's log said since hka_mc_reset, and forgetting
 * it; hka_mc_end ends the memcheck helper so that it says all it found: 1
 * when it found an error. */
void hka_mc_what(const helper *h, char *out, size_t n);
void hka_mc_reset(helper *h);
int hka_mc_end(helper *h, char *how, size_t n);

/* ---- exchange.c ---------------------------------------------------------- */

/* Loads im (its guarded copy with guarded) into slot of h: 0; 1 when the
 * helper's driver refused it (cu, name and log say why); or a negative
 * HKU_RECV_* when the exchange failed. */
int hka_load_slot(hka_canary *c, helper *h, int slot, const hka_image *im, int guarded, int *cu,
                  char *name, char *log);
/* Runs test t on the image in slot of h under timeout_ms, with `runs` timed
 * repeats when it finishes; o says what came back (its payload the
 * caller's to free). */
void hka_do_launch(hka_canary *c, helper *h, int slot, const char *entry, const hk_test *t,
                   int runs, int timeout_ms, uint32_t sites, int keep, outcome *o);
/* Asks the plain helper for the limits of entry in slot: 0, or a negative
 * HKU_RECV_* when the exchange failed. */
int hka_get_limits(hka_canary *c, int slot, const char *entry, limits *l);
/* Words for an HKU_RECV_* failure and for an hka_stage. */
const char *hka_recv_what(int r);
const char *hka_stage_name(uint32_t stage);

#endif /* HK_CANARY_PARENT_H */

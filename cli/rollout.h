/*
 * What the rollout commands share across cli/: rollout_cmd.c (the entry:
 * options, help, dispatch), rollout.c (the origin's manifests: start,
 * advance, pause, resume, abort, status), gate.c (the
 * fleet as Prometheus knows it, per step, and the gate), watch.c (watch)
 * and prom.c (Prometheus's HTTP API). docs/ROLLOUT.md is the user's view.
 * Single-threaded, as the whole tool.
 */
#ifndef HK_CLI_ROLLOUT_H
#define HK_CLI_ROLLOUT_H

#include <stdint.h>

#include "cli/cli.h"
#include "net/net.h"

struct cJSON;

/* ---- the origin's manifests (cli/rollout.c) ----------------------------- */

/* The options of every rollout subcommand (each takes those its help
 * names; run() refuses the others). */
typedef struct hkc_rollout_args {
    const char *dir, *module, *steps, *steps_file, *arch, *pubkey;
    hkc_list keys;         /* --key SECRET, each (1 to HKN_MAX_KEYS): every one signs */
    const char *build_for; /* start: the architectures to ship cubins for */
    uint64_t release, bake, expires_in;
    int force, json;
    /* status --prometheus and watch */
    const char *prometheus, *prom_token, *min_reporting;
    hkc_list gates;      /* --gate QUERY, each */
    uint64_t interval_s; /* watch: between two evaluations */
    uint64_t hosts;      /* --hosts N: the fleet's size (0: as Prometheus knows it) */
    uint64_t lookback_s; /* a host seen this recently is known */
    uint64_t max_age_s;  /* a host's sample this old no longer reports (0: from the scrapes) */
    uint64_t prom_timeout_s;
    double min_share; /* --min-reporting, parsed: (0, 1] */
    /* a push fleet (cli/push_fleet.c) */
    const char *endpoints; /* --endpoints FILE: the hosts pushed to; NULL: a pull fleet */
    hkc_http_opts http;    /* --token, --cacert, --insecure, --timeout (per push) */
    uint64_t concurrency;  /* pushes in flight at once */
    uint64_t retries;      /* more attempts for a host that does not answer */
    int published_is_done; /* watch's changes: 0 once published, whatever the pushes */
    int token_given;       /* --token was (the entry's usage check) */
} hkc_rollout_args;

/* A manifest of the origin directory, verified and parsed. */
typedef struct hkc_man {
    int have;
    hkn_manifest m;
    char *text, *sig;
    size_t len, sig_len;
    int64_t mtime;
} hkc_man;

/* The keys a command signs with, every --key in order (the first one's id
 * in the manifests), and their public halves as a trust of threshold 1:
 * a manifest signed over must verify with one of them. */
typedef struct hkc_signers {
    hkn_seckey keys[HKN_MAX_KEYS];
    int n;
    hkn_trust pub;
} hkc_signers;

/* Loads every --key of paths into s (to wipe: sodium_memzero). 0 or the
 * exit status. */
int hkc_signers_load(hkc_out *o, const hkc_list *paths, hkc_signers *s);

/* DIR/NAME and its .sig into x (x->have 0 when the manifest is missing),
 * verified with the keys of t when it is not NULL (t->threshold of them;
 * its signature file bare or of lines). 0, or the exit status with the
 * failure reported through o; x is the caller's to hkc_man_free. */
int hkc_man_load(hkc_out *o, const char *dir, const char *name, const hkn_trust *t, hkc_man *x);
void hkc_man_free(hkc_man *x);

/* Takes DIR's lock (flock, not waiting) for the command's length: 0 with
 * *fd to close, or the exit status (HK_ERR_BUSY: another command holds it). */
int hkc_lock_dir(hkc_out *o, const char *dir, int *fd);

/* Runs subcommand sub (start, advance, pause, resume, abort, status) as
 * its options say, once the entry (cli/rollout_cmd.c) checked them: the
 * exit status, the outcome through o. */
int hkc_rollout_run(hkc_out *o, const char *sub, const hkc_rollout_args *a, char **files,
                    int nfiles);
/* Runs "advance" (forced: the caller counted the bake), "pause", "resume"
 * or "abort" over a->dir with a->keys as the subcommand does: the directory
 * locked, the manifest verified and the next one published. 0, or the exit
 * status with the refusal recorded in o (a JSON hkc_out keeps it quiet). */
int hkc_rollout_change(hkc_out *o, const char *sub, const hkc_rollout_args *a);

/* ---- Prometheus's HTTP API (cli/prom.c) -------------------------------- */

typedef struct hkc_prom {
    const char *url;   /* the server's base: http://prometheus:9090 */
    const char *token; /* sent as 'Authorization: Bearer', or NULL */
    long timeout_s;    /* per request; 0: 30 */
    void *curl;        /* the connection, kept (CURL *) */
} hkc_prom;

/* What an answer was (not exit statuses). */
#define HKC_PROM_OK   0
#define HKC_PROM_DOWN 1 /* no data: unreachable, a 5xx, not the API's JSON */
#define HKC_PROM_BAD  2 /* Prometheus refused the query (4xx: bad_data) */

/* One sample of an answer: its labels point into the vector's document. */
typedef struct hkc_sample {
    const struct cJSON *metric; /* an object of strings; NULL for a scalar */
    double value;
    double ts; /* unix seconds, Prometheus's clock */
} hkc_sample;

typedef struct hkc_vector {
    struct cJSON *doc; /* owned */
    hkc_sample *s;     /* owned */
    size_t n;
} hkc_vector;

/* An instant query: every sample of the answer (a matrix's every point) in
 * *out, to hkc_vector_free, or the reason in err. HKC_PROM_*. */
int hkc_prom_query(hkc_prom *p, const char *promql, hkc_vector *out, char *err, size_t cap);
void hkc_vector_free(hkc_vector *v);
/* A label of s, "" when it has none. */
const char *hkc_sample_label(const hkc_sample *s, const char *name);
/* The number of active targets and their longest scrape interval, in
 * seconds (NAN when none says). HKC_PROM_*. */
int hkc_prom_targets(hkc_prom *p, size_t *n, double *max_s, char *err, size_t cap);
void hkc_prom_close(hkc_prom *p);

/* ---- the fleet and the gate (cli/gate.c) -------------------------------- */

#define HKC_GATE_PASS    0
#define HKC_GATE_FAIL    1
#define HKC_GATE_UNKNOWN 2

/* One target Prometheus scrapes hotkern_host_info from. */
typedef struct hkc_host {
    char id[HKN_HOST_ID_MAX];
    char instance[256], job[128];
    int step;          /* the first step that takes it, from 0; -1: none */
    int reporting;     /* its latest sample is at most max_age_s old */
    long long release; /* what it runs of the module; -1: it says nothing */
    long long refused; /* the last release it refused; -1: none */
    char reason[16];   /* and why */
} hkc_host;

/* The gate's answer for the manifest's current step. */
typedef struct hkc_verdict {
    int state;         /* HKC_GATE_* */
    int answered;      /* Prometheus gave the hosts (status fails without) */
    int push;          /* the hosts are an endpoints file's (cli/push_fleet.c) */
    int settled;       /* PASS only: the step's hosts run the release */
    char reason[4096]; /* why, for people */
    size_t known;      /* hosts Prometheus knows */
    size_t expected;   /* of them, in the current step or an earlier one */
    size_t reporting;  /* of those, reporting now */
    size_t on_release; /* of those, running the release */
    double step_age_s; /* since the current manifest was published ($STEP_AGE) */
    double window_s;   /* the gate's range: step_age_s plus max_age_s ($WINDOW) */
    double max_age_s;  /* a host whose latest sample is older does not report */
    hkc_host *hosts;   /* owned: hkc_verdict_free */
    size_t nhosts;
} hkc_verdict;

/* The first step of m that takes a host of this id and labels
 * (comma-separated), -1 for none: the bucket and the names as the host
 * computes them (hkn_fleet_bucket, hkn_rollout_covers), for pull and push
 * fleets alike. */
int hkc_first_step(const hkn_manifest *m, const char *id, const char *labels);
/* A push fleet's part of the gate in Prometheus: each --gate query, over
 * m's step age and the reporting margin; v's state, reason, step_age_s,
 * window_s and max_age_s set (no hosts: the endpoints file lists them).
 * Unknown when Prometheus does not answer or scrapes nothing. */
void hkc_gate_queries(hkc_prom *p, const hkc_rollout_args *a, const hkn_manifest *m,
                      hkc_verdict *v);
/* The default gate queries of manifest m over v's step_age_s and window_s,
 * in order (docs/ROLLOUT.md lists them), written to q[0..HKC_GATE_DEFAULTS-1]. */
#define HKC_GATE_DEFAULTS 4
void hkc_gate_defaults(const hkn_manifest *m, const hkc_verdict *v, char q[][512]);
/* Asks Prometheus about m's fleet and evaluates the gate: v filled (its
 * hosts the caller's to hkc_verdict_free). */
void hkc_gate_eval(hkc_prom *p, const hkc_rollout_args *a, const hkn_manifest *m, hkc_verdict *v);
void hkc_verdict_free(hkc_verdict *v);
/* "pass", "FAIL", "unknown". */
const char *hkc_gate_name(int state);
/* Each --gate query once: 0, or the usage error (2) of the first that
 * Prometheus refuses; unanswered queries pass (the gate says unknown). */
int hkc_gate_check_queries(hkc_out *o, hkc_prom *p, const hkc_rollout_args *a,
                           const hkn_manifest *m);
/* status --prometheus: per step, hosts on the release, refused it, on the
 * previous one, on another, not reporting; then the gate. */
void hkc_fleet_describe(hkc_out *o, const hkn_manifest *m, const hkc_verdict *v);

/* ---- push fleets (cli/push_fleet.c) ------------------------------------ */

/* What a push round does besides pushing the current manifest to the
 * hosts that lack it. */
#define HKC_PUSH_PROBE 1 /* asks every host counted as on the release what it runs */

/* Brings a->endpoints' hosts in line with DIR's current manifest cur
 * (verified, with a rollout): every host of the steps so far that does not
 * run its release and did not refuse it is pushed the signed manifest and
 * its artifacts (aborted: every host that took the release, or may have,
 * is pushed the previous one's), a->concurrency at once, a host that does
 * not answer tried a->retries times more; each reply is recorded in
 * DIR/push-state.json. The caller holds DIR's lock. v: the replies'
 * verdict over the hosts of the steps so far (fail: a refusal; unknown: a
 * host that did not answer, or could not judge; pass, settled: all on the
 * release); its hosts the caller's to hkc_verdict_free. 0, or the exit
 * status (a bad endpoints file: 2). */
int hkc_push_round(hkc_out *o, const hkc_rollout_args *a, const hkc_man *cur, int flags,
                   hkc_verdict *v);
/* status of a push fleet: per step, from DIR/push-state.json, the hosts on
 * the release, those that refused it (with the endpoint's reason), those
 * that did not answer and those not pushed yet. 0, or the exit status. */
int hkc_push_describe(hkc_out *o, const hkc_rollout_args *a, const hkn_manifest *m);

/* ---- watch (cli/watch.c) ------------------------------------------------ */

/* Watches a->dir's rollout until it ends: the exit status. */
int hkc_rollout_watch(hkc_out *o, const hkc_rollout_args *a);

#endif

/*
 * The puller's object, shared by its two files: net/pull.c (the transfers,
 * one poll, the poll thread) and net/puller.c (options, create, run, stats,
 * metrics, destroy). Internal to net/.
 */
#ifndef HK_NET_PULLER_H
#define HK_NET_PULLER_H

#include <pthread.h>

#include <curl/curl.h>

#include "net/net.h"

struct hkn_puller {
    /* Immutable after create. */
    hkn_engine eng;
    hk_pull_options opt; /* zeros replaced by the defaults; url, artifact_base
                          * and ca_file point at the copies below; the
                          * fields hkn_pull_resolved stands for are NULL */
    hkn_trust trust;
    char *url, *sig_url, *base, *ca_file, *state_dir, *save_dir, *origin;
    char *keys_url, *keys_sig_url; /* NULL: no key list polled */
    hkn_state *state;
    hkn_fleet *fleet;   /* the host's id and labels, its rollout records (own lock) */
    hkn_scrape *scrape; /* the /metrics server, or NULL */

    /* Poll thread only (or the caller of hkn_pull_poll when no thread runs). */
    hkn_refused *refused; /* the releases the engine refused */
    CURL *curl;
    char errbuf[CURL_ERROR_SIZE];
    char *etag, *last_modified; /* validators of the last manifest that verified */
    char *keys_etag, *keys_lm;  /* of the last key list dealt with for good */
    int kept_err;               /* that manifest's outcome, reported again on a 304 */
    char kept_message[512];
    unsigned failures;  /* consecutive failed polls, for the backoff */
    unsigned keys_wait; /* poll thread: answered polls until the key list's next */
    int retry;          /* the last poll's engine outcome was transient (poll.retry) */

    pthread_mutex_t lock;
    pthread_cond_t wake;   /* lock: signalled on stop */
    int stop;              /* lock; also read atomically by the progress callback */
    hkn_pull_stats stats;  /* lock */
    uint64_t keys_version; /* lock: the key list in force at the last poll */
    int keys_threshold;    /* lock: its threshold */
    uint64_t keys_refused; /* lock: key lists refused */
    pthread_t thread;
    int running; /* set by hkn_pull_run, read by destroy: API thread only */
};

struct buf {
    hkn_puller *p;
    char *data;
    size_t len, alloc, limit;
    int over; /* more bytes arrived than limit */
};

/* The poll thread's body (net/pull.c), started by hkn_pull_run. */
void *hkn_pull_thread(void *arg);
/* Records the key list in force for the metrics (net/pull.c). */
void hkn_pull_note_trust(hkn_puller *p);

#endif

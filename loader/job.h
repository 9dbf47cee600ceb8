/*
 * loader/job.h: a job, one submission on its way to the transaction (job.c
 * makes and frees it; worker.c builds it, swap.c swaps it in), and the
 * waiter of a synchronous hk_swap that waits for a safe point.
 */
#ifndef HK_LOADER_JOB_H
#define HK_LOADER_JOB_H

#include "loader/core.h"

/* A synchronous hk_swap waiting for a safe point to stage its job. */
typedef struct hkl_waiter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;       /* lock */
    int err;        /* lock: the swap's outcome */
    hk_report *rep; /* the caller's report; filled before done is set */
} hkl_waiter;

/* A unit of work for the worker thread. */
struct hkl_job {
    char name[HKL_NAME_MAX];
    void *data;
    size_t size;
    hk_swap_options opt;
    char *origin;         /* owned copy of opt.origin */
    char **nvrtc_options; /* owned copies */
    char **name_expressions;
    char *source_name;
    hkp_artifact art; /* after build */
    /* The image's hash (hkl_lkg_hash), taken once, when first needed: by
     * the build's quarantine check, from a restored image's record, or by
     * the swap, once the image is known to be new; hashed says it is. */
    uint8_t hash[32];
    int hashed;
    int built;
    int at_safe_point;  /* staged inside hk_safe_point */
    uint64_t seq;       /* submission order (0: none); an older job never
                         * replaces a newer committed one */
    int latest;         /* immutable: from hkl_submit_latest: a later such
                         * job of the same module supersedes this one */
    double deadline;    /* work_lock: pending without a waiter: the worker
                         * stages it itself after this (hkl_now_ms) */
    double t_start;     /* hkl_now_ms when submitted, for total_ms */
    hkl_waiter *waiter; /* set: owned by a waiting hk_swap, never freed by the
                         * safe point (which signals it instead) */
    hkl_job *next;
    hk_header *headers; /* owned copy behind opt.headers (hku_headers_dup) */
};

/* job.c: hkl_job_new makes a job of module name from the caller's image and
 * options, copying them (0, HK_ERR_INVALID for a name that could not be
 * recorded or an empty image, HK_ERR_NOMEM); hkl_job_free frees it and all
 * it owns (NULL is fine). */
int hkl_job_new(hkl_job **out, const char *name, const void *data, size_t size,
                const hk_swap_options *opt);
void hkl_job_free(hkl_job *job);

#endif /* HK_LOADER_JOB_H */

/*
 * The push endpoint's pieces: what crosses its files.
 *
 *   endpoint.c           the server: dispatch of each request (routes, the
 *                        checks in order, bodies as they stream, the queue
 *                        to the worker), the defaults, start and stop;
 *   endpoint_admit.c     connections, their limits and deadline, the memory
 *                        bodies hold; Host, Origin, the token, the body's type;
 *   endpoint_handlers.c  responses, the module table, the worker (releases
 *                        and rollbacks), status and metrics.
 *
 * endpoint.c uses the other two, endpoint_handlers.c uses endpoint_admit.c,
 * never the other way round. Names here are internal (hkn_ep_ prefix).
 *
 * Locks (private to these files), never nested:
 *   lock       the module table, the nonces and the counters;
 *   conn_lock  the list of open connections (and the in-flight bytes);
 *   job_lock   the worker's queue.
 * The anti-rollback state has its own (net/state.c); the worker holds its
 * transaction from the version check to the record.
 */
#ifndef HK_NET_ENDPOINT_H
#define HK_NET_ENDPOINT_H

#include <arpa/inet.h>
#include <stdatomic.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "net/net.h"

#define MAX_MODULES 256
#define NERRORS     32
#define MAX_NONCES  1024

enum route { R_NONE, R_RELEASE, R_STATUS, R_ROLLBACK, R_METRICS, R_HEALTH, R_KEYS };

struct ep_module {
    char name[64];
    uint64_t release_version; /* highest release committed through this endpoint */
    int last_error;
    char last_outcome[16]; /* "committed", "refused", "rolled_back" */
    char last_message[512];
    char last_canary[160]; /* hk_report.canary of the last outcome */
    char *last_log;        /* owned */
    int64_t updated;
};

struct nonce {
    char text[33];
    int64_t expires;
};

/* One TCP connection, from accept to close. */
struct conn {
    struct conn *prev, *next; /* conn_lock */
    int fd;                   /* immutable */
    char ip[INET6_ADDRSTRLEN];
    int64_t start_ms; /* conn_lock: when the current request began */
    int receiving;    /* conn_lock: 1 until the current request is fully received */
};

/* One request, owned by its connection; the worker has it while `queued`
 * and not `done`. */
struct req {
    enum route route;
    struct conn *conn;
    char module[64]; /* rollback target */
    char *body;      /* a JSON body */
    size_t len, cap, limit;
    hkn_frame *frame; /* a binary body (HKN_FRAME_TYPE), parsed as it streams in */
    size_t reserved;  /* bytes counted in ep->inflight */
    size_t declared;  /* its Content-Length, 0: none */
    int refused;      /* an HTTP status: over the cap or the memory bound, or (400) a
                       * frame that cannot be one; the rest is read and dropped */
    int settled;      /* a final call has returned once without an answer */
    int queued;       /* handed to the worker (connection suspended) */
    int done;         /* the worker answered: status and answer are set */
    unsigned status;
    char *answer; /* JSON text, owned until queued as the response */
    struct req *next_job;
    struct MHD_Connection *c;
};

struct hkn_endpoint {
    /* Immutable from start to stop. */
    struct MHD_Daemon *daemon;
    hkn_engine eng;
    hkn_trust trust;
    char *token;
    size_t max_body, max_inflight;
    unsigned max_conns, per_ip;
    int64_t deadline_ms;
    /* Set once, right after the daemon started (a port of 0 is chosen when
     * it binds), while its threads may already serve: atomic. id is written
     * before id_set, and read only once id_set is (hkn_ep_id()). */
    _Atomic uint16_t port;
    char id[HKN_ENDPOINT_ID_MAX]; /* named by signed rollback requests */
    _Atomic int id_set;
    char addr[INET6_ADDRSTRLEN]; /* as bound, for Host */
    int wildcard, loopback;      /* the bound address is any / a loopback one */
    char **hosts;                /* configured names */
    int nhosts;
    hkn_state *state;
    char *cert_pem, *key_pem; /* libmicrohttpd reads them for the daemon's life */
    hkn_refused *refused;     /* worker only: the releases the engine refused */

    pthread_mutex_t lock;
    struct ep_module *mods;          /* lock */
    size_t nmods;                    /* lock */
    struct ep_module last;           /* lock: the latest release or rollback outcome */
    struct nonce nonces[MAX_NONCES]; /* lock: rollback nonces seen, until they expire */
    uint64_t requests;               /* lock */
    uint64_t unauthorized;           /* lock */
    uint64_t too_large;              /* lock */
    uint64_t overloaded;             /* lock: 503 for limits */
    uint64_t foreign;                /* lock: refused Host, Origin or body type */
    uint64_t deadline_cut;           /* lock */
    uint64_t committed;              /* lock */
    uint64_t rolled_back;            /* lock */
    uint64_t refused_again;          /* lock: releases answered from `refused` */
    uint64_t refusals[NERRORS];      /* lock: by -error */

    pthread_mutex_t conn_lock;
    struct conn *conns; /* conn_lock */
    unsigned nconns;    /* conn_lock */
    size_t inflight;    /* conn_lock: body bytes reserved */

    pthread_mutex_t job_lock;
    pthread_cond_t job_cv;         /* job_lock: a job arrived, or stop */
    struct req *jobs, **jobs_tail; /* job_lock */
    int stopping;                  /* job_lock (and read by the reaper under it) */
    pthread_t worker, reaper;
    int threads_started;
};

/* The endpoint's id; "" in the moment between the daemon's start and the
 * id's (no request can name it then). */
static inline const char *hkn_ep_id(hkn_endpoint *ep) {
    return atomic_load(&ep->id_set) ? ep->id : "";
}

/* ---- endpoint_admit.c: connections and request checks ------------------ */

/* libmicrohttpd's connection notification: tracks each connection from
 * accept to close (cls: the endpoint). */
void hkn_ep_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code);
/* The reaper thread (arg: the endpoint): shuts down connections whose
 * request is past its deadline, until the endpoint stops. */
void *hkn_ep_reaper_main(void *arg);
/* The tracked connection of c; NULL when it is untracked. */
struct conn *hkn_ep_conn_of(struct MHD_Connection *c);
/* NULL, or the message of the 503 for a connection over a limit. */
const char *hkn_ep_over_limit(hkn_endpoint *ep, struct conn *k);
/* Reserves n more body bytes for r; 0 when they do not fit. */
int hkn_ep_reserve(hkn_endpoint *ep, struct req *r, size_t n);
/* Gives back what r reserved. */
void hkn_ep_unreserve(hkn_endpoint *ep, struct req *r);
/* NULL when Host and Origin are acceptable, else why not. */
const char *hkn_ep_foreign(const hkn_endpoint *ep, struct MHD_Connection *c);

enum body_kind { B_NONE, B_JSON, B_FRAME, B_OTHER };
/* What a POST's body is declared as. */
enum body_kind hkn_ep_body_kind(struct MHD_Connection *c);
/* NULL when a POST to route may carry a body of kind k, else why not. */
const char *hkn_ep_body_refused(enum route route, enum body_kind k);
/* 1 when no token is configured or the request carries it. */
int hkn_ep_authorized(hkn_endpoint *ep, struct MHD_Connection *c);

/* ---- endpoint_handlers.c: responses and handlers ------------------------ */

/* Queues text (malloc'd, consumed; NULL: MHD_NO) as the answer to c. */
enum MHD_Result hkn_ep_reply(struct MHD_Connection *c, unsigned status, char *text,
                             const char *type);
/* Prints obj (consumed) as JSON text ending in a newline; NULL on no memory. */
char *hkn_ep_json_text(cJSON *obj);
cJSON *hkn_ep_error_json(int err, const char *msg);
enum MHD_Result hkn_ep_reply_error(struct MHD_Connection *c, unsigned status, int err,
                                   const char *msg);
/* The client's address, for log lines. */
const char *hkn_ep_peer(const struct conn *k);
/* The worker thread (arg: the endpoint): applies queued releases and
 * rollbacks one at a time and resumes each connection with its answer. */
void *hkn_ep_worker_main(void *arg);
/* GET /v1/status and GET /metrics, answered on the loop thread. */
enum MHD_Result hkn_ep_handle_status(hkn_endpoint *ep, struct MHD_Connection *c);
enum MHD_Result hkn_ep_handle_metrics(hkn_endpoint *ep, struct MHD_Connection *c);

#endif

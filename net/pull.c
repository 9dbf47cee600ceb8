/*
 * The puller: polls a static origin (any HTTP server or CDN) for releases.
 *
 * Layout served by the origin (what `hotkern sign` writes):
 *   <url>                         manifest.json
 *   <url>.sig                     its detached Ed25519 signature, base64
 *   <base>/artifacts/<sha256>     each artifact, named by content hash
 * Naming artifacts by hash makes them immutable, so caches never serve a
 * stale one under a new manifest, and many hosts can share one origin.
 *
 * The state (net/state.c) is the one anti-rollback record shared with the
 * push endpoint and other pullers on the same directory; the poll holds its
 * transaction from the version check to the record.
 *
 * A host of a fleet (net/fleet.c): between verification and the artifacts,
 * the gate says whether this host takes a rollout's release now; its id,
 * labels and rollout metrics are the fleet object's, its /metrics server
 * (when the options ask for one) net/scrape.c's.
 *
 * Configuration. The puller takes the public hk_pull_options, whose defaults
 * live here (hk_pull_options_init_size), and what its caller resolved from
 * them (hkn_pull_resolved: loaded keys, the state directory), net/api.c for
 * hk_pull_start, cli/net_cmds.c for `hotkern pull`.
 *
 * Logs (eng.log, subsystem "pull"): each poll and 304 (debug), a new release
 * and its application (info), a refused manifest or release and each failed
 * poll with the retry's number and delay (warn).
 *
 * Threads. The poll thread owns the curl handle and the validators; the
 * counters and the stop flag are shared with the API under `lock`. Stopping
 * wakes the sleep at once and aborts a transfer through the progress callback.
 *
 * One poll, and what is kept between polls: at "one poll" below. The key
 * list (net/keys.c) is fetched, with validators of its own, whenever the
 * manifest is new, before it is verified (so that a rotation and a release
 * signed by the new keys published together are taken in one poll), after
 * a key list's poll that failed, and otherwise every KEYS_EVERY answered
 * polls: an idle host asks the origin 1 + 1/KEYS_EVERY times a poll.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <sodium.h>

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
    unsigned failures; /* consecutive failed polls, for the backoff */
    unsigned keys_wait; /* poll thread: answered polls until the key list's next */
    int retry;         /* the last poll's engine outcome was transient (poll.retry) */

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

/* The one place of the puller's defaults: hkn_pull_create falls back on
 * them for a zero interval, backoff, timeout or cap. One a line: the shape of every
 * hk_*_options_init_size. */
int hk_pull_options_init_size(hk_pull_options *o, size_t size) {
    hk_pull_options d;
    memset(&d, 0, sizeof d);
    d.interval_ms = 10000;
    d.jitter_pct = 10;
    d.max_backoff_ms = 300000;
    d.connect_timeout_ms = 5000;
    d.total_timeout_ms = 60000;
    d.low_speed_bytes = 1024;
    d.low_speed_s = 15;
    d.max_manifest_bytes = 1u << 20;
    d.max_artifact_bytes = 64u << 20;
    return hkb_sized_init(o, size, &d, sizeof d, HKN_PULL_OPTIONS_SIZE0);
}

/* o as the puller keeps it: zeros replaced by the defaults, the jitter
 * clamped, the pointers the caller owns cleared (the strings are copied by
 * hkn_pull_create). The endpoint's with_defaults has the same shape over
 * its own fields. */
static hk_pull_options with_defaults(const hk_pull_options *o) {
    static const hkn_field zero_is_default[] = {
        HKN_FIELD(hk_pull_options, interval_ms),
        HKN_FIELD(hk_pull_options, max_backoff_ms),
        HKN_FIELD(hk_pull_options, max_manifest_bytes),
        HKN_FIELD(hk_pull_options, max_artifact_bytes),
        HKN_FIELD(hk_pull_options, connect_timeout_ms),
        HKN_FIELD(hk_pull_options, total_timeout_ms),
    };
    hk_pull_options d, r = *o;
    hk_pull_options_init(&d);
    hkn_zero_defaults(&r, &d, zero_is_default, sizeof zero_is_default / sizeof *zero_is_default);
    if (r.jitter_pct > 100)
        r.jitter_pct = 100;
    r.url = r.artifact_base = r.ca_file = r.state_dir = NULL;
    r.host_id = r.host_labels = r.metrics_address = r.keys_url = NULL;
    r.trusted_keys = NULL;
    r.ntrusted_keys = 0;
    r.swap = NULL;
    return r;
}

static void count(hkn_puller *p, uint64_t *field, uint64_t n) {
    pthread_mutex_lock(&p->lock);
    *field += n;
    pthread_mutex_unlock(&p->lock);
}

/* ---- transfers --------------------------------------------------------- */

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud) {
    struct buf *b = ud;
    size_t n = size * nmemb;
    if (n > b->limit - b->len) {
        /* Returning short makes curl fail with CURLE_WRITE_ERROR: the cap
         * holds even when the server sent no Content-Length. */
        b->over = 1;
        return 0;
    }
    if (b->len + n + 1 > b->alloc) {
        size_t na = b->alloc ? b->alloc : 16384;
        while (na < b->len + n + 1)
            na *= 2;
        char *nd = realloc(b->data, na);
        if (!nd)
            return 0;
        b->data = nd;
        b->alloc = na;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow) {
    hkn_puller *p = ud;
    return __atomic_load_n(&p->stop, __ATOMIC_RELAXED) ? 1 : 0;
}

/* GETs url into b (cap b->limit). *status gets the HTTP code. With
 * conditional set, sends the stored validators. */
static int fetch(hkn_puller *p, const char *url, int conditional, struct buf *b, long *status,
                 hk_report *rep) {
    CURL *c = p->curl;
    struct curl_slist *hdrs = NULL;
    int err = 0;
    *status = 0;
    /* Reset clears per-request options but keeps the connection cache, so
     * polls reuse their TCP/TLS connection. */
    curl_easy_reset(c);
    p->errbuf[0] = '\0';
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, p->errbuf);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "hotkern/0.1");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)p->opt.connect_timeout_ms);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)p->opt.total_timeout_ms);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, (long)p->opt.low_speed_bytes);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)p->opt.low_speed_s);
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)b->limit);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, p);
    if (p->ca_file)
        curl_easy_setopt(c, CURLOPT_CAINFO, p->ca_file);
    if (conditional) {
        /* 1: the manifest's validators; 2: the key list's. */
        const char *etag = conditional == 2 ? p->keys_etag : p->etag;
        const char *lm = conditional == 2 ? p->keys_lm : p->last_modified;
        char h[512];
        if (etag && snprintf(h, sizeof h, "If-None-Match: %s", etag) < (int)sizeof h)
            hdrs = curl_slist_append(hdrs, h);
        if (lm && snprintf(h, sizeof h, "If-Modified-Since: %s", lm) < (int)sizeof h)
            hdrs = curl_slist_append(hdrs, h);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    }
    count(p, &p->stats.requests, 1);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    count(p, &p->stats.bytes, b->len);
    if (rc == CURLE_OK) {
        if (*status == 404 && conditional == 2)
            err = HK_ERR_NOT_FOUND; /* no key list published: not a failure */
        else if (*status != 200 && *status != 304)
            err = hku_fail(rep, HK_ERR_NETWORK, "GET %s: HTTP %ld", url, *status);
    } else if (rc == CURLE_OPERATION_TIMEDOUT) {
        err = hku_fail(rep, HK_ERR_TIMEOUT, "GET %s: timed out (%s)", url,
                       p->errbuf[0] ? p->errbuf : curl_easy_strerror(rc));
    } else if (b->over || rc == CURLE_FILESIZE_EXCEEDED) {
        err = hku_fail(rep, HK_ERR_TOO_LARGE, "GET %s: more than %zu bytes", url, b->limit);
    } else if (rc == CURLE_ABORTED_BY_CALLBACK) {
        err = hku_fail(rep, HK_ERR_CLOSED, "GET %s: stopped", url);
    } else {
        err = hku_fail(rep, HK_ERR_NETWORK, "GET %s: %s", url,
                       p->errbuf[0] ? p->errbuf : curl_easy_strerror(rc));
    }
    curl_slist_free_all(hdrs);
    if (err && err != HK_ERR_NOT_FOUND)
        count(p, &p->stats.errors, 1);
    return err;
}

static char *header_value(CURL *c, const char *name) {
    struct curl_header *h = NULL;
    if (curl_easy_header(c, name, 0, CURLH_HEADER, -1, &h) != CURLHE_OK || !h || !h->value)
        return NULL;
    return strdup(h->value);
}

/* ---- one poll ---------------------------------------------------------- */

/*
 * One poll: a conditional GET of the manifest (If-None-Match with the last
 * ETag, If-Modified-Since with the last Last-Modified), so an idle fleet costs
 * the origin a 304 each. On a new manifest: the signature, verification (see
 * release.c), then every artifact this host may use (net/shipped.c) into
 * memory with its declared size as a hard cap, its hash checked, and only
 * then the engine's apply. Nothing is
 * applied or persisted before every byte is verified, so a transfer that dies
 * midway changes nothing. The validators (ETag, Last-Modified) are kept only
 * for a manifest that verified and was dealt with for good (applied, refused
 * by the engine with a verdict on its bytes, or a replay), so a transient
 * failure (a missing or stale signature, a truncated artifact, an engine out
 * of device memory or busy) is retried, with backoff, instead of being
 * hidden behind a 304; a 304 reports the kept manifest's outcome again.
 * The validators are the origin's, and an origin may change its ETag for the
 * same bytes: the releases the engine refused are also remembered by their
 * manifest's hash (net/refused.c), and the same manifest seen again is
 * answered with the first refusal, before any artifact is fetched. The gate
 * (net/fleet.c) comes before that answer and the artifacts: a host outside a
 * rollout's step, or running its release already, fetches nothing.
 */
static void keep_validators(hkn_puller *p, char *etag, char *lm) {
    free(p->etag);
    free(p->last_modified);
    p->etag = etag;
    p->last_modified = lm;
}

static int save_artifacts(hkn_puller *p, const hkn_manifest *m, struct buf *arts, hk_report *rep) {
    char path[PATH_MAX];
    for (size_t i = 0; i < m->nartifacts; i++) {
        if (snprintf(path, sizeof path, "%s/%s", p->save_dir, m->artifacts[i].name) >=
            (int)sizeof path)
            return hku_fail(rep, HK_ERR_INVALID, "save path too long");
        int err = hku_write_atomic(path, arts[i].data ? arts[i].data : "", arts[i].len, 0644, rep);
        if (err)
            return err;
    }
    return 0;
}

/* One poll's transfers, and what it decided. */
struct poll {
    struct buf man, sig, arts[HKN_MAX_ARTIFACTS];
    hkn_manifest m;
    hkn_trust trust; /* the keys in force (net/keys.c), read in the state's transaction */
    char *etag, *lm; /* the manifest's validators, until kept */
    char mhash[65];  /* the release's identity (net/refused.c) */
    hkn_gate gate;   /* what the host does with it (net/fleet.c) */
    int keep;        /* 1: this manifest verified and is dealt with for good */
    int done;        /* 1: nothing more to do this poll (err says how it went) */
    int retry;       /* 1: the engine could not apply it now (not a verdict) */
    int catchup;     /* 1: the manifest the state records already, whose release
                      * this host is to run and does not (a restart): applied
                      * without a new record */
};

/* The manifest (conditional) and its signature. A 304 is done: the kept
 * manifest's outcome stands, so a refusal stays visible in the stats
 * instead of reading as success. */
static int fetch_manifest(hkn_puller *p, struct poll *q, int conditional, hk_report *rep) {
    long status = 0;
    int err = fetch(p, p->url, conditional, &q->man, &status, rep);
    if (err)
        return err;
    if (status == 304) {
        count(p, &p->stats.not_modified, 1);
        err = p->kept_err;
        if (err)
            hku_fail(rep, err, "%s", p->kept_message);
        hkn_log(&p->eng, HK_LOG_DEBUG, "pull", "%s: 304 not modified%s%s", p->url,
                err ? ": still refused: " : "", err ? p->kept_message : "");
        q->done = 1;
        return err;
    }
    q->etag = header_value(p->curl, "ETag");
    q->lm = header_value(p->curl, "Last-Modified");
    err = fetch(p, p->sig_url, 0, &q->sig, &status, rep);
    if (err && status == 404) {
        /* A missing signature is the release's fault, not the network's:
         * verification words the refusal. */
        hk_report_clear(rep);
        q->sig.len = 0;
        err = 0;
    }
    return err;
}

/* A publisher replaces the signature, then the manifest: a poll between the
 * two renames reads a pair that does not verify. Before that counts as a
 * refusal, both are fetched once more (unconditionally). */
static int refetch(hkn_puller *p, struct poll *q, hk_report *rep) {
    free(q->man.data);
    free(q->sig.data);
    free(q->etag);
    free(q->lm);
    q->etag = q->lm = NULL;
    q->man = (struct buf){.p = p, .limit = p->opt.max_manifest_bytes};
    q->sig = (struct buf){.p = p, .limit = 4096};
    hk_report_clear(rep);
    hkn_log(&p->eng, HK_LOG_DEBUG, "pull",
            "%s: the signature did not verify: fetching manifest and signature again", p->url);
    return fetch_manifest(p, q, 0, rep);
}

/* The accepted manifest seen again: with a rollout, it is parsed (the
 * signature verified, the state's record equal) so that the gate decides
 * whether this host runs what it should (it may have restarted on
 * nothing); without one, nothing is to be done, as ever. */
static int seen_again(hkn_puller *p, struct poll *q) {
    hk_report r = HK_REPORT_INIT;
    int ok = hkn_verify_manifest(&q->trust, NULL, q->man.data, q->man.len, q->sig.data, q->sig.len,
                                 (int64_t)time(NULL), &q->m, &r) == 0;
    hk_report_clear(&r);
    if (ok && q->m.rollout.present)
        return q->catchup = 1;
    if (ok)
        hkn_manifest_free(&q->m);
    return 0;
}

/* A verification's refusal, for the rollout metrics: the module and
 * release when the manifest parsed (its signature verified: an expiry),
 * the module served last otherwise. */
static void note_unverified(hkn_puller *p, struct poll *q, int err) {
    char ident[65];
    hkn_manifest m;
    uint64_t release = 0;
    const char *module = NULL;
    hk_report r = HK_REPORT_INIT;
    int parsed = err == HK_ERR_EXPIRED && hkn_manifest_parse(q->man.data, q->man.len, &m, &r) == 0;
    hk_report_clear(&r);
    if (parsed) {
        release = m.release;
        module = m.module;
    }
    hkn_sha256_hex(q->man.data ? q->man.data : "", q->man.len, ident);
    /* A manifest that does not read (a rollout of rules this host does not
     * know) is refused as a release is: reason "other". */
    hkn_fleet_refused(p->fleet, module, release, ident,
                      err == HK_ERR_INVALID ? HK_ERR_REJECTED : err, NULL);
    if (parsed)
        hkn_manifest_free(&m);
}

/* Verifies the manifest (within the state's transaction); the release
 * already running, without a rollout, needs nothing more. */
static int verify_manifest(hkn_puller *p, struct poll *q, hk_report *rep) {
    int err = hkn_trust_current(&p->trust, p->state, &q->trust, rep);
    if (!err)
        err = hkn_verify_manifest(&q->trust, p->state, q->man.data, q->man.len, q->sig.data,
                                  q->sig.len, (int64_t)time(NULL), &q->m, rep);
    if (err == HK_ERR_SIGNATURE && !(err = refetch(p, q, rep)))
        err = hkn_verify_manifest(&q->trust, p->state, q->man.data, q->man.len, q->sig.data,
                                  q->sig.len, (int64_t)time(NULL), &q->m, rep);
    if (err == HK_ERR_REPLAY && rep->version == hkn_state_get(p->state, rep->module)) {
        hk_report_clear(rep);
        if (seen_again(p, q))
            return 0;
        /* The release already running, seen again (a restart, or an origin
         * without validators): nothing to do. */
        hkn_log(&p->eng, HK_LOG_DEBUG, "pull", "%s: %s v%llu, the release that runs", p->url,
                rep->module, (unsigned long long)rep->version);
        q->keep = q->done = 1;
        return 0;
    }
    if (err) {
        hkn_log(&p->eng, HK_LOG_WARN, "pull", "refused the manifest at %s: %s: %s", p->url,
                hk_err_name(err), rep->message);
        /* Only a manifest that verified keeps its validators: a signature
         * that is missing or stale now (a CDN or an upload serving the new
         * manifest before its .sig) is fetched again at the next poll, with
         * backoff, instead of hiding behind 304s forever. A replay is final. */
        q->keep = err == HK_ERR_REPLAY;
        count(p, &p->stats.refused, 1);
        if (err != HK_ERR_REPLAY)
            note_unverified(p, q, err);
        return err;
    }
    return 0;
}

/* The gate (net/fleet.c): whether this host takes the release now. Outside
 * the step, or running its release already, the host keeps what it runs,
 * and the manifest is recorded as accepted (the next step is a newer one).
 * Otherwise, unless the engine refused these very bytes already (an origin
 * whose ETag changes defeats the validators; a rollout's next step re-signs
 * the same release), the artifacts are fetched. */
static int gate(hkn_puller *p, struct poll *q, hk_report *rep) {
    const hkn_manifest *m = &q->m;
    int err;
    hkn_fleet_gate(p->fleet, &p->eng, m, &q->gate);
    if (q->gate.action != HKN_GATE_APPLY) {
        int outside = q->gate.action == HKN_GATE_OUTSIDE;
        hkn_log(&p->eng, outside ? HK_LOG_INFO : HK_LOG_DEBUG, "pull",
                "%s: %s v%llu (release %llu, step %u of %zu): %s; release %llu runs", p->url,
                m->module, (unsigned long long)m->version, (unsigned long long)m->release,
                m->rollout.step + 1, m->rollout.nsteps,
                outside ? "this host is not in the step yet" : "this host runs it already",
                (unsigned long long)q->gate.running);
        if (!q->catchup && (err = hkn_state_accept(p->state, m->module, m->version, rep)))
            return err;
        q->keep = q->done = 1;
        return 0;
    }
    if ((err = hkn_refused_check(p->refused, m, q->man.data, q->man.len, q->mhash, rep))) {
        q->keep = 1;
        count(p, &p->stats.refused, 1);
        hkn_log(&p->eng, HK_LOG_DEBUG, "pull", "%s: %s", p->url, rep->message);
        return err;
    }
    hkn_log(&p->eng, HK_LOG_INFO, "pull", "%s: new release %s v%llu (%zu artifact(s))%s", p->url,
            m->module, (unsigned long long)m->version, m->nartifacts,
            q->catchup ? ", which this host is to run and does not (catching up)" : "");
    return 0;
}

/* The artifacts of the verified manifest this host may use (its headers,
 * the one it applies and, for a shipped cubin, the source it builds should
 * the cubin not load: net/shipped.c), or every one when they are saved,
 * each capped at its declared size and checked against its hash. */
static int fetch_artifacts(hkn_puller *p, struct poll *q, hk_report *rep) {
    int need[HKN_MAX_ARTIFACTS];
    hkn_shipped_needed(&q->m, &p->eng, need);
    for (size_t i = 0; i < q->m.nartifacts; i++) {
        const hkn_artifact *a = &q->m.artifacts[i];
        char url[4096];
        long status = 0;
        int err;
        if (!need[i] && !p->save_dir)
            continue;
        if (a->size > p->opt.max_artifact_bytes) {
            q->keep = 1;
            count(p, &p->stats.refused, 1);
            err = hku_fail(rep, HK_ERR_TOO_LARGE,
                           "artifact '%s' declares %llu bytes, over the cap of %zu", a->name,
                           (unsigned long long)a->size, p->opt.max_artifact_bytes);
            hkn_fleet_refused(p->fleet, q->m.module, q->m.release, q->mhash, err, NULL);
            return err;
        }
        if (snprintf(url, sizeof url, "%s/artifacts/%s", p->base, a->sha256) >= (int)sizeof url)
            return hku_fail(rep, HK_ERR_INVALID, "artifact URL too long");
        /* The declared size is the cap: a server sending more is wrong. */
        q->arts[i].p = p;
        q->arts[i].limit = (size_t)a->size;
        err = fetch(p, url, 0, &q->arts[i], &status, rep);
        if (err == HK_ERR_TOO_LARGE)
            err = hku_fail(rep, HK_ERR_HASH,
                           "artifact '%s': served more than the declared %llu "
                           "bytes",
                           a->name, (unsigned long long)a->size);
        if (err == HK_ERR_HASH)
            hkn_fleet_refused(p->fleet, q->m.module, q->m.release, q->mhash, err, NULL);
        if (err)
            return err;
        if ((err = hkn_verify_artifact(a, q->arts[i].data ? q->arts[i].data : "", q->arts[i].len,
                                       rep))) {
            count(p, &p->stats.refused, 1);
            hkn_fleet_refused(p->fleet, q->m.module, q->m.release, q->mhash, err, NULL);
            return err;
        }
    }
    return 0;
}

/* Commits the verified release and deals with the engine's outcome. A
 * verdict on these bytes (hk_err_is_verdict) keeps the validators, so that
 * a refused build is not retried every poll. Anything else (the device out
 * of memory, the engine busy, a build that timed out, a canary that could
 * not run) is the host's state: the validators are not kept, so the next
 * poll fetches the manifest again instead of a 304, and it comes after the
 * backoff (q->retry). A quarantined image's release stays recorded as
 * seen, so that a restarted puller does not apply it again (a replay); a
 * newer release is applied as usual. A host catching up with the manifest
 * its state records already applies it without a record. */
static int apply_release(hkn_puller *p, struct poll *q, hk_report *rep) {
    const hkn_manifest *m = &q->m;
    const void *bytes[HKN_MAX_ARTIFACTS];
    size_t sizes[HKN_MAX_ARTIFACTS];
    for (size_t i = 0; i < m->nartifacts; i++) {
        bytes[i] = q->arts[i].data;
        sizes[i] = q->arts[i].len;
    }
    int verdict = 1, err;
    if (q->catchup) {
        err = hkn_release_apply(&p->eng, m, bytes, sizes, p->origin, rep);
        if (err && hkn_refusal_is_final(err))
            hkn_refused_add(p->refused, m->module, m->release, q->mhash, err, rep->message);
    } else {
        err = hkn_release_commit(&p->eng, p->state, p->refused, m, bytes, sizes, q->mhash,
                                 p->origin, 1, &verdict, rep);
    }
    if (!verdict) /* the state's error: retried at the next poll */
        return err;
    q->keep = !err || hk_err_is_verdict(err);
    q->retry = !q->keep;
    if (err == HK_ERR_QUARANTINED) {
        count(p, &p->stats.refused, 1);
        hkn_log(&p->eng, HK_LOG_WARN, "pull", "%s v%llu from %s is quarantined: %s", m->module,
                (unsigned long long)m->version, p->url, rep->message);
    } else if (err && q->retry) {
        hkn_log(&p->eng, HK_LOG_WARN, "pull",
                "the engine could not apply %s v%llu from %s now: %s: %s (tried again)", m->module,
                (unsigned long long)m->version, p->url, hk_err_name(err), rep->message);
    } else if (err) {
        count(p, &p->stats.refused, 1);
        hkn_log(&p->eng, HK_LOG_WARN, "pull", "the engine refused %s v%llu from %s: %s: %s",
                m->module, (unsigned long long)m->version, p->url, hk_err_name(err), rep->message);
    } else {
        count(p, &p->stats.applied, 1);
        hkn_fleet_applied(p->fleet, m);
        hkn_log(&p->eng, HK_LOG_INFO, "pull", "applied %s v%llu (release %llu) from %s", m->module,
                (unsigned long long)m->version, (unsigned long long)m->release, p->url);
    }
    if (err)
        hkn_fleet_refused(p->fleet, m->module, m->release, q->mhash, err, rep->canary_refusal);
    return err;
}

/* Keeps the validators of a manifest dealt with for good, counts the poll
 * and frees what it fetched. */
static void poll_finish(hkn_puller *p, struct poll *q, int err, const hk_report *rep) {
    p->retry = q->retry;
    if (q->keep) {
        keep_validators(p, q->etag, q->lm);
        q->etag = q->lm = NULL;
        p->kept_err = err;
        snprintf(p->kept_message, sizeof p->kept_message, "%s", err ? rep->message : "");
    }
    pthread_mutex_lock(&p->lock);
    p->stats.polls++;
    p->stats.last_error = err;
    snprintf(p->stats.last_message, sizeof p->stats.last_message, "%s", err ? rep->message : "");
    pthread_mutex_unlock(&p->lock);
    free(q->etag);
    free(q->lm);
    free(q->man.data);
    free(q->sig.data);
    for (size_t i = 0; i < HKN_MAX_ARTIFACTS; i++)
        free(q->arts[i].data);
    hkn_manifest_free(&q->m);
}

/* Idle polls between two of the key list's (see the opening). */
#define KEYS_EVERY 10

/* The key list (net/keys.c), conditionally: a 304 or a 404 (none
 * published) changes nothing. A list taken, or refused for good (an older
 * or the same version, which a restart meets again), keeps its validators;
 * another refusal (a signature file not yet replaced, a list that does not
 * read) is fetched again at the next poll. Returns 0 or the refusal. */
static int poll_keys(hkn_puller *p, hk_report *rep) {
    struct buf doc = {.p = p, .limit = 64 << 10}, sig = {.p = p, .limit = 4096};
    long status = 0;
    hkn_trust got;
    int keep = 0, err = fetch(p, p->keys_url, 2, &doc, &status, rep);
    char *etag = NULL, *lm = NULL, line[HKN_MAX_KEYS * (HKN_KEY_ID_CHARS + 1) + 64];
    if (err == HK_ERR_NOT_FOUND || (!err && status == 304)) {
        hk_report_clear(rep);
        err = 0;
        goto out;
    }
    if (err)
        goto out;
    etag = header_value(p->curl, "ETag");
    lm = header_value(p->curl, "Last-Modified");
    if ((err = fetch(p, p->keys_sig_url, 0, &sig, &status, rep)) && status == 404) {
        hk_report_clear(rep);
        sig.len = err = 0; /* verification words the refusal */
    }
    hkn_state_begin(p->state);
    if (!err)
        err = hkn_keylist_accept(&p->trust, p->state, doc.data, doc.len, sig.data, sig.len,
                                 (int64_t)time(NULL), &got, rep);
    hkn_state_end(p->state);
    if (!err) {
        keep = 1;
        hkn_trust_describe(&got, line, sizeof line);
        hkn_log(&p->eng, HK_LOG_INFO, "pull", "%s: trusting %s", p->keys_url, line);
    } else if (err == HK_ERR_REPLAY) {
        keep = 1;
        hkn_log(&p->eng, HK_LOG_DEBUG, "pull", "%s: %s", p->keys_url, rep->message);
        hk_report_clear(rep);
        err = 0;
    } else if (err != HK_ERR_NETWORK && err != HK_ERR_TIMEOUT && err != HK_ERR_CLOSED) {
        count(p, &p->keys_refused, 1);
        hkn_log(&p->eng, HK_LOG_WARN, "pull", "refused the key list at %s: %s: %s", p->keys_url,
                hk_err_name(err), rep->message);
    }
out:
    if (keep) {
        free(p->keys_etag);
        free(p->keys_lm);
        p->keys_etag = etag;
        p->keys_lm = lm;
    } else {
        free(etag);
        free(lm);
    }
    free(doc.data);
    free(sig.data);
    return err;
}

/* The key list in force, for the metrics. */
static void note_trust(hkn_puller *p) {
    hkn_trust t;
    hk_report r = HK_REPORT_INIT;
    if (hkn_trust_current(&p->trust, p->state, &t, &r) == 0) {
        pthread_mutex_lock(&p->lock);
        p->keys_version = t.version;
        p->keys_threshold = t.threshold > 0 ? t.threshold : 1;
        pthread_mutex_unlock(&p->lock);
    }
    hk_report_clear(&r);
}

int hkn_pull_poll(hkn_puller *p, hk_report *rep) {
    struct poll q;
    hk_report local = HK_REPORT_INIT;
    if (!rep)
        rep = &local;
    memset(&q, 0, sizeof q);
    q.man = (struct buf){.p = p, .limit = p->opt.max_manifest_bytes};
    q.sig = (struct buf){.p = p, .limit = 4096};

    hkn_log(&p->eng, HK_LOG_DEBUG, "pull", "polling %s%s", p->url,
            p->etag || p->last_modified ? " (conditional)" : "");
    int err = fetch_manifest(p, &q, 1, rep);
    /* The key list once the origin answered (an origin down is one error a
     * poll), before the manifest is verified. */
    hk_report krep = HK_REPORT_INIT;
    int kerr = 0;
    if (p->keys_url && (!err || q.done) && (!q.done || !p->keys_wait--)) {
        kerr = poll_keys(p, &krep);
        p->keys_wait = kerr ? 0 : KEYS_EVERY - 1;
    }
    note_trust(p);
    if (!err && !q.done) {
        /* From the version check to the record, under the shared state's
         * transaction. */
        hkn_state_begin(p->state);
        err = verify_manifest(p, &q, rep);
        if (!err && !q.done)
            err = gate(p, &q, rep);
        if (!err && !q.done)
            err = fetch_artifacts(p, &q, rep);
        if (!err && !q.done && p->save_dir)
            err = save_artifacts(p, &q.m, q.arts, rep);
        if (!err && !q.done)
            err = apply_release(p, &q, rep);
        hkn_state_end(p->state);
    }
    /* A refused key list is the poll's outcome when the release's is fine:
     * the stats and the backoff say so. */
    if (kerr && !err) {
        err = kerr;
        hku_fail(rep, kerr, "%s", krep.message);
    }
    hk_report_clear(&krep);
    poll_finish(p, &q, err, rep);
    /* What runs may have changed by other ways (a rollback, a restore). */
    hkn_fleet_refresh(p->fleet, &p->eng);
    hk_report_clear(&local);
    return err;
}

/* ---- the thread -------------------------------------------------------- */

static unsigned next_delay(hkn_puller *p, int err) {
    uint64_t d = p->opt.interval_ms;
    /* Transient trouble (network, timeouts, an origin mid-publish) backs off
     * exponentially so a fleet does not hammer a struggling origin. */
    /* So does an engine that could not apply a release now (the device out
     * of memory, busy): the release is fetched and tried again. */
    if (err == HK_ERR_NETWORK || err == HK_ERR_TIMEOUT || err == HK_ERR_HASH ||
        err == HK_ERR_TOO_LARGE || err == HK_ERR_IO || err == HK_ERR_SIGNATURE ||
        err == HK_ERR_INVALID || (err && p->retry)) {
        if (p->failures < 20)
            p->failures++;
        for (unsigned i = 0; i < p->failures && d < p->opt.max_backoff_ms; i++)
            d *= 2;
        if (d > p->opt.max_backoff_ms)
            d = p->opt.max_backoff_ms;
    } else {
        p->failures = 0;
    }
    /* Jitter spreads a fleet's polls so they do not arrive in lockstep. */
    uint64_t j = d * p->opt.jitter_pct / 100;
    if (j > 0 && j < UINT32_MAX / 2)
        d = d - j + randombytes_uniform((uint32_t)(2 * j + 1));
    return (unsigned)(d ? d : 1);
}

/* Records and says when the next poll comes, and why so late after a
 * failure (poll thread). */
static void log_next(hkn_puller *p, int err, const hk_report *rep, unsigned delay) {
    pthread_mutex_lock(&p->lock);
    p->stats.failures = p->failures;
    p->stats.next_poll_ms = delay;
    pthread_mutex_unlock(&p->lock);
    if (p->failures && err)
        hkn_log(&p->eng, HK_LOG_WARN, "pull",
                "poll of %s failed (%s: %s): retry %u in %u ms (backoff up to %u ms)", p->url,
                hk_err_name(err), rep->message, p->failures, delay, p->opt.max_backoff_ms);
    else
        hkn_log(&p->eng, HK_LOG_DEBUG, "pull", "next poll of %s in %u ms", p->url, delay);
}

static void *poll_thread(void *arg) {
    /* Named for top -H, gdb and profilers (at most 15 characters). */
    pthread_setname_np(pthread_self(), "hk-pull");
    hkn_puller *p = arg;
    for (;;) {
        hk_report rep = HK_REPORT_INIT;
        int err = hkn_pull_poll(p, &rep);
        unsigned delay = next_delay(p, err);
        log_next(p, err, &rep, delay);
        hk_report_clear(&rep);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += delay / 1000;
        ts.tv_nsec += (long)(delay % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&p->lock);
        while (!p->stop && pthread_cond_timedwait(&p->wake, &p->lock, &ts) != ETIMEDOUT)
            ;
        int stop = p->stop;
        pthread_mutex_unlock(&p->lock);
        if (stop)
            break;
    }
    return NULL;
}

/* ---- lifecycle --------------------------------------------------------- */

static char *dup_or_null(const char *s, int *fail) {
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *fail = 1;
    return d;
}

/* 0 when every byte of a URL is printable ASCII (what RFC 3986 allows; other
 * bytes are percent-encoded), else HK_ERR_INVALID naming the first other
 * one. The URL labels the puller's metrics and reaches its logs: a CR, LF or
 * a byte that is no UTF-8 there would break the /metrics text and the log
 * lines. */
static int url_bytes_ok(const char *what, const char *url, hk_report *rep) {
    for (size_t i = 0; url && url[i]; i++) {
        unsigned char c = (unsigned char)url[i];
        if (c <= 0x20 || c >= 0x7f)
            return hku_fail(rep, HK_ERR_INVALID,
                            "%s has byte 0x%02x at offset %zu: a URL is printable ASCII "
                            "without spaces (percent-encode other bytes)",
                            what, c, i);
    }
    return 0;
}

/* The key list's URL and its signature's: keys_url, or keys.json in the
 * manifest's directory when NULL; none for "". */
static int keys_urls(hkn_puller *p, const char *given, int *oom, hk_report *rep) {
    if (given && !given[0])
        return 0;
    int err = url_bytes_ok("keys_url", given, rep);
    if (err)
        return err;
    if (given && strncmp(given, "http://", 7) && strncmp(given, "https://", 8))
        return hku_fail(rep, HK_ERR_INVALID, "keys_url must be http:// or https://: %s", given);
    if (given) {
        p->keys_url = dup_or_null(given, oom);
    } else {
        const char *slash = strrchr(p->url, '/');
        int n = (int)(slash - p->url);
        if (asprintf(&p->keys_url, "%.*s/keys.json", n, p->url) < 0)
            p->keys_url = NULL, *oom = 1;
    }
    if (p->keys_url && asprintf(&p->keys_sig_url, "%s.sig", p->keys_url) < 0)
        p->keys_sig_url = NULL, *oom = 1;
    return 0;
}

int hkn_pull_create(const hk_pull_options *o, const hkn_pull_resolved *r, const hkn_engine *e,
                    hkn_puller **out, hk_report *rep) {
    *out = NULL;
    int err = 0, oom = 0;
    if (!o || !o->url || !r || !e || !e->apply)
        return hku_fail(rep, HK_ERR_INVALID, "puller needs a URL and an apply function");
    if ((err = url_bytes_ok("the URL", o->url, rep)) ||
        (err = url_bytes_ok("artifact_base", o->artifact_base, rep)))
        return err;
    if (strncmp(o->url, "http://", 7) && strncmp(o->url, "https://", 8))
        return hku_fail(rep, HK_ERR_INVALID, "URL must be http:// or https://: %s", o->url);
    if (hkn_crypto_init())
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "libsodium failed to initialise");
    /* Process-wide and idempotent; not thread-safe before 7.84, so it runs
     * here, on the caller's thread, before any puller thread exists. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "curl_global_init failed");
    hkn_puller *p = calloc(1, sizeof *p);
    if (!p)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&p->lock, NULL);
    hku_cond_init(&p->wake); /* its timed waits: the monotonic clock */
    p->eng = *e;
    p->opt = with_defaults(o);
    p->trust = r->trust;
    p->url = dup_or_null(o->url, &oom);
    p->ca_file = dup_or_null(o->ca_file, &oom);
    p->state_dir = dup_or_null(r->state_dir, &oom);
    p->save_dir = dup_or_null(r->save_dir, &oom);
    if (o->artifact_base) {
        p->base = dup_or_null(o->artifact_base, &oom);
    } else if (p->url) {
        /* The manifest's directory: strip the last path segment. */
        p->base = strdup(p->url);
        char *slash = p->base ? strrchr(p->base, '/') : NULL;
        if (slash && slash > p->base + 8)
            *slash = '\0';
        oom |= !p->base;
    }
    if (p->base) {
        size_t n = strlen(p->base);
        while (n > 0 && p->base[n - 1] == '/')
            p->base[--n] = '\0';
    }
    if (p->url && asprintf(&p->sig_url, "%s.sig", p->url) < 0)
        p->sig_url = NULL, oom = 1;
    if (p->url && asprintf(&p->origin, "pull:%s", p->url) < 0)
        p->origin = NULL, oom = 1;
    if ((err = keys_urls(p, o->keys_url, &oom, rep)))
        goto fail;
    if (oom || !(p->curl = curl_easy_init())) {
        err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    p->opt.url = p->url;
    p->opt.artifact_base = p->base;
    p->opt.ca_file = p->ca_file;
    if ((err = hkn_state_open(p->state_dir, &p->state, rep)))
        goto fail;
    note_trust(p);
    if (hkn_refused_create(&p->refused)) {
        err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((err = hkn_fleet_create(o->host_id, o->host_labels, &p->fleet, rep)))
        goto fail;
    hkn_log(e, HK_LOG_INFO, "pull", "%s: host %s (from %s), labels '%s'", p->url,
            hkn_fleet_host_id(p->fleet), hkn_fleet_id_source(p->fleet), hkn_fleet_labels(p->fleet));
    if ((o->metrics_address || o->metrics_port) &&
        (err = hkn_scrape_start(o->metrics_address, o->metrics_port, e, &p->scrape, rep)))
        goto fail;
    *out = p;
    return 0;
fail:
    hkn_pull_destroy(p);
    return err;
}

int hkn_pull_run(hkn_puller *p) {
    if (p->running)
        return HK_ERR_BUSY;
    if (pthread_create(&p->thread, NULL, poll_thread, p) != 0)
        return HK_ERR_NOMEM;
    p->running = 1;
    return 0;
}

void hkn_pull_stats_get(hkn_puller *p, hkn_pull_stats *out) {
    pthread_mutex_lock(&p->lock);
    *out = p->stats;
    pthread_mutex_unlock(&p->lock);
}

void hkn_pull_metrics(hkn_puller *p, hk_metrics_writer *w) {
    hkn_pull_stats s;
    hkn_pull_stats_get(p, &s);
    hkn_metric(w, "hotkern_pull_polls_total", "counter", "Polls of the origin completed.", s.polls);
    hkn_metric(w, "hotkern_pull_requests_total", "counter", "HTTP requests made to the origin.",
               s.requests);
    hkn_metric(w, "hotkern_pull_not_modified_total", "counter", "304 answers to the manifest.",
               s.not_modified);
    hkn_metric(w, "hotkern_pull_errors_total", "counter",
               "Transfers that failed (network, timeout, HTTP error, size cap).", s.errors);
    hkn_metric(w, "hotkern_pull_refused_total", "counter",
               "Releases refused by verification or by the engine.", s.refused);
    hkn_metric(w, "hotkern_pull_applied_total", "counter", "Releases committed.", s.applied);
    hkn_metric(w, "hotkern_pull_received_bytes_total", "counter", "Body bytes received.", s.bytes);
    hkn_metric(w, "hotkern_pull_consecutive_failures", "gauge",
               "Polls in a row that failed and backed off.", s.failures);
    pthread_mutex_lock(&p->lock);
    uint64_t kv = p->keys_version, kr = p->keys_refused;
    int kt = p->keys_threshold;
    pthread_mutex_unlock(&p->lock);
    hkn_metric(w, "hotkern_trusted_keys_version", "gauge",
               "Version of the key list the host trusts (0: its configured keys).", kv);
    hkn_metric(w, "hotkern_trusted_keys_threshold", "gauge",
               "Distinct trusted keys a release needs.", (uint64_t)kt);
    hkn_metric(w, "hotkern_key_lists_refused_total", "counter",
               "Key lists refused (signatures, version, expiry, form).", kr);
    hkn_fleet_metrics(p->fleet, w);
}

uint64_t hkn_pull_keys_version(hkn_puller *p) {
    hkn_trust t;
    hk_report r = HK_REPORT_INIT;
    int err = hkn_trust_current(&p->trust, p->state, &t, &r);
    hk_report_clear(&r);
    return err ? 0 : t.version;
}

unsigned hkn_pull_metrics_port(const hkn_puller *p) {
    return hkn_scrape_port(p->scrape);
}

const char *hkn_pull_host_id(const hkn_puller *p) {
    return hkn_fleet_host_id(p->fleet);
}

void hkn_pull_destroy(hkn_puller *p) {
    if (!p)
        return;
    /* No scrape renders the runtime's text once this returns. */
    hkn_scrape_stop(p->scrape);
    if (p->running) {
        pthread_mutex_lock(&p->lock);
        __atomic_store_n(&p->stop, 1, __ATOMIC_RELAXED);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
        pthread_join(p->thread, NULL);
    }
    if (p->curl)
        curl_easy_cleanup(p->curl);
    hkn_state_close(p->state);
    hkn_refused_destroy(p->refused);
    hkn_fleet_destroy(p->fleet);
    free(p->etag);
    free(p->last_modified);
    free(p->keys_etag);
    free(p->keys_lm);
    free(p->keys_url);
    free(p->keys_sig_url);
    free(p->url);
    free(p->sig_url);
    free(p->base);
    free(p->ca_file);
    free(p->state_dir);
    free(p->save_dir);
    free(p->origin);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

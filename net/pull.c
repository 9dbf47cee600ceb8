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
 * Logs (eng.log, subsystem "pull"): each poll and 304 (debug), a new release
 * and its application (info), a refused manifest or release and each failed
 * poll with the retry's number and delay (warn).
 *
 * Threads. The poll thread owns the curl handle and the validators; the
 * counters and the stop flag are shared with the API under `lock`. Stopping
 * wakes the sleep at once and aborts a transfer through the progress callback.
 * Its state, options and lifecycle: net/puller.c (the struct in net/puller.h).
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

#include "net/puller.h"
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
 * rollout's step, or running its release already, fetches nothing; one
 * outside the step that runs neither the release nor the stable one
 * fetches the stable release's artifacts the manifest carries instead.
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
 * Outside the step on neither the release nor the stable one, the manifest
 * becomes the stable release it carries (hkn_manifest_take_stable), which
 * the rest of the poll fetches, applies and records as it would the
 * release. Otherwise, unless the engine refused these very bytes already
 * (an origin whose ETag changes defeats the validators; a rollout's next
 * step re-signs the same release), the artifacts are fetched. */
static int gate(hkn_puller *p, struct poll *q, hk_report *rep) {
    hkn_manifest *m = &q->m;
    int err;
    hkn_fleet_gate(p->fleet, &p->eng, m, &q->gate);
    if (q->gate.action == HKN_GATE_STABLE) {
        char runs[48] = "nothing";
        if (q->gate.running)
            snprintf(runs, sizeof runs, "release %llu", (unsigned long long)q->gate.running);
        hkn_log(&p->eng, HK_LOG_INFO, "pull",
                "%s: %s v%llu (release %llu): outside step %u of %zu: applying the stable release "
                "%llu (this host runs %s)",
                p->url, m->module, (unsigned long long)m->version, (unsigned long long)m->release,
                m->rollout.step + 1, m->rollout.nsteps, (unsigned long long)m->rollout.previous,
                runs);
        hkn_manifest_take_stable(m);
    } else if (q->gate.action != HKN_GATE_APPLY) {
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
    if (q->gate.action == HKN_GATE_APPLY)
        hkn_log(&p->eng, HK_LOG_INFO, "pull", "%s: new release %s v%llu (%zu artifact(s))%s",
                p->url, m->module, (unsigned long long)m->version, m->nartifacts,
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

/* The key list in force, for the metrics (net/puller.h). */
void hkn_pull_note_trust(hkn_puller *p) {
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
    hkn_pull_note_trust(p);
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

void *hkn_pull_thread(void *arg) {
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

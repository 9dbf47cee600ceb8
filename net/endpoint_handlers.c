/*
 * The push endpoint's answers: responses, the module table, the worker that
 * applies releases and rollbacks, and status and metrics.
 *
 * Bodies. A release comes as JSON (artifacts in base64) or as a frame of
 * lengths and raw bytes (HKN_FRAME_TYPE, net/frame.c). A JSON body is
 * gathered whole and parsed on the worker, which holds the body and
 * cJSON's copy of its strings together: twice its size. A frame is parsed
 * on the loop thread as it streams (endpoint.c) into the one buffer its
 * lengths size, from which the worker verifies and applies it in place:
 * the release is held once. Either way the worker runs the same checks
 * over the same signed bytes.
 *
 * Refusals are remembered. A release the engine refuses has its anti-
 * rollback record taken back (a fixed kernel may reuse the version), so the
 * same signed bytes would verify again: the worker remembers the refusals
 * (net/refused.c) and answers a replay with the first refusal's error and
 * status, before any artifact is decoded, instead of building it again on
 * the one worker every other push waits for.
 *
 * Rollbacks. A signed rollback request names this endpoint's id (so that a
 * request captured on its way to one host of a fleet rolls back no other)
 * and the release to be running afterwards. That release is checked by the
 * engine against the image it would commit, in the same step as the
 * rollback (hkn_rollback_fn with check), not against what was pushed here:
 * a puller, the watcher or the program may have committed since. Status
 * reports the engine's releases for the same reason. A rollback needs the
 * token or a signed rollback request; with neither a token nor a trusted key
 * configured, rollback over HTTP is off (endpoint.c refuses it).
 *
 * Threads: the worker runs the releases and rollbacks; status and metrics
 * are answered on libmicrohttpd's loop threads. Locks: lock (the module
 * table, the nonces, the counters), job_lock (the queue); net/endpoint.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <sodium.h>

#include "net/endpoint.h"

#define MAX_LOG_KEPT (64 * 1024)

/* ---- responses --------------------------------------------------------- */

enum MHD_Result hkn_ep_reply(struct MHD_Connection *c, unsigned status, char *text,
                             const char *type) {
    /* text is malloc'd and handed to libmicrohttpd, which frees it. */
    if (!text)
        return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer_with_free_callback(strlen(text), text, free);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == MHD_HTTP_SERVICE_UNAVAILABLE || status == MHD_HTTP_CONTENT_TOO_LARGE) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
        if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
            MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    }
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Prints obj (consumed) as JSON text ending in a newline; NULL on no memory. */
char *hkn_ep_json_text(cJSON *obj) {
    char *text = obj ? cJSON_Print(obj) : NULL;
    cJSON_Delete(obj);
    if (!text)
        return NULL;
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (t2) {
        text = t2;
        memcpy(text + n, "\n", 2);
    }
    return text;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status, cJSON *obj) {
    return hkn_ep_reply(c, status, hkn_ep_json_text(obj), "application/json");
}

cJSON *hkn_ep_error_json(int err, const char *msg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", "error");
    cJSON_AddStringToObject(o, "error", hk_err_name(err));
    cJSON_AddNumberToObject(o, "code", err);
    cJSON_AddStringToObject(o, "message", msg);
    return o;
}

enum MHD_Result hkn_ep_reply_error(struct MHD_Connection *c, unsigned status, int err,
                                   const char *msg) {
    return reply_json(c, status, hkn_ep_error_json(err, msg));
}

/* The client's address, for log lines. */
const char *hkn_ep_peer(const struct conn *k) {
    return k && k->ip[0] ? k->ip : "an untracked connection";
}

static unsigned http_status(int err) {
    switch (err) {
    case HK_OK:
        return MHD_HTTP_OK;
    case HK_ERR_INVALID:
    case HK_ERR_FORMAT:
        return MHD_HTTP_BAD_REQUEST;
    case HK_ERR_SIGNATURE:
    case HK_ERR_EXPIRED:
        return MHD_HTTP_FORBIDDEN;
    case HK_ERR_NOT_FOUND:
        return MHD_HTTP_NOT_FOUND;
    case HK_ERR_REPLAY:
    case HK_ERR_NO_HISTORY:
    case HK_ERR_SUPERSEDED:
    case HK_ERR_QUARANTINED:
        return MHD_HTTP_CONFLICT;
    case HK_ERR_TOO_LARGE:
        return MHD_HTTP_CONTENT_TOO_LARGE;
    case HK_ERR_HASH:
    case HK_ERR_COMPILE:
    case HK_ERR_ARCH:
    case HK_ERR_ATTRIBUTE:
    case HK_ERR_MISSING_KERNEL:
    case HK_ERR_LAYOUT:
    case HK_ERR_GLOBAL_SIZE:
    case HK_ERR_REJECTED:
    case HK_ERR_CANARY:
        return MHD_HTTP_UNPROCESSABLE_CONTENT;
    case HK_ERR_BUSY:
    case HK_ERR_CLOSED:
    case HK_ERR_UNSUPPORTED:
    case HK_ERR_CANARY_UNAVAILABLE:
        return MHD_HTTP_SERVICE_UNAVAILABLE;
    case HK_ERR_TIMEOUT:
        return MHD_HTTP_GATEWAY_TIMEOUT;
    default:
        return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
}
/* ---- the module table -------------------------------------------------- */

static struct ep_module *find_locked(hkn_endpoint *ep, const char *name) {
    for (size_t i = 0; i < ep->nmods; i++)
        if (!strcmp(ep->mods[i].name, name))
            return &ep->mods[i];
    return NULL;
}

/* Only a module whose release verified (or committed) gets an entry:
 * unauthenticated requests never add to the table. */
static struct ep_module *module_locked(hkn_endpoint *ep, const char *name) {
    struct ep_module *m = find_locked(ep, name);
    if (m || ep->nmods == MAX_MODULES)
        return m;
    m = &ep->mods[ep->nmods++];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    return m;
}

static void set_outcome(struct ep_module *m, const char *outcome, const hk_report *rep, int err) {
    snprintf(m->last_outcome, sizeof m->last_outcome, "%s", outcome);
    m->last_error = err;
    snprintf(m->last_message, sizeof m->last_message, "%s", rep->message);
    snprintf(m->last_canary, sizeof m->last_canary, "%s", rep->canary);
    free(m->last_log);
    m->last_log = rep->log ? strndup(rep->log, MAX_LOG_KEPT) : NULL;
    m->updated = (int64_t)time(NULL);
}

/* Records an outcome. `create`: the module may get a new entry (its release
 * verified); otherwise only an existing entry is updated. */
static void record(hkn_endpoint *ep, const char *module, const char *outcome, int err,
                   uint64_t version, int create, const hk_report *rep) {
    pthread_mutex_lock(&ep->lock);
    if (err && -err < NERRORS)
        ep->refusals[-err]++;
    else if (!err && !strcmp(outcome, "committed"))
        ep->committed++;
    else if (!err)
        ep->rolled_back++;
    snprintf(ep->last.name, sizeof ep->last.name, "%s", module);
    set_outcome(&ep->last, outcome, rep, err);
    struct ep_module *m = NULL;
    if (module[0])
        m = create ? module_locked(ep, module) : find_locked(ep, module);
    if (m) {
        set_outcome(m, outcome, rep, err);
        if (!err && !strcmp(outcome, "committed") && version > m->release_version)
            m->release_version = version;
    }
    pthread_mutex_unlock(&ep->lock);
}

static cJSON *outcome_json(const char *outcome, int err, const hk_report *rep) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", outcome);
    cJSON_AddStringToObject(o, "module", rep->module);
    hkn_json_add_int(o, "version", (long long)rep->version);
    cJSON_AddStringToObject(o, "error", hk_err_name(err));
    cJSON_AddNumberToObject(o, "code", err);
    cJSON_AddStringToObject(o, "message", rep->message);
    if (rep->cu_name[0])
        cJSON_AddStringToObject(o, "cu_name", rep->cu_name);
    if (rep->kernel[0])
        cJSON_AddStringToObject(o, "kernel", rep->kernel);
    if (rep->log)
        cJSON_AddStringToObject(o, "log", rep->log);
    else
        cJSON_AddNullToObject(o, "log");
    cJSON_AddNumberToObject(o, "build_ms", rep->build_ms);
    cJSON_AddNumberToObject(o, "stage_ms", rep->stage_ms);
    cJSON_AddNumberToObject(o, "commit_ms", rep->commit_ms);
    cJSON_AddBoolToObject(o, "cache_hit", rep->cache_hit != 0);
    if (rep->canary[0])
        cJSON_AddStringToObject(o, "canary", rep->canary);
    if (rep->canary_refusal[0])
        cJSON_AddStringToObject(o, "canary_refusal", rep->canary_refusal);
    if (rep->canary_new_ms > 0) {
        cJSON_AddNumberToObject(o, "canary_new_ms", rep->canary_new_ms);
        cJSON_AddNumberToObject(o, "canary_old_ms", rep->canary_old_ms);
    }
    return o;
}

/* Says what became of a release or rollback request (on the worker). */
static void log_outcome(hkn_endpoint *ep, const struct req *r, const char *what,
                        const hk_report *rep, int err, uint64_t engine_version) {
    const char *mod = rep->module[0] ? rep->module : "(unverified)";
    if (!err)
        hkn_log(&ep->eng, HK_LOG_INFO, "endpoint", "%s of %s v%llu from %s done: engine v%llu",
                what, mod, (unsigned long long)rep->version, hkn_ep_peer(r->conn),
                (unsigned long long)engine_version);
    else
        hkn_log(&ep->eng, HK_LOG_WARN, "endpoint", "refused %s of %s from %s: %u %s: %s", what, mod,
                hkn_ep_peer(r->conn), r->status, hk_err_name(err), rep->message);
}

/* ---- POST /v1/release (on the worker) ---------------------------------- */

/* Decodes one base64 artifact; the buffer is sized from the text so a body
 * that carries more bytes than declared is seen as such, not truncated. */
static int decode_artifact(const char *b64, unsigned char **out, size_t *len) {
    size_t tlen = strlen(b64), cap = tlen / 4 * 3 + 3, got = 0;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf)
        return HK_ERR_NOMEM;
    if (sodium_base642bin(buf, cap, b64, tlen, "\r\n", &got, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0) {
        free(buf);
        return HK_ERR_INVALID;
    }
    *out = buf;
    *len = got;
    return 0;
}

/* A release as a request carries it, either way: the manifest's text and
 * the signature's point into the parsed JSON or the frame. */
struct incoming {
    const char *manifest, *sig; /* sig NULL: none */
    size_t manifest_len, sig_len;
    cJSON *root, *arts; /* a JSON body: owned root, and its "artifacts" */
    const hkn_frame *frame;
    unsigned char *owned[HKN_MAX_ARTIFACTS]; /* decoded JSON artifacts */
};

/* The JSON body is freed as soon as it is parsed (cJSON holds the strings). */
static int json_incoming(struct req *r, struct incoming *in, hk_report *rep) {
    in->root = hkn_json_parse_strict(r->body ? r->body : "", r->len);
    free(r->body);
    r->body = NULL;
    const cJSON *man = cJSON_GetObjectItemCaseSensitive(in->root, "manifest");
    const cJSON *sig = cJSON_GetObjectItemCaseSensitive(in->root, "signature");
    in->arts = cJSON_GetObjectItemCaseSensitive(in->root, "artifacts");
    if (!cJSON_IsObject(in->root) || !cJSON_IsString(man) || !cJSON_IsObject(in->arts) ||
        (sig && !cJSON_IsString(sig) && !cJSON_IsNull(sig)))
        return hku_fail(rep, HK_ERR_INVALID,
                        "body must be one JSON object {\"manifest\": string, \"signature\": "
                        "string, \"artifacts\": {sha256: base64}}");
    in->manifest = man->valuestring;
    in->manifest_len = strlen(man->valuestring);
    in->sig = cJSON_IsString(sig) ? sig->valuestring : NULL;
    in->sig_len = in->sig ? strlen(in->sig) : 0;
    return 0;
}

static void frame_incoming(const struct req *r, struct incoming *in) {
    in->frame = r->frame;
    in->manifest = r->frame->manifest;
    in->manifest_len = r->frame->manifest_len;
    in->sig = r->frame->sig_len ? r->frame->sig : NULL;
    in->sig_len = r->frame->sig_len;
}

/* Each artifact of the verified manifest m, checked against its size and
 * hash into bytes[i] and sizes[i]: a frame's in place, in the manifest's
 * order; a JSON body's decoded from base64 by hash, its text freed once
 * decoded, so that about one decoded release is held beyond the body. */
static int incoming_artifacts(struct incoming *in, const hkn_manifest *m, const void **bytes,
                              size_t *sizes, hk_report *rep) {
    if (in->frame && in->frame->nart != m->nartifacts)
        return hku_fail(rep, HK_ERR_HASH,
                        "the release frame carries %zu artifact(s), the manifest names %zu (in "
                        "its order)",
                        in->frame->nart, m->nartifacts);
    for (size_t i = 0; i < m->nartifacts; i++) {
        const hkn_artifact *a = &m->artifacts[i];
        if (in->frame) {
            bytes[i] = in->frame->art[i];
            sizes[i] = in->frame->art_len[i];
        } else {
            cJSON *b = cJSON_GetObjectItemCaseSensitive(in->arts, a->sha256);
            if (!cJSON_IsString(b))
                return hku_fail(rep, HK_ERR_HASH,
                                "artifact '%s' (sha256 %s) is missing from the body", a->name,
                                a->sha256);
            if (decode_artifact(b->valuestring, &in->owned[i], &sizes[i]) != 0)
                return hku_fail(rep, HK_ERR_INVALID, "artifact '%s' is not valid base64", a->name);
            bytes[i] = in->owned[i];
            cJSON_DeleteItemFromObjectCaseSensitive(in->arts, a->sha256);
        }
        int err = hkn_verify_artifact(a, bytes[i], sizes[i], rep);
        if (err)
            return err;
    }
    return 0;
}

/* Verifies and applies one release, sent as JSON or as a frame: the same
 * checks in the same order, over the same signed bytes. *verified is set
 * once the manifest's signature (and form) checked out. */
static int do_release(hkn_endpoint *ep, struct req *r, hk_report *rep, uint64_t *version,
                      int *verified, int *again) {
    int err = 0;
    hkn_manifest m = {0};
    const void *bytes[HKN_MAX_ARTIFACTS] = {0};
    size_t sizes[HKN_MAX_ARTIFACTS] = {0};
    struct incoming in = {0};
    if (r->frame)
        frame_incoming(r, &in);
    else if ((err = json_incoming(r, &in, rep)))
        goto out;
    hkn_state_begin(ep->state);
    /* The signature is checked before any artifact is decoded, against the
     * keys in force (a key list's, net/keys.c). */
    hkn_trust trust;
    err = hkn_trust_current(&ep->trust, ep->state, &trust, rep);
    if (!err)
        err = hkn_verify_manifest(&trust, ep->state, in.manifest, in.manifest_len, in.sig,
                                  in.sig_len, (int64_t)time(NULL), &m, rep);
    *verified = rep->module[0] != '\0';
    /* Signed bytes the engine refused already are answered as then, with no
     * artifact decoded and no build or canary run (net/refused.c). */
    char mhash[65];
    if (!err &&
        (err = hkn_refused_check(ep->refused, &m, in.manifest, in.manifest_len, mhash, rep))) {
        *again = 1;
        *version = m.version;
    }
    if (!err && !(err = incoming_artifacts(&in, &m, bytes, sizes, rep))) {
        cJSON_Delete(in.root);
        in.root = NULL;
        *version = m.version;
        err = hkn_release_commit(&ep->eng, ep->state, ep->refused, &m, bytes, sizes, mhash, "push",
                                 0, NULL, rep);
    }
    hkn_state_end(ep->state);
out:
    for (size_t i = 0; i < HKN_MAX_ARTIFACTS; i++)
        free(in.owned[i]);
    hkn_manifest_free(&m);
    cJSON_Delete(in.root);
    return err;
}

static void run_release(hkn_endpoint *ep, struct req *r) {
    hk_report rep = HK_REPORT_INIT;
    uint64_t version = 0;
    int verified = 0, again = 0;
    int err = do_release(ep, r, &rep, &version, &verified, &again);
    const char *outcome = err ? "refused" : "committed";
    record(ep, rep.module, outcome, err, version, verified, &rep);
    if (again) {
        pthread_mutex_lock(&ep->lock);
        ep->refused_again++;
        pthread_mutex_unlock(&ep->lock);
    }
    cJSON *o = outcome_json(outcome, err, &rep);
    if (err)
        cJSON_AddBoolToObject(o, "refused_before", again);
    uint64_t ev = !err && ep->eng.version ? ep->eng.version(ep->eng.ud, rep.module) : 0;
    if (!err && ep->eng.version)
        hkn_json_add_int(o, "engine_version", (long long)ev);
    if (verified) /* as "version": the release, as a rollback's answer names it */
        hkn_json_add_int(o, "release_version", (long long)version);
    else
        cJSON_AddNullToObject(o, "release_version");
    r->status = http_status(err);
    log_outcome(ep, r, "release", &rep, err, ev);
    hk_report_clear(&rep);
    r->answer = hkn_ep_json_text(o);
}

/* ---- POST /v1/rollback/MODULE (on the worker) -------------------------- */

/* Checks a signed rollback request against the URL, this endpoint's id and
 * the nonces seen; *target is the release it asks for, which the engine
 * checks against its own history when it rolls back (a puller or another
 * source may have committed since this endpoint's last push). Called with
 * no lock held. */
static int check_signed_rollback(hkn_endpoint *ep, struct req *r, uint64_t *target,
                                 hk_report *rep) {
    hkn_rollback_req rq;
    cJSON *root = hkn_json_parse_strict(r->body ? r->body : "", r->len);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "request");
    const cJSON *sig = cJSON_GetObjectItemCaseSensitive(root, "signature");
    int err;
    if (!cJSON_IsObject(root) || !cJSON_IsString(text) || !cJSON_IsString(sig)) {
        err = hku_fail(rep, HK_ERR_SIGNATURE,
                       "rollback needs the bearer token or a signed request "
                       "{\"request\": string, \"signature\": base64} (hotkern rollback --key)");
        goto out;
    }
    int64_t now = (int64_t)time(NULL);
    hkn_trust trust;
    if ((err = hkn_trust_current(&ep->trust, ep->state, &trust, rep)) ||
        (err = hkn_rollback_verify(&trust, text->valuestring, strlen(text->valuestring),
                                   sig->valuestring, strlen(sig->valuestring), now, &rq, rep)))
        goto out;
    if (strcmp(rq.module, r->module)) {
        err = hku_fail(rep, HK_ERR_SIGNATURE, "the signed request is for module '%s', not '%s'",
                       rq.module, r->module);
        goto out;
    }
    if (strcmp(rq.endpoint, hkn_ep_id(ep))) {
        err = hku_fail(rep, HK_ERR_SIGNATURE,
                       "the signed request is for endpoint '%s', not this one ('%s')", rq.endpoint,
                       hkn_ep_id(ep));
        goto out;
    }
    pthread_mutex_lock(&ep->lock);
    int free_slot = -1, seen = 0;
    for (int i = 0; i < MAX_NONCES; i++) {
        if (ep->nonces[i].expires <= now)
            free_slot = free_slot < 0 ? i : free_slot;
        else if (!strcmp(ep->nonces[i].text, rq.nonce))
            seen = 1;
    }
    if (seen)
        err = hku_fail(rep, HK_ERR_REPLAY, "this signed rollback request was already used");
    else if (free_slot < 0)
        err = hku_fail(rep, HK_ERR_BUSY, "too many rollback requests in flight; retry later");
    if (!err) {
        /* Spent once verified, whatever the outcome: it cannot be tried twice. */
        snprintf(ep->nonces[free_slot].text, sizeof ep->nonces[free_slot].text, "%s", rq.nonce);
        ep->nonces[free_slot].expires = rq.expires;
        *target = rq.target;
    }
    pthread_mutex_unlock(&ep->lock);
out:
    cJSON_Delete(root);
    return err;
}

static void run_rollback(hkn_endpoint *ep, struct req *r) {
    hk_report rep = HK_REPORT_INIT;
    int err = 0, check = !ep->token;
    uint64_t target = 0;
    /* The token, when configured, was checked with the headers; without it
     * the request must carry its own signature, whose target the engine
     * checks against the image it would commit. */
    if (check)
        err = check_signed_rollback(ep, r, &target, &rep);
    if (!err && !ep->eng.rollback)
        err = hku_fail(&rep, HK_ERR_UNSUPPORTED, "this endpoint has no rollback");
    if (!err) {
        hkn_state_begin(ep->state);
        err = ep->eng.rollback(ep->eng.ud, r->module, check, target, &rep);
        hkn_state_end(ep->state);
    }
    rep.error = err;
    if (!rep.message[0] && err)
        snprintf(rep.message, sizeof rep.message, "rollback of %s: %s", r->module,
                 hk_err_name(err));
    snprintf(rep.module, sizeof rep.module, "%s", r->module);
    const char *outcome = err ? "refused" : "rolled_back";
    record(ep, r->module, outcome, err, 0, 0, &rep);
    cJSON *o = outcome_json(outcome, err, &rep);
    uint64_t ev = ep->eng.version ? ep->eng.version(ep->eng.ud, r->module) : 0;
    if (ep->eng.version)
        hkn_json_add_int(o, "engine_version", (long long)ev);
    /* "version" is the engine's number of the image committed again; the
     * release that runs now is the engine's to say (0 or null: unknown). */
    uint64_t rel = 0;
    if (!err && ep->eng.release && ep->eng.release(ep->eng.ud, r->module, 0, &rel) == 0)
        hkn_json_add_int(o, "release_version", (long long)rel);
    else
        cJSON_AddNullToObject(o, "release_version");
    r->status = http_status(err);
    log_outcome(ep, r, "rollback", &rep, err, ev);
    hk_report_clear(&rep);
    r->answer = hkn_ep_json_text(o);
}

/* ---- POST /v1/keys (on the worker) ------------------------------------- */

/* A signed key list (net/keys.c), {"keys": text, "signature": text}: made
 * the state's when k of the keys in force signed it. */
static void run_keys(hkn_endpoint *ep, struct req *r) {
    hk_report rep = HK_REPORT_INIT;
    hkn_trust got;
    memset(&got, 0, sizeof got);
    cJSON *root = hkn_json_parse_strict(r->body ? r->body : "", r->len);
    const cJSON *doc = cJSON_GetObjectItemCaseSensitive(root, "keys");
    const cJSON *sig = cJSON_GetObjectItemCaseSensitive(root, "signature");
    int err;
    if (!cJSON_IsObject(root) || !cJSON_IsString(doc) || !cJSON_IsString(sig)) {
        err = hku_fail(&rep, HK_ERR_INVALID,
                       "a key list is {\"keys\": \"<keys.json text>\", \"signature\": "
                       "\"<keys.json.sig text>\"} (hotkern keys push)");
    } else {
        hkn_state_begin(ep->state);
        err = hkn_keylist_accept(&ep->trust, ep->state, doc->valuestring, strlen(doc->valuestring),
                                 sig->valuestring, strlen(sig->valuestring), (int64_t)time(NULL),
                                 &got, &rep);
        hkn_state_end(ep->state);
    }
    cJSON_Delete(root);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "outcome", err ? "refused" : "committed");
    if (err)
        cJSON_AddNullToObject(o, "keys_version");
    else
        hkn_json_add_int(o, "keys_version", (long long)got.version);
    cJSON_AddStringToObject(o, "error", hk_err_name(err));
    cJSON_AddNumberToObject(o, "code", err);
    cJSON_AddStringToObject(o, "message", rep.message);
    r->status = http_status(err);
    if (err) {
        hkn_log(&ep->eng, HK_LOG_WARN, "endpoint", "refused the key list from %s: %u %s: %s",
                hkn_ep_peer(r->conn), r->status, hk_err_name(err), rep.message);
    } else {
        char line[HKN_MAX_KEYS * (HKN_KEY_ID_CHARS + 1) + 64];
        hkn_trust_describe(&got, line, sizeof line);
        hkn_log(&ep->eng, HK_LOG_INFO, "endpoint", "key list from %s: trusting %s",
                hkn_ep_peer(r->conn), line);
    }
    hk_report_clear(&rep);
    r->answer = hkn_ep_json_text(o);
}

/* ---- the worker -------------------------------------------------------- */

void *hkn_ep_worker_main(void *arg) {
    /* Named for top -H, gdb and profilers (at most 15 characters). */
    pthread_setname_np(pthread_self(), "hk-push");
    hkn_endpoint *ep = arg;
    for (;;) {
        pthread_mutex_lock(&ep->job_lock);
        while (!ep->jobs && !ep->stopping)
            pthread_cond_wait(&ep->job_cv, &ep->job_lock);
        struct req *r = ep->jobs;
        int stopping = ep->stopping;
        if (r) {
            ep->jobs = r->next_job;
            if (!ep->jobs)
                ep->jobs_tail = &ep->jobs;
        }
        pthread_mutex_unlock(&ep->job_lock);
        if (!r)
            break;
        if (stopping) {
            r->status = MHD_HTTP_SERVICE_UNAVAILABLE;
            r->answer =
                hkn_ep_json_text(hkn_ep_error_json(HK_ERR_CLOSED, "the endpoint is stopping"));
        } else if (r->route == R_RELEASE) {
            run_release(ep, r);
        } else if (r->route == R_KEYS) {
            run_keys(ep, r);
        } else {
            run_rollback(ep, r);
        }
        if (!r->answer) {
            r->status = MHD_HTTP_INTERNAL_SERVER_ERROR;
            r->answer = strdup("{\"outcome\": \"error\", \"error\": \"HK_ERR_NOMEM\"}\n");
        }
        r->done = 1;
        /* After this call the request belongs to libmicrohttpd again. */
        MHD_resume_connection(r->c);
    }
    return NULL;
}

/* ---- GET /v1/status and /metrics --------------------------------------- */

static cJSON *module_json(const struct ep_module *m) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "module", m->name);
    hkn_json_add_int(o, "release_version", (long long)m->release_version);
    cJSON_AddStringToObject(o, "last_outcome", m->last_outcome);
    cJSON_AddStringToObject(o, "last_error", hk_err_name(m->last_error));
    cJSON_AddStringToObject(o, "last_message", m->last_message);
    cJSON_AddStringToObject(o, "last_canary", m->last_canary);
    if (m->last_log)
        cJSON_AddStringToObject(o, "last_log", m->last_log);
    else
        cJSON_AddNullToObject(o, "last_log");
    hkn_json_add_int(o, "updated", (long long)m->updated);
    return o;
}

/* The engine's quarantined images (ran when the context was lost; refused
 * until a different image comes), as "quarantine": [...]. */
static void add_quarantine(hkn_endpoint *ep, cJSON *o) {
    cJSON *arr = cJSON_AddArrayToObject(o, "quarantine");
    for (int i = 0; ep->eng.quarantine && i < 4096; i++) {
        hk_quarantine q = HK_QUARANTINE_INIT;
        if (ep->eng.quarantine(ep->eng.ud, i, &q) != 0)
            break;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "module", q.module);
        cJSON_AddStringToObject(e, "image", q.image);
        hkn_json_add_int(e, "release_version", (long long)q.release_version);
        hkn_json_add_int(e, "version", (long long)q.version);
        cJSON_AddItemToArray(arr, e);
    }
}

enum MHD_Result hkn_ep_handle_status(hkn_endpoint *ep, struct MHD_Connection *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON *mods = cJSON_AddArrayToObject(o, "modules");
    char(*names)[64] = calloc(MAX_MODULES, 64);
    size_t n;
    if (!names) {
        cJSON_Delete(o);
        return MHD_NO;
    }
    pthread_mutex_lock(&ep->lock);
    n = ep->nmods;
    for (size_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(mods, module_json(&ep->mods[i]));
        memcpy(names[i], ep->mods[i].name, 64);
    }
    if (ep->last.last_outcome[0])
        cJSON_AddItemToObject(o, "last", module_json(&ep->last));
    hkn_json_add_int(o, "requests", (long long)ep->requests);
    pthread_mutex_unlock(&ep->lock);
    cJSON_AddStringToObject(o, "endpoint_id", hkn_ep_id(ep));
    cJSON_AddNumberToObject(o, "connections", hkn_endpoint_connections(ep));
    /* Where the anti-rollback record lives; the record is written before a
     * release is committed, so it never lags behind the engine. */
    const char *sp = hkn_state_path(ep->state);
    if (sp)
        cJSON_AddStringToObject(o, "state_file", sp);
    else
        cJSON_AddNullToObject(o, "state_file");
    cJSON_AddStringToObject(o, "state_persisted", "before commit");
    /* Outside the lock: the engine takes its own. What runs and what a
     * rollback would commit are the engine's, whichever source committed
     * them (a puller, the watcher, the program), so that a signed rollback's
     * target is named as the engine will check it. */
    for (size_t i = 0; i < n; i++) {
        cJSON *mj = cJSON_GetArrayItem(mods, (int)i);
        if (ep->eng.version)
            hkn_json_add_int(mj, "engine_version",
                             (long long)ep->eng.version(ep->eng.ud, names[i]));
        static const char *const rel_fields[] = {"running_release_version",
                                                 "previous_release_version"};
        for (int back = 0; back < 2; back++) {
            uint64_t rel = 0;
            if (ep->eng.release && ep->eng.release(ep->eng.ud, names[i], back, &rel) == 0)
                hkn_json_add_int(mj, rel_fields[back], (long long)rel);
            else
                cJSON_AddNullToObject(mj, rel_fields[back]);
        }
    }
    free(names);
    add_quarantine(ep, o);
    return reply_json(c, MHD_HTTP_OK, o);
}

/* GET /metrics answers the runtime's whole text (hk_metrics_text), of which
 * the endpoint's counters are one part, added by hkn_endpoint_metrics. */
enum MHD_Result hkn_ep_handle_metrics(hkn_endpoint *ep, struct MHD_Connection *c) {
    size_t len = 0;
    if (!ep->eng.metrics)
        return hkn_ep_reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, HK_ERR_UNSUPPORTED,
                                  "this endpoint has no metrics");
    char *text = ep->eng.metrics(ep->eng.ud, &len);
    if (!text)
        return hkn_ep_reply_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, HK_ERR_NOMEM,
                                  "the metrics could not be rendered");
    return hkn_ep_reply(c, MHD_HTTP_OK, text, "text/plain; version=0.0.4; charset=utf-8");
}

void hkn_endpoint_metrics(hkn_endpoint *ep, hk_metrics_writer *w) {
    hkn_metric(w, "hotkern_push_connections", "gauge", "Connections open to the endpoint.",
               hkn_endpoint_connections(ep));
    pthread_mutex_lock(&ep->lock);
    hkn_metric(w, "hotkern_push_requests_total", "counter",
               "HTTP requests received by the endpoint.", ep->requests);
    hkn_metric(w, "hotkern_push_unauthorized_total", "counter",
               "Requests refused for a missing or wrong token.", ep->unauthorized);
    hkn_metric(w, "hotkern_push_too_large_total", "counter",
               "Requests refused for a body over the cap.", ep->too_large);
    hkn_metric(w, "hotkern_push_overloaded_total", "counter",
               "Requests answered 503 for a connection or memory limit.", ep->overloaded);
    hkn_metric(w, "hotkern_push_foreign_total", "counter",
               "Requests refused for a foreign Host or Origin, or a body not sent as JSON.",
               ep->foreign);
    hkn_metric(w, "hotkern_push_deadline_total", "counter",
               "Connections closed for a request past its deadline.", ep->deadline_cut);
    hkn_metric(w, "hotkern_push_refused_again_total", "counter",
               "Releases the engine had refused, seen again and answered without a build.",
               ep->refused_again);
    hk_metrics_family(w, "hotkern_push_releases_total", "counter", "Pushed releases by outcome.");
    hk_metrics_sample(w, "hotkern_push_releases_total", "outcome", "committed", ep->committed);
    hk_metrics_sample(w, "hotkern_push_releases_total", "outcome", "rolled_back", ep->rolled_back);
    hk_metrics_family(w, "hotkern_push_refusals_total", "counter",
                      "Refused releases and rollbacks by error.");
    for (int i = 1; i < NERRORS; i++)
        if (ep->refusals[i])
            hk_metrics_sample(w, "hotkern_push_refusals_total", "error", hk_err_name(-i),
                              ep->refusals[i]);
    hk_metrics_family(w, "hotkern_module_release_version", "gauge",
                      "Highest release committed per module.");
    for (size_t i = 0; i < ep->nmods; i++)
        hk_metrics_sample(w, "hotkern_module_release_version", "module", ep->mods[i].name,
                          ep->mods[i].release_version);
    pthread_mutex_unlock(&ep->lock);
}

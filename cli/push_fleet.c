/*
 * Push fleets (docs/ROLLOUT.md, "Push fleets"): the rollout's steps carried
 * to a list of push endpoints instead of served from an origin. The
 * rollout directory is the same (the signed manifests, previous-manifest,
 * artifacts/, published by cli/rollout.c); with --endpoints FILE each
 * command also pushes the current manifest, byte for byte the one it
 * signed, with its artifacts, as `hotkern push` sends a release (the
 * binary frame, POST /v1/release), to the hosts that lack it:
 *
 *   a step        every host of the steps so far (the same step choice as
 *                 a puller's: hkc_first_step) not on the release and that
 *                 did not refuse it;
 *   an abort      every host that took the release, or may have (a push
 *                 that got no answer), gets the previous release's.
 *
 * Transfers run on one libcurl multi handle, --concurrency at once. Each
 * reply is that host's acknowledgement (200, committed) or refusal (the
 * endpoint's error and message; its reason as hotkern_rollout_refusals_
 * total names it, hkn_refusal_reason). An answer that is no verdict on the
 * release (busy, unauthorized, out of memory: the host's own state) and no
 * answer at all count as missing data, after --retries more attempts. A
 * replay refusal (the host holds this manifest's version already: a push
 * whose answer was lost) is followed by GET /v1/status, which says what it
 * runs. With HKC_PUSH_PROBE (watch) every host counted on the release is
 * asked the same, so that a host that restarted on nothing is pushed again
 * and one that went away is missing data, not a silent pass.
 *
 * What each host said is kept in DIR/push-state.json (written after every
 * round, atomically), so that status, the next command and a restarted
 * watch go on from it. Callers hold DIR's lock; single-threaded.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "cli/rollout.h"

#define STATE     "push-state.json"
#define MAX_HOSTS 100000
#define URL_MAX   256
#define SHOW      8 /* hosts named in a reason */

struct phost {
    char id[HKN_HOST_ID_MAX];
    char url[URL_MAX];
    char labels[HKN_MAX_LABELS * HKN_LABEL_MAX];
    int step; /* the first step that takes it; -1: none */
    /* what it said, kept in the state file */
    long long release; /* what it runs as it last said; -1: unknown */
    long long took;    /* the last rollout release it acknowledged; 0: none */
    long long sent;    /* a release pushed without an answer; 0: none */
    long long refused; /* the last release it refused; 0: none */
    char reason[16];   /* why (hkn_reason_name) */
    char error[48];    /* the endpoint's error name */
    char message[512]; /* its message, or why it did not answer */
    int missing;       /* its last request got no usable answer */
    long long at;      /* unix time of its last answer */
    double ms;         /* the last request's time */
};

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- the endpoints file ------------------------------------------------- */

/* One host a line: HOST_ID URL [LABEL,LABEL,...]; '#' starts a comment. */
static int parse_line(hkc_out *o, const char *file, int ln, char *line, struct phost *h) {
    char *save = NULL, *id = strtok_r(line, " \t\r\n", &save);
    char *url = id ? strtok_r(NULL, " \t\r\n", &save) : NULL;
    char *labels = url ? strtok_r(NULL, " \t\r\n", &save) : NULL;
    char *extra = labels ? strtok_r(NULL, " \t\r\n", &save) : NULL;
    if (!url || extra)
        return hkc_usage(o, "--endpoints %s:%d: expected 'HOST_ID URL [LABEL,...]'", file, ln);
    if (!hkn_valid_host_id(id))
        return hkc_usage(o, "--endpoints %s:%d: host id '%.200s' is not [A-Za-z0-9_.:@-]{1,127}",
                         file, ln, id);
    if ((strncmp(url, "http://", 7) && strncmp(url, "https://", 8)) || strlen(url) >= URL_MAX)
        return hkc_usage(o,
                         "--endpoints %s:%d: '%.200s' is no http:// or https:// URL shorter "
                         "than %d bytes",
                         file, ln, url, URL_MAX);
    memset(h, 0, sizeof *h);
    snprintf(h->id, sizeof h->id, "%s", id);
    snprintf(h->url, sizeof h->url, "%s", url);
    int n = 0;
    for (char *p = labels; p && *p; n++) {
        size_t len = strcspn(p, ",");
        char one[HKN_LABEL_MAX + 1];
        snprintf(one, sizeof one, "%.*s", (int)(len < HKN_LABEL_MAX ? len : HKN_LABEL_MAX), p);
        if (len >= HKN_LABEL_MAX || !hkn_valid_label(one) || n >= HKN_MAX_LABELS)
            return hkc_usage(o,
                             "--endpoints %s:%d: labels '%.200s': up to %d of "
                             "[A-Za-z0-9_.:=/-]{1,63}, comma-separated",
                             file, ln, labels, HKN_MAX_LABELS);
        p += len + (p[len] == ',');
    }
    snprintf(h->labels, sizeof h->labels, "%s", labels ? labels : "");
    h->release = -1;
    return 0;
}

static int read_endpoints(hkc_out *o, const char *file, struct phost **out, size_t *n) {
    char *text = NULL;
    size_t len = 0, cap = 0;
    hk_report rep = HK_REPORT_INIT;
    int rc = 0, ln = 0;
    *out = NULL;
    *n = 0;
    if (hku_read_file(file, 64u << 20, &text, &len, &rep)) {
        rc = hkc_usage(o, "--endpoints: %s", rep.message);
        hk_report_clear(&rep);
        return rc;
    }
    for (char *line = text, *next; line && *line && !rc; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        ln++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        if (line[strspn(line, " \t\r")] == '\0')
            continue;
        if (*n == cap) {
            struct phost *nh =
                cap < MAX_HOSTS ? realloc(*out, (cap = cap ? cap * 2 : 64) * sizeof **out) : NULL;
            if (!nh) {
                rc = cap >= MAX_HOSTS
                         ? hkc_usage(o, "--endpoints %s: more than %d hosts", file, MAX_HOSTS)
                         : hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
                break;
            }
            *out = nh;
        }
        if (!(rc = parse_line(o, file, ln, line, &(*out)[*n]))) {
            for (size_t k = 0; k < *n && !rc; k++)
                if (!strcmp((*out)[k].id, (*out)[*n].id))
                    rc = hkc_usage(o, "--endpoints %s:%d: host id %s is listed twice", file, ln,
                                   (*out)[k].id);
            (*n)++;
        }
    }
    if (!rc && !*n)
        rc = hkc_usage(o, "--endpoints %s lists no host ('HOST_ID URL [LABEL,...]' a line)", file);
    free(text);
    if (rc) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

/* ---- the state file ----------------------------------------------------- */

static long long num(const cJSON *o, const char *k, long long def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? (long long)v->valuedouble : def;
}

static void str(const cJSON *o, const char *k, char *dst, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    snprintf(dst, cap, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

/* What DIR/push-state.json says of each listed host (hosts it does not
 * list are new: nothing known). A state file that is not one is refused
 * rather than overwritten: it holds which hosts took which release. */
static int load_state(hkc_out *o, const char *dir, struct phost *h, size_t n) {
    char path[PATH_MAX], *text = NULL;
    size_t len = 0;
    hk_report rep = HK_REPORT_INIT;
    snprintf(path, sizeof path, "%s/" STATE, dir);
    FILE *f = fopen(path, "r");
    if (!f && errno == ENOENT)
        return 0;
    if (f)
        fclose(f);
    if (hku_read_file(path, 256u << 20, &text, &len, &rep)) {
        int rc = hkc_fail_report(o, &rep);
        hk_report_clear(&rep);
        return rc;
    }
    cJSON *doc = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *hosts = cJSON_GetObjectItemCaseSensitive(doc, "hosts");
    if (!cJSON_IsObject(hosts)) {
        cJSON_Delete(doc);
        return hkc_fail(o, HK_ERR_INVALID, NULL,
                        "%s is not a push state ({\"hosts\": {ID: {...}}}): move it away to "
                        "start over",
                        path);
    }
    for (size_t i = 0; i < n; i++) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(hosts, h[i].id);
        if (!cJSON_IsObject(s))
            continue;
        h[i].release = num(s, "release", -1);
        h[i].took = num(s, "took", 0);
        h[i].sent = num(s, "sent", 0);
        h[i].refused = num(s, "refused", 0);
        h[i].at = num(s, "at", 0);
        h[i].missing = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "missing"));
        str(s, "reason", h[i].reason, sizeof h[i].reason);
        str(s, "error", h[i].error, sizeof h[i].error);
        str(s, "message", h[i].message, sizeof h[i].message);
    }
    cJSON_Delete(doc);
    return 0;
}

static int save_state(hkc_out *o, const char *dir, const hkn_manifest *m, const struct phost *h,
                      size_t n) {
    char path[PATH_MAX];
    hk_report rep = HK_REPORT_INIT;
    cJSON *doc = cJSON_CreateObject(), *hosts = cJSON_AddObjectToObject(doc, "hosts");
    cJSON_AddStringToObject(doc, "module", m->module);
    cJSON_AddItemToObject(doc, "manifest_version", hkc_int((long long)m->version));
    for (size_t i = 0; hosts && i < n; i++) {
        cJSON *s = cJSON_AddObjectToObject(hosts, h[i].id);
        if (!s)
            break;
        cJSON_AddStringToObject(s, "url", h[i].url);
        cJSON_AddStringToObject(s, "labels", h[i].labels);
        cJSON_AddItemToObject(s, "release", hkc_int(h[i].release));
        cJSON_AddItemToObject(s, "took", hkc_int(h[i].took));
        cJSON_AddItemToObject(s, "sent", hkc_int(h[i].sent));
        cJSON_AddItemToObject(s, "refused", hkc_int(h[i].refused));
        cJSON_AddStringToObject(s, "reason", h[i].reason);
        cJSON_AddStringToObject(s, "error", h[i].error);
        cJSON_AddStringToObject(s, "message", h[i].message);
        cJSON_AddBoolToObject(s, "missing", h[i].missing);
        cJSON_AddItemToObject(s, "at", hkc_int(h[i].at));
    }
    char *text = cJSON_Print(doc);
    cJSON_Delete(doc);
    if (!text)
        return hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    snprintf(path, sizeof path, "%s/" STATE, dir);
    int rc = hku_write_atomic(path, text, strlen(text), 0644, &rep) ? hkc_fail_report(o, &rep) : 0;
    free(text);
    hk_report_clear(&rep);
    return rc;
}

/* ---- the transfers ------------------------------------------------------ */

enum { PUSH, PROBE, PROBE_REPLAY };

struct job {
    size_t host;
    int kind, attempts;
    double not_before; /* monotonic ms */
    double t0;
    CURL *c;
    struct curl_slist *hdr;
    hkc_resp r;
    char err[CURL_ERROR_SIZE];
};

struct round {
    const hkc_rollout_args *a;
    const hkn_manifest *m;
    uint64_t target; /* the release the hosts are brought to */
    struct phost *h;
    const void *body; /* the frame, shared by every push */
    size_t body_len;
    CURLM *multi;
    struct job *jobs; /* waiting and running */
    size_t njobs, cap, running;
};

static int add_job(struct round *r, size_t host, int kind, int attempts, double not_before) {
    if (r->njobs == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        struct job *nj = realloc(r->jobs, cap * sizeof *nj);
        if (!nj)
            return HK_ERR_NOMEM;
        r->jobs = nj;
        r->cap = cap;
    }
    struct job *j = &r->jobs[r->njobs++];
    memset(j, 0, sizeof *j);
    j->host = host;
    j->kind = kind;
    j->attempts = attempts;
    j->not_before = not_before;
    return 0;
}

static int start_job(struct round *r, struct job *j) {
    const struct phost *h = &r->h[j->host];
    char auth[1024];
    char *url = hkc_route_url(h->url, j->kind == PUSH ? "/v1/release" : "/v1/status");
    if (!url || !(j->c = curl_easy_init())) {
        free(url);
        return HK_ERR_NOMEM;
    }
    memset(&j->r, 0, sizeof j->r);
    j->r.status = -1;
    hkc_http_opts ho = r->a->http;
    if (j->kind != PUSH && (!ho.timeout_s || ho.timeout_s > 10))
        ho.timeout_s = 10; /* a status answer is small and quick */
    hkc_http_setup(j->c, &ho, j->err, &j->r);
    curl_easy_setopt(j->c, CURLOPT_URL, url);
    curl_easy_setopt(j->c, CURLOPT_PRIVATE, (void *)(uintptr_t)(j - r->jobs));
    if (ho.token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", ho.token);
        j->hdr = curl_slist_append(j->hdr, auth);
    }
    if (j->kind == PUSH) {
        j->hdr = curl_slist_append(j->hdr, "Content-Type: " HKN_FRAME_TYPE);
        curl_easy_setopt(j->c, CURLOPT_POST, 1L);
        curl_easy_setopt(j->c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
        curl_easy_setopt(j->c, CURLOPT_POSTFIELDS, r->body); /* no copy: one frame for all */
    }
    curl_easy_setopt(j->c, CURLOPT_HTTPHEADER, j->hdr);
    free(url);
    j->t0 = mono_ms();
    curl_multi_add_handle(r->multi, j->c);
    r->running++;
    return 0;
}

static void end_job(struct round *r, struct job *j) {
    curl_multi_remove_handle(r->multi, j->c);
    curl_easy_cleanup(j->c);
    curl_slist_free_all(j->hdr);
    free(j->r.data);
    j->c = NULL;
    j->hdr = NULL;
    j->r.data = NULL;
    r->running--;
}

static void missing(struct phost *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void missing(struct phost *h, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->message, sizeof h->message, fmt, ap);
    va_end(ap);
    h->missing = 1;
}

/* What a finished transfer says of its host; more jobs queued where it
 * calls for them (a retry, a probe after a replay, a push after a probe
 * that found the host off the release). 0 or HK_ERR_NOMEM. */
static int finish(struct round *r, struct job *j, CURLcode res) {
    struct phost *h = &r->h[j->host];
    const hkc_rollout_args *a = r->a;
    long st = -1;
    if (res == CURLE_OK)
        curl_easy_getinfo(j->c, CURLINFO_RESPONSE_CODE, &st);
    h->ms = mono_ms() - j->t0;
    int again = res != CURLE_OK || st == 503 || st == 429 || st >= 500;
    if (again && (uint64_t)j->attempts < a->retries) {
        double backoff = 200.0 * (j->attempts + 1);
        return add_job(r, j->host, j->kind, j->attempts + 1, mono_ms() + backoff);
    }
    if (res != CURLE_OK) {
        /* A push whose answer did not come may have been applied. */
        if (j->kind == PUSH)
            h->sent = (long long)r->target;
        missing(h, "%s of %s: %s (%d attempt%s)", j->kind == PUSH ? "push" : "status", h->url,
                j->err[0] ? j->err : curl_easy_strerror(res), j->attempts + 1,
                j->attempts ? "s" : "");
        return 0;
    }
    cJSON *doc = cJSON_ParseWithLength(j->r.data ? j->r.data : "", j->r.len);
    h->at = (long long)time(NULL);
    int rc = 0;
    if (j->kind != PUSH) {
        const cJSON *mods = cJSON_GetObjectItemCaseSensitive(doc, "modules"), *mo;
        long long runs = -2;
        cJSON_ArrayForEach(mo, mods) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(mo, "module");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, r->m->module))
                runs = num(mo, "running_release_version", 0);
        }
        if (st != 200 || !cJSON_IsArray(mods)) {
            missing(h, "status of %s: HTTP %ld, not an endpoint's status", h->url, st);
        } else {
            h->release = runs < 0 ? 0 : runs;
            h->missing = 0;
            if ((uint64_t)h->release == r->target) {
                h->sent = 0;
                h->message[0] = '\0';
                if (!r->m->rollout.aborted)
                    h->took = (long long)r->target;
            } else if (j->kind == PROBE_REPLAY) {
                missing(h,
                        "%s refuses the push as a replay (it recorded this manifest's version) "
                        "but runs release %lld",
                        h->url, h->release);
            } else {
                rc = add_job(r, j->host, PUSH, 0, 0); /* it lost it: a restart on nothing */
            }
        }
        cJSON_Delete(doc);
        return rc;
    }
    const cJSON *outcome = cJSON_GetObjectItemCaseSensitive(doc, "outcome");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(doc, "code");
    if (st == 200 && cJSON_IsString(outcome) && !strcmp(outcome->valuestring, "committed")) {
        h->release = (long long)r->target;
        if (!r->m->rollout.aborted)
            h->took = (long long)r->target;
        h->sent = 0;
        h->missing = 0;
        h->message[0] = h->error[0] = '\0';
    } else if (!cJSON_IsNumber(code)) {
        missing(h, "push to %s: HTTP %ld, not an endpoint's answer", h->url, st);
    } else {
        int err = (int)code->valuedouble;
        char canary[32], msg[400];
        str(doc, "canary_refusal", canary, sizeof canary);
        str(doc, "message", msg, sizeof msg);
        int reason = hkn_refusal_reason(err, canary);
        if (err == HK_ERR_REPLAY || err == HK_ERR_SUPERSEDED) {
            rc = add_job(r, j->host, PROBE_REPLAY, 0, 0);
        } else if (reason < 0) {
            /* busy, unauthorized, out of memory: no verdict on the release */
            missing(h, "%s could not judge release %llu: HTTP %ld %s: %s", h->url,
                    (unsigned long long)r->target, st, hk_err_name(err), msg);
        } else {
            h->refused = (long long)r->target;
            h->sent = 0;
            h->missing = 0;
            snprintf(h->reason, sizeof h->reason, "%s", hkn_reason_name(reason));
            snprintf(h->error, sizeof h->error, "%s", hk_err_name(err));
            snprintf(h->message, sizeof h->message, "%s", msg);
        }
    }
    cJSON_Delete(doc);
    return rc;
}

/* Runs every job, a->concurrency at once, until none is left. */
static int run_jobs(struct round *r) {
    int rc = 0;
    size_t next = 0; /* jobs before it are done or running */
    while (!rc && (next < r->njobs || r->running)) {
        double now = mono_ms(), wake = now + 100;
        for (size_t i = next; i < r->njobs && r->running < r->a->concurrency && !rc; i++) {
            struct job *j = &r->jobs[i];
            if (j->c || j->kind < 0)
                continue;
            if (j->not_before > now) {
                wake = j->not_before < wake ? j->not_before : wake;
                continue;
            }
            rc = start_job(r, j);
        }
        int still = 0;
        curl_multi_perform(r->multi, &still);
        CURLMsg *msg;
        int left;
        while (!rc && (msg = curl_multi_info_read(r->multi, &left))) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            char *priv = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
            /* An index, not a pointer: finish() may grow (move) the jobs. */
            size_t idx = (size_t)(uintptr_t)priv;
            rc = finish(r, &r->jobs[idx], msg->data.result);
            end_job(r, &r->jobs[idx]);
            r->jobs[idx].kind = -1; /* done */
        }
        while (next < r->njobs && r->jobs[next].kind < 0)
            next++;
        if (r->running) {
            int ms = (int)(wake - mono_ms());
            curl_multi_poll(r->multi, NULL, 0, ms > 0 ? ms : 1, NULL);
        } else if (next < r->njobs) {
            double d = wake - mono_ms();
            if (d > 0) {
                struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(d * 1e6)};
                nanosleep(&ts, NULL);
            }
        }
    }
    return rc;
}

/* ---- a round ------------------------------------------------------------ */

/* 1 when host h is one the round brings to its target: of the steps so
 * far; once aborted, one that took the release or may have. */
static int in_scope(const hkn_manifest *m, const struct phost *h) {
    const hkn_rollout *ro = &m->rollout;
    if (ro->aborted)
        return h->took == (long long)ro->release || h->sent == (long long)ro->release;
    return h->step >= 0 && h->step <= (int)ro->step;
}

static void append(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t cap, const char *fmt, ...) {
    size_t n = strlen(buf);
    va_list ap;
    va_start(ap, fmt);
    if (n < cap)
        vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* The replies' verdict over the round's hosts, and every host in v->hosts
 * (as the Prometheus fleet's are, for hkc_fleet_describe). */
static int verdict(const hkn_manifest *m, uint64_t target, const struct phost *h, size_t n,
                   hkc_verdict *v) {
    const hkn_rollout *ro = &m->rollout;
    char nack[2048] = "", gone[2048] = "";
    size_t nnack = 0, ngone = 0;
    memset(v, 0, sizeof *v);
    v->push = 1;
    v->answered = 1;
    if (!(v->hosts = calloc(n ? n : 1, sizeof *v->hosts)))
        return HK_ERR_NOMEM;
    v->nhosts = v->known = n;
    for (size_t i = 0; i < n; i++) {
        hkc_host *x = &v->hosts[i];
        snprintf(x->id, sizeof x->id, "%s", h[i].id);
        snprintf(x->instance, sizeof x->instance, "%s", h[i].url);
        snprintf(x->job, sizeof x->job, "push");
        x->step = h[i].step;
        x->reporting = !h[i].missing && h[i].release >= 0;
        x->release = h[i].release;
        x->refused = h[i].refused ? h[i].refused : -1;
        snprintf(x->reason, sizeof x->reason, "%s", h[i].reason);
        if (!in_scope(m, &h[i]))
            continue;
        v->expected++;
        if (h[i].refused == (long long)target) {
            if (nnack++ < SHOW)
                append(nack, sizeof nack, "%s%s (%s, %s: %.160s)", nnack > 1 ? "; " : "", h[i].id,
                       h[i].reason, h[i].error, h[i].message);
        } else if (h[i].missing || (uint64_t)h[i].release != target) {
            if (ngone++ < SHOW)
                append(gone, sizeof gone, "%s%s (%.200s)", ngone > 1 ? "; " : "", h[i].id,
                       h[i].missing ? h[i].message : "not pushed yet");
        } else {
            v->reporting++;
            v->on_release++;
        }
    }
    if (nnack > SHOW)
        append(nack, sizeof nack, " and %zu more", nnack - SHOW);
    if (ngone > SHOW)
        append(gone, sizeof gone, " and %zu more", ngone - SHOW);
    const char *what = ro->aborted ? "that took release" : "of steps 1-";
    char scope[64];
    if (ro->aborted)
        snprintf(scope, sizeof scope, "%s %llu", what, (unsigned long long)ro->release);
    else
        snprintf(scope, sizeof scope, "%s%u", what, ro->step + 1);
    if (nnack) {
        v->state = HKC_GATE_FAIL;
        snprintf(v->reason, sizeof v->reason, "%zu of the %zu hosts %s refused release %llu: %s",
                 nnack, v->expected, scope, (unsigned long long)target, nack);
    } else if (ngone) {
        v->state = HKC_GATE_UNKNOWN;
        snprintf(v->reason, sizeof v->reason,
                 "%zu of the %zu hosts %s did not acknowledge release %llu (missing data): %s",
                 ngone, v->expected, scope, (unsigned long long)target, gone);
    } else {
        v->state = HKC_GATE_PASS;
        v->settled = 1;
        snprintf(v->reason, sizeof v->reason, "the %zu hosts %s acknowledged release %llu",
                 v->expected, scope, (unsigned long long)target);
    }
    return 0;
}

/* The endpoints, what the state says of them, and the step of each. */
static int prepare(hkc_out *o, const hkc_rollout_args *a, const hkn_manifest *m, struct phost **h,
                   size_t *n) {
    int rc = read_endpoints(o, a->endpoints, h, n);
    if (!rc && (rc = load_state(o, a->dir, *h, *n))) {
        free(*h);
        *h = NULL;
    }
    for (size_t i = 0; !rc && i < *n; i++)
        (*h)[i].step = hkc_first_step(m, (*h)[i].id, (*h)[i].labels);
    return rc;
}

/* The frame of cur (its exact bytes, its signature) and its artifacts,
 * read from DIR/artifacts/. */
static int frame_of(hkc_out *o, const hkc_rollout_args *a, const hkc_man *cur, unsigned char **body,
                    size_t *len) {
    hkn_blob blobs[HKN_MAX_ARTIFACTS];
    char *bytes[HKN_MAX_ARTIFACTS] = {0};
    hk_report rep = HK_REPORT_INIT;
    const hkn_manifest *m = &cur->m;
    int rc = 0;
    for (size_t i = 0; i < m->nartifacts && !rc; i++) {
        char path[PATH_MAX];
        size_t size = 0;
        snprintf(path, sizeof path, "%s/artifacts/%s", a->dir, m->artifacts[i].sha256);
        if (hku_read_file(path, HKC_MAX_INPUT, &bytes[i], &size, &rep)) {
            rc = hkc_fail_report(o, &rep);
        } else if (size != m->artifacts[i].size) {
            rc = hkc_fail(o, HK_ERR_HASH, NULL, "%s is %zu bytes, the manifest says %llu", path,
                          size, (unsigned long long)m->artifacts[i].size);
        }
        blobs[i] = (hkn_blob){.name = m->artifacts[i].name, .bytes = bytes[i], .size = size};
    }
    size_t slen = cur->sig_len;
    while (slen && (cur->sig[slen - 1] == '\n' || cur->sig[slen - 1] == '\r'))
        slen--;
    int err =
        rc ? 0
           : hkn_frame_write(cur->text, cur->len, cur->sig, slen, blobs, m->nartifacts, body, len);
    if (err)
        rc = hkc_fail(o, err, NULL, "cannot frame the release: %s", hk_err_name(err));
    for (size_t i = 0; i < HKN_MAX_ARTIFACTS; i++)
        free(bytes[i]);
    hk_report_clear(&rep);
    return rc;
}

int hkc_push_round(hkc_out *o, const hkc_rollout_args *a, const hkc_man *cur, int flags,
                   hkc_verdict *v) {
    const hkn_manifest *m = &cur->m;
    struct round r = {.a = a, .m = m, .target = hkn_rollout_target(&m->rollout, m->version)};
    size_t n = 0;
    unsigned char *body = NULL;
    int rc = prepare(o, a, m, &r.h, &n);
    memset(v, 0, sizeof *v);
    if (rc)
        return rc;
    for (size_t i = 0; i < n && !rc; i++) {
        struct phost *h = &r.h[i];
        if (!in_scope(m, h) || (h->refused == (long long)r.target && !m->rollout.aborted))
            continue;
        if (h->release == (long long)r.target && !h->missing && !(flags & HKC_PUSH_PROBE))
            continue;
        if (h->release == (long long)r.target && !h->missing)
            rc = add_job(&r, i, PROBE, 0, 0);
        else
            rc = add_job(&r, i, h->missing && h->release == (long long)r.target ? PROBE : PUSH, 0,
                         0);
    }
    if (rc) {
        rc = hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
        goto out;
    }
    if (r.njobs) {
        if ((rc = frame_of(o, a, cur, &body, &r.body_len)))
            goto out;
        r.body = body;
        curl_global_init(CURL_GLOBAL_DEFAULT);
        if (!(r.multi = curl_multi_init()) || run_jobs(&r)) {
            rc = hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
            goto out;
        }
        if ((rc = save_state(o, a->dir, m, r.h, n)))
            goto out;
    }
    if (verdict(m, r.target, r.h, n, v))
        rc = hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
out:
    for (size_t i = 0; i < r.njobs; i++)
        if (r.jobs[i].c)
            end_job(&r, &r.jobs[i]);
    if (r.multi)
        curl_multi_cleanup(r.multi);
    free(r.jobs);
    free(body);
    free(r.h);
    return rc;
}

int hkc_push_describe(hkc_out *o, const hkc_rollout_args *a, const hkn_manifest *m) {
    struct phost *h = NULL;
    size_t n = 0;
    hkc_verdict v;
    int rc = prepare(o, a, m, &h, &n);
    if (rc)
        return rc;
    if (verdict(m, hkn_rollout_target(&m->rollout, m->version), h, n, &v))
        rc = hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    else
        hkc_fleet_describe(o, m, &v);
    hkc_verdict_free(&v);
    free(h);
    return rc;
}

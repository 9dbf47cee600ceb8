/*
 * The Prometheus HTTP API, as `hotkern rollout status --prometheus` and
 * `watch` read it: instant queries (GET /api/v1/query) and the active
 * targets' scrape intervals (GET /api/v1/targets), with libcurl; answers
 * parsed with cJSON.
 *
 * An answer is one of three things, and the callers act on which: the data
 * (HKC_PROM_OK); no data (HKC_PROM_DOWN: no connection, a timeout, a 5xx, an
 * answer that is not Prometheus's JSON), which a gate reads as "unknown";
 * or Prometheus's refusal of the query itself (HKC_PROM_BAD: bad_data, a
 * 4xx), the query's fault, which `watch` refuses at its start as a usage
 * error. In every case but OK the reason is in the caller's buffer.
 *
 * An instant query's answer (a vector, a scalar, or a matrix, whose every
 * point counts) is flattened into samples that point into the parsed
 * document, which the vector owns. One connection is kept for the handle's
 * life (keep-alive): a watch asks a few queries per interval.
 *
 * Not thread-safe: one handle per thread (the CLI has one thread).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "cli/rollout.h"

#define MAX_ANSWER (64u << 20) /* a fleet of 10,000 hosts answers a few MB */

void hkc_prom_close(hkc_prom *p) {
    if (p->curl)
        curl_easy_cleanup(p->curl);
    p->curl = NULL;
}

/* Prometheus's own words of a refusal ("bad_data: parse error ..."). */
static void prom_error(const cJSON *doc, long status, char *err, size_t cap) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(doc, "errorType");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(doc, "error");
    snprintf(err, cap, "HTTP %ld: %s: %s", status, cJSON_IsString(type) ? type->valuestring : "?",
             cJSON_IsString(msg) ? msg->valuestring : "(no message)");
}

/* GET base + path; *doc the parsed answer whose status is "success". */
static int get(hkc_prom *p, const char *path, cJSON **doc, char *err, size_t cap) {
    char cerr[CURL_ERROR_SIZE] = "", auth[1024];
    hkc_resp b = {.max = MAX_ANSWER};
    struct curl_slist *h = NULL;
    long status = 0;
    *doc = NULL;
    char *url = hkc_route_url(p->url, path);
    if (!url) {
        snprintf(err, cap, "out of memory");
        return HKC_PROM_DOWN;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (!p->curl)
        p->curl = curl_easy_init();
    CURL *c = p->curl;
    if (!c) {
        free(url);
        snprintf(err, cap, "out of memory");
        return HKC_PROM_DOWN;
    }
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 5L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, p->timeout_s > 0 ? p->timeout_s : 30L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, hkc_resp_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    if (p->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", p->token);
        h = curl_slist_append(h, auth);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    }
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    int st = HKC_PROM_OK;
    cJSON *j = rc == CURLE_OK && b.data ? cJSON_Parse(b.data) : NULL;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "status");
    if (rc != CURLE_OK) {
        snprintf(err, cap, "%s: %s", url, cerr[0] ? cerr : curl_easy_strerror(rc));
        st = HKC_PROM_DOWN;
    } else if (cJSON_IsString(s) && !strcmp(s->valuestring, "success") && status == 200) {
        *doc = j;
        j = NULL;
    } else if (cJSON_IsString(s) && status >= 400 && status < 500) {
        prom_error(j, status, err, cap); /* the query's fault */
        st = HKC_PROM_BAD;
    } else {
        /* A 503 while Prometheus starts, a proxy's page: no data. */
        if (cJSON_IsString(s))
            prom_error(j, status, err, cap);
        else
            snprintf(err, cap, "%s: HTTP %ld, not Prometheus's API: %.200s", url, status,
                     b.data ? b.data : "");
        st = HKC_PROM_DOWN;
    }
    cJSON_Delete(j);
    free(b.data);
    free(url);
    return st;
}

/* A [time, "value"] pair as a sample of metric. */
static int add_point(hkc_vector *v, const cJSON *metric, const cJSON *pair) {
    const cJSON *t = cJSON_GetArrayItem(pair, 0), *val = cJSON_GetArrayItem(pair, 1);
    if (!cJSON_IsNumber(t) || !cJSON_IsString(val))
        return HKC_PROM_DOWN;
    hkc_sample *ns = realloc(v->s, (v->n + 1) * sizeof *ns);
    if (!ns)
        return HKC_PROM_DOWN;
    v->s = ns;
    /* Prometheus writes NaN and +Inf/-Inf as text; strtod reads them. */
    v->s[v->n++] = (hkc_sample){
        .metric = metric, .value = strtod(val->valuestring, NULL), .ts = t->valuedouble};
    return HKC_PROM_OK;
}

int hkc_prom_query(hkc_prom *p, const char *promql, hkc_vector *out, char *err, size_t cap) {
    memset(out, 0, sizeof *out);
    char *q = curl_easy_escape(NULL, promql, 0);
    char *path = NULL;
    if (!q || asprintf(&path, "/api/v1/query?query=%s", q) < 0) {
        curl_free(q);
        snprintf(err, cap, "out of memory");
        return HKC_PROM_DOWN;
    }
    curl_free(q);
    int st = get(p, path, &out->doc, err, cap);
    free(path);
    if (st)
        return st;
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(out->doc, "data");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(data, "resultType");
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(data, "result");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(t, "scalar")) {
        st = add_point(out, NULL, res);
    } else if (!strcmp(t, "vector") || !strcmp(t, "matrix")) {
        const cJSON *r;
        cJSON_ArrayForEach(r, res) {
            const cJSON *metric = cJSON_GetObjectItemCaseSensitive(r, "metric");
            const cJSON *value = cJSON_GetObjectItemCaseSensitive(r, "value"), *pt;
            if (value)
                st = st ? st : add_point(out, metric, value);
            cJSON_ArrayForEach(pt, cJSON_GetObjectItemCaseSensitive(r, "values")) {
                st = st ? st : add_point(out, metric, pt);
            }
        }
    } else {
        snprintf(err, cap, "the query's result is a %s, not numbers", t[0] ? t : "(none)");
        hkc_vector_free(out);
        return HKC_PROM_BAD;
    }
    if (st) {
        snprintf(err, cap, "a result Prometheus's API does not give (or out of memory)");
        hkc_vector_free(out);
    }
    return st;
}

void hkc_vector_free(hkc_vector *v) {
    cJSON_Delete(v->doc);
    free(v->s);
    memset(v, 0, sizeof *v);
}

const char *hkc_sample_label(const hkc_sample *s, const char *name) {
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(s->metric, name);
    return cJSON_IsString(l) ? l->valuestring : "";
}

/* "15s", "1m30s", "500ms" (Prometheus's durations) in seconds; NAN when
 * not one. */
static double duration(const char *s) {
    static const struct {
        const char *unit;
        double s;
    } units[] = {{"ms", 1e-3}, {"s", 1},      {"m", 60},      {"h", 3600},
                 {"d", 86400}, {"w", 604800}, {"y", 31536000}};
    double total = 0;
    int any = 0;
    while (s && *s) {
        char *end;
        double v = strtod(s, &end);
        size_t k = 0, nu = sizeof units / sizeof units[0];
        if (end == s)
            return NAN;
        for (; k < nu; k++) /* "ms" before "m" and "s" */
            if (!strncmp(end, units[k].unit, strlen(units[k].unit)))
                break;
        if (k == nu)
            return NAN;
        total += v * units[k].s;
        s = end + strlen(units[k].unit);
        any = 1;
    }
    return any ? total : NAN;
}

int hkc_prom_targets(hkc_prom *p, size_t *n, double *max_s, char *err, size_t cap) {
    cJSON *doc;
    *max_s = NAN;
    *n = 0;
    int st = get(p, "/api/v1/targets?state=active", &doc, err, cap);
    if (st)
        return st;
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(
                              cJSON_GetObjectItemCaseSensitive(doc, "data"), "activeTargets")) {
        const cJSON *iv = cJSON_GetObjectItemCaseSensitive(t, "scrapeInterval");
        double d = cJSON_IsString(iv) ? duration(iv->valuestring) : NAN;
        ++*n;
        if (d == d && !(*max_s >= d))
            *max_s = d;
    }
    cJSON_Delete(doc);
    return HKC_PROM_OK;
}

/*
 * The puller's options, lifecycle and counters (its polls: net/pull.c).
 *
 * The puller takes the public hk_pull_options, whose defaults
 * live here (hk_pull_options_init_size), and what its caller resolved from
 * them (hkn_pull_resolved: loaded keys, the state directory), net/api.c for
 * hk_pull_start, cli/net_cmds.c for `hotkern pull`.
 *
 * Create copies every string it keeps, opens the shared state, the
 * refused-release memory and the fleet object, and starts the /metrics
 * server when asked; destroy stops the thread first (waking its sleep and
 * aborting a transfer), then frees in the reverse order.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "net/puller.h"

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
    hkn_pull_note_trust(p);
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
    if (pthread_create(&p->thread, NULL, hkn_pull_thread, p) != 0)
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

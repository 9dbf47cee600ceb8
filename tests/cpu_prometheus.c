/*
 * The metrics as a real Prometheus server reads them: Debian's prometheus,
 * started by the test with its own configuration and a temporary data
 * directory, scrapes a runtime's endpoint (fake driver) every second with
 * the endpoint's bearer token; its HTTP API (libcurl, cJSON) then says
 * whether the scrape succeeded (a text Prometheus cannot parse fails the
 * whole scrape, with the parser's error in the target's lastError) and what
 * values it stored, which must be the runtime's own.
 *
 * The server is the harness's (hkt_prometheus_start, tests/harness.c).
 * Skipped, with a SKIP line, where /usr/bin/prometheus (or $HK_PROMETHEUS)
 * is not there; scripts/deps.sh installs it, so CI runs it.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "hotkern/net.h"
#include "loader/port.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

static hk_runtime *rt;
static char *tmp;

static void setup(void) {
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.no_warm_start = 1;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&rt, &o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
}

static void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
    hkt_rmtree(tmp);
    free(tmp);
}

/* ---- the Prometheus server (tests/harness.c) ---------------------------- */

static hkt_prometheus prom;

/* Starts Prometheus scraping 127.0.0.1:target every second with token;
 * returns 1 once its API answers, 0 when it is not installed (SKIP
 * printed). */
static int prom_start(unsigned target, const char *token) {
    char text[512];
    snprintf(text, sizeof text,
             "  - job_name: hotkern\n    authorization:\n"
             "      credentials: %s\n    static_configs:\n"
             "      - targets: ['127.0.0.1:%u']\n        labels:\n          host: h1\n",
             token, target);
    int st = hkt_prometheus_start(&prom, tmp, text);
    ck_assert_msg(st >= 0, "prometheus did not start (see %s/prometheus.log)", tmp);
    return st;
}

/* The API's answer to path (with its query string), parsed; status
 * "success" checked. */
static cJSON *api(const char *path) {
    cJSON *j = hkt_prometheus_api(&prom, path);
    ck_assert_msg(j != NULL, "GET %s: no answer, or not a success", path);
    return j;
}

/* The scrape's state once Prometheus has scraped the target: 1 up, 0 down
 * (the error copied to err); -1 not scraped yet. */
static int target_state(char *err, size_t cap) {
    cJSON *j = api("/api/v1/targets?state=active");
    cJSON *ts = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "data"),
                                                 "activeTargets");
    int state = -1;
    cJSON *t = cJSON_GetArrayItem(ts, 0);
    if (t) {
        cJSON *health = cJSON_GetObjectItemCaseSensitive(t, "health");
        cJSON *last = cJSON_GetObjectItemCaseSensitive(t, "lastError");
        snprintf(err, cap, "%s", cJSON_IsString(last) ? last->valuestring : "");
        if (cJSON_IsString(health) && !strcmp(health->valuestring, "up"))
            state = 1;
        else if (cJSON_IsString(health) && !strcmp(health->valuestring, "down"))
            state = 0;
    }
    cJSON_Delete(j);
    return state;
}

/* The value Prometheus holds for an instant query, NAN when it has no
 * sample. */
static double query(const char *promql) {
    return hkt_prometheus_query(&prom, promql);
}

static void swap_ok(const char *mod, int tag) {
    hk_report rep = HK_REPORT_INIT;
    const char *src = fake_ptx(tag, 0, 0, 0);
    int err = hk_swap(rt, mod, src, strlen(src), NULL, &rep);
    ck_assert_msg(err == 0, "swap: %s", rep.message);
    hk_report_clear(&rep);
}

/* ---- tests ------------------------------------------------------------- */

/* Prometheus scrapes the endpoint's /metrics and takes all of it: the
 * scrape is up with no error, and what it stored is the runtime's count of
 * swaps, refusals, and the swap-time histogram's count and buckets, with the
 * target's own label beside hotkern's. */
START_TEST(prometheus_takes_the_metrics) {
    static const char bad[] = ".version 8.0\n.target sm_90\n// SYNTAX ERROR\n";
    hk_report rep = HK_REPORT_INIT;
    swap_ok("m", 1);
    swap_ok("m", 2);
    swap_ok("other", 3);
    ck_assert_int_ne(hk_swap(rt, "m", bad, strlen(bad), NULL, &rep), 0);
    hk_report_clear(&rep);
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);

    hk_endpoint_options o;
    hk_endpoint *ep = NULL;
    hk_endpoint_options_init(&o);
    o.token = "scrape-token";
    o.allow_unsigned = 1;
    ck_assert_msg(hk_endpoint_start(rt, &o, &ep, &rep) == 0, "%s", rep.message);
    unsigned port = hk_endpoint_port(ep);
    if (!prom_start(port, "scrape-token")) {
        hk_endpoint_stop(ep);
        return;
    }
    char err[1024] = "";
    int state = -1;
    for (int i = 0; i < 300 && state < 0; i++) { /* a scrape a second: 30 s at most */
        state = target_state(err, sizeof err);
        if (state < 0)
            usleep(100 * 1000);
    }
    ck_assert_msg(state == 1, "prometheus: target %s: %s", state ? "never scraped" : "down", err);
    ck_assert_str_eq(err, "");

    hk_stats st;
    hk_stats_init(&st);
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.swaps, 3);
    ck_assert_double_eq(query("hotkern_swaps_total{job=\"hotkern\",host=\"h1\"}"),
                        (double)st.swaps);
    ck_assert_double_eq(query("hotkern_refused_total"), (double)st.refused);
    ck_assert_double_eq(query("hotkern_swap_duration_seconds_count"), (double)st.swaps);
    ck_assert_double_eq(query("hotkern_swap_duration_seconds_bucket{le=\"+Inf\"}"),
                        (double)st.swaps);
    /* Every family Prometheus read keeps its name and type: a histogram's
     * quantile can be computed, a counter's rate is defined. */
    double q = query("histogram_quantile(0.5, hotkern_swap_duration_seconds_bucket)");
    ck_assert_msg(q == q && q >= 0, "histogram_quantile: %g", q);
    ck_assert_double_eq(query("up{job=\"hotkern\"}"), 1);
    /* As many samples stored as the text holds, per Prometheus itself. */
    double scraped = query("scrape_samples_scraped{job=\"hotkern\"}");
    double kept = query("scrape_samples_post_metric_relabeling{job=\"hotkern\"}");
    ck_assert_msg(scraped > 20 && scraped == kept, "scraped %g, kept %g", scraped, kept);
    hkt_prometheus_stop(&prom);
    hk_endpoint_stop(ep);
}
END_TEST

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    Suite *s = suite_create("prometheus");
    TCase *tc = tcase_create("scrape");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, prometheus_takes_the_metrics);
    suite_add_tcase(s, tc);
    int rc = hkt_run(s);
    curl_global_cleanup();
    return rc;
}

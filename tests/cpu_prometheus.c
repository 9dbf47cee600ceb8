/*
 * The metrics as a real Prometheus server reads them: Debian's prometheus,
 * started by the test with its own configuration and a temporary data
 * directory, scrapes a runtime's endpoint (fake driver) every second with
 * the endpoint's bearer token; its HTTP API (libcurl, cJSON) then says
 * whether the scrape succeeded (a text Prometheus cannot parse fails the
 * whole scrape, with the parser's error in the target's lastError) and what
 * values it stored, which must be the runtime's own.
 *
 * Skipped, with a SKIP line, where /usr/bin/prometheus (or $HK_PROMETHEUS)
 * is not there; scripts/deps.sh installs it, so CI runs it.
 */
#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
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

/* ---- a GET with libcurl ------------------------------------------------ */

struct resp {
    char *data;
    size_t len;
};

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
    struct resp *r = ud;
    char *d = realloc(r->data, r->len + sz * n + 1);
    if (!d)
        return 0;
    memcpy(d + r->len, p, sz * n);
    r->len += sz * n;
    d[r->len] = '\0';
    r->data = d;
    return sz * n;
}

/* GET url (the query string escaped by the caller); the body (owned), or
 * NULL when the server did not answer 200. */
static char *get(const char *url, const char *token) {
    struct resp r = {calloc(1, 1), 0};
    struct curl_slist *h = NULL;
    char auth[128];
    long status = 0;
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    }
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    if (rc != CURLE_OK || status != 200) {
        free(r.data);
        return NULL;
    }
    return r.data;
}

/* ---- the Prometheus server --------------------------------------------- */

static pid_t prom_pid;
static int prom_port;

static int free_port(void) {
    /* Bound to port 0 and closed: the kernel's choice, free a moment ago. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (void *)&a, &n)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* Starts Prometheus scraping 127.0.0.1:target every second with token;
 * returns 1 once its API answers, 0 when it is not installed (SKIP
 * printed). */
static int prom_start(unsigned target, const char *token) {
    const char *bin = getenv("HK_PROMETHEUS");
    if (!bin)
        bin = "/usr/bin/prometheus";
    if (access(bin, X_OK) != 0) {
        printf("SKIP prometheus: %s is not there (scripts/deps.sh installs it)\n", bin);
        return 0;
    }
    char conf[PATH_MAX], data[PATH_MAX], text[1024], listen[64], cfg_arg[PATH_MAX + 16],
        data_arg[PATH_MAX + 24], log[PATH_MAX];
    snprintf(conf, sizeof conf, "%s/prometheus.yml", tmp);
    snprintf(data, sizeof data, "%s/prom-data", tmp);
    snprintf(log, sizeof log, "%s/prometheus.log", tmp);
    snprintf(text, sizeof text,
             "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
             "scrape_configs:\n  - job_name: hotkern\n    authorization:\n"
             "      credentials: %s\n    static_configs:\n"
             "      - targets: ['127.0.0.1:%u']\n        labels:\n          host: h1\n",
             token, target);
    ck_assert_int_eq(hkt_write_file(conf, text), 0);
    snprintf(cfg_arg, sizeof cfg_arg, "--config.file=%s", conf);
    snprintf(data_arg, sizeof data_arg, "--storage.tsdb.path=%s", data);
    for (int attempt = 0; attempt < 5; attempt++) {
        prom_port = free_port();
        ck_assert_int_gt(prom_port, 0);
        snprintf(listen, sizeof listen, "--web.listen-address=127.0.0.1:%d", prom_port);
        prom_pid = fork();
        ck_assert_int_ge(prom_pid, 0);
        if (prom_pid == 0) {
            int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
            if (fd >= 0)
                dup2(fd, 2);
            execl(bin, "prometheus", cfg_arg, data_arg, listen, "--log.level=warn", (char *)NULL);
            _exit(127);
        }
        char url[128];
        snprintf(url, sizeof url, "http://127.0.0.1:%d/-/ready", prom_port);
        for (int i = 0; i < 300; i++) { /* up to 30 s */
            char *b = get(url, NULL);
            if (b) {
                free(b);
                return 1;
            }
            if (waitpid(prom_pid, NULL, WNOHANG) == prom_pid)
                break; /* exited: the port was most likely taken meanwhile */
            usleep(100 * 1000);
        }
        kill(prom_pid, SIGKILL);
        waitpid(prom_pid, NULL, 0);
    }
    ck_abort_msg("prometheus did not start (see %s)", log);
    return 0;
}

static void prom_stop(void) {
    if (prom_pid <= 0)
        return;
    kill(prom_pid, SIGTERM);
    for (int i = 0; i < 100 && waitpid(prom_pid, NULL, WNOHANG) != prom_pid; i++)
        usleep(50 * 1000);
    kill(prom_pid, SIGKILL); /* harmless once it has exited */
    waitpid(prom_pid, NULL, WNOHANG);
    prom_pid = 0;
}

/* The API's answer to path (with its query string), parsed; status
 * "success" checked. */
static cJSON *api(const char *path) {
    char url[1024];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", prom_port, path);
    char *b = get(url, NULL);
    ck_assert_msg(b != NULL, "GET %s failed", url);
    cJSON *j = cJSON_Parse(b);
    ck_assert_msg(j != NULL, "not JSON: %s", b);
    cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "status");
    ck_assert_msg(cJSON_IsString(st) && !strcmp(st->valuestring, "success"), "%s", b);
    free(b);
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

/* The value Prometheus holds for an instant query (URL-escaped by curl
 * here), NAN when it has no sample. */
static double query(const char *promql) {
    CURL *c = curl_easy_init();
    char *q = curl_easy_escape(c, promql, 0);
    char path[1024];
    snprintf(path, sizeof path, "/api/v1/query?query=%s", q);
    curl_free(q);
    curl_easy_cleanup(c);
    cJSON *j = api(path);
    cJSON *res =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "data"), "result");
    double v = 0.0 / 0.0;
    cJSON *first = cJSON_GetArrayItem(res, 0);
    cJSON *val = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(first, "value"), 1);
    if (cJSON_IsString(val))
        v = strtod(val->valuestring, NULL);
    cJSON_Delete(j);
    return v;
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
    prom_stop();
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

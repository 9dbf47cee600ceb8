/*
 * The puller's logs and metrics: against a closed port it says when it
 * retries; against a libmicrohttpd origin serving a release an untrusted
 * key signed, why it refuses; its URL cannot break the metrics text.
 */
#include "tests/obs/fixture.h"

/* ---- the puller ------------------------------------------------------- */

/* A port on 127.0.0.1 that refuses connections: bound, never listening
 * (the socket stays open so that nobody else takes the port). */
static int closed_port(unsigned *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static hk_puller *start_puller(const char *url, const char *key) {
    hk_pull_options o;
    hk_puller *p = NULL;
    hk_report rep = HK_REPORT_INIT;
    const char *keys[] = {key};
    hk_pull_options_init(&o);
    o.url = url;
    o.interval_ms = 50;
    o.jitter_pct = 0; /* the delays below are then exact */
    o.max_backoff_ms = 400;
    o.connect_timeout_ms = 2000;
    o.state_dir = "";
    o.trusted_keys = key ? keys : NULL;
    o.ntrusted_keys = key ? 1 : 0;
    ck_assert_msg(hk_pull_start(rt, &o, &p, &rep) == 0, "%s", rep.message);
    return p;
}

START_TEST(puller_says_when_it_retries) {
    unsigned port1, port2;
    char url1[128], url2[128], series[256];
    int fd1 = closed_port(&port1), fd2 = closed_port(&port2);
    snprintf(url1, sizeof url1, "http://127.0.0.1:%u/r/manifest.json", port1);
    snprintf(url2, sizeof url2, "http://127.0.0.1:%u/r/manifest.json", port2);
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_DEBUG), 0);
    hk_puller *p1 = start_puller(url1, NULL);
    wait_line(HK_LOG_DEBUG, "pull", NEEDLES("polling", url1), NULL, 0);
    wait_line(HK_LOG_WARN, "pull", NEEDLES(url1, "HK_ERR_NETWORK", "retry 1 in 100 ms"), NULL, 0);
    wait_line(HK_LOG_WARN, "pull", NEEDLES(url1, "retry 2 in 200 ms"), NULL, 0);
    wait_line(HK_LOG_WARN, "pull", NEEDLES(url1, "retry 4 in 400 ms", "backoff up to 400"), NULL,
              0);
    /* Two pullers: one family each, a series per URL. */
    hk_puller *p2 = start_puller(url2, NULL);
    wait_line(HK_LOG_WARN, "pull", NEEDLES(url2, "retry 1 in 100 ms"), NULL, 0);
    char *text = metrics();
    assert_valid(text);
    snprintf(series, sizeof series, "hotkern_pull_errors_total{url=\"%s\"}", url1);
    ck_assert_msg(sample_value(text, series) >= 4, "%s\n%s", series, text);
    snprintf(series, sizeof series, "hotkern_pull_errors_total{url=\"%s\"}", url2);
    ck_assert_msg(sample_value(text, series) >= 1, "%s\n%s", series, text);
    snprintf(series, sizeof series, "hotkern_pull_consecutive_failures{url=\"%s\"}", url1);
    ck_assert_msg(sample_value(text, series) >= 4, "%s\n%s", series, text);
    const char *t = strstr(text, "# TYPE hotkern_pull_errors_total ");
    ck_assert_ptr_nonnull(t);
    ck_assert_ptr_null(strstr(t + 1, "# TYPE hotkern_pull_errors_total "));
    free(text);
    hk_pull_stop(p1);
    hk_pull_stop(p2);
    close(fd1);
    close(fd2);
}
END_TEST

/* A puller's URL labels its metrics: one with a CR, LF, a space or a byte
 * that is no UTF-8 is refused when the puller starts, and the runtime's
 * metrics stay valid exposition text. */
START_TEST(puller_url_cannot_break_metrics) {
    static const char *const bad[] = {
        "http://127.0.0.1:1/m.json\r\nhotkern_fake 1",
        "http://127.0.0.1:1/m\r.json",
        "http://127.0.0.1:1/\xff\xfe.json",
        "http://127.0.0.1:1/a b/m.json",
        "http://127.0.0.1:1/\x7f.json",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hk_pull_options o;
        hk_puller *p = NULL;
        hk_report rep = HK_REPORT_INIT;
        hk_pull_options_init(&o);
        o.url = bad[i];
        o.state_dir = "";
        o.allow_unsigned = 1;
        int err = hk_pull_start(rt, &o, &p, &rep);
        char *text = metrics();
        assert_valid(text);
        ck_assert_ptr_null(strstr(text, "hotkern_fake"));
        free(text);
        hk_pull_stop(p);
        ck_assert_msg(err == HK_ERR_INVALID && strstr(rep.message, "printable ASCII"),
                      "URL %zu: %d %s", i, err, rep.message);
        ck_assert_ptr_null(p);
        hk_report_clear(&rep);
    }
    hk_pull_options o;
    hk_puller *p = NULL;
    hk_report rep = HK_REPORT_INIT;
    hk_pull_options_init(&o);
    o.url = "http://127.0.0.1:1/m.json";
    o.artifact_base = "http://127.0.0.1:1/\n";
    o.state_dir = "";
    o.allow_unsigned = 1;
    ck_assert_int_eq(hk_pull_start(rt, &o, &p, &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "artifact_base"), "%s", rep.message);
}
END_TEST

/* A static origin: the manifest and its signature from memory. */
static char *origin_manifest, *origin_sig;

static enum MHD_Result serve(void *cls, struct MHD_Connection *c, const char *url,
                             const char *method, const char *version, const char *upload,
                             size_t *upload_size, void **con_cls) {
    const char *text = !strcmp(url, "/r/manifest.json")       ? origin_manifest
                       : !strcmp(url, "/r/manifest.json.sig") ? origin_sig
                                                              : NULL;
    struct MHD_Response *r = MHD_create_response_from_buffer(
        text ? strlen(text) : 9, (void *)(text ? text : "not found"), MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret = MHD_queue_response(c, text ? 200 : 404, r);
    MHD_destroy_response(r);
    return ret;
}

START_TEST(puller_says_why_it_refuses) {
    char url[128];
    size_t mlen;
    hk_report rep = HK_REPORT_INIT;
    make_keys();
    const char *ptx = fake_ptx(1, 0, 0, 0);
    hkn_blob b = {.name = "m.ptx", .bytes = ptx, .size = strlen(ptx)};
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(hkn_release_sign(&stranger, "m", 4, now, now + 600, &b, 1, &origin_manifest,
                                      &mlen, &origin_sig, &rep),
                     0);
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, serve,
                                            NULL, MHD_OPTION_END);
    ck_assert_ptr_nonnull(d);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(url, sizeof url, "http://127.0.0.1:%u/r/manifest.json", (unsigned)di->port);
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_INFO), 0);
    hk_puller *p = start_puller(url, pub_path);
    wait_line(HK_LOG_WARN, "pull", NEEDLES("refused the manifest at", url, "HK_ERR_SIGNATURE"),
              NULL, 0);
    wait_line(HK_LOG_WARN, "pull", NEEDLES(url, "HK_ERR_SIGNATURE", "retry 1 in 100 ms"), NULL, 0);
    hk_pull_stop(p);
    MHD_stop_daemon(d);
    free(origin_manifest);
    free(origin_sig);
    ck_assert_uint_eq(hk_module_version(rt, "m"), 0);
}
END_TEST

void obs_puller_tests(TCase *tc) {
    tcase_add_test(tc, puller_says_when_it_retries);
    tcase_add_test(tc, puller_says_why_it_refuses);
    tcase_add_test(tc, puller_url_cannot_break_metrics);
}

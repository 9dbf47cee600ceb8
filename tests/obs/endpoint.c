/*
 * The endpoint's logs and metrics, driven with libcurl: it says why it
 * refuses, its status shows the quarantine, and its metrics are the
 * runtime's.
 */
#include "tests/obs/fixture.h"

/* A release of module m (one PTX artifact) signed by k, as a push body. */
static char *release_body(const hkn_seckey *k, const char *module, uint64_t version, int tag) {
    const char *ptx = fake_ptx(tag, 0, 0, 0);
    hkn_blob b = {.name = "m.ptx", .bytes = ptx, .size = strlen(ptx)};
    char *manifest, *sig, hex[65], *b64 = malloc(strlen(ptx) * 2 + 8);
    size_t mlen;
    hk_report rep = HK_REPORT_INIT;
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(
        hkn_release_sign(k, module, version, now, now + 600, &b, 1, &manifest, &mlen, &sig, &rep),
        0);
    hkn_sha256_hex(ptx, strlen(ptx), hex);
    sodium_bin2base64(b64, strlen(ptx) * 2 + 8, (const unsigned char *)ptx, strlen(ptx),
                      sodium_base64_VARIANT_ORIGINAL);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "manifest", manifest);
    cJSON_AddStringToObject(o, "signature", sig);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "artifacts"), hex, b64);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(manifest);
    free(sig);
    free(b64);
    return text;
}

static hk_endpoint *start_endpoint(unsigned *port) {
    char state[PATH_MAX];
    const char *keys[] = {pub_path};
    hk_endpoint_options o;
    hk_endpoint *ep = NULL;
    hk_report rep = HK_REPORT_INIT;
    snprintf(state, sizeof state, "%s/state", tmp);
    hk_endpoint_options_init(&o);
    o.token = "tok";
    o.trusted_keys = keys;
    o.ntrusted_keys = 1;
    o.state_dir = state;
    o.max_body_bytes = 64 * 1024;
    ck_assert_msg(hk_endpoint_start(rt, &o, &ep, &rep) == 0, "%s", rep.message);
    *port = hk_endpoint_port(ep);
    return ep;
}

START_TEST(endpoint_says_why_it_refuses) {
    char line[1024];
    unsigned port;
    make_keys();
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_INFO), 0);
    hk_endpoint *ep = start_endpoint(&port);
    wait_line(HK_LOG_INFO, "endpoint", NEEDLES("listening on 127.0.0.1", "bearer token"), NULL, 0);

    ck_assert_int_eq(http(port, "GET", "/v1/status", NULL, NULL, 0, NULL), 401);
    wait_line(
        HK_LOG_WARN, "endpoint",
        NEEDLES("refused GET /v1/status from 127.0.0.1", "401", "missing or wrong bearer token"),
        NULL, 0);

    size_t big = 100 * 1024;
    char *junk = malloc(big);
    memset(junk, 'x', big);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", junk, big, NULL), 413);
    free(junk);
    wait_line(HK_LOG_WARN, "endpoint",
              NEEDLES("refused POST /v1/release", "413", "102400 bytes is over the cap of 65536"),
              NULL, 0);

    char *body = release_body(&stranger, "m", 7, 1);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), NULL), 403);
    free(body);
    wait_line(HK_LOG_WARN, "endpoint", NEEDLES("refused release", "403 HK_ERR_SIGNATURE"), line,
              sizeof line);

    body = release_body(&trusted, "m", 7, 2);
    char *answer = NULL;
    long code = http(port, "POST", "/v1/release", "tok", body, strlen(body), &answer);
    ck_assert_msg(code == 200, "%ld %s", code, answer);
    free(answer);
    free(body);
    wait_line(HK_LOG_INFO, "endpoint", NEEDLES("POST /v1/release from 127.0.0.1", "queued"), NULL,
              0);
    wait_line(HK_LOG_INFO, "endpoint", NEEDLES("release of m v7", "done: engine v1"), NULL, 0);
    wait_line(HK_LOG_INFO, "engine", NEEDLES("committed m v1", "from push"), NULL, 0);
    hk_endpoint_stop(ep);
}
END_TEST

/* Removes the lines of series that change with every request. */
static void drop_volatile(char *text) {
    static const char *const vol[] = {"hotkern_push_requests_total{", "hotkern_push_connections{"};
    char *out = text;
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p + 1) : strlen(p);
        int drop = 0;
        for (size_t i = 0; i < sizeof vol / sizeof vol[0]; i++)
            drop |= !strncmp(p, vol[i], strlen(vol[i]));
        if (!drop) {
            memmove(out, p, n);
            out += n;
        }
        p += n;
    }
    *out = '\0';
}

/* A lost context quarantines the release just pushed: /v1/status lists it
 * with its release version, and the same image under a newer release
 * version is refused (409), while a different image goes in. */
START_TEST(endpoint_status_shows_the_quarantine) {
    unsigned port;
    make_keys();
    hk_endpoint *ep = start_endpoint(&port);
    char *body = release_body(&trusted, "m", 3, 2);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), NULL), 200);
    free(body);
    ck_assert_int_eq(hk_runtime_note_error(rt, CUDA_ERROR_ILLEGAL_ADDRESS), 1);

    char *status = NULL;
    ck_assert_int_eq(http(port, "GET", "/v1/status", "tok", NULL, 0, &status), 200);
    cJSON *j = cJSON_Parse(status);
    ck_assert_ptr_nonnull(j);
    cJSON *q = cJSON_GetObjectItem(j, "quarantine");
    ck_assert_msg(cJSON_IsArray(q) && cJSON_GetArraySize(q) == 1, "%s", status);
    cJSON *e = cJSON_GetArrayItem(q, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(e, "module")->valuestring, "m");
    ck_assert_int_eq((int)cJSON_GetObjectItem(e, "release_version")->valuedouble, 3);
    ck_assert_int_eq(strlen(cJSON_GetObjectItem(e, "image")->valuestring), 64);
    cJSON_Delete(j);
    free(status);

    char *answer = NULL;
    body = release_body(&trusted, "m", 4, 2);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), &answer), 409);
    ck_assert_msg(strstr(answer, "HK_ERR_QUARANTINED"), "%s", answer);
    free(answer);
    free(body);
    body = release_body(&trusted, "m", 5, 3);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), NULL), 200);
    free(body);
    char *text = metrics();
    ck_assert_msg(sample_value(text, "hotkern_quarantined_images") == 1, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_context_lost_total") == 1, "%s", text);
    free(text);
    hk_endpoint_stop(ep);
}
END_TEST

START_TEST(endpoint_metrics_are_the_runtimes) {
    unsigned port;
    char series[256];
    make_keys();
    hk_endpoint *ep = start_endpoint(&port);
    ck_assert_int_eq(http(port, "GET", "/v1/status", "wrong", NULL, 0, NULL), 401);
    char *body = release_body(&stranger, "m", 3, 1);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), NULL), 403);
    free(body);
    body = release_body(&trusted, "m", 3, 2);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), NULL), 200);
    free(body);
    swap_ok("other", 5);
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);

    char *served = NULL;
    ck_assert_int_eq(http(port, "GET", "/metrics", "tok", NULL, 0, &served), 200);
    char *text = metrics();
    assert_valid(served);
    assert_valid(text);
    snprintf(series, sizeof series, "hotkern_push_unauthorized_total{endpoint=\"127.0.0.1:%u\"}",
             port);
    ck_assert_msg(sample_value(text, series) == 1, "%s\n%s", series, text);
    snprintf(series, sizeof series,
             "hotkern_push_refusals_total{endpoint=\"127.0.0.1:%u\",error=\"HK_ERR_SIGNATURE\"}",
             port);
    ck_assert_msg(sample_value(text, series) == 1, "%s\n%s", series, text);
    snprintf(series, sizeof series,
             "hotkern_module_release_version{endpoint=\"127.0.0.1:%u\",module=\"m\"}", port);
    ck_assert_msg(sample_value(text, series) == 3, "%s\n%s", series, text);
    snprintf(series, sizeof series, "hotkern_push_requests_total{endpoint=\"127.0.0.1:%u\"}", port);
    ck_assert_msg(sample_value(served, series) == 4, "%s\n%s", series, served);
    ck_assert_msg(sample_value(text, "hotkern_swaps_total") == 2, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_swap_duration_seconds_count") == 2, "%s", text);
    /* The same text, but for what the GET itself changed. */
    drop_volatile(served);
    drop_volatile(text);
    ck_assert_str_eq(served, text);
    free(served);
    free(text);
    hk_endpoint_stop(ep);
    /* Stopped: its families are gone from the runtime's text. */
    text = metrics();
    ck_assert_ptr_null(strstr(text, "hotkern_push_"));
    assert_valid(text);
    free(text);
}
END_TEST

void obs_endpoint_tests(TCase *tc) {
    tcase_add_test(tc, endpoint_says_why_it_refuses);
    tcase_add_test(tc, endpoint_metrics_are_the_runtimes);
    tcase_add_test(tc, endpoint_status_shows_the_quarantine);
}

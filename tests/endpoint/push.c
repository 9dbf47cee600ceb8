/*
 * Pushes that commit: by curl and by the CLI, with their headers, the
 * replay state recorded before the commit and kept over a restart, the
 * CLI's expiry range, a push through the sample nginx proxy, and the
 * metrics the endpoint serves (Prometheus text).
 */
#include "tests/endpoint/fixture.h"

START_TEST(push_with_curl_commits) {
    start(NULL, 0, NULL, NULL);
    char body[8192];
    int code = curl_req("POST", "/v1/release",
                        body_file(&key, "add", 5, time(NULL) + 60, T_NONE, "b.json"), NULL, body,
                        sizeof body);
    ck_assert_msg(code == 200, "HTTP %d: %s", code, body);
    ck_assert(json_has(body, "outcome", "committed"));
    ck_assert(json_has(body, "module", "add"));
    pthread_mutex_lock(&rec.lock);
    ck_assert_int_eq(rec.calls, 1);
    ck_assert_str_eq(rec.module, "add");
    ck_assert_uint_eq(rec.version, 5);
    ck_assert_int_eq(rec.fmt, HK_FORMAT_CUDA_C);
    ck_assert_str_eq(rec.origin, "push");
    ck_assert_uint_eq(rec.size, strlen(kernel_src));
    ck_assert_mem_eq(rec.bytes, kernel_src, rec.size);
    pthread_mutex_unlock(&rec.lock);
    /* Status shows the release. */
    code = curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body);
    ck_assert_int_eq(code, 200);
    cJSON *o = cJSON_Parse(body);
    const cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "modules"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(m0, "module")->valuestring, "add");
    ck_assert_int_eq((int)cJSON_GetObjectItem(m0, "release_version")->valuedouble, 5);
    ck_assert_str_eq(cJSON_GetObjectItem(m0, "last_outcome")->valuestring, "committed");
    cJSON_Delete(o);
    ck_assert_int_eq(curl_req("GET", "/healthz", NULL, NULL, NULL, 0), 200);
    ck_assert_int_eq(curl_req("GET", "/nope", NULL, NULL, NULL, 0), 404);
    ck_assert_int_eq(curl_req("GET", "/v1/release", NULL, NULL, NULL, 0), 405);
}
END_TEST

START_TEST(push_with_cli_commits) {
    start(NULL, 0, NULL, NULL);
    const char *cli = cli_path();
    char out[16384];
    char *push[] = {(char *)cli, "push",      base, "--key",  key_path, "--module",
                    "add",       "--release", "42", src_path, NULL};
    int rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    ck_assert_msg(strstr(out, "committed"), "%s", out);
    ck_assert_uint_eq(rec_current(), 42);
    pthread_mutex_lock(&rec.lock);
    ck_assert_mem_eq(rec.bytes, kernel_src, strlen(kernel_src));
    pthread_mutex_unlock(&rec.lock);
    /* The same version again: refused as a replay, exit 1. */
    rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_REPLAY"), "exit %d: %s", rc, out);
    /* Default version (unix ms) is newer than 42. */
    char *push2[] = {(char *)cli, "push", base,     "--key", key_path,
                     "--module",  "add",  src_path, NULL};
    rc = run(push2, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    ck_assert(rec_current() > 1000000000000ull);

    char *status[] = {(char *)cli, "status", base, NULL};
    rc = run(status, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "\nadd ") && strstr(out, "committed"), "exit %d: %s", rc,
                  out);
    /* A signed rollback, to the previous release the status reports. */
    char *rb[] = {(char *)cli, "rollback", base, "add", "--key", key_path, NULL};
    rc = run(rb, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "rolled_back"), "exit %d: %s", rc, out);
    char *rb2[] = {(char *)cli, "rollback", base, "nosuch", "--key", key_path, "--to", "1", NULL};
    rc = run(rb2, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_NOT_FOUND"), "exit %d: %s", rc, out);
    char *help[] = {(char *)cli, "push", "--help", NULL};
    ck_assert_int_eq(run(help, out, sizeof out), 0);
    char *bad[] = {(char *)cli, "push", base, NULL};
    ck_assert_int_eq(run(bad, out, sizeof out), 2);
}
END_TEST

/* A kernel that includes "common.cuh", pushed with it, builds where the
 * header does not exist as a file: the endpoint hands it to the engine. */
START_TEST(push_carries_headers) {
    start(NULL, 0, NULL, NULL);
    const char *cli = cli_path();
    char out[16384], hpath[PATH_MAX + 16], kpath[PATH_MAX + 16];
    static const char ksrc[] = "#include \"common.cuh\"\n"
                               "__device__ int arr[K];\n"
                               "extern \"C\" __global__ void add(int *x) { x[0] = arr[1]; }\n";
    snprintf(hpath, sizeof hpath, "%s/common.cuh", tmp);
    snprintf(kpath, sizeof kpath, "%s/k.cu", tmp);
    ck_assert_int_eq(hkt_write_file(hpath, "#define K 6\n"), 0);
    ck_assert_int_eq(hkt_write_file(kpath, ksrc), 0);
    char *push[] = {(char *)cli, "push", base,  "--key", key_path,
                    "--module",  "k",    hpath, kpath,   NULL};
    int rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    pthread_mutex_lock(&rec.lock);
    ck_assert_int_eq(rec.fmt, HK_FORMAT_CUDA_C);
    ck_assert_int_eq(rec.nheaders, 1);
    ck_assert_str_eq(rec.hname[0], "common.cuh");
    ck_assert_str_eq(rec.hdata[0], "#define K 6\n");
    pthread_mutex_unlock(&rec.lock);
    /* Build on this thread once the server's threads are joined: NVRTC and
     * libmicrohttpd both use libc's time-zone state, whose lock the thread
     * sanitizer cannot see. */
    hkn_endpoint_stop(ep);
    ep = NULL;
    pthread_mutex_lock(&rec.lock);
    hk_header h = {rec.hname[0], rec.hdata[0], strlen(rec.hdata[0])};
    hkp_build_opts o = {.arch = 90,
                        .ptx_to_cubin = 1,
                        .opt_level = 3,
                        .headers = &h,
                        .nheaders = 1,
                        .source_name = "k@v1"};
    hkp_artifact a;
    char why[512];
    int err = hkp_build(rec.bytes, rec.size, rec.fmt, &o, &a, why, sizeof why);
    pthread_mutex_unlock(&rec.lock);
    ck_assert_msg(err == 0, "%s\n%s", why, a.log ? a.log : "");
    ck_assert_int_eq(a.meta.nglobals, 1);
    ck_assert_uint_eq(a.meta.globals[0].size, 6 * sizeof(int));
    hkp_artifact_free(&a);
}
END_TEST

START_TEST(replay_state_survives_restart) {
    start(NULL, 0, NULL, NULL);
    const char *f = body_file(&key, "add", 7, time(NULL) + 60, T_NONE, "b.json");
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, NULL, 0), 200);
    hkn_endpoint_stop(ep);
    ep = NULL;
    start(NULL, 0, NULL, NULL); /* same state dir */
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, NULL, 0), 409);
    ck_assert_int_eq(rec_calls(), 1);
}
END_TEST

START_TEST(metrics_are_prometheus_text) {
    start(NULL, 0, NULL, NULL);
    const char *f = body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "b.json");
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, NULL, 0), 200);
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, NULL, 0), 409);
    char body[16384];
    ck_assert_int_eq(curl_req("GET", "/metrics", NULL, NULL, body, sizeof body), 200);
    ck_assert_ptr_nonnull(strstr(body, "hotkern_swaps_total 1\n"));
    ck_assert_ptr_nonnull(strstr(body, "hotkern_push_releases_total{outcome=\"committed\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(body, "hotkern_push_refusals_total{error=\"HK_ERR_REPLAY\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(body, "hotkern_module_release_version{module=\"add\"} 3\n"));
    ck_assert_msg(strstr(body, "hotkern_stage_seconds_total 0.042\n"), "%s", body);
    ck_assert_ptr_nonnull(strstr(body, "hotkern_retired_loaded 0\n"));
    check_prometheus(body);
}
END_TEST

/* The anti-rollback record is on disk before the engine commits (so a crash
 * in between cannot reopen the release), and taken back if it refuses. */
START_TEST(recorded_before_commit) {
    snprintf(rec.state_file, sizeof rec.state_file, "%s/state/accepted.json", tmp);
    start(NULL, 0, NULL, NULL);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 5, time(NULL) + 60, T_NONE, "b.json"), NULL,
                              NULL, 0),
                     200);
    pthread_mutex_lock(&rec.lock);
    int first = rec.recorded_first;
    pthread_mutex_unlock(&rec.lock);
    ck_assert_int_eq(first, 1);
    ck_assert(state_records(rec.state_file, "add", 5));
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = HK_ERR_COMPILE;
    pthread_mutex_unlock(&rec.lock);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 6, time(NULL) + 60, T_NONE, "c.json"), NULL,
                              NULL, 0),
                     422);
    ck_assert(state_records(rec.state_file, "add", 5));
    char body[4096];
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body), 200);
    ck_assert_msg(strstr(body, "before commit") && strstr(body, "accepted.json"), "%s", body);
}
END_TEST

/* --expires-in is range-checked: a value that would overflow the expiry or
 * sign a release no verifier accepts is a usage error, and nothing is
 * written. */
START_TEST(cli_expiry_range) {
    const char *cli = cli_path();
    char out[4096], dir[PATH_MAX], man[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/rel", tmp);
    snprintf(man, sizeof man, "%s/manifest.json", dir);
    static const char *bad[] = {"18446744073709551615", "9223372036854775807", "0", "-1",
                                "31622401"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *sign[] = {(char *)cli, "sign", "--key",        key_path,       "--module", "add",
                        "--release", "1",    "--expires-in", (char *)bad[i], "--out",    dir,
                        src_path,    NULL};
        int rc = run(sign, out, sizeof out);
        ck_assert_msg(rc == 2 && strstr(out, "--expires-in"), "%s: exit %d: %s", bad[i], rc, out);
        ck_assert_int_ne(access(man, F_OK), 0);
    }
    char *ok[] = {(char *)cli, "sign", "--key",        key_path,   "--module", "add",
                  "--release", "1",    "--expires-in", "31622400", "--out",    dir,
                  src_path,    NULL};
    int rc = run(ok, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    start(NULL, 0, NULL, NULL);
    char *push[] = {(char *)cli,      "push",     base,  "--key",
                    key_path,         "--module", "add", "--expires-in",
                    "99999999999999", src_path,   NULL};
    rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 2, "exit %d: %s", rc, out);
    ck_assert_int_eq(rec_calls(), 0);
    /* A module name that is not one is refused before any request. */
    char *rb[] = {(char *)cli, "rollback", base, "a/../b", "--key", key_path, "--to", "1", NULL};
    rc = run(rb, out, sizeof out);
    ck_assert_msg(rc == 2, "exit %d: %s", rc, out);
}
END_TEST

/* The README's sample reverse proxy (its server and location directives,
 * without TLS and the limit zones): a signed push and status go through a
 * real nginx to the endpoint on 127.0.0.1, and a foreign Origin sent to the
 * proxy does not reach the endpoint. */
START_TEST(behind_the_sample_nginx_proxy) {
    start(NULL, 0, NULL, NULL);
    char ndir[PATH_MAX], extra[1024];
    snprintf(ndir, sizeof ndir, "%s/nginx", tmp);
    ck_assert_int_eq(mkdir(ndir, 0700), 0);
    snprintf(extra, sizeof extra,
             "client_max_body_size 96m; client_body_timeout 30s; client_header_timeout 10s;\n"
             "location / {\n"
             "  proxy_pass http://127.0.0.1:%u;\n"
             "  proxy_set_header Host 127.0.0.1;\n"
             "  proxy_set_header Origin \"\";\n"
             "  proxy_request_buffering on;\n"
             "  proxy_read_timeout 120s;\n"
             "}\n",
             hkn_endpoint_port(ep));
    pid_t pid = 0;
    int port = hkt_nginx_start(ndir, ndir, extra, &pid);
    ck_assert_msg(port > 0, "nginx did not start");
    char direct[64];
    snprintf(direct, sizeof direct, "%s", base);
    snprintf(base, sizeof base, "http://127.0.0.1:%d", port);
    char body[8192];
    int code = curl_req("POST", "/v1/release",
                        body_file(&key, "add", 7, time(NULL) + 60, T_NONE, "p.json"), NULL, body,
                        sizeof body);
    int status = curl_req("GET", "/v1/status", NULL, NULL, NULL, 0);
    extra_header = "Origin: https://evil.example";
    int via_proxy = curl_req("GET", "/v1/status", NULL, NULL, NULL, 0);
    snprintf(base, sizeof base, "%s", direct);
    int direct_origin = curl_req("GET", "/v1/status", NULL, NULL, NULL, 0);
    extra_header = NULL;
    hkt_nginx_stop(pid);
    ck_assert_msg(code == 200, "push through the proxy: HTTP %d: %s", code, body);
    ck_assert(json_has(body, "outcome", "committed"));
    ck_assert_uint_eq(rec_current(), 7);
    ck_assert_int_eq(status, 200);
    ck_assert_int_eq(via_proxy, 200);     /* the proxy drops the Origin */
    ck_assert_int_eq(direct_origin, 403); /* the endpoint itself refuses it */
}
END_TEST

void ep_push_tests(TCase *tc) {
    tcase_add_test(tc, push_with_curl_commits);
    tcase_add_test(tc, push_with_cli_commits);
    tcase_add_test(tc, push_carries_headers);
    tcase_add_test(tc, replay_state_survives_restart);
    tcase_add_test(tc, metrics_are_prometheus_text);
    tcase_add_test(tc, recorded_before_commit);
    tcase_add_test(tc, cli_expiry_range);
    tcase_add_test(tc, behind_the_sample_nginx_proxy);
}

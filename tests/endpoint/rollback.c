/*
 * Rollbacks over the endpoint: signed by a trusted key, bound to this
 * endpoint, to the version the engine runs, with names that cannot poison
 * the record.
 */
#include "tests/endpoint/fixture.h"

/* Writes a signed rollback request body for module to target into tmp/name. */
static const char *rollback_file(const hkn_seckey *k, const char *module, uint64_t target,
                                 const char *name) {
    static char path[PATH_MAX];
    char *text, *sig;
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_rollback_sign(k, module, target, time(NULL) + 60, hkn_endpoint_id(ep),
                                       &text, &len, &sig, &rep),
                     0);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "request", text);
    cJSON_AddStringToObject(o, "signature", sig);
    char *body = cJSON_PrintUnformatted(o);
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    ck_assert_int_eq(hkt_write_file(path, body), 0);
    free(body);
    cJSON_Delete(o);
    free(text);
    free(sig);
    return path;
}

START_TEST(rollback_needs_authority) {
    start(NULL, 0, NULL, NULL);
    char body[8192], hdr[128];
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 5, time(NULL) + 60, T_NONE, "5.json"), NULL,
                              NULL, 0),
                     200);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 6, time(NULL) + 60, T_NONE, "6.json"), NULL,
                              NULL, 0),
                     200);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 7, time(NULL) + 60, T_NONE, "7.json"), NULL,
                              NULL, 0),
                     200);
    /* No token configured, trusted keys are: an unsigned rollback is refused. */
    int code = curl_req("POST", "/v1/rollback/add", NULL, NULL, body, sizeof body);
    ck_assert_msg(code == 403 && json_has(body, "error", "HK_ERR_SIGNATURE"), "%d %s", code, body);
    /* Signed by a stranger: refused. */
    hkn_seckey stranger;
    hkn_keygen(&stranger);
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&stranger, "add", 5, "s.json"), NULL,
                    body, sizeof body);
    ck_assert_msg(code == 403, "%d %s", code, body);
    /* Signed for another module than the URL's: refused. */
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "mul", 5, "m.json"), NULL, body,
                    sizeof body);
    ck_assert_msg(code == 403, "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 0);
    /* Signed, to the previous release: done, once. */
    const char *ok = rollback_file(&key, "add", 6, "r6.json");
    code = curl_req("POST", "/v1/rollback/add", ok, NULL, body, sizeof body);
    ck_assert_msg(code == 200 && json_has(body, "outcome", "rolled_back"), "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 1);
    code = curl_req("POST", "/v1/rollback/add", ok, NULL, body, sizeof body);
    ck_assert_msg(code == 409 && json_has(body, "error", "HK_ERR_REPLAY"), "%d %s", code, body);
    /* Now v6 runs; a request for v6 again names the wrong target. */
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "add", 6, "r6b.json"), NULL,
                    body, sizeof body);
    ck_assert_msg(code == 422 && json_has(body, "error", "HK_ERR_REJECTED"), "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 1);
    /* A web page's cross-origin request is refused, signed or not. */
    extra_header = "Origin: http://evil.example";
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "add", 0, "o.json"), NULL, body,
                    sizeof body);
    ck_assert_msg(code == 403 && json_has(body, "error", "HK_ERR_REJECTED"), "%d %s", code, body);
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 403);
    extra_header = "Origin: null";
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 403);
    /* The endpoint's own origin is fine. */
    snprintf(hdr, sizeof hdr, "Origin: %s", base);
    extra_header = hdr;
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "add", 5, "o2.json"), NULL,
                    body, sizeof body);
    ck_assert_msg(code == 200, "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 2);
    /* DNS rebinding: a Host that does not name the endpoint. */
    extra_header = "Host: evil.example";
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 403);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 9, time(NULL) + 60, T_NONE, "9.json"), NULL,
                              NULL, 0),
                     403);
    extra_header = "Host: 127.0.0.2";
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 403);
    snprintf(hdr, sizeof hdr, "Host: localhost:%u", hkn_endpoint_port(ep));
    extra_header = hdr;
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 200);
    extra_header = "Host: evil.example";
    ck_assert_int_eq(curl_req("GET", "/healthz", NULL, NULL, NULL, 0), 200);
    extra_header = NULL;
    ck_assert_int_eq(rec_calls(), 3);

    /* Neither a token nor a trusted key: rollback over HTTP is off. */
    hkn_endpoint_stop(ep);
    cfg_hook = no_keys_unsigned;
    start(NULL, 0, NULL, NULL);
    code = curl_req("POST", "/v1/rollback/add", NULL, NULL, body, sizeof body);
    ck_assert_msg(code == 403 && strstr(body, "off"), "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 2);
    /* The token is enough authority on its own. */
    hkn_endpoint_stop(ep);
    start("tok", 0, NULL, NULL);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 8, time(NULL) + 60, T_NONE, "8.json"), "tok",
                              NULL, 0),
                     200);
    ck_assert_int_eq(curl_req("POST", "/v1/rollback/add", NULL, NULL, NULL, 0), 401);
    code = curl_req("POST", "/v1/rollback/add", NULL, "tok", body, sizeof body);
    ck_assert_msg(code == 200, "%d %s", code, body);
    ck_assert_int_eq(rollbacks(), 3);
}
END_TEST

static void fleet_id(hk_endpoint_options *o, hkn_endpoint_resolved *r) {
    (void)r;
    o->endpoint_id = "gpu-17.fleet:7070";
}

/* A signed rollback request is for one endpoint: one signed for another
 * host of the fleet (or for none) is refused here, and the CLI signs for
 * the id the endpoint's status names, or the one it is given. */
START_TEST(rollback_bound_to_endpoint) {
    char body[8192], out[8192], host[256] = "", want[300];
    start(NULL, 0, NULL, NULL);
    gethostname(host, sizeof host - 1);
    snprintf(want, sizeof want, "%s:%u", host, hkn_endpoint_port(ep));
    /* The default id: host name and port. */
    if (hkn_valid_endpoint_id(want))
        ck_assert_str_eq(hkn_endpoint_id(ep), want);
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body), 200);
    ck_assert_msg(json_has(body, "endpoint_id", hkn_endpoint_id(ep)), "%s", body);
    hkn_endpoint_stop(ep);
    cfg_hook = fleet_id;
    start(NULL, 0, NULL, NULL);
    ck_assert_str_eq(hkn_endpoint_id(ep), "gpu-17.fleet:7070");
    for (int v = 1; v <= 3; v++) {
        char name[32];
        snprintf(name, sizeof name, "%d.json", v);
        ck_assert_int_eq(
            curl_req("POST", "/v1/release",
                     body_file(&key, "add", (uint64_t)v, time(NULL) + 60, T_NONE, name), NULL, NULL,
                     0),
            200);
    }
    /* Signed for another endpoint (as captured on its way to another host):
     * refused, nothing rolled back. */
    char *text, *sig;
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_rollback_sign(&key, "add", 2, time(NULL) + 60, "gpu-18.fleet:7070", &text,
                                       &len, &sig, &rep),
                     0);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "request", text);
    cJSON_AddStringToObject(o, "signature", sig);
    char *b = cJSON_PrintUnformatted(o), other[PATH_MAX];
    snprintf(other, sizeof other, "%s/other.json", tmp);
    ck_assert_int_eq(hkt_write_file(other, b), 0);
    free(b);
    cJSON_Delete(o);
    free(text);
    free(sig);
    int code = curl_req("POST", "/v1/rollback/add", other, NULL, body, sizeof body);
    ck_assert_msg(code == 403 && json_has(body, "error", "HK_ERR_SIGNATURE") &&
                      strstr(body, "gpu-18.fleet:7070"),
                  "%d %s", code, body);
    const char *cli = cli_path();
    char *rb_other[] = {(char *)cli,     "rollback",          base, "add", "--key", key_path,
                        "--endpoint-id", "gpu-18.fleet:7070", NULL};
    int rc = run(rb_other, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_SIGNATURE"), "exit %d: %s", rc, out);
    ck_assert_int_eq(rollbacks(), 0);
    /* The CLI takes the id and the target from the status, or is given them. */
    char *rb[] = {(char *)cli, "rollback", base, "add", "--key", key_path, NULL};
    rc = run(rb, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "rolled_back"), "exit %d: %s", rc, out);
    ck_assert_uint_eq(rec_current(), 2);
    char *rb_given[] = {(char *)cli, "rollback", base, "add",           "--key",
                        key_path,    "--to",     "1",  "--endpoint-id", "gpu-17.fleet:7070",
                        NULL};
    rc = run(rb_given, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "rolled_back"), "exit %d: %s", rc, out);
    ck_assert_uint_eq(rec_current(), 1);
    ck_assert_int_eq(rollbacks(), 2);
    char *rb_bad[] = {(char *)cli, "rollback",      base,  "add", "--key",
                      key_path,    "--endpoint-id", "a b", NULL};
    ck_assert_int_eq(run(rb_bad, out, sizeof out), 2);
    /* An id outside the alphabet is refused at start. */
    hkn_endpoint_stop(ep);
    ep = NULL;
    hk_endpoint_options eo;
    hkn_endpoint_resolved r = {0};
    hk_endpoint_options_init(&eo);
    eo.endpoint_id = "gpu 17\n";
    ck_assert_int_eq(hkn_endpoint_start(&eo, &r, &engine, &ep, &rep), HK_ERR_INVALID);
    ck_assert_ptr_null(ep);
    ck_assert_msg(strstr(rep.message, "endpoint_id"), "%s", rep.message);
}
END_TEST

/* Status and the signed rollback's target are the engine's: after another
 * source committed (a puller moved the engine on), status names what the
 * engine runs and would roll back to, and a request for a release the
 * engine would not commit is refused by the engine. */
START_TEST(rollback_target_is_the_engines) {
    start(NULL, 0, NULL, NULL);
    char body[16384];
    for (int v = 1; v <= 2; v++) {
        char name[32];
        snprintf(name, sizeof name, "%d.json", v);
        ck_assert_int_eq(
            curl_req("POST", "/v1/release",
                     body_file(&key, "add", (uint64_t)v, time(NULL) + 60, T_NONE, name), NULL, NULL,
                     0),
            200);
    }
    /* v3 committed by another source of the engine. */
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(rec_apply(NULL, "add", 3, HK_FORMAT_PTX, "x", 1, NULL, 0, "pull:x", &rep), 0);
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body), 200);
    cJSON *o = cJSON_Parse(body);
    const cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "modules"), 0);
    ck_assert_int_eq((int)cJSON_GetObjectItem(m0, "running_release_version")->valuedouble, 3);
    ck_assert_int_eq((int)cJSON_GetObjectItem(m0, "previous_release_version")->valuedouble, 2);
    cJSON_Delete(o);
    int code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "add", 1, "r1.json"), NULL,
                        body, sizeof body);
    ck_assert_msg(code == 422 && json_has(body, "error", "HK_ERR_REJECTED"), "%d %s", code, body);
    ck_assert_uint_eq(rec_current(), 3);
    code = curl_req("POST", "/v1/rollback/add", rollback_file(&key, "add", 2, "r2.json"), NULL,
                    body, sizeof body);
    ck_assert_msg(code == 200, "%d %s", code, body);
    ck_assert_uint_eq(rec_current(), 2);
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body), 200);
    o = cJSON_Parse(body);
    m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "modules"), 0);
    ck_assert_int_eq((int)cJSON_GetObjectItem(m0, "running_release_version")->valuedouble, 2);
    ck_assert_int_eq((int)cJSON_GetObjectItem(m0, "previous_release_version")->valuedouble, 1);
    cJSON_Delete(o);
}
END_TEST

/* Rollback names are checked like module names, and refused rollbacks add
 * nothing to the module table or the metrics. */
START_TEST(rollback_names_cannot_poison) {
    start("tok", 0, NULL, NULL);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "b.json"), "tok",
                              NULL, 0),
                     200);
    char out[4096], req[512];
    raw_request("POST /v1/rollback/%22%7D%0Ahotkern_fake%201 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Authorization: Bearer tok\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 400", 12), "%s", out);
    raw_request("POST /v1/rollback/../x HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Authorization: Bearer tok\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 4", 10), "%s", out);
    for (int i = 0; i < 300; i++) {
        snprintf(req, sizeof req,
                 "POST /v1/rollback/junk%d HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Authorization: Bearer tok\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                 i);
        raw_request(req, out, sizeof out);
        ck_assert_msg(!strncmp(out, "HTTP/1.1 404", 12), "%d: %s", i, out);
    }
    char body[16384];
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, "tok", body, sizeof body), 200);
    cJSON *o = cJSON_Parse(body);
    const cJSON *mods = cJSON_GetObjectItem(o, "modules");
    ck_assert_int_eq(cJSON_GetArraySize(mods), 1);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(mods, 0), "module")->valuestring,
                     "add");
    cJSON_Delete(o);
    ck_assert_int_eq(curl_req("GET", "/metrics", NULL, "tok", body, sizeof body), 200);
    ck_assert_ptr_null(strstr(body, "junk"));
    ck_assert_ptr_null(strstr(body, "hotkern_fake"));
    ck_assert_ptr_nonnull(strstr(body, "hotkern_module_release_version{module=\"add\"} 3\n"));
    ck_assert_msg(strstr(body, "hotkern_stage_seconds_total 0.042\n"), "%s", body);
    ck_assert_ptr_nonnull(strstr(body, "hotkern_retired_loaded 0\n"));
    check_prometheus(body);
}
END_TEST

void ep_rollback_tests(TCase *tc) {
    tcase_add_test(tc, rollback_needs_authority);
    tcase_add_test(tc, rollback_names_cannot_poison);
    tcase_add_test(tc, rollback_bound_to_endpoint);
    tcase_add_test(tc, rollback_target_is_the_engines);
}

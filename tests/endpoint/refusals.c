/*
 * Releases the endpoint or the engine refuses: each refusal's status and
 * named code, with nothing applied; a refused release not built again, a
 * transient one tried again; the CLI prints a hostile refusal's text with
 * its control bytes shown.
 */
#include "tests/endpoint/fixture.h"

START_TEST(refusals_change_nothing) {
    start(NULL, 0, NULL, NULL);
    char body[16384];
    int code = curl_req("POST", "/v1/release",
                        body_file(&key, "add", 5, time(NULL) + 60, T_NONE, "ok.json"), NULL, body,
                        sizeof body);
    ck_assert_int_eq(code, 200);
    ck_assert_uint_eq(rec_current(), 5);
    hkn_seckey stranger;
    hkn_keygen(&stranger);
    struct {
        const char *what;
        const char *file;
        int code;
        const char *error;
    } cases[] = {
        {"bad signature", body_file(&key, "add", 9, time(NULL) + 60, T_MANIFEST, "c1.json"), 403,
         "HK_ERR_SIGNATURE"},
        {"missing signature", body_file(&key, "add", 9, time(NULL) + 60, T_NO_SIG, "c2.json"), 403,
         "HK_ERR_SIGNATURE"},
        {"unknown key", body_file(&stranger, "add", 9, time(NULL) + 60, T_NONE, "c3.json"), 403,
         "HK_ERR_SIGNATURE"},
        {"same version", body_file(&key, "add", 5, time(NULL) + 60, T_NONE, "c4.json"), 409,
         "HK_ERR_REPLAY"},
        {"lower version", body_file(&key, "add", 4, time(NULL) + 60, T_NONE, "c5.json"), 409,
         "HK_ERR_REPLAY"},
        {"expired", body_file(&key, "add", 9, time(NULL) - 5, T_NONE, "c6.json"), 403,
         "HK_ERR_EXPIRED"},
        {"hash mismatch", body_file(&key, "add", 9, time(NULL) + 60, T_BYTES, "c7.json"), 422,
         "HK_ERR_HASH"},
        {"artifact missing", body_file(&key, "add", 9, time(NULL) + 60, T_NO_ARTIFACT, "c8.json"),
         422, "HK_ERR_HASH"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        code = curl_req("POST", "/v1/release", cases[i].file, NULL, body, sizeof body);
        ck_assert_msg(code == cases[i].code, "%s: HTTP %d (want %d): %s", cases[i].what, code,
                      cases[i].code, body);
        ck_assert_msg(json_has(body, "error", cases[i].error), "%s: %s", cases[i].what, body);
        ck_assert_msg(json_has(body, "outcome", "refused"), "%s: %s", cases[i].what, body);
        ck_assert_uint_eq(rec_current(), 5);
        ck_assert_int_eq(rec_calls(), 1);
    }
    /* Not JSON at all. */
    char junk[PATH_MAX];
    snprintf(junk, sizeof junk, "%s/junk.json", tmp);
    hkt_write_file(junk, "this is not json");
    ck_assert_int_eq(curl_req("POST", "/v1/release", junk, NULL, body, sizeof body), 400);

    /* The engine refuses the build: 422 with the log, and the CLI prints it. */
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = HK_ERR_COMPILE;
    pthread_mutex_unlock(&rec.lock);
    code = curl_req("POST", "/v1/release",
                    body_file(&key, "add", 10, time(NULL) + 60, T_NONE, "c9.json"), NULL, body,
                    sizeof body);
    ck_assert_msg(code == 422 && json_has(body, "error", "HK_ERR_COMPILE"), "%d %s", code, body);
    cJSON *o = cJSON_Parse(body);
    ck_assert_ptr_nonnull(strstr(cJSON_GetObjectItem(o, "log")->valuestring, "expected a"));
    cJSON_Delete(o);
    char out[8192];
    char *push[] = {(char *)cli_path(), "push", base,     "--key", key_path, "--module", "add",
                    "--release",        "11",   src_path, NULL};
    int rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_COMPILE") && strstr(out, "error: expected a"),
                  "exit %d: %s", rc, out);
    ck_assert_uint_eq(rec_current(), 5);
    /* Status keeps the last outcome and log. */
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, body, sizeof body), 200);
    ck_assert_ptr_nonnull(strstr(body, "expected a"));
    /* A refused build did not burn the version: the fixed kernel can be
     * pushed under it. */
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = 0;
    pthread_mutex_unlock(&rec.lock);
    char fixed[PATH_MAX + 16];
    snprintf(fixed, sizeof fixed, "%s/fixed.cu", tmp);
    ck_assert_int_eq(hkt_write_file(fixed, "extern \"C\" __global__ void add(float *x) {}\n"), 0);
    push[9] = fixed;
    rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    ck_assert_uint_eq(rec_current(), 11);
}
END_TEST

/* The engine's verdicts have the statuses net.h documents: a canary's
 * refusal is the release's fault (422), a quarantined image a conflict with
 * what the engine knows (409). */
START_TEST(engine_refusal_statuses) {
    start(NULL, 0, NULL, NULL);
    static const struct {
        int err;
        int code;
    } cases[] = {{HK_ERR_CANARY, 422}, {HK_ERR_QUARANTINED, 409}, {HK_ERR_COMPILE, 422}};
    char body[8192], name[32];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pthread_mutex_lock(&rec.lock);
        rec.fail_with = cases[i].err;
        pthread_mutex_unlock(&rec.lock);
        snprintf(name, sizeof name, "r%zu.json", i);
        int code = curl_req("POST", "/v1/release",
                            body_file(&key, "add", 5 + i, time(NULL) + 60, T_NONE, name), NULL,
                            body, sizeof body);
        ck_assert_msg(code == cases[i].code, "%s: HTTP %d (want %d): %s", hk_err_name(cases[i].err),
                      code, cases[i].code, body);
        ck_assert(json_has(body, "error", hk_err_name(cases[i].err)));
    }
}
END_TEST

/* 1 when out holds a byte that drives a terminal: C0 but LF and tab, DEL,
 * a C1 control (UTF-8 C2 80..9F), or 0xff. */
static int has_escape(const char *out) {
    for (const unsigned char *p = (const unsigned char *)out; *p; p++)
        if ((*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7f || *p == 0xff ||
            (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f))
            return 1;
    return 0;
}

/* A hostile endpoint's strings (a refusal's message and log, the status) are
 * printed by the CLI with their control bytes shown, never sent to the
 * terminal. */
START_TEST(cli_prints_no_terminal_escapes) {
    start(NULL, 0, NULL, NULL);
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = HK_ERR_COMPILE;
    rec.hostile = 1;
    pthread_mutex_unlock(&rec.lock);
    const char *cli = cli_path();
    char out[16384];
    char *push[] = {(char *)cli, "push",      base, "--key",  key_path, "--module",
                    "add",       "--release", "3",  src_path, NULL};
    int rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "compile failed"), "exit %d: %s", rc, out);
    ck_assert_msg(!has_escape(out), "raw control bytes printed: %s", out);
    ck_assert_msg(strstr(out, "\\x1b[2J") && strstr(out, "\\xc2\\x9b31m") && strstr(out, "\\xff"),
                  "%s", out);
    char *status[] = {(char *)cli, "status", base, NULL};
    rc = run(status, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "compile failed"), "exit %d: %s", rc, out);
    ck_assert_msg(!has_escape(out), "raw control bytes printed: %s", out);
    char *rb[] = {(char *)cli, "rollback", base, "add", "--key", key_path, "--to", "1", NULL};
    rc = run(rb, out, sizeof out);
    ck_assert_msg(rc == 1 && !has_escape(out), "exit %d: %s", rc, out);
}
END_TEST

static int rec_attempts(void) {
    pthread_mutex_lock(&rec.lock);
    int n = rec.attempts;
    pthread_mutex_unlock(&rec.lock);
    return n;
}

/* A release the engine refused (its record taken back, so that a fixed
 * kernel may reuse the version) is not built again when the same signed
 * bytes come back: each replay is answered at once with the first
 * refusal's error, status and reason. A transient refusal is not
 * remembered, and a release signed anew is a new release. */
START_TEST(refused_release_not_rebuilt) {
    start(NULL, 0, NULL, NULL);
    char body[16384];
    static const int verdicts[] = {HK_ERR_COMPILE, HK_ERR_CANARY, HK_ERR_MISSING_KERNEL};
    for (size_t v = 0; v < sizeof verdicts / sizeof verdicts[0]; v++) {
        pthread_mutex_lock(&rec.lock);
        rec.fail_with = verdicts[v];
        pthread_mutex_unlock(&rec.lock);
        int before = rec_attempts();
        char name[32];
        snprintf(name, sizeof name, "v%zu.json", v);
        const char *f = body_file(&key, "add", 10 + v, time(NULL) + 60, T_NONE, name);
        int first = curl_req("POST", "/v1/release", f, NULL, body, sizeof body);
        ck_assert_msg(first == 422, "%d %s", first, body);
        ck_assert_int_eq(rec_attempts(), before + 1);
        for (int i = 0; i < 20; i++) {
            int code = curl_req("POST", "/v1/release", f, NULL, body, sizeof body);
            ck_assert_msg(code == first, "replay %d: HTTP %d (first %d): %s", i, code, first, body);
            ck_assert(json_has(body, "error", hk_err_name(verdicts[v])));
            ck_assert(json_has(body, "outcome", "refused"));
            ck_assert_msg(strstr(body, "refused before") && strstr(body, "compile failed"), "%s",
                          body);
            cJSON *o = cJSON_Parse(body);
            ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(o, "refused_before")));
            cJSON_Delete(o);
        }
        ck_assert_int_eq(rec_attempts(), before + 1);
    }
    /* Signed anew (another expiry, so other bytes): built again. */
    int before = rec_attempts();
    const char *again = body_file(&key, "add", 12, time(NULL) + 61, T_NONE, "again.json");
    ck_assert_int_eq(curl_req("POST", "/v1/release", again, NULL, body, sizeof body), 422);
    ck_assert_int_eq(rec_attempts(), before + 1);
    /* Busy is the host's state, not the release's: tried again. */
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = HK_ERR_BUSY;
    pthread_mutex_unlock(&rec.lock);
    const char *busy = body_file(&key, "add", 13, time(NULL) + 60, T_NONE, "busy.json");
    ck_assert_int_eq(curl_req("POST", "/v1/release", busy, NULL, body, sizeof body), 503);
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = 0;
    pthread_mutex_unlock(&rec.lock);
    ck_assert_int_eq(curl_req("POST", "/v1/release", busy, NULL, body, sizeof body), 200);
    ck_assert_uint_eq(rec_current(), 13);
    ck_assert_int_eq(curl_req("GET", "/metrics", NULL, NULL, body, sizeof body), 200);
    ck_assert_msg(strstr(body, "hotkern_push_refused_again_total 60\n"), "%s", body);
}
END_TEST

/* A required canary that could not run (its helper died or did not
 * answer) and a build that timed out on a loaded host are the host's state,
 * not verdicts on the release: not remembered, so the same signed bytes are
 * tried again (503 and 504 each time, the engine run each time), and
 * applied once the host is well. */
START_TEST(transient_refusals_are_tried_again) {
    start(NULL, 0, NULL, NULL);
    char body[16384];
    static const struct {
        int err;
        int code;
    } cases[] = {{HK_ERR_CANARY_UNAVAILABLE, 503}, {HK_ERR_TIMEOUT, 504}};
    const char *f = body_file(&key, "add", 20, time(NULL) + 60, T_NONE, "transient.json");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pthread_mutex_lock(&rec.lock);
        rec.fail_with = cases[i].err;
        pthread_mutex_unlock(&rec.lock);
        for (int k = 0; k < 3; k++) {
            int before = rec_attempts();
            int code = curl_req("POST", "/v1/release", f, NULL, body, sizeof body);
            ck_assert_msg(code == cases[i].code, "%s: HTTP %d (want %d): %s",
                          hk_err_name(cases[i].err), code, cases[i].code, body);
            ck_assert(json_has(body, "error", hk_err_name(cases[i].err)));
            ck_assert_msg(!strstr(body, "refused before"), "%s", body);
            ck_assert_int_eq(rec_attempts(), before + 1);
        }
    }
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = 0;
    pthread_mutex_unlock(&rec.lock);
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, body, sizeof body), 200);
    ck_assert_uint_eq(rec_current(), 20);
}
END_TEST

void ep_refusals_tests(TCase *tc) {
    tcase_add_test(tc, refusals_change_nothing);
    tcase_add_test(tc, engine_refusal_statuses);
    tcase_add_test(tc, refused_release_not_rebuilt);
    tcase_add_test(tc, transient_refusals_are_tried_again);
    tcase_add_test(tc, cli_prints_no_terminal_escapes);
}

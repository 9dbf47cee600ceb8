/*
 * Who may talk to the endpoint: the bearer token, TLS with a self-signed
 * certificate, and the browser's requests (other origins, simple posts, a
 * second Origin or Host header) refused.
 */
#include "tests/endpoint/fixture.h"

START_TEST(token_required) {
    start("s3cret-token", 0, NULL, NULL);
    const char *f = body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "b.json");
    char body[4096];
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, NULL, body, sizeof body), 401);
    /* A missing token is a refused request, not a bad signature. */
    ck_assert_msg(json_has(body, "error", "HK_ERR_REJECTED"), "%s", body);
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, "wrong", NULL, 0), 401);
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 401);
    ck_assert_int_eq(curl_req("GET", "/metrics", NULL, "s3cret-tokenX", NULL, 0), 401);
    ck_assert_int_eq(curl_req("GET", "/healthz", NULL, NULL, NULL, 0), 200);
    ck_assert_int_eq(rec_calls(), 0);
    ck_assert_int_eq(curl_req("POST", "/v1/release", f, "s3cret-token", NULL, 0), 200);
    ck_assert_int_eq(rec_calls(), 1);
    char out[4096];
    char *push[] = {(char *)cli_path(), "push", base,     "--key", key_path,
                    "--module",         "add",  src_path, NULL};
    ck_assert_int_eq(run(push, out, sizeof out), 1);
    char *push2[] = {(char *)cli_path(), "push",     base,  "--key",
                     key_path,           "--module", "add", "--token",
                     "s3cret-token",     src_path,   NULL};
    int rc = run(push2, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
}
END_TEST

START_TEST(tls_with_self_signed_cert) {
    char cert[PATH_MAX], pkey[PATH_MAX], out[4096];
    snprintf(cert, sizeof cert, "%s/cert.pem", tmp);
    snprintf(pkey, sizeof pkey, "%s/key.pem", tmp);
    char *gen[] = {"openssl",  "req",
                   "-x509",    "-newkey",
                   "rsa:2048", "-nodes",
                   "-keyout",  pkey,
                   "-out",     cert,
                   "-days",    "1",
                   "-subj",    "/CN=127.0.0.1",
                   "-addext",  "subjectAltName=IP:127.0.0.1",
                   NULL};
    ck_assert_msg(run(gen, out, sizeof out) == 0, "openssl: %s", out);
    char *cert_pem, *key_pem;
    size_t len;
    ck_assert_int_eq(hku_read_file(cert, 1 << 20, &cert_pem, &len, NULL), 0);
    ck_assert_int_eq(hku_read_file(pkey, 1 << 20, &key_pem, &len, NULL), 0);
    start("tok", 0, cert_pem, key_pem);
    free(cert_pem);
    free(key_pem);
    char url[256], code[64];
    snprintf(url, sizeof url, "%s/healthz", base);
    char *verify[] = {"curl",         "-s",       "-o", "/dev/null", "-w",
                      "%{http_code}", "--cacert", cert, url,         NULL};
    ck_assert_int_eq(run(verify, code, sizeof code), 0);
    ck_assert_str_eq(code, "200");
    /* Without the CA the certificate is refused by the client. */
    char *noca[] = {"curl", "-s", "-o", "/dev/null", url, NULL};
    ck_assert_int_ne(run(noca, code, sizeof code), 0);
    char *push[] = {(char *)cli_path(), "push", base,       "--key", key_path, "--module", "add",
                    "--token",          "tok",  "--cacert", cert,    src_path, NULL};
    int rc = run(push, out, sizeof out);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
    ck_assert_int_eq(rec_calls(), 1);
}
END_TEST

/* A web page on another port of the same host (a notebook, a dev server)
 * is another origin: with unsigned releases allowed and no token, neither
 * its cross-origin requests nor its "simple" POSTs (text/plain, forms,
 * multipart, no type at all, which browsers send without a preflight) push
 * anything; the endpoint's own origin and JSON bodies still do. */
START_TEST(other_origins_and_simple_posts_refused) {
    cfg_hook = no_keys_unsigned;
    start(NULL, 0, NULL, NULL);
    unsigned port = hkn_endpoint_port(ep);
    const char *f = body_file(&key, "add", 5, time(NULL) + 60, T_NO_SIG, "u.json");
    char body[8192], hdr[160];
    /* Each: a scheme and host, and the port after them (-1: none). */
    const struct {
        const char *prefix;
        long port;
        const char *suffix;
    } origins[] = {{"http://localhost:", 8888, ""},  {"http://127.0.0.1:", 8888, ""},
                   {"https://127.0.0.1:", port, ""}, {"http://127.0.0.1:", port * 10L, ""},
                   {"http://127.0.0.1:", -1, ""},    {"http://localhost:", port, "/x"},
                   {"http://localhost", -1, ""},     {"http://[::1]:", port, ""}};
    for (size_t i = 0; i < sizeof origins / sizeof origins[0]; i++) {
        char o[96], pnum[24] = "";
        if (origins[i].port >= 0)
            snprintf(pnum, sizeof pnum, "%ld", origins[i].port);
        snprintf(o, sizeof o, "%s%s%s", origins[i].prefix, pnum, origins[i].suffix);
        snprintf(hdr, sizeof hdr, "Origin: %s", o);
        extra_header = hdr;
        int code = curl_req("POST", "/v1/release", f, NULL, body, sizeof body);
        ck_assert_msg(code == 403 && strstr(body, "port"), "Origin %s: HTTP %d: %s", o, code, body);
        ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 403);
    }
    snprintf(hdr, sizeof hdr, "Origin: http://localhost:%u", port);
    extra_header = hdr;
    ck_assert_int_eq(curl_req("GET", "/v1/status", NULL, NULL, NULL, 0), 200);
    extra_header = NULL;
    ck_assert_int_eq(rec_calls(), 0);

    struct stat st;
    ck_assert_int_eq(stat(f, &st), 0);
    const char *types[] = {"Content-Type: text/plain\r\n",
                           "Content-Type: text/plain; charset=utf-8\r\n",
                           "Content-Type: application/x-www-form-urlencoded\r\n",
                           "Content-Type: multipart/form-data; boundary=x\r\n",
                           "Content-Type: application/jsonx\r\n",
                           ""};
    char head[512], out[8192];
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        snprintf(head, sizeof head,
                 "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Length: %lld\r\n"
                 "Connection: close\r\n\r\n",
                 types[i], (long long)st.st_size);
        timed_request(head, f, out, sizeof out);
        ck_assert_msg(!strncmp(out, "HTTP/1.1 415", 12) && strstr(out, "application/json"),
                      "'%s': %s", types[i], out);
    }
    /* The same as a signed rollback request's body. */
    snprintf(head, sizeof head,
             "POST /v1/rollback/add HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
             "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n");
    timed_request(head, NULL, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 415", 12), "%s", out);
    ck_assert_int_eq(rec_calls(), 0);
    snprintf(head, sizeof head,
             "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             "Content-Type: Application/JSON; charset=utf-8\r\nContent-Length: %lld\r\n"
             "Connection: close\r\n\r\n",
             (long long)st.st_size);
    timed_request(head, f, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 200", 12), "%s", out);
    ck_assert_int_eq(rec_calls(), 1);
}
END_TEST

/* Every Origin and Host header is checked, not the first alone. */
START_TEST(second_origin_or_host_is_checked) {
    start(NULL, 0, NULL, NULL);
    unsigned port = hkn_endpoint_port(ep);
    char req[512], out[4096];
    char own[64];
    snprintf(own, sizeof own, "Origin: http://127.0.0.1:%u\r\n", port);
    const char *evil = "Origin: http://evil.example\r\n";
    const char *extra[][2] = {{own, evil}, {evil, own}, {"Host: evil.example\r\n", ""}};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        char hdrs[256];
        snprintf(hdrs, sizeof hdrs, "%s%s", extra[i][0], extra[i][1]);
        snprintf(req, sizeof req, "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n%s\r\n", port,
                 hdrs);
        raw_request(req, out, sizeof out);
        ck_assert_msg(!strncmp(out, "HTTP/1.1 403", 12), "%s: got: %s", hdrs, out);
    }
    snprintf(req, sizeof req,
             "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nOrigin: http://127.0.0.1:%u\r\n"
             "Connection: close\r\n\r\n",
             port, port);
    raw_request(req, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 200", 12), "got: %s", out);
}
END_TEST

void ep_auth_tests(TCase *tc) {
    tcase_add_test(tc, token_required);
    tcase_add_test(tc, tls_with_self_signed_cert);
    tcase_add_test(tc, other_origins_and_simple_posts_refused);
    tcase_add_test(tc, second_origin_or_host_is_checked);
}

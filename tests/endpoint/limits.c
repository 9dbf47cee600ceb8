/*
 * The endpoint's bounds: body size, concurrent clients, slow and
 * half-closed connections, the request deadline, and the memory bodies in
 * flight and declared sizes may hold.
 */
#include "tests/endpoint/fixture.h"

START_TEST(oversized_body_413) {
    start(NULL, 64 * 1024, NULL, NULL);
    char out[4096];
    raw_request("POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n",
                out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 413", 12), "got: %s", out);
    ck_assert_ptr_nonnull(strstr(out, "HK_ERR_TOO_LARGE"));

    /* curl with a real 256 KiB body (it sends Expect: 100-continue). */
    char big[PATH_MAX];
    snprintf(big, sizeof big, "%s/big.json", tmp);
    FILE *f = fopen(big, "w");
    for (int i = 0; i < 256 * 1024 / 8; i++)
        fputs("xxxxxxxx", f);
    fclose(f);
    ck_assert_int_eq(curl_req("POST", "/v1/release", big, NULL, NULL, 0), 413);

    /* Chunked, so no Content-Length: cut off once it passes the cap. */
    char data[PATH_MAX + 1], url[256], code[64];
    snprintf(data, sizeof data, "@%s", big);
    snprintf(url, sizeof url, "%s/v1/release", base);
    char *argv[] = {"curl",
                    "-s",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "-H",
                    "Transfer-Encoding: chunked",
                    "-H",
                    "Content-Type: application/json",
                    "--data-binary",
                    data,
                    url,
                    NULL};
    run(argv, code, sizeof code);
    ck_assert_msg(atoi(code) == 413, "chunked oversized body answered %s", code);
    ck_assert_int_eq(rec_calls(), 0);
    /* The server is still fine afterwards. */
    ck_assert_int_eq(curl_req("GET", "/healthz", NULL, NULL, NULL, 0), 200);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "ok.json"), NULL,
                              NULL, 0),
                     200);
}
END_TEST

START_TEST(hundred_concurrent_status) {
    start(NULL, 0, NULL, NULL);
    char url[256], outs[PATH_MAX], codes[8192];
    snprintf(url, sizeof url, "%s/v1/status?n=[1-100]", base);
    snprintf(outs, sizeof outs, "%s/status_#1.json", tmp);
    /* curl's parallel mode opens all 100 connections at once. */
    char *argv[] = {"curl",
                    "-s",
                    "-Z",
                    "--parallel-immediate",
                    "--parallel-max",
                    "100",
                    "-o",
                    outs,
                    "-w",
                    "%{http_code}\\n",
                    url,
                    NULL};
    ck_assert_int_eq(run(argv, codes, sizeof codes), 0);
    int ok = 0;
    for (char *line = strtok(codes, "\n"); line; line = strtok(NULL, "\n"))
        ok += !strcmp(line, "200");
    ck_assert_int_eq(ok, 100);
    for (int i = 1; i <= 100; i++) {
        char p[PATH_MAX], *text = NULL;
        size_t len;
        snprintf(p, sizeof p, "%s/status_%d.json", tmp, i);
        ck_assert_int_eq(hku_read_file(p, 1 << 20, &text, &len, NULL), 0);
        cJSON *o = cJSON_Parse(text);
        ck_assert_msg(cJSON_IsArray(cJSON_GetObjectItem(o, "modules")), "%d: %s", i, text);
        cJSON_Delete(o);
        free(text);
    }
}
END_TEST

/* Opens a connection from source address `src` and sends an incomplete
 * request head; returns the socket. */
static int slow_connection(const char *src) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in from = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &from.sin_addr);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&from, sizeof from), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(hkn_endpoint_port(ep))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *head = "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    ck_assert_int_eq(send(fd, head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
    return fd;
}

static int slow_fds[1200], nslow;

static int trickle_stop; /* atomic */

/* One more header byte on every slow connection every half second. */
static void *trickle(void *arg) {
    while (!__atomic_load_n(&trickle_stop, __ATOMIC_RELAXED)) {
        for (int i = 0; i < nslow && !__atomic_load_n(&trickle_stop, __ATOMIC_RELAXED); i++)
            send(slow_fds[i], "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        usleep(500000);
    }
    return NULL;
}

static void wait_connections(unsigned n) {
    for (int i = 0; i < 400 && hkn_endpoint_connections(ep) < n; i++)
        usleep(50000);
    ck_assert_uint_ge(hkn_endpoint_connections(ep), n);
}

static void close_slow(void) {
    for (int i = 0; i < nslow; i++)
        close(slow_fds[i]);
    nslow = 0;
}

/* Slowloris: with 1,000 slow connections open and trickling, a status
 * request and a signed push are each answered within 1 s. */
START_TEST(slowloris_does_not_lock_out) {
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < 4096) {
        rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    ck_assert_msg(rl.rlim_cur >= 1200, "needs 1200 descriptors, the limit is %llu",
                  (unsigned long long)rl.rlim_cur);
    start(NULL, 0, NULL, NULL);
    /* Ten source addresses, 100 connections each: under the per-address
     * limit, so all of them are held open. */
    char src[32];
    for (nslow = 0; nslow < 1000; nslow++) {
        snprintf(src, sizeof src, "127.0.0.%d", 2 + nslow / 100);
        slow_fds[nslow] = slow_connection(src);
    }
    wait_connections(1000);
    pthread_t t;
    __atomic_store_n(&trickle_stop, 0, __ATOMIC_RELAXED);
    pthread_create(&t, NULL, trickle, NULL);
    usleep(700000);
    char out[8192];
    double s = timed_request("GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                             "Connection: close\r\n\r\n",
                             NULL, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 200", 12), "%s", out);
    ck_assert_msg(s < 1.0, "status took %.3f s with 1000 slow connections", s);
    const char *f = body_file(&key, "add", 7, time(NULL) + 60, T_NONE, "p.json");
    struct stat st;
    ck_assert_int_eq(stat(f, &st), 0);
    char head[256];
    snprintf(head, sizeof head,
             "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Content-Length: %lld\r\nConnection: close\r\n\r\n",
             (long long)st.st_size);
    s = timed_request(head, f, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 200", 12), "%s", out);
    ck_assert_msg(s < 1.0, "push took %.3f s with 1000 slow connections", s);
    ck_assert_uint_eq(rec_current(), 7);
    __atomic_store_n(&trickle_stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    close_slow();
    /* Over the per-address limit, an address's next request gets a 503. */
    for (nslow = 0; nslow < 130; nslow++)
        slow_fds[nslow] = slow_connection("127.0.0.20");
    wait_connections(130);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in from = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.20", &from.sin_addr);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&from, sizeof from), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(hkn_endpoint_port(ep))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *req = "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    ck_assert_int_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t r = recv(fd, out, sizeof out - 1, 0);
    out[r > 0 ? r : 0] = '\0';
    close(fd);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 503", 12), "got: %s", out);
    /* ... while another address is served. */
    timed_request(req, NULL, out, sizeof out);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 200", 12), "%s", out);
    close_slow();
}
END_TEST

static void short_deadline(hk_endpoint_options *o, hkn_endpoint_resolved *r) {
    (void)r;
    o->request_timeout_s = 2;
}

/* A client trickling its headers a byte at a time is cut off at the whole-
 * request deadline, though it never stays idle long enough for the idle
 * timeout (30 s). */
START_TEST(request_deadline) {
    cfg_hook = short_deadline;
    start(NULL, 0, NULL, NULL);
    int fd = slow_connection("127.0.0.1");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int closed = 0;
    for (int i = 0; i < 40 && !closed; i++) {
        usleep(250000);
        if (send(fd, "x", 1, MSG_NOSIGNAL) < 0) {
            closed = 1;
            break;
        }
        char c;
        ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);
        closed = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    close(fd);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_msg(closed, "still open after %.1f s", s);
    ck_assert_msg(s >= 1.5, "closed after %.1f s, before the deadline", s);
    char body[8192];
    ck_assert_int_eq(curl_req("GET", "/metrics", NULL, NULL, body, sizeof body), 200);
    ck_assert_ptr_nonnull(strstr(body, "hotkern_push_deadline_total 1\n"));
}
END_TEST

static void small_budget(hk_endpoint_options *o, hkn_endpoint_resolved *r) {
    (void)r;
    o->max_body_bytes = 256 * 1024;
    o->max_inflight_bytes = 300 * 1024;
}

static int open_raw(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(hkn_endpoint_port(ep))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_all(int fd, const void *p, size_t n) {
    ck_assert_int_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* A push in flight: the engine takes a while over it. */
static void *slow_push(void *path) {
    return (void *)(intptr_t)curl_req("POST", "/v1/release", path, NULL, NULL, 0);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* A client that half-closes (shuts its sending side) once its push is sent
 * still gets the answer, while another upload is being received and while
 * the engine takes a while over a third. */
START_TEST(half_closed_client_gets_its_answer) {
    start(NULL, 0, NULL, NULL);
    pthread_mutex_lock(&rec.lock);
    rec.delay_ms = 500;
    pthread_mutex_unlock(&rec.lock);
    static char spaces[60000];
    memset(spaces, ' ', sizeof spaces);
    const char *upload = "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Content-Type: application/json\r\nContent-Length: 250000\r\n\r\n{\"a";
    int unanswered = 0;
    for (uint64_t round = 0; round < 10; round++) {
        const char *first =
            body_file(&key, "add", 10 * round + 3, time(NULL) + 60, T_NONE, "first.json");
        const char *body =
            slurp(body_file(&key, "add", 10 * round + 5, time(NULL) + 60, T_NONE, "second.json"));
        int other = open_raw();
        send_all(other, upload, strlen(upload));
        send_all(other, spaces, sizeof spaces);
        pthread_t t;
        pthread_create(&t, NULL, slow_push, (void *)first);
        usleep(200000);
        char head[256];
        snprintf(head, sizeof head,
                 "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                 strlen(body));
        int fd = open_raw();
        send_all(fd, head, strlen(head));
        send_all(fd, body, strlen(body));
        ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
        struct timeval tv = {.tv_sec = 10};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char out[4096];
        size_t len = 0;
        ssize_t r;
        while (len + 1 < sizeof out && (r = recv(fd, out + len, sizeof out - 1 - len, 0)) > 0)
            len += (size_t)r;
        out[len] = '\0';
        close(fd);
        void *code;
        pthread_join(t, &code);
        close(other);
        ck_assert_int_eq((int)(intptr_t)code, 200);
        ck_assert_uint_eq(rec_current(), 10 * round + 5); /* applied, answered or not */
        if (strncmp(out, "HTTP/1.1 200", 12)) {
            fprintf(stderr, "round %d: %zu bytes of answer: %s\n", (int)round, len, out);
            unanswered++;
        }
    }
    ck_assert_int_eq(unanswered, 0);
}
END_TEST

/* Declared sizes hold nothing: clients that declare bodies over the whole
 * in-flight budget (a JSON Content-Length and a release frame's lengths)
 * and then trickle keep no legitimate push out. */
START_TEST(declared_sizes_hold_nothing) {
    cfg_hook = small_budget;
    start(NULL, 0, NULL, NULL);
    const char *head = "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Content-Type: application/json\r\nContent-Length: 250000\r\n\r\n{\"a";
    int fds[3];
    for (int i = 0; i < 2; i++) {
        fds[i] = open_raw();
        send_all(fds[i], head, strlen(head));
    }
    /* A frame whose length table declares an artifact of 200,000 bytes. */
    static unsigned char art[200000];
    hkn_blob b = {.name = "add.cu", .bytes = art, .size = sizeof art};
    unsigned char *frame;
    size_t flen;
    ck_assert_int_eq(hkn_frame_write("{}", 2, NULL, 0, &b, 1, &frame, &flen), 0);
    char fhead[256];
    snprintf(fhead, sizeof fhead,
             "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\n"
             "Content-Length: %zu\r\n\r\n",
             HKN_FRAME_TYPE, flen);
    fds[2] = open_raw();
    send_all(fds[2], fhead, strlen(fhead));
    send_all(fds[2], frame, 64);
    free(frame);
    usleep(300000);
    for (int i = 0; i < 3; i++)
        send_all(fds[i], "x", 1);
    usleep(100000);
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "ok.json"), NULL,
                              NULL, 0),
                     200);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
}
END_TEST

/* What bodies hold is still bounded: a body whose bytes do not fit beside
 * one already received is dropped and answered 503 once it ends; the
 * budget goes with the connection that held it. */
START_TEST(inflight_bodies_bounded) {
    cfg_hook = small_budget;
    start(NULL, 0, NULL, NULL);
    const char *head = "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Content-Type: application/json\r\nContent-Length: 250000\r\n\r\n";
    static char body[250001];
    memset(body, 'a', sizeof body - 1);
    int fd = open_raw();
    send_all(fd, head, strlen(head));
    send_all(fd, body, 200000); /* held: 200,000 of 250,000 received */
    usleep(300000);
    size_t hl = strlen(head);
    char *req = malloc(hl + sizeof body);
    memcpy(req, head, hl);
    memcpy(req + hl, body, sizeof body);
    char out[4096];
    raw_request(req, out, sizeof out);
    free(req);
    ck_assert_msg(!strncmp(out, "HTTP/1.1 503", 12), "got: %s", out);
    ck_assert_ptr_nonnull(strstr(out, "in flight"));
    close(fd);
    usleep(300000);
    /* The reservation went with the connection. */
    ck_assert_int_eq(curl_req("POST", "/v1/release",
                              body_file(&key, "add", 3, time(NULL) + 60, T_NONE, "ok.json"), NULL,
                              NULL, 0),
                     200);
}
END_TEST

void ep_limits_tests(TCase *tc) {
    tcase_add_test(tc, oversized_body_413);
    tcase_add_test(tc, hundred_concurrent_status);
    tcase_add_test(tc, slowloris_does_not_lock_out);
    tcase_add_test(tc, request_deadline);
    tcase_add_test(tc, inflight_bodies_bounded);
    tcase_add_test(tc, declared_sizes_hold_nothing);
    tcase_add_test(tc, half_closed_client_gets_its_answer);
}

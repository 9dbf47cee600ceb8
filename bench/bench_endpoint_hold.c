/*
 * The push endpoint while clients hold declared sizes: can anyone keep the
 * endpoint shut by declaring large bodies and sending them slowly?
 *
 * Two holders, no key or token needed, each keep one connection that
 * declares the whole body cap (one a JSON Content-Length, the other a
 * release frame whose lengths say 64 MiB) and then trickles a byte a
 * second; when the endpoint closes one (its request deadline), it connects
 * again at once. Meanwhile a legitimate client pushes signed releases at a
 * steady pace (PUSHES over SECONDS). It counts the pushes answered 200 and
 * those refused (503 and others), and reads the process's peak resident
 * memory against what it was before the endpoint started: the endpoint's
 * caps (max_inflight_bytes, twice the body cap by default) bound it.
 *
 * The engine behind the endpoint is a stub that accepts every release at
 * once (the endpoint is what is measured); the endpoint runs with its
 * defaults, in this process, on loopback.
 *
 * usage: bench_endpoint_hold [SECONDS] [PUSHES]   (default 150 s, 75 pushes)
 * It asserts nothing about speed; the exit status is 1 when a push was not
 * accepted.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "bench/common.h"
#include "net/net.h"

static _Atomic int stopping;
static _Atomic int reconnects;
static uint16_t port;
static _Atomic uint64_t applied;

static int stub_apply(void *ud, const char *module, uint64_t version, hk_format fmt,
                      const void *bytes, size_t size, const hk_header *headers, int nheaders,
                      const char *origin, hk_report *rep) {
    atomic_fetch_add(&applied, 1);
    return 0;
}

static long peak_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6))
            kib = atol(line + 6);
    if (f)
        fclose(f);
    return kib;
}

static int dial(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* A holder: declares `head` (and `first`, the start of its body), then a
 * byte a second; connects again whenever the endpoint closes it. */
typedef struct holder {
    char head[512];
    unsigned char first[64];
    size_t nfirst;
} holder;

static void *hold(void *arg) {
    holder *h = arg;
    while (!atomic_load(&stopping)) {
        int fd = dial();
        if (fd < 0) {
            usleep(100000);
            continue;
        }
        int ok = send(fd, h->head, strlen(h->head), MSG_NOSIGNAL) > 0 &&
                 send(fd, h->first, h->nfirst, MSG_NOSIGNAL) > 0;
        while (ok && !atomic_load(&stopping)) {
            sleep(1);
            ok = send(fd, "x", 1, MSG_NOSIGNAL) == 1;
        }
        close(fd);
        if (!atomic_load(&stopping))
            atomic_fetch_add(&reconnects, 1);
    }
    return NULL;
}

static size_t sink(char *p, size_t size, size_t n, void *ud) {
    return size * n;
}

int main(int argc, char **argv) {
    int seconds = argc > 1 ? atoi(argv[1]) : 150;
    int pushes = argc > 2 ? atoi(argv[2]) : 75;
    if (seconds < 1 || pushes < 1)
        return fprintf(stderr, "usage: bench_endpoint_hold [SECONDS] [PUSHES]\n"), 2;
    char cpu[256];
    bench_cpu_line(cpu, sizeof cpu);
    printf("== bench_endpoint_hold: %d signed pushes over %d s beside two connections that "
           "hold declared sizes\nmachine: %s\n",
           pushes, seconds, cpu);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    hkn_seckey key;
    if (hkn_keygen(&key) != 0)
        return fprintf(stderr, "keygen failed\n"), 1;
    char sdir[] = "/tmp/hotkern-hold-XXXXXX";
    if (!mkdtemp(sdir))
        return perror("mkdtemp"), 1;
    long before = peak_kib();

    hk_endpoint_options o;
    hk_endpoint_options_init(&o);
    o.port = 0;
    hkn_endpoint_resolved r = {0};
    r.trust.keys[0] = key.pub;
    r.trust.nkeys = 1;
    r.state_dir = sdir;
    hkn_engine eng = {.apply = stub_apply};
    hkn_endpoint *ep;
    hk_report rep = HK_REPORT_INIT;
    if (hkn_endpoint_start(&o, &r, &eng, &ep, &rep) != 0)
        return fprintf(stderr, "endpoint: %s\n", rep.message), 1;
    port = hkn_endpoint_port(ep);
    size_t cap = o.max_body_bytes, budget = o.max_inflight_bytes ? o.max_inflight_bytes : 2 * cap;

    /* The holders: a JSON Content-Length of the cap, and a frame declaring
     * an artifact that fills it. */
    holder hs[2];
    memset(hs, 0, sizeof hs);
    snprintf(hs[0].head, sizeof hs[0].head,
             "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nContent-Type: "
             "application/json\r\nContent-Length: %zu\r\n\r\n",
             port, cap);
    memcpy(hs[0].first, "{\"manifest\":\"", 13);
    hs[0].nfirst = 13;
    size_t alen = cap - HKN_FRAME_HEAD - 8 - 2;
    unsigned char *fh = hs[1].first;
    static const unsigned char magic[8] = {0x89, 'H', 'K', 'R', '\r', '\n', 0x1a, '\n'};
    memcpy(fh, magic, 8);
    unsigned char fields[] = {0, 1, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0};
    memcpy(fh + 8, fields, sizeof fields);
    for (int i = 0; i < 8; i++)
        fh[20 + i] = (unsigned char)((uint64_t)alen >> (56 - 8 * i));
    hs[1].nfirst = 28;
    snprintf(hs[1].head, sizeof hs[1].head,
             "POST /v1/release HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nContent-Type: %s\r\n"
             "Content-Length: %zu\r\n\r\n",
             port, HKN_FRAME_TYPE, cap);
    pthread_t ht[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&ht[i], NULL, hold, &hs[i]);
    sleep(1);

    static const char src[] = "extern \"C\" __global__ void add(float *x) { x[0] += 1; }\n";
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/release", port);
    int ok = 0, busy = 0, other = 0;
    double worst_ms = 0;
    uint64_t t0 = bench_ns();
    for (int i = 0; i < pushes; i++) {
        /* Evenly over the run. */
        uint64_t due = t0 + (uint64_t)((double)seconds * 1e9 * i / pushes);
        while (bench_ns() < due)
            usleep(10000);
        char *manifest, *sig;
        size_t mlen;
        hkn_blob b = {.name = "add.cu", .bytes = src, .size = sizeof src - 1};
        if (hkn_release_sign(&key, "add", (uint64_t)i + 1, time(NULL), time(NULL) + 3600, &b, 1,
                             &manifest, &mlen, &sig, &rep) != 0)
            return fprintf(stderr, "sign: %s\n", rep.message), 1;
        unsigned char *frame;
        size_t flen;
        if (hkn_frame_write(manifest, mlen, sig, strlen(sig), &b, 1, &frame, &flen) != 0)
            return fprintf(stderr, "frame failed\n"), 1;
        CURL *c = curl_easy_init();
        struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: " HKN_FRAME_TYPE);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, (char *)frame);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)flen);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
        uint64_t s = bench_ns();
        CURLcode cr = curl_easy_perform(c);
        double ms = (double)(bench_ns() - s) / 1e6;
        worst_ms = ms > worst_ms ? ms : worst_ms;
        long code = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        if (cr == CURLE_OK && code == 200)
            ok++;
        else if (code == 503)
            busy++;
        else
            other++;
        curl_slist_free_all(hd);
        curl_easy_cleanup(c);
        free(frame);
        free(manifest);
        free(sig);
    }
    double run_s = (double)(bench_ns() - t0) / 1e9;
    atomic_store(&stopping, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(ht[i], NULL);
    long after = peak_kib();
    hkn_endpoint_stop(ep);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", sdir);
    if (system(cmd) != 0) {
        /* a leftover temporary directory is harmless */
    }
    printf("pushes accepted: %d of %d over %.1f s (503: %d, other: %d); slowest push %.1f ms; "
           "applied %llu\n",
           ok, pushes, run_s, busy, other, worst_ms, (unsigned long long)atomic_load(&applied));
    printf("holders: reconnected %d times (request deadline %u s)\n", atomic_load(&reconnects),
           o.request_timeout_s);
    printf("peak resident memory: +%.1f MiB over the run (body cap %.0f MiB, in-flight cap %.0f "
           "MiB)\n",
           (double)(after - before) / 1024, (double)cap / 1048576, (double)budget / 1048576);
    return ok == pushes ? 0 : 1;
}

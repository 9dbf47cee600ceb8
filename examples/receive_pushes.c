/*
 * Receive signed pushes: an endpoint on 127.0.0.1 accepts releases signed by
 * the key whose public half is PUBKEY (`hotkern keygen`, `hotkern push`),
 * while the program launches KERNEL (taking (float *x, int n)) of MODULE in
 * its loop. Each release's outcome is printed: committed, or refused with the
 * reason (a bad signature, a replayed release, a compile error and its log).
 *   usage: receive_pushes PUBKEY MODULE KERNEL [SECONDS] [PORT]
 * SECONDS defaults to 60 (SIGINT stops), PORT to any free one. Needs
 * libhotkern-net. Prints "SKIP: ..." and exits 0 without a CUDA device.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <hotkern/net.h>

static volatile sig_atomic_t stop;
static void on_signal(int sig) {
    stop = 1;
}

/* Runs on the endpoint's thread that applied the release. */
static void on_event(const hk_event *ev, void *ud) {
    if (ev->kind == HK_EVENT_COMMITTED)
        printf("committed %s version %llu from %s\n", ev->module,
               (unsigned long long)ev->new_version, ev->origin);
    else if (ev->kind == HK_EVENT_REFUSED) /* the old version runs on */
        printf("refused %s from %s: %s\n", ev->module ? ev->module : "(none)", ev->origin,
               ev->report->message);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 4)
        return fprintf(stderr, "usage: receive_pushes PUBKEY MODULE KERNEL [SECONDS] [PORT]\n"), 2;
    /* Handlers before hk_runtime_create: NVRTC replaces the SIGINT, SIGTERM and
     * SIGXFSZ handlers during each compile and puts back the ones it saw when
     * the compile began, and create starts a warm-up compile at once, so a
     * handler installed after create can be undone when the warm-up ends. */
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    hk_options opt;
    hk_options_init(&opt);
    opt.on_event = on_event;
    hk_runtime *rt;
    hk_report rep = HK_REPORT_INIT;
    int rc = hk_runtime_create(&rt, &opt, &rep);
    if (rc == HK_ERR_NO_DRIVER || rc == HK_ERR_NO_DEVICE)
        return printf("SKIP: no CUDA device: %s\n", rep.message), 0;
    hk_endpoint_options eo;
    hk_endpoint_options_init(&eo);
    const char *keys[] = {argv[1]};
    eo.trusted_keys = keys; /* releases must be signed by this key */
    eo.ntrusted_keys = 1;
    eo.port = argc > 5 ? (unsigned)atoi(argv[5]) : 0;
    hk_endpoint *ep = NULL;
    if (rc || (rc = hk_endpoint_start(rt, &eo, &ep, &rep)) != 0)
        return fprintf(stderr, "%s: %s\n", hk_strerror(rc), rep.message), 1;
    printf("listening on http://127.0.0.1:%u\n", hk_endpoint_port(ep));
    fflush(stdout);
    int n = 256, ticks = 10 * (argc > 4 ? atoi(argv[4]) : 60);
    float *x = NULL, last = 0, now = 0;
    hk_kernel *k = NULL;
    if (cudaMalloc((void **)&x, n * sizeof *x) != cudaSuccess)
        return 1;
    for (int t = 0; t < ticks && !stop; t++) {
        if (k || hk_kernel_get(rt, argv[2], argv[3], &k) == 0) { /* after the first push */
            void *args[] = {&x, &n};
            if (hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){256, 1, 1}, 0, NULL, args, NULL) ||
                cudaMemcpy(&now, x, sizeof now, cudaMemcpyDeviceToHost) != cudaSuccess)
                return fprintf(stderr, "launch failed\n"), 1;
            if (now != last)
                printf("x[0] = %g\n", now);
            fflush(stdout);
            last = now;
        }
        hk_safe_point(rt);
        nanosleep(&(struct timespec){0, 100000000L}, NULL);
    }
    hk_endpoint_stop(ep); /* before the runtime it applies to */
    cudaFree(x);
    hk_runtime_destroy(rt);
    printf("stopped\n");
    return 0;
}

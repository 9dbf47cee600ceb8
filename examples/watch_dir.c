/*
 * Watch a directory: every save of DIR/MODULE.cu becomes a new version of
 * MODULE while the program keeps launching KERNEL (a kernel taking
 * (float *x, int n)) in its loop; swap outcomes are printed as they happen,
 * and so is x[0] whenever a new version changes it. A save that does not
 * compile is refused with the compiler's log, and the old version runs on.
 * The watch builds with the development profile (the fastest compile) and
 * is stopped before the runtime goes.
 *   usage: watch_dir DIR MODULE KERNEL [SECONDS]   (default 60; SIGINT stops)
 * Needs libhotkern only. Prints "SKIP: ..." and exits 0 without a CUDA device.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <hotkern/hotkern.h>

static volatile sig_atomic_t stop;
static void on_signal(int sig) {
    stop = 1;
}

/* Runs on hotkern's worker thread, after each build of a saved file. */
static void on_event(const hk_event *ev, void *ud) {
    if (ev->kind == HK_EVENT_COMMITTED)
        printf("committed %s version %llu from %s\n", ev->module,
               (unsigned long long)ev->new_version, ev->origin);
    else if (ev->kind == HK_EVENT_REFUSED)
        printf("refused %s from %s: %s\n%s", ev->module ? ev->module : "(none)", ev->origin,
               ev->report->message, ev->report->log ? ev->report->log : "");
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 4)
        return fprintf(stderr, "usage: watch_dir DIR MODULE KERNEL [SECONDS]\n"), 2;
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
    hk_watch_options wo;
    hk_watch_options_init(&wo);
    wo.build_profile = HK_BUILD_PROFILE_DEV; /* an edit loop: compile time first */
    hk_watch *w = NULL;
    if (rc || (rc = hk_watch_start(rt, argv[1], &wo, &w, &rep)) != 0)
        return fprintf(stderr, "%s: %s\n", hk_strerror(rc), rep.message), 1;
    printf("watching %s for %s.cu\n", argv[1], argv[2]);
    fflush(stdout);
    int n = 256, ticks = 10 * (argc > 4 ? atoi(argv[4]) : 60);
    float *x = NULL, last = 0, now = 0;
    hk_kernel *k = NULL;
    if (cudaMalloc((void **)&x, n * sizeof *x) != cudaSuccess)
        return 1;
    for (int t = 0; t < ticks && !stop; t++) {
        /* The handle exists once the module's first version committed. */
        if (k || hk_kernel_get(rt, argv[2], argv[3], &k) == 0) {
            void *args[] = {&x, &n};
            if (hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){256, 1, 1}, 0, NULL, args, NULL) ||
                cudaMemcpy(&now, x, sizeof now, cudaMemcpyDeviceToHost) != cudaSuccess)
                return fprintf(stderr, "launch failed\n"), 1;
            if (now != last)
                printf("x[0] = %g (version %llu)\n", now,
                       (unsigned long long)hk_module_version(rt, argv[2]));
            fflush(stdout);
            last = now;
        }
        hk_safe_point(rt); /* the loop's GPU work is idle here */
        nanosleep(&(struct timespec){0, 100000000L}, NULL);
    }
    hk_watch_stop(w); /* no file is read and nothing submitted after this */
    cudaFree(x);
    hk_runtime_destroy(rt);
    printf("stopped\n");
    return 0;
}

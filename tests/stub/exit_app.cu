// An ordinary nvcc program that ends while hotkern's first build may be in
// flight (tests/cpu_exit.c on the CPU, tests/exit-stress.sh on a GPU); the
// Makefile builds it -cudart shared (for LD_PRELOAD), with the --wrap flags
// (static cudart) and plain (static cudart, no hotkern: what the preload
// library must say it cannot reach). Nothing of hotkern in it.
// usage: exit_app DELAY_US [return|exit|thread]
//   It launches fill<<<>>> (the first launch makes hotkern's runtime), says
//   "exit_app started", waits DELAY_US and says "exit_app done", then
//   returns 7 from main, calls exit(7), or (thread) calls exit(7) from a
//   second thread while the main thread keeps launching. stdout to a file
//   is fully buffered: the lines reach it only if exit flushes it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>
#include <cuda_runtime.h>

extern "C" __global__ void fill(float *x) {
    if (x) *x = 1.0f;
}

static useconds_t delay_us;
// A crash says where (tests/exit-stress.sh shows the first ones), then ends
// the process with the signal as before.
static void on_crash(int sig) {
    void *frames[48];
    int n = backtrace(frames, 48);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void *exiter(void *) {
    usleep(delay_us);
    printf("exit_app done\n");
    exit(7);
}

int main(int argc, char **argv) {
    signal(SIGSEGV, on_crash);
    signal(SIGBUS, on_crash);
    signal(SIGABRT, on_crash);
    delay_us = argc > 1 ? (useconds_t)atoi(argv[1]) : 0;
    const char *how = argc > 2 ? argv[2] : "return";
    fill<<<1, 1>>>(nullptr);
    printf("exit_app started\n");
    if (!strcmp(how, "thread")) {
        pthread_t t;
        if (pthread_create(&t, nullptr, exiter, nullptr) != 0)
            return 1;
        for (;;) {
            fill<<<1, 1>>>(nullptr);
            usleep(100);
        }
    }
    usleep(delay_us);
    printf("exit_app done\n");
    if (!strcmp(how, "exit"))
        exit(7);
    return 7;
}

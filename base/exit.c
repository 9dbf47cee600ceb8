/*
 * The exit guard (exit.h). A program that returns from main or calls exit
 * while one of hotkern's threads compiles with NVRTC or calls the driver
 * dies in the exit handlers that tear those libraries down (measured: a
 * SIGSEGV in NVRTC's static destructors, 20 of 20 short runs exiting during
 * a build). exit runs its handlers in the reverse order of their
 * registration, and NVRTC's, the driver's and (mostly) the CUDA runtime's
 * were registered before a runtime is made: a handler registered when a
 * runtime is made runs before them. It marks the process exiting, so that
 * no section of driver or NVRTC work begins from then on, and waits for
 * those in progress. After it returns nothing of hotkern's calls either
 * library: each of hotkern's threads that meets the mark parks (no lock
 * held), and the program's own calls are refused (HK_ERR_CLOSED).
 *
 * A section that outlasts the wait (an NVRTC compile cannot be cut short; a
 * module load waits for the GPU's queued work) would meet the libraries'
 * teardown. Rather than crash there, the guard ends the process itself with
 * the status exit was given, its stdio streams flushed, and says so on
 * stderr: the program's status and output stay its own, only the exit
 * handlers registered before the runtime do not run. on_exit (not atexit)
 * is what hands the guard that status.
 *
 * The calling thread's own sections (exit called from inside one, e.g. from
 * a callback) are not waited for. quick_exit and _exit run no destructors:
 * they need nothing. Every state here is an atomic, the thread depth a
 * thread-local; the registration takes reg_lock.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "base/exit.h"

static _Atomic int exiting;
static _Atomic long inflight;
static _Atomic int wait_max_ms; /* the largest hkb_exit_guard was given */
static _Atomic int registered, rearms;
static __thread long depth; /* this thread's sections in progress */
/* How many of a process's first in-process compiles register the guard
 * again after them (hkb_exit_rearm). */
#define REARMS 4
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void guard(int status, void *arg) {
    (void)arg;
    if (atomic_exchange(&exiting, 1))
        return; /* an earlier registration ran it */
    double end = now_ms() + atomic_load(&wait_max_ms);
    struct timespec ms = {0, 1000000};
    while (atomic_load(&inflight) > depth && now_ms() < end)
        nanosleep(&ms, NULL);
    if (atomic_load(&inflight) <= depth)
        return;
    fprintf(stderr,
            "hotkern: exit: a build or driver call of hotkern's was still running after %d ms; "
            "the process ends now with status %d, without the exit handlers registered before "
            "hotkern started (the CUDA libraries' teardown would crash under it)\n",
            atomic_load(&wait_max_ms), status);
    fflush(NULL);
    _exit(status);
}

static void reg(void) {
    pthread_mutex_lock(&reg_lock);
    if (!atomic_load(&exiting) && on_exit(guard, NULL) == 0)
        atomic_fetch_add(&registered, 1); /* a failure (no memory) leaves the earlier one */
    pthread_mutex_unlock(&reg_lock);
}

void hkb_exit_guard(int wait_ms) {
    int cur = atomic_load(&wait_max_ms);
    while (wait_ms > cur && !atomic_compare_exchange_weak(&wait_max_ms, &cur, wait_ms))
        ;
    reg();
}

void hkb_exit_rearm(void) {
    if (atomic_load(&registered) && atomic_fetch_add(&rearms, 1) < REARMS)
        reg();
}

int hkb_exit_enter(void) {
    atomic_fetch_add(&inflight, 1);
    if (atomic_load(&exiting)) {
        atomic_fetch_sub(&inflight, 1);
        return 0;
    }
    depth++;
    return 1;
}

void hkb_exit_leave(void) {
    depth--;
    atomic_fetch_sub(&inflight, 1);
}

int hkb_exiting(void) {
    return atomic_load(&exiting);
}

void hkb_exit_park(void) {
    for (;;)
        pause();
}

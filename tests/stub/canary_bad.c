/*
 * A canary helper that misbehaves, for tests/cpu_canary.c: it takes the
 * arguments of hotkern-canary and, as HKBAD_MODE says,
 *   noready    never says READY (sleeps)
 *   failready  says FAIL instead of READY
 *   failagain  the first helper (HKBAD_STATE, a file, does not exist yet:
 *              it creates it) says READY and exits at the first request;
 *              every later one says FAIL (a helper that cannot start again)
 *   exit       says READY, then exits at the first request
 *   silent     says READY, then never answers
 *   linger     as silent, and ignores SIGTERM (a helper that outlives its
 *              kill once a test has hotkern kill with SIGTERM)
 *   garbage    says READY, then answers with bytes that are no message
 *   oversize   says READY, then announces a 4 GiB reply
 *   badtype    answers LOAD properly, LAUNCH with a LOADED message
 *   wrongsize  answers LOAD properly, LAUNCH with a buffer of the wrong size
 *   extra      answers LOAD properly, LAUNCH with bytes left over
 *   flood      writes 4 MiB to stdout and to stderr (as a kernel's printf
 *              would), says READY, then exits at the first request
 *   badtimed   answers LOAD properly, LAUNCH with a finished RESULT (no
 *              buffers: the test must not compare) and, when timed runs
 *              were asked for, a TIMED with one run too many
 *   badtrap    answers LOAD properly, LAUNCH with a finished RESULT that
 *              also claims a trap guard's code (a trap stops a launch)
 *   trapcu     answers LAUNCH with a RESULT that stopped while running with
 *              both a driver error and a trap guard's code
 *   trapunasked  answers LAUNCH with a trap guard's code for an image that
 *              has no guard
 * Built as BUILD/stub/hotkern-canary-bad (not a suite).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "canary/canary.h"

static int fd = 3;

static void say(hku_buf *b) {
    hku_send(fd, b);
    hku_buf_free(b);
}

static void loaded(void) {
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_LOADED);
    hku_put_u32(&b, 0);
    hku_put_str(&b, "", HKA_MAX_TEXT);
    hku_put_str(&b, "", HKA_MAX_TEXT);
    say(&b);
}

/* A RESULT claiming one finished buffer of `size` bytes, plus `extra`. */
static void result(uint64_t size, size_t extra) {
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_RESULT);
    hku_put_u32(&b, HKA_STAGE_DONE);
    hku_put_u32(&b, 0);
    hku_put_str(&b, "", HKA_MAX_TEXT);
    hku_put_u32(&b, 0); /* no trap */
    hku_put_u32(&b, 1);
    hku_put_u32(&b, 0);
    hku_put_u64(&b, size);
    for (uint64_t i = 0; i < size + extra; i++)
        hku_put(&b, "x", 1);
    say(&b);
}

/* A finished RESULT without buffers, then TIMED with runs + 1 times. */
static void badtimed(uint32_t runs) {
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_RESULT);
    hku_put_u32(&b, HKA_STAGE_DONE);
    hku_put_u32(&b, 0);
    hku_put_str(&b, "", HKA_MAX_TEXT);
    hku_put_u32(&b, 0); /* no trap */
    hku_put_u32(&b, 0);
    say(&b);
    if (!runs)
        return;
    hku_buf_init(&b, HKA_MAGIC, HKA_TIMED);
    hku_put_u32(&b, HKA_STAGE_DONE);
    hku_put_u32(&b, 0);
    hku_put_str(&b, "", HKA_MAX_TEXT);
    hku_put_u32(&b, 0); /* no trap */
    hku_put_u32(&b, runs + 1);
    for (uint32_t i = 0; i <= runs; i++)
        hku_put_u64(&b, 1000);
    say(&b);
}

/* A RESULT that stopped at `stage` with `cu` and the guard's code `trap`,
 * and no buffers. */
static void stopped(uint32_t stage, uint32_t cu, uint32_t trap) {
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_RESULT);
    hku_put_u32(&b, stage);
    hku_put_u32(&b, cu);
    hku_put_str(&b, cu ? "CUDA_ERROR_LAUNCH_FAILED" : "", HKA_MAX_TEXT);
    hku_put_u32(&b, trap);
    hku_put_u32(&b, 0);
    say(&b);
}

static void answer(const char *mode, uint32_t type, const unsigned char *d, size_t len) {
    if (!strcmp(mode, "exit") || !strcmp(mode, "flood"))
        exit(0);
    if (!strcmp(mode, "silent") || !strcmp(mode, "linger"))
        for (;;)
            pause();
    if (!strcmp(mode, "garbage")) {
        char junk[64];
        memset(junk, 0x5a, sizeof junk);
        send(fd, junk, sizeof junk, MSG_NOSIGNAL);
        return;
    }
    if (!strcmp(mode, "oversize")) {
        hku_msg_hdr h = {HKA_MAGIC, HKA_RESULT, 0xfffffff0u};
        send(fd, &h, sizeof h, MSG_NOSIGNAL);
        return;
    }
    if (type == HKA_LOAD) {
        loaded();
        return;
    }
    if (!strcmp(mode, "badtype"))
        loaded();
    else if (!strcmp(mode, "badtimed")) {
        uint32_t runs = 0; /* LAUNCH ends with u32 outputs, warmups, runs */
        if (len >= 4)
            memcpy(&runs, d + len - 4, 4);
        badtimed(runs);
    } else if (!strcmp(mode, "badtrap"))
        stopped(HKA_STAGE_DONE, 0, 5);
    else if (!strcmp(mode, "trapcu"))
        stopped(HKA_STAGE_SYNC, 719, 5);
    else if (!strcmp(mode, "trapunasked"))
        stopped(HKA_STAGE_SYNC, 0, 5);
    else if (!strcmp(mode, "wrongsize"))
        result(3, 0);
    else
        result(16, 5); /* extra */
}

int main(int argc, char **argv) {
    const char *mode = getenv("HKBAD_MODE");
    mode = mode ? mode : "garbage";
    if (!strcmp(mode, "linger"))
        signal(SIGTERM, SIG_IGN);
    if (!strcmp(mode, "noready"))
        for (;;)
            pause();
    if (!strcmp(mode, "flood")) {
        /* Each write may fail or be short (a full pipe): that is the point. */
        static char line[4096];
        memset(line, 'F', sizeof line);
        memcpy(line, "HKBAD-FLOOD ", 12);
        line[sizeof line - 1] = '\n';
        for (int i = 0; i < 1024; i++) {
            if (write(1, line, sizeof line) < 0 || write(2, line, sizeof line) < 0)
                continue;
        }
        static const char last[] = "\nhkbad: flooded\n";
        if (write(2, last, sizeof last - 1) < 0)
            (void)0;
    }
    hku_buf b;
    if (!strcmp(mode, "failagain")) {
        const char *state = getenv("HKBAD_STATE");
        if (state && access(state, F_OK) != 0) {
            FILE *f = fopen(state, "w");
            if (f)
                fclose(f);
            mode = "exit";
        } else {
            mode = "failready";
        }
    }
    if (!strcmp(mode, "failready")) {
        hku_buf_init(&b, HKA_MAGIC, HKA_FAIL);
        hku_put_str(&b, "no device here", HKA_MAX_TEXT);
        say(&b);
        return 1;
    }
    hku_buf_init(&b, HKA_MAGIC, HKA_READY);
    hku_put_u32(&b, HKA_PROTOCOL);
    say(&b);
    for (;;) {
        uint32_t type;
        unsigned char *d;
        size_t len;
        if (hku_recv(fd, HKA_MAGIC, HKA_MAX_MSG, 0, &type, &d, &len) < 0)
            return 0;
        answer(mode, type, d, len);
        free(d);
    }
}

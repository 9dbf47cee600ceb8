/*
 * hotkern-build: the helper process of build isolation (ptx.h, "build
 * isolation", has the protocol).
 *
 *   hotkern-build --fd N [--warm ARCH]
 *
 * Started by libhotkern with posix_spawn, never by hand. It says READY on
 * fd N, warms NVRTC up for ARCH on a thread of its own when asked (the same
 * ptx/warm.c a runtime uses in-process), then serves BUILD requests one at a
 * time with the same hkp_build as an in-process build, without a cache (the
 * application keeps the cache), until the parent closes the socket. It is
 * one long-lived process, so NVRTC stays loaded and its precompiled headers
 * stay valid between builds, and it keeps the memory NVRTC frees for the
 * next build (hkp_keep_heap), which the application's process does not do
 * unless it asks (hk_build_keep_memory).
 *
 * NVRTC changes this process's SIGINT, SIGTERM and SIGXFSZ dispositions
 * during each compile; that is why the compile runs here. A source that
 * crashes or hangs the compiler ends or blocks this process only: the parent
 * kills it at its deadline and starts another.
 *
 * It trusts the parent no more than the parent trusts it: every size and
 * count is bounded before allocating, the request is parsed strictly, and a
 * malformed one ends the helper. It also ends when its parent does.
 *
 * HK_BUILD_TEST_STALL_MS (test-only): sleep that many milliseconds before
 * each build, so the test suite can make a build outlive its deadline or
 * kill the helper in the middle of one.
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ptx/ptx.h"
#include "util/util.h"

static int fd = -1;
static int stall_ms; /* test-only: sleep after reading a request */
static int deaf_ms;  /* test-only: sleep before reading one */

/* The socket stays open while the parent lives, but a compile that hangs
 * never reads it again: a watch thread ends this process when the parent
 * goes. */
/* One BUILD request, parsed; pointers into the received payload or owned
 * copies (freed by req_free). */
typedef struct req {
    uint32_t fmt;
    hkp_build_opts o;
    char *cwd, *source_name;
    char **options, **names;
    uint32_t noptions, nnames, nheaders;
    hk_header *headers;
    const void *data;
    uint64_t size;
} req;

static void req_free(req *q) {
    free(q->cwd);
    free(q->source_name);
    hku_strv_free(q->options, (int)q->noptions);
    hku_strv_free(q->names, (int)q->nnames);
    for (uint32_t i = 0; q->headers && i < q->nheaders; i++)
        free((char *)q->headers[i].name);
    free(q->headers);
}

static char **get_strv(hku_rd *rd, uint32_t *n) {
    *n = hku_get_u32(rd);
    if (rd->bad || *n > HKP_ISO_MAX_COUNT) {
        rd->bad = 1;
        *n = 0;
        return NULL;
    }
    char **v = *n ? calloc(*n, sizeof *v) : NULL;
    if (*n && !v)
        exit(4);
    for (uint32_t i = 0; i < *n && !rd->bad; i++)
        v[i] = hku_get_strdup(rd, HKP_ISO_MAX_STR, 0);
    return v;
}

/* Parses a BUILD strictly; a malformed request ends the helper. */
static void parse(hku_rd *rd, req *q) {
    uint32_t h[9];
    for (int i = 0; i < 9; i++)
        h[i] = hku_get_u32(rd);
    q->fmt = h[0];
    q->o = (hkp_build_opts){.arch = (int)h[1],
                            .ptx_to_cubin = (int)h[2],
                            .opt_level = (int)h[3],
                            .nvrtc_via_ptx = (int)h[4],
                            .no_toolkit = (int)h[5],
                            .pch = (int)h[6],
                            .fast_compile = (int)h[7],
                            .trap_guard = (int)h[8]};
    q->cwd = hku_get_strdup(rd, HKP_ISO_MAX_STR, 0);
    q->source_name = hku_get_strdup(rd, HKP_ISO_MAX_STR, 0);
    q->options = get_strv(rd, &q->noptions);
    q->names = get_strv(rd, &q->nnames);
    q->nheaders = hku_get_u32(rd);
    if (rd->bad || (q->fmt != HK_FORMAT_CUDA_C && q->fmt != HK_FORMAT_PTX) ||
        q->nheaders > HKP_ISO_MAX_COUNT || h[2] > 1 || h[3] > 4 || h[4] > 1 || h[5] > 1 ||
        h[6] > 1 || h[7] > 1 || h[8] > 1)
        exit(2);
    if (q->nheaders && !(q->headers = calloc(q->nheaders, sizeof *q->headers)))
        exit(4);
    for (uint32_t i = 0; i < q->nheaders && !rd->bad; i++) {
        q->headers[i].name = hku_get_strdup(rd, HKP_ISO_MAX_STR, 0);
        uint64_t n = hku_get_u64(rd);
        q->headers[i].data = n <= HKP_ISO_MAX_BYTES ? hku_get(rd, (size_t)n) : NULL;
        q->headers[i].size = (size_t)n;
        rd->bad |= !q->headers[i].data;
    }
    q->size = hku_get_u64(rd);
    q->data = q->size <= HKP_ISO_MAX_BYTES ? hku_get(rd, (size_t)q->size) : NULL;
    if (rd->bad || !q->data || hku_end(rd))
        exit(2);
    q->o.nvrtc_options = (const char *const *)q->options;
    q->o.nnvrtc_options = (int)q->noptions;
    q->o.name_expressions = (const char *const *)q->names;
    q->o.nname_expressions = (int)q->nnames;
    q->o.headers = q->headers;
    q->o.nheaders = (int)q->nheaders;
    q->o.source_name = q->source_name;
}

static void reply(int rc, const char *why, const hkp_artifact *a) {
    hku_buf b;
    hku_buf_init(&b, HKP_ISO_MAGIC, HKP_ISO_BUILT);
    hku_put_u32(&b, (uint32_t)(rc < 0 ? -rc : 0));
    hku_put_str(&b, why, HKP_ISO_MAX_WHY);
    hku_put_str(&b, a->log, HKP_ISO_MAX_LOG);
    hku_put_u32(&b, (uint32_t)a->format);
    int nl = rc == 0 ? a->nlowered : 0;
    hku_put_u32(&b, (uint32_t)nl);
    for (int i = 0; i < nl; i++)
        hku_put_str(&b, a->lowered_names[i], HKP_ISO_MAX_STR);
    size_t size = rc == 0 ? a->size : 0;
    hku_put_u64(&b, size);
    hku_put(&b, a->image, size);
    int guarded = rc == 0 && a->guard;
    hku_put_u32(&b, guarded ? (uint32_t)a->guard_sites : 0);
    hku_put_u64(&b, guarded ? a->guard_size : 0);
    hku_put(&b, a->guard, guarded ? a->guard_size : 0);
    if (hku_send(fd, &b) < 0)
        exit(0);
    hku_buf_free(&b);
}

static void serve(hku_rd *rd) {
    req q;
    memset(&q, 0, sizeof q);
    parse(rd, &q);
    if (stall_ms > 0)
        usleep((useconds_t)stall_ms * 1000);
    /* Relative paths (-I, the source's directory) mean what they mean in the
     * application, whose directory may have changed since this started. */
    int cd = q.cwd[0] ? chdir(q.cwd) : 0;
    (void)cd; /* failed: the build reports the files it cannot find */
    hkp_artifact a;
    char why[HKP_ISO_MAX_WHY] = "";
    int rc = hkp_build(q.data, (size_t)q.size, (hk_format)q.fmt, &q.o, &a, why, sizeof why);
    if (a.guard_size > HKP_ISO_MAX_BYTES) { /* the version goes on unguarded */
        free(a.guard);
        a.guard = NULL, a.guard_size = 0, a.guard_sites = 0;
    }
    if (rc == 0 && a.size > HKP_ISO_MAX_BYTES) {
        rc = HK_ERR_TOO_LARGE;
        snprintf(why, sizeof why, "the built image is over %u MiB", HKP_ISO_MAX_BYTES >> 20);
    }
    reply(rc, why, &a);
    hkp_artifact_free(&a);
    req_free(&q);
}

int main(int argc, char **argv) {
    int warm = 0;
    if ((fd = hku_helper_init(argc, argv, "hotkern-build", "--warm", &warm)) < 0)
        return 2;
    const char *stall = getenv("HK_BUILD_TEST_STALL_MS"), *deaf = getenv("HK_BUILD_TEST_DEAF_MS");
    stall_ms = stall ? atoi(stall) : 0;
    deaf_ms = deaf ? atoi(deaf) : 0;
    /* This process exists to compile: it keeps what NVRTC frees for the next
     * compile (ptx/warm.c), whatever malloc settings it inherited from the
     * application's environment. A refusal only costs speed. */
    (void)hkp_keep_heap(1, NULL, 0);
    hku_buf b;
    hku_buf_init(&b, HKP_ISO_MAGIC, HKP_ISO_READY);
    hku_put_u32(&b, HKP_ISO_PROTOCOL);
    if (hku_send(fd, &b) < 0)
        return 0;
    hku_buf_free(&b);
    hkp_warm *w = NULL;
    if (warm > 0 && hkp_warm_start(&w, warm) < 0)
        w = NULL; /* the first build pays NVRTC's start-up instead */
    for (;;) {
        uint32_t type;
        unsigned char *d;
        size_t len;
        if (deaf_ms > 0)
            usleep((useconds_t)deaf_ms * 1000);
        int r = hku_recv(fd, HKP_ISO_MAGIC, HKP_ISO_MAX_MSG, 0, &type, &d, &len);
        if (r == HKU_RECV_EOF)
            break; /* the parent is done with us */
        if (r < 0 || type != HKP_ISO_BUILD)
            return 2;
        hku_rd rd = {d, len, 0};
        serve(&rd);
        free(d);
    }
    hkp_warm_stop(w);
    return 0;
}

/*
 * hotkern-canary: the helper process of canary runs (canary.h).
 *
 *   hotkern-canary --fd N [--device D]
 *
 * Started by libhotkern with posix_spawn, never by hand: it binds the CUDA
 * driver as hotkern does (HK_LIBCUDA selects the library, so a CPU-only run
 * uses libhotkern-fakecuda.so), makes device D's primary context current in
 * this process, says READY on fd N and then serves LOAD and LAUNCH requests
 * one at a time until the parent closes the socket. A kernel that faults
 * leaves this process's context unusable and one that hangs blocks it: the
 * parent then kills it and starts another. It trusts the parent no more than
 * the parent trusts it: every request is bounded and parsed strictly, and a
 * malformed one ends the helper. It also ends when its parent does.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "canary/canary.h"
#include "loader/driver.h"

/* The copies a test needs beyond hotkern's own driver table. */
static struct {
    __typeof__(cuMemcpyHtoD) *MemcpyHtoD;
    __typeof__(cuMemcpyDtoH) *MemcpyDtoH;
    __typeof__(cuMemFree) *MemFree;
} X;

static hkl_driver D;
static CUcontext ctx;
static CUmodule slots[2];
static int fd = -1;

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t,
                           CUdriverProcAddressQueryResult *);

static void fail(const char *what, const char *detail) {
    char text[600];
    snprintf(text, sizeof text, "%s%s", what, detail);
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_FAIL);
    hku_put_str(&b, text, HKA_MAX_TEXT);
    hku_send(fd, &b);
    hku_buf_free(&b);
    exit(1);
}

/* The parent's end of the socket stays open while it lives, but this
 * process may be blocked in the driver behind a hanging kernel when the
 * parent goes: a watch thread ends it then. */
static int bind_extras(void) {
    gpa_fn gpa = (gpa_fn)dlsym(D.dl, "cuGetProcAddress_v2");
    CUdriverProcAddressQueryResult found;
    return !gpa || gpa("cuMemcpyHtoD", (void **)&X.MemcpyHtoD, CUDA_VERSION, 0, &found) ||
           gpa("cuMemcpyDtoH", (void **)&X.MemcpyDtoH, CUDA_VERSION, 0, &found) ||
           gpa("cuMemFree", (void **)&X.MemFree, CUDA_VERSION, 0, &found) || !X.MemcpyHtoD ||
           !X.MemcpyDtoH || !X.MemFree;
}

static void attach(int device) {
    char why[512];
    if (hkl_driver_open(&D, why, sizeof why) < 0)
        fail("", why);
    if (bind_extras())
        fail("the CUDA driver lacks cuMemcpyHtoD, cuMemcpyDtoH or cuMemFree", "");
    CUdevice dev;
    CUresult r = D.DeviceGet(&dev, device);
    if (r == CUDA_SUCCESS)
        r = D.DevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_SUCCESS)
        r = D.CtxSetCurrent(ctx);
    if (r != CUDA_SUCCESS)
        fail("no context on the device: ", hkl_cu_name(&D, r));
}

/* LOAD {slot, format, image}: (re)loads a slot. */
static void do_load(hku_rd *rd) {
    uint32_t slot = hku_get_u32(rd);
    hku_get_u32(rd); /* format: the driver detects it */
    size_t n = rd->left;
    const void *img = hku_get(rd, n);
    if (rd->bad || slot > 1 || !n || n > HKA_MAX_IMAGE)
        exit(2);
    char *copy = calloc(1, n + 1); /* PTX must end with a NUL */
    char *log = calloc(1, HKA_MAX_TEXT);
    if (!copy || !log)
        exit(4);
    memcpy(copy, img, n);
    if (slots[slot])
        D.ModuleUnload(slots[slot]);
    slots[slot] = NULL;
    CUjit_option o[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *v[] = {log, (void *)(uintptr_t)(HKA_MAX_TEXT - 1)};
    CUresult r = D.ModuleLoadDataEx(&slots[slot], copy, 2, o, v);
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_LOADED);
    hku_put_u32(&b, (uint32_t)r);
    hku_put_str(&b, r ? hkl_cu_name(&D, r) : "", HKA_MAX_TEXT);
    hku_put_str(&b, r ? log : "", HKA_MAX_TEXT);
    if (hku_send(fd, &b) < 0)
        exit(0);
    hku_buf_free(&b);
    free(copy);
    free(log);
}

/* One test launch, parsed. */
typedef struct req {
    uint32_t slot, grid[3], block[3], shared, nargs, outputs;
    char entry[HKA_MAX_TEXT + 1];
    hka_arg args[HKA_MAX_ARGS];
    const void *bytes[HKA_MAX_ARGS]; /* scalar values, host contents */
    CUdeviceptr dev[HKA_MAX_ARGS];
    void *params[HKA_MAX_ARGS];
} req;

static void parse_launch(hku_rd *rd, req *q) {
    uint64_t total = 0;
    q->slot = hku_get_u32(rd);
    hku_get_str(rd, q->entry, sizeof q->entry, sizeof q->entry - 1);
    for (int i = 0; i < 3; i++)
        q->grid[i] = hku_get_u32(rd);
    for (int i = 0; i < 3; i++)
        q->block[i] = hku_get_u32(rd);
    q->shared = hku_get_u32(rd);
    q->nargs = hku_get_u32(rd);
    if (rd->bad || q->slot > 1 || q->nargs > HKA_MAX_ARGS)
        exit(2);
    for (uint32_t i = 0; i < q->nargs; i++) {
        hka_arg *a = &q->args[i];
        a->kind = hku_get_u32(rd);
        a->size = hku_get_u64(rd);
        a->fill = hku_get_u32(rd);
        a->param = hku_get_u64(rd);
        int scalar = a->kind == HKA_ARG_SCALAR;
        if (rd->bad || a->kind > HKA_ARG_BUFFER || !a->size ||
            (scalar && a->size > HKA_MAX_SCALAR) ||
            (!scalar && a->size > HKA_MAX_TEST_BYTES - total))
            exit(2);
        total += scalar ? 0 : a->size;
        if (scalar || a->fill == HK_FILL_HOST)
            q->bytes[i] = hku_get(rd, a->size);
    }
    q->outputs = hku_get_u32(rd);
    if (rd->bad || q->outputs > 1 || hku_end(rd))
        exit(2);
}

/* Sets up, launches and synchronises; returns the stage reached. */
static uint32_t execute(req *q, CUresult *r) {
    CUfunction f;
    void *host = NULL;
    if (!slots[q->slot] || (*r = D.ModuleGetFunction(&f, slots[q->slot], q->entry)))
        return *r = *r ? *r : CUDA_ERROR_NOT_FOUND, HKA_STAGE_SETUP;
    for (uint32_t i = 0; i < q->nargs; i++) {
        hka_arg *a = &q->args[i];
        if (a->kind == HKA_ARG_SCALAR) {
            q->params[i] = (void *)q->bytes[i];
            continue;
        }
        if ((*r = D.MemAlloc(&q->dev[i], a->size)))
            return HKA_STAGE_SETUP;
        const void *src = q->bytes[i];
        if (!src) {
            if (!(host = malloc(a->size)))
                return *r = CUDA_ERROR_OUT_OF_MEMORY, HKA_STAGE_SETUP;
            hka_fill(host, a->size, a->fill, a->param);
            src = host;
        }
        *r = X.MemcpyHtoD(q->dev[i], src, a->size);
        free(host);
        host = NULL;
        if (*r)
            return HKA_STAGE_SETUP;
        q->params[i] = &q->dev[i];
    }
    if ((*r = D.LaunchKernel(f, q->grid[0], q->grid[1], q->grid[2], q->block[0], q->block[1],
                             q->block[2], q->shared, NULL, q->params, NULL)))
        return HKA_STAGE_LAUNCH;
    if ((*r = D.CtxSynchronize(ctx)))
        return HKA_STAGE_SYNC;
    return HKA_STAGE_DONE;
}

/* Copies the buffers out when the parent asked for them (to compare) and
 * sends RESULT; a failed copy is reported as such, with no buffers. */
static void reply(req *q, uint32_t stage, CUresult r) {
    unsigned char *out[HKA_MAX_ARGS] = {0};
    int send_out = q->outputs && stage == HKA_STAGE_DONE;
    for (uint32_t i = 0; i < q->nargs && send_out; i++) {
        if (q->args[i].kind != HKA_ARG_BUFFER)
            continue;
        if (!(out[i] = malloc(q->args[i].size)))
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            r = X.MemcpyDtoH(out[i], q->dev[i], q->args[i].size);
        if (r)
            stage = HKA_STAGE_COPY;
    }
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_RESULT);
    hku_put_u32(&b, stage);
    hku_put_u32(&b, (uint32_t)r);
    hku_put_str(&b, r ? hkl_cu_name(&D, r) : "", HKA_MAX_TEXT);
    send_out = q->outputs && stage == HKA_STAGE_DONE; /* not after a failed copy */
    uint32_t nout = 0;
    for (uint32_t i = 0; i < q->nargs && send_out; i++)
        nout += q->args[i].kind == HKA_ARG_BUFFER;
    hku_put_u32(&b, nout);
    for (uint32_t i = 0; i < q->nargs && send_out; i++) {
        if (q->args[i].kind != HKA_ARG_BUFFER)
            continue;
        hku_put_u32(&b, i);
        hku_put_u64(&b, q->args[i].size);
        hku_put(&b, out[i], q->args[i].size);
    }
    for (uint32_t i = 0; i < q->nargs; i++)
        free(out[i]);
    if (hku_send(fd, &b) < 0)
        exit(0);
    hku_buf_free(&b);
}

static void do_launch(hku_rd *rd) {
    req *q = calloc(1, sizeof *q);
    if (!q)
        exit(4);
    parse_launch(rd, q);
    CUresult r = CUDA_SUCCESS;
    uint32_t stage = execute(q, &r);
    reply(q, stage, r);
    for (uint32_t i = 0; i < q->nargs; i++)
        if (q->dev[i])
            X.MemFree(q->dev[i]);
    free(q);
}

int main(int argc, char **argv) {
    int device = 0;
    if ((fd = hku_helper_init(argc, argv, "hotkern-canary", "--device", &device)) < 0)
        return 2;
    attach(device);
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_READY);
    hku_put_u32(&b, HKA_PROTOCOL);
    if (hku_send(fd, &b) < 0)
        return 0;
    hku_buf_free(&b);
    for (;;) {
        uint32_t type;
        unsigned char *d;
        size_t len;
        int r = hku_recv(fd, HKA_MAGIC, HKA_MAX_MSG, 0, &type, &d, &len);
        if (r == HKU_RECV_EOF)
            return 0; /* the parent is done with us */
        if (r < 0)
            return 2;
        hku_rd rd = {d, len, 0};
        if (type == HKA_LOAD)
            do_load(&rd);
        else if (type == HKA_LAUNCH)
            do_launch(&rd);
        else
            return 2;
        free(d);
    }
}

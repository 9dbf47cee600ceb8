/*
 * hotkern-canary: the helper process of canary runs (canary.h).
 *
 *   hotkern-canary --fd N [--device D]
 *
 * Started by libhotkern with posix_spawn, never by hand: it binds the CUDA
 * driver as hotkern does (HK_LIBCUDA selects the library, so a CPU-only run
 * uses libhotkern-fakecuda.so), makes device D's primary context current in
 * this process, says READY on fd N and then serves LOAD, LAUNCH and LIMITS requests
 * one at a time until the parent closes the socket (a finished LAUNCH that
 * asks for timed repeats runs them after its RESULT and answers TIMED).
 * Under compute-sanitizer (the memcheck helper, canary.h) it is started
 * with --keep-fds 1 and --owner PID (util/proc.c). A kernel that faults
 * leaves this process's context unusable and one that hangs blocks it: the
 * parent then kills it and starts another. It trusts the parent no more than
 * the parent trusts it: every request is bounded and parsed strictly, and a
 * malformed one ends the helper. It also ends when its parent does.
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "canary/canary.h"
#include "base/driver.h"

/* The copies a test needs beyond hotkern's own driver table, and the
 * events that time its repeats. */
static struct {
    __typeof__(cuMemcpyHtoD) *MemcpyHtoD;
    __typeof__(cuMemcpyDtoH) *MemcpyDtoH;
    __typeof__(cuMemFree) *MemFree;
    __typeof__(cuEventCreate) *EventCreate;
    __typeof__(cuEventRecord) *EventRecord;
    __typeof__(cuEventSynchronize) *EventSynchronize;
    __typeof__(cuEventElapsedTime) *EventElapsedTime;
    __typeof__(cuEventDestroy) *EventDestroy;
} X;

static hkb_driver D;
static CUcontext ctx;
static CUmodule slots[HKA_NSLOTS];
/* Where a slot's image keeps the trap guard's code (ptx/guard.c); 0: the
 * image has no guard. */
static CUdeviceptr trap_at[HKA_NSLOTS];
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

/* The events: a driver without them only cannot time (TIMED says so). */
static void bind_events(void) {
    gpa_fn gpa = (gpa_fn)dlsym(D.dl, "cuGetProcAddress_v2");
    CUdriverProcAddressQueryResult found;
    if (!gpa || gpa("cuEventCreate", (void **)&X.EventCreate, CUDA_VERSION, 0, &found) ||
        gpa("cuEventRecord", (void **)&X.EventRecord, CUDA_VERSION, 0, &found) ||
        gpa("cuEventSynchronize", (void **)&X.EventSynchronize, CUDA_VERSION, 0, &found) ||
        gpa("cuEventElapsedTime", (void **)&X.EventElapsedTime, CUDA_VERSION, 0, &found) ||
        gpa("cuEventDestroy", (void **)&X.EventDestroy, CUDA_VERSION, 0, &found))
        X.EventCreate = NULL;
}

static void attach(int device) {
    char why[512];
    if (hkb_driver_open(&D, why, sizeof why) < 0)
        fail("", why);
    if (bind_extras())
        fail("the CUDA driver lacks cuMemcpyHtoD, cuMemcpyDtoH or cuMemFree", "");
    bind_events();
    CUdevice dev;
    CUresult r = D.DeviceGet(&dev, device);
    if (r == CUDA_SUCCESS)
        r = D.DevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_SUCCESS)
        r = D.CtxSetCurrent(ctx);
    if (r != CUDA_SUCCESS)
        fail("no context on the device: ", hkb_cu_name(&D, r));
}

/* LOAD {slot, format, guarded, image}: (re)loads a slot. */
static void do_load(hku_rd *rd) {
    uint32_t slot = hku_get_u32(rd);
    hku_get_u32(rd); /* format: the driver detects it */
    uint32_t guarded = hku_get_u32(rd);
    size_t n = rd->left;
    const void *img = hku_get(rd, n);
    if (rd->bad || slot >= HKA_NSLOTS || guarded > 1 || !n || n > HKA_MAX_IMAGE)
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
    size_t tsize = 0;
    trap_at[slot] = 0;
    /* Only a trap guard's copy says so: an image may name the symbol
     * itself. */
    if (r == CUDA_SUCCESS && guarded &&
        (D.ModuleGetGlobal(&trap_at[slot], &tsize, slots[slot], HKP_GUARD_SYMBOL) != CUDA_SUCCESS ||
         tsize != sizeof(uint32_t)))
        trap_at[slot] = 0;
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_LOADED);
    hku_put_u32(&b, (uint32_t)r);
    hku_put_str(&b, r ? hkb_cu_name(&D, r) : "", HKA_MAX_TEXT);
    hku_put_str(&b, r ? log : "", HKA_MAX_TEXT);
    if (hku_send(fd, &b) < 0)
        exit(0);
    hku_buf_free(&b);
    free(copy);
    free(log);
}

/* One test launch, parsed. */
typedef struct req {
    uint32_t slot, grid[3], block[3], shared, nargs, outputs, warmups, runs;
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
    if (rd->bad || q->slot >= HKA_NSLOTS || q->nargs > HKA_MAX_ARGS)
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
    q->warmups = hku_get_u32(rd);
    q->runs = hku_get_u32(rd);
    if (rd->bad || q->outputs > 1 || q->warmups > HKA_MAX_WARMUPS || q->runs > HKA_MAX_RUNS ||
        hku_end(rd))
        exit(2);
}

static CUresult launch(req *q, CUfunction f) {
    return D.LaunchKernel(f, q->grid[0], q->grid[1], q->grid[2], q->block[0], q->block[1],
                          q->block[2], q->shared, NULL, q->params, NULL);
}

/* Clears the slot's trap guard code before a launch (0: no guard). */
static CUresult trap_clear(uint32_t slot) {
    uint32_t zero = 0;
    return trap_at[slot] ? X.MemcpyHtoD(trap_at[slot], &zero, sizeof zero) : CUDA_SUCCESS;
}

/* After a launch that finished: the code a guarded site stored (0: none
 * ran), or the error of reading it. */
static CUresult trap_read(uint32_t slot, uint32_t *code) {
    *code = 0;
    return trap_at[slot] ? X.MemcpyDtoH(code, trap_at[slot], sizeof *code) : CUDA_SUCCESS;
}

/* Sets up, launches and synchronises; returns the stage reached. A launch
 * in which a guarded site ran (*trap) stopped while running, with no
 * driver error: its context is whole. */
static uint32_t execute(req *q, CUfunction *fp, CUresult *r, uint32_t *trap) {
    CUfunction f;
    void *host = NULL;
    if (!slots[q->slot] || (*r = D.ModuleGetFunction(&f, slots[q->slot], q->entry)))
        return *r = *r ? *r : CUDA_ERROR_NOT_FOUND, HKA_STAGE_SETUP;
    *fp = f;
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
    if ((*r = trap_clear(q->slot)))
        return HKA_STAGE_SETUP;
    if ((*r = launch(q, f)))
        return HKA_STAGE_LAUNCH;
    if ((*r = D.CtxSynchronize(ctx)) || (*r = trap_read(q->slot, trap)))
        return HKA_STAGE_SYNC;
    return *trap ? HKA_STAGE_SYNC : HKA_STAGE_DONE;
}

/* Copies the buffers out when the parent asked for them (to compare) and
 * sends RESULT; a failed copy is reported as such, with no buffers.
 * Returns the stage sent. */
static uint32_t reply(req *q, uint32_t stage, CUresult r, uint32_t trap) {
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
    hku_put_str(&b, r ? hkb_cu_name(&D, r) : "", HKA_MAX_TEXT);
    hku_put_u32(&b, r ? 0 : trap);
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
    return stage;
}

/* Repeats a finished launch on its buffers as they are: warmups times,
 * then runs times between two events on the null stream, and sends TIMED.
 * GPU time from the events, not the host's clock: what the version costs
 * the device, without this process's scheduling in it. */
static void time_runs(req *q, CUfunction f) {
    uint64_t ns[HKA_MAX_RUNS];
    CUevent e0 = NULL, e1 = NULL;
    CUresult r = CUDA_SUCCESS;
    uint32_t stage = HKA_STAGE_DONE, n = 0, trap = 0;
    if (!X.EventCreate)
        r = CUDA_ERROR_NOT_SUPPORTED, stage = HKA_STAGE_SETUP;
    else if ((r = X.EventCreate(&e0, CU_EVENT_DEFAULT)) ||
             (r = X.EventCreate(&e1, CU_EVENT_DEFAULT)))
        stage = HKA_STAGE_SETUP;
    /* The repeats run on the buffers the first launch left: a guarded site
     * they reach is read after each one (outside the timed interval). */
    for (uint32_t i = 0; !r && !trap && i < q->warmups; i++) {
        if ((r = launch(q, f)))
            stage = HKA_STAGE_LAUNCH;
        else if ((r = D.CtxSynchronize(ctx)) || (r = trap_read(q->slot, &trap)) || trap)
            stage = HKA_STAGE_SYNC;
    }
    for (uint32_t i = 0; !r && !trap && i < q->runs; i++) {
        float ms = 0;
        if ((r = X.EventRecord(e0, NULL)) || (r = launch(q, f)))
            stage = HKA_STAGE_LAUNCH;
        else if ((r = X.EventRecord(e1, NULL)) || (r = X.EventSynchronize(e1)) ||
                 (r = trap_read(q->slot, &trap)) || trap)
            stage = HKA_STAGE_SYNC;
        else if ((r = X.EventElapsedTime(&ms, e0, e1)))
            stage = HKA_STAGE_SETUP;
        else
            ns[n++] = ms > 0 ? (uint64_t)llround((double)ms * 1e6) : 0;
    }
    if (e0)
        X.EventDestroy(e0);
    if (e1)
        X.EventDestroy(e1);
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_TIMED);
    int stopped = r || trap;
    hku_put_u32(&b, stopped ? stage : HKA_STAGE_DONE);
    hku_put_u32(&b, (uint32_t)r);
    hku_put_str(&b, r ? hkb_cu_name(&D, r) : "", HKA_MAX_TEXT);
    hku_put_u32(&b, r ? 0 : trap);
    hku_put_u32(&b, stopped ? 0 : n);
    for (uint32_t i = 0; !stopped && i < n; i++)
        hku_put_u64(&b, ns[i]);
    if (hku_send(fd, &b) < 0)
        exit(0);
    hku_buf_free(&b);
}

/* LIMITS {slot, entry}: what the driver says of the entry's function in
 * the slot's image, for the parent to check a test's launch against. */
static void do_limits(hku_rd *rd) {
    char entry[HKA_MAX_TEXT + 1];
    uint32_t slot = hku_get_u32(rd);
    hku_get_str(rd, entry, sizeof entry, sizeof entry - 1);
    if (rd->bad || slot >= HKA_NSLOTS || hku_end(rd))
        exit(2);
    static const CUfunction_attribute attr[5] = {
        CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_FUNC_ATTRIBUTE_NUM_REGS,
        CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES};
    int v[5] = {0};
    CUfunction f;
    CUresult r = slots[slot] ? D.ModuleGetFunction(&f, slots[slot], entry) : CUDA_ERROR_NOT_FOUND;
    for (int i = 0; i < 5 && r == CUDA_SUCCESS; i++)
        r = D.FuncGetAttribute(&v[i], attr[i], f);
    hku_buf b;
    hku_buf_init(&b, HKA_MAGIC, HKA_LIMITS_OF);
    hku_put_u32(&b, (uint32_t)r);
    hku_put_str(&b, r ? hkb_cu_name(&D, r) : "", HKA_MAX_TEXT);
    for (int i = 0; i < 5; i++)
        hku_put_u32(&b, r ? 0 : (uint32_t)v[i]);
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
    CUfunction f = NULL;
    uint32_t trap = 0;
    uint32_t stage = execute(q, &f, &r, &trap);
    stage = reply(q, stage, r, trap);
    if (q->runs && stage == HKA_STAGE_DONE)
        time_runs(q, f);
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
        else if (type == HKA_LIMITS)
            do_limits(&rd);
        else
            return 2;
        free(d);
    }
}

/*
 * Fake CUDA driver (see fakecuda.h). One global state under one mutex; the
 * engine's threads call in concurrently, as they would call the driver.
 * Unloaded images are kept (marked dead) until fake_init, so a late launch is
 * detected instead of touching freed memory.
 */
#include <elf.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ptx/ptx.h"
#include "tests/fakecuda.h"

#define MAXDEV   4
#define MAXFAULT 32

typedef struct fctx {
    int dev;
    unsigned long long id;
} fctx;

typedef struct fimage fimage;

#define FAKE_SMEM_OPTIN 232448 /* sm_90's opt-in shared memory per block */
#define FAKE_SMEM_BASE  49152  /* shared memory a function has without opting in */
#define FAKE_SMS        132    /* multiprocessors (an H200's) */

typedef struct fkern {
    fimage *img;
    int entry;
    int attr_id[8], attr_val[8]; /* attributes set (cache config: id -1) */
    int nattr;
} fkern;

struct fimage {
    int is_module;
    int dead;
    int tag;
    int shared;         /* static shared bytes of every kernel ("// shared: N") */
    unsigned trap_code; /* a trap guard's first store ("[__hotkern_trap], N"); 0: none */
    int regs;           /* registers a thread of every kernel: "// regs: N", or in a trap
                         * guard's copy "// guarded regs: N" where it has one (ptxas
                         * allocates the copy's anew); default 16 */
    int maxthreads;     /* threads a block: 1024 or what 64K registers allow (max_threads) */
    double ms;          /* GPU time of a launch: "// ms: N" (a copy: "// guarded ms: N");
                         * 0: FAKE_LAUNCH_NS, or a FAKE_SLOW control's */
    int runs;           /* launches of its kernels */
    fctx *ctx;          /* modules */
    unsigned long long ctx_id;
    hkp_meta meta;
    fkern *kerns;
    void **gmem; /* per global */
    fimage *next;
};

static int max_threads(const fimage *im);

typedef struct fgraph {
    CUDA_KERNEL_NODE_PARAMS params;
    struct fgraph *next;
} fgraph;

/* A user object: its destructor runs when the graph holding it goes. */
typedef struct fuobj {
    void *ptr;
    CUhostFn destroy;
    struct fuobj *next;
} fuobj;

/* A graph made by stream capture: its kernel nodes and user objects. */
typedef struct fcgraph {
    fkern *nodes[64];
    int nnodes;
    fuobj *objs;
    struct fcgraph *next;
} fcgraph;

typedef struct fstream {
    int capturing;
    CUstreamCaptureMode mode;
    int invalidated;
    fcgraph *graph;
    struct fstream *next;
} fstream;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int ndev, arch;
    int dev_arch[MAXDEV]; /* fake_set_device_arch; 0: arch */
    fctx prim[MAXDEV];
    int active[MAXDEV];
    unsigned long long next_id;
    fimage *images;
    fgraph *graphs;
    int violations, launches;
    int hold_next, held, release;
    struct {
        char entry[48];
        int nth;
        CUresult err;
        int dev;
    } faults[MAXFAULT];
    int nfault;
    struct {
        char entry[48];
        int n;
    } calls[64];
    int ncalls;
    fstream *streams;
    fcgraph *cgraphs;
    int bad_unloads;
    int hold_sync, sync_held;   /* CtxSynchronize blocks while hold_sync */
    int hold_state, state_held; /* DevicePrimaryCtxGetState blocks while hold_state */
    int graph_launch_us;
    /* Kernel controls (fake_kernel_control): a launch of a matching kernel
     * faults, hangs or writes a wrong value. */
    struct {
        char name[64];
        int tag; /* -1: any image */
        int kind;
        CUresult err;
        double ms; /* FAKE_SLOW: how long a launch takes; FAKE_TRAP: how many
                    * launches of the kernel in an image pass before it traps */
    } kctl[16];
    int nkctl;
    /* GPU time (fake_kernel_slow): every launch advances it by its
     * kernel's duration, and an event records it. */
    uint64_t gpu_ns;
    int memcheck_fd;   /* fake_set_memcheck_fd; -1: not under a sanitizer */
    int memcheck_soft; /* a reported kernel goes on instead of faulting */
    CUresult sticky;   /* a kernel faulted: every later call fails with it */
    int hung;          /* a kernel hangs: synchronising never returns */
} F = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .memcheck_fd = -1};

/* The driver's reader-preferring lock (fake_set_launch_model). */
static pthread_rwlock_t drv_rw = PTHREAD_RWLOCK_INITIALIZER;
static _Atomic int launch_us = -1; /* < 0: model off */
static __thread CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static __thread fctx *cur_stack[8];
static __thread int cur_depth;
static __thread fctx *cur_ctx;

static fctx *current(void) {
    return cur_depth ? cur_stack[cur_depth - 1] : cur_ctx;
}

/* A call the driver refuses while another thread captures in global mode,
 * unless the calling thread is relaxed; the refusal invalidates the capture.
 * Lock held. */
static int capture_unsafe(void) {
    if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return 0;
    int hit = 0;
    for (fstream *st = F.streams; st; st = st->next)
        if (st->capturing && st->mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
            st->invalidated = 1;
            hit = 1;
        }
    return hit;
}

static fstream *find_stream(CUstream s) {
    for (fstream *st = F.streams; st; st = st->next)
        if ((CUstream)st == s)
            return st;
    return NULL;
}

/* The model may be switched on or off while a call runs: end releases
 * what begin took, whatever the model says by then. */
static int drv_write_begin(void) {
    int on = atomic_load(&launch_us) >= 0;
    if (on)
        pthread_rwlock_wrlock(&drv_rw);
    return on;
}
static void drv_write_end(int locked) {
    if (locked)
        pthread_rwlock_unlock(&drv_rw);
}

/* Records a call and returns an armed fault for it, if any. Lock held. */
static CUresult enter(const char *entry) {
    int i;
    for (i = 0; i < F.ncalls && strcmp(F.calls[i].entry, entry); i++)
        ;
    if (i == F.ncalls && F.ncalls < 64) {
        snprintf(F.calls[i].entry, sizeof F.calls[i].entry, "%s", entry);
        F.calls[i].n = 0;
        F.ncalls++;
    }
    if (i < 64)
        F.calls[i].n++;
    if (F.sticky != CUDA_SUCCESS)
        return F.sticky; /* as on the device: the context is unusable */
    fctx *c = current();
    for (int f = 0; f < F.nfault; f++) {
        if (strcmp(F.faults[f].entry, entry))
            continue;
        if (F.faults[f].dev >= 0) {
            if (c && c->dev == F.faults[f].dev)
                return F.faults[f].err;
            continue;
        }
        if (--F.faults[f].nth == 0) {
            CUresult e = F.faults[f].err;
            F.faults[f] = F.faults[--F.nfault];
            return e;
        }
    }
    return CUDA_SUCCESS;
}

#define ENTER(name)                                                                                \
    pthread_mutex_lock(&F.lock);                                                                   \
    CUresult fault_ = enter(name);                                                                 \
    if (fault_ != CUDA_SUCCESS) {                                                                  \
        pthread_mutex_unlock(&F.lock);                                                             \
        return fault_;                                                                             \
    }
#define LEAVE(r)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (r);                                                                         \
        pthread_mutex_unlock(&F.lock);                                                             \
        return r_;                                                                                 \
    } while (0)

void fake_fail(const char *entry, int nth, CUresult err) {
    pthread_mutex_lock(&F.lock);
    if (F.nfault < MAXFAULT) {
        snprintf(F.faults[F.nfault].entry, 48, "%s", entry);
        F.faults[F.nfault].nth = nth;
        F.faults[F.nfault].err = err;
        F.faults[F.nfault].dev = -1;
        F.nfault++;
    }
    pthread_mutex_unlock(&F.lock);
}

void fake_fail_on_device(const char *entry, int dev, CUresult err) {
    pthread_mutex_lock(&F.lock);
    if (F.nfault < MAXFAULT) {
        snprintf(F.faults[F.nfault].entry, 48, "%s", entry);
        F.faults[F.nfault].nth = 0;
        F.faults[F.nfault].err = err;
        F.faults[F.nfault].dev = dev;
        F.nfault++;
    }
    pthread_mutex_unlock(&F.lock);
}

void fake_clear_faults(void) {
    pthread_mutex_lock(&F.lock);
    F.nfault = 0;
    pthread_mutex_unlock(&F.lock);
}

int fake_calls(const char *entry) {
    int n = 0;
    pthread_mutex_lock(&F.lock);
    for (int i = 0; i < F.ncalls; i++)
        if (!strcmp(F.calls[i].entry, entry))
            n = F.calls[i].n;
    pthread_mutex_unlock(&F.lock);
    return n;
}

void fake_init(int ndev, int arch) {
    pthread_mutex_lock(&F.lock);
    while (F.images) {
        fimage *im = F.images;
        F.images = im->next;
        for (int g = 0; g < im->meta.nglobals; g++)
            free(im->gmem[g]);
        free(im->gmem);
        free(im->kerns);
        hkp_meta_free(&im->meta);
        free(im);
    }
    while (F.graphs) {
        fgraph *g = F.graphs;
        F.graphs = g->next;
        free(g);
    }
    while (F.streams) {
        fstream *st = F.streams;
        F.streams = st->next;
        free(st);
    }
    while (F.cgraphs) {
        fcgraph *g = F.cgraphs;
        F.cgraphs = g->next;
        while (g->objs) {
            fuobj *o = g->objs;
            g->objs = o->next;
            free(o);
        }
        free(g);
    }
    F.bad_unloads = 0;
    F.hold_sync = F.sync_held = 0;
    F.hold_state = F.state_held = 0;
    F.graph_launch_us = 0;
    atomic_store(&launch_us, -1);
    F.ndev = ndev;
    F.arch = arch;
    memset(F.dev_arch, 0, sizeof F.dev_arch);
    for (int i = 0; i < MAXDEV; i++) {
        F.prim[i].dev = i;
        F.prim[i].id = ++F.next_id;
        F.active[i] = 0;
    }
    F.violations = F.launches = 0;
    F.nkctl = 0;
    F.gpu_ns = 0;
    F.sticky = CUDA_SUCCESS;
    F.hung = 0;
    pthread_cond_broadcast(&F.cond);
    F.hold_next = F.held = F.release = 0;
    F.nfault = 0;
    F.ncalls = 0;
    pthread_mutex_unlock(&F.lock);
    cur_ctx = NULL;
    cur_depth = 0;
}

int fake_live_images(void) {
    int n = 0;
    pthread_mutex_lock(&F.lock);
    for (fimage *im = F.images; im; im = im->next)
        n += !im->dead;
    pthread_mutex_unlock(&F.lock);
    return n;
}

int fake_violations(void) {
    pthread_mutex_lock(&F.lock);
    int n = F.violations;
    pthread_mutex_unlock(&F.lock);
    return n;
}

int fake_launches(void) {
    pthread_mutex_lock(&F.lock);
    int n = F.launches;
    pthread_mutex_unlock(&F.lock);
    return n;
}

void fake_hold_next_launch(void) {
    pthread_mutex_lock(&F.lock);
    F.hold_next = 1;
    F.held = 0;
    F.release = 0;
    pthread_mutex_unlock(&F.lock);
}

void fake_wait_held(void) {
    pthread_mutex_lock(&F.lock);
    while (!F.held)
        pthread_cond_wait(&F.cond, &F.lock);
    pthread_mutex_unlock(&F.lock);
}

void fake_release_launch(void) {
    pthread_mutex_lock(&F.lock);
    F.release = 1;
    pthread_cond_broadcast(&F.cond);
    pthread_mutex_unlock(&F.lock);
}

void fake_reset_device(int dev) {
    pthread_mutex_lock(&F.lock);
    F.prim[dev].id = ++F.next_id;
    for (fimage *im = F.images; im; im = im->next)
        if (im->is_module && im->ctx && im->ctx->dev == dev)
            im->dead = 1; /* modules die with their context */
    pthread_mutex_unlock(&F.lock);
}

/* ---- entry points ------------------------------------------------------ */

static CUresult f_Init(unsigned flags) {
    ENTER("cuInit");
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_DriverGetVersion(int *v) {
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}
#define FAKE_NAME(e)                                                                               \
    { e, #e }
static const struct {
    CUresult r;
    const char *name;
} cu_names[] = {
    FAKE_NAME(CUDA_ERROR_INVALID_PTX),
    FAKE_NAME(CUDA_ERROR_OUT_OF_MEMORY),
    FAKE_NAME(CUDA_ERROR_NOT_FOUND),
    FAKE_NAME(CUDA_ERROR_INVALID_HANDLE),
    FAKE_NAME(CUDA_ERROR_INVALID_VALUE),
    FAKE_NAME(CUDA_ERROR_LAUNCH_FAILED),
    FAKE_NAME(CUDA_ERROR_NO_BINARY_FOR_GPU),
    FAKE_NAME(CUDA_ERROR_INVALID_CONTEXT),
    FAKE_NAME(CUDA_ERROR_ILLEGAL_ADDRESS),
    FAKE_NAME(CUDA_ERROR_ASSERT),
    FAKE_NAME(CUDA_ERROR_ILLEGAL_INSTRUCTION),
    FAKE_NAME(CUDA_ERROR_MISALIGNED_ADDRESS),
    FAKE_NAME(CUDA_ERROR_INVALID_PC),
    FAKE_NAME(CUDA_ERROR_HARDWARE_STACK_ERROR),
    FAKE_NAME(CUDA_ERROR_LAUNCH_TIMEOUT),
    FAKE_NAME(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
    FAKE_NAME(CUDA_ERROR_INVALID_IMAGE),
    FAKE_NAME(CUDA_ERROR_INVALID_DEVICE),
    FAKE_NAME(CUDA_ERROR_UNSUPPORTED_PTX_VERSION),
};
#undef FAKE_NAME

const char *fake_cu_name(CUresult r) {
    for (size_t i = 0; i < sizeof cu_names / sizeof cu_names[0]; i++)
        if (cu_names[i].r == r)
            return cu_names[i].name;
    return NULL;
}

int fake_cu_parse(const char *name, CUresult *r) {
    for (size_t i = 0; i < sizeof cu_names / sizeof cu_names[0]; i++)
        if (!strcmp(cu_names[i].name, name)) {
            *r = cu_names[i].r;
            return 0;
        }
    char *end;
    long v = strtol(name, &end, 10);
    if (end == name || *end || v <= 0)
        return -1;
    *r = (CUresult)v;
    return 0;
}

static CUresult f_GetErrorName(CUresult r, const char **s) {
    const char *n = fake_cu_name(r);
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *s = n;
    return CUDA_SUCCESS;
}
static CUresult f_DeviceGet(CUdevice *d, int ordinal) {
    ENTER("cuDeviceGet");
    if (ordinal < 0 || ordinal >= F.ndev)
        LEAVE(CUDA_ERROR_INVALID_DEVICE);
    *d = ordinal;
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_DeviceGetCount(int *n) {
    *n = F.ndev;
    return CUDA_SUCCESS;
}
/* Device d's UUID: bytes 0xfa, 0x4e, then d, then 13 bytes of d * 17 + i. */
static CUresult f_DeviceGetUuid(CUuuid *u, CUdevice d) {
    if (d < 0 || d >= F.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    unsigned char *b = (unsigned char *)u->bytes;
    b[0] = 0xfa;
    b[1] = 0x4e;
    b[2] = (unsigned char)d;
    for (int i = 3; i < 16; i++)
        b[i] = (unsigned char)(d * 17 + i);
    return CUDA_SUCCESS;
}
void fake_set_device_arch(int dev, int arch) {
    if (dev >= 0 && dev < MAXDEV)
        F.dev_arch[dev] = arch;
}
static CUresult f_DeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    int arch = d >= 0 && d < MAXDEV && F.dev_arch[d] ? F.dev_arch[d] : F.arch;
    *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR            ? arch / 10
         : a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR          ? arch % 10
         : a == CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN ? FAKE_SMEM_OPTIN
         : a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT              ? FAKE_SMS
                                                                      : 0;
    return CUDA_SUCCESS;
}
static CUresult f_DeviceGetName(char *name, int len, CUdevice d) {
    snprintf(name, (size_t)len, "fake device %d", d);
    return CUDA_SUCCESS;
}
static CUresult f_DevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    ENTER("cuDevicePrimaryCtxRetain");
    F.active[d] = 1;
    *c = (CUcontext)&F.prim[d];
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_DevicePrimaryCtxRelease(CUdevice d) {
    return CUDA_SUCCESS;
}
static CUresult f_DevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active) {
    pthread_mutex_lock(&F.lock);
    F.state_held += F.hold_state;
    pthread_cond_broadcast(&F.cond);
    while (F.hold_state)
        pthread_cond_wait(&F.cond, &F.lock);
    pthread_mutex_unlock(&F.lock);
    *flags = 0;
    *active = F.active[d];
    return CUDA_SUCCESS;
}
static CUresult f_CtxGetCurrent(CUcontext *c) {
    *c = (CUcontext)current();
    return CUDA_SUCCESS;
}
CUcontext fake_ctx_create(int dev) {
    fctx *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_lock(&F.lock);
    c->dev = dev;
    c->id = ++F.next_id;
    pthread_mutex_unlock(&F.lock);
    return (CUcontext)c;
}
static CUresult f_CtxSetCurrent(CUcontext c) {
    cur_ctx = (fctx *)c;
    return CUDA_SUCCESS;
}
static CUresult f_CtxPushCurrent(CUcontext c) {
    ENTER("cuCtxPushCurrent");
    if (cur_depth == 8)
        LEAVE(CUDA_ERROR_INVALID_VALUE);
    cur_stack[cur_depth++] = (fctx *)c;
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_CtxPopCurrent(CUcontext *c) {
    if (!cur_depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    *c = (CUcontext)cur_stack[--cur_depth];
    return CUDA_SUCCESS;
}
static CUresult f_CtxGetDevice(CUdevice *d, CUcontext ctx) {
    fctx *c = ctx ? (fctx *)ctx : current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = c->dev;
    return CUDA_SUCCESS;
}
static CUresult f_CtxGetId(CUcontext c, unsigned long long *id) {
    pthread_mutex_lock(&F.lock); /* fake_reset_device renews ids under it */
    *id = ((fctx *)c)->id;
    pthread_mutex_unlock(&F.lock);
    return CUDA_SUCCESS;
}
static CUresult f_CtxSynchronize(CUcontext ctx) {
    ENTER("cuCtxSynchronize");
    if (capture_unsafe())
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    F.sync_held += F.hold_sync;
    pthread_cond_broadcast(&F.cond);
    while (F.hold_sync || F.hung)
        pthread_cond_wait(&F.cond, &F.lock);
    LEAVE(F.sticky);
}

/* The format and size of an image handed over without its size, as the
 * driver sees it: a cubin's size from its ELF header, a fatbin's from its
 * header, PTX up to its NUL. 0 when it is none of them. */
static hk_format image_format(const void *image, size_t *size) {
    const unsigned char *b = image;
    if (!memcmp(b, ELFMAG, SELFMAG) && b[EI_CLASS] == ELFCLASS64) {
        /* The furthest of the header tables and the sections' contents. */
        Elf64_Ehdr eh;
        memcpy(&eh, b, sizeof eh);
        size_t end = (size_t)eh.e_shoff + (size_t)eh.e_shnum * eh.e_shentsize;
        size_t ph = (size_t)eh.e_phoff + (size_t)eh.e_phnum * eh.e_phentsize;
        end = ph > end ? ph : end;
        for (int i = 0; i < eh.e_shnum; i++) {
            Elf64_Shdr sh;
            memcpy(&sh, b + eh.e_shoff + (size_t)i * eh.e_shentsize, sizeof sh);
            if (sh.sh_type != SHT_NOBITS && sh.sh_offset + sh.sh_size > end)
                end = sh.sh_offset + sh.sh_size;
        }
        *size = end;
        return HK_FORMAT_CUBIN;
    }
    uint32_t magic;
    memcpy(&magic, b, sizeof magic);
    if (magic == HKP_FATBIN_MAGIC) {
        uint16_t hsize;
        uint64_t fsize;
        memcpy(&hsize, b + 6, sizeof hsize);
        memcpy(&fsize, b + 8, sizeof fsize);
        *size = (size_t)hsize + (size_t)fsize;
        return HK_FORMAT_FATBIN;
    }
    *size = strlen(image);
    return HK_FORMAT_PTX;
}

/* Parses an image into a new fimage. Lock held. */
static CUresult load_image(const void *image, int is_module, unsigned n, CUjit_option *o, void **v,
                           fimage **out) {
    const char *text = image;
    char *errbuf = NULL;
    size_t errsize = 0;
    for (unsigned i = 0; i < n; i++) {
        if (o[i] == CU_JIT_ERROR_LOG_BUFFER)
            errbuf = v[i];
        if (o[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
            errsize = (size_t)(uintptr_t)v[i];
    }
    size_t size;
    hk_format fmt = image_format(image, &size);
    const char *bad = fmt == HK_FORMAT_PTX ? strstr(text, "SYNTAX ERROR") : NULL;
    if (bad) {
        int line = 1;
        for (const char *p = text; p < bad; p++)
            line += *p == '\n';
        if (errbuf && errsize)
            snprintf(errbuf, errsize,
                     "ptxas application ptx input, line %d; fatal   : Parsing "
                     "error near 'SYNTAX': syntax error",
                     line);
        return CUDA_ERROR_INVALID_PTX;
    }
    fimage *im = calloc(1, sizeof *im);
    char why[256];
    if (!im || !fmt || hkp_meta_read(image, size, fmt, &im->meta, why, sizeof why)) {
        if (errbuf && errsize)
            snprintf(errbuf, errsize, "fake driver cannot read image: %s", im ? why : "nomem");
        free(im);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    const char *t = fmt == HK_FORMAT_PTX ? strstr(text, "tag:") : NULL;
    im->tag = t ? atoi(t + 4) : 0;
    const char *sh = fmt == HK_FORMAT_PTX ? strstr(text, "shared:") : NULL;
    im->shared = sh ? atoi(sh + 7) : 0;
    const char *tg = fmt == HK_FORMAT_PTX ? strstr(text, "[" HKP_GUARD_SYMBOL "], ") : NULL;
    im->trap_code = tg ? (unsigned)strtoul(tg + strlen("[" HKP_GUARD_SYMBOL "], "), NULL, 10) : 0;
    const char *rg = fmt == HK_FORMAT_PTX ? strstr(text, "// regs: ") : NULL;
    const char *grg =
        fmt == HK_FORMAT_PTX && im->trap_code ? strstr(text, "// guarded regs: ") : NULL;
    im->regs = grg ? atoi(grg + 17) : rg ? atoi(rg + 9) : 0;
    if (im->regs <= 0)
        im->regs = 16;
    im->maxthreads = max_threads(im);
    const char *ms = fmt == HK_FORMAT_PTX ? strstr(text, "// ms: ") : NULL;
    const char *gms =
        fmt == HK_FORMAT_PTX && im->trap_code ? strstr(text, "// guarded ms: ") : NULL;
    im->ms = gms ? atof(gms + 15) : ms ? atof(ms + 7) : 0;
    im->is_module = is_module;
    im->kerns = calloc((size_t)im->meta.nentries + 1, sizeof *im->kerns);
    im->gmem = calloc((size_t)im->meta.nglobals + 1, sizeof *im->gmem);
    for (int k = 0; k < im->meta.nentries; k++)
        im->kerns[k] = (fkern){.img = im, .entry = k};
    for (int g = 0; g < im->meta.nglobals; g++)
        im->gmem[g] = calloc(1, im->meta.globals[g].size + 1);
    im->ctx = current();
    im->next = F.images;
    F.images = im;
    *out = im;
    return CUDA_SUCCESS;
}

static CUresult module_load(CUmodule *m, const void *image, unsigned n, CUjit_option *o, void **v) {
    ENTER("cuModuleLoadDataEx");
    if (!current())
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    fimage *im;
    CUresult r = load_image(image, 1, n, o, v, &im);
    if (r == CUDA_SUCCESS)
        *m = (CUmodule)im;
    LEAVE(r);
}
static CUresult f_ModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *o,
                                   void **v) {
    int locked = drv_write_begin();
    CUresult r = module_load(m, image, n, o, v);
    drv_write_end(locked);
    return r;
}
static CUresult library_load(CUlibrary *l, const void *code, unsigned n, CUjit_option *o,
                             void **v) {
    ENTER("cuLibraryLoadData");
    fimage *im;
    CUresult r = load_image(code, 0, n, o, v, &im);
    if (r == CUDA_SUCCESS)
        *l = (CUlibrary)im;
    LEAVE(r);
}
static CUresult f_LibraryLoadData(CUlibrary *l, const void *code, CUjit_option *o, void **v,
                                  unsigned n, CUlibraryOption *lo, void **lv, unsigned ln) {
    int locked = drv_write_begin();
    CUresult r = library_load(l, code, n, o, v);
    drv_write_end(locked);
    return r;
}
/* Lock held. */
static CUresult unload(fimage *im) {
    if (capture_unsafe())
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!im || im->dead) {
        F.bad_unloads++;
        return CUDA_ERROR_INVALID_HANDLE;
    }
    im->dead = 1;
    return CUDA_SUCCESS;
}
static CUresult module_unload(CUmodule m) {
    ENTER("cuModuleUnload");
    LEAVE(unload((fimage *)m));
}
static _Atomic int unload_us; /* fake_set_unload_us */

static void unload_delay(void) {
    int us = atomic_load(&unload_us);
    if (us > 0)
        usleep((useconds_t)us);
}

static CUresult f_ModuleUnload(CUmodule m) {
    int locked = drv_write_begin();
    unload_delay();
    CUresult r = module_unload(m);
    drv_write_end(locked);
    return r;
}
static CUresult library_unload(CUlibrary l) {
    ENTER("cuLibraryUnload");
    LEAVE(unload((fimage *)l));
}
static CUresult f_LibraryUnload(CUlibrary l) {
    int locked = drv_write_begin();
    unload_delay();
    CUresult r = library_unload(l);
    drv_write_end(locked);
    return r;
}
static int find_entry(fimage *im, const char *name) {
    for (int k = 0; k < im->meta.nentries; k++)
        if (!strcmp(im->meta.entries[k].name, name))
            return k;
    return -1;
}
static CUresult f_ModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    ENTER("cuModuleGetFunction");
    fimage *im = (fimage *)m;
    if (im->dead)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    int k = find_entry(im, name);
    if (k < 0)
        LEAVE(CUDA_ERROR_NOT_FOUND);
    *f = (CUfunction)&im->kerns[k];
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_LibraryGetKernel(CUkernel *kk, CUlibrary l, const char *name) {
    ENTER("cuLibraryGetKernel");
    fimage *im = (fimage *)l;
    int k = find_entry(im, name);
    if (k < 0)
        LEAVE(CUDA_ERROR_NOT_FOUND);
    *kk = (CUkernel)&im->kerns[k];
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_ModuleGetFunctionCount(unsigned *n, CUmodule m) {
    *n = (unsigned)((fimage *)m)->meta.nentries;
    return CUDA_SUCCESS;
}
static CUresult f_LibraryGetKernelCount(unsigned *n, CUlibrary l) {
    *n = (unsigned)((fimage *)l)->meta.nentries;
    return CUDA_SUCCESS;
}
static CUresult f_ModuleEnumerateFunctions(CUfunction *fs, unsigned n, CUmodule m) {
    fimage *im = (fimage *)m;
    for (unsigned i = 0; i < n && (int)i < im->meta.nentries; i++)
        fs[i] = (CUfunction)&im->kerns[i];
    return CUDA_SUCCESS;
}
static CUresult f_LibraryEnumerateKernels(CUkernel *ks, unsigned n, CUlibrary l) {
    fimage *im = (fimage *)l;
    for (unsigned i = 0; i < n && (int)i < im->meta.nentries; i++)
        ks[i] = (CUkernel)&im->kerns[i];
    return CUDA_SUCCESS;
}
static CUresult get_global(fimage *im, const char *name, CUdeviceptr *p, size_t *s) {
    for (int g = 0; g < im->meta.nglobals; g++)
        if (!strcmp(im->meta.globals[g].name, name)) {
            *p = (CUdeviceptr)(uintptr_t)im->gmem[g];
            *s = im->meta.globals[g].size;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}
static CUresult f_ModuleGetGlobal(CUdeviceptr *p, size_t *s, CUmodule m, const char *name) {
    ENTER("cuModuleGetGlobal");
    LEAVE(get_global((fimage *)m, name, p, s));
}
static CUresult f_LibraryGetGlobal(CUdeviceptr *p, size_t *s, CUlibrary l, const char *name) {
    ENTER("cuLibraryGetGlobal");
    LEAVE(get_global((fimage *)l, name, p, s));
}
static CUresult kernel_get_function(CUfunction *f, CUkernel k) {
    ENTER("cuKernelGetFunction");
    if (!current())
        LEAVE(CUDA_ERROR_INVALID_CONTEXT);
    *f = (CUfunction)k;
    LEAVE(CUDA_SUCCESS);
}
static CUresult param_info(fkern *fk, size_t i, size_t *off, size_t *size) {
    hkp_entry *e = &fk->img->meta.entries[fk->entry];
    if ((int)i >= e->nparams)
        return CUDA_ERROR_INVALID_VALUE;
    *off = e->params[i].offset;
    *size = e->params[i].size;
    return CUDA_SUCCESS;
}
/* 1 when k is one of the fake's kernels (a real driver refuses a handle it
 * did not give: an nvcc program's CUDA runtime without a driver passes its
 * host stub's address). F.lock held. */
static int known_kernel(const fkern *k) {
    for (fimage *im = F.images; im; im = im->next)
        if (im->kerns && k >= im->kerns && k < im->kerns + im->meta.nentries)
            return 1;
    return 0;
}
static CUresult f_KernelGetParamInfo(CUkernel k, size_t i, size_t *off, size_t *size) {
    ENTER("cuKernelGetParamInfo");
    if (!known_kernel((fkern *)k))
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    LEAVE(param_info((fkern *)k, i, off, size));
}
static CUresult f_KernelGetName(const char **name, CUkernel k) {
    ENTER("cuKernelGetName");
    fkern *fk = (fkern *)k;
    if (!known_kernel(fk))
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    *name = fk->img->meta.entries[fk->entry].name;
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_KernelGetLibrary(CUlibrary *l, CUkernel k) {
    ENTER("cuKernelGetLibrary");
    fkern *fk = (fkern *)k;
    *l = (CUlibrary)fk->img;
    LEAVE(fk->img->is_module ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS);
}
static CUresult f_FuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size) {
    ENTER("cuFuncGetParamInfo");
    LEAVE(param_info((fkern *)f, i, off, size));
}
static CUresult f_KernelGetFunction(CUfunction *f, CUkernel k) {
    int locked = drv_write_begin();
    CUresult r = kernel_get_function(f, k);
    drv_write_end(locked);
    return r;
}
static CUresult func_load(CUfunction f) {
    ENTER("cuFuncLoad");
    LEAVE(((fkern *)f)->img->dead ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS);
}
static CUresult f_FuncLoad(CUfunction f) {
    int locked = drv_write_begin();
    CUresult r = func_load(f);
    drv_write_end(locked);
    return r;
}

enum { KCTL_NONE, KCTL_FAULT, KCTL_HANG, KCTL_WRONG, KCTL_SLOW, KCTL_OOB, KCTL_TRAP };
static CUresult kctl_err; /* lock: the error of the last FAULT match */
static double kctl_ms;    /* lock: the duration of the last SLOW match */

#define FAKE_LAUNCH_NS 10000 /* a launch without a SLOW control: 10 us */

/* The control matching kernel `name` of an image tagged `tag`. Lock held. */
static int kernel_control(const char *name, int tag) {
    for (int i = 0; i < F.nkctl; i++)
        if (!strcmp(F.kctl[i].name, name) && (F.kctl[i].tag < 0 || F.kctl[i].tag == tag)) {
            kctl_err = F.kctl[i].err;
            kctl_ms = F.kctl[i].ms;
            return F.kctl[i].kind;
        }
    return KCTL_NONE;
}

/* What memcheck would say of a write 4 KiB past a buffer: the report's
 * lines as compute-sanitizer prints them, without its prefix (the fake
 * sanitizer, tests/stub/fake_sanitizer.c, adds it). */
static void memcheck_report(const char *kernel) {
    dprintf(F.memcheck_fd,
            "Invalid __global__ write of size 4 bytes\n"
            "    at %s+0x70\n"
            "    by thread (0,0,0) in block (0,0,0)\n"
            "    Address 0x7f0000101000 is out of bounds\n"
            "    and is 4,097 bytes after the nearest allocation at 0x7f0000000000 of size "
            "1,048,576 bytes\n",
            kernel);
}

/* Runs a fake kernel. Lock held. */
static CUresult run(fkern *fk, void **args) {
    fimage *im = fk->img;
    F.launches++;
    if (im->dead) {
        F.violations++;
        return CUDA_ERROR_INVALID_HANDLE;
    }
    hkp_entry *e = &im->meta.entries[fk->entry];
    int kind = kernel_control(e->name, im->tag);
    if (kind == KCTL_TRAP && im->runs++ < (int)kctl_ms)
        kind = KCTL_NONE; /* not yet */
    F.gpu_ns += kind == KCTL_SLOW ? (uint64_t)(kctl_ms * 1e6)
                : im->ms > 0      ? (uint64_t)(im->ms * 1e6)
                                  : FAKE_LAUNCH_NS;
    if (kind == KCTL_OOB && F.memcheck_fd >= 0) {
        /* Caught by instrumentation: the kernel ends, the context with it. */
        memcheck_report(e->name);
        if (!F.memcheck_soft) {
            F.sticky = CUDA_ERROR_LAUNCH_FAILED;
            return CUDA_SUCCESS;
        }
    }
    if (kind == KCTL_HANG) {
        F.hung = 1; /* the launch is queued; it never ends */
        return CUDA_SUCCESS;
    }
    CUdeviceptr tp;
    size_t ts;
    if (kind == KCTL_TRAP && im->trap_code &&
        get_global(im, HKP_GUARD_SYMBOL, &tp, &ts) == CUDA_SUCCESS && ts == 4) {
        /* The guard's store ran instead of the trap: the kernel ends well. */
        *(uint32_t *)(uintptr_t)tp = im->trap_code;
        return CUDA_SUCCESS;
    }
    if (kind == KCTL_TRAP) {
        F.sticky = CUDA_ERROR_LAUNCH_FAILED; /* a real trap: the context ends */
        return CUDA_SUCCESS;
    }
    if (kind == KCTL_FAULT) {
        /* Asynchronous, as on the device: the launch is accepted and the
         * fault reaches the next call, and every one after it. */
        F.sticky = kctl_err;
        return CUDA_SUCCESS;
    }
    if (args && e->nparams > 0 && e->params[0].size == 8 && args[0]) {
        int *outp = *(int **)args[0];
        if (outp)
            *outp = kind == KCTL_WRONG ? ~im->tag : im->tag;
    }
    CUdeviceptr p;
    size_t s;
    if (get_global(im, "counter", &p, &s) == CUDA_SUCCESS && s == 4)
        (*(int *)(uintptr_t)p)++;
    return CUDA_SUCCESS;
}

static void spin_us(int us) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000 < us);
}

/* A launch's configuration, for the checks the driver makes. */
typedef struct fcfg {
    uint64_t blocks, threads;
    unsigned shm;
    int coop;
    unsigned cluster; /* blocks a cluster; 0: none */
} fcfg;

static CUresult launch_kernel(CUfunction f, CUstream s, void **args, const fcfg *c);
static __thread int launch_coop; /* set by cuLaunchKernelEx for the launch it makes */
static __thread unsigned launch_cluster;

static CUresult f_LaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **args,
                               void **extra) {
    fcfg c = {(uint64_t)gx * gy * gz, (uint64_t)bx * by * bz, shm, launch_coop, launch_cluster};
    launch_coop = 0;
    launch_cluster = 0;
    int us = atomic_load(&launch_us);
    if (us < 0)
        return launch_kernel(f, s, args, &c);
    /* The driver holds its lock for reading while it launches. */
    pthread_rwlock_rdlock(&drv_rw);
    spin_us(us);
    CUresult r = launch_kernel(f, s, args, &c);
    pthread_rwlock_unlock(&drv_rw);
    return r;
}

static CUresult get_attr(fkern *fk, int id, int *val);

/* Blocks of `threads` threads one multiprocessor holds at once: 2048
 * threads, 64K registers, 32 blocks. Lock held. */
static int blocks_per_sm(const fimage *im, uint64_t threads) {
    if (!threads || threads > (uint64_t)im->maxthreads)
        return 0;
    uint64_t warps = (threads + 31) / 32, by_regs = 65536 / ((uint64_t)im->regs * warps * 32);
    uint64_t n = 2048 / (warps * 32);
    n = by_regs < n ? by_regs : n;
    return (int)(n > 32 ? 32 : n);
}

/* The driver's checks of a launch's configuration: a block larger than the
 * function's limit for its registers, more dynamic shared memory than its
 * attribute allows, a cooperative grid that cannot be co-resident. Lock
 * held. */
static CUresult launch_check(fkern *fk, const fcfg *c) {
    if (c->threads > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (c->threads > (uint64_t)fk->img->maxthreads)
        return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    int maxdyn = 0;
    get_attr(fk, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &maxdyn);
    if (c->shm > (unsigned)maxdyn)
        return CUDA_ERROR_INVALID_VALUE;
    if (c->coop && c->blocks > (uint64_t)blocks_per_sm(fk->img, c->threads) * FAKE_SMS)
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    if (c->cluster > 8)
        return CUDA_ERROR_INVALID_CLUSTER_SIZE;
    return CUDA_SUCCESS;
}

static CUresult launch_kernel(CUfunction f, CUstream s, void **args, const fcfg *c) {
    ENTER("cuLaunchKernel");
    fkern *fk = (fkern *)f;
    if (fk->img->is_module && fk->img->dead)
        /* A module of a context that was reset: the driver says so. */
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    CUresult bad = launch_check(fk, c);
    if (bad != CUDA_SUCCESS)
        LEAVE(bad);
    fstream *st = find_stream(s);
    if (st && st->capturing) {
        /* Captured: recorded in the graph, run when the graph is launched. */
        if (st->graph->nnodes < 64)
            st->graph->nodes[st->graph->nnodes++] = fk;
        LEAVE(CUDA_SUCCESS);
    }
    if (F.hold_next) {
        F.hold_next = 0;
        F.held = 1;
        pthread_cond_broadcast(&F.cond);
        while (!F.release)
            pthread_cond_wait(&F.cond, &F.lock);
    }
    LEAVE(run(fk, args));
}
static CUresult f_MemGetInfo(size_t *fr, size_t *total) {
    *fr = 1u << 30;
    *total = 2u << 30;
    return CUDA_SUCCESS;
}
static CUresult f_StreamSynchronize(CUstream s) {
    ENTER("cuStreamSynchronize");
    if (!s && capture_unsafe())
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    while (F.hung)
        pthread_cond_wait(&F.cond, &F.lock);
    LEAVE(F.sticky);
}
static CUresult f_MemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    ENTER("cuMemcpyDtoDAsync");
    if (!st && capture_unsafe())
        LEAVE(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_StreamIsCapturing(CUstream s, CUstreamCaptureStatus *st) {
    pthread_mutex_lock(&F.lock);
    fstream *fs = find_stream(s);
    *st = fs && fs->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_unlock(&F.lock);
    return CUDA_SUCCESS;
}
static CUresult f_StreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id,
                                       CUgraph *graph, const CUgraphNode **deps,
                                       const CUgraphEdgeData **edges, size_t *ndeps) {
    ENTER("cuStreamGetCaptureInfo");
    fstream *fs = find_stream(s);
    *st = fs && fs->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    if (graph)
        *graph = fs && fs->capturing ? (CUgraph)fs->graph : NULL;
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_ThreadExchangeStreamCaptureMode(CUstreamCaptureMode *m) {
    CUstreamCaptureMode old = thread_mode;
    thread_mode = *m;
    *m = old;
    return CUDA_SUCCESS;
}
static CUresult f_UserObjectCreate(CUuserObject *o, void *ptr, CUhostFn destroy, unsigned n,
                                   unsigned flags) {
    ENTER("cuUserObjectCreate");
    fuobj *u = calloc(1, sizeof *u);
    if (!u)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    u->ptr = ptr;
    u->destroy = destroy;
    *o = (CUuserObject)u;
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_GraphRetainUserObject(CUgraph g, CUuserObject o, unsigned n, unsigned flags) {
    ENTER("cuGraphRetainUserObject");
    fcgraph *cg = (fcgraph *)g;
    fuobj *u = (fuobj *)o;
    u->next = cg->objs;
    cg->objs = u;
    LEAVE(CUDA_SUCCESS);
}

static CUresult f_MemAlloc(CUdeviceptr *p, size_t n) {
    void *m = calloc(1, n);
    *p = (CUdeviceptr)(uintptr_t)m;
    return m ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_StreamCreate(CUstream *s, unsigned flags) {
    fstream *st = calloc(1, sizeof *st);
    if (!st)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&F.lock);
    st->next = F.streams;
    F.streams = st;
    pthread_mutex_unlock(&F.lock);
    *s = (CUstream)st;
    return CUDA_SUCCESS;
}
static CUresult f_StreamDestroy(CUstream s) {
    return CUDA_SUCCESS;
}
static CUresult f_ModuleLoadData(CUmodule *m, const void *image) {
    return f_ModuleLoadDataEx(m, image, 0, NULL, NULL);
}

void fake_graph_create(CUfunction f, void **kernel_args, CUgraphExec *exec, CUgraphNode *node) {
    fgraph *g = calloc(1, sizeof *g);
    g->params.func = f;
    g->params.gridDimX = g->params.gridDimY = g->params.gridDimZ = 1;
    g->params.blockDimX = g->params.blockDimY = g->params.blockDimZ = 1;
    g->params.kernelParams = kernel_args;
    pthread_mutex_lock(&F.lock);
    g->next = F.graphs;
    F.graphs = g;
    pthread_mutex_unlock(&F.lock);
    *exec = (CUgraphExec)g;
    *node = (CUgraphNode)g;
}

CUfunction fake_graph_func(CUgraphExec exec) {
    pthread_mutex_lock(&F.lock);
    CUfunction f = ((fgraph *)exec)->params.func;
    pthread_mutex_unlock(&F.lock);
    return f;
}

int fake_tag_of(void *fn) {
    if (!fn)
        return -1;
    pthread_mutex_lock(&F.lock);
    int t = ((fkern *)fn)->img->tag;
    pthread_mutex_unlock(&F.lock);
    return t;
}

static CUresult f_GraphKernelNodeGetParams(CUgraphNode n, CUDA_KERNEL_NODE_PARAMS *p) {
    ENTER("cuGraphKernelNodeGetParams");
    *p = ((fgraph *)n)->params;
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_GraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode n,
                                               const CUDA_KERNEL_NODE_PARAMS *p) {
    ENTER("cuGraphExecKernelNodeSetParams");
    ((fgraph *)e)->params = *p;
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_GraphLaunch(CUgraphExec e, CUstream s) {
    int us = F.graph_launch_us; /* set before the test's threads start */
    if (us > 0)
        spin_us(us);
    ENTER("cuGraphLaunch");
    fgraph *g = (fgraph *)e;
    LEAVE(run((fkern *)g->params.func, g->params.kernelParams));
}

/* Attributes: recorded per kernel; a dynamic shared size that does not fit
 * beside the kernel's static shared memory is refused, as on the device.
 * Lock held. */
static CUresult set_attr(fkern *fk, int id, int val) {
    if (fk->img->dead)
        return CUDA_ERROR_INVALID_HANDLE;
    if (id == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES &&
        val + fk->img->shared > FAKE_SMEM_OPTIN)
        return CUDA_ERROR_INVALID_VALUE;
    int i;
    for (i = 0; i < fk->nattr && fk->attr_id[i] != id; i++)
        ;
    if (i == 8)
        return CUDA_ERROR_INVALID_VALUE;
    fk->attr_id[i] = id;
    fk->attr_val[i] = val;
    fk->nattr += i == fk->nattr;
    return CUDA_SUCCESS;
}
/* The most threads a block of an image's kernels holds: a block's registers
 * come from 64 K a multiprocessor, per warp of 32 threads in units of 8 a
 * thread (72 registers: 896 threads; 56: 1024), and never more than 1024. */
static int max_threads(const fimage *im) {
    int regs = im->regs > 0 ? (im->regs + 7) / 8 * 8 : 32;
    int warps = 65536 / (regs * 32);
    return warps * 32 < 1024 ? warps * 32 : 1024;
}

static CUresult get_attr(fkern *fk, int id, int *val) {
    *val = 0;
    if (id == CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        *val = fk->img->shared;
    if (id == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        *val = fk->img->maxthreads;
    if (id == CU_FUNC_ATTRIBUTE_NUM_REGS)
        *val = fk->img->regs;
    if (id == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
        *val = fk->img->shared < FAKE_SMEM_BASE ? FAKE_SMEM_BASE - fk->img->shared : 0;
    for (int i = 0; i < fk->nattr; i++)
        if (fk->attr_id[i] == id)
            *val = fk->attr_val[i];
    return CUDA_SUCCESS;
}
static CUresult f_KernelSetAttribute(CUfunction_attribute a, int v, CUkernel k, CUdevice d) {
    ENTER("cuKernelSetAttribute");
    LEAVE(set_attr((fkern *)k, (int)a, v));
}
static CUresult f_KernelGetAttribute(int *v, CUfunction_attribute a, CUkernel k, CUdevice d) {
    ENTER("cuKernelGetAttribute");
    LEAVE(get_attr((fkern *)k, (int)a, v));
}
static CUresult f_KernelSetCacheConfig(CUkernel k, CUfunc_cache c, CUdevice d) {
    ENTER("cuKernelSetCacheConfig");
    LEAVE(set_attr((fkern *)k, -1, (int)c));
}
static CUresult f_FuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
    ENTER("cuFuncSetAttribute");
    LEAVE(set_attr((fkern *)f, (int)a, v));
}
static CUresult f_FuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
    ENTER("cuFuncGetAttribute");
    LEAVE(get_attr((fkern *)f, (int)a, v));
}
static CUresult f_FuncSetCacheConfig(CUfunction f, CUfunc_cache c) {
    ENTER("cuFuncSetCacheConfig");
    LEAVE(set_attr((fkern *)f, -1, (int)c));
}

static int last_ex_ids[8], last_ex_n = -1;

static CUresult f_LaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **args, void **extra) {
    pthread_mutex_lock(&F.lock);
    last_ex_n = (int)c->numAttrs;
    for (unsigned i = 0; i < c->numAttrs && i < 8; i++)
        last_ex_ids[i] = (int)c->attrs[i].id;
    pthread_mutex_unlock(&F.lock);
    for (unsigned i = 0; i < c->numAttrs; i++) {
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && c->attrs[i].value.cooperative)
            launch_coop = 1;
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
            launch_cluster = c->attrs[i].value.clusterDim.x * c->attrs[i].value.clusterDim.y *
                             c->attrs[i].value.clusterDim.z;
    }
    return f_LaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                          c->blockDimZ, c->sharedMemBytes, c->hStream, args, extra);
}

static CUresult f_OccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int threads,
                                                            size_t smem) {
    ENTER("cuOccupancyMaxActiveBlocksPerMultiprocessor");
    *n = threads > 0 ? blocks_per_sm(((fkern *)f)->img, (uint64_t)threads) : 0;
    LEAVE(CUDA_SUCCESS);
}
static CUresult f_OccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *c) {
    ENTER("cuOccupancyMaxActiveClusters");
    unsigned size = 1;
    for (unsigned i = 0; i < c->numAttrs; i++)
        if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
            size = c->attrs[i].value.clusterDim.x * c->attrs[i].value.clusterDim.y *
                   c->attrs[i].value.clusterDim.z;
    int per_sm =
        blocks_per_sm(((fkern *)f)->img, (uint64_t)c->blockDimX * c->blockDimY * c->blockDimZ);
    *n = size > 8 ? 0 : per_sm * FAKE_SMS / (int)size;
    LEAVE(CUDA_SUCCESS);
}

int fake_kernel_attr(void *fn, int id) {
    pthread_mutex_lock(&F.lock);
    fkern *fk = fn;
    int v = -1;
    for (int i = 0; i < fk->nattr; i++)
        if (fk->attr_id[i] == id)
            v = fk->attr_val[i];
    pthread_mutex_unlock(&F.lock);
    return v;
}

int fake_last_launch_ex(int *ids, int max) {
    pthread_mutex_lock(&F.lock);
    int n = last_ex_n;
    for (int i = 0; i < n && i < max; i++)
        ids[i] = last_ex_ids[i];
    last_ex_n = -1;
    pthread_mutex_unlock(&F.lock);
    return n;
}

static hkb_driver fake_table;

static void fake_table_fill(void) {
#define FAKE_BIND(field, sym)             fake_table.field = f_##field;
#define FAKE_BIND_TYPED(field, sym, type) fake_table.field = f_##field;
    HKB_DRIVER_ENTRIES(FAKE_BIND)
    HKB_DRIVER_ENTRIES_EXTRA(FAKE_BIND)
    HKB_DRIVER_ENTRIES_TYPED(FAKE_BIND_TYPED)
#undef FAKE_BIND_TYPED
#undef FAKE_BIND
    fake_table.version = CUDA_VERSION;
}

/* Filled once: engine threads read the table while tests ask for it again. */
const hkb_driver *fake_driver(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fake_table_fill);
    return &fake_table;
}

/* ---- test controls added for capture, the driver lock and waits -------- */

void fake_set_launch_model(int us) {
    atomic_store(&launch_us, us);
}

void fake_set_graph_launch_us(int us) {
    F.graph_launch_us = us;
}

void fake_set_unload_us(int us) {
    atomic_store(&unload_us, us);
}

int fake_bad_unloads(void) {
    pthread_mutex_lock(&F.lock);
    int n = F.bad_unloads;
    pthread_mutex_unlock(&F.lock);
    return n;
}

void fake_hold_sync(int on) {
    pthread_mutex_lock(&F.lock);
    F.hold_sync = on;
    if (!on)
        F.sync_held = 0;
    pthread_cond_broadcast(&F.cond);
    pthread_mutex_unlock(&F.lock);
}

void fake_hold_ctx_state(int on) {
    pthread_mutex_lock(&F.lock);
    F.hold_state = on;
    if (!on)
        F.state_held = 0;
    pthread_cond_broadcast(&F.cond);
    pthread_mutex_unlock(&F.lock);
}

void fake_wait_ctx_state_held(void) {
    pthread_mutex_lock(&F.lock);
    while (!F.state_held)
        pthread_cond_wait(&F.cond, &F.lock);
    pthread_mutex_unlock(&F.lock);
}

void fake_wait_sync_held(void) {
    pthread_mutex_lock(&F.lock);
    while (!F.sync_held)
        pthread_cond_wait(&F.cond, &F.lock);
    pthread_mutex_unlock(&F.lock);
}

void fake_capture_begin(CUstream s, CUstreamCaptureMode mode) {
    pthread_mutex_lock(&F.lock);
    fstream *st = find_stream(s);
    fcgraph *g = calloc(1, sizeof *g);
    g->next = F.cgraphs;
    F.cgraphs = g;
    st->capturing = 1;
    st->mode = mode;
    st->invalidated = 0;
    st->graph = g;
    pthread_mutex_unlock(&F.lock);
}

CUresult fake_capture_end(CUstream s, CUgraph *graph) {
    pthread_mutex_lock(&F.lock);
    fstream *st = find_stream(s);
    st->capturing = 0;
    *graph = st->invalidated ? NULL : (CUgraph)st->graph;
    CUresult r = st->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
    pthread_mutex_unlock(&F.lock);
    return r;
}

int fake_captured_graph_launch(CUgraph graph, int *tag) {
    pthread_mutex_lock(&F.lock);
    fcgraph *g = (fcgraph *)graph;
    int bad = 0;
    for (int i = 0; i < g->nnodes; i++) {
        F.launches++;
        if (g->nodes[i]->img->dead) {
            F.violations++;
            bad++;
        } else if (tag) {
            *tag = g->nodes[i]->img->tag;
        }
    }
    pthread_mutex_unlock(&F.lock);
    return bad;
}

void fake_captured_graph_destroy(CUgraph graph) {
    pthread_mutex_lock(&F.lock);
    fcgraph *g = (fcgraph *)graph;
    fuobj *objs = g->objs;
    g->objs = NULL;
    pthread_mutex_unlock(&F.lock);
    /* The driver runs destructors on a thread of its own, without its lock. */
    while (objs) {
        fuobj *o = objs;
        objs = o->next;
        o->destroy(o->ptr);
        free(o);
    }
}

/* PTX for the fake: kernels "step(u64 out, u32 n)" and "aux(u64)", a tag,
 * optionally a 4-byte "counter" global, optionally a changed layout. */
char *fake_ptx(int tag, int with_aux, int with_counter, int step_layout) {
    static char buf[8][2048];
    static int next;
    char *b = buf[next++ % 8];
    const char *params = step_layout == 0   ? ".param .u64 out, .param .u32 n"
                         : step_layout == 1 ? ".param .u64 out, .param .u64 n"
                                            : ".param .u64 out";
    snprintf(b, 2048,
             "// tag: %d\n"
             ".version 8.0\n.target sm_90\n.address_size 64\n"
             "%s"
             ".visible .entry step(%s)\n{\n ret;\n}\n"
             "%s",
             tag, with_counter ? ".visible .global .align 4 .u32 counter;\n" : "", params,
             with_aux ? ".visible .entry aux(.param .u64 p)\n{\n ret;\n}\n" : "");
    return b;
}

/* ---- kernel controls and the loadable library's extra entry points ----- */

static int add_control(const char *spec, int kind, CUresult err, double ms);

int fake_kernel_control(const char *spec, int kind, CUresult err) {
    return add_control(spec, kind, err, 0);
}

int fake_kernel_slow(const char *spec, double ms) {
    return ms >= 0 ? add_control(spec, FAKE_SLOW, CUDA_SUCCESS, ms) : -1;
}

int fake_kernel_trap(const char *spec, int after) {
    return after >= 0 ? add_control(spec, FAKE_TRAP, CUDA_SUCCESS, after) : -1;
}

void fake_set_memcheck_fd(int fd, int soft) {
    pthread_mutex_lock(&F.lock);
    F.memcheck_fd = fd;
    F.memcheck_soft = soft;
    pthread_mutex_unlock(&F.lock);
}

static int add_control(const char *spec, int kind, CUresult err, double ms) {
    char name[64];
    int tag = -1;
    const char *at = strchr(spec, '@');
    size_t n = at ? (size_t)(at - spec) : strlen(spec);
    if (!n || n >= sizeof name || kind < FAKE_FAULT || kind > FAKE_TRAP)
        return -1;
    memcpy(name, spec, n);
    name[n] = '\0';
    if (at) {
        char *end;
        long t = strtol(at + 1, &end, 10);
        if (end == at + 1 || *end)
            return -1;
        tag = (int)t;
    }
    pthread_mutex_lock(&F.lock);
    int ok = F.nkctl < (int)(sizeof F.kctl / sizeof F.kctl[0]);
    if (ok) {
        snprintf(F.kctl[F.nkctl].name, sizeof F.kctl[F.nkctl].name, "%s", name);
        F.kctl[F.nkctl].tag = tag;
        static const int kinds[] = {
            [FAKE_FAULT] = KCTL_FAULT, [FAKE_HANG] = KCTL_HANG, [FAKE_WRONG] = KCTL_WRONG,
            [FAKE_SLOW] = KCTL_SLOW,   [FAKE_OOB] = KCTL_OOB,   [FAKE_TRAP] = KCTL_TRAP};
        F.kctl[F.nkctl].kind = kinds[kind];
        F.kctl[F.nkctl].err = err;
        F.kctl[F.nkctl].ms = ms;
        F.nkctl++;
    }
    pthread_mutex_unlock(&F.lock);
    return ok ? 0 : -1;
}

void fake_kernel_controls_clear(void) {
    pthread_mutex_lock(&F.lock);
    F.nkctl = 0;
    pthread_mutex_unlock(&F.lock);
}

CUresult fake_sticky_error(void) {
    pthread_mutex_lock(&F.lock);
    CUresult r = F.sticky;
    pthread_mutex_unlock(&F.lock);
    return r;
}

/* Copies are synchronous, as cuMemcpyHtoD/DtoH are: behind a hanging
 * kernel they never return. */
static CUresult f_MemcpyHtoD(CUdeviceptr d, const void *h, size_t n) {
    ENTER("cuMemcpyHtoD");
    while (F.hung)
        pthread_cond_wait(&F.cond, &F.lock);
    memcpy((void *)(uintptr_t)d, h, n);
    LEAVE(F.sticky);
}
static CUresult f_MemcpyDtoH(void *h, CUdeviceptr d, size_t n) {
    ENTER("cuMemcpyDtoH");
    while (F.hung)
        pthread_cond_wait(&F.cond, &F.lock);
    memcpy(h, (const void *)(uintptr_t)d, n);
    LEAVE(F.sticky);
}
static CUresult f_MemFree(CUdeviceptr d) {
    ENTER("cuMemFree");
    free((void *)(uintptr_t)d);
    LEAVE(CUDA_SUCCESS);
}

/* Events: a record takes the GPU time as it stands (the fake runs each
 * kernel to its end at launch), so two around a launch measure that
 * launch's duration. A hanging kernel blocks the event's synchronise as it
 * blocks the context's. */
typedef struct fevent {
    uint64_t ns;
    int recorded;
} fevent;

static CUresult f_EventCreate(CUevent *e, unsigned flags) {
    fevent *ev = calloc(1, sizeof *ev);
    if (!ev)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *e = (CUevent)ev;
    return CUDA_SUCCESS;
}
static CUresult f_EventRecord(CUevent e, CUstream s) {
    ENTER("cuEventRecord");
    fevent *ev = (fevent *)e;
    ev->ns = F.gpu_ns;
    ev->recorded = 1;
    LEAVE(F.sticky);
}
static CUresult f_EventSynchronize(CUevent e) {
    ENTER("cuEventSynchronize");
    while (F.hung)
        pthread_cond_wait(&F.cond, &F.lock);
    LEAVE(F.sticky);
}
static CUresult f_EventElapsedTime(float *ms, CUevent a, CUevent b) {
    ENTER("cuEventElapsedTime");
    fevent *x = (fevent *)a, *y = (fevent *)b;
    if (!x->recorded || !y->recorded)
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
    *ms = (float)((double)(y->ns - x->ns) / 1e6);
    LEAVE(F.sticky);
}
static CUresult f_EventDestroy(CUevent e) {
    free(e);
    return CUDA_SUCCESS;
}

void *fake_entry(const char *sym) {
    const hkb_driver *t = fake_driver();
#define FAKE_ENTRY(field, name)                                                                    \
    if (!strcmp(sym, #name))                                                                       \
        return (void *)t->field;
#define FAKE_ENTRY_TYPED(field, name, type) FAKE_ENTRY(field, name)
    HKB_DRIVER_ENTRIES(FAKE_ENTRY)
    HKB_DRIVER_ENTRIES_EXTRA(FAKE_ENTRY)
    HKB_DRIVER_ENTRIES_TYPED(FAKE_ENTRY_TYPED)
#undef FAKE_ENTRY_TYPED
#undef FAKE_ENTRY
    if (!strcmp(sym, "cuMemcpyHtoD"))
        return (void *)f_MemcpyHtoD;
    if (!strcmp(sym, "cuMemcpyDtoH"))
        return (void *)f_MemcpyDtoH;
    if (!strcmp(sym, "cuMemFree"))
        return (void *)f_MemFree;
    static const struct {
        const char *name;
        void *fn;
    } events[] = {{"cuEventCreate", (void *)f_EventCreate},
                  {"cuEventRecord", (void *)f_EventRecord},
                  {"cuEventSynchronize", (void *)f_EventSynchronize},
                  {"cuEventElapsedTime", (void *)f_EventElapsedTime},
                  {"cuEventDestroy", (void *)f_EventDestroy}};
    for (size_t i = 0; i < sizeof events / sizeof events[0]; i++)
        if (!strcmp(sym, events[i].name))
            return events[i].fn;
    return NULL;
}

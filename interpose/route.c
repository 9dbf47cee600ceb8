/*
 * The core of the <<<>>> interposition (interpose.h): which launches go to
 * a hot version, and where the host's symbol copies land.
 *
 * The table, the identity of a handle, the runtime, hot launches and the
 * globals: each in its section below.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hotkern/interpose.h"
#include "interpose/interpose.h"
#include "loader/port.h"
#include "interpose/sync.h"

static hki_real R;

static _Atomic(hk_runtime *) g_rt;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t attach_lock = PTHREAD_MUTEX_INITIALIZER;

void hki_real_set(const hki_real *real) {
    R = *real;
    hki_sync_real_set(real);
}

const hki_real *hki_real_get(void) {
    return &R;
}

/* ---- the table ---------------------------------------------------------- */

/*
 * The table. Every handle a launch passes (a cudaKernel_t, or the function
 * pointer of cudaLaunchKernel) gets one slot, filled on its first launch and
 * never changed: key, then the engine's entry for that kernel (or NULL: not
 * one to route). The launch path hashes the handle, probes (acquire loads
 * only), loads the entry's hot handle (one acquire load: NULL while no hot
 * version exists) and either calls hk_launch or forwards to the program's
 * runtime, untouched. No lock, no allocation. Slots are written under
 * table_lock, the entry before the key (release), so a reader that sees the
 * key sees the entry. A handle whose slots near its hash are all taken (a
 * full table) goes to chained overflow buckets, written the same way (node,
 * then the bucket's head, release): a launch of one probes PROBE slots and
 * walks a short chain, and never registers again.
 * Every launch notes its block and shared memory on the kernel's entry
 * (hkl_use: a relaxed load and compare each), which a version is checked
 * against before its commit (loader/fit.c); a hot launch that fails anyway
 * is run by the program's own kernel in the same call (fell_back).
 * The handles of a translation unit that is unregistered (dlclose) are
 * taken out (a tombstone key, never reused: a slot is written once), so
 * that a handle value reused by a later library is registered anew, never
 * run as the unloaded kernel's hot version.
 */
#define SLOTS 16384 /* a power of two */

#define PROBE    32   /* slots a key may take from its hash on */
#define OVERFLOW 1024 /* buckets past the table, a power of two */

typedef struct slot {
    _Atomic(const void *) key;
    _Atomic(hkl_expect *) e;
    hkl_use *use;      /* e's, or NULL: written before key */
    struct slot *next; /* overflow chains: written before the slot is linked */
} slot;

#define TOMBSTONE ((const void *)(uintptr_t)1) /* a handle taken out */

static slot table[SLOTS];
static _Atomic(slot *) overflow[OVERFLOW]; /* chains; nodes never freed */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int nregistered;

static inline size_t hash_ptr(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 29;
    x *= 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 50); /* 14 bits */
}

static const slot *find_overflow(const void *key) {
    size_t h = hash_ptr(key) & (OVERFLOW - 1);
    for (const slot *s = atomic_load_explicit(&overflow[h], memory_order_acquire); s; s = s->next)
        if (atomic_load_explicit(&s->key, memory_order_relaxed) == key)
            return s;
    return NULL;
}

/* A key takes the first free slot of the PROBE from its hash, or goes to
 * the overflow when they are all taken: slots are never freed, so a free
 * one among them says the key is in neither, and a lookup costs at most
 * PROBE loads before the overflow's short chain. */
static inline const slot *find(const void *key) {
    size_t h = hash_ptr(key);
    for (size_t i = 0; i < PROBE; i++) {
        const slot *s = &table[(h + i) & (SLOTS - 1)];
        const void *k = atomic_load_explicit(&s->key, memory_order_acquire);
        if (k == key)
            return s;
        if (!k)
            return NULL;
    }
    return find_overflow(key);
}

/* The slot of key, made if new; NULL: no memory for an overflow node. */
static const slot *insert(const void *key, hkl_expect *e) {
    pthread_mutex_lock(&table_lock);
    slot *s = (slot *)find(key);
    if (!s) {
        size_t h = hash_ptr(key);
        for (size_t i = 0; i < PROBE && !s; i++) {
            slot *t = &table[(h + i) & (SLOTS - 1)];
            if (!atomic_load_explicit(&t->key, memory_order_relaxed))
                s = t;
        }
        if (s) {
            atomic_store_explicit(&s->e, e, memory_order_relaxed);
            s->use = e ? hkl_expect_use(e) : NULL;
            atomic_store_explicit(&s->key, key, memory_order_release);
            pthread_mutex_unlock(&table_lock);
            return s;
        }
    }
    if (!s && (s = calloc(1, sizeof *s)) != NULL) { /* its slots are all taken */
        size_t h = hash_ptr(key) & (OVERFLOW - 1);
        atomic_init(&s->key, key);
        atomic_init(&s->e, e);
        s->use = e ? hkl_expect_use(e) : NULL;
        s->next = atomic_load_explicit(&overflow[h], memory_order_relaxed);
        atomic_store_explicit(&overflow[h], s, memory_order_release);
    }
    pthread_mutex_unlock(&table_lock);
    return s;
}

/* Takes key out of the table: its next launch registers it again. */
static void forget(const void *key) {
    pthread_mutex_lock(&table_lock);
    slot *s = (slot *)find(key);
    if (s) {
        atomic_store_explicit(&s->e, NULL, memory_order_relaxed);
        atomic_store_explicit(&s->key, TOMBSTONE, memory_order_release);
    }
    pthread_mutex_unlock(&table_lock);
}

/*
 * Identity. A handle's kernel is registered with its translation unit
 * (tu.c; loader/expect_tu.c decides which module reaches it): the handle's
 * host stub's TU, or for a cudaKernel_t the TU of the stub that took it
 * (__cudaGetKernel), else the one whose stub of that name the runtime maps
 * to it (cudaGetKernel). A name several TUs have whose handle cannot be
 * placed routes nothing (said once). Kernels in an anonymous namespace can
 * never have a hot version (nvcc and NVRTC name that namespace
 * differently): said once each, and not registered.
 */

/* tu_of_key's answer when several TUs name the kernel and the key is none
 * of theirs. */
#define TU_AMBIGUOUS (-1L)

/* The translation unit of the program's kernel `name` launched through key
 * (a host stub when is_func, else a cudaKernel_t): 0 when no TU names it
 * (matched by name), TU_AMBIGUOUS when several do and key is none of
 * theirs. */
static long tu_of_key(const void *key, int is_func, const char *name) {
    const void *host = is_func ? key : hki_tu_host_of_kernel(key);
    unsigned id = host ? hki_tu_of_host(host) : 0;
    if (id)
        return id;
    const void *hosts[16];
    unsigned ids[16];
    int n = hki_tu_hosts(name, hosts, ids, 16);
    if (n <= 1)
        return n ? ids[0] : 0;
    for (int i = 0; i < n; i++) {
        cudaKernel_t ck = NULL;
        if (is_func ? hosts[i] == key
                    : R.get_kernel && R.get_kernel(&ck, hosts[i]) == cudaSuccess && ck == key)
            return ids[i];
    }
    return TU_AMBIGUOUS;
}

/* The engine's entry for the program's kernel ck: its name as the driver
 * reports it, its parameter layout (the driver has no count: indices are
 * asked until it says there are no more) and, for a template instance, the
 * name expression a hot build needs. */
static hkl_expect *register_kernel(hk_runtime *rt, CUkernel ck, const void *key, int is_func,
                                   unsigned *tu_out, int *retry) {
    const hkb_driver *d = hkl_driver(rt);
    const char *name = NULL;
    if (!d->KernelGetName || d->KernelGetName(&name, ck) != CUDA_SUCCESS || !name)
        return NULL; /* a driver without kernel names: the program's own code */
    if (strstr(name, "_GLOBAL__N_")) {
        hk_log(rt, HK_LOG_WARN, "interpose",
               "the program's kernel '%s' is in an anonymous namespace: nvcc and NVRTC name that "
               "namespace differently, so no hot build can have this name and it always runs "
               "the program's own code (declare it `static` outside the anonymous namespace to "
               "make it hot)",
               name);
        return NULL;
    }
    long tu = tu_of_key(key, is_func, name);
    if (tu == TU_AMBIGUOUS) {
        hk_log(rt, HK_LOG_WARN, "interpose",
               "the program's kernel '%s' is defined in several files and this launch handle is "
               "none of theirs that the runtime names: it runs the program's own code",
               name);
        return NULL;
    }
    *tu_out = (unsigned)tu;
    uint32_t off[256], size[256];
    hkl_param_layout l = {0, off, size};
    /* The layout is asked in device 0's primary context: a program's very
     * first CUDA call may be this launch, before its runtime made a context
     * current. Past the last parameter the driver says
     * CUDA_ERROR_INVALID_VALUE; any other error at the first means the
     * layout is not known (not 0 parameters): nothing is registered now,
     * and the next launch asks again. */
    CUcontext cur = NULL;
    int pushed = d->CtxGetCurrent(&cur) == CUDA_SUCCESS && !cur && hkl_ctx_push(rt, 0) == 0;
    CUresult first = CUDA_SUCCESS;
    for (size_t i = 0; i < 256; i++) {
        size_t o = 0, z = 0;
        CUresult r = d->KernelGetParamInfo(ck, i, &o, &z);
        if (r != CUDA_SUCCESS) {
            first = i ? CUDA_SUCCESS : r;
            break;
        }
        off[l.n] = (uint32_t)o;
        size[l.n++] = (uint32_t)z;
    }
    if (pushed)
        hkl_ctx_pop(rt);
    if (first != CUDA_SUCCESS && first != CUDA_ERROR_INVALID_VALUE) {
        hk_log(rt, HK_LOG_DEBUG, "interpose",
               "the program's kernel '%s': its parameters cannot be read yet (CUresult %d): "
               "registered at a later launch",
               name, (int)first);
        *retry = 1;
        return NULL;
    }
    char *expr = hki_name_expression(name);
    hkl_expect *e = hkl_expect_kernel(rt, name, expr, &l, (unsigned)tu);
    if (expr && e && !hkl_expect_handle(e))
        hkl_late_submit(rt); /* an instance its module's last build did not have */
    free(expr);
    return e;
}

/* First launch of handle key: which kernel it is, registered, kept. NULL
 * only without memory (registered again at the next launch). */
static const slot *register_key(hk_runtime *rt, const void *key, int is_func) {
    cudaKernel_t ck = (cudaKernel_t)key;
    hkl_expect *e = NULL;
    unsigned tu = 0;
    int retry = 0;
    hki_tus_tell(rt); /* TUs registered after the runtime came up (dlopen) */
    if (!is_func || (R.get_kernel && R.get_kernel(&ck, key) == cudaSuccess && ck))
        e = register_kernel(rt, (CUkernel)ck, key, is_func, &tu, &retry);
    if (retry)
        return NULL; /* the program's own code, registered at a later launch */
    atomic_fetch_add(&nregistered, 1);
    const slot *s = insert(key, e);
    if (tu)
        hki_tu_key(tu, key);
    return s;
}

/* ---- the runtime -------------------------------------------------------- */

/*
 * The runtime. hk_interpose_attach makes launches route through the
 * program's own runtime; without one, the first launch makes one from the
 * environment (HOTKERN_*, see include/hotkern/interpose.h), once, while the
 * other first launches wait: none of the program's launches can then keep
 * the creation's driver calls waiting. A runtime that cannot be made (no
 * driver, HOTKERN_OFF) leaves every launch forwarded: the program runs as
 * if hotkern were not there.
 */
typedef struct var {
    const void *host; /* the program's shadow variable */
    void **fatbin;    /* its translation unit's handle */
    char *name;
    size_t size;
    hkl_xglobal *g; /* the engine's entry, once told */
    int known;      /* told to the engine */
    int warned;     /* cudaGetSymbolAddress of its hot copy logged */
    struct var *next;
} var;

static var *vars; /* vars_lock */
static pthread_mutex_t vars_lock = PTHREAD_MUTEX_INITIALIZER;

/* Tells the engine where the program's copy of v is. vars_lock held. */
static void var_tell(hk_runtime *rt, var *v) {
    void *p = NULL;
    if (v->known || !R.symbol_address || R.symbol_address(&p, v->host) != cudaSuccess || !p)
        return;
    v->known = hkl_expect_global(rt, v->name, (uint64_t)(uintptr_t)p, v->size, hki_tu_id(v->fatbin),
                                 &v->g) == 0;
}

static void vars_tell(hk_runtime *rt) {
    pthread_mutex_lock(&vars_lock);
    for (var *v = vars; v; v = v->next)
        var_tell(rt, v);
    pthread_mutex_unlock(&vars_lock);
}

/* From the process's exit on, every launch and symbol copy is the
 * program's own: its CUDA runtime knows that it is being unloaded, while a
 * hot launch would reach the driver as it goes (hotkern's threads have
 * stopped already, base/exit.c). Registered at attach, after the runtime's
 * exit guard, this runs before it; the launch path pays nothing for it. */
static void no_runtime(void) {}

static void unroute(void) {
    pthread_once(&env_once, no_runtime); /* and none is made from then on */
    atomic_store(&g_rt, NULL);
}

static void unroute_at_exit(void) {
    atexit(unroute);
}

int hk_interpose_attach(hk_runtime *rt) {
    static pthread_once_t at_exit = PTHREAD_ONCE_INIT;
    if (!rt)
        return HK_ERR_INVALID;
    pthread_mutex_lock(&attach_lock);
    int err = atomic_load(&g_rt) ? HK_ERR_BUSY : 0;
    if (!err) {
        hki_tus_tell(rt);
        vars_tell(rt);
        pthread_once(&at_exit, unroute_at_exit);
        atomic_store_explicit(&g_rt, rt, memory_order_release);
        hki_sync_attach(rt); /* automatic safe points (sync.c) */
    }
    pthread_mutex_unlock(&attach_lock);
    return err;
}

hk_runtime *hk_interpose_runtime(void) {
    return atomic_load(&g_rt);
}

hk_runtime *hki_runtime(void) {
    return atomic_load(&g_rt);
}

int hki_registered(void) {
    return atomic_load(&nregistered);
}

/* Once, at the first launch, unless the program attached its own runtime:
 * the one HOTKERN_* asks for (env.c; NULL when off, refused or not made,
 * each said on stderr). The runtime lives as long as the process: at exit
 * the program's runtime and driver go their own way, and a teardown racing
 * them would only add risk (base/exit.c keeps hotkern's threads off the
 * driver from then on; the state directory's lock goes with the process). */
static void from_env(void) {
    /* The program's variables are told to it before its sources start, so
     * that a first version sees them (env.c destroys it if one fails). */
    hk_runtime *rt = atomic_load(&g_rt) ? NULL : hki_env_runtime(vars_tell);
    if (rt && hk_interpose_attach(rt) < 0) { /* the program attached one meanwhile */
        hk_runtime_destroy(rt);
        rt = NULL;
    }
    if (!rt) { /* what was told went with it */
        pthread_mutex_lock(&vars_lock);
        for (var *v = vars; v; v = v->next)
            v->known = 0;
        pthread_mutex_unlock(&vars_lock);
    }
}

static inline hk_runtime *runtime(void) {
    hk_runtime *rt = atomic_load_explicit(&g_rt, memory_order_acquire);
    if (__builtin_expect(rt != NULL, 1))
        return rt;
    pthread_once(&env_once, from_env);
    return atomic_load_explicit(&g_rt, memory_order_acquire);
}

/* The slot of key (registered at its first launch), or NULL: no runtime. */
static inline const slot *lookup(const void *key, int is_func) {
    hk_runtime *rt = runtime();
    if (__builtin_expect(!rt || !key, 0))
        return NULL;
    const slot *s = find(key);
    return __builtin_expect(s != NULL, 1) ? s : register_key(rt, key, is_func);
}

/* The program's kernel key is, or NULL (not one, or no runtime). */
hkl_expect *hki_expect_of(const void *key, int is_func) {
    const slot *s = lookup(key, is_func);
    return s ? atomic_load_explicit(&s->e, memory_order_relaxed) : NULL;
}

/* The hot handle of s's kernel after noting the launch's block and shared
 * memory, or NULL: the program's own code. */
static inline hk_kernel *hot_of(const slot *s, dim3 b, size_t shm) {
    if (__builtin_expect(!s || !s->use, 0))
        return NULL;
    hkl_use_note(s->use, b.x, b.y, b.z, shm);
    return hkl_expect_handle(atomic_load_explicit(&s->e, memory_order_relaxed));
}

/*
 * Hot launches go through hk_launch (the launch gate, capture pins, reclaim
 * epochs apply as to any hk_launch) when the launching thread's context is
 * the runtime's (device 0's primary context, the runtime API's); a thread
 * with no context gets that one, as the runtime API would give it; a launch
 * in another context is the program's own.
 */
/* The launching thread's context is the runtime's (or none, which then
 * becomes the runtime's, as the runtime API would make it). */
static int in_context(hk_runtime *rt) {
    const hkb_driver *d = hkl_driver(rt);
    CUcontext cur = NULL, mine = hkl_context(rt, 0);
    if (d->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur == mine)
        return 1;
    return !cur && d->CtxSetCurrent(mine) == CUDA_SUCCESS;
}

/* A _ptsz entry point's stream 0 is the per-thread default stream. */
static inline CUstream stream_of(int ptsz, cudaStream_t s) {
    return !s && ptsz ? CU_STREAM_PER_THREAD : (CUstream)s;
}

/* The runtime's error for a failed hot launch: CUresult and cudaError_t
 * share their values for every launch error. */
static cudaError_t launch_error(int err, int cu) {
    if (cu)
        return (cudaError_t)cu;
    return err == HK_ERR_NOMEM ? cudaErrorMemoryAllocation : cudaErrorUnknown;
}

_Static_assert(sizeof(cudaLaunchAttribute) == sizeof(CUlaunchAttribute),
               "cudaLaunchAttribute and CUlaunchAttribute share their layout");

/* A hot launch that failed with err (cu: its CUresult) may be run by the
 * program's own kernel: any failure but a sticky one (the context is lost
 * for both). */
static inline int may_fall_back(int err, int cu) {
    return !hkl_lkg_sticky(cu);
}

/* After the program's launch (prog) ran a failed hot launch: counted,
 * logged and emitted, the module sent back to the program's code until its
 * next commit (hkl_expect_fallback). The program loses no launch, and its
 * launch is its runtime's own: if it fails too, that error is the call's and
 * the one cudaGetLastError reports (nvcc's stub drops the return value). */
static cudaError_t fell_back(const slot *s, hk_kernel *h, int err, int cu, const char *how, dim3 g,
                             dim3 b, size_t shm, cudaError_t prog) {
    char what[200];
    snprintf(what, sizeof what,
             "%s of grid %ux%ux%u, block %ux%ux%u, %zu bytes of dynamic "
             "shared memory%s%s",
             how, g.x, g.y, g.z, b.x, b.y, b.z, shm, cu ? "" : ": ", cu ? "" : hk_strerror(err));
    hkl_expect_fallback(hkl_kernel_runtime(h), atomic_load_explicit(&s->e, memory_order_relaxed),
                        cu, what, (int)prog);
    return prog;
}

/* A launch of h's hot version with the program's configuration: 0, or the
 * hk_launch error with *cu. */
static int hot_launch(hk_kernel *h, int ptsz, dim3 g, dim3 b, void **args, size_t shm,
                      cudaStream_t s, int *cu) {
    return hk_launch(h, (hk_dim3){g.x, g.y, g.z}, (hk_dim3){b.x, b.y, b.z}, (unsigned)shm,
                     stream_of(ptsz, s), args, cu);
}

cudaError_t hki_klaunch(int ptsz, cudaKernel_t k, dim3 g, dim3 b, void **args, size_t shm,
                        cudaStream_t s) {
    hki_track(ptsz, s);
    const slot *sl = lookup(k, 0);
    hk_kernel *h = hot_of(sl, b, shm);
    if (__builtin_expect(h != NULL, 0) && in_context(hkl_kernel_runtime(h))) {
        int cu = 0, err = hot_launch(h, ptsz, g, b, args, shm, s, &cu);
        if (__builtin_expect(!err, 1))
            return cudaSuccess;
        if (!may_fall_back(err, cu))
            return launch_error(err, cu);
        return fell_back(sl, h, err, cu, "<<<>>>", g, b, shm,
                         (ptsz ? R.klaunch_ptsz : R.klaunch)(k, g, b, args, shm, s));
    }
    return (ptsz ? R.klaunch_ptsz : R.klaunch)(k, g, b, args, shm, s);
}

cudaError_t hki_launch(int ptsz, const void *f, dim3 g, dim3 b, void **args, size_t shm,
                       cudaStream_t s) {
    hki_track(ptsz, s);
    const slot *sl = lookup(f, 1);
    hk_kernel *h = hot_of(sl, b, shm);
    if (__builtin_expect(h != NULL, 0) && in_context(hkl_kernel_runtime(h))) {
        int cu = 0, err = hot_launch(h, ptsz, g, b, args, shm, s, &cu);
        if (__builtin_expect(!err, 1))
            return cudaSuccess;
        if (!may_fall_back(err, cu))
            return launch_error(err, cu);
        return fell_back(sl, h, err, cu, "cudaLaunchKernel", g, b, shm,
                         (ptsz ? R.launch_ptsz : R.launch)(f, g, b, args, shm, s));
    }
    return (ptsz ? R.launch_ptsz : R.launch)(f, g, b, args, shm, s);
}

/* What a launch's attributes ask of the kernel: cluster dimensions and
 * cooperative-ness, noted on its use (not the common path). */
static void note_attrs(hkl_use *u, const cudaLaunchConfig_t *c) {
    for (unsigned i = 0; i < c->numAttrs; i++) {
        const cudaLaunchAttribute *a = &c->attrs[i];
        if (a->id == cudaLaunchAttributeClusterDimension) {
            hkl_use_max(&u->cluster[0], a->val.clusterDim.x);
            hkl_use_max(&u->cluster[1], a->val.clusterDim.y);
            hkl_use_max(&u->cluster[2], a->val.clusterDim.z);
        } else if (a->id == cudaLaunchAttributeCooperative && a->val.cooperative) {
            hkl_use_max(&u->coop_blocks, (uint64_t)c->gridDim.x * c->gridDim.y * c->gridDim.z);
            hkl_use_max(&u->coop_threads, (uint64_t)c->blockDim.x * c->blockDim.y * c->blockDim.z);
            hkl_use_max(&u->coop_smem, c->dynamicSmemBytes);
        }
    }
}

/* A launch through a driver configuration (cudaLaunchKernelExC, cooperative
 * launches): 0, or the hkl_launch_lc error with *cu. */
static int hot_launch_lc(hk_kernel *h, int ptsz, const cudaLaunchConfig_t *c, void **args,
                         int *cu) {
    CUlaunchConfig lc = {.gridDimX = c->gridDim.x,
                         .gridDimY = c->gridDim.y,
                         .gridDimZ = c->gridDim.z,
                         .blockDimX = c->blockDim.x,
                         .blockDimY = c->blockDim.y,
                         .blockDimZ = c->blockDim.z,
                         .sharedMemBytes = (unsigned)c->dynamicSmemBytes,
                         .hStream = stream_of(ptsz, c->stream),
                         .attrs = (CUlaunchAttribute *)c->attrs,
                         .numAttrs = c->numAttrs};
    return hkl_launch_lc(h, &lc, args, cu);
}

cudaError_t hki_xlaunch(int ptsz, const cudaLaunchConfig_t *c, const void *f, void **args) {
    if (c)
        hki_track(ptsz, c->stream);
    const slot *sl = c ? lookup(f, 1) : NULL;
    hk_kernel *h = sl ? hot_of(sl, c->blockDim, c->dynamicSmemBytes) : NULL;
    if (sl && sl->use && c->numAttrs)
        note_attrs(sl->use, c);
    if (h && in_context(hkl_kernel_runtime(h))) {
        int cu = 0, err = hot_launch_lc(h, ptsz, c, args, &cu);
        if (!err)
            return cudaSuccess;
        if (!may_fall_back(err, cu))
            return launch_error(err, cu);
        return fell_back(sl, h, err, cu, "cudaLaunchKernelEx", c->gridDim, c->blockDim,
                         c->dynamicSmemBytes, (ptsz ? R.xlaunch_ptsz : R.xlaunch)(c, f, args));
    }
    return (ptsz ? R.xlaunch_ptsz : R.xlaunch)(c, f, args);
}

cudaError_t hki_coop_launch(int ptsz, const void *f, dim3 g, dim3 b, void **args, size_t shm,
                            cudaStream_t s) {
    hki_track(ptsz, s);
    const slot *sl = lookup(f, 1);
    hk_kernel *h = hot_of(sl, b, shm);
    cudaLaunchAttribute at = {.id = cudaLaunchAttributeCooperative};
    at.val.cooperative = 1;
    cudaLaunchConfig_t c = {.gridDim = g,
                            .blockDim = b,
                            .dynamicSmemBytes = shm,
                            .stream = s,
                            .attrs = &at,
                            .numAttrs = 1};
    if (sl && sl->use)
        note_attrs(sl->use, &c);
    if (h && in_context(hkl_kernel_runtime(h))) {
        int cu = 0, err = hot_launch_lc(h, ptsz, &c, args, &cu);
        if (!err)
            return cudaSuccess;
        if (!may_fall_back(err, cu))
            return launch_error(err, cu);
        return fell_back(sl, h, err, cu, "cudaLaunchCooperativeKernel", g, b, shm,
                         (ptsz ? R.coop_launch_ptsz : R.coop_launch)(f, g, b, args, shm, s));
    }
    return (ptsz ? R.coop_launch_ptsz : R.coop_launch)(f, g, b, args, shm, s);
}

/* ---- globals ------------------------------------------------------------ */

/*
 * Globals. nvcc's registration code names every __device__/__constant__
 * variable of the program (__cudaRegisterVar: host shadow, name, size); the
 * engine learns each one with the address of the program's copy, so the
 * first hot version of a module takes its value (loader/expect.c). The
 * host's later copies go to the program's copy as before and also to the
 * hot version's, so that both its kernels and the program's own see them;
 * reads come from the hot version's; cudaGetSymbolAddress gives the hot
 * copy's address (valid until the next swap of its module: logged once).
 */
void hki_register_var(void **fatbin, char *host_var, char *device_addr, const char *name, int ext,
                      size_t size, int constant, int global) {
    var *v = calloc(1, sizeof *v);
    if (v && name && (v->name = strdup(name))) {
        v->host = host_var;
        v->fatbin = fatbin;
        v->size = size;
        pthread_mutex_lock(&vars_lock);
        v->next = vars;
        vars = v;
        pthread_mutex_unlock(&vars_lock);
    } else {
        free(v);
    }
    hki_tu_var(fatbin, host_var, name);
    if (R.register_var)
        R.register_var(fatbin, host_var, device_addr, name, ext, size, constant, global);
}

/* ---- translation units -------------------------------------------------- */

void **hki_register_fatbin(void *wrapper) {
    void **h = R.register_fatbin ? R.register_fatbin(wrapper) : NULL;
    hki_tu_begin(h, wrapper);
    return h;
}

void hki_register_function(void **handle, const char *host, char *dev, const char *name, int limit,
                           uint3 *tid, uint3 *bid, dim3 *bdim, dim3 *gdim, int *wsize) {
    hki_tu_function(handle, host, name);
    if (R.register_function)
        R.register_function(handle, host, dev, name, limit, tid, bid, bdim, gdim, wsize);
}

/* nvcc's stub takes its kernel's handle once: the handle is that stub's
 * kernel, of that stub's TU, whatever cudaGetKernel would say. */
cudaError_t hki_stub_kernel(cudaKernel_t *k, const void *host) {
    cudaError_t r = R.stub_kernel ? R.stub_kernel(k, host) : cudaErrorNotSupported;
    if (r == cudaSuccess && k && *k)
        hki_tu_stub_kernel(*k, host);
    return r;
}

void hki_register_fatbin_end(void **handle) {
    hki_tu_end(atomic_load_explicit(&g_rt, memory_order_acquire), handle);
    if (R.register_fatbin_end)
        R.register_fatbin_end(handle);
}

/* dlclose (or exit): the TU's launch handles leave the table and its
 * variables the list, before the runtime forgets them, so that a later
 * library's handles and shadows at the same addresses start afresh. */
void hki_unregister_fatbin(void **handle) {
    const void **keys = NULL;
    int n = hki_tu_gone(atomic_load_explicit(&g_rt, memory_order_acquire), handle, &keys);
    for (int i = 0; i < n; i++)
        forget(keys[i]);
    free(keys);
    pthread_mutex_lock(&vars_lock);
    for (var **pv = &vars; *pv;) {
        var *v = *pv;
        if (v->fatbin == handle && handle) {
            *pv = v->next;
            free(v->name);
            free(v);
        } else {
            pv = &v->next;
        }
    }
    pthread_mutex_unlock(&vars_lock);
    if (R.unregister_fatbin)
        R.unregister_fatbin(handle);
}

/* ---- the host's symbol copies -------------------------------------------- */

/* Hot versions run in device 0's context (in_context): a copy the program
 * makes on another device (cudaSetDevice(1)) is that device's, the
 * program's own copy alone. No current context: the runtime's default,
 * device 0. */
static int on_device0(hk_runtime *rt) {
    CUcontext cur = NULL;
    if (hkl_driver(rt)->CtxGetCurrent(&cur) != CUDA_SUCCESS)
        return 1;
    return !cur || cur == hkl_context(rt, 0);
}

/* The engine's entry of the program's variable sym, or NULL. A variable
 * the engine has not heard of yet (registered after the runtime came up) is
 * told now. The entry lives as long as the runtime. */
static hkl_xglobal *xglobal_of(const void *sym, hk_runtime **rtp, var **out) {
    hk_runtime *rt = atomic_load_explicit(&g_rt, memory_order_acquire);
    *rtp = rt;
    if (out)
        *out = NULL;
    if (!rt)
        return NULL;
    pthread_mutex_lock(&vars_lock);
    var *v = vars;
    while (v && v->host != sym)
        v = v->next;
    if (v)
        var_tell(rt, v);
    hkl_xglobal *g = v ? v->g : NULL;
    if (out)
        *out = v;
    pthread_mutex_unlock(&vars_lock);
    return g && on_device0(rt) ? g : NULL;
}

/* The program's copy is written as the program asked; the running hot
 * version's copy too, inside the engine's gate (hkl_xglobal_enter), so that
 * no swap carries the value over before the write lands, nor unloads the
 * copy under it. */
cudaError_t hki_to_symbol(int async, int ptsz, const void *sym, const void *src, size_t count,
                          size_t offset, enum cudaMemcpyKind kind, cudaStream_t s) {
    cudaError_t r = !async ? (ptsz ? R.to_symbol_ptds : R.to_symbol)(sym, src, count, offset, kind)
                    : ptsz ? R.to_symbol_async_ptsz(sym, src, count, offset, kind, s)
                           : R.to_symbol_async(sym, src, count, offset, kind, s);
    hk_runtime *rt;
    hkl_xglobal *g = r == cudaSuccess ? xglobal_of(sym, &rt, NULL) : NULL;
    uint64_t p = 0;
    hkl_tslot *in = g ? hkl_xglobal_enter(rt, g, &p) : NULL;
    if (!in)
        return r;
    if (offset + count <= hkl_xglobal_size(g)) {
        void *dst = (void *)(uintptr_t)(p + offset);
        r = async ? R.memcpy_async(dst, src, count, kind, ptsz && !s ? cudaStreamPerThread : s)
                  : R.memcpy(dst, src, count, kind);
    }
    hkl_xglobal_exit(in);
    return r;
}

cudaError_t hki_from_symbol(int async, int ptsz, void *dst, const void *sym, size_t count,
                            size_t offset, enum cudaMemcpyKind kind, cudaStream_t s) {
    hk_runtime *rt;
    hkl_xglobal *g = xglobal_of(sym, &rt, NULL);
    uint64_t p = 0;
    hkl_tslot *in = g ? hkl_xglobal_enter(rt, g, &p) : NULL;
    if (in && offset + count <= hkl_xglobal_size(g)) {
        const void *from = (const void *)(uintptr_t)(p + offset);
        cudaError_t r =
            async ? R.memcpy_async(dst, from, count, kind, ptsz && !s ? cudaStreamPerThread : s)
                  : R.memcpy(dst, from, count, kind);
        hkl_xglobal_exit(in);
        return r;
    }
    hkl_xglobal_exit(in);
    return !async ? (ptsz ? R.from_symbol_ptds : R.from_symbol)(dst, sym, count, offset, kind)
           : ptsz ? R.from_symbol_async_ptsz(dst, sym, count, offset, kind, s)
                  : R.from_symbol_async(dst, sym, count, offset, kind, s);
}

cudaError_t hki_symbol_address(void **out, const void *sym) {
    hk_runtime *rt;
    var *v;
    hkl_xglobal *g = out ? xglobal_of(sym, &rt, &v) : NULL;
    uint64_t p = 0;
    hkl_tslot *in = g ? hkl_xglobal_enter(rt, g, &p) : NULL;
    if (!in)
        return R.symbol_address(out, sym);
    hkl_xglobal_exit(in);
    *out = (void *)(uintptr_t)p;
    pthread_mutex_lock(&vars_lock);
    int first = v && !v->warned;
    if (v)
        v->warned = 1;
    const char *name = first ? v->name : NULL;
    pthread_mutex_unlock(&vars_lock);
    if (first)
        hk_log(rt, HK_LOG_WARN, "interpose",
               "cudaGetSymbolAddress('%s') gives the running hot version's copy: the address is "
               "valid until the next swap of its module (cudaMemcpyToSymbol follows swaps)",
               name);
    return cudaSuccess;
}

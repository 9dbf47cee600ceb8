/*
 * The interposition's identity of the program's kernels and variables
 * (interpose/tu.c, loader/expect_tu.c) on the fake driver: two translation
 * units registered as nvcc's code registers them, each with a kernel
 * `step` and a variable `counter` of the same names (file-local kernels and
 * variables in a.cu and b.cu). Checked: a module of a.cu reaches a.cu's
 * kernel and variable alone; a module no file can be told to be routes
 * nothing of a shared name and says so once; a launch handle reused after
 * the unregistration of its TU (dlclose, dlopen) is registered anew; an
 * anonymous-namespace kernel is said not to be able to be hot; a version
 * committed before the program's variable was registered gets the host's
 * later writes; a template instance first launched after its module was
 * built is built without a new save; a synchronous symbol copy racing a swap lands in the
 * version the swap commits, symbol copies close no gate, follow a context
 * reset, and on another device are that device's. Not GPU evidence
 * (tests/gpu_interpose_tu_*.cu).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hotkern/interpose.h"
#include "interpose/interpose.h"
#include "loader/core.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

static hk_runtime *rt;

/* ---- the program: two files, faked ---------------------------------------- */

/* Host stubs and shadows of a.cu (index 0), b.cu (1) and c.cu (2, a
 * library loaded later), and the runtime's kernels and device copies. */
static const char stub[3] = {0};
static int shadow[3];
static int prog_counter[3];
static cudaKernel_t kernel_of[3];
static const char *file_of[3] = {"a", "b", "c"};
static int files_known = 1;
/* nvcc's fatbin wrappers (no fatbin in them unless a test puts one); the
 * fake's handle is the wrapper. */
typedef struct wrapper {
    int magic, version;
    const void *data;
    void *filename;
} wrapper;
static wrapper fatbin[3];

/* A fatbin of one entry (no payload) whose identifier is id, as fatbinary
 * --ident writes it: 16-byte header, a 72-byte entry header with the
 * identifier's offset (64) and length at 32 and 36. */
static void fatbin_with_ident(unsigned char *b, const char *id) {
    memset(b, 0, 88);
    uint32_t magic = 0xBA55ED50u, ehs = 72, off = 64, len = (uint32_t)strlen(id);
    uint16_t ver = 1, hs = 16, kind = 2;
    uint64_t fs = 72;
    memcpy(b, &magic, 4);
    memcpy(b + 4, &ver, 2);
    memcpy(b + 6, &hs, 2);
    memcpy(b + 8, &fs, 8);
    memcpy(b + 16, &kind, 2);
    memcpy(b + 20, &ehs, 4);
    memcpy(b + 16 + 32, &off, 4);
    memcpy(b + 16 + 36, &len, 4);
    memcpy(b + 16 + 64, id, len < 8 ? len : 8);
}

/* Set: only the fatbin wrappers' addresses name files, as in an image
 * whose kernels are not file-local (their stubs are global symbols, which
 * no file heads) and that has no variables. */
static int files_by_wrapper;

static int lookup(const void *addr, char *stem, size_t n) {
    for (int i = 0; i < 3 && files_known; i++)
        if (files_by_wrapper ? addr == &fatbin[i] : addr == &stub[i] || addr == &shadow[i]) {
            snprintf(stem, n, "%s", file_of[i]);
            return 1;
        }
    return 0;
}

static int real_launches;
static cudaError_t f_klaunch(cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) {
    real_launches++;
    return (cudaError_t)fake_driver()->LaunchKernel((CUfunction)k, g.x, g.y, g.z, b.x, b.y, b.z,
                                                    (unsigned)sh, (CUstream)s, a, NULL);
}

/* cudaGetKernel, or with swapped_handles set one that answers a.cu's
 * stub with b.cu's handle and the other way round: the stub's own
 * __cudaGetKernel (f_stub_kernel) must then decide. */
static int swapped_handles;

static cudaError_t f_stub_kernel(cudaKernel_t *k, const void *f) {
    for (int i = 0; i < 3; i++)
        if (f == &stub[i] && kernel_of[i]) {
            *k = kernel_of[i];
            return cudaSuccess;
        }
    return cudaErrorInvalidDeviceFunction;
}

static cudaError_t f_get_kernel(cudaKernel_t *k, const void *f) {
    cudaError_t r = f_stub_kernel(k, f);
    if (r == cudaSuccess && swapped_handles)
        *k = *k == kernel_of[0] ? kernel_of[1] : *k == kernel_of[1] ? kernel_of[0] : *k;
    return r;
}

static cudaError_t f_launch(const void *f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) {
    cudaKernel_t k;
    if (f_get_kernel(&k, f) != cudaSuccess)
        return cudaErrorInvalidDeviceFunction;
    return f_klaunch(k, g, b, a, sh, s);
}

static int var_index(const void *sym) {
    for (int i = 0; i < 3; i++)
        if (sym == &shadow[i])
            return i;
    return -1;
}

static cudaError_t f_symbol_address(void **p, const void *sym) {
    int i = var_index(sym);
    if (i < 0)
        return cudaErrorInvalidSymbol;
    *p = &prog_counter[i];
    return cudaSuccess;
}

static cudaError_t f_to_symbol(const void *sym, const void *src, size_t n, size_t off,
                               enum cudaMemcpyKind kind) {
    int i = var_index(sym);
    if (i < 0 || off + n > sizeof(int))
        return cudaErrorInvalidSymbol;
    memcpy((char *)&prog_counter[i] + off, src, n);
    return cudaSuccess;
}

static cudaError_t f_from_symbol(void *dst, const void *sym, size_t n, size_t off,
                                 enum cudaMemcpyKind kind) {
    int i = var_index(sym);
    if (i < 0 || off + n > sizeof(int))
        return cudaErrorInvalidSymbol;
    memcpy(dst, (char *)&prog_counter[i] + off, n);
    return cudaSuccess;
}

/* A copy to a hot version's memory; with race_swap set, a swap of module
 * race_module runs on another thread meanwhile: the copy waits (up to a
 * second) for that swap to be over before it writes. */
static int race_swap;
static const char *race_module;
static _Atomic int race_done;
static pthread_t race_thread;

static void *swap_thread(void *arg) {
    hk_report rep = HK_REPORT_INIT;
    const char *src = arg;
    int err = hk_swap(rt, race_module, src, strlen(src), NULL, &rep);
    atomic_store(&race_done, err == 0 ? 1 : -1);
    hk_report_clear(&rep);
    return NULL;
}

static cudaError_t f_memcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    if (race_swap) {
        race_swap = 0;
        ck_assert_int_eq(pthread_create(&race_thread, NULL, swap_thread, fake_ptx(3, 0, 1, 0)), 0);
        for (int i = 0; i < 1000 && !atomic_load(&race_done); i++)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    memcpy(dst, src, n);
    return cudaSuccess;
}

static void **f_register_fatbin(void *w) {
    return (void **)w;
}
static void f_fathandle(void **h) {}
static void f_register_function(void **h, const char *hf, char *df, const char *dn, int tl,
                                uint3 *ti, uint3 *bi, dim3 *bd, dim3 *gd, int *ws) {}
static void f_register_var(void **fb, char *hv, char *da, const char *nm, int ext, size_t sz,
                           int cst, int glb) {}

static const hki_real fake_real = {
    .klaunch = f_klaunch,
    .klaunch_ptsz = f_klaunch,
    .launch = f_launch,
    .launch_ptsz = f_launch,
    .register_var = f_register_var,
    .to_symbol = f_to_symbol,
    .to_symbol_ptds = f_to_symbol,
    .from_symbol = f_from_symbol,
    .from_symbol_ptds = f_from_symbol,
    .symbol_address = f_symbol_address,
    .register_fatbin = f_register_fatbin,
    .register_fatbin_end = f_fathandle,
    .unregister_fatbin = f_fathandle,
    .register_function = f_register_function,
    .stub_kernel = f_stub_kernel,
    .get_kernel = f_get_kernel,
    .memcpy = f_memcpy,
};

/* ---- logs ----------------------------------------------------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char logs[64][512];
static int nlogs;

static void on_log(hk_log_level level, const char *sub, const char *msg, void *ud) {
    pthread_mutex_lock(&log_lock);
    if (nlogs < 64)
        snprintf(logs[nlogs++], sizeof logs[0], "%s", msg);
    pthread_mutex_unlock(&log_lock);
}

/* How many log lines hold every one of the strings (NULL-terminated). */
static int logged(const char *a, const char *b) {
    int n = 0;
    pthread_mutex_lock(&log_lock);
    for (int i = 0; i < nlogs; i++)
        n += strstr(logs[i], a) && (!b || strstr(logs[i], b));
    pthread_mutex_unlock(&log_lock);
    return n;
}

/* ---- setup ---------------------------------------------------------------- */

/* The program's code of file i: an image of its own with the kernel `name`
 * writing tag, registered as nvcc's constructor registers a.cu. */
static void program_file(int i, int tag, const char *ptx, const char *name) {
    const hkb_driver *d = fake_driver();
    CUlibrary lib;
    ck_assert_int_eq(
        d->LibraryLoadData(&lib, ptx ? ptx : fake_ptx(tag, 0, 1, 0), NULL, NULL, 0, NULL, NULL, 0),
        0);
    CUkernel k;
    ck_assert_int_eq(d->LibraryGetKernel(&k, lib, name), 0);
    kernel_of[i] = (cudaKernel_t)k;
    void **h = hki_register_fatbin(&fatbin[i]);
    ck_assert_ptr_eq(h, (void **)&fatbin[i]);
    hki_register_function(h, &stub[i], (char *)&stub[i], name, -1, NULL, NULL, NULL, NULL, NULL);
    hki_register_var(h, (char *)&shadow[i], "counter", "counter", 0, 4, 0, 0);
    hki_register_fatbin_end(h);
}

static void setup(void) {
    fake_init(1, 90);
    hki_real_set(&fake_real);
    hki_file_lookup_set(lookup);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.no_warm_start = 1;
    o.log = on_log;
    o.log_min_level = HK_LOG_INFO;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&rt, &o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    fake_driver()->CtxSetCurrent(hkl_ctx(rt, 0));
}

static void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
}

static void swap_ok(const char *mod, const char *src) {
    hk_report rep = HK_REPORT_INIT;
    int err = hk_swap(rt, mod, src, strlen(src), NULL, &rep);
    ck_assert_msg(err == 0, "swap refused: %s: %s", hk_strerror(err), rep.message);
    hk_report_clear(&rep);
}

/* A <<<>>> launch of file i's kernel; the tag the code that ran wrote. */
static int launch(int i) {
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    ck_assert_int_eq(hki_klaunch(0, kernel_of[i], g, b, args, 0, NULL), cudaSuccess);
    return out;
}

static void to_symbol(int i, int value) {
    ck_assert_int_eq(hki_to_symbol(0, 0, &shadow[i], &value, 4, 0, cudaMemcpyHostToDevice, NULL),
                     cudaSuccess);
}

static int from_symbol(int i) {
    int v = -1;
    ck_assert_int_eq(hki_from_symbol(0, 0, &v, &shadow[i], 4, 0, cudaMemcpyDeviceToHost, NULL),
                     cudaSuccess);
    return v;
}

/* The running version of module mod: its copy of `counter`. */
static int *hot_counter(const char *mod) {
    uint64_t p = 0;
    size_t size = 0;
    ck_assert_int_eq(hk_module_global(rt, mod, "counter", 0, &p, &size), 0);
    return (int *)(uintptr_t)p;
}

/* ---- tests ---------------------------------------------------------------- */

START_TEST(a_module_of_a_reaches_a_alone) {
    program_file(0, 1, NULL, "step");
    program_file(1, 5, NULL, "step");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    ck_assert_int_eq(launch(0), 1);
    ck_assert_int_eq(launch(1), 5);
    prog_counter[0] = 2;
    prog_counter[1] = 500;
    swap_ok("a", fake_ptx(2, 0, 1, 0)); /* a.cu, watched and edited */
    int *hot = hot_counter("a");
    ck_assert_int_eq(*hot, 2);      /* a.cu's value, not b.cu's */
    ck_assert_int_eq(launch(0), 2); /* a.cu's hot code */
    ck_assert_int_eq(launch(1), 5); /* b.cu's own */
    *hot = 2;                       /* (the fake's step counts its launches) */
    to_symbol(1, 40);               /* b.cu's cudaMemcpyToSymbol(bias, 40) */
    ck_assert_int_eq(prog_counter[1], 40);
    ck_assert_int_eq(*hot, 2);
    ck_assert_int_eq(from_symbol(1), 40);
    to_symbol(0, 7);
    ck_assert_int_eq(*hot, 7);
    ck_assert_int_eq(prog_counter[0], 7);
    /* A module of b.cu later takes b.cu's kernel and variable. */
    swap_ok("b", fake_ptx(6, 0, 1, 0));
    ck_assert_int_eq(*hot_counter("b"), 40);
    ck_assert_int_eq(launch(1), 6);
    ck_assert_int_eq(launch(0), 2);
    ck_assert_int_eq(logged("several files", NULL), 0);
}
END_TEST

/* A file whose kernels are all global (plugins, most programs' files):
 * its fatbin wrapper, nvcc's file-local __fatDeviceText, names it. */
START_TEST(the_fatbin_wrapper_names_a_file_of_global_kernels) {
    files_by_wrapper = 1;
    program_file(0, 1, NULL, "step");
    program_file(1, 5, NULL, "step");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    ck_assert_int_eq(launch(0), 1);
    ck_assert_int_eq(launch(1), 5);
    swap_ok("a", fake_ptx(2, 0, 1, 0));
    ck_assert_int_eq(launch(0), 2); /* a.cu's hot code */
    ck_assert_int_eq(launch(1), 5); /* b.cu's own */
    ck_assert_int_eq(logged("several files", NULL), 0);
}
END_TEST

START_TEST(a_module_no_file_is_routes_nothing_and_says_so_once) {
    files_known = 0; /* a stripped image: no file names */
    program_file(0, 1, NULL, "step");
    program_file(1, 5, NULL, "step");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    ck_assert_int_eq(launch(0), 1);
    ck_assert_int_eq(launch(1), 5);
    swap_ok("sim", fake_ptx(2, 0, 1, 0));
    ck_assert_int_eq(launch(0), 1);
    ck_assert_int_eq(launch(1), 5);
    to_symbol(1, 40);
    ck_assert_int_eq(*hot_counter("sim"), 0); /* neither file's value went there */
    swap_ok("sim", fake_ptx(3, 0, 1, 0));
    ck_assert_int_eq(launch(0), 1);
    ck_assert_int_eq(logged("kernel 'step' is defined in several files", "'sim'"), 1);
    ck_assert_int_eq(logged("variable 'counter' is defined in several files", NULL), 1);
}
END_TEST

/* Files unknown, but a.cu has a kernel b.cu lacks and the module has it:
 * the module is a.cu's (of the files all of whose names it has, the one
 * with the most). */
START_TEST(the_names_tell_a_module_no_file_is_named_after) {
    static const char aux_stub = 0;
    files_known = 0;
    program_file(0, 1, fake_ptx(1, 1, 1, 0), "step");
    hki_register_function((void **)&fatbin[0], &aux_stub, NULL, "aux", -1, NULL, NULL, NULL, NULL,
                          NULL);      /* a.cu: step, aux, counter */
    program_file(1, 5, NULL, "step"); /* b.cu: step, counter */
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    ck_assert_int_eq(launch(0), 1);
    ck_assert_int_eq(launch(1), 5);
    swap_ok("sim", fake_ptx(2, 1, 1, 0)); /* step, aux, counter */
    ck_assert_int_eq(launch(0), 2);
    ck_assert_int_eq(launch(1), 5);
    ck_assert_int_eq(logged("several files", NULL), 0);
}
END_TEST

/* The handle nvcc's stub took (__cudaGetKernel) names its file, even where
 * cudaGetKernel would answer otherwise. */
START_TEST(the_stubs_own_handle_names_its_file) {
    program_file(0, 1, NULL, "step");
    program_file(1, 5, NULL, "step");
    cudaKernel_t k0 = NULL, k1 = NULL;
    ck_assert_int_eq(hki_stub_kernel(&k0, &stub[0]), cudaSuccess); /* the stubs' first calls */
    ck_assert_int_eq(hki_stub_kernel(&k1, &stub[1]), cudaSuccess);
    ck_assert_ptr_eq(k0, kernel_of[0]);
    ck_assert_ptr_eq(k1, kernel_of[1]);
    swapped_handles = 1;
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    ck_assert_int_eq(launch(0), 1);
    ck_assert_int_eq(launch(1), 5);
    swap_ok("a", fake_ptx(2, 0, 1, 0));
    ck_assert_int_eq(launch(0), 2);
    ck_assert_int_eq(launch(1), 5);
}
END_TEST

START_TEST(a_reused_handle_after_dlclose_is_registered_anew) {
    program_file(0, 1, NULL, "step");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    ck_assert_int_eq(launch(0), 1);
    swap_ok("a", fake_ptx(2, 0, 1, 0));
    ck_assert_int_eq(launch(0), 2);
    int before = hki_registered();
    hki_unregister_fatbin((void **)&fatbin[0]); /* dlclose */
    /* dlopen of c.cu's library: its kernel's handle is the value a.cu's had. */
    kernel_of[2] = kernel_of[0];
    void **h = hki_register_fatbin(&fatbin[2]);
    hki_register_function(h, &stub[2], (char *)&stub[2], "step", -1, NULL, NULL, NULL, NULL, NULL);
    hki_register_fatbin_end(h);
    ck_assert_int_eq(launch(2), 1); /* the program's code, not a.cu's hot version */
    ck_assert_int_eq(hki_registered(), before + 1);
    swap_ok("c", fake_ptx(4, 0, 1, 0));
    ck_assert_int_eq(launch(2), 4);
}
END_TEST

START_TEST(anonymous_namespace_kernels_are_said_never_hot) {
    const char *ptx = "// tag: 1\n.version 8.0\n.target sm_90\n.address_size 64\n"
                      ".visible .entry _ZN12_GLOBAL__N_14stepEPij(.param .u64 out, .param .u32 n)"
                      "\n{\n ret;\n}\n";
    program_file(0, 1, ptx, "_ZN12_GLOBAL__N_14stepEPij");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    ck_assert_int_eq(launch(0), 1);
    ck_assert_int_eq(launch(0), 1);
    ck_assert_int_eq(logged("_ZN12_GLOBAL__N_14stepEPij", "anonymous namespace"), 1);
}
END_TEST

/* HOTKERN_RESTORE=1, or a push before the program's first launch: the
 * version is committed before the variable is told to the engine. */
START_TEST(a_version_committed_before_the_variable_gets_later_writes) {
    swap_ok("a", fake_ptx(2, 0, 1, 0));
    int *hot = hot_counter("a");
    *hot = 99; /* the restored version's own state */
    program_file(0, 1, NULL, "step");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    ck_assert_int_eq(*hot, 99); /* kept: it is the version's */
    to_symbol(0, 7);
    ck_assert_int_eq(*hot, 7);
    ck_assert_int_eq(from_symbol(0), 7);
    ck_assert_int_eq(launch(0), 2);
}
END_TEST

START_TEST(a_symbol_copy_racing_a_swap_lands_in_the_new_version) {
    program_file(0, 1, NULL, "step");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    swap_ok("a", fake_ptx(2, 0, 1, 0));
    race_module = "a";
    race_swap = 1; /* v3's swap runs while this copy is under way */
    to_symbol(0, 42);
    pthread_join(race_thread, NULL);
    ck_assert_int_eq(atomic_load(&race_done), 1);
    ck_assert_int_eq(*hot_counter("a"), 42); /* v3 has it */
    ck_assert_int_eq(from_symbol(0), 42);
}
END_TEST

/* After a context reset reloads the module (a new version, not through a
 * commit), the host's writes reach the reloaded version's copy. */
START_TEST(symbol_copies_follow_a_reset) {
    hk_runtime_destroy(rt);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.no_warm_start = 1;
    o.loader = HK_LOADER_MODULE;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), 0);
    fake_driver()->CtxSetCurrent(hkl_ctx(rt, 0));
    program_file(0, 1, NULL, "step");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    swap_ok("a", fake_ptx(2, 0, 1, 0));
    to_symbol(0, 7);
    ck_assert_int_eq(*hot_counter("a"), 7);
    fake_reset_device(0);
    fake_driver()->CtxSetCurrent(hkl_ctx(rt, 0));
    swap_ok("other", "// tag: 5\n.version 8.0\n.target sm_90\n.address_size 64\n"
                     ".visible .entry aux(.param .u64 p)\n{\n ret;\n}\n"); /* notices it */
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.context_resets, 1);
    to_symbol(0, 9);
    ck_assert_int_eq(*hot_counter("a"), 9);
    ck_assert_int_eq(from_symbol(0), 9);
    hk_report_clear(&rep);
}
END_TEST

/* After cudaSetDevice(1) the program's copies are device 1's: hot versions
 * run on device 0 only, so its copy there is neither written nor read. */
START_TEST(symbol_copies_on_another_device_are_that_devices) {
    hk_runtime_destroy(rt);
    fake_init(2, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    o.no_warm_start = 1;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), 0);
    fake_driver()->CtxSetCurrent(hkl_ctx(rt, 0));
    program_file(0, 1, NULL, "step");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    swap_ok("a", fake_ptx(2, 0, 1, 0));
    to_symbol(0, 7);
    int *hot = hot_counter("a");
    ck_assert_int_eq(*hot, 7);
    CUdevice dev1;
    CUcontext ctx1;
    ck_assert_int_eq(fake_driver()->DeviceGet(&dev1, 1), CUDA_SUCCESS);
    ck_assert_int_eq(fake_driver()->DevicePrimaryCtxRetain(&ctx1, dev1), CUDA_SUCCESS);
    ck_assert_ptr_ne(ctx1, hkl_ctx(rt, 0));
    fake_driver()->CtxSetCurrent(ctx1); /* cudaSetDevice(1) */
    to_symbol(0, 9);
    ck_assert_int_eq(prog_counter[0], 9);
    ck_assert_int_eq(*hot, 7);
    *hot = 70;
    ck_assert_int_eq(from_symbol(0), 9);
    void *addr = NULL;
    ck_assert_int_eq(hki_symbol_address(&addr, &shadow[0]), cudaSuccess);
    ck_assert_ptr_eq(addr, &prog_counter[0]);
    fake_driver()->CtxSetCurrent(hkl_ctx(rt, 0)); /* back on device 0 */
    ck_assert_int_eq(from_symbol(0), 70);
    hk_report_clear(&rep);
}
END_TEST

/* A symbol copy is a launch's cost: no gate closing, no engine lock. */
START_TEST(symbol_copies_leave_the_gate_open) {
    program_file(0, 1, NULL, "step");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    swap_ok("a", fake_ptx(2, 0, 1, 0)); /* the first version: nothing to reclaim */
    uint64_t closes = atomic_load(&rt->gate.closes);
    for (int i = 0; i < 10; i++) {
        to_symbol(0, i);
        ck_assert_int_eq(from_symbol(0), i);
    }
    ck_assert_uint_eq(atomic_load(&rt->gate.closes), closes);
    ck_assert_int_eq(*hot_counter("a"), 9);
}
END_TEST

static const char *TEMPLATE_SRC =
    "template <typename T> __global__ void scale(T *x, T a, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] *= a;\n"
    "}\n";

/* The program first launches scale<int> after the module's source was
 * built (for scale<float>): the source is built again with the new
 * instance, without a new save. Real NVRTC builds. */
START_TEST(a_template_instance_launched_late_follows_without_a_save) {
    const char *ptx = "// tag: 1\n.version 8.0\n.target sm_90\n.address_size 64\n"
                      ".visible .entry _Z5scaleIfEvPT_S0_i(.param .u64 x, .param .f32 a, "
                      ".param .u32 n)\n{\n ret;\n}\n"
                      ".visible .entry _Z5scaleIiEvPT_S0_i(.param .u64 x, .param .u32 a, "
                      ".param .u32 n)\n{\n ret;\n}\n";
    program_file(0, 1, ptx, "_Z5scaleIfEvPT_S0_i");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    launch(0);
    ck_assert_int_eq(real_launches, 1);
    hk_report rep = HK_REPORT_INIT;
    int err = hk_swap(rt, "kernels", TEMPLATE_SRC, strlen(TEMPLATE_SRC), NULL, &rep);
    ck_assert_msg(err == 0, "%s: %s", hk_strerror(err), rep.message);
    launch(0);
    ck_assert_int_eq(real_launches, 1); /* scale<float> is hot */
    /* scale<int>, first launched now. */
    const hkb_driver *d = fake_driver();
    CUlibrary lib;
    CUkernel ik;
    ck_assert_int_eq(d->LibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0), 0);
    ck_assert_int_eq(d->LibraryGetKernel(&ik, lib, "_Z5scaleIiEvPT_S0_i"), 0);
    kernel_of[1] = (cudaKernel_t)ik;
    launch(1);
    ck_assert_int_eq(real_launches, 2);
    ck_assert_int_eq(hk_wait_idle(rt, 60000), 0);
    /* The rebuild waits for an idle moment of the program's (automatic
     * safe points): one comes. */
    hk_safe_point(rt);
    launch(1);
    ck_assert_int_eq(real_launches, 2); /* scale<int> is hot too */
    launch(0);
    ck_assert_int_eq(real_launches, 2);
    ck_assert_int_eq(logged("module 'kernels' built again", NULL), 1);
    hk_report_clear(&rep);
}
END_TEST

/* A stripped image (no symbols) whose fatbins carry identifiers: the
 * identifiers name the files. */
START_TEST(fatbin_identifiers_name_the_files_of_a_stripped_image) {
    files_known = 0;
    static unsigned char fa[88], fb[88];
    fatbin_with_ident(fa, "src/a.cu");
    fatbin_with_ident(fb, "b.cu");
    fatbin[0] = (wrapper){0x466243b1, 1, fa, NULL};
    fatbin[1] = (wrapper){0x466243b1, 1, fb, NULL};
    char out[HKI_STEM_MAX];
    ck_assert_int_eq(hki_fatbin_ident(fa, sizeof fa, out, sizeof out), 1);
    ck_assert_str_eq(out, "a");
    ck_assert_int_eq(hki_fatbin_ident(fa, 87, out, sizeof out), -1); /* cut short */
    program_file(0, 1, NULL, "step");
    program_file(1, 5, NULL, "step");
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    ck_assert_int_eq(launch(0), 1);
    ck_assert_int_eq(launch(1), 5);
    swap_ok("a", fake_ptx(2, 0, 1, 0));
    ck_assert_int_eq(launch(0), 2);
    ck_assert_int_eq(launch(1), 5);
    ck_assert_int_eq(logged("several files", NULL), 0);
}
END_TEST

START_TEST(elf_symbols_name_a_static_functions_file) {
    /* The real lookup, on this test's own image: its static functions are
     * locals of the object "cpu_interpose_tu.c". */
    hki_file_lookup_set(NULL);
    files_known = 0;
    program_file(0, 1, NULL, "step");
    /* stub[] is a static object of this file. */
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    ck_assert_int_eq(launch(0), 1);
    swap_ok("cpu_interpose_tu", fake_ptx(2, 0, 1, 0));
    ck_assert_int_eq(launch(0), 2);
    char out[64];
    ck_assert_int_eq(hki_elf_file_of((const unsigned char *)"\177ELF", 4, 0, out, sizeof out), -1);
    /* nvcc's host objects: named after a temporary file, or with -keep. */
    struct {
        const char *path, *stem;
    } cases[] = {
        {"tmpxft_0000330c_00000000-10_b.cudafe1.cpp", "b"}, {"a.cudafe1.cpp", "a"},
        {"/src/particles.v2.cudafe1.cpp", "particles"},     {"tmpxft_junk", "tmpxft_junk"},
        {"cpu_interpose_tu.c", "cpu_interpose_tu"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hki_file_stem(cases[i].path, out, sizeof out);
        ck_assert_str_eq(out, cases[i].stem);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("interpose identity (fake driver)");
    TCase *tc = tcase_create("identity");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, a_module_of_a_reaches_a_alone);
    tcase_add_test(tc, the_fatbin_wrapper_names_a_file_of_global_kernels);
    tcase_add_test(tc, a_module_no_file_is_routes_nothing_and_says_so_once);
    tcase_add_test(tc, the_names_tell_a_module_no_file_is_named_after);
    tcase_add_test(tc, the_stubs_own_handle_names_its_file);
    tcase_add_test(tc, a_reused_handle_after_dlclose_is_registered_anew);
    tcase_add_test(tc, anonymous_namespace_kernels_are_said_never_hot);
    tcase_add_test(tc, a_version_committed_before_the_variable_gets_later_writes);
    tcase_add_test(tc, a_symbol_copy_racing_a_swap_lands_in_the_new_version);
    tcase_add_test(tc, symbol_copies_leave_the_gate_open);
    tcase_add_test(tc, symbol_copies_follow_a_reset);
    tcase_add_test(tc, symbol_copies_on_another_device_are_that_devices);
    tcase_add_test(tc, a_template_instance_launched_late_follows_without_a_save);
    tcase_add_test(tc, fatbin_identifiers_name_the_files_of_a_stripped_image);
    tcase_add_test(tc, elf_symbols_name_a_static_functions_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

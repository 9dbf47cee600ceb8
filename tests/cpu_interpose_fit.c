/*
 * A hot version never costs the program a launch (interpose/route.c,
 * interpose/attrs.c, loader/fit.c, loader/expect.c) on the fake driver,
 * whose launches fail as the device's do: a block larger than the
 * function's limit for its registers ("// regs: N" in an image), more
 * dynamic shared memory than its attribute allows, a cooperative grid that
 * cannot be co-resident. Checked: the program's cudaFuncSetAttribute and
 * cudaFuncSetCacheConfig reach every hot version (a 64 KB launch keeps
 * working); cudaFuncGetAttributes answers for the version that runs; a
 * version that cannot take the program's block size or cooperative grid is
 * refused, naming kernel, configuration and limit; a hot launch that fails
 * anyway runs the program's kernel, is counted and emitted, and sends the
 * module back to the program's code until its next commit; cooperative
 * launches route like <<<>>>; a module of 100 program kernels; more handles
 * than the table holds. None of this is GPU evidence (tests/gpu_interpose.cu
 * is).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hotkern/interpose.h"
#include "interpose/interpose.h"
#include "loader/core.h"
#include "loader/version.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

static hk_runtime *rt;

/* ---- the program's runtime, faked ---------------------------------------- */

static atomic_int real_launches, real_coop;

/* Function pointers stand for kernels: stubs[i] is kernel_of[i]; every
 * address inside many[] stands for kernel_of[0]. */
#define NSTUB 128
static char stubs[NSTUB];
static cudaKernel_t kernel_of[NSTUB];
#define NMANY 17000
static char many[NMANY];

static cudaError_t f_get_kernel(cudaKernel_t *k, const void *f) {
    const char *p = f;
    if (p >= stubs && p < stubs + NSTUB && kernel_of[p - stubs]) {
        *k = kernel_of[p - stubs];
        return cudaSuccess;
    }
    if (p >= many && p < many + NMANY) {
        *k = kernel_of[0];
        return cudaSuccess;
    }
    return cudaErrorInvalidDeviceFunction;
}

static cudaError_t f_klaunch(cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) {
    real_launches++;
    return (cudaError_t)fake_driver()->LaunchKernel((CUfunction)k, g.x, g.y, g.z, b.x, b.y, b.z,
                                                    (unsigned)sh, (CUstream)s, a, NULL);
}

static cudaError_t f_launch(const void *f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) {
    cudaKernel_t k;
    if (f_get_kernel(&k, f) != cudaSuccess)
        return cudaErrorInvalidDeviceFunction;
    return f_klaunch(k, g, b, a, sh, s);
}

static cudaError_t f_coop(const void *f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) {
    cudaKernel_t k;
    if (f_get_kernel(&k, f) != cudaSuccess)
        return cudaErrorInvalidDeviceFunction;
    real_coop++;
    CUlaunchAttribute at = {.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE};
    at.value.cooperative = 1;
    CUlaunchConfig c = {.gridDimX = g.x,
                        .gridDimY = g.y,
                        .gridDimZ = g.z,
                        .blockDimX = b.x,
                        .blockDimY = b.y,
                        .blockDimZ = b.z,
                        .sharedMemBytes = (unsigned)sh,
                        .hStream = (CUstream)s,
                        .attrs = &at,
                        .numAttrs = 1};
    return (cudaError_t)fake_driver()->LaunchKernelEx(&c, (CUfunction)k, a, NULL);
}

static cudaError_t f_set_attr(const void *f, enum cudaFuncAttribute at, int v) {
    cudaKernel_t k;
    if (f_get_kernel(&k, f) != cudaSuccess)
        return cudaErrorInvalidDeviceFunction;
    return (cudaError_t)fake_driver()->KernelSetAttribute((CUfunction_attribute)at, v, (CUkernel)k,
                                                          0);
}

static cudaError_t f_set_cache(const void *f, enum cudaFuncCache c) {
    cudaKernel_t k;
    if (f_get_kernel(&k, f) != cudaSuccess)
        return cudaErrorInvalidDeviceFunction;
    return (cudaError_t)fake_driver()->KernelSetCacheConfig((CUkernel)k, (CUfunc_cache)c, 0);
}

static cudaError_t f_get_attrs(struct cudaFuncAttributes *p, const void *f) {
    cudaKernel_t k;
    if (f_get_kernel(&k, f) != cudaSuccess)
        return cudaErrorInvalidDeviceFunction;
    memset(p, 0, sizeof *p);
    int v = 0;
    fake_driver()->KernelGetAttribute(&v, CU_FUNC_ATTRIBUTE_NUM_REGS, (CUkernel)k, 0);
    p->numRegs = v;
    fake_driver()->KernelGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, (CUkernel)k, 0);
    p->maxThreadsPerBlock = v;
    return cudaSuccess;
}

static cudaError_t f_kernel_set_attr(cudaKernel_t k, enum cudaFuncAttribute at, int v, int dev) {
    return (cudaError_t)fake_driver()->KernelSetAttribute((CUfunction_attribute)at, v, (CUkernel)k,
                                                          dev);
}

static cudaError_t f_occupancy(int *n, const void *f, int block, size_t smem) {
    cudaKernel_t k;
    if (f_get_kernel(&k, f) != cudaSuccess)
        return cudaErrorInvalidDeviceFunction;
    return (cudaError_t)fake_driver()->OccupancyMaxActiveBlocksPerMultiprocessor(n, (CUfunction)k,
                                                                                 block, smem);
}

static const hki_real fake_real = {
    .klaunch = f_klaunch,
    .klaunch_ptsz = f_klaunch,
    .launch = f_launch,
    .launch_ptsz = f_launch,
    .coop_launch = f_coop,
    .coop_launch_ptsz = f_coop,
    .func_set_attribute = f_set_attr,
    .func_set_cache_config = f_set_cache,
    .func_get_attributes = f_get_attrs,
    .kernel_set_attribute = f_kernel_set_attr,
    .occupancy = f_occupancy,
    .get_kernel = f_get_kernel,
};

/* ---- setup ---------------------------------------------------------------- */

static int fallbacks_seen;
static char fallback_kernel[128];

static void on_event(const hk_event *ev, void *ud) {
    if (ev->kind != HK_EVENT_FALLBACK)
        return;
    fallbacks_seen++;
    snprintf(fallback_kernel, sizeof fallback_kernel, "%s", ev->report ? ev->report->kernel : "");
}

static void setup(void) {
    fake_init(1, 90);
    hki_real_set(&fake_real);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.no_warm_start = 1;
    o.on_event = on_event;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&rt, &o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    fake_driver()->CtxSetCurrent(hkl_ctx(rt, 0));
    ck_assert_int_eq(hk_interpose_attach(rt), 0);
    real_launches = real_coop = fallbacks_seen = 0;
}

static void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
}

/* The program's own code: a fake image and its kernels, stubs[i] standing
 * for the i-th name. */
static void program(const char *ptx, const char *const *names, int n) {
    const hkb_driver *d = fake_driver();
    CUlibrary lib;
    ck_assert_int_eq(d->LibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0), 0);
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(d->LibraryGetKernel((CUkernel *)&kernel_of[i], lib, names[i]), 0);
}

static int swap(const char *mod, const char *src, hk_report *rep) {
    return hk_swap(rt, mod, src, strlen(src), NULL, rep);
}

static void swap_ok(const char *mod, const char *src) {
    hk_report rep = HK_REPORT_INIT;
    int err = swap(mod, src, &rep);
    ck_assert_msg(err == 0, "swap refused: %s: %s", hk_strerror(err), rep.message);
    hk_report_clear(&rep);
}

/* An image of fake_ptx with a first line (regs, shared). */
static const char *with(const char *line, const char *ptx) {
    static char buf[4][4096];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "%s\n%s", line, ptx);
    return b;
}

/* cudaLaunchKernel of stubs[i] with blocks of `threads` and `shm` bytes of
 * dynamic shared memory: the call's error, the tag of the code that ran in
 * *tag (-1: none). */
static cudaError_t launch_cfg(int i, unsigned threads, size_t shm, int *tag) {
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    dim3 g = {2, 1, 1}, b = {threads, 1, 1};
    cudaError_t r = hki_launch(0, &stubs[i], g, b, args, shm, NULL);
    *tag = out;
    return r;
}

static int launch_tag(int i, unsigned threads, size_t shm) {
    int tag;
    cudaError_t r = launch_cfg(i, threads, shm, &tag);
    ck_assert_msg(r == cudaSuccess, "launch of %d threads, %zu bytes: error %d", threads, shm, r);
    return tag;
}

static const char *const STEP[] = {"step"};
static const char *const STEP_AUX[] = {"step", "aux"};

/* ---- attributes ------------------------------------------------------------ */

START_TEST(attributes_reach_every_hot_version) {
    program(fake_ptx(1, 0, 0, 0), STEP, 1);
    ck_assert_int_eq(
        hki_func_set_attribute(&stubs[0], cudaFuncAttributeMaxDynamicSharedMemorySize, 65536),
        cudaSuccess);
    ck_assert_int_eq(launch_tag(0, 256, 65536), 1); /* the program's own code */
    swap_ok("sim", fake_ptx(2, 0, 0, 0));
    ck_assert_int_eq(launch_tag(0, 256, 65536), 2); /* hot, and it took the attribute */
    /* A setting made while a hot version runs reaches it and the next. */
    ck_assert_int_eq(hki_func_set_cache_config(&stubs[0], cudaFuncCachePreferShared), cudaSuccess);
    hk_kernel *h = hkl_expect_handle(hki_expect_of(&stubs[0], 1));
    ck_assert_ptr_nonnull(h);
    void *fn = NULL;
    ck_assert_int_eq(hk_kernel_function(h, &fn), 0);
    ck_assert_int_eq(fake_kernel_attr(fn, -1), CU_FUNC_CACHE_PREFER_SHARED);
    swap_ok("sim", fake_ptx(3, 0, 0, 0));
    ck_assert_int_eq(launch_tag(0, 256, 65536), 3);
    ck_assert_int_eq(hk_kernel_function(h, &fn), 0);
    ck_assert_int_eq(fake_kernel_attr(fn, -1), CU_FUNC_CACHE_PREFER_SHARED);
    ck_assert_int_eq(fake_kernel_attr(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), 65536);
    ck_assert_int_eq(real_launches, 1);
    ck_assert_int_eq(fallbacks_seen, 0);
    /* A version whose static shared memory leaves no room for the program's
     * 64 KB is refused, and the running one stays. */
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap("sim", with("// shared: 200000", fake_ptx(4, 0, 0, 0)), &rep),
                     HK_ERR_ATTRIBUTE);
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_int_eq(launch_tag(0, 256, 65536), 3);
    hk_report_clear(&rep);
}
END_TEST

/* A setting the running hot version cannot take sends its module back to
 * the program's code; the next version that takes it runs again. */
START_TEST(setting_the_hot_version_refuses_falls_back) {
    program(fake_ptx(1, 0, 0, 0), STEP, 1);
    ck_assert_int_eq(launch_tag(0, 256, 0), 1);
    swap_ok("sim", with("// shared: 200000", fake_ptx(2, 0, 0, 0)));
    ck_assert_int_eq(launch_tag(0, 256, 0), 2);
    ck_assert_int_eq(
        hki_func_set_attribute(&stubs[0], cudaFuncAttributeMaxDynamicSharedMemorySize, 65536),
        cudaSuccess); /* the program's kernel took it */
    ck_assert_int_eq(fallbacks_seen, 1);
    ck_assert_str_eq(fallback_kernel, "step");
    ck_assert_int_eq(launch_tag(0, 256, 65536), 1); /* the program's code, directly */
    ck_assert_int_eq(fallbacks_seen, 1);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap("sim", with("// shared: 200000", fake_ptx(3, 0, 0, 0)), &rep),
                     HK_ERR_ATTRIBUTE);
    swap_ok("sim", fake_ptx(4, 0, 0, 0));
    ck_assert_int_eq(launch_tag(0, 256, 65536), 4);
    hk_report_clear(&rep);
}
END_TEST

/* cudaKernelSetAttributeForDevice (device 0) reaches hot versions too. */
START_TEST(kernel_attributes_for_the_device_follow) {
    program(fake_ptx(1, 0, 0, 0), STEP, 1);
    ck_assert_int_eq(hki_kernel_set_attribute(
                         kernel_of[0], cudaFuncAttributeMaxDynamicSharedMemorySize, 65536, 0),
                     cudaSuccess);
    int tag;
    ck_assert_int_eq(launch_cfg(0, 64, 65536, &tag), cudaSuccess);
    ck_assert_int_eq(tag, 1);
    swap_ok("sim", fake_ptx(2, 0, 0, 0));
    ck_assert_int_eq(launch_cfg(0, 64, 65536, &tag), cudaSuccess);
    ck_assert_int_eq(tag, 2);
    ck_assert_int_eq(fallbacks_seen, 0);
}
END_TEST

/* cudaFuncGetAttributes and the occupancy call describe the version that
 * runs. */
START_TEST(function_attributes_describe_the_running_version) {
    program(fake_ptx(1, 0, 0, 0), STEP, 1); /* 16 registers */
    struct cudaFuncAttributes a;
    ck_assert_int_eq(hki_func_get_attributes(&a, &stubs[0]), cudaSuccess);
    ck_assert_int_eq(a.numRegs, 16);
    int n0 = 0;
    ck_assert_int_eq(hki_occupancy(&n0, &stubs[0], 1024, 0), cudaSuccess);
    ck_assert_int_eq(n0, 2);
    launch_tag(0, 32, 0);
    swap_ok("sim", with("// regs: 40", fake_ptx(2, 0, 0, 0)));
    ck_assert_int_eq(hki_func_get_attributes(&a, &stubs[0]), cudaSuccess);
    ck_assert_int_eq(a.numRegs, 40);
    ck_assert_int_eq(a.maxThreadsPerBlock, 1024);
    /* 1024 threads: 2 blocks a multiprocessor at 16 registers, 1 at 40. */
    int n = 0;
    ck_assert_int_eq(hki_occupancy(&n, &stubs[0], 1024, 0), cudaSuccess);
    ck_assert_int_eq(n, 1);
}
END_TEST

/* ---- the launchability check ---------------------------------------------- */

START_TEST(version_that_cannot_take_the_block_size_is_refused) {
    program(fake_ptx(1, 0, 0, 0), STEP, 1);
    ck_assert_int_eq(launch_tag(0, 1024, 0), 1);
    hk_report rep = HK_REPORT_INIT;
    /* 72 registers a thread: at most 896 threads a block. */
    ck_assert_int_eq(swap("sim", with("// regs: 72", fake_ptx(2, 0, 0, 0)), &rep),
                     HK_ERR_ATTRIBUTE);
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_msg(strstr(rep.message, "blocks of 1024 threads") &&
                      strstr(rep.message, "at most 896 threads a block (72 registers"),
                  "%s", rep.message);
    ck_assert_int_eq(launch_tag(0, 1024, 0), 1); /* the program's own code */
    ck_assert_ptr_null(hkl_module_find(rt, "sim"));
    swap_ok("sim", with("// regs: 32", fake_ptx(3, 0, 0, 0)));
    ck_assert_int_eq(launch_tag(0, 1024, 0), 3);
    hk_report_clear(&rep);
}
END_TEST

/* ---- the fallback ------------------------------------------------------------ */

START_TEST(failed_hot_launch_runs_the_program_kernel) {
    program(fake_ptx(1, 1, 0, 0), STEP_AUX, 2);
    ck_assert_int_eq(launch_tag(0, 32, 0), 1);
    ck_assert_int_eq(launch_tag(1, 32, 0), 1);
    /* Fits every launch seen so far. */
    swap_ok("sim", with("// regs: 72", fake_ptx(2, 1, 0, 0)));
    ck_assert_int_eq(launch_tag(0, 32, 0), 2);
    ck_assert_int_eq(launch_tag(1, 32, 0), 2);
    int before = real_launches;
    /* The first 1024-thread launch does not fit the hot version: the
     * program's kernel runs it, in the same call. */
    ck_assert_int_eq(launch_tag(0, 1024, 0), 1);
    ck_assert_int_eq(real_launches, before + 1);
    ck_assert_int_eq(fallbacks_seen, 1);
    ck_assert_str_eq(fallback_kernel, "step");
    hk_stats st = HK_STATS_INIT;
    ck_assert_int_eq(hk_stats_get(rt, &st), 0);
    ck_assert_uint_eq(st.program_fallbacks, 1);
    /* The whole module runs the program's code now, both kernels. */
    ck_assert_int_eq(launch_tag(0, 32, 0), 1);
    ck_assert_int_eq(launch_tag(1, 32, 0), 1);
    ck_assert_int_eq(fallbacks_seen, 1);
    /* The next version is checked against the launch that failed... */
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap("sim", with("// regs: 72", fake_ptx(3, 1, 0, 0)), &rep),
                     HK_ERR_ATTRIBUTE);
    ck_assert_int_eq(launch_tag(1, 32, 0), 1);
    /* ...and one that fits takes both kernels back. */
    swap_ok("sim", fake_ptx(4, 1, 0, 0));
    ck_assert_int_eq(launch_tag(0, 1024, 0), 4);
    ck_assert_int_eq(launch_tag(1, 32, 0), 4);
    hk_report_clear(&rep);
}
END_TEST

/* A fallback and the next commit while other threads launch both kernels:
 * every launch of theirs runs, from the program's code or a committed
 * version. */
static atomic_int stop, bad_launches, done;

static void *launcher(void *arg) {
    fake_driver()->CtxSetCurrent(hkl_ctx(rt, 0));
    int i = (int)(intptr_t)arg;
    while (!atomic_load(&stop)) {
        int tag;
        cudaError_t r = launch_cfg(i % 2, 32, 0, &tag);
        if (r != cudaSuccess || (tag != 1 && tag != 2 && tag != 4))
            atomic_fetch_add(&bad_launches, 1);
        atomic_fetch_add(&done, 1);
    }
    return NULL;
}

static void wait_launches(int n) {
    int until = atomic_load(&done) + n;
    while (atomic_load(&done) < until)
        usleep(100);
}

START_TEST(fallback_while_other_threads_launch) {
    program(fake_ptx(1, 1, 0, 0), STEP_AUX, 2);
    launch_tag(0, 32, 0);
    launch_tag(1, 32, 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, launcher, (void *)(intptr_t)i), 0);
    wait_launches(200);
    swap_ok("sim", with("// regs: 72", fake_ptx(2, 1, 0, 0)));
    wait_launches(200);
    ck_assert_int_eq(launch_tag(0, 1024, 0), 1); /* falls back */
    wait_launches(200);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap("sim", with("// regs: 72", fake_ptx(3, 1, 0, 0)), &rep),
                     HK_ERR_ATTRIBUTE);
    swap_ok("sim", fake_ptx(4, 1, 0, 0));
    wait_launches(200);
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    ck_assert_int_eq(atomic_load(&bad_launches), 0);
    ck_assert_int_eq(fallbacks_seen, 1);
    ck_assert_int_eq(launch_tag(0, 1024, 0), 4);
    ck_assert_int_eq(launch_tag(1, 32, 0), 4);
    hk_report_clear(&rep);
}
END_TEST

/* When the program's own launch fails too, its error is the call's. */
START_TEST(fallback_that_fails_returns_the_program_error) {
    program(fake_ptx(1, 0, 0, 0), STEP, 1);
    launch_tag(0, 32, 0);
    swap_ok("sim", fake_ptx(2, 0, 0, 0));
    int tag;
    /* More dynamic shared memory than either kernel was given. */
    cudaError_t r = launch_cfg(0, 32, 65536, &tag);
    ck_assert_int_eq(r, (cudaError_t)CUDA_ERROR_INVALID_VALUE);
    ck_assert_int_eq(tag, -1);
    ck_assert_int_eq(fallbacks_seen, 1);
}
END_TEST

/* ---- cooperative launches --------------------------------------------------- */

static cudaError_t coop(int i, unsigned blocks, unsigned threads, int *tag) {
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    dim3 g = {blocks, 1, 1}, b = {threads, 1, 1};
    cudaError_t r = hki_coop_launch(0, &stubs[i], g, b, args, 0, NULL);
    *tag = out;
    return r;
}

START_TEST(cooperative_launches_route_like_chevrons) {
    program(fake_ptx(1, 0, 0, 0), STEP, 1);
    int tag;
    /* 16 registers, 1024 threads: 2 blocks a multiprocessor, 264 in all. */
    ck_assert_int_eq(coop(0, 264, 1024, &tag), cudaSuccess);
    ck_assert_int_eq(tag, 1);
    ck_assert_int_eq(real_coop, 1);
    swap_ok("sim", fake_ptx(2, 0, 0, 0));
    ck_assert_int_eq(coop(0, 264, 1024, &tag), cudaSuccess);
    ck_assert_int_eq(tag, 2);
    ck_assert_int_eq(real_coop, 1);
    int ids[4];
    ck_assert_int_eq(fake_last_launch_ex(ids, 4), 1);
    ck_assert_int_eq(ids[0], CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
    /* 40 registers: one block a multiprocessor, 132 co-resident: refused. */
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap("sim", with("// regs: 40", fake_ptx(3, 0, 0, 0)), &rep),
                     HK_ERR_ATTRIBUTE);
    ck_assert_msg(strstr(rep.message, "cooperatively with 264 blocks of 1024 threads") &&
                      strstr(rep.message, "at most 132 blocks"),
                  "%s", rep.message);
    ck_assert_int_eq(coop(0, 264, 1024, &tag), cudaSuccess);
    ck_assert_int_eq(tag, 2);
    hk_report_clear(&rep);
}
END_TEST

/* ---- many kernels, many handles ---------------------------------------------- */

#define NK 100

/* PTX with kernels k0..k{NK-1}(u64 out[, u64 more] for the last when
 * odd_last), all tagged tag. */
static char *many_ptx(int tag, int odd_last) {
    size_t cap = 64 * 1024, n = 0;
    char *b = malloc(cap);
    n += (size_t)snprintf(b + n, cap - n,
                          "// tag: %d\n.version 8.0\n.target sm_90\n.address_size 64\n", tag);
    for (int i = 0; i < NK; i++)
        n += (size_t)snprintf(b + n, cap - n, ".visible .entry k%d(.param .u64 p%s)\n{\n ret;\n}\n",
                              i, odd_last && i == NK - 1 ? ", .param .u64 q" : "");
    return b;
}

static const char *const *k_names(void) {
    static char names[NK][16];
    static const char *v[NK];
    for (int i = 0; i < NK; i++) {
        snprintf(names[i], sizeof names[i], "k%d", i);
        v[i] = names[i];
    }
    return v;
}

START_TEST(module_of_100_program_kernels) {
    char *prog = many_ptx(1, 0);
    program(prog, k_names(), NK);
    for (int i = 0; i < NK; i++)
        ck_assert_int_eq(launch_tag(i, 32, 0), 1);
    char *hot = many_ptx(2, 0);
    swap_ok("many", hot);
    for (int i = 0; i < NK; i++)
        ck_assert_msg(launch_tag(i, 32, 0) == 2, "k%d runs the program's code", i);
    free(prog);
    free(hot);
}
END_TEST

START_TEST(refused_first_version_leaves_no_handles) {
    char *prog = many_ptx(1, 0);
    program(prog, k_names(), NK);
    for (int i = 0; i < NK; i++)
        launch_tag(i, 32, 0);
    char *bad = many_ptx(2, 1); /* k99 takes another argument */
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap("many", bad, &rep), HK_ERR_LAYOUT);
    ck_assert_str_eq(rep.kernel, "k99");
    ck_assert_ptr_null(hkl_module_find(rt, "many")); /* no handle kept it */
    char *good = many_ptx(3, 0);
    swap_ok("many", good);
    hkl_module *m = hkl_module_find(rt, "many");
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(m->nkernels, NK);
    ck_assert_int_eq(launch_tag(NK - 1, 32, 0), 3);
    hk_report_clear(&rep);
    free(prog);
    free(bad);
    free(good);
}
END_TEST

/* More handles than the table's slots: each registers once. */
START_TEST(handles_past_the_table_register_once) {
    program(fake_ptx(1, 0, 0, 0), STEP, 1);
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    dim3 one = {1, 1, 1};
    for (int i = 0; i < NMANY; i++)
        ck_assert_int_eq(hki_launch(0, &many[i], one, one, args, 0, NULL), cudaSuccess);
    int registered = hki_registered();
    ck_assert_int_ge(registered, NMANY);
    for (int i = 0; i < NMANY; i++)
        ck_assert_int_eq(hki_launch(0, &many[i], one, one, args, 0, NULL), cudaSuccess);
    ck_assert_int_eq(hki_registered(), registered);
    swap_ok("sim", fake_ptx(2, 0, 0, 0));
    out = -1;
    ck_assert_int_eq(hki_launch(0, &many[NMANY - 1], one, one, args, 0, NULL), cudaSuccess);
    ck_assert_int_eq(out, 2);
    ck_assert_int_eq(hki_registered(), registered);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("interpose fit (fake driver)");
    TCase *tc = tcase_create("fit");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, attributes_reach_every_hot_version);
    tcase_add_test(tc, setting_the_hot_version_refuses_falls_back);
    tcase_add_test(tc, kernel_attributes_for_the_device_follow);
    tcase_add_test(tc, function_attributes_describe_the_running_version);
    tcase_add_test(tc, version_that_cannot_take_the_block_size_is_refused);
    tcase_add_test(tc, failed_hot_launch_runs_the_program_kernel);
    tcase_add_test(tc, fallback_while_other_threads_launch);
    tcase_add_test(tc, fallback_that_fails_returns_the_program_error);
    tcase_add_test(tc, cooperative_launches_route_like_chevrons);
    tcase_add_test(tc, module_of_100_program_kernels);
    tcase_add_test(tc, refused_first_version_leaves_no_handles);
    tcase_add_test(tc, handles_past_the_table_register_once);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

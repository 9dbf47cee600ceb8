/*
 * A runtime on the fake driver for the C++ suites, with its launches
 * recorded (fake_runtime.h). The driver table is the fake's, copied, with
 * cuLaunchKernel and cuLaunchKernelEx wrapped: each records what it was
 * given and forwards the call untouched.
 */
#include <string.h>

#include "loader/port.h"
#include "tests/cpp/fake_runtime.h"
#include "tests/fakecuda.h"

static hkb_driver table;
static const hkb_driver *fake;
static hkt_launch last;
static size_t arg_size[4];
static int nargs;

static void record(int ex, const unsigned g[3], const unsigned b[3], unsigned shm, CUstream s,
                   void **args) {
    last.count++;
    last.ex = ex;
    memcpy(last.grid, g, sizeof last.grid);
    memcpy(last.block, b, sizeof last.block);
    last.shared_bytes = shm;
    last.stream = s;
    last.args_null = args == NULL;
    memset(last.arg, 0, sizeof last.arg);
    for (int i = 0; args && i < nargs; i++)
        memcpy(last.arg[i], args[i], arg_size[i]);
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shm, CUstream s, void **args,
                       void **extra) {
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    record(0, g, b, shm, s, args);
    return fake->LaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, args, extra);
}

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **args, void **extra) {
    const unsigned g[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
    const unsigned b[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
    record(1, g, b, c->sharedMemBytes, c->hStream, args);
    return fake->LaunchKernelEx(c, f, args, extra);
}

int hkt_fake_runtime(hk_runtime **out, hk_report *rep) {
    fake = fake_driver();
    table = *fake;
    table.LaunchKernel = launch;
    table.LaunchKernelEx = launch_ex;
    memset(&last, 0, sizeof last);
    nargs = 0;
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.no_warm_start = 1;
    return hkl_runtime_create_with(out, &o, &table, rep);
}

void hkt_record_args(const size_t *sizes, int n) {
    nargs = n < 0 ? 0 : n > 4 ? 4 : n;
    for (int i = 0; i < nargs; i++)
        arg_size[i] = sizes[i] > 8 ? 8 : sizes[i];
}

hkt_launch hkt_last_launch(void) {
    return last;
}

/*
 * hotkern for programs as they are: hot reload of the kernels an nvcc-built
 * program launches with <<<>>>, cudaLaunchKernel or cudaLaunchKernelEx,
 * with no change to its call sites.
 *
 *   # -cudart shared: at run time
 *   HOTKERN_WATCH=kernels/ LD_PRELOAD=libhotkern-preload.so ./game
 *
 *   # nvcc's default static cudart: at link time
 *   nvcc -o game game.cu $(pkg-config --variable=wrap_ldflags hotkern) \
 *        $(pkg-config --libs hotkern-wrap)
 *   # CMake: hotkern_enable_hot_reload(game)
 *
 * A kernel for which a hot version exists (a module of the runtime whose
 * current version has an entry of the same name, as the driver names it: a C
 * name or the mangled C++ one) runs that version, with the launch's grid,
 * block, shared memory, stream, arguments and launch attributes; every other
 * kernel runs the program's own code, untouched, for the cost of one table
 * lookup. The hot source is ordinary CUDA C, typically the program's own .cu
 * with its host code guarded by #ifndef __CUDACC_RTC__: each file of a
 * watched directory (or each push, or each release of an origin) is a
 * module. Template kernels the program launches are instantiated in the hot
 * build by name (scale<float>). A hot version must take the program's
 * parameter layout (the call sites pass it): one that does not is refused,
 * the report naming the kernel and the difference, and the program's own
 * code keeps running. The first hot version of a module takes the current
 * values of the program's __device__/__constant__ variables of the same
 * names; cudaMemcpyToSymbol[Async] then writes both the program's copy and
 * the hot one, cudaMemcpyFromSymbol[Async] reads the hot one, and
 * cudaGetSymbolAddress gives the hot copy's address (valid until the next
 * swap of its module; said once in the log).
 *
 * Files: nvcc gives file-local kernels and variables (static __global__,
 * static __device__) the same names in every file, so a kernel or variable
 * is matched by the file it was compiled from as well as by its name. A
 * module named after a file (a watched a.cu is module "a") reaches that
 * file's kernels and variables alone; a module no file is named after
 * (hk_swap(rt, "sim", ...)) reaches a name only one file has, and where
 * several files have it, the one file whose kernels and variables are
 * exactly the version's. A name that cannot be placed runs the program's own code
 * in every file, said once in the log with the files. The file is learnt
 * from the image's ELF symbol table (a stripped image: not known). A kernel
 * in an anonymous namespace can never be hot (nvcc and NVRTC name that
 * namespace differently): said once. A template instance first launched
 * after its module's source was built has that source built again with it.
 *
 * Configuration, read at the first launch unless the program attached a
 * runtime of its own (hk_interpose_attach):
 *   HOTKERN_WATCH           directories to watch, ':'-separated
 *   HOTKERN_ENDPOINT        [address:]port of a push endpoint (net.h)
 *   HOTKERN_ORIGIN          URL of a release manifest to poll (net.h)
 *   HOTKERN_TRUSTED_KEY     public key file for pushes and releases
 *   HOTKERN_ALLOW_UNSIGNED  1: unsigned releases (closed networks, tests)
 *   HOTKERN_TOKEN           bearer token the endpoint requires
 *   HOTKERN_STATE_DIR       last-known-good state (hk_options.state_dir)
 *   HOTKERN_RESTORE         1: restore the last good versions at start
 *   HOTKERN_CACHE_DIR       compile cache (hk_options.cache_dir)
 *   HOTKERN_CANARY          1: canary runs (hk_options.canary)
 *   HOTKERN_LOG             debug, info, warn or error: messages to stderr
 *   HOTKERN_OFF             1: route nothing
 * A runtime that cannot be made (no driver, no device) leaves every launch
 * to the program's own code, saying why once on stderr.
 *
 * Limits: hot launches run in device 0's primary context (a launch from
 * another context is the program's own, and so are the symbol copies made
 * with another device current); an error of a hot launch is
 * returned by the launch call but not recorded for cudaGetLastError; a
 * cudaMemcpyToSymbolAsync racing a swap of its module may land in the
 * outgoing version (a synchronous copy never does: a swap waits for it).
 */
#ifndef HOTKERN_INTERPOSE_H
#define HOTKERN_INTERPOSE_H

#include "hotkern/hotkern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Routes the program's launches through rt, a runtime the program made
 * (configured in code, its own watches and endpoints). Call it before the
 * first launch: a launch before it makes a runtime from the environment, and
 * then attaching another returns HK_ERR_BUSY. rt must outlive every launch
 * of the program (destroy it only once no thread launches any more).
 * Defined by libhotkern-preload and libhotkern-wrap. Safe from any thread. */
HK_API int hk_interpose_attach(hk_runtime *rt);

/* The runtime launches route through: the attached one, the one made from
 * the environment, or NULL (none yet, or none could be made). */
HK_API hk_runtime *hk_interpose_runtime(void);

#ifdef __cplusplus
}
#endif

#endif /* HOTKERN_INTERPOSE_H */

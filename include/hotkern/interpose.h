/*
 * hotkern for programs as they are: hot reload of the kernels an nvcc-built
 * program launches with <<<>>>, cudaLaunchKernel or cudaLaunchKernelEx,
 * with no change to its call sites.
 *
 *   # -cudart shared: at run time
 *   HOTKERN_WATCH=kernels/ LD_PRELOAD=libhotkern-preload.so ./game
 *
 *   # nvcc's default static cudart: at link time, once hotkern is
 *   # installed (the && stops the build where pkg-config has no
 *   # hotkern-wrap: the variable would be empty, the program hotkern-less)
 *   WRAP=$(pkg-config --print-errors --variable=nvcc_libs hotkern-wrap) &&
 *   nvcc -o game game.cu $WRAP
 *   # gcc or clang link lines: $(pkg-config --libs hotkern-wrap)
 *   # CMake: hotkern_enable_hot_reload(game)
 *
 * nvcc refuses -Wl, flags: nvcc_libs gives the --wrap list as -Xlinker.
 * LD_PRELOAD on a program built with the static cudart reaches nothing;
 * the preload library says so on stderr.
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
 * A hot version never costs the program a launch. The per-function settings
 * the program makes on its kernels (cudaFuncSetAttribute: dynamic shared
 * memory, carveout, cluster attributes; cudaFuncSetCacheConfig;
 * cudaKernelSetAttributeForDevice for device 0) reach its own kernel and
 * every hot version, at bind and at each swap; a version that cannot take
 * one is refused. The launch configurations the program has used for each
 * kernel (largest block, largest dynamic shared memory, cluster dimensions,
 * largest cooperative grid) are kept, and a version that cannot take them
 * (a build whose registers allow smaller blocks, static shared memory that
 * leaves no room, a grid that cannot be co-resident) is refused with
 * HK_ERR_ATTRIBUTE, the report naming the kernel, the configuration and the
 * limit. A hot launch that fails anyway (a configuration first used after
 * the commit) is run by the program's own kernel in the same call, with the
 * same arguments and configuration; the failure is logged, counted
 * (hk_stats.program_fallbacks) and emitted (HK_EVENT_FALLBACK, on the
 * launching thread), and all the module's program kernels run the
 * program's code until its next commit, so that kernels sharing data run
 * one version. cudaLaunchCooperativeKernel routes as <<<>>> does.
 * cudaFuncGetAttributes and cudaOccupancyMaxActiveBlocksPerMultiprocessor
 * [WithFlags] answer for the version that runs (registers, limits and
 * occupancy are the build's own; the runtime's cudaOccupancyMaxPotential
 * BlockSize templates use these two), as of the call: a swap may change it.
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
 *   HOTKERN_LOG             debug, info, warn, error or off: messages to stderr
 *   HOTKERN_AUTO_SAFE_POINTS 0: upload and unload as soon as ready (default 1)
 *   HOTKERN_OFF             1: route nothing
 * Flags take 1 or 0 (also true/false, yes/no, on/off). Nothing is half
 * enabled: a value that does not parse (HOTKERN_ENDPOINT=notaport,
 * HOTKERN_CANARY=maybe), HOTKERN_RESTORE without HOTKERN_STATE_DIR, a
 * network source in a build without the network library, a source that
 * cannot start (a directory that cannot be watched, a port in use) or a
 * runtime that cannot be made (no driver, no device, no build helper)
 * leaves every launch to the program's own code, saying why once on
 * stderr; an unknown HOTKERN_ name is said and ignored. This runtime builds
 * in the build helper (hk_options.build_isolated): no NVRTC runs in the
 * program's process.
 *
 * Exit: a program may return from main or call exit at any moment, a build,
 * canary run or watch in flight; it ends with its own status and its output
 * flushed. From then on every launch runs the program's own code, hotkern's
 * threads make no driver call (they wait for the process's end), and the
 * exit waits for one in progress, up to hk_options.destroy_wait_ms (5 s).
 *
 * Safe points come by themselves: uploading a version's code, or unloading a
 * replaced one, waits for all the GPU work in flight and stalls every
 * launching thread meanwhile, so both wait for a moment the program's own
 * calls show all its GPU work idle: after one of its synchronisations
 * (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize,
 * cudaStreamQuery or cudaEventQuery answering success, a synchronous
 * cudaMemcpy) every stream it launched kernels on answers idle. That
 * synchronisation then does the upload before it returns. With no such
 * moment within hk_options.safe_point_wait_ms (2 s) they happen anyway. A
 * synchronous hk_swap from a thread of the program stages at once, as
 * without the interposition.
 *
 * Limits: hot launches run in device 0's primary context (a launch from
 * another context is the program's own, and so are the symbol copies made
 * with another device current); a sticky error of a hot launch (a
 * kernel faulted: every later call fails with it) is returned by the launch
 * call, not run again by the program's kernel; any other failure of a hot
 * launch is the program's kernel's to report, through its own runtime (so
 * cudaGetLastError sees it when that one fails too). The other occupancy
 * queries (cudaOccupancyMaxActiveClusters, cudaOccupancyMaxPotentialCluster
 * Size, cudaOccupancyAvailableDynamicSMemPerBlock) describe the program's
 * build: they take a launch configuration the driver has no hot-version
 * form of here, and a program that sizes by them is still checked at each
 * swap against what it launched. cudaFuncSetSharedMemConfig is not followed:
 * it has no effect on the devices CUDA 13 supports (their bank size is
 * fixed). A cudaMemcpyToSymbolAsync racing a swap of its module may land in
 * the outgoing version (a synchronous copy never does: a swap waits for it).
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
 * and synchronisation of the program (destroy it only once no thread
 * launches or synchronises any more). It gets automatic safe points (above)
 * unless HOTKERN_AUTO_SAFE_POINTS=0.
 * Defined by libhotkern-preload and libhotkern-wrap. Safe from any thread.
 * Since 1.2. */
HK_API int hk_interpose_attach(hk_runtime *rt);

/* The runtime launches route through: the attached one, the one made from
 * the environment, or NULL (none yet, or none could be made). Since 1.2. */
HK_API hk_runtime *hk_interpose_runtime(void);

#ifdef __cplusplus
}
#endif

#endif /* HOTKERN_INTERPOSE_H */

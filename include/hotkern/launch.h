/*
 * hotkern/launch.h: kernel handles and the launch path.
 *
 * A handle names a kernel of a module, not a version: it is taken once,
 * stays valid for the runtime's life, and every launch through it runs the
 * module's newest committed version. The launch path takes no lock and
 * allocates nothing (a swap holds launches only at the launch gate, for
 * the driver work of a commit or an unload); pins keep one version for a
 * stretch of launches; attributes set through a handle follow every later
 * version; graph nodes registered here follow commits as launches do.
 *
 * Part of the C API of libhotkern: a program includes hotkern/hotkern.h,
 * which includes this header after its core (the two never include each
 * other; this one alone says so).
 */
#ifndef HOTKERN_H
#error "include <hotkern/hotkern.h>: it includes this header"
#endif

#ifndef HOTKERN_LAUNCH_H
#define HOTKERN_LAUNCH_H

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernels and launches ---------------------------------------------- */

/* Takes the handle of kernel `kernel` in module `module`. The name is the
 * kernel's entry name, or a name expression given at build time. The module's
 * current version must contain it. From then on every version of the module
 * must contain it with the same parameter layout (unless accept_layout_change).
 * Handles are owned by the runtime and valid until hk_runtime_destroy; taking
 * the same name twice returns the same handle. Safe from any thread.
 * Since 1.0. */
HK_API int hk_kernel_get(hk_runtime *rt, const char *module, const char *kernel, hk_kernel **out);

/* Requires k's parameter layout to be exactly n parameters, parameter i of
 * sizes[i] bytes at byte offset offsets[i], now and in every later version
 * (for callers that pass arguments laid out at compile time: hotkern.hpp,
 * the <<<>>> interposition). Returns 0 when the current version has that
 * layout; from then on a version with another is refused with
 * HK_ERR_LAYOUT, accept_layout_change or not. Returns HK_ERR_LAYOUT, the
 * report naming the kernel and the first difference, when it does not (the
 * handle is unchanged); HK_ERR_INVALID for bad arguments. Safe from any
 * thread; not from a check callback (HK_ERR_BUSY). Since 1.2. */
HK_API int hk_kernel_require_layout(hk_kernel *k, const size_t *offsets, const size_t *sizes, int n,
                                    hk_report *rep);

/* Frozen: passed by value, it never grows. */
typedef struct hk_dim3 {
    unsigned x, y, z;
} hk_dim3;

/* Launches the current version of k, exactly like cuLaunchKernel with
 * kernelParams = args. stream is a cudaStream_t / CUstream (NULL = default
 * stream); with the library loader the context is the stream's (or, for NULL,
 * the calling thread's current context). Safe from any thread; no lock, no
 * allocation. Returns 0, or HK_ERR_CUDA with the CUresult in *cu_result when
 * cu_result is not NULL.
 * Launch gate: while a swap or an unload needs the driver (typically well
 * under a millisecond), launches wait here, at most
 * options.launch_hold_max_us; without it the driver would let continuous
 * launches starve every load. A launch released then waits in the driver
 * for the load or unload in progress, which may itself wait for work queued
 * on the GPU; a closing longer than the hold and than any before is logged
 * (info, "engine") with what it did.
 * Stream capture: a launch into a capturing stream is recorded in the
 * application's graph with the version current at that moment; that version
 * stays loaded until the graph and every exec instantiated from it are
 * destroyed (a CUDA user object holds it), so the graph never runs unloaded
 * code. To have the graph follow swaps instead, register its node with
 * hk_graph_register.
 * After a context reset a launch may fail once (HK_ERR_CUDA); hotkern's own
 * thread recovers, never the launching one. Since 1.0. */
HK_API int hk_launch(hk_kernel *k, hk_dim3 grid, hk_dim3 block, unsigned shared_bytes, void *stream,
                     void **args, int *cu_result);

/* Pins the current version of module `module`: launches through the pin all
 * run that version, even if newer ones are committed meanwhile; its code is not
 * unloaded before hk_unpin. Safe from any thread. Since 1.0. */
HK_API int hk_pin_module(hk_runtime *rt, const char *module, hk_pin **out);
HK_API int hk_launch_pinned(hk_pin *p, hk_kernel *k, hk_dim3 grid, hk_dim3 block,
                            unsigned shared_bytes, void *stream, void **args, int *cu_result);
HK_API uint64_t hk_pin_version(const hk_pin *p);
/* Releases the pin; p is invalid afterwards. p may be NULL. Since 1.0. */
HK_API void hk_unpin(hk_pin *p);

/* The CUfunction of k's current version in the calling thread's current
 * context (device slot 0's when the thread has none), for code that launches
 * by itself (valid until the next commit of its module plus one reclaim
 * cycle: prefer hk_launch or a pin). Safe from any thread; it does not wait
 * for launches in progress. Since 1.0. */
HK_API int hk_kernel_function(hk_kernel *k, void **cufunction);

/* ---- kernel attributes and extended launches ---------------------------- */

/* Sets attribute `attribute` (a CUfunction_attribute, e.g.
 * CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
 * CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, the REQUIRED_CLUSTER_*
 * and NON_PORTABLE_CLUSTER_SIZE_ALLOWED attributes) to `value` on k's current
 * version, on every device, and keeps it: every later version gets it before
 * it is committed, and a version that cannot take it (say its static shared
 * memory plus the requested dynamic size exceeds the device's limit) is
 * refused with HK_ERR_ATTRIBUTE, the old version running on. Setting it on the
 * current version can fail the same way; nothing is kept then. rep (may be
 * NULL) says why. Safe from any thread; HK_ERR_BUSY from a check callback.
 * Since 1.0. */
HK_API int hk_kernel_set_attribute(hk_kernel *k, int attribute, int value, hk_report *rep);

/* The same for the preferred cache configuration (a CUfunc_cache).
 * Since 1.0. */
HK_API int hk_kernel_set_cache_config(hk_kernel *k, int config, hk_report *rep);

/* A launch with the options of cuLaunchKernelEx. Initialise with
 * hk_launch_config_init (it sets size, so fields can be added later). Its
 * first layout is the whole 1.0 structure. */
typedef struct hk_launch_config {
    size_t size;                    /* sizeof(hk_launch_config), set by init */
    hk_dim3 grid, block;            /* default 1,1,1 */
    unsigned shared_bytes;          /* dynamic shared memory */
    void *stream;                   /* CUstream / cudaStream_t, NULL: default stream */
    hk_dim3 cluster;                /* thread-block cluster; 0,0,0 (default): none */
    int cooperative;                /* 1: a cooperative launch (grid-wide sync) */
    int programmatic_serialization; /* 1: programmatic stream serialization */
    int priority;                   /* launch priority when has_priority */
    int has_priority;
} hk_launch_config;

/* As hk_options_init_size, for launch configurations. Since 1.0. */
HK_API int hk_launch_config_init_size(hk_launch_config *c, size_t size);

/* Fills c with the defaults, for the layout the program is built with.
 * Since 1.0. */
static inline void hk_launch_config_init(hk_launch_config *c) {
    (void)hk_launch_config_init_size(c, sizeof *c);
}

/* Launches k's current version with cuLaunchKernelEx and c's options, with
 * hk_launch's guarantees (epochs, the launch gate, stream capture), and no
 * allocation. Returns 0, HK_ERR_INVALID for a size below the first layout, or
 * HK_ERR_CUDA with the CUresult in *cu_result. Since 1.0. */
HK_API int hk_launch_ex(hk_kernel *k, const hk_launch_config *c, void **args, int *cu_result);

/* ---- CUDA graphs ------------------------------------------------------- */

/* Registers kernel node `node` (CUgraphNode) of the instantiated graph `exec`
 * (CUgraphExec) as launching k: on every commit of k's module the node is
 * pointed at the new version before the old one is unloaded. Launch the graph
 * with hk_graph_launch so no commit updates it mid-launch (graph launches
 * take a lock that commits take for writing, writers first, so neither can
 * starve the other). Register and unregister return HK_ERR_BUSY from a check
 * callback. Since 1.0. */
HK_API int hk_graph_register(hk_runtime *rt, void *exec, void *node, hk_kernel *k);
HK_API int hk_graph_unregister(hk_runtime *rt, void *exec);
HK_API int hk_graph_launch(hk_runtime *rt, void *exec, void *stream, int *cu_result);

#ifdef __cplusplus
}
#endif

#endif /* HOTKERN_LAUNCH_H */

/*
 * A fake CUDA driver table for the engine's logic and fault-injection tests
 * on machines without a GPU. It is no evidence of GPU behaviour: it models
 * only what the engine relies on (contexts, libraries, modules, kernels and
 * their parameter layouts, globals, launches, graphs, resets), and it checks
 * the engine's promises: a launch of unloaded code is counted as a violation
 * instead of crashing.
 *
 * Images are PTX text, read with ptx/'s metadata parser. A comment
 * "// tag: N" sets the value a launch writes: a kernel whose first parameter
 * is 8 bytes gets it stored through that pointer (an int *), and a global
 * named "counter" (4 bytes) is incremented by every launch. An image
 * containing "SYNTAX ERROR" fails to load with CUDA_ERROR_INVALID_PTX and a
 * JIT error log naming the line. Cubins and fatbins are read for their
 * kernels too (with no tag).
 *
 * Kernel controls (fake_kernel_control) make a named kernel fault with a
 * sticky error, hang, or store a wrong value. The same source is built as
 * libhotkern-fakecuda.so (tests/stub/fakecuda_lib.c), a libcuda that any
 * hotkern program loads with HK_LIBCUDA=path.
 */
#ifndef HK_FAKECUDA_H
#define HK_FAKECUDA_H

#include <cuda.h>

#include "base/driver.h"

/* PTX the fake reads: kernels "step(u64 out, u32 n)" and optionally
 * "aux(u64)", a tag, optionally a 4-byte "counter" global; step_layout 1 and
 * 2 change step's parameters. Returns one of 8 rotating static buffers. */
char *fake_ptx(int tag, int with_aux, int with_counter, int step_layout);

/* Resets all fake state: ndev devices of the given arch, nothing loaded. */
void fake_init(int ndev, int arch);
/* Gives device dev another architecture (until the next fake_init). Each
 * device's UUID (cuDeviceGetUuid) is fa4e<dev>... (tests/fakecuda.c). */
void fake_set_device_arch(int dev, int arch);
const hkb_driver *fake_driver(void);

/* The next `nth`-th call (1 = the next one) of driver entry `entry` (the
 * cu* name) returns err. Several can be armed at once. */
void fake_fail(const char *entry, int nth, CUresult err);
/* Every call of `entry` on the device-slot context `dev` fails with err
 * (dev -1: clears). Used to fail one device of several. */
void fake_fail_on_device(const char *entry, int dev, CUresult err);
void fake_clear_faults(void);
/* Number of calls of entry since fake_init. */
int fake_calls(const char *entry);

/* Libraries + modules loaded and not unloaded. */
int fake_live_images(void);
/* Launches that reached unloaded code (must stay 0). */
int fake_violations(void);
int fake_launches(void);

/* Makes the next launch block inside cuLaunchKernel until fake_release_launch. */
void fake_hold_next_launch(void);
void fake_wait_held(void); /* waits until a launch is held */
void fake_release_launch(void);

/* A context of device dev that is not its primary one (as cuCtxCreate makes;
 * never freed): for making it current on a thread (cuCtxSetCurrent). */
CUcontext fake_ctx_create(int dev);

/* Simulates cudaDeviceReset on device ordinal dev. */
void fake_reset_device(int dev);

/* A fake graph with one kernel node launching f; returns exec and node. */
void fake_graph_create(CUfunction f, void **kernel_args, CUgraphExec *exec, CUgraphNode *node);
/* The function the exec's node launches now. */
CUfunction fake_graph_func(CUgraphExec exec);

/* Tag of the code behind a kernel/function handle, or -1. */
int fake_tag_of(void *fn_or_kernel);

/* An image's "// shared: N" gives its kernels N bytes of static shared
 * memory; a max dynamic shared size that does not fit beside it (232448
 * bytes in all) is refused with CUDA_ERROR_INVALID_VALUE. "// regs: N" gives
 * them N registers a thread (default 16): CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_
 * BLOCK is what 64K registers allow (rounded down to a warp, at most 1024),
 * and cuOccupancyMaxActiveBlocksPerMultiprocessor counts blocks by 2048
 * threads and 64K registers a multiprocessor (132 of them). Launches are
 * checked as the device checks them: a block over 1024 threads fails with
 * CUDA_ERROR_INVALID_VALUE, over the function's limit with
 * CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES; dynamic shared memory over the
 * function's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (49152 less its
 * static shared memory unless set) with CUDA_ERROR_INVALID_VALUE; a
 * cooperative grid (cuLaunchKernelEx's attribute) that cannot be co-resident
 * with CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE; a cluster of more than 8
 * blocks with CUDA_ERROR_INVALID_CLUSTER_SIZE. The value an attribute was set
 * to on a kernel/function (cache config: id -1), or -1. */
int fake_kernel_attr(void *fn_or_kernel, int id);
/* An image's "// regs: N" gives its kernels N registers a thread, and a trap
 * guard's copy of it "// guarded regs: M" where it says so (ptxas allocates
 * the copy's anew): cuFuncGetAttribute reads them, and the most threads a
 * block holds follow from them as on the device (72: 896, 56: 1024); a
 * launch of more fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES. Likewise
 * "// ms: N" and "// guarded ms: M" give a launch's GPU time (below). */
/* Attribute ids of the last cuLaunchKernelEx (returns their count, -1 when
 * there was none since the last call). */
int fake_last_launch_ex(int *ids, int max);

/* Models the driver's reader-preferring lock: every launch holds it for
 * reading for `us` microseconds; loads, unloads, cuKernelGetFunction and
 * cuFuncLoad take it for writing. Negative: off (the default). */
void fake_set_launch_model(int us);
/* Every cuGraphLaunch spins this long before it runs (default 0). */
void fake_set_graph_launch_us(int us);
/* Every module or library unload takes this long, inside the driver's
 * write lock (default 0). */
void fake_set_unload_us(int us);
/* Unloads of images already unloaded or dead with their context. */
int fake_bad_unloads(void);
/* While on, cuCtxSynchronize blocks (a persistent kernel runs). */
void fake_hold_sync(int on);
void fake_wait_sync_held(void); /* until a synchronise is blocked */
/* While on, cuDevicePrimaryCtxGetState blocks (a driver call that takes
 * seconds: the reset check's first one). */
void fake_hold_ctx_state(int on);
void fake_wait_ctx_state_held(void); /* until a call of it is blocked */

/* Stream capture on a stream from cuStreamCreate. A call the driver forbids
 * during a global-mode capture (synchronise, unload, legacy-stream copy) from
 * a thread not in relaxed mode fails with a STREAM_CAPTURE error and
 * invalidates the capture, as on the H200. Launches into a capturing stream
 * become nodes of its graph. */
void fake_capture_begin(CUstream s, CUstreamCaptureMode mode);
CUresult fake_capture_end(CUstream s, CUgraph *graph); /* INVALIDATED or SUCCESS */
/* Runs a captured graph's nodes; returns how many reached unloaded code, and
 * the tag of the last node run in *tag. */
int fake_captured_graph_launch(CUgraph graph, int *tag);
/* Destroys the graph: its user objects' destructors run. */
void fake_captured_graph_destroy(CUgraph graph);

/* Kernel controls, by kernel (entry) name: "step" matches that kernel in
 * every image, "step@3" only in images tagged 3. A launch of a FAKE_FAULT
 * kernel is accepted and the fault `err` reaches the next call, and every
 * later one (the error is sticky, as a device fault is for its process); a
 * FAKE_HANG kernel never ends (synchronising and copies block for ever); a
 * FAKE_WRONG kernel stores ~tag instead of its tag; a FAKE_OOB kernel
 * writes past its buffer into valid memory: it runs as a correct one, but
 * under a sanitizer (fake_set_memcheck_fd) it writes memcheck's report of
 * the write to that descriptor and faults with CUDA_ERROR_LAUNCH_FAILED;
 * a FAKE_TRAP kernel traps: in an image with a trap guard (ptx/guard.c:
 * PTX that declares __hotkern_trap and stores into it) the guard's first
 * store runs instead, writing its code there, and the kernel ends well;
 * otherwise the context ends with CUDA_ERROR_LAUNCH_FAILED (sticky).
 * Returns 0, or -1 for a bad spec or too many controls (16). fake_init
 * clears them. The first control that matches a launch decides it. */
enum { FAKE_FAULT = 1, FAKE_HANG = 2, FAKE_WRONG = 3, FAKE_SLOW = 4, FAKE_OOB = 5, FAKE_TRAP = 6 };
int fake_kernel_control(const char *spec, int kind, CUresult err);
/* A FAKE_SLOW control: the kernel runs correctly and takes `ms` of GPU
 * time. GPU time is a counter, not a clock: every launch advances it by
 * its duration (10 us without a control), and CUDA events (cuEventRecord,
 * cuEventElapsedTime, in the loadable library's entry points) read it, so
 * a timed launch takes exactly what its control says. */
int fake_kernel_slow(const char *spec, double ms);
/* A FAKE_TRAP control whose kernel traps from its launch number after + 1
 * in each image on (0: at once; fake_kernel_control's FAKE_TRAP is that). */
int fake_kernel_trap(const char *spec, int after);
/* The descriptor a fake compute-sanitizer reads memcheck's reports from
 * (-1: none, the default); soft: a reported kernel runs on to its end
 * instead of faulting (as with --destroy-on-device-error kernel). */
void fake_set_memcheck_fd(int fd, int soft);
void fake_kernel_controls_clear(void);
/* The sticky error a faulting kernel left, or CUDA_SUCCESS. */
CUresult fake_sticky_error(void);

/* The fake's entry point for driver symbol `sym` (its base name, as
 * cuGetProcAddress takes it): every entry of the driver table and the copies
 * a canary helper needs (cuMemcpyHtoD, cuMemcpyDtoH, cuMemFree, the
 * cuEvent* entries that time its launches); NULL for
 * anything else. For the loadable library (tests/stub/fakecuda_lib.c). */
void *fake_entry(const char *sym);
/* Names of the CUresults the fake knows ("CUDA_ERROR_ILLEGAL_ADDRESS"), and
 * back (a name or a decimal number); NULL / -1 when unknown. */
const char *fake_cu_name(CUresult r);
int fake_cu_parse(const char *name, CUresult *r);

#endif

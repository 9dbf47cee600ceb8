/*
 * base/: the ground floor, which every folder above may use and which uses
 * nothing of hotkern but the public header: the CUDA driver as a table of
 * entry points (this header, driver.c) and the names and messages of
 * hotkern's error codes (error.c, declared in hotkern.h). Prefix hkb_.
 *
 * hotkern never links against libcuda: the real table is filled at run time by
 * dlopen("libcuda.so.1") and cuGetProcAddress for the CUDA version these headers
 * describe (the exported symbols are versioned, so a plain dlsym of a base name
 * can bind an old ABI). A fake driver comes in one of two ways: as a loadable
 * libcuda named by HK_LIBCUDA (hkb_driver_open binds it as the real one), or
 * as a table of its own, filled by the caller and handed to the engine
 * (hkl_runtime_create_with, its dl NULL): tests use both, to drive the engine
 * and the canary helper and inject faults on machines without a GPU. The
 * table is immutable once filled and may be read from any thread.
 */
#ifndef HK_BASE_DRIVER_H
#define HK_BASE_DRIVER_H

#include <cuda.h>
#include <cudaTypedefs.h>

/* X(field, driver symbol): every entry point the engine calls, or its
 * canary helper (canary/helper.c, which binds the driver through this table:
 * cuCtxSetCurrent, cuMemAlloc), and nothing else: each entry is bound by
 * hkb_driver_open, and a driver that lacks one fails it (and
 * hk_runtime_create with it), so an entry hotkern does not call would only
 * narrow the drivers it runs on. */
#define HKB_DRIVER_ENTRIES(X)                                                                      \
    X(Init, cuInit)                                                                                \
    X(DriverGetVersion, cuDriverGetVersion)                                                        \
    X(GetErrorName, cuGetErrorName)                                                                \
    X(DeviceGet, cuDeviceGet)                                                                      \
    X(DeviceGetUuid, cuDeviceGetUuid)                                                              \
    X(DeviceGetAttribute, cuDeviceGetAttribute)                                                    \
    X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)                                            \
    X(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease)                                          \
    X(DevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState)                                        \
    X(CtxGetCurrent, cuCtxGetCurrent)                                                              \
    X(CtxSetCurrent, cuCtxSetCurrent)                                                              \
    X(CtxPushCurrent, cuCtxPushCurrent)                                                            \
    X(CtxPopCurrent, cuCtxPopCurrent)                                                              \
    X(CtxGetId, cuCtxGetId)                                                                        \
    X(ModuleLoadDataEx, cuModuleLoadDataEx)                                                        \
    X(ModuleUnload, cuModuleUnload)                                                                \
    X(ModuleGetFunction, cuModuleGetFunction)                                                      \
    X(ModuleGetGlobal, cuModuleGetGlobal)                                                          \
    X(ModuleGetFunctionCount, cuModuleGetFunctionCount)                                            \
    X(ModuleEnumerateFunctions, cuModuleEnumerateFunctions)                                        \
    X(LibraryLoadData, cuLibraryLoadData)                                                          \
    X(LibraryUnload, cuLibraryUnload)                                                              \
    X(LibraryGetKernel, cuLibraryGetKernel)                                                        \
    X(LibraryGetKernelCount, cuLibraryGetKernelCount)                                              \
    X(LibraryEnumerateKernels, cuLibraryEnumerateKernels)                                          \
    X(LibraryGetGlobal, cuLibraryGetGlobal)                                                        \
    X(KernelGetFunction, cuKernelGetFunction)                                                      \
    X(KernelGetParamInfo, cuKernelGetParamInfo)                                                    \
    X(FuncGetParamInfo, cuFuncGetParamInfo)                                                        \
    X(FuncLoad, cuFuncLoad)                                                                        \
    X(LaunchKernel, cuLaunchKernel)                                                                \
    X(MemAlloc, cuMemAlloc)                                                                        \
    X(StreamSynchronize, cuStreamSynchronize)                                                      \
    X(StreamCreate, cuStreamCreate)                                                                \
    X(StreamDestroy, cuStreamDestroy)                                                              \
    X(GraphKernelNodeGetParams, cuGraphKernelNodeGetParams)                                        \
    X(GraphExecKernelNodeSetParams, cuGraphExecKernelNodeSetParams)                                \
    X(GraphLaunch, cuGraphLaunch)                                                                  \
    X(StreamIsCapturing, cuStreamIsCapturing)                                                      \
    X(StreamGetCaptureInfo, cuStreamGetCaptureInfo)                                                \
    X(ThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode)                          \
    X(MemcpyDtoDAsync, cuMemcpyDtoDAsync)                                                          \
    X(UserObjectCreate, cuUserObjectCreate)                                                        \
    X(GraphRetainUserObject, cuGraphRetainUserObject)                                              \
    X(KernelSetAttribute, cuKernelSetAttribute)                                                    \
    X(KernelGetAttribute, cuKernelGetAttribute)                                                    \
    X(KernelSetCacheConfig, cuKernelSetCacheConfig)                                                \
    X(FuncSetAttribute, cuFuncSetAttribute)                                                        \
    X(FuncGetAttribute, cuFuncGetAttribute)                                                        \
    X(FuncSetCacheConfig, cuFuncSetCacheConfig)                                                    \
    X(LaunchKernelEx, cuLaunchKernelEx)                                                            \
    X(OccupancyMaxActiveBlocksPerMultiprocessor, cuOccupancyMaxActiveBlocksPerMultiprocessor)      \
    X(OccupancyMaxActiveClusters, cuOccupancyMaxActiveClusters)

/* Entry points neither the engine nor its canary helper calls, for the
 * benchmarks and the test harness that share the table, and for the <<<>>>
 * interposition (kernel names: without them it routes nothing): bound when
 * the driver has them and NULL when it does not, which never fails
 * hkb_driver_open. */
#define HKB_DRIVER_ENTRIES_EXTRA(X)                                                                \
    X(KernelGetName, cuKernelGetName)                                                              \
    X(KernelGetLibrary, cuKernelGetLibrary)                                                        \
    X(DeviceGetCount, cuDeviceGetCount)                                                            \
    X(DeviceGetName, cuDeviceGetName)                                                              \
    X(MemGetInfo, cuMemGetInfo)                                                                    \
    X(ModuleLoadData, cuModuleLoadData)

/* Entry points whose CUDA 13 ABI differs from the prototype cuda.h still
 * declares under the plain name: cuGetProcAddress(sym, CUDA_VERSION) returns
 * the newer function, so it is called through the matching PFN type from
 * cudaTypedefs.h. (tests/cpu_driver.c checks that no other entry has a
 * version of its own for this CUDA release.) */
#define HKB_DRIVER_ENTRIES_TYPED(X)                                                                \
    X(CtxGetDevice, cuCtxGetDevice, PFN_cuCtxGetDevice_v13000)                                     \
    X(CtxSynchronize, cuCtxSynchronize, PFN_cuCtxSynchronize_v13000)

#define HKB_DRIVER_FIELD(field, sym)             __typeof__(sym) *field;
#define HKB_DRIVER_FIELD_TYPED(field, sym, type) type field;

typedef struct hkb_driver {
    HKB_DRIVER_ENTRIES(HKB_DRIVER_FIELD)
    HKB_DRIVER_ENTRIES_EXTRA(HKB_DRIVER_FIELD)
    HKB_DRIVER_ENTRIES_TYPED(HKB_DRIVER_FIELD_TYPED)
    void *dl;    /* dlopen handle of the real driver, NULL for a fake */
    int version; /* cuDriverGetVersion */
} hkb_driver;

/* Fills d from libcuda. Returns 0, or HK_ERR_NO_DRIVER with the reason in why
 * (library missing, an entry point the engine calls missing, cuInit's error
 * name). */
int hkb_driver_open(hkb_driver *d, char *why, size_t why_size);
void hkb_driver_close(hkb_driver *d);

/* Name of a CUresult ("CUDA_ERROR_INVALID_PTX"), also without a driver. */
const char *hkb_cu_name(const hkb_driver *d, CUresult r);

#endif /* HK_BASE_DRIVER_H */

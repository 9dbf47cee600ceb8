/*
 * A stand-in libcuda for binding tests: it exports cuGetProcAddress_v2 and
 * hands out an entry point for every symbol except those an older or
 * narrower driver might lack (the ones hotkern does not call, listed below),
 * for which it answers CUDA_ERROR_NOT_FOUND as a real driver does. Only
 * cuInit and cuDriverGetVersion do anything; every other entry returns
 * CUDA_ERROR_NOT_SUPPORTED and must not be called by a binding test.
 * Loaded with HK_LIBCUDA=path by tests/cpu_driver.c.
 */
#include <cuda.h>
#include <string.h>

__attribute__((visibility("default"))) CUresult
cuGetProcAddress_v2(const char *sym, void **pfn, int version, cuuint64_t flags,
                    CUdriverProcAddressQueryResult *found);

static CUresult stub_init(unsigned flags) {
    return CUDA_SUCCESS;
}
static CUresult stub_driver_version(int *v) {
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}
static CUresult stub_unsupported(void) {
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* Entry points this driver lacks: some the table never binds, and the
 * benchmarks' extras (HKB_DRIVER_ENTRIES_EXTRA), which neither the engine
 * nor its canary helper calls. */
static const char *const missing[] = {
    "cuGetErrorString", "cuKernelGetName", "cuKernelGetLibrary",  "cuFuncGetName",
    "cuMemcpyDtoD",     "cuMemFree",       "cuUserObjectRelease", "cuDeviceGetCount",
    "cuDeviceGetName",  "cuMemGetInfo",    "cuModuleLoadData"};

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *found) {
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        if (strcmp(sym, missing[i]) == 0) {
            *pfn = NULL;
            if (found)
                *found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
            return CUDA_ERROR_NOT_FOUND;
        }
    }
    if (strcmp(sym, "cuInit") == 0)
        *pfn = (void *)stub_init;
    else if (strcmp(sym, "cuDriverGetVersion") == 0)
        *pfn = (void *)stub_driver_version;
    else
        *pfn = (void *)stub_unsupported;
    if (found)
        *found = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

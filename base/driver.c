/*
 * Binds the CUDA driver at run time.
 *
 * libcuda is opened with dlopen and every entry point is taken through
 * cuGetProcAddress for CUDA_VERSION (the version of the headers we compiled
 * against), so each pointer has exactly the ABI of the prototype we call it
 * through: libcuda exports several versions of many symbols (cuModuleGetGlobal,
 * cuModuleGetGlobal_v2, ...) and dlsym of the base name returns the oldest.
 * No link-time dependency on libcuda exists, so a machine without a driver
 * gets HK_ERR_NO_DRIVER and a reason instead of a loader error.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "hotkern/hotkern.h"
#include "base/driver.h"

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

int hkb_driver_open(hkb_driver *d, char *why, size_t why_size) {
    memset(d, 0, sizeof *d);
    const char *path = getenv("HK_LIBCUDA");
    d->dl = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d->dl) {
        snprintf(why, why_size, "no CUDA driver: %s", dlerror());
        return HK_ERR_NO_DRIVER;
    }
    get_proc_fn gpa = (get_proc_fn)dlsym(d->dl, "cuGetProcAddress_v2");
    if (!gpa) {
        snprintf(why, why_size, "CUDA driver too old: no cuGetProcAddress_v2 (need CUDA >= 12.0)");
        goto fail;
    }
    CUdriverProcAddressQueryResult found;
#define HKB_BIND(field, sym)                                                                       \
    if (gpa(#sym, (void **)&d->field, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) !=        \
            CUDA_SUCCESS ||                                                                        \
        !d->field) {                                                                               \
        snprintf(why, why_size, "CUDA driver lacks %s for CUDA %d (driver too old?)", #sym,        \
                 CUDA_VERSION);                                                                    \
        goto fail;                                                                                 \
    }
    HKB_DRIVER_ENTRIES(HKB_BIND)
#define HKB_BIND_TYPED(field, sym, type) HKB_BIND(field, sym)
    HKB_DRIVER_ENTRIES_TYPED(HKB_BIND_TYPED)
#define HKB_BIND_EXTRA(field, sym)                                                                 \
    if (gpa(#sym, (void **)&d->field, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) !=        \
        CUDA_SUCCESS)                                                                              \
        d->field = NULL;
    HKB_DRIVER_ENTRIES_EXTRA(HKB_BIND_EXTRA)
#undef HKB_BIND_EXTRA
#undef HKB_BIND_TYPED
#undef HKB_BIND
    CUresult r = d->Init(0);
    if (r != CUDA_SUCCESS) {
        snprintf(why, why_size, "cuInit failed: %s", hkb_cu_name(d, r));
        goto fail;
    }
    d->DriverGetVersion(&d->version);
    return 0;
fail:
    /* cuInit may have run: do not unload (see hkb_driver_close). */
    memset(d, 0, sizeof *d);
    return HK_ERR_NO_DRIVER;
}

/* libcuda is never unloaded: once cuInit has run, the CUDA runtime, tools
 * that intercept the driver (compute-sanitizer) and other libraries in the
 * process hold state and hooks inside it. dlopen keeps one reference per
 * open; the handle is simply forgotten. */
void hkb_driver_close(hkb_driver *d) {
    if (d)
        memset(d, 0, sizeof *d);
}

/* A few names known without a driver, so early failures still read well. */
static const char *static_name(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS:
        return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE:
        return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY:
        return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED:
        return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_NO_DEVICE:
        return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE:
        return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_IMAGE:
        return "CUDA_ERROR_INVALID_IMAGE";
    case CUDA_ERROR_INVALID_CONTEXT:
        return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
        return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case CUDA_ERROR_INVALID_PTX:
        return "CUDA_ERROR_INVALID_PTX";
    case CUDA_ERROR_INVALID_HANDLE:
        return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND:
        return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_STUB_LIBRARY:
        return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_ILLEGAL_ADDRESS:
        return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_LAUNCH_FAILED:
        return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
        return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
    default:
        return NULL;
    }
}

const char *hkb_cu_name(const hkb_driver *d, CUresult r) {
    const char *s = NULL;
    if (d && d->GetErrorName && d->GetErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    s = static_name(r);
    return s ? s : "CUDA_ERROR_UNKNOWN_CODE";
}

/*
 * libhotkern-preload.so: the interposition for programs linked with
 * -cudart shared, loaded with LD_PRELOAD. It defines the runtime's entry
 * points listed in entries.h under their own names, so the program's calls
 * (nvcc's <<<>>> stubs among them) reach these first; each forwards to the
 * next definition in the lookup order, libcudart's, taken once by
 * dlsym(RTLD_NEXT) before the first call goes through (a constructor, and
 * pthread_once on every entry in case a constructor of another library
 * calls in first). pkg/hotkern-preload.map exports these names and
 * hk_interpose_* only: the engine inside stays private to this library.
 */
#include <dlfcn.h>
#include <pthread.h>

#include "interpose/entries.h"
#include "interpose/interpose.h"

#define EXPORT __attribute__((visibility("default")))

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void resolve(void) {
    hki_real r = {0};
#define RESOLVE(field, name, params, call) r.field = (__typeof__(r.field))dlsym(RTLD_NEXT, #name);
    HKI_ENTRIES(RESOLVE)
    HKI_TU_ENTRIES(RESOLVE)
#undef RESOLVE
    r.register_var = (hki_regvar_fn)dlsym(RTLD_NEXT, "__cudaRegisterVar");
    r.register_fatbin = (hki_regfat_fn)dlsym(RTLD_NEXT, "__cudaRegisterFatBinary");
    r.register_function = (hki_regfun_fn)dlsym(RTLD_NEXT, "__cudaRegisterFunction");
#define RESOLVE_FH(field, name, call) r.field = (hki_fathandle_fn)dlsym(RTLD_NEXT, #name);
    HKI_FATHANDLE_ENTRIES(RESOLVE_FH)
#undef RESOLVE_FH
    r.get_kernel = (hki_getkernel_fn)dlsym(RTLD_NEXT, "cudaGetKernel");
    r.memcpy_async = (hki_memcpy_async_fn)dlsym(RTLD_NEXT, "cudaMemcpyAsync");
    hki_real_set(&r);
}

__attribute__((constructor)) static void preload_init(void) {
    pthread_once(&once, resolve);
    /* A program with a static CUDA runtime has none to forward to. */
    hki_preload_check(dlsym(RTLD_NEXT, "__cudaLaunchKernel") != NULL);
}

#define DEFINE(field, name, params, call)                                                          \
    EXPORT cudaError_t name params;                                                                \
    cudaError_t name params {                                                                      \
        pthread_once(&once, resolve);                                                              \
        return call;                                                                               \
    }
HKI_ENTRIES(DEFINE)
HKI_TU_ENTRIES(DEFINE)
#undef DEFINE

EXPORT void __cudaRegisterVar HKI_REGVAR_PARAMS;
void __cudaRegisterVar HKI_REGVAR_PARAMS {
    pthread_once(&once, resolve);
    HKI_REGVAR_CALL;
}

/* ---- translation units ---- */
EXPORT void **__cudaRegisterFatBinary HKI_REGFAT_PARAMS;
void **__cudaRegisterFatBinary HKI_REGFAT_PARAMS {
    pthread_once(&once, resolve);
    return HKI_REGFAT_CALL;
}

EXPORT void __cudaRegisterFunction HKI_REGFUN_PARAMS;
void __cudaRegisterFunction HKI_REGFUN_PARAMS {
    pthread_once(&once, resolve);
    HKI_REGFUN_CALL;
}

#define DEFINE_FH(field, name, call)                                                               \
    EXPORT void name(void **h);                                                                    \
    void name(void **h) {                                                                          \
        pthread_once(&once, resolve);                                                              \
        call(h);                                                                                   \
    }
HKI_FATHANDLE_ENTRIES(DEFINE_FH)
#undef DEFINE_FH

/*
 * libhotkern-wrap.a: the interposition for programs linked with nvcc's
 * default static cudart. The program links with -Wl,--wrap=NAME for every
 * entry point of entries.h and __cudaRegisterVar (hotkern-wrap.pc's
 * nvcc_libs for nvcc, wrap_ldflags for gcc and clang, or
 * hotkern_enable_hot_reload() in CMake): the linker sends its
 * references to NAME to __wrap_NAME here, and __real_NAME to the runtime's.
 * Every name must be wrapped: this file refers to each __real_NAME.
 */
#include <pthread.h>

#include "interpose/entries.h"
#include "interpose/interpose.h"

#define EXPORT __attribute__((visibility("default")))

#define DECLARE(field, name, params, call)                                                         \
    cudaError_t __real_##name params;                                                              \
    EXPORT cudaError_t __wrap_##name params;
HKI_ENTRIES(DECLARE)
HKI_TU_ENTRIES(DECLARE)
#undef DECLARE
void __real___cudaRegisterVar HKI_REGVAR_PARAMS;
EXPORT void __wrap___cudaRegisterVar HKI_REGVAR_PARAMS;
void **__real___cudaRegisterFatBinary HKI_REGFAT_PARAMS;
EXPORT void **__wrap___cudaRegisterFatBinary HKI_REGFAT_PARAMS;
void __real___cudaRegisterFunction HKI_REGFUN_PARAMS;
EXPORT void __wrap___cudaRegisterFunction HKI_REGFUN_PARAMS;
#define DECLARE_FH(field, name, call)                                                              \
    void __real_##name(void **h);                                                                  \
    EXPORT void __wrap_##name(void **h);
HKI_FATHANDLE_ENTRIES(DECLARE_FH)
#undef DECLARE_FH

/* Marks the program as linked with the interposition, for the preload
 * library (env.c's hki_preload_check) should it be preloaded as well. */
__attribute__((used, section(HKI_WRAP_SECTION))) static const char wrapped[] = "hotkern-wrap";

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void resolve(void) {
    hki_real r = {0};
#define RESOLVE(field, name, params, call) r.field = __real_##name;
    HKI_ENTRIES(RESOLVE)
    HKI_TU_ENTRIES(RESOLVE)
#undef RESOLVE
    r.register_var = __real___cudaRegisterVar;
    r.register_fatbin = __real___cudaRegisterFatBinary;
    r.register_function = __real___cudaRegisterFunction;
#define RESOLVE_FH(field, name, call) r.field = __real_##name;
    HKI_FATHANDLE_ENTRIES(RESOLVE_FH)
#undef RESOLVE_FH
    r.get_kernel = cudaGetKernel;
    /* r.memcpy: __real_cudaMemcpy, above (cudaMemcpy itself is wrapped) */
    r.memcpy_async = cudaMemcpyAsync;
    hki_real_set(&r);
}

#define DEFINE(field, name, params, call)                                                          \
    cudaError_t __wrap_##name params {                                                             \
        pthread_once(&once, resolve);                                                              \
        return call;                                                                               \
    }
HKI_ENTRIES(DEFINE)
HKI_TU_ENTRIES(DEFINE)
#undef DEFINE

void __wrap___cudaRegisterVar HKI_REGVAR_PARAMS {
    pthread_once(&once, resolve);
    HKI_REGVAR_CALL;
}

/* ---- translation units ---- */
void **__wrap___cudaRegisterFatBinary HKI_REGFAT_PARAMS {
    pthread_once(&once, resolve);
    return HKI_REGFAT_CALL;
}

void __wrap___cudaRegisterFunction HKI_REGFUN_PARAMS {
    pthread_once(&once, resolve);
    HKI_REGFUN_CALL;
}

#define DEFINE_FH(field, name, call)                                                               \
    void __wrap_##name(void **h) {                                                                 \
        pthread_once(&once, resolve);                                                              \
        call(h);                                                                                   \
    }
HKI_FATHANDLE_ENTRIES(DEFINE_FH)
#undef DEFINE_FH

/*
 * libhotkern-fakecuda.so: the fake driver (tests/fakecuda.c) as a libcuda
 * that hotkern's driver binding can dlopen (HK_LIBCUDA=path), so that any
 * hotkern program (the CLI, the canary helper, an application's server) runs
 * on a machine without a GPU through the public API alone. It exports
 * cuGetProcAddress_v2, which hands out the fake's entry points, and the
 * hkfake_* controls below for programs that dlsym them.
 *
 * What it models is tests/fakecuda.h's: images are PTX (read with hotkern's
 * own parser; cubins and fatbins are parsed for their kernels too), device
 * memory is host memory, and a launch stores its image's "// tag: N" through
 * a first 8-byte parameter. It is no evidence of GPU behaviour.
 *
 * Environment, read when the library is loaded (so a child process started
 * with it set gets the same faults):
 *   HKFAKE_DEVICES  number of devices (default 1, at most 4)
 *   HKFAKE_ARCH     their SM (default 90)
 *   HKFAKE_FAULT    "KERNEL[=CUDA_ERROR_NAME],..." kernels whose launch faults
 *                   (default CUDA_ERROR_ILLEGAL_ADDRESS); the error is sticky
 *   HKFAKE_HANG     "KERNEL,..." kernels that never finish
 *   HKFAKE_WRONG    "KERNEL,..." kernels that store a wrong value
 *   HKFAKE_SLOW     "KERNEL=MS,..." kernels that take MS milliseconds of GPU
 *                   time (as CUDA events measure it; nothing sleeps)
 *   HKFAKE_OOB      "KERNEL,..." kernels that write past their buffer into
 *                   valid memory: unseen, except by a (fake) sanitizer
 *   HKFAKE_TRAP     "KERNEL[=N],..." kernels that trap (after N launches in
 *                   an image that passed; default 0): caught by a trap
 *                   guard's copy of the image, else ending the context
 *   HKFAKE_MEMCHECK_FD  set by tests/stub/fake_sanitizer.c: where memcheck's
 *                   reports go; HKFAKE_MEMCHECK_SOFT=1: a reported kernel
 *                   runs on instead of faulting
 * KERNEL is an entry name, or NAME@TAG for the images tagged TAG only.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fakecuda.h"

#define HKFAKE_API __attribute__((visibility("default")))

HKFAKE_API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, cuuint64_t flags,
                                        CUdriverProcAddressQueryResult *found);
HKFAKE_API int hkfake_fault_kernel(const char *kernel, int cu_result);
HKFAKE_API int hkfake_hang_kernel(const char *kernel);
HKFAKE_API int hkfake_wrong_kernel(const char *kernel);
HKFAKE_API int hkfake_slow_kernel(const char *kernel, double ms);
HKFAKE_API void hkfake_clear_kernels(void);
HKFAKE_API void hkfake_fail_call(const char *entry, int nth, int cu_result);
HKFAKE_API int hkfake_calls(const char *entry);
HKFAKE_API int hkfake_launches(void);
HKFAKE_API int hkfake_live_images(void);
HKFAKE_API void hkfake_reset(void);

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *found) {
    void *p = sym ? fake_entry(sym) : NULL;
    if (pfn)
        *pfn = p;
    if (found)
        *found = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

int hkfake_fault_kernel(const char *kernel, int cu_result) {
    return kernel && cu_result > 0 ? fake_kernel_control(kernel, FAKE_FAULT, (CUresult)cu_result)
                                   : -1;
}

int hkfake_hang_kernel(const char *kernel) {
    return kernel ? fake_kernel_control(kernel, FAKE_HANG, CUDA_SUCCESS) : -1;
}

int hkfake_wrong_kernel(const char *kernel) {
    return kernel ? fake_kernel_control(kernel, FAKE_WRONG, CUDA_SUCCESS) : -1;
}

int hkfake_slow_kernel(const char *kernel, double ms) {
    return kernel ? fake_kernel_slow(kernel, ms) : -1;
}

void hkfake_clear_kernels(void) {
    fake_kernel_controls_clear();
}

void hkfake_fail_call(const char *entry, int nth, int cu_result) {
    if (entry)
        fake_fail(entry, nth, (CUresult)cu_result);
}

int hkfake_calls(const char *entry) {
    return entry ? fake_calls(entry) : 0;
}

int hkfake_launches(void) {
    return fake_launches();
}

int hkfake_live_images(void) {
    return fake_live_images();
}

static int env_int(const char *name, int def, int lo, int hi) {
    const char *v = getenv(name);
    char *end;
    long n = v ? strtol(v, &end, 10) : def;
    if (!v || end == v || *end || n < lo || n > hi)
        return def;
    return (int)n;
}

/* Applies one comma-separated control list; a malformed item is reported
 * on stderr and skipped (a CI run should see why its fault did not fire). */
static void env_controls(const char *var, int kind) {
    const char *v = getenv(var);
    if (!v || !*v)
        return;
    char *copy = strdup(v), *save = NULL;
    for (char *item = copy ? strtok_r(copy, ",", &save) : NULL; item;
         item = strtok_r(NULL, ",", &save)) {
        CUresult err = CUDA_ERROR_ILLEGAL_ADDRESS;
        double ms = -1;
        char *eq = strchr(item, '='), *end = NULL;
        if (eq) {
            *eq = '\0';
            if (kind == FAKE_SLOW || kind == FAKE_TRAP)
                ms = strtod(eq + 1, &end);
            if (((kind == FAKE_SLOW || kind == FAKE_TRAP) &&
                 (end == eq + 1 || *end || !(ms >= 0))) ||
                (kind != FAKE_SLOW && kind != FAKE_TRAP &&
                 (kind != FAKE_FAULT || fake_cu_parse(eq + 1, &err) < 0))) {
                fprintf(stderr, "libhotkern-fakecuda: %s: bad item '%s=%s'\n", var, item, eq + 1);
                continue;
            }
        }
        if (kind == FAKE_SLOW && ms < 0)
            fprintf(stderr, "libhotkern-fakecuda: %s: '%s' without =MS\n", var, item);
        else if ((kind == FAKE_SLOW   ? fake_kernel_slow(item, ms)
                  : kind == FAKE_TRAP ? fake_kernel_trap(item, ms > 0 ? (int)ms : 0)
                                      : fake_kernel_control(item, kind, err)) < 0)
            fprintf(stderr, "libhotkern-fakecuda: %s: bad kernel '%s'\n", var, item);
    }
    free(copy);
}

void hkfake_reset(void) {
    fake_init(env_int("HKFAKE_DEVICES", 1, 1, 4), env_int("HKFAKE_ARCH", 90, 10, 999));
    env_controls("HKFAKE_FAULT", FAKE_FAULT);
    env_controls("HKFAKE_HANG", FAKE_HANG);
    env_controls("HKFAKE_WRONG", FAKE_WRONG);
    env_controls("HKFAKE_SLOW", FAKE_SLOW);
    env_controls("HKFAKE_OOB", FAKE_OOB);
    env_controls("HKFAKE_TRAP", FAKE_TRAP);
    const char *fd = getenv("HKFAKE_MEMCHECK_FD");
    const char *soft = getenv("HKFAKE_MEMCHECK_SOFT");
    fake_set_memcheck_fd(fd && *fd ? atoi(fd) : -1, soft && !strcmp(soft, "1"));
}

__attribute__((constructor)) static void fakecuda_lib_load(void) {
    hkfake_reset();
}

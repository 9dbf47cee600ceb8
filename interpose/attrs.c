/*
 * Per-function settings of the program's kernels, and the queries that
 * describe them (interpose.h).
 *
 * A kernel the program prepares with cudaFuncSetAttribute (64 KB of dynamic
 * shared memory, a carveout, cluster attributes), cudaFuncSetCacheConfig or
 * cudaKernelSetAttributeForDevice keeps those settings in every hot version:
 * the call goes to the program's runtime first (its own kernel takes it, its
 * error is the program's), then the setting is recorded on the program's
 * kernel (hkl_expect_set_attr), which sets it on the version that runs and
 * gives it to every later one before its commit; a version that cannot take
 * it is refused (HK_ERR_ATTRIBUTE), and one running already that does not
 * take it sends its module back to the program's code. The cudaFuncAttribute
 * and cudaFuncCache values are the driver's CUfunction_attribute and
 * CUfunc_cache ones.
 *
 * cudaFuncGetAttributes and cudaOccupancyMaxActiveBlocksPerMultiprocessor
 * (WithFlags, flags 0) answer for the version that runs: a hot version's
 * registers, limits and occupancy are its own, and a program that sizes its
 * launches by them would size them for the wrong build otherwise (and the
 * runtime's cudaOccupancyMaxPotentialBlockSize templates are built on these
 * two). The answer is that of the moment: a swap may change it. The other
 * occupancy queries (clusters, available dynamic shared memory) describe
 * the program's build (include/hotkern/interpose.h, limits).
 */
#include <stdio.h>

#include "hotkern/interpose.h"
#include "interpose/interpose.h"
#include "loader/port.h"

_Static_assert((int)cudaFuncAttributeMaxDynamicSharedMemorySize ==
                       (int)CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES &&
                   (int)cudaFuncAttributePreferredSharedMemoryCarveout ==
                       (int)CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT &&
                   (int)cudaFuncAttributeClusterDimMustBeSet ==
                       (int)CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET &&
                   (int)cudaFuncAttributeRequiredClusterWidth ==
                       (int)CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH &&
                   (int)cudaFuncAttributeRequiredClusterHeight ==
                       (int)CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT &&
                   (int)cudaFuncAttributeRequiredClusterDepth ==
                       (int)CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH &&
                   (int)cudaFuncAttributeNonPortableClusterSizeAllowed ==
                       (int)CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED &&
                   (int)cudaFuncAttributeClusterSchedulingPolicyPreference ==
                       (int)CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
               "cudaFuncAttribute and CUfunction_attribute share their values");
_Static_assert((int)cudaFuncCachePreferNone == (int)CU_FUNC_CACHE_PREFER_NONE &&
                   (int)cudaFuncCachePreferShared == (int)CU_FUNC_CACHE_PREFER_SHARED &&
                   (int)cudaFuncCachePreferL1 == (int)CU_FUNC_CACHE_PREFER_L1 &&
                   (int)cudaFuncCachePreferEqual == (int)CU_FUNC_CACHE_PREFER_EQUAL,
               "cudaFuncCache and CUfunc_cache share their values");

/* Records a setting the program's runtime took (attr -1: cache config). */
static void record(hkl_expect *e, int attr, int value, const char *call) {
    hk_runtime *rt = hki_runtime();
    if (!e || !rt)
        return;
    hk_report rep = HK_REPORT_INIT;
    if (hkl_expect_set_attr(rt, e, attr, value, &rep) < 0)
        hk_log(rt, HK_LOG_WARN, "interpose",
               "%s(%d) on the program's kernel '%s': the hot version does not take it (%s)", call,
               value, hkl_expect_name(e), rep.message[0] ? rep.message : "no reason given");
    hk_report_clear(&rep);
}

cudaError_t hki_func_set_attribute(const void *f, enum cudaFuncAttribute attr, int value) {
    cudaError_t r = hki_real_get()->func_set_attribute(f, attr, value);
    if (r == cudaSuccess)
        record(hki_expect_of(f, 1), (int)attr, value, "cudaFuncSetAttribute");
    return r;
}

cudaError_t hki_func_set_cache_config(const void *f, enum cudaFuncCache config) {
    cudaError_t r = hki_real_get()->func_set_cache_config(f, config);
    if (r == cudaSuccess)
        record(hki_expect_of(f, 1), -1, (int)config, "cudaFuncSetCacheConfig");
    return r;
}

cudaError_t hki_kernel_set_attribute(cudaKernel_t k, enum cudaFuncAttribute attr, int value,
                                     int device) {
    cudaError_t r = hki_real_get()->kernel_set_attribute(k, attr, value, device);
    if (r != cudaSuccess)
        return r;
    hkl_expect *e = hki_expect_of(k, 0);
    hk_runtime *rt = hki_runtime();
    /* The hot versions run on the runtime's device 0 only. */
    if (e && rt && device == hkl_device_ordinal(rt, 0))
        record(e, (int)attr, value, "cudaKernelSetAttributeForDevice");
    return r;
}

/* The hot function of f in this thread's context, or NULL. */
static CUfunction hot_function(const void *f, const hkb_driver **drv) {
    hkl_expect *e = hki_expect_of(f, 1);
    hk_kernel *h = e ? hkl_expect_handle(e) : NULL;
    void *fn = NULL;
    if (!h || hk_kernel_function(h, &fn) < 0)
        return NULL;
    *drv = hkl_driver(hkl_kernel_runtime(h));
    return (CUfunction)fn;
}

cudaError_t hki_func_get_attributes(struct cudaFuncAttributes *p, const void *f) {
    cudaError_t r = hki_real_get()->func_get_attributes(p, f);
    const hkb_driver *d = NULL;
    CUfunction fn = r == cudaSuccess && p ? hot_function(f, &d) : NULL;
    if (!fn)
        return r;
    static const struct {
        CUfunction_attribute a;
        size_t off, size;
    } map[] = {
#define F(attr, field)                                                                             \
    {attr, offsetof(struct cudaFuncAttributes, field),                                             \
     sizeof(((struct cudaFuncAttributes *)0)->field)}
        F(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, sharedSizeBytes),
        F(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, constSizeBytes),
        F(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, localSizeBytes),
        F(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, maxThreadsPerBlock),
        F(CU_FUNC_ATTRIBUTE_NUM_REGS, numRegs),
        F(CU_FUNC_ATTRIBUTE_PTX_VERSION, ptxVersion),
        F(CU_FUNC_ATTRIBUTE_BINARY_VERSION, binaryVersion),
        F(CU_FUNC_ATTRIBUTE_CACHE_MODE_CA, cacheModeCA),
        F(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, maxDynamicSharedSizeBytes),
        F(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, preferredShmemCarveout),
#undef F
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        int v = 0;
        if (d->FuncGetAttribute(&v, map[i].a, fn) != CUDA_SUCCESS)
            continue; /* the program's answer stands */
        char *at = (char *)p + map[i].off;
        if (map[i].size == sizeof(size_t))
            *(size_t *)(void *)at = (size_t)v;
        else
            *(int *)(void *)at = v;
    }
    return r;
}

cudaError_t hki_occupancy(int *n, const void *f, int block, size_t smem) {
    cudaError_t r = hki_real_get()->occupancy(n, f, block, smem);
    const hkb_driver *d = NULL;
    CUfunction fn = r == cudaSuccess && n ? hot_function(f, &d) : NULL;
    int hot = 0;
    if (fn && d->OccupancyMaxActiveBlocksPerMultiprocessor(&hot, fn, block, smem) == CUDA_SUCCESS)
        *n = hot;
    return r;
}

cudaError_t hki_occupancy_flags(int *n, const void *f, int block, size_t smem, unsigned flags) {
    cudaError_t r = hki_real_get()->occupancy_flags(n, f, block, smem, flags);
    const hkb_driver *d = NULL;
    /* A flag (cudaOccupancyDisableCachingOverride) is not the driver call's. */
    CUfunction fn = r == cudaSuccess && n && !flags ? hot_function(f, &d) : NULL;
    int hot = 0;
    if (fn && d->OccupancyMaxActiveBlocksPerMultiprocessor(&hot, fn, block, smem) == CUDA_SUCCESS)
        *n = hot;
    return r;
}

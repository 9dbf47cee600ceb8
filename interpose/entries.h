/*
 * The runtime entry points the interposition takes over, once, for both
 * ways in: X(return type, name, parameters, arguments, the core's call).
 * preload.c defines each under its own name and forwards to the next
 * definition; wrap.c defines __wrap_<name> and forwards to __real_<name>.
 */
#ifndef HK_INTERPOSE_ENTRIES_H
#define HK_INTERPOSE_ENTRIES_H

#define HKI_LAUNCH_ARGS(t, k) t k, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s
#define HKI_ENTRIES(X)                                                                             \
    HKI_SYNC_ENTRIES(X)                                                                            \
    X(klaunch, __cudaLaunchKernel, (HKI_LAUNCH_ARGS(cudaKernel_t, k)),                             \
      hki_klaunch(0, k, g, b, a, sh, s))                                                           \
    X(klaunch_ptsz, __cudaLaunchKernel_ptsz, (HKI_LAUNCH_ARGS(cudaKernel_t, k)),                   \
      hki_klaunch(1, k, g, b, a, sh, s))                                                           \
    X(launch, cudaLaunchKernel, (HKI_LAUNCH_ARGS(const void *, f)),                                \
      hki_launch(0, f, g, b, a, sh, s))                                                            \
    X(launch_ptsz, cudaLaunchKernel_ptsz, (HKI_LAUNCH_ARGS(const void *, f)),                      \
      hki_launch(1, f, g, b, a, sh, s))                                                            \
    X(xlaunch, cudaLaunchKernelExC, (const cudaLaunchConfig_t *c, const void *f, void **a),        \
      hki_xlaunch(0, c, f, a))                                                                     \
    X(xlaunch_ptsz, cudaLaunchKernelExC_ptsz,                                                      \
      (const cudaLaunchConfig_t *c, const void *f, void **a), hki_xlaunch(1, c, f, a))             \
    X(to_symbol, cudaMemcpyToSymbol,                                                               \
      (const void *y, const void *src, size_t n, size_t off, enum cudaMemcpyKind kind),            \
      hki_to_symbol(0, 0, y, src, n, off, kind, 0))                                                \
    X(to_symbol_ptds, cudaMemcpyToSymbol_ptds,                                                     \
      (const void *y, const void *src, size_t n, size_t off, enum cudaMemcpyKind kind),            \
      hki_to_symbol(0, 1, y, src, n, off, kind, 0))                                                \
    X(to_symbol_async, cudaMemcpyToSymbolAsync,                                                    \
      (const void *y, const void *src, size_t n, size_t off, enum cudaMemcpyKind kind,             \
       cudaStream_t s),                                                                            \
      hki_to_symbol(1, 0, y, src, n, off, kind, s))                                                \
    X(to_symbol_async_ptsz, cudaMemcpyToSymbolAsync_ptsz,                                          \
      (const void *y, const void *src, size_t n, size_t off, enum cudaMemcpyKind kind,             \
       cudaStream_t s),                                                                            \
      hki_to_symbol(1, 1, y, src, n, off, kind, s))                                                \
    X(from_symbol, cudaMemcpyFromSymbol,                                                           \
      (void *dst, const void *y, size_t n, size_t off, enum cudaMemcpyKind kind),                  \
      hki_from_symbol(0, 0, dst, y, n, off, kind, 0))                                              \
    X(from_symbol_ptds, cudaMemcpyFromSymbol_ptds,                                                 \
      (void *dst, const void *y, size_t n, size_t off, enum cudaMemcpyKind kind),                  \
      hki_from_symbol(0, 1, dst, y, n, off, kind, 0))                                              \
    X(from_symbol_async, cudaMemcpyFromSymbolAsync,                                                \
      (void *dst, const void *y, size_t n, size_t off, enum cudaMemcpyKind kind, cudaStream_t s),  \
      hki_from_symbol(1, 0, dst, y, n, off, kind, s))                                              \
    X(from_symbol_async_ptsz, cudaMemcpyFromSymbolAsync_ptsz,                                      \
      (void *dst, const void *y, size_t n, size_t off, enum cudaMemcpyKind kind, cudaStream_t s),  \
      hki_from_symbol(1, 1, dst, y, n, off, kind, s))                                              \
    X(symbol_address, cudaGetSymbolAddress, (void **p, const void *y), hki_symbol_address(p, y))   \
    HKI_ENTRIES_FIT(X)

/* Per-function settings, cooperative launches and what describes a kernel's
 * fit (attrs.c, route.c): the settings are recorded for every hot version,
 * the queries answer for the version that runs. */
#define HKI_ENTRIES_FIT(X)                                                                         \
    X(coop_launch, cudaLaunchCooperativeKernel, (HKI_LAUNCH_ARGS(const void *, f)),                \
      hki_coop_launch(0, f, g, b, a, sh, s))                                                       \
    X(coop_launch_ptsz, cudaLaunchCooperativeKernel_ptsz, (HKI_LAUNCH_ARGS(const void *, f)),      \
      hki_coop_launch(1, f, g, b, a, sh, s))                                                       \
    X(func_set_attribute, cudaFuncSetAttribute, (const void *f, enum cudaFuncAttribute at, int v), \
      hki_func_set_attribute(f, at, v))                                                            \
    X(func_set_cache_config, cudaFuncSetCacheConfig, (const void *f, enum cudaFuncCache c),        \
      hki_func_set_cache_config(f, c))                                                             \
    X(kernel_set_attribute, cudaKernelSetAttributeForDevice,                                       \
      (cudaKernel_t k, enum cudaFuncAttribute at, int v, int dev),                                 \
      hki_kernel_set_attribute(k, at, v, dev))                                                     \
    X(func_get_attributes, cudaFuncGetAttributes, (struct cudaFuncAttributes * p, const void *f),  \
      hki_func_get_attributes(p, f))                                                               \
    X(occupancy, cudaOccupancyMaxActiveBlocksPerMultiprocessor,                                    \
      (int *n, const void *f, int bs, size_t sm), hki_occupancy(n, f, bs, sm))                     \
    X(occupancy_flags, cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,                     \
      (int *n, const void *f, int bs, size_t sm, unsigned fl),                                     \
      hki_occupancy_flags(n, f, bs, sm, fl))

/* ---- synchronisations: automatic safe points (sync.c) ----
 * After each that returns success, with a version or an unload waiting for
 * a safe point, the program's streams are asked whether they are all idle.
 * cudaStreamDestroy takes the stream off the list of those asked. */
#define HKI_SYNC_ENTRIES(X)                                                                        \
    X(sync.device, cudaDeviceSynchronize, (void), hki_device_sync())                               \
    X(sync.stream, cudaStreamSynchronize, (cudaStream_t s), hki_stream_sync(0, s))                 \
    X(sync.stream_ptsz, cudaStreamSynchronize_ptsz, (cudaStream_t s), hki_stream_sync(1, s))       \
    X(sync.query, cudaStreamQuery, (cudaStream_t s), hki_stream_query(0, s))                       \
    X(sync.query_ptsz, cudaStreamQuery_ptsz, (cudaStream_t s), hki_stream_query(1, s))             \
    X(sync.event, cudaEventSynchronize, (cudaEvent_t e), hki_event_sync(e))                        \
    X(sync.event_query, cudaEventQuery, (cudaEvent_t e), hki_event_query(e))                       \
    X(memcpy, cudaMemcpy, (void *d, const void *src, size_t n, enum cudaMemcpyKind kind),          \
      hki_memcpy(0, d, src, n, kind))                                                              \
    X(sync.memcpy_ptds, cudaMemcpy_ptds,                                                           \
      (void *d, const void *src, size_t n, enum cudaMemcpyKind kind),                              \
      hki_memcpy(1, d, src, n, kind))                                                              \
    X(sync.stream_destroy, cudaStreamDestroy, (cudaStream_t s), hki_stream_destroy(s))

/* __cudaRegisterVar returns nothing: taken apart from the list above. */
#define HKI_REGVAR_PARAMS                                                                          \
    (void **fb, char *hv, char *da, const char *nm, int ext, size_t sz, int cst, int glb)
#define HKI_REGVAR_CALL hki_register_var(fb, hv, da, nm, ext, sz, cst, glb)

/* ---- translation units (tu.c): which file each kernel and variable is
 * registered from. Return types differ: one list per type. ---- */
/* Returning cudaError_t: as HKI_ENTRIES. __cudaGetKernel is how nvcc's
 * stub takes its kernel's handle: which host stub (so which TU) a handle
 * is. */
#define HKI_TU_ENTRIES(X)                                                                          \
    X(stub_kernel, __cudaGetKernel, (cudaKernel_t * k, const void *f), hki_stub_kernel(k, f))
#define HKI_REGFAT_PARAMS (void *w)
#define HKI_REGFAT_CALL   hki_register_fatbin(w)
#define HKI_FATHANDLE_ENTRIES(X)                                                                   \
    X(register_fatbin_end, __cudaRegisterFatBinaryEnd, hki_register_fatbin_end)                    \
    X(unregister_fatbin, __cudaUnregisterFatBinary, hki_unregister_fatbin)
#define HKI_REGFUN_PARAMS                                                                          \
    (void **h, const char *hf, char *df, const char *dn, int tl, uint3 *ti, uint3 *bi, dim3 *bd,   \
     dim3 *gd, int *ws)
#define HKI_REGFUN_CALL hki_register_function(h, hf, df, dn, tl, ti, bi, bd, gd, ws)

#endif

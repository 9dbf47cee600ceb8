/*
 * interpose/: hot reload for programs as they are. The program's kernels are
 * nvcc-built and launched with <<<>>> (and cudaLaunchKernel[Ex]); this room
 * sits between those launches and the CUDA runtime, as a source of launches
 * above the engine (like hk_launch's callers), and routes each launch of a
 * kernel that has a hot version to that version, every other one to the
 * program's own code, untouched.
 *
 * Two ways in, one core:
 *   preload.c  libhotkern-preload.so, named in LD_PRELOAD, for programs
 *              linked with -cudart shared: it defines the runtime's entry
 *              points and forwards to the next definition (dlsym RTLD_NEXT);
 *   wrap.c     libhotkern-wrap.a, for nvcc's default static cudart: the
 *              program links with -Wl,--wrap=... and the __wrap_ functions
 *              forward to __real_.
 * Both fill an hki_real table with the functions they forward to, and call
 * the core (route.c), which never calls a runtime entry point by name (in
 * the preload library that name is its own).
 *
 * The core keys everything by the handle a launch passes: the cudaKernel_t
 * of __cudaLaunchKernel (nvcc's stub takes it once, by __cudaGetKernel) or
 * the function pointer of cudaLaunchKernel. The first launch of a handle
 * registers the kernel with the engine (loader/expect.c: its name as the
 * driver reports it, its parameter layout, the name expression of a
 * template instantiation); every launch after that is one lock-free table
 * lookup and one load of the hot handle, NULL while no hot version exists.
 */
#ifndef HK_INTERPOSE_H
#define HK_INTERPOSE_H

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "hotkern/hotkern.h"

typedef cudaError_t (*hki_klaunch_fn)(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);
typedef cudaError_t (*hki_flaunch_fn)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
typedef cudaError_t (*hki_xlaunch_fn)(const cudaLaunchConfig_t *, const void *, void **);
typedef void (*hki_regvar_fn)(void **, char *, char *, const char *, int, size_t, int, int);
typedef cudaError_t (*hki_tosym_fn)(const void *, const void *, size_t, size_t,
                                    enum cudaMemcpyKind);
typedef cudaError_t (*hki_tosym_async_fn)(const void *, const void *, size_t, size_t,
                                          enum cudaMemcpyKind, cudaStream_t);
typedef cudaError_t (*hki_fromsym_fn)(void *, const void *, size_t, size_t, enum cudaMemcpyKind);
typedef cudaError_t (*hki_fromsym_async_fn)(void *, const void *, size_t, size_t,
                                            enum cudaMemcpyKind, cudaStream_t);
typedef cudaError_t (*hki_symaddr_fn)(void **, const void *);
typedef cudaError_t (*hki_getkernel_fn)(cudaKernel_t *, const void *);
typedef cudaError_t (*hki_memcpy_fn)(void *, const void *, size_t, enum cudaMemcpyKind);
typedef void **(*hki_regfat_fn)(void *);
typedef void (*hki_fathandle_fn)(void **);
typedef void (*hki_regfun_fn)(void **, const char *, char *, const char *, int, uint3 *, uint3 *,
                              dim3 *, dim3 *, int *);
typedef cudaError_t (*hki_memcpy_async_fn)(void *, const void *, size_t, enum cudaMemcpyKind,
                                           cudaStream_t);
/* Per-function settings and cooperative launches (attrs.c, route.c). */
typedef cudaError_t (*hki_func_set_attr_fn)(const void *, enum cudaFuncAttribute, int);
typedef cudaError_t (*hki_func_set_cache_fn)(const void *, enum cudaFuncCache);
typedef cudaError_t (*hki_kernel_set_attr_fn)(cudaKernel_t, enum cudaFuncAttribute, int, int);
typedef cudaError_t (*hki_func_get_attrs_fn)(struct cudaFuncAttributes *, const void *);
typedef cudaError_t (*hki_occupancy_fn)(int *, const void *, int, size_t);
typedef cudaError_t (*hki_occupancy_flags_fn)(int *, const void *, int, size_t, unsigned);

/* ---- synchronisations (sync.c): automatic safe points ---- */
typedef cudaError_t (*hki_stream_fn)(cudaStream_t);
typedef cudaError_t (*hki_event_fn)(cudaEvent_t);
typedef struct hki_sync_real {
    cudaError_t (*device)(void);       /* cudaDeviceSynchronize */
    hki_stream_fn stream, stream_ptsz; /* cudaStreamSynchronize[_ptsz] */
    hki_stream_fn query, query_ptsz;   /* cudaStreamQuery[_ptsz] */
    hki_event_fn event, event_query;   /* cudaEventSynchronize, cudaEventQuery */
    hki_memcpy_fn memcpy_ptds;         /* cudaMemcpy_ptds (cudaMemcpy: memcpy) */
    hki_stream_fn stream_destroy;      /* cudaStreamDestroy */
} hki_sync_real;
cudaError_t hki_device_sync(void);
cudaError_t hki_stream_sync(int ptsz, cudaStream_t s);
cudaError_t hki_stream_query(int ptsz, cudaStream_t s);
cudaError_t hki_event_sync(cudaEvent_t e);
cudaError_t hki_event_query(cudaEvent_t e);
cudaError_t hki_memcpy(int ptds, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind);
cudaError_t hki_stream_destroy(cudaStream_t s);

/* What the way in forwards to: the program's runtime. Every field is set
 * (the preload library resolves them at its first call; a missing one makes
 * it forward only, never route). */
typedef struct hki_real {
    hki_klaunch_fn klaunch, klaunch_ptsz;   /* __cudaLaunchKernel[_ptsz] */
    hki_flaunch_fn launch, launch_ptsz;     /* cudaLaunchKernel[_ptsz] */
    hki_xlaunch_fn xlaunch, xlaunch_ptsz;   /* cudaLaunchKernelExC[_ptsz] */
    hki_regvar_fn register_var;             /* __cudaRegisterVar */
    hki_tosym_fn to_symbol, to_symbol_ptds; /* cudaMemcpyToSymbol[_ptds] */
    hki_tosym_async_fn to_symbol_async, to_symbol_async_ptsz;
    hki_fromsym_fn from_symbol, from_symbol_ptds; /* cudaMemcpyFromSymbol[_ptds] */
    hki_fromsym_async_fn from_symbol_async, from_symbol_async_ptsz;
    hki_symaddr_fn symbol_address; /* cudaGetSymbolAddress */
    /* per-function settings and cooperative launches */
    hki_flaunch_fn coop_launch, coop_launch_ptsz; /* cudaLaunchCooperativeKernel[_ptsz] */
    hki_func_set_attr_fn func_set_attribute;      /* cudaFuncSetAttribute */
    hki_func_set_cache_fn func_set_cache_config;  /* cudaFuncSetCacheConfig */
    hki_kernel_set_attr_fn kernel_set_attribute;  /* cudaKernelSetAttributeForDevice */
    hki_func_get_attrs_fn func_get_attributes;    /* cudaFuncGetAttributes */
    hki_occupancy_fn occupancy;             /* cudaOccupancyMaxActiveBlocksPerMultiprocessor */
    hki_occupancy_flags_fn occupancy_flags; /* ...WithFlags */
    /* the translation units' registration (tu.c) */
    hki_regfat_fn register_fatbin;        /* __cudaRegisterFatBinary */
    hki_fathandle_fn register_fatbin_end; /* __cudaRegisterFatBinaryEnd */
    hki_fathandle_fn unregister_fatbin;   /* __cudaUnregisterFatBinary */
    hki_regfun_fn register_function;      /* __cudaRegisterFunction */
    hki_getkernel_fn stub_kernel;         /* __cudaGetKernel */
    /* called, never interposed */
    hki_getkernel_fn get_kernel; /* cudaGetKernel */
    hki_memcpy_fn memcpy;        /* cudaMemcpy (interposed too: sync.c) */
    hki_memcpy_async_fn memcpy_async;
    hki_sync_real sync; /* sync.c's */
} hki_real;

/* The core (route.c). hki_real_set is called once, before anything else,
 * by the way in; the rest are its entry points, one per interposed runtime
 * function, `ptsz` saying which variant was called (_ptsz, or for the
 * synchronous symbol copies _ptds: the per-thread default stream's). */
void hki_real_set(const hki_real *real);
cudaError_t hki_klaunch(int ptsz, cudaKernel_t k, dim3 g, dim3 b, void **args, size_t shm,
                        cudaStream_t s);
cudaError_t hki_launch(int ptsz, const void *f, dim3 g, dim3 b, void **args, size_t shm,
                       cudaStream_t s);
cudaError_t hki_xlaunch(int ptsz, const cudaLaunchConfig_t *c, const void *f, void **args);
void hki_register_var(void **fatbin, char *host_var, char *device_addr, const char *name, int ext,
                      size_t size, int constant, int global);
cudaError_t hki_to_symbol(int async, int ptsz, const void *sym, const void *src, size_t count,
                          size_t offset, enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t hki_from_symbol(int async, int ptsz, void *dst, const void *sym, size_t count,
                            size_t offset, enum cudaMemcpyKind kind, cudaStream_t s);
cudaError_t hki_symbol_address(void **p, const void *sym);
void **hki_register_fatbin(void *wrapper);
void hki_register_fatbin_end(void **handle);
void hki_unregister_fatbin(void **handle);
cudaError_t hki_stub_kernel(cudaKernel_t *k, const void *host);
void hki_register_function(void **handle, const char *host, char *dev, const char *name, int limit,
                           uint3 *tid, uint3 *bid, dim3 *bdim, dim3 *gdim, int *wsize);

/* tu.c: the translation units (see there). hki_tu_begin/_function/_var/_end
 * record a TU's registration; hki_tu_id and hki_tu_of_host name the TU of
 * a fatbin handle or a host stub (0: none); hki_tu_hosts lists up to max
 * live host stubs of kernel `name` with their TUs; hki_tu_stub_kernel
 * records which host stub __cudaGetKernel gave a handle for, and
 * hki_tu_host_of_kernel says (NULL: not seen); hki_tu_key records a
 * launch handle of TU id; hki_tu_gone marks the TU of handle unregistered
 * and hands back its launch handles (malloc'd, *keys); hki_tus_tell tells
 * rt of every TU it does not know yet. */
void hki_tu_begin(void **handle, const void *wrapper);
void hki_tu_function(void **handle, const void *host, const char *name);
void hki_tu_var(void **handle, const void *host, const char *name);
void hki_tu_end(hk_runtime *rt, void **handle);
unsigned hki_tu_id(void **handle);
unsigned hki_tu_of_host(const void *host);
int hki_tu_hosts(const char *name, const void **hosts, unsigned *ids, int max);
void hki_tu_stub_kernel(const void *kernel, const void *host);
const void *hki_tu_host_of_kernel(const void *kernel);
void hki_tu_key(unsigned id, const void *key);
int hki_tu_gone(hk_runtime *rt, void **handle, const void ***keys);
void hki_tus_tell(hk_runtime *rt);
/* Which file an address of the program's image is from: 1 with its stem
 * ("a" for a.cu) in stem[n]. The default reads the image's ELF symbols;
 * tests set their own (NULL: the default again). */
typedef int (*hki_file_fn)(const void *addr, char *stem, size_t n);
void hki_file_lookup_set(hki_file_fn fn);

/* What the image readers below return when they read nothing: the bytes are
 * no image of their kind (or, for hki_elf_files, memory ran out). Its value
 * is fixed (the fuzz targets and tests check it). */
#define HKI_NOT_IMAGE (-1)
/* elfsym.c: in the ELF64 image buf[len], the stem of the STT_FILE symbol
 * heading the local symbol at address addr: 1 with it in out[n], 0 when
 * none, HKI_NOT_IMAGE when buf is no ELF64 image with a symbol table.
 * hki_file_stem: a path's file name up to its first '.'. */
#define HKI_STEM_MAX 128
/* fatbin.c: the stem of the identifier a fatbin's entries carry (fatbinary
 * --ident; nvcc 13 writes none): in buf[len], 1 with it in out[n], 0 when
 * none, HKI_NOT_IMAGE when buf is no fatbin; hki_fatbin_wrapper_ident: the
 * same from __cudaRegisterFatBinary's wrapper (1 or 0). */
int hki_fatbin_ident(const unsigned char *buf, size_t len, char *out, size_t n);
int hki_fatbin_wrapper_ident(const void *wrapper, char *out, size_t n);
int hki_elf_file_of(const unsigned char *buf, size_t len, uint64_t addr, char *out, size_t n);
/* The same for n addresses at once (one pass over the symbols): the count
 * found, out[i] "" where none; HKI_NOT_IMAGE as above. */
int hki_elf_files(const unsigned char *buf, size_t len, const uint64_t *addr, int n,
                  char (*out)[HKI_STEM_MAX]);
void hki_file_stem(const char *path, char *out, size_t n);

/* Cooperative launches, routed as <<<>>> (route.c), and the per-function
 * settings (attrs.c): cudaFuncSetAttribute, cudaFuncSetCacheConfig and
 * cudaKernelSetAttributeForDevice go to the program's runtime and are
 * recorded for every hot version of the kernel (hkl_expect_set_attr);
 * cudaFuncGetAttributes and the two block-occupancy calls answer for the
 * version that runs. hki_expect_of: the program's kernel of a handle (a
 * function pointer when is_func), registered if new; NULL when it is none.
 * hki_real_get: the table hki_real_set was given. */
cudaError_t hki_coop_launch(int ptsz, const void *f, dim3 g, dim3 b, void **args, size_t shm,
                            cudaStream_t s);
cudaError_t hki_func_set_attribute(const void *f, enum cudaFuncAttribute attr, int value);
cudaError_t hki_func_set_cache_config(const void *f, enum cudaFuncCache config);
cudaError_t hki_kernel_set_attribute(cudaKernel_t k, enum cudaFuncAttribute attr, int value,
                                     int device);
cudaError_t hki_func_get_attributes(struct cudaFuncAttributes *p, const void *f);
cudaError_t hki_occupancy(int *n, const void *f, int block, size_t smem);
cudaError_t hki_occupancy_flags(int *n, const void *f, int block, size_t smem, unsigned flags);
struct hkl_expect *hki_expect_of(const void *key, int is_func);
const hki_real *hki_real_get(void);

/* primary.c: hk_runtime_create, in device 0's primary context whatever
 * context the calling thread has current (put back after). drv NULL: the
 * real driver; else a table the runtime takes (hkl_runtime_create_with). */
struct hkb_driver;
int hki_runtime_create(hk_runtime **out, const hk_options *o, const struct hkb_driver *drv,
                       hk_report *rep);

/* demangle.c: the name expression that makes NVRTC instantiate the kernel
 * the driver calls `name` ("scale<float>" for _Z5scaleIfEvPT_S0_i), or NULL
 * for a kernel that needs none (a C name, a C++ function that is no
 * template) or a name it cannot read. malloc'd. */
char *hki_name_expression(const char *name);

/* env.c: the configuration HOTKERN_* gives, checked whole. */
typedef struct hki_env {
    int off, canary, restore, allow_unsigned, endpoint;
    const char *watch, *state_dir, *cache_dir, *trusted_key, *token, *origin; /* the environ's */
    char address[64]; /* HOTKERN_ENDPOINT's, "127.0.0.1" when it names a port only */
    unsigned port;
    int refused;    /* how many values were refused */
    char why[2048]; /* a "hotkern: NAME=VALUE: why" line for each */
} hki_env;
/* Reads HOTKERN_*: 0 when it all parses, 1 for HOTKERN_OFF, HK_ERR_INVALID
 * when any value is refused (e->why says each). */
int hki_env_read(hki_env *e);
/* The runtime HOTKERN_* asks for, made(rt) called before its sources
 * start; NULL (said on stderr) when a value is refused or the runtime or a
 * source cannot be made (destroyed then), and, silently, under
 * HOTKERN_OFF. */
hk_runtime *hki_env_runtime(void (*made)(hk_runtime *rt));

/* env.c: said once on stderr by the preload library's constructor when
 * the program has no shared CUDA runtime to interpose (have_cudart 0) but
 * device code of its own: its runtime is linked in statically, out of the
 * preload library's reach (unless HOTKERN_OFF, or the program is linked
 * with the interposition: wrap.c marks it with this section). */
#define HKI_WRAP_SECTION ".hotkern_wrap"
void hki_preload_check(int have_cudart);

/* For tests: the runtime launches route through (an attached one or the
 * one made from the environment), and how many handles were registered. */
hk_runtime *hki_runtime(void);
int hki_registered(void);

#endif /* HK_INTERPOSE_H */

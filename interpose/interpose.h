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
    /* the translation units' registration (tu.c) */
    hki_regfat_fn register_fatbin;        /* __cudaRegisterFatBinary */
    hki_fathandle_fn register_fatbin_end; /* __cudaRegisterFatBinaryEnd */
    hki_fathandle_fn unregister_fatbin;   /* __cudaUnregisterFatBinary */
    hki_regfun_fn register_function;      /* __cudaRegisterFunction */
    hki_getkernel_fn stub_kernel;         /* __cudaGetKernel */
    /* called, never interposed */
    hki_getkernel_fn get_kernel; /* cudaGetKernel */
    hki_memcpy_fn memcpy;        /* cudaMemcpy */
    hki_memcpy_async_fn memcpy_async;
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

/* elfsym.c: in the ELF64 image buf[len], the stem of the STT_FILE symbol
 * heading the local symbol at address addr: 1 with it in out[n], 0 when
 * none, -1 when buf is no ELF64 image with a symbol table. hki_file_stem:
 * a path's file name up to its first '.'. */
#define HKI_STEM_MAX 128
/* fatbin.c: the stem of the identifier a fatbin's entries carry (fatbinary
 * --ident; nvcc 13 writes none): in buf[len], 1 with it in out[n], 0 when
 * none, -1 when buf is no fatbin; hki_fatbin_wrapper_ident: the same from
 * __cudaRegisterFatBinary's wrapper (1 or 0). */
int hki_fatbin_ident(const unsigned char *buf, size_t len, char *out, size_t n);
int hki_fatbin_wrapper_ident(const void *wrapper, char *out, size_t n);
int hki_elf_file_of(const unsigned char *buf, size_t len, uint64_t addr, char *out, size_t n);
/* The same for n addresses at once (one pass over the symbols): the count
 * found, out[i] "" where none; -1 as above. */
int hki_elf_files(const unsigned char *buf, size_t len, const uint64_t *addr, int n,
                  char (*out)[HKI_STEM_MAX]);
void hki_file_stem(const char *path, char *out, size_t n);

/* demangle.c: the name expression that makes NVRTC instantiate the kernel
 * the driver calls `name` ("scale<float>" for _Z5scaleIfEvPT_S0_i), or NULL
 * for a kernel that needs none (a C name, a C++ function that is no
 * template) or a name it cannot read. malloc'd. */
char *hki_name_expression(const char *name);

/* For tests: the runtime launches route through (an attached one or the
 * one made from the environment), and how many handles were registered. */
hk_runtime *hki_runtime(void);
int hki_registered(void);

#endif /* HK_INTERPOSE_H */

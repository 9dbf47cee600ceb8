/*
 * The toolkit's headers: where they are, and what version they are.
 *
 * Real kernels include cub, cuda::std, cooperative_groups and cuda_fp16, none
 * of which NVRTC finds by itself ("no directories in search list"). The
 * headers that match the compiler are the ones shipped beside it, so the
 * toolkit is looked for first from the NVRTC library this process loaded (its
 * directory's parent holds include/), then under $CUDA_HOME, $CUDA_PATH and
 * /usr/local/cuda. A toolkit root counts when its include/ has cuda_fp16.h;
 * include/cccl (CUDA 13 keeps cub, thrust and cuda::std there) is used when
 * it exists, in nvcc's order: include/ first, then include/cccl.
 *
 * Toolkit headers are read-only in practice and number in the hundreds for a
 * single cub include, so the compile cache does not hash them one by one:
 * they count as system headers, identified as a whole by a fingerprint of the
 * directories, the NVRTC library and the size, time and inode of a few files
 * that every toolkit update replaces. The same property lets PCH cover them
 * (see nvrtc.c). Found once per process; immutable afterwards.
 */
#include <dlfcn.h>
#include <link.h>
#include <nvrtc.h>
#include <limits.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ptx/ptx.h"

static hkp_toolkit toolkit;
static pthread_once_t toolkit_once = PTHREAD_ONCE_INIT;

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int find_nvrtc(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    const char *name = info->dlpi_name;
    const char *base = name ? strrchr(name, '/') : NULL;
    base = base ? base + 1 : name;
    if (!base || strncmp(base, "libnvrtc.so", 11) != 0)
        return 0;
    snprintf(data, PATH_MAX, "%s", name);
    return 1;
}

/* The directory above the one that holds the loaded libnvrtc. */
static int root_from_nvrtc(char *out, size_t n) {
    char lib[PATH_MAX] = "", real[PATH_MAX];
    dl_iterate_phdr(find_nvrtc, lib);
    if (!lib[0] || !realpath(lib, real))
        return 0;
    snprintf(toolkit.nvrtc, sizeof toolkit.nvrtc, "%s", real);
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(real, '/');
        if (!slash || slash == real)
            return 0;
        *slash = '\0';
    }
    snprintf(out, n, "%s", real);
    return 1;
}

/* Fills toolkit.include / cccl from root when root is a toolkit. */
static int try_root(const char *root) {
    char buf[PATH_MAX + 64], inc[PATH_MAX], cccl[PATH_MAX];
    if (!root || !root[0])
        return 0;
    snprintf(buf, sizeof buf, "%s/include/cuda_fp16.h", root);
    if (!is_file(buf))
        return 0;
    snprintf(buf, sizeof buf, "%s/include", root);
    if (!realpath(buf, inc))
        return 0;
    snprintf(toolkit.include, sizeof toolkit.include, "%s", inc);
    snprintf(buf, sizeof buf, "%s/cccl/cuda/std/cstdint", inc);
    if (is_file(buf) && snprintf(buf, sizeof buf, "%s/cccl", inc) > 0 && realpath(buf, cccl))
        snprintf(toolkit.cccl, sizeof toolkit.cccl, "%s", cccl);
    return 1;
}

static void h_stat(crypto_generichash_state *st, const char *path) {
    struct stat s;
    char buf[PATH_MAX + 128];
    int n = stat(path, &s) == 0 ? snprintf(buf, sizeof buf, "%s %lld %lld.%09ld %llu", path,
                                           (long long)s.st_size, (long long)s.st_mtim.tv_sec,
                                           s.st_mtim.tv_nsec, (unsigned long long)s.st_ino)
                                : snprintf(buf, sizeof buf, "%s absent", path);
    crypto_generichash_update(st, (const unsigned char *)buf, (size_t)n + 1);
}

static void locate(void) {
    static const char *const marks[] = {"cuda_fp16.hpp", "cuda_bf16.hpp", "cooperative_groups.h",
                                        "cuda_runtime_api.h", "cuda.h"};
    char root[PATH_MAX];
    int found = root_from_nvrtc(root, sizeof root) && try_root(root);
    if (!found)
        found = try_root(getenv("CUDA_HOME"));
    if (!found)
        found = try_root(getenv("CUDA_PATH"));
    if (!found)
        found = try_root("/usr/local/cuda");
    if (!found) {
        toolkit.include[0] = toolkit.cccl[0] = '\0';
    }

    crypto_generichash_state st;
    char path[PATH_MAX + 64];
    int maj = 0, min = 0;
    if (sodium_init() < 0)
        return; /* the fingerprint stays zero: the cache is off then anyway */
    crypto_generichash_init(&st, NULL, 0, HKP_KEY_BYTES);
    nvrtcVersion(&maj, &min);
    snprintf(path, sizeof path, "nvrtc %d.%d", maj, min);
    crypto_generichash_update(&st, (const unsigned char *)path, strlen(path) + 1);
    crypto_generichash_update(&st, (const unsigned char *)toolkit.include,
                              strlen(toolkit.include) + 1);
    crypto_generichash_update(&st, (const unsigned char *)toolkit.cccl, strlen(toolkit.cccl) + 1);
    if (toolkit.nvrtc[0])
        h_stat(&st, toolkit.nvrtc);
    for (size_t i = 0; toolkit.include[0] && i < sizeof marks / sizeof marks[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", toolkit.include, marks[i]);
        h_stat(&st, path);
    }
    if (toolkit.cccl[0]) {
        snprintf(path, sizeof path, "%s/cuda/std/__cccl/version.h", toolkit.cccl);
        h_stat(&st, path);
        snprintf(path, sizeof path, "%s/cub/version.cuh", toolkit.cccl);
        h_stat(&st, path);
    }
    crypto_generichash_final(&st, toolkit.fingerprint, sizeof toolkit.fingerprint);
}

const hkp_toolkit *hkp_toolkit_get(void) {
    pthread_once(&toolkit_once, locate);
    return &toolkit;
}

static int under(const char *dir, const char *path) {
    size_t n = strlen(dir);
    return n && strncmp(path, dir, n) == 0 && path[n] == '/';
}

int hkp_toolkit_owns(const hkp_toolkit *t, const char *path) {
    return t && path && (under(t->include, path) || under(t->cccl, path));
}

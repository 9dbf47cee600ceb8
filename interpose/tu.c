/*
 * The program's translation units, as nvcc's registration code names them:
 * each file's fatbin is registered on its own (__cudaRegisterFatBinary
 * returns its handle), then its kernels (__cudaRegisterFunction: handle,
 * host stub, device name) and variables (__cudaRegisterVar, route.c), then
 * __cudaRegisterFatBinaryEnd; __cudaUnregisterFatBinary at exit or dlclose.
 * nvcc gives file-local kernels and variables the same names in every file,
 * so a TU's number goes with every kernel and variable the engine is told
 * of (loader/expect_tu.c decides which module reaches which).
 *
 * A TU's file is learnt once, when the engine is first told of it: from the
 * ELF symbol table of the image that holds its host stubs or variables
 * (elfsym.c), else its fatbin's identifier (fatbin.c), or a test's lookup
 * (hki_file_lookup_set). A TU whose file cannot be learnt is told without
 * one. The handle each stub takes (__cudaGetKernel) is kept with the stub,
 * so that a launch's cudaKernel_t finds its TU.
 *
 * Locks: tu_lock covers the list and every record; registration runs in
 * the program's constructors and dlopen, never on the launch path (a first
 * launch asks hki_tu_hosts, a slow path). Records of unloaded TUs are kept
 * (gone), so a handle or name never points at freed memory.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "interpose/interpose.h"
#include "loader/port.h"

typedef struct fun {
    const void *host;
    char *name;
} fun;

/* Every field under tu_lock. */
typedef struct tu {
    void **handle; /* __cudaRegisterFatBinary's */
    unsigned id;   /* 1, 2, ...: never reused */
    fun *funs;     /* its kernels */
    int nfuns, capfuns;
    char **vnames;       /* its variables' names */
    const void *vhost;   /* one variable's shadow, for the file lookup */
    const void *wrapper; /* __cudaRegisterFatBinary's argument: nvcc's file-local
                          * __fatDeviceText, which the TU's file heads */
    int nvars, capvars;
    const void **keys; /* launch handles registered for its kernels */
    int nkeys, capkeys;
    char ident[HKI_STEM_MAX]; /* its fatbin's identifier's stem, or "" */
    int told;                 /* the engine knows it */
    int gone;                 /* unregistered (dlclose, exit) */
    struct tu *next;
} tu;

/* The handles __cudaGetKernel gave, with the host stub each was for. */
typedef struct stub_kernel {
    const void *kernel, *host;
} stub_kernel;
static stub_kernel *stubs; /* tu_lock */
static int nstubs, capstubs;

static pthread_mutex_t tu_lock = PTHREAD_MUTEX_INITIALIZER;
static tu *tus;              /* tu_lock */
static unsigned next_id = 1; /* tu_lock */

static int elf_lookup(const void *addr, char *stem, size_t n);
static hki_file_fn file_lookup = elf_lookup;

void hki_file_lookup_set(hki_file_fn fn) {
    file_lookup = fn ? fn : elf_lookup;
}

static int grow(void **v, int *cap, int n, size_t elem) {
    if (n < *cap)
        return 0;
    int c = *cap ? 2 * *cap : 8;
    void *p = realloc(*v, (size_t)c * elem);
    if (!p)
        return HK_ERR_NOMEM;
    *v = p;
    *cap = c;
    return 0;
}

static tu *by_handle(void **h) {
    for (tu *t = tus; t; t = t->next)
        if (t->handle == h && !t->gone)
            return t;
    return NULL;
}

void hki_tu_begin(void **handle, const void *wrapper) {
    tu *t = calloc(1, sizeof *t);
    if (!t)
        return; /* unknown: its kernels are matched by name */
    if (hki_fatbin_wrapper_ident(wrapper, t->ident, sizeof t->ident) != 1)
        t->ident[0] = '\0';
    pthread_mutex_lock(&tu_lock);
    t->handle = handle;
    t->wrapper = wrapper;
    t->id = next_id++;
    t->next = tus;
    tus = t;
    pthread_mutex_unlock(&tu_lock);
}

void hki_tu_function(void **handle, const void *host, const char *name) {
    pthread_mutex_lock(&tu_lock);
    tu *t = by_handle(handle);
    char *n = name ? strdup(name) : NULL;
    if (t && n && grow((void **)&t->funs, &t->capfuns, t->nfuns, sizeof *t->funs) == 0) {
        t->funs[t->nfuns].host = host;
        t->funs[t->nfuns++].name = n;
        n = NULL;
    }
    free(n);
    pthread_mutex_unlock(&tu_lock);
}

void hki_tu_var(void **handle, const void *host, const char *name) {
    pthread_mutex_lock(&tu_lock);
    tu *t = by_handle(handle);
    char *n = name ? strdup(name) : NULL;
    if (t && n && grow((void **)&t->vnames, &t->capvars, t->nvars, sizeof *t->vnames) == 0) {
        t->vnames[t->nvars++] = n;
        t->vhost = t->vhost ? t->vhost : host;
        n = NULL;
    }
    free(n);
    pthread_mutex_unlock(&tu_lock);
}

unsigned hki_tu_id(void **handle) {
    pthread_mutex_lock(&tu_lock);
    tu *t = by_handle(handle);
    unsigned id = t ? t->id : 0;
    pthread_mutex_unlock(&tu_lock);
    return id;
}

int hki_tu_hosts(const char *name, const void **hosts, unsigned *ids, int max) {
    int n = 0;
    pthread_mutex_lock(&tu_lock);
    for (tu *t = tus; t; t = t->next)
        for (int i = 0; !t->gone && i < t->nfuns; i++)
            if (!strcmp(t->funs[i].name, name) && n < max) {
                hosts[n] = t->funs[i].host;
                ids[n++] = t->id;
            }
    pthread_mutex_unlock(&tu_lock);
    return n;
}

unsigned hki_tu_of_host(const void *host) {
    unsigned id = 0;
    pthread_mutex_lock(&tu_lock);
    for (tu *t = tus; t && !id; t = t->next)
        for (int i = 0; !t->gone && i < t->nfuns && !id; i++)
            if (t->funs[i].host == host)
                id = t->id;
    pthread_mutex_unlock(&tu_lock);
    return id;
}

void hki_tu_stub_kernel(const void *kernel, const void *host) {
    pthread_mutex_lock(&tu_lock);
    int i = 0;
    while (i < nstubs && stubs[i].kernel != kernel)
        i++;
    /* A handle value a later library reuses: the later stub's. */
    if (i < nstubs || grow((void **)&stubs, &capstubs, nstubs, sizeof *stubs) == 0) {
        stubs[i].kernel = kernel;
        stubs[i].host = host;
        nstubs += i == nstubs;
    }
    pthread_mutex_unlock(&tu_lock);
}

const void *hki_tu_host_of_kernel(const void *kernel) {
    const void *host = NULL;
    pthread_mutex_lock(&tu_lock);
    for (int i = 0; i < nstubs && !host; i++)
        if (stubs[i].kernel == kernel)
            host = stubs[i].host;
    pthread_mutex_unlock(&tu_lock);
    return host;
}

void hki_tu_key(unsigned id, const void *key) {
    pthread_mutex_lock(&tu_lock);
    for (tu *t = tus; t; t = t->next)
        if (t->id == id && grow((void **)&t->keys, &t->capkeys, t->nkeys, sizeof *t->keys) == 0)
            t->keys[t->nkeys++] = key;
    pthread_mutex_unlock(&tu_lock);
}

/* Tells rt of t: its file (stem, "" unknown) and names. tu_lock held. */
static void tell(hk_runtime *rt, tu *t, const char *stem) {
    int n = t->nfuns + t->nvars;
    const char **names = n ? calloc((size_t)n, sizeof *names) : NULL;
    if (n && !names)
        return;
    /* Kernels that are no template instances and variables first: a build
     * has the instances it was asked for only. */
    int k = 0;
    for (int i = 0; i < t->nfuns; i++) {
        char *expr = hki_name_expression(t->funs[i].name);
        if (!expr)
            names[k++] = t->funs[i].name;
        free(expr);
    }
    for (int i = 0; i < t->nvars; i++)
        names[k++] = t->vnames[i];
    int nplain = k;
    for (int i = 0; i < t->nfuns; i++) {
        char *expr = hki_name_expression(t->funs[i].name);
        if (expr)
            names[k++] = t->funs[i].name;
        free(expr);
    }
    t->told = hkl_expect_tu(rt, t->id, stem[0] ? stem : NULL, names, n, nplain) == 0;
    free(names);
    if (t->told)
        hk_log(rt, HK_LOG_DEBUG, "interpose",
               "translation unit %u: file %s, %d kernels, %d "
               "variables",
               t->id, stem[0] ? stem : "unknown", t->nfuns, t->nvars);
}

/* A few addresses of t to learn its file by: its fatbin wrapper (nvcc's
 * static __fatDeviceText: every TU has one, whatever its kernels), then its
 * stubs and a variable (a kernel that is not file-local has a global stub,
 * which no file heads). */
#define PROBES 6
static int probes(const tu *t, const void **out) {
    int n = 0;
    if (t->wrapper)
        out[n++] = t->wrapper;
    for (int i = 0; i < t->nfuns && n < PROBES - 1; i++)
        out[n++] = t->funs[i].host;
    if (t->vhost)
        out[n++] = t->vhost;
    return n;
}

static int elf_batch(const void *const *addr, int n, char (*stems)[HKI_STEM_MAX]);

/* Tells rt of every TU it does not know yet (or only t when one is
 * given), learning their files first: with the default lookup, one pass
 * over each image's symbols for all of them. tu_lock held. */
static void tell_new(hk_runtime *rt, tu *only) {
    int nt = 0;
    for (tu *t = tus; t; t = t->next)
        nt += !t->told && !t->gone && (!only || t == only);
    if (!nt)
        return;
    const void **addr = calloc((size_t)nt * PROBES, sizeof *addr);
    tu **owner = calloc((size_t)nt * PROBES, sizeof *owner);
    char(*stems)[HKI_STEM_MAX] = calloc((size_t)nt * PROBES, sizeof *stems);
    int n = 0;
    for (tu *t = tus; addr && owner && stems && t; t = t->next) {
        if (t->told || t->gone || (only && t != only))
            continue;
        int k = probes(t, addr + n);
        for (int i = 0; i < k; i++)
            owner[n + i] = t;
        n += k;
    }
    if (n && file_lookup == elf_lookup)
        elf_batch(addr, n, stems);
    else
        for (int i = 0; i < n; i++)
            if (file_lookup(addr[i], stems[i], HKI_STEM_MAX) != 1)
                stems[i][0] = '\0';
    for (tu *t = tus; t; t = t->next) {
        if (t->told || t->gone || (only && t != only))
            continue;
        const char *stem = "";
        for (int i = 0; i < n && !stem[0]; i++)
            if (owner[i] == t && stems[i][0])
                stem = stems[i];
        tell(rt, t, stem[0] ? stem : t->ident); /* the symbols first: nvcc 13 writes no ident */
    }
    free(addr);
    free(owner);
    free(stems);
}

void hki_tus_tell(hk_runtime *rt) {
    if (!rt)
        return;
    pthread_mutex_lock(&tu_lock);
    tell_new(rt, NULL);
    pthread_mutex_unlock(&tu_lock);
}

void hki_tu_end(hk_runtime *rt, void **handle) {
    if (!rt)
        return;
    pthread_mutex_lock(&tu_lock);
    tu *t = by_handle(handle);
    if (t && !t->told)
        tell_new(rt, t);
    pthread_mutex_unlock(&tu_lock);
}

int hki_tu_gone(hk_runtime *rt, void **handle, const void ***keys) {
    int n = 0;
    *keys = NULL;
    pthread_mutex_lock(&tu_lock);
    tu *t = by_handle(handle);
    if (t) {
        t->gone = 1;
        *keys = t->keys; /* the caller's now */
        n = t->nkeys;
        t->keys = NULL;
        t->nkeys = t->capkeys = 0;
        if (rt && t->told)
            hkl_expect_tu_gone(rt, t->id);
    }
    pthread_mutex_unlock(&tu_lock);
    return n;
}

/* ---- the default file lookup: the image's symbol table ------------------- */

typedef struct find_obj {
    uintptr_t addr;
    char path[4096];
    uintptr_t bias;
    int found;
} find_obj;

static int find_cb(struct dl_phdr_info *info, size_t size, void *arg) {
    find_obj *f = arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && f->addr >= lo && f->addr < lo + ph->p_memsz) {
            const char *name =
                info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "/proc/self/exe";
            size_t l = strlen(name);
            if (l >= sizeof f->path)
                return 0;
            memcpy(f->path, name, l + 1);
            f->bias = info->dlpi_addr;
            f->found = 1;
            return 1;
        }
    }
    return 0;
}

/* Maps the image at path and finds the files of the n addresses (already
 * relative to its load address). */
static void elf_image(const char *path, const uint64_t *rel, int n, char (*stems)[HKI_STEM_MAX]) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        void *img = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (img != MAP_FAILED) {
            hki_elf_files(img, (size_t)st.st_size, rel, n, stems);
            munmap(img, (size_t)st.st_size);
        }
    }
    close(fd);
}

static int elf_batch(const void *const *addr, int n, char (*stems)[HKI_STEM_MAX]) {
    find_obj *f = calloc((size_t)n, sizeof *f);
    uint64_t *rel = calloc((size_t)n, sizeof *rel);
    char(*got)[HKI_STEM_MAX] = calloc((size_t)n, sizeof *got);
    int *done = calloc((size_t)n, sizeof *done);
    if (!f || !rel || !got || !done) {
        free(f);
        free(rel);
        free(got);
        free(done);
        return HK_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) {
        f[i].addr = (uintptr_t)addr[i];
        dl_iterate_phdr(find_cb, &f[i]);
        done[i] = !f[i].found;
    }
    /* One image at a time: every address in it at once. */
    for (int i = 0; i < n; i++) {
        if (done[i])
            continue;
        int m = 0;
        int *idx = calloc((size_t)n, sizeof *idx);
        if (!idx)
            break;
        for (int k = i; k < n; k++)
            if (!done[k] && !strcmp(f[k].path, f[i].path)) {
                idx[m] = k;
                rel[m++] = (uint64_t)(f[k].addr - f[k].bias);
                done[k] = 1;
            }
        elf_image(f[i].path, rel, m, got);
        for (int k = 0; k < m; k++)
            memcpy(stems[idx[k]], got[k], HKI_STEM_MAX);
        free(idx);
    }
    free(f);
    free(rel);
    free(got);
    free(done);
    return 0;
}

static int elf_lookup(const void *addr, char *stem, size_t n) {
    char one[1][HKI_STEM_MAX];
    elf_batch(&addr, 1, one);
    snprintf(stem, n, "%s", one[0]);
    return stem[0] != '\0';
}

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
 * (elfsym.c), or a test's lookup (hki_file_lookup_set). A TU whose file
 * cannot be learnt is told without one.
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
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "interpose/interpose.h"
#include "loader/loader.h"

typedef struct fun {
    const void *host;
    char *name;
} fun;

typedef struct tu {
    void **handle; /* __cudaRegisterFatBinary's */
    unsigned id;   /* 1, 2, ...: never reused */
    fun *funs;     /* its kernels */
    int nfuns, capfuns;
    char **vnames;     /* its variables' names */
    const void *vhost; /* one variable's shadow, for the file lookup */
    int nvars, capvars;
    const void **keys; /* launch handles registered for its kernels */
    int nkeys, capkeys;
    int told; /* the engine knows it */
    int gone;
    struct tu *next;
} tu;

static pthread_mutex_t tu_lock = PTHREAD_MUTEX_INITIALIZER;
static tu *tus;
static unsigned next_id = 1;

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
        return -1;
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

void hki_tu_begin(void **handle) {
    tu *t = calloc(1, sizeof *t);
    if (!t)
        return; /* unknown: its kernels are matched by name */
    pthread_mutex_lock(&tu_lock);
    t->handle = handle;
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

void hki_tu_key(unsigned id, const void *key) {
    pthread_mutex_lock(&tu_lock);
    for (tu *t = tus; t; t = t->next)
        if (t->id == id && grow((void **)&t->keys, &t->capkeys, t->nkeys, sizeof *t->keys) == 0)
            t->keys[t->nkeys++] = key;
    pthread_mutex_unlock(&tu_lock);
}

/* Tells rt of t: its file and names. tu_lock held. */
static void tell(hk_runtime *rt, tu *t) {
    char stem[128] = "";
    /* A few tries: a kernel that is not file-local has a global stub. */
    for (int i = 0; i < t->nfuns && i < 4 && !stem[0]; i++)
        if (file_lookup(t->funs[i].host, stem, sizeof stem) != 1)
            stem[0] = '\0';
    if (!stem[0] && t->vhost && file_lookup(t->vhost, stem, sizeof stem) != 1)
        stem[0] = '\0';
    int n = t->nfuns + t->nvars;
    const char **names = n ? calloc((size_t)n, sizeof *names) : NULL;
    if (n && !names)
        return;
    for (int i = 0; i < t->nfuns; i++)
        names[i] = t->funs[i].name;
    for (int i = 0; i < t->nvars; i++)
        names[t->nfuns + i] = t->vnames[i];
    t->told = hkl_expect_tu(rt, t->id, stem[0] ? stem : NULL, names, n) == 0;
    free(names);
    if (t->told)
        hk_log(rt, HK_LOG_DEBUG, "interpose",
               "translation unit %u: file %s, %d kernels, %d "
               "variables",
               t->id, stem[0] ? stem : "unknown", t->nfuns, t->nvars);
}

void hki_tus_tell(hk_runtime *rt) {
    if (!rt)
        return;
    pthread_mutex_lock(&tu_lock);
    for (tu *t = tus; t; t = t->next)
        if (!t->told && !t->gone)
            tell(rt, t);
    pthread_mutex_unlock(&tu_lock);
}

void hki_tu_end(hk_runtime *rt, void **handle) {
    if (!rt)
        return;
    pthread_mutex_lock(&tu_lock);
    tu *t = by_handle(handle);
    if (t && !t->told)
        tell(rt, t);
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

static int elf_lookup(const void *addr, char *stem, size_t n) {
    find_obj f = {.addr = (uintptr_t)addr};
    dl_iterate_phdr(find_cb, &f);
    if (!f.found)
        return 0;
    int fd = open(f.path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    int r = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        void *img = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (img != MAP_FAILED) {
            r = hki_elf_file_of(img, (size_t)st.st_size, (uint64_t)(f.addr - f.bias), stem, n);
            munmap(img, (size_t)st.st_size);
        }
    }
    close(fd);
    return r == 1;
}

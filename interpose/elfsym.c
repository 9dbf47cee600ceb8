/*
 * Which source file an address of a program's object belongs to, from its
 * ELF symbol table. nvcc (CUDA 13) writes no file name into a translation
 * unit's fatbin (the wrapper's file name field is 0, no entry has an
 * identifier), but the host object it compiles is named after the source:
 * its STT_FILE symbol ("tmpxft_0000330c_00000000-10_a.cudafe1.cpp", or
 * "a.cudafe1.cpp" with -keep, for a.cu) heads the group of the
 * object's local symbols in the linked image's .symtab, and a file-local
 * kernel's host stub (`static __global__ void fill`) or a file-local
 * variable's shadow is one of those locals. A stripped image has no .symtab:
 * then nothing is known.
 *
 * The parser reads an image of any content (it is a file on disk): every
 * offset and size is checked against the image before it is used, and every
 * name must end inside its string table. tests/fuzz/fuzz_elfsym.c.
 */
#include <elf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interpose/interpose.h"

/* 1 when [off, off + size) lies inside an image of len bytes. */
static int inside(uint64_t off, uint64_t size, size_t len) {
    return off <= len && size <= len - off;
}

/* The NUL-terminated string at off of the string table [base, base + size). */
static const char *str_at(const unsigned char *buf, uint64_t base, uint64_t size, uint32_t off) {
    if (off >= size)
        return NULL;
    const char *s = (const char *)buf + base + off;
    return memchr(s, '\0', (size_t)(size - off)) ? s : NULL;
}

void hki_file_stem(const char *path, char *out, size_t n) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    /* nvcc's host object of a.cu, compiled without -keep, is named after a
     * temporary file: "tmpxft_0000330c_00000000-10_a.cudafe1.cpp". */
    if (!strncmp(b, "tmpxft_", 7)) {
        const char *p = strchr(b + 7, '-');
        if (p) {
            p++;
            while (*p >= '0' && *p <= '9')
                p++;
            if (*p == '_' && p[1])
                b = p + 1;
        }
    }
    size_t l = strcspn(b, ".");
    if (l >= n)
        l = n - 1;
    memcpy(out, b, l);
    out[l] = '\0';
}

/* The order of the addresses, for a binary search per symbol. */
static int by_addr(const void *a, const void *b, void *arg) {
    const uint64_t *addr = arg;
    uint64_t x = addr[*(const int *)a], y = addr[*(const int *)b];
    return x < y ? -1 : x > y;
}

int hki_elf_files(const unsigned char *buf, size_t len, const uint64_t *addr, int n,
                  char (*out)[HKI_STEM_MAX]) {
    for (int i = 0; out && i < n; i++)
        out[i][0] = '\0';
    if (!buf || !addr || !out || n <= 0 || len < sizeof(Elf64_Ehdr))
        return HKI_NOT_IMAGE;
    Elf64_Ehdr eh;
    memcpy(&eh, buf, sizeof eh);
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_shentsize != sizeof(Elf64_Shdr) ||
        !inside(eh.e_shoff, (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr), len))
        return HKI_NOT_IMAGE;
    int *order = malloc((size_t)n * sizeof *order);
    if (!order)
        return HKI_NOT_IMAGE;
    for (int i = 0; i < n; i++)
        order[i] = i;
    qsort_r(order, (size_t)n, sizeof *order, by_addr, (void *)addr);
    int found = -1;
    for (unsigned i = 0; i < eh.e_shnum && found < 0; i++) {
        Elf64_Shdr sh, st;
        memcpy(&sh, buf + eh.e_shoff + (uint64_t)i * sizeof sh, sizeof sh);
        if (sh.sh_type != SHT_SYMTAB || sh.sh_entsize != sizeof(Elf64_Sym) ||
            !inside(sh.sh_offset, sh.sh_size, len) || sh.sh_link >= eh.e_shnum)
            continue;
        memcpy(&st, buf + eh.e_shoff + (uint64_t)sh.sh_link * sizeof st, sizeof st);
        if (st.sh_type != SHT_STRTAB || !inside(st.sh_offset, st.sh_size, len))
            continue;
        found = 0;
        const char *file = NULL;
        uint64_t nsym = sh.sh_size / sizeof(Elf64_Sym);
        for (uint64_t k = 0; k < nsym; k++) {
            Elf64_Sym s;
            memcpy(&s, buf + sh.sh_offset + k * sizeof s, sizeof s);
            int type = ELF64_ST_TYPE(s.st_info), bind = ELF64_ST_BIND(s.st_info);
            if (type == STT_FILE) {
                file = str_at(buf, st.sh_offset, st.sh_size, s.st_name);
                continue;
            }
            if (bind != STB_LOCAL)
                file = NULL; /* the globals: no object's */
            if (!file || !*file || s.st_shndx == SHN_UNDEF ||
                (type != STT_FUNC && type != STT_OBJECT))
                continue;
            /* The first of the addresses equal to st_value, then each. */
            int lo = 0, hi = n;
            while (lo < hi) {
                int mid = lo + (hi - lo) / 2;
                if (addr[order[mid]] < s.st_value)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            for (; lo < n && addr[order[lo]] == s.st_value; lo++)
                if (!out[order[lo]][0]) {
                    hki_file_stem(file, out[order[lo]], HKI_STEM_MAX);
                    found += out[order[lo]][0] != '\0';
                }
        }
    }
    free(order);
    return found;
}

int hki_elf_file_of(const unsigned char *buf, size_t len, uint64_t addr, char *out, size_t n) {
    char stem[1][HKI_STEM_MAX];
    if (!out || n < 2)
        return HKI_NOT_IMAGE;
    int r = hki_elf_files(buf, len, &addr, 1, stem);
    if (r < 0)
        return HKI_NOT_IMAGE;
    snprintf(out, n, "%s", stem[0]);
    return r > 0 && out[0];
}

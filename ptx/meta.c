/*
 * Metadata of kernel images: entry names, parameter layouts, globals, archs.
 *
 * A swap is validated before the driver sees the new code (does every kernel
 * with a handle still exist, with the same parameter layout; do carried
 * globals keep their size), and the same answers are needed on machines
 * without a GPU, so they are read from the image itself rather than from the
 * driver. The parsers are hand-written because the inputs are small, the
 * formats are stable, and no library reads CUDA's ELF attributes. Their input
 * comes from files and the network: every offset and length is checked
 * against the buffer before it is used, every count is bounded by the bytes
 * that would have to hold it, and they are fuzzed (tests/fuzz/fuzz_meta.c).
 *
 * This file reads fatbins and is the way in (hkp_meta_read); PTX is
 * meta_ptx.c's, cubins meta_elf.c's, what they share meta_base.c's
 * (ptx/meta.h).
 *
 * Fatbin layout, verified against nvcc 13.0 output: a 16-byte header {u32
 * magic, u16 version, u16 header size, u64 size of what follows}, then
 * entries {u16 kind (1 PTX, 2 ELF), u16, u32 header size, u64 payload size,
 * u32, u32, u16 minor, u16 major, u32 arch, ..., u64 flags at 40}; flag
 * 0x100000 marks an arch-specific entry. nvcc 13 stores PTX members
 * compressed (zstd) and cubins as ELF, unless asked otherwise: a fatbin's
 * kernels are read from the members stored plain.
 */
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/meta.h"

/* The fatbin entries after a container header (see above). */
#define FATBIN_ENTRY_MIN       32u /* smallest entry header */
#define FATBIN_ENTRY_HSIZE_OFF 4u  /* u32: entry header size */
#define FATBIN_ENTRY_PSIZE_OFF 8u  /* u64: payload size */
#define FATBIN_ENTRY_ARCH_OFF  28u /* u32: SM */
#define FATBIN_ENTRY_FLAGS_OFF 40u /* u64: flags, in headers of 48 bytes or more */
#define FATBIN_ENTRY_FLAGS_END 48u
#define FATBIN_KIND_PTX        1
#define FATBIN_KIND_ELF        2
#define FATBIN_FLAG_ARCH_SPEC  UINT64_C(0x100000) /* an 'a' target */

/* ---- fatbin -------------------------------------------------------------- */

static void add_arch(int *list, int *n, int arch) {
    for (int i = 0; i < *n; i++)
        if (list[i] == arch)
            return;
    if (*n < 16)
        list[(*n)++] = arch;
}

/* One member of a fatbin as the walk meets it: its kind (FATBIN_KIND_*), its
 * architecture (with HKP_ARCH_SPECIFIC from the entry's flag), its flags and
 * its payload, bounds-checked. Returns 0 to go on, else the walk's result. */
typedef int (*fatbin_member_fn)(unsigned kind, int arch, uint64_t flags, const unsigned char *img,
                                uint64_t psize, void *ud);

/* Walks every member of every block of a fatbin, checking each header
 * against the buffer. HK_ERR_FORMAT with a reason when the container is
 * malformed or holds no member. */
static int fatbin_walk(const unsigned char *p, size_t size, fatbin_member_fn fn, void *ud,
                       char *why, size_t why_size) {
    size_t pos = 0;
    int blocks = 0, entries = 0, rc;
    while (pos < size) {
        size_t left = size - pos;
        if (blocks > 0 && (left < HKP_FATBIN_HEADER || hkp_rd32(p + pos) != HKP_FATBIN_MAGIC)) {
            /* Padding after the last block is allowed; anything else is not. */
            for (size_t i = pos; i < size; i++)
                if (p[i]) {
                    hkp_why(why, why_size, "fatbin: unexpected data at offset %zu", pos);
                    return HK_ERR_FORMAT;
                }
            break;
        }
        if (left < HKP_FATBIN_HEADER || hkp_rd32(p + pos) != HKP_FATBIN_MAGIC) {
            hkp_why(why, why_size, "truncated fatbin header");
            return HK_ERR_FORMAT;
        }
        uint32_t hsize = hkp_rd16(p + pos + HKP_FATBIN_HSIZE_OFF);
        uint64_t fat = hkp_rd64(p + pos + HKP_FATBIN_FAT_OFF);
        if (hsize < HKP_FATBIN_HEADER || hsize > left || fat > left - hsize) {
            hkp_why(why, why_size, "truncated fatbin (header says %llu bytes, have %zu)",
                    (unsigned long long)fat + hsize, left);
            return HK_ERR_FORMAT;
        }
        const unsigned char *q = p + pos + hsize;
        uint64_t i = 0;
        while (i < fat) {
            if (fat - i < FATBIN_ENTRY_MIN) {
                hkp_why(why, why_size, "fatbin: truncated entry header at offset %llu",
                        (unsigned long long)(pos + hsize + i));
                return HK_ERR_FORMAT;
            }
            const unsigned char *e = q + i;
            unsigned kind = hkp_rd16(e);
            uint32_t ehs = hkp_rd32(e + FATBIN_ENTRY_HSIZE_OFF);
            uint64_t psize = hkp_rd64(e + FATBIN_ENTRY_PSIZE_OFF);
            if (ehs < FATBIN_ENTRY_MIN || ehs > fat - i || psize > fat - i - ehs) {
                hkp_why(why, why_size, "fatbin: entry at offset %llu runs past the end",
                        (unsigned long long)(pos + hsize + i));
                return HK_ERR_FORMAT;
            }
            int arch = (int)hkp_rd32(e + FATBIN_ENTRY_ARCH_OFF);
            uint64_t flags =
                ehs >= FATBIN_ENTRY_FLAGS_END ? hkp_rd64(e + FATBIN_ENTRY_FLAGS_OFF) : 0;
            if (arch <= 0 || arch > 0xffff) {
                hkp_why(why, why_size, "fatbin: entry with bad architecture %d", arch);
                return HK_ERR_FORMAT;
            }
            if (flags & FATBIN_FLAG_ARCH_SPEC)
                arch |= HKP_ARCH_SPECIFIC;
            if ((rc = fn(kind, arch, flags, e + ehs, psize, ud)) != 0)
                return rc;
            entries++;
            i += ehs + psize;
        }
        blocks++;
        pos += hsize + (size_t)fat;
    }
    if (!entries) {
        hkp_why(why, why_size, "fatbin without any code");
        return HK_ERR_FORMAT;
    }
    return 0;
}

/* An uncompressed cubin member (nvcc compresses members on request, and
 * then the payload is no ELF): 1 with its view opened. */
static int member_cubin(const unsigned char *img, uint64_t psize, elf_view *v) {
    memset(v, 0, sizeof *v);
    return psize >= sizeof(Elf64_Ehdr) && memcmp(img, ELFMAG, SELFMAG) == 0 &&
           hkp_elf_open(v, img, (size_t)psize, NULL, 0) == 0;
}

static int fatbin_archs(unsigned kind, int arch, uint64_t flags, const unsigned char *img,
                        uint64_t psize, void *ud) {
    hkp_meta *m = ud;
    if (kind == FATBIN_KIND_PTX) {
        add_arch(m->ptx_archs, &m->nptx_archs, arch);
    } else if (kind == FATBIN_KIND_ELF) {
        /* An uncompressed cubin says itself whether it is 'a'. */
        elf_view v;
        if (member_cubin(img, psize, &v)) {
            int a = hkp_cubin_arch(&v);
            if (HKP_ARCH_NUM(a) == HKP_ARCH_NUM(arch))
                arch = a;
        }
        free(v.secs);
        add_arch(m->archs, &m->narchs, arch);
    }
    return 0;
}

static int meta_fatbin(const unsigned char *p, size_t size, hkp_meta *m, char *why,
                       size_t why_size) {
    return fatbin_walk(p, size, fatbin_archs, m, why, why_size);
}

/* ---- a fatbin's kernels ---------------------------------------------------- */

struct fatbin_kernels {
    struct meta_builder b; /* the merged entries */
    int unread;
};

/* 1 when m already lists an entry called name. */
static int has_entry(const hkp_meta *m, const char *name) {
    for (int i = 0; i < m->nentries; i++)
        if (!strcmp(m->entries[i].name, name))
            return 1;
    return 0;
}

/* Moves the entries of one member's metadata that `into` lacks into it. */
static int merge_entries(struct meta_builder *into, hkp_meta *from) {
    for (int i = 0; i < from->nentries; i++) {
        if (has_entry(into->m, from->entries[i].name))
            continue;
        if (hkp_grow((void **)&into->m->entries, &into->ecap, into->m->nentries + 1,
                     sizeof(hkp_entry)))
            return HK_ERR_NOMEM;
        into->m->entries[into->m->nentries++] = from->entries[i];
        memset(&from->entries[i], 0, sizeof from->entries[i]); /* moved */
    }
    return 0;
}

static int fatbin_member_kernels(unsigned kind, int arch, uint64_t flags, const unsigned char *img,
                                 uint64_t psize, void *ud) {
    struct fatbin_kernels *fk = ud;
    hkp_meta one = {0};
    struct meta_builder b = {.m = &one};
    int rc = -1;
    if (kind == FATBIN_KIND_ELF && psize >= sizeof(Elf64_Ehdr) &&
        memcmp(img, ELFMAG, SELFMAG) == 0) {
        rc = hkp_meta_cubin(img, (size_t)psize, &b, NULL, 0);
    } else if (kind == FATBIN_KIND_PTX && psize > 0) {
        /* Compressed PTX (nvcc's default) is no PTX text: its parse fails. */
        size_t n = (size_t)psize;
        while (n > 0 && img[n - 1] == '\0') /* the member is padded */
            n--;
        rc = hkp_meta_ptx((const char *)img, n, &b, NULL, 0);
    }
    if (rc != 0) {
        fk->unread += kind == FATBIN_KIND_ELF || kind == FATBIN_KIND_PTX;
        rc = 0;
    } else {
        rc = merge_entries(&fk->b, &one);
    }
    hkp_meta_free(&one);
    return rc == HK_ERR_NOMEM ? rc : 0;
}

int hkp_fatbin_kernels(const void *data, size_t size, hkp_meta *out, int *unread) {
    struct fatbin_kernels fk = {.b = {.m = out}};
    if (!out)
        return HK_ERR_INVALID;
    memset(out, 0, sizeof *out);
    out->format = HK_FORMAT_FATBIN;
    int rc = data ? fatbin_walk(data, size, fatbin_member_kernels, &fk, NULL, 0) : HK_ERR_INVALID;
    if (rc) {
        hkp_meta_free(out);
        out->format = HK_FORMAT_FATBIN;
    }
    if (unread)
        *unread = rc ? 0 : fk.unread;
    return rc;
}

/* ---- entry point ------------------------------------------------------------ */

int hkp_meta_read(const void *data, size_t size, hk_format fmt, hkp_meta *out, char *why,
                  size_t why_size) {
    if (why && why_size)
        why[0] = '\0';
    if (!out)
        return HK_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if (!data && size)
        return HK_ERR_INVALID;
    int rc = 0;
    if (fmt == HK_FORMAT_AUTO) {
        rc = hkp_detect(data, size, &fmt, why, why_size);
        if (rc)
            return rc;
    }
    struct meta_builder b = {.m = out};
    out->format = fmt;
    switch (fmt) {
    case HK_FORMAT_PTX:
        rc = hkp_meta_ptx(data, size, &b, why, why_size);
        break;
    case HK_FORMAT_CUBIN:
        rc = hkp_meta_cubin(data, size, &b, why, why_size);
        break;
    case HK_FORMAT_FATBIN:
        rc = meta_fatbin(data, size, out, why, why_size);
        break;
    case HK_FORMAT_CUDA_C:
        hkp_why(why, why_size, "CUDA C has no metadata before it is compiled");
        rc = HK_ERR_FORMAT;
        break;
    default:
        rc = HK_ERR_INVALID;
        break;
    }
    if (rc) {
        if (rc == HK_ERR_FORMAT && why && why_size && !why[0])
            hkp_why(why, why_size, "malformed %s",
                    fmt == HK_FORMAT_PTX     ? "PTX"
                    : fmt == HK_FORMAT_CUBIN ? "cubin"
                                             : "fatbin");
        hkp_meta_free(out);
        out->format = fmt;
    }
    return rc;
}

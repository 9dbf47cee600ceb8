/*
 * Cubin (ELF) metadata: kernels, their parameter layouts, globals, the SM
 * (ptx/meta.c says why the parsers are hand-written and how they treat
 * their input, which is untrusted).
 *
 * Layout facts, verified against nvcc/NVRTC 13.0 output (readelf, and the
 * .nv.info dumps of cubins for sm_80, sm_90, sm_100):
 * - Cubin e_flags: ELF ABI version 8 (CUDA 13) holds the SM in bits 8..15 and
 *   the arch-specific ('a') flag at bit 3; older ABIs hold the SM in the low
 *   byte and 'a' at bit 11. nvcc 13 writes sm_90a cubins without either bit
 *   and marks them in .nv.compat instead (attribute 9 is 1), so both are read.
 * - .nv.info.NAME (sh_info = the kernel's .text section) is a list of
 *   attributes: format byte, attribute byte, then a 16-bit value (formats 1-3)
 *   or a 16-bit length and that many bytes (format 4). EIATTR_KPARAM_INFO
 *   (0x17) is {u32 index, u16 ordinal, u16 offset, u32 bits} with the size in
 *   bits 18..31.
 */
#include <elf.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/meta.h"

/* NVIDIA's additions to ELF, which <elf.h> does not name (see the layout
 * facts above). */
#define EIATTR_KPARAM_INFO  0x17  /* .nv.info: a kernel parameter's record */
#define EIATTR_ARCH_SPEC    9     /* .nv.compat: nonzero for an 'a' target (sm_90a) */
#define STO_CUDA_ENTRY      0x10  /* st_other: the function is a kernel entry */
#define CUBIN_ABI_V8        8     /* e_ident[EI_ABIVERSION] of CUDA 13 cubins */
#define CUBIN_SM_SHIFT      8     /* ABI 8: e_flags bits 8..15 hold the SM */
#define CUBIN_FLAG_SPEC     0x8   /* ABI 8: e_flags bit of an 'a' target */
#define CUBIN_FLAG_SPEC_OLD 0x800 /* older ABIs: the same; the SM is the low byte */

/* An EIATTR_KPARAM_INFO record: {u32 index, u16 ordinal, u16 offset, u32
 * bits}, 16 bytes with its attribute header; the size is in bits 18..31. */
#define KPARAM_RECORD      16u
#define KPARAM_ORDINAL_OFF 4u
#define KPARAM_OFFSET_OFF  6u
#define KPARAM_BITS_OFF    8u
#define KPARAM_VALUE_MIN   12u
#define KPARAM_SIZE_SHIFT  18
#define KPARAM_SIZE_MASK   0x3fffu

/* Reads an n-byte little-endian field (n is 1, 2, 4 or 8). */
static uint64_t rd_le(const unsigned char *p, size_t n) {
    return n == 1 ? p[0] : n == 2 ? hkp_rd16(p) : n == 4 ? hkp_rd32(p) : hkp_rd64(p);
}

/* Field f of the ELF64 structure T (Elf64_Ehdr, Elf64_Shdr ...) stored at p,
 * which the caller has bounds-checked for sizeof(T) bytes. Cubins are
 * little-endian ELF64 (hkp_elf_check_header), read byte by byte so that no
 * alignment is assumed. */
#define ELF_RD(p, T, f) rd_le((const unsigned char *)(p) + offsetof(T, f), sizeof(((T *)0)->f))

/* ---- cubin (ELF) ----------------------------------------------------------- */

int hkp_elf_check_header(const unsigned char *p, size_t size, char *why, size_t why_size) {
    if (size < sizeof(Elf64_Ehdr)) {
        hkp_why(why, why_size, "truncated ELF header (%zu bytes)", size);
        return HK_ERR_FORMAT;
    }
    /* e_machine is at the same offset in ELF32 and ELF64 headers. */
    uint16_t machine = (uint16_t)ELF_RD(p, Elf64_Ehdr, e_machine);
    unsigned cls = p[EI_CLASS], data = p[EI_DATA];
    if (cls != ELFCLASS64 || data != ELFDATA2LSB) {
        if (machine == EM_CUDA || data != ELFDATA2LSB)
            hkp_why(why, why_size, "ELF%s %s-endian is not a CUDA cubin",
                    cls == ELFCLASS64 ? "64" : "32", data == ELFDATA2LSB ? "little" : "big");
        else
            hkp_why(why, why_size, "ELF but not a CUDA cubin (e_machine %u)", machine);
        return HK_ERR_FORMAT;
    }
    if (machine != EM_CUDA) {
        hkp_why(why, why_size, "ELF but not a CUDA cubin (e_machine %u)", machine);
        return HK_ERR_FORMAT;
    }
    uint64_t shoff = ELF_RD(p, Elf64_Ehdr, e_shoff);
    uint16_t shentsize = (uint16_t)ELF_RD(p, Elf64_Ehdr, e_shentsize);
    uint16_t shnum = (uint16_t)ELF_RD(p, Elf64_Ehdr, e_shnum);
    if (shnum == 0) {
        hkp_why(why, why_size, "cubin without sections");
        return HK_ERR_FORMAT;
    }
    if (shentsize < sizeof(Elf64_Shdr)) {
        hkp_why(why, why_size, "cubin with bad section header size %u", shentsize);
        return HK_ERR_FORMAT;
    }
    if (shoff > size || (uint64_t)shnum * shentsize > size - shoff) {
        hkp_why(why, why_size, "truncated ELF (section headers end past %zu bytes)", size);
        return HK_ERR_FORMAT;
    }
    /* The driver reads the program headers too (executable cubins have
     * them after the section headers). */
    uint64_t phoff = ELF_RD(p, Elf64_Ehdr, e_phoff);
    uint16_t phentsize = (uint16_t)ELF_RD(p, Elf64_Ehdr, e_phentsize);
    uint16_t phnum = (uint16_t)ELF_RD(p, Elf64_Ehdr, e_phnum);
    if (phnum && (phentsize < sizeof(Elf64_Phdr) || phoff > size ||
                  (uint64_t)phnum * phentsize > size - phoff)) {
        hkp_why(why, why_size, "truncated ELF (program headers end past %zu bytes)", size);
        return HK_ERR_FORMAT;
    }
    for (uint16_t i = 0; i < phnum; i++) {
        const unsigned char *ph = p + phoff + (uint64_t)i * phentsize;
        uint64_t off = ELF_RD(ph, Elf64_Phdr, p_offset);
        uint64_t filesz = ELF_RD(ph, Elf64_Phdr, p_filesz);
        if (off > size || filesz > size - off) {
            hkp_why(why, why_size, "truncated ELF (segment %u ends past %zu bytes)", i, size);
            return HK_ERR_FORMAT;
        }
    }
    return 0;
}

static const char *sec_name(const elf_view *v, const elf_sec *s) {
    if (!v->shstr || s->name >= v->shstr_size)
        return "";
    const char *n = v->shstr + s->name;
    return memchr(n, '\0', v->shstr_size - s->name) ? n : "";
}

int hkp_elf_open(elf_view *v, const unsigned char *p, size_t size, char *why, size_t why_size) {
    memset(v, 0, sizeof *v);
    int rc = hkp_elf_check_header(p, size, why, why_size);
    if (rc)
        return rc;
    uint64_t shoff = ELF_RD(p, Elf64_Ehdr, e_shoff);
    uint16_t shentsize = (uint16_t)ELF_RD(p, Elf64_Ehdr, e_shentsize);
    uint16_t shstrndx = (uint16_t)ELF_RD(p, Elf64_Ehdr, e_shstrndx);
    v->p = p;
    v->size = size;
    v->shnum = (uint16_t)ELF_RD(p, Elf64_Ehdr, e_shnum);
    v->secs = calloc(v->shnum, sizeof *v->secs);
    if (!v->secs)
        return HK_ERR_NOMEM;
    for (uint16_t i = 0; i < v->shnum; i++) {
        const unsigned char *h = p + shoff + (uint64_t)i * shentsize;
        elf_sec *s = &v->secs[i];
        s->name = (uint32_t)ELF_RD(h, Elf64_Shdr, sh_name);
        s->type = (uint32_t)ELF_RD(h, Elf64_Shdr, sh_type);
        s->off = ELF_RD(h, Elf64_Shdr, sh_offset);
        s->size = ELF_RD(h, Elf64_Shdr, sh_size);
        s->link = (uint32_t)ELF_RD(h, Elf64_Shdr, sh_link);
        s->info = (uint32_t)ELF_RD(h, Elf64_Shdr, sh_info);
        if (s->type != SHT_NOBITS && s->type != SHT_NULL &&
            (s->off > size || s->size > size - s->off)) {
            hkp_why(why, why_size, "truncated cubin (section %u ends past %zu bytes)", i, size);
            return HK_ERR_FORMAT;
        }
    }
    if (shstrndx >= v->shnum || v->secs[shstrndx].type != SHT_STRTAB) {
        hkp_why(why, why_size, "cubin without a section name table");
        return HK_ERR_FORMAT;
    }
    v->shstr = (const char *)p + v->secs[shstrndx].off;
    v->shstr_size = v->secs[shstrndx].size;
    return 0;
}

/* Calls fn for each attribute record of an .nv.info-style section. */
typedef int (*attr_fn)(void *ctx, unsigned attr, const unsigned char *val, size_t len,
                       unsigned hval);

static int walk_attrs(const elf_view *v, const elf_sec *s, attr_fn fn, void *ctx, char *why,
                      size_t why_size) {
    const unsigned char *p = v->p + s->off;
    uint64_t n = s->size, i = 0;
    while (i < n) {
        if (n - i < 4) {
            hkp_why(why, why_size, "cubin: truncated attribute in %s", sec_name(v, s));
            return HK_ERR_FORMAT;
        }
        unsigned fmt = p[i], attr = p[i + 1];
        unsigned h = hkp_rd16(p + i + 2);
        int rc;
        if (fmt == 4) {
            if (h > n - i - 4) {
                hkp_why(why, why_size, "cubin: attribute 0x%x in %s runs past its section", attr,
                        sec_name(v, s));
                return HK_ERR_FORMAT;
            }
            rc = fn(ctx, attr, p + i + 4, h, 0);
            i += 4 + (uint64_t)h;
        } else if (fmt >= 1 && fmt <= 3) {
            rc = fn(ctx, attr, NULL, 0, fmt == 2 ? (h & 0xff) : fmt == 3 ? h : 0);
            i += 4;
        } else {
            hkp_why(why, why_size, "cubin: unknown attribute format %u in %s", fmt, sec_name(v, s));
            return HK_ERR_FORMAT;
        }
        if (rc)
            return rc;
    }
    return 0;
}

struct compat_ctx {
    int specific;
};

static int compat_attr(void *ctx, unsigned attr, const unsigned char *val, size_t len,
                       unsigned hval) {
    struct compat_ctx *c = ctx;
    if (attr == EIATTR_ARCH_SPEC && !val && hval)
        c->specific = 1;
    return 0;
}

/* The SM of a cubin, with HKP_ARCH_SPECIFIC for 'a' targets. */
int hkp_cubin_arch(const elf_view *v) {
    uint32_t flags = (uint32_t)ELF_RD(v->p, Elf64_Ehdr, e_flags);
    int abiver = v->p[EI_ABIVERSION], sm, specific;
    if (abiver >= CUBIN_ABI_V8) {
        sm = (int)((flags >> CUBIN_SM_SHIFT) & 0xff);
        specific = (flags & CUBIN_FLAG_SPEC) != 0;
    } else {
        sm = (int)(flags & 0xff);
        specific = (flags & CUBIN_FLAG_SPEC_OLD) != 0;
    }
    for (uint16_t i = 0; i < v->shnum && !specific; i++) {
        if (strcmp(sec_name(v, &v->secs[i]), ".nv.compat") == 0) {
            struct compat_ctx c = {0};
            if (walk_attrs(v, &v->secs[i], compat_attr, &c, NULL, 0) == 0)
                specific = c.specific;
        }
    }
    return sm ? (sm | (specific ? HKP_ARCH_SPECIFIC : 0)) : 0;
}

struct kparam_ctx {
    hkp_param *params; /* indexed by ordinal */
    unsigned char *seen;
    int max; /* capacity (records in the section bound it) */
    int n;   /* highest ordinal + 1 */
    int dup;
};

static int kparam_attr(void *ctx, unsigned attr, const unsigned char *val, size_t len,
                       unsigned hval) {
    struct kparam_ctx *k = ctx;
    if (attr != EIATTR_KPARAM_INFO || !val)
        return 0;
    if (len < KPARAM_VALUE_MIN)
        return HK_ERR_FORMAT;
    unsigned ord = hkp_rd16(val + KPARAM_ORDINAL_OFF);
    if ((int)ord >= k->max)
        return HK_ERR_FORMAT;
    if (k->seen[ord])
        k->dup = 1;
    k->seen[ord] = 1;
    k->params[ord].offset = hkp_rd16(val + KPARAM_OFFSET_OFF);
    k->params[ord].size = (hkp_rd32(val + KPARAM_BITS_OFF) >> KPARAM_SIZE_SHIFT) & KPARAM_SIZE_MASK;
    if ((int)ord + 1 > k->n)
        k->n = (int)ord + 1;
    return 0;
}

/* Reads the parameter layout of the kernel whose code is section text. */
static int cubin_params(const elf_view *v, uint32_t text, const char *name, hkp_param **out,
                        int *nout, char *why, size_t why_size) {
    const elf_sec *info = NULL;
    char want[MAX_NAME + 16];
    snprintf(want, sizeof want, ".nv.info.%s", name);
    for (uint16_t i = 0; i < v->shnum; i++) {
        const char *sn = sec_name(v, &v->secs[i]);
        if (strncmp(sn, ".nv.info.", 9) != 0)
            continue;
        if (v->secs[i].info == text || strcmp(sn, want) == 0) {
            info = &v->secs[i];
            break;
        }
    }
    *out = NULL;
    *nout = 0;
    if (!info)
        return 0; /* no attributes: a kernel without parameters */
    /* Each KPARAM_INFO record takes 16 bytes, which bounds the ordinals. */
    uint64_t records = info->size / KPARAM_RECORD;
    int max = (int)(records < MAX_PARAMS ? records : MAX_PARAMS);
    struct kparam_ctx k = {0};
    k.max = max;
    k.params = calloc((size_t)max + 1, sizeof *k.params);
    k.seen = calloc((size_t)max + 1, 1);
    int rc = (k.params && k.seen) ? 0 : HK_ERR_NOMEM;
    if (!rc)
        rc = walk_attrs(v, info, kparam_attr, &k, why, why_size);
    if (rc == HK_ERR_FORMAT && why && !why[0])
        hkp_why(why, why_size, "cubin: bad parameter record for '%s'", name);
    if (!rc && k.dup) {
        hkp_why(why, why_size, "cubin: parameter listed twice for '%s'", name);
        rc = HK_ERR_FORMAT;
    }
    for (int i = 0; !rc && i < k.n; i++) {
        if (!k.seen[i]) {
            hkp_why(why, why_size, "cubin: parameter %d of '%s' missing", i, name);
            rc = HK_ERR_FORMAT;
        }
    }
    free(k.seen);
    if (rc) {
        free(k.params);
        return rc;
    }
    *out = k.params;
    *nout = k.n;
    return 0;
}

static int is_global_section(const char *sn, int *is_const) {
    if (strncmp(sn, ".nv.global", 10) == 0) {
        *is_const = 0;
        return 1;
    }
    /* .nv.constant0.* are the parameter banks, not user variables. */
    if (strncmp(sn, ".nv.constant", 12) == 0 && strncmp(sn, ".nv.constant0", 13) != 0) {
        *is_const = 1;
        return 1;
    }
    return 0;
}

int hkp_meta_cubin(const unsigned char *p, size_t size, struct meta_builder *b, char *why,
                   size_t why_size) {
    elf_view v;
    int rc = hkp_elf_open(&v, p, size, why, why_size);
    if (rc)
        goto out;
    b->m->arch = hkp_cubin_arch(&v);
    if (!b->m->arch) {
        hkp_why(why, why_size, "cubin without an SM architecture in e_flags");
        rc = HK_ERR_FORMAT;
        goto out;
    }
    for (uint16_t si = 0; si < v.shnum; si++) {
        const elf_sec *sym = &v.secs[si];
        if (sym->type != SHT_SYMTAB)
            continue;
        if (sym->link >= v.shnum || v.secs[sym->link].type != SHT_STRTAB) {
            hkp_why(why, why_size, "cubin: symbol table without a string table");
            rc = HK_ERR_FORMAT;
            goto out;
        }
        const elf_sec *str = &v.secs[sym->link];
        const char *strs = (const char *)p + str->off;
        for (uint64_t k = 0; k + sizeof(Elf64_Sym) <= sym->size; k += sizeof(Elf64_Sym)) {
            const unsigned char *e = p + sym->off + k;
            uint32_t name = (uint32_t)ELF_RD(e, Elf64_Sym, st_name);
            unsigned type = ELF64_ST_TYPE(ELF_RD(e, Elf64_Sym, st_info));
            unsigned other = (unsigned)ELF_RD(e, Elf64_Sym, st_other);
            uint16_t shndx = (uint16_t)ELF_RD(e, Elf64_Sym, st_shndx);
            uint64_t ssize = ELF_RD(e, Elf64_Sym, st_size);
            if (type != STT_FUNC && type != STT_OBJECT)
                continue;
            if (shndx == SHN_UNDEF || shndx >= v.shnum)
                continue; /* undefined or special (ABS, COMMON ...) */
            if (name >= str->size || !memchr(strs + name, '\0', str->size - name)) {
                hkp_why(why, why_size, "cubin: symbol name outside the string table");
                rc = HK_ERR_FORMAT;
                goto out;
            }
            const char *nm = strs + name;
            size_t nlen = strlen(nm);
            if (nlen == 0 || nlen > MAX_NAME)
                continue;
            const char *sn = sec_name(&v, &v.secs[shndx]);
            if (type == STT_FUNC && (other & STO_CUDA_ENTRY)) {
                hkp_param *params;
                int np;
                rc = cubin_params(&v, shndx, nm, &params, &np, why, why_size);
                if (!rc)
                    rc = hkp_meta_add_entry(b, hkp_dup_n(nm, nlen), params, np);
                if (rc)
                    goto out;
            } else if (type == STT_OBJECT) {
                int is_const;
                if (!is_global_section(sn, &is_const) || nm[0] == '$' || nm[0] == '.')
                    continue;
                rc = hkp_meta_add_global(b, nm, nlen, ssize, is_const);
                if (rc)
                    goto out;
            }
        }
    }
out:
    free(v.secs);
    return rc;
}

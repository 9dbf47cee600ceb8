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
 * - Fatbin: 16-byte header {u32 magic, u16 version, u16 header size, u64 size
 *   of what follows}, then entries {u16 kind (1 PTX, 2 ELF), u16, u32 header
 *   size, u64 payload size, u32, u32, u16 minor, u16 major, u32 arch, ...,
 *   u64 flags at 40}; flag 0x100000 marks an arch-specific entry. nvcc 13
 *   stores PTX members compressed (zstd) and cubins as ELF, unless asked
 *   otherwise: a fatbin's kernels are read from the members stored plain.
 */
#include <elf.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/ptx.h"

/* Upper bounds that keep hostile input from asking for absurd allocations
 * or overflowing offset arithmetic. Real modules are far below them. */
#define MAX_PARAMS      4096
#define MAX_OBJECT_SIZE (UINT64_C(1) << 48)
#define MAX_NAME        4096

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

/* Reads an n-byte little-endian field (n is 1, 2, 4 or 8). */
static uint64_t rd_le(const unsigned char *p, size_t n) {
    return n == 1 ? p[0] : n == 2 ? hkp_rd16(p) : n == 4 ? hkp_rd32(p) : hkp_rd64(p);
}

/* Field f of the ELF64 structure T (Elf64_Ehdr, Elf64_Shdr ...) stored at p,
 * which the caller has bounds-checked for sizeof(T) bytes. Cubins are
 * little-endian ELF64 (hkp_elf_check_header), read byte by byte so that no
 * alignment is assumed. */
#define ELF_RD(p, T, f) rd_le((const unsigned char *)(p) + offsetof(T, f), sizeof(((T *)0)->f))

void hkp_why(char *why, size_t why_size, const char *fmt, ...) {
    if (!why || !why_size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_size, fmt, ap);
    va_end(ap);
}

const char *hkp_arch_name(int arch, char *buf, size_t n) {
    if (!buf || !n)
        return "";
    if (HKP_ARCH_NUM(arch) == 0)
        snprintf(buf, n, "sm_?");
    else
        snprintf(buf, n, "sm_%d%s", HKP_ARCH_NUM(arch),
                 (arch & HKP_ARCH_SPECIFIC) ? "a"
                 : (arch & HKP_ARCH_FAMILY) ? "f"
                                            : "");
    return buf;
}

int hkp_arch_runs_on(int image_arch, int device_arch) {
    int img = HKP_ARCH_NUM(image_arch), dev = HKP_ARCH_NUM(device_arch);
    if (img <= 0 || dev <= 0)
        return 0;
    if (image_arch & HKP_ARCH_SPECIFIC)
        return img == dev;
    return img / 10 == dev / 10 && img % 10 <= dev % 10;
}

/* PTX compiles forward to any newer device, except arch-specific PTX. */
static int ptx_runs_on(int ptx_arch, int device_arch) {
    int img = HKP_ARCH_NUM(ptx_arch), dev = HKP_ARCH_NUM(device_arch);
    if (img <= 0 || dev <= 0)
        return 0;
    if (ptx_arch & HKP_ARCH_SPECIFIC)
        return img == dev;
    return img <= dev;
}

int hkp_meta_runs_on(const hkp_meta *m, int device_arch) {
    if (!m)
        return 0;
    switch (m->format) {
    case HK_FORMAT_CUBIN:
        return hkp_arch_runs_on(m->arch, device_arch);
    case HK_FORMAT_PTX:
        return ptx_runs_on(m->arch, device_arch);
    case HK_FORMAT_FATBIN:
        for (int i = 0; i < m->narchs; i++)
            if (hkp_arch_runs_on(m->archs[i], device_arch))
                return 1;
        for (int i = 0; i < m->nptx_archs; i++)
            if (ptx_runs_on(m->ptx_archs[i], device_arch))
                return 1;
        return 0;
    default:
        return 0;
    }
}

void hkp_meta_free(hkp_meta *m) {
    if (!m)
        return;
    for (int i = 0; i < m->nentries; i++) {
        free(m->entries[i].name);
        free(m->entries[i].params);
    }
    free(m->entries);
    for (int i = 0; i < m->nglobals; i++)
        free(m->globals[i].name);
    free(m->globals);
    memset(m, 0, sizeof *m);
}

int hkp_meta_dup(const hkp_meta *om, hkp_meta *nm) {
    *nm = *om; /* the plain fields; the arrays are copied below */
    nm->entries = om->nentries ? calloc((size_t)om->nentries, sizeof *nm->entries) : NULL;
    nm->globals = om->nglobals ? calloc((size_t)om->nglobals, sizeof *nm->globals) : NULL;
    nm->nentries = nm->entries ? om->nentries : 0;
    nm->nglobals = nm->globals ? om->nglobals : 0;
    int ok = nm->nentries == om->nentries && nm->nglobals == om->nglobals;
    for (int i = 0; ok && i < om->nentries; i++) {
        const hkp_entry *f = &om->entries[i];
        size_t bytes = (size_t)f->nparams * sizeof *f->params;
        nm->entries[i].nparams = f->nparams;
        ok = (nm->entries[i].name = strdup(f->name)) &&
             (!bytes || (nm->entries[i].params = malloc(bytes)));
        if (ok && bytes)
            memcpy(nm->entries[i].params, f->params, bytes);
    }
    for (int i = 0; ok && i < om->nglobals; i++) {
        nm->globals[i] = om->globals[i];
        ok = (nm->globals[i].name = strdup(om->globals[i].name)) != NULL;
    }
    if (ok)
        return 0;
    hkp_meta_free(nm);
    return HK_ERR_NOMEM;
}

/* ---- growing arrays ------------------------------------------------------ */

static int grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap)
        return 0;
    int ncap = *cap ? *cap : 8;
    while (ncap < need) {
        if (ncap > (1 << 24))
            return HK_ERR_TOO_LARGE;
        ncap *= 2;
    }
    void *p = realloc(*arr, (size_t)ncap * elem);
    if (!p)
        return HK_ERR_NOMEM;
    *arr = p;
    *cap = ncap;
    return 0;
}

struct meta_builder {
    hkp_meta *m;
    int ecap, gcap;
};

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* Takes ownership of name and params (also on failure). */
static int add_entry(struct meta_builder *b, char *name, hkp_param *params, int nparams) {
    int rc = name ? grow((void **)&b->m->entries, &b->ecap, b->m->nentries + 1, sizeof(hkp_entry))
                  : HK_ERR_NOMEM;
    if (rc) {
        free(name);
        free(params);
        return rc;
    }
    hkp_entry *e = &b->m->entries[b->m->nentries++];
    e->name = name;
    e->params = params;
    e->nparams = nparams;
    return 0;
}

static int add_global(struct meta_builder *b, const char *name, size_t n, uint64_t size,
                      int is_const) {
    char *d = dup_n(name, n);
    int rc = d ? grow((void **)&b->m->globals, &b->gcap, b->m->nglobals + 1, sizeof(hkp_global))
               : HK_ERR_NOMEM;
    if (rc) {
        free(d);
        return rc;
    }
    hkp_global *g = &b->m->globals[b->m->nglobals++];
    g->name = d;
    g->size = size;
    g->is_const = is_const;
    return 0;
}

/* ---- PTX ------------------------------------------------------------------ */

/* The lexer is ptx.h's (hkp_lex_next), shared with guard.c. */
typedef hkp_tok tok;
typedef hkp_lexer lexer;

int hkp_tok_is(const hkp_tok *t, const char *word) {
    size_t l = strlen(word);
    return t->n == l && memcmp(t->s, word, l) == 0;
}

int hkp_lex_next(hkp_lexer *lx, hkp_tok *t) {
    const char *s = lx->s;
    size_t n = lx->n, i = hkp_skip_blank(s, n, lx->i, &lx->bol, &lx->bad);
    if (i >= n) {
        lx->i = n;
        return 0;
    }
    size_t start = i;
    unsigned char c = (unsigned char)s[i];
    if (c == '"') {
        i++;
        while (i < n && s[i] != '"' && s[i] != '\n')
            i += (s[i] == '\\' && i + 1 < n) ? 2 : 1;
        if (i >= n || s[i] != '"')
            lx->bad = 1;
        else
            i++;
    } else if (c == '.' || hkp_is_ident_char(c)) {
        i++;
        while (i < n && hkp_is_ident_char((unsigned char)s[i]))
            i++;
        /* Numbers such as 8.5 or 1.0e5 keep their dot. */
        if (c >= '0' && c <= '9')
            while (i < n && (hkp_is_ident_char((unsigned char)s[i]) || s[i] == '.'))
                i++;
    } else {
        i++;
    }
    if (i > n)
        i = n;
    t->s = s + start;
    t->n = i - start;
    t->bol = lx->bol;
    lx->bol = 0;
    lx->i = i;
    return 1;
}

/* Parses an unsigned PTX integer (decimal, 0x hex, 0b binary, leading-zero
 * octal, optional U suffix). Returns 0 on success. */
static int parse_uint(const tok *t, uint64_t *out) {
    char buf[40];
    size_t n = t->n;
    if (n == 0 || n >= sizeof buf || t->s[0] < '0' || t->s[0] > '9')
        return -1;
    memcpy(buf, t->s, n);
    buf[n] = '\0';
    if (buf[n - 1] == 'U' || buf[n - 1] == 'u')
        buf[--n] = '\0';
    int base = 10;
    const char *p = buf;
    if (n > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        base = 16;
        p += 2;
    } else if (n > 2 && p[0] == '0' && (p[1] == 'b' || p[1] == 'B')) {
        base = 2;
        p += 2;
    } else if (n > 1 && p[0] == '0') {
        base = 8;
        p += 1;
    }
    uint64_t v = 0;
    if (!*p)
        return -1;
    for (; *p; p++) {
        int d;
        if (*p >= '0' && *p <= '9')
            d = *p - '0';
        else if (*p >= 'a' && *p <= 'f')
            d = *p - 'a' + 10;
        else if (*p >= 'A' && *p <= 'F')
            d = *p - 'A' + 10;
        else
            return -1;
        if (d >= base || v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
            return -1;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* Size in bytes of a PTX fundamental type, 0 if t is not one. */
static unsigned ptx_type_size(const tok *t) {
    static const struct {
        const char *name;
        unsigned size;
    } types[] = {
        {".b8", 1},     {".u8", 1},    {".s8", 1},     {".b16", 2},        {".u16", 2},
        {".s16", 2},    {".f16", 2},   {".bf16", 2},   {".e4m3x2", 2},     {".e5m2x2", 2},
        {".b32", 4},    {".u32", 4},   {".s32", 4},    {".f32", 4},        {".f16x2", 4},
        {".bf16x2", 4}, {".tf32", 4},  {".b64", 8},    {".u64", 8},        {".s64", 8},
        {".f64", 8},    {".b128", 16}, {".texref", 8}, {".samplerref", 8}, {".surfref", 8},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (hkp_tok_is(t, types[i].name))
            return types[i].size;
    return 0;
}

/* Parses "sm_90", "sm_90a", "sm_100f" (also compute_XY). 0 if not an arch. */
static int parse_arch_word(const char *s, size_t n) {
    size_t i;
    if (n > 3 && memcmp(s, "sm_", 3) == 0)
        i = 3;
    else if (n > 8 && memcmp(s, "compute_", 8) == 0)
        i = 8;
    else
        return 0;
    int v = 0, digits = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9' && digits < 4) {
        v = v * 10 + (s[i] - '0');
        digits++;
        i++;
    }
    if (digits < 2 || v <= 0)
        return 0;
    if (i == n)
        return v;
    if (i + 1 == n && s[i] == 'a')
        return v | HKP_ARCH_SPECIFIC;
    if (i + 1 == n && s[i] == 'f')
        return v | HKP_ARCH_FAMILY;
    return 0;
}

/* One parameter of an .entry, given as the tokens between commas. */
static int ptx_param(lexer *lx, tok *t, int *more, uint64_t *offset, hkp_param *out, char *why,
                     size_t why_size) {
    uint64_t align = 0, count = 1;
    unsigned tsize = 0;
    int after_ptr = 0, have_name = 0;
    /* t holds the first token (".param"). */
    if (!hkp_tok_is(t, ".param")) {
        hkp_why(why, why_size, "PTX: expected .param in an .entry parameter list, got '%.*s'",
                (int)(t->n > 40 ? 40 : t->n), t->s);
        return HK_ERR_FORMAT;
    }
    for (;;) {
        if (!hkp_lex_next(lx, t)) {
            hkp_why(why, why_size, "PTX: unterminated .entry parameter list");
            return HK_ERR_FORMAT;
        }
        if (hkp_tok_is(t, ",") || hkp_tok_is(t, ")")) {
            *more = hkp_tok_is(t, ",");
            break;
        }
        if (hkp_tok_is(t, ".align")) {
            tok v;
            uint64_t a;
            if (!hkp_lex_next(lx, &v) || parse_uint(&v, &a) || a == 0 || a > 4096 ||
                (a & (a - 1))) {
                hkp_why(why, why_size, "PTX: bad .align in an .entry parameter");
                return HK_ERR_FORMAT;
            }
            /* After .ptr, .align describes the pointee, not the parameter. */
            if (!after_ptr)
                align = a;
        } else if (hkp_tok_is(t, ".ptr")) {
            after_ptr = 1;
        } else if (t->s[0] == '.') {
            unsigned sz = ptx_type_size(t);
            if (sz && !tsize)
                tsize = sz;
            /* Other directives (.global, .const ... after .ptr) carry no layout. */
        } else if (hkp_tok_is(t, "[")) {
            tok v, close;
            uint64_t d;
            if (!hkp_lex_next(lx, &v) || parse_uint(&v, &d) || !hkp_lex_next(lx, &close) ||
                !hkp_tok_is(&close, "]") || d > MAX_OBJECT_SIZE ||
                count > MAX_OBJECT_SIZE / (d ? d : 1)) {
                hkp_why(why, why_size, "PTX: bad array size in an .entry parameter");
                return HK_ERR_FORMAT;
            }
            count *= d;
        } else if (hkp_is_ident_char((unsigned char)t->s[0])) {
            have_name = 1;
        } else {
            hkp_why(why, why_size, "PTX: unexpected '%.*s' in an .entry parameter",
                    (int)(t->n > 40 ? 40 : t->n), t->s);
            return HK_ERR_FORMAT;
        }
    }
    if (!tsize || !have_name) {
        hkp_why(why, why_size, "PTX: .entry parameter without a %s", tsize ? "name" : "type");
        return HK_ERR_FORMAT;
    }
    if (!align)
        align = tsize;
    uint64_t size = (uint64_t)tsize * count;
    uint64_t off = (*offset + align - 1) & ~(align - 1);
    if (size > UINT32_MAX || off > UINT32_MAX - size) {
        hkp_why(why, why_size, "PTX: .entry parameters too large");
        return HK_ERR_FORMAT;
    }
    out->offset = (uint32_t)off;
    out->size = (uint32_t)size;
    *offset = off + size;
    return 0;
}

/* Parses ".entry NAME ( params )" with lx just after ".entry". */
static int ptx_entry(struct meta_builder *b, lexer *lx, int keep, char *why, size_t why_size) {
    tok name, t;
    hkp_param *params = NULL;
    int np = 0, cap = 0, rc = 0;
    uint64_t offset = 0;

    if (!hkp_lex_next(lx, &name) || !hkp_is_ident_char((unsigned char)name.s[0]) ||
        name.n > MAX_NAME) {
        hkp_why(why, why_size, "PTX: .entry without a name");
        return HK_ERR_FORMAT;
    }
    size_t save = lx->i;
    int save_bol = lx->bol;
    if (hkp_lex_next(lx, &t) && hkp_tok_is(&t, "(")) {
        if (!hkp_lex_next(lx, &t)) {
            hkp_why(why, why_size, "PTX: unterminated .entry parameter list");
            return HK_ERR_FORMAT;
        }
        if (!hkp_tok_is(&t, ")")) {
            int more = 1;
            while (more) {
                if (np >= MAX_PARAMS) {
                    hkp_why(why, why_size, "PTX: too many parameters");
                    rc = HK_ERR_FORMAT;
                    goto fail;
                }
                rc = grow((void **)&params, &cap, np + 1, sizeof *params);
                if (rc)
                    goto fail;
                rc = ptx_param(lx, &t, &more, &offset, &params[np], why, why_size);
                if (rc)
                    goto fail;
                np++;
                if (more && !hkp_lex_next(lx, &t)) {
                    hkp_why(why, why_size, "PTX: unterminated .entry parameter list");
                    rc = HK_ERR_FORMAT;
                    goto fail;
                }
            }
        }
    } else {
        lx->i = save;
        lx->bol = save_bol;
    }
    if (!keep) {
        free(params);
        return 0;
    }
    return add_entry(b, dup_n(name.s, name.n), params, np);
fail:
    free(params);
    return rc;
}

/* Skips a balanced { } block; lx is just after the opening brace. */
static int skip_block(lexer *lx, char *why, size_t why_size) {
    tok t;
    size_t depth = 1;
    while (depth) {
        if (!hkp_lex_next(lx, &t)) {
            hkp_why(why, why_size, "PTX: unbalanced braces (missing '}')");
            return HK_ERR_FORMAT;
        }
        if (hkp_tok_is(&t, "{"))
            depth++;
        else if (hkp_tok_is(&t, "}"))
            depth--;
    }
    return 0;
}

/* Skips the rest of the current line (for line-oriented directives). */
static void skip_line(lexer *lx) {
    while (lx->i < lx->n && lx->s[lx->i] != '\n')
        lx->i++;
}

/* The error of a variable declaration the input ends inside. */
static int var_eof(char *why, size_t why_size) {
    hkp_why(why, why_size, "PTX: unterminated variable declaration");
    return HK_ERR_FORMAT;
}

/* Reads the leading attributes of a .global/.const statement (.align N,
 * .attribute(...), .v2/.v4/.v8, the type), from *t on, into *elem and *vec;
 * leaves *t on the first declarator. */
static int ptx_var_attrs(lexer *lx, tok *t, uint64_t *elem, uint64_t *vec, char *why,
                         size_t why_size) {
    for (;;) {
        if (hkp_tok_is(t, ".align")) {
            tok v;
            uint64_t a;
            if (!hkp_lex_next(lx, &v) || parse_uint(&v, &a)) {
                hkp_why(why, why_size, "PTX: bad .align");
                return HK_ERR_FORMAT;
            }
        } else if (hkp_tok_is(t, ".attribute")) {
            /* .attribute(.managed) and the like: no bearing on the size. */
            if (!hkp_lex_next(lx, t))
                return var_eof(why, why_size);
            if (!hkp_tok_is(t, "(")) {
                hkp_why(why, why_size, "PTX: .attribute without '('");
                return HK_ERR_FORMAT;
            }
            for (size_t depth = 1; depth > 0;) {
                if (!hkp_lex_next(lx, t))
                    return var_eof(why, why_size);
                if (hkp_tok_is(t, "("))
                    depth++;
                else if (hkp_tok_is(t, ")"))
                    depth--;
            }
        } else if (hkp_tok_is(t, ".v2") || hkp_tok_is(t, ".v4") || hkp_tok_is(t, ".v8")) {
            *vec = (uint64_t)(t->s[2] - '0');
        } else if (t->s[0] == '.') {
            unsigned sz = ptx_type_size(t);
            if (sz)
                *elem = sz;
            /* Other qualifiers (.attribute(...) is not PTX ISA for variables
             * we care about) are ignored. */
        } else {
            break;
        }
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
    }
    if (!*elem) {
        hkp_why(why, why_size, "PTX: variable without a type");
        return HK_ERR_FORMAT;
    }
    return 0;
}

/* Reads a declarator's "[N]" and "[]" dimensions, *t on the token after its
 * name, into *count (the product of the sizes) and *open_dim (a "[]" seen);
 * leaves *t on what follows them. */
static int ptx_var_dims(lexer *lx, tok *t, const tok *name, uint64_t *count, int *open_dim,
                        char *why, size_t why_size) {
    while (hkp_tok_is(t, "[")) {
        uint64_t d = 0;
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
        if (hkp_tok_is(t, "]")) {
            *open_dim = 1;
        } else {
            if (parse_uint(t, &d) || d > MAX_OBJECT_SIZE || (d && *count > MAX_OBJECT_SIZE / d)) {
                hkp_why(why, why_size, "PTX: bad array size for '%.*s'", (int)name->n, name->s);
                return HK_ERR_FORMAT;
            }
            *count *= d;
            if (!hkp_lex_next(lx, t))
                return var_eof(why, why_size);
            if (!hkp_tok_is(t, "]")) {
                hkp_why(why, why_size, "PTX: expected ']'");
                return HK_ERR_FORMAT;
            }
        }
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
    }
    return 0;
}

/* Skips an initializer, *t on its "=", up to the ',' or ';' after it (left
 * in *t), counting its scalar values into *leaves (the size of "name[]"). */
static int ptx_var_init(lexer *lx, tok *t, uint64_t *leaves, char *why, size_t why_size) {
    size_t depth = 0;
    for (;;) {
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
        if (hkp_tok_is(t, "{") || hkp_tok_is(t, "("))
            depth++;
        else if (hkp_tok_is(t, "}") || hkp_tok_is(t, ")"))
            depth = depth ? depth - 1 : 0;
        else if (depth == 0 && (hkp_tok_is(t, ",") || hkp_tok_is(t, ";")))
            return 0;
        else if (!hkp_tok_is(t, ",") && !hkp_tok_is(t, "-") && !hkp_tok_is(t, "+"))
            (*leaves)++;
    }
}

/* Parses the declarators of a module-scope .global/.const statement, from
 * just after its directives, up to and including the ';'. */
static int ptx_vars(struct meta_builder *b, lexer *lx, tok *t, int keep, int is_const, char *why,
                    size_t why_size) {
    uint64_t elem = 0, vec = 1;
    int rc = ptx_var_attrs(lx, t, &elem, &vec, why, why_size);
    if (rc)
        return rc;
    for (;;) {
        /* Declarator: NAME [dims] [= initializer], then ',' or ';'. */
        if (!hkp_is_ident_char((unsigned char)t->s[0]) || t->n > MAX_NAME) {
            hkp_why(why, why_size, "PTX: expected a variable name, got '%.*s'",
                    (int)(t->n > 40 ? 40 : t->n), t->s);
            return HK_ERR_FORMAT;
        }
        tok name = *t;
        uint64_t count = 1, leaves = 0;
        int open_dim = 0;
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
        if ((rc = ptx_var_dims(lx, t, &name, &count, &open_dim, why, why_size)) != 0)
            return rc;
        if (hkp_tok_is(t, "=") && (rc = ptx_var_init(lx, t, &leaves, why, why_size)) != 0)
            return rc;
        if (open_dim)
            count = leaves / vec;
        uint64_t size = elem * vec;
        if (count > MAX_OBJECT_SIZE / size) {
            hkp_why(why, why_size, "PTX: variable '%.*s' too large", (int)name.n, name.s);
            return HK_ERR_FORMAT;
        }
        size *= count;
        /* Names starting with '$' are the compiler's own (string literals). */
        if (keep && name.s[0] != '$' && (rc = add_global(b, name.s, name.n, size, is_const)) != 0)
            return rc;
        if (hkp_tok_is(t, ";"))
            return 0;
        if (!hkp_tok_is(t, ",")) {
            hkp_why(why, why_size, "PTX: expected ',' or ';' after '%.*s'", (int)name.n, name.s);
            return HK_ERR_FORMAT;
        }
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
    }
}

/* Skips a statement up to ';' or a body; the first token is already read. */
static int skip_statement(lexer *lx, tok *t, char *why, size_t why_size) {
    size_t paren = 0;
    int eq = 0;
    for (;;) {
        if (hkp_tok_is(t, "("))
            paren++;
        else if (hkp_tok_is(t, ")"))
            paren = paren ? paren - 1 : 0;
        else if (hkp_tok_is(t, "="))
            eq = 1;
        else if (paren == 0 && hkp_tok_is(t, ";"))
            return 0;
        else if (hkp_tok_is(t, "{")) {
            int rc = skip_block(lx, why, why_size);
            if (rc || !eq)
                return rc;
        }
        if (!hkp_lex_next(lx, t))
            return 0;
    }
}

static int meta_ptx(const char *s, size_t n, struct meta_builder *b, char *why, size_t why_size) {
    lexer lx = {.s = s, .n = n, .i = 0, .bol = 1, .bad = 0};
    tok t;
    int have_version = 0, rc = 0;

    while (hkp_lex_next(&lx, &t)) {
        if (hkp_tok_is(&t, ".version")) {
            have_version = 1;
            skip_line(&lx);
            continue;
        }
        if (hkp_tok_is(&t, ".target")) {
            tok a;
            int more;
            while ((more = hkp_lex_next(&lx, &a)) && !a.bol) {
                int v = parse_arch_word(a.s, a.n);
                if (v && !b->m->arch)
                    b->m->arch = v;
            }
            if (!b->m->arch) {
                hkp_why(why, why_size, "PTX: .target without an sm_XY architecture");
                return HK_ERR_FORMAT;
            }
            if (more) {
                /* The token that ended the line starts the next statement. */
                lx.i = (size_t)(a.s - s);
                lx.bol = 1;
            }
            continue;
        }
        if (hkp_tok_is(&t, ".address_size") || hkp_tok_is(&t, ".file")) {
            skip_line(&lx);
            continue;
        }
        if (hkp_tok_is(&t, "{")) {
            rc = skip_block(&lx, why, why_size);
            if (rc)
                return rc;
            continue;
        }
        if (hkp_tok_is(&t, "}")) {
            hkp_why(why, why_size, "PTX: unbalanced '}'");
            return HK_ERR_FORMAT;
        }
        /* A declaration: linking and state-space directives, then what they
         * declare. */
        int is_extern = 0, space = 0; /* 1 global, 2 const, 3 other */
        for (;;) {
            if (hkp_tok_is(&t, ".extern"))
                is_extern = 1;
            else if (hkp_tok_is(&t, ".visible") || hkp_tok_is(&t, ".weak") ||
                     hkp_tok_is(&t, ".common"))
                ;
            else
                break;
            if (!hkp_lex_next(&lx, &t)) {
                hkp_why(why, why_size, "PTX: declaration cut short");
                return HK_ERR_FORMAT;
            }
        }
        if (hkp_tok_is(&t, ".entry")) {
            rc = ptx_entry(b, &lx, !is_extern, why, why_size);
            if (rc)
                return rc;
            /* Performance directives may precede the body or the ';'. */
            if (!hkp_lex_next(&lx, &t)) {
                hkp_why(why, why_size, "PTX: .entry without a body");
                return HK_ERR_FORMAT;
            }
            rc = skip_statement(&lx, &t, why, why_size);
        } else if (hkp_tok_is(&t, ".global") || hkp_tok_is(&t, ".const")) {
            space = hkp_tok_is(&t, ".global") ? 1 : 2;
            if (!hkp_lex_next(&lx, &t)) {
                hkp_why(why, why_size, "PTX: declaration cut short");
                return HK_ERR_FORMAT;
            }
            rc = ptx_vars(b, &lx, &t, !is_extern, space == 2, why, why_size);
        } else {
            /* .func, .shared, .pragma, .section, .alias ...: nothing to record. */
            rc = skip_statement(&lx, &t, why, why_size);
        }
        if (rc)
            return rc;
    }
    if (lx.bad) {
        hkp_why(why, why_size, "PTX: unterminated comment or string");
        return HK_ERR_FORMAT;
    }
    if (!have_version && !b->m->arch) {
        hkp_why(why, why_size, "PTX: no .version or .target directive");
        return HK_ERR_FORMAT;
    }
    if (!b->m->arch) {
        hkp_why(why, why_size, "PTX: no .target directive");
        return HK_ERR_FORMAT;
    }
    return 0;
}

/* ---- cubin (ELF) ----------------------------------------------------------- */

typedef struct elf_sec {
    uint32_t name, type, link, info;
    uint64_t off, size;
} elf_sec;

typedef struct elf_view {
    const unsigned char *p;
    size_t size;
    uint16_t shnum;
    elf_sec *secs;
    const char *shstr; /* section name table */
    uint64_t shstr_size;
} elf_view;

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

static int elf_open(elf_view *v, const unsigned char *p, size_t size, char *why, size_t why_size) {
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
static int cubin_arch(const elf_view *v) {
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

static int meta_cubin(const unsigned char *p, size_t size, struct meta_builder *b, char *why,
                      size_t why_size) {
    elf_view v;
    int rc = elf_open(&v, p, size, why, why_size);
    if (rc)
        goto out;
    b->m->arch = cubin_arch(&v);
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
                    rc = add_entry(b, dup_n(nm, nlen), params, np);
                if (rc)
                    goto out;
            } else if (type == STT_OBJECT) {
                int is_const;
                if (!is_global_section(sn, &is_const) || nm[0] == '$' || nm[0] == '.')
                    continue;
                rc = add_global(b, nm, nlen, ssize, is_const);
                if (rc)
                    goto out;
            }
        }
    }
out:
    free(v.secs);
    return rc;
}

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
           elf_open(v, img, (size_t)psize, NULL, 0) == 0;
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
            int a = cubin_arch(&v);
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
        if (grow((void **)&into->m->entries, &into->ecap, into->m->nentries + 1, sizeof(hkp_entry)))
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
        rc = meta_cubin(img, (size_t)psize, &b, NULL, 0);
    } else if (kind == FATBIN_KIND_PTX && psize > 0) {
        /* Compressed PTX (nvcc's default) is no PTX text: its parse fails. */
        size_t n = (size_t)psize;
        while (n > 0 && img[n - 1] == '\0') /* the member is padded */
            n--;
        rc = meta_ptx((const char *)img, n, &b, NULL, 0);
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
        rc = meta_ptx(data, size, &b, why, why_size);
        break;
    case HK_FORMAT_CUBIN:
        rc = meta_cubin(data, size, &b, why, why_size);
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

/*
 * ptx/meta.h: what the metadata parsers share, and they only (hkp_meta_read,
 * ptx/ptx.h, is the way in for everything else).
 *
 *   meta_base.c  the metadata's life (free, copy, the builder the parsers
 *                fill), architecture names and compatibility, hkp_why;
 *   meta_ptx.c   PTX: the lexer (shared with guard.c) and the parser;
 *   meta_elf.c   cubins (ELF): headers, sections, .nv.info attributes;
 *   meta.c       fatbins, a fatbin's kernels, and hkp_meta_read.
 *
 * detect.c (format detection) sits between meta_base.c, meta_elf.c and the
 * rest: it uses hkp_why and hkp_elf_check_header, and meta_ptx.c its
 * hkp_skip_blank. meta.c uses them all; nothing calls back up.
 */
#ifndef HK_PTX_META_H
#define HK_PTX_META_H

#include <stddef.h>
#include <stdint.h>

#include "ptx/ptx.h"

/* Upper bounds that keep hostile input from asking for absurd allocations
 * or overflowing offset arithmetic. Real modules are far below them. */
#define MAX_PARAMS      4096
#define MAX_OBJECT_SIZE (UINT64_C(1) << 48)
#define MAX_NAME        4096

/* The metadata a parser fills, with the capacity of its arrays. */
struct meta_builder {
    hkp_meta *m;
    int ecap, gcap;
};

/* A cubin opened for reading: its section headers, bounds-checked. */
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

/* ---- meta_base.c ---------------------------------------------------------- */

/* Grows *arr (of elem-byte items, capacity *cap) to hold need items:
 * HK_ERR_TOO_LARGE past 2^25 of them, HK_ERR_NOMEM. */
int hkp_grow(void **arr, int *cap, int need, size_t elem);
/* A malloc'd copy of the n bytes at s, NUL-terminated; NULL on no memory. */
char *hkp_dup_n(const char *s, size_t n);
/* Adds an entry to b's metadata. Takes ownership of name and params (also
 * on failure; a NULL name is HK_ERR_NOMEM). */
int hkp_meta_add_entry(struct meta_builder *b, char *name, hkp_param *params, int nparams);
/* Adds a global of n name bytes to b's metadata. */
int hkp_meta_add_global(struct meta_builder *b, const char *name, size_t n, uint64_t size,
                        int is_const);

/* ---- the parsers ---------------------------------------------------------- */

/* PTX text (n bytes) into b: 0, HK_ERR_FORMAT with why, or HK_ERR_NOMEM. */
int hkp_meta_ptx(const char *s, size_t n, struct meta_builder *b, char *why, size_t why_size);
/* A cubin (size bytes) into b, likewise. */
int hkp_meta_cubin(const unsigned char *p, size_t size, struct meta_builder *b, char *why,
                   size_t why_size);
/* Opens a cubin's section headers into v (v->secs malloc'd, freed by the
 * caller whatever the result): 0 or HK_ERR_FORMAT with why. */
int hkp_elf_open(elf_view *v, const unsigned char *p, size_t size, char *why, size_t why_size);
/* The SM of an opened cubin, with HKP_ARCH_SPECIFIC for 'a' targets. */
int hkp_cubin_arch(const elf_view *v);

#endif /* HK_PTX_META_H */

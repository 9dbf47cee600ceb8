/*
 * loader/record.c: one module's last-known-good record, parsed and
 * formatted (the format is described there), and the hex of an image hash.
 * Needs no runtime and no CUDA header, so that the fuzz target builds it
 * alone; lkg.c and lkgdisk.c keep the records.
 */
#ifndef HK_LOADER_RECORD_H
#define HK_LOADER_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "hotkern/hotkern.h"
#include "util/util.h"

#define HKL_REC_MAXQ      32
#define HKL_REC_MAXEXPR   64
#define HKL_REC_MAX_BYTES (300 << 10)
typedef struct hkl_rec_image {
    int has;
    uint8_t hash[32];
    hk_format format;
    uint64_t release;
} hkl_rec_image;
typedef struct hkl_rec_q {
    uint8_t hash[32];
    uint64_t release, version;
} hkl_rec_q;
typedef struct hkl_rec {
    char module[HKU_NAME_MAX]; /* a module name (util/util.h) */
    hkl_rec_image current, good;
    int nexpr; /* name expressions of the good image */
    char **expr, **lowered;
    int nq; /* quarantined images, oldest first */
    hkl_rec_q q[HKL_REC_MAXQ];
} hkl_rec;
/* 0, or HK_ERR_FORMAT with why set (r then holds nothing to free). */
int hkl_rec_parse(const char *text, size_t len, hkl_rec *r, char *why, size_t whyn);
/* *out: the text, malloc'd and NUL-terminated, *outlen bytes long. */
int hkl_rec_format(const hkl_rec *r, char **out, size_t *outlen);
void hkl_rec_free(hkl_rec *r);
/* A hash as 64 lowercase hex digits, and back: 0, or HK_ERR_FORMAT when the
 * n bytes at s are not such digits. */
void hkl_hash_hex(const uint8_t h[32], char out[65]);
int hkl_hash_parse(const char *s, size_t n, uint8_t h[32]);

#endif /* HK_LOADER_RECORD_H */

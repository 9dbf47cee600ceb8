/*
 * The source file a translation unit's fatbin names, when it names one.
 * __cudaRegisterFatBinary gets nvcc's wrapper {int magic 0x466243b1; int
 * version; const void *data; void *filename_or_fatbins}; data is the fatbin:
 * a 16-byte header (u32 magic 0xBA55ED50, u16 version, u16 header size, u64
 * size of the entries) and entries, each with its own header (u16 kind, u16
 * version, u32 header size, u64 payload size, ...; at 32 a u32 offset and at
 * 36 a u32 length of the "identifier", both from the entry's start, when the
 * fatbin was made with fatbinary --ident). nvcc 13 writes no identifier
 * (checked: the wrapper's last field is 0 and no entry has one), so this is
 * the fallback for images without a symbol table (elfsym.c comes first).
 *
 * The parser reads a buffer of any content (tests/fuzz/fuzz_fatbin.c):
 * every offset and size is checked against the buffer before it is read.
 */
#include <stdint.h>
#include <string.h>

#include "interpose/interpose.h"

#define WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC  0xBA55ED50u
#define FATBIN_MAX    ((uint64_t)1 << 32) /* a sane bound on what is read */

static uint16_t u16(const unsigned char *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t u64(const unsigned char *p) {
    return (uint64_t)u32(p) | (uint64_t)u32(p + 4) << 32;
}

int hki_fatbin_ident(const unsigned char *buf, size_t len, char *out, size_t n) {
    if (!buf || !out || n < 2 || len < 16 || u32(buf) != FATBIN_MAGIC)
        return HKI_NOT_IMAGE;
    uint64_t hs = u16(buf + 6), fs = u64(buf + 8);
    if (hs < 16 || hs > len || fs > len - hs)
        return HKI_NOT_IMAGE;
    uint64_t off = hs, end = hs + fs;
    while (end - off >= 16) {
        uint64_t ehs = u32(buf + off + 4), ps = u64(buf + off + 8);
        if (ehs < 16 || ehs > end - off || ps > end - off - ehs)
            return HKI_NOT_IMAGE;
        if (ehs >= 40) {
            uint64_t io = u32(buf + off + 32), il = u32(buf + off + 36);
            if (il && io >= 40 && io <= ehs && il <= ehs - io) {
                char id[256];
                size_t l = il < sizeof id ? (size_t)il : sizeof id - 1;
                memcpy(id, buf + off + io, l);
                id[l] = '\0';
                hki_file_stem(id, out, n);
                if (out[0])
                    return 1;
            }
        }
        off += ehs + ps;
    }
    return 0;
}

int hki_fatbin_wrapper_ident(const void *wrapper, char *out, size_t n) {
    if (!wrapper)
        return 0;
    int head[2];
    memcpy(head, wrapper, sizeof head);
    if ((uint32_t)head[0] != WRAPPER_MAGIC || head[1] != 1)
        return 0; /* not nvcc's whole-program wrapper */
    const unsigned char *data;
    memcpy(&data, (const char *)wrapper + 8, sizeof data);
    if (!data || u32(data) != FATBIN_MAGIC)
        return 0;
    uint64_t hs = u16(data + 6), fs = u64(data + 8);
    if (hs < 16 || fs > FATBIN_MAX)
        return 0;
    return hki_fatbin_ident(data, (size_t)(hs + fs), out, n) == 1;
}

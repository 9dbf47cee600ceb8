/*
 * libFuzzer target for the ELF symbol table reader (interpose/elfsym.c),
 * which reads the program's image from disk to learn which source file a
 * kernel's host stub came from. Any content must give an answer, never a
 * read outside the image; a stem found is NUL-terminated, no '/' or '.'
 * in it, and shorter than the buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "interpose/interpose.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A copy of exactly size bytes, so that ASan sees a read past it. */
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf)
        abort();
    memcpy(buf, data, size);
    uint64_t addrs[] = {0, 0x1000, 0x401126, size > 8 ? (uint64_t)data[size - 1] << 4 : 1};
    for (size_t i = 0; i < sizeof addrs / sizeof addrs[0]; i++) {
        char out[32];
        memset(out, 'x', sizeof out);
        int r = hki_elf_file_of(buf, size, addrs[i], out, sizeof out);
        if (r < -1 || r > 1)
            abort();
        if (r == 1 &&
            (!memchr(out, '\0', sizeof out) || !out[0] || strchr(out, '/') || strchr(out, '.')))
            abort();
    }
    free(buf);
    return 0;
}

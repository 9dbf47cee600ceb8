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
    /* All at once, duplicates among them: each found is a stem, the count
     * is how many are. */
    char stems[4][HKI_STEM_MAX];
    uint64_t batch[4] = {addrs[3], 0x401126, addrs[3], 0};
    int r = hki_elf_files(buf, size, batch, 4, stems);
    int n = 0;
    for (int i = 0; i < 4; i++) {
        if (!memchr(stems[i], '\0', HKI_STEM_MAX))
            abort();
        n += stems[i][0] != '\0';
    }
    if (r < -1 || (r >= 0 && r != n) || (r < 0 && n))
        abort();
    free(buf);
    return 0;
}

/*
 * libFuzzer target for the fatbin identifier reader (interpose/fatbin.c),
 * which reads the fatbin a translation unit registers. Any content must
 * give an answer, never a read outside the buffer; an identifier found
 * gives a NUL-terminated stem with no '/' or '.' in it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "interpose/interpose.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char *buf = malloc(size ? size : 1); /* exactly size bytes for ASan */
    if (!buf)
        abort();
    memcpy(buf, data, size);
    char out[HKI_STEM_MAX];
    memset(out, 'x', sizeof out);
    int r = hki_fatbin_ident(buf, size, out, sizeof out);
    if (r < -1 || r > 1)
        abort();
    if (r == 1 &&
        (!memchr(out, '\0', sizeof out) || !out[0] || strchr(out, '/') || strchr(out, '.')))
        abort();
    free(buf);
    return 0;
}

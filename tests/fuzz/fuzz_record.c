/*
 * libFuzzer target for the last-known-good record (loader/record.c).
 *
 * A record may be cut short by a crash, damaged on disk or edited by hand;
 * any content must either parse or be refused with a reason, never crash or
 * read past its length. What parses must format back into a record that
 * parses to the same text again.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loader/record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A copy of exactly `size` bytes, so that ASan sees any read past it. */
    char *text = malloc(size ? size : 1);
    if (!text)
        abort();
    memcpy(text, data, size);
    hkl_rec r, r2;
    char why[160] = "";
    if (hkl_rec_parse(text, size, &r, why, sizeof why) != 0) {
        if (!why[0])
            abort(); /* a refusal always says why */
        free(text);
        return 0;
    }
    char *a, *b;
    size_t na, nb;
    if (hkl_rec_format(&r, &a, &na) != 0 || hkl_rec_parse(a, na, &r2, why, sizeof why) != 0 ||
        hkl_rec_format(&r2, &b, &nb) != 0 || na != nb || memcmp(a, b, na))
        abort();
    free(a);
    free(b);
    hkl_rec_free(&r);
    hkl_rec_free(&r2);
    free(text);
    return 0;
}

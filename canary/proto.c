/*
 * The buffer fills a test declares, used by both sides of the canary
 * (canary.h): generated where the buffer lives, so a pattern costs no bytes
 * on the wire. The framing is util/wire.c's.
 */
#include <string.h>

#include "canary/canary.h"

/* xorshift64*: the same bytes for the same seed on both versions' runs. */
static uint64_t next_rand(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

void hka_fill(void *p, size_t n, uint32_t fill, uint64_t param) {
    unsigned char *b = p;
    switch (fill) {
    case HK_FILL_BYTE:
        memset(b, (int)(param & 0xff), n);
        break;
    case HK_FILL_RANDOM: {
        uint64_t s = param ? param : 0x9E3779B97F4A7C15ULL;
        for (size_t i = 0; i < n; i += 8) {
            uint64_t v = next_rand(&s);
            memcpy(b + i, &v, n - i < 8 ? n - i : 8);
        }
        break;
    }
    /* Two loops of one shape, one per element type: a loop per fill keeps
     * the type test out of the per-element work. */
    case HK_FILL_IOTA_I32:
        for (size_t i = 0; i + 4 <= n; i += 4) {
            int32_t v = (int32_t)(i / 4 + param);
            memcpy(b + i, &v, 4);
        }
        memset(b + n / 4 * 4, 0, n % 4);
        break;
    case HK_FILL_IOTA_F32:
        for (size_t i = 0; i + 4 <= n; i += 4) {
            float v = (float)(i / 4 + param);
            memcpy(b + i, &v, 4);
        }
        memset(b + n / 4 * 4, 0, n % 4);
        break;
    default: /* HK_FILL_ZERO */
        memset(b, 0, n);
        break;
    }
}

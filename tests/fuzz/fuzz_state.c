/*
 * libFuzzer target for the anti-rollback state file (net/state.c).
 *
 * accepted.json is read at every check and may be damaged by a crash, a
 * full disk or a hand edit; any content must either load (and then hold only
 * valid records) or be refused, never crash or read as fewer records than it
 * holds. Each input is written as the file of a fresh directory, opened,
 * read, raised and read again.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "net/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/hotkern-fuzz-state-XXXXXX");
        if (!mkdtemp(dir))
            abort();
    }
    char path[128];
    snprintf(path, sizeof path, "%s/accepted.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        abort();
    hkn_state *s;
    hk_report rep = HK_REPORT_INIT;
    if (hkn_state_open(dir, &s, &rep) == 0) {
        uint64_t v = 0, w = 0;
        if (hkn_state_lookup(s, "add", &v, &rep) != 0)
            abort(); /* it loaded a moment ago */
        if (v >= (UINT64_C(1) << 53))
            abort();
        if (v + 1 < (UINT64_C(1) << 53) &&
            (hkn_state_accept(s, "add", v + 1, &rep) != 0 ||
             hkn_state_lookup(s, "add", &w, &rep) || w != v + 1))
            abort();
        hkn_state_close(s);
    } else if (!rep.message[0]) {
        abort(); /* refused without saying why */
    }
    hk_report_clear(&rep);
    unlink(path);
    return 0;
}

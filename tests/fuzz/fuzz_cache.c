/*
 * libFuzzer target for the compile cache's file formats (ptx/entry.c): the
 * header of an entry file, and the artifact and manifest payloads.
 *
 * Every file of the cache directory may be cut short by a crash, damaged on
 * disk, or copied over another key's name; any content must be refused or
 * accepted, never crash or read past its length, and an entry must serve
 * only the key it was written for. The first byte of an input says what the
 * rest is read as:
 *   0  an entry file for a fixed key: accepted only when whole and tagged
 *      for that key (then its header is what hkp_entry_header makes);
 *   1  an artifact payload, 2  a manifest payload: what parses formats back
 *      to the same bytes, and a manifest sorted then parses again;
 *   3  a payload wrapped in a valid entry, which must be accepted for its
 *      key and refused for another, and refused again once any byte of it
 *      (picked by the input) is changed; the payload then goes through both
 *      payload parsers, as the cache's reader would send it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/ptx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t key0[HKP_KEY_BYTES] = {0x6b, 0x65, 0x79, 0x30};

/* A copy of exactly n bytes, so that ASan sees any read past them. */
static unsigned char *copy(const uint8_t *p, size_t n) {
    unsigned char *c = malloc(n ? n : 1);
    if (!c)
        abort();
    if (n)
        memcpy(c, p, n);
    return c;
}

static void artifact(const uint8_t *p, size_t n) {
    unsigned char *in = copy(p, n);
    hkp_artifact a;
    int rc = hkp_artifact_parse(in, n, &a);
    if (rc != 0 && rc != HK_ERR_FORMAT && rc != HK_ERR_NOMEM)
        abort();
    if (rc == 0) {
        void *out;
        size_t m;
        if (!a.image || !a.size || (a.nlowered && !a.lowered_names) || (a.ndeps && !a.deps))
            abort();
        if (hkp_artifact_format(&a, &out, &m) != 0 || m != n || memcmp(out, in, n))
            abort();
        free(out);
        hkp_artifact_free(&a);
    }
    free(in);
}

static void manifest(const uint8_t *p, size_t n) {
    unsigned char *in = copy(p, n);
    hkp_deps d;
    int rc = hkp_manifest_parse(in, n, &d);
    if (rc != 0 && rc != HK_ERR_FORMAT && rc != HK_ERR_NOMEM)
        abort();
    if (rc == 0) {
        void *out;
        size_t m;
        if (d.n > HKP_MAX_DEPS || d.nprobes > HKP_MAX_PROBES)
            abort();
        for (int i = 0; i < d.n; i++)
            if (!d.paths[i][0] || d.mem[i] > 1)
                abort();
        if (hkp_manifest_format(&d, &out, &m) != 0 || m != n || memcmp(out, in, n))
            abort();
        free(out);
        hkp_deps_sort_probes(&d);
        for (int i = 1; i < d.nprobes; i++)
            if (strcmp(d.probes[i - 1], d.probes[i]) >= 0)
                abort(); /* sorted, no duplicate left */
        hkp_deps back;
        if (hkp_manifest_format(&d, &out, &m) != 0 || hkp_manifest_parse(out, m, &back) != 0 ||
            back.n != d.n || back.nprobes != d.nprobes)
            abort();
        free(out);
        hkp_deps_free(&back);
        hkp_deps_free(&d);
    }
    free(in);
}

static void entry_file(const uint8_t *p, size_t n) {
    unsigned char *in = copy(p, n);
    if (hkp_entry_check(key0, in, n) == 0) {
        unsigned char hdr[HKP_ENTRY_HEADER];
        hkp_entry_header(key0, in + HKP_ENTRY_HEADER, n - HKP_ENTRY_HEADER, hdr);
        if (memcmp(hdr, in, HKP_ENTRY_HEADER))
            abort();
    }
    free(in);
}

static void wrapped(const uint8_t *p, size_t n) {
    size_t total = HKP_ENTRY_HEADER + n;
    unsigned char *file = malloc(total);
    if (!file)
        abort();
    hkp_entry_header(key0, p, n, file);
    if (n)
        memcpy(file + HKP_ENTRY_HEADER, p, n);
    uint8_t other[HKP_KEY_BYTES];
    memcpy(other, key0, sizeof other);
    other[HKP_KEY_BYTES - 1] ^= 1;
    if (hkp_entry_check(key0, file, total) != 0 || hkp_entry_check(other, file, total) == 0)
        abort();
    /* Cut short anywhere, or one byte changed anywhere: refused. */
    size_t cut = n ? p[0] % total : 0;
    if (hkp_entry_check(key0, file, cut) == 0)
        abort();
    size_t at = (n > 1 ? (size_t)p[1] * 131 + (n > 2 ? p[2] : 0) : 0) % total;
    file[at] ^= (unsigned char)(n > 3 && p[3] ? p[3] : 0x80);
    if (hkp_entry_check(key0, file, total) == 0)
        abort();
    free(file);
    artifact(p, n);
    manifest(p, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] % 4) {
    case 0:
        entry_file(p, n);
        break;
    case 1:
        artifact(p, n);
        break;
    case 2:
        manifest(p, n);
        break;
    default:
        wrapped(p, n);
        break;
    }
    return 0;
}

/*
 * The compile cache's file formats, parsed and formatted: nothing else, so
 * that the parsers can be fuzzed on their own (tests/fuzz/fuzz_cache.c).
 * Every file of the cache directory is untrusted input: a crash can leave
 * an entry cut short, a disk can damage one, and a file copied over another
 * key's name must not be served for that key.
 *
 * An entry file (ptx/cache.c) is
 *   "HKCACHE2"  u64 payload length  key[32]  tag[32]  payload
 * where key is the entry's key (the file is named by it) and tag is
 * BLAKE2b-256 of the payload keyed with the key (libsodium's
 * crypto_generichash): an entry serves only the key it was written for, and
 * a damaged payload is refused.
 *
 * The payloads (ptx/deps.c; util/wire.c's buffer and reader write and
 * read them), little-endian u64s and strings as u64 length + bytes (no NUL
 * inside):
 *   artifact  u64 "HKTA1"  u64 format  u64 size  image[size]
 *             u64 n  lowered name * n   u64 n  dependency * n   str log
 *             or, with a trap guard's copy (guard.c), the same under "HKTA2"
 *             followed by  u64 sites  u64 size  guard[size]  (sites > 0)
 *   manifest  u64 "HKM3"   u64 n  {u64 in-memory (0/1), str path,
 *             hash[32]} * n   u64 n  absent path * n
 * A manifest's dependencies are the headers a CUDA C build read, with their
 * hashes when it was built; its absent paths are the places searched before
 * each header was found (or for an include nothing was found for), which
 * must still hold no file for the entry to serve: a header appearing
 * earlier in the search is what the compiler would read from then on.
 *
 * Strict: counts are bounded before anything is allocated, every byte is
 * accounted for (nothing may follow), and what parses formats back to the
 * same bytes.
 */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/ptx.h"
#include "util/util.h"

#define ENTRY_MAGIC    "HKCACHE2"
#define ARTIFACT_MAGIC 0x3141544b48ull /* "HKTA1" */
#define GUARDED_MAGIC  0x3241544b48ull /* "HKTA2": with a guard */
#define MANIFEST_MAGIC 0x334d4b48ull   /* "HKM3" */
#define MAX_STRINGS    65536           /* lowered names, dependencies */
#define MAX_STR        (1u << 20)      /* one name or path; a log may be longer */

/* ---- entry files ---------------------------------------------------------- */

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void entry_tag(const uint8_t key[HKP_KEY_BYTES], const void *payload, size_t n,
                      uint8_t tag[HKP_KEY_BYTES]) {
    crypto_generichash(tag, HKP_KEY_BYTES, payload, n, key, HKP_KEY_BYTES);
}

void hkp_entry_header(const uint8_t key[HKP_KEY_BYTES], const void *payload, size_t n,
                      unsigned char hdr[HKP_ENTRY_HEADER]) {
    memcpy(hdr, ENTRY_MAGIC, 8);
    put_u64(hdr + 8, (uint64_t)n);
    memcpy(hdr + 16, key, HKP_KEY_BYTES);
    entry_tag(key, payload, n, hdr + 16 + HKP_KEY_BYTES);
}

int hkp_entry_check(const uint8_t key[HKP_KEY_BYTES], const unsigned char *file, size_t n) {
    if (n < HKP_ENTRY_HEADER || memcmp(file, ENTRY_MAGIC, 8) != 0 ||
        hkp_rd64(file + 8) != (uint64_t)(n - HKP_ENTRY_HEADER) ||
        sodium_memcmp(file + 16, key, HKP_KEY_BYTES) != 0)
        return HK_ERR_FORMAT;
    uint8_t tag[HKP_KEY_BYTES];
    entry_tag(key, file + HKP_ENTRY_HEADER, n - HKP_ENTRY_HEADER, tag);
    return sodium_memcmp(tag, file + 16 + HKP_KEY_BYTES, HKP_KEY_BYTES) == 0 ? 0 : HK_ERR_FORMAT;
}

/* ---- payloads ------------------------------------------------------------- */

/* Written and read with util/wire.c's buffer and reader (little-endian,
 * bounds-checked); what is particular to these formats is here. */

static void put_strv(hku_buf *w, char *const *v, int n) {
    hku_put_u64(w, (uint64_t)n);
    for (int i = 0; i < n; i++)
        hku_put_str64(w, v[i]);
}

/* A count of strings, then the strings, into *out (*n of them so far, for
 * the caller to free on failure). Each takes at least 8 bytes, so a count
 * the rest of the input cannot hold is refused before the allocation. */
static void get_strv(hku_rd *r, char ***out, int *n) {
    uint64_t cnt = hku_get_u64(r);
    if (r->bad || cnt > MAX_STRINGS || cnt > r->left / 8) {
        hku_rd_fail(r, HKU_RD_MALFORMED);
        return;
    }
    if (!cnt)
        return;
    if (!(*out = calloc((size_t)cnt, sizeof **out))) {
        hku_rd_fail(r, HKU_RD_NOMEM);
        return;
    }
    for (uint64_t i = 0; i < cnt && !r->bad; i++)
        if (((*out)[i] = hku_get_str64(r, MAX_STR)))
            *n = (int)i + 1;
}

/* 0 when r read its input whole and well; HK_ERR_NOMEM when memory ran
 * out; HK_ERR_FORMAT otherwise. */
static int get_end(const hku_rd *r) {
    return r->bad == HKU_RD_NOMEM ? HK_ERR_NOMEM : hku_end(r) ? HK_ERR_FORMAT : 0;
}

/* ---- artifacts ------------------------------------------------------------ */

void hkp_artifact_free(hkp_artifact *a) {
    if (!a)
        return;
    free(a->image);
    free(a->guard);
    free(a->log);
    for (int i = 0; i < a->ndeps; i++)
        free(a->deps[i]);
    free(a->deps);
    for (int i = 0; i < a->nlowered; i++)
        free(a->lowered_names[i]);
    free(a->lowered_names);
    hkp_meta_free(&a->meta);
    memset(a, 0, sizeof *a);
}

/* A guard's sites and copy (HKTA2): sites 1..2^20, a copy of 1 byte or
 * more that the input holds. */
static void get_guard(hku_rd *r, hkp_artifact *a) {
    uint64_t sites = hku_get_u64(r), gsz = hku_get_u64(r);
    if (r->bad || sites == 0 || sites > (1u << 20) || gsz == 0 || gsz > r->left) {
        hku_rd_fail(r, HKU_RD_MALFORMED);
        return;
    }
    if (!(a->guard = malloc((size_t)gsz))) {
        hku_rd_fail(r, HKU_RD_NOMEM);
        return;
    }
    memcpy(a->guard, hku_get(r, (size_t)gsz), (size_t)gsz);
    a->guard_size = (size_t)gsz;
    a->guard_sites = (int)sites;
}

int hkp_artifact_format(const hkp_artifact *a, void **out, size_t *n) {
    hku_buf w = {0};
    hku_put_u64(&w, a->guard ? GUARDED_MAGIC : ARTIFACT_MAGIC);
    hku_put_u64(&w, (uint64_t)a->format);
    hku_put_u64(&w, a->size);
    hku_put(&w, a->image, a->size);
    put_strv(&w, a->lowered_names, a->nlowered);
    put_strv(&w, a->deps, a->ndeps);
    hku_put_str64(&w, a->log);
    if (a->guard) {
        hku_put_u64(&w, (uint64_t)a->guard_sites);
        hku_put_u64(&w, a->guard_size);
        hku_put(&w, a->guard, a->guard_size);
    }
    return hku_buf_take(&w, out, n);
}

int hkp_artifact_parse(const void *data, size_t n, hkp_artifact *a) {
    hku_rd r = {.p = data, .left = n};
    memset(a, 0, sizeof *a);
    uint64_t magic = hku_get_u64(&r);
    if (magic != ARTIFACT_MAGIC && magic != GUARDED_MAGIC)
        return HK_ERR_FORMAT;
    uint64_t fmt = hku_get_u64(&r), isz = hku_get_u64(&r);
    if (r.bad || (fmt != HK_FORMAT_PTX && fmt != HK_FORMAT_CUBIN && fmt != HK_FORMAT_FATBIN) ||
        isz == 0 || isz > r.left)
        return HK_ERR_FORMAT;
    a->format = (hk_format)fmt;
    if (!(a->image = malloc((size_t)isz)))
        return HK_ERR_NOMEM;
    memcpy(a->image, hku_get(&r, (size_t)isz), (size_t)isz);
    a->size = (size_t)isz;
    get_strv(&r, &a->lowered_names, &a->nlowered);
    get_strv(&r, &a->deps, &a->ndeps);
    a->log = hku_get_str64(&r, SIZE_MAX);
    if (magic == GUARDED_MAGIC)
        get_guard(&r, a);
    int err = get_end(&r);
    if (!err && a->log && !a->log[0]) {
        free(a->log); /* none was logged: written as "" */
        a->log = NULL;
    }
    if (err)
        hkp_artifact_free(a);
    return err;
}

/* ---- manifests ------------------------------------------------------------ */

void hkp_deps_free(hkp_deps *d) {
    for (int i = 0; i < d->n; i++)
        free(d->paths[i]);
    for (int i = 0; i < d->nprobes; i++)
        free(d->probes[i]);
    free(d->paths);
    free(d->hash);
    free(d->mem);
    free(d->probes);
    memset(d, 0, sizeof *d);
}

int hkp_deps_add(hkp_deps *d, const char *path, const uint8_t hash[HKP_KEY_BYTES], int mem) {
    if (d->n == d->cap) {
        int ncap = d->cap ? d->cap * 2 : 16;
        char **p = realloc(d->paths, (size_t)ncap * sizeof *p);
        if (!p)
            return HK_ERR_NOMEM;
        d->paths = p;
        uint8_t(*h)[HKP_KEY_BYTES] = realloc(d->hash, (size_t)ncap * sizeof *h);
        if (!h)
            return HK_ERR_NOMEM;
        d->hash = h;
        unsigned char *m = realloc(d->mem, (size_t)ncap);
        if (!m)
            return HK_ERR_NOMEM;
        d->mem = m;
        d->cap = ncap;
    }
    if (!(d->paths[d->n] = strdup(path)))
        return HK_ERR_NOMEM;
    memcpy(d->hash[d->n], hash, HKP_KEY_BYTES);
    d->mem[d->n] = (unsigned char)(mem != 0);
    d->n++;
    return 0;
}

int hkp_deps_add_probe(hkp_deps *d, const char *path) {
    if (d->nprobes == HKP_MAX_PROBES) {
        d->incomplete = 1; /* a search too large to record: not cached */
        return 0;
    }
    if (d->nprobes == d->capprobes) {
        int ncap = d->capprobes ? d->capprobes * 2 : 16;
        char **p = realloc(d->probes, (size_t)ncap * sizeof *p);
        if (!p)
            return HK_ERR_NOMEM;
        d->probes = p;
        d->capprobes = ncap;
    }
    if (!(d->probes[d->nprobes] = strdup(path)))
        return HK_ERR_NOMEM;
    d->nprobes++;
    return 0;
}

static int by_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void hkp_deps_sort_probes(hkp_deps *d) {
    if (d->nprobes < 2)
        return;
    qsort(d->probes, (size_t)d->nprobes, sizeof *d->probes, by_str);
    int k = 1;
    for (int i = 1; i < d->nprobes; i++) {
        if (strcmp(d->probes[i], d->probes[k - 1]) != 0)
            d->probes[k++] = d->probes[i];
        else
            free(d->probes[i]);
    }
    d->nprobes = k;
}

int hkp_manifest_format(const hkp_deps *d, void **out, size_t *n) {
    hku_buf w = {0};
    hku_put_u64(&w, MANIFEST_MAGIC);
    hku_put_u64(&w, (uint64_t)d->n);
    for (int i = 0; i < d->n; i++) {
        hku_put_u64(&w, d->mem[i]);
        hku_put_str64(&w, d->paths[i]);
        hku_put(&w, d->hash[i], HKP_KEY_BYTES);
    }
    put_strv(&w, d->probes, d->nprobes);
    return hku_buf_take(&w, out, n);
}

int hkp_manifest_parse(const void *data, size_t n, hkp_deps *d) {
    hku_rd r = {.p = data, .left = n};
    memset(d, 0, sizeof *d);
    if (hku_get_u64(&r) != MANIFEST_MAGIC)
        return HK_ERR_FORMAT;
    /* A dependency takes at least 8 + 8 + 32 bytes. */
    uint64_t cnt = hku_get_u64(&r);
    if (r.bad || cnt > HKP_MAX_DEPS || cnt > r.left / 48)
        return HK_ERR_FORMAT;
    for (uint64_t i = 0; i < cnt && !r.bad; i++) {
        uint64_t mem = hku_get_u64(&r);
        char *path = hku_get_str64(&r, MAX_STR);
        const void *hash = path && mem <= 1 && path[0] ? hku_get(&r, HKP_KEY_BYTES) : NULL;
        if (!hash)
            hku_rd_fail(&r, HKU_RD_MALFORMED);
        else if (hkp_deps_add(d, path, hash, (int)mem) < 0)
            hku_rd_fail(&r, HKU_RD_NOMEM);
        free(path);
    }
    uint64_t np = hku_get_u64(&r);
    if (r.bad || np > HKP_MAX_PROBES || np > r.left / 8)
        hku_rd_fail(&r, HKU_RD_MALFORMED);
    for (uint64_t i = 0; i < np && !r.bad; i++) {
        char *path = hku_get_str64(&r, MAX_STR);
        if (!path || !path[0])
            hku_rd_fail(&r, HKU_RD_MALFORMED);
        else if (hkp_deps_add_probe(d, path) < 0)
            hku_rd_fail(&r, HKU_RD_NOMEM);
        free(path);
    }
    int err = get_end(&r);
    if (err)
        hkp_deps_free(d);
    return err;
}

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
 * The payloads (ptx/build.c), little-endian u64s and strings as u64 length
 * + bytes (no NUL inside):
 *   artifact  u64 "HKTA1"  u64 format  u64 size  image[size]
 *             u64 n  lowered name * n   u64 n  dependency * n   str log
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

#define ENTRY_MAGIC    "HKCACHE2"
#define ARTIFACT_MAGIC 0x3141544b48ull /* "HKTA1" */
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

/* ---- writing -------------------------------------------------------------- */

/* A growable buffer; failures are sticky. */
typedef struct wbuf {
    unsigned char *p;
    size_t n, cap;
    int err;
} wbuf;

static void w_bytes(wbuf *w, const void *p, size_t n) {
    if (w->err)
        return;
    if (w->n + n > w->cap) {
        size_t ncap = w->cap ? w->cap : 256;
        while (ncap < w->n + n)
            ncap *= 2;
        unsigned char *np = realloc(w->p, ncap);
        if (!np) {
            w->err = 1;
            return;
        }
        w->p = np;
        w->cap = ncap;
    }
    if (n)
        memcpy(w->p + w->n, p, n);
    w->n += n;
}

static void w_u64(wbuf *w, uint64_t v) {
    unsigned char b[8];
    put_u64(b, v);
    w_bytes(w, b, 8);
}

static void w_str(wbuf *w, const char *s) {
    size_t n = s ? strlen(s) : 0;
    w_u64(w, n);
    w_bytes(w, s, n);
}

static void w_strv(wbuf *w, char *const *v, int n) {
    w_u64(w, (uint64_t)n);
    for (int i = 0; i < n; i++)
        w_str(w, v[i]);
}

static int w_done(wbuf *w, void **out, size_t *n) {
    if (w->err) {
        free(w->p);
        return HK_ERR_NOMEM;
    }
    *out = w->p;
    *n = w->n;
    return 0;
}

/* ---- reading -------------------------------------------------------------- */

/* A bounds-checked reader: bad is set at the first thing out of bounds or
 * malformed, and everything read after that is empty. */
typedef struct rbuf {
    const unsigned char *p;
    size_t n, i;
    int bad, nomem;
} rbuf;

static uint64_t r_u64(rbuf *r) {
    if (r->bad || r->n - r->i < 8) {
        r->bad = 1;
        return 0;
    }
    uint64_t v = hkp_rd64(r->p + r->i);
    r->i += 8;
    return v;
}

/* A string of at most max bytes with no NUL in it (it becomes a C string);
 * NULL when bad. */
static char *r_str(rbuf *r, uint64_t max) {
    uint64_t n = r_u64(r);
    if (r->bad || n > max || n > r->n - r->i || memchr(r->p + r->i, 0, (size_t)n)) {
        r->bad = 1;
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        r->bad = r->nomem = 1;
        return NULL;
    }
    memcpy(s, r->p + r->i, (size_t)n);
    s[n] = '\0';
    r->i += (size_t)n;
    return s;
}

/* A count of strings, then the strings, into *out (*n of them so far, for
 * the caller to free on failure). Each takes at least 8 bytes, so a count
 * the rest of the input cannot hold is refused before the allocation. */
static void r_strv(rbuf *r, char ***out, int *n) {
    uint64_t cnt = r_u64(r);
    if (r->bad || cnt > MAX_STRINGS || cnt > (r->n - r->i) / 8) {
        r->bad = 1;
        return;
    }
    if (!cnt)
        return;
    if (!(*out = calloc((size_t)cnt, sizeof **out))) {
        r->bad = r->nomem = 1;
        return;
    }
    for (uint64_t i = 0; i < cnt && !r->bad; i++)
        if (((*out)[i] = r_str(r, MAX_STR)))
            *n = (int)i + 1;
}

static int r_end(const rbuf *r) {
    return r->nomem ? HK_ERR_NOMEM : r->bad || r->i != r->n ? HK_ERR_FORMAT : 0;
}

/* ---- artifacts ------------------------------------------------------------ */

void hkp_artifact_free(hkp_artifact *a) {
    if (!a)
        return;
    free(a->image);
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

int hkp_artifact_format(const hkp_artifact *a, void **out, size_t *n) {
    wbuf w = {0};
    w_u64(&w, ARTIFACT_MAGIC);
    w_u64(&w, (uint64_t)a->format);
    w_u64(&w, a->size);
    w_bytes(&w, a->image, a->size);
    w_strv(&w, a->lowered_names, a->nlowered);
    w_strv(&w, a->deps, a->ndeps);
    w_str(&w, a->log);
    return w_done(&w, out, n);
}

int hkp_artifact_parse(const void *data, size_t n, hkp_artifact *a) {
    rbuf r = {.p = data, .n = n};
    memset(a, 0, sizeof *a);
    if (r_u64(&r) != ARTIFACT_MAGIC)
        return HK_ERR_FORMAT;
    uint64_t fmt = r_u64(&r), isz = r_u64(&r);
    if (r.bad || (fmt != HK_FORMAT_PTX && fmt != HK_FORMAT_CUBIN && fmt != HK_FORMAT_FATBIN) ||
        isz == 0 || isz > r.n - r.i)
        return HK_ERR_FORMAT;
    a->format = (hk_format)fmt;
    if (!(a->image = malloc((size_t)isz)))
        return HK_ERR_NOMEM;
    memcpy(a->image, r.p + r.i, (size_t)isz);
    a->size = (size_t)isz;
    r.i += (size_t)isz;
    r_strv(&r, &a->lowered_names, &a->nlowered);
    r_strv(&r, &a->deps, &a->ndeps);
    a->log = r_str(&r, SIZE_MAX);
    int err = r_end(&r);
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
    wbuf w = {0};
    w_u64(&w, MANIFEST_MAGIC);
    w_u64(&w, (uint64_t)d->n);
    for (int i = 0; i < d->n; i++) {
        w_u64(&w, d->mem[i]);
        w_str(&w, d->paths[i]);
        w_bytes(&w, d->hash[i], HKP_KEY_BYTES);
    }
    w_strv(&w, d->probes, d->nprobes);
    return w_done(&w, out, n);
}

int hkp_manifest_parse(const void *data, size_t n, hkp_deps *d) {
    rbuf r = {.p = data, .n = n};
    memset(d, 0, sizeof *d);
    if (r_u64(&r) != MANIFEST_MAGIC)
        return HK_ERR_FORMAT;
    /* A dependency takes at least 8 + 8 + 32 bytes. */
    uint64_t cnt = r_u64(&r);
    if (r.bad || cnt > HKP_MAX_DEPS || cnt > (r.n - r.i) / 48)
        return HK_ERR_FORMAT;
    for (uint64_t i = 0; i < cnt && !r.bad; i++) {
        uint64_t mem = r_u64(&r);
        char *path = r_str(&r, MAX_STR);
        if (!path || mem > 1 || !path[0] || r.n - r.i < HKP_KEY_BYTES) {
            r.bad = 1;
        } else if (hkp_deps_add(d, path, r.p + r.i, (int)mem) < 0) {
            r.bad = r.nomem = 1;
        } else {
            r.i += HKP_KEY_BYTES;
        }
        free(path);
    }
    uint64_t np = r_u64(&r);
    if (r.bad || np > HKP_MAX_PROBES || np > (r.n - r.i) / 8)
        r.bad = 1;
    for (uint64_t i = 0; i < np && !r.bad; i++) {
        char *path = r_str(&r, MAX_STR);
        if (!path || !path[0])
            r.bad = 1;
        else if (hkp_deps_add_probe(d, path) < 0)
            r.bad = r.nomem = 1;
        free(path);
    }
    int err = r_end(&r);
    if (err)
        hkp_deps_free(d);
    return err;
}

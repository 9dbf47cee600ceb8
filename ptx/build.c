/*
 * From any input format to a loadable image for one architecture.
 *
 * CUDA C goes through NVRTC, straight to a cubin by default. Measured with the
 * 13.0 toolkit on a 2-core machine, that and PTX followed by nvJitLink cost
 * the same (33 ms both for 3 small kernels, 264 vs 265 ms for 12 larger
 * ones; the PTX step alone is 20 and 114 ms), so the default takes the path
 * with fewer steps and copies; nvrtc_via_ptx keeps the other one available. PTX goes through
 * nvJitLink, never the driver JIT, because the driver JIT stalls every launching thread of the
 * process (see FACTS.md). Cubins and fatbins are only checked.
 *
 * The compile cache follows ccache's "direct mode": the headers a compile
 * reads are only known once it has run, so a first entry (the manifest), keyed
 * by everything known up front, lists the headers and their content hashes;
 * the artifact is keyed by all of that plus the headers' current hashes. A
 * lookup re-hashes the listed headers, so editing any of them is a miss and
 * editing an unrelated file is not. NVRTC 13.0 has no option to report the
 * headers it opened (-M/-MD/-MF are refused), so the list comes from a scan of
 * #include lines through the same search path NVRTC uses (the including
 * file's directory for "...", then each -I directory); the scan errs on the
 * side of listing too much (it does not evaluate #if), which can only cost a
 * miss. Headers are hashed before the compile and again after it; when one
 * changed meanwhile the result is returned but not cached.
 */
#include <errno.h>
#include <limits.h>
#include <nvJitLink.h>
#include <nvrtc.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ptx/ptx.h"

#define MAX_HEADER_BYTES  (64u << 20)
#define MAX_DEPS          4096
#define MAX_INCLUDE_DEPTH 64

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

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

/* Appends text to a malloc'd log (NULL-safe both ways). */
static int log_append(char **log, const char *text) {
    if (!text || !text[0])
        return 0;
    size_t old = *log ? strlen(*log) : 0, add = strlen(text);
    char *n = realloc(*log, old + add + 2);
    if (!n)
        return HK_ERR_NOMEM;
    if (old && n[old - 1] != '\n')
        n[old++] = '\n';
    memcpy(n + old, text, add + 1);
    *log = n;
    return 0;
}

/* The first line of a log that mentions an error, for the one-line reason. */
static void first_error_line(const char *log, char *buf, size_t n) {
    if (!buf || !n)
        return;
    buf[0] = '\0';
    if (!log)
        return;
    const char *hit = strstr(log, "error");
    if (!hit)
        hit = log;
    const char *start = hit;
    while (start > log && start[-1] != '\n')
        start--;
    size_t len = strcspn(start, "\n");
    snprintf(buf, n, "%.*s", (int)len, start);
}

/* ---- dependencies --------------------------------------------------------- */

typedef struct dep_list {
    char **paths;
    uint8_t (*hash)[HKP_KEY_BYTES];
    int n, cap;
} dep_list;

static void deps_free(dep_list *d) {
    for (int i = 0; i < d->n; i++)
        free(d->paths[i]);
    free(d->paths);
    free(d->hash);
    memset(d, 0, sizeof *d);
}

static int deps_add(dep_list *d, const char *path, const uint8_t hash[HKP_KEY_BYTES]) {
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
        d->cap = ncap;
    }
    d->paths[d->n] = strdup(path);
    if (!d->paths[d->n])
        return HK_ERR_NOMEM;
    memcpy(d->hash[d->n], hash, HKP_KEY_BYTES);
    d->n++;
    return 0;
}

static int deps_has(const dep_list *d, const char *path) {
    for (int i = 0; i < d->n; i++)
        if (strcmp(d->paths[i], path) == 0)
            return 1;
    return 0;
}

/* Reads a whole regular file (up to MAX_HEADER_BYTES). */
static int read_file(const char *path, char **data, size_t *size) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    if (!f)
        return HK_ERR_IO;
    for (;;) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 8192;
            if (ncap > MAX_HEADER_BYTES + 1) {
                free(buf);
                fclose(f);
                return HK_ERR_TOO_LARGE;
            }
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return HK_ERR_NOMEM;
            }
            buf = nb;
            cap = ncap;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return HK_ERR_IO;
    }
    buf[n] = '\0';
    *data = buf;
    *size = n;
    return 0;
}

static int hash_file(const char *path, uint8_t out[HKP_KEY_BYTES]) {
    char *data;
    size_t n;
    int rc = read_file(path, &data, &n);
    if (rc)
        return rc;
    crypto_generichash(out, HKP_KEY_BYTES, (const unsigned char *)data, n, NULL, 0);
    free(data);
    return 0;
}

typedef struct search_path {
    const char **dirs; /* -I directories, in order */
    int n;
    const char **pre; /* --pre-include headers */
    int npre;
} search_path;

static int is_regular(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Resolves an include the way NVRTC does; returns 1 with the canonical path. */
static int resolve(const char *name, int quoted, const char *dir, const search_path *sp,
                   char out[PATH_MAX]) {
    char buf[PATH_MAX * 2];
    if (name[0] == '/')
        return is_regular(name) && realpath(name, out) != NULL;
    if (quoted && dir) {
        snprintf(buf, sizeof buf, "%s/%s", dir, name);
        if (is_regular(buf) && realpath(buf, out))
            return 1;
    }
    for (int i = 0; i < sp->n; i++) {
        snprintf(buf, sizeof buf, "%s/%s", sp->dirs[i], name);
        if (is_regular(buf) && realpath(buf, out))
            return 1;
    }
    return 0;
}

static int scan_text(const char *text, const char *dir, const search_path *sp, dep_list *d,
                     int depth);

/* Adds a resolved header and what it includes. */
static int scan_header(const char *path, const search_path *sp, dep_list *d, int depth) {
    if (deps_has(d, path))
        return 0;
    if (d->n >= MAX_DEPS || depth > MAX_INCLUDE_DEPTH)
        return 0;
    char *data;
    size_t n;
    if (read_file(path, &data, &n) != 0)
        return 0; /* unreadable: NVRTC will say so if it needs it */
    uint8_t h[HKP_KEY_BYTES];
    crypto_generichash(h, sizeof h, (const unsigned char *)data, n, NULL, 0);
    int rc = deps_add(d, path, h);
    if (!rc) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *(slash == dir ? slash + 1 : slash) = '\0';
        rc = scan_text(data, dir, sp, d, depth + 1);
    }
    free(data);
    return rc;
}

/* Finds "#include" lines (a superset of what the preprocessor follows). */
static int scan_text(const char *text, const char *dir, const search_path *sp, dep_list *d,
                     int depth) {
    const char *p = text;
    while (*p) {
        const char *line = p;
        const char *eol = strchr(p, '\n');
        p = eol ? eol + 1 : p + strlen(p);
        const char *q = line;
        while (q < p && (*q == ' ' || *q == '\t'))
            q++;
        if (q >= p || *q != '#')
            continue;
        q++;
        while (q < p && (*q == ' ' || *q == '\t'))
            q++;
        if ((size_t)(p - q) < 7 || strncmp(q, "include", 7) != 0)
            continue;
        q += 7;
        if (q < p && strncmp(q, "_next", 5) == 0)
            q += 5;
        while (q < p && (*q == ' ' || *q == '\t'))
            q++;
        if (q >= p || (*q != '"' && *q != '<'))
            continue;
        char close = *q == '"' ? '"' : '>';
        int quoted = *q == '"';
        const char *s = ++q;
        while (q < p && *q != close && *q != '\n')
            q++;
        if (q >= p || *q != close || q == s || q - s >= PATH_MAX)
            continue;
        char name[PATH_MAX];
        memcpy(name, s, (size_t)(q - s));
        name[q - s] = '\0';
        char path[PATH_MAX];
        if (resolve(name, quoted, dir, sp, path)) {
            int rc = scan_header(path, sp, d, depth);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* Reads -I / --include-path / --pre-include / -include from the options. */
static int parse_search_path(const hkp_build_opts *o, search_path *sp) {
    memset(sp, 0, sizeof *sp);
    if (o->nnvrtc_options <= 0)
        return 0;
    sp->dirs = calloc((size_t)o->nnvrtc_options, sizeof *sp->dirs);
    sp->pre = calloc((size_t)o->nnvrtc_options, sizeof *sp->pre);
    if (!sp->dirs || !sp->pre)
        return HK_ERR_NOMEM;
    for (int i = 0; i < o->nnvrtc_options; i++) {
        const char *a = o->nvrtc_options[i];
        const char *next = i + 1 < o->nnvrtc_options ? o->nvrtc_options[i + 1] : NULL;
        if (!a)
            continue;
        if (!strcmp(a, "-I") || !strcmp(a, "--include-path")) {
            if (next)
                sp->dirs[sp->n++] = next, i++;
        } else if (!strncmp(a, "--include-path=", 15)) {
            sp->dirs[sp->n++] = a + 15;
        } else if (!strncmp(a, "-I", 2)) {
            sp->dirs[sp->n++] = a + 2 + (a[2] == '=');
        } else if (!strcmp(a, "-include") || !strcmp(a, "--pre-include")) {
            if (next)
                sp->pre[sp->npre++] = next, i++;
        } else if (!strncmp(a, "--pre-include=", 14)) {
            sp->pre[sp->npre++] = a + 14;
        }
    }
    return 0;
}

static void search_path_free(search_path *sp) {
    free(sp->dirs);
    free(sp->pre);
}

/* The directory NVRTC resolves the main file's quoted includes against. */
static void source_dir(const char *source_name, char *buf, size_t n) {
    snprintf(buf, n, "%s", source_name);
    char *slash = strrchr(buf, '/');
    if (!slash)
        snprintf(buf, n, ".");
    else
        *(slash == buf ? slash + 1 : slash) = '\0';
}

static int scan_deps(const char *src, const hkp_build_opts *o, const char *source_name,
                     dep_list *d) {
    search_path sp;
    char dir[PATH_MAX];
    int rc = parse_search_path(o, &sp);
    if (rc)
        goto out;
    source_dir(source_name, dir, sizeof dir);
    for (int i = 0; i < sp.npre && !rc; i++) {
        char path[PATH_MAX];
        if (resolve(sp.pre[i], 1, dir, &sp, path))
            rc = scan_header(path, &sp, d, 0);
    }
    if (!rc)
        rc = scan_text(src, dir, &sp, d, 0);
out:
    search_path_free(&sp);
    return rc;
}

/* 1 when every listed header still has the hash it was listed with. */
static int deps_unchanged(const dep_list *d) {
    for (int i = 0; i < d->n; i++) {
        uint8_t h[HKP_KEY_BYTES];
        if (hash_file(d->paths[i], h) != 0 || memcmp(h, d->hash[i], sizeof h) != 0)
            return 0;
    }
    return 1;
}

/* ---- cache keys and entries ---------------------------------------------- */

static void h_bytes(crypto_generichash_state *st, const void *p, size_t n) {
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)n >> (8 * i));
    crypto_generichash_update(st, len, sizeof len);
    if (n)
        crypto_generichash_update(st, p, n);
}

static void h_str(crypto_generichash_state *st, const char *s) {
    h_bytes(st, s ? s : "", s ? strlen(s) + 1 : 0);
}

static void h_int(crypto_generichash_state *st, long long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    h_str(st, buf);
}

/* Everything known before compiling that changes the output. */
static void key_context(crypto_generichash_state *st, const char *kind, const void *data,
                        size_t size, hk_format fmt, const hkp_build_opts *o,
                        const char *source_name) {
    int rmaj = 0, rmin = 0;
    unsigned jmaj = 0, jmin = 0;
    char cwd[PATH_MAX];
    crypto_generichash_init(st, NULL, 0, HKP_KEY_BYTES);
    h_str(st, "hotkern-build-1");
    h_str(st, kind);
    nvrtcVersion(&rmaj, &rmin);
    nvJitLinkVersion(&jmaj, &jmin);
    h_int(st, rmaj);
    h_int(st, rmin);
    h_int(st, jmaj);
    h_int(st, jmin);
    h_int(st, fmt);
    h_int(st, o->arch);
    h_int(st, o->ptx_to_cubin);
    h_int(st, o->opt_level);
    h_int(st, o->nvrtc_via_ptx);
    h_int(st, o->nnvrtc_options);
    for (int i = 0; i < o->nnvrtc_options; i++)
        h_str(st, o->nvrtc_options[i]);
    h_int(st, o->nname_expressions);
    for (int i = 0; i < o->nname_expressions; i++)
        h_str(st, o->name_expressions[i]);
    h_str(st, source_name);
    /* Relative -I paths and source names resolve against the cwd. */
    h_str(st, getcwd(cwd, sizeof cwd) ? cwd : "");
    h_bytes(st, data, size);
}

static void artifact_key(const crypto_generichash_state *ctx, const dep_list *d,
                         uint8_t key[HKP_KEY_BYTES]) {
    crypto_generichash_state st = *ctx;
    h_int(&st, d->n);
    for (int i = 0; i < d->n; i++) {
        h_str(&st, d->paths[i]);
        h_bytes(&st, d->hash[i], HKP_KEY_BYTES);
    }
    crypto_generichash_final(&st, key, HKP_KEY_BYTES);
}

/* A little-endian serializer for entries; failures are sticky. */
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
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    w_bytes(w, b, 8);
}

static void w_str(wbuf *w, const char *s) {
    size_t n = s ? strlen(s) : 0;
    w_u64(w, n);
    w_bytes(w, s, n);
}

typedef struct rbuf {
    const unsigned char *p;
    size_t n, i;
    int err;
} rbuf;

static uint64_t r_u64(rbuf *r) {
    if (r->err || r->n - r->i < 8) {
        r->err = 1;
        return 0;
    }
    uint64_t v = hkp_rd64(r->p + r->i);
    r->i += 8;
    return v;
}

static char *r_str(rbuf *r) {
    uint64_t n = r_u64(r);
    if (r->err || n > r->n - r->i) {
        r->err = 1;
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        r->err = 1;
        return NULL;
    }
    memcpy(s, r->p + r->i, (size_t)n);
    s[n] = '\0';
    r->i += (size_t)n;
    return s;
}

#define ARTIFACT_MAGIC 0x3141544b48ull /* "HKTA1" */
#define MANIFEST_MAGIC 0x314d4b48ull   /* "HKM1" */

static int artifact_store(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const hkp_artifact *a) {
    wbuf w = {0};
    w_u64(&w, ARTIFACT_MAGIC);
    w_u64(&w, (uint64_t)a->format);
    w_u64(&w, a->size);
    w_bytes(&w, a->image, a->size);
    w_u64(&w, (uint64_t)a->nlowered);
    for (int i = 0; i < a->nlowered; i++)
        w_str(&w, a->lowered_names[i]);
    w_u64(&w, (uint64_t)a->ndeps);
    for (int i = 0; i < a->ndeps; i++)
        w_str(&w, a->deps[i]);
    w_str(&w, a->log);
    int rc = w.err ? HK_ERR_NOMEM : hkp_cache_put(c, key, w.p, w.n);
    free(w.p);
    return rc;
}

/* Fills a from a cached entry; any inconsistency is a miss. */
static int artifact_load(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], hkp_artifact *a) {
    void *data;
    size_t size;
    if (hkp_cache_get(c, key, &data, &size) != 0)
        return HK_ERR_NOT_FOUND;
    rbuf r = {.p = data, .n = size};
    int rc = HK_ERR_NOT_FOUND;
    if (r_u64(&r) != ARTIFACT_MAGIC)
        goto out;
    a->format = (hk_format)r_u64(&r);
    uint64_t isz = r_u64(&r);
    if (r.err || isz > size - r.i || isz == 0)
        goto out;
    a->image = malloc((size_t)isz);
    if (!a->image)
        goto out;
    memcpy(a->image, r.p + r.i, (size_t)isz);
    a->size = (size_t)isz;
    r.i += (size_t)isz;
    uint64_t nl = r_u64(&r);
    if (r.err || nl > size / 8)
        goto out;
    a->lowered_names = calloc((size_t)nl + 1, sizeof(char *));
    if (!a->lowered_names)
        goto out;
    for (uint64_t i = 0; i < nl && !r.err; i++) {
        a->lowered_names[i] = r_str(&r);
        a->nlowered = (int)i + (a->lowered_names[i] != NULL);
    }
    uint64_t nd = r_u64(&r);
    if (r.err || nd > size / 8)
        goto out;
    a->deps = calloc((size_t)nd + 1, sizeof(char *));
    if (!a->deps)
        goto out;
    for (uint64_t i = 0; i < nd && !r.err; i++) {
        a->deps[i] = r_str(&r);
        a->ndeps = (int)i + (a->deps[i] != NULL);
    }
    char *log = r_str(&r);
    if (r.err || r.i != r.n) {
        free(log);
        goto out;
    }
    if (log && !log[0]) {
        free(log);
        log = NULL;
    }
    a->log = log;
    rc = 0;
out:
    free(data);
    return rc;
}

static int manifest_store(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const dep_list *d) {
    wbuf w = {0};
    w_u64(&w, MANIFEST_MAGIC);
    w_u64(&w, (uint64_t)d->n);
    for (int i = 0; i < d->n; i++) {
        w_str(&w, d->paths[i]);
        w_bytes(&w, d->hash[i], HKP_KEY_BYTES);
    }
    int rc = w.err ? HK_ERR_NOMEM : hkp_cache_put(c, key, w.p, w.n);
    free(w.p);
    return rc;
}

/* Reads the manifest's header list and re-hashes each header now. */
static int manifest_load(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], dep_list *d) {
    void *data;
    size_t size;
    if (hkp_cache_get(c, key, &data, &size) != 0)
        return HK_ERR_NOT_FOUND;
    rbuf r = {.p = data, .n = size};
    int rc = HK_ERR_NOT_FOUND;
    if (r_u64(&r) != MANIFEST_MAGIC)
        goto out;
    uint64_t n = r_u64(&r);
    if (r.err || n > MAX_DEPS)
        goto out;
    for (uint64_t i = 0; i < n; i++) {
        char *path = r_str(&r);
        if (!path || r.n - r.i < HKP_KEY_BYTES) {
            free(path);
            goto out;
        }
        r.i += HKP_KEY_BYTES;
        uint8_t h[HKP_KEY_BYTES];
        /* A header that vanished cannot match any stored artifact. */
        int hr = hash_file(path, h);
        int ar = hr ? HK_ERR_NOT_FOUND : deps_add(d, path, h);
        free(path);
        if (ar)
            goto out;
    }
    rc = r.i == r.n ? 0 : HK_ERR_NOT_FOUND;
out:
    free(data);
    if (rc)
        deps_free(d);
    return rc;
}

/* ---- NVRTC and nvJitLink --------------------------------------------------- */

static int nvrtc_log(nvrtcProgram prog, char **log) {
    size_t n = 0;
    if (nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n <= 1)
        return 0;
    char *buf = malloc(n);
    if (!buf)
        return HK_ERR_NOMEM;
    if (nvrtcGetProgramLog(prog, buf) == NVRTC_SUCCESS)
        log_append(log, buf);
    free(buf);
    return 0;
}

/* Compiles CUDA C to a cubin (want_cubin) or PTX for opts->arch. */
static int nvrtc_build(const char *src, const hkp_build_opts *o, const char *source_name,
                       int want_cubin, hkp_artifact *a, char *why, size_t why_size) {
    nvrtcProgram prog = NULL;
    const char **argv = NULL;
    char archopt[64], ptxasopt[64];
    int rc = 0, argc = 0;
    nvrtcResult r;

    r = nvrtcCreateProgram(&prog, src, source_name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) {
        hkp_why(why, why_size, "NVRTC: %s", nvrtcGetErrorString(r));
        return r == NVRTC_ERROR_OUT_OF_MEMORY ? HK_ERR_NOMEM : HK_ERR_COMPILE;
    }
    argv = calloc((size_t)o->nnvrtc_options + 3, sizeof *argv);
    if (!argv) {
        rc = HK_ERR_NOMEM;
        goto out;
    }
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s_%d%s", want_cubin ? "sm" : "compute",
             HKP_ARCH_NUM(o->arch), (o->arch & HKP_ARCH_SPECIFIC) ? "a" : "");
    argv[argc++] = archopt;
    if (want_cubin) {
        snprintf(ptxasopt, sizeof ptxasopt, "--ptxas-options=-O%d", o->opt_level > 0 ? 3 : 0);
        argv[argc++] = ptxasopt;
    }
    for (int i = 0; i < o->nnvrtc_options; i++)
        if (o->nvrtc_options[i])
            argv[argc++] = o->nvrtc_options[i];
    for (int i = 0; i < o->nname_expressions; i++) {
        r = nvrtcAddNameExpression(prog, o->name_expressions[i]);
        if (r != NVRTC_SUCCESS) {
            hkp_why(why, why_size, "NVRTC: name expression '%s': %s", o->name_expressions[i],
                    nvrtcGetErrorString(r));
            rc = HK_ERR_COMPILE;
            goto out;
        }
    }
    r = nvrtcCompileProgram(prog, argc, argv);
    rc = nvrtc_log(prog, &a->log);
    if (rc)
        goto out;
    if (r != NVRTC_SUCCESS) {
        char line[400];
        first_error_line(a->log, line, sizeof line);
        hkp_why(why, why_size, "NVRTC: %s%s%s", nvrtcGetErrorString(r), line[0] ? ": " : "", line);
        rc = r == NVRTC_ERROR_OUT_OF_MEMORY ? HK_ERR_NOMEM : HK_ERR_COMPILE;
        goto out;
    }
    size_t n = 0;
    r = want_cubin ? nvrtcGetCUBINSize(prog, &n) : nvrtcGetPTXSize(prog, &n);
    if (r != NVRTC_SUCCESS || n == 0) {
        hkp_why(why, why_size, "NVRTC: no %s produced", want_cubin ? "cubin" : "PTX");
        rc = HK_ERR_COMPILE;
        goto out;
    }
    a->image = malloc(n);
    if (!a->image) {
        rc = HK_ERR_NOMEM;
        goto out;
    }
    r = want_cubin ? nvrtcGetCUBIN(prog, a->image) : nvrtcGetPTX(prog, a->image);
    if (r != NVRTC_SUCCESS) {
        hkp_why(why, why_size, "NVRTC: %s", nvrtcGetErrorString(r));
        rc = HK_ERR_COMPILE;
        goto out;
    }
    a->size = n;
    a->format = want_cubin ? HK_FORMAT_CUBIN : HK_FORMAT_PTX;
    if (o->nname_expressions > 0) {
        a->lowered_names = calloc((size_t)o->nname_expressions, sizeof(char *));
        if (!a->lowered_names) {
            rc = HK_ERR_NOMEM;
            goto out;
        }
        for (int i = 0; i < o->nname_expressions; i++) {
            const char *low = NULL;
            r = nvrtcGetLoweredName(prog, o->name_expressions[i], &low);
            a->lowered_names[i] = strdup(r == NVRTC_SUCCESS && low ? low : "");
            if (!a->lowered_names[i]) {
                rc = HK_ERR_NOMEM;
                goto out;
            }
            a->nlowered = i + 1;
        }
    }
out:
    free(argv);
    nvrtcDestroyProgram(&prog);
    return rc;
}

static int jitlink_log(nvJitLinkHandle h, int errors, char **log) {
    size_t n = 0;
    nvJitLinkResult r = errors ? nvJitLinkGetErrorLogSize(h, &n) : nvJitLinkGetInfoLogSize(h, &n);
    if (r != NVJITLINK_SUCCESS || n <= 1)
        return 0;
    char *buf = malloc(n);
    if (!buf)
        return HK_ERR_NOMEM;
    r = errors ? nvJitLinkGetErrorLog(h, buf) : nvJitLinkGetInfoLog(h, buf);
    if (r == NVJITLINK_SUCCESS)
        log_append(log, buf);
    free(buf);
    return 0;
}

/* PTX (size bytes, NUL-terminated or not) to a cubin for `arch` (which may
 * carry HKP_ARCH_SPECIFIC). Replaces a->image with the cubin. */
static int jitlink_ptx(const void *ptx, size_t size, int arch, int opt_level, const char *name,
                       hkp_artifact *a, char *why, size_t why_size) {
    nvJitLinkHandle h = NULL;
    char archopt[64], optopt[16];
    const char *lopts[2] = {archopt, optopt};
    void *cubin = NULL;
    char *text = NULL;
    int rc = 0;
    nvJitLinkResult r;

    snprintf(archopt, sizeof archopt, "-arch=sm_%d%s", HKP_ARCH_NUM(arch),
             (arch & HKP_ARCH_SPECIFIC) ? "a" : "");
    snprintf(optopt, sizeof optopt, "-O%d", opt_level > 0 ? 3 : 0);
    r = nvJitLinkCreate(&h, 2, lopts);
    if (r != NVJITLINK_SUCCESS) {
        hkp_why(why, why_size, "nvJitLink: cannot create a link (error %d)", (int)r);
        return HK_ERR_COMPILE;
    }
    /* nvJitLink reads PTX as a C string, whatever size says. */
    if (size == 0 || ((const char *)ptx)[size - 1] != '\0') {
        text = malloc(size + 1);
        if (!text) {
            rc = HK_ERR_NOMEM;
            goto out;
        }
        memcpy(text, ptx, size);
        text[size++] = '\0';
        ptx = text;
    }
    r = nvJitLinkAddData(h, NVJITLINK_INPUT_PTX, ptx, size, name);
    if (r == NVJITLINK_SUCCESS)
        r = nvJitLinkComplete(h);
    rc = jitlink_log(h, r != NVJITLINK_SUCCESS, &a->log);
    if (rc)
        goto out;
    if (r != NVJITLINK_SUCCESS) {
        char line[400];
        first_error_line(a->log, line, sizeof line);
        hkp_why(why, why_size, "nvJitLink: %s", line[0] ? line : "link failed");
        rc = HK_ERR_COMPILE;
        goto out;
    }
    size_t n = 0;
    r = nvJitLinkGetLinkedCubinSize(h, &n);
    if (r != NVJITLINK_SUCCESS || n == 0) {
        hkp_why(why, why_size, "nvJitLink: no cubin produced");
        rc = HK_ERR_COMPILE;
        goto out;
    }
    cubin = malloc(n);
    if (!cubin) {
        rc = HK_ERR_NOMEM;
        goto out;
    }
    if (nvJitLinkGetLinkedCubin(h, cubin) != NVJITLINK_SUCCESS) {
        hkp_why(why, why_size, "nvJitLink: cannot read the cubin");
        rc = HK_ERR_COMPILE;
        goto out;
    }
    free(a->image);
    a->image = cubin;
    a->size = n;
    a->format = HK_FORMAT_CUBIN;
    cubin = NULL;
out:
    free(text);
    free(cubin);
    nvJitLinkDestroy(&h);
    return rc;
}

/* ---- the build ------------------------------------------------------------ */

static int arch_refusal(const hkp_meta *m, int arch, char *why, size_t why_size) {
    char a[16], d[16];
    hkp_arch_name(arch & ~(HKP_ARCH_SPECIFIC | HKP_ARCH_FAMILY), d, sizeof d);
    if (m->format == HK_FORMAT_FATBIN) {
        char list[200] = "";
        size_t used = 0;
        for (int i = 0; i < m->narchs && used < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                     hkp_arch_name(m->archs[i], a, sizeof a));
        for (int i = 0; i < m->nptx_archs && used < sizeof list; i++) {
            hkp_arch_name(m->ptx_archs[i], a, sizeof a);
            used += (size_t)snprintf(list + used, sizeof list - used, "%scompute_%s",
                                     used ? ", " : "", a + 3);
        }
        hkp_why(why, why_size, "fatbin has %s, device is %s", list[0] ? list : "no code", d);
    } else {
        hkp_why(why, why_size, "%s is %s, device is %s",
                m->format == HK_FORMAT_PTX ? "PTX" : "cubin", hkp_arch_name(m->arch, a, sizeof a),
                d);
    }
    return HK_ERR_ARCH;
}

/* Copies data; PTX gets a terminating NUL that size counts. */
static int copy_image(const void *data, size_t size, hk_format fmt, hkp_artifact *a) {
    int add_nul = fmt == HK_FORMAT_PTX && (size == 0 || ((const char *)data)[size - 1] != '\0');
    a->image = malloc(size + (size_t)add_nul);
    if (!a->image)
        return HK_ERR_NOMEM;
    memcpy(a->image, data, size);
    if (add_nul)
        ((char *)a->image)[size] = '\0';
    a->size = size + (size_t)add_nul;
    a->format = fmt;
    return 0;
}

/* Builds without the cache. */
static int build_fresh(const void *data, size_t size, hk_format fmt, const hkp_build_opts *o,
                       const char *source_name, hkp_artifact *a, char *why, size_t why_size) {
    int rc = 0;
    if (fmt == HK_FORMAT_CUDA_C) {
        /* data is NUL-terminated here (hkp_build made it so). */
        int direct = o->ptx_to_cubin && !o->nvrtc_via_ptx;
        rc = nvrtc_build(data, o, source_name, direct, a, why, why_size);
        if (!rc && o->ptx_to_cubin && !direct)
            rc = jitlink_ptx(a->image, a->size, o->arch, o->opt_level, source_name, a, why,
                             why_size);
        return rc;
    }
    /* PTX. The arch check comes first when the PTX parses, for a clear
     * reason; a PTX the parser refuses goes to nvJitLink, whose log names
     * the line. */
    hkp_meta pm;
    int link_arch = o->arch;
    if (hkp_meta_read(data, size, HK_FORMAT_PTX, &pm, NULL, 0) == 0) {
        if (!hkp_meta_runs_on(&pm, o->arch)) {
            rc = arch_refusal(&pm, o->arch, why, why_size);
            hkp_meta_free(&pm);
            return rc;
        }
        if (pm.arch & HKP_ARCH_SPECIFIC)
            link_arch |= HKP_ARCH_SPECIFIC;
        hkp_meta_free(&pm);
    }
    if (!o->ptx_to_cubin)
        return copy_image(data, size, HK_FORMAT_PTX, a);
    return jitlink_ptx(data, size, link_arch, o->opt_level, source_name, a, why, why_size);
}

static int take_deps(hkp_artifact *a, dep_list *d) {
    if (!d->n)
        return 0;
    a->deps = calloc((size_t)d->n, sizeof(char *));
    if (!a->deps)
        return HK_ERR_NOMEM;
    for (int i = 0; i < d->n; i++) {
        a->deps[i] = strdup(d->paths[i]);
        if (!a->deps[i])
            return HK_ERR_NOMEM;
        a->ndeps = i + 1;
    }
    return 0;
}

int hkp_build(const void *data, size_t size, hk_format fmt, const hkp_build_opts *opts,
              hkp_artifact *out, char *why, size_t why_size) {
    double t0 = now_ms();
    dep_list deps = {0};
    crypto_generichash_state ctx;
    uint8_t mkey[HKP_KEY_BYTES], akey[HKP_KEY_BYTES];
    int rc, cacheable = 0;
    char mwhy[256];
    char *src = NULL;

    if (why && why_size)
        why[0] = '\0';
    if (!out)
        return HK_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if (!opts || HKP_ARCH_NUM(opts->arch) <= 0 || (!data && size) || opts->nnvrtc_options < 0 ||
        opts->nname_expressions < 0 || (opts->nnvrtc_options && !opts->nvrtc_options) ||
        (opts->nname_expressions && !opts->name_expressions)) {
        hkp_why(why, why_size, "invalid build options");
        return HK_ERR_INVALID;
    }
    if (fmt == HK_FORMAT_AUTO) {
        rc = hkp_detect(data, size, &fmt, why, why_size);
        if (rc)
            goto out;
    }
    const char *source_name = opts->source_name && opts->source_name[0] ? opts->source_name
                              : fmt == HK_FORMAT_PTX                    ? "input.ptx"
                                                                        : "input.cu";

    if (fmt == HK_FORMAT_CUBIN || fmt == HK_FORMAT_FATBIN) {
        rc = hkp_meta_read(data, size, fmt, &out->meta, why, why_size);
        if (rc)
            goto out;
        if (!hkp_meta_runs_on(&out->meta, opts->arch)) {
            rc = arch_refusal(&out->meta, opts->arch, why, why_size);
            goto out;
        }
        rc = copy_image(data, size, fmt, out);
        goto out;
    }
    if (fmt != HK_FORMAT_CUDA_C && fmt != HK_FORMAT_PTX) {
        rc = HK_ERR_INVALID;
        goto out;
    }

    if (opts->cache && sodium_init() >= 0) {
        cacheable = 1;
        key_context(&ctx, "ctx", data, size, fmt, opts, source_name);
        if (fmt == HK_FORMAT_CUDA_C) {
            crypto_generichash_state m = ctx;
            h_str(&m, "manifest");
            crypto_generichash_final(&m, mkey, sizeof mkey);
            if (manifest_load(opts->cache, mkey, &deps) == 0) {
                artifact_key(&ctx, &deps, akey);
                if (artifact_load(opts->cache, akey, out) == 0 &&
                    hkp_meta_read(out->image, out->size, out->format, &out->meta, NULL, 0) == 0) {
                    out->cache_hit = 1;
                    hkp_cache_note(opts->cache, 1);
                    rc = 0;
                    goto out;
                }
                hkp_artifact_free(out);
            }
            deps_free(&deps);
        } else {
            artifact_key(&ctx, &deps, akey);
            if (artifact_load(opts->cache, akey, out) == 0 &&
                hkp_meta_read(out->image, out->size, out->format, &out->meta, NULL, 0) == 0) {
                out->cache_hit = 1;
                hkp_cache_note(opts->cache, 1);
                rc = 0;
                goto out;
            }
            hkp_artifact_free(out);
        }
        hkp_cache_note(opts->cache, 0);
    }

    if (fmt == HK_FORMAT_CUDA_C) {
        /* NVRTC and the include scan both want a C string. */
        src = malloc(size + 1);
        if (!src) {
            rc = HK_ERR_NOMEM;
            goto out;
        }
        if (size)
            memcpy(src, data, size);
        src[size] = '\0';
        rc = scan_deps(src, opts, source_name, &deps);
        if (!rc)
            rc = take_deps(out, &deps);
        if (rc)
            goto out;
    }
    rc = build_fresh(src ? src : data, size, fmt, opts, source_name, out, why, why_size);
    if (rc)
        goto out;
    rc = hkp_meta_read(out->image, out->size, out->format, &out->meta, mwhy, sizeof mwhy);
    if (rc) {
        hkp_why(why, why_size, "built image unreadable: %s", mwhy);
        goto out;
    }
    if (!hkp_meta_runs_on(&out->meta, opts->arch)) {
        rc = arch_refusal(&out->meta, opts->arch, why, why_size);
        goto out;
    }
    if (cacheable && deps_unchanged(&deps)) {
        /* A failure to cache is not a failure to build. */
        artifact_key(&ctx, &deps, akey);
        if (artifact_store(opts->cache, akey, out) == 0 && fmt == HK_FORMAT_CUDA_C)
            (void)manifest_store(opts->cache, mkey, &deps);
    }
out:
    free(src);
    deps_free(&deps);
    out->ms = now_ms() - t0;
    return rc;
}

/*
 * A build's dependencies and the compile cache's keys and entries.
 *
 * The compile cache follows ccache's "direct mode": the headers a compile
 * reads are only known once it has run, so a first entry (the manifest), keyed
 * by everything known up front, lists the headers and their content hashes;
 * the artifact is keyed by all of that plus the headers' current hashes. A
 * lookup re-hashes the listed headers, so editing any of them is a miss and
 * editing an unrelated file is not. The manifest also lists every place the
 * include search looked at and found no file (the including file's
 * directory, each -I directory before the one that had the header), and a
 * lookup checks they are still empty: a header of the same name appearing
 * earlier in the search is what NVRTC reads from then on, so it is a miss
 * too, in this process and after a restart. NVRTC 13.0 has no option to report the
 * headers it opened (-M/-MD/-MF are refused), so the list comes from a scan of
 * #include lines through the same search path NVRTC uses (the including
 * file's directory for "...", then each -I directory); the scan errs on the
 * side of listing too much (it does not evaluate #if), which can only cost a
 * miss. Headers are hashed before the compile and again after it (build.c);
 * when one changed meanwhile the result is returned but not cached.
 *
 * No state of its own: every function works on what it is given.
 */
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nvJitLink.h>
#include <nvrtc.h>

#include "ptx/build.h"
#include "util/util.h"

#define MAX_HEADER_BYTES  (64u << 20)
#define MAX_DEPS          HKP_MAX_DEPS
#define MAX_INCLUDE_DEPTH 64

/* ---- dependencies --------------------------------------------------------- */

static void deps_free(dep_list *d) {
    hkp_deps_free(d);
}

static int deps_add(dep_list *d, const char *path, const uint8_t hash[HKP_KEY_BYTES], int mem) {
    return hkp_deps_add(d, path, hash, mem);
}

static int deps_has(const dep_list *d, const char *path, int mem) {
    for (int i = 0; i < d->n; i++)
        if (d->mem[i] == (mem != 0) && strcmp(d->paths[i], path) == 0)
            return 1;
    return 0;
}

static int hash_file(const char *path, uint8_t out[HKP_KEY_BYTES]) {
    char *data;
    size_t n;
    int rc = hku_read_file(path, MAX_HEADER_BYTES, &data, &n, NULL);
    if (rc)
        return rc;
    crypto_generichash(out, HKP_KEY_BYTES, (const unsigned char *)data, n, NULL, 0);
    free(data);
    return 0;
}

static int is_regular(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int hkp_find_mem(const search_path *sp, const char *name) {
    for (int i = 0; i < sp->nmem; i++)
        if (strcmp(sp->mem[i].name, name) == 0)
            return i;
    return HK_ERR_NOT_FOUND;
}

/* Whether candidate is a file the search takes; one that is not is noted
 * in d (may be NULL) as probed and absent, since a file appearing there
 * later would be taken instead of what the search finds now. */
static int candidate(const char *path, char out[PATH_MAX], dep_list *d, int *rc) {
    if (is_regular(path) && realpath(path, out))
        return 1;
    if (d && !*rc)
        *rc = hkp_deps_add_probe(d, path);
    return 0;
}

/* Resolves an include the way NVRTC does; returns 1 with the canonical path,
 * or 2 with the index of an in-memory header in *mem (NVRTC looks at those
 * first), 0 when nothing is found, or a negative error (no memory to note
 * the search). Every place looked at before (all of them, when nothing is
 * found) is noted in d as absent. */
int hkp_resolve_include(const char *name, int quoted, const char *dir, const search_path *sp,
                        char out[PATH_MAX], int *mem, dep_list *d) {
    char buf[PATH_MAX * 2];
    int rc = 0;
    if ((*mem = hkp_find_mem(sp, name)) >= 0)
        return 2;
    if (name[0] == '/')
        return candidate(name, out, d, &rc) ? 1 : rc;
    if (quoted && dir) {
        snprintf(buf, sizeof buf, "%s/%s", dir, name);
        if (candidate(buf, out, d, &rc))
            return rc ? rc : 1;
    }
    for (int i = 0; i < sp->n; i++) {
        snprintf(buf, sizeof buf, "%s/%s", sp->dirs[i], name);
        if (candidate(buf, out, d, &rc))
            return rc ? rc : 1;
    }
    return rc;
}

static int scan_text(const char *text, const char *dir, const search_path *sp, dep_list *d,
                     int depth);

/* Adds an in-memory header and what it includes. Its own quoted includes
 * are looked for beside the main source, a superset of where NVRTC looks. */
static int scan_mem(int i, const search_path *sp, dep_list *d, int depth) {
    const hk_header *m = &sp->mem[i];
    if (deps_has(d, m->name, 1))
        return 0;
    if (d->n >= MAX_DEPS || depth > MAX_INCLUDE_DEPTH) {
        d->incomplete = 1; /* what it includes is not known: not cached */
        return 0;
    }
    uint8_t h[HKP_KEY_BYTES];
    crypto_generichash(h, sizeof h, m->data, m->size, NULL, 0);
    int rc = deps_add(d, m->name, h, 1);
    return rc ? rc : scan_text(m->data, sp->srcdir, sp, d, depth + 1);
}

/* Adds a resolved header and what it includes. The toolkit's headers are
 * covered by its fingerprint in the key, not listed (there are hundreds). */
static int scan_header(const char *path, const search_path *sp, dep_list *d, int depth) {
    if (hkp_toolkit_owns(sp->tk, path) || deps_has(d, path, 0))
        return 0;
    if (d->n >= MAX_DEPS || depth > MAX_INCLUDE_DEPTH) {
        d->incomplete = 1;
        return 0;
    }
    char *data;
    size_t n;
    if (hku_read_file(path, MAX_HEADER_BYTES, &data, &n, NULL) != 0)
        return 0; /* unreadable: NVRTC will say so if it needs it */
    uint8_t h[HKP_KEY_BYTES];
    crypto_generichash(h, sizeof h, (const unsigned char *)data, n, NULL, 0);
    int rc = deps_add(d, path, h, 0);
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
        int mem, kind = hkp_resolve_include(name, quoted, dir, sp, path, &mem, d);
        int rc = kind == 1   ? scan_header(path, sp, d, depth)
                 : kind == 2 ? scan_mem(mem, sp, d, depth)
                             : kind;
        if (rc)
            return rc;
    }
    return 0;
}

/* The directory NVRTC resolves the main file's quoted includes against. */
void hkp_source_dir(const char *source_name, char *buf, size_t n) {
    snprintf(buf, n, "%s", source_name);
    char *slash = strrchr(buf, '/');
    if (!slash)
        snprintf(buf, n, ".");
    else
        *(slash == buf ? slash + 1 : slash) = '\0';
}

/* Reads -I / --include-path / --pre-include / -include from the options,
 * and adds the toolkit's directories and the in-memory headers; the
 * source's directory is each build's (srcdir is left empty). */
int hkp_parse_search_path(const hkp_build_opts *o, const hk_header *mem, int nmem,
                          search_path *sp) {
    memset(sp, 0, sizeof *sp);
    sp->tk = hkp_toolkit_get();
    sp->mem = mem;
    sp->nmem = nmem;
    sp->dirs = calloc((size_t)o->nnvrtc_options + 2, sizeof *sp->dirs);
    sp->pre = calloc((size_t)o->nnvrtc_options + 1, sizeof *sp->pre);
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
    /* The toolkit's directories come after the user's, as on NVRTC's
     * command line (hkp_nvrtc_build). */
    if (!o->no_toolkit && sp->tk->include[0])
        sp->dirs[sp->n++] = sp->tk->include;
    if (!o->no_toolkit && sp->tk->cccl[0])
        sp->dirs[sp->n++] = sp->tk->cccl;
    return 0;
}

void hkp_search_path_free(search_path *sp) {
    free(sp->dirs);
    free(sp->pre);
}

int hkp_scan_deps(const char *src, const search_path *sp, dep_list *d) {
    int rc = 0;
    for (int i = 0; i < sp->npre && !rc; i++) {
        char path[PATH_MAX];
        int mem, kind = hkp_resolve_include(sp->pre[i], 1, sp->srcdir, sp, path, &mem, d);
        rc = kind == 1 ? scan_header(path, sp, d, 0) : kind == 2 ? scan_mem(mem, sp, d, 0) : kind;
    }
    if (!rc)
        rc = scan_text(src, sp->srcdir, sp, d, 0);
    hkp_deps_sort_probes(d);
    return rc;
}

/* 1 when no path the search found empty holds a file now. */
static int probes_absent(const dep_list *d) {
    for (int i = 0; i < d->nprobes; i++)
        if (is_regular(d->probes[i]))
            return 0;
    return 1;
}

/* 1 when every listed header file still has the hash it was listed with
 * (in-memory headers are the build's own copies and cannot change) and the
 * search would still find the same files. */
int hkp_deps_unchanged(const dep_list *d) {
    if (d->incomplete || !probes_absent(d))
        return 0;
    for (int i = 0; i < d->n; i++) {
        uint8_t h[HKP_KEY_BYTES];
        if (d->mem[i])
            continue;
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

/* Everything known before compiling that changes the output. For CUDA C
 * that includes the toolkit (as a whole: its fingerprint) and the names of
 * the in-memory headers, since a name can hide a file the manifest lists;
 * their contents are dependencies like files. */
void hkp_key_context(crypto_generichash_state *st, const char *kind, const void *data, size_t size,
                     hk_format fmt, const hkp_build_opts *o, const char *source_name,
                     const search_path *sp) {
    int rmaj = 0, rmin = 0;
    unsigned jmaj = 0, jmin = 0;
    char cwd[PATH_MAX];
    crypto_generichash_init(st, NULL, 0, HKP_KEY_BYTES);
    h_str(st, "hotkern-build-2");
    if (fmt == HK_FORMAT_CUDA_C) {
        h_int(st, o->no_toolkit);
        h_bytes(st, sp->tk->fingerprint, sizeof sp->tk->fingerprint);
        h_int(st, sp->n);
        for (int i = 0; i < sp->n; i++)
            h_str(st, sp->dirs[i]);
        h_int(st, sp->nmem);
        for (int i = 0; i < sp->nmem; i++)
            h_str(st, sp->mem[i].name);
    }
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
    /* Only when set, so that the keys of every other build stay as they
     * were (a cache filled before the profiles existed still hits). */
    if (o->fast_compile)
        h_str(st, "fast-compile=max");
    if (o->trap_guard) /* the entry then holds the guarded copy too */
        h_str(st, "trap-guard");
    /* nvJitLink links take the ptxas options of nvrtc_options since the
     * trap guard: an entry linked before then without them is not served. */
    link_opts lo;
    hkp_link_opts_make(&lo, o->arch, o);
    if (lo.translated && o->ptx_to_cubin && (fmt == HK_FORMAT_PTX || o->nvrtc_via_ptx))
        h_str(st, "ptxas-options-linked");
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

void hkp_artifact_key(const crypto_generichash_state *ctx, const dep_list *d,
                      uint8_t key[HKP_KEY_BYTES]) {
    crypto_generichash_state st = *ctx;
    h_int(&st, d->n);
    for (int i = 0; i < d->n; i++) {
        h_int(&st, d->mem[i]);
        h_str(&st, d->paths[i]);
        h_bytes(&st, d->hash[i], HKP_KEY_BYTES);
    }
    crypto_generichash_final(&st, key, HKP_KEY_BYTES);
}

/* The manifest's key: the context's, marked as the manifest's. */
void hkp_manifest_key(const crypto_generichash_state *ctx, uint8_t key[HKP_KEY_BYTES]) {
    crypto_generichash_state m = *ctx;
    h_str(&m, "manifest");
    crypto_generichash_final(&m, key, HKP_KEY_BYTES);
}

/* Stores a's image, lowered names, dependencies and log under key
 * (ptx/entry.c's format). */
/* Puts a formatted entry (rc and p from one of ptx/entry.c's formatters)
 * under key, and frees it. */
static int store(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], int rc, void *p, size_t n) {
    if (rc)
        return rc;
    rc = hkp_cache_put(c, key, p, n);
    free(p);
    return rc;
}

int hkp_artifact_store(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const hkp_artifact *a) {
    void *p = NULL;
    size_t n = 0;
    int rc = hkp_artifact_format(a, &p, &n);
    return store(c, key, rc, p, n);
}

/* Fills a from a cached entry; any inconsistency is a miss. */
int hkp_artifact_load(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], hkp_artifact *a) {
    void *data;
    size_t size;
    if (hkp_cache_get(c, key, &data, &size) != 0)
        return HK_ERR_NOT_FOUND;
    int rc = hkp_artifact_parse(data, size, a);
    free(data);
    return rc ? HK_ERR_NOT_FOUND : 0;
}

int hkp_manifest_store(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const dep_list *d) {
    void *p = NULL;
    size_t n = 0;
    int rc = hkp_manifest_format(d, &p, &n);
    return store(c, key, rc, p, n);
}

/* Reads the manifest: a miss when a path its search found empty holds a
 * file now (that file is what NVRTC would read); else its header list, each
 * header hashed again now (files from disk, in-memory headers from this
 * build's set), in d. */
int hkp_manifest_load(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const search_path *sp,
                      dep_list *d) {
    void *data;
    size_t size;
    if (hkp_cache_get(c, key, &data, &size) != 0)
        return HK_ERR_NOT_FOUND;
    int rc = hkp_manifest_parse(data, size, d);
    free(data);
    if (rc)
        return HK_ERR_NOT_FOUND;
    rc = probes_absent(d) ? 0 : HK_ERR_NOT_FOUND;
    for (int i = 0; i < d->n && !rc; i++) {
        /* A header that vanished cannot match any stored artifact. */
        int k = d->mem[i] ? hkp_find_mem(sp, d->paths[i]) : HK_ERR_NOT_FOUND;
        if (!d->mem[i])
            rc = hash_file(d->paths[i], d->hash[i]) ? HK_ERR_NOT_FOUND : 0;
        else if (k < 0)
            rc = HK_ERR_NOT_FOUND;
        else
            crypto_generichash(d->hash[i], HKP_KEY_BYTES, sp->mem[k].data, sp->mem[k].size, NULL,
                               0);
    }
    if (rc)
        deps_free(d);
    return rc;
}

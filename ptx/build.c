/*
 * From any input format to a loadable image for one architecture.
 *
 * CUDA C goes through NVRTC, straight to a cubin by default. Measured with the
 * 13.0 toolkit on a 2-core machine, that and PTX followed by nvJitLink cost
 * the same (33 ms both for 3 small kernels, 264 vs 265 ms for 12 larger
 * ones; the PTX step alone is 20 and 114 ms), so the default takes the path
 * with fewer steps and copies; nvrtc_via_ptx keeps the other one available, and a build that
 * makes the canary's trap guard takes it (its image and guarded copy are linked from the same
 * PTX). PTX goes through
 * nvJitLink, never the driver JIT, because the driver JIT stalls every launching thread of the
 * process: the driver compiles inside the load, which holds the lock every launch takes
 * (docs/DESIGN.md, "Under a real program's load"). Cubins and fatbins are only checked.
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
 * miss. Headers are hashed before the compile and again after it; when one
 * changed meanwhile the result is returned but not cached.
 */
#include <errno.h>
#include <limits.h>
#include <nvJitLink.h>
#include <nvrtc.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/exit.h"
#include "ptx/ptx.h"
#include "util/util.h"

#define MAX_HEADER_BYTES  (64u << 20)
#define MAX_DEPS          HKP_MAX_DEPS
#define MAX_INCLUDE_DEPTH 64

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

/* Headers a build read and the paths its include search found empty
 * (hkp_deps, ptx/ptx.h). */
typedef hkp_deps dep_list;

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

typedef struct search_path {
    const char **dirs; /* -I directories, in order, then the toolkit's */
    int n;
    const char **pre; /* --pre-include headers */
    int npre;
    const hk_header *mem; /* in-memory headers (NUL-terminated copies) */
    int nmem;
    const hkp_toolkit *tk; /* its headers are not listed as dependencies */
    char srcdir[PATH_MAX]; /* the main source's directory */
} search_path;

static int is_regular(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int find_mem(const search_path *sp, const char *name) {
    for (int i = 0; i < sp->nmem; i++)
        if (strcmp(sp->mem[i].name, name) == 0)
            return i;
    return -1;
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
static int resolve(const char *name, int quoted, const char *dir, const search_path *sp,
                   char out[PATH_MAX], int *mem, dep_list *d) {
    char buf[PATH_MAX * 2];
    int rc = 0;
    if ((*mem = find_mem(sp, name)) >= 0)
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
        int mem, kind = resolve(name, quoted, dir, sp, path, &mem, d);
        int rc = kind == 1   ? scan_header(path, sp, d, depth)
                 : kind == 2 ? scan_mem(mem, sp, d, depth)
                             : kind;
        if (rc)
            return rc;
    }
    return 0;
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

/* Reads -I / --include-path / --pre-include / -include from the options,
 * and adds the toolkit's directories and the in-memory headers; the
 * source's directory is each build's (srcdir is left empty). */
static int parse_search_path(const hkp_build_opts *o, const hk_header *mem, int nmem,
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
     * command line (nvrtc_build). */
    if (!o->no_toolkit && sp->tk->include[0])
        sp->dirs[sp->n++] = sp->tk->include;
    if (!o->no_toolkit && sp->tk->cccl[0])
        sp->dirs[sp->n++] = sp->tk->cccl;
    return 0;
}

static void search_path_free(search_path *sp) {
    free(sp->dirs);
    free(sp->pre);
}

static int scan_deps(const char *src, const search_path *sp, dep_list *d) {
    int rc = 0;
    for (int i = 0; i < sp->npre && !rc; i++) {
        char path[PATH_MAX];
        int mem, kind = resolve(sp->pre[i], 1, sp->srcdir, sp, path, &mem, d);
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
static int deps_unchanged(const dep_list *d) {
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

/* nvJitLink's options for a link of o's PTX: the arch, the optimisation
 * level (or the development profile's -Ofc=max), and what the caller's
 * NVRTC options ask of ptxas, translated (--maxrregcount, --ptxas-options
 * or -Xptxas, -G, -lineinfo, a fast-compile level of their own), so that a
 * cubin linked from NVRTC's PTX is built as NVRTC would build it. The
 * strings point into o's options and the struct's own buffers. Options
 * that reach ptxas in a way nvJitLink cannot be told (relocatable or
 * link-time code, device optimisation levels: unlinkable_option) are left
 * out, as they always were from these links. */
#define MAX_LINK_OPTS 16
typedef struct link_opts {
    const char *argv[MAX_LINK_OPTS];
    int argc;
    char arch[32], opt[16], more[8][96];
    int nmore;
    int translated; /* options of nvrtc_options among argv */
} link_opts;

static const char *value_of(const char *a, const char *const *names) {
    for (; *names; names++) {
        size_t l = strlen(*names);
        if (!strncmp(a, *names, l) && a[l] == '=')
            return a + l + 1;
    }
    return NULL;
}

static const char *const unlinkable[] = {
    "-rdc",  "--relocatable-device-code", "-dc",   "-ewp",   "--extensible-whole-program",
    "-dlto", "--dlink-time-opt",          "-dopt", "--dopt", NULL};

static int is_unlinkable(const char *a) {
    for (const char *const *r = unlinkable; *r; r++) {
        size_t n = strlen(*r);
        if (!strncmp(a, *r, n) && (a[n] == '\0' || a[n] == '='))
            return 1;
    }
    return 0;
}

/* The first of o's NVRTC options that link_opts_make cannot give nvJitLink
 * (NULL: none). */
static const char *unlinkable_option(const hkp_build_opts *o) {
    for (int i = 0; i < o->nnvrtc_options; i++)
        if (o->nvrtc_options[i] && is_unlinkable(o->nvrtc_options[i]))
            return o->nvrtc_options[i];
    return NULL;
}

static void link_opts_make(link_opts *l, int arch, const hkp_build_opts *o) {
    static const char *const regs[] = {"--maxrregcount", "-maxrregcount", NULL};
    static const char *const ptxas[] = {"--ptxas-options", "-Xptxas", NULL};
    static const char *const fc[] = {"--Ofast-compile", "-Ofast-compile", "-Ofc", NULL};
    memset(l, 0, sizeof *l);
    snprintf(l->arch, sizeof l->arch, "-arch=sm_%d%s", HKP_ARCH_NUM(arch),
             (arch & HKP_ARCH_SPECIFIC) ? "a" : "");
    l->argv[l->argc++] = l->arch;
    int fast_named = 0;
    for (int i = 0; i < o->nnvrtc_options && l->argc < MAX_LINK_OPTS - 1; i++) {
        const char *a = o->nvrtc_options[i], *v;
        if (!a || is_unlinkable(a))
            continue;
        char *m = l->nmore < 8 ? l->more[l->nmore] : NULL;
        if ((v = value_of(a, regs)) && m)
            snprintf(m, 96, "-maxrregcount=%s", v);
        else if ((v = value_of(a, ptxas)) && m)
            snprintf(m, 96, "-Xptxas=%s", v);
        else if ((v = value_of(a, fc)) && m)
            snprintf(m, 96, "-Ofc=%s", v), fast_named = 1;
        else if (!strcmp(a, "-G") || !strcmp(a, "--device-debug"))
            m = "-g";
        else if (!strcmp(a, "-lineinfo") || !strcmp(a, "--generate-line-info"))
            m = "-lineinfo";
        else
            continue; /* the front end's and NVVM's: their effect is in the PTX */
        if (m == l->more[l->nmore])
            l->nmore++;
        l->argv[l->argc++] = m;
        l->translated++;
    }
    if (!fast_named) {
        if (o->fast_compile)
            snprintf(l->opt, sizeof l->opt, "-Ofc=max");
        else
            snprintf(l->opt, sizeof l->opt, "-O%d", o->opt_level > 0 ? 3 : 0);
        l->argv[l->argc++] = l->opt;
    }
}

/* Everything known before compiling that changes the output. For CUDA C
 * that includes the toolkit (as a whole: its fingerprint) and the names of
 * the in-memory headers, since a name can hide a file the manifest lists;
 * their contents are dependencies like files. */
static void key_context(crypto_generichash_state *st, const char *kind, const void *data,
                        size_t size, hk_format fmt, const hkp_build_opts *o,
                        const char *source_name, const search_path *sp) {
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
    link_opts_make(&lo, o->arch, o);
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

static void artifact_key(const crypto_generichash_state *ctx, const dep_list *d,
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

static int artifact_store(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const hkp_artifact *a) {
    void *p = NULL;
    size_t n = 0;
    int rc = hkp_artifact_format(a, &p, &n);
    return store(c, key, rc, p, n);
}

/* Fills a from a cached entry; any inconsistency is a miss. */
static int artifact_load(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], hkp_artifact *a) {
    void *data;
    size_t size;
    if (hkp_cache_get(c, key, &data, &size) != 0)
        return HK_ERR_NOT_FOUND;
    int rc = hkp_artifact_parse(data, size, a);
    free(data);
    return rc ? HK_ERR_NOT_FOUND : 0;
}

static int manifest_store(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const dep_list *d) {
    void *p = NULL;
    size_t n = 0;
    int rc = hkp_manifest_format(d, &p, &n);
    return store(c, key, rc, p, n);
}

/* Reads the manifest: a miss when a path its search found empty holds a
 * file now (that file is what NVRTC would read); else its header list, each
 * header hashed again now (files from disk, in-memory headers from this
 * build's set), in d. */
static int manifest_load(hkp_cache *c, const uint8_t key[HKP_KEY_BYTES], const search_path *sp,
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
        int k = d->mem[i] ? find_mem(sp, d->paths[i]) : -1;
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

/* ---- precompiled headers ------------------------------------------------ */

/* NVRTC's automatic PCH (-pch) saves the state after the source's opening
 * run of preprocessing directives and reuses it while that run and the
 * command line stay the same. It does not notice a change in the contents of
 * the headers that run includes: measured with NVRTC 13.0, a PCH made with
 * "common.cuh" defining K 100 went on being used after the file (or the
 * in-memory header) said 500, and the kernel kept the old value. A hot reload
 * exists for exactly those edits, so the PCH here covers only the toolkit's
 * headers, which do not change under a running process: when the opening
 * run includes any other header (or holds a conditional, whose outcome the
 * run's text does not show), the source is compiled with "; #line N" put just
 * before that line, which ends the run there without moving any line number
 * in messages. Every prefix also holds NVRTC's own implicit headers (the
 * device runtime's declarations), so a source that includes nothing, or
 * starts with a header of its own, still gets a PCH of that implicit prefix.
 * It is worth little there: measured on the H200 machine's CPU (bench_build,
 * 2026-11-30), five small kernels to a cubin took 85.9 ms with it and 89.9
 * ms without, since code generation, not parsing, is most of such a compile;
 * the cub kernel took 271 ms with the PCH of its headers against 1777 ms.
 *
 * NVRTC keeps the PCH in a process-wide heap. When a PCH does not fit it says
 * so (nvrtcGetPCHCreateStatus), the compile itself having succeeded; the heap
 * is then enlarged to the size NVRTC asks for, and the next compile creates
 * the PCH. Compiling again at once would double the cost of this edit for the
 * benefit of the next, which pays the creation either way. Resizing frees the
 * heap, so it waits for every PCH compile in flight (pch_lock: compiles
 * read, resizes write). The PCH files live in NVRTC's own per-process
 * temporary directory, removed at exit. */

static pthread_rwlock_t pch_lock = PTHREAD_RWLOCK_INITIALIZER;
static _Atomic uint64_t pch_created, pch_resizes;

void hkp_pch_stats(uint64_t *created, uint64_t *heap_resizes) {
    if (created)
        *created = atomic_load(&pch_created);
    if (heap_resizes)
        *heap_resizes = atomic_load(&pch_resizes);
}

/* Moves *p past spaces, tabs and comments on the current line; tracks block
 * comments that run on across lines in *in_comment. */
static const char *skip_blank(const char *p, const char *eol, int *in_comment) {
    for (;;) {
        if (*in_comment) {
            while (p + 1 < eol && !(p[0] == '*' && p[1] == '/'))
                p++;
            if (p + 1 >= eol)
                return eol;
            p += 2;
            *in_comment = 0;
        }
        while (p < eol && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\f' || *p == '\v'))
            p++;
        if (p + 1 < eol && p[0] == '/' && p[1] == '/')
            return eol;
        if (p + 1 < eol && p[0] == '/' && p[1] == '*') {
            *in_comment = 1;
            p += 2;
            continue;
        }
        return p;
    }
}

/* Notes a block comment opened and not closed on a directive line. */
static void track_comment(const char *p, const char *eol, int *in_comment) {
    while (p < eol) {
        if (!*in_comment && p + 1 < eol && p[0] == '/' && p[1] == '/')
            return;
        if (!*in_comment && p + 1 < eol && p[0] == '/' && p[1] == '*') {
            *in_comment = 1;
            p += 2;
        } else if (*in_comment && p + 1 < eol && p[0] == '*' && p[1] == '/') {
            *in_comment = 0;
            p += 2;
        } else {
            p++;
        }
    }
}

/* Where the PCH may stop in src: 1 when the opening directives include only
 * toolkit headers (and macros), or there are none; 2 when the run must be cut
 * before byte *cut, the start of line *line (1-based). */
static int pch_split(const char *src, const search_path *sp, size_t *cut, int *line) {
    int in_comment = 0, lineno = 0;
    const char *p = src;
    while (*p) {
        const char *bol = p, *eol = strchr(p, '\n');
        if (!eol)
            eol = p + strlen(p);
        p = *eol ? eol + 1 : eol;
        lineno++;
        const char *q = skip_blank(bol, eol, &in_comment);
        if (q == eol)
            continue;
        if (*q != '#')
            return 1; /* code: the run ends here by itself */
        q = skip_blank(q + 1, eol, &in_comment);
        const char *w = q;
        while (q < eol && *q >= 'a' && *q <= 'z')
            q++;
        size_t wl = (size_t)(q - w);
        int safe = 0;
        if (wl == 7 && !strncmp(w, "include", 7)) {
            q = skip_blank(q, eol, &in_comment);
            char close = q < eol && *q == '<' ? '>' : q < eol && *q == '"' ? '"' : 0;
            const char *s = close ? ++q : NULL;
            while (close && q < eol && *q != close)
                q++;
            if (close && q < eol && q > s && q - s < PATH_MAX) {
                char name[PATH_MAX], path[PATH_MAX];
                int mem;
                memcpy(name, s, (size_t)(q - s));
                name[q - s] = '\0';
                if (resolve(name, close == '"', sp->srcdir, sp, path, &mem, NULL) == 1 &&
                    hkp_toolkit_owns(sp->tk, path)) {
                    safe = 1;
                }
            }
        } else if ((wl == 6 && !strncmp(w, "define", 6)) || (wl == 5 && !strncmp(w, "undef", 5)) ||
                   (wl == 6 && !strncmp(w, "pragma", 6))) {
            safe = 1;
        }
        if (!safe) {
            *cut = (size_t)(bol - src);
            *line = lineno;
            return 2;
        }
        track_comment(q, eol, &in_comment);
        /* A directive continued with a backslash goes on on the next line. */
        while (eol > bol && eol[-1 - (eol[-1] == '\r')] == '\\' && *p) {
            bol = p;
            eol = strchr(p, '\n');
            if (!eol)
                eol = p + strlen(p);
            p = *eol ? eol + 1 : eol;
            lineno++;
        }
    }
    return 1;
}

/* src with "; #line N" inserted at cut (see above). malloc'd. */
static char *pch_cut_source(const char *src, size_t cut, int line, const char *name) {
    char esc[PATH_MAX * 2];
    size_t e = 0;
    for (const char *c = name; *c && e + 2 < sizeof esc; c++) {
        if (*c == '"' || *c == '\\')
            esc[e++] = '\\';
        esc[e++] = *c;
    }
    esc[e] = '\0';
    size_t n = strlen(src), extra = e + 64;
    char *out = malloc(n + extra);
    if (!out)
        return NULL;
    memcpy(out, src, cut);
    int k = snprintf(out + cut, extra, ";\n#line %d \"%s\"\n", line, esc);
    memcpy(out + cut + (size_t)k, src + cut, n - cut + 1);
    return out;
}

/* After a PCH compile: counts a created PCH, or enlarges an exhausted heap. */
static void pch_after(nvrtcProgram prog) {
    nvrtcResult st = nvrtcGetPCHCreateStatus(prog);
    size_t need = 0, cur = 0;
    if (st == NVRTC_SUCCESS) {
        atomic_fetch_add(&pch_created, 1);
        return;
    }
    if (st != NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED ||
        nvrtcGetPCHHeapSizeRequired(prog, &need) != NVRTC_SUCCESS || need == 0)
        return;
    pthread_rwlock_wrlock(&pch_lock);
    if (nvrtcGetPCHHeapSize(&cur) == NVRTC_SUCCESS && need > cur &&
        nvrtcSetPCHHeapSize(need) == NVRTC_SUCCESS)
        atomic_fetch_add(&pch_resizes, 1);
    pthread_rwlock_unlock(&pch_lock);
}

/* ---- fast compiles -------------------------------------------------------- */

/* The development profile (fast_compile) asks NVRTC for -Ofc=max, its
 * fast-compile level, which it hands on to ptxas (ptxas then refuses an -O1
 * to -O3 of its own, so none is given), and nvJitLink for -Ofc=max (which it
 * takes; its long form --Ofast-compile it refuses). Measured with NVRTC 13.0
 * on the 2-core CI machine, a one-line kernel to an sm_90 cubin with the PCH,
 * interleaved with the default build in one process: median 22.2 against
 * 25.5 ms (NVRTC's -time: NVVM 5-6 ms instead of 7, the front end and ptxas
 * unchanged). nvJitLink at -Ofc=max took the PTX of five small kernels to a
 * cubin in 20.6 ms against 27.9 at -O3 (21 rounds, interleaved; -O0 gave
 * 20.4), the one-line kernel's in the same 7.7 ms. -Ofc changes nothing the front end sees: the PCH
 * made by a default build is used by a fast one and the other way round.
 *
 * -minimal leaves NVRTC's declarations of textures and surfaces, of the
 * device runtime (cudaMalloc in device code, device-side launches) and of
 * the runtime's and driver's types (cudaError_t, cudaStream_t) out of the
 * implicit prefix: measured the same way, 60 rounds twice, it took the
 * one-line kernel from 0.89-0.90x of the default's time with -Ofc=max alone
 * to 0.78-0.82x. It changes the language, though, so the profile adds it
 * only where minimal_ok finds the source cannot need it, and compiles again
 * without it when it fails all the same (nvrtc_build). Its implicit prefix
 * is another PCH, made once by the first such build; NVRTC 13 keeps both,
 * so builds of both profiles alternating create none. --split-compile,
 * which splits NVVM's work by function, bought nothing for a one-kernel
 * source (x1.05, bench_build) and is not used. */

/* Whether an identifier starting at s (just after a non-identifier
 * character) names something -minimal leaves out, by its prefix: cuda*
 * (cudaError_t, cudaMalloc, cudaTextureObject_t, cuda::), tex* and surf*
 * (tex1Dfetch, texture<>, surf2Dwrite). */
static int omitted_word(const char *s) {
    return !strncmp(s, "cuda", 4) || !strncmp(s, "tex", 3) || !strncmp(s, "surf", 4);
}

/* 1 when text (n bytes) names nothing -minimal leaves out and includes only
 * in-memory headers of sp: no such identifier (comments and strings count
 * too), no device-side launch, no other #include. A textual test that errs
 * towards 0. */
static int minimal_text_ok(const char *text, size_t n, const search_path *sp) {
    for (size_t i = 0; i < n; i++) {
        char c = text[i];
        int start = i == 0 || !hkp_is_ident_char((unsigned char)text[i - 1]);
        if (start && (c == 'c' || c == 't' || c == 's') && n - i >= 3 && omitted_word(text + i))
            return 0;
        if (c == '<' && n - i >= 3 && text[i + 1] == '<' && text[i + 2] == '<')
            return 0;
        if (c != '#')
            continue;
        size_t j = i + 1;
        while (j < n && (text[j] == ' ' || text[j] == '\t'))
            j++;
        if (n - j < 7 || strncmp(text + j, "include", 7) != 0)
            continue;
        j += 7;
        while (j < n && (text[j] == ' ' || text[j] == '\t'))
            j++;
        char close = j < n && text[j] == '<' ? '>' : j < n && text[j] == '"' ? '"' : 0;
        size_t k = ++j;
        while (close && k < n && text[k] != close && text[k] != '\n')
            k++;
        char name[PATH_MAX];
        if (!close || k >= n || text[k] != close || k - j >= sizeof name)
            return 0; /* an #include it cannot read: not sure */
        memcpy(name, text + j, k - j);
        name[k - j] = '\0';
        if (find_mem(sp, name) < 0)
            return 0; /* a file (the toolkit's, say) it has not read */
    }
    return 1;
}

/* Whether src can be compiled with -minimal: it, and every in-memory header
 * of the build, pass minimal_text_ok, and no header is pre-included. */
static int minimal_ok(const char *src, const search_path *sp) {
    if (sp->npre > 0 || !minimal_text_ok(src, strlen(src), sp))
        return 0;
    for (int i = 0; i < sp->nmem; i++) {
        if (!minimal_text_ok(sp->mem[i].data, sp->mem[i].size, sp))
            return 0;
    }
    return 1;
}

/* 1 when the caller's NVRTC options set a fast-compile level themselves. */
static int names_fast_compile(const hkp_build_opts *o) {
    for (int i = 0; i < o->nnvrtc_options; i++) {
        const char *a = o->nvrtc_options[i];
        if (a && (!strncmp(a, "-Ofc", 4) || !strncmp(a, "--Ofast-compile", 15) ||
                  !strncmp(a, "-Ofast-compile", 14)))
            return 1;
    }
    return 0;
}

/* NVRTC's command line for one compile: the arch, the profile's options,
 * the caller's, the toolkit's include directories, the PCH's. */
typedef struct nvrtc_cmd {
    const char **argv;
    int argc;
    char archopt[64], ptxasopt[64];
    char *inc, *cccl; /* "-I" + the toolkit's directories (malloc'd) */
} nvrtc_cmd;

static void nvrtc_cmd_free(nvrtc_cmd *c) {
    free(c->argv);
    free(c->inc);
    free(c->cccl);
}

static int nvrtc_cmd_make(nvrtc_cmd *c, const hkp_build_opts *o, const search_path *sp,
                          int want_cubin, int fast, int minimal, int pch) {
    memset(c, 0, sizeof *c);
    c->argv = calloc((size_t)o->nnvrtc_options + 10, sizeof *c->argv);
    if (!c->argv)
        return HK_ERR_NOMEM;
    snprintf(c->archopt, sizeof c->archopt, "--gpu-architecture=%s_%d%s",
             want_cubin ? "sm" : "compute", HKP_ARCH_NUM(o->arch),
             (o->arch & HKP_ARCH_SPECIFIC) ? "a" : "");
    c->argv[c->argc++] = c->archopt;
    if (minimal)
        c->argv[c->argc++] = "-minimal";
    if (fast) {
        /* Reaches ptxas too, which then refuses -O1..3 of its own. */
        c->argv[c->argc++] = "-Ofc=max";
    } else if (want_cubin) {
        snprintf(c->ptxasopt, sizeof c->ptxasopt, "--ptxas-options=-O%d", o->opt_level > 0 ? 3 : 0);
        c->argv[c->argc++] = c->ptxasopt;
    }
    for (int i = 0; i < o->nnvrtc_options; i++)
        if (o->nvrtc_options[i])
            c->argv[c->argc++] = o->nvrtc_options[i];
    /* After the user's -I, so that their copies of a header win (nvcc's order). */
    if (!o->no_toolkit && sp->tk->include[0]) {
        if (asprintf(&c->inc, "-I%s", sp->tk->include) < 0) {
            c->inc = NULL;
            return HK_ERR_NOMEM;
        }
        c->argv[c->argc++] = c->inc;
    }
    if (!o->no_toolkit && sp->tk->cccl[0]) {
        if (asprintf(&c->cccl, "-I%s", sp->tk->cccl) < 0) {
            c->cccl = NULL;
            return HK_ERR_NOMEM;
        }
        c->argv[c->argc++] = c->cccl;
    }
    if (pch) {
        c->argv[c->argc++] = "-pch";
        /* Otherwise every log would say that a PCH was made or used:
         * noise in a build's warnings, and a log that differs with the
         * process's history (a check's, a swap's report). */
        c->argv[c->argc++] = "--pch-messages=false";
        /* 639: the heap was too small (handled in pch_after); 20283: PCH
         * creation stops at the #line put in by pch_cut_source, as meant;
         * 629: a PCH made with other options was passed over (NVRTC 13
         * keeps one per option set and goes on to the one that fits);
         * 630: one made for another source's opening directives was
         * passed over, likewise (a process building several sources). */
        c->argv[c->argc++] = "--diag-suppress=629,630,639,20283";
    }
    return 0;
}

/* Makes the NVRTC program of src and the in-memory headers of sp. With
 * o->pch, the source's opening run is cut where pch_split says: *cut_src
 * is then the text given to NVRTC (malloc'd, the caller frees it after the
 * program) and *pch is set. */
static int nvrtc_program(const char *src, const hkp_build_opts *o, const search_path *sp,
                         const char *source_name, nvrtcProgram *prog, char **cut_src, int *pch,
                         char *why, size_t why_size) {
    const char **hdata = NULL, **hname = NULL;
    *cut_src = NULL;
    *pch = 0;
    if (o->pch) {
        size_t cut = 0;
        int line = 0;
        *pch = pch_split(src, sp, &cut, &line);
        if (*pch == 2) {
            if (!(*cut_src = pch_cut_source(src, cut, line, source_name)))
                return HK_ERR_NOMEM;
            src = *cut_src;
        }
    }
    if (sp->nmem > 0) {
        hdata = calloc((size_t)sp->nmem, sizeof *hdata);
        hname = calloc((size_t)sp->nmem, sizeof *hname);
        if (!hdata || !hname) {
            free(hdata);
            free(hname);
            return HK_ERR_NOMEM;
        }
        for (int i = 0; i < sp->nmem; i++) {
            hdata[i] = sp->mem[i].data; /* NUL-terminated copies */
            hname[i] = sp->mem[i].name;
        }
    }
    nvrtcResult r = nvrtcCreateProgram(prog, src, source_name, sp->nmem, hdata, hname);
    free(hdata);
    free(hname);
    if (r != NVRTC_SUCCESS) {
        *prog = NULL;
        hkp_why(why, why_size, "NVRTC: %s", nvrtcGetErrorString(r));
        return r == NVRTC_ERROR_OUT_OF_MEMORY ? HK_ERR_NOMEM : HK_ERR_COMPILE;
    }
    return 0;
}

/* Takes a compiled program's image (cubin or PTX) and lowered names into a. */
static int nvrtc_output(nvrtcProgram prog, const hkp_build_opts *o, int want_cubin, hkp_artifact *a,
                        char *why, size_t why_size) {
    size_t n = 0;
    nvrtcResult r = want_cubin ? nvrtcGetCUBINSize(prog, &n) : nvrtcGetPTXSize(prog, &n);
    if (r != NVRTC_SUCCESS || n == 0) {
        hkp_why(why, why_size, "NVRTC: no %s produced", want_cubin ? "cubin" : "PTX");
        return HK_ERR_COMPILE;
    }
    if (!(a->image = malloc(n)))
        return HK_ERR_NOMEM;
    r = want_cubin ? nvrtcGetCUBIN(prog, a->image) : nvrtcGetPTX(prog, a->image);
    if (r != NVRTC_SUCCESS) {
        hkp_why(why, why_size, "NVRTC: %s", nvrtcGetErrorString(r));
        return HK_ERR_COMPILE;
    }
    a->size = n;
    a->format = want_cubin ? HK_FORMAT_CUBIN : HK_FORMAT_PTX;
    if (o->nname_expressions <= 0)
        return 0;
    if (!(a->lowered_names = calloc((size_t)o->nname_expressions, sizeof(char *))))
        return HK_ERR_NOMEM;
    for (int i = 0; i < o->nname_expressions; i++) {
        const char *low = NULL;
        r = nvrtcGetLoweredName(prog, o->name_expressions[i], &low);
        if (!(a->lowered_names[i] = strdup(r == NVRTC_SUCCESS && low ? low : "")))
            return HK_ERR_NOMEM;
        a->nlowered = i + 1;
    }
    return 0;
}

/* Compiles CUDA C to a cubin (want_cubin) or PTX for opts->arch. src is
 * NUL-terminated; sp carries the in-memory headers and the search path. */
static int nvrtc_compile(const char *src, const hkp_build_opts *o, const search_path *sp,
                         const char *source_name, int want_cubin, int fast, int minimal,
                         hkp_artifact *a, char *why, size_t why_size) {
    nvrtcProgram prog = NULL;
    nvrtc_cmd cmd = {0};
    char *cut_src = NULL;
    int pch = 0;
    int rc = nvrtc_program(src, o, sp, source_name, &prog, &cut_src, &pch, why, why_size);
    if (rc) {
        free(cut_src);
        return rc;
    }
    if ((rc = nvrtc_cmd_make(&cmd, o, sp, want_cubin, fast, minimal, pch)) != 0)
        goto out;
    for (int i = 0; i < o->nname_expressions; i++) {
        nvrtcResult r = nvrtcAddNameExpression(prog, o->name_expressions[i]);
        if (r != NVRTC_SUCCESS) {
            hkp_why(why, why_size, "NVRTC: name expression '%s': %s", o->name_expressions[i],
                    nvrtcGetErrorString(r));
            rc = HK_ERR_COMPILE;
            goto out;
        }
    }
    if (pch)
        pthread_rwlock_rdlock(&pch_lock);
    nvrtcResult r = nvrtcCompileProgram(prog, cmd.argc, cmd.argv);
    if (pch) {
        pthread_rwlock_unlock(&pch_lock);
        pch_after(prog);
    }
    if ((rc = nvrtc_log(prog, &a->log)) != 0)
        goto out;
    if (r != NVRTC_SUCCESS) {
        char line[400];
        first_error_line(a->log, line, sizeof line);
        hkp_why(why, why_size, "NVRTC: %s%s%s", nvrtcGetErrorString(r), line[0] ? ": " : "", line);
        rc = r == NVRTC_ERROR_OUT_OF_MEMORY ? HK_ERR_NOMEM : HK_ERR_COMPILE;
        goto out;
    }
    rc = nvrtc_output(prog, o, want_cubin, a, why, why_size);
out:
    nvrtc_cmd_free(&cmd);
    free(cut_src);
    nvrtcDestroyProgram(&prog);
    return rc;
}

/* nvrtc_compile with the options of the build's profile: the development
 * profile compiles with -Ofc=max, and with -minimal too where minimal_ok
 * says the source can do without what it leaves out. Should it fail all the
 * same, the source is compiled again with the whole language, whose result
 * (and log) is the build's: -minimal can cost a failed build the time of a
 * second front end, never a refusal the default language would not give. */
static int nvrtc_build(const char *src, const hkp_build_opts *o, const search_path *sp,
                       const char *source_name, int want_cubin, hkp_artifact *a, char *why,
                       size_t why_size) {
    int fast = o->fast_compile && !names_fast_compile(o);
    int minimal = fast && minimal_ok(src, sp);
    int rc = nvrtc_compile(src, o, sp, source_name, want_cubin, fast, minimal, a, why, why_size);
    if (rc == HK_ERR_COMPILE && minimal) {
        free(a->log);
        a->log = NULL;
        if (why && why_size)
            why[0] = '\0';
        rc = nvrtc_compile(src, o, sp, source_name, want_cubin, fast, 0, a, why, why_size);
    }
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
 * carry HKP_ARCH_SPECIFIC) with o's link options (link_opts_make).
 * Replaces a->image with the cubin; nvJitLink's log goes to a->log. */
static int jitlink_ptx(const void *ptx, size_t size, int arch, const hkp_build_opts *o,
                       const char *name, hkp_artifact *a, char *why, size_t why_size) {
    nvJitLinkHandle h = NULL;
    link_opts lo;
    void *cubin = NULL;
    char *text = NULL;
    int rc = 0;
    nvJitLinkResult r;

    link_opts_make(&lo, arch, o);
    r = nvJitLinkCreate(&h, (uint32_t)lo.argc, lo.argv);
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

/* Says in a's log why its trap guard's copy was not made (the build goes
 * on unguarded). */
static int guard_note(hkp_artifact *a, const char *why) {
    char line[400];
    snprintf(line, sizeof line, "hotkern: the canary's trap guard was not built (%s)", why);
    return log_append(&a->log, line);
}

/* The trap guard's copy of a build (guard.c), made after its image: from
 * the image's PTX, a cubin linked exactly as the image is (to_cubin: the
 * same nvJitLink options, so that the copy differs from what commits at
 * its sites alone), else the guarded PTX. Only when o->trap_guard and the
 * PTX has something to guard. A copy that cannot be made leaves the build
 * unguarded (its canary runs traps for real), and the build's log says
 * why; only memory running out fails the build. */
static int guard_build(const char *ptx, size_t n, const hkp_build_opts *o, int to_cubin,
                       int link_arch, const char *name, hkp_artifact *a) {
    if (!o->trap_guard)
        return 0;
    char *g = NULL, why[300] = "";
    size_t gn = 0;
    int sites = 0, rc = 0;
    const char *bad = to_cubin ? unlinkable_option(o) : NULL;
    if (bad) /* the image's link leaves it out: the copy cannot be built as the image is */
        snprintf(why, sizeof why, "NVRTC option '%.100s' has no nvJitLink equivalent", bad),
            rc = HK_ERR_COMPILE;
    else
        rc = hkp_guard_ptx(ptx, n, &g, &gn, &sites, why, sizeof why);
    if (rc == 0 && sites && to_cubin) {
        hkp_artifact link = {0};
        rc = jitlink_ptx(g, gn, link_arch, o, name, &link, why, sizeof why);
        free(g);
        g = link.image, gn = link.size;
        link.image = NULL;
        hkp_artifact_free(&link);
    }
    if (rc == HK_ERR_NOMEM) {
        free(g);
        return rc;
    }
    if (rc) {
        free(g);
        return guard_note(a, why);
    }
    a->guard = g;
    a->guard_size = gn;
    a->guard_sites = sites;
    return 0;
}

/* ---- the build ------------------------------------------------------------ */

/* Why m does not run on o->arch, which refusals call the device (a
 * runtime's builds) or the target (o->target_name). */
static int arch_refusal(const hkp_meta *m, const hkp_build_opts *o, char *why, size_t why_size) {
    const char *target = o->target_name ? o->target_name : "device";
    int arch = o->arch;
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
        hkp_why(why, why_size, "fatbin has %s, %s is %s", list[0] ? list : "no code", target, d);
    } else {
        hkp_why(why, why_size, "%s is %s, %s is %s", m->format == HK_FORMAT_PTX ? "PTX" : "cubin",
                hkp_arch_name(m->arch, a, sizeof a), target, d);
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

/* Builds without the cache, in this process. */
static int compile_here(const void *data, size_t size, hk_format fmt, const hkp_build_opts *o,
                        const search_path *sp, const char *source_name, hkp_artifact *a, char *why,
                        size_t why_size) {
    int rc = 0;
    if (fmt == HK_FORMAT_CUDA_C) {
        /* data is NUL-terminated here (hkp_build made it so). A build that
         * makes a trap guard's copy goes through PTX: image and copy then
         * come from links of the same PTX with the same options (NVRTC's own
         * ptxas allocates registers otherwise than nvJitLink: 47 against 55
         * measured for one kernel with __launch_bounds__), and NVRTC's ptxas
         * is not run for a cubin that would be replaced. Unless an option
         * cannot be given to nvJitLink: then NVRTC builds the cubin and the
         * version goes unguarded. */
        const char *bad = o->trap_guard ? unlinkable_option(o) : NULL;
        int direct = o->ptx_to_cubin && !o->nvrtc_via_ptx && (!o->trap_guard || bad);
        rc = nvrtc_build(data, o, sp, source_name, direct, a, why, why_size);
        if (!rc && direct && bad) {
            char note[160];
            snprintf(note, sizeof note, "NVRTC option '%.100s' has no nvJitLink equivalent", bad);
            rc = guard_note(a, note);
        }
        if (rc || direct)
            return rc;
        /* NVRTC's PTX: linked (or left to the driver), then guarded. */
        char *ptx = malloc(a->size);
        if (!ptx)
            return HK_ERR_NOMEM;
        memcpy(ptx, a->image, a->size);
        size_t n = a->size;
        if (o->ptx_to_cubin)
            rc = jitlink_ptx(ptx, n, o->arch, o, source_name, a, why, why_size);
        if (!rc)
            rc = guard_build(ptx, n, o, o->ptx_to_cubin, o->arch, source_name, a);
        free(ptx);
        return rc;
    }
    /* PTX. The arch check comes first when the PTX parses, for a clear
     * reason; a PTX the parser refuses goes to nvJitLink, whose log names
     * the line. */
    hkp_meta pm;
    int link_arch = o->arch;
    if (hkp_meta_read(data, size, HK_FORMAT_PTX, &pm, NULL, 0) == 0) {
        if (!hkp_meta_runs_on(&pm, o->arch)) {
            rc = arch_refusal(&pm, o, why, why_size);
            hkp_meta_free(&pm);
            return rc;
        }
        if (pm.arch & HKP_ARCH_SPECIFIC)
            link_arch |= HKP_ARCH_SPECIFIC;
        hkp_meta_free(&pm);
    }
    /* The image first: a PTX that does not build is refused with its own
     * log, not with its guarded copy's. */
    rc = o->ptx_to_cubin ? jitlink_ptx(data, size, link_arch, o, source_name, a, why, why_size)
                         : copy_image(data, size, HK_FORMAT_PTX, a);
    return rc ? rc : guard_build(data, size, o, o->ptx_to_cubin, link_arch, source_name, a);
}

/* Builds without the cache. */
static int build_fresh(const void *data, size_t size, hk_format fmt, const hkp_build_opts *o,
                       const search_path *sp, const char *source_name, hkp_artifact *a, char *why,
                       size_t why_size) {
    /* Isolated: the compile steps (NVRTC, nvJitLink) run in the helper,
     * which does the same as compile_here; only PTX left for the driver
     * stays. */
    if (o->iso && (fmt == HK_FORMAT_CUDA_C || o->ptx_to_cubin))
        return hkp_iso_build(o->iso, data, size, fmt, o, sp->mem, sp->nmem, source_name, a, why,
                             why_size);
    /* In this process a compile is a section of the exit guard: exit waits
     * for it, and none begins once the process exits. A process's first
     * compile registers exit handlers of its own (measured with NVRTC 13.0:
     * 5 of libnvrtc's, 9 of the C++ library's as it loads its builtins;
     * none at later compiles), which exit would run before the guard: the
     * guard is registered again after it. */
    if (!hkb_exit_enter()) {
        hkp_why(why, why_size, "the process is exiting: nothing is compiled");
        return HK_ERR_CLOSED;
    }
    int rc = compile_here(data, size, fmt, o, sp, source_name, a, why, why_size);
    hkb_exit_leave();
    hkb_exit_rearm();
    return rc;
}

static int take_deps(hkp_artifact *a, dep_list *d) {
    if (!d->n)
        return 0;
    a->deps = hku_strv_dup((const char *const *)d->paths, d->n);
    if (!a->deps)
        return HK_ERR_NOMEM;
    a->ndeps = d->n;
    return 0;
}

/* The build's in-memory headers: opts->headers, then those of
 * base_headers whose names they do not hide. One allocation (free()). */
static int merge_headers(const hkp_build_opts *o, hk_header **out, int *n) {
    int total = (o->nheaders > 0 ? o->nheaders : 0) + (o->nbase_headers > 0 ? o->nbase_headers : 0);
    *out = NULL;
    *n = 0;
    if (total == 0)
        return 0;
    hk_header *all = calloc((size_t)total, sizeof *all);
    int k = 0;
    if (!all)
        return HK_ERR_NOMEM;
    for (int i = 0; i < o->nheaders; i++)
        all[k++] = o->headers[i];
    for (int i = 0; i < o->nbase_headers; i++) {
        int hidden = 0;
        for (int j = 0; j < o->nheaders && !hidden; j++)
            hidden = o->headers[j].name && o->base_headers[i].name &&
                     !strcmp(o->headers[j].name, o->base_headers[i].name);
        if (!hidden)
            all[k++] = o->base_headers[i];
    }
    int rc = hku_headers_dup(all, k, out);
    free(all);
    if (!rc)
        *n = k;
    return rc;
}

/* Looks the artifact that ctx and deps key (written to akey) up in cache c.
 * Returns 1 on a hit, counted, with out filled; 0 on a miss, out empty. */
static int cached(hkp_cache *c, const crypto_generichash_state *ctx, const dep_list *deps,
                  uint8_t akey[HKP_KEY_BYTES], hkp_artifact *out) {
    artifact_key(ctx, deps, akey);
    if (artifact_load(c, akey, out) == 0 &&
        hkp_meta_read(out->image, out->size, out->format, &out->meta, NULL, 0) == 0) {
        out->cache_hit = 1;
        hkp_cache_note(c, 1);
        return 1;
    }
    hkp_artifact_free(out);
    return 0;
}

/* One hkp_build's working state. */
typedef struct build_job {
    const void *data;
    size_t size;
    hk_format fmt;
    const hkp_build_opts *o;
    const char *source_name;
    search_path sp; /* its own, or a copy of opts->search's (sp_shared) */
    int sp_shared;
    hk_header *mem; /* the merged in-memory headers (merge_headers) */
    int nmem;
    dep_list deps;
    crypto_generichash_state ctx; /* the cache key's context (key_context) */
    uint8_t mkey[HKP_KEY_BYTES], akey[HKP_KEY_BYTES];
    int cacheable;
    char *src; /* CUDA C as a C string */
} build_job;

static int opts_valid(const hkp_build_opts *o, const void *data, size_t size) {
    return o && HKP_ARCH_NUM(o->arch) > 0 && (data || !size) && o->nnvrtc_options >= 0 &&
           o->nname_expressions >= 0 && (!o->nnvrtc_options || o->nvrtc_options) &&
           (!o->nname_expressions || o->name_expressions) && o->nheaders >= 0 &&
           (!o->nheaders || o->headers) && o->nbase_headers >= 0 &&
           (!o->nbase_headers || o->base_headers);
}

/* Cubins and fatbins: read, checked for the arch, copied. */
static int pass_through(build_job *j, hkp_artifact *out, char *why, size_t why_size) {
    int rc = hkp_meta_read(j->data, j->size, j->fmt, &out->meta, why, why_size);
    if (rc)
        return rc;
    if (!hkp_meta_runs_on(&out->meta, j->o->arch))
        return arch_refusal(&out->meta, j->o, why, why_size);
    return copy_image(j->data, j->size, j->fmt, out);
}

/* The in-memory headers and the include search path of options o. */
static int make_search(const hkp_build_opts *o, hk_header **mem, int *nmem, search_path *sp,
                       char *why, size_t why_size) {
    int rc = merge_headers(o, mem, nmem);
    if (rc) {
        hkp_why(why, why_size, "in-memory headers: %s",
                rc == HK_ERR_INVALID ? "a header without a name" : hk_strerror(rc));
        return rc;
    }
    return parse_search_path(o, *mem, *nmem, sp);
}

/* A search path made once for many builds (hkp_search_create). */
struct hkp_search {
    hk_header *mem; /* the merged in-memory headers */
    int nmem;
    search_path sp;
};

int hkp_search_create(const hkp_build_opts *o, hkp_search **out, char *why, size_t why_size) {
    *out = NULL;
    if (!opts_valid(o, NULL, 0)) {
        hkp_why(why, why_size, "invalid build options");
        return HK_ERR_INVALID;
    }
    hkp_search *s = calloc(1, sizeof *s);
    if (!s)
        return HK_ERR_NOMEM;
    int rc = make_search(o, &s->mem, &s->nmem, &s->sp, why, why_size);
    if (rc) {
        hkp_search_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void hkp_search_free(hkp_search *s) {
    if (!s)
        return;
    search_path_free(&s->sp);
    free(s->mem);
    free(s);
}

/* CUDA C: the in-memory headers and the include search path, the build's
 * own or the prepared one; the source's directory. */
static int job_search(build_job *j, char *why, size_t why_size) {
    int rc = 0;
    if (j->o->search) {
        j->sp = j->o->search->sp; /* its arrays stay the search's */
        j->sp_shared = 1;
    } else {
        rc = make_search(j->o, &j->mem, &j->nmem, &j->sp, why, why_size);
    }
    source_dir(j->source_name, j->sp.srcdir, sizeof j->sp.srcdir);
    return rc;
}

/* Looks the build up in the compile cache: 1 on a hit (out filled), else
 * 0 with the keys left in j for the store after the build. */
static int job_cached(build_job *j, hkp_artifact *out) {
    hkp_cache *c = j->o->cache;
    if (!c || sodium_init() < 0)
        return 0;
    j->cacheable = 1;
    key_context(&j->ctx, "ctx", j->data, j->size, j->fmt, j->o, j->source_name, &j->sp);
    if (j->fmt == HK_FORMAT_CUDA_C) {
        crypto_generichash_state m = j->ctx;
        h_str(&m, "manifest");
        crypto_generichash_final(&m, j->mkey, sizeof j->mkey);
        if (manifest_load(c, j->mkey, &j->sp, &j->deps) == 0 &&
            cached(c, &j->ctx, &j->deps, j->akey, out))
            return 1;
        deps_free(&j->deps);
    } else if (cached(c, &j->ctx, &j->deps, j->akey, out)) {
        return 1;
    }
    hkp_cache_note(c, 0);
    return 0;
}

/* Compiles (NVRTC, nvJitLink), then reads and checks what came out. */
static int job_compile(build_job *j, hkp_artifact *out, char *why, size_t why_size) {
    int rc;
    char mwhy[256];
    if (j->fmt == HK_FORMAT_CUDA_C) {
        /* NVRTC and the include scan both want a C string. */
        if (!(j->src = malloc(j->size + 1)))
            return HK_ERR_NOMEM;
        if (j->size)
            memcpy(j->src, j->data, j->size);
        j->src[j->size] = '\0';
        rc = scan_deps(j->src, &j->sp, &j->deps);
        if (!rc)
            rc = take_deps(out, &j->deps);
        if (rc)
            return rc;
    }
    rc = build_fresh(j->src ? j->src : j->data, j->size, j->fmt, j->o, &j->sp, j->source_name, out,
                     why, why_size);
    if (rc)
        return rc;
    rc = hkp_meta_read(out->image, out->size, out->format, &out->meta, mwhy, sizeof mwhy);
    if (rc) {
        hkp_why(why, why_size, "built image unreadable: %s", mwhy);
        return rc;
    }
    if (!hkp_meta_runs_on(&out->meta, j->o->arch))
        return arch_refusal(&out->meta, j->o, why, why_size);
    return 0;
}

/* Keeps a build in the cache when its headers did not change during it.
 * A failure to cache is not a failure to build; one that the caller may
 * want to hear about is noted. */
static void job_store(build_job *j, hkp_artifact *out) {
    hkp_cache *c = j->o->cache;
    if (!j->cacheable || !deps_unchanged(&j->deps))
        return;
    artifact_key(&j->ctx, &j->deps, j->akey);
    int stored = artifact_store(c, j->akey, out);
    if (stored == 0 && j->fmt == HK_FORMAT_CUDA_C)
        stored = manifest_store(c, j->mkey, &j->deps);
    if (stored == HK_ERR_BUSY || stored == HK_ERR_IO)
        snprintf(out->cache_note, sizeof out->cache_note, "compile cache %.100s: %s: not cached",
                 hkp_cache_dir(c),
                 stored == HK_ERR_BUSY ? "its lock is held by another process"
                                       : "its lock file is refused");
}

static int build_job_run(build_job *j, hkp_artifact *out, char *why, size_t why_size) {
    int rc;
    if (j->fmt == HK_FORMAT_AUTO && (rc = hkp_detect(j->data, j->size, &j->fmt, why, why_size)))
        return rc;
    j->source_name = j->o->source_name && j->o->source_name[0] ? j->o->source_name
                     : j->fmt == HK_FORMAT_PTX                 ? "input.ptx"
                                                               : "input.cu";
    if (j->fmt == HK_FORMAT_CUBIN || j->fmt == HK_FORMAT_FATBIN)
        return pass_through(j, out, why, why_size);
    if (j->fmt != HK_FORMAT_CUDA_C && j->fmt != HK_FORMAT_PTX)
        return HK_ERR_INVALID;
    if (j->fmt == HK_FORMAT_CUDA_C && (rc = job_search(j, why, why_size)))
        return rc;
    if (job_cached(j, out))
        return 0;
    if ((rc = job_compile(j, out, why, why_size)))
        return rc;
    job_store(j, out);
    return 0;
}

int hkp_build(const void *data, size_t size, hk_format fmt, const hkp_build_opts *opts,
              hkp_artifact *out, char *why, size_t why_size) {
    double t0 = hku_now_ms();
    if (why && why_size)
        why[0] = '\0';
    if (!out)
        return HK_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if (!opts_valid(opts, data, size)) {
        hkp_why(why, why_size, "invalid build options");
        return HK_ERR_INVALID;
    }
    build_job j = {.data = data, .size = size, .fmt = fmt, .o = opts};
    int rc = build_job_run(&j, out, why, why_size);
    free(j.src);
    deps_free(&j.deps);
    if (!j.sp_shared)
        search_path_free(&j.sp);
    free(j.mem);
    out->ms = hku_now_ms() - t0;
    return rc;
}

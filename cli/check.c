/*
 * hotkern check: build and validate kernel files the way a swap would.
 *
 * Meant for editors and CI: it runs the same build path as the runtime
 * (NVRTC, nvJitLink, the metadata parsers, the architecture check) without a
 * GPU, and prints compiler messages as "file:line: ..." so that editors and
 * terminals can jump to them. No compile cache is used, so every run really
 * compiles. The toolkit's headers (cub, cuda::std, cooperative_groups,
 * cuda_fp16 ...) are found without -I, as in a swap.
 *
 * A file whose kernels are all templates compiles to nothing: NVRTC
 * instantiates only what is named. Rather than report "0 kernels", check
 * says which templates it saw and how to name an instantiation.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "ptx/ptx.h"

#define MAX_FILE_BYTES (256u << 20)

static void check_usage(FILE *f) {
    fprintf(f, "usage: hotkern check [--arch sm_XY] [-I DIR] [-D NAME[=VALUE]]\n"
               "                     [--name-expression EXPR]... [--ptx-only] FILE...\n"
               "\n"
               "Compiles and validates each FILE (CUDA C, PTX, cubin or fatbin, detected from\n"
               "its content) for one GPU architecture, as hotkern would before a swap.\n"
               "\n"
               "  --arch sm_XY   target architecture (default sm_90; '90' also works)\n"
               "  -I DIR         add DIR to the include path of CUDA C files\n"
               "  -D NAME[=VAL]  define a macro for CUDA C files\n"
               "  --name-expression EXPR\n"
               "                 instantiate a template kernel, e.g. 'scale<float>' (as\n"
               "                 hk_swap_options.name_expressions does); may be repeated\n"
               "  --ptx-only     stop at PTX: CUDA C is compiled to PTX and PTX is only parsed,\n"
               "                 not linked to a cubin\n"
               "  -h, --help     show this help\n"
               "\n"
               "Prints 'FILE: ok (N kernels: ...)' or the compiler's messages as file:line.\n"
               "A file whose kernels are all templates, none of them instantiated, fails\n"
               "with the templates' names and a --name-expression to try.\n"
               "Exit status: 0 all files ok, 1 a file failed, 2 usage error.\n");
}

static int parse_arch(const char *s) {
    if (!strncmp(s, "sm_", 3))
        s += 3;
    else if (!strncmp(s, "compute_", 8))
        s += 8;
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 10 || v > 9999)
        return 0;
    if (*end == 'a' && end[1] == '\0')
        return (int)v | HKP_ARCH_SPECIFIC;
    return *end ? 0 : (int)v;
}

static int read_input(const char *path, char **data, size_t *size) {
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    if (!f)
        return -errno;
    for (;;) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = ncap <= MAX_FILE_BYTES ? realloc(buf, ncap) : NULL;
            if (!nb) {
                free(buf);
                fclose(f);
                return -EFBIG;
            }
            buf = nb;
            cap = ncap;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
    }
    int err = ferror(f) ? -EIO : 0;
    fclose(f);
    if (err) {
        free(buf);
        return err;
    }
    *data = buf;
    *size = n;
    return 0;
}

/* Prints a ptxas line "ptxas application ptx input, line 6; error   : msg"
 * as "file:6: error: msg"; returns 0 when the line has another shape. */
static int print_ptxas_line(const char *file, const char *p, size_t len) {
    static const char prefix[] = "ptxas application ptx input, line ";
    size_t pl = sizeof prefix - 1;
    if (len <= pl || strncmp(p, prefix, pl) != 0)
        return 0;
    const char *q = p + pl, *end = p + len;
    const char *num = q;
    while (q < end && *q >= '0' && *q <= '9')
        q++;
    if (q == num || q >= end || *q != ';')
        return 0;
    const char *kind = ++q;
    while (kind < end && *kind == ' ')
        kind++;
    const char *colon = memchr(kind, ':', (size_t)(end - kind));
    if (!colon)
        return 0;
    const char *kend = colon;
    while (kend > kind && kend[-1] == ' ')
        kend--;
    const char *msg = colon + 1;
    while (msg < end && *msg == ' ')
        msg++;
    fprintf(stderr, "%s:%.*s: %.*s: %.*s\n", file, (int)(q - 1 - num), num, (int)(kend - kind),
            kind, (int)(end - msg), msg);
    return 1;
}

/* Prints a compiler log as file:line messages: NVRTC's "name(12): " becomes
 * "name:12: ", and ptxas lines (PTX input) get the file's name. */
static void print_log(const char *file, const char *log) {
    const char *p = log;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        const char *paren = memchr(p, '(', len);
        int done = print_ptxas_line(file, p, len);
        if (!done && paren && paren > p) {
            const char *q = paren + 1;
            while (q < p + len && *q >= '0' && *q <= '9')
                q++;
            if (q > paren + 1 && q + 2 < p + len && q[0] == ')' && q[1] == ':' && q[2] == ' ') {
                fprintf(stderr, "%.*s:%.*s:%.*s\n", (int)(paren - p), p, (int)(q - paren - 1),
                        paren + 1, (int)(p + len - q - 2), q + 2);
                done = 1;
            }
        }
        if (!done && len)
            fprintf(stderr, "%.*s\n", (int)len, p);
        p += len + (eol ? 1 : 0);
    }
}

static void print_ok(const char *path, const hkp_artifact *a) {
    const hkp_meta *m = &a->meta;
    char buf[16];
    if (m->format == HK_FORMAT_FATBIN) {
        printf("%s: ok (fatbin:", path);
        for (int i = 0; i < m->narchs; i++)
            printf("%s %s", i ? "," : "", hkp_arch_name(m->archs[i], buf, sizeof buf));
        for (int i = 0; i < m->nptx_archs; i++)
            printf("%s compute_%s", (i || m->narchs) ? "," : "",
                   hkp_arch_name(m->ptx_archs[i], buf, sizeof buf) + 3);
        printf(")\n");
        return;
    }
    printf("%s: ok (%d kernel%s%s", path, m->nentries, m->nentries == 1 ? "" : "s",
           m->nentries ? ": " : "");
    for (int i = 0; i < m->nentries; i++)
        printf("%s%s", i ? ", " : "", m->entries[i].name);
    printf(")\n");
}

/* A copy of src with comments, string and character literals blanked, so
 * that a scan for keywords sees code only. */
static char *code_only(const char *src, size_t n) {
    char *c = malloc(n + 1);
    if (!c)
        return NULL;
    memcpy(c, src, n);
    c[n] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (c[i] == '/' && i + 1 < n && c[i + 1] == '/') {
            while (i < n && c[i] != '\n')
                c[i++] = ' ';
        } else if (c[i] == '/' && i + 1 < n && c[i + 1] == '*') {
            size_t j = i;
            while (j < n && !(j > i + 1 && c[j - 1] == '*' && c[j] == '/'))
                j++;
            for (; i <= j && i < n; i++)
                if (c[i] != '\n')
                    c[i] = ' ';
            i--;
        } else if (c[i] == '"' || c[i] == '\'') {
            char q = c[i];
            for (i++; i < n && c[i] != q && c[i] != '\n'; i++) {
                if (c[i] == '\\' && i + 1 < n)
                    c[i++] = ' ';
                c[i] = ' ';
            }
        }
    }
    return c;
}

static int is_word_at(const char *text, const char *p, const char *word) {
    size_t n = strlen(word);
    return strncmp(p, word, n) == 0 && (p == text || !hkp_is_ident_char((unsigned char)p[-1])) &&
           !hkp_is_ident_char((unsigned char)p[n]);
}

/* Finds __global__ functions declared as templates. Writes "name<args>"
 * examples (typename/class parameters become float, the others 1), up to max,
 * into ex; returns how many were found. */
static int template_kernels(const char *src, size_t n, char ex[][160], int max) {
    char *c = code_only(src, n);
    int found = 0;
    if (!c)
        return 0;
    for (char *g = strstr(c, "__global__"); g && found < max; g = strstr(g + 10, "__global__")) {
        if (!is_word_at(c, g, "__global__"))
            continue;
        /* The declaration starts after the previous ';', '{' or '}'. */
        char *start = g;
        while (start > c && start[-1] != ';' && start[-1] != '{' && start[-1] != '}')
            start--;
        char *t = NULL;
        for (char *p = start; p < g; p++)
            if (is_word_at(c, p, "template")) {
                t = p;
                break;
            }
        char *paren = strchr(g, '(');
        if (!t || !paren)
            continue;
        char *e = paren;
        while (e > g && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
            e--;
        char *b = e;
        while (b > g && hkp_is_ident_char((unsigned char)b[-1]))
            b--;
        if (b == e)
            continue;
        /* Template parameters, split at top-level commas. */
        char args[120] = "";
        size_t al = 0;
        char *lt = strchr(t, '<');
        int depth = 0, first = 1;
        for (char *p = lt; p && p < g && al + 8 < sizeof args; p++) {
            if (*p == '<' && depth++ == 0) {
                continue;
            } else if (*p == '>' && --depth == 0) {
                break;
            }
            if (depth == 1 && (p == lt + 1 || p[-1] == ',')) {
                char *q = p;
                while (*q == ' ' || *q == '\t' || *q == '\n')
                    q++;
                int type = is_word_at(c, q, "typename") || is_word_at(c, q, "class");
                al += (size_t)snprintf(args + al, sizeof args - al, "%s%s", first ? "" : ", ",
                                       type ? "float" : "1");
                first = 0;
            }
        }
        snprintf(ex[found++], 160, "%.*s<%s>", (int)(e - b), b, args);
    }
    free(c);
    return found;
}

/* Reports a CUDA C file that built to no kernel because its kernels are
 * templates; returns 1 when it did so. */
static int report_uninstantiated(const char *path, const char *src, size_t n,
                                 const hkp_artifact *a) {
    char ex[8][160];
    if (a->meta.nentries != 0)
        return 0;
    int k = template_kernels(src, n, ex, 8);
    if (!k)
        return 0;
    fprintf(stderr, "%s: error: no kernel was instantiated: ", path);
    for (int i = 0; i < k; i++) {
        const char *lt = strchr(ex[i], '<');
        fprintf(stderr, "%s%.*s", i ? ", " : "", (int)(lt - ex[i]), ex[i]);
    }
    fprintf(stderr,
            " %s; name an instantiation, e.g.\n"
            "  hotkern check --name-expression '%s' %s\n"
            "(in a swap: hk_swap_options.name_expressions; handles then use that name)\n",
            k == 1 ? "is a template" : "are templates", ex[0], path);
    return 1;
}

int hkc_cmd_check(int argc, char **argv) {
    int arch = 90, ptx_only = 0, nopts = 0, nfiles = 0, failed = 0, nexprs = 0;
    const char **opts = calloc((size_t)argc + 1, sizeof *opts);
    const char **exprs = calloc((size_t)argc + 1, sizeof *exprs);
    char **owned = calloc((size_t)argc + 1, sizeof *owned);
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    int nowned = 0, status = 2;

    if (!opts || !owned || !files || !exprs) {
        fprintf(stderr, "hotkern check: out of memory\n");
        status = 1;
        goto out;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            check_usage(stdout);
            status = 0;
            goto out;
        } else if (!strcmp(a, "--arch") || !strncmp(a, "--arch=", 7)) {
            const char *v = a[6] == '=' ? a + 7 : (i + 1 < argc ? argv[++i] : NULL);
            arch = v ? parse_arch(v) : 0;
            if (!arch) {
                fprintf(stderr, "hotkern check: bad --arch '%s' (want e.g. sm_90)\n", v ? v : "");
                goto usage;
            }
        } else if (!strcmp(a, "--ptx-only")) {
            ptx_only = 1;
        } else if (!strcmp(a, "--name-expression") || !strncmp(a, "--name-expression=", 18)) {
            const char *v = a[17] == '=' ? a + 18 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || !v[0]) {
                fprintf(stderr, "hotkern check: --name-expression needs a value\n");
                goto usage;
            }
            exprs[nexprs++] = v;
        } else if ((a[0] == '-' && (a[1] == 'I' || a[1] == 'D'))) {
            const char *v = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || !v[0]) {
                fprintf(stderr, "hotkern check: %c needs a value\n", a[1]);
                goto usage;
            }
            size_t l = strlen(v) + 3;
            char *o = malloc(l);
            if (!o) {
                status = 1;
                goto out;
            }
            snprintf(o, l, "-%c%s", a[1], v);
            owned[nowned++] = o;
            opts[nopts++] = o;
        } else if (!strcmp(a, "--")) {
            while (++i < argc)
                files[nfiles++] = argv[i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "hotkern check: unknown option '%s'\n", a);
            goto usage;
        } else {
            files[nfiles++] = a;
        }
    }
    if (nfiles == 0) {
        fprintf(stderr, "hotkern check: no input files\n");
        goto usage;
    }

    for (int f = 0; f < nfiles; f++) {
        char *data = NULL;
        size_t size = 0;
        int rc = read_input(files[f], &data, &size);
        if (rc) {
            fprintf(stderr, "%s: error: cannot read: %s\n", files[f], strerror(-rc));
            failed++;
            continue;
        }
        hkp_build_opts bo = {
            .arch = arch,
            .ptx_to_cubin = !ptx_only,
            .opt_level = 3,
            .nvrtc_options = opts,
            .nnvrtc_options = nopts,
            .name_expressions = exprs,
            .nname_expressions = nexprs,
            .source_name = files[f],
        };
        hkp_artifact art;
        hk_format fmt;
        char why[512];
        rc = hkp_build(data, size, HK_FORMAT_AUTO, &bo, &art, why, sizeof why);
        if (rc) {
            if (art.log && art.log[0])
                print_log(files[f], art.log);
            /* The log already carries file:line; the reason adds the kind of
             * failure (and is all there is for format and arch refusals). */
            fprintf(stderr, "%s: error: %s (%s)\n", files[f], why[0] ? why : hk_strerror(rc),
                    hk_strerror(rc));
            failed++;
        } else if (nexprs == 0 && art.meta.format != HK_FORMAT_FATBIN &&
                   hkp_detect(data, size, &fmt, NULL, 0) == 0 && fmt == HK_FORMAT_CUDA_C &&
                   report_uninstantiated(files[f], data, size, &art)) {
            failed++;
        } else {
            print_ok(files[f], &art);
        }
        hkp_artifact_free(&art);
        free(data);
        fflush(stdout); /* keep the order of files when stderr interleaves */
    }
    status = failed ? 1 : 0;
    goto out;
usage:
    fprintf(stderr, "Try 'hotkern check --help'.\n");
    status = 2;
out:
    for (int i = 0; i < nowned; i++)
        free(owned[i]);
    free(owned);
    free(opts);
    free(exprs);
    free(files);
    return status;
}

/*
 * hotkern check: build and validate kernel files the way a swap would.
 *
 * Meant for editors and CI: the public hk_checker (hotkern.h, "checking
 * without a GPU") runs the same build path as the runtime (NVRTC, nvJitLink,
 * the metadata parsers, the architecture check) without a GPU or driver,
 * and this file prints compiler messages as "file:line: ..." so that editors
 * and terminals can jump to them; with --json the same messages come as
 * "diagnostics" records ({file, line, severity, message}) of each file. No
 * compile cache is used, so every run really compiles; one checker serves
 * every file of a run, so NVRTC's precompiled header of the toolkit's
 * headers is made once (--no-reuse checks each file with hk_check alone).
 * The toolkit's headers (cub, cuda::std, cooperative_groups, cuda_fp16 ...)
 * are found without -I, as in a swap.
 *
 * C++ kernel names are entry names, mangled; each is shown demangled beside
 * (libstdc++'s __cxa_demangle, the demangler the toolchain itself uses).
 *
 * A file whose kernels are all templates compiles to nothing: NVRTC
 * instantiates only what is named. Rather than report "0 kernels", check
 * says which templates it saw and how to name an instantiation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <nvrtc.h>

#include "cli/cli.h"
#include "util/util.h"

static const char check_help[] =
    "usage: hotkern check [--arch sm_XY] [-I DIR] [-D NAME[=VALUE]]\n"
    "                     [--name-expression EXPR]... [--ptx-only] [--no-reuse] [--json]\n"
    "                     FILE...\n"
    "\n"
    "Compiles and validates each FILE (CUDA C, PTX, cubin or fatbin, detected from\n"
    "its content) for one GPU architecture, as hotkern would before a swap.\n"
    "\n"
    "  --arch sm_XY   target architecture (default sm_90; '90' also works), one this\n"
    "                 NVRTC compiles for: another is a usage error that lists them\n"
    "  -I DIR         add DIR to the include path of CUDA C files\n"
    "  -D NAME[=VAL]  define a macro for CUDA C files\n"
    "  --name-expression EXPR\n"
    "                 instantiate a template kernel, e.g. 'scale<float>' (as\n"
    "                 hk_swap_options.name_expressions does); may be repeated\n"
    "  --ptx-only     stop at PTX: CUDA C is compiled to PTX and PTX is only parsed,\n"
    "                 not linked to a cubin\n"
    "  --no-reuse     check each file on its own: no precompiled header or include\n"
    "                 search path shared between files (slower; for comparison)\n" HKC_JSON_HELP
    "  -h, --help     show this help\n"
    "\n"
    "Prints 'FILE: ok (N kernels: ...)' (a fatbin's architectures first, its\n"
    "kernels read from the members it stores uncompressed), a line 'MANGLED =\n"
    "DEMANGLED' per C++ kernel name, or the compiler's messages as file:line.\n"
    "A file whose kernels are all templates, none of them instantiated, fails\n"
    "with the templates' names and a --name-expression to try.\n"
    "Exit status: 0 all files ok, 1 a file failed, 2 usage error.\n";

/* "sm_90", "sm_90a", "compute_90" or "90" into o's arch; 0, or
 * HK_ERR_FORMAT when it is none of these. */
static int parse_arch(const char *s, hk_check_options *o) {
    if (!strncmp(s, "sm_", 3))
        s += 3;
    else if (!strncmp(s, "compute_", 8))
        s += 8;
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 10 || v > 9999)
        return HK_ERR_FORMAT;
    o->arch = (int)v;
    o->arch_specific = *end == 'a' && end[1] == '\0';
    return *end && !o->arch_specific ? HK_ERR_FORMAT : 0;
}

/* The architectures this NVRTC compiles for, as "sm_75, sm_80, ..." in buf;
 * 0, or HK_ERR_UNSUPPORTED when NVRTC cannot say (then any architecture is
 * let through, and the build says what it thinks). */
static int supported_archs(int *v, int max, int *n, char *buf, size_t cap) {
    int num = 0;
    size_t used = 0;
    if (nvrtcGetNumSupportedArchs(&num) != NVRTC_SUCCESS || num <= 0 || num > max ||
        nvrtcGetSupportedArchs(v) != NVRTC_SUCCESS)
        return HK_ERR_UNSUPPORTED;
    buf[0] = '\0';
    for (int i = 0; i < num && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%ssm_%d", i ? ", " : "", v[i]);
    *n = num;
    return 0;
}

/* --arch as given, checked against what NVRTC supports: 0, or a usage error
 * (2) that lists the architectures. */
static int take_arch(hkc_out *o, const char *arch_s, hk_check_options *opt) {
    int v[128], n = 0, known = 0;
    char list[1024];
    int have = supported_archs(v, (int)(sizeof v / sizeof v[0]), &n, list, sizeof list) == 0;
    int parsed = parse_arch(arch_s, opt) == 0;
    for (int i = 0; parsed && have && i < n; i++)
        known |= v[i] == opt->arch;
    if (parsed && (known || !have))
        return 0;
    if (!have)
        return hkc_usage(o, "bad --arch '%s' (want e.g. sm_90)", arch_s);
    return hkc_usage(o,
                     "unknown --arch '%s': this NVRTC compiles for %s (each also as XY or "
                     "compute_XY, and sm_XYa where the architecture has one)",
                     arch_s, list);
}

/* As the PTX lexer's (ptx/ptx.h): C identifiers, and '$' and '%'. */
static int is_ident_char(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '$' || c == '%';
}

/* ---- compiler messages --------------------------------------------------- */

/* One "file:line: kind: message" of a compiler log. */
struct diag {
    const char *file, *line, *kind, *msg;
    int file_len, line_len, kind_len, msg_len;
};

/* Splits "kind: message" (kind without spaces before its colon, as NVRTC's
 * "error" or "warning #550-D") into d; without a kind, all is message. */
static void split_kind(const char *p, const char *end, struct diag *d) {
    while (p < end && *p == ' ')
        p++;
    const char *colon = memchr(p, ':', (size_t)(end - p));
    d->kind = p;
    d->kind_len = 0;
    if (colon && colon > p && colon + 1 < end && colon[1] == ' ' &&
        (!strncmp(p, "error", 5) || !strncmp(p, "warning", 7) || !strncmp(p, "remark", 6) ||
         !strncmp(p, "catastrophic error", 18))) {
        d->kind_len = (int)(colon - p);
        p = colon + 1;
        while (p < end && *p == ' ')
            p++;
    }
    d->msg = p;
    d->msg_len = (int)(end - p);
}

/* A ptxas line "ptxas application ptx input, line 6; error   : msg" (the
 * file is the one being checked). Returns 1 when the line has that shape. */
static int ptxas_diag(const char *file, const char *p, size_t len, struct diag *d) {
    static const char prefix[] = "ptxas application ptx input, line ";
    size_t pl = sizeof prefix - 1;
    if (len <= pl || strncmp(p, prefix, pl) != 0)
        return 0;
    const char *q = p + pl, *end = p + len, *num = q;
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
    *d = (struct diag){.file = file,
                       .file_len = (int)strlen(file),
                       .line = num,
                       .line_len = (int)(q - 1 - num),
                       .kind = kind,
                       .kind_len = (int)(kend - kind),
                       .msg = msg,
                       .msg_len = (int)(end - msg)};
    return 1;
}

/* An NVRTC line "name(12): error: msg". Returns 1 when the line has that shape. */
static int nvrtc_diag(const char *p, size_t len, struct diag *d) {
    const char *paren = memchr(p, '(', len), *end = p + len;
    if (!paren || paren == p)
        return 0;
    const char *q = paren + 1;
    while (q < end && *q >= '0' && *q <= '9')
        q++;
    if (q == paren + 1 || q + 2 >= end || q[0] != ')' || q[1] != ':' || q[2] != ' ')
        return 0;
    d->file = p;
    d->file_len = (int)(paren - p);
    d->line = paren + 1;
    d->line_len = (int)(q - paren - 1);
    split_kind(q + 2, end, d);
    return 1;
}

static const char *severity(const struct diag *d) {
    if (!d->kind_len)
        return "note";
    return memmem(d->kind, (size_t)d->kind_len, "error", 5) ? "error"
           : !strncmp(d->kind, "warning", 7)                ? "warning"
                                                            : "note";
}

static cJSON *diag_json(const struct diag *d) {
    cJSON *o = cJSON_CreateObject();
    char *f = strndup(d->file, (size_t)d->file_len), *m = strndup(d->msg, (size_t)d->msg_len);
    if (o && f && m) {
        cJSON_AddStringToObject(o, "file", f);
        cJSON_AddNumberToObject(o, "line", strtol(d->line, NULL, 10));
        cJSON_AddStringToObject(o, "severity", severity(d));
        cJSON_AddStringToObject(o, "message", m);
    }
    free(f);
    free(m);
    return o;
}

/* A compiler log as file:line messages on stderr (NVRTC's "name(12): "
 * becomes "name:12: ", ptxas lines get the file's name, other lines stay as
 * they are), or, given diags, its file:line messages as records there. */
static void emit_log(const char *file, const char *log, cJSON *diags) {
    for (const char *p = log; *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        /* Filled by the parser that returns 1; zeroed because GCC at -O1 (the
         * thread-sanitizer build) cannot tell and warns. */
        struct diag d = {0};
        int is_diag = ptxas_diag(file, p, len, &d) || nvrtc_diag(p, len, &d);
        if (diags && is_diag)
            cJSON_AddItemToArray(diags, diag_json(&d));
        else if (!diags && is_diag)
            fprintf(stderr, "%.*s:%.*s: %.*s%s%.*s\n", d.file_len, d.file, d.line_len, d.line,
                    d.kind_len, d.kind, d.kind_len ? ": " : "", d.msg_len, d.msg);
        else if (!diags && len)
            fprintf(stderr, "%.*s\n", (int)len, p);
        p += len + (eol ? 1 : 0);
    }
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
    return strncmp(p, word, n) == 0 && (p == text || !is_ident_char((unsigned char)p[-1])) &&
           !is_ident_char((unsigned char)p[n]);
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
        while (b > g && is_ident_char((unsigned char)b[-1]))
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

/* A CUDA C file that built to no kernel because its kernels are templates:
 * writes the explanation into msg and returns 1. */
static int uninstantiated(const char *path, const char *src, size_t n, const hk_check_result *r,
                          char *msg, size_t cap) {
    char ex[8][160];
    if (hk_check_result_kernel_count(r) != 0)
        return 0;
    int k = template_kernels(src, n, ex, 8);
    if (!k)
        return 0;
    size_t len = (size_t)snprintf(msg, cap, "no kernel was instantiated: ");
    for (int i = 0; i < k && len < cap; i++) {
        const char *lt = strchr(ex[i], '<');
        len += (size_t)snprintf(msg + len, cap - len, "%s%.*s", i ? ", " : "", (int)(lt - ex[i]),
                                ex[i]);
    }
    if (len < cap)
        snprintf(msg + len, cap - len,
                 " %s; name an instantiation, e.g.\n"
                 "  hotkern check --name-expression '%s' %s\n"
                 "(in a swap: hk_swap_options.name_expressions; handles then use that name)",
                 k == 1 ? "is a template" : "are templates", ex[0], path);
    return 1;
}

/* ---- one file -------------------------------------------------------------- */

/* What one file came to: its JSON record (NULL in text mode). */
struct file_result {
    hkc_out *o;
    const char *path;
    cJSON *rec;
};

/* libstdc++'s demangler (cxxabi.h declares it in C++; it has C linkage). */
char *__cxa_demangle(const char *mangled, char *buf, size_t *len, int *status);

/* The C++ name of a mangled kernel name, malloc'd; NULL for a C name or one
 * the demangler does not take. */
static char *demangled(const char *name) {
    int status = 0;
    if (strncmp(name, "_Z", 2) != 0)
        return NULL;
    char *d = __cxa_demangle(name, NULL, NULL, &status);
    if (status != 0) {
        free(d);
        return NULL;
    }
    return d;
}

/* A file that built: "FILE: ok (N kernels: a, b)", for a fatbin "FILE: ok
 * (fatbin: sm_80, compute_90; N kernels: a, b)", then a line per C++ kernel,
 * "  _Z5scaleIfEvPT_ = void scale<float>(float*)"; in JSON mode the record's
 * kernels, their demangled names (null for C names) and archs: the image's
 * (a cubin's SM, the architecture CUDA C was built for, a fatbin's). */
static void report_ok(struct file_result *fr, const hk_check_result *r) {
    hk_format fmt;
    (void)hk_check_result_image(r, NULL, &fmt);
    int nk = hk_check_result_kernel_count(r), na = hk_check_result_arch_count(r);
    const char *name = NULL;
    if (fr->rec) {
        cJSON *k = cJSON_GetObjectItemCaseSensitive(fr->rec, "kernels");
        cJSON *dm = cJSON_GetObjectItemCaseSensitive(fr->rec, "demangled");
        cJSON *ar = cJSON_GetObjectItemCaseSensitive(fr->rec, "archs");
        for (int i = 0; i < nk && hk_check_result_kernel(r, i, &name, NULL, NULL) >= 0; i++) {
            char *d = demangled(name);
            cJSON_AddItemToArray(k, cJSON_CreateString(name));
            cJSON_AddItemToArray(dm, d ? cJSON_CreateString(d) : cJSON_CreateNull());
            free(d);
        }
        for (int i = 0; i < na; i++)
            cJSON_AddItemToArray(ar, cJSON_CreateString(hk_check_result_arch(r, i)));
        return;
    }
    printf("%s: ok (", fr->path);
    if (fmt == HK_FORMAT_FATBIN) {
        printf("fatbin:");
        for (int i = 0; i < na; i++)
            printf("%s %s", i ? "," : "", hk_check_result_arch(r, i));
        printf("; ");
    }
    printf("%d kernel%s%s", nk, nk == 1 ? "" : "s", nk ? ": " : "");
    for (int i = 0; i < nk && hk_check_result_kernel(r, i, &name, NULL, NULL) >= 0; i++)
        printf("%s%s", i ? ", " : "", name);
    if (fmt == HK_FORMAT_FATBIN && !nk)
        printf(" read: a member nvcc compressed is not read");
    printf(")\n");
    for (int i = 0; i < nk && hk_check_result_kernel(r, i, &name, NULL, NULL) >= 0; i++) {
        char *d = demangled(name);
        if (d)
            printf("  %s = %s\n", name, d);
        free(d);
    }
}

/* A file that failed: "FILE: error: ..." after its log's messages, or its
 * record's error fields (the document's too, for the first failure). Returns 1. */
static int report_error(struct file_result *fr, int err, const char *log, const char *msg) {
    if (!fr->rec) {
        if (log && log[0])
            emit_log(fr->path, log, NULL);
        fprintf(stderr, "%s: error: %s\n", fr->path, msg);
        return 1;
    }
    cJSON_ReplaceItemInObjectCaseSensitive(fr->rec, "error", cJSON_CreateString(hk_err_name(err)));
    cJSON_ReplaceItemInObjectCaseSensitive(fr->rec, "code", hkc_int(err));
    cJSON_ReplaceItemInObjectCaseSensitive(fr->rec, "message", cJSON_CreateString(msg));
    if (log && log[0]) {
        cJSON_ReplaceItemInObjectCaseSensitive(fr->rec, "log", cJSON_CreateString(log));
        emit_log(fr->path, log, cJSON_GetObjectItemCaseSensitive(fr->rec, "diagnostics"));
    }
    return hkc_fail(fr->o, err, log, "%s: %s", fr->path, msg);
}

/* The record of one file, every field present: {"file", "ok", "format",
 * "kernels", "demangled", "archs", "error", "code", "message", "log",
 * "diagnostics"}. */
static cJSON *file_record(hkc_out *o, const char *path) {
    cJSON *r = o->json ? cJSON_CreateObject() : NULL;
    if (!r)
        return NULL;
    cJSON_AddStringToObject(r, "file", path);
    cJSON_AddFalseToObject(r, "ok");
    cJSON_AddNullToObject(r, "format");
    cJSON_AddArrayToObject(r, "kernels");
    cJSON_AddArrayToObject(r, "demangled");
    cJSON_AddArrayToObject(r, "archs");
    cJSON_AddNullToObject(r, "error");
    cJSON_AddNumberToObject(r, "code", 0);
    cJSON_AddNullToObject(r, "message");
    cJSON_AddNullToObject(r, "log");
    cJSON_AddArrayToObject(r, "diagnostics");
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o->doc, "files"), r);
    return r;
}

/* How the files of one run are checked: with one checker, or (--no-reuse)
 * each with hk_check and the options alone. */
struct checking {
    hk_checker *checker; /* NULL: hk_check */
    hk_check_options opt;
};

/* Builds one file; returns 0 when it is ok, else 1 (reported). */
static int check_file(hkc_out *o, const char *path, struct checking *ck) {
    struct file_result fr = {.o = o, .path = path, .rec = file_record(o, path)};
    hk_report rep = HK_REPORT_INIT;
    char *data = NULL, msg[1024];
    size_t size = 0;
    hk_format fmt = HK_FORMAT_AUTO;
    hk_check_result *res = NULL;
    int failed = 1, rc;
    if (hku_read_file(path, HKC_MAX_INPUT, &data, &size, &rep)) {
        snprintf(msg, sizeof msg, "cannot read: %s", rep.message);
        report_error(&fr, rep.error, NULL, msg);
        hk_report_clear(&rep);
        return 1;
    }
    if (hk_format_detect(data, size, &fmt, NULL) == 0 && fr.rec)
        cJSON_ReplaceItemInObjectCaseSensitive(fr.rec, "format",
                                               cJSON_CreateString(hk_format_name(fmt)));
    if (ck->checker) {
        rc = hk_checker_check(ck->checker, path, data, size, &res, &rep);
    } else {
        ck->opt.source_name = path;
        rc = hk_check(&ck->opt, data, size, &res, &rep);
    }
    if (rc) {
        /* The log carries file:line; the reason adds the kind of failure
         * (and is all there is for format and arch refusals). */
        snprintf(msg, sizeof msg, "%s (%s)", rep.message[0] ? rep.message : hk_strerror(rc),
                 hk_strerror(rc));
        report_error(&fr, rc, rep.log, msg);
    } else if (ck->opt.nname_expressions == 0 && fmt == HK_FORMAT_CUDA_C &&
               uninstantiated(path, data, size, res, msg, sizeof msg)) {
        report_error(&fr, HK_ERR_NOT_FOUND, NULL, msg);
    } else {
        report_ok(&fr, res);
        if (fr.rec)
            cJSON_ReplaceItemInObjectCaseSensitive(fr.rec, "ok", cJSON_CreateTrue());
        failed = 0;
    }
    hk_check_result_free(res);
    hk_report_clear(&rep);
    free(data);
    fflush(stdout); /* keep the order of files when stderr interleaves */
    return failed;
}

/* "-I" + each directory and "-D" + each definition, for NVRTC; NULL when out
 * of memory. Free each string and the array. */
static char **nvrtc_options(const hkc_list *inc, const hkc_list *def) {
    char **v = calloc((size_t)(inc->n + def->n) + 1, sizeof *v);
    for (int i = 0; v && i < inc->n + def->n; i++) {
        int is_inc = i < inc->n;
        const char *val = is_inc ? inc->v[i] : def->v[i - inc->n];
        if (asprintf(&v[i], "-%c%s", is_inc ? 'I' : 'D', val) < 0) {
            v[i] = NULL;
            for (int j = 0; j < i; j++)
                free(v[j]);
            free(v);
            return NULL;
        }
    }
    return v;
}

static int check_files(hkc_out *o, const char *arch_s, int ptx_only, int no_reuse,
                       const hkc_list *inc, const hkc_list *def, const hkc_list *exprs,
                       char **files, int nfiles) {
    struct checking ck = {0};
    hk_report rep = HK_REPORT_INIT;
    int failed = 0;
    char buf[16];
    hk_check_options_init(&ck.opt);
    ck.opt.arch = 90;
    if (arch_s && take_arch(o, arch_s, &ck.opt))
        return 2;
    if (nfiles == 0)
        return hkc_usage(o, "no input files");
    char **opts = nvrtc_options(inc, def);
    if (!opts)
        return hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    snprintf(buf, sizeof buf, "sm_%d%s", ck.opt.arch, ck.opt.arch_specific ? "a" : "");
    hkc_set_str(o, "arch", buf);
    hkc_set(o, "files", cJSON_CreateArray());
    ck.opt.ptx_mode = ptx_only ? HK_PTX_DRIVER_JIT : HK_PTX_NVJITLINK;
    ck.opt.nvrtc_options = (const char *const *)opts;
    ck.opt.nnvrtc_options = inc->n + def->n;
    ck.opt.name_expressions = exprs->v;
    ck.opt.nname_expressions = exprs->n;
    if (nfiles > 1)
        (void)hk_build_keep_memory(NULL); /* one compile after another, in this process */
    if (!no_reuse && hk_checker_create(&ck.checker, &ck.opt, &rep) < 0)
        failed = hkc_fail_report(o, &rep);
    else
        for (int f = 0; f < nfiles; f++)
            failed += check_file(o, files[f], &ck);
    hk_checker_destroy(ck.checker);
    hk_report_clear(&rep);
    for (int i = 0; i < inc->n + def->n; i++)
        free(opts[i]);
    free(opts);
    return failed ? 1 : 0;
}

int hkc_cmd_check(int argc, char **argv) {
    const char *arch = NULL;
    int ptx_only = 0, no_reuse = 0, json = 0, nargs = 0;
    hkc_list inc = {0}, def = {0}, exprs = {0};
    const hkc_opt opts[] = {
        HKC_STRING_OPT("--arch", &arch),
        {.letter = 'I', .kind = HKC_LIST, .dst = &inc}, /* -I DIR, no long form */
        {.letter = 'D', .kind = HKC_LIST, .dst = &def},
        HKC_LIST_OPT("--name-expression", &exprs),
        HKC_FLAG_OPT("--ptx-only", &ptx_only),
        HKC_FLAG_OPT("--no-reuse", &no_reuse),
        HKC_JSON_OPT(&json),
    };
    hkc_out o;
    int rc = hkc_parse(&o, "check", opts, HKC_NOPTS(opts), check_help, argc, argv, &nargs);
    if (rc == HKC_CONTINUE)
        rc = check_files(&o, arch, ptx_only, no_reuse, &inc, &def, &exprs, argv + 1, nargs);
    hkc_list_free(&inc);
    hkc_list_free(&def);
    hkc_list_free(&exprs);
    return hkc_finish(&o, rc);
}

/*
 * NVRTC: CUDA C to a cubin or PTX, in this process.
 *
 * One compile makes the program (the source, its in-memory headers), its
 * command line (the arch, the profile's options, the caller's, the
 * toolkit's include directories, the PCH's), compiles, and takes the image
 * and the lowered names of its name expressions. The precompiled header
 * and the development profile's fast compiles each have a section below
 * saying what they do and what they were measured to gain.
 *
 * Threads: any number of compiles at once (NVRTC programs are independent);
 * the PCH heap is process-wide, so resizing it waits for the compiles that
 * use it (pch_lock, this file's alone).
 */
#include <limits.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/build.h"

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
                if (hkp_resolve_include(name, close == '"', sp->srcdir, sp, path, &mem, NULL) ==
                        1 &&
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
 * without it when it fails all the same (hkp_nvrtc_build). Its implicit prefix
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
        if (hkp_find_mem(sp, name) < 0)
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
int hkp_nvrtc_build(const char *src, const hkp_build_opts *o, const search_path *sp,
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

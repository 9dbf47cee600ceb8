/*
 * The canary's trap guard: a copy of a version's PTX in which every
 * instruction that raises an exception on purpose stores what it was into a
 * global and ends its thread instead.
 *
 * Why. A `__trap()`, a failed device-side `assert()` (a call of the
 * driver's __assertfail, which prints and traps) and a `__brkpt()` raise an
 * imprecise exception: the hardware ends the whole context, and the device's
 * recovery stalls every other context on the GPU, the live program's too
 * (bench/RESULTS.md, section 21). compute-sanitizer cannot help: an
 * imprecise error ends the context whatever it is told. So the canary does
 * not run such an instruction at all. Its test launches run this copy,
 * in which each one became
 *
 *     [@p] st.global.u32 [__hotkern_trap], CODE;
 *     [@p] exit;
 *
 * with CODE = site << 2 | kind (the site's number in text order, from 1):
 * the thread that would have trapped ends, the others finish, the launch
 * comes back with CUDA_SUCCESS, and the helper reads __hotkern_trap to know
 * that, and where, the version would have trapped. The rest of the PTX is
 * the same text, so the copy computes what the version computes everywhere
 * else. The image that commits is never this copy.
 *
 * What is rewritten: a statement in a function's body whose opcode is
 * `trap` or `brkpt`, and a whole `call` (its parentheses balanced) whose
 * callee is `__assertfail`, each with its guard predicate kept.
 * Statements are found with meta_ptx.c's lexer (comments and strings
 * skipped): an opcode is the first token after `;`, `{`, `}`, a label's `:`
 * or the start, past an `@[!]pred` guard; a register or a label named like
 * an opcode is therefore never taken for one. The global is declared right
 * after the module's header (.version, .target, .address_size), before
 * any code.
 *
 * Input is untrusted (a pushed PTX): it is only read within its bounds, and
 * anything this cannot make sense of leaves the version unguarded rather
 * than guarded wrongly (HK_ERR_FORMAT): the copy must read, to meta_ptx.c's
 * parser, as the same kernels with the same parameters plus the one global,
 * and nvJitLink then checks what comes out. Fuzzed by
 * tests/fuzz/fuzz_guard.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/ptx.h"

#define MAX_SITES (1 << 20) /* CODE must fit a u32 with the kind's 2 bits */

static int tok_ident(const hkp_tok *t) {
    return t->n && hkp_is_ident_char((unsigned char)t->s[0]);
}

const char *hkp_guard_kind_text(unsigned kind) {
    switch (kind) {
    case HKP_GUARD_TRAP:
        return "a trap instruction (__trap() or asm(\"trap;\"))";
    case HKP_GUARD_BRKPT:
        return "a breakpoint instruction (__brkpt())";
    case HKP_GUARD_ASSERT:
        return "a failed device-side assert() (a call of __assertfail)";
    default:
        return "an instruction the guard does not know";
    }
}

/* A growing output text. */
typedef struct out_text {
    char *p;
    size_t n, cap;
    int nomem;
} out_text;

static void put(out_text *o, const char *s, size_t n) {
    if (o->nomem || !n)
        return;
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < o->n + n + 1)
            cap *= 2;
        char *q = realloc(o->p, cap);
        if (!q) {
            o->nomem = 1;
            return;
        }
        o->p = q;
        o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void puts_(out_text *o, const char *s) {
    put(o, s, strlen(s));
}

/* One site: the statement [start, end) (its guard, if any, included) and
 * the guard's text. */
typedef struct site {
    size_t start, end;
    size_t gstart, gend; /* guard text "@!%p1"; gstart == gend: none */
    unsigned kind;
} site;

typedef struct scan {
    site *v;
    int n, cap;
    size_t decl_at; /* where the global's declaration goes (header's end); 0: none */
    int nomem;
} scan;

static int add_site(scan *sc, const site *s) {
    if (sc->n == MAX_SITES)
        return HK_ERR_FORMAT;
    if (sc->n == sc->cap) {
        int cap = sc->cap ? sc->cap * 2 : 8;
        site *v = realloc(sc->v, (size_t)cap * sizeof *v);
        if (!v)
            return HK_ERR_NOMEM;
        sc->v = v;
        sc->cap = cap;
    }
    sc->v[sc->n++] = *s;
    return 0;
}

/* After `call`: its modifiers, a return list "(...)," and then the callee.
 * 1 when the callee is __assertfail, with *end past the statement's ';'. */
static int call_is_assert(hkp_lexer *lx, size_t *end) {
    hkp_tok t;
    int more;
    while ((more = hkp_lex_next(lx, &t)) && t.s[0] == '.')
        ;
    if (more && hkp_tok_is(&t, "(")) { /* the return list: names and commas only */
        while ((more = hkp_lex_next(lx, &t)) && (tok_ident(&t) || hkp_tok_is(&t, ",")))
            ;
        if (!more || !hkp_tok_is(&t, ")") || !hkp_lex_next(lx, &t) || !hkp_tok_is(&t, ","))
            return 0;
        more = hkp_lex_next(lx, &t);
    }
    if (!more || !hkp_tok_is(&t, "__assertfail"))
        return 0;
    /* Its arguments, to the ';': names, commas and balanced parentheses
     * only (a statement that is not whole is no site). */
    int depth = 0;
    while ((more = hkp_lex_next(lx, &t)) && depth >= 0 &&
           (tok_ident(&t) || hkp_tok_is(&t, ",") || hkp_tok_is(&t, "(") || hkp_tok_is(&t, ")")))
        depth += hkp_tok_is(&t, "(") - hkp_tok_is(&t, ")");
    if (!more || !hkp_tok_is(&t, ";") || depth != 0)
        return 0;
    *end = (size_t)(t.s + 1 - lx->s);
    return 1;
}

/* The statement that starts with token t (lx just past it): a site (1, lx
 * then past its ';'), or not (0, lx as it was); < 0 on an error. */
static int statement(hkp_lexer *lx, hkp_tok t, scan *sc) {
    hkp_lexer p = *lx;
    site s = {.start = (size_t)(t.s - lx->s)};
    if (hkp_tok_is(&t, "@")) {
        s.gstart = s.start;
        if (!hkp_lex_next(&p, &t) || (hkp_tok_is(&t, "!") && !hkp_lex_next(&p, &t)) ||
            !tok_ident(&t))
            return 0;
        s.gend = (size_t)(t.s + t.n - lx->s);
        if (!hkp_lex_next(&p, &t))
            return 0;
    }
    if (hkp_tok_is(&t, "trap") || hkp_tok_is(&t, "brkpt")) {
        s.kind = hkp_tok_is(&t, "trap") ? HKP_GUARD_TRAP : HKP_GUARD_BRKPT;
        hkp_tok semi;
        if (!hkp_lex_next(&p, &semi) || !hkp_tok_is(&semi, ";"))
            return 0;
        s.end = (size_t)(semi.s + 1 - lx->s);
    } else if (!hkp_tok_is(&t, "call") || !call_is_assert(&p, &s.end)) {
        return 0;
    } else {
        s.kind = HKP_GUARD_ASSERT;
    }
    int rc = add_site(sc, &s);
    *lx = p;
    return rc < 0 ? rc : 1;
}

/* The module's header: the .version, .target and .address_size directives
 * PTX opens with (nothing before them but comments). Returns where it ends,
 * just after the last one's operands (0: none), with lx after it. Each
 * directive takes exactly its operands: .version and .address_size one,
 * .target a list of names separated by commas; whatever follows on the same
 * line is the module's, and is read for sites. The guard's declaration goes
 * there: at module scope, before any code. */
static size_t header(hkp_lexer *lx) {
    size_t end = 0;
    hkp_tok t;
    for (;;) {
        hkp_lexer at = *lx;
        if (!hkp_lex_next(&at, &t) || !t.bol ||
            !(hkp_tok_is(&t, ".version") || hkp_tok_is(&t, ".target") ||
              hkp_tok_is(&t, ".address_size")))
            return end;
        int list = hkp_tok_is(&t, ".target");
        if (!hkp_lex_next(&at, &t) || t.bol)
            return end;
        for (hkp_lexer next = at; list && hkp_lex_next(&next, &t) && hkp_tok_is(&t, ",");) {
            if (!hkp_lex_next(&next, &t))
                break;
            at = next;
        }
        *lx = at;
        end = at.i;
    }
}

/* Finds every site and where the declaration goes. */
static int find_sites(const char *ptx, size_t n, scan *sc) {
    hkp_lexer lx = {.s = ptx, .n = n, .i = 0, .bol = 1, .bad = 0};
    hkp_tok t;
    int at_start = 1, line_dir = 0, depth = 0, rc = 0;
    sc->decl_at = header(&lx);
    while (rc >= 0 && hkp_lex_next(&lx, &t)) {
        /* .loc and .file (-lineinfo, -G) end with their line, not a ';'. */
        if (line_dir && t.bol)
            at_start = 1, line_dir = 0;
        if (at_start && (hkp_tok_is(&t, ".loc") || hkp_tok_is(&t, ".file")))
            line_dir = 1;
        /* Instructions live in function bodies only: at module scope a
         * "trap;" is no instruction, and is left for nvJitLink to refuse. */
        if (at_start && depth > 0 && (rc = statement(&lx, t, sc)) != 0)
            continue; /* a site, read to its ';' (or an error) */
        depth += hkp_tok_is(&t, "{") - hkp_tok_is(&t, "}");
        /* Otherwise read on token by token: the next statement starts
         * after a ';', a brace or a label's ':'. */
        at_start = hkp_tok_is(&t, ";") || hkp_tok_is(&t, "{") || hkp_tok_is(&t, "}") ||
                   hkp_tok_is(&t, ":");
    }
    if (rc >= 0 && lx.bad)
        rc = HK_ERR_FORMAT;
    return rc < 0 ? rc : 0;
}

/* 1 when b has a's kernels, with the same parameters, and a's globals and
 * the guard's one more. */
static int same_module(const hkp_meta *a, const hkp_meta *b) {
    if (a->nentries != b->nentries || a->nglobals + 1 != b->nglobals)
        return 0;
    for (int i = 0; i < a->nentries; i++) {
        const hkp_entry *x = &a->entries[i], *y = &b->entries[i];
        if (strcmp(x->name, y->name) || x->nparams != y->nparams ||
            (x->nparams && memcmp(x->params, y->params, (size_t)x->nparams * sizeof *x->params)))
            return 0;
    }
    int found = 0;
    for (int i = 0; i < b->nglobals; i++)
        found += !strcmp(b->globals[i].name, HKP_GUARD_SYMBOL);
    return found == 1;
}

/* The copy must read as the version did, plus the guard's global: the
 * metadata parser sees module structure (bodies, declarations) its own way,
 * and where it reads the two differently (text no compiler writes, braces
 * that do not pair), the copy is not one to test in the version's place.
 * PTX that parser refuses is left to nvJitLink, for the copy as for the
 * image. 0, HK_ERR_FORMAT or HK_ERR_NOMEM. */
static int same_as_version(const char *ptx, size_t n, const char *copy, size_t cn) {
    hkp_meta a, b;
    int rc = hkp_meta_read(ptx, n, HK_FORMAT_PTX, &a, NULL, 0);
    if (rc)
        return rc == HK_ERR_NOMEM ? rc : 0;
    rc = hkp_meta_read(copy, cn, HK_FORMAT_PTX, &b, NULL, 0);
    if (rc == 0) {
        rc = same_module(&a, &b) ? 0 : HK_ERR_FORMAT;
        hkp_meta_free(&b);
    } else if (rc != HK_ERR_NOMEM) {
        rc = HK_ERR_FORMAT;
    }
    hkp_meta_free(&a);
    return rc;
}

int hkp_guard_ptx(const char *ptx, size_t n, char **out, size_t *out_n, int *sites, char *why,
                  size_t why_size) {
    *out = NULL;
    *out_n = 0;
    *sites = 0;
    while (n && ptx[n - 1] == '\0')
        n--;
    if (memchr(ptx, '\0', n)) {
        hkp_why(why, why_size, "trap guard: a NUL inside the PTX");
        return HK_ERR_FORMAT;
    }
    scan sc = {0};
    int rc = find_sites(ptx, n, &sc);
    if (rc == HK_ERR_FORMAT)
        hkp_why(why, why_size, "trap guard: %s",
                sc.n == MAX_SITES ? "too many sites" : "unterminated comment or string");
    if (rc || !sc.n) {
        free(sc.v);
        return rc;
    }
    if (!sc.decl_at) {
        free(sc.v);
        hkp_why(why, why_size, "trap guard: the PTX does not open with .version or .target");
        return HK_ERR_FORMAT;
    }
    /* The symbol is ours: PTX that names it already is not guarded. */
    for (size_t i = 0, l = strlen(HKP_GUARD_SYMBOL); i + l <= n; i++)
        if (ptx[i] == HKP_GUARD_SYMBOL[0] && !memcmp(ptx + i, HKP_GUARD_SYMBOL, l)) {
            free(sc.v);
            hkp_why(why, why_size, "trap guard: the PTX already names %s", HKP_GUARD_SYMBOL);
            return HK_ERR_FORMAT;
        }
    out_text o = {0};
    put(&o, ptx, sc.decl_at);
    puts_(&o, "\n.visible .global .align 4 .u32 " HKP_GUARD_SYMBOL ";");
    size_t at = sc.decl_at;
    for (int i = 0; i < sc.n; i++) {
        const site *s = &sc.v[i];
        char code[48];
        unsigned value = (unsigned)(i + 1) << 2 | s->kind;
        const char *guard = ptx + s->gstart;
        size_t glen = s->gend - s->gstart; /* a predicate's name may be long */
        put(&o, ptx + at, s->start - at);
        put(&o, guard, glen);
        snprintf(code, sizeof code, "%sst.global.u32 [", glen ? " " : "");
        puts_(&o, code);
        snprintf(code, sizeof code, "%s], %u;\n\t", HKP_GUARD_SYMBOL, value);
        puts_(&o, code);
        put(&o, guard, glen);
        puts_(&o, glen ? " exit;" : "exit;");
        at = s->end;
    }
    put(&o, ptx + at, n - at);
    put(&o, "", 1); /* the NUL, counted as an artifact's PTX counts it */
    *sites = sc.n;
    free(sc.v);
    if (!o.nomem && (rc = same_as_version(ptx, n, o.p, o.n)) != 0) {
        free(o.p);
        *sites = 0;
        if (rc == HK_ERR_FORMAT)
            hkp_why(why, why_size, "trap guard: the copy would not read as the same kernels");
        return rc;
    }
    if (o.nomem) {
        free(o.p);
        *sites = 0;
        return HK_ERR_NOMEM;
    }
    *out = o.p;
    *out_n = o.n;
    return 0;
}

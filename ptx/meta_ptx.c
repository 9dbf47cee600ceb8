/*
 * PTX metadata: entry names, parameter layouts, globals and the target,
 * read from the text itself (ptx/meta.c says why the parsers are
 * hand-written and how they treat their input, which is untrusted).
 *
 * The lexer (hkp_lex_next) skips blanks and comments (detect.c's
 * hkp_skip_blank) and keeps strings whole; the trap guard's rewriter
 * (ptx/guard.c) reads PTX with it too. The parser takes the architecture of
 * .target, every .entry with its .param list (an .extern one is not kept),
 * and the .global and .const variables with their sizes; .version,
 * .address_size and .file lines, blocks and every other statement (.func,
 * .shared, .pragma ...) are skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/meta.h"

/* ---- PTX ------------------------------------------------------------------ */

/* The lexer is ptx.h's (hkp_lex_next), shared with guard.c. */
typedef hkp_tok tok;
typedef hkp_lexer lexer;

int hkp_tok_is(const hkp_tok *t, const char *word) {
    size_t l = strlen(word);
    return t->n == l && memcmp(t->s, word, l) == 0;
}

int hkp_lex_next(hkp_lexer *lx, hkp_tok *t) {
    const char *s = lx->s;
    size_t n = lx->n, i = hkp_skip_blank(s, n, lx->i, &lx->bol, &lx->bad);
    if (i >= n) {
        lx->i = n;
        return 0;
    }
    size_t start = i;
    unsigned char c = (unsigned char)s[i];
    if (c == '"') {
        i++;
        while (i < n && s[i] != '"' && s[i] != '\n')
            i += (s[i] == '\\' && i + 1 < n) ? 2 : 1;
        if (i >= n || s[i] != '"')
            lx->bad = 1;
        else
            i++;
    } else if (c == '.' || hkp_is_ident_char(c)) {
        i++;
        while (i < n && hkp_is_ident_char((unsigned char)s[i]))
            i++;
        /* Numbers such as 8.5 or 1.0e5 keep their dot. */
        if (c >= '0' && c <= '9')
            while (i < n && (hkp_is_ident_char((unsigned char)s[i]) || s[i] == '.'))
                i++;
    } else {
        i++;
    }
    if (i > n)
        i = n;
    t->s = s + start;
    t->n = i - start;
    t->bol = lx->bol;
    lx->bol = 0;
    lx->i = i;
    return 1;
}

/* Parses an unsigned PTX integer (decimal, 0x hex, 0b binary, leading-zero
 * octal, optional U suffix). Returns 0, or HK_ERR_FORMAT when t is no such
 * integer or does not fit in 64 bits. */
static int parse_uint(const tok *t, uint64_t *out) {
    char buf[40];
    size_t n = t->n;
    if (n == 0 || n >= sizeof buf || t->s[0] < '0' || t->s[0] > '9')
        return HK_ERR_FORMAT;
    memcpy(buf, t->s, n);
    buf[n] = '\0';
    if (buf[n - 1] == 'U' || buf[n - 1] == 'u')
        buf[--n] = '\0';
    int base = 10;
    const char *p = buf;
    if (n > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        base = 16;
        p += 2;
    } else if (n > 2 && p[0] == '0' && (p[1] == 'b' || p[1] == 'B')) {
        base = 2;
        p += 2;
    } else if (n > 1 && p[0] == '0') {
        base = 8;
        p += 1;
    }
    uint64_t v = 0;
    if (!*p)
        return HK_ERR_FORMAT;
    for (; *p; p++) {
        int d;
        if (*p >= '0' && *p <= '9')
            d = *p - '0';
        else if (*p >= 'a' && *p <= 'f')
            d = *p - 'a' + 10;
        else if (*p >= 'A' && *p <= 'F')
            d = *p - 'A' + 10;
        else
            return HK_ERR_FORMAT;
        if (d >= base || v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
            return HK_ERR_FORMAT;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* Size in bytes of a PTX fundamental type, 0 if t is not one. */
static unsigned ptx_type_size(const tok *t) {
    static const struct {
        const char *name;
        unsigned size;
    } types[] = {
        {".b8", 1},     {".u8", 1},    {".s8", 1},     {".b16", 2},        {".u16", 2},
        {".s16", 2},    {".f16", 2},   {".bf16", 2},   {".e4m3x2", 2},     {".e5m2x2", 2},
        {".b32", 4},    {".u32", 4},   {".s32", 4},    {".f32", 4},        {".f16x2", 4},
        {".bf16x2", 4}, {".tf32", 4},  {".b64", 8},    {".u64", 8},        {".s64", 8},
        {".f64", 8},    {".b128", 16}, {".texref", 8}, {".samplerref", 8}, {".surfref", 8},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (hkp_tok_is(t, types[i].name))
            return types[i].size;
    return 0;
}

/* Parses "sm_90", "sm_90a", "sm_100f" (also compute_XY). 0 if not an arch. */
static int parse_arch_word(const char *s, size_t n) {
    size_t i;
    if (n > 3 && memcmp(s, "sm_", 3) == 0)
        i = 3;
    else if (n > 8 && memcmp(s, "compute_", 8) == 0)
        i = 8;
    else
        return 0;
    int v = 0, digits = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9' && digits < 4) {
        v = v * 10 + (s[i] - '0');
        digits++;
        i++;
    }
    if (digits < 2 || v <= 0)
        return 0;
    if (i == n)
        return v;
    if (i + 1 == n && s[i] == 'a')
        return v | HKP_ARCH_SPECIFIC;
    if (i + 1 == n && s[i] == 'f')
        return v | HKP_ARCH_FAMILY;
    return 0;
}

/* One parameter of an .entry, given as the tokens between commas. */
static int ptx_param(lexer *lx, tok *t, int *more, uint64_t *offset, hkp_param *out, char *why,
                     size_t why_size) {
    uint64_t align = 0, count = 1;
    unsigned tsize = 0;
    int after_ptr = 0, have_name = 0;
    /* t holds the first token (".param"). */
    if (!hkp_tok_is(t, ".param")) {
        hkp_why(why, why_size, "PTX: expected .param in an .entry parameter list, got '%.*s'",
                (int)(t->n > 40 ? 40 : t->n), t->s);
        return HK_ERR_FORMAT;
    }
    for (;;) {
        if (!hkp_lex_next(lx, t)) {
            hkp_why(why, why_size, "PTX: unterminated .entry parameter list");
            return HK_ERR_FORMAT;
        }
        if (hkp_tok_is(t, ",") || hkp_tok_is(t, ")")) {
            *more = hkp_tok_is(t, ",");
            break;
        }
        if (hkp_tok_is(t, ".align")) {
            tok v;
            uint64_t a;
            if (!hkp_lex_next(lx, &v) || parse_uint(&v, &a) || a == 0 || a > 4096 ||
                (a & (a - 1))) {
                hkp_why(why, why_size, "PTX: bad .align in an .entry parameter");
                return HK_ERR_FORMAT;
            }
            /* After .ptr, .align describes the pointee, not the parameter. */
            if (!after_ptr)
                align = a;
        } else if (hkp_tok_is(t, ".ptr")) {
            after_ptr = 1;
        } else if (t->s[0] == '.') {
            unsigned sz = ptx_type_size(t);
            if (sz && !tsize)
                tsize = sz;
            /* Other directives (.global, .const ... after .ptr) carry no layout. */
        } else if (hkp_tok_is(t, "[")) {
            tok v, close;
            uint64_t d;
            if (!hkp_lex_next(lx, &v) || parse_uint(&v, &d) || !hkp_lex_next(lx, &close) ||
                !hkp_tok_is(&close, "]") || d > MAX_OBJECT_SIZE ||
                count > MAX_OBJECT_SIZE / (d ? d : 1)) {
                hkp_why(why, why_size, "PTX: bad array size in an .entry parameter");
                return HK_ERR_FORMAT;
            }
            count *= d;
        } else if (hkp_is_ident_char((unsigned char)t->s[0])) {
            have_name = 1;
        } else {
            hkp_why(why, why_size, "PTX: unexpected '%.*s' in an .entry parameter",
                    (int)(t->n > 40 ? 40 : t->n), t->s);
            return HK_ERR_FORMAT;
        }
    }
    if (!tsize || !have_name) {
        hkp_why(why, why_size, "PTX: .entry parameter without a %s", tsize ? "name" : "type");
        return HK_ERR_FORMAT;
    }
    if (!align)
        align = tsize;
    uint64_t size = (uint64_t)tsize * count;
    uint64_t off = (*offset + align - 1) & ~(align - 1);
    if (size > UINT32_MAX || off > UINT32_MAX - size) {
        hkp_why(why, why_size, "PTX: .entry parameters too large");
        return HK_ERR_FORMAT;
    }
    out->offset = (uint32_t)off;
    out->size = (uint32_t)size;
    *offset = off + size;
    return 0;
}

/* Parses ".entry NAME ( params )" with lx just after ".entry". */
static int ptx_entry(struct meta_builder *b, lexer *lx, int keep, char *why, size_t why_size) {
    tok name, t;
    hkp_param *params = NULL;
    int np = 0, cap = 0, rc = 0;
    uint64_t offset = 0;

    if (!hkp_lex_next(lx, &name) || !hkp_is_ident_char((unsigned char)name.s[0]) ||
        name.n > MAX_NAME) {
        hkp_why(why, why_size, "PTX: .entry without a name");
        return HK_ERR_FORMAT;
    }
    size_t save = lx->i;
    int save_bol = lx->bol;
    if (hkp_lex_next(lx, &t) && hkp_tok_is(&t, "(")) {
        if (!hkp_lex_next(lx, &t)) {
            hkp_why(why, why_size, "PTX: unterminated .entry parameter list");
            return HK_ERR_FORMAT;
        }
        if (!hkp_tok_is(&t, ")")) {
            int more = 1;
            while (more) {
                if (np >= MAX_PARAMS) {
                    hkp_why(why, why_size, "PTX: too many parameters");
                    rc = HK_ERR_FORMAT;
                    goto fail;
                }
                rc = hkp_grow((void **)&params, &cap, np + 1, sizeof *params);
                if (rc)
                    goto fail;
                rc = ptx_param(lx, &t, &more, &offset, &params[np], why, why_size);
                if (rc)
                    goto fail;
                np++;
                if (more && !hkp_lex_next(lx, &t)) {
                    hkp_why(why, why_size, "PTX: unterminated .entry parameter list");
                    rc = HK_ERR_FORMAT;
                    goto fail;
                }
            }
        }
    } else {
        lx->i = save;
        lx->bol = save_bol;
    }
    if (!keep) {
        free(params);
        return 0;
    }
    return hkp_meta_add_entry(b, hkp_dup_n(name.s, name.n), params, np);
fail:
    free(params);
    return rc;
}

/* Skips a balanced { } block; lx is just after the opening brace. */
static int skip_block(lexer *lx, char *why, size_t why_size) {
    tok t;
    size_t depth = 1;
    while (depth) {
        if (!hkp_lex_next(lx, &t)) {
            hkp_why(why, why_size, "PTX: unbalanced braces (missing '}')");
            return HK_ERR_FORMAT;
        }
        if (hkp_tok_is(&t, "{"))
            depth++;
        else if (hkp_tok_is(&t, "}"))
            depth--;
    }
    return 0;
}

/* Skips the rest of the current line (for line-oriented directives). */
static void skip_line(lexer *lx) {
    while (lx->i < lx->n && lx->s[lx->i] != '\n')
        lx->i++;
}

/* The error of a variable declaration the input ends inside. */
static int var_eof(char *why, size_t why_size) {
    hkp_why(why, why_size, "PTX: unterminated variable declaration");
    return HK_ERR_FORMAT;
}

/* Reads the leading attributes of a .global/.const statement (.align N,
 * .attribute(...), .v2/.v4/.v8, the type), from *t on, into *elem and *vec;
 * leaves *t on the first declarator. */
static int ptx_var_attrs(lexer *lx, tok *t, uint64_t *elem, uint64_t *vec, char *why,
                         size_t why_size) {
    for (;;) {
        if (hkp_tok_is(t, ".align")) {
            tok v;
            uint64_t a;
            if (!hkp_lex_next(lx, &v) || parse_uint(&v, &a)) {
                hkp_why(why, why_size, "PTX: bad .align");
                return HK_ERR_FORMAT;
            }
        } else if (hkp_tok_is(t, ".attribute")) {
            /* .attribute(.managed) and the like: no bearing on the size. */
            if (!hkp_lex_next(lx, t))
                return var_eof(why, why_size);
            if (!hkp_tok_is(t, "(")) {
                hkp_why(why, why_size, "PTX: .attribute without '('");
                return HK_ERR_FORMAT;
            }
            for (size_t depth = 1; depth > 0;) {
                if (!hkp_lex_next(lx, t))
                    return var_eof(why, why_size);
                if (hkp_tok_is(t, "("))
                    depth++;
                else if (hkp_tok_is(t, ")"))
                    depth--;
            }
        } else if (hkp_tok_is(t, ".v2") || hkp_tok_is(t, ".v4") || hkp_tok_is(t, ".v8")) {
            *vec = (uint64_t)(t->s[2] - '0');
        } else if (t->s[0] == '.') {
            unsigned sz = ptx_type_size(t);
            if (sz)
                *elem = sz;
            /* Other qualifiers (.attribute(...) is not PTX ISA for variables
             * we care about) are ignored. */
        } else {
            break;
        }
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
    }
    if (!*elem) {
        hkp_why(why, why_size, "PTX: variable without a type");
        return HK_ERR_FORMAT;
    }
    return 0;
}

/* Reads a declarator's "[N]" and "[]" dimensions, *t on the token after its
 * name, into *count (the product of the sizes) and *open_dim (a "[]" seen);
 * leaves *t on what follows them. */
static int ptx_var_dims(lexer *lx, tok *t, const tok *name, uint64_t *count, int *open_dim,
                        char *why, size_t why_size) {
    while (hkp_tok_is(t, "[")) {
        uint64_t d = 0;
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
        if (hkp_tok_is(t, "]")) {
            *open_dim = 1;
        } else {
            if (parse_uint(t, &d) || d > MAX_OBJECT_SIZE || (d && *count > MAX_OBJECT_SIZE / d)) {
                hkp_why(why, why_size, "PTX: bad array size for '%.*s'", (int)name->n, name->s);
                return HK_ERR_FORMAT;
            }
            *count *= d;
            if (!hkp_lex_next(lx, t))
                return var_eof(why, why_size);
            if (!hkp_tok_is(t, "]")) {
                hkp_why(why, why_size, "PTX: expected ']'");
                return HK_ERR_FORMAT;
            }
        }
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
    }
    return 0;
}

/* Skips an initializer, *t on its "=", up to the ',' or ';' after it (left
 * in *t), counting its scalar values into *leaves (the size of "name[]"). */
static int ptx_var_init(lexer *lx, tok *t, uint64_t *leaves, char *why, size_t why_size) {
    size_t depth = 0;
    for (;;) {
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
        if (hkp_tok_is(t, "{") || hkp_tok_is(t, "("))
            depth++;
        else if (hkp_tok_is(t, "}") || hkp_tok_is(t, ")"))
            depth = depth ? depth - 1 : 0;
        else if (depth == 0 && (hkp_tok_is(t, ",") || hkp_tok_is(t, ";")))
            return 0;
        else if (!hkp_tok_is(t, ",") && !hkp_tok_is(t, "-") && !hkp_tok_is(t, "+"))
            (*leaves)++;
    }
}

/* Parses the declarators of a module-scope .global/.const statement, from
 * just after its directives, up to and including the ';'. */
static int ptx_vars(struct meta_builder *b, lexer *lx, tok *t, int keep, int is_const, char *why,
                    size_t why_size) {
    uint64_t elem = 0, vec = 1;
    int rc = ptx_var_attrs(lx, t, &elem, &vec, why, why_size);
    if (rc)
        return rc;
    for (;;) {
        /* Declarator: NAME [dims] [= initializer], then ',' or ';'. */
        if (!hkp_is_ident_char((unsigned char)t->s[0]) || t->n > MAX_NAME) {
            hkp_why(why, why_size, "PTX: expected a variable name, got '%.*s'",
                    (int)(t->n > 40 ? 40 : t->n), t->s);
            return HK_ERR_FORMAT;
        }
        tok name = *t;
        uint64_t count = 1, leaves = 0;
        int open_dim = 0;
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
        if ((rc = ptx_var_dims(lx, t, &name, &count, &open_dim, why, why_size)) != 0)
            return rc;
        if (hkp_tok_is(t, "=") && (rc = ptx_var_init(lx, t, &leaves, why, why_size)) != 0)
            return rc;
        if (open_dim)
            count = leaves / vec;
        uint64_t size = elem * vec;
        if (count > MAX_OBJECT_SIZE / size) {
            hkp_why(why, why_size, "PTX: variable '%.*s' too large", (int)name.n, name.s);
            return HK_ERR_FORMAT;
        }
        size *= count;
        /* Names starting with '$' are the compiler's own (string literals). */
        if (keep && name.s[0] != '$' &&
            (rc = hkp_meta_add_global(b, name.s, name.n, size, is_const)) != 0)
            return rc;
        if (hkp_tok_is(t, ";"))
            return 0;
        if (!hkp_tok_is(t, ",")) {
            hkp_why(why, why_size, "PTX: expected ',' or ';' after '%.*s'", (int)name.n, name.s);
            return HK_ERR_FORMAT;
        }
        if (!hkp_lex_next(lx, t))
            return var_eof(why, why_size);
    }
}

/* Skips a statement up to ';' or a body; the first token is already read. */
static int skip_statement(lexer *lx, tok *t, char *why, size_t why_size) {
    size_t paren = 0;
    int eq = 0;
    for (;;) {
        if (hkp_tok_is(t, "("))
            paren++;
        else if (hkp_tok_is(t, ")"))
            paren = paren ? paren - 1 : 0;
        else if (hkp_tok_is(t, "="))
            eq = 1;
        else if (paren == 0 && hkp_tok_is(t, ";"))
            return 0;
        else if (hkp_tok_is(t, "{")) {
            int rc = skip_block(lx, why, why_size);
            if (rc || !eq)
                return rc;
        }
        if (!hkp_lex_next(lx, t))
            return 0;
    }
}

int hkp_meta_ptx(const char *s, size_t n, struct meta_builder *b, char *why, size_t why_size) {
    lexer lx = {.s = s, .n = n, .i = 0, .bol = 1, .bad = 0};
    tok t;
    int have_version = 0, rc = 0;

    while (hkp_lex_next(&lx, &t)) {
        if (hkp_tok_is(&t, ".version")) {
            have_version = 1;
            skip_line(&lx);
            continue;
        }
        if (hkp_tok_is(&t, ".target")) {
            tok a;
            int more;
            while ((more = hkp_lex_next(&lx, &a)) && !a.bol) {
                int v = parse_arch_word(a.s, a.n);
                if (v && !b->m->arch)
                    b->m->arch = v;
            }
            if (!b->m->arch) {
                hkp_why(why, why_size, "PTX: .target without an sm_XY architecture");
                return HK_ERR_FORMAT;
            }
            if (more) {
                /* The token that ended the line starts the next statement. */
                lx.i = (size_t)(a.s - s);
                lx.bol = 1;
            }
            continue;
        }
        if (hkp_tok_is(&t, ".address_size") || hkp_tok_is(&t, ".file")) {
            skip_line(&lx);
            continue;
        }
        if (hkp_tok_is(&t, "{")) {
            rc = skip_block(&lx, why, why_size);
            if (rc)
                return rc;
            continue;
        }
        if (hkp_tok_is(&t, "}")) {
            hkp_why(why, why_size, "PTX: unbalanced '}'");
            return HK_ERR_FORMAT;
        }
        /* A declaration: linking and state-space directives, then what they
         * declare. */
        int is_extern = 0, space = 0; /* 1 global, 2 const, 3 other */
        for (;;) {
            if (hkp_tok_is(&t, ".extern"))
                is_extern = 1;
            else if (hkp_tok_is(&t, ".visible") || hkp_tok_is(&t, ".weak") ||
                     hkp_tok_is(&t, ".common"))
                ;
            else
                break;
            if (!hkp_lex_next(&lx, &t)) {
                hkp_why(why, why_size, "PTX: declaration cut short");
                return HK_ERR_FORMAT;
            }
        }
        if (hkp_tok_is(&t, ".entry")) {
            rc = ptx_entry(b, &lx, !is_extern, why, why_size);
            if (rc)
                return rc;
            /* Performance directives may precede the body or the ';'. */
            if (!hkp_lex_next(&lx, &t)) {
                hkp_why(why, why_size, "PTX: .entry without a body");
                return HK_ERR_FORMAT;
            }
            rc = skip_statement(&lx, &t, why, why_size);
        } else if (hkp_tok_is(&t, ".global") || hkp_tok_is(&t, ".const")) {
            space = hkp_tok_is(&t, ".global") ? 1 : 2;
            if (!hkp_lex_next(&lx, &t)) {
                hkp_why(why, why_size, "PTX: declaration cut short");
                return HK_ERR_FORMAT;
            }
            rc = ptx_vars(b, &lx, &t, !is_extern, space == 2, why, why_size);
        } else {
            /* .func, .shared, .pragma, .section, .alias ...: nothing to record. */
            rc = skip_statement(&lx, &t, why, why_size);
        }
        if (rc)
            return rc;
    }
    if (lx.bad) {
        hkp_why(why, why_size, "PTX: unterminated comment or string");
        return HK_ERR_FORMAT;
    }
    if (!have_version && !b->m->arch) {
        hkp_why(why, why_size, "PTX: no .version or .target directive");
        return HK_ERR_FORMAT;
    }
    if (!b->m->arch) {
        hkp_why(why, why_size, "PTX: no .target directive");
        return HK_ERR_FORMAT;
    }
    return 0;
}

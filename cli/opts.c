/*
 * The option parser every hotkern subcommand uses.
 *
 * A subcommand describes its options as a table of hkc_opt, each pointing
 * at the variable it fills, with the options several subcommands share
 * (HKC_HTTP_OPTS, HKC_JSON_OPT) expanded from one macro; range checks and
 * their messages live in the table too. The parser is deliberately small:
 * long options exactly as written (no abbreviations, which would make a
 * later option's name change the meaning of a script's), short options only
 * where a table gives a letter (-I, -D), no bundling.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

void hkc_list_free(hkc_list *l) {
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

static const hkc_opt *find_long(const hkc_opt *opts, int n, const char *a, size_t len) {
    for (int i = 0; i < n; i++)
        if (opts[i].name && strlen(opts[i].name) == len && !strncmp(opts[i].name, a, len))
            return &opts[i];
    return NULL;
}

static const hkc_opt *find_short(const hkc_opt *opts, int n, char c) {
    for (int i = 0; i < n; i++)
        if (opts[i].letter && opts[i].letter == c)
            return &opts[i];
    return NULL;
}

static int parse_uint(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || s[0] == '+')
        return HK_ERR_FORMAT;
    *out = v;
    return 0;
}

/* Stores value into what opt points at; returns 0 or a usage error (2). */
static int store(hkc_out *o, const hkc_opt *opt, const char *shown, const char *value) {
    uint64_t v;
    hkc_list *l = opt->dst;
    const char **nv;
    switch (opt->kind) {
    case HKC_FLAG:
        *(int *)opt->dst = 1;
        return 0;
    case HKC_STRING:
        *(const char **)opt->dst = value;
        return 0;
    case HKC_UINT:
        if (parse_uint(value, &v) || v < opt->min || v > opt->max)
            return hkc_usage(o, "%s", opt->why);
        *(uint64_t *)opt->dst = v;
        return 0;
    case HKC_LIST:
        nv = realloc(l->v, (size_t)(l->n + 1) * sizeof *nv);
        if (!nv)
            return hkc_usage(o, "out of memory");
        nv[l->n++] = value;
        l->v = nv;
        return 0;
    case HKC_REFUSED:
        break;
    }
    return hkc_usage(o, "%s: %s", shown, opt->why);
}

/* Parses the option at argv[*i] (advancing *i past a separate value). */
static int one_option(hkc_out *o, const hkc_opt *opts, int nopts, int argc, char **argv, int *i) {
    const char *a = argv[*i], *value = NULL;
    const hkc_opt *opt;
    if (a[1] == '-') {
        const char *eq = strchr(a, '=');
        opt = find_long(opts, nopts, a, eq ? (size_t)(eq - a) : strlen(a));
        if (eq)
            value = eq + 1;
    } else {
        opt = find_short(opts, nopts, a[1]);
        if (a[2])
            value = a + 2;
    }
    if (!opt)
        return hkc_usage(o, "unknown option '%s'", a);
    if (opt->kind == HKC_FLAG || opt->kind == HKC_REFUSED) {
        if (value && opt->kind == HKC_FLAG)
            return hkc_usage(o, "%s takes no value", opt->name);
        return store(o, opt, a, NULL);
    }
    if (!value && *i + 1 < argc)
        value = argv[++*i];
    if (!value || !value[0])
        return hkc_usage(o, "%s needs a value", a);
    return store(o, opt, a, value);
}

int hkc_parse(hkc_out *o, const char *cmd, const hkc_opt *opts, int nopts, const char *help,
              int argc, char **argv, int *noperands) {
    int n = 0, rc;
    hkc_out_init(o, cmd);
    if (find_long(opts, nopts, "--json", 6)) {
        for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
            if (!strcmp(argv[i], "--json"))
                hkc_out_json(o);
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            while (++i < argc)
                argv[1 + n++] = argv[i];
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(help, stdout);
            hkc_out_text(o); /* help is text, --json or not */
            return 0;
        } else if (a[0] == '-' && a[1]) {
            if ((rc = one_option(o, opts, nopts, argc, argv, &i)) != 0)
                return rc;
        } else {
            argv[1 + n++] = argv[i];
        }
    }
    *noperands = n;
    return HKC_CONTINUE;
}

/*
 * Which file a program's kernel or variable belongs to (expect.c's rule for
 * matching by identity, not by name alone).
 *
 * nvcc gives a file-local kernel (`static __global__ void fill(float *)`)
 * and a file-local variable the same names in every file; each file is a
 * translation unit of its own, registered on its own. The interposition
 * tells the engine each translation unit ("TU"): a number, its source file's
 * stem when it could be learnt ("a" for a.cu), and the names of its kernels
 * and variables. A program's kernel or variable is registered with its TU's
 * number, and a module's version reaches it only when:
 *   - the module is that file's: its name's stem is the TU's, and no other
 *     live TU has that stem (a watched a.cu is module "a");
 *   - or the module is no file's (no TU has its stem: a module of the API
 *     such as "sim") and the name belongs to that TU alone;
 *   - or, where several TUs have the name and the module cannot be
 *     attributed by its stem, this TU is the one whose kernels (template
 *     instances aside) and variables are exactly the version's.
 * Otherwise the name stays the program's, in every TU, and the log says so
 * once (the name, the files, the module). A kernel or variable registered
 * with no TU (0) is matched by name, as before.
 *
 * Locks: everything here is under expect_lock (a leaf).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/expect.h"

typedef struct hkl_tu {
    unsigned id;         /* immutable */
    char *file;          /* immutable: the source file's stem, or NULL */
    char **names;        /* immutable: its kernels' and variables' names */
    int nnames;          /* immutable */
    int nplain;          /* immutable: the first nplain no template instances */
    int gone;            /* expect_lock: unregistered (dlclose) */
    struct hkl_tu *next; /* expect_lock */
} hkl_tu;

typedef struct hkl_tu_warned {
    char *name;
    struct hkl_tu_warned *next;
} hkl_tu_warned;

int hkl_expect_tu(hk_runtime *rt, unsigned id, const char *file, const char *const *names, int n,
                  int nplain) {
    if (!rt || !id || n < 0 || (n && !names) || nplain < 0 || nplain > n)
        return HK_ERR_INVALID;
    hkl_tu *t = calloc(1, sizeof *t);
    if (!t)
        return HK_ERR_NOMEM;
    t->id = id;
    t->nplain = nplain;
    int ok = (!file || (t->file = strdup(file))) &&
             (!n || (t->names = calloc((size_t)n, sizeof *t->names)));
    for (int i = 0; ok && i < n; i++, t->nnames++)
        ok = (t->names[i] = strdup(names[i] ? names[i] : "")) != NULL;
    if (!ok) {
        hku_strv_free(t->names, t->nnames);
        free(t->file);
        free(t);
        return HK_ERR_NOMEM;
    }
    pthread_mutex_lock(&rt->expect.lock);
    t->next = rt->expect.tus;
    rt->expect.tus = t;
    pthread_mutex_unlock(&rt->expect.lock);
    return 0;
}

void hkl_expect_tu_gone(hk_runtime *rt, unsigned id) {
    pthread_mutex_lock(&rt->expect.lock);
    for (hkl_tu *t = rt->expect.tus; t; t = t->next)
        if (t->id == id)
            t->gone = 1;
    pthread_mutex_unlock(&rt->expect.lock);
}

static int has_name(const hkl_tu *t, const char *name) {
    for (int i = 0; i < t->nnames; i++)
        if (!strcmp(t->names[i], name))
            return 1;
    return 0;
}

static int version_has(const hkl_version *v, const char *name) {
    for (int i = 0; i < v->art.meta.nentries; i++)
        if (!strcmp(v->art.meta.entries[i].name, name))
            return 1;
    for (int i = 0; i < v->art.meta.nglobals; i++)
        if (!strcmp(v->art.meta.globals[i].name, name))
            return 1;
    return 0;
}

static int plain_has(const hkl_tu *t, const char *name) {
    for (int i = 0; i < t->nplain; i++)
        if (!strcmp(t->names[i], name))
            return 1;
    return 0;
}

static int lowered(const hkl_version *v, const char *name) {
    for (int i = 0; i < v->art.nlowered; i++)
        if (v->art.lowered_names[i] && !strcmp(v->art.lowered_names[i], name))
            return 1;
    return 0;
}

/* 1 when v's names are exactly t's (the fallback when the files are
 * unknown): its kernels, template instances aside (a build has those it
 * was asked for), and its globals. A version with a name more or less is
 * no TU's: an edit that adds or removes one is not told by its names. */
static int same_names(const hkl_tu *t, const hkl_version *v) {
    for (int i = 0; i < t->nplain; i++)
        if (!version_has(v, t->names[i]))
            return 0;
    for (int i = 0; i < v->art.meta.nentries; i++)
        if (!lowered(v, v->art.meta.entries[i].name) && !plain_has(t, v->art.meta.entries[i].name))
            return 0;
    for (int i = 0; i < v->art.meta.nglobals; i++)
        if (!plain_has(t, v->art.meta.globals[i].name))
            return 0;
    return 1;
}

/* The stem of a module's name: up to its first '.' ("a" for "a.cu"). */
static int stem_is(const char *module, const char *file) {
    size_t n = strcspn(module, ".");
    return file && strlen(file) == n && !memcmp(module, file, n);
}

static void say_once(hk_runtime *rt, const char *kind, const char *name, const hkl_module *m) {
    for (hkl_tu_warned *w = rt->expect.tu_warned; w; w = w->next)
        if (!strcmp(w->name, name))
            return;
    hkl_tu_warned *w = calloc(1, sizeof *w);
    if (w && (w->name = strdup(name))) {
        w->next = rt->expect.tu_warned;
        rt->expect.tu_warned = w;
    } else {
        free(w);
    }
    char files[256] = "";
    for (const hkl_tu *t = rt->expect.tus; t; t = t->next) {
        if (t->gone || !has_name(t, name))
            continue;
        size_t l = strlen(files);
        if (t->file)
            snprintf(files + l, sizeof files - l, "%s%s", l ? ", " : "", t->file);
        else
            snprintf(files + l, sizeof files - l, "%s(translation unit %u, file unknown)",
                     l ? ", " : "", t->id);
    }
    hk_log(rt, HK_LOG_WARN, "engine",
           "the program's %s '%s' is defined in several files (%s) and module '%s' cannot be "
           "told to be one of them: it takes none of them, and those no other module took run "
           "the program's own code (name the module after its file, e.g. watch that file)",
           kind, name, files, m->name);
}

int hkl_tu_owns(hk_runtime *rt, unsigned tu, const char *kind, const char *name,
                const hkl_module *m, const hkl_version *v) {
    const hkl_tu *mine = NULL;
    for (const hkl_tu *t = rt->expect.tus; t && !mine; t = t->next)
        if (t->id == tu && !t->gone)
            mine = t;
    if (!tu || !mine)
        return 1; /* nothing known of its file: by name */
    /* The module's file, by its stem. */
    const hkl_tu *by_stem = NULL;
    int nstem = 0, ngone = 0, ndef = 0;
    for (const hkl_tu *t = rt->expect.tus; t; t = t->next) {
        if (t->gone) {
            ngone += stem_is(m->name, t->file);
            continue;
        }
        if (stem_is(m->name, t->file)) {
            by_stem = t;
            nstem++;
        }
        ndef += has_name(t, name);
    }
    if (nstem == 1)
        return by_stem == mine;
    if (nstem == 0 && ngone)
        return 0; /* the module of a file that was unloaded (dlclose) */
    if (nstem == 0 && ndef <= 1)
        return 1; /* no file's module, and the name is this TU's alone */
    /* By the names: the one TU that has this name and exactly v's names. */
    const hkl_tu *cand = NULL;
    int ncand = 0;
    for (const hkl_tu *t = rt->expect.tus; t; t = t->next)
        if (!t->gone && has_name(t, name) && (!nstem || stem_is(m->name, t->file)) &&
            same_names(t, v)) {
            cand = t;
            ncand++;
        }
    if (ncand == 1)
        return cand == mine;
    say_once(rt, kind, name, m);
    return 0;
}

void hkl_expect_tu_free(hk_runtime *rt) {
    while (rt->expect.tus) {
        hkl_tu *t = rt->expect.tus;
        rt->expect.tus = t->next;
        hku_strv_free(t->names, t->nnames);
        free(t->file);
        free(t);
    }
    while (rt->expect.tu_warned) {
        hkl_tu_warned *w = rt->expect.tu_warned;
        rt->expect.tu_warned = w->next;
        free(w->name);
        free(w);
    }
}

/*
 * loader/expect.h: what the engine offers a source that routes a program's
 * own launches (interpose/): expect.c's basics, the
 * program's translation units (expect_tu.c), the host's symbol copies
 * (expect.c) and builds again for late template instances (expect.c,
 * worker.c). Included by loader.h, at its end.
 */
#ifndef HK_LOADER_EXPECT_H
#define HK_LOADER_EXPECT_H

/* expect.c: the program's own kernels and globals (for the <<<>>>
 * interposition). See the top of expect.c.
 * - hkl_expect_kernel registers the program's kernel `name` (entry name: C
 *   or mangled), the layout its call sites pass and the name expression that
 *   instantiates it in a hot build (NULL: none needed), the translation unit
 *   it was registered from (0: unknown; expect_tu.c), and binds it at once
 *   to a committed version that has it; returns the entry (valid until
 *   destroy; the same for the same name) or NULL. Takes swap_lock.
 * - hkl_expect_handle: the handle the program's launches of it go to, or
 *   NULL while no hot version has it. No lock: one acquire load.
 * - hkl_expect_global registers the program's global `name` of TU tu (its copy at
 *   orig, device slot 0, size bytes; *out: its entry) and binds it to a version
 *   committed already; hkl_expect_global_hot gives the copy
 *   the running version uses (1 with *dptr and *size set, 0 when none has it).
 * - hkl_expect_exprs: the name expressions to add to a build of src (a
 *   malloc'd vector of *n strings). No engine lock held.
 * - In a swap (swap_lock held): hkl_expect_adopt makes handles in m for the
 *   expected kernels v has (before validation, which then checks them as any
 *   handle); hkl_expect_unadopt takes them back (roll back);
 *   hkl_expect_seed gives v the program's globals (commit, gate closed);
 *   hkl_expect_publish publishes the adopted handles (after the commit). */
typedef struct hkl_adopt_one {
    hkl_expect *e;
    hk_kernel *k;
    int was_fixed;
    int is_new; /* made by this adoption: freed by hkl_expect_unadopt */
} hkl_adopt_one;
typedef struct hkl_adopted {
    int n, nnew, cap;
    hkl_adopt_one *one; /* malloc'd: no bound on a module's kernels */
} hkl_adopted;
hkl_expect *hkl_expect_kernel(hk_runtime *rt, const char *name, const char *expr,
                              const hkl_param_layout *layout, unsigned tu);
hk_kernel *hkl_expect_handle(const hkl_expect *e);
const char *hkl_expect_name(const hkl_expect *e);
typedef struct hkl_xglobal hkl_xglobal;
int hkl_expect_global(hk_runtime *rt, const char *name, uint64_t orig, size_t size, unsigned tu,
                      hkl_xglobal **out);
int hkl_expect_global_hot(hk_runtime *rt, const char *name, uint64_t *dptr, size_t *size);
int hkl_expect_exprs(hk_runtime *rt, const char *src, size_t len, char ***out, int *n);
int hkl_expect_adopt(hk_runtime *rt, hkl_module *m, const hkl_version *v, hkl_adopted *a);
void hkl_expect_unadopt(hkl_module *m, hkl_adopted *a);
int hkl_expect_seed(hk_runtime *rt, hkl_module *m, hkl_version *v, int first, hk_report *rep);
void hkl_expect_publish(hk_runtime *rt, hkl_module *m, const hkl_version *v, hkl_adopted *a);
int hkl_expect_init(hk_runtime *rt); /* the part rt->expect */
void hkl_expect_finish(hk_runtime *rt);

/* expect_tu.c: the program's translation units (see there).
 * - hkl_expect_tu: TU `id` (> 0, never reused) has source file stem `file`
 *   (NULL: unknown) and the n kernel and variable names, the first nplain
 *   of them no template instances; hkl_expect_tu_gone:
 *   it was unregistered (dlclose).
 * - hkl_tu_owns (expect_lock held): 1 when module m's version v may take the
 *   program's kernel or variable (`kind`) `name` of TU tu (0: no TU, by
 *   name); 0 when it is another file's or cannot be told (said once). */
int hkl_expect_tu(hk_runtime *rt, unsigned id, const char *file, const char *const *names, int n,
                  int nplain);
void hkl_expect_tu_gone(hk_runtime *rt, unsigned id);
int hkl_tu_owns(hk_runtime *rt, unsigned tu, const char *kind, const char *name,
                const hkl_module *m, const hkl_version *v);
void hkl_expect_tu_free(hk_runtime *rt); /* at free */

void hkl_expect_global_free(hk_runtime *rt); /* expect_global.c, at free */
/* The host's copy to or from the running version's copy of g: between
 * hkl_xglobal_enter (NULL: no hot copy, the program's alone; else *dptr is
 * it) and hkl_xglobal_exit, no commit moves it and no unload frees it. No
 * lock; waits while the gate is closed. */
hkl_tslot *hkl_xglobal_enter(hk_runtime *rt, hkl_xglobal *g, uint64_t *dptr);
void hkl_xglobal_exit(hkl_tslot *s);
size_t hkl_xglobal_size(const hkl_xglobal *g);

/* Template instances first launched after their module's source was built
 * (see the top of expect.c). hkl_expect_keep, at a commit of m (swap_lock
 * held): keeps j's source when it is CUDA C (drops m's kept one otherwise).
 * hkl_expect_take_late: 1 with a copy of a kept source to build again (and
 * its module and options) in *out, 0 when none is late, < 0 on error;
 * hkl_late_free frees the copy. */
typedef struct hkl_late {
    char module[HKL_NAME_MAX];
    char *src;
    size_t len;
    char **opts;
    int nopts;
    char **exprs;
    int nexprs;
    char *source_name;
    hk_header *headers;
    int nheaders;
    uint64_t seq; /* the kept source's submission number */
} hkl_late;
void hkl_expect_keep(hk_runtime *rt, const hkl_module *m, const hkl_job *j, const hkl_version *v);
int hkl_expect_take_late(hk_runtime *rt, hkl_late *out);
void hkl_late_free(hkl_late *l);
/* Builds again, once, the kept source of each module a program's template
 * instance first launched after its build is missing from (expect.c);
 * queued behind what is queued, with the kept source's submission number,
 * so that a save submitted since is never replaced by it. Any thread but
 * one that holds an engine lock. */
void hkl_late_submit(hk_runtime *rt);

#endif /* HK_LOADER_EXPECT_H */

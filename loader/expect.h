/*
 * loader/expect.h: the program's own kernels and globals inside the engine
 * (expect.c, expect_tu.c, expect_global.c): the part rt->expect, what a
 * swap does with them, the translation units' ownership, and the sources
 * kept for late template instances. What the <<<>>> interposition calls is
 * loader/port.h's.
 */
#ifndef HK_LOADER_EXPECT_H
#define HK_LOADER_EXPECT_H

#include "loader/core.h"

/* expect.c: the program's own kernels and globals (for the <<<>>>
 * interposition, whose calls are loader/port.h's). See the top of expect.c.
 * - The part rt->expect: hkl_expect_init at create; hkl_expect_finish at
 *   free (the kernels, the globals, the translation units, the kept
 *   sources).
 * - hkl_expect_global_hot gives the copy of the program's global `name` the
 *   running version uses (1 with *dptr and *size set, 0 when none has it).
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
int hkl_expect_init(hk_runtime *rt);
void hkl_expect_finish(hk_runtime *rt);
int hkl_expect_global_hot(hk_runtime *rt, const char *name, uint64_t *dptr, size_t *size);
int hkl_expect_exprs(hk_runtime *rt, const char *src, size_t len, char ***out, int *n);
int hkl_expect_adopt(hk_runtime *rt, hkl_module *m, const hkl_version *v, hkl_adopted *a);
void hkl_expect_unadopt(hkl_module *m, hkl_adopted *a);
int hkl_expect_seed(hk_runtime *rt, hkl_module *m, hkl_version *v, int first, hk_report *rep);
void hkl_expect_publish(hk_runtime *rt, hkl_module *m, const hkl_version *v, hkl_adopted *a);

/* expect_tu.c: the program's translation units (see there; hkl_expect_tu
 * and hkl_expect_tu_gone: loader/port.h).
 * - hkl_tu_owns (expect_lock held): 1 when module m's version v may take the
 *   program's kernel or variable (`kind`) `name` of TU tu (0: no TU, by
 *   name); 0 when it is another file's or cannot be told (said once). */
int hkl_tu_owns(hk_runtime *rt, unsigned tu, const char *kind, const char *name,
                const hkl_module *m, const hkl_version *v);
void hkl_expect_tu_free(hk_runtime *rt); /* at free (hkl_expect_finish) */

void hkl_expect_global_free(hk_runtime *rt); /* expect_global.c, at free (hkl_expect_finish) */

/* Template instances first launched after their module's source was built
 * (see the top of expect.c). hkl_expect_keep, at a commit of m (swap_lock
 * held): keeps j's source when it is CUDA C (drops m's kept one otherwise).
 * hkl_expect_take_late: 1 with a copy of a kept source to build again (and
 * its module and options) in *out, 0 when none is late, < 0 on error;
 * hkl_late_free frees the copy. hkl_late_submit (worker.c), which builds
 * them again: loader/port.h. */
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

#endif /* HK_LOADER_EXPECT_H */

/*
 * loader/expect.h: what the engine offers a source that routes a program's
 * own launches (interpose/) beyond expect.c's basics in loader.h: the
 * program's translation units (expect_tu.c), the host's symbol copies
 * (expect.c) and builds again for late template instances (expect.c,
 * worker.c). Included by loader.h, at its end.
 */
#ifndef HK_LOADER_EXPECT_H
#define HK_LOADER_EXPECT_H

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

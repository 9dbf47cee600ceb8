/*
 * loader/graph.h: registered graphs (graph.c).
 */
#ifndef HK_LOADER_GRAPH_H
#define HK_LOADER_GRAPH_H

#include "loader/core.h"

/* The part rt->graph: init makes graph_lock (writers first), finish frees
 * the registrations. */
int hkl_graphs_init(hk_runtime *rt);
void hkl_graphs_finish(hk_runtime *rt);
/* Points every registered node of m at v (swap_lock held); a node that
 * cannot be retargeted keeps running old (pinned for it) and the report
 * says so. */
int hkl_graphs_retarget(hk_runtime *rt, hkl_module *m, hkl_version *v, hkl_version *old,
                        hk_report *rep);

#endif /* HK_LOADER_GRAPH_H */

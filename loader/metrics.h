/*
 * loader/metrics.h: the counters behind hk_stats and the metrics text
 * (metrics.c).
 */
#ifndef HK_LOADER_METRICS_H
#define HK_LOADER_METRICS_H

#include "loader/core.h"

/* The part rt->metrics. */
int hkl_metrics_init(hk_runtime *rt);
void hkl_metrics_finish(hk_runtime *rt);
/* One committed swap of total_ms (stats_lock held). */
void hkl_hist_observe(hkl_hist *h, double total_ms);
/* A swap's outcome into the counters (stats_lock taken here): committed or
 * refused, a rollback or not, and the times of its report. */
void hkl_count_swap(hk_runtime *rt, int committed, int rollback, const hk_report *rep);
/* Fills rep's total (since t_start, hkl_now_ms; 0: not known) and the part
 * of it no step accounts for (waiting for the lock, a safe point, reset
 * recovery). */
void hkl_report_times(hk_report *rep, double t_start);
/* The engine's families from a snapshot of its counters (h may be NULL). */
void hkl_metrics_engine(hk_metrics_writer *w, const hk_stats *s, const hkl_hist *h);

#endif /* HK_LOADER_METRICS_H */

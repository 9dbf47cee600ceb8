/*
 * loader/log.h: logs, the event queue and the callbacks' end (log.c).
 */
#ifndef HK_LOADER_LOG_H
#define HK_LOADER_LOG_H

#include "loader/core.h"

/* The parts rt->log and rt->ev (runtime.c makes them first). */
int hkl_log_init(hk_runtime *rt);
void hkl_log_finish(hk_runtime *rt);
int hkl_events_init(hk_runtime *rt);
void hkl_events_finish(hk_runtime *rt);
/* From hk_runtime_destroy: from now on no callback of rt (log or event) is
 * called, except on this thread; waits until those in progress on other
 * threads have returned, until until_ms (hkl_now_ms), then HK_ERR_TIMEOUT. */
int hkl_callbacks_close(hk_runtime *rt, double until_ms);
void hkl_log_event(hk_runtime *rt, hk_event_kind kind, const char *module, uint64_t oldv,
                   uint64_t newv, const char *origin, const hk_report *rep);
/* Logs the event, then hands it to the application through hkl_emit_quiet
 * (port.h), which a source that logged already uses. */
void hkl_emit(hk_runtime *rt, hk_event_kind kind, const char *module, uint64_t oldv, uint64_t newv,
              const char *origin, const hk_report *rep);

#endif /* HK_LOADER_LOG_H */

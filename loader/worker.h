/*
 * loader/worker.h: the worker thread (worker.c), for runtime.c. The way in
 * (hk_swap, hk_submit, hk_safe_point) is the public API; what the sources
 * use of it (hkl_submit_latest, automatic safe points) is loader/port.h.
 */
#ifndef HK_LOADER_WORKER_H
#define HK_LOADER_WORKER_H

#include "loader/core.h"

/* The parts rt->work and rt->sp. */
int hkl_worker_init(hk_runtime *rt);
void hkl_worker_finish(hk_runtime *rt);
int hkl_safe_points_init(hk_runtime *rt);
/* Starts the worker. finish is the rest of hk_runtime_destroy after the
 * worker has stopped (runtime.c's), which the worker runs itself when
 * destroy stopped waiting for its build. */
int hkl_worker_start(hk_runtime *rt, void (*finish)(hk_runtime *rt, double until_ms));
/* Stops the worker, waiting for a build in progress until until_ms
 * (hkl_now_ms): 0 when it has ended, HK_ERR_TIMEOUT when not (it then runs
 * the teardown itself when its build returns). */
int hkl_worker_stop(hk_runtime *rt, double until_ms);
/* Ends the jobs still queued (waiters get HK_ERR_CLOSED); worker stopped. */
void hkl_worker_drain(hk_runtime *rt);

#endif /* HK_LOADER_WORKER_H */

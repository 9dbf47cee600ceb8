/*
 * What every file of loader/ uses to reach the driver, at the bottom of the
 * engine: swap_lock with its owner recorded, the relaxed stream-capture mode
 * of hotkern's driver sections, pushing a device's context, and a failed
 * driver call written into a report.
 *
 * swap_lock's owner is kept in a thread-local, so that a callback run under
 * it (a check callback, an event handler during a swap) can be answered at
 * once instead of waiting for itself: hkl_swap_lock returns 1 without
 * locking then (context.h). The capture mode is per thread: a section that
 * relaxes it puts the caller's mode back when it ends.
 */
#include <stdio.h>
#include <unistd.h>

#include "loader/context.h"

/* Records a failed driver call: HK_ERR_CUDA, its CUresult and name. */
int hkl_report_cu(hk_report *rep, const hk_runtime *rt, CUresult r, const char *what) {
    const char *name = hkb_cu_name(rt ? rt->drv : NULL, r);
    if (rep) {
        rep->cu_result = (int)r;
        snprintf(rep->cu_name, sizeof rep->cu_name, "%s", name);
    }
    hku_fail(rep, HK_ERR_CUDA, "%s failed: %s", what, name);
    return HK_ERR_CUDA;
}

/* The runtime whose swap_lock this thread holds (one at a time). */
static __thread hk_runtime *swap_owner;

int hkl_swap_lock(hk_runtime *rt) {
    if (swap_owner == rt)
        return 1;
    pthread_mutex_lock(&rt->swap_lock);
    swap_owner = rt;
    return 0;
}

int hkl_swap_lock_by(hk_runtime *rt, double until_ms) {
    if (swap_owner == rt)
        return 1;
    /* Polled: pthread_mutex_timedlock's clock is the wall clock, which may
     * jump; this is destroy's alone, where a millisecond is nothing. */
    while (pthread_mutex_trylock(&rt->swap_lock) != 0) {
        if (hkl_now_ms() >= until_ms)
            return HK_ERR_TIMEOUT;
        usleep(500);
    }
    swap_owner = rt;
    return 0;
}

void hkl_swap_unlock(hk_runtime *rt, int nested) {
    if (nested)
        return;
    swap_owner = NULL;
    pthread_mutex_unlock(&rt->swap_lock);
}

int hkl_swap_held(const hk_runtime *rt) {
    return swap_owner == rt;
}

CUstreamCaptureMode hkl_relax(hk_runtime *rt) {
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (rt->drv->ThreadExchangeStreamCaptureMode(&m) != CUDA_SUCCESS)
        m = CU_STREAM_CAPTURE_MODE_RELAXED;
    return m;
}

void hkl_unrelax(hk_runtime *rt, CUstreamCaptureMode old) {
    if (old != CU_STREAM_CAPTURE_MODE_RELAXED)
        rt->drv->ThreadExchangeStreamCaptureMode(&old);
}

int hkl_ctx_push(hk_runtime *rt, int slot) {
    CUresult r = rt->drv->CtxPushCurrent(hkl_ctx(rt, slot));
    return r == CUDA_SUCCESS ? 0 : (int)r;
}

void hkl_ctx_pop(hk_runtime *rt) {
    CUcontext dummy;
    rt->drv->CtxPopCurrent(&dummy);
}

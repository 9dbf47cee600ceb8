/*
 * The runtime the interposition makes from the environment (route.c's
 * from_env) runs in the runtime API's context for device 0, its primary
 * context, whichever thread launches first and whatever context that
 * thread has current. hk_runtime_create adopts a non-primary context
 * current on the creating thread (as the runtime API would use it on that
 * thread): right for a program that creates its runtime where it works,
 * wrong here, where the creating thread is merely the first to launch (a
 * plugin with a context of its own, say) and every other thread's launches
 * in the primary context would then never reach a hot version. So the
 * creating thread's context is taken off it during the creation and put
 * back afterwards; a launch from another context than the primary one runs
 * the program's own code (route.c's in_context), which the log says once.
 */
#include "base/driver.h"
#include "interpose/interpose.h"
#include "loader/port.h"
#include "util/util.h"

int hki_runtime_create(hk_runtime **out, const hk_options *o, const hkb_driver *drv,
                       hk_report *rep) {
    hkb_driver real;
    if (!drv) {
        char why[512];
        int err = hkb_driver_open(&real, why, sizeof why);
        if (err < 0)
            return hku_fail(rep, err, "%s", why);
        drv = &real; /* the runtime takes it over */
    }
    /* Kept before the runtime takes the table over (and, failing, closes
     * it: libcuda stays loaded, the program's runtime holds it). */
    __typeof__(drv->CtxSetCurrent) set = drv->CtxSetCurrent;
    CUcontext cur = NULL;
    int off = drv->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur && set(NULL) == CUDA_SUCCESS;
    int err = hkl_runtime_create_with(out, o, drv, rep);
    if (off)
        set(cur);
    if (err == 0 && off && cur != hkl_context(*out, 0))
        hk_log(*out, HK_LOG_WARN, "interpose",
               "the first launch came from a thread whose current context is not device 0's "
               "primary one: hot versions run in the primary context (the runtime API's); "
               "launches from other contexts run the program's own code");
    return err;
}

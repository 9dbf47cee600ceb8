/*
 * Restore: each module's known-good image, as the state directory's records
 * name it (lkg.c), committed again through the swap transaction, as a
 * built hk_swap is (hkl_swap_job), without a build and without a canary
 * run (the image ran). hk_runtime_restore runs on the caller's thread (or
 * at create, with options.restore) with no engine lock held; it takes
 * lkg_lock only inside lkg.c, to copy the records out, and swap_lock only
 * inside each swap.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/abi.h"
#include "loader/context.h"
#include "loader/job.h"
#include "loader/lkg.h"
#include "loader/swap.h"

/* Commits one module's known-good image. */
static int restore_one(hk_runtime *rt, const hkl_lkg_good *it, hk_report *r) {
    char why[512];
    char *data;
    size_t n;
    int err = hkl_lkg_read_image(rt, it->good.hash, &data, &n, why, sizeof why);
    if (err) {
        hku_fail(r, err, "%s", why);
        return err;
    }
    hkl_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(data);
        return HK_ERR_NOMEM;
    }
    snprintf(j->name, sizeof j->name, "%s", it->module);
    hk_swap_options_init(&j->opt);
    j->opt.release_version = it->good.release;
    j->opt.canary = HK_CANARY_SKIP; /* it ran */
    j->seq = atomic_fetch_add(&rt->work.job_seq, 1) + 1;
    j->t_start = hkl_now_ms();
    j->origin = strdup("restore");
    j->art.image = data;
    j->art.size = n;
    j->art.format = it->good.format;
    /* hkl_lkg_read_image checked that the image hashes to its name in the
     * record: the swap takes no hash of its own. */
    memcpy(j->hash, it->good.hash, sizeof j->hash);
    j->hashed = 1;
    j->name_expressions = hku_strv_dup((const char *const *)it->expr, it->nexpr);
    j->art.lowered_names = hku_strv_dup((const char *const *)it->lowered, it->nexpr);
    if (!j->origin || (it->nexpr && (!j->name_expressions || !j->art.lowered_names))) {
        hkl_job_free(j);
        return HK_ERR_NOMEM;
    }
    j->opt.nname_expressions = j->art.nlowered = it->nexpr;
    j->opt.name_expressions = (const char *const *)j->name_expressions;
    j->opt.origin = j->origin;
    if (hkp_meta_read(data, n, it->good.format, &j->art.meta, why, sizeof why) < 0) {
        hku_fail(r, HK_ERR_FORMAT, "kept image of '%s': %s", it->module, why);
        hkl_job_free(j);
        return HK_ERR_FORMAT;
    }
    j->built = 1;
    err = hkl_swap_job(rt, j, r);
    hkl_job_free(j);
    return err;
}

static void msg_add(char *msg, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void msg_add(char *msg, size_t n, const char *fmt, ...) {
    size_t k = strlen(msg);
    if (k + 1 >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + k, n - k, fmt, ap);
    va_end(ap);
}

int hk_runtime_restore(hk_runtime *rt, hk_report *rep) {
    hk_report full;
    if (!rt || hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    hk_report_clear(&full);
    if (!hkl_lkg_dir(rt)) {
        hku_fail(&full, HK_ERR_UNSUPPORTED, "no state directory (options.state_dir)");
        hkb_report_out(rep, &full);
        return HK_ERR_UNSUPPORTED;
    }
    if (hkl_swap_held(rt)) {
        hku_fail(&full, HK_ERR_BUSY, "restore cannot run inside a check callback");
        hkb_report_out(rep, &full);
        return HK_ERR_BUSY;
    }
    hkl_lkg_good *items;
    char refused[1024], msg[sizeof full.message] = "";
    int n = hkl_lkg_goods(rt, &items, refused, sizeof refused), done = 0;
    for (int i = 0; i < n; i++) {
        hkl_lkg_good *it = &items[i];
        hk_report r = HK_REPORT_INIT;
        int err = it->runs ? 0 : restore_one(rt, it, &r);
        if (err == 0)
            done++;
        msg_add(msg, sizeof msg, "%s%s: %s", msg[0] ? "; " : "", it->module,
                err        ? r.message
                : it->runs ? "runs its known-good image"
                           : "restored");
        if (err)
            hk_log(rt, HK_LOG_WARN, "engine", "restore of '%s' failed: %s", it->module, r.message);
        hk_report_clear(&r);
        hku_strv_free(it->expr, it->nexpr);
        hku_strv_free(it->lowered, it->nexpr);
    }
    free(items);
    if (refused[0])
        msg_add(msg, sizeof msg, "%srecords refused: %s", msg[0] ? "; " : "", refused);
    if (!msg[0])
        snprintf(msg, sizeof msg, "no known-good image recorded");
    hku_fail(&full, 0, "%s", msg);
    hk_log(rt, HK_LOG_INFO, "engine", "restored %d module(s) from %s: %s", done, hkl_lkg_dir(rt),
           msg);
    hkb_report_out(rep, &full);
    return done;
}

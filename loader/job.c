/*
 * A job: one submission of a module's input, with owned copies of
 * everything the caller passed (the image, the options' strings and
 * headers), from hk_swap or hk_submit (worker.c), a rollback (swap.c) or a
 * restore (restore.c) to the end of its swap; the build fills its artifact
 * (ptx/). A job belongs to one thread at a time: the one that made it, the
 * worker after hk_submit queued it (work_lock while queued), or a safe point
 * that took it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/abi.h"
#include "loader/job.h"

int hk_swap_options_init_size(hk_swap_options *o, size_t size) {
    hk_swap_options d;
    memset(&d, 0, sizeof d);
    d.carry_globals = 1;
    d.stage = HK_STAGE_AUTO;
    return hkb_sized_init(o, size, &d, sizeof d, HKB_SWAP_OPTIONS_SIZE0);
}

void hkl_job_free(hkl_job *job) {
    if (!job)
        return;
    free(job->data);
    free(job->origin);
    free(job->source_name);
    hku_strv_free(job->nvrtc_options, job->opt.nnvrtc_options);
    hku_strv_free(job->name_expressions, job->opt.nname_expressions);
    free(job->headers);
    hkp_artifact_free(&job->art);
    free(job);
}

int hkl_job_new(hkl_job **out, const char *name, const void *data, size_t size,
                const hk_swap_options *opt) {
    /* A name that could not be recorded or logged is refused here, before
     * anything is built (util/util.h, hku_name_check). */
    if (hku_name_check(name, NULL, 0) < 0 || !data || !size)
        return HK_ERR_INVALID;
    hkl_job *j = calloc(1, sizeof *j);
    if (!j)
        return HK_ERR_NOMEM;
    snprintf(j->name, sizeof j->name, "%s", name);
    if (hkb_swap_options_in(&j->opt, opt) < 0) {
        free(j);
        return HK_ERR_INVALID;
    }
    j->data = malloc(size);
    j->origin = strdup(j->opt.origin ? j->opt.origin : "api");
    j->source_name = j->opt.source_name ? strdup(j->opt.source_name) : NULL;
    j->nvrtc_options = hku_strv_dup(j->opt.nvrtc_options, j->opt.nnvrtc_options);
    j->name_expressions = hku_strv_dup(j->opt.name_expressions, j->opt.nname_expressions);
    if (!j->data || !j->origin || (j->opt.source_name && !j->source_name) ||
        (j->opt.nnvrtc_options > 0 && !j->nvrtc_options) ||
        (j->opt.nname_expressions > 0 && !j->name_expressions)) {
        if (!j->nvrtc_options)
            j->opt.nnvrtc_options = 0;
        if (!j->name_expressions)
            j->opt.nname_expressions = 0;
        hkl_job_free(j);
        return HK_ERR_NOMEM;
    }
    int herr =
        hku_headers_dup(j->opt.headers, j->opt.nheaders > 0 ? j->opt.nheaders : 0, &j->headers);
    if (herr < 0) {
        hkl_job_free(j);
        return herr;
    }
    j->opt.headers = j->headers;
    if (!j->headers)
        j->opt.nheaders = 0;
    memcpy(j->data, data, size);
    j->size = size;
    /* The copies replace the caller's pointers, which die with the call. */
    j->opt.nvrtc_options = (const char *const *)j->nvrtc_options;
    j->opt.name_expressions = (const char *const *)j->name_expressions;
    j->opt.source_name = j->source_name;
    j->opt.origin = j->origin;
    *out = j;
    return 0;
}

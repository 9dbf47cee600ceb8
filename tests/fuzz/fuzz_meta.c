/*
 * libFuzzer target for the hand-written parsers of ptx/ (detect.c, meta.c).
 *
 * Kernel images reach these parsers from watched directories and the
 * network, so any byte string must give a result or HK_ERR_FORMAT, never a
 * crash, an over-read or a leak. Each input is read as detected and then
 * forced through every parser, since a hostile file may claim any format.
 * Built and run by `make fuzz`, seeded with a PTX, cubins and a fatbin made
 * at that moment by the installed toolkit.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/ptx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_meta(const hkp_meta *m, int rc) {
    if (rc != 0)
        return;
    /* What a successful parse returns must be usable as documented. */
    for (int i = 0; i < m->nentries; i++) {
        if (!m->entries[i].name || m->entries[i].nparams < 0)
            abort();
        (void)strlen(m->entries[i].name);
        for (int k = 0; k < m->entries[i].nparams; k++)
            if ((uint64_t)m->entries[i].params[k].offset + m->entries[i].params[k].size >
                UINT64_C(1) << 33)
                abort();
    }
    for (int i = 0; i < m->nglobals; i++)
        (void)strlen(m->globals[i].name);
    if (m->narchs < 0 || m->narchs > 16 || m->nptx_archs < 0 || m->nptx_archs > 16)
        abort();
    (void)hkp_meta_runs_on(m, 90);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hk_format fmt;
    hkp_meta m;
    char why[256];
    int rc = hkp_detect(data, size, &fmt, why, sizeof why);
    if (rc == 0 && fmt != HK_FORMAT_CUDA_C) {
        rc = hkp_meta_read(data, size, HK_FORMAT_AUTO, &m, why, sizeof why);
        check_meta(&m, rc);
        hkp_meta_free(&m);
    }
    static const hk_format all[] = {HK_FORMAT_PTX, HK_FORMAT_CUBIN, HK_FORMAT_FATBIN};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        rc = hkp_meta_read(data, size, all[i], &m, why, sizeof why);
        if (rc != 0 && rc != HK_ERR_FORMAT && rc != HK_ERR_NOMEM)
            abort();
        if (rc != 0 && !why[0])
            abort(); /* every refusal carries a reason */
        check_meta(&m, rc);
        hkp_meta_free(&m);
    }
    /* A fatbin's kernels: every member's parse, merged. */
    int unread = -1;
    rc = hkp_fatbin_kernels(data, size, &m, &unread);
    if ((rc != 0 && rc != HK_ERR_FORMAT && rc != HK_ERR_NOMEM) || (rc == 0 && unread < 0))
        abort();
    check_meta(&m, rc);
    hkp_meta_free(&m);
    return 0;
}

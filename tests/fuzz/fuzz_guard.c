/*
 * libFuzzer target for the canary's trap guard (ptx/guard.c), which
 * rewrites pushed PTX before the canary runs it.
 *
 * Any byte string must be guarded, left alone (nothing to guard) or refused
 * with a reason, never crash or read past its length. What is guarded must
 * hold what the canary relies on: one declaration of the guard's global,
 * one store per site whose code numbers the sites in order with a known
 * kind; a copy has nothing left to guard (or, where the input held more
 * such text than sites, names the global and is refused); and where the
 * input is PTX the metadata parser reads, the copy reads as the same
 * kernels with the same parameters plus the one global.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/ptx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* The copy's stores, in order: site i + 1 stores (i + 1) << 2 | kind. */
static void check_stores(const char *out, int sites) {
    const char *store = "st.global.u32 [" HKP_GUARD_SYMBOL "], ";
    int i = 0;
    for (const char *p = strstr(out, store); p; p = strstr(p + 1, store), i++) {
        unsigned long code = strtoul(p + strlen(store), NULL, 10);
        if (HKP_GUARD_SITE(code) != (unsigned long)i + 1 || HKP_GUARD_KIND(code) < 1 ||
            HKP_GUARD_KIND(code) > 3)
            abort();
    }
    if (i < sites) /* an input may hold such text itself: never fewer */
        abort();
}

static int same_kernels(const hkp_meta *a, const hkp_meta *b) {
    if (a->nentries != b->nentries || a->nglobals + 1 != b->nglobals)
        return 0;
    for (int i = 0; i < a->nentries; i++) {
        if (strcmp(a->entries[i].name, b->entries[i].name) ||
            a->entries[i].nparams != b->entries[i].nparams)
            return 0;
        for (int k = 0; k < a->entries[i].nparams; k++)
            if (a->entries[i].params[k].offset != b->entries[i].params[k].offset ||
                a->entries[i].params[k].size != b->entries[i].params[k].size)
                return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *in = malloc(size ? size : 1); /* exactly size bytes: ASan sees an over-read */
    if (!in)
        abort();
    if (size)
        memcpy(in, data, size);
    char *out = NULL, why[256] = "";
    size_t n = 0;
    int sites = -1;
    int rc = hkp_guard_ptx(in, size, &out, &n, &sites, why, sizeof why);
    if (rc != 0 && rc != HK_ERR_FORMAT && rc != HK_ERR_NOMEM)
        abort();
    if (rc != 0 && (out || sites != 0 || (rc == HK_ERR_FORMAT && !why[0])))
        abort();
    if (rc == 0 && !out && sites != 0)
        abort();
    if (out) {
        if (sites <= 0 || n != strlen(out) + 1 ||
            count(out, ".visible .global .align 4 .u32 " HKP_GUARD_SYMBOL ";") != 1)
            abort();
        check_stores(out, sites);
        char *again = NULL;
        size_t n2;
        int s2;
        int r2 = hkp_guard_ptx(out, n, &again, &n2, &s2, NULL, 0);
        if ((r2 != 0 && r2 != HK_ERR_FORMAT) || again)
            abort();
        hkp_meta mi, mo;
        if (hkp_meta_read(in, size, HK_FORMAT_PTX, &mi, NULL, 0) == 0) {
            int ro = hkp_meta_read(out, n, HK_FORMAT_PTX, &mo, NULL, 0);
            if (ro != 0 && ro != HK_ERR_NOMEM)
                abort();
            if (ro == 0 && !same_kernels(&mi, &mo))
                abort();
            hkp_meta_free(&mo);
            hkp_meta_free(&mi);
        }
        free(out);
    }
    free(in);
    return 0;
}

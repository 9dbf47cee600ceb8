/*
 * Binaries built by the publisher: which artifact of a release a host runs.
 *
 * `hotkern publish --build-for sm_80,sm_90` compiles the release's CUDA C
 * once per architecture (the build hk_check runs, without a GPU) and ships
 * each cubin beside its source: an artifact of format "cubin" with its
 * "arch", the "source" it was built from and the "toolkit" that built it,
 * hashed and signed in the manifest like every other artifact. A host whose
 * device runs one of them loads it and compiles nothing; the others build
 * the source as before.
 *
 * Which cubin runs where follows CUDA's rule for machine code (the CUDA
 * C++ Programming Guide, "Binary Compatibility"): a cubin of compute
 * capability X.y runs on a device of X.z with z >= y, never on another
 * major; one built for an arch-specific ("sm_90a") or family ("sm_100f")
 * target only on that very architecture here (a family target would run on
 * more, but this side of the rule is the safe one). The same architecture
 * is preferred, then the highest minor below the device's. The label is the
 * manifest's word only: the engine reads the cubin's own architecture from
 * its ELF header before loading it, and refuses one that does not run.
 *
 * A shipped cubin that cannot be loaded here (the engine's arch check, the
 * driver's CUDA_ERROR_NO_BINARY_FOR_GPU or INVALID_IMAGE, a driver older
 * than the toolkit that built it: CUDA_ERROR_UNSUPPORTED_PTX_VERSION) is not
 * a verdict on the release: the host builds the source instead, logs it and
 * counts it (net/refused.c's hkn_release_apply). A cubin that loads and then
 * fails a check (layout, expectations, canary) is refused as a built one
 * would be: its source would build the same code.
 *
 * The host's own build options (the swap template's NVRTC options and name
 * expressions, which the publisher's build did not have) make its build
 * differ from the publisher's: such an engine says why in no_shipped and
 * builds the source (net/api.c).
 *
 * No state and no lock: pure functions of the manifest.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

/* "sm_86" into 86 and its suffix ('\0', 'a' or 'f'); 0 when it is not
 * one. */
static int parse_sm(const char *s, char *suffix) {
    if (!s || strncmp(s, "sm_", 3))
        return 0;
    char *end;
    long v = strtol(s + 3, &end, 10);
    if (end == s + 3 || v < 10 || v > 9999 || s[3] == '+' || s[3] == '-' || s[3] == ' ')
        return 0;
    if ((*end == 'a' || *end == 'f') && end[1] == '\0')
        *suffix = *end;
    else if (*end == '\0')
        *suffix = '\0';
    else
        return 0;
    return (int)v;
}

int hkn_arch_runs_on(const char *label, const char *device) {
    char ls, ds;
    int img = parse_sm(label, &ls), dev = parse_sm(device, &ds);
    if (!img || !dev)
        return 0;
    if (ls) /* sm_90a runs on a 9.0 device, which the runtime names sm_90 */
        return img == dev;
    return img / 10 == dev / 10 && img % 10 <= dev % 10;
}

static int is_binary(const hkn_artifact *a) {
    return !a->header && (a->format == HK_FORMAT_CUBIN || a->format == HK_FORMAT_FATBIN);
}

static size_t find_named(const hkn_manifest *m, const char *name) {
    for (size_t i = 0; i < m->nartifacts; i++)
        if (!m->artifacts[i].header && !strcmp(m->artifacts[i].name, name))
            return i;
    return SIZE_MAX;
}

int hkn_shipped_validate(const hkn_manifest *m, hk_report *rep) {
    for (size_t i = 0; i < m->nartifacts; i++) {
        const hkn_artifact *a = &m->artifacts[i];
        if (!a->source[0]) {
            if (a->toolkit[0])
                return hku_fail(rep, HK_ERR_INVALID,
                                "manifest: artifact '%s' names a toolkit but no source", a->name);
            continue;
        }
        char suffix;
        if (a->format != HK_FORMAT_CUBIN || !parse_sm(a->arch, &suffix))
            return hku_fail(rep, HK_ERR_INVALID,
                            "manifest: artifact '%s' is built from '%s' but is not a cubin with "
                            "an arch (sm_XY)",
                            a->name, a->source);
        size_t s = find_named(m, a->source);
        if (s == SIZE_MAX ||
            (m->artifacts[s].format != HK_FORMAT_CUDA_C && m->artifacts[s].format != HK_FORMAT_PTX))
            return hku_fail(rep, HK_ERR_INVALID,
                            "manifest: artifact '%s' is built from '%s', which is no CUDA C or "
                            "PTX artifact of the release",
                            a->name, a->source);
    }
    return 0;
}

size_t hkn_pick_artifact(const hkn_manifest *m, const char *arch) {
    static const hk_format order[] = {HK_FORMAT_FATBIN, HK_FORMAT_PTX, HK_FORMAT_CUDA_C};
    size_t best = SIZE_MAX;
    int best_num = -1;
    for (size_t i = 0; arch && arch[0] && i < m->nartifacts; i++) {
        const hkn_artifact *a = &m->artifacts[i];
        if (!is_binary(a))
            continue;
        if (!strcmp(a->arch, arch))
            return i;
        char suffix;
        int num = parse_sm(a->arch, &suffix);
        if (hkn_arch_runs_on(a->arch, arch) && num > best_num) {
            best = i;
            best_num = num;
        }
    }
    if (best != SIZE_MAX)
        return best;
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++)
        for (size_t i = 0; i < m->nartifacts; i++)
            if (!m->artifacts[i].header && m->artifacts[i].format == order[k])
                return i;
    for (size_t i = 0; i < m->nartifacts; i++)
        if (!m->artifacts[i].header)
            return i;
    return 0;
}

size_t hkn_shipped_pick(const hkn_manifest *m, const hkn_engine *e, size_t *fallback) {
    *fallback = SIZE_MAX;
    const char *arch = e ? e->arch : NULL;
    if (e && e->no_shipped) {
        /* The release without the binaries built from its sources. */
        hkn_manifest own = *m;
        hkn_artifact arts[HKN_MAX_ARTIFACTS];
        size_t map[HKN_MAX_ARTIFACTS], n = 0;
        for (size_t i = 0; i < m->nartifacts && n < HKN_MAX_ARTIFACTS; i++)
            if (!m->artifacts[i].source[0]) {
                map[n] = i;
                arts[n++] = m->artifacts[i];
            }
        own.artifacts = arts;
        own.nartifacts = n;
        return n ? map[hkn_pick_artifact(&own, arch)] : hkn_pick_artifact(m, arch);
    }
    size_t k = hkn_pick_artifact(m, arch);
    if (k < m->nartifacts && m->artifacts[k].source[0])
        *fallback = find_named(m, m->artifacts[k].source);
    return k;
}

void hkn_shipped_needed(const hkn_manifest *m, const hkn_engine *e, int need[HKN_MAX_ARTIFACTS]) {
    size_t fallback, k = hkn_shipped_pick(m, e, &fallback);
    for (size_t i = 0; i < m->nartifacts && i < HKN_MAX_ARTIFACTS; i++)
        need[i] = m->artifacts[i].header || i == k || i == fallback;
}

int hkn_shipped_load_failed(int err) {
    /* The engine's codes for a binary it could not load (loader/version.c:
     * NO_BINARY_FOR_GPU is HK_ERR_ARCH; INVALID_IMAGE and
     * UNSUPPORTED_PTX_VERSION are HK_ERR_COMPILE, a binary being compiled by
     * no one else), an ELF it cannot read, or another driver refusal. */
    return err == HK_ERR_ARCH || err == HK_ERR_COMPILE || err == HK_ERR_FORMAT ||
           err == HK_ERR_CUDA;
}

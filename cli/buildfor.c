/*
 * --build-for: a release's CUDA C compiled once, by the publisher, for each
 * architecture of a fleet.
 *
 * `hotkern publish --build-for sm_80,sm_90 ...` (and `rollout start`)
 * compiles every CUDA C file of the release for each listed architecture
 * with the build `hotkern check` runs (hk_checker: NVRTC and nvJitLink, no
 * GPU or driver), with the release's headers as in-memory headers and the
 * file's own name, as a host's swap builds it. Each cubin joins the release
 * as an artifact beside its source: format "cubin", its "arch", the
 * "source" it was built from and the "toolkit" that built it ("nvrtc
 * 13.0"), hashed and signed in the manifest with everything else. A host
 * whose device runs one of them loads it and compiles nothing
 * (net/shipped.c); the others build the source.
 *
 * Any architecture that does not build refuses the whole publish with the
 * compiler's log, before anything is signed or written: a fleet never gets
 * half a release. The build uses no option of the host's swap template
 * (NVRTC options, name expressions): a host that has some builds the source
 * itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

#include "cli/cli.h"
#include "net/net.h"

#define MAX_ARCHS 16

struct hkc_built {
    char names[HKN_MAX_ARTIFACTS][128];
    char archs[HKN_MAX_ARTIFACTS][16];
    char sources[HKN_MAX_ARTIFACTS][128];
    void *bytes[HKN_MAX_ARTIFACTS];
    size_t sizes[HKN_MAX_ARTIFACTS];
    int n;
    char toolkit[32];
};

void hkc_built_free(hkc_built *b) {
    if (!b)
        return;
    for (int i = 0; i < b->n; i++)
        free(b->bytes[i]);
    free(b);
}

struct arch {
    int num, specific;
    char label[16];
};

/* The architectures this NVRTC compiles for, into v (up to max); their
 * count, or -1 when NVRTC cannot say. */
static int supported(int *v, int max) {
    int num = 0;
    if (nvrtcGetNumSupportedArchs(&num) != NVRTC_SUCCESS || num <= 0 || num > max ||
        nvrtcGetSupportedArchs(v) != NVRTC_SUCCESS)
        return -1;
    return num;
}

/* "sm_80,sm_90a,100" into archs: each once, each one NVRTC compiles for.
 * Returns the count, or a usage error's status (negated: -2). */
static int parse_list(hkc_out *o, const char *list, struct arch *archs) {
    int v[128], nsup = supported(v, (int)(sizeof v / sizeof v[0])), n = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        char item[32];
        if (len == 0 || len >= sizeof item) {
            hkc_usage(o, "--build-for takes a comma-separated list of sm_XY (e.g. sm_80,sm_90)");
            return -2;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        const char *s = strncmp(item, "sm_", 3) ? item : item + 3;
        char *end;
        long num = strtol(s, &end, 10);
        int specific = *end == 'a' && end[1] == '\0';
        if (end == s || num < 10 || num > 9999 || (*end && !specific)) {
            hkc_usage(o, "--build-for: '%s' is not sm_XY or sm_XYa", item);
            return -2;
        }
        int known = nsup < 0;
        for (int i = 0; i < nsup; i++)
            known |= v[i] == num;
        if (!known) {
            char names[600] = "";
            size_t used = 0;
            for (int i = 0; i < nsup && used < sizeof names; i++)
                used += (size_t)snprintf(names + used, sizeof names - used, "%ssm_%d",
                                         i ? ", " : "", v[i]);
            hkc_usage(o, "--build-for: this NVRTC does not compile for sm_%ld; it does for %s", num,
                      names);
            return -2;
        }
        if (n == MAX_ARCHS) {
            hkc_usage(o, "--build-for: at most %d architectures", MAX_ARCHS);
            return -2;
        }
        archs[n] = (struct arch){.num = (int)num, .specific = specific};
        snprintf(archs[n].label, sizeof archs[n].label, "sm_%ld%s", num, specific ? "a" : "");
        for (int i = 0; i < n; i++)
            if (!strcmp(archs[i].label, archs[n].label)) {
                hkc_usage(o, "--build-for: %s is listed twice", archs[n].label);
                return -2;
            }
        n++;
        p += len;
        if (*p == ',')
            p++;
    }
    if (!n)
        hkc_usage(o, "--build-for needs at least one architecture");
    return n ? n : -2;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Builds source blob src for arch a with checker c into b's next entry. */
static int build_one(hkc_out *o, hk_checker *c, const hkn_blob *src, const struct arch *a,
                     hkc_built *b) {
    hk_report rep = HK_REPORT_INIT;
    hk_check_result *res = NULL;
    const char *name = base_name(src->name);
    int rc = 0;
    if (hk_checker_check(c, name, src->bytes, src->size, &res, &rep)) {
        char msg[700];
        snprintf(msg, sizeof msg, "--build-for %s: %s does not build: %s (nothing published)",
                 a->label, name, rep.message);
        rc = hkc_fail(o, rep.error, rep.log, "%s", msg);
        hk_report_clear(&rep);
        return rc;
    }
    size_t size = 0;
    hk_format fmt = HK_FORMAT_AUTO;
    const void *img = hk_check_result_image(res, &size, &fmt);
    int i = b->n;
    if (fmt != HK_FORMAT_CUBIN || !img || !size) {
        rc = hkc_fail(o, HK_ERR_FORMAT, NULL, "--build-for %s: %s built no cubin (%s)", a->label,
                      name, hk_format_name(fmt));
    } else if (!(b->bytes[i] = malloc(size))) {
        rc = hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    } else {
        memcpy(b->bytes[i], img, size);
        b->sizes[i] = size;
        size_t stem = strlen(name);
        if (stem > 3 && !strcmp(name + stem - 3, ".cu"))
            stem -= 3;
        snprintf(b->names[i], sizeof b->names[i], "%.*s.%s.cubin", (int)(stem > 100 ? 100 : stem),
                 name, a->label);
        snprintf(b->archs[i], sizeof b->archs[i], "%s", a->label);
        snprintf(b->sources[i], sizeof b->sources[i], "%s", name);
        b->n++;
        if (!o->json)
            printf("built %s for %s: %s (%zu bytes, %s)\n", name, a->label, b->names[i], size,
                   b->toolkit);
    }
    hk_check_result_free(res);
    hk_report_clear(&rep);
    return rc;
}

/* Builds every CUDA C blob for arch a, the release's headers in memory. */
static int build_arch(hkc_out *o, const struct arch *a, hkn_blob *blobs, size_t n, hkc_built *b) {
    hk_header hdrs[HKN_MAX_ARTIFACTS];
    int nh = 0;
    for (size_t i = 0; i < n; i++)
        if (blobs[i].header ||
            (blobs[i].format == HK_FORMAT_AUTO && hkn_is_header_name(base_name(blobs[i].name))))
            hdrs[nh++] = (hk_header){
                .name = base_name(blobs[i].name), .data = blobs[i].bytes, .size = blobs[i].size};
    hk_check_options opt;
    hk_check_options_init(&opt);
    opt.arch = a->num;
    opt.arch_specific = a->specific;
    opt.format = HK_FORMAT_CUDA_C;
    opt.headers = nh ? hdrs : NULL;
    opt.nheaders = nh;
    hk_checker *c = NULL;
    hk_report rep = HK_REPORT_INIT;
    int rc = 0;
    if (hk_checker_create(&c, &opt, &rep))
        rc = hkc_fail_report(o, &rep);
    for (size_t i = 0; i < n && !rc; i++)
        if (blobs[i].format == HK_FORMAT_CUDA_C && !blobs[i].header)
            rc = build_one(o, c, &blobs[i], a, b);
    hk_checker_destroy(c);
    hk_report_clear(&rep);
    return rc;
}

int hkc_build_for(hkc_out *o, const char *list, struct hkn_blob *blobs, size_t *n, size_t max,
                  hkc_built **out) {
    struct arch archs[MAX_ARCHS];
    *out = NULL;
    int na = parse_list(o, list, archs);
    if (na < 0)
        return -na;
    size_t nsrc = 0;
    for (size_t i = 0; i < *n; i++)
        nsrc += blobs[i].format == HK_FORMAT_CUDA_C && !blobs[i].header;
    if (!nsrc)
        return hkc_usage(o, "--build-for needs a CUDA C file (.cu) in the release");
    if (*n + nsrc * (size_t)na > max)
        return hkc_usage(o,
                         "--build-for: %zu file(s) and %zu cubin(s) are over the %zu artifacts "
                         "a release holds",
                         *n, nsrc * (size_t)na, max);
    hkc_built *b = calloc(1, sizeof *b);
    if (!b)
        return hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) == NVRTC_SUCCESS)
        snprintf(b->toolkit, sizeof b->toolkit, "nvrtc %d.%d", major, minor);
    else
        snprintf(b->toolkit, sizeof b->toolkit, "nvrtc");
    int rc = 0;
    for (int k = 0; k < na && !rc; k++)
        rc = build_arch(o, &archs[k], blobs, *n, b);
    if (rc) {
        hkc_built_free(b);
        return rc;
    }
    for (int i = 0; i < b->n; i++)
        blobs[(*n)++] = (hkn_blob){.name = b->names[i],
                                   .bytes = b->bytes[i],
                                   .size = b->sizes[i],
                                   .format = HK_FORMAT_CUBIN,
                                   .arch = b->archs[i],
                                   .source = b->sources[i],
                                   .toolkit = b->toolkit};
    *out = b;
    return 0;
}

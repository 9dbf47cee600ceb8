/*
 * nvJitLink: PTX to a cubin, in this process, and the trap guard's copy.
 *
 * PTX goes through nvJitLink, never the driver JIT, because the driver JIT
 * stalls every launching thread of the process: the driver compiles inside
 * the load, which holds the lock every launch takes (docs/DESIGN.md, "Under
 * a real program's load"). A link takes the caller's ptxas options of
 * nvrtc_options translated (link_opts, ptx/build.h), so that a cubin linked
 * from NVRTC's PTX is built as NVRTC would build it, and the guarded copy
 * of a version (ptx/guard.c) is linked exactly as its image is.
 */
#include <nvJitLink.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptx/build.h"

static const char *value_of(const char *a, const char *const *names) {
    for (; *names; names++) {
        size_t l = strlen(*names);
        if (!strncmp(a, *names, l) && a[l] == '=')
            return a + l + 1;
    }
    return NULL;
}

static const char *const unlinkable[] = {
    "-rdc",  "--relocatable-device-code", "-dc",   "-ewp",   "--extensible-whole-program",
    "-dlto", "--dlink-time-opt",          "-dopt", "--dopt", NULL};

static int is_unlinkable(const char *a) {
    for (const char *const *r = unlinkable; *r; r++) {
        size_t n = strlen(*r);
        if (!strncmp(a, *r, n) && (a[n] == '\0' || a[n] == '='))
            return 1;
    }
    return 0;
}

/* The first of o's NVRTC options that hkp_link_opts_make cannot give nvJitLink
 * (NULL: none). */
const char *hkp_unlinkable_option(const hkp_build_opts *o) {
    for (int i = 0; i < o->nnvrtc_options; i++)
        if (o->nvrtc_options[i] && is_unlinkable(o->nvrtc_options[i]))
            return o->nvrtc_options[i];
    return NULL;
}

void hkp_link_opts_make(link_opts *l, int arch, const hkp_build_opts *o) {
    static const char *const regs[] = {"--maxrregcount", "-maxrregcount", NULL};
    static const char *const ptxas[] = {"--ptxas-options", "-Xptxas", NULL};
    static const char *const fc[] = {"--Ofast-compile", "-Ofast-compile", "-Ofc", NULL};
    memset(l, 0, sizeof *l);
    snprintf(l->arch, sizeof l->arch, "-arch=sm_%d%s", HKP_ARCH_NUM(arch),
             (arch & HKP_ARCH_SPECIFIC) ? "a" : "");
    l->argv[l->argc++] = l->arch;
    int fast_named = 0;
    for (int i = 0; i < o->nnvrtc_options && l->argc < MAX_LINK_OPTS - 1; i++) {
        const char *a = o->nvrtc_options[i], *v;
        if (!a || is_unlinkable(a))
            continue;
        char *m = l->nmore < 8 ? l->more[l->nmore] : NULL;
        if ((v = value_of(a, regs)) && m)
            snprintf(m, 96, "-maxrregcount=%s", v);
        else if ((v = value_of(a, ptxas)) && m)
            snprintf(m, 96, "-Xptxas=%s", v);
        else if ((v = value_of(a, fc)) && m)
            snprintf(m, 96, "-Ofc=%s", v), fast_named = 1;
        else if (!strcmp(a, "-G") || !strcmp(a, "--device-debug"))
            m = "-g";
        else if (!strcmp(a, "-lineinfo") || !strcmp(a, "--generate-line-info"))
            m = "-lineinfo";
        else
            continue; /* the front end's and NVVM's: their effect is in the PTX */
        if (m == l->more[l->nmore])
            l->nmore++;
        l->argv[l->argc++] = m;
        l->translated++;
    }
    if (!fast_named) {
        if (o->fast_compile)
            snprintf(l->opt, sizeof l->opt, "-Ofc=max");
        else
            snprintf(l->opt, sizeof l->opt, "-O%d", o->opt_level > 0 ? 3 : 0);
        l->argv[l->argc++] = l->opt;
    }
}

static int jitlink_log(nvJitLinkHandle h, int errors, char **log) {
    size_t n = 0;
    nvJitLinkResult r = errors ? nvJitLinkGetErrorLogSize(h, &n) : nvJitLinkGetInfoLogSize(h, &n);
    if (r != NVJITLINK_SUCCESS || n <= 1)
        return 0;
    char *buf = malloc(n);
    if (!buf)
        return HK_ERR_NOMEM;
    r = errors ? nvJitLinkGetErrorLog(h, buf) : nvJitLinkGetInfoLog(h, buf);
    if (r == NVJITLINK_SUCCESS)
        log_append(log, buf);
    free(buf);
    return 0;
}

/* PTX (size bytes, NUL-terminated or not) to a cubin for `arch` (which may
 * carry HKP_ARCH_SPECIFIC) with o's link options (hkp_link_opts_make).
 * Replaces a->image with the cubin; nvJitLink's log goes to a->log. */
int hkp_jitlink_ptx(const void *ptx, size_t size, int arch, const hkp_build_opts *o,
                    const char *name, hkp_artifact *a, char *why, size_t why_size) {
    nvJitLinkHandle h = NULL;
    link_opts lo;
    void *cubin = NULL;
    char *text = NULL;
    int rc = 0;
    nvJitLinkResult r;

    hkp_link_opts_make(&lo, arch, o);
    r = nvJitLinkCreate(&h, (uint32_t)lo.argc, lo.argv);
    if (r != NVJITLINK_SUCCESS) {
        hkp_why(why, why_size, "nvJitLink: cannot create a link (error %d)", (int)r);
        return HK_ERR_COMPILE;
    }
    /* nvJitLink reads PTX as a C string, whatever size says. */
    if (size == 0 || ((const char *)ptx)[size - 1] != '\0') {
        text = malloc(size + 1);
        if (!text) {
            rc = HK_ERR_NOMEM;
            goto out;
        }
        memcpy(text, ptx, size);
        text[size++] = '\0';
        ptx = text;
    }
    r = nvJitLinkAddData(h, NVJITLINK_INPUT_PTX, ptx, size, name);
    if (r == NVJITLINK_SUCCESS)
        r = nvJitLinkComplete(h);
    rc = jitlink_log(h, r != NVJITLINK_SUCCESS, &a->log);
    if (rc)
        goto out;
    if (r != NVJITLINK_SUCCESS) {
        char line[400];
        first_error_line(a->log, line, sizeof line);
        hkp_why(why, why_size, "nvJitLink: %s", line[0] ? line : "link failed");
        rc = HK_ERR_COMPILE;
        goto out;
    }
    size_t n = 0;
    r = nvJitLinkGetLinkedCubinSize(h, &n);
    if (r != NVJITLINK_SUCCESS || n == 0) {
        hkp_why(why, why_size, "nvJitLink: no cubin produced");
        rc = HK_ERR_COMPILE;
        goto out;
    }
    cubin = malloc(n);
    if (!cubin) {
        rc = HK_ERR_NOMEM;
        goto out;
    }
    if (nvJitLinkGetLinkedCubin(h, cubin) != NVJITLINK_SUCCESS) {
        hkp_why(why, why_size, "nvJitLink: cannot read the cubin");
        rc = HK_ERR_COMPILE;
        goto out;
    }
    free(a->image);
    a->image = cubin;
    a->size = n;
    a->format = HK_FORMAT_CUBIN;
    cubin = NULL;
out:
    free(text);
    free(cubin);
    nvJitLinkDestroy(&h);
    return rc;
}

/* Says in a's log why its trap guard's copy was not made (the build goes
 * on unguarded). */
int hkp_guard_note(hkp_artifact *a, const char *why) {
    char line[400];
    snprintf(line, sizeof line, "hotkern: the canary's trap guard was not built (%s)", why);
    return log_append(&a->log, line);
}

/* The trap guard's copy of a build (guard.c), made after its image: from
 * the image's PTX, a cubin linked exactly as the image is (to_cubin: the
 * same nvJitLink options, so that the copy differs from what commits at
 * its sites alone), else the guarded PTX. Only when o->trap_guard and the
 * PTX has something to guard. A copy that cannot be made leaves the build
 * unguarded (its canary runs traps for real), and the build's log says
 * why; only memory running out fails the build. */
int hkp_guard_build(const char *ptx, size_t n, const hkp_build_opts *o, int to_cubin, int link_arch,
                    const char *name, hkp_artifact *a) {
    if (!o->trap_guard)
        return 0;
    char *g = NULL, why[300] = "";
    size_t gn = 0;
    int sites = 0, rc = 0;
    const char *bad = to_cubin ? hkp_unlinkable_option(o) : NULL;
    if (bad) /* the image's link leaves it out: the copy cannot be built as the image is */
        snprintf(why, sizeof why, "NVRTC option '%.100s' has no nvJitLink equivalent", bad),
            rc = HK_ERR_COMPILE;
    else
        rc = hkp_guard_ptx(ptx, n, &g, &gn, &sites, why, sizeof why);
    if (rc == 0 && sites && to_cubin) {
        hkp_artifact link = {0};
        rc = hkp_jitlink_ptx(g, gn, link_arch, o, name, &link, why, sizeof why);
        free(g);
        g = link.image, gn = link.size;
        link.image = NULL;
        hkp_artifact_free(&link);
    }
    if (rc == HK_ERR_NOMEM) {
        free(g);
        return rc;
    }
    if (rc) {
        free(g);
        return hkp_guard_note(a, why);
    }
    a->guard = g;
    a->guard_size = gn;
    a->guard_sites = sites;
    return 0;
}

/*
 * The engine's side of canary runs (canary/ does the running): where the
 * helper executable and compute-sanitizer are, the per-kernel test
 * declarations of the public API, and the one call between build and stage
 * (hkl_canary_check) that decides whether a built version runs its tests,
 * resolves its perf guard from the runtime's and the swap's options,
 * pins the running version for comparisons and timings and hands both to
 * canary/.
 *
 * Threads: hkl_canary_check runs on the thread that built the job (the caller
 * of hk_swap, or the worker), with no engine lock held while the helper
 * works. swap_lock is taken only to find and pin the running version, before
 * the run, and released before it starts; the run reads the pinned version
 * in place, and unpins it when it ends.
 */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "canary/canary.h"
#include "base/abi.h"
#include "loader/canary.h"
#include "loader/context.h"
#include "loader/job.h"
#include "loader/launch.h"
#include "loader/version.h"

#ifndef HK_LIBEXECDIR
#define HK_LIBEXECDIR "/usr/local/libexec"
#endif

/* A helper's path (hkl_helper_path): opt, else $env, else, from the folder
 * of the object that holds this code (libhotkern.so in LIBDIR, or a program
 * linked with the static library), ../libexec/hotkern/name (an installed
 * tree, wherever it was moved or staged) or ../bin/name (the build tree,
 * whose lib/, tests/ and bench/ lie beside bin/), else the LIBEXECDIR it was
 * built for: LIBEXECDIR/hotkern/name. */
char *hkl_helper_path(const char *opt, const char *env_name, const char *name) {
    if (opt && *opt)
        return strdup(opt);
    const char *env = getenv(env_name);
    if (env && *env)
        return strdup(env);
    char self[PATH_MAX] = "", cand[PATH_MAX + 64];
    Dl_info info;
    if (dladdr((void *)hkl_helper_path, &info) && info.dli_fname && strchr(info.dli_fname, '/'))
        snprintf(self, sizeof self, "%s", info.dli_fname);
    else {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = '\0';
    }
    char *slash = strrchr(self, '/');
    const char *beside[] = {"../libexec/hotkern", "../bin"};
    for (size_t i = 0; slash && i < sizeof beside / sizeof beside[0]; i++) {
        *slash = '\0';
        snprintf(cand, sizeof cand, "%s/%s/%s", self, beside[i], name);
        if (access(cand, X_OK) == 0)
            return strdup(cand);
    }
    snprintf(cand, sizeof cand, "%s/hotkern/%s", HK_LIBEXECDIR, name);
    return strdup(cand);
}

int hkl_build_start(hk_runtime *rt, hk_report *rep) {
    if (!rt->opt.build_isolated)
        return 0;
    char *path = hkl_helper_path(rt->opt.build_helper, "HK_BUILD_HELPER", "hotkern-build");
    if (!path)
        return HK_ERR_NOMEM;
    char why[512] = "";
    int warm = rt->opt.no_warm_start ? 0 : rt->arch;
    int err = hkp_iso_create(&rt->iso, path, rt->opt.build_timeout_ms, warm, why, sizeof why);
    free(path);
    if (err == HK_ERR_IO)
        hku_fail(rep, err, "%s", why);
    return err;
}

/* An executable candidate for compute-sanitizer: malloc'd, or NULL. */
static char *sanitizer_at(const char *dir, const char *tail) {
    char cand[PATH_MAX + 64];
    if (!dir || !*dir || snprintf(cand, sizeof cand, "%s%s", dir, tail) >= (int)sizeof cand)
        return NULL;
    struct stat st;
    if (access(cand, X_OK) != 0 || stat(cand, &st) != 0 || !S_ISREG(st.st_mode))
        return NULL;
    return strdup(cand);
}

/* compute-sanitizer as hk_options.canary_sanitizer_path says: opt, else
 * $HK_COMPUTE_SANITIZER (empty: none), else the toolkit's. NULL with why
 * when there is none. The toolkit first is the one whose NVRTC this library
 * runs (its lib64/../bin), so that the sanitizer matches the toolkit that
 * builds the code it checks. */
static char *sanitizer_path(const char *opt, char *why, size_t n) {
    const char *env = getenv("HK_COMPUTE_SANITIZER");
    const char *given = opt && *opt ? opt : env;
    char *p = NULL;
    if (given) {
        if (!*given)
            snprintf(why, n, "HK_COMPUTE_SANITIZER is set empty (no sanitizer)");
        else if (!(p = sanitizer_at(given, "")))
            snprintf(why, n, "compute-sanitizer not found at %.200s (%s)", given,
                     opt && *opt ? "options.canary_sanitizer_path" : "$HK_COMPUTE_SANITIZER");
        return p;
    }
    Dl_info info;
    char dir[PATH_MAX] = "";
    if (dladdr((void *)nvrtcVersion, &info) && info.dli_fname && strrchr(info.dli_fname, '/')) {
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        *strrchr(dir, '/') = '\0';
        p = sanitizer_at(dir, "/../bin/compute-sanitizer");
    }
    const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (size_t i = 0; !p && i < sizeof homes / sizeof homes[0]; i++)
        p = sanitizer_at(homes[i], "/bin/compute-sanitizer");
    const char *path = getenv("PATH");
    char *copy = !p && path ? strdup(path) : NULL, *save = NULL;
    for (char *d = copy ? strtok_r(copy, ":", &save) : NULL; d && !p;
         d = strtok_r(NULL, ":", &save))
        p = sanitizer_at(d, "/compute-sanitizer");
    free(copy);
    if (!p)
        snprintf(why, n,
                 "compute-sanitizer not found (beside the toolkit's NVRTC, in $CUDA_HOME, "
                 "$CUDA_PATH or /usr/local/cuda /bin, or on $PATH)");
    return p;
}

/* Device d's UUID as nvidia-smi -L prints it, without "GPU-". */
static CUresult uuid_text(hk_runtime *rt, CUdevice d, char *out, size_t n) {
    CUuuid u;
    CUresult r = rt->drv->DeviceGetUuid(&u, d);
    if (r != CUDA_SUCCESS)
        return r;
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(out, n, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    return CUDA_SUCCESS;
}

/* The ordinal options.canary_device names (see hotkern.h), checked: it
 * exists and has the runtime's architecture. */
static int canary_device(hk_runtime *rt, int *ordinal, hk_report *rep) {
    const char *want = rt->opt.canary_device;
    *ordinal = rt->dev[0].ordinal;
    if (!want || !*want)
        return 0;
    int count = 0;
    CUresult r = rt->drv->DeviceGetCount(&count);
    if (r != CUDA_SUCCESS)
        return hkl_report_cu(rep, rt, r, "options.canary_device: cuDeviceGetCount");
    int found = -1;
    size_t digits = strspn(want, "0123456789");
    if (digits && !want[digits] && digits < 6) {
        found = atoi(want);
        if (found >= count)
            found = -1;
    } else {
        /* nvidia-smi -L's GPU-... of a device, or MIG-... of a MIG
         * instance (what cuDeviceGetUuid gives for one) */
        const char *u =
            !strncasecmp(want, "GPU-", 4) || !strncasecmp(want, "MIG-", 4) ? want + 4 : want;
        for (int i = 0; i < count && found < 0; i++) {
            CUdevice d;
            char text[48];
            if ((r = rt->drv->DeviceGet(&d, i)) != CUDA_SUCCESS ||
                (r = uuid_text(rt, d, text, sizeof text)) != CUDA_SUCCESS)
                return hkl_report_cu(rep, rt, r, "options.canary_device: cuDeviceGetUuid");
            if (!strcasecmp(text, u))
                found = i;
        }
    }
    if (found < 0)
        return hku_fail(rep, HK_ERR_INVALID,
                        "options.canary_device '%.80s': no such device (%d device%s: an ordinal "
                        "below %d, or a UUID as nvidia-smi -L prints it)",
                        want, count, count == 1 ? "" : "s", count);
    CUdevice d;
    int major = 0, minor = 0;
    if (rt->drv->DeviceGet(&d, found) != CUDA_SUCCESS ||
        rt->drv->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d) !=
            CUDA_SUCCESS ||
        rt->drv->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d) !=
            CUDA_SUCCESS)
        return hku_fail(rep, HK_ERR_INVALID, "options.canary_device '%.80s': cannot read device %d",
                        want, found);
    /* The images are made for the runtime's devices: the canary's must be
     * of their architecture. */
    if (major * 10 + minor != rt->dev[0].arch)
        return hku_fail(rep, HK_ERR_INVALID,
                        "options.canary_device '%.80s' is device %d, sm_%d; the runtime's device "
                        "is sm_%d, whose images may not load there",
                        want, found, major * 10 + minor, rt->dev[0].arch);
    for (int i = 0; i < rt->ndev; i++)
        if (rt->dev[i].ordinal == found)
            hk_log(rt, HK_LOG_WARN, "canary",
                   "options.canary_device '%.80s' is device %d, which the runtime uses: a fault "
                   "in a canary run stalls the program's work on it",
                   want, found);
    *ordinal = found;
    return 0;
}

int hkl_canary_start(hk_runtime *rt, hk_report *rep) {
    int ordinal = rt->dev[0].ordinal;
    if (rt->opt.canary) {
        int derr = canary_device(rt, &ordinal, rep);
        if (derr < 0)
            return derr;
    }
    char *path = rt->opt.canary
                     ? hkl_helper_path(rt->opt.canary_helper, "HK_CANARY_HELPER", "hotkern-canary")
                     : NULL;
    if (rt->opt.canary && !path)
        return HK_ERR_NOMEM;
    int mode = rt->opt.canary_sanitizer;
    char why[512] = "", swhy[300] = "";
    char *san = rt->opt.canary && mode >= 0
                    ? sanitizer_path(rt->opt.canary_sanitizer_path, swhy, sizeof swhy)
                    : NULL;
    if (rt->opt.canary && mode == 1 && !san) {
        free(path);
        return hku_fail(rep, HK_ERR_IO, "options.canary_sanitizer is 1 (on), but %s", swhy);
    }
    hka_config cfg = {.helper = path,
                      .device = ordinal,
                      .timeout_ms = rt->opt.canary_timeout_ms,
                      .start = 1,
                      .sanitizer = san,
                      .sanitizer_required = mode == 1};
    int err = hka_create(&rt->canary, &cfg, why, sizeof why);
    free(path);
    if (err == HK_ERR_IO)
        hku_fail(rep, err, "%s", why);
    else if (!err && rt->opt.canary && mode == 0 && (!san || why[0])) {
        /* Memcheck was wanted where it can be had: say why it is not. */
        char text[600], off[200] = "";
        if (san)
            hka_sanitizer(rt->canary, off, sizeof off);
        snprintf(text, sizeof text, "canary test launches run without memcheck: %.400s",
                 san ? off : swhy);
        hk_log(rt, san ? HK_LOG_WARN : HK_LOG_INFO, "canary", "%s", text);
        hku_fail(rep, 0, "%s", text);
    } else if (!err && san)
        hk_log(rt, HK_LOG_INFO, "canary", "test launches run under %s memcheck first", san);
    if (!err && rt->opt.canary && ordinal != rt->dev[0].ordinal)
        hk_log(rt, HK_LOG_INFO, "canary", "canary runs on device %d (options.canary_device)",
               ordinal);
    free(san);
    return err;
}

int hk_kernel_add_test(hk_kernel *k, const hk_test *t, hk_report *rep) {
    hk_report full;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    if (rep)
        hk_report_clear(&full);
    int err = !k || !t ? HK_ERR_INVALID
                       : hka_add_test(k->rt->canary, k->mod->name, k->name, t, rep ? &full : NULL);
    hkb_report_out(rep, &full);
    return err;
}

int hk_kernel_clear_tests(hk_kernel *k) {
    if (!k)
        return HK_ERR_INVALID;
    return hka_clear_tests(k->rt->canary, k->mod->name, k->name);
}

/* The running version of module name, pinned, or NULL when there is none.
 * swap_lock is held for the lookup and the count only: a pinned version
 * stays loaded and whole (a committed version's image and metadata never
 * change, and the reclaim thread frees none that is pinned), so the run
 * reads it in place, with no lock and no copy. hkl_version_unpin ends it. */
static hkl_version *running_pinned(hk_runtime *rt, const char *name) {
    hkl_swap_lock(rt); /* not held by this thread: the caller checked */
    hkl_module *m = hkl_module_find(rt, name);
    hkl_version *v = m ? atomic_load(&m->current) : NULL;
    /* Under swap_lock no commit can retire v before the count is taken. */
    if (v)
        atomic_fetch_add(&v->pins, 1);
    hkl_swap_unlock(rt, 0);
    return v;
}

/* The canary's view of version v's image (pointing into v). */
static hka_image image_of(const hkl_version *v) {
    return (hka_image){.data = v->art.image,
                       .size = v->art.size,
                       .format = v->art.format,
                       .version = v->number,
                       .nexpr = v->art.nlowered,
                       .expr = v->expr,
                       .lowered = v->art.lowered_names,
                       .nentries = v->art.meta.nentries,
                       .entries = v->art.meta.entries};
}

/* The run's perf guard: the swap's fields where set, else the runtime's,
 * else 4x and 1 ms. HK_ERR_INVALID for a field that is not a number. */
static int guard_policy(const hk_runtime *rt, const hkl_job *j, hka_policy *p, hk_report *rep) {
    double max = rt->opt.canary_slowdown_max, min = rt->opt.canary_slowdown_min_ms;
    if (isnan(j->opt.canary_slowdown_max) || isnan(j->opt.canary_slowdown_min_ms))
        return hku_fail(rep, HK_ERR_INVALID,
                        "hk_swap_options.canary_slowdown_max and _min_ms must be numbers");
    max = j->opt.canary_slowdown_max != 0 ? j->opt.canary_slowdown_max : max != 0 ? max : 4.0;
    min = j->opt.canary_slowdown_min_ms != 0 ? j->opt.canary_slowdown_min_ms : min != 0 ? min : 1.0;
    p->slowdown_max = max > 0 ? max : 0;
    p->slowdown_min_ms = min > 0 ? min : 0;
    return 0;
}

static hk_canary_policy policy_of(const hkl_job *j) {
    return j->opt.canary == HK_CANARY_DEFAULT ? HK_CANARY_OPTIONAL : j->opt.canary;
}

int hkl_canary_wanted(hk_runtime *rt, const hkl_job *j) {
    return policy_of(j) != HK_CANARY_SKIP && hka_enabled(rt->canary) &&
           hka_has_tests(rt->canary, j->name);
}

/* hkl_canary_check's run, the guard's copy left to it. */
static int canary_run(hk_runtime *rt, hkl_job *j, hk_report *rep) {
    hk_canary_policy policy = policy_of(j);
    if (policy == HK_CANARY_SKIP || hkl_swap_held(rt)) {
        /* (From a check callback the swap is refused as busy anyway.) */
        if (rep && policy == HK_CANARY_SKIP)
            snprintf(rep->canary, sizeof rep->canary, "skipped (policy)");
        return 0;
    }
    if (!hka_has_tests(rt->canary, j->name)) {
        /* The common case: nothing to copy, nothing to run. */
        if (rep)
            snprintf(rep->canary, sizeof rep->canary, "no canary tests");
        return 0;
    }
    hkl_version *cur = running_pinned(rt, j->name);
    if (cur && cur->art.size == j->art.size &&
        !memcmp(cur->art.image, j->art.image, cur->art.size)) {
        hkl_version_unpin(rt, cur);
        if (rep)
            snprintf(rep->canary, sizeof rep->canary, "not run: the running version's image");
        return 0;
    }
    hka_image img = {.data = j->art.image,
                     .size = j->art.size,
                     .format = j->art.format,
                     .nexpr = j->art.nlowered,
                     .expr = j->name_expressions,
                     .lowered = j->art.lowered_names,
                     .nentries = j->art.meta.nentries,
                     .entries = j->art.meta.entries,
                     .guard = j->art.guard,
                     .guard_size = j->art.guard_size,
                     .guard_sites = j->art.guard_sites};
    if (img.nexpr > j->opt.nname_expressions)
        img.nexpr = j->opt.nname_expressions;
    hka_policy pol = {.canary = policy};
    int err = guard_policy(rt, j, &pol, rep);
    if (err == 0) {
        hka_image ref = cur ? image_of(cur) : (hka_image){0};
        err = hka_run(rt->canary, j->name, &img, cur ? &ref : NULL, &pol, rep);
    }
    if (cur)
        hkl_version_unpin(rt, cur);
    return err;
}

/* Between build and stage: runs the built job's canary as its policy says.
 * Returns 0 to go on, or the refusal (rep filled). */
int hkl_canary_check(hk_runtime *rt, hkl_job *j, hk_report *rep) {
    int err = canary_run(rt, j, rep);
    /* Only a canary run uses the trap guard's copy, whether or not one ran:
     * it is not kept with the version. */
    free(j->art.guard);
    j->art.guard = NULL;
    j->art.guard_size = 0;
    j->art.guard_sites = 0;
    return err;
}

/*
 * Compile time on the CPU alone (no GPU needed): what a real edit costs
 * hkp_build, plain and with NVRTC's PCH, straight to a cubin and through PTX
 * and nvJitLink, for the small kernels and the
 * cub/cuda::std kernel of bench_swap. Each build compiles a new constant into
 * the code (bench_variant), in one process, without the compile cache. The
 * first build of each series is shown apart: it pays NVRTC's start-up (the
 * very first) or the creation of the PCH. Last, the small kernels with the
 * NVRTC options that trade something for compile time (all CPUs for ptxas,
 * a smaller implicit prefix, slower code), to show what each would buy.
 * Then, for the one-line kernel, series measured side by side in one
 * process (round after round, one build of each series per round, so the
 * host's slow and fast moments hit all alike): the default build against
 * the development profile (HK_BUILD_PROFILE_DEV), with the PCHs created
 * meanwhile, and the default build against the NVRTC settings hotkern
 * could change: the PCH in a tmpfs directory (--pch-dir), NVRTC's own
 * cache in the driver's compute cache off (-no-cache; it is only consulted
 * where a real libcuda is loaded), and NVVM split over every CPU
 * (--split-compile=0).
 *
 * usage: bench_build [REPS]   (default 7; the interleaved series take 3x)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nvrtc.h>

#include "bench/common.h"

/* Extra NVRTC options of the series being measured (NULL-terminated), and
 * its ptxas level (-Ofc=max refuses ptxas -O1..3). */
static const char *const *extra;
static int opt_level = 3;
static int fast_compile; /* the development profile */

static double build_ms(const char *fmt, int v, int pch, int via_ptx) {
    char *src = bench_variant(fmt, v);
    int nextra = 0;
    while (extra && extra[nextra])
        nextra++;
    hkp_build_opts o = {.arch = 90,
                        .nvrtc_options = extra,
                        .nnvrtc_options = nextra,
                        .ptx_to_cubin = 1,
                        .opt_level = opt_level,
                        .pch = pch,
                        .nvrtc_via_ptx = via_ptx,
                        .fast_compile = fast_compile,
                        .source_name = pch ? "pch.cu" : "plain.cu"};
    double ms = bench_build_ms(src, &o);
    free(src);
    return ms;
}

static void series(const char *what, const char *fmt, int pch, int via_ptx, int reps, int *next) {
    double v[64];
    double first = build_ms(fmt, (*next)++, pch, via_ptx);
    for (int i = 0; i < reps; i++)
        v[i] = build_ms(fmt, (*next)++, pch, via_ptx);
    double med = bench_median(v, reps);
    printf("  %-30s %-5s %-13s first %8.1f ms, then median %8.1f ms (min %.1f, max %.1f)\n", what,
           pch ? "PCH" : "plain", via_ptx ? "PTX+nvJitLink" : "NVRTC cubin", first, med, v[0],
           v[reps - 1]);
}

/* One series of an interleaved comparison. */
typedef struct iseries {
    const char *what;
    const char *const *opts; /* extra NVRTC options, NULL-terminated, or NULL */
    int fast;                /* the development profile */
    double ms[192];
    uint64_t pch_created; /* PCHs NVRTC created during this series' builds */
} iseries;

/* rounds rounds of one build of each series (the one-line kernel, PCH,
 * cubin, a new constant each time); prints median, p90 and the ratio of
 * the medians to the first series. */
static void interleaved(const char *title, iseries *s, int n, int rounds, int *next) {
    for (int k = 0; k < n; k++) { /* each series' own first build, apart */
        extra = s[k].opts;
        fast_compile = s[k].fast;
        (void)build_ms(bench_fmt_tiny, (*next)++, 1, 0);
    }
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < n; k++) {
            uint64_t c0, c1;
            extra = s[k].opts;
            fast_compile = s[k].fast;
            hkp_pch_stats(&c0, NULL);
            s[k].ms[r] = build_ms(bench_fmt_tiny, (*next)++, 1, 0);
            hkp_pch_stats(&c1, NULL);
            s[k].pch_created += c1 - c0;
        }
    }
    extra = NULL;
    fast_compile = 0;
    printf("%s (one-line kernel, PCH, cubin; %d rounds, interleaved):\n", title, rounds);
    double base = 0;
    for (int k = 0; k < n; k++) {
        double med = bench_median(s[k].ms, rounds);
        if (k == 0)
            base = med;
        printf("  %-44s median %7.2f ms, p90 %7.2f (min %.2f); x%.2f of the first; PCHs created "
               "%llu\n",
               s[k].what, med, bench_pct(s[k].ms, rounds, 90), s[k].ms[0], med / base,
               (unsigned long long)s[k].pch_created);
    }
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (reps < 1 || reps > 64)
        reps = 7;
    char host[256] = "";
    gethostname(host, sizeof host);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int maj = 0, min = 0;
    nvrtcVersion(&maj, &min);
    time_t t = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    printf("== bench_build: hkp_build of a real edit (new constant), sm_90 cubin, no cache\n");
    printf("machine: %s, %ld CPUs, NVRTC %d.%d, %s\n", host, cpus, maj, min, date);
    int next = (int)(getpid() % 20000) * 1000;
    for (int via_ptx = 0; via_ptx < 2; via_ptx++) {
        series("small kernels (5)", bench_fmt_small, 0, via_ptx, reps, &next);
        series("small kernels (5)", bench_fmt_small, 1, via_ptx, reps, &next);
        series("cub BlockReduce + cuda::std", bench_fmt_cub, 0, via_ptx, reps, &next);
        series("cub BlockReduce + cuda::std", bench_fmt_cub, 1, via_ptx, reps, &next);
    }
    /* What NVRTC's own options do for the small kernels (PCH, cubin):
     * --split-compile=0 lets ptxas use every CPU, -minimal leaves out the
     * texture and device-runtime declarations, -Ofc=max trades the code's
     * speed for the compile's (with ptxas -O0, as it refuses -O1..3). */
    static const char *const split[] = {"--ptxas-options=--split-compile=0", NULL};
    static const char *const minimal[] = {"-minimal", NULL};
    static const char *const ofc[] = {"-Ofc=max", NULL};
    static const char *const all[] = {"--ptxas-options=--split-compile=0", "-minimal", "-Ofc=max",
                                      NULL};
    const struct {
        const char *what;
        const char *const *opts;
    } variants[] = {{"small + ptxas split-compile=0", split},
                    {"small + -minimal", minimal},
                    {"small + -Ofc=max", ofc},
                    {"small + all three", all}};
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        extra = variants[i].opts;
        opt_level = variants[i].opts == ofc || variants[i].opts == all ? 0 : 3;
        series(variants[i].what, bench_fmt_small, 1, 0, reps, &next);
    }
    extra = NULL;
    opt_level = 3;

    int rounds = reps * 3 > 192 ? 192 : reps * 3;
    static iseries prof[] = {{.what = "default build (RELEASE)"},
                             {.what = "development profile (DEV: -Ofc=max, -minimal)", .fast = 1}};
    interleaved("build profiles", prof, 2, rounds, &next);

    char pchdir[64], opt[96];
    snprintf(pchdir, sizeof pchdir, "/dev/shm/hotkern-bench-pch-%d", (int)getpid());
    snprintf(opt, sizeof opt, "--pch-dir=%s", pchdir);
    int shm = mkdir(pchdir, 0700) == 0;
    const char *const pch_shm[] = {opt, NULL};
    static const char *const no_cache[] = {"-no-cache", NULL};
    static const char *const split0[] = {"--split-compile=0", NULL};
    iseries knobs[] = {{.what = "default (PCH in NVRTC's directory under TMPDIR)"},
                       {.what = "--pch-dir on tmpfs (/dev/shm)", .opts = pch_shm},
                       {.what = "-no-cache (no driver compute-cache lookup)", .opts = no_cache},
                       {.what = "--split-compile=0 (NVVM on every CPU)", .opts = split0}};
    int nknobs = 4;
    if (!shm) {
        printf("(no %s: the tmpfs series is left out)\n", pchdir);
        knobs[1] = knobs[2];
        knobs[2] = knobs[3];
        nknobs = 3;
    }
    interleaved("what hotkern could set", knobs, nknobs, rounds, &next);
    if (shm) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", pchdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", pchdir);
    }
    return 0;
}

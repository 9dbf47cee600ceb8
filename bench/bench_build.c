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
 *
 * usage: bench_build [REPS]   (default 7)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nvrtc.h>

#include "bench/common.h"

/* Extra NVRTC options of the series being measured (NULL-terminated), and
 * its ptxas level (-Ofc=max refuses ptxas -O1..3). */
static const char *const *extra;
static int opt_level = 3;

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
                        .source_name = pch ? "pch.cu" : "plain.cu"};
    hkp_artifact a;
    char why[512];
    uint64_t t0 = bench_ns();
    if (hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why) < 0) {
        fprintf(stderr, "build failed: %s\n%s\n", why, a.log ? a.log : "");
        exit(1);
    }
    double ms = (double)(bench_ns() - t0) / 1e6;
    hkp_artifact_free(&a);
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
    return 0;
}

/*
 * What a reused checker buys per source, on the CPU alone (no GPU needed):
 * 10 small CUDA C files that include one common header, each checked with
 * one hk_checker for all (NVRTC's PCH of the toolkit headers a source opens
 * with, the include search path made once) and with hk_check alone (neither),
 * in one process, interleaved: for every file of every round both are
 * timed, in alternating order. Two sets, as bench/check_reuse.sh times
 * whole `hotkern check` runs: the common header first (the PCH can cover
 * only NVRTC's implicit prefix), and <cuda_fp16.h> before it. Each round
 * writes a constant of its own into the header, so no cache can serve a
 * build. The checker's first build of each set, which creates its PCH, is
 * shown apart.
 *
 * usage: bench_check [ROUNDS]   (default 9)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/common.h"

#define NFILES 10

static double check_ms(hk_checker *c, const hk_check_options *o, const char *name,
                       const char *src) {
    hk_check_result *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    hk_check_options one = *o;
    one.source_name = name;
    uint64_t t0 = bench_ns();
    int rc = c ? hk_checker_check(c, name, src, strlen(src), &r, &rep)
               : hk_check(&one, src, strlen(src), &r, &rep);
    double ms = (double)(bench_ns() - t0) / 1e6;
    if (rc) {
        fprintf(stderr, "%s: %s\n%s\n", name, rep.message, rep.log ? rep.log : "");
        exit(1);
    }
    hk_check_result_free(r);
    hk_report_clear(&rep);
    return ms;
}

static void run_set(const char *label, const char *prelude, int rounds, const char *dir) {
    double *reuse = calloc((size_t)(rounds * NFILES), sizeof *reuse);
    double *fresh = calloc((size_t)(rounds * NFILES), sizeof *fresh);
    double first = 0;
    int nr = 0, nf = 0;
    hk_check_options o;
    hk_check_options_init(&o);
    o.arch = 90;
    hk_checker *c = NULL;
    hk_report rep = HK_REPORT_INIT;
    if (!reuse || !fresh || hk_checker_create(&c, &o, &rep) < 0) {
        fprintf(stderr, "bench_check: %s\n", rep.message);
        exit(1);
    }
    for (int r = 0; r < rounds; r++) {
        char hdr[600], text[256];
        snprintf(hdr, sizeof hdr, "%s/common.cuh", dir);
        snprintf(text, sizeof text,
                 "#pragma once\n#define BIAS %d.0f\n"
                 "__device__ inline float scale(float v, int i) { return v * (i + 2); }\n",
                 (int)getpid() * 100 + r);
        FILE *f = fopen(hdr, "w");
        if (!f || fputs(text, f) < 0 || fclose(f) != 0)
            exit(1);
        for (int i = 0; i < NFILES; i++) {
            char name[640], src[1024];
            snprintf(name, sizeof name, "%s/k%d.cu", dir, i);
            snprintf(src, sizeof src,
                     "%s#include \"common.cuh\"\n"
                     "extern \"C\" __global__ void k%d(float *x, const float *y, int n) {\n"
                     "    int t = blockIdx.x * blockDim.x + threadIdx.x;\n"
                     "    if (t < n) x[t] = scale(y[t], %d) + BIAS;\n"
                     "}\n",
                     prelude, i, i);
            int reuse_first = (r + i) % 2 == 0;
            double a = 0, b = 0;
            if (!reuse_first)
                b = check_ms(NULL, &o, name, src);
            a = check_ms(c, &o, name, src);
            if (reuse_first)
                b = check_ms(NULL, &o, name, src);
            if (r == 0 && i == 0)
                first = a; /* creates the set's PCH */
            else
                reuse[nr++] = a;
            fresh[nf++] = b;
        }
    }
    double rm = bench_median(reuse, nr), fm = bench_median(fresh, nf);
    printf("%-5s checker first (makes the PCH) %6.1f ms\n", label, first);
    printf("%-5s checker, later files  median %6.1f ms  p10 %6.1f  p90 %6.1f  (%d builds)\n", label,
           rm, bench_pct(reuse, nr, 10), bench_pct(reuse, nr, 90), nr);
    printf("%-5s hk_check alone        median %6.1f ms  p10 %6.1f  p90 %6.1f  (%d builds)\n", label,
           fm, bench_pct(fresh, nf, 10), bench_pct(fresh, nf, 90), nf);
    printf("%-5s checker / alone: x%.2f\n", label, rm / fm);
    hk_checker_destroy(c);
    free(reuse);
    free(fresh);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 9;
    if (rounds < 1)
        rounds = 1;
    char dir[] = "/tmp/hotkern-bench-check-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    printf("== bench_check\nmachine: %ld CPUs, no GPU needed; %d rounds of %d files per set\n",
           sysconf(_SC_NPROCESSORS_ONLN), rounds, NFILES);
    /* NVRTC's start-up, paid once per process, out of the figures. */
    hk_check_options o;
    hk_check_options_init(&o);
    o.arch = 90;
    check_ms(NULL, &o, "warm.cu", "extern \"C\" __global__ void w() {}\n");
    run_set("plain", "", rounds, dir);
    run_set("fp16", "#include <cuda_fp16.h>\n", rounds, dir);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}

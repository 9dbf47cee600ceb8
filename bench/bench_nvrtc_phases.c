/*
 * Where NVRTC spends the time of a one-line kernel's compile, the floor
 * under hotkern's "save -> live": every build hotkern makes pays at least
 * this, whatever hotkern does around it. NVRTC is called directly here
 * (create, compile, get the CUBIN or PTX, destroy), with the option sets
 * hotkern gives it, so the figures are a baseline for hotkern's own.
 *
 * Each compile gets a new constant in the kernel's code, so nothing of it is
 * cached; a changed comment would not do (NVRTC compiles it much faster).
 * For each compile the benchmark takes the wall time (CLOCK_MONOTONIC) and the
 * compiling thread's CPU time of create..get, and the durations of NVRTC's
 * own phases from its time profiler (-fdevice-time-trace): the C++ front end
 * (and the part of it that reads headers), LibNVVM (its module linker, which
 * links libdevice, its optimizer and its code generator) and ptxas (PTX
 * parsing and setup, optimizing, post processing). "other" is what the three
 * top-level phases leave of the wall time: NVRTC's own work between them and
 * the API calls around the compile.
 *
 * The trace file is not one JSON document: the front end and LibNVVM write
 * an object, ptxas parses it and adds its events, and a file that already
 * exists (even empty) makes ptxas fail the compile. NVRTC also appends
 * ".json" to the name it is given. So each compile gets a name not yet used
 * in a private directory (mkdtemp), and the file is scanned for the
 * `"dur":N,"name":"..."` pairs of the events wanted, then deleted.
 *
 * The series alternate compile by compile in one process, so that the host's
 * slow and fast moments hit them all alike; their ratios, measured side by
 * side, are the figures that count, the absolute times vary with the host.
 * The series: hotkern's default profile; the same without the trace, which
 * tells what the trace itself costs; hotkern's development profile as its
 * worker sends it (ptx/nvrtc.c adds -pch to every profile), and without -pch;
 * PTX only (no ptxas), bare and with the development profile's options.
 * NVRTC keeps one automatic PCH per option set (the trace's file name does
 * not count), so interleaving should not make any series make its PCH again:
 * nvrtcGetPCHCreateStatus tells, compile by compile. A series that does is
 * measured again in a block of its own, and the report says so. The first
 * compiles of each series are warm-up (the first in a process takes hundreds
 * of milliseconds) and not counted.
 *
 * No GPU and no libcuda: NVRTC alone.
 *
 * usage: bench_nvrtc_phases [ROUNDS]   (default 30)
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nvrtc.h>

#include "bench/common.h"

#define WARMUP 3

static const char kernel_fmt[] =
    "extern \"C\" __global__ void k0(int *out, int n) { int i = blockIdx.x * blockDim.x + "
    "threadIdx.x; if (i < n) out[i] = %d; }\n";

/* The phases read from the trace: the event's name, the column's label. The
 * top-level ones, whose sum "other" is taken from, are marked. */
enum {
    PH_FE,
    PH_HDR,
    PH_NVVM,
    PH_LINK,
    PH_OPT,
    PH_CGEN,
    PH_PTXAS,
    PH_PARSE,
    PH_OPTCU,
    PH_POST,
    NPH
};
static const char *const ph_event[NPH] = {"CUDA C++ Front-End",
                                          "Processing Header File",
                                          "LibNVVM",
                                          "NVVM Module Linker",
                                          "NVVM Optimizer",
                                          "NVVM CodeGen",
                                          "Total PTXAS Time",
                                          "PTX parsing and setup time",
                                          "Optimizing compilation unit",
                                          "Post processing"};
static const char *const ph_label[NPH] = {"front", "hdrs",  "nvvm",  "link",  "opt",
                                          "cgen",  "ptxas", "parse", "optcu", "post"};
static const int ph_top[NPH] = {[PH_FE] = 1, [PH_NVVM] = 1, [PH_PTXAS] = 1};

typedef struct sample {
    double wall, cpu; /* ms */
    double ph[NPH];   /* ms; -1: not in the trace */
} sample;

#define MAXOPT 12
typedef struct series {
    const char *name, *what;
    const char *opt[MAXOPT];
    int nopt;
    int cubin, trace, pch;
    sample *s;
    int n;
    int pch_made; /* PCHs created by the measured compiles */
    int no_trace; /* measured compiles whose trace file was missing */
    int own_block;
} series;

static char trace_dir[PATH_MAX];
static int next_v = 1, next_trace = 1, heap_resizes;

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* ---- the trace -------------------------------------------------------- */

typedef struct span {
    long long ts, dur; /* us; ts -1: not given */
} span;
#define MAXSPAN 64

static int phase_of(const char *name, size_t len) {
    for (int k = 0; k < NPH; k++)
        if (strlen(ph_event[k]) == len && !memcmp(ph_event[k], name, len))
            return k;
    return -1;
}

/* The "ts" of the event whose name ends at q: the next one before the
 * object closes. */
static long long event_ts(const char *q) {
    const char *close = strchr(q, '}'), *t = strstr(q, "\"ts\":");
    return t && (!close || t < close) ? strtoll(t + 5, NULL, 10) : -1;
}

static int inside(const span *a, const span *b) {
    return a->ts >= 0 && b->ts >= 0 && b->ts <= a->ts && a->ts + a->dur <= b->ts + b->dur;
}

/* The time covered by events of one name, an event inside another of the
 * same name (a header included by a header) counted once. */
static double covered_ms(const span *v, int n) {
    long long sum = 0;
    for (int i = 0; i < n; i++) {
        int in = 0;
        for (int j = 0; j < n && !in; j++)
            in = j != i && inside(&v[i], &v[j]) && (!inside(&v[j], &v[i]) || j < i);
        sum += in ? 0 : v[i].dur;
    }
    return sum / 1e3;
}

static void parse_trace(const char *text, double *ph) {
    static span v[NPH][MAXSPAN];
    int n[NPH] = {0};
    const char *p = text;
    while ((p = strstr(p, "\"dur\":")) != NULL) {
        char *end;
        long long dur = strtoll(p + 6, &end, 10);
        p = end;
        if (strncmp(p, ",\"name\":\"", 9) != 0)
            continue;
        p += 9;
        const char *q = strchr(p, '"');
        if (!q)
            break;
        int k = phase_of(p, (size_t)(q - p));
        p = q;
        if (k >= 0 && n[k] < MAXSPAN)
            v[k][n[k]++] = (span){event_ts(q), dur};
    }
    for (int k = 0; k < NPH; k++)
        ph[k] = n[k] ? covered_ms(v[k], n[k]) : -1;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0, got;
    char *buf = malloc(cap + 1);
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0)
        if ((len += got) == cap)
            buf = realloc(buf, (cap *= 2) + 1);
    fclose(f);
    if (buf)
        buf[len] = '\0';
    return buf;
}

/* Reads the phases of the compile traced to base (NVRTC wrote base.json)
 * and deletes the file. 0 when there was none. */
static int read_trace(const char *base, double *ph) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s.json", base);
    char *text = slurp(path);
    remove(path);
    remove(base);
    for (int k = 0; k < NPH; k++)
        ph[k] = -1;
    if (!text)
        return 0;
    parse_trace(text, ph);
    free(text);
    return 1;
}

static void remove_trace_dir(void) {
    if (trace_dir[0])
        rmdir(trace_dir);
}

static void make_trace_dir(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(trace_dir, sizeof trace_dir, "%s/hk-nvrtc-phases-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(trace_dir)) {
        fprintf(stderr, "bench_nvrtc_phases: mkdtemp %s failed\n", trace_dir);
        exit(1);
    }
    atexit(remove_trace_dir);
}

/* ---- one compile -------------------------------------------------------- */

static void nvrtc_fail(const series *x, nvrtcProgram p, const char *call, nvrtcResult r) {
    fprintf(stderr, "bench_nvrtc_phases: %s (series %s): %s\n", call, x->name,
            nvrtcGetErrorString(r));
    size_t n = 0;
    if (p && nvrtcGetProgramLogSize(p, &n) == NVRTC_SUCCESS && n > 1) {
        char *log = malloc(n);
        if (log && nvrtcGetProgramLog(p, log) == NVRTC_SUCCESS)
            fprintf(stderr, "%s\n", log);
        free(log);
    }
    exit(1);
}

/* The compiled code, fetched as a caller would; freed at once. */
static nvrtcResult fetch_output(const series *x, nvrtcProgram p) {
    size_t n = 0;
    nvrtcResult r = x->cubin ? nvrtcGetCUBINSize(p, &n) : nvrtcGetPTXSize(p, &n);
    char *code = r == NVRTC_SUCCESS ? malloc(n) : NULL;
    if (code)
        r = x->cubin ? nvrtcGetCUBIN(p, code) : nvrtcGetPTX(p, code);
    free(code);
    return r;
}

/* After a -pch compile: 1 when it created a PCH. An exhausted PCH heap is
 * enlarged to what NVRTC asks for, as hotkern does (ptx/nvrtc.c). */
static int pch_after(nvrtcProgram p) {
    nvrtcResult st = nvrtcGetPCHCreateStatus(p);
    size_t need = 0;
    if (st == NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED &&
        nvrtcGetPCHHeapSizeRequired(p, &need) == NVRTC_SUCCESS && need > 0 &&
        nvrtcSetPCHHeapSize(need) == NVRTC_SUCCESS)
        heap_resizes++;
    return st == NVRTC_SUCCESS;
}

/* Compiles the kernel with a new constant; fills *out and returns 1 when
 * the compile created a PCH. */
static int compile_one(series *x, sample *out) {
    char *src = bench_variant(kernel_fmt, next_v++ * 7919 + (int)getpid() % 7919);
    const char *argv[MAXOPT + 1];
    memcpy(argv, x->opt, sizeof x->opt);
    int argc = x->nopt;
    char base[PATH_MAX + 16], topt[PATH_MAX + 48];
    if (x->trace) {
        snprintf(base, sizeof base, "%s/t%d", trace_dir, next_trace++);
        snprintf(topt, sizeof topt, "-fdevice-time-trace=%s", base);
        argv[argc++] = topt;
    }
    nvrtcProgram p = NULL;
    uint64_t w0 = bench_ns();
    double c0 = cpu_ms();
    nvrtcResult r = nvrtcCreateProgram(&p, src, "phases.cu", 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        nvrtc_fail(x, NULL, "nvrtcCreateProgram", r);
    if ((r = nvrtcCompileProgram(p, argc, argv)) != NVRTC_SUCCESS)
        nvrtc_fail(x, p, "nvrtcCompileProgram", r);
    if ((r = fetch_output(x, p)) != NVRTC_SUCCESS)
        nvrtc_fail(x, p, x->cubin ? "nvrtcGetCUBIN" : "nvrtcGetPTX", r);
    out->cpu = cpu_ms() - c0;
    out->wall = (double)(bench_ns() - w0) / 1e6;
    int made = x->pch && pch_after(p);
    nvrtcDestroyProgram(&p);
    free(src);
    if (x->trace && !read_trace(base, out->ph))
        x->no_trace++;
    if (!x->trace)
        for (int k = 0; k < NPH; k++)
            out->ph[k] = -1;
    return made;
}

/* Compile number r of series x: warm-up (r < WARMUP) or measured. */
static void compile_round(series *x, int r) {
    sample junk;
    int measured = r >= WARMUP;
    int made = compile_one(x, measured ? &x->s[x->n] : &junk);
    if (measured) {
        x->n++;
        x->pch_made += made;
    }
}

static void run_interleaved(series *s, int ns, int rounds) {
    for (int r = 0; r < WARMUP + rounds; r++)
        for (int k = 0; k < ns; k++)
            compile_round(&s[k], r);
}

static void run_block(series *x, int rounds) {
    x->n = x->pch_made = x->no_trace = 0;
    x->own_block = 1;
    for (int r = 0; r < WARMUP + rounds; r++)
        compile_round(x, r);
}

/* ---- the series --------------------------------------------------------- */

static void add_opt(series *x, const char *o) {
    if (x->nopt < MAXOPT)
        x->opt[x->nopt++] = o;
}

static void series_make(series *x, const char *name, const char *what, int cubin, int trace,
                        const char *const *opts) {
    memset(x, 0, sizeof *x);
    x->name = name;
    x->what = what;
    x->cubin = cubin;
    x->trace = trace;
    for (; *opts; opts++) {
        add_opt(x, *opts);
        x->pch |= !strcmp(*opts, "-pch");
    }
}

enum { S_DEF, S_DEF_NT, S_DEV, S_DEV_NOPCH, S_PTX, S_PTX_DEV, NSERIES };

static void make_series(series *s) {
    static char inc[4200], cccl[4200];
    const hkp_toolkit *tk = hkp_toolkit_get();
    snprintf(inc, sizeof inc, "-I%s", tk->include);
    snprintf(cccl, sizeof cccl, "-I%s", tk->cccl[0] ? tk->cccl : tk->include);
    const char *const def[] = {"--gpu-architecture=sm_90",
                               "--ptxas-options=-O3",
                               inc,
                               cccl,
                               "-pch",
                               "--pch-messages=false",
                               NULL};
    const char *const dev[] = {
        "--gpu-architecture=sm_90", "-minimal", "-Ofc=max", inc, cccl, "-pch",
        "--pch-messages=false",     NULL};
    const char *const dev_nopch[] = {
        "--gpu-architecture=sm_90", "-minimal", "-Ofc=max", inc, cccl, NULL};
    const char *const ptx[] = {"--gpu-architecture=compute_90", "-minimal", NULL};
    const char *const ptx_dev[] = {
        "--gpu-architecture=compute_90", "-minimal", "-Ofc=max", inc, cccl, "-pch",
        "--pch-messages=false",          NULL};
    series_make(&s[S_DEF], "default", "hotkern's default profile, sm_90 cubin", 1, 1, def);
    series_make(&s[S_DEF_NT], "default-nt", "the same without -fdevice-time-trace", 1, 0, def);
    series_make(&s[S_DEV], "dev", "hotkern's development profile, as its worker sends it", 1, 1,
                dev);
    series_make(&s[S_DEV_NOPCH], "dev-nopch", "the development profile without -pch", 1, 1,
                dev_nopch);
    series_make(&s[S_PTX], "ptx", "PTX only, bare", 0, 1, ptx);
    series_make(&s[S_PTX_DEV], "ptx-dev", "PTX only, the development profile's options", 0, 1,
                ptx_dev);
}

/* ---- the report --------------------------------------------------------- */

static void print_host(int rounds) {
    char cpu[768];
    bench_cpu_line(cpu, sizeof cpu);
    int maj = 0, min = 0;
    nvrtcVersion(&maj, &min);
    printf("== bench_nvrtc_phases: where NVRTC spends a one-line kernel's compile\n");
    printf("machine: %s, NVRTC %d.%d (%s)\n", cpu, maj, min, hkp_toolkit_get()->nvrtc);
    printf("%d measured rounds after %d of warm-up, the series interleaved compile by compile\n",
           rounds, WARMUP);
}

static void print_series_list(const series *s, int ns) {
    printf("series (each compile a new constant; +trace: -fdevice-time-trace):\n");
    for (int k = 0; k < ns; k++) {
        printf("  %-10s %s:\n            ", s[k].name, s[k].what);
        for (int i = 0; i < s[k].nopt; i++)
            printf(" %s", s[k].opt[i]);
        printf("%s\n", s[k].trace ? " +trace" : "");
    }
}

/* Median of phase k (-1 for wall minus the top-level phases) over the
 * compiles that traced it; -1 when none did. */
static double phase_median(const series *x, int k) {
    double *v = malloc(sizeof *v * (size_t)(x->n ? x->n : 1));
    int m = 0;
    for (int i = 0; i < x->n; i++) {
        const sample *e = &x->s[i];
        if (k >= 0 && e->ph[k] >= 0)
            v[m++] = e->ph[k];
        if (k < 0 && e->ph[PH_FE] >= 0) {
            double other = e->wall;
            for (int j = 0; j < NPH; j++)
                other -= ph_top[j] && e->ph[j] > 0 ? e->ph[j] : 0;
            v[m++] = other;
        }
    }
    double med = m ? bench_median(v, m) : -1;
    free(v);
    return med;
}

static double wall_or_cpu_median(const series *x, int cpu) {
    double *v = malloc(sizeof *v * (size_t)(x->n ? x->n : 1));
    for (int i = 0; i < x->n; i++)
        v[i] = cpu ? x->s[i].cpu : x->s[i].wall;
    double med = x->n ? bench_median(v, x->n) : -1;
    free(v);
    return med;
}

static void print_cell(double v) {
    if (v < 0)
        printf(" %6s", "-");
    else
        printf(" %6.2f", v);
}

static void print_table(const series *s, int ns) {
    printf("medians, ms (front: hdrs; nvvm: link opt cgen; ptxas: parse optcu post;\n"
           " other: wall - front - nvvm - ptxas, compile by compile; -: not traced):\n");
    printf("  %-10s %6s %6s", "series", "wall", "cpu");
    for (int k = 0; k < NPH; k++)
        printf(" %6s", ph_label[k]);
    printf(" %6s\n", "other");
    for (int i = 0; i < ns; i++) {
        printf("  %-10s", s[i].name);
        print_cell(wall_or_cpu_median(&s[i], 0));
        print_cell(wall_or_cpu_median(&s[i], 1));
        for (int k = 0; k < NPH; k++)
            print_cell(phase_median(&s[i], k));
        print_cell(phase_median(&s[i], -1));
        printf("%s\n", s[i].own_block ? "   (own block)" : "");
    }
}

static void print_ratio(const series *s, int a, int b, const char *why) {
    printf("  %-10s / %-10s wall %5.2f  cpu %5.2f  %s\n", s[a].name, s[b].name,
           wall_or_cpu_median(&s[a], 0) / wall_or_cpu_median(&s[b], 0),
           wall_or_cpu_median(&s[a], 1) / wall_or_cpu_median(&s[b], 1), why);
}

static void print_ratios(const series *s) {
    printf("ratios of the medians, measured side by side:\n");
    print_ratio(s, S_DEV, S_DEF, "the development profile against the default");
    print_ratio(s, S_DEV_NOPCH, S_DEV, "what -pch saves the development profile");
    print_ratio(s, S_PTX, S_DEF, "bare PTX only against the default");
    print_ratio(s, S_PTX_DEV, S_DEV, "the development profile without ptxas");
    print_ratio(s, S_DEF, S_DEF_NT, "what -fdevice-time-trace costs");
}

static void print_pch(const series *s, int ns) {
    size_t heap = 0;
    nvrtcGetPCHHeapSize(&heap);
    printf("PCHs created by the measured compiles:");
    for (int k = 0; k < ns; k++)
        if (s[k].pch)
            printf(" %s %d,", s[k].name, s[k].pch_made);
    printf(" PCH heap %.0f MiB, resized %d times\n", (double)heap / (1 << 20), heap_resizes);
    for (int k = 0; k < ns; k++)
        if (s[k].no_trace)
            printf("%s: %d measured compiles left no trace file\n", s[k].name, s[k].no_trace);
}

/* Measures again, each in a block of its own, the -pch series that created
 * PCHs while interleaved. */
static void rerun_rebuilders(series *s, int ns, int rounds) {
    for (int k = 0; k < ns; k++) {
        if (!s[k].pch || !s[k].pch_made)
            continue;
        printf("%s created its PCH again in %d of %d measured compiles when interleaved: "
               "measured again in a block of its own\n",
               s[k].name, s[k].pch_made, s[k].n);
        run_block(&s[k], rounds);
        printf("%s in its own block: PCHs created by the measured compiles %d\n", s[k].name,
               s[k].pch_made);
    }
}

int main(int argc, char **argv) {
    int rounds = 30;
    if (argc > 2 || (argc == 2 && (rounds = atoi(argv[1])) <= 0)) {
        fprintf(stderr, "usage: bench_nvrtc_phases [ROUNDS]\n");
        return 2;
    }
    make_trace_dir();
    static series s[NSERIES];
    make_series(s);
    for (int k = 0; k < NSERIES; k++)
        if (!(s[k].s = calloc((size_t)rounds, sizeof *s[k].s))) {
            fprintf(stderr, "bench_nvrtc_phases: out of memory\n");
            return 1;
        }
    print_host(rounds);
    print_series_list(s, NSERIES);
    fflush(stdout);
    run_interleaved(s, NSERIES, rounds);
    print_pch(s, NSERIES);
    rerun_rebuilders(s, NSERIES, rounds);
    print_table(s, NSERIES);
    print_ratios(s);
    return 0;
}

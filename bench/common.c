/*
 * Shared benchmark support (see common.h).
 */
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/common.h"

hkb_driver bd;
static int arch;

#define SMALL_K1_K4                                                                                \
    "extern \"C\" __global__ void k1(float *x, int n) { int i = blockIdx.x * blockDim.x + "        \
    "threadIdx.x; if (i < n) x[i] = sqrtf(fabsf(x[i])); }\n"                                       \
    "extern \"C\" __global__ void k2(float *x, int n) { int i = blockIdx.x * blockDim.x + "        \
    "threadIdx.x; if (i < n) x[i] = sinf(x[i]) * cosf(x[i]); }\n"                                  \
    "extern \"C\" __global__ void k3(float *x, int n) { int i = blockIdx.x * blockDim.x + "        \
    "threadIdx.x; if (i < n && i > 0) x[i] = x[i] + x[i - 1]; }\n"                                 \
    "extern \"C\" __global__ void k4(float *x, int n) { int i = blockIdx.x * blockDim.x + "        \
    "threadIdx.x; if (i < n) x[i] = expf(-x[i] * x[i]); }\n"

#define TINY_K0                                                                                    \
    "extern \"C\" __global__ void k0(float *x, int n) { int i = blockIdx.x * blockDim.x + "        \
    "threadIdx.x; if (i < n) x[i] = x[i] * 2.0f + %d.0f; }\n"

const char *bench_fmt_tiny = TINY_K0;

const char *bench_fmt_small = TINY_K0 SMALL_K1_K4;

const char *bench_fmt_store =
    "extern \"C\" __global__ void k0(int *out, int n) { int i = blockIdx.x * blockDim.x + "
    "threadIdx.x; if (i < n) out[i] = %d; }\n";

const char *bench_fmt_cub = "#include <cub/block/block_reduce.cuh>\n"
                            "#include <cuda/std/cstdint>\n"
                            "extern \"C\" __global__ void k0(float *x, int n) {\n"
                            "    using BR = cub::BlockReduce<float, 256>;\n"
                            "    __shared__ typename BR::TempStorage tmp;\n"
                            "    cuda::std::int32_t i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                            "    float s = BR(tmp).Sum(i < n ? x[i] * %d.0f : 0.0f);\n"
                            "    if (threadIdx.x == 0 && i < n) x[i] = s;\n"
                            "}\n";

char *bench_variant(const char *fmt, int v) {
    size_t n = strlen(fmt) + 32;
    char *s = malloc(n);
    if (!s) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    /* The formats are this file's own constants, each with one %d. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(s, n, fmt, v);
#pragma GCC diagnostic pop
    return s;
}

const char *bench_src_small =
    "extern \"C\" __global__ void k0(float *x, int n) { int i = blockIdx.x * blockDim.x + "
    "threadIdx.x; if (i < n) x[i] = x[i] * 2.0f + 1.0f; }\n"
    "extern \"C\" __global__ void k1(float *x, int n) { int i = blockIdx.x * blockDim.x + "
    "threadIdx.x; if (i < n) x[i] = sqrtf(fabsf(x[i])); }\n"
    "extern \"C\" __global__ void k2(float *x, int n) { int i = blockIdx.x * blockDim.x + "
    "threadIdx.x; if (i < n) x[i] = sinf(x[i]) * cosf(x[i]); }\n"
    "extern \"C\" __global__ void k3(float *x, int n) { int i = blockIdx.x * blockDim.x + "
    "threadIdx.x; if (i < n && i > 0) x[i] = x[i] + x[i - 1]; }\n"
    "extern \"C\" __global__ void k4(float *x, int n) { int i = blockIdx.x * blockDim.x + "
    "threadIdx.x; if (i < n) x[i] = expf(-x[i] * x[i]); }\n";

const char *bench_src_empty = "extern \"C\" __global__ void empty() {}\n"
                              "extern \"C\" __global__ void spin(long long cycles) {\n"
                              "  long long t0 = clock64();\n"
                              "  while (clock64() - t0 < cycles) {}\n"
                              "}\n";

uint64_t bench_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double bench_pct(double *v, int n, double p) {
    int i = (int)(p / 100.0 * (n - 1) + 0.5);
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

void bench_canary_helper(char *out, size_t n) {
    char self[PATH_MAX] = "";
    ssize_t r = readlink("/proc/self/exe", self, sizeof self - 1);
    self[r > 0 ? r : 0] = '\0';
    snprintf(out, n, "%s/bin/hotkern-canary", dirname(dirname(self)));
}

int bench_arch(void) {
    return arch;
}

void bench_ctx_sync(void) {
    CUcontext c = NULL;
    bd.CtxGetCurrent(&c);
    CUresult r = bd.CtxSynchronize(c);
    if (r != CUDA_SUCCESS)
        fprintf(stderr, "cuCtxSynchronize failed: %d\n", (int)r);
}

double bench_sm_hz(void) {
    int khz = 0;
    bd.DeviceGetAttribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 0);
    FILE *p =
        popen("nvidia-smi --query-gpu=clocks.sm --format=csv,noheader,nounits 2>/dev/null", "r");
    if (p) {
        int mhz = 0;
        if (fscanf(p, "%d", &mhz) == 1 && mhz > 0)
            khz = mhz * 1000;
        pclose(p);
    }
    return khz * 1e3;
}

void bench_init(const char *name) {
    char why[512];
    if (hkb_driver_open(&bd, why, sizeof why) < 0) {
        printf("SKIP %s: no usable CUDA device (%s)\n", name, why);
        exit(77);
    }
    /* Entries the engine does not call are NULL on a driver without them. */
#define BENCH_NEED(field, sym)                                                                     \
    if (!bd.field) {                                                                               \
        printf("SKIP %s: the CUDA driver lacks %s\n", name, #sym);                                 \
        exit(77);                                                                                  \
    }
    HKB_DRIVER_ENTRIES_EXTRA(BENCH_NEED)
#undef BENCH_NEED
    CUcontext ctx;
    bd.DevicePrimaryCtxRetain(&ctx, 0);
    bd.CtxSetCurrent(ctx);
    int ma = 0, mi = 0;
    bd.DeviceGetAttribute(&ma, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0);
    bd.DeviceGetAttribute(&mi, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0);
    arch = ma * 10 + mi;
    char gpu[128] = "";
    bd.DeviceGetName(gpu, sizeof gpu, 0);
    printf("== %s\n", name);
    printf("machine: %s (sm_%d), driver CUDA %d", gpu, arch, bd.version);
    FILE *p = popen("nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.mem,clocks.max.sm "
                    "--format=csv,noheader 2>/dev/null",
                    "r");
    char line[256];
    if (p && fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = 0;
        printf(", nvidia-smi: driver, sm clock, mem clock, max sm clock = %s", line);
    }
    if (p)
        pclose(p);
    time_t t = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    printf(", %s\n", date);
}

void *bench_build(const char *src, int to_cubin, size_t *size) {
    hkp_build_opts bo = {
        .arch = arch, .ptx_to_cubin = to_cubin, .opt_level = 3, .source_name = "bench.cu"};
    hkp_artifact a = {0};
    char why[512];
    if (hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &bo, &a, why, sizeof why) < 0) {
        fprintf(stderr, "build failed: %s\n%s\n", why, a.log ? a.log : "");
        exit(1);
    }
    void *img = a.image;
    *size = a.size;
    a.image = NULL;
    hkp_artifact_free(&a);
    return img;
}

void bench_cpu_line(char *buf, size_t n) {
    char host[256] = "", model[256] = "unknown CPU", line[512];
    gethostname(host, sizeof host);
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(model, sizeof model, "%s", strchr(line, ':') + 2);
            model[strcspn(model, "\n")] = '\0';
            break;
        }
    if (f)
        fclose(f);
    double load = -1;
    f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf", &load) != 1)
        load = -1;
    if (f)
        fclose(f);
    time_t t = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    snprintf(buf, n, "%s, %s, %ld CPUs online, load %.2f, %s", host, model,
             sysconf(_SC_NPROCESSORS_ONLN), load, date);
}

double bench_build_ms(const char *src, const hkp_build_opts *o) {
    hkp_artifact a;
    char why[512];
    uint64_t t0 = bench_ns();
    if (hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, o, &a, why, sizeof why) < 0) {
        fprintf(stderr, "build failed: %s\n%s\n", why, a.log ? a.log : "");
        exit(1);
    }
    double ms = (double)(bench_ns() - t0) / 1e6;
    hkp_artifact_free(&a);
    return ms;
}

void bench_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

hk_watch *bench_watch_module(hk_runtime *rt, const char *root, const char *module, int dev,
                             const char *text, char *dir, char *path) {
    snprintf(dir, PATH_MAX, "%s/%s", root, module);
    snprintf(path, PATH_MAX, "%s/%s/%s.cu", root, module, module);
    if (mkdir(dir, 0755) != 0) {
        perror(dir);
        exit(1);
    }
    bench_write_file(path, text);
    hk_watch_options wo;
    hk_watch_options_init(&wo);
    wo.build_profile = dev ? HK_BUILD_PROFILE_DEV : HK_BUILD_PROFILE_RELEASE;
    hk_report rep = HK_REPORT_INIT;
    hk_watch *w = NULL;
    if (hk_watch_start(rt, dir, &wo, &w, &rep) != 0) {
        fprintf(stderr, "watch %s: %s\n", dir, rep.message);
        exit(1);
    }
    return w;
}

uint64_t bench_save_file(const char *dir, const char *module, const char *path, const char *text,
                         int rename_over) {
    char tmp[PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s/.%s.cu.tmp", dir, module);
    const char *to = rename_over ? tmp : path;
    int fd = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    size_t len = strlen(text);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len) {
        perror(to);
        exit(1);
    }
    uint64_t t0 = 0;
    if (!rename_over)
        t0 = bench_ns();
    if (close(fd) != 0) {
        perror(to);
        exit(1);
    }
    if (rename_over) {
        t0 = bench_ns();
        if (rename(tmp, path) != 0) {
            perror("rename");
            exit(1);
        }
    }
    return t0;
}

/*
 * ptx/ without a GPU: format detection, the metadata parsers, NVRTC and
 * nvJitLink builds, and the compile cache.
 *
 * Every image is made at test time (NVRTC here, nvcc for fatbins), so the
 * tests follow the toolkit that is installed rather than files that age. The
 * cases that matter most for a hot reload are the refusals: each bad input
 * must come back as the right error with a reason a person can act on.
 */
#include <dirent.h>
#include <elf.h>
#include <nvrtc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ptx/ptx.h"
#include "tests/canary_kernels.h"
#include "tests/harness.h"

#define NVCC "/usr/local/cuda/bin/nvcc"

static const char *const KERNELS_CU =
    "struct Pair { double d; char c[20]; };\n"
    "__device__ int counter;\n"
    "__constant__ float coeffs[16];\n"
    "__device__ float table[3] = {1, 2, 3};\n"
    "extern \"C\" __global__ void scale(float *x, float a, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] *= a * coeffs[0] * table[i % 3];\n"
    "    atomicAdd(&counter, 1);\n"
    "}\n"
    "extern \"C\" __global__ void mixed(Pair p, char c, double *o, short q) {\n"
    "    *o = p.d + c + q + p.c[3];\n"
    "}\n"
    "extern \"C\" __global__ void noargs() {}\n";

/* ---- helpers -------------------------------------------------------------- */

/* Compiles CUDA C with NVRTC directly (independent of the code under test):
 * "sm_XY" gives a cubin, "compute_XY" PTX. Returns a malloc'd image. */
static void *nvrtc_image(const char *src, const char *arch, size_t *size) {
    nvrtcProgram p;
    char opt[64];
    snprintf(opt, sizeof opt, "--gpu-architecture=%s", arch);
    const char *opts[] = {opt};
    ck_assert_int_eq(nvrtcCreateProgram(&p, src, "t.cu", 0, NULL, NULL), NVRTC_SUCCESS);
    nvrtcResult r = nvrtcCompileProgram(p, 1, opts);
    if (r != NVRTC_SUCCESS) {
        size_t n;
        nvrtcGetProgramLogSize(p, &n);
        char *log = malloc(n);
        nvrtcGetProgramLog(p, log);
        ck_abort_msg("NVRTC failed: %s", log);
    }
    int cubin = strncmp(arch, "sm_", 3) == 0;
    size_t n = 0;
    ck_assert_int_eq(cubin ? nvrtcGetCUBINSize(p, &n) : nvrtcGetPTXSize(p, &n), NVRTC_SUCCESS);
    void *img = malloc(n);
    ck_assert_ptr_nonnull(img);
    ck_assert_int_eq(cubin ? nvrtcGetCUBIN(p, img) : nvrtcGetPTX(p, img), NVRTC_SUCCESS);
    nvrtcDestroyProgram(&p);
    *size = n;
    return img;
}

static void *read_whole(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    void *buf = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return buf;
}

/* Builds a fatbin with nvcc from KERNELS_CU; NULL when nvcc is missing. */
static void *nvcc_fatbin(const char *dir, const char *gencode, size_t *size) {
    char cu[512], fb[512], cmd[2048];
    if (access(NVCC, X_OK) != 0)
        return NULL;
    snprintf(cu, sizeof cu, "%s/fat.cu", dir);
    snprintf(fb, sizeof fb, "%s/fat.fatbin", dir);
    ck_assert_int_eq(hkt_write_file(cu, KERNELS_CU), 0);
    snprintf(cmd, sizeof cmd, NVCC " -fatbin %s -o '%s' '%s' 2>&1", gencode, fb, cu);
    ck_assert_msg(system(cmd) == 0, "nvcc failed: %s", cmd);
    return read_whole(fb, size);
}

static const hkp_entry *find_entry(const hkp_meta *m, const char *name) {
    for (int i = 0; i < m->nentries; i++)
        if (strcmp(m->entries[i].name, name) == 0)
            return &m->entries[i];
    return NULL;
}

static const hkp_global *find_global(const hkp_meta *m, const char *name) {
    for (int i = 0; i < m->nglobals; i++)
        if (strcmp(m->globals[i].name, name) == 0)
            return &m->globals[i];
    return NULL;
}

static hkp_build_opts base_opts(int arch) {
    hkp_build_opts o = {.arch = arch, .ptx_to_cubin = 1, .opt_level = 3};
    return o;
}

/* Sizes in bytes of the regular files in dir, summed; counts entries and
 * leftover temporary files. */
static uint64_t dir_bytes(const char *dir, int *entries, int *tmps) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    uint64_t sum = 0;
    *entries = 0;
    if (tmps)
        *tmps = 0;
    while ((de = readdir(d)) != NULL) {
        char p[1024];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (strstr(de->d_name, ".hkc.tmp.")) {
            if (tmps)
                (*tmps)++;
        } else if (strstr(de->d_name, ".hkc")) {
            (*entries)++;
            sum += (uint64_t)st.st_size;
        }
    }
    closedir(d);
    return sum;
}

static double ms_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* ---- detection ------------------------------------------------------------ */

START_TEST(detect_each_format) {
    hk_format f;
    char why[256];
    size_t n;

    ck_assert_int_eq(hkp_detect(KERNELS_CU, strlen(KERNELS_CU), &f, why, sizeof why), 0);
    ck_assert_int_eq(f, HK_FORMAT_CUDA_C);

    char *ptx = nvrtc_image(KERNELS_CU, "compute_90", &n);
    ck_assert_int_eq(hkp_detect(ptx, n, &f, why, sizeof why), 0);
    ck_assert_int_eq(f, HK_FORMAT_PTX);
    /* Leading comments and blank lines are allowed before .version. */
    const char *commented = "\n  /* header */\n// generated\n\t.version 8.0\n.target sm_80\n";
    ck_assert_int_eq(hkp_detect(commented, strlen(commented), &f, why, sizeof why), 0);
    ck_assert_int_eq(f, HK_FORMAT_PTX);
    free(ptx);

    void *cubin = nvrtc_image(KERNELS_CU, "sm_90", &n);
    ck_assert_int_eq(hkp_detect(cubin, n, &f, why, sizeof why), 0);
    ck_assert_int_eq(f, HK_FORMAT_CUBIN);
    free(cubin);

    char *dir = hkt_tmpdir();
    void *fat = nvcc_fatbin(dir, "-gencode arch=compute_90,code=sm_90", &n);
    if (fat) {
        ck_assert_int_eq(hkp_detect(fat, n, &f, why, sizeof why), 0);
        ck_assert_int_eq(f, HK_FORMAT_FATBIN);
        free(fat);
    }
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(detect_refuses_bad_input) {
    hk_format f;
    char why[256];
    size_t n;

    ck_assert_int_eq(hkp_detect("", 0, &f, why, sizeof why), HK_ERR_FORMAT);
    ck_assert_str_eq(why, "empty input");
    ck_assert_int_eq(hkp_detect(" \n\t// nothing\n", 14, &f, why, sizeof why), HK_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "empty"));

    unsigned char garbage[256];
    srand(7);
    for (size_t i = 0; i < sizeof garbage; i++)
        garbage[i] = (unsigned char)rand();
    garbage[0] = 0x00; /* not ELF, not fatbin */
    ck_assert_int_eq(hkp_detect(garbage, sizeof garbage, &f, why, sizeof why), HK_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "binary"));

    unsigned char *cubin = nvrtc_image(KERNELS_CU, "sm_90", &n);
    ck_assert_int_eq(hkp_detect(cubin, 40, &f, why, sizeof why), HK_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "truncated ELF header"));
    ck_assert_int_eq(hkp_detect(cubin, n / 2, &f, why, sizeof why), HK_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "truncated"));
    free(cubin);

    /* A host ELF (this test binary) is not a cubin and not a fatbin. */
    void *self = read_whole("/proc/self/exe", &n);
    ck_assert_int_eq(hkp_detect(self, n, &f, why, sizeof why), HK_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "not a CUDA cubin (e_machine 62)"));
    free(self);

    const char *dot = ".entry foo() {}";
    ck_assert_int_eq(hkp_detect(dot, strlen(dot), &f, why, sizeof why), HK_ERR_FORMAT);
}
END_TEST

/* ---- metadata ---------------------------------------------------------------- */

START_TEST(meta_cubin_and_ptx_agree) {
    size_t pn, cn;
    char why[256];
    char *ptx = nvrtc_image(KERNELS_CU, "compute_90", &pn);
    void *cubin = nvrtc_image(KERNELS_CU, "sm_90", &cn);
    hkp_meta pm, cm;

    ck_assert_int_eq(hkp_meta_read(ptx, pn, HK_FORMAT_PTX, &pm, why, sizeof why), 0);
    ck_assert_int_eq(hkp_meta_read(cubin, cn, HK_FORMAT_AUTO, &cm, why, sizeof why), 0);
    ck_assert_int_eq(pm.arch, 90);
    ck_assert_int_eq(cm.arch, 90);
    ck_assert_int_eq(cm.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(pm.nentries, 3);
    ck_assert_int_eq(cm.nentries, 3);
    for (int i = 0; i < pm.nentries; i++) {
        const hkp_entry *a = &pm.entries[i];
        const hkp_entry *b = find_entry(&cm, a->name);
        ck_assert_msg(b != NULL, "cubin lacks %s", a->name);
        ck_assert_int_eq(a->nparams, b->nparams);
        for (int k = 0; k < a->nparams; k++) {
            ck_assert_uint_eq(a->params[k].offset, b->params[k].offset);
            ck_assert_uint_eq(a->params[k].size, b->params[k].size);
        }
    }
    /* The layout the driver uses: Pair is 8-aligned, 32 bytes. */
    const hkp_entry *mixed = find_entry(&cm, "mixed");
    ck_assert_int_eq(mixed->nparams, 4);
    ck_assert_uint_eq(mixed->params[0].size, 32);
    ck_assert_uint_eq(mixed->params[1].offset, 32);
    ck_assert_uint_eq(mixed->params[1].size, 1);
    ck_assert_uint_eq(mixed->params[2].offset, 40);
    ck_assert_uint_eq(mixed->params[3].offset, 48);
    ck_assert_uint_eq(mixed->params[3].size, 2);
    ck_assert_int_eq(find_entry(&cm, "noargs")->nparams, 0);

    ck_assert_int_eq(pm.nglobals, cm.nglobals);
    for (int i = 0; i < pm.nglobals; i++) {
        const hkp_global *b = find_global(&cm, pm.globals[i].name);
        ck_assert_msg(b != NULL, "cubin lacks global %s", pm.globals[i].name);
        ck_assert_uint_eq(pm.globals[i].size, b->size);
        ck_assert_int_eq(pm.globals[i].is_const, b->is_const);
    }
    ck_assert_uint_eq(find_global(&cm, "coeffs")->size, 64);
    ck_assert_int_eq(find_global(&cm, "coeffs")->is_const, 1);
    ck_assert_uint_eq(find_global(&cm, "table")->size, 12);
    ck_assert_uint_eq(find_global(&cm, "counter")->size, 4);

    hkp_meta_free(&pm);
    hkp_meta_free(&cm);
    free(ptx);
    free(cubin);
}
END_TEST

START_TEST(meta_hand_written_ptx) {
    const char *ptx = "// comment\n"
                      ".version 8.0\n"
                      ".target sm_90a, debug\n"
                      ".address_size 64\n"
                      "/* block\n comment */\n"
                      ".extern .global .align 4 .u32 outside;\n"
                      ".visible .global .align 8 .u64 g1, g2[3];\n"
                      ".weak .const .align 4 .b8 cb[] = {1, 2, 3, 4, 5};\n"
                      ".global .v4 .f32 vec;\n"
                      ".visible .global .attribute(.managed) .align 4 .u32 managed;\n"
                      ".func (.param .b32 r) helper(.param .b32 x) { ret; }\n"
                      ".visible .entry k1(\n"
                      "  .param .u8 a,\n"
                      "  .param .align 16 .b8 s[24],\n"
                      "  .param .u64 .ptr .global .align 32 p,\n"
                      "  .param .f16 h\n"
                      ") .maxntid 128, 1, 1\n"
                      "{ { .reg .b32 %r<2>; } ret; }\n"
                      ".entry k2 { ret; }\n"
                      ".extern .entry k3(.param .u32 x);\n";
    hkp_meta m;
    char why[256];
    ck_assert_int_eq(hkp_meta_read(ptx, strlen(ptx), HK_FORMAT_AUTO, &m, why, sizeof why), 0);
    ck_assert_int_eq(m.arch, 90 | HKP_ARCH_SPECIFIC);
    ck_assert_int_eq(m.nentries, 2);
    const hkp_entry *k1 = find_entry(&m, "k1");
    ck_assert_ptr_nonnull(k1);
    ck_assert_int_eq(k1->nparams, 4);
    ck_assert_uint_eq(k1->params[0].offset, 0);
    ck_assert_uint_eq(k1->params[1].offset, 16);
    ck_assert_uint_eq(k1->params[1].size, 24);
    ck_assert_uint_eq(k1->params[2].offset, 40); /* .align after .ptr is the pointee's */
    ck_assert_uint_eq(k1->params[2].size, 8);
    ck_assert_uint_eq(k1->params[3].offset, 48);
    ck_assert_uint_eq(k1->params[3].size, 2);
    ck_assert_int_eq(find_entry(&m, "k2")->nparams, 0);
    ck_assert_ptr_null(find_entry(&m, "helper"));
    ck_assert_ptr_null(find_entry(&m, "k3"));
    ck_assert_ptr_null(find_global(&m, "outside"));
    ck_assert_uint_eq(find_global(&m, "g1")->size, 8);
    ck_assert_uint_eq(find_global(&m, "g2")->size, 24);
    ck_assert_uint_eq(find_global(&m, "cb")->size, 5);
    ck_assert_int_eq(find_global(&m, "cb")->is_const, 1);
    ck_assert_uint_eq(find_global(&m, "vec")->size, 16);
    ck_assert_uint_eq(find_global(&m, "managed")->size, 4);
    hkp_meta_free(&m);

    const char *bad[] = {
        ".version 8.0\n.target sm_90\n.entry k(.param .u32 a",         /* cut short */
        ".version 8.0\n.target sm_90\n.entry k(.param .u32 a) { ret;", /* no '}' */
        ".version 8.0\n.target sm_90\n.entry k(.param a) {}",          /* no type */
        ".version 8.0\n.target foo\n",                                 /* no arch */
        ".version 8.0\n.target sm_90\n.global .u32 x[zz];",            /* bad size */
        ".version 8.0\n.target sm_90\n/* unterminated",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why[0] = '\0';
        ck_assert_int_eq(hkp_meta_read(bad[i], strlen(bad[i]), HK_FORMAT_PTX, &m, why, sizeof why),
                         HK_ERR_FORMAT);
        ck_assert_msg(why[0] != '\0', "no reason for bad PTX %zu", i);
        ck_assert_int_eq(m.nentries, 0);
    }
}
END_TEST

START_TEST(meta_cubin_archs) {
    size_t n;
    hkp_meta m;
    char why[256];
    static const struct {
        const char *arch;
        int want;
    } cases[] = {{"sm_80", 80},   {"sm_86", 86},  {"sm_90", 90}, {"sm_90a", 90 | HKP_ARCH_SPECIFIC},
                 {"sm_100", 100}, {"sm_120", 120}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *c = nvrtc_image(KERNELS_CU, cases[i].arch, &n);
        ck_assert_int_eq(hkp_meta_read(c, n, HK_FORMAT_CUBIN, &m, why, sizeof why), 0);
        ck_assert_msg(m.arch == cases[i].want, "%s read as %#x", cases[i].arch, m.arch);
        ck_assert_int_eq(m.nentries, 3);
        hkp_meta_free(&m);
        free(c);
    }
}
END_TEST

START_TEST(meta_fatbin_archs) {
    char *dir = hkt_tmpdir();
    size_t n;
    void *fat = nvcc_fatbin(dir,
                            "-gencode arch=compute_80,code=sm_80 "
                            "-gencode arch=compute_90,code=[sm_90,compute_90] "
                            "-gencode arch=compute_100a,code=sm_100a",
                            &n);
    if (!fat) {
        hkt_rmtree(dir);
        free(dir);
        return;
    }
    hkp_meta m;
    char why[256];
    ck_assert_int_eq(hkp_meta_read(fat, n, HK_FORMAT_AUTO, &m, why, sizeof why), 0);
    ck_assert_int_eq(m.format, HK_FORMAT_FATBIN);
    ck_assert_int_eq(m.narchs, 3);
    int seen = 0;
    for (int i = 0; i < m.narchs; i++) {
        seen |= m.archs[i] == 80 ? 1 : 0;
        seen |= m.archs[i] == 90 ? 2 : 0;
        seen |= m.archs[i] == (100 | HKP_ARCH_SPECIFIC) ? 4 : 0;
    }
    ck_assert_int_eq(seen, 7);
    ck_assert_int_eq(m.nptx_archs, 1);
    ck_assert_int_eq(m.ptx_archs[0], 90);
    ck_assert(hkp_meta_runs_on(&m, 89));  /* sm_80 code */
    ck_assert(hkp_meta_runs_on(&m, 120)); /* compute_90 PTX, JIT forward */
    hkp_meta_free(&m);

    /* Truncated anywhere: a reason, never a crash. */
    size_t cuts[] = {4, 15, 16, 40, n / 3, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        why[0] = '\0';
        ck_assert_int_eq(hkp_meta_read(fat, cuts[i], HK_FORMAT_FATBIN, &m, why, sizeof why),
                         HK_ERR_FORMAT);
        ck_assert_msg(strstr(why, "truncated") || strstr(why, "past the end"), "cut %zu: %s",
                      cuts[i], why);
    }
    hkp_build_opts o = base_opts(90);
    hkp_artifact a;
    ck_assert_int_eq(hkp_build(fat, n - 100, HK_FORMAT_AUTO, &o, &a, why, sizeof why),
                     HK_ERR_FORMAT);
    hkp_artifact_free(&a);
    free(fat);

    /* A fatbin with only sm_80 code is refused for sm_90, naming both. */
    fat = nvcc_fatbin(dir, "-gencode arch=compute_80,code=sm_80", &n);
    ck_assert_int_eq(hkp_build(fat, n, HK_FORMAT_AUTO, &o, &a, why, sizeof why), HK_ERR_ARCH);
    ck_assert_ptr_nonnull(strstr(why, "sm_80"));
    ck_assert_ptr_nonnull(strstr(why, "sm_90"));
    hkp_artifact_free(&a);
    o.arch = 86;
    ck_assert_int_eq(hkp_build(fat, n, HK_FORMAT_AUTO, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.format, HK_FORMAT_FATBIN);
    ck_assert_int_eq(a.meta.narchs, 1);
    hkp_artifact_free(&a);
    free(fat);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* Every prefix and many single-byte corruptions of a real cubin and PTX:
 * the parsers either succeed or give HK_ERR_FORMAT with a reason. */
START_TEST(meta_survives_corruption) {
    size_t n;
    unsigned char *cubin = nvrtc_image(KERNELS_CU, "sm_90", &n);
    hkp_meta m;
    char why[256];
    for (size_t cut = 0; cut < n; cut += (cut < 256 ? 1 : 7)) {
        int rc = hkp_meta_read(cubin, cut, HK_FORMAT_CUBIN, &m, why, sizeof why);
        ck_assert_int_eq(rc, HK_ERR_FORMAT);
        ck_assert(why[0] != '\0');
    }
    unsigned char *copy = malloc(n);
    srand(12345);
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(copy, cubin, n);
        for (int k = 0; k < 4; k++)
            copy[(size_t)rand() % n] = (unsigned char)rand();
        int rc = hkp_meta_read(copy, n, HK_FORMAT_CUBIN, &m, why, sizeof why);
        ck_assert(rc == 0 || rc == HK_ERR_FORMAT);
        hkp_meta_free(&m);
    }
    free(copy);
    free(cubin);

    char *ptx = nvrtc_image(KERNELS_CU, "compute_90", &n);
    for (size_t cut = 0; cut < n; cut += 3) {
        int rc = hkp_meta_read(ptx, cut, HK_FORMAT_PTX, &m, why, sizeof why);
        ck_assert(rc == 0 || rc == HK_ERR_FORMAT);
        hkp_meta_free(&m);
    }
    free(ptx);
}
END_TEST

START_TEST(arch_rules) {
    char b[16];
    ck_assert(hkp_arch_runs_on(80, 86));
    ck_assert(hkp_arch_runs_on(86, 86));
    ck_assert(!hkp_arch_runs_on(86, 80));
    ck_assert(!hkp_arch_runs_on(80, 90));
    ck_assert(!hkp_arch_runs_on(90, 100));
    ck_assert(!hkp_arch_runs_on(100, 90));
    ck_assert(hkp_arch_runs_on(90 | HKP_ARCH_SPECIFIC, 90));
    ck_assert(!hkp_arch_runs_on(100 | HKP_ARCH_SPECIFIC, 103));
    ck_assert(hkp_arch_runs_on(100 | HKP_ARCH_FAMILY, 103));
    ck_assert(!hkp_arch_runs_on(0, 90));
    ck_assert_str_eq(hkp_arch_name(90 | HKP_ARCH_SPECIFIC, b, sizeof b), "sm_90a");
    ck_assert_str_eq(hkp_arch_name(100 | HKP_ARCH_FAMILY, b, sizeof b), "sm_100f");
    ck_assert_str_eq(hkp_arch_name(86, b, sizeof b), "sm_86");
}
END_TEST

/* ---- builds ----------------------------------------------------------------- */

START_TEST(build_cuda_c_with_header) {
    char *dir = hkt_tmpdir();
    char hdr[512], src_path[512], inc[512];
    snprintf(inc, sizeof inc, "%s/inc", dir);
    ck_assert_int_eq(mkdir(inc, 0700), 0);
    snprintf(hdr, sizeof hdr, "%s/inc/params.cuh", dir);
    snprintf(src_path, sizeof src_path, "%s/main.cu", dir);
    ck_assert_int_eq(hkt_write_file(hdr, "#pragma once\n"
                                         "struct Params { float a, b; double c; int n; };\n"
                                         "#define BLOCK 128\n"),
                     0);
    const char *src = "#include \"params.cuh\"\n"
                      "extern \"C\" __global__ void step(Params p, float *out) {\n"
                      "    out[threadIdx.x % BLOCK] = p.a * p.b + (float)p.c + p.n;\n"
                      "}\n"
                      "extern \"C\" __global__ void fill(float *out, float v, unsigned n) {\n"
                      "    if (threadIdx.x < n) out[threadIdx.x] = v;\n"
                      "}\n";
    char iopt[600];
    snprintf(iopt, sizeof iopt, "-I%s", inc);
    const char *opts[] = {iopt, "-DUNUSED=1"};
    hkp_build_opts o = base_opts(90);
    o.nvrtc_options = opts;
    o.nnvrtc_options = 2;
    o.source_name = src_path;
    hkp_artifact a;
    char why[512];
    int rc = hkp_build(src, strlen(src), HK_FORMAT_AUTO, &o, &a, why, sizeof why);
    ck_assert_msg(rc == 0, "build failed: %s\n%s", why, a.log ? a.log : "");
    ck_assert_int_eq(a.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(a.meta.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(a.meta.arch, 90);
    ck_assert_int_eq(a.meta.nentries, 2);
    const hkp_entry *step = find_entry(&a.meta, "step");
    ck_assert_ptr_nonnull(step);
    ck_assert_int_eq(step->nparams, 2);
    ck_assert_uint_eq(step->params[0].size, 24); /* float, float, double, int -> 24 */
    ck_assert_uint_eq(step->params[1].offset, 24);
    ck_assert_uint_eq(step->params[1].size, 8);
    const hkp_entry *fill = find_entry(&a.meta, "fill");
    ck_assert_int_eq(fill->nparams, 3);
    ck_assert_uint_eq(fill->params[1].offset, 8);
    ck_assert_uint_eq(fill->params[2].offset, 12);
    ck_assert_int_eq(a.ndeps, 1);
    ck_assert_ptr_nonnull(strstr(a.deps[0], "inc/params.cuh"));
    ck_assert(a.ms > 0);
    ck_assert_int_eq(a.cache_hit, 0);
    hkp_artifact_free(&a);

    /* PTX only (left for the driver): NUL-terminated, PTX metadata. */
    o.ptx_to_cubin = 0;
    ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.format, HK_FORMAT_PTX);
    ck_assert_int_eq(((char *)a.image)[a.size - 1], '\0');
    ck_assert_int_eq(a.meta.nentries, 2);
    ck_assert_int_eq(find_entry(&a.meta, "step")->params[0].size, 24);
    hkp_artifact_free(&a);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(build_name_expressions) {
    const char *src =
        "template <typename T, int N> __global__ void axpy(T *y, const T *x, T a) {\n"
        "    int i = threadIdx.x; if (i < N) y[i] += a * x[i];\n"
        "}\n"
        "namespace ops { template <typename T> __global__ void zero(T *p) { *p = 0; } }\n";
    const char *names[] = {"axpy<float, 256>", "axpy<double, 64>", "ops::zero<int>"};
    hkp_build_opts o = base_opts(90);
    o.name_expressions = names;
    o.nname_expressions = 3;
    hkp_artifact a;
    char why[512];
    ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_AUTO, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.nlowered, 3);
    ck_assert_int_eq(a.meta.nentries, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(strncmp(a.lowered_names[i], "_Z", 2) == 0, "not mangled: %s",
                      a.lowered_names[i]);
        const hkp_entry *e = find_entry(&a.meta, a.lowered_names[i]);
        ck_assert_msg(e != NULL, "%s -> %s not in the cubin", names[i], a.lowered_names[i]);
        ck_assert_int_eq(e->nparams, i < 2 ? 3 : 1);
    }
    /* double a: the third parameter is 8 bytes at 16. */
    const hkp_entry *d = find_entry(&a.meta, a.lowered_names[1]);
    ck_assert_uint_eq(d->params[2].offset, 16);
    ck_assert_uint_eq(d->params[2].size, 8);
    ck_assert_str_ne(a.lowered_names[0], a.lowered_names[1]);
    hkp_artifact_free(&a);
}
END_TEST

START_TEST(build_ptx_with_nvjitlink) {
    size_t n;
    char *ptx = nvrtc_image(KERNELS_CU, "compute_80", &n);
    hkp_build_opts o = base_opts(90);
    hkp_artifact a;
    char why[512];
    /* n includes the NUL; pass the text without it, in a buffer that ends
     * there, as a file read into memory arrives. */
    char *exact = malloc(n - 1);
    memcpy(exact, ptx, n - 1);
    ck_assert_int_eq(hkp_build(exact, n - 1, HK_FORMAT_AUTO, &o, &a, why, sizeof why), 0);
    free(exact);
    ck_assert_int_eq(a.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(a.meta.arch, 90);
    ck_assert_int_eq(a.meta.nentries, 3);
    ck_assert_int_eq(find_entry(&a.meta, "mixed")->params[3].offset, 48);
    hkp_artifact_free(&a);

    /* Left as PTX for the driver: copied, NUL added. */
    o.ptx_to_cubin = 0;
    ck_assert_int_eq(hkp_build(ptx, n - 1, HK_FORMAT_PTX, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.format, HK_FORMAT_PTX);
    ck_assert_uint_eq(a.size, n);
    ck_assert_int_eq(((char *)a.image)[n - 1], '\0');
    hkp_artifact_free(&a);
    free(ptx);

    /* PTX for a newer GPU cannot run here. */
    ptx = nvrtc_image(KERNELS_CU, "compute_100", &n);
    o.ptx_to_cubin = 1;
    ck_assert_int_eq(hkp_build(ptx, n, HK_FORMAT_AUTO, &o, &a, why, sizeof why), HK_ERR_ARCH);
    ck_assert_ptr_nonnull(strstr(why, "sm_100"));
    hkp_artifact_free(&a);
    free(ptx);
}
END_TEST

START_TEST(build_refusals) {
    hkp_build_opts o = base_opts(90);
    hkp_artifact a;
    char why[512];
    size_t n;

    /* CUDA C with an error on line 3: the log names file and line. */
    const char *bad_c = "extern \"C\" __global__ void k(float *x) {\n"
                        "    x[0] = 1.0f;\n"
                        "    undeclared_thing(x);\n"
                        "}\n";
    o.source_name = "kernels/bad.cu";
    ck_assert_int_eq(hkp_build(bad_c, strlen(bad_c), HK_FORMAT_AUTO, &o, &a, why, sizeof why),
                     HK_ERR_COMPILE);
    ck_assert_ptr_nonnull(a.log);
    ck_assert_msg(strstr(a.log, "kernels/bad.cu(3)") != NULL, "log: %s", a.log);
    ck_assert_ptr_nonnull(strstr(why, "undeclared_thing"));
    ck_assert_ptr_null(a.image);
    hkp_artifact_free(&a);

    /* PTX with a syntax error on line 7: nvJitLink's log says so. */
    const char *bad_ptx = ".version 8.0\n"
                          ".target sm_90\n"
                          ".address_size 64\n"
                          ".visible .entry k(.param .u64 p)\n"
                          "{\n"
                          "  .reg .b64 %rd<2>;\n"
                          "  frobnicate.u64 %rd1, 3;\n"
                          "  ret;\n"
                          "}\n";
    o.source_name = "bad.ptx";
    ck_assert_int_eq(hkp_build(bad_ptx, strlen(bad_ptx), HK_FORMAT_AUTO, &o, &a, why, sizeof why),
                     HK_ERR_COMPILE);
    ck_assert_ptr_nonnull(a.log);
    ck_assert_msg(strstr(a.log, "line 7") != NULL, "log: %s", a.log);
    ck_assert_ptr_nonnull(strstr(why, "nvJitLink"));
    hkp_artifact_free(&a);

    /* Cubins for another architecture. */
    void *c80 = nvrtc_image(KERNELS_CU, "sm_80", &n);
    ck_assert_int_eq(hkp_build(c80, n, HK_FORMAT_AUTO, &o, &a, why, sizeof why), HK_ERR_ARCH);
    ck_assert_str_eq(why, "cubin is sm_80, device is sm_90");
    hkp_artifact_free(&a);
    o.arch = 86; /* same major, newer minor: runs */
    ck_assert_int_eq(hkp_build(c80, n, HK_FORMAT_AUTO, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(a.meta.nentries, 3);
    hkp_artifact_free(&a);
    free(c80);
    o.arch = 90;
    void *c100 = nvrtc_image(KERNELS_CU, "sm_100", &n);
    ck_assert_int_eq(hkp_build(c100, n, HK_FORMAT_AUTO, &o, &a, why, sizeof why), HK_ERR_ARCH);
    ck_assert_str_eq(why, "cubin is sm_100, device is sm_90");
    hkp_artifact_free(&a);
    free(c100);

    /* Formats. */
    ck_assert_int_eq(hkp_build("", 0, HK_FORMAT_AUTO, &o, &a, why, sizeof why), HK_ERR_FORMAT);
    ck_assert_str_eq(why, "empty input");
    hkp_artifact_free(&a);
    unsigned char junk[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
    ck_assert_int_eq(hkp_build(junk, 30, HK_FORMAT_AUTO, &o, &a, why, sizeof why), HK_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "truncated ELF"));
    hkp_artifact_free(&a);
}
END_TEST

/* ---- cache ---------------------------------------------------------------- */

static int build_file(const char *path, hkp_cache *c, const char *iopt, hkp_artifact *a) {
    size_t n;
    char *src = read_whole(path, &n);
    const char *opts[] = {iopt};
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    o.source_name = path;
    o.nvrtc_options = opts;
    o.nnvrtc_options = iopt ? 1 : 0;
    char why[512];
    int rc = hkp_build(src, n, HK_FORMAT_CUDA_C, &o, a, why, sizeof why);
    ck_assert_msg(rc == 0, "build of %s failed: %s %s", path, why, a->log ? a->log : "");
    free(src);
    return a->cache_hit;
}

START_TEST(cache_tracks_headers) {
    char *dir = hkt_tmpdir();
    char cdir[512], src[512], hdr[512], other[512], inc[512], iopt[520];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    snprintf(inc, sizeof inc, "%s/include", dir);
    ck_assert_int_eq(mkdir(inc, 0700), 0);
    snprintf(iopt, sizeof iopt, "-I%s", inc);
    snprintf(src, sizeof src, "%s/k.cu", dir);
    snprintf(hdr, sizeof hdr, "%s/include/scale.cuh", dir);
    snprintf(other, sizeof other, "%s/include/unrelated.cuh", dir);
    ck_assert_int_eq(hkt_write_file(hdr, "#define FACTOR 2.0f\n"), 0);
    ck_assert_int_eq(hkt_write_file(other, "#define NOTHING 1\n"), 0);
    ck_assert_int_eq(hkt_write_file(src, "#include <scale.cuh>\n"
                                         "extern \"C\" __global__ void k(float *x) {\n"
                                         "    x[threadIdx.x] *= FACTOR;\n"
                                         "}\n"),
                     0);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    hkp_artifact a;
    struct timespec t0;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 0);
    double miss_ms = ms_since(&t0);
    ck_assert_int_eq(a.ndeps, 1);
    size_t first_size = a.size;
    void *first = malloc(a.size);
    memcpy(first, a.image, a.size);
    hkp_artifact_free(&a);

    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 1);
    double hit_ms = ms_since(&t0);
    ck_assert_uint_eq(a.size, first_size);
    ck_assert_int_eq(memcmp(a.image, first, first_size), 0);
    ck_assert_int_eq(a.meta.nentries, 1);
    ck_assert_int_eq(a.ndeps, 1);
    hkp_artifact_free(&a);
    printf("cache: miss (NVRTC cubin) %.1f ms, hit %.2f ms\n", miss_ms, hit_ms);

    /* An unrelated file changes: still a hit. */
    ck_assert_int_eq(hkt_write_file(other, "#define NOTHING 2\n"), 0);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 1);
    hkp_artifact_free(&a);

    /* The header changes: a miss, and a different image. */
    ck_assert_int_eq(hkt_write_file(hdr, "#define FACTOR 3.0f\n"), 0);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 0);
    ck_assert(a.size != first_size || memcmp(a.image, first, first_size) != 0);
    hkp_artifact_free(&a);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 1);
    hkp_artifact_free(&a);

    /* Back to the first header: that version is still cached. */
    ck_assert_int_eq(hkt_write_file(hdr, "#define FACTOR 2.0f\n"), 0);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 1);
    ck_assert_int_eq(memcmp(a.image, first, first_size), 0);
    hkp_artifact_free(&a);

    /* Other options are another key. */
    ck_assert_int_eq(build_file(src, c, iopt, &a), 1);
    hkp_artifact_free(&a);
    {
        size_t n;
        char *s = read_whole(src, &n);
        const char *opts[] = {iopt, "-DEXTRA=1"};
        hkp_build_opts o = base_opts(90);
        o.cache = c;
        o.source_name = src;
        o.nvrtc_options = opts;
        o.nnvrtc_options = 2;
        char why[256];
        ck_assert_int_eq(hkp_build(s, n, HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
        ck_assert_int_eq(a.cache_hit, 0);
        hkp_artifact_free(&a);
        o.arch = 80;
        ck_assert_int_eq(hkp_build(s, n, HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
        ck_assert_int_eq(a.cache_hit, 0);
        ck_assert_int_eq(a.meta.arch, 80);
        hkp_artifact_free(&a);
        free(s);
    }

    uint64_t hits, misses, bytes;
    hkp_cache_stats(c, &hits, &misses, &bytes);
    ck_assert_uint_eq(hits, 5);
    ck_assert_uint_eq(misses, 4);
    int entries;
    ck_assert_uint_eq(bytes, dir_bytes(cdir, &entries, NULL));
    ck_assert_int_gt(entries, 0);
    free(first);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cache_ptx_builds) {
    char *dir = hkt_tmpdir();
    char cdir[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    size_t n;
    char *ptx = nvrtc_image(KERNELS_CU, "compute_90", &n);
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    hkp_artifact a;
    char why[256];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(hkp_build(ptx, n, HK_FORMAT_PTX, &o, &a, why, sizeof why), 0);
    double link_ms = ms_since(&t0);
    ck_assert_int_eq(a.cache_hit, 0);
    hkp_artifact_free(&a);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(hkp_build(ptx, n, HK_FORMAT_PTX, &o, &a, why, sizeof why), 0);
    double hit_ms = ms_since(&t0);
    ck_assert_int_eq(a.cache_hit, 1);
    ck_assert_int_eq(a.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(a.meta.nentries, 3);
    hkp_artifact_free(&a);
    printf("cache: nvJitLink PTX->cubin %.1f ms, hit %.2f ms\n", link_ms, hit_ms);
    free(ptx);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cache_truncated_entry_is_replaced) {
    char *dir = hkt_tmpdir();
    char cdir[512], src[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    snprintf(src, sizeof src, "%s/k.cu", dir);
    ck_assert_int_eq(hkt_write_file(src, KERNELS_CU), 0);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    hkp_artifact a;
    ck_assert_int_eq(build_file(src, c, NULL, &a), 0);
    hkp_artifact_free(&a);

    /* Damage every entry: cut the biggest (the cubin) and flip a byte in
     * the others. */
    DIR *d = opendir(cdir);
    struct dirent *de;
    int damaged = 0;
    while ((de = readdir(d)) != NULL) {
        if (!strstr(de->d_name, ".hkc"))
            continue;
        char p[1024];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", cdir, de->d_name);
        ck_assert_int_eq(stat(p, &st), 0);
        if (st.st_size > 2000) {
            ck_assert_int_eq(truncate(p, st.st_size / 2), 0);
        } else {
            FILE *f = fopen(p, "r+b");
            fseek(f, st.st_size - 3, SEEK_SET);
            int ch = fgetc(f);
            fseek(f, st.st_size - 3, SEEK_SET);
            fputc(ch ^ 0x5a, f);
            fclose(f);
        }
        damaged++;
    }
    closedir(d);
    ck_assert_int_eq(damaged, 2); /* manifest + artifact */

    /* A new handle (another process's view): this one would serve its own
     * entries from memory. */
    hkp_cache_close(c);
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    ck_assert_int_eq(build_file(src, c, NULL, &a), 0); /* miss, rebuilt */
    ck_assert_int_eq(a.meta.nentries, 3);
    hkp_artifact_free(&a);
    ck_assert_int_eq(build_file(src, c, NULL, &a), 1); /* replaced: hit */
    ck_assert_int_eq(a.meta.nentries, 3);
    hkp_artifact_free(&a);

    /* The raw API: a short file is a miss and is removed. */
    uint8_t key[HKP_KEY_BYTES] = {1, 2, 3};
    const char payload[] = "payload bytes";
    ck_assert_int_eq(hkp_cache_put(c, key, payload, sizeof payload), 0);
    void *got;
    size_t gn;
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), 0);
    ck_assert_uint_eq(gn, sizeof payload);
    ck_assert_int_eq(memcmp(got, payload, gn), 0);
    free(got);
    char p[1024];
    snprintf(p, sizeof p, "%s/0102030000000000000000000000000000000000000000000000000000000000.hkc",
             cdir);
    ck_assert_int_eq(truncate(p, 20), 0);
    hkp_cache_close(c);
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), HK_ERR_NOT_FOUND);
    ck_assert_int_ne(access(p, F_OK), 0);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* Removes every entry file of cache directory cdir; returns how many. */
static int remove_entries(const char *cdir) {
    DIR *d = opendir(cdir);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)) != NULL) {
        char p[1024];
        if (!strstr(de->d_name, ".hkc"))
            continue;
        snprintf(p, sizeof p, "%s/%s", cdir, de->d_name);
        n += unlink(p) == 0;
    }
    closedir(d);
    return n;
}

static void expect_entry(hkp_cache *c, const uint8_t *key, const void *want, size_t n) {
    void *got = NULL;
    size_t gn = 0;
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), 0);
    ck_assert_uint_eq(gn, n);
    ck_assert_int_eq(memcmp(got, want, n), 0);
    free(got);
}

/* The entries a handle read or wrote last are served from memory (no file
 * read: they survive the file's removal), within both bounds; a put of a
 * key replaces its copy (manifests change under their key). */
START_TEST(cache_memory_tier) {
    char *dir = hkt_tmpdir();
    char cdir[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    hkp_cache *c, *other;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    unsigned char buf[3000];
    uint8_t key[HKP_KEY_BYTES] = {0x42};
    for (int i = 0; i <= HKP_CACHE_MEM_ENTRIES; i++) {
        key[1] = (uint8_t)i;
        memset(buf, i, sizeof buf);
        ck_assert_int_eq(hkp_cache_put(c, key, buf, sizeof buf), 0);
    }
    ck_assert_int_eq(remove_entries(cdir), HKP_CACHE_MEM_ENTRIES + 1);
    void *got;
    size_t gn;
    key[1] = 0; /* the oldest: past the count bound */
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), HK_ERR_NOT_FOUND);
    for (int i = 1; i <= HKP_CACHE_MEM_ENTRIES; i++) {
        key[1] = (uint8_t)i;
        memset(buf, i, sizeof buf);
        expect_entry(c, key, buf, sizeof buf);
    }
    /* Another handle has nothing in memory: the files are gone. */
    ck_assert_int_eq(hkp_cache_open(&other, cdir, 64 << 20, NULL), 0);
    ck_assert_int_eq(hkp_cache_get(other, key, &got, &gn), HK_ERR_NOT_FOUND);
    /* A disk hit is kept too. */
    uint8_t k2[HKP_KEY_BYTES] = {0x43};
    ck_assert_int_eq(hkp_cache_put(other, k2, "disk", 5), 0);
    ck_assert_int_eq(remove_entries(cdir), 1);
    ck_assert_int_eq(hkp_cache_put(other, k2, "disk", 5), 0); /* file back */
    expect_entry(c, k2, "disk", 5);                           /* read from disk */
    ck_assert_int_eq(remove_entries(cdir), 1);
    expect_entry(c, k2, "disk", 5); /* now from memory */
    /* A put replaces the copy of its key. */
    ck_assert_int_eq(hkp_cache_put(c, k2, "newer", 6), 0);
    ck_assert_int_eq(remove_entries(cdir), 1);
    expect_entry(c, k2, "newer", 6);
    hkp_cache_close(other);
    hkp_cache_close(c);
    /* The byte bound: an eighth of max_bytes. */
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 16000, NULL), 0);
    uint8_t k3[HKP_KEY_BYTES] = {0x44}, k4[HKP_KEY_BYTES] = {0x45};
    ck_assert_int_eq(hkp_cache_put(c, k3, buf, 2000), 0); /* > 16000 / 8 */
    ck_assert_int_eq(hkp_cache_put(c, k4, buf, 1500), 0);
    ck_assert_int_eq(remove_entries(cdir), 2);
    ck_assert_int_eq(hkp_cache_get(c, k3, &got, &gn), HK_ERR_NOT_FOUND);
    expect_entry(c, k4, buf, 1500);
    /* A put too large to keep anywhere drops the older copy of its key. */
    unsigned char *big = calloc(1, 16000);
    ck_assert_int_eq(hkp_cache_put(c, k4, big, 16000), 0);
    ck_assert_int_eq(hkp_cache_get(c, k4, &got, &gn), HK_ERR_NOT_FOUND);
    free(big);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cache_two_processes) {
    char *dir = hkt_tmpdir();
    char cdir[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        ck_assert_int_ge(kids[k], 0);
        if (kids[k] == 0) {
            /* Both children write the same keys and some of their own, at
             * once, with the raw API and real builds. */
            hkp_cache *c;
            if (hkp_cache_open(&c, cdir, 64 << 20, NULL) != 0)
                _exit(10);
            for (int i = 0; i < 200; i++) {
                uint8_t key[HKP_KEY_BYTES] = {0};
                key[0] = (uint8_t)(i % 50);
                key[1] = (uint8_t)(i % 3 == 0 ? k : 9);
                size_t len = 1000 + (size_t)i * 37;
                unsigned char *buf = malloc(len);
                memset(buf, i, len);
                /* HK_ERR_BUSY: the other child held the directory's lock
                 * past HKP_CACHE_LOCK_MS (a slow machine, a sanitizer
                 * build) and the entry was left unwritten, as meant; put
                 * again, so that every key ends up written. */
                int pr = HK_ERR_BUSY;
                for (int t = 0; t < 40 && pr == HK_ERR_BUSY; t++)
                    pr = hkp_cache_put(c, key, buf, len);
                if (pr != 0)
                    _exit(11);
                void *got;
                size_t gn;
                if (hkp_cache_get(c, key, &got, &gn) == 0) {
                    free(got); /* content verified by the hash already */
                }
                free(buf);
            }
            for (int i = 0; i < 3; i++) {
                char src[256];
                snprintf(src, sizeof src, "extern \"C\" __global__ void k%d(int *p) { *p = %d; }\n",
                         i, i);
                hkp_build_opts o = base_opts(90);
                o.cache = c;
                hkp_artifact a;
                char why[256];
                if (hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why) != 0)
                    _exit(12);
                hkp_artifact_free(&a);
            }
            hkp_cache_close(c);
            _exit(0);
        }
    }
    for (int k = 0; k < 2; k++) {
        int st;
        ck_assert_int_eq(waitpid(kids[k], &st, 0), kids[k]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d status %d", k, st);
    }
    /* Every file left is a complete, verifiable entry; no temporaries. */
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    DIR *d = opendir(cdir);
    struct dirent *de;
    int checked = 0, tmps = 0;
    while ((de = readdir(d)) != NULL) {
        if (strstr(de->d_name, ".hkc.tmp."))
            tmps++;
        if (strlen(de->d_name) != 68 || !strstr(de->d_name, ".hkc"))
            continue;
        uint8_t key[HKP_KEY_BYTES];
        for (int i = 0; i < HKP_KEY_BYTES; i++) {
            unsigned v;
            sscanf(de->d_name + 2 * i, "%2x", &v);
            key[i] = (uint8_t)v;
        }
        void *got;
        size_t gn;
        ck_assert_msg(hkp_cache_get(c, key, &got, &gn) == 0, "bad entry %s", de->d_name);
        free(got);
        checked++;
    }
    closedir(d);
    ck_assert_int_eq(tmps, 0);
    ck_assert_int_ge(checked, 50 + 2 * 17 + 3 * 2);
    /* The builds the children made are hits now. */
    for (int i = 0; i < 3; i++) {
        char src[256];
        snprintf(src, sizeof src, "extern \"C\" __global__ void k%d(int *p) { *p = %d; }\n", i, i);
        hkp_build_opts o = base_opts(90);
        o.cache = c;
        hkp_artifact a;
        char why[256];
        ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
        ck_assert_int_eq(a.cache_hit, 1);
        hkp_artifact_free(&a);
    }
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cache_eviction_bound) {
    char *dir = hkt_tmpdir();
    char cdir[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    const uint64_t bound = 100000;
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, bound, NULL), 0);
    unsigned char buf[9000];
    uint8_t first[HKP_KEY_BYTES] = {0xee}, key[HKP_KEY_BYTES] = {0};
    memset(buf, 0xab, sizeof buf);
    ck_assert_int_eq(hkp_cache_put(c, first, buf, sizeof buf), 0);
    for (int i = 0; i < 60; i++) {
        key[0] = (uint8_t)i;
        ck_assert_int_eq(hkp_cache_put(c, key, buf, sizeof buf - (size_t)i), 0);
        /* Keep `first` recently used: LRU must spare it. */
        void *got;
        size_t gn;
        ck_assert_int_eq(hkp_cache_get(c, first, &got, &gn), 0);
        free(got);
        int entries;
        ck_assert_uint_le(dir_bytes(cdir, &entries, NULL), bound);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL); /* distinct mtimes on coarse filesystems */
    }
    int entries;
    uint64_t bytes = dir_bytes(cdir, &entries, NULL);
    ck_assert_uint_le(bytes, bound);
    ck_assert_int_ge(entries, 9); /* evicts only what it must */
    void *got;
    size_t gn;
    ck_assert_int_eq(hkp_cache_get(c, first, &got, &gn), 0);
    free(got);
    key[0] = 0; /* the oldest regular entry is gone */
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), HK_ERR_NOT_FOUND);
    key[0] = 59; /* the newest is there */
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), 0);
    free(got);
    /* Too big to ever fit: not stored, not an error. */
    unsigned char *huge = calloc(1, bound);
    key[0] = 200;
    ck_assert_int_eq(hkp_cache_put(c, key, huge, bound), 0);
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), HK_ERR_NOT_FOUND);
    free(huge);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cache_default_dir) {
    char buf[512];
    setenv("XDG_CACHE_HOME", "/tmp/xdg-test", 1);
    ck_assert_int_eq(hkp_cache_default_dir(buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "/tmp/xdg-test/hotkern");
    setenv("XDG_CACHE_HOME", "relative", 1);
    setenv("HOME", "/home/someone", 1);
    ck_assert_int_eq(hkp_cache_default_dir(buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "/home/someone/.cache/hotkern");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    ck_assert_int_eq(hkp_cache_default_dir(buf, sizeof buf), HK_ERR_NOT_FOUND);
    setenv("HOME", "/home/someone", 1);
    ck_assert_int_eq(hkp_cache_default_dir(buf, 8), HK_ERR_INVALID);
}
END_TEST

/* Both CUDA C paths give the same kernels; prints what each costs. */
START_TEST(build_paths_agree_and_timings) {
    hkp_build_opts o = base_opts(90);
    hkp_artifact direct, via, ptx;
    char why[512];
    /* Warm NVRTC and nvJitLink once so the timings compare steady states. */
    ck_assert_int_eq(
        hkp_build(KERNELS_CU, strlen(KERNELS_CU), HK_FORMAT_CUDA_C, &o, &direct, why, sizeof why),
        0);
    hkp_artifact_free(&direct);
    o.nvrtc_via_ptx = 1;
    ck_assert_int_eq(
        hkp_build(KERNELS_CU, strlen(KERNELS_CU), HK_FORMAT_CUDA_C, &o, &via, why, sizeof why), 0);
    hkp_artifact_free(&via);

    double t_direct = 0, t_via = 0, t_ptx = 0;
    for (int i = 0; i < 3; i++) {
        o.nvrtc_via_ptx = 0;
        o.ptx_to_cubin = 1;
        ck_assert_int_eq(hkp_build(KERNELS_CU, strlen(KERNELS_CU), HK_FORMAT_CUDA_C, &o, &direct,
                                   why, sizeof why),
                         0);
        o.nvrtc_via_ptx = 1;
        ck_assert_int_eq(
            hkp_build(KERNELS_CU, strlen(KERNELS_CU), HK_FORMAT_CUDA_C, &o, &via, why, sizeof why),
            0);
        o.ptx_to_cubin = 0;
        ck_assert_int_eq(
            hkp_build(KERNELS_CU, strlen(KERNELS_CU), HK_FORMAT_CUDA_C, &o, &ptx, why, sizeof why),
            0);
        t_direct += direct.ms;
        t_via += via.ms;
        t_ptx += ptx.ms;
        ck_assert_int_eq(direct.format, HK_FORMAT_CUBIN);
        ck_assert_int_eq(via.format, HK_FORMAT_CUBIN);
        ck_assert_int_eq(ptx.format, HK_FORMAT_PTX);
        ck_assert_int_eq(direct.meta.nentries, via.meta.nentries);
        for (int e = 0; e < direct.meta.nentries; e++) {
            const hkp_entry *a = &direct.meta.entries[e];
            const hkp_entry *b = find_entry(&via.meta, a->name);
            ck_assert_ptr_nonnull(b);
            ck_assert_int_eq(a->nparams, b->nparams);
            ck_assert_ptr_nonnull(find_entry(&ptx.meta, a->name));
        }
        hkp_artifact_free(&direct);
        hkp_artifact_free(&via);
        hkp_artifact_free(&ptx);
    }
    printf("build: NVRTC->cubin %.1f ms, NVRTC->PTX->nvJitLink %.1f ms, NVRTC->PTX %.1f ms "
           "(mean of 3)\n",
           t_direct / 3, t_via / 3, t_ptx / 3);
}
END_TEST

/* ---- toolkit headers, in-memory headers, PCH -------------------------------- */

static const char *const CUB_CU =
    "#include <cub/block/block_reduce.cuh>\n"
    "#include <cuda/std/cstdint>\n"
    "extern \"C\" __global__ void block_sum(const float *in, float *out) {\n"
    "    using BR = cub::BlockReduce<float, 128>;\n"
    "    __shared__ typename BR::TempStorage tmp;\n"
    "    float s = BR(tmp).Sum(in[blockIdx.x * 128 + threadIdx.x] * 3.0f);\n"
    "    if (threadIdx.x == 0) out[blockIdx.x] = s + (cuda::std::int32_t)1;\n"
    "}\n";

/* 1 when no dependency of a lies in the toolkit. */
static int no_toolkit_deps(const hkp_artifact *a) {
    const hkp_toolkit *tk = hkp_toolkit_get();
    for (int i = 0; i < a->ndeps; i++)
        if (hkp_toolkit_owns(tk, a->deps[i]))
            return 0;
    return 1;
}

START_TEST(toolkit_is_found) {
    const hkp_toolkit *tk = hkp_toolkit_get();
    char path[8192];
    ck_assert_msg(tk->include[0] == '/', "toolkit include dir not found");
    snprintf(path, sizeof path, "%s/cuda_fp16.h", tk->include);
    ck_assert_int_eq(access(path, R_OK), 0);
    /* CUDA 13 keeps cub and cuda::std under include/cccl. */
    ck_assert_msg(tk->cccl[0] == '/', "include/cccl not found");
    snprintf(path, sizeof path, "%s/cub/block/block_reduce.cuh", tk->cccl);
    ck_assert_int_eq(access(path, R_OK), 0);
    ck_assert(hkp_toolkit_owns(tk, path));
    ck_assert(!hkp_toolkit_owns(tk, "/tmp/cub/block/block_reduce.cuh"));
    ck_assert_msg(strstr(tk->nvrtc, "libnvrtc") != NULL, "libnvrtc in use: '%s'", tk->nvrtc);
}
END_TEST

START_TEST(build_cub_without_include_dirs) {
    hkp_build_opts o = base_opts(90);
    o.source_name = "sum.cu";
    hkp_artifact a;
    char why[512];
    int rc = hkp_build(CUB_CU, strlen(CUB_CU), HK_FORMAT_AUTO, &o, &a, why, sizeof why);
    ck_assert_msg(rc == 0, "%s\n%s", why, a.log ? a.log : "");
    ck_assert_int_eq(a.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(a.meta.nentries, 1);
    ck_assert_str_eq(a.meta.entries[0].name, "block_sum");
    ck_assert_msg(no_toolkit_deps(&a), "toolkit headers listed as dependencies");
    hkp_artifact_free(&a);

    /* What the default adds: without it the include is not found. */
    o.no_toolkit = 1;
    ck_assert_int_eq(hkp_build(CUB_CU, strlen(CUB_CU), HK_FORMAT_AUTO, &o, &a, why, sizeof why),
                     HK_ERR_COMPILE);
    ck_assert_ptr_nonnull(a.log);
    ck_assert_msg(strstr(a.log, "cub/block/block_reduce.cuh") != NULL, "%s", a.log);
    hkp_artifact_free(&a);
}
END_TEST

START_TEST(build_toolkit_headers_without_include_dirs) {
    static const char *const src =
        "#include <cuda_fp16.h>\n"
        "#include <cuda_bf16.h>\n"
        "#include <cooperative_groups.h>\n"
        "#include <cuda/std/cstdint>\n"
        "#include <cuda/std/type_traits>\n"
        "namespace cg = cooperative_groups;\n"
        "extern \"C\" __global__ void conv(const float *in, __half *h, __nv_bfloat16 *b) {\n"
        "    cg::thread_block blk = cg::this_thread_block();\n"
        "    static_assert(cuda::std::is_same<cuda::std::int64_t, long long>::value ||\n"
        "                  sizeof(cuda::std::int64_t) == 8, \"int64\");\n"
        "    unsigned i = blk.thread_rank();\n"
        "    h[i] = __float2half(in[i]);\n"
        "    b[i] = __float2bfloat16(in[i]);\n"
        "    blk.sync();\n"
        "}\n";
    hkp_build_opts o = base_opts(90);
    hkp_artifact a;
    char why[512];
    int rc = hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why);
    ck_assert_msg(rc == 0, "%s\n%s", why, a.log ? a.log : "");
    ck_assert_int_eq(a.meta.nentries, 1);
    ck_assert_str_eq(a.meta.entries[0].name, "conv");
    ck_assert(no_toolkit_deps(&a));
    hkp_artifact_free(&a);
}
END_TEST

/* A kernel storing `value`, with K from "common.cuh". */
static const char *const USES_COMMON =
    "#include <cuda/std/cstdint>\n"
    "#include \"common.cuh\"\n"
    "extern \"C\" __global__ void k(cuda::std::int32_t *x) { x[threadIdx.x] = K; }\n";

/* Builds src to PTX and returns 1 when the PTX stores the constant `value`. */
static int ptx_has_constant(const char *src, hkp_build_opts o, long value, hkp_artifact *keep) {
    hkp_artifact a;
    char why[512], needle[64];
    o.ptx_to_cubin = 0;
    int rc = hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why);
    ck_assert_msg(rc == 0, "%s\n%s", why, a.log ? a.log : "");
    snprintf(needle, sizeof needle, ", %ld;", value);
    int found = strstr(a.image, needle) != NULL;
    if (keep)
        *keep = a;
    else
        hkp_artifact_free(&a);
    return found;
}

START_TEST(build_in_memory_headers) {
    hk_header h[2] = {
        {"common.cuh", "#pragma once\n#include <inner.cuh>\n#define K (INNER + 1)\n", 0},
        {"inner.cuh", "#define INNER 41", 17}, /* not NUL-terminated */
    };
    h[0].size = strlen(h[0].data);
    hkp_build_opts o = base_opts(90);
    o.headers = h;
    o.nheaders = 2;
    o.source_name = "/nonexistent/dir/k.cu";
    hkp_artifact a;
    ck_assert(ptx_has_constant(USES_COMMON, o, 42, &a));
    /* Both headers are dependencies, under their names. */
    ck_assert_int_eq(a.ndeps, 2);
    ck_assert_str_eq(a.deps[0], "common.cuh");
    ck_assert_str_eq(a.deps[1], "inner.cuh");
    hkp_artifact_free(&a);

    /* The swap's headers hide the runtime's of the same name. */
    hk_header base[2] = {{"common.cuh", "#define K 7\n", 12}, {"other.cuh", "", 0}};
    o.base_headers = base;
    o.nbase_headers = 2;
    ck_assert(ptx_has_constant(USES_COMMON, o, 42, NULL));
    o.nheaders = 0;
    ck_assert(ptx_has_constant(USES_COMMON, o, 7, NULL));

    /* Missing header: a compile error that names it, nothing else lost. */
    o.nbase_headers = 0;
    char why[512];
    ck_assert_int_eq(
        hkp_build(USES_COMMON, strlen(USES_COMMON), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why),
        HK_ERR_COMPILE);
    ck_assert_msg(strstr(a.log, "common.cuh") != NULL, "%s", a.log);
    hkp_artifact_free(&a);

    /* A header without a name is refused before NVRTC. */
    hk_header bad = {"", "x", 1};
    o.headers = &bad;
    o.nheaders = 1;
    ck_assert_int_eq(
        hkp_build(USES_COMMON, strlen(USES_COMMON), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why),
        HK_ERR_INVALID);
    hkp_artifact_free(&a);
}
END_TEST

START_TEST(cache_key_follows_in_memory_headers) {
    char *dir = hkt_tmpdir();
    char cdir[512], hpath[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    snprintf(hpath, sizeof hpath, "%s/common.cuh", dir);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    char name[600];
    snprintf(name, sizeof name, "%s/k.cu", dir);
    hk_header h = {"common.cuh", "#define K 100\n", 14};
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    o.headers = &h;
    o.nheaders = 1;
    o.source_name = name;
    hkp_artifact a;
    ck_assert(ptx_has_constant(USES_COMMON, o, 100, &a));
    ck_assert_int_eq(a.cache_hit, 0);
    hkp_artifact_free(&a);
    ck_assert(ptx_has_constant(USES_COMMON, o, 100, &a));
    ck_assert_int_eq(a.cache_hit, 1);
    hkp_artifact_free(&a);
    /* Same name, new contents: a miss, and the new value. */
    h.data = "#define K 200\n";
    ck_assert(ptx_has_constant(USES_COMMON, o, 200, &a));
    ck_assert_int_eq(a.cache_hit, 0);
    hkp_artifact_free(&a);
    /* Back to the first contents: its entry is still there. */
    h.data = "#define K 100\n";
    ck_assert(ptx_has_constant(USES_COMMON, o, 100, &a));
    ck_assert_int_eq(a.cache_hit, 1);
    hkp_artifact_free(&a);
    /* A file of that name beside the source: without the in-memory header
     * the file is used (a different key, since the names differ) ... */
    ck_assert_int_eq(hkt_write_file(hpath, "#define K 300\n"), 0);
    o.nheaders = 0;
    ck_assert(ptx_has_constant(USES_COMMON, o, 300, &a));
    ck_assert_int_eq(a.cache_hit, 0);
    hkp_artifact_free(&a);
    /* ... and with it, the in-memory one hides the file. */
    o.nheaders = 1;
    ck_assert(ptx_has_constant(USES_COMMON, o, 100, &a));
    hkp_artifact_free(&a);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* NVRTC's PCH does not see edits to headers it covers; hotkern's must: each
 * build with pch on sees the header's current contents, whether the header
 * is in memory or a file, and the toolkit prefix is still precompiled. */
START_TEST(pch_sees_header_edits) {
    char *dir = hkt_tmpdir();
    char name[600], hpath[600];
    snprintf(name, sizeof name, "%s/k.cu", dir);
    snprintf(hpath, sizeof hpath, "%s/common.cuh", dir);
    hkp_build_opts o = base_opts(90);
    o.pch = 1;
    o.source_name = name;
    uint64_t created0, created1;
    hkp_pch_stats(&created0, NULL);
    hk_header h = {"common.cuh", NULL, 0};
    o.headers = &h;
    o.nheaders = 1;
    for (int v = 1; v <= 3; v++) {
        char text[64];
        snprintf(text, sizeof text, "#define K %d\n", 1000 + v);
        h.data = text;
        h.size = strlen(text);
        ck_assert_msg(ptx_has_constant(USES_COMMON, o, 1000 + v, NULL), "in-memory edit %d", v);
    }
    o.nheaders = 0;
    for (int v = 1; v <= 3; v++) {
        char text[64];
        snprintf(text, sizeof text, "#define K %d\n", 2000 + v);
        ck_assert_int_eq(hkt_write_file(hpath, text), 0);
        ck_assert_msg(ptx_has_constant(USES_COMMON, o, 2000 + v, NULL), "file edit %d", v);
    }
    hkp_pch_stats(&created1, NULL);
    /* One PCH of <cuda/std/cstdint>, made by the first build and reused. */
    ck_assert_uint_eq(created1 - created0, 1);

    /* A header of the user's first: only NVRTC's implicit prefix is precompiled,
     * and the build is right. */
    static const char *const first =
        "#include \"common.cuh\"\n"
        "extern \"C\" __global__ void k(int *x) { x[threadIdx.x] = K + 1; }\n";
    ck_assert_int_eq(hkt_write_file(hpath, "#define K 3000\n"), 0);
    ck_assert(ptx_has_constant(first, o, 3001, NULL));
    ck_assert_int_eq(hkt_write_file(hpath, "#define K 4000\n"), 0);
    ck_assert(ptx_has_constant(first, o, 4001, NULL));

    /* Messages keep their line numbers after the cut. */
    static const char *const broken = "#include <cuda/std/cstdint>\n"
                                      "#include \"common.cuh\"\n"
                                      "\n"
                                      "extern \"C\" __global__ void k(int *x) { x[0] = nope; }\n";
    hkp_artifact a;
    char why[512], want[700];
    o.ptx_to_cubin = 0;
    ck_assert_int_eq(hkp_build(broken, strlen(broken), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why),
                     HK_ERR_COMPILE);
    snprintf(want, sizeof want, "%s(4): error", name);
    ck_assert_msg(strstr(a.log, want) != NULL, "want '%s' in:\n%s", want, a.log);
    hkp_artifact_free(&a);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* A PCH heap too small for the headers: the build succeeds, the heap is
 * enlarged to what NVRTC asked for, and the next build makes the PCH. */
START_TEST(pch_heap_exhausted_still_builds) {
    static const char *const src = "#include <cuda/std/cstdint>\n"
                                   "#include <cuda_fp16.h>\n"
                                   "extern \"C\" __global__ void h(__half *x) {\n"
                                   "    x[threadIdx.x] = __float2half(%d.0f);\n"
                                   "}\n";
    ck_assert_int_eq(nvrtcSetPCHHeapSize(4096), NVRTC_SUCCESS);
    size_t heap0 = 0, heap1 = 0;
    ck_assert_int_eq(nvrtcGetPCHHeapSize(&heap0), NVRTC_SUCCESS);
    uint64_t c0, r0, c1, r1, c2, r2;
    hkp_pch_stats(&c0, &r0);
    hkp_build_opts o = base_opts(90);
    o.pch = 1;
    hkp_artifact a;
    char why[512], text[512];
    snprintf(text, sizeof text, src, 1);
    int rc = hkp_build(text, strlen(text), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why);
    ck_assert_msg(rc == 0, "%s\n%s", why, a.log ? a.log : "");
    ck_assert_int_eq(a.meta.nentries, 1);
    /* The heap warning is handled, not passed on. */
    ck_assert_msg(!a.log || !strstr(a.log, "639"), "%s", a.log);
    hkp_artifact_free(&a);
    hkp_pch_stats(&c1, &r1);
    ck_assert_uint_eq(r1 - r0, 1);
    ck_assert_uint_eq(c1 - c0, 0);
    ck_assert_int_eq(nvrtcGetPCHHeapSize(&heap1), NVRTC_SUCCESS);
    ck_assert_uint_gt(heap1, heap0);
    snprintf(text, sizeof text, src, 2);
    rc = hkp_build(text, strlen(text), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why);
    ck_assert_msg(rc == 0, "%s\n%s", why, a.log ? a.log : "");
    hkp_artifact_free(&a);
    hkp_pch_stats(&c2, &r2);
    ck_assert_uint_eq(c2 - c1, 1);
    ck_assert_uint_eq(r2 - r1, 0);
}
END_TEST

/* ---- what the cache may trust ------------------------------------------- */

/* Builds the CUDA C file path with the given -I options into a. */
static void build_with(const char *path, hkp_cache *c, const char *const *opts, int nopts,
                       hkp_artifact *a) {
    size_t n;
    char *src = read_whole(path, &n);
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    o.source_name = path;
    o.nvrtc_options = opts;
    o.nnvrtc_options = nopts;
    char why[512];
    int rc = hkp_build(src, n, HK_FORMAT_CUDA_C, &o, a, why, sizeof why);
    ck_assert_msg(rc == 0, "build of %s failed: %s %s", path, why, a->log ? a->log : "");
    free(src);
}

static int same_image(const hkp_artifact *a, const void *img, size_t n) {
    return a->size == n && !memcmp(a->image, img, n);
}

/* A header of the same name that appears earlier in the search (the
 * including file's directory for "...", an earlier -I directory for both
 * forms) is what NVRTC reads from then on: a miss, in this handle and in a
 * new one (a restart). */
START_TEST(cache_sees_a_header_appear_earlier_in_the_search) {
    char *dir = hkt_tmpdir();
    char cdir[512], inc1[512], inc2[512], src[512], p[600], i1[520], i2[520];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    snprintf(inc1, sizeof inc1, "%s/inc1", dir);
    snprintf(inc2, sizeof inc2, "%s/inc2", dir);
    ck_assert_int_eq(mkdir(inc1, 0700), 0);
    ck_assert_int_eq(mkdir(inc2, 0700), 0);
    snprintf(i1, sizeof i1, "-I%s", inc1);
    snprintf(i2, sizeof i2, "-I%s", inc2);
    const char *opts[] = {i1, i2};
    snprintf(p, sizeof p, "%s/scale.cuh", inc2);
    ck_assert_int_eq(hkt_write_file(p, "#define FACTOR 2.0f\n"), 0);
    snprintf(p, sizeof p, "%s/angle.cuh", inc2);
    ck_assert_int_eq(hkt_write_file(p, "#define ANGLE 0.5f\n"), 0);
    snprintf(src, sizeof src, "%s/k.cu", dir);
    ck_assert_int_eq(hkt_write_file(src, "#include \"scale.cuh\"\n"
                                         "#include <angle.cuh>\n"
                                         "extern \"C\" __global__ void k(float *x) {\n"
                                         "    x[threadIdx.x] *= FACTOR + ANGLE;\n"
                                         "}\n"),
                     0);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    hkp_artifact a;
    build_with(src, c, opts, 2, &a);
    ck_assert_int_eq(a.cache_hit, 0);
    size_t first_n = a.size;
    void *first = malloc(a.size);
    memcpy(first, a.image, a.size);
    hkp_artifact_free(&a);
    build_with(src, c, opts, 2, &a);
    ck_assert_int_eq(a.cache_hit, 1);
    hkp_artifact_free(&a);

    /* "scale.cuh" appears in the first -I directory, then beside the
     * source; <angle.cuh> in the first -I directory. */
    static const char *const appear[][2] = {{"inc1/scale.cuh", "#define FACTOR 3.0f\n"},
                                            {"scale.cuh", "#define FACTOR 4.0f\n"},
                                            {"inc1/angle.cuh", "#define ANGLE 1.5f\n"}};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, appear[i][0]);
        ck_assert_int_eq(hkt_write_file(p, appear[i][1]), 0);
        build_with(src, c, opts, 2, &a);
        ck_assert_msg(a.cache_hit == 0, "%s appeared: still a hit", appear[i][0]);
        ck_assert(!same_image(&a, first, first_n));
        size_t n = a.size;
        void *img = malloc(n);
        memcpy(img, a.image, n);
        hkp_artifact_free(&a);
        hkp_cache_close(c); /* a restart */
        ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
        build_with(src, c, opts, 2, &a);
        ck_assert_int_eq(a.cache_hit, 1);
        ck_assert(same_image(&a, img, n));
        hkp_artifact_free(&a);
        free(img);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, appear[i][0]);
        ck_assert_int_eq(unlink(p), 0);
    }
    /* The manifest lists the headers of the last build, which are gone: a
     * miss, and the first image again. */
    build_with(src, c, opts, 2, &a);
    ck_assert_int_eq(a.cache_hit, 0);
    ck_assert(same_image(&a, first, first_n));
    hkp_artifact_free(&a);
    build_with(src, c, opts, 2, &a);
    ck_assert_int_eq(a.cache_hit, 1);
    ck_assert(same_image(&a, first, first_n));
    hkp_artifact_free(&a);
    free(first);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

static void entry_file(const char *cdir, const uint8_t key[HKP_KEY_BYTES], char *out, size_t n) {
    int k = snprintf(out, n, "%s/", cdir);
    for (int i = 0; i < HKP_KEY_BYTES; i++)
        k += snprintf(out + k, n - (size_t)k, "%02x", key[i]);
    snprintf(out + k, n - (size_t)k, ".hkc");
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    char *data = read_whole(from, &n);
    FILE *f = fopen(to, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
    free(data);
}

/* An entry serves only the key it was written for, from a file of this
 * user that nobody else can write, reached without following a link. */
START_TEST(cache_entry_is_bound_to_its_key_and_owner) {
    char *dir = hkt_tmpdir();
    char cdir[512], f1[700], f2[700], f3[700], out[600];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    uint8_t k1[HKP_KEY_BYTES] = {1}, k2[HKP_KEY_BYTES] = {2}, k3[HKP_KEY_BYTES] = {3};
    ck_assert_int_eq(hkp_cache_put(c, k1, "attacker's kernel", 18), 0);
    ck_assert_int_eq(hkp_cache_put(c, k2, "victim's kernel", 16), 0);
    ck_assert_int_eq(hkp_cache_put(c, k3, "third", 6), 0);
    hkp_cache_close(c);
    entry_file(cdir, k1, f1, sizeof f1);
    entry_file(cdir, k2, f2, sizeof f2);
    entry_file(cdir, k3, f3, sizeof f3);
    copy_file(f1, f2); /* k1's entry under k2's name */
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    void *got = NULL;
    size_t gn;
    ck_assert_int_eq(hkp_cache_get(c, k2, &got, &gn), HK_ERR_NOT_FOUND);
    ck_assert_int_ne(access(f2, F_OK), 0); /* removed as a bad entry */
    /* An entry others may write is not read. */
    ck_assert_int_eq(chmod(f1, 0666), 0);
    ck_assert_int_eq(hkp_cache_get(c, k1, &got, &gn), HK_ERR_NOT_FOUND);
    /* Nor one reached through a link. */
    snprintf(out, sizeof out, "%s/elsewhere", dir);
    copy_file(f3, out);
    ck_assert_int_eq(unlink(f3), 0);
    ck_assert_int_eq(symlink(out, f3), 0);
    ck_assert_int_eq(hkp_cache_get(c, k3, &got, &gn), HK_ERR_NOT_FOUND);
    ck_assert_int_eq(access(out, F_OK), 0); /* the link's target is left alone */
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* A cache directory others can change is refused; a lock file that is a
 * link is never followed (nothing is created through it). */
START_TEST(cache_directory_others_can_change_is_refused) {
    char *dir = hkt_tmpdir();
    char cdir[512], lock[600], target[600];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    ck_assert_int_eq(mkdir(cdir, 0700), 0);
    ck_assert_int_eq(chmod(cdir, 0777), 0);
    hkp_cache *c = NULL;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), HK_ERR_IO);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(chmod(cdir, 0700), 0);
    snprintf(lock, sizeof lock, "%s/lock", cdir);
    snprintf(target, sizeof target, "%s/created", dir);
    ck_assert_int_eq(symlink(target, lock), 0);
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    uint8_t k[HKP_KEY_BYTES] = {9};
    (void)hkp_cache_put(c, k, "x", 1);
    ck_assert_int_ne(access(target, F_OK), 0);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* Another process holds the cache's lock and never lets go: the build
 * completes uncached after a bounded wait, and says so. */
START_TEST(cache_lock_held_by_a_stopped_process) {
    char *dir = hkt_tmpdir();
    char cdir[512], lock[600];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    ck_assert_int_eq(mkdir(cdir, 0700), 0);
    snprintf(lock, sizeof lock, "%s/lock", cdir);
    pid_t holder = hkt_hold_lock_stopped(lock);
    ck_assert_int_gt(holder, 0);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    const char *src = "extern \"C\" __global__ void k(int *p) { *p = 7; }\n";
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    hkp_artifact a;
    char why[256];
    ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.cache_hit, 0);
    ck_assert_int_eq(a.meta.nentries, 1);
    ck_assert_msg(strstr(a.cache_note, "lock") && strstr(a.cache_note, "not cached"), "note: %s",
                  a.cache_note);
    hkp_artifact_free(&a);
    int entries;
    dir_bytes(cdir, &entries, NULL);
    ck_assert_int_eq(entries, 0);
    kill(holder, SIGKILL);
    ck_assert_int_eq(waitpid(holder, NULL, 0), holder);
    /* The lock is free again: cached as usual. */
    ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_str_eq(a.cache_note, "");
    hkp_artifact_free(&a);
    dir_bytes(cdir, &entries, NULL);
    ck_assert_int_eq(entries, 2);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* The development profile (fast_compile) is a build of its own: its image
 * differs from the default build's, the cache keeps the two apart (each
 * entry served for its own profile only), PTX goes through nvJitLink with
 * it too, and builds of both profiles alternating over their PCHs create
 * none once each profile has made its own. */
START_TEST(dev_profile_is_its_own_build) {
    static const char fmt[] =
        "extern \"C\" __global__ void k0(float *x, int n) { int i = blockIdx.x * blockDim.x + "
        "threadIdx.x; if (i < n) x[i] = x[i] * 2.0f + %d.0f; }\n";
    char *cdir = hkt_tmpdir();
    char src[512], why[512];
    hkp_cache *c;
    hkp_artifact rel, dev, a, p;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    o.source_name = "dev.cu";
    snprintf(src, sizeof src, fmt, 1);
    ck_assert_msg(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &rel, why, sizeof why) == 0,
                  "%s", why);
    ck_assert_int_eq(rel.cache_hit, 0);
    o.fast_compile = 1;
    ck_assert_msg(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &dev, why, sizeof why) == 0,
                  "%s\n%s", why, dev.log ? dev.log : "");
    ck_assert_int_eq(dev.cache_hit, 0); /* not the default build's entry */
    ck_assert_int_eq(dev.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(dev.meta.nentries, 1);
    ck_assert(dev.size != rel.size || memcmp(dev.image, rel.image, rel.size) != 0);
    ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.cache_hit, 1);
    ck_assert(a.size == dev.size && memcmp(a.image, dev.image, dev.size) == 0);
    hkp_artifact_free(&a);
    o.fast_compile = 0;
    ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.cache_hit, 1);
    ck_assert(a.size == rel.size && memcmp(a.image, rel.image, rel.size) == 0);
    hkp_artifact_free(&a);
    hkp_artifact_free(&dev);
    hkp_artifact_free(&rel);

    /* PTX to a cubin through nvJitLink, at its fast-compile level. */
    o.cache = NULL;
    o.ptx_to_cubin = 0;
    ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &p, why, sizeof why), 0);
    ck_assert_int_eq(p.format, HK_FORMAT_PTX);
    o.ptx_to_cubin = 1;
    o.fast_compile = 1;
    ck_assert_msg(hkp_build(p.image, p.size, HK_FORMAT_PTX, &o, &a, why, sizeof why) == 0, "%s\n%s",
                  why, a.log ? a.log : "");
    ck_assert_int_eq(a.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(a.meta.nentries, 1);
    hkp_artifact_free(&a);
    hkp_artifact_free(&p);

    /* Builds of both profiles alternating over their PCHs create none once
     * each has made its own. */
    uint64_t c0, c1;
    o.pch = 1;
    for (int v = 100; v <= 101; v++) {
        o.fast_compile = v & 1;
        snprintf(src, sizeof src, fmt, v);
        ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
        hkp_artifact_free(&a);
    }
    hkp_pch_stats(&c0, NULL);
    for (int v = 102; v <= 107; v++) {
        o.fast_compile = v & 1;
        snprintf(src, sizeof src, fmt, v);
        ck_assert_msg(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why) == 0,
                      "%s", why);
        ck_assert_msg(!a.log || !strstr(a.log, "do not match"), "%s", a.log);
        hkp_artifact_free(&a);
    }
    hkp_pch_stats(&c1, NULL);
    ck_assert_uint_eq(c1, c0);
    hkp_cache_close(c);
    hkt_rmtree(cdir);
    free(cdir);
}
END_TEST

/* Builds with fast_compile and the PCH; returns the PCHs they created. */
static uint64_t fast_build_pchs(const char *src, int expect_rc, hkp_artifact *a) {
    hkp_build_opts o = base_opts(90);
    char why[512];
    uint64_t c0, c1;
    o.pch = 1;
    o.fast_compile = 1;
    hkp_pch_stats(&c0, NULL);
    int rc = hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, a, why, sizeof why);
    ck_assert_msg(rc == expect_rc, "%s: %s\n%s", src, why, a->log ? a->log : "");
    hkp_pch_stats(&c1, NULL);
    return c1 - c0;
}

/* The development profile's -minimal goes only where the source cannot
 * need what it leaves out: the one-line kernel gets it (its implicit prefix
 * is a PCH of its own), a texture kernel does not (the default prefix's
 * PCH serves it), a source that hides a runtime type from the scan is
 * compiled again without it and builds, and a real error is reported. */
START_TEST(dev_profile_minimal_only_where_safe) {
    static const char tiny[] =
        "extern \"C\" __global__ void k0(float *x, int n) { int i = threadIdx.x; if (i < n) "
        "x[i] = x[i] * 2.0f + 3.0f; }\n";
    static const char tex[] = "extern \"C\" __global__ void k(cudaTextureObject_t t, float *x) {\n"
                              "    x[0] = tex1Dfetch<float>(t, 0);\n}\n";
    static const char hidden[] =
        "typedef int word; /* ends the PCH's prefix */\n"
        "#define CAT(a, b) a##b\n"
        "extern \"C\" __global__ void k(int *x) {\n"
        "    CAT(cu, daError_t) e = CAT(cu, daSuccess); x[0] = (int)e;\n}\n";
    static const char broken[] =
        "extern \"C\" __global__ void k(int *x) { x[0] = nope_undeclared; }\n";
    hkp_artifact a;
    hkp_build_opts o = base_opts(90);
    char why[512];

    o.pch = 1; /* the default prefix's PCH first */
    ck_assert_int_eq(hkp_build(tiny, strlen(tiny), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    hkp_artifact_free(&a);
    ck_assert_uint_eq(fast_build_pchs(tiny, 0, &a), 1);
    ck_assert_int_eq(a.meta.nentries, 1);
    hkp_artifact_free(&a);
    ck_assert_uint_eq(fast_build_pchs(tex, 0, &a), 0);
    ck_assert_int_eq(a.meta.nentries, 1);
    hkp_artifact_free(&a);
    ck_assert_uint_eq(fast_build_pchs(hidden, 0, &a), 0);
    ck_assert_int_eq(a.meta.nentries, 1);
    hkp_artifact_free(&a);
    fast_build_pchs(broken, HK_ERR_COMPILE, &a);
    ck_assert_ptr_nonnull(a.log);
    ck_assert_ptr_nonnull(strstr(a.log, "nope_undeclared"));
    hkp_artifact_free(&a);
}
END_TEST

/* ---- the canary's trap guard ---------------------------------------------- */

/* hkp_guard_ptx on text: its return, sites, and the copy (malloc'd). */
static int guard(const char *ptx, char **out, int *sites) {
    size_t n = 0;
    char why[200] = "";
    int rc = hkp_guard_ptx(ptx, strlen(ptx), out, &n, sites, why, sizeof why);
    if (*out) {
        ck_assert_uint_eq(n, strlen(*out) + 1);
        ck_assert_int_eq((*out)[n - 1], '\0');
    }
    return rc;
}

#define PTX_HEAD ".version 8.0\n.target sm_90\n.address_size 64\n"

/* Exactly the instructions are rewritten, each with its predicate, after a
 * ';', a brace, a label or a line directive (.loc): not a word in a comment
 * or a string, not a label or a register named like one, not a call of
 * another function. */
START_TEST(guard_rewrites_exactly_the_sites) {
    const char *src = PTX_HEAD "// trap; in a comment\n/* brkpt; */\n"
                               ".extern .func __assertfail(.param .b64 a);\n"
                               ".extern .func other(.param .b64 a);\n"
                               ".visible .entry k(.param .u64 p)\n{\n"
                               "\t.reg .pred %p<3>; .reg .b64 %rd<3>;\n"
                               "\tsetp.eq.u64 %p1, %rd1, 0;\n"
                               "\t@%p1 trap;\n"
                               "\t@!%p2 brkpt;\n"
                               "trap:\n"
                               "\tbra trap;\n"
                               "\t{ .param .b64 param0; st.param.b64 [param0+0], %rd1;\n"
                               "\tcall.uni other, (param0);\n"
                               "\tcall.uni\n\t__assertfail,\n\t(\n\tparam0\n\t);\n\t}\n"
                               "\t$L1: trap;\n"
                               "\t.loc 1 9 2\n"
                               "\ttrap;\n"
                               "\tret;\n}\n";
    char *out = NULL;
    int sites = -1;
    ck_assert_int_eq(guard(src, &out, &sites), 0);
    ck_assert_int_eq(sites, 5);
    ck_assert_ptr_nonnull(
        strstr(out, ".loc 1 9 2\n\tst.global.u32 [__hotkern_trap], 21;\n\texit;"));
    ck_assert_ptr_nonnull(strstr(out, ".address_size 64\n.visible .global .align 4 .u32 "
                                      "__hotkern_trap;\n"));
    ck_assert_ptr_nonnull(strstr(out, "\t@%p1 st.global.u32 [__hotkern_trap], 5;\n\t@%p1 exit;"));
    ck_assert_ptr_nonnull(
        strstr(out, "\t@!%p2 st.global.u32 [__hotkern_trap], 10;\n\t@!%p2 exit;"));
    ck_assert_ptr_nonnull(strstr(out, "st.global.u32 [__hotkern_trap], 15;\n\texit;\n\t}"));
    ck_assert_ptr_nonnull(strstr(out, "$L1: st.global.u32 [__hotkern_trap], 17;\n\texit;"));
    /* What is not a site is left as it was. */
    ck_assert_ptr_nonnull(strstr(out, "// trap; in a comment\n/* brkpt; */"));
    ck_assert_ptr_nonnull(strstr(out, "trap:\n\tbra trap;"));
    ck_assert_ptr_nonnull(strstr(out, "call.uni other, (param0);"));
    ck_assert_ptr_null(strstr(out, "__assertfail,"));
    free(out);
}
END_TEST

/* Nothing to guard, and what cannot be guarded soundly: no copy. */
START_TEST(guard_refuses_what_it_cannot_do_soundly) {
    char *out = (char *)1;
    int sites = -1;
    ck_assert_int_eq(guard(PTX_HEAD ".visible .entry k()\n{\n ret;\n}\n", &out, &sites), 0);
    ck_assert_ptr_null(out);
    ck_assert_int_eq(sites, 0);
    ck_assert_int_eq(guard(".visible .entry k()\n{\n trap;\n}\n", &out, &sites), HK_ERR_FORMAT);
    ck_assert_int_eq(guard(PTX_HEAD ".global .u32 __hotkern_trap;\n.visible .entry k()\n{\n "
                                    "trap;\n}\n",
                           &out, &sites),
                     HK_ERR_FORMAT);
    ck_assert_int_eq(guard(PTX_HEAD ".visible .entry k()\n{\n trap;\n}\n/* open", &out, &sites),
                     HK_ERR_FORMAT);
    ck_assert_ptr_null(out);
    char with_nul[] = PTX_HEAD ".visible .entry k()\n{\n trap;\0 trap;\n}\n";
    size_t n = 0;
    ck_assert_int_eq(hkp_guard_ptx(with_nul, sizeof with_nul, &out, &n, &sites, NULL, 0),
                     HK_ERR_FORMAT);
}
END_TEST

/* assert() needs no header under NVRTC (its builtins declare it); the
 * PTX for the PTX path comes from NVRTC too. */
static const char *const TRAPS_CU =
    "extern \"C\" __global__ void k(int *o, int n) {\n"
    "  int i = threadIdx.x;\n"
    "  if (o[i] == 7) __trap();\n"
    "  assert(n > 0);\n"
    "  o[i] = n;\n}\n"
    "extern \"C\" __global__ void calm(int *o) { o[threadIdx.x] = 1; }\n";

/* The build makes the guarded copy when asked, on every path that has PTX:
 * NVRTC straight to a cubin (from the program's PTX), NVRTC through PTX,
 * PTX input, PTX left to the driver; the compile cache keeps it; and the
 * copy is a loadable image with the same kernels plus __hotkern_trap. */
START_TEST(build_makes_the_guard_on_every_path) {
    char *dir = hkt_tmpdir();
    char cdir[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    hkp_artifact a;
    char why[512];
    ck_assert_int_eq(
        hkp_build(TRAPS_CU, strlen(TRAPS_CU), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_ptr_null(a.guard); /* not asked for */
    hkp_artifact_free(&a);
    o.trap_guard = 1;
    for (int hit = 0; hit < 2; hit++) {
        ck_assert_msg(
            hkp_build(TRAPS_CU, strlen(TRAPS_CU), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why) == 0,
            "%s", why);
        ck_assert_int_eq(a.cache_hit, hit); /* its own entry, then served whole */
        ck_assert_int_eq(a.guard_sites, 2);
        ck_assert_ptr_nonnull(a.guard);
        hkp_meta gm;
        ck_assert_int_eq(
            hkp_meta_read(a.guard, a.guard_size, HK_FORMAT_CUBIN, &gm, why, sizeof why), 0);
        ck_assert_int_eq(gm.nentries, a.meta.nentries);
        ck_assert_ptr_nonnull(find_entry(&gm, "k"));
        ck_assert_ptr_nonnull(find_global(&gm, "__hotkern_trap"));
        ck_assert_ptr_null(find_global(&a.meta, "__hotkern_trap"));
        hkp_meta_free(&gm);
        hkp_artifact_free(&a);
    }
    /* A kernel with nothing to guard has no copy. */
    const char *calm = "extern \"C\" __global__ void c(int *o) { *o = 2; }\n";
    ck_assert_int_eq(hkp_build(calm, strlen(calm), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_ptr_null(a.guard);
    hkp_artifact_free(&a);
    o.cache = NULL;
    o.nvrtc_via_ptx = 1;
    ck_assert_int_eq(
        hkp_build(TRAPS_CU, strlen(TRAPS_CU), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(a.guard_sites, 2);
    hkp_artifact_free(&a);
    size_t n;
    char *ptx = nvrtc_image(TRAPS_CU, "compute_90", &n);
    ck_assert_int_eq(hkp_build(ptx, n, HK_FORMAT_PTX, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.guard_sites, 2);
    ck_assert_uint_eq(((const unsigned char *)a.guard)[0], 0x7f); /* an ELF cubin */
    hkp_artifact_free(&a);
    o.ptx_to_cubin = 0; /* left to the driver: the copy is PTX too */
    ck_assert_int_eq(hkp_build(ptx, n, HK_FORMAT_PTX, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.format, HK_FORMAT_PTX);
    ck_assert_ptr_nonnull(strstr(a.guard, "st.global.u32 [__hotkern_trap], "));
    ck_assert_ptr_null(strstr(a.image, "__hotkern_trap"));
    hkp_artifact_free(&a);
    free(ptx);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* Registers of the (only) kernel of a cubin: EIATTR_REGCOUNT (0x2f) in its
 * .nv.info section, {u32 symbol, u32 registers}; -1 when absent. */
static int cubin_regs(const void *image) {
    const unsigned char *p = image;
    const Elf64_Ehdr *e = image;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(p + e->e_shoff);
    const char *names = (const char *)p + sh[e->e_shstrndx].sh_offset;
    for (int i = 0; i < e->e_shnum; i++) {
        if (strncmp(names + sh[i].sh_name, ".nv.info", 8))
            continue;
        const unsigned char *q = p + sh[i].sh_offset;
        for (size_t j = 0; j + 4 <= sh[i].sh_size;) {
            unsigned fmt = q[j], attr = q[j + 1], h = (unsigned)(q[j + 2] | q[j + 3] << 8);
            if (fmt == 4 && attr == 0x2f && h == 8)
                return (int)(q[j + 8] | q[j + 9] << 8);
            j += fmt == 4 ? 4 + h : 4;
        }
    }
    return -1;
}

/* The copy is linked as the image is: the caller's ptxas options reach
 * both (a register limit here), so the canary runs what commits but for its
 * sites; an option nvJitLink cannot be given leaves the version unguarded,
 * saying why; and PTX that does not build is refused with its own log. */
START_TEST(guard_is_linked_as_the_image) {
    const char *src = "extern \"C\" __global__ void heavy(float *x, int n) {\n"
                      "  float a[48];\n"
                      "#pragma unroll\n"
                      "  for (int k = 0; k < 48; k++) a[k] = x[threadIdx.x + k * 32];\n"
                      "  float s = 0;\n"
                      "#pragma unroll\n"
                      "  for (int k = 0; k < 48; k++) s += a[k] * a[(k * 7) % 48] + a[(k * 5) % "
                      "48] * s;\n"
                      "  assert(n > 0);\n"
                      "  x[threadIdx.x] = s;\n}\n";
    const char *limit[] = {"--maxrregcount=32"};
    hkp_build_opts o = base_opts(90);
    o.trap_guard = 1;
    o.nvrtc_options = limit;
    o.nnvrtc_options = 1;
    hkp_artifact a;
    char why[512];
    ck_assert_msg(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why) == 0, "%s",
                  why);
    ck_assert_ptr_nonnull(a.guard);
    ck_assert_int_eq(cubin_regs(a.image), 32);
    ck_assert_int_eq(cubin_regs(a.guard), cubin_regs(a.image));
    hkp_artifact_free(&a);
    o.nnvrtc_options = 0; /* unlimited, the same on both sides */
    ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_int_gt(cubin_regs(a.image), 32);
    ck_assert_int_eq(cubin_regs(a.guard), cubin_regs(a.image));
    hkp_artifact_free(&a);

    const char *dopt[] = {"-dopt=on"};
    o.nvrtc_options = dopt;
    o.nnvrtc_options = 1;
    ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_ptr_null(a.guard);
    ck_assert_ptr_nonnull(strstr(a.log, "trap guard was not built (NVRTC option '-dopt=on' has no "
                                        "nvJitLink equivalent)"));
    hkp_artifact_free(&a);

    const char *bad = PTX_HEAD ".visible .entry k()\n{\n trap;\n bogus.u32 %r1;\n ret;\n}\n";
    o.nnvrtc_options = 0;
    ck_assert_int_eq(hkp_build(bad, strlen(bad), HK_FORMAT_PTX, &o, &a, why, sizeof why),
                     HK_ERR_COMPILE);
    ck_assert_msg(strstr(why, "nvJitLink: ") && strstr(why, "line 7") && !strstr(why, "guard"),
                  "%s", why);
    hkp_artifact_free(&a);
}
END_TEST

/* What the canary must not take on trust: ptxas allocates the trap guard's
 * copy's registers anew, and for a kernel with many values behind asserts
 * (tests/canary_kernels.h's heavy) the image takes more than 64 registers a
 * thread, so its blocks cannot hold 1024 threads, while the copy's can. The
 * canary therefore launches the image too (canary/canary.h); with
 * __launch_bounds__(1024) both fit. tests/gpu_canary.c relies on these
 * counts. */
START_TEST(guard_copy_may_take_fewer_registers_than_its_image) {
    hkp_build_opts o = base_opts(90);
    o.opt_level = 4; /* the runtime's default */
    o.trap_guard = 1;
    hkp_artifact a;
    char why[512];
    ck_assert_msg(hkp_build(HEAVY, strlen(HEAVY), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why) == 0,
                  "%s", why);
    ck_assert_ptr_nonnull(a.guard);
    ck_assert_int_eq(a.guard_sites, 46);
    int image = cubin_regs(a.image), copy = cubin_regs(a.guard);
    printf("heavy: image %d registers a thread, trap guard's copy %d\n", image, copy);
    ck_assert_int_gt(image, 64);
    ck_assert_int_le(copy, 64);
    hkp_artifact_free(&a);
    ck_assert_int_eq(
        hkp_build(HEAVY_FITS, strlen(HEAVY_FITS), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_int_le(cubin_regs(a.image), 64);
    ck_assert_int_le(cubin_regs(a.guard), 64);
    hkp_artifact_free(&a);
}
END_TEST

static Suite *ptx_suite(void) {
    Suite *s = suite_create("ptx");
    TCase *tc = tcase_create("detect");
    tcase_add_test(tc, detect_each_format);
    tcase_add_test(tc, detect_refuses_bad_input);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);

    tc = tcase_create("meta");
    tcase_add_test(tc, meta_cubin_and_ptx_agree);
    tcase_add_test(tc, meta_hand_written_ptx);
    tcase_add_test(tc, meta_cubin_archs);
    tcase_add_test(tc, meta_fatbin_archs);
    tcase_add_test(tc, meta_survives_corruption);
    tcase_add_test(tc, arch_rules);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);

    tc = tcase_create("build");
    tcase_add_test(tc, build_cuda_c_with_header);
    tcase_add_test(tc, build_name_expressions);
    tcase_add_test(tc, build_ptx_with_nvjitlink);
    tcase_add_test(tc, build_refusals);
    tcase_add_test(tc, build_paths_agree_and_timings);
    tcase_add_test(tc, dev_profile_is_its_own_build);
    tcase_add_test(tc, dev_profile_minimal_only_where_safe);
    tcase_add_test(tc, guard_rewrites_exactly_the_sites);
    tcase_add_test(tc, guard_refuses_what_it_cannot_do_soundly);
    tcase_add_test(tc, build_makes_the_guard_on_every_path);
    tcase_add_test(tc, guard_is_linked_as_the_image);
    tcase_add_test(tc, guard_copy_may_take_fewer_registers_than_its_image);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);

    tc = tcase_create("cache");
    tcase_add_test(tc, cache_tracks_headers);
    tcase_add_test(tc, cache_ptx_builds);
    tcase_add_test(tc, cache_truncated_entry_is_replaced);
    tcase_add_test(tc, cache_memory_tier);
    tcase_add_test(tc, cache_two_processes);
    tcase_add_test(tc, cache_eviction_bound);
    tcase_add_test(tc, cache_default_dir);
    tcase_add_test(tc, cache_key_follows_in_memory_headers);
    tcase_add_test(tc, cache_sees_a_header_appear_earlier_in_the_search);
    tcase_add_test(tc, cache_entry_is_bound_to_its_key_and_owner);
    tcase_add_test(tc, cache_directory_others_can_change_is_refused);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);

    /* A regression here hangs on the lock: the timeout is what fails it. */
    tc = tcase_create("cache lock");
    tcase_add_test(tc, cache_lock_held_by_a_stopped_process);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);

    tc = tcase_create("headers");
    tcase_add_test(tc, toolkit_is_found);
    tcase_add_test(tc, build_cub_without_include_dirs);
    tcase_add_test(tc, build_toolkit_headers_without_include_dirs);
    tcase_add_test(tc, build_in_memory_headers);
    tcase_add_test(tc, pch_sees_header_edits);
    tcase_add_test(tc, pch_heap_exhausted_still_builds);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(ptx_suite());
}

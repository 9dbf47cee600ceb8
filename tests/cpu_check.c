/*
 * hk_check and hk_checker, through the public header only: a source built
 * and validated for a named architecture with no driver and no runtime
 * (this machine's libcuda is a stub on which hk_runtime_create fails), the
 * kernels, layouts, globals and architectures a result lists, the refusals
 * (compile errors with the compiler's log, an architecture the image has
 * no code for, options a caller got wrong), and a checker used for many
 * sources giving what fresh checks give, header edits between checks
 * included.
 *
 * The images are made at test time with NVRTC directly (and nvcc for a
 * fatbin), independently of the code under test.
 */
#include <nvrtc.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hotkern/hotkern.h"
#include "tests/harness.h"

#define NVCC "/usr/local/cuda/bin/nvcc"

static const char *const KERNELS_CU =
    "struct Pair { double d; char c[20]; };\n"
    "__device__ int counter;\n"
    "__constant__ float coeffs[16];\n"
    "extern \"C\" __global__ void scale(float *x, float a, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] *= a * coeffs[0];\n"
    "    atomicAdd(&counter, 1);\n"
    "}\n"
    "extern \"C\" __global__ void mixed(Pair p, char c, double *o, short q) {\n"
    "    *o = p.d + c + q + p.c[3];\n"
    "}\n"
    "extern \"C\" __global__ void noargs() {}\n";

static const char *const BAD_CU = "extern \"C\" __global__ void k(int *x) {\n"
                                  "    x[0] = ;\n"
                                  "}\n";

/* A warning, and a kernel: the build succeeds with a log. */
static const char *const WARN_CU = "extern \"C\" __global__ void w(int *x) {\n"
                                   "    int unused = 3;\n"
                                   "    x[0] = 1;\n"
                                   "}\n";

/* ---- helpers -------------------------------------------------------------- */

/* CUDA C compiled with NVRTC directly: "sm_XY" gives a cubin, "compute_XY"
 * PTX (NUL included in *size). */
static void *nvrtc_image(const char *src, const char *arch, size_t *size) {
    nvrtcProgram p;
    char opt[64];
    snprintf(opt, sizeof opt, "--gpu-architecture=%s", arch);
    const char *opts[] = {opt};
    ck_assert_int_eq(nvrtcCreateProgram(&p, src, "t.cu", 0, NULL, NULL), NVRTC_SUCCESS);
    ck_assert_int_eq(nvrtcCompileProgram(p, 1, opts), NVRTC_SUCCESS);
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

static hk_check_options opts_for(int arch) {
    hk_check_options o;
    hk_check_options_init(&o);
    o.arch = arch;
    return o;
}

/* Kernel `name` of r, with its parameter count; -1 when absent. */
static int find_kernel(const hk_check_result *r, const char *name, const size_t **off,
                       const size_t **sz) {
    for (int i = 0; i < hk_check_result_kernel_count(r); i++) {
        const char *n = NULL;
        int np = hk_check_result_kernel(r, i, &n, off, sz);
        ck_assert_int_ge(np, 0);
        if (!strcmp(n, name))
            return np;
    }
    return -1;
}

/* What a result lists, as one comparable text: format, image format,
 * kernels with layouts, globals, architectures. */
static void describe(const hk_check_result *r, char *buf, size_t cap) {
    size_t used = 0;
    hk_format ifmt;
    size_t isz;
    ck_assert_ptr_nonnull(hk_check_result_image(r, &isz, &ifmt));
    used += (size_t)snprintf(buf + used, cap - used, "%s->%s;",
                             hk_format_name(hk_check_result_format(r)), hk_format_name(ifmt));
    for (int i = 0; i < hk_check_result_kernel_count(r) && used < cap; i++) {
        const char *n;
        const size_t *off, *sz;
        int np = hk_check_result_kernel(r, i, &n, &off, &sz);
        used += (size_t)snprintf(buf + used, cap - used, "%s(", n);
        for (int j = 0; j < np && used < cap; j++)
            used += (size_t)snprintf(buf + used, cap - used, "%zu@%zu,", sz[j], off[j]);
        used += (size_t)snprintf(buf + used, cap - used, ")");
    }
    for (int i = 0; i < hk_check_result_global_count(r) && used < cap; i++) {
        const char *n;
        uint64_t size;
        int is_const;
        ck_assert_int_eq(hk_check_result_global(r, i, &n, &size, &is_const), 0);
        used += (size_t)snprintf(buf + used, cap - used, " %s%s:%llu", is_const ? "const " : "", n,
                                 (unsigned long long)size);
    }
    for (int i = 0; i < hk_check_result_arch_count(r) && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, " [%s]", hk_check_result_arch(r, i));
}

/* ---- what a check lists ----------------------------------------------------- */

START_TEST(cuda_c_lists_kernels_layouts_and_globals) {
    hk_check_options o = opts_for(90);
    hk_check_result *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    int rc = hk_check(&o, KERNELS_CU, strlen(KERNELS_CU), &r, &rep);
    ck_assert_msg(rc == 0, "%s\n%s", rep.message, rep.log ? rep.log : "");
    ck_assert_int_eq(rep.error, 0);
    ck_assert_ptr_null(rep.log);
    ck_assert(rep.build_ms > 0 && rep.total_ms >= rep.build_ms);
    ck_assert_int_eq(hk_check_result_format(r), HK_FORMAT_CUDA_C);
    size_t isz = 0;
    hk_format ifmt = HK_FORMAT_AUTO;
    const unsigned char *img = hk_check_result_image(r, &isz, &ifmt);
    ck_assert_int_eq(ifmt, HK_FORMAT_CUBIN);
    ck_assert(isz > 64 && !memcmp(img,
                                  "\x7f"
                                  "ELF",
                                  4));
    ck_assert_int_eq(hk_check_result_kernel_count(r), 3);

    const size_t *off, *sz;
    ck_assert_int_eq(find_kernel(r, "scale", &off, &sz), 3);
    ck_assert(off[0] == 0 && sz[0] == 8 && off[1] == 8 && sz[1] == 4 && off[2] == 12 && sz[2] == 4);
    /* Pair is 32 bytes aligned to 8; then char, then double* at 40, short. */
    ck_assert_int_eq(find_kernel(r, "mixed", &off, &sz), 4);
    ck_assert(off[0] == 0 && sz[0] == 32 && off[1] == 32 && sz[1] == 1);
    ck_assert(off[2] == 40 && sz[2] == 8 && off[3] == 48 && sz[3] == 2);
    ck_assert_int_eq(find_kernel(r, "noargs", &off, &sz), 0);
    ck_assert_int_eq(find_kernel(r, "absent", NULL, NULL), -1);
    ck_assert_int_eq(hk_check_result_kernel(r, 3, NULL, NULL, NULL), HK_ERR_NOT_FOUND);
    ck_assert_int_eq(hk_check_result_kernel(r, -1, NULL, NULL, NULL), HK_ERR_NOT_FOUND);

    int seen = 0;
    for (int i = 0; i < hk_check_result_global_count(r); i++) {
        const char *n;
        uint64_t size;
        int is_const;
        ck_assert_int_eq(hk_check_result_global(r, i, &n, &size, &is_const), 0);
        if (!strcmp(n, "counter"))
            seen |= 1, ck_assert(size == 4 && !is_const);
        if (!strcmp(n, "coeffs"))
            seen |= 2, ck_assert(size == 64 && is_const);
    }
    ck_assert_int_eq(seen, 3);
    ck_assert_int_eq(hk_check_result_global(r, 99, NULL, NULL, NULL), HK_ERR_NOT_FOUND);
    ck_assert_int_eq(hk_check_result_arch_count(r), 1);
    ck_assert_str_eq(hk_check_result_arch(r, 0), "sm_90");
    ck_assert_ptr_null(hk_check_result_arch(r, 1));
    ck_assert_ptr_null(hk_check_result_log(r));
    hk_check_result_free(r);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(modes_archs_and_warnings) {
    /* Driver-JIT mode: CUDA C stops at PTX, as such a runtime loads it. */
    hk_check_options o = opts_for(90);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    hk_check_result *r = NULL;
    ck_assert_int_eq(hk_check(&o, KERNELS_CU, strlen(KERNELS_CU), &r, NULL), 0);
    size_t isz;
    hk_format ifmt;
    const char *ptx = hk_check_result_image(r, &isz, &ifmt);
    ck_assert_int_eq(ifmt, HK_FORMAT_PTX);
    ck_assert(isz > 0 && ptx[isz - 1] == '\0' && strstr(ptx, ".entry scale"));
    ck_assert_str_eq(hk_check_result_arch(r, 0), "compute_90");
    ck_assert_int_eq(hk_check_result_kernel_count(r), 3);
    hk_check_result_free(r);

    /* The architecture-specific variant. */
    o = opts_for(90);
    o.arch_specific = 1;
    ck_assert_int_eq(hk_check(&o, KERNELS_CU, strlen(KERNELS_CU), &r, NULL), 0);
    ck_assert_str_eq(hk_check_result_arch(r, 0), "sm_90a");
    hk_check_result_free(r);

    /* A warning: the build succeeds and the log says it. */
    o = opts_for(80);
    o.source_name = "warn.cu";
    ck_assert_int_eq(hk_check(&o, WARN_CU, strlen(WARN_CU), &r, NULL), 0);
    const char *log = hk_check_result_log(r);
    ck_assert_msg(log && strstr(log, "warn.cu(2)") && strstr(log, "unused"), "%s", log);
    ck_assert_str_eq(hk_check_result_arch(r, 0), "sm_80");
    hk_check_result_free(r);

    /* Templates instantiated by name expression get their mangled names. */
    const char *tmpl = "template <typename T> __global__ void fill(T *x) { x[0] = T(); }\n";
    const char *exprs[] = {"fill<int>", "fill<double>"};
    o = opts_for(90);
    o.name_expressions = exprs;
    o.nname_expressions = 2;
    ck_assert_int_eq(hk_check(&o, tmpl, strlen(tmpl), &r, NULL), 0);
    ck_assert_int_eq(hk_check_result_kernel_count(r), 2);
    ck_assert_int_eq(find_kernel(r, "_Z4fillIiEvPT_", NULL, NULL), 1);
    ck_assert_int_eq(find_kernel(r, "_Z4fillIdEvPT_", NULL, NULL), 1);
    hk_check_result_free(r);
}
END_TEST

START_TEST(ptx_cubin_and_fatbin_inputs) {
    size_t n;
    char *ptx = nvrtc_image(KERNELS_CU, "compute_80", &n);
    hk_check_options o = opts_for(90);
    hk_check_result *r = NULL;
    /* PTX goes through nvJitLink for the target, forward of its own .target. */
    ck_assert_int_eq(hk_check(&o, ptx, n - 1, &r, NULL), 0);
    ck_assert_int_eq(hk_check_result_format(r), HK_FORMAT_PTX);
    hk_format ifmt;
    (void)hk_check_result_image(r, NULL, &ifmt);
    ck_assert_int_eq(ifmt, HK_FORMAT_CUBIN);
    ck_assert_str_eq(hk_check_result_arch(r, 0), "sm_90");
    ck_assert_int_eq(find_kernel(r, "scale", NULL, NULL), 3);
    hk_check_result_free(r);
    free(ptx);

    void *cubin = nvrtc_image(KERNELS_CU, "sm_80", &n);
    o = opts_for(86); /* sm_80 code runs on 8.6 */
    ck_assert_int_eq(hk_check(&o, cubin, n, &r, NULL), 0);
    ck_assert_int_eq(hk_check_result_format(r), HK_FORMAT_CUBIN);
    size_t isz;
    ck_assert(!memcmp(hk_check_result_image(r, &isz, NULL), cubin, n) && isz == n);
    ck_assert_str_eq(hk_check_result_arch(r, 0), "sm_80");
    ck_assert_int_eq(find_kernel(r, "mixed", NULL, NULL), 4);
    hk_check_result_free(r);
    free(cubin);

    if (access(NVCC, X_OK) != 0)
        return;
    char *dir = hkt_tmpdir(), cmd[2048], cu[512], fb[512];
    snprintf(cu, sizeof cu, "%s/k.cu", dir);
    snprintf(fb, sizeof fb, "%s/k.fatbin", dir);
    ck_assert_int_eq(hkt_write_file(cu, KERNELS_CU), 0);
    snprintf(cmd, sizeof cmd,
             NVCC " -fatbin -gencode arch=compute_80,code=sm_80 -gencode "
                  "arch=compute_90,code=compute_90 -o '%s' '%s'",
             fb, cu);
    ck_assert_int_eq(system(cmd), 0);
    FILE *f = fopen(fb, "rb");
    ck_assert_ptr_nonnull(f);
    static char fat[1 << 20];
    size_t fn = fread(fat, 1, sizeof fat, f);
    fclose(f);
    o = opts_for(90);
    ck_assert_int_eq(hk_check(&o, fat, fn, &r, NULL), 0);
    ck_assert_int_eq(hk_check_result_format(r), HK_FORMAT_FATBIN);
    ck_assert_int_eq(hk_check_result_arch_count(r), 2);
    ck_assert_str_eq(hk_check_result_arch(r, 0), "sm_80");
    ck_assert_str_eq(hk_check_result_arch(r, 1), "compute_90");
    /* Its kernels are its sm_80 cubin's (nvcc stores the PTX compressed),
     * with their layouts. */
    ck_assert_int_eq(hk_check_result_kernel_count(r), 3);
    ck_assert_int_eq(find_kernel(r, "scale", NULL, NULL), 3);
    const size_t *off, *sz;
    ck_assert_int_eq(find_kernel(r, "mixed", &off, &sz), 4);
    ck_assert_uint_eq(sz[0], 32); /* struct Pair */
    ck_assert_int_eq(find_kernel(r, "noargs", NULL, NULL), 0);
    hk_check_result_free(r);
    /* Neither its sm_80 code nor its compute_90 PTX runs on 7.5. */
    hk_report rep = HK_REPORT_INIT;
    o = opts_for(75);
    ck_assert_int_eq(hk_check(&o, fat, fn, &r, &rep), HK_ERR_ARCH);
    ck_assert_str_eq(rep.message, "fatbin has sm_80, compute_90, target is sm_75");
    hk_report_clear(&rep);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- refusals ------------------------------------------------------------- */

START_TEST(syntax_error_comes_with_the_compiler_log) {
    hk_check_options o = opts_for(90);
    o.source_name = "kernels/bad.cu";
    hk_check_result *r = (hk_check_result *)&o; /* must be reset to NULL */
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_check(&o, BAD_CU, strlen(BAD_CU), &r, &rep), HK_ERR_COMPILE);
    ck_assert_ptr_null(r);
    ck_assert_int_eq(rep.error, HK_ERR_COMPILE);
    ck_assert_msg(strstr(rep.message, "kernels/bad.cu(2): error: expected an expression"), "%s",
                  rep.message);
    ck_assert_msg(rep.log && strstr(rep.log, "kernels/bad.cu(2): error: expected an expression") &&
                      strstr(rep.log, "1 error detected"),
                  "%s", rep.log ? rep.log : "(no log)");
    /* A report used again is overwritten, its old log freed (ASan sees). */
    ck_assert_int_eq(hk_check(&o, WARN_CU, strlen(WARN_CU), &r, &rep), 0);
    ck_assert_int_eq(rep.error, 0);
    ck_assert_ptr_null(rep.log);
    ck_assert_str_eq(rep.message, "");
    hk_check_result_free(r);

    /* PTX nvJitLink refuses: its log. */
    const char *bad_ptx = ".version 8.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry k() {\n  bogus.instruction;\n  ret;\n}\n";
    ck_assert_int_eq(hk_check(&o, bad_ptx, strlen(bad_ptx), &r, &rep), HK_ERR_COMPILE);
    ck_assert_msg(strstr(rep.message, "nvJitLink"), "%s", rep.message);
    ck_assert_ptr_nonnull(rep.log);
    hk_report_clear(&rep);

    /* Not a kernel source at all. */
    ck_assert_int_eq(hk_check(&o,
                              "\x7f"
                              "ELF nope",
                              8, &r, &rep),
                     HK_ERR_FORMAT);
    ck_assert_msg(rep.message[0], "no reason");
    ck_assert_int_eq(hk_check(&o, "", 0, &r, &rep), HK_ERR_FORMAT);
    ck_assert_str_eq(rep.message, "empty input");
    hk_report_clear(&rep);
}
END_TEST

START_TEST(ptx_for_a_newer_target_is_refused) {
    size_t n;
    char *ptx = nvrtc_image(KERNELS_CU, "compute_100", &n);
    hk_check_options o = opts_for(90);
    hk_check_result *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_check(&o, ptx, n, &r, &rep), HK_ERR_ARCH);
    ck_assert_ptr_null(r);
    ck_assert_str_eq(rep.message, "PTX is sm_100, target is sm_90");
    /* Also when it is only parsed, as a driver-JIT runtime would load it. */
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    ck_assert_int_eq(hk_check(&o, ptx, n, &r, &rep), HK_ERR_ARCH);
    ck_assert_str_eq(rep.message, "PTX is sm_100, target is sm_90");
    /* Its own target takes it (parsed only: nvJitLink 13.0 leaks an
     * allocation of its own linking for sm_100, which LeakSanitizer would
     * blame on the test). */
    o = opts_for(100);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    ck_assert_int_eq(hk_check(&o, ptx, n, &r, &rep), 0);
    ck_assert_str_eq(hk_check_result_arch(r, 0), "compute_100");
    hk_check_result_free(r);
    hk_report_clear(&rep);
    free(ptx);
}
END_TEST

START_TEST(cubin_for_another_arch_is_refused) {
    size_t n;
    void *cubin = nvrtc_image(KERNELS_CU, "sm_80", &n);
    hk_check_options o = opts_for(90);
    hk_check_result *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_check(&o, cubin, n, &r, &rep), HK_ERR_ARCH);
    ck_assert_ptr_null(r);
    ck_assert_str_eq(rep.message, "cubin is sm_80, target is sm_90");
    o = opts_for(75); /* older than the code: refused too */
    ck_assert_int_eq(hk_check(&o, cubin, n, &r, &rep), HK_ERR_ARCH);
    ck_assert_str_eq(rep.message, "cubin is sm_80, target is sm_75");
    /* A format given that the content is not. */
    o = opts_for(80);
    o.format = HK_FORMAT_PTX;
    ck_assert_int_lt(hk_check(&o, cubin, n, &r, &rep), 0);
    ck_assert_ptr_null(r);
    hk_report_clear(&rep);
    free(cubin);
}
END_TEST

/* Makes option i of bad_options_are_refused_before_any_build's list wrong. */
static void bad_option(hk_check_options *p, int i) {
    switch (i) {
    case 0:
        p->arch = 5;
        break;
    case 1:
        p->arch = 10000;
        break;
    case 2:
        p->arch_specific = 2;
        break;
    case 3:
        p->format = (hk_format)9;
        break;
    case 4:
        p->ptx_mode = (hk_ptx_mode)7;
        break;
    case 5:
        p->jit_opt_level = 5;
        break;
    case 6:
        p->build_profile = (hk_build_profile)3;
        break;
    case 7:
        p->nnvrtc_options = -1;
        break;
    case 8:
        p->nnvrtc_options = 1;
        break;
    case 9:
        p->nname_expressions = 2;
        break;
    case 10:
        p->nheaders = 1;
        break;
    default:
        p->nheaders = -1;
        break;
    }
}

START_TEST(bad_options_are_refused_before_any_build) {
    hk_check_result *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    const char *src = KERNELS_CU;
    size_t n = strlen(src);
    ck_assert_int_eq(hk_check(NULL, src, n, &r, &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "arch"), "%s", rep.message);

    hk_check_options o;
    hk_check_options_init(&o);
    ck_assert_int_eq(o.jit_opt_level, 4);
    ck_assert_int_eq(o.format, HK_FORMAT_AUTO);
    ck_assert_int_eq(o.arch, 0);
    ck_assert_int_eq(hk_check(&o, src, n, &r, &rep), HK_ERR_INVALID); /* no arch */
    ck_assert_msg(strstr(rep.message, "arch"), "%s", rep.message);

    static const char *const cases[] = {
        "arch 5",
        "arch 10000",
        "arch_specific 2",
        "format 9",
        "ptx_mode 7",
        "jit_opt_level 5",
        "build_profile 3",
        "nnvrtc_options -1",
        "nvrtc_options NULL",
        "name_expressions NULL",
        "headers NULL",
        "nheaders -1",
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        o = opts_for(90);
        bad_option(&o, i);
        r = (hk_check_result *)&o;
        ck_assert_msg(hk_check(&o, src, n, &r, &rep) == HK_ERR_INVALID, "%s", cases[i]);
        ck_assert_msg(rep.error == HK_ERR_INVALID && rep.message[0], "%s", cases[i]);
        ck_assert_ptr_null(r);
        hk_checker *c = (hk_checker *)&o;
        ck_assert_msg(hk_checker_create(&c, &o, &rep) == HK_ERR_INVALID, "%s", cases[i]);
        ck_assert_ptr_null(c);
    }
    /* NULL entries, and a header without a name. */
    const char *with_null[] = {"-DX=1", NULL};
    o = opts_for(90);
    o.nvrtc_options = with_null;
    o.nnvrtc_options = 2;
    ck_assert_int_eq(hk_check(&o, src, n, &r, &rep), HK_ERR_INVALID);
    o = opts_for(90);
    o.name_expressions = with_null;
    o.nname_expressions = 2;
    ck_assert_int_eq(hk_check(&o, src, n, &r, &rep), HK_ERR_INVALID);
    hk_header h = {"", "x", 1};
    o = opts_for(90);
    o.headers = &h;
    o.nheaders = 1;
    ck_assert_int_eq(hk_check(&o, src, n, &r, &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "header"), "%s", rep.message);

    /* Sizes: below the first layout refused, a newer program's accepted. */
    o = opts_for(90);
    o.size = offsetof(hk_check_options, source_name);
    ck_assert_int_eq(hk_check(&o, src, n, &r, &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "first layout"), "%s", rep.message);
    o.size = 0;
    ck_assert_int_eq(hk_check(&o, src, n, &r, &rep), HK_ERR_INVALID);
    struct {
        hk_check_options o;
        char later[64];
    } newer;
    memset(&newer, 0x5a, sizeof newer);
    ck_assert_int_eq(hk_check_options_init_size(&newer.o, sizeof newer), 0);
    ck_assert_int_eq(newer.later[0], 0); /* what the library does not know: zeroed */
    newer.o.arch = 90;
    ck_assert_int_eq(hk_check(&newer.o, src, n, &r, &rep), 0);
    hk_check_result_free(r);
    ck_assert_int_eq(hk_check_options_init_size(&o, 8), HK_ERR_INVALID);

    /* Arguments. */
    o = opts_for(90);
    ck_assert_int_eq(hk_check(&o, NULL, 5, &r, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(hk_check(&o, src, n, NULL, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(hk_checker_create(NULL, &o, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(hk_checker_check(NULL, "x.cu", src, n, &r, &rep), HK_ERR_INVALID);
    ck_assert_ptr_null(r);
    hk_format fmt;
    ck_assert_int_eq(hk_format_detect(src, n, NULL, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(hk_format_detect(NULL, 1, &fmt, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(hk_format_detect(src, n, &fmt, &rep), 0);
    ck_assert_int_eq(fmt, HK_FORMAT_CUDA_C);
    ck_assert_int_eq(hk_format_detect("\x7f"
                                      "ELF",
                                      4, &fmt, &rep),
                     HK_ERR_FORMAT);
    ck_assert_msg(rep.message[0], "no reason");
    /* A report below its first layout is left alone. */
    hk_report small;
    memset(&small, 0x33, sizeof small);
    small.size = 16;
    ck_assert_int_eq(hk_check(&o, src, n, &r, &small), HK_ERR_INVALID);
    ck_assert_int_eq((unsigned char)small.message[0], 0x33);
    hk_report_clear(&rep);
    hk_check_result_free(NULL);
    hk_checker_destroy(NULL);
}
END_TEST

/* ---- reuse ---------------------------------------------------------------- */

START_TEST(checker_gives_what_fresh_checks_give) {
    char *dir = hkt_tmpdir(), path[600], a[600], b[600];
    snprintf(path, sizeof path, "%s/common.cuh", dir);
    ck_assert_int_eq(hkt_write_file(path, "#define NAME first\n#define K 3\n"), 0);
    /* a.cu by a name relative to the working directory, as `hotkern
     * check a.cu` gives it; b.cu by its whole path. */
    ck_assert_int_eq(chdir(dir), 0);
    snprintf(a, sizeof a, "a.cu");
    snprintf(b, sizeof b, "%s/b.cu", dir);
    const char *uses = "#include <cuda_fp16.h>\n#include \"common.cuh\"\n"
                       "extern \"C\" __global__ void NAME(__half *h, int *x) { x[0] = K; }\n";
    const char *fp = "#include <cuda_fp16.h>\n#include \"v.h\"\n"
                     "extern \"C\" __global__ void h(__half *x) { x[0] = __float2half(V); }\n";
    ck_assert_int_eq(hkt_write_file("v.h", "#define V 7\n"), 0);
    size_t ncubin, nptx;
    void *cubin = nvrtc_image(KERNELS_CU, "sm_90", &ncubin);
    char *ptx = nvrtc_image(KERNELS_CU, "compute_90", &nptx);
    struct {
        const char *name, *src;
        size_t size;
    } srcs[] = {
        {"ok.cu", WARN_CU, strlen(WARN_CU)},
        {"fp.cu", fp, strlen(fp)},
        {"bad.cu", BAD_CU, strlen(BAD_CU)},
        {"k.cu", KERNELS_CU, strlen(KERNELS_CU)},
        {a, uses, strlen(uses)},
        {"bad.cu", BAD_CU, strlen(BAD_CU)},
        {"warn.cu", WARN_CU, strlen(WARN_CU)},
        {"k.ptx", ptx, nptx},
        {"k.cubin", cubin, ncubin},
        {b, uses, strlen(uses)},
        {"k.cu", KERNELS_CU, strlen(KERNELS_CU)},
    };
    hk_check_options o = opts_for(90);
    hk_checker *c = NULL;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_checker_create(&c, &o, &rep), 0);
    /* What each source gives fresh (hk_check: no PCH), then through the
     * checker twice over, so that the second round meets the PCHs NVRTC
     * made in the first; the checker's builds follow one another as in
     * `hotkern check` of many files. */
    enum { NSRC = sizeof srcs / sizeof srcs[0] };
    struct outcome {
        int rc;
        char message[512], log[8192], desc[2048];
    } *fresh = calloc(NSRC, sizeof *fresh), got;
    ck_assert_ptr_nonnull(fresh);
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < NSRC; i++) {
            hk_check_result *res = NULL;
            struct outcome *w = pass == 0 ? &fresh[i] : &got;
            memset(w, 0, sizeof *w);
            o.source_name = srcs[i].name;
            w->rc = pass == 0
                        ? hk_check(&o, srcs[i].src, srcs[i].size, &res, &rep)
                        : hk_checker_check(c, srcs[i].name, srcs[i].src, srcs[i].size, &res, &rep);
            const char *log = w->rc ? rep.log : hk_check_result_log(res);
            snprintf(w->message, sizeof w->message, "%s", rep.message);
            snprintf(w->log, sizeof w->log, "%s", log ? log : "");
            if (res)
                describe(res, w->desc, sizeof w->desc);
            hk_check_result_free(res);
            if (pass == 0)
                continue;
            ck_assert_msg(got.rc == fresh[i].rc, "%s: %d vs %d", srcs[i].name, got.rc, fresh[i].rc);
            ck_assert_str_eq(got.message, fresh[i].message);
            ck_assert_str_eq(got.desc, fresh[i].desc);
            /* The same log (errors, warnings): nothing said about PCHs. */
            ck_assert_str_eq(got.log, fresh[i].log);
        }
    }
    free(fresh);
    /* A header edited between two checks of one checker is seen. */
    hk_check_result *r = NULL;
    ck_assert_int_eq(hk_checker_check(c, a, uses, strlen(uses), &r, &rep), 0);
    ck_assert_int_eq(find_kernel(r, "first", NULL, NULL), 2);
    hk_check_result_free(r);
    ck_assert_int_eq(hkt_write_file(path, "#define NAME second\n#define K 4\n"), 0);
    ck_assert_int_eq(hk_checker_check(c, a, uses, strlen(uses), &r, &rep), 0);
    ck_assert_int_eq(find_kernel(r, "first", NULL, NULL), -1);
    ck_assert_int_eq(find_kernel(r, "second", NULL, NULL), 2);
    hk_check_result_free(r);
    ck_assert_int_eq(hkt_write_file(path, "#define NAME broken(\n"), 0);
    ck_assert_int_eq(hk_checker_check(c, a, uses, strlen(uses), &r, &rep), HK_ERR_COMPILE);
    /* The source name places its quoted includes: elsewhere, none is found. */
    ck_assert_int_eq(hk_checker_check(c, "/nonexistent/a.cu", uses, strlen(uses), &r, &rep),
                     HK_ERR_COMPILE);
    ck_assert_msg(rep.log && strstr(rep.log, "common.cuh"), "%s", rep.log);
    /* Results outlive their checker. */
    ck_assert_int_eq(hk_checker_check(c, NULL, KERNELS_CU, strlen(KERNELS_CU), &r, &rep), 0);
    hk_checker_destroy(c);
    ck_assert_int_eq(find_kernel(r, "scale", NULL, NULL), 3);
    hk_check_result_free(r);
    hk_report_clear(&rep);
    free(cubin);
    free(ptx);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(checker_keeps_copies_of_its_options) {
    char inc[32] = "-DW=7", expr[32] = "fill<int>", hname[32] = "w.h", hdata[32] = "#define V 9";
    const char *opts[] = {inc}, *exprs[] = {expr};
    hk_header h = {hname, hdata, strlen(hdata)};
    hk_check_options o = opts_for(90);
    o.nvrtc_options = opts;
    o.nnvrtc_options = 1;
    o.name_expressions = exprs;
    o.nname_expressions = 1;
    o.headers = &h;
    o.nheaders = 1;
    hk_checker *c = NULL;
    ck_assert_int_eq(hk_checker_create(&c, &o, NULL), 0);
    /* The caller's memory changes after create: the checker is unaffected. */
    memset(inc, 'x', sizeof inc - 1);
    memset(expr, 'y', sizeof expr - 1);
    memset(hname, 'z', sizeof hname - 1);
    memset(hdata, ' ', sizeof hdata - 1);
    memset(&o, 0, sizeof o);
    const char *src = "#include \"w.h\"\n"
                      "template <typename T> __global__ void fill(T *x) { x[0] = T(W + V); }\n";
    hk_check_result *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hk_checker_check(c, "t.cu", src, strlen(src), &r, &rep) == 0, "%s\n%s",
                  rep.message, rep.log ? rep.log : "");
    ck_assert_int_eq(find_kernel(r, "_Z4fillIiEvPT_", NULL, NULL), 1);
    hk_check_result_free(r);
    hk_checker_destroy(c);
    hk_report_clear(&rep);
}
END_TEST

struct worker {
    hk_checker *c;
    int ok;
};

static void *check_thread(void *p) {
    struct worker *w = p;
    for (int i = 0; i < 3; i++) {
        hk_check_result *r = NULL;
        hk_report rep = HK_REPORT_INIT;
        int rc = hk_checker_check(w->c, "k.cu", KERNELS_CU, strlen(KERNELS_CU), &r, &rep);
        w->ok += rc == 0 && hk_check_result_kernel_count(r) == 3;
        hk_check_result_free(r);
        rc = hk_checker_check(w->c, "bad.cu", BAD_CU, strlen(BAD_CU), &r, &rep);
        w->ok += rc == HK_ERR_COMPILE && rep.log && strstr(rep.log, "bad.cu(2)");
        hk_report_clear(&rep);
    }
    return NULL;
}

START_TEST(one_checker_on_several_threads) {
    hk_check_options o = opts_for(90);
    hk_checker *c = NULL;
    ck_assert_int_eq(hk_checker_create(&c, &o, NULL), 0);
    struct worker w[3] = {{c, 0}, {c, 0}, {c, 0}};
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, check_thread, &w[i]), 0);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        ck_assert_int_eq(w[i].ok, 6);
    }
    hk_checker_destroy(c);
}
END_TEST

int main(void) {
    Suite *s = suite_create("check");
    TCase *tc = tcase_create("check");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, cuda_c_lists_kernels_layouts_and_globals);
    tcase_add_test(tc, modes_archs_and_warnings);
    tcase_add_test(tc, ptx_cubin_and_fatbin_inputs);
    tcase_add_test(tc, syntax_error_comes_with_the_compiler_log);
    tcase_add_test(tc, ptx_for_a_newer_target_is_refused);
    tcase_add_test(tc, cubin_for_another_arch_is_refused);
    tcase_add_test(tc, bad_options_are_refused_before_any_build);
    tcase_add_test(tc, checker_gives_what_fresh_checks_give);
    tcase_add_test(tc, checker_keeps_copies_of_its_options);
    tcase_add_test(tc, one_checker_on_several_threads);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

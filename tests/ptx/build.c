/*
 * Builds: CUDA C with a header, name expressions, PTX through nvJitLink,
 * the refusals with their logs, both paths agreeing with their timings,
 * and the development profile (its own build, minimal only where safe).
 */
#include "tests/ptx/fixture.h"

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

void ptx_build_tests(TCase *tc) {
    tcase_add_test(tc, build_cuda_c_with_header);
    tcase_add_test(tc, build_name_expressions);
    tcase_add_test(tc, build_ptx_with_nvjitlink);
    tcase_add_test(tc, build_refusals);
    tcase_add_test(tc, build_paths_agree_and_timings);
    tcase_add_test(tc, dev_profile_is_its_own_build);
    tcase_add_test(tc, dev_profile_minimal_only_where_safe);
}

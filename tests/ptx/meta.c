/*
 * Format detection and the metadata parsers (ptx/detect.c, ptx/meta*.c):
 * each format recognised and bad input refused; cubin and PTX metadata
 * agree, hand-written PTX, cubins and fatbins of each architecture, survival
 * of corrupted images, and the architecture rules.
 */
#include "tests/ptx/fixture.h"

#define NVCC "/usr/local/cuda/bin/nvcc"

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

void ptx_detect_tests(TCase *tc) {
    tcase_add_test(tc, detect_each_format);
    tcase_add_test(tc, detect_refuses_bad_input);
}

void ptx_meta_tests(TCase *tc) {
    tcase_add_test(tc, meta_cubin_and_ptx_agree);
    tcase_add_test(tc, meta_hand_written_ptx);
    tcase_add_test(tc, meta_cubin_archs);
    tcase_add_test(tc, meta_fatbin_archs);
    tcase_add_test(tc, meta_survives_corruption);
    tcase_add_test(tc, arch_rules);
}

/*
 * The trap guard (ptx/guard.c): the rewrite of exactly the trap sites, the
 * refusals where it cannot be sound, the guard made on every build path,
 * linked as the image is, and its register count.
 */
#include "tests/ptx/fixture.h"

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

void ptx_guard_tests(TCase *tc) {
    tcase_add_test(tc, guard_rewrites_exactly_the_sites);
    tcase_add_test(tc, guard_refuses_what_it_cannot_do_soundly);
    tcase_add_test(tc, build_makes_the_guard_on_every_path);
    tcase_add_test(tc, guard_is_linked_as_the_image);
    tcase_add_test(tc, guard_copy_may_take_fewer_registers_than_its_image);
}

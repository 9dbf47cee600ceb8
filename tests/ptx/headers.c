/*
 * Headers without include directories: the toolkit found, CUB and the
 * toolkit's headers; headers given in memory; the precompiled header
 * following header edits and building on when its heap is exhausted.
 */
#include "tests/ptx/fixture.h"

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

void ptx_headers_tests(TCase *tc) {
    tcase_add_test(tc, toolkit_is_found);
    tcase_add_test(tc, build_cub_without_include_dirs);
    tcase_add_test(tc, build_toolkit_headers_without_include_dirs);
    tcase_add_test(tc, build_in_memory_headers);
    tcase_add_test(tc, pch_sees_header_edits);
    tcase_add_test(tc, pch_heap_exhausted_still_builds);
}

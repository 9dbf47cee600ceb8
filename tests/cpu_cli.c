/*
 * The `hotkern check` command as a script uses it: the built binary is run on
 * files written here, and its exit status and compiler-style messages are
 * checked (the network subcommands have their own suites).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/harness.h"

static char *dir;
static char out[16384];

/* Runs `hotkern ARGS` with stdout and stderr captured into out; returns the
 * exit status. */
static int hotkern(const char *args) {
    char cmd[8192], log[4200];
    snprintf(log, sizeof log, "%s/out.txt", dir);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s > '%s' 2>&1", dir, hkt_built_program("hotkern"),
             args, log);
    int st = system(cmd);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = 0;
    if (f)
        fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void put(const char *name, const char *text) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ck_assert_int_eq(hkt_write_file(p, text), 0);
}

static void setup(void) {
    dir = hkt_tmpdir();
    put("ok.cu", "extern \"C\" __global__ void k(int *x) { x[0] = 1; }\n"
                 "extern \"C\" __global__ void j(float *y, int n) { y[n] = 2.0f; }\n");
    put("bad.cu", "extern \"C\" __global__ void k(int *x) {\n  x[0] = ;\n}\n");
    put("hdr.cu", "#include \"inc/v.h\"\nextern \"C\" __global__ void k(int *x) { x[0] = V; }\n");
}

static void teardown(void) {
    hkt_rmtree(dir);
    free(dir);
}

START_TEST(good_file_lists_kernels) {
    ck_assert_int_eq(hotkern("check ok.cu"), 0);
    ck_assert_msg(strstr(out, "ok.cu: ok (2 kernels:"), "%s", out);
    ck_assert_msg(strstr(out, "k") && strstr(out, "j"), "%s", out);
}
END_TEST

START_TEST(compile_error_like_a_compiler) {
    ck_assert_int_eq(hotkern("check ok.cu bad.cu"), 1);
    ck_assert_msg(strstr(out, "ok.cu: ok"), "%s", out);       /* the good file still passes */
    ck_assert_msg(strstr(out, "bad.cu:2: error"), "%s", out); /* file:line: error */
}
END_TEST

START_TEST(defines_and_include_paths) {
    ck_assert_int_eq(hotkern("check hdr.cu"), 1); /* inc/v.h is not there yet */
    char mk[4400];
    snprintf(mk, sizeof mk, "mkdir -p '%s/inc' '%s/other' && echo '#define V 7' > '%s/inc/v.h'",
             dir, dir, dir);
    ck_assert_int_eq(system(mk), 0);
    ck_assert_int_eq(hotkern("check hdr.cu"), 0); /* found beside the source */
    put("def.cu", "extern \"C\" __global__ void k(int *x) { x[0] = W; }\n");
    ck_assert_int_eq(hotkern("check def.cu"), 1);
    ck_assert_int_eq(hotkern("check -D W=3 def.cu"), 0);
    put("other/w.h", "#define WW 5\n");
    put("inc.cu", "#include \"w.h\"\nextern \"C\" __global__ void k(int *x) { x[0] = WW; }\n");
    ck_assert_int_eq(hotkern("check inc.cu"), 1);
    ck_assert_int_eq(hotkern("check -I other inc.cu"), 0);
}
END_TEST

START_TEST(toolkit_headers_need_no_include_dirs) {
    put("sum.cu", "#include <cub/block/block_reduce.cuh>\n"
                  "#include <cuda/std/cstdint>\n"
                  "extern \"C\" __global__ void sum(const float *in, float *out) {\n"
                  "    using BR = cub::BlockReduce<float, 64>;\n"
                  "    __shared__ typename BR::TempStorage t;\n"
                  "    float s = BR(t).Sum(in[threadIdx.x]);\n"
                  "    if (threadIdx.x == 0) *out = s + (cuda::std::int8_t)1;\n"
                  "}\n");
    ck_assert_int_eq(hotkern("check sum.cu"), 0);
    ck_assert_msg(strstr(out, "sum.cu: ok (1 kernel: sum)"), "%s", out);
}
END_TEST

START_TEST(templates_without_instantiation) {
    put("tmpl.cu", "// a comment that says template __global__ void fake(\n"
                   "template <typename T, int N>\n"
                   "__global__ void scale(T *x, T a) { x[threadIdx.x] *= a * N; }\n"
                   "template <class T> __global__ void fill(T *x) { x[0] = T(); }\n");
    ck_assert_int_eq(hotkern("check tmpl.cu"), 1);
    ck_assert_msg(strstr(out, "tmpl.cu: error: no kernel was instantiated: scale, fill are "
                              "templates"),
                  "%s", out);
    ck_assert_msg(strstr(out, "--name-expression 'scale<float, 1>' tmpl.cu"), "%s", out);
    ck_assert_msg(!strstr(out, "fake"), "%s", out);
    ck_assert_msg(!strstr(out, "ok (0 kernels)"), "%s", out);
    /* Following the advice works. */
    ck_assert_int_eq(hotkern("check --name-expression 'scale<float, 1>' tmpl.cu"), 0);
    ck_assert_msg(strstr(out, "tmpl.cu: ok (1 kernel: _Z5scaleIfLi1EEvPT_S0_)"), "%s", out);
    ck_assert_int_eq(hotkern("check '--name-expression=fill<int>' --name-expression "
                             "'scale<double, 2>' tmpl.cu"),
                     0);
    ck_assert_msg(strstr(out, "tmpl.cu: ok (2 kernels:"), "%s", out);
    /* A file with no kernels at all is still just empty. */
    put("none.cu", "__device__ int f(int x) { return x; }\n");
    ck_assert_int_eq(hotkern("check none.cu"), 0);
    ck_assert_msg(strstr(out, "none.cu: ok (0 kernels)"), "%s", out);
    ck_assert_int_eq(hotkern("check --name-expression"), 2);
}
END_TEST

START_TEST(usage_and_bad_input) {
    ck_assert_int_eq(hotkern("check"), 2);
    ck_assert_int_eq(hotkern("check --bogus ok.cu"), 2);
    ck_assert_int_eq(hotkern("check --help"), 0);
    ck_assert_int_eq(hotkern("check missing.cu"), 1);
    put("garbage.bin", "\x7f"
                       "ELF not really");
    ck_assert_int_eq(hotkern("check garbage.bin"), 1);
    ck_assert_int_eq(hotkern("nosuchcommand"), 2);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("check");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, good_file_lists_kernels);
    tcase_add_test(tc, compile_error_like_a_compiler);
    tcase_add_test(tc, defines_and_include_paths);
    tcase_add_test(tc, usage_and_bad_input);
    tcase_add_test(tc, toolkit_headers_need_no_include_dirs);
    tcase_add_test(tc, templates_without_instantiation);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

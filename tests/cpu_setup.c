/*
 * Setup mistakes with programs as they are, each said, none silent
 * (interpose/env.c, interpose/preload.c, the documented recipes):
 *   - LD_PRELOAD of the preload library on a program with nvcc's default
 *     static cudart (BUILD/stub/exit_app_plain) says once that it cannot
 *     reach it and how to link hotkern in; on a -cudart shared program, on
 *     the --wrap build, on a program without device code and under
 *     HOTKERN_OFF it says nothing of the kind;
 *   - the README's static-cudart recipe stops, saying why, where
 *     hotkern-wrap is not installed, and links the interposition where it
 *     is (the build tree's hotkern-wrap.pc, moved to BUILD);
 *   - every `pkg-config --variable=NAME PKG` the documentation names exists
 *     in the .pc files the build writes (BUILD/pkg), and no documented nvcc
 *     command takes -Wl, flags (nvcc refuses them);
 *   - HOTKERN_* values that do not parse are refused, each with its
 *     reason, and then nothing is enabled: no runtime, the program's own
 *     code; a source that cannot start does the same; a configuration that
 *     parses makes a runtime that builds in the build helper.
 * The runtime's cases run the interposition's core with a program runtime
 * of one fake launch, on the loadable fake driver (HK_LIBCUDA).
 */
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hotkern/interpose.h"
#include "interpose/interpose.h"
#include "loader/core.h"
#include "tests/harness.h"

static char build[PATH_MAX], root[PATH_MAX], dir[PATH_MAX];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    ck_assert_int_lt(n, (int)sizeof cmd);
    fflush(NULL);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *const known[] = {
    "HOTKERN_WATCH",  "HOTKERN_ENDPOINT",  "HOTKERN_ORIGIN",  "HOTKERN_TRUSTED_KEY",
    "HOTKERN_TOKEN",  "HOTKERN_STATE_DIR", "HOTKERN_RESTORE", "HOTKERN_CACHE_DIR",
    "HOTKERN_CANARY", "HOTKERN_LOG",       "HOTKERN_OFF",     "HOTKERN_ALLOW_UNSIGNED",
};

static void setup(void) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(n, 0);
    self[n] = 0;
    ck_assert_ptr_nonnull(realpath(dirname(dirname(self)), build));
    snprintf(root, sizeof root, "%s", build);
    ck_assert_ptr_nonnull(realpath(dirname(root), root));
    char *d = hkt_tmpdir();
    ck_assert_ptr_nonnull(d);
    snprintf(dir, sizeof dir, "%s", d);
    free(d);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        unsetenv(known[i]);
}

static void teardown(void) {
    hkt_rmtree(dir);
}

/* ---- the preload library on a static-cudart program ---------------------- */

#define STATIC_SAID "linked in statically"

/* Runs PROG under the preload library (with ENV before it), no driver;
 * returns how many times stderr says the program's runtime is static, or -1
 * when PROG did not end with status want. */
static int static_said(const char *env, const char *prog, int want) {
    int rc = sh("cd '%s' && env HK_LIBCUDA=/nonexistent/libcuda.so.1 %s "
                "LD_PRELOAD='%s/lib/libhotkern-preload.so' %s >out 2>err",
                dir, env, build, prog);
    if (rc != want) {
        sh("cat '%s/out' '%s/err'", dir, dir);
        return -1;
    }
    return sh("exit $(grep -c '" STATIC_SAID "' '%s/err')", dir);
}

START_TEST(preload_says_once_that_a_static_cudart_is_out_of_reach) {
    char plain[PATH_MAX + 32];
    snprintf(plain, sizeof plain, "%s/stub/exit_app_plain", build);
    if (access(plain, X_OK)) {
        printf("SKIP setup: %s is not built (sanitizer builds leave the nvcc programs out)\n",
               plain);
        return;
    }
    ck_assert_int_eq(static_said("", plain, 7), 1);
    /* It says how: link hotkern in, or build with -cudart shared. */
    ck_assert_int_eq(sh("grep -q 'nvcc_libs hotkern-wrap' '%s/err' && "
                        "grep -q 'cudart shared' '%s/err'",
                        dir, dir),
                     0);
    /* The program's own output, whole. */
    ck_assert_int_eq(
        sh("cd '%s' && printf 'exit_app started\\nexit_app done\\n' | cmp -s - out", dir), 0);
    ck_assert_int_eq(static_said("HOTKERN_OFF=1", plain, 7), 0);
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/stub/exit_app_shared", build);
    ck_assert_int_eq(static_said("", p, 7), 0);
    snprintf(p, sizeof p, "%s/stub/exit_app_static", build);
    ck_assert_int_eq(static_said("", p, 7), 0);
    ck_assert_int_eq(static_said("", "/bin/true", 0), 0); /* no device code at all */
    ck_assert_int_eq(sh("test ! -s '%s/err'", dir), 0);
}
END_TEST

/* ---- the documented recipes ------------------------------------------- */

/* The README's recipe for a static-cudart program, as documented. */
static void readme_recipe(char *out, size_t n) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/README.md", root);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[1024];
    out[0] = 0;
    while (!out[0] && fgets(line, sizeof line, f))
        if (strstr(line, "nvcc -o game game.cu") && strstr(line, "pkg-config"))
            snprintf(out, n, "%s", line);
    fclose(f);
    ck_assert_msg(out[0], "README.md has no 'nvcc -o game game.cu' line with pkg-config");
    out[strcspn(out, "\n")] = 0;
}

static const char game_src[] = "#include <cstdio>\n"
                               "extern \"C\" __global__ void step(float *x) { if (x) *x = 1; }\n"
                               "int main() { step<<<1, 1>>>(nullptr); printf(\"game ran\\n\"); }\n";

START_TEST(wrap_recipe_stops_where_hotkern_is_not_installed) {
    char recipe[1024], src[PATH_MAX + 16];
    readme_recipe(recipe, sizeof recipe);
    snprintf(src, sizeof src, "%s/game.cu", dir);
    ck_assert_int_eq(hkt_write_file(src, game_src), 0);
    ck_assert_int_eq(sh("mkdir -p '%s/nopc'", dir), 0);
    /* pkg-config sees an empty folder: hotkern is not installed. */
    int rc =
        sh("cd '%s' && PKG_CONFIG_LIBDIR='%s/nopc' PKG_CONFIG_PATH= PATH=/usr/local/cuda/bin:$PATH "
           "sh -c '%s' >build.log 2>&1",
           dir, dir, recipe);
    sh("cat '%s/build.log'", dir);
    ck_assert_msg(rc != 0, "the recipe '%s' built without hotkern-wrap installed", recipe);
    ck_assert_int_eq(sh("test ! -e '%s/game'", dir), 0);
    ck_assert_int_eq(sh("grep -q 'hotkern-wrap was not found' '%s/build.log'", dir), 0);
}
END_TEST

START_TEST(wrap_recipe_links_the_interposition) {
    char recipe[1024], src[PATH_MAX + 16], plain[PATH_MAX + 32];
    snprintf(plain, sizeof plain, "%s/stub/exit_app_plain", build);
    if (access(plain, X_OK)) { /* the nvcc programs' absence marks one */
        printf("SKIP setup: a sanitizer build's archive does not link into an nvcc program\n");
        return;
    }
    readme_recipe(recipe, sizeof recipe);
    snprintf(src, sizeof src, "%s/game.cu", dir);
    ck_assert_int_eq(hkt_write_file(src, game_src), 0);
    /* The build tree's hotkern-wrap.pc, its prefix moved to BUILD and its
     * libdir to BUILD/lib (which has libhotkern-wrap.a), whatever LIBDIR
     * the last make install that wrote it had (cpu_install's is another). */
    ck_assert_int_eq(sh("mkdir -p '%s/pc' && sed -e 's|^prefix=.*|prefix=%s|' "
                        "-e 's|^libdir=.*|libdir=${prefix}/lib|' "
                        "'%s/pkg/hotkern-wrap.pc' >'%s/pc/hotkern-wrap.pc'",
                        dir, build, build, dir),
                     0);
    ck_assert_int_eq(sh("cd '%s' && PKG_CONFIG_LIBDIR='%s/pc' PKG_CONFIG_PATH= "
                        "PATH=/usr/local/cuda/bin:$PATH sh -c '%s' >build.log 2>&1 || "
                        "{ cat build.log; exit 1; }",
                        dir, dir, recipe),
                     0);
    ck_assert_int_eq(sh("nm '%s/game' | grep -q ' __wrap___cudaLaunchKernel$'", dir), 0);
    ck_assert_int_eq(sh("cd '%s' && HK_LIBCUDA=/nonexistent/libcuda.so.1 ./game >run.log 2>&1; "
                        "cat run.log; grep -q 'game ran' run.log && "
                        "grep -q 'hotkern: not enabled' run.log",
                        dir),
                     0);
}
END_TEST

/* Every `--variable=NAME PKG` in the documentation is one of PKG's, and no
 * documented nvcc line takes -Wl, flags (pkg-config --libs, or a variable
 * whose value has them). */
START_TEST(documented_pkg_config_variables_exist) {
    const char *docs = "README.md include/hotkern/*.h pkg/*.in docs/*.md";
    int rc = sh("cd '%s' && grep -ohE -- '--variable=[a-z_]+ +[a-z-]+' %s | sort -u | "
                "while read v p; do n=${v#--variable=}; "
                "PKG_CONFIG_PATH='%s/pkg' pkg-config --print-variables \"$p\" 2>/dev/null | "
                "grep -qx \"$n\" || echo \"BAD: $p has no variable $n\"; done >'%s/vars.log'; "
                "cat '%s/vars.log'; ! grep -q BAD '%s/vars.log'",
                root, docs, build, dir, dir, dir);
    ck_assert_msg(rc == 0, "the documentation names pkg-config variables that do not exist");
    /* Lines that run nvcc with pkg-config's output, continuation lines
     * joined and comment leaders dropped. */
    rc = sh("cd '%s' && for f in %s; do awk '{ sub(/^ *(\\*|#) ?/, \"\"); "
            "if (sub(/\\\\$/, \"\")) { acc = acc $0; next } print acc $0; acc = \"\" }' \"$f\"; "
            "done | grep -E 'nvcc .*pkg-config|pkg-config.*&& *nvcc ' >'%s/nvcc.log'; "
            "while read -r l; do case \"$l\" in *--libs*) echo \"BAD (-Wl, from --libs): $l\";; "
            "esac; for v in $(echo \"$l\" | grep -oE -- '--variable=[a-z_]+ +[a-z-]+' | "
            "tr ' ' '@'); do n=${v#--variable=}; p=${n#*@}; n=${n%%@*}; "
            "PKG_CONFIG_PATH='%s/pkg' pkg-config --variable=$n $p | grep -q -- '-Wl,' && "
            "echo \"BAD ($n has -Wl,): $l\"; done; done <'%s/nvcc.log' >'%s/wl.log'; "
            "cat '%s/wl.log'; test -s '%s/nvcc.log' && ! grep -q BAD '%s/wl.log'",
            root, docs, dir, build, dir, dir, dir, dir, dir);
    ck_assert_msg(rc == 0, "a documented nvcc command takes -Wl, flags (or none was found)");
}
END_TEST

/* ---- HOTKERN_* ------------------------------------------------------------ */

static cudaError_t f_klaunch(cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh_, cudaStream_t s) {
    return cudaSuccess;
}

static const hki_real fake_real = {.klaunch = f_klaunch, .klaunch_ptsz = f_klaunch};

/* The first launch, its stderr in DIR/stderr: the runtime it made. */
static hk_runtime *first_launch(void) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/stderr", dir);
    char fake[PATH_MAX + 64];
    snprintf(fake, sizeof fake, "%s/lib/libhotkern-fakecuda.so", build);
    setenv("HK_LIBCUDA", fake, 1);
    hki_real_set(&fake_real);
    fflush(stderr);
    int keep = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 2);
    close(fd);
    dim3 one = {1, 1, 1};
    ck_assert_int_eq(hki_klaunch(0, NULL, one, one, NULL, 0, NULL), cudaSuccess);
    fflush(stderr);
    dup2(keep, 2);
    close(keep);
    sh("cat '%s'", path);
    return hk_interpose_runtime();
}

static int said(const char *text) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/stderr", dir);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return strstr(buf, text) != NULL;
}

START_TEST(values_that_do_not_parse_are_refused) {
    static const struct {
        const char *name, *value, *why;
    } bad[] = {
        {"HOTKERN_ENDPOINT", "notaport", "not [address:]port"},
        {"HOTKERN_ENDPOINT", "70000", "not [address:]port"},
        {"HOTKERN_ENDPOINT", "-1", "not [address:]port"},
        {"HOTKERN_ENDPOINT", "9090x", "not [address:]port"},
        {"HOTKERN_ENDPOINT", "localhost:9090", "numeric"},
        {"HOTKERN_ENDPOINT", ":9090", "not [address:]port"},
        {"HOTKERN_CANARY", "maybe", "not a flag"},
        {"HOTKERN_OFF", "2", "not a flag"},
        {"HOTKERN_ALLOW_UNSIGNED", "y", "not a flag"},
        {"HOTKERN_RESTORE", "1", "needs HOTKERN_STATE_DIR"},
        {"HOTKERN_LOG", "loud", "not a level"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv(bad[i].name, bad[i].value, 1);
        hki_env e;
        ck_assert_msg(hki_env_read(&e) == -1, "%s=%s was taken", bad[i].name, bad[i].value);
        ck_assert_int_eq(e.refused, 1);
        char head[128];
        snprintf(head, sizeof head, "hotkern: %s=%s: ", bad[i].name, bad[i].value);
        ck_assert_msg(strstr(e.why, head) && strstr(e.why, bad[i].why), "%s", e.why);
        unsetenv(bad[i].name);
    }
    /* Every refusal at once. */
    setenv("HOTKERN_CANARY", "maybe", 1);
    setenv("HOTKERN_LOG", "loud", 1);
    hki_env e;
    ck_assert_int_eq(hki_env_read(&e), -1);
    ck_assert_int_eq(e.refused, 2);
}
END_TEST

START_TEST(values_that_parse_are_taken) {
    static const struct {
        const char *v, *addr;
        unsigned port;
    } ep[] = {{"9090", "127.0.0.1", 9090},
              {"0.0.0.0:0", "0.0.0.0", 0},
              {"[::1]:65535", "::1", 65535},
              {"::1:80", "::1", 80}};
    for (size_t i = 0; i < sizeof ep / sizeof ep[0]; i++) {
        setenv("HOTKERN_ENDPOINT", ep[i].v, 1);
        hki_env e;
        ck_assert_msg(hki_env_read(&e) == 0, "%s: %s", ep[i].v, e.why);
        ck_assert_str_eq(e.address, ep[i].addr);
        ck_assert_uint_eq(e.port, ep[i].port);
    }
    unsetenv("HOTKERN_ENDPOINT");
    static const struct {
        const char *v;
        int on;
    } flags[] = {{"1", 1}, {"true", 1}, {"YES", 1}, {"on", 1}, {"0", 0}, {"off", 0}, {"", 0}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        setenv("HOTKERN_CANARY", flags[i].v, 1);
        hki_env e;
        ck_assert_int_eq(hki_env_read(&e), 0);
        ck_assert_int_eq(e.canary, flags[i].on);
    }
    setenv("HOTKERN_OFF", "1", 1);
    hki_env e;
    ck_assert_int_eq(hki_env_read(&e), 1);
}
END_TEST

START_TEST(a_refused_value_enables_nothing) {
    setenv("HOTKERN_ENDPOINT", "notaport", 1);
    setenv("HOTKERN_WATCH", dir, 1);
    ck_assert_ptr_null(first_launch());
    ck_assert(said("hotkern: HOTKERN_ENDPOINT=notaport: not [address:]port"));
    ck_assert(said("hotkern: not enabled, the program's own kernels run"));
}
END_TEST

START_TEST(a_flag_that_does_not_parse_enables_nothing) {
    setenv("HOTKERN_CANARY", "maybe", 1);
    setenv("HOTKERN_WATCH", dir, 1);
    ck_assert_ptr_null(first_launch());
    ck_assert(said("HOTKERN_CANARY=maybe: not a flag"));
}
END_TEST

START_TEST(a_source_that_cannot_start_enables_nothing) {
    char missing[PATH_MAX + 16];
    snprintf(missing, sizeof missing, "%s/missing", dir);
    setenv("HOTKERN_WATCH", missing, 1);
    ck_assert_ptr_null(first_launch());
    ck_assert(said("hotkern: HOTKERN_WATCH: "));
    ck_assert(said("hotkern: not enabled"));
}
END_TEST

START_TEST(the_runtime_builds_in_the_helper) {
    setenv("HOTKERN_WATCH", dir, 1);
    setenv("HOTKERN_WACTH", dir, 1); /* a typo: said, ignored */
    hk_runtime *rt = first_launch();
    ck_assert_ptr_nonnull(rt);
    ck_assert_ptr_nonnull(rt->iso); /* no NVRTC in the program's process */
    ck_assert_ptr_null(rt->warm);
    ck_assert(said("HOTKERN_WACTH is not a hotkern setting"));
    unsetenv("HOTKERN_WACTH");
    hk_runtime_destroy(rt); /* no launch follows */
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("setup");
    TCase *tc = tcase_create("setup");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, preload_says_once_that_a_static_cudart_is_out_of_reach);
    tcase_add_test(tc, wrap_recipe_stops_where_hotkern_is_not_installed);
    tcase_add_test(tc, wrap_recipe_links_the_interposition);
    tcase_add_test(tc, documented_pkg_config_variables_exist);
    tcase_add_test(tc, values_that_do_not_parse_are_refused);
    tcase_add_test(tc, values_that_parse_are_taken);
    tcase_add_test(tc, a_refused_value_enables_nothing);
    tcase_add_test(tc, a_flag_that_does_not_parse_enables_nothing);
    tcase_add_test(tc, a_source_that_cannot_start_enables_nothing);
    tcase_add_test(tc, the_runtime_builds_in_the_helper);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

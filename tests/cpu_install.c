/*
 * Packaging: `make install` into a DESTDIR, then a program outside the tree
 * built with `pkg-config --cflags --libs hotkern` against the installed
 * library, run, and the shared library's exported symbols checked (hk_ only).
 */
#include <libgen.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"

static char root[PATH_MAX], build[PATH_MAX];

/* The repository root and build directory, from BUILD/tests/cpu_install. */
static void locate(void) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(n, 0);
    self[n] = 0;
    char *b = dirname(dirname(self));
    ck_assert_ptr_nonnull(realpath(b, build));
    snprintf(root, sizeof root, "%s", build);
    ck_assert_ptr_nonnull(realpath(dirname(root), root));
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(install_and_build_a_consumer) {
    locate();
    char *dest = hkt_tmpdir();
    ck_assert_ptr_nonnull(dest);
    ck_assert_int_eq(
        sh("make -s -C '%s' BUILD='%s' install DESTDIR='%s' PREFIX=/usr >%s/install.log "
           "2>&1",
           root, build, dest, dest),
        0);
    const char *files[] = {"usr/include/hotkern/hotkern.h",
                           "usr/include/hotkern/net.h",
                           "usr/lib/libhotkern.a",
                           "usr/lib/libhotkern.so.0",
                           "usr/lib/libhotkern.so",
                           "usr/lib/pkgconfig/hotkern.pc",
                           "usr/bin/hotkern"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[PATH_MAX + 64];
        snprintf(p, sizeof p, "%s/%s", dest, files[i]);
        ck_assert_msg(access(p, R_OK) == 0, "%s not installed", files[i]);
    }
    char src[PATH_MAX + 32];
    snprintf(src, sizeof src, "%s/consumer.c", dest);
    ck_assert_int_eq(hkt_write_file(src, "#include <hotkern/hotkern.h>\n"
                                         "#include <stdio.h>\n"
                                         "int main(void) {\n"
                                         "  hk_runtime *rt; hk_report rep = {0};\n"
                                         "  int e = hk_runtime_create(&rt, NULL, &rep);\n"
                                         "  printf(\"%d %s: %s\\n\", e, hk_strerror(e), "
                                         "rep.message);\n"
                                         "  if (e == 0) hk_runtime_destroy(rt);\n"
                                         "  return e == HK_ERR_NO_DRIVER ? 0 : 1;\n"
                                         "}\n"),
                     0);
    /* The sysroot variable points pkg-config's -I/-L at the DESTDIR tree. */
    ck_assert_int_eq(sh("cd '%s' && PKG_CONFIG_PATH='%s/usr/lib/pkgconfig' "
                        "PKG_CONFIG_SYSROOT_DIR='%s' cc consumer.c -o consumer "
                        "$(PKG_CONFIG_PATH='%s/usr/lib/pkgconfig' PKG_CONFIG_SYSROOT_DIR='%s' "
                        "pkg-config --cflags --libs hotkern) >cc.log 2>&1",
                        dest, dest, dest, dest, dest),
                     0);
    /* Under `make sanitize` the installed library carries ASan, which then is
     * not first in the consumer's library list: tell ASan that is fine. */
    ck_assert_int_eq(sh("cd '%s' && HK_LIBCUDA=/nonexistent/libcuda.so.1 "
                        "ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0 "
                        "LD_LIBRARY_PATH='%s/usr/lib' ./consumer > run.log 2>&1",
                        dest, dest),
                     0);
    /* It ran against the installed shared library, not a static copy. */
    ck_assert_int_eq(sh("cd '%s' && LD_LIBRARY_PATH='%s/usr/lib' ldd consumer | grep -q "
                        "'libhotkern.so.0 => %s/usr/lib/'",
                        dest, dest, dest),
                     0);
    /* Only the public prefix (and the version node) leaves the shared library. */
    ck_assert_int_eq(
        sh("nm -D --defined-only '%s/usr/lib/libhotkern.so.0' | awk '{print $3}' | "
           "grep -v '^hk_' | grep -v '^_' | grep -v '^HOTKERN_0$' | grep -q . && exit 1 || exit 0",
           dest),
        0);
    ck_assert_int_eq(sh("nm -D --defined-only '%s/usr/lib/libhotkern.so.0' | grep -q ' "
                        "hk_swap@'",
                        dest),
                     0);
    hkt_rmtree(dest);
    free(dest);
}
END_TEST

int main(void) {
    Suite *s = suite_create("install");
    TCase *tc = tcase_create("install");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, install_and_build_a_consumer);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

/*
 * Packaging: `make install` into DESTDIRs, then programs outside the tree
 * built against the installed libraries the way a user builds them. Two
 * installs, each an unchecked fixture of its own test case:
 *
 * The full one (NET=1), from this build, with a multiarch LIBDIR
 * (PREFIX/lib/x86_64-linux-gnu) and this build's PREFIX and LIBEXECDIR
 * (compiled into the library: other values would rebuild it under the
 * running suites):
 *   - a core-only program with `pkg-config --cflags --libs hotkern`, which
 *     must not pull in the network libraries (neither it nor libhotkern.so.1
 *     needs libcurl, libmicrohttpd or libcjson; libsodium hashes the compile
 *     cache and stays);
 *   - a program of the network sources with `pkg-config ... hotkern-net`;
 *   - a C++17 program of the typed-launch header (hotkern.hpp) with
 *     `pkg-config ... hotkern`;
 *   - the CMake package: find_package(hotkern ... COMPONENTS net), the shared
 *     and static targets of both components, its version checks (SKIP when
 *     cmake is missing);
 *   - each shared library's exported symbols (hk_ only); an ordinary nvcc
 *     program made hot-reloadable both ways: with static cudart through
 *     pkg-config's nvcc_libs and through hotkern_enable_hot_reload() in
 *     CMake, and with -cudart shared under LD_PRELOAD of the installed
 *     preload library (without a driver each says once that it is not
 *     enabled and runs the program's own code: the interposition is in
 *     place);
 *   - the man pages through man -l; the helpers' fallback (LIBEXECDIR as
 *     built, since ../libexec from a multiarch LIBDIR is not the tree's);
 *   - install again changes nothing; make uninstall leaves no file.
 *
 * The core-only one, built from scratch on a machine "without the network
 * packages": pkg-config is pointed at a folder holding only libsodium.pc, so
 * the Makefile finds libcurl, libmicrohttpd and libcjson missing and builds
 * NET=0 by itself (the headers are still on this machine: what shows that
 * nothing uses them is the dry run's commands, none naming curl,
 * microhttpd or cjson, and the NEEDED entries of everything installed, none
 * naming their libraries). Against it: pkg-config and CMake consumers (shared
 * and static), COMPONENTS net failing cleanly, the helpers found in
 * ../libexec/hotkern by installed programs (started for real: canary and
 * isolated builds on the loadable fake driver), the CLI built with NET=0
 * (its network commands say they are not built), hotkern(3), a second
 * install that changes nothing and an uninstall that leaves no file.
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
/* The full install: dest is its DESTDIR, pre the PREFIX in it, lib its
 * LIBDIR. */
static char dest[PATH_MAX], pre[PATH_MAX + 64], lib[PATH_MAX + 128];
/* The core-only install: core holds pc/ (the pkg-config folder), build/,
 * root/ (the DESTDIR) and work/ (the consumers). */
static char core[PATH_MAX];

#define LIBSUB "lib/x86_64-linux-gnu"
/* What the full install is made with, and uninstalled with. */
#define FULL_VARS                                                                                  \
    "NET=1 PREFIX='" HK_PREFIX "' LIBEXECDIR='" HK_LIBEXECDIR "' LIBDIR='" HK_PREFIX "/" LIBSUB "'"
/* The core-only install's: what the Makefile decides, but for PREFIX. The
 * environment of a make that runs this suite (MAKEFLAGS, NET) is not passed
 * on, and pkg-config sees only pc/. Takes core twice. */
#define CORE_MAKE                                                                                  \
    "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u NET -u PKG_CONFIG_PATH PKG_CONFIG_LIBDIR='%s/pc' " \
    "make -s -C '%s' BUILD='%s/build' PREFIX=/usr DESTDIR='%s/root'"

/* The libraries of the network sources: none of them may reach a core-only
 * program. */
#define NET_LIBS_RE "'libcurl|libmicrohttpd|libcjson'"

/* pkg-config pointed at the full install; the sysroot variable moves its
 * -I/-L there too. Takes lib, then dest. */
#define PKG_ENV "PKG_CONFIG_PATH='%s/pkgconfig' PKG_CONFIG_SYSROOT_DIR='%s'"

/* How the programs run: no driver, the installed libraries. Under `make
 * sanitize` those carry ASan, which then is not first in the program's library
 * list: tell ASan that is fine. Takes lib once. */
#define RUN_ENV                                                                                    \
    "HK_LIBCUDA=/nonexistent/libcuda.so.1 ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0 "   \
    "LD_LIBRARY_PATH='%s'"

/* Uses the engine only: no driver here, so creation fails with NO_DRIVER. */
static const char core_src[] = "#include <hotkern/hotkern.h>\n"
                               "#include <stdio.h>\n"
                               "int main(void) {\n"
                               "  hk_runtime *rt; hk_report rep = HK_REPORT_INIT;\n"
                               "  int e = hk_runtime_create(&rt, NULL, &rep);\n"
                               "  printf(\"hotkern %s: %d %s: %s\\n\", hk_version(), e, "
                               "hk_strerror(e), rep.message);\n"
                               "  if (e == 0) hk_runtime_destroy(rt);\n"
                               "  return e == HK_ERR_NO_DRIVER ? 0 : 1;\n"
                               "}\n";

/* Uses the network library without the network: defaults, and an argument
 * check that fails before anything is bound. */
static const char net_src[] = "#include <hotkern/net.h>\n"
                              "#include <stdio.h>\n"
                              "int main(void) {\n"
                              "  hk_endpoint_options o; hk_endpoint *ep = NULL;\n"
                              "  hk_report rep = HK_REPORT_INIT;\n"
                              "  hk_endpoint_options_init(&o);\n"
                              "  int e = hk_endpoint_start(NULL, &o, &ep, &rep);\n"
                              "  printf(\"%s %u: %s\\n\", o.address, o.threads, hk_strerror(e));\n"
                              "  hk_endpoint_stop(ep);\n"
                              "  hk_pull_stop(NULL);\n"
                              "  return e == HK_ERR_INVALID && o.threads == 2 ? 0 : 1;\n"
                              "}\n";

/* An ordinary nvcc program: a __constant__ the host sets, a <<<>>> launch. */
static const char nvcc_src[] = "#include <cstdio>\n"
                               "#include <cuda_runtime.h>\n"
                               "__constant__ float gain;\n"
                               "extern \"C\" __global__ void step(float *x) { *x = gain; }\n"
                               "int main() {\n"
                               "  int n = 0;\n"
                               "  cudaError_t e = cudaGetDeviceCount(&n);\n"
                               "  float g = 2;\n"
                               "  cudaMemcpyToSymbol(gain, &g, sizeof g);\n"
                               "  step<<<1, 1>>>(nullptr);\n"
                               "  printf(\"app ran: %s\\n\", cudaGetErrorName(e));\n"
                               "  return 0;\n"
                               "}\n";

/* What the interposition says when it cannot make a runtime. */
#define NOT_ENABLED "hotkern: not enabled, the program"

/* The typed-launch header, installed: no driver here, so creation fails with
 * NO_DRIVER, a bind without a runtime with INVALID, and a launch through the
 * unbound handle launches nothing. */
static const char cpp_src[] =
    "#include <hotkern/hotkern.hpp>\n"
    "#include <cstdio>\n"
    "int main() {\n"
    "  hk::runtime rt;\n"
    "  int e = rt.open();\n"
    "  hk::kernel<void(float *, int)> k;\n"
    "  int b = k.bind(rt, \"m\", \"step\");\n"
    "  std::printf(\"%d %s / %d %s\\n\", e, rt.message(), b, k.message());\n"
    "  return e == HK_ERR_NO_DRIVER && b == HK_ERR_INVALID && !k(1, 1)(nullptr, 1).ok() ? 0 : 1;\n"
    "}\n";

/* Starts a runtime with canary runs and isolated builds, helper paths left
 * to the library: on the loadable fake driver both helpers start, or
 * creation fails, its report naming the path tried. */
static const char helpers_src[] =
    "#include <hotkern/hotkern.h>\n"
    "#include <stdio.h>\n"
    "int main(void) {\n"
    "  hk_options o;\n"
    "  hk_options_init(&o);\n"
    "  o.canary = 1;\n"
    "  o.build_isolated = 1;\n"
    "  o.no_warm_start = 1;\n"
    "  o.cache_dir = \"\";\n"
    "  hk_runtime *rt;\n"
    "  hk_report rep = HK_REPORT_INIT;\n"
    "  int e = hk_runtime_create(&rt, &o, &rep);\n"
    "  if (e) {\n"
    "    printf(\"create: %s: %s\\n\", hk_err_name(e), rep.message);\n"
    "    return 1;\n"
    "  }\n"
    "  hk_stats st = HK_STATS_INIT;\n"
    "  hk_stats_get(rt, &st);\n"
    "  printf(\"canary helper starts: %llu\\n\", (unsigned long long)st.canary_helper_starts);\n"
    "  hk_runtime_destroy(rt);\n"
    "  return st.canary_helper_starts == 1 ? 0 : 1;\n"
    "}\n";

/* A kernel for `hotkern check`. */
static const char kernel_src[] = "extern \"C\" __global__ void step(float *x) { *x += 1; }\n";

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
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    ck_assert_int_lt(n, (int)sizeof cmd);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Writes DIR/NAME. */
static void put_in(const char *dir, const char *name, const char *text) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ck_assert_int_eq(hkt_write_file(p, text), 0);
}

/* Writes dest/NAME. */
static void put(const char *name, const char *text) {
    put_in(dest, name, text);
}

/* What lies under DIR, every file's and link's path, size or target and
 * content hash, into OUT: two installs compare equal when this does. */
static int snapshot(const char *dir, const char *out) {
    return sh("cd '%s' && find . -type l -printf '%%p -> %%l\\n' | sort >'%s' && "
              "find . -type f -printf '%%p %%m\\n' | sort >>'%s' && "
              "find . -type f -print0 | sort -z | xargs -0 sha256sum >>'%s'",
              dir, out, out, out);
}

/* ---- the full install ------------------------------------------------- */

/* Installs once for the whole test case (the fixture runs in the parent,
 * before the tests fork). A failed install leaves dest empty; each test then
 * fails. */
static void install(void) {
    locate();
    char *d = hkt_tmpdir();
    ck_assert_ptr_nonnull(d);
    snprintf(dest, sizeof dest, "%s", d);
    free(d);
    snprintf(pre, sizeof pre, "%s%s", dest, HK_PREFIX);
    snprintf(lib, sizeof lib, "%s/" LIBSUB, pre);
    if (sh("make -s -C '%s' BUILD='%s' install " FULL_VARS " DESTDIR='%s' >%s/install.log 2>&1",
           root, build, dest, dest)) {
        sh("cat '%s/install.log'", dest);
        hkt_rmtree(dest);
        dest[0] = 0;
    }
}

static void uninstall(void) {
    if (dest[0])
        hkt_rmtree(dest);
}

START_TEST(installs_both_libraries_headers_and_packages) {
    ck_assert_msg(dest[0], "make install failed");
    const char *files[] = {"include/hotkern/hotkern.h",
                           "include/hotkern/net.h",
                           "include/hotkern/hotkern.hpp",
                           "include/hotkern/interpose.h",
                           LIBSUB "/libhotkern.a",
                           LIBSUB "/libhotkern.so.1",
                           LIBSUB "/libhotkern.so",
                           LIBSUB "/libhotkern-net.a",
                           LIBSUB "/libhotkern-net.so.1",
                           LIBSUB "/libhotkern-net.so",
                           LIBSUB "/libhotkern-preload.so",
                           LIBSUB "/libhotkern-wrap.a",
                           LIBSUB "/libhotkern-fakecuda.so",
                           LIBSUB "/pkgconfig/hotkern.pc",
                           LIBSUB "/pkgconfig/hotkern-net.pc",
                           LIBSUB "/pkgconfig/hotkern-wrap.pc",
                           LIBSUB "/cmake/hotkern/hotkernConfig.cmake",
                           LIBSUB "/cmake/hotkern/hotkernConfigVersion.cmake",
                           "bin/hotkern",
                           "libexec/hotkern/hotkern-canary",
                           "libexec/hotkern/hotkern-build",
                           "share/man/man1/hotkern.1",
                           "share/man/man3/hotkern.3"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[PATH_MAX + 256];
        snprintf(p, sizeof p, "%s/%s", pre, files[i]);
        ck_assert_msg(access(p, R_OK) == 0, "%s not installed", files[i]);
    }
    /* The helpers are the library's, not commands. */
    ck_assert_int_ne(sh("ls '%s/bin/hotkern-canary' '%s/bin/hotkern-build' 2>/dev/null", pre, pre),
                     0);
    ck_assert_int_eq(
        sh("cd '%s' && [ \"$(ls bin)\" = hotkern ] && "
           "[ -x libexec/hotkern/hotkern-canary ] && [ -x libexec/hotkern/hotkern-build ]",
           pre),
        0);
    /* The sonames, and the network library's dependency on the engine. */
    ck_assert_int_eq(
        sh("readelf -d '%s/libhotkern.so.1' | grep -q 'SONAME.*\\[libhotkern.so.1\\]'", lib), 0);
    ck_assert_int_eq(sh("readelf -d '%s/libhotkern-net.so.1' | grep -q "
                        "'SONAME.*\\[libhotkern-net.so.1\\]'",
                        lib),
                     0);
    ck_assert_int_eq(
        sh("readelf -d '%s/libhotkern-net.so.1' | grep -q 'NEEDED.*\\[libhotkern.so.1\\]'", lib),
        0);
    /* The engine's package names none of the network packages; the package
     * files say where LIBDIR and the helpers went. */
    ck_assert_int_eq(sh("grep -Eq " NET_LIBS_RE " '%s/pkgconfig/hotkern.pc'", lib), 1);
    ck_assert_int_eq(
        sh(PKG_ENV " pkg-config --print-requires hotkern-net | grep -q '^hotkern'", lib, dest), 0);
    ck_assert_int_eq(sh("PKG_CONFIG_PATH='%s/pkgconfig' pkg-config --variable=libdir hotkern | "
                        "grep -qx '" HK_PREFIX "/" LIBSUB "' && "
                        "PKG_CONFIG_PATH='%s/pkgconfig' pkg-config --variable=helperdir hotkern | "
                        "grep -qx '" HK_LIBEXECDIR "/hotkern'",
                        lib, lib),
                     0);
}
END_TEST

START_TEST(core_consumer_needs_no_network_library) {
    ck_assert_msg(dest[0], "make install failed");
    put("core.c", core_src);
    ck_assert_int_eq(sh("cd '%s' && cc core.c -o core $(" PKG_ENV
                        " pkg-config --cflags --libs hotkern) >cc-core.log 2>&1 || "
                        "{ cat cc-core.log; exit 1; }",
                        dest, lib, dest),
                     0);
    ck_assert_int_eq(sh("cd '%s' && " RUN_ENV " ./core >run-core.log 2>&1 || "
                        "{ cat run-core.log; exit 1; }",
                        dest, lib),
                     0);
    /* It ran against the installed shared library, not a static copy. */
    ck_assert_int_eq(sh("cd '%s' && LD_LIBRARY_PATH='%s' ldd core | grep -q "
                        "'libhotkern.so.1 => %s/'",
                        dest, lib, lib),
                     0);
    /* Nothing of the network sources, directly or through libhotkern.so.1. */
    ck_assert_int_eq(sh("cd '%s' && LD_LIBRARY_PATH='%s' ldd core | grep -E " NET_LIBS_RE
                        " && exit 1 || exit 0",
                        dest, lib),
                     0);
    ck_assert_int_eq(sh("cd '%s' && readelf -d core '%s/libhotkern.so.1' | grep NEEDED | "
                        "grep -E " NET_LIBS_RE " && exit 1 || exit 0",
                        dest, lib),
                     0);
    ck_assert_int_eq(sh("readelf -d '%s/libhotkern.so.1' | grep -q NEEDED.*libnvrtc", lib), 0);
}
END_TEST

START_TEST(net_consumer_links_and_runs) {
    ck_assert_msg(dest[0], "make install failed");
    put("net.c", net_src);
    ck_assert_int_eq(sh("cd '%s' && cc net.c -o net $(" PKG_ENV
                        " pkg-config --cflags --libs hotkern-net) >cc-net.log 2>&1 || "
                        "{ cat cc-net.log; exit 1; }",
                        dest, lib, dest),
                     0);
    ck_assert_int_eq(sh("cd '%s' && " RUN_ENV " ./net >run-net.log 2>&1 || "
                        "{ cat run-net.log; exit 1; }",
                        dest, lib),
                     0);
    ck_assert_int_eq(sh("cd '%s' && LD_LIBRARY_PATH='%s' ldd net | grep -q "
                        "'libhotkern-net.so.1 => %s/'",
                        dest, lib, lib),
                     0);
}
END_TEST

START_TEST(cpp_consumer_builds_and_runs) {
    ck_assert_msg(dest[0], "make install failed");
    put("cpp.cc", cpp_src);
    ck_assert_int_eq(sh("cd '%s' && c++ -std=c++17 -Wall -Wextra -Werror cpp.cc -o cpp $(" PKG_ENV
                        " pkg-config --cflags --libs hotkern) >cc-cpp.log 2>&1 || "
                        "{ cat cc-cpp.log; exit 1; }",
                        dest, lib, dest),
                     0);
    ck_assert_int_eq(sh("cd '%s' && " RUN_ENV " ./cpp >run-cpp.log 2>&1 || "
                        "{ cat run-cpp.log; exit 1; }",
                        dest, lib),
                     0);
    ck_assert_int_eq(sh("cd '%s' && LD_LIBRARY_PATH='%s' ldd cpp | grep -q "
                        "'libhotkern.so.1 => %s/'",
                        dest, lib, lib),
                     0);
}
END_TEST

/* Under `make sanitize` / `make tsan` the installed libraries carry the
 * sanitizer: the nvcc programs, and those linking the static archives, link
 * its runtime too. */
#if defined(__SANITIZE_THREAD__)
#define NVCC_SAN " -Xcompiler=-fsanitize=thread"
#define LD_SAN   "-fsanitize=thread"
#elif defined(__SANITIZE_ADDRESS__)
#define NVCC_SAN " -Xcompiler=-fsanitize=address -Xcompiler=-fsanitize=undefined"
#define LD_SAN   "-fsanitize=address -fsanitize=undefined"
#else
#define NVCC_SAN ""
#define LD_SAN   ""
#endif
#define NVCC "/usr/local/cuda/bin/nvcc -arch=sm_90" NVCC_SAN

static int have_cmake(const char *what) {
    if (sh("command -v cmake >/dev/null 2>&1") == 0)
        return 1;
    printf("SKIP install: cmake not found, %s is not tested\n", what);
    return 0;
}

#define NO_ASAN "ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0 "

START_TEST(cmake_consumers_build_and_run) {
    ck_assert_msg(dest[0], "make install failed");
    if (!have_cmake("the CMake package"))
        return;
    ck_assert_int_eq(sh("mkdir -p '%s/cm' '%s/cm-new'", dest, dest), 0);
    put("cm/core.c", core_src);
    put("cm/net.c", net_src);
    put("cm/cpp.cc", cpp_src);
    put("cm/CMakeLists.txt", "cmake_minimum_required(VERSION 3.16)\n"
                             "project(consumer C CXX)\n"
                             "find_package(hotkern 1.0 REQUIRED COMPONENTS core net)\n"
                             "add_executable(core core.c)\n"
                             "target_link_libraries(core PRIVATE hotkern::hotkern)\n"
                             "add_executable(core_static core.c)\n"
                             "target_link_libraries(core_static PRIVATE hotkern::hotkern_static)\n"
                             "add_executable(net net.c)\n"
                             "target_link_libraries(net PRIVATE hotkern::net)\n"
                             "add_executable(net_static net.c)\n"
                             "target_link_libraries(net_static PRIVATE hotkern::net_static)\n"
                             "add_executable(cpp cpp.cc)\n"
                             "target_compile_features(cpp PRIVATE cxx_std_17)\n"
                             "target_link_libraries(cpp PRIVATE hotkern::hotkern)\n");
    ck_assert_int_eq(sh("cd '%s' && cmake -S cm -B cm/build -DCMAKE_PREFIX_PATH='%s' "
                        "-DCMAKE_EXE_LINKER_FLAGS='" LD_SAN "' "
                        ">cmake.log 2>&1 && cmake --build cm/build >>cmake.log 2>&1 || "
                        "{ cat cmake.log; exit 1; }",
                        dest, pre),
                     0);
    /* The imported locations are the installed libraries: the programs find
     * them by the build RPATH CMake gives them, without LD_LIBRARY_PATH. */
    ck_assert_int_eq(sh("cd '%s/cm/build' && ldd core | grep -q 'libhotkern.so.1 => %s/' && "
                        "ldd net | grep -q 'libhotkern-net.so.1 => %s/' && "
                        "ldd net | grep -q 'libhotkern.so.1 => %s/'",
                        dest, lib, lib, lib),
                     0);
    ck_assert_int_eq(
        sh("cd '%s/cm/build' && ldd core | grep -E " NET_LIBS_RE " && exit 1 || exit 0", dest), 0);
    /* The static targets hold the engine (and the network sources) in the
     * program, with what they need linked after them. */
    ck_assert_int_eq(sh("cd '%s/cm/build' && readelf -d core_static net_static | grep NEEDED | "
                        "grep libhotkern && exit 1 || exit 0",
                        dest),
                     0);
    ck_assert_int_eq(sh("cd '%s/cm/build' && nm core_static | grep -q ' T hk_runtime_create$' && "
                        "nm net_static | grep -q ' T hk_endpoint_start$' && "
                        "readelf -d net_static | grep -q 'NEEDED.*libmicrohttpd'",
                        dest),
                     0);
    ck_assert_int_eq(sh("cd '%s/cm/build' && HK_LIBCUDA=/nonexistent/libcuda.so.1 " NO_ASAN
                        "./core && HK_LIBCUDA=/nonexistent/libcuda.so.1 " NO_ASAN
                        "./core_static && " NO_ASAN "./net && " NO_ASAN "./net_static && "
                        "HK_LIBCUDA=/nonexistent/libcuda.so.1 " NO_ASAN "./cpp",
                        dest),
                     0);
    /* The version check, on the package file itself (a project without
     * languages has no library architecture to look in LIBDIR with): this
     * major version is accepted, also where there is no pointer size to
     * check; a newer major version than installed is refused, and so is an
     * older one: 0.x had another ABI (no size in its structures). */
    const char *wants[] = {"1.0", "2", "0.2"};
    for (int i = 0; i < 3; i++) {
        char text[256];
        snprintf(text, sizeof text,
                 "cmake_minimum_required(VERSION 3.16)\n"
                 "project(consumer NONE)\n"
                 "find_package(hotkern %s REQUIRED)\n",
                 wants[i]);
        put("cm-new/CMakeLists.txt", text);
        int rc = sh("cd '%s' && rm -rf cm-new/build && cmake -S cm-new -B cm-new/build "
                    "-Dhotkern_DIR='%s/cmake/hotkern' >cmake-version.log 2>&1",
                    dest, lib);
        if (i == 0)
            ck_assert_msg(rc == 0, "find_package(hotkern 1.0) failed");
        else
            ck_assert_msg(
                rc != 0 &&
                    sh("grep -q 'considered but not accepted' '%s/cmake-version.log'", dest) == 0,
                "find_package(hotkern %s) was not refused for its version", wants[i]);
    }
}
END_TEST

/* Only the public prefix (and the version nodes: NODE, NODE.0 ...) leaves a
 * shared library; each exports its own header's functions and not the
 * other's, `has` under its release's node (the default) and under NODE. */
static void exports_only(const char *so, const char *node, const char *has, const char *has_node,
                         const char *lacks) {
    ck_assert_int_eq(sh("nm -D --defined-only '%s/%s' | awk '{print $3}' | "
                        "grep -v '^hk_' | grep -v '^_' | grep -v -E '^%s(\\.[0-9]+)?$' | grep . && "
                        "exit 1 || exit 0",
                        lib, so, node),
                     0);
    ck_assert_int_eq(
        sh("nm -D --defined-only '%s/%s' | grep -q ' %s@@%s$'", lib, so, has, has_node), 0);
    ck_assert_int_eq(sh("nm -D --defined-only '%s/%s' | grep -q ' %s@%s$'", lib, so, has, node), 0);
    ck_assert_int_eq(sh("nm -D --defined-only '%s/%s' | grep -q ' %s@'", lib, so, lacks), 1);
}

START_TEST(exports_only_hk_symbols) {
    ck_assert_msg(dest[0], "make install failed");
    exports_only("libhotkern.so.1", "HOTKERN_1", "hk_swap", "HOTKERN_1.0", "hk_endpoint_start");
    exports_only("libhotkern-net.so.1", "HOTKERN_NET_1", "hk_endpoint_start", "HOTKERN_NET_1.0",
                 "hk_swap");
}
END_TEST

START_TEST(nvcc_program_links_the_interposition) {
    ck_assert_msg(dest[0], "make install failed");
    put("app.cu", nvcc_src);
    /* Static cudart, --wrap from pkg-config. */
    ck_assert_int_eq(sh("cd '%s' && " NVCC " -o app-static app.cu $(" PKG_ENV
                        " pkg-config --cflags hotkern-wrap) $(" PKG_ENV
                        " pkg-config --variable=nvcc_libs hotkern-wrap) >nvcc-static.log 2>&1 || "
                        "{ cat nvcc-static.log; exit 1; }",
                        dest, lib, dest, lib, dest),
                     0);
    ck_assert_int_eq(sh("cd '%s' && HK_LIBCUDA=/nonexistent/libcuda.so.1 ./app-static "
                        ">run-static.log 2>&1; cat run-static.log; grep -q '" NOT_ENABLED
                        "' run-static.log && grep -q 'app ran' run-static.log",
                        dest),
                     0);
    /* -cudart shared, LD_PRELOAD. */
    ck_assert_int_eq(sh("cd '%s' && " NVCC " -cudart shared -o app-shared app.cu "
                        "-Xlinker -rpath=/usr/local/cuda/lib64 >nvcc-shared.log 2>&1 || "
                        "{ cat nvcc-shared.log; exit 1; }",
                        dest),
                     0);
    ck_assert_int_eq(
        sh("cd '%s' && HK_LIBCUDA=/nonexistent/libcuda.so.1 " NO_ASAN "LD_PRELOAD=\"$(" PKG_ENV
           " pkg-config --variable=preload hotkern-wrap)\" "
           "./app-shared >run-shared.log 2>&1; cat run-shared.log; grep -q '" NOT_ENABLED
           "' run-shared.log && grep -q 'app ran' run-shared.log",
           dest, lib, dest),
        0);
    /* Without the preload, the same binary is the program alone. */
    ck_assert_int_eq(
        sh("cd '%s' && ./app-shared 2>&1 | grep -q 'hotkern' && exit 1 || exit 0", dest), 0);
}
END_TEST

START_TEST(cmake_enables_hot_reload) {
    ck_assert_msg(dest[0], "make install failed");
    if (!have_cmake("hotkern_enable_hot_reload"))
        return;
    ck_assert_int_eq(sh("mkdir -p '%s/cm-cuda'", dest), 0);
    put("cm-cuda/app.cu", nvcc_src);
    put("cm-cuda/CMakeLists.txt", "cmake_minimum_required(VERSION 3.18)\n"
                                  "project(game CUDA)\n"
                                  "find_package(hotkern 1.0 REQUIRED)\n"
                                  "add_executable(game app.cu)\n"
                                  "hotkern_enable_hot_reload(game)\n");
    ck_assert_int_eq(sh("cd '%s' && cmake -S cm-cuda -B cm-cuda/build -DCMAKE_PREFIX_PATH='%s' "
                        "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc "
                        "-DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_FLAGS='" NVCC_SAN "' "
                        /* CMake links CUDA programs with the host compiler, which
                         * needs the sanitizer's runtime named too. */
                        "-DCMAKE_EXE_LINKER_FLAGS='" LD_SAN "' "
                        ">cmake-cuda.log 2>&1 && "
                        "cmake --build cm-cuda/build >>cmake-cuda.log 2>&1 || "
                        "{ cat cmake-cuda.log; exit 1; }",
                        dest, pre),
                     0);
    ck_assert_int_eq(sh("cd '%s/cm-cuda/build' && HK_LIBCUDA=/nonexistent/libcuda.so.1 ./game "
                        ">run.log 2>&1; cat run.log; grep -q '" NOT_ENABLED "' run.log",
                        dest),
                     0);
}
END_TEST

START_TEST(preload_exports_runtime_entry_points_and_hk_only) {
    ck_assert_msg(dest[0], "make install failed");
    ck_assert_int_eq(
        sh("nm -D --defined-only '%s/libhotkern-preload.so' | awk '{print $3}' "
           "| grep -Ev "
           "'^(hk_|__cudaLaunchKernel|__cudaRegister(Var|FatBinary|FatBinaryEnd|Function)$|"
           "__cudaUnregisterFatBinary|__cudaGetKernel|cuda(LaunchKernel|"
           "MemcpyToSymbol|MemcpyFromSymbol|GetSymbolAddress|"
           "LaunchCooperativeKernel|FuncSetAttribute|FuncSetCacheConfig|"
           "KernelSetAttributeForDevice|FuncGetAttributes|"
           "OccupancyMaxActiveBlocksPerMultiprocessor|"
           /* automatic safe points (interpose/sync.c) */
           "DeviceSynchronize$|Stream(Synchronize|Query)(_ptsz)?$|StreamDestroy$|"
           "Event(Synchronize|Query)$|Memcpy(_ptds)?$))' | grep . && exit 1 || "
           "exit 0",
           lib),
        0);
    ck_assert_int_eq(sh("nm -D --defined-only '%s/libhotkern-preload.so' | "
                        "grep -q ' __cudaLaunchKernel$'",
                        lib),
                     0);
}
END_TEST

/* man -l renders PAGE with no warning, and its text has each WORD. */
static void renders(const char *page, const char *const *words, size_t n) {
    ck_assert_int_eq(sh("MANWIDTH=80 man --warnings -l '%s' 2>&1 >/dev/null | grep . && exit 1 || "
                        "exit 0",
                        page),
                     0);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(sh("MANWIDTH=80 man -l '%s' 2>/dev/null | grep -q -- '%s'", page, words[i]) ==
                          0,
                      "%s: no '%s'", page, words[i]);
}

START_TEST(man_pages_render) {
    ck_assert_msg(dest[0], "make install failed");
    if (sh("command -v man >/dev/null 2>&1")) {
        printf("SKIP install: man not found, the man pages are not rendered\n");
        return;
    }
    char page[sizeof pre + 64];
    const char *cli[] = {"HOTKERN(1)",   "hotkern check",     "hotkern keygen",   "hotkern sign",
                         "hotkern push", "hotkern status",    "hotkern rollback", "hotkern pull",
                         "--json",       "--name-expression", "HOTKERN_TOKEN"};
    snprintf(page, sizeof page, "%s/share/man/man1/hotkern.1", pre);
    renders(page, cli, sizeof cli / sizeof cli[0]);
    const char *api[] = {"HOTKERN(3)",    "hk_runtime_create", "hk_swap",
                         "HK_ERR_LAYOUT", "hk_endpoint_start", "hk_interpose_attach",
                         "canary_helper"};
    snprintf(page, sizeof page, "%s/share/man/man3/hotkern.3", pre);
    renders(page, api, sizeof api / sizeof api[0]);
    /* A page per subject, and `man FUNCTION` finds it through its link. */
    const char *swap[] = {"HOTKERN-SWAP(3)", "hk_swap_options", "hk_rollback_release", "VERSIONS",
                          "hotkern 1.2"};
    snprintf(page, sizeof page, "%s/share/man/man3/hotkern-swap.3", pre);
    renders(page, swap, sizeof swap / sizeof swap[0]);
    ck_assert_int_eq(
        sh("MANPATH='%s/share/man' MANWIDTH=80 man hk_swap 2>&1 | "
           "grep -q 'HOTKERN-SWAP(3)' && MANPATH='%s/share/man' MANWIDTH=80 man "
           "hk_endpoint_start 2>&1 | grep -q 'HOTKERN-NET(3)' && MANPATH='%s/share/man' "
           "MANWIDTH=80 man hk_watch_options 2>&1 | grep -q 'HOTKERN-WATCH(3)'",
           pre, pre, pre),
        0);
    /* (man -l reads a link's .so from the current directory, a man tree's root.) */
    ck_assert_int_eq(sh("cd '%s/share/man' && for p in man3/hk_*.3; do "
                        "man --warnings -l \"$p\" 2>&1 >/dev/null | grep . && exit 1; done; exit 0",
                        pre),
                     0);
}
END_TEST

/* From a multiarch LIBDIR, ../libexec is not the tree's: the library falls
 * back to the LIBEXECDIR it was built for (not where this tree is staged),
 * and says so; the environment points it at the staged helpers. */
START_TEST(helpers_fall_back_to_libexecdir) {
    ck_assert_msg(dest[0], "make install failed");
    put("helpers.c", helpers_src);
    /* (It starts threads: under `make tsan` it must be built with TSan.) */
    ck_assert_int_eq(sh("cd '%s' && cc " LD_SAN " helpers.c -o helpers $(" PKG_ENV
                        " pkg-config --cflags --libs hotkern) >cc-helpers.log 2>&1 || "
                        "{ cat cc-helpers.log; exit 1; }",
                        dest, lib, dest),
                     0);
#define FAKE_ENV NO_ASAN "HK_LIBCUDA='%s/libhotkern-fakecuda.so' LD_LIBRARY_PATH='%s' "
    if (access(HK_LIBEXECDIR "/hotkern/hotkern-build", X_OK) &&
        access(HK_LIBEXECDIR "/hotkern/hotkern-canary", X_OK))
        ck_assert_int_eq(
            sh("cd '%s' && " FAKE_ENV "./helpers >run-helpers.log 2>&1; "
               "cat run-helpers.log; grep -q 'cannot start the .* helper " HK_LIBEXECDIR
               "/hotkern/hotkern-' run-helpers.log",
               dest, lib, lib),
            0);
    else
        printf("install: helpers are installed in " HK_LIBEXECDIR "/hotkern on this machine: "
               "the fallback's failure is not tested\n");
    ck_assert_int_eq(sh("cd '%s' && HK_CANARY_HELPER='%s/libexec/hotkern/hotkern-canary' "
                        "HK_BUILD_HELPER='%s/libexec/hotkern/hotkern-build' " FAKE_ENV
                        "./helpers >run-helpers-env.log 2>&1 || "
                        "{ cat run-helpers-env.log; exit 1; }",
                        dest, pre, pre, lib, lib),
                     0);
}
END_TEST

START_TEST(install_again_changes_nothing) {
    ck_assert_msg(dest[0], "make install failed");
    char a[PATH_MAX + 16], b[PATH_MAX + 16];
    snprintf(a, sizeof a, "%s/tree-1", dest);
    snprintf(b, sizeof b, "%s/tree-2", dest);
    ck_assert_int_eq(snapshot(pre, a), 0);
    ck_assert_int_eq(sh("make -s -C '%s' BUILD='%s' install " FULL_VARS
                        " DESTDIR='%s' >%s/install-2.log 2>&1 || { cat %s/install-2.log; exit 1; }",
                        root, build, dest, dest, dest),
                     0);
    ck_assert_int_eq(snapshot(pre, b), 0);
    ck_assert_int_eq(sh("diff '%s' '%s'", a, b), 0);
}
END_TEST

/* Last: the tree goes. */
START_TEST(uninstall_leaves_no_file) {
    ck_assert_msg(dest[0], "make install failed");
    ck_assert_int_gt(sh("exit $(find '%s' -type f | wc -l)", pre), 20);
    ck_assert_int_eq(sh("make -s -C '%s' BUILD='%s' uninstall " FULL_VARS
                        " DESTDIR='%s' >%s/uninstall.log 2>&1 || { cat %s/uninstall.log; exit 1; }",
                        root, build, dest, dest, dest),
                     0);
    ck_assert_int_eq(sh("find '%s' ! -type d | grep . && exit 1 || exit 0", pre), 0);
    ck_assert_int_eq(sh("cd '%s' && ls -d include/hotkern " LIBSUB "/cmake/hotkern libexec/hotkern "
                        "2>/dev/null | grep . && exit 1 || exit 0",
                        pre),
                     0);
}
END_TEST

/* ---- the core-only install (NET=0, found) ------------------------------- */

/* Builds and installs from scratch where pkg-config knows libsodium alone,
 * after a dry run of the same; a failure leaves core empty. */
static void install_core(void) {
    locate();
    char *d = hkt_tmpdir();
    ck_assert_ptr_nonnull(d);
    snprintf(core, sizeof core, "%s", d);
    free(d);
    if (sh("mkdir -p '%s/pc' '%s/work' && ln -s \"$(pkg-config --variable=pcfiledir libsodium)"
           "/libsodium.pc\" '%s/pc/'",
           core, core, core) ||
        sh(CORE_MAKE " -n install >'%s/dry-run.log' 2>&1", core, root, core, core, core) ||
        sh(CORE_MAKE " -j2 install >'%s/install.log' 2>&1", core, root, core, core, core)) {
        sh("cat '%s/install.log'", core);
        hkt_rmtree(core);
        core[0] = 0;
    }
}

static void uninstall_core(void) {
    if (core[0])
        hkt_rmtree(core);
}

/* Takes core once: pkg-config pointed at the core-only tree. */
#define CORE_PKG "PKG_CONFIG_PATH='%1$s/root/usr/lib/pkgconfig' PKG_CONFIG_SYSROOT_DIR='%1$s/root'"

START_TEST(core_build_leaves_the_network_out) {
    ck_assert_msg(core[0], "the core-only make install failed");
    /* It said so, once, and why. */
    ck_assert_int_eq(
        sh("grep -c 'hotkern: NET=0 (pkg-config lacks libcurl libmicrohttpd libcjson)' "
           "'%s/install.log' | grep -qx 1",
           core),
        0);
    /* The dry run is the whole build (compiles, links, installs), and none of
     * its commands names the network packages. */
    ck_assert_int_eq(sh("cd '%s' && grep -q -- '-c loader/swap.c' dry-run.log && "
                        "grep -q -- '-soname,libhotkern.so.1' dry-run.log && "
                        "grep -q 'install -m 755 .*hotkern-canary' dry-run.log",
                        core),
                     0);
    ck_assert_int_eq(sh("cd '%s' && grep -v '^hotkern: NET=0' dry-run.log | "
                        "grep -Ei 'curl|microhttpd|cjson' && exit 1 || exit 0",
                        core),
                     0);
    /* What it installed: the engine, the interposition, the helpers, the
     * fake driver, their package files and the man pages of their headers
     * (hotkern(3), a page per subject, a link per function and type); no
     * net.h, no page of it, no network library, and no CLI (it needs
     * libcjson). */
    put_in(core, "expected.files",
           "./usr/include/hotkern/canary.h\n"
           "./usr/include/hotkern/check.h\n"
           "./usr/include/hotkern/hotkern.h\n"
           "./usr/include/hotkern/hotkern.hpp\n"
           "./usr/include/hotkern/interpose.h\n"
           "./usr/include/hotkern/launch.h\n"
           "./usr/include/hotkern/lkg.h\n"
           "./usr/include/hotkern/metrics.h\n"
           "./usr/include/hotkern/watch.h\n"
           "./usr/lib/cmake/hotkern/hotkernConfig.cmake\n"
           "./usr/lib/cmake/hotkern/hotkernConfigVersion.cmake\n"
           "./usr/lib/libhotkern-fakecuda.so\n"
           "./usr/lib/libhotkern-preload.so\n"
           "./usr/lib/libhotkern-wrap.a\n"
           "./usr/lib/libhotkern.a\n"
           "./usr/lib/libhotkern.so\n"
           "./usr/lib/libhotkern.so.1\n"
           "./usr/lib/pkgconfig/hotkern-wrap.pc\n"
           "./usr/lib/pkgconfig/hotkern.pc\n"
           "./usr/libexec/hotkern/hotkern-build\n"
           "./usr/libexec/hotkern/hotkern-canary\n");
    ck_assert_int_eq(sh("cd '%s/docs/man/man3' && { cat '%s/expected.files'; for p in *.3; do "
                        "[ $p = hotkern-net.3 ] || grep -qx '.so man3/hotkern-net.3' $p || "
                        "echo ./usr/share/man/man3/$p; done; } | LC_ALL=C sort >'%s/expected'",
                        root, core, core),
                     0);
    ck_assert_int_eq(
        sh("cd '%s/root' && find . ! -type d | LC_ALL=C sort | diff ../expected -", core), 0);
    ck_assert_int_eq(sh("cd '%s/root/usr/share/man/man3' && [ -f hk_swap.3 ] && "
                        "[ -f hotkern-watch.3 ] && [ ! -e hk_endpoint_start.3 ]",
                        core),
                     0);
    /* No installed program or library needs them, and no package file
     * links them. */
    ck_assert_int_eq(sh("cd '%s/root/usr' && for f in lib/*.so* libexec/hotkern/*; do "
                        "readelf -d $f | grep NEEDED; done | grep -E " NET_LIBS_RE
                        " && exit 1 || exit 0",
                        core),
                     0);
    ck_assert_int_eq(sh("cd '%s/root/usr' && readelf -d lib/libhotkern.so.1 | grep -q "
                        "'NEEDED.*libsodium' && readelf -d lib/libhotkern-preload.so | grep -q "
                        "'NEEDED.*libnvrtc'",
                        core),
                     0);
    ck_assert_int_eq(sh("grep -rE -- '-l(curl|microhttpd|cjson)|(libcurl|libmicrohttpd|libcjson)$' "
                        "'%s/root/usr/lib/pkgconfig' '%s/root/usr/lib/cmake' && exit 1 || exit 0",
                        core, core),
                     0);
}
END_TEST

START_TEST(core_pkg_config_consumer) {
    ck_assert_msg(core[0], "the core-only make install failed");
    put_in(core, "work/core.c", core_src);
    ck_assert_int_eq(sh("cd '%1$s/work' && cc core.c -o core $(" CORE_PKG
                        " pkg-config --cflags --libs hotkern) >cc-core.log 2>&1 || "
                        "{ cat cc-core.log; exit 1; }",
                        core),
                     0);
    ck_assert_int_eq(sh("cd '%1$s/work' && HK_LIBCUDA=/nonexistent/libcuda.so.1 "
                        "LD_LIBRARY_PATH='%1$s/root/usr/lib' ./core && "
                        "LD_LIBRARY_PATH='%1$s/root/usr/lib' ldd core | "
                        "grep -q 'libhotkern.so.1 => %1$s/root/usr/lib/'",
                        core),
                     0);
    /* hotkern-net is not there. */
    ck_assert_int_ne(sh(CORE_PKG " pkg-config --exists hotkern-net", core), 0);
}
END_TEST

START_TEST(core_cmake_shared_and_static) {
    ck_assert_msg(core[0], "the core-only make install failed");
    if (!have_cmake("the core-only CMake package"))
        return;
    ck_assert_int_eq(sh("mkdir -p '%s/work/cm'", core), 0);
    put_in(core, "work/cm/core.c", core_src);
    put_in(core, "work/cm/CMakeLists.txt",
           "cmake_minimum_required(VERSION 3.16)\n"
           "project(consumer C)\n"
           "find_package(hotkern 1.0 REQUIRED)\n"
           "if(hotkern_net_FOUND OR TARGET hotkern::net OR TARGET hotkern::net_static)\n"
           "  message(FATAL_ERROR \"the network component is not installed\")\n"
           "endif()\n"
           "add_executable(core core.c)\n"
           "target_link_libraries(core PRIVATE hotkern::hotkern)\n"
           "add_executable(core_static core.c)\n"
           "target_link_libraries(core_static PRIVATE hotkern::hotkern_static)\n");
    ck_assert_int_eq(sh("cd '%1$s/work' && cmake -S cm -B cm/build "
                        "-DCMAKE_PREFIX_PATH='%1$s/root/usr' >cmake.log 2>&1 && "
                        "cmake --build cm/build >>cmake.log 2>&1 || { cat cmake.log; exit 1; }",
                        core),
                     0);
    ck_assert_int_eq(sh("cd '%1$s/work/cm/build' && ldd core | "
                        "grep -q 'libhotkern.so.1 => %1$s/root/usr/lib/' && "
                        "readelf -d core_static | grep NEEDED | grep libhotkern && exit 1 || "
                        "HK_LIBCUDA=/nonexistent/libcuda.so.1 ./core && "
                        "HK_LIBCUDA=/nonexistent/libcuda.so.1 ./core_static",
                        core),
                     0);
}
END_TEST

START_TEST(core_cmake_net_component_fails_cleanly) {
    ck_assert_msg(core[0], "the core-only make install failed");
    if (!have_cmake("the core-only CMake package"))
        return;
    ck_assert_int_eq(sh("mkdir -p '%s/work/cm-net'", core), 0);
    /* Required: configuring fails, saying why. */
    put_in(core, "work/cm-net/CMakeLists.txt",
           "cmake_minimum_required(VERSION 3.16)\n"
           "project(consumer NONE)\n"
           "find_package(hotkern 1.0 REQUIRED COMPONENTS net)\n");
    ck_assert_int_ne(sh("cd '%1$s/work' && cmake -S cm-net -B cm-net/b1 "
                        "-DCMAKE_PREFIX_PATH='%1$s/root/usr' >cmake-net.log 2>&1",
                        core),
                     0);
    ck_assert_int_eq(sh("cd '%s/work' && tr -s ' \\n' ' ' <cmake-net.log | grep -q "
                        "'component net is not installed .* without the network library' || "
                        "{ cat cmake-net.log; exit 1; }",
                        core),
                     0);
    /* Not required: hotkern_FOUND is false and configuring goes on; as an
     * optional component, the rest is found. */
    put_in(core, "work/cm-net/CMakeLists.txt",
           "cmake_minimum_required(VERSION 3.16)\n"
           "project(consumer NONE)\n"
           "find_package(hotkern 1.0 QUIET COMPONENTS net)\n"
           "message(STATUS \"asked: found=${hotkern_FOUND}\")\n"
           "find_package(hotkern 1.0 REQUIRED OPTIONAL_COMPONENTS net)\n"
           "message(STATUS \"optional: found=${hotkern_FOUND} net=${hotkern_net_FOUND}\")\n"
           "if(NOT TARGET hotkern::hotkern OR TARGET hotkern::net)\n"
           "  message(FATAL_ERROR \"targets\")\n"
           "endif()\n");
    ck_assert_int_eq(sh("cd '%1$s/work' && cmake -S cm-net -B cm-net/b2 "
                        "-DCMAKE_PREFIX_PATH='%1$s/root/usr' >cmake-net2.log 2>&1 && "
                        "grep -q 'asked: found=0' cmake-net2.log && "
                        "grep -q 'optional: found=1 net=FALSE' cmake-net2.log || "
                        "{ cat cmake-net2.log; exit 1; }",
                        core),
                     0);
}
END_TEST

/* The helpers in ../libexec/hotkern, from the library (a program linking
 * libhotkern.so in LIBDIR) and from the program itself (one linking the
 * static library, installed in BINDIR): both start, as each runtime's
 * stats say; without the staged one, the runtime tries the LIBEXECDIR it
 * was built for (/usr/libexec), which shows the one that started was the
 * staged tree's. */
START_TEST(core_helpers_found_in_libexec) {
    ck_assert_msg(core[0], "the core-only make install failed");
    put_in(core, "work/helpers.c", helpers_src);
    ck_assert_int_eq(sh("cd '%1$s/work' && cc helpers.c -o helpers $(" CORE_PKG
                        " pkg-config --cflags --libs hotkern) >cc-helpers.log 2>&1 || "
                        "{ cat cc-helpers.log; exit 1; }",
                        core),
                     0);
    ck_assert_int_eq(sh("mkdir -p '%s/root/usr/bin'", core), 0);
    ck_assert_int_eq(sh("cd '%1$s/work' && cc helpers.c -o '%1$s/root/usr/bin/helpers-static' "
                        "$(PKG_CONFIG_PATH='%1$s/root/usr/lib/pkgconfig' pkg-config "
                        "--define-variable=prefix='%1$s/root/usr' --cflags --libs --static "
                        "hotkern | sed 's/-lhotkern /-l:libhotkern.a /') >cc-static.log 2>&1 || "
                        "{ cat cc-static.log; exit 1; }",
                        core),
                     0);
#define CORE_FAKE                                                                                  \
    "HK_LIBCUDA='%1$s/root/usr/lib/libhotkern-fakecuda.so' LD_LIBRARY_PATH='%1$s/root/usr/lib' "
    ck_assert_int_eq(sh("cd '%1$s/work' && " CORE_FAKE "./helpers >run.log 2>&1 && " CORE_FAKE
                        "'%1$s/root/usr/bin/helpers-static' >>run.log 2>&1 && "
                        "[ $(grep -c 'canary helper starts: 1' run.log) = 2 ] || "
                        "{ cat run.log; exit 1; }",
                        core),
                     0);
    ck_assert_int_eq(sh("readelf -d '%s/root/usr/bin/helpers-static' | grep NEEDED | "
                        "grep libhotkern && exit 1 || exit 0",
                        core),
                     0);
    if (access("/usr/libexec/hotkern", F_OK) == 0)
        printf("install: /usr/libexec/hotkern exists on this machine: the staged helpers' "
               "absence is not tested\n");
    else {
        const char *names[] = {"hotkern-canary", "hotkern-build"};
        for (int i = 0; i < 2; i++)
            ck_assert_int_eq(
                sh("cd '%1$s/work' && mv '%1$s/root/usr/libexec/hotkern/%2$s' . && "
                   "{ " CORE_FAKE "./helpers; " CORE_FAKE "'%1$s/root/usr/bin/helpers-static'; } "
                   ">run-%2$s.log 2>&1; mv %2$s '%1$s/root/usr/libexec/hotkern/' && "
                   "[ $(grep -c 'HK_ERR_IO: cannot start the .* helper /usr/libexec/hotkern/%2$s: "
                   "No such file' run-%2$s.log) = 2 ] || { cat run-%2$s.log; exit 1; }",
                   core, names[i]),
                0);
    }
    ck_assert_int_eq(sh("rm '%s/root/usr/bin/helpers-static'", core), 0);
}
END_TEST

/* The CLI of a NET=0 build where libcjson is found: check works, the
 * network commands say they are not built. */
START_TEST(core_cli_without_network_commands) {
    ck_assert_msg(core[0], "the core-only make install failed");
    ck_assert_int_eq(sh("env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C '%1$s' NET=0 "
                        "BUILD='%2$s/build' PREFIX=/usr '%2$s/build/bin/hotkern' >'%2$s/cli.log' "
                        "2>&1 || { cat '%2$s/cli.log'; exit 1; }",
                        root, core),
                     0);
    ck_assert_int_eq(sh("cd '%s/build/bin' && readelf -d hotkern | grep -q 'NEEDED.*libcjson' && "
                        "readelf -d hotkern | grep -E 'NEEDED.*(libcurl|libmicrohttpd|libhotkern)' "
                        "&& exit 1 || exit 0",
                        core),
                     0);
    put_in(core, "work/k.cu", kernel_src);
    ck_assert_int_eq(
        sh("cd '%1$s/work' && '%1$s/build/bin/hotkern' check k.cu | grep -q 'k.cu: ok' "
           "&& '%1$s/build/bin/hotkern' --help | grep -q 'Built without network "
           "support'",
           core),
        0);
    const char *cmds[] = {"keygen --out k",
                          "sign",
                          "publish",
                          "push http://127.0.0.1:1",
                          "status http://127.0.0.1:1",
                          "rollback http://127.0.0.1:1 m",
                          "pull http://127.0.0.1:1 --once"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        ck_assert_msg(sh("cd '%1$s/work' && '%1$s/build/bin/hotkern' %2$s 2>err.log; "
                         "[ $? = 1 ] && grep -q 'HK_ERR_UNSUPPORTED: built without network "
                         "support' err.log",
                         core, cmds[i]) == 0,
                      "hotkern %s", cmds[i]);
    ck_assert_int_eq(sh("cd '%s/work' && '%s/build/bin/hotkern' pull --json x >pull.json; "
                        "[ $? = 1 ] && grep -q '\"error\":\"HK_ERR_UNSUPPORTED\"' pull.json",
                        core, core),
                     0);
}
END_TEST

START_TEST(core_man_page_renders) {
    ck_assert_msg(core[0], "the core-only make install failed");
    if (sh("command -v man >/dev/null 2>&1")) {
        printf("SKIP install: man not found, the man pages are not rendered\n");
        return;
    }
    char page[PATH_MAX + 64];
    snprintf(page, sizeof page, "%s/root/usr/share/man/man3/hotkern.3", core);
    const char *api[] = {"HOTKERN(3)", "hk_runtime_create"};
    renders(page, api, 2);
}
END_TEST

START_TEST(core_install_again_changes_nothing) {
    ck_assert_msg(core[0], "the core-only make install failed");
    char a[PATH_MAX + 16], b[PATH_MAX + 16], r[PATH_MAX + 16];
    snprintf(a, sizeof a, "%s/tree-1", core);
    snprintf(b, sizeof b, "%s/tree-2", core);
    snprintf(r, sizeof r, "%s/root", core);
    ck_assert_int_eq(snapshot(r, a), 0);
    ck_assert_int_eq(
        sh(CORE_MAKE " install >'%s/install-2.log' 2>&1", core, root, core, core, core), 0);
    ck_assert_int_eq(snapshot(r, b), 0);
    ck_assert_int_eq(sh("diff '%s' '%s'", a, b), 0);
}
END_TEST

/* Last: the tree goes. */
START_TEST(core_uninstall_leaves_no_file) {
    ck_assert_msg(core[0], "the core-only make install failed");
    /* (The program core_helpers_found_in_libexec put there, had it failed
     * before removing it.) */
    ck_assert_int_eq(sh("rm -f '%s/root/usr/bin/helpers-static'", core), 0);
    ck_assert_int_eq(sh(CORE_MAKE " uninstall >'%s/uninstall.log' 2>&1 || "
                                  "{ cat '%s/uninstall.log'; exit 1; }",
                        core, root, core, core, core, core),
                     0);
    ck_assert_int_eq(sh("find '%s/root' ! -type d | grep . && exit 1 || exit 0", core), 0);
    ck_assert_int_eq(sh("cd '%s/root/usr' && ls -d include/hotkern lib/cmake/hotkern "
                        "libexec/hotkern 2>/dev/null | grep . && exit 1 || exit 0",
                        core),
                     0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("install");
    TCase *tc = tcase_create("install");
    tcase_set_timeout(tc, 300);
    tcase_add_unchecked_fixture(tc, install, uninstall);
    tcase_add_test(tc, installs_both_libraries_headers_and_packages);
    tcase_add_test(tc, core_consumer_needs_no_network_library);
    tcase_add_test(tc, net_consumer_links_and_runs);
    tcase_add_test(tc, cpp_consumer_builds_and_runs);
    tcase_add_test(tc, cmake_consumers_build_and_run);
    tcase_add_test(tc, exports_only_hk_symbols);
    tcase_add_test(tc, nvcc_program_links_the_interposition);
    tcase_add_test(tc, cmake_enables_hot_reload);
    tcase_add_test(tc, preload_exports_runtime_entry_points_and_hk_only);
    tcase_add_test(tc, man_pages_render);
    tcase_add_test(tc, helpers_fall_back_to_libexecdir);
    tcase_add_test(tc, install_again_changes_nothing);
    tcase_add_test(tc, uninstall_leaves_no_file);
    suite_add_tcase(s, tc);
    TCase *co = tcase_create("core");
    tcase_set_timeout(co, 300);
    tcase_add_unchecked_fixture(co, install_core, uninstall_core);
    tcase_add_test(co, core_build_leaves_the_network_out);
    tcase_add_test(co, core_pkg_config_consumer);
    tcase_add_test(co, core_cmake_shared_and_static);
    tcase_add_test(co, core_cmake_net_component_fails_cleanly);
    tcase_add_test(co, core_helpers_found_in_libexec);
    tcase_add_test(co, core_cli_without_network_commands);
    tcase_add_test(co, core_man_page_renders);
    tcase_add_test(co, core_install_again_changes_nothing);
    tcase_add_test(co, core_uninstall_leaves_no_file);
    suite_add_tcase(s, co);
    return hkt_run(s);
}

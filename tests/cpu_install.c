/*
 * Packaging: `make install` into a DESTDIR once (an unchecked fixture), then
 * programs outside the tree built against the installed libraries, the way a
 * user builds them:
 *   - a core-only program with `pkg-config --cflags --libs hotkern`, which
 *     must not pull in the network libraries (neither it nor libhotkern.so.1
 *     needs libcurl, libmicrohttpd or libcjson; libsodium hashes the compile
 *     cache and stays);
 *   - a program of the network sources with `pkg-config ... hotkern-net`;
 *   - a C++17 program of the typed-launch header (hotkern.hpp) with
 *     `pkg-config ... hotkern`;
 *   - all three again through the CMake package (find_package(hotkern),
 *     hotkern::hotkern and hotkern::net), SKIP when cmake is missing;
 * and each shared library's exported symbols checked (hk_ only); and an
 * ordinary nvcc program made hot-reloadable both ways: with static cudart
 * through pkg-config's nvcc_libs and through hotkern_enable_hot_reload() in
 * CMake, and with -cudart shared under LD_PRELOAD of the installed preload
 * library (without a driver each says once that it is not enabled and runs
 * the program's own code: the interposition is in place).
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

static char root[PATH_MAX], build[PATH_MAX], dest[PATH_MAX];

/* The libraries of the network sources: none of them may reach a core-only
 * program. */
#define NET_LIBS_RE "'libcurl|libmicrohttpd|libcjson'"

/* pkg-config pointed at the DESTDIR tree; the sysroot variable moves its -I/-L
 * there too. Takes dest twice. */
#define PKG_ENV "PKG_CONFIG_PATH='%s/usr/lib/pkgconfig' PKG_CONFIG_SYSROOT_DIR='%s'"

/* How the programs run: no driver, the installed libraries. Under `make
 * sanitize` those carry ASan, which then is not first in the program's library
 * list: tell ASan that is fine. Takes dest once. */
#define RUN_ENV                                                                                    \
    "HK_LIBCUDA=/nonexistent/libcuda.so.1 ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0 "   \
    "LD_LIBRARY_PATH='%s/usr/lib'"

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

/* Writes dest/NAME. */
static void put(const char *name, const char *text) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", dest, name);
    ck_assert_int_eq(hkt_write_file(p, text), 0);
}

/* Installs once for the whole suite (the fixture runs in the parent, before
 * the tests fork). A failed install leaves dest empty; each test then fails. */
static void install(void) {
    locate();
    char *d = hkt_tmpdir();
    ck_assert_ptr_nonnull(d);
    snprintf(dest, sizeof dest, "%s", d);
    free(d);
    if (sh("make -s -C '%s' BUILD='%s' install DESTDIR='%s' PREFIX=/usr >%s/install.log 2>&1", root,
           build, dest, dest)) {
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
    const char *files[] = {"usr/include/hotkern/hotkern.h",
                           "usr/include/hotkern/net.h",
                           "usr/include/hotkern/hotkern.hpp",
                           "usr/lib/libhotkern.a",
                           "usr/lib/libhotkern.so.1",
                           "usr/lib/libhotkern.so",
                           "usr/lib/libhotkern-net.a",
                           "usr/lib/libhotkern-net.so.1",
                           "usr/lib/libhotkern-net.so",
                           "usr/lib/pkgconfig/hotkern.pc",
                           "usr/lib/pkgconfig/hotkern-net.pc",
                           "usr/lib/cmake/hotkern/hotkernConfig.cmake",
                           "usr/lib/cmake/hotkern/hotkernConfigVersion.cmake",
                           "usr/bin/hotkern",
                           "usr/bin/hotkern-canary",
                           "usr/bin/hotkern-build",
                           "usr/include/hotkern/interpose.h",
                           "usr/lib/libhotkern-preload.so",
                           "usr/lib/libhotkern-wrap.a",
                           "usr/lib/pkgconfig/hotkern-wrap.pc"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[PATH_MAX + 64];
        snprintf(p, sizeof p, "%s/%s", dest, files[i]);
        ck_assert_msg(access(p, R_OK) == 0, "%s not installed", files[i]);
    }
    /* The sonames, and the network library's dependency on the engine. */
    ck_assert_int_eq(sh("readelf -d '%s/usr/lib/libhotkern.so.1' | grep -q "
                        "'SONAME.*\\[libhotkern.so.1\\]'",
                        dest),
                     0);
    ck_assert_int_eq(sh("readelf -d '%s/usr/lib/libhotkern-net.so.1' | grep -q "
                        "'SONAME.*\\[libhotkern-net.so.1\\]'",
                        dest),
                     0);
    ck_assert_int_eq(sh("readelf -d '%s/usr/lib/libhotkern-net.so.1' | grep -q "
                        "'NEEDED.*\\[libhotkern.so.1\\]'",
                        dest),
                     0);
    /* The engine's package names none of the network packages. */
    ck_assert_int_eq(sh("grep -Eq " NET_LIBS_RE " '%s/usr/lib/pkgconfig/hotkern.pc'", dest), 1);
    ck_assert_int_eq(
        sh(PKG_ENV " pkg-config --print-requires hotkern-net | grep -q '^hotkern'", dest, dest), 0);
}
END_TEST

START_TEST(core_consumer_needs_no_network_library) {
    ck_assert_msg(dest[0], "make install failed");
    put("core.c", core_src);
    ck_assert_int_eq(sh("cd '%s' && cc core.c -o core $(" PKG_ENV
                        " pkg-config --cflags --libs hotkern) >cc-core.log 2>&1 || "
                        "{ cat cc-core.log; exit 1; }",
                        dest, dest, dest),
                     0);
    ck_assert_int_eq(sh("cd '%s' && " RUN_ENV " ./core >run-core.log 2>&1 || "
                        "{ cat run-core.log; exit 1; }",
                        dest, dest),
                     0);
    /* It ran against the installed shared library, not a static copy. */
    ck_assert_int_eq(sh("cd '%s' && LD_LIBRARY_PATH='%s/usr/lib' ldd core | grep -q "
                        "'libhotkern.so.1 => %s/usr/lib/'",
                        dest, dest, dest),
                     0);
    /* Nothing of the network sources, directly or through libhotkern.so.1. */
    ck_assert_int_eq(sh("cd '%s' && LD_LIBRARY_PATH='%s/usr/lib' ldd core | grep -E " NET_LIBS_RE
                        " && exit 1 || exit 0",
                        dest, dest),
                     0);
    ck_assert_int_eq(sh("cd '%s' && readelf -d core usr/lib/libhotkern.so.1 | grep NEEDED | "
                        "grep -E " NET_LIBS_RE " && exit 1 || exit 0",
                        dest),
                     0);
    ck_assert_int_eq(sh("readelf -d '%s/usr/lib/libhotkern.so.1' | grep -q NEEDED.*libnvrtc", dest),
                     0);
}
END_TEST

START_TEST(net_consumer_links_and_runs) {
    ck_assert_msg(dest[0], "make install failed");
    put("net.c", net_src);
    ck_assert_int_eq(sh("cd '%s' && cc net.c -o net $(" PKG_ENV
                        " pkg-config --cflags --libs hotkern-net) >cc-net.log 2>&1 || "
                        "{ cat cc-net.log; exit 1; }",
                        dest, dest, dest),
                     0);
    ck_assert_int_eq(sh("cd '%s' && " RUN_ENV " ./net >run-net.log 2>&1 || "
                        "{ cat run-net.log; exit 1; }",
                        dest, dest),
                     0);
    ck_assert_int_eq(sh("cd '%s' && LD_LIBRARY_PATH='%s/usr/lib' ldd net | grep -q "
                        "'libhotkern-net.so.1 => %s/usr/lib/'",
                        dest, dest, dest),
                     0);
}
END_TEST

START_TEST(cpp_consumer_builds_and_runs) {
    ck_assert_msg(dest[0], "make install failed");
    put("cpp.cc", cpp_src);
    ck_assert_int_eq(sh("cd '%s' && c++ -std=c++17 -Wall -Wextra -Werror cpp.cc -o cpp $(" PKG_ENV
                        " pkg-config --cflags --libs hotkern) >cc-cpp.log 2>&1 || "
                        "{ cat cc-cpp.log; exit 1; }",
                        dest, dest, dest),
                     0);
    ck_assert_int_eq(sh("cd '%s' && " RUN_ENV " ./cpp >run-cpp.log 2>&1 || "
                        "{ cat run-cpp.log; exit 1; }",
                        dest, dest),
                     0);
    ck_assert_int_eq(sh("cd '%s' && LD_LIBRARY_PATH='%s/usr/lib' ldd cpp | grep -q "
                        "'libhotkern.so.1 => %s/usr/lib/'",
                        dest, dest, dest),
                     0);
}
END_TEST

START_TEST(cmake_consumers_build_and_run) {
    ck_assert_msg(dest[0], "make install failed");
    if (sh("command -v cmake >/dev/null 2>&1")) {
        printf("SKIP install: cmake not found, the CMake package is not tested\n");
        return;
    }
    ck_assert_int_eq(sh("mkdir -p '%s/cm' '%s/cm-new'", dest, dest), 0);
    put("cm/core.c", core_src);
    put("cm/net.c", net_src);
    put("cm/cpp.cc", cpp_src);
    put("cm/CMakeLists.txt", "cmake_minimum_required(VERSION 3.16)\n"
                             "project(consumer C CXX)\n"
                             "find_package(hotkern 1.0 REQUIRED)\n"
                             "add_executable(core core.c)\n"
                             "target_link_libraries(core PRIVATE hotkern::hotkern)\n"
                             "add_executable(net net.c)\n"
                             "target_link_libraries(net PRIVATE hotkern::net)\n"
                             "add_executable(cpp cpp.cc)\n"
                             "target_compile_features(cpp PRIVATE cxx_std_17)\n"
                             "target_link_libraries(cpp PRIVATE hotkern::hotkern)\n");
    ck_assert_int_eq(sh("cd '%s' && cmake -S cm -B cm/build -DCMAKE_PREFIX_PATH='%s/usr' "
                        ">cmake.log 2>&1 && cmake --build cm/build >>cmake.log 2>&1 || "
                        "{ cat cmake.log; exit 1; }",
                        dest, dest),
                     0);
    /* The imported locations are the installed libraries: the programs find
     * them by the build RPATH CMake gives them, without LD_LIBRARY_PATH. */
    ck_assert_int_eq(
        sh("cd '%s/cm/build' && ldd core | grep -q 'libhotkern.so.1 => %s/usr/lib/' && "
           "ldd net | grep -q 'libhotkern-net.so.1 => %s/usr/lib/' && "
           "ldd net | grep -q 'libhotkern.so.1 => %s/usr/lib/'",
           dest, dest, dest, dest),
        0);
    ck_assert_int_eq(
        sh("cd '%s/cm/build' && ldd core | grep -E " NET_LIBS_RE " && exit 1 || exit 0", dest), 0);
    ck_assert_int_eq(sh("cd '%s/cm/build' && HK_LIBCUDA=/nonexistent/libcuda.so.1 "
                        "ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0 ./core && "
                        "ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0 ./net && "
                        "HK_LIBCUDA=/nonexistent/libcuda.so.1 "
                        "ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0 ./cpp",
                        dest),
                     0);
    /* A newer major version than installed is refused, and so is an older
     * one: 0.x had another ABI (no size in its structures). */
    put("cm-new/CMakeLists.txt", "cmake_minimum_required(VERSION 3.16)\n"
                                 "project(consumer NONE)\n"
                                 "find_package(hotkern 2 REQUIRED)\n");
    ck_assert_int_ne(sh("cd '%s' && cmake -S cm-new -B cm-new/build "
                        "-DCMAKE_PREFIX_PATH='%s/usr' >cmake-new.log 2>&1",
                        dest, dest),
                     0);
    put("cm-new/CMakeLists.txt", "cmake_minimum_required(VERSION 3.16)\n"
                                 "project(consumer NONE)\n"
                                 "find_package(hotkern 0.2 REQUIRED)\n");
    ck_assert_int_ne(sh("cd '%s' && rm -rf cm-new/build && cmake -S cm-new -B cm-new/build "
                        "-DCMAKE_PREFIX_PATH='%s/usr' >cmake-old.log 2>&1",
                        dest, dest),
                     0);
}
END_TEST

/* Only the public prefix (and the version node) leaves a shared library; each
 * exports its own header's functions and not the other's. */
static void exports_only(const char *lib, const char *node, const char *has, const char *lacks) {
    ck_assert_int_eq(sh("nm -D --defined-only '%s/usr/lib/%s' | awk '{print $3}' | "
                        "grep -v '^hk_' | grep -v '^_' | grep -v '^%s$' | grep . && exit 1 || "
                        "exit 0",
                        dest, lib, node),
                     0);
    ck_assert_int_eq(sh("nm -D --defined-only '%s/usr/lib/%s' | grep -q ' %s@'", dest, lib, has),
                     0);
    ck_assert_int_eq(sh("nm -D --defined-only '%s/usr/lib/%s' | grep -q ' %s@'", dest, lib, lacks),
                     1);
}

START_TEST(exports_only_hk_symbols) {
    ck_assert_msg(dest[0], "make install failed");
    exports_only("libhotkern.so.1", "HOTKERN_1", "hk_swap", "hk_endpoint_start");
    exports_only("libhotkern-net.so.1", "HOTKERN_NET_1", "hk_endpoint_start", "hk_swap");
}
END_TEST

/* Under `make sanitize` / `make tsan` the installed libraries carry the
 * sanitizer: the nvcc programs link its runtime too. */
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

START_TEST(nvcc_program_links_the_interposition) {
    ck_assert_msg(dest[0], "make install failed");
    put("app.cu", nvcc_src);
    /* Static cudart, --wrap from pkg-config. */
    ck_assert_int_eq(sh("cd '%s' && " NVCC " -o app-static app.cu $(" PKG_ENV
                        " pkg-config --cflags hotkern-wrap) $(" PKG_ENV
                        " pkg-config --variable=nvcc_libs hotkern-wrap) >nvcc-static.log 2>&1 || "
                        "{ cat nvcc-static.log; exit 1; }",
                        dest, dest, dest, dest, dest),
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
        sh("cd '%s' && HK_LIBCUDA=/nonexistent/libcuda.so.1 "
           "ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0 "
           "LD_PRELOAD=\"$(" PKG_ENV " pkg-config --variable=preload hotkern-wrap)\" "
           "./app-shared >run-shared.log 2>&1; cat run-shared.log; grep -q '" NOT_ENABLED
           "' run-shared.log && grep -q 'app ran' run-shared.log",
           dest, dest, dest),
        0);
    /* Without the preload, the same binary is the program alone. */
    ck_assert_int_eq(
        sh("cd '%s' && ./app-shared 2>&1 | grep -q 'hotkern' && exit 1 || exit 0", dest), 0);
}
END_TEST

START_TEST(cmake_enables_hot_reload) {
    ck_assert_msg(dest[0], "make install failed");
    if (sh("command -v cmake >/dev/null 2>&1")) {
        printf("SKIP install: cmake not found, hotkern_enable_hot_reload is not tested\n");
        return;
    }
    ck_assert_int_eq(sh("mkdir -p '%s/cm-cuda'", dest), 0);
    put("cm-cuda/app.cu", nvcc_src);
    put("cm-cuda/CMakeLists.txt", "cmake_minimum_required(VERSION 3.18)\n"
                                  "project(game CUDA)\n"
                                  "find_package(hotkern 1.0 REQUIRED)\n"
                                  "add_executable(game app.cu)\n"
                                  "hotkern_enable_hot_reload(game)\n");
    ck_assert_int_eq(sh("cd '%s' && cmake -S cm-cuda -B cm-cuda/build -DCMAKE_PREFIX_PATH='%s/usr' "
                        "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc "
                        "-DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_FLAGS='" NVCC_SAN "' "
                        /* CMake links CUDA programs with the host compiler, which
                         * needs the sanitizer's runtime named too. */
                        "-DCMAKE_EXE_LINKER_FLAGS='" LD_SAN "' "
                        ">cmake-cuda.log 2>&1 && "
                        "cmake --build cm-cuda/build >>cmake-cuda.log 2>&1 || "
                        "{ cat cmake-cuda.log; exit 1; }",
                        dest, dest),
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
        sh("nm -D --defined-only '%s/usr/lib/libhotkern-preload.so' | awk '{print $3}' "
           "| grep -Ev '^(hk_|__cudaLaunchKernel|__cudaRegisterVar|cuda(LaunchKernel|"
           "MemcpyToSymbol|MemcpyFromSymbol|GetSymbolAddress))' | grep . && exit 1 || "
           "exit 0",
           dest),
        0);
    ck_assert_int_eq(sh("nm -D --defined-only '%s/usr/lib/libhotkern-preload.so' | "
                        "grep -q ' __cudaLaunchKernel$'",
                        dest),
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
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

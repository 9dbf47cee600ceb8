/*
 * The driver table's ABI. cuGetProcAddress(sym, CUDA_VERSION) returns the
 * newest version of an entry point for that CUDA release, and a few of those
 * (cuCtxSynchronize, cuCtxGetDevice in CUDA 13) take other arguments than the
 * prototype cuda.h declares under the plain name. This suite reads the
 * toolkit's cudaTypedefs.h and fails when an entry point in the table has a
 * version of this release that the table does not call through its own PFN
 * type, so the next such change is caught on a machine without a GPU. It
 * also binds a stand-in libcuda (tests/stub/libcuda.c) that lacks entry
 * points the engine does not call: the table must not require them.
 */
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hotkern/hotkern.h"
#include "base/driver.h"
#include "tests/harness.h"

#define NAME(field, sym)             #sym,
#define NAME_TYPED(field, sym, type) #sym,
static const char *plain[] = {HKB_DRIVER_ENTRIES(NAME) HKB_DRIVER_ENTRIES_EXTRA(NAME)};
static const char *typed[] = {HKB_DRIVER_ENTRIES_TYPED(NAME_TYPED)};

static char *read_typedefs(void) {
    const char *cuda = getenv("CUDA");
    char path[512];
    snprintf(path, sizeof path, "%s/include/cudaTypedefs.h", cuda ? cuda : "/usr/local/cuda");
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* 1 when cudaTypedefs.h has PFN_<sym>_v<CUDA_VERSION>. */
static int has_version_of_this_release(const char *text, const char *sym) {
    char want[128];
    snprintf(want, sizeof want, "PFN_%s_v%d)", sym, CUDA_VERSION);
    return strstr(text, want) != NULL;
}

START_TEST(every_entry_called_with_its_abi) {
    char *text = read_typedefs();
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        ck_assert_msg(!has_version_of_this_release(text, plain[i]),
                      "%s has a CUDA %d version: call it through its PFN type "
                      "(HKB_DRIVER_ENTRIES_TYPED)",
                      plain[i], CUDA_VERSION);
    for (size_t i = 0; i < sizeof typed / sizeof typed[0]; i++)
        ck_assert_msg(has_version_of_this_release(text, typed[i]),
                      "%s is typed for CUDA %d but the toolkit has no such version", typed[i],
                      CUDA_VERSION);
    free(text);
}
END_TEST

/* A driver that lacks entry points hotkern never calls still binds (the
 * benchmarks' extras are left NULL), and runtime creation gets past the
 * binding (the stand-in has no devices). */
START_TEST(driver_lacking_uncalled_entries_binds) {
    char exe[PATH_MAX] = "", lib[PATH_MAX + 32], why[256] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert_int_gt(n, 0);
    exe[n] = '\0';
    snprintf(lib, sizeof lib, "%s/../stub/libcuda-stub.so", dirname(exe));
    ck_assert_msg(access(lib, R_OK) == 0, "%s missing (make build)", lib);
    setenv("HK_LIBCUDA", lib, 1);

    hkb_driver d;
    ck_assert_msg(hkb_driver_open(&d, why, sizeof why) == 0, "%s", why);
    ck_assert_int_eq(d.version, CUDA_VERSION);
#define EXTRA_UNBOUND(field, sym)                                                                  \
    ck_assert_msg(d.field == NULL, "%s bound on a driver without it", #sym);
    HKB_DRIVER_ENTRIES_EXTRA(EXTRA_UNBOUND)
#undef EXTRA_UNBOUND
    ck_assert_ptr_nonnull(d.LaunchKernel);
    hkb_driver_close(&d);

    hk_runtime *rt = NULL;
    hk_report rep = HK_REPORT_INIT;
    int err = hk_runtime_create(&rt, NULL, &rep);
    ck_assert_msg(err != HK_ERR_NO_DRIVER, "%s", rep.message);
    ck_assert_msg(err < 0, "the stand-in driver has no device");
    ck_assert_ptr_null(rt);
    hk_report_clear(&rep);
}
END_TEST

int main(void) {
    Suite *s = suite_create("driver table");
    TCase *tc = tcase_create("abi");
    tcase_add_test(tc, every_entry_called_with_its_abi);
    tcase_add_test(tc, driver_lacking_uncalled_entries_binds);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

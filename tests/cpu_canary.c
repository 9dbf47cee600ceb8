/*
 * Canary runs on the CPU. The engine runs on the in-process fake driver; the
 * canary helper (BUILD/bin/hotkern-canary) is a real child process that
 * binds the loadable fake (BUILD/lib/libhotkern-fakecuda.so, through
 * HK_LIBCUDA), whose HKFAKE_* variables make a kernel fault, hang or store a
 * wrong value there. A misbehaving helper (BUILD/stub/hotkern-canary-bad)
 * covers malformed, oversized, missing and late replies, and a push's
 * default policy (an endpoint and the hotkern CLI). The first tests
 * drive the loadable fake through the public API alone, as an application's
 * CI would.
 *
 * This file assembles the suite; the tests live in tests/canary/, one file a
 * feature, over the fixture of tests/canary/fixture.[ch].
 */
#include "tests/canary/fixture.h"

int main(void) {
    built_path(fake_lib, "lib/libhotkern-fakecuda.so");
    built_path(bad_helper, "stub/hotkern-canary-bad");
    built_path(fake_san, "stub/fake-compute-sanitizer");
    /* Never the machine's compute-sanitizer around the fake driver: the
     * memcheck tests name the fake one. */
    setenv("HK_COMPUTE_SANITIZER", "", 1);
    Suite *s = suite_create("canary");
    TCase *tc = tcase_create("fake");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    canary_fake_tests(tc);
    suite_add_tcase(s, tc);
    tc = tcase_create("runs");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    canary_runs_tests(tc);
    suite_add_tcase(s, tc);
    tc = tcase_create("untrusted helper");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    canary_untrusted_tests(tc);
    suite_add_tcase(s, tc);
    tc = tcase_create("perf guard");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    canary_perf_tests(tc);
    suite_add_tcase(s, tc);
    tc = tcase_create("memcheck");
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    canary_memcheck_tests(tc);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

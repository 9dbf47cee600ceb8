/*
 * ptx/ without a GPU: format detection, the metadata parsers, NVRTC and
 * nvJitLink builds, and the compile cache.
 *
 * Every image is made at test time (NVRTC here, nvcc for fatbins), so the
 * tests follow the toolkit that is installed rather than files that age. The
 * cases that matter most for a hot reload are the refusals: each bad input
 * must come back as the right error with a reason a person can act on.
 *
 * This file assembles the suite; the tests live in tests/ptx/, one file a
 * feature, over the fixture of tests/ptx/fixture.[ch].
 */
#include "tests/ptx/fixture.h"

static Suite *ptx_suite(void) {
    Suite *s = suite_create("ptx");
    TCase *tc = tcase_create("detect");
    ptx_detect_tests(tc);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);

    tc = tcase_create("meta");
    ptx_meta_tests(tc);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);

    tc = tcase_create("build");
    ptx_build_tests(tc);
    ptx_guard_tests(tc);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);

    tc = tcase_create("cache");
    ptx_cache_tests(tc);
    ptx_cache_share_tests(tc);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);

    /* A regression here hangs on the lock: the timeout is what fails it. */
    tc = tcase_create("cache lock");
    ptx_cache_lock_tests(tc);
    tcase_set_timeout(tc, 30);
    suite_add_tcase(s, tc);

    tc = tcase_create("headers");
    ptx_headers_tests(tc);
    tcase_set_timeout(tc, 300);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(ptx_suite());
}

/*
 * watch/ against the ways files really change: each editor save pattern
 * must reach the callback exactly once with the final content, editor
 * droppings never, a header edit must reach every source that read it, and a
 * lost event queue or a recreated directory must not lose an update.
 *
 * Every test works in a fresh temporary directory with a recording callback;
 * waits are condition-variable waits bounded by timeouts, and "nothing more
 * arrives" is checked by waiting several debounce periods after the last
 * expected handover. Refusals are recorded the same way: what cannot be
 * handed over (a link out of the directory, a FIFO, a procfs file, a name the
 * engine would refuse) must be reported once per change, with a reason and
 * never the file's content. The last test case drives hk_watch_dir end to end
 * on the fake driver: files in, committed and refused versions out.
 *
 * This file assembles the suite; the tests live in tests/watch/, one file a
 * feature, over the fixture of tests/watch/fixture.[ch].
 */
#include "tests/watch/fixture.h"

static Suite *watch_suite(void) {
    Suite *s = suite_create("watch");
    TCase *tc = tcase_create("core");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    watch_scan_tests(tc);
    watch_saves_tests(tc);
    watch_deps_tests(tc);
    watch_refusals_tests(tc);
    suite_add_tcase(s, tc);

    tc = tcase_create("runtime");
    tcase_add_checked_fixture(tc, rt_setup, rt_teardown);
    tcase_set_timeout(tc, 30);
    watch_api_tests(tc);
    watch_api_stop_tests(tc);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(watch_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

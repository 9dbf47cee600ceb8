/*
 * The swap engine's logic on the fake driver: versions, validation and
 * refusals, globals, rollback, grace periods, pins, fault injection, resets,
 * graphs, several devices, and a concurrent launch/swap stress. None of this
 * is GPU evidence (the GPU suites are); it pins down the engine's decisions.
 *
 * This file assembles the suite; the tests live in tests/engine/, one file a
 * feature, over the fixture of tests/engine/fixture.[ch].
 */
#include "tests/engine/fixture.h"

static Suite *suite(void) {
    Suite *s = suite_create("engine (fake driver)");
    TCase *tc = tcase_create("engine");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    engine_versions_tests(tc);
    engine_lifetime_tests(tc);
    engine_faults_tests(tc);
    engine_sources_tests(tc);
    engine_submit_tests(tc);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

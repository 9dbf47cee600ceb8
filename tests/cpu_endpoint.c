/*
 * The push endpoint (net/endpoint.c) against real clients: a libmicrohttpd
 * server on 127.0.0.1 (ephemeral port), driven by the curl command-line tool
 * and by the built hotkern CLI, both run with fork/exec under `timeout`.
 * The engine is a recorder: it keeps what apply was given, so the tests see
 * exactly which bytes would have been swapped in, and can be told to refuse.
 *
 * This file assembles the suite; the tests live in tests/endpoint/, one file
 * a feature, over the fixture of tests/endpoint/fixture.[ch].
 */
#include "tests/endpoint/fixture.h"

static Suite *suite(void) {
    Suite *s = suite_create("endpoint");
    TCase *tc = tcase_create("http");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    ep_push_tests(tc);
    ep_refusals_tests(tc);
    ep_limits_tests(tc);
    ep_auth_tests(tc);
    ep_rollback_tests(tc);
    ep_frames_tests(tc);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

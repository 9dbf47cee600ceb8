/*
 * Logs and metrics, end to end on the fake driver: a runtime with its log
 * callback (or HOTKERN_LOG and stderr), the watcher on a temporary
 * directory, an endpoint driven with libcurl, pullers against a closed port
 * and a libmicrohttpd origin serving a release signed by an untrusted key.
 * The metrics text is checked line by line against the exposition format
 * (names, labels, escapes, values, family grouping, histogram buckets) by a
 * validator that is itself shown to refuse bad text.
 *
 * This file assembles the suite; the tests live in tests/obs/, one file a
 * feature, over the fixture of tests/obs/fixture.[ch].
 */
#include "tests/obs/fixture.h"

int main(void) {
    Suite *s = suite_create("logs and metrics");
    TCase *tc = tcase_create("obs");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    obs_logs_tests(tc);
    obs_endpoint_tests(tc);
    obs_puller_tests(tc);
    obs_metrics_tests(tc);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

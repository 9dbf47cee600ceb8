/*
 * The metrics text: it is the exposition format, its histogram buckets are
 * fixed, sources attach their families escaped, and the validator itself
 * refuses bad text.
 */
#include "tests/obs/fixture.h"

/* ---- the metrics text ------------------------------------------------- */

START_TEST(metrics_text_is_exposition) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("m", 1);
    swap_ok("m", 2);
    swap_bad("m");
    ck_assert_int_eq(hk_rollback(rt, "m", &rep), 0);
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    char *text = metrics(), series[128];
    assert_valid(text);
    ck_assert_msg(sample_value(text, "hotkern_swaps_total") == 3, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_rollbacks_total") == 1, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_refused_total") == 1, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_reclaimed_total") == 2, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_live_versions") == 1, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_swap_duration_seconds_count") == 3, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_swap_duration_seconds_bucket{le=\"+Inf\"}") == 3,
                  "%s", text);
    snprintf(series, sizeof series, "hotkern_build_info{version=\"%s\"}", hk_version());
    ck_assert_msg(sample_value(text, series) == 1, "%s", text);

    /* Into a caller's buffer: the same text when it fits, else nothing. */
    size_t len = 0, need = strlen(text);
    char *buf = malloc(need + 1);
    ck_assert_int_eq(hk_metrics_text(rt, buf, need, &len), HK_ERR_TOO_LARGE);
    ck_assert_uint_eq(len, need);
    ck_assert_str_eq(buf, "");
    ck_assert_int_eq(hk_metrics_text(rt, buf, need + 1, &len), 0);
    ck_assert_str_eq(buf, text);
    free(buf);
    free(text);
    ck_assert_int_eq(hk_metrics_text_alloc(NULL, &text, &len), HK_ERR_INVALID);
    ck_assert_ptr_null(text);
}
END_TEST

START_TEST(histogram_buckets_are_fixed) {
    hkl_hist h;
    hk_stats s = HK_STATS_INIT;
    char *text = NULL;
    memset(&h, 0, sizeof h);
    memset(&s, 0, sizeof s);
    hkl_hist_observe(&h, 0.2);     /* 200 us */
    hkl_hist_observe(&h, 0.25);    /* on the bound: counts as le="0.00025" */
    hkl_hist_observe(&h, 3.0);     /* le="0.005" */
    hkl_hist_observe(&h, 45000.0); /* over 30 s: +Inf only */
    s.stage_ms_total = 42;         /* 0.042 s, not 0.042000000000000003 */
    s.build_ms_total = 1234.5678;  /* 1.234568 s: six places at most */
    hk_metrics_writer *w = hkl_mw_new();
    hkl_metrics_engine(w, &s, &h);
    ck_assert_int_eq(hkl_mw_take(w, &text, NULL), 0);
    assert_valid(text);
    static const struct {
        const char *le;
        double n;
    } want[] = {{"0.00025", 2}, {"0.0005", 2}, {"0.0025", 2}, {"0.005", 3},
                {"10", 3},      {"30", 3},     {"+Inf", 4}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char series[96];
        snprintf(series, sizeof series, "hotkern_swap_duration_seconds_bucket{le=\"%s\"}",
                 want[i].le);
        ck_assert_msg(sample_value(text, series) == want[i].n, "%s\n%s", series, text);
    }
    ck_assert_ptr_nonnull(strstr(text, "\nhotkern_swap_duration_seconds_sum 45.00345\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nhotkern_stage_seconds_total 0.042\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nhotkern_build_seconds_total 1.234568\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nhotkern_commit_seconds_total 0\n"));
    free(text);
}
END_TEST

static void src_cb(hk_metrics_writer *w, void *ud) {
    const struct src *s = ud;
    hk_metrics_family(w, s->family, "counter", "A test source's counter.\nSecond line.");
    hk_metrics_sample(w, s->family, "kind", s->value, s->n);
    hk_metrics_sample(w, "not_declared_total", NULL, NULL, 1); /* dropped */
    hk_metrics_sample(w, s->family, "bad-label", "x", 1);      /* dropped */
    hk_metrics_family(w, "bad name", "counter", NULL);         /* ignored */
    hk_metrics_family(w, "other_total", "summary", NULL);      /* not a type sources use */
}

START_TEST(sources_attach_and_are_escaped) {
    struct src a = {"test_things_total", "quote\" back\\slash\nnewline", 3};
    struct src b = {"test_things_total", "plain", 4};
    hk_metrics_source *sa, *sb, *bad = NULL;
    ck_assert_int_eq(hk_metrics_attach(rt, src_cb, &a, "src", "a", &sa), 0);
    ck_assert_int_eq(hk_metrics_attach(rt, src_cb, &b, "src", "b\"", &sb), 0);
    ck_assert_int_eq(hk_metrics_attach(rt, src_cb, &b, "0src", "x", &bad), HK_ERR_INVALID);
    ck_assert_int_eq(hk_metrics_attach(rt, src_cb, &b, "__src", "x", &bad), HK_ERR_INVALID);
    ck_assert_ptr_null(bad);
    char *text = metrics();
    assert_valid(text);
    ck_assert_msg(strstr(text, "\ntest_things_total{src=\"a\",kind=\"quote\\\" back\\\\slash\\n"
                               "newline\"} 3\n"),
                  "%s", text);
    ck_assert_msg(strstr(text, "\ntest_things_total{src=\"b\\\"\",kind=\"plain\"} 4\n"), "%s",
                  text);
    ck_assert_ptr_nonnull(
        strstr(text, "# HELP test_things_total A test source's counter.\\nSecond"));
    ck_assert_ptr_null(strstr(text, "not_declared"));
    ck_assert_ptr_null(strstr(text, "bad"));
    ck_assert_ptr_null(strstr(text, "other_total"));
    free(text);
    hk_metrics_detach(sa);
    text = metrics();
    ck_assert_ptr_null(strstr(text, "src=\"a\""));
    ck_assert_ptr_nonnull(strstr(text, "src=\"b\\\"\""));
    free(text);
    hk_metrics_detach(sb);
    hk_metrics_detach(NULL);
}
END_TEST

/* The validator used above refuses what it should. */
START_TEST(validator_refuses_bad_text) {
    static const char *const bad[] = {
        "# TYPE a_total counter\na_total 0.042000000000000003\n",
        "# TYPE a_total counter\na_total 1.50\n",
        "# TYPE a counter\na 1\n",
        "# TYPE a_total counter\n# TYPE a_total counter\na_total 1\n",
        "b_total 1\n",
        "# TYPE a gauge\n# TYPE b gauge\na 1\nb 1\na 2\n",
        "# TYPE a gauge\na{x=\"\\t\"} 1\n",
        "# TYPE a gauge\na{x=\"open} 1\n",
        "# TYPE a gauge\na{x=\"1\",x=\"2\"} 1\n",
        "# TYPE a gauge\na 1",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n",
        "# TYPE a gauge\na 1\n# HELP a late\n",
        "# TYPE a gauge\na NaN\n",
    };
    char line[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(check_exposition(bad[i], line, sizeof line), "accepted: %s", bad[i]);
    ck_assert_ptr_null(check_exposition("# HELP a x\n# TYPE a gauge\na{x=\"\\\"\\\\\\n\"} 1.5\n"
                                        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\n"
                                        "h_bucket{le=\"+Inf\"} 2\nh_sum 0.25\nh_count 2\n",
                                        line, sizeof line));
}
END_TEST

void obs_metrics_tests(TCase *tc) {
    tcase_add_test(tc, metrics_text_is_exposition);
    tcase_add_test(tc, histogram_buckets_are_fixed);
    tcase_add_test(tc, sources_attach_and_are_escaped);
    tcase_add_test(tc, validator_refuses_bad_text);
}

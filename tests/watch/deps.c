/*
 * Headers and the queue: a header's change rebuilds the sources that
 * include it (in this directory or another, and before the report), the
 * listing of a directory's headers; the event queue's overflow, a
 * directory recreated, stop and destroy while the watcher is busy.
 */
#include "tests/watch/fixture.h"

/* hkw_stop while files keep changing: when it returns no callback runs,
 * and none comes later; the watcher still answers until destroyed. */
START_TEST(stop_ends_callbacks) {
    pthread_t t;
    hkw_stats st;
    int n;

    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    __atomic_store_n(&writer_stop, 0, __ATOMIC_RELAXED);
    ck_assert_int_eq(pthread_create(&t, NULL, writer_main, NULL), 0);
    ck_assert_int_ge(rec_wait(1, WAIT_MS), 1);
    hkw_stop(w);
    n = rec_count();
    usleep(SETTLE_MS * 1000);
    __atomic_store_n(&writer_stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    ck_assert_int_eq(rec_count(), n);
    hkw_stop(w); /* idempotent */
    hkw_stats_get(w, &st);
    ck_assert_uint_eq(st.handovers, (uint64_t)n);
    hkw_stop(NULL);
}
END_TEST

START_TEST(header_rebuilds_dependents) {
    char a[PATH_MAX], b[PATH_MAX];
    const char *deps_a[] = {"common.cuh"};
    const char *deps_b[2];
    const char *deps_c[] = {"other.cuh"};
    char common[PATH_MAX], c[PATH_MAX];

    write_file("a.cu", "A");
    write_file("b.cu", "B");
    write_file("c.cu", "C");
    write_file("common.cuh", "#define X 1");
    write_file("other.cuh", "#define Y 1");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(3);
    path_in(a, sizeof a, dir, "a.cu");
    path_in(b, sizeof b, dir, "b.cu");
    path_in(c, sizeof c, dir, "c.cu");
    path_in(common, sizeof common, dir, "common.cuh");
    deps_b[0] = common; /* absolute here, relative for a */
    deps_b[1] = "other.cuh";
    ck_assert_int_eq(hkw_set_deps(w, a, deps_a, 1), 0);
    ck_assert_int_eq(hkw_set_deps(w, b, deps_b, 1), 0);
    ck_assert_int_eq(hkw_set_deps(w, c, deps_c, 1), 0);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 3);

    write_file("common.cuh", "#define X 2");
    expect_total(5);
    ck_assert_int_eq(rec_count_module("a", 3), 1);
    ck_assert_int_eq(rec_count_module("b", 3), 1);
    ck_assert_int_eq(rec_count_module("c", 3), 0);
    ck_assert_str_eq(rec_last("a"), "A"); /* its own content, unchanged */

    /* Rewriting a header with the same content rebuilds nothing. */
    write_file("common.cuh", "#define X 2");
    write_file("other.cuh", "#define Y 1");
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 5);

    /* Replaced dependencies: b no longer reads common.cuh, but other.cuh. */
    deps_b[0] = "other.cuh";
    ck_assert_int_eq(hkw_set_deps(w, b, deps_b, 1), 0);
    write_file("other.cuh", "#define Y 2");
    expect_total(7);
    ck_assert_int_eq(rec_count_module("b", 5), 1);
    ck_assert_int_eq(rec_count_module("c", 5), 1);
}
END_TEST

START_TEST(header_in_other_directory) {
    char inc[PATH_MAX], hdr[PATH_MAX], a[PATH_MAX];
    const char *deps[1];

    path_in(inc, sizeof inc, root, "include");
    ck_assert_int_eq(mkdir(inc, 0755), 0);
    path_in(hdr, sizeof hdr, inc, "shared.cuh");
    write_at(hdr, "#define S 1");
    write_file("a.cu", "A");
    write_file("b.cu", "B");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(2);
    path_in(a, sizeof a, dir, "a.cu");
    deps[0] = "../include/shared.cuh"; /* relative to the source's directory */
    ck_assert_int_eq(hkw_set_deps(w, a, deps, 1), 0);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 2);
    write_at(hdr, "#define S 2");
    expect_total(3);
    ck_assert_int_eq(rec_count_module("a", 2), 1);
    /* Sources in a directory watched only for dependencies are no modules. */
    path_in(hdr, sizeof hdr, inc, "stray.cu");
    write_at(hdr, "stray");
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 3);
}
END_TEST

START_TEST(dependency_changed_before_report) {
    char a[PATH_MAX];
    const char *deps[] = {"h.cuh"};

    write_file("a.cu", "A");
    write_file("h.cuh", "old");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(1);
    /* The header changes while a's build is still running, before the build
     * reports what it read: a may have been built from the old header. */
    write_file("h.cuh", "new");
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 1);
    path_in(a, sizeof a, dir, "a.cu");
    ck_assert_int_eq(hkw_set_deps(w, a, deps, 1), 0);
    expect_total(2);
    ck_assert_int_eq(rec_count_module("a", 1), 1);
    /* The rebuild's own report does not trigger another one. */
    ck_assert_int_eq(hkw_set_deps(w, a, deps, 1), 0);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 2);
}
END_TEST

static long read_long(const char *path) {
    FILE *f = fopen(path, "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static int write_long(const char *path, long v) {
    FILE *f = fopen(path, "w");
    int ok;
    if (!f)
        return -1;
    ok = fprintf(f, "%ld\n", v) > 0;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* Ten modules handed over, the watcher paused, `changed` of them rewritten
 * around a flood of `flood` events on an ignored file, the watcher resumed:
 * the changed ones, and only those, must come through once each. */
static void overflow_round(long flood) {
    char name[32], content[64];
    hkw_stats st;
    int changed = 6;

    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "m%d.cu", i);
        snprintf(content, sizeof content, "module %d v1", i);
        write_file(name, content);
    }
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(10);

    hkw_pause(w, 1);
    for (int i = 0; i < changed / 2; i++) {
        snprintf(name, sizeof name, "m%d.cu", i);
        snprintf(content, sizeof content, "module %d v2", i);
        write_file(name, content);
    }
    for (long i = 0; i < flood; i++)
        write_file((i & 1) ? "noise_a.txt" : "noise_b.txt", "n");
    /* These events are certainly lost: the queue is full already. */
    for (int i = changed / 2; i < changed; i++) {
        snprintf(name, sizeof name, "m%d.cu", i);
        snprintf(content, sizeof content, "module %d v2", i);
        write_file(name, content);
    }
    hkw_pause(w, 0);

    expect_total(10 + changed);
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "m%d", i);
        snprintf(content, sizeof content, "module %d v%d", i, i < changed ? 2 : 1);
        ck_assert_int_eq(rec_count_module(name, 10), i < changed ? 1 : 0);
        ck_assert_str_eq(rec_last(name), content);
    }
    hkw_stats_get(w, &st);
    ck_assert_uint_ge(st.overflows, 1);
    ck_assert_uint_ge(st.rescans, 2);
}

START_TEST(overflow_small_queue) {
    static const char *knob = "/proc/sys/fs/inotify/max_queued_events";
    long old = read_long(knob);
    int small;

    /* The limit is taken when the inotify instance is created, so it is
     * restored at once, before anything can fail. */
    small = old > 0 && write_long(knob, 16) == 0;
    start();
    if (small)
        ck_assert_int_eq(write_long(knob, old), 0);
    overflow_round(small ? 64 : old + 64);
}
END_TEST

START_TEST(overflow_paused_flood) {
    long limit = read_long("/proc/sys/fs/inotify/max_queued_events");

    if (limit <= 0 || limit > 200000)
        limit = 16384;
    start();
    /* Two events per write (modify, close; the names alternate, so none
     * coalesce): 128 past the queue. */
    overflow_round(limit / 2 + 64);
}
END_TEST

static void wait_lost(uint64_t n) {
    hkw_stats st;
    for (int i = 0; i < WAIT_MS / 10; i++) {
        hkw_stats_get(w, &st);
        if (st.dirs_lost >= n)
            return;
        usleep(10 * 1000);
    }
    ck_abort_msg("directory loss not noticed");
}

START_TEST(directory_recreated) {
    char p[PATH_MAX];

    write_file("a.cu", "A");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(1);

    rm_rf(dir);
    wait_lost(1);
    usleep(120 * 1000); /* a few polls while it is absent */
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    write_file("a.cu", "A"); /* same content as before: nothing */
    write_file("b.cu", "B in the new directory");
    expect_total(2);
    ck_assert_str_eq(rec_last("b"), "B in the new directory");
    usleep(100 * 1000);
    write_file("a.cu", "A2");
    expect_total(3);
    ck_assert_str_eq(rec_last("a"), "A2");

    /* Moved away and replaced: the new directory is the one watched. */
    path_in(p, sizeof p, root, "kernels.old");
    ck_assert_int_eq(rename(dir, p), 0);
    wait_lost(2);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    path_in(p, sizeof p, root, "kernels.old/a.cu");
    write_at(p, "written in the old directory");
    write_file("c.cu", "C");
    expect_total(4);
    ck_assert_str_eq(rec_last("c"), "C");
    ck_assert_str_eq(rec_last("a"), "A2");
}
END_TEST

START_TEST(destroy_while_busy) {
    hkw_opts o;
    pthread_t t;
    struct timespec t0, t1;
    long ms;

    hkw_opts_init(&o);
    o.debounce_ms = 0; /* hand over as often as possible */
    start_with(&o);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    __atomic_store_n(&writer_stop, 0, __ATOMIC_RELAXED);
    ck_assert_int_eq(pthread_create(&t, NULL, writer_main, NULL), 0);
    usleep(300 * 1000);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    hkw_destroy(w);
    w = NULL;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    __atomic_store_n(&writer_stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    ck_assert_int_lt(ms, 1000);
    ck_assert_int_gt(rec_count(), 0);
}
END_TEST

START_TEST(dir_headers_listing) {
    hk_header *h;
    int n;

    write_file("b.h", "#define B 2\n");
    write_file("a.cuh", "#define A 1\n");
    write_file("c.hpp", "");
    write_file("k.cu", "int x;\n");
    write_file(".a.cuh.swp", "junk");
    write_file("notes.txt", "text");
    ck_assert_int_eq(hkw_dir_headers(dir, &h, &n), 0);
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(h[0].name, "a.cuh");
    ck_assert_str_eq(h[1].name, "b.h");
    ck_assert_str_eq(h[2].name, "c.hpp");
    ck_assert_uint_eq(h[1].size, 12);
    ck_assert_mem_eq(h[1].data, "#define B 2\n", 12);
    ck_assert_uint_eq(h[2].size, 0);
    hkw_headers_free(h, n);
    char missing[PATH_MAX];
    path_in(missing, sizeof missing, root, "missing");
    ck_assert_int_eq(hkw_dir_headers(missing, &h, &n), HK_ERR_IO);
}
END_TEST

void watch_deps_tests(TCase *tc) {
    tcase_add_test(tc, stop_ends_callbacks);
    tcase_add_test(tc, header_rebuilds_dependents);
    tcase_add_test(tc, header_in_other_directory);
    tcase_add_test(tc, dependency_changed_before_report);
    tcase_add_test(tc, overflow_small_queue);
    tcase_add_test(tc, overflow_paused_flood);
    tcase_add_test(tc, directory_recreated);
    tcase_add_test(tc, destroy_while_busy);
    tcase_add_test(tc, dir_headers_listing);
}

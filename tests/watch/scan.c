/*
 * What the watcher looks at: names classified by kind, the arguments it
 * refuses, the first scan, subdirectories (recursive or not), the kinds of
 * source asked for, editor droppings, and two directories at once.
 */
#include "tests/watch/fixture.h"

START_TEST(classify_names) {
    char m[64];

    ck_assert_int_eq(hkw_classify("particles.cu", m, sizeof m), HKW_SOURCE);
    ck_assert_str_eq(m, "particles");
    ck_assert_int_eq(hkw_classify("a.v2.ptx", m, sizeof m), HKW_SOURCE);
    ck_assert_str_eq(m, "a");
    ck_assert_int_eq(hkw_classify("k.cubin", m, sizeof m), HKW_SOURCE);
    ck_assert_int_eq(hkw_classify("k.fatbin", m, sizeof m), HKW_SOURCE);
    ck_assert_int_eq(hkw_classify("common.cuh", m, sizeof m), HKW_HEADER);
    ck_assert_int_eq(hkw_classify("common.h", NULL, 0), HKW_HEADER);
    ck_assert_int_eq(hkw_classify("common.hpp", NULL, 0), HKW_HEADER);
    ck_assert_int_eq(hkw_classify("notes.txt", NULL, 0), HKW_OTHER);
    ck_assert_int_eq(hkw_classify("Makefile", NULL, 0), HKW_OTHER);
    ck_assert_int_eq(hkw_classify(".particles.cu", m, sizeof m), HKW_IGNORED);
    ck_assert_int_eq(hkw_classify(".particles.cu.swp", m, sizeof m), HKW_IGNORED);
    ck_assert_int_eq(hkw_classify("particles.cu~", m, sizeof m), HKW_IGNORED);
    ck_assert_int_eq(hkw_classify("particles.cu.swp", m, sizeof m), HKW_IGNORED);
    ck_assert_int_eq(hkw_classify("particles.cu.swx", m, sizeof m), HKW_IGNORED);
    ck_assert_int_eq(hkw_classify("particles.cu.tmp", m, sizeof m), HKW_IGNORED);
    ck_assert_int_eq(hkw_classify("4913", m, sizeof m), HKW_IGNORED);
    /* sed -i's temporary file: "sed" and six of [A-Za-z0-9]; nothing else. */
    ck_assert_int_eq(hkw_classify("sedAb12Xy", m, sizeof m), HKW_IGNORED);
    ck_assert_int_eq(hkw_classify("sed000000", m, sizeof m), HKW_IGNORED);
    ck_assert_int_eq(hkw_classify("sedAb12X", NULL, 0), HKW_OTHER);
    ck_assert_int_eq(hkw_classify("sedAb12Xyz", NULL, 0), HKW_OTHER);
    ck_assert_int_eq(hkw_classify("sedAb-2Xy", NULL, 0), HKW_OTHER);
    ck_assert_int_eq(hkw_classify("sedimen.cu", m, sizeof m), HKW_SOURCE);
    ck_assert_int_eq(hkw_classify("#particles.cu#", m, sizeof m), HKW_IGNORED);
    ck_assert_int_eq(hkw_classify("sub/particles.cu", m, sizeof m), HKW_IGNORED);
    /* A module name that does not fit the caller's buffer is refused. */
    ck_assert_int_eq(hkw_classify("abcdefgh.cu", m, 4), HKW_IGNORED);
}
END_TEST

START_TEST(bad_arguments) {
    hkw_opts o;
    hkw_watcher *x = NULL;
    char p[PATH_MAX];

    hkw_opts_init(&o);
    ck_assert_int_eq(hkw_create(&x, &o), HK_ERR_INVALID);
    ck_assert_ptr_null(x);
    start();
    path_in(p, sizeof p, root, "missing");
    ck_assert_int_eq(hkw_add_dir(w, p), HK_ERR_IO);
    path_in(p, sizeof p, root, "plain");
    write_at(p, "x");
    ck_assert_int_eq(hkw_add_dir(w, p), HK_ERR_IO);
    ck_assert_int_eq(hkw_add_dir(w, NULL), HK_ERR_INVALID);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0); /* twice is harmless */
    path_in(p, sizeof p, dir, "nope.cu");
    ck_assert_int_eq(hkw_set_deps(w, p, NULL, 0), HK_ERR_NOT_FOUND);
    ck_assert_int_eq(hkw_set_deps(w, NULL, NULL, 0), HK_ERR_INVALID);
    hkw_destroy(NULL);
}
END_TEST

START_TEST(initial_scan) {
    char p[PATH_MAX];

    write_file("a.cu", "A");
    write_file("b.ptx", "B");
    write_file("c.h", "header");
    write_file(".hidden.cu", "H");
    write_file("a.cu~", "backup");
    write_file("empty.cu", "");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(2);
    ck_assert_str_eq(rec_last("a"), "A");
    ck_assert_str_eq(rec_last("b"), "B");
    path_in(p, sizeof p, dir, "a.cu");
    pthread_mutex_lock(&rec.mu);
    ck_assert(strcmp(rec.r[0].path, p) == 0 || strcmp(rec.r[1].path, p) == 0);
    pthread_mutex_unlock(&rec.mu);
}
END_TEST

START_TEST(no_initial_scan) {
    hkw_opts o;

    write_file("a.cu", "A");
    write_file("b.cu", "B");
    hkw_opts_init(&o);
    o.no_initial_scan = 1;
    start_with(&o);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 0);
    write_file("b.cu", "B"); /* same content: still nothing */
    write_file("a.cu", "A2");
    expect_total(1);
    ck_assert_str_eq(rec_last("a"), "A2");
}
END_TEST

/* Subdirectories of a recursive watch, at any depth, present or created,
 * moved in, removed and recreated; not dot-directories; other names in
 * them ignored without a refusal. */
START_TEST(recursive_subdirectories) {
    hkw_opts o;
    char p[PATH_MAX], q[PATH_MAX];

    path_in(p, sizeof p, dir, "sub");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    path_in(p, sizeof p, dir, "sub/deep");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    path_in(p, sizeof p, dir, ".git");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    write_file("top.cu", "T");
    write_file("sub/a.cu", "A");
    write_file("sub/deep/b.ptx", "B");
    write_file("sub/notes.txt", "notes");
    write_file(".git/c.cu", "C");
    hkw_opts_init(&o);
    o.recursive = 1;
    o.ignore_others = 1;
    start_with(&o);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(3);
    ck_assert_str_eq(rec_last("top"), "T");
    ck_assert_str_eq(rec_last("a"), "A");
    ck_assert_str_eq(rec_last("b"), "B");
    path_in(p, sizeof p, dir, "sub/a.cu");
    pthread_mutex_lock(&rec.mu);
    int found = 0;
    for (int i = 0; i < rec.n; i++)
        found |= strcmp(rec.r[i].path, p) == 0;
    pthread_mutex_unlock(&rec.mu);
    ck_assert(found);

    /* Created after the watch began, two levels at once. */
    path_in(p, sizeof p, dir, "later");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    path_in(p, sizeof p, dir, "later/x");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    write_file("later/x/d.cu", "D");
    expect_total(4);
    ck_assert_str_eq(rec_last("d"), "D");
    /* An edit deep down. */
    write_file("sub/deep/b.ptx", "B2");
    expect_total(5);
    ck_assert_str_eq(rec_last("b"), "B2");
    /* Removed and recreated. */
    path_in(p, sizeof p, dir, "sub");
    rm_rf(p);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    write_file("sub/a.cu", "A2");
    expect_total(6);
    ck_assert_str_eq(rec_last("a"), "A2");
    /* Moved in from outside the tree, with a file in it. */
    path_in(p, sizeof p, root, "outside");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    path_in(q, sizeof q, p, "e.fatbin");
    write_at(q, "E");
    path_in(q, sizeof q, dir, "moved");
    ck_assert_int_eq(rename(p, q), 0);
    expect_total(7);
    ck_assert_str_eq(rec_last("e"), "E");
    /* Nothing of the dot-directory, no refusal of the notes. */
    write_file(".git/c.cu", "C2");
    write_file("sub/notes.txt", "more notes");
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 7);
    ck_assert_int_eq(rec_count_module("c", 0), 0);
    ck_assert_int_eq(refusal_count(), 0);
}
END_TEST

/* Without recursion, a subdirectory's files are nobody's. */
START_TEST(not_recursive_by_default) {
    char p[PATH_MAX];

    path_in(p, sizeof p, dir, "sub");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    write_file("sub/a.cu", "A");
    write_file("top.cu", "T");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(1);
    write_file("sub/a.cu", "A2");
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 1);
    ck_assert_str_eq(rec_last("top"), "T");
}
END_TEST

/* opts.sources: only the kinds named are sources; the others, and with
 * ignore_others every name that is no source or header, are ignored
 * silently, present or written later. */
START_TEST(source_kinds_filter) {
    hkw_opts o;

    write_file("a.cu", "A");
    write_file("b.ptx", "B");
    write_file("notes.txt", "N");
    hkw_opts_init(&o);
    o.sources = HKW_SRC_PTX | HKW_SRC_CUBIN;
    o.ignore_others = 1;
    start_with(&o);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(1);
    ck_assert_str_eq(rec_last("b"), "B");
    write_file("a.cu", "A2");
    write_file("c.cubin", "C");
    write_file("README", "R");
    write_file("d.fatbin", "D");
    expect_total(2);
    ck_assert_str_eq(rec_last("c"), "C");
    ck_assert_int_eq(rec_count_module("a", 0), 0);
    ck_assert_int_eq(rec_count_module("d", 0), 0);
    ck_assert_int_eq(refusal_count(), 0);
    ck_assert_uint_eq(hkw_source_bit("CU"), HKW_SRC_CU);
    ck_assert_uint_eq(hkw_source_bit("fatbin"), HKW_SRC_FATBIN);
    ck_assert_uint_eq(hkw_source_bit("txt"), 0);
    ck_assert_uint_eq(hkw_source_bit(NULL), 0);
}
END_TEST

START_TEST(droppings_ignored) {
    static const char *const names[] = {
        ".particles.cu", "particles.cu~",  "particles.cu.swp", ".particles.cu.swx",
        "4913",          "#particles.cu#", "particles.cu.tmp", "notes.txt",
        "README",        "common.cuh",
    };
    hkw_stats st;

    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    usleep(100 * 1000);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        write_file(names[i], "junk");
    /* Droppings are silent; the two other names are refused, saying why. */
    expect_refusals(2);
    ck_assert_int_eq(rec_count(), 0);
    hkw_stats_get(w, &st);
    ck_assert_uint_ge(st.events, 10);
    ck_assert_uint_eq(st.handovers, 0);
    ck_assert_uint_eq(st.opens, st.retries + 1); /* common.cuh, the header, only */
    for (int i = 0; i < 2; i++) {
        refusal f;
        ck_assert(refusal_of(i ? "README" : "notes.txt", &f));
        ck_assert_str_eq(f.module, "");
        ck_assert_int_eq(f.err, HK_ERR_FORMAT);
        ck_assert_ptr_nonnull(strstr(f.why, "not a kernel source"));
        ck_assert_ptr_null(strstr(f.why, "junk"));
    }
}
END_TEST

START_TEST(two_directories) {
    char other[PATH_MAX], p[PATH_MAX];

    path_in(other, sizeof other, root, "more");
    ck_assert_int_eq(mkdir(other, 0755), 0);
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    ck_assert_int_eq(hkw_add_dir(w, other), 0);
    usleep(100 * 1000);
    write_file("x.cu", "X");
    path_in(p, sizeof p, other, "y.fatbin");
    write_at(p, "Y");
    expect_total(2);
    ck_assert_str_eq(rec_last("x"), "X");
    ck_assert_str_eq(rec_last("y"), "Y");
}
END_TEST

void watch_scan_tests(TCase *tc) {
    tcase_add_test(tc, classify_names);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, initial_scan);
    tcase_add_test(tc, no_initial_scan);
    tcase_add_test(tc, recursive_subdirectories);
    tcase_add_test(tc, not_recursive_by_default);
    tcase_add_test(tc, source_kinds_filter);
    tcase_add_test(tc, droppings_ignored);
    tcase_add_test(tc, two_directories);
}

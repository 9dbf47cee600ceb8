/*
 * Files the watcher refuses, each once and with its reason: symlinks out of
 * the directory (those inside are followed), files others own or hold
 * open, special and procfs files, module names too long or that cannot be
 * recorded.
 */
#include "tests/watch/fixture.h"

/* A link out of the directory is refused unread, naming why; its target's
 * edits are not followed; it is reported again only when the link changes. */
START_TEST(symlink_outside_refused) {
    char secret[PATH_MAX], link[PATH_MAX];
    hkw_stats st;
    refusal f;

    path_in(secret, sizeof secret, root, "passwd");
    write_at(secret, "root:x:0:0:SECRET-LINE:/root:/bin/bash\n");
    path_in(link, sizeof link, dir, "p.cu");
    ck_assert_int_eq(symlink(secret, link), 0);
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_refusals(1);
    ck_assert(refusal_of("p.cu", &f));
    ck_assert_str_eq(f.module, "p");
    ck_assert_ptr_nonnull(strstr(f.why, "outside the watched directory"));
    ck_assert_ptr_null(strstr(f.why, "SECRET"));
    write_at(secret, "root:x:0:0:SECRET-LINE-2:/root:/bin/bash\n");
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 0);
    hkw_stats_get(w, &st);
    ck_assert_uint_eq(st.opens, 0);
    ck_assert_uint_eq(st.refusals, 1);
    /* Pointing the link elsewhere outside is a change: refused again. */
    ck_assert_int_eq(unlink(link), 0);
    ck_assert_int_eq(symlink("/etc/hostname", link), 0);
    expect_refusals(2);
    ck_assert_int_eq(rec_count(), 0);
}
END_TEST

/* A file another user owns, or one anyone may write, does not become a
 * module, whoever could put it in the directory (a group, a sticky one). */
START_TEST(foreign_or_open_files_refused) {
    char p[PATH_MAX];
    refusal f;
    write_file("open.cu", "__global__ void k() {}\n");
    path_in(p, sizeof p, dir, "open.cu");
    ck_assert_int_eq(chmod(p, 0666), 0);
    int n = 1;
    if (geteuid() == 0) {
        write_file("theirs.cu", "__global__ void k() {}\n");
        path_in(p, sizeof p, dir, "theirs.cu");
        ck_assert_int_eq(chown(p, 54321, 54321), 0);
        n = 2;
    } else {
        fprintf(stderr, "SKIP part of foreign_or_open_files_refused: another user's file needs "
                        "root to make\n");
    }
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_refusals(n);
    ck_assert_int_eq(rec_count(), 0);
    ck_assert(refusal_of("open.cu", &f));
    ck_assert_msg(strstr(f.why, "writable by others"), "%s", f.why);
    if (n == 2) {
        ck_assert(refusal_of("theirs.cu", &f));
        ck_assert_msg(strstr(f.why, "owned by uid 54321"), "%s", f.why);
    }
}
END_TEST

/* Links that resolve inside the directory are followed, and an edit of the
 * target (in a subdirectory, or beside the link) hands the link over. */
START_TEST(symlink_inside_followed) {
    char sub[PATH_MAX], p[PATH_MAX];

    path_in(sub, sizeof sub, dir, "src");
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    path_in(p, sizeof p, sub, "impl.cu");
    write_at(p, "k v1");
    write_file("base.ptx", "b v1");
    path_in(p, sizeof p, dir, "k.cu");
    ck_assert_int_eq(symlink("src/impl.cu", p), 0);
    path_in(p, sizeof p, dir, "alias.ptx");
    ck_assert_int_eq(symlink("base.ptx", p), 0);
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(3); /* k, base, alias */
    ck_assert_str_eq(rec_last("k"), "k v1");
    ck_assert_str_eq(rec_last("alias"), "b v1");

    path_in(p, sizeof p, sub, "impl.cu");
    write_at(p, "k v2");
    expect_total(4);
    ck_assert_str_eq(rec_last("k"), "k v2");
    write_file("base.ptx", "b v2");
    expect_total(6);
    ck_assert_str_eq(rec_last("base"), "b v2");
    ck_assert_str_eq(rec_last("alias"), "b v2");
    pthread_mutex_lock(&rec.mu);
    ck_assert_int_eq(rec.nf, 0);
    pthread_mutex_unlock(&rec.mu);
}
END_TEST

/* A FIFO or a socket is never opened: one refusal each, not repeated while
 * nothing changes, again when it does. */
START_TEST(special_files_refused_once) {
    char p[PATH_MAX];
    struct sockaddr_un sa;
    hkw_stats st;
    refusal f;
    int sfd;

    path_in(p, sizeof p, dir, "f.cu");
    ck_assert_int_eq(mkfifo(p, 0644), 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    path_in(p, sizeof p, dir, "s.ptx");
    ck_assert(strlen(p) < sizeof sa.sun_path);
    memcpy(sa.sun_path, p, strlen(p) + 1);
    sfd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(sfd, 0);
    ck_assert_int_eq(bind(sfd, (struct sockaddr *)&sa, sizeof sa), 0);
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_refusals(2);
    ck_assert(refusal_of("f.cu", &f));
    ck_assert_ptr_nonnull(strstr(f.why, "FIFO"));
    ck_assert_int_eq(f.err, HK_ERR_IO);
    ck_assert(refusal_of("s.ptx", &f));
    ck_assert_ptr_nonnull(strstr(f.why, "socket"));
    hkw_stats_get(w, &st);
    ck_assert_uint_eq(st.opens, 0);
    ck_assert_uint_eq(st.retries, 0);
    path_in(p, sizeof p, dir, "f.cu");
    ck_assert_int_eq(unlink(p), 0); /* a new FIFO in its place is a change */
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    expect_refusals(3);
    ck_assert_int_eq(rec_count(), 0);
    close(sfd);
}
END_TEST

/* A procfs file reports 0 bytes and then has content: it is refused once, not
 * re-read in a loop. Reached here through a link (outside links allowed). */
START_TEST(procfs_file_refused_once) {
    hkw_opts o;
    hkw_stats st;
    char p[PATH_MAX];
    refusal f;

    path_in(p, sizeof p, dir, "status.cu");
    ck_assert_int_eq(symlink("/proc/self/status", p), 0);
    hkw_opts_init(&o);
    o.follow_outside_links = 1;
    start_with(&o);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_refusals(1);
    ck_assert(refusal_of("status.cu", &f));
    ck_assert_ptr_nonnull(strstr(f.why, "pseudo-file"));
    ck_assert_ptr_null(strstr(f.why, "Pid"));
    usleep(SETTLE_MS * 1000);
    hkw_stats_get(w, &st);
    ck_assert_uint_eq(st.opens, 1);
    ck_assert_uint_eq(st.retries, 0);
    ck_assert_uint_eq(st.refusals, 1);
    ck_assert_int_eq(rec_count(), 0);
}
END_TEST

/* A module name of 64 characters or more is refused once per change; 63 is
 * handed over. */
START_TEST(long_module_name_refused) {
    char longname[80], okname[80], okmodule[64];
    refusal f;

    memset(longname, 'a', 64);
    snprintf(longname + 64, sizeof longname - 64, ".v2.cu");
    memset(okname, 'b', 63);
    snprintf(okname + 63, sizeof okname - 63, ".cu");
    snprintf(okmodule, sizeof okmodule, "%.63s", okname);
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    usleep(100 * 1000);
    write_file(longname, "L1");
    write_file(okname, "OK");
    expect_refusals(1);
    ck_assert_int_eq(rec_wait(1, WAIT_MS), 1);
    ck_assert_int_eq(rec_count_module(okmodule, 0), 1);
    ck_assert(refusal_of(longname, &f));
    ck_assert_int_eq(f.err, HK_ERR_INVALID);
    ck_assert_str_eq(f.module, "");
    ck_assert_ptr_nonnull(strstr(f.why, "64 characters"));
    ck_assert_ptr_nonnull(strstr(f.why, "63"));
    write_file(longname, "L2");
    expect_refusals(2);
    ck_assert_int_eq(rec_count(), 1);
}
END_TEST

/* A module name that could not be recorded (a line feed, bytes that are not
 * UTF-8, a control character) is refused once per change, as the engine
 * would refuse it; a UTF-8 name is handed over. */
START_TEST(unrecordable_module_name_refused) {
    static const char *const bad[] = {"two\nlines.cu", "lat\xe9.cu", "esc\x1b.ptx"};
    refusal f;

    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    usleep(100 * 1000);
    for (int i = 0; i < 3; i++)
        write_file(bad[i], "X");
    write_file("caf\xc3\xa9.cu", "OK");
    expect_refusals(3);
    ck_assert_int_eq(rec_wait(1, WAIT_MS), 1);
    ck_assert_int_eq(rec_count_module("caf\xc3\xa9", 0), 1);
    for (int i = 0; i < 3; i++) {
        ck_assert(refusal_of(bad[i], &f));
        ck_assert_int_eq(f.err, HK_ERR_INVALID);
        ck_assert_str_eq(f.module, "");
        ck_assert_msg(strstr(f.why, "module name"), "%s", f.why);
    }
    ck_assert_int_eq(rec_count(), 1);
}
END_TEST

void watch_refusals_tests(TCase *tc) {
    tcase_add_test(tc, symlink_outside_refused);
    tcase_add_test(tc, foreign_or_open_files_refused);
    tcase_add_test(tc, symlink_inside_followed);
    tcase_add_test(tc, special_files_refused_once);
    tcase_add_test(tc, procfs_file_refused_once);
    tcase_add_test(tc, long_module_name_refused);
    tcase_add_test(tc, unrecordable_module_name_refused);
}

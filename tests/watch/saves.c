/*
 * How editors save, and when a saved file is handed over: in place,
 * renamed over, deleted and created, vim's backup, sed -i, a burst of
 * writes, a slow writer, a file still open (quiet period or close), and
 * an empty file.
 */
#include "tests/watch/fixture.h"

START_TEST(save_in_place) {
    write_file("particles.cu", "v1");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(1);
    write_file("particles.cu", "v2 in place");
    expect_total(2);
    ck_assert_str_eq(rec_last("particles"), "v2 in place");
}
END_TEST

START_TEST(save_rename_over) {
    char tmp[PATH_MAX], dst[PATH_MAX];

    write_file("particles.cu", "v1");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(1);
    /* Both the hidden and the .tmp temporary names editors use. */
    path_in(tmp, sizeof tmp, dir, ".particles.cu.XXab12");
    path_in(dst, sizeof dst, dir, "particles.cu");
    write_at(tmp, "v2 renamed");
    ck_assert_int_eq(rename(tmp, dst), 0);
    expect_total(2);
    ck_assert_str_eq(rec_last("particles"), "v2 renamed");
    path_in(tmp, sizeof tmp, dir, "particles.cu.tmp");
    write_at(tmp, "v3 renamed");
    ck_assert_int_eq(rename(tmp, dst), 0);
    expect_total(3);
    ck_assert_str_eq(rec_last("particles"), "v3 renamed");
}
END_TEST

START_TEST(save_delete_create) {
    char p[PATH_MAX];

    write_file("particles.cu", "v1");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(1);
    path_in(p, sizeof p, dir, "particles.cu");
    ck_assert_int_eq(unlink(p), 0);
    write_at(p, "v2 recreated");
    expect_total(2);
    ck_assert_str_eq(rec_last("particles"), "v2 recreated");
}
END_TEST

START_TEST(save_vim_backup) {
    char p[PATH_MAX], bak[PATH_MAX], probe[PATH_MAX], swp[PATH_MAX];

    write_file("particles.cu", "v1");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(1);
    path_in(p, sizeof p, dir, "particles.cu");
    path_in(bak, sizeof bak, dir, "particles.cu~");
    path_in(probe, sizeof probe, dir, "4913");
    path_in(swp, sizeof swp, dir, ".particles.cu.swp");
    /* What vim does with 'writebackup' and 'backupcopy=no'. */
    write_at(swp, "swap");
    write_at(probe, "");
    ck_assert_int_eq(unlink(probe), 0);
    ck_assert_int_eq(rename(p, bak), 0);
    write_at(p, "v2 from vim");
    ck_assert_int_eq(chmod(p, 0644), 0);
    ck_assert_int_eq(unlink(bak), 0);
    ck_assert_int_eq(unlink(swp), 0);
    expect_total(2);
    ck_assert_str_eq(rec_last("particles"), "v2 from vim");
}
END_TEST

/* What `sed -i` does: the new text goes to sedXXXXXX beside the file, which
 * is then renamed over it. The temporary file is a dropping: one handover of
 * the new text, and no refusal of sed's file. */
START_TEST(save_sed_in_place) {
    char p[PATH_MAX], tmpf[PATH_MAX];

    write_file("particles.cu", "v1");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(1);
    path_in(p, sizeof p, dir, "particles.cu");
    path_in(tmpf, sizeof tmpf, dir, "sedq3ZkP0");
    write_at(tmpf, "v2 from sed");
    ck_assert_int_eq(chmod(tmpf, 0644), 0);
    /* The closed temporary file stays a while (sed on a long file), long
     * enough for the watcher to look at it. */
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rename(tmpf, p), 0);
    expect_total(2);
    ck_assert_str_eq(rec_last("particles"), "v2 from sed");
    ck_assert_int_eq(refusal_count(), 0);
}
END_TEST

/* Fifty saves in a row: each is read at once after its close, so several
 * may be handed over, but each handover is one whole save, they come in the
 * order of the saves, and the last one is the newest. */
START_TEST(burst_of_writes) {
    char buf[64];
    int n, last = -1;

    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    usleep(100 * 1000);
    for (int i = 0; i < 50; i++) {
        snprintf(buf, sizeof buf, "version %d", i);
        write_file("particles.cu", buf);
    }
    /* The newest content arrives; nothing follows it. */
    for (int i = 0; i < WAIT_MS / 10; i++) {
        const char *l = rec_last("particles");
        if (l && strcmp(l, "version 49") == 0)
            break;
        usleep(10 * 1000);
    }
    usleep(SETTLE_MS * 1000);
    ck_assert_str_eq(rec_last("particles"), "version 49");
    pthread_mutex_lock(&rec.mu);
    n = rec.n;
    for (int i = 0; i < n; i++) {
        int v = -1;
        char tail = 0;
        ck_assert_msg(sscanf(rec.r[i].content, "version %d%c", &v, &tail) == 1,
                      "handover %d is not one whole save: '%s'", i, rec.r[i].content);
        ck_assert_int_gt(v, last);
        last = v;
    }
    pthread_mutex_unlock(&rec.mu);
    ck_assert_int_ge(n, 1);
    ck_assert_int_le(n, 50);
}
END_TEST

START_TEST(slow_writer_not_handed_early) {
    char p[PATH_MAX];
    int fd;

    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    usleep(100 * 1000);
    path_in(p, sizeof p, dir, "particles.cu");
    fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "first half ", 11), 11);
    usleep(200 * 1000); /* well past the debounce period */
    ck_assert_int_eq(rec_count(), 0);
    ck_assert_int_eq(write(fd, "second half", 11), 11);
    ck_assert_int_eq(close(fd), 0);
    expect_total(1);
    ck_assert_str_eq(rec_last("particles"), "first half second half");
}
END_TEST

/* A completed save is read at once: with a quiet period of an hour, saves
 * that end with a close, a rename over the file, or a new file still
 * arrive. */
START_TEST(completed_save_read_at_once) {
    hkw_opts o;
    char tmp[PATH_MAX], dst[PATH_MAX];

    hkw_opts_init(&o);
    o.debounce_ms = 3600 * 1000;
    start_with(&o);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    write_file("particles.cu", "v1 in place");
    expect_total(1);
    ck_assert_str_eq(rec_last("particles"), "v1 in place");
    path_in(tmp, sizeof tmp, dir, ".particles.cu.XXab12");
    path_in(dst, sizeof dst, dir, "particles.cu");
    write_at(tmp, "v2 renamed over");
    ck_assert_int_eq(rename(tmp, dst), 0);
    expect_total(2);
    ck_assert_str_eq(rec_last("particles"), "v2 renamed over");
    ck_assert_int_eq(unlink(dst), 0);
    write_at(dst, "v3 deleted and created");
    expect_total(3);
    ck_assert_str_eq(rec_last("particles"), "v3 deleted and created");
}
END_TEST

/* A file written and kept open gets no completion event: with a quiet
 * period of an hour nothing is read while it stays open, and its close is
 * the completed save that hands it over. */
START_TEST(open_file_waits_for_quiet_or_close) {
    hkw_opts o;
    char p[PATH_MAX];
    int fd;

    hkw_opts_init(&o);
    o.debounce_ms = 3600 * 1000;
    o.open_wait_ms = 0;
    start_with(&o);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    path_in(p, sizeof p, dir, "particles.cu");
    fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "kept open", 9), 9);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 0);
    ck_assert_int_eq(close(fd), 0);
    expect_total(1);
    ck_assert_str_eq(rec_last("particles"), "kept open");
}
END_TEST

/* The fallback rule: a file kept open is read once quiet for the debounce
 * period and open for writing longer than open_wait_ms, while still open;
 * its close then hands nothing over again (same content). */
START_TEST(open_file_read_after_quiet_period) {
    hkw_opts o;
    char p[PATH_MAX];
    int fd;

    hkw_opts_init(&o);
    o.debounce_ms = 20;
    o.open_wait_ms = 60;
    start_with(&o);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    path_in(p, sizeof p, dir, "particles.cu");
    fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "written, never closed", 21), 21);
    ck_assert_int_eq(rec_wait(1, WAIT_MS), 1);
    ck_assert_str_eq(rec_last("particles"), "written, never closed");
    ck_assert_int_eq(close(fd), 0);
    expect_total(1);
}
END_TEST

static uint64_t opens_now(void) {
    hkw_stats st;
    hkw_stats_get(w, &st);
    return st.opens;
}

/* Truncated and closed, then written: the empty file seen right after its
 * close is not refused but looked at again after the quiet period, and
 * the content that follows is handed over. An empty file that stays empty
 * is refused after the quiet period. */
START_TEST(empty_after_close_looked_at_again) {
    hkw_opts o;

    hkw_opts_init(&o);
    o.debounce_ms = 3600 * 1000;
    start_with(&o);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    write_file("particles.cu", "");
    for (int i = 0; i < WAIT_MS / 10 && opens_now() < 1; i++)
        usleep(10 * 1000);
    ck_assert_uint_ge(opens_now(), 1); /* it was read, empty */
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(refusal_count(), 0);
    ck_assert_int_eq(rec_count(), 0);
    write_file("particles.cu", "the content after all");
    expect_total(1);
    ck_assert_str_eq(rec_last("particles"), "the content after all");
    ck_assert_int_eq(refusal_count(), 0);
}
END_TEST

START_TEST(empty_file_refused_after_quiet_period) {
    hkw_opts o;
    refusal f;

    hkw_opts_init(&o);
    o.debounce_ms = 20;
    start_with(&o);
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    write_file("particles.cu", "");
    expect_refusals(1);
    ck_assert(refusal_of("particles.cu", &f));
    ck_assert_ptr_nonnull(strstr(f.why, "empty"));
    ck_assert_uint_ge(opens_now(), 2); /* read at the close, then after the quiet period */
    ck_assert_int_eq(rec_count(), 0);
}
END_TEST

START_TEST(unchanged_not_handed_again) {
    char p[PATH_MAX];

    write_file("particles.cu", "same");
    start();
    ck_assert_int_eq(hkw_add_dir(w, dir), 0);
    expect_total(1);
    write_file("particles.cu", "same");
    path_in(p, sizeof p, dir, "particles.cu");
    ck_assert_int_eq(utimensat(AT_FDCWD, p, NULL, 0), 0);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 1);
    /* Changed, then changed back before the watcher looked (it is held, so
     * both saves' events wait in the queue): still the same. */
    hkw_pause(w, 1);
    write_file("particles.cu", "other");
    write_file("particles.cu", "same");
    hkw_pause(w, 0);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), 1);
}
END_TEST

void watch_saves_tests(TCase *tc) {
    tcase_add_test(tc, save_in_place);
    tcase_add_test(tc, save_rename_over);
    tcase_add_test(tc, save_delete_create);
    tcase_add_test(tc, save_vim_backup);
    tcase_add_test(tc, save_sed_in_place);
    tcase_add_test(tc, burst_of_writes);
    tcase_add_test(tc, slow_writer_not_handed_early);
    tcase_add_test(tc, completed_save_read_at_once);
    tcase_add_test(tc, open_file_waits_for_quiet_or_close);
    tcase_add_test(tc, open_file_read_after_quiet_period);
    tcase_add_test(tc, empty_after_close_looked_at_again);
    tcase_add_test(tc, empty_file_refused_after_quiet_period);
    tcase_add_test(tc, unchanged_not_handed_again);
}

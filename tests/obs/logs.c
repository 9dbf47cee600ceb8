/*
 * Logs and events: the engine's events reach the callback, from named
 * threads, on the program's thread through the queue when asked; the
 * options' log hears create; a callback cannot re-enter; HOTKERN_LOG
 * filters what stderr gets; the watcher says why it skips a file and
 * traces its debounce and headers.
 */
#include "tests/obs/fixture.h"

/* ---- logs ------------------------------------------------------------- */

START_TEST(engine_events_reach_the_callback) {
    char line[1024];
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_DEBUG), 0);
    ck_assert(hk_log_enabled(rt, HK_LOG_DEBUG));
    swap_ok("m", 1);
    swap_ok("m", 2);
    swap_bad("m");
    wait_line(HK_LOG_INFO, "engine", NEEDLES("committed m v2 (was v1)", " ms "), line, sizeof line);
    wait_line(HK_LOG_WARN, "engine", NEEDLES("refused m", "v2 runs on"), line, sizeof line);
    /* The refusal says why: the JIT's error, not only a code. */
    ck_assert_msg(strstr(line, "compilation failed") || strstr(line, "CUDA"), "%s", line);
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    wait_line(HK_LOG_DEBUG, "engine", NEEDLES("reclaimed m v1"), NULL, 0);
    /* Same image again: no version, a debug line. */
    swap_ok("m", 2);
    wait_line(HK_LOG_DEBUG, "engine", NEEDLES("v2 runs this image already"), NULL, 0);

    /* A higher minimum filters at the source; the level test is cheap. */
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_WARN), 0);
    ck_assert(!hk_log_enabled(rt, HK_LOG_INFO));
    pthread_mutex_lock(&logs.lock);
    logs.n = 0;
    pthread_mutex_unlock(&logs.lock);
    swap_ok("m", 3);
    swap_bad("m");
    wait_line(HK_LOG_WARN, "engine", NEEDLES("refused m", "v3 runs on"), NULL, 0);
    ck_assert_int_eq(find_line(HK_LOG_INFO, "engine", NEEDLES("committed"), NULL, 0), -1);
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, (hk_log_level)7), HK_ERR_INVALID);
}
END_TEST

START_TEST(callback_cannot_reenter) {
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_INFO), 0);
    try_set_log_inside = 1;
    swap_ok("m", 1);
    wait_line(HK_LOG_INFO, "engine", NEEDLES("committed m v1"), NULL, 0);
    pthread_mutex_lock(&logs.lock);
    int busy = logs.busy;
    pthread_mutex_unlock(&logs.lock);
    ck_assert_int_eq(busy, HK_ERR_BUSY);
    /* The message logged from inside was dropped, and the callback stays. */
    ck_assert_int_eq(find_line(HK_LOG_ERROR, "test", NEEDLES("from the callback"), NULL, 0), -1);
    hk_log(rt, HK_LOG_WARN, NULL, "an application's line\nwith a newline");
    wait_line(HK_LOG_WARN, "app", NEEDLES("an application's line with a newline"), NULL, 0);
}
END_TEST

/* Runs fn with stderr sent to a file; returns what was printed. */
static char *capture_stderr(void (*fn)(void)) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/stderr.txt", tmp);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 2);
    close(fd);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char *text = NULL;
    size_t len;
    ck_assert_int_eq(hku_read_file(path, 1 << 20, &text, &len, NULL), 0);
    return text;
}

static void swaps_here(void) {
    static int tag = 1;
    swap_ok("m", tag++);
    swap_bad("m");
}

static void swaps_on_a_new_runtime(void) {
    hk_runtime_destroy(rt);
    rt = make_rt(); /* HOTKERN_LOG is read here */
    swaps_here();
}

START_TEST(hotkern_log_env_filters) {
    setenv("HOTKERN_LOG", "warn", 1);
    char *out = capture_stderr(swaps_on_a_new_runtime);
    ck_assert_msg(strstr(out, "hotkern: warn engine: refused m from api"), "%s", out);
    ck_assert_msg(!strstr(out, "committed"), "%s", out);
    ck_assert_msg(!strstr(out, "hotkern: info") && !strstr(out, "hotkern: debug"), "%s", out);
    /* One line per message. */
    for (const char *p = out; *p; p = strchr(p, '\n') + 1)
        ck_assert_msg(!strncmp(p, "hotkern: ", 9) && strchr(p, '\n'), "%s", out);
    free(out);

    setenv("HOTKERN_LOG", "info", 1);
    out = capture_stderr(swaps_on_a_new_runtime);
    ck_assert_msg(strstr(out, "hotkern: info engine: committed m v1"), "%s", out);
    free(out);

    /* A callback takes over from stderr; without one, HOTKERN_LOG again. */
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_WARN), 0);
    out = capture_stderr(swaps_here);
    ck_assert_msg(out[0] == '\0', "%s", out);
    free(out);
    wait_line(HK_LOG_WARN, "engine", NEEDLES("refused m"), NULL, 0);
    ck_assert_int_eq(hk_runtime_set_log(rt, NULL, NULL, HK_LOG_OFF), 0);
    out = capture_stderr(swaps_here);
    ck_assert_msg(strstr(out, "hotkern: info engine: committed m"), "%s", out);
    free(out);

    /* Unset: silent. Not a level: one line that says so (once per
     * process), nothing else. */
    unsetenv("HOTKERN_LOG");
    out = capture_stderr(swaps_on_a_new_runtime);
    ck_assert_msg(out[0] == '\0', "%s", out);
    free(out);
    setenv("HOTKERN_LOG", "verbose", 1);
    out = capture_stderr(swaps_on_a_new_runtime);
    ck_assert_msg(!strcmp(out, "hotkern: HOTKERN_LOG=verbose is not a level (debug, info, warn, "
                               "error, off): no messages on stderr\n"),
                  "%s", out);
    free(out);
    out = capture_stderr(swaps_on_a_new_runtime);
    ck_assert_msg(out[0] == '\0', "%s", out);
    free(out);
}
END_TEST

/* ---- the watcher ------------------------------------------------------ */

static void write_file(const char *name, const char *text) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    ck_assert_int_eq(hkt_write_file(path, text), 0);
}

START_TEST(watcher_says_why_it_skips) {
    char line[1024];
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_INFO), 0);
    ck_assert_int_eq(hk_watch_dir(rt, tmp, NULL, &rep), 0);
    write_file("notes.txt", "remember the milk\n");
    wait_line(HK_LOG_WARN, "watch", NEEDLES("notes.txt refused", "not a kernel source"), line,
              sizeof line);
    ck_assert_msg(!strstr(line, "milk"), "content quoted: %s", line);

    char *src = strdup(fake_ptx(1, 0, 0, 0));
    write_file("m.ptx", src);
    wait_line(HK_LOG_INFO, "watch", NEEDLES("m.ptx: handed over as module m"), NULL, 0);
    wait_line(HK_LOG_INFO, "engine", NEEDLES("committed m v1", "from watch:"), NULL, 0);
    /* Saved again with the same content: read, and not handed over. */
    write_file("m.ptx", src);
    wait_line(HK_LOG_INFO, "watch", NEEDLES("m.ptx: content unchanged", "not handed over"), NULL,
              0);
    /* Named a cubin, holding text: refused before the engine sees it. */
    write_file("k.cubin", "just some text, no ELF\n");
    wait_line(HK_LOG_WARN, "watch", NEEDLES("k.cubin refused", "not a cubin"), NULL, 0);
    free(src);
    /* Said once, by the watcher: the engine did not see these files. */
    ck_assert_int_eq(find_line(HK_LOG_WARN, "engine", NEEDLES("notes.txt"), NULL, 0), -1);
    ck_assert_int_eq(find_line(HK_LOG_WARN, "engine", NEEDLES("k.cubin"), NULL, 0), -1);

    char *text = metrics();
    assert_valid(text);
    ck_assert_msg(sample_value(text, "hotkern_watch_unchanged_total") == 1, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_watch_refusals_total") >= 1, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_watch_handovers_total") >= 2, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_watch_events_total") >= 3, "%s", text);
    free(text);
}
END_TEST

/* The watcher alone, with its trace at every level: events coalesced by the
 * debounce, and a source due again for a changed header. */
static void trace(void *ud, hk_log_level level, const char *line) {
    on_log(level, "trace", line, ud);
}

static void watch_sink(void *ud, const char *module, const char *path, const void *bytes,
                       size_t size) {}

START_TEST(watcher_trace_debounce_and_headers) {
    hkw_watcher *w;
    hkw_opts o;
    hkw_opts_init(&o);
    o.fn = watch_sink;
    o.debounce_ms = 300; /* the writes below land well within it, and the
                          * close reads them at once, all in one */
    o.log = trace;
    ck_assert_int_eq(hkw_create(&w, &o), 0);
    ck_assert_int_eq(hkw_add_dir(w, tmp), 0);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/s.ptx", tmp);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    setvbuf(f, NULL, _IONBF, 0);
    fputs(".version 8.0\n", f);
    fputs(".target sm_90\n", f);
    fclose(f);
    wait_line(HK_LOG_DEBUG, "trace", NEEDLES("s.ptx:", "events since it was last read, one read"),
              NULL, 0);
    wait_line(HK_LOG_INFO, "trace", NEEDLES("s.ptx: handed over as module s"), NULL, 0);
    const char *deps[] = {"common.cuh"};
    write_file("common.cuh", "#define X 1\n");
    ck_assert_int_eq(hkw_set_deps(w, path, deps, 1), 0);
    write_file("common.cuh", "#define X 2\n");
    wait_line(HK_LOG_INFO, "trace", NEEDLES("common.cuh changed", "s.ptx, whose build read it"),
              NULL, 0);
    hkw_stats st;
    hkw_stats_get(w, &st);
    ck_assert_uint_ge(st.dep_rebuilds, 1);
    hkw_destroy(w);
}
END_TEST

/* Events on the program's thread: a queue the program drains, a descriptor
 * it can poll, the oldest dropped (and counted) when it is full, a waiting
 * taker woken by an event and by destroy. */
static void *take_one(void *arg) {
    hk_queued_event e = HK_QUEUED_EVENT_INIT;
    intptr_t r = hk_next_event(arg, &e, -1);
    return (void *)r;
}

START_TEST(event_queue_on_the_programs_thread) {
    hk_queued_event e = HK_QUEUED_EVENT_INIT;
    ck_assert_int_eq(hk_event_fd(rt), -1);
    ck_assert_int_eq(hk_next_event(rt, &e, 0), HK_ERR_INVALID);
    ck_assert_int_eq(hk_events_queue(rt, 2), 0);
    int fd = hk_event_fd(rt);
    ck_assert_int_ge(fd, 0);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 0), 0);
    ck_assert_int_eq(hk_next_event(rt, &e, 0), 0);
    hk_report rep = HK_REPORT_INIT;
    /* First versions of three modules: three events, nothing to reclaim. */
    const char *mods[] = {"q1", "q2", "q3"};
    for (int i = 0; i < 3; i++) {
        const char *src = fake_ptx(i + 1, 0, 0, 0);
        ck_assert_int_eq(hk_swap(rt, mods[i], src, strlen(src), NULL, &rep), 0);
    }
    ck_assert_int_eq(poll(&p, 1, 0), 1);
    ck_assert_int_eq(hk_next_event(rt, &e, 0), 1);
    ck_assert_int_eq(e.kind, HK_EVENT_COMMITTED);
    ck_assert_str_eq(e.module, "q2"); /* q1's event went: the queue holds 2 */
    ck_assert_uint_eq(e.new_version, 1);
    ck_assert_uint_eq(e.dropped, 1);
    ck_assert_int_eq(hk_next_event(rt, &e, 0), 1);
    ck_assert_str_eq(e.module, "q3");
    ck_assert_str_eq(e.origin, "api");
    ck_assert_uint_eq(e.dropped, 0);
    ck_assert_int_eq(poll(&p, 1, 0), 0); /* drained */
    /* A refusal carries its error and message. */
    ck_assert_int_ne(hk_swap(rt, "q1", "SYNTAX ERROR", 12, NULL, &rep), 0);
    ck_assert_int_eq(hk_next_event(rt, &e, 1000), 1);
    ck_assert_int_eq(e.kind, HK_EVENT_REFUSED);
    ck_assert_int_lt(e.error, 0);
    ck_assert_str_ne(e.message, "");
    /* A taker waiting for ever is woken by an event... */
    pthread_t t;
    pthread_create(&t, NULL, take_one, rt);
    usleep(50 * 1000);
    const char *src = fake_ptx(4, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "q4", src, strlen(src), NULL, &rep), 0);
    void *r;
    pthread_join(t, &r);
    ck_assert_int_eq((intptr_t)r, 1);
    /* ... and by destroy, which it does not outlive. */
    pthread_create(&t, NULL, take_one, rt);
    usleep(50 * 1000);
    hk_runtime_destroy(rt);
    rt = NULL;
    pthread_join(t, &r);
    ck_assert_int_eq((intptr_t)r, HK_ERR_CLOSED);
    hk_report_clear(&rep);
}
END_TEST

/* A log callback in the options hears what create says: here that the
 * compile cache's directory, writable by others, is not used. */
START_TEST(options_log_hears_create) {
    char bad[600];
    snprintf(bad, sizeof bad, "%s/shared-cache", tmp);
    ck_assert_int_eq(mkdir(bad, 0700), 0);
    ck_assert_int_eq(chmod(bad, 0777), 0);
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    ck_assert_int_eq(o.log_min_level, HK_LOG_INFO);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = bad;
    o.no_warm_start = 1;
    o.log = on_log;
    o.log_min_level = HK_LOG_WARN;
    hk_runtime *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&r, &o, fake_driver(), &rep), 0);
    /* Logged during create, synchronously: no wait. */
    ck_assert_int_ge(find_line(HK_LOG_WARN, "engine", NEEDLES("builds are not cached"), NULL, 0),
                     0);
    hk_runtime_destroy(r);
    hk_report_clear(&rep);
}
END_TEST

/* The threads of a runtime and of its watch carry names (top -H, gdb,
 * profilers): read back from /proc. */
static int has_thread(const char *name) {
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int found = 0;
    while (d && !found && (e = readdir(d))) {
        char p[300], comm[32] = "";
        snprintf(p, sizeof p, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(p, "r");
        if (f && fgets(comm, sizeof comm, f)) {
            comm[strcspn(comm, "\n")] = 0;
            found = !strcmp(comm, name);
        }
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return found;
}

START_TEST(threads_are_named) {
    /* (A thread names itself first thing, once it runs.) */
    for (int i = 0; i < 500 && !(has_thread("hk-reclaim") && has_thread("hk-worker")); i++)
        usleep(10000);
    ck_assert(has_thread("hk-reclaim"));
    ck_assert(has_thread("hk-worker"));
    ck_assert(!has_thread("hk-watch"));
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hk_watch_dir(rt, tmp, NULL, &rep), 0);
    for (int i = 0; i < 500 && !has_thread("hk-watch"); i++)
        usleep(10000);
    ck_assert(has_thread("hk-watch"));
    hk_report_clear(&rep);
}
END_TEST

void obs_logs_tests(TCase *tc) {
    tcase_add_test(tc, engine_events_reach_the_callback);
    tcase_add_test(tc, threads_are_named);
    tcase_add_test(tc, options_log_hears_create);
    tcase_add_test(tc, event_queue_on_the_programs_thread);
    tcase_add_test(tc, callback_cannot_reenter);
    tcase_add_test(tc, hotkern_log_env_filters);
    tcase_add_test(tc, watcher_says_why_it_skips);
    tcase_add_test(tc, watcher_trace_debounce_and_headers);
}

/*
 * The runtime's watch API (hk_watch_dir): a directory watched into
 * builds and swaps, header dependencies on disk and in memory, refusals
 * that never quote the file's content, saves during a slow build, and the
 * open-file fallback.
 */
#include "tests/watch/fixture.h"

static void hook_arm(hkl_hook_point p) {
    pthread_mutex_lock(&hook_lock);
    hook_at = p;
    hook_armed = 1;
    hook_inside = hook_release = 0;
    pthread_mutex_unlock(&hook_lock);
}

static void hook_wait_inside(void) {
    pthread_mutex_lock(&hook_lock);
    while (!hook_inside)
        pthread_cond_wait(&hook_cond, &hook_lock);
    pthread_mutex_unlock(&hook_lock);
}

START_TEST(api_watch_dir) {
    hk_report rep = HK_REPORT_INIT;
    char p[PATH_MAX], origin[PATH_MAX + 16];

    write_file("step.ptx", ptx_text(1));
    usleep(60 * 1000);
    ck_assert_int_eq(hk_watch_dir(NULL, dir, NULL, &rep), HK_ERR_INVALID);
    path_in(p, sizeof p, root, "missing");
    ck_assert_int_eq(hk_watch_dir(rt, p, NULL, &rep), HK_ERR_IO);
    ck_assert_int_eq(rep.error, HK_ERR_IO);
    ck_assert_ptr_nonnull(strstr(rep.message, "missing"));
    hk_report_clear(&rep);

    ck_assert_int_eq(hk_watch_dir(rt, dir, NULL, &rep), 0);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    path_in(p, sizeof p, dir, "step.ptx");
    snprintf(origin, sizeof origin, "watch:%s", p);
    wait_events(&ev_committed, 1);
    pthread_mutex_lock(&ev_mu);
    ck_assert_str_eq(ev_origin, origin);
    pthread_mutex_unlock(&ev_mu);

    write_file("step.ptx", ptx_text(2));
    ck_assert_uint_eq(wait_version("step", 2), 2);

    /* A broken save is refused; the running version stays. */
    write_file("step.ptx", "SYNTAX ERROR\n");
    wait_events(&ev_refused, 1);
    ck_assert_uint_eq(hk_module_version(rt, "step"), 2);
    write_file("step.ptx", ptx_text(3));
    ck_assert_uint_eq(wait_version("step", 3), 3);
    /* Watching the same directory again adds no second handover. */
    ck_assert_int_eq(hk_watch_dir(rt, dir, NULL, NULL), 0);
    usleep(SETTLE_MS * 1000);
    ck_assert_uint_eq(hk_module_version(rt, "step"), 3);
}
END_TEST

/* A directory any user may add files to is not watched, sticky or not. */
START_TEST(api_open_directory_refused) {
    hk_report rep = HK_REPORT_INIT;
    const unsigned modes[] = {0777, 01777};
    for (size_t i = 0; i < 2; i++) {
        ck_assert_int_eq(chmod(dir, modes[i]), 0);
        ck_assert_int_eq(hk_watch_dir(rt, dir, NULL, &rep), HK_ERR_IO);
        ck_assert_msg(strstr(rep.message, dir) && strstr(rep.message, "writable by others"), "%s",
                      rep.message);
        hk_report_clear(&rep);
    }
    ck_assert_int_eq(chmod(dir, 0755), 0);
    ck_assert_int_eq(hk_watch_dir(rt, dir, NULL, &rep), 0);
}
END_TEST

START_TEST(api_header_dependency) {
    hk_swap_options so;
    const char *inc[1];
    char incopt[PATH_MAX + 4];

    /* CUDA C through NVRTC (on the CPU), which reports the header it read. */
    write_file("common.cuh", "#define TAG 1\n");
    write_file("k.cu", "#include \"common.cuh\"\n"
                       "extern \"C\" __global__ void step(int *out, unsigned n) {\n"
                       "    if (out) *out = TAG;\n}\n");
    usleep(60 * 1000);
    hk_swap_options_init(&so);
    snprintf(incopt, sizeof incopt, "-I%s", dir);
    inc[0] = incopt;
    so.nvrtc_options = inc;
    so.nnvrtc_options = 1;
    ck_assert_int_eq(hk_watch_dir(rt, dir, &so, NULL), 0);
    if (wait_version("k", 1) < 1 && events_of(&ev_refused) > 0) {
        /* No usable NVRTC here: nothing more to check. */
        return;
    }
    ck_assert_uint_eq(hk_module_version(rt, "k"), 1);
    usleep(SETTLE_MS * 1000);
    write_file("common.cuh", "#define TAG 2\n");
    ck_assert_uint_eq(wait_version("k", 2), 2);
    usleep(SETTLE_MS * 1000);
    ck_assert_uint_eq(hk_module_version(rt, "k"), 2);
}
END_TEST

/* The directory's headers travel in memory: an angle-bracket include with no
 * -I builds, and an edit to the header builds the source again. */
START_TEST(api_headers_in_memory) {
    uint64_t dptr;
    size_t size = 0;

    write_file("common.cuh", "#define K 3\n");
    write_file("m.cu", "#include <common.cuh>\n"
                       "__device__ int arr[K];\n"
                       "extern \"C\" __global__ void step(int *out, unsigned n) {\n"
                       "    if (out) *out = arr[n];\n}\n");
    usleep(60 * 1000);
    ck_assert_int_eq(hk_watch_dir(rt, dir, NULL, NULL), 0);
    ck_assert_uint_eq(wait_version("m", 1), 1);
    ck_assert_int_eq(hk_module_global(rt, "m", "arr", 0, &dptr, &size), 0);
    ck_assert_uint_eq(size, 3 * sizeof(int));
    usleep(SETTLE_MS * 1000);
    write_file("common.cuh", "#define K 5\n");
    ck_assert_uint_eq(wait_version("m", 2), 2);
    ck_assert_int_eq(hk_module_global(rt, "m", "arr", 0, &dptr, &size), 0);
    ck_assert_uint_eq(size, 5 * sizeof(int));
    /* A broken header is refused; version 2 keeps running. */
    usleep(SETTLE_MS * 1000);
    write_file("common.cuh", "#define K (\n");
    wait_events(&ev_refused, 1);
    ck_assert_uint_eq(hk_module_version(rt, "m"), 2);
}
END_TEST

/* Whatever is refused, the event names the file and the reason, and carries
 * nothing of its content; a real CUDA C compile error keeps NVRTC's log. */
START_TEST(api_refusals_never_quote_content) {
    static const char junk[] = "\x7f\x01\x02SECRET\x00\x00\xff\xfe";
    char p[PATH_MAX], secret[PATH_MAX], longname[80];
    static const char *const names[] = {"p.cu", "k.cubin",  "j.ptx",
                                        "b.cu", "f.fatbin", "notes.txt"};
    int fd;

    path_in(secret, sizeof secret, root, "passwd");
    write_at(secret, "root:x:0:0:SECRET:/root:/bin/bash\ndaemon:x:1:1:SECRET:/:/bin/sh\n");
    path_in(p, sizeof p, dir, "p.cu");
    ck_assert_int_eq(symlink(secret, p), 0);
    write_file("k.cubin", "SECRET text in a cubin\n");
    write_file("j.ptx", "root:x:0:0:SECRET:/root:/bin/bash\n");
    path_in(p, sizeof p, dir, "b.cu");
    fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    ck_assert_int_eq(close(fd), 0);
    path_in(p, sizeof p, dir, "f.fatbin");
    ck_assert_int_eq(mkfifo(p, 0644), 0);
    memset(longname, 'm', 64);
    snprintf(longname + 64, sizeof longname - 64, ".cu");
    usleep(60 * 1000);
    ck_assert_int_eq(hk_watch_dir(rt, dir, NULL, NULL), 0);
    usleep(100 * 1000);
    write_file("notes.txt", "SECRET notes\n");
    write_file(longname, "SECRET\n");
    wait_events(&ev_refused, 7);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(events_of(&ev_refused), 7);
    ck_assert_int_eq(events_of(&ev_committed), 0);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        refused_event e = refused_for(names[i]);
        path_in(p, sizeof p, dir, names[i]);
        ck_assert_msg(strstr(e.message, p) != NULL, "%s: %s", names[i], e.message);
        ck_assert_msg(strstr(e.message, "SECRET") == NULL, "%s: %s", names[i], e.message);
        ck_assert_msg(!e.log || strstr(e.log, "SECRET") == NULL, "%s: %s", names[i], e.log);
        ck_assert_int_lt(e.error, 0);
    }
    ck_assert_ptr_nonnull(strstr(refused_for("p.cu").message, "outside the watched directory"));
    ck_assert_str_eq(refused_for("p.cu").module, "p");
    ck_assert_ptr_nonnull(strstr(refused_for("k.cubin").message, "not a cubin"));
    ck_assert_ptr_nonnull(strstr(refused_for("j.ptx").message, "not PTX"));
    ck_assert_ptr_nonnull(strstr(refused_for("b.cu").message, "not CUDA C, PTX, cubin or fatbin"));
    snprintf(p, sizeof p, "%zu bytes", sizeof junk);
    ck_assert_ptr_nonnull(strstr(refused_for("b.cu").message, p));
    ck_assert_ptr_nonnull(strstr(refused_for("f.fatbin").message, "FIFO"));
    ck_assert_ptr_nonnull(strstr(refused_for(longname).message, "the most is 63"));
    ck_assert_str_eq(refused_for(longname).module, "");

    /* CUDA C that fails to compile: NVRTC's log names the error. */
    write_file("bad.cu", "extern \"C\" __global__ void step(int *out, unsigned n) {\n"
                         "    *out = undeclared_name_in_bad_cu;\n}\n");
    wait_events(&ev_refused, 8);
    refused_event e = refused_for("bad.cu");
    ck_assert_int_eq(e.error, HK_ERR_COMPILE);
    ck_assert_ptr_nonnull(e.log);
    ck_assert_ptr_nonnull(strstr(e.log, "undeclared_name_in_bad_cu"));
}
END_TEST

/* 1 when the worker's queue holds a job whose content carries this tag. */
static int queued_with_tag(int tag) {
    char needle[32];
    int found = 0;
    snprintf(needle, sizeof needle, "// tag: %d\n", tag);
    pthread_mutex_lock(&rt->work.lock);
    for (hkl_job *j = rt->work.jobs; j && !found; j = j->next)
        found = memmem(j->data, j->size, needle, strlen(needle)) != NULL;
    pthread_mutex_unlock(&rt->work.lock);
    return found;
}

/* A save the way vim or sed -i make it: a temporary file renamed over. */
static void save_renamed(const char *name, const char *content) {
    static int n;
    char tmp[PATH_MAX], dst[PATH_MAX], base[128];
    snprintf(base, sizeof base, ".%s.%d.tmp", name, n++);
    path_in(tmp, sizeof tmp, dir, base);
    path_in(dst, sizeof dst, dir, name);
    write_at(tmp, content);
    ck_assert_int_eq(rename(tmp, dst), 0);
}

static void set_kernel(hk_kernel *k) {
    pthread_mutex_lock(&ev_mu);
    ev_kernel = k;
    pthread_mutex_unlock(&ev_mu);
}

/* Saves during a slow build (the worker held right after the compile of
 * tag 2): that build is superseded, the saves queued behind it are never
 * built but the newest, only the newest content (tag 6) is committed, no
 * older one after it, and every submission ends with one outcome. */
START_TEST(api_saves_during_slow_build) {
    hk_watch *wa = NULL;
    hk_kernel *k;
    uint64_t h0, h;

    write_file("step.ptx", ptx_text(1));
    usleep(60 * 1000);
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wa, NULL), 0);
    ck_assert_ptr_nonnull(wa);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    ck_assert_int_eq(hk_kernel_get(rt, "step", "step", &k), 0);
    set_kernel(k);
    h0 = metric("hotkern_watch_handovers_total");
    ck_assert_uint_eq(h0, 1);

    hook_arm(HKL_HOOK_COMPILED);
    write_file("step.ptx", ptx_text(2));
    hook_wait_inside(); /* tag 2 is in its build, and stays there */
    save_renamed("step.ptx", ptx_text(3));
    write_file("step.ptx", ptx_text(4));
    save_renamed("step.ptx", ptx_text(5));
    write_file("step.ptx", ptx_text(6));
    for (int i = 0; i < WAIT_MS / 10 && !queued_with_tag(6); i++)
        usleep(10 * 1000);
    ck_assert(queued_with_tag(6));
    ck_assert_uint_eq(hk_module_version(rt, "step"), 1);
    hook_go();
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);

    h = metric("hotkern_watch_handovers_total") - h0; /* submissions since */
    ck_assert_uint_ge(h, 2);
    ck_assert_uint_eq(hk_module_version(rt, "step"), 2);
    void *fn = NULL;
    ck_assert_int_eq(hk_kernel_function(k, &fn), 0);
    ck_assert_int_eq(fake_tag_of(fn), 6);
    pthread_mutex_lock(&ev_mu);
    ck_assert_int_eq(ev_ntags, 1); /* one commit since the handle: the newest */
    ck_assert_int_eq(ev_tags[0], 6);
    ck_assert_int_eq(ev_committed, 2);
    ck_assert_int_eq(ev_superseded, (int)h - 1);
    ck_assert_int_eq(ev_refused, ev_superseded); /* nothing else was refused */
    pthread_mutex_unlock(&ev_mu);

    /* Saves one at a time, after the burst: each commits. */
    write_file("step.ptx", ptx_text(7));
    ck_assert_uint_eq(wait_version("step", 3), 3);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    pthread_mutex_lock(&ev_mu);
    ck_assert_int_eq(ev_ntags, 2);
    ck_assert_int_eq(ev_tags[1], 7);
    pthread_mutex_unlock(&ev_mu);
    hk_watch_stop(wa);
}
END_TEST

/* A completed save builds at once: with a quiet period of an hour, saves in
 * place and renamed over still commit (and the files present at the start
 * are built at once too). */
START_TEST(api_completed_save_builds_at_once) {
    hk_watch_options wo;
    hk_watch *wa = NULL;

    write_file("step.ptx", ptx_text(1));
    usleep(60 * 1000);
    hk_watch_options_init(&wo);
    wo.debounce_ms = 3600 * 1000;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    write_file("step.ptx", ptx_text(2));
    ck_assert_uint_eq(wait_version("step", 2), 2);
    save_renamed("step.ptx", ptx_text(3));
    ck_assert_uint_eq(wait_version("step", 3), 3);
    hk_watch_stop(wa);
}
END_TEST

/* The fallback rule through the runtime: a save kept open builds once the
 * file has been quiet for debounce_ms (and open longer than open_wait_ms),
 * before its close, which then builds nothing again. */
START_TEST(api_open_file_fallback) {
    hk_watch_options wo;
    hk_watch *wa = NULL;
    char p[PATH_MAX];
    const char *text;
    int fd;

    write_file("step.ptx", ptx_text(1));
    usleep(60 * 1000);
    hk_watch_options_init(&wo);
    wo.debounce_ms = 20;
    wo.open_wait_ms = 60;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    path_in(p, sizeof p, dir, "step.ptx");
    fd = open(p, O_WRONLY | O_TRUNC);
    ck_assert_int_ge(fd, 0);
    text = ptx_text(2);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    ck_assert_uint_eq(wait_version("step", 2), 2);
    ck_assert_int_eq(close(fd), 0);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    ck_assert_uint_eq(hk_module_version(rt, "step"), 2);
    hk_watch_stop(wa);
}
END_TEST

void watch_api_tests(TCase *tc) {
    tcase_add_test(tc, api_watch_dir);
    tcase_add_test(tc, api_open_directory_refused);
    tcase_add_test(tc, api_header_dependency);
    tcase_add_test(tc, api_headers_in_memory);
    tcase_add_test(tc, api_refusals_never_quote_content);
    tcase_add_test(tc, api_saves_during_slow_build);
    tcase_add_test(tc, api_completed_save_builds_at_once);
    tcase_add_test(tc, api_open_file_fallback);
}

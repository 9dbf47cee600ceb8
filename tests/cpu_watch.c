/*
 * watch/ against the ways files really change: each editor save pattern
 * must reach the callback exactly once with the final content, editor
 * droppings never, a header edit must reach every source that read it, and a
 * lost event queue or a recreated directory must not lose an update.
 *
 * Every test works in a fresh temporary directory with a recording callback;
 * waits are condition-variable waits bounded by timeouts, and "nothing more
 * arrives" is checked by waiting several debounce periods after the last
 * expected handover. Refusals are recorded the same way: what cannot be
 * handed over (a link out of the directory, a FIFO, a procfs file, a name the
 * engine would refuse) must be reported once per change, with a reason and
 * never the file's content. The last test case drives hk_watch_dir end to end
 * on the fake driver: files in, committed and refused versions out.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "loader/core.h"
#include "loader/job.h"
#include "watch/watch.h"
#include "tests/fakecuda.h"

#define MAX_RECORDS 512
#define WAIT_MS     3000 /* for something that must arrive */
#define SETTLE_MS   300  /* for something that must not */

typedef struct record {
    char module[64];
    char path[PATH_MAX];
    char *content; /* NUL-terminated copy */
    size_t size;
} record;

typedef struct refusal {
    char module[64]; /* "" when NULL */
    char path[PATH_MAX];
    int err;
    char why[PATH_MAX + 256];
} refusal;

typedef struct recorder {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    record r[MAX_RECORDS];
    int n;
    refusal f[64];
    int nf;
} recorder;

static recorder rec;
static char dir[PATH_MAX];  /* the watched directory, canonical */
static char root[PATH_MAX]; /* the temporary tree holding it */
static hkw_watcher *w;

/* ---- recorder ------------------------------------------------------------ */

static void rec_cb(void *ud, const char *module, const char *path, const void *bytes, size_t size) {
    recorder *r = ud;

    pthread_mutex_lock(&r->mu);
    if (r->n < MAX_RECORDS) {
        record *e = &r->r[r->n];
        snprintf(e->module, sizeof e->module, "%s", module);
        snprintf(e->path, sizeof e->path, "%s", path);
        e->content = malloc(size + 1);
        if (e->content) {
            memcpy(e->content, bytes, size);
            e->content[size] = '\0';
        }
        e->size = size;
        r->n++;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void rec_refuse_cb(void *ud, const char *module, const char *path, int err,
                          const char *why) {
    recorder *r = ud;

    pthread_mutex_lock(&r->mu);
    if (r->nf < (int)(sizeof r->f / sizeof r->f[0])) {
        refusal *e = &r->f[r->nf++];
        snprintf(e->module, sizeof e->module, "%s", module ? module : "");
        snprintf(e->path, sizeof e->path, "%s", path);
        snprintf(e->why, sizeof e->why, "%s", why);
        e->err = err;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void rec_init(recorder *r) {
    pthread_condattr_t ca;

    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
}

static void rec_fini(recorder *r) {
    for (int i = 0; i < r->n; i++)
        free(r->r[i].content);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
}

/* Waits until at least n records exist or timeout_ms passes; returns the
 * count then. */
static int rec_wait(int n, int timeout_ms) {
    struct timespec dl;
    int got;

    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&rec.mu);
    while (rec.n < n) {
        if (pthread_cond_timedwait(&rec.cv, &rec.mu, &dl) == ETIMEDOUT)
            break;
    }
    got = rec.n;
    pthread_mutex_unlock(&rec.mu);
    return got;
}

/* As rec_wait, for refusals. */
static int refusals_wait(int n, int timeout_ms) {
    int got = 0;

    for (int i = 0; i <= timeout_ms / 10; i++) {
        pthread_mutex_lock(&rec.mu);
        got = rec.nf;
        pthread_mutex_unlock(&rec.mu);
        if (got >= n)
            break;
        usleep(10 * 1000);
    }
    return got;
}

static int refusal_count(void) {
    int n;
    pthread_mutex_lock(&rec.mu);
    n = rec.nf;
    pthread_mutex_unlock(&rec.mu);
    return n;
}

/* Waits for n refusals, then SETTLE_MS more, and checks that exactly n
 * arrived. */
static void expect_refusals(int n) {
    ck_assert_int_ge(refusals_wait(n, WAIT_MS), n);
    usleep(SETTLE_MS * 1000);
    pthread_mutex_lock(&rec.mu);
    ck_assert_int_eq(rec.nf, n);
    pthread_mutex_unlock(&rec.mu);
}

static void path_in(char *out, size_t size, const char *d, const char *name);
static volatile int writer_stop;
static void *writer_main(void *arg);

/* A copy of the refusal of the file named name (last one), or 0. */
static int refusal_of(const char *name, refusal *out) {
    char p[PATH_MAX];
    int found = 0;

    path_in(p, sizeof p, dir, name);
    pthread_mutex_lock(&rec.mu);
    for (int i = rec.nf - 1; i >= 0 && !found; i--) {
        if (strcmp(rec.f[i].path, p) == 0) {
            *out = rec.f[i];
            found = 1;
        }
    }
    pthread_mutex_unlock(&rec.mu);
    return found;
}

static int rec_count(void) {
    int n;
    pthread_mutex_lock(&rec.mu);
    n = rec.n;
    pthread_mutex_unlock(&rec.mu);
    return n;
}

/* Handovers of module since record index `from`. */
static int rec_count_module(const char *module, int from) {
    int n = 0;
    pthread_mutex_lock(&rec.mu);
    for (int i = from; i < rec.n; i++)
        n += strcmp(rec.r[i].module, module) == 0;
    pthread_mutex_unlock(&rec.mu);
    return n;
}

/* Content of the last handover of module (a static copy), or NULL. */
static const char *rec_last(const char *module) {
    static char buf[4096];
    const char *res = NULL;

    pthread_mutex_lock(&rec.mu);
    for (int i = rec.n - 1; i >= 0; i--) {
        if (strcmp(rec.r[i].module, module) == 0 && rec.r[i].content) {
            snprintf(buf, sizeof buf, "%s", rec.r[i].content);
            res = buf;
            break;
        }
    }
    pthread_mutex_unlock(&rec.mu);
    return res;
}

/* Waits until n records exist, then SETTLE_MS more, and checks that exactly
 * n arrived. */
static void expect_total(int n) {
    ck_assert_int_ge(rec_wait(n, WAIT_MS), n);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), n);
}

/* ---- files --------------------------------------------------------------- */

static void path_in(char *out, size_t size, const char *d, const char *name) {
    int n = snprintf(out, size, "%s/%s", d, name);
    ck_assert(n > 0 && (size_t)n < size);
}

static void write_at(const char *path, const char *content) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    size_t len = strlen(content);

    ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
    ck_assert_int_eq(write(fd, content, len), (ssize_t)len);
    ck_assert_int_eq(close(fd), 0);
}

static void write_file(const char *name, const char *content) {
    char p[PATH_MAX];
    path_in(p, sizeof p, dir, name);
    write_at(p, content);
}

static void rm_rf(const char *path) {
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) {
        /* Nothing to do: a leftover temporary directory is harmless. */
    }
}

/* ---- fixture ------------------------------------------------------------- */

static void start_with(hkw_opts *o) {
    /* Files written within a clock tick of the watch being placed count as
     * possibly changed after it (the watcher errs towards a rebuild too many);
     * the tests want those written before to be plainly older. */
    usleep(60 * 1000);
    o->fn = rec_cb;
    o->refuse = rec_refuse_cb;
    o->ud = &rec;
    ck_assert_int_eq(hkw_create(&w, o), 0);
}

static void start(void) {
    hkw_opts o;
    hkw_opts_init(&o);
    o.dir_poll_ms = 50;
    start_with(&o);
}

static void setup(void) {
    char tmpl[] = "/tmp/hk_watch_XXXXXX";
    char *t = mkdtemp(tmpl);

    ck_assert(t != NULL);
    ck_assert(realpath(t, root) != NULL);
    path_in(dir, sizeof dir, root, "kernels");
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    rec_init(&rec);
    w = NULL;
}

static void teardown(void) {
    hkw_destroy(w);
    w = NULL;
    rec_fini(&rec);
    rm_rf(root);
}

/* ---- tests --------------------------------------------------------------- */

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

static void *writer_main(void *arg) {
    char buf[64];
    (void)arg;
    for (int i = 0; !__atomic_load_n(&writer_stop, __ATOMIC_RELAXED); i++) {
        snprintf(buf, sizeof buf, "content %d", i);
        write_file((i % 3) == 0 ? "a.cu" : (i % 3) == 1 ? "b.cu" : "c.cuh", buf);
        if (i % 64 == 0)
            usleep(1000);
    }
    return NULL;
}

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

/* ---- hk_watch_dir on the fake driver -------------------------------------- */

static hk_runtime *rt;
static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static int ev_committed, ev_refused, ev_superseded;
static char ev_origin[PATH_MAX + 16];
/* With ev_kernel set (the handle of "step"), the tag of the code each
 * commit of its module put in place, in commit order. */
static hk_kernel *ev_kernel;
static int ev_tags[64], ev_ntags;
/* A watch the event callback stops when a refusal of it arrives. */
static hk_watch *ev_stop_watch;
static int ev_stopped;

/* Refusals as the application sees them. */
typedef struct refused_event {
    char module[64]; /* "" when NULL */
    char origin[PATH_MAX + 16];
    int error;
    char message[512];
    char *log; /* copy of report->log, or NULL */
} refused_event;
static refused_event ev_ref[32];

static void on_event(const hk_event *ev, void *ud) {
    void *fn = NULL;
    (void)ud;
    pthread_mutex_lock(&ev_mu);
    hk_kernel *k = ev_kernel;
    pthread_mutex_unlock(&ev_mu);
    if (ev->kind == HK_EVENT_COMMITTED && k && ev->module && !strcmp(ev->module, "step") &&
        hk_kernel_function(k, &fn) != 0)
        fn = NULL;
    pthread_mutex_lock(&ev_mu);
    if (ev->kind == HK_EVENT_REFUSED && ev_stop_watch) {
        hk_watch *x = ev_stop_watch;
        ev_stop_watch = NULL;
        pthread_mutex_unlock(&ev_mu);
        hk_watch_stop(x); /* from the watch's own thread */
        pthread_mutex_lock(&ev_mu);
        ev_stopped++;
    }
    if (fn && ev_ntags < (int)(sizeof ev_tags / sizeof ev_tags[0]))
        ev_tags[ev_ntags++] = fake_tag_of(fn);
    if (ev->kind == HK_EVENT_REFUSED && ev->report && ev->report->error == HK_ERR_SUPERSEDED)
        ev_superseded++;
    if (ev->kind == HK_EVENT_COMMITTED)
        ev_committed++;
    if (ev->kind == HK_EVENT_REFUSED && ev_refused < (int)(sizeof ev_ref / sizeof ev_ref[0])) {
        refused_event *e = &ev_ref[ev_refused];
        snprintf(e->module, sizeof e->module, "%s", ev->module ? ev->module : "");
        snprintf(e->origin, sizeof e->origin, "%s", ev->origin ? ev->origin : "");
        e->error = ev->report ? ev->report->error : 0;
        snprintf(e->message, sizeof e->message, "%s", ev->report ? ev->report->message : "");
        e->log = ev->report && ev->report->log ? strdup(ev->report->log) : NULL;
    }
    if (ev->kind == HK_EVENT_REFUSED)
        ev_refused++;
    snprintf(ev_origin, sizeof ev_origin, "%s", ev->origin ? ev->origin : "");
    pthread_mutex_unlock(&ev_mu);
}

static int events_of(int *counter) {
    int n;
    pthread_mutex_lock(&ev_mu);
    n = *counter;
    pthread_mutex_unlock(&ev_mu);
    return n;
}

/* Polls until module's version reaches v; returns the version then. */
static uint64_t wait_version(const char *module, uint64_t v) {
    uint64_t got = 0;
    for (int i = 0; i < WAIT_MS / 10; i++) {
        got = hk_module_version(rt, module);
        if (got >= v)
            break;
        usleep(10 * 1000);
    }
    return got;
}

static void wait_events(int *counter, int n) {
    for (int i = 0; i < WAIT_MS / 10 && events_of(counter) < n; i++)
        usleep(10 * 1000);
    ck_assert_int_ge(events_of(counter), n);
}

static const char *ptx_text(int tag) {
    static char b[512];
    snprintf(b, sizeof b,
             "// tag: %d\n.version 8.0\n.target sm_90\n.address_size 64\n"
             ".visible .entry step(.param .u64 out, .param .u32 n)\n{\n ret;\n}\n",
             tag);
    return b;
}

/* A hook point of the engine where the worker is held (once) until
 * hook_go: HKL_HOOK_COMPILED makes a build as slow as the test wants. */
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hook_cond = PTHREAD_COND_INITIALIZER;
static hkl_hook_point hook_at;
static int hook_armed, hook_inside, hook_release;

static void test_hook(hk_runtime *r, hkl_hook_point p) {
    (void)r;
    pthread_mutex_lock(&hook_lock);
    if (hook_armed && p == hook_at) {
        hook_armed = 0;
        hook_inside = 1;
        pthread_cond_broadcast(&hook_cond);
        while (!hook_release)
            pthread_cond_wait(&hook_cond, &hook_lock);
    }
    pthread_mutex_unlock(&hook_lock);
}

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

static void hook_go(void) {
    pthread_mutex_lock(&hook_lock);
    hook_release = 1;
    hook_armed = 0;
    pthread_cond_broadcast(&hook_cond);
    pthread_mutex_unlock(&hook_lock);
}

static void rt_setup(void) {
    hk_options o;
    hk_report rep = HK_REPORT_INIT;
    int err;

    setup();
    fake_init(1, 90);
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.on_event = on_event;
    ev_committed = ev_refused = ev_superseded = ev_ntags = ev_stopped = 0;
    ev_kernel = NULL;
    ev_stop_watch = NULL;
    memset(ev_ref, 0, sizeof ev_ref);
    rt = NULL;
    err = hkl_runtime_create_with(&rt, &o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    rt->test.hook = test_hook; /* before any job: the worker reads it unlocked */
}

static void rt_teardown(void) {
    hook_go();              /* a test that failed while holding the worker */
    hk_runtime_destroy(rt); /* also stops the watcher */
    rt = NULL;
    for (int i = 0; i < ev_refused && i < (int)(sizeof ev_ref / sizeof ev_ref[0]); i++)
        free(ev_ref[i].log);
    ck_assert_int_eq(fake_live_images(), 0);
    teardown();
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

/* The refusal event of file name (the last one); fails the test when none. */
static refused_event refused_for(const char *name) {
    char origin[PATH_MAX + 16];
    refused_event e;
    int found = 0;

    snprintf(origin, sizeof origin, "watch:%s/%s", dir, name);
    memset(&e, 0, sizeof e);
    pthread_mutex_lock(&ev_mu);
    for (int i = 0; i < ev_refused && i < (int)(sizeof ev_ref / sizeof ev_ref[0]); i++) {
        if (strcmp(ev_ref[i].origin, origin) == 0) {
            e = ev_ref[i];
            found = 1;
        }
    }
    pthread_mutex_unlock(&ev_mu);
    ck_assert_msg(found, "no refusal for %s", name);
    return e;
}

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

/* ---- watches as handles (hk_watch_start) ---------------------------------- */

/* The value of an unlabelled counter in the runtime's metrics text. */
static uint64_t metric(const char *name) {
    char *text = NULL, *line;
    unsigned long long v = 0;
    size_t n = strlen(name);
    ck_assert_int_eq(hk_metrics_text_alloc(rt, &text, NULL), 0);
    for (line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, name, n) == 0 && line[n] == ' ') {
            v = strtoull(line + n + 1, NULL, 10);
            break;
        }
    }
    free(text);
    return (uint64_t)v;
}

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

static volatile int saver_stop;

/* Saves step.ptx again and again, a new tag each time. */
static void *saver_main(void *arg) {
    char b[512];
    (void)arg;
    for (int i = 100; !__atomic_load_n(&saver_stop, __ATOMIC_RELAXED); i++) {
        snprintf(b, sizeof b,
                 "// tag: %d\n.version 8.0\n.target sm_90\n.address_size 64\n"
                 ".visible .entry step(.param .u64 out, .param .u32 n)\n{\n ret;\n}\n",
                 i);
        write_file("step.ptx", b);
        usleep(1000);
    }
    return NULL;
}

/* When hk_watch_stop returns, nothing more is submitted (the engine's
 * submission counter stands still while the file keeps changing) and no
 * callback comes from the watch; its directory can be watched again. */
START_TEST(api_watch_stop) {
    hk_watch *wa = NULL;
    pthread_t t;
    uint64_t seq;
    int c, r;

    write_file("step.ptx", ptx_text(1));
    usleep(60 * 1000);
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    __atomic_store_n(&saver_stop, 0, __ATOMIC_RELAXED);
    ck_assert_int_eq(pthread_create(&t, NULL, saver_main, NULL), 0);
    ck_assert_uint_ge(wait_version("step", 3), 3); /* saves reach the engine */
    hk_watch_stop(wa);
    seq = atomic_load(&rt->work.job_seq);
    usleep(SETTLE_MS * 1000);
    __atomic_store_n(&saver_stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    ck_assert_uint_eq(atomic_load(&rt->work.job_seq), seq);
    /* What it submitted before ends as any submission. */
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    c = events_of(&ev_committed);
    r = events_of(&ev_refused);
    write_file("step.ptx", ptx_text(999));
    write_file("bad.cubin", "text, not a cubin\n"); /* would be a refusal */
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    ck_assert_int_eq(events_of(&ev_committed), c);
    ck_assert_int_eq(events_of(&ev_refused), r);
    ck_assert_uint_eq(atomic_load(&rt->work.job_seq), seq);
    hk_watch_stop(NULL);

    /* Free again: a new watch builds what changed meanwhile. */
    uint64_t v = hk_module_version(rt, "step");
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("step", v + 1), v + 1);
    hk_watch_stop(wa);
}
END_TEST

/* hk_watch_stop from an event callback on the watch's own thread (a
 * refusal of it) returns; nothing more comes from that watch, and its
 * directory is free again. */
START_TEST(api_watch_stop_from_its_callback) {
    hk_watch *wa = NULL, *wb = NULL;

    write_file("step.ptx", ptx_text(1));
    usleep(60 * 1000);
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    pthread_mutex_lock(&ev_mu);
    ev_stop_watch = wa;
    pthread_mutex_unlock(&ev_mu);
    write_file("bad.cubin", "text, not a cubin\n");
    wait_events(&ev_stopped, 1);
    write_file("step.ptx", ptx_text(2));
    write_file("bad2.cubin", "more text\n");
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    ck_assert_uint_eq(hk_module_version(rt, "step"), 1);
    ck_assert_int_eq(events_of(&ev_refused), 1);
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wb, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 2), 2);
    hk_watch_stop(wb);
}
END_TEST

/* Options: only the extensions asked for, subdirectories at any depth
 * (those created later too, not dot-directories), and no refusal of the
 * other names of a tree. */
START_TEST(api_watch_extensions_and_recursion) {
    static const char *const exts[] = {"ptx"};
    hk_watch_options wo;
    hk_watch *wa = NULL;
    char p[PATH_MAX];

    path_in(p, sizeof p, dir, "sub");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    path_in(p, sizeof p, dir, "sub/deeper");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    path_in(p, sizeof p, dir, ".git");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    write_file("step.ptx", ptx_text(1));
    write_file("a.cu", "extern \"C\" __global__ void step(int *out, unsigned n) {}\n");
    write_file("notes.txt", "notes\n");
    write_file("sub/deeper/k2.ptx", ptx_text(2));
    write_file(".git/k3.ptx", ptx_text(3));
    usleep(60 * 1000);
    hk_watch_options_init(&wo);
    wo.extensions = exts;
    wo.nextensions = 1;
    wo.recursive = 1;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    ck_assert_uint_eq(wait_version("k2", 1), 1);
    path_in(p, sizeof p, dir, "later");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    write_file("later/k4.ptx", ptx_text(4));
    ck_assert_uint_eq(wait_version("k4", 1), 1);
    write_file("a.cu", "extern \"C\" __global__ void step(int *out, unsigned n) { }\n");
    write_file("notes.txt", "more notes\n");
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    ck_assert_uint_eq(hk_module_version(rt, "a"), 0);
    ck_assert_uint_eq(hk_module_version(rt, "k3"), 0);
    ck_assert_int_eq(events_of(&ev_refused), 0);
    ck_assert_int_eq(events_of(&ev_committed), 3);
    hk_watch_stop(wa);
}
END_TEST

static int veto_check(const char *module, uint64_t version, void *ud, char *msg, size_t n) {
    (void)version;
    (void)ud;
    if (strcmp(module, "vetoed") != 0)
        return 0;
    snprintf(msg, n, "vetoed by the watch's template");
    return 1;
}

/* Adds a test launch to kernel "step" of module: its versions then have
 * canary tests to run. */
static void add_test_launch(const char *module) {
    hk_kernel *k;
    hk_test *t;
    uint32_t n = 4;
    ck_assert_int_eq(hk_kernel_get(rt, module, "step", &k), 0);
    ck_assert_int_eq(hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){32, 1, 1}, 0), 0);
    ck_assert_int_eq(hk_test_buffer(t, 64, HK_FILL_ZERO, 0, NULL), 0);
    ck_assert_int_eq(hk_test_scalar(t, &n, sizeof n), 0);
    ck_assert_int_eq(hk_kernel_add_test(k, t, NULL), 0);
    hk_test_destroy(t);
}

/* The swap options template reaches every submission of its watch: its
 * check callback refuses what it vetoes, and its canary policy (REQUIRE,
 * with no canary to run the tests in) refuses a version with tests, where a
 * watch with the defaults (OPTIONAL) commits it. */
START_TEST(api_watch_swap_template) {
    hk_swap_options so;
    hk_watch_options wo;
    hk_watch *wa = NULL, *wb = NULL;
    char other[PATH_MAX], p[PATH_MAX];

    path_in(other, sizeof other, root, "other");
    ck_assert_int_eq(mkdir(other, 0755), 0);
    write_file("step.ptx", ptx_text(1));
    write_file("vetoed.ptx", ptx_text(1));
    path_in(p, sizeof p, other, "free.ptx");
    write_at(p, ptx_text(1));
    usleep(60 * 1000);
    hk_swap_options_init(&so);
    so.check = veto_check;
    so.canary = HK_CANARY_REQUIRE;
    hk_watch_options_init(&wo);
    wo.swap = &so;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &wa, NULL), 0);
    ck_assert_int_eq(hk_watch_start(rt, other, NULL, &wb, NULL), 0);
    ck_assert_uint_eq(wait_version("step", 1), 1);
    ck_assert_uint_eq(wait_version("free", 1), 1);
    wait_events(&ev_refused, 1);
    refused_event e = refused_for("vetoed.ptx");
    ck_assert_int_eq(e.error, HK_ERR_REJECTED);
    ck_assert_ptr_nonnull(strstr(e.message, "vetoed by the watch's template"));
    ck_assert_uint_eq(hk_module_version(rt, "vetoed"), 0);

    add_test_launch("step");
    add_test_launch("free");
    write_file("step.ptx", ptx_text(2));
    write_at(p, ptx_text(2));
    wait_events(&ev_refused, 2);
    ck_assert_uint_eq(wait_version("free", 2), 2);
    ck_assert_int_eq(hk_wait_idle(rt, WAIT_MS), 0);
    e = refused_for("step.ptx");
    ck_assert_int_eq(e.error, HK_ERR_CANARY_UNAVAILABLE);
    ck_assert_uint_eq(hk_module_version(rt, "step"), 1);
    hk_watch_stop(wa);
    hk_watch_stop(wb);
}
END_TEST

/* A directory is watched by one watch: the same one again, one inside a
 * recursive watch, the parent of a watched one (recursive), and the
 * directories of hk_watch_dir are refused with HK_ERR_BUSY, saying which
 * watch covers them; after a stop the directory is free. Bad arguments. */
START_TEST(api_watch_readd_and_arguments) {
    static const char *const bad_ext[] = {"txt"};
    hk_watch_options wo;
    hk_watch *wa = NULL, *wsub = NULL, *wr = NULL, *x = NULL;
    hk_report rep = HK_REPORT_INIT;
    char sub[PATH_MAX], other[PATH_MAX], p[PATH_MAX];

    path_in(sub, sizeof sub, dir, "sub");
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    path_in(other, sizeof other, root, "other");
    ck_assert_int_eq(mkdir(other, 0755), 0);
    hk_watch_options_init(&wo);

    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wa, &rep), 0);
    x = (hk_watch *)&rep; /* must be cleared on failure */
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &x, &rep), HK_ERR_BUSY);
    ck_assert_ptr_null(x);
    ck_assert_int_eq(rep.error, HK_ERR_BUSY);
    ck_assert_ptr_nonnull(strstr(rep.message, dir));
    ck_assert_int_eq(hk_watch_dir(rt, dir, NULL, &rep), HK_ERR_BUSY);
    /* Another directory, inside a watch that is not recursive: fine. */
    ck_assert_int_eq(hk_watch_start(rt, sub, NULL, &wsub, NULL), 0);
    wo.recursive = 1;
    ck_assert_int_eq(hk_watch_start(rt, root, &wo, &x, &rep), HK_ERR_BUSY);
    hk_watch_stop(wa);
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &x, &rep), HK_ERR_BUSY); /* sub is watched */
    hk_watch_stop(wsub);
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &wr, &rep), 0);
    wo.recursive = 0;
    ck_assert_int_eq(hk_watch_start(rt, sub, &wo, &x, &rep), HK_ERR_BUSY);
    ck_assert_int_eq(hk_watch_dir(rt, sub, NULL, &rep), HK_ERR_BUSY);
    /* hk_watch_dir's own directories: added again is fine, a watch of
     * them is not. */
    ck_assert_int_eq(hk_watch_dir(rt, other, NULL, &rep), 0);
    ck_assert_int_eq(hk_watch_dir(rt, other, NULL, &rep), 0);
    ck_assert_int_eq(hk_watch_start(rt, other, NULL, &x, &rep), HK_ERR_BUSY);
    ck_assert_int_eq(
        hk_watch_start(rt, root, &(hk_watch_options){.size = sizeof wo, .recursive = 1}, &x, &rep),
        HK_ERR_BUSY);
    hk_watch_stop(wr);

    /* Arguments. */
    ck_assert_int_eq(hk_watch_start(NULL, dir, NULL, &x, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(hk_watch_start(rt, NULL, NULL, &x, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, NULL, &rep), HK_ERR_INVALID);
    path_in(p, sizeof p, root, "missing");
    ck_assert_int_eq(hk_watch_start(rt, p, NULL, &x, &rep), HK_ERR_IO);
    ck_assert_ptr_nonnull(strstr(rep.message, "missing"));
    ck_assert_ptr_null(x);
    wo.extensions = bad_ext;
    wo.nextensions = 1;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &x, &rep), HK_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(rep.message, "txt"));
    wo.nextensions = 0;
    wo.debounce_ms = -1;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &x, &rep), HK_ERR_INVALID);
    wo.debounce_ms = 50;
    wo.size = 0;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &x, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(hk_watch_options_init_size(&wo, 4), HK_ERR_INVALID);
    hk_watch_options_init(&wo);
    ck_assert_int_eq(wo.debounce_ms, 50);
    ck_assert_int_eq(wo.open_wait_ms, 1000);
    ck_assert_int_eq(wo.build_profile, HK_BUILD_PROFILE_DEFAULT);
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &x, &rep), 0);
    hk_watch_stop(x);
    hk_report_clear(&rep);
}
END_TEST

/* The build profile reaches the build: the same CUDA C source built by a
 * watch with the default profile is the image hk_swap made (nothing new
 * commits); built by a watch with HK_BUILD_PROFILE_DEV it is another image
 * (NVRTC's fast-compile code), which commits. */
START_TEST(api_watch_build_profile) {
    static const char src[] =
        "extern \"C\" __global__ void step(int *out, unsigned n) { if (out) *out = n * 3 + 1; }\n";
    hk_swap_options so;
    hk_watch_options wo;
    hk_report rep = HK_REPORT_INIT;
    hk_watch *wa = NULL;
    char p[PATH_MAX];

    write_file("k.cu", src);
    path_in(p, sizeof p, dir, "k.cu");
    hk_swap_options_init(&so);
    so.source_name = p;
    ck_assert_msg(hk_swap(rt, "k", src, strlen(src), &so, &rep) == 0, "%s\n%s", rep.message,
                  rep.log ? rep.log : "");
    ck_assert_uint_eq(hk_module_version(rt, "k"), 1);
    usleep(60 * 1000);
    ck_assert_int_eq(hk_watch_start(rt, dir, NULL, &wa, NULL), 0);
    for (int i = 0; i < WAIT_MS / 10 && metric("hotkern_watch_handovers_total") < 1; i++)
        usleep(10 * 1000);
    ck_assert_uint_eq(metric("hotkern_watch_handovers_total"), 1);
    ck_assert_int_eq(hk_wait_idle(rt, 4 * WAIT_MS), 0);
    ck_assert_uint_eq(hk_module_version(rt, "k"), 1);
    hk_watch_stop(wa);

    hk_watch_options_init(&wo);
    wo.build_profile = HK_BUILD_PROFILE_DEV;
    ck_assert_int_eq(hk_watch_start(rt, dir, &wo, &wa, NULL), 0);
    ck_assert_uint_eq(wait_version("k", 2), 2);
    ck_assert_int_eq(events_of(&ev_refused), 0);
    hk_watch_stop(wa);
    hk_report_clear(&rep);
}
END_TEST

static Suite *watch_suite(void) {
    Suite *s = suite_create("watch");
    TCase *tc = tcase_create("core");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, classify_names);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, initial_scan);
    tcase_add_test(tc, no_initial_scan);
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
    tcase_add_test(tc, recursive_subdirectories);
    tcase_add_test(tc, not_recursive_by_default);
    tcase_add_test(tc, source_kinds_filter);
    tcase_add_test(tc, stop_ends_callbacks);
    tcase_add_test(tc, droppings_ignored);
    tcase_add_test(tc, symlink_outside_refused);
    tcase_add_test(tc, foreign_or_open_files_refused);
    tcase_add_test(tc, symlink_inside_followed);
    tcase_add_test(tc, special_files_refused_once);
    tcase_add_test(tc, procfs_file_refused_once);
    tcase_add_test(tc, long_module_name_refused);
    tcase_add_test(tc, unrecordable_module_name_refused);
    tcase_add_test(tc, unchanged_not_handed_again);
    tcase_add_test(tc, header_rebuilds_dependents);
    tcase_add_test(tc, header_in_other_directory);
    tcase_add_test(tc, dependency_changed_before_report);
    tcase_add_test(tc, overflow_small_queue);
    tcase_add_test(tc, overflow_paused_flood);
    tcase_add_test(tc, directory_recreated);
    tcase_add_test(tc, destroy_while_busy);
    tcase_add_test(tc, two_directories);
    tcase_add_test(tc, dir_headers_listing);
    suite_add_tcase(s, tc);

    tc = tcase_create("runtime");
    tcase_add_checked_fixture(tc, rt_setup, rt_teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, api_watch_dir);
    tcase_add_test(tc, api_open_directory_refused);
    tcase_add_test(tc, api_header_dependency);
    tcase_add_test(tc, api_headers_in_memory);
    tcase_add_test(tc, api_refusals_never_quote_content);
    tcase_add_test(tc, api_saves_during_slow_build);
    tcase_add_test(tc, api_completed_save_builds_at_once);
    tcase_add_test(tc, api_open_file_fallback);
    tcase_add_test(tc, api_watch_stop);
    tcase_add_test(tc, api_watch_stop_from_its_callback);
    tcase_add_test(tc, api_watch_extensions_and_recursion);
    tcase_add_test(tc, api_watch_swap_template);
    tcase_add_test(tc, api_watch_readd_and_arguments);
    tcase_add_test(tc, api_watch_build_profile);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(watch_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

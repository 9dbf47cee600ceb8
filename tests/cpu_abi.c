/*
 * The sized-structure ABI (include/hotkern/hotkern.h, "Sized structures") on
 * the fake driver: a program built against an older, smaller layout is
 * simulated by a structure whose size stops before the library's sizeof,
 * followed by canary bytes. Outputs must fill the caller's fields and leave
 * the canaries alone; inputs must take defaults for the fields past the size
 * (the canaries there are values that would visibly misbehave if read); a
 * size of 0 or below the first layout must be refused with nothing done or
 * written; a larger size (newer headers) must be accepted.
 */
#include <pthread.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hotkern/net.h"
#include "loader/core.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

#define ptx    fake_ptx
#define CANARY 0x5a /* as an int or pointer: large, positive, not mapped */

/* The first layouts, as the header documents them ("ends at ..."). */
#define END(T, f)         (offsetof(T, f) + sizeof(((T *)0)->f))
#define REPORT_OLD        END(hk_report, cache_hit)
#define OPTIONS_OLD       END(hk_options, userdata)
#define SWAP_OPTIONS_OLD  END(hk_swap_options, origin)
#define STATS_OLD         END(hk_stats, last_swap_ms)
#define ENDPOINT_OPTS_OLD END(hk_endpoint_options, swap)
#define WATCH_OPTIONS_OLD END(hk_watch_options, build_profile)
#define CHECK_OPTIONS_OLD END(hk_check_options, source_name)
#define PULL_OPTIONS_OLD  END(hk_pull_options, swap)

/* A caller's structure of `size` bytes of an older layout, then canaries up
 * to 256 bytes past the library's structure. */
typedef struct {
    alignas(max_align_t) unsigned char b[2048];
} buf;

static void old_layout(buf *m, size_t size) {
    memset(m->b, CANARY, sizeof m->b);
    memset(m->b, 0, size);
    memcpy(m->b, &size, sizeof size);
}

/* 1 when every byte of m from `from` to `to` is still a canary. */
static int canaries_from(const buf *m, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (m->b[i] != CANARY)
            return 0;
    return 1;
}

static hk_runtime *rt;
/* Of the last COMMITTED event (RECLAIMED ones come from another thread). */
static pthread_mutex_t event_mu = PTHREAD_MUTEX_INITIALIZER;
static size_t event_size, event_report_size;

static void on_event(const hk_event *ev, void *ud) {
    (void)ud;
    if (ev->kind != HK_EVENT_COMMITTED)
        return;
    pthread_mutex_lock(&event_mu);
    event_size = ev->size;
    event_report_size = ev->report ? ev->report->size : 0;
    pthread_mutex_unlock(&event_mu);
}

static size_t last_event_report_size(void) {
    pthread_mutex_lock(&event_mu);
    size_t n = event_report_size;
    pthread_mutex_unlock(&event_mu);
    return n;
}

static void base_options(hk_options *o) {
    o->ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o->cache_dir = "";
    o->on_event = on_event;
}

static void setup(void) {
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    base_options(&o);
    o.no_warm_start = 1;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &o, fake_driver(), &rep), 0);
}

static void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
    ck_assert_int_eq(fake_live_images(), 0);
}

static int swap(const char *src, hk_report *rep) {
    return hk_swap(rt, "sim", src, strlen(src), NULL, rep);
}

/* ---- reports ------------------------------------------------------------ */

/* The codes, their names and their messages come from one table: every code
 * has its own name and a message of its own, numbered 0, -1, -2 ... without a
 * gap (codes are only added), and a code past the table is unknown. */
START_TEST(error_table_names_every_code) {
    static const struct {
        int code;
        const char *name, *message;
    } t[] = {
#define ROW_(name, value, message) {value, #name, message},
        HK_ERROR_TABLE(ROW_)
#undef ROW_
    };
    size_t n = sizeof t / sizeof t[0];
    ck_assert_uint_ge(n, 31);
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(t[i].code, -(int)i);
        ck_assert_str_eq(hk_err_name(t[i].code), t[i].name);
        ck_assert_str_eq(hk_strerror(t[i].code), t[i].message);
        for (size_t j = 0; j < i; j++)
            ck_assert_str_ne(t[i].message, t[j].message);
    }
    ck_assert_str_eq(hk_err_name(HK_ERR_LAYOUT), "HK_ERR_LAYOUT");
    ck_assert_str_eq(hk_err_name(-(int)n), "HK_ERR_UNKNOWN");
    ck_assert_str_eq(hk_strerror(-(int)n), "unknown error");
    ck_assert_str_eq(hk_err_name(1), "HK_ERR_UNKNOWN");
}
END_TEST

START_TEST(old_report_is_filled_within_its_size) {
    buf m;
    old_layout(&m, REPORT_OLD);
    hk_report *r = (hk_report *)m.b;
    ck_assert_int_eq(swap(ptx(1, 0, 0, 0), r), 0);
    ck_assert_uint_eq(r->version, 1);
    ck_assert_int_eq(r->error, 0);
    ck_assert_uint_eq(r->size, REPORT_OLD);
    ck_assert(canaries_from(&m, REPORT_OLD, sizeof(hk_report) + 256));

    /* A refusal fills message, cu_name and the log, all within the layout. */
    char bad[4096];
    snprintf(bad, sizeof bad, "%s\nSYNTAX ERROR\n", ptx(2, 0, 0, 0));
    ck_assert_int_eq(swap(bad, r), HK_ERR_COMPILE);
    ck_assert_int_eq(r->error, HK_ERR_COMPILE);
    ck_assert_str_eq(r->cu_name, "CUDA_ERROR_INVALID_PTX");
    ck_assert_ptr_nonnull(r->log);
    ck_assert(canaries_from(&m, REPORT_OLD, sizeof(hk_report) + 256));

    /* Clearing frees the log and zeroes the fields, nothing beyond. */
    hk_report_clear(r);
    ck_assert_ptr_null(r->log);
    ck_assert_int_eq(r->error, 0);
    ck_assert_uint_eq(r->size, REPORT_OLD);
    ck_assert(canaries_from(&m, REPORT_OLD, sizeof(hk_report) + 256));
}
END_TEST

START_TEST(report_below_first_layout_is_refused) {
    size_t sizes[] = {0, sizeof(size_t), offsetof(hk_report, cache_hit)};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        buf m;
        old_layout(&m, sizes[i]);
        hk_report *r = (hk_report *)m.b;
        buf before = m;
        ck_assert_int_eq(swap(ptx(1, 0, 0, 0), r), HK_ERR_INVALID);
        ck_assert_int_eq(hk_rollback(rt, "sim", r), HK_ERR_INVALID);
        hk_report_clear(r);
        ck_assert_int_eq(memcmp(&before, &m, sizeof m), 0);
    }
    /* Nothing was done: no version exists. */
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 0);
    hk_stats st = HK_STATS_INIT;
    ck_assert_int_eq(hk_stats_get(rt, &st), 0);
    ck_assert_uint_eq(st.swaps + st.refused, 0);
}
END_TEST

START_TEST(newer_report_keeps_its_unknown_fields) {
    buf m;
    size_t newer = sizeof(hk_report) + 32;
    old_layout(&m, newer);
    memset(m.b + sizeof(hk_report), CANARY, 32); /* fields this build lacks */
    hk_report *r = (hk_report *)m.b;
    ck_assert_int_eq(swap(ptx(1, 0, 0, 0), r), 0);
    ck_assert_uint_eq(r->version, 1);
    ck_assert(r->total_ms > 0);
    ck_assert_uint_eq(r->size, newer);
    ck_assert(canaries_from(&m, sizeof(hk_report), newer + 64));
}
END_TEST

START_TEST(events_carry_the_library_sizes) {
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap(ptx(1, 0, 0, 0), &rep), 0);
    pthread_mutex_lock(&event_mu);
    ck_assert_uint_eq(event_size, sizeof(hk_event));
    event_report_size = 0;
    pthread_mutex_unlock(&event_mu);
    ck_assert_int_eq(swap(ptx(2, 0, 0, 0), &rep), 0);
    ck_assert_uint_eq(last_event_report_size(), sizeof(hk_report));
    /* Even when the caller's own report is an older layout. */
    buf m;
    old_layout(&m, REPORT_OLD);
    pthread_mutex_lock(&event_mu);
    event_report_size = 0;
    pthread_mutex_unlock(&event_mu);
    ck_assert_int_eq(swap(ptx(3, 0, 0, 0), (hk_report *)m.b), 0);
    ck_assert_uint_eq(last_event_report_size(), sizeof(hk_report));
    hk_report_clear(&rep);
}
END_TEST

/* ---- stats -------------------------------------------------------------- */

START_TEST(old_stats_are_filled_within_their_size) {
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap(ptx(1, 0, 0, 0), &rep), 0);
    ck_assert_int_eq(swap(ptx(2, 0, 0, 0), &rep), 0);
    buf m;
    old_layout(&m, STATS_OLD);
    hk_stats *st = (hk_stats *)m.b;
    ck_assert_int_eq(hk_stats_get(rt, st), 0);
    ck_assert_uint_eq(st->swaps, 2);
    /* One snapshot: the first version may have been reclaimed meanwhile. */
    ck_assert_uint_eq(st->live_versions + st->reclaimed, 2);
    ck_assert_uint_eq(st->size, STATS_OLD);
    ck_assert(canaries_from(&m, STATS_OLD, sizeof(hk_stats) + 256));

    old_layout(&m, 0);
    buf before = m;
    ck_assert_int_eq(hk_stats_get(rt, st), HK_ERR_INVALID);
    ck_assert_int_eq(memcmp(&before, &m, sizeof m), 0);
    old_layout(&m, STATS_OLD - 1);
    before = m;
    ck_assert_int_eq(hk_stats_get(rt, st), HK_ERR_INVALID);
    ck_assert_int_eq(memcmp(&before, &m, sizeof m), 0);
    hk_report_clear(&rep);
}
END_TEST

/* ---- options ------------------------------------------------------------ */

START_TEST(init_writes_only_within_the_size) {
    buf m;
    old_layout(&m, OPTIONS_OLD);
    memset(m.b, CANARY, sizeof m.b);
    hk_options *o = (hk_options *)m.b;
    ck_assert_int_eq(hk_options_init_size(o, OPTIONS_OLD), 0);
    ck_assert_uint_eq(o->size, OPTIONS_OLD);
    ck_assert_int_eq(o->history, 4);
    ck_assert_ptr_null(o->userdata);
    ck_assert(canaries_from(&m, OPTIONS_OLD, sizeof(hk_options) + 256));

    memset(m.b, CANARY, sizeof m.b);
    buf before = m;
    ck_assert_int_eq(hk_options_init_size(o, 0), HK_ERR_INVALID);
    ck_assert_int_eq(hk_swap_options_init_size((hk_swap_options *)m.b, SWAP_OPTIONS_OLD - 1),
                     HK_ERR_INVALID);
    ck_assert_int_eq(hk_launch_config_init_size((hk_launch_config *)m.b, 8), HK_ERR_INVALID);
    ck_assert_int_eq(memcmp(&before, &m, sizeof m), 0);

    /* A newer, larger layout: the fields this build does not know are zeroed
     * (they lie within the size), nothing past the size is written. */
    size_t newer = sizeof(hk_swap_options) + 16;
    ck_assert_int_eq(hk_swap_options_init_size((hk_swap_options *)m.b, newer), 0);
    ck_assert_int_eq(((hk_swap_options *)m.b)->carry_globals, 1);
    for (size_t i = sizeof(hk_swap_options); i < newer; i++)
        ck_assert_uint_eq(m.b[i], 0);
    ck_assert(canaries_from(&m, newer, newer + 256));
}
END_TEST

START_TEST(old_options_take_defaults_past_their_size) {
    hk_runtime_destroy(rt);
    rt = NULL;
    buf m;
    old_layout(&m, OPTIONS_OLD);
    hk_options *o = (hk_options *)m.b;
    ck_assert_int_eq(hk_options_init_size(o, OPTIONS_OLD), 0);
    base_options(o);
    o->history = 2;
    /* The canaries past the size would be a 1.5-billion-entry header array
     * at an unmapped address and waits of 17 days, if they were read. */
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, o, fake_driver(), &rep), 0);
    ck_assert_uint_eq(rt->opt.size, sizeof(hk_options));
    ck_assert_int_eq(rt->opt.history, 2); /* within the size: the caller's */
    ck_assert_int_eq(rt->opt.safe_point_wait_ms, 2000);
    ck_assert_ptr_null(rt->opt.headers);
    ck_assert_int_eq(rt->opt.nheaders, 0);
    ck_assert_int_eq(rt->opt.launch_hold_max_us, 1000);
    ck_assert_int_eq(rt->opt.destroy_wait_ms, 5000);
    ck_assert(canaries_from(&m, OPTIONS_OLD, sizeof(hk_options) + 256));
    ck_assert_int_eq(swap(ptx(1, 0, 0, 0), &rep), 0);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(options_below_first_layout_are_refused) {
    hk_runtime *r2 = (hk_runtime *)1;
    buf m;
    old_layout(&m, 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&r2, (hk_options *)m.b, fake_driver(), &rep),
                     HK_ERR_INVALID);
    ck_assert_ptr_null(r2);
    ck_assert_int_eq(rep.error, HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "hk_options.size 0"), "message: %s", rep.message);

    /* Swap options: refused before anything is built. */
    old_layout(&m, SWAP_OPTIONS_OLD - 1);
    const char *src = ptx(1, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), (hk_swap_options *)m.b, &rep),
                     HK_ERR_INVALID);
    ck_assert_int_eq(hk_submit(rt, "sim", src, strlen(src), (hk_swap_options *)m.b),
                     HK_ERR_INVALID);
    ck_assert_int_eq(hk_watch_dir(rt, "/tmp", (hk_swap_options *)m.b, &rep), HK_ERR_INVALID);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 0);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(old_swap_options_take_defaults_past_their_size) {
    buf m;
    old_layout(&m, SWAP_OPTIONS_OLD);
    hk_swap_options *so = (hk_swap_options *)m.b;
    ck_assert_int_eq(hk_swap_options_init_size(so, SWAP_OPTIONS_OLD), 0);
    so->origin = "old-caller";
    /* headers/nheaders past the size are canaries: an unmapped array of
     * 1.5 billion headers, if read. */
    hk_report rep = HK_REPORT_INIT;
    const char *src = ptx(7, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "sim", src, strlen(src), so, &rep), 0);
    ck_assert_uint_eq(rep.version, 1);
    ck_assert_int_eq(hk_submit(rt, "sim", ptx(8, 0, 0, 0), strlen(ptx(8, 0, 0, 0)), so), 0);
    ck_assert_int_eq(hk_wait_idle(rt, 5000), 0);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 2);
    ck_assert(canaries_from(&m, SWAP_OPTIONS_OLD, sizeof(hk_swap_options) + 256));
    hk_report_clear(&rep);
}
END_TEST

/* Watch options: one layout so far, refused below it with nothing done; a
 * newer caller's larger layout is accepted and its unknown fields ignored;
 * the swap template inside is read within its own size. */
START_TEST(watch_options_sizes) {
    char *dir = hkt_tmpdir();
    buf m, t;
    hk_watch *w = (hk_watch *)&m;
    hk_report rep = HK_REPORT_INIT;
    hk_watch_options *wo = (hk_watch_options *)m.b;

    old_layout(&m, WATCH_OPTIONS_OLD - 1);
    ck_assert_int_eq(hk_watch_start(rt, dir, wo, &w, &rep), HK_ERR_INVALID);
    ck_assert_ptr_null(w);
    ck_assert_msg(strstr(rep.message, "hk_watch_options.size"), "%s", rep.message);
    memset(m.b, CANARY, sizeof m.b);
    buf before = m;
    ck_assert_int_eq(hk_watch_options_init_size(wo, WATCH_OPTIONS_OLD - 1), HK_ERR_INVALID);
    ck_assert_int_eq(memcmp(&before, &m, sizeof m), 0);

    /* Newer headers: 32 bytes this build does not know, zeroed by init
     * within the size, canaries past it. */
    size_t newer = sizeof(hk_watch_options) + 32;
    ck_assert_int_eq(hk_watch_options_init_size(wo, newer), 0);
    ck_assert_int_eq(wo->debounce_ms, 50);
    for (size_t i = sizeof(hk_watch_options); i < newer; i++)
        ck_assert_uint_eq(m.b[i], 0);
    ck_assert(canaries_from(&m, newer, newer + 256));
    memset(m.b + sizeof(hk_watch_options), CANARY, 32);
    /* The template in the first swap-options layout: the fields past it
     * (headers, canary policy, build profile) are canaries if read. */
    old_layout(&t, SWAP_OPTIONS_OLD);
    ck_assert_int_eq(hk_swap_options_init_size((hk_swap_options *)t.b, SWAP_OPTIONS_OLD), 0);
    wo->swap = (hk_swap_options *)t.b;
    char path[600];
    snprintf(path, sizeof path, "%s/sim.ptx", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(ptx(3, 0, 0, 0), f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(hk_watch_start(rt, dir, wo, &w, &rep), 0);
    for (int i = 0; i < 300 && hk_module_version(rt, "sim") < 1; i++)
        usleep(10 * 1000);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    ck_assert(canaries_from(&t, SWAP_OPTIONS_OLD, sizeof(hk_swap_options) + 256));
    hk_watch_stop(w);
    /* A template below its first layout is refused like the options. */
    old_layout(&t, SWAP_OPTIONS_OLD - 1);
    ck_assert_int_eq(hk_watch_start(rt, dir, wo, &w, &rep), HK_ERR_INVALID);
    ck_assert_ptr_null(w);
    hk_report_clear(&rep);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(launch_config_sizes) {
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(swap(ptx(4, 0, 0, 0), &rep), 0);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    int out = 0, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    /* A newer caller: its unknown trailing fields are ignored. */
    buf m;
    old_layout(&m, sizeof(hk_launch_config) + 32);
    hk_launch_config *c = (hk_launch_config *)m.b;
    ck_assert_int_eq(hk_launch_config_init_size(c, sizeof(hk_launch_config) + 32), 0);
    memset(m.b + sizeof(hk_launch_config), CANARY, 32);
    ck_assert_int_eq(hk_launch_ex(k, c, args, NULL), 0);
    ck_assert_int_eq(out, 4);
    /* Below the first layout (the whole 1.0 structure), or 0: refused. */
    out = 0;
    c->size = offsetof(hk_launch_config, has_priority);
    ck_assert_int_eq(hk_launch_ex(k, c, args, NULL), HK_ERR_INVALID);
    c->size = 0;
    ck_assert_int_eq(hk_launch_ex(k, c, args, NULL), HK_ERR_INVALID);
    ck_assert_int_eq(out, 0);
    hk_report_clear(&rep);
}
END_TEST

/* ---- net.h -------------------------------------------------------------- */

/* The HTTP status of GET url with a foreign Host header, by the curl tool. */
static int get_foreign_host(unsigned port) {
    char cmd[256], code[16] = "";
    snprintf(cmd, sizeof cmd,
             "curl -s -o /dev/null -w '%%{http_code}' -H 'Host: evil.example' "
             "http://127.0.0.1:%u/v1/status",
             port);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    if (!fgets(code, sizeof code, p))
        code[0] = '\0';
    pclose(p);
    return atoi(code);
}

START_TEST(old_endpoint_options_take_defaults_past_their_size) {
    buf m;
    old_layout(&m, ENDPOINT_OPTS_OLD);
    hk_endpoint_options *eo = (hk_endpoint_options *)m.b;
    ck_assert_int_eq(hk_endpoint_options_init_size(eo, ENDPOINT_OPTS_OLD), 0);
    ck_assert(canaries_from(&m, ENDPOINT_OPTS_OLD, sizeof(hk_endpoint_options) + 256));
    eo->allow_unsigned = 1;
    eo->state_dir = "";
    /* Past the size: 1.5 billion threads, and as many allowed hosts at an
     * unmapped address, if they were read. */
    hk_endpoint *ep = NULL;
    hk_report rep = HK_REPORT_INIT;
    int err = hk_endpoint_start(rt, eo, &ep, &rep);
    ck_assert_msg(err == 0, "start: %s", rep.message);
    ck_assert_uint_gt(hk_endpoint_port(ep), 0);
    if (system("command -v curl >/dev/null 2>&1") == 0)
        ck_assert_int_eq(get_foreign_host(hk_endpoint_port(ep)), 403);
    hk_endpoint_stop(ep);
    ck_assert(canaries_from(&m, ENDPOINT_OPTS_OLD, sizeof(hk_endpoint_options) + 256));
    hk_report_clear(&rep);
}
END_TEST

START_TEST(net_structures_below_first_layout_are_refused) {
    buf m;
    hk_report rep = HK_REPORT_INIT;
    hk_endpoint *ep = (hk_endpoint *)1;
    old_layout(&m, ENDPOINT_OPTS_OLD - 1);
    ck_assert_int_eq(hk_endpoint_start(rt, (hk_endpoint_options *)m.b, &ep, &rep), HK_ERR_INVALID);
    ck_assert_int_eq(rep.error, HK_ERR_INVALID);
    ck_assert_ptr_null(ep);

    hk_pull_options po;
    hk_pull_options_init(&po);
    po.url = "http://127.0.0.1:1/manifest.json";
    po.allow_unsigned = 1;
    po.state_dir = "";
    hk_puller *p = NULL;
    po.size = 0;
    ck_assert_int_eq(hk_pull_start(rt, &po, &p, &rep), HK_ERR_INVALID);
    ck_assert_ptr_null(p);
    po.size = offsetof(hk_pull_options, swap);
    ck_assert_int_eq(hk_pull_start(rt, &po, &p, &rep), HK_ERR_INVALID);

    /* A report below its first layout: refused, the puller not started. */
    old_layout(&m, 0);
    po.size = sizeof po;
    ck_assert_int_eq(hk_pull_start(rt, &po, &p, (hk_report *)m.b), HK_ERR_INVALID);
    ck_assert_ptr_null(p);

    /* Pull stats: 0 refused, a newer layout keeps its unknown fields. */
    ck_assert_int_eq(hk_pull_start(rt, &po, &p, &rep), 0);
    old_layout(&m, 0);
    buf before = m;
    ck_assert_int_eq(hk_pull_stats_get(p, (hk_pull_stats *)m.b), HK_ERR_INVALID);
    ck_assert_int_eq(memcmp(&before, &m, sizeof m), 0);
    size_t newer = sizeof(hk_pull_stats) + 24;
    old_layout(&m, newer);
    memset(m.b + sizeof(hk_pull_stats), CANARY, 24);
    ck_assert_int_eq(hk_pull_stats_get(p, (hk_pull_stats *)m.b), 0);
    ck_assert_uint_eq(((hk_pull_stats *)m.b)->size, newer);
    ck_assert(canaries_from(&m, sizeof(hk_pull_stats), newer + 256));
    hk_pull_stop(p);
    hk_report_clear(&rep);
}
END_TEST

/* Pull options of the 1.3 layout (up to swap): the fields 1.4 appended
 * (host_id, host_labels, metrics_address, metrics_port) are not read past
 * the caller's size, so the canaries there start no /metrics server and
 * name no host; nothing is written there either. */
START_TEST(old_pull_options_take_defaults_past_their_size) {
    buf m;
    hk_report rep = HK_REPORT_INIT;
    old_layout(&m, PULL_OPTIONS_OLD);
    hk_pull_options *po = (hk_pull_options *)m.b;
    po->url = "http://127.0.0.1:1/manifest.json";
    po->allow_unsigned = 1;
    po->state_dir = "";
    hk_puller *p = NULL;
    int err = hk_pull_start(rt, po, &p, &rep);
    ck_assert_msg(err == 0, "start: %s", rep.message);
    ck_assert_uint_eq(hk_pull_metrics_port(p), 0);
    hk_pull_stop(p);
    ck_assert(canaries_from(&m, PULL_OPTIONS_OLD, sizeof(hk_pull_options) + 256));
    hk_report_clear(&rep);
}
END_TEST

/* Check options: one layout so far, refused below it with nothing done; a
 * newer caller's larger layout is accepted and its unknown fields ignored;
 * a report of the first layout is filled within its size by a check. */
START_TEST(check_options_sizes) {
    static const char src[] = "extern \"C\" __global__ void k(int *x) { x[0] = 1; }\n";
    buf m, r;
    hk_check_options *co = (hk_check_options *)m.b;
    hk_check_result *res = (hk_check_result *)&m;
    hk_report rep = HK_REPORT_INIT;

    old_layout(&m, CHECK_OPTIONS_OLD - 1);
    co->arch = 90;
    ck_assert_int_eq(hk_check(co, src, sizeof src - 1, &res, &rep), HK_ERR_INVALID);
    ck_assert_ptr_null(res);
    ck_assert_msg(strstr(rep.message, "hk_check_options.size"), "%s", rep.message);
    memset(m.b, CANARY, sizeof m.b);
    buf before = m;
    ck_assert_int_eq(hk_check_options_init_size(co, CHECK_OPTIONS_OLD - 1), HK_ERR_INVALID);
    ck_assert_int_eq(memcmp(&before, &m, sizeof m), 0);

    size_t newer = sizeof(hk_check_options) + 32;
    ck_assert_int_eq(hk_check_options_init_size(co, newer), 0);
    ck_assert_int_eq(co->jit_opt_level, 4);
    for (size_t i = sizeof(hk_check_options); i < newer; i++)
        ck_assert_uint_eq(m.b[i], 0);
    ck_assert(canaries_from(&m, newer, newer + 256));
    memset(m.b + sizeof(hk_check_options), CANARY, 32); /* fields it does not know */
    co->arch = 90;
    old_layout(&r, REPORT_OLD);
    ck_assert_int_eq(hk_check(co, src, sizeof src - 1, &res, (hk_report *)r.b), 0);
    ck_assert(canaries_from(&r, REPORT_OLD, sizeof(hk_report) + 256));
    ck_assert_int_eq(hk_check_result_kernel_count(res), 1);
    hk_check_result_free(res);
    hk_report_clear(&rep);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("sized structures (fake driver)");
    TCase *tc = tcase_create("abi");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, error_table_names_every_code);
    tcase_add_test(tc, old_report_is_filled_within_its_size);
    tcase_add_test(tc, report_below_first_layout_is_refused);
    tcase_add_test(tc, newer_report_keeps_its_unknown_fields);
    tcase_add_test(tc, events_carry_the_library_sizes);
    tcase_add_test(tc, old_stats_are_filled_within_their_size);
    tcase_add_test(tc, init_writes_only_within_the_size);
    tcase_add_test(tc, old_options_take_defaults_past_their_size);
    tcase_add_test(tc, options_below_first_layout_are_refused);
    tcase_add_test(tc, old_swap_options_take_defaults_past_their_size);
    tcase_add_test(tc, launch_config_sizes);
    tcase_add_test(tc, watch_options_sizes);
    tcase_add_test(tc, check_options_sizes);
    tcase_add_test(tc, old_endpoint_options_take_defaults_past_their_size);
    tcase_add_test(tc, net_structures_below_first_layout_are_refused);
    tcase_add_test(tc, old_pull_options_take_defaults_past_their_size);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

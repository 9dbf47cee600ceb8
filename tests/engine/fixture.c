/*
 * The engine suite's fixture (fixture.h): the runtime and its events, the
 * per-test setup and teardown, swaps and launches. A helper one part alone
 * needs stays in that part.
 */
#include "tests/engine/fixture.h"

hk_runtime *rt;

int events[8];

char last_event_msg[512];

pthread_t reset_event_thread;

static void on_event(const hk_event *ev, void *ud) {
    (void)ud;
    events[ev->kind]++;
    if (ev->kind == HK_EVENT_CONTEXT_RESET)
        reset_event_thread = pthread_self();
    if (ev->report)
        snprintf(last_event_msg, sizeof last_event_msg, "%s", ev->report->message);
}

hk_runtime *make_rt(int ndev, hk_loader loader) {
    fake_init(ndev, 90);
    memset(events, 0, sizeof events);
    hk_options o;
    hk_options_init(&o);
    int devs[4] = {0, 1, 2, 3};
    o.devices = devs;
    o.ndevices = ndev;
    o.loader = loader;
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.on_event = on_event;
    o.no_warm_start = 1; /* warm_start_runs_and_stops covers it */
    hk_runtime *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&r, &o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    return r;
}

void setup(void) {
    rt = make_rt(1, HK_LOADER_LIBRARY);
}

void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
    ck_assert_int_eq(fake_live_images(), 0); /* nothing leaked at destroy */
    ck_assert_int_eq(fake_violations(), 0);
}

int swap_src(const char *mod, const char *src, hk_report *rep) {
    return hk_swap(rt, mod, src, strlen(src), NULL, rep);
}

void swap_ok(const char *mod, const char *src, hk_report *rep) {
    int err = swap_src(mod, src, rep);
    ck_assert_msg(err == 0, "swap refused: %s: %s", hk_strerror(err), rep->message);
}

int launch_tag(hk_kernel *k) {
    int out = -1, *dptr = &out;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    int cu = 0;
    int err = hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu);
    ck_assert_msg(err == 0, "launch failed: %d cu %d", err, cu);
    return out;
}

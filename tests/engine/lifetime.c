/*
 * What a launch holds: an old version outlives a launch in flight, a pin
 * keeps its version, launch slots outlive the runtime without leaking,
 * swaps under concurrent launches; a kernel's attributes and launch options
 * across swaps.
 */
#include "tests/engine/fixture.h"

/* ---- grace periods and pins --------------------------------------------- */

static hk_kernel *held_kernel;

static void *launch_thread(void *arg) {
    (void)arg;
    int *tag = malloc(sizeof *tag);
    *tag = launch_tag(held_kernel);
    return tag;
}

static void *swap2_thread(void *arg) {
    hk_report rep = HK_REPORT_INIT;
    intptr_t err = swap_src("sim", ptx(2, 0, 0, 0), &rep);
    hk_report_clear(&rep);
    return (void *)err;
}

START_TEST(old_version_outlives_launch_in_flight) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &held_kernel), 0);
    fake_hold_next_launch();
    pthread_t t, ts;
    pthread_create(&t, NULL, launch_thread, NULL);
    fake_wait_held(); /* the thread is inside cuLaunchKernel of version 1 */
    /* The swap's driver work waits at the launch gate for the launch in
     * the driver to come out; version 1 stays loaded meanwhile. */
    pthread_create(&ts, NULL, swap2_thread, NULL);
    usleep(100 * 1000);
    ck_assert_int_eq(fake_live_images(), 1); /* version 2 not loaded yet */
    fake_release_launch();
    int *tag;
    pthread_join(t, (void **)&tag);
    ck_assert_int_eq(*tag, 1);
    free(tag);
    void *serr;
    pthread_join(ts, &serr);
    ck_assert_int_eq((intptr_t)serr, 0);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    ck_assert_int_eq(launch_tag(held_kernel), 2);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(pin_keeps_version) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 1, 0, 0), &rep);
    hk_kernel *k, *aux;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    hk_pin *p;
    ck_assert_int_eq(hk_pin_module(rt, "sim", &p), 0);
    ck_assert_uint_eq(hk_pin_version(p), 1);
    swap_ok("sim", ptx(2, 1, 0, 0), &rep);
    ck_assert_int_eq(hk_reclaim_wait(rt, 100), HK_ERR_TIMEOUT);
    int out = 0, *dp = &out;
    unsigned n = 1;
    void *args[] = {&dp, &n};
    ck_assert_int_eq(
        hk_launch_pinned(p, k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL), 0);
    ck_assert_int_eq(out, 1);
    ck_assert_int_eq(launch_tag(k), 2);
    /* A handle taken after the pinned version retired has no code there. */
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "aux", &aux), 0);
    ck_assert_int_eq(
        hk_launch_pinned(p, aux, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL),
        HK_ERR_NOT_FOUND);
    hk_unpin(p);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    hk_report_clear(&rep);
}
END_TEST

static hk_kernel *exit_kernel;

static pthread_barrier_t exit_bar;

static void *launch_then_wait(void *arg) {
    (void)arg;
    launch_tag(exit_kernel);
    pthread_barrier_wait(&exit_bar); /* launched */
    pthread_barrier_wait(&exit_bar); /* the runtime is gone: exit now */
    return NULL;
}

static int count_slots(hk_runtime *r) {
    int n = 0;
    for (hkl_tslot *s = atomic_load(&r->gate.slots); s; s = s->next)
        n++;
    return n;
}

START_TEST(launch_slots_outlive_runtime_and_do_not_leak) {
    /* A thread that launched exits after the runtime was destroyed (checked
     * for use-after-free by the sanitizer build). */
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &exit_kernel), 0);
    pthread_barrier_init(&exit_bar, NULL, 2);
    pthread_t t;
    pthread_create(&t, NULL, launch_then_wait, NULL);
    pthread_barrier_wait(&exit_bar);
    hk_runtime_destroy(rt);
    pthread_barrier_wait(&exit_bar);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&exit_bar);
    /* One thread alternating between two runtimes keeps one slot in each. */
    rt = make_rt(1, HK_LOADER_LIBRARY);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT;
    o.cache_dir = "";
    hk_runtime *r2;
    ck_assert_int_eq(hkl_runtime_create_with(&r2, &o, fake_driver(), NULL), 0);
    const char *src = ptx(2, 0, 0, 0);
    swap_ok("sim", src, &rep);
    ck_assert_int_eq(hk_swap(r2, "sim", src, strlen(src), NULL, &rep), 0);
    hk_kernel *k1, *k2;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k1), 0);
    ck_assert_int_eq(hk_kernel_get(r2, "sim", "step", &k2), 0);
    for (int i = 0; i < 1000; i++) {
        launch_tag(k1);
        launch_tag(k2);
    }
    ck_assert_int_eq(count_slots(rt), 1);
    ck_assert_int_eq(count_slots(r2), 1);
    hk_runtime_destroy(r2);
    hk_report_clear(&rep);
}
END_TEST

/* ---- concurrency --------------------------------------------------------- */

static atomic_int stop_flag;

static atomic_int launch_failures;

static hk_kernel *stress_k;

static void *stress_launcher(void *arg) {
    (void)arg;
    while (!atomic_load(&stop_flag)) {
        int out = -1, *dp = &out;
        unsigned n = 1;
        void *args[] = {&dp, &n};
        if (hk_launch(stress_k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, NULL) ||
            (out != 1 && out != 2))
            atomic_fetch_add(&launch_failures, 1);
    }
    return NULL;
}

START_TEST(swaps_under_concurrent_launches) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 1, 0), &rep);
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &stress_k), 0);
    atomic_store(&stop_flag, 0);
    atomic_store(&launch_failures, 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, stress_launcher, NULL);
    for (int i = 0; i < 300; i++) {
        /* Keep the launchers busy across the swaps: wait for some launches
         * between them. */
        int seen = fake_launches();
        while (fake_launches() < seen + 8)
            usleep(50);
        swap_ok("sim", ptx(1 + (i % 2 == 0), 0, 1, 0), &rep);
    }
    atomic_store(&stop_flag, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    ck_assert_int_eq(atomic_load(&launch_failures), 0);
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    ck_assert_int_eq(fake_violations(), 0);
    ck_assert_int_gt(fake_launches(), 300 * 8);
    hk_stats st = HK_STATS_INIT;
    hk_stats_get(rt, &st);
    ck_assert_uint_eq(st.reclaimed, 300);
    hk_report_clear(&rep);
}
END_TEST

/* ---- kernel attributes and extended launches --------------------------- */

/* The fake's function behind k's current version (context of device 0). */
static void *current_fn(hk_kernel *k) {
    void *f = NULL;
    fake_driver()->CtxSetCurrent((CUcontext)hk_runtime_context(rt, 0));
    ck_assert_int_eq(hk_kernel_function(k, &f), 0);
    fake_driver()->CtxSetCurrent(NULL);
    return f;
}

static char *with_shared(int bytes, const char *src) {
    static char buf[4][2200];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, sizeof buf[0], "// shared: %d\n%s", bytes, src);
    return b;
}

START_TEST(attributes_survive_swaps) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(hk_kernel_set_attribute(k, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             100 << 10, &rep),
                     0);
    ck_assert_int_eq(hk_kernel_set_cache_config(k, CU_FUNC_CACHE_PREFER_SHARED, &rep), 0);
    ck_assert_int_eq(
        fake_kernel_attr(current_fn(k), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES),
        100 << 10);
    for (int i = 0; i < 10; i++) {
        swap_ok("sim", ptx(2 + i, 0, 0, 0), &rep);
        void *f = current_fn(k);
        ck_assert_int_eq(fake_tag_of(f), 2 + i);
        ck_assert_int_eq(fake_kernel_attr(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES),
                         100 << 10);
        ck_assert_int_eq(fake_kernel_attr(f, -1), CU_FUNC_CACHE_PREFER_SHARED);
    }
    ck_assert_int_eq(launch_tag(k), 11);
    hk_report_clear(&rep);
}
END_TEST

/* A version whose static shared memory leaves no room for the dynamic size
 * the handle asked for is refused; the old version runs on. */
START_TEST(attribute_that_does_not_fit_refuses_version) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(1, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    ck_assert_int_eq(
        hk_kernel_set_attribute(k, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 200000, &rep),
        0);
    ck_assert_int_eq(swap_src("sim", with_shared(48000, ptx(2, 0, 0, 0)), &rep), HK_ERR_ATTRIBUTE);
    ck_assert_str_eq(rep.cu_name, "CUDA_ERROR_INVALID_VALUE");
    ck_assert_str_eq(rep.kernel, "step");
    ck_assert_msg(strstr(rep.message, "static shared memory 48000 bytes + 200000 dynamic"), "%s",
                  rep.message);
    ck_assert_int_eq(launch_tag(k), 1);
    ck_assert_uint_eq(hk_module_version(rt, "sim"), 1);
    ck_assert_int_eq(hk_reclaim_wait(rt, 2000), 0);
    ck_assert_int_eq(fake_live_images(), 1);
    /* Refused on the current version: the value kept before stays. */
    ck_assert_int_eq(
        hk_kernel_set_attribute(k, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100000, &rep),
        0);
    swap_ok("sim", with_shared(100000, ptx(3, 0, 0, 0)), &rep);
    ck_assert_int_eq(
        hk_kernel_set_attribute(k, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 200000, &rep),
        HK_ERR_ATTRIBUTE);
    swap_ok("sim", ptx(4, 0, 0, 0), &rep);
    ck_assert_int_eq(
        fake_kernel_attr(current_fn(k), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), 100000);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(launch_ex_passes_its_options) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("sim", ptx(4, 0, 0, 0), &rep);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "sim", "step", &k), 0);
    hk_launch_config c;
    hk_launch_config_init(&c);
    c.cluster = (hk_dim3){2, 1, 1};
    c.cooperative = 1;
    c.has_priority = 1;
    c.priority = -1;
    int out = 0, *dptr = &out, cu = 0;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    ck_assert_int_eq(hk_launch_ex(k, &c, args, &cu), 0);
    ck_assert_int_eq(out, 4);
    int ids[8];
    ck_assert_int_eq(fake_last_launch_ex(ids, 8), 3);
    ck_assert_int_eq(ids[0], CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
    ck_assert_int_eq(ids[1], CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
    ck_assert_int_eq(ids[2], CU_LAUNCH_ATTRIBUTE_PRIORITY);
    swap_ok("sim", ptx(5, 0, 0, 0), &rep);
    ck_assert_int_eq(hk_launch_ex(k, &c, args, &cu), 0);
    ck_assert_int_eq(out, 5);
    hk_launch_config old = c;
    old.size = offsetof(hk_launch_config, has_priority); /* below the first layout */
    ck_assert_int_eq(hk_launch_ex(k, &old, args, &cu), HK_ERR_INVALID);
    old.size = 0;
    ck_assert_int_eq(hk_launch_ex(k, &old, args, &cu), HK_ERR_INVALID);
    hk_report_clear(&rep);
}
END_TEST

void engine_lifetime_tests(TCase *tc) {
    tcase_add_test(tc, old_version_outlives_launch_in_flight);
    tcase_add_test(tc, pin_keeps_version);
    tcase_add_test(tc, launch_slots_outlive_runtime_and_do_not_leak);
    tcase_add_test(tc, swaps_under_concurrent_launches);
    tcase_add_test(tc, attributes_survive_swaps);
    tcase_add_test(tc, attribute_that_does_not_fit_refuses_version);
    tcase_add_test(tc, launch_ex_passes_its_options);
}

/*
 * The watch suite's fixture (fixture.h): the watcher's recorder and
 * directory, the runtime and its events, the hook that holds a build. A
 * helper one part alone needs stays in that part.
 */
#include "tests/watch/fixture.h"

recorder rec;

char dir[PATH_MAX]; /* the watched directory, canonical */

char root[PATH_MAX]; /* the temporary tree holding it */

hkw_watcher *w;

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

int rec_wait(int n, int timeout_ms) {
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

int refusal_count(void) {
    int n;
    pthread_mutex_lock(&rec.mu);
    n = rec.nf;
    pthread_mutex_unlock(&rec.mu);
    return n;
}

void expect_refusals(int n) {
    ck_assert_int_ge(refusals_wait(n, WAIT_MS), n);
    usleep(SETTLE_MS * 1000);
    pthread_mutex_lock(&rec.mu);
    ck_assert_int_eq(rec.nf, n);
    pthread_mutex_unlock(&rec.mu);
}

volatile int writer_stop;

int refusal_of(const char *name, refusal *out) {
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

int rec_count(void) {
    int n;
    pthread_mutex_lock(&rec.mu);
    n = rec.n;
    pthread_mutex_unlock(&rec.mu);
    return n;
}

int rec_count_module(const char *module, int from) {
    int n = 0;
    pthread_mutex_lock(&rec.mu);
    for (int i = from; i < rec.n; i++)
        n += strcmp(rec.r[i].module, module) == 0;
    pthread_mutex_unlock(&rec.mu);
    return n;
}

const char *rec_last(const char *module) {
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

void expect_total(int n) {
    ck_assert_int_ge(rec_wait(n, WAIT_MS), n);
    usleep(SETTLE_MS * 1000);
    ck_assert_int_eq(rec_count(), n);
}

void path_in(char *out, size_t size, const char *d, const char *name) {
    int n = snprintf(out, size, "%s/%s", d, name);
    ck_assert(n > 0 && (size_t)n < size);
}

void write_at(const char *path, const char *content) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    size_t len = strlen(content);

    ck_assert_msg(fd >= 0, "open %s: %s", path, strerror(errno));
    ck_assert_int_eq(write(fd, content, len), (ssize_t)len);
    ck_assert_int_eq(close(fd), 0);
}

void write_file(const char *name, const char *content) {
    char p[PATH_MAX];
    path_in(p, sizeof p, dir, name);
    write_at(p, content);
}

void rm_rf(const char *path) {
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) {
        /* Nothing to do: a leftover temporary directory is harmless. */
    }
}

void start_with(hkw_opts *o) {
    /* Files written within a clock tick of the watch being placed count as
     * possibly changed after it (the watcher errs towards a rebuild too many);
     * the tests want those written before to be plainly older. */
    usleep(60 * 1000);
    o->fn = rec_cb;
    o->refuse = rec_refuse_cb;
    o->ud = &rec;
    ck_assert_int_eq(hkw_create(&w, o), 0);
}

void start(void) {
    hkw_opts o;
    hkw_opts_init(&o);
    o.dir_poll_ms = 50;
    start_with(&o);
}

void setup(void) {
    char tmpl[] = "/tmp/hk_watch_XXXXXX";
    char *t = mkdtemp(tmpl);

    ck_assert(t != NULL);
    ck_assert(realpath(t, root) != NULL);
    path_in(dir, sizeof dir, root, "kernels");
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    rec_init(&rec);
    w = NULL;
}

void teardown(void) {
    hkw_destroy(w);
    w = NULL;
    rec_fini(&rec);
    rm_rf(root);
}

void *writer_main(void *arg) {
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

hk_runtime *rt;

pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;

int ev_committed, ev_refused, ev_superseded;

char ev_origin[PATH_MAX + 16];

hk_kernel *ev_kernel;

int ev_tags[64], ev_ntags;

hk_watch *ev_stop_watch;

int ev_stopped;

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

int events_of(int *counter) {
    int n;
    pthread_mutex_lock(&ev_mu);
    n = *counter;
    pthread_mutex_unlock(&ev_mu);
    return n;
}

uint64_t wait_version(const char *module, uint64_t v) {
    uint64_t got = 0;
    for (int i = 0; i < WAIT_MS / 10; i++) {
        got = hk_module_version(rt, module);
        if (got >= v)
            break;
        usleep(10 * 1000);
    }
    return got;
}

void wait_events(int *counter, int n) {
    for (int i = 0; i < WAIT_MS / 10 && events_of(counter) < n; i++)
        usleep(10 * 1000);
    ck_assert_int_ge(events_of(counter), n);
}

const char *ptx_text(int tag) {
    static char b[512];
    snprintf(b, sizeof b,
             "// tag: %d\n.version 8.0\n.target sm_90\n.address_size 64\n"
             ".visible .entry step(.param .u64 out, .param .u32 n)\n{\n ret;\n}\n",
             tag);
    return b;
}

pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;

pthread_cond_t hook_cond = PTHREAD_COND_INITIALIZER;

hkl_hook_point hook_at;

int hook_armed, hook_inside, hook_release;

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

void hook_go(void) {
    pthread_mutex_lock(&hook_lock);
    hook_release = 1;
    hook_armed = 0;
    pthread_cond_broadcast(&hook_cond);
    pthread_mutex_unlock(&hook_lock);
}

void rt_setup(void) {
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

void rt_teardown(void) {
    hook_go();              /* a test that failed while holding the worker */
    hk_runtime_destroy(rt); /* also stops the watcher */
    rt = NULL;
    for (int i = 0; i < ev_refused && i < (int)(sizeof ev_ref / sizeof ev_ref[0]); i++)
        free(ev_ref[i].log);
    ck_assert_int_eq(fake_live_images(), 0);
    teardown();
}

refused_event refused_for(const char *name) {
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

uint64_t metric(const char *name) {
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

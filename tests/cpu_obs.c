/*
 * Logs and metrics, end to end on the fake driver: a runtime with its log
 * callback (or HOTKERN_LOG and stderr), the watcher on a temporary
 * directory, an endpoint driven with libcurl, pullers against a closed port
 * and a libmicrohttpd origin serving a release signed by an untrusted key.
 * The metrics text is checked line by line against the exposition format
 * (names, labels, escapes, values, family grouping, histogram buckets) by a
 * validator that is itself shown to refuse bad text.
 */
#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <dirent.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <microhttpd.h>
#include <sodium.h>

#include "hotkern/net.h"
#include "loader/core.h"
#include "loader/expo.h"
#include "loader/metrics.h"
#include "net/net.h"
#include "tests/fakecuda.h"
#include "watch/watch.h"
#include "tests/harness.h"

/* ---- a log recorder ---------------------------------------------------- */

#define MAX_LINES 2048

static struct {
    pthread_mutex_t lock;
    int n;
    int busy; /* what hk_runtime_set_log answered from inside the callback */
    struct {
        int level;
        char sub[16];
        char msg[1024];
    } e[MAX_LINES];
} logs = {.lock = PTHREAD_MUTEX_INITIALIZER};

static hk_runtime *rt;
static char *tmp;
static int try_set_log_inside; /* the callback calls hk_runtime_set_log once */

static void on_log(hk_log_level level, const char *sub, const char *msg, void *ud) {
    pthread_mutex_lock(&logs.lock);
    if (logs.n < MAX_LINES) {
        logs.e[logs.n].level = level;
        snprintf(logs.e[logs.n].sub, sizeof logs.e[0].sub, "%s", sub);
        snprintf(logs.e[logs.n].msg, sizeof logs.e[0].msg, "%s", msg);
        logs.n++;
    }
    int try_it = try_set_log_inside;
    try_set_log_inside = 0;
    pthread_mutex_unlock(&logs.lock);
    if (try_it) {
        int busy = hk_runtime_set_log(rt, NULL, NULL, HK_LOG_OFF);
        hk_log(rt, HK_LOG_ERROR, "test", "logged from the callback");
        pthread_mutex_lock(&logs.lock);
        logs.busy = busy;
        pthread_mutex_unlock(&logs.lock);
    }
}

/* Index of the first line of `level` from `sub` holding every needle
 * (NULL-terminated list), or -1; the line is copied to out. */
static int find_line(int level, const char *sub, const char *const *needles, char *out,
                     size_t cap) {
    int found = -1;
    pthread_mutex_lock(&logs.lock);
    for (int i = 0; i < logs.n && found < 0; i++) {
        if (logs.e[i].level != level || strcmp(logs.e[i].sub, sub))
            continue;
        int all = 1;
        for (int j = 0; needles[j] && all; j++)
            all = strstr(logs.e[i].msg, needles[j]) != NULL;
        if (all) {
            found = i;
            if (out)
                snprintf(out, cap, "%s", logs.e[i].msg);
        }
    }
    pthread_mutex_unlock(&logs.lock);
    return found;
}

/* Waits (10 s at most) for such a line; fails the test with what was logged. */
static void wait_line(int level, const char *sub, const char *const *needles, char *out,
                      size_t cap) {
    for (int i = 0; i < 1000; i++) {
        if (find_line(level, sub, needles, out, cap) >= 0)
            return;
        usleep(10 * 1000);
    }
    pthread_mutex_lock(&logs.lock);
    for (int i = 0; i < logs.n; i++)
        fprintf(stderr, "  [%d %s] %s\n", logs.e[i].level, logs.e[i].sub, logs.e[i].msg);
    pthread_mutex_unlock(&logs.lock);
    ck_abort_msg("no %s line from %s with '%s'", hk_log_level_name(level), sub, needles[0]);
}

#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- fixture ----------------------------------------------------------- */

static hk_runtime *make_rt(void) {
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.no_warm_start = 1;
    hk_runtime *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&r, &o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    return r;
}

static void setup(void) {
    pthread_mutex_lock(&logs.lock);
    logs.n = 0;
    logs.busy = 0;
    pthread_mutex_unlock(&logs.lock);
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    rt = make_rt();
}

static void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
    hkt_rmtree(tmp);
    free(tmp);
}

static void swap_ok(const char *mod, int tag) {
    hk_report rep = HK_REPORT_INIT;
    const char *src = fake_ptx(tag, 0, 0, 0);
    int err = hk_swap(rt, mod, src, strlen(src), NULL, &rep);
    ck_assert_msg(err == 0, "swap: %s", rep.message);
    hk_report_clear(&rep);
}

static void swap_bad(const char *mod) {
    static const char bad[] = ".version 8.0\n.target sm_90\n// SYNTAX ERROR\n";
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_ne(hk_swap(rt, mod, bad, strlen(bad), NULL, &rep), 0);
    hk_report_clear(&rep);
}

/* ---- an exposition validator ------------------------------------------- */

struct fam {
    char name[128], type[32];
    int help, typed, samples, closed;
};

static int is_metric_name(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9')))
            return 0;
    }
    return n > 0;
}

/* A value as hotkern prints it: an integer, or a decimal of at most six
 * places whose last digit is not 0 (no binary floating-point noise). */
static int clean_value(const char *v) {
    const char *p = v + (*v == '-');
    size_t ip = strspn(p, "0123456789");
    if (!ip)
        return 0;
    p += ip;
    if (!*p)
        return 1;
    if (*p != '.')
        return 0;
    size_t fp = strspn(p + 1, "0123456789");
    return fp >= 1 && fp <= 6 && p[1 + fp] == '\0' && p[fp] != '0';
}

/* Parses {name="value",...}; copies the le label's value to le (or "").
 * Returns the character after '}', or NULL with *why set. */
static const char *parse_labels(const char *p, char *le, size_t cap, const char **why) {
    char seen[8][64];
    int nseen = 0;
    le[0] = '\0';
    p++;
    while (*p != '}') {
        size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789");
        if (!n || (*p >= '0' && *p <= '9') || n >= 64 || p[n] != '=' || p[n + 1] != '"')
            return *why = "bad label name", NULL;
        for (int i = 0; i < nseen; i++)
            if (strlen(seen[i]) == n && !strncmp(seen[i], p, n))
                return *why = "label twice", NULL;
        if (nseen < 8)
            snprintf(seen[nseen++], 64, "%.*s", (int)n, p);
        int is_le = n == 2 && !strncmp(p, "le", 2);
        p += n + 2;
        size_t o = 0;
        for (; *p != '"'; p++) {
            if (!*p || *p == '\n')
                return *why = "unterminated label value", NULL;
            if (*p == '\\') {
                p++;
                if (*p != '\\' && *p != '"' && *p != 'n')
                    return *why = "bad escape in a label value", NULL;
            }
            if (is_le && o + 1 < cap)
                le[o++] = *p;
        }
        if (is_le)
            le[o] = '\0';
        p++;
        if (*p == ',')
            p++;
        else if (*p != '}')
            return *why = "labels not separated by ','", NULL;
    }
    return p + 1;
}

static struct fam *fam_of(struct fam *f, int n, const char *name, const char **suffix) {
    for (int i = 0; i < n; i++) {
        size_t l = strlen(f[i].name);
        if (!strcmp(f[i].name, name)) {
            *suffix = "";
            return &f[i];
        }
        if (!strcmp(f[i].type, "histogram") && !strncmp(f[i].name, name, l) &&
            (!strcmp(name + l, "_bucket") || !strcmp(name + l, "_sum") ||
             !strcmp(name + l, "_count"))) {
            *suffix = name + l;
            return &f[i];
        }
    }
    return NULL;
}

/* Checks one histogram sample against the running state of its family. */
static const char *histo_step(const char *suffix, const char *le, const char *value,
                              double *last_le, double *last_bucket, double *inf) {
    double v = strtod(value, NULL);
    if (!strcmp(suffix, "_bucket")) {
        double l = !strcmp(le, "+Inf") ? 1e300 : strtod(le, NULL);
        if (!le[0] || l <= *last_le || v < *last_bucket)
            return "histogram buckets out of order or not cumulative";
        *last_le = l;
        *last_bucket = v;
        if (l == 1e300)
            *inf = v;
    } else if (!strcmp(suffix, "_count") && v != *inf) {
        return "histogram _count differs from its +Inf bucket";
    }
    return NULL;
}

/* NULL when text is valid exposition as hotkern writes it, else why (the
 * offending line goes to bad). */
static const char *check_exposition(const char *text, char *bad, size_t cap) {
    static struct fam f[256];
    int nf = 0;
    struct fam *cur = NULL;
    double last_le = -1, last_bucket = 0, inf = -1;
    const char *why = NULL;
    size_t len = strlen(text);
    if (!len || text[len - 1] != '\n')
        return "does not end with a newline";
    char *copy = strdup(text), *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line && !why;
         line = strtok_r(NULL, "\n", &save)) {
        snprintf(bad, cap, "%s", line);
        char name[128], kind[32];
        const char *suffix = "";
        if (!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7)) {
            int help = line[2] == 'H';
            size_t n = strcspn(line + 7, " ");
            if (!is_metric_name(line + 7, n) || n >= sizeof name)
                why = "bad family name";
            if (why)
                break;
            snprintf(name, sizeof name, "%.*s", (int)n, line + 7);
            struct fam *g = NULL;
            for (int i = 0; i < nf; i++)
                g = !strcmp(f[i].name, name) ? &f[i] : g;
            if (!g && nf < 256) {
                g = &f[nf++];
                memset(g, 0, sizeof *g);
                snprintf(g->name, sizeof g->name, "%s", name);
            }
            if (g->samples)
                why = "HELP or TYPE after the family's samples";
            else if (help ? g->help++ : g->typed++)
                why = "HELP or TYPE twice";
            else if (!help) {
                if (sscanf(line + 7 + n, " %31s", kind) != 1 ||
                    (strcmp(kind, "counter") && strcmp(kind, "gauge") &&
                     strcmp(kind, "histogram") && strcmp(kind, "untyped")))
                    why = "bad type";
                else if (!strcmp(kind, "counter") && (n < 6 || strcmp(name + n - 6, "_total")))
                    why = "a counter not named _total";
                snprintf(g->type, sizeof g->type, "%s", kind);
            }
            continue;
        }
        if (line[0] == '#') {
            why = "stray comment";
            break;
        }
        size_t n = strcspn(line, "{ ");
        if (!is_metric_name(line, n) || n >= sizeof name) {
            why = "bad sample name";
            break;
        }
        snprintf(name, sizeof name, "%.*s", (int)n, line);
        struct fam *g = fam_of(f, nf, name, &suffix);
        if (!g || !g->typed) {
            why = "sample without a TYPE";
            break;
        }
        if (g != cur) {
            if (g->closed) {
                why = "family's samples not together";
                break;
            }
            if (cur)
                cur->closed = 1;
            cur = g;
            last_le = -1, last_bucket = 0, inf = -1;
        }
        g->samples++;
        const char *p = line + n;
        char le[32] = "";
        if (*p == '{' && !(p = parse_labels(p, le, sizeof le, &why)))
            break;
        if (*p != ' ' || !clean_value(p + 1)) {
            why = "bad value (float noise, or not a number)";
            break;
        }
        if (!strcmp(g->type, "histogram"))
            why = histo_step(suffix, le, p + 1, &last_le, &last_bucket, &inf);
    }
    free(copy);
    return why;
}

/* The value of the sample line that starts with `series` ("name{...}" or
 * "name"), or -1. */
static double sample_value(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1;
}

static char *metrics(void) {
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(hk_metrics_text_alloc(rt, &text, &len), 0);
    ck_assert_uint_eq(len, strlen(text));
    return text;
}

static void assert_valid(const char *text) {
    char bad[1024];
    const char *why = check_exposition(text, bad, sizeof bad);
    ck_assert_msg(!why, "%s: %s\n%s", why, bad, text);
}

/* ---- tests: logs ------------------------------------------------------- */

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

/* ---- tests: the watcher ------------------------------------------------ */

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

/* ---- tests: the endpoint ----------------------------------------------- */

struct resp {
    char *data;
    size_t len;
};

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    struct resp *r = ud;
    char *nd = realloc(r->data, r->len + size * n + 1);
    if (!nd)
        return 0;
    r->data = nd;
    memcpy(r->data + r->len, p, size * n);
    r->len += size * n;
    r->data[r->len] = '\0';
    return size * n;
}

/* One request with libcurl; returns the status, the body in *body (the
 * caller frees it). */
static long http(unsigned port, const char *method, const char *path, const char *token,
                 const char *data, size_t len, char **body) {
    char url[256], auth[128];
    struct resp r = {calloc(1, 1), 0};
    struct curl_slist *h = NULL;
    long status = 0;
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    if (data) {
        h = curl_slist_append(h, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, data);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    CURLcode rc = curl_easy_perform(c);
    ck_assert_msg(rc == CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    if (body)
        *body = r.data;
    else
        free(r.data);
    return status;
}

/* A release of module m (one PTX artifact) signed by k, as a push body. */
static char *release_body(const hkn_seckey *k, const char *module, uint64_t version, int tag) {
    const char *ptx = fake_ptx(tag, 0, 0, 0);
    hkn_blob b = {.name = "m.ptx", .bytes = ptx, .size = strlen(ptx)};
    char *manifest, *sig, hex[65], *b64 = malloc(strlen(ptx) * 2 + 8);
    size_t mlen;
    hk_report rep = HK_REPORT_INIT;
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(
        hkn_release_sign(k, module, version, now, now + 600, &b, 1, &manifest, &mlen, &sig, &rep),
        0);
    hkn_sha256_hex(ptx, strlen(ptx), hex);
    sodium_bin2base64(b64, strlen(ptx) * 2 + 8, (const unsigned char *)ptx, strlen(ptx),
                      sodium_base64_VARIANT_ORIGINAL);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "manifest", manifest);
    cJSON_AddStringToObject(o, "signature", sig);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "artifacts"), hex, b64);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(manifest);
    free(sig);
    free(b64);
    return text;
}

/* Keys: `trusted` saved as DIR/trusted.pub, `stranger` not trusted. */
static hkn_seckey trusted, stranger;
static char pub_path[PATH_MAX];

static void make_keys(void) {
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_keygen(&trusted), 0);
    ck_assert_int_eq(hkn_keygen(&stranger), 0);
    snprintf(pub_path, sizeof pub_path, "%s/trusted.pub", tmp);
    ck_assert_int_eq(hkn_pubkey_save(pub_path, &trusted.pub, &rep), 0);
}

static hk_endpoint *start_endpoint(unsigned *port) {
    char state[PATH_MAX];
    const char *keys[] = {pub_path};
    hk_endpoint_options o;
    hk_endpoint *ep = NULL;
    hk_report rep = HK_REPORT_INIT;
    snprintf(state, sizeof state, "%s/state", tmp);
    hk_endpoint_options_init(&o);
    o.token = "tok";
    o.trusted_keys = keys;
    o.ntrusted_keys = 1;
    o.state_dir = state;
    o.max_body_bytes = 64 * 1024;
    ck_assert_msg(hk_endpoint_start(rt, &o, &ep, &rep) == 0, "%s", rep.message);
    *port = hk_endpoint_port(ep);
    return ep;
}

START_TEST(endpoint_says_why_it_refuses) {
    char line[1024];
    unsigned port;
    make_keys();
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_INFO), 0);
    hk_endpoint *ep = start_endpoint(&port);
    wait_line(HK_LOG_INFO, "endpoint", NEEDLES("listening on 127.0.0.1", "bearer token"), NULL, 0);

    ck_assert_int_eq(http(port, "GET", "/v1/status", NULL, NULL, 0, NULL), 401);
    wait_line(
        HK_LOG_WARN, "endpoint",
        NEEDLES("refused GET /v1/status from 127.0.0.1", "401", "missing or wrong bearer token"),
        NULL, 0);

    size_t big = 100 * 1024;
    char *junk = malloc(big);
    memset(junk, 'x', big);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", junk, big, NULL), 413);
    free(junk);
    wait_line(HK_LOG_WARN, "endpoint",
              NEEDLES("refused POST /v1/release", "413", "102400 bytes is over the cap of 65536"),
              NULL, 0);

    char *body = release_body(&stranger, "m", 7, 1);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), NULL), 403);
    free(body);
    wait_line(HK_LOG_WARN, "endpoint", NEEDLES("refused release", "403 HK_ERR_SIGNATURE"), line,
              sizeof line);

    body = release_body(&trusted, "m", 7, 2);
    char *answer = NULL;
    long code = http(port, "POST", "/v1/release", "tok", body, strlen(body), &answer);
    ck_assert_msg(code == 200, "%ld %s", code, answer);
    free(answer);
    free(body);
    wait_line(HK_LOG_INFO, "endpoint", NEEDLES("POST /v1/release from 127.0.0.1", "queued"), NULL,
              0);
    wait_line(HK_LOG_INFO, "endpoint", NEEDLES("release of m v7", "done: engine v1"), NULL, 0);
    wait_line(HK_LOG_INFO, "engine", NEEDLES("committed m v1", "from push"), NULL, 0);
    hk_endpoint_stop(ep);
}
END_TEST

/* Removes the lines of series that change with every request. */
static void drop_volatile(char *text) {
    static const char *const vol[] = {"hotkern_push_requests_total{", "hotkern_push_connections{"};
    char *out = text;
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p + 1) : strlen(p);
        int drop = 0;
        for (size_t i = 0; i < sizeof vol / sizeof vol[0]; i++)
            drop |= !strncmp(p, vol[i], strlen(vol[i]));
        if (!drop) {
            memmove(out, p, n);
            out += n;
        }
        p += n;
    }
    *out = '\0';
}

/* A lost context quarantines the release just pushed: /v1/status lists it
 * with its release version, and the same image under a newer release
 * version is refused (409), while a different image goes in. */
START_TEST(endpoint_status_shows_the_quarantine) {
    unsigned port;
    make_keys();
    hk_endpoint *ep = start_endpoint(&port);
    char *body = release_body(&trusted, "m", 3, 2);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), NULL), 200);
    free(body);
    ck_assert_int_eq(hk_runtime_note_error(rt, CUDA_ERROR_ILLEGAL_ADDRESS), 1);

    char *status = NULL;
    ck_assert_int_eq(http(port, "GET", "/v1/status", "tok", NULL, 0, &status), 200);
    cJSON *j = cJSON_Parse(status);
    ck_assert_ptr_nonnull(j);
    cJSON *q = cJSON_GetObjectItem(j, "quarantine");
    ck_assert_msg(cJSON_IsArray(q) && cJSON_GetArraySize(q) == 1, "%s", status);
    cJSON *e = cJSON_GetArrayItem(q, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(e, "module")->valuestring, "m");
    ck_assert_int_eq((int)cJSON_GetObjectItem(e, "release_version")->valuedouble, 3);
    ck_assert_int_eq(strlen(cJSON_GetObjectItem(e, "image")->valuestring), 64);
    cJSON_Delete(j);
    free(status);

    char *answer = NULL;
    body = release_body(&trusted, "m", 4, 2);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), &answer), 409);
    ck_assert_msg(strstr(answer, "HK_ERR_QUARANTINED"), "%s", answer);
    free(answer);
    free(body);
    body = release_body(&trusted, "m", 5, 3);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), NULL), 200);
    free(body);
    char *text = metrics();
    ck_assert_msg(sample_value(text, "hotkern_quarantined_images") == 1, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_context_lost_total") == 1, "%s", text);
    free(text);
    hk_endpoint_stop(ep);
}
END_TEST

START_TEST(endpoint_metrics_are_the_runtimes) {
    unsigned port;
    char series[256];
    make_keys();
    hk_endpoint *ep = start_endpoint(&port);
    ck_assert_int_eq(http(port, "GET", "/v1/status", "wrong", NULL, 0, NULL), 401);
    char *body = release_body(&stranger, "m", 3, 1);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), NULL), 403);
    free(body);
    body = release_body(&trusted, "m", 3, 2);
    ck_assert_int_eq(http(port, "POST", "/v1/release", "tok", body, strlen(body), NULL), 200);
    free(body);
    swap_ok("other", 5);
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);

    char *served = NULL;
    ck_assert_int_eq(http(port, "GET", "/metrics", "tok", NULL, 0, &served), 200);
    char *text = metrics();
    assert_valid(served);
    assert_valid(text);
    snprintf(series, sizeof series, "hotkern_push_unauthorized_total{endpoint=\"127.0.0.1:%u\"}",
             port);
    ck_assert_msg(sample_value(text, series) == 1, "%s\n%s", series, text);
    snprintf(series, sizeof series,
             "hotkern_push_refusals_total{endpoint=\"127.0.0.1:%u\",error=\"HK_ERR_SIGNATURE\"}",
             port);
    ck_assert_msg(sample_value(text, series) == 1, "%s\n%s", series, text);
    snprintf(series, sizeof series,
             "hotkern_module_release_version{endpoint=\"127.0.0.1:%u\",module=\"m\"}", port);
    ck_assert_msg(sample_value(text, series) == 3, "%s\n%s", series, text);
    snprintf(series, sizeof series, "hotkern_push_requests_total{endpoint=\"127.0.0.1:%u\"}", port);
    ck_assert_msg(sample_value(served, series) == 4, "%s\n%s", series, served);
    ck_assert_msg(sample_value(text, "hotkern_swaps_total") == 2, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_swap_duration_seconds_count") == 2, "%s", text);
    /* The same text, but for what the GET itself changed. */
    drop_volatile(served);
    drop_volatile(text);
    ck_assert_str_eq(served, text);
    free(served);
    free(text);
    hk_endpoint_stop(ep);
    /* Stopped: its families are gone from the runtime's text. */
    text = metrics();
    ck_assert_ptr_null(strstr(text, "hotkern_push_"));
    assert_valid(text);
    free(text);
}
END_TEST

/* ---- tests: the puller ------------------------------------------------- */

/* A port on 127.0.0.1 that refuses connections: bound, never listening
 * (the socket stays open so that nobody else takes the port). */
static int closed_port(unsigned *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static hk_puller *start_puller(const char *url, const char *key) {
    hk_pull_options o;
    hk_puller *p = NULL;
    hk_report rep = HK_REPORT_INIT;
    const char *keys[] = {key};
    hk_pull_options_init(&o);
    o.url = url;
    o.interval_ms = 50;
    o.jitter_pct = 0; /* the delays below are then exact */
    o.max_backoff_ms = 400;
    o.connect_timeout_ms = 2000;
    o.state_dir = "";
    o.trusted_keys = key ? keys : NULL;
    o.ntrusted_keys = key ? 1 : 0;
    ck_assert_msg(hk_pull_start(rt, &o, &p, &rep) == 0, "%s", rep.message);
    return p;
}

START_TEST(puller_says_when_it_retries) {
    unsigned port1, port2;
    char url1[128], url2[128], series[256];
    int fd1 = closed_port(&port1), fd2 = closed_port(&port2);
    snprintf(url1, sizeof url1, "http://127.0.0.1:%u/r/manifest.json", port1);
    snprintf(url2, sizeof url2, "http://127.0.0.1:%u/r/manifest.json", port2);
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_DEBUG), 0);
    hk_puller *p1 = start_puller(url1, NULL);
    wait_line(HK_LOG_DEBUG, "pull", NEEDLES("polling", url1), NULL, 0);
    wait_line(HK_LOG_WARN, "pull", NEEDLES(url1, "HK_ERR_NETWORK", "retry 1 in 100 ms"), NULL, 0);
    wait_line(HK_LOG_WARN, "pull", NEEDLES(url1, "retry 2 in 200 ms"), NULL, 0);
    wait_line(HK_LOG_WARN, "pull", NEEDLES(url1, "retry 4 in 400 ms", "backoff up to 400"), NULL,
              0);
    /* Two pullers: one family each, a series per URL. */
    hk_puller *p2 = start_puller(url2, NULL);
    wait_line(HK_LOG_WARN, "pull", NEEDLES(url2, "retry 1 in 100 ms"), NULL, 0);
    char *text = metrics();
    assert_valid(text);
    snprintf(series, sizeof series, "hotkern_pull_errors_total{url=\"%s\"}", url1);
    ck_assert_msg(sample_value(text, series) >= 4, "%s\n%s", series, text);
    snprintf(series, sizeof series, "hotkern_pull_errors_total{url=\"%s\"}", url2);
    ck_assert_msg(sample_value(text, series) >= 1, "%s\n%s", series, text);
    snprintf(series, sizeof series, "hotkern_pull_consecutive_failures{url=\"%s\"}", url1);
    ck_assert_msg(sample_value(text, series) >= 4, "%s\n%s", series, text);
    const char *t = strstr(text, "# TYPE hotkern_pull_errors_total ");
    ck_assert_ptr_nonnull(t);
    ck_assert_ptr_null(strstr(t + 1, "# TYPE hotkern_pull_errors_total "));
    free(text);
    hk_pull_stop(p1);
    hk_pull_stop(p2);
    close(fd1);
    close(fd2);
}
END_TEST

/* A puller's URL labels its metrics: one with a CR, LF, a space or a byte
 * that is no UTF-8 is refused when the puller starts, and the runtime's
 * metrics stay valid exposition text. */
START_TEST(puller_url_cannot_break_metrics) {
    static const char *const bad[] = {
        "http://127.0.0.1:1/m.json\r\nhotkern_fake 1",
        "http://127.0.0.1:1/m\r.json",
        "http://127.0.0.1:1/\xff\xfe.json",
        "http://127.0.0.1:1/a b/m.json",
        "http://127.0.0.1:1/\x7f.json",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hk_pull_options o;
        hk_puller *p = NULL;
        hk_report rep = HK_REPORT_INIT;
        hk_pull_options_init(&o);
        o.url = bad[i];
        o.state_dir = "";
        o.allow_unsigned = 1;
        int err = hk_pull_start(rt, &o, &p, &rep);
        char *text = metrics();
        assert_valid(text);
        ck_assert_ptr_null(strstr(text, "hotkern_fake"));
        free(text);
        hk_pull_stop(p);
        ck_assert_msg(err == HK_ERR_INVALID && strstr(rep.message, "printable ASCII"),
                      "URL %zu: %d %s", i, err, rep.message);
        ck_assert_ptr_null(p);
        hk_report_clear(&rep);
    }
    hk_pull_options o;
    hk_puller *p = NULL;
    hk_report rep = HK_REPORT_INIT;
    hk_pull_options_init(&o);
    o.url = "http://127.0.0.1:1/m.json";
    o.artifact_base = "http://127.0.0.1:1/\n";
    o.state_dir = "";
    o.allow_unsigned = 1;
    ck_assert_int_eq(hk_pull_start(rt, &o, &p, &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "artifact_base"), "%s", rep.message);
}
END_TEST

/* A static origin: the manifest and its signature from memory. */
static char *origin_manifest, *origin_sig;

static enum MHD_Result serve(void *cls, struct MHD_Connection *c, const char *url,
                             const char *method, const char *version, const char *upload,
                             size_t *upload_size, void **con_cls) {
    const char *text = !strcmp(url, "/r/manifest.json")       ? origin_manifest
                       : !strcmp(url, "/r/manifest.json.sig") ? origin_sig
                                                              : NULL;
    struct MHD_Response *r = MHD_create_response_from_buffer(
        text ? strlen(text) : 9, (void *)(text ? text : "not found"), MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret = MHD_queue_response(c, text ? 200 : 404, r);
    MHD_destroy_response(r);
    return ret;
}

START_TEST(puller_says_why_it_refuses) {
    char url[128];
    size_t mlen;
    hk_report rep = HK_REPORT_INIT;
    make_keys();
    const char *ptx = fake_ptx(1, 0, 0, 0);
    hkn_blob b = {.name = "m.ptx", .bytes = ptx, .size = strlen(ptx)};
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(hkn_release_sign(&stranger, "m", 4, now, now + 600, &b, 1, &origin_manifest,
                                      &mlen, &origin_sig, &rep),
                     0);
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, serve,
                                            NULL, MHD_OPTION_END);
    ck_assert_ptr_nonnull(d);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(url, sizeof url, "http://127.0.0.1:%u/r/manifest.json", (unsigned)di->port);
    ck_assert_int_eq(hk_runtime_set_log(rt, on_log, NULL, HK_LOG_INFO), 0);
    hk_puller *p = start_puller(url, pub_path);
    wait_line(HK_LOG_WARN, "pull", NEEDLES("refused the manifest at", url, "HK_ERR_SIGNATURE"),
              NULL, 0);
    wait_line(HK_LOG_WARN, "pull", NEEDLES(url, "HK_ERR_SIGNATURE", "retry 1 in 100 ms"), NULL, 0);
    hk_pull_stop(p);
    MHD_stop_daemon(d);
    free(origin_manifest);
    free(origin_sig);
    ck_assert_uint_eq(hk_module_version(rt, "m"), 0);
}
END_TEST

/* ---- tests: the metrics text ------------------------------------------- */

START_TEST(metrics_text_is_exposition) {
    hk_report rep = HK_REPORT_INIT;
    swap_ok("m", 1);
    swap_ok("m", 2);
    swap_bad("m");
    ck_assert_int_eq(hk_rollback(rt, "m", &rep), 0);
    ck_assert_int_eq(hk_reclaim_wait(rt, 5000), 0);
    char *text = metrics(), series[128];
    assert_valid(text);
    ck_assert_msg(sample_value(text, "hotkern_swaps_total") == 3, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_rollbacks_total") == 1, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_refused_total") == 1, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_reclaimed_total") == 2, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_live_versions") == 1, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_swap_duration_seconds_count") == 3, "%s", text);
    ck_assert_msg(sample_value(text, "hotkern_swap_duration_seconds_bucket{le=\"+Inf\"}") == 3,
                  "%s", text);
    snprintf(series, sizeof series, "hotkern_build_info{version=\"%s\"}", hk_version());
    ck_assert_msg(sample_value(text, series) == 1, "%s", text);

    /* Into a caller's buffer: the same text when it fits, else nothing. */
    size_t len = 0, need = strlen(text);
    char *buf = malloc(need + 1);
    ck_assert_int_eq(hk_metrics_text(rt, buf, need, &len), HK_ERR_TOO_LARGE);
    ck_assert_uint_eq(len, need);
    ck_assert_str_eq(buf, "");
    ck_assert_int_eq(hk_metrics_text(rt, buf, need + 1, &len), 0);
    ck_assert_str_eq(buf, text);
    free(buf);
    free(text);
    ck_assert_int_eq(hk_metrics_text_alloc(NULL, &text, &len), HK_ERR_INVALID);
    ck_assert_ptr_null(text);
}
END_TEST

START_TEST(histogram_buckets_are_fixed) {
    hkl_hist h;
    hk_stats s = HK_STATS_INIT;
    char *text = NULL;
    memset(&h, 0, sizeof h);
    memset(&s, 0, sizeof s);
    hkl_hist_observe(&h, 0.2);     /* 200 us */
    hkl_hist_observe(&h, 0.25);    /* on the bound: counts as le="0.00025" */
    hkl_hist_observe(&h, 3.0);     /* le="0.005" */
    hkl_hist_observe(&h, 45000.0); /* over 30 s: +Inf only */
    s.stage_ms_total = 42;         /* 0.042 s, not 0.042000000000000003 */
    s.build_ms_total = 1234.5678;  /* 1.234568 s: six places at most */
    hk_metrics_writer *w = hkl_mw_new();
    hkl_metrics_engine(w, &s, &h);
    ck_assert_int_eq(hkl_mw_take(w, &text, NULL), 0);
    assert_valid(text);
    static const struct {
        const char *le;
        double n;
    } want[] = {{"0.00025", 2}, {"0.0005", 2}, {"0.0025", 2}, {"0.005", 3},
                {"10", 3},      {"30", 3},     {"+Inf", 4}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char series[96];
        snprintf(series, sizeof series, "hotkern_swap_duration_seconds_bucket{le=\"%s\"}",
                 want[i].le);
        ck_assert_msg(sample_value(text, series) == want[i].n, "%s\n%s", series, text);
    }
    ck_assert_ptr_nonnull(strstr(text, "\nhotkern_swap_duration_seconds_sum 45.00345\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nhotkern_stage_seconds_total 0.042\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nhotkern_build_seconds_total 1.234568\n"));
    ck_assert_ptr_nonnull(strstr(text, "\nhotkern_commit_seconds_total 0\n"));
    free(text);
}
END_TEST

struct src {
    const char *family;
    const char *value;
    uint64_t n;
};

static void src_cb(hk_metrics_writer *w, void *ud) {
    const struct src *s = ud;
    hk_metrics_family(w, s->family, "counter", "A test source's counter.\nSecond line.");
    hk_metrics_sample(w, s->family, "kind", s->value, s->n);
    hk_metrics_sample(w, "not_declared_total", NULL, NULL, 1); /* dropped */
    hk_metrics_sample(w, s->family, "bad-label", "x", 1);      /* dropped */
    hk_metrics_family(w, "bad name", "counter", NULL);         /* ignored */
    hk_metrics_family(w, "other_total", "summary", NULL);      /* not a type sources use */
}

START_TEST(sources_attach_and_are_escaped) {
    struct src a = {"test_things_total", "quote\" back\\slash\nnewline", 3};
    struct src b = {"test_things_total", "plain", 4};
    hk_metrics_source *sa, *sb, *bad = NULL;
    ck_assert_int_eq(hk_metrics_attach(rt, src_cb, &a, "src", "a", &sa), 0);
    ck_assert_int_eq(hk_metrics_attach(rt, src_cb, &b, "src", "b\"", &sb), 0);
    ck_assert_int_eq(hk_metrics_attach(rt, src_cb, &b, "0src", "x", &bad), HK_ERR_INVALID);
    ck_assert_int_eq(hk_metrics_attach(rt, src_cb, &b, "__src", "x", &bad), HK_ERR_INVALID);
    ck_assert_ptr_null(bad);
    char *text = metrics();
    assert_valid(text);
    ck_assert_msg(strstr(text, "\ntest_things_total{src=\"a\",kind=\"quote\\\" back\\\\slash\\n"
                               "newline\"} 3\n"),
                  "%s", text);
    ck_assert_msg(strstr(text, "\ntest_things_total{src=\"b\\\"\",kind=\"plain\"} 4\n"), "%s",
                  text);
    ck_assert_ptr_nonnull(
        strstr(text, "# HELP test_things_total A test source's counter.\\nSecond"));
    ck_assert_ptr_null(strstr(text, "not_declared"));
    ck_assert_ptr_null(strstr(text, "bad"));
    ck_assert_ptr_null(strstr(text, "other_total"));
    free(text);
    hk_metrics_detach(sa);
    text = metrics();
    ck_assert_ptr_null(strstr(text, "src=\"a\""));
    ck_assert_ptr_nonnull(strstr(text, "src=\"b\\\"\""));
    free(text);
    hk_metrics_detach(sb);
    hk_metrics_detach(NULL);
}
END_TEST

/* The validator used above refuses what it should. */
START_TEST(validator_refuses_bad_text) {
    static const char *const bad[] = {
        "# TYPE a_total counter\na_total 0.042000000000000003\n",
        "# TYPE a_total counter\na_total 1.50\n",
        "# TYPE a counter\na 1\n",
        "# TYPE a_total counter\n# TYPE a_total counter\na_total 1\n",
        "b_total 1\n",
        "# TYPE a gauge\n# TYPE b gauge\na 1\nb 1\na 2\n",
        "# TYPE a gauge\na{x=\"\\t\"} 1\n",
        "# TYPE a gauge\na{x=\"open} 1\n",
        "# TYPE a gauge\na{x=\"1\",x=\"2\"} 1\n",
        "# TYPE a gauge\na 1",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n",
        "# TYPE a gauge\na 1\n# HELP a late\n",
        "# TYPE a gauge\na NaN\n",
    };
    char line[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(check_exposition(bad[i], line, sizeof line), "accepted: %s", bad[i]);
    ck_assert_ptr_null(check_exposition("# HELP a x\n# TYPE a gauge\na{x=\"\\\"\\\\\\n\"} 1.5\n"
                                        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\n"
                                        "h_bucket{le=\"+Inf\"} 2\nh_sum 0.25\nh_count 2\n",
                                        line, sizeof line));
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

int main(void) {
    Suite *s = suite_create("logs and metrics");
    TCase *tc = tcase_create("obs");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, engine_events_reach_the_callback);
    tcase_add_test(tc, threads_are_named);
    tcase_add_test(tc, options_log_hears_create);
    tcase_add_test(tc, event_queue_on_the_programs_thread);
    tcase_add_test(tc, callback_cannot_reenter);
    tcase_add_test(tc, hotkern_log_env_filters);
    tcase_add_test(tc, watcher_says_why_it_skips);
    tcase_add_test(tc, watcher_trace_debounce_and_headers);
    tcase_add_test(tc, endpoint_says_why_it_refuses);
    tcase_add_test(tc, endpoint_metrics_are_the_runtimes);
    tcase_add_test(tc, endpoint_status_shows_the_quarantine);
    tcase_add_test(tc, puller_says_when_it_retries);
    tcase_add_test(tc, puller_says_why_it_refuses);
    tcase_add_test(tc, puller_url_cannot_break_metrics);
    tcase_add_test(tc, metrics_text_is_exposition);
    tcase_add_test(tc, histogram_buckets_are_fixed);
    tcase_add_test(tc, sources_attach_and_are_escaped);
    tcase_add_test(tc, validator_refuses_bad_text);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

/*
 * A fleet rolled out by its gate: Debian's nginx as the static origin, 100
 * puller hosts (processes forked by the test, each a runtime on the fake
 * driver with a canary whose helper binds the loadable fake, its own host
 * id and labels, serving its /metrics), a real Prometheus started by the
 * test scraping every host each second (static_configs listing each
 * host's metrics port), and `hotkern rollout watch` driving the steps from
 * Prometheus's HTTP API, as an operator would run it.
 *
 *   Release 2 goes 1% (and host-042) -> 10% -> 50% -> 100% under watch
 *   with 1 s bakes: watch advances by itself and ends with exit 0; every
 *   host ends on it, and at every scrape of every host no host runs it
 *   outside the step the origin's manifest then says, and no host that
 *   ran it ever leaves it.
 *   Release 3 is refused by the canary of three hosts of the 10% step
 *   (labelled driver=r535, their fake driver faulting that release's
 *   kernel): a real refusal, counted in their metrics; watch aborts by
 *   itself (exit 1), no host outside the first two steps ever runs it, and
 *   every host that ran it is back on release 2.
 *   Release 4: Prometheus is stopped at its second step; watch pauses (the
 *   manifest says paused), Prometheus is started again (same port, same
 *   data), watch resumes and ends the rollout with exit 0.
 *   Release 5: the one host of its first step has a launch the driver
 *   refuses (hotkern_launch_errors_total): watch aborts, naming the host.
 *
 * Between the phases, with nothing changing, the origin's requests per host
 * per poll are counted from nginx's access log and the hosts' own poll
 * counters. What each host runs is read from its own metrics; the figures
 * (each step's time from watch's advance to every host of it on the
 * release, the abort's time after the refusal was scraped, the fleet's time
 * back) are printed, never asserted; waits end at deadlines (failures).
 *
 * $HK_FLEET_HOSTS=1000 (with $HK_FLEET_PER_PROCESS, $HK_FLEET_POLL_MS and
 * $HK_FLEET_SCRAPE_S, below) runs the same with more hosts, for
 * bench/RESULTS.md; `make test` runs the 100.
 *
 * Skipped (SKIP line) where nginx or Prometheus is not installed.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <sodium.h>
#include <sys/socket.h>

#include "hotkern/net.h"
#include "loader/port.h"
#include "net/net.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

#define MAX_HOSTS 1000
#define MODULE    "fleet"
#define FAULTY    3
#define LABEL     "driver=r535"
#define DEADLINE  60000 /* ms for a phase: a failure past it */

/* The fleet's shape: $HK_FLEET_HOSTS hosts (default 100, at most 1000),
 * $HK_FLEET_PER_PROCESS of them per process (default 1 up to 100 hosts,
 * else 100: each a runtime and puller of its own, their threads side by
 * side), polling every $HK_FLEET_POLL_MS (default 200; 1000 past 100
 * hosts). Past 100 hosts only the hosts of the first two steps run a
 * canary (the others never meet the refused release). */
static int nhosts = 100, per_proc = 1, poll_ms = 200;

static char *tmp;
static char www[PATH_MAX], url[256], key_path[PATH_MAX + 16], pub_path[PATH_MAX + 16];
static char fake_lib[PATH_MAX + 32], prom_url[64], faulty_helper[PATH_MAX + 32];
static hkt_prometheus prom;

struct host {
    char id[24];
    int faulty; /* labelled LABEL; its canary's fake driver faults release 3's kernel */
    uint32_t bucket;
    pid_t pid; /* its process (shared by per_proc hosts) */
    unsigned port;
    CURL *c;
    hkt_body b;
    long long release, refused, polls; /* the last scrape's; -1: none */
    unsigned seen;                     /* bit r: seen running release r */
};
static struct host hosts[MAX_HOSTS];

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* In the first two steps of every rollout here (1% and host-042, 10%). */
static int early(int i) {
    return hosts[i].bucket < 1000 || i == 42;
}

/* ---- the hosts (child processes) ---------------------------------------- */

static void die(const char *what, const hk_report *rep) {
    fprintf(stderr, "cpu_fleet_gate host: %s: %s\n", what, rep ? rep->message : "");
    _exit(1);
}

/* Declares a test launch of kernel step once the first release is in, so
 * that every later release runs in the canary before it commits. */
static void declare_test(hk_runtime *rt) {
    hk_kernel *k = NULL;
    hk_test *t;
    hk_report rep = HK_REPORT_INIT;
    unsigned n = 4;
    for (int i = 0; i < 3000 && hk_kernel_get(rt, MODULE, "step", &k) != 0; i++)
        usleep(20000);
    if (!k)
        die("no release 1 within 60 s", NULL);
    if (hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){32, 1, 1}, 0) ||
        hk_test_buffer(t, 16, HK_FILL_RANDOM, 7, NULL) || hk_test_scalar(t, &n, sizeof n) ||
        hk_test_compare(t, HK_COMPARE_NONE, 0, 0) || hk_kernel_add_test(k, t, &rep))
        die("canary test", &rep);
    hk_test_destroy(t);
}

/* Host i in this process: a runtime on the fake driver, its canary's
 * helper binding the loadable fake (through a script that sets
 * HKFAKE_FAULT on the faulty hosts: release 3's kernel, tag 203, faults
 * there with a sticky error), and its puller serving /metrics. */
static hk_runtime *host_start(int i, hk_puller **p) {
    struct host *h = &hosts[i];
    char st[PATH_MAX + 64];
    hk_report rep = HK_REPORT_INIT;
    snprintf(st, sizeof st, "%s/hosts/%s/state", tmp, h->id);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fakes read PTX */
    o.cache_dir = "";
    o.no_warm_start = 1;
    o.canary = nhosts <= 100 || early(i);
    o.canary_helper = h->faulty ? faulty_helper : hkt_built_program("hotkern-canary");
    o.canary_timeout_ms = 10000;
    hk_runtime *rt;
    if (hkl_runtime_create_with(&rt, &o, fake_driver(), &rep))
        die("runtime", &rep);
    const char *keys[] = {pub_path};
    hk_pull_options po;
    hk_pull_options_init(&po);
    po.url = url;
    po.interval_ms = (unsigned)poll_ms;
    po.trusted_keys = keys;
    po.ntrusted_keys = 1;
    po.state_dir = st;
    po.metrics_address = "127.0.0.1";
    po.host_id = h->id;
    po.host_labels = h->faulty ? LABEL ",rack-1" : "rack-1";
    if (hk_pull_start(rt, &po, p, &rep))
        die("puller", &rep);
    return rt;
}

/* Runs hosts first..first+n-1 until SIGTERM. */
static void process_main(int first, int n) {
    hk_runtime *rts[MAX_HOSTS];
    hk_puller *ps[MAX_HOSTS];
    hk_report rep = HK_REPORT_INIT;
    sigset_t set;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    setenv("HK_LIBCUDA", fake_lib, 1);
    fake_init(1, 90);
    for (int k = 0; k < n; k++)
        rts[k] = host_start(first + k, &ps[k]);
    for (int k = 0; k < n; k++) {
        char portf[PATH_MAX + 64], text[32];
        if (nhosts <= 100 || early(first + k))
            declare_test(rts[k]);
        snprintf(portf, sizeof portf, "%s/hosts/%s/port", tmp, hosts[first + k].id);
        snprintf(text, sizeof text, "%u\n", hk_pull_metrics_port(ps[k]));
        if (hku_write_atomic(portf, text, strlen(text), 0644, &rep))
            die("port file", &rep);
    }
    /* SIGUSR1: one launch of step on host-042 that the driver refuses (a
     * launch error, hotkern_launch_errors_total); SIGTERM: the end. */
    for (int sig = 0; sigwait(&set, &sig) == 0 && sig != SIGTERM;) {
        hk_kernel *k;
        int out = 0, *dptr = &out, cu = 0;
        unsigned one = 1;
        void *args[] = {&dptr, &one};
        if (42 >= first && 42 < first + n &&
            hk_kernel_get(rts[42 - first], MODULE, "step", &k) == 0) {
            fake_fail("cuLaunchKernel", 1, CUDA_ERROR_INVALID_VALUE);
            hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu);
        }
    }
    for (int k = 0; k < n; k++) {
        hk_pull_stop(ps[k]);
        hk_runtime_destroy(rts[k]);
    }
    _exit(0);
}

/* Starts every host and reads their ports (60 s at most). */
static void start_hosts(void) {
    for (int first = 0; first < nhosts; first += per_proc) {
        int n = first + per_proc <= nhosts ? per_proc : nhosts - first;
        fflush(NULL);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0)
            process_main(first, n);
        for (int k = 0; k < n; k++)
            hosts[first + k].pid = pid;
    }
    double end = now_ms() + 60000;
    for (int i = 0; i < nhosts; i++) {
        char portf[8192 + 64], buf[32] = "";
        snprintf(portf, sizeof portf, "%.4000s/hosts/%.23s/port", tmp, hosts[i].id);
        while (!hosts[i].port) {
            FILE *f = fopen(portf, "r");
            if (f) {
                if (fgets(buf, sizeof buf, f))
                    hosts[i].port = (unsigned)atoi(buf);
                fclose(f);
            }
            int st;
            ck_assert_msg(waitpid(hosts[i].pid, &st, WNOHANG) == 0, "%s exited (status %d)",
                          hosts[i].id, st);
            ck_assert_msg(now_ms() < end, "%s did not start", hosts[i].id);
            if (!hosts[i].port)
                usleep(20000);
        }
    }
}

static void stop_hosts(void) {
    for (int i = 0; i < nhosts; i++) {
        int st = 0;
        if (hosts[i].c)
            curl_easy_cleanup(hosts[i].c);
        if (i % per_proc)
            continue; /* one process for per_proc hosts */
        kill(hosts[i].pid, SIGTERM);
        ck_assert_int_eq(waitpid(hosts[i].pid, &st, 0), hosts[i].pid);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s's process ended with status %d",
                      hosts[i].id, st);
    }
}

/* ---- scraping the hosts ------------------------------------------------- */

/* Scrapes every host at once (libcurl's multi interface) into its
 * fields; asserts that each answered. */
static void scrape_all(void) {
    static CURLM *multi;
    if (!multi)
        multi = curl_multi_init();
    for (int i = 0; i < nhosts; i++) {
        struct host *h = &hosts[i];
        char u[64];
        if (!h->c)
            h->c = curl_easy_init();
        h->b.len = 0;
        snprintf(u, sizeof u, "http://127.0.0.1:%u/metrics", h->port);
        curl_easy_setopt(h->c, CURLOPT_URL, u);
        curl_easy_setopt(h->c, CURLOPT_WRITEFUNCTION, hkt_body_write);
        curl_easy_setopt(h->c, CURLOPT_WRITEDATA, &h->b);
        curl_easy_setopt(h->c, CURLOPT_TIMEOUT_MS, 10000L);
        curl_multi_add_handle(multi, h->c);
    }
    for (int running = 1; running;) {
        ck_assert_int_eq(curl_multi_perform(multi, &running), CURLM_OK);
        if (running)
            curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(multi, &left)))
        for (int i = 0; msg->msg == CURLMSG_DONE && i < nhosts; i++)
            if (hosts[i].c == msg->easy_handle)
                ck_assert_msg(msg->data.result == CURLE_OK, "%s did not answer its scrape: %s",
                              hosts[i].id, curl_easy_strerror(msg->data.result));
    for (int i = 0; i < nhosts; i++) {
        struct host *h = &hosts[i];
        long status = 0;
        curl_multi_remove_handle(multi, h->c);
        curl_easy_getinfo(h->c, CURLINFO_RESPONSE_CODE, &status);
        ck_assert_msg(status == 200 && h->b.len, "%s answered %ld", h->id, status);
        h->release = hkt_sample(h->b.data, "hotkern_rollout_release", "module=\"" MODULE "\"");
        h->refused = hkt_sample(h->b.data, "hotkern_rollout_refusals_total", "reason=\"fault\"");
        h->polls = hkt_sample(h->b.data, "hotkern_pull_polls_total", "");
        ck_assert_int_eq(hkt_sample(h->b.data, "hotkern_rollout_bucket", "module=\"" MODULE "\""),
                         h->bucket);
        if (h->release >= 0 && h->release < 32)
            h->seen |= 1u << h->release;
    }
}

/* ---- the origin and the CLI --------------------------------------------- */

/* The origin's manifest, parsed (m is the caller's to hkn_manifest_free). */
static void manifest(hkn_manifest *m) {
    char path[PATH_MAX + 32], *text;
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    snprintf(path, sizeof path, "%s/fleet/manifest.json", www);
    ck_assert_int_eq(hku_read_file(path, 1 << 20, &text, &len, &rep), 0);
    ck_assert_msg(hkn_manifest_parse(text, len, m, &rep) == 0, "%s", rep.message);
    free(text);
    hk_report_clear(&rep);
}

/* 1 when manifest m takes host i now. */
static int covered(const hkn_manifest *m, int i) {
    const char *labels[] = {LABEL, "rack-1"};
    return hkn_rollout_covers(&m->rollout, hosts[i].bucket, hosts[i].id,
                              hosts[i].faulty ? labels : labels + 1, hosts[i].faulty ? 2 : 1);
}

/* Runs the CLI in tmp: its exit status, its output in out. */
static int cli_out(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int cli_out(char *out, size_t cap, const char *fmt, ...) {
    char args[4096], cmd[2 * PATH_MAX + 4096 + 64], log[PATH_MAX + 16];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(log, sizeof log, "%s/cli.txt", tmp);
    snprintf(cmd, sizeof cmd, "cd '%s' && %s > '%s' 2>&1", tmp, args, log);
    int st = system(cmd);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = '\0';
    if (f)
        fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* status --prometheus --json's "fleet" object (the caller deletes the
 * document *doc), with exit status 0. */
static cJSON *fleet_status(cJSON **doc, const char *gate) {
    static char out[1 << 20];
    int rc =
        cli_out(out, sizeof out, "'%s' rollout status --dir www/fleet --json --prometheus %s %s",
                hkt_built_program("hotkern"), prom_url, gate);
    ck_assert_msg(rc == 0, "status: exit %d: %.2000s", rc, out);
    *doc = cJSON_Parse(out);
    cJSON *f = cJSON_GetObjectItemCaseSensitive(*doc, "fleet");
    ck_assert_msg(cJSON_IsObject(f), "%.2000s", out);
    return f;
}

static cJSON *field(const cJSON *o, const char *name) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    ck_assert_msg(v != NULL, "no %s", name);
    return v;
}

/* Starts `hotkern rollout watch` on the origin, its output in log. */
static pid_t watch_start(const char *log) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", tmp, log);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || chdir(tmp) != 0)
            _exit(127);
        dup2(fd, 1);
        dup2(fd, 2);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(hkt_built_program("hotkern"), "hotkern", "rollout", "watch", "--dir", "www/fleet",
              "--key", "hotkern.key", "--prometheus", prom_url, "--interval", "1", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* The watch log's text (malloc'd). */
static char *watch_log(const char *log) {
    char path[PATH_MAX + 32], *text = NULL;
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    snprintf(path, sizeof path, "%s/%s", tmp, log);
    ck_assert_int_eq(hku_read_file(path, 1 << 20, &text, &len, &rep), 0);
    return text;
}

/* The wall-clock times (ms) of the log's lines of `decision`, in order. */
static int decisions(const char *text, const char *decision, double *at, int max) {
    int n = 0;
    char key[32];
    snprintf(key, sizeof key, "  %-8s ", decision);
    for (const char *l = text; l && *l && n < max; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
        const char *eol = strchr(l, '\n');
        const char *k = strstr(l, key);
        struct tm tm;
        memset(&tm, 0, sizeof tm);
        int ms = 0;
        if (!k || (eol && k > eol))
            continue;
        if (sscanf(l, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                   &tm.tm_min, &tm.tm_sec, &ms) != 7)
            continue;
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        at[n++] = (double)timegm(&tm) * 1e3 + ms;
    }
    return n;
}

/* Prints the log's lines of `decision`, for the record. */
static void print_decisions(const char *text, const char *decision) {
    char key[32];
    snprintf(key, sizeof key, "  %-8s ", decision);
    for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
        const char *eol = strchr(l, '\n'), *k = strstr(l, key);
        if (k && (!eol || k < eol))
            printf("cpu_fleet_gate: watch: %.*s\n", (int)(eol ? eol - l : (long)strlen(l)), l);
    }
}

/* Waits for the watch to end; its exit status. */
static int watch_wait(pid_t pid, double deadline) {
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (now_ms() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            ck_abort_msg("watch did not end in time");
        }
        usleep(50000);
    }
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void kernel_file(int tag) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/fleet.ptx", tmp);
    ck_assert_int_eq(hkt_write_file(path, fake_ptx(tag, 0, 0, 0)), 0);
}

/* Lines of nginx's access log. */
static long origin_requests(void) {
    char path[PATH_MAX + 32], line[4096];
    snprintf(path, sizeof path, "%s/access.log", tmp);
    FILE *f = fopen(path, "r");
    long n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strchr(line, '\n') != NULL;
    if (f)
        fclose(f);
    return n;
}

static long long polls(void) {
    long long n = 0;
    scrape_all();
    for (int i = 0; i < nhosts; i++)
        n += hosts[i].polls;
    return n;
}

/* A check on the watch's log, which is printed when it fails (too long
 * for Check's message). */
#define LOG_ASSERT(cond, log)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("---- the watch's log:\n%s----\n", log);                                        \
            ck_abort_msg("%s (the watch's log above)", #cond);                                     \
        }                                                                                          \
    } while (0)

/* ---- a phase ------------------------------------------------------------ */

/* What a phase watched, round after round. */
struct phase {
    long long release, other; /* every host runs one of the two */
    int steps_seen;           /* the last manifest step seen (index), -1: none */
    double settled_at[8];     /* wall ms: every host of step s first on release */
    int aborted;              /* the manifest said aborted */
    double aborted_at, back_at, refusal_scraped_at; /* wall ms; 0: not yet */
};

/* One round: every host scraped, then the manifest read; checks that no
 * host runs `release` outside the manifest's step, and that none that ran
 * it left it (before an abort). */
static void round_of(struct phase *ph, hkn_manifest *m) {
    for (int i = 0; i < nhosts; i += per_proc) {
        int st;
        ck_assert_msg(waitpid(hosts[i].pid, &st, WNOHANG) == 0, "%s's process exited", hosts[i].id);
    }
    scrape_all();
    manifest(m); /* read after the scrapes: at least as new as what each host saw */
    const hkn_rollout *r = &m->rollout;
    int all_on = 1, back = 1;
    for (int i = 0; i < nhosts; i++) {
        struct host *h = &hosts[i];
        ck_assert_msg(h->release == ph->release || h->release == ph->other,
                      "%s runs release %lld (neither %lld nor %lld)", h->id, h->release,
                      ph->release, ph->other);
        if (r->present && r->release == (uint64_t)ph->release) {
            ck_assert_msg(h->release != ph->release || covered(m, i),
                          "%s (bucket %u) runs release %lld outside step %u", h->id, h->bucket,
                          ph->release, r->step + 1);
            ck_assert_msg(r->aborted || !(h->seen & (1u << ph->release)) ||
                              h->release == ph->release,
                          "%s (bucket %u) ran release %lld and left it for %lld", h->id, h->bucket,
                          ph->release, h->release);
        }
        all_on &= !covered(m, i) || h->release == ph->release;
        back &= h->release == ph->other;
    }
    if (r->aborted && !ph->aborted) {
        ph->aborted = 1;
        ph->aborted_at = wall_ms();
    }
    if (ph->aborted && back && !ph->back_at)
        ph->back_at = wall_ms();
    if (!r->aborted && all_on && (int)r->step > ph->steps_seen && r->step < 8) {
        for (int s = ph->steps_seen + 1; s <= (int)r->step; s++)
            ph->settled_at[s] = wall_ms();
        ph->steps_seen = (int)r->step;
    }
}

/* Prints each step's time from watch's advance (or start) to every host of
 * it on the release. */
static void print_steps(const char *what, const struct phase *ph, const char *log, double start) {
    double adv[8];
    char *text = watch_log(log);
    int n = decisions(text, "advance", adv, 8);
    free(text);
    for (int s = 0; s <= ph->steps_seen && s < 8; s++) {
        double from = s == 0 ? start : s - 1 < n ? adv[s - 1] : 0;
        printf("cpu_fleet_gate: %s step %d: every host of it on release %lld %.0f ms after %s\n",
               what, s + 1, ph->release, ph->settled_at[s] - from,
               s == 0 ? "rollout start" : "watch's advance");
    }
}

START_TEST(rollout_under_watch) {
    double t_start = now_ms();
    setvbuf(stdout, NULL, _IOLBF, 0); /* the figures come out even when a check fails */
    pid_t nginx;
    hkn_seckey key;
    hk_report rep = HK_REPORT_INIT;
    hkn_manifest m;
    const char *env = getenv("HK_FLEET_HOSTS");
    nhosts = env ? atoi(env) : 100;
    ck_assert_msg(nhosts >= 100 && nhosts <= MAX_HOSTS, "HK_FLEET_HOSTS: 100 to %d", MAX_HOSTS);
    per_proc = (env = getenv("HK_FLEET_PER_PROCESS")) ? atoi(env) : nhosts > 100 ? 100 : 1;
    poll_ms = (env = getenv("HK_FLEET_POLL_MS")) ? atoi(env) : nhosts > 100 ? 1000 : 200;
    int scrape_s = (env = getenv("HK_FLEET_SCRAPE_S")) ? atoi(env) : 1;
    ck_assert(per_proc >= 1 && per_proc <= nhosts && poll_ms >= 50 && scrape_s >= 1);
    printf("cpu_fleet_gate: %d hosts, %d per process, polling every %d ms, scraped every %d s\n",
           nhosts, per_proc, poll_ms, scrape_s);
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    char bin[PATH_MAX]; /* BUILD/bin/hotkern -> BUILD/lib/libhotkern-fakecuda.so */
    snprintf(bin, sizeof bin, "%s", hkt_built_program("hotkern"));
    snprintf(fake_lib, sizeof fake_lib, "%s/lib/libhotkern-fakecuda.so", dirname(dirname(bin)));
    /* The faulty hosts' canary helper: the real one, with the loadable
     * fake told to fault release 3's kernel. */
    char script[2 * PATH_MAX];
    snprintf(faulty_helper, sizeof faulty_helper, "%s/canary-faulty.sh", tmp);
    snprintf(script, sizeof script,
             "#!/bin/sh\nHKFAKE_FAULT=step@203=CUDA_ERROR_ILLEGAL_ADDRESS exec '%s' \"$@\"\n",
             hkt_built_program("hotkern-canary"));
    ck_assert_int_eq(hkt_write_file(faulty_helper, script), 0);
    ck_assert_int_eq(chmod(faulty_helper, 0755), 0);
    /* A descriptor per host's scrape, and nginx's and Prometheus's. */
    struct rlimit nofile;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &nofile), 0);
    nofile.rlim_cur = nofile.rlim_max;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &nofile), 0);
    snprintf(www, sizeof www, "%s/www", tmp);
    snprintf(key_path, sizeof key_path, "%s/hotkern.key", tmp);
    snprintf(pub_path, sizeof pub_path, "%s/hotkern.pub", tmp);
    char dir[8192 + 64];
    snprintf(dir, sizeof dir, "%s/hosts", tmp);
    ck_assert_int_eq(mkdir(www, 0755), 0);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(hkn_keygen(&key), 0);
    ck_assert_int_eq(hkn_seckey_save(key_path, &key, &rep), 0);
    ck_assert_int_eq(hkn_pubkey_save(pub_path, &key.pub, &rep), 0);
    int port = hkt_nginx_start(www, tmp, NULL, &nginx);
    if (port < 0) {
        hkt_rmtree(tmp);
        return; /* SKIP printed */
    }
    snprintf(url, sizeof url, "http://127.0.0.1:%d/fleet/manifest.json", port);
    kernel_file(101);
    hkt_run_cli(tmp,
                "sign --key hotkern.key --module " MODULE " --release 1 --out www/fleet fleet.ptx");

    /* The faulty hosts: the first three of the 10% step that are not in
     * the 1% one (buckets 100 to 999). */
    int faulty = 0;
    for (int i = 0; i < nhosts; i++) {
        struct host *h = &hosts[i];
        snprintf(h->id, sizeof h->id, "host-%03d", i);
        h->bucket = hkn_fleet_bucket(h->id, MODULE);
        h->faulty = faulty < FAULTY && i != 42 && h->bucket >= 100 && h->bucket < 1000;
        faulty += h->faulty;
        snprintf(dir, sizeof dir, "%.4000s/hosts/%.23s", tmp, h->id);
        ck_assert_int_eq(mkdir(dir, 0700), 0);
    }
    ck_assert_int_eq(faulty, FAULTY);
    start_hosts();
    double t_up = now_ms();

    /* Prometheus scrapes every host's /metrics each second. */
    size_t cap = 256 + nhosts * 32;
    char *sc = malloc(cap);
    ck_assert_ptr_nonnull(sc);
    snprintf(sc, cap,
             "  - job_name: hotkern\n    scrape_interval: %ds\n    scrape_timeout: %ds\n"
             "    static_configs:\n      - targets:\n",
             scrape_s, scrape_s);
    for (int i = 0; i < nhosts; i++)
        snprintf(sc + strlen(sc), cap - strlen(sc), "          - '127.0.0.1:%u'\n", hosts[i].port);
    int ps = hkt_prometheus_start(&prom, tmp, sc);
    free(sc);
    ck_assert_msg(ps >= 0, "prometheus did not start (see %s/prometheus.log)", tmp);
    if (ps == 0) {
        stop_hosts();
        hkt_nginx_stop(nginx);
        hkt_rmtree(tmp);
        return; /* SKIP printed */
    }
    snprintf(prom_url, sizeof prom_url, "http://127.0.0.1:%d", prom.port);
    double end = now_ms() + 30000;
    while (hkt_prometheus_count(&prom, "hotkern_rollout_release{module=\"" MODULE "\"} == 1") <
           nhosts) {
        ck_assert_msg(now_ms() < end, "Prometheus has not scraped every host on release 1");
        usleep(200000);
    }
    double t_prom = now_ms();
    printf("cpu_fleet_gate: %d hosts up on release 1 in %.0f ms, Prometheus scraping them all "
           "%.0f ms later\n",
           nhosts, t_up - t_start, t_prom - t_up);

    char steps[PATH_MAX + 32];
    snprintf(steps, sizeof steps, "%s/steps.json", tmp);
    ck_assert_int_eq(hkt_write_file(steps, "[{\"percent\": 1, \"hosts\": [\"host-042\"], "
                                           "\"bake_s\": 1}, {\"percent\": 10, \"bake_s\": 2}, "
                                           "{\"percent\": 50, \"bake_s\": 1}, "
                                           "{\"percent\": 100, \"bake_s\": 1}]"),
                     0);

    /* ---- release 2, a good one, all the way ---- */
    kernel_file(102);
    double a0 = wall_ms();
    hkt_run_cli(tmp, "rollout start --dir www/fleet --key hotkern.key --module " MODULE
                     " --steps-file steps.json fleet.ptx");
    pid_t w = watch_start("watch-2.txt");
    struct phase a = {.release = 2, .other = 1, .steps_seen = -1};
    int st = 0;
    for (end = now_ms() + DEADLINE; waitpid(w, &st, WNOHANG) == 0;) {
        ck_assert_msg(now_ms() < end, "release 2: watch did not end within %d ms", DEADLINE);
        round_of(&a, &m);
        hkn_manifest_free(&m);
        usleep(50000);
    }
    char *log = watch_log("watch-2.txt");
    LOG_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0, log);
    round_of(&a, &m);
    LOG_ASSERT(m.rollout.step == 3 && !m.rollout.aborted && !m.rollout.paused, log);
    hkn_manifest_free(&m);
    for (int i = 0; i < nhosts; i++)
        ck_assert_msg(hosts[i].release == 2, "%s ended on %lld", hosts[i].id, hosts[i].release);
    double adv[8];
    LOG_ASSERT(decisions(log, "advance", adv, 8) == 3, log);
    LOG_ASSERT(decisions(log, "done", adv, 8) == 1, log);
    char all_on[96];
    snprintf(all_on, sizeof all_on, "%d of the %d hosts of steps 1-4 run release 2", nhosts,
             nhosts);
    LOG_ASSERT(strstr(log, all_on), log);
    free(log);
    print_steps("release 2", &a, "watch-2.txt", a0);
    printf("cpu_fleet_gate: release 2: 1%% -> 100%% under watch in %.0f ms\n", wall_ms() - a0);

    /* ---- the origin while nothing changes ---- */
    /* Ten polls of each host at least, so that the scrapes' and the log's
     * edges (a poll in flight at either end) weigh little. */
    int quiet_ms = 10 * poll_ms > 3000 ? 10 * poll_ms : 3000;
    long long p0 = polls();
    long r0 = origin_requests();
    usleep((useconds_t)quiet_ms * 1000);
    long long p1 = polls();
    long r1 = origin_requests();
    ck_assert_int_gt(p1, p0);
    printf("cpu_fleet_gate: nothing changing, %d ms: %ld origin requests for %lld polls of %d "
           "hosts: %.3f requests per host per poll\n",
           quiet_ms, r1 - r0, p1 - p0, nhosts, (double)(r1 - r0) / (double)(p1 - p0));

    /* ---- release 3, refused by the canary of three hosts of step 2 ---- */
    kernel_file(203);
    hkt_run_cli(tmp, "rollout start --dir www/fleet --key hotkern.key --module " MODULE
                     " --release 3 --steps-file steps.json fleet.ptx");
    w = watch_start("watch-3.txt");
    struct phase b = {.release = 3, .other = 2, .steps_seen = -1};
    int code = -1;
    for (end = now_ms() + DEADLINE; !b.back_at;) {
        ck_assert_msg(now_ms() < end, "release 3: not aborted and back within %d ms", DEADLINE);
        if (code < 0 && waitpid(w, &st, WNOHANG) == w) {
            ck_assert(WIFEXITED(st));
            code = WEXITSTATUS(st);
        }
        round_of(&b, &m);
        hkn_manifest_free(&m);
        if (!b.refusal_scraped_at &&
            hkt_prometheus_count(&prom, "hotkern_rollout_last_refused_release{module=\"" MODULE
                                        "\"} == 3") > 0)
            b.refusal_scraped_at = wall_ms();
        usleep(50000);
    }
    if (code < 0)
        code = watch_wait(w, now_ms() + 10000);
    log = watch_log("watch-3.txt");
    LOG_ASSERT(code == 1, log);
    double ab[2];
    LOG_ASSERT(decisions(log, "abort", ab, 2) == 1, log);
    LOG_ASSERT(decisions(log, "advance", adv, 8) == 1, log); /* to step 2, no further */
    LOG_ASSERT(strstr(log, "hotkern_rollout_last_refused_release"), log);
    print_decisions(log, "abort");
    /* status from Prometheus: the refusals per step, with why. */
    cJSON *doc, *fl = fleet_status(&doc, "");
    cJSON *step2 = cJSON_GetArrayItem(field(fl, "steps"), 1), *one;
    ck_assert_int_eq(cJSON_GetArraySize(field(step2, "refused")), FAULTY);
    cJSON_ArrayForEach(one, field(step2, "refused")) {
        ck_assert_str_eq(field(one, "reason")->valuestring, "fault");
        ck_assert_int_eq(field(one, "release")->valueint, 2);
    }
    ck_assert_int_eq(field(fl, "known_hosts")->valueint, nhosts);
    cJSON_Delete(doc);
    for (int i = 0; i < nhosts; i++) {
        struct host *h = &hosts[i];
        ck_assert_msg(early(i) || !(h->seen & 8u),
                      "%s (bucket %u) outside the first two steps ran "
                      "release 3",
                      h->id, h->bucket);
        ck_assert_msg(!h->faulty || !(h->seen & 8u), "%s ran the release it refused", h->id);
        ck_assert_msg(!h->faulty || h->refused == 1, "%s counted %lld refusals (fault)", h->id,
                      h->refused);
        ck_assert_msg(h->release == 2, "%s is on %lld after the abort", h->id, h->release);
    }
    int took = 0;
    for (int i = 0; i < nhosts; i++)
        took += !!(hosts[i].seen & 8u);
    ck_assert_int_gt(took, 0);
    printf("cpu_fleet_gate: release 3: refused by %d hosts (fault); %s; watch aborted %.0f ms "
           "after Prometheus first held the refusal (gate interval 1000 ms); all %d hosts back "
           "on release 2 (%d had run release 3) %.0f ms after the abort\n",
           FAULTY, b.refusal_scraped_at ? "scraped" : "never seen scraped by the test",
           b.refusal_scraped_at ? ab[0] - b.refusal_scraped_at : 0, nhosts, took,
           b.back_at - ab[0]);
    free(log);

    /* ---- release 4: Prometheus stopped at step 2, then back ---- */
    kernel_file(104);
    double c0 = wall_ms();
    hkt_run_cli(tmp, "rollout start --dir www/fleet --key hotkern.key --module " MODULE
                     " --release 4 --steps-file steps.json fleet.ptx");
    w = watch_start("watch-4.txt");
    struct phase c = {.release = 4, .other = 2, .steps_seen = -1};
    double stopped = 0, paused = 0, restarted = 0, resumed = 0;
    for (end = now_ms() + DEADLINE; waitpid(w, &st, WNOHANG) == 0;) {
        ck_assert_msg(now_ms() < end, "release 4: watch did not end within %d ms", DEADLINE);
        round_of(&c, &m);
        if (!stopped && m.rollout.step == 1) {
            hkt_prometheus_stop(&prom);
            stopped = wall_ms();
        } else if (stopped && !paused && m.rollout.paused) {
            paused = wall_ms();
            usleep(1500000); /* watch sees Prometheus gone for a while */
            ck_assert_int_eq(hkt_prometheus_restart(&prom), 1);
            restarted = wall_ms();
        } else if (paused && !resumed && !m.rollout.paused) {
            resumed = wall_ms();
        }
        hkn_manifest_free(&m);
        usleep(50000);
    }
    ck_assert(WIFEXITED(st));
    log = watch_log("watch-4.txt");
    LOG_ASSERT(WEXITSTATUS(st) == 0, log);
    LOG_ASSERT(stopped && paused && resumed, log);
    /* Paused once Prometheus was gone; each pause resumed. */
    double pauses[8], resumes[8];
    int npause = decisions(log, "pause", pauses, 8);
    LOG_ASSERT(npause >= 1 && decisions(log, "resume", resumes, 8) == npause, log);
    LOG_ASSERT(strstr(log, "gave no data"), log);
    LOG_ASSERT(decisions(log, "done", ab, 2) == 1, log);
    print_decisions(log, "pause");
    print_decisions(log, "resume");
    round_of(&c, &m);
    /* status from Prometheus at the end: every host of every step on release
     * 4; a query of the program's own fails the gate on any sample above 0;
     * one Prometheus refuses is a usage error. */
    int total = 0, lasting = 0;
    for (end = now_ms() + 10000; lasting < nhosts; usleep(200000)) {
        ck_assert_msg(now_ms() < end, "Prometheus never saw all %d hosts on release 4", nhosts);
        fl = fleet_status(&doc, "");
        lasting = field(fl, "on_release")->valueint;
        total = 0;
        cJSON_ArrayForEach(one, field(fl, "steps")) {
            total += field(one, "hosts")->valueint;
            if (lasting == nhosts)
                ck_assert_int_eq(cJSON_GetArraySize(field(one, "on_release")),
                                 field(one, "hosts")->valueint);
        }
        if (lasting == nhosts)
            ck_assert_str_eq(field(field(fl, "gate"), "state")->valuestring, "pass");
        cJSON_Delete(doc);
    }
    ck_assert_int_eq(total, nhosts);
    fl = fleet_status(&doc, "--gate 'vector(1)' --gate "
                            "'hotkern_rollout_release{module=\"$MODULE\"} == $RELEASE'");
    const char *why = field(field(fl, "gate"), "reason")->valuestring;
    ck_assert_str_eq(field(field(fl, "gate"), "state")->valuestring, "fail");
    ck_assert_msg(strstr(why, "'vector(1)' returned 1 sample above 0"), "%s", why);
    snprintf(all_on, sizeof all_on, "{module=\"" MODULE "\"} == 4' returned %d samples", nhosts);
    ck_assert_msg(strstr(why, all_on), "%s", why);
    cJSON_Delete(doc);
    char out[8192];
    ck_assert_int_eq(cli_out(out, sizeof out,
                             "'%s' rollout status --dir www/fleet --prometheus %s "
                             "--gate 'sum(('",
                             hkt_built_program("hotkern"), prom_url),
                     2);
    ck_assert_ptr_nonnull(strstr(out, "Prometheus refuses it"));
    hkn_manifest_free(&m);
    for (int i = 0; i < nhosts; i++)
        ck_assert_msg(hosts[i].release == 4, "%s ended on %lld", hosts[i].id, hosts[i].release);
    free(log);
    printf("cpu_fleet_gate: release 4: Prometheus stopped at step 2, the manifest paused %.0f ms "
           "later; started again, resumed %.0f ms after; all %d hosts on release 4 %.0f ms "
           "after the start\n",
           paused - stopped, resumed - restarted, nhosts, wall_ms() - c0);

    /* ---- release 5: a launch error on the one host that runs it ---- */
    kernel_file(105);
    hkt_run_cli(tmp, "rollout start --dir www/fleet --key hotkern.key --module " MODULE
                     " --release 5 --steps-file steps.json fleet.ptx");
    w = watch_start("watch-5.txt");
    struct phase d = {.release = 5, .other = 4, .steps_seen = -1};
    int signalled = 0;
    for (end = now_ms() + DEADLINE; !d.back_at || waitpid(w, &st, WNOHANG) == 0;) {
        ck_assert_msg(now_ms() < end, "release 5: not aborted and back within %d ms", DEADLINE);
        round_of(&d, &m);
        hkn_manifest_free(&m);
        ck_assert_msg(!(hosts[42].seen & 0x20u) || d.steps_seen <= 0 || d.aborted,
                      "release 5 went past step 1");
        if (!signalled && hosts[42].release == 5) {
            kill(hosts[42].pid, SIGUSR1);
            signalled = 1;
        }
        usleep(50000);
    }
    ck_assert(WIFEXITED(st));
    log = watch_log("watch-5.txt");
    LOG_ASSERT(WEXITSTATUS(st) == 1 && decisions(log, "abort", ab, 2) == 1, log);
    LOG_ASSERT(decisions(log, "advance", adv, 8) == 0, log);
    LOG_ASSERT(strstr(log, "increase(hotkern_launch_errors_total[") &&
                   strstr(log, "returned 1 sample above 0: host-042"),
               log);
    print_decisions(log, "abort");
    free(log);
    for (int i = 0; i < nhosts; i++)
        ck_assert_msg(hosts[i].release == 4, "%s is on %lld after the abort", hosts[i].id,
                      hosts[i].release);

    hkt_prometheus_stop(&prom);
    stop_hosts();
    hkt_nginx_stop(nginx);
    printf("cpu_fleet_gate: the whole run %.0f ms\n", now_ms() - t_start);
    hkt_rmtree(tmp);
    free(tmp);
    hk_report_clear(&rep);
}
END_TEST

/* A closed port: bound, never listening, so that connects are refused. */
static int closed_port(int *fd) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(*fd, 0);
    ck_assert_int_eq(bind(*fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(*fd, (struct sockaddr *)&a, &len), 0);
    return ntohs(a.sin_port);
}

/* Without Prometheus: status --prometheus fails (no data, exit 1), watch
 * pauses the rollout at once and keeps it paused, and a rollout aborted
 * is nothing to watch. */
START_TEST(no_prometheus_no_progress) {
    char out[16384];
    int fd;
    hkn_seckey key;
    hk_report rep = HK_REPORT_INIT;
    hkn_manifest m;
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    snprintf(www, sizeof www, "%s/www", tmp);
    snprintf(key_path, sizeof key_path, "%s/hotkern.key", tmp);
    ck_assert_int_eq(mkdir(www, 0755), 0);
    ck_assert_int_eq(hkn_keygen(&key), 0);
    ck_assert_int_eq(hkn_seckey_save(key_path, &key, &rep), 0);
    snprintf(prom_url, sizeof prom_url, "http://127.0.0.1:%d", closed_port(&fd));
    const char *hk = hkt_built_program("hotkern");
    kernel_file(101);
    hkt_run_cli(tmp,
                "sign --key hotkern.key --module " MODULE " --release 1 --out www/fleet fleet.ptx");
    kernel_file(102);
    hkt_run_cli(tmp, "rollout start --dir www/fleet --key hotkern.key --module " MODULE
                     " --steps 50,100 --bake 1 fleet.ptx");
    ck_assert_int_eq(cli_out(out, sizeof out,
                             "'%s' rollout status --dir www/fleet --json "
                             "--prometheus %s",
                             hk, prom_url),
                     1);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j != NULL, "%s", out);
    ck_assert_str_eq(field(j, "error")->valuestring, "HK_ERR_NETWORK");
    ck_assert_ptr_nonnull(strstr(field(j, "message")->valuestring, "gave no data"));
    cJSON_Delete(j);
    /* Two evaluations, a second apart, then the timeout ends it. */
    int rc = cli_out(out, sizeof out,
                     "timeout 1.5 '%s' rollout watch --dir www/fleet --key "
                     "hotkern.key --prometheus %s --interval 1",
                     hk, prom_url);
    ck_assert_msg(rc == 124, "watch: exit %d: %s", rc, out);
    double at[4];
    ck_assert_msg(decisions(out, "pause", at, 4) == 1 && decisions(out, "paused", at, 4) == 1, "%s",
                  out);
    ck_assert_msg(strstr(out, "Couldn't connect") || strstr(out, "onnection refused"), "%s", out);
    manifest(&m);
    ck_assert(m.rollout.paused && m.rollout.step == 0);
    hkn_manifest_free(&m);
    hkt_run_cli(tmp, "rollout abort --dir www/fleet --key hotkern.key");
    ck_assert_int_eq(cli_out(out, sizeof out,
                             "'%s' rollout watch --dir www/fleet --key "
                             "hotkern.key --prometheus %s --interval 1",
                             hk, prom_url),
                     1);
    ck_assert_msg(strstr(out, "is aborted: nothing to watch"), "%s", out);
    close(fd);
    hkt_rmtree(tmp);
    free(tmp);
    hk_report_clear(&rep);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("fleet_gate");
    TCase *tc = tcase_create("loopback");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, no_prometheus_no_progress);
    tcase_add_test(tc, rollout_under_watch);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = hkt_run(suite());
    curl_global_cleanup();
    return rc;
}

/*
 * A push fleet rolled out in steps: 30 push endpoint hosts (processes
 * forked by the test, each a runtime on the fake driver with a canary whose
 * helper binds the loadable fake, its endpoint on a loopback port trusting
 * the test's key), an endpoints file naming each (id, URL, labels), and
 * `hotkern rollout ... --endpoints` pushing the signed manifests to them,
 * as an operator would run it.
 *
 *   Release 2 goes 1% (and host-000) -> 10% (and the label driver=r535)
 *   -> 50% -> 100% by start and three advances: after each command
 *   exactly the hosts of the steps so far run it (each host asked on its
 *   own GET /v1/status), and status --endpoints says every host of the
 *   step acknowledged it.
 *   Release 3 is refused by the canary of the two driver=r535 hosts (their
 *   fake driver faults that release's kernel, tag 203): under watch, the
 *   refusals of step 2 abort the rollout; no host outside the first two
 *   steps ever runs it, and every host that took it is back on release 2.
 *   Release 4: a host of step 3 is killed at step 2; watch pauses at step
 *   3 (its pushes get no answer: missing data), the host is started again
 *   on its port, watch pushes it the release, resumes and ends at 100%.
 *   Release 5: a real Prometheus (tests/harness.c) scrapes every endpoint's
 *   /metrics; watch runs a --gate query on it, which holds at first and
 *   fails once host-000 has a launch the driver refuses: watch aborts.
 *   A fleet of three more hosts that need 2 of the keys a, b, c
 *   (signature_threshold 2, no canary): a rollout signed with one --key is
 *   refused by every host for its signature; one signed with two is taken
 *   through start, pause, resume, advance and abort, and under watch (two
 *   --key) to its last step; every manifest carries both keys' lines.
 *
 * Each phase asks every host what it runs, round after round (libcurl
 * multi), and checks that none runs the release outside the step the
 * rollout directory's manifest says, and none that ran it leaves it before
 * an abort. The figures (a command's time to every host of its step
 * acknowledging, the refusal to the abort, the abort to every host back)
 * are printed, never asserted; waits end at deadlines (failures). Skipped
 * (SKIP line) for the Prometheus phase where Prometheus is not installed.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <sodium.h>

#include "hotkern/net.h"
#include "loader/port.h"
#include "net/net.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

#define NHOSTS   30
#define MODULE   "fleet"
#define LABEL    "driver=r535"
#define FAULTY   2
#define DEADLINE 60000 /* ms for a phase: a failure past it */

static char *tmp;
static char pub_path[PATH_MAX + 16], fake_lib[PATH_MAX + 32], faulty_helper[PATH_MAX + 32];

struct host {
    char id[24];
    int faulty; /* labelled LABEL; its canary's fake driver faults release 3's kernel */
    uint32_t bucket;
    pid_t pid;
    unsigned port;
    int down; /* killed by the test */
    CURL *c;
    hkt_body b;
    long long release; /* the last answer's running_release_version; -1: none */
    unsigned seen;     /* bit r: seen running release r */
};
static struct host hosts[NHOSTS];
static int nhosts = NHOSTS; /* of them, the test's fleet */
/* The threshold fleet's: its hosts trust a.pub, b.pub and c.pub and need 2
 * of them (signature_threshold), with no canary; `rollout watch` signs with
 * a.key and b.key. */
static int two_of_three;

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

/* ---- the hosts (child processes) ---------------------------------------- */

static void die(const char *what, const hk_report *rep) {
    fprintf(stderr, "cpu_fleet_push host: %s: %s\n", what, rep ? rep->message : "");
    _exit(1);
}

/* Declares a test launch of kernel step once a first release is in, so
 * that every later release runs in the canary before it commits. */
static void declare_test(hk_runtime *rt) {
    hk_kernel *k = NULL;
    hk_test *t;
    hk_report rep = HK_REPORT_INIT;
    unsigned n = 4;
    for (int i = 0; i < 6000 && hk_kernel_get(rt, MODULE, "step", &k) != 0; i++)
        usleep(20000);
    if (!k)
        die("no release within 120 s", NULL);
    if (hk_test_create(&t, (hk_dim3){1, 1, 1}, (hk_dim3){32, 1, 1}, 0) ||
        hk_test_buffer(t, 16, HK_FILL_RANDOM, 7, NULL) || hk_test_scalar(t, &n, sizeof n) ||
        hk_test_compare(t, HK_COMPARE_NONE, 0, 0) || hk_kernel_add_test(k, t, &rep))
        die("canary test", &rep);
    hk_test_destroy(t);
}

/* Host i until SIGTERM: a runtime on the fake driver, its canary's helper
 * binding the loadable fake (the faulty hosts' through a script that sets
 * HKFAKE_FAULT: release 3's kernel faults there), its endpoint on port
 * (0: one is chosen), written to hosts/ID/port. SIGUSR1: one launch of step
 * that the driver refuses (hotkern_launch_errors_total). */
static void host_main(int i, unsigned port) {
    struct host *h = &hosts[i];
    hk_report rep = HK_REPORT_INIT;
    sigset_t set;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    setenv("HK_LIBCUDA", fake_lib, 1);
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fakes read PTX */
    o.cache_dir = "";
    o.no_warm_start = 1;
    o.canary = !two_of_three;
    o.canary_helper = h->faulty ? faulty_helper : hkt_built_program("hotkern-canary");
    o.canary_timeout_ms = 10000;
    hk_runtime *rt;
    if (hkl_runtime_create_with(&rt, &o, fake_driver(), &rep))
        die("runtime", &rep);
    char abc[3][PATH_MAX + 16];
    const char *keys[] = {pub_path, abc[0], abc[1], abc[2]};
    for (int k = 0; k < 3; k++)
        snprintf(abc[k], sizeof abc[k], "%s/%c.pub", tmp, 'a' + k);
    hk_endpoint_options eo;
    hk_endpoint_options_init(&eo);
    eo.port = port;
    eo.trusted_keys = two_of_three ? keys + 1 : keys;
    eo.ntrusted_keys = two_of_three ? 3 : 1;
    eo.signature_threshold = two_of_three ? 2 : 0;
    eo.state_dir = "";
    eo.endpoint_id = h->id;
    hk_endpoint *ep;
    if (hk_endpoint_start(rt, &eo, &ep, &rep))
        die("endpoint", &rep);
    char portf[PATH_MAX + 64], text[32];
    snprintf(portf, sizeof portf, "%s/hosts/%s/port", tmp, h->id);
    snprintf(text, sizeof text, "%u\n", hk_endpoint_port(ep));
    if (hku_write_atomic(portf, text, strlen(text), 0644, &rep))
        die("port file", &rep);
    if (!two_of_three)
        declare_test(rt);
    for (int sig = 0; sigwait(&set, &sig) == 0 && sig != SIGTERM;) {
        hk_kernel *k;
        int out = 0, *dptr = &out, cu = 0;
        unsigned one = 1;
        void *args[] = {&dptr, &one};
        if (hk_kernel_get(rt, MODULE, "step", &k) == 0) {
            fake_fail("cuLaunchKernel", 1, CUDA_ERROR_INVALID_VALUE);
            hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu);
        }
    }
    hk_endpoint_stop(ep);
    hk_runtime_destroy(rt);
    _exit(0);
}

/* Starts host i (on port, 0: any) and waits for its port file. */
static void host_start(int i, unsigned port) {
    char portf[PATH_MAX + 64], buf[32] = "";
    snprintf(portf, sizeof portf, "%s/hosts/%s/port", tmp, hosts[i].id);
    unlink(portf);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        host_main(i, port);
    hosts[i].pid = pid;
    hosts[i].port = 0;
    hosts[i].down = 0;
    for (double end = now_ms() + 30000; !hosts[i].port;) {
        FILE *f = fopen(portf, "r");
        if (f) {
            if (fgets(buf, sizeof buf, f))
                hosts[i].port = (unsigned)atoi(buf);
            fclose(f);
        }
        int st;
        ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "%s exited (status %d)", hosts[i].id, st);
        ck_assert_msg(now_ms() < end, "%s did not start", hosts[i].id);
        if (!hosts[i].port)
            usleep(20000);
    }
    ck_assert(!port || hosts[i].port == port);
}

static void host_kill(int i) {
    int st;
    kill(hosts[i].pid, SIGKILL);
    ck_assert_int_eq(waitpid(hosts[i].pid, &st, 0), hosts[i].pid);
    hosts[i].down = 1;
}

static void stop_hosts(void) {
    for (int i = 0; i < nhosts; i++) {
        int st = 0;
        if (hosts[i].c)
            curl_easy_cleanup(hosts[i].c);
        hosts[i].c = NULL;
        if (hosts[i].down)
            continue;
        kill(hosts[i].pid, SIGTERM);
        ck_assert_int_eq(waitpid(hosts[i].pid, &st, 0), hosts[i].pid);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s ended with status %d", hosts[i].id,
                      st);
    }
}

/* ---- asking the hosts --------------------------------------------------- */

/* Every host's GET /v1/status at once (libcurl multi): its running
 * release of MODULE (0: none yet; -1: no answer, only allowed of a host
 * the test killed). */
static void ask_all(void) {
    static CURLM *multi;
    if (!multi)
        multi = curl_multi_init();
    for (int i = 0; i < nhosts; i++) {
        struct host *h = &hosts[i];
        char u[64];
        if (!h->c)
            h->c = curl_easy_init();
        h->b.len = 0;
        snprintf(u, sizeof u, "http://127.0.0.1:%u/v1/status", h->port);
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
        ;
    for (int i = 0; i < nhosts; i++) {
        struct host *h = &hosts[i];
        long status = 0;
        curl_multi_remove_handle(multi, h->c);
        curl_easy_getinfo(h->c, CURLINFO_RESPONSE_CODE, &status);
        h->release = -1;
        if (status != 200 || !h->b.len) {
            ck_assert_msg(h->down, "%s did not answer its status (%ld)", h->id, status);
            continue;
        }
        cJSON *doc = cJSON_Parse(h->b.data), *mo;
        h->release = 0;
        cJSON_ArrayForEach(mo, cJSON_GetObjectItemCaseSensitive(doc, "modules")) {
            const cJSON *r = cJSON_GetObjectItemCaseSensitive(mo, "running_release_version");
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(mo, "module")->valuestring, MODULE) &&
                cJSON_IsNumber(r))
                h->release = (long long)r->valuedouble;
        }
        cJSON_Delete(doc);
        if (h->release >= 0 && h->release < 32)
            h->seen |= 1u << h->release;
    }
}

/* The rollout directory's manifest (m is the caller's to hkn_manifest_free). */
static void manifest(hkn_manifest *m) {
    char path[PATH_MAX + 32], *text;
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    snprintf(path, sizeof path, "%s/push/manifest.json", tmp);
    ck_assert_int_eq(hku_read_file(path, 1 << 20, &text, &len, &rep), 0);
    ck_assert_msg(hkn_manifest_parse(text, len, m, &rep) == 0, "%s", rep.message);
    free(text);
    hk_report_clear(&rep);
}

/* 1 when manifest m's steps so far take host i. */
static int covered(const hkn_manifest *m, int i) {
    const char *labels[] = {LABEL, "rack-1"};
    return hkn_rollout_covers(&m->rollout, hosts[i].bucket, hosts[i].id,
                              hosts[i].faulty ? labels : labels + 1, hosts[i].faulty ? 2 : 1);
}

/* The first step (index) that takes host i under m's steps; -1: none. */
static int first_step(const hkn_manifest *m, int i) {
    hkn_rollout r = m->rollout;
    for (size_t s = 0; s < r.nsteps; s++) {
        hkn_manifest x = *m;
        x.rollout = r;
        x.rollout.step = (unsigned)s;
        if (covered(&x, i))
            return (int)s;
    }
    return -1;
}

/* ---- the CLI ------------------------------------------------------------ */

#define PUSH_ARGS "--dir push --key hotkern.key --endpoints endpoints.txt"

/* Runs the CLI; fails the test unless it exits `want`. Its output in out. */
static char out[1 << 20];
static void cli(int want, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cli(int want, const char *fmt, ...) {
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    int rc = hkt_cli_out(tmp, out, sizeof out, "%s", args);
    ck_assert_msg(rc == want, "hotkern %s: exit %d (not %d): %.3000s", args, rc, want, out);
}

static cJSON *field(const cJSON *o, const char *name) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    ck_assert_msg(v != NULL, "no %s", name);
    return v;
}

/* `hotkern rollout watch` on the push fleet, its output in log. */
static pid_t watch_start(const char *log, const char *extra1, const char *extra2) {
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
        const char *argv[24] = {
            "hotkern",     "rollout",     "watch",         "--dir",      "push", "--key",
            "hotkern.key", "--endpoints", "endpoints.txt", "--interval", "1"};
        int n = 11;
        if (two_of_three) {
            argv[6] = "a.key";
            argv[n++] = "--key";
            argv[n++] = "b.key";
        }
        if (extra1) {
            argv[n++] = "--prometheus";
            argv[n++] = extra1;
            argv[n++] = "--gate";
            argv[n++] = extra2;
        }
        argv[n] = NULL;
        execv(hkt_built_program("hotkern"), (char **)argv);
        _exit(127);
    }
    return pid;
}

static char *read_text(const char *name) {
    char path[PATH_MAX + 32], *text = NULL;
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    ck_assert_int_eq(hku_read_file(path, 1 << 20, &text, &len, &rep), 0);
    return text;
}

/* The number of the watch log's lines of `decision`. */
static int decisions(const char *text, const char *decision) {
    char key[32];
    int n = 0;
    snprintf(key, sizeof key, "  %-8s ", decision);
    for (const char *l = strstr(text, key); l; l = strstr(l + 1, key))
        n++;
    return n;
}

#define LOG_ASSERT(cond, log)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("---- the watch's log:\n%s----\n", log);                                        \
            ck_abort_msg("%s (the watch's log above)", #cond);                                     \
        }                                                                                          \
    } while (0)

/* ---- a phase ------------------------------------------------------------ */

struct phase {
    long long release, other; /* what the hosts run (a restarted host: 0 too) */
    int aborted, paused_seen, max_step;
    double aborted_at, back_at, paused_at; /* wall ms; 0: not yet */
};

/* One round: every host asked, then the manifest read (at least as new as
 * what each host was pushed); no host runs the release outside the steps
 * so far, none that ran it left it (before an abort). */
static void round_of(struct phase *ph, hkn_manifest *m) {
    ask_all();
    manifest(m);
    const hkn_rollout *r = &m->rollout;
    int back = 1;
    for (int i = 0; i < nhosts; i++) {
        struct host *h = &hosts[i];
        if (h->release < 0)
            continue; /* down */
        ck_assert_msg(h->release == ph->release || h->release == ph->other || h->release == 0,
                      "%s runs release %lld (neither %lld nor %lld)", h->id, h->release,
                      ph->release, ph->other);
        if (r->release == (uint64_t)ph->release) {
            ck_assert_msg(h->release != ph->release || covered(m, i),
                          "%s (bucket %u) runs release %lld outside step %u", h->id, h->bucket,
                          ph->release, r->step + 1);
            ck_assert_msg(
                r->aborted || !(h->seen & (1u << ph->release)) || h->release == ph->release,
                "%s ran release %lld and left it for %lld", h->id, ph->release, h->release);
        }
        back &= h->release != ph->release;
    }
    if ((int)r->step > ph->max_step)
        ph->max_step = (int)r->step;
    if (r->paused && !ph->paused_seen) {
        ph->paused_seen = 1;
        ph->paused_at = wall_ms();
    }
    if (r->aborted && !ph->aborted) {
        ph->aborted = 1;
        ph->aborted_at = wall_ms();
    }
    if (ph->aborted && back && !ph->back_at)
        ph->back_at = wall_ms();
}

/* After a command: exactly the hosts of the steps so far run release. */
static void exactly_the_step(long long release, long long other) {
    hkn_manifest m;
    ask_all();
    manifest(&m);
    for (int i = 0; i < nhosts; i++)
        ck_assert_msg(hosts[i].release == (covered(&m, i) ? release : other),
                      "%s (bucket %u) runs %lld at step %u", hosts[i].id, hosts[i].bucket,
                      hosts[i].release, m.rollout.step + 1);
    hkn_manifest_free(&m);
}

static void kernel_file(int tag) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/fleet.ptx", tmp);
    ck_assert_int_eq(hkt_write_file(path, fake_ptx(tag, 0, 0, 0)), 0);
}

/* The push's ms of a --json command's document. */
static long long push_ms(void) {
    cJSON *doc = cJSON_Parse(out);
    ck_assert_msg(doc != NULL, "%.2000s", out);
    cJSON *p = field(doc, "push");
    ck_assert_str_eq(field(p, "state")->valuestring, "pass");
    long long ms = (long long)field(p, "ms")->valuedouble;
    cJSON_Delete(doc);
    return ms;
}

/* The wall-clock time (ms) of the watch log's first line of `decision`;
 * 0: none. */
static double line_time(const char *text, const char *decision) {
    char key[32];
    snprintf(key, sizeof key, "  %-8s ", decision);
    const char *k = strstr(text, key);
    if (!k)
        return 0;
    const char *l = k;
    while (l > text && l[-1] != '\n')
        l--;
    struct tm tm;
    int ms = 0;
    memset(&tm, 0, sizeof tm);
    if (sscanf(l, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &ms) != 7)
        return 0;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (double)timegm(&tm) * 1e3 + ms;
}

/* Runs a watch phase: rounds until the watch ended (and, when it aborts,
 * every host is back); `each` (may be NULL) is called after each round.
 * The watch's exit status. */
static int watch_phase(struct phase *ph, pid_t w, const char *log,
                       void (*each)(struct phase *, const hkn_manifest *)) {
    int st = 0, code = -1;
    hkn_manifest m;
    for (double end = now_ms() + DEADLINE;;) {
        if (now_ms() > end) {
            kill(w, SIGKILL);
            char *text = read_text(log);
            LOG_ASSERT(!"the phase did not end in time", text);
        }
        if (code < 0 && waitpid(w, &st, WNOHANG) == w) {
            ck_assert(WIFEXITED(st));
            code = WEXITSTATUS(st);
        }
        round_of(ph, &m);
        if (each)
            each(ph, &m);
        hkn_manifest_free(&m);
        if (code >= 0 && (!ph->aborted || ph->back_at))
            return code;
        usleep(50000);
    }
}

static int victim = -1;
static double killed_at, restarted_at;

/* Release 4: the victim killed at step 2; started again (on its port) once
 * the rollout paused, which it must do at the victim's own step. */
static void kill_and_restart(struct phase *ph, const hkn_manifest *m) {
    if (!killed_at && m->rollout.step == 1) {
        host_kill(victim);
        killed_at = wall_ms();
    }
    if (killed_at && !restarted_at && m->rollout.paused) {
        ck_assert_int_eq(m->rollout.step, first_step(m, victim));
        char *text = read_text("watch-4.txt");
        LOG_ASSERT(strstr(text, hosts[victim].id) && strstr(text, "missing data"), text);
        free(text);
        host_start(victim, hosts[victim].port);
        restarted_at = wall_ms();
    }
    (void)ph;
}

static pid_t usr1_to;
static double usr1_at;

/* Release 5: once the gate query held at least once, a launch error on
 * host-000 (the one host of step 1). */
static void launch_error(struct phase *ph, const hkn_manifest *m) {
    if (usr1_at)
        return;
    char *text = read_text("watch-5.txt");
    if (strstr(text, "Prometheus: the --gate queries hold")) {
        kill(usr1_to, SIGUSR1);
        usr1_at = wall_ms();
    }
    free(text);
    (void)ph;
    (void)m;
}

/* The test's directory and the loadable fake driver's path. */
static void fleet_setup(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* the figures come out even when a check fails */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    char bin[PATH_MAX]; /* BUILD/bin/hotkern -> BUILD/lib/libhotkern-fakecuda.so */
    snprintf(bin, sizeof bin, "%s", hkt_built_program("hotkern"));
    snprintf(fake_lib, sizeof fake_lib, "%s/lib/libhotkern-fakecuda.so", dirname(dirname(bin)));
}

START_TEST(push_rollout) {
    hkn_seckey key;
    hk_report rep = HK_REPORT_INIT;
    fleet_setup();
    char script[2 * PATH_MAX];
    snprintf(faulty_helper, sizeof faulty_helper, "%s/canary-faulty.sh", tmp);
    snprintf(script, sizeof script,
             "#!/bin/sh\nHKFAKE_FAULT=step@203=CUDA_ERROR_ILLEGAL_ADDRESS exec '%s' \"$@\"\n",
             hkt_built_program("hotkern-canary"));
    ck_assert_int_eq(hkt_write_file(faulty_helper, script), 0);
    ck_assert_int_eq(chmod(faulty_helper, 0755), 0);
    char key_path[PATH_MAX + 16], dir[PATH_MAX + 64];
    snprintf(key_path, sizeof key_path, "%s/hotkern.key", tmp);
    snprintf(pub_path, sizeof pub_path, "%s/hotkern.pub", tmp);
    ck_assert_int_eq(hkn_keygen(&key), 0);
    ck_assert_int_eq(hkn_seckey_save(key_path, &key, &rep), 0);
    ck_assert_int_eq(hkn_pubkey_save(pub_path, &key.pub, &rep), 0);
    snprintf(dir, sizeof dir, "%s/hosts", tmp);
    ck_assert_int_eq(mkdir(dir, 0700), 0);

    /* The faulty hosts: in step 2 by their label only (buckets from 1000). */
    int faulty = 0;
    for (int i = 0; i < NHOSTS; i++) {
        struct host *h = &hosts[i];
        snprintf(h->id, sizeof h->id, "host-%03d", i);
        h->bucket = hkn_fleet_bucket(h->id, MODULE);
        h->faulty = faulty < FAULTY && i != 0 && h->bucket >= 1000;
        faulty += h->faulty;
        snprintf(dir, sizeof dir, "%s/hosts/%s", tmp, h->id);
        ck_assert_int_eq(mkdir(dir, 0700), 0);
    }
    ck_assert_int_eq(faulty, FAULTY);
    double t0 = now_ms();
    for (int i = 0; i < NHOSTS; i++)
        host_start(i, 0);
    printf("cpu_fleet_push: %d endpoint hosts up in %.0f ms\n", NHOSTS, now_ms() - t0);
    char path[PATH_MAX + 32], list[NHOSTS * 128];
    size_t used = 0;
    for (int i = 0; i < NHOSTS; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%.23s http://127.0.0.1:%u %s\n",
                                 hosts[i].id, hosts[i].port,
                                 hosts[i].faulty ? LABEL ",rack-1" : "rack-1");
    snprintf(path, sizeof path, "%s/endpoints.txt", tmp);
    ck_assert_int_eq(hkt_write_file(path, list), 0);
    snprintf(path, sizeof path, "%s/steps.json", tmp);
    ck_assert_int_eq(hkt_write_file(path, "[{\"percent\": 1, \"hosts\": [\"host-000\"]}, "
                                          "{\"percent\": 10, \"labels\": [\"" LABEL "\"]}, "
                                          "{\"percent\": 50}, {\"percent\": 100}]"),
                     0);
    snprintf(path, sizeof path, "%s/watch.json", tmp);
    ck_assert_int_eq(hkt_write_file(path, "[{\"percent\": 1, \"hosts\": [\"host-000\"], "
                                          "\"bake_s\": 1}, {\"percent\": 10, \"labels\": [\"" LABEL
                                          "\"], \"bake_s\": 1}, {\"percent\": 50, \"bake_s\": 1}, "
                                          "{\"percent\": 100, \"bake_s\": 1}]"),
                     0);

    /* ---- release 1 to everyone, then release 2 step by step ---- */
    kernel_file(101);
    cli(0, "rollout start " PUSH_ARGS " --module " MODULE " --steps 100 fleet.ptx");
    ask_all();
    for (int i = 0; i < NHOSTS; i++)
        ck_assert_msg(hosts[i].release == 1, "%s runs %lld", hosts[i].id, hosts[i].release);
    kernel_file(102);
    double c0 = now_ms();
    cli(0, "rollout start " PUSH_ARGS " --module " MODULE " --json --steps-file steps.json "
           "fleet.ptx");
    printf("cpu_fleet_push: release 2 step 1: start -> every host of it acknowledged: %.0f ms "
           "(the pushes %lld ms)\n",
           now_ms() - c0, push_ms());
    exactly_the_step(2, 1);
    /* pause and resume push nothing: --endpoints there is a usage error */
    cli(2, "rollout pause " PUSH_ARGS);
    for (int s = 2; s <= 4; s++) {
        c0 = now_ms();
        cli(0, "rollout advance " PUSH_ARGS " --json");
        printf("cpu_fleet_push: release 2 step %d: advance -> every host of it acknowledged: "
               "%.0f ms (the pushes %lld ms)\n",
               s, now_ms() - c0, push_ms());
        exactly_the_step(2, 1);
    }
    cli(1, "rollout advance " PUSH_ARGS); /* at the last step */
    cli(0, "rollout status --dir push --endpoints endpoints.txt --json");
    cJSON *doc = cJSON_Parse(out), *fl = field(doc, "fleet");
    ck_assert_int_eq(field(fl, "known_hosts")->valueint, NHOSTS);
    ck_assert_int_eq(field(fl, "on_release")->valueint, NHOSTS);
    ck_assert_str_eq(field(field(fl, "gate"), "state")->valuestring, "pass");
    cJSON_Delete(doc);

    /* ---- release 3, refused by the canary of the two driver=r535 hosts ---- */
    kernel_file(203);
    cli(0, "rollout start " PUSH_ARGS " --module " MODULE " --release 3 --steps-file watch.json "
           "fleet.ptx");
    struct phase b = {.release = 3, .other = 2};
    pid_t w = watch_start("watch-3.txt", NULL, NULL);
    int code = watch_phase(&b, w, "watch-3.txt", NULL);
    char *log = read_text("watch-3.txt");
    LOG_ASSERT(code == 1 && b.aborted, log);
    LOG_ASSERT(decisions(log, "abort") == 1 && decisions(log, "advance") == 1, log);
    LOG_ASSERT(strstr(log, "refused release 3"), log);
    hkn_manifest m;
    manifest(&m);
    for (int i = 0; i < NHOSTS; i++) {
        ck_assert_msg(hosts[i].release == 2, "%s ended on %lld", hosts[i].id, hosts[i].release);
        ck_assert_msg(!(hosts[i].seen & (1u << 3)) || first_step(&m, i) <= 1,
                      "%s (first in step %d) ran release 3", hosts[i].id, first_step(&m, i) + 1);
        ck_assert_msg(!hosts[i].faulty || !(hosts[i].seen & (1u << 3)), "%s ran release 3",
                      hosts[i].id);
    }
    hkn_manifest_free(&m);
    double adv = line_time(log, "advance"), ab = line_time(log, "abort");
    printf("cpu_fleet_push: release 3: step 2's refusals (watch's advance) -> abort published "
           "and pushed back: %.0f ms; every host back on 2 %.0f ms after the abort was seen\n",
           ab - adv, b.back_at - b.aborted_at);
    free(log);
    cli(0, "rollout status --dir push --endpoints endpoints.txt --json");
    doc = cJSON_Parse(out);
    cJSON *step2 = cJSON_GetArrayItem(field(field(doc, "fleet"), "steps"), 1), *one;
    ck_assert_int_eq(cJSON_GetArraySize(field(step2, "refused")), FAULTY);
    cJSON_ArrayForEach(one, field(step2, "refused"))
        ck_assert_str_eq(field(one, "reason")->valuestring, "fault");
    cJSON_Delete(doc);

    /* ---- release 4: a host of step 3 killed at step 2, started again ---- */
    manifest(&m);
    for (int i = 0; i < NHOSTS && victim < 0; i++)
        if (!hosts[i].faulty && first_step(&m, i) == 2)
            victim = i;
    hkn_manifest_free(&m);
    ck_assert_int_ge(victim, 0);
    kernel_file(104);
    cli(0, "rollout start " PUSH_ARGS " --module " MODULE " --release 4 --steps-file watch.json "
           "fleet.ptx");
    struct phase c = {.release = 4, .other = 2};
    w = watch_start("watch-4.txt", NULL, NULL);
    code = watch_phase(&c, w, "watch-4.txt", kill_and_restart);
    log = read_text("watch-4.txt");
    LOG_ASSERT(code == 0 && killed_at && restarted_at, log);
    LOG_ASSERT(decisions(log, "pause") >= 1 && decisions(log, "resume") >= 1, log);
    LOG_ASSERT(decisions(log, "done") == 1, log);
    ask_all();
    for (int i = 0; i < NHOSTS; i++)
        ck_assert_msg(hosts[i].release == 4, "%s ended on %lld", hosts[i].id, hosts[i].release);
    printf("cpu_fleet_push: release 4: %s killed; paused %.0f ms after (missing data), started "
           "again, resumed %.0f ms after its restart\n",
           hosts[victim].id, c.paused_at - killed_at, line_time(log, "resume") - restarted_at);
    free(log);

    /* ---- release 5: the gate query against a real Prometheus ---- */
    char sc[4096];
    snprintf(sc, sizeof sc,
             "  - job_name: hotkern\n    scrape_interval: 1s\n    scrape_timeout: 1s\n"
             "    static_configs:\n      - targets:\n");
    for (int i = 0; i < NHOSTS; i++)
        snprintf(sc + strlen(sc), sizeof sc - strlen(sc), "          - '127.0.0.1:%u'\n",
                 hosts[i].port);
    hkt_prometheus prom;
    int ps = hkt_prometheus_start(&prom, tmp, sc);
    ck_assert_msg(ps >= 0, "prometheus did not start (see %s/prometheus.log)", tmp);
    if (ps > 0) {
        char prom_url[64];
        snprintf(prom_url, sizeof prom_url, "http://127.0.0.1:%d", prom.port);
        for (double end = now_ms() + 30000; hkt_prometheus_count(&prom, "up == 1") < NHOSTS;) {
            ck_assert_msg(now_ms() < end, "Prometheus does not scrape every endpoint");
            usleep(200000);
        }
        snprintf(path, sizeof path, "%s/gate.json", tmp);
        ck_assert_int_eq(hkt_write_file(path, "[{\"percent\": 1, \"hosts\": [\"host-000\"], "
                                              "\"bake_s\": 5}, {\"percent\": 100}]"),
                         0);
        kernel_file(105);
        cli(0, "rollout start " PUSH_ARGS " --module " MODULE " --release 5 --steps-file "
               "gate.json fleet.ptx");
        usr1_to = hosts[0].pid;
        struct phase d = {.release = 5, .other = 4};
        w = watch_start("watch-5.txt", prom_url,
                        "increase(hotkern_launch_errors_total[$WINDOW]) > 0");
        code = watch_phase(&d, w, "watch-5.txt", launch_error);
        log = read_text("watch-5.txt");
        LOG_ASSERT(code == 1 && usr1_at && d.aborted, log);
        LOG_ASSERT(decisions(log, "abort") == 1 && decisions(log, "advance") == 0, log);
        LOG_ASSERT(strstr(log, "hotkern_launch_errors_total") && strstr(log, "127.0.0.1"), log);
        ask_all();
        for (int i = 0; i < NHOSTS; i++)
            ck_assert_msg(hosts[i].release == 4, "%s ended on %lld", hosts[i].id, hosts[i].release);
        printf("cpu_fleet_push: release 5: the launch error -> watch's abort (through "
               "Prometheus, 1 s scrapes) %.0f ms\n",
               line_time(log, "abort") - usr1_at);
        free(log);
        hkt_prometheus_stop(&prom);
    }
    stop_hosts();
    hkt_rmtree(tmp);
}
END_TEST

/* ---- a fleet that needs 2 of 3 keys ------------------------------------ */

#define TWO_KEYS "--dir push --key a.key --key b.key --endpoints endpoints.txt"

/* The signature file of the rollout directory's manifest: lines, and
 * whether 2 of a, b, c signed the manifest's bytes. */
static void signed_by_two(const hkn_seckey *k) {
    hkn_trust t;
    hk_report rep = HK_REPORT_INIT;
    memset(&t, 0, sizeof t);
    for (int i = 0; i < 3; i++)
        t.keys[i] = k[i].pub;
    t.nkeys = 3;
    t.threshold = 2;
    char *text = read_text("push/manifest.json"), *sig = read_text("push/manifest.json.sig");
    ck_assert_msg(hkn_signatures_verify(&t, "manifest", text, strlen(text), sig, strlen(sig), NULL,
                                        NULL, &rep) == 0,
                  "%s", rep.message);
    int lines = 0;
    for (const char *c = sig; *c; c++)
        lines += *c == '\n';
    ck_assert_int_eq(lines, 2);
    ck_assert(!strncmp(sig, k[0].pub.id, HKN_KEY_ID_CHARS)); /* a's line first, then b's */
    ck_assert(!strncmp(strchr(sig, '\n') + 1, k[1].pub.id, HKN_KEY_ID_CHARS));
    free(text);
    free(sig);
    hk_report_clear(&rep);
}

/* Three endpoint hosts that need 2 of the keys a, b and c: a rollout
 * signed by one key is refused by every host for its signature; signed by
 * two (--key a.key --key b.key) it is taken through its steps by start,
 * pause, resume and advance, and back by abort; and watch with the two
 * keys advances one to its last step. */
START_TEST(threshold_push) {
    hkn_seckey k[3];
    hk_report rep = HK_REPORT_INIT;
    char path[PATH_MAX + 32], list[512] = "";
    fleet_setup();
    two_of_three = 1;
    nhosts = 3;
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(hkn_keygen(&k[i]), 0);
        snprintf(path, sizeof path, "%s/%c.key", tmp, 'a' + i);
        ck_assert_int_eq(hkn_seckey_save(path, &k[i], &rep), 0);
        snprintf(path, sizeof path, "%s/%c.pub", tmp, 'a' + i);
        ck_assert_int_eq(hkn_pubkey_save(path, &k[i].pub, &rep), 0);
    }
    snprintf(path, sizeof path, "%s/hosts", tmp);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    for (int i = 0; i < nhosts; i++) {
        snprintf(hosts[i].id, sizeof hosts[i].id, "host-%03d", i);
        hosts[i].bucket = hkn_fleet_bucket(hosts[i].id, MODULE);
        snprintf(path, sizeof path, "%s/hosts/%s", tmp, hosts[i].id);
        ck_assert_int_eq(mkdir(path, 0700), 0);
        host_start(i, 0);
        snprintf(list + strlen(list), sizeof list - strlen(list),
                 "%.23s http://127.0.0.1:%u rack-1\n", hosts[i].id, hosts[i].port);
    }
    /* Step 1 is host-000 alone (1% of 3 hosts holds no other here). */
    ck_assert(hosts[1].bucket >= 100 && hosts[2].bucket >= 100);
    snprintf(path, sizeof path, "%s/endpoints.txt", tmp);
    ck_assert_int_eq(hkt_write_file(path, list), 0);
    snprintf(path, sizeof path, "%s/steps.json", tmp);
    ck_assert_int_eq(hkt_write_file(path, "[{\"percent\": 1, \"hosts\": [\"host-000\"], "
                                          "\"bake_s\": 1}, {\"percent\": 100, \"bake_s\": 1}]"),
                     0);

    /* One key: every host refuses the release for its signature. */
    kernel_file(101);
    cli(1, "rollout start --dir push --key a.key --endpoints endpoints.txt --module " MODULE
           " --steps 100 --json fleet.ptx");
    cJSON *doc = cJSON_Parse(out);
    ck_assert_msg(doc != NULL, "%.2000s", out);
    ck_assert_str_eq(field(field(doc, "push"), "state")->valuestring, "fail");
    cJSON_Delete(doc);
    exactly_the_step(0, 0);
    cli(0, "rollout status --dir push --endpoints endpoints.txt --json");
    doc = cJSON_Parse(out);
    cJSON *refused = field(cJSON_GetArrayItem(field(field(doc, "fleet"), "steps"), 0), "refused");
    ck_assert_int_eq(cJSON_GetArraySize(refused), nhosts);
    cJSON *one;
    cJSON_ArrayForEach(one, refused)
        ck_assert_str_eq(field(one, "reason")->valuestring, "signature");
    cJSON_Delete(doc);
    char *state = read_text("push/push-state.json");
    ck_assert_msg(strstr(state, "1 of 2 required signatures"), "%s", state);
    free(state);

    /* Two keys: release 2 to every host, then release 3 in its steps. */
    kernel_file(102);
    cli(0, "rollout start " TWO_KEYS " --module " MODULE " --steps 100 fleet.ptx");
    exactly_the_step(2, 2);
    signed_by_two(k);
    kernel_file(103);
    cli(0, "rollout start " TWO_KEYS " --module " MODULE " --release 3 --steps-file steps.json "
           "fleet.ptx");
    exactly_the_step(3, 2);
    ck_assert_int_eq(hosts[0].release, 3);
    cli(0, "rollout pause --dir push --key a.key --key b.key");
    signed_by_two(k);
    cli(0, "rollout resume --dir push --key a.key --key b.key");
    cli(0, "rollout advance " TWO_KEYS " --force");
    signed_by_two(k);
    exactly_the_step(3, 2);
    for (int i = 0; i < nhosts; i++)
        ck_assert_int_eq(hosts[i].release, 3);

    /* Release 4 to host-000, then aborted: back on 3. */
    kernel_file(104);
    cli(0, "rollout start " TWO_KEYS " --module " MODULE " --release 4 --steps-file steps.json "
           "fleet.ptx");
    exactly_the_step(4, 3);
    ck_assert_int_eq(hosts[0].release, 4);
    cli(0, "rollout abort " TWO_KEYS);
    signed_by_two(k);
    exactly_the_step(3, 3);

    /* Release 5 under watch with the two keys: to its last step. */
    kernel_file(105);
    cli(0, "rollout start " TWO_KEYS " --module " MODULE " --release 5 --steps-file steps.json "
           "fleet.ptx");
    struct phase ph = {.release = 5, .other = 3};
    pid_t w = watch_start("watch-k.txt", NULL, NULL);
    int code = watch_phase(&ph, w, "watch-k.txt", NULL);
    char *log = read_text("watch-k.txt");
    LOG_ASSERT(code == 0 && decisions(log, "advance") == 1 && decisions(log, "done") == 1, log);
    free(log);
    signed_by_two(k);
    exactly_the_step(5, 5);
    stop_hosts();
    sodium_memzero(k, sizeof k);
    hk_report_clear(&rep);
    hkt_rmtree(tmp);
}
END_TEST

int main(void) {
    Suite *s = suite_create("fleet_push");
    TCase *tc = tcase_create("push");
    tcase_set_timeout(tc, 400);
    tcase_add_test(tc, push_rollout);
    suite_add_tcase(s, tc);
    tc = tcase_create("threshold");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, threshold_push);
    suite_add_tcase(s, tc);
    return hkt_run(s);
}

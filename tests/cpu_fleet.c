/*
 * A fleet on loopback: Debian's nginx as the static origin, 100 puller hosts
 * (processes forked by the test, each a runtime on the fake driver with its
 * own host id, last-known-good directory and anti-rollback state, serving
 * its /metrics), and `hotkern rollout` publishing into the origin.
 *
 * Release 2 goes 1% (and one host named) -> 10% (and the hosts labelled
 * "canary") -> 50% -> 100%: at every scrape of every host no host outside
 * the current step runs it and no host of an earlier step has left it, and
 * each step ends with exactly its hosts on it (hotkern_rollout_in_step
 * agreeing). Mid-rollout, hosts of both kinds are restarted: they come back
 * in the same bucket on what they ran. Release 3 then goes to 10% and 50%
 * and is aborted: every host that took it is back on release 2, hosts that
 * never took it never ran it; the time from the abort to the whole fleet
 * back is printed, with each step's.
 *
 * The stable release (a fleet of STABLE_HOSTS): release 2 at 30%, hosts
 * outside the step are killed (SIGKILL) and restarted without their
 * last-known-good directory (two keeping their anti-rollback state, two
 * with none), one of the step likewise, and two new host ids join, one on
 * each side: each comes back on release 1 (outside) or 2 (in the step), at
 * no scrape on the other, with one release applied; the hosts left alone
 * never change; at 100% all run 2.
 *
 * Threshold signatures (a second fleet, of THRESHOLD_HOSTS hosts trusting
 * keys A, B and C, two of them required): a release signed by one key is
 * refused by every host (each counts a "signature" refusal and keeps what
 * it runs); co-signed by a second key it is taken by all. A key list of B,
 * C and D published to the origin is taken by every host without a
 * restart, after which a release signed by the retired A (and B) is
 * refused by all and one signed by C and D taken; hosts restarted with the
 * key list gone from the origin still trust it (their state keeps it).
 *
 * What each host runs is read from its own metrics only, as Prometheus
 * would; the waits end at a deadline (a failure), never on a timing.
 */
#include <check.h>
#include <errno.h>
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

#include <curl/curl.h>
#include <sodium.h>

#include "hotkern/net.h"
#include "loader/port.h"
#include "net/net.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

#define HOSTS    100
#define MODULE   "fleet"
#define DEADLINE 30000 /* ms for one step to settle: a failure past it */

static char *tmp;
static char www[PATH_MAX], origin[PATH_MAX + 8], url[256], key_path[PATH_MAX + 16];
static char pub_path[PATH_MAX + 16];

struct host {
    char id[24];
    int canary; /* labelled "canary" */
    uint32_t bucket;
    pid_t pid;
    unsigned port; /* 0 until its port file is read */
    CURL *c;
    long long release, in_step, seen_bucket; /* the last scrape's; -1: none */
    long long applied, errors, polls;        /* its puller's, at the last scrape */
    int no_lkg; /* started without a last-known-good directory: nothing to restore */
};
static struct host hosts[HOSTS];
/* The threshold test's: its hosts' trusted keys and threshold (0: the
 * first test's one key), and whether a scrape may see refusals. */
#define THRESHOLD_HOSTS 10
static char trust_files[3][PATH_MAX + 16];
static int nhosts = HOSTS, ntrust, threshold_k, refusals_ok;
static long long sig_refusals[HOSTS], keys_version[HOSTS];

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- a host (a child process) ------------------------------------------- */

static void die(const char *what, const hk_report *rep) {
    fprintf(stderr, "cpu_fleet host: %s: %s\n", what, rep ? rep->message : "");
    _exit(1);
}

/* Runs host i until SIGTERM, then stops its puller and runtime (the
 * runtime records what ran long enough as known good), and exits. */
static void host_main(int i) {
    struct host *h = &hosts[i];
    char dir[PATH_MAX + 32], lkg[PATH_MAX + 64], st[PATH_MAX + 64], portf[PATH_MAX + 64];
    hk_report rep = HK_REPORT_INIT;
    sigset_t set;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    snprintf(dir, sizeof dir, "%s/hosts/%.23s", tmp, h->id);
    snprintf(lkg, sizeof lkg, "%s/lkg", dir);
    snprintf(st, sizeof st, "%s/state", dir);
    snprintf(portf, sizeof portf, "%s/port", dir);
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.no_warm_start = 1;
    o.state_dir = h->no_lkg ? NULL : lkg; /* a restart comes back on what ran */
    o.restore = !h->no_lkg;
    o.suspect_window_ms = 50;
    hk_runtime *rt;
    if (hkl_runtime_create_with(&rt, &o, fake_driver(), &rep))
        die("runtime", &rep);
    const char *keys[] = {pub_path}, *keys3[] = {trust_files[0], trust_files[1], trust_files[2]};
    hk_pull_options po;
    hk_pull_options_init(&po);
    po.url = url;
    po.interval_ms = 200;
    po.trusted_keys = ntrust ? keys3 : keys;
    po.ntrusted_keys = ntrust ? ntrust : 1;
    po.signature_threshold = (unsigned)threshold_k;
    if (ntrust)
        po.max_backoff_ms = 800; /* a refused release is fetched again soon */
    po.state_dir = st;
    po.metrics_address = "127.0.0.1";
    /* Half the hosts are named by the option, half by the environment. */
    if (i % 2)
        setenv("HOTKERN_HOST_ID", h->id, 1);
    else
        po.host_id = h->id;
    po.host_labels = h->canary ? "canary,rack-1" : "rack-1";
    hk_puller *p;
    if (hk_pull_start(rt, &po, &p, &rep))
        die("puller", &rep);
    char text[32];
    snprintf(text, sizeof text, "%u\n", hk_pull_metrics_port(p));
    if (hku_write_atomic(portf, text, strlen(text), 0644, &rep))
        die("port file", &rep);
    int sig;
    sigwait(&set, &sig);
    hk_pull_stop(p);
    hk_runtime_destroy(rt);
    _exit(0);
}

static void spawn(int i) {
    char portf[PATH_MAX + 64];
    snprintf(portf, sizeof portf, "%s/hosts/%.23s/port", tmp, hosts[i].id);
    unlink(portf);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        host_main(i);
    hosts[i].pid = pid;
    hosts[i].port = 0;
}

/* Reads the ports of the hosts started (10 s at most). */
static void ports(void) {
    double end = now_ms() + 30000;
    for (int i = 0; i < nhosts; i++) {
        char portf[8192], buf[32] = "";
        snprintf(portf, sizeof portf, "%s/hosts/%.23s/port", tmp, hosts[i].id);
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

/* Stops host i (SIGTERM: a service restart) and waits for it. */
static void stop(int i) {
    int st = 0;
    kill(hosts[i].pid, SIGTERM);
    ck_assert_int_eq(waitpid(hosts[i].pid, &st, 0), hosts[i].pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s ended with status %d", hosts[i].id,
                  st);
    hosts[i].pid = 0;
    hosts[i].port = 0;
}

/* ---- scraping ---------------------------------------------------------- */

/* The value of `name`'s sample for the module; -1 when there is none. */
static long long sample(const char *text, const char *name) {
    return hkt_sample(text, name, "module=\"" MODULE "\"");
}

/* Every refusal the host counted, all reasons together. */
static long long refusals(const char *text) {
    static const char key[] = "\nhotkern_rollout_refusals_total{";
    long long n = 0;
    for (const char *l = strstr(text, key); l; l = strstr(l + 1, key)) {
        const char *sp = strchr(l + 1, '}');
        n += sp ? atoll(sp + 2) : 0;
    }
    return n;
}

/* Scrapes host i into its fields; 0 when it did not answer. */
static int scrape(int i) {
    struct host *h = &hosts[i];
    char u[64];
    hkt_body b = {NULL, 0};
    h->release = h->in_step = h->seen_bucket = -1;
    if (!h->port)
        return 0;
    if (!h->c)
        h->c = curl_easy_init();
    snprintf(u, sizeof u, "http://127.0.0.1:%u/metrics", h->port);
    curl_easy_setopt(h->c, CURLOPT_URL, u);
    curl_easy_setopt(h->c, CURLOPT_WRITEFUNCTION, hkt_body_write);
    curl_easy_setopt(h->c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h->c, CURLOPT_TIMEOUT_MS, 5000L);
    long status = 0;
    int ok = curl_easy_perform(h->c) == CURLE_OK &&
             curl_easy_getinfo(h->c, CURLINFO_RESPONSE_CODE, &status) == CURLE_OK &&
             status == 200 && b.data;
    if (ok) {
        h->release = sample(b.data, "hotkern_rollout_release");
        h->in_step = sample(b.data, "hotkern_rollout_in_step");
        h->seen_bucket = sample(b.data, "hotkern_rollout_bucket");
        sig_refusals[i] =
            hkt_sample(b.data, "hotkern_rollout_refusals_total", "reason=\"signature\"");
        keys_version[i] = hkt_sample(b.data, "hotkern_trusted_keys_version", "");
        h->applied = hkt_sample(b.data, "hotkern_pull_applied_total", "");
        h->errors = hkt_sample(b.data, "hotkern_pull_errors_total", "");
        h->polls = hkt_sample(b.data, "hotkern_pull_polls_total", "");
        ck_assert_msg(refusals_ok || refusals(b.data) == 0, "%s refused a release: %s", h->id,
                      b.data);
    }
    free(b.data);
    return ok;
}

/* ---- steps ------------------------------------------------------------- */

/* Waits until every host runs `release` where want[i], `other` elsewhere,
 * with in_step as want[i] (check_step). At every scrape: no host runs
 * `release` where !want[i], no host with keep[i] runs anything else, and
 * every host runs one of the two. Returns the time it took, in ms. */
static double settle(const char *what, long long release, long long other, const int *want,
                     const int *keep, int check_step) {
    double t0 = now_ms();
    for (int round = 0;; round++) {
        int done = 1;
        for (int i = 0; i < nhosts; i++) {
            struct host *h = &hosts[i];
            int st;
            ck_assert_msg(waitpid(h->pid, &st, WNOHANG) == 0, "%s exited (status %d)", h->id, st);
            /* Not up, before its first poll, or between its first gate and
             * its first apply (running nothing yet, having applied nothing). */
            if (!scrape(i) || h->release < 0 || (h->release == 0 && h->applied == 0)) {
                done = 0;
                continue;
            }
            ck_assert_msg(h->release == release || h->release == other,
                          "%s: %s runs release %lld (neither %lld nor %lld)", what, h->id,
                          h->release, release, other);
            ck_assert_msg(!(h->release == release && !want[i]),
                          "%s: %s (bucket %u) runs release %lld outside its step", what, h->id,
                          h->bucket, release);
            ck_assert_msg(!(keep[i] && h->release != release),
                          "%s: %s (bucket %u) of an earlier step left release %lld for %lld", what,
                          h->id, h->bucket, release, h->release);
            ck_assert_int_eq(h->seen_bucket, h->bucket);
            if (h->release != (want[i] ? release : other) || (check_step && h->in_step != want[i]))
                done = 0;
        }
        double ms = now_ms() - t0;
        if (done) {
            int n = 0;
            for (int i = 0; i < nhosts; i++)
                n += want[i];
            printf("cpu_fleet: %-44s %3d hosts on release %lld, %3d on %lld, in %.0f ms (%d "
                   "rounds of %d scrapes)\n",
                   what, n, release, nhosts - n, other, ms, round + 1, nhosts);
            return ms;
        }
        if (ms >= DEADLINE) {
            char late[4096] = "";
            for (int i = 0; i < nhosts; i++)
                if (hosts[i].release != (want[i] ? release : other) ||
                    (check_step && hosts[i].in_step != want[i]))
                    snprintf(late + strlen(late), sizeof late - strlen(late),
                             " %.23s(release %lld, in_step %lld)", hosts[i].id, hosts[i].release,
                             hosts[i].in_step);
            ck_abort_msg("%s: not settled after %d ms:%s", what, DEADLINE, late);
        }
        usleep(100000);
    }
}

static void kernel_file(const char *name, int tag) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    ck_assert_int_eq(hkt_write_file(path, fake_ptx(tag, 0, 0, 0)), 0);
}

START_TEST(rollout_across_100_hosts) {
    double t_start = now_ms();
    setvbuf(stdout, NULL, _IOLBF, 0); /* the figures come out even when a check fails */
    pid_t nginx;
    hkn_seckey key;
    hk_report rep = HK_REPORT_INIT;
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    snprintf(www, sizeof www, "%s/www", tmp);
    snprintf(origin, sizeof origin, "%s/fleet", www);
    snprintf(key_path, sizeof key_path, "%s/hotkern.key", tmp);
    snprintf(pub_path, sizeof pub_path, "%s/hotkern.pub", tmp);
    char dir[8192];
    snprintf(dir, sizeof dir, "%s/hosts", tmp);
    ck_assert_int_eq(mkdir(www, 0755), 0);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(hkn_keygen(&key), 0);
    ck_assert_int_eq(hkn_seckey_save(key_path, &key, &rep), 0);
    ck_assert_int_eq(hkn_pubkey_save(pub_path, &key.pub, &rep), 0);
    int port = hkt_nginx_start(www, tmp, NULL, &nginx);
    ck_assert_msg(port > 0, "nginx did not start");
    snprintf(url, sizeof url, "http://127.0.0.1:%d/fleet/manifest.json", port);
    kernel_file("fleet.ptx", 101);
    hkt_run_cli(tmp,
                "sign --key hotkern.key --module " MODULE " --release 1 --out www/fleet fleet.ptx");

    static int want[HOSTS], keep[HOSTS], none[HOSTS], all[HOSTS];
    for (int i = 0; i < HOSTS; i++) {
        struct host *h = &hosts[i];
        snprintf(h->id, sizeof h->id, "host-%03d", i);
        h->canary = i % 25 == 7;
        h->bucket = hkn_fleet_bucket(h->id, MODULE);
        snprintf(dir, sizeof dir, "%s/hosts/%.23s", tmp, h->id);
        ck_assert_int_eq(mkdir(dir, 0700), 0);
        all[i] = 1;
    }
    for (int i = 0; i < HOSTS; i++)
        spawn(i);
    ports();
    double t_up = now_ms();
    settle("release 1 (no rollout)", 1, 1, all, none, 1);

    /* Release 2: 1% and host-042, 10% and the canaries, 50%, 100%. */
    char steps[PATH_MAX + 32];
    snprintf(steps, sizeof steps, "%s/steps.json", tmp);
    ck_assert_int_eq(hkt_write_file(steps, "[{\"percent\": 1, \"hosts\": [\"host-042\"]}, "
                                           "{\"percent\": 10, \"labels\": [\"canary\"]}, "
                                           "{\"percent\": 50}, {\"percent\": 100}]"),
                     0);
    kernel_file("fleet.ptx", 102);
    hkt_run_cli(tmp, "rollout start --dir www/fleet --key hotkern.key --module " MODULE
                     " --steps-file steps.json fleet.ptx");
    static const unsigned share[] = {1, 10, 50, 100};
    static const char *const names[] = {"release 2, step 1 (1% + host-042)",
                                        "release 2, step 2 (10% + canaries)",
                                        "release 2, step 3 (50%)", "release 2, step 4 (100%)"};
    for (int s = 0; s < 4; s++) {
        if (s > 0)
            hkt_run_cli(tmp, "rollout advance --dir www/fleet --key hotkern.key");
        for (int i = 0; i < HOSTS; i++) {
            keep[i] = want[i]; /* the earlier step's hosts */
            want[i] = hosts[i].bucket < share[s] * 100 || i == 42 || (s >= 1 && hosts[i].canary);
        }
        settle(names[s], 2, 1, want, keep, 1);
        if (s != 1)
            continue;
        /* Mid-rollout, three hosts of the step and three outside it are
         * restarted: the same bucket, back on what they ran. */
        int picked[6], n_in = 0, n_out = 0, n = 0;
        for (int i = 0; i < HOSTS && n < 6; i++)
            if (want[i] ? n_in < 3 : n_out < 3) {
                picked[n++] = i;
                n_in += want[i];
                n_out += !want[i];
            }
        ck_assert_int_eq(n, 6);
        usleep(300000); /* each ran its release past the suspect window */
        for (int k = 0; k < 6; k++) {
            stop(picked[k]);
            spawn(picked[k]);
        }
        ports();
        for (int k = 0; k < 6; k++)
            keep[picked[k]] = want[picked[k]];
        settle("restarted 3 hosts in the step, 3 outside", 2, 1, want, keep, 1);
        for (int k = 0; k < 6; k++)
            ck_assert_int_eq(hosts[picked[k]].seen_bucket, hosts[picked[k]].bucket);
    }

    /* Release 3 to 10% and 50%, then aborted: back to release 2. */
    kernel_file("fleet.ptx", 103);
    hkt_run_cli(tmp, "rollout start --dir www/fleet --key hotkern.key --module " MODULE
                     " --release 3 --steps 10,50,100 fleet.ptx");
    for (int i = 0; i < HOSTS; i++) {
        keep[i] = 0;
        want[i] = hosts[i].bucket < 1000;
    }
    settle("release 3, step 1 (10%)", 3, 2, want, keep, 1);
    hkt_run_cli(tmp, "rollout advance --dir www/fleet --key hotkern.key");
    int took = 0;
    for (int i = 0; i < HOSTS; i++) {
        keep[i] = want[i];
        want[i] = hosts[i].bucket < 5000;
        took += want[i];
    }
    settle("release 3, step 2 (50%)", 3, 2, want, keep, 1);
    double t_abort = now_ms();
    hkt_run_cli(tmp, "rollout abort --dir www/fleet --key hotkern.key");
    for (int i = 0; i < HOSTS; i++)
        keep[i] = !want[i]; /* those that never took 3 stay on 2 throughout */
    double back = settle("release 3 aborted", 2, 3, all, keep, 1);
    printf("cpu_fleet: abort to all %d hosts back on release 2 (%d had taken release 3): %.0f ms "
           "(%.0f ms with the abort command)\n",
           HOSTS, took, back, now_ms() - t_abort);

    for (int i = 0; i < HOSTS; i++) {
        stop(i);
        if (hosts[i].c)
            curl_easy_cleanup(hosts[i].c);
    }
    hkt_nginx_stop(nginx);
    printf("cpu_fleet: %d hosts started in %.0f ms; the whole run %.0f ms\n", HOSTS, t_up - t_start,
           now_ms() - t_start);
    hkt_rmtree(tmp);
    free(tmp);
    hk_report_clear(&rep);
}
END_TEST

/* ---- threshold signatures and rotation ---------------------------------- */

/* Scrapes every host of the threshold fleet until each runs `release`, has
 * counted at least `refused` signature refusals (0: any) and trusts key
 * list `keys` (-1: any). At every scrape a host runs `release` or `other`,
 * never anything else. */
static void all_hosts(const char *what, long long release, long long other, long long refused,
                      long long keys) {
    double end = now_ms() + DEADLINE;
    for (;;) {
        int done = 1;
        char late[8192] = "";
        for (int i = 0; i < nhosts; i++) {
            int st;
            ck_assert_msg(waitpid(hosts[i].pid, &st, WNOHANG) == 0, "%s exited", hosts[i].id);
            /* release -1: any (a host restarted on a release without a rollout
             * reports none until it takes another). */
            if (!scrape(i) || (release >= 0 && hosts[i].release < 0)) {
                done = 0;
                continue;
            }
            ck_assert_msg(release < 0 || hosts[i].release == release || hosts[i].release == other,
                          "%s: %s runs release %lld", what, hosts[i].id, hosts[i].release);
            if ((release >= 0 && hosts[i].release != release) ||
                (refused && sig_refusals[i] < refused) || (keys >= 0 && keys_version[i] != keys)) {
                done = 0;
                snprintf(late + strlen(late), sizeof late - strlen(late),
                         " %.23s(release %lld, signature refusals %lld, keys v%lld)", hosts[i].id,
                         hosts[i].release, sig_refusals[i], keys_version[i]);
            }
        }
        if (done) {
            printf("cpu_fleet: %-52s all %d hosts\n", what, nhosts);
            return;
        }
        ck_assert_msg(now_ms() < end, "%s: not every host after %d ms:%s", what, DEADLINE, late);
        usleep(100000);
    }
}

/* nginx's ETag and Last-Modified are the file's size and mtime in seconds:
 * two same-sized manifests published within one second look unchanged
 * (hotkern sign --help). Each publish comes in a second of its own. */
static void publish(const char *args) {
    static time_t last;
    while (time(NULL) <= last)
        usleep(50000);
    hkt_run_cli(tmp, "%s", args);
    last = time(NULL);
}

START_TEST(threshold_and_rotation) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    pid_t nginx;
    hk_report rep = HK_REPORT_INIT;
    nhosts = THRESHOLD_HOSTS;
    ntrust = 3;
    threshold_k = 2;
    refusals_ok = 1;
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    snprintf(www, sizeof www, "%s/www", tmp);
    char dir[8192];
    snprintf(dir, sizeof dir, "%s/hosts", tmp);
    ck_assert_int_eq(mkdir(www, 0755), 0);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    for (int k = 0; k < 4; k++) { /* a.key ... d.key; hosts trust a, b, c */
        hkn_seckey key;
        char path[PATH_MAX + 16];
        ck_assert_int_eq(hkn_keygen(&key), 0);
        snprintf(path, sizeof path, "%s/%c.key", tmp, 'a' + k);
        ck_assert_int_eq(hkn_seckey_save(path, &key, &rep), 0);
        snprintf(path, sizeof path, "%s/%c.pub", tmp, 'a' + k);
        ck_assert_int_eq(hkn_pubkey_save(path, &key.pub, &rep), 0);
        if (k < 3)
            snprintf(trust_files[k], sizeof trust_files[k], "%s", path);
    }
    int port = hkt_nginx_start(www, tmp, NULL, &nginx);
    ck_assert_msg(port > 0, "nginx did not start");
    snprintf(url, sizeof url, "http://127.0.0.1:%d/fleet/manifest.json", port);
    kernel_file("fleet.ptx", 101);
    publish("sign --key a.key --key b.key --module " MODULE
            " --release 1 --out www/fleet fleet.ptx");
    for (int i = 0; i < nhosts; i++) {
        snprintf(hosts[i].id, sizeof hosts[i].id, "host-%03d", i);
        snprintf(dir, sizeof dir, "%s/hosts/%.23s", tmp, hosts[i].id);
        ck_assert_int_eq(mkdir(dir, 0700), 0);
        spawn(i);
    }
    ports();
    all_hosts("release 1, signed by A and B (2 of 2)", 1, 0, 0, 0); /* 0: none yet */

    /* k-1 of k: refused by every host, each keeping release 1. */
    kernel_file("fleet.ptx", 102);
    publish("sign --key a.key --module " MODULE " --release 2 --out www/fleet fleet.ptx");
    all_hosts("release 2 signed by A alone: refused (signature)", 1, 1, 1, 0);
    /* Co-signed by C: the same bytes, taken by all. */
    publish("cosign --key c.key www/fleet/manifest.json");
    all_hosts("release 2 co-signed by C: taken", 2, 1, 1, 0);

    /* The rotation: B, C and D, two required, signed by B and C. */
    publish("keys sign --key b.key --key c.key --list-version 2 --threshold 2 "
            "--out www/fleet b.pub c.pub d.pub");
    all_hosts("key list v2 (B, C, D) taken without a restart", 2, 2, 1, 2);
    kernel_file("fleet.ptx", 103);
    publish("sign --key a.key --key b.key --module " MODULE
            " --release 3 --out www/fleet fleet.ptx");
    all_hosts("release 3 by retired A and B: refused", 2, 2, 2, 2);
    kernel_file("fleet.ptx", 104);
    publish("sign --key c.key --key d.key --module " MODULE
            " --release 4 --out www/fleet fleet.ptx");
    all_hosts("release 4 by C and D: taken", 4, 2, 2, 2);

    /* Restarted with the key list gone from the origin: kept in the state. */
    snprintf(dir, sizeof dir, "%s/fleet/keys.json", www);
    ck_assert_int_eq(unlink(dir), 0);
    for (int i = 0; i < 2; i++) {
        stop(i);
        spawn(i);
    }
    ports();
    all_hosts("2 hosts restarted: still key list v2", -1, -1, 0, 2);
    kernel_file("fleet.ptx", 105);
    publish("sign --key a.key --key b.key --module " MODULE
            " --release 5 --out www/fleet fleet.ptx");
    all_hosts("release 5 by A and B: refused, restarted hosts too", -1, -1, 1, 2);
    for (int i = 0; i < nhosts; i++)
        ck_assert_msg(hosts[i].release != 5, "%s took release 5", hosts[i].id);
    kernel_file("fleet.ptx", 106);
    publish("sign --key d.key --key b.key --module " MODULE
            " --release 6 --out www/fleet fleet.ptx");
    all_hosts("release 6 by D and B: taken", 6, 4, 1, 2);

    for (int i = 0; i < nhosts; i++) {
        stop(i);
        if (hosts[i].c)
            curl_easy_cleanup(hosts[i].c);
    }
    hkt_nginx_stop(nginx);
    hkt_rmtree(tmp);
    free(tmp);
    hk_report_clear(&rep);
}
END_TEST

/* ---- the stable release, for hosts outside the step -------------------- */

#define STABLE_HOSTS 20 /* and two that join */

/* Waits until every host runs release 2 where want[i], 1 elsewhere, with
 * in_step as want[i]. At every scrape: no host outside the step runs 2, no
 * host of the step runs 1, and only a host restarted or new (fresh[i])
 * runs nothing, before its first poll. Returns the time it took, in ms. */
static double settle_fresh(const char *what, const int *want, const int *fresh) {
    double t0 = now_ms();
    for (;;) {
        int done = 1;
        char late[4096] = "";
        for (int i = 0; i < nhosts; i++) {
            struct host *h = &hosts[i];
            int st;
            ck_assert_msg(waitpid(h->pid, &st, WNOHANG) == 0, "%s exited (status %d)", h->id, st);
            if (!scrape(i) || h->release < 0) {
                done = 0;
                continue;
            }
            ck_assert_msg(h->release == (want[i] ? 2 : 1) || (fresh[i] && h->release == 0),
                          "%s: %s (bucket %u, %s the step%s) runs release %lld", what, h->id,
                          h->bucket, want[i] ? "in" : "outside", fresh[i] ? ", restarted" : "",
                          h->release);
            if (h->release != (want[i] ? 2 : 1) || h->in_step != want[i]) {
                done = 0;
                snprintf(late + strlen(late), sizeof late - strlen(late),
                         " %.23s(release %lld, in_step %lld)", h->id, h->release, h->in_step);
            }
        }
        double ms = now_ms() - t0;
        if (done) {
            printf("cpu_fleet: %-44s every host on its side in %.0f ms\n", what, ms);
            return ms;
        }
        ck_assert_msg(ms < DEADLINE, "%s: not settled after %d ms:%s", what, DEADLINE, late);
        usleep(100000);
    }
}

/* A host id, not yet taken, whose bucket is (inside) below 3000 or not. */
static void joiner(struct host *h, int inside) {
    for (int k = 0;; k++) {
        snprintf(h->id, sizeof h->id, "joiner-%d", k);
        h->bucket = hkn_fleet_bucket(h->id, MODULE);
        if ((h->bucket < 3000) == inside)
            return;
    }
}

START_TEST(outside_hosts_restarted_bare_run_the_stable_release) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    pid_t nginx;
    hkn_seckey key;
    hk_report rep = HK_REPORT_INIT;
    nhosts = STABLE_HOSTS;
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    snprintf(www, sizeof www, "%s/www", tmp);
    snprintf(key_path, sizeof key_path, "%s/hotkern.key", tmp);
    snprintf(pub_path, sizeof pub_path, "%s/hotkern.pub", tmp);
    char dir[8192];
    snprintf(dir, sizeof dir, "%s/hosts", tmp);
    ck_assert_int_eq(mkdir(www, 0755), 0);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(hkn_keygen(&key), 0);
    ck_assert_int_eq(hkn_seckey_save(key_path, &key, &rep), 0);
    ck_assert_int_eq(hkn_pubkey_save(pub_path, &key.pub, &rep), 0);
    int port = hkt_nginx_start(www, tmp, NULL, &nginx);
    ck_assert_msg(port > 0, "nginx did not start");
    snprintf(url, sizeof url, "http://127.0.0.1:%d/fleet/manifest.json", port);
    kernel_file("fleet.ptx", 101);
    hkt_run_cli(tmp,
                "sign --key hotkern.key --module " MODULE " --release 1 --out www/fleet fleet.ptx");
    static int want[HOSTS], fresh[HOSTS], none[HOSTS], all[HOSTS];
    int n_in = 0;
    for (int i = 0; i < STABLE_HOSTS + 2; i++) {
        struct host *h = &hosts[i];
        if (i < STABLE_HOSTS) {
            snprintf(h->id, sizeof h->id, "host-%03d", i);
            h->bucket = hkn_fleet_bucket(h->id, MODULE);
        } else {
            joiner(h, i == STABLE_HOSTS);
        }
        snprintf(dir, sizeof dir, "%s/hosts/%.23s", tmp, h->id);
        ck_assert_int_eq(mkdir(dir, 0700), 0);
        want[i] = h->bucket < 3000;
        n_in += i < STABLE_HOSTS && want[i];
        all[i] = 1;
    }
    ck_assert_msg(n_in >= 1 && STABLE_HOSTS - n_in >= 4, "%d of the hosts in 30%%", n_in);
    for (int i = 0; i < nhosts; i++)
        spawn(i);
    ports();
    settle("release 1 (no rollout)", 1, 1, all, none, 1);

    kernel_file("fleet.ptx", 102);
    publish("rollout start --dir www/fleet --key hotkern.key --module " MODULE
            " --steps 30,100 fleet.ptx");
    settle("release 2, step 1 (30%)", 2, 1, want, none, 1);

    /* Killed: four hosts outside the step and one of it, each restarted
     * without its last-known-good directory; two of those outside keep
     * their anti-rollback state (they catch up with the manifest it
     * records), the others have none (the manifest is new to them). */
    int picked[5], n = 0, n_out = 0, in = 0, outside = 0;
    for (int i = 0; i < STABLE_HOSTS && n < 5; i++)
        if (want[i] ? !in : n_out < 4) {
            picked[n++] = i;
            in += want[i];
            n_out += !want[i];
        }
    ck_assert_int_eq(n, 5);
    usleep(300000); /* each ran its release past the suspect window */
    for (int k = 0; k < 5; k++) {
        struct host *h = &hosts[picked[k]];
        int st;
        kill(h->pid, SIGKILL);
        ck_assert_int_eq(waitpid(h->pid, &st, 0), h->pid);
        ck_assert(WIFSIGNALED(st));
        h->no_lkg = 1;
        fresh[picked[k]] = 1;
        if (want[picked[k]] || outside++ % 2) {
            char st_dir[8192];
            snprintf(st_dir, sizeof st_dir, "%s/hosts/%.23s/state", tmp, h->id);
            hkt_rmtree(st_dir);
        }
        spawn(picked[k]);
    }
    /* Two new hosts, one on each side of the step, with nothing. */
    for (int i = STABLE_HOSTS; i < STABLE_HOSTS + 2; i++) {
        hosts[i].no_lkg = 1;
        fresh[i] = 1;
        spawn(i);
    }
    nhosts = STABLE_HOSTS + 2;
    ports();
    settle_fresh("5 hosts killed and restarted bare, 2 joined", want, fresh);
    for (int i = 0; i < nhosts; i++)
        if (fresh[i])
            ck_assert_msg(hosts[i].applied == 1 && hosts[i].errors == 0,
                          "%s (restarted) applied %lld releases, %lld errors", hosts[i].id,
                          hosts[i].applied, hosts[i].errors);
    /* Two polls more each (304s): nothing changes. */
    long long polls[HOSTS];
    for (int i = 0; i < nhosts; i++)
        polls[i] = hosts[i].polls;
    for (double end = now_ms() + DEADLINE;;) {
        int done = 1;
        for (int i = 0; i < nhosts; i++) {
            ck_assert(scrape(i));
            ck_assert_msg(hosts[i].release == (want[i] ? 2 : 1), "%s left its release %d",
                          hosts[i].id, want[i] ? 2 : 1);
            ck_assert_msg(!fresh[i] || hosts[i].applied == 1, "%s applied again", hosts[i].id);
            done &= hosts[i].polls >= polls[i] + 2;
        }
        if (done)
            break;
        ck_assert_msg(now_ms() < end, "the hosts did not poll twice more in %d ms", DEADLINE);
        usleep(100000);
    }

    publish("rollout advance --dir www/fleet --key hotkern.key");
    settle("release 2, step 2 (100%)", 2, 1, all, want, 1);

    for (int i = 0; i < nhosts; i++) {
        stop(i);
        if (hosts[i].c)
            curl_easy_cleanup(hosts[i].c);
    }
    hkt_nginx_stop(nginx);
    hkt_rmtree(tmp);
    free(tmp);
    hk_report_clear(&rep);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("fleet");
    TCase *tc = tcase_create("loopback");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, rollout_across_100_hosts);
    tcase_add_test(tc, threshold_and_rotation);
    tcase_add_test(tc, outside_hosts_restarted_bare_run_the_stable_release);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

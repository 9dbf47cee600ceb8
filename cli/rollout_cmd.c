/*
 * hotkern rollout's entry: its options (one table for every subcommand),
 * its help, the usage rules that span subcommands, and the dispatch: watch
 * to cli/watch.c, the others to cli/rollout.c (hkc_rollout_run). Kept apart
 * from both so that watch, which publishes through rollout.c, is not called
 * back by it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/rollout.h"

static const char help[] =
    "usage: hotkern rollout start --dir DIR KEYS --module M [--release N]\n"
    "         (--steps P,P,... [--bake S] | --steps-file FILE) [--expires-in S]\n"
    "         [--arch sm_XX] [--build-for sm_XY,...] [--json] FILE...\n"
    "       hotkern rollout advance --dir DIR KEYS [--force] [--expires-in S] [--json]\n"
    "       hotkern rollout pause|resume|abort --dir DIR KEYS [--expires-in S] [--json]\n"
    "       hotkern rollout status --dir DIR [--pubkey FILE] [--prometheus URL [GATE...]]\n"
    "         [--json]\n"
    "       hotkern rollout watch --dir DIR KEYS --prometheus URL [--interval S]\n"
    "         [GATE...] [--expires-in S] [--json]\n"
    "       hotkern rollout start|advance|abort|watch|status ... --endpoints FILE [PUSH...]\n"
    "         (watch: --prometheus optional)\n"
    "  KEYS: --key SECRET [--key SECRET...] (1 to 8: each signs every manifest)\n"
    "  GATE: [--gate QUERY]... [--min-reporting F] [--hosts N] [--lookback S]\n"
    "        [--max-age S] [--prometheus-token T]\n\n"
    "Rolls a release out to a fleet of pullers in steps, through the static origin\n"
    "directory DIR that an HTTP server (nginx, a CDN) serves them (docs/ROLLOUT.md).\n"
    "Each command signs a newer manifest of DIR (its version one above the last):\n"
    "  start    FILE... as release N (default: the new manifest's version), at step 1\n"
    "           of --steps (percents of hosts, never decreasing, each baking --bake\n"
    "           seconds, default 0) or of --steps-file (a JSON array of {\"percent\",\n"
    "           \"hosts\": [ids], \"labels\": [..], \"bake_s\"}); the manifest it replaces\n"
    "           is kept as DIR/previous-manifest.json, the release abort goes back to,\n"
    "           and its artifacts ride along (start, advance, pause, resume) as the\n"
    "           stable release that hosts outside the step running neither take.\n"
    "           Refused while another release is before its last step. --build-for\n"
    "           sm_80,sm_90 ships cubins of the CUDA C built here, as sign's does.\n"
    "  advance  the next step, once the current one baked its bake_s (--force: now)\n"
    "  pause    the same step, marked paused (advance refuses); resume unmarks it\n"
    "  abort    the previous release's artifacts, marked aborted: every host that\n"
    "           took the release goes back to the previous one\n"
    "  status   what DIR's manifest says: release, previous, steps, the current one;\n"
    "           with --prometheus, per step the hosts on the release, those that\n"
    "           refused it (and why), those on the previous one, on another, and those\n"
    "           expected but not reporting, and the gate's verdict\n"
    "  watch    every --interval seconds (default 30) evaluates the gate at the\n"
    "           current step: while it holds with the step's hosts on the release for\n"
    "           the step's bake_s, advances; at the last step, ends (exit 0); when it\n"
    "           fails, aborts (exit 1); when it is unknown, pauses, and resumes once\n"
    "           it holds again. Each decision is printed with its time and reason\n"
    "           (--json: one JSON object per line, then the command's document).\n"
    "A host takes the release when its bucket (a hash of its host id and the\n"
    "module, 0 to 9999) is below 100 x the percent of the current step or an earlier\n"
    "one, or when such a step names its id or one of its labels. The manifests\n"
    "expire after --expires-in seconds (default 30 days); the current manifest (and\n"
    "previous-manifest.json) must verify with the public key of one --key.\n"
    "Each --key signs every manifest the command publishes: one key writes one bare\n"
    "signature (what hosts of 1.4 read), several write one 'KEYID SIGNATURE' line\n"
    "each, so a fleet whose hosts need k of n keys (signature_threshold) takes each\n"
    "step with k --key given (watch: to every change it publishes); with fewer,\n"
    "its hosts refuse the step (reason signature) until 'hotkern cosign' adds the\n"
    "missing lines.\n"
    "The gate asks Prometheus's HTTP API (URL: its base, http://prometheus:9090)\n"
    "about the hosts' own metrics. It fails when any of its queries returns a\n"
    "sample with a value above 0: by default a refusal of the release (hotkern_\n"
    "rollout_last_refused_release, and hotkern_rollout_refusals_total since the\n"
    "step began), context loss or launch errors since the step began on hosts that\n"
    "run it; each --gate QUERY (PromQL; $MODULE, $RELEASE, $PREVIOUS, $STEP_AGE,\n"
    "the step's age as '120s', and $WINDOW, that plus --max-age, are replaced) is\n"
    "one more. Missing data never passes: the gate is unknown when Prometheus does\n"
    "not answer or scrapes nothing yet, knows fewer hosts than --min-reporting x\n"
    "--hosts N (the fleet's size), or when fewer than --min-reporting (a fraction,\n"
    "default 1.0) of the hosts the steps so far hold report. A host is known when\n"
    "its hotkern_host_info was scraped within --lookback S (default 3600), and\n"
    "reports while its last sample is at most --max-age S old (default: twice the\n"
    "longest scrape interval, plus 1 s).\n"
    "A push fleet (--endpoints FILE, one 'HOST_ID URL [LABEL,...]' a line, the id and\n"
    "labels as the host's own, its bucket the same): start, advance and abort also\n"
    "push DIR's manifest, signed as `hotkern push` sends one, to the hosts of the\n"
    "steps so far that lack it (abort: to every host that took the release),\n"
    "--concurrency at once (default 16), a host that does not answer tried\n"
    "--retries more times (default 2); each reply is that host's acknowledgement\n"
    "or refusal, kept in DIR/push-state.json. advance refuses until every host of\n"
    "the step acknowledged; watch pushes and asks the hosts each interval, aborts\n"
    "on a refusal, pauses while a host does not answer (missing data), and with\n"
    "--prometheus also runs the --gate queries. status --endpoints shows the\n"
    "replies per step.\n" HKC_JSON_HELP
    "Exit status: 0 done, 1 refused, failed or aborted, 2 usage.\n";

static const char *const names[] = {"start", "advance", "pause", "resume",
                                    "abort", "status",  "watch"};

/* The options that only status --prometheus and watch take, when given
 * elsewhere: usage errors. */
static int gate_usage(hkc_out *o, const char *sub, const hkc_rollout_args *a) {
    int gate = a->gates.n || a->min_reporting || a->hosts || a->lookback_s || a->max_age_s ||
               a->prom_token;
    int status = !strcmp(sub, "status"), watch = !strcmp(sub, "watch");
    if (!status && !watch && (a->prometheus || gate || a->interval_s))
        return hkc_usage(o, "--prometheus, --interval and the gate's options are status's and "
                            "watch's");
    if (status && a->interval_s)
        return hkc_usage(o, "--interval is watch's");
    if (watch && !a->prometheus && !a->endpoints)
        return hkc_usage(o, "watch needs --prometheus URL (a pull fleet) or --endpoints FILE (a "
                            "push fleet)");
    if (a->endpoints && (!strcmp(sub, "pause") || !strcmp(sub, "resume")))
        return hkc_usage(o, "pause and resume push nothing: --endpoints is start's, advance's, "
                            "abort's, status's and watch's");
    if (!a->endpoints && (a->concurrency || a->retries != UINT64_MAX || a->http.cacert ||
                          a->http.insecure || a->http.timeout_s || a->token_given))
        return hkc_usage(o, "--concurrency, --retries, --token, --cacert, --insecure and "
                            "--timeout are a push fleet's: give --endpoints FILE");
    if ((status || watch) && gate && !a->prometheus)
        return hkc_usage(o, "the gate's options need --prometheus URL");
    return 0;
}

/* The rules every subcommand's options follow, then the subcommand. */
static int dispatch(hkc_out *o, const char *sub, hkc_rollout_args *a, char **files, int nfiles) {
    int status = !strcmp(sub, "status"), start = !strcmp(sub, "start");
    int watch = !strcmp(sub, "watch"), rc;
    if (!a->dir)
        return hkc_usage(o, "--dir DIR is required");
    if (!status && !a->keys.n)
        return hkc_usage(o, "--key SECRET is required");
    if (a->keys.n > HKN_MAX_KEYS)
        return hkc_usage(o, "give 1 to %d --key SECRET", HKN_MAX_KEYS);
    if (!start && (nfiles || a->module || a->steps || a->steps_file || a->release || a->build_for))
        return hkc_usage(o, "FILE..., --module, --release, --build-for and the steps are start's");
    if (start && !!a->steps == !!a->steps_file)
        return hkc_usage(o, "give --steps or --steps-file");
    if (status && (a->keys.n || a->force))
        return hkc_usage(o, "status takes --dir, --pubkey, --prometheus, the gate's options "
                            "and --json");
    if (watch && (a->force || a->pubkey))
        return hkc_usage(o, "watch takes no --force (it advances after each bake) and no "
                            "--pubkey (the --key's verify)");
    if ((rc = gate_usage(o, sub, a)))
        return rc;
    if (!a->lookback_s)
        a->lookback_s = 3600;
    if (!a->concurrency)
        a->concurrency = 16;
    if (a->retries == UINT64_MAX)
        a->retries = 2;
    if (!a->http.timeout_s)
        a->http.timeout_s = 120;
    if (!a->http.token)
        a->http.token = getenv("HOTKERN_TOKEN");
    if (!watch)
        return hkc_rollout_run(o, sub, a, files, nfiles);
    if (!a->interval_s)
        a->interval_s = 30;
    return hkc_rollout_watch(o, a);
}

/* --min-reporting F: a fraction in (0, 1]. */
static int min_share(hkc_out *o, hkc_rollout_args *a) {
    a->min_share = 1.0;
    if (!a->min_reporting)
        return 0;
    char *end;
    errno = 0;
    double f = strtod(a->min_reporting, &end);
    if (errno || end == a->min_reporting || *end || !(f > 0 && f <= 1))
        return hkc_usage(o, "--min-reporting needs a fraction above 0, at most 1 (0.95)");
    a->min_share = f;
    return 0;
}

int hkc_cmd_rollout(int argc, char **argv) {
    hkc_rollout_args a = {.expires_in = 30 * 86400, .prom_timeout_s = 10, .retries = UINT64_MAX};
    int nargs = 0;
    char cmd[32];
    hkc_out o;
    const char *sub = argc > 1 ? argv[1] : "";
    int known = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        known |= !strcmp(sub, names[i]);
    if (!known) {
        if (!strcmp(sub, "--help") || !strcmp(sub, "-h")) {
            fputs(help, stdout);
            return 0;
        }
        hkc_out_init(&o, "rollout");
        for (int i = 1; i < argc; i++)
            if (!strcmp(argv[i], "--json"))
                hkc_out_json(&o);
        return hkc_finish(&o, hkc_usage(&o,
                                        "%s%s%s: give start, advance, pause, resume, abort, "
                                        "status or watch",
                                        sub[0] ? "unknown subcommand '" : "no subcommand", sub,
                                        sub[0] ? "'" : ""));
    }
    snprintf(cmd, sizeof cmd, "rollout %s", sub);
    const hkc_opt opts[] = {
        HKC_STRING_OPT("--dir", &a.dir),
        HKC_LIST_OPT("--key", &a.keys),
        HKC_STRING_OPT("--module", &a.module),
        HKC_UINT_OPT("--release", &a.release, 1, HKC_MAX_RELEASE,
                     "--release needs an integer from 1 to 2^53-1"),
        HKC_STRING_OPT("--steps", &a.steps),
        HKC_STRING_OPT("--steps-file", &a.steps_file),
        HKC_UINT_OPT("--bake", &a.bake, 0, HKN_MAX_LIFETIME_S,
                     "--bake needs seconds from 0 to 31622400"),
        HKC_UINT_OPT("--expires-in", &a.expires_in, 1, HKN_MAX_LIFETIME_S,
                     "--expires-in needs seconds from 1 to 31622400 (366 days)"),
        HKC_STRING_OPT("--arch", &a.arch),
        HKC_STRING_OPT("--build-for", &a.build_for),
        HKC_STRING_OPT("--pubkey", &a.pubkey),
        HKC_FLAG_OPT("--force", &a.force),
        HKC_STRING_OPT("--prometheus", &a.prometheus),
        HKC_STRING_OPT("--prometheus-token", &a.prom_token),
        HKC_LIST_OPT("--gate", &a.gates),
        HKC_UINT_OPT("--interval", &a.interval_s, 1, 86400,
                     "--interval needs seconds from 1 to 86400"),
        HKC_STRING_OPT("--min-reporting", &a.min_reporting),
        HKC_UINT_OPT("--hosts", &a.hosts, 1, 10000000, "--hosts needs a count from 1 to 10^7"),
        HKC_UINT_OPT("--lookback", &a.lookback_s, 1, HKN_MAX_LIFETIME_S,
                     "--lookback needs seconds from 1 to 31622400"),
        HKC_UINT_OPT("--max-age", &a.max_age_s, 1, 86400,
                     "--max-age needs seconds from 1 to 86400"),
        HKC_STRING_OPT("--endpoints", &a.endpoints),
        HKC_UINT_OPT("--concurrency", &a.concurrency, 1, 1024,
                     "--concurrency needs a count from 1 to 1024"),
        HKC_UINT_OPT("--retries", &a.retries, 0, 100, "--retries needs a count from 0 to 100"),
        HKC_HTTP_OPTS(&a.http),
        HKC_JSON_OPT(&a.json),
    };
    int rc = hkc_parse(&o, cmd, opts, HKC_NOPTS(opts), help, argc - 1, argv + 1, &nargs);
    a.token_given = a.http.token != NULL;
    if (rc == HKC_CONTINUE && !(rc = min_share(&o, &a)))
        rc = dispatch(&o, sub, &a, argv + 2, nargs);
    hkc_list_free(&a.gates);
    hkc_list_free(&a.keys);
    return hkc_finish(&o, rc);
}

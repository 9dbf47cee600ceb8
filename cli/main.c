/*
 * hotkern: command-line front end. Dispatches to one function per subcommand
 * (cli/cli.h); each prints its own --help. The JSON output that check, push,
 * status, rollback and pull give with --json is described here, in one
 * place, since cli/out.c builds its common part for all of them.
 *
 * Built without the network library (HK_NO_NET, `make NET=0`), the network
 * commands are listed still, and each says it is not there.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "hotkern/hotkern.h"

struct cmd {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
};

#ifdef HK_NO_NET
/* A network command of a build without the network library: exit 1, as an
 * operation that failed (HK_ERR_UNSUPPORTED, also under --json). */
static int no_net(int argc, char **argv) {
    hkc_out o;
    hkc_out_init(&o, argv[0]);
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--json"))
            hkc_out_json(&o);
    return hkc_finish(&o, hkc_fail(&o, HK_ERR_UNSUPPORTED, NULL,
                                   "built without network support (rebuild hotkern with NET=1 "
                                   "and the network packages)"));
}
#define NET_CMD(fn) no_net
#else
#define NET_CMD(fn) fn
#endif

static const struct cmd cmds[] = {
    {"check", hkc_cmd_check, "compile and validate kernel files for a target architecture"},
    {"keygen", NET_CMD(hkc_cmd_keygen), "create an Ed25519 key pair for signing releases"},
    {"sign", NET_CMD(hkc_cmd_sign), "build a signed release directory a static origin can serve"},
    {"publish", NET_CMD(hkc_cmd_sign), "same as sign"},
    {"cosign", NET_CMD(hkc_cmd_cosign), "add signatures to a published manifest or key list"},
    {"keys", NET_CMD(hkc_cmd_keys), "sign a key list that replaces the keys hosts trust"},
    {"push", NET_CMD(hkc_cmd_push), "sign kernel files and push them to a running endpoint"},
    {"status", NET_CMD(hkc_cmd_status), "print the status of a running endpoint"},
    {"rollback", NET_CMD(hkc_cmd_rollback), "ask a running endpoint to roll a module back"},
    {"pull", NET_CMD(hkc_cmd_pull), "poll a release origin, verify and save the artifacts"},
    {"rollout", NET_CMD(hkc_cmd_rollout), "roll a release out to a fleet of pullers in steps"},
};

static const char json_help[] =
    "\n"
    "--json (check, push, status, rollback, pull, rollout) prints one JSON document on one\n"
    "line of stdout instead of text, errors included; the exit status is the same.\n"
    "Every document has:\n"
    "  ok (bool), command, exit (0 ok, 1 refused or failed, 2 usage),\n"
    "  error (\"HK_ERR_...\" or null; usage errors are HK_ERR_INVALID), code (the\n"
    "  HK_ERR_* value, 0 when ok), message (null when ok), log (compiler/JIT log\n"
    "  or null).\n"
    "Once the arguments are understood (exit 0 or 1) it also has, null where\n"
    "they do not apply:\n"
    "  check     arch, files: [{file, ok, format, kernels, demangled (each\n"
    "            kernel's C++ name, null for C names), archs (the image's: a\n"
    "            cubin's, a fatbin's, the one CUDA C was built for), error, code,\n"
    "            message, log, diagnostics: [{file, line, severity, message}]}]\n"
    "  push      url, module, release, outcome, http_status, engine_version,\n"
    "            build_ms, stage_ms, commit_ms\n"
    "  rollback  outcome, http_status, module, release (the release that runs\n"
    "            after it), engine_version (the engine's number of that image)\n"
    "  status    url, http_status, endpoint (the endpoint's GET /v1/status answer)\n"
    "  pull      url, applied: [{module, release, format, size, sha256, headers}],\n"
    "            poll_errors: [{poll, error, code, message}], stats: {requests,\n"
    "            not_modified, errors, refused, applied}\n"
    "  rollout   dir, module, manifest_version, release, target_release (the\n"
    "            previous one once aborted), previous, created, expires, rollout\n"
    "            (bool), step, baked_s, paused, aborted, steps: [{percent, bake_s,\n"
    "            hosts, labels}]; status --prometheus adds fleet: {known_hosts,\n"
    "            expected, reporting, on_release, steps: [{step, hosts, on_release,\n"
    "            refused: [{host, release, reason}], on_previous, other,\n"
    "            not_reporting}], outside, gate: {state, settled, reason, ...}};\n"
    "            watch prints a JSON line per decision ({time, unix, step, steps,\n"
    "            release, decision, reason}) before its document\n"
    "A failure's error, code, message and log are the first error met: the\n"
    "endpoint's for a refused push, the first failing file's for check.\n";

static void usage(FILE *f, int full) {
    fprintf(f, "usage: hotkern COMMAND [ARGS...]\n       hotkern --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-9s %s\n", cmds[i].name, cmds[i].summary);
    fprintf(f, "\n'hotkern COMMAND --help' describes each. Exit status: 0 ok, 1 refused or "
               "failed, 2 usage.\n");
#ifdef HK_NO_NET
    fprintf(f, "Built without network support: the commands but check say so and exit 1.\n");
#endif
    if (full)
        fputs(json_help, f);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout, argc >= 2);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("hotkern %s\n", hk_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name))
            return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "hotkern: unknown command '%s'\n", argv[1]);
    usage(stderr, 0);
    return 2;
}

/*
 * hotkern: command-line front end. Dispatches to one function per subcommand
 * (cli/cli.h); each prints its own --help.
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

static const struct cmd cmds[] = {
    {"check", hkc_cmd_check, "compile and validate kernel files for a target architecture"},
    {"keygen", hkc_cmd_keygen, "create an Ed25519 key pair for signing releases"},
    {"sign", hkc_cmd_sign, "build a signed release directory a static origin can serve"},
    {"publish", hkc_cmd_sign, "same as sign"},
    {"push", hkc_cmd_push, "sign kernel files and push them to a running endpoint"},
    {"status", hkc_cmd_status, "print the status of a running endpoint"},
    {"rollback", hkc_cmd_rollback, "ask a running endpoint to roll a module back"},
    {"pull", hkc_cmd_pull, "poll a release origin, verify and save the artifacts"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: hotkern COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-9s %s\n", cmds[i].name, cmds[i].summary);
    fprintf(f, "\n'hotkern COMMAND --help' describes each. Exit status: 0 ok, 1 refused or "
               "failed, 2 usage.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("hotkern %d.%d.%d\n", HK_VERSION_MAJOR, HK_VERSION_MINOR, HK_VERSION_PATCH);
        return 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name))
            return cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "hotkern: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

/*
 * A stand-in for compute-sanitizer, for tests/cpu_canary.c: it takes the
 * command line hotkern gives the real one,
 *
 *   fake-compute-sanitizer --tool memcheck --error-exitcode N --print-limit P
 *       [--OPTION VALUE ...] [--log-file PATH] TARGET [ARGS...]
 *
 * and does what the real one does that the canary relies on: it starts
 * TARGET as its child, prints its banner and each memory error the target's
 * kernels make to the log (lines prefixed with "========= ", a report's
 * details indented), at most P reports, then "ERROR SUMMARY", and exits
 * with N when there were errors (else with the target's status). The
 * errors come from the fake driver (libhotkern-fakecuda.so, HKFAKE_OOB):
 * the target finds a pipe's end in HKFAKE_MEMCHECK_FD and writes each
 * report there, unprefixed, as the real tool's injected library reports to
 * its front end; so the target must keep that descriptor (the canary's
 * memcheck helper runs with --keep-fds 1).
 *
 * Environment:
 *   HKSAN_ARGV   a file to write its command line to, one argument a line
 *   HKSAN_MODE   "fail": says it cannot run and exits 1 without a target;
 *                "hard": a reported kernel's launch fails even under
 *                --destroy-on-device-error kernel (an imprecise error, which
 *                always ends the context);
 *                "quiet": reports nothing but the exit status (and the
 *                launch fails, as "hard");
 *                "overflow": says its error buffer overflowed before the
 *                first report, as the real one does with many errors;
 *                "dropped": says so instead of any report (every record
 *                dropped)
 *
 * As the real tool: with --destroy-on-device-error kernel a reported
 * kernel is ended and the target's launch succeeds; without it (the
 * default, "context") the launch fails.
 *
 * An option it does not know, or --tool other than memcheck, is an error
 * (exit 1), as a command line the real tool refuses would be. Built as
 * BUILD/stub/fake-compute-sanitizer (not a suite).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static FILE *logf_;

static void say(const char *line) {
    fprintf(logf_, "========= %s\n", line);
    fflush(logf_);
}

int main(int argc, char **argv) {
    static const char *const known[] = {"--tool",
                                        "--error-exitcode",
                                        "--print-limit",
                                        "--show-backtrace",
                                        "--report-api-errors",
                                        "--log-file",
                                        "--destroy-on-device-error",
                                        NULL};
    const char *tool = NULL, *log = NULL, *mode = getenv("HKSAN_MODE"), *argv_file;
    int exitcode = 0, limit = 0, i = 1, soft = 0;
    for (; i < argc && !strncmp(argv[i], "--", 2); i += 2) {
        int ok = 0;
        for (int k = 0; known[k]; k++)
            ok |= !strcmp(argv[i], known[k]);
        if (!ok || i + 1 >= argc) {
            fprintf(stderr, "========= Error: unknown option %s\n", argv[i]);
            return 1;
        }
        if (!strcmp(argv[i], "--tool"))
            tool = argv[i + 1];
        else if (!strcmp(argv[i], "--error-exitcode"))
            exitcode = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--print-limit"))
            limit = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--log-file"))
            log = argv[i + 1];
        else if (!strcmp(argv[i], "--destroy-on-device-error")) {
            if (strcmp(argv[i + 1], "kernel") && strcmp(argv[i + 1], "context")) {
                fprintf(stderr, "========= Error: bad --destroy-on-device-error %s\n", argv[i + 1]);
                return 1;
            }
            soft = !strcmp(argv[i + 1], "kernel");
        }
    }
    if (mode && (!strcmp(mode, "hard") || !strcmp(mode, "quiet")))
        soft = 0;
    if ((argv_file = getenv("HKSAN_ARGV"))) {
        FILE *f = fopen(argv_file, "w");
        for (int k = 0; f && k < argc; k++)
            fprintf(f, "%s\n", argv[k]);
        if (f)
            fclose(f);
    }
    logf_ = log ? fopen(log, "w") : stdout;
    if (!logf_ || !tool || strcmp(tool, "memcheck") || i >= argc) {
        fprintf(stderr, "========= Error: bad command line\n");
        return 1;
    }
    say("COMPUTE-SANITIZER");
    if (mode && !strcmp(mode, "fail")) {
        say("Error: the fake sanitizer cannot run here");
        return 1;
    }
    int p[2];
    if (pipe(p) < 0)
        return 1;
    char fd[16];
    snprintf(fd, sizeof fd, "%d", p[1]);
    pid_t child = fork();
    if (child < 0)
        return 1;
    if (child == 0) {
        close(p[0]);
        setenv("HKFAKE_MEMCHECK_FD", fd, 1);
        if (soft)
            setenv("HKFAKE_MEMCHECK_SOFT", "1", 1);
        execv(argv[i], argv + i);
        _exit(127);
    }
    close(p[1]);
    FILE *in = fdopen(p[0], "r");
    char line[1024];
    int errors = 0;
    while (in && fgets(line, sizeof line, in)) {
        line[strcspn(line, "\n")] = '\0';
        int report = line[0] != ' ';
        errors += report;
        int dropped = mode && !strcmp(mode, "dropped");
        if (report && errors == 1 && mode && (!strcmp(mode, "overflow") || dropped))
            say("Warning: Error buffer overflow has been detected. Some records have been "
                "dropped");
        if (dropped)
            continue;
        if ((errors <= limit || limit == 0) && !(mode && !strcmp(mode, "quiet")))
            say(line);
    }
    int st = 0;
    waitpid(child, &st, 0);
    char sum[64];
    snprintf(sum, sizeof sum, "ERROR SUMMARY: %d error%s", errors, errors == 1 ? "" : "s");
    say(sum);
    if (errors && exitcode)
        return exitcode;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

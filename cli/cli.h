/*
 * The hotkern command-line tool: one entry function per subcommand, and what
 * the subcommands share: one option parser (a table per subcommand, with
 * shared option sets as macros) and one output path that writes either text
 * for people or, with --json, one JSON document on stdout for scripts.
 *
 * Each entry function takes the arguments after the subcommand name (argv[0]
 * is the subcommand) and returns the process exit status: 0 success, 1 the
 * operation was refused or failed (compile error, refused push ...), 2 usage
 * error. The tool is single-threaded; nothing here is thread-safe.
 */
#ifndef HK_CLI_H
#define HK_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "hotkern/hotkern.h"

struct cJSON;

/* Release versions are JSON integers: at most 2^53 - 1. */
#define HKC_MAX_RELEASE 9007199254740991ull

#define HKC_MAX_INPUT (256u << 20) /* largest kernel file the tool reads */

int hkc_cmd_check(int argc, char **argv);    /* cli/check.c */
int hkc_cmd_keygen(int argc, char **argv);   /* cli/net_cmds.c */
int hkc_cmd_sign(int argc, char **argv);     /* cli/net_cmds.c (alias publish) */
int hkc_cmd_push(int argc, char **argv);     /* cli/net_cmds.c */
int hkc_cmd_status(int argc, char **argv);   /* cli/http.c */
int hkc_cmd_rollback(int argc, char **argv); /* cli/http.c */
int hkc_cmd_pull(int argc, char **argv);     /* cli/net_cmds.c */
int hkc_cmd_rollout(int argc, char **argv);  /* cli/rollout.c */
int hkc_cmd_cosign(int argc, char **argv);   /* cli/keys_cmd.c */
int hkc_cmd_keys(int argc, char **argv);     /* cli/keys_cmd.c */

/* ---- output (cli/out.c) ------------------------------------------------ */

/* Where a subcommand's results and errors go. In text mode results are
 * printed as they come (stdout) and errors as "hotkern CMD: ..." lines
 * (stderr). In JSON mode (--json) nothing is printed until hkc_finish, which
 * writes one document on one line of stdout:
 *   {"ok": bool, "command": "push", "exit": 0|1|2,
 *    "error": "HK_ERR_..." | null, "code": int, "message": str | null,
 *    "log": str | null, ...the subcommand's own fields}
 * Usage errors are "HK_ERR_INVALID" with exit 2. The first error recorded is
 * the one reported. */
typedef struct hkc_out {
    const char *cmd;   /* subcommand name, for messages */
    int json;          /* 1: --json was given */
    struct cJSON *doc; /* the document (JSON mode only); owned */
    int failed;        /* an error was recorded */
} hkc_out;

void hkc_out_init(hkc_out *o, const char *cmd);
/* Switches o to JSON mode (hkc_parse does, when it sees --json). */
void hkc_out_json(hkc_out *o);
/* Back to text mode, the document dropped (after --help). */
void hkc_out_text(hkc_out *o);
/* A usage error: text "hotkern CMD: MSG (see 'hotkern CMD --help')".
 * Returns 2. */
int hkc_usage(hkc_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A failure with an HK_ERR_* code and an optional compiler log (copied):
 * text "hotkern CMD: HK_ERR_NAME: MSG" (and the log). Returns 1. */
int hkc_fail(hkc_out *o, int err, const char *log, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same from a report (rep->error, rep->message, rep->log). Returns 1. */
int hkc_fail_report(hkc_out *o, const hk_report *rep);
/* Sets a field of the document (replacing one of the same name), taking
 * ownership of item; NULL item sets null. No-op in text mode (item freed). */
void hkc_set(hkc_out *o, const char *key, struct cJSON *item);
/* Shorthands of hkc_set: a string (NULL: null) and an exact integer. */
void hkc_set_str(hkc_out *o, const char *key, const char *s);
void hkc_set_int(hkc_out *o, const char *key, long long v);
/* An integer item printed exactly (NULL when out of memory). */
struct cJSON *hkc_int(long long v);
/* Sets each listed field to null, so that a document always carries them;
 * the list ends with NULL. */
void hkc_declare(hkc_out *o, ...);
/* Writes text (NULL: nothing) to f with every byte that could drive a
 * terminal shown as \xNN instead: C0 controls (but LF and tab when
 * multiline), DEL, C1 controls and bytes that are no well-formed UTF-8. For
 * strings that come from a server. */
void hkc_put_clean(FILE *f, const char *text, int multiline);
/* Writes the JSON document (JSON mode) and frees it. Returns status. */
int hkc_finish(hkc_out *o, int status);

/* ---- options (cli/opts.c) ---------------------------------------------- */

typedef enum hkc_opt_kind {
    HKC_FLAG,    /* sets *(int *)dst to 1 */
    HKC_STRING,  /* *(const char **)dst = the value (not empty) */
    HKC_UINT,    /* *(uint64_t *)dst = the value, decimal, in [min, max] */
    HKC_LIST,    /* appends the value to *(hkc_list *)dst */
    HKC_REFUSED, /* a usage error whenever given; `why` says what to use */
} hkc_opt_kind;

/* Values of a repeated option; free v with hkc_list_free. */
typedef struct hkc_list {
    const char **v;
    int n;
} hkc_list;

typedef struct hkc_opt {
    const char *name; /* "--release"; NULL for a short-only option */
    char letter;      /* short form "-I DIR" / "-IDIR"; 0 for none */
    hkc_opt_kind kind;
    void *dst;
    uint64_t min, max; /* HKC_UINT range */
    const char *why;   /* the usage message of a value out of range, or of a
                        * refused option */
} hkc_opt;

/* Starts subcommand cmd: initialises o (hkc_out_init), then parses
 * argv[1..argc-1] against opts: "--name VALUE", "--name=VALUE", "-X VALUE",
 * "-XVALUE", "-h"/"--help" (prints help to stdout), "--" (the rest are
 * operands). Options and operands may be mixed; the operands are moved, in
 * order, to argv[1..*noperands]. When opts names "--json" it is honoured
 * before anything else is parsed, so that usage errors come as JSON too.
 * Returns HKC_CONTINUE to go on, 0 when help was shown, 2 after a usage
 * error (reported through o). */
#define HKC_CONTINUE (-1)
int hkc_parse(hkc_out *o, const char *cmd, const hkc_opt *opts, int nopts, const char *help,
              int argc, char **argv, int *noperands);
void hkc_list_free(hkc_list *l);

/* Table entries: a flag, a string, an integer in [lo, hi] (`msg` is the
 * usage message when it is not), a repeated option. */
#define HKC_FLAG_OPT(nm, p)                                                                        \
    { .name = (nm), .kind = HKC_FLAG, .dst = (p) }
#define HKC_STRING_OPT(nm, p)                                                                      \
    { .name = (nm), .kind = HKC_STRING, .dst = (p) }
#define HKC_UINT_OPT(nm, p, lo, hi, msg)                                                           \
    { .name = (nm), .kind = HKC_UINT, .dst = (p), .min = (lo), .max = (hi), .why = (msg) }
#define HKC_LIST_OPT(nm, p)                                                                        \
    { .name = (nm), .kind = HKC_LIST, .dst = (p) }
#define HKC_JSON_OPT(flag) HKC_FLAG_OPT("--json", flag)
#define HKC_NOPTS(a)       ((int)(sizeof(a) / sizeof((a)[0])))
#define HKC_JSON_HELP      "  --json         print one JSON document on stdout (see 'hotkern --help')\n"

/* ---- HTTP client (cli/http.c) ------------------------------------------ */

/* The connection options of push, status and rollback. */
typedef struct hkc_http_opts {
    const char *token;  /* bearer token; default $HOTKERN_TOKEN */
    const char *cacert; /* CA file for https:// */
    int insecure;       /* 1: no certificate verification */
    uint64_t timeout_s; /* whole request */
} hkc_http_opts;

#define HKC_HTTP_OPTS(ho)                                                                          \
    HKC_STRING_OPT("--token", &(ho)->token), HKC_STRING_OPT("--cacert", &(ho)->cacert),            \
        HKC_FLAG_OPT("--insecure", &(ho)->insecure),                                               \
        HKC_UINT_OPT("--timeout", &(ho)->timeout_s, 1, 86400,                                      \
                     "--timeout needs seconds from 1 to 86400")

#define HKC_HTTP_HELP                                                                              \
    "  --token T      send 'Authorization: Bearer T' (or set HOTKERN_TOKEN)\n"                     \
    "  --cacert FILE  trust this CA/certificate for https:// URLs\n"                               \
    "  --insecure     do not verify the server's certificate (testing only)\n"                     \
    "  --timeout S    give up after S seconds (default 120; status 30)\n"

/* An HTTP answer: the body (NUL-terminated, owned) and the status. */
typedef struct hkc_resp {
    long status; /* HTTP status, or -1 when no answer came */
    char *data;
    size_t len;
    size_t max; /* hkc_resp_write's limit; 0: 16 MiB (answers are small JSON) */
} hkc_resp;

/* libcurl's write callback for an hkc_resp (CURLOPT_WRITEDATA): appends,
 * keeping data NUL-terminated; past r->max bytes, or out of memory, it
 * takes nothing and the transfer ends with CURLE_WRITE_ERROR. */
size_t hkc_resp_write(char *p, size_t size, size_t nmemb, void *ud);
/* base + path, without the slashes base may end with (owned; NULL: out of
 * memory). */
char *hkc_route_url(const char *base, const char *path);

/* Sets the options every request of the tool shares on a libcurl easy
 * handle (CURL *): timeouts, protocols, TLS as ho says, the body into r,
 * libcurl's error text into err (CURL_ERROR_SIZE bytes, kept by the
 * caller for the transfer's length). For callers that drive their own
 * transfers (cli/push_fleet.c's multi handle). */
void hkc_http_setup(void *curl, const hkc_http_opts *ho, char *err, hkc_resp *r);

/* One request to base + path (body NULL for GET). Returns 0 with r->status
 * set, or 1 with the transport failure reported through o as
 * HK_ERR_NETWORK. r->data is the caller's to free either way. */
int hkc_http(hkc_out *o, const char *method, const char *base, const char *path, const char *body,
             const hkc_http_opts *ho, hkc_resp *r);
/* The same with a body of len bytes (any bytes) declared as Content-Type
 * ctype, sent from body without a copy. */
int hkc_http_body(hkc_out *o, const char *method, const char *base, const char *path,
                  const void *body, size_t len, const char *ctype, const hkc_http_opts *ho,
                  hkc_resp *r);
/* What the tool asked an endpoint for, which its answer may leave out: the
 * module (a release refused before it verified names none), the release
 * (what push signed, what a signed rollback names; 0 unknown), and whether
 * it is a rollback, whose answer's "version" is the engine's version of the
 * image, not a release. */
typedef struct hkc_asked {
    const char *module;
    uint64_t release;
    int rollback;
} hkc_asked;

/* Reports an endpoint's answer to a release or rollback (push, rollback):
 * text lines, or the fields outcome, http_status, module, release (the
 * release that runs after a rollback), engine_version, build_ms, stage_ms,
 * commit_ms, and on a refusal the endpoint's error, code, message and log.
 * Returns the exit status. */
int hkc_report_outcome(hkc_out *o, const hkc_resp *r, const hkc_asked *asked);

/* ---- signing keys (cli/keys_cmd.c) ------------------------------------- */

struct hkn_seckey;
/* Loads each --key of paths (1 to HKN_MAX_KEYS of them) into keys, which
 * has room for HKN_MAX_KEYS; the caller wipes them (sodium_memzero). 0 or
 * an exit status (2: none or too many). */
int hkc_keys_load(hkc_out *o, const hkc_list *paths, struct hkn_seckey *keys);
/* The signature file of text signed by keys[0..nkeys), in *sig: with one
 * key *sig is kept as it is (the bare signature that hkn_release_sign and
 * hkn_manifest_sign write, which hosts of 1.4 read); with several it is
 * replaced (freed) by one "KEYID SIGNATURE" line of each key, in order,
 * each ending in a newline (net/keys.c). *sig stays the caller's to free.
 * 0 or an exit status. */
int hkc_sign_lines(hkc_out *o, const struct hkn_seckey *keys, int nkeys, const char *text,
                   size_t len, char **sig);

/* ---- --build-for (cli/buildfor.c) --------------------------------------- */

struct hkn_blob;
/* The cubins --build-for made: their names and bytes, which the blobs
 * appended point into. */
typedef struct hkc_built hkc_built;
/* Compiles each CUDA C blob of blobs[0..*n) for each architecture of list
 * ("sm_80,sm_90"), appending a cubin blob for each (arch, source and
 * toolkit set) up to max blobs in all; *out owns their bytes
 * (hkc_built_free, after the blobs' last use). Returns 0, 2 for a usage
 * error, 1 for a build that failed (its compiler log reported): then
 * nothing is appended. */
int hkc_build_for(hkc_out *o, const char *list, struct hkn_blob *blobs, size_t *n, size_t max,
                  hkc_built **out);
void hkc_built_free(hkc_built *b); /* b may be NULL */

#endif

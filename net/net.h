/*
 * net/: what crosses files inside the network subsystem.
 *
 * Three layers, bottom up:
 *   release.c   keys, manifests, Ed25519 signatures, SHA-256 checks and the
 *               persisted highest accepted version per module (anti-replay,
 *               state.c), the releases the engine refused (refused.c),
 *               the binary push body (frame.c), and the strict JSON and
 *               names all of them read (json.c, the lowest);
 *   endpoint.c  the libmicrohttpd push/status/metrics server (with
 *               endpoint_admit.c and endpoint_handlers.c: net/endpoint.h);
 *   pull.c      the libcurl poller of a static origin.
 * None of them calls the swap engine. They hand verified artifacts to an
 * hkn_engine (a table of callbacks), which api.c wires to hk_swap and friends
 * and which tests replace with a recorder. This keeps the network code
 * testable on machines without a GPU and keeps the engine's locking out of
 * the HTTP threads' way: the engine applies, the network only hands over.
 *
 * Names here are internal (hkn_ prefix) and never leave the shared library.
 */
#ifndef HK_NET_H
#define HK_NET_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hotkern/hotkern.h"
#include "hotkern/net.h"
#include "base/abi.h"
#include "util/util.h"

/* First layouts of the public network structures (see base/abi.h). */
#define HKN_ENDPOINT_OPTIONS_SIZE0 HKB_END(hk_endpoint_options, swap)
#define HKN_PULL_OPTIONS_SIZE0     HKB_END(hk_pull_options, swap)
#define HKN_PULL_STATS_SIZE0       HKB_END(hk_pull_stats, last_message)

/* ---- what the endpoint and the puller share ---------------------------- */

/* A field of an options structure whose zero value means its default. */
typedef struct hkn_field {
    size_t off, size;
} hkn_field;
#define HKN_FIELD(type, f)                                                                         \
    { offsetof(type, f), sizeof(((type *)0)->f) }

/* Each listed field of o that is zero (a 0 number, a NULL pointer: all
 * bytes zero on every platform hotkern builds for) takes its value in
 * defaults: how hkn_endpoint_start and hkn_pull_create read the options
 * their _init_size functions fill. */
static inline void hkn_zero_defaults(void *o, const void *defaults, const hkn_field *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char *p = (unsigned char *)o + f[i].off;
        size_t k = 0;
        while (k < f[i].size && !p[k])
            k++;
        if (k == f[i].size)
            memcpy(p, (const unsigned char *)defaults + f[i].off, f[i].size);
    }
}

/* One metrics family of one unlabelled sample. */
static inline void hkn_metric(hk_metrics_writer *w, const char *name, const char *type,
                              const char *help, uint64_t v) {
    hk_metrics_family(w, name, type, help);
    hk_metrics_sample(w, name, NULL, NULL, v);
}

/* ---- the engine seen from the network ---------------------------------- */

/* Applies one verified artifact as release `version` of `module`, with the
 * release's verified header artifacts as in-memory headers (named by their
 * artifact names; n may be 0). `bytes` and the headers are valid during the
 * call only. Returns 0 when committed, else a negative HK_ERR_* with rep
 * filled (message, log). Called from a network thread (an endpoint connection
 * thread or the puller thread), never concurrently for one source. */
typedef int (*hkn_apply_fn)(void *ud, const char *module, uint64_t version, hk_format fmt,
                            const void *bytes, size_t size, const hk_header *headers, int nheaders,
                            const char *origin, hk_report *rep);
/* The same, with the artifact's file name as the manifest names it
 * ("game.cu"), so that the build's messages name the file the publisher
 * wrote ("game.cu(8): error ..."). When an engine has it, it is called
 * instead of apply. */
typedef int (*hkn_apply_named_fn)(void *ud, const char *module, uint64_t version, const char *name,
                                  hk_format fmt, const void *bytes, size_t size,
                                  const hk_header *headers, int nheaders, const char *origin,
                                  hk_report *rep);
/* Rolls `module` back to its previous image; with `check`, only when that
 * image belongs to release `target` (else HK_ERR_REJECTED, nothing changed),
 * checked by the engine in the same step. 0 or a negative HK_ERR_*. */
typedef int (*hkn_rollback_fn)(void *ud, const char *module, int check, uint64_t target,
                               hk_report *rep);
/* The release of `module`'s image `back` steps back in the engine's kept
 * history (0: the one it runs, 1: the one a rollback commits), as
 * hk_module_release: 0, HK_ERR_NOT_FOUND or HK_ERR_NO_HISTORY. */
typedef int (*hkn_release_fn)(void *ud, const char *module, int back, uint64_t *release);
/* The engine's current version number of `module` (0 when none). */
typedef uint64_t (*hkn_version_fn)(void *ud, const char *module);
/* The whole metrics text (hk_metrics_text_alloc), malloc'd: the caller
 * frees it. NULL when it cannot be made. */
typedef char *(*hkn_metrics_fn)(void *ud, size_t *len);
/* One log line of `subsystem`; called on the source's threads, possibly
 * under the source's locks (hk_log's rules). */
typedef void (*hkn_log_fn)(void *ud, hk_log_level level, const char *subsystem, const char *text);
/* 1 when a level is wanted (hk_log_enabled), so that unwanted lines are not
 * formatted. */
typedef int (*hkn_log_on_fn)(void *ud, hk_log_level level);
/* The index-th quarantined image of the engine (hk_quarantine_get): 0, or
 * HK_ERR_NOT_FOUND past the last. */
typedef int (*hkn_quarantine_fn)(void *ud, int index, hk_quarantine *out);

typedef struct hkn_shipped hkn_shipped;

typedef struct hkn_engine {
    hkn_apply_fn apply;           /* required */
    hkn_rollback_fn rollback;     /* NULL: rollback answers HK_ERR_UNSUPPORTED */
    hkn_version_fn version;       /* optional */
    hkn_metrics_fn metrics;       /* optional: without it GET /metrics answers 503 */
    hkn_log_fn log;               /* optional: without it nothing is logged */
    hkn_log_on_fn log_on;         /* optional: NULL wants every level */
    void *ud;                     /* passed to each */
    const char *arch;             /* preferred artifact arch, e.g. "sm_90"; may be NULL */
    hkn_quarantine_fn quarantine; /* optional: /v1/status lists the quarantine */
    hkn_release_fn release;       /* optional: /v1/status names the releases the
                                   * engine runs and would roll back to */
    /* optional: preferred to apply (the build's messages name the file) */
    hkn_apply_named_fn apply_named;
    /* Binaries a publisher built (--build-for, net/shipped.c): NULL uses them
     * where they run on arch; else why this engine builds the source
     * instead (its build options differ from the publisher's). */
    const char *no_shipped;
    hkn_shipped *shipped; /* optional: what each module runs, for the metrics */
} hkn_engine;

/* Formats a line (on the stack) and hands it to e->log, when e has one and
 * wants the level (net/release.c). */
void hkn_log(const hkn_engine *e, hk_log_level level, const char *subsystem, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- reports ----------------------------------------------------------- */

/* Reports are filled with hku_fail and cleared with hk_report_clear (in
 * base/format.c, which the fuzz targets build with net/); whole files and
 * copies are shared with libhotkern too (util/util.h). */

/* ---- keys -------------------------------------------------------------- */

#define HKN_PK_BYTES     32 /* crypto_sign_PUBLICKEYBYTES */
#define HKN_SK_BYTES     64 /* crypto_sign_SECRETKEYBYTES */
#define HKN_SIG_BYTES    64 /* crypto_sign_BYTES */
#define HKN_KEY_ID_CHARS 16 /* hex of the first 8 bytes of SHA-256(public key) */

typedef struct hkn_pubkey {
    unsigned char pk[HKN_PK_BYTES];
    char id[HKN_KEY_ID_CHARS + 1];
} hkn_pubkey;

typedef struct hkn_seckey {
    unsigned char sk[HKN_SK_BYTES];
    hkn_pubkey pub;
} hkn_seckey;

/* Initialises libsodium once; safe from any thread. 0 or HK_ERR_UNSUPPORTED. */
int hkn_crypto_init(void);
int hkn_keygen(hkn_seckey *out);
/* Key files hold one line: the key in lowercase hex (64 chars for a public key,
 * 128 for a secret key) or in standard base64 (44 or 88 chars). Secret key
 * files are written with mode 0600. */
int hkn_pubkey_load(const char *path, hkn_pubkey *out, hk_report *rep);
int hkn_seckey_load(const char *path, hkn_seckey *out, hk_report *rep);
int hkn_pubkey_save(const char *path, const hkn_pubkey *k, hk_report *rep);
int hkn_seckey_save(const char *path, const hkn_seckey *k, hk_report *rep);
/* Decodes a key/signature given as hex or base64 text into exactly `len` bytes. */
int hkn_decode_fixed(const char *text, size_t tlen, unsigned char *out, size_t len);

/* ---- manifests --------------------------------------------------------- */

typedef struct hkn_artifact {
    char name[128];
    char sha256[65]; /* lowercase hex */
    uint64_t size;
    hk_format format; /* AUTO for a header */
    char arch[16];    /* "sm_90" or "" */
    int header;       /* 1: "format": "header", a header that CUDA C
                       * artifacts include by this name; never applied */
    char source[128]; /* a binary the publisher built (--build-for): the
                       * name of the artifact it was built from; else "" */
    char toolkit[32]; /* what built it, "nvrtc 13.0"; else "" */
} hkn_artifact;

/* ---- rollouts (net/rollout.c) ------------------------------------------ */

/* The steps of a release (docs/ROLLOUT.md): the manifest's optional
 * "rollout" object, {"release", "previous", "step", "steps": [{"percent",
 * "hosts", "labels", "bake_s"}], "paused", "aborted"}. */
struct cJSON;

#define HKN_ROLLOUT_MAX_STEPS 32
#define HKN_ROLLOUT_MAX_NAMES 256 /* hosts, or labels, of one step */
#define HKN_HOST_ID_MAX       128 /* a host id is shorter than this */
#define HKN_LABEL_MAX         64  /* a label is shorter than this */
#define HKN_MAX_LABELS        16  /* labels of one host */
#define HKN_BUCKETS           10000

typedef struct hkn_rollout_step {
    unsigned percent; /* 0 to 100: hosts whose bucket is below percent * 100 */
    uint64_t bake_s;  /* how long the step bakes before the next (for the publisher) */
    char **hosts;     /* owned: host ids named */
    size_t nhosts;
    char **labels; /* owned: labels named */
    size_t nlabels;
} hkn_rollout_step;

typedef struct hkn_rollout {
    int present;             /* 0: the manifest has no rollout (every host takes it) */
    uint64_t release;        /* the release rolled out */
    uint64_t previous;       /* the release the fleet ran before (0: none) */
    unsigned step;           /* the current step, an index of steps */
    hkn_rollout_step *steps; /* owned: hkn_rollout_free */
    size_t nsteps;
    int paused;  /* the publisher holds the step (hosts decide as before) */
    int aborted; /* the artifacts are previous's: every host goes back to it */
} hkn_rollout;

/* 1: s is a host id, [A-Za-z0-9_.:@-], 1 to HKN_HOST_ID_MAX - 1 bytes. */
int hkn_valid_host_id(const char *s);
/* 1: s is a host label, [A-Za-z0-9_.:=/-], 1 to HKN_LABEL_MAX - 1 bytes. */
int hkn_valid_label(const char *s);
/* Reads the "rollout" member obj into out, every field checked (a bad one
 * named in rep: HK_ERR_INVALID). On failure out holds nothing. */
int hkn_rollout_parse(const struct cJSON *obj, hkn_rollout *out, hk_report *rep);
/* The checks of hkn_rollout_parse on a rollout built in memory (the CLI's,
 * before it signs one). 0 or HK_ERR_INVALID. */
int hkn_rollout_validate(const hkn_rollout *r, hk_report *rep);
/* Adds r as root's "rollout" member (nothing when !r->present); 0 or
 * HK_ERR_NOMEM. */
int hkn_rollout_add(struct cJSON *root, const hkn_rollout *r);
/* A deep copy (dst is the caller's to hkn_rollout_free); 0 or HK_ERR_NOMEM. */
int hkn_rollout_copy(hkn_rollout *dst, const hkn_rollout *src);
void hkn_rollout_free(hkn_rollout *r);
/* 1 when a host of this bucket (0 to HKN_BUCKETS - 1), id and labels is in
 * the current step or an earlier one (steps are cumulative), or when r has
 * no rollout; else 0. */
int hkn_rollout_covers(const hkn_rollout *r, uint32_t bucket, const char *id,
                       const char *const *labels, size_t nlabels);
/* The release a host that takes the manifest runs: `version` without a
 * rollout, the rollout's release, or its previous one once aborted. */
uint64_t hkn_rollout_target(const hkn_rollout *r, uint64_t version);

/* ---- manifests, continued ---------------------------------------------- */

typedef struct hkn_manifest {
    char module[64];
    uint64_t version;         /* the manifest's serial: what the anti-rollback state records */
    int64_t created, expires; /* unix seconds */
    char key_id[HKN_KEY_ID_CHARS + 1];
    hkn_artifact *artifacts; /* owned: hkn_manifest_free */
    size_t nartifacts;
    hkn_rollout rollout; /* owned; present 0 without one */
    uint64_t release;    /* the release the engine records once applied
                          * (hkn_rollout_target): version without a rollout */
    /* The stable release's artifacts ("previous_artifacts", owned; 0 without
     * them): those of rollout.previous, signed with the rollout's release,
     * for the hosts outside the step that do not run it (net/fleet.c). Only
     * in a rollout that has a previous release and is not aborted. */
    hkn_artifact *previous_artifacts;
    size_t nprevious;
} hkn_manifest;

#define HKN_MAX_ARTIFACTS 16
/* A release may live at most a year, and may claim to be created at most
 * five minutes in the future (clocks of publisher and host differ). */
#define HKN_MAX_LIFETIME_S (366 * 86400)
#define HKN_CLOCK_SKEW_S   300

/* Parses manifest JSON; every field is checked for type and range. */
int hkn_manifest_parse(const char *json, size_t len, hkn_manifest *out, hk_report *rep);
/* Serialises with cJSON; *json (NUL-terminated, *len bytes) is the caller's to free(). */
int hkn_manifest_write(const hkn_manifest *m, char **json, size_t *len);
/* Writes m (its key_id set to key's) and signs the text: *json and *sig_b64
 * as hkn_release_sign's. The artifacts are m's as they are (the rollout
 * commands re-sign a release's artifacts at each step); m's fields are
 * checked as hkn_manifest_parse would read them back. */
int hkn_manifest_sign(const hkn_seckey *key, hkn_manifest *m, char **json, size_t *len,
                      char **sig_b64, hk_report *rep);
void hkn_manifest_free(hkn_manifest *m);
/* Makes m the stable release it carries, for a host outside the step
 * (HKN_GATE_STABLE): its artifacts become previous_artifacts (the
 * release's are freed) and m->release rollout.previous, so that what is
 * fetched, applied, recorded and remembered as refused is that release.
 * Nothing when m carries none. */
void hkn_manifest_take_stable(hkn_manifest *m);
/* "cuda", "ptx", "cubin", "fatbin" <-> hk_format; unknown text gives AUTO. */
hk_format hkn_format_parse(const char *s);
/* From a file name's extension (.cu .ptx .cubin .fatbin), else AUTO. */
hk_format hkn_format_from_name(const char *name);
/* 1 when a file name's extension is a header's (.h .cuh .hpp). */
int hkn_is_header_name(const char *name);
/* The header artifacts of m with their verified bytes (bytes[i], sizes[i]
 * parallel to m->artifacts) as in-memory headers in out (HKN_MAX_ARTIFACTS
 * entries); returns how many. The entries point into m and bytes. */
int hkn_release_headers(const hkn_manifest *m, const void *const *bytes, const size_t *sizes,
                        hk_header *out);

/* SHA-256 of bytes as 64 lowercase hex chars + NUL. */
void hkn_sha256_hex(const void *bytes, size_t size, char out[65]);

/* Builds and signs a release in memory: one artifact per file. *manifest and
 * *sig_b64 (base64 of the detached signature, NUL-terminated) are the caller's
 * to free(). */
typedef struct hkn_blob {
    const char *name;
    const void *bytes;
    size_t size;
    hk_format format;             /* AUTO: from the name (.h .cuh .hpp: a header) */
    const char *arch;             /* may be NULL */
    int header;                   /* 1: a header whatever the name */
    const char *source, *toolkit; /* a built binary's (hkn_artifact's); may be NULL */
} hkn_blob;
/* The manifest's entries of nblobs files (1 to HKN_MAX_ARTIFACTS) into arts:
 * names without their directories, hashes, formats (from the name unless
 * given; .h .cuh .hpp: a header). HK_ERR_INVALID, HK_ERR_FORMAT. */
int hkn_artifacts_from_blobs(const hkn_blob *blobs, size_t nblobs, hkn_artifact *arts,
                             hk_report *rep);
int hkn_release_sign(const hkn_seckey *key, const char *module, uint64_t version, int64_t created,
                     int64_t expires, const hkn_blob *blobs, size_t nblobs, char **manifest,
                     size_t *manifest_len, char **sig_b64, hk_report *rep);

/* ---- the binary push body (net/frame.c) ---------------------------------- */

/* POST /v1/release with this Content-Type carries a release as a frame of
 * lengths and raw bytes instead of JSON with base64 (layout: net/frame.c). */
#define HKN_FRAME_TYPE         "application/x-hotkern-release"
#define HKN_FRAME_VERSION      1
#define HKN_FRAME_HEAD         20 /* magic, version, count, manifest and signature lengths */
#define HKN_FRAME_MAX_MANIFEST (1 << 20)
#define HKN_FRAME_MAX_SIG      4096       /* HKN_MAX_SIGS lines of "KEYID SIGNATURE" */
#define HKN_FRAME_UNKNOWN      UINT64_MAX /* a body without a Content-Length */

/* A frame being received. Not thread-safe: one per request, fed from one
 * thread at a time. */
typedef struct hkn_frame {
    /* Once hkn_frame_end returned 0: the parts, pointing into buf (valid
     * until hkn_frame_free). art[i] is the manifest's artifact i. */
    const char *manifest;
    size_t manifest_len;
    const char *sig; /* the signature's text; sig_len 0: none */
    size_t sig_len;
    const unsigned char *art[HKN_MAX_ARTIFACTS];
    size_t art_len[HKN_MAX_ARTIFACTS];
    size_t nart;
    int done;
    int err;       /* sticky: the first error (HK_ERR_INVALID, _TOO_LARGE, _NOMEM or
                    * the admit function's) */
    char why[256]; /* its reason, one line */
    /* The parser's own. */
    size_t limit;      /* the whole frame's cap */
    uint64_t declared; /* the body's Content-Length, or HKN_FRAME_UNKNOWN */
    uint64_t total;    /* the frame's size, once its length table is read */
    uint64_t seen;     /* bytes fed */
    unsigned char head[HKN_FRAME_HEAD + 8 * HKN_MAX_ARTIFACTS];
    size_t head_len, head_need;
    int body;           /* the length table is read: bytes go to buf */
    unsigned char *buf; /* owned: manifest, signature and artifacts */
    size_t buf_len;     /* their size, from the length table */
    size_t buf_have;    /* received */
    size_t buf_cap;     /* allocated: grows with buf_have, at most buf_len */
} hkn_frame;

/* Asked before the buffer grows to `bytes` in all (at most the frame's
 * checked size; it grows with the bytes received, not with the declared
 * lengths): 0 to go on, or the error the frame then fails with. */
typedef int (*hkn_frame_admit_fn)(void *ud, size_t bytes);

/* Starts a frame of at most limit bytes in all, whose body is `declared`
 * bytes long (HKN_FRAME_UNKNOWN when chunked). */
void hkn_frame_init(hkn_frame *f, size_t limit, uint64_t declared);
/* Feeds the next n bytes of the body: 0, or f->err once a length or the
 * layout is wrong (nothing is allocated before the lengths are checked;
 * a failed frame holds no buffer). admit may be NULL. */
int hkn_frame_feed(hkn_frame *f, const void *data, size_t n, hkn_frame_admit_fn admit, void *ud);
/* The body ended: 0 when it held exactly one whole frame (the parts are
 * set), else HK_ERR_INVALID (truncated) or the earlier error. */
int hkn_frame_end(hkn_frame *f);
/* Frees the buffer; f may be NULL. f->why stays. */
void hkn_frame_free(hkn_frame *f);
/* Writes a frame of a signed release (the manifest's exact bytes, the
 * signature's text, the artifacts in the manifest's order). *out is the
 * caller's to free(). 0, HK_ERR_INVALID (a part out of range) or
 * HK_ERR_NOMEM. */
int hkn_frame_write(const char *manifest, size_t mlen, const char *sig, size_t slen,
                    const hkn_blob *blobs, size_t n, unsigned char **out, size_t *len);

/* ---- verification ------------------------------------------------------ */

#define HKN_MAX_KEYS 8

/* Which keys a source trusts: the ones it is configured with (immutable
 * once it runs), or a key list's (net/keys.c), read from the state at each
 * verification (hkn_trust_current). */
typedef struct hkn_trust {
    hkn_pubkey keys[HKN_MAX_KEYS];
    int nkeys;
    int allow_unsigned; /* 1: with no keys configured, skip the signature */
    int threshold;      /* distinct trusted keys a document needs; 0 means 1 */
    uint64_t version;   /* the key list's version; 0: the configured keys */
    int64_t expires;    /* the key list's expiry (unix seconds); 0: none */
} hkn_trust;

typedef struct hkn_state hkn_state;

/* Opens (creating) a state directory and loads accepted.json from it. dir NULL
 * keeps the state in memory only. Sources of one process that open the same
 * directory share one object (reference counted: each open needs a close).
 * Safe from any thread once open. */
int hkn_state_open(const char *dir, hkn_state **out, hk_report *rep);
void hkn_state_close(hkn_state *s);
/* Highest accepted release version of module (0 when none) into *out, as the
 * file says now (net/state.c). HK_ERR_IO when the state is corrupt. */
int hkn_state_lookup(hkn_state *s, const char *module, uint64_t *out, hk_report *rep);
/* The same, failing closed: UINT64_MAX when the state cannot be read. */
uint64_t hkn_state_get(hkn_state *s, const char *module);
/* Records version as accepted, merged into the file as it is now, persisted
 * atomically (temp file, fsync, rename, fsync of the directory) before
 * returning 0. A record at or above version, as the file has it now (another
 * process accepted a release since this one's check), refuses with
 * HK_ERR_REPLAY and writes nothing: the caller must not commit. */
int hkn_state_accept(hkn_state *s, const char *module, uint64_t version, hk_report *rep);
/* Takes back a record made by hkn_state_accept for a release the engine then
 * refused: sets module to `previous` only if its record is still `version`. */
int hkn_state_revert(hkn_state *s, const char *module, uint64_t version, uint64_t previous,
                     hk_report *rep);
/* Held by a source from the version check through the engine's commit to
 * the record, so that two sources of one process sharing the state cannot
 * commit out of order. Not recursive. */
void hkn_state_begin(hkn_state *s);
void hkn_state_end(hkn_state *s);
/* The default state directory of every source: $XDG_STATE_HOME/hotkern/
 * releases, else ~/.local/state/hotkern/releases (net/api.c). */
int hkn_default_state_dir(char *buf, size_t cap, hk_report *rep);
/* The accepted key list's text (net/keys.c): *text NULL when none; else
 * the caller's to free. HK_ERR_IO when it cannot be read. */
int hkn_state_keys_read(hkn_state *s, char **text, size_t *len, hk_report *rep);
/* Makes text (a key list of `version`, verified by the caller) the
 * state's, persisted atomically as DIR/keys.json; HK_ERR_REPLAY, writing
 * nothing, when the one recorded now is of that version or newer, as
 * version_of reads it (net/keys.c: -1 for text that does not read, which
 * refuses too). */
int hkn_state_keys_write(hkn_state *s, const char *text, size_t len, uint64_t version,
                         int64_t (*version_of)(const char *text, size_t len), hk_report *rep);
/* DIR/accepted.json, or NULL for a state in memory. Valid until close. */
const char *hkn_state_path(const hkn_state *s);

/* Verifies a manifest in the documented order: signature (when keys are
 * configured or unsigned input is not allowed) and key known -> parse ->
 * expiry (against `now`) -> version newer than the state's. `sig` is the
 * signature file's text (hex or base64); NULL or empty means missing. On
 * success *out holds the parsed manifest (hkn_manifest_free). */
int hkn_verify_manifest(const hkn_trust *t, hkn_state *s, const char *json, size_t len,
                        const char *sig, size_t sig_len, int64_t now, hkn_manifest *out,
                        hk_report *rep);
/* ---- threshold signatures and key lists (net/keys.c) ------------------ */

#define HKN_MAX_SIGS 16 /* lines of one signature file */

/* The key id of a public key (HKN_KEY_ID_CHARS hex chars). */
void hkn_key_id(const unsigned char pk[HKN_PK_BYTES], char id[HKN_KEY_ID_CHARS + 1]);
/* 0 when at least t->threshold (0: 1) distinct keys of t signed text
 * validly in the signature file's text `sig` (lines "KEYID SIGNATURE", or
 * one bare signature), else HK_ERR_SIGNATURE with the count, the valid and
 * the missing keys in rep. `what` names the document in the report;
 * claimed_id (may be NULL) is the key id the document claims, for the words
 * of a bare signature's refusal. *legacy (when not NULL) is set to the key
 * of a lone bare signature that verified, else NULL. */
int hkn_signatures_verify(const hkn_trust *t, const char *what, const char *text, size_t len,
                          const char *sig, size_t sig_len, const char *claimed_id,
                          const hkn_pubkey **legacy, hk_report *rep);
/* key's signature line of text, "KEYID BASE64\n". 0 or HK_ERR_UNSUPPORTED. */
int hkn_signature_line(const hkn_seckey *key, const char *text, size_t len, char line[160]);
/* The signature file `old` (may be empty) with key's signature of text
 * added (a line of the same key replaced; a bare line named bare_id, the
 * key id the document claims). *out is the caller's to free. */
int hkn_signatures_add(const hkn_seckey *key, const char *text, size_t len, const char *old,
                       size_t old_len, const char *bare_id, char **out, hk_report *rep);
/* A key list's text (docs/ROLLOUT.md, "Keys") into out: keys, threshold,
 * version, expires; every field checked (HK_ERR_INVALID). No signature is
 * checked here. */
int hkn_keylist_parse(const char *json, size_t len, hkn_trust *out, hk_report *rep);
/* l as a key list's text (*json the caller's to free). */
int hkn_keylist_write(const hkn_trust *l, char **json, size_t *len, hk_report *rep);
/* The keys in force: s's accepted key list, else *configured (s may be
 * NULL). HK_ERR_IO when the state's key list cannot be read (fail closed). */
int hkn_trust_current(const hkn_trust *configured, hkn_state *s, hkn_trust *out, hk_report *rep);
/* Verifies a key list against the keys in force (k of them, and k' of its
 * own), its version (greater: else HK_ERR_REPLAY) and expiry, and makes it
 * the state's (persisted before 0 is returned); *out is the list. */
int hkn_keylist_accept(const hkn_trust *configured, hkn_state *s, const char *json, size_t len,
                       const char *sig, size_t sig_len, int64_t now, hkn_trust *out,
                       hk_report *rep);
/* "key list v3: 2 of ID ID ID" (or "configured keys v0: ...") into buf. */
void hkn_trust_describe(const hkn_trust *t, char *buf, size_t cap);

/* Checks one artifact's size and SHA-256. */
int hkn_verify_artifact(const hkn_artifact *a, const void *bytes, size_t size, hk_report *rep);
/* Index of the artifact to apply: a cubin/fatbin whose arch runs on arch
 * (hkn_arch_runs_on: the same arch first, then the highest minor of the
 * same major), then a fatbin, then PTX, then CUDA C; never a header. */
size_t hkn_pick_artifact(const hkn_manifest *m, const char *arch);

/* ---- binaries built by the publisher (net/shipped.c) ------------------- */

/* 1 when a binary labelled `label` ("sm_80", "sm_90a") runs on a device of
 * `device` ("sm_86"), by CUDA's rule for cubins: the same major and a
 * minor at most the device's; an arch-specific ("a") or family ("f")
 * label only on its own arch. Anything unparsable: 0. */
int hkn_arch_runs_on(const char *label, const char *device);
/* The fields of binaries built by the publisher, checked after a parse:
 * `source` names a CUDA C or PTX artifact of m, a built artifact is a
 * cubin with an arch. HK_ERR_INVALID naming the artifact. */
int hkn_shipped_validate(const hkn_manifest *m, hk_report *rep);
/* The artifact e applies of m (hkn_pick_artifact, built binaries skipped
 * when e->no_shipped), and in *fallback the one it builds when that is a
 * built binary that fails to load (its source), else SIZE_MAX. */
size_t hkn_shipped_pick(const hkn_manifest *m, const hkn_engine *e, size_t *fallback);
/* need[i] = 1 for each artifact of m that e may use: the headers, the
 * pick and its fallback (a puller fetches those only). */
void hkn_shipped_needed(const hkn_manifest *m, const hkn_engine *e, int need[HKN_MAX_ARTIFACTS]);
/* 1 when err, from applying a binary, says it could not be loaded here (no
 * code for the device, an image the driver refuses, a driver older than
 * the toolkit that built it): the source is built instead. */
int hkn_shipped_load_failed(int err);

/* What each module of a source runs, for its metrics: own lock, any thread. */
int hkn_shipped_create(hkn_shipped **out); /* 0 or HK_ERR_NOMEM */
void hkn_shipped_destroy(hkn_shipped *s);  /* s may be NULL */
/* Module runs release's artifact a: a shipped binary (binary 1) or a local
 * build; fell_back 1 when a shipped binary failed to load first. s may be
 * NULL. */
void hkn_shipped_record(hkn_shipped *s, const char *module, const hkn_artifact *a, int binary,
                        int fell_back);
/* hotkern_release_image_info, hotkern_release_images_total and
 * hotkern_release_cubin_fallbacks_total. */
void hkn_shipped_metrics(hkn_shipped *s, hk_metrics_writer *w);

/* ---- refused releases (net/refused.c) ---------------------------------- */

/* The releases a source's engine refused for good, so that the same signed
 * bytes seen again are answered without a build or canary run. Bounded (the
 * least recently used entry goes); memory only; not thread-safe: one per
 * source, used from its applying thread. */
#define HKN_REFUSED_MAX        2048 /* entries in all (about 1 MiB) */
#define HKN_REFUSED_PER_MODULE 256  /* entries one module may hold */
#define HKN_REFUSED_MSG        320  /* bytes of the first refusal's message kept */

typedef struct hkn_refused hkn_refused;

/* 0 or HK_ERR_NOMEM. */
int hkn_refused_create(hkn_refused **out);
/* r may be NULL. */
void hkn_refused_destroy(hkn_refused *r);
/* 1 when err is the engine's verdict on the release's bytes (a build, a
 * validation, a canary or a quarantine refusal, a build or canary that
 * timed out), which the same bytes would get again; 0 for the state of the
 * host (busy, closing, memory, disk, driver, device). */
int hkn_refusal_is_final(int err);
/* The error of the remembered refusal of release `version` of module whose
 * identity is `hash` (hkn_release_identity, 64 hex chars), with its message into
 * message (cap bytes), or 0 when none is remembered. r may be NULL. */
int hkn_refused_find(hkn_refused *r, const char *module, uint64_t version, const char *hash,
                     char *message, size_t cap);
/* For an endpoint and a puller alike: the verified manifest's release
 * identity (into hash, 65 bytes) and, when that release (m->release) was
 * refused before, rep filled with that refusal and its error; else 0. */
int hkn_refused_check(hkn_refused *r, const hkn_manifest *m, const void *manifest, size_t len,
                      char hash[65], hk_report *rep);
/* Remembers a refusal (err != 0) of that release; r may be NULL. */
void hkn_refused_add(hkn_refused *r, const char *module, uint64_t version, const char *hash,
                     int err, const char *message);
/* How both sources end a verified release m (artifact bytes[i] of sizes[i]),
 * within the state's transaction: records its version as accepted in s
 * (before the engine commits), hands the artifact hkn_pick_artifact names
 * and the release's headers to e->apply, and, when the engine refuses,
 * takes the record back (not for HK_ERR_QUARANTINED with keep_quarantined:
 * that release stays seen) and remembers a final refusal in r, by mhash.
 * rep becomes the engine's report (its log owned), with m's module and
 * version. Returns 0 when committed, else the engine's error (*verdict,
 * when not NULL, set to 1) or the state's (*verdict 0: nothing was
 * applied, nothing recorded). */
int hkn_release_commit(const hkn_engine *e, hkn_state *s, hkn_refused *r, const hkn_manifest *m,
                       const void *const *bytes, const size_t *sizes, const char *mhash,
                       const char *origin, int keep_quarantined, int *verdict, hk_report *rep);
/* The engine's step of hkn_release_commit alone: hands the artifact and
 * headers to e as release m->release, rep becoming the engine's report.
 * For a host catching up with the manifest its state records already (a
 * restart, net/fleet.c): nothing to record, nothing to take back. */
int hkn_release_apply(const hkn_engine *e, const hkn_manifest *m, const void *const *bytes,
                      const size_t *sizes, const char *origin, hk_report *rep);
/* The identity of m's release for the refusals remembered (65 bytes): the
 * SHA-256 of the manifest's text, or for a manifest with a rollout (signed
 * anew at each step) that of its module, release and artifacts. */
void hkn_release_identity(const hkn_manifest *m, const void *manifest, size_t len, char hash[65]);

/* ---- a host of a fleet (net/fleet.c) ------------------------------------ */

/* Who a puller is (host id and labels), whether it takes a release now, and
 * its rollout metrics. One per puller; safe from any thread. */
typedef struct hkn_fleet hkn_fleet;

/* Why a release was refused: hotkern_rollout_refusals_total's reasons. */
#define HKN_REASONS 12

/* Resolves the host id (host_id, else $HOTKERN_HOST_ID, else
 * /etc/machine-id, else the host name) and labels (labels, else
 * $HOTKERN_HOST_LABELS; comma-separated). HK_ERR_INVALID for an id or a
 * label out of its alphabet, naming where it came from. */
int hkn_fleet_create(const char *host_id, const char *labels, hkn_fleet **out, hk_report *rep);
void hkn_fleet_destroy(hkn_fleet *f); /* f may be NULL */
const char *hkn_fleet_host_id(const hkn_fleet *f);
/* Where the id came from: "option", "HOTKERN_HOST_ID", "/etc/machine-id" or
 * "hostname". */
const char *hkn_fleet_id_source(const hkn_fleet *f);
/* The labels, comma-separated ("" for none). */
const char *hkn_fleet_labels(const hkn_fleet *f);
/* The first 4 bytes of SHA-256("HOST_ID\0MODULE"), big endian, modulo
 * HKN_BUCKETS. */
uint32_t hkn_fleet_bucket(const char *host_id, const char *module);

typedef enum hkn_gate_action {
    HKN_GATE_APPLY,   /* fetch the artifacts and apply them as release target */
    HKN_GATE_OUTSIDE, /* not in the step: keep what runs */
    HKN_GATE_RUNS,    /* in the step, and the target runs already */
    HKN_GATE_STABLE,  /* not in the step, running neither the release nor the
                       * previous one (nothing, after a restart without its
                       * state, or a new host): apply the stable release the
                       * manifest carries (hkn_manifest_take_stable) */
} hkn_gate_action;

typedef struct hkn_gate {
    hkn_gate_action action;
    uint64_t target;  /* m->release (HKN_GATE_STABLE applies m->rollout.previous) */
    uint64_t running; /* what the host runs now (0: none known) */
    uint32_t bucket;
    int in_step; /* 1: in the current step or an earlier one (or aborted, or no rollout) */
} hkn_gate;

/* Decides for verified manifest m, asking e what runs (e->release, else
 * what this fleet object saw applied), and records the manifest's step for
 * the metrics. A manifest without a rollout is always HKN_GATE_APPLY; a host
 * outside the step is HKN_GATE_STABLE when m carries the stable release and
 * the host runs neither it nor the rollout's release, else HKN_GATE_OUTSIDE. */
void hkn_fleet_gate(hkn_fleet *f, const hkn_engine *e, const hkn_manifest *m, hkn_gate *out);
/* m's release was committed: the host runs m->release from now. */
void hkn_fleet_applied(hkn_fleet *f, const hkn_manifest *m);
/* Asks e what runs of every module seen (a rollback or a restore changes
 * it); nothing without e->release. Not under the engine's locks. */
void hkn_fleet_refresh(hkn_fleet *f, const hkn_engine *e);
/* The index of the refusal reason of err (with the report's canary_refusal
 * for HK_ERR_CANARY), or -1 when err is no refusal of the release (the
 * host's own state: busy, memory, a timeout). */
int hkn_refusal_reason(int err, const char *canary_refusal);
/* A reason's label value ("" out of range). */
const char *hkn_reason_name(int reason);
/* Counts a refusal of `release` (0: unknown) of module (NULL: the module
 * of the last manifest that verified), once per ident (what was refused:
 * a manifest's or release's hash) and reason in a row. */
void hkn_fleet_refused(hkn_fleet *f, const char *module, uint64_t release, const char *ident,
                       int err, const char *canary_refusal);
/* Adds hotkern_host_info and the hotkern_rollout_* families to w. */
void hkn_fleet_metrics(hkn_fleet *f, hk_metrics_writer *w);

/* ---- the puller's /metrics server (net/scrape.c) ------------------------ */

/* A small libmicrohttpd server of GET /metrics (e->metrics' text) and
 * GET /healthz, for a puller whose program has no endpoint: Prometheus
 * scrapes each host there. Read-only; its own thread. */
typedef struct hkn_scrape hkn_scrape;

/* Listens on address (numeric IPv4 or IPv6; NULL: 127.0.0.1) and port (0:
 * one chosen, hkn_scrape_port says which). e is copied. HK_ERR_INVALID for
 * a bad address, HK_ERR_NETWORK when it cannot listen. */
int hkn_scrape_start(const char *address, unsigned port, const hkn_engine *e, hkn_scrape **out,
                     hk_report *rep);
unsigned hkn_scrape_port(const hkn_scrape *s);
/* Stops answering (requests in flight finish) and frees; s may be NULL. */
void hkn_scrape_stop(hkn_scrape *s);

/* ---- names and JSON (net/json.c) ---------------------------------------- */

/* 1: s is a name of [A-Za-z0-9_.-], not starting with '.', under max bytes.
 * Module and artifact names reach file systems, URLs and metric labels. */
int hkn_valid_name(const char *s, size_t max);
/* 1 when [p, end) holds only JSON whitespace. */
int hkn_json_rest_blank(const char *p, const char *end);
/* Adds an integer member printed exactly: cJSON prints numbers through a
 * double with 15 significant digits when that reads back "close enough",
 * which loses the last digit of integers near 2^53. NULL on failure. */
struct cJSON *hkn_json_add_int(struct cJSON *obj, const char *name, long long v);
/* 1 when the text holds a \u0000 escape (cJSON would cut the string there). */
int hkn_json_has_nul_escape(const char *s, size_t len);
/* Parses exactly one JSON value filling all of text: trailing bytes, a NUL
 * byte or a \u0000 escape give NULL. The result is the caller's to delete. */
struct cJSON *hkn_json_parse_strict(const char *text, size_t len);

/* ---- signed rollback requests ------------------------------------------ */

/* A rollback carries the same authority as a release: a JSON request signed
 * like a manifest, {"type": "hotkern-rollback", "module", "target" (the
 * release version to be running afterwards, as the engine knows its images'
 * releases; 0: an image that has no release), "expires", "nonce" (32 hex
 * chars), "key_id", "endpoint" (the id of the one endpoint it is for, see
 * hk_endpoint_options.endpoint_id)}. It can never parse as a manifest, nor a
 * manifest as a rollback. */
#define HKN_ROLLBACK_MAX_S  3600 /* a request may live at most an hour */
#define HKN_ENDPOINT_ID_MAX 128  /* an endpoint id is shorter than this */

typedef struct hkn_rollback_req {
    char module[64];
    uint64_t target;
    int64_t expires;
    char nonce[33];
    char key_id[HKN_KEY_ID_CHARS + 1];
    char endpoint[HKN_ENDPOINT_ID_MAX];
} hkn_rollback_req;

/* 1: s is an endpoint id, [A-Za-z0-9_.:@-], 1 to HKN_ENDPOINT_ID_MAX - 1
 * bytes (it reaches JSON, logs and terminals). */
int hkn_valid_endpoint_id(const char *s);
/* Signs a rollback request of module to `target` for the endpoint whose id
 * is `endpoint`, expiring at `expires`, with a fresh random nonce. *text and
 * *sig_b64 are the caller's to free(). */
int hkn_rollback_sign(const hkn_seckey *key, const char *module, uint64_t target, int64_t expires,
                      const char *endpoint, char **text, size_t *len, char **sig_b64,
                      hk_report *rep);
/* Verifies signature (by a trusted key), form (an endpoint named) and
 * freshness against now; which endpoint it names and the nonce's single use
 * are the caller's to enforce. */
int hkn_rollback_verify(const hkn_trust *t, const char *text, size_t len, const char *sig,
                        size_t sig_len, int64_t now, hkn_rollback_req *out, hk_report *rep);

/* ---- push endpoint ----------------------------------------------------- */

/* The endpoint takes the public hk_endpoint_options (include/hotkern/net.h)
 * in the library's full layout for everything they describe, with zero
 * numbers and a NULL address meaning the defaults of
 * hk_endpoint_options_init_size. What the options name by file and the
 * state directory, the caller resolves first into this: */
typedef struct hkn_endpoint_resolved {
    hkn_trust trust;          /* the keys loaded from trusted_keys, and allow_unsigned */
    const char *tls_cert_pem; /* both or neither: the PEM texts of the TLS files */
    const char *tls_key_pem;
    const char *state_dir; /* the state directory resolved; NULL: memory only */
} hkn_endpoint_resolved;

typedef struct hkn_endpoint hkn_endpoint;

/* Starts the endpoint. Of o, the fields trusted_keys, ntrusted_keys,
 * allow_unsigned, tls_*_file, state_dir and swap are not read: r holds what
 * they resolve to (and e applies releases). o and r are read during the call
 * only. */
int hkn_endpoint_start(const hk_endpoint_options *o, const hkn_endpoint_resolved *r,
                       const hkn_engine *e, hkn_endpoint **out, hk_report *rep);
uint16_t hkn_endpoint_port(const hkn_endpoint *ep);
/* The address it listens on (o->address or the default). Valid until stop. */
const char *hkn_endpoint_address(const hkn_endpoint *ep);
/* The id signed rollback requests must name (o->endpoint_id or
 * HOSTNAME:PORT). Valid until stop. */
const char *hkn_endpoint_id(hkn_endpoint *ep);
/* Connections open now (for tests and status). */
unsigned hkn_endpoint_connections(hkn_endpoint *ep);
/* Stops accepting, waits for in-flight requests, frees. ep may be NULL. */
void hkn_endpoint_stop(hkn_endpoint *ep);
/* Adds the endpoint's families (hotkern_push_*, hotkern_module_release_
 * version) to w: a metrics hook (api.c attaches it to the runtime). Takes
 * the endpoint's own locks only. */
void hkn_endpoint_metrics(hkn_endpoint *ep, hk_metrics_writer *w);

/* ---- puller ------------------------------------------------------------ */

/* The puller takes the public hk_pull_options (include/hotkern/net.h) in
 * the library's full layout for everything they describe; zero interval,
 * backoff, timeouts and caps mean the defaults of hk_pull_options_init_size.
 * What the options name by file and the state directory, the caller
 * resolves first into this: */
typedef struct hkn_pull_resolved {
    hkn_trust trust;       /* the keys loaded from trusted_keys, and allow_unsigned */
    const char *state_dir; /* the state directory resolved; NULL: memory only */
    const char *save_dir;  /* `hotkern pull --out` only: verified artifacts are
                            * written here too; NULL from hk_pull_start */
} hkn_pull_resolved;

typedef struct hkn_pull_stats {
    uint64_t requests;     /* HTTP requests made */
    uint64_t not_modified; /* 304 answers to the manifest */
    uint64_t errors;       /* transfers that failed (network, timeout, HTTP error, cap) */
    uint64_t refused;      /* releases refused by verification or the engine */
    uint64_t applied;      /* releases committed */
    uint64_t polls;        /* completed polls */
    uint64_t bytes;        /* body bytes received */
    int last_error;        /* HK_OK or the last poll's error */
    char last_message[512];
    unsigned failures;     /* consecutive polls that backed off */
    unsigned next_poll_ms; /* the wait before the next poll, backoff included */
} hkn_pull_stats;

typedef struct hkn_puller hkn_puller;

/* Creates a puller without a thread: hkn_pull_poll drives it. Of o, the
 * fields trusted_keys, ntrusted_keys, allow_unsigned, state_dir and swap are
 * not read: r holds what they resolve to (and e applies releases). o and r
 * are read during the call only. */
int hkn_pull_create(const hk_pull_options *o, const hkn_pull_resolved *r, const hkn_engine *e,
                    hkn_puller **out, hk_report *rep);
/* One poll: manifest (conditional), signature, artifacts, verify, apply.
 * Returns 0 when nothing changed or a release was applied, else the error.
 * Not to be called while the puller's thread runs. */
int hkn_pull_poll(hkn_puller *p, hk_report *rep);
/* Starts the polling thread (first poll at once). */
int hkn_pull_run(hkn_puller *p);
void hkn_pull_stats_get(hkn_puller *p, hkn_pull_stats *out);
/* Adds the puller's families (hotkern_pull_*, and its fleet's:
 * hotkern_rollout_*, hotkern_host_info) to w; a metrics hook. */
void hkn_pull_metrics(hkn_puller *p, hk_metrics_writer *w);
/* The port of its /metrics server (0: none). */
unsigned hkn_pull_metrics_port(const hkn_puller *p);
/* The host id the puller resolved (net/fleet.c). */
const char *hkn_pull_host_id(const hkn_puller *p);
/* The version of the key list in force on its state (0: the configured
 * keys, or a state that cannot be read). */
uint64_t hkn_pull_keys_version(hkn_puller *p);
/* Stops the thread (aborting a transfer in progress) and frees. p may be NULL. */
void hkn_pull_destroy(hkn_puller *p);

#endif

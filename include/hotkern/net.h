/*
 * hotkern network sources: signed releases pushed over HTTP or pulled from a
 * static origin, verified, then swapped in like hk_swap.
 *
 * Releases
 *   A release is manifest.json plus artifacts. The manifest (JSON) names the
 *   module, a release version (integer, monotonic per module, below 2^53), its
 *   creation and expiry times (unix seconds), the signing key's id and each
 *   artifact: {"name", "sha256" (hex), "size", "format" ("cuda", "ptx",
 *   "cubin", "fatbin" or "header"), "arch" ("sm_90" or "")}. A "header"
 *   artifact is never applied itself: the CUDA C artifact's build finds it as
 *   an in-memory header under its name (#include "common.cuh"), so a kernel
 *   and the headers it includes travel, and are verified, together; a
 *   release needs at least one artifact that is not a header. manifest.json.sig holds the
 *   Ed25519 signature of the manifest's exact bytes, base64 (hex accepted).
 *   `hotkern keygen` and `hotkern sign` make keys and releases.
 *
 *   A release is applied only after, in this order: the signature verifies
 *   with a trusted key; the manifest has not expired; its version is newer
 *   than the highest version ever accepted for the module (kept in
 *   state_dir/accepted.json, so restarts do not reopen old releases); each
 *   artifact has its declared size and SHA-256. Refusals: HK_ERR_SIGNATURE,
 *   HK_ERR_EXPIRED, HK_ERR_REPLAY, HK_ERR_HASH, HK_ERR_TOO_LARGE.
 *   Of several artifacts, the one applied is: a cubin/fatbin whose arch is the
 *   runtime's, else a fatbin, else PTX, else CUDA C (with the headers).
 *
 * Rollouts (docs/ROLLOUT.md; since 1.4)
 *   A manifest may carry "rollout": {"release", "previous", "step", "steps":
 *   [{"percent", "hosts", "labels", "bake_s"}], "paused", "aborted"}, which
 *   `hotkern rollout` writes. A puller takes such a release only when its
 *   host (hk_pull_options.host_id and host_labels) is in the current step
 *   or an earlier one: its bucket, SHA-256 of "HOST_ID\0MODULE" modulo
 *   10000, below 100 x the step's percent, or its id or a label named; every
 *   host takes an aborted one, whose artifacts are the previous release's.
 *   Outside the step it keeps what it runs (not an error). The engine
 *   records the rollout's release (hk_module_release); the anti-rollback
 *   state the manifest's version, which every step raises.
 *
 * Key files
 *   One line: the key in hex (public 64 chars, secret 128 chars: libsodium's
 *   seed + public key) or base64. A key's id is the first 8 bytes of the
 *   SHA-256 of the public key, in hex.
 *
 * Keys and thresholds (docs/ROLLOUT.md, "Keys"; since 1.5)
 *   A signature file (manifest.json.sig) may hold several signatures, one a
 *   line, "KEYID SIGNATURE" (base64), or one bare signature as before. A
 *   source with signature_threshold k accepts a release that k DISTINCT
 *   keys of those it trusts signed: a key that signed twice counts once, an
 *   unknown key's line is ignored. Fewer is HK_ERR_SIGNATURE, the report
 *   naming the valid and the missing keys; the running version is kept,
 *   and a puller counts the refusal as reason "signature". A key list,
 *   keys.json ({"type": "hotkern-keys", "version", "threshold", "expires"
 *   (0: never), "keys": [{"id", "public"}]}) with keys.json.sig, replaces
 *   the trusted keys and the threshold without a restart when it is signed
 *   by k of the keys trusted now and by its own threshold of its own keys,
 *   is newer than the list in force (else HK_ERR_REPLAY) and has not
 *   expired (HK_ERR_EXPIRED). It is kept in the state directory
 *   (state_dir/keys.json), so every source of that directory and a
 *   restarted host trust it; removing that file goes back to the configured
 *   keys. Pullers poll it beside the manifest (keys_url, conditionally);
 *   endpoints take it by POST /v1/keys. `hotkern sign --key K --key K2`,
 *   `hotkern cosign` and `hotkern keys sign` write them.
 *
 * HTTP push protocol (hk_endpoint)
 *   POST /v1/release          body, Content-Type: application/x-hotkern-release
 *                             (what `hotkern push` sends): a frame of lengths
 *                             and raw bytes, held once by the endpoint;
 *                             integers big-endian:
 *                               "\x89HKR\r\n\x1a\n", u16 version (1), u16
 *                               count (1..16), u32 manifest length
 *                               (1..1 MiB), u32 signature length (0..512),
 *                               u64 length of each artifact, then the
 *                               manifest.json text, the signature's text
 *                               (manifest.json.sig) and the artifacts in
 *                               the manifest's order, nothing after;
 *                             or, Content-Type: application/json:
 *                               {"manifest": "<manifest.json text>",
 *                                "signature": "<base64>",
 *                                "artifacts": {"<sha256>": "<base64>", ...}}
 *                             Both carry the same signed bytes: a release
 *                             signed once goes either way.
 *   POST /v1/keys             {"keys": "<keys.json text>", "signature":
 *                             "<keys.json.sig text>"} (since 1.5): a key list
 *                             (above), answered {"outcome": "committed" |
 *                             "refused", "keys_version", "error", "code",
 *                             "message"}; 403 for its signatures, 409 an
 *                             older or equal version, 400 a list that does
 *                             not read
 *   GET  /v1/status           "endpoint_id"; modules: the highest release
 *                             committed through this endpoint, the engine's
 *                             version and the releases the engine runs and
 *                             would roll back to ("running_release_version",
 *                             "previous_release_version": whichever source
 *                             committed them; null when unknown), the last
 *                             outcome, message and build log of each, and
 *                             "quarantine": [{"module", "image",
 *                             "release_version", "version"}] (images that
 *                             ran when the CUDA context was lost; see
 *                             hotkern.h, "last known good")
 *   POST /v1/rollback/MODULE  hk_rollback; needs the token, or the body
 *                             {"request": "<rollback request text>",
 *                              "signature": "<base64>"} signed by a trusted
 *                             key (see `hotkern rollback --key`); with
 *                             neither a token nor a trusted key, rollback
 *                             over HTTP is off (403). A signed request
 *                             names this endpoint's id (endpoint_id; one
 *                             for another endpoint, or none, is 403) and
 *                             the release to be running afterwards, which
 *                             the engine checks against the image it would
 *                             commit (hk_rollback_release: 422 when that
 *                             image is another release)
 *   GET  /metrics             Prometheus text: exactly hk_metrics_text of the
 *                             runtime (engine, watcher, every endpoint and puller
 *                             attached to it)
 *   GET  /healthz             "ok", never needs the token
 *   Answers are JSON: {"outcome": "committed" | "refused" | "rolled_back" |
 *   "error", "module", "version" (a release's: the release; a rollback's:
 *   the engine's version number of the image it committed again),
 *   "release_version" (the release that runs after a rollback, or the
 *   release of a verified release; null when unknown), "error":
 *   "HK_ERR_...", "code", "message",
 *   "log" (compiler/JIT log or null), "build_ms", "stage_ms", "commit_ms"};
 *   a refusal also has "refused_before": true when the engine refused these
 *   same signed bytes already (a build, validation, canary or quarantine
 *   refusal, or a build or canary that timed out): such a release is
 *   answered with the first refusal's error and status and its message,
 *   without a build or canary run, as long as the endpoint remembers it
 *   (the last 256 such releases, in memory). A release signed anew is tried
 *   again. Pullers remember refused manifests the same way, whatever the
 *   origin's ETag.
 *   Status codes: 200 done; 400 malformed request or module name, a
 *   frame whose lengths disagree with the body (truncated, bytes after
 *   it, a length unlike the Content-Length); 401
 *   missing or wrong bearer token (HK_ERR_REJECTED); 403 bad/missing/unknown
 *   signature, expired release, a foreign Host or Origin (HK_ERR_REJECTED),
 *   or rollback off; 404 no such route or module; 409 replay, a rollback
 *   request used twice, nothing to roll back to, or a quarantined image
 *   (HK_ERR_QUARANTINED); 413 body over the cap
 *   (before the body is read when it has a Content-Length, as soon as it
 *   passes the cap or a frame's lengths say it will when chunked); 415 a
 *   POST body declared as neither application/json nor (to /v1/release)
 *   the frame's type; 422 artifact hash or size mismatch (a frame with
 *   another number of artifacts than its manifest names too),
 *   compile or validation refusal, a canary run's refusal (HK_ERR_CANARY),
 *   a rollback target that is not the
 *   previous release; 503 over a connection or memory limit, runtime busy
 *   or closing, a required canary that could not run
 *   (HK_ERR_CANARY_UNAVAILABLE); 504 a build that timed out; 500 other
 *   failures. Only verdicts on the release's bytes (hk_err_is_verdict) are
 *   remembered and answered again without a build ("refused before").
 *
 *   Every route but /healthz needs a Host that names the bound address
 *   ("localhost" too on a loopback address, any address literal when bound
 *   to 0.0.0.0 or ::) or one of allowed_hosts, and refuses an Origin other
 *   than the endpoint's own (scheme, host and port: another port of the same
 *   host is another origin); a POST with a body needs Content-Type:
 *   application/json or, for a release, application/x-hotkern-release
 *   (415 otherwise, HK_ERR_REJECTED). Web pages cannot
 *   drive the endpoint by cross-origin requests, "simple" form or text POSTs,
 *   or DNS rebinding.
 *
 * Sized structures: hk_endpoint_options, hk_pull_options and hk_pull_stats
 * follow hotkern.h's rule (size first, set by their _init; hotkern reads and
 * writes only within it; a size below the first layout is HK_ERR_INVALID).
 *
 * Threads: every function here is safe from any thread unless stated. The
 * endpoint and the puller run on threads of their own and apply releases
 * with hk_swap; outcomes also reach hk_options.on_event with origin "push"
 * or "pull:URL".
 *
 * Logs and metrics: endpoints and pullers log through the runtime they apply
 * to (hk_runtime_set_log; subsystems "endpoint" and "pull"): requests
 * accepted and refused with the reason, release outcomes, polls, 304s, new
 * releases, refusals and each retry with its backoff. Their counters join the
 * runtime's hk_metrics_text from start to stop (hotkern_push_* labelled
 * endpoint="ADDRESS:PORT", hotkern_pull_* labelled url="URL"); a puller's
 * also hotkern_host_info and, per module, hotkern_rollout_* (the release
 * the host runs and since when, its step and bucket, its refusals by
 * reason). A puller with hk_pull_options.metrics_address or metrics_port
 * serves that whole text at GET /metrics itself (hk_pull_metrics_port).
 */
#ifndef HOTKERN_NET_H
#define HOTKERN_NET_H

#include <stddef.h>
#include <stdint.h>

#include "hotkern/hotkern.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- push endpoint ----------------------------------------------------- */

typedef struct hk_endpoint hk_endpoint;

/* The first layout ends at swap. Each field in full: hotkern-net(3). */
typedef struct hk_endpoint_options {
    size_t size;               /* set by hk_endpoint_options_init */
    const char *address;       /* numeric IPv4/IPv6; default "127.0.0.1" */
    unsigned port;             /* default 0: ephemeral, see hk_endpoint_port */
    const char *token;         /* bearer token required on every route but
                                * /healthz; NULL = none */
    const char *tls_cert_file; /* PEM; with tls_key_file enables HTTPS */
    const char *tls_key_file;
    const char *const *trusted_keys;  /* public key files */
    int ntrusted_keys;                /* up to 8 */
    int allow_unsigned;               /* 1: with no trusted key, accept unsigned
                                       * releases (tests, closed networks) */
    const char *state_dir;            /* anti-rollback state; NULL =
                                       * $XDG_STATE_HOME/hotkern/releases; "" = memory only */
    size_t max_body_bytes;            /* default 64 MiB (a JSON body's base64 adds a
                                       * third; a frame is the release's size) */
    unsigned max_connections;         /* open at once, default 1024; beyond: 503 */
    unsigned timeout_s;               /* idle timeout per connection, default 30 */
    const hk_swap_options *swap;      /* template for each swap (copied); canary policy DEFAULT
                                       * means REQUIRE */
    unsigned per_ip_connections;      /* open at once from one address, default 128;
                                       * beyond: 503 */
    unsigned request_timeout_s;       /* whole request (headers and body), default 60 */
    size_t max_inflight_bytes;        /* request bodies held at once, default twice
                                       * max_body_bytes; beyond: 503 */
    const char *const *allowed_hosts; /* names accepted in Host and Origin besides the bound address
                                       * ("localhost" is, on a loopback address) */
    int nallowed_hosts;
    unsigned threads;        /* event-loop threads, default 2 */
    const char *endpoint_id; /* the id signed rollback requests must name, [A-Za-z0-9_.:@-]{1,127};
                              * NULL: HOSTNAME:PORT (set one where host names repeat) */
    /* Since 1.5: threshold signatures (above, "Keys and thresholds"). */
    unsigned signature_threshold; /* distinct trusted keys a release needs, 1 to
                                   * ntrusted_keys; 0: 1 */
} hk_endpoint_options;

/* Sets o->size = size and every field within it to the defaults above;
 * HK_ERR_INVALID, writing nothing, for a size below the first layout. Call
 * it through hk_endpoint_options_init. Since 1.0. */
HK_API int hk_endpoint_options_init_size(hk_endpoint_options *o, size_t size);

/* Fills o with the defaults above, for the layout the program is built with.
 * Since 1.0. */
static inline void hk_endpoint_options_init(hk_endpoint_options *o) {
    (void)hk_endpoint_options_init_size(o, sizeof *o);
}

/* Starts the HTTP endpoint on its own threads, applying releases to rt. Key
 * and certificate files are read during the call. rt must outlive the
 * endpoint. Returns HK_ERR_NETWORK when the address cannot be bound,
 * HK_ERR_UNSUPPORTED for TLS without TLS support in libmicrohttpd.
 * On success *out is owned by the caller: hk_endpoint_stop(). Since 1.0. */
HK_API int hk_endpoint_start(hk_runtime *rt, const hk_endpoint_options *opt, hk_endpoint **out,
                             hk_report *rep);

/* The port the endpoint listens on (the chosen one when port was 0).
 * Since 1.0. */
HK_API unsigned hk_endpoint_port(const hk_endpoint *ep);

/* Stops accepting, waits for requests in flight (a swap in progress
 * finishes) and frees ep. Call before hk_runtime_destroy. ep may be NULL.
 * Since 1.0. */
HK_API void hk_endpoint_stop(hk_endpoint *ep);

/* ---- puller ------------------------------------------------------------ */

typedef struct hk_puller hk_puller;

/* The first layout is the whole 1.0 structure. Each field in full:
 * hotkern-net(3). */
typedef struct hk_pull_options {
    size_t size;                     /* set by hk_pull_options_init */
    const char *url;                 /* manifest URL (http or https, printable ASCII); its signature
                                      * at url + ".sig" */
    const char *artifact_base;       /* artifacts at base/artifacts/<sha256>;
                                      * default: url's directory */
    unsigned interval_ms;            /* default 10000 */
    unsigned jitter_pct;             /* +- percent of the interval, default 10 */
    unsigned max_backoff_ms;         /* error backoff doubles up to this, default 300000 */
    unsigned connect_timeout_ms;     /* default 5000 */
    unsigned total_timeout_ms;       /* per transfer, default 60000 */
    unsigned low_speed_bytes;        /* abort a transfer slower than this many
                                      * bytes/s ... default 1024 */
    unsigned low_speed_s;            /* ... for this long, default 15 */
    size_t max_manifest_bytes;       /* default 1 MiB */
    size_t max_artifact_bytes;       /* default 64 MiB */
    const char *ca_file;             /* NULL: the system CA store */
    const char *const *trusted_keys; /* public key files */
    int ntrusted_keys;               /* up to 8 */
    int allow_unsigned;              /* as for the endpoint */
    const char *state_dir;           /* NULL = $XDG_STATE_HOME/hotkern/releases, the
                                      * endpoint's default too; "" = memory only */
    const hk_swap_options *swap;     /* template for each swap (copied); a canary policy left at
                                      * DEFAULT means HK_CANARY_REQUIRE */
    /* Since 1.4: the host in a fleet's rollouts (docs/ROLLOUT.md). */
    const char *host_id;         /* [A-Za-z0-9_.:@-]{1,127}; NULL: $HOTKERN_HOST_ID, else
                                  * /etc/machine-id, else the host name */
    const char *host_labels;     /* comma-separated labels a rollout's steps may name; NULL:
                                  * $HOTKERN_HOST_LABELS */
    const char *metrics_address; /* serve GET /metrics here (numeric IPv4/IPv6); NULL with
                                  * metrics_port 0: no server, else "127.0.0.1" */
    unsigned metrics_port;       /* 0 with an address: one chosen (hk_pull_metrics_port) */
    /* Since 1.5: threshold signatures and key lists ("Keys and thresholds"). */
    unsigned signature_threshold; /* as for the endpoint */
    const char *keys_url;         /* the signed key list, polled with the manifest; NULL:
                                   * keys.json in url's directory; "": none */
} hk_pull_options;

/* As hk_endpoint_options_init_size, for puller options. Since 1.0. */
HK_API int hk_pull_options_init_size(hk_pull_options *o, size_t size);

/* Fills o with the defaults, for the layout the program is built with.
 * Since 1.0. */
static inline void hk_pull_options_init(hk_pull_options *o) {
    (void)hk_pull_options_init_size(o, sizeof *o);
}

/* Starts polling opt->url on a thread of its own (first poll at once),
 * applying each new verified release to rt, a rollout's only while this
 * host is in its step (above, "Rollouts"). Conditional requests make an
 * unchanged origin cost one 304 per poll; errors back off exponentially.
 * HK_ERR_INVALID for a host id or label out of its alphabet, HK_ERR_NETWORK
 * when the /metrics server cannot listen. rt must outlive the puller. On
 * success *out is owned by the caller: hk_pull_stop(). Since 1.0. */
HK_API int hk_pull_start(hk_runtime *rt, const hk_pull_options *opt, hk_puller **out,
                         hk_report *rep);

/* The port the puller's /metrics server listens on (the one chosen when
 * metrics_port was 0), or 0 when it serves none (p NULL too). Safe from any
 * thread. Since 1.4. */
HK_API unsigned hk_pull_metrics_port(const hk_puller *p);

/* The version of the key list the puller's host trusts now (a key list
 * accepted by any source on its state directory, this puller's polls, an
 * endpoint's POST /v1/keys, before a restart), or 0 while the configured
 * trusted_keys stand; 0 for a NULL p or a state that cannot be read. Safe
 * from any thread. Since 1.5. */
HK_API uint64_t hk_pull_keys_version(hk_puller *p);

/* The first layout is the whole 1.0 structure. */
typedef struct hk_pull_stats {
    size_t size;           /* set by HK_PULL_STATS_INIT / hk_pull_stats_init */
    uint64_t requests;     /* HTTP requests made */
    uint64_t not_modified; /* 304 answers to the manifest */
    uint64_t errors;       /* failed transfers */
    uint64_t refused;      /* releases refused (verification or build) */
    uint64_t applied;      /* releases committed */
    uint64_t polls;
    uint64_t bytes; /* body bytes received */
    int last_error; /* HK_OK or the latest poll's error */
    char last_message[512];
} hk_pull_stats;

#define HK_PULL_STATS_INIT HK_SIZED_INIT(hk_pull_stats)

/* Sets s to zero counters of the caller's layout, for hk_pull_stats_get.
 * Since 1.0. */
static inline void hk_pull_stats_init(hk_pull_stats *s) {
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
}

/* Snapshot of the puller's counters into out, within out->size. Returns 0,
 * or HK_ERR_INVALID for a NULL argument or a size below the first layout
 * (nothing written). Since 1.0. */
HK_API int hk_pull_stats_get(hk_puller *p, hk_pull_stats *out);

/* Stops the thread (a transfer in progress is aborted; a swap in progress
 * finishes) and frees p. Call before hk_runtime_destroy. p may be NULL.
 * Since 1.0. */
HK_API void hk_pull_stop(hk_puller *p);

#ifdef __cplusplus
}
#endif
#endif /* HOTKERN_NET_H */

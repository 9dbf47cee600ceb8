/*
 * canary/: runs a version's test launches in a helper process before it is
 * committed. Private header shared by the parent side (canary.c, exchange.c
 * and run.c, which share canary/parent.h; linked into libhotkern), the wire
 * protocol (proto.c, both sides) and the helper executable (helper.c,
 * `hotkern-canary`).
 *
 * Why a process. A kernel that faults (illegal address, trap) leaves a
 * sticky error in its CUDA context: every later call of that process fails
 * and the application's buffers are gone. A kernel stuck in a loop holds its
 * stream for good. Neither can be undone inside the application, so a new
 * version's declared test launches run in `hotkern-canary`, a child with a
 * CUDA context of its own, and the parent kills it when a launch outlives its
 * timeout.
 *
 * The exchange. Parent and helper talk over a socketpair in length-prefixed
 * messages (hku_msg_hdr, util/wire.c, magic HKA_MAGIC), one request and one
 * reply at a time, each side treating the other as untrusted (the messages,
 * the slots and the trap guard's copy: above enum hka_msg_type).
 *
 * Two helpers. Each runtime with canaries has a plain helper, which runs
 * every test launch (both versions, compared and timed); where the CUDA
 * toolkit's compute-sanitizer is found, a second one runs under memcheck and
 * each test launch of the new version runs there first (above hka_config).
 *
 * Threads and locks (hka_canary):
 *   run_lock    one canary run at a time: held for a whole run, which its
 *               timeouts bound. Taken by the thread that builds the version
 *               (the caller of hk_swap or the worker), never with an engine
 *               lock held and never by a launching thread.
 *   tests_lock  the declared tests; a leaf, never held across the exchange.
 */
#ifndef HK_CANARY_H
#define HK_CANARY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "hotkern/hotkern.h"
#include "ptx/ptx.h"
#include "util/util.h"

#define HKA_PROTOCOL 5
#define HKA_MAGIC    0x4e4b4348u /* "HCKN" */

/* Bounds of the protocol, checked by both sides before allocating. */
#define HKA_MAX_IMAGE      (64u << 20) /* bytes of one image */
#define HKA_MAX_TEST_BYTES (64u << 20) /* all buffers of one test launch */
#define HKA_MAX_MSG        (HKA_MAX_IMAGE + (1u << 16))
#define HKA_MAX_ARGS       64
#define HKA_MAX_SCALAR     4096 /* bytes of one by-value argument */
#define HKA_MAX_TESTS      16   /* per kernel */
#define HKA_MAX_TEXT       4096 /* names and logs in replies */
#define HKA_MAX_RUNS       32   /* timed runs of one launch */
#define HKA_MAX_WARMUPS    8
#define HKA_MAX_RUN_NS     1000000000000ull /* 1000 s: a longer timed run is nonsense */

/* What a run asks of the perf guard: one untimed repeat, then five timed
 * ones (their median is the launch's time). */
#define HKA_WARMUPS 1
#define HKA_RUNS    5

/* compute-sanitizer's exit status when memcheck found errors (its
 * --error-exitcode; none of the helper's own). */
#define HKA_SANITIZER_EXIT 86
/* Launches under memcheck get this many times the launch timeout: the
 * instrumentation slows memory accesses by an order of magnitude. */
#define HKA_SANITIZER_SLOW 4

/*
 * The exchange. Each side treats the other as untrusted: sizes are bounded
 * before anything is allocated, replies are parsed strictly (a field too many
 * or too few is a malformed reply), and the parent waits for every reply with
 * a deadline.
 *
 *   helper -> READY  {u32 protocol, i32 arch}   once, after its context exists
 *                    or FAIL {text} when it cannot make one
 *   LOAD   {u32 slot, u32 format, u32 guarded, bytes}
 *          -> LOADED {i32 cu, str name, str log}
 *   LAUNCH {u32 slot, str entry, u32 grid[3], block[3], shared, u32 nargs,
 *           per arg: u32 kind, u64 size, u32 fill, u64 param, [bytes];
 *           u32 outputs, u32 warmups, u32 runs}
 *          -> RESULT {u32 stage, i32 cu, str name, u32 trap, u32 nout,
 *                     per buffer: u32 index, u64 size, bytes}
 *          [-> TIMED {u32 stage, i32 cu, str name, u32 trap, u32 n,
 *                     per run: u64 ns}]
 *   LIMITS {u32 slot, str entry}
 *          -> LIMITS_OF {i32 cu, str name, u32 max_threads, u32 regs,
 *                        u32 static_shared, u32 max_dynamic_shared, u32 local}
 *   (the entry's function attributes, cu not 0 when they could not be read)
 *   A finished launch returns every buffer when `outputs` is 1 (they are to
 *   be compared) and none when it is 0: copying 4 MiB back and through the
 *   socket was most of a canary run's cost (bench_canary).
 *   With `runs` > 0, a launch that finished (RESULT stage DONE, its buffers
 *   copied out first) is repeated on the same buffers: `warmups` times, then
 *   `runs` times between two CUDA events, each synchronised; TIMED follows
 *   RESULT with each timed run's GPU time in nanoseconds (n = runs), or
 *   where a repeat stopped (stage SETUP: the events, LAUNCH, SYNC; cu not 0,
 *   n = 0). A separate reply, so that the parent waits for the first launch
 *   with the launch timeout and for the repeats with one of their own: a
 *   launch that hangs is found as soon as it would be without timing.
 *
 * Slots: 0 holds the new version's image, 1 the running version's (for
 * comparisons and timings), 2 the new version's image beside its trap
 * guard's copy in 0. Where the new version has a trap guard's copy
 * (ptx/guard.c: its traps, breakpoints and asserts store a code into
 * __hotkern_trap and end their thread instead of raising an exception that
 * would end the context and stall the whole GPU), slot 0 holds that copy
 * (LOAD's guarded 1; a copy the driver refuses is replaced by the image,
 * tested unguarded, and said so); the helper clears the code before each
 * launch and reads it after, only in a guarded slot, and a
 * launch or repeat that stored one stops at stage SYNC with cu 0 and the
 * code in `trap` (nothing else stops with a trap; a stop has either a cu or
 * a trap, and a trap names one of the copy's sites). Its context is whole:
 * the helper goes on. A fault poisons the helper's context, so after
 * one the parent kills the helper and starts another.
 *
 * The copy is not the binary that commits: ptxas allocates its registers
 * anew (NVRTC and nvJitLink gave a kernel with asserts 72 registers a thread
 * as the image, 64 as the copy: blocks of at most 896 threads against
 * 1024). So a test launch of a copy that passed, timed repeats included, is
 * followed in the plain helper by the image itself (slot 2, loaded at its
 * first use in a run): its limits (LIMITS) checked against the test's block
 * and shared memory, then the same launches on the same fresh inputs, which
 * the copy ran without reaching a trap site. The image's buffers are the
 * ones compared and its times the ones the perf guard judges. A version
 * that traps is refused on the copy, before the image is loaded.
 */
enum hka_msg_type {
    HKA_READY = 1,
    HKA_FAIL = 2,
    HKA_LOAD = 3,
    HKA_LOADED = 4,
    HKA_LAUNCH = 5,
    HKA_RESULT = 6,
    HKA_TIMED = 7,
    HKA_LIMITS = 8,
    HKA_LIMITS_OF = 9,
};

#define HKA_NSLOTS 3 /* the new version's, the running one's, the new image beside its copy */

/* Where a test launch stopped (RESULT.stage). */
enum hka_stage {
    HKA_STAGE_SETUP = 0,  /* kernel lookup, buffers, copies in */
    HKA_STAGE_LAUNCH = 1, /* cuLaunchKernel */
    HKA_STAGE_SYNC = 2,   /* the kernel ran: synchronise */
    HKA_STAGE_COPY = 3,   /* copies out */
    HKA_STAGE_DONE = 4,   /* ran; buffers follow */
};

enum hka_arg_kind { HKA_ARG_SCALAR = 0, HKA_ARG_BUFFER = 1 };

/* One argument of a test launch. */
typedef struct hka_arg {
    uint32_t kind;  /* hka_arg_kind */
    uint64_t size;  /* scalar bytes, or buffer bytes */
    uint32_t fill;  /* hk_fill, buffers */
    uint64_t param; /* byte value or seed, buffers */
    void *data;     /* scalar value, or HK_FILL_HOST contents; owned */
} hka_arg;

/* A declared test launch (the public hk_test). */
struct hk_test {
    uint32_t grid[3], block[3], shared;
    int nargs;
    hka_arg args[HKA_MAX_ARGS];
    uint64_t buffer_bytes; /* all buffers together */
    int compare;           /* hk_compare */
    double atol, rtol;
};

/* ---- proto.c: fills, both sides (framing: util/wire.c) ------------------ */

/* Fills n bytes at p as fill/param say (HK_FILL_HOST excepted). */
void hka_fill(void *p, size_t n, uint32_t fill, uint64_t param);

/* ---- canary.c, exchange.c, run.c: the parent side ------------------------- */

typedef struct hka_canary hka_canary;

/*
 * Two helpers. Each runtime with canaries has a plain helper, which runs
 * every test launch (both versions, compared and timed). Where the CUDA
 * toolkit's compute-sanitizer is found (hka_config.sanitizer), a second
 * helper runs under `compute-sanitizer --tool memcheck`, and each test launch
 * of the new version runs there first: out-of-bounds and misaligned accesses
 * are caught by instrumentation before they reach the MMU, whose fault
 * recovery stalls every context on the GPU far longer than a fault memcheck
 * catches (bench/RESULTS.md, section 21), and an access that lands in valid
 * memory, which a plain run misses, is caught too. The plain helper then runs
 * only versions that memcheck passed. Timing stays in the plain helper:
 * instrumentation slows memory accesses and not arithmetic, so times under
 * memcheck say little about a version's speed. What the sanitizer reports
 * comes through the memcheck helper's stderr (--log-file /dev/stderr), read
 * line by line (hku_child's observer): its first error line is the refusal's
 * reason, and its exit status (HKA_SANITIZER_EXIT, when it found errors)
 * confirms it once the helper was asked to end. The sanitizer runs with
 * --destroy-on-device-error kernel: a precise error (out of bounds,
 * misaligned, an illegal address) ends the kernel alone and the launch comes
 * back finished, its report in the log; an imprecise one (a trap) ends the
 * context and fails the launch, and the verdict then waits for the
 * sanitizer's end. A launch that comes back finished counts as clean once the
 * log has been quiet for 50 ms (the front end prints a little after the
 * fact); a report read by then refuses the version. After any refusal the
 * memcheck helper is replaced (the sanitizer counts errors over its life).
 */
typedef struct hka_config {
    const char *helper;     /* path of hotkern-canary (resolved by the caller) */
    int device;             /* CUDA ordinal the helper attaches to */
    int timeout_ms;         /* per test launch; start and loads get 10x */
    int start;              /* 1: start the helper now (a runtime with canaries) */
    const char *sanitizer;  /* compute-sanitizer's path: the memcheck helper
                             * runs under it; NULL: no memcheck helper */
    int sanitizer_required; /* 1: a memcheck helper that cannot start fails
                             * hka_create; 0: memcheck is then off (why says
                             * so, hka_sanitizer says why) */
} hka_config;

/* Makes the canary of a runtime. With cfg->start, the helpers are started
 * at once and their READY read. Returns 0, HK_ERR_NOMEM, or HK_ERR_IO with
 * why when a helper cannot be started. On success why may hold a note
 * (memcheck turned off, and why); "" otherwise. */
int hka_create(hka_canary **out, const hka_config *cfg, char *why, size_t why_size);
/* Kills the helper and frees everything; c may be NULL. */
void hka_destroy(hka_canary *c);
/* From any thread, before hka_destroy: a run waiting on the helper ends at
 * once (as if the helper had died), and no helper is started again. */
void hka_cancel(hka_canary *c);

int hka_add_test(hka_canary *c, const char *module, const char *kernel, const hk_test *t,
                 hk_report *rep);
int hka_clear_tests(hka_canary *c, const char *module, const char *kernel);
/* 1 when some kernel of module has a test declared. */
int hka_has_tests(hka_canary *c, const char *module);

/* One version's image as the canary sees it. */
typedef struct hka_image {
    const void *data;
    size_t size;
    hk_format format;
    uint64_t version; /* for reports; 0: not committed yet */
    int nexpr;        /* name expressions and their lowered names */
    char *const *expr, *const *lowered;
    int nentries; /* parameter layouts from the image's metadata */
    const hkp_entry *entries;
    const void *guard; /* the trap guard's copy (hkp_artifact.guard), in
                        * format, which test launches run instead of data;
                        * NULL: none (the running version's never has one) */
    size_t guard_size;
    int guard_sites;
} hka_image;

/* What refused a version (hk_report.canary_refusal, hk_stats). */
typedef enum hka_kind {
    HKA_KIND_FAULT = 0,    /* a launch failed, or the helper died or misbehaved in it */
    HKA_KIND_HANG = 1,     /* a launch outlived its timeout */
    HKA_KIND_MISMATCH = 2, /* outputs differ from the running version's */
    HKA_KIND_SLOWER = 3,   /* slower than the perf guard allows */
    HKA_KIND_MEMCHECK = 4, /* compute-sanitizer memcheck reported an error */
    HKA_KIND_NOT_RUN = 5,  /* required but could not run, or a test that does not fit */
    HKA_NKINDS = 6,
} hka_kind;

/* "fault", "hang", "mismatch", "slower", "memcheck", "could_not_run". */
const char *hka_kind_name(hka_kind k);

/* A run's policy, resolved by the caller from the runtime's and the
 * swap's options. */
typedef struct hka_policy {
    int canary;             /* HK_CANARY_OPTIONAL or HK_CANARY_REQUIRE (SKIP is
                             * decided by the caller) */
    double slowdown_max;    /* the perf guard: refuse a test launch more than
                             * this many times slower than the running
                             * version's ... */
    double slowdown_min_ms; /* ... and more than this much slower (>= 0);
                             * slowdown_max <= 0: no guard, no timing */
} hka_policy;

/* Runs every test of module's kernels on img and, where a test compares or
 * the perf guard is on, on ref (the running version; NULL when none) with
 * the same inputs. Returns 0 when the version may go on (tests passed, none
 * declared, or the canary could not run under OPTIONAL), else
 * HK_ERR_CANARY (or HK_ERR_MISSING_KERNEL / HK_ERR_LAYOUT for a test that
 * does not fit; HK_ERR_CANARY_UNAVAILABLE when REQUIRE'd and it could not run) with rep->message,
 * rep->kernel, rep->cu_name, rep->canary, rep->canary_refusal and the perf guard's figures
 * (canary_new_ms, canary_old_ms) saying what happened. Blocks the calling thread for at most the
 * run's timeouts. */
int hka_run(hka_canary *c, const char *module, const hka_image *img, const hka_image *ref,
            const hka_policy *policy, hk_report *rep);

/* The canary's counters, for hk_stats. */
typedef struct hka_counters {
    uint64_t runs, refused, starts; /* starts: both helpers' */
    uint64_t refused_by[HKA_NKINDS];
    double ms_total;                 /* time spent in runs */
    double last_new_ms, last_old_ms; /* the last timed run's figures */
    int sanitizer;                   /* the memcheck helper is on */
} hka_counters;

/* The plain helper's pid (0: none running), and the memcheck helper's. */
pid_t hka_helper_pid(hka_canary *c);
pid_t hka_memcheck_pid(hka_canary *c);
void hka_counts(hka_canary *c, hka_counters *out);
int hka_enabled(const hka_canary *c); /* configured with a helper */
/* 1 when test launches run under memcheck first; else 0 and why (may be
 * NULL) says why not ("" when no sanitizer was configured). */
int hka_sanitizer(hka_canary *c, char *why, size_t n);
/* The memcheck helper's command line for a sanitizer at `sanitizer`, the
 * helper at `helper`, device `dev` and owner pid `owner` (decimal strings
 * held by the caller): fills argv (room for HKA_SAN_ARGC entries, NULL
 * ended) and returns the count. */
#define HKA_SAN_ARGC 28
int hka_sanitizer_argv(char **argv, const char *sanitizer, const char *helper, const char *dev,
                       const char *owner);
/* Tests: the signal a helper is killed with (SIGKILL) and how long a kill
 * waits for its end before the helper is left to be reaped later (2000 ms),
 * so that a test can have helpers that outlive their kill. */
void hka_set_kill(hka_canary *c, int sig, int wait_ms);

#endif /* HK_CANARY_H */

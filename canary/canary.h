/*
 * canary/: runs a version's test launches in a helper process before it is
 * committed. Private header shared by the parent side (canary.c, linked
 * into libhotkern), the wire protocol (proto.c, both sides) and the helper
 * executable (helper.c, `hotkern-canary`).
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
 * messages (hku_msg_hdr, util/wire.c, magic HKA_MAGIC), one request and one reply at a time. Each
 * side treats the other as untrusted: sizes are bounded before anything is allocated, replies are
 * parsed strictly (a field too many or too few is a malformed reply), and the parent waits for
 * every reply with a deadline.
 *
 *   helper -> READY  {u32 protocol, i32 arch}   once, after its context exists
 *                    or FAIL {text} when it cannot make one
 *   LOAD   {u32 slot, u32 format, bytes}  -> LOADED {i32 cu, str name, str log}
 *   LAUNCH {u32 slot, str entry, u32 grid[3], block[3], shared, u32 nargs,
 *           per arg: u32 kind, u64 size, u32 fill, u64 param, [bytes];
 *           u32 outputs}
 *          -> RESULT {u32 stage, i32 cu, str name, u32 nout,
 *                     per buffer: u32 index, u64 size, bytes}
 *   A finished launch returns every buffer when `outputs` is 1 (they are to
 *   be compared) and none when it is 0: copying 4 MiB back and through the
 *   socket was most of a canary run's cost (bench_canary).
 *
 * Slots: 0 holds the new version's image, 1 the running version's (for
 * comparisons). A fault poisons the helper's context, so after one the parent
 * kills the helper and starts another.
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

#define HKA_PROTOCOL 2
#define HKA_MAGIC    0x4e4b4348u /* "HCKN" */

/* Bounds of the protocol, checked by both sides before allocating. */
#define HKA_MAX_IMAGE      (64u << 20) /* bytes of one image */
#define HKA_MAX_TEST_BYTES (64u << 20) /* all buffers of one test launch */
#define HKA_MAX_MSG        (HKA_MAX_IMAGE + (1u << 16))
#define HKA_MAX_ARGS       64
#define HKA_MAX_SCALAR     4096 /* bytes of one by-value argument */
#define HKA_MAX_TESTS      16   /* per kernel */
#define HKA_MAX_TEXT       4096 /* names and logs in replies */

enum hka_msg_type {
    HKA_READY = 1,
    HKA_FAIL = 2,
    HKA_LOAD = 3,
    HKA_LOADED = 4,
    HKA_LAUNCH = 5,
    HKA_RESULT = 6,
};

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

/* ---- canary.c: the parent side ------------------------------------------ */

typedef struct hka_canary hka_canary;

typedef struct hka_config {
    const char *helper; /* path of hotkern-canary (resolved by the caller) */
    int device;         /* CUDA ordinal the helper attaches to */
    int timeout_ms;     /* per test launch; start and loads get 10x */
    int start;          /* 1: start the helper now (a runtime with canaries) */
} hka_config;

/* Makes the canary of a runtime. With cfg->start, the helper is started at
 * once (its READY is read by the first run). Returns 0, HK_ERR_NOMEM, or
 * HK_ERR_IO with why when the helper cannot be started. */
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
} hka_image;

/* Runs every test of module's kernels on img and, where a test compares,
 * on ref (the running version; NULL when none) with the same inputs.
 * policy: HK_CANARY_OPTIONAL or HK_CANARY_REQUIRE (SKIP is decided by the
 * caller). Returns 0 when the version may go on (tests passed, none declared,
 * or the canary could not run under OPTIONAL), else HK_ERR_CANARY (or
 * HK_ERR_MISSING_KERNEL / HK_ERR_LAYOUT for a test that does not fit) with
 * rep->message, rep->kernel, rep->cu_name and rep->canary saying what happened.
 * Blocks the calling thread for at most the run's timeouts. */
int hka_run(hka_canary *c, const char *module, const hka_image *img, const hka_image *ref,
            int policy, hk_report *rep);

/* The helper's pid (0: none running), and counters; for tests and stats. */
pid_t hka_helper_pid(hka_canary *c);
void hka_counts(hka_canary *c, uint64_t *runs, uint64_t *refused, uint64_t *starts);
int hka_enabled(const hka_canary *c); /* configured with a helper */
/* Tests: the signal a helper is killed with (SIGKILL) and how long a kill
 * waits for its end before the helper is left to be reaped later (2000 ms),
 * so that a test can have helpers that outlive their kill. */
void hka_set_kill(hka_canary *c, int sig, int wait_ms);

#endif /* HK_CANARY_H */

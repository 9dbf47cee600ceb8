/*
 * The parent side of build isolation (ptx.h, "build isolation", has the
 * protocol): starts `hotkern-build`, sends it one compile at a time, and
 * waits for the reply under a deadline.
 *
 * Why a process. nvrtcCompileProgram (measured with NVRTC 13.0) replaces
 * the process's SIGINT, SIGTERM and SIGXFSZ dispositions for the duration of
 * each compile and restores what it saw at the start: a SIGTERM during a
 * compile ends the process with NVRTC's status 4, and a handler installed
 * meanwhile is lost. A source that crashes or hangs the compiler would also
 * take the application with it. In the helper, none of that reaches the
 * application: its dispositions are never touched, and a crash or a hang
 * costs one refused build.
 *
 * The helper is untrusted: the reply is bounded before anything is
 * allocated and parsed strictly, and its image goes back through hkp_build's
 * own metadata parser. A helper that misses the deadline, dies, or answers
 * nonsense is killed (util/proc.c: SIGKILL, reaped by pid, never a zombie)
 * and a fresh one started for the next build; that build is refused with
 * HK_ERR_COMPILE and a report that says which of the three happened. A
 * helper found dead before a request is sent (it died while idle) is
 * replaced first and the build goes on.
 *
 * Threads: `lock` serialises builds (one request at a time per helper, so
 * builds from several threads queue) and owns the process; it is taken by
 * the building thread with no engine lock held. `busy` and the counters are
 * atomics, read by tests and stats without the lock.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ptx/ptx.h"
#include "util/util.h"

#define DEFAULT_TIMEOUT_MS 120000

struct hkp_iso {
    /* immutable */
    char *path;
    int timeout_ms, warm_arch;

    pthread_mutex_t lock;
    /* lock */
    hku_child proc;
    int ready;  /* its READY was read */
    int warmed; /* the first helper was asked to warm up; later ones are not */

    _Atomic int busy;  /* a request is with the helper */
    _Atomic pid_t pid; /* proc.pid, for readers without the lock */
    _Atomic uint64_t builds, starts;
};

/* Starts a helper; its READY is read by the first build. lock held. */
static int helper_start(hkp_iso *iso, char *why, size_t n) {
    char arch[16];
    snprintf(arch, sizeof arch, "%d", iso->warmed ? 0 : iso->warm_arch);
    char *argv[] = {iso->path, "--fd", "3", "--warm", arch, NULL};
    int err = hku_child_start(&iso->proc, "the build helper", argv, why, n);
    if (err < 0)
        return err;
    iso->warmed = 1;
    iso->ready = 0;
    atomic_store(&iso->pid, iso->proc.pid);
    atomic_fetch_add(&iso->starts, 1);
    return 0;
}

/* How long creation waits for a new helper's greeting. */
#define READY_WAIT_MS 10000

static int ensure_ready(hkp_iso *iso, double deadline, char *why, size_t n);

int hkp_iso_create(hkp_iso **out, const char *helper, int timeout_ms, int warm_arch, char *why,
                   size_t why_size) {
    *out = NULL;
    hkp_iso *iso = calloc(1, sizeof *iso);
    if (!iso || !helper || !(iso->path = strdup(helper))) {
        free(iso);
        return helper ? HK_ERR_NOMEM : HK_ERR_INVALID;
    }
    iso->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
    iso->warm_arch = warm_arch;
    hku_child_init(&iso->proc);
    pthread_mutex_init(&iso->lock, NULL);
    int err = helper_start(iso, why, why_size);
    /* Its greeting, at once: a helper that cannot run at all (a missing
     * library, the wrong protocol) fails the runtime's creation, saying so,
     * rather than every build. It greets before it loads NVRTC. */
    int r = err < 0 ? 0 : ensure_ready(iso, hku_now_ms() + READY_WAIT_MS, why, why_size);
    if (err == 0 && r < 0) {
        char how[64] = "";
        hku_child_kill(&iso->proc, how, sizeof how);
        hkp_why(why, why_size, "the build helper %s did not start: %s%s%s", helper,
                r == HKU_RECV_TIMEOUT ? "no greeting within 10 s"
                : r == HKU_RECV_EOF   ? "it ended"
                                      : "a greeting hotkern does not understand",
                how[0] ? ", " : "", how);
        err = HK_ERR_IO;
    }
    if (err < 0) {
        hkp_iso_destroy(iso);
        return err;
    }
    *out = iso;
    return 0;
}

void hkp_iso_destroy(hkp_iso *iso) {
    if (!iso)
        return;
    pthread_mutex_lock(&iso->lock);
    hku_child_finish(&iso->proc);
    atomic_store(&iso->pid, 0);
    pthread_mutex_unlock(&iso->lock);
    pthread_mutex_destroy(&iso->lock);
    free(iso->path);
    free(iso);
}

void hkp_iso_cancel(hkp_iso *iso) {
    if (iso)
        hku_child_cancel(&iso->proc); /* without lock: a build may hold it */
}

pid_t hkp_iso_pid(hkp_iso *iso) {
    /* Not under the lock: a build holds it for its whole length, and a test
     * kills the helper in the middle of one. */
    return atomic_load(&iso->pid);
}

int hkp_iso_busy(hkp_iso *iso) {
    return atomic_load(&iso->busy);
}

void hkp_iso_counts(hkp_iso *iso, uint64_t *builds, uint64_t *starts) {
    *builds = atomic_load(&iso->builds);
    *starts = atomic_load(&iso->starts);
}

/* ---- one build ----------------------------------------------------------- */

static void put_strv(hku_buf *b, const char *const *v, int n) {
    hku_put_u32(b, (uint32_t)(n > 0 ? n : 0));
    for (int i = 0; i < n; i++)
        hku_put_str(b, v[i] ? v[i] : "", HKP_ISO_MAX_STR);
}

/* 1 when a string the request carries would not fit its bound (the helper
 * would see another build than the one asked for), or a header is larger
 * than a source may be. */
static int strings_too_long(const hkp_build_opts *o, const hk_header *mem, int nmem,
                            const char *source_name) {
    const size_t max = HKP_ISO_MAX_STR;
    int bad = source_name && strlen(source_name) > max;
    for (int i = 0; !bad && i < o->nnvrtc_options; i++)
        bad = o->nvrtc_options[i] && strlen(o->nvrtc_options[i]) > max;
    for (int i = 0; !bad && i < o->nname_expressions; i++)
        bad = o->name_expressions[i] && strlen(o->name_expressions[i]) > max;
    for (int i = 0; !bad && i < nmem; i++)
        bad = (mem[i].name && strlen(mem[i].name) > max) || mem[i].size > HKP_ISO_MAX_BYTES;
    return bad;
}

/* The BUILD request; 0, or HK_ERR_TOO_LARGE / HK_ERR_NOMEM with why. */
static int request(hku_buf *b, const void *data, size_t size, hk_format fmt,
                   const hkp_build_opts *o, const hk_header *mem, int nmem, const char *source_name,
                   char *why, size_t n) {
    if (size > HKP_ISO_MAX_BYTES || o->nnvrtc_options > HKP_ISO_MAX_COUNT ||
        o->nname_expressions > HKP_ISO_MAX_COUNT || nmem > HKP_ISO_MAX_COUNT ||
        strings_too_long(o, mem, nmem, source_name)) {
        hkp_why(why, n,
                "too large for the build helper (a source or header over %u MiB, over %d "
                "options, names or headers, or one of them over %u bytes)",
                HKP_ISO_MAX_BYTES >> 20, HKP_ISO_MAX_COUNT, (unsigned)HKP_ISO_MAX_STR);
        return HK_ERR_TOO_LARGE;
    }
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd))
        cwd[0] = '\0';
    hku_buf_init(b, HKP_ISO_MAGIC, HKP_ISO_BUILD);
    uint32_t head[] = {
        (uint32_t)fmt,          (uint32_t)o->arch,          (uint32_t)o->ptx_to_cubin,
        (uint32_t)o->opt_level, (uint32_t)o->nvrtc_via_ptx, (uint32_t)o->no_toolkit,
        (uint32_t)o->pch,       (uint32_t)o->fast_compile,  (uint32_t)o->trap_guard};
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
        hku_put_u32(b, head[i]);
    hku_put_str(b, cwd, HKP_ISO_MAX_STR);
    hku_put_str(b, source_name, HKP_ISO_MAX_STR);
    put_strv(b, o->nvrtc_options, o->nnvrtc_options);
    put_strv(b, o->name_expressions, o->nname_expressions);
    uint64_t total = size;
    hku_put_u32(b, (uint32_t)nmem);
    for (int i = 0; i < nmem; i++) {
        hku_put_str(b, mem[i].name, HKP_ISO_MAX_STR);
        hku_put_u64(b, mem[i].size);
        hku_put(b, mem[i].data, mem[i].size);
        total += mem[i].size;
    }
    hku_put_u64(b, size);
    hku_put(b, data, size);
    if (b->oom || total > HKP_ISO_MAX_MSG - (64u << 20) ||
        b->len - sizeof(hku_msg_hdr) > HKP_ISO_MAX_MSG) {
        int oom = b->oom;
        hkp_why(why, n, "%s",
                oom ? "no memory for the build request"
                    : "sources and headers too large for the build helper");
        hku_buf_free(b);
        return oom ? HK_ERR_NOMEM : HK_ERR_TOO_LARGE;
    }
    return 0;
}

/* The errors a build may end with; anything else from the helper is
 * nonsense (an engine code like HK_ERR_BUSY must not be made up by it). */
static int build_error(uint32_t neg) {
    int e = -(int)neg;
    return e == HK_ERR_INVALID || e == HK_ERR_NOMEM || e == HK_ERR_FORMAT || e == HK_ERR_COMPILE ||
           e == HK_ERR_ARCH || e == HK_ERR_TOO_LARGE || e == HK_ERR_IO;
}

/* A copy of n bytes at p into *out (malloc'd); 0, or HK_ERR_NOMEM. */
static int take(const void *p, size_t n, void **out) {
    if (!n)
        return 0;
    if (!(*out = malloc(n)))
        return HK_ERR_NOMEM;
    memcpy(*out, p, n);
    return 0;
}

/* Reads a BUILT strictly into a (image, format, log, lowered names, the
 * trap guard's copy) and *rc / why. 0, or HKU_RECV_MALFORMED when the reply
 * is malformed (what says how). */
static int parse_reply(const unsigned char *d, size_t len, const hkp_build_opts *o, int *rc,
                       hkp_artifact *a, char *why, size_t n, char *what, size_t wn) {
    hku_rd rd = {d, len, 0};
    uint32_t neg = hku_get_u32(&rd);
    char w[HKP_ISO_MAX_WHY + 1];
    hku_get_str(&rd, w, sizeof w, HKP_ISO_MAX_WHY);
    char *log = hku_get_strdup(&rd, HKP_ISO_MAX_LOG, 1);
    uint32_t fmt = hku_get_u32(&rd), nl = hku_get_u32(&rd);
    if (rd.bad || (neg && !build_error(neg)) || (nl && nl != (uint32_t)o->nname_expressions) ||
        (fmt != HK_FORMAT_PTX && fmt != HK_FORMAT_CUBIN && fmt != HK_FORMAT_FATBIN && !neg)) {
        snprintf(what, wn, "result %u, format %u, %u lowered names", neg, fmt, nl);
        free(log);
        return HKU_RECV_MALFORMED;
    }
    if (log && !log[0]) {
        free(log);
        log = NULL;
    }
    a->log = log;
    if (nl && !(a->lowered_names = calloc(nl, sizeof *a->lowered_names)))
        rd.bad = 1;
    for (uint32_t i = 0; i < nl && !rd.bad; i++, a->nlowered++)
        a->lowered_names[i] = hku_get_strdup(&rd, HKP_ISO_MAX_STR, 0);
    uint64_t size = hku_get_u64(&rd);
    const char *img = size <= HKP_ISO_MAX_BYTES ? hku_get(&rd, (size_t)size) : NULL;
    /* The trap guard's copy: none (0, 0), or both its sites and its bytes,
     * and only when one was asked for. */
    uint32_t sites = hku_get_u32(&rd);
    uint64_t gsize = hku_get_u64(&rd);
    const char *g = gsize <= HKP_ISO_MAX_BYTES ? hku_get(&rd, (size_t)gsize) : NULL;
    if (rd.bad || !img || !g || hku_end(&rd) || (!neg && !size)) {
        snprintf(what, wn, "%s",
                 rd.bad || !img || !g ? "truncated, or a field over its bound"
                                      : "bytes left over, or no image");
        return HKU_RECV_MALFORMED;
    }
    /* The driver reads PTX as a C string. */
    int ptx = fmt == HK_FORMAT_PTX;
    if ((ptx && size && img[size - 1] != '\0') || (!sites) != (!gsize) || sites > (1u << 20) ||
        (sites && (neg || !o->trap_guard)) || (ptx && gsize && g[gsize - 1] != '\0')) {
        snprintf(what, wn, "PTX that does not end in a NUL, or a guard not asked for");
        return HKU_RECV_MALFORMED;
    }
    *rc = -(int)neg;
    if (neg) {
        hkp_why(why, n, "%s", w);
        return 0;
    }
    if (take(img, (size_t)size, &a->image) < 0 || take(g, (size_t)gsize, &a->guard) < 0) {
        *rc = HK_ERR_NOMEM;
        return 0;
    }
    a->size = (size_t)size;
    a->format = (hk_format)fmt;
    a->guard_size = (size_t)gsize;
    a->guard_sites = (int)sites;
    return 0;
}

static const char *recv_what(int r) {
    return r == HKU_RECV_EOF ? "died" : r == HKU_RECV_TIMEOUT ? "timed out" : "answered nonsense";
}

/* Kills the helper after a failed exchange (r), starts the next one, and
 * refuses the build saying what happened. lock held. */
static int give_up(hkp_iso *iso, int r, const char *what, char *why, size_t n) {
    char how[64], ignored[160];
    hku_child_kill(&iso->proc, how, sizeof how);
    iso->ready = 0;
    atomic_store(&iso->pid, 0);
    int restarted = helper_start(iso, ignored, sizeof ignored) == 0;
    const char *again = restarted ? "it was restarted" : "it could not be restarted";
    if (r == HKU_RECV_TIMEOUT)
        hkp_why(why, n, "build did not finish within %d ms (the build helper was killed; %s)",
                iso->timeout_ms, again);
    else if (r == HKU_RECV_EOF)
        hkp_why(why, n, "the build helper died during the build (%s); %s",
                how[0] ? how : "no exit status", again);
    else
        hkp_why(why, n, "the build helper %s%s%s; it was killed and %s", recv_what(r),
                what[0] ? ": " : "", what, restarted ? "restarted" : "not restarted");
    return HK_ERR_COMPILE;
}

/* Makes sure a live helper that said READY is there. 0, or a HKU_RECV_*
 * code (how it failed), or HK_ERR_IO with why when none can be started.
 * (The canary's helper_ready reads its helper's greeting the same way;
 * the two greetings differ in magic, payload and what a failure says.) */
static int ensure_ready(hkp_iso *iso, double deadline, char *why, size_t n) {
    if (hku_child_gone(&iso->proc)) { /* died while idle: replace it */
        iso->ready = 0;
        atomic_store(&iso->pid, 0);
        if (helper_start(iso, why, n) < 0)
            return HK_ERR_IO;
    }
    if (iso->ready)
        return 0;
    uint32_t type = 0;
    unsigned char *d = NULL;
    size_t len = 0;
    int r = hku_recv(iso->proc.fd, HKP_ISO_MAGIC, 16, deadline, &type, &d, &len);
    hku_rd rd = {d, len, 0};
    if (r == 0 && (type != HKP_ISO_READY || hku_get_u32(&rd) != HKP_ISO_PROTOCOL || hku_end(&rd)))
        r = HKU_RECV_MALFORMED;
    free(d);
    iso->ready = r == 0;
    return r;
}

static int exchange(hkp_iso *iso, hku_buf *req, const hkp_build_opts *o, hkp_artifact *a, char *why,
                    size_t n) {
    double deadline = hku_now_ms() + iso->timeout_ms;
    int r = ensure_ready(iso, deadline, why, n);
    if (r == HK_ERR_IO)
        return HK_ERR_COMPILE;
    if (r < 0)
        return give_up(iso, r, "no greeting", why, n);
    atomic_store(&iso->busy, 1);
    int sent = hku_send_by(iso->proc.fd, req, deadline);
    if (sent < 0)
        r = sent == HK_ERR_TIMEOUT ? HKU_RECV_TIMEOUT : HKU_RECV_EOF;
    uint32_t type = 0;
    unsigned char *d = NULL;
    size_t len = 0;
    if (r == 0)
        r = hku_recv(iso->proc.fd, HKP_ISO_MAGIC, HKP_ISO_MAX_MSG, deadline, &type, &d, &len);
    atomic_store(&iso->busy, 0);
    char what[96] = "";
    int rc = 0;
    if (r == 0 && type != HKP_ISO_BUILT) {
        snprintf(what, sizeof what, "a message of type %u", type);
        r = HKU_RECV_MALFORMED;
    }
    if (r == 0)
        r = parse_reply(d, len, o, &rc, a, why, n, what, sizeof what);
    free(d);
    if (r < 0) {
        /* What the reply set goes; the headers hkp_build found stay, so the
         * watcher still rebuilds when one of them changes. */
        char **deps = a->deps;
        int ndeps = a->ndeps;
        a->deps = NULL;
        a->ndeps = 0;
        hkp_artifact_free(a);
        a->deps = deps;
        a->ndeps = ndeps;
        return give_up(iso, r, what, why, n);
    }
    atomic_fetch_add(&iso->builds, 1);
    return rc;
}

int hkp_iso_build(hkp_iso *iso, const void *data, size_t size, hk_format fmt,
                  const hkp_build_opts *o, const hk_header *mem, int nmem, const char *source_name,
                  hkp_artifact *a, char *why, size_t why_size) {
    hku_buf req;
    int err = request(&req, data, size, fmt, o, mem, nmem, source_name, why, why_size);
    if (err < 0)
        return err;
    pthread_mutex_lock(&iso->lock);
    err = exchange(iso, &req, o, a, why, why_size);
    pthread_mutex_unlock(&iso->lock);
    hku_buf_free(&req);
    return err;
}

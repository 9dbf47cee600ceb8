/*
 * Logs: one line per message, with a level and a subsystem, delivered to the
 * runtime's callback or, without one, to stderr when HOTKERN_LOG asks.
 *
 * The level test is one relaxed atomic load (log.min), so a disabled message
 * costs no formatting; an enabled one is formatted into a stack buffer, never
 * the heap. Messages come from every thread hotkern runs and from under its
 * locks (the watcher's, an endpoint's), so delivery takes only log_lock, the
 * innermost lock of the runtime, for reading: hk_runtime_set_log takes it for
 * writing, which is how it knows that the old callback has returned. A
 * callback that logs or sets the log again would wait for itself; a
 * thread-local flag drops the first and refuses the second instead.
 *
 * Engine events (commits, refusals, rollbacks, reclaims, resets) are logged
 * here from hkl_emit, on the thread that emits them, before the application's
 * on_event sees them.
 *
 * Callbacks end with destroy. hk_runtime_destroy may return while one of
 * hotkern's threads still finishes (the reclaim thread's last unloads, a
 * build that cannot be interrupted), and the program may then free what its
 * callbacks use. So every call of a callback (log or event) passes cb_enter:
 * once hkl_callbacks_close has run, only the destroying thread's own calls
 * go through, and close waits (bounded) for the calls already in progress.
 * The pair is Dekker's: cb_enter counts itself in, then reads cb_closed;
 * close sets cb_closed, then reads the count; both seq_cst, so at least one
 * of the two sees the other.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/exit.h"
#include "base/abi.h"

#include "loader/log.h"

#define HKL_LOG_LINE 1024

/* Set while this thread delivers a message. */
static __thread int in_log;
/* Callbacks of any runtime this thread is inside now (nested: a callback
 * that logs to another runtime). */
static __thread int cb_depth;

/* 1 when a callback may be called now on this thread; then cb_exit after it. */
static int cb_enter(hk_runtime *rt) {
    /* While the process exits no callback is called: the program's state
     * goes with its exit handlers. */
    if (hkb_exiting())
        return 0;
    if (atomic_load(&rt->log.cb_closed) && !pthread_equal(rt->log.cb_closer, pthread_self()))
        return 0;
    atomic_fetch_add(&rt->log.cb_inflight, 1);
    if (atomic_load(&rt->log.cb_closed) && !pthread_equal(rt->log.cb_closer, pthread_self())) {
        atomic_fetch_sub(&rt->log.cb_inflight, 1);
        return 0;
    }
    cb_depth++;
    return 1;
}

static void cb_exit(hk_runtime *rt) {
    cb_depth--;
    atomic_fetch_sub(&rt->log.cb_inflight, 1);
}

int hkl_callbacks_close(hk_runtime *rt, double until_ms) {
    rt->log.cb_closer = pthread_self(); /* before cb_closed: read after it */
    atomic_store(&rt->log.cb_closed, 1);
    /* A taker waiting in hk_next_event returns HK_ERR_CLOSED, and has left
     * when destroy goes on (within the bound). */
    pthread_mutex_lock(&rt->ev.lock);
    rt->ev.closed = 1;
    pthread_cond_broadcast(&rt->ev.cond);
    while (rt->ev.takers && hkl_now_ms() < until_ms) {
        struct timespec ts;
        hku_deadline(&ts, 1000);
        pthread_cond_timedwait(&rt->ev.cond, &rt->ev.lock, &ts);
    }
    pthread_mutex_unlock(&rt->ev.lock);
    /* A destroy called from a callback of this runtime does not wait for
     * itself. */
    int own = cb_depth;
    while (atomic_load(&rt->log.cb_inflight) > own) {
        if (hkl_now_ms() >= until_ms)
            return HK_ERR_TIMEOUT;
        usleep(200);
    }
    return 0;
}

const char *hk_log_level_name(hk_log_level level) {
    switch (level) {
    case HK_LOG_DEBUG:
        return "debug";
    case HK_LOG_INFO:
        return "info";
    case HK_LOG_WARN:
        return "warn";
    case HK_LOG_ERROR:
        return "error";
    default:
        return "off";
    }
}

/* HOTKERN_LOG's level; HK_LOG_OFF when unset or not a level name. */
static int env_level(void) {
    const char *v = getenv("HOTKERN_LOG");
    if (!v)
        return HK_LOG_OFF;
    if (!strcasecmp(v, "debug"))
        return HK_LOG_DEBUG;
    if (!strcasecmp(v, "info"))
        return HK_LOG_INFO;
    if (!strcasecmp(v, "warn") || !strcasecmp(v, "warning"))
        return HK_LOG_WARN;
    if (!strcasecmp(v, "error"))
        return HK_LOG_ERROR;
    if (strcasecmp(v, "off") && *v) {
        /* Said once per process: a typo must not look like silence. */
        static _Atomic int told;
        if (!atomic_exchange(&told, 1))
            fprintf(stderr,
                    "hotkern: HOTKERN_LOG=%.40s is not a level (debug, info, warn, error, off): "
                    "no messages on stderr\n",
                    v);
    }
    return HK_LOG_OFF;
}

/* The log callback cb (NULL: none) with userdata, for levels from min up;
 * the cheap check (log.min) follows it, or HOTKERN_LOG's level without it.
 * log_lock held for writing, or at init. */
static void set_cb(hk_runtime *rt, hk_log_cb cb, void *userdata, int min) {
    rt->log.cb = cb;
    rt->log.ud = cb ? userdata : NULL;
    rt->log.cb_min = cb ? min : HK_LOG_OFF;
    atomic_store_explicit(&rt->log.min, cb ? min : rt->log.env_min, memory_order_relaxed);
}

int hkl_log_init(hk_runtime *rt) {
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    /* A hk_runtime_set_log must not wait behind a stream of messages. */
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    int r = pthread_rwlock_init(&rt->log.lock, &a);
    pthread_rwlockattr_destroy(&a);
    if (r)
        return HK_ERR_NOMEM;
    atomic_init(&rt->log.cb_closed, 0);
    atomic_init(&rt->log.cb_inflight, 0);
    rt->log.env_min = env_level();
    rt->log.cb_min = HK_LOG_OFF;
    atomic_init(&rt->log.min, rt->log.env_min);
    /* A callback from the options hears create's messages too. */
    if (rt->opt.log) {
        int min = rt->opt.log_min_level;
        set_cb(rt, rt->opt.log, rt->opt.log_userdata,
               min >= HK_LOG_DEBUG && min <= HK_LOG_OFF ? min : HK_LOG_INFO);
    }
    return 0;
}

void hkl_log_finish(hk_runtime *rt) {
    pthread_rwlock_destroy(&rt->log.lock);
}

int hk_runtime_set_log(hk_runtime *rt, hk_log_cb cb, void *userdata, hk_log_level min_level) {
    if (!rt || (int)min_level < HK_LOG_DEBUG || min_level > HK_LOG_OFF)
        return HK_ERR_INVALID;
    if (in_log)
        return HK_ERR_BUSY;
    pthread_rwlock_wrlock(&rt->log.lock);
    set_cb(rt, cb, userdata, (int)min_level);
    pthread_rwlock_unlock(&rt->log.lock);
    return 0;
}

int hk_log_enabled(hk_runtime *rt, hk_log_level level) {
    return rt && (int)level >= atomic_load_explicit(&rt->log.min, memory_order_relaxed) &&
           level < HK_LOG_OFF;
}

static void deliver(hk_runtime *rt, hk_log_level level, const char *subsystem, const char *text) {
    in_log = 1;
    pthread_rwlock_rdlock(&rt->log.lock);
    /* Checked again under the lock: the callback may have changed. */
    if (rt->log.cb) {
        if ((int)level >= rt->log.cb_min && cb_enter(rt)) {
            rt->log.cb(level, subsystem, text, rt->log.ud);
            cb_exit(rt);
        }
    } else if ((int)level >= rt->log.env_min) {
        /* One call, so that threads' lines do not interleave. */
        fprintf(stderr, "hotkern: %s %s: %s\n", hk_log_level_name(level), subsystem, text);
    }
    pthread_rwlock_unlock(&rt->log.lock);
    in_log = 0;
}

void hk_log(hk_runtime *rt, hk_log_level level, const char *subsystem, const char *fmt, ...) {
    char line[HKL_LOG_LINE];
    va_list ap;
    if (!fmt || in_log || !hk_log_enabled(rt, level))
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One line whatever the text held (file names may hold newlines). */
    for (char *p = line; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = ' ';
    deliver(rt, level, subsystem ? subsystem : "app", line);
}

/* ---- engine events ----------------------------------------------------- */

/* ---- the event queue ---------------------------------------------------- */

int hk_events_queue(hk_runtime *rt, int capacity) {
    if (!rt || capacity < 0)
        return HK_ERR_INVALID;
    int err = 0;
    pthread_mutex_lock(&rt->ev.lock);
    if (!rt->ev.q) {
        int cap = capacity ? capacity : 256;
        int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        hk_queued_event *q = fd >= 0 ? calloc((size_t)cap, sizeof *q) : NULL;
        if (!q) {
            if (fd >= 0)
                close(fd);
            err = HK_ERR_NOMEM;
        } else {
            rt->ev.q = q;
            rt->ev.cap = cap;
            atomic_store(&rt->ev.fd, fd);
        }
    }
    pthread_mutex_unlock(&rt->ev.lock);
    return err;
}

int hk_event_fd(hk_runtime *rt) {
    return rt ? atomic_load(&rt->ev.fd) : -1;
}

/* A copy of the event, queued (evq_lock taken here; a leaf). */
static void queue_event(hk_runtime *rt, const hk_event *ev) {
    pthread_mutex_lock(&rt->ev.lock);
    if (!rt->ev.q || rt->ev.closed) {
        pthread_mutex_unlock(&rt->ev.lock);
        return;
    }
    if (rt->ev.n == rt->ev.cap) {
        /* Full: the oldest goes, and the one taken next after it counts it
         * (with what it counted itself). */
        uint64_t lost = rt->ev.q[rt->ev.head].dropped + 1;
        rt->ev.head = (rt->ev.head + 1) % rt->ev.cap;
        if (--rt->ev.n)
            rt->ev.q[rt->ev.head].dropped += lost;
        else
            rt->ev.dropped += lost;
    }
    hk_queued_event *e = &rt->ev.q[(rt->ev.head + rt->ev.n) % rt->ev.cap];
    memset(e, 0, sizeof *e);
    e->size = sizeof *e;
    e->kind = ev->kind;
    snprintf(e->module, sizeof e->module, "%s", ev->module ? ev->module : "");
    e->old_version = ev->old_version;
    e->new_version = ev->new_version;
    snprintf(e->origin, sizeof e->origin, "%s", ev->origin ? ev->origin : "");
    if (ev->report) {
        e->error = ev->report->error;
        snprintf(e->message, sizeof e->message, "%s", ev->report->message);
        e->total_ms = ev->report->total_ms;
    }
    e->dropped = rt->ev.n ? 0 : rt->ev.dropped; /* the oldest carries the count */
    if (!rt->ev.n)
        rt->ev.dropped = 0;
    rt->ev.n++;
    uint64_t one = 1;
    if (write(atomic_load(&rt->ev.fd), &one, sizeof one) < 0) {
        /* the counter is at its maximum: readable all the same */
    }
    pthread_cond_broadcast(&rt->ev.cond);
    pthread_mutex_unlock(&rt->ev.lock);
}

int hk_next_event(hk_runtime *rt, hk_queued_event *out, int timeout_ms) {
    if (!rt || !out || out->size < HKB_QUEUED_EVENT_SIZE0)
        return HK_ERR_INVALID;
    pthread_mutex_lock(&rt->ev.lock);
    if (!rt->ev.q) {
        pthread_mutex_unlock(&rt->ev.lock);
        return HK_ERR_INVALID;
    }
    struct timespec ts;
    if (timeout_ms > 0)
        hku_deadline(&ts, (long)timeout_ms * 1000);
    rt->ev.takers++;
    while (!rt->ev.n && !rt->ev.closed && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&rt->ev.cond, &rt->ev.lock);
        else if (pthread_cond_timedwait(&rt->ev.cond, &rt->ev.lock, &ts))
            break;
    }
    rt->ev.takers--;
    if (rt->ev.closed)
        pthread_cond_broadcast(&rt->ev.cond); /* destroy waits for takers to leave */
    int r = rt->ev.n ? 1 : rt->ev.closed ? HK_ERR_CLOSED : 0;
    if (r == 1) {
        hkb_sized_out(out, &rt->ev.q[rt->ev.head], sizeof rt->ev.q[0]);
        rt->ev.head = (rt->ev.head + 1) % rt->ev.cap;
        if (!--rt->ev.n) { /* drained: the descriptor no longer polls readable */
            uint64_t n;
            if (read(atomic_load(&rt->ev.fd), &n, sizeof n) < 0) {
                /* already zero */
            }
        }
    }
    pthread_mutex_unlock(&rt->ev.lock);
    return r;
}

int hkl_events_init(hk_runtime *rt) {
    atomic_init(&rt->ev.fd, -1);
    if (pthread_mutex_init(&rt->ev.lock, NULL))
        return HK_ERR_NOMEM;
    if (hku_cond_init(&rt->ev.cond)) {
        pthread_mutex_destroy(&rt->ev.lock);
        return HK_ERR_NOMEM;
    }
    return 0;
}

void hkl_events_finish(hk_runtime *rt) {
    free(rt->ev.q);
    int fd = atomic_load(&rt->ev.fd);
    if (fd >= 0)
        close(fd);
    pthread_mutex_destroy(&rt->ev.lock);
    pthread_cond_destroy(&rt->ev.cond);
}

void hkl_emit_quiet(hk_runtime *rt, hk_event_kind kind, const char *module, uint64_t oldv,
                    uint64_t newv, const char *origin, const hk_report *rep) {
    hk_event ev = {sizeof ev, kind, module, oldv, newv, origin ? origin : "api", rep};
    if (atomic_load(&rt->ev.fd) >= 0)
        queue_event(rt, &ev);
    if (!rt->opt.on_event || !cb_enter(rt))
        return;
    rt->opt.on_event(&ev, rt->opt.userdata);
    cb_exit(rt);
}

/* "v3" or, for 0, what that means here. */
static const char *vtext(char *buf, size_t n, uint64_t v, const char *none) {
    if (v)
        snprintf(buf, n, "v%llu", (unsigned long long)v);
    else
        snprintf(buf, n, "%s", none);
    return buf;
}

/* The time an outcome took: the whole, or the steps a refusal got through
 * (a build refused on the worker has no total). */
static double took_ms(const hk_report *r) {
    if (!r)
        return 0;
    return r->total_ms > 0 ? r->total_ms : r->build_ms + r->stage_ms + r->commit_ms;
}

static void log_commit(hk_runtime *rt, const char *what, const char *module, uint64_t oldv,
                       uint64_t newv, const char *origin, const hk_report *r) {
    static const hk_report none;
    char was[32];
    if (!r)
        r = &none;
    hk_log(rt, HK_LOG_INFO, "engine",
           "%s %s v%llu (was %s) from %s in %.3f ms (build %.3f%s, stage %.3f, commit %.3f, "
           "wait %.3f)",
           what, module ? module : "?", (unsigned long long)newv,
           vtext(was, sizeof was, oldv, "none"), origin, r->total_ms, r->build_ms,
           r->cache_hit ? " cached" : "", r->stage_ms, r->commit_ms, r->wait_ms);
}

void hkl_log_event(hk_runtime *rt, hk_event_kind kind, const char *module, uint64_t oldv,
                   uint64_t newv, const char *origin, const hk_report *rep) {
    const char *o = origin ? origin : "api";
    char runs[32];
    switch (kind) {
    case HK_EVENT_COMMITTED:
        log_commit(rt, "committed", module, oldv, newv, o, rep);
        break;
    case HK_EVENT_ROLLED_BACK:
        log_commit(rt, "rolled back", module, oldv, newv, o, rep);
        break;
    case HK_EVENT_REFUSED: {
        /* A version replaced by a newer one before it could commit is the
         * normal course of a burst of saves, not a problem. */
        hk_log_level level = rep && rep->error == HK_ERR_SUPERSEDED ? HK_LOG_INFO : HK_LOG_WARN;
        if (!hk_log_enabled(rt, level))
            break;
        hk_log(rt, level, "engine", "refused %s from %s after %.3f ms, %s runs on: %s (%d): %s",
               module ? module : "?", o, took_ms(rep), vtext(runs, sizeof runs, oldv, "no version"),
               hk_strerror(rep ? rep->error : 0), rep ? rep->error : 0, rep ? rep->message : "");
        break;
    }
    case HK_EVENT_RECLAIMED:
        hk_log(rt, HK_LOG_DEBUG, "engine", "reclaimed %s v%llu: its code is unloaded",
               module ? module : "?", (unsigned long long)oldv);
        break;
    case HK_EVENT_CONTEXT_RESET:
        hk_log(rt, HK_LOG_WARN, "engine", "%s", rep ? rep->message : "context reset");
        break;
    case HK_EVENT_CONTEXT_LOST:
        hk_log(rt, HK_LOG_ERROR, "engine", "%s", rep ? rep->message : "context lost");
        break;
    case HK_EVENT_FALLBACK:
        hk_log(rt, HK_LOG_WARN, "engine", "%s", rep ? rep->message : "a hot launch failed");
        break;
    }
}

void hkl_emit(hk_runtime *rt, hk_event_kind kind, const char *module, uint64_t oldv, uint64_t newv,
              const char *origin, const hk_report *rep) {
    hkl_log_event(rt, kind, module, oldv, newv, origin, rep);
    hkl_emit_quiet(rt, kind, module, oldv, newv, origin, rep);
}

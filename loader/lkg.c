/*
 * Last known good: which image of each module last ran cleanly, which ones
 * are quarantined, kept across restarts (the rules are stated in
 * include/hotkern/hotkern.h, "last known good").
 *
 * Why commit times. A sticky error (a kernel faulted) is reported late, by
 * whatever CUDA call comes next, and names no kernel. What hotkern knows is
 * when each version was committed: a version committed within the suspect
 * window before the loss is suspect, and one that stayed current for the
 * window without a loss is known good. The window is measured in this
 * process only (hkl_now_ms); an earlier process's times are not trusted, so
 * what a record says about a version committed by an earlier process is
 * only what that process wrote (its good image, its quarantine).
 *
 * Pending commits. A swap notes its version (hkl_lkg_pending) before it
 * publishes it, since a launch may use the version, and fault, as soon as
 * it is published: a loss between the publication and hkl_lkg_committed
 * still finds it among the recent commits and quarantines it. A version
 * noted and then rolled back leaves the list again (hkl_lkg_unpending).
 *
 * Threads. The state in memory is under lkg_lock (a mutex private to this
 * file and lkgdisk.c, through loader/lkg.h), which is held for memory work only, never across a
 * file write: after swap_lock (commits record under it) and before stats_lock and log_lock.
 * hkl_lkg_lost runs on whichever thread saw the sticky error (a launching thread, on the launch's
 * error path only, or the reclaim thread) with no engine lock held; `lost` makes it happen once per
 * runtime.
 *
 * The directory. What goes to disk, how it is trusted, written and
 * collected is lkgdisk.c's (its top says how); this file decides what the
 * records say and when they are due.
 *
 * Release. When hk_runtime_destroy stops waiting for the reclaim thread
 * (which then frees the runtime whenever the GPU lets it), the directory is
 * let go at once, so that the next runtime can take it: hkl_lkg_release
 * records what ran long enough and writes what is due without waiting for a
 * writer in progress, then stops all disk work; the flock goes as soon as
 * the last write in progress ends. Destroy holds the state (hkl_lkg_hold)
 * across its wait, so hkl_lkg_close on the reclaim thread cannot free the
 * runtime under the release.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "base/abi.h"
#include "loader/context.h"
#include "loader/lkg.h"
#include "loader/lkgdisk.h"
#include "loader/log.h"
#include "loader/record.h"
#include "util/util.h"

int hkl_lkg_sticky(int r) {
    switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED:
        return 1;
    default:
        return 0;
    }
}

/* hku_strv_dup of a library-owned array. */
static char **strv_dup(char *const *v, int n) {
    return hku_strv_dup((const char *const *)v, n);
}

static lkg_mod *mod_get(hkl_lkg *l, const char *name) {
    lkg_mod *m = hkl_lkg_mod_find(l, name);
    if (m || !(m = hkl_lkg_mod_new()))
        return m;
    snprintf(m->rec.module, sizeof m->rec.module, "%s", name);
    hkl_lkg_mod_insert(l, m);
    return m;
}

/* ---- open and close ------------------------------------------------------- */

int hkl_lkg_open(hk_runtime *rt, hk_report *rep) {
    hkl_lkg *l = calloc(1, sizeof *l);
    if (!l || sodium_init() < 0) {
        free(l);
        return HK_ERR_NOMEM;
    }
    rt->lkg = l;
    pthread_mutex_init(&l->lock, NULL);
    pthread_mutex_init(&l->img_lock, NULL);
    pthread_cond_init(&l->idle, NULL);
    l->lockfd = l->dfd = l->img_fd = l->mod_fd = -1;
    l->now = hkl_now_ms;
    l->window = rt->opt.suspect_window_ms > 0 ? rt->opt.suspect_window_ms : 60000;
    if (!rt->opt.state_dir || !rt->opt.state_dir[0])
        return 0;
    if (strlen(rt->opt.state_dir) > 3000) {
        hku_fail(rep, HK_ERR_INVALID, "state directory path too long");
        return HK_ERR_INVALID;
    }
    if (!(l->dir = strdup(rt->opt.state_dir)))
        return HK_ERR_NOMEM;
    rt->opt.state_dir = l->dir; /* the caller's string dies with the call */
    return hkl_lkg_disk_open(rt, rep);
}

/* Promotes m's current image to known good when it has been current for the
 * window without a loss (lkg_lock). Returns 1 when the good image changed. */
static int promote(hkl_lkg *l, lkg_mod *m, double now) {
    if (!m->rec.current.has || m->cur_t < 0 || now - m->cur_t < l->window || l->frozen)
        return 0;
    if (m->rec.good.has && !memcmp(m->rec.good.hash, m->rec.current.hash, 32))
        return 0;
    char **e = strv_dup(m->cur_expr, m->ncur), **w = strv_dup(m->cur_lowered, m->ncur);
    if (m->ncur && (!e || !w)) {
        hku_strv_free(e, m->ncur);
        hku_strv_free(w, m->ncur);
        return 0; /* no memory: stays unproven, which is safe */
    }
    hkl_rec_free(&m->rec);
    m->rec.good = m->rec.current;
    m->rec.expr = e;
    m->rec.lowered = w;
    m->rec.nexpr = m->ncur;
    m->gen++;
    return 1;
}

/* Records, as at a clean end, what ran long enough, and writes every
 * record behind memory: waiting for writers in progress, or not (release). */
static void write_final(hk_runtime *rt, int nowait) {
    hkl_lkg *l = rt->lkg;
    double now = l->now();
    pthread_mutex_lock(&l->lock);
    int done = l->released;
    for (lkg_mod *m = l->mods; m && !done; m = m->next)
        promote(l, m, now);
    pthread_mutex_unlock(&l->lock);
    if (done)
        return;
    hkl_lkg_write_due(rt, 1, nowait);
    hkl_lkg_collect(rt);
}

void hkl_lkg_hold(hk_runtime *rt) {
    hkl_lkg *l = rt->lkg;
    if (!l)
        return;
    pthread_mutex_lock(&l->lock);
    l->holds++;
    pthread_mutex_unlock(&l->lock);
}

void hkl_lkg_release(hk_runtime *rt, int gave_up) {
    hkl_lkg *l = rt->lkg;
    if (!l)
        return;
    if (gave_up) {
        write_final(rt, 1);
        hkl_lkg_let_go(l);
    }
    pthread_mutex_lock(&l->lock);
    if (--l->holds == 0)
        pthread_cond_broadcast(&l->idle);
    pthread_mutex_unlock(&l->lock); /* rt may be freed from here on */
}

void hkl_lkg_close(hk_runtime *rt) {
    hkl_lkg *l = rt->lkg;
    if (!l)
        return;
    /* The reclaim thread may get here while destroy still releases the
     * directory: the runtime stays until that is done. */
    pthread_mutex_lock(&l->lock);
    while (l->holds)
        pthread_cond_wait(&l->idle, &l->lock);
    pthread_mutex_unlock(&l->lock);
    write_final(rt, 0);
    hkl_lkg_let_go(l);
    pthread_mutex_lock(&l->lock);
    while (l->writers) /* none at a normal end; after a release, a last write */
        pthread_cond_wait(&l->idle, &l->lock);
    while (l->mods) {
        lkg_mod *m = l->mods;
        l->mods = m->next;
        hkl_lkg_mod_free(m);
    }
    while (l->unwritten)
        hkl_lkg_unwritten_remove(l, l->unwritten);
    while (l->refusals) {
        lkg_refusal *r = l->refusals;
        l->refusals = r->next;
        free(r->h);
        free(r);
    }
    pthread_mutex_unlock(&l->lock);
    int fds[] = {l->dfd, l->img_fd, l->mod_fd};
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    pthread_mutex_destroy(&l->lock);
    pthread_mutex_destroy(&l->img_lock);
    pthread_cond_destroy(&l->idle);
    free(l->dir);
    free(l);
    rt->lkg = NULL;
}

void hkl_lkg_set_clock(hk_runtime *rt, double (*now)(void)) {
    rt->lkg->now = now;
}

/* ---- commits and checks ------------------------------------------------- */

/* Notes a commit of this process for the suspect window (lkg_lock); an
 * entry for the same version (noted while pending) is kept as it is. */
static void recent_add(lkg_mod *m, const uint8_t h[32], double t, uint64_t release,
                       uint64_t version) {
    for (int i = 0; i < m->nrecent; i++)
        if (m->recent[i].version == version)
            return;
    if (m->nrecent == HKL_LKG_NRECENT)
        memmove(m->recent, m->recent + 1, (HKL_LKG_NRECENT - 1) * sizeof *m->recent);
    else
        m->nrecent++;
    lkg_recent *r = &m->recent[m->nrecent - 1];
    memcpy(r->hash, h, 32);
    r->t = t;
    r->release = release;
    r->version = version;
}

void hkl_lkg_pending(hk_runtime *rt, const char *module, const uint8_t hash[32], uint64_t version,
                     uint64_t release) {
    hkl_lkg *l = rt->lkg;
    double now = l->now();
    pthread_mutex_lock(&l->lock);
    lkg_mod *m = mod_get(l, module);
    if (m)
        recent_add(m, hash, now, release, version);
    pthread_mutex_unlock(&l->lock);
}

void hkl_lkg_unpending(hk_runtime *rt, const char *module, uint64_t version) {
    hkl_lkg *l = rt->lkg;
    pthread_mutex_lock(&l->lock);
    lkg_mod *m = hkl_lkg_mod_find(l, module);
    for (int i = 0; m && i < m->nrecent; i++)
        if (m->recent[i].version == version) {
            memmove(m->recent + i, m->recent + i + 1,
                    (size_t)(m->nrecent - i - 1) * sizeof *m->recent);
            m->nrecent--;
            break;
        }
    pthread_mutex_unlock(&l->lock);
}

/* Makes v m's current image in memory (lkg_lock); takes e and w. */
static void set_current(hkl_lkg *l, lkg_mod *m, const hkl_version *v, const uint8_t h[32],
                        uint64_t release, char **e, char **w, double now) {
    promote(l, m, now); /* the version replaced ran long enough */
    hku_strv_free(m->cur_expr, m->ncur);
    hku_strv_free(m->cur_lowered, m->ncur);
    m->cur_expr = e;
    m->cur_lowered = w;
    m->ncur = v->art.nlowered;
    m->rec.current = (hkl_rec_image){.has = 1, .format = v->art.format, .release = release};
    memcpy(m->rec.current.hash, h, 32);
    m->cur_t = now;
    recent_add(m, h, now, release, v->number);
    m->gen++;
}

/* Whether a record on disk names image h (lkg_lock): it is on disk then,
 * and stays while the record does or memory names it. */
static int on_disk(const hkl_lkg *l, const uint8_t h[32]) {
    for (const lkg_mod *m = l->mods; m; m = m->next)
        if (hkl_lkg_same_image(&m->disk_cur, h) || hkl_lkg_same_image(&m->disk_good, h))
            return 1;
    return 0;
}

/* A copy of v's image to queue as unwritten; NULL without memory. */
static lkg_img *image_copy(const hkl_version *v, const uint8_t h[32]) {
    lkg_img *img = calloc(1, sizeof *img);
    if (img && !(img->data = malloc(v->art.size))) {
        free(img);
        return NULL;
    }
    if (img) {
        memcpy(img->hash, h, 32);
        memcpy(img->data, v->art.image, v->art.size);
        img->size = v->art.size;
    }
    return img;
}

/* Whether a commit of image h must queue a copy (lkg_lock): neither queued
 * already nor on disk under a record. */
static int must_queue(const hkl_lkg *l, const uint8_t h[32]) {
    return l->dir && !hkl_lkg_unwritten_find(l, h) && !on_disk(l, h);
}

void hkl_lkg_committed(hk_runtime *rt, const hkl_version *v, const uint8_t *hash,
                       uint64_t release) {
    hkl_lkg *l = rt->lkg;
    uint8_t h[32];
    if (hash)
        memcpy(h, hash, 32);
    else
        hkl_lkg_hash(v->art.image, v->art.size, h);
    char **e = strv_dup(v->expr, v->art.nlowered),
         **w = strv_dup(v->art.lowered_names, v->art.nlowered);
    double now = l->now();
    /* The copy the flush writes is taken now, since v may be unloaded and
     * freed once swap_lock is released, and outside lkg_lock (an image may
     * be large). Whether it is needed is decided again below, in the same
     * section as the change, so that a record on disk cannot stop naming
     * the image between the two. */
    pthread_mutex_lock(&l->lock);
    int queue = must_queue(l, h);
    pthread_mutex_unlock(&l->lock);
    lkg_img *img = queue ? image_copy(v, h) : NULL;
    pthread_mutex_lock(&l->lock);
    lkg_mod *m = mod_get(l, v->mod->name);
    if ((queue = must_queue(l, h)) && !img)
        img = image_copy(v, h); /* rare: needed only now */
    if (!m || (v->art.nlowered && (!e || !w)) || (queue && !img)) {
        pthread_mutex_unlock(&l->lock);
        if (img)
            free(img->data);
        free(img);
        hku_strv_free(e, v->art.nlowered);
        hku_strv_free(w, v->art.nlowered);
        hk_log(rt, HK_LOG_WARN, "engine", "'%s' v%llu: out of memory, not recorded", v->mod->name,
               (unsigned long long)v->number);
        return;
    }
    if (queue) {
        img->next = l->unwritten;
        l->unwritten = img;
        img = NULL;
    }
    set_current(l, m, v, h, release, e, w, now);
    hkl_lkg_unwritten_prune(l);
    pthread_mutex_unlock(&l->lock);
    if (img) /* not needed after all */
        free(img->data);
    free(img);
}

void hkl_lkg_flush(hk_runtime *rt, const char *module) {
    hkl_lkg *l = rt ? rt->lkg : NULL;
    if (!l || !l->dir || !module)
        return;
    pthread_mutex_lock(&l->lock);
    lkg_mod *m = hkl_lkg_mod_find(l, module);
    pthread_mutex_unlock(&l->lock);
    if (m) /* modules are freed at close only */
        hkl_lkg_write_mod(rt, m, 0);
    hkl_lkg_collect(rt);
}

int hkl_lkg_check(hk_runtime *rt, const char *module, const void *image, size_t size, uint8_t h[32],
                  int *hashed, hk_report *rep) {
    hkl_lkg *l = rt->lkg;
    hkl_rec_q q[HKL_REC_MAXQ];
    int nq = 0;
    pthread_mutex_lock(&l->lock);
    lkg_mod *m = hkl_lkg_mod_find(l, module);
    if (m) {
        nq = m->rec.nq;
        memcpy(q, m->rec.q, (size_t)nq * sizeof *q);
    }
    pthread_mutex_unlock(&l->lock);
    if (!nq)
        return 0;
    if (!*hashed)
        hkl_lkg_hash(image, size, h);
    *hashed = 1;
    for (int i = 0; i < nq; i++)
        if (!memcmp(q[i].hash, h, 32)) {
            char hex[65], rel[48] = "";
            hkl_hash_hex(h, hex);
            if (q[i].release)
                snprintf(rel, sizeof rel, " (release %llu)", (unsigned long long)q[i].release);
            hku_fail(rep, HK_ERR_QUARANTINED,
                     "'%s': image %.16s%s is quarantined: it was committed shortly before "
                     "the CUDA context was lost; publish a different image",
                     module, hex, rel);
            if (rep)
                snprintf(rep->module, sizeof rep->module, "%s", module);
            return HK_ERR_QUARANTINED;
        }
    return 0;
}

/* ---- context lost ------------------------------------------------------- */

static int quarantine_add(lkg_mod *m, const lkg_recent *r) {
    for (int i = 0; i < m->rec.nq; i++)
        if (!memcmp(m->rec.q[i].hash, r->hash, 32))
            return 0;
    if (m->rec.nq == HKL_REC_MAXQ) {
        memmove(m->rec.q, m->rec.q + 1, (HKL_REC_MAXQ - 1) * sizeof *m->rec.q);
        m->rec.nq--;
    }
    hkl_rec_q *q = &m->rec.q[m->rec.nq++];
    memcpy(q->hash, r->hash, 32);
    q->release = r->release;
    q->version = r->version;
    return 1;
}

/* Applies the rule to every module in memory (lkg_lock; the caller writes
 * the records) and says what it did in msg. A version noted as pending
 * counts as committed when it was noted. */
static void quarantine_recent(hk_runtime *rt, double now, char *msg, size_t n) {
    hkl_lkg *l = rt->lkg;
    size_t k = strlen(msg);
    int any = 0;
    for (lkg_mod *m = l->mods; m; m = m->next) {
        if (promote(l, m, now))
            m->pdue = 1; /* on disk before the event too */
        for (int i = 0; i < m->nrecent; i++) {
            const lkg_recent *r = &m->recent[i];
            if (now - r->t >= l->window ||
                (m->rec.good.has && !memcmp(m->rec.good.hash, r->hash, 32)) ||
                !quarantine_add(m, r))
                continue;
            m->gen++;
            m->qdue = 1;
            if (k + 2 < n)
                k += (size_t)snprintf(msg + k, n - k, "%s%s v%llu", any++ ? ", " : "",
                                      m->rec.module, (unsigned long long)r->version);
        }
    }
    if (!any && k + 2 < n)
        snprintf(msg + k, n - k, "nothing (no version committed within %.0f ms)", l->window);
}

void hkl_lkg_lost(hk_runtime *rt, int cu, const char *where) {
    hkl_lkg *l = rt->lkg;
    if (!l || atomic_exchange(&l->lost, 1))
        return;
    hk_report rep = HK_REPORT_INIT;
    hkl_report_cu(&rep, rt, (CUresult)cu, where);
    char msg[sizeof rep.message];
    snprintf(msg, sizeof msg,
             "context lost: %s in %s; the process must restart; quarantined: ", rep.cu_name, where);
    double now = l->now();
    pthread_mutex_lock(&l->lock);
    quarantine_recent(rt, now, msg, sizeof msg); /* promotes first */
    l->frozen = 1;
    pthread_mutex_unlock(&l->lock);
    /* The quarantine and the promotions are on disk before the event (a
     * program may end in its handler). Only writers of the quarantined
     * records are waited for: a record being written when the loss came,
     * with no quarantine in it, gets its promotion at its next write. */
    hkl_lkg_write_due(rt, 0, 0);
    hkl_lkg_collect(rt);
    snprintf(rep.message, sizeof rep.message, "%s", msg);
    rep.error = HK_ERR_CUDA;
    hkl_emit(rt, HK_EVENT_CONTEXT_LOST, NULL, 0, 0, where, &rep);
    hk_report_clear(&rep);
}

int hk_runtime_note_error(hk_runtime *rt, int cu_result) {
    if (!rt || !hkl_lkg_sticky(cu_result))
        return 0;
    hkl_lkg_lost(rt, cu_result, "the application's call");
    return 1;
}

/* ---- what restore reads, and queries ------------------------------------ */

const char *hkl_lkg_dir(const hk_runtime *rt) {
    return rt->lkg->dir;
}

int hkl_lkg_goods(hk_runtime *rt, hkl_lkg_good **out, char *refused, size_t rn) {
    hkl_lkg *l = rt->lkg;
    int n = 0, cap = 0;
    hkl_lkg_good *v = NULL;
    pthread_mutex_lock(&l->lock);
    snprintf(refused, rn, "%s", l->refused);
    for (lkg_mod *m = l->mods; m; m = m->next) {
        if (!m->rec.good.has)
            continue;
        if (n == cap) {
            hkl_lkg_good *g = realloc(v, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *g);
            if (!g)
                break;
            v = g;
        }
        hkl_lkg_good *it = &v[n++];
        memset(it, 0, sizeof *it);
        snprintf(it->module, sizeof it->module, "%s", m->rec.module);
        it->good = m->rec.good;
        it->nexpr = m->rec.nexpr;
        it->expr = strv_dup(m->rec.expr, m->rec.nexpr);
        it->lowered = strv_dup(m->rec.lowered, m->rec.nexpr);
        it->runs = m->cur_t >= 0 && m->rec.current.has &&
                   !memcmp(m->rec.current.hash, m->rec.good.hash, 32);
    }
    pthread_mutex_unlock(&l->lock);
    *out = v;
    return n;
}

int hk_quarantine_get(hk_runtime *rt, int index, hk_quarantine *out) {
    if (!rt || !out || index < 0 || hkb_size_of(out) < HKB_QUARANTINE_SIZE0)
        return HK_ERR_INVALID;
    hk_quarantine q;
    hk_quarantine_init(&q);
    int err = HK_ERR_NOT_FOUND;
    pthread_mutex_lock(&rt->lkg->lock);
    for (lkg_mod *m = rt->lkg->mods; m && err; m = m->next) {
        if (index >= m->rec.nq) {
            index -= m->rec.nq;
            continue;
        }
        snprintf(q.module, sizeof q.module, "%s", m->rec.module);
        hkl_hash_hex(m->rec.q[index].hash, q.image);
        q.release_version = m->rec.q[index].release;
        q.version = m->rec.q[index].version;
        err = 0;
    }
    pthread_mutex_unlock(&rt->lkg->lock);
    if (!err)
        hkb_sized_out(out, &q, sizeof q);
    return err;
}

int hk_module_known_good(hk_runtime *rt, const char *module, char hash[65], uint64_t *release) {
    if (!rt || !module || !hash)
        return HK_ERR_INVALID;
    int err = HK_ERR_NOT_FOUND;
    pthread_mutex_lock(&rt->lkg->lock);
    lkg_mod *m = hkl_lkg_mod_find(rt->lkg, module);
    if (m && m->rec.good.has) {
        hkl_hash_hex(m->rec.good.hash, hash);
        if (release)
            *release = m->rec.good.release;
        err = 0;
    }
    pthread_mutex_unlock(&rt->lkg->lock);
    return err;
}

void hkl_lkg_counts(hk_runtime *rt, uint64_t *lost, uint64_t *quarantined) {
    uint64_t q = 0;
    if (!rt->lkg)
        return;
    pthread_mutex_lock(&rt->lkg->lock);
    for (lkg_mod *m = rt->lkg->mods; m; m = m->next)
        q += (uint64_t)m->rec.nq;
    pthread_mutex_unlock(&rt->lkg->lock);
    *lost = (uint64_t)atomic_load(&rt->lkg->lost);
    *quarantined = q;
}

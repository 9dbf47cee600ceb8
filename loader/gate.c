/*
 * The launch side's two protocols with the threads that change what
 * launches run (gate.h, "Launch gate"; reclaim.c, "Host side").
 *
 * Epoch slots. Each launching thread owns a slot, found through a
 * thread-local cache (hkl_tls) and kept for its life; hkl_enter stores the
 * epoch into it on entering a launch and zero on leaving. The reclaim thread
 * reads the slots to decide when a retired version's grace period is over,
 * and a closer of the gate reads them to wait for the launches already in
 * the driver. Slots are never unlinked while the runtime lives; a thread's
 * slot outlives the runtime when the thread still holds it at destroy.
 *
 * Fences. The order of a launcher's announcement before its loads of the
 * gate and of `current` is paid for on this side when membarrier(2) is
 * available (hkl_heavy_fence forces a full barrier on every thread of the
 * process), so the launch path needs only a compiler barrier.
 *
 * The gate. Closers (swap_lock holders and the reclaim thread)
 * count themselves in `gate`; launchers wait while it is above zero, at most
 * launch_hold_max_us. The counters here feed hk_stats; the longest section
 * so far is logged (log.c). Nothing here takes an engine lock but gate_lock,
 * a leaf, and log_lock for that message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sched.h>

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loader/gate.h"

__thread hkl_tls_entry hkl_tls __attribute__((tls_model("initial-exec")));

static pthread_key_t slot_key;
static pthread_once_t slot_key_once = PTHREAD_ONCE_INIT;

/* ---- fences ----------------------------------------------------------- */

/* Registers the process for expedited private membarriers. Returns 1 when
 * the launch path may use the asymmetric fence. HK_NO_MEMBARRIER=1 forces the
 * symmetric one (for comparison in benchmarks). */
static int membarrier_register(void) {
    const char *off = getenv("HK_NO_MEMBARRIER");
    if (off && *off == '1')
        return 0;
    long cmds = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED))
        return 0;
    return syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

/* The other half of hkl_enter's fence: after this, every launch entry
 * announced before now is visible to this thread. */
void hkl_heavy_fence(hk_runtime *rt) {
    if (rt->gate.asym_fence)
        syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    /* A sequentially consistent read-modify-write orders this thread's later
     * reads of the slots (and, unlike a bare fence, ThreadSanitizer models it). */
    atomic_fetch_add(&rt->gate.epoch, 0);
}

/* ---- epoch slots -------------------------------------------------------- */

/* Slot ownership, in `in_use`: 0 free (reusable by any thread of the
 * runtime), 1 owned by the thread whose hkl_tls points at it, 2 orphaned: the
 * runtime was destroyed while a thread still owned it, and that thread frees
 * it when it lets go (at exit, or when it next launches on another runtime). */
enum { SLOT_FREE = 0, SLOT_OWNED = 1, SLOT_ORPHANED = 2 };

/* This thread lets go of its cached slot. */
static void slot_let_go(void) {
    hkl_tslot *s = hkl_tls.slot;
    hkl_tls.slot = NULL;
    hkl_tls.rt_id = 0;
    if (s && atomic_exchange(&s->in_use, SLOT_FREE) == SLOT_ORPHANED)
        free(s);
}

/* Thread exit. */
static void slot_release(void *arg) {
    (void)arg;
    slot_let_go();
}

static void slot_key_create(void) {
    pthread_key_create(&slot_key, slot_release);
}

hkl_tslot *hkl_slot_acquire(hk_runtime *rt) {
    pthread_once(&slot_key_once, slot_key_create);
    /* The thread launches on another runtime than last time: its old slot is
     * free now (it is not inside a launch while it is here). Runtimes are
     * told apart by id, so a destroyed runtime's slot is never used again. */
    slot_let_go();
    hkl_tslot *s;
    for (s = atomic_load(&rt->gate.slots); s; s = s->next) {
        int expect = SLOT_FREE;
        if (atomic_load(&s->in_use) == SLOT_FREE &&
            atomic_compare_exchange_strong(&s->in_use, &expect, SLOT_OWNED))
            break;
    }
    if (!s) {
        if (!(s = aligned_alloc(_Alignof(hkl_tslot), sizeof *s)))
            return NULL;
        memset(s, 0, sizeof *s);
        atomic_init(&s->active, 0);
        atomic_init(&s->in_use, SLOT_OWNED);
        s->rt = rt;
        hkl_tslot *head = atomic_load(&rt->gate.slots);
        do
            s->next = head;
        while (!atomic_compare_exchange_weak(&rt->gate.slots, &head, s));
    }
    hkl_tls.slot = s;
    hkl_tls.rt_id = rt->id;
    pthread_setspecific(slot_key, (void *)1);
    return s;
}

/* Frees the slots no thread holds any more (at free). */
static void slots_free(hk_runtime *rt) {
    if (hkl_tls.rt_id == rt->id)
        slot_let_go();
    hkl_tslot *s = atomic_load(&rt->gate.slots);
    while (s) {
        hkl_tslot *n = s->next;
        /* A slot another thread still holds is left for it to free. */
        if (atomic_exchange(&s->in_use, SLOT_ORPHANED) == SLOT_FREE)
            free(s);
        s = n;
    }
    atomic_store(&rt->gate.slots, NULL);
}

/* ---- the part ---------------------------------------------------------- */

int hkl_gate_init(hk_runtime *rt) {
    hkl_gate *g = &rt->gate;
    atomic_init(&g->epoch, 1);
    atomic_init(&g->slots, NULL);
    g->asym_fence = membarrier_register();
    atomic_init(&g->closers, 0);
    atomic_init(&g->waiters, 0);
    atomic_init(&g->gen, 0);
    atomic_init(&g->t0, 0);
    atomic_init(&g->section_max_ns, 0);
    atomic_init(&g->closes, 0);
    atomic_init(&g->max_ns, 0);
    atomic_init(&g->hold_timeouts, 0);
    atomic_init(&g->launch_errors, 0);
    if (pthread_mutex_init(&g->lock, NULL))
        return HK_ERR_NOMEM;
    if (hku_cond_init(&g->cond)) {
        pthread_mutex_destroy(&g->lock);
        return HK_ERR_NOMEM;
    }
    return 0;
}

void hkl_gate_finish(hk_runtime *rt) {
    slots_free(rt);
    pthread_mutex_destroy(&rt->gate.lock);
    pthread_cond_destroy(&rt->gate.cond);
}

/* ---- the launch gate --------------------------------------------------- */

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* This thread's own gated section (closers on several threads overlap, and
 * the gate stays closed across them; a section is one thread's close..open). */
static __thread struct {
    int depth;
    uint64_t t0, in;  /* when it began; the fence and the wait for launchers (ns) */
    const char *what; /* NULL: not to be logged */
} section;

/* Closes the gate and returns once no hotkern launch is inside the driver.
 * The fence orders our store to `gate` against every launcher's announcement
 * (hkl_enter): a launcher we read as idle will see the gate closed. Launchers
 * are in the driver for microseconds unless the driver blocks them, so this
 * spins, then yields. */
void hkl_gate_close(hk_runtime *rt, const char *what) {
    uint64_t t0 = now_ns();
    if (atomic_fetch_add(&rt->gate.closers, 1) == 0) {
        atomic_store(&rt->gate.t0, t0);
        atomic_fetch_add(&rt->gate.closes, 1);
    }
    hkl_heavy_fence(rt);
    for (hkl_tslot *s = atomic_load(&rt->gate.slots); s; s = s->next)
        for (int i = 0; atomic_load(&s->active); i++) {
            if (i < 256)
                cpu_relax();
            else
                sched_yield();
        }
    if (section.depth++ == 0) {
        section.t0 = t0;
        section.in = now_ns() - t0;
        section.what = what;
    }
}

/* Every opening (even one that leaves another closer inside) starts a new
 * generation: a launcher that saw one since it began to wait goes on, so
 * back-to-back swaps cannot keep it out; at worst it then waits in the driver
 * for the one gated section in progress. A section longer than launchers
 * are held (launch_hold_max_us) and than any before is logged, with what it
 * did and how much of it was waiting for launchers already in the driver:
 * a handful of lines in a runtime's life, which say where a pause came from. */
void hkl_gate_open(hk_runtime *rt) {
    atomic_fetch_add(&rt->gate.gen, 1);
    uint64_t t0 = atomic_load(&rt->gate.t0), now = now_ns();
    if (atomic_fetch_sub(&rt->gate.closers, 1) == 1) {
        uint64_t d = now - t0, max = atomic_load(&rt->gate.max_ns);
        while (d > max && !atomic_compare_exchange_weak(&rt->gate.max_ns, &max, d))
            ;
    }
    if (atomic_load(&rt->gate.waiters)) {
        pthread_mutex_lock(&rt->gate.lock);
        pthread_cond_broadcast(&rt->gate.cond);
        pthread_mutex_unlock(&rt->gate.lock);
    }
    if (--section.depth > 0)
        return;
    uint64_t d = now - section.t0, max = atomic_load(&rt->gate.section_max_ns);
    while (d > max && !atomic_compare_exchange_weak(&rt->gate.section_max_ns, &max, d))
        ;
    if (d > max && d > (uint64_t)rt->opt.launch_hold_max_us * 1000u && section.what)
        hk_log(rt, HK_LOG_INFO, "engine",
               "the launch gate stayed closed %.3f ms for %s (%.3f ms of it fencing and waiting "
               "for launches already in the driver), the longest section so far",
               (double)d / 1e6, section.what, (double)section.in / 1e6);
}

/* A launcher at a closed gate: spins a little (gated sections are short),
 * then sleeps until an opening, at most launch_hold_max_us in all. */
void hkl_gate_wait(hk_runtime *rt) {
    atomic_fetch_add(&rt->gate.waiters, 1);
    uint64_t gen = atomic_load(&rt->gate.gen);
    for (int i = 0; i < 512; i++) {
        if (!atomic_load_explicit(&rt->gate.closers, memory_order_acquire) ||
            atomic_load_explicit(&rt->gate.gen, memory_order_acquire) != gen) {
            atomic_fetch_sub(&rt->gate.waiters, 1);
            return;
        }
        cpu_relax();
    }
    struct timespec ts;
    hku_deadline(&ts, rt->opt.launch_hold_max_us);
    pthread_mutex_lock(&rt->gate.lock);
    while (atomic_load(&rt->gate.closers) && atomic_load(&rt->gate.gen) == gen)
        if (pthread_cond_timedwait(&rt->gate.cond, &rt->gate.lock, &ts)) {
            atomic_fetch_add(&rt->gate.hold_timeouts, 1);
            break;
        }
    pthread_mutex_unlock(&rt->gate.lock);
    atomic_fetch_sub(&rt->gate.waiters, 1);
}

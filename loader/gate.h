/*
 * loader/gate.h: the launch gate and the epoch slots (gate.c holds them and
 * says how they work), with the launch path's inline half: each launch
 * brackets its driver call with hkl_enter and hkl_exit, on the launching
 * thread, taking no lock.
 */
#ifndef HK_LOADER_GATE_H
#define HK_LOADER_GATE_H

#include "loader/core.h"

/*
 * Launch gate. The driver takes a reader-preferring lock around every launch
 * and the same lock for writing around loads, cuKernelGetFunction, cuFuncLoad
 * and unloads: under continuous launches from several threads a load waits
 * for ever. Every launch of hotkern's code passes hkl_enter, so the engine
 * holds its own launchers there for the short driver sections that need the
 * writer side (hkl_gate_close/open). A launcher waits at most
 * options.launch_hold_max_us and then goes on: the gate only buys progress;
 * safety comes from the epochs and never depends on it.
 */
/* The launch gate (gate.c). `what` (a string literal) names the driver
 * work done while it is closed, for the message logged when a closing
 * lasts longer than launch_hold_max_us and longer than any before; NULL
 * logs nothing. */
void hkl_gate_close(hk_runtime *rt, const char *what);
void hkl_gate_open(hk_runtime *rt);
void hkl_gate_wait(hk_runtime *rt);
/* The other half of hkl_enter's fence: after it, every launch entry
 * announced before it is visible to the calling thread. */
void hkl_heavy_fence(hk_runtime *rt);

/* The part rt->gate. */
int hkl_gate_init(hk_runtime *rt);
void hkl_gate_finish(hk_runtime *rt);

/* This thread's slot and the runtime it is for (by id: a destroyed
 * runtime's slot is never used again); hkl_slot_acquire finds or makes one
 * when the thread launches on rt for the first time (NULL: no memory). */
hkl_tslot *hkl_slot_acquire(hk_runtime *rt);
typedef struct hkl_tls_entry {
    uint64_t rt_id;
    hkl_tslot *slot;
} hkl_tls_entry;
extern __thread hkl_tls_entry hkl_tls __attribute__((tls_model("initial-exec")));

/* Enters a launch: announces the epoch this thread read `current` in, then
 * checks the launch gate. The announcement must be ordered before the
 * following loads of the gate and of `current`. With membarrier(2) available,
 * the other side pays for that order (it forces a full barrier on every thread
 * of the process before it reads the slots), so the launch path needs only a
 * compiler barrier instead of a locked instruction; without it, a seq_cst
 * store. Either way: a closer that read this slot as idle is seen here as a
 * closed gate, and a launcher that passed the gate is seen by the closer. */
static inline hkl_tslot *hkl_enter(hk_runtime *rt) {
    hkl_tslot *s = hkl_tls.slot;
    if (__builtin_expect(hkl_tls.rt_id != rt->id || !s, 0))
        if (!(s = hkl_slot_acquire(rt)))
            return NULL;
    int waited = 0;
    for (;;) {
        /* Acquire keeps this load before the load of `current` on weakly
         * ordered machines (free on x86). */
        uint64_t e = atomic_load_explicit(&rt->gate.epoch, memory_order_acquire);
        if (__builtin_expect(rt->gate.asym_fence, 1)) {
            atomic_store_explicit(&s->active, e, memory_order_relaxed);
            atomic_signal_fence(memory_order_seq_cst);
        } else {
            atomic_store(&s->active, e);
        }
        if (__builtin_expect(!atomic_load_explicit(&rt->gate.closers, memory_order_seq_cst), 1) ||
            waited)
            return s;
        /* Closed: step out of the launch so the closer can go on, wait, and
         * announce again (a launcher that waited its maximum goes on). */
        atomic_store_explicit(&s->active, 0, memory_order_release);
        hkl_gate_wait(rt);
        waited = 1;
    }
}

static inline void hkl_exit(hkl_tslot *s) {
    atomic_store_explicit(&s->active, 0, memory_order_release);
}

#endif /* HK_LOADER_GATE_H */

/*
 * loader/lkg.h: last known good, as the other floors use it (lkg.c, and
 * lkgdisk.c's image hash and reads); the state the two files share is
 * loader/lkgdisk.h's.
 */
#ifndef HK_LOADER_LKG_H
#define HK_LOADER_LKG_H

#include "loader/core.h"
#include "loader/record.h"

/* lkg.c: last known good. lkg_lock (lkg.c's and lkgdisk.c's) comes after swap_lock
 * and before stats_lock and log_lock; it is taken on a launching thread only
 * on the error path, after the driver returned a sticky error.
 * - hkl_lkg_open at create (checks the directory, reads the records, locks
 *   the directory); hkl_lkg_close at destroy (promotes what ran long
 *   enough, writes what is behind, unlocks, frees).
 * - hkl_lkg_hold / hkl_lkg_release: bracket destroy's wait for the reclaim
 *   thread (no engine lock held). With gave_up set (the wait timed out and
 *   the reclaim thread will free the runtime), release writes what is due
 *   without waiting for a writer in progress and lets the directory go, so
 *   a new runtime can take it at once; nothing is written to it afterwards.
 *   Either way it drops the hold, after which the runtime may be freed by
 *   the reclaim thread: the caller must not touch it then unless the wait
 *   succeeded.
 * - hkl_lkg_check: HK_ERR_QUARANTINED when module's image is quarantined
 *   (no engine lock needed). The image is hashed into hash only when the
 *   module has quarantined images to compare it with, and only when
 *   *hashed is 0 (it is set then).
 * - hkl_lkg_pending: version `version` of module, image `hash`, is about to
 *   be published (swap_lock held; the launch gate may be closed: lkg_lock is
 *   only ever held for memory work, and never by a thread inside a launch):
 *   a loss from now on counts it as committed. hkl_lkg_unpending takes it
 *   back (rolled back).
 * - hkl_lkg_committed: v was just committed (swap_lock held): records it in
 *   memory and queues a copy of its image, no disk work; hash is v's
 *   image's (hkl_lkg_hash, taken before the lock) or NULL to hash it here.
 *   hkl_lkg_flush(module) then writes what the commit queued, and its
 *   record, after the image: called by the committing thread once
 *   swap_lock is released (no engine lock held), so nothing waits for the
 *   disk under swap_lock. Concurrent flushes land in commit order (the
 *   newest record wins).
 * - hkl_lkg_lost: handles a sticky error once (quarantine, records, log,
 *   event); no engine lock may be held.
 * - hkl_lkg_sticky: loader/port.h. */
int hkl_lkg_open(hk_runtime *rt, hk_report *rep);
void hkl_lkg_close(hk_runtime *rt);
int hkl_lkg_check(hk_runtime *rt, const char *module, const void *image, size_t size,
                  uint8_t hash[32], int *hashed, hk_report *rep);
void hkl_lkg_hash(const void *image, size_t size, uint8_t h[32]);
void hkl_lkg_pending(hk_runtime *rt, const char *module, const uint8_t hash[32], uint64_t version,
                     uint64_t release);
void hkl_lkg_unpending(hk_runtime *rt, const char *module, uint64_t version);
void hkl_lkg_committed(hk_runtime *rt, const hkl_version *v, const uint8_t *hash, uint64_t release);
void hkl_lkg_flush(hk_runtime *rt, const char *module);
void hkl_lkg_hold(hk_runtime *rt);
void hkl_lkg_release(hk_runtime *rt, int gave_up);
void hkl_lkg_lost(hk_runtime *rt, int cu_result, const char *where);
void hkl_lkg_counts(hk_runtime *rt, uint64_t *lost, uint64_t *quarantined);
/* For restore (restore.c). hkl_lkg_dir: the state directory, or NULL
 * (memory only). hkl_lkg_goods copies out every module's known-good image
 * and what restore needs with it (lkg_lock taken here; *out malloc'd, each
 * item's strings too; returns how many) and the records refused at open
 * (refused, rn bytes). hkl_lkg_read_image reads the kept image of hash
 * (*data malloc'd), which must hash to its name: 0, or an error with why
 * set. No engine lock needed. */
typedef struct hkl_lkg_good {
    char module[HKL_NAME_MAX];
    hkl_rec_image good;
    int nexpr; /* the good image's name expressions */
    char **expr, **lowered;
    int runs; /* this process runs it already */
} hkl_lkg_good;
const char *hkl_lkg_dir(const hk_runtime *rt);
int hkl_lkg_goods(hk_runtime *rt, hkl_lkg_good **out, char *refused, size_t rn);
int hkl_lkg_read_image(hk_runtime *rt, const uint8_t hash[32], char **data, size_t *n, char *why,
                       size_t whyn);
/* Tests: the clock the suspect window is measured with (ms). */
void hkl_lkg_set_clock(hk_runtime *rt, double (*now)(void));

#endif /* HK_LOADER_LKG_H */

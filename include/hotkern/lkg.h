/*
 * hotkern/lkg.h: last known good.
 *
 * A fault leaves the CUDA context of the process unusable, so the answer
 * is a restart on a version that ran cleanly. The runtime keeps, per
 * module, the image it runs, the last one known good and the quarantined
 * ones, in memory or in options.state_dir across restarts; a restart comes
 * up on the known-good images (hk_runtime_restore) and every source
 * refuses a quarantined one. The calls here read that state or feed it a
 * CUDA error the program saw itself.
 *
 * Part of the C API of libhotkern: a program includes hotkern/hotkern.h,
 * which includes this header after its core (the two never include each
 * other; this one alone says so).
 */
#ifndef HOTKERN_H
#error "include <hotkern/hotkern.h>: it includes this header"
#endif

#ifndef HOTKERN_LKG_H
#define HOTKERN_LKG_H

#ifdef __cplusplus
extern "C" {
#endif

/* ---- last known good ---------------------------------------------------- */

/* A kernel that faults leaves the CUDA error sticky for the whole process:
 * the process must restart. hotkern remembers, per module, which image was
 * running and which one last ran cleanly, so that the restarted process comes
 * up on that one, without the network, and refuses the image that faulted.
 *
 * Context lost. When a launch through hotkern (hk_launch, hk_launch_ex,
 * hk_launch_pinned, hk_graph_launch), a synchronise hotkern does, or a call
 * of hk_runtime_note_error returns a sticky error (CUDA_ERROR_ILLEGAL_ADDRESS,
 * _LAUNCH_FAILED, _ILLEGAL_INSTRUCTION, _MISALIGNED_ADDRESS, _INVALID_PC,
 * _HARDWARE_STACK_ERROR, _INVALID_ADDRESS_SPACE, _ASSERT, _LAUNCH_TIMEOUT,
 * _ECC_UNCORRECTABLE, _CONTAINED, _TENSOR_MEMORY_LEAK), the runtime, once:
 * - promotes each module's current version to known good when it has been
 *   current for options.suspect_window_ms;
 * - quarantines, per module, every image committed within the last
 *   suspect_window_ms except the module's known-good one (a fault is
 *   reported late and by no kernel in particular, so every recent commit is
 *   suspect, and only those);
 * - writes the records (the quarantine and the promotions), logs the loss
 *   (error) and emits HK_EVENT_CONTEXT_LOST on the thread that saw the
 *   error: a program may end in its handler.
 * A version also becomes known good when it is replaced or the runtime is
 * destroyed after it was current for suspect_window_ms.
 *
 * Kept images. With options.state_dir, every committed image (as built:
 * cubin, fatbin or PTX) is written to STATE_DIR/images/HASH (BLAKE2b-256 of
 * the image, hex; temp file and rename), and each module's record,
 * STATE_DIR/modules/NAME.rec (a line-based text, replaced atomically), names
 * its current image, its known-good image (with its name expressions) and
 * its quarantined images, with their release versions when known
 * (hk_swap_options.release_version). A record names its module inside and
 * an image must hash to its file name. Only the images a record names (in
 * memory, or on disk) stay, about two per module; a damaged record keeps
 * the images it mentions until its module writes a new one, and a write
 * that failed is tried again at the module's next commit (a record is never
 * written before the images it names). At most 32 quarantined hashes are
 * kept per module (the oldest go). Disk work happens on the committing
 * thread after it released the engine's swap lock (so hk_module_version and
 * other swaps do not wait for the disk), before the commit's event, and
 * never on the launch path (a lost context writes on the thread that saw
 * it). When hk_runtime_destroy stops waiting for the GPU, the directory is
 * unlocked before it returns, so a new runtime can use it at once.
 *
 * Trust. What the directory holds decides what restore runs, so it is used
 * only when no other local user can change it, as OpenSSH's StrictModes
 * checks: it and its files belong to the process's effective user and are
 * writable by nobody else, and every directory above it belongs to that
 * user or root and is writable by nobody else unless sticky (/tmp).
 * hk_runtime_create fails with HK_ERR_IO, the report naming the path and
 * what is wrong. Files in it are opened without following links: a link in
 * the place of `lock`, `images`, a record or an image is refused, never
 * followed; a record or image that another user could have written is not
 * restored (the report says why).
 *
 * Quarantine. An image quarantined for a module is refused by hk_swap,
 * hk_submit, pushes and pulls of that module with HK_ERR_QUARANTINED (the
 * report names the image and the release); a different image is accepted. */

/* Comes up on the last known good version of every module recorded in
 * options.state_dir: each image is read, checked against its hash, and
 * committed (origin "restore", no canary run: it ran) unless the module
 * already runs it. A record that cannot be read (truncated, garbage, an
 * image missing or altered) is skipped, and the report's message names it;
 * the others are restored. Returns the number of modules restored (>= 0),
 * HK_ERR_INVALID, or HK_ERR_UNSUPPORTED without a state directory. Safe from
 * any thread; not from a callback of rt. Since 1.0. */
HK_API int hk_runtime_restore(hk_runtime *rt, hk_report *rep);

/* Tells rt about a CUresult the application got from its own CUDA calls
 * (cudaDeviceSynchronize, cudaMemcpy ...): a sticky error is handled as
 * above (once). Returns 1 when cu_result is a sticky error, else 0. Safe from
 * any thread, not from a callback of rt; it writes files only the first
 * time. Since 1.0. */
HK_API int hk_runtime_note_error(hk_runtime *rt, int cu_result);

/* One quarantined image. Initialise with HK_QUARANTINE_INIT or
 * hk_quarantine_init; the first layout is the whole 1.0 structure. */
typedef struct hk_quarantine {
    size_t size;
    char module[64];
    char image[65];           /* BLAKE2b-256 of the image, hex */
    uint64_t release_version; /* 0 when unknown */
    uint64_t version;         /* the engine's version number it had, 0 when
                               * quarantined by an earlier process */
} hk_quarantine;

#define HK_QUARANTINE_INIT HK_SIZED_INIT(hk_quarantine)

/* Sets q to an empty entry of the caller's layout, for hk_quarantine_get.
 * Since 1.0. */
static inline void hk_quarantine_init(hk_quarantine *q) {
    memset(q, 0, sizeof *q);
    q->size = sizeof *q;
}

/* The index-th quarantined image of rt (modules in name order, oldest
 * first), written within out->size. Returns 0, HK_ERR_NOT_FOUND past the
 * last, HK_ERR_INVALID. Safe from any thread. Since 1.0. */
HK_API int hk_quarantine_get(hk_runtime *rt, int index, hk_quarantine *out);

/* The known-good image of `module` (hex into hash, 65 bytes) and its release
 * version (may be NULL). Returns 0, HK_ERR_NOT_FOUND when the module has
 * none, HK_ERR_INVALID. Safe from any thread. Since 1.0. */
HK_API int hk_module_known_good(hk_runtime *rt, const char *module, char hash[65],
                                uint64_t *release_version);

#ifdef __cplusplus
}
#endif

#endif /* HOTKERN_LKG_H */

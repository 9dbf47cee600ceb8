/*
 * hotkern/watch.h: watched directories as a source of versions.
 *
 * A watch turns the saves of kernel files into submissions (hk_submit with
 * the watch's swap options) on a thread of its own (inotify); it only
 * hands work to the engine, whose threads build and commit, and outcomes
 * arrive through the runtime's events. hk_watch_start gives the program a
 * handle to stop; hk_watch_dir adds directories to one shared watch that
 * lives as long as the runtime.
 *
 * Part of the C API of libhotkern: a program includes hotkern/hotkern.h,
 * which includes this header after its core (the two never include each
 * other; this one alone says so).
 */
#ifndef HOTKERN_H
#error "include <hotkern/hotkern.h>: it includes this header"
#endif

#ifndef HOTKERN_WATCH_H
#define HOTKERN_WATCH_H

#ifdef __cplusplus
extern "C" {
#endif

/* ---- sources: watched directories ------------------------------------- */

/* What a watch does (hk_watch_start, hk_watch_dir)
 *
 * A file NAME.cu, NAME.ptx, NAME.cubin or NAME.fatbin of a watched directory
 * becomes module NAME (file name up to its first '.', at most 63
 * characters); headers (.h, .cuh, .hpp) are tracked as dependencies of the
 * sources that include them, and travel with each CUDA C build in memory, so
 * `#include <common.cuh>` works without -I. Every change is built and
 * submitted like hk_submit with the watch's swap options; unless their
 * format names one, the extension names the format and the content must
 * hold it. Outcomes arrive through options.on_event, with origin
 * "watch:PATH".
 *
 * When a save is built. A save that ends with the writer closing the file
 * (a write in place) or with a finished file renamed over it (vim, sed -i,
 * most editors' safe write) is read and submitted at once: no waiting
 * period. A file written and kept open, and every file after the kernel's
 * event queue overflowed, is read once it has been quiet for debounce_ms
 * (and, open for writing, until it is closed, or open_wait_ms have passed).
 * A read that a write overlapped is retried, so a half-written file is never
 * built.
 *
 * Newest content wins. Saves of a module in quick succession may each be
 * read and submitted; a save supersedes the earlier ones of the same module
 * that are not committed yet: one still waiting is never built, one being
 * built is not staged. Each superseded save ends with HK_EVENT_REFUSED and
 * HK_ERR_SUPERSEDED (logged at info), and an older content is never
 * committed after a newer one. A compile cannot be interrupted, so a save
 * during a build waits for it, then builds once however many saves came
 * meanwhile. When the newest save does not build, no earlier one commits
 * in its place: the running version stays.
 *
 * Refusals. Editor droppings (dotfiles, "*~", "*.swp", "*.swx", "*.tmp",
 * "4913", "#NAME#", sed -i's "sedXXXXXX") are ignored silently. Every other
 * file that cannot become a version gets one HK_EVENT_REFUSED per change, on
 * the watch's thread, with origin "watch:PATH" and a report whose message
 * names the file and says why;
 * the report never carries the file's content (only the log of a compiler that
 * was given a real source does). Refused: a module name of 64 characters or
 * more or one hk_swap refuses (see there), a file whose content is not its extension's format, an
 * empty file (looked at again after debounce_ms when it was just closed), one over 64 MiB, and
 * anything but a regular file: FIFOs, devices and sockets are never opened, and a procfs-like file
 * (0 bytes reported, content on reading) is read once, refused, and left alone until it changes. A
 * name with another extension is refused too, in a watch that is not recursive and has no
 * extensions list (hk_watch_dir's); otherwise it is ignored silently. Files
 * present when the watch starts are refused only if named as sources.
 *
 * Symbolic links: a link whose target resolves inside the watched directory
 * (or below it) is followed, and an edit of the target counts as an edit of
 * the link. A link whose target resolves outside is refused and its target is
 * never opened; a header linked from outside is given to the compiler as an
 * #error in its place, so an include of it fails, saying why, rather than
 * reading it. */

typedef struct hk_watch hk_watch;

/* The first layout is the whole structure as first published (it ends at
 * build_profile). Each field in full: hotkern-watch(3). */
typedef struct hk_watch_options {
    size_t size;                   /* set by hk_watch_options_init */
    int debounce_ms;               /* quiet period before a file kept open, or a listing, is read;
                                    * default 50 */
    int open_wait_ms;              /* how long a file still open for writing is waited for before it
                                    * is read anyway; default 1000 */
    int recursive;                 /* 1: subdirectories at any depth too (not dot-named ones, nor
                                    * links); default 0 */
    const char *const *extensions; /* the sources this watch builds ("cu", "ptx", "cubin",
                                    * "fatbin"); NULL (default): all */
    int nextensions;
    const hk_swap_options *swap;    /* the swap options of every submission (copied); NULL: the
                                     * defaults */
    hk_build_profile build_profile; /* this watch's build profile; DEFAULT (default):
                                     * swap->build_profile */
} hk_watch_options;

/* As hk_options_init_size, for watch options. Since 1.3. */
HK_API int hk_watch_options_init_size(hk_watch_options *o, size_t size);

/* Fills o with the defaults, for the layout the program is built with.
 * Since 1.3. */
static inline void hk_watch_options_init(hk_watch_options *o) {
    (void)hk_watch_options_init_size(o, sizeof *o);
}

/* Watches directory dir with inotify, on a thread of this watch's own, and
 * submits its kernels to rt as "What a watch does" says; opt NULL means the
 * defaults. The files present now are built once (the CUDA C ones in the
 * background, like any submission). Options are copied.
 * Returns 0 with *out set; HK_ERR_INVALID (arguments, an unknown extension,
 * an options size below the first layout); HK_ERR_IO when dir is not a
 * reachable directory or inotify refuses it (the report says why);
 * HK_ERR_BUSY when a watch of rt already covers dir, or, recursive, would
 * cover one: the same directory, one inside a recursive watch, or one that a
 * recursive dir would contain (each file is watched once; stop the other
 * watch first); HK_ERR_NOMEM. On failure the report says why and *out is
 * NULL.
 * Ownership: *out is the caller's, for hk_watch_stop. hk_runtime_destroy
 * stops and frees every watch still running: a handle is invalid once the
 * runtime is destroyed, and must not be stopped then.
 * Safe from any thread, event callbacks included. Since 1.3. */
HK_API int hk_watch_start(hk_runtime *rt, const char *dir, const hk_watch_options *opt,
                          hk_watch **out, hk_report *rep);

/* Stops w and frees it. When it returns, the watch reads no file, submits
 * nothing and calls no callback any more: a callback of its thread in
 * progress (a refusal event, a log line, a submission) is waited for; w is
 * invalid. Submissions it made before are the engine's: they complete, and
 * their outcomes arrive, like any hk_submit (hk_wait_idle waits for them).
 * From an event callback that runs on w's own thread (a refusal of this
 * watch), it cannot wait for itself: w stops when that callback returns,
 * and its memory is freed with the runtime. w may be NULL. Safe from any
 * thread; not twice for one watch. Since 1.3. */
HK_API void hk_watch_stop(hk_watch *w);

/* Watches dir (not recursive), with every other default of hk_watch_options
 * and the swap options opt (copied; NULL: defaults), on the runtime's one
 * shared watch: however many directories are added this way, they share one
 * thread, and they are watched until hk_runtime_destroy. Adding a directory
 * again through this call replaces its swap options (the running watch
 * goes on; nothing is built again); a directory covered by a watch of
 * hk_watch_start is refused with HK_ERR_BUSY. Otherwise as hk_watch_start.
 * Safe from any thread. Since 1.0. */
HK_API int hk_watch_dir(hk_runtime *rt, const char *dir, const hk_swap_options *opt,
                        hk_report *rep);

#ifdef __cplusplus
}
#endif

#endif /* HOTKERN_WATCH_H */

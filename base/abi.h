/*
 * Sized public structures: how the library takes a caller's structure in and
 * hands one back (the rule is stated in include/hotkern/hotkern.h, "Sized
 * structures").
 *
 * The library never works on the caller's memory field by field. An input is
 * copied over a full structure of the library's own layout that holds the
 * defaults, but only the bytes within the caller's size; an output is filled
 * in full and copied back up to the caller's size. The rest of the library
 * then sees its own layout only, so no other file needs to know which fields
 * a caller has. The copies are a few hundred bytes at most (hk_launch_ex
 * copies 64), and the header is inline only so that libhotkern-net, which
 * links libhotkern through hk_* alone, and the fuzz targets use the same code.
 * It lives in base/, the floor every part of the library stands on: the
 * engine, the checks (ptx/check.c), the watcher and the network sources all
 * take sized structures in.
 *
 * Each structure's first layout (HKB_*_SIZE0) ends at the last field it had
 * when hotkern first published it: a size below that is refused, and fields
 * added since are optional to the library.
 */
#ifndef HK_BASE_ABI_H
#define HK_BASE_ABI_H

#include <stddef.h>
#include <string.h>

#include "hotkern/hotkern.h"

/* The offset just past field f of struct type T. */
#define HKB_END(T, f) (offsetof(T, f) + sizeof(((T *)0)->f))

#define HKB_REPORT_SIZE0        HKB_END(hk_report, cache_hit)
#define HKB_OPTIONS_SIZE0       HKB_END(hk_options, userdata)
#define HKB_SWAP_OPTIONS_SIZE0  HKB_END(hk_swap_options, origin)
#define HKB_LAUNCH_CONFIG_SIZE0 HKB_END(hk_launch_config, has_priority)
#define HKB_STATS_SIZE0         HKB_END(hk_stats, last_swap_ms)
#define HKB_QUARANTINE_SIZE0    HKB_END(hk_quarantine, version)
#define HKB_WATCH_OPTIONS_SIZE0 HKB_END(hk_watch_options, build_profile)
#define HKB_QUEUED_EVENT_SIZE0  HKB_END(hk_queued_event, dropped)
#define HKB_CHECK_OPTIONS_SIZE0 HKB_END(hk_check_options, source_name)

/* The size member of a caller's structure (its first member). */
static inline size_t hkb_size_of(const void *s) {
    size_t n;
    memcpy(&n, s, sizeof n);
    return n;
}

/* Takes the caller's structure `in` (its size first) into `full`, a structure
 * of the library's layout (full_size bytes) already holding the defaults: the
 * caller's bytes within its size replace them, and full's size becomes
 * full_size. Returns HK_ERR_INVALID, leaving full as it was, when the
 * caller's size is below `first`. */
static inline int hkb_sized_in(void *full, size_t full_size, const void *in, size_t first) {
    size_t n = hkb_size_of(in);
    if (n < first || n < sizeof n)
        return HK_ERR_INVALID;
    memcpy(full, in, n < full_size ? n : full_size);
    memcpy(full, &full_size, sizeof full_size);
    return 0;
}

/* Hands `full` (the library's layout, full_size bytes) back to the caller's
 * structure `out`, whose size was checked when it came in: only the bytes
 * within out's size are written, and out's size stays. */
static inline void hkb_sized_out(void *out, const void *full, size_t full_size) {
    size_t n = hkb_size_of(out);
    if (n > full_size)
        n = full_size;
    if (n > sizeof n)
        memcpy((char *)out + sizeof n, (const char *)full + sizeof n, n - sizeof n);
}

/* What an hk_*_init_size function does with its defaults `full` (full_size
 * bytes): writes them within `size` (zeroing what lies beyond the library's
 * layout: fields it does not know), sets o's size to `size`. HK_ERR_INVALID,
 * writing nothing, below `first`. */
static inline int hkb_sized_init(void *o, size_t size, const void *full, size_t full_size,
                                 size_t first) {
    if (!o || size < first || size < sizeof size)
        return HK_ERR_INVALID;
    memcpy(o, full, size < full_size ? size : full_size);
    if (size > full_size)
        memset((char *)o + full_size, 0, size - full_size);
    memcpy(o, &size, sizeof size);
    return 0;
}

/* Takes the caller's report for one call: the call writes into `full`,
 * which starts as the caller's report (its log is the caller's to free) or
 * empty for NULL. HK_ERR_INVALID for a report of a size below the first
 * layout, which must then be left alone. */
static inline int hkb_report_in(hk_report *full, const hk_report *rep) {
    hk_report_init(full);
    return rep ? hkb_sized_in(full, sizeof *full, rep, HKB_REPORT_SIZE0) : 0;
}

/* Hands the call's report back within the caller's size. Every owned pointer
 * (log) lies within the first layout, so nothing is lost with the fields a
 * smaller layout lacks. rep may be NULL. */
static inline void hkb_report_out(hk_report *rep, const hk_report *full) {
    if (rep)
        hkb_sized_out(rep, full, sizeof *full);
}

/* Takes the caller's swap options (NULL: the defaults) into o, the library's
 * layout; HK_ERR_INVALID for a size below the first layout. */
static inline int hkb_swap_options_in(hk_swap_options *o, const hk_swap_options *in) {
    hk_swap_options_init(o);
    return in ? hkb_sized_in(o, sizeof *o, in, HKB_SWAP_OPTIONS_SIZE0) : 0;
}

#endif /* HK_BASE_ABI_H */

/*
 * hotkern/metrics.h: counters as Prometheus text.
 *
 * One renderer makes the text of a runtime and of every source attached
 * to it (the endpoint's GET /metrics answers exactly it). Sources built on
 * hotkern attach a callback that writes their families and samples through
 * a writer valid during the call only; the runtime's source lock is held
 * meanwhile, so a callback takes only its own locks.
 *
 * Part of the C API of libhotkern: a program includes hotkern/hotkern.h,
 * which includes this header after its core (the two never include each
 * other; this one alone says so).
 */
#ifndef HOTKERN_H
#error "include <hotkern/hotkern.h>: it includes this header"
#endif

#ifndef HOTKERN_METRICS_H
#define HOTKERN_METRICS_H

#ifdef __cplusplus
extern "C" {
#endif

/* ---- metrics ----------------------------------------------------------- */

/* The Prometheus text exposition (format 0.0.4) of rt and of every source
 * attached to it: the engine's counters (hk_stats), a histogram of swap
 * durations (hotkern_swap_duration_seconds, fixed buckets from 0.25 ms to
 * 30 s), hotkern_build_info{version=...}, the watcher's counters
 * (hotkern_watch_*), and each endpoint's (hotkern_push_*, labelled
 * endpoint="ADDRESS:PORT") and puller's (hotkern_pull_*, labelled url="...").
 * Times are in seconds with at most six decimals, counts are integers: no
 * value carries binary floating-point noise. The text ends with a newline.
 *
 * hk_metrics_text writes it into buf (cap bytes, NUL-terminated) and returns
 * 0, or HK_ERR_TOO_LARGE when it needs more (buf then holds ""); *len (may be
 * NULL) receives the text's length without the NUL either way.
 * hk_metrics_text_alloc returns it in *out, malloc'd and NUL-terminated: the
 * caller frees it with free().
 * Safe from any thread, but not from a log callback or a metrics callback;
 * both return HK_ERR_INVALID for a NULL argument (or cap 0) and HK_ERR_NOMEM
 * when memory runs out. An endpoint's GET /metrics answers exactly this
 * text. Since 1.0. */
HK_API int hk_metrics_text(hk_runtime *rt, char *buf, size_t cap, size_t *len);
HK_API int hk_metrics_text_alloc(hk_runtime *rt, char **out, size_t *len);

/* Sources built on hotkern add their metrics to rt's text with a callback.
 * The writer is valid during the callback only. */
typedef struct hk_metrics_writer hk_metrics_writer;
typedef struct hk_metrics_source hk_metrics_source;

/* Called from hk_metrics_text, on its caller's thread, with the runtime's
 * source lock held: it must take only its own locks and must call no hotkern
 * function besides hk_metrics_family and hk_metrics_sample. */
typedef void (*hk_metrics_cb)(hk_metrics_writer *w, void *userdata);

/* Declares a metric family: name [a-zA-Z_:][a-zA-Z0-9_:]*, type "counter",
 * "gauge" or "untyped", help one line (may be NULL). Declaring a family
 * already declared (by the engine or another source) adds to it: families
 * print once each, in the order first declared, with all their samples.
 * Since 1.0. */
HK_API void hk_metrics_family(hk_metrics_writer *w, const char *name, const char *type,
                              const char *help);

/* Adds a sample of family `name` (declared before) with an optional label
 * (label NULL: none; the value is escaped) after the source's own label.
 * A sample with a bad name, or of an undeclared family, is dropped.
 * Since 1.0. */
HK_API void hk_metrics_sample(hk_metrics_writer *w, const char *name, const char *label,
                              const char *label_value, uint64_t value);

/* Adds a sample of family `name` (declared before) with n labels (0 to 8:
 * names[i]="values[i]", each value escaped) after the source's own label.
 * A sample with a bad or repeated label name, or of an undeclared family, is
 * dropped. Since 1.4. */
HK_API void hk_metrics_sample_labels(hk_metrics_writer *w, const char *name,
                                     const char *const *names, const char *const *values, int n,
                                     uint64_t value);

/* Attaches cb to rt: every later hk_metrics_text calls it. When label is not
 * NULL, every sample cb writes carries label=label_value first (copied), so
 * that several sources of a kind (two pullers) make distinct series. On
 * success *out is the caller's: hk_metrics_detach() it before
 * hk_runtime_destroy. Safe from any thread; HK_ERR_INVALID for a bad label.
 * Since 1.0. */
HK_API int hk_metrics_attach(hk_runtime *rt, hk_metrics_cb cb, void *userdata, const char *label,
                             const char *label_value, hk_metrics_source **out);

/* Detaches and frees s; when it returns, s's callback is not running and is
 * not called again. s may be NULL. Not from a metrics callback. Since 1.0. */
HK_API void hk_metrics_detach(hk_metrics_source *s);

#ifdef __cplusplus
}
#endif

#endif /* HOTKERN_METRICS_H */

/*
 * loader/expo.c: the Prometheus text writer behind hk_metrics_writer.
 * Needs no runtime and no CUDA header, so that a program can render a
 * source's families alone (the tests, the fuzzed endpoint).
 */
#ifndef HK_LOADER_EXPO_H
#define HK_LOADER_EXPO_H

#include <stddef.h>
#include <stdint.h>

#include "hotkern/hotkern.h"

hk_metrics_writer *hkl_mw_new(void);
void hkl_mw_free(hk_metrics_writer *w);
/* Renders the text into *out (malloc'd, NUL-terminated; the caller frees it)
 * and frees w. 0 or HK_ERR_NOMEM. */
int hkl_mw_take(hk_metrics_writer *w, char **out, size_t *len);
/* Every later sample carries label=value first (NULL: none). The strings must
 * outlive their use. */
void hkl_mw_base(hk_metrics_writer *w, const char *label, const char *value);
/* Declares a family of any type, histograms included. */
void hkl_mw_family(hk_metrics_writer *w, const char *name, const char *type, const char *help);
/* Adds a sample of family `family` named family + suffix ("_bucket"), with
 * labels already written and escaped (may be NULL) and a value as text. */
void hkl_mw_sample(hk_metrics_writer *w, const char *family, const char *suffix, const char *labels,
                   const char *value);
/* Seconds from microseconds, with no trailing zeros: "0.042", "3". */
void hkl_fmt_seconds(char *buf, size_t n, uint64_t us);

#endif /* HK_LOADER_EXPO_H */

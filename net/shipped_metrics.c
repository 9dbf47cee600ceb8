/*
 * What each module of a source runs: a binary the publisher shipped, or a
 * build of this host's own, for the Prometheus text.
 *
 * A fleet's operator wants to see that the hosts with a matching GPU
 * compile nothing and which ones fell back to a build (their driver older
 * than the publisher's toolkit, say). Each endpoint and puller keeps, per
 * module, how the last release it applied came to run, and counts the
 * releases applied each way and the shipped binaries that failed to load:
 *
 *   hotkern_release_image_info{module, image, arch}   1: image is
 *       "shipped_cubin" (arch its label) or "local_build" (arch "")
 *   hotkern_release_images_total{module, image}       releases applied each way
 *   hotkern_release_cubin_fallbacks_total{module}     shipped cubins that did
 *       not load here, the source built instead
 *
 * The source's own label (url= or endpoint=) comes first, added by the
 * runtime's writer. At most MAX_MODULES modules are kept (a source serves a
 * handful); a module beyond them is not counted, and the log of its apply
 * says what ran all the same.
 *
 * Lock: `lock` guards the table; record runs on the source's applying
 * thread, metrics on the scraping one.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

#define MAX_MODULES 64

struct module_images {
    char module[64];
    int binary;    /* the last release applied: 1 a shipped binary */
    char arch[16]; /* its label */
    uint64_t n[2]; /* releases applied: [0] built here, [1] shipped */
    uint64_t fallbacks;
};

struct hkn_shipped {
    pthread_mutex_t lock;
    struct module_images mods[MAX_MODULES]; /* lock */
    size_t nmods;                           /* lock */
};

int hkn_shipped_create(hkn_shipped **out) {
    hkn_shipped *s = calloc(1, sizeof *s);
    if (!s || pthread_mutex_init(&s->lock, NULL)) {
        free(s);
        *out = NULL;
        return HK_ERR_NOMEM;
    }
    *out = s;
    return 0;
}

void hkn_shipped_destroy(hkn_shipped *s) {
    if (!s)
        return;
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void hkn_shipped_record(hkn_shipped *s, const char *module, const hkn_artifact *a, int binary,
                        int fell_back) {
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    struct module_images *r = NULL;
    for (size_t i = 0; i < s->nmods && !r; i++)
        if (!strcmp(s->mods[i].module, module))
            r = &s->mods[i];
    if (!r && s->nmods < MAX_MODULES) {
        r = &s->mods[s->nmods++];
        snprintf(r->module, sizeof r->module, "%s", module);
    }
    if (r) {
        r->fallbacks += fell_back != 0;
        if (a) {
            r->binary = binary != 0;
            snprintf(r->arch, sizeof r->arch, "%s", binary ? a->arch : "");
            r->n[r->binary]++;
        }
    }
    pthread_mutex_unlock(&s->lock);
}

void hkn_shipped_metrics(hkn_shipped *s, hk_metrics_writer *w) {
    static const char *info = "hotkern_release_image_info", *total = "hotkern_release_images_total",
                      *fb = "hotkern_release_cubin_fallbacks_total";
    static const char *image[2] = {"local_build", "shipped_cubin"};
    if (!s)
        return;
    hk_metrics_family(w, info, "gauge",
                      "1: what the module's last release applied runs, a cubin the publisher "
                      "shipped (its arch) or a build of this host's.");
    hk_metrics_family(w, total, "counter", "Releases applied, by what their image came from.");
    hk_metrics_family(w, fb, "counter",
                      "Shipped cubins that did not load here: the source was built instead.");
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->nmods; i++) {
        const struct module_images *r = &s->mods[i];
        const char *in[] = {"module", "image", "arch"};
        if (r->n[0] || r->n[1]) {
            const char *iv[] = {r->module, image[r->binary], r->arch};
            hk_metrics_sample_labels(w, info, in, iv, 3, 1);
        }
        for (int k = 0; k < 2; k++) {
            const char *tv[] = {r->module, image[k]};
            hk_metrics_sample_labels(w, total, in, tv, 2, r->n[k]);
        }
        hk_metrics_sample(w, fb, "module", r->module, r->fallbacks);
    }
    pthread_mutex_unlock(&s->lock);
}

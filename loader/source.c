/*
 * Sources: what feeds the runtime from outside loader/ (the directory
 * watcher, the network endpoint, the puller, hk_metrics_attach) attaches an
 * hkl_source, a set of hooks (port.h); the engine calls them and knows
 * nothing else about the source.
 *
 * Locks: src_lock guards the list and is held across every hook call, so
 * that a source cannot be detached or released while one of its hooks
 * runs; it is taken with no other engine lock held, and a hook takes only
 * its own source's locks (and may submit). Release runs outside it, since a
 * source's thread may be submitting meanwhile and the worker reporting a
 * build.
 */
#include "loader/source.h"

int hkl_sources_init(hk_runtime *rt) {
    return pthread_mutex_init(&rt->src.lock, NULL) ? HK_ERR_NOMEM : 0;
}

void hkl_sources_finish(hk_runtime *rt) {
    pthread_mutex_destroy(&rt->src.lock);
}

int hkl_source_attach(hk_runtime *rt, hkl_source *src) {
    int err = 0;

    if (!rt || !src)
        return HK_ERR_INVALID;
    pthread_mutex_lock(&rt->src.lock);
    for (hkl_source *s = rt->src.list; s; s = s->next) {
        if (s == src || (src->kind && s->kind == src->kind)) {
            err = HK_ERR_BUSY;
            break;
        }
    }
    if (!err) {
        src->next = rt->src.list;
        rt->src.list = src;
    }
    pthread_mutex_unlock(&rt->src.lock);
    return err;
}

hkl_source *hkl_source_get(hk_runtime *rt, const void *kind, hkl_source *(*make)(void *arg),
                           void *arg, int *made) {
    hkl_source *s;

    *made = 0;
    if (!rt || !kind)
        return NULL;
    pthread_mutex_lock(&rt->src.lock);
    for (s = rt->src.list; s && s->kind != kind; s = s->next) {
    }
    if (!s && make && (s = make(arg)) != NULL) {
        s->kind = kind;
        s->next = rt->src.list;
        rt->src.list = s;
        *made = 1;
    }
    pthread_mutex_unlock(&rt->src.lock);
    return s;
}

void hkl_source_detach(hk_runtime *rt, hkl_source *src) {
    if (!rt || !src)
        return;
    /* Hooks run under src_lock: once it is ours, none of src's is running. */
    pthread_mutex_lock(&rt->src.lock);
    for (hkl_source **pp = &rt->src.list; *pp; pp = &(*pp)->next) {
        if (*pp == src) {
            *pp = src->next;
            src->next = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&rt->src.lock);
}

void hkl_sources_deps_built(hk_runtime *rt, const char *source_name, const char *const *deps,
                            int n) {
    if (!source_name)
        return;
    /* Held across the hooks so that a source cannot be released under one;
     * they take only their own locks, briefly. */
    pthread_mutex_lock(&rt->src.lock);
    for (hkl_source *s = rt->src.list; s; s = s->next) {
        if (s->deps_built)
            s->deps_built(s->ctx, source_name, deps, n);
    }
    pthread_mutex_unlock(&rt->src.lock);
}

/* Detaches every source and releases each, outside src_lock: a source's
 * thread may be submitting meanwhile, and the worker reporting a build. */
void hkl_sources_release(hk_runtime *rt) {
    pthread_mutex_lock(&rt->src.lock);
    hkl_source *s = rt->src.list;
    rt->src.list = NULL;
    pthread_mutex_unlock(&rt->src.lock);
    while (s) {
        hkl_source *next = s->next; /* release may free s */
        s->next = NULL;
        if (s->release)
            s->release(s->ctx);
        s = next;
    }
}

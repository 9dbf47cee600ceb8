/*
 * Releases the engine refused, remembered so that a replay costs nothing.
 *
 * A release the engine refuses has its anti-rollback record taken back
 * (net/state.c), so that a fixed kernel can be published under the same
 * version. The same signed bytes would then pass verification again and
 * reach the engine again: every replay of a captured release whose build
 * fails, or whose canary hangs, would cost a full build or canary run on the
 * endpoint's single worker (delaying every legitimate push behind it), and a
 * puller whose origin changes its ETag would rebuild the release each poll.
 *
 * So each source remembers the releases its engine refused for good
 * (verdicts on the bytes, hk_err_is_verdict; not a build that timed out on
 * a loaded host or a canary that could not run): the
 * module, the release version and the SHA-256 of the manifest's exact bytes
 * (which names every artifact by hash, so it binds the whole release), with
 * the error and its message. A release seen again is answered from here,
 * after its signature verified (an entry is never added or matched for
 * unauthenticated bytes) and before any artifact is decoded or fetched. A
 * re-signed release (another manifest) is a new release and goes to the
 * engine.
 *
 * Memory is bounded: at most HKN_REFUSED_MAX entries, and at most
 * HKN_REFUSED_PER_MODULE of one module, so that one module's refusals
 * (a key holder's mistakes, or captured releases replayed in turn) never
 * flush another's: a module at its share replaces its own least recently
 * used entry, a full table the least recently used of all (a linear scan
 * of a couple of thousand entries is nothing beside the signature check
 * before it). Entries live in memory only: a restart forgets them, and the
 * first replay after it costs one engine run again.
 *
 * The step that leads here is the sources' one way of ending a verified
 * release too (hkn_release_commit): record, apply, and on a refusal take
 * the record back and remember the refusal, in that order.
 *
 * Threads: none of its own and no lock. Each source owns one and uses it
 * from its one applying thread (the endpoint's worker, the puller's poll
 * thread).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "net/net.h"

struct entry {
    char module[64];
    uint64_t version;
    char hash[65]; /* "" for a free slot */
    int err;
    char message[HKN_REFUSED_MSG];
    uint64_t used; /* the clock value of the last add or match */
};

struct hkn_refused {
    struct entry e[HKN_REFUSED_MAX];
    uint64_t clock;
};

int hkn_refused_create(hkn_refused **out) {
    *out = calloc(1, sizeof **out);
    return *out ? 0 : HK_ERR_NOMEM;
}

void hkn_refused_destroy(hkn_refused *r) {
    free(r);
}

int hkn_refusal_is_final(int err) {
    /* The engine's one notion of a verdict (hotkern.h): a build that timed
     * out or a canary that could not run is the host's state, and the same
     * bytes are tried again once the host is well. */
    return hk_err_is_verdict(err);
}

static struct entry *find(hkn_refused *r, const char *module, uint64_t version, const char *hash) {
    for (int i = 0; i < HKN_REFUSED_MAX; i++) {
        struct entry *e = &r->e[i];
        if (e->hash[0] && e->version == version && !strcmp(e->hash, hash) &&
            !strcmp(e->module, module))
            return e;
    }
    return NULL;
}

int hkn_refused_find(hkn_refused *r, const char *module, uint64_t version, const char *hash,
                     char *message, size_t cap) {
    struct entry *e = r ? find(r, module, version, hash) : NULL;
    if (!e)
        return 0;
    e->used = ++r->clock;
    if (cap)
        snprintf(message, cap, "%s", e->message);
    return e->err;
}

void hkn_refused_add(hkn_refused *r, const char *module, uint64_t version, const char *hash,
                     int err, const char *message) {
    if (!r || !err)
        return;
    struct entry *e = find(r, module, version, hash);
    if (!e) {
        /* The module's own least recently used entry once it holds its
         * share; else a free slot, else the least recently used of all. */
        struct entry *free_slot = NULL, *oldest = NULL, *own = NULL;
        int mine = 0;
        for (int i = 0; i < HKN_REFUSED_MAX; i++) {
            struct entry *x = &r->e[i];
            if (!x->hash[0]) {
                free_slot = free_slot ? free_slot : x;
                continue;
            }
            if (!oldest || x->used < oldest->used)
                oldest = x;
            if (!strcmp(x->module, module)) {
                mine++;
                if (!own || x->used < own->used)
                    own = x;
            }
        }
        e = mine >= HKN_REFUSED_PER_MODULE ? own : free_slot ? free_slot : oldest;
    }
    snprintf(e->module, sizeof e->module, "%s", module);
    e->version = version;
    snprintf(e->hash, sizeof e->hash, "%s", hash);
    e->err = err;
    snprintf(e->message, sizeof e->message, "%s", message ? message : "");
    e->used = ++r->clock;
}

/* A manifest with a rollout is signed anew at each step, over the same
 * artifacts: its release is named by what the engine would build (the
 * module, the release and each artifact), so that a host that refused it
 * at one step is not made to build it again at the next. */
void hkn_release_identity(const hkn_manifest *m, const void *manifest, size_t len, char hash[65]) {
    if (!m->rollout.present) {
        hkn_sha256_hex(manifest, len, hash);
        return;
    }
    crypto_hash_sha256_state st;
    unsigned char h[crypto_hash_sha256_BYTES];
    char head[128];
    int n = snprintf(head, sizeof head, "hotkern-release\n%s\n%llu\n", m->module,
                     (unsigned long long)m->release);
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, (const unsigned char *)head, (unsigned long long)n);
    for (size_t i = 0; i < m->nartifacts; i++) {
        const hkn_artifact *a = &m->artifacts[i];
        n = snprintf(head, sizeof head, "%s\n%d\n%d\n%s\n", a->sha256, (int)a->format, a->header,
                     a->arch);
        crypto_hash_sha256_update(&st, (const unsigned char *)a->name, strlen(a->name) + 1);
        crypto_hash_sha256_update(&st, (const unsigned char *)head, (unsigned long long)n);
    }
    crypto_hash_sha256_final(&st, h);
    sodium_bin2hex(hash, 65, h, sizeof h);
}

int hkn_refused_check(hkn_refused *r, const hkn_manifest *m, const void *manifest, size_t len,
                      char hash[65], hk_report *rep) {
    char before[HKN_REFUSED_MSG];
    hkn_release_identity(m, manifest, len, hash);
    int prior = hkn_refused_find(r, m->module, m->release, hash, before, sizeof before);
    if (prior)
        hku_fail(rep, prior,
                 "%s v%llu was refused before (%s): %s (the same signed manifest is not applied "
                 "again; publish the release signed anew to retry)",
                 m->module, (unsigned long long)m->release, hk_err_name(prior), before);
    return prior;
}

/* Hands artifact k of m (and the release's headers) to e. */
static int apply_one(const hkn_engine *e, const hkn_manifest *m, size_t k, const void *const *bytes,
                     const size_t *sizes, const char *origin, hk_report *arep) {
    hk_header hdrs[HKN_MAX_ARTIFACTS];
    int nh = hkn_release_headers(m, bytes, sizes, hdrs);
    const void *b = bytes[k] ? bytes[k] : "";
    /* The engine records the release the host runs once it is applied (a
     * rollout's, not the manifest's serial). */
    return e->apply_named
               ? e->apply_named(e->ud, m->module, m->release, m->artifacts[k].name,
                                m->artifacts[k].format, b, sizes[k], hdrs, nh, origin, arep)
               : e->apply(e->ud, m->module, m->release, m->artifacts[k].format, b, sizes[k], hdrs,
                          nh, origin, arep);
}

int hkn_release_apply(const hkn_engine *e, const hkn_manifest *m, const void *const *bytes,
                      const size_t *sizes, const char *origin, hk_report *rep) {
    size_t fallback, k = hkn_shipped_pick(m, e, &fallback);
    hk_report arep = HK_REPORT_INIT;
    char note[512] = "";
    if (e->no_shipped)
        for (size_t i = 0; i < m->nartifacts; i++)
            if (m->artifacts[i].source[0] && hkn_arch_runs_on(m->artifacts[i].arch, e->arch)) {
                hkn_log(e, HK_LOG_INFO, "release",
                        "%s v%llu: not the shipped %s cubin '%s' (%s): "
                        "building '%s'",
                        m->module, (unsigned long long)m->release, m->artifacts[i].arch,
                        m->artifacts[i].name, e->no_shipped, m->artifacts[k].name);
                break;
            }
    int err = apply_one(e, m, k, bytes, sizes, origin, &arep);
    int fell_back = 0;
    if (err && fallback < m->nartifacts && bytes[fallback] && hkn_shipped_load_failed(err)) {
        /* A shipped cubin this host cannot load is no verdict on the
         * release: its source is built, and the log and report say so. */
        const hkn_artifact *a = &m->artifacts[k];
        snprintf(note, sizeof note,
                 "the shipped %s cubin '%.60s' (%s) did not load here: %s%s%s: %.160s", a->arch,
                 a->name, a->toolkit[0] ? a->toolkit : "toolkit unknown", hk_err_name(err),
                 arep.cu_name[0] ? " " : "", arep.cu_name, arep.message);
        hkn_log(e, HK_LOG_WARN, "release", "%s v%llu: %s; building '%s' instead", m->module,
                (unsigned long long)m->release, note, m->artifacts[fallback].name);
        hk_report_clear(&arep);
        fell_back = 1;
        k = fallback;
        err = apply_one(e, m, k, bytes, sizes, origin, &arep);
    }
    /* The engine's report carries the build detail; the release's identity
     * (module and release version) goes on top of it. */
    hk_report_clear(rep);
    *rep = arep;
    snprintf(rep->module, sizeof rep->module, "%s", m->module);
    rep->version = m->version;
    rep->error = err;
    const hkn_artifact *a = &m->artifacts[k];
    int binary = a->format == HK_FORMAT_CUBIN || a->format == HK_FORMAT_FATBIN;
    hkn_shipped_record(e->shipped, m->module, err ? NULL : a, binary, fell_back);
    if (!err) {
        if (fell_back) /* success, with what happened on the way */
            snprintf(rep->message, sizeof rep->message, "%.380s; built '%.100s' instead", note,
                     a->name);
        else if (binary && a->source[0])
            hkn_log(e, HK_LOG_INFO, "release", "%s v%llu: runs the shipped %s cubin '%s' (%s)",
                    m->module, (unsigned long long)m->release, a->arch, a->name, a->toolkit);
        return 0;
    }
    if (!rep->message[0])
        snprintf(rep->message, sizeof rep->message, "the engine refused %s v%llu: %s", m->module,
                 (unsigned long long)m->release, hk_err_name(err));
    else if (fell_back) {
        size_t n = strlen(rep->message);
        snprintf(rep->message + n, sizeof rep->message - n, " (after %.200s)", note);
    }
    return err;
}

int hkn_release_commit(const hkn_engine *e, hkn_state *s, hkn_refused *r, const hkn_manifest *m,
                       const void *const *bytes, const size_t *sizes, const char *mhash,
                       const char *origin, int keep_quarantined, int *verdict, hk_report *rep) {
    if (verdict)
        *verdict = 0;
    /* Persist first (net/state.c): the record is on disk before the engine
     * commits, and taken back if the engine refuses. */
    uint64_t prev = 0;
    int err;
    if ((err = hkn_state_lookup(s, m->module, &prev, rep)) ||
        (err = hkn_state_accept(s, m->module, m->version, rep)))
        return err;
    err = hkn_release_apply(e, m, bytes, sizes, origin, rep);
    if (verdict)
        *verdict = 1;
    if (!err)
        return 0;
    hk_report srep = HK_REPORT_INIT;
    if (!(keep_quarantined && err == HK_ERR_QUARANTINED) &&
        hkn_state_revert(s, m->module, m->version, prev, &srep) != 0) {
        size_t n = strlen(rep->message);
        snprintf(rep->message + n, sizeof rep->message - n,
                 " (v%llu stays recorded as accepted: %.200s)", (unsigned long long)m->version,
                 srep.message);
    }
    hk_report_clear(&srep);
    if (hkn_refusal_is_final(err))
        hkn_refused_add(r, m->module, m->release, mhash, err, rep->message);
    return err;
}

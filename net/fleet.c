/*
 * A puller as one host of a fleet: who it is, whether it takes a release
 * now (the gate), and what it says about it (metrics).
 *
 * Identity. The host id is hk_pull_options.host_id, else $HOTKERN_HOST_ID,
 * else /etc/machine-id, else the host name; its labels are
 * hk_pull_options.host_labels, else $HOTKERN_HOST_LABELS (comma-separated).
 * A module's bucket is the first 4 bytes of SHA-256("ID\0MODULE"), big
 * endian, modulo 10000: stable across restarts and the same on every host
 * that computes it, and independent from one module to the next, so the
 * same hosts are not always the first.
 *
 * The gate (hkn_fleet_gate), called by net/pull.c on a verified manifest
 * before any artifact is fetched: a manifest without a rollout is taken as
 * ever; with one, the host takes it when hkn_rollout_covers says it is in
 * the current step or an earlier one, and an aborted rollout (whose
 * artifacts are the previous release's) is taken by every host. A host
 * that runs the target release already has nothing to apply. A host
 * outside the step runs the stable release, the rollout's previous one: on
 * it, or on the new release, it stays; on neither (it restarted without its
 * state, or joined mid-rollout) it applies the stable release's artifacts
 * the manifest carries (HKN_GATE_STABLE); a manifest without them leaves
 * it on what it runs. None of this is an error; the metrics say each
 * (hotkern_rollout_in_step, hotkern_rollout_release).
 *
 * Metrics (hkn_fleet_metrics, through the puller's hook, labelled with its
 * URL): per module the release the host runs and since when, the target,
 * step, steps, whether the host is in the step, its bucket, the refusals by
 * reason and the last refused release; hotkern_host_info once. The engine's
 * own hotkern_launch_errors_total sits beside them in the runtime's text.
 *
 * Threads: the puller's poll thread decides and records; the metrics hook
 * reads, from any thread. `lock` guards the module records, taken alone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "net/net.h"

#define MAX_MODULES 16

/* Why a host refused a release: the label values of
 * hotkern_rollout_refusals_total, in this order. */
static const char *const reasons[HKN_REASONS] = {
    "fault",  "hang",      "mismatch", "slower", "memcheck",    "build",
    "layout", "signature", "expiry",   "hash",   "quarantined", "other",
};

struct fleet_mod {
    char module[64];
    uint64_t release;  /* the release the host runs (0: none known) */
    int64_t since;     /* unix seconds: since when, as this puller saw */
    uint64_t target;   /* the release the manifest offers (the engine's once applied) */
    uint64_t manifest; /* the manifest's version (serial) */
    unsigned step, nsteps;
    int in_step, paused, aborted;
    uint32_t bucket;
    uint64_t refusals[HKN_REASONS];
    uint64_t last_refused; /* release, 0: unknown (a signature that failed) */
    int last_reason;       /* index of reasons, -1: none yet */
    char last_ident[65];   /* what was refused last, so that it is counted once */
};

struct hkn_fleet {
    /* Immutable after create. */
    char id[HKN_HOST_ID_MAX];
    const char *id_from; /* "option", "HOTKERN_HOST_ID", "/etc/machine-id", "hostname" */
    char labels[HKN_MAX_LABELS][HKN_LABEL_MAX];
    const char *label_ptr[HKN_MAX_LABELS];
    size_t nlabels;
    char labels_text[HKN_MAX_LABELS * HKN_LABEL_MAX]; /* comma-separated */

    pthread_mutex_t lock;
    struct fleet_mod mods[MAX_MODULES]; /* lock */
    size_t nmods;                       /* lock */
    char last_module[64];               /* lock: the module of the last manifest that verified */
};

/* ---- identity ---------------------------------------------------------- */

uint32_t hkn_fleet_bucket(const char *host_id, const char *module) {
    crypto_hash_sha256_state st;
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_init(&st);
    crypto_hash_sha256_update(&st, (const unsigned char *)host_id, strlen(host_id) + 1);
    crypto_hash_sha256_update(&st, (const unsigned char *)module, strlen(module));
    crypto_hash_sha256_final(&st, h);
    uint32_t v = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
    return v % HKN_BUCKETS;
}

/* The first line of /etc/machine-id, when it is a host id. */
static int machine_id(char *out, size_t cap) {
    char buf[HKN_HOST_ID_MAX + 2];
    FILE *f = fopen("/etc/machine-id", "re");
    if (!f)
        return 0;
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    buf[strcspn(buf, "\r\n")] = '\0';
    size_t n = strlen(buf);
    if (!ok || n >= cap || !hkn_valid_host_id(buf))
        return 0;
    memcpy(out, buf, n + 1);
    return 1;
}

static int resolve_id(hkn_fleet *f, const char *opt, hk_report *rep) {
    const char *env = getenv("HOTKERN_HOST_ID");
    const char *given = opt ? opt : env && env[0] ? env : NULL;
    if (given) {
        if (!hkn_valid_host_id(given))
            return hku_fail(rep, HK_ERR_INVALID,
                            "%s '%.140s' is not a host id ([A-Za-z0-9_.:@-]{1,127})",
                            opt ? "hk_pull_options.host_id" : "HOTKERN_HOST_ID", given);
        memcpy(f->id, given, strlen(given) + 1);
        f->id_from = opt ? "option" : "HOTKERN_HOST_ID";
        return 0;
    }
    if (machine_id(f->id, sizeof f->id)) {
        f->id_from = "/etc/machine-id";
        return 0;
    }
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) == 0 && hkn_valid_host_id(host)) {
        memcpy(f->id, host, strlen(host) + 1); /* valid: shorter than f->id */
        f->id_from = "hostname";
        return 0;
    }
    return hku_fail(rep, HK_ERR_INVALID,
                    "no host id: /etc/machine-id and the host name are none ([A-Za-z0-9_.:@-]"
                    "{1,127}); set hk_pull_options.host_id or HOTKERN_HOST_ID");
}

static int resolve_labels(hkn_fleet *f, const char *opt, hk_report *rep) {
    const char *text = opt ? opt : getenv("HOTKERN_HOST_LABELS");
    const char *what = opt ? "hk_pull_options.host_labels" : "HOTKERN_HOST_LABELS";
    for (const char *p = text; p && *p;) {
        size_t n = strcspn(p, ",");
        char one[HKN_LABEL_MAX];
        if (n >= sizeof one)
            return hku_fail(rep, HK_ERR_INVALID, "%s: a label of %zu bytes, over %d", what, n,
                            HKN_LABEL_MAX - 1);
        memcpy(one, p, n);
        one[n] = '\0';
        p += n + (p[n] == ',');
        if (n == 0)
            continue; /* "a,,b" and a trailing comma name nothing */
        if (!hkn_valid_label(one))
            return hku_fail(rep, HK_ERR_INVALID, "%s: '%s' is not a label ([A-Za-z0-9_.:=/-])",
                            what, one);
        int dup = 0;
        for (size_t i = 0; i < f->nlabels && !dup; i++)
            dup = !strcmp(f->labels[i], one);
        if (dup)
            continue;
        if (f->nlabels == HKN_MAX_LABELS)
            return hku_fail(rep, HK_ERR_INVALID, "%s: more than %d labels", what, HKN_MAX_LABELS);
        snprintf(f->labels[f->nlabels], HKN_LABEL_MAX, "%s", one);
        f->label_ptr[f->nlabels] = f->labels[f->nlabels];
        f->nlabels++;
    }
    for (size_t i = 0; i < f->nlabels; i++) {
        size_t n = strlen(f->labels_text);
        snprintf(f->labels_text + n, sizeof f->labels_text - n, "%s%s", i ? "," : "", f->labels[i]);
    }
    return 0;
}

int hkn_fleet_create(const char *host_id, const char *labels, hkn_fleet **out, hk_report *rep) {
    *out = NULL;
    if (hkn_crypto_init())
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "libsodium failed to initialise");
    hkn_fleet *f = calloc(1, sizeof *f);
    if (!f)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    int err;
    if ((err = resolve_id(f, host_id, rep)) || (err = resolve_labels(f, labels, rep))) {
        free(f);
        return err;
    }
    pthread_mutex_init(&f->lock, NULL);
    *out = f;
    return 0;
}

void hkn_fleet_destroy(hkn_fleet *f) {
    if (!f)
        return;
    pthread_mutex_destroy(&f->lock);
    free(f);
}

const char *hkn_fleet_host_id(const hkn_fleet *f) {
    return f->id;
}

const char *hkn_fleet_id_source(const hkn_fleet *f) {
    return f->id_from;
}

const char *hkn_fleet_labels(const hkn_fleet *f) {
    return f->labels_text;
}

/* ---- records ----------------------------------------------------------- */

/* The record of module (lock held), made when missing: NULL when the table
 * is full (a puller serves one URL, and so one module at a time). */
static struct fleet_mod *record(hkn_fleet *f, const char *module) {
    for (size_t i = 0; i < f->nmods; i++)
        if (!strcmp(f->mods[i].module, module))
            return &f->mods[i];
    if (f->nmods == MAX_MODULES)
        return NULL;
    struct fleet_mod *r = &f->mods[f->nmods++];
    memset(r, 0, sizeof *r);
    snprintf(r->module, sizeof r->module, "%s", module);
    r->bucket = hkn_fleet_bucket(f->id, module);
    r->last_reason = -1;
    r->in_step = 1;
    r->nsteps = 1;
    return r;
}

/* What the host runs of module now (lock not held): the engine's answer,
 * or, from an engine that cannot say (the CLI's), what this puller applied. */
static uint64_t running(hkn_fleet *f, const hkn_engine *e, const char *module) {
    uint64_t rel = 0;
    if (e->release) {
        int err = e->release(e->ud, module, 0, &rel);
        return err ? 0 : rel;
    }
    pthread_mutex_lock(&f->lock);
    struct fleet_mod *r = record(f, module);
    rel = r ? r->release : 0;
    pthread_mutex_unlock(&f->lock);
    return rel;
}

/* Sets what r runs (lock held), with the time it began when it changed. */
static void runs(struct fleet_mod *r, uint64_t release) {
    if (r->release != release || !r->since) {
        r->release = release;
        r->since = release ? (int64_t)time(NULL) : 0;
    }
}

/* ---- the gate ---------------------------------------------------------- */

/* A host outside the step: on the stable release (the rollout's previous)
 * or on the release itself it stays; on neither (nothing: a restart without
 * its state, a new host; or another release), it takes the stable release
 * when the manifest carries it. Without it (a 1.4 publisher's manifest) the
 * host keeps what it runs, as before. */
static hkn_gate_action outside(const hkn_manifest *m, uint64_t running) {
    const hkn_rollout *ro = &m->rollout;
    if (!m->nprevious || !ro->previous || running == ro->previous || running == ro->release)
        return HKN_GATE_OUTSIDE;
    return HKN_GATE_STABLE;
}

void hkn_fleet_gate(hkn_fleet *f, const hkn_engine *e, const hkn_manifest *m, hkn_gate *out) {
    const hkn_rollout *ro = &m->rollout;
    uint32_t bucket = hkn_fleet_bucket(f->id, m->module);
    memset(out, 0, sizeof *out);
    out->bucket = bucket;
    out->target = m->release;
    /* An aborted rollout is the previous release, for every host. */
    out->in_step = ro->aborted || hkn_rollout_covers(ro, bucket, f->id,
                                                     (const char *const *)f->label_ptr, f->nlabels);
    out->running = running(f, e, m->module);
    if (!ro->present)
        out->action = HKN_GATE_APPLY; /* as ever: a new release is taken */
    else if (!out->in_step)
        out->action = outside(m, out->running);
    else if (out->running == out->target)
        out->action = HKN_GATE_RUNS;
    else
        out->action = HKN_GATE_APPLY;
    pthread_mutex_lock(&f->lock);
    snprintf(f->last_module, sizeof f->last_module, "%s", m->module);
    struct fleet_mod *r = record(f, m->module);
    if (r) {
        r->target = out->target;
        r->manifest = m->version;
        r->step = ro->present ? ro->step : 0;
        r->nsteps = ro->present ? (unsigned)ro->nsteps : 1;
        r->in_step = out->in_step;
        r->paused = ro->paused;
        r->aborted = ro->aborted;
        runs(r, out->running);
    }
    pthread_mutex_unlock(&f->lock);
}

void hkn_fleet_applied(hkn_fleet *f, const hkn_manifest *m) {
    pthread_mutex_lock(&f->lock);
    struct fleet_mod *r = record(f, m->module);
    if (r)
        runs(r, m->release);
    pthread_mutex_unlock(&f->lock);
}

void hkn_fleet_refresh(hkn_fleet *f, const hkn_engine *e) {
    char names[MAX_MODULES][64];
    size_t n;
    if (!e->release)
        return;
    pthread_mutex_lock(&f->lock);
    n = f->nmods;
    for (size_t i = 0; i < n; i++)
        memcpy(names[i], f->mods[i].module, sizeof names[i]);
    pthread_mutex_unlock(&f->lock);
    for (size_t i = 0; i < n; i++) {
        /* Asked without the lock: the engine takes its own. */
        uint64_t rel = running(f, e, names[i]);
        pthread_mutex_lock(&f->lock);
        struct fleet_mod *r = record(f, names[i]);
        if (r)
            runs(r, rel);
        pthread_mutex_unlock(&f->lock);
    }
}

/* ---- refusals ---------------------------------------------------------- */

int hkn_refusal_reason(int err, const char *canary_refusal) {
    const char *k = canary_refusal ? canary_refusal : "";
    switch (err) {
    case HK_ERR_CANARY:
        for (int i = 0; i <= 4; i++)
            if (!strcmp(k, reasons[i]))
                return i;
        return HKN_REASONS - 1;
    case HK_ERR_COMPILE:
    case HK_ERR_FORMAT:
    case HK_ERR_ARCH:
        return 5;
    case HK_ERR_LAYOUT:
    case HK_ERR_MISSING_KERNEL:
    case HK_ERR_GLOBAL_SIZE:
    case HK_ERR_ATTRIBUTE:
        return 6;
    case HK_ERR_SIGNATURE:
        return 7;
    case HK_ERR_EXPIRED:
        return 8;
    case HK_ERR_HASH:
    case HK_ERR_TOO_LARGE:
        return 9;
    case HK_ERR_QUARANTINED:
        return 10;
    default:
        /* The host's own state (busy, memory, a build that timed out, a
         * canary that could not run) is no verdict on the release. */
        return hk_err_is_verdict(err) ? HKN_REASONS - 1 : -1;
    }
}

const char *hkn_reason_name(int reason) {
    return reason >= 0 && reason < HKN_REASONS ? reasons[reason] : "";
}

void hkn_fleet_refused(hkn_fleet *f, const char *module, uint64_t release, const char *ident,
                       int err, const char *canary_refusal) {
    int reason = hkn_refusal_reason(err, canary_refusal);
    if (reason < 0)
        return;
    pthread_mutex_lock(&f->lock);
    /* Before a manifest verifies its module is not known: the signature's
     * refusal goes to the module this puller's URL served last. */
    struct fleet_mod *r = record(f, module ? module : f->last_module);
    /* The same release refused again for the same reason (polls retrying a
     * bad signature, an origin changing its ETag) is one refusal. */
    if (r && !(r->last_reason == reason && ident && !strcmp(r->last_ident, ident))) {
        r->refusals[reason]++;
        r->last_refused = release;
        r->last_reason = reason;
        snprintf(r->last_ident, sizeof r->last_ident, "%s", ident ? ident : "");
    }
    pthread_mutex_unlock(&f->lock);
}

/* ---- metrics ----------------------------------------------------------- */

struct fam {
    const char *name, *type, *help;
};

static const struct fam fams[] = {
    {"hotkern_rollout_release", "gauge", "The release of the module this host runs (0: none)."},
    {"hotkern_rollout_release_timestamp_seconds", "gauge",
     "Unix time since which this host runs that release (0: none)."},
    {"hotkern_rollout_target_release", "gauge",
     "The release the origin's manifest offers (the previous one once aborted)."},
    {"hotkern_rollout_step", "gauge", "The manifest's current step, from 0."},
    {"hotkern_rollout_steps", "gauge", "Steps of the manifest's rollout (1 without one)."},
    {"hotkern_rollout_in_step", "gauge",
     "1 when this host is in the current step or an earlier one."},
    {"hotkern_rollout_bucket", "gauge", "This host's bucket for the module, 0 to 9999."},
    {"hotkern_rollout_paused", "gauge", "1 when the manifest's rollout is paused."},
    {"hotkern_rollout_aborted", "gauge", "1 when the manifest's rollout is aborted."},
};

static void sample(hk_metrics_writer *w, const char *name, const char *module, uint64_t v) {
    hk_metrics_sample(w, name, "module", module, v);
}

void hkn_fleet_metrics(hkn_fleet *f, hk_metrics_writer *w) {
    static const char *info = "hotkern_host_info", *refused = "hotkern_rollout_refusals_total",
                      *last = "hotkern_rollout_last_refused_release";
    const char *names[] = {"host_id", "labels"}, *values[] = {f->id, f->labels_text};
    hk_metrics_family(w, info, "gauge",
                      "This host's id and labels, as the rollout gate sees them.");
    hk_metrics_sample_labels(w, info, names, values, 2, 1);
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++)
        hk_metrics_family(w, fams[i].name, fams[i].type, fams[i].help);
    hk_metrics_family(w, refused, "counter", "Releases this host refused, by reason.");
    hk_metrics_family(w, last, "gauge",
                      "The last release this host refused (0: unknown), labelled with why.");
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < f->nmods; i++) {
        const struct fleet_mod *r = &f->mods[i];
        const uint64_t v[] = {r->release, (uint64_t)r->since,  r->target,
                              r->step,    r->nsteps,           (uint64_t)r->in_step,
                              r->bucket,  (uint64_t)r->paused, (uint64_t)r->aborted};
        for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++)
            sample(w, fams[k].name, r->module, v[k]);
        const char *ln[] = {"module", "reason"};
        for (int k = 0; k < HKN_REASONS; k++) {
            const char *lv[] = {r->module, reasons[k]};
            hk_metrics_sample_labels(w, refused, ln, lv, 2, r->refusals[k]);
        }
        if (r->last_reason >= 0) {
            const char *lv[] = {r->module, reasons[r->last_reason]};
            hk_metrics_sample_labels(w, last, ln, lv, 2, r->last_refused);
        }
    }
    pthread_mutex_unlock(&f->lock);
}

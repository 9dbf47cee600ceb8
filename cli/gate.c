/*
 * A rollout's fleet as Prometheus knows it, and the gate (docs/ROLLOUT.md,
 * "The gate"): what `hotkern rollout status --prometheus` prints and what
 * `watch` decides on.
 *
 * The hosts are the targets whose hotkern_host_info Prometheus stored over
 * the lookback (--lookback, an hour by default): a host that stopped
 * answering is still expected; one host a target, with its current labels. Each is joined, on the
 * target's `instance` and `job` labels, with what it says of the module (hotkern_rollout_release,
 * hotkern_rollout_last_refused_release); the step that takes it is computed
 * here from its host_id and labels exactly as the host computes it
 * (hkn_fleet_bucket, hkn_rollout_covers), so that the manifest's current
 * step, not the hosts' last scrape of it, says who should run the release. A
 * host reports while its latest sample is at most --max-age old (default
 * two of the longest scrape interval plus a second): after a restart
 * Prometheus still answers its last samples from before, for minutes, and
 * scrapes nothing for its first seconds (no active target: no data).
 *
 * The gate: fail when any query (the defaults, then each --gate) returns a
 * sample above 0; else unknown when Prometheus gave no data, or knows fewer
 * hosts than --hosts, or fewer of the step's hosts report than
 * --min-reporting of them (default all); else pass, and "settled" when that
 * share of them runs the release. Failure wins over missing data: evidence
 * of a bad release is enough whatever else is missing; missing data never
 * passes.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli/rollout.h"

#define SHOW_HOSTS 8 /* hosts named in a line of text */

const char *hkc_gate_name(int state) {
    return state == HKC_GATE_PASS ? "pass" : state == HKC_GATE_FAIL ? "FAIL" : "unknown";
}

/* ---- the queries ------------------------------------------------------- */

static long long window_arg(double window_s) {
    long long w = (long long)ceil(window_s);
    return w < 1 ? 1 : w;
}

void hkc_gate_defaults(const hkn_manifest *m, const hkc_verdict *v, char q[][512]) {
    unsigned long long r = (unsigned long long)m->rollout.release;
    long long age = window_arg(v->step_age_s), w = window_arg(v->window_s);
    const char *mod = m->module; /* [A-Za-z0-9_.-]: nothing to escape */
    snprintf(q[0], 512, "hotkern_rollout_last_refused_release{module=\"%s\"} == %llu", mod, r);
    snprintf(q[1], 512, "increase(hotkern_rollout_refusals_total{module=\"%s\"}[%llds]) > 0", mod,
             age);
    snprintf(q[2], 512,
             "increase(hotkern_context_lost_total[%llds]) > 0 and on(instance, job) "
             "hotkern_rollout_release{module=\"%s\"} == %llu",
             w, mod, r);
    snprintf(q[3], 512,
             "increase(hotkern_launch_errors_total[%llds]) > 0 and on(instance, job) "
             "hotkern_rollout_release{module=\"%s\"} == %llu",
             w, mod, r);
}

/* q with $MODULE, $RELEASE, $PREVIOUS, $STEP_AGE and $WINDOW ("120s")
 * replaced (malloc'd; NULL when out of memory). */
static char *expand(const char *q, const hkn_manifest *m, const hkc_verdict *v) {
    char rel[24], prev[24], win[32], age[32];
    snprintf(rel, sizeof rel, "%llu", (unsigned long long)m->rollout.release);
    snprintf(prev, sizeof prev, "%llu", (unsigned long long)m->rollout.previous);
    snprintf(win, sizeof win, "%llds", window_arg(v->window_s));
    snprintf(age, sizeof age, "%llds", window_arg(v->step_age_s));
    const struct {
        const char *name, *value;
    } vars[] = {{"$MODULE", m->module},
                {"$RELEASE", rel},
                {"$PREVIOUS", prev},
                {"$STEP_AGE", age},
                {"$WINDOW", win}};
    size_t cap = strlen(q) * 4 + 256, n = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    while (*q) {
        size_t k = 0, nv = sizeof vars / sizeof vars[0];
        for (; k < nv; k++)
            if (!strncmp(q, vars[k].name, strlen(vars[k].name)))
                break;
        const char *add = k < nv ? vars[k].value : q;
        size_t len = k < nv ? strlen(add) : 1;
        if (n + len + 1 > cap) {
            char *nb = realloc(out, cap = (n + len + 1) * 2);
            if (!nb) {
                free(out);
                return NULL;
            }
            out = nb;
        }
        memcpy(out + n, add, len);
        n += len;
        q += k < nv ? strlen(vars[k].name) : 1;
    }
    out[n] = '\0';
    return out;
}

/* ---- the hosts --------------------------------------------------------- */

static int by_target(const void *x, const void *y) {
    const hkc_host *a = x, *b = y;
    int c = strcmp(a->instance, b->instance);
    return c ? c : strcmp(a->job, b->job);
}

static hkc_host *find(const hkc_verdict *v, const hkc_sample *s) {
    hkc_host key;
    snprintf(key.instance, sizeof key.instance, "%s", hkc_sample_label(s, "instance"));
    snprintf(key.job, sizeof key.job, "%s", hkc_sample_label(s, "job"));
    return v->nhosts ? bsearch(&key, v->hosts, v->nhosts, sizeof key, by_target) : NULL;
}

int hkc_first_step(const hkn_manifest *m, const char *id, const char *labels) {
    char names[HKN_MAX_LABELS][HKN_LABEL_MAX];
    const char *ptr[HKN_MAX_LABELS];
    size_t n = 0;
    for (const char *p = labels; *p && n < HKN_MAX_LABELS;) {
        size_t len = strcspn(p, ",");
        if (len > 0 && len < HKN_LABEL_MAX) {
            memcpy(names[n], p, len);
            names[n][len] = '\0';
            ptr[n] = names[n];
            n++;
        }
        p += len + (p[len] == ',');
    }
    hkn_rollout r = m->rollout; /* a shallow copy, its step moved */
    uint32_t bucket = hkn_fleet_bucket(id, m->module);
    for (size_t i = 0; i < r.nsteps; i++) {
        r.step = (unsigned)i;
        if (hkn_rollout_covers(&r, bucket, id, ptr, n))
            return (int)i;
    }
    return r.present ? -1 : 0;
}

/* Runs promql: 0 with *out, or the verdict's unknown (reason written). */
static int ask(hkc_prom *p, const char *promql, hkc_vector *out, hkc_verdict *v) {
    char err[1024];
    int st = hkc_prom_query(p, promql, out, err, sizeof err);
    if (st)
        snprintf(v->reason, sizeof v->reason, "Prometheus at %s gave no data for '%s': %s", p->url,
                 promql, err);
    return st;
}

/* Who Prometheus knows, whether each reports, what each runs and refused. */
static int read_hosts(hkc_prom *p, const hkc_rollout_args *a, const hkn_manifest *m,
                      hkc_verdict *v) {
    char q[512], err[1024];
    hkc_vector x;
    double iv;
    size_t targets;
    if (hkc_prom_targets(p, &targets, &iv, err, sizeof err)) {
        snprintf(v->reason, sizeof v->reason, "Prometheus at %s gave no data: %s", p->url, err);
        return HKC_PROM_DOWN;
    }
    /* A server that just started scrapes nothing for a few seconds, while
     * it answers its last samples from before: no data. */
    if (!targets) {
        snprintf(v->reason, sizeof v->reason,
                 "Prometheus at %s gave no data: it scrapes no target (yet: a server that just "
                 "started waits a few seconds before its first scrapes)",
                 p->url);
        return HKC_PROM_DOWN;
    }
    double max_age = a->max_age_s ? (double)a->max_age_s : iv == iv ? 2 * iv + 1 : 61;
    v->max_age_s = max_age;
    /* A target's current series, else its last one over the lookback: a
     * host whose labels changed has an old series beside its new one. */
    snprintf(q, sizeof q,
             "hotkern_host_info or on(instance, job) last_over_time(hotkern_host_info[%llus])",
             (unsigned long long)a->lookback_s);
    if (ask(p, q, &x, v))
        return HKC_PROM_DOWN;
    v->hosts = calloc(x.n ? x.n : 1, sizeof *v->hosts);
    for (size_t i = 0; v->hosts && i < x.n; i++) {
        hkc_host *h = &v->hosts[v->nhosts];
        const char *id = hkc_sample_label(&x.s[i], "host_id");
        if (!hkn_valid_host_id(id))
            continue; /* not a hotkern host's */
        snprintf(h->id, sizeof h->id, "%s", id);
        snprintf(h->instance, sizeof h->instance, "%s", hkc_sample_label(&x.s[i], "instance"));
        snprintf(h->job, sizeof h->job, "%s", hkc_sample_label(&x.s[i], "job"));
        h->step = hkc_first_step(m, id, hkc_sample_label(&x.s[i], "labels"));
        h->release = h->refused = -1;
        v->nhosts++;
    }
    hkc_vector_free(&x);
    if (!v->hosts) {
        snprintf(v->reason, sizeof v->reason, "out of memory");
        return HKC_PROM_DOWN;
    }
    qsort(v->hosts, v->nhosts, sizeof *v->hosts, by_target);
    size_t kept = 0; /* one host a target (two old series of one: the first) */
    for (size_t i = 0; i < v->nhosts; i++)
        if (!kept || by_target(&v->hosts[kept - 1], &v->hosts[i]))
            v->hosts[kept++] = v->hosts[i];
    v->nhosts = kept;
    if (ask(p, "time() - timestamp(hotkern_host_info)", &x, v))
        return HKC_PROM_DOWN;
    for (size_t i = 0; i < x.n; i++) {
        hkc_host *h = find(v, &x.s[i]);
        if (h)
            h->reporting = x.s[i].value <= max_age;
    }
    hkc_vector_free(&x);
    snprintf(q, sizeof q, "hotkern_rollout_release{module=\"%s\"}", m->module);
    if (ask(p, q, &x, v))
        return HKC_PROM_DOWN;
    for (size_t i = 0; i < x.n; i++) {
        hkc_host *h = find(v, &x.s[i]);
        if (h && x.s[i].value >= 0 && (long long)x.s[i].value > h->release)
            h->release = (long long)x.s[i].value;
    }
    hkc_vector_free(&x);
    snprintf(q, sizeof q, "hotkern_rollout_last_refused_release{module=\"%s\"}", m->module);
    if (ask(p, q, &x, v))
        return HKC_PROM_DOWN;
    for (size_t i = 0; i < x.n; i++) {
        hkc_host *h = find(v, &x.s[i]);
        if (h && x.s[i].value >= 0 && (long long)x.s[i].value >= h->refused) {
            h->refused = (long long)x.s[i].value;
            snprintf(h->reason, sizeof h->reason, "%s", hkc_sample_label(&x.s[i], "reason"));
        }
    }
    hkc_vector_free(&x);
    return HKC_PROM_OK;
}

/* ---- the verdict ------------------------------------------------------- */

static void append(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t cap, const char *fmt, ...) {
    size_t n = strlen(buf);
    va_list ap;
    va_start(ap, fmt);
    if (n < cap)
        vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* A failing query's samples, named by host where the target is one. */
static void name_samples(const hkc_verdict *v, const hkc_vector *x, char *buf, size_t cap) {
    size_t shown = 0, over = 0;
    for (size_t i = 0; i < x->n; i++) {
        if (!(x->s[i].value > 0))
            continue;
        if (over++ >= SHOW_HOSTS)
            continue;
        const hkc_host *h = x->s[i].metric ? find(v, &x->s[i]) : NULL;
        const char *reason = x->s[i].metric ? hkc_sample_label(&x->s[i], "reason") : "";
        const char *inst = x->s[i].metric ? hkc_sample_label(&x->s[i], "instance") : "";
        append(buf, cap, "%s%s%s%s%s %g", shown++ ? ", " : "",
               h         ? h->id
               : inst[0] ? inst
                         : "(scalar)",
               reason[0] ? " (" : "", reason, reason[0] ? ")" : "", x->s[i].value);
    }
    if (over > SHOW_HOSTS)
        append(buf, cap, " and %zu more", over - SHOW_HOSTS);
}

/* Runs one gate query: 1 when it fails the gate, 0 when it holds, -1
 * when Prometheus gave nothing (unknown, the reason in v). */
static int run_query(hkc_prom *p, const char *q, hkc_verdict *v, char *fails, size_t cap) {
    hkc_vector x;
    char err[1024];
    int st = hkc_prom_query(p, q, &x, err, sizeof err);
    if (st) {
        snprintf(v->reason, sizeof v->reason, "%s '%s': %s",
                 st == HKC_PROM_BAD ? "Prometheus refused the query" : "no data for the query", q,
                 err);
        return -1;
    }
    size_t over = 0;
    for (size_t i = 0; i < x.n; i++)
        over += x.s[i].value > 0;
    if (over) {
        append(fails, cap, "%s'%s' returned %zu sample%s above 0: ", fails[0] ? "; " : "", q, over,
               over == 1 ? "" : "s");
        name_samples(v, &x, fails, cap);
    }
    hkc_vector_free(&x);
    return over > 0;
}

/* The hosts of steps up to the current one that are (not) in a state. */
static void list_hosts(const hkc_verdict *v, int cur, int (*pick)(const hkc_host *, uint64_t),
                       uint64_t release, char *buf, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < v->nhosts; i++) {
        const hkc_host *h = &v->hosts[i];
        if (h->step < 0 || h->step > cur || !pick(h, release))
            continue;
        if (n++ < SHOW_HOSTS) {
            append(buf, cap, "%s%s", n > 1 ? ", " : "", h->id);
            if (h->reporting && h->release >= 0)
                append(buf, cap, " (on %lld)", h->release);
        }
    }
    if (n > SHOW_HOSTS)
        append(buf, cap, " and %zu more", n - SHOW_HOSTS);
}

static int silent(const hkc_host *h, uint64_t release) {
    (void)release;
    return !h->reporting || h->release < 0;
}

static int elsewhere(const hkc_host *h, uint64_t release) {
    return h->reporting && h->release >= 0 && (uint64_t)h->release != release;
}

void hkc_gate_eval(hkc_prom *p, const hkc_rollout_args *a, const hkn_manifest *m, hkc_verdict *v) {
    char q[HKC_GATE_DEFAULTS][512], fails[sizeof v->reason] = "";
    memset(v, 0, sizeof *v);
    v->state = HKC_GATE_UNKNOWN;
    double age = difftime(time(NULL), (time_t)m->created);
    if (read_hosts(p, a, m, v))
        return;
    /* Since the step began, and a scrape's margin more: increase() reads
     * only the samples inside its range, and a counter that moved in the
     * step's first scrape interval needs one from before to show it. The
     * refusals' query keeps to the step (a rollout started after a refused
     * one must not inherit its refusals): a refusal of this release in the
     * first interval is the last_refused query's. */
    v->step_age_s = age > 1 ? age : 1;
    v->window_s = v->step_age_s + v->max_age_s;
    v->answered = 1;
    int unknown = 0, failed = 0;
    char why[sizeof v->reason] = "";
    hkc_gate_defaults(m, v, q);
    for (int i = 0; i < HKC_GATE_DEFAULTS + a->gates.n; i++) {
        char *mine =
            i >= HKC_GATE_DEFAULTS ? expand(a->gates.v[i - HKC_GATE_DEFAULTS], m, v) : NULL;
        const char *text = i < HKC_GATE_DEFAULTS ? q[i] : mine;
        int r = text ? run_query(p, text, v, fails, sizeof fails) : -1;
        if (!text)
            snprintf(v->reason, sizeof v->reason, "out of memory");
        free(mine);
        failed |= r > 0;
        if (r < 0 && !unknown++)
            memcpy(why, v->reason, sizeof why);
    }
    int cur = (int)m->rollout.step;
    uint64_t rel = m->rollout.release;
    v->known = v->nhosts;
    for (size_t i = 0; i < v->nhosts; i++) {
        const hkc_host *h = &v->hosts[i];
        if (h->step < 0 || h->step > cur)
            continue;
        v->expected++;
        v->reporting += h->reporting && h->release >= 0;
        v->on_release += h->reporting && h->release >= 0 && (uint64_t)h->release == rel;
    }
    size_t need = (size_t)ceil((double)v->expected * a->min_share - 1e-9);
    size_t fleet = (size_t)ceil((double)a->hosts * a->min_share - 1e-9);
    if (failed) {
        v->state = HKC_GATE_FAIL;
        snprintf(v->reason, sizeof v->reason, "%s", fails);
    } else if (unknown) {
        snprintf(v->reason, sizeof v->reason, "%s", why);
    } else if (!v->known) {
        snprintf(v->reason, sizeof v->reason,
                 "Prometheus knows no host (no hotkern_host_info over the last %llu s)",
                 (unsigned long long)a->lookback_s);
    } else if (a->hosts && v->known < fleet) {
        snprintf(v->reason, sizeof v->reason,
                 "Prometheus knows %zu hosts, fewer than %zu of the %llu --hosts gives", v->known,
                 fleet, (unsigned long long)a->hosts);
    } else if (v->reporting < need) {
        snprintf(v->reason, sizeof v->reason,
                 "%zu of the %zu hosts of steps 1-%d report, %zu needed; not reporting: ",
                 v->reporting, v->expected, cur + 1, need);
        list_hosts(v, cur, silent, rel, v->reason, sizeof v->reason);
    } else {
        v->state = HKC_GATE_PASS;
        v->settled = v->on_release >= need;
        snprintf(v->reason, sizeof v->reason,
                 "%zu of the %zu hosts of steps 1-%d run release %llu (%zu report); no refusal, "
                 "context loss or launch error%s",
                 v->on_release, v->expected, cur + 1, (unsigned long long)rel, v->reporting,
                 a->gates.n ? ", and the --gate queries hold" : "");
        if (!v->settled) {
            append(v->reason, sizeof v->reason, "; not on it yet: ");
            list_hosts(v, cur, elsewhere, rel, v->reason, sizeof v->reason);
        }
    }
}

void hkc_gate_queries(hkc_prom *p, const hkc_rollout_args *a, const hkn_manifest *m,
                      hkc_verdict *v) {
    char fails[sizeof v->reason] = "", why[sizeof v->reason] = "", err[1024];
    size_t targets;
    double iv, age = difftime(time(NULL), (time_t)m->created);
    v->state = HKC_GATE_UNKNOWN;
    if (hkc_prom_targets(p, &targets, &iv, err, sizeof err) || !targets) {
        snprintf(v->reason, sizeof v->reason, "Prometheus at %s gave no data: %s", p->url,
                 targets ? err : "it scrapes no target (yet)");
        return;
    }
    v->max_age_s = a->max_age_s ? (double)a->max_age_s : iv == iv ? 2 * iv + 1 : 61;
    v->step_age_s = age > 1 ? age : 1;
    v->window_s = v->step_age_s + v->max_age_s;
    int unknown = 0, failed = 0;
    for (int i = 0; i < a->gates.n; i++) {
        char *q = expand(a->gates.v[i], m, v);
        int r = q ? run_query(p, q, v, fails, sizeof fails) : -1;
        if (!q)
            snprintf(v->reason, sizeof v->reason, "out of memory");
        free(q);
        failed |= r > 0;
        if (r < 0 && !unknown++)
            memcpy(why, v->reason, sizeof why);
    }
    v->state = failed ? HKC_GATE_FAIL : unknown ? HKC_GATE_UNKNOWN : HKC_GATE_PASS;
    snprintf(v->reason, sizeof v->reason, "%s",
             failed    ? fails
             : unknown ? why
                       : "the --gate queries hold");
}

void hkc_verdict_free(hkc_verdict *v) {
    free(v->hosts);
    v->hosts = NULL;
    v->nhosts = 0;
}

int hkc_gate_check_queries(hkc_out *o, hkc_prom *p, const hkc_rollout_args *a,
                           const hkn_manifest *m) {
    for (int i = 0; i < a->gates.n; i++) {
        char err[1024];
        hkc_vector x;
        hkc_verdict v = {.step_age_s = 60, .window_s = 60};
        char *q = expand(a->gates.v[i], m, &v);
        if (!q)
            return hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
        int st = hkc_prom_query(p, q, &x, err, sizeof err);
        hkc_vector_free(&x);
        if (st == HKC_PROM_BAD) {
            int rc = hkc_usage(o, "--gate '%s': Prometheus refuses it: %s", q, err);
            free(q);
            return rc;
        }
        free(q);
    }
    return 0;
}

/* ---- status ------------------------------------------------------------ */

enum { ON, REFUSED, PREVIOUS, OTHER, SILENT, NKINDS };
static const char *const kind_names[NKINDS] = {"on_release", "refused", "on_previous", "other",
                                               "not_reporting"};

static int kind_of(const hkc_host *h, const hkn_rollout *r) {
    if (h->refused >= 0 && (uint64_t)h->refused == r->release)
        return REFUSED; /* and runs what it ran */
    if (!h->reporting || h->release < 0)
        return SILENT;
    if ((uint64_t)h->release == r->release)
        return ON;
    return (uint64_t)h->release == r->previous ? PREVIOUS : OTHER;
}

static cJSON *host_json(const hkc_host *h, int kind) {
    if (kind == ON || kind == PREVIOUS || kind == SILENT)
        return cJSON_CreateString(h->id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "host", h->id);
    cJSON_AddItemToObject(o, "release", hkc_int(h->release));
    if (kind == REFUSED)
        cJSON_AddStringToObject(o, "reason", h->reason);
    return o;
}

/* The hosts first taken by step i (-1: by none) as one line, or (JSON)
 * returned as an object of lists. */
static cJSON *describe_step(hkc_out *o, const hkn_manifest *m, const hkc_verdict *v, int i) {
    const hkn_rollout *r = &m->rollout;
    size_t count[NKINDS] = {0}, total = 0;
    cJSON *s = o->json ? cJSON_CreateObject() : NULL, *lists[NKINDS] = {0};
    char names[NKINDS][1024] = {{0}};
    for (int k = 0; s && k < NKINDS; k++)
        cJSON_AddItemToObject(s, kind_names[k], lists[k] = cJSON_CreateArray());
    for (size_t n = 0; n < v->nhosts; n++) {
        const hkc_host *h = &v->hosts[n];
        if (h->step != i)
            continue;
        int k = kind_of(h, r);
        total++;
        if (s)
            cJSON_AddItemToArray(lists[k], host_json(h, k));
        else if (k != ON && k != PREVIOUS && count[k] < SHOW_HOSTS)
            append(names[k], sizeof names[k], "%s%s%s%s", count[k] ? ", " : "", h->id,
                   k == REFUSED ? ": " : "", k == REFUSED ? h->reason : "");
        else if (k != ON && k != PREVIOUS && count[k] == SHOW_HOSTS)
            append(names[k], sizeof names[k], ", ...");
        count[k]++;
    }
    if (s) {
        if (i >= 0)
            cJSON_AddItemToObject(s, "step", hkc_int(i + 1));
        cJSON_AddItemToObject(s, "hosts", hkc_int((long long)total));
        return s;
    }
    if (i < 0 && !total)
        return NULL;
    if (i < 0)
        printf("     outside every step: %zu hosts", total);
    else
        printf("  %s step %d: %zu hosts", (unsigned)i == r->step ? "->" : "  ", i + 1, total);
    printf(": %zu on release %llu, %zu refused it%s%s%s, %zu on release %llu (previous), %zu on "
           "another%s%s%s, %zu not reporting%s%s%s\n",
           count[ON], (unsigned long long)r->release, count[REFUSED], count[REFUSED] ? " (" : "",
           names[REFUSED], count[REFUSED] ? ")" : "", count[PREVIOUS],
           (unsigned long long)r->previous, count[OTHER], count[OTHER] ? " (" : "", names[OTHER],
           count[OTHER] ? ")" : "", count[SILENT], count[SILENT] ? " (" : "", names[SILENT],
           count[SILENT] ? ")" : "");
    return NULL;
}

void hkc_fleet_describe(hkc_out *o, const hkn_manifest *m, const hkc_verdict *v) {
    cJSON *fleet = o->json ? cJSON_CreateObject() : NULL;
    cJSON *steps = fleet ? cJSON_CreateArray() : NULL;
    if (!o->json)
        printf("%s %zu hosts; per step, the hosts it takes first:\n",
               v->push ? "the endpoints file lists" : "Prometheus knows", v->known);
    for (int i = 0; i < (int)m->rollout.nsteps; i++)
        cJSON_AddItemToArray(steps, describe_step(o, m, v, i));
    cJSON *outside = describe_step(o, m, v, -1);
    if (!o->json) {
        printf("gate at step %u: %s%s: %s\n", m->rollout.step + 1, hkc_gate_name(v->state),
               v->state == HKC_GATE_PASS && !v->settled ? " (hosts still taking it)" : "",
               v->reason);
        return;
    }
    cJSON *gate = cJSON_CreateObject();
    cJSON_AddStringToObject(gate, "state",
                            v->state == HKC_GATE_FAIL   ? "fail"
                            : v->state == HKC_GATE_PASS ? "pass"
                                                        : "unknown");
    cJSON_AddBoolToObject(gate, "settled", v->settled);
    cJSON_AddStringToObject(gate, "reason", v->reason);
    cJSON_AddItemToObject(gate, "step_age_s", hkc_int(window_arg(v->step_age_s)));
    cJSON_AddItemToObject(gate, "window_s", hkc_int(window_arg(v->window_s)));
    cJSON_AddItemToObject(fleet, "known_hosts", hkc_int((long long)v->known));
    cJSON_AddItemToObject(fleet, "expected", hkc_int((long long)v->expected));
    cJSON_AddItemToObject(fleet, "reporting", hkc_int((long long)v->reporting));
    cJSON_AddItemToObject(fleet, "on_release", hkc_int((long long)v->on_release));
    cJSON_AddItemToObject(fleet, "steps", steps);
    cJSON_AddItemToObject(fleet, "outside", outside);
    cJSON_AddItemToObject(fleet, "gate", gate);
    hkc_set(o, "fleet", fleet);
}

/*
 * A release's rollout: the steps of a signed manifest, read, checked and
 * written (net/net.h, "rollouts").
 *
 * The manifest's optional "rollout" object says which hosts take the
 * release now: {"release": N, "previous": M, "step": i, "steps": [{"percent",
 * "hosts", "labels", "bake_s"} ...], "paused", "aborted"}. It is part of the
 * signed bytes, so a host acts on it only after the signature verified, and
 * advancing, pausing or aborting is a newer signed manifest (a higher
 * "version": the anti-rollback record only grows).
 *
 * Checked strictly, each bad field named in the report: types and ranges,
 * 1 to HKN_ROLLOUT_MAX_STEPS steps whose percent never decreases (steps are
 * cumulative: raising the share only adds hosts), names in the host-id and
 * label alphabets, each once per step, a step that names someone, the
 * current step among the steps, previous below release, an abort only with
 * a release to go back to. A member this code does not know is refused
 * rather than ignored: a host never follows half of a rollout's rules.
 *
 * hkn_rollout_covers is the whole decision for one host, given its bucket,
 * id and labels: pure, so the fuzz target and the tests run it directly;
 * net/fleet.c finds the host's identity and acts on the answer.
 *
 * No state, no lock; every function is safe from any thread on distinct
 * objects.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "net/net.h"

#define MAX_JSON_INT 9007199254740991.0

/* ---- names ------------------------------------------------------------- */

static int in_alphabet(const char *s, size_t max, const char *extra) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= max)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr(extra, c)))
            return 0;
    }
    return 1;
}

int hkn_valid_host_id(const char *s) {
    /* The endpoint id's alphabet: machine ids, host names, FQDNs, host:port. */
    return in_alphabet(s, HKN_HOST_ID_MAX, "_-.:@");
}

int hkn_valid_label(const char *s) {
    /* No comma: HOTKERN_HOST_LABELS separates labels with it. */
    return in_alphabet(s, HKN_LABEL_MAX, "_-.:=/");
}

/* ---- memory ------------------------------------------------------------ */

static void free_names(char **v, size_t n) {
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

void hkn_rollout_free(hkn_rollout *r) {
    if (!r)
        return;
    for (size_t i = 0; r->steps && i < r->nsteps; i++) {
        free_names(r->steps[i].hosts, r->steps[i].nhosts);
        free_names(r->steps[i].labels, r->steps[i].nlabels);
    }
    free(r->steps);
    memset(r, 0, sizeof *r);
}

static int copy_names(char ***dst, char *const *src, size_t n) {
    *dst = NULL;
    if (n == 0)
        return 0;
    if (!(*dst = calloc(n, sizeof **dst)))
        return HK_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        if (!((*dst)[i] = strdup(src[i])))
            return HK_ERR_NOMEM;
    return 0;
}

int hkn_rollout_copy(hkn_rollout *dst, const hkn_rollout *src) {
    *dst = *src;
    dst->steps = NULL;
    dst->nsteps = 0;
    if (!src->present || src->nsteps == 0)
        return 0;
    if (!(dst->steps = calloc(src->nsteps, sizeof *dst->steps)))
        return HK_ERR_NOMEM;
    dst->nsteps = src->nsteps;
    for (size_t i = 0; i < src->nsteps; i++) {
        const hkn_rollout_step *s = &src->steps[i];
        hkn_rollout_step *d = &dst->steps[i];
        *d = (hkn_rollout_step){.percent = s->percent, .bake_s = s->bake_s};
        d->nhosts = s->nhosts;
        d->nlabels = s->nlabels;
        if (copy_names(&d->hosts, s->hosts, s->nhosts) ||
            copy_names(&d->labels, s->labels, s->nlabels)) {
            hkn_rollout_free(dst);
            return HK_ERR_NOMEM;
        }
    }
    return 0;
}

/* ---- checks ------------------------------------------------------------ */

/* Names of one step: valid, each once. */
static int check_names(char *const *v, size_t n, size_t i, const char *what,
                       int (*valid)(const char *), const char *alphabet, hk_report *rep) {
    if (n > HKN_ROLLOUT_MAX_NAMES)
        return hku_fail(rep, HK_ERR_INVALID, "rollout: steps[%zu].%s holds %zu names, over %d", i,
                        what, n, HKN_ROLLOUT_MAX_NAMES);
    for (size_t k = 0; k < n; k++) {
        if (!valid(v[k]))
            return hku_fail(rep, HK_ERR_INVALID, "rollout: steps[%zu].%s[%zu] '%.140s' is not %s",
                            i, what, k, v[k] ? v[k] : "", alphabet);
        for (size_t j = 0; j < k; j++)
            if (!strcmp(v[j], v[k]))
                return hku_fail(rep, HK_ERR_INVALID, "rollout: steps[%zu].%s names '%s' twice", i,
                                what, v[k]);
    }
    return 0;
}

int hkn_rollout_validate(const hkn_rollout *r, hk_report *rep) {
    if (!r->present)
        return 0;
    if (r->release < 1 || (double)r->release > MAX_JSON_INT)
        return hku_fail(rep, HK_ERR_INVALID,
                        "rollout: 'release' must be an integer in [1, 2^53), got %llu",
                        (unsigned long long)r->release);
    if (r->previous >= r->release)
        return hku_fail(rep, HK_ERR_INVALID,
                        "rollout: 'previous' (%llu) must be below 'release' (%llu): it is the "
                        "release the fleet ran before, 0 for none",
                        (unsigned long long)r->previous, (unsigned long long)r->release);
    if (r->nsteps < 1 || r->nsteps > HKN_ROLLOUT_MAX_STEPS)
        return hku_fail(rep, HK_ERR_INVALID, "rollout: 'steps' must hold 1 to %d steps, got %zu",
                        HKN_ROLLOUT_MAX_STEPS, r->nsteps);
    if (r->step >= r->nsteps)
        return hku_fail(rep, HK_ERR_INVALID,
                        "rollout: 'step' %u is not one of the %zu steps (0 to %zu)", r->step,
                        r->nsteps, r->nsteps - 1);
    if (r->aborted && r->previous == 0)
        return hku_fail(rep, HK_ERR_INVALID,
                        "rollout: aborted with no 'previous' release to go back to");
    for (size_t i = 0; i < r->nsteps; i++) {
        const hkn_rollout_step *s = &r->steps[i];
        int err;
        if (s->percent > 100)
            return hku_fail(rep, HK_ERR_INVALID,
                            "rollout: steps[%zu].percent must be from 0 to 100, got %u", i,
                            s->percent);
        if (i > 0 && s->percent < r->steps[i - 1].percent)
            return hku_fail(rep, HK_ERR_INVALID,
                            "rollout: steps[%zu].percent %u is below steps[%zu]'s %u (steps are "
                            "cumulative: a share never shrinks)",
                            i, s->percent, i - 1, r->steps[i - 1].percent);
        if (s->bake_s > HKN_MAX_LIFETIME_S)
            return hku_fail(rep, HK_ERR_INVALID,
                            "rollout: steps[%zu].bake_s must be from 0 to %d s, got %llu", i,
                            HKN_MAX_LIFETIME_S, (unsigned long long)s->bake_s);
        if ((err = check_names(s->hosts, s->nhosts, i, "hosts", hkn_valid_host_id,
                               "a host id ([A-Za-z0-9_.:@-]{1,127})", rep)) ||
            (err = check_names(s->labels, s->nlabels, i, "labels", hkn_valid_label,
                               "a label ([A-Za-z0-9_.:=/-]{1,63})", rep)))
            return err;
        if (s->percent == 0 && s->nhosts == 0 && s->nlabels == 0)
            return hku_fail(rep, HK_ERR_INVALID,
                            "rollout: steps[%zu] names no host: give it a percent above 0, hosts "
                            "or labels",
                            i);
    }
    return 0;
}

/* ---- reading ----------------------------------------------------------- */

/* Refuses a member of obj not in `known` (NULL-terminated). */
static int only_known(const cJSON *obj, const char *const *known, const char *where,
                      hk_report *rep) {
    for (const cJSON *m = obj->child; m; m = m->next) {
        int ok = 0;
        for (size_t i = 0; known[i] && !ok; i++)
            ok = m->string && !strcmp(m->string, known[i]);
        if (!ok)
            return hku_fail(rep, HK_ERR_INVALID,
                            "rollout: %s has a member '%.64s' this host does not know (a newer "
                            "publisher's rule is refused, not ignored)",
                            where, m->string ? m->string : "");
        for (const cJSON *o = obj->child; o != m; o = o->next)
            if (!strcmp(o->string, m->string))
                return hku_fail(rep, HK_ERR_INVALID, "rollout: %s has '%s' twice", where,
                                m->string);
    }
    return 0;
}

/* An integer member in [0, max]; absent: def when not required. */
static int get_int(const cJSON *obj, const char *key, const char *where, int required, uint64_t def,
                   double max, uint64_t *out, hk_report *rep) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v && !required) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > max ||
        floor(v->valuedouble) != v->valuedouble)
        return hku_fail(rep, HK_ERR_INVALID, "rollout: %s%s must be an integer from 0 to %.0f%s",
                        where, key, max, v ? "" : " (it is missing)");
    *out = (uint64_t)v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *obj, const char *key, int *out, hk_report *rep) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = 0;
    if (!v)
        return 0;
    if (!cJSON_IsBool(v))
        return hku_fail(rep, HK_ERR_INVALID, "rollout: '%s' must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* An optional array of strings into *v, *n (each checked later). */
static int get_names(const cJSON *obj, const char *key, size_t i, char ***v, size_t *n,
                     hk_report *rep) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(obj, key);
    *v = NULL;
    *n = 0;
    if (!a)
        return 0;
    int count = cJSON_GetArraySize(a);
    if (!cJSON_IsArray(a) || count > HKN_ROLLOUT_MAX_NAMES)
        return hku_fail(rep, HK_ERR_INVALID,
                        "rollout: steps[%zu].%s must be an array of at most %d strings", i, key,
                        HKN_ROLLOUT_MAX_NAMES);
    if (count == 0)
        return 0;
    if (!(*v = calloc((size_t)count, sizeof **v)))
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsString(e))
            return hku_fail(rep, HK_ERR_INVALID, "rollout: steps[%zu].%s[%zu] is not a string", i,
                            key, *n);
        if (!((*v)[*n] = strdup(e->valuestring)))
            return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
        (*n)++;
    }
    return 0;
}

static int parse_step(const cJSON *o, size_t i, hkn_rollout_step *s, hk_report *rep) {
    static const char *const known[] = {"percent", "hosts", "labels", "bake_s", NULL};
    char name[48], where[48];
    uint64_t u;
    int err;
    if (!cJSON_IsObject(o))
        return hku_fail(rep, HK_ERR_INVALID, "rollout: steps[%zu] is not an object", i);
    snprintf(name, sizeof name, "steps[%zu]", i);
    snprintf(where, sizeof where, "steps[%zu].", i);
    if ((err = only_known(o, known, name, rep)) ||
        (err = get_int(o, "percent", where, 1, 0, 100, &u, rep)))
        return err;
    s->percent = (unsigned)u;
    if ((err = get_int(o, "bake_s", where, 0, 0, HKN_MAX_LIFETIME_S, &s->bake_s, rep)) ||
        (err = get_names(o, "hosts", i, &s->hosts, &s->nhosts, rep)) ||
        (err = get_names(o, "labels", i, &s->labels, &s->nlabels, rep)))
        return err;
    return 0;
}

int hkn_rollout_parse(const cJSON *obj, hkn_rollout *out, hk_report *rep) {
    static const char *const known[] = {"release", "previous", "step", "steps",
                                        "paused",  "aborted",  NULL};
    memset(out, 0, sizeof *out);
    uint64_t u;
    int err;
    if (!cJSON_IsObject(obj))
        return hku_fail(rep, HK_ERR_INVALID, "manifest: 'rollout' must be an object");
    out->present = 1;
    if ((err = only_known(obj, known, "the object", rep)) ||
        (err = get_int(obj, "release", "", 1, 0, MAX_JSON_INT, &out->release, rep)) ||
        (err = get_int(obj, "previous", "", 0, 0, MAX_JSON_INT, &out->previous, rep)) ||
        (err = get_int(obj, "step", "", 1, 0, HKN_ROLLOUT_MAX_STEPS, &u, rep)) ||
        (err = get_bool(obj, "paused", &out->paused, rep)) ||
        (err = get_bool(obj, "aborted", &out->aborted, rep)))
        goto fail;
    out->step = (unsigned)u;
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(obj, "steps");
    int n = cJSON_GetArraySize(steps);
    if (!cJSON_IsArray(steps) || n < 1 || n > HKN_ROLLOUT_MAX_STEPS) {
        err = hku_fail(rep, HK_ERR_INVALID, "rollout: 'steps' must be an array of 1 to %d steps",
                       HKN_ROLLOUT_MAX_STEPS);
        goto fail;
    }
    if (!(out->steps = calloc((size_t)n, sizeof *out->steps))) {
        err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const cJSON *s;
    cJSON_ArrayForEach(s, steps) {
        /* Counted before it is filled, so that a failure frees its names. */
        out->nsteps++;
        if ((err = parse_step(s, out->nsteps - 1, &out->steps[out->nsteps - 1], rep)))
            goto fail;
    }
    if ((err = hkn_rollout_validate(out, rep)))
        goto fail;
    return 0;
fail:
    hkn_rollout_free(out);
    return err;
}

/* ---- writing ----------------------------------------------------------- */

static int add_names(cJSON *o, const char *key, char *const *v, size_t n) {
    if (n == 0)
        return 0;
    cJSON *a = cJSON_AddArrayToObject(o, key);
    if (!a)
        return HK_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        cJSON *s = cJSON_CreateString(v[i]);
        if (!s)
            return HK_ERR_NOMEM;
        cJSON_AddItemToArray(a, s);
    }
    return 0;
}

int hkn_rollout_add(cJSON *root, const hkn_rollout *r) {
    if (!r->present)
        return 0;
    cJSON *o = cJSON_AddObjectToObject(root, "rollout"), *steps = NULL;
    if (!o || !hkn_json_add_int(o, "release", (long long)r->release) ||
        !hkn_json_add_int(o, "previous", (long long)r->previous) ||
        !hkn_json_add_int(o, "step", (long long)r->step) ||
        !(steps = cJSON_AddArrayToObject(o, "steps")))
        return HK_ERR_NOMEM;
    for (size_t i = 0; i < r->nsteps; i++) {
        const hkn_rollout_step *s = &r->steps[i];
        cJSON *e = cJSON_CreateObject();
        if (!e)
            return HK_ERR_NOMEM;
        cJSON_AddItemToArray(steps, e);
        if (!hkn_json_add_int(e, "percent", (long long)s->percent) ||
            add_names(e, "hosts", s->hosts, s->nhosts) ||
            add_names(e, "labels", s->labels, s->nlabels) ||
            !hkn_json_add_int(e, "bake_s", (long long)s->bake_s))
            return HK_ERR_NOMEM;
    }
    if (!cJSON_AddBoolToObject(o, "paused", r->paused) ||
        !cJSON_AddBoolToObject(o, "aborted", r->aborted))
        return HK_ERR_NOMEM;
    return 0;
}

/* ---- the decision ------------------------------------------------------ */

static int named(char *const *v, size_t n, const char *s) {
    for (size_t i = 0; s && i < n; i++)
        if (!strcmp(v[i], s))
            return 1;
    return 0;
}

int hkn_rollout_covers(const hkn_rollout *r, uint32_t bucket, const char *id,
                       const char *const *labels, size_t nlabels) {
    if (!r->present)
        return 1;
    /* Steps are cumulative: a host of any step up to the current one is in. */
    for (size_t i = 0; i <= r->step && i < r->nsteps; i++) {
        const hkn_rollout_step *s = &r->steps[i];
        if (bucket < s->percent * (HKN_BUCKETS / 100) || named(s->hosts, s->nhosts, id))
            return 1;
        for (size_t k = 0; k < nlabels; k++)
            if (named(s->labels, s->nlabels, labels[k]))
                return 1;
    }
    return 0;
}

uint64_t hkn_rollout_target(const hkn_rollout *r, uint64_t version) {
    if (!r->present)
        return version;
    return r->aborted ? r->previous : r->release;
}

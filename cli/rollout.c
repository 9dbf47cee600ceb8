/*
 * hotkern rollout: a release's steps on a static origin (docs/ROLLOUT.md).
 *
 *   start    signs FILE... as a new release whose manifest carries its steps
 *            (--steps 1,10,50,100 --bake S, or --steps-file), at step 0;
 *   advance  the same release at the next step (once its bake time passed);
 *   pause, resume  the same step, marked paused or not;
 *   abort    the previous release's artifacts under a newer manifest, marked
 *            aborted: every host that took the release goes back;
 *   status   what the origin's manifest says of the rollout.
 *
 * Every change is a newer signed manifest in the origin directory (its
 * "version" one above the current one, so that the hosts' anti-rollback
 * records only grow), written as `hotkern sign` writes a release: the
 * artifacts, then the signature, then the manifest, each replaced
 * atomically (both staged and synced first, so that their renames follow
 * each other at once); the manifest's mtime is moved past the last one's,
 * since static servers (nginx) make ETag and Last-Modified of mtime and
 * size, and two steps' manifests of one size within a second would look
 * the same. Every --key signs (a line each where hosts need k of n keys;
 * one bare signature for one key, as hosts of 1.4 read).
 * `start` keeps the manifest it replaces as previous-manifest.json (and its
 * .sig): the release `abort` goes back to. Until then every manifest of the
 * rollout carries that release's artifacts as "previous_artifacts", the
 * stable release for hosts outside the step that run neither (net/fleet.c).
 * The current manifest (and the previous one) are verified with the public
 * key of one --key at least before they are re-signed, so that a file
 * changed on the origin is never signed anew; and the directory is flock'd,
 * so that two commands do not interleave.
 *
 * `status` says what the manifest says; with --prometheus, also what the
 * hosts' own metrics say through Prometheus, per step (cli/gate.c). `watch`
 * (cli/watch.c) drives the steps on the gate, through hkc_rollout_change.
 * The options, the help and the dispatch are cli/rollout_cmd.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "cli/rollout.h"

#define MANIFEST "manifest.json"
#define PREVIOUS "previous-manifest.json"

void hkc_man_free(hkc_man *x) {
    hkn_manifest_free(&x->m);
    free(x->text);
    free(x->sig);
    memset(x, 0, sizeof *x);
}

/* ---- reading the origin ------------------------------------------------ */

int hkc_signers_load(hkc_out *o, const hkc_list *paths, hkc_signers *s) {
    memset(s, 0, sizeof *s);
    int rc = hkc_keys_load(o, paths, s->keys);
    for (int i = 0; !rc && i < paths->n; i++)
        s->pub.keys[i] = s->keys[i].pub;
    s->n = s->pub.nkeys = rc ? 0 : paths->n;
    s->pub.threshold = 1;
    return rc;
}

int hkc_man_load(hkc_out *o, const char *dir, const char *name, const hkn_trust *t, hkc_man *x) {
    char path[PATH_MAX], sig_path[PATH_MAX + 8];
    hk_report rep = HK_REPORT_INIT;
    struct stat st;
    int rc = 0;
    memset(x, 0, sizeof *x);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(sig_path, sizeof sig_path, "%s.sig", path);
    if (stat(path, &st) != 0 && errno == ENOENT)
        return 0;
    if (hku_read_file(path, 1 << 20, &x->text, &x->len, &rep) ||
        hku_read_file(sig_path, HKN_FRAME_MAX_SIG, &x->sig, &x->sig_len, &rep)) {
        rc = hkc_fail_report(o, &rep);
        goto out;
    }
    x->mtime = (int64_t)st.st_mtime;
    /* The key id the manifest claims, only for the words of a refusal. */
    cJSON *doc = t ? cJSON_ParseWithLength(x->text, x->len) : NULL;
    const cJSON *claimed = cJSON_GetObjectItemCaseSensitive(doc, "key_id");
    int bad = t && hkn_signatures_verify(t, "manifest", x->text, x->len, x->sig, x->sig_len,
                                         cJSON_IsString(claimed) ? claimed->valuestring : NULL,
                                         NULL, &rep);
    cJSON_Delete(doc);
    if (bad) {
        char ids[HKN_MAX_KEYS * (HKN_KEY_ID_CHARS + 2)] = "";
        for (int i = 0; i < t->nkeys; i++)
            snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%s", i ? ", " : "",
                     t->keys[i].id);
        rc = hkc_fail(o, HK_ERR_SIGNATURE, NULL,
                      "%s does not verify with key%s %s (changed on the origin, or signed by "
                      "other keys): nothing is signed over it (%s)",
                      path, t->nkeys > 1 ? "s" : "", ids, rep.message);
        goto out;
    }
    if (hkn_manifest_parse(x->text, x->len, &x->m, &rep)) {
        rc = hkc_fail(o, rep.error, NULL, "%s: %s", path, rep.message);
        goto out;
    }
    x->have = 1;
out:
    hk_report_clear(&rep);
    if (rc)
        hkc_man_free(x);
    return rc;
}

/* ---- writing the origin ------------------------------------------------ */

static int64_t now_s(void) {
    return (int64_t)time(NULL);
}

/* DIR/NAME's next bytes under a staging name (DIR/.NAME.new), synced; with
 * after >= 0 its mtime past `after` (the manifest it replaces): static
 * servers make ETag and Last-Modified of mtime and size, and the rename
 * that puts it in place keeps the time, so that no reader ever sees the new
 * bytes with the old validators. */
static int stage(hkc_out *o, const char *dir, const char *name, const char *bytes, size_t len,
                 int64_t after) {
    char path[PATH_MAX];
    hk_report rep = HK_REPORT_INIT;
    snprintf(path, sizeof path, "%s/.%s.new", dir, name);
    if (hku_write_atomic(path, bytes, len, 0644, &rep)) {
        int rc = hkc_fail_report(o, &rep);
        hk_report_clear(&rep);
        return rc;
    }
    int64_t t = now_s() > after ? now_s() : after + 1;
    struct timespec ts[2] = {{.tv_sec = t}, {.tv_sec = t}};
    if (after >= 0 && utimensat(AT_FDCWD, path, ts, 0) != 0) {
        int e = errno;
        unlink(path);
        return hkc_fail(o, HK_ERR_IO, NULL, "%s: %s", path, strerror(e));
    }
    return 0;
}

static void unlink_staged(const char *dir, const char *name) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/.%s.new", dir, name);
    unlink(path);
}

/* Renames the staged files of names into place, in order, then syncs the
 * directory; on a failure the rest are removed. */
static int place(hkc_out *o, const char *dir, const char *const *names, int n) {
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char from[PATH_MAX], to[PATH_MAX];
        snprintf(from, sizeof from, "%s/.%s.new", dir, names[i]);
        snprintf(to, sizeof to, "%s/%s", dir, names[i]);
        if (!rc && rename(from, to) != 0)
            rc = hkc_fail(o, HK_ERR_IO, NULL, "%s: %s", to, strerror(errno));
        if (rc)
            unlink(from);
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return rc;
}

static int write_file(hkc_out *o, const char *dir, const char *name, const void *bytes,
                      size_t len) {
    char path[PATH_MAX];
    hk_report rep = HK_REPORT_INIT;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = hku_write_atomic(path, bytes, len, 0644, &rep) ? hkc_fail_report(o, &rep) : 0;
    hk_report_clear(&rep);
    return rc;
}

/* Signs m (created now, expiring after expires_in) with every key of key
 * (one bare signature, or a line each: hkc_sign_lines) and writes it over
 * the current manifest: the artifacts (blobs, when new ones come), the
 * signature, then the manifest. */
static int publish(hkc_out *o, const hkc_rollout_args *a, const hkc_signers *key, hkn_manifest *m,
                   const hkn_blob *blobs, size_t nblobs, int64_t after) {
    char *json = NULL, *sig = NULL, name[128];
    size_t len = 0;
    hk_report rep = HK_REPORT_INIT;
    int rc = 0;
    m->created = now_s();
    m->expires = m->created + (int64_t)a->expires_in;
    m->release = hkn_rollout_target(&m->rollout, m->version);
    if (hkn_manifest_sign(&key->keys[0], m, &json, &len, &sig, &rep)) {
        rc = hkc_fail_report(o, &rep);
        goto out;
    }
    if ((rc = hkc_sign_lines(o, key->keys, key->n, json, len, &sig)))
        goto out;
    char arts[PATH_MAX];
    snprintf(arts, sizeof arts, "%s/artifacts", a->dir);
    if (mkdir(arts, 0755) != 0 && errno != EEXIST) {
        rc = hkc_fail(o, HK_ERR_IO, NULL, "mkdir %s: %s", arts, strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < nblobs && !rc; i++) {
        snprintf(name, sizeof name, "artifacts/%s", m->artifacts[i].sha256);
        rc = write_file(o, a->dir, name, blobs[i].bytes, blobs[i].size);
    }
    /* Both files are staged (and synced) first, so that their renames
     * follow each other at once, the signature's first: a poll between the
     * two reads a pair that does not verify, and fetches it again
     * (net/pull.c). */
    size_t slen = strlen(sig);
    size_t bare = !slen || sig[slen - 1] != '\n'; /* several keys' lines end in theirs */
    char *line = malloc(slen + 2);
    if (!rc && !line)
        rc = hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    if (!rc) {
        memcpy(line, sig, slen);
        memcpy(line + slen, "\n", bare + 1);
        rc = stage(o, a->dir, MANIFEST ".sig", line, slen + bare, -1);
    }
    free(line);
    if (!rc && (rc = stage(o, a->dir, MANIFEST, json, len, after)))
        unlink_staged(a->dir, MANIFEST ".sig");
    static const char *const names[] = {MANIFEST ".sig", MANIFEST};
    if (!rc)
        rc = place(o, a->dir, names, 2);
out:
    free(json);
    free(sig);
    hk_report_clear(&rep);
    return rc;
}

/* ---- the steps --------------------------------------------------------- */

/* The steps of --steps-file (an array of steps, or {"steps": [...]}) or of
 * --steps P,P,... --bake S, read as the manifest's rollout would be, so
 * that each bad field is named the same. */
static int read_steps(hkc_out *o, const hkc_rollout_args *a, hkn_rollout *out) {
    char *text = NULL;
    size_t len = 0;
    hk_report rep = HK_REPORT_INIT;
    int rc = 0;
    cJSON *root = NULL, *steps = NULL;
    if (a->steps_file) {
        if (hku_read_file(a->steps_file, 1 << 20, &text, &len, &rep)) {
            rc = hkc_usage(o, "--steps-file: %s", rep.message);
            goto out;
        }
        cJSON *j = hkn_json_parse_strict(text, len);
        steps = cJSON_IsObject(j) ? cJSON_DetachItemFromObjectCaseSensitive(j, "steps") : j;
        if (steps != j)
            cJSON_Delete(j);
        if (!cJSON_IsArray(steps)) {
            rc = hkc_usage(o, "--steps-file %s: not a JSON array of steps (or {\"steps\": [...]})",
                           a->steps_file);
            goto out;
        }
    } else {
        steps = cJSON_CreateArray();
        for (const char *p = a->steps; steps && *p;) {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (errno || end == p || (*end && *end != ',') || v < 0 || v > 100) {
                rc = hkc_usage(o, "--steps needs percents from 0 to 100, comma-separated "
                                  "(1,10,50,100)");
                goto out;
            }
            cJSON *s = cJSON_CreateObject();
            cJSON_AddItemToArray(steps, s);
            /* Numbers (not raw text): the parser reads them as a manifest's. */
            cJSON_AddNumberToObject(s, "percent", (double)v);
            cJSON_AddNumberToObject(s, "bake_s", (double)a->bake);
            p = *end ? end + 1 : end;
        }
    }
    root = cJSON_CreateObject();
    if (!root || !steps || !cJSON_AddNumberToObject(root, "release", 1) ||
        !cJSON_AddNumberToObject(root, "step", 0)) {
        rc = hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
        goto out;
    }
    cJSON_AddItemToObject(root, "steps", steps);
    steps = NULL;
    if (hkn_rollout_parse(root, out, &rep))
        rc = hkc_usage(o, "%s%s: %s", a->steps_file ? "--steps-file " : "--steps",
                       a->steps_file ? a->steps_file : "", rep.message);
out:
    cJSON_Delete(steps);
    cJSON_Delete(root);
    free(text);
    hk_report_clear(&rep);
    return rc;
}

/* ---- reporting --------------------------------------------------------- */

static cJSON *names_json(char *const *v, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateString(v[i]));
    return a;
}

/* The rollout of m: text lines, or the document's fields. */
static void describe(hkc_out *o, const char *dir, const hkn_manifest *m) {
    const hkn_rollout *r = &m->rollout;
    int64_t baked = now_s() - m->created;
    if (o->json) {
        hkc_set_str(o, "dir", dir);
        hkc_set_str(o, "module", m->module);
        hkc_set_int(o, "manifest_version", (long long)m->version);
        hkc_set_int(o, "release", (long long)(r->present ? r->release : m->version));
        hkc_set_int(o, "target_release", (long long)m->release);
        hkc_set_int(o, "previous", (long long)r->previous);
        hkc_set_int(o, "created", (long long)m->created);
        hkc_set_int(o, "expires", (long long)m->expires);
        hkc_set(o, "rollout", cJSON_CreateBool(r->present));
        if (!r->present)
            return;
        hkc_set_int(o, "step", (long long)r->step);
        /* The stable release's artifacts, for hosts outside the step (0: none carried). */
        hkc_set_int(o, "previous_artifacts", (long long)m->nprevious);
        hkc_set_int(o, "baked_s", (long long)(baked > 0 ? baked : 0));
        hkc_set(o, "paused", cJSON_CreateBool(r->paused));
        hkc_set(o, "aborted", cJSON_CreateBool(r->aborted));
        cJSON *steps = cJSON_CreateArray();
        for (size_t i = 0; steps && i < r->nsteps; i++) {
            cJSON *s = cJSON_CreateObject();
            cJSON_AddItemToArray(steps, s);
            cJSON_AddItemToObject(s, "percent", hkc_int(r->steps[i].percent));
            cJSON_AddItemToObject(s, "bake_s", hkc_int((long long)r->steps[i].bake_s));
            cJSON_AddItemToObject(s, "hosts", names_json(r->steps[i].hosts, r->steps[i].nhosts));
            cJSON_AddItemToObject(s, "labels", names_json(r->steps[i].labels, r->steps[i].nlabels));
        }
        hkc_set(o, "steps", steps);
        return;
    }
    printf("%s: module %s, manifest v%llu", dir, m->module, (unsigned long long)m->version);
    if (!r->present) {
        printf(", release %llu, no rollout (every host takes it)\n",
               (unsigned long long)m->version);
        return;
    }
    printf(", release %llu (previous %llu)%s%s%s\n", (unsigned long long)r->release,
           (unsigned long long)r->previous,
           m->nprevious ? ", which hosts outside the step run" : "", r->paused ? ", paused" : "",
           r->aborted ? ", ABORTED: every host goes back to the previous release" : "");
    for (size_t i = 0; i < r->nsteps; i++) {
        const hkn_rollout_step *s = &r->steps[i];
        printf("  %s step %zu: %3u%%, bake %llu s", i == r->step ? "->" : "  ", i + 1, s->percent,
               (unsigned long long)s->bake_s);
        for (size_t k = 0; k < s->nhosts; k++)
            printf("%s%s", k ? "," : ", hosts ", s->hosts[k]);
        for (size_t k = 0; k < s->nlabels; k++)
            printf("%s%s", k ? "," : ", labels ", s->labels[k]);
        if (i == r->step)
            printf(" (published %lld s ago)", (long long)(baked > 0 ? baked : 0));
        putchar('\n');
    }
}

/* ---- push fleets (cli/push_fleet.c) ------------------------------------ */

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* What a push round of the manifest m ended with: text, or the document's
 * "push" member; the exit status (1 unless every host acknowledged, 0 for
 * watch's changes once published: watch judges the replies itself). */
static int push_said(hkc_out *o, const hkc_rollout_args *a, const hkn_manifest *m,
                     const hkc_verdict *v, double ms) {
    if (o->json) {
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "state",
                                v->state == HKC_GATE_FAIL   ? "fail"
                                : v->state == HKC_GATE_PASS ? "pass"
                                                            : "unknown");
        cJSON_AddStringToObject(p, "reason", v->reason);
        cJSON_AddItemToObject(p, "release",
                              hkc_int((long long)hkn_rollout_target(&m->rollout, m->version)));
        cJSON_AddItemToObject(p, "hosts", hkc_int((long long)v->expected));
        cJSON_AddItemToObject(p, "acknowledged", hkc_int((long long)v->on_release));
        cJSON_AddItemToObject(p, "ms", hkc_int((long long)ms));
        hkc_set(o, "push", p);
    } else {
        printf("push: %s (%.0f ms)\n", v->reason, ms);
    }
    if (v->state == HKC_GATE_PASS || a->published_is_done)
        return 0;
    return hkc_fail(o, v->state == HKC_GATE_FAIL ? HK_ERR_REJECTED : HK_ERR_NETWORK, NULL, "%s%s",
                    v->reason,
                    v->state == HKC_GATE_FAIL ? "; abort the rollout (watch does)"
                                              : "; the next command or watch pushes again");
}

/* Pushes DIR's manifest, as published now, to the hosts that lack it. */
static int push_current(hkc_out *o, const hkc_rollout_args *a, const hkn_trust *pub) {
    hkc_man cur;
    hkc_verdict v;
    int rc = hkc_man_load(o, a->dir, MANIFEST, pub, &cur);
    if (rc)
        return rc;
    double t0 = mono_ms();
    if (!(rc = hkc_push_round(o, a, &cur, 0, &v)))
        rc = push_said(o, a, &cur.m, &v, mono_ms() - t0);
    hkc_verdict_free(&v);
    hkc_man_free(&cur);
    return rc;
}

/* advance of a push fleet: every host of the steps so far acknowledged
 * the release (those that lack it pushed once more first). */
static int step_acked(hkc_out *o, const hkc_rollout_args *a, const hkc_man *cur) {
    hkc_verdict v;
    int rc = hkc_push_round(o, a, cur, 0, &v);
    if (!rc && v.state != HKC_GATE_PASS)
        rc = hkc_fail(o, v.state == HKC_GATE_FAIL ? HK_ERR_REJECTED : HK_ERR_BUSY, NULL,
                      "step %u is not acknowledged by every host: %s", cur->m.rollout.step + 1,
                      v.reason);
    hkc_verdict_free(&v);
    return rc;
}

/* ---- the subcommands --------------------------------------------------- */

typedef int (*sub_fn)(hkc_out *o, const hkc_rollout_args *a, const hkc_signers *key, hkc_man *cur);

/* The current manifest's rollout, for advance, pause, resume and abort:
 * 0, or the exit status of the refusal. */
static int need_rollout(hkc_out *o, const hkc_rollout_args *a, const hkc_man *cur) {
    if (!cur->have)
        return hkc_fail(o, HK_ERR_NOT_FOUND, NULL, "%s/" MANIFEST " does not exist: start one",
                        a->dir);
    if (!cur->m.rollout.present)
        return hkc_fail(o, HK_ERR_INVALID, NULL,
                        "release %llu of %s has no rollout (every host takes it): start one",
                        (unsigned long long)cur->m.version, cur->m.module);
    if (cur->m.rollout.aborted)
        return hkc_fail(o, HK_ERR_INVALID, NULL,
                        "the rollout of release %llu is aborted: start a new one",
                        (unsigned long long)cur->m.rollout.release);
    return 0;
}

/* Every artifact of m lies in the origin's artifacts/ (an abort serves the
 * previous release's again). */
static int artifacts_there(hkc_out *o, const hkc_rollout_args *a, const hkn_manifest *m) {
    for (size_t i = 0; i < m->nartifacts; i++) {
        char path[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/artifacts/%s", a->dir, m->artifacts[i].sha256);
        if (stat(path, &st) != 0 || (uint64_t)st.st_size != m->artifacts[i].size)
            return hkc_fail(o, HK_ERR_NOT_FOUND, NULL,
                            "%s (artifact '%s' of release %llu) is missing or not %llu bytes", path,
                            m->artifacts[i].name, (unsigned long long)m->release,
                            (unsigned long long)m->artifacts[i].size);
    }
    return 0;
}

/* previous-manifest.json, verified with pub, as the release r went back
 * from: 0 with prev->have (or, when !required and the file is missing,
 * without), or the exit status. Its artifacts must lie in the origin. */
static int load_previous(hkc_out *o, const hkc_rollout_args *a, const hkn_trust *pub,
                         const hkn_rollout *r, int required, hkc_man *prev) {
    int rc = hkc_man_load(o, a->dir, PREVIOUS, pub, prev);
    if (rc || (!prev->have && !required))
        return rc;
    if (!prev->have || prev->m.release != r->previous)
        rc = hkc_fail(o, HK_ERR_NOT_FOUND, NULL,
                      "%s/" PREVIOUS " %s release %llu, the rollout's previous one", a->dir,
                      prev->have ? "is not" : "is missing: it would hold",
                      (unsigned long long)r->previous);
    if (!rc)
        rc = artifacts_there(o, a, &prev->m);
    if (rc)
        hkc_man_free(prev);
    return rc;
}

/* The stable release m carries for the hosts outside the step that run
 * neither it nor the rollout's release (docs/ROLLOUT.md): the previous
 * release's artifacts, into parts. A manifest of an older hotkern (none
 * carried yet) takes them from previous-manifest.json; without that file
 * m carries none, which is said. None without a previous release. */
static int carry_stable(hkc_out *o, const hkc_rollout_args *a, const hkn_trust *pub,
                        hkn_manifest *m, hkn_artifact *parts) {
    hkc_man prev;
    if (m->nprevious || !m->rollout.previous)
        return 0;
    int rc = load_previous(o, a, pub, &m->rollout, 0, &prev);
    if (rc)
        return rc;
    if (!prev.have) {
        fprintf(stderr,
                "hotkern rollout: %s/" PREVIOUS " is missing: the manifest does not carry the "
                "stable release %llu (hosts outside the step that run nothing keep nothing)\n",
                a->dir, (unsigned long long)m->rollout.previous);
        return 0;
    }
    memcpy(parts, prev.m.artifacts, prev.m.nartifacts * sizeof *parts);
    m->previous_artifacts = parts;
    m->nprevious = prev.m.nartifacts;
    hkc_man_free(&prev);
    return 0;
}

/* The next manifest of cur's release: the same artifacts, stable release
 * (parts) and steps, one version above. */
static int next_of(hkc_out *o, const hkc_man *cur, hkn_manifest *m, hkn_artifact *arts,
                   hkn_artifact *parts) {
    *m = cur->m;
    memcpy(arts, cur->m.artifacts, cur->m.nartifacts * sizeof *arts);
    m->artifacts = arts;
    if (cur->m.nprevious) /* NULL without */
        memcpy(parts, cur->m.previous_artifacts, cur->m.nprevious * sizeof *parts);
    m->previous_artifacts = parts;
    m->version = cur->m.version + 1;
    if (hkn_rollout_copy(&m->rollout, &cur->m.rollout))
        return hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    return 0;
}

static void said(hkc_out *o, const hkc_rollout_args *a, const char *what, const hkn_manifest *m) {
    if (!o->json)
        printf("%s: manifest v%llu written to %s\n", what, (unsigned long long)m->version, a->dir);
    describe(o, a->dir, m);
}

/* Reads FILE... into blobs (bytes[i] owned by the caller). */
static int read_blobs(hkc_out *o, const hkc_rollout_args *a, char **files, int n, hkn_blob *blobs,
                      char **bytes) {
    hk_report rep = HK_REPORT_INIT;
    if (n < 1 || n > HKN_MAX_ARTIFACTS)
        return hkc_usage(o, "give 1 to %d kernel and header files", HKN_MAX_ARTIFACTS);
    for (int i = 0; i < n; i++) {
        size_t len;
        if (hku_read_file(files[i], HKC_MAX_INPUT, &bytes[i], &len, &rep)) {
            int rc = hkc_fail_report(o, &rep);
            hk_report_clear(&rep);
            return rc;
        }
        hk_format f = hkn_format_from_name(files[i]);
        blobs[i] =
            (hkn_blob){.name = files[i],
                       .bytes = bytes[i],
                       .size = len,
                       .format = f,
                       .arch = (f == HK_FORMAT_CUBIN || f == HK_FORMAT_FATBIN) ? a->arch : NULL};
    }
    return 0;
}

/* Copies the manifest being replaced to previous-manifest.json: the
 * release an abort goes back to. */
static int keep_previous(hkc_out *o, const hkc_rollout_args *a, const hkc_man *cur) {
    if (!cur->have)
        return 0;
    int rc = write_file(o, a->dir, PREVIOUS ".sig", cur->sig, cur->sig_len);
    return rc ? rc : write_file(o, a->dir, PREVIOUS, cur->text, cur->len);
}

static int do_start(hkc_out *o, const hkc_rollout_args *a, const hkc_signers *key, hkc_man *cur,
                    char **files, int nfiles) {
    hkn_manifest m;
    hkn_artifact arts[HKN_MAX_ARTIFACTS];
    hkn_blob blobs[HKN_MAX_ARTIFACTS];
    char *bytes[HKN_MAX_ARTIFACTS] = {0};
    hk_report rep = HK_REPORT_INIT;
    int rc;
    memset(&m, 0, sizeof m);
    if (!a->module)
        return hkc_usage(o, "--module is required");
    if (cur->have && strcmp(cur->m.module, a->module))
        return hkc_usage(o, "%s holds module %s, not %s", a->dir, cur->m.module, a->module);
    const hkn_rollout *cr = &cur->m.rollout;
    if (cur->have && cr->present && !cr->aborted && cr->step + 1 < cr->nsteps)
        return hkc_fail(o, HK_ERR_BUSY, NULL,
                        "release %llu is at step %u of %zu: advance it to the last step or abort "
                        "it before starting another",
                        (unsigned long long)cr->release, cr->step + 1, cr->nsteps);
    m.version = cur->have ? cur->m.version + 1 : 1;
    uint64_t previous = cur->have ? cur->m.release : 0;
    uint64_t release = a->release ? a->release : m.version;
    if (release <= previous)
        return hkc_usage(o, "--release %llu is not above the release the fleet runs (%llu)",
                         (unsigned long long)release, (unsigned long long)previous);
    if ((rc = read_steps(o, a, &m.rollout)))
        return rc;
    m.rollout.release = release;
    m.rollout.previous = previous;
    snprintf(m.module, sizeof m.module, "%s", a->module);
    size_t n = (size_t)nfiles;
    hkc_built *built = NULL;
    if ((rc = read_blobs(o, a, files, nfiles, blobs, bytes)) ||
        (a->build_for &&
         (rc = hkc_build_for(o, a->build_for, blobs, &n, HKN_MAX_ARTIFACTS, &built))))
        goto out;
    if (hkn_artifacts_from_blobs(blobs, n, arts, &rep)) {
        rc = hkc_usage(o, "%s", rep.message);
        goto out;
    }
    m.artifacts = arts;
    m.nartifacts = n;
    /* The release replaced is the stable one, for the hosts outside the step. */
    if (previous) {
        if ((rc = artifacts_there(o, a, &cur->m)))
            goto out;
        m.previous_artifacts = cur->m.artifacts;
        m.nprevious = cur->m.nartifacts;
    }
    if (!(rc = keep_previous(o, a, cur)) && !(rc = publish(o, a, key, &m, blobs, n, cur->mtime)))
        said(o, a, "started", &m);
out:
    hkc_built_free(built);
    for (int i = 0; i < HKN_MAX_ARTIFACTS; i++)
        free(bytes[i]);
    hkn_rollout_free(&m.rollout);
    hk_report_clear(&rep);
    return rc;
}

static int do_advance(hkc_out *o, const hkc_rollout_args *a, const hkc_signers *key, hkc_man *cur) {
    hkn_manifest m;
    hkn_artifact arts[HKN_MAX_ARTIFACTS], parts[HKN_MAX_ARTIFACTS];
    int rc = need_rollout(o, a, cur);
    if (rc)
        return rc;
    const hkn_rollout *r = &cur->m.rollout;
    if (r->paused)
        return hkc_fail(o, HK_ERR_BUSY, NULL, "the rollout of release %llu is paused: resume it",
                        (unsigned long long)r->release);
    if (r->step + 1 >= r->nsteps)
        return hkc_fail(o, HK_ERR_INVALID, NULL,
                        "release %llu is at its last step (%u of %zu) already",
                        (unsigned long long)r->release, r->step + 1, r->nsteps);
    int64_t baked = now_s() - cur->m.created;
    if (!a->force && baked < (int64_t)r->steps[r->step].bake_s)
        return hkc_fail(o, HK_ERR_BUSY, NULL,
                        "step %u bakes %lld s more (of %llu s); --force advances now", r->step + 1,
                        (long long)((int64_t)r->steps[r->step].bake_s - baked),
                        (unsigned long long)r->steps[r->step].bake_s);
    if (a->endpoints && (rc = step_acked(o, a, cur)))
        return rc;
    if ((rc = next_of(o, cur, &m, arts, parts)))
        return rc;
    m.rollout.step++;
    if (!(rc = carry_stable(o, a, &key->pub, &m, parts)) &&
        !(rc = publish(o, a, key, &m, NULL, 0, cur->mtime)))
        said(o, a, "advanced", &m);
    hkn_rollout_free(&m.rollout);
    return rc;
}

static int set_paused(hkc_out *o, const hkc_rollout_args *a, const hkc_signers *key, hkc_man *cur,
                      int paused) {
    hkn_manifest m;
    hkn_artifact arts[HKN_MAX_ARTIFACTS], parts[HKN_MAX_ARTIFACTS];
    int rc = need_rollout(o, a, cur);
    if (rc)
        return rc;
    if (cur->m.rollout.paused == paused)
        return hkc_fail(o, HK_ERR_INVALID, NULL, "the rollout of release %llu is %s already",
                        (unsigned long long)cur->m.rollout.release,
                        paused ? "paused" : "not paused");
    if ((rc = next_of(o, cur, &m, arts, parts)))
        return rc;
    m.rollout.paused = paused;
    if (!(rc = carry_stable(o, a, &key->pub, &m, parts)) &&
        !(rc = publish(o, a, key, &m, NULL, 0, cur->mtime)))
        said(o, a, paused ? "paused" : "resumed", &m);
    hkn_rollout_free(&m.rollout);
    return rc;
}

static int do_pause(hkc_out *o, const hkc_rollout_args *a, const hkc_signers *key, hkc_man *cur) {
    return set_paused(o, a, key, cur, 1);
}

static int do_resume(hkc_out *o, const hkc_rollout_args *a, const hkc_signers *key, hkc_man *cur) {
    return set_paused(o, a, key, cur, 0);
}

static int do_abort(hkc_out *o, const hkc_rollout_args *a, const hkc_signers *key, hkc_man *cur) {
    hkc_man prev;
    hkn_manifest m;
    hkn_artifact arts[HKN_MAX_ARTIFACTS], parts[HKN_MAX_ARTIFACTS];
    int rc = need_rollout(o, a, cur);
    if (rc)
        return rc;
    const hkn_rollout *r = &cur->m.rollout;
    if (r->previous == 0)
        return hkc_fail(o, HK_ERR_NO_HISTORY, NULL,
                        "release %llu has no previous release to go back to",
                        (unsigned long long)r->release);
    if ((rc = load_previous(o, a, &key->pub, r, 1, &prev)))
        return rc;
    if ((rc = next_of(o, cur, &m, arts, parts)))
        goto out;
    /* The previous release's artifacts under the newer version: the stable
     * release for every host, carried no more beside them. */
    memcpy(arts, prev.m.artifacts, prev.m.nartifacts * sizeof *arts);
    m.nartifacts = prev.m.nartifacts;
    m.nprevious = 0;
    m.rollout.aborted = 1;
    if (!(rc = publish(o, a, key, &m, NULL, 0, cur->mtime)))
        said(o, a, "aborted", &m);
    hkn_rollout_free(&m.rollout);
out:
    hkc_man_free(&prev);
    return rc;
}

/* ---- running a subcommand ---------------------------------------------- */

static const struct {
    const char *name;
    sub_fn fn; /* NULL: start and status, which take other arguments */
} subs[] = {
    {"start", NULL},       {"advance", do_advance}, {"pause", do_pause},
    {"resume", do_resume}, {"abort", do_abort},     {"status", NULL},
};

int hkc_lock_dir(hkc_out *o, const char *dir, int *fd) {
    *fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*fd < 0)
        return hkc_fail(o, HK_ERR_IO, NULL, "%s: %s", dir, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0)
        return hkc_fail(o, HK_ERR_BUSY, NULL, "%s: another rollout command holds it", dir);
    return 0;
}

/* status --prometheus: the fleet after the manifest's own words. */
static int fleet_status(hkc_out *o, const hkc_rollout_args *a, const hkn_manifest *m) {
    hkc_prom p = {
        .url = a->prometheus, .token = a->prom_token, .timeout_s = (long)a->prom_timeout_s};
    hkc_verdict v;
    if (!m->rollout.present)
        return hkc_fail(o, HK_ERR_INVALID, NULL,
                        "release %llu of %s has no rollout: every host takes it",
                        (unsigned long long)m->version, m->module);
    int rc = hkc_gate_check_queries(o, &p, a, m);
    if (rc) {
        hkc_prom_close(&p);
        return rc;
    }
    hkc_gate_eval(&p, a, m, &v);
    hkc_prom_close(&p);
    if (!v.answered)
        rc = hkc_fail(o, HK_ERR_NETWORK, NULL, "%s", v.reason);
    else
        hkc_fleet_describe(o, m, &v);
    hkc_verdict_free(&v);
    return rc;
}

int hkc_rollout_run(hkc_out *o, const char *sub, const hkc_rollout_args *a, char **files,
                    int nfiles) {
    hkc_signers key;
    hkc_man cur;
    hk_report rep = HK_REPORT_INIT;
    int rc = 0, fd = -1, known = 0;
    int status = !strcmp(sub, "status"), start = !strcmp(sub, "start");
    memset(&cur, 0, sizeof cur);
    memset(&key, 0, sizeof key);
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
        known |= !strcmp(sub, subs[i].name);
    if (!known)
        return hkc_usage(o, "no subcommand '%s' here", sub);
    if (!status && mkdir(a->dir, 0755) != 0 && errno != EEXIST)
        return hkc_fail(o, HK_ERR_IO, NULL, "mkdir %s: %s", a->dir, strerror(errno));
    if (!status && (rc = hkc_signers_load(o, &a->keys, &key)))
        goto out;
    if (status && a->pubkey) {
        if (hkn_pubkey_load(a->pubkey, &key.pub.keys[0], &rep)) {
            rc = hkc_fail_report(o, &rep);
            goto out;
        }
        key.pub.nkeys = key.pub.threshold = 1;
    }
    if ((!status && (rc = hkc_lock_dir(o, a->dir, &fd))) ||
        (rc = hkc_man_load(o, a->dir, MANIFEST, status && !a->pubkey ? NULL : &key.pub, &cur)))
        goto out;
    int pushes = a->endpoints && (start || !strcmp(sub, "advance") || !strcmp(sub, "abort"));
    if (status) {
        if (!cur.have)
            rc = hkc_fail(o, HK_ERR_NOT_FOUND, NULL, "%s/" MANIFEST " does not exist", a->dir);
        else {
            describe(o, a->dir, &cur.m);
            if (a->prometheus)
                rc = fleet_status(o, a, &cur.m);
            if (!rc && a->endpoints && cur.m.rollout.present)
                rc = hkc_push_describe(o, a, &cur.m);
        }
    } else if (pushes && !strcmp(sub, "abort") && cur.have && cur.m.rollout.present &&
               cur.m.rollout.aborted) {
        /* Aborted already: the hosts not confirmed back are pushed again. */
        rc = 0;
    } else if (start) {
        rc = do_start(o, a, &key, &cur, files, nfiles);
    } else {
        for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
            if (!strcmp(sub, subs[i].name))
                rc = subs[i].fn(o, a, &key, &cur);
    }
    if (!rc && pushes)
        rc = push_current(o, a, &key.pub);
out:
    if (fd >= 0)
        close(fd);
    sodium_memzero(&key, sizeof key);
    hkc_man_free(&cur);
    hk_report_clear(&rep);
    return rc;
}

int hkc_rollout_change(hkc_out *o, const char *sub, const hkc_rollout_args *a) {
    hkc_rollout_args b = {.dir = a->dir,
                          .keys = a->keys,
                          .expires_in = a->expires_in,
                          .force = !strcmp(sub, "advance"),
                          .endpoints = a->endpoints,
                          .http = a->http,
                          .concurrency = a->concurrency,
                          .retries = a->retries,
                          .published_is_done = 1};
    if (!strcmp(sub, "start") || !strcmp(sub, "status"))
        return hkc_usage(o, "no rollout change '%s'", sub);
    return hkc_rollout_run(o, sub, &b, NULL, 0);
}

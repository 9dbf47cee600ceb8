/*
 * Rollouts, one host at a time: the manifest's rollout object (net/rollout.c)
 * read field by field, every bad field refused with its name; buckets
 * (net/fleet.c) stable and spread over 10,000 host ids, a share that grows
 * only adding hosts; the gate's decisions; the host's identity; abort
 * manifests accepted by the anti-rollback state and a changed rollout refused
 * by its signature; then a puller (net/pull.c) against Debian's nginx through
 * every step the CLI publishes (`hotkern rollout`), its metrics and refusals,
 * and its /metrics server; and the CLI's own refusals. The fleet of 100 hosts
 * is tests/cpu_fleet.c.
 */
#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <sodium.h>

#include "hotkern/net.h"
#include "loader/expo.h"
#include "loader/core.h"
#include "loader/expo.h"
#include "net/net.h"
#include "tests/fakecuda.h"
#include "tests/harness.h"

/* ---- manifests with a rollout ------------------------------------------ */

/* A manifest's text with `rollout` as its rollout member (NULL: none). */
static char *manifest_with(const char *rollout) {
    static const char head[] =
        "{\"module\": \"add\", \"version\": 7, \"created\": 1700000000, \"expires\": 1800000000, "
        "\"key_id\": \"\", \"artifacts\": [{\"name\": \"add.ptx\", \"sha256\": "
        "\"bfc5734f1ac9d9dd5fc844df2e5ab938ce82bb0d8d782a859c85f2459189c3de\", \"size\": 25, "
        "\"format\": \"ptx\", \"arch\": \"\"}]";
    char *out = NULL;
    ck_assert_int_ge(
        asprintf(&out, "%s%s%s}", head, rollout ? ", \"rollout\": " : "", rollout ? rollout : ""),
        0);
    return out;
}

static int parse(const char *rollout, hkn_manifest *m, hk_report *rep) {
    char *text = manifest_with(rollout);
    hk_report_clear(rep);
    int err = hkn_manifest_parse(text, strlen(text), m, rep);
    free(text);
    return err;
}

START_TEST(parse_reads_every_field) {
    hkn_manifest m;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(parse("{\"release\": 3, \"previous\": 2, \"step\": 1, \"steps\": ["
                        "{\"percent\": 1, \"hosts\": [\"host-7\", \"db1.example:9\"], \"bake_s\": "
                        "60}, {\"percent\": 10, \"labels\": [\"canary\", \"gpu=h100\"]}, "
                        "{\"percent\": 100, \"bake_s\": 0}], \"paused\": true, \"aborted\": false}",
                        &m, &rep) == 0,
                  "%s", rep.message);
    const hkn_rollout *r = &m.rollout;
    ck_assert(r->present);
    ck_assert_uint_eq(r->release, 3);
    ck_assert_uint_eq(r->previous, 2);
    ck_assert_uint_eq(r->step, 1);
    ck_assert_uint_eq(r->nsteps, 3);
    ck_assert_uint_eq(r->steps[0].percent, 1);
    ck_assert_uint_eq(r->steps[0].bake_s, 60);
    ck_assert_uint_eq(r->steps[0].nhosts, 2);
    ck_assert_str_eq(r->steps[0].hosts[1], "db1.example:9");
    ck_assert_uint_eq(r->steps[1].nlabels, 2);
    ck_assert_str_eq(r->steps[1].labels[1], "gpu=h100");
    ck_assert_uint_eq(r->steps[1].bake_s, 0); /* absent: 0 */
    ck_assert(r->paused && !r->aborted);
    ck_assert_uint_eq(m.version, 7);
    ck_assert_uint_eq(m.release, 3); /* the engine records the rollout's release */
    hkn_manifest_free(&m);

    /* Aborted: the host runs the previous release. */
    ck_assert_int_eq(parse("{\"release\": 3, \"previous\": 2, \"step\": 0, \"steps\": "
                           "[{\"percent\": 5}], \"aborted\": true}",
                           &m, &rep),
                     0);
    ck_assert_uint_eq(m.release, 2);
    ck_assert(!m.rollout.paused); /* absent: false */
    hkn_manifest_free(&m);

    /* Without a rollout, as ever: every host, the manifest's version. */
    ck_assert_int_eq(parse(NULL, &m, &rep), 0);
    ck_assert(!m.rollout.present);
    ck_assert_uint_eq(m.release, 7);
    ck_assert(hkn_rollout_covers(&m.rollout, 9999, "any", NULL, 0));
    hkn_manifest_free(&m);
    hk_report_clear(&rep);
}
END_TEST

/* Every field refused with its name: a rollout as it arrives (types) and
 * as it means (ranges, order, names). */
START_TEST(parse_refuses_each_bad_field) {
    static const struct {
        const char *rollout, *says;
    } bad[] = {
        {"5", "'rollout' must be an object"},
        {"null", "'rollout' must be an object"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 5}], \"gate\": \"p99\"}",
         "member 'gate' this host does not know"},
        {"{\"release\": 2, \"step\": 0, \"step\": 0, \"steps\": [{\"percent\": 5}]}",
         "has 'step' twice"},
        {"{\"step\": 0, \"steps\": [{\"percent\": 5}]}", "release must be an integer"},
        {"{\"release\": 0, \"step\": 0, \"steps\": [{\"percent\": 5}]}", "'release' must be"},
        {"{\"release\": 1.5, \"step\": 0, \"steps\": [{\"percent\": 5}]}",
         "release must be an integer"},
        {"{\"release\": \"2\", \"step\": 0, \"steps\": [{\"percent\": 5}]}",
         "release must be an integer"},
        {"{\"release\": 2, \"previous\": 2, \"step\": 0, \"steps\": [{\"percent\": 5}]}",
         "'previous' (2) must be below 'release' (2)"},
        {"{\"release\": 2, \"previous\": -1, \"step\": 0, \"steps\": [{\"percent\": 5}]}",
         "previous must be an integer"},
        {"{\"release\": 2, \"steps\": [{\"percent\": 5}]}", "step must be an integer"},
        {"{\"release\": 2, \"step\": 1, \"steps\": [{\"percent\": 5}]}",
         "'step' 1 is not one of the 1 steps"},
        {"{\"release\": 2, \"step\": 0}", "'steps' must be an array of 1 to 32"},
        {"{\"release\": 2, \"step\": 0, \"steps\": []}", "'steps' must be an array of 1 to 32"},
        {"{\"release\": 2, \"step\": 0, \"steps\": {\"percent\": 5}}", "'steps' must be an array"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [5]}", "steps[0] is not an object"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 5, \"weight\": 1}]}",
         "steps[0] has a member 'weight'"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"bake_s\": 5}]}",
         "steps[0].percent must be an integer from 0 to 100 (it is missing)"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 101}]}",
         "steps[0].percent must be an integer from 0 to 100"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": \"10\"}]}",
         "steps[0].percent must be"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 10}, {\"percent\": 5}]}",
         "steps[1].percent 5 is below steps[0]'s 10"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 10, \"bake_s\": -1}]}",
         "steps[0].bake_s must be an integer"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 10, \"bake_s\": 99999999}]}",
         "steps[0].bake_s must be an integer"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 0, \"hosts\": \"h\"}]}",
         "steps[0].hosts must be an array"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 0, \"hosts\": [7]}]}",
         "steps[0].hosts[0] is not a string"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 0, \"hosts\": [\"a b\"]}]}",
         "steps[0].hosts[0] 'a b' is not a host id"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 0, \"hosts\": [\"\"]}]}",
         "is not a host id"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 0, \"hosts\": [\"a\", "
         "\"a\"]}]}",
         "steps[0].hosts names 'a' twice"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 0, \"labels\": [\"x,y\"]}]}",
         "steps[0].labels[0] 'x,y' is not a label"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 5}, {\"percent\": 5, "
         "\"labels\": [\"c\", \"c\"]}]}",
         "steps[1].labels names 'c' twice"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 0}]}", "steps[0] names no host"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 5}], \"paused\": \"yes\"}",
         "'paused' must be true or false"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 5}], \"aborted\": 1}",
         "'aborted' must be true or false"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 5}], \"aborted\": true}",
         "aborted with no 'previous'"},
    };
    hk_report rep = HK_REPORT_INIT;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hkn_manifest m;
        int err = parse(bad[i].rollout, &m, &rep);
        ck_assert_msg(err == HK_ERR_INVALID && strstr(rep.message, bad[i].says),
                      "case %zu (%s): %d: %s", i, bad[i].rollout, err, rep.message);
        ck_assert_ptr_null(m.artifacts); /* nothing is left to free */
        ck_assert(!m.rollout.present && !m.rollout.steps);
    }
    /* 33 steps: one too many. */
    char big[4096] = "{\"release\": 2, \"step\": 0, \"steps\": [";
    for (int i = 0; i < 33; i++)
        strcat(big, i ? ", {\"percent\": 50}" : "{\"percent\": 50}");
    strcat(big, "]}");
    hkn_manifest m;
    ck_assert_int_eq(parse(big, &m, &rep), HK_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(rep.message, "'steps' must be an array of 1 to 32"));
    big[strlen(big) - 19] = '\0'; /* 32 steps parse */
    strcat(big, "]}");
    ck_assert_msg(parse(big, &m, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(m.rollout.nsteps, 32);
    hkn_manifest_free(&m);
    hk_report_clear(&rep);
}
END_TEST

/* The manifest of manifest_with, rollout 2 of 1 at `rollout` (NULL: none)
 * and the stable release as `stable` (the previous_artifacts member's
 * value; NULL: none). */
static int parse_stable(const char *rollout, const char *stable, hkn_manifest *m, hk_report *rep) {
    char *text = manifest_with(rollout), *with = NULL;
    text[strlen(text) - 1] = '\0'; /* the closing brace */
    ck_assert_int_ge(asprintf(&with, "%s%s%s}", text, stable ? ", \"previous_artifacts\": " : "",
                              stable ? stable : ""),
                     0);
    hk_report_clear(rep);
    int err = hkn_manifest_parse(with, strlen(with), m, rep);
    free(text);
    free(with);
    return err;
}

#define STABLE_SHA "aa5734f1ac9d9dd5fc844df2e5ab938ce82bb0d8d782a859c85f2459189c3d00"
#define STABLE                                                                                     \
    "[{\"name\": \"add.ptx\", \"sha256\": \"" STABLE_SHA "\", \"size\": 24, \"format\": "          \
    "\"ptx\", \"arch\": \"\"}]"
#define ROLLOUT_2_OF_1                                                                             \
    "{\"release\": 2, \"previous\": 1, \"step\": 0, \"steps\": [{\"percent\": 10}, "               \
    "{\"percent\": 100}]}"

/* The stable release a manifest carries (previous_artifacts): read as a
 * release's artifacts, taken by hkn_manifest_take_stable as release
 * `previous` with its own identity (an abort's, for the refusals
 * remembered); signed with the rest; refused beside no rollout, an aborted
 * one or one without a previous release, and for each bad artifact. */
START_TEST(stable_release_read_and_refused) {
    hkn_manifest m, ab;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(parse_stable(ROLLOUT_2_OF_1, STABLE, &m, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(m.nprevious, 1);
    ck_assert_str_eq(m.previous_artifacts[0].sha256, STABLE_SHA);
    ck_assert_uint_eq(m.previous_artifacts[0].size, 24);
    ck_assert_uint_eq(m.release, 2);
    char before[65], after[65], aborted[65];
    hkn_release_identity(&m, "", 0, before);
    hkn_manifest_take_stable(&m);
    ck_assert_uint_eq(m.release, 1);
    ck_assert_uint_eq(m.nartifacts, 1);
    ck_assert_str_eq(m.artifacts[0].sha256, STABLE_SHA);
    ck_assert_uint_eq(m.nprevious, 0);
    ck_assert_ptr_null(m.previous_artifacts);
    hkn_release_identity(&m, "", 0, after);
    ck_assert_str_ne(before, after);
    /* An abort to release 1 with those artifacts is the same release. */
    char *text = manifest_with("{\"release\": 2, \"previous\": 1, \"step\": 0, \"steps\": "
                               "[{\"percent\": 10}], \"aborted\": true}");
    char *at = strstr(text, "bfc5734f");
    memcpy(at, STABLE_SHA, 64);
    at = strstr(text, "\"size\": 25");
    memcpy(at, "\"size\": 24", 10);
    ck_assert_msg(hkn_manifest_parse(text, strlen(text), &ab, &rep) == 0, "%s", rep.message);
    hkn_release_identity(&ab, text, strlen(text), aborted);
    ck_assert_str_eq(after, aborted);
    free(text);
    hkn_manifest_free(&ab);
    hkn_manifest_take_stable(&m); /* none left: nothing changes */
    ck_assert_uint_eq(m.release, 1);
    ck_assert_str_eq(m.artifacts[0].sha256, STABLE_SHA);
    hkn_manifest_free(&m);

    /* Signed and read back; a byte of it changed is a bad signature. */
    hkn_seckey k;
    ck_assert_int_eq(hkn_keygen(&k), 0);
    hkn_trust t = {.nkeys = 1};
    t.keys[0] = k.pub;
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(parse_stable(ROLLOUT_2_OF_1, STABLE, &m, &rep), 0);
    m.created = now;
    m.expires = now + 600;
    char *json, *sig;
    size_t len;
    ck_assert_msg(hkn_manifest_sign(&k, &m, &json, &len, &sig, &rep) == 0, "%s", rep.message);
    hkn_manifest_free(&m);
    ck_assert_ptr_nonnull(strstr(json, "\"previous_artifacts\""));
    ck_assert_int_eq(hkn_verify_manifest(&t, NULL, json, len, sig, strlen(sig), now, &m, &rep), 0);
    ck_assert_uint_eq(m.nprevious, 1);
    ck_assert_str_eq(m.previous_artifacts[0].sha256, STABLE_SHA);
    hkn_manifest_free(&m);
    at = strstr(json, STABLE_SHA);
    ck_assert_ptr_nonnull(at);
    at[0] = 'b';
    ck_assert_int_eq(hkn_verify_manifest(&t, NULL, json, len, sig, strlen(sig), now, &m, &rep),
                     HK_ERR_SIGNATURE);
    free(json);
    free(sig);
    /* What a host could not act on is not signed either. */
    ck_assert_int_eq(parse_stable(ROLLOUT_2_OF_1, STABLE, &m, &rep), 0);
    m.rollout.aborted = 1;
    m.created = now;
    m.expires = now + 600;
    ck_assert_int_eq(hkn_manifest_sign(&k, &m, &json, &len, &sig, &rep), HK_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(rep.message, "'previous_artifacts' (the stable release)"));
    hkn_manifest_free(&m);

    static const struct {
        const char *rollout, *stable, *says;
    } bad[] = {
        {NULL, STABLE, "has no rollout"},
        {"{\"release\": 2, \"previous\": 1, \"step\": 0, \"steps\": [{\"percent\": 10}], "
         "\"aborted\": true}",
         STABLE, "is aborted"},
        {"{\"release\": 2, \"step\": 0, \"steps\": [{\"percent\": 10}]}", STABLE,
         "has no previous release"},
        {ROLLOUT_2_OF_1, "[]", "'previous_artifacts' must be an array of 1 to 16"},
        {ROLLOUT_2_OF_1, "{}", "'previous_artifacts' must be an array"},
        {ROLLOUT_2_OF_1, "[5]", "(the stable release): artifact 0 is not an object"},
        {ROLLOUT_2_OF_1,
         "[{\"name\": \"add.ptx\", \"sha256\": \"xyz\", \"size\": 24, \"format\": \"ptx\"}]",
         "(the stable release): artifact 'add.ptx': sha256 is not 64 hex"},
        {ROLLOUT_2_OF_1,
         "[{\"name\": \"../x\", \"sha256\": \"" STABLE_SHA "\", \"size\": 24, \"format\": "
         "\"ptx\"}]",
         "(the stable release): artifact name '../x' is not a plain"},
        {ROLLOUT_2_OF_1,
         "[{\"name\": \"a.h\", \"sha256\": \"" STABLE_SHA "\", \"size\": 24, \"format\": "
         "\"header\"}]",
         "(the stable release): only headers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int err = parse_stable(bad[i].rollout, bad[i].stable, &m, &rep);
        ck_assert_msg(err == HK_ERR_INVALID && strstr(rep.message, bad[i].says) &&
                          strstr(rep.message, "previous_artifacts"),
                      "case %zu: %d: %s", i, err, rep.message);
        ck_assert_ptr_null(m.artifacts); /* nothing is left to free */
        ck_assert_ptr_null(m.previous_artifacts);
    }
    hk_report_clear(&rep);
}
END_TEST

/* A rollout written (hkn_manifest_sign) reads back the same, verifies, and
 * any change to it after signing is refused by the signature. */
START_TEST(signed_rollout_round_trip_and_tamper) {
    hkn_seckey key;
    ck_assert_int_eq(hkn_keygen(&key), 0);
    hkn_manifest m;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(parse("{\"release\": 3, \"previous\": 2, \"step\": 0, \"steps\": ["
                           "{\"percent\": 1, \"hosts\": [\"h1\"], \"bake_s\": 60}, "
                           "{\"percent\": 100, \"labels\": [\"canary\"]}]}",
                           &m, &rep),
                     0);
    int64_t now = (int64_t)time(NULL);
    m.created = now;
    m.expires = now + 600;
    char *json, *sig;
    size_t len;
    ck_assert_msg(hkn_manifest_sign(&key, &m, &json, &len, &sig, &rep) == 0, "%s", rep.message);
    hkn_manifest_free(&m);
    hkn_trust t = {.nkeys = 1};
    t.keys[0] = key.pub;
    hkn_manifest back;
    ck_assert_msg(hkn_verify_manifest(&t, NULL, json, len, sig, strlen(sig), now, &back, &rep) == 0,
                  "%s", rep.message);
    ck_assert_uint_eq(back.rollout.nsteps, 2);
    ck_assert_str_eq(back.rollout.steps[0].hosts[0], "h1");
    ck_assert_str_eq(back.rollout.steps[1].labels[0], "canary");
    ck_assert_uint_eq(back.rollout.steps[0].bake_s, 60);
    ck_assert_uint_eq(back.release, 3);
    hkn_manifest_free(&back);
    /* Another step, another share, another host: each is refused. */
    static const char *const from[] = {"\"step\":\t0", "\"percent\":\t1,", "\"h1\""};
    static const char *const to[] = {"\"step\":\t1", "\"percent\":\t9,", "\"h2\""};
    for (int i = 0; i < 3; i++) {
        char *copy = strdup(json), *at = strstr(copy, from[i]);
        ck_assert_msg(at != NULL, "no %s in %s", from[i], json);
        memcpy(at, to[i], strlen(to[i]));
        hk_report_clear(&rep);
        ck_assert_int_eq(
            hkn_verify_manifest(&t, NULL, copy, len, sig, strlen(sig), now, &back, &rep),
            HK_ERR_SIGNATURE);
        free(copy);
    }
    free(json);
    free(sig);
    /* A rollout that is not one does not get signed. */
    ck_assert_int_eq(parse(NULL, &m, &rep), 0);
    m.rollout.present = 1; /* no steps */
    m.rollout.release = 1;
    m.created = now;
    m.expires = now + 600;
    ck_assert_int_eq(hkn_manifest_sign(&key, &m, &json, &len, &sig, &rep), HK_ERR_INVALID);
    ck_assert(!json && !sig);
    m.rollout.present = 0;
    hkn_manifest_free(&m);
    hk_report_clear(&rep);
}
END_TEST

/* A rollout's manifests raise the anti-rollback record at each step, and an
 * abort (the previous release's artifacts, a higher version) is accepted
 * after the release it undoes; an older step replayed is not. */
START_TEST(abort_manifest_is_accepted) {
    hkn_seckey key;
    hkn_state *st;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_keygen(&key), 0);
    ck_assert_int_eq(hkn_state_open(NULL, &st, &rep), 0);
    hkn_trust t = {.nkeys = 1};
    t.keys[0] = key.pub;
    int64_t now = (int64_t)time(NULL);
    char *texts[4], *sigs[4];
    size_t lens[4];
    static const char *const rollouts[] = {
        NULL,
        "{\"release\": 2, \"previous\": 1, \"step\": 0, \"steps\": [{\"percent\": 10}, "
        "{\"percent\": 100}]}",
        "{\"release\": 2, \"previous\": 1, \"step\": 1, \"steps\": [{\"percent\": 10}, "
        "{\"percent\": 100}]}",
        "{\"release\": 2, \"previous\": 1, \"step\": 1, \"steps\": [{\"percent\": 10}, "
        "{\"percent\": 100}], \"aborted\": true}",
    };
    for (int i = 0; i < 4; i++) {
        hkn_manifest m;
        ck_assert_int_eq(parse(rollouts[i], &m, &rep), 0);
        m.version = (uint64_t)i + 1;
        m.created = now;
        m.expires = now + 600;
        ck_assert_int_eq(hkn_manifest_sign(&key, &m, &texts[i], &lens[i], &sigs[i], &rep), 0);
        hkn_manifest_free(&m);
    }
    for (int i = 0; i < 4; i++) {
        hkn_manifest m;
        hk_report_clear(&rep);
        ck_assert_msg(hkn_verify_manifest(&t, st, texts[i], lens[i], sigs[i], strlen(sigs[i]), now,
                                          &m, &rep) == 0,
                      "manifest %d: %s", i + 1, rep.message);
        ck_assert_uint_eq(m.release, i == 0 || i == 3 ? 1 : 2);
        ck_assert_int_eq(hkn_state_accept(st, "add", m.version, &rep), 0);
        hkn_manifest_free(&m);
    }
    /* The step before the abort, replayed: refused. */
    hkn_manifest m;
    hk_report_clear(&rep);
    ck_assert_int_eq(
        hkn_verify_manifest(&t, st, texts[2], lens[2], sigs[2], strlen(sigs[2]), now, &m, &rep),
        HK_ERR_REPLAY);
    for (int i = 0; i < 4; i++) {
        free(texts[i]);
        free(sigs[i]);
    }
    hkn_state_close(st);
    hk_report_clear(&rep);
}
END_TEST

/* ---- buckets and decisions --------------------------------------------- */

/* The bucket as documented, computed here independently. */
static uint32_t bucket_of(const char *id, const char *module) {
    unsigned char buf[256], h[crypto_hash_sha256_BYTES];
    size_t a = strlen(id), b = strlen(module);
    memcpy(buf, id, a + 1);
    memcpy(buf + a + 1, module, b);
    crypto_hash_sha256(h, buf, a + 1 + b);
    return (((uint32_t)h[0] << 24) | ((uint32_t)h[1] << 16) | ((uint32_t)h[2] << 8) | h[3]) %
           10000u;
}

/* One step of p percent. */
static void one_step(hkn_rollout *r, hkn_rollout_step *s, unsigned p) {
    memset(r, 0, sizeof *r);
    memset(s, 0, sizeof *s);
    s->percent = p;
    r->present = 1;
    r->release = 2;
    r->steps = s;
    r->nsteps = 1;
}

/* 10,000 host ids: each bucket is the documented hash, the same when asked
 * again, spread evenly; raising the share only adds hosts; and the steps
 * 1, 10, 50, 100 at step i cover exactly the share of step i. */
START_TEST(buckets_are_stable_and_grow_monotonically) {
    enum { N = 10000 };
    static uint32_t b[N];
    static unsigned char in[N];
    char id[32];
    unsigned hist[10] = {0};
    int same_in_other_module = 0;
    for (int i = 0; i < N; i++) {
        snprintf(id, sizeof id, "host-%05d", i);
        b[i] = hkn_fleet_bucket(id, "add");
        ck_assert_uint_eq(b[i], bucket_of(id, "add"));
        ck_assert_uint_eq(b[i], hkn_fleet_bucket(id, "add"));
        ck_assert_uint_lt(b[i], 10000);
        hist[b[i] / 1000]++;
        same_in_other_module += hkn_fleet_bucket(id, "mul") == b[i];
    }
    for (int k = 0; k < 10; k++) /* 1,000 expected each: a fixed set, no chance here */
        ck_assert_msg(hist[k] > 850 && hist[k] < 1150, "decile %d holds %u", k, hist[k]);
    ck_assert_int_lt(same_in_other_module, 10); /* modules are independent */
    hkn_rollout r;
    hkn_rollout_step s;
    unsigned prev = 0;
    for (unsigned p = 0; p <= 100; p++) {
        one_step(&r, &s, p);
        unsigned n = 0;
        for (int i = 0; i < N; i++) {
            snprintf(id, sizeof id, "host-%05d", i);
            int c = hkn_rollout_covers(&r, b[i], id, NULL, 0);
            ck_assert_int_eq(c, b[i] < p * 100);
            ck_assert_msg(!in[i] || c, "host-%05d left at %u%%", i, p); /* only adds */
            in[i] = (unsigned char)c;
            n += (unsigned)c;
        }
        ck_assert_uint_ge(n, prev);
        prev = n;
    }
    ck_assert_uint_eq(prev, N);
    hkn_rollout_step steps[4] = {
        {.percent = 1}, {.percent = 10}, {.percent = 50}, {.percent = 100}};
    hkn_rollout ro = {.present = 1, .release = 2, .steps = steps, .nsteps = 4};
    for (unsigned st = 0; st < 4; st++) {
        ro.step = st;
        for (int i = 0; i < N; i += 7) {
            snprintf(id, sizeof id, "host-%05d", i);
            ck_assert_int_eq(hkn_rollout_covers(&ro, b[i], id, NULL, 0),
                             b[i] < steps[st].percent * 100);
        }
    }
}
END_TEST

/* Named hosts and labels are in from their step on, cumulatively. */
START_TEST(names_and_labels_are_cumulative) {
    char *h0[] = {"host-a"}, *l2[] = {"canary"};
    hkn_rollout_step steps[3] = {{.percent = 0, .hosts = h0, .nhosts = 1},
                                 {.percent = 1},
                                 {.percent = 1, .labels = l2, .nlabels = 1}};
    hkn_rollout r = {.present = 1, .release = 2, .steps = steps, .nsteps = 3};
    ck_assert_int_eq(hkn_rollout_validate(&r, NULL), 0);
    const char *canary[] = {"gpu=h100", "canary"}, *other[] = {"gpu=h100"};
    for (unsigned st = 0; st < 3; st++) {
        r.step = st;
        ck_assert(hkn_rollout_covers(&r, 9999, "host-a", NULL, 0));
        ck_assert_int_eq(hkn_rollout_covers(&r, 9999, "host-b", canary, 2), st == 2);
        ck_assert(!hkn_rollout_covers(&r, 9999, "host-b", other, 1));
        ck_assert_int_eq(hkn_rollout_covers(&r, 50, "host-c", NULL, 0), st >= 1);
    }
}
END_TEST

/* What the recording engine runs, for the gate's question. */
static struct {
    pthread_mutex_t lock;
    int calls;             /* applies */
    uint64_t running;      /* what an apply last committed (0: none) */
    uint64_t last_release; /* the release of the last apply */
    char bytes[256];       /* its artifact */
    int refuse;            /* the next applies fail with this */
    char refusal[16];      /* and this canary_refusal */
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int rec_apply(void *ud, const char *module, uint64_t release, hk_format fmt,
                     const void *bytes, size_t size, const hk_header *headers, int nheaders,
                     const char *origin, hk_report *rep) {
    pthread_mutex_lock(&rec.lock);
    rec.calls++;
    rec.last_release = release;
    snprintf(rec.bytes, sizeof rec.bytes, "%.*s", (int)size, (const char *)bytes);
    int err = rec.refuse;
    if (!err)
        rec.running = release;
    pthread_mutex_unlock(&rec.lock);
    if (err) {
        hku_fail(rep, err, "the canary refused it");
        snprintf(rep->canary_refusal, sizeof rep->canary_refusal, "%s", rec.refusal);
    }
    return err;
}

static int rec_release(void *ud, const char *module, int back, uint64_t *out) {
    pthread_mutex_lock(&rec.lock);
    *out = rec.running;
    pthread_mutex_unlock(&rec.lock);
    return *out ? 0 : HK_ERR_NOT_FOUND;
}

static const hkn_engine engine = {.apply = rec_apply, .release = rec_release};

/* A host id whose bucket for `module` lies in [lo, hi). */
static void id_in(const char *module, uint32_t lo, uint32_t hi, char *out, size_t cap) {
    for (int i = 0;; i++) {
        snprintf(out, cap, "h-%d", i);
        uint32_t b = hkn_fleet_bucket(out, module);
        if (b >= lo && b < hi)
            return;
    }
}

START_TEST(gate_decides) {
    char id[32];
    hkn_fleet *f;
    hk_report rep = HK_REPORT_INIT;
    id_in("add", 1000, 5000, id, sizeof id); /* outside 1% and 10%, inside 50% */
    ck_assert_int_eq(hkn_fleet_create(id, "rack-7,canary", &f, &rep), 0);
    ck_assert_str_eq(hkn_fleet_host_id(f), id);
    ck_assert_str_eq(hkn_fleet_labels(f), "rack-7,canary");
    static const struct {
        const char *rollout;
        uint64_t running;
        hkn_gate_action action;
        int in_step;
        uint64_t target;
    } cases[] = {
        {NULL, 5, HKN_GATE_APPLY, 1, 7}, /* no rollout: as ever */
        {NULL, 7, HKN_GATE_APPLY, 1, 7},
        {"{\"release\": 2, \"previous\": 1, \"step\": 1, \"steps\": [{\"percent\": 1}, "
         "{\"percent\": 10}, {\"percent\": 50}]}",
         1, HKN_GATE_OUTSIDE, 0, 2},
        {"{\"release\": 2, \"previous\": 1, \"step\": 2, \"steps\": [{\"percent\": 1}, "
         "{\"percent\": 10}, {\"percent\": 50}]}",
         1, HKN_GATE_APPLY, 1, 2},
        {"{\"release\": 2, \"previous\": 1, \"step\": 2, \"steps\": [{\"percent\": 1}, "
         "{\"percent\": 10}, {\"percent\": 50}]}",
         2, HKN_GATE_RUNS, 1, 2},
        {"{\"release\": 2, \"previous\": 1, \"step\": 0, \"steps\": [{\"percent\": 1, \"labels\": "
         "[\"canary\"]}]}",
         1, HKN_GATE_APPLY, 1, 2},
        {"{\"release\": 2, \"previous\": 1, \"step\": 0, \"steps\": [{\"percent\": 0, \"hosts\": "
         "[\"other\"]}]}",
         0, HKN_GATE_OUTSIDE, 0, 2},
        /* Aborted: every host, to the previous release. */
        {"{\"release\": 2, \"previous\": 1, \"step\": 0, \"steps\": [{\"percent\": 1}], "
         "\"aborted\": true}",
         2, HKN_GATE_APPLY, 1, 1},
        {"{\"release\": 2, \"previous\": 1, \"step\": 0, \"steps\": [{\"percent\": 1}], "
         "\"aborted\": true}",
         1, HKN_GATE_RUNS, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hkn_manifest m;
        hkn_gate g;
        ck_assert_int_eq(parse(cases[i].rollout, &m, &rep), 0);
        rec.running = cases[i].running;
        hkn_fleet_gate(f, &engine, &m, &g);
        ck_assert_msg(g.action == cases[i].action && g.in_step == cases[i].in_step &&
                          g.target == cases[i].target,
                      "case %zu: action %d in_step %d target %llu", i, g.action, g.in_step,
                      (unsigned long long)g.target);
        ck_assert_uint_eq(g.running, cases[i].running);
        ck_assert_uint_eq(g.bucket, hkn_fleet_bucket(id, "add"));
        hkn_manifest_free(&m);
    }
    hkn_fleet_destroy(f);
    hk_report_clear(&rep);
}
END_TEST

/* The gate of a manifest that carries the stable release (release 3 of 2):
 * outside the step a host on neither 2 nor 3 takes 2 (HKN_GATE_STABLE),
 * one on 2 or on 3 stays; in the step as ever; and without the stable
 * release in the manifest (an older publisher's) outside stays outside. */
START_TEST(gate_outside_takes_the_stable_release) {
    char id[32];
    hkn_fleet *f;
    hk_report rep = HK_REPORT_INIT;
    id_in("add", 1000, 5000, id, sizeof id); /* outside 1% and 10%, inside 50% */
    ck_assert_int_eq(hkn_fleet_create(id, NULL, &f, &rep), 0);
#define R3_AT(step)                                                                                \
    "{\"release\": 3, \"previous\": 2, \"step\": " step ", \"steps\": [{\"percent\": 1}, "         \
    "{\"percent\": 10}, {\"percent\": 50}]}"
    static const struct {
        const char *rollout, *stable;
        uint64_t running;
        hkn_gate_action action;
        int in_step;
    } cases[] = {
        {R3_AT("1"), STABLE, 0, HKN_GATE_STABLE, 0},  /* restarted on nothing, or new */
        {R3_AT("1"), STABLE, 1, HKN_GATE_STABLE, 0},  /* an older release */
        {R3_AT("1"), STABLE, 9, HKN_GATE_STABLE, 0},  /* another one */
        {R3_AT("1"), STABLE, 2, HKN_GATE_OUTSIDE, 0}, /* the stable release: nothing */
        {R3_AT("1"), STABLE, 3, HKN_GATE_OUTSIDE, 0}, /* the release itself: kept */
        {R3_AT("0"), STABLE, 0, HKN_GATE_STABLE, 0},
        {R3_AT("2"), STABLE, 0, HKN_GATE_APPLY, 1}, /* in the step: the release */
        {R3_AT("2"), STABLE, 2, HKN_GATE_APPLY, 1},
        {R3_AT("2"), STABLE, 3, HKN_GATE_RUNS, 1},
        {R3_AT("1"), NULL, 0, HKN_GATE_OUTSIDE, 0}, /* no stable release carried */
        {R3_AT("1"), NULL, 1, HKN_GATE_OUTSIDE, 0},
    };
#undef R3_AT
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hkn_manifest m;
        hkn_gate g;
        ck_assert_msg(parse_stable(cases[i].rollout, cases[i].stable, &m, &rep) == 0, "%s",
                      rep.message);
        rec.running = cases[i].running;
        hkn_fleet_gate(f, &engine, &m, &g);
        ck_assert_msg(g.action == cases[i].action && g.in_step == cases[i].in_step,
                      "case %zu: action %d in_step %d", i, g.action, g.in_step);
        ck_assert_uint_eq(g.target, 3);
        ck_assert_uint_eq(g.running, cases[i].running);
        hkn_manifest_free(&m);
    }
    rec.running = 0;
    hkn_fleet_destroy(f);
    hk_report_clear(&rep);
}
END_TEST

/* The host id: the option, else HOTKERN_HOST_ID, else /etc/machine-id,
 * else the host name; labels from the option or HOTKERN_HOST_LABELS. */
START_TEST(host_identity) {
    hkn_fleet *f;
    hk_report rep = HK_REPORT_INIT;
    setenv("HOTKERN_HOST_ID", "env-host", 1);
    setenv("HOTKERN_HOST_LABELS", "a,,b,a,", 1);
    ck_assert_int_eq(hkn_fleet_create("opt-host", NULL, &f, &rep), 0);
    ck_assert_str_eq(hkn_fleet_host_id(f), "opt-host");
    ck_assert_str_eq(hkn_fleet_labels(f), "a,b"); /* empty pieces and repeats dropped */
    hkn_fleet_destroy(f);
    ck_assert_int_eq(hkn_fleet_create(NULL, "", &f, &rep), 0);
    ck_assert_str_eq(hkn_fleet_host_id(f), "env-host");
    ck_assert_str_eq(hkn_fleet_labels(f), "");
    hkn_fleet_destroy(f);
    unsetenv("HOTKERN_HOST_ID");
    unsetenv("HOTKERN_HOST_LABELS");
    char want[256] = "";
    FILE *mf = fopen("/etc/machine-id", "r");
    if (mf && fgets(want, sizeof want, mf))
        want[strcspn(want, "\n")] = '\0';
    if (mf)
        fclose(mf);
    if (!hkn_valid_host_id(want))
        ck_assert_int_eq(gethostname(want, sizeof want), 0);
    ck_assert_int_eq(hkn_fleet_create(NULL, NULL, &f, &rep), 0);
    ck_assert_str_eq(hkn_fleet_host_id(f), want);
    hkn_fleet_destroy(f);
    ck_assert_int_eq(hkn_fleet_create("has space", NULL, &f, &rep), HK_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(rep.message, "hk_pull_options.host_id 'has space'"));
    setenv("HOTKERN_HOST_ID", "bad/id", 1);
    ck_assert_int_eq(hkn_fleet_create(NULL, NULL, &f, &rep), HK_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(rep.message, "HOTKERN_HOST_ID 'bad/id'"));
    unsetenv("HOTKERN_HOST_ID");
    ck_assert_int_eq(hkn_fleet_create("h", "ok,not ok", &f, &rep), HK_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(rep.message, "'not ok' is not a label"));
    ck_assert_int_eq(hkn_fleet_create("h", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", &f, &rep),
                     HK_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(rep.message, "more than 16 labels"));
    hk_report_clear(&rep);
}
END_TEST

START_TEST(refusal_reasons) {
    static const struct {
        int err;
        const char *canary, *reason;
    } map[] = {
        {HK_ERR_CANARY, "fault", "fault"},
        {HK_ERR_CANARY, "hang", "hang"},
        {HK_ERR_CANARY, "mismatch", "mismatch"},
        {HK_ERR_CANARY, "slower", "slower"},
        {HK_ERR_CANARY, "memcheck", "memcheck"},
        {HK_ERR_COMPILE, "", "build"},
        {HK_ERR_FORMAT, "", "build"},
        {HK_ERR_ARCH, "", "build"},
        {HK_ERR_LAYOUT, "", "layout"},
        {HK_ERR_MISSING_KERNEL, "", "layout"},
        {HK_ERR_ATTRIBUTE, "", "layout"},
        {HK_ERR_SIGNATURE, "", "signature"},
        {HK_ERR_EXPIRED, "", "expiry"},
        {HK_ERR_HASH, "", "hash"},
        {HK_ERR_QUARANTINED, "", "quarantined"},
        {HK_ERR_REJECTED, "", "other"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        ck_assert_str_eq(hkn_reason_name(hkn_refusal_reason(map[i].err, map[i].canary)),
                         map[i].reason);
    /* The host's own state is no refusal of the release. */
    static const int host[] = {HK_ERR_BUSY,    HK_ERR_NOMEM,
                               HK_ERR_TIMEOUT, HK_ERR_CANARY_UNAVAILABLE,
                               HK_ERR_NETWORK, HK_ERR_CUDA};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        ck_assert_int_eq(hkn_refusal_reason(host[i], NULL), -1);
}
END_TEST

/* ---- a puller through a rollout the CLI publishes ----------------------- */

static char *tmp;
static char www[PATH_MAX], origin[PATH_MAX + 8], url[256], state[PATH_MAX], key_path[PATH_MAX + 16];
static char pub_path[PATH_MAX + 16];
static hkn_seckey key;
static pid_t nginx;

static void origin_setup(void) {
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    snprintf(www, sizeof www, "%s/www", tmp);
    snprintf(origin, sizeof origin, "%s/rel", www);
    snprintf(state, sizeof state, "%s/state", tmp);
    snprintf(key_path, sizeof key_path, "%s/hotkern.key", tmp);
    snprintf(pub_path, sizeof pub_path, "%s/hotkern.pub", tmp);
    ck_assert_int_eq(mkdir(www, 0755), 0);
    ck_assert_int_eq(hkn_keygen(&key), 0);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_seckey_save(key_path, &key, &rep), 0);
    ck_assert_int_eq(hkn_pubkey_save(pub_path, &key.pub, &rep), 0);
    int port = hkt_nginx_start(www, tmp, NULL, &nginx);
    ck_assert_msg(port > 0, "nginx did not start");
    snprintf(url, sizeof url, "http://127.0.0.1:%d/rel/manifest.json", port);
    memset(&rec, 0, sizeof rec);
    pthread_mutex_init(&rec.lock, NULL);
}

static void origin_teardown(void) {
    hkt_nginx_stop(nginx);
    hkt_rmtree(tmp);
    free(tmp);
}

/* Runs the built CLI with args in the suite's directory (hkt_cli_out), its
 * output into out; the exit status. */
static int cli(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int cli(char *out, size_t cap, const char *fmt, ...) {
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return hkt_cli_out(tmp, out, cap, "%s", args);
}

/* Writes kernel file NAME holding PTX of tag `tag`. */
static void kernel_file(const char *name, int tag) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    ck_assert_int_eq(hkt_write_file(path, fake_ptx(tag, 0, 0, 0)), 0);
}

static hkn_puller *puller(const char *host_id, const char *labels, const char *metrics_address) {
    hk_pull_options o;
    hkn_pull_resolved r = {0};
    hk_pull_options_init(&o);
    o.url = url;
    o.interval_ms = 100;
    o.host_id = host_id;
    o.host_labels = labels;
    o.metrics_address = metrics_address;
    r.state_dir = state;
    r.trust.keys[0] = key.pub;
    r.trust.nkeys = 1;
    hkn_puller *p;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hkn_pull_create(&o, &r, &engine, &p, &rep) == 0, "%s", rep.message);
    return p;
}

/* The puller's metrics text (the caller frees it). */
static char *metrics_of(hkn_puller *p) {
    hk_metrics_writer *w = hkl_mw_new();
    char *text;
    hkn_pull_metrics(p, w);
    ck_assert_int_eq(hkl_mw_take(w, &text, NULL), 0);
    return text;
}

/* The value of the first sample of `name` whose labels contain `has` (""
 * for any); -1 when there is none. */
static long long sample(const char *text, const char *name, const char *has) {
    size_t n = strlen(name);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *end = strchr(l, '\n');
        if (strncmp(l, name, n) || (l[n] != '{' && l[n] != ' '))
            continue;
        const char *sp = strchr(l + n, ' ');
        char labels[1024];
        snprintf(labels, sizeof labels, "%.*s", (int)(sp - l), l);
        if (sp && (!end || sp < end) && strstr(labels, has))
            return atoll(sp + 1);
    }
    return -1;
}

static int poll_ok(hkn_puller *p) {
    hk_report rep = HK_REPORT_INIT;
    int err = hkn_pull_poll(p, &rep);
    ck_assert_msg(err == 0, "poll: %s: %s", hk_err_name(err), rep.message);
    hk_report_clear(&rep);
    return err;
}

/* One host, bucket in [1000, 5000) (outside 1% and 10%, inside 50%),
 * through release 2's steps as `hotkern rollout` publishes them: it keeps
 * release 1 until 50%, takes 2 once, keeps it at 100%, and goes back to 1
 * at the abort; its metrics say so at each step; restarted on nothing, it
 * catches up with the manifest its state records. */
START_TEST(host_through_the_steps) {
    char id[32], out[8192];
    id_in("add", 1000, 5000, id, sizeof id);
    kernel_file("add.ptx", 101);
    ck_assert_int_eq(cli(out, sizeof out,
                         "sign --key '%s' --module add --release 1 --out '%s' "
                         "add.ptx",
                         key_path, origin),
                     0);
    hkn_puller *p = puller(id, NULL, NULL);
    poll_ok(p);
    ck_assert_int_eq(rec.calls, 1);
    ck_assert_uint_eq(rec.running, 1);
    kernel_file("add.ptx", 102);
    ck_assert_msg(cli(out, sizeof out,
                      "rollout start --dir '%s' --key '%s' --module add "
                      "--steps 1,10,50,100 add.ptx",
                      origin, key_path) == 0,
                  "%s", out);
    static const int expect_calls[] = {1, 1, 2, 2}, expect_running[] = {1, 1, 2, 2};
    for (int step = 0; step < 4; step++) {
        if (step > 0)
            ck_assert_msg(cli(out, sizeof out, "rollout advance --dir '%s' --key '%s'", origin,
                              key_path) == 0,
                          "%s", out);
        poll_ok(p);
        ck_assert_int_eq(rec.calls, expect_calls[step]);
        ck_assert_uint_eq(rec.running, (uint64_t)expect_running[step]);
        char *m = metrics_of(p);
        ck_assert_int_eq(sample(m, "hotkern_rollout_step", "module=\"add\""), step);
        ck_assert_int_eq(sample(m, "hotkern_rollout_steps", "module=\"add\""), 4);
        ck_assert_int_eq(sample(m, "hotkern_rollout_in_step", "module=\"add\""), step >= 2);
        ck_assert_int_eq(sample(m, "hotkern_rollout_release", "module=\"add\""),
                         expect_running[step]);
        ck_assert_int_eq(sample(m, "hotkern_rollout_target_release", "module=\"add\""), 2);
        ck_assert_int_eq(sample(m, "hotkern_rollout_bucket", "module=\"add\""),
                         hkn_fleet_bucket(id, "add"));
        long long since = sample(m, "hotkern_rollout_release_timestamp_seconds", "");
        ck_assert(since > 0 && since <= (long long)time(NULL));
        char info[128];
        snprintf(info, sizeof info, "host_id=\"%s\",labels=\"\"", id);
        ck_assert_int_eq(sample(m, "hotkern_host_info", info), 1);
        ck_assert_int_eq(sample(m, "hotkern_rollout_refusals_total", "reason=\"fault\""), 0);
        ck_assert_int_eq(sample(m, "hotkern_rollout_last_refused_release", ""), -1);
        free(m);
    }
    ck_assert_uint_eq(rec.last_release, 2); /* the rollout's release, not the manifest's v3 */
    ck_assert_ptr_nonnull(strstr(rec.bytes, "// tag: 102"));
    ck_assert_msg(cli(out, sizeof out, "rollout abort --dir '%s' --key '%s'", origin, key_path) ==
                      0,
                  "%s", out);
    poll_ok(p);
    ck_assert_int_eq(rec.calls, 3);
    ck_assert_uint_eq(rec.running, 1);
    ck_assert_ptr_nonnull(strstr(rec.bytes, "// tag: 101")); /* release 1's artifact */
    char *m = metrics_of(p);
    ck_assert_int_eq(sample(m, "hotkern_rollout_aborted", "module=\"add\""), 1);
    ck_assert_int_eq(sample(m, "hotkern_rollout_target_release", "module=\"add\""), 1);
    free(m);
    poll_ok(p); /* unchanged: a 304, nothing applied */
    ck_assert_int_eq(rec.calls, 3);
    hkn_pull_destroy(p);

    /* A restart on nothing, the state at the abort's manifest: the host
     * takes release 1 again, without a new record; restarted again while
     * it runs it, nothing. */
    rec.running = 0;
    p = puller(id, NULL, NULL);
    poll_ok(p);
    ck_assert_int_eq(rec.calls, 4);
    ck_assert_uint_eq(rec.running, 1);
    hkn_pull_destroy(p);
    p = puller(id, NULL, NULL);
    poll_ok(p);
    ck_assert_int_eq(rec.calls, 4);
    hkn_pull_destroy(p);
}
END_TEST

/* A host that refuses the release (its canary faults) says so once, with
 * the reason and the release; the next step's manifest (the same release
 * signed anew) is not built again; a manifest whose signature fails is one
 * refusal however many polls see it. */
START_TEST(refusals_in_metrics) {
    char out[8192];
    kernel_file("add.ptx", 101);
    ck_assert_int_eq(cli(out, sizeof out,
                         "sign --key '%s' --module add --release 1 --out '%s' "
                         "add.ptx",
                         key_path, origin),
                     0);
    hkn_puller *p = puller("canary-host", "canary", NULL);
    poll_ok(p);
    kernel_file("add.ptx", 102);
    char steps[PATH_MAX + 32];
    snprintf(steps, sizeof steps, "%s/steps.json", tmp);
    ck_assert_int_eq(
        hkt_write_file(steps, "[{\"percent\": 0, \"labels\": [\"canary\"]}, {\"percent\": 100}]"),
        0);
    ck_assert_msg(cli(out, sizeof out,
                      "rollout start --dir '%s' --key '%s' --module add "
                      "--steps-file '%s' add.ptx",
                      origin, key_path, steps) == 0,
                  "%s", out);
    rec.refuse = HK_ERR_CANARY;
    snprintf(rec.refusal, sizeof rec.refusal, "fault");
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_pull_poll(p, &rep), HK_ERR_CANARY);
    ck_assert_int_eq(rec.calls, 2);
    char *m = metrics_of(p);
    ck_assert_int_eq(sample(m, "hotkern_rollout_refusals_total", "reason=\"fault\""), 1);
    ck_assert_int_eq(sample(m, "hotkern_rollout_refusals_total", "reason=\"build\""), 0);
    ck_assert_int_eq(sample(m, "hotkern_rollout_last_refused_release", "reason=\"fault\""), 2);
    ck_assert_int_eq(sample(m, "hotkern_rollout_release", "module=\"add\""), 1);
    free(m);
    ck_assert_msg(cli(out, sizeof out, "rollout advance --dir '%s' --key '%s'", origin, key_path) ==
                      0,
                  "%s", out);
    hk_report_clear(&rep);
    ck_assert_int_eq(hkn_pull_poll(p, &rep), HK_ERR_CANARY); /* refused before */
    ck_assert_ptr_nonnull(strstr(rep.message, "refused before"));
    ck_assert_int_eq(rec.calls, 2);
    m = metrics_of(p);
    ck_assert_int_eq(sample(m, "hotkern_rollout_refusals_total", "reason=\"fault\""), 1);
    free(m);
    /* The origin's manifest changed after signing: refused, counted once. */
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/manifest.json", origin);
    char *text;
    size_t len;
    ck_assert_int_eq(hku_read_file(path, 1 << 20, &text, &len, &rep), 0);
    char *at = strstr(text, "\"percent\":\t100");
    ck_assert_ptr_nonnull(at);
    memcpy(at, "\"percent\":\t 99", 14);
    ck_assert_int_eq(hku_write_atomic(path, text, len, 0644, &rep), 0);
    free(text);
    for (int i = 0; i < 3; i++) {
        hk_report_clear(&rep);
        ck_assert_int_eq(hkn_pull_poll(p, &rep), HK_ERR_SIGNATURE);
    }
    m = metrics_of(p);
    ck_assert_int_eq(sample(m, "hotkern_rollout_refusals_total", "reason=\"signature\""), 1);
    ck_assert_int_eq(sample(m, "hotkern_rollout_last_refused_release", "reason=\"signature\""), 0);
    free(m);
    hkn_pull_destroy(p);
    hk_report_clear(&rep);
}
END_TEST

/* ---- the stable release, for hosts outside the step -------------------- */

static char stable_lines[4096]; /* rec.lock: the puller's lines that name it */

static void rec_log(void *ud, hk_log_level level, const char *subsystem, const char *text) {
    pthread_mutex_lock(&rec.lock);
    size_t n = strlen(stable_lines);
    if (strstr(text, "stable"))
        snprintf(stable_lines + n, sizeof stable_lines - n, "%s\n", text);
    pthread_mutex_unlock(&rec.lock);
}

/* puller() with the recording engine's log. */
static hkn_puller *logged_puller(const char *host_id) {
    static const hkn_engine logged = {.apply = rec_apply, .release = rec_release, .log = rec_log};
    hk_pull_options o;
    hkn_pull_resolved r = {0};
    hk_pull_options_init(&o);
    o.url = url;
    o.interval_ms = 100;
    o.host_id = host_id;
    r.state_dir = state;
    r.trust.keys[0] = key.pub;
    r.trust.nkeys = 1;
    hkn_puller *p;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hkn_pull_create(&o, &r, &logged, &p, &rep) == 0, "%s", rep.message);
    return p;
}

/* `rollout status --json`'s member `name`. */
static long long status_of(const char *name) {
    char out[8192];
    ck_assert_int_eq(cli(out, sizeof out, "rollout status --json --dir '%s'", origin), 0);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(cJSON_IsNumber(cJSON_GetObjectItem(j, name)), "%s", out);
    long long v = (long long)cJSON_GetObjectItem(j, name)->valuedouble;
    cJSON_Delete(j);
    return v;
}

/* A host outside release 2's step that runs nothing (new, or restarted
 * without its state) takes release 1, the stable one the manifest carries,
 * and says so; restarted on nothing with its anti-rollback state it
 * catches up with it, on it it fetches nothing. Refused (its canary
 * faults), the stable release is refused once, and the next manifest's
 * (the same release) is not applied again. In the step it takes release 2
 * as ever. A manifest that carries no stable release (an older hotkern's)
 * gets it back at the next step from previous-manifest.json; an abort
 * carries none (its artifacts are release 1's). */
START_TEST(outside_host_on_nothing_takes_the_stable_release) {
    char id[32], out[8192];
    id_in("add", 1000, 5000, id, sizeof id);
    kernel_file("add.ptx", 101);
    ck_assert_int_eq(cli(out, sizeof out,
                         "sign --key '%s' --module add --release 1 --out '%s' add.ptx", key_path,
                         origin),
                     0);
    kernel_file("add.ptx", 102);
    ck_assert_msg(cli(out, sizeof out,
                      "rollout start --dir '%s' --key '%s' --module add --steps 1,10,50,100 "
                      "add.ptx",
                      origin, key_path) == 0,
                  "%s", out);
    ck_assert_int_eq(status_of("previous_artifacts"), 1);

    hkn_puller *p = logged_puller(id);
    poll_ok(p);
    ck_assert_int_eq(rec.calls, 1);
    ck_assert_uint_eq(rec.running, 1);
    ck_assert_uint_eq(rec.last_release, 1);
    ck_assert_ptr_nonnull(strstr(rec.bytes, "// tag: 101")); /* release 1's artifact */
    ck_assert_msg(strstr(stable_lines, "outside step 1 of 4: applying the stable release 1 (this "
                                       "host runs nothing)"),
                  "%s", stable_lines);
    char *m = metrics_of(p);
    ck_assert_int_eq(sample(m, "hotkern_rollout_release", "module=\"add\""), 1);
    ck_assert_int_eq(sample(m, "hotkern_rollout_in_step", "module=\"add\""), 0);
    ck_assert_int_eq(sample(m, "hotkern_rollout_target_release", "module=\"add\""), 2);
    free(m);
    poll_ok(p); /* a 304 */
    ck_assert_int_eq(rec.calls, 1);
    hkn_pull_destroy(p);
    rec.running = 0; /* restarted on nothing, its state kept */
    p = logged_puller(id);
    poll_ok(p);
    ck_assert_int_eq(rec.calls, 2);
    ck_assert_uint_eq(rec.running, 1);
    hkn_pull_destroy(p);
    p = logged_puller(id); /* restarted on release 1 */
    poll_ok(p);
    ck_assert_int_eq(rec.calls, 2);
    hkn_pull_destroy(p);

    /* The stable release refused, on a host without state. */
    hkt_rmtree(state);
    rec.running = 0;
    rec.refuse = HK_ERR_CANARY;
    snprintf(rec.refusal, sizeof rec.refusal, "fault");
    p = logged_puller(id);
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_pull_poll(p, &rep), HK_ERR_CANARY);
    ck_assert_int_eq(rec.calls, 3);
    m = metrics_of(p);
    ck_assert_int_eq(sample(m, "hotkern_rollout_refusals_total", "reason=\"fault\""), 1);
    ck_assert_int_eq(sample(m, "hotkern_rollout_last_refused_release", "reason=\"fault\""), 1);
    ck_assert_int_eq(sample(m, "hotkern_rollout_release", "module=\"add\""), 0);
    free(m);
    ck_assert_int_eq(cli(out, sizeof out, "rollout pause --dir '%s' --key '%s'", origin, key_path),
                     0);
    hk_report_clear(&rep);
    ck_assert_int_eq(hkn_pull_poll(p, &rep), HK_ERR_CANARY);
    ck_assert_msg(strstr(rep.message, "refused before"), "%s", rep.message);
    ck_assert_int_eq(rec.calls, 3);
    m = metrics_of(p);
    ck_assert_int_eq(sample(m, "hotkern_rollout_refusals_total", "reason=\"fault\""), 1);
    free(m);
    /* In the step (50%): release 2. */
    rec.refuse = 0;
    ck_assert_int_eq(cli(out, sizeof out, "rollout resume --dir '%s' --key '%s'", origin, key_path),
                     0);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(
            cli(out, sizeof out, "rollout advance --dir '%s' --key '%s'", origin, key_path) == 0,
            "%s", out);
    poll_ok(p);
    ck_assert_int_eq(rec.calls, 4);
    ck_assert_uint_eq(rec.running, 2);
    ck_assert_ptr_nonnull(strstr(rec.bytes, "// tag: 102"));
    hkn_pull_destroy(p);
    ck_assert_int_eq(status_of("previous_artifacts"), 1);

    /* The current manifest signed anew without it, as an older hotkern's. */
    char path[PATH_MAX + 32], *text, *sig;
    size_t len;
    hkn_manifest old;
    snprintf(path, sizeof path, "%s/manifest.json", origin);
    ck_assert_int_eq(hku_read_file(path, 1 << 20, &text, &len, &rep), 0);
    ck_assert_int_eq(hkn_manifest_parse(text, len, &old, &rep), 0);
    free(text);
    free(old.previous_artifacts);
    old.previous_artifacts = NULL;
    old.nprevious = 0;
    old.version++;
    ck_assert_int_eq(hkn_manifest_sign(&key, &old, &text, &len, &sig, &rep), 0);
    hkn_manifest_free(&old);
    ck_assert_ptr_null(strstr(text, "previous_artifacts"));
    char sig_path[PATH_MAX + 40];
    snprintf(sig_path, sizeof sig_path, "%s.sig", path);
    ck_assert_int_eq(hku_write_atomic(sig_path, sig, strlen(sig), 0644, &rep), 0);
    ck_assert_int_eq(hku_write_atomic(path, text, len, 0644, &rep), 0);
    free(text);
    free(sig);
    ck_assert_int_eq(status_of("previous_artifacts"), 0);
    ck_assert_msg(cli(out, sizeof out, "rollout advance --dir '%s' --key '%s'", origin, key_path) ==
                      0,
                  "%s", out);
    ck_assert_int_eq(status_of("previous_artifacts"), 1);
    ck_assert_msg(cli(out, sizeof out, "rollout abort --dir '%s' --key '%s'", origin, key_path) ==
                      0,
                  "%s", out);
    ck_assert_int_eq(status_of("previous_artifacts"), 0);
    hk_report_clear(&rep);
}
END_TEST

/* ---- the /metrics server, through the public API ------------------------ */

static long get(unsigned port, const char *method, const char *path, char **body) {
    char u[128];
    hkt_body r = {calloc(1, 1), 0};
    long status = 0;
    CURL *c = curl_easy_init();
    snprintf(u, sizeof u, "http://127.0.0.1:%u%s", port, path);
    curl_easy_setopt(c, CURLOPT_URL, u);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_NOBODY, (long)!strcmp(method, "HEAD"));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, hkt_body_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    ck_assert_int_eq(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    if (body)
        *body = r.data;
    else
        free(r.data);
    return status;
}

/* hk_pull_start with a metrics address serves the runtime's text on the
 * port hk_pull_metrics_port names: the engine's (hotkern_launch_errors_total
 * among them), the puller's and its rollout families; /healthz; nothing
 * else. Without an address, no server. */
START_TEST(puller_serves_metrics) {
    fake_init(1, 90);
    hk_options ho;
    hk_options_init(&ho);
    ho.ptx_mode = HK_PTX_DRIVER_JIT;
    ho.cache_dir = "";
    ho.no_warm_start = 1;
    hk_runtime *rt;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(hkl_runtime_create_with(&rt, &ho, fake_driver(), &rep) == 0, "%s", rep.message);
    char out[8192];
    kernel_file("add.ptx", 101);
    ck_assert_int_eq(cli(out, sizeof out,
                         "sign --key '%s' --module add --release 1 --out '%s' "
                         "add.ptx",
                         key_path, origin),
                     0);
    const char *keys[] = {pub_path};
    hk_pull_options po;
    hk_pull_options_init(&po);
    po.url = url;
    po.interval_ms = 100;
    po.trusted_keys = keys;
    po.ntrusted_keys = 1;
    po.state_dir = state;
    po.host_id = "metrics-host";
    po.host_labels = "gpu=h100";
    po.metrics_address = "127.0.0.1";
    hk_puller *p;
    ck_assert_msg(hk_pull_start(rt, &po, &p, &rep) == 0, "%s", rep.message);
    unsigned port = hk_pull_metrics_port(p);
    ck_assert_uint_gt(port, 0);
    char *body = NULL;
    long long release = -1;
    for (int i = 0; i < 200 && release != 1; i++) {
        free(body);
        ck_assert_int_eq(get(port, "GET", "/metrics", &body), 200);
        release = sample(body, "hotkern_rollout_release", "module=\"add\"");
        if (release != 1)
            usleep(50000);
    }
    ck_assert_int_eq(release, 1);
    ck_assert_int_eq(sample(body, "hotkern_launch_errors_total", ""), 0);
    ck_assert_int_ge(sample(body, "hotkern_pull_polls_total", ""), 1);
    char info[512];
    snprintf(info, sizeof info, "{url=\"%s\",host_id=\"metrics-host\",labels=\"gpu=h100\"}", url);
    ck_assert_msg(sample(body, "hotkern_host_info", info) == 1, "%s", body);
    ck_assert_int_eq(sample(body, "hotkern_rollout_in_step", "module=\"add\""), 1);
    free(body);
    ck_assert_int_eq(get(port, "HEAD", "/metrics", NULL), 200);
    ck_assert_int_eq(get(port, "GET", "/healthz", &body), 200);
    ck_assert_str_eq(body, "ok\n");
    free(body);
    ck_assert_int_eq(get(port, "GET", "/v1/release", NULL), 404);
    ck_assert_int_eq(get(port, "POST", "/metrics", NULL), 405);
    hk_pull_stop(p);
    ck_assert_uint_eq(hk_pull_metrics_port(NULL), 0);
    po.metrics_address = NULL;
    ck_assert_int_eq(hk_pull_start(rt, &po, &p, &rep), 0);
    ck_assert_uint_eq(hk_pull_metrics_port(p), 0);
    hk_pull_stop(p);
    po.metrics_address = "localhost"; /* numeric addresses only */
    ck_assert_int_eq(hk_pull_start(rt, &po, &p, &rep), HK_ERR_INVALID);
    po.metrics_address = NULL;
    po.host_id = "no spaces please";
    ck_assert_int_eq(hk_pull_start(rt, &po, &p, &rep), HK_ERR_INVALID);
    hk_runtime_destroy(rt);
    hk_report_clear(&rep);
}
END_TEST

/* Launches the driver refused are counted, host-wide, in hk_stats and the
 * metrics; a launch that went through is not. */
START_TEST(launch_errors_are_counted) {
    fake_init(1, 90);
    hk_options ho;
    hk_options_init(&ho);
    ho.ptx_mode = HK_PTX_DRIVER_JIT;
    ho.cache_dir = "";
    ho.no_warm_start = 1;
    hk_runtime *rt;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkl_runtime_create_with(&rt, &ho, fake_driver(), &rep), 0);
    const char *img = fake_ptx(1, 0, 0, 0);
    ck_assert_int_eq(hk_swap(rt, "m", img, strlen(img), NULL, &rep), 0);
    hk_kernel *k;
    ck_assert_int_eq(hk_kernel_get(rt, "m", "step", &k), 0);
    int out = 0, *dptr = &out, cu = 0;
    unsigned n = 1;
    void *args[] = {&dptr, &n};
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu), 0);
    fake_fail("cuLaunchKernel", 1, CUDA_ERROR_INVALID_VALUE);
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu),
                     HK_ERR_CUDA);
    ck_assert_int_eq(cu, CUDA_ERROR_INVALID_VALUE);
    ck_assert_int_eq(hk_launch(k, (hk_dim3){1, 1, 1}, (hk_dim3){1, 1, 1}, 0, NULL, args, &cu), 0);
    hk_stats st = HK_STATS_INIT;
    ck_assert_int_eq(hk_stats_get(rt, &st), 0);
    ck_assert_uint_eq(st.launch_errors, 1);
    char *text;
    ck_assert_int_eq(hk_metrics_text_alloc(rt, &text, NULL), 0);
    ck_assert_int_eq(sample(text, "hotkern_launch_errors_total", ""), 1);
    free(text);
    hk_runtime_destroy(rt);
    hk_report_clear(&rep);
}
END_TEST

/* ---- the CLI ----------------------------------------------------------- */

START_TEST(cli_usage_errors_exit_2) {
    char out[8192];
    kernel_file("add.ptx", 101);
    static const char *const bad[] = {
        "rollout",
        "rollout bogus --dir d",
        "rollout start --key k --module add --steps 1 add.ptx",
        "rollout advance --dir www/rel",
        "rollout start --dir www/rel --key hotkern.key --module add add.ptx",
        "rollout start --dir www/rel --key hotkern.key --module add --steps 1,x add.ptx",
        "rollout start --dir www/rel --key hotkern.key --module add --steps 10,5 add.ptx",
        "rollout start --dir www/rel --key hotkern.key --module add --steps 0 add.ptx",
        "rollout start --dir www/rel --key hotkern.key --module add --steps 1 --steps-file s "
        "add.ptx",
        "rollout start --dir www/rel --key hotkern.key --module add --steps 1",
        "rollout start --dir www/rel --key hotkern.key --steps 1 add.ptx",
        "rollout start --dir www/rel --key hotkern.key --module add --steps 1 --bake -1 add.ptx",
        "rollout advance --dir www/rel --key hotkern.key add.ptx",
        "rollout advance --dir www/rel --key hotkern.key --steps 1",
        "rollout status --dir www/rel --key hotkern.key",
        "rollout pause --dir www/rel --key hotkern.key --release 3",
        "rollout start --dir www/rel --key hotkern.key --module add --steps 1 --version 3 add.ptx",
        "rollout watch --dir www/rel --key hotkern.key",
        "rollout watch --dir www/rel --prometheus http://127.0.0.1:9",
        "rollout watch --dir www/rel --key hotkern.key --prometheus http://127.0.0.1:9 "
        "--interval 0",
        "rollout watch --dir www/rel --key hotkern.key --prometheus http://127.0.0.1:9 "
        "--min-reporting 1.5",
        "rollout watch --dir www/rel --key hotkern.key --prometheus http://127.0.0.1:9 --force",
        "rollout advance --dir www/rel --key hotkern.key --prometheus http://127.0.0.1:9",
        "rollout status --dir www/rel --gate up",
        "rollout status --dir www/rel --prometheus http://127.0.0.1:9 --interval 3",
        "rollout advance --dir www/rel --key hotkern.key --key hotkern.key --key hotkern.key "
        "--key hotkern.key --key hotkern.key --key hotkern.key --key hotkern.key --key "
        "hotkern.key --key hotkern.key",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = cli(out, sizeof out, "%s", bad[i]);
        ck_assert_msg(rc == 2, "'%s': exit %d: %s", bad[i], rc, out);
    }
    ck_assert_int_eq(cli(out, sizeof out,
                         "rollout start --json --dir www/rel --key hotkern.key "
                         "--module add --steps 5,1 add.ptx"),
                     2);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j && !cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")), "%s", out);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "exit")->valueint, 2);
    ck_assert_ptr_nonnull(
        strstr(cJSON_GetObjectItem(j, "message")->valuestring, "steps[1].percent 1 is below"));
    cJSON_Delete(j);
    ck_assert_int_eq(cli(out, sizeof out, "rollout --help"), 0);
    ck_assert_ptr_nonnull(strstr(out, "sample with a value above 0"));
    ck_assert_ptr_nonnull(strstr(out, "A push fleet (--endpoints FILE"));
    ck_assert_ptr_nonnull(strstr(out, "KEYS: --key SECRET [--key SECRET...]"));
    ck_assert_ptr_null(strstr(out, "push fleets,"));
}
END_TEST

static int64_t mtime_of(const char *path) {
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return (int64_t)st.st_mtime;
}

/* start, advance (baking, then --force), pause, resume, abort and status as
 * the manifests they write say; each manifest's mtime past the last one's;
 * what cannot be done is refused with exit 1 and writes nothing; a manifest
 * changed on the origin is not signed over. */
START_TEST(cli_lifecycle) {
    char out[8192], man[PATH_MAX + 32];
    snprintf(man, sizeof man, "%s/manifest.json", origin);
    kernel_file("a.ptx", 101);
    kernel_file("b.ptx", 102);
    ck_assert_int_eq(cli(out, sizeof out,
                         "sign --key hotkern.key --module add --release 1 "
                         "--out www/rel a.ptx"),
                     0);
    ck_assert_int_eq(cli(out, sizeof out, "rollout advance --dir www/rel --key hotkern.key"), 1);
    ck_assert_ptr_nonnull(strstr(out, "has no rollout"));
    ck_assert_msg(cli(out, sizeof out,
                      "rollout start --dir www/rel --key hotkern.key --module add "
                      "--release 5 --steps 1,50,100 --bake 3600 b.ptx") == 0,
                  "%s", out);
    int64_t t = mtime_of(man);
    /* One --key: one bare signature, the file hosts of 1.4 read. */
    char sig_path[PATH_MAX + 40], *sig;
    size_t sig_len;
    hk_report srep = HK_REPORT_INIT;
    snprintf(sig_path, sizeof sig_path, "%s.sig", man);
    ck_assert_int_eq(hku_read_file(sig_path, 4096, &sig, &sig_len, &srep), 0);
    ck_assert_msg(!strchr(sig, ' ') && strchr(sig, '\n') == sig + sig_len - 1, "%s", sig);
    free(sig);
    ck_assert_int_eq(
        cli(out, sizeof out, "rollout status --json --dir www/rel --pubkey hotkern.pub"), 0);
    cJSON *j = cJSON_Parse(out);
    ck_assert_msg(j != NULL, "%s", out);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "manifest_version")->valueint, 2);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "release")->valueint, 5);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "previous")->valueint, 1);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "step")->valueint, 0);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "steps")), 3);
    ck_assert_int_eq(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "steps"), 1), "percent")
            ->valueint,
        50);
    cJSON_Delete(j);
    ck_assert_int_eq(cli(out, sizeof out,
                         "rollout start --dir www/rel --key hotkern.key --module add "
                         "--steps 100 a.ptx"),
                     1); /* another release is before its last step */
    ck_assert_ptr_nonnull(strstr(out, "step 1 of 3"));
    ck_assert_int_eq(cli(out, sizeof out, "rollout advance --dir www/rel --key hotkern.key"), 1);
    ck_assert_ptr_nonnull(strstr(out, "bakes"));
    ck_assert_int_eq(mtime_of(man), t); /* nothing written */
    ck_assert_int_eq(
        cli(out, sizeof out, "rollout advance --dir www/rel --key hotkern.key --force"), 0);
    ck_assert_int_gt(mtime_of(man), t);
    t = mtime_of(man);
    ck_assert_int_eq(cli(out, sizeof out, "rollout pause --dir www/rel --key hotkern.key"), 0);
    ck_assert_int_gt(mtime_of(man), t);
    ck_assert_int_eq(cli(out, sizeof out, "rollout pause --dir www/rel --key hotkern.key"), 1);
    ck_assert_int_eq(
        cli(out, sizeof out, "rollout advance --dir www/rel --key hotkern.key --force"), 1);
    ck_assert_ptr_nonnull(strstr(out, "paused"));
    ck_assert_int_eq(cli(out, sizeof out, "rollout resume --dir www/rel --key hotkern.key"), 0);
    ck_assert_int_eq(cli(out, sizeof out, "rollout status --dir www/rel"), 0);
    ck_assert_msg(strstr(out, "manifest v5, release 5 (previous 1)") &&
                      strstr(out, "-> step 2:  50%"),
                  "%s", out);
    /* A manifest changed on the origin is not signed over. */
    char *text;
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hku_read_file(man, 1 << 20, &text, &len, &rep), 0);
    char *at = strstr(text, "\"step\":\t1");
    ck_assert_ptr_nonnull(at);
    at[8] = '2';
    ck_assert_int_eq(hku_write_atomic(man, text, len, 0644, &rep), 0);
    ck_assert_int_eq(cli(out, sizeof out, "rollout abort --dir www/rel --key hotkern.key"), 1);
    ck_assert_ptr_nonnull(strstr(out, "HK_ERR_SIGNATURE"));
    at[8] = '1';
    ck_assert_int_eq(hku_write_atomic(man, text, len, 0644, &rep), 0);
    free(text);
    ck_assert_msg(cli(out, sizeof out, "rollout abort --json --dir www/rel --key hotkern.key") == 0,
                  "%s", out);
    j = cJSON_Parse(out);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "aborted")));
    ck_assert_int_eq(cJSON_GetObjectItem(j, "target_release")->valueint, 1);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "manifest_version")->valueint, 6);
    cJSON_Delete(j);
    hkn_manifest m;
    ck_assert_int_eq(hku_read_file(man, 1 << 20, &text, &len, &rep), 0);
    ck_assert_int_eq(hkn_manifest_parse(text, len, &m, &rep), 0);
    char sha[65];
    const char *a_ptx = fake_ptx(101, 0, 0, 0);
    hkn_sha256_hex(a_ptx, strlen(a_ptx), sha);
    ck_assert_str_eq(m.artifacts[0].sha256, sha); /* release 1's artifact */
    ck_assert_uint_eq(m.release, 1);
    hkn_manifest_free(&m);
    free(text);
    ck_assert_int_eq(cli(out, sizeof out, "rollout abort --dir www/rel --key hotkern.key"), 1);
    /* After the abort a new release starts, from release 1. */
    ck_assert_msg(cli(out, sizeof out,
                      "rollout start --json --dir www/rel --key hotkern.key --module "
                      "add --steps 100 b.ptx") == 0,
                  "%s", out);
    j = cJSON_Parse(out);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "release")->valueint, 7);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "previous")->valueint, 1);
    cJSON_Delete(j);
    ck_assert_int_eq(cli(out, sizeof out,
                         "rollout start --dir www/rel --key hotkern.key --module mul "
                         "--steps 100 b.ptx"),
                     2); /* another module's directory */
    hk_report_clear(&rep);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("rollout");
    TCase *tc = tcase_create("manifest");
    tcase_add_test(tc, parse_reads_every_field);
    tcase_add_test(tc, parse_refuses_each_bad_field);
    tcase_add_test(tc, signed_rollout_round_trip_and_tamper);
    tcase_add_test(tc, abort_manifest_is_accepted);
    tcase_add_test(tc, stable_release_read_and_refused);
    suite_add_tcase(s, tc);
    tc = tcase_create("host");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, buckets_are_stable_and_grow_monotonically);
    tcase_add_test(tc, names_and_labels_are_cumulative);
    tcase_add_test(tc, gate_decides);
    tcase_add_test(tc, gate_outside_takes_the_stable_release);
    tcase_add_test(tc, host_identity);
    tcase_add_test(tc, refusal_reasons);
    tcase_add_test(tc, launch_errors_are_counted);
    suite_add_tcase(s, tc);
    tc = tcase_create("origin");
    tcase_set_timeout(tc, 90);
    tcase_add_checked_fixture(tc, origin_setup, origin_teardown);
    tcase_add_test(tc, host_through_the_steps);
    tcase_add_test(tc, refusals_in_metrics);
    tcase_add_test(tc, outside_host_on_nothing_takes_the_stable_release);
    tcase_add_test(tc, puller_serves_metrics);
    tcase_add_test(tc, cli_usage_errors_exit_2);
    tcase_add_test(tc, cli_lifecycle);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

/*
 * Threshold signatures and key lists (net/keys.c): k of n distinct trusted
 * keys on a release, duplicates and strangers not counted, the report of a
 * refusal; a key list's rotation taken, refused for each reason (its
 * signatures under the keys in force, its own threshold, its version, its
 * expiry, its form), and kept across a restart of the state; `hotkern
 * cosign` and `hotkern keys sign` writing what the verifier takes.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "net/net.h"
#include "tests/harness.h"

static const char kernel_src[] = "extern \"C\" __global__ void add(float *x) { x[0] += 1; }\n";

static hkn_seckey A, B, C, D;

static void keys_init(void) {
    ck_assert_int_eq(hkn_keygen(&A), 0);
    ck_assert_int_eq(hkn_keygen(&B), 0);
    ck_assert_int_eq(hkn_keygen(&C), 0);
    ck_assert_int_eq(hkn_keygen(&D), 0);
}

/* Trusts a, b, c (any may be NULL), needing k of them. */
static hkn_trust trust3(const hkn_seckey *a, const hkn_seckey *b, const hkn_seckey *c, int k) {
    hkn_trust t;
    memset(&t, 0, sizeof t);
    const hkn_seckey *all[] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (all[i])
            t.keys[t.nkeys++] = all[i]->pub;
    t.threshold = k;
    return t;
}

/* A release of version v signed by A (its manifest's key id), and a
 * signature file of one line by each of the n signers. */
struct doc {
    char *text;
    size_t len;
    char sig[HKN_MAX_SIGS * 160];
};

static void release_by(uint64_t v, const hkn_seckey *const *signers, int n, struct doc *d) {
    hkn_blob b = {.name = "add.cu", .bytes = kernel_src, .size = strlen(kernel_src)};
    hk_report rep = HK_REPORT_INIT;
    char *bare = NULL;
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(
        hkn_release_sign(&A, "add", v, now, now + 600, &b, 1, &d->text, &d->len, &bare, &rep), 0);
    free(bare);
    d->sig[0] = '\0';
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(hkn_signature_line(signers[i], d->text, d->len, d->sig + strlen(d->sig)),
                         0);
}

static int verify(const hkn_trust *t, const struct doc *d, hk_report *rep) {
    hkn_manifest m;
    hk_report_clear(rep);
    int err = hkn_verify_manifest(t, NULL, d->text, d->len, d->sig, strlen(d->sig),
                                  (int64_t)time(NULL), &m, rep);
    if (!err)
        hkn_manifest_free(&m);
    return err;
}

START_TEST(two_of_three) {
    keys_init();
    hkn_trust t = trust3(&A, &B, &C, 2);
    hk_report rep = HK_REPORT_INIT;
    struct doc d;
    /* Any two of the three pass. */
    release_by(1, (const hkn_seckey *[]){&A, &C}, 2, &d);
    ck_assert_msg(verify(&t, &d, &rep) == 0, "%s", rep.message);
    free(d.text);
    release_by(1, (const hkn_seckey *[]){&C, &B}, 2, &d);
    ck_assert_msg(verify(&t, &d, &rep) == 0, "%s", rep.message);
    free(d.text);
    /* One of three is refused, the report naming what counted. */
    release_by(1, (const hkn_seckey *[]){&B}, 1, &d);
    ck_assert_int_eq(verify(&t, &d, &rep), HK_ERR_SIGNATURE);
    ck_assert_msg(strstr(rep.message, "1 of 2 required signatures"), "%s", rep.message);
    char want[128];
    snprintf(want, sizeof want, "valid %s; missing %s, %s", B.pub.id, A.pub.id, C.pub.id);
    ck_assert_msg(strstr(rep.message, want), "%s", rep.message);
    free(d.text);
    /* None at all. */
    release_by(1, NULL, 0, &d);
    ck_assert_int_eq(verify(&t, &d, &rep), HK_ERR_SIGNATURE);
    ck_assert_msg(strstr(rep.message, "no signature"), "%s", rep.message);
    free(d.text);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(duplicates_and_strangers) {
    keys_init();
    hkn_trust t = trust3(&A, &B, &C, 2);
    hk_report rep = HK_REPORT_INIT;
    struct doc d;
    /* One key three times counts once. */
    release_by(1, (const hkn_seckey *[]){&B, &B, &B}, 3, &d);
    ck_assert_int_eq(verify(&t, &d, &rep), HK_ERR_SIGNATURE);
    ck_assert_msg(strstr(rep.message, "1 of 2 required"), "%s", rep.message);
    free(d.text);
    /* A stranger's valid signature is ignored, and said so. */
    release_by(1, (const hkn_seckey *[]){&B, &D}, 2, &d);
    ck_assert_int_eq(verify(&t, &d, &rep), HK_ERR_SIGNATURE);
    ck_assert_msg(strstr(rep.message, "1 by unknown keys"), "%s", rep.message);
    free(d.text);
    /* A line naming a trusted key with another key's signature counts for
     * nothing: the stranger's signature under B's id. */
    release_by(1, (const hkn_seckey *[]){&A, &D}, 2, &d);
    char *line2 = strchr(d.sig, '\n') + 1;
    memcpy(line2, B.pub.id, HKN_KEY_ID_CHARS);
    ck_assert_int_eq(verify(&t, &d, &rep), HK_ERR_SIGNATURE);
    ck_assert_msg(strstr(rep.message, "1 that do not verify"), "%s", rep.message);
    /* ... while the stranger beside two trusted keys is no obstacle. */
    free(d.text);
    release_by(1, (const hkn_seckey *[]){&D, &A, &C}, 3, &d);
    ck_assert_msg(verify(&t, &d, &rep) == 0, "%s", rep.message);
    /* A bare (1.4) signature by A still counts, as one of k. */
    hkn_trust one = trust3(&A, NULL, NULL, 0);
    char *bare = NULL;
    hkn_blob b = {.name = "add.cu", .bytes = kernel_src, .size = strlen(kernel_src)};
    free(d.text);
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(
        hkn_release_sign(&A, "add", 2, now, now + 600, &b, 1, &d.text, &d.len, &bare, &rep), 0);
    snprintf(d.sig, sizeof d.sig, "%s\n", bare);
    ck_assert_msg(verify(&one, &d, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(verify(&t, &d, &rep), HK_ERR_SIGNATURE);
    /* cosign: B adds its line beside A's bare one, which becomes named. */
    char *two = NULL;
    ck_assert_int_eq(
        hkn_signatures_add(&B, d.text, d.len, d.sig, strlen(d.sig), A.pub.id, &two, &rep), 0);
    ck_assert_ptr_nonnull(strstr(two, A.pub.id));
    snprintf(d.sig, sizeof d.sig, "%s", two);
    ck_assert_msg(verify(&t, &d, &rep) == 0, "%s", rep.message);
    free(two);
    free(bare);
    free(d.text);
    hk_report_clear(&rep);
}
END_TEST

/* ---- key lists ---------------------------------------------------------- */

/* A key list of version v with keys ks, threshold k, expiring at exp,
 * signed by each of signers. */
static void list_by(uint64_t v, const hkn_seckey *const *ks, int nks, int k, int64_t exp,
                    const hkn_seckey *const *signers, int n, struct doc *d) {
    hkn_trust l;
    hk_report rep = HK_REPORT_INIT;
    memset(&l, 0, sizeof l);
    for (int i = 0; i < nks; i++)
        l.keys[l.nkeys++] = ks[i]->pub;
    l.version = v;
    l.threshold = k;
    l.expires = exp;
    ck_assert_msg(hkn_keylist_write(&l, &d->text, &d->len, &rep) == 0, "%s", rep.message);
    d->sig[0] = '\0';
    for (int i = 0; i < n; i++)
        hkn_signature_line(signers[i], d->text, d->len, d->sig + strlen(d->sig));
}

static int accept(const hkn_trust *conf, hkn_state *s, const struct doc *d, hkn_trust *out,
                  hk_report *rep) {
    hk_report_clear(rep);
    return hkn_keylist_accept(conf, s, d->text, d->len, d->sig, strlen(d->sig), (int64_t)time(NULL),
                              out, rep);
}

START_TEST(rotation) {
    keys_init();
    char *dir = hkt_tmpdir();
    hkn_state *s;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_state_open(dir, &s, &rep), 0);
    hkn_trust conf = trust3(&A, &B, &C, 2), got, cur;
    struct doc d, rel;
    const hkn_seckey *bcd[] = {&B, &C, &D};
    /* Signed by one of the keys in force: refused, nothing written. */
    list_by(2, bcd, 3, 2, 0, (const hkn_seckey *[]){&B}, 1, &d);
    ck_assert_int_eq(accept(&conf, s, &d, &got, &rep), HK_ERR_SIGNATURE);
    ck_assert_msg(strstr(rep.message, "key list: 1 of 2"), "%s", rep.message);
    free(d.text);
    /* Two of the keys in force, but only one of its own (A is not in it). */
    list_by(2, bcd, 3, 2, 0, (const hkn_seckey *[]){&A, &B}, 2, &d);
    ck_assert_int_eq(accept(&conf, s, &d, &got, &rep), HK_ERR_SIGNATURE);
    ck_assert_msg(strstr(rep.message, "not signed by its own keys"), "%s", rep.message);
    free(d.text);
    /* Expired. */
    list_by(2, bcd, 3, 2, (int64_t)time(NULL) - 10, (const hkn_seckey *[]){&B, &C}, 2, &d);
    ck_assert_int_eq(accept(&conf, s, &d, &got, &rep), HK_ERR_EXPIRED);
    free(d.text);
    /* A list that does not read (a threshold above its keys), signed well. */
    d.text = strdup("{\"type\": \"hotkern-keys\", \"version\": 2, \"threshold\": 3, \"keys\": []}");
    d.len = strlen(d.text);
    d.sig[0] = '\0';
    hkn_signature_line(&B, d.text, d.len, d.sig);
    hkn_signature_line(&C, d.text, d.len, d.sig + strlen(d.sig));
    ck_assert_int_eq(accept(&conf, s, &d, &got, &rep), HK_ERR_INVALID);
    free(d.text);
    ck_assert_int_eq(hkn_trust_current(&conf, s, &cur, &rep), 0);
    ck_assert_uint_eq(cur.version, 0); /* still the configured keys */
    /* B and C: two of the keys in force and two of its own. Taken. */
    list_by(2, bcd, 3, 2, 0, (const hkn_seckey *[]){&B, &C}, 2, &d);
    ck_assert_msg(accept(&conf, s, &d, &got, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(got.version, 2);
    /* The same list again, and an older one: replays. */
    ck_assert_int_eq(accept(&conf, s, &d, &got, &rep), HK_ERR_REPLAY);
    free(d.text);
    list_by(1, bcd, 3, 2, 0, (const hkn_seckey *[]){&B, &C, &D}, 3, &d);
    ck_assert_int_eq(accept(&conf, s, &d, &got, &rep), HK_ERR_REPLAY);
    ck_assert_msg(strstr(rep.message, "older version"), "%s", rep.message);
    free(d.text);
    /* Under the new keys: A's signature no longer counts, D's does. */
    ck_assert_int_eq(hkn_trust_current(&conf, s, &cur, &rep), 0);
    release_by(1, (const hkn_seckey *[]){&A, &B}, 2, &rel);
    ck_assert_int_eq(verify(&cur, &rel, &rep), HK_ERR_SIGNATURE);
    free(rel.text);
    release_by(1, (const hkn_seckey *[]){&C, &D}, 2, &rel);
    ck_assert_msg(verify(&cur, &rel, &rep) == 0, "%s", rep.message);
    /* A restart: the state opened again keeps the rotated keys. */
    hkn_state_close(s);
    ck_assert_int_eq(hkn_state_open(dir, &s, &rep), 0);
    ck_assert_int_eq(hkn_trust_current(&conf, s, &cur, &rep), 0);
    ck_assert_uint_eq(cur.version, 2);
    ck_assert_msg(verify(&cur, &rel, &rep) == 0, "%s", rep.message);
    free(rel.text);
    release_by(1, (const hkn_seckey *[]){&A, &B}, 2, &rel);
    ck_assert_int_eq(verify(&cur, &rel, &rep), HK_ERR_SIGNATURE);
    free(rel.text);
    /* The next rotation needs the keys of v2: A and B are not enough. */
    list_by(3, (const hkn_seckey *[]){&D}, 1, 1, 0, (const hkn_seckey *[]){&A, &B}, 2, &d);
    ck_assert_int_eq(accept(&conf, s, &d, &got, &rep), HK_ERR_SIGNATURE);
    free(d.text);
    list_by(3, (const hkn_seckey *[]){&D}, 1, 1, 0, (const hkn_seckey *[]){&B, &D}, 2, &d);
    ck_assert_msg(accept(&conf, s, &d, &got, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(got.threshold, 1);
    free(d.text);
    /* A corrupt file fails closed. */
    char path[4096];
    snprintf(path, sizeof path, "%s/keys.json", dir);
    ck_assert_int_eq(hkt_write_file(path, "{\"type\": \"hotkern-keys\""), 0);
    chmod(path, 0600);
    ck_assert_int_eq(hkn_trust_current(&conf, s, &cur, &rep), HK_ERR_IO);
    hkn_state_close(s);
    hkt_rmtree(dir);
    free(dir);
    hk_report_clear(&rep);
}
END_TEST

/* The key list in a state in memory: the same rules. */
START_TEST(rotation_in_memory) {
    keys_init();
    hkn_state *s;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_state_open(NULL, &s, &rep), 0);
    hkn_trust conf = trust3(&A, NULL, NULL, 1), got, cur;
    struct doc d;
    list_by(5, (const hkn_seckey *[]){&B}, 1, 1, 0, (const hkn_seckey *[]){&A, &B}, 2, &d);
    ck_assert_msg(accept(&conf, s, &d, &got, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(hkn_trust_current(&conf, s, &cur, &rep), 0);
    ck_assert_uint_eq(cur.version, 5);
    ck_assert_str_eq(cur.keys[0].id, B.pub.id);
    ck_assert_int_eq(accept(&conf, s, &d, &got, &rep), HK_ERR_REPLAY);
    free(d.text);
    hkn_state_close(s);
    hk_report_clear(&rep);
}
END_TEST

/* The CLI writes what the verifier takes: sign with two keys, cosign a
 * third, keys sign. */
START_TEST(cli_cosign_and_keys) {
    keys_init();
    char *tmp = hkt_tmpdir();
    char path[4096];
    hk_report rep = HK_REPORT_INIT;
    const hkn_seckey *all[] = {&A, &B, &C};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%c.key", tmp, 'a' + i);
        ck_assert_int_eq(hkn_seckey_save(path, all[i], &rep), 0);
        snprintf(path, sizeof path, "%s/%c.pub", tmp, 'a' + i);
        ck_assert_int_eq(hkn_pubkey_save(path, &all[i]->pub, &rep), 0);
    }
    snprintf(path, sizeof path, "%s/add.cu", tmp);
    ck_assert_int_eq(hkt_write_file(path, kernel_src), 0);
    hkt_run_cli(tmp, "sign --key a.key --key b.key --module add --release 1 --out www add.cu");
    struct doc d;
    size_t slen;
    char *sig;
    snprintf(path, sizeof path, "%s/www/manifest.json", tmp);
    ck_assert_int_eq(hku_read_file(path, 1 << 20, &d.text, &d.len, &rep), 0);
    snprintf(path, sizeof path, "%s/www/manifest.json.sig", tmp);
    ck_assert_int_eq(hku_read_file(path, 4096, &sig, &slen, &rep), 0);
    snprintf(d.sig, sizeof d.sig, "%s", sig);
    free(sig);
    hkn_trust t3 = trust3(&A, &B, &C, 3), t2 = trust3(&A, &B, &C, 2);
    ck_assert_msg(verify(&t2, &d, &rep) == 0, "%s", rep.message);
    ck_assert_int_eq(verify(&t3, &d, &rep), HK_ERR_SIGNATURE);
    hkt_run_cli(tmp, "cosign --key c.key www/manifest.json");
    ck_assert_int_eq(hku_read_file(path, 4096, &sig, &slen, &rep), 0);
    snprintf(d.sig, sizeof d.sig, "%s", sig);
    free(sig);
    ck_assert_msg(verify(&t3, &d, &rep) == 0, "%s", rep.message);
    free(d.text);
    /* keys sign: a list the state takes. */
    hkt_run_cli(tmp, "keys sign --key b.key --key c.key --list-version 4 --threshold 2 --out www "
                     "b.pub c.pub");
    snprintf(path, sizeof path, "%s/www/keys.json", tmp);
    ck_assert_int_eq(hku_read_file(path, 1 << 16, &d.text, &d.len, &rep), 0);
    snprintf(path, sizeof path, "%s/www/keys.json.sig", tmp);
    ck_assert_int_eq(hku_read_file(path, 4096, &sig, &slen, &rep), 0);
    snprintf(d.sig, sizeof d.sig, "%s", sig);
    free(sig);
    hkn_state *s;
    hkn_trust got;
    ck_assert_int_eq(hkn_state_open(NULL, &s, &rep), 0);
    ck_assert_msg(accept(&t2, s, &d, &got, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(got.version, 4);
    ck_assert_int_eq(got.threshold, 2);
    ck_assert_int_eq(got.nkeys, 2);
    hkn_state_close(s);
    free(d.text);
    /* A threshold above the keys given is refused, and nothing replaced. */
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' keys sign --key b.key --list-version 5 --threshold 3 --out www "
             "b.pub 2>/dev/null >&2",
             tmp, hkt_built_program("hotkern"));
    int st = system(cmd);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
    snprintf(path, sizeof path, "%s/www/keys.json", tmp);
    ck_assert_int_eq(hku_read_file(path, 1 << 16, &d.text, &d.len, &rep), 0);
    ck_assert_int_eq(hkn_keylist_parse(d.text, d.len, &got, &rep), 0);
    ck_assert_uint_eq(got.version, 4);
    free(d.text);
    hkt_rmtree(tmp);
    free(tmp);
    hk_report_clear(&rep);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("keys");
    TCase *tc = tcase_create("threshold");
    tcase_add_test(tc, two_of_three);
    tcase_add_test(tc, duplicates_and_strangers);
    tcase_add_test(tc, rotation);
    tcase_add_test(tc, rotation_in_memory);
    tcase_add_test(tc, cli_cosign_and_keys);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

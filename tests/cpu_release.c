/*
 * Signed releases (net/release.c): signing and verification, every refusal
 * the verifier can give, and the anti-replay state across a restart.
 */
#include <check.h>
#include <dirent.h>
#include <signal.h>
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

/* A signed one-artifact release of `module` at `version`. */
struct rel {
    char *manifest;
    size_t len;
    char *sig;
};

static void make_release(const hkn_seckey *k, const char *module, uint64_t version, int64_t expires,
                         const void *bytes, size_t size, struct rel *r) {
    hkn_blob b = {.name = "add.cu", .bytes = bytes, .size = size};
    hk_report rep = HK_REPORT_INIT;
    int64_t now = (int64_t)time(NULL);
    int err = hkn_release_sign(k, module, version, now, expires, &b, 1, &r->manifest, &r->len,
                               &r->sig, &rep);
    ck_assert_msg(err == 0, "sign: %s", rep.message);
    hk_report_clear(&rep);
}

static void rel_free(struct rel *r) {
    free(r->manifest);
    free(r->sig);
}

static hkn_trust trust_of(const hkn_seckey *k) {
    hkn_trust t;
    memset(&t, 0, sizeof t);
    t.keys[0] = k->pub;
    t.nkeys = 1;
    return t;
}

static int verify(const hkn_trust *t, hkn_state *s, const struct rel *r, hk_report *rep,
                  hkn_manifest *m) {
    hk_report_clear(rep);
    return hkn_verify_manifest(t, s, r->manifest, r->len, r->sig, r->sig ? strlen(r->sig) : 0,
                               (int64_t)time(NULL), m, rep);
}

/* Refusals are remembered per module: one module's many refusals replace
 * its own oldest ones and never flush another module's. */
START_TEST(refused_memory_per_module) {
    hkn_refused *r;
    ck_assert_int_eq(hkn_refused_create(&r), 0);
    char hash[65], msg[64];
    memset(hash, 'a', 64);
    hash[64] = '\0';
    hkn_refused_add(r, "other", 1, hash, HK_ERR_COMPILE, "other's");
    for (uint64_t v = 1; v <= 4 * HKN_REFUSED_PER_MODULE; v++)
        hkn_refused_add(r, "noisy", v, hash, HK_ERR_CANARY, "noisy's");
    ck_assert_int_eq(hkn_refused_find(r, "other", 1, hash, msg, sizeof msg), HK_ERR_COMPILE);
    ck_assert_str_eq(msg, "other's");
    /* noisy keeps its newest share; its oldest went. */
    ck_assert_int_eq(hkn_refused_find(r, "noisy", 4 * HKN_REFUSED_PER_MODULE, hash, NULL, 0),
                     HK_ERR_CANARY);
    ck_assert_int_eq(hkn_refused_find(r, "noisy", 3 * HKN_REFUSED_PER_MODULE + 1, hash, NULL, 0),
                     HK_ERR_CANARY);
    ck_assert_int_eq(hkn_refused_find(r, "noisy", 3 * HKN_REFUSED_PER_MODULE, hash, NULL, 0), 0);
    ck_assert_int_eq(hkn_refused_find(r, "noisy", 1, hash, NULL, 0), 0);
    /* Many modules: the table stays bounded, the least recently used go. */
    char name[32];
    for (int m = 0; m < 2 * HKN_REFUSED_MAX; m++) {
        snprintf(name, sizeof name, "m%d", m);
        hkn_refused_add(r, name, 1, hash, HK_ERR_COMPILE, "");
    }
    ck_assert_int_eq(hkn_refused_find(r, "m0", 1, hash, NULL, 0), 0);
    snprintf(name, sizeof name, "m%d", 2 * HKN_REFUSED_MAX - 1);
    ck_assert_int_eq(hkn_refused_find(r, name, 1, hash, NULL, 0), HK_ERR_COMPILE);
    hkn_refused_destroy(r);
}
END_TEST

START_TEST(sign_and_verify) {
    hkn_seckey k;
    ck_assert_int_eq(hkn_keygen(&k), 0);
    ck_assert_int_eq((int)strlen(k.pub.id), HKN_KEY_ID_CHARS);
    struct rel r;
    make_release(&k, "add", 3, time(NULL) + 60, kernel_src, strlen(kernel_src), &r);
    hkn_trust t = trust_of(&k);
    hkn_manifest m;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_msg(verify(&t, NULL, &r, &rep, &m) == 0, "%s", rep.message);
    ck_assert_str_eq(m.module, "add");
    ck_assert_uint_eq(m.version, 3);
    ck_assert_str_eq(m.key_id, k.pub.id);
    ck_assert_uint_eq(m.nartifacts, 1);
    ck_assert_str_eq(m.artifacts[0].name, "add.cu");
    ck_assert_int_eq(m.artifacts[0].format, HK_FORMAT_CUDA_C);
    ck_assert_uint_eq(m.artifacts[0].size, strlen(kernel_src));
    ck_assert_int_eq(hkn_verify_artifact(&m.artifacts[0], kernel_src, strlen(kernel_src), &rep), 0);
    /* A hex signature verifies as well as a base64 one. */
    unsigned char bin[HKN_SIG_BYTES];
    char hex[2 * HKN_SIG_BYTES + 1];
    ck_assert_int_eq(hkn_decode_fixed(r.sig, strlen(r.sig), bin, sizeof bin), 0);
    sodium_bin2hex(hex, sizeof hex, bin, sizeof bin);
    hkn_manifest_free(&m);
    ck_assert_int_eq(
        hkn_verify_manifest(&t, NULL, r.manifest, r.len, hex, strlen(hex), time(NULL), &m, &rep),
        0);
    hkn_manifest_free(&m);
    hk_report_clear(&rep);
    rel_free(&r);
}
END_TEST

START_TEST(bad_signature) {
    hkn_seckey k;
    hkn_keygen(&k);
    struct rel r;
    make_release(&k, "add", 3, time(NULL) + 60, kernel_src, strlen(kernel_src), &r);
    hkn_trust t = trust_of(&k);
    hkn_manifest m;
    hk_report rep = HK_REPORT_INIT;
    /* Flip the version 3 -> 4: the bytes no longer match the signature. */
    char *v = strstr(r.manifest, "\"version\":");
    ck_assert_ptr_nonnull(v);
    v = strchr(v, '3');
    *v = '4';
    ck_assert_int_eq(verify(&t, NULL, &r, &rep, &m), HK_ERR_SIGNATURE);
    ck_assert_msg(strstr(rep.message, "bad signature"), "%s", rep.message);
    *v = '3';
    /* A corrupted signature likewise. */
    r.sig[5] = r.sig[5] == 'A' ? 'B' : 'A';
    ck_assert_int_eq(verify(&t, NULL, &r, &rep, &m), HK_ERR_SIGNATURE);
    /* Garbage that is not a signature at all. */
    free(r.sig);
    r.sig = strdup("not-a-signature");
    ck_assert_int_eq(verify(&t, NULL, &r, &rep, &m), HK_ERR_SIGNATURE);
    ck_assert_msg(strstr(rep.message, "64 bytes"), "%s", rep.message);
    hk_report_clear(&rep);
    rel_free(&r);
}
END_TEST

START_TEST(missing_signature) {
    hkn_seckey k;
    hkn_keygen(&k);
    struct rel r;
    make_release(&k, "add", 3, time(NULL) + 60, kernel_src, strlen(kernel_src), &r);
    hkn_trust t = trust_of(&k);
    hkn_manifest m;
    hk_report rep = HK_REPORT_INIT;
    char *sig = r.sig;
    r.sig = NULL;
    ck_assert_int_eq(verify(&t, NULL, &r, &rep, &m), HK_ERR_SIGNATURE);
    ck_assert_msg(strstr(rep.message, "no signature"), "%s", rep.message);
    /* No key configured and unsigned not allowed: still refused. */
    hkn_trust none;
    memset(&none, 0, sizeof none);
    ck_assert_int_eq(verify(&none, NULL, &r, &rep, &m), HK_ERR_SIGNATURE);
    /* Explicitly allowed: accepted without a signature. */
    none.allow_unsigned = 1;
    ck_assert_int_eq(verify(&none, NULL, &r, &rep, &m), 0);
    hkn_manifest_free(&m);
    r.sig = sig;
    hk_report_clear(&rep);
    rel_free(&r);
}
END_TEST

START_TEST(unknown_key) {
    hkn_seckey signer, trusted;
    hkn_keygen(&signer);
    hkn_keygen(&trusted);
    struct rel r;
    make_release(&signer, "add", 3, time(NULL) + 60, kernel_src, strlen(kernel_src), &r);
    hkn_trust t = trust_of(&trusted);
    hkn_manifest m;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(verify(&t, NULL, &r, &rep, &m), HK_ERR_SIGNATURE);
    ck_assert_msg(strstr(rep.message, "unknown signing key") &&
                      strstr(rep.message, signer.pub.id) && strstr(rep.message, trusted.pub.id),
                  "%s", rep.message);
    /* With both keys trusted it verifies. */
    t.keys[1] = signer.pub;
    t.nkeys = 2;
    ck_assert_int_eq(verify(&t, NULL, &r, &rep, &m), 0);
    hkn_manifest_free(&m);
    hk_report_clear(&rep);
    rel_free(&r);
}
END_TEST

START_TEST(expired) {
    hkn_seckey k;
    hkn_keygen(&k);
    struct rel r;
    make_release(&k, "add", 3, time(NULL) - 10, kernel_src, strlen(kernel_src), &r);
    hkn_trust t = trust_of(&k);
    hkn_manifest m;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(verify(&t, NULL, &r, &rep, &m), HK_ERR_EXPIRED);
    ck_assert_msg(strstr(rep.message, "expired"), "%s", rep.message);
    hk_report_clear(&rep);
    rel_free(&r);
}
END_TEST

START_TEST(replay_same_and_lower) {
    hkn_seckey k;
    hkn_keygen(&k);
    hkn_trust t = trust_of(&k);
    hkn_state *s;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_state_open(NULL, &s, &rep), 0);
    ck_assert_int_eq(hkn_state_accept(s, "add", 5, &rep), 0);
    struct rel same, lower, higher;
    make_release(&k, "add", 5, time(NULL) + 60, kernel_src, strlen(kernel_src), &same);
    make_release(&k, "add", 4, time(NULL) + 60, kernel_src, strlen(kernel_src), &lower);
    make_release(&k, "add", 6, time(NULL) + 60, kernel_src, strlen(kernel_src), &higher);
    hkn_manifest m;
    ck_assert_int_eq(verify(&t, s, &same, &rep, &m), HK_ERR_REPLAY);
    ck_assert_msg(strstr(rep.message, "same version"), "%s", rep.message);
    ck_assert_int_eq(verify(&t, s, &lower, &rep, &m), HK_ERR_REPLAY);
    ck_assert_msg(strstr(rep.message, "older version"), "%s", rep.message);
    ck_assert_int_eq(verify(&t, s, &higher, &rep, &m), 0);
    hkn_manifest_free(&m);
    /* Other modules are independent. */
    ck_assert_uint_eq(hkn_state_get(s, "other"), 0);
    /* Accepting a lower or the same version never lowers the mark, and is
     * refused: its caller must not commit it. */
    ck_assert_int_eq(hkn_state_accept(s, "add", 2, &rep), HK_ERR_REPLAY);
    ck_assert_int_eq(hkn_state_accept(s, "add", 5, &rep), HK_ERR_REPLAY);
    ck_assert_uint_eq(hkn_state_get(s, "add"), 5);
    hkn_state_close(s);
    hk_report_clear(&rep);
    rel_free(&same);
    rel_free(&lower);
    rel_free(&higher);
}
END_TEST

START_TEST(hash_and_size_mismatch) {
    hkn_seckey k;
    hkn_keygen(&k);
    struct rel r;
    make_release(&k, "add", 3, time(NULL) + 60, kernel_src, strlen(kernel_src), &r);
    hkn_trust t = trust_of(&k);
    hkn_manifest m;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(verify(&t, NULL, &r, &rep, &m), 0);
    char *copy = strdup(kernel_src);
    copy[0] = 'X'; /* same size, other content */
    ck_assert_int_eq(hkn_verify_artifact(&m.artifacts[0], copy, strlen(copy), &rep), HK_ERR_HASH);
    ck_assert_msg(strstr(rep.message, "sha256"), "%s", rep.message);
    ck_assert_int_eq(hkn_verify_artifact(&m.artifacts[0], kernel_src, strlen(kernel_src) - 1, &rep),
                     HK_ERR_HASH);
    ck_assert_msg(strstr(rep.message, "size"), "%s", rep.message);
    free(copy);
    hkn_manifest_free(&m);
    hk_report_clear(&rep);
    rel_free(&r);
}
END_TEST

static int count_entries(const char *dir) {
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

START_TEST(state_survives_restart) {
    char *dir = hkt_tmpdir();
    char sdir[512];
    snprintf(sdir, sizeof sdir, "%s/state/nested", dir);
    hkn_seckey k;
    hkn_keygen(&k);
    hkn_trust t = trust_of(&k);
    hk_report rep = HK_REPORT_INIT;
    hkn_state *s;
    ck_assert_int_eq(hkn_state_open(sdir, &s, &rep), 0);
    ck_assert_int_eq(hkn_state_accept(s, "add", 7, &rep), 0);
    ck_assert_int_eq(hkn_state_accept(s, "mul", 2, &rep), 0);
    hkn_state_close(s);
    /* Only accepted.json: no temp file left behind. */
    ck_assert_int_eq(count_entries(sdir), 1);

    /* "Restart": a new state object on the same directory. */
    ck_assert_int_eq(hkn_state_open(sdir, &s, &rep), 0);
    ck_assert_uint_eq(hkn_state_get(s, "add"), 7);
    ck_assert_uint_eq(hkn_state_get(s, "mul"), 2);
    struct rel old, next;
    make_release(&k, "add", 6, time(NULL) + 60, kernel_src, strlen(kernel_src), &old);
    make_release(&k, "add", 8, time(NULL) + 60, kernel_src, strlen(kernel_src), &next);
    hkn_manifest m;
    ck_assert_int_eq(verify(&t, s, &old, &rep, &m), HK_ERR_REPLAY);
    ck_assert_int_eq(verify(&t, s, &next, &rep, &m), 0);
    hkn_manifest_free(&m);
    hkn_state_close(s);

    /* A corrupt state file stops the source instead of forgetting. */
    char path[600];
    snprintf(path, sizeof path, "%s/accepted.json", sdir);
    ck_assert_int_eq(hkt_write_file(path, "{ not json"), 0);
    ck_assert_int_eq(hkn_state_open(sdir, &s, &rep), HK_ERR_IO);
    hk_report_clear(&rep);
    rel_free(&old);
    rel_free(&next);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(key_files) {
    char *dir = hkt_tmpdir();
    char skp[512], pkp[512], b64p[512];
    snprintf(skp, sizeof skp, "%s/k.key", dir);
    snprintf(pkp, sizeof pkp, "%s/k.pub", dir);
    snprintf(b64p, sizeof b64p, "%s/k64.pub", dir);
    hkn_seckey k, k2;
    hkn_pubkey p, p64;
    hk_report rep = HK_REPORT_INIT;
    hkn_keygen(&k);
    ck_assert_int_eq(hkn_seckey_save(skp, &k, &rep), 0);
    ck_assert_int_eq(hkn_pubkey_save(pkp, &k.pub, &rep), 0);
    struct stat st;
    ck_assert_int_eq(stat(skp, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    ck_assert_int_eq(hkn_seckey_load(skp, &k2, &rep), 0);
    ck_assert_int_eq(hkn_pubkey_load(pkp, &p, &rep), 0);
    ck_assert_mem_eq(k2.sk, k.sk, sizeof k.sk);
    ck_assert_str_eq(k2.pub.id, k.pub.id);
    ck_assert_str_eq(p.id, k.pub.id);
    /* Base64 public keys are accepted too. */
    char b64[64];
    sodium_bin2base64(b64, sizeof b64, k.pub.pk, sizeof k.pub.pk, sodium_base64_VARIANT_ORIGINAL);
    strcat(b64, "\n");
    ck_assert_int_eq(hkt_write_file(b64p, b64), 0);
    ck_assert_int_eq(hkn_pubkey_load(b64p, &p64, &rep), 0);
    ck_assert_mem_eq(p64.pk, k.pub.pk, sizeof p64.pk);
    /* A truncated key is refused. */
    ck_assert_int_eq(hkt_write_file(b64p, "abcdef\n"), 0);
    ck_assert_int_eq(hkn_pubkey_load(b64p, &p64, &rep), HK_ERR_INVALID);
    hk_report_clear(&rep);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(manifest_fields_checked) {
    static const char *bad[] = {
        "[]",
        "{\"module\":\"m\",\"version\":0,\"created\":1,\"expires\":2,\"artifacts\":[]}",
        "{\"module\":\"../x\",\"version\":1,\"created\":1,\"expires\":2,\"artifacts\":[]}",
        "{\"module\":\"m\",\"version\":1.5,\"created\":1,\"expires\":2,\"artifacts\":[]}",
        "{\"module\":\"m\",\"version\":1,\"created\":1,\"expires\":2,\"artifacts\":[]}",
        "{\"module\":\"m\",\"version\":1,\"created\":1,\"expires\":2,\"artifacts\":[{\"name\":"
        "\"a.cu\",\"sha256\":\"zz\",\"size\":1,\"format\":\"cuda\"}]}",
        "{\"module\":\"m\",\"version\":1,\"created\":1,\"expires\":2,\"artifacts\":[{\"name\":"
        "\"a.cu\",\"sha256\":"
        "\"821d557832973ff68bdc4b02ec86425be1022fcfa22f9dd7da4a6aaf2816a1b5\",\"size\":1,"
        "\"format\":\"elf\"}]}",
        "{\"module\":\"m\",\"version\":1,\"created\":1,\"expires\":2,\"artifacts\":[{\"name\":"
        "\"../../etc/passwd\",\"sha256\":"
        "\"821d557832973ff68bdc4b02ec86425be1022fcfa22f9dd7da4a6aaf2816a1b5\",\"size\":1,"
        "\"format\":\"cuda\"}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hkn_manifest m;
        hk_report rep = HK_REPORT_INIT;
        ck_assert_msg(hkn_manifest_parse(bad[i], strlen(bad[i]), &m, &rep) == HK_ERR_INVALID,
                      "accepted %s", bad[i]);
        ck_assert(rep.message[0]);
    }
}
END_TEST

START_TEST(artifact_choice) {
    hkn_artifact a[4];
    memset(a, 0, sizeof a);
    a[0].format = HK_FORMAT_CUDA_C;
    a[1].format = HK_FORMAT_PTX;
    a[2].format = HK_FORMAT_CUBIN;
    strcpy(a[2].arch, "sm_80");
    a[3].format = HK_FORMAT_CUBIN;
    strcpy(a[3].arch, "sm_90");
    hkn_manifest m = {.artifacts = a, .nartifacts = 4};
    ck_assert_uint_eq(hkn_pick_artifact(&m, "sm_90"), 3);
    ck_assert_uint_eq(hkn_pick_artifact(&m, "sm_80"), 2);
    ck_assert_uint_eq(hkn_pick_artifact(&m, "sm_100"), 1); /* PTX before CUDA C */
    ck_assert_uint_eq(hkn_pick_artifact(&m, NULL), 1);
}
END_TEST

/* Two processes on one state directory: neither erases the other's record,
 * and each sees the other's at its next check. */
START_TEST(two_processes_merge) {
    char *dir = hkt_tmpdir();
    char sdir[512];
    snprintf(sdir, sizeof sdir, "%s/state", dir);
    int go_a[2], go_b[2];
    ck_assert_int_eq(pipe(go_a), 0);
    ck_assert_int_eq(pipe(go_b), 0);
    /* Both open (each reads an empty state) before either accepts. */
    pid_t a = fork();
    if (a == 0) {
        hkn_state *s;
        char ch;
        if (hkn_state_open(sdir, &s, NULL) || read(go_a[0], &ch, 1) != 1 ||
            hkn_state_accept(s, "a", 5, NULL))
            _exit(1);
        hkn_state_close(s);
        _exit(0);
    }
    pid_t b = fork();
    if (b == 0) {
        hkn_state *s;
        char ch;
        if (hkn_state_open(sdir, &s, NULL) || read(go_b[0], &ch, 1) != 1 ||
            hkn_state_accept(s, "b", 3, NULL))
            _exit(1);
        /* B sees A's record without reopening. */
        uint64_t v = 0;
        if (hkn_state_lookup(s, "a", &v, NULL) || v != 5)
            _exit(2);
        hkn_state_close(s);
        _exit(0);
    }
    usleep(200000);
    int st;
    ck_assert_int_eq(write(go_a[1], "x", 1), 1);
    ck_assert_int_eq(waitpid(a, &st, 0), a);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ck_assert_int_eq(write(go_b[1], "x", 1), 1);
    ck_assert_int_eq(waitpid(b, &st, 0), b);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "B: status %d", WEXITSTATUS(st));
    /* "A restarts": both records are there, and a4 is a replay. */
    hkn_state *s;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_state_open(sdir, &s, &rep), 0);
    ck_assert_uint_eq(hkn_state_get(s, "a"), 5);
    ck_assert_uint_eq(hkn_state_get(s, "b"), 3);
    hkn_seckey k;
    hkn_keygen(&k);
    hkn_trust t = trust_of(&k);
    struct rel r4;
    hkn_manifest m;
    make_release(&k, "a", 4, time(NULL) + 60, kernel_src, strlen(kernel_src), &r4);
    ck_assert_int_eq(verify(&t, s, &r4, &rep, &m), HK_ERR_REPLAY);
    hkn_state_close(s);
    rel_free(&r4);
    hk_report_clear(&rep);
    for (int i = 0; i < 2; i++) {
        close(go_a[i]);
        close(go_b[i]);
    }
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* Two processes on one state directory check the same module, and the one
 * with the newer release records first: the slower one's acceptance of its
 * older release is refused (it would commit after the newer one), and the
 * record keeps the newer version. */
START_TEST(slower_process_refused) {
    char *dir = hkt_tmpdir();
    char sdir[512];
    snprintf(sdir, sizeof sdir, "%s/state", dir);
    int go[2], done[2];
    ck_assert_int_eq(pipe(go), 0);
    ck_assert_int_eq(pipe(done), 0);
    /* A checks v5 against an empty record, then waits. */
    pid_t a = fork();
    if (a == 0) {
        hkn_state *s;
        hk_report rep = HK_REPORT_INIT;
        uint64_t have = 1;
        char ch;
        if (hkn_state_open(sdir, &s, NULL) || hkn_state_lookup(s, "add", &have, NULL) ||
            have != 0 || write(done[1], "c", 1) != 1 || read(go[0], &ch, 1) != 1)
            _exit(1);
        int err = hkn_state_accept(s, "add", 5, &rep);
        if (err != HK_ERR_REPLAY)
            _exit(err == 0 ? 2 : 3);
        if (!strstr(rep.message, "v6") || !strstr(rep.message, "another process"))
            _exit(4);
        if (hkn_state_accept(s, "add", 6, NULL) != HK_ERR_REPLAY)
            _exit(5);
        hkn_state_close(s);
        _exit(0);
    }
    char ch;
    ck_assert_int_eq(read(done[0], &ch, 1), 1);
    /* B checks and records v6 in the meantime. */
    pid_t b = fork();
    if (b == 0) {
        hkn_state *s;
        uint64_t have = 1;
        if (hkn_state_open(sdir, &s, NULL) || hkn_state_lookup(s, "add", &have, NULL) ||
            have != 0 || hkn_state_accept(s, "add", 6, NULL))
            _exit(1);
        hkn_state_close(s);
        _exit(0);
    }
    int st;
    ck_assert_int_eq(waitpid(b, &st, 0), b);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ck_assert_int_eq(write(go[1], "x", 1), 1);
    ck_assert_int_eq(waitpid(a, &st, 0), a);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "A: status %d", WEXITSTATUS(st));
    hkn_state *s;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_state_open(sdir, &s, &rep), 0);
    ck_assert_uint_eq(hkn_state_get(s, "add"), 6);
    hkn_state_close(s);
    for (int i = 0; i < 2; i++) {
        close(go[i]);
        close(done[i]);
    }
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* A corrupt record fails closed, with the entry named. */
START_TEST(corrupt_state_fails_closed) {
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"{\"format\":1,\"modules\":{\"add\":\"7\"}}", "'add'"},
        {"{\"format\":1,\"modules\":{\"add\":-3}}", "'add'"},
        {"{\"format\":1,\"modules\":{\"add\":null}}", "'add'"},
        {"{\"format\":1,\"modules\":{\"add\":1e300}}", "'add'"},
        {"{\"format\":1,\"modules\":{\"add\":2.5}}", "'add'"},
        {"{\"format\":1,\"modules\":{\"add\":0}}", "'add'"},
        {"{\"format\":1,\"modules\":{\"add\":9,\"add\":2}}", "twice"},
        {"{\"format\":1,\"modules\":{\"../x\":2}}", "not a module name"},
        {"{\"format\":1,\"modules\":{\"add\":9}} trailing", "corrupt"},
    };
    char *dir = hkt_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/accepted.json", dir);
    hk_report rep = HK_REPORT_INIT;
    hkn_state *s;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(hkt_write_file(path, bad[i].text), 0);
        hk_report_clear(&rep);
        ck_assert_msg(hkn_state_open(dir, &s, &rep) == HK_ERR_IO, "accepted: %s", bad[i].text);
        ck_assert_msg(strstr(rep.message, bad[i].needle) && strstr(rep.message, "accepted.json"),
                      "%s: %s", bad[i].text, rep.message);
    }
    /* Corrupted while open: every check refuses instead of reading 0. */
    ck_assert_int_eq(hkt_write_file(path, "{\"format\":1,\"modules\":{\"add\":9}}"), 0);
    ck_assert_int_eq(hkn_state_open(dir, &s, &rep), 0);
    ck_assert_int_eq(hkt_write_file(path, "{\"format\":1,\"modules\":{\"add\":\"x\"}}"), 0);
    hkn_seckey k;
    hkn_keygen(&k);
    hkn_trust t = trust_of(&k);
    struct rel r;
    hkn_manifest m;
    make_release(&k, "add", 10, time(NULL) + 60, kernel_src, strlen(kernel_src), &r);
    ck_assert_int_eq(verify(&t, s, &r, &rep, &m), HK_ERR_IO);
    ck_assert_uint_eq(hkn_state_get(s, "add"), UINT64_MAX);
    ck_assert_int_eq(hkn_state_accept(s, "add", 10, &rep), HK_ERR_IO);
    hkn_state_close(s);
    rel_free(&r);
    hk_report_clear(&rep);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* Temp files of a writer that crashed are removed when the state opens. */
START_TEST(stale_temp_files_cleaned) {
    char *dir = hkt_tmpdir();
    char p1[600], p2[600];
    snprintf(p1, sizeof p1, "%s/accepted.json.tmp.99999.0", dir);
    snprintf(p2, sizeof p2, "%s/accepted.json.tmp.12345.7", dir);
    ck_assert_int_eq(hkt_write_file(p1, "{"), 0);
    ck_assert_int_eq(hkt_write_file(p2, ""), 0);
    hkn_state *s;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_state_open(dir, &s, &rep), 0);
    ck_assert_int_ne(access(p1, F_OK), 0);
    ck_assert_int_ne(access(p2, F_OK), 0);
    ck_assert_int_eq(hkn_state_accept(s, "add", 1, &rep), 0);
    hkn_state_close(s);
    ck_assert_int_eq(count_entries(dir), 1);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* A state directory or file that another user could change is refused
 * (it would let them reopen old releases): with the path and the reason. A
 * state file that is a link is refused, never followed. */
START_TEST(state_others_can_change_is_refused) {
    char *dir = hkt_tmpdir();
    char path[600], elsewhere[600];
    hk_report rep = HK_REPORT_INIT;
    hkn_state *s;
    ck_assert_int_eq(chmod(dir, 0777), 0);
    ck_assert_int_eq(hkn_state_open(dir, &s, &rep), HK_ERR_IO);
    ck_assert_msg(strstr(rep.message, dir) && strstr(rep.message, "writable by group and others"),
                  "%s", rep.message);
    ck_assert_int_eq(chmod(dir, 0700), 0);
    snprintf(path, sizeof path, "%s/accepted.json", dir);
    ck_assert_int_eq(hkt_write_file(path, "{\"format\":1,\"modules\":{\"add\":9}}"), 0);
    ck_assert_int_eq(chmod(path, 0666), 0);
    ck_assert_int_eq(hkn_state_open(dir, &s, &rep), HK_ERR_IO);
    ck_assert_msg(strstr(rep.message, "accepted.json") && strstr(rep.message, "writable"), "%s",
                  rep.message);
    /* Opened while fine, loosened later: every check refuses. */
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(hkn_state_open(dir, &s, &rep), 0);
    ck_assert_uint_eq(hkn_state_get(s, "add"), 9);
    ck_assert_int_eq(chmod(path, 0606), 0);
    ck_assert_uint_eq(hkn_state_get(s, "add"), UINT64_MAX);
    ck_assert_int_eq(hkn_state_accept(s, "add", 10, &rep), HK_ERR_IO);
    hkn_state_close(s);
    /* A link in the file's place. */
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere.json", dir);
    ck_assert_int_eq(rename(path, elsewhere), 0);
    ck_assert_int_eq(chmod(elsewhere, 0600), 0);
    ck_assert_int_eq(symlink(elsewhere, path), 0);
    ck_assert_int_eq(hkn_state_open(dir, &s, &rep), HK_ERR_IO);
    ck_assert_msg(strstr(rep.message, "symbolic link"), "%s", rep.message);
    hk_report_clear(&rep);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* Another process holds the state directory's lock and never lets go (it
 * stopped): every read and write gives up after a bounded wait and fails
 * closed. */
START_TEST(state_lock_held_by_a_stopped_process) {
    char *dir = hkt_tmpdir();
    hk_report rep = HK_REPORT_INIT;
    hkn_state *s;
    ck_assert_int_eq(hkn_state_open(dir, &s, &rep), 0);
    ck_assert_int_eq(hkn_state_accept(s, "add", 3, &rep), 0);
    pid_t holder = hkt_hold_lock_stopped(dir);
    ck_assert_int_gt(holder, 0);
    ck_assert_int_eq(hkn_state_accept(s, "add", 4, &rep), HK_ERR_BUSY);
    ck_assert_msg(strstr(rep.message, dir) && strstr(rep.message, "lock"), "%s", rep.message);
    ck_assert_uint_eq(hkn_state_get(s, "add"), UINT64_MAX); /* fails closed */
    kill(holder, SIGKILL);
    ck_assert_int_eq(waitpid(holder, NULL, 0), holder);
    ck_assert_uint_eq(hkn_state_get(s, "add"), 3);
    ck_assert_int_eq(hkn_state_accept(s, "add", 4, &rep), 0);
    hkn_state_close(s);
    hk_report_clear(&rep);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* Signs arbitrary manifest text, for inputs the signing code never makes. */
static void sign_text(const hkn_seckey *k, const char *text, char sig[128]) {
    unsigned char bin[HKN_SIG_BYTES];
    crypto_sign_detached(bin, NULL, (const unsigned char *)text, strlen(text), k->sk);
    sodium_bin2base64(sig, 128, bin, sizeof bin, sodium_base64_VARIANT_ORIGINAL);
}

START_TEST(strict_manifest_text) {
    hkn_seckey k;
    hkn_keygen(&k);
    hkn_trust t = trust_of(&k);
    struct rel r;
    make_release(&k, "add", 3, time(NULL) + 60, kernel_src, strlen(kernel_src), &r);
    hk_report rep = HK_REPORT_INIT;
    hkn_manifest m;
    char sig[128];
    /* Trailing bytes after the object, signed: refused. */
    char *trail = malloc(r.len + 16);
    snprintf(trail, r.len + 16, "%s{\"x\":1}", r.manifest);
    sign_text(&k, trail, sig);
    ck_assert_int_eq(
        hkn_verify_manifest(&t, NULL, trail, strlen(trail), sig, strlen(sig), time(NULL), &m, &rep),
        HK_ERR_INVALID);
    /* A module name with an escaped NUL would be cut to "a": refused. */
    char *nul = malloc(r.len + 16);
    const char *at = strstr(r.manifest, "\"add\"");
    ck_assert_ptr_nonnull(at);
    snprintf(nul, r.len + 16, "%.*s\"a\\u0000dd\"%s", (int)(at - r.manifest), r.manifest, at + 5);
    sign_text(&k, nul, sig);
    ck_assert_int_eq(
        hkn_verify_manifest(&t, NULL, nul, strlen(nul), sig, strlen(sig), time(NULL), &m, &rep),
        HK_ERR_INVALID);
    /* Trailing whitespace is fine. */
    snprintf(trail, r.len + 16, "%s \n", r.manifest);
    sign_text(&k, trail, sig);
    ck_assert_int_eq(
        hkn_verify_manifest(&t, NULL, trail, strlen(trail), sig, strlen(sig), time(NULL), &m, &rep),
        0);
    hkn_manifest_free(&m);
    free(trail);
    free(nul);
    rel_free(&r);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(lifetime_and_future_creation) {
    hkn_seckey k;
    hkn_keygen(&k);
    hkn_trust t = trust_of(&k);
    hkn_blob b = {.name = "add.cu", .bytes = kernel_src, .size = strlen(kernel_src)};
    hk_report rep = HK_REPORT_INIT;
    hkn_manifest m;
    struct rel r;
    int64_t now = (int64_t)time(NULL);
    /* Created an hour from now. */
    ck_assert_int_eq(hkn_release_sign(&k, "add", 1, now + 3600, now + 7200, &b, 1, &r.manifest,
                                      &r.len, &r.sig, &rep),
                     0);
    ck_assert_int_eq(verify(&t, NULL, &r, &rep, &m), HK_ERR_EXPIRED);
    ck_assert_msg(strstr(rep.message, "not valid yet"), "%s", rep.message);
    rel_free(&r);
    /* Living longer than a year: the signer refuses to make it ... */
    ck_assert_int_eq(hkn_release_sign(&k, "add", 1, now, now + 400 * 86400LL, &b, 1, &r.manifest,
                                      &r.len, &r.sig, &rep),
                     HK_ERR_INVALID);
    /* ... and the verifier refuses a hand-made one. */
    char text[512], sig[128], hex[65];
    hkn_sha256_hex(kernel_src, strlen(kernel_src), hex);
    snprintf(
        text, sizeof text,
        "{\"module\":\"add\",\"version\":1,\"created\":%lld,\"expires\":%lld,\"key_id\":\"%s\","
        "\"artifacts\":[{\"name\":\"add.cu\",\"sha256\":\"%s\",\"size\":%zu,\"format\":"
        "\"cuda\",\"arch\":\"\"}]}",
        (long long)now, (long long)(now + 400 * 86400LL), k.pub.id, hex, strlen(kernel_src));
    sign_text(&k, text, sig);
    ck_assert_int_eq(
        hkn_verify_manifest(&t, NULL, text, strlen(text), sig, strlen(sig), now, &m, &rep),
        HK_ERR_EXPIRED);
    ck_assert_msg(strstr(rep.message, "lifetime"), "%s", rep.message);
    hk_report_clear(&rep);
}
END_TEST

/* Key files are read only when regular: a FIFO is refused at once (it used
 * to block forever), and a secret key others can read is refused. */
START_TEST(key_file_kinds_and_modes) {
    char *dir = hkt_tmpdir();
    char fifo[512], skp[512];
    snprintf(fifo, sizeof fifo, "%s/fifo.key", dir);
    snprintf(skp, sizeof skp, "%s/k.key", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    hkn_seckey k, k2;
    hkn_pubkey p;
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_seckey_load(fifo, &k2, &rep), HK_ERR_IO);
    ck_assert_msg(strstr(rep.message, "not a regular file"), "%s", rep.message);
    ck_assert_int_eq(hkn_pubkey_load(fifo, &p, &rep), HK_ERR_IO);
    char *text;
    size_t len;
    ck_assert_int_eq(hku_read_file(dir, 1024, &text, &len, &rep), HK_ERR_IO);
    hkn_keygen(&k);
    ck_assert_int_eq(hkn_seckey_save(skp, &k, &rep), 0);
    ck_assert_int_eq(chmod(skp, 0644), 0);
    ck_assert_int_eq(hkn_seckey_load(skp, &k2, &rep), HK_ERR_IO);
    ck_assert_msg(strstr(rep.message, "chmod 600"), "%s", rep.message);
    ck_assert_int_eq(chmod(skp, 0600), 0);
    ck_assert_int_eq(hkn_seckey_load(skp, &k2, &rep), 0);
    hk_report_clear(&rep);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(signed_rollback_requests) {
    hkn_seckey k, other;
    hkn_keygen(&k);
    hkn_keygen(&other);
    hkn_trust t = trust_of(&k);
    char *text, *sig;
    size_t len;
    hk_report rep = HK_REPORT_INIT;
    hkn_rollback_req rq;
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(
        hkn_rollback_sign(&k, "add", 4, now + 60, "gpu-7:7070", &text, &len, &sig, &rep), 0);
    ck_assert_int_eq(hkn_rollback_verify(&t, text, len, sig, strlen(sig), now, &rq, &rep), 0);
    ck_assert_str_eq(rq.module, "add");
    ck_assert_uint_eq(rq.target, 4);
    ck_assert_uint_eq(strlen(rq.nonce), 32);
    ck_assert_str_eq(rq.endpoint, "gpu-7:7070");
    /* Expired, too long-lived, or by another key: refused. */
    ck_assert_int_eq(hkn_rollback_verify(&t, text, len, sig, strlen(sig), now + 61, &rq, &rep),
                     HK_ERR_EXPIRED);
    free(text);
    free(sig);
    ck_assert_int_eq(
        hkn_rollback_sign(&k, "add", 4, now + 86400, "gpu-7:7070", &text, &len, &sig, &rep), 0);
    ck_assert_int_eq(hkn_rollback_verify(&t, text, len, sig, strlen(sig), now, &rq, &rep),
                     HK_ERR_EXPIRED);
    free(text);
    free(sig);
    ck_assert_int_eq(
        hkn_rollback_sign(&other, "add", 4, now + 60, "gpu-7:7070", &text, &len, &sig, &rep), 0);
    ck_assert_int_eq(hkn_rollback_verify(&t, text, len, sig, strlen(sig), now, &rq, &rep),
                     HK_ERR_SIGNATURE);
    free(text);
    free(sig);
    /* A request must name the endpoint it is for: one that names none (as
     * requests did before they were bound to an endpoint) is refused, and
     * no id outside the alphabet can be signed. */
    const char *tails[] = {"", ",\"endpoint\":\"\"", ",\"endpoint\":\"a b\"", ",\"endpoint\":7"};
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        char req[512], usig[128];
        snprintf(req, sizeof req,
                 "{\"type\":\"hotkern-rollback\",\"module\":\"add\",\"target\":4,\"expires\":%lld,"
                 "\"nonce\":\"0123456789abcdef0123456789abcdef\",\"key_id\":\"%s\"%s}",
                 (long long)now + 60, k.pub.id, tails[i]);
        sign_text(&k, req, usig);
        ck_assert_int_eq(
            hkn_rollback_verify(&t, req, strlen(req), usig, strlen(usig), now, &rq, &rep),
            HK_ERR_SIGNATURE);
        ck_assert_msg(strstr(rep.message, "endpoint"), "%s", rep.message);
    }
    ck_assert_int_eq(hkn_rollback_sign(&k, "add", 4, now + 60, "a\x1b[2J", &text, &len, &sig, &rep),
                     HK_ERR_INVALID);
    ck_assert_int_eq(hkn_rollback_sign(&k, "add", 4, now + 60, NULL, &text, &len, &sig, &rep),
                     HK_ERR_INVALID);
    /* A signed manifest is not a rollback request. */
    struct rel r;
    make_release(&k, "add", 3, now + 60, kernel_src, strlen(kernel_src), &r);
    ck_assert_int_eq(
        hkn_rollback_verify(&t, r.manifest, r.len, r.sig, strlen(r.sig), now, &rq, &rep),
        HK_ERR_INVALID);
    rel_free(&r);
    hk_report_clear(&rep);
}
END_TEST

START_TEST(release_carries_headers) {
    hkn_seckey k;
    ck_assert_int_eq(hkn_keygen(&k), 0);
    static const char hdr[] = "#define K 3\n";
    static const char src[] = "#include \"common.cuh\"\n__device__ int arr[K];\n";
    hkn_blob b[2] = {{.name = "dir/common.cuh", .bytes = hdr, .size = strlen(hdr)},
                     {.name = "k.cu", .bytes = src, .size = strlen(src)}};
    struct rel r;
    hk_report rep = HK_REPORT_INIT;
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(
        hkn_release_sign(&k, "k", 1, now, now + 60, b, 2, &r.manifest, &r.len, &r.sig, &rep), 0);
    ck_assert_msg(strstr(r.manifest, "\"header\""), "%s", r.manifest);
    hkn_trust t = trust_of(&k);
    hkn_state *s;
    ck_assert_int_eq(hkn_state_open(NULL, &s, &rep), 0);
    hkn_manifest m;
    ck_assert_int_eq(verify(&t, s, &r, &rep, &m), 0);
    ck_assert_uint_eq(m.nartifacts, 2);
    ck_assert_str_eq(m.artifacts[0].name, "common.cuh");
    ck_assert_int_eq(m.artifacts[0].header, 1);
    ck_assert_int_eq(m.artifacts[1].header, 0);
    ck_assert_int_eq(m.artifacts[1].format, HK_FORMAT_CUDA_C);
    /* The kernel is applied, never the header, even when it comes first. */
    ck_assert_uint_eq(hkn_pick_artifact(&m, "sm_90"), 1);
    ck_assert_uint_eq(hkn_pick_artifact(&m, NULL), 1);
    /* The header is hashed like any artifact. */
    ck_assert_int_eq(hkn_verify_artifact(&m.artifacts[0], hdr, strlen(hdr), &rep), 0);
    ck_assert_int_eq(hkn_verify_artifact(&m.artifacts[0], "#define K 4\n", 12, &rep), HK_ERR_HASH);
    const void *bytes[2] = {hdr, src};
    size_t sizes[2] = {strlen(hdr), strlen(src)};
    hk_header h[HKN_MAX_ARTIFACTS];
    ck_assert_int_eq(hkn_release_headers(&m, bytes, sizes, h), 1);
    ck_assert_str_eq(h[0].name, "common.cuh");
    ck_assert_ptr_eq(h[0].data, hdr);
    ck_assert_uint_eq(h[0].size, strlen(hdr));
    /* The signature covers the header entry like the rest. */
    char *at = strstr(r.manifest, "\"header\"");
    memcpy(at, "\"cuda\"  ", 8);
    hkn_manifest m2;
    ck_assert_int_eq(verify(&t, s, &r, &rep, &m2), HK_ERR_SIGNATURE);
    hkn_manifest_free(&m);
    rel_free(&r);
    /* Headers alone are not a release. */
    ck_assert_int_eq(
        hkn_release_sign(&k, "k", 2, now, now + 60, b, 1, &r.manifest, &r.len, &r.sig, &rep),
        HK_ERR_INVALID);
    static const char only[] = "{\"module\":\"k\",\"version\":3,\"created\":1,"
                               "\"expires\":9999999999,\"artifacts\":[{\"name\":\"a.cuh\","
                               "\"sha256\":\"0000000000000000000000000000000000000000000000000000"
                               "000000000000\",\"size\":1,\"format\":\"header\"}]}";
    ck_assert_int_eq(hkn_manifest_parse(only, strlen(only), &m, &rep), HK_ERR_INVALID);
    ck_assert_msg(strstr(rep.message, "only headers"), "%s", rep.message);
    hk_report_clear(&rep);
    hkn_state_close(s);
}
END_TEST

/* Versions near 2^53 are written exactly: cJSON's own number printing
 * rounds 8888888888888881 to 15 digits, so a recorded version read back
 * lower than accepted (found by fuzzing the state file). */
START_TEST(large_versions_recorded_exactly) {
    char *dir = hkt_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/accepted.json", dir);
    ck_assert_int_eq(hkt_write_file(path, "{\"modules\":{\"add\":8888888888888880}}"), 0);
    hk_report rep = HK_REPORT_INIT;
    hkn_state *s;
    ck_assert_int_eq(hkn_state_open(dir, &s, &rep), 0);
    uint64_t v = 0;
    ck_assert_int_eq(hkn_state_accept(s, "add", UINT64_C(8888888888888881), &rep), 0);
    ck_assert_int_eq(hkn_state_lookup(s, "add", &v, &rep), 0);
    ck_assert_uint_eq(v, UINT64_C(8888888888888881));
    hkn_state_close(s);
    ck_assert_int_eq(hkn_state_open(dir, &s, &rep), 0); /* from the file */
    ck_assert_int_eq(hkn_state_lookup(s, "add", &v, &rep), 0);
    ck_assert_uint_eq(v, UINT64_C(8888888888888881));
    hkn_state_close(s);
    /* And a manifest says exactly the version it was signed for. */
    hkn_seckey k;
    ck_assert_int_eq(hkn_keygen(&k), 0);
    static const char src[] = "extern \"C\" __global__ void k() {}\n";
    hkn_blob b = {.name = "k.cu", .bytes = src, .size = strlen(src)};
    char *json = NULL, *sig = NULL;
    size_t len = 0;
    uint64_t big = (UINT64_C(1) << 53) - 1;
    ck_assert_int_eq(
        hkn_release_sign(&k, "k", big, 1700000000, 1700000600, &b, 1, &json, &len, &sig, &rep), 0);
    hkn_manifest m;
    ck_assert_msg(hkn_manifest_parse(json, len, &m, &rep) == 0, "%s", rep.message);
    ck_assert_uint_eq(m.version, big);
    ck_assert_ptr_nonnull(strstr(json, "9007199254740991"));
    hkn_manifest_free(&m);
    free(json);
    free(sig);
    hk_report_clear(&rep);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("release");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, refused_memory_per_module);
    tcase_add_test(tc, sign_and_verify);
    tcase_add_test(tc, bad_signature);
    tcase_add_test(tc, missing_signature);
    tcase_add_test(tc, unknown_key);
    tcase_add_test(tc, expired);
    tcase_add_test(tc, replay_same_and_lower);
    tcase_add_test(tc, hash_and_size_mismatch);
    tcase_add_test(tc, state_survives_restart);
    tcase_add_test(tc, key_files);
    tcase_add_test(tc, manifest_fields_checked);
    tcase_add_test(tc, artifact_choice);
    tcase_add_test(tc, release_carries_headers);
    tcase_add_test(tc, two_processes_merge);
    tcase_add_test(tc, slower_process_refused);
    tcase_add_test(tc, corrupt_state_fails_closed);
    tcase_add_test(tc, large_versions_recorded_exactly);
    tcase_add_test(tc, stale_temp_files_cleaned);
    tcase_add_test(tc, state_others_can_change_is_refused);
    tcase_add_test(tc, state_lock_held_by_a_stopped_process);
    tcase_add_test(tc, strict_manifest_text);
    tcase_add_test(tc, lifetime_and_future_creation);
    tcase_add_test(tc, key_file_kinds_and_modes);
    tcase_add_test(tc, signed_rollback_requests);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    return hkt_run(suite());
}

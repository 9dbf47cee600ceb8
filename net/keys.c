/*
 * Threshold signatures and the signed key list (since 1.5).
 *
 * A signed document (a manifest, a key list) is its exact bytes plus a
 * signature file beside it (DOC.sig). That file holds one signature a line,
 * "KEYID SIGNATURE" (the key id, 16 hex chars, a space, the Ed25519
 * signature in base64), or, as in 1.4 and before, one bare signature. The
 * signatures stay outside the signed bytes, so a co-signer adds a line to a
 * document already published (`hotkern cosign`) without changing what the
 * others signed, and a host of 1.4 still reads a release signed by one key.
 *
 * Counting. A host trusts a set of keys and a threshold k (hkn_trust; k 0
 * means 1, the behaviour of 1.4). A document is accepted when at least k
 * DISTINCT trusted keys signed it validly: a key that signed twice counts
 * once, a line naming an unknown key is ignored, and a line that does not
 * verify counts for nothing. A refusal names what counted and what was
 * missing ("1 of 2 required signatures (trusted keys ...: valid a1b2...;
 * missing c3d4...)"), always HK_ERR_SIGNATURE, so every refusal of a
 * signature reads the same to the endpoint's status codes and the fleet's
 * "signature" refusal reason.
 *
 * The key list (keys.json, TUF's root in small): {"type": "hotkern-keys",
 * "version", "threshold", "expires" (0: never), "keys": [{"id", "public"}]}.
 * It replaces the trusted keys and threshold at run time when it is signed
 * by k of the keys trusted now AND by its own threshold of its own keys (a
 * rotation cannot hand the fleet to keys nobody holds), its version is
 * greater than the one in force (rollback protection) and it has not
 * expired. The accepted text is kept in the state directory beside
 * accepted.json (net/state.c) and read back at each verification, so that
 * every source sharing the directory, and a restarted host, uses it: the
 * directory is trusted as the anti-rollback record is, and the list is not
 * verified again. The keys a source is configured with stand until one is
 * accepted. A key list past its expiry refuses releases (HK_ERR_EXPIRED)
 * until a newer one is accepted, which its keys can still sign.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "net/net.h"

#define HKN_MAX_JSON_INT 9007199254740991.0

/* ---- keys and signatures' text (below release.c, which uses them) ------ */

int hkn_crypto_init(void) {
    /* sodium_init is itself thread-safe and idempotent (returns 1 when done). */
    return sodium_init() < 0 ? HK_ERR_UNSUPPORTED : 0;
}

void hkn_key_id(const unsigned char pk[HKN_PK_BYTES], char id[HKN_KEY_ID_CHARS + 1]) {
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, pk, HKN_PK_BYTES);
    sodium_bin2hex(id, HKN_KEY_ID_CHARS + 1, h, HKN_KEY_ID_CHARS / 2);
}

int hkn_decode_fixed(const char *text, size_t tlen, unsigned char *out, size_t len) {
    while (tlen > 0 && (text[tlen - 1] == '\n' || text[tlen - 1] == '\r' || text[tlen - 1] == ' ' ||
                        text[tlen - 1] == '\t'))
        tlen--;
    while (tlen > 0 && (*text == ' ' || *text == '\t' || *text == '\n' || *text == '\r')) {
        text++;
        tlen--;
    }
    size_t got = 0;
    if (tlen == 2 * len) {
        if (sodium_hex2bin(out, len, text, tlen, NULL, &got, NULL) == 0 && got == len)
            return 0;
    }
    if (sodium_base642bin(out, len, text, tlen, NULL, &got, NULL, sodium_base64_VARIANT_ORIGINAL) ==
            0 &&
        got == len)
        return 0;
    return HK_ERR_INVALID;
}

/* ---- the signature file ------------------------------------------------- */

typedef struct sig_line {
    char id[HKN_KEY_ID_CHARS + 1]; /* "" for a bare (1.4) signature */
    unsigned char sig[HKN_SIG_BYTES];
    int ok; /* decoded */
} sig_line;

/* Splits the signature file's text into lines; *n of them. HK_ERR_SIGNATURE
 * for more than HKN_MAX_SIGS or a line of neither form. */
static int parse_sigs(const char *text, size_t len, sig_line *out, int *n, hk_report *rep) {
    *n = 0;
    size_t i = 0;
    for (int line = 1; i < len; line++) {
        size_t end = i;
        while (end < len && text[end] != '\n')
            end++;
        const char *l = text + i;
        size_t ll = end - i;
        i = end + 1;
        while (ll && (l[ll - 1] == '\r' || l[ll - 1] == ' ' || l[ll - 1] == '\t'))
            ll--;
        while (ll && (*l == ' ' || *l == '\t')) {
            l++;
            ll--;
        }
        if (!ll)
            continue;
        if (*n == HKN_MAX_SIGS)
            return hku_fail(rep, HK_ERR_SIGNATURE, "more than %d signatures", HKN_MAX_SIGS);
        sig_line *s = &out[(*n)++];
        memset(s, 0, sizeof *s);
        const char *sp = memchr(l, ' ', ll);
        if (sp) {
            size_t idlen = (size_t)(sp - l);
            if (idlen != HKN_KEY_ID_CHARS || strspn(l, "0123456789abcdef") < idlen)
                return hku_fail(rep, HK_ERR_SIGNATURE,
                                "signature line %d is not 'KEYID SIGNATURE' (a key id of %d "
                                "lowercase hex chars, a space, base64)",
                                line, HKN_KEY_ID_CHARS);
            memcpy(s->id, l, idlen);
            ll -= idlen + 1;
            l = sp + 1;
        }
        s->ok = hkn_decode_fixed(l, ll, s->sig, sizeof s->sig) == 0;
    }
    return 0;
}

/* Appends sep and s to the string in buf (cap bytes in all). */
static void append(char *buf, size_t cap, const char *sep, const char *s) {
    size_t n = strlen(buf);
    if (n < cap)
        snprintf(buf + n, cap - n, "%s%s", sep, s);
}

int hkn_signatures_verify(const hkn_trust *t, const char *what, const char *text, size_t len,
                          const char *sig, size_t sig_len, const char *claimed_id,
                          const hkn_pubkey **legacy, hk_report *rep) {
    sig_line lines[HKN_MAX_SIGS];
    int n = 0, valid[HKN_MAX_KEYS] = {0}, count = 0, unknown = 0, bad = 0, garbled = 0;
    int k = t->threshold > 0 ? t->threshold : 1;
    char ids[HKN_MAX_KEYS * (HKN_KEY_ID_CHARS + 2) + 1] = "";
    if (legacy)
        *legacy = NULL;
    for (int i = 0; i < t->nkeys; i++)
        append(ids, sizeof ids, i ? ", " : "", t->keys[i].id);
    if (hkn_crypto_init())
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "libsodium failed to initialise");
    if (t->nkeys == 0)
        return hku_fail(rep, HK_ERR_SIGNATURE,
                        "no trusted public key is configured and unsigned %ss are not allowed",
                        what);
    if (!sig || sig_len == 0)
        return hku_fail(rep, HK_ERR_SIGNATURE, "%s has no signature (expected Ed25519 by key %s)",
                        what, ids);
    int err = parse_sigs(sig, sig_len, lines, &n, rep);
    if (err)
        return err;
    for (int j = 0; j < n; j++) {
        int hit = -1;
        garbled += !lines[j].ok;
        for (int i = 0; lines[j].ok && i < t->nkeys && hit < 0; i++) {
            if (lines[j].id[0] && strcmp(lines[j].id, t->keys[i].id))
                continue;
            if (crypto_sign_verify_detached(lines[j].sig, (const unsigned char *)text, len,
                                            t->keys[i].pk) == 0)
                hit = i;
            else if (lines[j].id[0])
                break; /* the named key, and it does not verify */
        }
        if (hit >= 0) {
            count += !valid[hit];
            valid[hit] = 1;
            if (legacy && !lines[j].id[0] && n == 1)
                *legacy = &t->keys[hit];
            continue;
        }
        int named_known = 0;
        for (int i = 0; lines[j].id[0] && i < t->nkeys; i++)
            named_known |= !strcmp(lines[j].id, t->keys[i].id);
        if (lines[j].ok && lines[j].id[0] && !named_known)
            unknown++;
        else if (lines[j].ok)
            bad++;
    }
    if (count >= k)
        return 0;
    /* One bare signature against one required: the words of 1.4. */
    if (k == 1 && n == 1 && !lines[0].id[0]) {
        if (!lines[0].ok)
            return hku_fail(rep, HK_ERR_SIGNATURE,
                            "signature is not 64 bytes in base64 or hex (got %zu chars)", sig_len);
        int known = 0;
        for (int i = 0; claimed_id && i < t->nkeys; i++)
            known |= !strcmp(claimed_id, t->keys[i].id);
        if (!known)
            return hku_fail(rep, HK_ERR_SIGNATURE, "unknown signing key '%s' (trusted: %s)",
                            claimed_id ? claimed_id : "", ids);
        return hku_fail(rep, HK_ERR_SIGNATURE, "bad signature: %s does not verify with key %s",
                        what, claimed_id);
    }
    char have[sizeof ids] = "", missing[sizeof ids] = "", extra[192] = "";
    for (int i = 0; i < t->nkeys; i++) {
        char *dst = valid[i] ? have : missing;
        append(dst, sizeof have, dst[0] ? ", " : "", t->keys[i].id);
    }
    if (unknown || bad || garbled)
        snprintf(extra, sizeof extra,
                 "; ignored: %d by unknown keys, %d that do not verify, %d "
                 "not 64 bytes of base64",
                 unknown, bad, garbled);
    return hku_fail(rep, HK_ERR_SIGNATURE,
                    "%s: %d of %d required signatures (trusted keys %s: valid %s; missing %s)%s",
                    what, count, k, ids, have[0] ? have : "none", missing[0] ? missing : "none",
                    extra);
}

int hkn_signature_line(const hkn_seckey *key, const char *text, size_t len, char line[160]) {
    unsigned char sig[HKN_SIG_BYTES];
    char b64[sodium_base64_ENCODED_LEN(HKN_SIG_BYTES, sodium_base64_VARIANT_ORIGINAL)];
    if (hkn_crypto_init())
        return HK_ERR_UNSUPPORTED;
    crypto_sign_detached(sig, NULL, (const unsigned char *)text, len, key->sk);
    sodium_bin2base64(b64, sizeof b64, sig, sizeof sig, sodium_base64_VARIANT_ORIGINAL);
    snprintf(line, 160, "%s %s\n", key->pub.id, b64);
    return 0;
}

int hkn_signatures_add(const hkn_seckey *key, const char *text, size_t len, const char *old,
                       size_t old_len, const char *bare_id, char **out, hk_report *rep) {
    sig_line lines[HKN_MAX_SIGS];
    int n = 0, err;
    *out = NULL;
    if (old && old_len && (err = parse_sigs(old, old_len, lines, &n, rep)))
        return err;
    size_t cap = (size_t)(n + 1) * 160 + 1, used = 0;
    char *buf = malloc(cap), mine[160];
    if (!buf)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    buf[0] = '\0';
    for (int j = 0; j < n; j++) {
        const char *id = lines[j].id[0] ? lines[j].id : bare_id ? bare_id : "";
        if (!strcmp(id, key->pub.id) || !lines[j].ok)
            continue; /* signed anew below, or nothing a host could use */
        if (strlen(id) != HKN_KEY_ID_CHARS) {
            free(buf);
            return hku_fail(rep, HK_ERR_INVALID,
                            "the bare signature's key id is not known (the document names none)");
        }
        char b64[sodium_base64_ENCODED_LEN(HKN_SIG_BYTES, sodium_base64_VARIANT_ORIGINAL)];
        sodium_bin2base64(b64, sizeof b64, lines[j].sig, HKN_SIG_BYTES,
                          sodium_base64_VARIANT_ORIGINAL);
        used += (size_t)snprintf(buf + used, cap - used, "%s %s\n", id, b64);
    }
    if ((err = hkn_signature_line(key, text, len, mine))) {
        free(buf);
        return hku_fail(rep, err, "libsodium failed to initialise");
    }
    snprintf(buf + used, cap - used, "%s", mine);
    *out = buf;
    return 0;
}

/* ---- the key list ------------------------------------------------------- */

static int list_fail(hk_report *rep, const char *why) {
    return hku_fail(rep, HK_ERR_INVALID,
                    "key list: %s (expected {\"type\": \"hotkern-keys\", \"version\" >= 1, "
                    "\"threshold\" 1..keys, \"expires\" (0: never), \"keys\": [{\"id\", "
                    "\"public\"}], 1 to %d distinct keys})",
                    why, HKN_MAX_KEYS);
}

static int json_uint(const cJSON *o, const char *name, int required, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = 0;
    if (!v)
        return required ? -1 : 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!(d >= 0) || d > HKN_MAX_JSON_INT || floor(d) != d)
        return -1;
    *out = (uint64_t)d;
    return 0;
}

int hkn_keylist_parse(const char *json, size_t len, hkn_trust *out, hk_report *rep) {
    memset(out, 0, sizeof *out);
    uint64_t version, threshold, expires;
    int err = 0;
    cJSON *root = hkn_json_parse_strict(json, len);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "type");
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(root, "keys"), *k;
    if (!cJSON_IsObject(root) || !cJSON_IsString(type) || strcmp(type->valuestring, "hotkern-keys"))
        err = list_fail(rep, "not one JSON object of type \"hotkern-keys\"");
    else if (json_uint(root, "version", 1, &version) || version < 1)
        err = list_fail(rep, "\"version\" is not an integer of at least 1");
    else if (json_uint(root, "threshold", 1, &threshold) || json_uint(root, "expires", 0, &expires))
        err = list_fail(rep, "\"threshold\" or \"expires\" is not an integer");
    else if (!cJSON_IsArray(keys) || cJSON_GetArraySize(keys) < 1 ||
             cJSON_GetArraySize(keys) > HKN_MAX_KEYS)
        err = list_fail(rep, "\"keys\" is not an array of 1 to 8");
    if (err)
        goto out;
    cJSON_ArrayForEach(k, keys) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(k, "id");
        const cJSON *pub = cJSON_GetObjectItemCaseSensitive(k, "public");
        hkn_pubkey *pk = &out->keys[out->nkeys];
        if (!cJSON_IsString(pub) ||
            hkn_decode_fixed(pub->valuestring, strlen(pub->valuestring), pk->pk, HKN_PK_BYTES)) {
            err = list_fail(rep, "a key's \"public\" is not 64 hex or 44 base64 chars");
            goto out;
        }
        hkn_key_id(pk->pk, pk->id);
        if (id && (!cJSON_IsString(id) || strcmp(id->valuestring, pk->id))) {
            err = hku_fail(rep, HK_ERR_INVALID, "key list: key %d's \"id\" is not %s, its key's id",
                           out->nkeys + 1, pk->id);
            goto out;
        }
        for (int i = 0; i < out->nkeys; i++)
            if (!strcmp(out->keys[i].id, pk->id)) {
                err = hku_fail(rep, HK_ERR_INVALID, "key list: key %s appears twice", pk->id);
                goto out;
            }
        out->nkeys++;
    }
    if (threshold < 1 || threshold > (uint64_t)out->nkeys) {
        err = hku_fail(rep, HK_ERR_INVALID, "key list: threshold %llu, with %d key(s): 1 to %d",
                       (unsigned long long)threshold, out->nkeys, out->nkeys);
        goto out;
    }
    out->version = version;
    out->threshold = (int)threshold;
    out->expires = (int64_t)expires;
out:
    cJSON_Delete(root);
    if (err)
        memset(out, 0, sizeof *out);
    return err;
}

int hkn_keylist_write(const hkn_trust *l, char **json, size_t *len, hk_report *rep) {
    cJSON *root = cJSON_CreateObject(), *keys = NULL;
    *json = NULL;
    int ok = root && cJSON_AddStringToObject(root, "type", "hotkern-keys") &&
             hkn_json_add_int(root, "version", (long long)l->version) &&
             hkn_json_add_int(root, "threshold", l->threshold) &&
             hkn_json_add_int(root, "expires", (long long)l->expires) &&
             (keys = cJSON_AddArrayToObject(root, "keys"));
    for (int i = 0; ok && i < l->nkeys; i++) {
        char hex[2 * HKN_PK_BYTES + 1];
        cJSON *o = cJSON_CreateObject();
        sodium_bin2hex(hex, sizeof hex, l->keys[i].pk, HKN_PK_BYTES);
        ok = o && cJSON_AddItemToArray(keys, o) &&
             cJSON_AddStringToObject(o, "id", l->keys[i].id) &&
             cJSON_AddStringToObject(o, "public", hex);
    }
    if (ok)
        *json = cJSON_Print(root);
    cJSON_Delete(root);
    if (!*json)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory writing the key list");
    *len = strlen(*json);
    /* What is signed must read back as itself. */
    hkn_trust back;
    int err = hkn_keylist_parse(*json, *len, &back, rep);
    if (err) {
        free(*json);
        *json = NULL;
    }
    return err;
}

/* The version of a key list's text (0: NULL text), -1 when it does not
 * read: how the state compares the list it records with a new one. */
static int64_t list_version(const char *text, size_t len) {
    hkn_trust t;
    hk_report r = HK_REPORT_INIT;
    int err = text ? hkn_keylist_parse(text, len, &t, &r) : 0;
    hk_report_clear(&r);
    return err ? -1 : text ? (int64_t)t.version : 0;
}

/* ---- the keys in force -------------------------------------------------- */

int hkn_trust_current(const hkn_trust *configured, hkn_state *s, hkn_trust *out, hk_report *rep) {
    char *text = NULL;
    size_t len = 0;
    *out = *configured;
    int err = s ? hkn_state_keys_read(s, &text, &len, rep) : 0;
    if (err || !text)
        return err;
    hk_report r = HK_REPORT_INIT;
    if ((err = hkn_keylist_parse(text, len, out, &r)))
        err = hku_fail(rep, HK_ERR_IO,
                       "the accepted key list in %s is corrupt (%s): fix or remove it",
                       hkn_state_path(s), r.message);
    out->allow_unsigned = configured->allow_unsigned;
    hk_report_clear(&r);
    free(text);
    return err;
}

int hkn_keylist_accept(const hkn_trust *configured, hkn_state *s, const char *json, size_t len,
                       const char *sig, size_t sig_len, int64_t now, hkn_trust *out,
                       hk_report *rep) {
    hkn_trust cur;
    memset(out, 0, sizeof *out);
    int err = hkn_trust_current(configured, s, &cur, rep);
    if (err)
        return err;
    /* Signed by the keys in force first: nothing of an unauthenticated
     * list is read before. */
    if ((err = hkn_signatures_verify(&cur, "key list", json, len, sig, sig_len, NULL, NULL, rep)))
        return err;
    if ((err = hkn_keylist_parse(json, len, out, rep)))
        return err;
    hk_report r = HK_REPORT_INIT;
    if ((err = hkn_signatures_verify(out, "key list", json, len, sig, sig_len, NULL, NULL, &r))) {
        err = hku_fail(rep, HK_ERR_SIGNATURE, "key list v%llu is not signed by its own keys: %s",
                       (unsigned long long)out->version, r.message);
        hk_report_clear(&r);
        goto fail;
    }
    if (out->version <= cur.version) {
        err = hku_fail(rep, HK_ERR_REPLAY,
                       "key list v%llu is not newer than the key list in force, v%llu (%s)",
                       (unsigned long long)out->version, (unsigned long long)cur.version,
                       out->version == cur.version ? "same version" : "older version");
        goto fail;
    }
    if (out->expires && out->expires <= now) {
        err = hku_fail(rep, HK_ERR_EXPIRED, "key list v%llu expired at %lld, %lld s ago",
                       (unsigned long long)out->version, (long long)out->expires,
                       (long long)(now - out->expires));
        goto fail;
    }
    if ((err = hkn_state_keys_write(s, json, len, out->version, list_version, rep)))
        goto fail;
    out->allow_unsigned = configured->allow_unsigned;
    return 0;
fail:
    memset(out, 0, sizeof *out);
    return err;
}

void hkn_trust_describe(const hkn_trust *t, char *buf, size_t cap) {
    snprintf(buf, cap, "%s v%llu: %d of", t->version ? "key list" : "configured keys",
             (unsigned long long)t->version, t->threshold > 0 ? t->threshold : 1);
    for (int i = 0; i < t->nkeys; i++)
        append(buf, cap, " ", t->keys[i].id);
}

/*
 * Threshold signatures from the tool: `hotkern cosign` and `hotkern keys`.
 *
 * A release or key list signed by several keys carries one "KEYID
 * SIGNATURE" line per key in DOC.sig (net/keys.c). `hotkern sign --key A
 * --key B` signs with every key at once, where one publisher holds them
 * all; where the keys belong to different people, the publisher signs with
 * its own and each co-signer adds a line to what is already published with
 * `hotkern cosign`, which never changes the signed bytes (a host that polls
 * meanwhile refuses the release for its missing signatures and takes it at
 * the poll after the last co-signature). That is why cosign is a verb of
 * its own rather than an option of sign, which makes a new manifest: the
 * others' signatures of the old bytes would not hold for it.
 *
 * `hotkern keys sign` (alias publish) writes a key list (keys.json and
 * keys.json.sig) into an origin's directory, beside the manifest, where
 * pullers poll it; `hotkern keys push` posts one to an endpoint. Both the
 * signature file and the list are replaced atomically, the signature first.
 *
 * What every signing command shares lives here too: the --key list's
 * loading and the signature file of several keys (hkc_sign_lines), used by
 * sign and push (cli/net_cmds.c) and the rollout commands (cli/rollout.c).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "cli/cli.h"
#include "net/net.h"

/* ---- what every signing command shares ---------------------------------- */

int hkc_keys_load(hkc_out *o, const hkc_list *paths, hkn_seckey *keys) {
    hk_report rep = HK_REPORT_INIT;
    if (paths->n < 1 || paths->n > HKN_MAX_KEYS)
        return hkc_usage(o, "give 1 to %d --key SECRET", HKN_MAX_KEYS);
    for (int i = 0; i < paths->n; i++)
        if (hkn_seckey_load(paths->v[i], &keys[i], &rep)) {
            int rc = hkc_fail_report(o, &rep);
            hk_report_clear(&rep);
            return rc;
        }
    return 0;
}

int hkc_sign_lines(hkc_out *o, const hkn_seckey *keys, int nkeys, const char *text, size_t len,
                   char **sig) {
    if (nkeys < 2)
        return 0; /* the one bare signature, as hosts of 1.4 read it */
    char *lines = calloc((size_t)nkeys, 160);
    if (!lines)
        return hkc_fail(o, HK_ERR_NOMEM, NULL, "out of memory");
    for (int i = 0; i < nkeys; i++)
        if (hkn_signature_line(&keys[i], text, len, lines + strlen(lines))) {
            free(lines);
            return hkc_fail(o, HK_ERR_UNSUPPORTED, NULL, "libsodium failed to initialise");
        }
    free(*sig);
    *sig = lines;
    return 0;
}

/* Adds each key's signature of text to the signature file at sig_path
 * (read first when it exists). bare_id names a bare line's key. */
static int add_signatures(hkc_out *o, const hkn_seckey *keys, int nkeys, const char *text,
                          size_t len, const char *sig_path, const char *bare_id) {
    hk_report rep = HK_REPORT_INIT;
    char *old = NULL, *cur = NULL;
    size_t old_len = 0;
    int rc = 0, err = hku_read_file(sig_path, HKN_FRAME_MAX_SIG, &old, &old_len, &rep);
    if (err && err != HK_ERR_NOT_FOUND)
        rc = hkc_fail_report(o, &rep);
    hk_report_clear(&rep);
    for (int i = 0; !rc && i < nkeys; i++) {
        char *next = NULL;
        if (hkn_signatures_add(&keys[i], text, len, cur ? cur : old, cur ? strlen(cur) : old_len,
                               bare_id, &next, &rep)) {
            rc = hkc_fail_report(o, &rep);
            break;
        }
        free(cur);
        cur = next;
    }
    if (!rc && hku_write_atomic(sig_path, cur, strlen(cur), 0644, &rep))
        rc = hkc_fail_report(o, &rep);
    if (!rc) {
        int lines = 0;
        for (const char *c = cur; *c; c++)
            lines += *c == '\n';
        printf("%s: %d signature(s)\n", sig_path, lines);
    }
    free(old);
    free(cur);
    hk_report_clear(&rep);
    return rc;
}

/* ---- cosign ------------------------------------------------------------- */

static const char cosign_help[] =
    "usage: hotkern cosign --key SECRET [--key SECRET...] FILE\n\n"
    "Adds each key's signature of FILE (a manifest.json or keys.json already\n"
    "published) to FILE.sig, one 'KEYID SIGNATURE' line per key: a line of the\n"
    "same key is replaced, the others kept (a bare signature, as one --key of\n"
    "'hotkern sign' writes, becomes the line of the key the manifest names).\n"
    "FILE itself is not changed. Hosts with a signature_threshold of k take\n"
    "the release once k keys they trust signed it.\n";

int hkc_cmd_cosign(int argc, char **argv) {
    hkc_list paths = {0};
    hkn_seckey keys[HKN_MAX_KEYS];
    int nargs = 0;
    const hkc_opt opts[] = {HKC_LIST_OPT("--key", &paths)};
    hkc_out o;
    hk_report rep = HK_REPORT_INIT;
    char *text = NULL, sig_path[PATH_MAX], bare[HKN_KEY_ID_CHARS + 1] = "";
    size_t len = 0;
    int rc = hkc_parse(&o, "cosign", opts, HKC_NOPTS(opts), cosign_help, argc, argv, &nargs);
    if (rc == HKC_CONTINUE && nargs != 1)
        rc = hkc_usage(&o, "give one FILE (the manifest.json or keys.json to co-sign)");
    if (rc == HKC_CONTINUE && !(rc = hkc_keys_load(&o, &paths, keys))) {
        if (hku_read_file(argv[1], HKN_FRAME_MAX_MANIFEST, &text, &len, &rep)) {
            rc = hkc_fail_report(&o, &rep);
        } else {
            /* Only to name a bare signature's key: the id the manifest claims. */
            cJSON *root = cJSON_ParseWithLength(text, len);
            const cJSON *k = cJSON_GetObjectItemCaseSensitive(root, "key_id");
            if (cJSON_IsString(k) && strlen(k->valuestring) == HKN_KEY_ID_CHARS)
                memcpy(bare, k->valuestring, sizeof bare);
            cJSON_Delete(root);
            snprintf(sig_path, sizeof sig_path, "%s.sig", argv[1]);
            rc = add_signatures(&o, keys, paths.n, text, len, sig_path, bare[0] ? bare : NULL);
        }
    }
    sodium_memzero(keys, sizeof keys);
    hkc_list_free(&paths);
    hk_report_clear(&rep);
    free(text);
    return rc == HKC_CONTINUE ? 0 : rc;
}

/* ---- keys --------------------------------------------------------------- */

static const char keys_help[] =
    "usage: hotkern keys sign --key SECRET [--key SECRET...] --list-version N\n"
    "       --threshold K [--expires-in SECONDS] --out DIR PUBLIC...\n"
    "       hotkern keys push URL [--token T] FILE\n\n"
    "sign (alias publish) writes a key list that replaces the keys hosts trust,\n"
    "without a restart: DIR/keys.json (the PUBLIC key files, threshold K,\n"
    "version N, expiry; --expires-in 0, the default, never expires) and\n"
    "DIR/keys.json.sig, one line per --key. Hosts take it when K' of the keys\n"
    "they trust now signed it (their threshold) and K of its own keys did, and\n"
    "N is above the version of the list they trust; pullers poll DIR/keys.json\n"
    "beside the manifest. 'hotkern cosign --key SECRET DIR/keys.json' adds a\n"
    "co-signer's line.\n"
    "push POSTs FILE (a keys.json, its signature at FILE.sig) to URL/v1/keys.\n" HKC_HTTP_HELP
    "Exit status: 0 written or taken, 1 refused or failed, 2 usage.\n";

static int keys_sign(int argc, char **argv) {
    hkc_list paths = {0};
    hkn_seckey keys[HKN_MAX_KEYS];
    uint64_t version = 0, threshold = 0, expires_in = 0;
    const char *out = NULL;
    int nargs = 0;
    const hkc_opt opts[] = {
        HKC_LIST_OPT("--key", &paths),
        HKC_UINT_OPT("--list-version", &version, 1, HKC_MAX_RELEASE,
                     "--list-version needs an integer from 1 to 2^53-1"),
        HKC_UINT_OPT("--threshold", &threshold, 1, HKN_MAX_KEYS,
                     "--threshold needs an integer from 1 to 8"),
        HKC_UINT_OPT("--expires-in", &expires_in, 0, 10 * 366 * 86400ull,
                     "--expires-in needs seconds from 0 (never) to ten years"),
        HKC_STRING_OPT("--out", &out),
    };
    hkc_out o;
    hk_report rep = HK_REPORT_INIT;
    hkn_trust l;
    char *text = NULL, path[PATH_MAX];
    size_t len = 0;
    memset(&l, 0, sizeof l);
    int rc = hkc_parse(&o, "keys sign", opts, HKC_NOPTS(opts), keys_help, argc, argv, &nargs);
    if (rc == HKC_CONTINUE && (!version || !threshold || !out || nargs < 1 || nargs > HKN_MAX_KEYS))
        rc = hkc_usage(&o,
                       "--key, --list-version, --threshold, --out and 1 to %d PUBLIC key "
                       "files are required",
                       HKN_MAX_KEYS);
    if (rc == HKC_CONTINUE)
        rc = hkc_keys_load(&o, &paths, keys);
    for (int i = 0; !rc && i < nargs; i++, l.nkeys++)
        if (hkn_pubkey_load(argv[i + 1], &l.keys[i], &rep))
            rc = hkc_fail_report(&o, &rep);
    l.version = version;
    l.threshold = (int)threshold;
    l.expires = expires_in ? (int64_t)time(NULL) + (int64_t)expires_in : 0;
    if (!rc && hkn_keylist_write(&l, &text, &len, &rep))
        rc = hkc_fail_report(&o, &rep);
    snprintf(path, sizeof path, "%s/keys.json.sig", out ? out : ".");
    if (!rc) {
        remove(path); /* signatures of an older list do not hold for this one */
        rc = add_signatures(&o, keys, paths.n, text, len, path, NULL);
    }
    snprintf(path, sizeof path, "%s/keys.json", out ? out : ".");
    if (!rc && hku_write_atomic(path, text, len, 0644, &rep))
        rc = hkc_fail_report(&o, &rep);
    if (!rc)
        printf("key list v%llu written to %s: %d key(s), threshold %d\n",
               (unsigned long long)version, path, l.nkeys, l.threshold);
    sodium_memzero(keys, sizeof keys);
    hkc_list_free(&paths);
    hk_report_clear(&rep);
    free(text);
    return rc == HKC_CONTINUE ? 0 : rc;
}

static int keys_push(int argc, char **argv) {
    hkc_http_opts ho = {.token = getenv("HOTKERN_TOKEN"), .timeout_s = 30};
    int nargs = 0;
    const hkc_opt opts[] = {HKC_HTTP_OPTS(&ho)};
    hkc_out o;
    hk_report rep = HK_REPORT_INIT;
    char *doc = NULL, *sig = NULL, *body = NULL, path[PATH_MAX];
    size_t dlen = 0, slen = 0;
    hkc_resp resp = {0};
    int rc = hkc_parse(&o, "keys push", opts, HKC_NOPTS(opts), keys_help, argc, argv, &nargs);
    if (rc == HKC_CONTINUE && nargs != 2)
        rc = hkc_usage(&o, "give URL and FILE (a keys.json)");
    if (rc == HKC_CONTINUE) {
        snprintf(path, sizeof path, "%s.sig", argv[2]);
        rc = 0;
        if (hku_read_file(argv[2], 64 << 10, &doc, &dlen, &rep) ||
            hku_read_file(path, HKN_FRAME_MAX_SIG, &sig, &slen, &rep))
            rc = hkc_fail_report(&o, &rep);
    }
    cJSON *b = rc ? NULL : cJSON_CreateObject();
    if (b && cJSON_AddStringToObject(b, "keys", doc) &&
        cJSON_AddStringToObject(b, "signature", sig))
        body = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    if (!rc && !body)
        rc = hkc_fail(&o, HK_ERR_NOMEM, NULL, "out of memory");
    if (!rc && !(rc = hkc_http(&o, "POST", argv[1], "/v1/keys", body, &ho, &resp))) {
        cJSON *a = hkn_json_parse_strict(resp.data ? resp.data : "", resp.len);
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(a, "message");
        const cJSON *kv = cJSON_GetObjectItemCaseSensitive(a, "keys_version");
        const cJSON *en = cJSON_GetObjectItemCaseSensitive(a, "error");
        if (resp.status == 200 && cJSON_IsNumber(kv)) {
            printf("key list v%.0f taken by %s\n", kv->valuedouble, argv[1]);
        } else {
            rc = 1;
            fprintf(stderr, "hotkern keys push: refused (HTTP %ld, %s): ", resp.status,
                    cJSON_IsString(en) ? en->valuestring : "no answer");
            hkc_put_clean(stderr, cJSON_IsString(msg) ? msg->valuestring : "", 0);
            fputc('\n', stderr);
        }
        cJSON_Delete(a);
    }
    hk_report_clear(&rep);
    free(resp.data);
    free(body);
    free(doc);
    free(sig);
    return rc == HKC_CONTINUE ? 0 : rc;
}

int hkc_cmd_keys(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "sign") || !strcmp(argv[1], "publish")))
        return keys_sign(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "push"))
        return keys_push(argc - 1, argv + 1);
    int help = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
    fputs(keys_help, help ? stdout : stderr);
    return help ? 0 : 2;
}

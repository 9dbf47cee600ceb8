/*
 * Binary frame pushes (net/frame.c): a frame commits, carries the same
 * signature as its JSON, is refused for each tampering with nothing
 * applied, is pushed by the CLI, and is held in memory once.
 */
#include "tests/endpoint/fixture.h"

/* ---- release frames (application/x-hotkern-release) -------------------- */

/* A signed release: its manifest's text and the signature's. */
struct signed_rel {
    char *manifest, *sig;
    size_t mlen;
};

static struct signed_rel sign_rel(const hkn_seckey *k, const char *module, uint64_t version,
                                  int64_t expires, const void *bytes, size_t size) {
    struct signed_rel s = {0};
    hk_report rep = HK_REPORT_INIT;
    hkn_blob b = {.name = "add.cu", .bytes = bytes, .size = size};
    ck_assert_int_eq(hkn_release_sign(k, module, version, time(NULL), expires, &b, 1, &s.manifest,
                                      &s.mlen, &s.sig, &rep),
                     0);
    return s;
}

static void rel_free(struct signed_rel *s) {
    free(s->manifest);
    free(s->sig);
}

enum ftamper {
    F_NONE,
    F_TRUNCATED, /* the body stops 10 bytes short of the frame */
    F_IN_HEAD,   /* the body stops inside the frame's header */
    F_LONGER,    /* the artifact's length says one byte more than there is */
    F_SHIFTED,   /* manifest one byte longer, artifact one shorter: same total */
    F_HUGE,      /* the artifact's length is 2^62 */
    F_MAGIC,
    F_VERSION,  /* version 2 */
    F_MANIFEST, /* the module renamed: the signature no longer covers it */
    F_BYTES,    /* an artifact byte changed */
    F_TWO,      /* two artifacts where the manifest names one */
    F_NO_SIG,
};

static void put64(unsigned char *p, uint64_t v) {
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

/* Writes the frame of s (whose artifact is bytes) into tmp/NAME, tampered
 * as t, and returns its path (valid for the next 15 calls). */
static const char *frame_of(struct signed_rel *s, const void *bytes, size_t size, enum ftamper t,
                            const char *name) {
    static char paths[16][PATH_MAX];
    static int next;
    char *path = paths[next++ % 16];
    hkn_blob b[2] = {{.name = "add.cu", .bytes = bytes, .size = size},
                     {.name = "add.cu", .bytes = bytes, .size = size}};
    unsigned char *f;
    size_t len;
    char *manifest = s->manifest;
    if (t == F_MANIFEST) {
        /* Still a manifest (it names the signer's key), but not the one signed. */
        manifest = strdup(s->manifest);
        strstr(manifest, "\"add\"")[3] = 'c';
    }
    ck_assert_int_eq(hkn_frame_write(manifest, s->mlen, s->sig, t == F_NO_SIG ? 0 : strlen(s->sig),
                                     b, t == F_TWO ? 2 : 1, &f, &len),
                     0);
    if (manifest != s->manifest)
        free(manifest);
    unsigned char *table = f + HKN_FRAME_HEAD;
    uint64_t alen = size;
    if (t == F_TRUNCATED)
        len -= 10;
    else if (t == F_IN_HEAD)
        len = 12;
    else if (t == F_LONGER)
        put64(table, alen + 1);
    else if (t == F_SHIFTED) {
        put64(table, alen - 1);
        f[15]++; /* the manifest length's low byte */
    } else if (t == F_HUGE)
        put64(table, 1ull << 62);
    else if (t == F_MAGIC)
        f[1] = 'X';
    else if (t == F_VERSION)
        f[9] = 2;
    else if (t == F_BYTES)
        f[len - size] ^= 1;
    snprintf(path, PATH_MAX, "%s/%s", tmp, name);
    ck_assert_int_eq(hku_write_atomic(path, f, len, 0644, NULL), 0);
    free(f);
    return path;
}

static const char *frame_file(const hkn_seckey *k, const char *module, uint64_t version,
                              int64_t expires, enum ftamper t, const char *name) {
    struct signed_rel s = sign_rel(k, module, version, expires, kernel_src, strlen(kernel_src));
    const char *path = frame_of(&s, kernel_src, strlen(kernel_src), t, name);
    rel_free(&s);
    return path;
}

static int json_has_text(const char *body, const char *field, const char *part) {
    cJSON *o = cJSON_Parse(body);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    int ok = cJSON_IsString(v) && strstr(v->valuestring, part);
    cJSON_Delete(o);
    return ok;
}

/* The state file's record of module is still `version`. */
static int state_is(const char *module, uint64_t version) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/state/accepted.json", tmp);
    return state_records(path, module, version);
}

START_TEST(frame_push_commits) {
    start(NULL, 0, NULL, NULL);
    body_type = HKN_FRAME_TYPE;
    char body[8192];
    int code = curl_req("POST", "/v1/release",
                        frame_file(&key, "add", 5, time(NULL) + 60, F_NONE, "f.bin"), NULL, body,
                        sizeof body);
    ck_assert_msg(code == 200, "HTTP %d: %s", code, body);
    ck_assert(json_has(body, "outcome", "committed"));
    ck_assert(json_has(body, "module", "add"));
    pthread_mutex_lock(&rec.lock);
    ck_assert_int_eq(rec.calls, 1);
    ck_assert_uint_eq(rec.version, 5);
    ck_assert_int_eq(rec.fmt, HK_FORMAT_CUDA_C);
    ck_assert_str_eq(rec.origin, "push");
    ck_assert_uint_eq(rec.size, strlen(kernel_src));
    ck_assert_mem_eq(rec.bytes, kernel_src, rec.size);
    pthread_mutex_unlock(&rec.lock);
    ck_assert(state_is("add", 5));
    /* The same frame sent in chunks (no Content-Length) commits too. */
    chunked = 1;
    code = curl_req("POST", "/v1/release",
                    frame_file(&key, "add", 6, time(NULL) + 60, F_NONE, "f6.bin"), NULL, body,
                    sizeof body);
    ck_assert_msg(code == 200, "HTTP %d: %s", code, body);
    ck_assert_uint_eq(rec_current(), 6);
}
END_TEST

/* One signature, either body: the frame carries the manifest's exact bytes
 * and the signature's text, as the JSON body's strings do. */
START_TEST(frame_and_json_carry_one_signature) {
    start(NULL, 0, NULL, NULL);
    struct signed_rel s = sign_rel(&key, "add", 7, time(NULL) + 60, kernel_src, strlen(kernel_src));
    const char *frame = frame_of(&s, kernel_src, strlen(kernel_src), F_NONE, "one.bin");
    char b64[256], path[PATH_MAX + 16], hex[65], body[8192];
    sodium_bin2base64(b64, sizeof b64, (const unsigned char *)kernel_src, strlen(kernel_src),
                      sodium_base64_VARIANT_ORIGINAL);
    hkn_sha256_hex(kernel_src, strlen(kernel_src), hex);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "manifest", s.manifest);
    cJSON_AddStringToObject(o, "signature", s.sig);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "artifacts"), hex, b64);
    char *text = cJSON_PrintUnformatted(o);
    snprintf(path, sizeof path, "%s/one.json", tmp);
    ck_assert_int_eq(hkt_write_file(path, text), 0);
    free(text);
    cJSON_Delete(o);
    rel_free(&s);

    body_type = HKN_FRAME_TYPE;
    int code = curl_req("POST", "/v1/release", frame, NULL, body, sizeof body);
    ck_assert_msg(code == 200, "frame: HTTP %d: %s", code, body);
    /* Sent again as JSON, the same release verifies as far as the replay
     * check... */
    body_type = "application/json";
    code = curl_req("POST", "/v1/release", path, NULL, body, sizeof body);
    ck_assert_msg(code == 409 && json_has(body, "error", "HK_ERR_REPLAY"), "HTTP %d: %s", code,
                  body);
    /* ... and commits on an endpoint that has not seen it. */
    hkn_endpoint_stop(ep);
    ep = NULL;
    char sdir[PATH_MAX + 16];
    snprintf(sdir, sizeof sdir, "%s/state", tmp);
    hkt_rmtree(sdir);
    start(NULL, 0, NULL, NULL);
    code = curl_req("POST", "/v1/release", path, NULL, body, sizeof body);
    ck_assert_msg(code == 200, "JSON: HTTP %d: %s", code, body);
    pthread_mutex_lock(&rec.lock);
    ck_assert_int_eq(rec.calls, 2);
    ck_assert_uint_eq(rec.version, 7);
    ck_assert_mem_eq(rec.bytes, kernel_src, strlen(kernel_src));
    pthread_mutex_unlock(&rec.lock);
}
END_TEST

/* Every malformed, lying or untrusted frame is refused with its reason, and
 * nothing changes: no apply, no record. */
START_TEST(frame_refusals_change_nothing) {
    start(NULL, 0, NULL, NULL);
    body_type = HKN_FRAME_TYPE;
    char body[8192];
    int64_t exp = time(NULL) + 60;
    ck_assert_int_eq(curl_req("POST", "/v1/release", frame_file(&key, "add", 5, exp, F_NONE, "ok"),
                              NULL, body, sizeof body),
                     200);
    hkn_seckey stranger;
    hkn_keygen(&stranger);
    struct {
        const char *what, *file;
        int code;
        const char *error, *says;
    } cases[] = {
        {"truncated", frame_file(&key, "add", 9, exp, F_TRUNCATED, "c1"), 400, "HK_ERR_INVALID",
         "truncated"},
        {"cut in its header", frame_file(&key, "add", 9, exp, F_IN_HEAD, "c2"), 400,
         "HK_ERR_INVALID", "inside the release frame's header"},
        {"length longer than the body", frame_file(&key, "add", 9, exp, F_LONGER, "c3"), 400,
         "HK_ERR_INVALID", "truncated"},
        {"lengths shifted", frame_file(&key, "add", 9, exp, F_SHIFTED, "c4"), 403,
         "HK_ERR_SIGNATURE", "signature"},
        {"length over the cap", frame_file(&key, "add", 9, exp, F_HUGE, "c5"), 413,
         "HK_ERR_TOO_LARGE", "the cap of"},
        {"bad magic", frame_file(&key, "add", 9, exp, F_MAGIC, "c6"), 400, "HK_ERR_INVALID",
         "magic"},
        {"version 2", frame_file(&key, "add", 9, exp, F_VERSION, "c7"), 400, "HK_ERR_INVALID",
         "version 2"},
        {"bad signature", frame_file(&key, "add", 9, exp, F_MANIFEST, "c8"), 403,
         "HK_ERR_SIGNATURE", "bad signature"},
        {"unknown key", frame_file(&stranger, "add", 9, exp, F_NONE, "c9"), 403, "HK_ERR_SIGNATURE",
         "unknown signing key"},
        {"no signature", frame_file(&key, "add", 9, exp, F_NO_SIG, "c10"), 403, "HK_ERR_SIGNATURE",
         "no signature"},
        {"artifact altered", frame_file(&key, "add", 9, exp, F_BYTES, "c11"), 422, "HK_ERR_HASH",
         "sha256"},
        {"artifact count", frame_file(&key, "add", 9, exp, F_TWO, "c12"), 422, "HK_ERR_HASH",
         "carries 2"},
        {"replay", frame_file(&key, "add", 5, exp, F_NONE, "c13"), 409, "HK_ERR_REPLAY",
         "not newer"},
        {"expired", frame_file(&key, "add", 9, time(NULL) - 5, F_NONE, "c14"), 403,
         "HK_ERR_EXPIRED", "expired"},
    };
    for (int pass = 0; pass < 2; pass++) {
        /* Once with a Content-Length, once chunked: without one, what a
         * length contradicts is the end of the body. */
        chunked = pass;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            int code = curl_req("POST", "/v1/release", cases[i].file, NULL, body, sizeof body);
            ck_assert_msg(code == cases[i].code, "%s%s: HTTP %d (want %d): %s", cases[i].what,
                          pass ? " (chunked)" : "", code, cases[i].code, body);
            ck_assert_msg(json_has(body, "error", cases[i].error), "%s: %s", cases[i].what, body);
            ck_assert_msg(json_has_text(body, "message", cases[i].says), "%s: %s", cases[i].what,
                          body);
            ck_assert_int_eq(rec_calls(), 1);
            ck_assert_uint_eq(rec_current(), 5);
            ck_assert(state_is("add", 5));
        }
    }
    chunked = 0;
    /* A frame under another type: a form type is refused unread (415),
     * as JSON it is no JSON (400), and no other route takes a frame. */
    const char *good = frame_file(&key, "add", 9, exp, F_NONE, "good");
    body_type = "application/octet-stream";
    ck_assert_int_eq(curl_req("POST", "/v1/release", good, NULL, body, sizeof body), 415);
    ck_assert(json_has_text(body, "message", HKN_FRAME_TYPE));
    body_type = "application/json";
    ck_assert_int_eq(curl_req("POST", "/v1/release", good, NULL, body, sizeof body), 400);
    body_type = HKN_FRAME_TYPE;
    ck_assert_int_eq(curl_req("POST", "/v1/rollback/add", good, NULL, body, sizeof body), 415);
    ck_assert(json_has_text(body, "message", "only POST /v1/release"));
    ck_assert_int_eq(rec_calls(), 1);
    ck_assert_int_eq(rec.rollbacks, 0);
    /* None of it burnt the version or wedged the endpoint. */
    int code = curl_req("POST", "/v1/release", good, NULL, body, sizeof body);
    ck_assert_msg(code == 200, "HTTP %d: %s", code, body);
    ck_assert_uint_eq(rec_current(), 9);
    ck_assert(state_is("add", 9));
}
END_TEST

static void small_cap(hk_endpoint_options *o, hkn_endpoint_resolved *r) {
    (void)r;
    o->max_body_bytes = 3800;
}

/* hotkern push sends the frame unless told --json-body: a 3,000-byte kernel
 * fits a 3,800-byte cap as a frame (its bytes once, plus the manifest),
 * not as JSON (base64 adds a third). */
START_TEST(cli_pushes_frames) {
    cfg_hook = small_cap;
    start(NULL, 0, NULL, NULL);
    char src[3001], path[PATH_MAX + 16], out[16384];
    memset(src, ' ', 3000);
    src[3000] = '\0';
    memcpy(src, kernel_src, strlen(kernel_src));
    src[2998] = '\n';
    snprintf(path, sizeof path, "%s/big.cu", tmp);
    ck_assert_int_eq(hkt_write_file(path, src), 0);
    const char *cli = cli_path();
    char *json[] = {(char *)cli, "push",      base, "--key",       key_path, "--module",
                    "add",       "--release", "3",  "--json-body", path,     NULL};
    int rc = run(json, out, sizeof out);
    ck_assert_msg(rc == 1 && strstr(out, "HK_ERR_TOO_LARGE"), "exit %d: %s", rc, out);
    ck_assert_int_eq(rec_calls(), 0);
    char *frame[] = {(char *)cli, "push",      base, "--key", key_path, "--module",
                     "add",       "--release", "4",  path,    NULL};
    rc = run(frame, out, sizeof out);
    ck_assert_msg(rc == 0 && strstr(out, "committed"), "exit %d: %s", rc, out);
    pthread_mutex_lock(&rec.lock);
    ck_assert_uint_eq(rec.version, 4);
    ck_assert_uint_eq(rec.size, 3000);
    ck_assert_mem_eq(rec.bytes, src, 3000);
    pthread_mutex_unlock(&rec.lock);
}
END_TEST

/* ---- what a push costs in memory --------------------------------------- */

static long status_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, strlen(field)))
            v = atol(line + strlen(field));
    fclose(f);
    ck_assert_int_ge(v, 0);
    return v;
}

/* Pushes file as `type` and returns by how many bytes the process's peak
 * resident size rose over what it held before. The kernel keeps the peak
 * (VmHWM) exactly, every page the endpoint touched counted, and resets it
 * to the current size on request (clear_refs 5): no sampling to miss a
 * peak. The client is a curl process of its own, so only the server's
 * memory is in this process. */
static double push_peak_growth(const char *file, const char *type, int *code) {
    char body[8192];
    malloc_trim(0);
    FILE *f = fopen("/proc/self/clear_refs", "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs("5", f), 0);
    ck_assert_int_eq(fclose(f), 0);
    long before = status_kib("VmRSS:");
    body_type = type;
    *code = curl_req("POST", "/v1/release", file, NULL, body, sizeof body);
    ck_assert_msg(*code == 200, "HTTP %d: %s", *code, body);
    return 1024.0 * (double)(status_kib("VmHWM:") - before);
}

static off_t file_size(const char *path) {
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return st.st_size;
}

/* A 60 MiB image pushed as a frame is held once: the endpoint's peak
 * memory grows by about the body's size (at least the image, which it must
 * hold, and under 1.3 times the body). The same measure of a JSON body of
 * 60 MiB is printed beside it. */
START_TEST(frame_push_holds_the_body_once) {
    start(NULL, 0, NULL, NULL);
    rec.hash_only = 1; /* the recorder keeps no copy */
    const size_t image = (60u << 20) - 4096, jimage = 45u << 20;
    unsigned char *img = malloc(image);
    ck_assert_ptr_nonnull(img);
    for (size_t i = 0; i < image; i++)
        img[i] = (unsigned char)(i * 2654435761u >> 13);
    char hex[65], jhex[65], b64path[PATH_MAX + 16];
    hkn_sha256_hex(img, image, hex);
    hkn_sha256_hex(img, jimage, jhex);
    struct signed_rel s = sign_rel(&key, "add", 1, time(NULL) + 600, img, image);
    const char *frame = frame_of(&s, img, image, F_NONE, "big.bin");
    rel_free(&s);
    /* The JSON body of a 45 MiB image is 60 MiB. */
    s = sign_rel(&key, "add", 2, time(NULL) + 600, img, jimage);
    size_t blen = sodium_base64_ENCODED_LEN(jimage, sodium_base64_VARIANT_ORIGINAL);
    char *b64 = malloc(blen);
    ck_assert_ptr_nonnull(b64);
    sodium_bin2base64(b64, blen, img, jimage, sodium_base64_VARIANT_ORIGINAL);
    free(img);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "manifest", s.manifest);
    cJSON_AddStringToObject(o, "signature", s.sig);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "artifacts"), jhex, b64);
    free(b64);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    rel_free(&s);
    snprintf(b64path, sizeof b64path, "%s/big.json", tmp);
    ck_assert_int_eq(hku_write_atomic(b64path, text, strlen(text), 0644, NULL), 0);
    free(text);

    int code;
    double fbody = (double)file_size(frame), jbody = (double)file_size(b64path);
    double fgrow = push_peak_growth(frame, HKN_FRAME_TYPE, &code);
    pthread_mutex_lock(&rec.lock);
    ck_assert_uint_eq(rec.version, 1);
    ck_assert_uint_eq(rec.size, image);
    ck_assert_str_eq(rec.hash, hex);
    pthread_mutex_unlock(&rec.lock);
    double jgrow = push_peak_growth(b64path, "application/json", &code);
    pthread_mutex_lock(&rec.lock);
    ck_assert_uint_eq(rec.version, 2);
    ck_assert_str_eq(rec.hash, jhex);
    pthread_mutex_unlock(&rec.lock);
    fprintf(stderr,
            "push peak memory: frame body %.1f MiB: +%.1f MiB (%.2fx); JSON body %.1f MiB: "
            "+%.1f MiB (%.2fx)\n",
            fbody / 1048576, fgrow / 1048576, fgrow / fbody, jbody / 1048576, jgrow / 1048576,
            jgrow / jbody);
#if defined(__SANITIZE_THREAD__)
    /* The thread sanitizer's shadow of every byte touched is several times
     * its size: the bound is the plain and address-sanitized builds'. */
    (void)fgrow;
#else
    ck_assert_msg(fgrow >= 0.9 * (double)image, "the probe saw only %.1f MiB", fgrow / 1048576);
    ck_assert_msg(fgrow <= 1.3 * fbody, "a %.1f MiB frame cost %.1f MiB (%.2fx)", fbody / 1048576,
                  fgrow / 1048576, fgrow / fbody);
#endif
}
END_TEST

void ep_frames_tests(TCase *tc) {
    tcase_add_test(tc, frame_push_commits);
    tcase_add_test(tc, frame_and_json_carry_one_signature);
    tcase_add_test(tc, frame_refusals_change_nothing);
    tcase_add_test(tc, cli_pushes_frames);
    tcase_add_test(tc, frame_push_holds_the_body_once);
}

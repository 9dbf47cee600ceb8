/*
 * The compile cache shared and distrusted: two processes at once, keys
 * that follow in-memory headers and a header appearing earlier in the
 * search, entries bound to their key and owner, a directory others can
 * change refused, and a lock held by a stopped process.
 */
#include "tests/ptx/fixture.h"

START_TEST(cache_two_processes) {
    char *dir = hkt_tmpdir();
    char cdir[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        ck_assert_int_ge(kids[k], 0);
        if (kids[k] == 0) {
            /* Both children write the same keys and some of their own, at
             * once, with the raw API and real builds. */
            hkp_cache *c;
            if (hkp_cache_open(&c, cdir, 64 << 20, NULL) != 0)
                _exit(10);
            for (int i = 0; i < 200; i++) {
                uint8_t key[HKP_KEY_BYTES] = {0};
                key[0] = (uint8_t)(i % 50);
                key[1] = (uint8_t)(i % 3 == 0 ? k : 9);
                size_t len = 1000 + (size_t)i * 37;
                unsigned char *buf = malloc(len);
                memset(buf, i, len);
                /* HK_ERR_BUSY: the other child held the directory's lock
                 * past HKP_CACHE_LOCK_MS (a slow machine, a sanitizer
                 * build) and the entry was left unwritten, as meant; put
                 * again, so that every key ends up written. */
                int pr = HK_ERR_BUSY;
                for (int t = 0; t < 40 && pr == HK_ERR_BUSY; t++)
                    pr = hkp_cache_put(c, key, buf, len);
                if (pr != 0)
                    _exit(11);
                void *got;
                size_t gn;
                if (hkp_cache_get(c, key, &got, &gn) == 0) {
                    free(got); /* content verified by the hash already */
                }
                free(buf);
            }
            for (int i = 0; i < 3; i++) {
                char src[256];
                snprintf(src, sizeof src, "extern \"C\" __global__ void k%d(int *p) { *p = %d; }\n",
                         i, i);
                hkp_build_opts o = base_opts(90);
                o.cache = c;
                hkp_artifact a;
                char why[256];
                if (hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why) != 0)
                    _exit(12);
                hkp_artifact_free(&a);
            }
            hkp_cache_close(c);
            _exit(0);
        }
    }
    for (int k = 0; k < 2; k++) {
        int st;
        ck_assert_int_eq(waitpid(kids[k], &st, 0), kids[k]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d status %d", k, st);
    }
    /* Every file left is a complete, verifiable entry; no temporaries. */
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    DIR *d = opendir(cdir);
    struct dirent *de;
    int checked = 0, tmps = 0;
    while ((de = readdir(d)) != NULL) {
        if (strstr(de->d_name, ".hkc.tmp."))
            tmps++;
        if (strlen(de->d_name) != 68 || !strstr(de->d_name, ".hkc"))
            continue;
        uint8_t key[HKP_KEY_BYTES];
        for (int i = 0; i < HKP_KEY_BYTES; i++) {
            unsigned v;
            sscanf(de->d_name + 2 * i, "%2x", &v);
            key[i] = (uint8_t)v;
        }
        void *got;
        size_t gn;
        ck_assert_msg(hkp_cache_get(c, key, &got, &gn) == 0, "bad entry %s", de->d_name);
        free(got);
        checked++;
    }
    closedir(d);
    ck_assert_int_eq(tmps, 0);
    ck_assert_int_ge(checked, 50 + 2 * 17 + 3 * 2);
    /* The builds the children made are hits now. */
    for (int i = 0; i < 3; i++) {
        char src[256];
        snprintf(src, sizeof src, "extern \"C\" __global__ void k%d(int *p) { *p = %d; }\n", i, i);
        hkp_build_opts o = base_opts(90);
        o.cache = c;
        hkp_artifact a;
        char why[256];
        ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
        ck_assert_int_eq(a.cache_hit, 1);
        hkp_artifact_free(&a);
    }
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cache_key_follows_in_memory_headers) {
    char *dir = hkt_tmpdir();
    char cdir[512], hpath[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    snprintf(hpath, sizeof hpath, "%s/common.cuh", dir);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    char name[600];
    snprintf(name, sizeof name, "%s/k.cu", dir);
    hk_header h = {"common.cuh", "#define K 100\n", 14};
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    o.headers = &h;
    o.nheaders = 1;
    o.source_name = name;
    hkp_artifact a;
    ck_assert(ptx_has_constant(USES_COMMON, o, 100, &a));
    ck_assert_int_eq(a.cache_hit, 0);
    hkp_artifact_free(&a);
    ck_assert(ptx_has_constant(USES_COMMON, o, 100, &a));
    ck_assert_int_eq(a.cache_hit, 1);
    hkp_artifact_free(&a);
    /* Same name, new contents: a miss, and the new value. */
    h.data = "#define K 200\n";
    ck_assert(ptx_has_constant(USES_COMMON, o, 200, &a));
    ck_assert_int_eq(a.cache_hit, 0);
    hkp_artifact_free(&a);
    /* Back to the first contents: its entry is still there. */
    h.data = "#define K 100\n";
    ck_assert(ptx_has_constant(USES_COMMON, o, 100, &a));
    ck_assert_int_eq(a.cache_hit, 1);
    hkp_artifact_free(&a);
    /* A file of that name beside the source: without the in-memory header
     * the file is used (a different key, since the names differ) ... */
    ck_assert_int_eq(hkt_write_file(hpath, "#define K 300\n"), 0);
    o.nheaders = 0;
    ck_assert(ptx_has_constant(USES_COMMON, o, 300, &a));
    ck_assert_int_eq(a.cache_hit, 0);
    hkp_artifact_free(&a);
    /* ... and with it, the in-memory one hides the file. */
    o.nheaders = 1;
    ck_assert(ptx_has_constant(USES_COMMON, o, 100, &a));
    hkp_artifact_free(&a);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- what the cache may trust ------------------------------------------- */

/* Builds the CUDA C file path with the given -I options into a. */
static void build_with(const char *path, hkp_cache *c, const char *const *opts, int nopts,
                       hkp_artifact *a) {
    size_t n;
    char *src = read_whole(path, &n);
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    o.source_name = path;
    o.nvrtc_options = opts;
    o.nnvrtc_options = nopts;
    char why[512];
    int rc = hkp_build(src, n, HK_FORMAT_CUDA_C, &o, a, why, sizeof why);
    ck_assert_msg(rc == 0, "build of %s failed: %s %s", path, why, a->log ? a->log : "");
    free(src);
}

static int same_image(const hkp_artifact *a, const void *img, size_t n) {
    return a->size == n && !memcmp(a->image, img, n);
}

/* A header of the same name that appears earlier in the search (the
 * including file's directory for "...", an earlier -I directory for both
 * forms) is what NVRTC reads from then on: a miss, in this handle and in a
 * new one (a restart). */
START_TEST(cache_sees_a_header_appear_earlier_in_the_search) {
    char *dir = hkt_tmpdir();
    char cdir[512], inc1[512], inc2[512], src[512], p[600], i1[520], i2[520];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    snprintf(inc1, sizeof inc1, "%s/inc1", dir);
    snprintf(inc2, sizeof inc2, "%s/inc2", dir);
    ck_assert_int_eq(mkdir(inc1, 0700), 0);
    ck_assert_int_eq(mkdir(inc2, 0700), 0);
    snprintf(i1, sizeof i1, "-I%s", inc1);
    snprintf(i2, sizeof i2, "-I%s", inc2);
    const char *opts[] = {i1, i2};
    snprintf(p, sizeof p, "%s/scale.cuh", inc2);
    ck_assert_int_eq(hkt_write_file(p, "#define FACTOR 2.0f\n"), 0);
    snprintf(p, sizeof p, "%s/angle.cuh", inc2);
    ck_assert_int_eq(hkt_write_file(p, "#define ANGLE 0.5f\n"), 0);
    snprintf(src, sizeof src, "%s/k.cu", dir);
    ck_assert_int_eq(hkt_write_file(src, "#include \"scale.cuh\"\n"
                                         "#include <angle.cuh>\n"
                                         "extern \"C\" __global__ void k(float *x) {\n"
                                         "    x[threadIdx.x] *= FACTOR + ANGLE;\n"
                                         "}\n"),
                     0);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    hkp_artifact a;
    build_with(src, c, opts, 2, &a);
    ck_assert_int_eq(a.cache_hit, 0);
    size_t first_n = a.size;
    void *first = malloc(a.size);
    memcpy(first, a.image, a.size);
    hkp_artifact_free(&a);
    build_with(src, c, opts, 2, &a);
    ck_assert_int_eq(a.cache_hit, 1);
    hkp_artifact_free(&a);

    /* "scale.cuh" appears in the first -I directory, then beside the
     * source; <angle.cuh> in the first -I directory. */
    static const char *const appear[][2] = {{"inc1/scale.cuh", "#define FACTOR 3.0f\n"},
                                            {"scale.cuh", "#define FACTOR 4.0f\n"},
                                            {"inc1/angle.cuh", "#define ANGLE 1.5f\n"}};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, appear[i][0]);
        ck_assert_int_eq(hkt_write_file(p, appear[i][1]), 0);
        build_with(src, c, opts, 2, &a);
        ck_assert_msg(a.cache_hit == 0, "%s appeared: still a hit", appear[i][0]);
        ck_assert(!same_image(&a, first, first_n));
        size_t n = a.size;
        void *img = malloc(n);
        memcpy(img, a.image, n);
        hkp_artifact_free(&a);
        hkp_cache_close(c); /* a restart */
        ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
        build_with(src, c, opts, 2, &a);
        ck_assert_int_eq(a.cache_hit, 1);
        ck_assert(same_image(&a, img, n));
        hkp_artifact_free(&a);
        free(img);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, appear[i][0]);
        ck_assert_int_eq(unlink(p), 0);
    }
    /* The manifest lists the headers of the last build, which are gone: a
     * miss, and the first image again. */
    build_with(src, c, opts, 2, &a);
    ck_assert_int_eq(a.cache_hit, 0);
    ck_assert(same_image(&a, first, first_n));
    hkp_artifact_free(&a);
    build_with(src, c, opts, 2, &a);
    ck_assert_int_eq(a.cache_hit, 1);
    ck_assert(same_image(&a, first, first_n));
    hkp_artifact_free(&a);
    free(first);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

static void entry_file(const char *cdir, const uint8_t key[HKP_KEY_BYTES], char *out, size_t n) {
    int k = snprintf(out, n, "%s/", cdir);
    for (int i = 0; i < HKP_KEY_BYTES; i++)
        k += snprintf(out + k, n - (size_t)k, "%02x", key[i]);
    snprintf(out + k, n - (size_t)k, ".hkc");
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    char *data = read_whole(from, &n);
    FILE *f = fopen(to, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
    free(data);
}

/* An entry serves only the key it was written for, from a file of this
 * user that nobody else can write, reached without following a link. */
START_TEST(cache_entry_is_bound_to_its_key_and_owner) {
    char *dir = hkt_tmpdir();
    char cdir[512], f1[700], f2[700], f3[700], out[600];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    uint8_t k1[HKP_KEY_BYTES] = {1}, k2[HKP_KEY_BYTES] = {2}, k3[HKP_KEY_BYTES] = {3};
    ck_assert_int_eq(hkp_cache_put(c, k1, "attacker's kernel", 18), 0);
    ck_assert_int_eq(hkp_cache_put(c, k2, "victim's kernel", 16), 0);
    ck_assert_int_eq(hkp_cache_put(c, k3, "third", 6), 0);
    hkp_cache_close(c);
    entry_file(cdir, k1, f1, sizeof f1);
    entry_file(cdir, k2, f2, sizeof f2);
    entry_file(cdir, k3, f3, sizeof f3);
    copy_file(f1, f2); /* k1's entry under k2's name */
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    void *got = NULL;
    size_t gn;
    ck_assert_int_eq(hkp_cache_get(c, k2, &got, &gn), HK_ERR_NOT_FOUND);
    ck_assert_int_ne(access(f2, F_OK), 0); /* removed as a bad entry */
    /* An entry others may write is not read. */
    ck_assert_int_eq(chmod(f1, 0666), 0);
    ck_assert_int_eq(hkp_cache_get(c, k1, &got, &gn), HK_ERR_NOT_FOUND);
    /* Nor one reached through a link. */
    snprintf(out, sizeof out, "%s/elsewhere", dir);
    copy_file(f3, out);
    ck_assert_int_eq(unlink(f3), 0);
    ck_assert_int_eq(symlink(out, f3), 0);
    ck_assert_int_eq(hkp_cache_get(c, k3, &got, &gn), HK_ERR_NOT_FOUND);
    ck_assert_int_eq(access(out, F_OK), 0); /* the link's target is left alone */
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* A cache directory others can change is refused; a lock file that is a
 * link is never followed (nothing is created through it). */
START_TEST(cache_directory_others_can_change_is_refused) {
    char *dir = hkt_tmpdir();
    char cdir[512], lock[600], target[600];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    ck_assert_int_eq(mkdir(cdir, 0700), 0);
    ck_assert_int_eq(chmod(cdir, 0777), 0);
    hkp_cache *c = NULL;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), HK_ERR_IO);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(chmod(cdir, 0700), 0);
    snprintf(lock, sizeof lock, "%s/lock", cdir);
    snprintf(target, sizeof target, "%s/created", dir);
    ck_assert_int_eq(symlink(target, lock), 0);
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    uint8_t k[HKP_KEY_BYTES] = {9};
    (void)hkp_cache_put(c, k, "x", 1);
    ck_assert_int_ne(access(target, F_OK), 0);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* Another process holds the cache's lock and never lets go: the build
 * completes uncached after a bounded wait, and says so. */
START_TEST(cache_lock_held_by_a_stopped_process) {
    char *dir = hkt_tmpdir();
    char cdir[512], lock[600];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    ck_assert_int_eq(mkdir(cdir, 0700), 0);
    snprintf(lock, sizeof lock, "%s/lock", cdir);
    pid_t holder = hkt_hold_lock_stopped(lock);
    ck_assert_int_gt(holder, 0);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    const char *src = "extern \"C\" __global__ void k(int *p) { *p = 7; }\n";
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    hkp_artifact a;
    char why[256];
    ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_int_eq(a.cache_hit, 0);
    ck_assert_int_eq(a.meta.nentries, 1);
    ck_assert_msg(strstr(a.cache_note, "lock") && strstr(a.cache_note, "not cached"), "note: %s",
                  a.cache_note);
    hkp_artifact_free(&a);
    int entries;
    dir_bytes(cdir, &entries, NULL);
    ck_assert_int_eq(entries, 0);
    kill(holder, SIGKILL);
    ck_assert_int_eq(waitpid(holder, NULL, 0), holder);
    /* The lock is free again: cached as usual. */
    ck_assert_int_eq(hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
    ck_assert_str_eq(a.cache_note, "");
    hkp_artifact_free(&a);
    dir_bytes(cdir, &entries, NULL);
    ck_assert_int_eq(entries, 2);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

void ptx_cache_share_tests(TCase *tc) {
    tcase_add_test(tc, cache_two_processes);
    tcase_add_test(tc, cache_key_follows_in_memory_headers);
    tcase_add_test(tc, cache_sees_a_header_appear_earlier_in_the_search);
    tcase_add_test(tc, cache_entry_is_bound_to_its_key_and_owner);
    tcase_add_test(tc, cache_directory_others_can_change_is_refused);
}

void ptx_cache_lock_tests(TCase *tc) {
    tcase_add_test(tc, cache_lock_held_by_a_stopped_process);
}

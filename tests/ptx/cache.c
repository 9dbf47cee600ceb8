/*
 * The compile cache: keys that follow headers, PTX builds, a truncated
 * entry replaced, the memory tier, the eviction bound and the default
 * directory.
 */
#include "tests/ptx/fixture.h"

static double ms_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* ---- cache ---------------------------------------------------------------- */

static int build_file(const char *path, hkp_cache *c, const char *iopt, hkp_artifact *a) {
    size_t n;
    char *src = read_whole(path, &n);
    const char *opts[] = {iopt};
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    o.source_name = path;
    o.nvrtc_options = opts;
    o.nnvrtc_options = iopt ? 1 : 0;
    char why[512];
    int rc = hkp_build(src, n, HK_FORMAT_CUDA_C, &o, a, why, sizeof why);
    ck_assert_msg(rc == 0, "build of %s failed: %s %s", path, why, a->log ? a->log : "");
    free(src);
    return a->cache_hit;
}

START_TEST(cache_tracks_headers) {
    char *dir = hkt_tmpdir();
    char cdir[512], src[512], hdr[512], other[512], inc[512], iopt[520];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    snprintf(inc, sizeof inc, "%s/include", dir);
    ck_assert_int_eq(mkdir(inc, 0700), 0);
    snprintf(iopt, sizeof iopt, "-I%s", inc);
    snprintf(src, sizeof src, "%s/k.cu", dir);
    snprintf(hdr, sizeof hdr, "%s/include/scale.cuh", dir);
    snprintf(other, sizeof other, "%s/include/unrelated.cuh", dir);
    ck_assert_int_eq(hkt_write_file(hdr, "#define FACTOR 2.0f\n"), 0);
    ck_assert_int_eq(hkt_write_file(other, "#define NOTHING 1\n"), 0);
    ck_assert_int_eq(hkt_write_file(src, "#include <scale.cuh>\n"
                                         "extern \"C\" __global__ void k(float *x) {\n"
                                         "    x[threadIdx.x] *= FACTOR;\n"
                                         "}\n"),
                     0);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    hkp_artifact a;
    struct timespec t0;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 0);
    double miss_ms = ms_since(&t0);
    ck_assert_int_eq(a.ndeps, 1);
    size_t first_size = a.size;
    void *first = malloc(a.size);
    memcpy(first, a.image, a.size);
    hkp_artifact_free(&a);

    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 1);
    double hit_ms = ms_since(&t0);
    ck_assert_uint_eq(a.size, first_size);
    ck_assert_int_eq(memcmp(a.image, first, first_size), 0);
    ck_assert_int_eq(a.meta.nentries, 1);
    ck_assert_int_eq(a.ndeps, 1);
    hkp_artifact_free(&a);
    printf("cache: miss (NVRTC cubin) %.1f ms, hit %.2f ms\n", miss_ms, hit_ms);

    /* An unrelated file changes: still a hit. */
    ck_assert_int_eq(hkt_write_file(other, "#define NOTHING 2\n"), 0);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 1);
    hkp_artifact_free(&a);

    /* The header changes: a miss, and a different image. */
    ck_assert_int_eq(hkt_write_file(hdr, "#define FACTOR 3.0f\n"), 0);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 0);
    ck_assert(a.size != first_size || memcmp(a.image, first, first_size) != 0);
    hkp_artifact_free(&a);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 1);
    hkp_artifact_free(&a);

    /* Back to the first header: that version is still cached. */
    ck_assert_int_eq(hkt_write_file(hdr, "#define FACTOR 2.0f\n"), 0);
    ck_assert_int_eq(build_file(src, c, iopt, &a), 1);
    ck_assert_int_eq(memcmp(a.image, first, first_size), 0);
    hkp_artifact_free(&a);

    /* Other options are another key. */
    ck_assert_int_eq(build_file(src, c, iopt, &a), 1);
    hkp_artifact_free(&a);
    {
        size_t n;
        char *s = read_whole(src, &n);
        const char *opts[] = {iopt, "-DEXTRA=1"};
        hkp_build_opts o = base_opts(90);
        o.cache = c;
        o.source_name = src;
        o.nvrtc_options = opts;
        o.nnvrtc_options = 2;
        char why[256];
        ck_assert_int_eq(hkp_build(s, n, HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
        ck_assert_int_eq(a.cache_hit, 0);
        hkp_artifact_free(&a);
        o.arch = 80;
        ck_assert_int_eq(hkp_build(s, n, HK_FORMAT_CUDA_C, &o, &a, why, sizeof why), 0);
        ck_assert_int_eq(a.cache_hit, 0);
        ck_assert_int_eq(a.meta.arch, 80);
        hkp_artifact_free(&a);
        free(s);
    }

    uint64_t hits, misses, bytes;
    hkp_cache_stats(c, &hits, &misses, &bytes);
    ck_assert_uint_eq(hits, 5);
    ck_assert_uint_eq(misses, 4);
    int entries;
    ck_assert_uint_eq(bytes, dir_bytes(cdir, &entries, NULL));
    ck_assert_int_gt(entries, 0);
    free(first);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cache_ptx_builds) {
    char *dir = hkt_tmpdir();
    char cdir[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    size_t n;
    char *ptx = nvrtc_image(KERNELS_CU, "compute_90", &n);
    hkp_build_opts o = base_opts(90);
    o.cache = c;
    hkp_artifact a;
    char why[256];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(hkp_build(ptx, n, HK_FORMAT_PTX, &o, &a, why, sizeof why), 0);
    double link_ms = ms_since(&t0);
    ck_assert_int_eq(a.cache_hit, 0);
    hkp_artifact_free(&a);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(hkp_build(ptx, n, HK_FORMAT_PTX, &o, &a, why, sizeof why), 0);
    double hit_ms = ms_since(&t0);
    ck_assert_int_eq(a.cache_hit, 1);
    ck_assert_int_eq(a.format, HK_FORMAT_CUBIN);
    ck_assert_int_eq(a.meta.nentries, 3);
    hkp_artifact_free(&a);
    printf("cache: nvJitLink PTX->cubin %.1f ms, hit %.2f ms\n", link_ms, hit_ms);
    free(ptx);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cache_truncated_entry_is_replaced) {
    char *dir = hkt_tmpdir();
    char cdir[512], src[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    snprintf(src, sizeof src, "%s/k.cu", dir);
    ck_assert_int_eq(hkt_write_file(src, KERNELS_CU), 0);
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    hkp_artifact a;
    ck_assert_int_eq(build_file(src, c, NULL, &a), 0);
    hkp_artifact_free(&a);

    /* Damage every entry: cut the biggest (the cubin) and flip a byte in
     * the others. */
    DIR *d = opendir(cdir);
    struct dirent *de;
    int damaged = 0;
    while ((de = readdir(d)) != NULL) {
        if (!strstr(de->d_name, ".hkc"))
            continue;
        char p[1024];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", cdir, de->d_name);
        ck_assert_int_eq(stat(p, &st), 0);
        if (st.st_size > 2000) {
            ck_assert_int_eq(truncate(p, st.st_size / 2), 0);
        } else {
            FILE *f = fopen(p, "r+b");
            fseek(f, st.st_size - 3, SEEK_SET);
            int ch = fgetc(f);
            fseek(f, st.st_size - 3, SEEK_SET);
            fputc(ch ^ 0x5a, f);
            fclose(f);
        }
        damaged++;
    }
    closedir(d);
    ck_assert_int_eq(damaged, 2); /* manifest + artifact */

    /* A new handle (another process's view): this one would serve its own
     * entries from memory. */
    hkp_cache_close(c);
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    ck_assert_int_eq(build_file(src, c, NULL, &a), 0); /* miss, rebuilt */
    ck_assert_int_eq(a.meta.nentries, 3);
    hkp_artifact_free(&a);
    ck_assert_int_eq(build_file(src, c, NULL, &a), 1); /* replaced: hit */
    ck_assert_int_eq(a.meta.nentries, 3);
    hkp_artifact_free(&a);

    /* The raw API: a short file is a miss and is removed. */
    uint8_t key[HKP_KEY_BYTES] = {1, 2, 3};
    const char payload[] = "payload bytes";
    ck_assert_int_eq(hkp_cache_put(c, key, payload, sizeof payload), 0);
    void *got;
    size_t gn;
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), 0);
    ck_assert_uint_eq(gn, sizeof payload);
    ck_assert_int_eq(memcmp(got, payload, gn), 0);
    free(got);
    char p[1024];
    snprintf(p, sizeof p, "%s/0102030000000000000000000000000000000000000000000000000000000000.hkc",
             cdir);
    ck_assert_int_eq(truncate(p, 20), 0);
    hkp_cache_close(c);
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), HK_ERR_NOT_FOUND);
    ck_assert_int_ne(access(p, F_OK), 0);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

/* Removes every entry file of cache directory cdir; returns how many. */
static int remove_entries(const char *cdir) {
    DIR *d = opendir(cdir);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)) != NULL) {
        char p[1024];
        if (!strstr(de->d_name, ".hkc"))
            continue;
        snprintf(p, sizeof p, "%s/%s", cdir, de->d_name);
        n += unlink(p) == 0;
    }
    closedir(d);
    return n;
}

static void expect_entry(hkp_cache *c, const uint8_t *key, const void *want, size_t n) {
    void *got = NULL;
    size_t gn = 0;
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), 0);
    ck_assert_uint_eq(gn, n);
    ck_assert_int_eq(memcmp(got, want, n), 0);
    free(got);
}

/* The entries a handle read or wrote last are served from memory (no file
 * read: they survive the file's removal), within both bounds; a put of a
 * key replaces its copy (manifests change under their key). */
START_TEST(cache_memory_tier) {
    char *dir = hkt_tmpdir();
    char cdir[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    hkp_cache *c, *other;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 64 << 20, NULL), 0);
    unsigned char buf[3000];
    uint8_t key[HKP_KEY_BYTES] = {0x42};
    for (int i = 0; i <= HKP_CACHE_MEM_ENTRIES; i++) {
        key[1] = (uint8_t)i;
        memset(buf, i, sizeof buf);
        ck_assert_int_eq(hkp_cache_put(c, key, buf, sizeof buf), 0);
    }
    ck_assert_int_eq(remove_entries(cdir), HKP_CACHE_MEM_ENTRIES + 1);
    void *got;
    size_t gn;
    key[1] = 0; /* the oldest: past the count bound */
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), HK_ERR_NOT_FOUND);
    for (int i = 1; i <= HKP_CACHE_MEM_ENTRIES; i++) {
        key[1] = (uint8_t)i;
        memset(buf, i, sizeof buf);
        expect_entry(c, key, buf, sizeof buf);
    }
    /* Another handle has nothing in memory: the files are gone. */
    ck_assert_int_eq(hkp_cache_open(&other, cdir, 64 << 20, NULL), 0);
    ck_assert_int_eq(hkp_cache_get(other, key, &got, &gn), HK_ERR_NOT_FOUND);
    /* A disk hit is kept too. */
    uint8_t k2[HKP_KEY_BYTES] = {0x43};
    ck_assert_int_eq(hkp_cache_put(other, k2, "disk", 5), 0);
    ck_assert_int_eq(remove_entries(cdir), 1);
    ck_assert_int_eq(hkp_cache_put(other, k2, "disk", 5), 0); /* file back */
    expect_entry(c, k2, "disk", 5);                           /* read from disk */
    ck_assert_int_eq(remove_entries(cdir), 1);
    expect_entry(c, k2, "disk", 5); /* now from memory */
    /* A put replaces the copy of its key. */
    ck_assert_int_eq(hkp_cache_put(c, k2, "newer", 6), 0);
    ck_assert_int_eq(remove_entries(cdir), 1);
    expect_entry(c, k2, "newer", 6);
    hkp_cache_close(other);
    hkp_cache_close(c);
    /* The byte bound: an eighth of max_bytes. */
    ck_assert_int_eq(hkp_cache_open(&c, cdir, 16000, NULL), 0);
    uint8_t k3[HKP_KEY_BYTES] = {0x44}, k4[HKP_KEY_BYTES] = {0x45};
    ck_assert_int_eq(hkp_cache_put(c, k3, buf, 2000), 0); /* > 16000 / 8 */
    ck_assert_int_eq(hkp_cache_put(c, k4, buf, 1500), 0);
    ck_assert_int_eq(remove_entries(cdir), 2);
    ck_assert_int_eq(hkp_cache_get(c, k3, &got, &gn), HK_ERR_NOT_FOUND);
    expect_entry(c, k4, buf, 1500);
    /* A put too large to keep anywhere drops the older copy of its key. */
    unsigned char *big = calloc(1, 16000);
    ck_assert_int_eq(hkp_cache_put(c, k4, big, 16000), 0);
    ck_assert_int_eq(hkp_cache_get(c, k4, &got, &gn), HK_ERR_NOT_FOUND);
    free(big);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cache_eviction_bound) {
    char *dir = hkt_tmpdir();
    char cdir[512];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    const uint64_t bound = 100000;
    hkp_cache *c;
    ck_assert_int_eq(hkp_cache_open(&c, cdir, bound, NULL), 0);
    unsigned char buf[9000];
    uint8_t first[HKP_KEY_BYTES] = {0xee}, key[HKP_KEY_BYTES] = {0};
    memset(buf, 0xab, sizeof buf);
    ck_assert_int_eq(hkp_cache_put(c, first, buf, sizeof buf), 0);
    for (int i = 0; i < 60; i++) {
        key[0] = (uint8_t)i;
        ck_assert_int_eq(hkp_cache_put(c, key, buf, sizeof buf - (size_t)i), 0);
        /* Keep `first` recently used: LRU must spare it. */
        void *got;
        size_t gn;
        ck_assert_int_eq(hkp_cache_get(c, first, &got, &gn), 0);
        free(got);
        int entries;
        ck_assert_uint_le(dir_bytes(cdir, &entries, NULL), bound);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL); /* distinct mtimes on coarse filesystems */
    }
    int entries;
    uint64_t bytes = dir_bytes(cdir, &entries, NULL);
    ck_assert_uint_le(bytes, bound);
    ck_assert_int_ge(entries, 9); /* evicts only what it must */
    void *got;
    size_t gn;
    ck_assert_int_eq(hkp_cache_get(c, first, &got, &gn), 0);
    free(got);
    key[0] = 0; /* the oldest regular entry is gone */
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), HK_ERR_NOT_FOUND);
    key[0] = 59; /* the newest is there */
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), 0);
    free(got);
    /* Too big to ever fit: not stored, not an error. */
    unsigned char *huge = calloc(1, bound);
    key[0] = 200;
    ck_assert_int_eq(hkp_cache_put(c, key, huge, bound), 0);
    ck_assert_int_eq(hkp_cache_get(c, key, &got, &gn), HK_ERR_NOT_FOUND);
    free(huge);
    hkp_cache_close(c);
    hkt_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(cache_default_dir) {
    char buf[512];
    setenv("XDG_CACHE_HOME", "/tmp/xdg-test", 1);
    ck_assert_int_eq(hkp_cache_default_dir(buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "/tmp/xdg-test/hotkern");
    setenv("XDG_CACHE_HOME", "relative", 1);
    setenv("HOME", "/home/someone", 1);
    ck_assert_int_eq(hkp_cache_default_dir(buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "/home/someone/.cache/hotkern");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    ck_assert_int_eq(hkp_cache_default_dir(buf, sizeof buf), HK_ERR_NOT_FOUND);
    setenv("HOME", "/home/someone", 1);
    ck_assert_int_eq(hkp_cache_default_dir(buf, 8), HK_ERR_INVALID);
}
END_TEST

void ptx_cache_tests(TCase *tc) {
    tcase_add_test(tc, cache_tracks_headers);
    tcase_add_test(tc, cache_ptx_builds);
    tcase_add_test(tc, cache_truncated_entry_is_replaced);
    tcase_add_test(tc, cache_memory_tier);
    tcase_add_test(tc, cache_eviction_bound);
    tcase_add_test(tc, cache_default_dir);
}

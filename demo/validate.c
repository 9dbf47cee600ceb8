/*
 * The demo on a machine without a GPU: everything hotkern would do to a new
 * version before it reaches the driver, done to every kernel file the demo
 * ships.
 *
 * NVRTC and nvJitLink run on the CPU, so each source is compiled to an sm_90
 * cubin (the H200's architecture) exactly as the runtime's worker would, and
 * its kernels' parameter layouts are compared with particles.cu's, which is
 * the check that makes hotkern refuse a version with a changed layout. A user
 * without a GPU thus still learns whether their edit would be accepted.
 * variants/broken.cu is meant to fail; it is reported as an expected failure.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "demo/demo.h"
#include "ptx/ptx.h"

#define VALIDATE_ARCH 90

static int is_source(const char *name) {
    size_t n = strlen(name);
    return name[0] != '.' &&
           ((n > 3 && !strcmp(name + n - 3, ".cu")) || (n > 4 && !strcmp(name + n - 4, ".ptx")));
}

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int read_file(const char *path, char **data, size_t *size) {
    FILE *f = fopen(path, "rb");
    long n;
    char *buf = NULL;

    if (!f)
        return -1;
    if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET))
        goto fail;
    buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n)
        goto fail;
    buf[n] = 0;
    fclose(f);
    *data = buf;
    *size = (size_t)n;
    return 0;

fail:
    free(buf);
    fclose(f);
    return -1;
}

/* Lists kernel names, or the first difference from the reference's layout. */
static int compare_layout(const hkp_meta *ref, const hkp_meta *m, char *why, size_t n) {
    for (int i = 0; i < ref->nentries; i++) {
        const hkp_entry *r = &ref->entries[i];
        const hkp_entry *e = NULL;
        for (int j = 0; j < m->nentries && !e; j++)
            if (!strcmp(m->entries[j].name, r->name))
                e = &m->entries[j];
        if (!e) {
            snprintf(why, n, "kernel '%s' is missing", r->name);
            return -1;
        }
        if (e->nparams != r->nparams) {
            snprintf(why, n, "kernel '%s' takes %d parameters, particles.cu's takes %d", r->name,
                     e->nparams, r->nparams);
            return -1;
        }
        for (int p = 0; p < r->nparams; p++)
            if (e->params[p].offset != r->params[p].offset ||
                e->params[p].size != r->params[p].size) {
                snprintf(why, n, "kernel '%s': parameter %d is %u bytes at offset %u, was %u at %u",
                         r->name, p, e->params[p].size, e->params[p].offset, r->params[p].size,
                         r->params[p].offset);
                return -1;
            }
    }
    return 0;
}

static void names(const hkp_meta *m, char *buf, size_t n) {
    size_t used = 0;

    buf[0] = 0;
    for (int i = 0; i < m->nentries && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", m->entries[i].name);
    if (m->nglobals && used < n)
        used += (size_t)snprintf(buf + used, n - used, "; globals: ");
    for (int i = 0; i < m->nglobals && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", m->globals[i].name);
}

/* Builds one file; keeps the metadata of the first good build as reference.
 * Returns 0 when the outcome is the expected one. */
static int validate_one(const char *path, const char *shown, hkp_cache *cache, hkp_meta *ref,
                        int *have_ref) {
    hkp_build_opts bo = {
        .arch = VALIDATE_ARCH,
        .ptx_to_cubin = 1,
        .opt_level = 4,
        .source_name = path,
        .cache = cache,
    };
    hkp_artifact art;
    char why[512] = "", list[512], diff[256];
    char *data = NULL;
    size_t size = 0;
    int expect_fail = strstr(shown, "broken") != NULL;
    int ok;

    memset(&art, 0, sizeof art);
    if (read_file(path, &data, &size)) {
        printf("  %-34s cannot read the file\n", shown);
        return -1;
    }
    int err = hkp_build(data, size, HK_FORMAT_AUTO, &bo, &art, why, sizeof why);
    free(data);
    if (err < 0) {
        /* The log says it all when there is one; why repeats its first line. */
        printf("  %-34s %s: %s%s%s%s\n", shown, expect_fail ? "expected failure" : "FAILED",
               hk_strerror(err), art.log ? "" : " (", art.log ? "" : why, art.log ? "" : ")");
        if (art.log) {
            char *line = art.log, *nl;
            for (; line && *line; line = nl ? nl + 1 : NULL) {
                nl = strchr(line, '\n');
                int len = nl ? (int)(nl - line) : (int)strlen(line);
                if (len)
                    printf("      | %.*s\n", len, line);
            }
        }
        hkp_artifact_free(&art);
        return expect_fail ? 0 : -1;
    }
    names(&art.meta, list, sizeof list);
    ok = !expect_fail;
    if (!*have_ref) {
        /* The reference keeps pointers into art's metadata: move it out. */
        *ref = art.meta;
        memset(&art.meta, 0, sizeof art.meta);
        *have_ref = 1;
        printf("  %-34s ok (kernels: %s) %.0f ms%s\n", shown, list, art.ms,
               art.cache_hit ? " (cached)" : "");
    } else if (compare_layout(ref, &art.meta, diff, sizeof diff)) {
        printf("  %-34s built, but hotkern would refuse it: %s\n", shown, diff);
        ok = 0;
    } else {
        printf("  %-34s ok (kernels: %s) %.0f ms%s, same layout as particles.cu\n", shown, list,
               art.ms, art.cache_hit ? " (cached)" : "");
    }
    if (expect_fail)
        printf("  %-34s (it was meant to fail to compile)\n", "");
    hkp_artifact_free(&art);
    return ok ? 0 : -1;
}

/* Validates the sources of one directory; "particles.cu" goes first so that
 * it is the reference layout. Returns the number of unexpected outcomes. */
static int validate_dir(const char *dir, const char *prefix, hkp_cache *cache, hkp_meta *ref,
                        int *have_ref) {
    struct dirent **list = NULL;
    int n = scandir(dir, &list, NULL, by_name), bad = 0;
    char path[PATH_MAX], shown[PATH_MAX];

    if (n < 0) {
        if (!prefix[0]) {
            printf("  cannot list %s\n", dir);
            return 1;
        }
        return 0; /* No variants directory is fine. */
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            const char *name = list[i]->d_name;
            int first = !strcmp(name, "particles.cu");
            if (!is_source(name) || first != (pass == 0))
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, name);
            snprintf(shown, sizeof shown, "%s%s", prefix, name);
            bad += validate_one(path, shown, cache, ref, have_ref) != 0;
        }
    for (int i = 0; i < n; i++)
        free(list[i]);
    free(list);
    return bad;
}

int demo_validate(const char *dir, const char *cache_dir) {
    hkp_cache *cache = NULL;
    hkp_meta ref;
    int have_ref = 0, bad;
    char variants[PATH_MAX];

    memset(&ref, 0, sizeof ref);
    if (hkp_cache_open(&cache, cache_dir, 0, NULL) < 0)
        cache = NULL; /* Slower without it, not wrong. */
    printf("Validating the kernel files for sm_90 (NVRTC and nvJitLink run on the CPU):\n");
    bad = validate_dir(dir, "", cache, &ref, &have_ref);
    snprintf(variants, sizeof variants, "%s/variants", dir);
    bad += validate_dir(variants, "variants/", cache, &ref, &have_ref);
    if (have_ref)
        hkp_meta_free(&ref);
    hkp_cache_close(cache);
    if (bad) {
        printf("%d file(s) did not build as expected\n", bad);
        return 1;
    }
    return DEMO_EXIT_NO_GPU;
}

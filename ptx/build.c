/*
 * From any input format to a loadable image for one architecture.
 *
 * CUDA C goes through NVRTC (ptx/nvrtc.c), straight to a cubin by default.
 * Measured with the 13.0 toolkit on a 2-core machine, that and PTX followed
 * by nvJitLink cost the same (33 ms both for 3 small kernels, 264 vs 265 ms
 * for 12 larger ones; the PTX step alone is 20 and 114 ms), so the default
 * takes the path with fewer steps and copies; nvrtc_via_ptx keeps the other
 * one available, and a build that makes the canary's trap guard takes it (its
 * image and guarded copy are linked from the same PTX). PTX goes through
 * nvJitLink (ptx/link.c), never the driver JIT. Cubins and fatbins are only
 * checked.
 *
 * A build of CUDA C or PTX is looked up in the compile cache first (keys and
 * entries: ptx/deps.c, whose opening says how its "direct mode" works), and
 * stored there after it when its headers did not change during it. The
 * compile runs in this process, a section of the exit guard (base/exit.c),
 * or in the build helper when the runtime isolates its builds
 * (ptx/isolate.c), which does the same as compile_here.
 *
 * The build's files share ptx/build.h. hkp_build is thread-safe: a build's
 * state is its own (build_job), and what the builds share (the cache, the
 * PCH heap) has its own lock.
 */
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/exit.h"
#include "ptx/build.h"
#include "util/util.h"

/* ---- the build ------------------------------------------------------------ */

/* Why m does not run on o->arch, which refusals call the device (a
 * runtime's builds) or the target (o->target_name). */
static int arch_refusal(const hkp_meta *m, const hkp_build_opts *o, char *why, size_t why_size) {
    const char *target = o->target_name ? o->target_name : "device";
    int arch = o->arch;
    char a[16], d[16];
    hkp_arch_name(arch & ~(HKP_ARCH_SPECIFIC | HKP_ARCH_FAMILY), d, sizeof d);
    if (m->format == HK_FORMAT_FATBIN) {
        char list[200] = "";
        size_t used = 0;
        for (int i = 0; i < m->narchs && used < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                     hkp_arch_name(m->archs[i], a, sizeof a));
        for (int i = 0; i < m->nptx_archs && used < sizeof list; i++) {
            hkp_arch_name(m->ptx_archs[i], a, sizeof a);
            used += (size_t)snprintf(list + used, sizeof list - used, "%scompute_%s",
                                     used ? ", " : "", a + 3);
        }
        hkp_why(why, why_size, "fatbin has %s, %s is %s", list[0] ? list : "no code", target, d);
    } else {
        hkp_why(why, why_size, "%s is %s, %s is %s", m->format == HK_FORMAT_PTX ? "PTX" : "cubin",
                hkp_arch_name(m->arch, a, sizeof a), target, d);
    }
    return HK_ERR_ARCH;
}

/* Copies data; PTX gets a terminating NUL that size counts. */
static int copy_image(const void *data, size_t size, hk_format fmt, hkp_artifact *a) {
    int add_nul = fmt == HK_FORMAT_PTX && (size == 0 || ((const char *)data)[size - 1] != '\0');
    a->image = malloc(size + (size_t)add_nul);
    if (!a->image)
        return HK_ERR_NOMEM;
    memcpy(a->image, data, size);
    if (add_nul)
        ((char *)a->image)[size] = '\0';
    a->size = size + (size_t)add_nul;
    a->format = fmt;
    return 0;
}

/* Builds without the cache, in this process. */
static int compile_here(const void *data, size_t size, hk_format fmt, const hkp_build_opts *o,
                        const search_path *sp, const char *source_name, hkp_artifact *a, char *why,
                        size_t why_size) {
    int rc = 0;
    if (fmt == HK_FORMAT_CUDA_C) {
        /* data is NUL-terminated here (hkp_build made it so). A build that
         * makes a trap guard's copy goes through PTX: image and copy then
         * come from links of the same PTX with the same options (NVRTC's own
         * ptxas allocates registers otherwise than nvJitLink: 47 against 55
         * measured for one kernel with __launch_bounds__), and NVRTC's ptxas
         * is not run for a cubin that would be replaced. Unless an option
         * cannot be given to nvJitLink: then NVRTC builds the cubin and the
         * version goes unguarded. */
        const char *bad = o->trap_guard ? hkp_unlinkable_option(o) : NULL;
        int direct = o->ptx_to_cubin && !o->nvrtc_via_ptx && (!o->trap_guard || bad);
        rc = hkp_nvrtc_build(data, o, sp, source_name, direct, a, why, why_size);
        if (!rc && direct && bad) {
            char note[160];
            snprintf(note, sizeof note, "NVRTC option '%.100s' has no nvJitLink equivalent", bad);
            rc = hkp_guard_note(a, note);
        }
        if (rc || direct)
            return rc;
        /* NVRTC's PTX: linked (or left to the driver), then guarded. */
        char *ptx = malloc(a->size);
        if (!ptx)
            return HK_ERR_NOMEM;
        memcpy(ptx, a->image, a->size);
        size_t n = a->size;
        if (o->ptx_to_cubin)
            rc = hkp_jitlink_ptx(ptx, n, o->arch, o, source_name, a, why, why_size);
        if (!rc)
            rc = hkp_guard_build(ptx, n, o, o->ptx_to_cubin, o->arch, source_name, a);
        free(ptx);
        return rc;
    }
    /* PTX. The arch check comes first when the PTX parses, for a clear
     * reason; a PTX the parser refuses goes to nvJitLink, whose log names
     * the line. */
    hkp_meta pm;
    int link_arch = o->arch;
    if (hkp_meta_read(data, size, HK_FORMAT_PTX, &pm, NULL, 0) == 0) {
        if (!hkp_meta_runs_on(&pm, o->arch)) {
            rc = arch_refusal(&pm, o, why, why_size);
            hkp_meta_free(&pm);
            return rc;
        }
        if (pm.arch & HKP_ARCH_SPECIFIC)
            link_arch |= HKP_ARCH_SPECIFIC;
        hkp_meta_free(&pm);
    }
    /* The image first: a PTX that does not build is refused with its own
     * log, not with its guarded copy's. */
    rc = o->ptx_to_cubin ? hkp_jitlink_ptx(data, size, link_arch, o, source_name, a, why, why_size)
                         : copy_image(data, size, HK_FORMAT_PTX, a);
    return rc ? rc : hkp_guard_build(data, size, o, o->ptx_to_cubin, link_arch, source_name, a);
}

/* Builds without the cache. */
static int build_fresh(const void *data, size_t size, hk_format fmt, const hkp_build_opts *o,
                       const search_path *sp, const char *source_name, hkp_artifact *a, char *why,
                       size_t why_size) {
    /* Isolated: the compile steps (NVRTC, nvJitLink) run in the helper,
     * which does the same as compile_here; only PTX left for the driver
     * stays. */
    if (o->iso && (fmt == HK_FORMAT_CUDA_C || o->ptx_to_cubin))
        return hkp_iso_build(o->iso, data, size, fmt, o, sp->mem, sp->nmem, source_name, a, why,
                             why_size);
    /* In this process a compile is a section of the exit guard: exit waits
     * for it, and none begins once the process exits. A process's first
     * compile registers exit handlers of its own (measured with NVRTC 13.0:
     * 5 of libnvrtc's, 9 of the C++ library's as it loads its builtins;
     * none at later compiles), which exit would run before the guard: the
     * guard is registered again after it. */
    if (!hkb_exit_enter()) {
        hkp_why(why, why_size, "the process is exiting: nothing is compiled");
        return HK_ERR_CLOSED;
    }
    int rc = compile_here(data, size, fmt, o, sp, source_name, a, why, why_size);
    hkb_exit_leave();
    hkb_exit_rearm();
    return rc;
}

static int take_deps(hkp_artifact *a, dep_list *d) {
    if (!d->n)
        return 0;
    a->deps = hku_strv_dup((const char *const *)d->paths, d->n);
    if (!a->deps)
        return HK_ERR_NOMEM;
    a->ndeps = d->n;
    return 0;
}

/* The build's in-memory headers: opts->headers, then those of
 * base_headers whose names they do not hide. One allocation (free()). */
static int merge_headers(const hkp_build_opts *o, hk_header **out, int *n) {
    int total = (o->nheaders > 0 ? o->nheaders : 0) + (o->nbase_headers > 0 ? o->nbase_headers : 0);
    *out = NULL;
    *n = 0;
    if (total == 0)
        return 0;
    hk_header *all = calloc((size_t)total, sizeof *all);
    int k = 0;
    if (!all)
        return HK_ERR_NOMEM;
    for (int i = 0; i < o->nheaders; i++)
        all[k++] = o->headers[i];
    for (int i = 0; i < o->nbase_headers; i++) {
        int hidden = 0;
        for (int j = 0; j < o->nheaders && !hidden; j++)
            hidden = o->headers[j].name && o->base_headers[i].name &&
                     !strcmp(o->headers[j].name, o->base_headers[i].name);
        if (!hidden)
            all[k++] = o->base_headers[i];
    }
    int rc = hku_headers_dup(all, k, out);
    free(all);
    if (!rc)
        *n = k;
    return rc;
}

/* Looks the artifact that ctx and deps key (written to akey) up in cache c.
 * Returns 1 on a hit, counted, with out filled; 0 on a miss, out empty. */
static int cached(hkp_cache *c, const crypto_generichash_state *ctx, const dep_list *deps,
                  uint8_t akey[HKP_KEY_BYTES], hkp_artifact *out) {
    hkp_artifact_key(ctx, deps, akey);
    if (hkp_artifact_load(c, akey, out) == 0 &&
        hkp_meta_read(out->image, out->size, out->format, &out->meta, NULL, 0) == 0) {
        out->cache_hit = 1;
        hkp_cache_note(c, 1);
        return 1;
    }
    hkp_artifact_free(out);
    return 0;
}

/* One hkp_build's working state. */
typedef struct build_job {
    const void *data;
    size_t size;
    hk_format fmt;
    const hkp_build_opts *o;
    const char *source_name;
    search_path sp; /* its own, or a copy of opts->search's (sp_shared) */
    int sp_shared;
    hk_header *mem; /* the merged in-memory headers (merge_headers) */
    int nmem;
    dep_list deps;
    crypto_generichash_state ctx; /* the cache key's context (hkp_key_context) */
    uint8_t mkey[HKP_KEY_BYTES], akey[HKP_KEY_BYTES];
    int cacheable;
    char *src; /* CUDA C as a C string */
} build_job;

static int opts_valid(const hkp_build_opts *o, const void *data, size_t size) {
    return o && HKP_ARCH_NUM(o->arch) > 0 && (data || !size) && o->nnvrtc_options >= 0 &&
           o->nname_expressions >= 0 && (!o->nnvrtc_options || o->nvrtc_options) &&
           (!o->nname_expressions || o->name_expressions) && o->nheaders >= 0 &&
           (!o->nheaders || o->headers) && o->nbase_headers >= 0 &&
           (!o->nbase_headers || o->base_headers);
}

/* Cubins and fatbins: read, checked for the arch, copied. */
static int pass_through(build_job *j, hkp_artifact *out, char *why, size_t why_size) {
    int rc = hkp_meta_read(j->data, j->size, j->fmt, &out->meta, why, why_size);
    if (rc)
        return rc;
    if (!hkp_meta_runs_on(&out->meta, j->o->arch))
        return arch_refusal(&out->meta, j->o, why, why_size);
    return copy_image(j->data, j->size, j->fmt, out);
}

/* The in-memory headers and the include search path of options o. */
static int make_search(const hkp_build_opts *o, hk_header **mem, int *nmem, search_path *sp,
                       char *why, size_t why_size) {
    int rc = merge_headers(o, mem, nmem);
    if (rc) {
        hkp_why(why, why_size, "in-memory headers: %s",
                rc == HK_ERR_INVALID ? "a header without a name" : hk_strerror(rc));
        return rc;
    }
    return hkp_parse_search_path(o, *mem, *nmem, sp);
}

/* A search path made once for many builds (hkp_search_create). */
struct hkp_search {
    hk_header *mem; /* the merged in-memory headers */
    int nmem;
    search_path sp;
};

int hkp_search_create(const hkp_build_opts *o, hkp_search **out, char *why, size_t why_size) {
    *out = NULL;
    if (!opts_valid(o, NULL, 0)) {
        hkp_why(why, why_size, "invalid build options");
        return HK_ERR_INVALID;
    }
    hkp_search *s = calloc(1, sizeof *s);
    if (!s)
        return HK_ERR_NOMEM;
    int rc = make_search(o, &s->mem, &s->nmem, &s->sp, why, why_size);
    if (rc) {
        hkp_search_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void hkp_search_free(hkp_search *s) {
    if (!s)
        return;
    hkp_search_path_free(&s->sp);
    free(s->mem);
    free(s);
}

/* CUDA C: the in-memory headers and the include search path, the build's
 * own or the prepared one; the source's directory. */
static int job_search(build_job *j, char *why, size_t why_size) {
    int rc = 0;
    if (j->o->search) {
        j->sp = j->o->search->sp; /* its arrays stay the search's */
        j->sp_shared = 1;
    } else {
        rc = make_search(j->o, &j->mem, &j->nmem, &j->sp, why, why_size);
    }
    hkp_source_dir(j->source_name, j->sp.srcdir, sizeof j->sp.srcdir);
    return rc;
}

/* Looks the build up in the compile cache: 1 on a hit (out filled), else
 * 0 with the keys left in j for the store after the build. */
static int job_cached(build_job *j, hkp_artifact *out) {
    hkp_cache *c = j->o->cache;
    if (!c || sodium_init() < 0)
        return 0;
    j->cacheable = 1;
    hkp_key_context(&j->ctx, "ctx", j->data, j->size, j->fmt, j->o, j->source_name, &j->sp);
    if (j->fmt == HK_FORMAT_CUDA_C) {
        hkp_manifest_key(&j->ctx, j->mkey);
        if (hkp_manifest_load(c, j->mkey, &j->sp, &j->deps) == 0 &&
            cached(c, &j->ctx, &j->deps, j->akey, out))
            return 1;
        hkp_deps_free(&j->deps);
    } else if (cached(c, &j->ctx, &j->deps, j->akey, out)) {
        return 1;
    }
    hkp_cache_note(c, 0);
    return 0;
}

/* Compiles (NVRTC, nvJitLink), then reads and checks what came out. */
static int job_compile(build_job *j, hkp_artifact *out, char *why, size_t why_size) {
    int rc;
    char mwhy[256];
    if (j->fmt == HK_FORMAT_CUDA_C) {
        /* NVRTC and the include scan both want a C string. */
        if (!(j->src = malloc(j->size + 1)))
            return HK_ERR_NOMEM;
        if (j->size)
            memcpy(j->src, j->data, j->size);
        j->src[j->size] = '\0';
        rc = hkp_scan_deps(j->src, &j->sp, &j->deps);
        if (!rc)
            rc = take_deps(out, &j->deps);
        if (rc)
            return rc;
    }
    rc = build_fresh(j->src ? j->src : j->data, j->size, j->fmt, j->o, &j->sp, j->source_name, out,
                     why, why_size);
    if (rc)
        return rc;
    rc = hkp_meta_read(out->image, out->size, out->format, &out->meta, mwhy, sizeof mwhy);
    if (rc) {
        hkp_why(why, why_size, "built image unreadable: %s", mwhy);
        return rc;
    }
    if (!hkp_meta_runs_on(&out->meta, j->o->arch))
        return arch_refusal(&out->meta, j->o, why, why_size);
    return 0;
}

/* Keeps a build in the cache when its headers did not change during it.
 * A failure to cache is not a failure to build; one that the caller may
 * want to hear about is noted. */
static void job_store(build_job *j, hkp_artifact *out) {
    hkp_cache *c = j->o->cache;
    if (!j->cacheable || !hkp_deps_unchanged(&j->deps))
        return;
    hkp_artifact_key(&j->ctx, &j->deps, j->akey);
    int stored = hkp_artifact_store(c, j->akey, out);
    if (stored == 0 && j->fmt == HK_FORMAT_CUDA_C)
        stored = hkp_manifest_store(c, j->mkey, &j->deps);
    if (stored == HK_ERR_BUSY || stored == HK_ERR_IO)
        snprintf(out->cache_note, sizeof out->cache_note, "compile cache %.100s: %s: not cached",
                 hkp_cache_dir(c),
                 stored == HK_ERR_BUSY ? "its lock is held by another process"
                                       : "its lock file is refused");
}

static int build_job_run(build_job *j, hkp_artifact *out, char *why, size_t why_size) {
    int rc;
    if (j->fmt == HK_FORMAT_AUTO && (rc = hkp_detect(j->data, j->size, &j->fmt, why, why_size)))
        return rc;
    j->source_name = j->o->source_name && j->o->source_name[0] ? j->o->source_name
                     : j->fmt == HK_FORMAT_PTX                 ? "input.ptx"
                                                               : "input.cu";
    if (j->fmt == HK_FORMAT_CUBIN || j->fmt == HK_FORMAT_FATBIN)
        return pass_through(j, out, why, why_size);
    if (j->fmt != HK_FORMAT_CUDA_C && j->fmt != HK_FORMAT_PTX)
        return HK_ERR_INVALID;
    if (j->fmt == HK_FORMAT_CUDA_C && (rc = job_search(j, why, why_size)))
        return rc;
    if (job_cached(j, out))
        return 0;
    if ((rc = job_compile(j, out, why, why_size)))
        return rc;
    job_store(j, out);
    return 0;
}

int hkp_build(const void *data, size_t size, hk_format fmt, const hkp_build_opts *opts,
              hkp_artifact *out, char *why, size_t why_size) {
    double t0 = hku_now_ms();
    if (why && why_size)
        why[0] = '\0';
    if (!out)
        return HK_ERR_INVALID;
    memset(out, 0, sizeof *out);
    if (!opts_valid(opts, data, size)) {
        hkp_why(why, why_size, "invalid build options");
        return HK_ERR_INVALID;
    }
    build_job j = {.data = data, .size = size, .fmt = fmt, .o = opts};
    int rc = build_job_run(&j, out, why, why_size);
    free(j.src);
    hkp_deps_free(&j.deps);
    if (!j.sp_shared)
        hkp_search_path_free(&j.sp);
    free(j.mem);
    out->ms = hku_now_ms() - t0;
    return rc;
}

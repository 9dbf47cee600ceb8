/*
 * The ptx suite's fixture (fixture.h): images built at test time, the
 * metadata lookups, the base build options. A helper one part alone needs
 * stays in that part.
 */
#include "tests/ptx/fixture.h"

const char *const KERNELS_CU =
    "struct Pair { double d; char c[20]; };\n"
    "__device__ int counter;\n"
    "__constant__ float coeffs[16];\n"
    "__device__ float table[3] = {1, 2, 3};\n"
    "extern \"C\" __global__ void scale(float *x, float a, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] *= a * coeffs[0] * table[i % 3];\n"
    "    atomicAdd(&counter, 1);\n"
    "}\n"
    "extern \"C\" __global__ void mixed(Pair p, char c, double *o, short q) {\n"
    "    *o = p.d + c + q + p.c[3];\n"
    "}\n"
    "extern \"C\" __global__ void noargs() {}\n";

void *nvrtc_image(const char *src, const char *arch, size_t *size) {
    nvrtcProgram p;
    char opt[64];
    snprintf(opt, sizeof opt, "--gpu-architecture=%s", arch);
    const char *opts[] = {opt};
    ck_assert_int_eq(nvrtcCreateProgram(&p, src, "t.cu", 0, NULL, NULL), NVRTC_SUCCESS);
    nvrtcResult r = nvrtcCompileProgram(p, 1, opts);
    if (r != NVRTC_SUCCESS) {
        size_t n;
        nvrtcGetProgramLogSize(p, &n);
        char *log = malloc(n);
        nvrtcGetProgramLog(p, log);
        ck_abort_msg("NVRTC failed: %s", log);
    }
    int cubin = strncmp(arch, "sm_", 3) == 0;
    size_t n = 0;
    ck_assert_int_eq(cubin ? nvrtcGetCUBINSize(p, &n) : nvrtcGetPTXSize(p, &n), NVRTC_SUCCESS);
    void *img = malloc(n);
    ck_assert_ptr_nonnull(img);
    ck_assert_int_eq(cubin ? nvrtcGetCUBIN(p, img) : nvrtcGetPTX(p, img), NVRTC_SUCCESS);
    nvrtcDestroyProgram(&p);
    *size = n;
    return img;
}

void *read_whole(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    void *buf = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return buf;
}

const hkp_entry *find_entry(const hkp_meta *m, const char *name) {
    for (int i = 0; i < m->nentries; i++)
        if (strcmp(m->entries[i].name, name) == 0)
            return &m->entries[i];
    return NULL;
}

const hkp_global *find_global(const hkp_meta *m, const char *name) {
    for (int i = 0; i < m->nglobals; i++)
        if (strcmp(m->globals[i].name, name) == 0)
            return &m->globals[i];
    return NULL;
}

hkp_build_opts base_opts(int arch) {
    hkp_build_opts o = {.arch = arch, .ptx_to_cubin = 1, .opt_level = 3};
    return o;
}

uint64_t dir_bytes(const char *dir, int *entries, int *tmps) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    uint64_t sum = 0;
    *entries = 0;
    if (tmps)
        *tmps = 0;
    while ((de = readdir(d)) != NULL) {
        char p[1024];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (stat(p, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (strstr(de->d_name, ".hkc.tmp.")) {
            if (tmps)
                (*tmps)++;
        } else if (strstr(de->d_name, ".hkc")) {
            (*entries)++;
            sum += (uint64_t)st.st_size;
        }
    }
    closedir(d);
    return sum;
}

const char *const USES_COMMON =
    "#include <cuda/std/cstdint>\n"
    "#include \"common.cuh\"\n"
    "extern \"C\" __global__ void k(cuda::std::int32_t *x) { x[threadIdx.x] = K; }\n";

int ptx_has_constant(const char *src, hkp_build_opts o, long value, hkp_artifact *keep) {
    hkp_artifact a;
    char why[512], needle[64];
    o.ptx_to_cubin = 0;
    int rc = hkp_build(src, strlen(src), HK_FORMAT_CUDA_C, &o, &a, why, sizeof why);
    ck_assert_msg(rc == 0, "%s\n%s", why, a.log ? a.log : "");
    snprintf(needle, sizeof needle, ", %ld;", value);
    int found = strstr(a.image, needle) != NULL;
    if (keep)
        *keep = a;
    else
        hkp_artifact_free(&a);
    return found;
}

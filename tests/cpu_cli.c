/*
 * The hotkern tool as a script uses it: the built binary is run on files
 * written here, and its exit status, compiler-style messages and --json
 * documents are checked. The JSON cases run push, status and rollback against
 * a real endpoint (libmicrohttpd, in this process, with a recording engine)
 * and pull against Debian's nginx; the network subcommands' other behaviour
 * has its own suites (cpu_endpoint, cpu_pull).
 */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "net/net.h"
#include "tests/harness.h"

static char *dir;
static char out[16384];
static char jout[65536]; /* stdout of the last hotkern_json */
static cJSON *doc;       /* ... parsed */

/* Runs `hotkern ARGS` with stdout and stderr captured into out; returns the
 * exit status. */
static int hotkern(const char *args) {
    char cmd[8192], log[4200];
    snprintf(log, sizeof log, "%s/out.txt", dir);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s > '%s' 2>&1", dir, hkt_built_program("hotkern"),
             args, log);
    int st = system(cmd);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = 0;
    if (f)
        fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void put(const char *name, const char *text) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ck_assert_int_eq(hkt_write_file(p, text), 0);
}

static void setup(void) {
    dir = hkt_tmpdir();
    put("ok.cu", "extern \"C\" __global__ void k(int *x) { x[0] = 1; }\n"
                 "extern \"C\" __global__ void j(float *y, int n) { y[n] = 2.0f; }\n");
    put("bad.cu", "extern \"C\" __global__ void k(int *x) {\n  x[0] = ;\n}\n");
    put("hdr.cu", "#include \"inc/v.h\"\nextern \"C\" __global__ void k(int *x) { x[0] = V; }\n");
}

static void teardown(void) {
    cJSON_Delete(doc);
    doc = NULL;
    hkt_rmtree(dir);
    free(dir);
}

START_TEST(good_file_lists_kernels) {
    ck_assert_int_eq(hotkern("check ok.cu"), 0);
    ck_assert_msg(strstr(out, "ok.cu: ok (2 kernels:"), "%s", out);
    ck_assert_msg(strstr(out, "k") && strstr(out, "j"), "%s", out);
}
END_TEST

START_TEST(compile_error_like_a_compiler) {
    ck_assert_int_eq(hotkern("check ok.cu bad.cu"), 1);
    ck_assert_msg(strstr(out, "ok.cu: ok"), "%s", out);       /* the good file still passes */
    ck_assert_msg(strstr(out, "bad.cu:2: error"), "%s", out); /* file:line: error */
}
END_TEST

START_TEST(defines_and_include_paths) {
    ck_assert_int_eq(hotkern("check hdr.cu"), 1); /* inc/v.h is not there yet */
    char mk[4400];
    snprintf(mk, sizeof mk, "mkdir -p '%s/inc' '%s/other' && echo '#define V 7' > '%s/inc/v.h'",
             dir, dir, dir);
    ck_assert_int_eq(system(mk), 0);
    ck_assert_int_eq(hotkern("check hdr.cu"), 0); /* found beside the source */
    put("def.cu", "extern \"C\" __global__ void k(int *x) { x[0] = W; }\n");
    ck_assert_int_eq(hotkern("check def.cu"), 1);
    ck_assert_int_eq(hotkern("check -D W=3 def.cu"), 0);
    put("other/w.h", "#define WW 5\n");
    put("inc.cu", "#include \"w.h\"\nextern \"C\" __global__ void k(int *x) { x[0] = WW; }\n");
    ck_assert_int_eq(hotkern("check inc.cu"), 1);
    ck_assert_int_eq(hotkern("check -I other inc.cu"), 0);
}
END_TEST

START_TEST(toolkit_headers_need_no_include_dirs) {
    put("sum.cu", "#include <cub/block/block_reduce.cuh>\n"
                  "#include <cuda/std/cstdint>\n"
                  "extern \"C\" __global__ void sum(const float *in, float *out) {\n"
                  "    using BR = cub::BlockReduce<float, 64>;\n"
                  "    __shared__ typename BR::TempStorage t;\n"
                  "    float s = BR(t).Sum(in[threadIdx.x]);\n"
                  "    if (threadIdx.x == 0) *out = s + (cuda::std::int8_t)1;\n"
                  "}\n");
    ck_assert_int_eq(hotkern("check sum.cu"), 0);
    ck_assert_msg(strstr(out, "sum.cu: ok (1 kernel: sum)"), "%s", out);
}
END_TEST

START_TEST(templates_without_instantiation) {
    put("tmpl.cu", "// a comment that says template __global__ void fake(\n"
                   "template <typename T, int N>\n"
                   "__global__ void scale(T *x, T a) { x[threadIdx.x] *= a * N; }\n"
                   "template <class T> __global__ void fill(T *x) { x[0] = T(); }\n");
    ck_assert_int_eq(hotkern("check tmpl.cu"), 1);
    ck_assert_msg(strstr(out, "tmpl.cu: error: no kernel was instantiated: scale, fill are "
                              "templates"),
                  "%s", out);
    ck_assert_msg(strstr(out, "--name-expression 'scale<float, 1>' tmpl.cu"), "%s", out);
    ck_assert_msg(!strstr(out, "fake"), "%s", out);
    ck_assert_msg(!strstr(out, "ok (0 kernels)"), "%s", out);
    /* Following the advice works. */
    ck_assert_int_eq(hotkern("check --name-expression 'scale<float, 1>' tmpl.cu"), 0);
    ck_assert_msg(strstr(out, "tmpl.cu: ok (1 kernel: _Z5scaleIfLi1EEvPT_S0_)"), "%s", out);
    ck_assert_int_eq(hotkern("check '--name-expression=fill<int>' --name-expression "
                             "'scale<double, 2>' tmpl.cu"),
                     0);
    ck_assert_msg(strstr(out, "tmpl.cu: ok (2 kernels:"), "%s", out);
    /* A file with no kernels at all is still just empty. */
    put("none.cu", "__device__ int f(int x) { return x; }\n");
    ck_assert_int_eq(hotkern("check none.cu"), 0);
    ck_assert_msg(strstr(out, "none.cu: ok (0 kernels)"), "%s", out);
    ck_assert_int_eq(hotkern("check --name-expression"), 2);
}
END_TEST

/* One checker for all files (the default) and a fresh check per file
 * (--no-reuse) say the same, and neither mentions NVRTC's precompiled
 * header, which only the first uses. */
START_TEST(reuse_or_not_same_output) {
    put("fp.cu", "#include <cuda_fp16.h>\n#include \"inc/v.h\"\n"
                 "extern \"C\" __global__ void h(__half *x) { x[0] = __float2half(V); }\n");
    char mk[4400], first[sizeof out];
    snprintf(mk, sizeof mk, "mkdir -p '%s/inc' && echo '#define V 7' > '%s/inc/v.h'", dir, dir);
    ck_assert_int_eq(system(mk), 0);
    ck_assert_int_eq(hotkern("check ok.cu fp.cu bad.cu fp.cu"), 1);
    ck_assert_msg(strstr(out, "fp.cu: ok (1 kernel: h)") && strstr(out, "bad.cu:2: error"), "%s",
                  out);
    ck_assert_msg(!strstr(out, "precompiled"), "%s", out);
    memcpy(first, out, sizeof out);
    ck_assert_int_eq(hotkern("check --no-reuse ok.cu fp.cu bad.cu fp.cu"), 1);
    ck_assert_str_eq(out, first);
}
END_TEST

START_TEST(usage_and_bad_input) {
    ck_assert_int_eq(hotkern("check"), 2);
    ck_assert_int_eq(hotkern("check --bogus ok.cu"), 2);
    ck_assert_int_eq(hotkern("check --help"), 0);
    ck_assert_int_eq(hotkern("check missing.cu"), 1);
    put("garbage.bin", "\x7f"
                       "ELF not really");
    ck_assert_int_eq(hotkern("check garbage.bin"), 1);
    ck_assert_int_eq(hotkern("nosuchcommand"), 2);
}
END_TEST

/* An architecture NVRTC does not know is a usage error (exit 2) that lists
 * the ones it does, not a failure of the file. */
START_TEST(unknown_arch_is_usage) {
    ck_assert_int_eq(hotkern("check --arch sm_999 ok.cu"), 2);
    ck_assert_msg(!strstr(out, "ok.cu"), "%s", out);
    ck_assert_msg(strstr(out, "unknown --arch 'sm_999'") && strstr(out, "sm_90") &&
                      strstr(out, "--help"),
                  "%s", out);
    ck_assert_int_eq(hotkern("check --arch sm_x ok.cu"), 2);
    ck_assert_msg(strstr(out, "sm_90"), "%s", out);
    ck_assert_int_eq(hotkern("check --arch 90 ok.cu"), 0);
    ck_assert_int_eq(hotkern("check --arch compute_80 ok.cu"), 0);
    ck_assert_int_eq(hotkern("check --arch sm_90a ok.cu"), 0);
}
END_TEST

#define NVCC "/usr/local/cuda/bin/nvcc"

static int hotkern_json(const char *command, const char *args);
static const cJSON *field(const cJSON *o, const char *name);

static const char *const CPP_CU =
    "namespace ns { template <typename T> __global__ void scale(T *x, T a) { x[0] *= a; } }\n"
    "template __global__ void ns::scale<float>(float *, float);\n"
    "__global__ void over(int *x, double d) { x[0] = (int)d; }\n"
    "extern \"C\" __global__ void plain(int *x) { x[0] = 1; }\n";

/* A cubin and fatbins made by nvcc from CPP_CU, in dir: cpp.cubin (sm_80),
 * cpp.fatbin (sm_80 code, compute_90 PTX, which nvcc compresses) and
 * ptx.fatbin (compute_90 PTX stored plain). */
static void nvcc_images(void) {
    char cmd[8192];
    put("cpp.cu", CPP_CU);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && " NVCC " -cubin -arch sm_80 -o cpp.cubin cpp.cu && " NVCC
             " -fatbin -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=compute_90"
             " -o cpp.fatbin cpp.cu && " NVCC
             " -fatbin -Xfatbin -compress=false -gencode arch=compute_90,code=compute_90"
             " -o ptx.fatbin cpp.cu",
             dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* What check says of a cubin, a fatbin and CUDA C: a fatbin's kernels (read
 * from its members), each file's architectures, and C++ kernel names
 * demangled beside the mangled ones. */
START_TEST(check_lists_fatbin_kernels_archs_demangled) {
    nvcc_images();
    ck_assert_int_eq(hotkern("check --arch sm_90 cpp.cu cpp.cubin cpp.fatbin ptx.fatbin"), 1);
    /* cpp.cubin is sm_80 code: no use on sm_90. */
    ck_assert_msg(strstr(out, "cpp.cubin: error"), "%s", out);
    ck_assert_msg(strstr(out, "cpp.fatbin: ok (fatbin: sm_80, compute_90; 3 kernels: "), "%s", out);
    ck_assert_msg(strstr(out, "ptx.fatbin: ok (fatbin: compute_90; 3 kernels: "), "%s", out);
    ck_assert_msg(strstr(out, "  _ZN2ns5scaleIfEEvPT_S1_ = void ns::scale<float>(float*, float)\n"),
                  "%s", out);
    ck_assert_msg(strstr(out, "  _Z4overPid = over(int*, double)\n"), "%s", out);
    ck_assert_msg(!strstr(out, "plain = "), "%s", out); /* a C name stays as it is */

    ck_assert_int_eq(hotkern_json("check", "--arch sm_86 cpp.cu cpp.cubin cpp.fatbin"), 0);
    const cJSON *files = field(doc, "files");
    const char *want_arch[] = {"sm_86", "sm_80", "sm_80"};
    for (int f = 0; f < 3; f++) {
        const cJSON *rec = cJSON_GetArrayItem(files, f);
        const cJSON *k = field(rec, "kernels"), *d = field(rec, "demangled");
        const cJSON *ar = field(rec, "archs");
        ck_assert_msg(cJSON_GetArraySize(k) == 3 && cJSON_GetArraySize(d) == 3, "%s", jout);
        ck_assert_msg(cJSON_GetArraySize(ar) >= 1, "%s", jout);
        ck_assert_str_eq(cJSON_GetArrayItem(ar, 0)->valuestring, want_arch[f]);
        int seen = 0;
        for (int i = 0; i < 3; i++) {
            const char *kn = cJSON_GetArrayItem(k, i)->valuestring;
            const cJSON *dn = cJSON_GetArrayItem(d, i);
            if (!strcmp(kn, "plain")) {
                ck_assert(cJSON_IsNull(dn));
                seen |= 1;
            } else if (!strcmp(kn, "_Z4overPid")) {
                ck_assert_str_eq(dn->valuestring, "over(int*, double)");
                seen |= 2;
            } else if (!strcmp(kn, "_ZN2ns5scaleIfEEvPT_S1_")) {
                ck_assert_str_eq(dn->valuestring, "void ns::scale<float>(float*, float)");
                seen |= 4;
            }
        }
        ck_assert_msg(seen == 7, "%s", jout);
    }
    /* --ptx-only: CUDA C checked as PTX for the architecture. */
    ck_assert_int_eq(hotkern_json("check", "--ptx-only cpp.cu"), 0);
    const cJSON *ar = field(cJSON_GetArrayItem(field(doc, "files"), 0), "archs");
    ck_assert_str_eq(cJSON_GetArrayItem(ar, 0)->valuestring, "compute_90");
}
END_TEST

/* Occurrences of needle in hay. */
static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* A poll's error is printed once, as it happens: not again as the
 * command's failure at the end. */
START_TEST(pull_error_printed_once) {
    ck_assert_int_eq(hotkern("keygen --out keys"), 0);
    ck_assert_int_eq(hotkern("pull http://127.0.0.1:1/m.json --pubkey keys/hotkern.pub --state st "
                             "--once"),
                     1);
    ck_assert_msg(count_of(out, "HK_ERR_NETWORK") == 1, "%s", out);
    ck_assert_msg(strstr(out, "errors 1"), "%s", out);
    ck_assert_int_eq(hotkern("pull http://127.0.0.1:1/m.json --pubkey keys/hotkern.pub --state st "
                             "--count 2 --interval-ms 10"),
                     1);
    ck_assert_msg(count_of(out, "HK_ERR_NETWORK") == 2, "%s", out); /* one a poll */
    /* --quiet leaves the polls' errors out; the failure is still said once. */
    ck_assert_int_eq(hotkern("pull http://127.0.0.1:1/m.json --pubkey keys/hotkern.pub --state st "
                             "--count 2 --interval-ms 10 --quiet"),
                     1);
    ck_assert_msg(count_of(out, "HK_ERR_NETWORK") == 1, "%s", out);
}
END_TEST

/* ---- --json -------------------------------------------------------------- */

static size_t slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
    return n;
}

/* The fields every document has, whatever the command and outcome. */
static void common_fields(const char *command, int rc) {
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(doc, "ok");
    const cJSON *cmd = cJSON_GetObjectItemCaseSensitive(doc, "command");
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(doc, "exit");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(doc, "error");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(doc, "code");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(doc, "message");
    const cJSON *log = cJSON_GetObjectItemCaseSensitive(doc, "log");
    ck_assert_msg(cJSON_IsBool(ok) && cJSON_IsTrue(ok) == (rc == 0), "%s", jout);
    ck_assert_msg(cJSON_IsString(cmd) && !strcmp(cmd->valuestring, command), "%s", jout);
    ck_assert_msg(cJSON_IsNumber(ex) && ex->valueint == rc, "%s", jout);
    ck_assert_msg(cJSON_IsNumber(code) && log && (cJSON_IsNull(log) || cJSON_IsString(log)), "%s",
                  jout);
    if (rc == 0) {
        ck_assert_msg(cJSON_IsNull(err) && cJSON_IsNull(msg) && code->valueint == 0, "%s", jout);
    } else {
        ck_assert_msg(cJSON_IsString(err) && !strncmp(err->valuestring, "HK_ERR_", 7), "%s", jout);
        ck_assert_msg(cJSON_IsString(msg) && msg->valuestring[0] && code->valueint < 0, "%s", jout);
    }
}

/* Runs `hotkern COMMAND --json ARGS`: stdout must be exactly one line holding
 * one JSON document with the common fields, and stderr must stay empty. The
 * document is left in doc; returns the exit status. */
static int hotkern_json(const char *command, const char *args) {
    char cmd[16384], jpath[4200], epath[4200];
    snprintf(jpath, sizeof jpath, "%s/json.txt", dir);
    snprintf(epath, sizeof epath, "%s/err.txt", dir);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s --json %s > '%s' 2> '%s'", dir,
             hkt_built_program("hotkern"), command, args, jpath, epath);
    int st = system(cmd), rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    size_t n = slurp(jpath, jout, sizeof jout);
    slurp(epath, out, sizeof out);
    ck_assert_msg(out[0] == 0, "stderr: %s", out);
    ck_assert_msg(n > 0 && jout[n - 1] == '\n' && strchr(jout, '\n') == jout + n - 1, "%s", jout);
    cJSON_Delete(doc);
    const char *end = NULL;
    doc = cJSON_ParseWithOpts(jout, &end, 0);
    ck_assert_msg(cJSON_IsObject(doc), "not a JSON object: %s", jout);
    ck_assert_msg(end && strspn(end, "\n") == strlen(end), "after the document: %s", end);
    common_fields(command, rc);
    return rc;
}

static const cJSON *field(const cJSON *o, const char *name) {
    ck_assert_msg(cJSON_HasObjectItem(o, name), "no field '%s' in %s", name, jout);
    return cJSON_GetObjectItemCaseSensitive(o, name);
}

/* Asserts each documented field is present (null or not). */
static void fields(const cJSON *o, const char *const *names) {
    for (; *names; names++)
        field(o, *names);
}

static const char *str(const cJSON *o, const char *name) {
    const cJSON *v = field(o, name);
    ck_assert_msg(cJSON_IsString(v), "'%s' is not a string in %s", name, jout);
    return v->valuestring;
}

static double num(const cJSON *o, const char *name) {
    const cJSON *v = field(o, name);
    ck_assert_msg(cJSON_IsNumber(v), "'%s' is not a number in %s", name, jout);
    return v->valuedouble;
}

static const char *const check_fields[] = {"arch", "files", NULL};
static const char *const file_fields[] = {"file",      "ok",          "format", "kernels",
                                          "demangled", "archs",       "error",  "code",
                                          "message",   "diagnostics", "log",    NULL};

START_TEST(check_json) {
    ck_assert_int_eq(hotkern_json("check", "ok.cu"), 0);
    fields(doc, check_fields);
    ck_assert_str_eq(str(doc, "arch"), "sm_90");
    const cJSON *f0 = cJSON_GetArrayItem(field(doc, "files"), 0);
    fields(f0, file_fields);
    ck_assert_str_eq(str(f0, "file"), "ok.cu");
    ck_assert(cJSON_IsTrue(field(f0, "ok")));
    ck_assert_str_eq(str(f0, "format"), "cuda");
    ck_assert_int_eq(cJSON_GetArraySize(field(f0, "kernels")), 2);
    ck_assert_int_eq(cJSON_GetArraySize(field(f0, "diagnostics")), 0);

    /* A compile error: the document's error is the failing file's, and the
     * file's record has the message as a diagnostic with file and line. */
    ck_assert_int_eq(hotkern_json("check", "--arch sm_80 ok.cu bad.cu"), 1);
    fields(doc, check_fields);
    ck_assert_str_eq(str(doc, "arch"), "sm_80");
    ck_assert_str_eq(str(doc, "error"), "HK_ERR_COMPILE");
    ck_assert_int_eq((int)num(doc, "code"), HK_ERR_COMPILE);
    ck_assert_ptr_nonnull(strstr(str(doc, "log"), "expected an expression"));
    ck_assert(cJSON_IsTrue(field(cJSON_GetArrayItem(field(doc, "files"), 0), "ok")));
    const cJSON *f1 = cJSON_GetArrayItem(field(doc, "files"), 1);
    fields(f1, file_fields);
    ck_assert(cJSON_IsFalse(field(f1, "ok")));
    ck_assert_str_eq(str(f1, "error"), "HK_ERR_COMPILE");
    const cJSON *d = cJSON_GetArrayItem(field(f1, "diagnostics"), 0);
    ck_assert_str_eq(str(d, "file"), "bad.cu");
    ck_assert_int_eq((int)num(d, "line"), 2);
    ck_assert_str_eq(str(d, "severity"), "error");
    ck_assert_str_eq(str(d, "message"), "expected an expression");

    /* A file that cannot be read, and usage errors, come as documents too. */
    ck_assert_int_eq(hotkern_json("check", "missing.cu"), 1);
    ck_assert_ptr_nonnull(strstr(str(doc, "message"), "missing.cu"));
    ck_assert_int_eq(hotkern_json("check", "--bogus ok.cu"), 2);
    ck_assert_str_eq(str(doc, "error"), "HK_ERR_INVALID");
    ck_assert_ptr_nonnull(strstr(str(doc, "message"), "--bogus"));
    ck_assert_int_eq(hotkern_json("check", ""), 2);
    ck_assert_int_eq(hotkern_json("check", "--arch sm_x ok.cu"), 2);
    ck_assert_int_eq(hotkern_json("check", "--arch sm_999 ok.cu"), 2);
    ck_assert_str_eq(str(doc, "error"), "HK_ERR_INVALID");
    ck_assert_ptr_nonnull(strstr(str(doc, "message"), "sm_90"));
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(doc, "files"));
    /* --help stays text. */
    ck_assert_int_eq(hotkern("check --json --help"), 0);
    ck_assert_msg(strstr(out, "usage: hotkern check") && !strchr(out, '{'), "%s", out);
}
END_TEST

/* ---- an endpoint with a recording engine --------------------------------- */

static struct {
    pthread_mutex_t lock;
    uint64_t version; /* last release applied */
    int fail_with;    /* when set, apply refuses with this and a log */
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int rec_apply(void *ud, const char *module, uint64_t version, hk_format fmt,
                     const void *bytes, size_t size, const hk_header *headers, int nheaders,
                     const char *origin, hk_report *rep) {
    pthread_mutex_lock(&rec.lock);
    int err = rec.fail_with;
    if (!err)
        rec.version = version;
    pthread_mutex_unlock(&rec.lock);
    if (err) {
        rep->log = strdup("add.cu(1): error: identifier \"y\" is undefined\n");
        return hku_fail(rep, err, "NVRTC refused it");
    }
    return 0;
}

static uint64_t rec_version(void *ud, const char *module) {
    pthread_mutex_lock(&rec.lock);
    uint64_t v = rec.version;
    pthread_mutex_unlock(&rec.lock);
    return v;
}

static hkn_endpoint *ep;
static char base[64];

/* Keys in dir (hotkern.key, hotkern.pub and an untrusted other.pub), add.cu,
 * and an endpoint trusting hotkern.pub (with a bearer token when given). */
static void net_setup(const char *token) {
    hkn_seckey key, other;
    hk_report rep = HK_REPORT_INIT;
    char p[PATH_MAX];
    ck_assert_int_eq(hkn_keygen(&key), 0);
    ck_assert_int_eq(hkn_keygen(&other), 0);
    snprintf(p, sizeof p, "%s/hotkern.key", dir);
    ck_assert_int_eq(hkn_seckey_save(p, &key, &rep), 0);
    snprintf(p, sizeof p, "%s/hotkern.pub", dir);
    ck_assert_int_eq(hkn_pubkey_save(p, &key.pub, &rep), 0);
    snprintf(p, sizeof p, "%s/other.pub", dir);
    ck_assert_int_eq(hkn_pubkey_save(p, &other.pub, &rep), 0);
    put("add.cu", "extern \"C\" __global__ void add(float *x) { x[0] += 1; }\n");
    hk_endpoint_options o;
    hkn_endpoint_resolved r = {0};
    hk_endpoint_options_init(&o);
    o.token = token;
    r.trust.keys[0] = key.pub;
    r.trust.nkeys = 1;
    snprintf(p, sizeof p, "%s/state", dir);
    r.state_dir = p;
    hkn_engine eng = {.apply = rec_apply, .version = rec_version};
    ck_assert_msg(hkn_endpoint_start(&o, &r, &eng, &ep, &rep) == 0, "endpoint: %s", rep.message);
    snprintf(base, sizeof base, "http://127.0.0.1:%u", hkn_endpoint_port(ep));
}

static void net_teardown(void) {
    hkn_endpoint_stop(ep);
    ep = NULL;
}

static const char *const push_fields[] = {
    "url",      "module",   "release",   "outcome", "http_status", "engine_version",
    "build_ms", "stage_ms", "commit_ms", NULL};

START_TEST(push_json) {
    char args[512];
    net_setup(NULL);
    snprintf(args, sizeof args, "%s --key hotkern.key --module add --release 42 add.cu", base);
    ck_assert_int_eq(hotkern_json("push", args), 0);
    fields(doc, push_fields);
    ck_assert_str_eq(str(doc, "outcome"), "committed");
    ck_assert_str_eq(str(doc, "module"), "add");
    ck_assert_str_eq(str(doc, "url"), base);
    ck_assert_int_eq((int)num(doc, "release"), 42);
    ck_assert_int_eq((int)num(doc, "http_status"), 200);
    ck_assert_int_eq((int)num(doc, "engine_version"), 42);
    num(doc, "build_ms");
    /* The same release again: the endpoint's refusal, exit 1. */
    ck_assert_int_eq(hotkern_json("push", args), 1);
    fields(doc, push_fields);
    ck_assert_str_eq(str(doc, "error"), "HK_ERR_REPLAY");
    ck_assert_int_eq((int)num(doc, "code"), HK_ERR_REPLAY);
    ck_assert_int_eq((int)num(doc, "http_status"), 409);
    /* The engine refuses the build: its log reaches the document. */
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = HK_ERR_COMPILE;
    pthread_mutex_unlock(&rec.lock);
    snprintf(args, sizeof args, "%s --key hotkern.key --module add --release 43 add.cu", base);
    ck_assert_int_eq(hotkern_json("push", args), 1);
    ck_assert_str_eq(str(doc, "error"), "HK_ERR_COMPILE");
    ck_assert_str_eq(str(doc, "outcome"), "refused");
    ck_assert_int_eq((int)num(doc, "http_status"), 422);
    ck_assert_ptr_nonnull(strstr(str(doc, "log"), "identifier \"y\" is undefined"));
    /* Nothing listens: a transport error, no HTTP status. */
    ck_assert_int_eq(hotkern_json("push", "http://127.0.0.1:1 --key hotkern.key --module add "
                                          "--timeout 5 add.cu"),
                     1);
    fields(doc, push_fields);
    ck_assert_str_eq(str(doc, "error"), "HK_ERR_NETWORK");
    ck_assert(cJSON_IsNull(field(doc, "http_status")));
    ck_assert(cJSON_IsNull(field(doc, "outcome")));
    /* A key that cannot be read. */
    snprintf(args, sizeof args, "%s --key nokey --module add add.cu", base);
    ck_assert_int_eq(hotkern_json("push", args), 1);
    ck_assert_ptr_nonnull(strstr(str(doc, "message"), "nokey"));
    net_teardown();
}
END_TEST

/* A push refused for its key (before the endpoint could verify anything)
 * still names its module: the one the tool signed. */
START_TEST(push_refused_for_its_key_names_the_module) {
    char args[512];
    net_setup(NULL);
    ck_assert_int_eq(hotkern("keygen --out stranger"), 0);
    snprintf(args, sizeof args,
             "push %s --key stranger/hotkern.key --module add --release 5 add.cu", base);
    ck_assert_int_eq(hotkern(args), 1);
    ck_assert_msg(strstr(out, "(HTTP 403): module add ") && strstr(out, "release v5"), "%s", out);
    ck_assert_msg(strstr(out, "HK_ERR_"), "%s", out);
    ck_assert_int_eq(hotkern_json("push", args + 5), 1);
    ck_assert_str_eq(str(doc, "module"), "add");
    ck_assert_int_eq((int)num(doc, "release"), 5);
    ck_assert_int_eq((int)num(doc, "http_status"), 403);
    pthread_mutex_lock(&rec.lock);
    ck_assert_uint_eq(rec.version, 0); /* nothing was applied */
    pthread_mutex_unlock(&rec.lock);
    net_teardown();
}
END_TEST

/* --release names the release; --version is the tool's and is refused with
 * a pointer to --release, as text and as JSON. */
START_TEST(release_option) {
    net_setup(NULL);
    char args[512];
    snprintf(args, sizeof args, "push %s --key hotkern.key --module add --version 7 add.cu", base);
    ck_assert_int_eq(hotkern(args), 2);
    ck_assert_msg(strstr(out, "--release N"), "%s", out);
    ck_assert_int_eq(hotkern("sign --key hotkern.key --module add --version 7 --out rel add.cu"),
                     2);
    ck_assert_msg(strstr(out, "--release N"), "%s", out);
    ck_assert_int_eq(hotkern_json("push", args + 5), 2);
    ck_assert_str_eq(str(doc, "error"), "HK_ERR_INVALID");
    ck_assert_ptr_nonnull(strstr(str(doc, "message"), "--release"));
    pthread_mutex_lock(&rec.lock);
    ck_assert_uint_eq(rec.version, 0); /* nothing was pushed */
    pthread_mutex_unlock(&rec.lock);
    ck_assert_int_eq(hotkern("push x --key k --module add --release 0 add.cu"), 2);
    ck_assert_int_eq(hotkern("push x --key k --module add --release 9007199254740992 add.cu"), 2);
    ck_assert_int_eq(hotkern("sign --key hotkern.key --module add --release 9007199254740991 "
                             "--out rel add.cu"),
                     0);
    ck_assert_int_eq(hotkern("--version"), 0);
    ck_assert_msg(!strncmp(out, "hotkern ", 8), "%s", out);
    net_teardown();
}
END_TEST

START_TEST(status_json) {
    char args[512];
    net_setup("s3cret");
    snprintf(args, sizeof args,
             "%s --token s3cret --key hotkern.key --module add --release 9007199254740991 add.cu",
             base);
    ck_assert_int_eq(hotkern_json("push", args), 0);
    /* Release numbers print exactly up to 2^53 - 1. */
    ck_assert_msg(strstr(jout, "\"release\":9007199254740991,"), "%s", jout);
    snprintf(args, sizeof args, "%s --token s3cret", base);
    ck_assert_int_eq(hotkern_json("status", args), 0);
    static const char *const status_fields[] = {"url", "http_status", "endpoint", NULL};
    fields(doc, status_fields);
    ck_assert_int_eq((int)num(doc, "http_status"), 200);
    const cJSON *m0 = cJSON_GetArrayItem(field(field(doc, "endpoint"), "modules"), 0);
    ck_assert_str_eq(str(m0, "module"), "add");
    ck_assert_str_eq(str(m0, "last_outcome"), "committed");
    /* A wrong token: the endpoint's 401 as the document's error. */
    snprintf(args, sizeof args, "%s --token wrong", base);
    ck_assert_int_eq(hotkern_json("status", args), 1);
    fields(doc, status_fields);
    ck_assert_str_eq(str(doc, "error"), "HK_ERR_REJECTED");
    ck_assert_int_eq((int)num(doc, "http_status"), 401);
    ck_assert(cJSON_IsNull(field(doc, "endpoint")));
    ck_assert_int_eq(hotkern_json("status", ""), 2);
    /* rollback shares the outcome fields; this engine cannot roll back. */
    snprintf(args, sizeof args, "%s add --token s3cret", base);
    ck_assert_int_eq(hotkern_json("rollback", args), 1);
    static const char *const rb_fields[] = {"outcome", "http_status",    "module",
                                            "release", "engine_version", NULL};
    fields(doc, rb_fields);
    ck_assert_str_eq(str(doc, "error"), "HK_ERR_UNSUPPORTED");
    net_teardown();
}
END_TEST

/* Without --json, status is a table for people: a line a module, and the
 * message and log of a refused one; no JSON. */
START_TEST(status_text) {
    char args[512];
    net_setup(NULL);
    snprintf(args, sizeof args, "push %s --key hotkern.key --module add --release 42 add.cu", base);
    ck_assert_int_eq(hotkern(args), 0);
    pthread_mutex_lock(&rec.lock);
    rec.fail_with = HK_ERR_COMPILE;
    pthread_mutex_unlock(&rec.lock);
    put("mul.cu", "extern \"C\" __global__ void mul(float *x) { x[0] *= y; }\n");
    snprintf(args, sizeof args, "push %s --key hotkern.key --module mul --release 7 mul.cu", base);
    ck_assert_int_eq(hotkern(args), 1);
    snprintf(args, sizeof args, "status %s", base);
    ck_assert_int_eq(hotkern(args), 0);
    ck_assert_msg(!strchr(out, '{') && !strstr(out, "\"last_outcome\""), "%s", out);
    ck_assert_msg(strstr(out, "MODULE") && strstr(out, "RELEASE") && strstr(out, "LAST") &&
                      strstr(out, "SINCE"),
                  "%s", out);
    /* add's row: its release and outcome, and when (a date). */
    const char *row = strstr(out, "\nadd ");
    ck_assert_msg(row, "%s", out);
    const char *eol = strchr(row + 1, '\n');
    ck_assert_ptr_nonnull(eol);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)(eol - row - 1), row + 1);
    ck_assert_msg(strstr(line, "v42") && strstr(line, "committed") && strstr(line, " UTC (") &&
                      strstr(line, " ago)"),
                  "%s", line);
    row = strstr(out, "\nmul ");
    ck_assert_msg(row && strstr(row, "refused (HK_ERR_COMPILE)"), "%s", out);
    /* The refused module's message and log follow the table. */
    ck_assert_msg(strstr(out, "mul: ") && strstr(out, "NVRTC refused it") &&
                      strstr(out, "  add.cu(1): error: identifier \"y\" is undefined"),
                  "%s", out);
    net_teardown();
}
END_TEST

START_TEST(pull_json) {
    net_setup(NULL);
    net_teardown();
    char www[PATH_MAX], args[1024];
    pid_t pid;
    snprintf(www, sizeof www, "%s/www", dir);
    ck_assert_int_eq(mkdir(www, 0755), 0);
    ck_assert_int_eq(hotkern("sign --key hotkern.key --module add --release 3 --out www/rel "
                             "add.cu"),
                     0);
    int port = hkt_nginx_start(www, dir, NULL, &pid);
    ck_assert_msg(port > 0, "nginx did not start");
    snprintf(args, sizeof args,
             "http://127.0.0.1:%d/rel/manifest.json --pubkey hotkern.pub --state st --out got "
             "--once",
             port);
    int rc = hotkern_json("pull", args);
    ck_assert_msg(rc == 0, "%s", jout);
    static const char *const pull_fields[] = {"url", "applied", "poll_errors", "stats", NULL};
    fields(doc, pull_fields);
    const cJSON *a = cJSON_GetArrayItem(field(doc, "applied"), 0);
    ck_assert_str_eq(str(a, "module"), "add");
    ck_assert_int_eq((int)num(a, "release"), 3);
    ck_assert_str_eq(str(a, "format"), "cuda");
    ck_assert_int_eq(strlen(str(a, "sha256")), 64);
    ck_assert_int_eq((int)num(field(doc, "stats"), "applied"), 1);
    ck_assert_int_eq(cJSON_GetArraySize(field(doc, "poll_errors")), 0);
    /* A key that did not sign it: refused, the poll's error in both places. */
    snprintf(args, sizeof args,
             "http://127.0.0.1:%d/rel/manifest.json --pubkey other.pub --state st2 --count 2 "
             "--interval-ms 10",
             port);
    rc = hotkern_json("pull", args);
    hkt_nginx_stop(pid);
    ck_assert_int_eq(rc, 1);
    fields(doc, pull_fields);
    ck_assert_str_eq(str(doc, "error"), "HK_ERR_SIGNATURE");
    ck_assert_int_eq(cJSON_GetArraySize(field(doc, "applied")), 0);
    const cJSON *pe = field(doc, "poll_errors");
    ck_assert_int_eq(cJSON_GetArraySize(pe), 2);
    ck_assert_int_eq((int)num(cJSON_GetArrayItem(pe, 1), "poll"), 2);
    ck_assert_str_eq(str(cJSON_GetArrayItem(pe, 1), "error"), "HK_ERR_SIGNATURE");
    ck_assert_int_eq(hotkern_json("pull", "http://127.0.0.1:1/m.json --pubkey hotkern.pub"), 2);
    ck_assert_ptr_nonnull(strstr(str(doc, "message"), "--once"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("check");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, good_file_lists_kernels);
    tcase_add_test(tc, compile_error_like_a_compiler);
    tcase_add_test(tc, defines_and_include_paths);
    tcase_add_test(tc, usage_and_bad_input);
    tcase_add_test(tc, unknown_arch_is_usage);
    tcase_add_test(tc, toolkit_headers_need_no_include_dirs);
    tcase_add_test(tc, templates_without_instantiation);
    tcase_add_test(tc, reuse_or_not_same_output);
    tcase_add_test(tc, pull_error_printed_once);
    tcase_add_test(tc, check_lists_fatbin_kernels_archs_demangled);
    suite_add_tcase(s, tc);
    TCase *js = tcase_create("json");
    tcase_add_checked_fixture(js, setup, teardown);
    tcase_set_timeout(js, 120);
    tcase_add_test(js, check_json);
    tcase_add_test(js, push_json);
    tcase_add_test(js, release_option);
    tcase_add_test(js, push_refused_for_its_key_names_the_module);
    tcase_add_test(js, status_json);
    tcase_add_test(js, status_text);
    tcase_add_test(js, pull_json);
    suite_add_tcase(s, js);
    return hkt_run(s);
}

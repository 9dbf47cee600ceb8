/*
 * The suite's fixture (fixture.h): the log callback's lines, the runtime
 * with its setup and teardown, swaps, and the exposition-format validator.
 * A helper one part alone needs stays in that part.
 */
#include "tests/obs/fixture.h"

struct log_lines logs = {.lock = PTHREAD_MUTEX_INITIALIZER};

hk_runtime *rt;

char *tmp;

int try_set_log_inside; /* the callback calls hk_runtime_set_log once */

void on_log(hk_log_level level, const char *sub, const char *msg, void *ud) {
    pthread_mutex_lock(&logs.lock);
    if (logs.n < MAX_LINES) {
        logs.e[logs.n].level = level;
        snprintf(logs.e[logs.n].sub, sizeof logs.e[0].sub, "%s", sub);
        snprintf(logs.e[logs.n].msg, sizeof logs.e[0].msg, "%s", msg);
        logs.n++;
    }
    int try_it = try_set_log_inside;
    try_set_log_inside = 0;
    pthread_mutex_unlock(&logs.lock);
    if (try_it) {
        int busy = hk_runtime_set_log(rt, NULL, NULL, HK_LOG_OFF);
        hk_log(rt, HK_LOG_ERROR, "test", "logged from the callback");
        pthread_mutex_lock(&logs.lock);
        logs.busy = busy;
        pthread_mutex_unlock(&logs.lock);
    }
}

int find_line(int level, const char *sub, const char *const *needles, char *out, size_t cap) {
    int found = -1;
    pthread_mutex_lock(&logs.lock);
    for (int i = 0; i < logs.n && found < 0; i++) {
        if (logs.e[i].level != level || strcmp(logs.e[i].sub, sub))
            continue;
        int all = 1;
        for (int j = 0; needles[j] && all; j++)
            all = strstr(logs.e[i].msg, needles[j]) != NULL;
        if (all) {
            found = i;
            if (out)
                snprintf(out, cap, "%s", logs.e[i].msg);
        }
    }
    pthread_mutex_unlock(&logs.lock);
    return found;
}

void wait_line(int level, const char *sub, const char *const *needles, char *out, size_t cap) {
    for (int i = 0; i < 1000; i++) {
        if (find_line(level, sub, needles, out, cap) >= 0)
            return;
        usleep(10 * 1000);
    }
    pthread_mutex_lock(&logs.lock);
    for (int i = 0; i < logs.n; i++)
        fprintf(stderr, "  [%d %s] %s\n", logs.e[i].level, logs.e[i].sub, logs.e[i].msg);
    pthread_mutex_unlock(&logs.lock);
    ck_abort_msg("no %s line from %s with '%s'", hk_log_level_name(level), sub, needles[0]);
}

hk_runtime *make_rt(void) {
    fake_init(1, 90);
    hk_options o;
    hk_options_init(&o);
    o.ptx_mode = HK_PTX_DRIVER_JIT; /* the fake reads PTX */
    o.cache_dir = "";
    o.no_warm_start = 1;
    hk_runtime *r = NULL;
    hk_report rep = HK_REPORT_INIT;
    int err = hkl_runtime_create_with(&r, &o, fake_driver(), &rep);
    ck_assert_msg(err == 0, "create: %s", rep.message);
    return r;
}

void setup(void) {
    pthread_mutex_lock(&logs.lock);
    logs.n = 0;
    logs.busy = 0;
    pthread_mutex_unlock(&logs.lock);
    tmp = hkt_tmpdir();
    ck_assert_ptr_nonnull(tmp);
    rt = make_rt();
}

void teardown(void) {
    hk_runtime_destroy(rt);
    rt = NULL;
    hkt_rmtree(tmp);
    free(tmp);
}

void swap_ok(const char *mod, int tag) {
    hk_report rep = HK_REPORT_INIT;
    const char *src = fake_ptx(tag, 0, 0, 0);
    int err = hk_swap(rt, mod, src, strlen(src), NULL, &rep);
    ck_assert_msg(err == 0, "swap: %s", rep.message);
    hk_report_clear(&rep);
}

void swap_bad(const char *mod) {
    static const char bad[] = ".version 8.0\n.target sm_90\n// SYNTAX ERROR\n";
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_ne(hk_swap(rt, mod, bad, strlen(bad), NULL, &rep), 0);
    hk_report_clear(&rep);
}

static int is_metric_name(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
              (i > 0 && c >= '0' && c <= '9')))
            return 0;
    }
    return n > 0;
}

/* A value as hotkern prints it: an integer, or a decimal of at most six
 * places whose last digit is not 0 (no binary floating-point noise). */
static int clean_value(const char *v) {
    const char *p = v + (*v == '-');
    size_t ip = strspn(p, "0123456789");
    if (!ip)
        return 0;
    p += ip;
    if (!*p)
        return 1;
    if (*p != '.')
        return 0;
    size_t fp = strspn(p + 1, "0123456789");
    return fp >= 1 && fp <= 6 && p[1 + fp] == '\0' && p[fp] != '0';
}

/* Parses {name="value",...}; copies the le label's value to le (or "").
 * Returns the character after '}', or NULL with *why set. */
static const char *parse_labels(const char *p, char *le, size_t cap, const char **why) {
    char seen[8][64];
    int nseen = 0;
    le[0] = '\0';
    p++;
    while (*p != '}') {
        size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789");
        if (!n || (*p >= '0' && *p <= '9') || n >= 64 || p[n] != '=' || p[n + 1] != '"')
            return *why = "bad label name", NULL;
        for (int i = 0; i < nseen; i++)
            if (strlen(seen[i]) == n && !strncmp(seen[i], p, n))
                return *why = "label twice", NULL;
        if (nseen < 8)
            snprintf(seen[nseen++], 64, "%.*s", (int)n, p);
        int is_le = n == 2 && !strncmp(p, "le", 2);
        p += n + 2;
        size_t o = 0;
        for (; *p != '"'; p++) {
            if (!*p || *p == '\n')
                return *why = "unterminated label value", NULL;
            if (*p == '\\') {
                p++;
                if (*p != '\\' && *p != '"' && *p != 'n')
                    return *why = "bad escape in a label value", NULL;
            }
            if (is_le && o + 1 < cap)
                le[o++] = *p;
        }
        if (is_le)
            le[o] = '\0';
        p++;
        if (*p == ',')
            p++;
        else if (*p != '}')
            return *why = "labels not separated by ','", NULL;
    }
    return p + 1;
}

static struct fam *fam_of(struct fam *f, int n, const char *name, const char **suffix) {
    for (int i = 0; i < n; i++) {
        size_t l = strlen(f[i].name);
        if (!strcmp(f[i].name, name)) {
            *suffix = "";
            return &f[i];
        }
        if (!strcmp(f[i].type, "histogram") && !strncmp(f[i].name, name, l) &&
            (!strcmp(name + l, "_bucket") || !strcmp(name + l, "_sum") ||
             !strcmp(name + l, "_count"))) {
            *suffix = name + l;
            return &f[i];
        }
    }
    return NULL;
}

/* Checks one histogram sample against the running state of its family. */
static const char *histo_step(const char *suffix, const char *le, const char *value,
                              double *last_le, double *last_bucket, double *inf) {
    double v = strtod(value, NULL);
    if (!strcmp(suffix, "_bucket")) {
        double l = !strcmp(le, "+Inf") ? 1e300 : strtod(le, NULL);
        if (!le[0] || l <= *last_le || v < *last_bucket)
            return "histogram buckets out of order or not cumulative";
        *last_le = l;
        *last_bucket = v;
        if (l == 1e300)
            *inf = v;
    } else if (!strcmp(suffix, "_count") && v != *inf) {
        return "histogram _count differs from its +Inf bucket";
    }
    return NULL;
}

const char *check_exposition(const char *text, char *bad, size_t cap) {
    static struct fam f[256];
    int nf = 0;
    struct fam *cur = NULL;
    double last_le = -1, last_bucket = 0, inf = -1;
    const char *why = NULL;
    size_t len = strlen(text);
    if (!len || text[len - 1] != '\n')
        return "does not end with a newline";
    char *copy = strdup(text), *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line && !why;
         line = strtok_r(NULL, "\n", &save)) {
        snprintf(bad, cap, "%s", line);
        char name[128], kind[32];
        const char *suffix = "";
        if (!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7)) {
            int help = line[2] == 'H';
            size_t n = strcspn(line + 7, " ");
            if (!is_metric_name(line + 7, n) || n >= sizeof name)
                why = "bad family name";
            if (why)
                break;
            snprintf(name, sizeof name, "%.*s", (int)n, line + 7);
            struct fam *g = NULL;
            for (int i = 0; i < nf; i++)
                g = !strcmp(f[i].name, name) ? &f[i] : g;
            if (!g && nf < 256) {
                g = &f[nf++];
                memset(g, 0, sizeof *g);
                snprintf(g->name, sizeof g->name, "%s", name);
            }
            if (g->samples)
                why = "HELP or TYPE after the family's samples";
            else if (help ? g->help++ : g->typed++)
                why = "HELP or TYPE twice";
            else if (!help) {
                if (sscanf(line + 7 + n, " %31s", kind) != 1 ||
                    (strcmp(kind, "counter") && strcmp(kind, "gauge") &&
                     strcmp(kind, "histogram") && strcmp(kind, "untyped")))
                    why = "bad type";
                else if (!strcmp(kind, "counter") && (n < 6 || strcmp(name + n - 6, "_total")))
                    why = "a counter not named _total";
                snprintf(g->type, sizeof g->type, "%s", kind);
            }
            continue;
        }
        if (line[0] == '#') {
            why = "stray comment";
            break;
        }
        size_t n = strcspn(line, "{ ");
        if (!is_metric_name(line, n) || n >= sizeof name) {
            why = "bad sample name";
            break;
        }
        snprintf(name, sizeof name, "%.*s", (int)n, line);
        struct fam *g = fam_of(f, nf, name, &suffix);
        if (!g || !g->typed) {
            why = "sample without a TYPE";
            break;
        }
        if (g != cur) {
            if (g->closed) {
                why = "family's samples not together";
                break;
            }
            if (cur)
                cur->closed = 1;
            cur = g;
            last_le = -1, last_bucket = 0, inf = -1;
        }
        g->samples++;
        const char *p = line + n;
        char le[32] = "";
        if (*p == '{' && !(p = parse_labels(p, le, sizeof le, &why)))
            break;
        if (*p != ' ' || !clean_value(p + 1)) {
            why = "bad value (float noise, or not a number)";
            break;
        }
        if (!strcmp(g->type, "histogram"))
            why = histo_step(suffix, le, p + 1, &last_le, &last_bucket, &inf);
    }
    free(copy);
    return why;
}

double sample_value(const char *text, const char *series) {
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1;
}

char *metrics(void) {
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(hk_metrics_text_alloc(rt, &text, &len), 0);
    ck_assert_uint_eq(len, strlen(text));
    return text;
}

void assert_valid(const char *text) {
    char bad[1024];
    const char *why = check_exposition(text, bad, sizeof bad);
    ck_assert_msg(!why, "%s: %s\n%s", why, bad, text);
}

static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    struct resp *r = ud;
    char *nd = realloc(r->data, r->len + size * n + 1);
    if (!nd)
        return 0;
    r->data = nd;
    memcpy(r->data + r->len, p, size * n);
    r->len += size * n;
    r->data[r->len] = '\0';
    return size * n;
}

long http(unsigned port, const char *method, const char *path, const char *token, const char *data,
          size_t len, char **body) {
    char url[256], auth[128];
    struct resp r = {calloc(1, 1), 0};
    struct curl_slist *h = NULL;
    long status = 0;
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    if (data) {
        h = curl_slist_append(h, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, data);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    CURLcode rc = curl_easy_perform(c);
    ck_assert_msg(rc == CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(rc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    if (body)
        *body = r.data;
    else
        free(r.data);
    return status;
}

hkn_seckey trusted, stranger;

char pub_path[PATH_MAX];

void make_keys(void) {
    hk_report rep = HK_REPORT_INIT;
    ck_assert_int_eq(hkn_keygen(&trusted), 0);
    ck_assert_int_eq(hkn_keygen(&stranger), 0);
    snprintf(pub_path, sizeof pub_path, "%s/trusted.pub", tmp);
    ck_assert_int_eq(hkn_pubkey_save(pub_path, &trusted.pub, &rep), 0);
}

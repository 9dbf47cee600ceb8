/*
 * Shared test support (see harness.h). GPU suites initialise CUDA inside the
 * test process only after this gate, and run with CK_FORK=no semantics
 * (hkt_run sets no-fork for them), since CUDA does not survive fork().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/driver.h"
#include "tests/harness.h"

int hkt_run(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#include <execinfo.h>
#include <signal.h>

/* GPU suites run without fork, so a crash would end the run silently: print
 * where it happened first. */
static void crash_handler(int sig) {
    void *frames[64];
    int n = backtrace(frames, 64);
    static const char msg[] = "\n*** fatal signal in a GPU suite; backtrace:\n";
    if (write(2, msg, sizeof msg - 1) < 0)
        _exit(128 + sig);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

int hkt_gpu_or_skip(const char *suite) {
    signal(SIGSEGV, crash_handler);
    signal(SIGBUS, crash_handler);
    hkb_driver d;
    char why[512];
    if (hkb_driver_open(&d, why, sizeof why) < 0) {
        printf("SKIP %s: no usable CUDA device (%s)\n", suite, why);
        return 0;
    }
    int n = 0;
    if (d.DeviceGetCount) /* not an entry the engine needs */
        d.DeviceGetCount(&n);
    hkb_driver_close(&d);
    if (n < 1) {
        printf("SKIP %s: the CUDA driver reports no device\n", suite);
        return 0;
    }
    /* CUDA state must not cross fork(): run every test in this process. */
    setenv("CK_FORK", "no", 1);
    return 1;
}

char *hkt_tmpdir(void) {
    char tmpl[] = "/tmp/hotkern-test-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

int hkt_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

void hkt_rmtree(const char *path) {
    if (!path || strncmp(path, "/tmp/", 5))
        return;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", path);
}

#include <arpa/inet.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int port_open(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

int hkt_nginx_start(const char *root, const char *tmp, const char *extra, pid_t *pid) {
    const char *bin = getenv("HK_NGINX");
    if (!bin)
        bin = "/usr/sbin/nginx";
    if (access(bin, X_OK) != 0) {
        printf("SKIP nginx origin: %s is not there\n", bin);
        return -1;
    }
    char conf[PATH_MAX], text[8192], global[PATH_MAX + 64];
    snprintf(conf, sizeof conf, "%s/nginx.conf", tmp);
    snprintf(global, sizeof global, "daemon off; pid %s/nginx.pid;", tmp);
    /* A port found free can be taken before nginx binds it: try again. */
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = free_port();
        snprintf(text, sizeof text,
                 "%sworker_processes 1;\nerror_log %s/error.log;\n"
                 "worker_rlimit_nofile 8192;\nevents { worker_connections 4096; }\n"
                 "http {\n  access_log %s/access.log;\n  client_body_temp_path %s/body;\n"
                 "  proxy_temp_path %s/proxy;\n  fastcgi_temp_path %s/fastcgi;\n"
                 "  uwsgi_temp_path %s/uwsgi;\n  scgi_temp_path %s/scgi;\n"
                 "  default_type application/octet-stream;\n  etag on;\n"
                 "  server { listen 127.0.0.1:%d; root %s; %s }\n}\n",
                 geteuid() == 0 ? "user root root;\n" : "", tmp, tmp, tmp, tmp, tmp, tmp, tmp, port,
                 root, extra ? extra : "");
        if (port < 0 || hkt_write_file(conf, text) < 0)
            return -1;
        *pid = fork();
        if (*pid == 0) {
            int devnull = open("/dev/null", O_RDWR);
            dup2(devnull, 1);
            dup2(devnull, 2);
            execl(bin, "nginx", "-p", tmp, "-c", conf, "-g", global, (char *)NULL);
            _exit(127);
        }
        for (int i = 0; i < 100; i++) { /* up to 5 s */
            if (port_open(port))
                return port;
            if (waitpid(*pid, NULL, WNOHANG) == *pid)
                break; /* exited: most likely the port was taken meanwhile */
            usleep(50000);
        }
        hkt_nginx_stop(*pid);
    }
    printf("SKIP nginx origin: nginx did not start (see %s/error.log)\n", tmp);
    *pid = 0;
    return -1;
}

void hkt_nginx_stop(pid_t pid) {
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 100 && waitpid(pid, NULL, WNOHANG) != pid; i++)
        usleep(50000);
    kill(pid, SIGKILL); /* harmless if it already exited */
    waitpid(pid, NULL, WNOHANG);
}

const char *hkt_built_program(const char *name) {
    static char path[PATH_MAX];
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return name;
    self[n] = 0;
    /* BUILD/tests/prog -> BUILD/bin/name */
    char *dir = dirname(dirname(self));
    snprintf(path, sizeof path, "%s/bin/%s", dir, name);
    return path;
}

#include <sys/file.h>
#include <sys/prctl.h>

pid_t hkt_hold_lock_stopped(const char *path) {
    int p[2];
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0)
            fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0 || flock(fd, LOCK_EX) != 0 || write(p[1], "x", 1) != 1)
            _exit(1);
        raise(SIGSTOP);
        _exit(0);
    }
    char ch;
    int st = 0;
    int ok =
        pid > 0 && read(p[0], &ch, 1) == 1 && waitpid(pid, &st, WUNTRACED) == pid && WIFSTOPPED(st);
    close(p[0]);
    close(p[1]);
    if (!ok && pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return ok ? pid : -1;
}

/* ---- HTTP and Prometheus ------------------------------------------------ */

#include <math.h>
#include <stdarg.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

size_t hkt_body_write(char *p, size_t sz, size_t n, void *ud) {
    hkt_body *r = ud;
    char *d = realloc(r->data, r->len + sz * n + 1);
    if (!d)
        return 0;
    memcpy(d + r->len, p, sz * n);
    r->len += sz * n;
    d[r->len] = '\0';
    r->data = d;
    return sz * n;
}

long long hkt_sample(const char *text, const char *name, const char *label) {
    char key[128];
    snprintf(key, sizeof key, "\n%s{", name);
    for (const char *l = strstr(text, key); l; l = strstr(l + 1, key)) {
        const char *end = strchr(l + 1, '\n'), *sp = strchr(l + 1, '}');
        if (sp && (!end || sp < end) && memmem(l, (size_t)(sp - l), label, strlen(label)))
            return atoll(sp + 2);
    }
    return -1;
}

void hkt_run_cli(const char *dir, const char *fmt, ...) {
    char args[2048], cmd[2 * PATH_MAX + 2048 + 64], log[PATH_MAX + 16], out[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(log, sizeof log, "%s/cli.txt", dir);
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 30 '%s' %s > '%s' 2>&1", dir,
             hkt_built_program("hotkern"), args, log);
    int st = system(cmd);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = '\0';
    if (f)
        fclose(f);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "hotkern %s: %s", args, out);
}

int hkt_cli_out(const char *dir, char *out, size_t cap, const char *fmt, ...) {
    char args[4096], cmd[2 * PATH_MAX + 4096 + 64], log[PATH_MAX + 16];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(log, sizeof log, "%s/cli-out.txt", dir);
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout 60 '%s' %s > '%s' 2>&1", dir,
             hkt_built_program("hotkern"), args, log);
    int st = system(cmd);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = '\0';
    if (f)
        fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char *hkt_http_get(const char *url, const char *token, long *status) {
    hkt_body r = {calloc(1, 1), 0};
    struct curl_slist *h = NULL;
    char auth[256];
    long code = 0;
    CURL *c = curl_easy_init();
    if (!c || !r.data) {
        free(r.data);
        if (c)
            curl_easy_cleanup(c);
        return NULL;
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, hkt_body_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    }
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    if (status)
        *status = code;
    if (rc != CURLE_OK || code != 200) {
        free(r.data);
        return NULL;
    }
    return r.data;
}

/* Runs the server of p's directory on p->port (a few ports tried when
 * pick is set: one found free can be taken before Prometheus binds it). */
static int prometheus_run(hkt_prometheus *p, int pick) {
    const char *bin = getenv("HK_PROMETHEUS");
    if (!bin)
        bin = "/usr/bin/prometheus";
    if (access(bin, X_OK) != 0) {
        printf("SKIP prometheus: %s is not there (scripts/deps.sh installs it)\n", bin);
        return 0;
    }
    char conf[PATH_MAX], log[PATH_MAX], listen[64], cfg_arg[PATH_MAX + 16], data_arg[PATH_MAX + 24];
    snprintf(conf, sizeof conf, "%s/prometheus.yml", p->dir);
    snprintf(log, sizeof log, "%s/prometheus.log", p->dir);
    snprintf(cfg_arg, sizeof cfg_arg, "--config.file=%s", conf);
    snprintf(data_arg, sizeof data_arg, "--storage.tsdb.path=%s/prom-data", p->dir);
    for (int attempt = 0; attempt < 5; attempt++) {
        if (pick)
            p->port = free_port();
        if (p->port <= 0)
            return -1;
        snprintf(listen, sizeof listen, "--web.listen-address=127.0.0.1:%d", p->port);
        fflush(NULL);
        p->pid = fork();
        if (p->pid < 0) {
            p->pid = 0;
            return -1;
        }
        if (p->pid == 0) {
            int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
            int devnull = open("/dev/null", O_RDWR);
            if (fd >= 0)
                dup2(fd, 2);
            if (devnull >= 0)
                dup2(devnull, 1);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            execl(bin, "prometheus", cfg_arg, data_arg, listen, "--log.level=warn", (char *)NULL);
            _exit(127);
        }
        char url[128];
        snprintf(url, sizeof url, "http://127.0.0.1:%d/-/ready", p->port);
        for (int i = 0; i < 300; i++) { /* up to 30 s */
            char *b = hkt_http_get(url, NULL, NULL);
            if (b) {
                free(b);
                return 1;
            }
            if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
                p->pid = 0;
                break; /* exited: the port was most likely taken meanwhile */
            }
            usleep(100 * 1000);
        }
        hkt_prometheus_stop(p);
        if (!pick)
            usleep(500 * 1000); /* the same port: give its last owner time to let go */
    }
    printf("prometheus did not start (see %s)\n", log);
    return -1;
}

int hkt_prometheus_start(hkt_prometheus *p, const char *dir, const char *scrape_configs) {
    char conf[PATH_MAX];
    memset(p, 0, sizeof *p);
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    snprintf(conf, sizeof conf, "%s/prometheus.yml", dir);
    size_t n = strlen(scrape_configs) + 128;
    char *text = malloc(n);
    if (!text)
        return -1;
    snprintf(text, n, "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n%s",
             scrape_configs);
    int ok = hkt_write_file(conf, text) == 0;
    free(text);
    return ok ? prometheus_run(p, 1) : -1;
}

int hkt_prometheus_restart(hkt_prometheus *p) {
    return p->pid ? 1 : prometheus_run(p, 0);
}

void hkt_prometheus_stop(hkt_prometheus *p) {
    if (p->pid <= 0)
        return;
    kill(p->pid, SIGTERM);
    for (int i = 0; i < 100 && waitpid(p->pid, NULL, WNOHANG) != p->pid; i++)
        usleep(50 * 1000);
    kill(p->pid, SIGKILL); /* harmless once it has exited */
    waitpid(p->pid, NULL, WNOHANG);
    p->pid = 0;
}

cJSON *hkt_prometheus_api(const hkt_prometheus *p, const char *path) {
    char url[8192];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", p->port, path);
    char *b = hkt_http_get(url, NULL, NULL);
    cJSON *j = b ? cJSON_Parse(b) : NULL;
    free(b);
    cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "status");
    if (!cJSON_IsString(st) || strcmp(st->valuestring, "success")) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* The result array of an instant query (within the document *doc, which
 * the caller deletes), NULL when the server did not answer. */
static cJSON *query_result(const hkt_prometheus *p, const char *promql, cJSON **doc) {
    char path[8192];
    char *q = curl_easy_escape(NULL, promql, 0);
    if (!q)
        return NULL;
    snprintf(path, sizeof path, "/api/v1/query?query=%s", q);
    curl_free(q);
    *doc = hkt_prometheus_api(p, path);
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(*doc, "data"),
                                            "result");
}

double hkt_prometheus_query(const hkt_prometheus *p, const char *promql) {
    cJSON *doc = NULL;
    cJSON *first = cJSON_GetArrayItem(query_result(p, promql, &doc), 0);
    cJSON *val = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(first, "value"), 1);
    double v = cJSON_IsString(val) ? strtod(val->valuestring, NULL) : NAN;
    cJSON_Delete(doc);
    return v;
}

int hkt_prometheus_count(const hkt_prometheus *p, const char *promql) {
    cJSON *doc = NULL;
    cJSON *res = query_result(p, promql, &doc);
    int n = cJSON_IsArray(res) ? cJSON_GetArraySize(res) : -1;
    cJSON_Delete(doc);
    return n;
}

/*
 * The interposition's configuration from the environment (HOTKERN_*, listed
 * in include/hotkern/interpose.h): read and checked whole before anything
 * is made, then the runtime and its sources, for route.c's first launch.
 *
 * Nothing is half enabled. A value that does not parse (a port that is not
 * a number, a flag that is neither on nor off, a log level that is not
 * one), a setting that needs another one absent (HOTKERN_RESTORE without
 * HOTKERN_STATE_DIR) or a network source in a build without the network
 * library refuses the whole configuration: each is said on stderr, then
 * that hotkern is not enabled, and the program runs its own code, as with
 * HOTKERN_OFF. So does a source that cannot start (a directory that cannot
 * be watched, a port that cannot be bound): the runtime made for it is
 * destroyed before any launch can use it. A name of the HOTKERN_ family
 * that hotkern does not read (a typo) is said once, and changes nothing.
 *
 * The runtime builds in the build helper (options.build_isolated): no NVRTC
 * ever runs in the program's process, whose exit may come at any moment of
 * a build (base/exit.c says what else exit waits for), and NVRTC's
 * handling of SIGINT/SIGTERM during a compile stays out of it.
 *
 * Everything here runs once, on the first launching thread, inside
 * route.c's pthread_once; nothing is kept but the runtime it returns.
 */
#include <arpa/inet.h>
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hotkern/interpose.h"
#include "hotkern/net.h"
#include "interpose/interpose.h"

extern char **environ;

/* Every HOTKERN_* hotkern reads (HOTKERN_TOKEN the CLI too). */
static const char *const known[] = {
    "HOTKERN_WATCH",
    "HOTKERN_ENDPOINT",
    "HOTKERN_ORIGIN",
    "HOTKERN_TRUSTED_KEY",
    "HOTKERN_TOKEN",
    "HOTKERN_STATE_DIR",
    "HOTKERN_RESTORE",
    "HOTKERN_CACHE_DIR",
    "HOTKERN_CANARY",
    "HOTKERN_LOG",
    "HOTKERN_OFF",
    "HOTKERN_ALLOW_UNSIGNED",
    "HOTKERN_AUTO_SAFE_POINTS", /* read by sync.c */
};

/* A set, non-empty value (an empty one counts as unset). */
static const char *val(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Appends a line to e's refusals. */
static void refuse(hki_env *e, const char *fmt, const char *name, const char *v) {
    size_t n = strlen(e->why);
    if (n < sizeof e->why - 1) {
        int w = snprintf(e->why + n, sizeof e->why - n, "hotkern: %s=%.80s: ", name, v);
        n += w > 0 ? (size_t)w : 0;
        if (n < sizeof e->why - 1) {
            snprintf(e->why + n, sizeof e->why - n, "%s\n", fmt);
        }
    }
    e->refused++;
}

/* A flag: 1 or 0 (also true/false, yes/no, on/off); unset is 0. */
static int flag(hki_env *e, const char *name) {
    const char *v = val(name);
    static const char *const on[] = {"1", "true", "yes", "on"}, *const off[] = {"0", "false", "no",
                                                                                "off"};
    if (!v)
        return 0;
    for (size_t i = 0; i < 4; i++) {
        if (!strcasecmp(v, on[i]))
            return 1;
        if (!strcasecmp(v, off[i]))
            return 0;
    }
    refuse(e, "not a flag (1 or 0; also true/false, yes/no, on/off)", name, v);
    return 0;
}

/* HOTKERN_ENDPOINT: [address:]port, the address numeric (IPv6 in brackets),
 * the port a decimal 0..65535 (0: a free port, said when bound). */
static void endpoint(hki_env *e, const char *v) {
    const char *port = v, *colon = strrchr(v, ':');
    e->address[0] = '\0';
    int bad = 0;
    if (colon) {
        const char *a = v, *z = colon;
        if (*a == '[' && z > a && z[-1] == ']')
            a++, z--;
        size_t n = (size_t)(z - a);
        unsigned char bin[16];
        bad = n == 0 || n >= sizeof e->address;
        if (!bad) {
            memcpy(e->address, a, n);
            e->address[n] = '\0';
            bad = inet_pton(AF_INET, e->address, bin) != 1 &&
                  inet_pton(AF_INET6, e->address, bin) != 1;
        }
        port = colon + 1;
    }
    size_t digits = strspn(port, "0123456789");
    if (!bad && (!digits || port[digits] || digits > 5 || atoi(port) > 65535))
        bad = 1;
    if (bad) {
        refuse(e,
               "not [address:]port (a numeric IPv4 or [IPv6] address, a port 0-65535: "
               "HOTKERN_ENDPOINT=9090 or 0.0.0.0:9090)",
               "HOTKERN_ENDPOINT", v);
        return;
    }
    e->port = (unsigned)atoi(port);
    if (!e->address[0])
        snprintf(e->address, sizeof e->address, "127.0.0.1");
}

static void log_level(hki_env *e) {
    const char *v = val("HOTKERN_LOG");
    static const char *const levels[] = {"debug", "info", "warn", "warning", "error", "off"};
    for (size_t i = 0; v && i < sizeof levels / sizeof levels[0]; i++)
        if (!strcasecmp(v, levels[i]))
            return;
    if (v)
        refuse(e, "not a level (debug, info, warn, error or off)", "HOTKERN_LOG", v);
}

/* Says once what in the environment looks like hotkern's and is not. */
static void unknown_names(void) {
    for (char **p = environ; p && *p; p++) {
        if (strncmp(*p, "HOTKERN_", 8))
            continue;
        size_t n = strcspn(*p, "=");
        int ok = 0;
        for (size_t i = 0; !ok && i < sizeof known / sizeof known[0]; i++)
            ok = strlen(known[i]) == n && !strncmp(*p, known[i], n);
        if (!ok)
            fprintf(stderr, "hotkern: %.*s is not a hotkern setting (ignored; see interpose.h)\n",
                    (int)(n > 60 ? 60 : n), *p);
    }
}

int hki_env_read(hki_env *e) {
    memset(e, 0, sizeof *e);
    e->off = flag(e, "HOTKERN_OFF");
    if (e->off && !e->refused)
        return 1;
    e->watch = val("HOTKERN_WATCH");
    e->state_dir = val("HOTKERN_STATE_DIR");
    e->cache_dir = getenv("HOTKERN_CACHE_DIR"); /* "" is no cache */
    e->canary = flag(e, "HOTKERN_CANARY");
    e->restore = flag(e, "HOTKERN_RESTORE");
    e->allow_unsigned = flag(e, "HOTKERN_ALLOW_UNSIGNED");
    e->trusted_key = val("HOTKERN_TRUSTED_KEY");
    e->token = val("HOTKERN_TOKEN");
    e->origin = val("HOTKERN_ORIGIN");
    log_level(e);
    const char *ep = val("HOTKERN_ENDPOINT");
    if (ep)
        endpoint(e, ep);
    e->endpoint = ep != NULL;
    if (e->restore && !e->state_dir)
        refuse(e, "needs HOTKERN_STATE_DIR (where the last good versions are kept)",
               "HOTKERN_RESTORE", val("HOTKERN_RESTORE"));
#ifdef HK_NO_NET
    if (ep)
        refuse(e, "built without network support (NET=0)", "HOTKERN_ENDPOINT", ep);
    if (e->origin)
        refuse(e, "built without network support (NET=0)", "HOTKERN_ORIGIN", e->origin);
#endif
    return e->refused ? HK_ERR_INVALID : 0;
}

static void say(const char *what, const hk_report *rep) {
    fprintf(stderr, "hotkern: %s: %s\n", what, rep->message);
}

/* Starts the sources e asks for; 0, or the error of the first that cannot
 * (said). */
static int sources(hk_runtime *rt, const hki_env *e) {
    hk_report rep = HK_REPORT_INIT;
    int err = 0;
    if (e->watch) {
        char *dirs = strdup(e->watch), *save = NULL;
        err = dirs ? 0 : HK_ERR_NOMEM;
        for (char *d = dirs ? strtok_r(dirs, ":", &save) : NULL; d && !err;
             d = strtok_r(NULL, ":", &save))
            if ((err = hk_watch_dir(rt, d, NULL, &rep)) < 0)
                say("HOTKERN_WATCH", &rep);
        free(dirs);
    }
#ifndef HK_NO_NET
    const char *keys[] = {e->trusted_key};
    if (!err && e->endpoint) {
        hk_endpoint_options o;
        hk_endpoint_options_init(&o);
        o.address = e->address;
        o.port = e->port;
        o.trusted_keys = e->trusted_key ? keys : NULL;
        o.ntrusted_keys = e->trusted_key ? 1 : 0;
        o.allow_unsigned = e->allow_unsigned;
        o.token = e->token;
        hk_endpoint *h;
        if ((err = hk_endpoint_start(rt, &o, &h, &rep)) < 0) {
            say("HOTKERN_ENDPOINT", &rep);
        } else {
            fprintf(stderr, "hotkern: pushes on %s port %u\n", e->address, hk_endpoint_port(h));
        }
    }
    if (!err && e->origin) {
        hk_pull_options o;
        hk_pull_options_init(&o);
        o.url = e->origin;
        o.trusted_keys = e->trusted_key ? keys : NULL;
        o.ntrusted_keys = e->trusted_key ? 1 : 0;
        o.allow_unsigned = e->allow_unsigned;
        hk_puller *p;
        if ((err = hk_pull_start(rt, &o, &p, &rep)) < 0)
            say("HOTKERN_ORIGIN", &rep);
    }
#endif
    hk_report_clear(&rep);
    return err;
}

#define NOT_ENABLED "hotkern: not enabled, the program's own kernels run"

hk_runtime *hki_env_runtime(void (*made)(hk_runtime *rt)) {
    hki_env e;
    int r = hki_env_read(&e);
    if (r == 1)
        return NULL; /* HOTKERN_OFF */
    unknown_names();
    if (r < 0) {
        fprintf(stderr, "%s" NOT_ENABLED " (the setting%s above %s refused)\n", e.why,
                e.refused > 1 ? "s" : "", e.refused > 1 ? "are" : "is");
        return NULL;
    }
    hk_options o;
    hk_options_init(&o);
    o.state_dir = e.state_dir;
    o.cache_dir = e.cache_dir;
    o.canary = e.canary;
    o.restore = e.restore;
    o.build_isolated = 1;
    hk_report rep = HK_REPORT_INIT;
    hk_runtime *rt = NULL;
    if (hki_runtime_create(&rt, &o, NULL, &rep) < 0) { /* device 0's primary context */
        fprintf(stderr, NOT_ENABLED ": %s\n", rep.message);
        hk_report_clear(&rep);
        return NULL;
    }
    hk_report_clear(&rep);
    made(rt);
    if (sources(rt, &e) < 0) {
        hk_runtime_destroy(rt);
        fprintf(stderr, NOT_ENABLED " (a source above could not start)\n");
        return NULL;
    }
    return rt;
}

/* ---- the preload library on a program it cannot reach ------------------- */

/* 1 when this process's executable has a section of one of the names. */
static int exe_has_section(const char *const *names, size_t n) {
    FILE *f = fopen("/proc/self/exe", "rb");
    Elf64_Ehdr eh;
    int found = 0;
    if (!f)
        return 0;
    if (fread(&eh, sizeof eh, 1, f) == 1 && !memcmp(eh.e_ident, ELFMAG, SELFMAG) &&
        eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_shentsize == sizeof(Elf64_Shdr) &&
        eh.e_shstrndx < eh.e_shnum && eh.e_shnum < 65535) {
        Elf64_Shdr *sh = calloc(eh.e_shnum, sizeof *sh);
        if (sh && fseek(f, (long)eh.e_shoff, SEEK_SET) == 0 &&
            fread(sh, sizeof *sh, eh.e_shnum, f) == eh.e_shnum &&
            sh[eh.e_shstrndx].sh_size < (1u << 20)) {
            size_t len = sh[eh.e_shstrndx].sh_size;
            char *str = malloc(len + 1);
            if (str && fseek(f, (long)sh[eh.e_shstrndx].sh_offset, SEEK_SET) == 0 &&
                fread(str, 1, len, f) == len) {
                str[len] = '\0';
                for (size_t i = 0; i < eh.e_shnum && !found; i++)
                    for (size_t k = 0; k < n && !found; k++)
                        found = sh[i].sh_name < len && !strcmp(str + sh[i].sh_name, names[k]);
            }
            free(str);
        }
        free(sh);
    }
    fclose(f);
    return found;
}

void hki_preload_check(int have_cudart) {
    /* nvcc puts a program's device code in these sections; wrap.c marks a
     * program linked with the interposition. */
    static const char *const fatbin[] = {".nv_fatbin", ".nvFatBinSegment", "__nv_relfatbin"};
    static const char *const wrapped[] = {HKI_WRAP_SECTION};
    hki_env e;
    if (have_cudart || hki_env_read(&e) == 1 || !exe_has_section(fatbin, 3) ||
        exe_has_section(wrapped, 1))
        return;
    fprintf(stderr,
            "hotkern: this program has the CUDA runtime linked in statically (nvcc's default), "
            "which LD_PRELOAD=libhotkern-preload.so cannot reach: nothing of it is "
            "hot-reloadable. Link hotkern in instead (WRAP=$(pkg-config --variable=nvcc_libs "
            "hotkern-wrap) && nvcc ... $WRAP, or hotkern_enable_hot_reload() in CMake; see "
            "interpose.h), or build it with -cudart shared\n");
}

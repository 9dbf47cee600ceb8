/*
 * Public entry points of the network sources (include/hotkern/net.h).
 *
 * This file is the only one in net/ that calls the swap engine: it wires the
 * hkn_engine callbacks to hk_swap, hk_rollback (hk_rollback_release for a
 * signed request's target), hk_module_version, hk_module_release,
 * hk_metrics_text_alloc and hk_log, attaches each endpoint's and puller's
 * counters to the runtime's metrics (hk_metrics_attach, labelled with the
 * endpoint's address or the puller's URL), and resolves what the options name
 * by file or leave to a default (trusted keys, TLS certificate and key, the
 * state directory) into the hkn_*_resolved the endpoint and the puller take
 * beside the options themselves. The options' defaults live with the code
 * that uses them (hk_endpoint_options_init_size in net/endpoint.c,
 * hk_pull_options_init_size in net/pull.c).
 *
 * The swap is synchronous (hk_swap) because a pusher waits for the outcome
 * and the puller must know it before recording the release as accepted. Its
 * stage mode is the template's (HK_STAGE_AUTO by default): in a program that
 * calls hk_safe_point, hk_swap waits for the next safe point, so a push never
 * stalls the program's launches.
 *
 * The public structures are sized (base/abi.h): each entry point takes the
 * caller's options and report into structures of its own layout first, so
 * the code below reads every field without asking whether the caller has it.
 */
#include <arpa/inet.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hotkern/net.h"
#include "base/abi.h"
#include "net/net.h"

/* What the engine callbacks need; immutable once the source runs. */
struct adapter {
    hk_runtime *rt;
    hk_swap_options swap; /* pointer fields point into the copies below */
    char **nvrtc_options;
    char **name_expressions;
    hk_header *headers; /* copy behind swap.headers (hku_headers_dup) */
    char arch[16];
    hkn_shipped *shipped; /* what each module runs (own lock) */
    hkn_engine eng;
};

struct hk_endpoint {
    struct adapter ad;
    hkn_endpoint *ep;
    hk_metrics_source *metrics; /* its counters in the runtime's text */
};

struct hk_puller {
    struct adapter ad;
    hkn_puller *p;
    hk_metrics_source *metrics;
};

/* ---- engine callbacks -------------------------------------------------- */

/* The build's messages name the artifact's file as the publisher wrote it
 * ("game.cu(8): error ..."), or without a name the release. */
static int apply_swap_named(void *ud, const char *module, uint64_t version, const char *name,
                            hk_format fmt, const void *bytes, size_t size, const hk_header *headers,
                            int nheaders, const char *origin, hk_report *rep) {
    struct adapter *ad = ud;
    hk_swap_options o = ad->swap;
    char src[128];
    hk_header all[HKN_MAX_ARTIFACTS + 64];
    if (name && name[0])
        snprintf(src, sizeof src, "%s", name);
    else
        snprintf(src, sizeof src, "%s@v%llu", module, (unsigned long long)version);
    o.format = fmt;
    o.origin = origin;
    o.release_version = version; /* kept with the image by the engine's records */
    o.source_name = src;
    if (nheaders > 0) {
        /* The release's headers are the ones its kernel was written with:
         * they come before (and hide) the template's. */
        int n = 0;
        for (int i = 0; i < nheaders && n < (int)(sizeof all / sizeof all[0]); i++)
            all[n++] = headers[i];
        for (int i = 0; i < ad->swap.nheaders && n < (int)(sizeof all / sizeof all[0]); i++)
            all[n++] = ad->swap.headers[i];
        o.headers = all;
        o.nheaders = n;
    }
    return hk_swap(ad->rt, module, bytes, size, &o, rep);
}

static int apply_swap(void *ud, const char *module, uint64_t version, hk_format fmt,
                      const void *bytes, size_t size, const hk_header *headers, int nheaders,
                      const char *origin, hk_report *rep) {
    return apply_swap_named(ud, module, version, NULL, fmt, bytes, size, headers, nheaders, origin,
                            rep);
}

static int rollback(void *ud, const char *module, int check, uint64_t target, hk_report *rep) {
    struct adapter *ad = ud;
    return check ? hk_rollback_release(ad->rt, module, target, rep)
                 : hk_rollback(ad->rt, module, rep);
}

static int release(void *ud, const char *module, int back, uint64_t *out) {
    struct adapter *ad = ud;
    return hk_module_release(ad->rt, module, back, out);
}

static int quarantine(void *ud, int index, hk_quarantine *out) {
    struct adapter *ad = ud;
    return hk_quarantine_get(ad->rt, index, out);
}

static uint64_t version(void *ud, const char *module) {
    struct adapter *ad = ud;
    return hk_module_version(ad->rt, module);
}

static char *metrics(void *ud, size_t *len) {
    struct adapter *ad = ud;
    char *text = NULL;
    return hk_metrics_text_alloc(ad->rt, &text, len) == 0 ? text : NULL;
}

static void log_line(void *ud, hk_log_level level, const char *subsystem, const char *text) {
    struct adapter *ad = ud;
    hk_log(ad->rt, level, subsystem, "%s", text);
}

static int log_on(void *ud, hk_log_level level) {
    struct adapter *ad = ud;
    return hk_log_enabled(ad->rt, level);
}

/* ---- configuration ----------------------------------------------------- */

static int adapter_init(struct adapter *ad, hk_runtime *rt, const hk_swap_options *tpl,
                        hk_report *rep) {
    ad->rt = rt;
    if (hkb_swap_options_in(&ad->swap, tpl) < 0)
        return hku_fail(rep, HK_ERR_INVALID, "swap template: size %zu below the first layout",
                        hkb_size_of(tpl));
    /* What arrives over the network runs its canary tests before it runs
     * here, unless the template says otherwise. */
    if (ad->swap.canary == HK_CANARY_DEFAULT)
        ad->swap.canary = HK_CANARY_REQUIRE;
    /* The caller's arrays are read during the call only: keep copies. */
    int nopt = ad->swap.nvrtc_options ? ad->swap.nnvrtc_options : 0;
    int nexpr = ad->swap.name_expressions ? ad->swap.nname_expressions : 0;
    ad->nvrtc_options = hku_strv_dup(ad->swap.nvrtc_options, nopt);
    ad->name_expressions = hku_strv_dup(ad->swap.name_expressions, nexpr);
    if ((nopt > 0 && !ad->nvrtc_options) || (nexpr > 0 && !ad->name_expressions))
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    ad->swap.nvrtc_options = (const char *const *)ad->nvrtc_options;
    ad->swap.name_expressions = (const char *const *)ad->name_expressions;
    int nh = ad->swap.nheaders > 0 && ad->swap.headers ? ad->swap.nheaders : 0;
    const hk_header *src = ad->swap.headers;
    if (nh > 64)
        return hku_fail(rep, HK_ERR_INVALID, "at most 64 template headers");
    ad->swap.headers = NULL;
    ad->swap.nheaders = 0;
    int err = hku_headers_dup(src, nh, &ad->headers);
    if (err)
        return hku_fail(rep, err, "template headers: %s",
                        err == HK_ERR_INVALID ? "a header without a name or data" : "no memory");
    ad->swap.headers = ad->headers;
    ad->swap.nheaders = nh;
    int arch = hk_runtime_arch(rt);
    if (arch > 0)
        snprintf(ad->arch, sizeof ad->arch, "sm_%d", arch);
    if (hkn_shipped_create(&ad->shipped))
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    ad->eng = (hkn_engine){.apply = apply_swap,
                           .apply_named = apply_swap_named,
                           .rollback = rollback,
                           .version = version,
                           .metrics = metrics,
                           .log = log_line,
                           .log_on = log_on,
                           .ud = ad,
                           .arch = ad->arch,
                           .quarantine = quarantine,
                           .release = release,
                           .shipped = ad->shipped};
    /* A cubin the publisher built had none of the template's build
     * options: with them, this host's build would differ (net/shipped.c). */
    if (nopt > 0 || nexpr > 0)
        ad->eng.no_shipped = "the swap template's NVRTC options or name expressions were not "
                             "the publisher's";
    return 0;
}

static void adapter_finish(struct adapter *ad) {
    hku_strv_free(ad->nvrtc_options, ad->swap.nnvrtc_options);
    hku_strv_free(ad->name_expressions, ad->swap.nname_expressions);
    free(ad->headers);
    hkn_shipped_destroy(ad->shipped);
}

/* The end of a public handle (hk_endpoint, hk_puller), stopped or never
 * fully started: out of the runtime's metrics first, so that no hook runs
 * into a stopped source, then the source (destroy(src), which takes NULL),
 * then the adapter's copies, then the handle. */
static void handle_free(void *handle, struct adapter *ad, hk_metrics_source *metrics,
                        void (*destroy)(void *src), void *src) {
    hk_metrics_detach(metrics);
    destroy(src);
    adapter_finish(ad);
    free(handle);
}

static int load_trust(const char *const *files, int n, int allow_unsigned, unsigned threshold,
                      hkn_trust *t, hk_report *rep) {
    memset(t, 0, sizeof *t);
    if (n < 0 || n > HKN_MAX_KEYS)
        return hku_fail(rep, HK_ERR_INVALID, "at most %d trusted keys", HKN_MAX_KEYS);
    /* A threshold no set of the keys can meet would refuse everything. */
    if (threshold > (unsigned)(n > 0 ? n : 1))
        return hku_fail(rep, HK_ERR_INVALID,
                        "signature_threshold %u is above the %d trusted key(s): 1 to %d", threshold,
                        n, n > 0 ? n : 1);
    for (int i = 0; i < n; i++) {
        int err = hkn_pubkey_load(files[i], &t->keys[i], rep);
        if (err)
            return err;
        for (int j = 0; j < i; j++)
            if (!strcmp(t->keys[j].id, t->keys[i].id))
                return hku_fail(rep, HK_ERR_INVALID,
                                "%s: key %s is trusted twice (a threshold counts distinct keys)",
                                files[i], t->keys[i].id);
    }
    t->nkeys = n;
    t->allow_unsigned = allow_unsigned;
    t->threshold = threshold ? (int)threshold : 1;
    return 0;
}

/* Resolves the state directory: NULL gives the default, "" gives memory only
 * (*out NULL). The default is one directory for every source of the user
 * (hotkern/releases under the XDG state directory), so that the push
 * endpoint, pullers and `hotkern pull` keep one anti-rollback record per
 * module: a release refused through one door is refused through all. */
int hkn_default_state_dir(char *buf, size_t cap, hk_report *rep) {
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && xdg[0])
        n = snprintf(buf, cap, "%s/hotkern/releases", xdg);
    else if (home && home[0])
        n = snprintf(buf, cap, "%s/.local/state/hotkern/releases", home);
    else
        return hku_fail(rep, HK_ERR_INVALID,
                        "no state_dir given and neither XDG_STATE_HOME "
                        "nor HOME is set");
    if (n < 0 || (size_t)n >= cap)
        return hku_fail(rep, HK_ERR_INVALID, "state directory path too long");
    return 0;
}

static int state_dir(const char *given, char *buf, size_t cap, const char **out, hk_report *rep) {
    *out = NULL;
    if (given && !given[0])
        return 0;
    if (given) {
        *out = given;
        return 0;
    }
    int err = hkn_default_state_dir(buf, cap, rep);
    if (!err)
        *out = buf;
    return err;
}

/* The options an endpoint and a puller share, by the same names. */
struct shared_in {
    const hk_swap_options *swap;
    const char *const *trusted_keys;
    int ntrusted_keys, allow_unsigned;
    const char *state_dir;
    unsigned signature_threshold;
};
#define SHARED_IN(o)                                                                               \
    ((struct shared_in){(o)->swap, (o)->trusted_keys, (o)->ntrusted_keys, (o)->allow_unsigned,     \
                        (o)->state_dir, (o)->signature_threshold})

/* What both start functions resolve alike: the adapter of the swap
 * template, the trusted keys and the state directory (*dir NULL or in
 * dirbuf). */
static int resolve_shared(struct adapter *ad, hk_runtime *rt, struct shared_in in, hkn_trust *trust,
                          char dirbuf[PATH_MAX], const char **dir, hk_report *rep) {
    int err;
    if ((err = adapter_init(ad, rt, in.swap, rep)) ||
        (err = load_trust(in.trusted_keys, in.ntrusted_keys, in.allow_unsigned,
                          in.signature_threshold, trust, rep)))
        return err;
    return state_dir(in.state_dir, dirbuf, PATH_MAX, dir, rep);
}

/* ---- endpoint ---------------------------------------------------------- */

static void endpoint_destroy(void *ep) {
    hkn_endpoint_stop(ep);
}

static void endpoint_metrics(hk_metrics_writer *w, void *ud) {
    hk_endpoint *h = ud;
    hkn_endpoint_metrics(h->ep, w);
    hkn_shipped_metrics(h->ad.shipped, w);
}

/* Its counters join the runtime's text, labelled with the address and port
 * it listens on, so that two endpoints of one runtime stay apart. */
static int attach_endpoint_metrics(hk_endpoint *h, const char *address, hk_report *rep) {
    char label[INET6_ADDRSTRLEN + 16];
    int v6 = strchr(address, ':') != NULL;
    snprintf(label, sizeof label, "%s%s%s:%u", v6 ? "[" : "", address, v6 ? "]" : "",
             (unsigned)hkn_endpoint_port(h->ep));
    int err = hk_metrics_attach(h->ad.rt, endpoint_metrics, h, "endpoint", label, &h->metrics);
    return err ? hku_fail(rep, err, "cannot attach the endpoint's metrics") : 0;
}

/* Reads the TLS files named by opt into r (both or neither); *cert and *key
 * are the caller's to free, whatever the outcome. */
static int read_tls(const hk_endpoint_options *opt, hkn_endpoint_resolved *r, char **cert,
                    char **key, hk_report *rep) {
    size_t len;
    int err;
    if (!opt->tls_cert_file && !opt->tls_key_file)
        return 0;
    if (!opt->tls_cert_file || !opt->tls_key_file)
        return hku_fail(rep, HK_ERR_INVALID, "TLS needs both tls_cert_file and tls_key_file");
    if ((err = hku_read_file(opt->tls_cert_file, 1 << 20, cert, &len, rep)) ||
        (err = hku_read_file(opt->tls_key_file, 1 << 20, key, &len, rep)))
        return err;
    r->tls_cert_pem = *cert;
    r->tls_key_pem = *key;
    return 0;
}

/* The frame of a public start function: its names and option sizes. */
typedef struct {
    const char *fn, *type; /* "hk_pull_start", "hk_pull_options" */
    size_t size0, size;    /* the first layout's size, this build's */
} sized_start;

typedef int (*start_fn)(hk_runtime *rt, const void *o, void *out, hk_report *rep);

/* Checks the arguments, copies the caller's options (o holds the defaults)
 * within their size, runs start and carries its report back. */
static int start_sized(sized_start f, hk_runtime *rt, void *o, const void *opt, void *out,
                       start_fn start, hk_report *rep) {
    hk_report full;
    if (hkb_report_in(&full, rep) < 0)
        return HK_ERR_INVALID;
    int err;
    if (!rt || !opt || !out)
        err = hku_fail(&full, HK_ERR_INVALID, "%s: NULL argument", f.fn);
    else if (hkb_sized_in(o, f.size, opt, f.size0) < 0)
        err = hku_fail(&full, HK_ERR_INVALID, "%s.size %zu is below %zu", f.type, hkb_size_of(opt),
                       f.size0);
    else
        err = start(rt, o, out, rep ? &full : NULL);
    hkb_report_out(rep, &full);
    return err;
}

/* hk_endpoint_start with opt in the library's layout and a full report. */
static int endpoint_start(hk_runtime *rt, const hk_endpoint_options *opt, hk_endpoint **out,
                          hk_report *rep) {
    int err;
    char *cert = NULL, *key = NULL, dirbuf[PATH_MAX];
    hkn_endpoint_resolved r;
    memset(&r, 0, sizeof r);
    *out = NULL;
    if (opt->port > 65535)
        return hku_fail(rep, HK_ERR_INVALID, "port %u out of range", opt->port);
    hk_endpoint *h = calloc(1, sizeof *h);
    if (!h)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    if ((err = resolve_shared(&h->ad, rt, SHARED_IN(opt), &r.trust, dirbuf, &r.state_dir, rep)) ||
        (err = read_tls(opt, &r, &cert, &key, rep)) ||
        (err = hkn_endpoint_start(opt, &r, &h->ad.eng, &h->ep, rep)))
        goto fail;
    const char *address = hkn_endpoint_address(h->ep);
    if ((err = attach_endpoint_metrics(h, address, rep)))
        goto fail;
    if (!opt->token && !r.tls_cert_pem && (!strcmp(address, "0.0.0.0") || !strcmp(address, "::"))) {
        /* Started, but say so: the caller may show the message. */
        hk_log(rt, HK_LOG_WARN, "endpoint",
               "listening on every address (%s) with no token and no TLS", address);
        hku_fail(rep, 0,
                 "warning: listening on every address (%s) with no token and no TLS: anyone "
                 "who can reach the port can push signed releases and read status; put a "
                 "reverse proxy in front or set a token and TLS",
                 address);
    }
    free(cert);
    free(key);
    *out = h;
    return 0;
fail:
    free(cert);
    free(key);
    handle_free(h, &h->ad, h->metrics, endpoint_destroy, h->ep);
    return err;
}

static int endpoint_start_v(hk_runtime *rt, const void *o, void *out, hk_report *rep) {
    return endpoint_start(rt, o, out, rep);
}

int hk_endpoint_start(hk_runtime *rt, const hk_endpoint_options *opt, hk_endpoint **out,
                      hk_report *rep) {
    hk_endpoint_options o;
    hk_endpoint_options_init(&o);
    if (out)
        *out = NULL;
    return start_sized((sized_start){"hk_endpoint_start", "hk_endpoint_options",
                                     HKN_ENDPOINT_OPTIONS_SIZE0, sizeof o},
                       rt, &o, opt, out, endpoint_start_v, rep);
}

unsigned hk_endpoint_port(const hk_endpoint *ep) {
    return ep ? hkn_endpoint_port(ep->ep) : 0;
}

void hk_endpoint_stop(hk_endpoint *ep) {
    if (ep)
        handle_free(ep, &ep->ad, ep->metrics, endpoint_destroy, ep->ep);
}

/* ---- puller ------------------------------------------------------------ */

static void puller_destroy(void *p) {
    hkn_pull_destroy(p);
}

static void puller_metrics(hk_metrics_writer *w, void *ud) {
    hk_puller *h = ud;
    hkn_pull_metrics(h->p, w);
    hkn_shipped_metrics(h->ad.shipped, w);
}

/* hk_pull_start with opt in the library's layout and a full report. */
static int pull_start(hk_runtime *rt, const hk_pull_options *opt, hk_puller **out, hk_report *rep) {
    int err;
    char dirbuf[PATH_MAX];
    hkn_pull_resolved r;
    memset(&r, 0, sizeof r);
    *out = NULL;
    if (!opt->url)
        return hku_fail(rep, HK_ERR_INVALID, "hk_pull_start: no url");
    if (hkn_crypto_init())
        return hku_fail(rep, HK_ERR_UNSUPPORTED, "libsodium failed to initialise");
    hk_puller *h = calloc(1, sizeof *h);
    if (!h)
        return hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    if ((err = resolve_shared(&h->ad, rt, SHARED_IN(opt), &r.trust, dirbuf, &r.state_dir, rep)) ||
        (err = hkn_pull_create(opt, &r, &h->ad.eng, &h->p, rep)))
        goto fail;
    if ((err = hk_metrics_attach(rt, puller_metrics, h, "url", opt->url, &h->metrics))) {
        hku_fail(rep, err, "cannot attach the puller's metrics");
        goto fail;
    }
    if ((err = hkn_pull_run(h->p))) {
        hku_fail(rep, err, "could not start the puller thread");
        goto fail;
    }
    *out = h;
    return 0;
fail:
    handle_free(h, &h->ad, h->metrics, puller_destroy, h->p);
    return err;
}

static int pull_start_v(hk_runtime *rt, const void *o, void *out, hk_report *rep) {
    return pull_start(rt, o, out, rep);
}

int hk_pull_start(hk_runtime *rt, const hk_pull_options *opt, hk_puller **out, hk_report *rep) {
    hk_pull_options o;
    hk_pull_options_init(&o);
    if (out)
        *out = NULL;
    return start_sized(
        (sized_start){"hk_pull_start", "hk_pull_options", HKN_PULL_OPTIONS_SIZE0, sizeof o}, rt, &o,
        opt, out, pull_start_v, rep);
}

int hk_pull_stats_get(hk_puller *p, hk_pull_stats *user) {
    hkn_pull_stats s;
    hk_pull_stats full = HK_PULL_STATS_INIT, *out = &full;
    if (!p || !user || hkb_size_of(user) < HKN_PULL_STATS_SIZE0)
        return HK_ERR_INVALID;
    hkn_pull_stats_get(p->p, &s);
    out->requests = s.requests;
    out->not_modified = s.not_modified;
    out->errors = s.errors;
    out->refused = s.refused;
    out->applied = s.applied;
    out->polls = s.polls;
    out->bytes = s.bytes;
    out->last_error = s.last_error;
    memcpy(out->last_message, s.last_message, sizeof out->last_message);
    hkb_sized_out(user, out, sizeof *out);
    return 0;
}

uint64_t hk_pull_keys_version(hk_puller *p) {
    return p ? hkn_pull_keys_version(p->p) : 0;
}

unsigned hk_pull_metrics_port(const hk_puller *p) {
    return p ? hkn_pull_metrics_port(p->p) : 0;
}

void hk_pull_stop(hk_puller *p) {
    if (p)
        handle_free(p, &p->ad, p->metrics, puller_destroy, p->p);
}

/*
 * hotkern-demo: a game-server-like loop whose GPU kernel is replaced while it
 * runs.
 *
 * The shape is the one hotkern is made for. The state lives in buffers the
 * application allocated with the CUDA runtime API, and a fixed-rate tick loop
 * launches `step` through a hotkern kernel handle, so it always runs the
 * newest committed version without knowing versions exist. After each tick's
 * synchronize the GPU is idle, and that is where the loop calls
 * hk_safe_point(): watched files are built on hotkern's worker meanwhile and
 * only uploaded there, so a save never stalls a tick behind the compiler.
 * Pushed releases arrive through the HTTP endpoint, whose swaps are
 * synchronous because the pusher waits for the outcome.
 *
 * The loop reads the state back every tick for the checksum: a game server
 * would send it to clients, and here it lets the summary show that a commit
 * leaves the buffer bit-identical, while the kernel's __device__ step counter
 * shows that state inside the module survives the swap too.
 *
 * Exit status: 0 done, 1 failure, 2 usage, 3 no GPU here (the kernels were
 * validated instead).
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "demo/demo.h"
#include "hotkern/net.h"

#define PARTICLES 65536
#define TICK_HZ   60
#define BLOCK     256

typedef struct demo_args {
    int tour;
    int seconds;
    const char *kernels;
    const char *out;
    unsigned port;
} demo_args;

static volatile sig_atomic_t got_signal;

static void on_signal(int sig) {
    (void)sig;
    got_signal = 1;
}

static void usage(FILE *f) {
    fputs("usage: hotkern-demo [--tour] [--seconds N] [--kernels DIR] [--out DIR] [--port P]\n"
          "\n"
          "Runs a particle simulation at 60 ticks/s whose kernel, step() in\n"
          "DIR/particles.cu, hotkern replaces while it runs. Edit and save that file,\n"
          "or push a release with the hotkern CLI, and watch the status line.\n"
          "  --tour         unattended tour (about 30 s): a save, a broken save, a\n"
          "                 signed push and a rollback, then a summary; works on a\n"
          "                 copy of DIR, never on DIR itself\n"
          "  --seconds N    stop after N seconds (default 60; 0: until Ctrl-C)\n"
          "  --kernels DIR  kernel sources (default demo/kernels)\n"
          "  --out DIR      keys, compile cache and pictures (default BUILD/demo-out)\n"
          "  --port P       push endpoint port on 127.0.0.1 (default 0: any free port)\n"
          "Exit status: 0 done, 1 failure, 2 usage, 3 no GPU here (kernels validated).\n",
          f);
}

static int parse_args(int argc, char **argv, demo_args *a) {
    static const struct option opts[] = {
        {"tour", no_argument, NULL, 't'},
        {"seconds", required_argument, NULL, 's'},
        {"kernels", required_argument, NULL, 'k'},
        {"out", required_argument, NULL, 'o'},
        {"port", required_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    char *end;
    long v;
    int c;

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            a->tour = 1;
            break;
        case 's':
        case 'p':
            errno = 0;
            v = strtol(optarg, &end, 10);
            if (errno || *end || v < 0 || v > (c == 's' ? 86400 * 365 : 65535)) {
                fprintf(stderr, "hotkern-demo: bad number '%s'\n", optarg);
                return -1;
            }
            if (c == 's')
                a->seconds = (int)v;
            else
                a->port = (unsigned)v;
            break;
        case 'k':
            a->kernels = optarg;
            break;
        case 'o':
            a->out = optarg;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return -1;
    }
    return 0;
}

static int mkdir_p(const char *path) {
    char buf[PATH_MAX];

    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

/* The directory of this program: the CLI is built next to it. */
static int exe_dir(char *buf, size_t n) {
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);

    if (len <= 0)
        return -1;
    self[len] = 0;
    return snprintf(buf, n, "%s", dirname(self)) >= (int)n ? -1 : 0;
}

/* A path below the working directory, shortened for display. */
static const char *shown(const char *path) {
    static char cwd[PATH_MAX];
    size_t n;

    if (!cwd[0] && !getcwd(cwd, sizeof cwd))
        return path;
    n = strlen(cwd);
    return !strncmp(path, cwd, n) && path[n] == '/' ? path + n + 1 : path;
}

/* Deterministic start: a 256 x 256 grid in the upper part of the box, each
 * particle with a small pseudo-random velocity from a fixed LCG. */
static void init_particles(float *p, int n) {
    int side = (int)sqrt((double)n);
    uint32_t s = 12345;

    for (int i = 0; i < n; i++) {
        int row = i / side, col = i % side;
        p[4 * i] = 0.1f + 0.8f * ((float)col + 0.5f) / (float)side;
        p[4 * i + 1] = 0.35f + 0.6f * ((float)row + 0.5f) / (float)side;
        s = s * 1664525u + 1013904223u;
        p[4 * i + 2] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.6f;
        s = s * 1664525u + 1013904223u;
        p[4 * i + 3] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.6f;
    }
}

/* Reads the kernel's __device__ step counter. The address hk_module_global
 * returns is valid until the next commit, which a rollback may make at any
 * time on the endpoint's thread, so the current version is pinned around the
 * copy.
 * Version numbers only grow, so if the pinned version is still current after
 * the lookup, the address is the pinned version's, loaded until hk_unpin. */
static int read_steps(hk_runtime *rt, uint64_t *out) {
    for (int attempt = 0; attempt < 3; attempt++) {
        hk_pin *pin = NULL;
        uint64_t addr = 0;
        size_t size = 0;
        int err, same;

        if (hk_pin_module(rt, DEMO_MODULE, &pin))
            return -1;
        err = hk_module_global(rt, DEMO_MODULE, "steps", 0, &addr, &size);
        same = hk_module_version(rt, DEMO_MODULE) == hk_pin_version(pin);
        if (!err && same && size == sizeof *out &&
            cudaMemcpy(out, (const void *)(uintptr_t)addr, sizeof *out, cudaMemcpyDeviceToHost) !=
                cudaSuccess)
            err = -1;
        hk_unpin(pin);
        if (err || size != sizeof *out)
            return -1;
        if (same)
            return 0;
    }
    return -1;
}

static int ensure_key(demo *d) {
    char dir[DEMO_DIR + 16];

    snprintf(dir, sizeof dir, "%s/keys", d->out);
    snprintf(d->key, sizeof d->key, "%s/hotkern.key", dir);
    if (access(d->key, R_OK) == 0)
        return 0;
    demo_say(d, "Making a signing key for pushes: hotkern keygen --out %s", shown(dir));
    const char *argv[] = {"hotkern", "keygen", "--out", dir, NULL};
    return demo_run_cli(d, argv, 30000) == 0 ? 0 : -1;
}

static int start_endpoint(demo *d, unsigned port, hk_endpoint **ep) {
    hk_endpoint_options eo;
    hk_swap_options so;
    hk_report rep = HK_REPORT_INIT;
    char pub[PATH_MAX], state[PATH_MAX];
    const char *trusted[1];
    int err;

    snprintf(pub, sizeof pub, "%s/keys/hotkern.pub", d->out);
    snprintf(state, sizeof state, "%s/push-state", d->out);
    if (mkdir_p(state))
        return -1;
    trusted[0] = pub;
    /* The default stage (HK_STAGE_AUTO): the pusher waits for the outcome,
     * and since this program calls hk_safe_point every tick, the endpoint's
     * hk_swap builds on its own thread and stages at the next tick's safe
     * point before it answers. */
    hk_swap_options_init(&so);
    hk_endpoint_options_init(&eo);
    eo.address = "127.0.0.1";
    eo.port = port;
    eo.trusted_keys = trusted;
    eo.ntrusted_keys = 1;
    eo.state_dir = state;
    eo.swap = &so;
    err = hk_endpoint_start(d->rt, &eo, ep, &rep);
    if (err) {
        demo_say(d, "The push endpoint did not start (%s): %s; going on without it",
                 hk_strerror(err), rep.message);
        hk_report_clear(&rep);
        return -1;
    }
    snprintf(d->url, sizeof d->url, "http://127.0.0.1:%u", hk_endpoint_port(*ep));
    return 0;
}

static int cuda_failed(demo *d, cudaError_t e, const char *what) {
    if (e == cudaSuccess)
        return 0;
    demo_say(d, "%s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    return 1;
}

/* Waits until the watcher's first build of particles.cu is committed and
 * takes the kernel handle. Commits happen in hk_safe_point, called here
 * because the loop is not running yet. */
static int first_version(demo *d, const demo_args *a, hk_kernel **k) {
    double give_up = a->tour ? 60000 : a->seconds ? a->seconds * 1000.0 : INFINITY;
    int told = 0, err = -1;

    demo_say(d, "Building the first version of %s/particles.cu ...", shown(d->watched));
    while (!got_signal && !atomic_load(&d->stop) && demo_now_ms(d) < give_up) {
        struct timespec ts = {0, 10 * 1000000L};
        hk_safe_point(d->rt);
        if (atomic_load(&d->version) > 0) {
            err = hk_kernel_get(d->rt, DEMO_MODULE, DEMO_KERNEL, k);
            if (!err)
                return 0;
            if (!told++)
                demo_say(d, "particles.cu has no kernel '%s' (%s); waiting for a version that has",
                         DEMO_KERNEL, hk_strerror(err));
        }
        nanosleep(&ts, NULL);
    }
    if (!got_signal && !atomic_load(&d->stop))
        demo_say(d, "No usable version of particles.cu arrived in time");
    return -1;
}

static void print_intro(demo *d, const demo_args *a) {
    char dev[256] = "device 0";
    struct cudaDeviceProp prop;
    int major = 0, minor = 0;

    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        snprintf(dev, sizeof dev, "%s", prop.name);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    demo_say(d, "GPU: %s (sm_%d%d); %d particles, %d ticks/s; kernels built for sm_%d", dev, major,
             minor, PARTICLES, TICK_HZ, hk_runtime_arch(d->rt));
    if (d->url[0])
        demo_say(d, "Push endpoint: %s (trusts %s/keys/hotkern.pub)", d->url, shown(d->out));
    if (a->tour)
        return;
    demo_say(d, "%s", "");
    demo_say(d, "The simulation runs for %s. Meanwhile, in another terminal:",
             a->seconds ? "the given time" : "as long as you like (Ctrl-C stops it)");
    demo_say(d, "  - edit %s/particles.cu and save it (try the gravity, 1.5f)", shown(d->watched));
    if (d->url[0]) {
        demo_say(d, "  - push another version, leaving the file alone:");
        demo_say(d, "      %s push %s --key %s --module %s %s/variants/swirl.cu", shown(d->cli),
                 d->url, shown(d->key), DEMO_MODULE, shown(d->kernels));
        demo_say(d, "  - and roll it back: %s rollback %s %s --key %s", shown(d->cli), d->url,
                 DEMO_MODULE, shown(d->key));
    }
    demo_say(d, "  (`make demo-tour` does all of this unattended)");
    demo_say(d, "%s", "");
}

static void status_line(demo *d, double rate, double worst, uint32_t sum) {
    char line[512], last[200] = "none yet";
    uint64_t steps = 0;
    int have = read_steps(d->rt, &steps) == 0;
    char steps_s[32] = "-";

    if (have)
        snprintf(steps_s, sizeof steps_s, "%llu", (unsigned long long)steps);
    pthread_mutex_lock(&d->mu);
    if (d->nswaps) {
        const demo_swap *s = &d->swaps[d->nswaps - 1];
        if (s->kind == HK_EVENT_REFUSED)
            snprintf(last, sizeof last, "%s refused (%s)", s->origin, hk_strerror(s->error));
        else
            snprintf(last, sizeof last, "%s %s v%llu (build %.0f ms, stage %.1f, commit %.2f)",
                     s->origin, s->kind == HK_EVENT_ROLLED_BACK ? "rolled back to" : "->",
                     (unsigned long long)s->new_version, s->build_ms, s->stage_ms, s->commit_ms);
    }
    pthread_mutex_unlock(&d->mu);
    snprintf(line, sizeof line,
             "[%5.1fs] %5.1f ticks/s  worst tick %5.2f ms  %s v%llu  steps %s  checksum %08x  "
             "last swap: %s",
             demo_now_ms(d) / 1000.0, rate, worst, DEMO_MODULE,
             (unsigned long long)atomic_load(&d->version), steps_s, sum, last);
    demo_status(d, line);
}

/* Hands a requested frame to the tour. */
static void serve_frame(demo *d, const float *host, uint32_t sum) {
    char label[DEMO_LABEL];
    uint64_t steps = 0;
    int want, have, idx;

    pthread_mutex_lock(&d->mu);
    want = d->frame_wanted;
    snprintf(label, sizeof label, "%s", d->frame_label);
    pthread_mutex_unlock(&d->mu);
    if (!want)
        return;
    have = read_steps(d->rt, &steps) == 0;
    idx = demo_add_frame(d, label, want == 2, host, PARTICLES, sum, atomic_load(&d->version), have,
                         steps);
    pthread_mutex_lock(&d->mu);
    if (d->frame_wanted) {
        d->frame_done = idx;
        d->frame_wanted = 0;
        pthread_cond_broadcast(&d->cond);
    }
    pthread_mutex_unlock(&d->mu);
}

/* The tick loop and everything CUDA. Returns the exit status. */
static int simulate(demo *d, const demo_args *a) {
    const size_t bytes = (size_t)PARTICLES * 4 * sizeof(float);
    const float dt = 1.0f / TICK_HZ;
    const double period = 1000.0 / TICK_HZ;
    hk_endpoint *ep = NULL;
    hk_kernel *k = NULL;
    cudaStream_t stream = NULL;
    float *dev = NULL, *host = NULL;
    pthread_t tour;
    int tour_started = 0, rc = 1, n = PARTICLES, have;
    uint64_t steps = 0;
    uint32_t sum;
    char html[PATH_MAX];

    if (ensure_key(d) == 0)
        start_endpoint(d, a->port, &ep);
    else
        demo_say(d, "Could not make a signing key; going on without the push endpoint");
    if (cuda_failed(d, cudaSetDevice(0), "cudaSetDevice") ||
        cuda_failed(d, cudaStreamCreate(&stream), "cudaStreamCreate") ||
        cuda_failed(d, cudaMalloc((void **)&dev, bytes), "cudaMalloc") ||
        cuda_failed(d, cudaMallocHost((void **)&host, bytes), "cudaMallocHost"))
        goto free_cuda;
    init_particles(host, n);
    if (cuda_failed(d, cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy"))
        goto free_cuda;
    print_intro(d, a);

    if (first_version(d, a, &k))
        goto free_cuda;
    sum = demo_checksum(host, n);
    have = read_steps(d->rt, &steps) == 0;
    demo_add_frame(d, "start (particles.cu as shipped)", !a->tour, host, n, sum,
                   atomic_load(&d->version), have, steps);
    if (a->tour) {
        if (demo_tour_start(d, &tour)) {
            demo_say(d, "Cannot start the tour thread");
            goto free_cuda;
        }
        tour_started = 1;
    }

    double next = demo_mono_ms(), status_at = next + 1000, worst = 0;
    uint64_t status_ticks = 0;
    rc = 0;
    for (;;) {
        if (got_signal && !atomic_load(&d->stop)) {
            demo_say(d, "Stopping (signal)");
            demo_request_stop(d);
        }
        if (atomic_load(&d->stop))
            break;
        if (!a->tour && a->seconds && demo_now_ms(d) >= a->seconds * 1000.0)
            break;

        double t0 = demo_mono_ms();
        uint64_t tick = atomic_load(&d->ticks);
        float t = (float)tick * dt;
        void *args[] = {&dev, &n, (void *)&dt, &t};
        int cu = 0, err;
        hk_dim3 grid = {(unsigned)(n + BLOCK - 1) / BLOCK, 1, 1}, block = {BLOCK, 1, 1};

        err = hk_launch(k, grid, block, 0, stream, args, &cu);
        if (err) {
            demo_say(d, "hk_launch failed: %s (CUresult %d)", hk_strerror(err), cu);
            rc = 1;
            break;
        }
        cudaError_t ce = cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream);
        if (ce == cudaSuccess)
            ce = cudaStreamSynchronize(stream);
        if (ce != cudaSuccess) {
            /* A fault is sticky: the context is lost for the whole process
             * and no later version can run in it. */
            demo_say(d,
                     "The GPU reported %s after step ran: a kernel fault ends the CUDA "
                     "context of the whole process, which no swap can undo. Fix the kernel "
                     "and start the demo again.",
                     cudaGetErrorName(ce));
            rc = 1;
            break;
        }
        atomic_fetch_add(&d->ticks, 1);
        uint32_t before = demo_checksum(host, n);
        int first = demo_swap_count(d);
        int committed = hk_safe_point(d->rt);
        double ms = demo_mono_ms() - t0;
        sum = before;
        if (committed > 0 && cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess) {
            sum = demo_checksum(host, n);
            demo_note_commit(d, first, before, sum);
        }
        demo_log_tick(d, t0 - d->t0, ms);
        if (ms > worst)
            worst = ms;
        serve_frame(d, host, sum);

        double now = demo_mono_ms();
        if (now >= status_at) {
            uint64_t done = atomic_load(&d->ticks);
            status_line(d, (double)(done - status_ticks) * 1000.0 / (now - status_at + 1000.0),
                        worst, sum);
            status_ticks = done;
            status_at = now + 1000;
            worst = 0;
        }
        /* Fixed rate: the next tick is due one period after this one was.
         * After a long stall the schedule restarts rather than bursting. */
        next += period;
        if (next < now - period)
            next = now;
        double wait = next - demo_mono_ms();
        if (wait > 0) {
            struct timespec ts = {(time_t)(wait / 1000), (long)(fmod(wait, 1000.0) * 1e6)};
            nanosleep(&ts, NULL);
        }
    }
    demo_status_done(d);
    demo_request_stop(d);
    if (tour_started)
        pthread_join(tour, NULL);
    hk_endpoint_stop(ep);
    ep = NULL;

    have = read_steps(d->rt, &steps) == 0;
    demo_add_frame(d, "last frame", !a->tour, host, n, demo_checksum(host, n),
                   atomic_load(&d->version), have, steps);
    demo_summary(d);
    snprintf(html, sizeof html, "%s/%s", d->out, a->tour ? "tour.html" : "demo.html");
    if (demo_write_html(d, html, a->tour ? "hotkern tour" : "hotkern demo") == 0)
        demo_say(d, "\nPictures of the state: %s", shown(html));

free_cuda:
    hk_endpoint_stop(ep);
    cudaFreeHost(host);
    cudaFree(dev);
    if (stream)
        cudaStreamDestroy(stream);
    return rc;
}

int main(int argc, char **argv) {
    demo_args a = {0, 60, "demo/kernels", NULL, 0};
    demo d;
    hk_options o;
    hk_report rep = HK_REPORT_INIT;
    hk_swap_options wo;
    struct sigaction sa;
    char bin[DEMO_DIR / 2], real[PATH_MAX], cache[PATH_MAX], probe[PATH_MAX];
    char tmpl[] = "/tmp/hotkern-demo-XXXXXX";
    int rc = 1, err;

    if (parse_args(argc, argv, &a))
        return 2;
    memset(&d, 0, sizeof d);
    if (demo_init(&d)) {
        fprintf(stderr, "hotkern-demo: out of memory\n");
        return 1;
    }
    d.tour = a.tour;
    d.sim_thread = pthread_self();
    d.hz = TICK_HZ;
    d.tty = isatty(STDOUT_FILENO);
    if (exe_dir(bin, sizeof bin)) {
        fprintf(stderr, "hotkern-demo: cannot find my own directory\n");
        goto fini;
    }
    snprintf(d.cli, sizeof d.cli, "%s/hotkern", bin);
    if (a.out)
        snprintf(d.out, sizeof d.out, "%s", a.out);
    else
        snprintf(d.out, sizeof d.out, "%s/../demo-out", bin);
    if (!realpath(a.kernels, real) || strlen(real) >= sizeof d.kernels) {
        fprintf(stderr, "hotkern-demo: no kernel directory %s: %s\n", a.kernels, strerror(errno));
        goto fini;
    }
    memcpy(d.kernels, real, strlen(real) + 1); /* length checked above */
    snprintf(probe, sizeof probe, "%s/particles.cu", d.kernels);
    if (access(probe, R_OK)) {
        fprintf(stderr, "hotkern-demo: %s: %s\n", probe, strerror(errno));
        goto fini;
    }
    if (mkdir_p(d.out) || !realpath(d.out, real) || strlen(real) >= sizeof d.out) {
        fprintf(stderr, "hotkern-demo: cannot create %s: %s\n", d.out, strerror(errno));
        goto fini;
    }
    memcpy(d.out, real, strlen(real) + 1); /* length checked above */
    snprintf(cache, sizeof cache, "%s/cache", d.out);

    /* Before hk_runtime_create, on purpose: NVRTC replaces the SIGINT, SIGTERM
     * and SIGXFSZ handlers during each compile and restores the ones it saw
     * when the compile began, and create starts a warm-up compile at once. */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* A program that compiles as it runs: keep the memory NVRTC frees for the
     * next build (README, "Build speed"). */
    (void)hk_build_keep_memory(NULL);
    hk_options_init(&o);
    o.cache_dir = cache;
    o.on_event = demo_on_event;
    o.userdata = &d;
    err = hk_runtime_create(&d.rt, &o, &rep);
    if (err == HK_ERR_NO_DRIVER || err == HK_ERR_NO_DEVICE) {
        printf("No GPU here: %s (%s).\n", rep.message[0] ? rep.message : hk_strerror(err),
               hk_strerror(err));
        printf("The simulation needs an NVIDIA GPU; the kernels can still be checked.\n\n");
        rc = demo_validate(d.kernels, cache);
        goto clear;
    }
    if (err) {
        fprintf(stderr, "hotkern-demo: hk_runtime_create: %s: %s\n", hk_strerror(err), rep.message);
        goto clear;
    }

    /* The tour saves files into a copy, never into the given directory. */
    if (a.tour) {
        if (!mkdtemp(tmpl)) {
            fprintf(stderr, "hotkern-demo: mkdtemp: %s\n", strerror(errno));
            goto destroy;
        }
        snprintf(d.stage_dir, sizeof d.stage_dir, "%s", tmpl);
        snprintf(d.watched, sizeof d.watched, "%s/kernels", tmpl);
        if (mkdir(d.watched, 0755) || demo_copy_files(d.kernels, d.watched)) {
            fprintf(stderr, "hotkern-demo: cannot copy %s to %s: %s\n", d.kernels, d.watched,
                    strerror(errno));
            goto destroy;
        }
    } else {
        snprintf(d.watched, sizeof d.watched, "%s", d.kernels);
    }
    hk_swap_options_init(&wo);
    wo.stage = HK_STAGE_AT_SAFE_POINT;
    err = hk_watch_dir(d.rt, d.watched, &wo, &rep);
    if (err) {
        fprintf(stderr, "hotkern-demo: hk_watch_dir %s: %s: %s\n", d.watched, hk_strerror(err),
                rep.message);
        goto destroy;
    }
    rc = simulate(&d, &a);

destroy:
    hk_runtime_destroy(d.rt);
    if (d.stage_dir[0])
        demo_remove_tree(d.stage_dir);
clear:
    hk_report_clear(&rep);
fini:
    demo_fini(&d);
    return rc;
}

/*
 * What the demo saw, and how it shows it.
 *
 * Swap outcomes arrive on whichever thread performed the swap (the worker,
 * the endpoint, or the simulation thread inside hk_safe_point), so they are
 * appended under demo.mu and announced on demo.cond, which the tour waits on.
 * Frames are taken by the simulation thread only, because only it may touch
 * the state buffer; other threads ask for one and wait.
 *
 * Output goes through one print lock so that a message from one thread never
 * splits another's, and so that the live status line on a terminal can be
 * cleared before a message and redrawn after it.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "demo/demo.h"

#define DEMO_MAX_TICKS (1u << 20) /* about 4.8 hours at 60 ticks/s */

static pthread_mutex_t print_mu = PTHREAD_MUTEX_INITIALIZER;
static int status_shown; /* print_mu: a status line is on the terminal */

double demo_mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double demo_now_ms(const demo *d) {
    return demo_mono_ms() - d->t0;
}

int demo_init(demo *d) {
    pthread_condattr_t ca;

    d->t0 = demo_mono_ms();
    atomic_init(&d->stop, 0);
    atomic_init(&d->ticks, 0);
    atomic_init(&d->version, 0);
    d->frames = calloc(DEMO_MAX_FRAMES, sizeof *d->frames);
    if (!d->frames)
        return -1;
    if (pthread_mutex_init(&d->mu, NULL))
        goto fail_frames;
    /* Monotonic, so that a clock change cannot stretch the tour's timeouts. */
    if (pthread_condattr_init(&ca))
        goto fail_mu;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_cond_init(&d->cond, &ca)) {
        pthread_condattr_destroy(&ca);
        goto fail_mu;
    }
    pthread_condattr_destroy(&ca);
    d->frame_done = -1;
    return 0;

fail_mu:
    pthread_mutex_destroy(&d->mu);
fail_frames:
    free(d->frames);
    d->frames = NULL;
    return -1;
}

void demo_fini(demo *d) {
    for (int i = 0; i < d->nswaps; i++)
        free(d->swaps[i].log);
    free(d->swaps);
    free(d->frames);
    free(d->tick_log);
    pthread_cond_destroy(&d->cond);
    pthread_mutex_destroy(&d->mu);
}

/* ---- output ------------------------------------------------------------- */

void demo_say(demo *d, const char *fmt, ...) {
    va_list ap;

    (void)d;
    pthread_mutex_lock(&print_mu);
    if (status_shown) {
        fputs("\r\033[K", stdout);
        status_shown = 0;
    }
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
    pthread_mutex_unlock(&print_mu);
}

void demo_status(demo *d, const char *line) {
    pthread_mutex_lock(&print_mu);
    if (d->tty) {
        /* A line wider than the terminal would wrap, and \r would then
         * rewrite only its last row. */
        struct winsize ws;
        int cols = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col ? ws.ws_col : 80;
        printf("\r\033[K%.*s", cols - 1, line);
        status_shown = 1;
    } else {
        printf("%s\n", line);
    }
    fflush(stdout);
    pthread_mutex_unlock(&print_mu);
}

void demo_status_done(demo *d) {
    (void)d;
    pthread_mutex_lock(&print_mu);
    if (status_shown)
        putchar('\n');
    status_shown = 0;
    fflush(stdout);
    pthread_mutex_unlock(&print_mu);
}

/* Prints a compiler log indented, one line at a time. */
static void say_log(demo *d, const char *log) {
    const char *p = log;

    while (p && *p) {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        if (len > 0)
            demo_say(d, "      | %.*s", len, p);
        p = nl ? nl + 1 : NULL;
    }
}

/* ---- swap outcomes ------------------------------------------------------ */

static const char *kind_name(hk_event_kind k) {
    switch (k) {
    case HK_EVENT_COMMITTED:
        return "committed";
    case HK_EVENT_REFUSED:
        return "refused";
    case HK_EVENT_ROLLED_BACK:
        return "rolled back";
    default:
        return "other";
    }
}

/* "watch:/long/path/particles.cu" becomes "watch particles.cu". */
static void short_origin(char *buf, size_t n, const char *origin) {
    if (!origin)
        origin = "api";
    if (!strncmp(origin, "watch:", 6)) {
        const char *slash = strrchr(origin, '/');
        snprintf(buf, n, "watch %s", slash ? slash + 1 : origin + 6);
    } else {
        snprintf(buf, n, "%s", origin);
    }
}

void demo_on_event(const hk_event *ev, void *userdata) {
    demo *d = userdata;
    const hk_report *r = ev->report;
    demo_swap s;

    if (ev->kind == HK_EVENT_RECLAIMED) {
        pthread_mutex_lock(&d->mu);
        d->reclaimed++;
        pthread_mutex_unlock(&d->mu);
        return;
    }
    if (ev->kind == HK_EVENT_CONTEXT_RESET) {
        demo_say(d, "!! the CUDA context was reset: the kernels were reloaded, but the "
                    "simulation's buffers are gone; stopping");
        demo_request_stop(d);
        return;
    }
    if (ev->module && strcmp(ev->module, DEMO_MODULE))
        return;

    memset(&s, 0, sizeof s);
    s.kind = ev->kind;
    short_origin(s.origin, sizeof s.origin, ev->origin);
    s.old_version = ev->old_version;
    s.new_version = ev->new_version;
    if (r) {
        s.error = r->error;
        snprintf(s.message, sizeof s.message, "%s", r->message);
        s.log = r->log ? strdup(r->log) : NULL;
        s.build_ms = r->build_ms;
        s.stage_ms = r->stage_ms;
        s.commit_ms = r->commit_ms;
        s.cache_hit = r->cache_hit;
    }
    s.t_ms = demo_now_ms(d);
    s.tick = atomic_load(&d->ticks);
    s.at_safe_point = pthread_equal(pthread_self(), d->sim_thread);

    if (ev->kind == HK_EVENT_REFUSED) {
        demo_say(d, ">> swap from %s refused (%s): version %llu keeps running", s.origin,
                 hk_strerror(s.error), (unsigned long long)s.old_version);
        if (s.message[0])
            demo_say(d, "   %s", s.message);
        if (s.log)
            say_log(d, s.log);
    } else {
        demo_say(d,
                 ">> swap from %s %s: version %llu -> %llu (build %.1f ms%s, stage %.2f ms, "
                 "commit %.2f ms)",
                 s.origin, kind_name(s.kind), (unsigned long long)s.old_version,
                 (unsigned long long)s.new_version, s.build_ms, s.cache_hit ? " cached" : "",
                 s.stage_ms, s.commit_ms);
        if (s.message[0])
            demo_say(d, "   %s", s.message);
    }

    pthread_mutex_lock(&d->mu);
    if (d->nswaps == d->cap_swaps) {
        int cap = d->cap_swaps ? 2 * d->cap_swaps : 16;
        demo_swap *grown = realloc(d->swaps, (size_t)cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&d->mu);
            free(s.log);
            return;
        }
        d->swaps = grown;
        d->cap_swaps = cap;
    }
    d->swaps[d->nswaps++] = s;
    if (ev->kind != HK_EVENT_REFUSED)
        atomic_store(&d->version, ev->new_version);
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->mu);
}

int demo_swap_count(demo *d) {
    pthread_mutex_lock(&d->mu);
    int n = d->nswaps;
    pthread_mutex_unlock(&d->mu);
    return n;
}

static void deadline(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int demo_wait_swap(demo *d, int first, unsigned mask, int timeout_ms) {
    struct timespec ts;
    int found = -1;

    deadline(&ts, timeout_ms);
    pthread_mutex_lock(&d->mu);
    for (;;) {
        for (int i = first; i < d->nswaps && found < 0; i++)
            if (mask & (1u << d->swaps[i].kind))
                found = i;
        if (found >= 0 || atomic_load(&d->stop))
            break;
        if (pthread_cond_timedwait(&d->cond, &d->mu, &ts))
            break;
    }
    pthread_mutex_unlock(&d->mu);
    return found;
}

int demo_sleep(demo *d, int ms) {
    struct timespec ts;

    deadline(&ts, ms);
    pthread_mutex_lock(&d->mu);
    while (!atomic_load(&d->stop) && !pthread_cond_timedwait(&d->cond, &d->mu, &ts)) {
    }
    pthread_mutex_unlock(&d->mu);
    return atomic_load(&d->stop) ? -1 : 0;
}

void demo_request_stop(demo *d) {
    pthread_mutex_lock(&d->mu);
    atomic_store(&d->stop, 1);
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->mu);
}

int demo_request_frame(demo *d, const char *label, int picture, int timeout_ms) {
    struct timespec ts;
    int idx;

    deadline(&ts, timeout_ms);
    pthread_mutex_lock(&d->mu);
    snprintf(d->frame_label, sizeof d->frame_label, "%s", label);
    d->frame_wanted = picture ? 2 : 1;
    d->frame_done = -1;
    while (d->frame_wanted && !atomic_load(&d->stop))
        if (pthread_cond_timedwait(&d->cond, &d->mu, &ts))
            break;
    idx = d->frame_wanted ? -1 : d->frame_done;
    d->frame_wanted = 0;
    pthread_mutex_unlock(&d->mu);
    return idx;
}

/* ---- the simulation thread's records ------------------------------------ */

void demo_log_tick(demo *d, double start_ms, double ms) {
    if (d->ntick_log == d->cap_tick_log) {
        size_t cap = d->cap_tick_log ? 2 * d->cap_tick_log : 4096;
        demo_tick *grown;
        if (cap > DEMO_MAX_TICKS)
            return; /* The summary covers the first hours; that is enough. */
        grown = realloc(d->tick_log, cap * sizeof *grown);
        if (!grown)
            return;
        d->tick_log = grown;
        d->cap_tick_log = cap;
    }
    d->tick_log[d->ntick_log++] = (demo_tick){start_ms, ms};
}

/* FNV-1a over positions quantised to 2^-20 of the box: a display value that
 * changes when any particle moves visibly and is the same for the same state. */
uint32_t demo_checksum(const float *p, int n) {
    uint64_t h = 1469598103934665603ull;

    for (int i = 0; i < n; i++) {
        int32_t q[2] = {(int32_t)lrintf(p[4 * i] * 1048576.0f),
                        (int32_t)lrintf(p[4 * i + 1] * 1048576.0f)};
        const unsigned char *b = (const unsigned char *)q;
        for (size_t j = 0; j < sizeof q; j++) {
            h ^= b[j];
            h *= 1099511628211ull;
        }
    }
    return (uint32_t)(h ^ (h >> 32));
}

int demo_add_frame(demo *d, const char *label, int picture, const float *p, int n,
                   uint32_t checksum, uint64_t version, int have_steps, uint64_t steps) {
    demo_frame *f;
    int idx;

    pthread_mutex_lock(&d->mu);
    if (d->nframes == DEMO_MAX_FRAMES) {
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    idx = d->nframes++;
    f = &d->frames[idx];
    pthread_mutex_unlock(&d->mu);

    /* The slot is ours alone until the index is handed out below. */
    memset(f, 0, sizeof *f);
    snprintf(f->label, sizeof f->label, "%s", label);
    f->t_ms = demo_now_ms(d);
    f->tick = atomic_load(&d->ticks);
    f->version = version;
    f->steps = steps;
    f->have_steps = have_steps;
    f->checksum = checksum;
    f->picture = picture;
    /* A stride that is odd visits every particle of a power-of-two count
     * once, so the sample spreads over the whole grid rather than a stripe. */
    f->npts = n < DEMO_SAMPLE ? n : DEMO_SAMPLE;
    for (int j = 0; j < f->npts; j++) {
        int i = (int)(((long long)j * 7919) % n);
        f->pts[2 * j] = p[4 * i];
        f->pts[2 * j + 1] = p[4 * i + 1];
        f->hue[j] = (float)i / (float)n;
    }
    return idx;
}

void demo_note_commit(demo *d, int first, uint32_t before, uint32_t after) {
    pthread_mutex_lock(&d->mu);
    for (int i = first; i < d->nswaps; i++) {
        demo_swap *s = &d->swaps[i];
        if (s->kind == HK_EVENT_REFUSED || !s->at_safe_point || s->buffer_checked)
            continue;
        s->buffer_checked = 1;
        s->sum_before = before;
        s->sum_after = after;
    }
    pthread_mutex_unlock(&d->mu);
}

/* ---- summary ------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Longest tick that started within half a second of t_ms. */
static double worst_tick_near(const demo *d, double t_ms) {
    double worst = 0;
    for (size_t i = 0; i < d->ntick_log; i++) {
        const demo_tick *k = &d->tick_log[i];
        if (k->start_ms >= t_ms - 500 && k->start_ms <= t_ms + 500 && k->ms > worst)
            worst = k->ms;
    }
    return worst;
}

static void summary_swaps(demo *d, double median) {
    demo_say(d, "  #  source               outcome      version   build ms  stage ms  commit ms"
                "  worst tick +-0.5 s");
    for (int i = 0; i < d->nswaps; i++) {
        const demo_swap *s = &d->swaps[i];
        char ver[32], build[24], stage[16], commit[16], worst[48];
        if (s->kind == HK_EVENT_REFUSED)
            snprintf(ver, sizeof ver, "%llu", (unsigned long long)s->old_version);
        else
            snprintf(ver, sizeof ver, "%llu -> %llu", (unsigned long long)s->old_version,
                     (unsigned long long)s->new_version);
        snprintf(build, sizeof build, "%.1f%s", s->build_ms, s->cache_hit ? " (c)" : "");
        snprintf(stage, sizeof stage, "%.2f", s->stage_ms);
        snprintf(commit, sizeof commit, "%.2f", s->commit_ms);
        if (s->kind == HK_EVENT_REFUSED && s->stage_ms == 0) {
            snprintf(stage, sizeof stage, "-");
            snprintf(commit, sizeof commit, "-");
        }
        if (s->old_version == 0 && s->kind == HK_EVENT_COMMITTED) {
            snprintf(worst, sizeof worst, "(first load)");
        } else {
            double w = worst_tick_near(d, s->t_ms);
            snprintf(worst, sizeof worst, "%.2f ms (%.1fx median)", w,
                     median > 0 ? w / median : 0.0);
        }
        demo_say(d, "  %-2d %-20.20s %-12s %-9s %9s %9s %10s  %s", i + 1, s->origin,
                 kind_name(s->kind), ver, build, stage, commit, worst);
    }
}

static void summary_state(demo *d) {
    int ok_steps = 1, monotonic = 1, checked = 0, identical = 0, have = 0;
    uint64_t last_steps = 0;

    if (d->tour && d->nsteps) {
        demo_say(d, "%s", "");
        demo_say(d, "State around each step (just before it -> about two seconds after it):");
        demo_say(d, "  step                      version   tick           steps on device    "
                    "checksum");
        for (int i = 0; i < d->nsteps; i++) {
            const demo_tour_step *t = &d->steps[i];
            if (t->before < 0 || t->after < 0) {
                demo_say(d, "  %-25s (no frames: the step did not complete)", t->what);
                continue;
            }
            const demo_frame *a = &d->frames[t->before], *b = &d->frames[t->after];
            char ver[32], tick[32], steps[40];
            snprintf(ver, sizeof ver, "%llu -> %llu", (unsigned long long)a->version,
                     (unsigned long long)b->version);
            snprintf(tick, sizeof tick, "%llu -> %llu", (unsigned long long)a->tick,
                     (unsigned long long)b->tick);
            if (a->have_steps && b->have_steps)
                snprintf(steps, sizeof steps, "%llu -> %llu", (unsigned long long)a->steps,
                         (unsigned long long)b->steps);
            else
                snprintf(steps, sizeof steps, "-");
            demo_say(d, "  %-25s %-9s %-14s %-18s %08x -> %08x", t->what, ver, tick, steps,
                     a->checksum, b->checksum);
        }
    }

    /* Frames are in time order: the counter must grow and match the ticks. */
    for (int i = 0; i < d->nframes; i++) {
        const demo_frame *f = &d->frames[i];
        if (!f->have_steps)
            continue;
        if (have && f->steps < last_steps)
            monotonic = 0;
        if (f->steps != f->tick)
            ok_steps = 0;
        last_steps = f->steps;
        have++;
    }
    for (int i = 0; i < d->nswaps; i++) {
        if (!d->swaps[i].buffer_checked)
            continue;
        checked++;
        identical += d->swaps[i].sum_before == d->swaps[i].sum_after;
    }
    demo_say(d, "%s", "");
    if (have >= 2)
        demo_say(d,
                 "  __device__ steps kept counting across the swaps: %s; equal to the ticks "
                 "launched at every frame: %s (%d frames)",
                 monotonic ? "yes" : "NO", ok_steps ? "yes" : "no", have);
    else
        demo_say(d, "  __device__ steps: too few frames to compare");
    if (checked)
        demo_say(d,
                 "  state buffer bit-identical across each commit made at a safe point: %d of "
                 "%d (the checksum changes only when step runs)",
                 identical, checked);
}

void demo_summary(demo *d) {
    double median = 0, worst = 0, avg = 0;
    size_t n = d->ntick_log;

    /* Late outcomes (a watched file saved just now) may still arrive. */
    pthread_mutex_lock(&d->mu);
    if (n) {
        double *ms = malloc(n * sizeof *ms);
        if (ms) {
            for (size_t i = 0; i < n; i++) {
                ms[i] = d->tick_log[i].ms;
                avg += ms[i];
            }
            qsort(ms, n, sizeof *ms, cmp_double);
            median = ms[n / 2];
            worst = ms[n - 1];
            avg /= (double)n;
            free(ms);
        }
    }
    demo_say(d, "%s", "");
    demo_say(d, "Summary");
    if (n) {
        double span = (d->tick_log[n - 1].start_ms - d->tick_log[0].start_ms) / 1000.0;
        demo_say(d,
                 "  %zu ticks in %.1f s (%.1f ticks/s, target %d); tick time median %.2f ms, mean "
                 "%.2f ms, worst %.2f ms (budget %.1f ms)",
                 n, span, span > 0 ? (double)(n - 1) / span : 0.0, d->hz, median, avg, worst,
                 1000.0 / d->hz);
    }
    if (d->nswaps) {
        demo_say(d, "%s", "");
        summary_swaps(d, median);
        demo_say(d, "  (c) = build served from the compile cache; stage and commit ran at a "
                    "safe point for watched files and pushes, on the endpoint's thread for "
                    "rollbacks");
    } else {
        demo_say(d, "  no swaps happened");
    }
    summary_state(d);
    demo_say(d, "  old versions unloaded while running: %llu", (unsigned long long)d->reclaimed);
    pthread_mutex_unlock(&d->mu);
}

/* ---- the picture --------------------------------------------------------- */

static void html_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else
            fputc(*s, f);
    }
}

static void svg_frame(FILE *f, const demo_frame *fr) {
    enum { SIZE = 320, BANDS = 12 };

    fprintf(f,
            "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\">\n",
            SIZE, SIZE, SIZE, SIZE);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"#10131a\"/>\n", SIZE, SIZE);
    /* One group per colour band keeps the file small: the colour is the
     * particle's starting height, so the picture shows how layers mix. */
    for (int b = 0; b < BANDS; b++) {
        fprintf(f, "<g fill=\"hsl(%d,80%%,60%%)\">", 360 * b / BANDS);
        for (int j = 0; j < fr->npts; j++) {
            int band = (int)(fr->hue[j] * BANDS);
            if (band >= BANDS)
                band = BANDS - 1;
            if (band != b)
                continue;
            float x = fr->pts[2 * j], y = fr->pts[2 * j + 1];
            if (!isfinite(x) || !isfinite(y))
                continue;
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"1.3\"/>", x * SIZE, (1.0f - y) * SIZE);
        }
        fputs("</g>\n", f);
    }
    fputs("</svg><figcaption>", f);
    html_escape(f, fr->label);
    fprintf(f, "<br>version %llu, tick %llu, t = %.1f s<br>checksum %08x",
            (unsigned long long)fr->version, (unsigned long long)fr->tick, fr->t_ms / 1000.0,
            fr->checksum);
    if (fr->have_steps)
        fprintf(f, ", steps %llu", (unsigned long long)fr->steps);
    fputs("</figcaption></figure>\n", f);
}

int demo_write_html(demo *d, const char *path, const char *title) {
    FILE *f = fopen(path, "w");
    int n = 0;

    if (!f)
        return -1;
    pthread_mutex_lock(&d->mu);
    fputs("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>", f);
    html_escape(f, title);
    fputs("</title>\n<style>body{font-family:sans-serif;background:#f4f4f4;margin:2em}"
          "figure{display:inline-block;margin:0 1em 1em 0;vertical-align:top}"
          "figcaption{font-size:90%;max-width:320px}</style></head><body>\n<h1>",
          f);
    html_escape(f, title);
    fprintf(f,
            "</h1>\n<p>%d of the particles, drawn as the simulation thread saw them; "
            "colour marks each particle's starting height.</p>\n",
            DEMO_SAMPLE);
    for (int i = 0; i < d->nframes; i++) {
        if (!d->frames[i].picture)
            continue;
        svg_frame(f, &d->frames[i]);
        n++;
    }
    pthread_mutex_unlock(&d->mu);
    fputs("</body></html>\n", f);
    return fclose(f) == 0 && n ? 0 : -1;
}

/*
 * hotkern-demo: what the demo's files share.
 *
 * The demo is a small game-server-like program: a fixed-rate tick loop steps
 * a particle simulation on the GPU through a hotkern kernel handle, while new
 * versions of the kernel arrive from a watched directory and over HTTP.
 *
 * Threads. The simulation thread (main) owns every CUDA object and is the only
 * one that calls hk_launch and hk_safe_point. Swap outcomes arrive on other
 * threads too (the runtime's worker, the endpoint's), so what they record goes
 * through demo.mu. The tour runs on a thread of its own and only hands work to
 * the others: it renames files, runs the CLI and asks the simulation thread
 * for frames; it never touches CUDA.
 *
 * Files: main.c runs the simulation; record.c keeps what happened and prints
 * it (status line, summary, HTML picture); tour.c drives the unattended tour;
 * validate.c is the path for machines without a GPU.
 */
#ifndef HK_DEMO_H
#define HK_DEMO_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "hotkern/hotkern.h"

#define DEMO_MODULE      "particles"
#define DEMO_KERNEL      "step"
#define DEMO_SAMPLE      2048 /* particles drawn in each picture */
#define DEMO_MAX_FRAMES  16
#define DEMO_LABEL       96
#define DEMO_TOUR_STEPS  4
#define DEMO_EXIT_NO_GPU 3
/* Directories given or made; paths derived from them fit in PATH_MAX. */
#define DEMO_DIR 2048

/* One picture of the state, taken by the simulation thread between ticks. */
typedef struct demo_frame {
    char label[DEMO_LABEL];
    double t_ms;       /* since start */
    uint64_t tick;     /* ticks completed (= launches of step) */
    uint64_t version;  /* module version current when it was taken */
    uint64_t steps;    /* the kernel's __device__ counter */
    int have_steps;    /* 0 when the running version has no `steps` */
    uint32_t checksum; /* of every particle's quantised position */
    int picture;       /* 1: drawn in the HTML file */
    int npts;
    float pts[2 * DEMO_SAMPLE]; /* x, y of the sampled particles */
    float hue[DEMO_SAMPLE];     /* colour: the particle's starting height */
} demo_frame;

/* One swap outcome, as the event callback saw it. */
typedef struct demo_swap {
    hk_event_kind kind;
    char origin[96]; /* short: "watch particles.cu", "push", "rollback" */
    uint64_t old_version, new_version;
    int error;
    char message[512];
    char *log; /* compiler log of a refusal, owned */
    double build_ms, stage_ms, commit_ms;
    int cache_hit;
    double t_ms;       /* since start */
    uint64_t tick;     /* ticks completed when it happened */
    int at_safe_point; /* performed on the simulation thread */
    /* Set by the simulation thread for commits made in its safe point: the
     * checksum of the state just before and just after the commit. */
    int buffer_checked;
    uint32_t sum_before, sum_after;
} demo_swap;

/* One step of the tour, for the summary. Written by the tour thread, read by
 * the simulation thread after joining it. */
typedef struct demo_tour_step {
    const char *what;
    int swap;   /* index into swaps, -1 when no outcome arrived */
    int before; /* frame indices, -1 when missing */
    int after;
    int cli_status; /* exit status of the CLI, -1 when not run */
} demo_tour_step;

typedef struct demo_tick {
    double start_ms; /* since start */
    double ms;       /* launch, synchronise, read back, safe point */
} demo_tick;

typedef struct demo {
    /* Immutable once the simulation starts. */
    hk_runtime *rt;
    pthread_t sim_thread; /* the thread that calls hk_safe_point */
    double t0;            /* CLOCK_MONOTONIC ms at start */
    int tour;
    int tty;
    int hz;
    char out[DEMO_DIR];       /* output directory */
    char cli[PATH_MAX];       /* the hotkern CLI */
    char key[PATH_MAX];       /* secret key the tour signs pushes with */
    char url[64];             /* push endpoint, "" when none */
    char kernels[DEMO_DIR];   /* the kernel sources given (never written by the tour) */
    char watched[DEMO_DIR];   /* the directory hotkern watches */
    char stage_dir[DEMO_DIR]; /* tour: where files are written before rename */

    atomic_int stop;
    atomic_ullong ticks;   /* ticks completed */
    atomic_ullong version; /* module version, as the events report it */

    pthread_mutex_t mu;
    pthread_cond_t cond; /* CLOCK_MONOTONIC; broadcast on every change below */
    /* All below: mu. */
    demo_swap *swaps;
    int nswaps, cap_swaps;
    uint64_t reclaimed;
    demo_frame *frames; /* DEMO_MAX_FRAMES */
    int nframes;
    int frame_wanted; /* the tour asks for a frame ... */
    char frame_label[DEMO_LABEL];
    int frame_done; /* ... and gets its index here (-1: none) */

    /* Tour thread until joined. */
    demo_tour_step steps[DEMO_TOUR_STEPS];
    int nsteps;

    /* Simulation thread only. */
    demo_tick *tick_log;
    size_t ntick_log, cap_tick_log;
} demo;

/* ---- record.c ---------------------------------------------------------- */

int demo_init(demo *d);
void demo_fini(demo *d);
double demo_mono_ms(void);
double demo_now_ms(const demo *d);

/* Messages and the status line; safe from any thread. A message clears the
 * status line on a terminal; demo_status rewrites it in place there and
 * prints it as a line of its own elsewhere. */
void demo_say(demo *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void demo_status(demo *d, const char *line);
void demo_status_done(demo *d);

/* hk_options.on_event: records swap outcomes and prints them. */
void demo_on_event(const hk_event *ev, void *userdata);

int demo_swap_count(demo *d);
/* Waits for a swap outcome with index >= first whose kind is in mask
 * (1 << HK_EVENT_...). Returns its index, or -1 after timeout_ms or a stop. */
int demo_wait_swap(demo *d, int first, unsigned mask, int timeout_ms);
/* Sleeps ms, or less when the demo stops: returns -1 then, else 0. */
int demo_sleep(demo *d, int ms);
void demo_request_stop(demo *d);
/* Asks the simulation thread for a frame; returns its index or -1. */
int demo_request_frame(demo *d, const char *label, int picture, int timeout_ms);

/* Simulation thread: the tick log and the state's checksum. */
void demo_log_tick(demo *d, double start_ms, double ms);
uint32_t demo_checksum(const float *p, int n);
/* Stores a frame of the state p (n particles) and returns its index, or -1
 * when the frame table is full. mu must not be held. */
int demo_add_frame(demo *d, const char *label, int picture, const float *p, int n,
                   uint32_t checksum, uint64_t version, int have_steps, uint64_t steps);
/* Notes, for the swaps recorded from index first on that committed in this
 * thread's safe point, the checksums around the commit. */
void demo_note_commit(demo *d, int first, uint32_t before, uint32_t after);

/* Prints the table of swaps and the state checks. */
void demo_summary(demo *d);
/* Writes the frames marked as pictures as an HTML page of inline SVG. */
int demo_write_html(demo *d, const char *path, const char *title);

/* ---- tour.c ------------------------------------------------------------ */

/* Starts the tour thread; it asks for a stop when it is done. */
int demo_tour_start(demo *d, pthread_t *thread);
/* Runs the CLI with argv (argv[0] is replaced by d->cli), prints its output
 * indented and returns its exit status, or -1 when it could not run. */
int demo_run_cli(demo *d, const char *const *argv, int timeout_ms);
/* Copies the regular files of src (not sub-directories) into dst. */
int demo_copy_files(const char *src, const char *dst);
void demo_remove_tree(const char *path);

/* ---- validate.c -------------------------------------------------------- */

/* Builds every kernel source in dir and dir/variants for sm_90 without a GPU
 * and prints the outcome of each. Returns DEMO_EXIT_NO_GPU when every file
 * behaved as expected, 1 otherwise. */
int demo_validate(const char *dir, const char *cache_dir);

#endif /* HK_DEMO_H */

/*
 * Shared pieces of the benchmarks: clocks, statistics, the machine banner,
 * kernels built at run time, and direct driver access for baselines.
 * Benchmarks are programs, not tests: they print numbers and ratios against a
 * baseline measured in the same run, and assert nothing about speed.
 */
#ifndef HK_BENCH_COMMON_H
#define HK_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "base/driver.h"
#include "ptx/ptx.h"

extern hkb_driver bd; /* the real driver, for baselines */

/* Opens the driver (exits 77 with a SKIP line when there is none), makes the
 * primary context of device 0 current, and prints the machine banner. */
void bench_init(const char *name);

uint64_t bench_ns(void);
double bench_median(double *v, int n);        /* sorts v */
double bench_pct(double *v, int n, double p); /* v sorted; p in [0,100] */

/* Builds CUDA C for the device's arch: cubin (to_cubin) or PTX. Exits on error. */
void *bench_build(const char *src, int to_cubin, size_t *size);
int bench_arch(void);

/* "extern C" sources. */
extern const char *bench_src_small; /* 5 small kernels: k0..k4(float*, int) */
/* printf formats of one int: the same code with a constant that changes
 * from variant to variant, for compile benchmarks (an edit of the code,
 * never of a comment, which NVRTC compiles several times faster). */
extern const char *bench_fmt_tiny;  /* k0 alone (one line), its "+ 1.0f" varies */
extern const char *bench_fmt_small; /* bench_src_small, k0's "+ 1.0f" varies */
extern const char *bench_fmt_cub;   /* a cub::BlockReduce + cuda::std kernel k0(float*, int) */
/* bench_fmt_* with the constant v; malloc'd. */
char *bench_variant(const char *fmt, int v);
extern const char *bench_src_empty; /* empty(), spin(long long cycles) */

/* The one-line kernel of the save benchmarks: k0(int *out, int n) stores
 * the constant in out[i], so a launch tells which content runs. */
extern const char *bench_fmt_store;

/* The CPU's banner: "HOST, MODEL, N CPUs online, load L, DATE" into buf. */
void bench_cpu_line(char *buf, size_t n);

/* Milliseconds hkp_build takes for src (CUDA C) with o; exits on failure. */
double bench_build_ms(const char *src, const hkp_build_opts *o);

/* Writes text to path (exits on failure). */
void bench_write_file(const char *path, const char *text);
/* A watched module for the save benchmarks: DIR = ROOT/MODULE made, with
 * MODULE.cu holding text, watched by rt with the development profile (dev)
 * or the default one. dir and path (each PATH_MAX) receive the two; exits on
 * failure. */
hk_watch *bench_watch_module(hk_runtime *rt, const char *root, const char *module, int dev,
                             const char *text, char *dir, char *path);
/* Saves text as module's file: renamed over it from a temporary file in dir
 * (rename_over) or written in place. Returns bench_ns() read just before the
 * save's last system call (the rename, or the close that ends the write), so
 * that a measurement from it never starts late. */
uint64_t bench_save_file(const char *dir, const char *module, const char *path, const char *text,
                         int rename_over);

/* cuCtxSynchronize of the calling thread's current context. */
void bench_ctx_sync(void);

/* The built hotkern-canary beside this benchmark: BUILD/bin/hotkern-canary. */
void bench_canary_helper(char *out, size_t n);

/* SM clock in Hz, for turning milliseconds into spin cycles. */
double bench_sm_hz(void);

#endif

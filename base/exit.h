/*
 * The process's exit, as hotkern sees it (base/exit.c): once a program
 * returns from main or calls exit, nothing of hotkern's may run NVRTC or
 * call the driver, since the exit handlers of the CUDA runtime, NVRTC and
 * the driver tear down what such a call would use. Prefix hkb_.
 */
#ifndef HK_BASE_EXIT_H
#define HK_BASE_EXIT_H

/* Registers the exit guard with the C library (on_exit), so that it runs
 * before every exit handler registered earlier: the CUDA runtime's, and the
 * destructors of libnvrtc and libcuda. Each call registers it again (the
 * guard runs once, at the latest registration): call it when a runtime is
 * made, and again after what may have registered exit handlers of its own
 * (a process's first in-process NVRTC compile). wait_ms bounds how long
 * the guard waits for sections in progress (the largest given counts). */
void hkb_exit_guard(int wait_ms);

/* Registers the guard again after one of the process's first in-process
 * compiles (the first few: NVRTC loads what registers exit handlers at its
 * first compiles), where hkb_exit_guard was called before; else nothing. */
void hkb_exit_rearm(void);

/* A section of driver or NVRTC work: 1 when it may begin (end it with
 * hkb_exit_leave), 0 when the process is exiting (nothing may begin). */
int hkb_exit_enter(void);
void hkb_exit_leave(void);

/* 1 once the guard has run (the process is exiting). */
int hkb_exiting(void);

/* For a thread of hotkern's own that found the process exiting, with no
 * lock held: it stays here until the process ends. */
_Noreturn void hkb_exit_park(void);

#endif

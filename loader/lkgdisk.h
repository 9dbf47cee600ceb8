/*
 * loader/lkgdisk.h: the last-known-good state, shared by the two files that
 * keep it and by them only: lkg.c (what the records say: commits,
 * promotion, quarantine, queries) and lkgdisk.c (the state directory: its
 * files, their writers, collection). Every other file uses the hkl_lkg_*
 * functions of loader/lkg.h.
 *
 * lkg_lock (`lock` below) is these two files' alone; it is held for memory
 * work only, never across a file write (see the top of lkg.c). The module
 * entries are never freed before close, so a pointer to one taken under
 * lkg_lock stays valid after it is released.
 */
#ifndef HK_LOADER_LKGDISK_H
#define HK_LOADER_LKGDISK_H

#include <string.h>

#include "loader/core.h"
#include "loader/lkg.h"
#include "loader/record.h"

#define HKL_LKG_NRECENT 16

/* A commit of this process, for the suspect window. */
typedef struct lkg_recent {
    uint8_t hash[32];
    double t;
    uint64_t release, version;
} lkg_recent;

typedef struct lkg_mod {
    /* all lkg_lock, but for wlock and the name in rec (immutable) */
    hkl_rec rec;       /* what goes to disk: current, good (+ its expressions), quarantine */
    uint64_t gen;      /* bumped by every change of rec */
    uint64_t disk_gen; /* the gen the record file holds; set under wlock too */
    hkl_rec_image disk_cur, disk_good; /* the images the record file names */
    hkl_rec_image fly_cur, fly_good;   /* those a record write in progress names */
    pthread_mutex_t wlock;             /* the record file: one writer at a time */
    int qdue;                          /* a loss quarantined in it: written before the event */
    int pdue;                          /* a loss promoted in it: likewise, unless its
                                        * record is being written already */
    int ncur;                          /* name expressions of the current image */
    char **cur_expr, **cur_lowered;
    double cur_t; /* when current was committed here; < 0: by an earlier process */
    lkg_recent recent[HKL_LKG_NRECENT]; /* this process's commits, newest last */
    int nrecent;
    struct lkg_mod *next; /* sorted by name */
} lkg_mod;

/* A committed image not on disk yet: a copy, written before any record
 * naming it (lkg_lock; written by the img_lock holder, which sets busy). */
typedef struct lkg_img {
    uint8_t hash[32];
    void *data;
    size_t size;
    int busy; /* being written: only the writer frees it */
    struct lkg_img *next;
} lkg_img;

/* A record refused at open, and every image hash its text mentions: those
 * images stay until a record of the same file name replaces it (lkg_lock). */
typedef struct lkg_refusal {
    char fname[HKL_NAME_MAX * 3 + 8];
    int nh;
    uint8_t (*h)[32];
    struct lkg_refusal *next;
} lkg_refusal;

struct hkl_lkg {
    /* immutable after open */
    char *dir;                         /* NULL: memory only */
    int dfd, img_fd, mod_fd;           /* DIR, DIR/images, DIR/modules; -1 */
    char img_dir[4200], mod_dir[4200]; /* their paths, for messages */
    double window;
    double (*now)(void);

    pthread_mutex_t lock;     /* lkg_lock */
    pthread_mutex_t img_lock; /* writers only: image writes and collection */
    pthread_cond_t idle;      /* lkg_lock: signalled when writers drops to 0 */
    lkg_mod *mods;            /* lkg_lock; never freed before close */
    lkg_img *unwritten;       /* lkg_lock */
    lkg_refusal *refusals;    /* lkg_lock */
    char refused[1024];       /* lkg_lock: records refused at open, for the report */
    int lockfd;               /* lkg_lock: DIR/lock, flock'd; -1 once let go */
    int writers;              /* lkg_lock: disk operations in progress */
    int released;             /* lkg_lock: the directory was let go: nothing more is written */
    int holds;                /* lkg_lock: destroy's hkl_lkg_hold: close waits for it */
    _Atomic int lost;         /* set once, by the first sticky error */
    int frozen;               /* lkg_lock: the loss is recorded; nothing is
                               * promoted any more */
};

/* Whether im names image h. */
static inline int hkl_lkg_same_image(const hkl_rec_image *im, const uint8_t h[32]) {
    return im->has && !memcmp(im->hash, h, 32);
}

/* lkgdisk.c, for lkg.c. lkg_lock held for the module and queue functions
 * (mod_new: none, the entry is not shared yet); none for the others, which
 * take the locks they need (see "Writes" in lkgdisk.c).
 * - hkl_lkg_mod_new / _free / _find / _insert: one module's entry, made
 *   empty, freed, found by name, inserted in name order.
 * - hkl_lkg_unwritten_find / _remove / _prune: the queue of committed
 *   images not on disk yet; prune drops those nothing names any more.
 * - hkl_lkg_write_mod writes m's record as it is now, after the images it
 *   names (with nowait, giving up when another writer has it);
 *   hkl_lkg_write_due writes the records a loss made due or, with all,
 *   every record behind memory; hkl_lkg_collect removes the images nothing
 *   needs.
 * - hkl_lkg_disk_open opens, checks and locks the directory (l->dir set)
 *   and reads its records; 0 or the error, rep saying why. hkl_lkg_let_go
 *   lets it go: nothing is written from then on, and the flock goes now
 *   or with the last write in progress. */
lkg_mod *hkl_lkg_mod_new(void);
void hkl_lkg_mod_free(lkg_mod *m);
lkg_mod *hkl_lkg_mod_find(hkl_lkg *l, const char *name);
void hkl_lkg_mod_insert(hkl_lkg *l, lkg_mod *m);
lkg_img *hkl_lkg_unwritten_find(const hkl_lkg *l, const uint8_t h[32]);
void hkl_lkg_unwritten_remove(hkl_lkg *l, lkg_img *e);
void hkl_lkg_unwritten_prune(hkl_lkg *l);
void hkl_lkg_write_mod(hk_runtime *rt, lkg_mod *m, int nowait);
void hkl_lkg_write_due(hk_runtime *rt, int all, int nowait);
void hkl_lkg_collect(hk_runtime *rt);
int hkl_lkg_disk_open(hk_runtime *rt, hk_report *rep);
void hkl_lkg_let_go(hkl_lkg *l);

#endif /* HK_LOADER_LKGDISK_H */

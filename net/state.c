/*
 * The anti-rollback state: the newest release version accepted per module.
 *
 * One record per module, shared by every source that names the same state
 * directory: the push endpoint, the puller and the `hotkern pull` verb. A
 * release older than (or equal to) the record is refused whichever door it
 * comes through, so a push of v5 cannot be undone by an origin still serving
 * v3.
 *
 * On disk: DIR/accepted.json, {"format": 1, "modules": {"name": version}},
 * replaced atomically (temp file, fsync, rename, fsync of the directory).
 * Beside it, DIR/keys.json: the key list accepted last (net/keys.c), its
 * signed text as received, under the same locks and the same rules (a
 * write re-reads it and refuses a version not above the recorded one).
 *
 * Several processes on one directory. Every read and every write takes an
 * flock on the directory itself (shared to read, exclusive to write) and
 * re-reads the file, and a write merges: it raises one module's record and
 * keeps every other record as the file has it now. So two programs that
 * share a directory never erase each other's records, and each sees the
 * other's acceptances at its next check. The version check and the record
 * are two steps, so an acceptance that finds a record at or above its
 * version (another process accepted a newer release in between) refuses
 * with HK_ERR_REPLAY: the slower process must not commit the older release
 * after the newer one. Locking the directory rather than a
 * lock file keeps the directory's contents to the one file. Temp files left
 * by a crash (accepted.json.tmp.*) are removed under the exclusive lock,
 * when nobody can be writing one.
 *
 * Locks: registry_lock (the list of open states) before hkn_state.lock; txn
 * before lock. The flock is only ever taken with lock held.
 *
 * Within one process, failing closed, persisting first, trusting the
 * directory and bounding waits: beside the code that does each.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "net/net.h"

#define HKN_MAX_JSON_INT  9007199254740991.0
#define STATE_MAX_BYTES   (16 << 20)
#define STATE_FILE        "accepted.json"
#define HKN_STATE_LOCK_MS 2000

struct hkn_state {
    /* Immutable after open. */
    char *dir;  /* NULL: memory only */
    char *path; /* dir/accepted.json */
    int dirfd;  /* the checked directory: the file is reached through it, and
                 * it is what is flock'd; -1 in memory */

    pthread_mutex_t txn; /* held by a source across check -> commit -> record */

    pthread_mutex_t lock; /* guards what follows, and the file within the process */
    cJSON *modules;       /* lock: memory only; with a file, the last state read */
    char *keys;           /* lock: the accepted key list's text, memory only */
    size_t keys_len;

    /* registry_lock */
    int refs;
    struct hkn_state *next;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static hkn_state *registry; /* registry_lock: states with a directory */

/* ---- reading and validating -------------------------------------------- */

/*
 * Fail closed. A record that is not an integer in [1, 2^53) (a string,
 * null, a negative or fractional number, 1e300), a duplicate module, an
 * invalid module name, or text after the JSON refuses the state: at open the
 * source does not start, later every check refuses, and the message names
 * the file and the entry. Forgetting a record would reopen every older
 * release of that module.
 */
/* Checks and returns the modules object of a parsed state file; NULL with
 * the reason in rep. */
static cJSON *validate(const char *path, cJSON *root, hk_report *rep) {
    cJSON *mods = cJSON_GetObjectItemCaseSensitive(root, "modules");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(mods)) {
        hku_fail(rep, HK_ERR_IO, "%s is corrupt (no \"modules\" object): fix or remove it", path);
        return NULL;
    }
    for (const cJSON *m = mods->child; m; m = m->next) {
        const char *name = m->string ? m->string : "";
        if (!hkn_valid_name(name, 64)) {
            hku_fail(rep, HK_ERR_IO,
                     "%s is corrupt: '%.64s' is not a module name: fix or remove the entry", path,
                     name);
            return NULL;
        }
        double d = cJSON_IsNumber(m) ? m->valuedouble : NAN;
        if (!(d >= 1) || d > HKN_MAX_JSON_INT || floor(d) != d) {
            hku_fail(rep, HK_ERR_IO,
                     "%s is corrupt: module '%s' has no version in [1, 2^53) (releases of it "
                     "are refused until the entry is fixed or removed)",
                     path, name);
            return NULL;
        }
        for (const cJSON *o = mods->child; o != m; o = o->next)
            if (!strcmp(o->string, name)) {
                hku_fail(rep, HK_ERR_IO, "%s is corrupt: module '%s' appears twice: keep one entry",
                         path, name);
                return NULL;
            }
    }
    return mods;
}

/* Reads the file (the caller holds an flock); a missing file is empty. On
 * success *out is a detached modules object, the caller's to delete. */
static int read_state(hkn_state *s, cJSON **out, hk_report *rep) {
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    hk_report rrep = HK_REPORT_INIT;
    int err = hku_read_fileat(s->dirfd, s->dir, STATE_FILE, STATE_MAX_BYTES, &text, &len, &rrep);
    if (err == HK_ERR_NOT_FOUND) {
        *out = cJSON_CreateObject();
        return *out ? 0 : hku_fail(rep, HK_ERR_NOMEM, "out of memory");
    }
    if (err)
        return hku_fail(rep, err, "%s", rrep.message);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (root && !hkn_json_rest_blank(end, text + len)) {
        cJSON_Delete(root);
        root = NULL;
    }
    if (!root) {
        err = hku_fail(rep, HK_ERR_IO, "%s is corrupt (not one JSON object): fix or remove it",
                       s->path);
    } else if (validate(s->path, root, rep)) {
        *out = cJSON_DetachItemFromObjectCaseSensitive(root, "modules");
    } else {
        err = HK_ERR_IO;
    }
    cJSON_Delete(root);
    free(text);
    return err;
}

static uint64_t value_of(const cJSON *mods, const char *module) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(mods, module);
    return cJSON_IsNumber(v) ? (uint64_t)v->valuedouble : 0;
}

/*
 * Bounded waits. Another process holding the flock may have stopped
 * (SIGSTOP, a debugger): it is waited for HKN_STATE_LOCK_MS at most, then
 * the read or write fails closed (HK_ERR_BUSY), so no source hangs on it.
 * The bound is seconds, not milliseconds, because a holder fsyncs the file
 * and the directory under the exclusive lock.
 */
static int flock_or_fail(hkn_state *s, int how, hk_report *rep) {
    int err = hku_flock_wait(s->dirfd, how, HKN_STATE_LOCK_MS);
    if (err == HK_ERR_BUSY)
        return hku_fail(rep, err,
                        "anti-rollback state %s: its lock is held by another process for over %d "
                        "ms (stopped?): refused",
                        s->dir, HKN_STATE_LOCK_MS);
    if (err)
        return hku_fail(rep, HK_ERR_IO, "lock %s: %s", s->dir, strerror(errno));
    return 0;
}

/* Removes accepted.json.tmp.* files: called with the exclusive flock held,
 * when no process can be writing one. */
static void clean_temps(hkn_state *s) {
    int fd = openat(s->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "accepted.json.tmp.", 18) ||
            !strncmp(e->d_name, "keys.json.tmp.", 14))
            unlinkat(s->dirfd, e->d_name, 0);
    closedir(d);
}

/* ---- writing ----------------------------------------------------------- */

static int write_state(hkn_state *s, const cJSON *mods, hk_report *rep) {
    cJSON *root = cJSON_CreateObject(), *out_mods = NULL;
    int err = 0;
    char *text = NULL;
    if (!root || !cJSON_AddNumberToObject(root, "format", 1) ||
        !(out_mods = cJSON_AddObjectToObject(root, "modules"))) {
        err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
        goto out;
    }
    /* Versions printed exactly (see hkn_json_add_int). */
    for (const cJSON *m = mods->child; m; m = m->next)
        if (!hkn_json_add_int(out_mods, m->string, (long long)m->valuedouble)) {
            err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
            goto out;
        }
    if (!(text = cJSON_Print(root))) {
        err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
        goto out;
    }
    struct iovec iov = {.iov_base = text, .iov_len = strlen(text)};
    err = hku_write_atomicat(s->dirfd, s->dir, STATE_FILE, &iov, 1, 0600, 1, rep);
out:
    cJSON_Delete(root);
    free(text);
    return err;
}

static int set_value(cJSON *mods, const char *module, uint64_t v) {
    if (v == 0) {
        cJSON_DeleteItemFromObjectCaseSensitive(mods, module);
        return 0;
    }
    cJSON *num = cJSON_CreateNumber((double)v);
    if (!num)
        return HK_ERR_NOMEM;
    if (cJSON_GetObjectItemCaseSensitive(mods, module))
        cJSON_ReplaceItemInObjectCaseSensitive(mods, module, num);
    else
        cJSON_AddItemToObject(mods, module, num);
    return 0;
}

/* The refusal of an acceptance that finds the record at `cur` already: a
 * source of another process (or one that does not share this process's
 * transaction) accepted that release after this one's version check, and
 * committing the older release now would run it after the newer one. */
static int newer_recorded(const hkn_state *s, const char *module, uint64_t to, uint64_t cur,
                          hk_report *rep) {
    return hku_fail(rep, HK_ERR_REPLAY,
                    "release %s v%llu is no longer newer than the accepted v%llu: it was "
                    "recorded%s%s after this release's version check (another process on the "
                    "same state directory); nothing was applied",
                    module, (unsigned long long)to, (unsigned long long)cur, s->path ? " in " : "",
                    s->path ? s->path : "");
}

/* Read-modify-write under the exclusive flock: sets module to `to` when its
 * current record satisfies `cond` (1: below `to`, else HK_ERR_REPLAY; 2:
 * equal to `expect`, else nothing is written). */
static int update(hkn_state *s, const char *module, uint64_t to, int cond, uint64_t expect,
                  hk_report *rep) {
    int err = 0;
    cJSON *mods = NULL;
    pthread_mutex_lock(&s->lock);
    if (!s->dir) {
        uint64_t cur = value_of(s->modules, module);
        if (cond == 1 && to <= cur)
            err = newer_recorded(s, module, to, cur, rep);
        else if (cond == 1 || cur == expect)
            err = set_value(s->modules, module, to) ? hku_fail(rep, HK_ERR_NOMEM, "out of memory")
                                                    : 0;
        pthread_mutex_unlock(&s->lock);
        return err;
    }
    if ((err = flock_or_fail(s, LOCK_EX, rep)))
        goto out;
    if ((err = read_state(s, &mods, rep)))
        goto unlock;
    uint64_t cur = value_of(mods, module);
    if (cond == 1 && to <= cur) {
        err = newer_recorded(s, module, to, cur, rep);
    } else if (cond == 1 || cur == expect) {
        if (set_value(mods, module, to)) {
            err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
            goto unlock;
        }
        if ((err = write_state(s, mods, rep)))
            goto unlock;
    }
    cJSON_Delete(s->modules);
    s->modules = mods;
    mods = NULL;
unlock:
    flock(s->dirfd, LOCK_UN);
out:
    pthread_mutex_unlock(&s->lock);
    cJSON_Delete(mods);
    return err;
}

/* ---- public ------------------------------------------------------------ */

static void state_free(hkn_state *s) {
    if (!s)
        return;
    cJSON_Delete(s->modules);
    free(s->keys);
    if (s->dirfd >= 0)
        close(s->dirfd);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->txn);
    free(s->dir);
    free(s->path);
    free(s);
}

/*
 * Within one process, every source opened on the same directory shares one
 * hkn_state (a registry keyed by the directory's real path). Its `txn` mutex
 * is held by a source from the version check through the swap to the
 * record (hkn_state_begin/hkn_state_end), so a pull and a push in one
 * process cannot both pass the check and then commit out of order.
 *
 * Trust. Whoever can rename or rewrite accepted.json reopens every old
 * release, so the directory is used only if no other local user can change
 * it (util/util.h, "trusted directories": owner and mode of it and of every
 * directory above it), and the file is read and replaced through the
 * directory's descriptor with O_NOFOLLOW: a link in its place, a file of
 * another user or one others may write fails closed, naming the path.
 */
int hkn_state_open(const char *dir, hkn_state **out, hk_report *rep) {
    *out = NULL;
    int err = 0;
    char real[PATH_MAX];
    hkn_state *s = NULL;
    int dfd = -1;
    if (dir) {
        /* Checked (and made) first, even when this process has it open
         * already: a directory loosened since is refused from then on. */
        if ((dfd = hku_dir_open(dir, "anti-rollback state directory", 1, real, rep)) < 0)
            return dfd;
        pthread_mutex_lock(&registry_lock);
        for (s = registry; s; s = s->next)
            if (!strcmp(s->dir, real))
                break;
        if (s) {
            s->refs++;
            pthread_mutex_unlock(&registry_lock);
            close(dfd);
            *out = s;
            return 0;
        }
    }
    s = calloc(1, sizeof *s);
    if (!s) {
        err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    s->dirfd = -1;
    s->refs = 1;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->txn, NULL);
    if (!dir) {
        if (!(s->modules = cJSON_CreateObject())) {
            err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
            goto fail;
        }
        *out = s;
        return 0;
    }
    s->dirfd = dfd;
    dfd = -1;
    if (!(s->dir = strdup(real)) || asprintf(&s->path, "%s/" STATE_FILE, real) < 0) {
        s->path = NULL;
        err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    /* Refuse to start rather than forget what was accepted. */
    if ((err = flock_or_fail(s, LOCK_EX, rep)))
        goto fail;
    err = read_state(s, &s->modules, rep);
    if (!err)
        clean_temps(s);
    flock(s->dirfd, LOCK_UN);
    if (err)
        goto fail;
    s->next = registry;
    registry = s;
    pthread_mutex_unlock(&registry_lock);
    *out = s;
    return 0;
fail:
    if (dir)
        pthread_mutex_unlock(&registry_lock);
    if (dfd >= 0)
        close(dfd);
    state_free(s);
    return err;
}

void hkn_state_close(hkn_state *s) {
    if (!s)
        return;
    if (s->dir) {
        pthread_mutex_lock(&registry_lock);
        int last = --s->refs == 0;
        if (last)
            for (hkn_state **pp = &registry; *pp; pp = &(*pp)->next)
                if (*pp == s) {
                    *pp = s->next;
                    break;
                }
        pthread_mutex_unlock(&registry_lock);
        if (!last)
            return;
    }
    state_free(s);
}

int hkn_state_lookup(hkn_state *s, const char *module, uint64_t *out, hk_report *rep) {
    int err = 0;
    *out = 0;
    pthread_mutex_lock(&s->lock);
    if (s->dir) {
        cJSON *mods = NULL;
        if (!(err = flock_or_fail(s, LOCK_SH, rep))) {
            err = read_state(s, &mods, rep);
            flock(s->dirfd, LOCK_UN);
        }
        if (!err) {
            cJSON_Delete(s->modules);
            s->modules = mods;
        }
    }
    if (!err)
        *out = value_of(s->modules, module);
    pthread_mutex_unlock(&s->lock);
    return err;
}

uint64_t hkn_state_get(hkn_state *s, const char *module) {
    uint64_t v;
    hk_report rep = HK_REPORT_INIT;
    int err = hkn_state_lookup(s, module, &v, &rep);
    hk_report_clear(&rep);
    /* Fail closed: an unreadable record refuses every version. */
    return err ? UINT64_MAX : v;
}

/*
 * Persist first. A source records the version before it asks the engine to
 * commit (hkn_state_accept), and takes the record back only if the engine
 * refuses (hkn_state_revert). A crash between the two leaves the version
 * recorded: the release may have been committed, and recording too much only
 * costs a re-push under a new version number, while recording too little
 * would let the same release be replayed after a restart.
 */
int hkn_state_accept(hkn_state *s, const char *module, uint64_t version, hk_report *rep) {
    /* What could not be read back must not be written. */
    if (!hkn_valid_name(module, 64) || version == 0 || (double)version > HKN_MAX_JSON_INT)
        return hku_fail(rep, HK_ERR_INVALID, "cannot record '%.64s' v%llu", module,
                        (unsigned long long)version);
    return update(s, module, version, 1, 0, rep);
}

int hkn_state_revert(hkn_state *s, const char *module, uint64_t version, uint64_t previous,
                     hk_report *rep) {
    return update(s, module, previous, 2, version, rep);
}

void hkn_state_begin(hkn_state *s) {
    pthread_mutex_lock(&s->txn);
}

void hkn_state_end(hkn_state *s) {
    pthread_mutex_unlock(&s->txn);
}

/* ---- the accepted key list -------------------------------------------- */

#define KEYS_FILE      "keys.json"
#define KEYS_MAX_BYTES (64 << 10)

static int read_keys(hkn_state *s, char **text, size_t *len, hk_report *rep) {
    hk_report r = HK_REPORT_INIT;
    int err = hku_read_fileat(s->dirfd, s->dir, KEYS_FILE, KEYS_MAX_BYTES, text, len, &r);
    if (err == HK_ERR_NOT_FOUND)
        err = 0, *text = NULL;
    else if (err)
        err = hku_fail(rep, HK_ERR_IO, "%s", r.message);
    hk_report_clear(&r);
    return err;
}

int hkn_state_keys_read(hkn_state *s, char **text, size_t *len, hk_report *rep) {
    int err = 0;
    *text = NULL;
    *len = 0;
    pthread_mutex_lock(&s->lock);
    if (!s->dir) {
        if (s->keys && !(*text = malloc(s->keys_len + 1)))
            err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
        else if (s->keys) {
            memcpy(*text, s->keys, s->keys_len + 1);
            *len = s->keys_len;
        }
    } else if (!(err = flock_or_fail(s, LOCK_SH, rep))) {
        err = read_keys(s, text, len, rep);
        flock(s->dirfd, LOCK_UN);
    }
    pthread_mutex_unlock(&s->lock);
    return err;
}

int hkn_state_keys_write(hkn_state *s, const char *text, size_t len, uint64_t version,
                         int64_t (*version_of)(const char *text, size_t len), hk_report *rep) {
    int err = 0;
    char *cur = NULL, *copy = NULL;
    size_t cur_len = 0;
    pthread_mutex_lock(&s->lock);
    if (s->dir) {
        if ((err = flock_or_fail(s, LOCK_EX, rep)))
            goto out;
        err = read_keys(s, &cur, &cur_len, rep);
    } else {
        cur = s->keys;
        cur_len = s->keys_len;
    }
    int64_t have = err ? 0 : version_of(cur, cur_len);
    if (!err && (have < 0 || (uint64_t)have >= version))
        err = hku_fail(rep, HK_ERR_REPLAY,
                       "key list v%llu: the state records %s already: nothing was written",
                       (unsigned long long)version,
                       have < 0 ? "a key list that does not read" : "a key list at or above it");
    if (!err && s->dir) {
        struct iovec iov = {.iov_base = (void *)text, .iov_len = len};
        err = hku_write_atomicat(s->dirfd, s->dir, KEYS_FILE, &iov, 1, 0600, 1, rep);
    } else if (!err) {
        if (!(copy = malloc(len + 1))) {
            err = hku_fail(rep, HK_ERR_NOMEM, "out of memory");
        } else {
            memcpy(copy, text, len);
            copy[len] = '\0';
            free(s->keys);
            s->keys = copy;
            s->keys_len = len;
        }
    }
    if (s->dir) {
        flock(s->dirfd, LOCK_UN);
        free(cur);
    }
out:
    pthread_mutex_unlock(&s->lock);
    return err;
}

const char *hkn_state_path(const hkn_state *s) {
    return s->path;
}

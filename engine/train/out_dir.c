/* engine/train/out_dir.c - the --out directory: guards, resume resolution, pruning (out_dir.h).
 * Tests: tests/test_train.sh. */
#include "out_dir.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train_checkpoint.h"

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* 1 when path (existing or not) is, or lies under, the directory of inode *dir: each ancestor
 * of path's longest existing prefix (resolved by realpath) is compared by device and inode. */
static int lies_under(const char *path, const struct stat *dir)
{
    char buf[PATH_MAX], real[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    /* The longest prefix that exists: strip components until realpath succeeds. */
    while (!realpath(buf, real)) {
        char *slash = strrchr(buf, '/');
        if (!slash) {
            if (!realpath(".", real)) return 0;
            break;
        }
        if (slash == buf) {
            snprintf(real, sizeof real, "/");
            break;
        }
        *slash = 0;
    }
    for (;;) {
        struct stat sb;
        if (stat(real, &sb) == 0 && same_file(&sb, dir)) return 1;
        char *slash = strrchr(real, '/');
        if (!slash || (slash == real && real[1] == 0)) return 0;
        if (slash == real) real[1] = 0;
        else *slash = 0;
    }
}

/* The first entry of dir that marks a model or a run, into what[0..n); 0 when none. */
static int holds_model(const char *dir, char *what, size_t n)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        const char *s = e->d_name;
        if (!strcmp(s, "config.json") || !strcmp(s, "adapter_config.json") || !strcmp(s, "checkpoints") ||
            ends_with(s, ".safetensors") || ends_with(s, ".gguf") || ends_with(s, ".bin")) {
            snprintf(what, n, "%s", s);
            found = 1;
        }
    }
    closedir(d);
    return found;
}

enum status out_dir_check(const char *out, const char *model, const char *resume, int overwrite)
{
    struct stat so, sm;
    const int out_exists = stat(out, &so) == 0;
    if (model && stat(model, &sm) == 0) {
        if (out_exists && same_file(&so, &sm))
            return status_errorf(STATUS_FAILED_PRECONDITION,
                                 "--out %s is the model being trained (--model %s): training never writes over its "
                                 "input; choose another --out", out, model);
        if (S_ISDIR(sm.st_mode) && lies_under(out, &sm))
            return status_errorf(STATUS_FAILED_PRECONDITION,
                                 "--out %s lies inside the model's directory (--model %s): choose a directory "
                                 "outside it", out, model);
    }
    if (!out_exists) return STATUS_OK;
    if (!S_ISDIR(so.st_mode))
        return status_errorf(STATUS_FAILED_PRECONDITION, "--out %s exists and is not a directory", out);
    char what[256];
    if (overwrite || !holds_model(out, what, sizeof what)) return STATUS_OK;
    if (resume) {
        struct stat sr;
        if (stat(resume, &sr) == 0 && lies_under(resume, &so)) return STATUS_OK; /* a run continued in place */
    }
    return status_errorf(STATUS_FAILED_PRECONDITION,
                         "--out %s already holds a model or a run (%s): refusing to overwrite it; choose an empty "
                         "or new directory, --resume %s to continue the run there, or --overwrite-out to replace it",
                         out, what, out);
}

/* The iteration of a complete checkpoint directory name "iter_NNNNNNN", or -1. */
static long long iter_of(const char *name)
{
    if (strncmp(name, "iter_", 5) != 0) return -1;
    const char *p = name + 5;
    if (!*p) return -1;
    long long v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || v > LLONG_MAX / 10 - 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* The complete checkpoints under out/checkpoints, sorted by iteration (ascending). */
struct ckpt_list {
    long long *iters; /* (n) */
    size_t n, cap;
};

static int cmp_ll(const void *a, const void *b)
{
    const long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static enum status list_checkpoints(const char *out, struct ckpt_list *l)
{
    memset(l, 0, sizeof *l);
    char dir[4200], state[4600];
    snprintf(dir, sizeof dir, "%s/checkpoints", out);
    DIR *d = opendir(dir);
    if (!d) return STATUS_OK;
    struct dirent *e;
    enum status st = STATUS_OK;
    while (st == STATUS_OK && (e = readdir(d))) {
        const long long it = iter_of(e->d_name);
        if (it < 0) continue;
        snprintf(state, sizeof state, "%s/%s/train_state.safetensors", dir, e->d_name);
        struct stat sb;
        if (stat(state, &sb) != 0) continue; /* not a training checkpoint */
        if (base_grow((void **)&l->iters, &l->cap, l->n + 1, sizeof *l->iters))
            st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of memory");
        else l->iters[l->n++] = it;
    }
    closedir(d);
    if (l->n) qsort(l->iters, l->n, sizeof *l->iters, cmp_ll);
    return st;
}

enum status out_dir_clear_checkpoints(const char *out, const char *resume)
{
    struct stat so, sr;
    if (resume && stat(out, &so) == 0 && stat(resume, &sr) == 0 && lies_under(resume, &so))
        return STATUS_OK; /* the run continues in out: its checkpoints are this run's */
    struct ckpt_list l;
    enum status st = list_checkpoints(out, &l);
    char path[4200];
    for (size_t i = 0; i < l.n && st == STATUS_OK; i++) {
        snprintf(path, sizeof path, "%s/checkpoints/iter_%07lld", out, l.iters[i]);
        st = train_checkpoint_remove(path);
    }
    if (st == STATUS_OK && l.n)
        LOG_INFO("train", "--overwrite-out: removed %zu checkpoint(s) of an earlier run under %s/checkpoints", l.n, out);
    free(l.iters);
    return st;
}

enum status out_dir_resolve_resume(const char *dir, char *buf, size_t n, long long *iteration)
{
    struct ckpt_list l;
    enum status st = list_checkpoints(dir, &l);
    if (st != STATUS_OK) return st;
    long long own = -1;
    char state[4400];
    snprintf(state, sizeof state, "%s/train_state.safetensors", dir);
    struct stat sb;
    const int has_own = stat(state, &sb) == 0;
    if (has_own) {
        int64_t it = -1;
        if (train_checkpoint_iteration(dir, &it) == STATUS_OK) own = it;
    }
    const long long latest = l.n ? l.iters[l.n - 1] : -1;
    if (l.n && (!has_own || latest > own)) {
        if (snprintf(buf, n, "%s/checkpoints/iter_%07lld", dir, latest) >= (int)n)
            st = status_errorf(STATUS_INVALID_ARGUMENT, "%s: path too long", dir);
        *iteration = latest;
    } else {
        if (snprintf(buf, n, "%s", dir) >= (int)n) st = status_errorf(STATUS_INVALID_ARGUMENT, "%s: path too long", dir);
        *iteration = own;
    }
    free(l.iters);
    return st;
}

enum status out_dir_prune(const char *out, int keep)
{
    if (keep <= 0) return STATUS_OK;
    struct ckpt_list l;
    enum status st = list_checkpoints(out, &l);
    char path[4200];
    for (size_t i = 0; st == STATUS_OK && i + (size_t)keep < l.n; i++) {
        snprintf(path, sizeof path, "%s/checkpoints/iter_%07lld", out, l.iters[i]);
        if ((st = train_checkpoint_remove(path)) == STATUS_OK)
            LOG_INFO("train", "removed %s (--keep-checkpoints %d)", path, keep);
    }
    free(l.iters);
    return st;
}

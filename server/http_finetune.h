/* server/http_finetune.h - what the two files of the fine-tuning routes share: the files and jobs
 * (http_finetune.c: the routes and the worker) and their index on disk (http_finetune_store.c:
 * DIR/index.json, so that a restart keeps them). Everything here is under http_finetune.mu. */
#ifndef SHARDLM_HTTP_FINETUNE_H
#define SHARDLM_HTTP_FINETUNE_H

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "journal.h"

struct server;

#define FT_MAX_FILES 256
#define FT_MAX_JOBS 256
#define FT_MAX_EVENTS 64 /* a job's own events (its steps come from its metrics file) */
#define FT_LORA_RANK 8
#define FT_BASE_LR 2e-4 /* learning_rate_multiplier 1 */
#define SUFFIX_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

enum ft_state { FT_QUEUED, FT_RUNNING, FT_SUCCEEDED, FT_FAILED, FT_CANCELLED };

struct ft_file {
    char    id[40], filename[256];
    char    owner[JOURNAL_OWNER_MAX + 1]; /* auth_owner of the key that uploaded it ("" without keys) */
    size_t  bytes;
    int64_t created_at;
    int     deleted;          /* 1: deleted (its slot free for another upload); 2: being stored */
};

struct ft_event {
    int64_t created_at;
    char    level[8], message[320];
};

struct ft_job {
    char    id[40], model[256], training_file[40], validation_file[40], suffix[64], fine_tuned[72];
    char    owner[JOURNAL_OWNER_MAX + 1]; /* auth_owner of the key that created it ("" without keys) */
    int     n_epochs, batch_size;
    double  lr_multiplier;
    uint64_t seed;
    enum ft_state state;
    int64_t created_at, finished_at;
    double  trained_tokens;       /* summed from its metrics file when it succeeds */
    char    error[512];
    volatile sig_atomic_t stop;   /* train_run's stop flag: cancel, or the server stopping */
    int     cancelled;            /* a client cancelled it (not the server stopping) */
    struct ft_event events[FT_MAX_EVENTS];
    int     n_events;
};

struct http_finetune {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    struct ft_file  files[FT_MAX_FILES];
    int             n_files;
    struct ft_job  *jobs[FT_MAX_JOBS];
    int             n_jobs, stopping;
    uint64_t        next_id;
    pthread_t       worker;
    int             started;
};

/* The tokens job j trained on, summed from its metrics file (jobs/ID/metrics.jsonl). */
double ft_job_trained_tokens(const struct server *s, const struct ft_job *j);
extern const char *const ft_state_names[]; /* by enum ft_state: "queued", ... */

/* Writes DIR/index.json (a temporary file, then renamed) from ft's files and jobs. */
void ft_store_save(const struct server *s, const struct http_finetune *ft);
/* Reads DIR/index.json into ft when there is one: files whose bytes are gone are forgotten; a
 * job that was running or queued when the server stopped is queued again, to resume from its
 * last checkpoint. Owners written before owner.salt become their key's (auth_owner_upgrade), and
 * the index is then written again at once, so that the legacy owners leave the disk. A missing
 * index is an empty one; a malformed one is an error. */
int  ft_store_load(const struct server *s, struct http_finetune *ft, char *why, size_t cap);

#endif

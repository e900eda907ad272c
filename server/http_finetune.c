/* server/http_finetune.c - OpenAI's /v1/files and /v1/fine_tuning/jobs (`serve --fine-tuning
 * DIR`): JSONL training files uploaded (multipart/form-data, bounded in size and count, stored
 * only under DIR/files), jobs that train a LoRA adapter on a served model with `shardlm train`'s
 * code (train_run, one job at a time on a worker thread of its own with --fine-tuning-threads
 * cores), report progress as job events (the trainer's metrics.jsonl read as it grows) and, when
 * a job succeeds, load its adapter into the running server under the job's fine_tuned_model
 * name, so that the next request can name it. Cancelling a job stops it at the end of its
 * iteration; its adapter is not published. Files and jobs are kept in memory (their bytes on
 * disk): a restart forgets them (docs/server.md, "Fine-tuning jobs").
 * Threads: libmicrohttpd's connection threads call http_finetune_handle; the worker runs jobs;
 * everything shared is under ft->mu. Not here: the routing and replies (http.c), training
 * (engine/train). Tests: tests/server/test_finetune.py (the official openai client). */
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "http_finetune.h"
#include "http_internal.h"
#include "trainer.h"

const char *const ft_state_names[] = {"queued", "running", "succeeded", "failed", "cancelled"};

static int64_t now_s(void) { return (int64_t)time(NULL); }

static void path_of(const struct server *s, char *out, size_t cap, const char *kind, const char *id, const char *leaf)
{
    snprintf(out, cap, "%s/%s/%s%s%s", s->opts.finetune_dir, kind, id, leaf ? "/" : "", leaf ? leaf : "");
}

static void add_event(struct ft_job *j, const char *level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_event(struct ft_job *j, const char *level, const char *fmt, ...)
{
    if (j->n_events == FT_MAX_EVENTS) return;
    struct ft_event *e = &j->events[j->n_events++];
    e->created_at = now_s();
    snprintf(e->level, sizeof e->level, "%s", level);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

/* ---- JSON of files and jobs ----------------------------------------------------------------- */

static cJSON *file_json(const struct ft_file *f)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", f->id);
    cJSON_AddStringToObject(o, "object", "file");
    cJSON_AddNumberToObject(o, "bytes", (double)f->bytes);
    cJSON_AddNumberToObject(o, "created_at", (double)f->created_at);
    cJSON_AddStringToObject(o, "filename", f->filename);
    cJSON_AddStringToObject(o, "purpose", "fine-tune");
    cJSON_AddStringToObject(o, "status", "processed");
    return o;
}

static void add_string_or_null(cJSON *o, const char *name, const char *v)
{
    if (v && *v) cJSON_AddStringToObject(o, name, v);
    else cJSON_AddNullToObject(o, name);
}

/* The trainer's metrics file of job j, line by line: fn(ctx, line) for each parsed object. */
static void each_metric(const struct server *s, const struct ft_job *j, void (*fn)(void *, const cJSON *), void *ctx)
{
    char path[PATH_MAX];
    path_of(s, path, sizeof path, "jobs", j->id, "metrics.jsonl");
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        cJSON *m = cJSON_Parse(line);
        if (cJSON_IsObject(m)) fn(ctx, m);
        cJSON_Delete(m);
    }
    fclose(f);
}

static void sum_tokens(void *ctx, const cJSON *m)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(m, "tokens");
    if (cJSON_IsNumber(t)) *(double *)ctx += t->valuedouble;
}

double ft_job_trained_tokens(const struct server *s, const struct ft_job *j)
{
    double tokens = 0;
    each_metric(s, j, sum_tokens, &tokens);
    return tokens;
}

/* A running job asked to stop shows as cancelled at once (as OpenAI's do): it ends at its
 * iteration's end and its adapter is never published. */
static enum ft_state shown_state(const struct ft_job *j)
{
    return j->state == FT_RUNNING && j->cancelled ? FT_CANCELLED : j->state;
}

static cJSON *job_json(const struct ft_job *j)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", "fine_tuning.job");
    cJSON_AddNumberToObject(o, "created_at", (double)j->created_at);
    if (j->finished_at) cJSON_AddNumberToObject(o, "finished_at", (double)j->finished_at);
    else cJSON_AddNullToObject(o, "finished_at");
    add_string_or_null(o, "fine_tuned_model", j->state == FT_SUCCEEDED ? j->fine_tuned : NULL);
    cJSON_AddStringToObject(o, "model", j->model);
    cJSON_AddStringToObject(o, "organization_id", "shardlm");
    cJSON_AddItemToObject(o, "result_files", cJSON_CreateArray());
    cJSON_AddStringToObject(o, "status", ft_state_names[shown_state(j)]);
    cJSON_AddStringToObject(o, "training_file", j->training_file);
    add_string_or_null(o, "validation_file", j->validation_file);
    add_string_or_null(o, "user_provided_suffix", j->suffix);
    cJSON_AddNumberToObject(o, "seed", (double)j->seed);
    cJSON *h = cJSON_AddObjectToObject(o, "hyperparameters");
    cJSON_AddNumberToObject(h, "n_epochs", j->n_epochs);
    cJSON_AddNumberToObject(h, "batch_size", j->batch_size);
    cJSON_AddNumberToObject(h, "learning_rate_multiplier", j->lr_multiplier);
    if (j->state == FT_SUCCEEDED) cJSON_AddNumberToObject(o, "trained_tokens", j->trained_tokens);
    else cJSON_AddNullToObject(o, "trained_tokens");
    if (j->state == FT_FAILED) {
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "code", "training_failed");
        cJSON_AddStringToObject(e, "message", j->error);
        cJSON_AddNullToObject(e, "param");
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    cJSON_AddNullToObject(o, "estimated_finish");
    cJSON_AddItemToObject(o, "integrations", cJSON_CreateArray());
    return o;
}

static cJSON *event_json(const char *job_id, int k, int64_t at, const char *level, const char *message,
                         const char *type, cJSON *data)
{
    char id[64];
    snprintf(id, sizeof id, "ftevent-%s-%d", job_id + 6, k);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "fine_tuning.job.event");
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddNumberToObject(o, "created_at", (double)at);
    cJSON_AddStringToObject(o, "level", level);
    cJSON_AddStringToObject(o, "message", message);
    cJSON_AddStringToObject(o, "type", type);
    if (data) cJSON_AddItemToObject(o, "data", data);
    else cJSON_AddNullToObject(o, "data");
    return o;
}

struct step_events {
    cJSON *list;
    const struct ft_job *j;
    int k;
};

/* A training step's metrics line as an event ("Step 3: training loss=2.41"); evaluations too. */
static void step_event(void *ctx, const cJSON *m)
{
    struct step_events *se = ctx;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(m, "iter"), *loss = cJSON_GetObjectItemCaseSensitive(m, "loss");
    const cJSON *eval = cJSON_GetObjectItemCaseSensitive(m, "eval_loss");
    if (!cJSON_IsNumber(it) || (!cJSON_IsNumber(loss) && !cJSON_IsNumber(eval))) return;
    char msg[128];
    cJSON *data = cJSON_CreateObject();
    cJSON_AddNumberToObject(data, "step", it->valuedouble);
    if (cJSON_IsNumber(loss)) {
        snprintf(msg, sizeof msg, "Step %.0f: training loss=%.4f", it->valuedouble, loss->valuedouble);
        cJSON_AddNumberToObject(data, "train_loss", loss->valuedouble);
    } else {
        snprintf(msg, sizeof msg, "Step %.0f: validation loss=%.4f", it->valuedouble, eval->valuedouble);
        cJSON_AddNumberToObject(data, "valid_loss", eval->valuedouble);
    }
    const cJSON *el = cJSON_GetObjectItemCaseSensitive(m, "elapsed_s");
    cJSON_AddItemToArray(se->list, event_json(se->j->id, 1000 + se->k++, se->j->created_at + (cJSON_IsNumber(el) ? (int64_t)el->valuedouble : 0),
                                              "info", msg, "metrics", data));
}

/* The events, newest first as OpenAI lists them: the job's own events and its steps, by time. */
static cJSON *events_json(const struct server *s, const struct ft_job *j)
{
    struct step_events se = {cJSON_CreateArray(), j, 0};
    for (int k = 0; k < j->n_events; k++) {
        const struct ft_event *e = &j->events[k];
        cJSON_AddItemToArray(se.list, event_json(j->id, k, e->created_at, e->level, e->message, "message", NULL));
        if (k == 1 && j->state != FT_QUEUED) each_metric(s, j, step_event, &se); /* after "started" */
    }
    cJSON *data = cJSON_CreateArray();
    for (int k = cJSON_GetArraySize(se.list) - 1; k >= 0; k--)
        cJSON_AddItemToArray(data, cJSON_DetachItemFromArray(se.list, k));
    cJSON_Delete(se.list);
    return data;
}

/* ---- the worker ----------------------------------------------------------------------------- */

static struct served_model *model_named(struct server *s, const char *id)
{
    for (int i = 0; i < s->n_models; i++)
        if (!strcmp(s->models[i].model_id, id)) return &s->models[i];
    return NULL;
}

/* j->error from the trainer's message, whose "PATH:LINE: ..." of an uploaded file becomes
 * "training_file ID, line LINE: ...": the client knows the file by its id, not the server's path. */
static void job_error(struct ft_job *j, const char *msg, const char *data, const char *eval)
{
    const char *paths[2] = {data, eval}, *ids[2] = {j->training_file, j->validation_file};
    const char *kinds[2] = {"training_file", "validation_file"};
    for (int k = 0; k < 2; k++) {
        size_t n = strlen(paths[k]);
        if (!ids[k][0] || strncmp(msg, paths[k], n) || msg[n] != ':') continue;
        char *end = NULL;
        long line = strtol(msg + n + 1, &end, 10);
        if (end != msg + n + 1 && *end == ':') {
            snprintf(j->error, sizeof j->error, "%s %s, line %ld:%s", kinds[k], ids[k], line, end + 1);
            return;
        }
        snprintf(j->error, sizeof j->error, "%s %s:%s", kinds[k], ids[k], msg + n + 1);
        return;
    }
    snprintf(j->error, sizeof j->error, "%s", msg);
}

/* Trains job j (ft->mu not held; j's settings do not change once queued), then publishes its
 * adapter. Returns the job's end state, with j->error set on failure. */
static enum ft_state run_job(struct server *s, struct ft_job *j)
{
    char data[PATH_MAX], eval[PATH_MAX], out[PATH_MAX], metrics[PATH_MAX];
    path_of(s, data, sizeof data, "files", j->training_file, NULL);
    path_of(s, eval, sizeof eval, "files", j->validation_file, NULL);
    path_of(s, out, sizeof out, "jobs", j->id, "adapter");
    path_of(s, metrics, sizeof metrics, "jobs", j->id, "metrics.jsonl");
    struct served_model *m = model_named(s, j->model);
    struct train_options o;
    train_options_default(&o);
    o.model_dir = m->eopts.model_dir;
    o.data = data;
    o.eval_data = j->validation_file[0] ? eval : NULL;
    o.out_dir = out;
    o.metrics_path = metrics;
    o.epochs = j->n_epochs;
    o.micro_batch_size = 1;
    o.global_batch_size = j->batch_size;
    o.seq_length = s->opts.finetune_seq_length;
    o.data_opt.seq_length = o.seq_length;
    o.data_opt.chat_template = CHAT_TEMPLATE_PLAIN; /* resolved from the model (chat_template_auto) */
    o.chat_template_auto = 1;
    o.opt.lr = FT_BASE_LR * j->lr_multiplier;
    o.seed = j->seed;
    o.lora_rank = FT_LORA_RANK;
    o.eval_interval = 0;
    o.save_interval = 0;
    o.threads = s->opts.finetune_threads;
    o.stop_signal = &j->stop;
    /* A job the server stopped continues from its last checkpoint (train's --resume OUT --out OUT). */
    char ckpt[PATH_MAX + 16];
    struct stat sb;
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints", out);
    if (stat(ckpt, &sb) == 0) o.resume_dir = out;
    enum status st = train_run(&o);
    if (j->cancelled) return FT_CANCELLED;
    if (st == STATUS_CANCELLED) return FT_QUEUED; /* the server stopping: resumed after a restart */
    if (st != STATUS_OK) {
        job_error(j, status_message(), data, eval);
        return FT_FAILED;
    }
    struct served_model *pinned = NULL;
    if ((st = server_acquire(s, j->model, 1, &pinned)) == STATUS_OK) {
        st = engine_load_adapter(pinned->engine, j->fine_tuned, out);
        if (st == STATUS_OK) server_model_note_info(s, pinned);
        server_release(s, pinned);
    }
    if (st != STATUS_OK) {
        snprintf(j->error, sizeof j->error, "the adapter was trained but could not be loaded: %s", status_message());
        return FT_FAILED;
    }
    return FT_SUCCEEDED;
}

void http_finetune_publish(struct server *s)
{
    struct http_finetune *ft = s->finetune;
    if (!ft) return;
    pthread_mutex_lock(&ft->mu);
    const int n_jobs = ft->n_jobs; /* the index's (a succeeded job's name and files never change) */
    pthread_mutex_unlock(&ft->mu);
    for (int k = 0; k < n_jobs; k++) {
        struct ft_job *j = ft->jobs[k];
        if (j->state != FT_SUCCEEDED) continue;
        char out[PATH_MAX];
        path_of(s, out, sizeof out, "jobs", j->id, "adapter");
        struct served_model *m = NULL;
        enum status st = server_acquire(s, j->model, 1, &m);
        if (st == STATUS_OK) {
            st = engine_load_adapter(m->engine, j->fine_tuned, out);
            if (st == STATUS_OK) server_model_note_info(s, m);
            server_release(s, m);
        }
        if (st != STATUS_OK) LOG_WARN("finetune", "job %s: its adapter %s is not served again: %s", j->id, j->fine_tuned, status_message());
    }
}

static void *worker_main(void *arg)
{
    struct server *s = arg;
    struct http_finetune *ft = s->finetune;
    pthread_mutex_lock(&ft->mu);
    for (;;) {
        struct ft_job *j = NULL;
        for (int k = 0; k < ft->n_jobs && !j; k++)
            if (ft->jobs[k]->state == FT_QUEUED) j = ft->jobs[k];
        if (ft->stopping) break;
        if (!j) {
            pthread_cond_wait(&ft->cv, &ft->mu);
            continue;
        }
        j->state = FT_RUNNING;
        add_event(j, "info", "Fine-tuning job started");
        pthread_mutex_unlock(&ft->mu);
        ft_store_save(s, ft);
        LOG_INFO("finetune", "job %s: training a LoRA adapter (rank %d) on %s with %s", j->id, FT_LORA_RANK, j->model,
                 j->training_file);
        enum ft_state end = run_job(s, j);
        const double tokens = end == FT_SUCCEEDED ? ft_job_trained_tokens(s, j) : 0;
        pthread_mutex_lock(&ft->mu);
        j->trained_tokens = tokens;
        j->state = end;
        if (end != FT_QUEUED) j->finished_at = now_s();
        if (end == FT_QUEUED)
            add_event(j, "info", "The server stopped: the job resumes from its last checkpoint when it starts again");
        else if (end == FT_SUCCEEDED)
            add_event(j, "info", "The job has successfully completed: %s is served", j->fine_tuned);
        else if (end == FT_FAILED)
            add_event(j, "error", "The job failed: %s", j->error);
        else
            add_event(j, "info", "The job was cancelled; no adapter was published");
        LOG_INFO("finetune", "job %s %s%s%s", j->id, ft_state_names[end], end == FT_FAILED ? ": " : "",
                 end == FT_FAILED ? j->error : "");
        ft_store_save(s, ft);
    }
    pthread_mutex_unlock(&ft->mu);
    return NULL;
}

enum status http_finetune_start(struct server *s)
{
    const char *dir = s->opts.finetune_dir;
    if (s->opts.finetune_threads <= 0) s->opts.finetune_threads = 1;
    if (s->opts.finetune_max_file_mb <= 0) s->opts.finetune_max_file_mb = 64;
    if (s->opts.finetune_seq_length <= 0) s->opts.finetune_seq_length = 512;
    char sub[PATH_MAX];
    for (int k = 0; k < 3; k++) {
        snprintf(sub, sizeof sub, "%s%s", dir, k == 0 ? "" : k == 1 ? "/files" : "/jobs");
        if (mkdir(sub, 0700) != 0 && errno != EEXIST)
            return status_errorf(STATUS_INVALID_ARGUMENT, "--fine-tuning %s: cannot create %s: %s", dir, sub, strerror(errno));
    }
    struct http_finetune *ft = calloc(1, sizeof *ft);
    if (!ft) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    pthread_mutex_init(&ft->mu, NULL);
    pthread_cond_init(&ft->cv, NULL);
    ft->next_id = ((uint64_t)now_s() << 16) ^ (uint64_t)getpid();
    char why[512];
    if (ft_store_load(s, ft, why, sizeof why) != 0) {
        for (int k = 0; k < ft->n_jobs; k++) free(ft->jobs[k]);
        free(ft);
        return status_errorf(STATUS_INVALID_ARGUMENT, "--fine-tuning %s: %s", dir, why);
    }
    for (int k = 0; k < ft->n_jobs; k++)
        if (ft->jobs[k]->state == FT_QUEUED && ft->jobs[k]->n_events > 1)
            add_event(ft->jobs[k], "info", "The server started again: the job is queued to resume");
    s->finetune = ft;
    if (pthread_create(&ft->worker, NULL, worker_main, s) != 0) {
        s->finetune = NULL;
        free(ft);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "--fine-tuning: cannot start the worker thread");
    }
    ft->started = 1;
    LOG_INFO("finetune", "/v1/files and /v1/fine_tuning/jobs under %s (%d training threads, files up to %d MiB)", dir,
             s->opts.finetune_threads, s->opts.finetune_max_file_mb);
    return STATUS_OK;
}

void http_finetune_stop(struct server *s)
{
    struct http_finetune *ft = s->finetune;
    if (!ft) return;
    pthread_mutex_lock(&ft->mu);
    ft->stopping = 1;
    for (int k = 0; k < ft->n_jobs; k++)
        if (ft->jobs[k]->state == FT_RUNNING) ft->jobs[k]->stop = SIGTERM; /* ends at its iteration's end */
    pthread_cond_broadcast(&ft->cv);
    pthread_mutex_unlock(&ft->mu);
    if (ft->started) pthread_join(ft->worker, NULL);
    for (int k = 0; k < ft->n_jobs; k++) free(ft->jobs[k]);
    pthread_mutex_destroy(&ft->mu);
    pthread_cond_destroy(&ft->cv);
    free(ft);
    s->finetune = NULL;
}

/* ---- requests ------------------------------------------------------------------------------- */

static void new_id(struct http_finetune *ft, const char *prefix, char *out, size_t cap)
{
    snprintf(out, cap, "%s%012llx", prefix, (unsigned long long)(ft->next_id++ & 0xffffffffffffULL));
}

int http_finetune_hidden(const struct server *s, const char *adapter, const char *owner)
{
    struct http_finetune *ft = s->finetune;
    if (!ft || !adapter || !*adapter) return 0;
    int hidden = 0;
    pthread_mutex_lock(&ft->mu);
    for (int k = 0; k < ft->n_jobs && !hidden; k++)
        hidden = ft->jobs[k]->fine_tuned[0] && !strcmp(ft->jobs[k]->fine_tuned, adapter) &&
                 strcmp(ft->jobs[k]->owner, owner ? owner : "");
    pthread_mutex_unlock(&ft->mu);
    return hidden;
}

/* Files and jobs belong to the API key that made them (owner: auth_owner): another key's are
 * not found, listed, read, deleted or cancelled. */
static struct ft_file *file_by_id(struct http_finetune *ft, const char *id, const char *owner)
{
    for (int k = 0; k < ft->n_files; k++)
        if (!ft->files[k].deleted && !strcmp(ft->files[k].id, id) && !strcmp(ft->files[k].owner, owner))
            return &ft->files[k];
    return NULL;
}

static struct ft_job *job_by_id(struct http_finetune *ft, const char *id, const char *owner)
{
    for (int k = 0; k < ft->n_jobs; k++)
        if (!strcmp(ft->jobs[k]->id, id) && !strcmp(ft->jobs[k]->owner, owner)) return ft->jobs[k];
    return NULL;
}

/* Each non-blank line of a JSONL file must be a JSON object: the first that is not is named. */
static enum status check_jsonl(const char *data, size_t len)
{
    size_t line = 0, objects = 0;
    for (const char *p = data, *end = data + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        line++;
        const char *q = p;
        while (q < e && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q < e) {
            cJSON *o = cJSON_ParseWithLength(p, (size_t)(e - p));
            int ok = cJSON_IsObject(o);
            cJSON_Delete(o);
            if (!ok) return status_errorf(STATUS_INVALID_ARGUMENT, "the file is not JSONL: line %zu is not a JSON object", line);
            objects++;
        }
        p = e + 1;
    }
    return objects ? STATUS_OK : status_errorf(STATUS_INVALID_ARGUMENT, "the file holds no JSONL example");
}

static enum status upload(struct server *s, const char *owner, const char *ctype, const char *body, size_t len,
                          cJSON **out)
{
    struct http_finetune *ft = s->finetune;
    struct http_part parts[8];
    int n = 0;
    enum status st = http_multipart(ctype, body, len, parts, 8, &n);
    if (st != STATUS_OK) return st;
    const struct http_part *file = NULL, *purpose = NULL;
    for (int k = 0; k < n; k++) {
        const struct http_part **to = !strcmp(parts[k].name, "file") ? &file : !strcmp(parts[k].name, "purpose") ? &purpose : NULL;
        if (to && *to) /* (which one a client meant is not ours to guess) */
            return status_errorf(STATUS_INVALID_ARGUMENT, "the upload field '%s' appears twice", parts[k].name);
        if (to) *to = &parts[k];
        else return status_errorf(STATUS_INVALID_ARGUMENT, "unsupported upload field '%s' (file and purpose are read)", parts[k].name);
    }
    if (!file || !purpose) return status_errorf(STATUS_INVALID_ARGUMENT, "an upload needs the fields file and purpose");
    if (purpose->len != 9 || memcmp(purpose->data, "fine-tune", 9))
        return status_errorf(STATUS_INVALID_ARGUMENT, "purpose '%.*s' is not supported: this server keeps files for "
                             "fine-tune only", (int)(purpose->len < 64 ? purpose->len : 64), purpose->data);
    if ((st = check_jsonl(file->data, file->len)) != STATUS_OK) return st;
    pthread_mutex_lock(&ft->mu);
    struct ft_file *f = NULL;
    /* A deleted file's slot first (they are not kept across restarts either: ft_store_save), so
     * that uploads and deletions can go on for the server's life, not 256 of them in all. */
    for (int k = 0; k < ft->n_files && !f; k++)
        if (ft->files[k].deleted == 1) f = &ft->files[k];
    if (!f && ft->n_files < FT_MAX_FILES) f = &ft->files[ft->n_files++];
    if (!f) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "at most %d files are kept", FT_MAX_FILES);
    else { /* the slot is taken now, hidden until the bytes are stored */
        memset(f, 0, sizeof *f);
        f->deleted = 2;
        new_id(ft, "file-", f->id, sizeof f->id);
        snprintf(f->owner, sizeof f->owner, "%s", owner);
    }
    pthread_mutex_unlock(&ft->mu);
    if (st != STATUS_OK) return st;
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    path_of(s, path, sizeof path, "files", f->id, NULL);
    snprintf(tmp, sizeof tmp, "%s.part", path);
    FILE *w = fopen(tmp, "wb");
    int ok = w && fwrite(file->data, 1, file->len, w) == file->len;
    ok = w && fclose(w) == 0 && ok && rename(tmp, path) == 0;
    if (!ok) {
        const int err = errno;
        unlink(tmp);
        pthread_mutex_lock(&ft->mu);
        f->deleted = 1; /* the slot free again */
        pthread_mutex_unlock(&ft->mu);
        return status_errorf(STATUS_INTERNAL, "cannot store the upload under %s: %s", s->opts.finetune_dir, strerror(err));
    }
    pthread_mutex_lock(&ft->mu);
    snprintf(f->filename, sizeof f->filename, "%s", file->filename[0] ? file->filename : "upload.jsonl");
    f->bytes = file->len;
    f->created_at = now_s();
    f->deleted = 0;
    *out = file_json(f);
    ft_store_save(s, ft);
    pthread_mutex_unlock(&ft->mu);
    return STATUS_OK;
}

/* "auto" or a number within [lo, hi]; *v unchanged for "auto" or absent. */
static enum status hyper_number(const cJSON *h, const char *name, double lo, double hi, double *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(h, name);
    if (!x || cJSON_IsNull(x) || (cJSON_IsString(x) && !strcmp(x->valuestring, "auto"))) return STATUS_OK;
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= lo && x->valuedouble <= hi))
        return status_errorf(STATUS_INVALID_ARGUMENT, "hyperparameters.%s must be \"auto\" or a number in [%g, %g]", name, lo, hi);
    *v = x->valuedouble;
    return STATUS_OK;
}

static enum status create_job(struct server *s, const char *owner, const char *body, size_t len, cJSON **out)
{
    struct http_finetune *ft = s->finetune;
    cJSON *o = NULL;
    enum status st = http_json_parse_body(body, len, &o);
    if (st != STATUS_OK) return st;
    static const char *const allowed[] = {"model", "training_file", "validation_file", "hyperparameters", "suffix",
                                          "seed", "method", NULL};
    st = http_json_only_fields(o, "a fine-tuning job", allowed);
    struct ft_job *j = calloc(1, sizeof *j);
    if (!j) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    const cJSON *model = http_json_field(o, "model"), *tf = http_json_field(o, "training_file");
    const cJSON *vf = http_json_field(o, "validation_file"), *suffix = http_json_field(o, "suffix");
    const cJSON *seed = http_json_field(o, "seed"), *method = http_json_field(o, "method");
    const cJSON *h = http_json_field(o, "hyperparameters");
    if (st == STATUS_OK && method) { /* {"type": "supervised", "supervised": {"hyperparameters": {...}}} */
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(method, "type");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "supervised"))
            st = status_errorf(STATUS_INVALID_ARGUMENT, "method.type must be \"supervised\" (dpo and reinforcement are not supported)");
        const cJSON *sup = cJSON_GetObjectItemCaseSensitive(method, "supervised");
        static const char *const method_fields[] = {"type", "supervised", NULL}, *const sup_fields[] = {"hyperparameters", NULL};
        if (st == STATUS_OK) st = http_json_only_fields(method, "method", method_fields);
        if (st == STATUS_OK && cJSON_IsObject(sup)) st = http_json_only_fields(sup, "method.supervised", sup_fields);
        if (st == STATUS_OK && sup && h)
            st = status_errorf(STATUS_INVALID_ARGUMENT, "give hyperparameters or method.supervised.hyperparameters, not both");
        if (sup) h = cJSON_GetObjectItemCaseSensitive(sup, "hyperparameters");
    }
    if (st == STATUS_OK && (!cJSON_IsString(model) || !model_named(s, model->valuestring)))
        st = status_errorf(STATUS_NOT_FOUND, "model '%s' is not served here (GET /v1/models)",
                           cJSON_IsString(model) ? model->valuestring : "(none)");
    if (st == STATUS_OK && !cJSON_IsString(tf)) st = status_errorf(STATUS_INVALID_ARGUMENT, "training_file (a file id) is required");
    if (st == STATUS_OK && vf && !cJSON_IsNull(vf) && !cJSON_IsString(vf))
        st = status_errorf(STATUS_INVALID_ARGUMENT, "validation_file must be a file id");
    if (st == STATUS_OK && suffix && !cJSON_IsNull(suffix) &&
        (!cJSON_IsString(suffix) || strlen(suffix->valuestring) > 40 ||
         strspn(suffix->valuestring, SUFFIX_CHARS) != strlen(suffix->valuestring)))
        st = status_errorf(STATUS_INVALID_ARGUMENT, "suffix must be at most 40 letters, digits, '.', '_' or '-' (it "
                                                    "becomes part of the adapter's name)");
    if (st == STATUS_OK && seed && !cJSON_IsNull(seed) && (!cJSON_IsNumber(seed) || seed->valuedouble < 0 || seed->valuedouble > 2147483647))
        st = status_errorf(STATUS_INVALID_ARGUMENT, "seed must be an integer in [0, 2147483647]");
    double epochs = 1, batch = 1, lr_mult = 1;
    if (st == STATUS_OK && h && !cJSON_IsObject(h)) st = status_errorf(STATUS_INVALID_ARGUMENT, "hyperparameters must be an object");
    if (st == STATUS_OK && h) {
        static const char *const hyper[] = {"n_epochs", "batch_size", "learning_rate_multiplier", NULL};
        st = http_json_only_fields(h, "hyperparameters", hyper);
        if (st == STATUS_OK) st = hyper_number(h, "n_epochs", 1, 50, &epochs);
        if (st == STATUS_OK) st = hyper_number(h, "batch_size", 1, 256, &batch);
        if (st == STATUS_OK) st = hyper_number(h, "learning_rate_multiplier", 1e-3, 100, &lr_mult);
        if (st == STATUS_OK && (epochs != (int)epochs || batch != (int)batch))
            st = status_errorf(STATUS_INVALID_ARGUMENT, "hyperparameters.n_epochs and batch_size are integers");
    }
    if (st != STATUS_OK) {
        free(j);
        cJSON_Delete(o);
        return st;
    }
    snprintf(j->model, sizeof j->model, "%s", model->valuestring);
    snprintf(j->suffix, sizeof j->suffix, "%s", cJSON_IsString(suffix) ? suffix->valuestring : "");
    j->n_epochs = (int)epochs, j->batch_size = (int)batch, j->lr_multiplier = lr_mult;
    j->seed = cJSON_IsNumber(seed) ? (uint64_t)seed->valuedouble : 1234;
    pthread_mutex_lock(&ft->mu);
    if (!file_by_id(ft, tf->valuestring, owner))
        st = status_errorf(STATUS_NOT_FOUND, "training_file '%s' does not exist (POST /v1/files)", tf->valuestring);
    else if (cJSON_IsString(vf) && !file_by_id(ft, vf->valuestring, owner))
        st = status_errorf(STATUS_NOT_FOUND, "validation_file '%s' does not exist (POST /v1/files)", vf->valuestring);
    else if (ft->n_jobs == FT_MAX_JOBS)
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "at most %d fine-tuning jobs are kept", FT_MAX_JOBS);
    if (st == STATUS_OK) {
        snprintf(j->owner, sizeof j->owner, "%s", owner);
        snprintf(j->training_file, sizeof j->training_file, "%s", tf->valuestring);
        snprintf(j->validation_file, sizeof j->validation_file, "%s", cJSON_IsString(vf) ? vf->valuestring : "");
        new_id(ft, "ftjob-", j->id, sizeof j->id);
        /* An adapter's name (letters, digits, '.', '_', '-'; at most 64): ft-SUFFIX-ID. */
        snprintf(j->fine_tuned, sizeof j->fine_tuned, "ft-%s-%s", j->suffix[0] ? j->suffix : "shardlm", j->id + 6);
        j->created_at = now_s();
        char dir[PATH_MAX];
        path_of(s, dir, sizeof dir, "jobs", j->id, NULL);
        if (mkdir(dir, 0700) != 0) st = status_errorf(STATUS_INTERNAL, "cannot create %s: %s", dir, strerror(errno));
    }
    if (st == STATUS_OK) {
        add_event(j, "info", "Created fine-tuning job: %s", j->id);
        ft->jobs[ft->n_jobs++] = j;
        ft_store_save(s, ft);
        *out = job_json(j);
        pthread_cond_signal(&ft->cv);
    } else {
        free(j);
    }
    pthread_mutex_unlock(&ft->mu);
    cJSON_Delete(o);
    return st;
}

/* The id after prefix in url, up to the next '/' (copied into id); rest: what follows it. */
static int url_id(const char *url, const char *prefix, char *id, size_t cap, const char **rest)
{
    size_t pl = strlen(prefix);
    if (strncmp(url, prefix, pl)) return 0;
    const char *p = url + pl, *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (n == 0 || n >= cap) return 0;
    memcpy(id, p, n);
    id[n] = 0;
    *rest = p + n;
    return 1;
}

enum status http_finetune_handle(struct server *s, const char *owner, const char *method, const char *url,
                                 const struct http_query *q, const char *ctype, const char *body, size_t len,
                                 char **out, size_t *out_len, const char **out_type)
{
    struct http_finetune *ft = s->finetune;
    if (!ft) return status_errorf(STATUS_NOT_FOUND, "fine-tuning is not enabled on this server (serve --fine-tuning DIR)");
    const int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    const int del = !strcmp(method, "DELETE");
    char id[64];
    const char *rest = NULL;
    cJSON *o = NULL;
    enum status st = STATUS_OK;
    struct http_list lo;
    *out_type = "application/json";
    /* Only the lists (GET) read a query; anywhere else a parameter is refused by name. */
    const int list = get && (!strcmp(url, "/v1/files") || !strcmp(url, "/v1/fine_tuning/jobs") ||
                             (url_id(url, "/v1/fine_tuning/jobs/", id, sizeof id, &rest) && !strcmp(rest, "/events")));
    if (!list && (st = http_list_options(q, "", 0, 0, &lo)) != STATUS_OK) return st;
    if (!strcmp(url, "/v1/files")) {
        if (post) st = upload(s, owner, ctype, body, len, &o);
        else if (get) {
            st = http_list_options(q, "after,limit,order,purpose", 10000, 10000, &lo);
            /* Every file here is a fine-tune file: another purpose lists none. */
            const int none = lo.purpose && strcmp(lo.purpose, "fine-tune");
            cJSON *items = cJSON_CreateArray();
            pthread_mutex_lock(&ft->mu);
            for (int k = ft->n_files - 1; k >= 0 && !none; k--) /* newest first */
                if (!ft->files[k].deleted && !strcmp(ft->files[k].owner, owner))
                    cJSON_AddItemToArray(items, file_json(&ft->files[k]));
            pthread_mutex_unlock(&ft->mu);
            if (st == STATUS_OK) st = http_list_page(items, &lo, "the file list", &o);
            else cJSON_Delete(items);
        } else st = status_errorf(STATUS_INVALID_ARGUMENT, "method %s: /v1/files takes GET or POST", method);
    } else if (url_id(url, "/v1/files/", id, sizeof id, &rest)) {
        char content[PATH_MAX];
        int content_fd = -1;
        pthread_mutex_lock(&ft->mu);
        struct ft_file *f = file_by_id(ft, id, owner);
        if (!f) st = status_errorf(STATUS_NOT_FOUND, "file '%s' does not exist", id);
        else if (!*rest && get) o = file_json(f);
        else if (!*rest && del) {
            int used = 0;
            for (int k = 0; k < ft->n_jobs; k++)
                used |= (ft->jobs[k]->state <= FT_RUNNING) &&
                        (!strcmp(ft->jobs[k]->training_file, id) || !strcmp(ft->jobs[k]->validation_file, id));
            if (used) st = status_errorf(STATUS_FAILED_PRECONDITION, "file '%s' is used by a queued or running job", id);
            else {
                char path[PATH_MAX];
                path_of(s, path, sizeof path, "files", id, NULL);
                unlink(path);
                f->deleted = 1;
                ft_store_save(s, ft);
                o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "id", id);
                cJSON_AddStringToObject(o, "object", "file");
                cJSON_AddBoolToObject(o, "deleted", 1);
            }
        } else if (!strcmp(rest, "/content") && get) {
            /* Opened under the lock (a DELETE meanwhile leaves the open file readable), read after
             * it: up to --fine-tuning-max-file-mb must not hold every other fine-tuning call. */
            path_of(s, content, sizeof content, "files", id, NULL);
            st = base_open_file(content, &content_fd, NULL);
            *out_type = "application/octet-stream";
        } else st = status_errorf(STATUS_NOT_FOUND, "no such route: %s %s", method, url);
        pthread_mutex_unlock(&ft->mu);
        if (content_fd >= 0)
            return base_read_fd(content_fd, content, (size_t)s->opts.finetune_max_file_mb << 20, "file", out, out_len);
    } else if (!strcmp(url, "/v1/fine_tuning/jobs")) {
        if (post) st = create_job(s, owner, body, len, &o);
        else if (get && (st = http_list_options(q, "after,limit", 20, 100, &lo)) != STATUS_OK) {
            /* refused */
        } else if (get) {
            cJSON *items = cJSON_CreateArray();
            pthread_mutex_lock(&ft->mu);
            for (int k = ft->n_jobs - 1; k >= 0; k--)
                if (!strcmp(ft->jobs[k]->owner, owner)) cJSON_AddItemToArray(items, job_json(ft->jobs[k]));
            pthread_mutex_unlock(&ft->mu);
            st = http_list_page(items, &lo, "the job list", &o);
        } else st = status_errorf(STATUS_INVALID_ARGUMENT, "method %s: /v1/fine_tuning/jobs takes GET or POST", method);
    } else if (url_id(url, "/v1/fine_tuning/jobs/", id, sizeof id, &rest)) {
        pthread_mutex_lock(&ft->mu);
        struct ft_job *j = job_by_id(ft, id, owner);
        if (!j) st = status_errorf(STATUS_NOT_FOUND, "fine-tuning job '%s' does not exist", id);
        else if (!*rest && get) o = job_json(j);
        else if (!strcmp(rest, "/events") && get) {
            /* The metrics file is read from a copy of the job, outside the lock: a long run's
             * file would otherwise hold every other route (and the worker) for its reading. */
            struct ft_job *copy = malloc(sizeof *copy);
            if (copy) memcpy(copy, j, sizeof *copy);
            pthread_mutex_unlock(&ft->mu);
            char what[96];
            snprintf(what, sizeof what, "the events of job %s", id);
            if (!copy) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            else if ((st = http_list_options(q, "after,limit", 20, 100, &lo)) == STATUS_OK)
                st = http_list_page(events_json(s, copy), &lo, what, &o);
            free(copy);
            pthread_mutex_lock(&ft->mu);
        }
        else if (!strcmp(rest, "/cancel") && post) {
            if (shown_state(j) > FT_RUNNING)
                st = status_errorf(STATUS_FAILED_PRECONDITION, "job %s is already %s", id, ft_state_names[shown_state(j)]);
            else {
                j->cancelled = 1;
                j->stop = SIGTERM;
                if (j->state == FT_QUEUED) {
                    j->state = FT_CANCELLED;
                    j->finished_at = now_s();
                    add_event(j, "info", "The job was cancelled before it started");
                }
                ft_store_save(s, ft);
                o = job_json(j);
            }
        } else st = status_errorf(STATUS_NOT_FOUND, "no such route: %s %s", method, url);
        pthread_mutex_unlock(&ft->mu);
    } else {
        st = status_errorf(STATUS_NOT_FOUND, "no such route: %s %s", method, url);
    }
    if (st != STATUS_OK) {
        cJSON_Delete(o);
        return st;
    }
    *out = http_json_print(o);
    *out_len = strlen(*out);
    return STATUS_OK;
}

/* server/http_finetune_store.c - the fine-tuning routes' index on disk, DIR/index.json: every
 * file and job (with its events), written whole after each change (a temporary file, then
 * renamed: a crash leaves the old index or the new one), read at start, so that a restart keeps
 * the uploads, the finished jobs (whose adapters are served again) and the unfinished ones
 * (queued again, resuming from their last checkpoint). Each file and job carries its owner
 * (auth_owner); owners of an older version are upgraded at load (auth_owner_upgrade).
 * Tests: tests/server/test_finetune.py. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "http_finetune.h"
#include "server_internal.h"

static void index_path(const struct server *s, char *out, size_t cap)
{
    snprintf(out, cap, "%s/index.json", s->opts.finetune_dir);
}

void ft_store_save(const struct server *s, const struct http_finetune *ft)
{
    cJSON *o = cJSON_CreateObject(), *files = cJSON_AddArrayToObject(o, "files"), *jobs = cJSON_AddArrayToObject(o, "jobs");
    cJSON_AddNumberToObject(o, "next_id", (double)ft->next_id);
    for (int k = 0; k < ft->n_files; k++) {
        const struct ft_file *f = &ft->files[k];
        if (f->deleted) continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "id", f->id);
        cJSON_AddStringToObject(e, "filename", f->filename);
        cJSON_AddStringToObject(e, "owner", f->owner);
        cJSON_AddNumberToObject(e, "bytes", (double)f->bytes);
        cJSON_AddNumberToObject(e, "created_at", (double)f->created_at);
        cJSON_AddItemToArray(files, e);
    }
    for (int k = 0; k < ft->n_jobs; k++) {
        const struct ft_job *j = ft->jobs[k];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "id", j->id);
        cJSON_AddStringToObject(e, "model", j->model);
        cJSON_AddStringToObject(e, "owner", j->owner);
        cJSON_AddStringToObject(e, "training_file", j->training_file);
        cJSON_AddStringToObject(e, "validation_file", j->validation_file);
        cJSON_AddStringToObject(e, "suffix", j->suffix);
        cJSON_AddStringToObject(e, "fine_tuned_model", j->fine_tuned);
        cJSON_AddNumberToObject(e, "n_epochs", j->n_epochs);
        cJSON_AddNumberToObject(e, "batch_size", j->batch_size);
        cJSON_AddNumberToObject(e, "learning_rate_multiplier", j->lr_multiplier);
        cJSON_AddNumberToObject(e, "seed", (double)j->seed);
        /* A job asked to stop by a client is cancelled whatever the worker does next. */
        cJSON_AddStringToObject(e, "state", ft_state_names[j->cancelled ? FT_CANCELLED : j->state]);
        cJSON_AddNumberToObject(e, "created_at", (double)j->created_at);
        cJSON_AddNumberToObject(e, "finished_at", (double)j->finished_at);
        cJSON_AddNumberToObject(e, "trained_tokens", j->trained_tokens);
        cJSON_AddStringToObject(e, "error", j->error);
        cJSON *ev = cJSON_AddArrayToObject(e, "events");
        for (int i = 0; i < j->n_events; i++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddNumberToObject(x, "created_at", (double)j->events[i].created_at);
            cJSON_AddStringToObject(x, "level", j->events[i].level);
            cJSON_AddStringToObject(x, "message", j->events[i].message);
            cJSON_AddItemToArray(ev, x);
        }
        cJSON_AddItemToArray(jobs, e);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    char path[PATH_MAX];
    index_path(s, path, sizeof path);
    /* Mode 0600: the index names the owners' files and jobs. */
    if (!text || base_write_text(path, text, 0600) != STATUS_OK)
        LOG_WARN("finetune", "cannot write %s: %s (a restart would not see the latest change)", path,
                 text ? status_message() : "out of memory");
    free(text);
}

static void copy_str(const cJSON *o, const char *name, char *out, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    snprintf(out, cap, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static double num(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

int ft_store_load(const struct server *s, struct http_finetune *ft, char *why, size_t cap)
{
    char path[PATH_MAX];
    index_path(s, path, sizeof path);
    char *text = NULL;
    size_t len = 0;
    if (base_read_file(path, (size_t)64 << 20, "index", &text, &len) != STATUS_OK) {
        struct stat sb;
        if (stat(path, &sb) != 0) return 0; /* none yet */
        snprintf(why, cap, "%s", status_message());
        return -1;
    }
    cJSON *o = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(o, "files"), *jobs = cJSON_GetObjectItemCaseSensitive(o, "jobs");
    if (!cJSON_IsArray(files) || !cJSON_IsArray(jobs)) {
        cJSON_Delete(o);
        snprintf(why, cap, "%s is not a fine-tuning index (files and jobs)", path);
        return -1;
    }
    if ((uint64_t)num(o, "next_id") > ft->next_id) ft->next_id = (uint64_t)num(o, "next_id"); /* ids never repeat */
    int upgraded = 0; /* owners of the unsalted legacy form that became their key's */
    const cJSON *e;
    cJSON_ArrayForEach(e, files) {
        if (ft->n_files == FT_MAX_FILES) break;
        struct ft_file *f = &ft->files[ft->n_files];
        memset(f, 0, sizeof *f);
        copy_str(e, "id", f->id, sizeof f->id);
        copy_str(e, "filename", f->filename, sizeof f->filename);
        copy_str(e, "owner", f->owner, sizeof f->owner); /* absent (an older index): "" */
        upgraded += auth_owner_upgrade(s, f->owner, sizeof f->owner);
        f->bytes = (size_t)num(e, "bytes");
        f->created_at = (int64_t)num(e, "created_at");
        char bytes[PATH_MAX];
        snprintf(bytes, sizeof bytes, "%s/files/%s", s->opts.finetune_dir, f->id);
        struct stat sb;
        if (f->id[0] && stat(bytes, &sb) == 0) ft->n_files++;
        else LOG_WARN("finetune", "file %s of the index has no bytes (%s): forgotten", f->id, bytes);
    }
    cJSON_ArrayForEach(e, jobs) {
        if (ft->n_jobs == FT_MAX_JOBS) break;
        struct ft_job *j = calloc(1, sizeof *j);
        if (!j) break;
        copy_str(e, "id", j->id, sizeof j->id);
        copy_str(e, "model", j->model, sizeof j->model);
        copy_str(e, "owner", j->owner, sizeof j->owner);
        upgraded += auth_owner_upgrade(s, j->owner, sizeof j->owner);
        copy_str(e, "training_file", j->training_file, sizeof j->training_file);
        copy_str(e, "validation_file", j->validation_file, sizeof j->validation_file);
        copy_str(e, "suffix", j->suffix, sizeof j->suffix);
        copy_str(e, "fine_tuned_model", j->fine_tuned, sizeof j->fine_tuned);
        copy_str(e, "error", j->error, sizeof j->error);
        j->n_epochs = (int)num(e, "n_epochs");
        j->batch_size = (int)num(e, "batch_size");
        j->lr_multiplier = num(e, "learning_rate_multiplier");
        j->seed = (uint64_t)num(e, "seed");
        j->created_at = (int64_t)num(e, "created_at");
        j->finished_at = (int64_t)num(e, "finished_at");
        j->trained_tokens = num(e, "trained_tokens");
        char state[16];
        copy_str(e, "state", state, sizeof state);
        j->state = FT_QUEUED;
        for (int k = 0; k <= FT_CANCELLED; k++)
            if (!strcmp(state, ft_state_names[k])) j->state = (enum ft_state)k;
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(e, "events"), *x;
        cJSON_ArrayForEach(x, ev) {
            if (j->n_events == FT_MAX_EVENTS) break;
            struct ft_event *v = &j->events[j->n_events++];
            v->created_at = (int64_t)num(x, "created_at");
            copy_str(x, "level", v->level, sizeof v->level);
            copy_str(x, "message", v->message, sizeof v->message);
        }
        if (!j->id[0] || !j->model[0]) {
            free(j);
            continue;
        }
        if (j->state == FT_RUNNING) j->state = FT_QUEUED; /* the worker resumes it */
        if (j->state == FT_SUCCEEDED && !cJSON_GetObjectItemCaseSensitive(e, "trained_tokens"))
            j->trained_tokens = ft_job_trained_tokens(s, j); /* an index written before the field */
        ft->jobs[ft->n_jobs++] = j;
    }
    cJSON_Delete(o);
    if (upgraded) {
        LOG_INFO("finetune", "%s: %d legacy owner(s) upgraded to their key's salted owner", path, upgraded);
        ft_store_save(s, ft); /* no thread uses ft yet */
    }
    return 0;
}

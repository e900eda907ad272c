/* engine/train/train_checkpoint.c - training checkpoints (train_checkpoint.h).
 * Tests: tests/test_train.sh. */
#include "train_checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "safetensors.h"
#include "train_checkpoint_ranks.h"

#define STATE_FILE TRAIN_STATE_FILE
#define STATE_FORMAT TRAIN_STATE_FORMAT

enum status train_checkpoint_make_dir(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: path too long", dir);
    for (char *p = path + 1;; p++) {
        const int end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST)
                return status_errorf(STATUS_IO, "%s: %s", path, strerror(errno));
            if (end) break;
            *p = '/';
        }
    }
    return STATUS_OK;
}

/* Removes a directory's files and then the directory (one level: checkpoints are flat). */
static void remove_flat_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

enum status train_checkpoint_remove(const char *dir)
{
    remove_flat_dir(dir);
    struct stat sb;
    if (stat(dir, &sb) == 0) return status_errorf(STATUS_IO, "%s: could not remove the checkpoint", dir);
    return STATUS_OK;
}

/* ---- the model's weights as the checkpoint writers' source --------------------------------- */

static struct tensor *find_weight(struct model_weights *w, int layer_first, enum weight_kind kind, int layer)
{
    struct weight_ref *t = malloc((size_t)weights_table_max(w->n_layers) * sizeof *t);
    CHECK(t, "out of host memory");
    const int n = weights_table(w, layer_first, 1, t);
    struct tensor *found = NULL;
    for (int i = 0; i < n && !found; i++)
        if (t[i].kind == kind && (t[i].layer == layer || t[i].layer < 0)) found = t[i].t;
    if (!found && kind == WEIGHT_KIND_LM_HEAD && w->tied) found = &w->tok_embedding;
    free(t);
    return found;
}

struct source_ctx {
    struct model *m;
    struct model_weights *master;
};

/* checkpoint_source_fn: the canonical f32 tensor of (kind, layer) from the master weights,
 * with the norm offset that loading added taken away again (Gemma stores w for x * (1 + w)). */
static enum status model_source(void *ctx, enum weight_kind kind, int layer, float *dst, int64_t n)
{
    struct source_ctx *sc = ctx;
    struct model *m = sc->m;
    struct tensor *t = find_weight(sc->master, m->layer_first, kind, layer);
    if (!t || tensor_numel(t) != n)
        return status_errorf(STATUS_INTERNAL, "checkpoint: the model has no %s tensor of %lld elements (layer %d)",
                             weight_kind_name(kind), (long long)n, layer);
    CHECK(t->dtype == DTYPE_F32, "f32 weights expected");
    backend_download(m->b, dst, t->data, (size_t)n * sizeof *dst);
    if (weight_kind_is_norm(kind) && m->cfg.norm_weight_offset != 0.0f)
        for (int64_t i = 0; i < n; i++) dst[i] -= m->cfg.norm_weight_offset;
    return STATUS_OK;
}

/* ---- the training state -------------------------------------------------------------------- */

struct state_item {
    struct backend *b;         /* NULL: the tensor is in host memory (a multi-rank gather) */
    const struct tensor *t;
};

static enum status fill_from_device(void *ctx, void *dst, size_t nbytes)
{
    const struct state_item *it = ctx;
    CHECK(nbytes == tensor_nbytes(it->t), "state tensor size");
    if (it->b) backend_download(it->b, dst, it->t->data, nbytes);
    else memcpy(dst, it->t->data, nbytes);
    return STATUS_OK;
}

/* The state of a parameter table: per row its two moments, and its f32 value when the model
 * file cannot hold it exactly (with_master), named "<group>/<row name>". b NULL: every tensor
 * is in host memory. */
static enum status write_state(const char *dir, struct backend *b, const struct param_table *params,
                               struct optimizer *opt, const struct train_state *st, int with_master)
{
    char path[4200], name[256], value[64];
    if (snprintf(path, sizeof path, "%s/" STATE_FILE, dir) >= (int)sizeof path)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: path too long", dir);
    CHECK(params->n == opt->n, "the moments were made for another table");
    struct state_item *items = malloc((params->n * 3 + 1) * sizeof *items);
    struct safetensors_writer *w = NULL;
    enum status s = STATUS_OK;
    if (!items) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "checkpoint: out of host memory");
    if ((s = safetensors_writer_begin(path, &w)) != STATUS_OK) goto out;
    size_t k = 0;
    for (size_t i = 0; i < params->n && s == STATUS_OK; i++) {
        const struct tensor *ts[3] = {&opt->m[i], &opt->v[i], params->p[i].t};
        const char *groups[3] = {"exp_avg", "exp_avg_sq", "master"};
        for (int g = 0; g < (with_master ? 3 : 2) && s == STATUS_OK; g++) {
            items[k] = (struct state_item){b, ts[g]};
            snprintf(name, sizeof name, "%s/%s", groups[g], params->p[i].name);
            s = safetensors_writer_add_deferred(w, name, DTYPE_F32, ts[g]->ndim, ts[g]->shape, fill_from_device,
                                                &items[k]);
            k++;
        }
    }
    const struct {
        const char *key;
        int64_t v;
    } meta[] = {
        {"iteration", st->iteration},
        {"consumed_tokens", st->consumed_tokens},
        {"data_epoch", st->cursor.epoch},
        {"data_index", st->cursor.index},
        {"optimizer_step", opt->step},
        {"loss_scale_growth_tracker", st->scaler.growth_tracker},
        {"loss_scale_hysteresis_left", st->scaler.hysteresis_left},
        {"skipped_iterations", st->scaler.skipped},
    };
    for (size_t i = 0; i < sizeof meta / sizeof meta[0] && s == STATUS_OK; i++) {
        snprintf(value, sizeof value, "%" PRId64, meta[i].v);
        s = safetensors_writer_set_metadata(w, meta[i].key, value);
    }
    snprintf(value, sizeof value, "%" PRIu64, st->cursor.seed);
    if (s == STATUS_OK) s = safetensors_writer_set_metadata(w, "seed", value);
    snprintf(value, sizeof value, "%.17g", st->scaler.scale);
    if (s == STATUS_OK) s = safetensors_writer_set_metadata(w, "loss_scale", value);
    if (s == STATUS_OK) s = safetensors_writer_set_metadata(w, "format", STATE_FORMAT);
    if (s == STATUS_OK) {
        s = safetensors_writer_finish(w);
        w = NULL;
    }
out:
    safetensors_writer_free(w);
    free(items);
    return s;
}

/* Moves every file of src into dst (each rename atomic), then removes src. */
static enum status move_files(const char *src, const char *dst)
{
    DIR *d = opendir(src);
    if (!d) return status_errorf(STATUS_IO, "%s: %s", src, strerror(errno));
    struct dirent *e;
    char a[4400], b[4400];
    enum status s = STATUS_OK;
    while (s == STATUS_OK && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(a, sizeof a, "%s/%s", src, e->d_name) >= (int)sizeof a ||
            snprintf(b, sizeof b, "%s/%s", dst, e->d_name) >= (int)sizeof b)
            s = status_errorf(STATUS_INVALID_ARGUMENT, "%s: path too long", dst);
        else if (rename(a, b) != 0) s = status_errorf(STATUS_IO, "rename %s -> %s: %s", a, b, strerror(errno));
    }
    closedir(d);
    if (s == STATUS_OK) rmdir(src);
    return s;
}

/* What a checkpoint holds besides the training state: the model (from master, or from a
 * multi-rank gather when `gathered`) or an adapter. */
struct ckpt_payload {
    struct model *m;
    struct model_weights *master;
    const struct lora *lora;
    const char *base_model;
    struct ckpt_gathered *gathered; /* rank 0 of a multi-rank save: the model and state in host memory */
};

static enum status write_payload(const char *dir, const struct ckpt_payload *p)
{
    if (p->lora) return lora_save_peft(p->lora, p->m, p->m->b, dir, p->base_model);
    struct source_ctx sc = {p->m, p->master};
    if (p->gathered) checkpoint_set_source(p->m->checkpoint, ckpt_gathered_source, p->gathered);
    else checkpoint_set_source(p->m->checkpoint, model_source, &sc);
    enum status s = checkpoint_write_hf(dir, p->m->checkpoint);
    checkpoint_set_source(p->m->checkpoint, NULL, NULL);
    return s;
}

enum status train_checkpoint_write_dir(const char *dir, enum status (*write)(void *ctx, const char *tmp), void *ctx)
{
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", dir) >= (int)sizeof tmp)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: path too long", dir);
    remove_flat_dir(tmp);
    enum status s = train_checkpoint_make_dir(tmp);
    if (s == STATUS_OK) s = write(ctx, tmp);
    if (s != STATUS_OK) {
        remove_flat_dir(tmp);
        return s;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (rename(tmp, dir) != 0) return status_errorf(STATUS_IO, "rename %s -> %s: %s", tmp, dir, strerror(errno));
        return STATUS_OK;
    }
    return move_files(tmp, dir);
}

struct save_ctx {
    const struct ckpt_payload *p;
    const struct param_table *params;
    struct optimizer *opt;
    const struct train_state *st;
    int with_master;
};

static enum status write_checkpoint(void *ctx, const char *tmp)
{
    const struct save_ctx *c = ctx;
    enum status s = write_payload(tmp, c->p);
    if (s == STATUS_OK && c->params)
        s = write_state(tmp, c->p->gathered ? NULL : c->p->m->b, c->params, c->opt, c->st, c->with_master);
    return s;
}

/* Writes payload and state as one directory (train_checkpoint_write_dir). */
static enum status save(const char *dir, const struct ckpt_payload *p, const struct param_table *params,
                        struct optimizer *opt, const struct train_state *st, int with_master)
{
    struct save_ctx c = {p, params, opt, st, with_master};
    enum status s = train_checkpoint_write_dir(dir, write_checkpoint, &c);
    if (s == STATUS_OK && st) LOG_INFO("train", "checkpoint %s written (iteration %lld)", dir, (long long)st->iteration);
    return s;
}

enum status train_checkpoint_save(const char *dir, struct model *m, struct model_weights *master,
                                  const struct param_table *params, struct optimizer *opt,
                                  const struct train_state *st)
{
    /* The model file holds the weights exactly only in f32 and without a norm offset. */
    const int with_master = m->checkpoint->cfg.dtype != DTYPE_F32 || m->cfg.norm_weight_offset != 0.0f;
    if (!ckpt_multi_rank(m)) {
        const struct ckpt_payload p = {.m = m, .master = master};
        return save(dir, &p, params, opt, st, with_master);
    }
    /* Many ranks: everything onto world rank 0, which writes the one-rank files from host memory
     * (its own model holds only its stage; config.json and the tokenizer come from its
     * checkpoint as above). */
    struct ckpt_gathered g;
    enum status s = ckpt_gather(m, master, params, opt, with_master, &g);
    if (s == STATUS_OK && m->par.world->rank == 0) {
        struct optimizer host_opt = {
            .n = g.params.n, .m = g.tensors + g.n, .v = g.tensors + 2 * g.n, .step = opt->step};
        const struct ckpt_payload p = {.m = m, .gathered = &g};
        s = save(dir, &p, &g.params, &host_opt, st, with_master);
    }
    ckpt_gathered_free(&g);
    return parallel_agree(m->par.world, s);
}

enum status train_checkpoint_save_adapter(const char *dir, struct model *m, const struct lora *lora,
                                          const char *base_model, const struct param_table *params,
                                          struct optimizer *opt, const struct train_state *st)
{
    if (ckpt_multi_rank(m))
        return status_errorf(STATUS_UNSUPPORTED,
                             "checkpoint: a LoRA checkpoint across ranks is gathered first (lora_ranks_save)");
    return train_checkpoint_save_adapter_whole(dir, m, lora, base_model, params, opt, st);
}

enum status train_checkpoint_save_adapter_whole(const char *dir, struct model *m, const struct lora *lora,
                                                const char *base_model, const struct param_table *params,
                                                struct optimizer *opt, const struct train_state *st)
{
    const struct ckpt_payload p = {.m = m, .lora = lora, .base_model = base_model};
    return save(dir, &p, params, opt, st, 0); /* the adapter file is f32: exact */
}

enum status train_checkpoint_write_model(const char *dir, struct model *m)
{
    if (ckpt_multi_rank(m))
        return status_errorf(STATUS_UNSUPPORTED,
                             "checkpoint: writing a model split over ranks is train_checkpoint_save's");
    const struct ckpt_payload p = {.m = m, .master = &m->w};
    return save(dir, &p, NULL, NULL, NULL, 0);
}

int64_t train_checkpoint_meta_i64(const struct safetensors *sf, const char *key, int *ok)
{
    const char *v = safetensors_metadata(sf, key);
    char *end = NULL;
    if (!v) {
        *ok = 0;
        return 0;
    }
    long long x = strtoll(v, &end, 10);
    if (!end || *end) *ok = 0;
    return (int64_t)x;
}

/* Reads one group of the state into dst (row for row with params; NULL: the parameters
 * themselves). A weight's row takes its (tp_rank, tp_size) slice of the canonical tensor;
 * other rows (LoRA's) are read whole. */
static enum status read_group(struct safetensors *sf, const char *path, struct model *m, const char *group,
                              const struct param_table *params, const struct tensor *dst, int required)
{
    char name[256];
    enum weight_kind kind;
    int layer;
    float *slice = NULL;
    enum status s = STATUS_OK;
    for (size_t i = 0; i < params->n && s == STATUS_OK; i++) {
        snprintf(name, sizeof name, "%s/%s", group, params->p[i].name);
        const struct st_tensor *t = safetensors_find(sf, name);
        const struct tensor *d = dst ? &dst[i] : params->p[i].t;
        /* Tied embeddings at pp > 1: the last stage's LM head is its own copy of the embedding
         * (kept equal by the trainer), one tensor in the file. */
        if (!t && m->cfg.tied_embeddings && ckpt_param_kind(params->p[i].name, &kind, &layer) &&
            kind == WEIGHT_KIND_LM_HEAD) {
            snprintf(name, sizeof name, "%s/%s/-1", group, weight_kind_name(WEIGHT_KIND_TOK_EMBEDDING));
            t = safetensors_find(sf, name);
        }
        const int64_t n = tensor_numel(d);
        if (!t) {
            if (!required) break;
            s = status_errorf(STATUS_BAD_FORMAT, "%s: no tensor %s", path, name);
        } else if (ckpt_param_kind(params->p[i].name, &kind, &layer)) {
            int shard_rank, shard_size; /* the ep group's slice for experts under --ep */
            model_shard_of(m, kind, layer, &shard_rank, &shard_size);
            float *grown = realloc(slice, (size_t)n * sizeof *slice + 1);
            if (!grown) s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "checkpoint: out of host memory");
            else if ((s = ckpt_state_slice(m->checkpoint, t, path, kind, layer, shard_rank, shard_size, slice = grown,
                                           n)) == STATUS_OK)
                backend_upload(m->b, d->data, slice, (size_t)n * sizeof *slice);
        } else if (t->dtype != DTYPE_F32 || t->numel != n) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: tensor %s has %lld elements, the model %lld", path, name,
                              (long long)t->numel, (long long)n);
        } else {
            backend_upload(m->b, d->data, t->data, t->nbytes);
        }
    }
    free(slice);
    return s;
}

enum status train_checkpoint_iteration(const char *dir, int64_t *iteration)
{
    char path[4200];
    if (snprintf(path, sizeof path, "%s/" STATE_FILE, dir) >= (int)sizeof path)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: path too long", dir);
    struct safetensors *sf = NULL;
    enum status s = safetensors_open(path, &sf);
    if (s != STATUS_OK) return s;
    const char *fmt = safetensors_metadata(sf, "format");
    int ok = fmt && !strcmp(fmt, STATE_FORMAT);
    *iteration = train_checkpoint_meta_i64(sf, "iteration", &ok);
    safetensors_close(sf);
    return ok ? STATUS_OK : status_errorf(STATUS_BAD_FORMAT, "%s: not a shardlm training state", path);
}

enum status train_checkpoint_check_kind(const char *dir, int eagle)
{
    char path[4200];
    if (snprintf(path, sizeof path, "%s/" STATE_FILE, dir) >= (int)sizeof path)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: path too long", dir);
    struct safetensors *sf = NULL;
    if (safetensors_open(path, &sf) != STATUS_OK) return STATUS_OK; /* the load names what is missing */
    const char *kind = safetensors_metadata(sf, "trained");
    const int is_eagle = kind && !strcmp(kind, "eagle_head");
    safetensors_close(sf);
    if (is_eagle && !eagle)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--resume %s: an EAGLE head's checkpoint: continue it with "
                             "--eagle-head --model (the model it drafts for)", dir);
    if (!is_eagle && eagle)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--resume %s: a model's training checkpoint, not an EAGLE head's",
                             dir);
    return STATUS_OK;
}

enum status train_checkpoint_load_state(const char *dir, struct model *m, const struct param_table *params,
                                        struct optimizer *opt, struct train_state *st)
{
    char path[4200];
    if (snprintf(path, sizeof path, "%s/" STATE_FILE, dir) >= (int)sizeof path)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: path too long", dir);
    struct safetensors *sf = NULL;
    enum status s = safetensors_open(path, &sf);
    if (s != STATUS_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", status_message()); /* status_errorf reuses the buffer */
        return status_errorf(s, "--resume %s: no training state: %s", dir, why);
    }
    const char *fmt = safetensors_metadata(sf, "format");
    int ok = fmt && !strcmp(fmt, STATE_FORMAT);
    st->iteration = train_checkpoint_meta_i64(sf, "iteration", &ok);
    st->consumed_tokens = train_checkpoint_meta_i64(sf, "consumed_tokens", &ok);
    st->cursor.epoch = train_checkpoint_meta_i64(sf, "data_epoch", &ok);
    st->cursor.index = train_checkpoint_meta_i64(sf, "data_index", &ok);
    st->cursor.seed = (uint64_t)train_checkpoint_meta_i64(sf, "seed", &ok);
    const int64_t step = train_checkpoint_meta_i64(sf, "optimizer_step", &ok);
    int ok_scaler = 1; /* absent in f32 runs' states written before fp16 existed: defaults */
    const int64_t growth = train_checkpoint_meta_i64(sf, "loss_scale_growth_tracker", &ok_scaler);
    const int64_t hyst = train_checkpoint_meta_i64(sf, "loss_scale_hysteresis_left", &ok_scaler);
    const int64_t skipped = train_checkpoint_meta_i64(sf, "skipped_iterations", &ok_scaler);
    const char *scale = safetensors_metadata(sf, "loss_scale");
    if (ok_scaler && scale) {
        st->scaler.growth_tracker = (int)growth;
        st->scaler.hysteresis_left = (int)hyst;
        st->scaler.skipped = skipped;
        st->scaler.scale = strtod(scale, NULL);
    }
    if (!ok) s = status_errorf(STATUS_BAD_FORMAT, "%s: not a shardlm training state (format %s)", path, fmt ? fmt : "none");
    if (s == STATUS_OK && (s = read_group(sf, path, m, "exp_avg", params, opt->m, 1)) == STATUS_OK &&
        (s = read_group(sf, path, m, "exp_avg_sq", params, opt->v, 1)) == STATUS_OK)
        s = read_group(sf, path, m, "master", params, NULL, 0);
    opt->step = step;
    safetensors_close(sf);
    return s;
}

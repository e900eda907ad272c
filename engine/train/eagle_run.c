/* engine/train/eagle_run.c - `shardlm train --eagle-head` (eagle_train.h eagle_train_run): the
 * data, the frozen model's rows cached per example, the loop, its metrics and checkpoints, over
 * the trainer of eagle_train.c.
 * Tests: tests/test_train_eagle.py. */
#include "eagle_train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eagle_head.h"
#include "out_dir.h"
#include "safetensors.h"
#include "tokenizer.h"
#include "train_checkpoint.h"

#define MODULE "train"

struct eagle_run {
    const struct train_options *o;
    struct backend *b;
    struct model *m;
    struct tokenizer *tok;
    struct eagle_trainer *e;
    struct train_dataset train, eval;
    struct micro_batch *mbs;
    int num_micro;
    int32_t *targets;              /* (num_micro, micro x seq): the head's targets of each micro-batch */
    FILE *metrics;
    /* The frozen model's rows of each training example, kept after the first epoch computed them
     * (a document's rows depend on it alone): later epochs train the head without its forward.
     * Up to cache_cap bytes of host memory (SHARDLM_EAGLE_FEATURE_CACHE_MB, 8192 by default). */
    float **cache;                 /* (train.n): an example's rows, or NULL */
    float *rows;                   /* (micro x seq, d): a micro-batch's rows */
    size_t cache_bytes, cache_cap;
    int64_t forwards, skipped;     /* micro-batches that ran the frozen model, that read the cache */
    struct eagle_progress progress; /* iterations done and the data's cursor (from --resume) */
};

static struct train_batch batch_of(const struct micro_batch *mb)
{
    return (struct train_batch){.n_tokens = mb->n_tokens, .tokens = mb->tokens, .targets = mb->targets,
                                .positions = mb->positions, .n_docs = mb->n_docs, .doc_start = mb->doc_start};
}

/* --resume: the checkpoint's settings (eagle_checkpoint_settings) replace *set, the command line's;
 * one given there with another value is refused: a resumed run continues the same training (a new
 * run with --eagle-init changes them). A checkpoint without them keeps *set. */
static enum status resume_settings(const struct train_options *o, struct eagle_settings *set)
{
    struct eagle_settings was;
    int found = 0;
    enum status st = eagle_checkpoint_settings(o->resume_dir, &was, &found);
    if (st != STATUS_OK || !found) return st;
    const struct {
        const char *flag;
        unsigned given;
        double now, then;
    } s[] = {{"--eagle-feature-loss", EAGLE_GIVEN_FEATURE_LOSS, set->feature_loss, was.feature_loss},
             {"--eagle-feature-noise", EAGLE_GIVEN_FEATURE_NOISE, set->feature_noise, was.feature_noise}};
    if ((o->eagle_given & EAGLE_GIVEN_UNROLL) && !was.unroll)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--resume %s: the run trained without --eagle-unroll: a resumed "
                             "run continues the same training (--eagle-init starts a new one from the head)",
                             o->resume_dir);
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
        if ((o->eagle_given & s[i].given) && s[i].now != s[i].then)
            return status_errorf(STATUS_INVALID_ARGUMENT, "--resume %s: the run trained with %s %g, %g given: a resumed "
                                 "run continues the same training (--eagle-init starts a new one from the head)",
                                 o->resume_dir, s[i].flag, s[i].then, s[i].now);
    *set = was;
    LOG_INFO(MODULE, "resuming with the checkpoint's settings: --eagle-feature-loss %g, --eagle-feature-noise %g%s",
             (double)was.feature_loss, (double)was.feature_noise, was.unroll ? ", --eagle-unroll" : "");
    return STATUS_OK;
}

static enum status run_setup(struct eagle_run *r)
{
    const struct train_options *o = r->o;
    if (o->tp > 1 || o->pp > 1 || o->lora_rank > 0 || o->precision != TRAIN_PRECISION_F32 ||
        o->distributed_optimizer || o->ep > 1 || o->moe_aux_loss_coeff != 0.0f || o->moe_z_loss_coeff != 0.0f ||
        o->moe_router_bias_update_rate != 0.0f || o->pp_layers ||
        o->memory.recompute != TRAIN_RECOMPUTE_NONE || o->memory.sequence_parallel)
        return status_errorf(STATUS_UNSUPPORTED, "--eagle-head trains one head on one rank in f32: it takes none of "
                             "--tp, --pp, --pp-layers, --ep, --lora-rank, --bf16/--fp16, --use-distributed-optimizer, "
                             "--sequence-parallel, --recompute-*, the --moe-* losses");
    if (o->resume_dir && o->eagle_init)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--resume continues a head's run: --eagle-init does not apply");
    if (o->micro_batch_size < 1 || o->global_batch_size < 1 || o->global_batch_size % o->micro_batch_size)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "--global-batch-size (%d) must be a positive multiple of --micro-batch-size (%d)",
                             o->global_batch_size, o->micro_batch_size);
    if (o->train_iters <= 0 && o->epochs <= 0) return status_errorf(STATUS_INVALID_ARGUMENT, "give --train-iters or --epochs");
    if (o->seq_length < 2) return status_errorf(STATUS_INVALID_ARGUMENT, "--seq-length must be at least 2");
    r->num_micro = o->global_batch_size / o->micro_batch_size;
    enum status st = out_dir_check(o->out_dir, o->model_dir, o->resume_dir, o->overwrite_out);
    if (st == STATUS_OK && o->overwrite_out) st = out_dir_clear_checkpoints(o->out_dir, o->resume_dir);
    if (st == STATUS_OK) st = train_checkpoint_make_dir(o->out_dir);
    if (st == STATUS_OK) st = backend_open(o->device, 0, o->threads, &r->b);
    if (st == STATUS_OK) st = model_load_as(o->model_dir, r->b, NULL, DTYPE_F32, &r->m);
    if (st != STATUS_OK) return st;
    const struct checkpoint *ck = r->m->checkpoint;
    if ((st = tokenizer_load_for_model(o->model_dir, ck->tokenizer_proto, ck->tokenizer_proto_n, r->m->cfg.vocab_size,
                                       &r->tok)) != STATUS_OK)
        return st;
    r->mbs = calloc((size_t)r->num_micro, sizeof *r->mbs);
    r->targets = malloc((size_t)r->num_micro * (size_t)o->micro_batch_size * (size_t)o->seq_length * sizeof *r->targets);
    if (!r->mbs || !r->targets) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of memory");
    for (int i = 0; i < r->num_micro; i++)
        if ((st = micro_batch_init(&r->mbs[i], o->micro_batch_size, o->seq_length)) != STATUS_OK) return st;
    if ((st = train_load_data(o, o->model_dir, r->m, r->tok, &r->train, &r->eval)) != STATUS_OK) return st;
    int32_t *map = NULL;
    int n_map = 0;
    if (o->eagle_token_map &&
        (st = draft_token_map_read(o->eagle_token_map, r->m->cfg.vocab_size, &map, &n_map)) != STATUS_OK)
        return st;
    int ffn = o->eagle_ffn;
    struct safetensors *init = NULL;
    char resumed[4400];
    const char *init_path = o->eagle_init;
    if (o->resume_dir) { /* the MLP's size from the head continued */
        snprintf(resumed, sizeof resumed, "%s/" EAGLE_HEAD_FILE, o->resume_dir);
        init_path = resumed;
    }
    if (init_path && (st = safetensors_open(init_path, &init)) != STATUS_OK) {
        free(map);
        return status_errorf(st, "%s %s: %s", o->resume_dir ? "--resume" : "--eagle-init", init_path, status_message());
    }
    const char *map_from = o->eagle_token_map;
    if (init && !map) { /* a head continued keeps the token map it carries unless --spec-token-map gives one */
        char what[4500];
        snprintf(what, sizeof what, "%s %s", o->resume_dir ? "--resume" : "--eagle-init", init_path);
        if ((st = eagle_head_token_map(init, what, r->m->cfg.vocab_size, &map, &n_map)) != STATUS_OK) {
            safetensors_close(init);
            return st;
        }
        map_from = map ? init_path : NULL;
    }
    const struct st_tensor *up = init ? safetensors_find(init, "layers.0.mlp.up_proj.weight") : NULL;
    if (ffn == 0 && up && up->ndim == 2 && up->shape[0] > 0 && up->shape[0] <= (1 << 20))
        ffn = (int)up->shape[0]; /* the MLP of the head continued */
    st = eagle_trainer_new(r->m, ffn, o->micro_batch_size * o->seq_length, &o->opt, o->seed, map, n_map, &r->e);
    free(map);
    char what[4500];
    snprintf(what, sizeof what, "--eagle-init %s", o->eagle_init ? o->eagle_init : "");
    if (st == STATUS_OK && o->eagle_init) st = eagle_trainer_load(r->e, init, what);
    safetensors_close(init);
    if (st != STATUS_OK) return st;
    struct eagle_settings set = {o->eagle_feature_loss, o->eagle_feature_noise, o->eagle_unroll};
    if (o->resume_dir && (st = resume_settings(o, &set)) != STATUS_OK) return st;
    eagle_trainer_set_feature_loss(r->e, set.feature_loss);
    eagle_trainer_set_feature_noise(r->e, set.feature_noise, o->seed);
    if ((st = eagle_trainer_set_unroll(r->e, set.unroll)) != STATUS_OK) return st;
    r->progress = (struct eagle_progress){.cursor = {.seed = o->seed}};
    if (o->resume_dir) { /* the head, AdamW's moments, the cursor and the noise's stream where they were */
        if ((st = eagle_trainer_load_checkpoint(r->e, o->resume_dir, &r->progress)) != STATUS_OK) return st;
        LOG_INFO(MODULE, "resuming the head of %s at iteration %lld", o->resume_dir, (long long)r->progress.iteration);
    }
    if (n_map > 0)
        LOG_INFO(MODULE, "the head's logits over the %d tokens of %s (of %d), written into the head as its "
                 EAGLE_HEAD_TOKEN_MAP " (served without --spec-token-map)", n_map, map_from, r->m->cfg.vocab_size);
    const char *cap = getenv("SHARDLM_EAGLE_FEATURE_CACHE_MB");
    r->cache_cap = (size_t)(cap && *cap ? atol(cap) : 8192) << 20;
    r->cache = calloc(r->train.n, sizeof *r->cache);
    r->rows = malloc((size_t)o->micro_batch_size * (size_t)o->seq_length * (size_t)r->m->cfg.d_model * sizeof *r->rows);
    if (!r->cache || !r->rows) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of memory");
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
    const char *mp = o->metrics_path ? o->metrics_path : path;
    if (!(r->metrics = fopen(mp, o->resume_dir ? "a" : "w"))) return status_errorf(STATUS_IO, "%s: cannot open the metrics file", mp);
    LOG_INFO(MODULE, "EAGLE head for %s: one layer (d_model %d, MLP %d), %lld parameters trained; the model frozen",
             r->m->cfg.architecture, r->m->cfg.d_model, o->eagle_ffn > 0 ? o->eagle_ffn : r->m->cfg.ffn_hidden,
             (long long)param_table_numel(eagle_trainer_params(r->e)));
    return STATUS_OK;
}

/* The head's mean loss over eval_iters micro-batches of the held-out set, from its start. */
static enum status run_eval(struct eagle_run *r, double *loss, int64_t *n)
{
    const struct train_options *o = r->o;
    struct data_cursor cur = {.seed = o->seed};
    double sum = 0.0;
    *n = 0;
    for (int i = 0; i < o->eval_iters && cur.epoch == 0; i++) {
        data_next_micro_batch(&r->eval, &cur, o->micro_batch_size, o->seq_length, &r->mbs[0]);
        if (r->mbs[0].n_tokens == 0) continue;
        const struct train_batch tb = batch_of(&r->mbs[0]);
        double ls = 0.0;
        int nr = 0;
        eagle_head_targets(r->e, &tb, r->targets);
        enum status st = eagle_trainer_micro(r->e, &tb, r->targets, 0.0f, 0, NULL, NULL, &ls, &nr);
        if (st != STATUS_OK) return st;
        sum += ls;
        *n += nr;
    }
    *loss = *n > 0 ? sum / (double)*n : 0.0;
    return STATUS_OK;
}

/* Whether the cache holds every document of mb. */
static int all_cached(const struct eagle_run *r, const struct micro_batch *mb)
{
    for (int d = 0; d < mb->n_docs; d++)
        if (!r->cache[mb->doc_example[d]]) return 0;
    return 1;
}

/* Keeps the rows of mb's documents that the cache does not hold yet (r->rows: the frozen model's
 * rows of mb), while it has room: an example's first rows stay. */
static void cache_rows(struct eagle_run *r, const struct micro_batch *mb)
{
    const size_t D = (size_t)r->m->cfg.d_model;
    for (int d = 0; d < mb->n_docs; d++) {
        const int64_t ex = mb->doc_example[d];
        const size_t bytes = (size_t)(mb->doc_start[d + 1] - mb->doc_start[d]) * D * sizeof *r->rows;
        if (r->cache[ex] || r->cache_bytes + bytes > r->cache_cap || !(r->cache[ex] = malloc(bytes))) continue;
        memcpy(r->cache[ex], r->rows + (size_t)mb->doc_start[d] * D, bytes);
        r->cache_bytes += bytes;
    }
}

/* One training micro-batch, its features from the cache when every document's are there, else
 * from the frozen model's forward (then kept while the cache has room). */
static enum status run_micro(struct eagle_run *r, const struct micro_batch *mb, const int32_t *targets, float scale,
                             double *loss)
{
    const size_t D = (size_t)r->m->cfg.d_model;
    const struct train_batch tb = batch_of(mb);
    const int cached = all_cached(r, mb);
    for (int d = 0; d < mb->n_docs && cached; d++)
        memcpy(r->rows + (size_t)mb->doc_start[d] * D, r->cache[mb->doc_example[d]],
               (size_t)(mb->doc_start[d + 1] - mb->doc_start[d]) * D * sizeof *r->rows);
    int nr = 0;
    enum status st = eagle_trainer_micro(r->e, &tb, targets, scale, 1, cached ? r->rows : NULL,
                                         cached ? NULL : r->rows, loss, &nr);
    if (st != STATUS_OK) return st;
    if (cached) {
        r->skipped++;
        return STATUS_OK;
    }
    r->forwards++;
    cache_rows(r, mb);
    return STATUS_OK;
}

/* A resumed run's cache as the straight run's was at its checkpoint: the iterations before it
 * replayed from the run's first micro-batch, the frozen model run for each micro-batch that
 * run_micro would have run it for, and its rows kept by the same rule. A row depends in its last
 * bits on the micro-batch it was computed in (how many rows the products hold: measured on an
 * AVX2-only CPU), so rows computed again in a later epoch's micro-batches would not be the ones
 * the straight run read from its cache, and the resumed run would not repeat it bit for bit. Costs
 * the frozen model's forwards of those iterations (their first pass), not the head's work. */
static enum status refill_cache(struct eagle_run *r)
{
    const struct train_options *o = r->o;
    const size_t cap = (size_t)o->micro_batch_size * (size_t)o->seq_length;
    struct data_cursor cur = {.seed = o->seed};
    for (int64_t it = 0; it < r->progress.iteration; it++) {
        int64_t targets = 0;
        for (int i = 0; i < r->num_micro; i++) {
            data_next_micro_batch(&r->train, &cur, o->micro_batch_size, o->seq_length, &r->mbs[i]);
            const struct train_batch tb = batch_of(&r->mbs[i]);
            targets += tb.n_tokens > 0 ? eagle_head_targets(r->e, &tb, r->targets + (size_t)i * cap) : 0;
        }
        for (int i = 0; i < r->num_micro && targets > 0; i++) {
            if (r->mbs[i].n_tokens == 0 || all_cached(r, &r->mbs[i])) continue;
            const struct train_batch tb = batch_of(&r->mbs[i]);
            enum status st = eagle_trainer_features(r->e, &tb, r->rows);
            if (st != STATUS_OK) return st;
            cache_rows(r, &r->mbs[i]);
        }
    }
    if (cur.seed != r->progress.cursor.seed || cur.epoch != r->progress.cursor.epoch ||
        cur.index != r->progress.cursor.index)
        return status_errorf(STATUS_FAILED_PRECONDITION, "--resume: the checkpoint's data cursor (epoch %lld, index %lld) "
                             "is not where %lld iterations of this data and these options end (epoch %lld, index %lld)",
                             (long long)r->progress.cursor.epoch, (long long)r->progress.cursor.index,
                             (long long)r->progress.iteration, (long long)cur.epoch, (long long)cur.index);
    LOG_INFO(MODULE, "--resume: the frozen model's rows of the first %lld iterations computed again for the cache "
             "(%.1f MiB)", (long long)r->progress.iteration, (double)r->cache_bytes / 1048576.0);
    return STATUS_OK;
}

static enum status run_loop(struct eagle_run *r)
{
    const struct train_options *o = r->o;
    struct optimizer_options opt = o->opt;
    const int64_t iters = o->train_iters > 0 ? o->train_iters
                                             : train_iters_for_epochs(o, &r->train, r->num_micro, &r->mbs[0]);
    if (opt.decay_iters <= 0) opt.decay_iters = iters;
    struct data_cursor *cur = &r->progress.cursor;
    const size_t cap = (size_t)o->micro_batch_size * (size_t)o->seq_length;
    const double t0 = base_now_s();
    LOG_INFO(MODULE, "%lld iterations of %d packed sequences of up to %d tokens", (long long)iters,
             o->global_batch_size, o->seq_length);
    for (int64_t it = r->progress.iteration; it < iters; it++) {
        int64_t targets = 0, tokens = 0;
        for (int i = 0; i < r->num_micro; i++) {
            data_next_micro_batch(&r->train, cur, o->micro_batch_size, o->seq_length, &r->mbs[i]);
            const struct train_batch tb = batch_of(&r->mbs[i]);
            tokens += tb.n_tokens;
            targets += tb.n_tokens > 0 ? eagle_head_targets(r->e, &tb, r->targets + (size_t)i * cap) : 0;
        }
        eagle_trainer_zero_grads(r->e);
        double loss = 0.0;
        for (int i = 0; i < r->num_micro && targets > 0; i++) {
            if (r->mbs[i].n_tokens == 0) continue;
            double ls = 0.0;
            enum status st = run_micro(r, &r->mbs[i], r->targets + (size_t)i * cap, (float)(1.0 / (double)targets), &ls);
            if (st != STATUS_OK) return st;
            loss += ls;
        }
        const double lr = optimizer_lr(&opt, it), mean = targets > 0 ? loss / (double)targets : 0.0;
        const double norm = targets > 0 ? eagle_trainer_step(r->e, lr) : 0.0;
        if (!isfinite(mean) || !isfinite(norm))
            return status_errorf(STATUS_INTERNAL, "iteration %lld: the loss (%g) or the gradient norm (%g) is not finite",
                                 (long long)it + 1, mean, norm);
        const double el = base_now_s() - t0;
        fprintf(r->metrics, "{\"iter\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, \"tokens\": %lld, "
                "\"targets\": %lld, \"elapsed_s\": %.3f}\n", (long long)it + 1, mean, lr, norm, (long long)tokens,
                (long long)targets, el);
        fflush(r->metrics);
        if (o->log_interval > 0 && ((it + 1) % o->log_interval == 0 || it + 1 == iters))
            LOG_INFO(MODULE, "iteration %lld/%lld: head loss %.4f, lr %.3g, grad norm %.3f (%.1f s)", (long long)it + 1,
                     (long long)iters, mean, lr, norm, el);
        const int last = it + 1 == iters;
        if (r->eval.n > 0 && o->eval_iters > 0 && (last || (o->eval_interval > 0 && (it + 1) % o->eval_interval == 0))) {
            double el_loss = 0.0;
            int64_t n = 0;
            enum status st = run_eval(r, &el_loss, &n);
            if (st != STATUS_OK) return st;
            fprintf(r->metrics, "{\"iter\": %lld, \"eval_loss\": %.6f, \"eval_ppl\": %.4f, \"eval_targets\": %lld}\n",
                    (long long)it + 1, el_loss, exp(el_loss), (long long)n);
            LOG_INFO(MODULE, "iteration %lld: held-out head loss %.4f over %lld targets", (long long)it + 1, el_loss,
                     (long long)n);
        }
        r->progress.iteration = it + 1;
        const int stop = o->stop_signal && *o->stop_signal && !last;
        if (stop || (o->save_interval > 0 && (it + 1) % o->save_interval == 0 && !last)) {
            char dir[4200];
            snprintf(dir, sizeof dir, "%s/checkpoints/iter_%07lld", o->out_dir, (long long)it + 1);
            enum status st = eagle_trainer_save_checkpoint(r->e, dir, &r->progress);
            if (st == STATUS_OK) st = out_dir_prune(o->out_dir, o->keep_checkpoints);
            if (st != STATUS_OK) return st;
            if (stop)
                return status_errorf(STATUS_CANCELLED, "stopped by a signal after iteration %lld of %lld; checkpoint %s "
                                     "written (continue with --resume %s)", (long long)it + 1, (long long)iters, dir,
                                     o->out_dir);
        }
    }
    LOG_INFO(MODULE, "the frozen model ran %lld micro-batches; %lld read its rows from the cache (%.1f MiB)",
             (long long)r->forwards, (long long)r->skipped, (double)r->cache_bytes / 1048576.0);
    return STATUS_OK;
}

enum status eagle_train_run(const struct train_options *o)
{
    struct eagle_run r = {.o = o};
    enum status st = run_setup(&r);
    if (st == STATUS_OK && o->resume_dir) st = refill_cache(&r);
    if (st == STATUS_OK) st = run_loop(&r);
    char path[4200];
    snprintf(path, sizeof path, "%s/" EAGLE_HEAD_FILE, o->out_dir);
    if (st == STATUS_OK) st = eagle_trainer_save_checkpoint(r.e, o->out_dir, &r.progress); /* the head and its state */
    if (st == STATUS_OK) LOG_INFO(MODULE, "wrote %s (serve it with --speculative eagle --draft-model %s)", path, path);
    char why[1024] = "";
    if (st != STATUS_OK) snprintf(why, sizeof why, "%s", status_message());
    if (r.metrics) fclose(r.metrics);
    eagle_trainer_free(r.e);
    for (int i = 0; r.mbs && i < r.num_micro; i++) micro_batch_free(&r.mbs[i]);
    free(r.mbs);
    free(r.targets);
    for (size_t i = 0; r.cache && i < r.train.n; i++) free(r.cache[i]);
    free(r.cache);
    free(r.rows);
    data_free(&r.train);
    data_free(&r.eval);
    tokenizer_free(r.tok);
    model_free(r.m);
    if (r.b) backend_close(r.b);
    if (st != STATUS_OK) return status_errorf(st, "%s", why);
    return STATUS_OK;
}

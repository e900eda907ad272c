/* engine/train/eagle_train.c - an EAGLE-1 head trained on a frozen model's features
 * (eagle_train.h): the trainer, its head's file and its checkpoints. The command's loop is
 * eagle_run.c.
 * Tests: tests/test_train_eagle.py. */
#include "eagle_train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eagle_head.h"
#include "safetensors.h"
#include "train_checkpoint.h"

#define MODULE "train"
#define EAGLE_ALLOCS 32

struct eagle_trainer {
    struct backend *b;
    struct model *target;          /* frozen, borrowed */
    struct model_train *tt;        /* its passes: the features only */
    struct model *h;               /* the head: one layer, the target's ends */
    struct model_train *ht;
    struct model_weights trained;  /* the head's layer alone: what the table lists (no ends) */
    struct model_weights grads;    /* like trained */
    void *grads_mem;
    struct tensor g_fc_emb, g_fc_feat, g_fc_bias;
    struct param_table params, gparams;
    struct optimizer opt;
    struct tensor emb, feat, x0, tmp; /* (max_tokens, d): the fc's inputs, output, scratch */
    struct tensor tokens, ids;     /* int32 (max_tokens), (max rows of a layer's matrix) */
    float *host;                   /* (max_tokens, d): the frozen model's rows on the host */
    float *shifted;                /* (max_tokens, d): the features (row p: the model's row p - 1) */
    float *head_rows;              /* (max_tokens, d): the head's output rows (feature loss) */
    float *self_rows;              /* (max_tokens, d): the first pass's output rows (--eagle-unroll;
                                      allocated by eagle_trainer_set_unroll) */
    int unroll;                    /* eagle_trainer_set_unroll */
    float feature_weight;          /* > 0: the feature regression's weight (eagle_trainer_set_feature_loss) */
    float noise;                   /* > 0: the features' noise, a fraction of each row's rms */
    uint64_t noise_seed, noise_calls; /* eagle_trainer_set_feature_noise; training micro-batches so far */
    struct tensor extra;           /* (max_tokens, d): its gradient, on the device */
    int32_t *row_of;               /* (vocab): a token's row of the head's logits, -1 outside the map */
    struct tensor cut;             /* with a map: the LM head's rows of its tokens, f32 */
    int max_tokens;
    void *mem[EAGLE_ALLOCS];
    int n_mem;
};

static enum status alloc(struct eagle_trainer *e, struct tensor *t, enum dtype dtype, int64_t rows, int64_t cols)
{
    if (e->n_mem == EAGLE_ALLOCS) return status_errorf(STATUS_INTERNAL, "eagle trainer: too many allocations");
    const int64_t shape[2] = {rows, cols};
    enum status st = backend_alloc_tensor(e->b, t, dtype, cols > 0 ? 2 : 1, shape);
    if (st == STATUS_OK) e->mem[e->n_mem++] = t->data;
    return st;
}

/* A splitmix64 stream and its normal deviates (Box-Muller): the weights the target cannot give. */
static double uniform01(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) / 9007199254740992.0;
}

/* The features' noise: u in [-1, 1) for (seed, micro-batch, row, column), a splitmix64 finalizer of
 * their mix (eagle_train.h; tests/test_train_eagle.py computes the same). */
static double noise_u(uint64_t seed, uint64_t call, uint64_t p, uint64_t j)
{
    uint64_t z = seed ^ (call * 0x9E3779B97F4A7C15ull) ^ (p * 0xC2B2AE3D27D4EB4Full) ^ (j * 0x165667B19E3779F9ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 4503599627370496.0 - 1.0; /* 2^52 */
}

/* dst := the target's tensor src times scale where src has dst's shape (any float or block dtype:
 * the rows are read as the embedding lookup reads a table), else N(0, 0.02) (a matrix) or ones (a
 * norm). */
static void init_from(struct eagle_trainer *e, const struct tensor *dst, const struct tensor *src, float scale,
                      uint64_t *rng)
{
    struct backend *b = e->b;
    const int64_t n = tensor_numel(dst), rows = tensor_rows(dst);
    if (src && src->data && src->ndim == dst->ndim && tensor_rows(src) == rows && tensor_cols(src) == tensor_cols(dst)) {
        if (dst->ndim == 2) {
            struct tensor ids = tensor_first_rows(&e->ids, rows);
            op_embedding(b, dst, src, &ids, 0);
        } else if (src->dtype == dst->dtype) {
            backend_copy(b, dst->data, src->data, tensor_nbytes(dst));
        } else {
            op_cast(b, dst, src);
        }
        if (scale != 1.0f) op_scale(b, dst, dst, scale);
        return;
    }
    float *v = malloc((size_t)n * sizeof *v);
    CHECK(v, "eagle trainer: out of host memory");
    for (int64_t i = 0; i < n; i++)
        v[i] = dst->ndim == 1 ? 1.0f
                              : (float)(0.02 * sqrt(-2.0 * log(uniform01(rng))) * cos(6.283185307179586 * uniform01(rng)));
    backend_upload(b, dst->data, v, (size_t)n * sizeof *v);
    free(v);
}

/* The head's weights and where they start: the target's last layer, its output projections
 * damped, and the fc the identity on the feature half (tools/eagle_probe.py's start). */
static enum status head_weights(struct eagle_trainer *e, uint64_t seed)
{
    struct model *h = e->h;
    const struct model_config *c = &h->cfg;
    const int64_t D = c->d_model, hq = (int64_t)c->n_heads * c->head_dim, hkv = (int64_t)c->n_kv_heads * c->head_dim;
    const int64_t F = c->ffn_hidden;
    struct layer_weights *w = &h->w.layers[0];
    const struct layer_weights *src = &e->target->w.layers[e->target->n_layers_local - 1];
    const struct {
        struct tensor *t;
        const struct tensor *src;
        int64_t rows, cols;
        float scale;
    } list[] = {
        {&w->wq, &src->wq, hq, D, 1.0f}, {&w->wk, &src->wk, hkv, D, 1.0f}, {&w->wv, &src->wv, hkv, D, 1.0f},
        {&w->wo, &src->wo, D, hq, 0.05f}, {&w->mlp_norm, &src->mlp_norm, D, 0, 1.0f},
        {&w->w_gate, &src->w_gate, F, D, 1.0f}, {&w->w_up, &src->w_up, F, D, 1.0f},
        {&w->w_down, &src->w_down, D, F, 0.05f},
    };
    int64_t most = D;
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) most = list[i].rows > most ? list[i].rows : most;
    enum status st = alloc(e, &e->ids, DTYPE_I32, most, 0);
    int32_t *ids = st == STATUS_OK ? malloc((size_t)most * sizeof *ids) : NULL;
    if (st == STATUS_OK && !ids) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "eagle trainer: out of host memory");
    if (st != STATUS_OK) return st;
    for (int64_t i = 0; i < most; i++) ids[i] = (int32_t)i;
    backend_upload(e->b, e->ids.data, ids, (size_t)most * sizeof *ids);
    free(ids);
    uint64_t rng = seed ^ 0xEA61E5EEDull;
    for (size_t i = 0; i < sizeof list / sizeof list[0] && st == STATUS_OK; i++)
        if ((st = alloc(e, list[i].t, DTYPE_F32, list[i].rows, list[i].cols)) == STATUS_OK)
            init_from(e, list[i].t, list[i].src, list[i].scale, &rng);
    if (st == STATUS_OK) st = alloc(e, &h->input_fc_emb, DTYPE_F32, D, D);
    if (st == STATUS_OK) st = alloc(e, &h->input_fc_feat, DTYPE_F32, D, D);
    if (st == STATUS_OK) st = alloc(e, &h->input_fc_bias, DTYPE_F32, D, 0);
    if (st != STATUS_OK) return st;
    float *eye = calloc((size_t)(D * D), sizeof *eye);
    if (!eye) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "eagle trainer: out of host memory");
    for (int64_t i = 0; i < D; i++) eye[i * D + i] = 1.0f;
    backend_upload(e->b, h->input_fc_feat.data, eye, (size_t)(D * D) * sizeof *eye);
    free(eye);
    backend_memset_zero(e->b, h->input_fc_emb.data, tensor_nbytes(&h->input_fc_emb));
    backend_memset_zero(e->b, h->input_fc_bias.data, tensor_nbytes(&h->input_fc_bias));
    return STATUS_OK;
}

/* The head's LM head: the target's, or its rows of the map's tokens; row_of maps tokens to rows. */
static enum status head_rows(struct eagle_trainer *e, const int32_t *map, int n_map)
{
    const int V = e->target->cfg.vocab_size;
    if (!(e->row_of = malloc((size_t)V * sizeof *e->row_of)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "eagle trainer: out of host memory");
    for (int i = 0; i < V; i++) e->row_of[i] = map ? -1 : i;
    if (!map) return STATUS_OK;
    struct tensor ids;
    enum status st = alloc(e, &ids, DTYPE_I32, n_map, 0);
    if (st == STATUS_OK) st = alloc(e, &e->cut, DTYPE_F32, n_map, e->h->cfg.d_model);
    if (st != STATUS_OK) return st;
    backend_upload(e->b, ids.data, map, (size_t)n_map * sizeof *map);
    op_embedding(e->b, &e->cut, &e->target->w.lm_head, &ids, 0);
    for (int i = 0; i < n_map; i++) e->row_of[map[i]] = i;
    e->h->w.lm_head = e->cut;
    e->h->vocab_local = n_map;
    return STATUS_OK;
}

enum status eagle_trainer_new(struct model *target, int ffn, int max_tokens, const struct optimizer_options *o,
                              uint64_t seed, const int32_t *map, int n_map, struct eagle_trainer **out)
{
    *out = NULL;
    const char *why = eagle_head_unfit(target);
    if (why) return status_errorf(STATUS_UNSUPPORTED, "--eagle-head: %s cannot carry an EAGLE head: %s",
                                  target->cfg.architecture, why);
    if (target->tp_size > 1 || target->pp_size > 1 || target->dtype != DTYPE_F32)
        return status_errorf(STATUS_UNSUPPORTED, "--eagle-head trains on one rank in f32 (tp %d, pp %d, %s given)",
                             target->tp_size, target->pp_size, dtype_name(target->dtype));
    if (ffn <= 0) ffn = target->cfg.ffn_hidden;
    if (ffn <= 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--eagle-head: %s has no dense MLP size; give --eagle-ffn N",
                             target->cfg.architecture);
    struct eagle_trainer *e = calloc(1, sizeof *e);
    struct model *h = calloc(1, sizeof *h);
    struct layer_weights *layer = calloc(1, sizeof *layer);
    if (!e || !h || !layer) {
        free(e), free(h), free(layer);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "eagle trainer: out of host memory");
    }
    *out = e;
    e->b = target->b;
    e->target = target;
    e->h = h;
    e->max_tokens = max_tokens;
    h->b = target->b;
    h->w.layers = layer;
    eagle_head_shape(h, target, target, ffn);
    const int64_t D = h->cfg.d_model;
    enum status st = head_weights(e, seed);
    if (st == STATUS_OK) st = head_rows(e, map, n_map);
    e->trained = (struct model_weights){.n_layers = 1, .layers = h->w.layers};
    if (st == STATUS_OK) st = weights_alloc_like(e->b, &e->trained, DTYPE_F32, &e->grads, &e->grads_mem);
    if (st == STATUS_OK) st = alloc(e, &e->g_fc_emb, DTYPE_F32, D, D);
    if (st == STATUS_OK) st = alloc(e, &e->g_fc_feat, DTYPE_F32, D, D);
    if (st == STATUS_OK) st = alloc(e, &e->g_fc_bias, DTYPE_F32, D, 0);
    if (st == STATUS_OK) st = param_table_from_weights(&e->params, &e->trained, h->layer_first);
    if (st == STATUS_OK) st = param_table_from_weights(&e->gparams, &e->grads, h->layer_first);
    if (st == STATUS_OK) st = param_table_add(&e->params, "fc_emb", &h->input_fc_emb, 1);
    if (st == STATUS_OK) st = param_table_add(&e->params, "fc_feat", &h->input_fc_feat, 1);
    if (st == STATUS_OK) st = param_table_add(&e->params, "fc_bias", &h->input_fc_bias, 0);
    if (st == STATUS_OK) st = param_table_add(&e->gparams, "fc_emb", &e->g_fc_emb, 1);
    if (st == STATUS_OK) st = param_table_add(&e->gparams, "fc_feat", &e->g_fc_feat, 1);
    if (st == STATUS_OK) st = param_table_add(&e->gparams, "fc_bias", &e->g_fc_bias, 0);
    if (st == STATUS_OK) st = optimizer_init(&e->opt, e->b, &e->params, o);
    if (st == STATUS_OK) st = alloc(e, &e->emb, DTYPE_F32, max_tokens, D);
    if (st == STATUS_OK) st = alloc(e, &e->feat, DTYPE_F32, max_tokens, D);
    if (st == STATUS_OK) st = alloc(e, &e->x0, DTYPE_F32, max_tokens, D);
    if (st == STATUS_OK) st = alloc(e, &e->tmp, DTYPE_F32, max_tokens, D);
    if (st == STATUS_OK) st = alloc(e, &e->tokens, DTYPE_I32, max_tokens, 0);
    if (st == STATUS_OK) st = alloc(e, &e->extra, DTYPE_F32, max_tokens, D);
    const size_t rows_bytes = (size_t)max_tokens * (size_t)D * sizeof(float);
    if (st == STATUS_OK && (!(e->host = malloc(rows_bytes)) || !(e->shifted = malloc(rows_bytes)) ||
                            !(e->head_rows = malloc(rows_bytes))))
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "eagle trainer: out of host memory");
    if (st == STATUS_OK) st = model_train_new(target, max_tokens, NULL, &e->tt);
    if (st == STATUS_OK) st = model_train_new(h, max_tokens, NULL, &e->ht);
    if (st != STATUS_OK) {
        eagle_trainer_free(e);
        *out = NULL;
    }
    return st;
}

void eagle_trainer_free(struct eagle_trainer *e)
{
    if (!e) return;
    model_train_free(e->ht);
    model_train_free(e->tt);
    optimizer_free(&e->opt, e->b);
    param_table_free(&e->params);
    param_table_free(&e->gparams);
    weights_free_layers(&e->grads);
    backend_free(e->b, e->grads_mem);
    for (int i = 0; i < e->n_mem; i++) backend_free(e->b, e->mem[i]);
    if (e->h) free(e->h->w.layers);
    free(e->h);
    free(e->host);
    free(e->shifted);
    free(e->head_rows);
    free(e->self_rows);
    free(e->row_of);
    free(e);
}

int eagle_head_targets(const struct eagle_trainer *e, const struct train_batch *tb, int32_t *out)
{
    const int V = e->target->cfg.vocab_size;
    int n = 0;
    for (int i = 0; i < tb->n_tokens; i++) {
        const int32_t t = tb->targets[i];
        out[i] = tb->positions[i] > 0 && t >= 0 && t < V ? e->row_of[t] : -1;
        n += out[i] >= 0;
    }
    return n;
}

void eagle_trainer_zero_grads(struct eagle_trainer *e)
{
    weights_zero(e->b, &e->grads);
    backend_memset_zero(e->b, e->g_fc_emb.data, tensor_nbytes(&e->g_fc_emb));
    backend_memset_zero(e->b, e->g_fc_feat.data, tensor_nbytes(&e->g_fc_feat));
    backend_memset_zero(e->b, e->g_fc_bias.data, tensor_nbytes(&e->g_fc_bias));
}

void eagle_trainer_set_feature_loss(struct eagle_trainer *e, float weight) { e->feature_weight = weight; }

enum status eagle_trainer_set_unroll(struct eagle_trainer *e, int on)
{
    if (on && !e->self_rows &&
        !(e->self_rows = malloc((size_t)e->max_tokens * (size_t)e->h->cfg.d_model * sizeof(float))))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "eagle trainer: out of host memory for --eagle-unroll");
    e->unroll = on;
    return STATUS_OK;
}

void eagle_trainer_set_feature_noise(struct eagle_trainer *e, float amount, uint64_t seed)
{
    e->noise = amount;
    e->noise_seed = seed;
    e->noise_calls = 0;
}

/* Row p of the features: row p - 1 of src (the model's rows, or the head's own with
 * --eagle-unroll; zeros at a document's first row, which carries no loss), with EAGLE-1's uniform
 * noise in training (amount x the row's rms x u). */
static void shift_features(struct eagle_trainer *e, const struct train_batch *tb, const float *src, int noisy)
{
    const int64_t D = e->h->cfg.d_model;
    const uint64_t call = noisy ? e->noise_calls++ : 0;
    for (int64_t p = 0; p < tb->n_tokens; p++) {
        float *row = e->shifted + p * D;
        if (tb->positions[p] == 0) {
            memset(row, 0, (size_t)D * sizeof *row);
            continue;
        }
        const float *f = src + (p - 1) * D;
        memcpy(row, f, (size_t)D * sizeof *row);
        if (!noisy) continue;
        double ss = 0.0;
        for (int64_t j = 0; j < D; j++) ss += (double)f[j] * (double)f[j];
        const double a = (double)e->noise * sqrt(ss / (double)D);
        for (int64_t j = 0; j < D; j++)
            row[j] = (float)((double)f[j] + a * noise_u(e->noise_seed, call, (uint64_t)p, (uint64_t)j));
    }
}

/* EAGLE-1's feature regression on the head's last forward: w x the mean over d of
 * smooth-L1(h_p - f_p) (beta 1) summed over the rows with a target, f_p the frozen model's own
 * row p; returned, and its gradient x grad_scale left in head_rows for the backward. */
static double feature_loss(struct eagle_trainer *e, const int32_t *targets, int64_t T, float grad_scale)
{
    const int64_t D = e->h->cfg.d_model;
    const struct tensor out = model_train_final_hidden(e->ht, (int)T);
    backend_download(e->b, e->head_rows, out.data, tensor_nbytes(&out));
    const double w = e->feature_weight;
    double sum = 0.0;
    for (int64_t p = 0; p < T; p++) {
        float *g = e->head_rows + p * D;
        const float *f = e->host + p * D;
        if (targets[p] < 0) {
            memset(g, 0, (size_t)D * sizeof *g);
            continue;
        }
        double row = 0.0;
        for (int64_t j = 0; j < D; j++) {
            const double x = (double)g[j] - (double)f[j], a = fabs(x);
            row += a < 1.0 ? 0.5 * x * x : a - 0.5;
            g[j] = (float)(w * grad_scale * (a < 1.0 ? x : (x > 0 ? 1.0 : -1.0)) / (double)D);
        }
        sum += w * row / (double)D;
    }
    return sum;
}

enum status eagle_trainer_features(struct eagle_trainer *e, const struct train_batch *tb, float *out)
{
    if (tb->n_tokens > e->max_tokens)
        return status_errorf(STATUS_INVALID_ARGUMENT, "eagle trainer: a micro-batch of %d rows (at most %d)", tb->n_tokens,
                             e->max_tokens);
    struct train_batch ft = *tb;
    ft.hidden_only = 1;
    ft.input = NULL;
    double unused = 0.0;
    int unused_n = 0;
    enum status st = model_forward_train(e->tt, &ft, &unused, &unused_n);
    if (st != STATUS_OK) return st;
    struct tensor hid = model_train_final_hidden(e->tt, tb->n_tokens);
    backend_download(e->b, out, hid.data, tensor_nbytes(&hid));
    return STATUS_OK;
}

/* One pass of the head over tb, reading e->shifted as its features: x0 = scale E[t] W_e^T +
 * f W_f^T + bias (model.c's input_from_features, in training), its layer, the loss (and the feature
 * regression) added to *loss_sum; with backward, the gradients accumulated. keep non-NULL: the
 * head's output rows are copied there after the forward. */
static enum status head_pass(struct eagle_trainer *e, const struct train_batch *tb, const int32_t *targets,
                             float grad_scale, int backward, float *keep, double *loss_sum, int *n_real)
{
    struct backend *b = e->b;
    struct model *h = e->h;
    const int64_t T = tb->n_tokens;
    struct tensor feat = tensor_first_rows(&e->feat, T), emb = tensor_first_rows(&e->emb, T);
    struct tensor x0 = tensor_first_rows(&e->x0, T), tmp = tensor_first_rows(&e->tmp, T);
    struct tensor tokens = tensor_first_rows(&e->tokens, T);
    backend_upload(b, feat.data, e->shifted, tensor_nbytes(&feat));
    backend_upload(b, tokens.data, tb->tokens, (size_t)T * sizeof(int32_t));
    op_embedding(b, &emb, &e->target->w.tok_embedding, &tokens, 0);
    if (h->cfg.embed_scale != 0.0f && h->cfg.embed_scale != 1.0f) op_scale(b, &emb, &emb, h->cfg.embed_scale);
    op_matmul(b, &x0, &emb, &h->input_fc_emb, &h->input_fc_bias);
    op_matmul(b, &tmp, &feat, &h->input_fc_feat, NULL);
    op_add(b, &x0, &x0, &tmp);
    struct train_batch hb = *tb;
    hb.targets = targets;
    hb.grad_scale = grad_scale;
    hb.input = &x0;
    hb.hidden_only = 0;
    double loss = 0.0;
    enum status st = model_forward_train(e->ht, &hb, &loss, n_real);
    if (st != STATUS_OK) return st;
    *loss_sum += loss;
    if (keep) {
        const struct tensor out = model_train_final_hidden(e->ht, (int)T);
        backend_download(b, keep, out.data, tensor_nbytes(&out));
    }
    struct tensor extra = tensor_first_rows(&e->extra, T);
    if (e->feature_weight > 0.0f) {
        *loss_sum += feature_loss(e, targets, T, grad_scale);
        backend_upload(b, extra.data, e->head_rows, tensor_nbytes(&extra)); /* its gradient */
        hb.extra_grad = &extra;
    }
    if (!backward) return STATUS_OK;
    if ((st = model_backward(e->ht, &hb, &e->grads)) != STATUS_OK) return st;
    struct tensor dx0 = model_train_boundary_grad(e->ht, (int)T);
    op_matmul_backward(b, NULL, &e->g_fc_emb, &e->g_fc_bias, &dx0, &emb, &h->input_fc_emb, 0);
    op_matmul_backward(b, NULL, &e->g_fc_feat, NULL, &dx0, &feat, &h->input_fc_feat, 0);
    backend_synchronize(b);
    return STATUS_OK;
}

enum status eagle_trainer_micro(struct eagle_trainer *e, const struct train_batch *tb, const int32_t *targets,
                                float grad_scale, int backward, const float *hidden, float *hidden_out,
                                double *loss_sum, int *n_real)
{
    const int64_t T = tb->n_tokens, D = e->h->cfg.d_model;
    *loss_sum = 0.0;
    *n_real = 0;
    if (T > e->max_tokens)
        return status_errorf(STATUS_INVALID_ARGUMENT, "eagle trainer: a micro-batch of %lld rows (at most %d)",
                             (long long)T, e->max_tokens);
    /* The features: the frozen model's rows after its final norm, row p reading row p - 1's
     * (zeros at a document's first row, which carries no loss). */
    enum status st = STATUS_OK;
    if (hidden) {
        memcpy(e->host, hidden, (size_t)(T * D) * sizeof *e->host);
    } else {
        if ((st = eagle_trainer_features(e, tb, e->host)) != STATUS_OK) return st;
        if (hidden_out) memcpy(hidden_out, e->host, (size_t)(T * D) * sizeof *e->host);
    }
    const int unroll = backward && e->unroll;
    shift_features(e, tb, e->host, backward && e->noise > 0.0f);
    if ((st = head_pass(e, tb, targets, grad_scale, backward, unroll ? e->self_rows : NULL, loss_sum, n_real)) != STATUS_OK ||
        !unroll)
        return st;
    /* --eagle-unroll: a second pass in which row p reads the first pass's output at p - 1 (taken as
     * given, no gradient through it) where it read the model's row: what a chain's second draft
     * reads when served. The same targets; its loss joins the first's. */
    int again = 0;
    shift_features(e, tb, e->self_rows, 0);
    return head_pass(e, tb, targets, grad_scale, backward, NULL, loss_sum, &again);
}

double eagle_trainer_step(struct eagle_trainer *e, double lr)
{
    const double norm = optimizer_grad_norm(&e->opt, e->b, &e->gparams);
    optimizer_step(&e->opt, e->b, &e->params, &e->gparams, lr, norm, 1.0);
    return norm;
}

const struct param_table *eagle_trainer_params(const struct eagle_trainer *e) { return &e->params; }

/* ---- the file ------------------------------------------------------------------------------ */

static float *download_f32(struct eagle_trainer *e, const struct tensor *t)
{
    float *v = malloc((size_t)tensor_numel(t) * sizeof *v);
    if (v) backend_download(e->b, v, t->data, tensor_nbytes(t));
    return v;
}

enum status eagle_trainer_load(struct eagle_trainer *e, const struct safetensors *sf, const char *path)
{
    struct model *h = e->h;
    const int64_t D = h->cfg.d_model;
    struct eagle_head_tensor list[EAGLE_HEAD_TENSORS];
    eagle_head_tensors(h, list);
    list[1].optional = 0; /* the trainer's head has a bias: a file without one is not its shape */
    enum status st = STATUS_OK;
    float *host = NULL, *half = malloc((size_t)(2 * D * D) * sizeof *half);
    if (!half) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "eagle trainer: out of host memory");
    for (int i = 0; i < EAGLE_HEAD_TENSORS && st == STATUS_OK; i++) {
        int absent = 0;
        if ((st = eagle_head_read(sf, path, "the head", &list[i], &host, &absent)) != STATUS_OK) break;
        if (list[i].t) {
            backend_upload(e->b, list[i].t->data, host, tensor_nbytes(list[i].t));
            continue;
        }
        eagle_head_fc_split(host, D, half, half + D * D);
        backend_upload(e->b, h->input_fc_emb.data, half, (size_t)(D * D) * sizeof *half);
        backend_upload(e->b, h->input_fc_feat.data, half + D * D, (size_t)(D * D) * sizeof *half);
    }
    free(host);
    free(half);
    return st;
}

/* The head's file; metadata "iteration" when iteration >= 0 (a checkpoint's). */
static enum status save_head(struct eagle_trainer *e, const char *path, int64_t iteration)
{
    struct model *h = e->h;
    const int64_t D = h->cfg.d_model;
    struct eagle_head_tensor list[EAGLE_HEAD_TENSORS];
    eagle_head_tensors(h, list); /* fc.weight first: joined below from its halves */
    enum { N = EAGLE_HEAD_TENSORS };
    float *host[N] = {0};
    struct safetensors_writer *sw = NULL;
    enum status st = safetensors_writer_begin(path, &sw);
    /* fc.weight: row r is [W_e row r | W_f row r] */
    float *we = st == STATUS_OK ? download_f32(e, &h->input_fc_emb) : NULL;
    float *wf = st == STATUS_OK ? download_f32(e, &h->input_fc_feat) : NULL;
    host[0] = st == STATUS_OK ? malloc((size_t)(2 * D * D) * sizeof(float)) : NULL;
    if (st == STATUS_OK && (!we || !wf || !host[0]))
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "eagle trainer: out of host memory");
    for (int64_t r = 0; st == STATUS_OK && r < D; r++) {
        memcpy(host[0] + r * 2 * D, we + r * D, (size_t)D * sizeof(float));
        memcpy(host[0] + r * 2 * D + D, wf + r * D, (size_t)D * sizeof(float));
    }
    free(we);
    free(wf);
    const int64_t fc_shape[2] = {D, 2 * D};
    if (st == STATUS_OK) st = safetensors_writer_add(sw, list[0].name, DTYPE_F32, 2, fc_shape, host[0]);
    for (int i = 1; i < N && st == STATUS_OK; i++) {
        if (!(host[i] = download_f32(e, list[i].t))) {
            st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "eagle trainer: out of host memory");
            break;
        }
        st = safetensors_writer_add(sw, list[i].name, DTYPE_F32, list[i].t->ndim, list[i].t->shape, host[i]);
    }
    int32_t *map = NULL; /* with a token map, its ids (ascending): served without --spec-token-map */
    if (st == STATUS_OK && e->cut.data) {
        const int V = e->target->cfg.vocab_size;
        const int64_t n_map = e->h->vocab_local;
        if (!(map = malloc((size_t)n_map * sizeof *map))) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "eagle trainer: out of host memory");
        for (int i = 0; map && i < V; i++)
            if (e->row_of[i] >= 0) map[e->row_of[i]] = i;
        if (map) st = safetensors_writer_add(sw, EAGLE_HEAD_TOKEN_MAP, DTYPE_I32, 1, &n_map, map);
    }
    if (st == STATUS_OK)
        st = safetensors_writer_set_metadata(sw, "rope_style", h->cfg.rope_style == ROPE_STYLE_PAIRS ? "pairs" : "halves");
    if (st == STATUS_OK) st = safetensors_writer_set_metadata(sw, "target_architecture", h->cfg.architecture);
    if (st == STATUS_OK) st = safetensors_writer_set_metadata(sw, "trained_by", "shardlm train --eagle-head");
    char it[32];
    snprintf(it, sizeof it, "%lld", (long long)iteration);
    if (st == STATUS_OK && iteration >= 0) st = safetensors_writer_set_metadata(sw, "iteration", it);
    if (st == STATUS_OK) {
        st = safetensors_writer_finish(sw);
        sw = NULL;
    }
    safetensors_writer_free(sw);
    for (int i = 0; i < N; i++) free(host[i]);
    free(map);
    if (st != STATUS_OK) return status_errorf(st, "--eagle-head: writing %s: %s", path, status_message());
    return STATUS_OK;
}

enum status eagle_trainer_save(struct eagle_trainer *e, const char *path) { return save_head(e, path, -1); }

/* ---- checkpoints (--save-interval, --resume) ------------------------------------------------- */

struct moment {
    struct backend *b;
    const struct tensor *t;
};

static enum status fill_moment(void *ctx, void *dst, size_t nbytes)
{
    const struct moment *m = ctx;
    backend_download(m->b, dst, m->t->data, nbytes);
    return STATUS_OK;
}

struct checkpoint_ctx {
    struct eagle_trainer *e;
    const struct eagle_progress *p;
};

/* Fills a checkpoint directory (train_checkpoint_write_dir): the head, then the state. */
static enum status write_checkpoint(void *ctx, const char *dir)
{
    const struct checkpoint_ctx *c = ctx;
    struct eagle_trainer *e = c->e;
    char path[4400], name[256], value[64];
    snprintf(path, sizeof path, "%s/" EAGLE_HEAD_FILE, dir);
    enum status st = save_head(e, path, c->p->iteration);
    if (st != STATUS_OK) return st;
    snprintf(path, sizeof path, "%s/" TRAIN_STATE_FILE, dir);
    struct moment *items = malloc(2 * e->params.n * sizeof *items);
    if (!items) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "eagle trainer: out of host memory");
    struct safetensors_writer *w = NULL;
    st = safetensors_writer_begin(path, &w);
    for (size_t i = 0; i < e->params.n && st == STATUS_OK; i++) {
        const struct tensor *ts[2] = {&e->opt.m[i], &e->opt.v[i]};
        const char *groups[2] = {"exp_avg", "exp_avg_sq"};
        for (int g = 0; g < 2 && st == STATUS_OK; g++) {
            items[2 * i + g] = (struct moment){e->b, ts[g]};
            snprintf(name, sizeof name, "%s/%s", groups[g], e->params.p[i].name);
            st = safetensors_writer_add_deferred(w, name, DTYPE_F32, ts[g]->ndim, ts[g]->shape, fill_moment,
                                                 &items[2 * i + g]);
        }
    }
    const struct {
        const char *key;
        int64_t v;
    } meta[] = {
        {"iteration", c->p->iteration},
        {"data_epoch", c->p->cursor.epoch},
        {"data_index", c->p->cursor.index},
        {"seed", (int64_t)c->p->cursor.seed},
        {"optimizer_step", e->opt.step},
        {"noise_calls", (int64_t)e->noise_calls},
    };
    for (size_t i = 0; i < sizeof meta / sizeof meta[0] && st == STATUS_OK; i++) {
        snprintf(value, sizeof value, "%lld", (long long)meta[i].v);
        st = safetensors_writer_set_metadata(w, meta[i].key, value);
    }
    /* The run's settings (eagle_checkpoint_settings): a resumed run continues with them. */
    const struct {
        const char *key;
        double v;
    } set[] = {{"eagle_feature_loss", e->feature_weight}, {"eagle_feature_noise", e->noise}, {"eagle_unroll", e->unroll}};
    for (size_t i = 0; i < sizeof set / sizeof set[0] && st == STATUS_OK; i++) {
        snprintf(value, sizeof value, "%.9g", set[i].v); /* (a float's value exactly, read back) */
        st = safetensors_writer_set_metadata(w, set[i].key, value);
    }
    if (st == STATUS_OK) st = safetensors_writer_set_metadata(w, "format", TRAIN_STATE_FORMAT);
    if (st == STATUS_OK) st = safetensors_writer_set_metadata(w, "trained", "eagle_head");
    if (st == STATUS_OK) {
        st = safetensors_writer_finish(w);
        w = NULL;
    }
    safetensors_writer_free(w);
    free(items);
    if (st != STATUS_OK) return status_errorf(st, "--eagle-head: writing %s: %s", path, status_message());
    return STATUS_OK;
}

enum status eagle_trainer_save_checkpoint(struct eagle_trainer *e, const char *dir, const struct eagle_progress *p)
{
    struct checkpoint_ctx c = {e, p};
    enum status st = train_checkpoint_write_dir(dir, write_checkpoint, &c);
    if (st == STATUS_OK) LOG_INFO(MODULE, "checkpoint %s written (iteration %lld)", dir, (long long)p->iteration);
    return st;
}

enum status eagle_checkpoint_settings(const char *dir, struct eagle_settings *s, int *found)
{
    char state[4400];
    snprintf(state, sizeof state, "%s/" TRAIN_STATE_FILE, dir);
    struct safetensors *sf = NULL;
    *found = 0;
    enum status st = safetensors_open(state, &sf);
    if (st != STATUS_OK) return status_errorf(st, "--resume %s: no training state: %s", dir, status_message());
    const char *keys[3] = {"eagle_feature_loss", "eagle_feature_noise", "eagle_unroll"};
    double v[3];
    int n = 0;
    for (int i = 0; i < 3; i++) {
        const char *text = safetensors_metadata(sf, keys[i]);
        char *end = NULL;
        if (text) v[i] = strtod(text, &end);
        if (text && (end == text || *end || !(v[i] >= 0.0)))
            st = status_errorf(STATUS_BAD_FORMAT, "--resume %s: metadata %s is '%s', not a number", state, keys[i], text);
        n += text != NULL;
    }
    safetensors_close(sf);
    if (st != STATUS_OK) return st;
    if (n != 0 && n != 3)
        return status_errorf(STATUS_BAD_FORMAT, "--resume %s: %d of the 3 settings' metadata", state, n);
    if (n == 3) { /* (none: a checkpoint written before 2026-12-05 recorded them) */
        *s = (struct eagle_settings){.feature_loss = (float)v[0], .feature_noise = (float)v[1], .unroll = v[2] != 0.0};
        *found = 1;
    }
    return STATUS_OK;
}

enum status eagle_trainer_load_checkpoint(struct eagle_trainer *e, const char *dir, struct eagle_progress *p)
{
    char head[4400], state[4400], what[4500];
    snprintf(head, sizeof head, "%s/" EAGLE_HEAD_FILE, dir);
    snprintf(state, sizeof state, "%s/" TRAIN_STATE_FILE, dir);
    struct safetensors *hf = NULL, *sf = NULL;
    enum status st = safetensors_open(head, &hf);
    if (st != STATUS_OK) return status_errorf(st, "--resume %s: no EAGLE head: %s", dir, status_message());
    snprintf(what, sizeof what, "--resume %s", head);
    if ((st = eagle_trainer_load(e, hf, what)) == STATUS_OK && (st = safetensors_open(state, &sf)) != STATUS_OK)
        st = status_errorf(st, "--resume %s: no training state: %s", dir, status_message());
    int ok = 1, same = 1;
    const int64_t head_iter = hf ? train_checkpoint_meta_i64(hf, "iteration", &same) : -1;
    if (st == STATUS_OK) {
        const char *fmt = safetensors_metadata(sf, "format"), *kind = safetensors_metadata(sf, "trained");
        ok = fmt && !strcmp(fmt, TRAIN_STATE_FORMAT) && kind && !strcmp(kind, "eagle_head");
        p->iteration = train_checkpoint_meta_i64(sf, "iteration", &ok);
        p->cursor.epoch = train_checkpoint_meta_i64(sf, "data_epoch", &ok);
        p->cursor.index = train_checkpoint_meta_i64(sf, "data_index", &ok);
        p->cursor.seed = (uint64_t)train_checkpoint_meta_i64(sf, "seed", &ok);
        e->opt.step = train_checkpoint_meta_i64(sf, "optimizer_step", &ok);
        e->noise_calls = (uint64_t)train_checkpoint_meta_i64(sf, "noise_calls", &ok);
        e->noise_seed = p->cursor.seed;
        if (!ok) st = status_errorf(STATUS_BAD_FORMAT, "--resume %s: not an EAGLE head's training state", state);
        else if (!same || head_iter != p->iteration)
            st = status_errorf(STATUS_BAD_FORMAT, "--resume %s: the head is not of the state's iteration %lld (a save "
                               "cut short?)", dir, (long long)p->iteration);
    }
    char name[256];
    for (size_t i = 0; i < e->params.n && st == STATUS_OK; i++) {
        const struct tensor *ts[2] = {&e->opt.m[i], &e->opt.v[i]};
        const char *groups[2] = {"exp_avg", "exp_avg_sq"};
        for (int g = 0; g < 2 && st == STATUS_OK; g++) {
            snprintf(name, sizeof name, "%s/%s", groups[g], e->params.p[i].name);
            const struct st_tensor *t = safetensors_find(sf, name);
            if (!t || t->dtype != DTYPE_F32 || t->numel != tensor_numel(ts[g]))
                st = status_errorf(STATUS_BAD_FORMAT, "--resume %s: %s %s (the head needs %lld f32 values)", state,
                                   t ? "tensor of another size or dtype:" : "no tensor", name,
                                   (long long)tensor_numel(ts[g]));
            else backend_upload(e->b, ts[g]->data, t->data, t->nbytes);
        }
    }
    safetensors_close(sf);
    safetensors_close(hf);
    return st;
}

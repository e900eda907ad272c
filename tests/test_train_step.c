/* tests/test_train_step.c - the driver of tests/test_train_step.py: whole training steps of
 * one rank as trainer.c takes them (gradients of every micro-batch accumulated, scaled by the
 * target tokens of the whole global batch, global-norm clipping, AdamW over the layout table),
 * so that the Python test can repeat them with JAX + optax from the same initial weights.
 *
 * Usage: test_train_step MODEL_DIR OUT_PREFIX STEPS LR WEIGHT_DECAY CLIP EPS BATCH_FILE...
 * Each BATCH_FILE is one micro-batch (the format of test_train_grad.c, grad_scale ignored);
 * every step reads all of them. Writes OUT_PREFIX.json {"losses": [...], "grad_norms": [...],
 * "tensors": [{"kind", "layer", "shape", "initial_offset", "final_offset"}]} and
 * OUT_PREFIX.bin (f32). MOE_AUX_COEFF and MOE_Z_COEFF in the environment set a mixture of
 * experts' auxiliary losses (each micro-batch's weighted 1 / micro-batches). Exit 0 or 1.
 *
 * test_train_step --eagle MODEL_DIR OUT_PREFIX STEPS LR WEIGHT_DECAY CLIP EPS FFN BATCH_FILE...:
 * the same steps of an EAGLE head's trainer (eagle_train.h; tests/test_train_eagle.py) for the
 * frozen model: OUT_PREFIX.json {"losses", "grad_norms", "tied", "target": [{"kind", "layer",
 * "shape", "offset", "after_offset"}], "head": [{"name", "shape", "initial_offset",
 * "final_offset"}]}, OUT_PREFIX.bin (f32) and the head's file OUT_PREFIX.safetensors.
 * EAGLE_TOKEN_MAP (a map file) and EAGLE_FEATURE_LOSS (a weight) in the environment set those. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eagle_head.h"
#include "eagle_train.h"
#include "model_train.h"
#include "optimizer.h"
#include "params.h"

struct host_batch {
    struct train_batch tb;
    int32_t *buf;
};

static void read_batch(const char *path, struct host_batch *hb)
{
    FILE *f = fopen(path, "r");
    CHECK(f, "cannot open %s", path);
    struct train_batch *tb = &hb->tb;
    CHECK(fscanf(f, "%d %d %f", &tb->n_tokens, &tb->n_docs, &tb->grad_scale) == 3, "bad batch header");
    const int n = tb->n_tokens, total = 3 * n + tb->n_docs + 1;
    hb->buf = malloc((size_t)total * sizeof *hb->buf);
    CHECK(hb->buf, "out of memory");
    for (int i = 0; i < total; i++) CHECK(fscanf(f, "%d", &hb->buf[i]) == 1, "bad batch %s", path);
    fclose(f);
    tb->tokens = hb->buf;
    tb->targets = hb->buf + n;
    tb->positions = hb->buf + 2 * n;
    tb->doc_start = hb->buf + 3 * n;
}

static long dump(FILE *bin, struct model_weights *w, struct weight_ref *t, int n, long off, long *offsets)
{
    (void)w;
    for (int i = 0; i < n; i++) {
        const size_t nb = tensor_nbytes(t[i].t);
        CHECK(fwrite(t[i].t->data, 1, nb, bin) == nb, "write failed");
        offsets[i] = off;
        off += (long)nb;
    }
    return off;
}

/* AdamW at a constant LR, WEIGHT_DECAY, CLIP, EPS from argv[4..7] (both modes' order). */
static struct optimizer_options optimizer_args(char **argv)
{
    return (struct optimizer_options){.lr = atof(argv[4]), .min_lr = 0, .decay_style = LR_DECAY_CONSTANT,
                                      .weight_decay = atof(argv[5]), .beta1 = 0.9, .beta2 = 0.999,
                                      .eps = atof(argv[7]), .clip_grad = atof(argv[6])};
}

/* PREFIX.SUFFIX opened in mode, or the driver stops. */
static FILE *open_out(const char *prefix, const char *suffix, const char *mode)
{
    char path[4096];
    snprintf(path, sizeof path, "%s%s", prefix, suffix);
    FILE *f = fopen(path, mode);
    CHECK(f, "cannot write %s", path);
    return f;
}

static void dump_json_shape(FILE *js, const struct tensor *t)
{
    fprintf(js, "\"shape\": [");
    for (int d = 0; d < t->ndim; d++) fprintf(js, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    fprintf(js, "]");
}

/* The --eagle mode (top of this file), its arguments from MODEL_DIR at argv[1]. */
static int eagle_main(int argc, char **argv)
{
    if (argc < 10) {
        fprintf(stderr, "usage: test_train_step --eagle MODEL_DIR OUT_PREFIX STEPS LR WEIGHT_DECAY CLIP EPS FFN "
                        "BATCH_FILE...\n");
        return 2;
    }
    const int steps = atoi(argv[3]), n_mb = argc - 9;
    const struct optimizer_options oo = optimizer_args(argv);
    struct host_batch *mb = calloc((size_t)n_mb, sizeof *mb);
    int32_t **targets = calloc((size_t)n_mb, sizeof *targets);
    CHECK(mb && targets && steps <= 64, "out of memory, or more than 64 steps");
    int max_tokens = 0, n_targets = 0;
    for (int i = 0; i < n_mb; i++) {
        read_batch(argv[9 + i], &mb[i]);
        if (mb[i].tb.n_tokens > max_tokens) max_tokens = mb[i].tb.n_tokens;
        CHECK((targets[i] = malloc((size_t)mb[i].tb.n_tokens * sizeof **targets)), "out of memory");
    }
    struct backend *b = NULL;
    struct model *m = NULL;
    struct eagle_trainer *e = NULL;
    CHECK(backend_open(DEVICE_CPU, 0, 0, &b) == STATUS_OK, "backend: %s", status_message());
    enum status st = model_load_as(argv[1], b, NULL, DTYPE_F32, &m);
    /* EAGLE_TOKEN_MAP in the environment: the head's logits over that map's tokens */
    int32_t *map = NULL;
    int n_map = 0;
    const char *map_path = getenv("EAGLE_TOKEN_MAP");
    if (st == STATUS_OK && map_path && *map_path) st = draft_token_map_read(map_path, m->cfg.vocab_size, &map, &n_map);
    if (st == STATUS_OK) st = eagle_trainer_new(m, atoi(argv[8]), max_tokens, &oo, 1234, map, n_map, &e);
    free(map);
    CHECK(st == STATUS_OK, "test_train_step --eagle: %s", status_message());
    /* EAGLE_FEATURE_LOSS in the environment: the feature regression's weight */
    if (getenv("EAGLE_FEATURE_LOSS")) eagle_trainer_set_feature_loss(e, (float)atof(getenv("EAGLE_FEATURE_LOSS")));
    /* EAGLE_FEATURE_NOISE: the features' noise, seed 77 (test_train_eagle.py's NOISE_SEED) */
    if (getenv("EAGLE_FEATURE_NOISE")) eagle_trainer_set_feature_noise(e, (float)atof(getenv("EAGLE_FEATURE_NOISE")), 77);
    /* EAGLE_UNROLL=1: the second pass reading the head's own outputs */
    if (getenv("EAGLE_UNROLL"))
        CHECK(eagle_trainer_set_unroll(e, atoi(getenv("EAGLE_UNROLL"))) == STATUS_OK, "--eagle-unroll: %s", status_message());
    for (int i = 0; i < n_mb; i++) n_targets += eagle_head_targets(e, &mb[i].tb, targets[i]);
    FILE *bin = open_out(argv[2], ".bin", "wb"), *js = open_out(argv[2], ".json", "w");
    const int max = weights_table_max(m->w.n_layers);
    struct weight_ref *t = malloc((size_t)max * sizeof *t);
    const struct param_table *pt = eagle_trainer_params(e);
    long *off = malloc((size_t)(2 * max + 2 * (int)pt->n) * sizeof *off), pos = 0;
    CHECK(t && off, "out of memory");
    const int n = weights_table(&m->w, m->layer_first, 1, t);
    pos = dump(bin, &m->w, t, n, pos, off);
    for (size_t i = 0; i < pt->n; i++) {
        const size_t nb = tensor_nbytes(pt->p[i].t);
        CHECK(fwrite(pt->p[i].t->data, 1, nb, bin) == nb, "write failed");
        off[2 * max + i] = pos;
        pos += (long)nb;
    }
    double losses[64], norms[64];
    for (int s = 0; s < steps && st == STATUS_OK; s++) {
        eagle_trainer_zero_grads(e);
        losses[s] = 0.0;
        for (int i = 0; i < n_mb && st == STATUS_OK; i++) {
            double ls = 0.0;
            int nr = 0;
            st = eagle_trainer_micro(e, &mb[i].tb, targets[i], 1.0f / (float)n_targets, 1, NULL, NULL, &ls, &nr);
            losses[s] += ls / n_targets;
        }
        if (st == STATUS_OK) norms[s] = eagle_trainer_step(e, oo.lr);
    }
    CHECK(st == STATUS_OK, "step failed: %s", status_message());
    pos = dump(bin, &m->w, t, n, pos, off + max);
    for (size_t i = 0; i < pt->n; i++) {
        const size_t nb = tensor_nbytes(pt->p[i].t);
        CHECK(fwrite(pt->p[i].t->data, 1, nb, bin) == nb, "write failed");
        off[2 * max + pt->n + i] = pos;
        pos += (long)nb;
    }
    fprintf(js, "{\"losses\": [");
    for (int s = 0; s < steps; s++) fprintf(js, "%s%.17g", s ? ", " : "", losses[s]);
    fprintf(js, "], \"grad_norms\": [");
    for (int s = 0; s < steps; s++) fprintf(js, "%s%.17g", s ? ", " : "", norms[s]);
    fprintf(js, "], \"tied\": %d, \"target\": [", m->w.tied);
    for (int i = 0; i < n; i++) {
        fprintf(js, "%s{\"kind\": \"%s\", \"layer\": %d, ", i ? ", " : "", weight_kind_name(t[i].kind), t[i].layer);
        dump_json_shape(js, t[i].t);
        fprintf(js, ", \"offset\": %ld, \"after_offset\": %ld}", off[i], off[max + i]);
    }
    fprintf(js, "], \"head\": [");
    for (size_t i = 0; i < pt->n; i++) {
        fprintf(js, "%s{\"name\": \"%s\", ", i ? ", " : "", pt->p[i].name);
        dump_json_shape(js, pt->p[i].t);
        fprintf(js, ", \"initial_offset\": %ld, \"final_offset\": %ld}", off[2 * max + i], off[2 * max + pt->n + i]);
    }
    fprintf(js, "]}\n");
    fclose(bin);
    fclose(js);
    char path[4096];
    snprintf(path, sizeof path, "%s.safetensors", argv[2]);
    CHECK(eagle_trainer_save(e, path) == STATUS_OK, "save: %s", status_message());
    eagle_trainer_free(e);
    model_free(m);
    backend_close(b);
    for (int i = 0; i < n_mb; i++) free(mb[i].buf), free(targets[i]);
    free(mb);
    free(targets);
    free(t);
    free(off);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--eagle")) return eagle_main(argc - 1, argv + 1);
    if (argc < 9) {
        fprintf(stderr, "usage: test_train_step MODEL_DIR OUT_PREFIX STEPS LR WEIGHT_DECAY CLIP EPS BATCH_FILE...\n");
        return 2;
    }
    const int steps = atoi(argv[3]), n_mb = argc - 8;
    const struct optimizer_options oo = optimizer_args(argv);
    struct host_batch *mb = calloc((size_t)n_mb, sizeof *mb);
    int max_tokens = 0, targets = 0;
    for (int i = 0; i < n_mb; i++) {
        read_batch(argv[8 + i], &mb[i]);
        if (mb[i].tb.n_tokens > max_tokens) max_tokens = mb[i].tb.n_tokens;
        for (int j = 0; j < mb[i].tb.n_tokens; j++) targets += mb[i].tb.targets[j] >= 0;
    }
    for (int i = 0; i < n_mb; i++) { /* a mixture of experts' auxiliary losses: the mean over micro-batches */
        mb[i].tb.grad_scale = 1.0f / (float)targets;
        mb[i].tb.aux_scale = 1.0f / (float)n_mb;
    }
    struct backend *b = NULL;
    struct model *m = NULL;
    CHECK(backend_open(DEVICE_CPU, 0, 0, &b) == STATUS_OK, "backend: %s", status_message());
    enum status st = model_load(argv[1], b, NULL, &m);
    struct model_train *mt = NULL;
    if (st == STATUS_OK) st = model_train_new(m, max_tokens, NULL, &mt);
    if (st == STATUS_OK) /* MOE_AUX_COEFF, MOE_Z_COEFF: a mixture of experts' auxiliary losses */
        model_train_set_moe_loss(mt, getenv("MOE_AUX_COEFF") ? (float)atof(getenv("MOE_AUX_COEFF")) : 0.0f,
                                 getenv("MOE_Z_COEFF") ? (float)atof(getenv("MOE_Z_COEFF")) : 0.0f);
    if (st == STATUS_OK) st = model_weights_make_writable(m);
    struct model_weights g;
    void *gmem = NULL;
    struct optimizer opt;
    if (st == STATUS_OK) st = weights_alloc_like(b, &m->w, DTYPE_F32, &g, &gmem);
    struct param_table pt = {0}, gt = {0};
    if (st == STATUS_OK) st = param_table_from_weights(&pt, &m->w, 0);
    if (st == STATUS_OK) st = param_table_from_weights(&gt, &g, 0);
    if (st == STATUS_OK) st = optimizer_init(&opt, b, &pt, &oo);
    if (st != STATUS_OK) {
        fprintf(stderr, "test_train_step: %s\n", status_message());
        return 1;
    }
    FILE *bin = open_out(argv[2], ".bin", "wb"), *js = open_out(argv[2], ".json", "w");
    const int max = weights_table_max(m->w.n_layers);
    struct weight_ref *t = malloc((size_t)max * sizeof *t);
    long *off0 = malloc((size_t)max * sizeof *off0), *off1 = malloc((size_t)max * sizeof *off1);
    CHECK(t && off0 && off1, "out of memory");
    const int n = weights_table(&m->w, m->layer_first, 1, t);
    long off = dump(bin, &m->w, t, n, 0, off0);
    fprintf(js, "{\"losses\": [");
    double norms[64];
    CHECK(steps <= 64, "at most 64 steps");
    for (int s = 0; s < steps && st == STATUS_OK; s++) {
        weights_zero(b, &g);
        double loss = 0.0;
        for (int i = 0; i < n_mb && st == STATUS_OK; i++) {
            double ls = 0.0;
            int nr = 0;
            st = model_forward_train(mt, &mb[i].tb, &ls, &nr);
            if (st == STATUS_OK) st = model_backward(mt, &mb[i].tb, &g);
            loss += ls;
        }
        norms[s] = optimizer_grad_norm(&opt, b, &gt);
        optimizer_step(&opt, b, &pt, &gt, oo.lr, norms[s], 1.0);
        fprintf(js, "%s%.17g", s ? ", " : "", loss / targets);
    }
    CHECK(st == STATUS_OK, "step failed: %s", status_message());
    fprintf(js, "], \"grad_norms\": [");
    for (int s = 0; s < steps; s++) fprintf(js, "%s%.17g", s ? ", " : "", norms[s]);
    fprintf(js, "], \"tensors\": [");
    dump(bin, &m->w, t, n, off, off1);
    for (int i = 0; i < n; i++) {
        fprintf(js, "%s{\"kind\": \"%s\", \"layer\": %d, ", i ? ", " : "", weight_kind_name(t[i].kind), t[i].layer);
        dump_json_shape(js, t[i].t);
        fprintf(js, ", \"initial_offset\": %ld, \"final_offset\": %ld}", off0[i], off1[i]);
    }
    fprintf(js, "], \"tied\": %d}\n", m->w.tied);
    fclose(bin);
    fclose(js);
    optimizer_free(&opt, b);
    param_table_free(&pt);
    param_table_free(&gt);
    weights_free_layers(&g);
    backend_free(b, gmem);
    model_train_free(mt);
    model_free(m);
    backend_close(b);
    for (int i = 0; i < n_mb; i++) free(mb[i].buf);
    free(mb);
    free(t);
    free(off0);
    free(off1);
    return 0;
}

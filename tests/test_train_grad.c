/* tests/test_train_grad.c - the driver of tests/test_train_grad.py: loads a model, runs
 * model_forward_train + model_backward on a packed micro-batch read from a file (`repeat`
 * times, accumulating, as gradient accumulation over micro-batches does), and writes the loss,
 * the weights as loaded and the accumulated gradients, so that the Python test can recompute
 * both with JAX (an independent autodiff) from the same weights.
 *
 * Usage: test_train_grad MODEL_DIR BATCH_FILE OUT_PREFIX [REPEAT [cpu|cuda [LORA_RANK LORA_ALPHA
 *        [LORA_DROPOUT]]]]
 * With LORA_RANK > 0 the base is frozen and adapters on every projection are trained: B is
 * drawn at random too (a fresh adapter's B is zero, which would leave dA zero), and the dump
 * holds the base weights (gradient offsets -1) and "lora_A" / "lora_B" rows with their
 * gradients (a fused group's one A under its leader's name: Phi-3's q for q, k, v and gate for
 * gate, up); OUT_PREFIX.peft/ receives the adapter in the PEFT layout. With LORA_DROPOUT > 0
 * the micro-batch draws its masks as training does (seed 11, step 3, micro-batch 2, written
 * to the JSON), for the Python reference to draw them again from lora.h's formula.
 * Environment: MOE_AUX_COEFF, MOE_Z_COEFF and MOE_AUX_SCALE set a mixture of experts'
 * auxiliary losses (model_train_set_moe_loss, train_batch.aux_scale); TRAIN_RECOMPUTE=mlp or full
 * picks a recomputation plan (selective mlp and layernorm; uniform over 1 layer).
 * With cuda it prints "SKIP: ..." and exits 77 when the build or the machine has no GPU.
 * BATCH_FILE (text): "n_tokens n_docs grad_scale", then n_tokens tokens, n_tokens targets,
 * n_tokens positions, n_docs + 1 document offsets.
 * Writes OUT_PREFIX.json {"loss_sum", "n_real", "tensors": [{"kind", "layer", "shape",
 * "weight_offset", "grad_offset"}], "moe_aux", "moe_z", "moe_load": (layers x experts)} and OUT_PREFIX.bin (f32 little-endian). Exit 0 or 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora.h"
#include "model_train.h"

static int read_ints(FILE *f, int32_t *out, int n)
{
    for (int i = 0; i < n; i++)
        if (fscanf(f, "%d", &out[i]) != 1) return -1;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: test_train_grad MODEL_DIR BATCH_FILE OUT_PREFIX [REPEAT]\n");
        return 2;
    }
    const int repeat = argc > 4 ? atoi(argv[4]) : 1;
    FILE *f = fopen(argv[2], "r");
    if (!f) return perror(argv[2]), 1;
    struct train_batch tb = {0};
    CHECK(fscanf(f, "%d %d %f", &tb.n_tokens, &tb.n_docs, &tb.grad_scale) == 3, "bad batch header");
    int32_t *tokens = malloc((size_t)tb.n_tokens * 4), *targets = malloc((size_t)tb.n_tokens * 4);
    int32_t *positions = malloc((size_t)tb.n_tokens * 4), *docs = malloc((size_t)(tb.n_docs + 1) * 4);
    CHECK(tokens && targets && positions && docs, "out of memory");
    CHECK(!read_ints(f, tokens, tb.n_tokens) && !read_ints(f, targets, tb.n_tokens) &&
              !read_ints(f, positions, tb.n_tokens) && !read_ints(f, docs, tb.n_docs + 1),
          "bad batch file");
    fclose(f);
    tb.tokens = tokens;
    tb.targets = targets;
    tb.positions = positions;
    tb.doc_start = docs;

    struct backend *b = NULL;
    struct model *m = NULL;
    const int cuda = argc > 5 && !strcmp(argv[5], "cuda");
    if (backend_open(cuda ? DEVICE_CUDA : DEVICE_CPU, 0, 0, &b) != STATUS_OK) {
        printf("SKIP: train_grad: no %s backend: %s\n", cuda ? "CUDA" : "CPU", status_message());
        return 77;
    }
    enum status st = model_load_as(argv[1], b, NULL, DTYPE_F32, &m);
    struct model_train *mt = NULL;
    /* A mixture of experts' auxiliary losses (MOE_AUX_COEFF, MOE_Z_COEFF, MOE_AUX_SCALE) and a
     * recomputation plan (TRAIN_RECOMPUTE: "mlp" selective mlp + layernorm, "full" uniform 1). */
    const char *rc = getenv("TRAIN_RECOMPUTE");
    struct train_memory plan = {.recompute = TRAIN_RECOMPUTE_NONE, .sets = 1};
    if (rc && !strcmp(rc, "mlp")) plan = (struct train_memory){.recompute = TRAIN_RECOMPUTE_SELECTIVE,
                                                               .modules = TRAIN_RECOMPUTE_MLP | TRAIN_RECOMPUTE_LAYERNORM, .sets = 1};
    if (rc && !strcmp(rc, "full")) plan = (struct train_memory){.recompute = TRAIN_RECOMPUTE_UNIFORM, .num_layers = 1, .sets = 1};
    tb.aux_scale = getenv("MOE_AUX_SCALE") ? (float)atof(getenv("MOE_AUX_SCALE")) : 0.0f;
    if (st == STATUS_OK) st = model_train_new(m, tb.n_tokens, &plan, &mt);
    if (st == STATUS_OK)
        model_train_set_moe_loss(mt, getenv("MOE_AUX_COEFF") ? (float)atof(getenv("MOE_AUX_COEFF")) : 0.0f,
                                 getenv("MOE_Z_COEFF") ? (float)atof(getenv("MOE_Z_COEFF")) : 0.0f);
    if (st == STATUS_OK) st = model_weights_make_writable(m);
    struct model_weights g = {0};
    void *gmem = NULL;
    const int lora_rank = argc > 6 ? atoi(argv[6]) : 0;
    struct lora *lora = NULL;
    if (st == STATUS_OK && lora_rank > 0) { /* the base frozen: no weight gradients at all */
        g.n_layers = m->w.n_layers;
        g.layers = calloc((size_t)g.n_layers, sizeof *g.layers);
        unsigned mask = (1u << LORA_TARGET_COUNT) - 1; /* LORA_TARGETS (e.g. "q,k,v,o"): fewer targets */
        if (getenv("LORA_TARGETS")) st = lora_parse_targets(getenv("LORA_TARGETS"), &mask);
        if (st == STATUS_OK) st = lora_create(m, lora_rank, (float)atof(argv[7]), mask, 5, &lora);
        if (st == STATUS_OK) lora_set_dropout(lora, argc > 8 ? (float)atof(argv[8]) : 0.0f, 11);
        if (st == STATUS_OK) model_train_set_lora(mt, lora);
        tb.dropout = 1;
        tb.step = 3;
        tb.micro = 2;
        if (st == STATUS_OK) st = lora_reserve(lora, b, tb.n_tokens, m->dtype);
        for (int i = 0; st == STATUS_OK && i < lora->n_layers; i++)
            for (int t = 0; t < LORA_TARGET_COUNT; t++) {
                struct tensor *bt = &lora->sites[i][t].b;
                if (!bt->data) continue;
                float *h = malloc(tensor_nbytes(bt));
                for (int64_t k = 0; k < tensor_numel(bt); k++) h[k] = 0.05f * (float)(((k * 7919 + i * 31 + t) % 199) - 99) / 99.0f;
                backend_upload(b, bt->data, h, tensor_nbytes(bt));
                free(h);
            }
    } else if (st == STATUS_OK) {
        st = weights_alloc_like(b, &m->w, DTYPE_F32, &g, &gmem);
    }
    double loss = 0.0;
    int n_real = 0;
    for (int r = 0; r < repeat && st == STATUS_OK; r++) {
        st = model_forward_train(mt, &tb, &loss, &n_real);
        if (st == STATUS_OK) st = model_backward(mt, &tb, &g);
    }
    if (st != STATUS_OK) {
        fprintf(stderr, "test_train_grad: %s: %s\n", status_name(st), status_message());
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s.bin", argv[3]);
    FILE *bin = fopen(path, "wb");
    snprintf(path, sizeof path, "%s.json", argv[3]);
    FILE *js = fopen(path, "w");
    CHECK(bin && js, "cannot write %s", argv[3]);
    const int max = weights_table_max(m->w.n_layers);
    struct weight_ref *wt = malloc((size_t)max * sizeof *wt), *gt = malloc((size_t)max * sizeof *gt);
    CHECK(wt && gt, "out of memory");
    const int n = weights_table(&m->w, m->layer_first, 1, wt);
    if (!lora) CHECK(weights_table(&g, m->layer_first, 1, gt) == n, "gradient table differs");
    fprintf(js, "{\"loss_sum\": %.17g, \"n_real\": %d, \"tensors\": [", loss, n_real);
    long off = 0;
    for (int i = 0; i < n; i++) {
        const struct tensor *w = wt[i].t, *gr = lora ? wt[i].t : gt[i].t;
        CHECK(w->dtype == DTYPE_F32 && gr->dtype == DTYPE_F32, "f32 expected");
        const size_t nb = tensor_nbytes(w);
        void *hw = malloc(nb), *hg = malloc(nb);
        CHECK(hw && hg, "out of memory");
        backend_download(b, hw, w->data, nb);
        backend_download(b, hg, gr->data, nb);
        fprintf(js, "%s{\"kind\": \"%s\", \"layer\": %d, \"shape\": [", i ? ", " : "",
                weight_kind_name(wt[i].kind), wt[i].layer);
        for (int d = 0; d < w->ndim; d++) fprintf(js, "%s%lld", d ? ", " : "", (long long)w->shape[d]);
        fprintf(js, "], \"weight_offset\": %ld, \"grad_offset\": %ld}", off, off + (long)nb);
        CHECK(fwrite(hw, 1, nb, bin) == nb && fwrite(hg, 1, nb, bin) == nb, "write failed");
        free(hw);
        free(hg);
        off += 2 * (long)nb;
    }
    for (int i = 0; lora && i < lora->n_layers; i++) /* adapters: A, B and their gradients */
        for (int t = 0; t < LORA_TARGET_COUNT; t++)
            for (int ab = 0; ab < 2 && lora->sites[i][t].a.data; ab++) {
                if (!ab && lora_target_leader(lora, (enum lora_target)t) != (enum lora_target)t) continue; /* fused: one A */
                const struct lora_site *s = &lora->sites[i][t];
                const struct tensor *x = ab ? &s->b : &s->a, *dx = ab ? &s->db : &s->da;
                const size_t nb = tensor_nbytes(x);
                void *hw = malloc(nb), *hg = malloc(nb);
                backend_download(b, hw, x->data, nb);
                backend_download(b, hg, dx->data, nb);
                CHECK(fwrite(hw, 1, nb, bin) == nb && fwrite(hg, 1, nb, bin) == nb, "write failed");
                fprintf(js, ", {\"kind\": \"lora_%c_%s\", \"layer\": %d, \"shape\": [%lld, %lld], "
                        "\"weight_offset\": %ld, \"grad_offset\": %ld}", ab ? 'B' : 'A', lora_target_name((enum lora_target)t),
                        m->layer_first + i, (long long)x->shape[0], (long long)x->shape[1], off, off + (long)nb);
                off += 2 * (long)nb;
                free(hw);
                free(hg);
            }
    double moe_aux = 0.0, moe_z = 0.0;
    const int E = m->cfg.n_experts;
    int64_t *load = calloc((size_t)(E ? E : 1) * (size_t)m->n_layers_local, sizeof *load);
    CHECK(load, "out of memory");
    CHECK(model_train_moe_stats(mt, &moe_aux, &moe_z, load) == (E ? repeat : 0), "MoE statistics of %d forwards", repeat);
    fprintf(js, "], \"moe_aux\": %.17g, \"moe_z\": %.17g, \"moe_load\": [", moe_aux, moe_z);
    for (int i = 0; i < E * m->n_layers_local; i++) fprintf(js, "%s%lld", i ? ", " : "", (long long)load[i]);
    free(load);
    fprintf(js, "], \"tied\": %d, \"lora_scale\": %.9g, \"lora_dropout\": %.9g, \"dropout_seed\": 11, "
            "\"step\": %lld, \"micro\": %d}\n", m->w.tied, lora ? lora->scale : 0.0,
            lora ? (double)lora->dropout : 0.0, (long long)tb.step, tb.micro);
    if (lora) {
        snprintf(path, sizeof path, "%s.peft", argv[3]);
        CHECK(lora_save_peft(lora, m, b, path, argv[1]) == STATUS_OK, "PEFT save: %s", status_message());
        lora_free(lora, b);
    }
    fclose(bin);
    fclose(js);
    free(wt);
    free(gt);
    weights_free_layers(&g);
    backend_free(b, gmem);
    model_train_free(mt);
    model_free(m);
    backend_close(b);
    free(tokens);
    free(targets);
    free(positions);
    free(docs);
    return 0;
}

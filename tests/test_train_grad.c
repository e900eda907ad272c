/* tests/test_train_grad.c - the driver of tests/test_train_grad.py: loads a model, runs
 * model_forward_train + model_backward on a packed micro-batch read from a file (`repeat`
 * times, accumulating, as gradient accumulation over micro-batches does), and writes the loss,
 * the weights as loaded and the accumulated gradients, so that the Python test can recompute
 * both with JAX (an independent autodiff) from the same weights.
 *
 * Usage: test_train_grad MODEL_DIR BATCH_FILE OUT_PREFIX [REPEAT [cpu|cuda]]
 * With cuda it prints "SKIP: ..." and exits 77 when the build or the machine has no GPU.
 * BATCH_FILE (text): "n_tokens n_docs grad_scale", then n_tokens tokens, n_tokens targets,
 * n_tokens positions, n_docs + 1 document offsets.
 * Writes OUT_PREFIX.json {"loss_sum", "n_real", "tensors": [{"kind", "layer", "shape",
 * "weight_offset", "grad_offset"}]} and OUT_PREFIX.bin (f32 little-endian). Exit 0 or 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (st == STATUS_OK) st = model_reserve_train(m, tb.n_tokens);
    if (st == STATUS_OK) st = model_weights_make_writable(m);
    struct model_weights g;
    void *gmem = NULL;
    if (st == STATUS_OK) st = weights_alloc_like(b, &m->w, DTYPE_F32, &g, &gmem);
    double loss = 0.0;
    int n_real = 0;
    for (int r = 0; r < repeat && st == STATUS_OK; r++) {
        st = model_forward_train(m, &tb, &loss, &n_real);
        if (st == STATUS_OK) st = model_backward(m, &tb, &g);
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
    CHECK(weights_table(&g, m->layer_first, 1, gt) == n, "gradient table differs");
    fprintf(js, "{\"loss_sum\": %.17g, \"n_real\": %d, \"tensors\": [", loss, n_real);
    long off = 0;
    for (int i = 0; i < n; i++) {
        const struct tensor *w = wt[i].t, *gr = gt[i].t;
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
    fprintf(js, "], \"tied\": %d}\n", m->w.tied);
    fclose(bin);
    fclose(js);
    free(wt);
    free(gt);
    weights_free_layers(&g);
    backend_free(b, gmem);
    model_free(m);
    backend_close(b);
    free(tokens);
    free(targets);
    free(positions);
    free(docs);
    return 0;
}

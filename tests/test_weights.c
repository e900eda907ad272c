/* tests/test_weights.c - the weights' layout table (engine/model/weights.h) on real checkpoints
 * of the golden fixture: the table lists every parameter once (its element count equals the
 * file's, a tied LM head counted once), and state allocated like the weights (gradients,
 * moments) has the same shapes, its own zero-filled memory, and keeps the tie.
 * Run: test_weights GOLDEN_DIR. Prints one line per check and "N passed, M failed"; exit 77
 * (SKIP) when the fixture is absent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model.h"
#include "safetensors.h"

/* Elements of every tensor in DIR/model.safetensors (the file's own count, not the model's). */
static int64_t file_numel(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct safetensors *st = NULL;
    if (safetensors_open(path, &st) != STATUS_OK) return -1;
    int64_t n = 0;
    for (int i = 0; i < safetensors_count(st); i++) n += safetensors_tensor(st, i)->numel;
    safetensors_close(st);
    return n;
}

static void check_model(struct backend *b, const char *golden, const char *name)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", golden, name);
    struct model *m = NULL;
    enum status st = model_load(dir, b, NULL, &m);
    check(st == STATUS_OK, "%s: loads%s%s", name, st == STATUS_OK ? "" : ": ", st == STATUS_OK ? "" : status_message());
    if (st != STATUS_OK) return;

    const int max = weights_table_max(m->w.n_layers);
    struct weight_ref *all = malloc((size_t)max * sizeof *all), *present = malloc((size_t)max * sizeof *present);
    CHECK(all && present, "out of memory");
    int n_all = weights_table(&m->w, m->layer_first, 0, all);
    int n_present = weights_table(&m->w, m->layer_first, 1, present);
    check(n_all <= max && n_present <= n_all && n_present > 0, "%s: table of %d rows, %d present (max %d)",
          name, n_all, n_present, max);
    int kinds_ok = 1;
    for (int i = 0; i < n_present; i++) {
        if (!present[i].t->data) kinds_ok = 0;
        if (present[i].kind == WEIGHT_KIND_LM_HEAD && m->w.tied) kinds_ok = 0;
        if ((present[i].layer >= 0) != (present[i].local_layer >= 0)) kinds_ok = 0;
    }
    check(kinds_ok, "%s: present rows have data, a tied LM head is not listed", name);
    const int64_t numel = weights_numel(&m->w), want = file_numel(dir);
    check(numel == want, "%s: the table holds %lld parameters, the file %lld", name, (long long)numel,
          (long long)want);

    struct model_weights g;
    void *mem = NULL;
    st = weights_alloc_like(b, &m->w, DTYPE_F32, &g, &mem);
    check(st == STATUS_OK, "%s: gradients allocated like the weights", name);
    if (st == STATUS_OK) {
        struct weight_ref *gt = malloc((size_t)max * sizeof *gt);
        CHECK(gt, "out of memory");
        int n_g = weights_table(&g, m->layer_first, 1, gt);
        int same = n_g == n_present, zero = 1, disjoint = 1;
        for (int i = 0; same && i < n_g; i++) {
            same = gt[i].kind == present[i].kind && gt[i].layer == present[i].layer &&
                   gt[i].t->ndim == present[i].t->ndim && gt[i].t->dtype == DTYPE_F32 &&
                   tensor_numel(gt[i].t) == tensor_numel(present[i].t);
            for (int d = 0; same && d < gt[i].t->ndim; d++) same = gt[i].t->shape[d] == present[i].t->shape[d];
            const float *p = gt[i].t->data;
            for (int64_t j = 0; same && j < tensor_numel(gt[i].t); j++) zero &= p[j] == 0.0f;
            if (i > 0 && (char *)gt[i - 1].t->data + tensor_nbytes(gt[i - 1].t) > (char *)gt[i].t->data) disjoint = 0;
        }
        check(same, "%s: every gradient tensor has its weight's kind, layer and shape", name);
        check(zero, "%s: gradients start at zero", name);
        check(disjoint, "%s: gradient tensors do not overlap", name);
        check(g.tied == m->w.tied && (!g.tied || g.lm_head.data == g.tok_embedding.data),
              "%s: the tie is kept (tied %d)", name, g.tied);
        /* Fill, then zero again through the table. */
        for (int i = 0; i < n_g; i++) {
            float *p = gt[i].t->data;
            for (int64_t j = 0; j < tensor_numel(gt[i].t); j++) p[j] = 1.0f;
        }
        weights_zero(b, &g);
        zero = 1;
        for (int i = 0; i < n_g; i++) {
            const float *p = gt[i].t->data;
            for (int64_t j = 0; j < tensor_numel(gt[i].t); j++) zero &= p[j] == 0.0f;
        }
        check(zero, "%s: weights_zero clears every tensor", name);
        free(gt);
        weights_free_layers(&g);
        backend_free(b, mem);
    }
    free(all);
    free(present);
    model_free(m);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_weights GOLDEN_DIR\n");
        return 2;
    }
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/gpt2/config.json", argv[1]);
    FILE *f = fopen(probe, "r");
    if (!f) {
        printf("SKIP: weights: no golden fixture at %s\n", argv[1]);
        return 77;
    }
    fclose(f);
    struct backend *b = NULL;
    CHECK(backend_open(DEVICE_CPU, 0, 1, &b) == STATUS_OK, "cpu backend: %s", status_message());
    check_model(b, argv[1], "gpt2");      /* tied embeddings, biases, layernorm */
    check_model(b, argv[1], "llama_f16"); /* untied, gated MLP, no biases */
    snprintf(probe, sizeof probe, "%s/stories260K/config.json", argv[1]);
    if ((f = fopen(probe, "r"))) {
        fclose(f);
        check_model(b, argv[1], "stories260K");
    }
    backend_close(b);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

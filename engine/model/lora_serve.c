/* engine/model/lora_serve.c - a served adapter: made ready to serve in the activations' dtype
 * (lora_serve_prepare) and applied to the rows of a step (lora_apply, lora.h); creation, training
 * and the PEFT files are lora.c.
 * Tests: tests/test_model.c (golden_phi3_lora, model_cpu_bf16_phi3_lora, model_cuda_phi3_lora),
 * tests/server (the served adapters). */
#include "lora.h"

enum status lora_serve_prepare(struct lora *l, const struct model *m)
{
    const enum dtype dt = m->dtype;
    if (dt == DTYPE_F32) return STATUS_OK;
    struct backend *b = m->b;
    void *mem = NULL;
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        for (int i = 0; i < l->n_layers; i++)
            for (int t = 0; t < LORA_TARGET_COUNT; t++) {
                struct lora_site *s = &l->sites[i][t];
                if (!s->a.data) continue;
                const int leads = lora_target_leader(l, (enum lora_target)t) == (enum lora_target)t;
                struct tensor *ts[2] = {&s->a, &s->b};
                for (int k = leads ? 0 : 1; k < 2; k++) { /* a fused member's A is its leader's */
                    struct tensor nt = tensor_make(pass ? (char *)mem + off : NULL, dt, b->device, 2, ts[k]->shape[0],
                                                   ts[k]->shape[1]);
                    off += (tensor_nbytes(&nt) + 255) / 256 * 256;
                    if (!pass) continue;
                    op_cast(b, &nt, ts[k]);
                    *ts[k] = nt;
                }
            }
        if (pass == 0) {
            enum status st = backend_alloc(b, off, &mem);
            if (st != STATUS_OK) return st;
        }
    }
    for (int i = 0; i < l->n_layers; i++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++) {
            struct lora_site *s = &l->sites[i][t];
            if (!s->a.data) continue;
            s->a = l->sites[i][lora_target_leader(l, (enum lora_target)t)].a;
            s->da = (struct tensor){0};
            s->db = (struct tensor){0};
        }
    backend_synchronize(b); /* the casts read the f32 copies */
    backend_free(b, l->mem);
    l->mem = mem;
    return STATUS_OK;
}

void lora_apply(const struct lora *l, struct backend *b, int layer, enum lora_target t, const struct tensor *y,
                const struct tensor *x, const struct tensor *u_buf, const struct tensor *z_buf)
{
    const struct lora_site *s = &l->sites[layer][t];
    if (!s->a.data) return;
    const int64_t T = x->shape[0];
    CHECK(T * l->rank <= tensor_numel(u_buf) && T * s->b.shape[0] <= tensor_numel(z_buf),
          "LoRA: %lld rows exceed the scratch", (long long)T);
    struct tensor u = tensor_view2(u_buf, T, l->rank);
    struct tensor z = tensor_view2(z_buf, T, s->b.shape[0]);
    /* Row by row whatever T is (the backend's row-invariant paths, as a verification step's):
     * through sgemm a row's last bits depended on how many rows shared the step, so a prefix-cache
     * hit (a shorter prefill) or the batch around a request changed greedy answers (the default
     * chat model: 16 of 24 held-out chat answers differed when asked a second time, 2026-12-05).
     * The adapter's products are of rank r, a small part of a step either way. */
    const int was = b->rows_as_decode;
    b->rows_as_decode = 1;
    op_matmul(b, &u, x, &s->a, NULL);    /* u = x A^T (T, r) */
    op_scale(b, &u, &u, l->scale);        /* u = s x A^T */
    op_matmul(b, &z, &u, &s->b, NULL);    /* z = u B^T (T, out) */
    b->rows_as_decode = was;
    op_add(b, y, y, &z);
}

/* engine/model/lora_merge.c - an adapter merged into its base's f32 weights (W += scale B A), in
 * double per element: what `shardlm merge-lora` writes (lora.h).
 * Tests: tests/test_train.sh (train_cli), tests/test_train_phi3_lora.sh (merge-lora vs NumPy). */
#include <stdlib.h>

#include "lora.h"

void lora_merge_into(const struct lora *l, struct model *m)
{
    for (int i = 0; i < l->n_layers; i++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++) {
            const struct lora_site *s = &l->sites[i][t];
            struct tensor *w = (struct tensor *)lora_base_weight(m, i, (enum lora_target)t);
            if (!s->a.data || !w) continue;
            CHECK(w->dtype == DTYPE_F32, "merging into f32 weights only");
            const int64_t out = w->shape[0], in = w->shape[1], r = l->rank;
            float *hw = malloc(tensor_nbytes(w)), *ha = malloc(tensor_nbytes(&s->a)), *hb = malloc(tensor_nbytes(&s->b));
            CHECK(hw && ha && hb, "out of host memory merging an adapter");
            backend_download(m->b, hw, w->data, tensor_nbytes(w));
            backend_download(m->b, ha, s->a.data, tensor_nbytes(&s->a));
            backend_download(m->b, hb, s->b.data, tensor_nbytes(&s->b));
            for (int64_t o = 0; o < out; o++)
                for (int64_t k = 0; k < r; k++) {
                    const double c = (double)l->scale * hb[o * r + k];
                    if (c == 0.0) continue;
                    for (int64_t j = 0; j < in; j++) hw[o * in + j] += (float)(c * ha[k * in + j]);
                }
            backend_upload(m->b, w->data, hw, tensor_nbytes(w));
            free(hw);
            free(ha);
            free(hb);
        }
}

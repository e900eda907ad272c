/* engine/model/device_sampling.c - the device's share of sampling (forward_batch.greedy_ids /
 * top_k; device_sampling.h): a step's edits and masks, then the argmax or the top candidates
 * with their masses, draws and normalisers, in one upload and one download.
 * Every input (the temperatures, uniforms, top_p, which rows want a normaliser; the edits and
 * masks) is laid out per step in one device buffer and goes up in one copy; every output (the
 * logits' sum of squares, the argmax or the candidates, masses, draws, normalisers) is laid out
 * per step, packed, in another and comes down in one. On CUDA each copy from pageable memory is
 * a synchronisation (its cost not yet measured there): a sampled step made up to ten uploads and
 * seven downloads.
 * Tests: tests/test_step_graph.c (a step's copies counted; the candidates, masses, draws and
 * normalisers against the downloaded logits); the server suites with SHARDLM_DEVICE_SAMPLING=1
 * (tests/server/test_device_sampling.py). */
#include "device_sampling.h"

#include <math.h>
#include <string.h>

/* The next piece of a per-step layout: its offset, bytes rounded up to 16 (0 bytes: none). */
static size_t piece(size_t *end, size_t bytes)
{
    const size_t at = *end;
    *end += (bytes + 15) / 16 * 16;
    return at;
}

/* Where a step's outputs lie in ws.sample_out: n rows, top_k candidates (0: the argmax), and
 * which of the optional outputs it asks for. */
struct out_layout {
    size_t ss, greedy, mass, draw_ids, draw_margin, lse, top_v, top_i, end;
};

static struct out_layout out_layout(int64_t n, int top_k, int mass, int draw, int lse)
{
    struct out_layout o = {0};
    const size_t row = (size_t)n * sizeof(float);
    o.ss = piece(&o.end, sizeof(float));
    o.greedy = piece(&o.end, top_k > 0 ? 0 : row);
    o.mass = piece(&o.end, mass ? row : 0);
    o.draw_ids = piece(&o.end, draw ? row : 0);
    o.draw_margin = piece(&o.end, draw ? row : 0);
    o.lse = piece(&o.end, lse ? row : 0);
    o.top_v = piece(&o.end, (size_t)top_k * row);
    o.top_i = piece(&o.end, (size_t)top_k * row);
    return o;
}

size_t device_sampling_out_bytes(int64_t max_logits, int top_k)
{
    return out_layout(max_logits, top_k, 1, 1, 1).end;
}

/* Grows *buf (device) or the host image to at least need bytes; 0 when out of memory. */
static int grow(struct backend *b, void **buf, size_t *cap, size_t need, int host)
{
    if (need <= *cap) return 1;
    if (host) backend_host_free(b, *buf);
    else backend_free(b, *buf);
    *buf = NULL, *cap = 0;
    const enum status st = host ? backend_host_alloc(b, need, buf) : backend_alloc(b, need, buf);
    if (st != STATUS_OK) return 0;
    *cap = need;
    return 1;
}

static struct tensor at(const void *base, size_t off, enum dtype t, struct backend *b, int64_t rows, int64_t cols)
{
    return cols > 0 ? tensor_make((char *)base + off, t, b->device, 2, rows, cols)
                    : tensor_make((char *)base + off, t, b->device, 1, rows);
}

int device_sampling_run(struct model *m, const struct forward_batch *fb, struct tensor *full)
{
    struct backend *b = m->b;
    struct model_workspace *ws = &m->ws;
    const int64_t n = fb->n_logits;
    const int K = fb->top_k;
    CHECK(K <= model_top_width(m->cfg.vocab_size), "forward batch: top_k %d of at most %d", K,
          model_top_width(m->cfg.vocab_size));
    const int edited = fb->n_edits > 0 || fb->n_masks > 0;
    const int mass = K > 0 && fb->top_mass, draw = K > 0 && fb->draw_ids, lse = K > 0 && fb->top_lse;

    /* The inputs, laid out and uploaded in one copy. */
    const size_t row = (size_t)n * sizeof(float), ne = (size_t)fb->n_edits * sizeof(int32_t);
    const size_t nm = (size_t)fb->n_masks * sizeof(int32_t), nw = nm * (size_t)fb->mask_words;
    size_t in = 0;
    const size_t in_inv = piece(&in, mass ? row : 0), in_temp = piece(&in, draw ? row : 0);
    const size_t in_u = piece(&in, draw ? row : 0), in_top_p = piece(&in, draw && fb->draw_top_p ? row : 0);
    const size_t in_want = piece(&in, lse ? row : 0), in_rows = piece(&in, ne), in_ids = piece(&in, ne);
    const size_t in_vals = piece(&in, 3 * ne), in_mrows = piece(&in, nm), in_masks = piece(&in, nw);
    const struct out_layout o = out_layout(n, K, mass, draw, lse);
    CHECK(o.end <= ws->sample_out_bytes, "model: a step's %zu bytes of sampling outputs past the workspace's %zu",
          o.end, ws->sample_out_bytes);
    if (!grow(b, &ws->sample_in, &ws->sample_in_bytes, in, 0) ||
        !grow(b, &ws->host_sample, &ws->host_sample_bytes, in > o.end ? in : o.end, 1))
        return -1;
    char *h = ws->host_sample;
    if (in > 0) {
        if (mass) memcpy(h + in_inv, fb->top_inv_temp, row);
        if (draw) memcpy(h + in_temp, fb->draw_temp, row), memcpy(h + in_u, fb->draw_u, row);
        if (draw && fb->draw_top_p) memcpy(h + in_top_p, fb->draw_top_p, row);
        if (lse) memcpy(h + in_want, fb->lse_want, row);
        if (ne) memcpy(h + in_rows, fb->edit_rows, ne), memcpy(h + in_ids, fb->edit_ids, ne);
        if (ne) memcpy(h + in_vals, fb->edit_vals, 3 * ne);
        if (nm) memcpy(h + in_mrows, fb->mask_rows, nm), memcpy(h + in_masks, fb->masks, nw);
        backend_upload(b, ws->sample_in, h, in);
    }
    const void *din = ws->sample_in, *dout = ws->sample_out.data;

    struct tensor ss = at(dout, o.ss, DTYPE_F32, b, 1, 0);
    float ss_host = 0.0f;
    backend_memset_zero(b, ss.data, sizeof ss_host);
    op_sum_squares(b, &ss, full);
    if (edited) { /* only over finite logits: else the host samples the rows as they came */
        backend_download(b, &ss_host, ss.data, sizeof ss_host);
        if (!isfinite(ss_host)) return 0;
        if (full->dtype != DTYPE_F32) { /* edited as the host edits them: in f32 */
            struct tensor lg32 = tensor_make(ws->logits_f32.data, DTYPE_F32, b->device, 2, tensor_rows(full),
                                             tensor_cols(full));
            op_cast(b, &lg32, full);
            *full = lg32;
        }
        if (fb->n_edits > 0) {
            const struct tensor rows = at(din, in_rows, DTYPE_I32, b, fb->n_edits, 0);
            const struct tensor ids = at(din, in_ids, DTYPE_I32, b, fb->n_edits, 0);
            const struct tensor vals = at(din, in_vals, DTYPE_F32, b, fb->n_edits, 3);
            op_logit_edit(b, full, &rows, &ids, &vals);
        }
        if (fb->n_masks > 0) {
            const struct tensor mrows = at(din, in_mrows, DTYPE_I32, b, fb->n_masks, 0);
            const struct tensor masks = at(din, in_masks, DTYPE_I32, b, fb->n_masks, fb->mask_words);
            op_logit_mask(b, full, &mrows, &masks);
        }
        ws->logits_edited = 1;
    }
    if (mass) {
        const struct tensor inv_temp = at(din, in_inv, DTYPE_F32, b, n, 0), out = at(dout, o.mass, DTYPE_F32, b, n, 0);
        op_logit_mass(b, &out, full, &inv_temp);
    }
    if (draw) {
        const struct tensor temp = at(din, in_temp, DTYPE_F32, b, n, 0), u = at(din, in_u, DTYPE_F32, b, n, 0);
        const struct tensor top_p = at(din, in_top_p, DTYPE_F32, b, n, 0);
        struct tensor ids = at(dout, o.draw_ids, DTYPE_I32, b, n, 0), margin = at(dout, o.draw_margin, DTYPE_F32, b, n, 0);
        op_logit_draw(b, &ids, &margin, full, &temp, fb->draw_top_p ? &top_p : NULL, &u);
    }
    if (lse) {
        const struct tensor want = at(din, in_want, DTYPE_F32, b, n, 0), out = at(dout, o.lse, DTYPE_F32, b, n, 0);
        op_logit_lse(b, &out, full, &want);
    }
    if (K > 0) {
        struct tensor top_v = at(dout, o.top_v, DTYPE_F32, b, n, K), top_i = at(dout, o.top_i, DTYPE_I32, b, n, K);
        op_topk(b, &top_v, &top_i, full);
    } else {
        struct tensor ids = at(dout, o.greedy, DTYPE_I32, b, n, 0);
        op_argmax(b, &ids, full);
    }

    /* The outputs, in one copy. */
    backend_download(b, h, dout, o.end);
    memcpy(&ss_host, h + o.ss, sizeof ss_host);
    if (!edited && !isfinite(ss_host)) return 0;
    if (K > 0) {
        memcpy(fb->top_values, h + o.top_v, (size_t)K * row);
        memcpy(fb->top_ids, h + o.top_i, (size_t)K * row);
        if (mass) memcpy(fb->top_mass, h + o.mass, row);
        if (lse) memcpy(fb->top_lse, h + o.lse, row);
        if (draw) memcpy(fb->draw_ids, h + o.draw_ids, row), memcpy(fb->draw_margin, h + o.draw_margin, row);
    } else {
        memcpy(fb->greedy_ids, h + o.greedy, row);
    }
    *fb->greedy_done = 1;
    return 1;
}

void device_sampling_free(struct model *m)
{
    backend_free(m->b, m->ws.sample_in);
    backend_host_free(m->b, m->ws.host_sample);
    m->ws.sample_in = m->ws.host_sample = NULL;
    m->ws.sample_in_bytes = m->ws.host_sample_bytes = 0;
}

/* engine/formats/checkpoint.c - checkpoint directories (HF, sharded HF, Megatron-style) as one
 * source of canonical, tensor-parallel-sliced weights: where each weight lives in each layout,
 * and checkpoint_describe / checkpoint_get. The layouts and the slicing rules are documented
 * in checkpoint.h; the names come from weight_names.c.
 * Not here: opening the directory (checkpoint_open.c), the writers (checkpoint_write.c), the
 * safetensors format (safetensors.c), config.json (config.c), device memory (engine/model).
 * Tests: tests/test_formats.c (every weight, every tp, from HF, sharded HF and Megatron sources);
 * tests/test_gguf_serve.c and tests/test_keep_blocks.c (blocks from a GGUF, a kept-blocks
 * directory and its Megatron reshard, at tp 1 and 2; the block-cutting refusal).
 *
 * How a slice is produced: every weight is a canonical matrix (rows, cols) (vectors are
 * (n, 1)). A "source" says where canonical element (r, c) lives: which file tensor ("part"),
 * at which element, and how many following canonical columns are contiguous there (a "run",
 * with a stride: 1, or the row length for GPT-2's transposed Conv1D weights). The requested
 * slice is a block of canonical rows x columns; it is copied run by run, converting dtype.
 * When the whole block is one contiguous, aligned run in the requested dtype, it is served as
 * a pointer into the mapping instead. */
#include "checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_impl.h"
#include "gguf.h"
#include "gguf_convert.h"
#include "quant.h"
#include "safetensors.h"

void checkpoint_pp_layers(int n_layers, int pp_size, int pp_rank, int *first, int *count)
{
    CHECK(pp_size >= 1 && pp_rank >= 0 && pp_rank < pp_size, "pp %d of %d", pp_rank, pp_size);
    int base = n_layers / pp_size, extra = n_layers % pp_size;
    *count = base + (pp_rank < extra);
    *first = pp_rank * base + (pp_rank < extra ? pp_rank : extra);
}

/* ---- where canonical elements live ------------------------------------------------------ */

enum ck_mode {
    CK_DIRECT,     /* (r, c) -> part 0, source row off + r, column c */
    CK_TRANSPOSED, /* (r, c) -> part 0, source row c, column off + r (GPT-2 Conv1D) */
    CK_QKV,        /* Megatron linear_qkv: off = 0 q, 1 k, 2 v */
    CK_ROWS_SPLIT, /* part r / part_rows, source row off + r % part_rows */
    CK_COLS_SPLIT, /* part c / part_cols, source column c % part_cols */
    CK_EXPERTS_IO, /* GPT-OSS's 3-D experts, (in, out) per expert: row r of expert e = r / part_rows
                      at e * part_stride + c * scols + off + row_step * (r % part_rows) */
};

struct ck_source {
    enum ck_mode            mode;
    int                     ndim;       /* canonical: 1 or 2 */
    int64_t                 rows, cols; /* canonical (cols 1 for vectors) */
    int64_t                 off;
    int64_t                 part_rows, part_cols;
    int64_t                 scols;      /* row length of every part (1 for 1-D parts) */
    int64_t                 q_per_group, groups_per_part, head_dim; /* CK_QKV */
    int64_t                 part_stride, row_step;                  /* CK_EXPERTS_IO */
    int                     n_parts;
    const struct st_tensor *part[CK_MAX_PARTS];
};

struct ck_slice {
    int     ndim;
    int64_t r0, nr, c0, nc, rows_valid;
};

static const char *ck_where(const struct checkpoint *ck, int fi)
{
    if (ck->files->gguf) return "the GGUF file";
    return fi >= 0 ? ck->files->file_names[fi] : CK_HF_INDEX;
}

static void ck_shape_string(char *buf, size_t n, int ndim, const int64_t *shape)
{
    int off = snprintf(buf, n, "[");
    for (int i = 0; i < ndim && off > 0 && (size_t)off < n; i++)
        off += snprintf(buf + off, n - (size_t)off, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (off > 0 && (size_t)off < n) snprintf(buf + off, n - (size_t)off, "]");
}

/* Looks up a part, checks its dtype and shape (ndim 1: (d0); 2: (d0, d1); 3: (d0, d1, d2)) and
 * appends it. */
static enum status ck_add_part(const struct checkpoint *ck, struct ck_source *s, int fi, const char *name,
                               const struct st_tensor *t, int ndim, int64_t d0, int64_t d1, int64_t d2)
{
    if (!t)
        return status_errorf(STATUS_BAD_FORMAT, "checkpoint %s: tensor '%s' not found in %s%s",
                             ck->files->dir, name, ck_where(ck, fi),
                             fi < 0 ? " (the shards' weight map)" : "");
    const char *where = ck_where(ck, fi);
    if (!t->supported) {
        char supported[256] = "";
        if (ck->files->gguf) gguf_supported_types(supported, sizeof supported);
        return status_errorf(STATUS_UNSUPPORTED,
                             "checkpoint %s: tensor %s in %s has dtype %s which shardlm does not load%s%s%s",
                             ck->files->dir, name, where, t->dtype_name, *supported ? " (it reads " : "",
                             supported, *supported ? ")" : "");
    }
    if (t->dtype == DTYPE_I32)
        return status_errorf(STATUS_BAD_FORMAT,
                             "checkpoint %s: tensor '%s' in %s has dtype I32; weights are floats",
                             ck->files->dir, name, where);
    int64_t want[3] = {d0, d1, d2};
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim >= 2 && t->shape[1] != d1) || (ndim == 3 && t->shape[2] != d2)) {
        char found[128], expected[64];
        ck_shape_string(found, sizeof found, t->ndim, t->shape);
        ck_shape_string(expected, sizeof expected, ndim, want);
        return status_errorf(STATUS_BAD_FORMAT,
                             "checkpoint %s: tensor '%s' in %s has shape %s, expected %s from "
                             "config.json",
                             ck->files->dir, name, where, found, expected);
    }
    if ((dtype_is_quant(t->dtype) || (s->n_parts && dtype_is_quant(s->part[0]->dtype))) &&
        (s->mode == CK_TRANSPOSED || (s->n_parts && s->part[0]->dtype != t->dtype)))
        return status_errorf(STATUS_BAD_FORMAT,
                             "checkpoint %s: tensor '%s' in %s is stored as %s, which %s", ck->files->dir, name,
                             where, dtype_name(t->dtype),
                             s->mode == CK_TRANSPOSED ? "a transposed (Conv1D) weight cannot be: blocks are rows"
                                                      : "the other ranks' parts of the weight are not: blocks "
                                                        "must be of one type");
    CHECK(s->n_parts < CK_MAX_PARTS, "too many parts");
    s->part[s->n_parts++] = t;
    s->scols = ndim == 3 ? d2 : ndim == 2 ? d1 : 1;
    return STATUS_OK;
}

static enum status ck_part3(const struct checkpoint *ck, struct ck_source *s, int fi, const char *name, int ndim,
                            int64_t d0, int64_t d1, int64_t d2)
{
    return ck_add_part(ck, s, fi, name, ck_try(ck, fi, name), ndim, d0, d1, d2);
}

static enum status ck_part(const struct checkpoint *ck, struct ck_source *s, int fi, const char *name, int ndim,
                           int64_t d0, int64_t d1)
{
    return ck_part3(ck, s, fi, name, ndim, d0, d1, 1);
}

/* ---- sources per layout ----------------------------------------------------------------- */

/* The file that HF tensors are looked up in: the single file, or the shards' weight map. */
static int ck_hf_file(const struct checkpoint *ck) { return ck->layout == CHECKPOINT_LAYOUT_HF ? 0 : -1; }

/* HF experts: the router, and one tensor per expert stacked expert by expert (CK_ROWS_SPLIT over
 * the experts' parts). Mixtral: block_sparse_moe.gate, experts.E.w1 (gate), w3 (up), w2 (down);
 * Qwen 3 MoE and OLMoE: mlp.gate, mlp.experts.E.gate_proj, up_proj, down_proj. */
static enum status ck_source_hf_experts(const struct checkpoint *ck, enum weight_kind kind, int l, struct ck_source *s)
{
    const struct model_config *c = &ck->cfg;
    const int mixtral = config_hf_mixtral_names(c);
    const char *prefix = ck->files->hf_prefix, *block = mixtral ? "block_sparse_moe" : "mlp";
    char name[CK_NAME];
    s->mode = CK_DIRECT;
    s->off = 0;
    if (kind == WEIGHT_KIND_ROUTER) {
        snprintf(name, sizeof name, "%slayers.%d.%s.gate.weight", prefix, l, block);
        return ck_part(ck, s, ck_hf_file(ck), name, 2, c->n_experts, c->d_model);
    }
    static const char *const qwen[] = {"gate_proj", "up_proj", "down_proj"}, *const mix[] = {"w1", "w3", "w2"};
    const int which = kind == WEIGHT_KIND_EXP_GATE ? 0 : kind == WEIGHT_KIND_EXP_UP ? 1 : 2;
    const int64_t rows = which == 2 ? c->d_model : c->moe_ffn, cols = which == 2 ? c->moe_ffn : c->d_model;
    if (c->n_experts > CK_MAX_PARTS)
        return status_errorf(STATUS_UNSUPPORTED, "checkpoint %s: %d experts; at most %d are read", ck->files->dir,
                             c->n_experts, CK_MAX_PARTS);
    s->mode = CK_ROWS_SPLIT;
    s->part_rows = rows;
    for (int e = 0; e < c->n_experts; e++) {
        snprintf(name, sizeof name, "%slayers.%d.%s.experts.%d.%s.weight", prefix, l, block, e,
                 mixtral ? mix[which] : qwen[which]);
        enum status st = ck_part(ck, s, ck_hf_file(ck), name, 2, rows, cols);
        if (st != STATUS_OK) return st;
    }
    return STATUS_OK;
}

/* HF GPT-OSS experts (transformers' GptOssExperts): per layer mlp.experts.gate_up_proj (E, d, 2F)
 * with gate in the even and up in the odd output columns, its bias (E, 2F) alike, down_proj
 * (E, F, d) and its bias (E, d): (in, out) per expert, read transposed into the canonical
 * (out, in) rows. The router is mlp.router (its table names). */
static enum status ck_source_hf_gpt_oss_experts(const struct checkpoint *ck, enum weight_kind kind, int l,
                                                struct ck_source *s)
{
    const struct model_config *c = &ck->cfg;
    const int64_t E = c->n_experts, F = c->moe_ffn, d = c->d_model;
    const int down = kind == WEIGHT_KIND_EXP_DOWN || kind == WEIGHT_KIND_EXP_DOWN_BIAS;
    const int bias = s->ndim == 1;
    char name[CK_NAME];
    if (!bias && ck_mxfp4_present(ck, ck_hf_file(ck), l)) { /* the published MXFP4 blocks, repacked */
        const struct st_tensor *t;
        enum status st = ck_mxfp4_experts(ck, ck_hf_file(ck), kind, l, &t);
        if (st != STATUS_OK) return st;
        s->mode = CK_DIRECT;
        s->off = 0;
        return ck_add_part(ck, s, ck_hf_file(ck), t->name, t, 2, s->rows, s->cols, 1);
    }
    snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%s%s", ck->files->hf_prefix, l,
             down ? "down_proj" : "gate_up_proj", bias ? "_bias" : "");
    s->mode = CK_EXPERTS_IO;
    s->part_rows = down ? d : F;                       /* canonical rows per expert */
    s->row_step = down ? 1 : 2;                        /* gate and up interleaved */
    s->off = kind == WEIGHT_KIND_EXP_UP || kind == WEIGHT_KIND_EXP_UP_BIAS; /* up: the odd columns */
    const int64_t out = down ? d : 2 * F, in = down ? F : d;
    s->part_stride = bias ? out : in * out;
    enum status st = bias ? ck_part(ck, s, ck_hf_file(ck), name, 2, E, out)
                          : ck_part3(ck, s, ck_hf_file(ck), name, 3, E, in, out);
    if (st == STATUS_OK && dtype_is_quant(s->part[0]->dtype))
        return status_errorf(STATUS_UNSUPPORTED, "checkpoint %s: tensor '%s' is stored in blocks; GPT-OSS's "
                             "experts are read from float tensors", ck->files->dir, name);
    return st;
}

/* HF Llama family (Llama, Mistral, Gemma 3): every tensor as it is, under the body prefix. */
static enum status ck_source_hf_llama(const struct checkpoint *ck, enum weight_kind kind, int l,
                                      struct ck_source *s)
{
    if (ck->cfg.moe_bias && weight_kind_per_expert(kind))
        return ck_source_hf_gpt_oss_experts(ck, kind, l, s);
    if (ck->cfg.moe_bias && kind == WEIGHT_KIND_ROUTER) {
        char name[CK_NAME];
        snprintf(name, sizeof name, "%slayers.%d.mlp.router.weight", ck->files->hf_prefix, l);
        s->mode = CK_DIRECT;
        return ck_part(ck, s, ck_hf_file(ck), name, 2, s->rows, s->cols);
    }
    if (kind == WEIGHT_KIND_ROUTER || kind == WEIGHT_KIND_EXP_GATE || kind == WEIGHT_KIND_EXP_UP ||
        kind == WEIGHT_KIND_EXP_DOWN)
        return ck_source_hf_experts(ck, kind, l, s);
    const char *pattern = weight_names_hf_llama(&ck->cfg, kind, l);
    CHECK(pattern, "no HF Llama tensor for %s", weight_kind_name(kind));
    char name[CK_NAME];
    if (kind == WEIGHT_KIND_LM_HEAD) snprintf(name, sizeof name, "%s", ck->files->hf_head);
    else (void)weight_names_format(name, sizeof name, ck->files->hf_prefix, pattern, l);
    s->mode = CK_DIRECT;
    s->off = 0;
    const struct model_config *c = &ck->cfg;
    const int qkv = kind == WEIGHT_KIND_Q || kind == WEIGHT_KIND_K || kind == WEIGHT_KIND_V;
    if (config_hf_fused(c) && (qkv || kind == WEIGHT_KIND_GATE || kind == WEIGHT_KIND_UP)) {
        /* Phi-3: rows [q | k | v] of qkv_proj, [gate | up] of gate_up_proj */
        const int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
        const int64_t qkv_off[3] = {0, q, q + kv};
        s->off = qkv ? qkv_off[weight_names_qkv_part(kind)] : kind == WEIGHT_KIND_UP ? c->ffn_hidden : 0;
        (void)weight_names_format(name, sizeof name, ck->files->hf_prefix,
                                  qkv ? "layers.%d.self_attn.qkv_proj.weight" : "layers.%d.mlp.gate_up_proj.weight", l);
        return ck_part(ck, s, ck_hf_file(ck), name, 2, qkv ? q + 2 * kv : 2 * (int64_t)c->ffn_hidden, c->d_model);
    }
    return ck_part(ck, s, ck_hf_file(ck), name, s->ndim, s->rows, s->cols);
}

/* HF GPT-2: Conv1D weights stored (in, out), Q, K and V fused in c_attn. */
static enum status ck_source_hf_gpt2(const struct checkpoint *ck, enum weight_kind kind, int l,
                                     struct ck_source *s)
{
    const struct model_config *c = &ck->cfg;
    const struct weight_names *w = weight_names_of(kind);
    CHECK(w->hf_gpt2, "no GPT-2 tensor for %s", weight_kind_name(kind));
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t qkv_off[3] = {0, q, q + kv};
    int ndim = s->ndim;
    int64_t d0 = s->rows, d1 = s->cols;
    s->mode = CK_DIRECT;
    s->off = 0;
    switch (w->gpt2) {
    case WEIGHT_GPT2_AS_IS: break;
    case WEIGHT_GPT2_CONV1D: d0 = s->cols, d1 = s->rows, s->mode = CK_TRANSPOSED; break;
    case WEIGHT_GPT2_QKV:
        d0 = c->d_model, d1 = q + 2 * kv, s->mode = CK_TRANSPOSED;
        s->off = qkv_off[weight_names_qkv_part(kind)];
        break;
    case WEIGHT_GPT2_QKV_BIAS:
        d0 = q + 2 * kv;
        s->off = qkv_off[weight_names_qkv_part(kind)];
        break;
    }
    char name[CK_NAME];
    (void)weight_names_format(name, sizeof name, ck->files->gpt2_prefix, w->hf_gpt2, l);
    return ck_part(ck, s, ck_hf_file(ck), name, ndim, d0, d1);
}

/* HF BertModel: every tensor as it is (nn.Linear's (out, in)), under the optional "bert." prefix. */
static enum status ck_source_hf_bert(const struct checkpoint *ck, enum weight_kind kind, int l,
                                     struct ck_source *s)
{
    const char *pattern = weight_names_hf_bert(kind);
    if (!pattern)
        return status_errorf(STATUS_UNSUPPORTED, "%s: a BERT model has no weight %s", ck->files->dir,
                             weight_kind_name(kind));
    char name[CK_NAME];
    (void)weight_names_format(name, sizeof name, ck->files->hf_prefix, pattern, l);
    s->mode = CK_DIRECT;
    s->off = 0;
    return ck_part(ck, s, ck_hf_file(ck), name, s->ndim, s->rows, s->cols);
}

/* GGUF (llama.cpp names): every tensor as it is; shapes are already (out, in). */
static enum status ck_source_gguf(const struct checkpoint *ck, enum weight_kind kind, int l,
                                  struct ck_source *s)
{
    const char *pattern = gguf_weight_pattern(&ck->cfg, kind, l);
    if (!pattern)
        return status_errorf(STATUS_UNSUPPORTED, "%s: shardlm has no GGUF name for weight %s",
                             ck->files->dir, weight_kind_name(kind));
    char name[CK_NAME];
    (void)weight_names_format(name, sizeof name, NULL, pattern, l);
    s->mode = CK_DIRECT;
    s->off = 0;
    enum status st = ck_part(ck, s, 0, name, s->ndim, s->rows, s->cols);
    if (st == STATUS_OK && s->ndim != 2 && dtype_is_quant(s->part[0]->dtype)) /* rows of blocks only */
        return status_errorf(STATUS_UNSUPPORTED, "%s: vector %s is stored as %s, which shardlm does not load",
                             ck->files->dir, name, dtype_name(s->part[0]->dtype));
    return st;
}

/* Megatron-style: the tensor of every saved tp rank of the stage that holds the weight. */
static enum status ck_source_megatron(const struct checkpoint *ck, enum weight_kind kind, int l,
                                      struct ck_source *s)
{
    const struct model_config *c = &ck->cfg;
    const struct checkpoint_files *cf = ck->files;
    const struct weight_names *w = weight_names_of(kind);
    int T = ck->saved_tp, P = ck->saved_pp;
    int64_t d = c->d_model, hd = c->head_dim, f = c->ffn_hidden;
    int64_t qpg = c->n_heads / c->n_kv_heads, gpp = c->n_kv_heads / T;
    int stage = 0, local = 0, bias = s->ndim == 1;
    if (w->place == WEIGHT_PLACE_LAYER) {
        while (stage + 1 < P && l >= cf->stage_first[stage + 1]) stage++;
        local = l - cf->stage_first[stage];
    } else if (w->place == WEIGHT_PLACE_LAST) {
        stage = P - 1;
    }
    int f0 = stage * T; /* tp rank 0 of the stage */
    char name[CK_NAME], alt[CK_NAME];
    (void)weight_names_format(name, sizeof name, NULL, w->megatron, local);
    s->mode = CK_DIRECT;
    s->off = 0;
    enum status st = STATUS_OK;
    switch (w->megatron_layout) {
    case WEIGHT_MEGATRON_REPLICATED: /* read from tp rank 0; norms also under their TE names */
        if (w->megatron_te) {
            (void)weight_names_format(alt, sizeof alt, NULL, w->megatron_te, local);
            if (!ck_try(ck, f0, name) && ck_try(ck, f0, alt))
                return ck_part(ck, s, f0, alt, s->ndim, s->rows, s->cols);
        }
        return ck_part(ck, s, f0, name, s->ndim, s->rows, s->cols);
    case WEIGHT_MEGATRON_VOCAB:
        s->mode = CK_ROWS_SPLIT;
        s->part_rows = cf->padded_vocab / T;
        for (int t = 0; t < T && !st; t++) st = ck_part(ck, s, f0 + t, name, 2, s->part_rows, d);
        return st;
    case WEIGHT_MEGATRON_QKV:
        s->mode = CK_QKV;
        s->off = weight_names_qkv_part(kind);
        s->q_per_group = qpg;
        s->groups_per_part = gpp;
        s->head_dim = hd;
        for (int t = 0; t < T && !st; t++)
            st = ck_part(ck, s, f0 + t, name, bias ? 1 : 2, gpp * (qpg + 2) * hd, d);
        return st;
    case WEIGHT_MEGATRON_COLUMNS:
        s->mode = CK_COLS_SPLIT;
        s->part_cols = s->cols / T;
        for (int t = 0; t < T && !st; t++) st = ck_part(ck, s, f0 + t, name, 2, d, s->part_cols);
        return st;
    case WEIGHT_MEGATRON_FC1: {
        int up = kind == WEIGHT_KIND_UP || kind == WEIGHT_KIND_UP_BIAS;
        int64_t per = f / T, n = c->gated_mlp ? 2 * per : per;
        s->mode = CK_ROWS_SPLIT;
        s->part_rows = per;
        s->off = (up && c->gated_mlp) ? per : 0;
        for (int t = 0; t < T && !st; t++) st = ck_part(ck, s, f0 + t, name, bias ? 1 : 2, n, d);
        return st;
    }
    }
    CHECK(0, "no Megatron tensor for %s", weight_kind_name(kind));
    return STATUS_INTERNAL;
}

/* Locates weight kind of layer l (the model has it). */
static enum status ck_source(const struct checkpoint *ck, enum weight_kind kind, int l,
                             struct ck_source *s)
{
    memset(s, 0, sizeof *s);
    if (kind == WEIGHT_KIND_LM_HEAD && ck->cfg.tied_embeddings) kind = WEIGHT_KIND_TOK_EMBEDDING;
    weight_kind_shape_at(&ck->cfg, kind, l, &s->ndim, &s->rows, &s->cols);
    if (ck->layout == CHECKPOINT_LAYOUT_MEGATRON) return ck_source_megatron(ck, kind, l, s);
    if (ck->layout == CHECKPOINT_LAYOUT_GGUF) return ck_source_gguf(ck, kind, l, s);
    if (ck->cfg.family == MODEL_FAMILY_GPT2) return ck_source_hf_gpt2(ck, kind, l, s);
    if (ck->cfg.family == MODEL_FAMILY_BERT) return ck_source_hf_bert(ck, kind, l, s);
    return ck_source_hf_llama(ck, kind, l, s);
}

enum status ck_locate(const struct checkpoint *ck, enum weight_kind kind, int l)
{
    struct ck_source src;
    return ck_source(ck, kind, l, &src);
}

/* ---- slicing ---------------------------------------------------------------------------- */

/* Canonical (r, c) -> part, element index in it, and how many canonical columns from c on are
 * found at elem, elem + stride, ... in the same part. */
static void ck_resolve(const struct ck_source *s, int64_t r, int64_t c, int *part, int64_t *elem,
                       int64_t *run, int64_t *stride)
{
    *part = 0;
    *run = s->cols - c;
    *stride = 1;
    switch (s->mode) {
    case CK_DIRECT: *elem = (s->off + r) * s->scols + c; break;
    case CK_TRANSPOSED:
        *elem = c * s->scols + s->off + r;
        *stride = s->scols;
        break;
    case CK_QKV: {
        int64_t h = r / s->head_dim, j = r % s->head_dim, g, pos;
        if (s->off == 0) g = h / s->q_per_group, pos = h % s->q_per_group;
        else g = h, pos = s->q_per_group + s->off - 1;
        *part = (int)(g / s->groups_per_part);
        int64_t lrow = ((g % s->groups_per_part) * (s->q_per_group + 2) + pos) * s->head_dim + j;
        *elem = lrow * s->scols + c;
        break;
    }
    case CK_ROWS_SPLIT:
        *part = (int)(r / s->part_rows);
        *elem = (s->off + r % s->part_rows) * s->scols + c;
        break;
    case CK_COLS_SPLIT:
        *part = (int)(c / s->part_cols);
        *elem = r * s->scols + c % s->part_cols;
        *run = s->part_cols - c % s->part_cols;
        break;
    case CK_EXPERTS_IO:
        *elem = r / s->part_rows * s->part_stride + c * s->scols + s->off + s->row_step * (r % s->part_rows);
        *stride = s->scols;
        break;
    }
}

/* The block of canonical rows / columns that tp rank r of tp holds. */
static enum status ck_plan(const struct model_config *c, enum weight_kind kind, int layer, int tp_rank,
                           int tp_size, struct ck_slice *p)
{
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size)
        return status_errorf(STATUS_INVALID_ARGUMENT, "tp rank %d of tp size %d", tp_rank, tp_size);
    if (c->n_heads % tp_size || c->ffn_hidden % tp_size || c->dense_ffn % tp_size ||
        (c->n_kv_heads % tp_size && tp_size % c->n_kv_heads)) {
        char dense[48] = ""; /* "15360" once came out of "%d%s%d" with no dense layers: 1536, "", 0 */
        if (c->dense_ffn) snprintf(dense, sizeof dense, "; the dense layers' %d", c->dense_ffn);
        return status_errorf(STATUS_UNSUPPORTED,
                             "tp size %d does not partition the model: it must divide n_heads (%d) "
                             "and ffn_hidden (%d%s), and divide or be a multiple of n_kv_heads (%d)",
                             tp_size, c->n_heads, c->ffn_hidden, dense, c->n_kv_heads);
    }
    int64_t rows, cols, hd = c->head_dim;
    weight_kind_shape_at(c, kind, layer, &p->ndim, &rows, &cols);
    p->r0 = 0, p->nr = rows, p->c0 = 0, p->nc = cols;
    switch (kind) {
    case WEIGHT_KIND_Q:
    case WEIGHT_KIND_Q_BIAS:
        p->nr = c->n_heads / tp_size * hd;
        p->r0 = tp_rank * p->nr;
        break;
    case WEIGHT_KIND_K:
    case WEIGHT_KIND_V:
    case WEIGHT_KIND_K_BIAS:
    case WEIGHT_KIND_V_BIAS:
        if (c->n_kv_heads >= tp_size) {
            p->nr = c->n_kv_heads / tp_size * hd;
            p->r0 = tp_rank * p->nr;
        } else { /* replicated: the group of this rank's query heads */
            p->nr = hd;
            p->r0 = (int64_t)tp_rank * c->n_kv_heads / tp_size * hd;
        }
        break;
    case WEIGHT_KIND_GATE:
    case WEIGHT_KIND_UP:
    case WEIGHT_KIND_GATE_BIAS:
    case WEIGHT_KIND_UP_BIAS:
        p->nr = rows / tp_size; /* ffn_hidden, or a dense first layer's dense_ffn */
        p->r0 = tp_rank * p->nr;
        break;
    case WEIGHT_KIND_O:
        p->nc = c->n_heads / tp_size * hd;
        p->c0 = tp_rank * p->nc;
        break;
    case WEIGHT_KIND_DOWN:
        p->nc = cols / tp_size;
        p->c0 = tp_rank * p->nc;
        break;
    case WEIGHT_KIND_SINKS: /* this rank's query heads' */
        p->nr = c->n_heads / tp_size;
        p->r0 = tp_rank * p->nr;
        break;
    case WEIGHT_KIND_EXP_GATE: /* whole experts per rank: a contiguous block of them */
    case WEIGHT_KIND_EXP_UP:
    case WEIGHT_KIND_EXP_DOWN:
    case WEIGHT_KIND_EXP_GATE_BIAS:
    case WEIGHT_KIND_EXP_UP_BIAS:
    case WEIGHT_KIND_EXP_DOWN_BIAS:
        if (c->n_experts % tp_size)
            return status_errorf(STATUS_UNSUPPORTED, "tp size %d must divide the %d experts (each rank holds whole "
                                 "experts)", tp_size, c->n_experts);
        p->nr = rows / tp_size;
        p->r0 = tp_rank * p->nr;
        break;
    case WEIGHT_KIND_TOK_EMBEDDING:
    case WEIGHT_KIND_LM_HEAD:
        p->nr = (rows + tp_size - 1) / tp_size;
        p->r0 = tp_rank * p->nr;
        break;
    default: break;
    }
    p->rows_valid = rows - p->r0 < 0 ? 0 : rows - p->r0 < p->nr ? rows - p->r0 : p->nr;
    return STATUS_OK;
}

/* ---- block-quantized weights (GGUF, kept-blocks directories) -------------------------------
 * Every part of a block weight has the same block dtype and whole blocks per row (checked by
 * ck_part and the safetensors reader), and no layout transposes blocks; a slice whose columns
 * start and end on block boundaries therefore resolves into runs of whole blocks in any
 * layout, part boundaries included (the Megatron column split of O and DOWN). */

/* Bytes of a row of n elements of block dtype dt. */
static size_t ck_block_bytes(enum dtype dt, int64_t n)
{
    return quant_row_bytes((enum quant_type)dtype_quant_type(dt), n);
}

/* Byte offset of element e (at a block boundary) in a part of block dtype dt. */
static size_t ck_block_offset(const struct ck_source *src, enum dtype dt, int64_t e)
{
    const int64_t row = e / src->scols, col = e % src->scols;
    return (size_t)row * ck_block_bytes(dt, src->scols) + ck_block_bytes(dt, col);
}

/* A slice handed out as blocks: the weight must be stored in that block dtype, a matrix, and
 * the slice's columns must start and end on block boundaries (a tp split of O or DOWN at a
 * column inside a block cannot be served without requantizing). */
static enum status ck_check_blocks(const struct checkpoint *ck, enum weight_kind kind, int layer,
                                   int tp_size, enum dtype dtype, const struct ck_source *src,
                                   const struct ck_slice *sl)
{
    const struct st_tensor *t = src->part[0];
    if (t->dtype != dtype || src->mode == CK_TRANSPOSED || sl->ndim != 2)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: weight %s of layer %d is stored as %s, not %s blocks",
                             ck->files->dir, weight_kind_name(kind), layer, dtype_name(t->dtype),
                             dtype_name(dtype));
    const int bs = quant_block_size(dtype_quant_type(dtype));
    if (sl->c0 % bs || sl->nc % bs)
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: weight %s of layer %d (%s) cannot be split for tp %d: its slice of "
                             "columns [%lld, %lld) would cut its %d-element blocks",
                             ck->files->dir, weight_kind_name(kind), layer, dtype_name(dtype), tp_size,
                             (long long)sl->c0, (long long)(sl->c0 + sl->nc), bs);
    return STATUS_OK;
}

/* Validates a request, plans the slice, locates the source and fills *out (data set only when
 * zero-copy is possible). */
static enum status ck_prepare(struct checkpoint *ck, enum weight_kind kind, int layer, int tp_rank,
                              int tp_size, enum dtype dtype, struct ck_source *src,
                              struct ck_slice *sl, struct host_weight *out)
{
    const struct model_config *c = &ck->cfg;
    enum status s;
    memset(out, 0, sizeof *out);
    if ((unsigned)kind >= WEIGHT_KIND_COUNT)
        return status_errorf(STATUS_INVALID_ARGUMENT, "weight kind %d", (int)kind);
    if (weight_kind_per_layer(kind) && (layer < 0 || layer >= c->n_layers))
        return status_errorf(STATUS_INVALID_ARGUMENT, "checkpoint %s: layer %d of %d", ck->files->dir,
                             layer, c->n_layers);
    if (!weight_kind_exists_at(c, kind, layer))
        return status_errorf(STATUS_INVALID_ARGUMENT, "checkpoint %s: this %s model has no weight %s%s", ck->files->dir,
                             c->architecture, weight_kind_name(kind), weight_kind_exists(c, kind) ? " in that layer" : "");
    if (!weight_kind_per_layer(kind)) layer = 0;
    if (!dtype_is_float(dtype) && !dtype_is_quant(dtype))
        return status_errorf(STATUS_INVALID_ARGUMENT, "weights convert to float dtypes, not %s",
                             dtype_name(dtype));
    if ((s = ck_plan(c, kind, layer, tp_rank, tp_size, sl))) return s;
    if ((s = ck_source(ck, kind, layer, src))) return s;
    if (dtype_is_quant(dtype) && (s = ck_check_blocks(ck, kind, layer, tp_size, dtype, src, sl))) return s;

    out->dtype = dtype;
    out->stored_dtype = src->part[0]->dtype;
    out->ndim = sl->ndim;
    out->shape[0] = sl->nr;
    out->shape[1] = sl->ndim == 2 ? sl->nc : 0;
    out->nbytes = dtype_is_quant(dtype) ? (size_t)sl->nr * ck_block_bytes(dtype, sl->nc)
                                        : (size_t)(sl->nr * sl->nc) * dtype_size(dtype);
    out->row_start = sl->r0;
    out->col_start = sl->c0;
    out->rows_valid = sl->rows_valid;

    /* Zero-copy: every row one run of nc elements, stride 1, consecutive in one part. */
    if (sl->rows_valid != sl->nr || sl->nr == 0) return STATUS_OK;
    int p0 = -1;
    int64_t e0 = 0, next = 0;
    for (int64_t i = 0; i < sl->nr; i++) {
        int p = 0;
        int64_t e = 0, run = 0, stride = 0;
        ck_resolve(src, sl->r0 + i, sl->c0, &p, &e, &run, &stride);
        if (run < sl->nc || (stride != 1 && sl->nc > 1)) return STATUS_OK;
        if (i == 0) p0 = p, e0 = e, next = e;
        if (p != p0 || e != next) return STATUS_OK;
        next += sl->nc;
    }
    const struct st_tensor *t = src->part[p0];
    if (t->dtype != dtype) return STATUS_OK;
    if (dtype_is_quant(dtype)) { /* blocks need 2-byte alignment (quant.h): GGUF's and our writer's have it */
        const unsigned char *blocks = (const unsigned char *)t->data + ck_block_offset(src, dtype, e0);
        out->zero_copy = (uintptr_t)blocks % 2 == 0;
        out->data = out->zero_copy ? blocks : NULL;
        return STATUS_OK;
    }
    const unsigned char *data = (const unsigned char *)t->data + e0 * (int64_t)dtype_size(t->dtype);
    if ((uintptr_t)data % dtype_size(dtype)) return STATUS_OK;
    out->zero_copy = 1;
    out->data = data;
    return STATUS_OK;
}

void checkpoint_set_source(struct checkpoint *ck, checkpoint_source_fn fn, void *ctx)
{
    ck->source = fn;
    ck->source_ctx = fn ? ctx : NULL;
}

/* checkpoint_get from a source: the whole canonical tensor in f32, then the slice. */
static enum status ck_get_from_source(struct checkpoint *ck, enum weight_kind kind, int layer,
                                      enum dtype dtype, const struct ck_slice *sl, void *buf,
                                      struct host_weight *out)
{
    int ndim;
    int64_t rows, cols;
    weight_kind_shape_at(&ck->cfg, kind, layer, &ndim, &rows, &cols);
    float *full = malloc((size_t)(rows * cols) * sizeof *full);
    if (!full) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "weight %s: out of memory", weight_kind_name(kind));
    enum status s = ck->source(ck->source_ctx, kind, layer, full, rows * cols);
    const size_t es = dtype_size(dtype);
    for (int64_t i = 0; s == STATUS_OK && i < sl->nr; i++) {
        unsigned char *row = (unsigned char *)buf + (size_t)(i * sl->nc) * es;
        if (i >= sl->rows_valid) memset(row, 0, (size_t)sl->nc * es); /* vocab padding */
        else safetensors_gather(row, dtype, full + (sl->r0 + i) * cols + sl->c0, DTYPE_F32, (size_t)sl->nc, 1);
    }
    free(full);
    if (s == STATUS_OK) out->data = buf;
    return s;
}

/* The slice as blocks, run by run (block boundaries checked by ck_check_blocks): the column
 * slices of row-parallel weights, the parts of a Megatron layout, and vocabulary padding, whose
 * zero bytes are zero blocks (every scale zero). */
static void ck_get_blocks(const struct ck_source *src, const struct ck_slice *sl, enum dtype dt,
                          void *buf)
{
    const size_t row_bytes = ck_block_bytes(dt, sl->nc);
    for (int64_t i = 0; i < sl->nr; i++) {
        unsigned char *row = (unsigned char *)buf + (size_t)i * row_bytes;
        if (i >= sl->rows_valid) {
            memset(row, 0, row_bytes);
            continue;
        }
        for (int64_t c = sl->c0; c < sl->c0 + sl->nc;) {
            int p = 0;
            int64_t e = 0, run = 0, stride = 0;
            ck_resolve(src, sl->r0 + i, c, &p, &e, &run, &stride);
            const int64_t n = run < sl->c0 + sl->nc - c ? run : sl->c0 + sl->nc - c;
            const struct st_tensor *t = src->part[p];
            const size_t off = ck_block_offset(src, dt, e), len = ck_block_bytes(dt, n);
            CHECK(stride == 1 && off + len <= t->nbytes, "tensor %s: row %lld out of range", t->name,
                  (long long)(sl->r0 + i));
            memcpy(row + ck_block_bytes(dt, c - sl->c0), (const unsigned char *)t->data + off, len);
            c += n;
        }
    }
}

/* The slice of a block-quantized weight in a float dtype, run by run: each source row a run
 * lies in is dequantized whole (bit-exact with ggml), then the run's columns converted. */
static enum status ck_get_dequantized(const struct ck_source *src, const struct ck_slice *sl,
                                      enum weight_kind kind, enum dtype dtype, void *buf,
                                      struct host_weight *out)
{
    const enum dtype qd = src->part[0]->dtype;
    const enum quant_type qt = (enum quant_type)dtype_quant_type(qd);
    float *tmp = malloc((size_t)src->scols * sizeof *tmp);
    if (!tmp) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "weight %s: out of memory", weight_kind_name(kind));
    const size_t es = dtype_size(dtype), src_row = ck_block_bytes(qd, src->scols);
    int last_part = -1;
    int64_t last_row = -1;
    for (int64_t i = 0; i < sl->nr; i++) {
        unsigned char *row = (unsigned char *)buf + (size_t)(i * sl->nc) * es;
        if (i >= sl->rows_valid) {
            memset(row, 0, (size_t)sl->nc * es);
            continue;
        }
        for (int64_t c = sl->c0; c < sl->c0 + sl->nc;) {
            int p = 0;
            int64_t e = 0, run = 0, stride = 0;
            ck_resolve(src, sl->r0 + i, c, &p, &e, &run, &stride);
            const int64_t n = run < sl->c0 + sl->nc - c ? run : sl->c0 + sl->nc - c;
            const int64_t r = e / src->scols;
            const struct st_tensor *t = src->part[p];
            CHECK(stride == 1 && (size_t)(r + 1) * src_row <= t->nbytes, "tensor %s: row %lld out of range",
                  t->name, (long long)r);
            if (p != last_part || r != last_row)
                quant_dequantize_row(qt, (const unsigned char *)t->data + (size_t)r * src_row, tmp, src->scols);
            last_part = p, last_row = r;
            safetensors_gather(row + (size_t)(c - sl->c0) * es, dtype, tmp + e % src->scols, DTYPE_F32, (size_t)n, 1);
            c += n;
        }
    }
    free(tmp);
    out->data = buf;
    return STATUS_OK;
}

enum status checkpoint_describe(struct checkpoint *ck, enum weight_kind kind, int layer,
                                int tp_rank, int tp_size, enum dtype dtype,
                                struct host_weight *out)
{
    struct ck_source src;
    struct ck_slice sl;
    return ck_prepare(ck, kind, layer, tp_rank, tp_size, dtype, &src, &sl, out);
}

enum status checkpoint_get(struct checkpoint *ck, enum weight_kind kind, int layer, int tp_rank,
                           int tp_size, enum dtype dtype, void *buf, size_t buf_size,
                           unsigned flags, struct host_weight *out)
{
    struct ck_source src;
    struct ck_slice sl;
    enum status s = ck_prepare(ck, kind, layer, tp_rank, tp_size, dtype, &src, &sl, out);
    if (s) return s;
    if (out->zero_copy && (flags & CHECKPOINT_GET_ZERO_COPY_OK) && !ck->source) return STATUS_OK;
    out->zero_copy = 0;
    out->data = NULL;
    if (!buf || buf_size < out->nbytes)
        return status_errorf(STATUS_INVALID_ARGUMENT, "weight %s: needs a %zu-byte buffer, got %zu",
                             weight_kind_name(kind), out->nbytes, buf ? buf_size : 0);
    if (dtype_is_quant(dtype)) {
        if (ck->source)
            return status_errorf(STATUS_UNSUPPORTED, "weight %s: a memory source has no %s blocks",
                                 weight_kind_name(kind), dtype_name(dtype));
        ck_get_blocks(&src, &sl, dtype, buf);
        out->data = buf;
        return STATUS_OK;
    }
    size_t es = dtype_size(dtype);
    if ((uintptr_t)buf % es)
        return status_errorf(STATUS_INVALID_ARGUMENT, "weight %s: buffer not aligned to %zu bytes",
                             weight_kind_name(kind), es);
    if (ck->source) return ck_get_from_source(ck, kind, layer, dtype, &sl, buf, out);
    if (dtype_is_quant(src.part[0]->dtype)) return ck_get_dequantized(&src, &sl, kind, dtype, buf, out);
    unsigned char *dst = buf;
    for (int64_t i = 0; i < sl.nr; i++) {
        unsigned char *row = dst + (size_t)(i * sl.nc) * es;
        if (i >= sl.rows_valid) { /* vocab padding */
            memset(row, 0, (size_t)sl.nc * es);
            continue;
        }
        for (int64_t c = sl.c0; c < sl.c0 + sl.nc;) {
            int p = 0;
            int64_t e = 0, run = 0, stride = 0;
            ck_resolve(&src, sl.r0 + i, c, &p, &e, &run, &stride);
            int64_t n = run < sl.c0 + sl.nc - c ? run : sl.c0 + sl.nc - c;
            const struct st_tensor *t = src.part[p];
            CHECK(n > 0 && p >= 0 && p < src.n_parts &&
                      (e + (n - 1) * stride + 1) * (int64_t)dtype_size(t->dtype) <= (int64_t)t->nbytes,
                  "weight %s: element %lld of part %d out of range", weight_kind_name(kind),
                  (long long)e, p);
            safetensors_gather(row + (size_t)(c - sl.c0) * es, dtype,
                               (const unsigned char *)t->data + e * (int64_t)dtype_size(t->dtype),
                               t->dtype, (size_t)n, (size_t)stride);
            c += n;
        }
    }
    out->data = buf;
    return STATUS_OK;
}

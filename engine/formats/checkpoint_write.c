/* engine/formats/checkpoint_write.c - the checkpoint writers: the Megatron-style layout at any
 * tp/pp (checkpoint_write_megatron, the `reshard` subcommand) and the Hugging Face layout
 * (checkpoint_write_hf), both from any open checkpoint, one tensor in memory at a time, every
 * file written atomically. Names come from weight_names.c; layouts are described in
 * checkpoint.h.
 * Weights stored as ggml blocks (a GGUF file, a kept-blocks directory) are written as blocks
 * (safetensors.h: U8 block tensors), except where one Megatron tensor fuses weights of different
 * block types, and when a memory source replaces the values (ck_write_dtype, mw_dtype).
 * Not here: reading (checkpoint.c, checkpoint_open.c), the safetensors format
 * (safetensors_write.c), config.json (config_write.c).
 * Tests: tests/test_formats.c (write, reopen, every weight equal), the reshard tests
 * (tests/test_cli.sh: GPT-2 HF -> tp2 pp2 -> HF bit for bit), the golden_megatron_* tests and
 * tests/test_keep_blocks.c (blocks through both writers, tp 2, the block-cutting refusal). */
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_impl.h"
#include "quant.h"
#include "safetensors.h"

/* ---- output directory and extras --------------------------------------------------------- */

/* Copies dir_in/name to dir_out/name (base_copy_file: whole or not at all), when dir_in/name exists. */
static enum status ck_copy_file(const char *dir_in, const char *dir_out, const char *name)
{
    enum status s = STATUS_OK;
    char in[CK_PATH], out[CK_PATH];
    if ((s = ck_pathf(in, dir_in, name)) || (s = ck_pathf(out, dir_out, name))) return s;
    if (!ck_is_file(in)) return STATUS_OK;
    return base_copy_file(in, out);
}

static enum status mw_write_meta(const char *dir_out, const struct model_config *c, int tp, int pp)
{
    enum status s = STATUS_OK;
    char path[CK_PATH];
    char *text = NULL;
    if ((s = ck_pathf(path, dir_out, CK_MEGATRON_META))) return s;
    cJSON *root = cJSON_CreateObject();
    cJSON *lps = cJSON_CreateArray();
    int ok = root && lps;
    for (int p = 0; ok && p < pp; p++) {
        int first, count;
        checkpoint_pp_layers(c->n_layers, pp, p, &first, &count);
        ok = cJSON_AddItemToArray(lps, cJSON_CreateNumber(count));
    }
    int padded = (c->vocab_size + tp - 1) / tp * tp;
    ok = ok && cJSON_AddStringToObject(root, "format", "shardlm-megatron") &&
         cJSON_AddNumberToObject(root, "version", 1) && cJSON_AddNumberToObject(root, "tp_size", tp) &&
         cJSON_AddNumberToObject(root, "pp_size", pp) &&
         cJSON_AddNumberToObject(root, "n_layers", c->n_layers);
    if (ok) {
        ok = cJSON_AddItemToObject(root, "layers_per_stage", lps);
        if (ok) lps = NULL;
    }
    ok = ok && cJSON_AddNumberToObject(root, "vocab_size", c->vocab_size) &&
         cJSON_AddNumberToObject(root, "padded_vocab_size", padded) &&
         cJSON_AddStringToObject(root, "tensor_names", "megatron-core-local") &&
         cJSON_AddStringToObject(root, "qkv_layout", "megatron-core-grouped") &&
         cJSON_AddStringToObject(root, "fc1_layout", "gate-up-per-rank") &&
         (text = cJSON_Print(root));
    if (!ok) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    s = base_write_text(path, text, 0644);
out:
    cJSON_free(text);
    cJSON_Delete(lps);
    cJSON_Delete(root);
    return s;
}

/* Creates dir_out if missing and refuses to write over the source checkpoint, or to write an
 * encoder at all (config_save cannot: it is served as it is), before anything is written. */
static enum status ck_out_dir(const char *dir_out, const struct checkpoint *src)
{
    char a[PATH_MAX], b[PATH_MAX];
    if (src->cfg.encoder)
        return status_errorf(STATUS_UNSUPPORTED, "%s is an encoder (%s): shardlm serves it as it is and writes no copy",
                             src->files->dir, src->cfg.architecture);
    if (mkdir(dir_out, 0755) != 0 && errno != EEXIST)
        return status_errorf(STATUS_IO, "mkdir %s: %s", dir_out, strerror(errno));
    if (!realpath(dir_out, a) || !realpath(src->files->dir, b))
        return status_errorf(STATUS_IO, "%s: %s", dir_out, strerror(errno));
    if (!strcmp(a, b))
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: cannot write a checkpoint over its source",
                             dir_out);
    return STATUS_OK;
}

/* Writes n bytes to dir_out/name (base_write_file: whole or not at all). */
static enum status ck_write_bytes(const char *dir_out, const char *name, const void *data, size_t n)
{
    char path[CK_PATH];
    enum status s = ck_pathf(path, dir_out, name);
    return s ? s : base_write_file(path, data, n, 0644);
}

/* Copies the tokenizer files that are present (a GGUF source: writes tokenizer.model from its
 * metadata) and writes config.json (every writer's last files besides its own metadata). */
static enum status ck_write_extras(const char *dir_out, const struct checkpoint *src)
{
    static const char *const extras[] = {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                         "special_tokens_map.json", "generation_config.json"};
    enum status s;
    char config[CK_PATH];
    if (src->layout == CHECKPOINT_LAYOUT_GGUF &&
        (s = ck_write_bytes(dir_out, "tokenizer.model", src->tokenizer_proto, src->tokenizer_proto_n)))
        return s;
    for (size_t i = 0; src->layout != CHECKPOINT_LAYOUT_GGUF && i < sizeof extras / sizeof extras[0]; i++)
        if ((s = ck_copy_file(src->files->dir, dir_out, extras[i]))) return s;
    if ((s = ck_pathf(config, dir_out, "config.json")) || (s = config_save(config, &src->cfg))) return s;
    return STATUS_OK;
}

/* The dtype a writer stores a weight of stored dtype `stored` in: as stored, except blocks when
 * a memory source replaces the values (a trained or merged model: its weights are new floats,
 * and blocks are never requantized): then the config's float dtype. */
static enum dtype ck_write_dtype(const struct checkpoint *src, enum dtype stored)
{
    if (!dtype_is_quant(stored) || !src->source) return stored;
    return dtype_is_float(src->cfg.dtype) ? src->cfg.dtype : DTYPE_F32;
}

/* ---- the Megatron writer ---------------------------------------------------------------- */

enum mw_what {
    MW_KIND,     /* one canonical slice as is */
    MW_QKV,      /* linear_qkv.weight / .bias: grouped [q heads; k; v] per query group */
    MW_FC1,      /* linear_fc1.weight / .bias: [gate; up] (gated) or up */
};

struct mw_item {
    char             name[CK_NAME];
    enum mw_what     what;
    enum weight_kind kind;  /* MW_KIND; for MW_QKV / MW_FC1: the weight (Q / UP) or bias kind */
    int              bias;  /* MW_QKV, MW_FC1: the bias vector */
    int              layer; /* global */
    int              ndim;
    int64_t          shape[2];
    enum dtype       dtype;
    int              dequantized; /* fused weights of different block types, written in f32 */
};

struct mw_fill {
    struct checkpoint    *ck;
    const struct mw_item *item;
    int                   tp_rank, tp_size;
};

/* Bytes of one row of cols elements of dtype dt (blocks: whole blocks). */
static size_t mw_row_bytes(enum dtype dt, int64_t cols)
{
    if (dtype_is_quant(dt)) return quant_row_bytes((enum quant_type)dtype_quant_type(dt), cols);
    return (size_t)cols * dtype_size(dt);
}

/* Writes one canonical slice of kind into dst (exactly nbytes). */
/* The (rank, size) a weight of `kind` is written by: a weight the Megatron layout keeps whole on
 * every rank (WEIGHT_MEGATRON_REPLICATED, read back from rank 0's file whole) is written whole,
 * also the ones a loaded model splits over tp (the experts by whole experts, GPT-OSS's sinks by
 * heads: they were written as rank slices, which no reader took back). */
static void mw_shard(enum weight_kind kind, int rank, int tp, int *r, int *t)
{
    const int whole = weight_names_of(kind)->megatron_layout == WEIGHT_MEGATRON_REPLICATED;
    *r = whole ? 0 : rank;
    *t = whole ? 1 : tp;
}

static enum status mw_get(struct mw_fill *f, enum weight_kind kind, void *dst, size_t nbytes)
{
    struct host_weight hw;
    int r, t;
    mw_shard(kind, f->tp_rank, f->tp_size, &r, &t);
    return checkpoint_get(f->ck, kind, f->item->layer, r, t, f->item->dtype, dst, nbytes, 0, &hw);
}

static enum status mw_fill_fn(void *ctx, void *dst, size_t nbytes)
{
    struct mw_fill *f = ctx;
    const struct mw_item *it = f->item;
    const struct model_config *c = &f->ck->cfg;
    enum status s = STATUS_OK;
    if (it->what == MW_KIND) return mw_get(f, it->kind, dst, nbytes);
    const size_t row = mw_row_bytes(it->dtype, it->bias ? 1 : c->d_model);
    if (it->what == MW_FC1) {
        size_t part = (size_t)(c->ffn_hidden / f->tp_size) * row;
        if (!c->gated_mlp) return mw_get(f, it->bias ? WEIGHT_KIND_UP_BIAS : WEIGHT_KIND_UP, dst, nbytes);
        if ((s = mw_get(f, it->bias ? WEIGHT_KIND_GATE_BIAS : WEIGHT_KIND_GATE, dst, part))) return s;
        return mw_get(f, it->bias ? WEIGHT_KIND_UP_BIAS : WEIGHT_KIND_UP, (char *)dst + part, part);
    }
    /* MW_QKV: per local group, its q heads, then its k head, then its v head. */
    int64_t hd = c->head_dim, qpg = c->n_heads / c->n_kv_heads, groups = c->n_kv_heads / f->tp_size;
    size_t head = (size_t)hd * row;
    size_t qn = (size_t)(groups * qpg) * head, kn = (size_t)groups * head;
    char *q = malloc(qn), *k = malloc(kn), *v = malloc(kn);
    if (!q || !k || !v) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory for %s", it->name);
        goto out;
    }
    if ((s = mw_get(f, it->bias ? WEIGHT_KIND_Q_BIAS : WEIGHT_KIND_Q, q, qn)) ||
        (s = mw_get(f, it->bias ? WEIGHT_KIND_K_BIAS : WEIGHT_KIND_K, k, kn)) ||
        (s = mw_get(f, it->bias ? WEIGHT_KIND_V_BIAS : WEIGHT_KIND_V, v, kn)))
        goto out;
    CHECK(nbytes == qn + 2 * kn, "linear_qkv size");
    char *o = dst;
    for (int64_t g = 0; g < groups; g++) {
        memcpy(o, q + (size_t)(g * qpg) * head, (size_t)qpg * head);
        o += (size_t)qpg * head;
        memcpy(o, k + (size_t)g * head, head);
        o += head;
        memcpy(o, v + (size_t)g * head, head);
        o += head;
    }
out:
    free(q);
    free(k);
    free(v);
    return s;
}

/* The dtype of item it, whose tensor holds the weights kinds[0..n) (fused: Q, K, V or GATE, UP),
 * and checks that blocks split at this tp: the weights' stored dtype (the first's: floats
 * convert), as ck_write_dtype keeps it; but one tensor holds one block type, so weights of
 * different block types fused together are written dequantized, in f32 (exact). */
static enum status mw_dtype(struct checkpoint *ck, const enum weight_kind *kinds, int n, int rank, int tp,
                            struct mw_item *it)
{
    struct host_weight hw;
    enum status s;
    int mixed = 0, blocks = 0;
    for (int i = 0; i < n; i++) {
        if ((s = checkpoint_describe(ck, kinds[i], it->layer, rank, tp, DTYPE_F32, &hw))) return s;
        if (i == 0) it->dtype = hw.stored_dtype;
        blocks |= dtype_is_quant(hw.stored_dtype);
        mixed |= hw.stored_dtype != it->dtype;
    }
    it->dtype = ck_write_dtype(ck, it->dtype);
    it->dequantized = blocks && mixed;
    if (it->dequantized) it->dtype = DTYPE_F32;
    for (int i = 0; dtype_is_quant(it->dtype) && i < n; i++) /* refuses a split that cuts blocks */
        if ((s = checkpoint_describe(ck, kinds[i], it->layer, rank, tp, it->dtype, &hw))) return s;
    return STATUS_OK;
}

/* Appends the item of table row w for file (stage, rank): layer is global (0 for whole-model
 * weights), local its index in the stage. Q and Q_BIAS carry the whole linear_qkv, UP and
 * UP_BIAS the whole linear_fc1; K, V, GATE and their biases are inside those. */
static enum status mw_add(struct checkpoint *ck, const struct weight_names *w, int layer, int local,
                          int rank, int tp, struct mw_item **items, int *n, size_t *cap)
{
    const struct model_config *c = &ck->cfg;
    struct host_weight hw;
    enum status s;
    int bias = w->cols == WEIGHT_DIM_ONE;
    struct mw_item it = {.what = MW_KIND, .kind = w->kind, .layer = layer};
    enum weight_kind kinds[3] = {w->kind};
    int n_kinds = 1;
    if (w->megatron_layout == WEIGHT_MEGATRON_QKV) {
        if (weight_names_qkv_part(w->kind) != 0) return STATUS_OK;
        int64_t rows = (int64_t)(c->n_heads + 2 * c->n_kv_heads) / tp * c->head_dim;
        it = (struct mw_item){.what = MW_QKV, .kind = w->kind, .bias = bias, .layer = layer,
                              .ndim = bias ? 1 : 2, .shape = {rows, bias ? 0 : c->d_model}};
        kinds[1] = bias ? WEIGHT_KIND_K_BIAS : WEIGHT_KIND_K;
        kinds[2] = bias ? WEIGHT_KIND_V_BIAS : WEIGHT_KIND_V;
        n_kinds = 3;
    } else if (w->megatron_layout == WEIGHT_MEGATRON_FC1) {
        if (w->kind != WEIGHT_KIND_UP && w->kind != WEIGHT_KIND_UP_BIAS) return STATUS_OK;
        int64_t rows = (int64_t)(c->gated_mlp ? 2 : 1) * c->ffn_hidden / tp;
        it = (struct mw_item){.what = MW_FC1, .kind = w->kind, .bias = bias, .layer = layer,
                              .ndim = bias ? 1 : 2, .shape = {rows, bias ? 0 : c->d_model}};
        if (c->gated_mlp) {
            kinds[1] = bias ? WEIGHT_KIND_GATE_BIAS : WEIGHT_KIND_GATE;
            n_kinds = 2;
        }
    }
    (void)weight_names_format(it.name, sizeof it.name, NULL, w->megatron, local);
    int r = rank, t = tp;
    mw_shard(w->kind, rank, tp, &r, &t);
    if ((s = mw_dtype(ck, kinds, n_kinds, r, t, &it))) return s;
    if ((s = checkpoint_describe(ck, w->kind, layer, r, t, DTYPE_F32, &hw))) return s;
    if (it.what == MW_KIND) {
        it.ndim = hw.ndim;
        it.shape[0] = hw.shape[0];
        it.shape[1] = hw.shape[1];
    }
    if (base_grow((void **)items, cap, (size_t)*n + 1, sizeof **items))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    (*items)[(*n)++] = it;
    return STATUS_OK;
}

/* Lists the tensors of file (stage, rank) in the table's order: the embeddings on the first
 * stage, the stage's layers, the final norm and head on the last stage. */
static enum status mw_list(struct checkpoint *ck, int stage, int rank, int tp, int pp,
                           struct mw_item **items, int *n, size_t *cap)
{
    const struct model_config *c = &ck->cfg;
    enum status s = STATUS_OK;
    int first, count;
    checkpoint_pp_layers(c->n_layers, pp, stage, &first, &count);
    for (int i = 0; i < WEIGHT_KIND_COUNT && !s; i++) { /* first stage */
        const struct weight_names *w = weight_names_at(i);
        if (stage == 0 && w->place == WEIGHT_PLACE_FIRST && weight_kind_exists(c, w->kind))
            s = mw_add(ck, w, 0, 0, rank, tp, items, n, cap);
    }
    for (int l = 0; l < count && !s; l++) {
        for (int i = 0; i < WEIGHT_KIND_COUNT && !s; i++) {
            const struct weight_names *w = weight_names_at(i);
            if (w->place == WEIGHT_PLACE_LAYER && weight_kind_exists(c, w->kind))
                s = mw_add(ck, w, first + l, l, rank, tp, items, n, cap);
        }
    }
    for (int i = 0; i < WEIGHT_KIND_COUNT && !s; i++) { /* last stage */
        const struct weight_names *w = weight_names_at(i);
        if (stage == pp - 1 && w->place == WEIGHT_PLACE_LAST && weight_kind_exists(c, w->kind) &&
            !(w->kind == WEIGHT_KIND_LM_HEAD && c->tied_embeddings))
            s = mw_add(ck, w, 0, 0, rank, tp, items, n, cap);
    }
    return s;
}

static enum status mw_write_file(struct checkpoint *src, const char *dir_out, int stage, int rank,
                                 int tp, int pp)
{
    enum status s;
    char rel[64], folder[CK_PATH], path[CK_PATH];
    struct mw_item *items = NULL;
    struct mw_fill *fills = NULL;
    struct safetensors_writer *w = NULL;
    int n = 0;
    size_t cap = 0;
    snprintf(rel, sizeof rel, "mp_rank_%02d_%03d", rank, stage);
    if ((s = ck_pathf(folder, dir_out, rel)) || (s = ck_pathf(path, folder, "model.safetensors")))
        return s;
    if (mkdir(folder, 0755) != 0 && errno != EEXIST)
        return status_errorf(STATUS_IO, "mkdir %s: %s", folder, strerror(errno));
    if ((s = mw_list(src, stage, rank, tp, pp, &items, &n, &cap))) goto out;
    if (!(fills = calloc((size_t)n + 1, sizeof *fills))) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if ((s = safetensors_writer_begin(path, &w)) ||
        (s = safetensors_writer_set_metadata(w, "format", "pt")))
        goto out;
    for (int i = 0; i < n; i++) {
        fills[i] = (struct mw_fill){src, &items[i], rank, tp};
        if ((s = safetensors_writer_add_deferred(w, items[i].name, items[i].dtype, items[i].ndim,
                                                 items[i].shape, mw_fill_fn, &fills[i])))
            goto out;
    }
    s = safetensors_writer_finish(w);
    w = NULL;
out:
    safetensors_writer_free(w);
    free(fills);
    free(items);
    return s;
}

/* Lists the tensors of every file before any is written: a refusal (a tp split that would cut
 * blocks) leaves no partial checkpoint behind. */
static enum status mw_check(struct checkpoint *src, int tp, int pp)
{
    enum status s = STATUS_OK;
    for (int p = 0; p < pp && !s; p++) {
        for (int t = 0; t < tp && !s; t++) {
            struct mw_item *items = NULL;
            int n = 0;
            size_t cap = 0;
            s = mw_list(src, p, t, tp, pp, &items, &n, &cap);
            for (int i = 0; !s && t == 0 && i < n; i++)
                if (items[i].dequantized)
                    LOG_INFO("checkpoint", "%s of layer %d fuses weights of different block types: written "
                             "dequantized, in f32", items[i].name, items[i].layer);
            free(items);
        }
    }
    return s;
}

enum status checkpoint_write_megatron(const char *dir_out, struct checkpoint *src, int tp_size,
                                      int pp_size)
{
    const struct model_config *c = &src->cfg;
    enum status s;
    char meta[CK_PATH];
    if (tp_size < 1 || tp_size > 99 || pp_size < 1 || pp_size > CK_MAX_PP)
        return status_errorf(STATUS_INVALID_ARGUMENT, "tp size %d / pp size %d out of range (1..99 / 1..%d)",
                             tp_size, pp_size, CK_MAX_PP);
    if (c->n_heads % tp_size || c->n_kv_heads % tp_size || c->ffn_hidden % tp_size)
        return status_errorf(STATUS_UNSUPPORTED,
                             "tp size %d must divide n_heads (%d), n_kv_heads (%d) and ffn_hidden "
                             "(%d) for the Megatron layout",
                             tp_size, c->n_heads, c->n_kv_heads, c->ffn_hidden);
    if (pp_size > c->n_layers)
        return status_errorf(STATUS_UNSUPPORTED, "pp size %d exceeds the %d layers", pp_size,
                             c->n_layers);
    if (c->moe_dense_first)
        return status_errorf(STATUS_UNSUPPORTED, "%s has dense layers among its experts (first_k_dense_replace %d): "
                             "the Megatron layout is written for models whose layers are alike", c->architecture,
                             c->moe_dense_first);
    if ((s = mw_check(src, tp_size, pp_size)) || (s = ck_out_dir(dir_out, src))) return s;
    /* Without its metadata a directory does not open: remove it first, write it last. */
    if ((s = ck_pathf(meta, dir_out, CK_MEGATRON_META))) return s;
    if (unlink(meta) != 0 && errno != ENOENT)
        return status_errorf(STATUS_IO, "%s: %s", meta, strerror(errno));
    for (int p = 0; p < pp_size; p++)
        for (int t = 0; t < tp_size; t++)
            if ((s = mw_write_file(src, dir_out, p, t, tp_size, pp_size))) return s;
    if ((s = ck_write_extras(dir_out, src))) return s;
    if ((s = mw_write_meta(dir_out, c, tp_size, pp_size))) return s;
    LOG_INFO("checkpoint", "wrote %s: Megatron layout, tp %d, pp %d", dir_out, tp_size, pp_size);
    return STATUS_OK;
}

/* ---- the Hugging Face writer ------------------------------------------------------------ */

struct hfw_item {
    struct checkpoint *ck;
    enum weight_kind   kind;
    int                layer;
    enum dtype         dtype; /* as stored in the source */
    /* GPT-2: the tensor is kinds[0..n_kinds) concatenated along the rows (c_attn: Q, K, V),
     * transposed when `transposed` (Conv1D stores (in, out)). n_kinds 0: `kind` as it is. */
    enum weight_kind   kinds[3];
    int                n_kinds, transposed;
    /* Experts: rows row0 .. row0 + n_rows - 1 of `kind` (one expert of a stacked tensor); 0: all.
     * The stacked tensor is read once into `stack` and freed when its last expert is written. */
    int64_t            row0, n_rows;
    struct hfw_stack  *stack;
    /* GPT-OSS's 3-D experts (HFW_OSS_*): made from whole stacked kinds by hfw_oss_fill. */
    int                oss;
};

/* GPT-OSS's expert tensors, the inverse of the reader's (checkpoint.c CK_EXPERTS_IO):
 * gate_up_proj (E, d, 2F) holds expert e's gate row f in column 2f and its up row f in column
 * 2f + 1, (in, out); gate_up_proj_bias (E, 2F) interleaves the biases likewise; down_proj
 * (E, F, d) is each expert's (d, F) down matrix transposed. */
enum { HFW_OSS_NONE, HFW_OSS_GATE_UP, HFW_OSS_GATE_UP_BIAS, HFW_OSS_DOWN };

/* One stacked expert tensor as read for its experts' tensors, and how many are still to write. */
struct hfw_stack {
    unsigned char *all;
    int            left;
};

/* A whole kind of layer l in dtype dt, malloc'd into *out (its description in *hw). */
static enum status hfw_read_whole(struct checkpoint *ck, enum weight_kind kind, int l, enum dtype dt,
                                  unsigned char **out, struct host_weight *hw)
{
    enum status s = checkpoint_describe(ck, kind, l, 0, 1, dt, hw);
    if (s) return s;
    if (!(*out = malloc(hw->nbytes ? hw->nbytes : 1))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return checkpoint_get(ck, kind, l, 0, 1, dt, *out, hw->nbytes, 0, hw);
}

/* One of GPT-OSS's expert tensors (HFW_OSS_*), from the stacked kinds (E * F, d), (E * F),
 * (E * d, F) as shardlm holds them. */
static enum status hfw_oss_fill(const struct hfw_item *it, void *dst, size_t nbytes)
{
    const struct model_config *c = &it->ck->cfg;
    const int64_t E = c->n_experts, F = c->moe_ffn, d = c->d_model;
    const size_t es = dtype_size(it->dtype);
    unsigned char *part[2] = {NULL, NULL}, *out = dst;
    struct host_weight hw;
    enum status s = STATUS_OK;
    if (it->oss == HFW_OSS_DOWN) {
        CHECK((size_t)(E * F * d) * es == nbytes, "down_proj of %zu bytes", nbytes);
        if (!(s = hfw_read_whole(it->ck, WEIGHT_KIND_EXP_DOWN, it->layer, it->dtype, &part[0], &hw)))
            for (int64_t e = 0; e < E; e++) /* (d, F) of expert e -> (F, d) */
                for (int64_t j = 0; j < d; j++)
                    for (int64_t f = 0; f < F; f++)
                        memcpy(out + (size_t)((e * F + f) * d + j) * es, part[0] + (size_t)((e * d + j) * F + f) * es, es);
        free(part[0]);
        return s;
    }
    const int bias = it->oss == HFW_OSS_GATE_UP_BIAS;
    const enum weight_kind kinds[2] = {bias ? WEIGHT_KIND_EXP_GATE_BIAS : WEIGHT_KIND_EXP_GATE,
                                       bias ? WEIGHT_KIND_EXP_UP_BIAS : WEIGHT_KIND_EXP_UP};
    const int64_t in = bias ? 1 : d; /* a bias is one "input" row */
    CHECK((size_t)(E * in * 2 * F) * es == nbytes, "gate_up tensor of %zu bytes", nbytes);
    for (int p = 0; p < 2 && !s; p++) s = hfw_read_whole(it->ck, kinds[p], it->layer, it->dtype, &part[p], &hw);
    for (int p = 0; p < 2 && !s; p++) /* row f of expert e, feature i -> [e][i][2f + p] */
        for (int64_t e = 0; e < E; e++)
            for (int64_t f = 0; f < F; f++)
                for (int64_t i = 0; i < in; i++)
                    memcpy(out + (size_t)((e * in + i) * 2 * F + 2 * f + p) * es,
                           part[p] + (size_t)((e * F + f) * in + i) * es, es);
    free(part[0]);
    free(part[1]);
    return s;
}

static enum status hfw_fill(void *ctx, void *dst, size_t nbytes)
{
    const struct hfw_item *it = ctx;
    struct host_weight hw;
    if (it->oss) return hfw_oss_fill(it, dst, nbytes);
    if (it->n_rows) { /* one expert: its rows of the stacked tensor, read once for all experts */
        struct hfw_stack *st = it->stack;
        enum status s = st->all ? checkpoint_describe(it->ck, it->kind, it->layer, 0, 1, it->dtype, &hw)
                                : hfw_read_whole(it->ck, it->kind, it->layer, it->dtype, &st->all, &hw);
        if (s) return s;
        const size_t row_bytes = hw.nbytes / (size_t)hw.shape[0];
        CHECK(row_bytes * (size_t)it->n_rows == nbytes, "expert tensor of %zu bytes", nbytes);
        memcpy(dst, st->all + (size_t)it->row0 * row_bytes, nbytes);
        if (--st->left == 0) {
            free(st->all);
            st->all = NULL;
        }
        return STATUS_OK;
    }
    if (it->n_kinds == 0) return checkpoint_get(it->ck, it->kind, it->layer, 0, 1, it->dtype, dst, nbytes, 0, &hw);
    const size_t es = dtype_size(it->dtype);
    int64_t total_rows = 0, cols = 0;
    for (int i = 0; i < it->n_kinds; i++) {
        enum status s = checkpoint_describe(it->ck, it->kinds[i], it->layer, 0, 1, it->dtype, &hw);
        if (s) return s;
        total_rows += hw.shape[0];
        cols = hw.ndim == 2 ? hw.shape[1] : 1;
    }
    CHECK((size_t)(total_rows * cols) * es == nbytes, "GPT-2 tensor of %zu bytes, parts of %lld x %lld", nbytes,
          (long long)total_rows, (long long)cols);
    int64_t row_off = 0;
    for (int i = 0; i < it->n_kinds; i++) {
        unsigned char *part = NULL;
        enum status s = hfw_read_whole(it->ck, it->kinds[i], it->layer, it->dtype, &part, &hw);
        const int64_t rows = hw.shape[0];
        if (!s && !it->transposed) memcpy((unsigned char *)dst + (size_t)(row_off * cols) * es, part, hw.nbytes);
        for (int64_t r = 0; !s && it->transposed && r < rows; r++) /* (rows, cols) -> column r of (cols, total) */
            for (int64_t c = 0; c < cols; c++)
                memcpy((unsigned char *)dst + (size_t)(c * total_rows + row_off + r) * es,
                       part + (size_t)(r * cols + c) * es, es);
        free(part);
        if (s) return s;
        row_off += rows;
    }
    return STATUS_OK;
}

/* Mixtral's and Qwen's names of a mixture of experts: the router, and expert e's three matrices. */
static void hfw_expert_name(const struct model_config *c, enum weight_kind kind, int l, int e, char *name, size_t n)
{
    const int mixtral = config_hf_mixtral_names(c);
    static const char *const qwen[] = {"gate_proj", "up_proj", "down_proj"}, *const mix[] = {"w1", "w3", "w2"};
    const char *block = mixtral ? "block_sparse_moe" : "mlp";
    if (kind == WEIGHT_KIND_ROUTER) {
        snprintf(name, n, c->moe_bias ? "model.layers.%d.%s.router.weight" : "model.layers.%d.%s.gate.weight", l, block);
        return;
    }
    const int which = kind == WEIGHT_KIND_EXP_GATE ? 0 : kind == WEIGHT_KIND_EXP_UP ? 1 : 2;
    snprintf(name, n, "model.layers.%d.%s.experts.%d.%s.weight", l, block, e, mixtral ? mix[which] : qwen[which]);
}

/* The Hugging Face tensor of kind at layer l: its name, and for GPT-2 how it is stored (fused
 * c_attn, Conv1D transposed). 0 when no tensor of its own carries kind (GPT-2's K and V live in
 * c_attn with Q). */
static int hfw_name(const struct model_config *c, enum weight_kind kind, int l, char *name, size_t n,
                    struct hfw_item *it)
{
    const struct weight_names *w = weight_names_of(kind);
    it->n_kinds = 0;
    it->transposed = 0;
    if (config_hf_fused(c)) { /* Phi-3: qkv_proj and gate_up_proj hold their parts' rows together */
        if (kind == WEIGHT_KIND_K || kind == WEIGHT_KIND_V || kind == WEIGHT_KIND_UP) return 0;
        if (kind == WEIGHT_KIND_Q) {
            *it = (struct hfw_item){.kinds = {WEIGHT_KIND_Q, WEIGHT_KIND_K, WEIGHT_KIND_V}, .n_kinds = 3};
            (void)weight_names_format(name, n, "model.", "layers.%d.self_attn.qkv_proj.weight", l);
            return 1;
        }
        if (kind == WEIGHT_KIND_GATE) {
            *it = (struct hfw_item){.kinds = {WEIGHT_KIND_GATE, WEIGHT_KIND_UP}, .n_kinds = 2};
            (void)weight_names_format(name, n, "model.", "layers.%d.mlp.gate_up_proj.weight", l);
            return 1;
        }
    }
    if (kind == WEIGHT_KIND_ROUTER) {
        hfw_expert_name(c, kind, l, 0, name, n);
        return 1;
    }
    if (c->family != MODEL_FAMILY_GPT2) {
        if (kind == WEIGHT_KIND_LM_HEAD) snprintf(name, n, "%s", w->hf);
        else {
            const char *f = weight_names_hf_llama(c, kind, l);
            CHECK(f, "no HF name for %s", weight_kind_name(kind));
            (void)weight_names_format(name, n, "model.", f, l);
        }
        return 1;
    }
    if (!w->hf_gpt2) return 0;
    switch (w->gpt2) {
    case WEIGHT_GPT2_AS_IS: break;
    case WEIGHT_GPT2_CONV1D: *it = (struct hfw_item){.kinds = {kind}, .n_kinds = 1, .transposed = 1}; break;
    case WEIGHT_GPT2_QKV:
        if (kind != WEIGHT_KIND_Q) return 0;
        *it = (struct hfw_item){.kinds = {WEIGHT_KIND_Q, WEIGHT_KIND_K, WEIGHT_KIND_V}, .n_kinds = 3, .transposed = 1};
        break;
    case WEIGHT_GPT2_QKV_BIAS:
        if (kind != WEIGHT_KIND_Q_BIAS) return 0;
        *it = (struct hfw_item){.kinds = {WEIGHT_KIND_Q_BIAS, WEIGHT_KIND_K_BIAS, WEIGHT_KIND_V_BIAS}, .n_kinds = 3};
        break;
    }
    (void)weight_names_format(name, n, "transformer.", w->hf_gpt2, l);
    return 1;
}

/* The description (in f32) and the written dtype of an expert kind; experts kept as quantized
 * blocks are refused (the HF layouts hold float experts). */
static enum status hfw_expert_dtype(struct checkpoint *src, enum weight_kind kind, int l, struct host_weight *hw,
                                    enum dtype *dt)
{
    enum status s = checkpoint_describe(src, kind, l, 0, 1, DTYPE_F32, hw);
    if (s) return s;
    *dt = ck_write_dtype(src, hw->stored_dtype);
    if (dtype_is_quant(*dt))
        return status_errorf(STATUS_UNSUPPORTED, "writing experts kept as quantized blocks (%s) in the Hugging Face "
                             "layout is not built; convert them to a float dtype", dtype_name(*dt));
    return STATUS_OK;
}

/* One deferred tensor per expert of a stacked expert weight (items[*n] on). */
static enum status hfw_experts(struct safetensors_writer *w, struct checkpoint *src, enum weight_kind kind, int l,
                               struct hfw_stack *stack, struct hfw_item *items, int *n)
{
    const struct model_config *c = &src->cfg;
    struct host_weight hw;
    enum dtype dt;
    enum status s = hfw_expert_dtype(src, kind, l, &hw, &dt);
    if (s) return s;
    const int64_t rows = hw.shape[0] / c->n_experts;
    stack->left = c->n_experts;
    for (int e = 0; e < c->n_experts; e++) {
        char name[CK_NAME];
        hfw_expert_name(c, kind, l, e, name, sizeof name);
        items[*n] = (struct hfw_item){.ck = src, .kind = kind, .layer = l, .dtype = dt, .row0 = e * rows, .n_rows = rows,
                                     .stack = stack};
        const int64_t shape[2] = {rows, hw.shape[1]};
        if ((s = safetensors_writer_add_deferred(w, name, dt, 2, shape, hfw_fill, &items[*n]))) return s;
        (*n)++;
    }
    return STATUS_OK;
}

/* GPT-OSS's expert kinds of layer l as its Hugging Face tensors (HFW_OSS_*, down_proj_bias
 * as it is): the gate and up kinds make one tensor, named at the gate's turn. */
static enum status hfw_oss_experts(struct safetensors_writer *w, struct checkpoint *src, enum weight_kind kind, int l,
                                   struct hfw_item *items, int *n)
{
    const struct model_config *c = &src->cfg;
    const int64_t E = c->n_experts, F = c->moe_ffn, d = c->d_model;
    if (kind == WEIGHT_KIND_EXP_UP || kind == WEIGHT_KIND_EXP_UP_BIAS) return STATUS_OK; /* with the gate's */
    struct host_weight hw;
    enum dtype dt;
    enum status s = hfw_expert_dtype(src, kind, l, &hw, &dt);
    if (s) return s;
    char name[CK_NAME];
    const char *what = kind == WEIGHT_KIND_EXP_GATE ? "gate_up_proj" : kind == WEIGHT_KIND_EXP_GATE_BIAS ? "gate_up_proj_bias"
                     : kind == WEIGHT_KIND_EXP_DOWN ? "down_proj" : "down_proj_bias";
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", l, what);
    int64_t shape[3] = {E, d, 2 * F};
    int ndim = 3, oss = HFW_OSS_GATE_UP;
    if (kind == WEIGHT_KIND_EXP_GATE_BIAS) ndim = 2, shape[1] = 2 * F, oss = HFW_OSS_GATE_UP_BIAS;
    if (kind == WEIGHT_KIND_EXP_DOWN) shape[1] = F, shape[2] = d, oss = HFW_OSS_DOWN;
    if (kind == WEIGHT_KIND_EXP_DOWN_BIAS) ndim = 2, shape[1] = d, oss = HFW_OSS_NONE; /* (E * d) as (E, d) */
    items[*n] = (struct hfw_item){.ck = src, .kind = kind, .layer = l, .dtype = dt, .oss = oss};
    if ((s = safetensors_writer_add_deferred(w, name, dt, ndim, shape, hfw_fill, &items[*n]))) return s;
    (*n)++;
    return STATUS_OK;
}

enum status checkpoint_write_hf(const char *dir_out, struct checkpoint *src)
{
    const struct model_config *c = &src->cfg;
    if (c->family != MODEL_FAMILY_LLAMA && c->family != MODEL_FAMILY_GEMMA3 && c->family != MODEL_FAMILY_GPT2)
        return status_errorf(STATUS_UNSUPPORTED,
                             "writing the Hugging Face layout is implemented for Llama-family models "
                             "(Llama, Mistral, Gemma 3) and GPT-2, not %s", c->architecture);
    enum status s = ck_out_dir(dir_out, src);
    if (s) return s;
    struct hfw_item *items = calloc((size_t)(WEIGHT_KIND_COUNT + 3 * c->n_experts) * (size_t)(c->n_layers + 1),
                                    sizeof *items);
    struct hfw_stack *stacks = calloc((size_t)(3 * c->n_layers + 1), sizeof *stacks);
    struct safetensors_writer *w = NULL;
    char path[CK_PATH], name[CK_NAME];
    if (!items || !stacks) {
        free(items);
        free(stacks);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    if ((s = ck_pathf(path, dir_out, CK_HF_SINGLE)) || (s = safetensors_writer_begin(path, &w))) goto out;
    int n = 0;
    for (int k = 0; k < WEIGHT_KIND_COUNT; k++) {
        enum weight_kind kind = (enum weight_kind)k;
        if (!weight_kind_exists(c, kind) || (kind == WEIGHT_KIND_LM_HEAD && c->tied_embeddings)) continue;
        int layers = weight_kind_per_layer(kind) ? c->n_layers : 1;
        for (int l = 0; l < layers; l++) {
            struct host_weight hw;
            struct hfw_item g = {0};
            if (!weight_kind_exists_at(c, kind, l)) continue; /* a dense first layer's experts */
            if (c->moe_bias && weight_kind_per_expert(kind)) { /* GPT-OSS's 3-D experts */
                if ((s = hfw_oss_experts(w, src, kind, l, items, &n))) goto out;
                continue;
            }
            if (kind == WEIGHT_KIND_EXP_GATE || kind == WEIGHT_KIND_EXP_UP || kind == WEIGHT_KIND_EXP_DOWN) {
                struct hfw_stack *stack = &stacks[3 * l + (kind - WEIGHT_KIND_EXP_GATE)];
                if ((s = hfw_experts(w, src, kind, l, stack, items, &n))) goto out;
                continue;
            }
            if (!hfw_name(c, kind, l, name, sizeof name, &g)) continue;
            /* The stored dtype first (describe in f32 reports it), then the real description. */
            if ((s = checkpoint_describe(src, kind, l, 0, 1, DTYPE_F32, &hw))) goto out;
            g.ck = src, g.kind = kind, g.layer = l, g.dtype = ck_write_dtype(src, hw.stored_dtype);
            CHECK(!dtype_is_quant(g.dtype) || g.n_kinds == 0, "GPT-2 blocks are refused at open (ck_part)");
            items[n] = g;
            if ((s = checkpoint_describe(src, kind, l, 0, 1, g.dtype, &hw))) goto out;
            int64_t shape[2] = {hw.shape[0], hw.ndim == 2 ? hw.shape[1] : 1};
            for (int i = 1; i < g.n_kinds; i++) { /* c_attn: Q, K and V rows together */
                struct host_weight part;
                if ((s = checkpoint_describe(src, g.kinds[i], l, 0, 1, g.dtype, &part))) goto out;
                shape[0] += part.shape[0];
            }
            if (g.transposed) hw.shape[0] = shape[1], hw.shape[1] = shape[0];
            else hw.shape[0] = shape[0];
            if ((s = safetensors_writer_add_deferred(w, name, g.dtype, hw.ndim, hw.shape, hfw_fill, &items[n])))
                goto out;
            n++;
        }
    }
    if ((s = safetensors_writer_set_metadata(w, "format", "pt"))) goto out;
    s = safetensors_writer_finish(w); /* frees w */
    w = NULL;
    if (s) goto out;
    s = ck_write_extras(dir_out, src);
    if (!s) LOG_INFO("checkpoint", "wrote %s: Hugging Face layout, %d tensors", dir_out, n);
out:
    safetensors_writer_free(w);
    for (int i = 0; i < 3 * c->n_layers; i++) free(stacks[i].all); /* a write that stopped early */
    free(stacks);
    free(items);
    return s;
}

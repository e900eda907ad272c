/* engine/formats/checkpoint.c - checkpoint directories (HF, sharded HF, Megatron-style) as one source
 * of canonical, tensor-parallel-sliced weights, and the Megatron-style writer. The layouts and
 * the slicing rules are documented in checkpoint.h.
 * Not here: the safetensors format (safetensors.c), config.json (config.c), device memory
 * (model.c).
 * Tests: tests/test_formats.c.
 *
 * How a slice is produced: every weight is a canonical matrix (rows, cols) (vectors are
 * (n, 1)). A "source" says where canonical element (r, c) lives: which file tensor ("part"),
 * at which element, and how many following canonical columns are contiguous there (a "run",
 * with a stride: 1, or the row length for GPT-2's transposed Conv1D weights). The requested
 * slice is a block of canonical rows x columns; it is copied run by run, converting dtype.
 * When the whole block is one contiguous, aligned run in the requested dtype, it is served as
 * a pointer into the mapping instead. */
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

#define CK_MAX_TP        64  /* saved tensor-parallel ranks we read */
#define CK_MAX_PP        999 /* mp_rank_TT_PPP */
#define CK_PATH          4096
#define CK_NAME          256
#define CK_JSON_MAX      (64 << 20) /* an index.json of a huge model is a few MB */

static const char *const megatron_meta_name = "shardlm_megatron.json";
static const char *const hf_single_name = "model.safetensors";
static const char *const hf_index_name = "model.safetensors.index.json";

/* ---- weight kinds ----------------------------------------------------------------------- */

static const struct {
    const char *name;
    int         per_layer;
} kind_info[WEIGHT_KIND_COUNT] = {
    [WEIGHT_KIND_TOK_EMBEDDING] = {"tok_embedding", 0},
    [WEIGHT_KIND_POS_EMBEDDING] = {"pos_embedding", 0},
    [WEIGHT_KIND_ATTN_NORM] = {"attn_norm", 1},
    [WEIGHT_KIND_ATTN_NORM_BIAS] = {"attn_norm_bias", 1},
    [WEIGHT_KIND_Q] = {"q", 1},
    [WEIGHT_KIND_Q_BIAS] = {"q_bias", 1},
    [WEIGHT_KIND_K] = {"k", 1},
    [WEIGHT_KIND_K_BIAS] = {"k_bias", 1},
    [WEIGHT_KIND_V] = {"v", 1},
    [WEIGHT_KIND_V_BIAS] = {"v_bias", 1},
    [WEIGHT_KIND_O] = {"o", 1},
    [WEIGHT_KIND_O_BIAS] = {"o_bias", 1},
    [WEIGHT_KIND_MLP_NORM] = {"mlp_norm", 1},
    [WEIGHT_KIND_MLP_NORM_BIAS] = {"mlp_norm_bias", 1},
    [WEIGHT_KIND_GATE] = {"gate", 1},
    [WEIGHT_KIND_GATE_BIAS] = {"gate_bias", 1},
    [WEIGHT_KIND_UP] = {"up", 1},
    [WEIGHT_KIND_UP_BIAS] = {"up_bias", 1},
    [WEIGHT_KIND_DOWN] = {"down", 1},
    [WEIGHT_KIND_DOWN_BIAS] = {"down_bias", 1},
    [WEIGHT_KIND_FINAL_NORM] = {"final_norm", 0},
    [WEIGHT_KIND_FINAL_NORM_BIAS] = {"final_norm_bias", 0},
    [WEIGHT_KIND_LM_HEAD] = {"lm_head", 0},
    [WEIGHT_KIND_Q_NORM] = {"q_norm", 1},
    [WEIGHT_KIND_K_NORM] = {"k_norm", 1},
    [WEIGHT_KIND_POST_ATTN_NORM] = {"post_attn_norm", 1},
    [WEIGHT_KIND_POST_MLP_NORM] = {"post_mlp_norm", 1},
};

const char *weight_kind_name(enum weight_kind kind)
{
    return (unsigned)kind < WEIGHT_KIND_COUNT ? kind_info[kind].name : "?";
}

int weight_kind_per_layer(enum weight_kind kind)
{
    return (unsigned)kind < WEIGHT_KIND_COUNT && kind_info[kind].per_layer;
}

int weight_kind_exists(const struct model_config *c, enum weight_kind kind)
{
    int ln = c->norm == NORM_KIND_LAYERNORM;
    switch (kind) {
    case WEIGHT_KIND_POS_EMBEDDING: return c->positions == POSITION_KIND_LEARNED;
    case WEIGHT_KIND_ATTN_NORM_BIAS:
    case WEIGHT_KIND_MLP_NORM_BIAS:
    case WEIGHT_KIND_FINAL_NORM_BIAS: return ln;
    case WEIGHT_KIND_Q_BIAS:
    case WEIGHT_KIND_K_BIAS:
    case WEIGHT_KIND_V_BIAS: return c->qkv_bias;
    case WEIGHT_KIND_O_BIAS: return c->attn_out_bias;
    case WEIGHT_KIND_GATE: return c->gated_mlp;
    case WEIGHT_KIND_GATE_BIAS: return c->gated_mlp && c->mlp_bias;
    case WEIGHT_KIND_UP_BIAS:
    case WEIGHT_KIND_DOWN_BIAS: return c->mlp_bias;
    case WEIGHT_KIND_Q_NORM:
    case WEIGHT_KIND_K_NORM: return c->qk_norm;
    case WEIGHT_KIND_POST_ATTN_NORM:
    case WEIGHT_KIND_POST_MLP_NORM: return c->sandwich_norms;
    case WEIGHT_KIND_COUNT: return 0;
    default: return (unsigned)kind < WEIGHT_KIND_COUNT;
    }
}

/* Canonical shape: vectors are (n, 1) with ndim 1. */
static void ck_canonical(const struct model_config *c, enum weight_kind kind, int *ndim,
                         int64_t *rows, int64_t *cols)
{
    int64_t d = c->d_model, q = (int64_t)c->n_heads * c->head_dim;
    int64_t kv = (int64_t)c->n_kv_heads * c->head_dim, f = c->ffn_hidden;
    *ndim = 2;
    *cols = d;
    switch (kind) {
    case WEIGHT_KIND_TOK_EMBEDDING:
    case WEIGHT_KIND_LM_HEAD: *rows = c->vocab_size; break;
    case WEIGHT_KIND_POS_EMBEDDING: *rows = c->max_positions; break;
    case WEIGHT_KIND_Q: *rows = q; break;
    case WEIGHT_KIND_K:
    case WEIGHT_KIND_V: *rows = kv; break;
    case WEIGHT_KIND_O: *rows = d, *cols = q; break;
    case WEIGHT_KIND_GATE:
    case WEIGHT_KIND_UP: *rows = f; break;
    case WEIGHT_KIND_DOWN: *rows = d, *cols = f; break;
    case WEIGHT_KIND_Q_BIAS: *ndim = 1, *rows = q, *cols = 1; break;
    case WEIGHT_KIND_K_BIAS:
    case WEIGHT_KIND_V_BIAS: *ndim = 1, *rows = kv, *cols = 1; break;
    case WEIGHT_KIND_GATE_BIAS:
    case WEIGHT_KIND_UP_BIAS: *ndim = 1, *rows = f, *cols = 1; break;
    case WEIGHT_KIND_Q_NORM:
    case WEIGHT_KIND_K_NORM: *ndim = 1, *rows = c->head_dim, *cols = 1; break;
    default: *ndim = 1, *rows = d, *cols = 1; break; /* norms, O_BIAS, DOWN_BIAS */
    }
}

void checkpoint_pp_layers(int n_layers, int pp_size, int pp_rank, int *first, int *count)
{
    CHECK(pp_size >= 1 && pp_rank >= 0 && pp_rank < pp_size, "pp %d of %d", pp_rank, pp_size);
    int base = n_layers / pp_size, extra = n_layers % pp_size;
    *count = base + (pp_rank < extra);
    *first = pp_rank * base + (pp_rank < extra ? pp_rank : extra);
}

/* ---- the open checkpoint ---------------------------------------------------------------- */

struct ck_name {
    const char             *name;
    const struct st_tensor *t;
    int                     file;
};

struct checkpoint_files {
    char                *dir;
    int                  n_files;
    struct safetensors **files;       /* HF: shards; Megatron: index stage * saved_tp + rank */
    char               **file_names;  /* (n_files) relative to dir, for messages */
    struct ck_name      *names;       /* HF sharded: the weight map, sorted by name */
    int                  n_names;
    const char          *gpt2_prefix; /* "" or "transformer." */
    const char          *hf_prefix;   /* Llama / Gemma 3 body: "model.", or a multimodal
                                         Gemma 3's "language_model.model." /
                                         "model.language_model." */
    const char          *hf_head;     /* the untied LM head: "lm_head.weight" or
                                         "language_model.lm_head.weight" */
    int                  padded_vocab;    /* Megatron */
    int                  stage_first[CK_MAX_PP + 1];
};

/* Where canonical elements live. */
enum ck_mode {
    CK_DIRECT,     /* (r, c) -> part 0, source row off + r, column c */
    CK_TRANSPOSED, /* (r, c) -> part 0, source row c, column off + r (GPT-2 Conv1D) */
    CK_QKV,        /* Megatron linear_qkv: off = 0 q, 1 k, 2 v */
    CK_ROWS_SPLIT, /* part r / part_rows, source row off + r % part_rows */
    CK_COLS_SPLIT, /* part c / part_cols, source column c % part_cols */
};

struct ck_source {
    enum ck_mode            mode;
    int                     ndim;       /* canonical: 1 or 2 */
    int64_t                 rows, cols; /* canonical (cols 1 for vectors) */
    int64_t                 off;
    int64_t                 part_rows, part_cols;
    int64_t                 scols;      /* row length of every part (1 for 1-D parts) */
    int64_t                 q_per_group, groups_per_part, head_dim; /* CK_QKV */
    int                     n_parts;
    const struct st_tensor *part[CK_MAX_TP];
};

struct ck_slice {
    int     ndim;
    int64_t r0, nr, c0, nc, rows_valid;
};

static enum status ck_pathf(char *buf, const char *a, const char *b)
{
    if (snprintf(buf, CK_PATH, "%s/%s", a, b) >= CK_PATH)
        return status_errorf(STATUS_INVALID_ARGUMENT, "path too long: %s/%s", a, b);
    return STATUS_OK;
}

static int ck_is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int ck_is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Reads and parses a JSON file; *out is an object. */
static enum status ck_read_json(const char *path, cJSON **out)
{
    enum status s = STATUS_OK;
    char *text = NULL;
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return status_errorf(STATUS_NOT_FOUND, "%s: no such file", path);
        return status_errorf(STATUS_IO, "%s: %s", path, strerror(errno));
    }
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || n > CK_JSON_MAX) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: %ld bytes is not a plausible JSON file", path, n);
        goto out;
    }
    rewind(f);
    if (!(text = malloc((size_t)n + 1))) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
        goto out;
    }
    if (fread(text, 1, (size_t)n, f) != (size_t)n) {
        s = status_errorf(STATUS_IO, "%s: short read", path);
        goto out;
    }
    text[n] = '\0';
    cJSON *root = cJSON_Parse(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        s = status_errorf(STATUS_BAD_FORMAT, "%s: not a JSON object", path);
        goto out;
    }
    *out = root;
out:
    free(text);
    fclose(f);
    return s;
}

static enum status ck_add_file(struct checkpoint *ck, const char *rel)
{
    struct checkpoint_files *cf = ck->files;
    char path[CK_PATH];
    enum status s = ck_pathf(path, cf->dir, rel);
    if (s) return s;
    struct safetensors **files = realloc(cf->files, (size_t)(cf->n_files + 1) * sizeof *files);
    if (!files) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    cf->files = files;
    char **names = realloc(cf->file_names, (size_t)(cf->n_files + 1) * sizeof *names);
    if (!names) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    cf->file_names = names;
    char *copy = strdup(rel);
    if (!copy) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    struct safetensors *st;
    if ((s = safetensors_open(path, &st))) {
        free(copy);
        return s;
    }
    cf->files[cf->n_files] = st;
    cf->file_names[cf->n_files] = copy;
    cf->n_files++;
    return STATUS_OK;
}

static int ck_cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct ck_name *)a)->name, ((const struct ck_name *)b)->name);
}

/* Finds tensor `name` in file fi (Megatron, single-file HF) or in the weight map (fi < 0).
 * NULL when absent. */
static const struct st_tensor *ck_try(const struct checkpoint *ck, int fi, const char *name)
{
    const struct checkpoint_files *cf = ck->files;
    if (fi >= 0) return safetensors_find(cf->files[fi], name);
    struct ck_name key = {.name = name};
    const struct ck_name *e = bsearch(&key, cf->names, (size_t)cf->n_names, sizeof key, ck_cmp_name);
    return e ? e->t : NULL;
}

static const char *ck_where(const struct checkpoint *ck, int fi)
{
    return fi >= 0 ? ck->files->file_names[fi] : hf_index_name;
}

static void ck_shape_string(char *buf, size_t n, int ndim, const int64_t *shape)
{
    int off = snprintf(buf, n, "[");
    for (int i = 0; i < ndim && off > 0 && (size_t)off < n; i++)
        off += snprintf(buf + off, n - (size_t)off, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (off > 0 && (size_t)off < n) snprintf(buf + off, n - (size_t)off, "]");
}

/* Looks up a part, checks its dtype and shape (ndim 1: (d0); ndim 2: (d0, d1)) and appends it. */
static enum status ck_part(const struct checkpoint *ck, struct ck_source *s, int fi,
                           const char *name, int ndim, int64_t d0, int64_t d1)
{
    const struct st_tensor *t = ck_try(ck, fi, name);
    if (!t)
        return status_errorf(STATUS_BAD_FORMAT, "checkpoint %s: tensor '%s' not found in %s%s",
                             ck->files->dir, name, ck_where(ck, fi),
                             fi < 0 ? " (the shards' weight map)" : "");
    const char *where = ck_where(ck, fi);
    if (!t->supported)
        return status_errorf(STATUS_UNSUPPORTED,
                             "checkpoint %s: tensor %s in %s has dtype %s which shardlm does not load",
                             ck->files->dir, name, where, t->dtype_name);
    if (t->dtype == DTYPE_I32)
        return status_errorf(STATUS_BAD_FORMAT,
                             "checkpoint %s: tensor '%s' in %s has dtype I32; weights are floats",
                             ck->files->dir, name, where);
    int64_t want[2] = {d0, d1};
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1)) {
        char found[128], expected[64];
        ck_shape_string(found, sizeof found, t->ndim, t->shape);
        ck_shape_string(expected, sizeof expected, ndim, want);
        return status_errorf(STATUS_BAD_FORMAT,
                             "checkpoint %s: tensor '%s' in %s has shape %s, expected %s from "
                             "config.json",
                             ck->files->dir, name, where, found, expected);
    }
    CHECK(s->n_parts < CK_MAX_TP, "too many parts");
    s->part[s->n_parts++] = t;
    s->scols = ndim == 2 ? d1 : 1;
    return STATUS_OK;
}

/* ---- sources per layout ----------------------------------------------------------------- */

/* HF Llama and Gemma 3 names (after the body prefix, "model." in text-only checkpoints). They
 * differ in the norms: Llama's post_attention_layernorm is the pre-MLP norm; Gemma's is the
 * norm of the attention output, its pre-MLP norm being pre_feedforward_layernorm. */
/* The Hugging Face name of a Llama-family weight (Llama, Mistral, Gemma 3), without the
 * "model." prefix and with %d for the layer; NULL for LM_HEAD and for kinds the family lacks.
 * Shared by the reader and the HF writer. */
static const char *ck_hf_llama_fmt(int gemma, enum weight_kind kind)
{
    switch (kind) {
    case WEIGHT_KIND_TOK_EMBEDDING: return "embed_tokens.weight";
    case WEIGHT_KIND_FINAL_NORM: return "norm.weight";
    case WEIGHT_KIND_ATTN_NORM: return "layers.%d.input_layernorm.weight";
    case WEIGHT_KIND_MLP_NORM:
        return gemma ? "layers.%d.pre_feedforward_layernorm.weight" : "layers.%d.post_attention_layernorm.weight";
    case WEIGHT_KIND_POST_ATTN_NORM: return "layers.%d.post_attention_layernorm.weight";
    case WEIGHT_KIND_POST_MLP_NORM: return "layers.%d.post_feedforward_layernorm.weight";
    case WEIGHT_KIND_Q_NORM: return "layers.%d.self_attn.q_norm.weight";
    case WEIGHT_KIND_K_NORM: return "layers.%d.self_attn.k_norm.weight";
    case WEIGHT_KIND_Q: return "layers.%d.self_attn.q_proj.weight";
    case WEIGHT_KIND_K: return "layers.%d.self_attn.k_proj.weight";
    case WEIGHT_KIND_V: return "layers.%d.self_attn.v_proj.weight";
    case WEIGHT_KIND_O: return "layers.%d.self_attn.o_proj.weight";
    case WEIGHT_KIND_Q_BIAS: return "layers.%d.self_attn.q_proj.bias";
    case WEIGHT_KIND_K_BIAS: return "layers.%d.self_attn.k_proj.bias";
    case WEIGHT_KIND_V_BIAS: return "layers.%d.self_attn.v_proj.bias";
    case WEIGHT_KIND_O_BIAS: return "layers.%d.self_attn.o_proj.bias";
    case WEIGHT_KIND_GATE: return "layers.%d.mlp.gate_proj.weight";
    case WEIGHT_KIND_UP: return "layers.%d.mlp.up_proj.weight";
    case WEIGHT_KIND_DOWN: return "layers.%d.mlp.down_proj.weight";
    case WEIGHT_KIND_GATE_BIAS: return "layers.%d.mlp.gate_proj.bias";
    case WEIGHT_KIND_UP_BIAS: return "layers.%d.mlp.up_proj.bias";
    case WEIGHT_KIND_DOWN_BIAS: return "layers.%d.mlp.down_proj.bias";
    default: return NULL;
    }
}

static enum status ck_source_hf_llama(const struct checkpoint *ck, enum weight_kind kind, int l,
                                      struct ck_source *s)
{
    const char *fmt = ck_hf_llama_fmt(ck->cfg.family == MODEL_FAMILY_GEMMA3, kind);
    CHECK(fmt || kind == WEIGHT_KIND_LM_HEAD, "no HF Llama tensor for %s", weight_kind_name(kind));
    char local[CK_NAME], name[CK_NAME];
    snprintf(local, sizeof local, fmt ? fmt : "", l);
    if (kind == WEIGHT_KIND_LM_HEAD) snprintf(name, sizeof name, "%s", ck->files->hf_head);
    else snprintf(name, sizeof name, "%s%s", ck->files->hf_prefix, local);
    s->mode = CK_DIRECT;
    s->off = 0;
    return ck_part(ck, s, ck->layout == CHECKPOINT_LAYOUT_HF ? 0 : -1, name, s->ndim, s->rows,
                   s->cols);
}

static enum status ck_source_hf_gpt2(const struct checkpoint *ck, enum weight_kind kind, int l,
                                     struct ck_source *s)
{
    const struct model_config *c = &ck->cfg;
    int64_t d = c->d_model, q = (int64_t)c->n_heads * c->head_dim;
    int64_t kv = (int64_t)c->n_kv_heads * c->head_dim, f = c->ffn_hidden, qkv = q + 2 * kv;
    const char *fmt = NULL;
    int ndim = 1;
    int64_t d0 = d, d1 = 0;
    s->mode = CK_DIRECT;
    s->off = 0;
    switch (kind) {
    case WEIGHT_KIND_TOK_EMBEDDING: fmt = "wte.weight", ndim = 2, d0 = c->vocab_size, d1 = d; break;
    case WEIGHT_KIND_POS_EMBEDDING: fmt = "wpe.weight", ndim = 2, d0 = c->max_positions, d1 = d; break;
    case WEIGHT_KIND_ATTN_NORM: fmt = "h.%d.ln_1.weight"; break;
    case WEIGHT_KIND_ATTN_NORM_BIAS: fmt = "h.%d.ln_1.bias"; break;
    case WEIGHT_KIND_MLP_NORM: fmt = "h.%d.ln_2.weight"; break;
    case WEIGHT_KIND_MLP_NORM_BIAS: fmt = "h.%d.ln_2.bias"; break;
    case WEIGHT_KIND_FINAL_NORM: fmt = "ln_f.weight"; break;
    case WEIGHT_KIND_FINAL_NORM_BIAS: fmt = "ln_f.bias"; break;
    case WEIGHT_KIND_Q:
    case WEIGHT_KIND_K:
    case WEIGHT_KIND_V:
        fmt = "h.%d.attn.c_attn.weight", ndim = 2, d0 = d, d1 = qkv;
        s->mode = CK_TRANSPOSED;
        s->off = kind == WEIGHT_KIND_Q ? 0 : kind == WEIGHT_KIND_K ? q : q + kv;
        break;
    case WEIGHT_KIND_Q_BIAS:
    case WEIGHT_KIND_K_BIAS:
    case WEIGHT_KIND_V_BIAS:
        fmt = "h.%d.attn.c_attn.bias", d0 = qkv;
        s->off = kind == WEIGHT_KIND_Q_BIAS ? 0 : kind == WEIGHT_KIND_K_BIAS ? q : q + kv;
        break;
    case WEIGHT_KIND_O: fmt = "h.%d.attn.c_proj.weight", ndim = 2, d0 = q, d1 = d, s->mode = CK_TRANSPOSED; break;
    case WEIGHT_KIND_O_BIAS: fmt = "h.%d.attn.c_proj.bias"; break;
    case WEIGHT_KIND_UP: fmt = "h.%d.mlp.c_fc.weight", ndim = 2, d0 = d, d1 = f, s->mode = CK_TRANSPOSED; break;
    case WEIGHT_KIND_UP_BIAS: fmt = "h.%d.mlp.c_fc.bias", d0 = f; break;
    case WEIGHT_KIND_DOWN: fmt = "h.%d.mlp.c_proj.weight", ndim = 2, d0 = f, d1 = d, s->mode = CK_TRANSPOSED; break;
    case WEIGHT_KIND_DOWN_BIAS: fmt = "h.%d.mlp.c_proj.bias"; break;
    default: break;
    }
    CHECK(fmt, "no GPT-2 tensor for %s", weight_kind_name(kind));
    char local[CK_NAME], name[CK_NAME];
    snprintf(local, sizeof local, fmt, l);
    snprintf(name, sizeof name, "%s%s", ck->files->gpt2_prefix, local);
    return ck_part(ck, s, ck->layout == CHECKPOINT_LAYOUT_HF ? 0 : -1, name, ndim, d0, d1);
}

static enum status ck_source_megatron(const struct checkpoint *ck, enum weight_kind kind, int l,
                                      struct ck_source *s)
{
    const struct model_config *c = &ck->cfg;
    const struct checkpoint_files *cf = ck->files;
    int T = ck->saved_tp, P = ck->saved_pp;
    int64_t d = c->d_model, hd = c->head_dim, q = (int64_t)c->n_heads * hd;
    int64_t f = c->ffn_hidden, qpg = c->n_heads / c->n_kv_heads, gpp = c->n_kv_heads / T;
    int stage = 0, local = 0;
    if (weight_kind_per_layer(kind)) {
        while (stage + 1 < P && l >= cf->stage_first[stage + 1]) stage++;
        local = l - cf->stage_first[stage];
    } else if (kind == WEIGHT_KIND_FINAL_NORM || kind == WEIGHT_KIND_FINAL_NORM_BIAS ||
               kind == WEIGHT_KIND_LM_HEAD) {
        stage = P - 1;
    }
    int f0 = stage * T; /* tp rank 0 of the stage */
    char name[CK_NAME], alt[CK_NAME];
    const char *pre = "decoder.layers.";
    s->mode = CK_DIRECT;
    s->off = 0;

    /* Replicated vectors, read from tp rank 0; norms also under their TE-style names. */
    const char *vec = NULL, *te = NULL;
    switch (kind) {
    case WEIGHT_KIND_ATTN_NORM: vec = "input_layernorm.weight", te = "self_attention.linear_qkv.layer_norm_weight"; break;
    case WEIGHT_KIND_ATTN_NORM_BIAS: vec = "input_layernorm.bias", te = "self_attention.linear_qkv.layer_norm_bias"; break;
    case WEIGHT_KIND_MLP_NORM: vec = "pre_mlp_layernorm.weight", te = "mlp.linear_fc1.layer_norm_weight"; break;
    case WEIGHT_KIND_MLP_NORM_BIAS: vec = "pre_mlp_layernorm.bias", te = "mlp.linear_fc1.layer_norm_bias"; break;
    case WEIGHT_KIND_O_BIAS: vec = "self_attention.linear_proj.bias"; break;
    case WEIGHT_KIND_DOWN_BIAS: vec = "mlp.linear_fc2.bias"; break;
    case WEIGHT_KIND_Q_NORM: vec = "self_attention.q_layernorm.weight"; break;
    case WEIGHT_KIND_K_NORM: vec = "self_attention.k_layernorm.weight"; break;
    case WEIGHT_KIND_POST_ATTN_NORM: vec = "post_self_attn_layernorm.weight"; break;
    case WEIGHT_KIND_POST_MLP_NORM: vec = "post_mlp_layernorm.weight"; break;
    default: break;
    }
    if (vec) {
        int64_t n = kind == WEIGHT_KIND_Q_NORM || kind == WEIGHT_KIND_K_NORM ? hd : d;
        snprintf(name, sizeof name, "%s%d.%s", pre, local, vec);
        if (te) {
            snprintf(alt, sizeof alt, "%s%d.%s", pre, local, te);
            if (!ck_try(ck, f0, name) && ck_try(ck, f0, alt)) return ck_part(ck, s, f0, alt, 1, n, 0);
        }
        return ck_part(ck, s, f0, name, 1, n, 0);
    }

    enum status st = STATUS_OK;
    switch (kind) {
    case WEIGHT_KIND_FINAL_NORM: return ck_part(ck, s, f0, "decoder.final_layernorm.weight", 1, d, 0);
    case WEIGHT_KIND_FINAL_NORM_BIAS: return ck_part(ck, s, f0, "decoder.final_layernorm.bias", 1, d, 0);
    case WEIGHT_KIND_POS_EMBEDDING:
        return ck_part(ck, s, f0, "embedding.position_embeddings.weight", 2, c->max_positions, d);
    case WEIGHT_KIND_TOK_EMBEDDING:
    case WEIGHT_KIND_LM_HEAD:
        s->mode = CK_ROWS_SPLIT;
        s->part_rows = cf->padded_vocab / T;
        snprintf(name, sizeof name, "%s",
                 kind == WEIGHT_KIND_LM_HEAD ? "output_layer.weight" : "embedding.word_embeddings.weight");
        for (int t = 0; t < T && !st; t++) st = ck_part(ck, s, f0 + t, name, 2, s->part_rows, d);
        return st;
    case WEIGHT_KIND_Q:
    case WEIGHT_KIND_K:
    case WEIGHT_KIND_V:
    case WEIGHT_KIND_Q_BIAS:
    case WEIGHT_KIND_K_BIAS:
    case WEIGHT_KIND_V_BIAS: {
        int bias = kind == WEIGHT_KIND_Q_BIAS || kind == WEIGHT_KIND_K_BIAS || kind == WEIGHT_KIND_V_BIAS;
        s->mode = CK_QKV;
        s->off = (kind == WEIGHT_KIND_Q || kind == WEIGHT_KIND_Q_BIAS)   ? 0
                 : (kind == WEIGHT_KIND_K || kind == WEIGHT_KIND_K_BIAS) ? 1
                                                                         : 2;
        s->q_per_group = qpg;
        s->groups_per_part = gpp;
        s->head_dim = hd;
        snprintf(name, sizeof name, "%s%d.self_attention.linear_qkv.%s", pre, local,
                 bias ? "bias" : "weight");
        for (int t = 0; t < T && !st; t++)
            st = ck_part(ck, s, f0 + t, name, bias ? 1 : 2, gpp * (qpg + 2) * hd, d);
        return st;
    }
    case WEIGHT_KIND_O:
        s->mode = CK_COLS_SPLIT;
        s->part_cols = q / T;
        snprintf(name, sizeof name, "%s%d.self_attention.linear_proj.weight", pre, local);
        for (int t = 0; t < T && !st; t++) st = ck_part(ck, s, f0 + t, name, 2, d, q / T);
        return st;
    case WEIGHT_KIND_DOWN:
        s->mode = CK_COLS_SPLIT;
        s->part_cols = f / T;
        snprintf(name, sizeof name, "%s%d.mlp.linear_fc2.weight", pre, local);
        for (int t = 0; t < T && !st; t++) st = ck_part(ck, s, f0 + t, name, 2, d, f / T);
        return st;
    case WEIGHT_KIND_GATE:
    case WEIGHT_KIND_UP:
    case WEIGHT_KIND_GATE_BIAS:
    case WEIGHT_KIND_UP_BIAS: {
        int bias = kind == WEIGHT_KIND_GATE_BIAS || kind == WEIGHT_KIND_UP_BIAS;
        int up = kind == WEIGHT_KIND_UP || kind == WEIGHT_KIND_UP_BIAS;
        int64_t per = f / T, n = c->gated_mlp ? 2 * per : per;
        s->mode = CK_ROWS_SPLIT;
        s->part_rows = per;
        s->off = (up && c->gated_mlp) ? per : 0;
        snprintf(name, sizeof name, "%s%d.mlp.linear_fc1.%s", pre, local, bias ? "bias" : "weight");
        for (int t = 0; t < T && !st; t++) st = ck_part(ck, s, f0 + t, name, bias ? 1 : 2, n, d);
        return st;
    }
    default: break;
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
    ck_canonical(&ck->cfg, kind, &s->ndim, &s->rows, &s->cols);
    if (ck->layout == CHECKPOINT_LAYOUT_MEGATRON) return ck_source_megatron(ck, kind, l, s);
    if (ck->cfg.family == MODEL_FAMILY_GPT2) return ck_source_hf_gpt2(ck, kind, l, s);
    return ck_source_hf_llama(ck, kind, l, s);
}

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
    }
}

/* The block of canonical rows / columns that tp rank r of tp holds. */
static enum status ck_plan(const struct model_config *c, enum weight_kind kind, int tp_rank,
                           int tp_size, struct ck_slice *p)
{
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size)
        return status_errorf(STATUS_INVALID_ARGUMENT, "tp rank %d of tp size %d", tp_rank, tp_size);
    if (c->n_heads % tp_size || c->ffn_hidden % tp_size ||
        (c->n_kv_heads % tp_size && tp_size % c->n_kv_heads))
        return status_errorf(STATUS_UNSUPPORTED,
                             "tp size %d does not partition the model: it must divide n_heads (%d) "
                             "and ffn_hidden (%d), and divide or be a multiple of n_kv_heads (%d)",
                             tp_size, c->n_heads, c->ffn_hidden, c->n_kv_heads);
    int64_t rows, cols, hd = c->head_dim;
    ck_canonical(c, kind, &p->ndim, &rows, &cols);
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
        p->nr = c->ffn_hidden / tp_size;
        p->r0 = tp_rank * p->nr;
        break;
    case WEIGHT_KIND_O:
        p->nc = c->n_heads / tp_size * hd;
        p->c0 = tp_rank * p->nc;
        break;
    case WEIGHT_KIND_DOWN:
        p->nc = c->ffn_hidden / tp_size;
        p->c0 = tp_rank * p->nc;
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
    if (!weight_kind_exists(c, kind))
        return status_errorf(STATUS_INVALID_ARGUMENT, "checkpoint %s: this %s model has no weight %s",
                             ck->files->dir, c->architecture, weight_kind_name(kind));
    if (weight_kind_per_layer(kind) && (layer < 0 || layer >= c->n_layers))
        return status_errorf(STATUS_INVALID_ARGUMENT, "checkpoint %s: layer %d of %d", ck->files->dir,
                             layer, c->n_layers);
    if (!weight_kind_per_layer(kind)) layer = 0;
    if (!dtype_is_float(dtype))
        return status_errorf(STATUS_INVALID_ARGUMENT, "weights convert to float dtypes, not %s",
                             dtype_name(dtype));
    if ((s = ck_plan(c, kind, tp_rank, tp_size, sl))) return s;
    if ((s = ck_source(ck, kind, layer, src))) return s;

    out->dtype = dtype;
    out->stored_dtype = src->part[0]->dtype;
    out->ndim = sl->ndim;
    out->shape[0] = sl->nr;
    out->shape[1] = sl->ndim == 2 ? sl->nc : 0;
    out->nbytes = (size_t)(sl->nr * sl->nc) * dtype_size(dtype);
    out->row_start = sl->r0;
    out->col_start = sl->c0;
    out->rows_valid = sl->rows_valid;

    /* Zero-copy: every row one run of nc elements, stride 1, consecutive in one part. */
    if (sl->rows_valid != sl->nr || sl->nr == 0) return STATUS_OK;
    int p0 = -1;
    int64_t e0 = 0, next = 0;
    for (int64_t i = 0; i < sl->nr; i++) {
        int p;
        int64_t e, run, stride;
        ck_resolve(src, sl->r0 + i, sl->c0, &p, &e, &run, &stride);
        if (run < sl->nc || (stride != 1 && sl->nc > 1)) return STATUS_OK;
        if (i == 0) p0 = p, e0 = e, next = e;
        if (p != p0 || e != next) return STATUS_OK;
        next += sl->nc;
    }
    const struct st_tensor *t = src->part[p0];
    const unsigned char *data = (const unsigned char *)t->data + e0 * (int64_t)dtype_size(t->dtype);
    if (t->dtype != dtype || (uintptr_t)data % dtype_size(dtype)) return STATUS_OK;
    out->zero_copy = 1;
    out->data = data;
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
    if (out->zero_copy && (flags & CHECKPOINT_GET_ZERO_COPY_OK)) return STATUS_OK;
    out->zero_copy = 0;
    out->data = NULL;
    size_t es = dtype_size(dtype);
    if (!buf || buf_size < out->nbytes)
        return status_errorf(STATUS_INVALID_ARGUMENT, "weight %s: needs a %zu-byte buffer, got %zu",
                             weight_kind_name(kind), out->nbytes, buf ? buf_size : 0);
    if ((uintptr_t)buf % es)
        return status_errorf(STATUS_INVALID_ARGUMENT, "weight %s: buffer not aligned to %zu bytes",
                             weight_kind_name(kind), es);
    unsigned char *dst = buf;
    for (int64_t i = 0; i < sl.nr; i++) {
        unsigned char *row = dst + (size_t)(i * sl.nc) * es;
        if (i >= sl.rows_valid) { /* vocab padding */
            memset(row, 0, (size_t)sl.nc * es);
            continue;
        }
        for (int64_t c = sl.c0; c < sl.c0 + sl.nc;) {
            int p;
            int64_t e, run, stride;
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

/* ---- opening ---------------------------------------------------------------------------- */

static enum status ck_open_hf_index(struct checkpoint *ck)
{
    struct checkpoint_files *cf = ck->files;
    enum status s;
    char path[CK_PATH];
    cJSON *root = NULL;
    if ((s = ck_pathf(path, cf->dir, hf_index_name)) || (s = ck_read_json(path, &root))) return s;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: missing object 'weight_map'", path);
        goto out;
    }
    int n = cJSON_GetArraySize(map);
    cf->names = calloc((size_t)n + 1, sizeof *cf->names);
    if (!cf->names) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, map) {
        if (!cJSON_IsString(it) || !*it->valuestring || strchr(it->valuestring, '/') ||
            !strcmp(it->valuestring, "..") || !strcmp(it->valuestring, ".")) {
            s = status_errorf(STATUS_BAD_FORMAT,
                              "%s: weight_map entry '%s' must name a file in the same directory",
                              path, it->string);
            goto out;
        }
        int fi = -1;
        for (int i = 0; i < cf->n_files; i++)
            if (!strcmp(cf->file_names[i], it->valuestring)) fi = i;
        if (fi < 0) {
            char shard[CK_PATH];
            if ((s = ck_pathf(shard, cf->dir, it->valuestring))) goto out;
            if (!ck_is_file(shard)) {
                s = status_errorf(STATUS_NOT_FOUND, "%s names shard %s, which does not exist", path,
                                  it->valuestring);
                goto out;
            }
            if ((s = ck_add_file(ck, it->valuestring))) goto out;
            fi = cf->n_files - 1;
        }
        const struct st_tensor *t = safetensors_find(cf->files[fi], it->string);
        if (!t) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s maps tensor '%s' to %s, which has no such tensor",
                              path, it->string, it->valuestring);
            goto out;
        }
        cf->names[cf->n_names++] = (struct ck_name){t->name, t, fi};
    }
    qsort(cf->names, (size_t)cf->n_names, sizeof *cf->names, ck_cmp_name);
    for (int i = 1; i < cf->n_names; i++) {
        if (!strcmp(cf->names[i].name, cf->names[i - 1].name)) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' mapped twice", path, cf->names[i].name);
            goto out;
        }
    }
out:
    cJSON_Delete(root);
    return s;
}

static enum status ck_json_int(const cJSON *root, const char *path, const char *key, int *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(it) || !(it->valuedouble >= INT_MIN && it->valuedouble <= INT_MAX) ||
        it->valuedouble != (double)(int)it->valuedouble)
        return status_errorf(STATUS_BAD_FORMAT, "%s: missing or non-integer field '%s'", path, key);
    *out = (int)it->valuedouble;
    return STATUS_OK;
}

static enum status ck_json_expect(const cJSON *root, const char *path, const char *key,
                                  const char *want, enum status mismatch)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsString(it))
        return status_errorf(STATUS_BAD_FORMAT, "%s: missing string field '%s'", path, key);
    if (strcmp(it->valuestring, want))
        return status_errorf(mismatch, "%s: field '%s' is \"%s\"; this build reads \"%s\"", path, key,
                             it->valuestring, want);
    return STATUS_OK;
}

static enum status ck_open_megatron(struct checkpoint *ck)
{
    struct checkpoint_files *cf = ck->files;
    const struct model_config *c = &ck->cfg;
    enum status s;
    char path[CK_PATH];
    cJSON *root = NULL;
    int version, tp, pp, n_layers, vocab;
    if ((s = ck_pathf(path, cf->dir, megatron_meta_name)) || (s = ck_read_json(path, &root))) return s;
    if ((s = ck_json_expect(root, path, "format", "shardlm-megatron", STATUS_BAD_FORMAT)) ||
        (s = ck_json_int(root, path, "version", &version)))
        goto out;
    if (version != 1) {
        s = status_errorf(STATUS_UNSUPPORTED, "%s: version %d; this build reads version 1", path,
                          version);
        goto out;
    }
    if ((s = ck_json_int(root, path, "tp_size", &tp)) || (s = ck_json_int(root, path, "pp_size", &pp)) ||
        (s = ck_json_int(root, path, "n_layers", &n_layers)) ||
        (s = ck_json_int(root, path, "vocab_size", &vocab)) ||
        (s = ck_json_int(root, path, "padded_vocab_size", &cf->padded_vocab)) ||
        (s = ck_json_expect(root, path, "tensor_names", "megatron-core-local", STATUS_UNSUPPORTED)) ||
        (s = ck_json_expect(root, path, "qkv_layout", "megatron-core-grouped", STATUS_UNSUPPORTED)) ||
        (s = ck_json_expect(root, path, "fc1_layout", "gate-up-per-rank", STATUS_UNSUPPORTED)))
        goto out;
    if (tp < 1 || tp > CK_MAX_TP || pp < 1 || pp > CK_MAX_PP || pp > c->n_layers) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: tp_size %d / pp_size %d out of range (1..%d / 1..%d)",
                          path, tp, pp, CK_MAX_TP, c->n_layers < CK_MAX_PP ? c->n_layers : CK_MAX_PP);
        goto out;
    }
    if (n_layers != c->n_layers || vocab != c->vocab_size) {
        s = status_errorf(STATUS_BAD_FORMAT,
                          "%s: n_layers %d / vocab_size %d disagree with config.json (%d / %d)", path,
                          n_layers, vocab, c->n_layers, c->vocab_size);
        goto out;
    }
    if (c->n_heads % tp || c->n_kv_heads % tp || c->ffn_hidden % tp) {
        s = status_errorf(STATUS_BAD_FORMAT,
                          "%s: tp_size %d does not divide n_heads %d, n_kv_heads %d and ffn_hidden %d",
                          path, tp, c->n_heads, c->n_kv_heads, c->ffn_hidden);
        goto out;
    }
    if (cf->padded_vocab < vocab || cf->padded_vocab % tp) {
        s = status_errorf(STATUS_BAD_FORMAT,
                          "%s: padded_vocab_size %d must be a multiple of tp_size %d and >= %d", path,
                          cf->padded_vocab, tp, vocab);
        goto out;
    }
    const cJSON *lps = cJSON_GetObjectItemCaseSensitive(root, "layers_per_stage");
    if (!cJSON_IsArray(lps) || cJSON_GetArraySize(lps) != pp) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: 'layers_per_stage' must be a list of %d integers",
                          path, pp);
        goto out;
    }
    cf->stage_first[0] = 0;
    for (int i = 0; i < pp; i++) {
        const cJSON *it = cJSON_GetArrayItem(lps, i);
        if (!cJSON_IsNumber(it) || it->valuedouble < 1 || it->valuedouble > c->n_layers ||
            it->valuedouble != (double)(int)it->valuedouble) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: layers_per_stage[%d] is not a positive integer",
                              path, i);
            goto out;
        }
        cf->stage_first[i + 1] = cf->stage_first[i] + (int)it->valuedouble;
    }
    if (cf->stage_first[pp] != c->n_layers) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: layers_per_stage sums to %d, config.json has %d layers",
                          path, cf->stage_first[pp], c->n_layers);
        goto out;
    }
    ck->saved_tp = tp;
    ck->saved_pp = pp;
    for (int p = 0; p < pp; p++) {
        for (int t = 0; t < tp; t++) {
            char rel[64], folder[CK_PATH];
            snprintf(rel, sizeof rel, "mp_rank_%02d_%03d", t, p);
            if ((s = ck_pathf(folder, cf->dir, rel))) goto out;
            if (!ck_is_dir(folder) && pp == 1) { /* Megatron's own name when pp == 1 */
                snprintf(rel, sizeof rel, "mp_rank_%02d", t);
                if ((s = ck_pathf(folder, cf->dir, rel))) goto out;
            }
            if (!ck_is_dir(folder)) {
                s = status_errorf(STATUS_NOT_FOUND, "checkpoint %s: rank folder mp_rank_%02d_%03d is missing",
                                  cf->dir, t, p);
                goto out;
            }
            strcat(rel, "/model.safetensors");
            if ((s = ck_add_file(ck, rel))) goto out;
        }
    }
out:
    cJSON_Delete(root);
    return s;
}

enum status checkpoint_open(const char *dir, struct checkpoint **out)
{
    enum status s = STATUS_OK;
    char path[CK_PATH];
    *out = NULL;
    struct checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->files = calloc(1, sizeof *ck->files)) || !(ck->files->dir = strdup(dir))) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    struct checkpoint_files *cf = ck->files;
    cf->gpt2_prefix = "";
    cf->hf_prefix = "model.";
    cf->hf_head = "lm_head.weight";
    ck->saved_tp = ck->saved_pp = 1;
    if (!ck_is_dir(dir)) {
        s = status_errorf(STATUS_NOT_FOUND, "checkpoint %s: no such directory", dir);
        goto out;
    }
    if ((s = ck_pathf(path, dir, "config.json")) || (s = config_load(path, &ck->cfg))) goto out;

    char meta[CK_PATH], single[CK_PATH], index[CK_PATH];
    if ((s = ck_pathf(meta, dir, megatron_meta_name)) || (s = ck_pathf(single, dir, hf_single_name)) ||
        (s = ck_pathf(index, dir, hf_index_name)))
        goto out;
    if (ck_is_file(meta)) {
        ck->layout = CHECKPOINT_LAYOUT_MEGATRON;
        s = ck_open_megatron(ck);
    } else if (ck_is_file(single)) {
        ck->layout = CHECKPOINT_LAYOUT_HF;
        s = ck_add_file(ck, hf_single_name);
    } else if (ck_is_file(index)) {
        ck->layout = CHECKPOINT_LAYOUT_HF_SHARDED;
        s = ck_open_hf_index(ck);
    } else {
        s = status_errorf(STATUS_NOT_FOUND,
                          "checkpoint %s: no weights (looked for %s, %s and %s)", dir,
                          megatron_meta_name, hf_single_name, hf_index_name);
    }
    if (s) goto out;

    if (ck->layout != CHECKPOINT_LAYOUT_MEGATRON && ck->cfg.family == MODEL_FAMILY_GPT2 &&
        ck_try(ck, ck->layout == CHECKPOINT_LAYOUT_HF ? 0 : -1, "transformer.wte.weight"))
        cf->gpt2_prefix = "transformer.";
    /* A multimodal Gemma 3 checkpoint keeps the text model under another prefix: older
     * transformers "language_model.model." (head "language_model.lm_head.weight"), newer
     * "model.language_model." (head "lm_head.weight"). */
    if (ck->layout != CHECKPOINT_LAYOUT_MEGATRON && ck->cfg.family == MODEL_FAMILY_GEMMA3) {
        int fi = ck->layout == CHECKPOINT_LAYOUT_HF ? 0 : -1;
        if (!ck_try(ck, fi, "model.embed_tokens.weight")) {
            if (ck_try(ck, fi, "language_model.model.embed_tokens.weight")) {
                cf->hf_prefix = "language_model.model.";
                cf->hf_head = "language_model.lm_head.weight";
            } else if (ck_try(ck, fi, "model.language_model.embed_tokens.weight")) {
                cf->hf_prefix = "model.language_model.";
            }
        }
    }

    /* Locate and check every weight now, so that checkpoint_get cannot fail on the format. */
    for (int k = 0; k < WEIGHT_KIND_COUNT; k++) {
        if (!weight_kind_exists(&ck->cfg, (enum weight_kind)k)) continue;
        int n = weight_kind_per_layer((enum weight_kind)k) ? ck->cfg.n_layers : 1;
        for (int l = 0; l < n; l++) {
            struct ck_source src;
            if ((s = ck_source(ck, (enum weight_kind)k, l, &src))) goto out;
        }
    }
    LOG_DEBUG("checkpoint", "%s: %s, %d file(s), tp %d pp %d as saved", dir,
              ck->layout == CHECKPOINT_LAYOUT_MEGATRON ? "megatron"
              : ck->layout == CHECKPOINT_LAYOUT_HF     ? "hf"
                                                       : "hf sharded",
              cf->n_files, ck->saved_tp, ck->saved_pp);
    *out = ck;
    ck = NULL;
out:
    checkpoint_close(ck);
    return s;
}

void checkpoint_close(struct checkpoint *ck)
{
    if (!ck) return;
    struct checkpoint_files *cf = ck->files;
    if (cf) {
        for (int i = 0; i < cf->n_files; i++) {
            safetensors_close(cf->files[i]);
            free(cf->file_names[i]);
        }
        free(cf->files);
        free(cf->file_names);
        free(cf->names);
        free(cf->dir);
        free(cf);
    }
    free(ck);
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
};

struct mw_fill {
    struct checkpoint    *ck;
    const struct mw_item *item;
    int                   tp_rank, tp_size;
};

/* Writes one canonical slice of kind into dst (exactly nbytes). */
static enum status mw_get(struct mw_fill *f, enum weight_kind kind, void *dst, size_t nbytes)
{
    struct host_weight hw;
    return checkpoint_get(f->ck, kind, f->item->layer, f->tp_rank, f->tp_size, f->item->dtype, dst,
                          nbytes, 0, &hw);
}

static enum status mw_fill_fn(void *ctx, void *dst, size_t nbytes)
{
    struct mw_fill *f = ctx;
    const struct mw_item *it = f->item;
    const struct model_config *c = &f->ck->cfg;
    enum status s = STATUS_OK;
    size_t es = dtype_size(it->dtype);
    int64_t cols = it->bias ? 1 : c->d_model;
    if (it->what == MW_KIND) return mw_get(f, it->kind, dst, nbytes);
    if (it->what == MW_FC1) {
        size_t part = (size_t)(c->ffn_hidden / f->tp_size * cols) * es;
        if (!c->gated_mlp) return mw_get(f, it->bias ? WEIGHT_KIND_UP_BIAS : WEIGHT_KIND_UP, dst, nbytes);
        if ((s = mw_get(f, it->bias ? WEIGHT_KIND_GATE_BIAS : WEIGHT_KIND_GATE, dst, part))) return s;
        return mw_get(f, it->bias ? WEIGHT_KIND_UP_BIAS : WEIGHT_KIND_UP, (char *)dst + part, part);
    }
    /* MW_QKV: per local group, its q heads, then its k head, then its v head. */
    int64_t hd = c->head_dim, qpg = c->n_heads / c->n_kv_heads, groups = c->n_kv_heads / f->tp_size;
    size_t head = (size_t)(hd * cols) * es;
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

/* Appends item (shape and dtype from describe for MW_KIND). */
static enum status mw_push(struct mw_item **items, int *n, int *cap, struct mw_item it)
{
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        struct mw_item *p = realloc(*items, (size_t)nc * sizeof *p);
        if (!p) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        *items = p;
        *cap = nc;
    }
    (*items)[(*n)++] = it;
    return STATUS_OK;
}

/* Lists the tensors of file (stage, rank). */
static enum status mw_list(struct checkpoint *ck, int stage, int rank, int tp, int pp,
                           struct mw_item **items, int *n, int *cap)
{
    const struct model_config *c = &ck->cfg;
    enum status s = STATUS_OK;
    struct host_weight hw;
    int first, count;
    checkpoint_pp_layers(c->n_layers, pp, stage, &first, &count);

#define MW_KIND_ITEM(kind_, layer_, ...)                                                      \
    do {                                                                                      \
        struct mw_item it_ = {.what = MW_KIND, .kind = (kind_), .layer = (layer_)};           \
        snprintf(it_.name, sizeof it_.name, __VA_ARGS__);                                     \
        if ((s = checkpoint_describe(ck, (kind_), (layer_), rank, tp, DTYPE_F32, &hw))) return s; \
        it_.dtype = hw.stored_dtype;                                                          \
        it_.ndim = hw.ndim;                                                                   \
        it_.shape[0] = hw.shape[0];                                                           \
        it_.shape[1] = hw.shape[1];                                                           \
        if ((s = mw_push(items, n, cap, it_))) return s;                                      \
    } while (0)

    if (stage == 0) {
        MW_KIND_ITEM(WEIGHT_KIND_TOK_EMBEDDING, 0, "embedding.word_embeddings.weight");
        if (weight_kind_exists(c, WEIGHT_KIND_POS_EMBEDDING))
            MW_KIND_ITEM(WEIGHT_KIND_POS_EMBEDDING, 0, "embedding.position_embeddings.weight");
    }
    int ln = c->norm == NORM_KIND_LAYERNORM;
    int64_t hd = c->head_dim, qkv_rows = (int64_t)(c->n_heads + 2 * c->n_kv_heads) / tp * hd;
    int64_t fc1_rows = (int64_t)(c->gated_mlp ? 2 : 1) * c->ffn_hidden / tp;
    for (int i = 0; i < count; i++) {
        int l = first + i;
        const char *p = "decoder.layers.";
        MW_KIND_ITEM(WEIGHT_KIND_ATTN_NORM, l, "%s%d.input_layernorm.weight", p, i);
        if (ln) MW_KIND_ITEM(WEIGHT_KIND_ATTN_NORM_BIAS, l, "%s%d.input_layernorm.bias", p, i);
        for (int bias = 0; bias <= c->qkv_bias; bias++) {
            struct mw_item it = {.what = MW_QKV, .bias = bias, .layer = l, .ndim = bias ? 1 : 2,
                                 .shape = {qkv_rows, bias ? 0 : c->d_model}};
            snprintf(it.name, sizeof it.name, "%s%d.self_attention.linear_qkv.%s", p, i,
                     bias ? "bias" : "weight");
            if ((s = checkpoint_describe(ck, bias ? WEIGHT_KIND_Q_BIAS : WEIGHT_KIND_Q, l, rank, tp,
                                         DTYPE_F32, &hw)))
                return s;
            it.dtype = hw.stored_dtype;
            if ((s = mw_push(items, n, cap, it))) return s;
        }
        if (c->qk_norm) {
            MW_KIND_ITEM(WEIGHT_KIND_Q_NORM, l, "%s%d.self_attention.q_layernorm.weight", p, i);
            MW_KIND_ITEM(WEIGHT_KIND_K_NORM, l, "%s%d.self_attention.k_layernorm.weight", p, i);
        }
        MW_KIND_ITEM(WEIGHT_KIND_O, l, "%s%d.self_attention.linear_proj.weight", p, i);
        if (c->attn_out_bias)
            MW_KIND_ITEM(WEIGHT_KIND_O_BIAS, l, "%s%d.self_attention.linear_proj.bias", p, i);
        if (c->sandwich_norms)
            MW_KIND_ITEM(WEIGHT_KIND_POST_ATTN_NORM, l, "%s%d.post_self_attn_layernorm.weight", p, i);
        MW_KIND_ITEM(WEIGHT_KIND_MLP_NORM, l, "%s%d.pre_mlp_layernorm.weight", p, i);
        if (ln) MW_KIND_ITEM(WEIGHT_KIND_MLP_NORM_BIAS, l, "%s%d.pre_mlp_layernorm.bias", p, i);
        for (int bias = 0; bias <= c->mlp_bias; bias++) {
            struct mw_item it = {.what = MW_FC1, .bias = bias, .layer = l, .ndim = bias ? 1 : 2,
                                 .shape = {fc1_rows, bias ? 0 : c->d_model}};
            snprintf(it.name, sizeof it.name, "%s%d.mlp.linear_fc1.%s", p, i, bias ? "bias" : "weight");
            if ((s = checkpoint_describe(ck, bias ? WEIGHT_KIND_UP_BIAS : WEIGHT_KIND_UP, l, rank, tp,
                                         DTYPE_F32, &hw)))
                return s;
            it.dtype = hw.stored_dtype;
            if ((s = mw_push(items, n, cap, it))) return s;
        }
        MW_KIND_ITEM(WEIGHT_KIND_DOWN, l, "%s%d.mlp.linear_fc2.weight", p, i);
        if (c->mlp_bias) MW_KIND_ITEM(WEIGHT_KIND_DOWN_BIAS, l, "%s%d.mlp.linear_fc2.bias", p, i);
        if (c->sandwich_norms)
            MW_KIND_ITEM(WEIGHT_KIND_POST_MLP_NORM, l, "%s%d.post_mlp_layernorm.weight", p, i);
    }
    if (stage == pp - 1) {
        MW_KIND_ITEM(WEIGHT_KIND_FINAL_NORM, 0, "decoder.final_layernorm.weight");
        if (ln) MW_KIND_ITEM(WEIGHT_KIND_FINAL_NORM_BIAS, 0, "decoder.final_layernorm.bias");
        if (!c->tied_embeddings) MW_KIND_ITEM(WEIGHT_KIND_LM_HEAD, 0, "output_layer.weight");
    }
#undef MW_KIND_ITEM
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
    int n = 0, cap = 0;
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

/* Copies dir_in/name to dir_out/name through name.tmp, when dir_in/name exists. */
static enum status mw_copy_file(const char *dir_in, const char *dir_out, const char *name)
{
    enum status s = STATUS_OK;
    char in[CK_PATH], out[CK_PATH], tmp[CK_PATH + 8];
    if ((s = ck_pathf(in, dir_in, name)) || (s = ck_pathf(out, dir_out, name))) return s;
    if (!ck_is_file(in)) return STATUS_OK;
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *fi = fopen(in, "rb"), *fo = NULL;
    if (!fi) return status_errorf(STATUS_IO, "%s: %s", in, strerror(errno));
    if (!(fo = fopen(tmp, "wb"))) {
        s = status_errorf(STATUS_IO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, fi)) > 0) {
        if (fwrite(buf, 1, got, fo) != got) {
            s = status_errorf(STATUS_IO, "%s: %s", tmp, strerror(errno));
            goto out;
        }
    }
    if (ferror(fi)) {
        s = status_errorf(STATUS_IO, "%s: read error", in);
        goto out;
    }
    int rc = fclose(fo);
    fo = NULL;
    if (rc != 0) s = status_errorf(STATUS_IO, "%s: %s", tmp, strerror(errno));
    else if (rename(tmp, out) != 0) s = status_errorf(STATUS_IO, "rename %s: %s", tmp, strerror(errno));
out:
    if (fo) fclose(fo);
    if (s) remove(tmp);
    fclose(fi);
    return s;
}

static enum status mw_write_meta(const char *dir_out, const struct model_config *c, int tp, int pp)
{
    enum status s = STATUS_OK;
    char path[CK_PATH], tmp[CK_PATH + 8];
    char *text = NULL;
    FILE *f = NULL;
    if ((s = ck_pathf(path, dir_out, megatron_meta_name))) return s;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
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
    if (!(f = fopen(tmp, "wb"))) {
        s = status_errorf(STATUS_IO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    size_t len = strlen(text);
    int bad = fwrite(text, 1, len, f) != len || fputc('\n', f) == EOF;
    bad |= fclose(f) != 0;
    f = NULL;
    if (bad) s = status_errorf(STATUS_IO, "%s: %s", tmp, strerror(errno));
    else if (rename(tmp, path) != 0) s = status_errorf(STATUS_IO, "rename %s: %s", tmp, strerror(errno));
out:
    if (s) remove(tmp);
    cJSON_free(text);
    cJSON_Delete(lps);
    cJSON_Delete(root);
    return s;
}

/* Creates dir_out if missing and refuses to write over the source checkpoint. */
static enum status ck_out_dir(const char *dir_out, const struct checkpoint *src)
{
    char a[PATH_MAX], b[PATH_MAX];
    if (mkdir(dir_out, 0755) != 0 && errno != EEXIST)
        return status_errorf(STATUS_IO, "mkdir %s: %s", dir_out, strerror(errno));
    if (!realpath(dir_out, a) || !realpath(src->files->dir, b))
        return status_errorf(STATUS_IO, "%s: %s", dir_out, strerror(errno));
    if (!strcmp(a, b))
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: cannot write a checkpoint over its source",
                             dir_out);
    return STATUS_OK;
}

/* Copies the tokenizer files that are present and writes config.json (every writer's last
 * files besides its own metadata). */
static enum status ck_write_extras(const char *dir_out, const struct checkpoint *src)
{
    static const char *const extras[] = {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                         "special_tokens_map.json", "generation_config.json"};
    enum status s;
    char config[CK_PATH];
    for (size_t i = 0; i < sizeof extras / sizeof extras[0]; i++)
        if ((s = mw_copy_file(src->files->dir, dir_out, extras[i]))) return s;
    if ((s = ck_pathf(config, dir_out, "config.json")) || (s = config_save(config, &src->cfg))) return s;
    return STATUS_OK;
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
    if ((s = ck_out_dir(dir_out, src))) return s;
    /* Without its metadata a directory does not open: remove it first, write it last. */
    if ((s = ck_pathf(meta, dir_out, megatron_meta_name))) return s;
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
};

static enum status hfw_fill(void *ctx, void *dst, size_t nbytes)
{
    const struct hfw_item *it = ctx;
    struct host_weight hw;
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
        enum status s = checkpoint_describe(it->ck, it->kinds[i], it->layer, 0, 1, it->dtype, &hw);
        if (s) return s;
        unsigned char *part = malloc(hw.nbytes);
        if (!part) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        s = checkpoint_get(it->ck, it->kinds[i], it->layer, 0, 1, it->dtype, part, hw.nbytes, 0, &hw);
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

/* GPT-2's Hugging Face name for a canonical weight, and how it is stored: NULL for the parts
 * that another tensor carries (K and V live in c_attn with Q). */
static const char *hfw_gpt2(enum weight_kind kind, struct hfw_item *it)
{
    it->n_kinds = 0;
    it->transposed = 0;
    switch (kind) {
    case WEIGHT_KIND_TOK_EMBEDDING: return "wte.weight";
    case WEIGHT_KIND_POS_EMBEDDING: return "wpe.weight";
    case WEIGHT_KIND_ATTN_NORM: return "h.%d.ln_1.weight";
    case WEIGHT_KIND_ATTN_NORM_BIAS: return "h.%d.ln_1.bias";
    case WEIGHT_KIND_MLP_NORM: return "h.%d.ln_2.weight";
    case WEIGHT_KIND_MLP_NORM_BIAS: return "h.%d.ln_2.bias";
    case WEIGHT_KIND_FINAL_NORM: return "ln_f.weight";
    case WEIGHT_KIND_FINAL_NORM_BIAS: return "ln_f.bias";
    case WEIGHT_KIND_Q:
        *it = (struct hfw_item){.kinds = {WEIGHT_KIND_Q, WEIGHT_KIND_K, WEIGHT_KIND_V}, .n_kinds = 3, .transposed = 1};
        return "h.%d.attn.c_attn.weight";
    case WEIGHT_KIND_Q_BIAS:
        *it = (struct hfw_item){.kinds = {WEIGHT_KIND_Q_BIAS, WEIGHT_KIND_K_BIAS, WEIGHT_KIND_V_BIAS}, .n_kinds = 3};
        return "h.%d.attn.c_attn.bias";
    case WEIGHT_KIND_O: *it = (struct hfw_item){.kinds = {kind}, .n_kinds = 1, .transposed = 1}; return "h.%d.attn.c_proj.weight";
    case WEIGHT_KIND_O_BIAS: return "h.%d.attn.c_proj.bias";
    case WEIGHT_KIND_UP: *it = (struct hfw_item){.kinds = {kind}, .n_kinds = 1, .transposed = 1}; return "h.%d.mlp.c_fc.weight";
    case WEIGHT_KIND_UP_BIAS: return "h.%d.mlp.c_fc.bias";
    case WEIGHT_KIND_DOWN: *it = (struct hfw_item){.kinds = {kind}, .n_kinds = 1, .transposed = 1}; return "h.%d.mlp.c_proj.weight";
    case WEIGHT_KIND_DOWN_BIAS: return "h.%d.mlp.c_proj.bias";
    default: return NULL;
    }
}

enum status checkpoint_write_hf(const char *dir_out, struct checkpoint *src)
{
    const struct model_config *c = &src->cfg;
    if (c->family != MODEL_FAMILY_LLAMA && c->family != MODEL_FAMILY_GEMMA3 && c->family != MODEL_FAMILY_GPT2)
        return status_errorf(STATUS_UNSUPPORTED,
                             "writing the Hugging Face layout is implemented for Llama-family models "
                             "(Llama, Mistral, Gemma 3) and GPT-2, not %s", c->architecture);
    const int gpt2 = c->family == MODEL_FAMILY_GPT2;
    enum status s = ck_out_dir(dir_out, src);
    if (s) return s;
    const int gemma = c->family == MODEL_FAMILY_GEMMA3;
    struct hfw_item *items = calloc((size_t)WEIGHT_KIND_COUNT * (size_t)(c->n_layers + 1), sizeof *items);
    struct safetensors_writer *w = NULL;
    char path[CK_PATH], fmt_name[CK_NAME], name[CK_NAME + 16];
    if (!items) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    if ((s = ck_pathf(path, dir_out, hf_single_name)) || (s = safetensors_writer_begin(path, &w))) goto out;
    int n = 0;
    for (int k = 0; k < WEIGHT_KIND_COUNT; k++) {
        enum weight_kind kind = (enum weight_kind)k;
        if (!weight_kind_exists(c, kind) || (kind == WEIGHT_KIND_LM_HEAD && c->tied_embeddings)) continue;
        int layers = weight_kind_per_layer(kind) ? c->n_layers : 1;
        for (int l = 0; l < layers; l++) {
            struct host_weight hw;
            struct hfw_item g = {0};
            const char *gf = gpt2 ? hfw_gpt2(kind, &g) : NULL;
            if (gpt2 && !gf) continue; /* K, V (and their biases): inside c_attn */
            /* The stored dtype first (describe in f32 reports it), then the real description. */
            if ((s = checkpoint_describe(src, kind, l, 0, 1, DTYPE_F32, &hw))) goto out;
            g.ck = src, g.kind = kind, g.layer = l, g.dtype = hw.stored_dtype;
            items[n] = g;
            if ((s = checkpoint_describe(src, kind, l, 0, 1, hw.stored_dtype, &hw))) goto out;
            int64_t shape[2] = {hw.shape[0], hw.ndim == 2 ? hw.shape[1] : 1};
            for (int i = 1; i < g.n_kinds; i++) { /* c_attn: Q, K and V rows together */
                struct host_weight part;
                if ((s = checkpoint_describe(src, g.kinds[i], l, 0, 1, hw.stored_dtype, &part))) goto out;
                shape[0] += part.shape[0];
            }
            if (g.transposed) hw.shape[0] = shape[1], hw.shape[1] = shape[0];
            else hw.shape[0] = shape[0];
            if (gpt2 && kind != WEIGHT_KIND_LM_HEAD) {
                snprintf(fmt_name, sizeof fmt_name, gf, l);
                snprintf(name, sizeof name, "transformer.%s", fmt_name);
            } else if (kind == WEIGHT_KIND_LM_HEAD) {
                snprintf(name, sizeof name, "lm_head.weight");
            } else {
                const char *f = ck_hf_llama_fmt(gemma, kind);
                CHECK(f, "no HF name for %s", weight_kind_name(kind));
                snprintf(fmt_name, sizeof fmt_name, f, l);
                snprintf(name, sizeof name, "model.%s", fmt_name);
            }
            if ((s = safetensors_writer_add_deferred(w, name, hw.stored_dtype, hw.ndim, hw.shape, hfw_fill, &items[n])))
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
    free(items);
    return s;
}

/* engine/formats/checkpoint_gguf.c - a llama.cpp GGUF file as a checkpoint (checkpoint.h): the
 * config from its metadata (gguf_model_config, the converter's own derivation), the tokenizer
 * proto from its tokenizer.ggml.* keys, and its tensors described as safetensors tensors
 * (struct st_tensor, block-quantized ones with a DTYPE_Q* dtype) so that checkpoint.c locates
 * and slices them by the same code as a directory's. Names are llama.cpp's (weight_names.c's
 * gguf column); Gemma 3's q/k rows are not permuted and its norms already carry the +1
 * (gguf_convert.h), so nothing is rewritten here. Phi-3's fused attn_qkv and ffn_up are
 * described a second time as their row ranges under the unfused names (attn_q, attn_k, attn_v,
 * ffn_gate, ffn_up): views into the same bytes, found before the file's own tensors.
 * Not here: the GGUF reader (gguf.c), slicing and dequantizing on request (checkpoint.c),
 * `convert gguf` (gguf_convert.c).
 * Tests: tests/test_gguf_serve.c (a tiny Gemma 3 GGUF: config, blocks zero-copy, tp slices and
 * the block-cutting refusal, the model with blocks against the dequantized one); test_model
 * gemma-gguf (the real Gemma 3 270M file against its f32 conversion; SKIP without it);
 * golden_gguf_phi3 (the fused views), golden_gguf_olmo2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint_impl.h"
#include "gguf.h"
#include "gguf_convert.h"
#include "gguf_tokenizer.h"

int ck_is_gguf(const char *path)
{
    int fd;
    if (base_open_file(path, &fd, NULL) != STATUS_OK) return 0;
    char magic[4] = {0};
    const int ok = read(fd, magic, 4) == 4 && !memcmp(magic, "GGUF", 4);
    close(fd);
    return ok;
}

/* Tensor t of the file as a safetensors tensor: F32/F16/BF16 as themselves, the block types of
 * kernels/quant.h as DTYPE_Q*, anything else unsupported (refused when a weight needs it). */
static void describe_tensor(const struct gguf_tensor *t, struct st_tensor *out)
{
    memset(out, 0, sizeof *out);
    out->name = t->name;
    snprintf(out->dtype_name, sizeof out->dtype_name, "%s", t->type_name);
    out->ndim = t->n_dims;
    for (int i = 0; i < t->n_dims; i++) out->shape[i] = t->shape[i];
    if (t->n_dims == 3) { /* stacked experts (ffn_*_exps: experts, rows, cols) as one matrix of their rows */
        out->ndim = 2;
        out->shape[0] = t->shape[0] * t->shape[1];
        out->shape[1] = t->shape[2];
    }
    const size_t len = strlen(t->name), sfx = strlen("_exps.bias");
    if (t->n_dims == 2 && len > sfx && !strcmp(t->name + len - sfx, "_exps.bias")) { /* gpt-oss: (experts, rows) as one vector */
        out->ndim = 1;
        out->shape[0] = t->shape[0] * t->shape[1];
    }
    out->numel = t->numel;
    out->nbytes = (size_t)t->nbytes;
    out->file_offset = t->file_offset;
    out->data = t->data;
    const int q = dtype_of_quant_type(t->type);
    out->supported = 1;
    switch (t->type) {
    case GGML_TYPE_F32: out->dtype = DTYPE_F32, out->elem_size = 4; break;
    case GGML_TYPE_F16: out->dtype = DTYPE_F16, out->elem_size = 2; break;
    case GGML_TYPE_BF16: out->dtype = DTYPE_BF16, out->elem_size = 2; break;
    default:
        out->supported = q >= 0;
        if (q >= 0) out->dtype = (enum dtype)q; /* elem_size 0: blocks have none */
    }
}

#define VIEW_NAME 48 /* "blk.%d.ffn_gate.weight" with any int */

/* Rows [r0, r0 + rows) of fused, a matrix: the same bytes from row r0 on (every row of a block
 * type is whole blocks, so a row range is a byte range). */
static void view_rows(const struct st_tensor *fused, const char *name, int64_t r0, int64_t rows, struct st_tensor *out)
{
    const size_t row_bytes = fused->nbytes / (size_t)fused->shape[0];
    *out = *fused;
    out->name = name;
    out->shape[0] = rows;
    out->numel = rows * fused->shape[1];
    out->nbytes = (size_t)rows * row_bytes;
    out->file_offset = fused->file_offset + (uint64_t)r0 * row_bytes;
    out->data = (const unsigned char *)fused->data + (size_t)r0 * row_bytes;
}

/* Phi-3 (convert_hf_to_gguf.py's Phi3MiniModel writes Hugging Face's fused tensors as they are):
 * blk.N.attn_qkv rows [q | k | v] and blk.N.ffn_up rows [gate | up] (llama.cpp's LLM_FFN_SWIGLU
 * takes silu of the first half times the second, as Phi3MLP's chunk(2) does), described as the
 * unfused weights' names after the file's tensors; names written into `names`. */
static enum status add_fused_views(struct checkpoint *ck, char *names)
{
    struct checkpoint_files *cf = ck->files;
    const struct model_config *c = &ck->cfg;
    const int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    const int64_t f = c->ffn_hidden;
    struct st_tensor *v = cf->gguf_tensors + gguf_n_tensors(cf->gguf);
    for (int l = 0; l < c->n_layers; l++) {
        static const char *const parts[5] = {"attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"};
        const int64_t r0[5] = {0, q, q + kv, 0, f}, rows[5] = {q, kv, kv, f, f};
        for (int fi = 0; fi < 2; fi++) {
            char fname[VIEW_NAME];
            snprintf(fname, sizeof fname, fi ? "blk.%d.ffn_up.weight" : "blk.%d.attn_qkv.weight", l);
            const struct gguf_tensor *gt = gguf_find_tensor(cf->gguf, fname);
            const int64_t want = fi ? 2 * f : q + 2 * kv;
            if (!gt)
                return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' is missing", cf->dir, fname);
            if (gt->n_dims != 2 || gt->shape[0] != want || gt->shape[1] != c->d_model)
                return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' has shape (%lld, %lld), expected (%lld, %d)",
                                     cf->dir, fname, (long long)gt->shape[0],
                                     (long long)(gt->n_dims > 1 ? gt->shape[1] : 0), (long long)want, c->d_model);
            const struct st_tensor *fused = &cf->gguf_tensors[gt - gguf_tensor_at(cf->gguf, 0)];
            for (int p = fi ? 3 : 0; p < (fi ? 5 : 3); p++, v++, names += VIEW_NAME) {
                snprintf(names, VIEW_NAME, "blk.%d.%s.weight", l, parts[p]);
                view_rows(fused, names, r0[p], rows[p], v);
            }
        }
    }
    return STATUS_OK;
}

enum status ck_open_gguf(struct checkpoint *ck)
{
    struct checkpoint_files *cf = ck->files;
    enum status s = gguf_open(cf->dir, &cf->gguf);
    if (s) return s;
    /* dtype f32: what a CUDA load would otherwise pick bf16 from; the CPU computes in f32. */
    if ((s = gguf_model_config(cf->gguf, DTYPE_F32, &ck->cfg)) || (s = gguf_check_tensors(cf->gguf, &ck->cfg)))
        return s;
    if ((s = gguf_tokenizer_model_proto(cf->gguf, &ck->tokenizer_proto, &ck->tokenizer_proto_n))) return s;
    ck->tokenizer_digest = base_fnv1a(BASE_FNV1A_BASIS, ck->tokenizer_proto, ck->tokenizer_proto_n);
    const char *tmpl = NULL;
    if (gguf_find_kv(cf->gguf, "tokenizer.chat_template") &&
        (s = gguf_get_str(cf->gguf, "tokenizer.chat_template", &tmpl)))
        return s;
    if (tmpl && !(ck->chat_template = strdup(tmpl))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    const int n = gguf_n_tensors(cf->gguf);
    const int n_views = config_hf_fused(&ck->cfg) ? 5 * ck->cfg.n_layers : 0;
    /* One allocation: the file's tensors, the views, a NULL-named end, then the views' names. */
    const size_t table = ((size_t)n + n_views + 1) * sizeof *cf->gguf_tensors;
    if (!(cf->gguf_tensors = calloc(1, table + (size_t)n_views * VIEW_NAME)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < n; i++) describe_tensor(gguf_tensor_at(cf->gguf, i), &cf->gguf_tensors[i]);
    return n_views ? add_fused_views(ck, (char *)cf->gguf_tensors + table) : STATUS_OK;
}

const struct st_tensor *ck_gguf_find(const struct checkpoint *ck, const char *name)
{
    const struct checkpoint_files *cf = ck->files;
    for (const struct st_tensor *v = cf->gguf_tensors + gguf_n_tensors(cf->gguf); v->name; v++)
        if (!strcmp(v->name, name)) return v; /* a view wins: Phi-3's ffn_up names the up rows */
    const struct gguf_tensor *t = gguf_find_tensor(cf->gguf, name);
    return t ? &cf->gguf_tensors[t - gguf_tensor_at(cf->gguf, 0)] : NULL;
}

void ck_close_gguf(struct checkpoint_files *cf)
{
    free(cf->gguf_tensors);
    gguf_close(cf->gguf);
}

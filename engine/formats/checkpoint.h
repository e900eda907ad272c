/* engine/formats/checkpoint.h - a checkpoint directory as a source of weights, whatever its layout:
 * Hugging Face (model.safetensors, or model.safetensors.index.json + shards; Llama, GPT-2 or
 * Gemma 3 tensor names) or shardlm's Megatron-style sharded layout (mp_rank_TT_PPP/model.safetensors
 * with Megatron-Core tensor names, shardlm_megatron.json). checkpoint_get hands out every weight
 * in ONE canonical layout, already sliced for any runtime (tp_rank, tp_size), straight from the
 * read-only mappings: any checkpoint loads at any tp/pp without a conversion step.
 * checkpoint_write_megatron writes the Megatron-style layout from any source (the `reshard`
 * subcommand).
 *
 * A llama.cpp GGUF file opens the same way (checkpoint_open below), its quantized matrices
 * served as blocks; so do the block tensors of a directory's safetensors files (safetensors.h:
 * U8 tensors named in __metadata__ "shardlm.blocks", written by `convert gguf --keep-blocks` and
 * by both writers), in any of the layouts.
 *
 * Implemented in checkpoint_open.c (opening the three layouts), checkpoint_gguf.c (a GGUF file),
 * checkpoint.c (locating and slicing weights) and checkpoint_write.c (the two writers); every tensor name comes from the
 * one table of weight_names.h, which also defines enum weight_kind.
 * Not here: device memory and model structs (engine/model), config.json fields (config.c), the
 * file format itself (safetensors.c).
 * Tests: tests/test_formats.c (every weight, every tp, from HF, sharded HF and Megatron sources);
 * tests/test_gguf_serve.c and tests/test_keep_blocks.c (blocks from a GGUF, a kept-blocks
 * directory and its Megatron reshard, at tp 1 and 2; the block-cutting refusal).
 *
 * ---- Canonical layout (what checkpoint_get returns) ---------------------------------------
 * Row-major, nn.Linear orientation (out_features, in_features), unfused, HF-Llama-like:
 *   TOK_EMBEDDING, LM_HEAD   (vocab, d_model)
 *   POS_EMBEDDING            (max_positions, d_model)         learned positions (GPT-2) only
 *   *_NORM, *_NORM_BIAS      (d_model)                        biases: LayerNorm only
 *   Q, Q_BIAS                (n_heads * head_dim, d_model), (n_heads * head_dim)
 *   K, V, K_BIAS, V_BIAS     (n_kv_heads * head_dim, d_model), (n_kv_heads * head_dim)
 *   O, O_BIAS                (d_model, n_heads * head_dim), (d_model)
 *   GATE, UP, *_BIAS         (ffn_hidden, d_model), (ffn_hidden)   GATE: gated MLPs only;
 *                                                              GPT-2's c_fc is UP
 *   DOWN, DOWN_BIAS          (d_model, ffn_hidden), (d_model)
 *   Q_NORM, K_NORM           (head_dim)                       qk_norm (Gemma 3) only
 *   POST_ATTN_NORM, POST_MLP_NORM (d_model)                   sandwich_norms (Gemma 3) only
 * Norm weights are returned as stored: config.norm_weight_offset is the loader's to add.
 * HF Gemma 3 names (prefix "model.", or "language_model.model." / "model.language_model." in
 * multimodal checkpoints): input_layernorm = ATTN_NORM, post_attention_layernorm =
 * POST_ATTN_NORM (the norm of the attention output, unlike Llama, where it is the pre-MLP
 * norm), pre_feedforward_layernorm = MLP_NORM, post_feedforward_layernorm = POST_MLP_NORM,
 * self_attn.q_norm / k_norm = Q_NORM / K_NORM; the rest as Llama.
 * Rows of Q and K are in the order the file has them; config.rope_style says how rotary
 * pairs them (HF checkpoints: halves). GPT-2's Conv1D weights (in, out) come transposed, and its
 * fused c_attn split into Q, K, V. LM_HEAD of a model with tied embeddings is the token
 * embedding (same data, same slicing).
 *
 * ---- Tensor-parallel slicing (Megatron partitioning) --------------------------------------
 *   Q, Q_BIAS:        rows of heads [r * n_heads/tp, (r+1) * n_heads/tp)          (column-parallel)
 *   K, V and biases:  n_kv_heads >= tp: heads [r * n_kv/tp, (r+1) * n_kv/tp);
 *                     n_kv_heads <  tp (tp % n_kv == 0): the one head r * n_kv / tp, replicated
 *                     on tp / n_kv ranks, the group that rank r's query heads belong to
 *   GATE, UP, biases: rows [r * ffn/tp, (r+1) * ffn/tp)                             (column-parallel)
 *   O, DOWN:          columns (input features) split the same way                (row-parallel)
 *   TOK_EMBEDDING, LM_HEAD: vocab rows [r * c, (r+1) * c), c = ceil(vocab / tp) (vocab-parallel);
 *                     rows past the vocabulary are zero padding (row_valid says how many are
 *                     real); padded logits must be masked by the caller
 *   norms (Q_NORM, K_NORM and the post norms too), O_BIAS, DOWN_BIAS, POS_EMBEDDING: replicated (row-parallel biases are added once,
 *                     after the all-reduce)
 * Requirements: tp divides n_heads and ffn_hidden; tp divides n_kv_heads or n_kv_heads divides
 * tp. Otherwise STATUS_UNSUPPORTED naming the numbers.
 *
 * ---- Megatron-style layout (written by checkpoint_write_megatron, read by checkpoint_open) --
 *   DIR/config.json                       the model config (config_save)
 *   DIR/shardlm_megatron.json             {"format": "shardlm-megatron", "version": 1,
 *                                          "tp_size": T, "pp_size": P, "n_layers": L,
 *                                          "layers_per_stage": [L_0, ..., L_{P-1}],
 *                                          "vocab_size": V, "padded_vocab_size": Vp,
 *                                          "tensor_names": "megatron-core-local",
 *                                          "qkv_layout": "megatron-core-grouped",
 *                                          "fc1_layout": "gate-up-per-rank"}
 *                                         written last: a directory without it is incomplete
 *   DIR/mp_rank_TT_PPP/model.safetensors  tp rank TT (2 digits), pp stage PPP (3 digits); always
 *                                         this form (the reader also takes mp_rank_TT when P = 1)
 *   DIR/tokenizer.model etc.              copied from the source when present
 * Stage s holds layers first_s .. first_s + L_s - 1 (contiguous; checkpoint_pp_layers), named
 * with their LOCAL index n = layer - first_s, Megatron-Core local-spec names:
 *   embedding.word_embeddings.weight        stage 0; (Vp/T, d) rows [t*Vp/T, ...) of the vocab
 *                                           padded with zero rows to Vp = ceil(V/T)*T
 *   embedding.position_embeddings.weight    stage 0; (max_positions, d); learned positions only
 *   decoder.layers.n.input_layernorm.weight / .bias          (d) replicated on every tp rank
 *   decoder.layers.n.self_attention.linear_qkv.weight / .bias
 *       ((n_kv/T) * (n_heads/n_kv + 2) * head_dim, d): for each of the rank's n_kv/T query
 *       groups g (global group t*n_kv/T + g), the rows of its n_heads/n_kv query heads, then
 *       its key head, then its value head (Megatron-Core's linear_qkv layout for GQA:
 *       view as [groups, q_per_group + 2, head_dim, d]); needs T | n_kv_heads
 *   decoder.layers.n.self_attention.q_layernorm.weight / k_layernorm.weight   (head_dim)
 *       replicated; qk_norm only (Megatron-Core's names)
 *   decoder.layers.n.self_attention.linear_proj.weight      (d, n_heads*head_dim/T) input columns
 *   decoder.layers.n.self_attention.linear_proj.bias        (d) full, replicated
 *   decoder.layers.n.post_self_attn_layernorm.weight        (d) replicated; sandwich_norms only
 *       (shardlm's name: Megatron-Core's local spec has no post-attention norm)
 *   decoder.layers.n.pre_mlp_layernorm.weight / .bias
 *   decoder.layers.n.mlp.linear_fc1.weight / .bias          gated: (2*ffn/T, d) = [gate rows of
 *       rank t; up rows of rank t] (Megatron's per-rank [gate; up] stacking); else (ffn/T, d)
 *   decoder.layers.n.mlp.linear_fc2.weight                  (d, ffn/T) input columns
 *   decoder.layers.n.mlp.linear_fc2.bias                    (d) full, replicated
 *   decoder.layers.n.post_mlp_layernorm.weight              (d) replicated; sandwich_norms only
 *       (shardlm's name, as above)
 *   decoder.final_layernorm.weight / .bias                  last stage
 *   output_layer.weight                                     last stage, (Vp/T, d); absent when
 *                                                           the embeddings are tied
 * The reader also accepts Transformer-Engine-style norm names
 * (self_attention.linear_qkv.layer_norm_weight / _bias, mlp.linear_fc1.layer_norm_weight / _bias).
 * Each tensor is stored in the dtype its source had (blocks as block tensors: safetensors.h). */
#ifndef SHARDLM_CHECKPOINT_H
#define SHARDLM_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "config.h"
#include "tensor.h"
#include "weight_names.h"

#ifdef __cplusplus
extern "C" {
#endif

enum checkpoint_layout {
    CHECKPOINT_LAYOUT_HF,          /* model.safetensors */
    CHECKPOINT_LAYOUT_HF_SHARDED,  /* model.safetensors.index.json + shards */
    CHECKPOINT_LAYOUT_MEGATRON,    /* shardlm_megatron.json + mp_rank_TT_PPP/ */
    CHECKPOINT_LAYOUT_GGUF,        /* one llama.cpp .gguf file (checkpoint_gguf.c) */
};

struct checkpoint_files; /* private */

/* An open checkpoint. Public fields are read-only for callers. Not thread-safe for open/close;
 * checkpoint_get may run on several threads at once (it only reads). */
/* Produces the whole canonical tensor of (kind, layer) as f32 into dst (n elements): a source
 * that replaces the files' data (checkpoint_set_source). */
typedef enum status (*checkpoint_source_fn)(void *ctx, enum weight_kind kind, int layer, float *dst,
                                            int64_t n);

struct checkpoint {
    struct model_config     cfg;     /* from DIR/config.json */
    enum checkpoint_layout  layout;
    int                     saved_tp, saved_pp; /* Megatron layout: as saved; 1, 1 otherwise */
    struct checkpoint_files *files;
    checkpoint_source_fn    source;  /* NULL: the files; see checkpoint_set_source */
    void                   *source_ctx;
    /* GGUF: the SentencePiece ModelProto built from the tokenizer metadata (owned; load it with
     * tokenizer_load_from_memory). NULL for directories, which hold a tokenizer.model. */
    void                   *tokenizer_proto;
    size_t                  tokenizer_proto_n;
    /* FNV-1a 64 of those bytes (0 for directories): what draft_load compares, still there once
     * generate_load_tokenizer has released the bytes (about 8 MB for a 262,144-piece
     * vocabulary) after building the tokenizer from them. */
    uint64_t                tokenizer_digest;
    /* The model's own Jinja chat template (owned), or NULL: a GGUF's tokenizer.chat_template;
     * a directory's chat_template.jinja, else tokenizer_config.json's "chat_template" (a string,
     * or the one named "default" of a list). */
    char                   *chat_template;
};

/* Makes checkpoint_get (and so both writers) take every tensor's values from fn instead of the
 * files, sliced and converted as usual; shapes, the stored dtype and the extras (config.json,
 * tokenizer files) stay the checkpoint's. The trainer saves a model this way: the same writers
 * as reshard, fed from memory. fn = NULL restores the files. Nothing is served zero-copy while
 * a source is set. */
void checkpoint_set_source(struct checkpoint *ck, checkpoint_source_fn fn, void *ctx);

/* Opens the checkpoint directory dir: config.json (config_load), then the weights, preferring
 * shardlm_megatron.json, then model.safetensors, then model.safetensors.index.json. Every file
 * is mapped once, read-only. Every weight the config implies is located and its shape and
 * dtype checked here, so that a later checkpoint_get cannot fail on the format. Errors:
 * STATUS_NOT_FOUND (no config.json, no weights, a shard or rank folder missing),
 * STATUS_BAD_FORMAT (a tensor missing or of the wrong shape: the message names the tensor, the
 * file, and expected and found shapes), STATUS_UNSUPPORTED (a dtype shardlm does not load, a
 * newer metadata version). On success *out owns the mappings; checkpoint_close frees. */
enum status checkpoint_open(const char *dir, struct checkpoint **out);
/* dir may also be a llama.cpp GGUF file (a regular file whose first bytes are "GGUF"): then the
 * config comes from its metadata (gguf_model_config: Gemma 3 only, for now), the tokenizer from
 * its tokenizer.ggml.* keys (tokenizer_proto), and the weights from the mapped file under
 * their llama.cpp names (weight_names.c). F32/F16/BF16 tensors behave as safetensors ones.
 * Block-quantized tensors (Q4_0 ... Q6_K) have stored_dtype DTYPE_Q*: requested in a float
 * dtype they are dequantized (bit-exact with ggml); requested in their own DTYPE_Q* they are
 * handed out as blocks, zero-copy when the slice is whole rows (tp slices of Q, K, V, gate,
 * up, the vocabulary), else copied block by block (the column slices of O and DOWN). A slice
 * that would cut a block (a tp column split not a multiple of the block size) is
 * STATUS_UNSUPPORTED naming the weight; other tensor types are STATUS_UNSUPPORTED at open.
 * Block tensors of a directory behave the same, the Megatron layout's parts included (a column
 * split across parts is copied block by block); every part of one weight must have the same
 * block type, and a transposed (GPT-2 Conv1D) weight cannot be blocks (STATUS_BAD_FORMAT at
 * open). */
/* Unmaps everything; accepts NULL. Zero-copy pointers handed out die here. */
void        checkpoint_close(struct checkpoint *ck);
/* Once the model and its tokenizer are loaded: a GGUF file's metadata pages are given back
 * (gguf_release_pages), with data_too the whole file's. Other layouts: nothing. */
void        checkpoint_release_pages(struct checkpoint *ck, int data_too);

/* Contiguous layer ranges of a pipeline split, used by the writer and for loading: stage
 * pp_rank of pp_size gets *count layers from *first; earlier stages take one more layer each
 * when pp_size does not divide n_layers. */
void checkpoint_pp_layers(int n_layers, int pp_size, int pp_rank, int *first, int *count);

/* A weight slice in host memory. */
struct host_weight {
    const void *data;         /* the slice, row-major: into the checkpoint's mapping when
                                 zero_copy (valid until checkpoint_close), else the caller's buf;
                                 NULL from checkpoint_describe when not zero_copy */
    enum dtype  dtype;        /* the requested dtype */
    enum dtype  stored_dtype; /* the dtype in the file (a DTYPE_Q* for blocks) */
    int         ndim;         /* 1 or 2 */
    int64_t     shape[2];     /* of the slice (shape[1] unused when ndim == 1) */
    size_t      nbytes;
    int64_t     row_start;    /* first canonical row of the slice (vocab_start for embeddings) */
    int64_t     col_start;    /* first canonical column (row-parallel O / DOWN) */
    int64_t     rows_valid;   /* rows of real data; the rest (vocab padding) are zero */
    int         zero_copy;    /* 1: data points into the read-only mapping */
};

/* Flags of checkpoint_get. */
#define CHECKPOINT_GET_ZERO_COPY_OK 1u /* may return a pointer into the mapping instead of copying */

/* Describes the slice of weight `kind` of global layer `layer` (ignored for kinds that are not
 * per layer) for tensor rank tp_rank of tp_size, in `dtype`: shape, bytes, and whether it can be
 * served zero-copy (no conversion, one contiguous run in one file, aligned to the element
 * size; data is then set). dtype is a float dtype, or the weight's own stored DTYPE_Q* (blocks
 * as stored; nbytes is then rows * quant_row_bytes(cols)). STATUS_INVALID_ARGUMENT for a weight
 * the model lacks, a layer or rank out of range, an integer dtype or a block dtype the weight
 * is not stored in; STATUS_UNSUPPORTED for a tp_size that does not partition the model or
 * that would cut a block. */
enum status checkpoint_describe(struct checkpoint *ck, enum weight_kind kind, int layer,
                                int tp_rank, int tp_size, enum dtype dtype,
                                struct host_weight *out);

/* Produces that slice. With CHECKPOINT_GET_ZERO_COPY_OK and a zero-copy slice, out->data points
 * into the mapping and buf is not touched (it may be NULL); otherwise the slice is gathered,
 * converted (round to nearest even) and written to buf, which must hold out->nbytes bytes
 * (buf_size, else STATUS_INVALID_ARGUMENT) and be aligned to dtype_size(dtype). The bytes are
 * identical whatever the source layout. */
enum status checkpoint_get(struct checkpoint *ck, enum weight_kind kind, int layer, int tp_rank,
                           int tp_size, enum dtype dtype, void *buf, size_t buf_size,
                           unsigned flags, struct host_weight *out);

/* Writes the Megatron-style layout (see the top of this file) of src into dir_out at tensor
 * parallel size tp_size and pipeline size pp_size: each tensor in its source dtype, one
 * tensor in memory at a time, every file atomically; config.json, tokenizer files (a GGUF
 * source: tokenizer.model from its metadata), and shardlm_megatron.json last. dir_out is created
 * if missing and should be empty (stale rank folders of an earlier, larger split are not
 * removed); it must not be src's directory.
 * Blocks (a GGUF source, a kept-blocks directory) stay blocks, split on block boundaries, with
 * two exceptions: a fused tensor (linear_qkv, linear_fc1) whose weights have different block
 * types is written dequantized in f32 (exact; logged), and with a memory source
 * (checkpoint_set_source) every block weight is written in the config's float dtype.
 * STATUS_UNSUPPORTED when tp_size does not divide n_heads, n_kv_heads (Megatron-Core's
 * requirement) or ffn_hidden, pp_size exceeds n_layers, or a split would cut a weight's blocks
 * (checked before anything is written); STATUS_IO on file errors. */
enum status checkpoint_write_megatron(const char *dir_out, struct checkpoint *src, int tp_size,
                                      int pp_size);

/* Writes src as a Hugging Face-layout directory (one model.safetensors with HF tensor names,
 * every tensor in its source dtype, blocks as blocks (in the config's float dtype from a memory
 * source), joined from whatever layout src has; config.json and the tokenizer files): the
 * inverse of reading. Llama-family models (Llama, Mistral, Gemma 3:
 * "model." names) and GPT-2 ("transformer." names, Q/K/V fused into c_attn and the Conv1D
 * weights transposed back); others are STATUS_UNSUPPORTED. Same directory rules as
 * checkpoint_write_megatron. */
enum status checkpoint_write_hf(const char *dir_out, struct checkpoint *src);

#ifdef __cplusplus
}
#endif

#endif

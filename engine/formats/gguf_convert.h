/* engine/formats/gguf_convert.h - import of a llama.cpp GGUF file into a Hugging Face-layout directory
 * that every other path of shardlm loads (checkpoint.h). general.architecture llama, qwen2, qwen3,
 * phi3, olmo2, gemma2 and gemma3, as llama.cpp's convert_hf_to_gguf.py writes them.
 * Not here: reading GGUF itself or dequantizing (gguf.h), checkpoint layouts (checkpoint.c).
 * Tests: tests/test_keep_blocks.c (gguf-py fixtures, --keep-blocks); golden_gemma3 and
 * gemma3_gguf_keep_blocks on gemma-3-270m-q4_k_m.gguf when fetched (docs/models.md);
 * golden_gguf_<arch> and golden_gguf_{llama3_rope,phi3,olmo2}_converted (gguf-py files written
 * from random Hugging Face checkpoints by tests/reference/hf_to_gguf.py, float64 references). */
#ifndef SHARDLM_GGUF_CONVERT_H
#define SHARDLM_GGUF_CONVERT_H

#include "base.h"
#include "tensor.h"
#include "weight_names.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes into out_dir (created if missing):
 *   model.safetensors  every tensor dequantized to out_dtype (DTYPE_F32 or DTYPE_BF16), renamed
 *                      from llama.cpp's names (token_embd, blk.N.attn_q, ...) to Hugging Face's
 *                      (model.embed_tokens, model.layers.N.self_attn.q_proj, ...), shapes as
 *                      (out_features, in_features); one tensor in memory at a time (the f32
 *                      token embedding of a 262k vocabulary is the largest: vocab x d_model x 4
 *                      bytes). phi3's fused blk.N.attn_qkv ([q | k | v] rows) and blk.N.ffn_up
 *                      ([gate | up]) become Phi3ForCausalLM's fused self_attn.qkv_proj and
 *                      mlp.gate_up_proj, rows as they are; olmo2's post_attention_norm and
 *                      post_ffw_norm its post_attention_layernorm / post_feedforward_layernorm.
 *   tokenizer.model    the SentencePiece ModelProto built from tokenizer.ggml.* (gguf.h), or
 *   tokenizer.json     for a gpt2 (byte-level BPE) vocabulary
 *   config.json        the architecture's Hugging Face config from the <arch>.* metadata,
 *                      written last (a directory without it does not open); Gemma: the shardlm
 *                      extra "norm_weight_offset": 0 since llama.cpp's converter has already
 *                      added Gemma's +1 to every norm weight; rotary factor tensors as
 *                      rope_scaling (rope_freqs: shardlm's "factors"; phi3's rope_factors_short
 *                      / _long: "longrope" with the context capped at the original length).
 * Rotation: llama's q and k rows were permuted by llama.cpp's converter, so shardlm rotates
 * adjacent pairs over them as they are; qwen2, qwen3, phi3, olmo2 and Gemma rotate halves (rope
 * type NEOX) with Hugging Face's row order, which their converters keep.
 * keep_blocks: every matrix (2-D tensor) stored in one of the block types of kernels/quant.h
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) is written as a block tensor instead
 * (safetensors.h: U8 [rows, row bytes], named in __metadata__ "shardlm.blocks"), its bytes
 * those of the file: no tensor is permuted or transformed, so none needs dequantizing. Vectors
 * and F32/F16/BF16 tensors are still written in out_dtype. The directory then serves, reshards
 * and tp-splits with its blocks, as the GGUF does (checkpoint.h).
 * Errors: those of gguf_open; STATUS_UNSUPPORTED for another architecture, a metadata key that
 * asks for a feature not modelled (experts, YaRN, OLMo 3's windows, ...: named), a tensor shardlm
 * cannot dequantize or that is no weight of the model (named, gguf_check_tensors);
 * STATUS_BAD_FORMAT for missing metadata or a tensor missing or of the wrong shape (named);
 * STATUS_INVALID_ARGUMENT for an out_dtype other than f32 / bf16 / f16; STATUS_IO. */
enum status gguf_convert(const char *gguf_path, const char *out_dir, enum dtype out_dtype, int keep_blocks);

struct gguf;
struct model_config;
/* The model config that g's metadata describes (what convert writes as config.json, and what
 * checkpoint_open serves a GGUF file with), dtype as given: LlamaForCausalLM (rope pairs),
 * Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, Olmo2ForCausalLM, and the mixtures
 * MixtralForCausalLM (llama with expert_count), Qwen2MoeForCausalLM (qwen2moe),
 * Qwen3MoeForCausalLM (qwen3moe) and OlmoeForCausalLM (olmoe) (rope halves but Mixtral),
 * Gemma2ForCausalLM / Gemma3ForCausalLM (rope halves, norm_weight_offset 0). Errors:
 * STATUS_UNSUPPORTED for another architecture or a feature not modelled; STATUS_BAD_FORMAT for
 * missing or out-of-range metadata (named). */
enum status gguf_model_config(const struct gguf *g, enum dtype dtype, struct model_config *c);

/* STATUS_UNSUPPORTED naming the first tensor of g that is no weight of c (as gguf_model_config
 * derived it from g) and whose values c does not carry (rope_freqs, rope_factors_short / _long):
 * a feature shardlm does not model is refused, not ignored. Missing tensors are not looked for
 * here (the loaders name them). */
enum status gguf_check_tensors(const struct gguf *g, const struct model_config *c);

/* The llama.cpp name pattern (one %d: the layer) of weight `kind` of layer `layer` in a GGUF file
 * of model c: weight_names.c's gguf column, except the shared experts of Qwen 2 MoE and GLM-4.5,
 * whose gated MLP (shardlm's dense MLP weights) llama.cpp names ffn_gate_shexp, ffn_up_shexp and
 * ffn_down_shexp on the sparse layers (GLM's dense first layers keep ffn_gate ...), and the pre-MLP
 * norm of gpt-oss and glm4moe (post_attention_norm). NULL when the weight has no GGUF name. Phi-3's
 * fused tensors are the loaders' own business. */
const char *gguf_weight_pattern(const struct model_config *c, enum weight_kind kind, int layer);

#ifdef __cplusplus
}
#endif

#endif

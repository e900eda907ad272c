/* engine/formats/gguf_convert.c - GGUF (llama.cpp) import into a Hugging Face-layout directory (see
 * gguf_convert.h). The model's meaning comes from llama.cpp's loaders and graphs (llama, qwen2,
 * qwen3, phi3, olmo2, gemma2, gemma3) and its convert_hf_to_gguf.py, inverted here; the tensor
 * names of both sides come from the one table (weight_names.c: its gguf and hf columns).
 * gguf_model_config is also what checkpoint_gguf.c serves a GGUF file with.
 * Not here: reading GGUF (gguf.c, gguf_tensor.c), the tokenizer proto (gguf_tokenizer.c).
 * Tests: tests/test_keep_blocks.c (--keep-blocks on gguf-py fixtures: bytes, logits, reshard);
 * golden_gemma3 (the f32 conversion of gemma-3-270m-q4_k_m.gguf) and gemma3_gguf_keep_blocks
 * (its kept-blocks conversion) when that file is fetched; golden_gguf_* (gguf-py files of every
 * architecture, served and converted, against float64 references). */
#include "gguf_convert.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "gguf.h"
#include "gguf_tokenizer.h"
#include "safetensors.h"
#include "weight_names.h"

#define GC_PATH 4096

/* One output tensor, produced during safetensors_writer_finish. */
struct gc_item {
    const struct gguf        *g;
    const struct gguf_tensor *t;
    enum dtype                dtype; /* a float dtype, or the tensor's own block dtype (kept) */
};

static enum status gc_fill(void *ctx, void *dst, size_t nbytes)
{
    const struct gc_item *it = ctx;
    const struct gguf_tensor *t = it->t;
    if (dtype_is_quant(it->dtype)) { /* kept: the file's bytes, row for row */
        CHECK(nbytes == t->nbytes, "tensor %s: %zu bytes of blocks, the file has %llu", t->name, nbytes,
              (unsigned long long)t->nbytes);
        memcpy(dst, t->data, nbytes);
        return STATUS_OK;
    }
    CHECK(nbytes == (size_t)t->numel * dtype_size(it->dtype), "tensor %s: %zu bytes", t->name, nbytes);
    if (it->dtype == DTYPE_F32) return gguf_tensor_read_f32(it->g, t, dst);
    if (it->dtype == DTYPE_BF16 && t->n_dims > 1) return gguf_tensor_read_rows_bf16(it->g, t, 0, t->shape[0], dst);
    /* Half precision through f32, about 4 MB of rows at a time; a vector whole (it may be one
     * quantized block row, which read_rows cannot split). */
    const int64_t rows = t->n_dims > 1 ? t->shape[0] : 1, per = rows ? t->numel / rows : 0;
    int64_t step = t->n_dims > 1 && per ? ((int64_t)1 << 20) / per : rows;
    if (step < 1) step = 1;
    if (step > rows) step = rows;
    float *tmp = malloc((size_t)(step * per > 0 ? step * per : 1) * sizeof *tmp);
    if (!tmp) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory for %s", t->name);
    enum status s = STATUS_OK;
    for (int64_t r0 = 0; !s && r0 < rows; r0 += step) {
        const int64_t n = rows - r0 < step ? rows - r0 : step;
        s = t->n_dims > 1 ? gguf_tensor_read_rows_f32(it->g, t, r0, n, tmp) : gguf_tensor_read_f32(it->g, t, tmp);
        if (!s) dtype_convert((uint16_t *)dst + r0 * per, it->dtype, tmp, DTYPE_F32, (size_t)(n * per));
    }
    free(tmp);
    return s;
}

/* An integer key that must be present and within 1..INT32_MAX. */
static enum status gc_int(const struct gguf *g, const char *key, int *out)
{
    int64_t v;
    enum status s = gguf_get_int(g, key, &v);
    if (s == STATUS_NOT_FOUND)
        return status_errorf(STATUS_BAD_FORMAT, "%s: no metadata key '%s'", gguf_path(g), key);
    if (s) return s;
    if (v < 1 || v > (1 << 30))
        return status_errorf(STATUS_BAD_FORMAT, "%s: %s = %lld is out of range", gguf_path(g), key,
                             (long long)v);
    *out = (int)v;
    return STATUS_OK;
}

static enum status gc_int_or(const struct gguf *g, const char *key, int dflt, int *out)
{
    if (!gguf_find_kv(g, key)) {
        *out = dflt;
        return STATUS_OK;
    }
    return gc_int(g, key, out);
}

static enum status gc_float_or(const struct gguf *g, const char *key, double dflt, float *out)
{
    double v = dflt;
    if (gguf_find_kv(g, key)) {
        enum status s = gguf_get_float(g, key, &v);
        if (s) return s;
    }
    if (!isfinite(v) || !(v > 0.0))
        return status_errorf(STATUS_BAD_FORMAT, "%s: %s = %g must be positive", gguf_path(g), key, v);
    *out = (float)v;
    return STATUS_OK;
}

/* A token id key, -1 when absent. */
static enum status gc_token_id(const struct gguf *g, const char *key, int vocab, int *out)
{
    int64_t v = -1;
    if (gguf_find_kv(g, key)) {
        enum status s = gguf_get_int(g, key, &v);
        if (s) return s;
        if (v < 0 || v >= vocab)
            return status_errorf(STATUS_BAD_FORMAT, "%s: %s = %lld is outside the vocabulary (%d)",
                                 gguf_path(g), key, (long long)v, vocab);
    }
    *out = (int)v;
    return STATUS_OK;
}

/* The vocabulary and the special ids, from the tokenizer's metadata (every architecture). */
static enum status gc_vocab(const struct gguf *g, struct model_config *c)
{
    enum status s;
    const struct gguf_kv *tokens;
    if ((s = gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens))) return s;
    if (tokens->n < 1 || tokens->n > (1u << 30))
        return status_errorf(STATUS_BAD_FORMAT, "%s: %llu tokens", gguf_path(g), (unsigned long long)tokens->n);
    c->vocab_size = (int)tokens->n;
    if ((s = gc_token_id(g, "tokenizer.ggml.bos_token_id", c->vocab_size, &c->bos_id)) ||
        (s = gc_token_id(g, "tokenizer.ggml.eos_token_id", c->vocab_size, &c->eos_id)))
        return s;
    return STATUS_OK;
}

/* A llama-family GGUF's rotary scaling: the rope_freqs tensor (llama.cpp writes Llama 3's scaling
 * as these per-pair divisors), or rope.scaling.type linear with rope.scaling.factor; the other
 * types (yarn: llama.cpp's own parameterisation) are refused by name. */
static enum status gguf_rope_scaling(const struct gguf *g, const char *arch, const char *path, struct model_config *c)
{
    char key[96];
    const char *type = NULL;
    enum status s;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (gguf_find_kv(g, key) && (s = gguf_get_str(g, key, &type))) return s;
    const struct gguf_tensor *t = gguf_find_tensor(g, "rope_freqs.weight");
    c->rope_scaling.attention_factor = 1.0f;
    c->rope_scaling.factor = 1.0f;
    if (t) {
        const int half = c->rot_dim / 2;
        if (t->numel != half || half > ROPE_MAX_FACTORS)
            return status_errorf(STATUS_BAD_FORMAT, "%s: tensor 'rope_freqs.weight' has %lld values, rope.dimension_count "
                                 "/ 2 = %d", path, (long long)t->numel, half);
        if ((s = gguf_tensor_read_f32(g, t, c->rope_scaling.factors))) return s;
        for (int i = 0; i < half; i++)
            if (!(c->rope_scaling.factors[i] > 0.0f) || !isfinite(c->rope_scaling.factors[i]))
                return status_errorf(STATUS_BAD_FORMAT, "%s: rope_freqs.weight[%d] = %g must be positive", path, i,
                                     (double)c->rope_scaling.factors[i]);
        c->rope_scaling.kind = ROPE_SCALING_FACTORS;
        if (type && strcmp(type, "none") && strcmp(type, "linear"))
            return status_errorf(STATUS_UNSUPPORTED, "%s: %s \"%s\" with rope_freqs.weight is not supported", path, key,
                                 type);
        return STATUS_OK;
    }
    if (!type || !strcmp(type, "none")) return STATUS_OK;
    if (strcmp(type, "linear"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: %s \"%s\" is not supported (none, linear, and Llama 3's "
                             "rope_freqs tensor are)", path, key, type);
    double f = 1.0;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
    if ((s = gguf_get_float(g, key, &f))) return s;
    if (!(f >= 1.0)) return status_errorf(STATUS_BAD_FORMAT, "%s: %s = %g must be >= 1", path, key, f);
    c->rope_scaling.kind = f > 1.0 ? ROPE_SCALING_LINEAR : ROPE_SCALING_NONE;
    c->rope_scaling.factor = (float)f;
    return STATUS_OK;
}

/* gpt-oss beyond the llama keys (convert_hf_to_gguf.py's GptOssModel): attention.sliding_window
 * (required) on the layers that attention.sliding_window_pattern (default 2, llama.cpp's
 * load_swa_pattern) does not make global, YaRN on every layer (rope.scaling.type yarn, factor,
 * original_context_length, optional yarn_beta_fast / _slow, 32 and 1), the clamped SwiGLU, sinks and
 * the experts' biases. The file has no truncate key: the ramp is left untruncated, as the model's
 * config.json says (truncate false) and transformers computes; llama.cpp truncates (docs/models.md). */
static enum status gguf_gpt_oss(const struct gguf *g, const char *path, struct model_config *c)
{
    enum status s;
    struct rope_scaling *rs = &c->rope_scaling;
    const char *type = NULL;
    int orig = 0;
    if ((s = gc_int(g, "gpt-oss.attention.sliding_window", &c->sliding_window)) ||
        (s = gc_int_or(g, "gpt-oss.attention.sliding_window_pattern", 2, &c->sliding_window_pattern)) ||
        (gguf_find_kv(g, "gpt-oss.rope.scaling.type") && (s = gguf_get_str(g, "gpt-oss.rope.scaling.type", &type))))
        return s;
    c->activation = ACTIVATION_SWIGLU_OAI;
    c->attn_sinks = c->moe_bias = 1;
    c->ffn_hidden = c->moe_ffn; /* no dense MLP: config.json's one intermediate_size is the experts' */
    *rs = (struct rope_scaling){.kind = ROPE_SCALING_NONE, .factor = 1.0f, .attention_factor = 1.0f};
    if (!type || !strcmp(type, "none")) return STATUS_OK;
    if (strcmp(type, "yarn"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: gpt-oss.rope.scaling.type \"%s\" is not supported (yarn, none)",
                             path, type);
    static const char *const unmodelled[] = {"gpt-oss.rope.scaling.yarn_ext_factor", "gpt-oss.rope.scaling.yarn_attn_factor",
                                             "gpt-oss.rope.scaling.yarn_log_multiplier"};
    for (size_t i = 0; i < sizeof unmodelled / sizeof *unmodelled; i++)
        if (gguf_find_kv(g, unmodelled[i]))
            return status_errorf(STATUS_UNSUPPORTED, "%s: metadata key '%s' is not supported (YaRN's attention factor is "
                                 "0.1 ln(factor) + 1, its ramp transformers')", path, unmodelled[i]);
    if ((s = gc_float_or(g, "gpt-oss.rope.scaling.factor", 1.0, &rs->factor)) ||
        (s = gc_int(g, "gpt-oss.rope.scaling.original_context_length", &orig)) ||
        (s = gc_float_or(g, "gpt-oss.rope.scaling.yarn_beta_fast", 32.0, &rs->beta_fast)) ||
        (s = gc_float_or(g, "gpt-oss.rope.scaling.yarn_beta_slow", 1.0, &rs->beta_slow)))
        return s;
    if (!(rs->factor >= 1.0f) || orig <= 0 || !(rs->beta_fast > rs->beta_slow && rs->beta_slow > 0.0f))
        return status_errorf(STATUS_BAD_FORMAT, "%s: gpt-oss YaRN: factor %g (>= 1), original_context_length %d (> 0), "
                             "beta_fast %g > beta_slow %g > 0", path, (double)rs->factor, orig, (double)rs->beta_fast,
                             (double)rs->beta_slow);
    rs->kind = ROPE_SCALING_YARN;
    rs->original_max_positions = orig;
    rs->untruncated = 1;
    rs->attention_factor = (float)(0.1 * log((double)rs->factor) + 1.0);
    return STATUS_OK;
}

/* A vector tensor of rot_dim / 2 positive rotary factors into out. */
static enum status gc_rope_factors(const struct gguf *g, const struct gguf_tensor *t, const struct model_config *c,
                                   float *out)
{
    const int half = c->rot_dim / 2;
    if (t->n_dims != 1 || t->numel != half || half > ROPE_MAX_FACTORS)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' has %lld values, rope.dimension_count / 2 = %d",
                             gguf_path(g), t->name, (long long)t->numel, half);
    enum status s = gguf_tensor_read_f32(g, t, out);
    for (int i = 0; !s && i < half; i++)
        if (!(out[i] > 0.0f) || !isfinite(out[i]))
            return status_errorf(STATUS_BAD_FORMAT, "%s: %s[%d] = %g must be positive", gguf_path(g), t->name, i,
                                 (double)out[i]);
    return s;
}

/* Phi-3's LongRoPE as convert_hf_to_gguf.py (Phi3MiniModel) writes it: tensors
 * rope_factors_short.weight and rope_factors_long.weight (rot_dim / 2 each), keys
 * phi3.rope.scaling.attn_factor (the cos / sin scale) and phi3.rope.scaling.original_context_length.
 * Read as a Hugging Face Phi-3's longrope is (config.c): the short factors, the context capped at
 * the original length (llama.cpp switches to the long factors past it, which a KV cache filled
 * with short-factor keys cannot follow exactly). No factor tensors: no scaling. */
static enum status gguf_phi3_longrope(const struct gguf *g, const char *path, struct model_config *c)
{
    enum status s;
    const char *type = NULL;
    if (gguf_find_kv(g, "phi3.rope.scaling.type") && (s = gguf_get_str(g, "phi3.rope.scaling.type", &type))) return s;
    if (type && strcmp(type, "none"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: phi3.rope.scaling.type \"%s\" is not supported (Phi-3's "
                             "LongRoPE comes as rope_factors_short / _long tensors)", path, type);
    if (gguf_find_tensor(g, "rope_freqs.weight"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: tensor 'rope_freqs.weight' is not part of a phi3 model", path);
    const struct gguf_tensor *ts = gguf_find_tensor(g, "rope_factors_short.weight");
    const struct gguf_tensor *tl = gguf_find_tensor(g, "rope_factors_long.weight");
    struct rope_scaling *r = &c->rope_scaling;
    *r = (struct rope_scaling){.kind = ROPE_SCALING_NONE, .factor = 1.0f, .attention_factor = 1.0f};
    if (!ts && !tl) return STATUS_OK;
    if (!ts || !tl)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor 'rope_factors_%s.weight' without 'rope_factors_%s.weight'",
                             path, ts ? "short" : "long", ts ? "long" : "short");
    int orig = c->max_positions;
    if ((s = gc_rope_factors(g, ts, c, r->factors)) || (s = gc_rope_factors(g, tl, c, r->long_factors)) ||
        (s = gc_int_or(g, "phi3.rope.scaling.original_context_length", c->max_positions, &orig)))
        return s;
    const double scale = (double)c->max_positions / orig; /* transformers' and the converter's default */
    double af = scale <= 1.0 ? 1.0 : sqrt(1.0 + log(scale) / log((double)orig));
    if (gguf_find_kv(g, "phi3.rope.scaling.attn_factor") &&
        (s = gguf_get_float(g, "phi3.rope.scaling.attn_factor", &af)))
        return s;
    if (!(af > 0.0) || !isfinite(af))
        return status_errorf(STATUS_BAD_FORMAT, "%s: phi3.rope.scaling.attn_factor = %g must be positive", path, af);
    r->kind = ROPE_SCALING_LONGROPE;
    r->original_max_positions = orig;
    r->attention_factor = (float)af;
    if (c->max_positions > orig) {
        LOG_WARN("gguf_convert", "%s: LongRoPE: the context is capped at original_context_length %d (of %d): past "
                 "it the whole sequence would rotate with the long factors, which a KV cache cannot follow",
                 path, orig, c->max_positions);
        c->max_positions = orig;
    }
    return STATUS_OK;
}

/* llama.cpp's glm4moe keys (convert_hf_to_gguf.py Glm4MoeModel): DeepSeek-V3's router (sigmoid gating,
 * the selection bias exp_probs_b, expert_weights_scale, expert_weights_norm, expert_group_count /
 * expert_group_used_count when written), expert_shared_count plain shared experts (ffn_*_shexp, no
 * gate) and leading_dense_block_count dense layers of feed_forward_length. */
static enum status gguf_glm4moe(const struct gguf *g, const char *path, struct model_config *c)
{
    enum status s;
    int64_t gating = 2, shared = 0, dense = 0;
    int norm = 1, groups = 1, group_topk = 1;
    float scale = 1.0f;
    if (gguf_find_kv(g, "glm4moe.expert_gating_func") && (s = gguf_get_int(g, "glm4moe.expert_gating_func", &gating)))
        return s;
    if (gating != 2)
        return status_errorf(STATUS_UNSUPPORTED, "%s: glm4moe.expert_gating_func = %lld: read with sigmoid gating (2) "
                             "only", path, (long long)gating);
    if (gguf_find_kv(g, "glm4moe.expert_shared_count") && (s = gguf_get_int(g, "glm4moe.expert_shared_count", &shared)))
        return s;
    if (gguf_find_kv(g, "glm4moe.expert_weights_norm") && (s = gguf_get_bool(g, "glm4moe.expert_weights_norm", &norm)))
        return s;
    if (gguf_find_kv(g, "glm4moe.leading_dense_block_count") &&
        (s = gguf_get_int(g, "glm4moe.leading_dense_block_count", &dense)))
        return s;
    if (dense < 0 || dense >= c->n_layers)
        return status_errorf(STATUS_BAD_FORMAT, "%s: glm4moe.leading_dense_block_count = %lld of %d layers: a layer at "
                             "least runs the experts", path, (long long)dense, c->n_layers);
    c->moe_dense_first = (int)dense;
    if ((s = gc_int_or(g, "glm4moe.expert_group_count", 1, &groups)) ||
        (s = gc_int_or(g, "glm4moe.expert_group_used_count", 1, &group_topk)) ||
        (s = gc_float_or(g, "glm4moe.expert_weights_scale", 1.0, &scale)))
        return s;
    if (shared < 0 || shared * c->moe_ffn > (1 << 24))
        return status_errorf(STATUS_BAD_FORMAT, "%s: glm4moe.expert_shared_count = %lld", path, (long long)shared);
    c->dense_ffn = c->moe_dense_first ? c->ffn_hidden : 0; /* feed_forward_length: the dense layers' */
    if (shared) c->shared_expert = SHARED_EXPERT_PLAIN, c->ffn_hidden = (int)shared * c->moe_ffn;
    c->norm_topk_prob = norm;
    c->moe_groups = groups > 1 ? groups : 0;
    c->moe_group_topk = groups > 1 ? group_topk : 0;
    c->moe_routed_scale = scale;
    c->moe_sigmoid = 1;
    char name[64];
    snprintf(name, sizeof name, "blk.%d.exp_probs_b.bias", c->moe_dense_first); /* the first sparse layer's */
    c->moe_sel_bias = gguf_find_tensor(g, name) != NULL;
    return STATUS_OK;
}

/* The Llama-shaped architectures of llama.cpp: "llama" (Llama 1/2, Mistral, SmolLM, TinyLlama
 * ... as convert_hf_to_gguf.py writes them), "qwen2" (q/k/v biases), "qwen3" (per-head QK
 * norm), "phi3" (Phi-3 / 3.5 / 4-mini: fused attn_qkv and ffn_up, partial rotary, a window on
 * every layer, LongRoPE), "olmo2" (q and k normed over the whole projection, norms after
 * attention and the MLP only), and the mixtures of experts: "llama" with expert_count
 * (Mixtral), "qwen2moe" (q/k/v biases, a shared expert as ffn_*_shexp behind a sigmoid gate
 * ffn_gate_inp_shexp), "qwen3moe" and "olmoe" (whole-projection QK norm), "minimax-m2" (sigmoid gating
 * with the selection bias exp_probs_b, whole-projection QK norm, rope.dimension_count rotated). llama.cpp's converter permutes the rows of a llama model's
 * attn_q and attn_k so that rotary rotates adjacent pairs (its rope type NORM): rope_style pairs
 * over the file's weights as they are; the others keep Hugging Face's order and rotate halves
 * (rope type NEOX; Olmo2Model and Phi3MiniModel permute nothing). Biases come with the tensors
 * (attn_q.bias). Experts in any other architecture are refused, not ignored. */
static enum status gguf_llama_config(const struct gguf *g, const char *arch, enum dtype dtype, struct model_config *c)
{
    enum status s;
    const char *path = gguf_path(g);
    char key[96];
    const int qwen2moe = !strcmp(arch, "qwen2moe"), qwen2 = !strcmp(arch, "qwen2") || qwen2moe;
    const int qwen3moe = !strcmp(arch, "qwen3moe"), qwen3 = !strcmp(arch, "qwen3") || qwen3moe;
    const int phi3 = !strcmp(arch, "phi3"), olmo2 = !strcmp(arch, "olmo2"), olmoe = !strcmp(arch, "olmoe");
    const int oss = !strcmp(arch, "gpt-oss"), minimax = !strcmp(arch, "minimax-m2"), glm = !strcmp(arch, "glm4moe");
    const int moe_arch = qwen2moe || qwen3moe || olmoe || oss || minimax || glm; /* experts by architecture; llama's by expert_count */
#define K(name) (snprintf(key, sizeof key, "%s." name, arch), key)
    static const char *const unsupported[] = {"attention.layer_norm_epsilon", "attention.sliding_window_pattern",
                                              "attention.sliding_window"};
    /* phi3 reads its window below; olmo2 accepts a window of 0 (Olmo 3's windowed layers: no) */
    const size_t n_unsupported = oss ? 1 : sizeof unsupported / sizeof unsupported[0] - (phi3 || olmo2);
    for (size_t i = 0; i < n_unsupported; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, unsupported[i]);
        if (gguf_find_kv(g, key))
            return status_errorf(STATUS_UNSUPPORTED, "%s: metadata key '%s' is not supported", path, key);
    }
    memset(c, 0, sizeof *c);
    c->family = MODEL_FAMILY_LLAMA;
    int64_t experts = 0;
    if (gguf_find_kv(g, K("expert_count")) && (s = gguf_get_int(g, key, &experts))) return s;
    if (experts && strcmp(arch, "llama") && !moe_arch)
        return status_errorf(STATUS_UNSUPPORTED, "%s: %s: experts in a %s file are not supported (llama: Mixtral; "
                             "qwen2moe, qwen3moe, olmoe, minimax-m2, glm4moe)", path, key, arch);
    snprintf(c->architecture, sizeof c->architecture, "%s",
             qwen2moe ? "Qwen2MoeForCausalLM" : qwen2 ? "Qwen2ForCausalLM" : qwen3moe ? "Qwen3MoeForCausalLM"
             : qwen3 ? "Qwen3ForCausalLM" : phi3 ? "Phi3ForCausalLM" : olmo2 ? "Olmo2ForCausalLM"
             : olmoe ? "OlmoeForCausalLM" : oss ? "GptOssForCausalLM" : minimax ? "MiniMaxM2ForCausalLM"
             : glm ? "Glm4MoeForCausalLM"
             : experts ? "MixtralForCausalLM"
             : "LlamaForCausalLM");
    if ((s = gc_int(g, K("embedding_length"), &c->d_model)) || (s = gc_int(g, K("block_count"), &c->n_layers)) ||
        (s = gc_int(g, K("feed_forward_length"), &c->ffn_hidden)) ||
        (s = gc_int(g, K("attention.head_count"), &c->n_heads)) ||
        (s = gc_int_or(g, K("attention.head_count_kv"), c->n_heads, &c->n_kv_heads)) ||
        (s = gc_int_or(g, K("attention.key_length"), c->d_model / c->n_heads, &c->head_dim)) ||
        (s = gc_int_or(g, K("rope.dimension_count"), c->head_dim, &c->rot_dim)) ||
        (s = gc_int(g, K("context_length"), &c->max_positions)) ||
        (s = gc_float_or(g, K("attention.layer_norm_rms_epsilon"), 1e-5, &c->norm_eps)) ||
        (s = gc_float_or(g, K("rope.freq_base"), 10000.0, &c->rope_theta)) || (s = gc_vocab(g, c)))
        return s;
    int value_length = c->head_dim;
    if ((s = gc_int_or(g, K("attention.value_length"), c->head_dim, &value_length))) return s;
    if (glm) { /* block_count counts the next-token-prediction layers after the model's (gguf_check_tensors skips them) */
        int64_t nextn = 0;
        if (gguf_find_kv(g, K("nextn_predict_layers")) && (s = gguf_get_int(g, key, &nextn))) return s;
        if (nextn < 0 || nextn >= c->n_layers)
            return status_errorf(STATUS_BAD_FORMAT, "%s: %s = %lld of %d blocks", path, key, (long long)nextn, c->n_layers);
        c->n_layers -= (int)nextn;
    }
    if (experts || moe_arch) { /* llama.cpp's MoE keys */
        if ((s = gc_int(g, K("expert_used_count"), &c->n_experts_used)) ||
            (s = gc_int_or(g, K("expert_feed_forward_length"), c->ffn_hidden, &c->moe_ffn)))
            return s;
        c->n_experts = (int)(experts > 0 && experts <= 1024 ? experts : -1);
        /* llama.cpp's build_moe_ffn renormalises the top-k weights of Mixtral and Qwen 3 MoE, not
         * those of Qwen 2 MoE or OLMoE (their norm_topk_prob false, as in their configs). */
        c->norm_topk_prob = !qwen2moe && !olmoe; /* gpt-oss: softmax over the k chosen logits, the same */
        if (minimax) { /* llama.cpp's minimax-m2 graph: sigmoid gating, the selection bias exp_probs_b */
            int64_t gating = 2; /* LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID */
            if (gguf_find_kv(g, K("expert_gating_func")) && (s = gguf_get_int(g, key, &gating))) return s;
            if (gating != 2)
                return status_errorf(STATUS_UNSUPPORTED, "%s: %s = %lld: a minimax-m2 file is read with sigmoid "
                                     "gating (2) only", path, key, (long long)gating);
            c->moe_sigmoid = 1;
            c->moe_sel_bias = gguf_find_tensor(g, "blk.0.exp_probs_b.bias") != NULL;
        }
        if (glm && (s = gguf_glm4moe(g, path, c))) return s;
        if (qwen2moe) { /* the shared expert: shardlm's dense MLP, of expert_shared_feed_forward_length */
            c->shared_expert = 1;
            if ((s = gc_int_or(g, K("expert_shared_feed_forward_length"), c->ffn_hidden, &c->ffn_hidden))) return s;
        }
    }
    if ((phi3 || olmo2) && gguf_find_kv(g, K("attention.sliding_window"))) {
        int64_t w = 0; /* Phi3MiniModel writes 0 for none (Phi-4) */
        if ((s = gguf_get_int(g, key, &w))) return s;
        if (w < 0 || w > (1 << 30))
            return status_errorf(STATUS_BAD_FORMAT, "%s: %s = %lld is out of range", path, key, (long long)w);
        if (olmo2 && w > 0)
            return status_errorf(STATUS_UNSUPPORTED, "%s: %s = %lld: OLMo 3's windowed layers are not supported", path,
                                 key, (long long)w);
        c->sliding_window = (int)w; /* Phi-3: every layer, as shardlm reads Phi3Config's (llama.cpp ignores it) */
    }
#undef K
    if (value_length != c->head_dim)
        return status_errorf(STATUS_UNSUPPORTED, "%s: key_length %d != value_length %d", path, c->head_dim,
                             value_length);
    c->norm = NORM_KIND_RMSNORM;
    c->activation = ACTIVATION_SILU;
    c->gated_mlp = 1;
    c->positions = POSITION_KIND_ROTARY;
    c->rope_style = !strcmp(arch, "llama") ? ROPE_STYLE_PAIRS : ROPE_STYLE_HALVES;
    c->qkv_bias = gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    c->attn_out_bias = gguf_find_tensor(g, "blk.0.attn_output.bias") != NULL;
    c->mlp_bias = gguf_find_tensor(g, "blk.0.ffn_up.bias") != NULL;
    c->qk_norm = qwen3 || (glm && gguf_find_tensor(g, "blk.0.attn_q_norm.weight")) ? QK_NORM_HEAD
               : olmo2 || olmoe || minimax ? QK_NORM_FULL : 0;
    c->sandwich_norms = c->no_pre_norms = olmo2;
    c->tied_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    c->dtype = dtype;
    if (phi3) { /* Phi3ForCausalLM's layout: q, k, v fused (attn_qkv) and gate, up fused (ffn_up) */
        static const char *const absent[] = {"blk.0.attn_qkv.bias", "blk.0.ffn_up.bias", "blk.0.attn_q.weight",
                                             "blk.0.ffn_gate.weight"};
        for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
            if (gguf_find_tensor(g, absent[i]))
                return status_errorf(STATUS_UNSUPPORTED, "%s: tensor '%s' is not part of a phi3 model as "
                                     "convert_hf_to_gguf.py writes it (fused attn_qkv and ffn_up, no biases)",
                                     path, absent[i]);
        s = gguf_phi3_longrope(g, path, c);
    } else if (oss) {
        s = gguf_gpt_oss(g, path, c);
    } else {
        s = gguf_rope_scaling(g, arch, path, c);
    }
    if (s) return s;
    return config_validate(c, path);
}

enum status gguf_model_config(const struct gguf *g, enum dtype dtype, struct model_config *c)
{
    enum status s;
    const char *path = gguf_path(g), *arch = NULL;
    if ((s = gguf_get_str(g, "general.architecture", &arch))) return s;
    static const char *const llama_like[] = {"llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "olmo2", "olmoe",
                                             "gpt-oss", "minimax-m2", "glm4moe"};
    for (size_t i = 0; i < sizeof llama_like / sizeof llama_like[0]; i++)
        if (!strcmp(arch, llama_like[i])) return gguf_llama_config(g, arch, dtype, c);
    const int g2 = !strcmp(arch, "gemma2");
    if (!g2 && strcmp(arch, "gemma3"))
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: general.architecture \"%s\": only llama (and Mixtral), qwen2, qwen2moe, qwen3, qwen3moe, "
                             "phi3, olmo2, olmoe, gpt-oss, minimax-m2, glm4moe, gemma2 and gemma3 GGUF files load", path, arch);
    char key[96];
#define GK(name) (snprintf(key, sizeof key, "%s." name, arch), key)
    static const char *const unsupported3[] = {"final_logit_softcapping", "attn_logit_softcapping",
                                               "rope.scaling.factor", "attention.sliding_window_pattern"};
    for (size_t i = g2 ? 2 : 0; i < sizeof unsupported3 / sizeof unsupported3[0]; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, unsupported3[i]);
        if (gguf_find_kv(g, key))
            return status_errorf(STATUS_UNSUPPORTED, "%s: metadata key '%s' is not supported", path, key);
    }
    const char *scaling = NULL;
    if (gguf_find_kv(g, GK("rope.scaling.type")) && (s = gguf_get_str(g, key, &scaling))) return s;
    if (scaling && strcmp(scaling, "none"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: %s.rope.scaling.type \"%s\" is not supported", path, arch,
                             scaling);

    memset(c, 0, sizeof *c);
    c->family = MODEL_FAMILY_GEMMA3;
    snprintf(c->architecture, sizeof c->architecture, g2 ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM");
    int value_length = 0;
    if ((s = gc_int(g, GK("embedding_length"), &c->d_model)) || (s = gc_int(g, GK("block_count"), &c->n_layers)) ||
        (s = gc_int(g, GK("feed_forward_length"), &c->ffn_hidden)) ||
        (s = gc_int(g, GK("attention.head_count"), &c->n_heads)) ||
        (s = gc_int_or(g, GK("attention.head_count_kv"), c->n_heads, &c->n_kv_heads)) ||
        (s = gc_int_or(g, GK("attention.key_length"), c->d_model / c->n_heads, &c->head_dim)) ||
        (s = gc_int_or(g, GK("attention.value_length"), c->head_dim, &value_length)) ||
        (s = gc_int(g, GK("context_length"), &c->max_positions)) ||
        (s = gc_int(g, GK("attention.sliding_window"), &c->sliding_window)) ||
        (s = gc_float_or(g, GK("attention.layer_norm_rms_epsilon"), 1e-6, &c->norm_eps)) ||
        (s = gc_float_or(g, GK("rope.freq_base"), g2 ? 10000.0 : 1e6, &c->rope_theta)))
        return s;
    if (g2 && ((s = gc_float_or(g, GK("attn_logit_softcapping"), 50.0, &c->attn_softcap)) ||
               (s = gc_float_or(g, GK("final_logit_softcapping"), 30.0, &c->final_softcap))))
        return s;
#undef GK
    if (value_length != c->head_dim)
        return status_errorf(STATUS_UNSUPPORTED, "%s: key_length %d != value_length %d", path,
                             c->head_dim, value_length);
    if ((s = gc_vocab(g, c))) return s;

    c->norm = NORM_KIND_RMSNORM;
    c->activation = ACTIVATION_GELU_TANH;
    c->gated_mlp = 1;
    c->positions = POSITION_KIND_ROTARY;
    c->rope_style = ROPE_STYLE_HALVES;
    c->rot_dim = c->head_dim;
    c->tied_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    c->dtype = dtype;
    c->embed_scale = sqrtf((float)c->d_model);
    c->qk_norm = !g2;
    c->sandwich_norms = 1;
    c->norm_weight_offset = 0.0f; /* convert_hf_to_gguf.py added the 1 to every norm weight */
    /* Not in the metadata; llama.cpp hard-codes them, as does this (the published values):
     * Gemma 3: every 6th layer global, the others windowed with rotary base 10000, and
     * query_pre_attn_scalar = head_dim, except the 62-layer 27B model whose scalar is d_model /
     * n_heads (llama-model.cpp: LLM_TYPE_27B). Gemma 2: every other layer windowed (the even
     * ones), one rotary base, the scalar head_dim except the 46-layer 27B's d_model / n_heads. */
    c->sliding_window_pattern = g2 ? 2 : 6;
    c->rope_theta_local = g2 ? c->rope_theta : 10000.0f;
    const int big = g2 ? c->n_layers == 46 : c->n_layers == 62;
    int qpas = big ? c->d_model / c->n_heads : c->head_dim;
    c->attn_scale = (float)(1.0 / sqrt((double)qpas));
    return config_validate(c, path);
}

/* The GGUF name of weight kind of layer l in c's file into buf: 0, or 1 when the kind is not a
 * tensor of its own (Phi-3's k, v and up live in the fused attn_qkv and ffn_up, named by q and
 * gate). */
const char *gguf_weight_pattern(const struct model_config *c, enum weight_kind kind, int layer)
{
    const int glm = config_is_glm4_moe(c);
    if ((c->moe_bias || glm) && kind == WEIGHT_KIND_MLP_NORM) /* gpt-oss, glm4moe: the pre-MLP norm under Gemma's post-attention name */
        return "blk.%d.post_attention_norm.weight";
    if (c->shared_expert && config_layer_moe(c, layer) && (kind == WEIGHT_KIND_GATE || kind == WEIGHT_KIND_UP || kind == WEIGHT_KIND_DOWN))
        return kind == WEIGHT_KIND_GATE ? "blk.%d.ffn_gate_shexp.weight"
               : kind == WEIGHT_KIND_UP ? "blk.%d.ffn_up_shexp.weight" : "blk.%d.ffn_down_shexp.weight";
    return weight_names_of(kind)->gguf;
}

static int gc_gguf_name(const struct model_config *c, const struct weight_names *wn, int l, char *buf, size_t n)
{
    const char *pattern = gguf_weight_pattern(c, wn->kind, l);
    CHECK(pattern, "no GGUF name for %s", wn->name);
    if (config_hf_fused(c)) {
        if (wn->kind == WEIGHT_KIND_K || wn->kind == WEIGHT_KIND_V || wn->kind == WEIGHT_KIND_UP) return 1;
        if (wn->kind == WEIGHT_KIND_Q) pattern = "blk.%d.attn_qkv.weight";
        if (wn->kind == WEIGHT_KIND_GATE) pattern = "blk.%d.ffn_up.weight";
    }
    (void)weight_names_format(buf, n, NULL, pattern, l);
    return 0;
}

/* Whether tensor t's values are carried by c itself (the rotary factor tensors: gguf_rope_scaling,
 * gguf_phi3_longrope). */
static int gc_in_config(const struct model_config *c, const struct gguf_tensor *t)
{
    if (c->rope_scaling.kind == ROPE_SCALING_FACTORS) return !strcmp(t->name, "rope_freqs.weight");
    if (c->rope_scaling.kind == ROPE_SCALING_LONGROPE)
        return !strcmp(t->name, "rope_factors_short.weight") || !strcmp(t->name, "rope_factors_long.weight");
    return 0;
}

/* Whether t belongs to GLM-4.5's next-token-prediction blocks, after the model's (never read). */
static int gc_nextn(const struct model_config *c, const struct gguf_tensor *t)
{
    int b = -1;
    return config_is_glm4_moe(c) && sscanf(t->name, "blk.%d.", &b) == 1 && b >= c->n_layers;
}

enum status gguf_check_tensors(const struct gguf *g, const struct model_config *c)
{
    const int n = gguf_n_tensors(g);
    char name[128];
    unsigned char *seen = calloc((size_t)n + 1, 1);
    if (!seen) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < n; i++) seen[i] = (unsigned char)(gc_in_config(c, gguf_tensor_at(g, i)) || gc_nextn(c, gguf_tensor_at(g, i)));
    for (int i = 0; i < WEIGHT_KIND_COUNT; i++) {
        const struct weight_names *wn = weight_names_at(i);
        if (!weight_kind_exists(c, wn->kind) || (wn->kind == WEIGHT_KIND_LM_HEAD && c->tied_embeddings)) continue;
        for (int l = 0; l < (wn->place == WEIGHT_PLACE_LAYER ? c->n_layers : 1); l++) {
            if (!weight_kind_exists_at(c, wn->kind, l)) continue;
            const struct gguf_tensor *t = gc_gguf_name(c, wn, l, name, sizeof name) ? NULL : gguf_find_tensor(g, name);
            if (t) seen[t - gguf_tensor_at(g, 0)] = 1;
        }
    }
    enum status s = STATUS_OK;
    for (int i = 0; i < n && !s; i++)
        if (!seen[i])
            s = status_errorf(STATUS_UNSUPPORTED, "%s: tensor '%s' is no weight of the %s text model", gguf_path(g),
                              gguf_tensor_at(g, i)->name, c->architecture);
    free(seen);
    return s;
}

/* Looks up name, checks that it can be read and has shape (d0) or (d0, d1), and queues it: in
 * dtype, or as its blocks when keep_blocks and it is a matrix of a block type. */
static enum status gc_add(struct safetensors_writer *w, const struct gguf *g, const char *name,
                          const char *hf_name, int ndim, int64_t d0, int64_t d1, enum dtype dtype,
                          int keep_blocks, struct gc_item *item, int *n_used)
{
    const struct gguf_tensor *t;
    enum status s = gguf_get_tensor(g, name, &t);
    if (s == STATUS_NOT_FOUND)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' is missing", gguf_path(g), name);
    if (s) return s;
    if (t->n_dims != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1))
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: tensor '%s' has shape (%lld, %lld) [%d dims], expected (%lld, %lld) "
                             "from the metadata",
                             gguf_path(g), name, (long long)t->shape[0],
                             (long long)(t->n_dims > 1 ? t->shape[1] : 0), t->n_dims, (long long)d0,
                             (long long)(ndim > 1 ? d1 : 0));
    /* Kept blocks: a matrix whose GGUF type is one of the DTYPE_Q* (its rows are whole blocks). */
    const int block = dtype_of_quant_type(t->type);
    if (keep_blocks && ndim == 2 && block >= 0) dtype = (enum dtype)block;
    *item = (struct gc_item){g, t, dtype};
    (*n_used)++;
    int64_t shape[2] = {d0, d1};
    return safetensors_writer_add_deferred(w, hf_name, dtype, ndim, shape, gc_fill, item);
}

/* A special token's text for tokenizer_config.json: the piece of id `key` in the metadata, or
 * NULL (absent, or not an id of the vocabulary). */
static cJSON *gc_token_text(const struct gguf *g, const char *key)
{
    const struct gguf_kv *tokens;
    int64_t id = -1;
    uint64_t len = 0;
    if (!gguf_find_kv(g, key) || gguf_get_int(g, key, &id) || gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens) ||
        id < 0 || (uint64_t)id >= tokens->n)
        return NULL;
    const char *p = gguf_arr_str(tokens, (uint64_t)id, &len);
    char *t = malloc(len + 1);
    if (!t) return NULL;
    memcpy(t, p, len);
    t[len] = 0;
    cJSON *j = cJSON_CreateString(t);
    free(t);
    return j;
}

/* OUT/tokenizer.json as Hugging Face tokenizers reads it (gguf_tokenizer.c's text less its
 * "shardlm" object of special ids, which HF refuses) and OUT/tokenizer_config.json with those
 * special tokens as HF writes them (bos_token, eos_token, pad_token, unk_token, add_bos_token),
 * which tokenizer_json.c reads back beside the file. */
static enum status gc_write_tokenizer_json(const struct gguf *g, const char *out_dir, const void *text, size_t n)
{
    char path[GC_PATH];
    cJSON *root = cJSON_ParseWithLength(text, n), *cfg = cJSON_CreateObject();
    char *tok = NULL, *conf = NULL;
    enum status s = STATUS_OK;
    if (!root || !cfg) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory writing the tokenizer");
        goto out;
    }
    cJSON *ours = cJSON_DetachItemFromObjectCaseSensitive(root, "shardlm");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(ours, "add_bos");
    cJSON_AddBoolToObject(cfg, "add_bos_token", cJSON_IsTrue(add));
    cJSON_Delete(ours);
    static const char *const keys[][2] = {{"tokenizer.ggml.bos_token_id", "bos_token"},
                                          {"tokenizer.ggml.eos_token_id", "eos_token"},
                                          {"tokenizer.ggml.padding_token_id", "pad_token"},
                                          {"tokenizer.ggml.unknown_token_id", "unk_token"}};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        cJSON *t = gc_token_text(g, keys[k][0]);
        if (t) cJSON_AddItemToObject(cfg, keys[k][1], t);
    }
    cJSON_AddStringToObject(cfg, "tokenizer_class", "PreTrainedTokenizerFast");
    const char *tmpl = NULL; /* the model's chat template, where transformers and the checkpoint reader look */
    if (gguf_find_kv(g, "tokenizer.chat_template") && gguf_get_str(g, "tokenizer.chat_template", &tmpl) == STATUS_OK &&
        tmpl)
        cJSON_AddStringToObject(cfg, "chat_template", tmpl);
    if (!(tok = cJSON_PrintUnformatted(root)) || !(conf = cJSON_Print(cfg))) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory writing the tokenizer");
        goto out;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", out_dir);
    if ((s = base_write_file(path, tok, strlen(tok), 0644))) goto out;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", out_dir);
    s = base_write_file(path, conf, strlen(conf), 0644);
out:
    free(tok);
    free(conf);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    return s;
}

enum status gguf_convert(const char *gguf_path, const char *out_dir, enum dtype out_dtype, int keep_blocks)
{
    enum status s;
    struct gguf *g = NULL;
    struct safetensors_writer *w = NULL;
    struct gc_item *items = NULL;
    void *proto = NULL;
    size_t proto_n = 0;
    char path[GC_PATH], gname[128], hname[160];
    struct model_config c;

    if (out_dtype != DTYPE_F32 && out_dtype != DTYPE_BF16 && out_dtype != DTYPE_F16)
        return status_errorf(STATUS_INVALID_ARGUMENT, "convert gguf: dtype %s (f32, bf16 or f16)",
                             dtype_name(out_dtype));
    if (snprintf(path, sizeof path, "%s/model.safetensors", out_dir) >= (int)sizeof path)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: path too long", out_dir);
    if ((s = gguf_open(gguf_path, &g)) || (s = gguf_model_config(g, out_dtype, &c))) goto out;
    if (c.n_experts) {
        s = status_errorf(STATUS_UNSUPPORTED, "%s: converting a mixture of experts (%s) is not built; serve the GGUF "
                          "file as it is (--model FILE.gguf)", gguf_path, c.architecture);
        goto out;
    }
    /* The tokenizer first: cheap, and it fails early on a file that has none. */
    if ((s = gguf_tokenizer_model_proto(g, &proto, &proto_n))) goto out;
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        s = status_errorf(STATUS_IO, "%s: %s", out_dir, strerror(errno));
        goto out;
    }

    /* One item per tensor taken, and every tensor is taken at most once (names are unique): the
     * file's tensor count bounds them, where the metadata's block_count (up to 2^24) does not. */
    int n_items = gguf_n_tensors(g), used = 0;
    if (!(items = calloc((size_t)n_items + 1, sizeof *items))) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if ((s = safetensors_writer_begin(path, &w)) ||
        (s = safetensors_writer_set_metadata(w, "format", "pt")))
        goto out;
    /* In the table's order: embeddings, each layer's tensors, final norm and head. */
    for (int place = WEIGHT_PLACE_FIRST; place <= WEIGHT_PLACE_LAST; place++) {
        int layers = place == WEIGHT_PLACE_LAYER ? c.n_layers : 1;
        for (int l = 0; l < layers; l++) {
            for (int i = 0; i < WEIGHT_KIND_COUNT; i++) {
                const struct weight_names *wn = weight_names_at(i);
                if ((int)wn->place != place || !weight_kind_exists(&c, wn->kind) ||
                    (wn->kind == WEIGHT_KIND_LM_HEAD && c.tied_embeddings))
                    continue;
                if (gc_gguf_name(&c, wn, l, gname, sizeof gname)) continue; /* in a fused tensor */
                if (wn->kind == WEIGHT_KIND_LM_HEAD) snprintf(hname, sizeof hname, "%s", wn->hf);
                else (void)weight_names_format(hname, sizeof hname, "model.", weight_names_hf(wn->kind, config_hf_gemma_names(&c)), l);
                int ndim;
                int64_t d0, d1;
                weight_kind_shape(&c, wn->kind, &ndim, &d0, &d1);
                if (config_hf_fused(&c) && (wn->kind == WEIGHT_KIND_Q || wn->kind == WEIGHT_KIND_GATE)) {
                    /* Phi-3: the file's fused tensors are Hugging Face's qkv_proj and gate_up_proj, rows as they are */
                    const int q = wn->kind == WEIGHT_KIND_Q;
                    const char *fused = q ? "layers.%d.self_attn.qkv_proj.weight" : "layers.%d.mlp.gate_up_proj.weight";
                    (void)weight_names_format(hname, sizeof hname, "model.", fused, l);
                    d0 = q ? (int64_t)(c.n_heads + 2 * c.n_kv_heads) * c.head_dim : 2 * (int64_t)c.ffn_hidden;
                }
                CHECK(used <= n_items, "more GGUF tensors taken than the file has");
                if ((s = gc_add(w, g, gname, hname, ndim, d0, d1, out_dtype, keep_blocks, &items[used], &used)))
                    goto out;
            }
        }
    }
    /* Every tensor of the file must have been taken: anything else is a feature not modelled. */
    if ((s = gguf_check_tensors(g, &c))) goto out;
    int kept = 0;
    for (int i = 0; i < used; i++) kept += dtype_is_quant(items[i].dtype);
    LOG_INFO("gguf_convert", "%s: %d tensors to %s: %d kept as blocks, %d as %s", gguf_path, used, path, kept,
             used - kept, dtype_name(out_dtype));
    s = safetensors_writer_finish(w); /* frees w */
    w = NULL;
    if (s) goto out;

    /* A gpt2 vocabulary comes back as a tokenizer.json text, a llama one as a ModelProto. */
    if (proto_n && ((const char *)proto)[0] == '{') s = gc_write_tokenizer_json(g, out_dir, proto, proto_n);
    else if (snprintf(path, sizeof path, "%s/tokenizer.model", out_dir) >= 0) s = base_write_file(path, proto, proto_n, 0644);
    if (s) goto out;
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    s = config_save(path, &c);
out:
    safetensors_writer_free(w);
    free(items);
    free(proto);
    gguf_close(g);
    return s;
}

#!/usr/bin/env python3
"""Write small random Hugging Face-layout checkpoints plus float64 reference outputs.

Written only for shardlm's golden tests. Nothing here depends on torch, transformers or
safetensors: the safetensors files are written by hand and the reference outputs come from
an independent float64 NumPy forward pass that follows the Hugging Face modelling code
(GPT2LMHeadModel, LlamaForCausalLM) conventions.

Usage:
  python3 make_models.py gpt2  --out DIR [--seed S] [--dtype f32|bf16|f16] [--shards N]
                               [--no-prefix]
  python3 make_models.py llama --out DIR [--seed S] [--dtype f32|bf16|f16] [--shards N]
  (likewise qwen2, qwen3, phi3, mistral, gemma2, olmo2, mixtral, qwen2_moe, qwen3_moe, olmoe,
  gpt_oss, glm4_moe: glm_ref.py)

DIR receives:
  config.json                      (Hugging Face config for the architecture)
  model.safetensors                (--shards 1, the default), or
  model-0000i-of-0000N.safetensors + model.safetensors.index.json   (--shards N > 1)
  reference.json                   {"model_type", "dtype", "seed", "prompt_ids",
                                    "logits": [[vocab floats] per prompt position],
                                    "greedy_ids": [20 greedy tokens after the prompt],
                                    "greedy_margins": [top1 - top2 logit at each greedy step],
                                    "greedy_top_ids", "greedy_top_logits": [5 best ids / their
                                        logits at each greedy step, best first],
                                    "prompt_margins": [top1 - top2 at each prompt position]}
No tokenizer is written: vocab_size is 512 so that stories260K's tok512.model fits; the C
test copies or links it in itself.

Models:
  gpt2: n_embd 64, n_layer 2, n_head 4, n_positions 128, vocab 512, layer_norm_epsilon 1e-5,
        gelu_new (tanh approximation), learned positions (wpe), LayerNorm with bias, biases on
        every projection, lm_head tied to wte (no lm_head.weight tensor is written). Tensor
        names `transformer.wte.weight`, `transformer.h.{i}.attn.c_attn.weight`, ... (as
        GPT2LMHeadModel.save_pretrained writes them); with --no-prefix the `transformer.`
        prefix is dropped (as in the original openai-community/gpt2 checkpoint). Projections
        are Conv1D: weight stored (in_features, out_features), y = x @ W + b.
        c_attn output columns are [q | k | v], each split into heads as (n_head, head_dim).
  llama: hidden 64, intermediate 172, 2 layers, 8 heads, 4 kv heads (GQA), vocab 512,
        max_position_embeddings 256, rms_norm_eps 1e-5, rope_theta 10000, untied lm_head.
        nn.Linear weights (out_features, in_features), y = x @ W^T. Rotary embedding in the
        HF "rotate_half" convention: within each head, dimension j pairs with j + head_dim/2,
        inv_freq[j] = 1 / theta^(2j/head_dim), angle = pos * inv_freq[j].
  gpt_oss: GptOssForCausalLM (gpt_oss_ref.py: config, weights, forward, and the self-checks
        make() runs each time: the prompt reaches the SwiGLU clamps and the router bias, and
        each nearby mistake in gpt_oss_ref.VARIANTS moves the logits by > 1% of their size).

Initialisation: normal noise, LayerNorm/RMSNorm weights 1 + 0.1*noise, biases 0.02*noise.
Projection weights use std 1/sqrt(fan_in) and embeddings std ~0.5-1, rather than GPT-2's
0.02, on purpose: with std 0.02 the attention scores would be ~1e-3 (softmax ~ uniform) and
the activations would sit in the linear part of GELU/SiLU, so a missing attention scale, a
wrong mask or a wrong activation would hardly move the logits. With these scales every part
of the network changes the logits at the 1e-1 level.

When --dtype is bf16 or f16, the weights are rounded (bf16: round-to-nearest-even on the
float32 bits; f16: IEEE round-to-nearest-even) and the reference forward uses exactly the
rounded values, converted back to float64.

Importable API (used by check_refs.py):
  gpt2_config(), llama_config(), init_gpt2(cfg, seed), init_llama(cfg, seed)
  gpt2_forward(cfg, w, tokens), llama_forward(cfg, w, tokens)  -> logits (T, vocab) float64
  greedy(forward_fn, cfg, w, prompt, steps)
  round_weights(w, dtype), write_safetensors(path, tensors, dtype), read_safetensors(path)
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

import families  # Gemma 2, OLMo 2 (it imports this module for its helpers)
import glm_ref  # GLM-4.5 (likewise)
import gpt_oss_ref  # GPT-OSS (likewise)

# A fixed prompt: BOS followed by the first 11 tokens stories260K produces greedily from BOS
# ("Once upon a time, there was a little girl"), so it is also meaningful text for tok512.
PROMPT_IDS = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315]
GREEDY_STEPS = 20

DTYPES = {"f32": "F32", "bf16": "BF16", "f16": "F16"}
TORCH_DTYPE = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


# --------------------------------------------------------------------------- configs

def gpt2_config(dtype="f32"):
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": 512,
        "n_positions": 128,
        "n_ctx": 128,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "torch_dtype": TORCH_DTYPE[dtype],
    }


def llama_config(dtype="f32"):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "torch_dtype": TORCH_DTYPE[dtype],
    }


MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "minimax_m2")


def moe_config(flavor, dtype="f32"):
    """Small mixtures of experts: Mixtral (8 experts, top 2, renormalised; intermediate_size is
    the expert's), Qwen 3 MoE (Qwen 3's per-head QK norm; moe_intermediate_size; top-k weights
    not renormalised) and OLMoE (q and k normed over the whole projection; not renormalised)."""
    cfg = llama_config(dtype)
    if flavor == "mixtral":
        cfg.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8,
                    "num_experts_per_tok": 2, "intermediate_size": 48, "sliding_window": None,
                    "rope_theta": 1000000.0})
    elif flavor == "qwen2_moe":  # Qwen 2's q, k, v biases; a shared expert beside the routed ones
        cfg.update({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 56,
                    "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": []})
        del cfg["attention_bias"]  # Qwen2MoeConfig has none: q, k and v always carry biases
    elif flavor == "qwen3_moe":
        cfg.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 6,
                    "num_experts_per_tok": 3, "moe_intermediate_size": 40, "norm_topk_prob": True,
                    "decoder_sparse_step": 1, "mlp_only_layers": [], "head_dim": 16})
    elif flavor == "minimax_m2":  # a sigmoid router whose top k a bias selects; whole-projection QK norm
        cfg.update({"architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "num_local_experts": 6,
                    "num_experts_per_tok": 2, "intermediate_size": 40, "rotary_dim": 4, "scoring_func": "sigmoid",
                    "use_routing_bias": True, "use_qk_norm": True, "qk_norm_type": "per_layer",
                    "rope_theta": 5000000.0})
    else:
        cfg.update({"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "num_experts": 4,
                    "num_experts_per_tok": 2, "intermediate_size": 56, "norm_topk_prob": False})
    return cfg


# --------------------------------------------------------------------------- init

def init_gpt2(cfg, seed):
    rng = np.random.default_rng(seed)
    E, V, P, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
    F = cfg["n_inner"] or 4 * E

    def lin(fan_in, fan_out):  # Conv1D layout (in, out)
        return rng.standard_normal((fan_in, fan_out)) / math.sqrt(fan_in)

    def ln():
        return 1.0 + 0.1 * rng.standard_normal(E), 0.02 * rng.standard_normal(E)

    def bias(n):
        return 0.02 * rng.standard_normal(n)

    w = {}
    w["transformer.wte.weight"] = 0.5 * rng.standard_normal((V, E))
    w["transformer.wpe.weight"] = 0.5 * rng.standard_normal((P, E))
    for i in range(L):
        p = "transformer.h.%d." % i
        w[p + "ln_1.weight"], w[p + "ln_1.bias"] = ln()
        w[p + "attn.c_attn.weight"] = lin(E, 3 * E)
        w[p + "attn.c_attn.bias"] = bias(3 * E)
        w[p + "attn.c_proj.weight"] = lin(E, E)
        w[p + "attn.c_proj.bias"] = bias(E)
        w[p + "ln_2.weight"], w[p + "ln_2.bias"] = ln()
        w[p + "mlp.c_fc.weight"] = lin(E, F)
        w[p + "mlp.c_fc.bias"] = bias(F)
        w[p + "mlp.c_proj.weight"] = lin(F, E)
        w[p + "mlp.c_proj.bias"] = bias(E)
    w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = ln()
    return w


def qwen_config(flavor, dtype="f32"):
    """Qwen2ForCausalLM (q/k/v biases, no o bias) or Qwen3ForCausalLM (per-head RMSNorm of q and
    k before rotary; head_dim larger than hidden / heads, as in Qwen3's small models)."""
    cfg = llama_config(dtype)
    cfg["architectures"] = ["Qwen2ForCausalLM" if flavor == "qwen2" else "Qwen3ForCausalLM"]
    cfg["model_type"] = flavor
    cfg["use_sliding_window"] = False
    cfg["tie_word_embeddings"] = True
    del cfg["attention_bias"], cfg["mlp_bias"]
    if flavor == "qwen3":
        cfg["attention_bias"] = False
        cfg["head_dim"] = 16  # 8 heads x 16 = 128 != hidden 64
    return cfg


def phi3_config(dtype="f32"):
    """Phi3ForCausalLM as Phi-3.5 / Phi-4-mini configure it: partial rotary (0.75 of each head),
    LongRoPE factors (max_position_embeddings above the original context), a sliding window, GQA."""
    cfg = llama_config(dtype)
    cfg["architectures"] = ["Phi3ForCausalLM"]
    cfg["model_type"] = "phi3"
    cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"] = 4, 2, 16
    cfg["partial_rotary_factor"] = 0.75  # 12 of 16 features rotated
    cfg["original_max_position_embeddings"] = 64
    cfg["rope_scaling"] = {"type": "longrope", "short_factor": [1.0, 1.3, 1.9, 2.6, 4.1, 7.5],
                           "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]}
    cfg["sliding_window"] = 10
    del cfg["attention_bias"], cfg["mlp_bias"]
    return cfg


def mistral_config(dtype="f32"):
    """MistralForCausalLM: Llama with a sliding window (10: shorter than the prompt and the greedy run)."""
    cfg = llama_config(dtype)
    cfg["architectures"], cfg["model_type"], cfg["sliding_window"] = ["MistralForCausalLM"], "mistral", 10
    del cfg["attention_bias"], cfg["mlp_bias"]
    return cfg


def fuse_phi3(cfg, w):
    """The Phi-3 file layout: q, k, v rows in self_attn.qkv_proj, gate and up rows in mlp.gate_up_proj."""
    out = {}
    for name, t in w.items():
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight", "mlp.up_proj.weight")):
            continue
        if name.endswith("self_attn.q_proj.weight"):
            p = name[: -len("q_proj.weight")]
            out[p + "qkv_proj.weight"] = np.concatenate([t, w[p + "k_proj.weight"], w[p + "v_proj.weight"]], axis=0)
        elif name.endswith("mlp.gate_proj.weight"):
            p = name[: -len("gate_proj.weight")]
            out[p + "gate_up_proj.weight"] = np.concatenate([t, w[p + "up_proj.weight"]], axis=0)
        else:
            out[name] = t
    return out


def phi3_peft_adapter(cfg, w, seed, rank=4, alpha=8.0):
    """A random PEFT LoRA adapter for the Phi-3 of w in Phi3ForCausalLM's module names: qkv_proj,
    o_proj, gate_up_proj, down_proj, each lora_A (rank, in) and lora_B (out, rank) of the fused
    module (B of qkv_proj spans q, k and v rows in that order). B is non-zero (a trained adapter's),
    its size chosen to move the logits by whole units. Returns (adapter_config, tensors, merged w)
    where merged holds W + (alpha / rank) B A per part, in float64, split back into the unfused
    names that llama_forward reads (what PEFT computes: x W^T + s (x A^T) B^T)."""
    rng = np.random.default_rng(seed)
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    s = alpha / rank
    tensors, merged = {}, dict(w)
    modules = (("self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj")), ("self_attn", "o_proj", ("o_proj",)),
               ("mlp", "gate_up_proj", ("gate_proj", "up_proj")), ("mlp", "down_proj", ("down_proj",)))
    for l in range(L):
        for block, module, parts in modules:
            ws = [w["model.layers.%d.%s.%s.weight" % (l, block, part)] for part in parts]
            n_out, n_in = sum(x.shape[0] for x in ws), ws[0].shape[1]
            a = (rng.uniform(-1, 1, (rank, n_in)) / math.sqrt(n_in)).astype(np.float32).astype(np.float64)
            b = (rng.standard_normal((n_out, rank)) * 0.3).astype(np.float32).astype(np.float64)
            pre = "base_model.model.model.layers.%d.%s.%s." % (l, block, module)
            tensors[pre + "lora_A.weight"], tensors[pre + "lora_B.weight"] = a, b
            r0 = 0
            for part, x in zip(parts, ws):
                key = "model.layers.%d.%s.%s.weight" % (l, block, part)
                merged[key] = x + s * (b[r0:r0 + x.shape[0]] @ a)
                r0 += x.shape[0]
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
              "target_modules": [m for _, m, _ in modules], "bias": "none", "fan_in_fan_out": False,
              "base_model_name_or_path": "", "inference_mode": True}
    assert H == w["model.embed_tokens.weight"].shape[1]
    return config, tensors, merged


def init_llama(cfg, seed):
    rng = np.random.default_rng(seed)
    H, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    flavor = cfg["model_type"]

    def lin(fan_out, fan_in):  # nn.Linear layout (out, in)
        return rng.standard_normal((fan_out, fan_in)) / math.sqrt(fan_in)

    def norm():
        return 1.0 + 0.1 * rng.standard_normal(H)

    w = {}
    w["model.embed_tokens.weight"] = rng.standard_normal((V, H))
    moe = flavor in MOE_TYPES
    for i in range(L):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = norm()
        # q/k a bit larger so that attention is sharp and rotary errors are visible
        w[p + "self_attn.q_proj.weight"] = 2.0 * lin(nh * hd, H)
        w[p + "self_attn.k_proj.weight"] = 2.0 * lin(nkv * hd, H)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * hd, H)
        w[p + "self_attn.o_proj.weight"] = lin(H, nh * hd)
        if flavor in ("qwen2", "qwen2_moe"):  # q, k, v biases
            w[p + "self_attn.q_proj.bias"] = 0.5 * rng.standard_normal(nh * hd)
            w[p + "self_attn.k_proj.bias"] = 0.5 * rng.standard_normal(nkv * hd)
            w[p + "self_attn.v_proj.bias"] = 0.5 * rng.standard_normal(nkv * hd)
        if flavor == "qwen3":  # RMSNorm weights over each head's features
            w[p + "self_attn.q_norm.weight"] = 1.0 + 0.1 * rng.standard_normal(hd)
            w[p + "self_attn.k_norm.weight"] = 1.0 + 0.1 * rng.standard_normal(hd)
        if flavor == "qwen3_moe":
            w[p + "self_attn.q_norm.weight"] = 1.0 + 0.1 * rng.standard_normal(hd)
            w[p + "self_attn.k_norm.weight"] = 1.0 + 0.1 * rng.standard_normal(hd)
        if flavor in ("olmoe", "minimax_m2"):
            w[p + "self_attn.q_norm.weight"] = 1.0 + 0.1 * rng.standard_normal(nh * hd)
            w[p + "self_attn.k_norm.weight"] = 1.0 + 0.1 * rng.standard_normal(nkv * hd)
        if flavor == "olmo2":  # RMSNorm weights over the whole q and k projections; post-norms only
            w[p + "self_attn.q_norm.weight"] = 1.0 + 0.1 * rng.standard_normal(nh * hd)
            w[p + "self_attn.k_norm.weight"] = 1.0 + 0.1 * rng.standard_normal(nkv * hd)
            del w[p + "input_layernorm.weight"]
            w[p + "post_feedforward_layernorm.weight"] = norm()
        w[p + "post_attention_layernorm.weight"] = norm()
        if moe:  # a router scaled so that the experts' probabilities differ well (no near ties)
            E = cfg.get("num_local_experts") or cfg["num_experts"]
            F = cfg.get("moe_intermediate_size") or I
            blk, names = ("block_sparse_moe.", ("w1", "w3", "w2")) if flavor in ("mixtral", "minimax_m2") else \
                ("mlp.", ("gate_proj", "up_proj", "down_proj"))
            w[p + blk + "gate.weight"] = 3.0 * lin(E, H)
            if flavor == "minimax_m2":  # of the sigmoid scores' size: it changes which experts win
                w[p + blk + "e_score_correction_bias"] = 0.3 * rng.standard_normal(E)
            for e in range(E):
                q = p + blk + "experts.%d." % e
                w[q + names[0] + ".weight"] = lin(F, H)
                w[q + names[1] + ".weight"] = lin(F, H)
                w[q + names[2] + ".weight"] = lin(H, F)
            if flavor == "qwen2_moe":
                S = cfg["shared_expert_intermediate_size"]
                w[p + "mlp.shared_expert.gate_proj.weight"] = lin(S, H)
                w[p + "mlp.shared_expert.up_proj.weight"] = lin(S, H)
                w[p + "mlp.shared_expert.down_proj.weight"] = lin(H, S)
                w[p + "mlp.shared_expert_gate.weight"] = lin(1, H)
            continue
        w[p + "mlp.gate_proj.weight"] = lin(I, H)
        w[p + "mlp.up_proj.weight"] = lin(I, H)
        w[p + "mlp.down_proj.weight"] = lin(H, I)
    w["model.norm.weight"] = norm()
    if not cfg.get("tie_word_embeddings"):
        w["lm_head.weight"] = 0.5 * rng.standard_normal((V, H))
    return w


# --------------------------------------------------------------------------- dtype rounding

def to_bf16_bits(a):
    """float64/float32 array -> uint16 bf16 bits, round-to-nearest-even from float32 bits."""
    f = np.ascontiguousarray(a, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)  # keep NaN quiet
    return rounded


def from_bf16_bits(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def encode(a, dtype):
    """Array -> raw little-endian bytes in the safetensors dtype."""
    if dtype == "f32":
        return np.ascontiguousarray(a, dtype="<f4").tobytes()
    if dtype == "f16":
        return np.ascontiguousarray(a, dtype="<f2").tobytes()
    if dtype == "bf16":
        return to_bf16_bits(a).astype("<u2").tobytes()
    raise ValueError(dtype)


def round_weights(w, dtype):
    """The float64 values the checkpoint actually holds after conversion to `dtype`."""
    out = {}
    for k, a in w.items():
        if dtype == "f32":
            out[k] = a.astype(np.float32).astype(np.float64)
        elif dtype == "f16":
            out[k] = a.astype(np.float32).astype(np.float16).astype(np.float64)
        elif dtype == "bf16":
            out[k] = from_bf16_bits(to_bf16_bits(a)).astype(np.float64)
        else:
            raise ValueError(dtype)
    return out


# --------------------------------------------------------------------------- safetensors

def write_safetensors(path, tensors, dtype):
    """tensors: {name: array}. Header JSON padded with spaces to a multiple of 8 bytes."""
    names = sorted(tensors)
    header, blobs, off = {}, [], 0
    for n in names:
        data = encode(tensors[n], dtype)
        header[n] = {"dtype": DTYPES[dtype], "shape": list(tensors[n].shape),
                     "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = {"format": "pt"}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    return off


def read_safetensors(path):
    """Minimal reader (for self-checks): {name: float64 array}."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf = raw[base + b:base + e]
        dt = info["dtype"]
        if dt == "F32":
            a = np.frombuffer(buf, dtype="<f4")
        elif dt == "F16":
            a = np.frombuffer(buf, dtype="<f2")
        elif dt == "BF16":
            a = from_bf16_bits(np.frombuffer(buf, dtype="<u2"))
        else:
            raise ValueError("unsupported dtype %s" % dt)
        out[name] = a.astype(np.float64).reshape(info["shape"])
    return out


def shard_plan(names, n_shards):
    """Split names (in model order) into n_shards contiguous groups of similar count."""
    groups = [[] for _ in range(n_shards)]
    for i, nm in enumerate(names):
        groups[min(i * n_shards // len(names), n_shards - 1)].append(nm)
    return groups


def write_checkpoint(out, cfg, w, dtype, n_shards):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    for stale in os.listdir(out):  # don't leave a mix of layouts behind
        if stale.startswith("model") and (stale.endswith(".safetensors") or stale.endswith(".index.json")):
            os.remove(os.path.join(out, stale))
    if n_shards <= 1:
        write_safetensors(os.path.join(out, "model.safetensors"), w, dtype)
        return
    names = list(w)  # insertion order = model order
    weight_map, total = {}, 0
    for i, group in enumerate(shard_plan(names, n_shards)):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, n_shards)
        total += write_safetensors(os.path.join(out, fn), {n: w[n] for n in group}, dtype)
        for n in group:
            weight_map[n] = fn
    index = {"metadata": {"total_size": total},
             "weight_map": {n: weight_map[n] for n in sorted(weight_map)}}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


# --------------------------------------------------------------------------- forward passes

def _softmax_causal(scores, window=0):
    """scores (..., T, T); mask j > i (and i - j >= window when window > 0); row softmax in float64."""
    T = scores.shape[-1]
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    if window:
        mask |= np.tril(np.ones((T, T), dtype=bool), k=-window)
    s = np.where(mask, -np.inf, scores)
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def _layernorm(x, g, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)  # biased variance, as torch
    return (x - mu) / np.sqrt(var + eps) * g + b


def _gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gpt2_forward(cfg, w, tokens, prefix="transformer."):
    """GPT2LMHeadModel forward (eval mode), float64. Returns logits (T, vocab)."""
    E, nh, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd = E // nh
    T = len(tokens)
    if T > cfg["n_positions"]:
        raise ValueError("sequence longer than n_positions")
    P = prefix
    x = w[P + "wte.weight"][tokens] + w[P + "wpe.weight"][np.arange(T)]
    for i in range(cfg["n_layer"]):
        p = P + "h.%d." % i
        h = _layernorm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]  # Conv1D
        q, k, v = qkv[:, :E], qkv[:, E:2 * E], qkv[:, 2 * E:]
        q = q.reshape(T, nh, hd).transpose(1, 0, 2)  # (nh, T, hd)
        k = k.reshape(T, nh, hd).transpose(1, 0, 2)
        v = v.reshape(T, nh, hd).transpose(1, 0, 2)
        att = _softmax_causal(q @ k.transpose(0, 2, 1) / math.sqrt(hd))
        a = (att @ v).transpose(1, 0, 2).reshape(T, E)
        x = x + a @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = _layernorm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = _gelu_new(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = _layernorm(x, w[P + "ln_f.weight"], w[P + "ln_f.bias"], eps)
    return x @ w[P + "wte.weight"].T  # tied lm_head


def _rmsnorm(x, g, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * g


def _rotate_half(x):
    d = x.shape[-1] // 2
    return np.concatenate([-x[..., d:], x[..., :d]], axis=-1)


def scaled_inv_freq(cfg, inv_freq, dim, theta):
    """transformers' rope scalings (modeling_rope_utils: _compute_linear_scaling_rope_parameters,
    _compute_llama3_parameters, _compute_yarn_parameters), in float64. Returns (inv_freq, the
    attention factor that multiplies cos and sin)."""
    rs = cfg.get("rope_scaling")
    if not rs or rs.get("rope_type", rs.get("type")) in (None, "default"):
        return inv_freq, 1.0
    kind, factor = rs.get("rope_type", rs.get("type")), rs.get("factor")
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        low, high, old = rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv_freq
        out = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, out), 1.0
    if kind == "yarn":
        orig = rs.get("original_max_position_embeddings")
        if orig:
            factor = cfg["max_position_embeddings"] / orig
        else:
            orig = cfg["max_position_embeddings"]
        att = rs.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
        bf, bs = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

        def corr_dim(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))
        lo, hi = corr_dim(bf), corr_dim(bs)
        if rs.get("truncate", True):  # GPT-OSS sets it false: the ramp's ends stay fractional
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
        extra = 1 - ramp
        pos_freqs = theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        return (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra, att
    if kind == "dynamic":  # _compute_dynamic_ntk_parameters at the longest sequence the model sees
        seq = max(cfg.get("_seq_len", 0), cfg["max_position_embeddings"])
        base = theta * ((factor * seq / cfg["max_position_embeddings"]) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim), 1.0
    if kind in ("longrope", "su"):  # _compute_longrope_parameters, a sequence within the original context
        orig = cfg.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        factor = cfg["max_position_embeddings"] / orig
        att = rs.get("attention_factor") or (1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig)))
        ext = np.array(rs["short_factor"], dtype=np.float64)
        return 1.0 / (ext * theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)), att
    raise ValueError(kind)


def llama_rope_tables(hd, T, theta, cfg=None):
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)   # (hd/2,)
    att = 1.0
    if cfg is not None:
        inv_freq, att = scaled_inv_freq(cfg, inv_freq, hd, theta)
    freqs = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]      # (T, hd/2)
    emb = np.concatenate([freqs, freqs], axis=-1)                             # (T, hd)
    return np.cos(emb) * att, np.sin(emb) * att


def moe_mlp(cfg, w, p, h):
    """A mixture of experts' MLP as transformers' Mixtral / Qwen3Moe / Olmoe sparse blocks, float64:
    softmax over the router's logits, the top k (lower index first on a tie), optionally
    renormalised; the chosen experts' SwiGLU outputs weighted and summed."""
    minimax = cfg["model_type"] == "minimax_m2"
    mixtral = cfg["model_type"] == "mixtral" or minimax
    E = cfg.get("num_local_experts") or cfg["num_experts"]
    k = cfg["num_experts_per_tok"]
    blk, names = ("block_sparse_moe.", ("w1", "w3", "w2")) if mixtral else ("mlp.", ("gate_proj", "up_proj", "down_proj"))
    z = h @ w[p + blk + "gate.weight"].T
    if minimax:  # MiniMax-M2: sigmoid scores; the top k by score + e_score_correction_bias, weighted by score
        prob = 1.0 / (1.0 + np.exp(-z))
        choice = prob + w.get(p + blk + "e_score_correction_bias", np.zeros(E))
    else:
        z = np.exp(z - z.max(axis=-1, keepdims=True))
        prob = choice = z / z.sum(axis=-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = sorted(range(E), key=lambda e: (-choice[t, e], e))[:k]
        wt = prob[t, top] / (prob[t, top].sum() if (mixtral or cfg.get("norm_topk_prob")) else 1.0)
        for e, we in zip(top, wt):
            q = p + blk + "experts.%d." % e
            g, u = h[t] @ w[q + names[0] + ".weight"].T, h[t] @ w[q + names[1] + ".weight"].T
            out[t] += we * (((g / (1.0 + np.exp(-g))) * u) @ w[q + names[2] + ".weight"].T)
    if p + "mlp.shared_expert_gate.weight" in w:  # Qwen 2 MoE: sigmoid(h g^T) * shared(h), every token
        q = p + "mlp.shared_expert."
        g, u = h @ w[q + "gate_proj.weight"].T, h @ w[q + "up_proj.weight"].T
        shared = ((g / (1.0 + np.exp(-g))) * u) @ w[q + "down_proj.weight"].T
        out += shared / (1.0 + np.exp(-(h @ w[p + "mlp.shared_expert_gate.weight"].T)))
    return out


def llama_forward(cfg, w, tokens, hidden=False):
    """LlamaForCausalLM forward, float64 (and its relatives: Mistral, Qwen 2/3, Phi-3, the mixtures
    of experts Mixtral, Qwen 3 MoE, OLMoE). Returns logits (T, vocab), or with hidden the final
    hidden states after the final norm (T, d)."""
    H = cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    T = len(tokens)
    rot = cfg.get("rotary_dim") or int(hd * cfg.get("partial_rotary_factor", 1.0))  # the first rot features rotate
    cos, sin = llama_rope_tables(rot, T, theta, cfg)
    window = cfg.get("sliding_window") or 0 if cfg["model_type"] in ("phi3", "mistral") else 0

    def rope(x):
        return np.concatenate([x[..., :rot] * cos + _rotate_half(x[..., :rot]) * sin, x[..., rot:]], axis=-1)
    n_rep = nh // nkv
    x = w["model.embed_tokens.weight"][tokens].copy()
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = _rmsnorm(x, w[p + "input_layernorm.weight"], eps)
        def proj(name, n, norm=None):  # (heads, T, hd), with the projection's bias when the model has one
            y = h @ w[p + name + ".weight"].T
            if p + name + ".bias" in w:
                y = y + w[p + name + ".bias"]
            if norm is not None:  # OLMoE: RMSNorm over the whole projection
                y = _rmsnorm(y, w[norm], eps)
            return y.reshape(T, n, hd).transpose(1, 0, 2)
        full = cfg["model_type"] in ("olmoe", "minimax_m2")
        q = proj("self_attn.q_proj", nh, p + "self_attn.q_norm.weight" if full else None)
        k = proj("self_attn.k_proj", nkv, p + "self_attn.k_norm.weight" if full else None)
        v = proj("self_attn.v_proj", nkv)
        if p + "self_attn.q_norm.weight" in w and not full:  # Qwen3: RMSNorm of each head, before rotary
            q = _rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = _rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q), rope(k)
        k = np.repeat(k, n_rep, axis=0)  # repeat_kv: query head h uses kv head h // n_rep
        v = np.repeat(v, n_rep, axis=0)
        att = _softmax_causal(q @ k.transpose(0, 2, 1) / math.sqrt(hd), window)
        a = (att @ v).transpose(1, 0, 2).reshape(T, nh * hd)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = _rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        if cfg["model_type"] in MOE_TYPES:
            x = x + moe_mlp(cfg, w, p, h)
            continue
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1.0 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
    x = _rmsnorm(x, w["model.norm.weight"], eps)
    if hidden:
        return x
    lm = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ lm.T


def greedy(forward_fn, cfg, w, prompt, steps, top=5):
    """Greedy decode with full recompute (argmax, lowest id on ties).
    Returns (ids, margins top1-top2 per step, [(top ids, top logits)] per step)."""
    ids, gen, margins, tops = list(prompt), [], [], []
    for _ in range(steps):
        lg = forward_fn(cfg, w, ids)[-1]
        order = np.argsort(-lg, kind="stable")
        gen.append(int(order[0]))
        margins.append(float(lg[order[0]] - lg[order[1]]))
        tops.append(([int(t) for t in order[:top]], [float(lg[t]) for t in order[:top]]))
        ids.append(int(order[0]))
    return gen, margins, tops


def _margins(logits):
    s = np.sort(logits, axis=-1)
    return [float(v) for v in s[:, -1] - s[:, -2]]


# --------------------------------------------------------------------------- main

def make(model, out, seed=0, dtype="f32", shards=1, no_prefix=False, vocab=None, kv_heads=None, rope_scaling=None,
         peft_lora=False):
    if model == "gpt2":
        cfg = gpt2_config(dtype)
        if vocab:
            cfg["vocab_size"] = vocab
        w = init_gpt2(cfg, seed)
    elif model == "gemma2":
        cfg = families.gemma2_config(dtype)
        w = families.init_gemma2(cfg, seed)
    elif model == "gpt_oss":
        cfg = gpt_oss_ref.gpt_oss_config(dtype)
        if vocab:
            cfg["vocab_size"] = vocab
        w = gpt_oss_ref.init_gpt_oss(cfg, seed)
    elif model == "glm4_moe":
        cfg = glm_ref.config(dtype)
        w = glm_ref.init(cfg, seed)
    elif model in ("llama", "qwen2", "qwen3", "phi3", "mistral", "olmo2") + MOE_TYPES:
        configs = {"llama": llama_config, "phi3": phi3_config, "mistral": mistral_config, "olmo2": families.olmo2_config}
        configs.update({t: (lambda dt, t=t: moe_config(t, dt)) for t in MOE_TYPES})
        cfg = configs[model](dtype) if model in configs else qwen_config(model, dtype)
        if vocab:
            cfg["vocab_size"] = vocab
        if kv_heads:
            cfg["num_key_value_heads"] = kv_heads
        if rope_scaling:
            cfg["rope_scaling"] = rope_scaling
        w = init_llama(cfg, seed)
    else:
        raise ValueError(model)
    w = round_weights(w, dtype)  # the reference uses exactly what is stored
    if model == "gpt2":
        fwd = gpt2_forward
    elif model == "gemma2":
        fwd = families.gemma2_forward
    elif model == "olmo2":
        fwd = families.olmo2_forward
    elif model == "minimax_m2":
        fwd = llama_forward
        # The selection bias must matter: without it the prompt's logits move by over 10 % of their range.
        nob = {n: (np.zeros_like(v) if n.endswith("e_score_correction_bias") else v) for n, v in w.items()}
        a, b = llama_forward(cfg, w, PROMPT_IDS), llama_forward(cfg, nob, PROMPT_IDS)
        assert np.abs(a - b).max() > 0.1 * (a.max() - a.min()), "the selection bias changes too little"
    elif model == "glm4_moe":
        fwd = glm_ref.forward
        glm_ref.check_variants(cfg, w, PROMPT_IDS)  # each of GLM's choices moves the logits
    elif model == "gpt_oss":
        fwd = gpt_oss_ref.gpt_oss_forward
        # Every time the golden is made: the prompt reaches the clamps and the router bias, and
        # each nearby mistake (gpt_oss_ref.VARIANTS) moves the logits well past the tests' tolerance.
        gpt_oss_ref.check_variants(cfg, w, PROMPT_IDS)
    else:
        fwd = llama_forward
    adapter = None
    if peft_lora:  # the reference computes with the adapter merged in float64; the file keeps it apart
        adapter = phi3_peft_adapter(cfg, w, seed + 1000)
        fw = adapter[2]
    else:
        fw = w
    logits = fwd(cfg, fw, PROMPT_IDS)
    gen, margins, tops = greedy(fwd, cfg, fw, PROMPT_IDS, GREEDY_STEPS)
    if model == "gpt2" and no_prefix:
        w = {k[len("transformer."):]: v for k, v in w.items()}
    if model == "phi3":
        w = fuse_phi3(cfg, w)
    write_checkpoint(out, cfg, w, dtype, shards)
    if adapter is not None:
        os.makedirs(os.path.join(out, "adapter"), exist_ok=True)
        with open(os.path.join(out, "adapter", "adapter_config.json"), "w") as f:
            json.dump(adapter[0], f, indent=2)
        write_safetensors(os.path.join(out, "adapter", "adapter_model.safetensors"), adapter[1], "f32")
    ref = {
        "model_type": model,
        "dtype": dtype,
        "seed": seed,
        "prompt_ids": PROMPT_IDS,
        "logits": [[float(v) for v in row] for row in logits],
        "greedy_ids": gen,
        "greedy_margins": margins,
        "greedy_top_ids": [t[0] for t in tops],
        "greedy_top_logits": [t[1] for t in tops],
        "prompt_margins": _margins(logits),
    }
    if adapter is not None:
        ref["adapter"] = "adapter"  # the logits and greedy ids are those of the base with this adapter
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f)
        f.write("\n")
    return ref


def main(argv=None):
    ap = argparse.ArgumentParser(description="write a small random HF checkpoint + float64 reference")
    ap.add_argument("model", choices=["gpt2", "llama", "qwen2", "qwen3", "phi3", "mistral", "gemma2", "olmo2", "mixtral",
                                         "qwen2_moe", "qwen3_moe", "olmoe", "minimax_m2", "gpt_oss", "glm4_moe"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=list(DTYPES), default="f32")
    ap.add_argument("--shards", type=int, default=1, help="number of safetensors files (default 1)")
    ap.add_argument("--no-prefix", action="store_true",
                    help="gpt2 only: tensor names without 'transformer.' (original gpt2 layout)")
    ap.add_argument("--vocab", type=int, default=None,
                    help="vocabulary size (default 512; odd sizes exercise vocab-parallel padding)")
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="llama only: KV heads (default 4; 1 = MQA, so tp 2 replicates KV heads)")
    ap.add_argument("--rope-scaling", default=None,
                    help="llama family: a rope_scaling object as JSON (linear, llama3, yarn)")
    ap.add_argument("--peft-lora", action="store_true",
                    help="phi3 only: also write OUT/adapter, a PEFT LoRA adapter in Phi-3's fused module names "
                         "(qkv_proj, gate_up_proj), and make the reference that of the adapted model")
    a = ap.parse_args(argv)
    if a.peft_lora and a.model != "phi3":
        ap.error("--peft-lora applies to phi3 only")
    if a.vocab is not None and not (max(PROMPT_IDS) < a.vocab <= 512):
        ap.error("--vocab must be in (%d, 512]" % max(PROMPT_IDS))
    if a.shards < 1:
        ap.error("--shards must be >= 1")
    if a.no_prefix and a.model != "gpt2":
        ap.error("--no-prefix applies to gpt2 only")
    ref = make(a.model, a.out, a.seed, a.dtype, a.shards, a.no_prefix, a.vocab, a.kv_heads,
               json.loads(a.rope_scaling) if a.rope_scaling else None, a.peft_lora)
    print("%s: wrote %s (dtype %s, seed %d); greedy %s; min margin %.4g"
          % (a.model, a.out, a.dtype, a.seed, ref["greedy_ids"], min(ref["greedy_margins"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

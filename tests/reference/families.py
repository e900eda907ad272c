"""tests/reference/families.py - float64 references of the families added after the first ones
(tests/reference/make_models.py keeps Llama, GPT-2 and their relatives): Gemma 2 (soft-capping,
alternating windows) and OLMo 2 (post-norms only, whole-projection QK norm). Written only for
the tests, from transformers' modeling files; never from shardlm.
"""
import math

import numpy as np

import make_models as MM  # noqa: E402  (helpers; make_models imports this module too)


def gemma2_config(dtype="f32"):
    """Gemma2ForCausalLM, small: every other layer windowed (Gemma2Config's own rule, no pattern
    field), soft-capping small enough that tanh bends the scores and the logits."""
    return {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "query_pre_attn_scalar": 16,  # = head_dim, as llama.cpp assumes for a GGUF
        "sliding_window": 5,
        "final_logit_softcapping": 6.0,
        "attn_logit_softcapping": 3.0,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "torch_dtype": MM.TORCH_DTYPE[dtype],
    }


def olmo2_config(dtype="f32"):
    """Olmo2ForCausalLM, small: norms after attention and the MLP only, q and k RMS-normed over the
    whole projection before rotary."""
    cfg = MM.llama_config(dtype)
    cfg.update({"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "rms_norm_eps": 1e-6,
                "rope_theta": 500000.0})
    return cfg


def init_gemma2(cfg, seed):
    rng = np.random.default_rng(seed)
    H, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def lin(o, i):
        return rng.standard_normal((o, i)) / math.sqrt(i)

    def nw(n):  # Gemma stores w for x * (1 + w)
        return 0.1 * rng.standard_normal(n)

    # Small embeddings and post-norms that double their block's output, so that the layers, not
    # the (scaled, tied) embedding of the last token, decide the next token.
    w = {"model.embed_tokens.weight": 0.1 * rng.standard_normal((V, H)), "model.norm.weight": nw(H)}
    for i in range(L):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = nw(H)
        w[p + "self_attn.q_proj.weight"] = 2.0 * lin(nh * hd, H)
        w[p + "self_attn.k_proj.weight"] = 2.0 * lin(nkv * hd, H)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * hd, H)
        w[p + "self_attn.o_proj.weight"] = lin(H, nh * hd)
        w[p + "post_attention_layernorm.weight"] = 1.0 + nw(H)
        w[p + "pre_feedforward_layernorm.weight"] = nw(H)
        w[p + "post_feedforward_layernorm.weight"] = 1.0 + nw(H)
        w[p + "mlp.gate_proj.weight"] = lin(I, H)
        w[p + "mlp.up_proj.weight"] = lin(I, H)
        w[p + "mlp.down_proj.weight"] = lin(H, I)
    return w


def gemma2_forward(cfg, w, tokens, hidden=False):
    """Gemma2ForCausalLM forward (eval), float64, as transformers' modeling_gemma2: embeddings times
    sqrt(hidden); norms x * (1 + w); scores (q / sqrt(query_pre_attn_scalar)) . k soft-capped,
    cap * tanh(s / cap), then masked (layer i windowed when i is even); sandwich norms; GeGLU;
    the final logits soft-capped. Returns logits (T, vocab), or with hidden the final normed hidden
    states (T, hidden_size) the LM head reads."""
    H, eps, theta = cfg["hidden_size"], cfg["rms_norm_eps"], cfg["rope_theta"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    T = len(tokens)
    cos, sin = MM.llama_rope_tables(hd, T, theta)
    acap, fcap = cfg["attn_logit_softcapping"], cfg["final_logit_softcapping"]

    def norm(x, key):
        return MM._rmsnorm(x, 1.0 + w[key], eps)

    def rope(x):
        return x * cos + MM._rotate_half(x) * sin
    x = w["model.embed_tokens.weight"][tokens] * math.sqrt(H)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = norm(x, p + "input_layernorm.weight")
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, nh, hd).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, hd).transpose(1, 0, 2)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)
        s = (q @ k.transpose(0, 2, 1)) / math.sqrt(cfg["query_pre_attn_scalar"])
        if acap:
            s = acap * np.tanh(s / acap)
        window = cfg["sliding_window"] if i % 2 == 0 else 0
        a = (MM._softmax_causal(s, window) @ v).transpose(1, 0, 2).reshape(T, nh * hd)
        x = x + norm(a @ w[p + "self_attn.o_proj.weight"].T, p + "post_attention_layernorm.weight")
        h = norm(x, p + "pre_feedforward_layernorm.weight")
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + norm((MM._gelu_new(g) * u) @ w[p + "mlp.down_proj.weight"].T, p + "post_feedforward_layernorm.weight")
    x = norm(x, "model.norm.weight")
    if hidden:
        return x
    logits = x @ w["model.embed_tokens.weight"].T
    return fcap * np.tanh(logits / fcap) if fcap else logits


def olmo2_forward(cfg, w, tokens):
    """Olmo2ForCausalLM forward (transformers' modeling_olmo2), float64: q and k RMS-normed over the
    whole projection, then rotary (halves); attention; post_attention_layernorm on its output
    before the residual add; the MLP, then post_feedforward_layernorm before the add; no norm
    before either block. Returns logits (T, vocab)."""
    H, eps, theta = cfg["hidden_size"], cfg["rms_norm_eps"], cfg["rope_theta"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    T = len(tokens)
    cos, sin = MM.llama_rope_tables(hd, T, theta)

    def rope(x):
        return x * cos + MM._rotate_half(x) * sin
    x = w["model.embed_tokens.weight"][tokens].copy()
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        q = MM._rmsnorm(x @ w[p + "self_attn.q_proj.weight"].T, w[p + "self_attn.q_norm.weight"], eps)
        k = MM._rmsnorm(x @ w[p + "self_attn.k_proj.weight"].T, w[p + "self_attn.k_norm.weight"], eps)
        v = x @ w[p + "self_attn.v_proj.weight"].T
        q = rope(q.reshape(T, nh, hd).transpose(1, 0, 2))
        k = rope(k.reshape(T, nkv, hd).transpose(1, 0, 2))
        v = v.reshape(T, nkv, hd).transpose(1, 0, 2)
        k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)
        a = (MM._softmax_causal(q @ k.transpose(0, 2, 1) / math.sqrt(hd)) @ v).transpose(1, 0, 2).reshape(T, nh * hd)
        x = x + MM._rmsnorm(a @ w[p + "self_attn.o_proj.weight"].T, w[p + "post_attention_layernorm.weight"], eps)
        g, u = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        m = ((g / (1.0 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
        x = x + MM._rmsnorm(m, w[p + "post_feedforward_layernorm.weight"], eps)
    x = MM._rmsnorm(x, w["model.norm.weight"], eps)
    lm = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ lm.T

"""tests/reference/gpt_oss_ref.py - a float64 NumPy reference of OpenAI's GPT-OSS
(transformers' GptOssForCausalLM, modeling_gpt_oss.py): config, random weights in the Hugging
Face layout, the forward pass, and the self-checks that make sure the golden can tell each of
GPT-OSS's particular choices apart from its nearest mistake. Written only for the tests, from
transformers' modelling code; never from shardlm. Not here: the safetensors writing, the
greedy decode and reference.json (make_models.py, `make("gpt_oss", ...)`), GGUF files.
Used by tests/golden_setup.sh (OUT/gpt_oss).

The model, per layer l (x: (T, d)):
  h = rmsnorm(x, input_layernorm)                     w * x / sqrt(mean(x^2) + eps), no +1
  q = h Wq^T + bq (T, n_heads, hd); k, v = h Wk^T + bk, h Wv^T + bv (T, n_kv_heads, hd)
  q, k = rope(q), rope(k)      rotate_half ("halves") on all hd features, YaRN on every layer;
                               cos and sin multiplied by YaRN's attention factor
  s[h, i, j] = q[i, h] . k[j, h // (n_heads / n_kv_heads)] / sqrt(hd); visible iff j <= i and,
      when layer_types[l] == "sliding_attention", i - j < sliding_window
  p[h, i, j] = e^(s_ij - m) / (sum_j' e^(s_ij' - m) + e^(S_h - m))   (the sink S_h, unscaled)
  x = x + (p v) Wo^T + bo
  h = rmsnorm(x, post_attention_layernorm)
  z = h Wr^T + br (T, E); the top k of z (lower index first on a tie); w = softmax of those k
  for each chosen expert e: gu = h gate_up_proj[e] + gate_up_proj_bias[e]   ((d, 2F): in, out)
      gate = min(gu[0::2], limit); up = clip(gu[1::2], -limit, limit)
      y_e = (gate * sigmoid(1.702 gate) * (up + 1)) down_proj[e] + down_proj_bias[e]  ((F, d))
  x = x + sum_k w_k y_k
logits = rmsnorm(x, model.norm) lm_head^T (untied, no bias, no soft-cap).
"""
import math

import numpy as np

import make_models as MM  # noqa: E402  (helpers; make_models imports this module too)

ALPHA = 1.702  # GptOssExperts.alpha, fixed in transformers (not in the config)

# The wrong turns a C implementation could take, each a flag of gpt_oss_forward's `variant`.
# check_variants asserts that every one of them moves the prompt's logits well beyond the
# golden test's tolerance, so that the golden can tell the right forward from each.
VARIANTS = (
    "no_sinks",            # the attention sinks dropped (a plain causal softmax)
    "window_odd",          # the sliding window on the odd layers instead of the even ones
    "yarn_truncate",       # YaRN's correction range floored / ceiled (rope_scaling truncate true)
    "no_gate_clamp",       # gate not clamped at swiglu_limit
    "no_up_clamp",         # up not clipped to [-swiglu_limit, swiglu_limit]
    "no_up_plus_one",      # (up + 1) taken as up
    "swap_interleave",     # gate = gu[1::2], up = gu[0::2]
    "no_router_bias",      # the router's bias dropped
    "topk_full_softmax",   # top-k weights from the softmax over all experts, not renormalised
    "no_gate_up_bias",     # the experts' gate_up_proj_bias dropped
    "no_down_bias",        # the experts' down_proj_bias dropped
    "no_o_bias",           # o_proj's bias dropped
)
CHECK_REL = 1e-2  # each variant must move max|logits| by at least this fraction (10x the tests' 1e-3)


def gpt_oss_config(dtype="f32"):
    """GptOssForCausalLM, small: head_dim 16 with 4 heads on hidden 64 (explicit, not hidden /
    heads), GQA 4/2, layers 0 and 2 windowed (window 4, shorter than the prompt), YaRN as GPT-OSS
    ships it (factor 32, truncate false) on an original context of 512, 4 experts top 2."""
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "sliding_window": 4,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "experts_per_token": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 16384,  # = factor * original_max_position_embeddings
        "initial_context_length": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 512,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
        "attention_bias": True,
        "attention_dropout": 0.0,
        "swiglu_limit": 7.0,
        "router_aux_loss_coef": 0.9,
        "output_router_logits": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "torch_dtype": MM.TORCH_DTYPE[dtype],
    }


def init_gpt_oss(cfg, seed):
    """Random weights in the HF layout (insertion order = model order). Scales as init_llama's
    (1/sqrt(fan_in), q and k doubled), plus: attention biases (std 0.5) and sinks (std 1) so that
    both matter; a router bias (std 1.5) half the router logits' size, so that it changes choices;
    expert gate_up weights (std 3/sqrt(d)) large enough that gate > limit and |up| > limit occur on
    the prompt; down projections scaled by 0.25 so that the experts' output stays the residual
    stream's size."""
    rng = np.random.default_rng(seed)
    H, F, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, nkv, hd, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["num_local_experts"]

    def lin(fan_out, fan_in):  # nn.Linear layout (out, in)
        return rng.standard_normal((fan_out, fan_in)) / math.sqrt(fan_in)

    def norm():
        return 1.0 + 0.1 * rng.standard_normal(H)

    w = {"model.embed_tokens.weight": rng.standard_normal((V, H))}
    for i in range(L):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = norm()
        w[p + "self_attn.q_proj.weight"] = 2.0 * lin(nh * hd, H)
        w[p + "self_attn.q_proj.bias"] = 0.5 * rng.standard_normal(nh * hd)
        w[p + "self_attn.k_proj.weight"] = 2.0 * lin(nkv * hd, H)
        w[p + "self_attn.k_proj.bias"] = 0.5 * rng.standard_normal(nkv * hd)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * hd, H)
        w[p + "self_attn.v_proj.bias"] = 0.5 * rng.standard_normal(nkv * hd)
        w[p + "self_attn.o_proj.weight"] = lin(H, nh * hd)
        w[p + "self_attn.o_proj.bias"] = 0.5 * rng.standard_normal(H)
        w[p + "self_attn.sinks"] = rng.standard_normal(nh)
        w[p + "post_attention_layernorm.weight"] = norm()
        w[p + "mlp.router.weight"] = 3.0 * lin(E, H)
        w[p + "mlp.router.bias"] = 1.5 * rng.standard_normal(E)
        w[p + "mlp.experts.gate_up_proj"] = 3.0 * rng.standard_normal((E, H, 2 * F)) / math.sqrt(H)  # (E, in, out)
        w[p + "mlp.experts.gate_up_proj_bias"] = 1.0 * rng.standard_normal((E, 2 * F))
        w[p + "mlp.experts.down_proj"] = 0.25 * rng.standard_normal((E, F, H)) / math.sqrt(F)  # (E, in, out)
        w[p + "mlp.experts.down_proj_bias"] = 0.5 * rng.standard_normal((E, H))
    w["model.norm.weight"] = norm()
    w["lm_head.weight"] = 0.5 * rng.standard_normal((V, H))
    return w


def _softmax_sink(s, sinks, window):
    """s (nh, T, T) scores, sinks (nh,) or None; causal mask (and i - j < window when window > 0);
    softmax over each row with the sink as one more column, that column dropped."""
    T = s.shape[-1]
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    if window:
        mask |= np.tril(np.ones((T, T), dtype=bool), k=-window)
    s = np.where(mask, -np.inf, s)
    m = s.max(axis=-1, keepdims=True)  # (nh, T, 1)
    if sinks is not None:
        m = np.maximum(m, sinks[:, None, None])
    e = np.exp(s - m)
    den = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        den = den + np.exp(sinks[:, None, None] - m)
    return e / den


def _experts(cfg, w, p, h, variant, stats):
    """GptOssMLP: router, top k, the chosen experts' clamped SwiGLU. h (T, d) -> (T, d)."""
    E, k, limit = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["swiglu_limit"]
    z0 = h @ w[p + "mlp.router.weight"].T  # (T, E)
    z = z0 if "no_router_bias" in variant else z0 + w[p + "mlp.router.bias"]
    gu_w, gu_b = w[p + "mlp.experts.gate_up_proj"], w[p + "mlp.experts.gate_up_proj_bias"]
    dn_w, dn_b = w[p + "mlp.experts.down_proj"], w[p + "mlp.experts.down_proj_bias"]
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = sorted(range(E), key=lambda e: (-z[t, e], e))[:k]
        if stats is not None:
            if sorted(top) != sorted(sorted(range(E), key=lambda e: (-z0[t, e], e))[:k]):
                stats["router_bias_changed"] += 1
            zs = np.sort(z[t])[::-1]
            stats["router_min_gap"] = min(stats["router_min_gap"], float(zs[k - 1] - zs[k]))
        if "topk_full_softmax" in variant:
            pr = np.exp(z[t] - z[t].max())
            wt = (pr / pr.sum())[top]
        else:
            zt = z[t, top]
            wt = np.exp(zt - zt.max())
            wt = wt / wt.sum()
        for e, we in zip(top, wt):
            gu = h[t] @ gu_w[e]  # (2F,)
            if "no_gate_up_bias" not in variant:
                gu = gu + gu_b[e]
            gate, up = (gu[1::2], gu[0::2]) if "swap_interleave" in variant else (gu[0::2], gu[1::2])
            if stats is not None:
                stats["gate_over_limit"] += int((gate > limit).sum())
                stats["up_over_limit"] += int((np.abs(up) > limit).sum())
            if "no_gate_clamp" not in variant:
                gate = np.minimum(gate, limit)
            if "no_up_clamp" not in variant:
                up = np.clip(up, -limit, limit)
            glu = gate / (1.0 + np.exp(-ALPHA * gate))
            a = glu * (up if "no_up_plus_one" in variant else up + 1.0)
            y = a @ dn_w[e]
            if "no_down_bias" not in variant:
                y = y + dn_b[e]
            out[t] += we * y
    return out


def gpt_oss_forward(cfg, w, tokens, variant=(), stats=None, hidden=False):
    """GptOssForCausalLM forward (eval), float64. Returns logits (T, vocab), or with hidden the
    final hidden states after the final norm (T, d): what embeddings pool. `variant` (names
    from VARIANTS) is for check_variants only. When stats is a dict, it receives counts over
    every expert evaluation: gate_over_limit, up_over_limit (before the clamps),
    router_bias_changed (tokens whose chosen set differs without the router's bias), and
    router_min_gap (the least z_k - z_k+1 over tokens and layers: how far the top-k choice is
    from a tie that float32 rounding could flip)."""
    H, eps, theta = cfg["hidden_size"], cfg["rms_norm_eps"], cfg["rope_theta"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    T = len(tokens)
    if "yarn_truncate" in variant:
        cfg = dict(cfg, rope_scaling=dict(cfg["rope_scaling"], truncate=True))
    cos, sin = MM.llama_rope_tables(hd, T, theta, cfg)  # (T, hd), YaRN's attention factor included
    if stats is not None:
        stats.update(gate_over_limit=0, up_over_limit=0, router_bias_changed=0, router_min_gap=math.inf)

    def rope(x):
        return x * cos + MM._rotate_half(x) * sin
    x = w["model.embed_tokens.weight"][tokens].copy()  # (T, d), not scaled
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        # x = x + o_proj(attention(rmsnorm(x)))
        h = MM._rmsnorm(x, w[p + "input_layernorm.weight"], eps)

        def proj(name, n):  # (heads, T, hd)
            y = h @ w[p + name + ".weight"].T + w[p + name + ".bias"]
            return y.reshape(T, n, hd).transpose(1, 0, 2)
        q, k, v = proj("self_attn.q_proj", nh), proj("self_attn.k_proj", nkv), proj("self_attn.v_proj", nkv)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)  # head h uses kv head h // 2
        sliding = cfg["layer_types"][i] == "sliding_attention"
        if "window_odd" in variant:
            sliding = not sliding
        window = cfg["sliding_window"] if sliding else 0
        sinks = None if "no_sinks" in variant else w[p + "self_attn.sinks"]
        att = _softmax_sink(q @ k.transpose(0, 2, 1) / math.sqrt(hd), sinks, window)  # (nh, T, T)
        a = (att @ v).transpose(1, 0, 2).reshape(T, nh * hd)
        o = a @ w[p + "self_attn.o_proj.weight"].T
        if "no_o_bias" not in variant:
            o = o + w[p + "self_attn.o_proj.bias"]
        x = x + o
        # x = x + moe(rmsnorm(x))
        h = MM._rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + _experts(cfg, w, p, h, variant, stats)
    x = MM._rmsnorm(x, w["model.norm.weight"], eps)
    return x if hidden else x @ w["lm_head.weight"].T


def check_variants(cfg, w, tokens):
    """Asserts that the prompt exercises the clamps and the router bias, and that each of
    VARIANTS changes the logits by more than CHECK_REL of their largest magnitude. Returns
    (stats, {variant: max |logits - variant's logits|})."""
    stats = {}
    ref = gpt_oss_forward(cfg, w, tokens, stats=stats)
    assert np.isfinite(ref).all(), "gpt_oss: non-finite logits"
    assert stats["gate_over_limit"] > 0, "gpt_oss: no gate value above swiglu_limit on the prompt"
    assert stats["up_over_limit"] > 0, "gpt_oss: no |up| above swiglu_limit on the prompt"
    assert stats["router_bias_changed"] > 0, "gpt_oss: the router bias changes no top-k choice on the prompt"
    scale = float(np.abs(ref).max())
    diffs = {}
    for var in VARIANTS:
        d = float(np.abs(gpt_oss_forward(cfg, w, tokens, variant=(var,)) - ref).max())
        diffs[var] = d
        assert d > CHECK_REL * scale, "gpt_oss: variant %s moves the logits by only %.3g (max |logit| %.3g)" % (
            var, d, scale)
    return stats, diffs

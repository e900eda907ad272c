"""tests/reference/glm_ref.py - a float64 NumPy reference of GLM-4.5 (transformers'
Glm4MoeForCausalLM, modeling_glm4_moe.py): config, random weights in the Hugging Face layout, the
forward pass, and the self-checks that make sure the golden can tell each of GLM's particular
choices from its nearest mistake. Written only for the tests, from transformers' modelling code;
never from shardlm. Not here: the safetensors writing, the greedy decode and reference.json
(make_models.py, `make("glm4_moe", ...)`). Used by tests/golden_setup.sh (OUT/glm4_moe).

The model, per layer l (x: (T, d)):
  h = rmsnorm(x, input_layernorm)
  q = h Wq^T + bq, k = h Wk^T + bk, v = h Wv^T + bv (attention_bias); with use_qk_norm an
      RMSNorm of each head's q and k
  q, k: rotate_half on the first hd * partial_rotary_factor features of each head, the rest as is
  x = x + attention(q, k, v) Wo^T                      (GQA, causal, 1/sqrt(hd), no o bias)
  h = rmsnorm(x, post_attention_layernorm)
  l < first_k_dense_replace:  x = x + down(silu(gate h) * up h)            (intermediate_size)
  otherwise (Glm4MoeMoE):
    s = sigmoid(h Wr^T) (E); c = s + e_score_correction_bias
    groups: c in n_group runs of E / n_group; each group's score the sum of its two best c; the
        topk_group best groups kept, every other expert's c set to 0 (masked_fill 0.0)
    the top k of c (lower index first on a tie); w = s of those, / (their sum + 1e-20) when
        norm_topk_prob, times routed_scaling_factor
    x = x + sum_k w_k expert_k(h) + shared_experts(h)   (shared: one MLP of n_shared_experts x
        moe_intermediate_size, added as it is)
logits = rmsnorm(x, model.norm) lm_head^T (untied).
The checkpoint also holds the next-token-prediction layer (num_nextn_predict_layers) as layer
num_hidden_layers, which transformers (and shardlm) do not load.
"""
import math

import numpy as np

import make_models as MM  # noqa: E402  (helpers; make_models imports this module too)

# The wrong turns a C implementation could take, each a flag of forward's `variant`; check_variants
# asserts that each moves the prompt's logits well beyond the golden's tolerance.
VARIANTS = (
    "no_groups",        # every expert eligible (group-limited choice ignored)
    "no_scale",         # routed_scaling_factor ignored
    "no_bias",          # the selection bias ignored
    "gated_shared",     # the shared experts behind a sigmoid gate of one (Qwen 2 MoE's, with gate 0)
    "all_sparse",       # the dense first layer read as sparse (its MLP dropped)
    "full_rotary",      # every feature of each head rotated
)


def config(dtype="f32"):
    cfg = MM.llama_config(dtype)
    cfg.update({
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
        "num_hidden_layers": 3, "intermediate_size": 96, "moe_intermediate_size": 24,
        "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "n_group": 4, "topk_group": 2, "partial_rotary_factor": 0.5, "attention_bias": True,
        "use_qk_norm": False, "num_nextn_predict_layers": 1, "rope_theta": 1000000.0,
        "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
    })
    return cfg


def init(cfg, seed):
    rng = np.random.default_rng(seed)
    H, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E, F, S = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["n_shared_experts"] * cfg["moe_intermediate_size"]

    def lin(fan_out, fan_in):
        return rng.standard_normal((fan_out, fan_in)) / math.sqrt(fan_in)

    def norm(n=H):
        return 1.0 + 0.1 * rng.standard_normal(n)

    w = {"model.embed_tokens.weight": rng.standard_normal((V, H))}
    for i in range(L + cfg.get("num_nextn_predict_layers", 0)):
        p = "model.layers.%d." % i
        if i >= L:  # the MTP layer: a few of its tensors, never read
            w[p + "eh_proj.weight"] = lin(H, 2 * H)
            w[p + "enorm.weight"] = norm()
            w[p + "hnorm.weight"] = norm()
            w[p + "input_layernorm.weight"] = norm()
            continue
        w[p + "input_layernorm.weight"] = norm()
        w[p + "self_attn.q_proj.weight"] = 2.0 * lin(nh * hd, H)
        w[p + "self_attn.k_proj.weight"] = 2.0 * lin(nkv * hd, H)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * hd, H)
        w[p + "self_attn.o_proj.weight"] = lin(H, nh * hd)
        w[p + "self_attn.q_proj.bias"] = 0.5 * rng.standard_normal(nh * hd)
        w[p + "self_attn.k_proj.bias"] = 0.5 * rng.standard_normal(nkv * hd)
        w[p + "self_attn.v_proj.bias"] = 0.5 * rng.standard_normal(nkv * hd)
        if cfg.get("use_qk_norm"):
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm()
        if i < cfg["first_k_dense_replace"]:
            w[p + "mlp.gate_proj.weight"] = lin(I, H)
            w[p + "mlp.up_proj.weight"] = lin(I, H)
            w[p + "mlp.down_proj.weight"] = lin(H, I)
            continue
        w[p + "mlp.gate.weight"] = 3.0 * lin(E, H)
        w[p + "mlp.gate.e_score_correction_bias"] = 0.3 * rng.standard_normal(E)
        for e in range(E):
            q = p + "mlp.experts.%d." % e
            w[q + "gate_proj.weight"] = lin(F, H)
            w[q + "up_proj.weight"] = lin(F, H)
            w[q + "down_proj.weight"] = lin(H, F)
        w[p + "mlp.shared_experts.gate_proj.weight"] = lin(S, H)
        w[p + "mlp.shared_experts.up_proj.weight"] = lin(S, H)
        w[p + "mlp.shared_experts.down_proj.weight"] = lin(H, S)
    w["model.norm.weight"] = norm()
    w["lm_head.weight"] = 0.5 * rng.standard_normal((V, H))
    return w


def _mlp(w, q, h):
    g, u = h @ w[q + "gate_proj.weight"].T, h @ w[q + "up_proj.weight"].T
    return ((g / (1.0 + np.exp(-g))) * u) @ w[q + "down_proj.weight"].T


def moe(cfg, w, p, h, variant=()):
    """Glm4MoeMoE: the router (Glm4MoeTopkRouter + route_tokens_to_experts), the experts, the shared experts."""
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    G, keep = cfg["n_group"], cfg["topk_group"]
    s = 1.0 / (1.0 + np.exp(-(h @ w[p + "mlp.gate.weight"].T)))
    bias = np.zeros(E) if "no_bias" in variant else w[p + "mlp.gate.e_score_correction_bias"]
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        c = s[t] + bias
        if G > 1 and "no_groups" not in variant:
            per = E // G
            gs = [sum(sorted(c[g * per:(g + 1) * per])[-2:]) for g in range(G)]
            kept = sorted(range(G), key=lambda g: (-gs[g], g))[:keep]
            c = np.array([c[e] if e // per in kept else 0.0 for e in range(E)])
        top = sorted(range(E), key=lambda e: (-c[e], e))[:k]
        wt = s[t, top]
        if cfg.get("norm_topk_prob", True):
            wt = wt / (wt.sum() + 1e-20)
        if "no_scale" not in variant:
            wt = wt * cfg.get("routed_scaling_factor", 1.0)
        for e, we in zip(top, wt):
            out[t] += we * _mlp(w, p + "mlp.experts.%d." % e, h[t])
    shared = _mlp(w, p + "mlp.shared_experts.", h)
    return out + (0.5 * shared if "gated_shared" in variant else shared)


def forward(cfg, w, tokens, variant=()):
    H, eps, theta = cfg["hidden_size"], cfg["rms_norm_eps"], cfg["rope_theta"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    T = len(tokens)
    rot = hd if "full_rotary" in variant else int(hd * cfg.get("partial_rotary_factor", 0.5))
    cos, sin = MM.llama_rope_tables(rot, T, theta)

    def rope(x):
        return np.concatenate([x[..., :rot] * cos + MM._rotate_half(x[..., :rot]) * sin, x[..., rot:]], axis=-1)

    x = w["model.embed_tokens.weight"][tokens].copy()
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = MM._rmsnorm(x, w[p + "input_layernorm.weight"], eps)

        def proj(name, n):
            y = h @ w[p + name + ".weight"].T + w[p + name + ".bias"]
            return y.reshape(T, n, hd).transpose(1, 0, 2)
        q, k, v = proj("self_attn.q_proj", nh), proj("self_attn.k_proj", nkv), proj("self_attn.v_proj", nkv)
        if cfg.get("use_qk_norm"):
            q = MM._rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = MM._rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)
        att = MM._softmax_causal(q @ k.transpose(0, 2, 1) / math.sqrt(hd))
        x = x + (att @ v).transpose(1, 0, 2).reshape(T, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = MM._rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
        if i < cfg["first_k_dense_replace"]:
            if "all_sparse" not in variant:
                x = x + _mlp(w, p + "mlp.", h)
            continue
        x = x + moe(cfg, w, p, h, variant)
    x = MM._rmsnorm(x, w["model.norm.weight"], eps)
    return x @ w["lm_head.weight"].T


def check_variants(cfg, w, tokens):
    """Each of VARIANTS moves the logits by more than 1 % of their range (the goldens' tolerance is
    far below), so the golden tells GLM's forward from each of those mistakes."""
    ref = forward(cfg, w, tokens)
    span = ref.max() - ref.min()
    for v in VARIANTS:
        d = np.abs(forward(cfg, w, tokens, (v,)) - ref).max()
        assert d > 0.01 * span, "glm_ref: variant %s moves the logits by only %.3g (range %.3g)" % (v, d, span)

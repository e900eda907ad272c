#!/usr/bin/env python3
"""Training gradients against JAX, an independent autodiff.

  python3 test_train_grad.py PATH/TO/test_train_grad [cpu|cuda]

For small random Llama (GQA, SwiGLU, untied head), GPT-2 (LayerNorm with biases, learned
positions, GELU, tied head) and Gemma 3 (QK norm, sandwich norms, GeGLU, embedding scale,
interleaved sliding-window layers with their own rotary base, tied head), Qwen 2 (q/k/v biases,
tied head) and Qwen 3 (per-head QK norm, head_dim 16 x 8 heads over hidden 64) checkpoints written
here, the C driver (tests/test_train_grad.c: model_forward_train + model_backward) computes
the loss and every weight gradient of a packed micro-batch (several documents, masked rows);
this file recomputes them with jax.grad of a float64 forward written here from the
definitions, from the same weights the driver loaded (the canonical (out, in) layout, so the
only thing shared with shardlm is which tensor is which). Checks: loss within 1e-5 relative,
every gradient tensor within 1e-4 relative (max-abs error over the tensor's max-abs value, or
1% of the model's largest gradient when that is larger; f32 in C), and
gradient accumulation: two micro-batches give twice the gradients of one.

Prints one line per check and "N passed, M failed"; exits 77 (SKIP) when jax is missing.
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "reference"))
sys.dont_write_bytecode = True

try:
    import jax
    import jax.numpy as jnp
except ImportError:
    print("SKIP: train_grad: jax is not installed (tools/install_deps.sh installs it)")
    sys.exit(77)
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")

import make_models as MM  # noqa: E402

N_PASS = 0
N_FAIL = 0


def check(ok, msg):
    global N_PASS, N_FAIL
    print(("PASS " if ok else "FAIL ") + msg, flush=True)
    if ok:
        N_PASS += 1
    else:
        N_FAIL += 1


# --------------------------------------------------------------------------- models

def gemma3_config():
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
        "vocab_size": 320, "hidden_size": 48, "intermediate_size": 96,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window": 4,
        "sliding_window_pattern": 3, "query_pre_attn_scalar": 16,
        "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
        "bos_token_id": 2, "eos_token_id": 1, "torch_dtype": "float32",
    }


def init_gemma3(cfg, seed):
    rng = np.random.default_rng(seed)
    H, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def lin(o, i):
        return rng.standard_normal((o, i)) / math.sqrt(i)

    def nw(n):  # Gemma stores w for x * (1 + w)
        return 0.1 * rng.standard_normal(n)

    w = {"model.embed_tokens.weight": 0.3 * rng.standard_normal((V, H)), "model.norm.weight": nw(H)}
    for i in range(L):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = nw(H)
        w[p + "self_attn.q_proj.weight"] = 2.0 * lin(nh * hd, H)
        w[p + "self_attn.k_proj.weight"] = 2.0 * lin(nkv * hd, H)
        w[p + "self_attn.v_proj.weight"] = lin(nkv * hd, H)
        w[p + "self_attn.o_proj.weight"] = lin(H, nh * hd)
        w[p + "self_attn.q_norm.weight"] = nw(hd)
        w[p + "self_attn.k_norm.weight"] = nw(hd)
        w[p + "post_attention_layernorm.weight"] = nw(H)
        w[p + "pre_feedforward_layernorm.weight"] = nw(H)
        w[p + "post_feedforward_layernorm.weight"] = nw(H)
        w[p + "mlp.gate_proj.weight"] = lin(I, H)
        w[p + "mlp.up_proj.weight"] = lin(I, H)
        w[p + "mlp.down_proj.weight"] = lin(H, I)
    return w


def write_model(kind, out):
    if kind == "gemma2":  # soft-capped scores and logits, every other layer windowed, no QK norm
        cfg = MM.families.gemma2_config("f32")
        cfg.update({"vocab_size": 320, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 3,
                    "sliding_window": 4, "query_pre_attn_scalar": 16})
        MM.write_checkpoint(out, cfg, MM.families.init_gemma2(cfg, 8), "f32", 1)
        return cfg
    if kind == "gemma3":
        cfg = gemma3_config()
        MM.write_checkpoint(out, cfg, init_gemma3(cfg, 7), "f32", 1)
        return cfg
    if kind == "gpt2":
        cfg = MM.gpt2_config("f32")
        MM.write_checkpoint(out, cfg, MM.init_gpt2(cfg, 3), "f32", 1)
        return cfg
    if kind == "olmo2":  # post-norms only, q and k normed over the whole projection
        cfg = MM.families.olmo2_config("f32")
        MM.write_checkpoint(out, cfg, MM.init_llama(cfg, 6), "f32", 1)
        return cfg
    if kind in ("phi3", "mistral"):  # Phi-3: fused in the file, partial rotary, LongRoPE, a window; Mistral: a window
        cfg = MM.phi3_config("f32") if kind == "phi3" else MM.mistral_config("f32")
        w = MM.init_llama(cfg, 5)
        MM.write_checkpoint(out, cfg, MM.fuse_phi3(cfg, w) if kind == "phi3" else w, "f32", 1)
        return cfg
    cfg = MM.llama_config("f32") if kind in ROPE_SCALINGS else MM.qwen_config(kind, "f32")
    cfg["rope_scaling"] = ROPE_SCALINGS.get(kind)
    MM.write_checkpoint(out, cfg, MM.init_llama(cfg, 5), "f32", 1)
    return cfg


# Llama with rotary scalings (tests/golden_setup.sh has the same two): the backward through a
# scaled rotation (frequency divisors, and YaRN's factor on cos and sin).
ROPE_SCALINGS = {
    "llama": None,
    "llama3_rope": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64},
    "yarn_rope": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
}


# --------------------------------------------------------------------------- the reference
#
# Parameters are the canonical tensors the driver dumped, keyed "kind/layer": q, k, v, o are
# (out, in) matrices; norms hold the weight the forward multiplies by (Gemma's 1 + w).

def rmsnorm(x, w, eps):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def layernorm(x, w, b, eps):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1.0 + jnp.exp(-x))


def rope_halves(x, pos, theta, cfg=None):  # x (T, h, hd), rotate (x[i], x[i + rot/2]) of the first rot
    rot = int(x.shape[-1] * (cfg or {}).get("partial_rotary_factor", 1.0))
    x, rest = x[..., :rot], x[..., rot:]
    hd = rot
    inv, att = theta ** (-np.arange(0, hd, 2) / hd), 1.0
    if cfg is not None:  # rope_scaling: transformers' formulas (make_models.scaled_inv_freq)
        inv, att = MM.scaled_inv_freq(cfg, inv, hd, theta)
    ang = pos[:, None] * inv[None, :]
    c, s = att * jnp.cos(ang)[:, None, :], att * jnp.sin(ang)[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return jnp.concatenate([x1 * c - x2 * s, x1 * s + x2 * c, rest], axis=-1)


def forward_loss(P, spec, batch, lora=None, x0=None, hidden=False):
    """The summed loss. lora: adapters applied beside the base, x W^T + s (drop(x) A^T) B^T, as
    {"A": {"q/0": ...}, "B": {...}, "s": scale, "masks": {"q/0": mask with 1 / (1 - p) or 0}}.
    x0: the first layer's input rows in place of the embedding (an EAGLE head's fc output);
    spec["no_attn_norm"] / spec["no_final_norm"]: a Llama layer without those norms (the head);
    hidden: the rows after the final norm instead of the loss (the features)."""
    kind, L = spec["kind"], spec["n_layers"]
    tok, tgt, pos, doc = batch["tokens"], batch["targets"], batch["positions"], batch["doc_id"]
    T = tok.shape[0]
    g = lambda k, l=-1: P["%s/%d" % (k, l)]  # noqa: E731

    def lin(k, l, x):  # x W^T, plus the adapter of (k, l) when there is one
        y = x @ g(k, l).T
        key = "%s/%d" % (k, l)
        if lora is not None and key in lora["A"]:
            xa = x * lora["masks"][key] if key in lora["masks"] else x
            y = y + lora["s"] * ((xa @ lora["A"][key].T) @ lora["B"][key].T)
        return y
    gemma = kind in ("gemma2", "gemma3")
    if x0 is not None:
        x = x0
    else:
        x = g("tok_embedding")[tok]
        if gemma:
            x = x * math.sqrt(spec["d"])
    if kind == "gpt2":
        x = x + g("pos_embedding")[pos]
    i_idx, j_idx = np.arange(T)[:, None], np.arange(T)[None, :]
    same_doc = doc[:, None] == doc[None, :]
    causal = (j_idx <= i_idx) & same_doc
    nh, nkv, hd = spec["n_heads"], spec["n_kv"], spec["head_dim"]
    for l in range(L):
        if kind == "gpt2":
            xn = layernorm(x, g("attn_norm", l), g("attn_norm_bias", l), 1e-5)
        elif kind == "olmo2" or spec.get("no_attn_norm"):  # no norm before attention
            xn = x
        else:
            xn = rmsnorm(x, g("attn_norm", l), spec["eps"])
        q = lin("q", l, xn)
        k = lin("k", l, xn)
        v = lin("v", l, xn)
        if kind == "olmo2":  # RMSNorm over the whole q and k projections
            q = rmsnorm(q, g("q_norm", l), spec["eps"])
            k = rmsnorm(k, g("k_norm", l), spec["eps"])
        if kind in ("gpt2", "qwen2"):
            q, k, v = q + g("q_bias", l), k + g("k_bias", l), v + g("v_bias", l)
        q, k, v = q.reshape(T, nh, hd), k.reshape(T, nkv, hd), v.reshape(T, nkv, hd)
        window, theta = 0, spec.get("theta", 10000.0)
        if kind in ("gemma3", "qwen3"):  # RMSNorm of each head's q and k, before rotary
            q = rmsnorm(q, g("q_norm", l), spec["eps"])
            k = rmsnorm(k, g("k_norm", l), spec["eps"])
        if kind in ("phi3", "mistral"):
            window = spec["cfg"]["sliding_window"]
        if gemma:
            glob = (l + 1) % spec["pattern"] == 0
            window = 0 if glob else spec["window"]
            theta = spec["theta"] if glob else spec["theta_local"]
        if kind != "gpt2":
            q, k = rope_halves(q, pos, theta, spec.get("cfg")), rope_halves(k, pos, theta, spec.get("cfg"))
        mask = causal if window == 0 else causal & (i_idx - j_idx < window)
        rep = nh // nkv
        kk, vv = jnp.repeat(k, rep, axis=1), jnp.repeat(v, rep, axis=1)
        s = jnp.einsum("ihd,jhd->hij", q, kk) * spec["scale"]
        if spec.get("attn_cap"):  # Gemma 2: cap * tanh(s / cap), before the mask
            s = spec["attn_cap"] * jnp.tanh(s / spec["attn_cap"])
        s = jnp.where(mask[None], s, -jnp.inf)
        p = jax.nn.softmax(s, axis=-1)
        att = jnp.einsum("hij,jhd->ihd", p, vv).reshape(T, nh * hd)
        proj = lin("o", l, att)
        if kind == "gpt2":
            proj = proj + g("o_bias", l)
        if gemma or kind == "olmo2":
            proj = rmsnorm(proj, g("post_attn_norm", l), spec["eps"])
        x = x + proj
        if kind == "gpt2":
            xn = layernorm(x, g("mlp_norm", l), g("mlp_norm_bias", l), 1e-5)
            h = gelu_tanh(xn @ g("up", l).T + g("up_bias", l))
            proj = h @ g("down", l).T + g("down_bias", l)
        else:
            xn = x if kind == "olmo2" else rmsnorm(x, g("mlp_norm", l), spec["eps"])
            act = gelu_tanh if gemma else silu
            h = act(lin("gate", l, xn)) * lin("up", l, xn)
            proj = lin("down", l, h)
            if gemma or kind == "olmo2":
                proj = rmsnorm(proj, g("post_mlp_norm", l), spec["eps"])
        x = x + proj
    if kind == "gpt2":
        h = layernorm(x, g("final_norm"), g("final_norm_bias"), 1e-5)
    elif spec.get("no_final_norm"):
        h = x
    else:
        h = rmsnorm(x, g("final_norm"), spec["eps"])
    if hidden:
        return h
    head = g("tok_embedding") if spec["tied"] else g("lm_head")
    logits = h @ head.T
    if spec.get("final_cap"):
        logits = spec["final_cap"] * jnp.tanh(logits / spec["final_cap"])
    lse = jax.scipy.special.logsumexp(logits, axis=-1)
    real = tgt >= 0
    tl = jnp.take_along_axis(logits, jnp.where(real, tgt, 0)[:, None], axis=1)[:, 0]
    return jnp.sum(jnp.where(real, lse - tl, 0.0))


def spec_of(kind, cfg):
    if kind == "gpt2":
        d, nh = cfg["n_embd"], cfg["n_head"]
        return {"kind": kind, "n_layers": cfg["n_layer"], "d": d, "n_heads": nh, "n_kv": nh,
                "head_dim": d // nh, "scale": 1.0 / math.sqrt(d // nh), "eps": 1e-5}
    if kind == "gemma2":
        return {"kind": kind, "n_layers": cfg["num_hidden_layers"], "d": cfg["hidden_size"],
                "n_heads": cfg["num_attention_heads"], "n_kv": cfg["num_key_value_heads"],
                "head_dim": cfg["head_dim"], "scale": 1.0 / math.sqrt(cfg["query_pre_attn_scalar"]),
                "eps": cfg["rms_norm_eps"], "theta": cfg["rope_theta"], "theta_local": cfg["rope_theta"],
                "window": cfg["sliding_window"], "pattern": 2, "attn_cap": cfg["attn_logit_softcapping"],
                "final_cap": cfg["final_logit_softcapping"]}
    if kind == "gemma3":
        return {"kind": kind, "n_layers": cfg["num_hidden_layers"], "d": cfg["hidden_size"],
                "n_heads": cfg["num_attention_heads"], "n_kv": cfg["num_key_value_heads"],
                "head_dim": cfg["head_dim"], "scale": 1.0 / math.sqrt(cfg["query_pre_attn_scalar"]),
                "eps": cfg["rms_norm_eps"], "theta": cfg["rope_theta"],
                "theta_local": cfg["rope_local_base_freq"], "window": cfg["sliding_window"],
                "pattern": cfg["sliding_window_pattern"]}
    return {"kind": kind, "n_layers": cfg["num_hidden_layers"], "d": cfg["hidden_size"],
            "n_heads": cfg["num_attention_heads"], "n_kv": cfg["num_key_value_heads"],
            "head_dim": cfg["head_dim"], "scale": 1.0 / math.sqrt(cfg["head_dim"]),
            "eps": cfg["rms_norm_eps"], "theta": cfg["rope_theta"], "cfg": cfg}


# --------------------------------------------------------------------------- the batch

def make_batch(vocab, seed, doc_lens=(7, 1, 12, 5)):
    rng = np.random.default_rng(seed)
    tokens, targets, positions, doc_id, starts = [], [], [], [], [0]
    for d, n in enumerate(doc_lens):
        ids = rng.integers(3, vocab, size=n + 1)
        for i in range(n):
            tokens.append(int(ids[i]))
            # the next token, but a few rows masked (prompt tokens), and the last has none
            targets.append(int(ids[i + 1]) if (i + 1 < n and rng.random() > 0.2) else -1)
            positions.append(i)
            doc_id.append(d)
        starts.append(starts[-1] + n)
    return {"tokens": np.array(tokens), "targets": np.array(targets),
            "positions": np.array(positions), "doc_id": np.array(doc_id), "doc_start": starts}


def write_batch(path, b, grad_scale):
    with open(path, "w") as f:
        f.write("%d %d %.9g\n" % (len(b["tokens"]), len(b["doc_start"]) - 1, grad_scale))
        for key in ("tokens", "targets", "positions", "doc_start"):
            f.write(" ".join(str(int(v)) for v in b[key]) + "\n")


DEVICE = "cpu"


def run_driver(driver, model_dir, batch_path, prefix, repeat, lora=None):
    extra = [repr(v) for v in lora] if lora else []
    r = subprocess.run([driver, model_dir, batch_path, prefix, str(repeat), DEVICE] + extra, capture_output=True,
                       text=True)
    if r.returncode == 77:
        print(r.stdout.strip())
        sys.exit(77)
    if r.returncode != 0:
        raise RuntimeError("driver failed: %s" % r.stderr[-2000:])
    meta = json.load(open(prefix + ".json"))
    if lora:
        return meta, *_read_dump(meta, prefix)
    return meta, *_read_dump(meta, prefix)


def _read_dump(meta, prefix):
    raw = open(prefix + ".bin", "rb").read()
    params, grads = {}, {}
    for t in meta["tensors"]:
        n = int(np.prod(t["shape"]))
        key = "%s/%d" % (t["kind"], t["layer"])
        params[key] = np.frombuffer(raw, np.float32, n, t["weight_offset"]).reshape(t["shape"]).astype(np.float64)
        grads[key] = np.frombuffer(raw, np.float32, n, t["grad_offset"]).reshape(t["shape"]).astype(np.float64)
    return params, grads


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# Phi-3's fused modules (PEFT's qkv_proj and gate_up_proj): one A shared by the parts, B their rows
# stacked; lora.h names the shared A after the group's first part.
FUSED = {"phi3": {"k": "q", "v": "q", "up": "gate"}}
PEFT_MODULES = {"phi3": (("qkv_proj", "self_attn", ("q", "k", "v")), ("o_proj", "self_attn", ("o",)),
                         ("gate_up_proj", "mlp", ("gate", "up")), ("down_proj", "mlp", ("down",)))}


def leader(kind, t):
    return FUSED.get(kind, {}).get(t, t)


def n_adapter_tensors(kind, n_layers):
    return (2 * len(LORA_TARGETS) - len(FUSED.get(kind, {}))) * n_layers


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise ValueError("%s: %s is %s, not F32" % (path, name, t["dtype"]))
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], np.float32).reshape(t["shape"]).astype(np.float64)
    return out


def peft_layout_check(kind, peft_dir, params, n_layers):
    """The adapter file in Phi-3's module names, as PEFT reads it for Phi3ForCausalLM: target_modules
    qkv_proj, o_proj, gate_up_proj, down_proj; per module lora_A (r, in) and lora_B (out, r), a fused
    B being its parts' B stacked in the order of the fused weight's rows."""
    cfg = json.load(open(os.path.join(peft_dir, "adapter_config.json")))
    tensors = read_safetensors(os.path.join(peft_dir, "adapter_model.safetensors"))
    want = {}
    for l in range(n_layers):
        for module, block, parts in PEFT_MODULES[kind]:
            pre = "base_model.model.model.layers.%d.%s.%s." % (l, block, module)
            want[pre + "lora_A.weight"] = params["lora_A_%s/%d" % (parts[0], l)]
            want[pre + "lora_B.weight"] = np.concatenate([params["lora_B_%s/%d" % (p, l)] for p in parts], axis=0)
    same = set(tensors) == set(want) and all(tensors[k].shape == v.shape and np.array_equal(tensors[k], v)
                                             for k, v in want.items())
    check(sorted(cfg["target_modules"]) == sorted(m for m, _, _ in PEFT_MODULES[kind]) and same,
          "%s LoRA: the PEFT file in the model's fused module names (%s), %d tensors equal to the trained ones"
          % (kind, ", ".join(cfg["target_modules"]), len(tensors)))


def lora_check(driver, tmp, kind, mdir, bpath, spec, batch, grad_scale):
    """Frozen base, adapters on every projection: the gradients of A and B against JAX, and the
    merged weights W + s B A computing the same loss as base + adapter."""
    meta, params, grads = run_driver(driver, mdir, bpath, os.path.join(tmp, kind + "_lora"), 1, lora=(4, 8.0))
    s = meta["lora_scale"]
    base = {k: jnp.asarray(v) for k, v in params.items() if not k.startswith("lora_")}
    adapters = {k: jnp.asarray(v) for k, v in params.items() if k.startswith("lora_")}
    jb = {k: jnp.asarray(v) for k, v in batch.items() if k != "doc_start"}

    def merged(ad):
        p = dict(base)
        for t in LORA_TARGETS:
            for l in range(spec["n_layers"]):
                a, b = ad.get("lora_A_%s/%d" % (leader(kind, t), l)), ad.get("lora_B_%s/%d" % (t, l))
                if b is not None:
                    p["%s/%d" % (t, l)] = p["%s/%d" % (t, l)] + s * (b @ a)
        return p

    loss, jg = jax.value_and_grad(lambda ad: forward_loss(merged(ad), spec, jb))(adapters)
    rel = abs(meta["loss_sum"] - float(loss)) / abs(float(loss))
    check(rel < 1e-5, "%s LoRA: loss %.8f, JAX with W + s B A %.8f (rel %.1e)" % (kind, meta["loss_sum"], float(loss), rel))
    refs = {k: np.asarray(jg[k]) * grad_scale for k in adapters}
    gmax = max(np.max(np.abs(r)) for r in refs.values())
    worst, wkey = 0.0, ""
    for k, r in refs.items():
        e = np.max(np.abs(grads[k] - r)) / max(np.max(np.abs(r)), 1e-2 * gmax)
        if e > worst:
            worst, wkey = e, k
    check(worst < 1e-4 and len(refs) == n_adapter_tensors(kind, spec["n_layers"]),
          "%s LoRA: all %d adapter gradients within 1e-4 of JAX (worst %.1e, %s)" % (kind, len(refs), worst, wkey))
    if kind in PEFT_MODULES:
        peft_layout_check(kind, os.path.join(tmp, kind + "_lora.peft"), params, spec["n_layers"])
    return meta, os.path.join(tmp, kind + "_lora.peft")


M64 = (1 << 64) - 1


def mix64(z):
    """splitmix64's finaliser, on Python ints or numpy uint64 arrays (wrapping mod 2^64)."""
    if isinstance(z, int):
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
        return z ^ (z >> 31)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
        return z ^ (z >> np.uint64(31))


def dropout_mask(p, seed, step, micro, layer, target, rows, cols):
    """The mask lora.h documents, drawn again here: the keep decisions times 1 / (1 - p) (the
    f32 factor the kernels use), as float64 (rows, cols)."""
    k = mix64((seed + 0x9e3779b97f4a7c15) & M64)
    k = mix64(mix64(k ^ step) ^ micro)
    k = mix64(k ^ ((layer << 8) | target))
    r = np.arange(rows, dtype=np.uint64)[:, None] << np.uint64(32)
    c = np.arange(cols, dtype=np.uint64)[None, :]
    h = mix64(np.uint64(k) ^ (r | c))
    p32 = np.float32(p)
    keep = (h >> np.uint64(40)) >= np.uint64(int(float(p32) * 16777216.0 + 0.5))
    return np.where(keep, float(np.float32(1.0) / (np.float32(1.0) - p32)), 0.0)


def lora_dropout_check(driver, tmp, kind, mdir, bpath, spec, batch, grad_scale, p=0.3):
    """LoRA with dropout: the masked path x W^T + s (drop(x) A^T) B^T, the masks drawn from the
    counter formula; the loss and the gradients of A and B against JAX."""
    meta, params, grads = run_driver(driver, mdir, bpath, os.path.join(tmp, kind + "_lora_drop"), 1,
                                     lora=(4, 8.0, p))
    base = {k: jnp.asarray(v) for k, v in params.items() if not k.startswith("lora_")}
    ad = {k: jnp.asarray(v) for k, v in params.items() if k.startswith("lora_")}
    T = len(batch["tokens"])
    masks, dropped = {}, []
    for t in LORA_TARGETS:  # a fused group draws one mask, its leader's (PEFT drops the module's input once)
        lt = leader(kind, t)
        for l in range(spec["n_layers"]):
            a = params.get("lora_A_%s/%d" % (lt, l))
            if a is not None:
                mk = dropout_mask(meta["lora_dropout"], meta["dropout_seed"], meta["step"], meta["micro"], l,
                                  LORA_TARGETS.index(lt), T, a.shape[1])
                masks["%s/%d" % (t, l)] = jnp.asarray(mk)
                dropped.append(float(np.mean(mk == 0)))
    jb = {k: jnp.asarray(v) for k, v in batch.items() if k != "doc_start"}

    def loss_of(adp):
        keys = [k[len("lora_B_"):] for k in adp if k.startswith("lora_B_")]  # "t/l"
        lora = {"A": {k: adp["lora_A_%s/%s" % (leader(kind, k.split("/")[0]), k.split("/")[1])] for k in keys},
                "B": {k: adp["lora_B_" + k] for k in keys}, "s": meta["lora_scale"], "masks": masks}
        return forward_loss(base, spec, jb, lora)

    loss, jg = jax.value_and_grad(loss_of)(ad)
    rel = abs(meta["loss_sum"] - float(loss)) / abs(float(loss))
    check(rel < 1e-5 and abs(np.mean(dropped) - p) < 0.05,
          "%s LoRA dropout %.1f: loss %.8f, JAX with the same masks %.8f (rel %.1e; %.3f of inputs dropped)"
          % (kind, p, meta["loss_sum"], float(loss), rel, np.mean(dropped)))
    refs = {k: np.asarray(jg[k]) * grad_scale for k in ad}
    gmax = max(np.max(np.abs(r)) for r in refs.values())
    worst, wkey = 0.0, ""
    for k, r in refs.items():
        e = np.max(np.abs(grads[k] - r)) / max(np.max(np.abs(r)), 1e-2 * gmax)
        if e > worst:
            worst, wkey = e, k
    check(worst < 1e-4 and len(refs) == n_adapter_tensors(kind, spec["n_layers"]),
          "%s LoRA dropout: all %d adapter gradients within 1e-4 of JAX with the masks (worst %.1e, %s)"
          % (kind, len(refs), worst, wkey))


def main():
    global DEVICE
    driver = sys.argv[1]
    DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("llama", "gpt2", "gemma3", "gemma2", "olmo2", "qwen2", "qwen3", "llama3_rope", "yarn_rope", "phi3", "mistral"):
            mdir = os.path.join(tmp, kind)
            cfg = write_model(kind, mdir)
            spec = spec_of(kind, cfg)
            vocab = cfg["vocab_size"]
            batch = make_batch(vocab, seed=11)
            n_real = int(np.sum(batch["targets"] >= 0))
            grad_scale = 1.0 / n_real
            bpath = os.path.join(tmp, kind + ".batch")
            write_batch(bpath, batch, grad_scale)
            meta, params, grads = run_driver(driver, mdir, bpath, os.path.join(tmp, kind + "_1"), 1)
            spec["tied"] = bool(meta["tied"])
            jb = {k: jnp.asarray(v) for k, v in batch.items() if k != "doc_start"}
            loss, jg = jax.value_and_grad(lambda p: forward_loss(p, spec, jb))({k: jnp.asarray(v) for k, v in params.items()})
            loss = float(loss)
            check(meta["n_real"] == n_real, "%s: %d real target tokens" % (kind, n_real))
            rel = abs(meta["loss_sum"] - loss) / abs(loss)
            check(rel < 1e-5, "%s: loss %.8f, JAX %.8f (rel %.1e)" % (kind, meta["loss_sum"], loss, rel))
            worst, worst_key = 0.0, ""
            refs = {key: np.asarray(jg[key]) * grad_scale for key in grads}
            gmax = max(np.max(np.abs(r)) for r in refs.values())
            for key, gc in grads.items():
                ref = refs[key]
                # Relative to the tensor's own largest gradient, but not below 1% of the model's
                # largest: a key bias has an exactly zero gradient (softmax is invariant to a
                # score shift shared by a row), which f32 can only approach.
                scale = max(np.max(np.abs(ref)), 1e-2 * gmax)
                err = np.max(np.abs(gc - ref)) / scale
                if err > worst:
                    worst, worst_key = err, key
                if err >= 1e-4:
                    check(False, "%s: gradient of %s: rel error %.2e" % (kind, key, err))
            check(worst < 1e-4, "%s: all %d gradient tensors within 1e-4 of JAX (worst %.1e, %s)"
                  % (kind, len(grads), worst, worst_key))
            # Accumulation: two micro-batches give twice the gradients.
            _, _, grads2 = run_driver(driver, mdir, bpath, os.path.join(tmp, kind + "_2"), 2)
            acc = max(np.max(np.abs(grads2[k] - 2 * grads[k])) / max(np.max(np.abs(grads[k])), 1e-30)
                      for k in grads)
            check(acc < 1e-5, "%s: two micro-batches accumulate to twice the gradients (rel %.1e)" % (kind, acc))
            if kind != "gpt2":  # adapters are written for Llama-family names
                lora_check(driver, tmp, kind, mdir, bpath, spec, batch, grad_scale)
                lora_dropout_check(driver, tmp, kind, mdir, bpath, spec, batch, grad_scale)
    print("%d passed, %d failed" % (N_PASS, N_FAIL))
    return 1 if N_FAIL else 0


if __name__ == "__main__":
    sys.exit(main())

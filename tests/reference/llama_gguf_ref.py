#!/usr/bin/env python3
"""Independent float64 NumPy reference forward pass for GGUF files of architecture "llama".

Written only for shardlm's golden tests (SmolLM2-135M-Instruct, a Llama-architecture GGUF). It
follows llama.cpp's llama graph (src/models/llama.cpp, `llm_build_llama`) and Hugging Face
`modeling_llama.py`, never shardlm's code. Weights are read and dequantized with gguf-py
(`gguf.GGUFReader`, `gguf.quants.dequantize`), kept in float32 as dequantized, and every
activation is computed in float64; the whole sequence is recomputed (no KV cache).

Model semantics (GGUF / llama.cpp tensor names):
  x = token_embd[ids]
  rmsnorm(v, w) = v / sqrt(mean(v^2) + eps) * w, eps = llama.attention.layer_norm_rms_epsilon
  per layer:
      h = rmsnorm(x, attn_norm)
      q = h @ attn_q^T -> (T, n_head, hd); k = h @ attn_k^T, v = h @ attn_v^T -> (T, n_kv, hd)
      q, k = rope_norm(q/k, pos, base): llama.cpp's rope type NORM for LLM_ARCH_LLAMA rotates
          adjacent pairs (2i, 2i + 1) by pos * base^(-2i / n_rot) (convert_hf_to_gguf.py
          permuted the rows of attn_q / attn_k from HF's rotate-half order so that this equals
          HF's rotate-half on the original weights); base = llama.rope.freq_base
      scores[h, i, j] = q[i, h] . k[j, h // (n_head / n_kv)] / sqrt(hd), causal (j <= i)
      o = softmax(scores) @ v -> (T, n_head * hd); x = x + o @ attn_output^T
      h = rmsnorm(x, ffn_norm)
      x = x + (silu(h @ ffn_gate^T) * (h @ ffn_up^T)) @ ffn_down^T
  logits = rmsnorm(x, output_norm) @ output^T, output = token_embd when absent (tied)

CLI: python3 llama_gguf_ref.py --gguf FILE --ids 1,2,3 --json OUT
  writes {"gguf", "ids", "logits_last": [vocab floats], "argmax": [per position],
          "margins": [top1 - top2 per position]} (what tests/test_model.c's golden mode reads).
"""

import argparse
import json
import sys

import numpy as np

try:
    import gguf
    from gguf import quants as gguf_quants
except ImportError as e:  # pragma: no cover
    sys.exit("llama_gguf_ref.py needs the gguf package (pip install gguf): %s" % e)

ARCH = "llama"


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def load(path):
    reader = gguf.GGUFReader(path)
    if field(reader, "general.architecture") != ARCH:
        raise ValueError("%s: not a llama GGUF" % path)
    g = lambda k, d=None: field(reader, "%s.%s" % (ARCH, k), d)
    c = {"n_embd": int(g("embedding_length")), "n_layer": int(g("block_count")),
         "n_head": int(g("attention.head_count"))}
    c["n_kv"] = int(g("attention.head_count_kv", c["n_head"]))
    c["hd"] = c["n_embd"] // c["n_head"]
    c["n_rot"] = int(g("rope.dimension_count", c["hd"]))
    c["eps"] = float(g("attention.layer_norm_rms_epsilon", 1e-5))
    c["base"] = float(g("rope.freq_base", 10000.0))
    if any(k.startswith(ARCH + ".rope.scaling") for k in reader.fields):
        raise ValueError("rope scaling is not implemented in this reference")
    tensors = {t.name: t for t in reader.tensors}

    def deq(name):
        t = tensors[name]
        a = gguf_quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(s) for s in reversed(t.shape)]  # GGUF [ne0 = in, ne1 = out] -> (out, in)
        return a.reshape(shape)

    w = {"token_embd": deq("token_embd.weight"), "output_norm": deq("output_norm.weight")}
    w["output"] = deq("output.weight") if "output.weight" in tensors else w["token_embd"]
    for il in range(c["n_layer"]):
        for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                  "ffn_up", "ffn_down"):
            w["%d.%s" % (il, n)] = deq("blk.%d.%s.weight" % (il, n))
    return c, w


def rmsnorm(v, wt, eps):
    return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * wt.astype(np.float64)


def rope_norm(x, n_rot, base):
    """x (T, heads, hd): rotate pairs (2i, 2i + 1) of the first n_rot features."""
    T = x.shape[0]
    pos = np.arange(T, dtype=np.float64)[:, None]
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    ang = pos * inv[None, :]  # (T, n_rot / 2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.copy()
    a, b = x[:, :, 0:n_rot:2], x[:, :, 1:n_rot:2]
    out[:, :, 0:n_rot:2] = a * cos - b * sin
    out[:, :, 1:n_rot:2] = a * sin + b * cos
    return out


def forward(ids, c, w):
    T, hd = len(ids), c["hd"]
    lin = lambda h, name: h @ w[name].astype(np.float64).T
    x = w["token_embd"][ids].astype(np.float64)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    group = c["n_head"] // c["n_kv"]
    for il in range(c["n_layer"]):
        p = "%d." % il
        h = rmsnorm(x, w[p + "attn_norm"], c["eps"])
        q = rope_norm(lin(h, p + "attn_q").reshape(T, c["n_head"], hd), c["n_rot"], c["base"])
        k = rope_norm(lin(h, p + "attn_k").reshape(T, c["n_kv"], hd), c["n_rot"], c["base"])
        v = lin(h, p + "attn_v").reshape(T, c["n_kv"], hd)
        o = np.empty((T, c["n_head"], hd))
        for hh in range(c["n_head"]):
            kv = hh // group
            s = q[:, hh, :] @ k[:, kv, :].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            o[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv, :]
        x = x + lin(o.reshape(T, -1), p + "attn_output")
        h = rmsnorm(x, w[p + "ffn_norm"], c["eps"])
        gate = lin(h, p + "ffn_gate")
        x = x + lin(gate / (1.0 + np.exp(-gate)) * lin(h, p + "ffn_up"), p + "ffn_down")
    return lin(rmsnorm(x, w["output_norm"], c["eps"]), "output")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    ids = [int(t) for t in a.ids.split(",")]
    c, w = load(a.gguf)
    logits = forward(ids, c, w)
    top2 = np.sort(logits, axis=1)[:, -2:]
    json.dump({"gguf": a.gguf, "ids": ids, "logits_last": logits[-1].tolist(),
               "argmax": [int(i) for i in logits.argmax(axis=1)],
               "margins": (top2[:, 1] - top2[:, 0]).tolist()}, open(a.json, "w"))


if __name__ == "__main__":
    main()

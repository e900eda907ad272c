#!/usr/bin/env python3
"""Independent float64 NumPy reference forward pass for BERT encoders (BertModel safetensors),
and the sentence-transformers pooling of all-MiniLM-L6-v2.

Written only for shardlm's embedding tests. It follows Hugging Face `modeling_bert.py`
(BertEmbeddings, BertSelfAttention in "eager" mode, BertSelfOutput, BertIntermediate,
BertOutput) and sentence-transformers' Pooling and Normalize modules, never shardlm's code.
The safetensors file is read with the standard library and NumPy (its JSON header, then
little-endian f32 arrays); every activation is float64.

Model semantics (HF tensor names, prefix-free as sentence-transformers saves them):
  x = word_embeddings[ids] + position_embeddings[0..T) + token_type_embeddings[0]
  x = layernorm(x, embeddings.LayerNorm)         layernorm(v) = (v - mean) / sqrt(var + eps) * w + b,
                                                  biased variance, eps = layer_norm_eps (1e-12)
  per layer:
      q, k, v = x @ W^T + b (query, key, value) -> (T, heads, hd)
      a = softmax(q k^T / sqrt(hd)) v   over every position (no causal mask; one sequence, no padding)
      x = layernorm(x + a @ Wo^T + bo, attention.output.LayerNorm)
      h = gelu_erf(x @ Wi^T + bi)          gelu_erf(v) = 0.5 v (1 + erf(v / sqrt(2)))  (hidden_act "gelu")
      x = layernorm(x + h @ Wd^T + bd, output.LayerNorm)
  pooling: mean over the tokens (sentence-transformers' pooling_mode_mean_tokens, every token
  attended: one sequence without padding), [CLS] = row 0, or the last row; then L2 normalization
  (the 2_Normalize module).
"""
import json
import math
import struct

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def load_safetensors(path):
    """name -> NumPy array (float tensors as float64)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=_DTYPES[t["dtype"]]).reshape(t["shape"])
        out[name] = arr.astype(np.float64) if arr.dtype != np.int64 else arr
    return out


_erf = np.vectorize(math.erf)


def _layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


class Bert:
    def __init__(self, model_dir):
        with open(f"{model_dir}/config.json") as f:
            self.cfg = json.load(f)
        w = load_safetensors(f"{model_dir}/model.safetensors")
        self.w = {k[5:] if k.startswith("bert.") else k: v for k, v in w.items()}

    def hidden(self, ids):
        """The final hidden states (T, d) of one sequence of token ids."""
        c, w = self.cfg, self.w
        eps = c.get("layer_norm_eps", 1e-12)
        heads = c["num_attention_heads"]
        T = len(ids)
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:T] +
             w["embeddings.token_type_embeddings.weight"][0])
        x = _layernorm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        for il in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{il}."

            def lin(v, name):
                return v @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            d = x.shape[1]
            hd = d // heads
            q = lin(x, "attention.self.query").reshape(T, heads, hd).transpose(1, 0, 2)
            k = lin(x, "attention.self.key").reshape(T, heads, hd).transpose(1, 0, 2)
            v = lin(x, "attention.self.value").reshape(T, heads, hd).transpose(1, 0, 2)
            s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
            s = np.exp(s - s.max(-1, keepdims=True))
            a = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(T, d)
            x = _layernorm(x + lin(a, "attention.output.dense"), w[p + "attention.output.LayerNorm.weight"],
                           w[p + "attention.output.LayerNorm.bias"], eps)
            h = lin(x, "intermediate.dense")
            h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))
            x = _layernorm(x + lin(h, "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
                           eps)
        return x

    def embed(self, ids, pooling="mean", normalize=True):
        h = self.hidden(ids)
        v = h.mean(0) if pooling == "mean" else h[0] if pooling == "cls" else h[-1]
        return v / np.linalg.norm(v) if normalize else v

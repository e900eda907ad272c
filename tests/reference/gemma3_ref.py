#!/usr/bin/env python3
"""Independent float64 NumPy reference forward pass for Gemma 3 (text) GGUF files.

Written only for shardlm's golden tests. It follows llama.cpp's gemma3 graph
(src/models/gemma3.cpp, `llm_build_gemma3<iswa=true>`, hparams from llama-model.cpp) and
Hugging Face `modeling_gemma3.py` (`Gemma3ForCausalLM`), never shardlm's code. Weights are read
and dequantized with gguf-py (`gguf.GGUFReader`, `gguf.quants.dequantize`), kept in float32
(exactly what dequantization yields), and every activation is computed in float64. The full
sequence is recomputed on every call (no KV cache), so it stays short and obviously correct.

Model semantics (names are the GGUF / llama.cpp tensor names):
  x = token_embd[ids] * sqrt(n_embd)
      (llama.cpp: ggml_scale by sqrtf(n_embd) in f32; HF: hidden_size**0.5 cast to the model
       dtype (25.25 in bf16, 25.298221 in f32). Here: sqrt(640) in float64.)
  rmsnorm(v, w) = v / sqrt(mean(v^2) + eps) * w, eps = gemma3.attention.layer_norm_rms_epsilon
      (HF multiplies by (1 + w'); the GGUF converter already added the 1: use w as stored.)
  per layer il (global when (il + 1) % 6 == 0, else sliding-window ("local")):
      h = rmsnorm(x, attn_norm)
      q = h @ attn_q^T -> (T, n_head, hd); k = h @ attn_k^T, v = h @ attn_v^T -> (T, n_kv, hd)
      q = rmsnorm_per_head(q, attn_q_norm); k = rmsnorm_per_head(k, attn_k_norm)   (QK-norm)
      q, k = rope_neox(q/k, pos, base)    NeoX / HF rotate-half: pairs (i, i + hd/2),
          theta_i = pos * base^(-2i/hd), the full head dim rotated;
          base = gemma3.rope.freq_base (1e6) on global layers, 10000 on local layers
          (llama.cpp hard-codes rope_freq_base_train_swa = 10000; HF rope_local_base_freq).
      q *= 1/sqrt(key_length)   (llama.cpp f_attention_scale = 1/sqrt(n_embd_head_k), except
          Gemma 3 27B (62 layers): 1/sqrt(n_embd / n_head); HF query_pre_attn_scalar**-0.5)
      scores[h, i, j] = q[i, h] . k[j, h // (n_head / n_kv)]; visible iff j <= i and, on local
          layers, i - j < sliding_window (llama.cpp LLAMA_SWA_TYPE_STANDARD masks p1 - p0 >= n_swa)
      o = softmax(scores) @ v -> (T, n_head * hd); a = o @ attn_output^T
      x = x + rmsnorm(a, post_attention_norm)
      h = rmsnorm(x, ffn_norm)
      m = (gelu_tanh(h @ ffn_gate^T) * (h @ ffn_up^T)) @ ffn_down^T
      x = x + rmsnorm(m, post_ffw_norm)
  x = rmsnorm(x, output_norm)
  logits = x @ output^T, output = token_embd when there is no output.weight (tied)
  if gemma3.final_logit_softcapping is in the metadata (absent from Gemma 3 files):
      logits = c * tanh(logits / c)
  gelu_tanh(v) = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))  (HF gelu_pytorch_tanh;
      llama.cpp's CPU ggml_gelu is the same formula, possibly through an f16 lookup table)

GGUF layout: gguf-py returns a 2-D tensor with GGUF shape [ne0 = in, ne1 = out] as a row-major
numpy array (out, in), the nn.Linear layout (checked against the metadata below).

CLI:
  python3 gemma3_ref.py --gguf FILE [--ids 2,818,5279,...] [--json OUT] [--top 5]
                        [--steps N] [--prompt TEXT] [--adapter PEFT_DIR]
  Runs the prompt ids (default: DEFAULT_IDS, "<bos>The capital of France is") through the
  model and prints per-position argmax / top tokens and timing. With --json OUT writes
    {"gguf", "ids", "logits_last": [vocab floats, last position],
     "top": [[[id, logit] x top] per position], "argmax": [per position],
     "margins": [top1 - top2 per position]}
  (plus "generated" when --steps N > 0: greedy ids, full recompute per step).
  --prompt TEXT tokenizes TEXT with a naive greedy longest-match over the GGUF vocabulary
  (' ' -> '\u2581', BOS prepended). It is NOT SentencePiece's algorithm; sanity checks only.

LoRA (PEFT layout; `--adapter DIR`, or with_lora below): an adapter in Hugging Face PEFT's files
(adapter_config.json: r, lora_alpha; adapter_model.safetensors: lora_A (r, in) and lora_B
(out, r) per module, base_model.model.model.layers.L.{self_attn.{q,k,v,o}_proj,
mlp.{gate,up,down}_proj}.lora_{A,B}.weight) replaces each adapted weight W by
  W + (lora_alpha / r) B @ A          (PEFT's LoraLayer, merged; plain LoRA only)
computed in float64. The safetensors file is read here (F32, F16, BF16), not by shardlm.

Importable API:
  load_model(path) -> Model        (weights float32 as dequantized, config, vocabulary)
  with_lora(model, adapter_dir) -> Model  (a copy with the adapter merged, float64 weights)
  forward(ids, model=None, gguf_path=None, window=None) -> logits (T, vocab) float64
  greedy(ids, steps, model=None) -> generated ids
  decode(model, ids) -> str
The default model path is $SHARDLM_GEMMA3_GGUF or <repo>/.cache/gemma3-270m/gemma-3-270m-q4_k_m.gguf.
"""

import argparse
import copy
import json
import math
import os
import struct
import sys
import time

import numpy as np

try:
    import gguf
    from gguf import quants as gguf_quants
except ImportError as e:  # pragma: no cover
    sys.exit("gemma3_ref.py needs the gguf package (pip install gguf): %s" % e)

ARCH = "gemma3"
DEFAULT_IDS = [2, 818, 5279, 529, 7001, 563]  # <bos> "The" " capital" " of" " France" " is"
LOCAL_ROPE_BASE = 10000.0  # hard-coded in llama.cpp (rope_freq_base_train_swa) and HF
SWA_PATTERN = 6            # hard-coded: every 6th layer is global
LOGIT_CHUNK = 16384        # embedding rows converted to float64 at a time for the LM head

_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_GGUF = os.environ.get(
    "SHARDLM_GEMMA3_GGUF",
    os.path.join(_HERE, "..", "..", ".cache", "gemma3-270m", "gemma-3-270m-q4_k_m.gguf"))


# --------------------------------------------------------------------------- loading

def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class Model:
    """Config, float32 weights (as gguf-py dequantizes them) and the token pieces."""

    def __init__(self, path):
        self.path = path
        reader = gguf.GGUFReader(path)
        arch = _field(reader, "general.architecture")
        if arch != ARCH:
            raise ValueError("%s: architecture %r, expected %r" % (path, arch, ARCH))
        g = lambda k, d=None: _field(reader, "%s.%s" % (ARCH, k), d)
        c = {}
        c["n_embd"] = int(g("embedding_length"))
        c["n_layer"] = int(g("block_count"))
        c["n_ff"] = int(g("feed_forward_length"))
        c["n_head"] = int(g("attention.head_count"))
        c["n_kv"] = int(g("attention.head_count_kv", c["n_head"]))
        c["head_dim"] = int(g("attention.key_length", c["n_embd"] // c["n_head"]))
        c["head_dim_v"] = int(g("attention.value_length", c["head_dim"]))
        c["eps"] = float(g("attention.layer_norm_rms_epsilon"))
        c["rope_base_global"] = float(g("rope.freq_base", 10000.0))
        # no Gemma 3 file carries it today; newer llama.cpp reads rope.freq_base_swa if present
        c["rope_base_local"] = float(g("rope.freq_base_swa", LOCAL_ROPE_BASE))
        c["n_rot"] = int(g("rope.dimension_count", c["head_dim"]))
        c["window"] = int(g("attention.sliding_window"))
        soft = g("final_logit_softcapping")
        c["final_logit_softcapping"] = float(soft) if soft else None
        if c["n_layer"] == 62:  # Gemma 3 27B: query_pre_attn_scalar = n_embd / n_head
            c["q_scale"] = 1.0 / math.sqrt(c["n_embd"] / c["n_head"])
        else:
            c["q_scale"] = 1.0 / math.sqrt(c["head_dim"])
        unsupported = [k for k in reader.fields if k.startswith(ARCH + ".rope.scaling")]
        if unsupported and _field(reader, ARCH + ".rope.scaling.type") not in (None, "none"):
            raise ValueError("rope scaling is not implemented in this reference: %s" % unsupported)
        if c["n_rot"] != c["head_dim"]:
            raise ValueError("partial rotary (n_rot %d != head_dim %d) not implemented"
                             % (c["n_rot"], c["head_dim"]))

        tensors = {t.name: t for t in reader.tensors}

        def deq(name, shape):
            t = tensors[name]
            a = gguf_quants.dequantize(t.data, t.tensor_type)
            a = np.ascontiguousarray(a, dtype=np.float32).reshape(a.shape)
            if tuple(a.shape) != tuple(shape):
                raise ValueError("%s: shape %s, expected %s" % (name, a.shape, shape))
            return a

        E, L, F = c["n_embd"], c["n_layer"], c["n_ff"]
        H, KV, D, DV = c["n_head"], c["n_kv"], c["head_dim"], c["head_dim_v"]
        tok_tensor = tensors["token_embd.weight"]
        n_vocab = int(tok_tensor.shape[1])  # GGUF shape [n_embd, n_vocab]
        c["n_vocab"] = n_vocab
        self.config = c
        self.tok_embd = deq("token_embd.weight", (n_vocab, E))
        self.output = deq("output.weight", (n_vocab, E)) if "output.weight" in tensors else None
        self.output_norm = deq("output_norm.weight", (E,))
        self.layers = []
        for il in range(L):
            p = "blk.%d." % il
            self.layers.append({
                "attn_norm": deq(p + "attn_norm.weight", (E,)),
                "wq": deq(p + "attn_q.weight", (H * D, E)),
                "wk": deq(p + "attn_k.weight", (KV * D, E)),
                "wv": deq(p + "attn_v.weight", (KV * DV, E)),
                "q_norm": deq(p + "attn_q_norm.weight", (D,)),
                "k_norm": deq(p + "attn_k_norm.weight", (D,)),
                "wo": deq(p + "attn_output.weight", (E, H * DV)),
                "post_attention_norm": deq(p + "post_attention_norm.weight", (E,)),
                "ffn_norm": deq(p + "ffn_norm.weight", (E,)),
                "gate": deq(p + "ffn_gate.weight", (F, E)),
                "up": deq(p + "ffn_up.weight", (F, E)),
                "down": deq(p + "ffn_down.weight", (E, F)),
                "post_ffw_norm": deq(p + "post_ffw_norm.weight", (E,)),
            })
        f = reader.fields["tokenizer.ggml.tokens"]
        self.tokens = [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
        tt = reader.fields.get("tokenizer.ggml.token_type")
        self.token_type = [int(tt.parts[i][0]) for i in tt.data] if tt is not None else None
        self.bos = int(_field(reader, "tokenizer.ggml.bos_token_id", 2))
        del reader


_MODELS = {}


def load_model(path=None):
    path = os.path.abspath(path or DEFAULT_GGUF)
    if path not in _MODELS:
        _MODELS[path] = Model(path)
    return _MODELS[path]


# --------------------------------------------------------------------------- LoRA (PEFT)

# PEFT module name -> this reference's weight key
_LORA_MODULES = {"self_attn.q_proj": "wq", "self_attn.k_proj": "wk", "self_attn.v_proj": "wv",
                 "self_attn.o_proj": "wo", "mlp.gate_proj": "gate", "mlp.up_proj": "up",
                 "mlp.down_proj": "down"}


def _read_safetensors(path):
    """{name: float64 array} of a safetensors file (F32, F16, BF16 tensors)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        b0, b1 = t["data_offsets"]
        buf = data[b0:b1]
        if t["dtype"] == "F32":
            a = np.frombuffer(buf, dtype="<f4")
        elif t["dtype"] == "F16":
            a = np.frombuffer(buf, dtype="<f2")
        elif t["dtype"] == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError("%s: %s is %s (F32, F16 or BF16 only)" % (path, name, t["dtype"]))
        out[name] = a.astype(np.float64).reshape(t["shape"])
    return out


def with_lora(model, adapter_dir):
    """A copy of model whose adapted weights are W + (lora_alpha / r) B @ A (float64)."""
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    if cfg.get("peft_type", "LORA") != "LORA" or cfg.get("use_dora") or cfg.get("use_rslora"):
        raise ValueError("%s: plain LoRA only" % adapter_dir)
    scale = float(cfg["lora_alpha"]) / float(cfg["r"])
    t = _read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    m = copy.copy(model)
    m.layers = [dict(w) for w in model.layers]
    merged = 0
    for name, a in t.items():
        pre, sep, _ = name.partition(".lora_A.weight")
        if not sep:
            continue
        b = t[pre + ".lora_B.weight"]
        parts = pre.split(".")  # base_model model model layers L <block> <proj>
        if parts[:4] != ["base_model", "model", "model", "layers"]:
            raise ValueError("%s: unexpected tensor name %s" % (adapter_dir, name))
        il, key = int(parts[4]), _LORA_MODULES[".".join(parts[5:])]
        w = m.layers[il][key]
        if (b.shape[0], a.shape[1]) != w.shape or a.shape[0] != b.shape[1]:
            raise ValueError("%s: A %s, B %s do not fit %s %s" % (name, a.shape, b.shape, key, w.shape))
        m.layers[il][key] = w.astype(np.float64) + scale * (b @ a)
        merged += 1
    if merged == 0:
        raise ValueError("%s: no lora_A / lora_B pairs" % adapter_dir)
    return m


# --------------------------------------------------------------------------- math (float64)

def _rmsnorm(x, w, eps):
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w.astype(np.float64)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _rope_neox(x, pos, base):
    """x (T, heads, D); NeoX / rotate-half: pairs (i, i + D/2), theta = pos * base^(-2i/D)."""
    D = x.shape[-1]
    half = D // 2
    inv_freq = base ** (-np.arange(0, half, dtype=np.float64) * 2.0 / D)
    ang = pos.astype(np.float64)[:, None] * inv_freq[None, :]       # (T, half)
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _softmax(s):
    s = s - np.max(s, axis=-1, keepdims=True)
    e = np.exp(s)
    return e / np.sum(e, axis=-1, keepdims=True)


def is_global_layer(il):
    return (il + 1) % SWA_PATTERN == 0


def forward(ids, model=None, gguf_path=None, window=None, return_hidden=False):
    """Logits (T, vocab) float64 for the token ids (positions 0..T-1).

    window overrides gemma3.attention.sliding_window (tests only: exercises the local mask
    on short prompts); return_hidden also returns the final normed hidden states (T, n_embd).
    """
    m = model if model is not None else load_model(gguf_path)
    c = m.config
    ids = np.asarray(list(ids), dtype=np.int64)
    T = len(ids)
    E, H, KV, D, DV = c["n_embd"], c["n_head"], c["n_kv"], c["head_dim"], c["head_dim_v"]
    eps = c["eps"]
    if T == 0:
        raise ValueError("empty prompt")
    if ids.min() < 0 or ids.max() >= c["n_vocab"]:
        raise ValueError("token id out of range")
    pos = np.arange(T)
    causal = pos[None, :] <= pos[:, None]                             # [i, j]: j <= i
    win = c["window"] if window is None else int(window)
    local = causal & (pos[:, None] - pos[None, :] < win)              # i - j < window
    group = H // KV

    x = m.tok_embd[ids].astype(np.float64) * math.sqrt(E)
    for il, w in enumerate(m.layers):
        glob = is_global_layer(il)
        base = c["rope_base_global"] if glob else c["rope_base_local"]
        mask = causal if glob else local

        h = _rmsnorm(x, w["attn_norm"], eps)
        q = (h @ w["wq"].astype(np.float64).T).reshape(T, H, D)
        k = (h @ w["wk"].astype(np.float64).T).reshape(T, KV, D)
        v = (h @ w["wv"].astype(np.float64).T).reshape(T, KV, DV)
        q = _rmsnorm(q, w["q_norm"], eps)
        k = _rmsnorm(k, w["k_norm"], eps)
        q = _rope_neox(q, pos, base) * c["q_scale"]
        k = _rope_neox(k, pos, base)
        o = np.empty((T, H, DV), dtype=np.float64)
        for hh in range(H):
            kv = hh // group
            s = q[:, hh, :] @ k[:, kv, :].T                           # (T, T)
            s = np.where(mask, s, -np.inf)
            o[:, hh, :] = _softmax(s) @ v[:, kv, :]
        a = o.reshape(T, H * DV) @ w["wo"].astype(np.float64).T
        x = x + _rmsnorm(a, w["post_attention_norm"], eps)

        h = _rmsnorm(x, w["ffn_norm"], eps)
        g = h @ w["gate"].astype(np.float64).T
        u = h @ w["up"].astype(np.float64).T
        mm = (_gelu_tanh(g) * u) @ w["down"].astype(np.float64).T
        x = x + _rmsnorm(mm, w["post_ffw_norm"], eps)

    x = _rmsnorm(x, m.output_norm, eps)
    head = m.output if m.output is not None else m.tok_embd
    V = head.shape[0]
    logits = np.empty((T, V), dtype=np.float64)
    for s0 in range(0, V, LOGIT_CHUNK):
        logits[:, s0:s0 + LOGIT_CHUNK] = x @ head[s0:s0 + LOGIT_CHUNK].astype(np.float64).T
    cap = c["final_logit_softcapping"]
    if cap:
        logits = cap * np.tanh(logits / cap)
    if return_hidden:
        return logits, x
    return logits


def greedy(ids, steps, model=None, gguf_path=None):
    m = model if model is not None else load_model(gguf_path)
    seq = list(ids)
    out = []
    for _ in range(steps):
        nxt = int(np.argmax(forward(seq, model=m)[-1]))
        out.append(nxt)
        seq.append(nxt)
    return out


# --------------------------------------------------------------------------- vocabulary

def decode(model, ids):
    """Pieces joined, '\u2581' -> ' ', <0xNN> byte pieces turned into bytes."""
    buf = bytearray()
    for i in ids:
        p = model.tokens[i]
        if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            try:
                buf.append(int(p[3:5], 16))
                continue
            except ValueError:
                pass
        buf += p.replace("\u2581", " ").encode("utf-8")
    return buf.decode("utf-8", errors="replace")


def naive_tokenize(model, text, bos=True):
    """Greedy longest match over NORMAL / USER_DEFINED pieces (byte fallback). Not SentencePiece."""
    s = text.replace(" ", "\u2581")
    table = {}
    for i, p in enumerate(model.tokens):
        t = model.token_type[i] if model.token_type else 1
        if t in (1, 4) and p not in table:
            table[p] = i
    maxlen = max(len(p) for p in table)
    ids = [model.bos] if bos else []
    i = 0
    while i < len(s):
        for L in range(min(maxlen, len(s) - i), 0, -1):
            tid = table.get(s[i:i + L])
            if tid is not None:
                ids.append(tid)
                i += L
                break
        else:
            for b in s[i].encode("utf-8"):
                ids.append(model.tokens.index("<0x%02X>" % b))
            i += 1
    return ids


# --------------------------------------------------------------------------- CLI

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=DEFAULT_GGUF, help="Gemma 3 GGUF file")
    ap.add_argument("--ids", help="comma-separated prompt token ids (default: %s)"
                    % ",".join(map(str, DEFAULT_IDS)))
    ap.add_argument("--prompt", help="text, tokenized naively (greedy longest match; sanity only)")
    ap.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--steps", type=int, default=0, help="also greedy-decode N tokens")
    ap.add_argument("--adapter", metavar="PEFT_DIR", help="merge this LoRA adapter (float64) first")
    args = ap.parse_args(argv)

    t0 = time.time()
    m = load_model(args.gguf)
    if args.adapter:
        m = with_lora(m, args.adapter)
    t1 = time.time()
    if args.ids and args.prompt:
        ap.error("--ids and --prompt are exclusive")
    if args.ids:
        ids = [int(s) for s in args.ids.replace(" ", "").split(",") if s]
    elif args.prompt is not None:
        ids = naive_tokenize(m, args.prompt)
    else:
        ids = list(DEFAULT_IDS)
    logits = forward(ids, model=m)
    t2 = time.time()

    k = max(1, min(args.top, logits.shape[1]))
    top, argmax, margins = [], [], []
    for row in logits:
        idx = np.argpartition(-row, k)[:k] if k < len(row) else np.arange(len(row))
        idx = idx[np.argsort(-row[idx], kind="stable")]
        top.append([[int(i), float(row[i])] for i in idx])
        argmax.append(int(idx[0]))
        srt = np.partition(-row, 1)[:2]
        margins.append(float(-srt[0] + srt[1]))
    print("gemma3_ref: %s: n_layer %d n_embd %d vocab %d" % (
        os.path.basename(args.gguf), m.config["n_layer"], m.config["n_embd"], m.config["n_vocab"]))
    print("ids: %s  (%r)" % (",".join(map(str, ids)), decode(m, ids)))
    for p, (i, tp, mg) in enumerate(zip(ids, top, margins)):
        print("  pos %3d id %6d %-14r -> %s  margin %.4f" % (
            p, i, m.tokens[i], ", ".join("%d %r %.3f" % (t, m.tokens[t], l) for t, l in tp),
            mg))
    result = {"gguf": os.path.basename(args.gguf), "ids": ids,
              "logits_last": [float(v) for v in logits[-1]],
              "top": top, "argmax": argmax, "margins": margins}
    t3 = time.time()
    if args.steps > 0:
        gen = greedy(ids, args.steps, model=m)
        result["generated"] = gen
        print("greedy %d: %s  %r" % (args.steps, ",".join(map(str, gen)), decode(m, gen)))
    t4 = time.time()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    print("timing: load %.1f s, forward (%d tokens) %.1f s, greedy %.1f s, total %.1f s"
          % (t1 - t0, len(ids), t2 - t1, t4 - t3, time.time() - t0), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Independent float64 NumPy reference forward pass for llama2.c checkpoints.

Written only for shardlm's golden tests: it follows the semantics of Andrej Karpathy's
llama2.c `run.c` (not shardlm's code), but computes everything in float64 and recomputes
the full sequence on every step (no KV cache), so that it is short and obviously correct.

Checkpoint format (llama2.c "legacy" version 0):
  7 x int32 header: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
      (vocab_size < 0 => untied classifier stored at the end; > 0 => classifier tied to
       the token embedding)
  float32 weights, in this order:
      token_embedding (vocab, dim)
      rms_att  (L, dim)
      wq       (L, dim, dim)            rows = output features (x_out = wq @ x)
      wk       (L, kv_dim, dim)
      wv       (L, kv_dim, dim)
      wo       (L, dim, dim)
      rms_ffn  (L, dim)
      w1       (L, hidden, dim)          gate
      w2       (L, dim, hidden)          down
      w3       (L, hidden, dim)          up
      rms_final (dim)
      freq_cis_real (seq_len, head_size/2)   skipped
      freq_cis_imag (seq_len, head_size/2)   skipped
      wcls     (vocab, dim)              only when not tied

Model semantics (run.c):
  RMSNorm: x / sqrt(mean(x^2) + 1e-5) * w
  RoPE: for i in range(0, dim, 2): head_dim = i % head_size;
        freq = 1 / 10000^(head_dim / head_size); rotate the ADJACENT pair (v[i], v[i+1])
        by angle pos*freq (for q everywhere, for k where i < kv_dim).
  attention: causal, scale 1/sqrt(head_size), GQA: query head h reads kv head
        h // (n_heads // n_kv_heads)
  FFN: w2 @ (silu(w1 @ x) * (w3 @ x))
  logits = wcls @ rmsnorm(x, rms_final)

CLI:
  python3 llama2c_ref.py --checkpoint PATH --steps N [--prompt-ids 1,2,3]
                         [--tokenizer tok512.bin] [--json] [--log-steps K]
Greedy-decodes N new tokens after the prompt (default prompt: [1] = BOS; it never stops
early at BOS/EOS, unlike llama2.c). Prints the generated ids, space separated, or with
--json one JSON object:
  {"checkpoint", "config", "prompt_ids", "generated_ids",
   "logits_first": logits (vocab floats) at the prompt's last position,
   "logits_step": [logits that chose generated_ids[k], for k < min(N, K)] (K = --log-steps,
                   default 4; logits_step[0] == logits_first),
   "text": decoded generated tokens (only with --tokenizer)}

Importable API:
  load_checkpoint(path) -> (config dict, weights dict of float64 arrays)
  forward(tokens, config=None, weights=None, checkpoint=None) -> logits (T, vocab) float64
  greedy(config, weights, prompt_ids, steps) -> (generated ids, list of logits per step)
  load_tokenizer(path) / decode(vocab, ids)  (llama2.c tokenizer.bin format)
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np


# --------------------------------------------------------------------------- checkpoint

def load_checkpoint(path):
    """Read a llama2.c checkpoint. Returns (config, weights) with float64 weights."""
    with open(path, "rb") as f:
        raw = f.read()
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = struct.unpack_from("<7i", raw, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    head_size = dim // n_heads
    kv_dim = dim * n_kv_heads // n_heads
    data = np.frombuffer(raw, dtype="<f4", offset=7 * 4)

    pos = [0]

    def take(*shape):
        n = int(np.prod(shape))
        if pos[0] + n > data.size:
            raise ValueError("%s: truncated checkpoint" % path)
        a = data[pos[0]:pos[0] + n].astype(np.float64).reshape(shape)
        pos[0] += n
        return a

    L = n_layers
    w = {}
    w["token_embedding"] = take(vocab, dim)
    w["rms_att"] = take(L, dim)
    w["wq"] = take(L, dim, dim)
    w["wk"] = take(L, kv_dim, dim)
    w["wv"] = take(L, kv_dim, dim)
    w["wo"] = take(L, dim, dim)
    w["rms_ffn"] = take(L, dim)
    w["w1"] = take(L, hidden, dim)
    w["w2"] = take(L, dim, hidden)
    w["w3"] = take(L, hidden, dim)
    w["rms_final"] = take(dim)
    take(seq_len, head_size // 2)  # freq_cis_real (unused)
    take(seq_len, head_size // 2)  # freq_cis_imag (unused)
    w["wcls"] = w["token_embedding"] if shared else take(vocab, dim)
    if pos[0] != data.size:
        raise ValueError("%s: %d trailing floats" % (path, data.size - pos[0]))

    config = dict(dim=dim, hidden_dim=hidden, n_layers=n_layers, n_heads=n_heads,
                  n_kv_heads=n_kv_heads, vocab_size=vocab, seq_len=seq_len,
                  shared_classifier=shared, head_size=head_size, kv_dim=kv_dim)
    return config, w


# --------------------------------------------------------------------------- forward

def _rmsnorm(x, weight, eps=1e-5):
    # x: (T, dim)
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * weight


def _rope_llama2c(vec, T, head_size, width):
    """In place RoPE exactly as run.c does it, on vec (T, width), positions 0..T-1.

    Pair (i, i+1) for even i; head_dim = i % head_size; freq = 10000^-(head_dim/head_size).
    """
    i = np.arange(0, width, 2)
    head_dim = (i % head_size).astype(np.float64)
    freq = 1.0 / np.power(10000.0, head_dim / head_size)          # (width/2,)
    val = np.arange(T, dtype=np.float64)[:, None] * freq[None, :]   # (T, width/2)
    fcr, fci = np.cos(val), np.sin(val)
    v0 = vec[:, 0::2].copy()
    v1 = vec[:, 1::2].copy()
    vec[:, 0::2] = v0 * fcr - v1 * fci
    vec[:, 1::2] = v0 * fci + v1 * fcr
    return vec


def _silu(x):
    return x / (1.0 + np.exp(-x))


def forward(tokens, config=None, weights=None, checkpoint=None, hidden=False):
    """Full causal forward over `tokens` (positions 0..T-1). Returns logits (T, vocab), or with
    hidden the final hidden states after the final norm (T, dim): what embeddings pool."""
    if config is None or weights is None:
        config, weights = load_checkpoint(checkpoint)
    c, w = config, weights
    tokens = [int(t) for t in tokens]
    T = len(tokens)
    if T == 0:
        raise ValueError("empty token list")
    if T > c["seq_len"]:
        raise ValueError("sequence of %d exceeds seq_len %d" % (T, c["seq_len"]))
    for t in tokens:
        if not 0 <= t < c["vocab_size"]:
            raise ValueError("token id %d out of range" % t)
    dim, hs = c["dim"], c["head_size"]
    nh, nkv = c["n_heads"], c["n_kv_heads"]
    kv_mul = nh // nkv

    x = w["token_embedding"][tokens].copy()          # (T, dim)
    causal = np.triu(np.ones((T, T), dtype=bool), k=1)  # True above the diagonal = masked
    for l in range(c["n_layers"]):
        xb = _rmsnorm(x, w["rms_att"][l])
        q = xb @ w["wq"][l].T                          # (T, dim)
        k = xb @ w["wk"][l].T                          # (T, kv_dim)
        v = xb @ w["wv"][l].T
        _rope_llama2c(q, T, hs, dim)
        _rope_llama2c(k, T, hs, c["kv_dim"])
        out = np.empty((T, dim))
        for h in range(nh):
            kh = h // kv_mul
            qh = q[:, h * hs:(h + 1) * hs]
            khd = k[:, kh * hs:(kh + 1) * hs]
            vh = v[:, kh * hs:(kh + 1) * hs]
            att = (qh @ khd.T) / math.sqrt(hs)         # (T, T)
            att[causal] = -np.inf
            att = att - att.max(axis=1, keepdims=True)
            att = np.exp(att)
            att /= att.sum(axis=1, keepdims=True)
            out[:, h * hs:(h + 1) * hs] = att @ vh
        x = x + out @ w["wo"][l].T
        xb = _rmsnorm(x, w["rms_ffn"][l])
        hb = _silu(xb @ w["w1"][l].T) * (xb @ w["w3"][l].T)
        x = x + hb @ w["w2"][l].T
    x = _rmsnorm(x, w["rms_final"])
    return x if hidden else x @ w["wcls"].T


def greedy(config, weights, prompt_ids, steps):
    """Greedy decoding (argmax, lowest id on ties), full recompute each step."""
    ids = list(prompt_ids)
    gen, step_logits = [], []
    for _ in range(steps):
        logits = forward(ids, config, weights)[-1]
        nxt = int(np.argmax(logits))
        step_logits.append(logits)
        gen.append(nxt)
        ids.append(nxt)
    return gen, step_logits


# --------------------------------------------------------------------------- tokenizer

def load_tokenizer(path, vocab_size=None):
    """llama2.c tokenizer.bin: int32 max_token_length, then per token: f32 score, int32 len,
    len bytes. Returns a list of byte strings."""
    with open(path, "rb") as f:
        raw = f.read()
    off = 4
    vocab = []
    while off < len(raw) and (vocab_size is None or len(vocab) < vocab_size):
        _score, n = struct.unpack_from("<fi", raw, off)
        off += 8
        vocab.append(raw[off:off + n])
        off += n
    return vocab


def decode(vocab, ids, prev=None, bos=1):
    """Decode like run.c's decode(): strip the leading space of a piece right after BOS,
    turn '<0xXX>' pieces into raw bytes. `prev` is the token before ids[0] (e.g. the last
    prompt token). Returns a str (UTF-8, invalid bytes replaced)."""
    out = bytearray()
    for t in ids:
        piece = vocab[t]
        if prev == bos and piece.startswith(b" "):
            piece = piece[1:]
        if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
            try:
                piece = bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        out += piece
        prev = t
    return out.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------- CLI

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--prompt-ids", default="1", help="comma-separated token ids (default 1 = BOS)")
    ap.add_argument("--tokenizer", help="llama2.c tokenizer .bin, to decode text")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--log-steps", type=int, default=4,
                    help="with --json, how many steps' logits to include in logits_step")
    a = ap.parse_args(argv)

    prompt = [int(s) for s in a.prompt_ids.split(",") if s.strip() != ""]
    config, weights = load_checkpoint(a.checkpoint)
    if a.steps > 0:
        gen, step_logits = greedy(config, weights, prompt, a.steps)
        logits_first = step_logits[0]
    else:
        gen, step_logits = [], []
        logits_first = forward(prompt, config, weights)[-1]
    text = None
    if a.tokenizer:
        # like llama2.c, the text is that of the generated tokens only
        text = decode(load_tokenizer(a.tokenizer, config["vocab_size"]), gen, prev=prompt[-1])

    if a.json:
        obj = {
            "checkpoint": os.path.basename(a.checkpoint),
            "config": config,
            "prompt_ids": prompt,
            "generated_ids": gen,
            "logits_first": [float(v) for v in logits_first],
            "logits_step": [[float(v) for v in lg] for lg in step_logits[:max(0, a.log_steps)]],
        }
        if text is not None:
            obj["text"] = text
        json.dump(obj, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(" ".join(str(t) for t in gen))
        if text is not None:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

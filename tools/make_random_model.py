#!/usr/bin/env python3
"""tools/make_random_model.py - a Hugging Face-layout Llama checkpoint with random weights, for
benchmarks only (shardlm and transformers both load it; speed does not depend on the values).

usage: tools/make_random_model.py --out DIR [--preset llama3.2-1b|tiny] [--dtype bf16|f32] [--seed S]

DIR receives:
  config.json        LlamaForCausalLM, the preset's shape, bos 1 / eos 2 (the tokenizer's ids)
  model.safetensors  written by hand (8-byte header length, header JSON padded with spaces to a
                     multiple of 8, raw little-endian tensors), tensor names as
                     LlamaForCausalLM.save_pretrained writes them (tests/reference/make_models.py)
  tokenizer.model    a hand-made SentencePiece model (BPE, byte fallback): <unk> <s> </s>, the
                     256 byte pieces, U+2581 and the printable ASCII characters (354 pieces),
                     then UNUSED pieces <extra_N> up to the model's vocab_size, so that text
                     prompts encode and every sampled id decodes (as "<extra_N>").

Presets:
  llama3.2-1b  hidden 2048, 16 layers, 32 heads, 8 KV heads, head_dim 64, intermediate 8192,
               vocab 128256, tied embeddings, rope_theta 500000, max_position_embeddings 8192
               (1.236e9 parameters, 2.47 GB in bf16). Llama 3.2's rope_scaling {"rope_type":
               "llama3", ...} is left out: shardlm refuses scaled rotary embeddings, so both
               engines run plain RoPE (the same cost per token).
  tiny         the same structure (GQA 2:1, tied, SiLU MLP): hidden 128, 2 layers, 4 heads, 2 KV
               heads, head_dim 32, intermediate 256, vocab 512; for tests on a CPU.

Weights ~ N(0, 0.02), norm weights 1; bf16 from float32 by round-to-nearest-even on the bits.
Generated in float32 chunks of 4 Mi elements, each from its own generator (seeded by seed,
tensor, chunk: the file is the same for any --threads), made by --threads threads and written in
order with at most 2 x threads chunks in flight: memory ~50 MB per thread whatever the model
size. Needs numpy only.
"""
import argparse
import collections
import concurrent.futures
import itertools
import json
import os
import struct
import sys
import time

import numpy as np

PRESETS = {
    "llama3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=64, intermediate_size=8192, vocab_size=128256, rope_theta=500000.0,
                        max_position_embeddings=8192),
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=32, intermediate_size=256, vocab_size=512, rope_theta=500000.0,
                 max_position_embeddings=1024),
}
DTYPES = {"bf16": ("BF16", 2, "bfloat16"), "f32": ("F32", 4, "float32")}
CHUNK = 4 << 20  # float32 elements generated at once, per thread
STD = 0.02


def config(preset, dtype):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    c.update(PRESETS[preset])
    c.update({
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": STD,
        "use_cache": True,
        "torch_dtype": DTYPES[dtype][2],
    })
    return c


def tensor_shapes(c):
    """[(name, shape, is_norm)] in model order; lm_head is tied to embed_tokens (not written)."""
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    out = [("model.embed_tokens.weight", (V, H), False)]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", (H,), True),
                (p + "self_attn.q_proj.weight", (q, H), False),  # nn.Linear: (out, in)
                (p + "self_attn.k_proj.weight", (kv, H), False),
                (p + "self_attn.v_proj.weight", (kv, H), False),
                (p + "self_attn.o_proj.weight", (H, q), False),
                (p + "post_attention_layernorm.weight", (H,), True),
                (p + "mlp.gate_proj.weight", (I, H), False),
                (p + "mlp.up_proj.weight", (I, H), False),
                (p + "mlp.down_proj.weight", (H, I), False)]
    out.append(("model.norm.weight", (H,), True))
    return out


def bf16_bits(f):
    """float32 array -> uint16 bf16 bits, round to nearest even on the uint32 bits. Overwrites f
    (no NaN comes from a normal sample, and no finite float overflows the addition)."""
    u = f.view(np.uint32)
    t = np.right_shift(u, 16)
    np.bitwise_and(t, 1, out=t)
    t += np.uint32(0x7FFF)
    u += t
    return np.ascontiguousarray(u.view("<u2")[1::2])  # the high halves (little endian)


def make_chunk(job):
    """job: (seed, tensor index, chunk index, n elements, is_norm, dtype) -> bytes-like array.
    Each chunk has its own generator, so that chunks are made in parallel and the file does
    not depend on the number of threads."""
    seed, ti, ci, m, is_norm, dtype = job
    if is_norm:
        a = np.ones(m, np.float32)
    else:
        a = np.random.default_rng([seed, ti, ci]).standard_normal(m, dtype=np.float32)
        a *= np.float32(STD)
    return bf16_bits(a) if dtype == "bf16" else a


def chunk_jobs(shapes, dtype, seed):
    for ti, (_, shape, is_norm) in enumerate(shapes):
        n = int(np.prod(shape))
        for ci, start in enumerate(range(0, n, CHUNK)):
            yield (seed, ti, ci, min(CHUNK, n - start), is_norm, dtype)


def write_safetensors(path, shapes, dtype, seed, threads):
    st_dtype, size, _ = DTYPES[dtype]
    header, off = {}, 0
    for name, shape, _ in shapes:
        nbytes = int(np.prod(shape)) * size
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    header["__metadata__"] = {"format": "pt"}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((-len(hj)) % 8)
    tmp = path + ".tmp"
    # numpy releases the GIL in its generators and ufuncs: threads make chunks in parallel and
    # the main thread writes them in order, at most 2 x threads chunks in flight.
    jobs = chunk_jobs(shapes, dtype, seed)
    with open(tmp, "wb") as f, concurrent.futures.ThreadPoolExecutor(threads) as pool:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        pending = collections.deque(pool.submit(make_chunk, j) for j in itertools.islice(jobs, 2 * threads))
        while pending:
            f.write(pending.popleft().result())
            for j in itertools.islice(jobs, 1):
                pending.append(pool.submit(make_chunk, j))
        if f.tell() != 8 + len(hj) + off:
            sys.exit("make_random_model: wrote %d bytes, expected %d" % (f.tell(), 8 + len(hj) + off))
    os.replace(tmp, path)
    return off


# ---- a SentencePiece ModelProto, by hand (the fields engine/formats/gguf_tokenizer.c writes) ----
def _varint(v):
    v &= (1 << 64) - 1
    out = b""
    while v >= 0x80:
        out += bytes([v & 0x7F | 0x80])
        v >>= 7
    return out + bytes([v])


def _f_int(n, v):
    return _varint(n << 3) + _varint(v)


def _f_bytes(n, b):
    b = b.encode("utf-8") if isinstance(b, str) else b
    return _varint(n << 3 | 2) + _varint(len(b)) + b


def _f_float(n, x):
    return _varint(n << 3 | 5) + struct.pack("<f", x)


SP_NORMAL, SP_UNKNOWN, SP_CONTROL, SP_UNUSED, SP_BYTE = 1, 2, 3, 5, 6


def tokenizer_proto(vocab_size):
    """The serialized ModelProto and its number of pieces: vocab_size, padded with UNUSED pieces
    <extra_N> (never produced by encoding, decoded as their text) when it is larger than the 354
    real ones, so that every id a model samples decodes."""
    pieces = [("<unk>", 0.0, SP_UNKNOWN), ("<s>", 0.0, SP_CONTROL), ("</s>", 0.0, SP_CONTROL)]
    pieces += [("<0x%02X>" % b, 0.0, SP_BYTE) for b in range(256)]
    pieces += [("\u2581", -1.0, SP_NORMAL)]
    pieces += [(chr(c), -2.0, SP_NORMAL) for c in range(0x21, 0x7F)]
    pieces += [("<extra_%d>" % i, 0.0, SP_UNUSED) for i in range(vocab_size - len(pieces))]
    out = b"".join(_f_bytes(1, _f_bytes(1, p) + _f_float(2, s) + _f_int(3, t)) for p, s, t in pieces)
    trainer = (_f_int(3, 2) + _f_int(4, len(pieces)) + _f_int(35, 1) +  # BPE, vocab, byte_fallback
               _f_int(40, 0) + _f_int(41, 1) + _f_int(42, 2) + _f_int(43, (1 << 64) - 1) +  # unk bos eos pad=-1
               _f_bytes(45, "<unk>") + _f_bytes(46, "<s>") + _f_bytes(47, "</s>"))
    normalizer = _f_bytes(1, "identity") + _f_int(3, 1) + _f_int(4, 0) + _f_int(5, 1)
    return out + _f_bytes(2, trainer) + _f_bytes(3, normalizer), len(pieces)


def main(argv=None):
    ap = argparse.ArgumentParser(description="write a random-weight Hugging Face Llama checkpoint (benchmarks)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama3.2-1b")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1),
                    help="threads making the weights (default: the cores, at most 16)")
    a = ap.parse_args(argv)
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    for stale in os.listdir(a.out):  # no mix of layouts (a sharded index left from before)
        if stale.startswith("model") and (stale.endswith(".safetensors") or stale.endswith(".index.json")):
            os.remove(os.path.join(a.out, stale))
    c = config(a.preset, a.dtype)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
        f.write("\n")
    proto, n_pieces = tokenizer_proto(c["vocab_size"])
    with open(os.path.join(a.out, "tokenizer.model"), "wb") as f:
        f.write(proto)
    shapes = tensor_shapes(c)
    nbytes = write_safetensors(os.path.join(a.out, "model.safetensors"), shapes, a.dtype, a.seed, max(1, a.threads))
    n_params = sum(int(np.prod(s)) for _, s, _ in shapes)
    print("make_random_model: %s (%s) -> %s: %d tensors, %.4g parameters, %.3f GB; tokenizer %d pieces "
          "(model vocab %d); %.1f s" % (a.preset, a.dtype, a.out, len(shapes), n_params, nbytes / 1e9, n_pieces,
                                        c["vocab_size"], time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Writes a small random Llama-architecture GGUF whose matrices cover every tensor type shardlm
reads (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
IQ4_XS), with gguf-py. Written only for shardlm's golden test golden_gguf_types
(tests/gguf_types_setup.sh); its reference is tests/reference/llama_gguf_ref.py, a float64
NumPy forward over gguf-py's dequantization of this file.

gguf-py quantizes F16, BF16 and Q4_0 ... Q8_0 itself (from random normal weights); for the
others (the K-quants and the IQ4 types) it only dequantizes, so their blocks are random bytes
(every pattern of quants and packed scales) with the f16 scale fields set to finite values
that keep the weights O(0.01 .. 0.1). The fused groups of the model (q/k/v, gate/up) share a
type; the layer table below says which matrix holds which type.

  gguf_types_model.py --out FILE.gguf
"""
import argparse
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as Q
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (pip install gguf)")
    sys.exit(77)

V, D, FFN, N_HEAD, N_KV, HD = 320, 256, 512, 4, 2, 64

# Per layer: (q/k/v, o, gate/up, down).
LAYERS = [
    (Q.F16, Q.F32, Q.BF16, Q.Q4_0),
    (Q.Q8_0, Q.Q4_1, Q.Q5_0, Q.Q5_1),
    (Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS),
    (Q.Q5_K, Q.IQ4_XS, Q.Q3_K, Q.Q2_K),
]
EMBD, OUTPUT = Q.Q4_K, Q.Q6_K

# The f16 fields of the types written as random blocks: (byte offset, magnitude of the value).
F16_FIELDS = {
    Q.Q2_K: [(80, 2e-3), (82, 2e-3)],
    Q.Q3_K: [(108, 5e-4)],
    Q.Q4_K: [(0, 1e-4), (2, 1e-4)],
    Q.Q5_K: [(0, 5e-5), (2, 5e-5)],
    Q.Q6_K: [(208, 1e-5)],
    Q.IQ4_NL: [(0, 5e-4)],
    Q.IQ4_XS: [(0, 2e-5)],
}


def test_vocab(g, V):
    """A SentencePiece-style vocabulary of V distinct pieces for a test GGUF (the models are fed
    ids, not text): <unk> <s> </s>, then "\u2581t3" ... with BOS 1 and EOS 2."""
    g.add_tokenizer_model("llama")
    g.add_token_list(["<unk>", "<s>", "</s>"] + ["\u2581t%d" % i for i in range(3, V)])
    g.add_token_scores([0.0] * V)
    g.add_token_types([2, 3, 3] + [1] * (V - 3))
    g.add_bos_token_id(1)
    g.add_eos_token_id(2)


def matrix(rng, qtype, rows, cols):
    """(data, raw_dtype) for gguf.GGUFWriter.add_tensor: a (rows, cols) matrix of type qtype."""
    if qtype in F16_FIELDS:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nb = rows * cols // block
        raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
        for off, mag in F16_FIELDS[qtype]:
            h = (mag * rng.uniform(0.5, 1.5, nb) * rng.choice([-1.0, 1.0], nb)).astype(np.float16)
            raw[:, off:off + 2] = h.view(np.uint8).reshape(nb, 2)
        return raw.reshape(rows, -1), qtype
    f = (rng.standard_normal((rows, cols)) * 0.04).astype(np.float32)
    if qtype == Q.F32:
        return f, None
    if qtype == Q.F16:
        return f.astype(np.float16), None
    return gguf.quants.quantize(f, qtype), qtype


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rng = np.random.default_rng(27)
    g = gguf.GGUFWriter(a.out, arch="llama")
    g.add_uint32("llama.block_count", len(LAYERS))
    g.add_uint32("llama.context_length", 256)
    g.add_uint32("llama.embedding_length", D)
    g.add_uint32("llama.feed_forward_length", FFN)
    g.add_uint32("llama.attention.head_count", N_HEAD)
    g.add_uint32("llama.attention.head_count_kv", N_KV)
    g.add_uint32("llama.rope.dimension_count", HD)
    g.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    g.add_float32("llama.rope.freq_base", 10000.0)
    test_vocab(g, V)

    def put(name, qtype, rows, cols):
        data, raw = matrix(rng, qtype, rows, cols)
        g.add_tensor(name, data, raw_dtype=raw)

    def norm(name):
        g.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32))

    put("token_embd.weight", EMBD, V, D)
    for l, (qkv, o, gate_up, down) in enumerate(LAYERS):
        b = "blk.%d." % l
        norm(b + "attn_norm.weight")
        put(b + "attn_q.weight", qkv, N_HEAD * HD, D)
        put(b + "attn_k.weight", qkv, N_KV * HD, D)
        put(b + "attn_v.weight", qkv, N_KV * HD, D)
        put(b + "attn_output.weight", o, D, N_HEAD * HD)
        norm(b + "ffn_norm.weight")
        put(b + "ffn_gate.weight", gate_up, FFN, D)
        put(b + "ffn_up.weight", gate_up, FFN, D)
        put(b + "ffn_down.weight", down, D, FFN)
    norm("output_norm.weight")
    put("output.weight", OUTPUT, V, D)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""tools/make_moe_gguf.py - a random mixture-of-experts GGUF (and its dense twin) for benchmarks
only (issue 31: shardlm against llama-bench on an MoE; speed does not depend on the values).

usage: tools/make_moe_gguf.py --out FILE.gguf [--dense | --glm] [--tokenizer GGUF] [--seed S]

The model: architecture llama with expert_count (Mixtral's layout, as llama.cpp's converter writes
it): hidden 1024, 12 layers, 16 heads of 64, 4 KV heads, 8 experts of 1536 (gate, up, down:
ffn_*_exps stacked (8, rows, cols)), top 2 renormalised, tied embeddings; 0.55e9 parameters, of
which 0.21e9 are read per token (attention, 2 experts of 8, the tied head). --dense writes the
same model with one dense MLP of 2 x 1536 = 3072 instead (the MoE's active parameters, 0.21e9):
the "dense model with the same active parameters" the MoE's decode is measured against. --glm writes
the same sizes in GLM-4.5's layout (architecture glm4moe, as llama.cpp's conversion/glm.py writes
it): layer 0 dense (an MLP of 2 x 1536), the other 11 with the 8 experts behind a sigmoid router
with a selection bias (exp_probs_b), routed_scaling_factor 2.5, plus one plain shared expert of
1536 (ffn_*_shexp); q/k/v biases; 32 of each head's 64 features rotated; no MTP layer.

Every matrix (token_embd included) is Q4_K: random blocks whose two f16 scales are bounded so that
weights stay O(0.01 .. 0.1) (tests/reference/gguf_types_model.py's rule; gguf-py cannot quantize
K-quants); the router and the norms are F32 (norm weights 1, the router N(0, 0.02)). The
tokenizer (tokenizer.ggml.*, the chat template) is copied from --tokenizer (default SmolLM2's GGUF,
.cache/smollm2/, fetched by tools/fetch_smollm2.sh: 49,152 pieces), so that llama.cpp and shardlm
both load the file and encode prompts. Needs numpy and gguf (gguf-py).
"""
import argparse
import os
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as Q
except ImportError as e:  # pragma: no cover
    sys.exit(f"make_moe_gguf: {e} (pip install gguf)")

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 1024, 12, 16, 4, 64
EXPERTS, TOP_K, EXPERT_FFN = 8, 2, 1536
BLOCK, BLOCK_BYTES = 256, 144  # Q4_K: 256 weights in 144 bytes, f16 d and dmin at bytes 0 and 2


def q4k(rng, *shape):
    """Random Q4_K blocks for a matrix (or a stack of them) of logical shape (..., rows, cols)."""
    *lead, rows, cols = shape
    assert cols % BLOCK == 0, cols
    n = int(np.prod(lead, dtype=np.int64)) * rows * (cols // BLOCK)
    raw = rng.integers(0, 256, size=(n, BLOCK_BYTES), dtype=np.uint8)
    for off in (0, 2):
        h = (1e-4 * rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)).astype(np.float16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(n, 2)
    return raw.reshape(*lead, rows, cols // BLOCK * BLOCK_BYTES)


def copy_tokenizer(g, path):
    """The tokenizer's keys of the GGUF at path, as they are."""
    r = gguf.GGUFReader(path)
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
            else:
                vals = [f.parts[i].tolist()[0] for i in f.data]
            g.add_array(key, vals)
        elif t == gguf.GGUFValueType.STRING:
            g.add_string(key, bytes(f.parts[f.data[0]]).decode("utf-8"))
        elif t == gguf.GGUFValueType.BOOL:
            g.add_bool(key, bool(f.parts[f.data[0]][0]))
        else:
            g.add_uint32(key, int(f.parts[f.data[0]][0]))
    return len(r.fields["tokenizer.ggml.tokens"].data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dense", action="store_true", help="one dense MLP of the MoE's active width instead")
    ap.add_argument("--glm", action="store_true", help="GLM-4.5's layout (glm4moe): a dense first layer, shared experts")
    ap.add_argument("--tokenizer", default=".cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if not os.path.exists(a.tokenizer):
        sys.exit(f"make_moe_gguf: no tokenizer GGUF {a.tokenizer} (tools/fetch_smollm2.sh fetches the default)")
    rng = np.random.default_rng(a.seed)
    if a.dense and a.glm:
        sys.exit("make_moe_gguf: --dense and --glm exclude each other")
    A = "glm4moe" if a.glm else "llama"
    g = gguf.GGUFWriter(a.out, arch=A)
    g.add_name("shardlm random %s" % ("dense twin" if a.dense else "GLM-4.5-shaped MoE" if a.glm else "MoE 8x top-2"))
    vocab = copy_tokenizer(g, a.tokenizer)
    g.add_uint32(A + ".block_count", LAYERS)
    g.add_uint32(A + ".context_length", 4096)
    g.add_uint32(A + ".embedding_length", HIDDEN)
    g.add_uint32(A + ".feed_forward_length", TOP_K * EXPERT_FFN if a.dense or a.glm else EXPERT_FFN)
    g.add_uint32(A + ".attention.head_count", HEADS)
    g.add_uint32(A + ".attention.head_count_kv", KV_HEADS)
    g.add_uint32(A + ".attention.key_length", HEAD_DIM)
    g.add_uint32(A + ".attention.value_length", HEAD_DIM)
    g.add_uint32(A + ".rope.dimension_count", HEAD_DIM // 2 if a.glm else HEAD_DIM)
    g.add_float32(A + ".attention.layer_norm_rms_epsilon", 1e-5)
    g.add_float32(A + ".rope.freq_base", 100000.0)
    g.add_uint32("general.file_type", 15)  # MOSTLY_Q4_K_M, the closest name
    if not a.dense:
        g.add_uint32(A + ".expert_count", EXPERTS)
        g.add_uint32(A + ".expert_used_count", TOP_K)
    if a.glm:  # Glm4MoeModel.set_gguf_parameters
        g.add_uint32(A + ".expert_feed_forward_length", EXPERT_FFN)
        g.add_uint32(A + ".expert_shared_count", 1)
        g.add_uint32(A + ".leading_dense_block_count", 1)
        g.add_uint32(A + ".expert_gating_func", 2)
        g.add_float32(A + ".expert_weights_scale", 2.5)
        g.add_bool(A + ".expert_weights_norm", True)
        g.add_uint32(A + ".nextn_predict_layers", 0)
    ones = np.ones(HIDDEN, dtype=np.float32)
    g.add_tensor("token_embd.weight", q4k(rng, vocab, HIDDEN), raw_dtype=Q.Q4_K)
    params = vocab * HIDDEN
    for l in range(LAYERS):
        b = "blk.%d." % l
        g.add_tensor(b + "attn_norm.weight", ones)
        for name, rows in (("attn_q", HEADS * HEAD_DIM), ("attn_k", KV_HEADS * HEAD_DIM),
                           ("attn_v", KV_HEADS * HEAD_DIM)):
            g.add_tensor(b + name + ".weight", q4k(rng, rows, HIDDEN), raw_dtype=Q.Q4_K)
            if a.glm:  # GLM's q, k, v biases
                g.add_tensor(b + name + ".bias", (0.02 * rng.standard_normal(rows)).astype(np.float32))
            params += rows * HIDDEN
        g.add_tensor(b + "attn_output.weight", q4k(rng, HIDDEN, HEADS * HEAD_DIM), raw_dtype=Q.Q4_K)
        g.add_tensor(b + ("post_attention_norm.weight" if a.glm else "ffn_norm.weight"), ones)
        params += 2 * HEADS * HEAD_DIM * HIDDEN
        if a.dense or (a.glm and l == 0):
            F = TOP_K * EXPERT_FFN
            g.add_tensor(b + "ffn_gate.weight", q4k(rng, F, HIDDEN), raw_dtype=Q.Q4_K)
            g.add_tensor(b + "ffn_up.weight", q4k(rng, F, HIDDEN), raw_dtype=Q.Q4_K)
            g.add_tensor(b + "ffn_down.weight", q4k(rng, HIDDEN, F), raw_dtype=Q.Q4_K)
            params += 3 * F * HIDDEN
            continue
        g.add_tensor(b + "ffn_gate_inp.weight", (0.02 * rng.standard_normal((EXPERTS, HIDDEN))).astype(np.float32))
        g.add_tensor(b + "ffn_gate_exps.weight", q4k(rng, EXPERTS, EXPERT_FFN, HIDDEN), raw_dtype=Q.Q4_K)
        g.add_tensor(b + "ffn_up_exps.weight", q4k(rng, EXPERTS, EXPERT_FFN, HIDDEN), raw_dtype=Q.Q4_K)
        g.add_tensor(b + "ffn_down_exps.weight", q4k(rng, EXPERTS, HIDDEN, EXPERT_FFN), raw_dtype=Q.Q4_K)
        params += EXPERTS * (1 + 3 * EXPERT_FFN) * HIDDEN
        if a.glm:  # the selection bias and the plain shared expert
            g.add_tensor(b + "exp_probs_b.bias", (0.01 * rng.standard_normal(EXPERTS)).astype(np.float32))
            g.add_tensor(b + "ffn_gate_shexp.weight", q4k(rng, EXPERT_FFN, HIDDEN), raw_dtype=Q.Q4_K)
            g.add_tensor(b + "ffn_up_shexp.weight", q4k(rng, EXPERT_FFN, HIDDEN), raw_dtype=Q.Q4_K)
            g.add_tensor(b + "ffn_down_shexp.weight", q4k(rng, HIDDEN, EXPERT_FFN), raw_dtype=Q.Q4_K)
            params += 3 * EXPERT_FFN * HIDDEN
    g.add_tensor("output_norm.weight", ones)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    print("make_moe_gguf: wrote %s (%.3g parameters, %.0f MiB)" % (a.out, params, os.path.getsize(a.out) / 2**20))


if __name__ == "__main__":
    main()

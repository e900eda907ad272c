#!/usr/bin/env python3
"""Writes a small random Mixtral GGUF (architecture llama with expert_count, as llama.cpp's
converter writes Mixtral) whose stacked experts (ffn_gate_exps, ffn_up_exps, ffn_down_exps:
(experts, rows, cols)) are block-quantized, with gguf-py, and its float64 reference. Written only
for shardlm's golden tests golden_gguf_moe_quant* (tests/CMakeLists.txt).

The model is make_models.py's Mixtral (8 experts, top 2, renormalised) widened to hidden 256 and
intermediate 256 (4 heads of 64, 2 KV heads) so that the K-quants' blocks of 256 fit the experts'
rows. The experts' types per layer are in EXPERTS: Q8_0 and Q4_0 are quantized by gguf-py from the
random f32 weights; Q4_K and Q6_K, which gguf-py only dequantizes, are random blocks with bounded
f16 scales (gguf_types_model.matrix). The router, attention and the rest stay F32. The reference is
make_models.llama_forward (float64, transformers' Mixtral block: softmax, top 2, renormalised) over
gguf-py's dequantization of every expert.

  moe_quant_gguf.py --out FILE.gguf --ref OUT.json
"""
import argparse
import json
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as Q
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (pip install gguf)")
    sys.exit(77)

import gguf_types_model
import make_models as MM
from hf_to_gguf import permute

IDS = [1, 45, 210, 7, 99, 300, 12, 180, 64, 3, 250, 17, 128, 77, 5, 301, 42, 160, 8, 219, 90, 33, 275, 11, 140, 66,
       199, 4, 310, 58, 121, 26]
# Per layer: the types of (ffn_gate_exps, ffn_up_exps, ffn_down_exps).
EXPERTS = [(Q.Q8_0, Q.Q8_0, Q.Q4_K), (Q.Q4_K, Q.Q6_K, Q.Q4_0)]


def config():
    cfg = MM.moe_config("mixtral")
    cfg.update({"hidden_size": 256, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 64, "num_hidden_layers": len(EXPERTS)})
    return cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ref", required=True)
    a = ap.parse_args()
    cfg = config()
    w = MM.init_llama(cfg, 41)  # float64
    rng = np.random.default_rng(42)
    H, nh, nkv, hd, I = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                         cfg["intermediate_size"])
    E, K, V = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["vocab_size"]
    A = "llama"
    g = gguf.GGUFWriter(a.out, arch=A)
    g.add_uint32(A + ".block_count", cfg["num_hidden_layers"])
    g.add_uint32(A + ".context_length", cfg["max_position_embeddings"])
    g.add_uint32(A + ".embedding_length", H)
    g.add_uint32(A + ".feed_forward_length", I)
    g.add_uint32(A + ".attention.head_count", nh)
    g.add_uint32(A + ".attention.head_count_kv", nkv)
    g.add_uint32(A + ".attention.key_length", hd)
    g.add_uint32(A + ".attention.value_length", hd)
    g.add_uint32(A + ".rope.dimension_count", hd)
    g.add_float32(A + ".attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    g.add_float32(A + ".rope.freq_base", cfg["rope_theta"])
    g.add_uint32(A + ".expert_count", E)
    g.add_uint32(A + ".expert_used_count", K)
    gguf_types_model.test_vocab(g, V)

    def put(name, arr):
        g.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    def stacked(name, qtype, mats):
        """Writes the experts' matrices (E of (rows, cols)) as one (E, rows, cols) tensor of qtype;
        returns gguf-py's dequantization of each."""
        rows, cols = mats[0].shape
        raws = []
        for f in mats:
            if qtype in gguf_types_model.F16_FIELDS:  # gguf-py cannot quantize these: random blocks
                raw, _ = gguf_types_model.matrix(rng, qtype, rows, cols)
            else:
                raw = gguf.quants.quantize(f.astype(np.float32), qtype)
            raws.append(raw)
        raw = np.stack(raws)  # (E, rows, bytes of a row)
        g.add_tensor(name, raw, raw_dtype=qtype)
        return [gguf.quants.dequantize(r, qtype).astype(np.float64).reshape(rows, cols) for r in raws]

    put("token_embd.weight", w["model.embed_tokens.weight"])
    ref_w = dict(w)
    for l, types in enumerate(EXPERTS):
        p, b = "model.layers.%d." % l, "blk.%d." % l
        put(b + "attn_norm.weight", w[p + "input_layernorm.weight"])
        put(b + "attn_q.weight", permute(w[p + "self_attn.q_proj.weight"], nh))
        put(b + "attn_k.weight", permute(w[p + "self_attn.k_proj.weight"], nkv))
        put(b + "attn_v.weight", w[p + "self_attn.v_proj.weight"])
        put(b + "attn_output.weight", w[p + "self_attn.o_proj.weight"])
        put(b + "ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        put(b + "ffn_gate_inp.weight", w[p + "block_sparse_moe.gate.weight"])
        for src, dst, qtype in zip(("w1", "w3", "w2"), ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), types):
            keys = [p + "block_sparse_moe.experts.%d.%s.weight" % (e, src) for e in range(E)]
            for key, deq in zip(keys, stacked(b + dst + ".weight", qtype, [w[k] for k in keys])):
                ref_w[key] = deq
    put("output_norm.weight", w["model.norm.weight"])
    put("output.weight", w["lm_head.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()

    logits = MM.llama_forward(cfg, ref_w, IDS)
    top2 = np.sort(logits, axis=1)[:, -2:]
    json.dump({"ids": IDS, "logits_last": logits[-1].tolist(), "argmax": [int(i) for i in logits.argmax(axis=1)],
               "margins": (top2[:, 1] - top2[:, 0]).tolist()}, open(a.ref, "w"))
    print("moe_quant_gguf: wrote %s (experts gate / up / down per layer: %s); last logits range %.3g" %
          (a.out, ", ".join("/".join(t.name for t in x) for x in EXPERTS), float(np.ptp(logits[-1]))))


if __name__ == "__main__":
    main()

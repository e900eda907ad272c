#!/usr/bin/env python3
"""Writes a small random Phi-3 GGUF (architecture phi3) whose fused tensors are block-quantized, with
gguf-py, and its float64 reference. Written only for shardlm's golden tests golden_gguf_phi3_quant*
(tests/CMakeLists.txt); the layout follows convert_hf_to_gguf.py's Phi3MiniModel as
tests/reference/hf_to_gguf.py does for the f32 file: attn_qkv holds qkv_proj's rows [q | k | v],
ffn_up holds gate_up_proj's [gate | up], LongRoPE as rope_factors_long / _short tensors.

The model is make_models.py's Phi-3 (partial rotary 0.75, LongRoPE, a sliding window of 10, GQA)
widened to hidden 256 (4 heads of 64, 2 KV heads, intermediate 256) so that the K-quants' blocks of
256 fit its rows. Layer 0: attn_qkv Q8_0 (gguf-py quantizes the random f32 weights), ffn_up Q4_K;
layer 1: attn_qkv Q4_K, ffn_up Q8_0. gguf-py only dequantizes Q4_K, so those tensors are random
blocks with bounded f16 scales (gguf_types_model.matrix). The other matrices and the vectors stay
F32. The reference is make_models.llama_forward (float64) over gguf-py's dequantization of the
fused tensors, split into q/k/v and gate/up as Phi3ForCausalLM splits them.

  phi3_quant_gguf.py --out FILE.gguf --ref OUT.json
"""
import argparse
import json
import math
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

IDS = [1, 45, 210, 7, 99, 300, 12, 180, 64, 3, 250, 17, 128, 77, 5, 301, 42, 160, 8, 219, 90, 33, 275, 11, 140, 66,
       199, 4, 310, 58, 121, 26, 240, 81, 13, 170, 95, 288, 36, 150]
# Per layer: (attn_qkv, ffn_up).
FUSED = [(Q.Q8_0, Q.Q4_K), (Q.Q4_K, Q.Q8_0)]


def config():
    cfg = MM.phi3_config("f32")
    cfg.update({"hidden_size": 256, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 64, "num_hidden_layers": len(FUSED)})
    rot = int(cfg["head_dim"] * cfg["partial_rotary_factor"])  # 48: LongRoPE has rot / 2 factors
    n = rot // 2
    cfg["rope_scaling"] = {"type": "longrope", "short_factor": [1.0 + 0.25 * i for i in range(n)],
                           "long_factor": [1.0 + 1.5 * i for i in range(n)]}
    return cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ref", required=True)
    a = ap.parse_args()
    cfg = config()
    w = MM.init_llama(cfg, 31)  # float64, unfused names
    rng = np.random.default_rng(32)
    H, nh, nkv, hd, I = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                         cfg["intermediate_size"])
    A = "phi3"
    g = gguf.GGUFWriter(a.out, arch=A)
    g.add_uint32(A + ".block_count", cfg["num_hidden_layers"])
    g.add_uint32(A + ".context_length", cfg["max_position_embeddings"])
    g.add_uint32(A + ".embedding_length", H)
    g.add_uint32(A + ".feed_forward_length", I)
    g.add_uint32(A + ".attention.head_count", nh)
    g.add_uint32(A + ".attention.head_count_kv", nkv)
    g.add_uint32(A + ".rope.dimension_count", int(cfg["partial_rotary_factor"] * H) // nh)
    g.add_uint32(A + ".rope.scaling.original_context_length", cfg["original_max_position_embeddings"])
    g.add_uint32(A + ".attention.sliding_window", cfg["sliding_window"])
    g.add_float32(A + ".attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    g.add_float32(A + ".rope.freq_base", cfg["rope_theta"])
    V = cfg["vocab_size"]
    gguf_types_model.test_vocab(g, V)

    def put(name, arr):
        g.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    def fused(name, qtype, f):
        """Writes f (rows, cols) as qtype; returns gguf-py's dequantization of what was written."""
        if qtype == Q.Q8_0:
            raw = gguf.quants.quantize(f.astype(np.float32), qtype)
        else:  # gguf-py cannot quantize K-quants: random blocks with bounded scales
            raw, _ = gguf_types_model.matrix(rng, qtype, f.shape[0], f.shape[1])
        g.add_tensor(name, raw, raw_dtype=qtype)
        return gguf.quants.dequantize(raw, qtype).astype(np.float64).reshape(f.shape)

    put("token_embd.weight", w["model.embed_tokens.weight"])
    ref_w = dict(w)
    for l, (qkv_type, up_type) in enumerate(FUSED):
        p, b = "model.layers.%d." % l, "blk.%d." % l
        put(b + "attn_norm.weight", w[p + "input_layernorm.weight"])
        qkv = fused(b + "attn_qkv.weight", qkv_type,
                    np.concatenate([w[p + "self_attn.%s_proj.weight" % s] for s in ("q", "k", "v")]))
        nq, nk = nh * hd, nkv * hd
        ref_w[p + "self_attn.q_proj.weight"] = qkv[:nq]
        ref_w[p + "self_attn.k_proj.weight"] = qkv[nq:nq + nk]
        ref_w[p + "self_attn.v_proj.weight"] = qkv[nq + nk:]
        put(b + "attn_output.weight", w[p + "self_attn.o_proj.weight"])
        put(b + "ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        gu = fused(b + "ffn_up.weight", up_type,
                   np.concatenate([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]))
        ref_w[p + "mlp.gate_proj.weight"], ref_w[p + "mlp.up_proj.weight"] = gu[:I], gu[I:]
        put(b + "ffn_down.weight", w[p + "mlp.down_proj.weight"])
    rs = cfg["rope_scaling"]
    orig = cfg["original_max_position_embeddings"]
    scale = cfg["max_position_embeddings"] / orig
    g.add_float32(A + ".rope.scaling.attn_factor", math.sqrt(1 + math.log(scale) / math.log(orig)))
    put("rope_factors_long.weight", np.array(rs["long_factor"]))
    put("rope_factors_short.weight", np.array(rs["short_factor"]))
    put("output_norm.weight", w["model.norm.weight"])
    put("output.weight", w["lm_head.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()

    # shardlm caps a LongRoPE context at the original length and uses the short factors there,
    # as transformers does for a sequence within it.
    assert len(IDS) <= orig
    logits = MM.llama_forward(cfg, ref_w, IDS)
    top2 = np.sort(logits, axis=1)[:, -2:]
    json.dump({"ids": IDS, "logits_last": logits[-1].tolist(), "argmax": [int(i) for i in logits.argmax(axis=1)],
               "margins": (top2[:, 1] - top2[:, 0]).tolist()}, open(a.ref, "w"))
    print("phi3_quant_gguf: wrote %s (attn_qkv / ffn_up per layer: %s); last logits range %.3g" %
          (a.out, ", ".join("%s / %s" % (x.name, y.name) for x, y in FUSED), float(np.ptp(logits[-1]))))


if __name__ == "__main__":
    main()

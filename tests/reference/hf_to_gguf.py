#!/usr/bin/env python3
"""Writes a small Hugging Face-layout Llama / Qwen 2 / Qwen 3 / Gemma 2 / Phi-3 / OLMo 2 checkpoint, or
a mixture of experts (Mixtral as llama, Qwen 2 / 3 MoE, OLMoE),
(make_models.py's, f32) as a GGUF file with gguf-py, the way llama.cpp's convert_hf_to_gguf.py
names and lays it out, and the golden JSON that tests/test_model.c's `ref` mode reads, from the
checkpoint's float64 reference.json. Written only for shardlm's golden tests (golden_gguf_<model>);
it follows convert_hf_to_gguf.py (LlamaModel.permute of q/k for "llama"; Qwen2Model / Qwen3Model,
Olmo2Model and Phi3MiniModel keep Hugging Face's order; Phi3MiniModel keeps the fused qkv_proj and
gate_up_proj as attn_qkv and ffn_up and writes LongRoPE as rope_factors_long / _short tensors),
never shardlm's code.

gpt-oss follows conversion/gpt_oss.py (GptOssModel): sinks as attn_sinks.weight, the pre-MoE norm as
post_attention_norm, gate_up_proj (E, in, 2F) transposed and split into ffn_gate_exps (its even
output rows) and ffn_up_exps (the odd ones), down_proj transposed, the biases split alike; with
--mxfp4 the three expert matrices are written as MXFP4 blocks (gguf-py's quantizer) and the reference
is gpt_oss_ref.py's float64 forward over gguf-py's dequantization of those blocks.

  hf_to_gguf.py --hf DIR --arch llama|qwen2|qwen2moe|qwen3|qwen3moe|gemma2|phi3|olmo2|olmoe|gpt-oss|minimax-m2|glm4moe [--mxfp4]
                --out FILE.gguf --ref OUT.json
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (pip install gguf)")
    sys.exit(77)

import gguf_types_model  # noqa: E402  (test_vocab)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, d in header.items():
            if name == "__metadata__":
                continue
            if d["dtype"] != "F32":
                raise ValueError("%s: %s (f32 checkpoints only)" % (name, d["dtype"]))
            f.seek(base + d["data_offsets"][0])
            out[name] = np.frombuffer(f.read(d["data_offsets"][1] - d["data_offsets"][0]), "<f4").reshape(d["shape"])
    return out


def permute(w, n_head):  # convert_hf_to_gguf.py LlamaModel.permute: rotate-half rows -> pairs
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", required=True)
    ap.add_argument("--arch", choices=["llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma2", "phi3", "olmo2",
                                       "olmoe", "gpt-oss", "minimax-m2", "glm4moe"],
                    required=True)
    ap.add_argument("--mxfp4", action="store_true", help="gpt-oss: the experts' matrices as MXFP4 blocks")
    ap.add_argument("--extra-float", action="append", default=[], metavar="KEY=VALUE",
                    help="one more float32 metadata key (for the tests of keys shardlm refuses)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ref", required=True)
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.hf, "config.json")))
    w = read_safetensors(os.path.join(a.hf, "model.safetensors"))
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    V = cfg["vocab_size"]

    g = gguf.GGUFWriter(a.out, arch=a.arch)
    A = a.arch
    glm = A == "glm4moe"  # conversion/glm.py Glm4MoeModel: the MTP layers counted in block_count
    nextn = cfg.get("num_nextn_predict_layers", 0) if glm else 0
    g.add_uint32(A + ".block_count", cfg["num_hidden_layers"] + nextn)
    g.add_uint32(A + ".context_length", cfg["max_position_embeddings"])
    g.add_uint32(A + ".embedding_length", cfg["hidden_size"])
    g.add_uint32(A + ".feed_forward_length", cfg["intermediate_size"])
    g.add_uint32(A + ".attention.head_count", nh)
    g.add_uint32(A + ".attention.head_count_kv", nkv)
    phi3, olmo2, oss = A == "phi3", A == "olmo2", A == "gpt-oss"
    assert not a.mxfp4 or oss, "--mxfp4 is for gpt-oss"
    if phi3:  # Phi3MiniModel.set_gguf_parameters: no key_length; rope dims from the hidden size
        assert hd == cfg["hidden_size"] // nh, "phi3 GGUF: head_dim must be hidden_size / num_attention_heads"
        rot_pct = cfg.get("partial_rotary_factor", 1.0)
        g.add_uint32(A + ".rope.dimension_count", int(rot_pct * cfg["hidden_size"]) // nh)
        g.add_uint32(A + ".rope.scaling.original_context_length",
                     (cfg.get("rope_scaling") or {}).get("original_max_position_embeddings")
                     or cfg["original_max_position_embeddings"])
        g.add_uint32(A + ".attention.sliding_window", cfg.get("sliding_window") or 0)
    elif olmo2:  # TextModel.set_gguf_parameters: key/value length from head_dim; no rope dims
        g.add_uint32(A + ".attention.key_length", hd)
        g.add_uint32(A + ".attention.value_length", hd)
    else:
        g.add_uint32(A + ".attention.key_length", hd)
        g.add_uint32(A + ".attention.value_length", hd)
        # MiniMaxM2Model: rotary_dim; Glm4MoeModel: head_dim x partial_rotary_factor
        g.add_uint32(A + ".rope.dimension_count", int(hd * cfg.get("partial_rotary_factor", 0.5)) if glm
                     else cfg.get("rotary_dim") or hd)
    g.add_float32(A + ".attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    g.add_float32(A + ".rope.freq_base", cfg["rope_theta"])
    mixtral = cfg["model_type"] in ("mixtral", "minimax_m2")  # Mixtral's expert names
    E = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    if E:  # MixtralModel / Qwen2MoeModel / Qwen3MoeModel / OlmoeModel: the experts' keys
        # llama.cpp's build_moe_ffn renormalises the top k for llama (Mixtral) and qwen3moe only
        renorm = A in ("llama", "qwen3moe", "minimax-m2")
        assert oss or glm or (mixtral or bool(cfg.get("norm_topk_prob"))) == renorm, "GGUF MoE: llama.cpp's top-k rule for " + A
        g.add_uint32(A + ".expert_count", E)
        g.add_uint32(A + ".expert_used_count", cfg["num_experts_per_tok"])
        if oss:  # GptOssModel.set_gguf_parameters, and TextModel's YaRN keys
            g.add_uint32(A + ".expert_feed_forward_length", cfg["intermediate_size"])
            g.add_uint32(A + ".attention.sliding_window", cfg["sliding_window"])
            rs = cfg["rope_scaling"]
            g.add_string(A + ".rope.scaling.type", "yarn")
            g.add_float32(A + ".rope.scaling.factor", rs["factor"])
            g.add_uint32(A + ".rope.scaling.original_context_length", rs["original_max_position_embeddings"])
            g.add_float32(A + ".rope.scaling.yarn_beta_fast", rs["beta_fast"])
            g.add_float32(A + ".rope.scaling.yarn_beta_slow", rs["beta_slow"])
        if "moe_intermediate_size" in cfg:  # Mixtral's and OLMoE's experts are intermediate_size wide
            g.add_uint32(A + ".expert_feed_forward_length", cfg["moe_intermediate_size"])
        if A == "minimax-m2":  # MiniMaxM2Model.set_gguf_parameters: the experts' width; sigmoid gating
            g.add_uint32(A + ".expert_feed_forward_length", cfg["intermediate_size"])
            g.add_uint32(A + ".expert_gating_func", 2)
        if glm:  # Glm4MoeModel.set_gguf_parameters; the groups as DeepseekV2Model writes them (llama.cpp reads them for any arch)
            g.add_uint32(A + ".expert_shared_count", cfg["n_shared_experts"])
            g.add_uint32(A + ".leading_dense_block_count", cfg["first_k_dense_replace"])
            g.add_uint32(A + ".expert_gating_func", 2)
            g.add_float32(A + ".expert_weights_scale", cfg["routed_scaling_factor"])
            g.add_bool(A + ".expert_weights_norm", cfg["norm_topk_prob"])
            g.add_uint32(A + ".nextn_predict_layers", nextn)
            if cfg.get("n_group", 1) > 1:
                g.add_uint32(A + ".expert_group_count", cfg["n_group"])
                g.add_uint32(A + ".expert_group_used_count", cfg["topk_group"])
        if "shared_expert_intermediate_size" in cfg:  # Qwen2MoeModel.set_gguf_parameters
            g.add_uint32(A + ".expert_shared_feed_forward_length", cfg["shared_expert_intermediate_size"])
    gemma = A == "gemma2"
    if gemma:  # convert_hf_to_gguf.py Gemma2Model's keys
        g.add_float32(A + ".attn_logit_softcapping", cfg["attn_logit_softcapping"])
        g.add_float32(A + ".final_logit_softcapping", cfg["final_logit_softcapping"])
        g.add_uint32(A + ".attention.sliding_window", cfg["sliding_window"])
        # llama.cpp hard-codes query_pre_attn_scalar = head_dim (27B aside): the model must agree
        assert cfg["query_pre_attn_scalar"] == hd, "gemma2 GGUF: query_pre_attn_scalar must be head_dim"
    for kv in a.extra_float:
        key, value = kv.split("=", 1)
        g.add_float32(key, float(value))
    gguf_types_model.test_vocab(g, V)

    def put(name, arr):
        g.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    def norm(key):  # Gemma's x * (1 + w): convert_hf_to_gguf.py stores 1 + w
        return w[key] + 1.0 if gemma else w[key]

    deq = {}  # --mxfp4: the experts as gguf-py dequantizes them, HF layout, for the reference

    def experts(name, arr, hf_name, part):  # (E, rows, cols) as F32 or MXFP4 blocks
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if not a.mxfp4:
            return put(name, arr)
        raw = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.MXFP4)
        g.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        back = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4).astype(np.float64).reshape(arr.shape)
        deq.setdefault(hf_name, {})[part] = back

    put("token_embd.weight", w["model.embed_tokens.weight"])
    for l in range(cfg["num_hidden_layers"]):
        p, b = "model.layers.%d." % l, "blk.%d." % l
        if oss:  # conversion/gpt_oss.py: no q/k permutation; biases everywhere; 3-D experts split
            put(b + "attn_norm.weight", w[p + "input_layernorm.weight"])
            for src, dst in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
                put(b + dst + ".weight", w[p + "self_attn." + src + ".weight"])
                put(b + dst + ".bias", w[p + "self_attn." + src + ".bias"])
            put(b + "attn_sinks.weight", w[p + "self_attn.sinks"])
            put(b + "post_attention_norm.weight", w[p + "post_attention_layernorm.weight"])
            put(b + "ffn_gate_inp.weight", w[p + "mlp.router.weight"])
            put(b + "ffn_gate_inp.bias", w[p + "mlp.router.bias"])
            gu = w[p + "mlp.experts.gate_up_proj"].transpose(0, 2, 1)  # (E, 2F, in)
            gub = w[p + "mlp.experts.gate_up_proj_bias"]
            experts(b + "ffn_gate_exps.weight", gu[:, ::2, :], p + "mlp.experts.gate_up_proj", 0)
            experts(b + "ffn_up_exps.weight", gu[:, 1::2, :], p + "mlp.experts.gate_up_proj", 1)
            put(b + "ffn_gate_exps.bias", gub[:, ::2])
            put(b + "ffn_up_exps.bias", gub[:, 1::2])
            experts(b + "ffn_down_exps.weight", w[p + "mlp.experts.down_proj"].transpose(0, 2, 1), p + "mlp.experts.down_proj", 0)
            put(b + "ffn_down_exps.bias", w[p + "mlp.experts.down_proj_bias"])
            continue
        if phi3:  # the fused tensors as they are: qkv_proj rows [q | k | v], gate_up_proj [gate | up]
            put(b + "attn_norm.weight", w[p + "input_layernorm.weight"])
            put(b + "attn_qkv.weight", w[p + "self_attn.qkv_proj.weight"])
            put(b + "attn_output.weight", w[p + "self_attn.o_proj.weight"])
            put(b + "ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
            put(b + "ffn_up.weight", w[p + "mlp.gate_up_proj.weight"])
            put(b + "ffn_down.weight", w[p + "mlp.down_proj.weight"])
            continue
        if olmo2:  # no pre-norms; q and k norms over the whole projection; post norms
            for src, dst in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                             ("o_proj", "attn_output"), ("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm")):
                put(b + dst + ".weight", w[p + "self_attn." + src + ".weight"])
            put(b + "post_attention_norm.weight", w[p + "post_attention_layernorm.weight"])
            for src in ("gate", "up", "down"):
                put(b + "ffn_" + src + ".weight", w[p + "mlp.%s_proj.weight" % src])
            put(b + "post_ffw_norm.weight", w[p + "post_feedforward_layernorm.weight"])
            continue
        q, k = w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"]
        if A == "llama":
            q, k = permute(q, nh), permute(k, nkv)
        put(b + "attn_norm.weight", norm(p + "input_layernorm.weight"))
        put(b + "attn_q.weight", q)
        put(b + "attn_k.weight", k)
        put(b + "attn_v.weight", w[p + "self_attn.v_proj.weight"])
        put(b + "attn_output.weight", w[p + "self_attn.o_proj.weight"])
        for src, dst in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v")):
            if p + "self_attn.%s_proj.bias" % src in w:
                put(b + dst + ".bias", w[p + "self_attn.%s_proj.bias" % src])
        if p + "self_attn.q_norm.weight" in w:
            put(b + "attn_q_norm.weight", w[p + "self_attn.q_norm.weight"])
            put(b + "attn_k_norm.weight", w[p + "self_attn.k_norm.weight"])
        if glm:  # tensor_mapping: glm4moe's pre-MLP norm is ATTN_POST_NORM; dense first layers, then experts
            put(b + "post_attention_norm.weight", w[p + "post_attention_layernorm.weight"])
            if l < cfg["first_k_dense_replace"]:
                for src in ("gate", "up", "down"):
                    put(b + "ffn_%s.weight" % src, w[p + "mlp.%s_proj.weight" % src])
                continue
            put(b + "ffn_gate_inp.weight", w[p + "mlp.gate.weight"])
            put(b + "exp_probs_b.bias", w[p + "mlp.gate.e_score_correction_bias"])
            for name, dst in zip(("gate_proj", "up_proj", "down_proj"), ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")):
                put(b + dst + ".weight", np.stack([w[p + "mlp.experts.%d.%s.weight" % (e, name)] for e in range(E)]))
            for src in ("gate", "up", "down"):
                put(b + "ffn_%s_shexp.weight" % src, w[p + "mlp.shared_experts.%s_proj.weight" % src])
            continue
        if gemma:
            put(b + "post_attention_norm.weight", norm(p + "post_attention_layernorm.weight"))
            put(b + "ffn_norm.weight", norm(p + "pre_feedforward_layernorm.weight"))
            put(b + "post_ffw_norm.weight", norm(p + "post_feedforward_layernorm.weight"))
        else:
            put(b + "ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        if E:  # the router and the experts stacked (E, rows, cols), as ffn_*_exps
            blk, names = ("block_sparse_moe.", ("w1", "w3", "w2")) if mixtral else \
                ("mlp.", ("gate_proj", "up_proj", "down_proj"))
            put(b + "ffn_gate_inp.weight", w[p + blk + "gate.weight"])
            if p + blk + "e_score_correction_bias" in w:  # MiniMax-M2's selection bias (tensor_mapping: exp_probs_b)
                put(b + "exp_probs_b.bias", w[p + blk + "e_score_correction_bias"])
            for name, dst in zip(names, ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")):
                put(b + dst + ".weight", np.stack([w[p + blk + "experts.%d.%s.weight" % (e, name)] for e in range(E)]))
            if p + "mlp.shared_expert_gate.weight" in w:  # Qwen 2 MoE's shared expert, as tensor_mapping.py names it
                put(b + "ffn_gate_inp_shexp.weight", w[p + "mlp.shared_expert_gate.weight"])
                for src in ("gate", "up", "down"):
                    put(b + "ffn_%s_shexp.weight" % src, w[p + "mlp.shared_expert.%s_proj.weight" % src])
            continue
        put(b + "ffn_gate.weight", w[p + "mlp.gate_proj.weight"])
        put(b + "ffn_up.weight", w[p + "mlp.up_proj.weight"])
        put(b + "ffn_down.weight", w[p + "mlp.down_proj.weight"])
    for l in range(cfg["num_hidden_layers"], cfg["num_hidden_layers"] + nextn):  # the MTP layers' tensors, as written
        p, b = "model.layers.%d." % l, "blk.%d." % l
        put(b + "nextn.eh_proj.weight", w[p + "eh_proj.weight"])
        put(b + "nextn.enorm.weight", w[p + "enorm.weight"])
        put(b + "nextn.hnorm.weight", w[p + "hnorm.weight"])
        put(b + "attn_norm.weight", w[p + "input_layernorm.weight"])
    rs = cfg.get("rope_scaling") or {}
    if phi3 and rs.get("long_factor"):  # Phi3MiniModel.generate_extra_tensors
        orig = rs.get("original_max_position_embeddings") or cfg["original_max_position_embeddings"]
        scale = cfg["max_position_embeddings"] / orig
        assert rs.get("rope_type", rs.get("type")) in ("longrope", "su")
        g.add_float32(A + ".rope.scaling.attn_factor",
                      math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0)
        put("rope_factors_long.weight", np.array(rs["long_factor"]))
        put("rope_factors_short.weight", np.array(rs["short_factor"]))
    if rs.get("rope_type") == "llama3":  # convert_hf_to_gguf.py LlamaModel: the divisors as rope_freqs
        base, dim = cfg["rope_theta"], hd
        freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        factor, lo, hi = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old = rs.get("original_max_position_embeddings", 8192)
        factors = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < old / hi:
                factors.append(1.0)
            elif wavelen > old / lo:
                factors.append(factor)
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        put("rope_freqs.weight", np.array(factors))
    put("output_norm.weight", norm("model.norm.weight"))
    if "lm_head.weight" in w:
        put("output.weight", w["lm_head.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()

    ref = json.load(open(os.path.join(a.hf, "reference.json")))
    logits = np.array(ref["logits"])
    if deq:  # the reference over the dequantized experts, back in the HF layout
        import gpt_oss_ref
        w64 = {k: v.astype(np.float64) for k, v in w.items()}
        for name, parts in deq.items():
            if name.endswith("gate_up_proj"):  # gate (E, F, in) and up back to (E, in, 2F) interleaved
                gu = np.empty_like(w64[name].transpose(0, 2, 1))
                gu[:, ::2, :], gu[:, 1::2, :] = parts[0], parts[1]
                w64[name] = gu.transpose(0, 2, 1)
            else:
                w64[name] = parts[0].transpose(0, 2, 1)
        moved = max(float(np.abs(w64[n] - w[n]).max()) for n in deq)
        assert moved > 1e-3, "MXFP4 changed no expert weight: the reference would not see the blocks"
        logits = gpt_oss_ref.gpt_oss_forward(cfg, w64, ref["prompt_ids"])
    top2 = np.sort(logits, axis=1)[:, -2:]
    json.dump({"ids": ref["prompt_ids"], "logits_last": logits[-1].tolist(),
               "argmax": [int(i) for i in logits.argmax(axis=1)],
               "margins": (top2[:, 1] - top2[:, 0]).tolist()}, open(a.ref, "w"))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""tools/draft_gguf.py - a Llama-family checkpoint in the Hugging Face layout (a draft that shardlm
trained, tools/distill_draft.sh) written as one GGUF file with block weights (issue 29), so that

- shardlm serves the draft as blocks (`--draft-model FILE.gguf`): a Q8_0 draft reads a quarter of the
  bytes of its f32 safetensors per token, and the draft's forwards are what a draft token costs;
- llama.cpp's own speculative decoding (`llama-speculative`, `llama-server --model-draft`) can run the
  same draft beside the same target, for the side-by-side the issue asks for.

  python3 tools/draft_gguf.py --model DIR --like TARGET.gguf --out FILE.gguf [--type q8_0|q4_0|q4_1|f32]

The tokenizer keys (tokenizer.ggml.*, the chat template) are copied from --like, the target's GGUF, so
that the draft carries the target's exact tokenizer (shardlm and llama.cpp both check it). Matrices
(token_embd included) take --type (default q8_0, quantized by gguf-py); norms stay F32. The q and k
projections are written in GGUF's rotary order: as they are when config.json says "rope_style":
"pairs" (what `shardlm convert gguf` writes), permuted as llama.cpp's converter does otherwise.
Needs numpy and gguf (gguf-py).
"""
import argparse
import json
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from make_moe_gguf import copy_tokenizer  # noqa: E402
from train_compare import read_safetensors  # noqa: E402  (name -> float32 array)

TYPES = {"f32": None, "q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
         "q4_1": gguf.GGMLQuantizationType.Q4_1}
FILE_TYPE = {"f32": 0, "q8_0": 7, "q4_0": 2, "q4_1": 3}  # llama.cpp's LLAMA_FTYPE_ALL_F32 / MOSTLY_*
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def to_pairs(w, n_head):
    """llama.cpp's LlamaModel.permute: rows of each head from the half-split rotary order to pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF-layout directory: config.json, model.safetensors")
    ap.add_argument("--like", required=True, help="the target's GGUF, whose tokenizer keys are copied")
    ap.add_argument("--out", required=True)
    ap.add_argument("--type", choices=sorted(TYPES), default="q8_0")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    if cfg.get("model_type") not in ("llama", "mistral", "qwen2") or cfg.get("attention_bias") or cfg.get("mlp_bias"):
        sys.exit("draft_gguf: %s: only Llama-shaped checkpoints without biases are written (model_type %r)"
                 % (a.model, cfg.get("model_type")))
    w = read_safetensors(os.path.join(a.model, "model.safetensors"))
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim", H // nh)
    pairs = cfg.get("rope_style") == "pairs"
    g = gguf.GGUFWriter(a.out, arch="llama")
    g.add_name("shardlm draft (%d layers, %s)" % (L, a.type))
    vocab = copy_tokenizer(g, a.like)
    if vocab != cfg["vocab_size"]:
        sys.exit("draft_gguf: %s has %d pieces, the checkpoint's vocabulary %d" % (a.like, vocab, cfg["vocab_size"]))
    g.add_uint32("llama.block_count", L)
    g.add_uint32("llama.context_length", cfg.get("max_position_embeddings", 2048))
    g.add_uint32("llama.embedding_length", H)
    g.add_uint32("llama.feed_forward_length", cfg["intermediate_size"])
    g.add_uint32("llama.attention.head_count", nh)
    g.add_uint32("llama.attention.head_count_kv", nkv)
    g.add_uint32("llama.attention.key_length", hd)
    g.add_uint32("llama.attention.value_length", hd)
    g.add_uint32("llama.rope.dimension_count", hd)
    g.add_float32("llama.rope.freq_base", float(cfg.get("rope_theta", 10000.0)))
    g.add_float32("llama.attention.layer_norm_rms_epsilon", float(cfg.get("rms_norm_eps", 1e-5)))
    g.add_uint32("llama.vocab_size", vocab)
    g.add_uint32("general.file_type", FILE_TYPE[a.type])
    qt = TYPES[a.type]

    def mat(name, arr):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if qt is None or arr.shape[-1] % gguf.GGML_QUANT_SIZES[qt][0]:
            g.add_tensor(name, arr)
        else:
            g.add_tensor(name, gguf.quants.quantize(arr, qt), raw_dtype=qt)

    mat("token_embd.weight", w.pop("model.embed_tokens.weight"))
    g.add_tensor("output_norm.weight", w.pop("model.norm.weight").astype(np.float32))
    if "lm_head.weight" in w:
        mat("output.weight", w.pop("lm_head.weight"))
    for i in range(L):
        for hf, gg in LAYER.items():
            t = w.pop("model.layers.%d.%s.weight" % (i, hf))
            if not pairs and gg in ("attn_q", "attn_k"):
                t = to_pairs(t, nh if gg == "attn_q" else nkv)
            if t.ndim == 1:
                g.add_tensor("blk.%d.%s.weight" % (i, gg), t.astype(np.float32))
            else:
                mat("blk.%d.%s.weight" % (i, gg), t)
    if w:
        sys.exit("draft_gguf: tensors not written: %s" % ", ".join(sorted(w)[:8]))
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    print("draft_gguf: %s -> %s: %d layers, %s, %.1f MB" % (a.model, a.out, L, a.type, os.path.getsize(a.out) / 1e6))


if __name__ == "__main__":
    main()

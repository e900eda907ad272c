#!/usr/bin/env python3
"""tests/gguf_setup.py OUTDIR - writes the GGUF fixtures for tests/test_gguf.c with gguf-py
(the reference GGUF writer of llama.cpp), and the reference dequantization of every tensor
computed by gguf-py's gguf.quants.dequantize.

Files written to OUTDIR:
  synthetic.gguf      every metadata value type, one tensor per ggml type shardlm reads
                      (t.F32, t.Q4_K, ...: shape (3, 512), i.e. GGUF ne [512, 3]), a 3-D
                      tensor, and one IQ2_XXS tensor (a type shardlm does not dequantize)
  expected.<TYPE>.f32 gguf-py's dequantization of t.<TYPE>, raw little-endian float32
  nested.gguf         an array of arrays (rejected)
  tok.gguf            a tiny SentencePiece-style vocabulary in tokenizer.ggml.* metadata
  tiny_gemma3.gguf    a one-layer Gemma 3 with Q8_0 matrices and that vocabulary (served
                      natively by test_gguf: checkpoint_gguf.c, the model with blocks)
  tiny_gemma3_blocks.gguf  a two-layer Gemma 3 whose matrices cover the eight block types and
                      an F16 matrix, and split at tp 2 on block boundaries (test_keep_blocks)
  tiny_gemma3_mixed.gguf   the same with layer 1's attn_v in Q8_0, unlike its q and k (Q5_1):
                      a fused Megatron linear_qkv of mixed block types
Quantized tensors hold random block bytes (every bit pattern of quants and packed scales) with
finite random f16 scale fields (MXFP4: E8M0 scale bytes in [118, 136] and the edges 0, 1, 2,
254, 255), so the test covers the layouts, not only what a quantizer emits. Exits 77 (skip) when gguf or numpy is not installed.
"""
import os
import sys

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (pip install gguf numpy)")
    sys.exit(77)

ROWS, COLS = 3, 512

# Byte offsets of the f16 scale fields inside one block, per type (ggml-common.h).
F16_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.IQ4_NL: [0], Q.IQ4_XS: [0],
}


# MXFP4's E8M0 scale byte (offset 0): 2^(e - 128) scales the doubled E2M1 values. Most blocks
# take e in [118, 136], the first ones the edges: 0 and 1 (ggml_e8m0_to_fp32_half's subnormals
# 2^-128 and 2^-127), 2 (the first normal), 254 and 255 (12 * 2^(e - 128) overflows to +-Inf).
MXFP4_EDGE_E = [0, 1, 2, 254, 255]


def random_blocks(rng, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = ROWS * COLS // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, []):
        h = (rng.standard_normal(nb) * 0.05).astype(np.float16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(nb, 2)
    if qtype == Q.MXFP4:
        raw[:, 0] = rng.integers(118, 137, size=nb, dtype=np.uint8)
        raw[:len(MXFP4_EDGE_E), 0] = MXFP4_EDGE_E
        # The reference's own half rule at the edges, against 2^(e - 128) (e 0 and 1: f32 subnormals).
        half = gguf.quants.MXFP4.e8m0_to_fp32_half(np.array(MXFP4_EDGE_E, dtype=np.uint8))
        assert [float(v) for v in half] == [2.0 ** (e - 128) for e in MXFP4_EDGE_E], half
    return raw.reshape(ROWS, -1)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1234)

    w = gguf.GGUFWriter(os.path.join(out, "synthetic.gguf"), arch="synthetic")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 0.15625)
    w.add_uint64("t.u64", 2 ** 63 + 5)
    w.add_int64("t.i64", -(2 ** 62))
    w.add_float64("t.f64", -1.0e300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo\nworld")
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, -1.25])
    w.add_array("t.arr_str", ["a", "", "ccc"])

    tensors = {}
    for qtype in (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K,
                  Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4):
        name = qtype.name
        if qtype == Q.F32:
            data = rng.standard_normal((ROWS, COLS)).astype(np.float32)
            w.add_tensor("t." + name, data)
            expected = data
        elif qtype == Q.F16:
            data = rng.standard_normal((ROWS, COLS)).astype(np.float16)
            w.add_tensor("t." + name, data)
            expected = data.astype(np.float32)
        else:
            if qtype == Q.BF16:
                f = rng.standard_normal((ROWS, COLS)).astype(np.float32)
                raw = gguf.quants.quantize(f, qtype)
            else:
                raw = random_blocks(rng, qtype)
            w.add_tensor("t." + name, raw, raw_dtype=qtype)
            expected = dequantize(raw, qtype)
        expected = np.ascontiguousarray(expected, dtype="<f4")
        assert expected.shape == (ROWS, COLS), (name, expected.shape)
        tensors[name] = expected
    # Q8_0 through the real quantizer too (what converters emit).
    f = rng.standard_normal((2, 64)).astype(np.float32)
    raw = gguf.quants.quantize(f, Q.Q8_0)
    w.add_tensor("t.Q8_0_quantized", raw, raw_dtype=Q.Q8_0)
    tensors["Q8_0_quantized"] = np.ascontiguousarray(dequantize(raw, Q.Q8_0), dtype="<f4")
    # Shape mapping: numpy (2, 3, 64) is GGUF ne [64, 3, 2].
    w.add_tensor("t.3d", np.arange(2 * 3 * 64, dtype=np.float32).reshape(2, 3, 64))
    # A type shardlm does not dequantize.
    w.add_tensor("t.IQ2_XXS", rng.integers(0, 256, size=(1, 66), dtype=np.uint8), raw_dtype=Q.IQ2_XXS)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for name, arr in tensors.items():
        arr.tofile(os.path.join(out, f"expected.{name}.f32"))

    w = gguf.GGUFWriter(os.path.join(out, "nested.gguf"), arch="nested")
    w.add_array("t.nested", [[1, 2], [3]])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # A tiny SentencePiece-style (BPE by score) vocabulary. Types: 1 normal, 2 unknown,
    # 3 control, 4 user-defined, 6 byte (the GGUF numbering is SentencePiece's).
    toks = [("<pad>", 0.0, 3), ("<eos>", 0.0, 3), ("<bos>", 0.0, 3), ("<unk>", 0.0, 3),
            ("<start_of_turn>", 0.0, 3), ("<sep>", 0.0, 4)]
    toks += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    pieces = ["\u2581", "h", "e", "l", "o", "w", "r", "d",
              "he", "ll", "llo", "hello", "\u2581hello", "\u2581w", "or", "\u2581wor", "\u2581world"]
    # Higher score = merged first. Longer pieces score higher here, so the greedy BPE
    # reaches the whole words.
    toks += [(p, -100.0 + len(p) + i * 0.01, 1) for i, p in enumerate(pieces)]
    w = gguf.GGUFWriter(os.path.join(out, "tok.gguf"), arch="tok")
    w.add_tokenizer_model("llama")
    w.add_token_list([t[0] for t in toks])
    w.add_token_scores([t[1] for t in toks])
    w.add_token_types([t[2] for t in toks])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_tiny_gemma3(os.path.join(out, "tiny_gemma3.gguf"), rng, toks)
    write_tiny_gemma3_blocks(os.path.join(out, "tiny_gemma3_blocks.gguf"), np.random.default_rng(7), toks, Q.Q5_1)
    write_tiny_gemma3_blocks(os.path.join(out, "tiny_gemma3_mixed.gguf"), np.random.default_rng(7), toks, Q.Q8_0)
    print(f"gguf_setup: wrote fixtures to {out}")


def gemma3_writer(path, toks, d, n_layers, ff, nh, nkv, hd):
    """A GGUFWriter for a tiny Gemma 3 (context 128, sliding window 32) with the tiny vocabulary's
    tokenizer metadata written; the caller adds the tensors and writes the file."""
    w = gguf.GGUFWriter(path, arch="gemma3")
    w.add_context_length(128)
    w.add_embedding_length(d)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_sliding_window(32)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("llama")
    w.add_token_list([t[0] for t in toks])
    w.add_token_scores([t[1] for t in toks])
    w.add_token_types([t[2] for t in toks])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    return w


def write_tiny_gemma3(path, rng, toks):
    """A one-layer Gemma 3 with Q8_0 matrices (quantized by gguf-py from random weights) and the
    tiny vocabulary: d_model 64, 2 query heads and 1 KV head of 48, d_ff 128. Its attention
    output (64, 96) split for tp 2 gives 48 columns per rank, which cuts the 32-element blocks:
    checkpoint_gguf's refusal case."""
    d, hd, nh, ff, vocab = 64, 48, 2, 128, len(toks)
    w = gemma3_writer(path, toks, d, 1, ff, nh, 1, hd)

    def mat(name, rows, cols, scale):
        x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(x, Q.Q8_0), raw_dtype=Q.Q8_0)

    def norm(name, n):  # llama.cpp's Gemma norms already hold the +1
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    mat("token_embd.weight", vocab, d, 0.5)
    norm("blk.0.attn_norm.weight", d)
    mat("blk.0.attn_q.weight", nh * hd, d, d ** -0.5)
    mat("blk.0.attn_k.weight", hd, d, d ** -0.5)
    mat("blk.0.attn_v.weight", hd, d, d ** -0.5)
    norm("blk.0.attn_q_norm.weight", hd)
    norm("blk.0.attn_k_norm.weight", hd)
    mat("blk.0.attn_output.weight", d, nh * hd, (nh * hd) ** -0.5)
    norm("blk.0.post_attention_norm.weight", d)
    norm("blk.0.ffn_norm.weight", d)
    mat("blk.0.ffn_gate.weight", ff, d, d ** -0.5)
    mat("blk.0.ffn_up.weight", ff, d, d ** -0.5)
    mat("blk.0.ffn_down.weight", d, ff, ff ** -0.5)
    norm("blk.0.post_ffw_norm.weight", d)
    norm("output_norm.weight", d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Scale of the random f16 super-block scales (d, dmin) of the K-quants, which gguf-py cannot
# quantize: weights of magnitude ~0.3 (Q4_K: d * 6-bit scale * 4-bit quant).
K_SCALE = {Q.Q4_K: 0.001, Q.Q5_K: 0.0005, Q.Q6_K: 0.0003}


def write_tiny_gemma3_blocks(path, rng, toks, v1_type):
    """A two-layer Gemma 3 for tests/test_keep_blocks.c: d_model 256, 4 query and 4 KV heads of
    64, d_ff 512, with every block type shardlm keeps (token_embd Q6_K; layer 0: q, k, v Q5_K,
    output Q4_0, gate and up Q4_1, down Q4_K; layer 1: q and k Q5_1, v v1_type, output F16 (a
    matrix that stays float), gate and up Q5_0, down Q8_0). At tp 2 every column split (output
    128 of 256, down 256 of 512) falls on block boundaries; at tp 4 layer 0's Q4_K down (128 of
    512 columns) cuts its 256-element blocks. v1_type Q5_1: every fused Megatron tensor
    (linear_qkv, linear_fc1) has one block type; Q8_0: layer 1's linear_qkv mixes two."""
    d, hd, nh, ff, vocab = 256, 64, 4, 512, len(toks)
    w = gemma3_writer(path, toks, d, 2, ff, nh, nh, hd)

    def mat(name, rows, cols, qtype):
        if qtype in K_SCALE:  # random blocks, small finite scales
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            nb = rows * cols // block
            raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
            for off in F16_FIELDS[qtype]:
                h = (np.abs(rng.standard_normal(nb)) * K_SCALE[qtype]).astype(np.float16)
                raw[:, off:off + 2] = h.view(np.uint8).reshape(nb, 2)
            w.add_tensor(name, raw.reshape(rows, -1), raw_dtype=qtype)
            return
        x = (rng.standard_normal((rows, cols)) * cols ** -0.5).astype(np.float32)
        if qtype == Q.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)

    def norm(name, n):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    layers = [dict(q=Q.Q5_K, k=Q.Q5_K, v=Q.Q5_K, o=Q.Q4_0, gate=Q.Q4_1, up=Q.Q4_1, down=Q.Q4_K),
              dict(q=Q.Q5_1, k=Q.Q5_1, v=v1_type, o=Q.F16, gate=Q.Q5_0, up=Q.Q5_0, down=Q.Q8_0)]
    mat("token_embd.weight", vocab, d, Q.Q6_K)
    for i, t in enumerate(layers):
        norm(f"blk.{i}.attn_norm.weight", d)
        mat(f"blk.{i}.attn_q.weight", nh * hd, d, t["q"])
        mat(f"blk.{i}.attn_k.weight", nh * hd, d, t["k"])
        mat(f"blk.{i}.attn_v.weight", nh * hd, d, t["v"])
        norm(f"blk.{i}.attn_q_norm.weight", hd)
        norm(f"blk.{i}.attn_k_norm.weight", hd)
        mat(f"blk.{i}.attn_output.weight", d, nh * hd, t["o"])
        norm(f"blk.{i}.post_attention_norm.weight", d)
        norm(f"blk.{i}.ffn_norm.weight", d)
        mat(f"blk.{i}.ffn_gate.weight", ff, d, t["gate"])
        mat(f"blk.{i}.ffn_up.weight", ff, d, t["up"])
        mat(f"blk.{i}.ffn_down.weight", d, ff, t["down"])
        norm(f"blk.{i}.post_ffw_norm.weight", d)
    norm("output_norm.weight", d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()

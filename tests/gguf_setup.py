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
Quantized tensors hold random block bytes (every bit pattern of quants and packed scales) with
finite random f16 scale fields, so the test covers the layouts, not only what a quantizer
emits. Exits 77 (skip) when gguf or numpy is not installed.
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
}


def random_blocks(rng, qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = ROWS * COLS // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, []):
        h = (rng.standard_normal(nb) * 0.05).astype(np.float16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(nb, 2)
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
    for qtype in (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K):
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
    print(f"gguf_setup: wrote fixtures to {out}")


if __name__ == "__main__":
    main()

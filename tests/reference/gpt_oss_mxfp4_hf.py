#!/usr/bin/env python3
"""Writes the GPT-OSS golden (make_models.py gpt_oss, f32) in the layout OpenAI publishes its
checkpoints in: the experts' matrices as transformers' MXFP4 `mlp.experts.gate_up_proj_blocks` U8
(E, 2F, d / 32, 16) with `_scales` U8 (E, 2F, d / 32) and `down_proj_blocks` / `_scales`
(E, d, F / 32, 16) / (E, d, F / 32), config.json with quantization_config {"quant_method":
"mxfp4"}, every other tensor as it was, and the golden JSON of tests/test_model.c's ref modes from
the float64 forward over those experts. Written only for golden_gpt_oss_mxfp4.

The blocks come from gguf-py's MXFP4 quantizer (ggml's layout: {e, qs[16]}, value k < 16 in qs[k]'s
low nibble, k + 16 in its high one), moved into transformers' layout (value 2j in byte j's low
nibble, 2j + 1 in its high one; the scale byte as it is). The reference weights are transformers'
own dequantization of the written bytes (convert_moe_packed_tensors: lut[nibble] * 2^(scale - 127),
rows transposed to (in, out)), asserted equal, value for value, to gguf-py's dequantization of the
ggml bytes.

  gpt_oss_mxfp4_hf.py --hf GOLDEN/gpt_oss --out DIR --ref OUT.json
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e} (pip install gguf)")
    sys.exit(77)

import gpt_oss_ref
from hf_to_gguf import read_safetensors

LUT = np.array([+0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def to_transformers(rows):
    """rows (R, cols) f32 -> (blocks U8 (R, G, 16), scales U8 (R, G), ggml bytes (R, G * 17))."""
    raw = gguf.quants.quantize(np.ascontiguousarray(rows, dtype=np.float32), gguf.GGMLQuantizationType.MXFP4)
    R, G = rows.shape[0], rows.shape[1] // 32
    blk = raw.reshape(R, G, 17)
    scales = blk[:, :, 0].copy()
    qs = blk[:, :, 1:]
    vals = np.concatenate([qs & 15, qs >> 4], axis=2)  # ggml value k: k < 16 low nibbles, then high
    blocks = (vals[:, :, 0::2] | (vals[:, :, 1::2] << 4)).astype(np.uint8)  # transformers: 2j low, 2j + 1 high
    return blocks, scales, raw


def transformers_dequant(blocks, scales):
    """convert_moe_packed_tensors for one (rows, G, 16) / (rows, G): (rows, G * 32) float64."""
    lo, hi = LUT[blocks & 15], LUT[blocks >> 4]
    vals = np.empty(blocks.shape[:2] + (32,))
    vals[:, :, 0::2], vals[:, :, 1::2] = lo, hi
    return np.ldexp(vals, scales.astype(np.int32)[:, :, None] - 127).reshape(blocks.shape[0], -1)


def write_safetensors(path, tensors):
    """{name: (dtype "F32" | "U8", array)} -> a safetensors file."""
    header, off, blobs = {}, 0, []
    for name, (dt, a) in tensors.items():
        b = np.ascontiguousarray(a, dtype=np.float32 if dt == "F32" else np.uint8).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ref", required=True)
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.hf, "config.json")))
    w = read_safetensors(os.path.join(a.hf, "model.safetensors"))
    E, F, d = cfg["num_local_experts"], cfg["intermediate_size"], cfg["hidden_size"]
    out, w64 = {}, {k: v.astype(np.float64) for k, v in w.items()}
    for name, v in w.items():
        if not (name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")):
            out[name] = ("F32", v)
            continue
        rows = v.transpose(0, 2, 1).reshape(-1, v.shape[1])  # (E * out, in): the blocks' rows
        blocks, scales, raw = to_transformers(rows)
        n_out, G = v.shape[2], v.shape[1] // 32
        out[name + "_blocks"] = ("U8", blocks.reshape(E, n_out, G, 16))
        out[name + "_scales"] = ("U8", scales.reshape(E, n_out, G))
        theirs = transformers_dequant(blocks, scales)
        ggml = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4).astype(np.float64).reshape(rows.shape)
        assert np.array_equal(theirs, ggml), name + ": transformers' and gguf-py's dequantizations differ"
        assert np.abs(theirs - rows).max() > 1e-3, name + ": MXFP4 changed nothing"
        w64[name] = theirs.reshape(E, n_out, -1).transpose(0, 2, 1)  # back to (E, in, out)
    assert all(k + "_blocks" in out for k in w if k.endswith(("experts.gate_up_proj", "experts.down_proj")))
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), out)
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    for extra in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(a.hf, extra)):
            shutil.copy(os.path.join(a.hf, extra), a.out)
    ref = json.load(open(os.path.join(a.hf, "reference.json")))
    logits = gpt_oss_ref.gpt_oss_forward(cfg, w64, ref["prompt_ids"])
    top2 = np.sort(logits, axis=1)[:, -2:]
    json.dump({"ids": ref["prompt_ids"], "logits_last": logits[-1].tolist(),
               "argmax": [int(i) for i in logits.argmax(axis=1)],
               "margins": (top2[:, 1] - top2[:, 0]).tolist()}, open(a.ref, "w"))
    print("gpt_oss_mxfp4_hf: wrote %s (%d expert tensors as MXFP4 blocks); min margin %.4g"
          % (a.out, sum(k.endswith("_blocks") for k in out), float((top2[:, 1] - top2[:, 0]).min())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

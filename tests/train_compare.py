#!/usr/bin/env python3
"""tests/train_compare.py - compares two `shardlm train` runs (written only for the tests).

  train_compare.py losses REF_METRICS GOT_METRICS [--rtol R] [--skip N]
      every training step's loss (and gradient norm) in GOT within R relative of REF's, for the
      steps both have (GOT's first N steps skipped: a resumed run's metrics continue REF's)
  train_compare.py adapter REF_DIR GOT_DIR [--rtol R]
      the same for adapter_model.safetensors (LoRA)
  train_compare.py weights REF_DIR GOT_DIR [--rtol R]
      every tensor of GOT_DIR/model.safetensors within R (relative to the tensor's largest
      magnitude) of REF_DIR's, same names, same shapes; the f32 masters of train_state.safetensors
      instead when the model file is f16 / bf16 (it holds the weights rounded)

The safetensors files are read with NumPy alone (header JSON + raw little-endian data).
Prints one line per check; exits 1 on any difference."""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[t["dtype"]])
        out[name] = arr.astype(np.float64).reshape(t["shape"])
    return out


def steps(path):
    rows = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r:
            rows[r["iter"]] = r
    return rows


def compare_tensors(r, g, rtol):
    """Every tensor of g within rtol (of the tensor's largest magnitude) of r's; returns the
    number of failures (printed)."""
    if set(r) != set(g):
        print(f"FAIL tensor names differ: {sorted(set(r) ^ set(g))[:5]}")
        return 1
    bad, worst = 0, 0.0
    for name in sorted(r):
        if r[name].shape != g[name].shape:
            print(f"FAIL {name}: shape {g[name].shape} vs {r[name].shape}")
            bad += 1
            continue
        scale = max(np.abs(r[name]).max(), 1e-12)
        rel = float(np.abs(r[name] - g[name]).max() / scale)
        worst = max(worst, rel)
        if rel > rtol:
            print(f"FAIL {name}: differs by {rel:.2e} of its largest magnitude (bound {rtol:g})")
            bad += 1
    print(f"{'PASS' if not bad else 'FAIL'} {len(r)} tensors within {worst:.2e} (bound {rtol:g})")
    return bad


def main():
    mode, ref, got = sys.argv[1:4]
    rtol = 1e-5
    skip = 0
    args = sys.argv[4:]
    for i, a in enumerate(args):
        if a == "--rtol":
            rtol = float(args[i + 1])
        if a == "--skip":
            skip = int(args[i + 1])
    bad = 0
    if mode == "losses":
        r, g = steps(ref), steps(got)
        common = sorted(k for k in g if k in r and k > skip)
        if not common:
            print("FAIL no common steps")
            return 1
        worst = 0.0
        for k in common:
            for key in ("loss", "grad_norm"):
                a, b = r[k][key], g[k][key]
                rel = abs(a - b) / max(abs(a), 1e-12)
                worst = max(worst, rel)
                if rel > rtol:
                    print(f"FAIL step {k} {key}: {b} vs {a} (relative {rel:.2e} > {rtol:g})")
                    bad += 1
        print(f"{'PASS' if not bad else 'FAIL'} {len(common)} steps, losses and grad norms within "
              f"{worst:.2e} relative (bound {rtol:g})")
    elif mode == "adapter":
        r = read_safetensors(ref + "/adapter_model.safetensors")
        g = read_safetensors(got + "/adapter_model.safetensors")
        bad = compare_tensors(r, g, rtol)
    else:
        r = read_safetensors(ref + "/model.safetensors")
        g = read_safetensors(got + "/model.safetensors")
        # A model file in f16/bf16 rounds the weights: compare the f32 masters the training
        # state keeps beside it instead.
        rs = read_safetensors(ref + "/train_state.safetensors")
        masters = {k: v for k, v in rs.items() if k.startswith("master/")}
        if masters:
            r = masters
            g = {k: v for k, v in read_safetensors(got + "/train_state.safetensors").items()
                 if k.startswith("master/")}
        bad = compare_tensors(r, g, rtol)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""tools/make_draft.py - the starting point of a draft model that shardlm trains itself (issue 29):
a Llama-family checkpoint in the Hugging Face layout (one safetensors file, as `shardlm convert
gguf --dtype f32` writes it; the draft is written in f32) cut down to some of its layers, the embeddings,
final norm and LM head (tied or not) kept, so that the draft shares the target's tokenizer and
vocabulary exactly (speculation requires it) and starts from the target's own weights. The draft
is then trained on the target's outputs (tools/distill_draft.sh) and served with
`--speculative draft --draft-model DIR`.

  python3 tools/make_draft.py --target DIR --out DIR [--layers 0,10,20,29 | --n-layers 4]

--n-layers N keeps N layers spread evenly from the first to the last (the default: 4). The
tokenizer files and config are copied, num_hidden_layers set. Needs numpy only.
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from train_compare import read_safetensors  # noqa: E402  (name -> float32 array; BF16 widened)


def write_safetensors(path, tensors, metadata=None):
    """name -> float32 array, written as F32; metadata: the header's __metadata__ (str -> str)."""
    header, blobs, off = ({"__metadata__": dict(metadata)} if metadata else {}), [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="HF-layout checkpoint directory (one model.safetensors)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", help="comma-separated layer indices to keep, in order")
    ap.add_argument("--n-layers", type=int, default=4, help="keep this many layers spread evenly (default 4)")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.target, "config.json")))
    L = cfg["num_hidden_layers"]
    if a.layers:
        keep = [int(x) for x in a.layers.split(",")]
    else:
        n = max(1, min(a.n_layers, L))
        keep = [round(i * (L - 1) / (n - 1)) for i in range(n)] if n > 1 else [0]
    if not keep or any(not 0 <= k < L for k in keep) or len(set(keep)) != len(keep):
        sys.exit("make_draft: --layers must be distinct indices in [0, %d), got %s" % (L, keep))
    src = read_safetensors(os.path.join(a.target, "model.safetensors"))
    layer_re = re.compile(r"^(.*?layers\.)(\d+)(\..*)$")
    out = {}
    for name, t in src.items():
        m = layer_re.match(name)
        if not m:
            out[name] = t  # embeddings, final norm, LM head
            continue
        old = int(m.group(2))
        if old in keep:
            out["%s%d%s" % (m.group(1), keep.index(old), m.group(3))] = t
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), out)
    cfg["num_hidden_layers"] = len(keep)
    for key in ("max_window_layers", "layer_types"):  # per-layer lists of the target would not fit
        if isinstance(cfg.get(key), list):
            cfg[key] = [cfg[key][k] for k in keep]
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name in os.listdir(a.target):
        if name.startswith("tokenizer") or name in ("special_tokens_map.json", "generation_config.json",
                                                    "chat_template.jinja"):
            shutil.copy(os.path.join(a.target, name), os.path.join(a.out, name))
    params = sum(int(t.size) for t in out.values())
    print("make_draft: %s -> %s: layers %s of %d kept, %.1fM parameters (%d tensors)"
          % (a.target, a.out, keep, L, params / 1e6, len(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

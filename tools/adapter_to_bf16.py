#!/usr/bin/env python3
"""tools/adapter_to_bf16.py IN.safetensors OUT.safetensors - rewrites a PEFT adapter's F32 tensors
as BF16 (round to nearest even), halving the file that is committed (models/*/); every other
tensor and the metadata are copied as they are. shardlm reads BF16 adapters and widens them to
F32 at load, so what is served is exactly the rounded adapter.
Only NumPy: the safetensors layout is an 8-byte little-endian header length, a JSON header
(name -> dtype, shape, data_offsets), then the data.
"""
import json
import struct
import sys

import numpy as np


def to_bf16(x: np.ndarray) -> np.ndarray:
    u = x.astype("<f4").view("<u4").astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest, ties to even
    nan = np.isnan(x)
    out = rounded.astype("<u2")
    out[nan] = 0x7FC0
    return out


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    raw = open(sys.argv[1], "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out_header, chunks, offset = {}, [], 0
    for name, info in header.items():
        if name == "__metadata__":
            out_header[name] = info
            continue
        b, e = info["data_offsets"]
        blob = data[b:e]
        if info["dtype"] == "F32":
            blob = to_bf16(np.frombuffer(blob, dtype="<f4")).tobytes()
            info = dict(info, dtype="BF16")
        out_header[name] = dict(info, data_offsets=[offset, offset + len(blob)])
        chunks.append(blob)
        offset += len(blob)
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(sys.argv[2], "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    return 0


if __name__ == "__main__":
    sys.exit(main())

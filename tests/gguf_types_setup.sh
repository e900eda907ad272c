#!/usr/bin/env bash
# tests/gguf_types_setup.sh SHARDLM OUT_DIR - fixture of golden_gguf_types: a small random
# Llama GGUF whose matrices cover every tensor type shardlm reads (tests/reference/
# gguf_types_model.py, gguf-py), its `shardlm convert gguf` (f32), and the float64 reference
# logits over gguf-py's dequantization (tests/reference/llama_gguf_ref.py). 40 ids: served from
# the GGUF in one chunk, the blocks are dequantized for sgemm; in chunks of 8 (test_model
# ref-int8) every product is the int8 one. Exits 77 (skip) without gguf-py.
set -euo pipefail
shardlm=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
rm -rf "$out"
mkdir -p "$out"
"$py" "$here/reference/gguf_types_model.py" --out "$out/types.gguf"
"$shardlm" convert gguf --gguf "$out/types.gguf" --out "$out/types"
"$py" "$here/reference/llama_gguf_ref.py" --gguf "$out/types.gguf" \
  --ids 1,45,210,7,99,300,12,180,64,3,250,17,128,77,5,301,42,160,8,219,90,33,275,11,140,66,199,4,310,58,121,26,240,81,13,170,95,288,36,150 \
  --json "$out/types_ref.json"

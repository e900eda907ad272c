#!/usr/bin/env bash
# tests/gemma_setup.sh SHARDLM OUT_DIR GGUF - fixture of the Gemma 3 golden test: when the GGUF
# (fetched by `make run` / tools/fetch_default_model.sh into .cache/) is present, converts it
# with `shardlm convert gguf` and computes the float64 reference logits with
# tests/reference/gemma3_ref.py (gguf-py dequantization, NumPy forward). Without the file it
# prints SKIP and leaves nothing, and the golden test SKIPs too.
set -euo pipefail
shardlm=$1
out=$2
gguf=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"
if [ ! -f "$gguf" ]; then
  echo "SKIP: no Gemma 3 GGUF at $gguf (fetched by make run)"
  exit 0
fi
mkdir -p "$out"
"$shardlm" convert gguf --gguf "$gguf" --out "$out/gemma-3-270m"
# "<bos>Once upon a time, there was a" and "<bos>The capital of France is" in one sequence.
"${PYTHON:-python3}" "$here/reference/gemma3_ref.py" --gguf "$gguf" \
  --ids 2,14946,3324,496,990,236764,993,691,496,818,5279,529,7001,563 --json "$out/gemma3_ref.json"

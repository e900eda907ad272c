#!/usr/bin/env bash
# tests/smollm2_setup.sh SHARDLM OUT_DIR GGUF - fixture of the SmolLM2 golden test: when the GGUF
# (fetched by make test / tools/fetch_smollm2.sh into .cache/smollm2) is present, converts it
# with `shardlm convert gguf` (f32) and computes the float64 reference logits with
# tests/reference/llama_gguf_ref.py (gguf-py dequantization, NumPy forward of the llama
# architecture). Without the file it prints SKIP and leaves nothing; the golden test SKIPs too.
set -euo pipefail
shardlm=$1
out=$2
gguf=$3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"
if [ ! -f "$gguf" ]; then
  echo "SKIP: no SmolLM2 GGUF at $gguf (fetched by make test: tools/fetch_smollm2.sh)"
  exit 0
fi
mkdir -p "$out"
"$shardlm" convert gguf --gguf "$gguf" --out "$out/smollm2-135m"
# "<|im_start|>Once upon a time, there was a<|im_end|>The capital of France is" as ids.
"${PYTHON:-python3}" "$here/reference/llama_gguf_ref.py" --gguf "$gguf" \
  --ids 1,6403,1980,253,655,28,665,436,2,504,3575,282,4649,314 --json "$out/smollm2_ref.json"

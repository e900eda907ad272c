#!/usr/bin/env bash
# tools/run_default.sh BUILD_DIR ASSETS_DIR - the main job until the gRPC server lands:
# imports the default model (stories260K, a real trained llama2.c model from ../shared/assets)
# into a Hugging Face-layout directory once, under .cache/models/, then generates from it.
set -euo pipefail
build=${1:-build}
assets=${2:-../shared/assets}
src="$assets/stories260K"
if [ ! -f "$src/stories260K.bin" ] || [ ! -f "$src/tok512.model" ]; then
  echo "run_default: the default model is missing: expected $src/stories260K.bin and tok512.model" >&2
  echo "run_default: set SHARDLM_ASSETS to the folder that holds stories260K/" >&2
  exit 1
fi
dir=.cache/models/stories260K
if [ ! -f "$dir/model.safetensors" ]; then
  mkdir -p .cache/models
  "$build/shardlm" convert llama2c --checkpoint "$src/stories260K.bin" \
    --tokenizer "$src/tok512.model" --out "$dir"
fi
exec "$build/shardlm" generate --model "$dir" --prompt "${PROMPT:-}" \
  --max-tokens "${MAX_TOKENS:-120}" --temperature "${TEMPERATURE:-0}"

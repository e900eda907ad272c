#!/usr/bin/env bash
# tools/distill_draft.sh SHARDLM [TARGET] [OUT] - the recipe of a draft model that shardlm trains
# itself for speculative decoding (issue 29): no downloaded draft, the target's own weights and
# outputs only. Steps, each logged under OUT:
#   1. the target (a GGUF, default SmolLM2-135M-Instruct Q4_1 of tools/fetch_smollm2.sh) in the
#      Hugging Face layout, f32 (`shardlm convert gguf --dtype f32`; a directory is used as it is);
#   2. the draft's start: LAYERS (default 4) of its layers spread evenly, its embeddings, final
#      norm and head (tools/make_draft.py): the same vocabulary, so that the served model accepts it;
#   3. the training data: N (default 400) SQuAD training questions answered greedily by the target
#      as it is served (tools/distill_data.py; .cache/chat-data/train.jsonl of
#      tools/prepare_chat_data.py; the held-out articles are never in it);
#   4. `shardlm train` of the draft on those answers (sequence-level distillation: the target's
#      tokens as the labels), EPOCHS (default 4) epochs, 5 % held out;
#   5. tools/bench_speculative.py on the held-out SQuAD questions: no speculation, prompt lookup,
#      the untrained cut and the trained draft (--speculative draft), at batch 1.
# A recipe and a benchmark, never a test: about 25 minutes on 2 cores. Figures: docs/speculative.md.
set -eu
BIN=${1:?usage: tools/distill_draft.sh SHARDLM [TARGET] [OUT]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${2:-$ROOT/.cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${3:-$ROOT/.cache/draft}
LAYERS=${LAYERS:-4}
N=${N:-400}
EPOCHS=${EPOCHS:-4}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
[ -f "$TARGET" ] || [ -d "$TARGET" ] || { echo "distill_draft: no target $TARGET (tools/fetch_smollm2.sh)"; exit 1; }
[ -f "$ROOT/.cache/chat-data/train.jsonl" ] ||
  { echo "distill_draft: no .cache/chat-data/train.jsonl (tools/prepare_chat_data.py)"; exit 1; }
if [ -d "$TARGET" ]; then HF=$TARGET; else
  HF=$OUT/target
  [ -f "$HF/model.safetensors" ] || "$BIN" convert gguf --gguf "$TARGET" --out "$HF" --dtype f32
fi
python3 "$ROOT/tools/make_draft.py" --target "$HF" --out "$OUT/init$LAYERS" --n-layers "$LAYERS"
python3 "$ROOT/tools/distill_data.py" --shardlm "$BIN" --model "$TARGET" --out "$OUT/distill.jsonl" --n "$N" \
  --threads "$THREADS"
rm -rf "$OUT/trained$LAYERS"
"$BIN" train --model "$OUT/init$LAYERS" --data "$OUT/distill.jsonl" --out "$OUT/trained$LAYERS" --seq-length 512 \
  --micro-batch-size 4 --global-batch-size 16 --lr 5e-4 --min-lr 5e-5 --epochs "$EPOCHS" --split 95,5 \
  --eval-iters 4 --eval-interval 10 --threads "$THREADS" --log-interval 5 2> "$OUT/train$LAYERS.log"
grep -h "eval at step" "$OUT/train$LAYERS.log" | sed -n '1p;$p'
python3 "$ROOT/tools/bench_speculative.py" --shardlm "$BIN" --model "$TARGET" --threads "$THREADS" --batches 1 \
  --draft-model "$OUT/init$LAYERS" --draft-model "$OUT/trained$LAYERS"

#!/usr/bin/env bash
# tools/distill_draft.sh SHARDLM [TARGET] [OUT] - the recipe of a draft model that shardlm trains
# itself for speculative decoding (issue 29): no downloaded draft, the target's own weights and
# outputs only. Steps, each logged under OUT:
#   1. the target (a GGUF, default SmolLM2-135M-Instruct Q4_1 of tools/fetch_smollm2.sh) in the
#      Hugging Face layout, f32 (`shardlm convert gguf --dtype f32`; a directory is used as it is);
#   2. the draft's start: LAYERS (default 4) of its layers spread evenly, its embeddings, final
#      norm and head (tools/make_draft.py): the same vocabulary, so that the served model accepts it;
#   3. the training data (tools/distill_data.py; .cache/chat-data/train.jsonl of
#      tools/prepare_chat_data.py with --sharegpt, as tools/train_chat_adapter.sh makes it; the
#      held-out SQuAD articles are never in it): N (default 1200) SQuAD training questions and
#      CHAT_N (default 600) ShareGPT first turns answered greedily by the target as it is served;
#   4. `shardlm train` of the draft on those answers (sequence-level distillation: the target's
#      tokens as the labels), EPOCHS (default 2) epochs, 5 % held out;
#   5. the trained draft as a Q8_0 GGUF (tools/draft_gguf.py: served as blocks, and readable by
#      llama.cpp) and a token map of its MAP_N (default 8192) most frequent tokens in the training
#      data (tools/draft_token_map.py: --spec-token-map);
#   6. tools/bench_speculative.py on the held-out SQuAD questions and on everyday requests (--open):
#      no speculation, prompt lookup, the trained draft's GGUF without and with the token map, at
#      batch 1; with LLAMA_SPECULATIVE (llama.cpp's llama-speculative-simple, `ONLY=examples
#      tools/bench_vs_llamacpp.sh`) also llama.cpp with the same draft.
# A recipe and a benchmark, never a test: about an hour on 2 cores. Figures: docs/speculative.md.
set -eu
BIN=${1:?usage: tools/distill_draft.sh SHARDLM [TARGET] [OUT]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${2:-$ROOT/.cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${3:-$ROOT/.cache/draft}
LAYERS=${LAYERS:-4}
N=${N:-1200}
CHAT_N=${CHAT_N:-600}
EPOCHS=${EPOCHS:-2}
MAP_N=${MAP_N:-8192}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
[ -f "$TARGET" ] || [ -d "$TARGET" ] || { echo "distill_draft: no target $TARGET (tools/fetch_smollm2.sh)"; exit 1; }
[ -f "$ROOT/.cache/chat-data/train.jsonl" ] ||
  { echo "distill_draft: no .cache/chat-data/train.jsonl (tools/prepare_chat_data.py --sharegpt ..., as tools/train_chat_adapter.sh runs it)"; exit 1; }
if [ -d "$TARGET" ]; then HF=$TARGET; else
  HF=$OUT/target
  [ -f "$HF/model.safetensors" ] || "$BIN" convert gguf --gguf "$TARGET" --out "$HF" --dtype f32
fi
python3 "$ROOT/tools/make_draft.py" --target "$HF" --out "$OUT/init$LAYERS" --n-layers "$LAYERS"
python3 "$ROOT/tools/distill_data.py" --shardlm "$BIN" --model "$TARGET" --out "$OUT/squad.jsonl" --n "$N" \
  --threads "$THREADS"
data=$OUT/squad.jsonl
if [ "$CHAT_N" -gt 0 ]; then
  python3 "$ROOT/tools/distill_data.py" --shardlm "$BIN" --model "$TARGET" --out "$OUT/chat.jsonl" --n "$CHAT_N" \
    --prefix '' --max-tokens 128 --threads "$THREADS"
  data=$data,$OUT/chat.jsonl
fi
rm -rf "$OUT/trained$LAYERS"
"$BIN" train --model "$OUT/init$LAYERS" --data "$data" --out "$OUT/trained$LAYERS" --seq-length 512 \
  --micro-batch-size 4 --global-batch-size 16 --lr 5e-4 --min-lr 5e-5 --epochs "$EPOCHS" --split 95,5 \
  --eval-iters 4 --eval-interval 10 --threads "$THREADS" --log-interval 5 2> "$OUT/train$LAYERS.log"
grep -h "eval at step" "$OUT/train$LAYERS.log" | sed -n '1p;$p'
G=$OUT/trained$LAYERS.q8_0.gguf
if [ -f "$TARGET" ]; then
  python3 "$ROOT/tools/draft_gguf.py" --model "$OUT/trained$LAYERS" --like "$TARGET" --out "$G" --type q8_0
else
  G=$OUT/trained$LAYERS # a directory target: no GGUF to take the tokenizer keys from
fi
python3 "$ROOT/tools/draft_token_map.py" --tokenizer "$HF/tokenizer.json" --config "$HF/config.json" --data "$data" \
  --n "$MAP_N" --out "$OUT/map$MAP_N.json"
llama=()
if [ -n "${LLAMA_SPECULATIVE:-}" ] && [ -f "$TARGET" ]; then llama=(--llama-speculative "$LLAMA_SPECULATIVE" --llama-draft "$G"); fi
for open in "" --open; do
  python3 "$ROOT/tools/bench_speculative.py" --shardlm "$BIN" --model "$TARGET" --threads "$THREADS" --batches 1 \
    --draft-model "$G" --token-map "$OUT/map$MAP_N.json" ${open:+"$open" --max-tokens 96} \
    ${llama[@]+"${llama[@]}"}
done

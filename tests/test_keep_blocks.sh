#!/usr/bin/env bash
# tests/test_keep_blocks.sh SHARDLM GGUF - `shardlm convert gguf --keep-blocks` from the command
# line: greedy `shardlm generate` from the directory prints exactly the GGUF's own text (the same
# blocks, so the same logits bit for bit), and so does `reshard --format hf` straight from the
# GGUF (its blocks kept, tokenizer.model from its metadata).
# On the real Gemma 3 270M Q4_K_M file (fetched into .cache/ by make run; test
# gemma3_gguf_keep_blocks), on the golden prompts of test_gguf_generate.sh, and the directory's
# size against the GGUF's (printed; within 5 %: the same blocks and f32 norms).
# On a small file (tests/gguf_setup.py's tiny_gemma3_blocks.gguf; test keep_blocks_cli) the sizes
# are printed only (its metadata and an F16 matrix written as f32 weigh more than 5 %), and the
# float paths run too: `train` on the directory and on the GGUF (a LoRA adapter) and `merge-lora` into it write
# float weights, no blocks, that generate.
# The library checks of the same paths: test_keep_blocks.c. SKIP (77) without the file.
set -u
shardlm=$1
gguf=$2
if [ ! -f "$gguf" ]; then
  echo "SKIP: no $gguf (the model is fetched by make run)"
  exit 77
fi
. "$(dirname "$0")/check.sh"

"$shardlm" convert gguf --gguf "$gguf" --out "$tmp/kept" --keep-blocks 2> "$tmp/err"
check "convert gguf --keep-blocks" $?
echo "     $(grep -o 'gguf_convert: .*' "$tmp/err" | head -c 300)"
size_gguf=$(stat -c %s "$gguf")
size_st=$(stat -c %s "$tmp/kept/model.safetensors" 2> /dev/null || echo 0)
size_dir=$(du -sb "$tmp/kept" | cut -f1)
echo "     sizes: GGUF $size_gguf bytes; kept-blocks model.safetensors $size_st bytes, whole directory $size_dir bytes"
small=0
[ "$size_gguf" -lt 100000000 ] && small=1
if [ "$small" = 0 ]; then
  [ $((size_dir * 100)) -ge $((size_gguf * 95)) ] && [ $((size_dir * 100)) -le $((size_gguf * 105)) ]
  check "the kept-blocks directory ($size_dir bytes) is within 5 % of the GGUF ($size_gguf bytes)" $?
fi

"$shardlm" reshard --model "$gguf" --out "$tmp/hf" --format hf > /dev/null 2> "$tmp/err"
check "reshard --format hf from the GGUF ($(tail -n 1 "$tmp/err" | head -c 200))" $?

i=0
for spec in "32|Once upon a time, there was a little" "15|The capital of France is"; do
  n=${spec%%|*}
  prompt=${spec#*|}
  i=$((i + 1))
  for m in gguf kept hf; do
    model=$tmp/$m
    [ "$m" = gguf ] && model=$gguf
    "$shardlm" generate --model "$model" --prompt "$prompt" --max-tokens "$n" --threads 1 > "$tmp/$m.$i" 2> /dev/null
  done
  echo "     gguf: $(cat "$tmp/gguf.$i")"
  [ -s "$tmp/gguf.$i" ] && cmp -s "$tmp/gguf.$i" "$tmp/kept.$i"
  check "generate from the kept-blocks directory prints the GGUF's greedy text ($n tokens of \"$prompt\")" $?
  [ -s "$tmp/gguf.$i" ] && cmp -s "$tmp/gguf.$i" "$tmp/hf.$i"
  check "generate from reshard --format hf of the GGUF prints the same text ($n tokens of \"$prompt\")" $?
done

if [ "$small" = 1 ]; then
  for i in $(seq 40); do echo "hello world hello hello world"; done > "$tmp/data.txt"
  "$shardlm" train --model "$tmp/kept" --data "$tmp/data.txt" --out "$tmp/lora" --lora-rank 2 --train-iters 1 \
    --seq-length 16 --threads 1 > /dev/null 2>&1 &&
    "$shardlm" merge-lora --model "$tmp/kept" --adapter "$tmp/lora" --out "$tmp/merged" > /dev/null 2> "$tmp/err" &&
    ! grep -q shardlm.blocks "$tmp/merged/model.safetensors" &&
    "$shardlm" generate --model "$tmp/merged" --prompt "hello" --max-tokens 4 --threads 1 > /dev/null 2>&1
  check "train a LoRA adapter on the kept-blocks directory, merge-lora it in: float weights, no blocks, generate runs" $?
  # A GGUF file itself: the tokenizer from its metadata, as serve and generate take it.
  "$shardlm" train --model "$gguf" --data "$tmp/data.txt" --out "$tmp/lora-gguf" --lora-rank 2 --train-iters 1 \
    --seq-length 16 --threads 1 > /dev/null 2> "$tmp/err" && [ -f "$tmp/lora-gguf/adapter_config.json" ]
  check "train a LoRA adapter on the GGUF file directly ($(tail -c 200 "$tmp/err" | tr '\n' ' '))" $?
fi

check_summary

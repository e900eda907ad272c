#!/usr/bin/env bash
# tests/test_train_qk_norm_tp.sh SHARDLM GOLDEN_DIR - training a model whose QK norm spans the whole
# projection (OLMo 2: q and k RMS-normed over every head at once) split over tp ranks: the rows of
# q and k are gathered over tp for the norm and its backward (layer_qk_norm, model_train.c
# qk_norm_backward), so every layout trains what one rank trains. A small random Olmo2ForCausalLM
# (tests/reference/make_models.py, stories260K's tok512 tokenizer) fine-tuned for 6 steps on
# tinyshakespeare at one rank (the reference), tp 2, tp 2 with sequence parallelism and selective
# recomputation, and tp 2 x pp 2: the same losses and grad norms and the same weights (1e-5, as
# tests/test_train_parallel.sh; AdamW eps 1e-3 there and here keeps f32 reassociation from being
# amplified), the q_norm / k_norm weights included. (One rank's gradients against JAX: train_grad.)
# Loopback only; every wait is bounded.
set -u
BIN=$1
TOK=$2/stories260K/tokenizer.model
here=$(cd "$(dirname "$0")" && pwd)
ASSETS=${SHARDLM_ASSETS:-$here/../../shared/assets}
TEXT=$ASSETS/datasets/tinyshakespeare.txt
command -v mpirun > /dev/null || { echo "SKIP: train_qk_norm_tp: no mpirun"; exit 77; }
if [ ! -f "$TOK" ] || [ ! -f "$TEXT" ]; then
  echo "SKIP: train_qk_norm_tp: no stories260K tokenizer in $2 or no $TEXT (shared assets)"
  exit 77
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
n_pass=0
n_fail=0
check() { # check NAME STATUS
  if [ "$2" = 0 ]; then n_pass=$((n_pass + 1)); echo "PASS $1"; else n_fail=$((n_fail + 1)); echo "FAIL $1"; fi
}
export OMP_NUM_THREADS=1
head -c 100000 "$TEXT" > "$WORK/text.txt"
COMMON=(--model "$WORK/olmo2" --data "$WORK/text.txt" --seq-length 64 --micro-batch-size 2 --global-batch-size 4
        --lr 1e-3 --adam-eps 1e-3 --seed 7 --threads 1 --eval-iters 0 --train-iters 6)

PYTHONPATH=$here/reference python3 - "$WORK" "$TOK" <<'EOF' || { echo "FAIL: making the checkpoint"; exit 1; }
import os, shutil, sys
import families
import make_models as MM
work, tok = sys.argv[1], sys.argv[2]
cfg = families.olmo2_config("f32")
MM.write_checkpoint(os.path.join(work, "olmo2"), cfg, MM.init_llama(cfg, 5), "f32", 1)
shutil.copy(tok, os.path.join(work, "olmo2", "tokenizer.model"))
EOF

timeout 300 "$BIN" train "${COMMON[@]}" --out "$WORK/one" > "$WORK/one.log" 2>&1
check "olmo2: 6 steps at one rank (the reference)" $?
for layout in "2|tp2|--tp 2" "2|tp2_sp|--tp 2 --sequence-parallel --recompute-granularity selective --recompute-modules mlp,layernorm" \
              "4|tp2pp2|--tp 2 --pp 2"; do
  n=${layout%%|*}
  rest=${layout#*|}
  name=${rest%%|*}
  flags=${rest#*|}
  # shellcheck disable=SC2086
  timeout 300 mpirun --oversubscribe -n "$n" "$BIN" train "${COMMON[@]}" --out "$WORK/$name" $flags > "$WORK/$name.log" 2>&1
  rc=$?
  if [ "$rc" != 0 ]; then
    check "olmo2 $name runs (rc $rc: $(grep -v '^I' "$WORK/$name.log" | tail -2 | tr '\n' ' '))" 1
    continue
  fi
  out=$(python3 "$here/train_compare.py" losses "$WORK/one/metrics.jsonl" "$WORK/$name/metrics.jsonl" --rtol 1e-5 &&
        python3 "$here/train_compare.py" weights "$WORK/one" "$WORK/$name" --rtol 1e-5)
  ok=$?
  check "olmo2 $name trains what one rank trains: $(echo "$out" | tail -n 2 | tr '\n' ';')" $ok
done
PYTHONPATH=$here/reference python3 - "$WORK" <<'EOF'
import sys
import make_models as MM
a, b = MM.read_safetensors(sys.argv[1] + "/olmo2/model.safetensors"), MM.read_safetensors(sys.argv[1] + "/tp2/model.safetensors")
moved = min(abs(b[k] - a[k]).max() for k in a if k.endswith(("q_norm.weight", "k_norm.weight")))
print("# the QK norm weights moved by at least %.2e" % moved)
sys.exit(0 if moved > 1e-4 else 1)
EOF
check "olmo2 tp2: every q_norm / k_norm weight trained (moved)" $?

echo "$n_pass passed, $n_fail failed"
[ "$n_fail" = 0 ]

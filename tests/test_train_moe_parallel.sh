#!/usr/bin/env bash
# tests/test_train_moe_parallel.sh SHARDLM GOLDEN_DIR - a mixture of experts trained under
# `mpirun` against one rank, as tests/test_train_parallel.sh checks dense models: small random
# Mixtral (8 experts, top 2) and Qwen 2 MoE (4 experts, top 2, a shared expert) checkpoints
# (tests/reference/make_models.py, stories260K's tok512 tokenizer), 6 steps of 4 micro-batches
# with the load-balancing and z losses, at dp 2, dp 2 with the distributed optimizer, pp 2 (1F1B;
# Mixtral also with selective recomputation of the experts), dp 2 x pp 2, and tp 2 (each rank its
# experts, the slots' weight gradients summed over tp before the router's; Mixtral without and with
# sequence parallelism, Qwen 2 MoE's shared expert split like a dense MLP, with it) (GPT-OSS, with
# its sinks, biases and windows: dp 2 with the distributed optimizer, pp 2 and tp 2, its sinks
# split by heads): every step's loss and
# gradient norm within 1e-5 relative of one rank's (tests/train_compare.py), the final weights
# within 1e-5, and every step's expert_load (layers x experts) equal to one rank's, its
# moe_aux_loss and moe_z_loss within 2e-5 (printed to 6 digits).
# Adam's eps is 1e-3 as in test_train_parallel.sh. Every wait is bounded.
set -u
BIN=$1
TOK=$2/stories260K/tokenizer.model
here=$(cd "$(dirname "$0")" && pwd)
ASSETS=${SHARDLM_ASSETS:-$here/../../shared/assets}
TEXT=$ASSETS/datasets/tinyshakespeare.txt
command -v mpirun > /dev/null || { echo "SKIP: train_moe_parallel: no mpirun"; exit 77; }
if [ ! -f "$TOK" ] || [ ! -f "$TEXT" ]; then
  echo "SKIP: train_moe_parallel: no stories260K tokenizer in $2 or no $TEXT (shared assets)"
  exit 77
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
n_pass=0
n_fail=0
check() { # check NAME STATUS
  if [ "$2" = 0 ]; then n_pass=$((n_pass + 1)); echo "PASS $1"; else n_fail=$((n_fail + 1)); echo "FAIL $1"; fi
}
COMPARE="python3 $here/train_compare.py"
export OMP_NUM_THREADS=1
head -c 200000 "$TEXT" > "$WORK/text.txt"

PYTHONPATH=$here/reference python3 - "$WORK" "$TOK" <<'PY' || { echo "FAIL: making the checkpoints"; exit 1; }
import os, shutil, sys
import gpt_oss_ref
import make_models as MM
work, tok = sys.argv[1], sys.argv[2]
cfg = gpt_oss_ref.gpt_oss_config("f32")
MM.write_checkpoint(os.path.join(work, "gpt_oss"), cfg, gpt_oss_ref.init_gpt_oss(cfg, 5), "f32", 1)
shutil.copy(tok, os.path.join(work, "gpt_oss", "tokenizer.model"))
for flavor in ("mixtral", "qwen2_moe"):
    cfg = MM.moe_config(flavor, "f32")
    MM.write_checkpoint(os.path.join(work, flavor), cfg, MM.init_llama(cfg, 5), "f32", 1)
    shutil.copy(tok, os.path.join(work, flavor, "tokenizer.model"))
PY

# run NAME N MODEL EXTRA...: mpirun -n N shardlm train into $WORK/NAME
run() {
  local name=$1 n=$2 model=$3
  shift 3
  timeout 180 mpirun --oversubscribe -n "$n" "$BIN" train --model "$WORK/$model" --data "$WORK/text.txt" \
    --out "$WORK/$name" --seq-length 64 --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --adam-eps 1e-3 \
    --seed 7 --threads 1 --eval-iters 0 --log-interval 100 --train-iters 6 \
    --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001 "$@" > "$WORK/$name.log" 2>&1
}

# same NAME REF: losses, weights and the routing's metrics of run NAME against run REF
same() {
  local out rc
  out=$($COMPARE losses "$WORK/$2/metrics.jsonl" "$WORK/$1/metrics.jsonl" --rtol 1e-5 &&
        $COMPARE weights "$WORK/$2" "$WORK/$1" --rtol 1e-5 &&
        python3 - "$WORK/$2/metrics.jsonl" "$WORK/$1/metrics.jsonl" <<'PY'
import json, sys
ref, got = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:])
ok = len(ref) == len(got) == 6
for a, b in zip(ref, got):
    ok &= a["expert_load"] == b["expert_load"]
    for key in ("moe_aux_loss", "moe_z_loss"):
        ok &= abs(a[key] - b[key]) <= 2e-5 * abs(a[key])
print("PASS expert_load equal at every step, moe_aux_loss %.6g and moe_z_loss %.6g as one rank's"
      % (got[-1]["moe_aux_loss"], got[-1]["moe_z_loss"]) if ok else "FAIL the routing's metrics differ")
sys.exit(0 if ok else 1)
PY
)
  rc=$?
  check "$1: $(echo "$out" | tr '\n' ';' | sed 's/PASS //g')" $rc
}

for flavor in mixtral qwen2_moe gpt_oss; do
  run "${flavor}_one" 1 "$flavor"
  check "$flavor: one rank trains (reference)" $?
  layouts=("2|" "2|--use-distributed-optimizer" "2|--pp 2" "4|--pp 2 --use-distributed-optimizer"
           "2|--tp 2 --sequence-parallel")
  names=(dp2 dp2_distopt pp2 dp2pp2_distopt tp2_sp)
  if [ "$flavor" = gpt_oss ]; then
    layouts=("2|--use-distributed-optimizer" "2|--pp 2" "2|--tp 2")
    names=(dp2_distopt pp2 tp2)
  fi
  if [ "$flavor" = mixtral ]; then
    layouts+=("2|--pp 2 --recompute-granularity selective --recompute-modules mlp,layernorm" "2|--tp 2")
    names+=(pp2_recompute_mlp tp2)
  fi
  for i in "${!layouts[@]}"; do
    n=${layouts[$i]%%|*}
    flags=${layouts[$i]#*|}
    name=${flavor}_${names[$i]}
    # shellcheck disable=SC2086
    if run "$name" "$n" "$flavor" $flags; then same "$name" "${flavor}_one"
    else check "$name runs ($(grep -v '^I' "$WORK/$name.log" | tail -3 | tr '\n' ' '))" 1; fi
  done
done

echo "$n_pass passed, $n_fail failed"
[ "$n_fail" = 0 ]

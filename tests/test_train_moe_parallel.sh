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
# split by heads; MiniMax-M2, its sigmoid router with the selection bias: pp 2, tp 2, ep 2; GLM-4.5,
# its dense first layer, groups and plain shared expert: pp 2, tp 2 with sp, ep 2, ep 2 x tp 2), and with expert parallelism (--ep: ep groups carved out of dp, tokens dispatched
# and combined by all-to-all, expert gradients reduced over the experts' own dp group; every flavor
# at ep 2, Mixtral also at ep 4, ep 2 x dp 4, ep 2 x pp 2, with selective and full recomputation,
# with the distributed optimizer (the experts' moments sharded over their own dp group) at ep 2,
# ep 2 x dp 4 and ep 2 x pp 2 x dp 4, ep 2 x tp 2 (each tp rank's experts split over its ep group;
# with sequence parallelism and the distributed optimizer too; Qwen 2 MoE as well), checkpoints
# resumed across layouts, and bf16): every step's loss and
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
import glm_ref
import gpt_oss_ref
import make_models as MM
work, tok = sys.argv[1], sys.argv[2]
cfg = gpt_oss_ref.gpt_oss_config("f32")
MM.write_checkpoint(os.path.join(work, "gpt_oss"), cfg, gpt_oss_ref.init_gpt_oss(cfg, 5), "f32", 1)
shutil.copy(tok, os.path.join(work, "gpt_oss", "tokenizer.model"))
cfg = glm_ref.config("f32")
MM.write_checkpoint(os.path.join(work, "glm4_moe"), cfg, glm_ref.init(cfg, 5), "f32", 1)
shutil.copy(tok, os.path.join(work, "glm4_moe", "tokenizer.model"))
for flavor in ("mixtral", "qwen2_moe", "minimax_m2"):
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

for flavor in mixtral qwen2_moe minimax_m2 gpt_oss glm4_moe; do
  run "${flavor}_one" 1 "$flavor"
  check "$flavor: one rank trains (reference)" $?
  layouts=("2|" "2|--use-distributed-optimizer" "2|--pp 2" "4|--pp 2 --use-distributed-optimizer"
           "2|--tp 2 --sequence-parallel")
  names=(dp2 dp2_distopt pp2 dp2pp2_distopt tp2_sp)
  if [ "$flavor" = gpt_oss ]; then
    layouts=("2|--use-distributed-optimizer" "2|--pp 2" "2|--tp 2")
    names=(dp2_distopt pp2 tp2)
  fi
  if [ "$flavor" = minimax_m2 ]; then # its sigmoid router with the selection bias, replicated over tp
    layouts=("2|--pp 2" "2|--tp 2")
    names=(pp2 tp2)
  fi
  if [ "$flavor" = glm4_moe ]; then # a dense first layer (its own width), groups, the scale, a plain shared expert
    layouts=("2|--pp 2" "2|--tp 2 --sequence-parallel" "4|--ep 2 --tp 2")
    names=(pp2 tp2_sp ep2_tp2)
  fi
  # expert parallelism: ep groups carved out of dp (every flavor at ep 2)
  layouts+=("2|--ep 2")
  names+=(ep2)
  if [ "$flavor" = mixtral ]; then
    layouts+=("2|--pp 2 --recompute-granularity selective --recompute-modules mlp,layernorm" "2|--tp 2"
              "4|--ep 4" "4|--ep 2" "4|--ep 2 --pp 2"
              "2|--ep 2 --recompute-granularity selective --recompute-modules mlp"
              "2|--ep 2 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
              "2|--ep 2 --save-interval 3" "2|--ep 2 --use-distributed-optimizer"
              "4|--ep 2 --use-distributed-optimizer --save-interval 3" "8|--ep 2 --pp 2 --use-distributed-optimizer"
              "4|--ep 2 --tp 2 --save-interval 3" "4|--ep 2 --tp 2 --sequence-parallel --use-distributed-optimizer")
    names+=(pp2_recompute_mlp tp2 ep4 ep2_dp4 ep2_pp2 ep2_recompute_mlp ep2_recompute_full ep2_saved ep2_distopt
            ep2_dp4_distopt ep2_dp4_pp2_distopt ep2_tp2_saved ep2_tp2_sp_distopt)
  fi
  if [ "$flavor" = qwen2_moe ]; then # ep x tp: each tp rank's experts split over its ep group
    layouts+=("4|--ep 2 --tp 2")
    names+=(ep2_tp2)
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

# An expert-parallel run's step-3 checkpoint (the experts gathered from the ep ranks, the moments
# too) resumed at ep 2 (each rank its experts' slice of the state), at one rank and at ep 4: the
# weights of the uninterrupted run.
resume() { # resume NAME N FROM FLAGS...
  local name=$1 n=$2 from=$3
  shift 3
  timeout 180 mpirun --oversubscribe -n "$n" "$BIN" train --resume "$WORK/$from/checkpoints/iter_0000003" \
    --data "$WORK/text.txt" --out "$WORK/$name" --seq-length 64 --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 \
    --adam-eps 1e-3 --seed 7 --threads 1 --eval-iters 0 --log-interval 100 --train-iters 6 \
    --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001 "$@" > "$WORK/$name.log" 2>&1 &&
    $COMPARE weights "$WORK/$from" "$WORK/$name" --rtol 1e-5 | tail -1
}
i=0
for layout in "mixtral_ep2_saved|2|--ep 2" "mixtral_ep2_saved|1|" "mixtral_ep2_saved|4|--ep 4" \
              "mixtral_ep2_saved|4|--ep 2 --use-distributed-optimizer" "mixtral_ep2_dp4_distopt|1|" \
              "mixtral_ep2_tp2_saved|1|" "mixtral_ep2_saved|4|--ep 2 --tp 2"; do
  from=${layout%%|*}
  rest=${layout#*|}
  n=${rest%%|*}
  i=$((i + 1))
  # shellcheck disable=SC2086
  out=$(resume "mixtral_resumed_$i" "$n" "$from" ${rest#*|})
  check "$from's step-3 checkpoint resumed on $n rank(s) ${rest#*|}: $out" $?
done

# bf16 at ep 2 (and ep 2 x dp 4 with the distributed optimizer, the f32 masters sharded): rounding
# drifts between layouts (an expert's products run over the group's rows, not one micro-batch's),
# so the check is that each tracks one rank's bf16 run within 5e-3.
run mixtral_bf16_one 1 mixtral --bf16
check "mixtral --bf16 trains at one rank (reference)" $?
for layout in "2|--ep 2" "4|--ep 2 --use-distributed-optimizer"; do
  n=${layout%%|*}
  # shellcheck disable=SC2086
  if run "mixtral_bf16_$n" "$n" mixtral --bf16 ${layout#*|}; then
    out=$($COMPARE losses "$WORK/mixtral_bf16_one/metrics.jsonl" "$WORK/mixtral_bf16_$n/metrics.jsonl" --rtol 5e-3)
    check "mixtral --bf16 ${layout#*|} tracks one rank: $(echo "$out" | tail -1)" $?
  else
    check "mixtral --bf16 ${layout#*|} runs ($(grep -v '^I' "$WORK/mixtral_bf16_$n.log" | tail -3 | tr '\n' ' '))" 1
  fi
done
grep -q "whole f32 masters freed" "$WORK/mixtral_bf16_4.log"
check "bf16 + ep + distributed optimizer: the whole masters are freed" $?

# DeepSeek-V3's loss-free balancing of MiniMax-M2's selection bias (--moe-router-bias-update-rate):
# after each step b_e += rate sign(mean load - load_e) per layer, from the step's routing; the
# final bias of the HF checkpoint written equals the initial one plus those steps recomputed in
# float32 from the metrics' expert_load, and ep 2 gives one rank's run.
if run minimax_m2_bias_one 1 minimax_m2 --moe-router-bias-update-rate 0.01 &&
   run minimax_m2_bias_ep2 2 minimax_m2 --moe-router-bias-update-rate 0.01 --ep 2; then
  same minimax_m2_bias_ep2 minimax_m2_bias_one
  PYTHONPATH=$here python3 - "$WORK/minimax_m2" "$WORK/minimax_m2_bias_one" <<'PY'
import json, sys
import numpy as np
from train_compare import read_safetensors
src, out = sys.argv[1:]
w0, w1 = read_safetensors(src + "/model.safetensors"), read_safetensors(out + "/model.safetensors")
steps = [json.loads(l) for l in open(out + "/metrics.jsonl") if '"loss"' in l]
ok, moved = len(steps) == 6, 0.0
for l in range(2):
    name = "model.layers.%d.block_sparse_moe.e_score_correction_bias" % l
    b = w0[name].astype(np.float32).copy()
    for s in steps:
        load = np.array(s["expert_load"][l], dtype=np.float64)
        b = (b + np.float32(0.01) * np.sign(load.mean() - load).astype(np.float32)).astype(np.float32)
    ok &= np.array_equal(b, w1[name])
    moved = max(moved, float(np.abs(w1[name] - w0[name]).max()))
print(("PASS" if ok and moved > 0 else "FAIL") + " the selection bias after 6 steps is the initial one plus 0.01 sign(mean "
      "load - load) of every step's routing, bit for bit (moved up to %.2f)" % moved)
sys.exit(0 if ok and moved > 0 else 1)
PY
  check "minimax_m2 --moe-router-bias-update-rate: the bias update" $?
else
  check "minimax_m2 with the bias update runs ($(grep -v '^I' "$WORK/minimax_m2_bias_ep2.log" | tail -3 | tr '\n' ' '))" 1
fi

# The all-to-alls' traffic each ep rank logs: the bytes sent to other ranks equal the rows the
# routing sent them times d_model x 4 (f32), and every token-layer is counted.
python3 - "$WORK/mixtral_ep2.log" "$WORK/mixtral_ep4.log" <<'PY'
import re, sys
ok = True
for path, ranks in zip(sys.argv[1:], (2, 4)):
    lines = [l for l in open(path) if "(training): the all-to-alls sent" in l]
    for l in lines:
        m = re.search(r"sent (\d+) bytes .*?= (\d+) expected.*?; (\d+) token-layers", l)
        ok &= bool(m) and m.group(1) == m.group(2) and int(m.group(1)) > 0 and int(m.group(3)) > 0
    ok &= len(lines) == ranks
print(("PASS" if ok else "FAIL") + " every ep rank logs its all-to-all bytes, equal to the routing's rows x d_model x 4")
sys.exit(0 if ok else 1)
PY
check "the ep traffic logs" $?

# Refused by name: an ep (x tp) that does not divide dp or the experts, a dense model.
n_refused=0
refused() { # refused NAME N NEEDLE MODEL FLAGS...
  local name=$1 n=$2 needle=$3 model=$4 out
  shift 4
  n_refused=$((n_refused + 1))
  out=refused_$n_refused
  run "$out" "$n" "$model" "$@"
  local rc=$?
  if [ "$rc" != 0 ] && grep -q -- "$needle" "$WORK/$out.log"; then check "$name" 0
  else check "$name (rc $rc: $(grep -v '^I' "$WORK/$out.log" | tail -2 | tr '\n' ' '))" 1; fi
}
refused "--ep 2 on 3 data-parallel ranks is refused" 3 "--ep 2 does not divide the 3 data-parallel ranks" mixtral \
  --global-batch-size 6 --ep 2
refused "--ep 3 with 4 experts is refused" 3 "--ep 3 does not divide the 4 experts" qwen2_moe --global-batch-size 6 --ep 3
refused "--ep 2 x --tp 2 with 6 experts is refused naming both" 4 "--ep 2 x --tp 2 (4 ranks) does not divide the 6 experts" \
  minimax_m2 --ep 2 --tp 2
cp -r "$2/stories260K" "$WORK/dense"
refused "--ep on a dense model is refused" 2 "is a dense model (0 experts)" dense --ep 2 \
  --moe-aux-loss-coeff 0 --moe-z-loss-coeff 0
refused "the bias update on a router without a selection bias is refused" 1 "has no router selection bias" mixtral \
  --moe-router-enable-expert-bias
refused "the bias update with bf16 and the distributed optimizer is refused" 2 "the sharded masters would undo" \
  minimax_m2 --moe-router-bias-update-rate 0.01 --bf16 --use-distributed-optimizer

echo "$n_pass passed, $n_fail failed"
[ "$n_fail" = 0 ]

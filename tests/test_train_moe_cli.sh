#!/usr/bin/env bash
# tests/test_train_moe_cli.sh SHARDLM GOLDEN_DIR - `shardlm train` on a mixture of experts as a user
# meets it (the gradients themselves: tests/test_train_moe.py against JAX):
#   1. small random Mixtral, Qwen 2 MoE and GPT-OSS checkpoints (tests/reference/make_models.py,
#      gpt_oss_ref.py, with stories260K's tok512 tokenizer) fine-tuned for 30 steps on
#      tinyshakespeare with the load-balancing and z losses: the training loss falls, every
#      metrics line carries moe_aux_loss, moe_z_loss and expert_load (layers x experts, each layer
#      summing to tokens x top-k), the experts' and the router's weights changed (GPT-OSS: its
#      sinks and biases too, written back in its own Hugging Face layout: 3-D gate_up_proj and
#      down_proj), and the result loads and generates;
#   1a. GPT-OSS: `reshard --format hf` of the Hugging Face checkpoint gives every tensor back bit
#      for bit, and the rewritten config.json generates the same tokens;
#   1b. Mixtral's 3 steps + --resume + 3 steps equal 6 straight steps bitwise; Qwen 2 MoE and
#      GPT-OSS in bf16 with selective recomputation (the experts; GPT-OSS's attention too) run;
#   2. refused by name: the auxiliary losses on a dense model, LoRA on the experts, a negative
#      coefficient, --ep on train (serve and generate take it: tests/test_moe_ep.sh). (MoE
#      training at tp 2 against one rank: tests/test_train_moe_parallel.sh.)
# (dp and pp against one rank: tests/test_train_moe_parallel.sh.)
# Loopback only; every wait is bounded.
set -u
BIN=$1
TOK=$2/stories260K/tokenizer.model
here=$(cd "$(dirname "$0")" && pwd)
ASSETS=${SHARDLM_ASSETS:-$here/../../shared/assets}
TEXT=$ASSETS/datasets/tinyshakespeare.txt
if [ ! -f "$TOK" ] || [ ! -f "$TEXT" ]; then
  echo "SKIP: train_moe_cli: no stories260K tokenizer in $2 or no $TEXT (shared assets)"
  exit 77
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
n_pass=0
n_fail=0
check() { # check NAME STATUS
  if [ "$2" = 0 ]; then n_pass=$((n_pass + 1)); echo "PASS $1"; else n_fail=$((n_fail + 1)); echo "FAIL $1"; fi
}
expect() { # expect NAME WANT_RC NEEDLE CMD...: exit code and a message containing NEEDLE
  local name=$1 want=$2 needle=$3
  shift 3
  timeout 120 "$@" > "$WORK/out" 2> "$WORK/err"
  local rc=$?
  if [ "$rc" = "$want" ] && grep -q -- "$needle" "$WORK/err"; then check "$name" 0
  else check "$name (rc $rc, stderr: $(tail -c 300 "$WORK/err"))" 1; fi
}
export OMP_NUM_THREADS=1
COMMON=(--seq-length 64 --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --seed 7 --threads 1)
head -c 200000 "$TEXT" > "$WORK/text.txt"

PYTHONPATH=$here/reference python3 - "$WORK" "$TOK" <<'EOF' || { echo "FAIL: making the checkpoints"; exit 1; }
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
cfg = MM.llama_config("f32")
MM.write_checkpoint(os.path.join(work, "dense"), cfg, MM.init_llama(cfg, 5), "f32", 1)
shutil.copy(tok, os.path.join(work, "dense", "tokenizer.model"))
EOF

# ---- 1. fine-tuning ---------------------------------------------------------------------------
for flavor in mixtral qwen2_moe gpt_oss; do
  timeout 300 "$BIN" train --model "$WORK/$flavor" --data "$WORK/text.txt" --out "$WORK/$flavor.out" "${COMMON[@]}" \
    --train-iters 30 --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001 > "$WORK/train.out" 2> "$WORK/train.err"
  check "$flavor: 30 steps with the auxiliary losses exit 0" $?
  python3 - "$WORK/$flavor.out/metrics.jsonl" "$WORK/$flavor/config.json" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
cfg = json.load(open(sys.argv[2]))
E = cfg.get("num_local_experts") or cfg["num_experts"]
k, L = cfg["num_experts_per_tok"], cfg["num_hidden_layers"]
ok = len(rows) == 30
for r in rows:
    load = r.get("expert_load")
    ok &= load is not None and len(load) == L and all(len(x) == E and sum(x) == r["tokens"] * k for x in load)
    ok &= r.get("moe_aux_loss", 0) > 0.5 and r.get("moe_z_loss", 0) > 0
first, last = sum(r["loss"] for r in rows[:5]) / 5, sum(r["loss"] for r in rows[-5:]) / 5
print("# loss %.3f -> %.3f; last aux %.4f z %.4f, load %s" % (first, last, rows[-1]["moe_aux_loss"],
                                                             rows[-1]["moe_z_loss"], rows[-1]["expert_load"]))
sys.exit(0 if ok and last < first - 0.5 else 1)
EOF
  check "$flavor: the loss falls; every step reports moe_aux_loss, moe_z_loss and expert_load (tokens x k per layer)" $?
  python3 - "$WORK/$flavor/model.safetensors" "$WORK/$flavor.out/model.safetensors" <<'EOF'
import json, struct, sys
def tensors(p):
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in head.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
experts = [k for k in a if ".experts." in k or "shared_expert" in k or k.endswith(".gate.weight") or ".router." in k
           or k.endswith(".sinks")]
changed = [k for k in experts if k in b and a[k] != b[k]]
print("# %d of %d expert, router, shared and sink tensors changed" % (len(changed), len(experts)))
sys.exit(0 if experts and set(a) == set(b) and len(changed) == len(experts) else 1)
EOF
  check "$flavor: the checkpoint holds every tensor, each expert's and the router's trained" $?
  timeout 120 "$BIN" generate --model "$WORK/$flavor.out" --prompt "ROMEO:" --max-tokens 20 > "$WORK/gen" 2> "$WORK/gen.err"
  [ $? = 0 ] && [ -s "$WORK/gen" ]
  check "$flavor: the trained checkpoint loads and generates" $?
done

# ---- 1a. GPT-OSS's Hugging Face layout written back ---------------------------------------------
timeout 120 "$BIN" reshard --model "$WORK/gpt_oss" --out "$WORK/gpt_oss.hf" --format hf > /dev/null 2>&1 &&
  python3 - "$WORK/gpt_oss/model.safetensors" "$WORK/gpt_oss.hf/model.safetensors" <<'EOF'
import json, struct, sys
def tensors(p):
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
same = [k for k in a if k in b and a[k] == b[k]]
print("# %d of %d tensors (names, dtypes, shapes, bytes) the same" % (len(same), len(a)))
sys.exit(0 if set(a) == set(b) and len(same) == len(a) and any("gate_up_proj" in k for k in a) else 1)
EOF
check "gpt_oss: reshard --format hf gives every tensor back bit for bit (3-D gate_up_proj, down_proj)" $?
g1=$(timeout 60 "$BIN" generate --model "$WORK/gpt_oss" --prompt "ROMEO:" --max-tokens 12 --temperature 0 2>/dev/null)
g2=$(timeout 60 "$BIN" generate --model "$WORK/gpt_oss.hf" --prompt "ROMEO:" --max-tokens 12 --temperature 0 2>/dev/null)
[ -n "$g1" ] && [ "$g1" = "$g2" ]
check "gpt_oss: the rewritten checkpoint (its config.json shardlm's) generates the same tokens" $?

# ---- 1b. bitwise resume; bf16 with selective recomputation of the experts -----------------------
R=(--data "$WORK/text.txt" "${COMMON[@]}" --lr-decay-style constant --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001)
timeout 120 "$BIN" train --model "$WORK/mixtral" --out "$WORK/straight" "${R[@]}" --train-iters 6 > /dev/null 2>&1 &&
  timeout 120 "$BIN" train --model "$WORK/mixtral" --out "$WORK/halves" "${R[@]}" --train-iters 3 > /dev/null 2>&1 &&
  timeout 120 "$BIN" train --model "$WORK/mixtral" --out "$WORK/halves" --resume "$WORK/halves" "${R[@]}" \
    --train-iters 6 > /dev/null 2>&1 &&
  cmp -s "$WORK/straight/model.safetensors" "$WORK/halves/model.safetensors" &&
  [ "$(tail -n1 "$WORK/straight/metrics.jsonl" | cut -d, -f1-4)" = "$(tail -n1 "$WORK/halves/metrics.jsonl" | cut -d, -f1-4)" ]
check "mixtral: 3 steps + --resume + 3 steps = 6 steps, bitwise (weights and the last step's loss)" $?
timeout 120 "$BIN" train --model "$WORK/qwen2_moe" --out "$WORK/bf16" "${R[@]}" --train-iters 4 --bf16 \
  --recompute-granularity selective --recompute-modules mlp,layernorm > /dev/null 2> "$WORK/bf16.err" &&
  [ "$(grep -c '"moe_aux_loss"' "$WORK/bf16/metrics.jsonl")" = 4 ]
check "qwen2_moe: --bf16 with selective recomputation of the experts trains" $?
timeout 120 "$BIN" train --model "$WORK/gpt_oss" --out "$WORK/oss_bf16" "${R[@]}" --train-iters 4 --bf16 \
  --recompute-granularity selective --recompute-modules core_attn,mlp > /dev/null 2> "$WORK/oss_bf16.err" &&
  [ "$(grep -c '"moe_aux_loss"' "$WORK/oss_bf16/metrics.jsonl")" = 4 ]
check "gpt_oss: --bf16 (its sinks kept f32) with the attention and the experts recomputed trains" $?

# LoRA on a mixture's attention (q, k, v, o; the experts frozen): PEFT adapter files of q, k, v and
# o only, the held-out loss falls, and merge-lora gives a checkpoint whose held-out loss equals base
# + adapter's (the gradients against JAX: train_moe).
LO=(--model "$WORK/mixtral" --data "$WORK/text.txt" "${COMMON[@]}" --split 90,10 --eval-iters 4 --lora-rank 8
    --lora-alpha 16 --lora-targets q,k,v,o)
timeout 120 "$BIN" train "${LO[@]}" --out "$WORK/moe_lora" --train-iters 30 2> "$WORK/moe_lora.err"
check "mixtral: LoRA on q, k, v, o trains ($(grep -v '^I' "$WORK/moe_lora.err" | tail -1))" $?
python3 - "$WORK/moe_lora" <<'PY'
import json, struct, sys
d = sys.argv[1]
raw = open(d + "/adapter_model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
names = [k for k in json.loads(raw[8:8 + n]) if k != "__metadata__"]
cfg = json.load(open(d + "/adapter_config.json"))
ev = [json.loads(l)["eval_loss"] for l in open(d + "/metrics.jsonl") if "eval_loss" in l]
ok = len(names) == 2 * 4 * 2 and sorted(cfg["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"] and \
     not any("expert" in k or "mlp" in k for k in names) and ev[-1] < ev[0]
print("# %d adapter tensors, targets %s; held-out %.4f -> %.4f" % (len(names), cfg["target_modules"], ev[0], ev[-1]))
sys.exit(0 if ok else 1)
PY
check "mixtral LoRA: PEFT files of the attention only, the held-out loss falls" $?
"$BIN" merge-lora --model "$WORK/mixtral" --adapter "$WORK/moe_lora" --out "$WORK/moe_merged" 2> "$WORK/moe_merge.err" &&
  "$BIN" train --model "$WORK/moe_merged" --data "$WORK/text.txt" "${COMMON[@]}" --split 90,10 --eval-iters 4 \
    --train-iters 1 --lr 1e-30 --min-lr 0 --out "$WORK/moe_merged_eval" 2> /dev/null
a=$(grep eval_loss "$WORK/moe_lora/metrics.jsonl" | tail -n1 | sed 's/.*"eval_loss": \([0-9.]*\).*/\1/')
b=$(grep eval_loss "$WORK/moe_merged_eval/metrics.jsonl" 2> /dev/null | head -n1 | sed 's/.*"eval_loss": \([0-9.]*\).*/\1/')
awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d < 1e-4 && d > -1e-4) }'
check "mixtral merge-lora: the merged model's held-out loss equals base + adapter's ($a, $b)" $?

# ---- 2. refused by name -----------------------------------------------------------------------
expect "the auxiliary losses on a dense model are refused" 1 "is not a mixture of experts" \
  "$BIN" train --model "$WORK/dense" --data "$WORK/text.txt" --out "$WORK/d.out" "${COMMON[@]}" --train-iters 1 \
  --moe-aux-loss-coeff 0.01
expect "LoRA on the experts (every target, the default) is refused" 1 "LoRA on a mixture of experts' MLP" \
  "$BIN" train --model "$WORK/mixtral" --data "$WORK/text.txt" --out "$WORK/l.out" "${COMMON[@]}" --train-iters 1 \
  --lora-rank 4
expect "a negative coefficient is refused" 2 "--moe-z-loss-coeff must be a number >= 0" \
  "$BIN" train --model "$WORK/mixtral" --data "$WORK/text.txt" --out "$WORK/n.out" "${COMMON[@]}" --train-iters 1 \
  --moe-z-loss-coeff -1
expect "train --ep 2 on one rank names the data-parallel ranks it needs" 1 "--ep 2 does not divide the 1 data-parallel ranks" \
  "$BIN" train --model "$WORK/mixtral" --data "$WORK/text.txt" --out "$WORK/e.out" "${COMMON[@]}" --train-iters 1 --ep 2
expect "train --ep 0 is a usage error" 2 "--ep must be an integer in \[1, 64\]" "$BIN" train --model "$WORK/mixtral" --ep 0

echo "$n_pass passed, $n_fail failed"
[ "$n_fail" = 0 ]

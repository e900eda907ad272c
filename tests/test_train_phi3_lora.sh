#!/usr/bin/env bash
# tests/test_train_phi3_lora.sh SHARDLM GOLDEN_DIR - `shardlm train --lora-*` on Phi-3 as a user meets
# it (the gradients themselves: tests/test_train_grad.py phi3 against JAX; the adapter served:
# golden_phi3_lora):
#   1. a small random Phi3ForCausalLM (tests/reference/make_models.py, with stories260K's tok512
#      tokenizer) fine-tuned with LoRA for 8 steps on tinyshakespeare: the adapter is written in
#      PEFT's layout for Phi3ForCausalLM, target_modules qkv_proj, o_proj, gate_up_proj, down_proj
#      and their tensors' names and shapes (a fused B spans its parts' rows), the loss falls;
#   2. merge-lora of that adapter against NumPy: every merged fused weight equals W + s B A in
#      float64 (within f32 rounding), the others unchanged;
#   2b. 4 steps, --resume, 4 steps: the adapter of 8 straight steps bit for bit;
#   3. the same run under mpirun at tp 2: the same losses (1e-5) and adapter (1e-4, as
#      tests/test_train_parallel.sh's LoRA runs; AdamW eps 1e-3 as there: with the default 1e-8
#      its first steps turn gradients near zero into whole steps of +-lr, and even the one-rank
#      run moved by 7.8e-4 with --threads 2 instead of 1, measured);
#   4. refused by name: a fused group targeted in part (--lora-targets q,v), the fused adapter on
#      a Llama (separate q_proj ... in its layout).
# Loopback only; every wait is bounded.
set -u
BIN=$1
TOK=$2/stories260K/tokenizer.model
here=$(cd "$(dirname "$0")" && pwd)
ASSETS=${SHARDLM_ASSETS:-$here/../../shared/assets}
TEXT=$ASSETS/datasets/tinyshakespeare.txt
if [ ! -f "$TOK" ] || [ ! -f "$TEXT" ]; then
  echo "SKIP: train_phi3_lora: no stories260K tokenizer in $2 or no $TEXT (shared assets)"
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
COMMON=(--data "$WORK/text.txt" --seq-length 64 --micro-batch-size 2 --global-batch-size 4 --lr 2e-3 --adam-eps 1e-3 --seed 7
        --threads 1 --lora-rank 4 --lora-alpha 8 --train-iters 8)
head -c 100000 "$TEXT" > "$WORK/text.txt"

PYTHONPATH=$here/reference python3 - "$WORK" "$TOK" <<'EOF' || { echo "FAIL: making the checkpoint"; exit 1; }
import os, shutil, sys
import make_models as MM
work, tok = sys.argv[1], sys.argv[2]
cfg = MM.phi3_config("f32")
MM.write_checkpoint(os.path.join(work, "phi3"), cfg, MM.fuse_phi3(cfg, MM.init_llama(cfg, 5)), "f32", 1)
shutil.copy(tok, os.path.join(work, "phi3", "tokenizer.model"))
EOF

# ---- 1. LoRA training writes Phi-3's module names ---------------------------------------------
timeout 300 "$BIN" train --model "$WORK/phi3" --out "$WORK/lora" "${COMMON[@]}" > "$WORK/train.out" 2> "$WORK/train.err"
check "phi3: 8 LoRA steps exit 0" $?
PYTHONPATH=$here/reference python3 - "$WORK" <<'EOF'
import json, sys
import make_models as MM
d = sys.argv[1] + "/lora"
cfg = json.load(open(d + "/adapter_config.json"))
t = MM.read_safetensors(d + "/adapter_model.safetensors")
mc = MM.phi3_config("f32")
H, I, hd, nh, nkv = mc["hidden_size"], mc["intermediate_size"], mc["head_dim"], mc["num_attention_heads"], mc["num_key_value_heads"]
want = {}  # PEFT's shapes for Phi3ForCausalLM: lora_A (r, in), lora_B (out, r) of the fused modules
for l in range(mc["num_hidden_layers"]):
    for block, module, n_in, n_out in (("self_attn", "qkv_proj", H, (nh + 2 * nkv) * hd), ("self_attn", "o_proj", nh * hd, H),
                                       ("mlp", "gate_up_proj", H, 2 * I), ("mlp", "down_proj", I, H)):
        pre = "base_model.model.model.layers.%d.%s.%s." % (l, block, module)
        want[pre + "lora_A.weight"], want[pre + "lora_B.weight"] = (4, n_in), (n_out, 4)
got = {k: v.shape for k, v in t.items()}
ok = sorted(cfg["target_modules"]) == ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"] and got == want
loss = [json.loads(l)["loss"] for l in open(sys.argv[1] + "/lora/metrics.jsonl")]
print("# target_modules %s; %d tensors; loss %.4f -> %.4f" % (cfg["target_modules"], len(got), loss[0], loss[-1]))
if got != want:
    print("# differ:", sorted(set(got.items()) ^ set(want.items()))[:6])
sys.exit(0 if ok and loss[-1] < loss[0] else 1)
EOF
check "phi3: PEFT target_modules qkv_proj, o_proj, gate_up_proj, down_proj; names and shapes; the loss falls" $?

# ---- 2. merge-lora reads the fused adapter back ------------------------------------------------
timeout 120 "$BIN" merge-lora --model "$WORK/phi3" --adapter "$WORK/lora" --out "$WORK/merged" 2> "$WORK/merge.err"
check "phi3: merge-lora of the fused adapter exits 0" $?
PYTHONPATH=$here/reference python3 - "$WORK" <<'EOF'
import json, sys
import make_models as MM
w = sys.argv[1]
base, merged = MM.read_safetensors(w + "/phi3/model.safetensors"), MM.read_safetensors(w + "/merged/model.safetensors")
ad = MM.read_safetensors(w + "/lora/adapter_model.safetensors")
cfg = json.load(open(w + "/lora/adapter_config.json"))
s = cfg["lora_alpha"] / cfg["r"]
worst, n = 0.0, 0
for name, x in base.items():
    pre = "base_model.model." + name[: -len(".weight")] + "."
    ref = x + s * (ad[pre + "lora_B.weight"] @ ad[pre + "lora_A.weight"]) if pre + "lora_A.weight" in ad else x
    n += pre + "lora_A.weight" in ad
    worst = max(worst, abs(merged[name] - ref).max() / max(abs(ref).max(), 1e-30))
print("# %d adapted weights; worst rel |merged - (W + s B A)| %.2e" % (n, worst))
sys.exit(0 if set(merged) == set(base) and n == 8 and worst < 1e-6 else 1)
EOF
check "phi3: merged qkv_proj / gate_up_proj / o_proj / down_proj equal W + s B A (float64)" $?

# ---- 2b. resume from the fused adapter's checkpoint --------------------------------------------
timeout 300 "$BIN" train --model "$WORK/phi3" --out "$WORK/lora44" "${COMMON[@]}" --save-interval 4 2> /dev/null &&
  timeout 300 "$BIN" train --model "$WORK/phi3" --out "$WORK/lora_resumed" "${COMMON[@]}" \
    --resume "$WORK/lora44/checkpoints/iter_0000004" 2> /dev/null &&
  cmp -s "$WORK/lora/adapter_model.safetensors" "$WORK/lora_resumed/adapter_model.safetensors"
check "phi3: 4 steps + --resume + 4 steps give the adapter of 8 straight steps, bit for bit" $?

# ---- 3. tp 2 writes the same adapter -----------------------------------------------------------
if command -v mpirun > /dev/null; then
  timeout 300 mpirun -n 2 --oversubscribe "$BIN" train --model "$WORK/phi3" --out "$WORK/lora_tp2" --tp 2 "${COMMON[@]}" \
    > "$WORK/tp2.out" 2> "$WORK/tp2.err"
  check "phi3: 8 LoRA steps at tp 2 exit 0" $?
  out=$(python3 "$here/train_compare.py" losses "$WORK/lora/metrics.jsonl" "$WORK/lora_tp2/metrics.jsonl" --rtol 1e-5 &&
        python3 "$here/train_compare.py" adapter "$WORK/lora" "$WORK/lora_tp2" --rtol 1e-4)
  ok=$?
  check "phi3: tp 2 trains the one-rank adapter (fused B assembled from both ranks' rows): $(echo "$out" | tr '\n' ';')" $ok
else
  echo "# no mpirun: tp 2 left out"
fi

# ---- 4. refusals -------------------------------------------------------------------------------
timeout 120 "$BIN" train --model "$WORK/phi3" --out "$WORK/partial" "${COMMON[@]}" --lora-targets q,v \
  > "$WORK/out" 2> "$WORK/err"
rc=$?
[ "$rc" = 1 ] && grep -q "Phi3ForCausalLM fuses q, k and v into one qkv_proj: a LoRA adapter targets all of them or none" "$WORK/err"
ok=$?
check "phi3: --lora-targets q,v refused by name (rc $rc: $(tail -c 200 "$WORK/err"))" $ok
PYTHONPATH=$here/reference python3 -c "
import sys
import make_models as MM
cfg = MM.llama_config('f32')
MM.write_checkpoint(sys.argv[1], cfg, MM.init_llama(cfg, 5), 'f32', 1)" "$WORK/llama"
timeout 120 "$BIN" merge-lora --model "$WORK/llama" --adapter "$WORK/lora" --out "$WORK/llama_merged" > "$WORK/out" 2> "$WORK/err"
rc=$?
[ "$rc" = 1 ] && grep -q "target module qkv_proj is a fused projection (Phi-3's); LlamaForCausalLM has separate ones" "$WORK/err"
ok=$?
check "phi3: its fused adapter on a Llama refused by name (rc $rc: $(tail -c 200 "$WORK/err"))" $ok

echo "$n_pass passed, $n_fail failed"
[ "$n_fail" = 0 ]

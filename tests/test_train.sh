#!/usr/bin/env bash
# tests/test_train.sh SHARDLM GOLDEN_DIR - (assets from $SHARDLM_ASSETS) `shardlm train` as a user meets it:
#   1. stories260K (the golden fixture's conversion) continued on tinyshakespeare for 150 steps:
#      the held-out loss falls by at least 1.0 nat, metrics are written, and the result is
#      served by `shardlm serve` (a completion over gRPC) and by `shardlm generate`;
#   2. bitwise resume: 10 steps straight and 5 + --resume + 5 give identical weights and
#      identical losses for steps 6-10;
#   2b. bf16 and fp16 (dynamic loss scaler: skipped steps and the falling scale at the start);
#   2c. LoRA: PEFT files, the loss falls, merge-lora equals base + adapter, bitwise resume;
#       --lora-dropout (none in evaluation, the loss still falls), bf16 / fp16 bases against f32
#       (losses, the base's bytes, the fp16 loss scaler on the adapters' gradients);
#   3. chat JSONL (messages and ShareGPT) and prompt/completion data train;
#   4. bad data and bad flags: a message naming the file and line, exit 1 (errors) or 2
#      (usage), never a crash;
#   5. --out never overwrites the model (or another one without --overwrite-out),
#      --keep-checkpoints, --resume OUT of an interrupted run, SIGTERM on one rank and under
#      mpirun (a checkpoint, exit 143, resumed).
# Loopback only; every wait is bounded; the server is killed on every exit path.
set -u
BIN=$1
MODEL=$2/stories260K
here=$(cd "$(dirname "$0")" && pwd)
ASSETS=${SHARDLM_ASSETS:-$here/../../shared/assets}
TEXT=$ASSETS/datasets/tinyshakespeare.txt
if [ ! -f "$MODEL/model.safetensors" ] || [ ! -f "$TEXT" ]; then
  echo "SKIP: train: no converted stories260K in $2 or no $TEXT (shared assets)"
  exit 77
fi
WORK=$(mktemp -d)
SERVER_PID=
cleanup() { [ -n "$SERVER_PID" ] && kill -9 "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
n_pass=0
n_fail=0
check() { # check NAME STATUS
  if [ "$2" = 0 ]; then n_pass=$((n_pass + 1)); echo "PASS $1"; else n_fail=$((n_fail + 1)); echo "FAIL $1"; fi
}
expect() { # expect NAME WANT_RC NEEDLE CMD...: exit code and a message containing NEEDLE
  local name=$1 want=$2 needle=$3
  shift 3
  "$@" > "$WORK/out" 2> "$WORK/err"
  local rc=$?
  if [ "$rc" = "$want" ] && grep -q -- "$needle" "$WORK/err"; then check "$name" 0
  else check "$name (rc $rc, stderr: $(tail -c 300 "$WORK/err"))" 1; fi
}
COMMON=(--seq-length 128 --micro-batch-size 4 --global-batch-size 8 --lr 2e-3 --min-lr 2e-4
        --lr-warmup-iters 10 --seed 7 --threads 1)
export OMP_NUM_THREADS=1

# ---- 1. continued pretraining ---------------------------------------------------------------
"$BIN" train --model "$MODEL" --data "$TEXT" --out "$WORK/shake" "${COMMON[@]}" --train-iters 150 \
  --split 98,2 --eval-interval 50 --eval-iters 8 --log-interval 50 > "$WORK/train.out" 2> "$WORK/train.err"
check "train: 150 steps on tinyshakespeare exit 0" $?
first=$(grep -m1 eval_loss "$WORK/shake/metrics.jsonl" | sed 's/.*"eval_loss": \([0-9.]*\).*/\1/')
last=$(grep eval_loss "$WORK/shake/metrics.jsonl" | tail -n1 | sed 's/.*"eval_loss": \([0-9.]*\).*/\1/')
echo "# held-out loss: $first -> $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a != "" && b != "" && a - b >= 1.0) }'
check "train: the held-out loss falls by at least 1.0 ($first -> $last)" $?
[ "$(grep -c '"loss"' "$WORK/shake/metrics.jsonl")" = 150 ]
check "train: one metrics line per step" $?
grep -q "step 150/150" "$WORK/train.err"
check "train: progress lines name the step" $?

"$BIN" generate --model "$WORK/shake" --prompt "ROMEO:" --max-tokens 40 > "$WORK/gen" 2> /dev/null
[ "$(wc -c < "$WORK/gen")" -gt 40 ]
check "generate: the trained checkpoint loads and generates" $?
"$BIN" serve --model "$WORK/shake" --listen 127.0.0.1:0 > "$WORK/serve.out" 2> "$WORK/serve.err" &
SERVER_PID=$!
ADDR=
for _ in $(seq 300); do
  ADDR=$(sed -n 's/^shardlm: listening on \([^ ]*\).*/\1/p' "$WORK/serve.out" | head -n 1)
  grep -q '^shardlm: ready' "$WORK/serve.out" 2>/dev/null && [ -n "$ADDR" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.1
done
timeout 60 "$BIN" complete --server "$ADDR" --prompt "KING HENRY:" --max-tokens 20 > "$WORK/complete" 2> "$WORK/complete.err"
rc=$?
[ "$rc" = 0 ] && [ -s "$WORK/complete" ]
check "serve: the trained checkpoint answers a completion over gRPC (rc $rc)" $?
kill "$SERVER_PID" 2>/dev/null
wait "$SERVER_PID" 2>/dev/null
SERVER_PID=

# ---- 2. bitwise resume ------------------------------------------------------------------------
"$BIN" train --model "$MODEL" --data "$TEXT" --out "$WORK/straight" "${COMMON[@]}" --train-iters 10 \
  --save-interval 5 2> "$WORK/straight.err"
check "resume: 10 steps with a checkpoint at step 5" $?
[ -f "$WORK/straight/checkpoints/iter_0000005/train_state.safetensors" ]
check "resume: the step-5 checkpoint holds the training state" $?
"$BIN" train --resume "$WORK/straight/checkpoints/iter_0000005" --data "$TEXT" --out "$WORK/resumed" \
  "${COMMON[@]}" --train-iters 10 2> "$WORK/resumed.err"
check "resume: 5 more steps from the checkpoint" $?
cmp -s "$WORK/straight/model.safetensors" "$WORK/resumed/model.safetensors"
check "resume: weights after 5 + 5 steps equal 10 straight steps, bit for bit" $?
grep '"loss"' "$WORK/straight/metrics.jsonl" | sed -n '6,10p' | sed 's/, "tokens_per_s.*//' > "$WORK/l1"
grep '"loss"' "$WORK/resumed/metrics.jsonl" | sed 's/, "tokens_per_s.*//' > "$WORK/l2"
[ -s "$WORK/l1" ] && cmp -s "$WORK/l1" "$WORK/l2"
check "resume: the losses of steps 6-10 are identical" $?

# ---- 2b. mixed precision: bf16, and fp16 with the dynamic loss scaler --------------------------
MP=(--model "$MODEL" --data "$TEXT" "${COMMON[@]}" --train-iters 40 --split 98,2 --eval-iters 8)
"$BIN" train "${MP[@]}" --out "$WORK/mp_f32" 2> /dev/null
"$BIN" train "${MP[@]}" --out "$WORK/mp_bf16" --bf16 2> "$WORK/bf16.err"
check "bf16: 40 steps train" $?
"$BIN" train "${MP[@]}" --out "$WORK/mp_fp16" --fp16 2> "$WORK/fp16.err"
check "fp16: 40 steps train with the dynamic loss scaler" $?
python3 - "$WORK" <<'PYEOF'
import json, sys
w = sys.argv[1]
def read(name):
    rows = [json.loads(l) for l in open("%s/%s/metrics.jsonl" % (w, name))]  # must be valid JSON
    return [r for r in rows if "loss" in r], [r["eval_loss"] for r in rows if "eval_loss" in r]
f32, e32 = read("mp_f32")
b16, eb = read("mp_bf16")
h16, eh = read("mp_fp16")
ok = True
def say(cond, msg):
    global ok
    print(("PYPASS " if cond else "PYFAIL ") + msg)
    ok &= cond
say(abs(eb[-1] - e32[-1]) < 0.05, "bf16 held-out loss %.4f within 0.05 of f32's %.4f" % (eb[-1], e32[-1]))
skipped = [r["iter"] for r in h16 if r["skipped"]]
scales = [r["loss_scale"] for r in h16]
say(len(skipped) > 0 and skipped == list(range(1, len(skipped) + 1)),
    "fp16 at the initial scale 2^32 overflows: steps %s skipped, then none" % skipped)
say(scales[0] == 2.0 ** 32 and scales[-1] < 2.0 ** 32 and all(a >= b for a, b in zip(scales, scales[1:])),
    "fp16 scale halves on overflows (hysteresis 2): %g -> %g" % (scales[0], scales[-1]))
say(abs(eh[-1] - e32[-1]) < 0.3, "fp16 held-out loss %.4f near f32's %.4f (fewer updates: %d skipped)"
    % (eh[-1], e32[-1], len(skipped)))
sys.exit(0 if ok else 1)
PYEOF
check "mixed precision: losses, skipped steps and the scale (see PYPASS/PYFAIL above)" $?
grep -q "step 1 skipped: the fp16 gradients overflowed at loss scale" "$WORK/fp16.err"
check "fp16: a skipped step is logged with its scale" $?
expect "flags: --loss-scale needs --fp16" 2 "--loss-scale applies to --fp16 only" \
  "$BIN" train --model "$MODEL" --data "$TEXT" --out "$WORK/x" --loss-scale 128

# ---- 2c. LoRA: adapters in the PEFT layout, merge-lora, resume ----------------------------------
LO=(--model "$MODEL" --data "$TEXT" "${COMMON[@]}" --split 98,2 --eval-iters 8 --lora-rank 8 --lora-alpha 16)
"$BIN" train "${LO[@]}" --out "$WORK/lora" --train-iters 40 2> "$WORK/lora.err"
check "lora: 40 steps train the adapters" $?
grep -q "LoRA rank 8, alpha 16, dropout 0 on q k v o gate up down" "$WORK/lora.err"
check "lora: the log names rank, alpha and targets" $?
python3 - "$WORK/lora" <<'PYEOF'
import json, struct, sys
d = sys.argv[1]
cfg = json.load(open(d + "/adapter_config.json"))
raw = open(d + "/adapter_model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
names = [k for k in json.loads(raw[8:8 + n]) if k != "__metadata__"]
ok = (cfg["peft_type"] == "LORA" and cfg["r"] == 8 and cfg["lora_alpha"] == 16 and
      "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names and
      "base_model.model.model.layers.4.mlp.down_proj.lora_B.weight" in names and len(names) == 5 * 7 * 2)
ev = [json.loads(l)["eval_loss"] for l in open(d + "/metrics.jsonl") if "eval_loss" in l]
print("# adapter: %d tensors; held-out %.4f -> %.4f" % (len(names), ev[0], ev[-1]))
sys.exit(0 if ok and ev[-1] < ev[0] - 0.5 else 1)
PYEOF
check "lora: PEFT config and tensor names, and the held-out loss falls by 0.5" $?
"$BIN" merge-lora --model "$MODEL" --adapter "$WORK/lora" --out "$WORK/merged" 2> /dev/null
check "merge-lora writes a checkpoint" $?
"$BIN" train --model "$WORK/merged" --data "$TEXT" "${COMMON[@]}" --split 98,2 --eval-iters 8 --train-iters 1 \
  --lr 1e-30 --min-lr 0 --out "$WORK/merged_eval" 2> /dev/null
a=$(grep eval_loss "$WORK/lora/metrics.jsonl" | tail -n1 | sed 's/.*"eval_loss": \([0-9.]*\).*/\1/')
b=$(grep eval_loss "$WORK/merged_eval/metrics.jsonl" | head -n1 | sed 's/.*"eval_loss": \([0-9.]*\).*/\1/')
awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; exit !(a != "" && d < 1e-4 && d > -1e-4) }'
check "merge-lora: the merged model's held-out loss equals base + adapter's ($a, $b)" $?
"$BIN" generate --model "$WORK/merged" --prompt "ROMEO:" --max-tokens 20 > "$WORK/mgen" 2> /dev/null
check "merge-lora: the merged checkpoint generates" $?
"$BIN" train "${LO[@]}" --out "$WORK/lora10" --train-iters 10 --save-interval 5 2> /dev/null
"$BIN" train "${LO[@]}" --out "$WORK/lora55" --train-iters 10 --resume "$WORK/lora10/checkpoints/iter_0000005" 2> /dev/null
cmp -s "$WORK/lora10/adapter_model.safetensors" "$WORK/lora55/adapter_model.safetensors"
check "lora: 5 + resume + 5 steps give the adapter of 10 straight steps, bit for bit" $?
# Dropout (PEFT's lora_dropout) and frozen bases in bf16 / fp16, against the f32 run above.
"$BIN" train "${LO[@]}" --out "$WORK/lora_drop" --train-iters 40 --lora-dropout 0.1 2> "$WORK/lora_drop.err"
check "lora: 40 steps with --lora-dropout 0.1" $?
"$BIN" train "${LO[@]}" --out "$WORK/lora_bf16" --train-iters 40 --bf16 2> "$WORK/lora_bf16.err"
check "lora: 40 steps on a bf16 base" $?
"$BIN" train "${LO[@]}" --out "$WORK/lora_fp16" --train-iters 40 --fp16 2> "$WORK/lora_fp16.err"
check "lora: 40 steps on an fp16 base with the dynamic loss scaler" $?
"$BIN" train "${LO[@]}" --out "$WORK/lora_fp16c" --train-iters 40 --fp16 --loss-scale 1024 2> /dev/null
check "lora: 40 steps on an fp16 base with a constant loss scale" $?
python3 - "$WORK" <<'PYEOF'
import json, re, sys
w = sys.argv[1]
def read(name):
    rows = [json.loads(l) for l in open("%s/%s/metrics.jsonl" % (w, name))]
    return [r for r in rows if "loss" in r], [r["eval_loss"] for r in rows if "eval_loss" in r]
def weight_bytes(name):
    m = re.search(r"the base frozen in (\w+), (\d+) bytes of weights", open("%s/%s.err" % (w, name)).read())
    return m.group(1), int(m.group(2))
ok = True
def say(cond, msg):
    global ok
    print(("PYPASS " if cond else "PYFAIL ") + msg)
    ok &= cond
f32, e32 = read("lora")
drop, ed = read("lora_drop")
cfg = json.load(open(w + "/lora_drop/adapter_config.json"))
say(cfg["lora_dropout"] == 0.1 and json.load(open(w + "/lora/adapter_config.json"))["lora_dropout"] == 0,
    "lora_dropout 0.1 (and 0) written into adapter_config.json")
say(ed[0] == e32[0], "dropout: none in evaluation (held-out loss before training %.6f, as without: %.6f)" % (ed[0], e32[0]))
say(drop[1]["loss"] != f32[1]["loss"], "dropout: the training losses differ from no dropout's (step 2: %.6f vs %.6f)"
    % (drop[1]["loss"], f32[1]["loss"]))
say(ed[-1] < ed[0] - 0.5 and abs(ed[-1] - e32[-1]) < 0.1,
    "dropout 0.1: the held-out loss falls by 0.5 (%.4f -> %.4f), near no dropout's %.4f" % (ed[0], ed[-1], e32[-1]))
b16, eb = read("lora_bf16")
d20 = max(abs(a["loss"] - b["loss"]) for a, b in zip(f32[:20], b16[:20]))
say(d20 < 0.03, "bf16 base: the first 20 training losses within 0.03 of f32's (worst %.4f)" % d20)
say(abs(eb[-1] - e32[-1]) < 0.02, "bf16 base: held-out loss %.4f within 0.02 of f32's %.4f after 40 steps" % (eb[-1], e32[-1]))
(d32, n32), (db, nb) = weight_bytes("lora"), weight_bytes("lora_bf16")
say(d32 == "f32" and db == "bf16" and 2 * nb == n32, "bf16 base: the base held once, in bf16: %d bytes of weights, "
    "half of f32's %d (no master copy)" % (nb, n32))
h16, eh = read("lora_fp16")
skipped = [r["iter"] for r in h16 if r["skipped"]]
say(len(skipped) > 0 and skipped == list(range(1, len(skipped) + 1)) and eh[-1] < eh[0] - 0.3,
    "fp16 base: the adapters' gradients overflow at scale 2^32 (steps %s skipped), then train (%.4f -> %.4f)"
    % (skipped, eh[0], eh[-1]))
c16, _ = read("lora_fp16c")
gn = abs(c16[0]["grad_norm"] - f32[0]["grad_norm"]) / f32[0]["grad_norm"]
dl = max(abs(a["loss"] - b["loss"]) for a, b in zip(f32[:20], c16[:20]))
say(not any(r["skipped"] for r in c16) and gn < 0.05 and dl < 0.05, "fp16 base at loss scale 1024: the adapter "
    "gradients unscaled (step-1 norm %.5g vs f32's %.5g), 20 losses within 0.05 of f32's (worst %.4f)"
    % (c16[0]["grad_norm"], f32[0]["grad_norm"], dl))
sys.exit(0 if ok else 1)
PYEOF
check "lora: dropout, bf16 and fp16 bases against f32 (see PYPASS/PYFAIL above)" $?
expect "lora: --lora-dropout 1 refused" 2 "--lora-dropout must be in \[0, 1)" \
  "$BIN" train "${LO[@]}" --out "$WORK/x" --train-iters 1 --lora-dropout 1
expect "lora: an unknown target" 2 "LoRA target 'qq'" \
  "$BIN" train "${LO[@]}" --out "$WORK/x" --train-iters 1 --lora-targets q,qq
expect "merge-lora: a directory without an adapter" 1 "adapter_config.json" \
  "$BIN" merge-lora --model "$MODEL" --adapter "$MODEL" --out "$WORK/x"

# ---- 3. chat and prompt/completion data -------------------------------------------------------
cat > "$WORK/chat.jsonl" <<'EOF'
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who was Lily?"}, {"role": "assistant", "content": "A little girl who loved the park."}]}
{"conversations": [{"from": "human", "value": "Tell me a story."}, {"from": "gpt", "value": "Once upon a time, there was a cat."}]}

{"prompt": "Once upon a time", "completion": " there was a dog named Max."}
{"text": "The sun was bright and the birds sang."}
EOF
"$BIN" train --model "$MODEL" --data "$WORK/chat.jsonl" --out "$WORK/chat" --seq-length 64 --train-iters 3 \
  --threads 1 2> "$WORK/chat.err"
check "data: messages, conversations, prompt/completion and text lines train" $?
grep -q "4 examples" "$WORK/chat.err" && grep -q "1 blank" "$WORK/chat.err"
check "data: the log counts examples and blank lines" $?

# ---- 4. bad input -----------------------------------------------------------------------------
printf '{"text": "fine"}\n{"text": broken\n' > "$WORK/bad.jsonl"
expect "data: a malformed line names file and line" 1 "bad.jsonl:2: not a JSON object" \
  "$BIN" train --model "$MODEL" --data "$WORK/bad.jsonl" --out "$WORK/x" --train-iters 1
printf '{"messages": [{"role": "robot", "content": "hi"}]}\n' > "$WORK/role.jsonl"
expect "data: an unknown role is named" 1 'unknown role "robot"' \
  "$BIN" train --model "$MODEL" --data "$WORK/role.jsonl" --out "$WORK/x" --train-iters 1
: > "$WORK/empty.jsonl"
expect "data: an empty file" 1 "empty.jsonl: the file is empty" \
  "$BIN" train --model "$MODEL" --data "$WORK/empty.jsonl" --out "$WORK/x" --train-iters 1
printf '{"foo": 1}\n' > "$WORK/unknown.jsonl"
expect "data: a line of no known format" 1 "unknown.jsonl:1: no known format" \
  "$BIN" train --model "$MODEL" --data "$WORK/unknown.jsonl" --out "$WORK/x" --train-iters 1
expect "data: too long under --data-overflow error" 1 "more than --seq-length 8" \
  "$BIN" train --model "$MODEL" --data "$WORK/chat.jsonl" --out "$WORK/x" --train-iters 1 --seq-length 8 \
  --data-overflow error
expect "data: a missing file" 1 "nope.jsonl" \
  "$BIN" train --model "$MODEL" --data "$WORK/nope.jsonl" --out "$WORK/x" --train-iters 1
expect "flags: global batch not a multiple of the micro batch" 1 "multiple of --micro-batch-size" \
  "$BIN" train --model "$MODEL" --data "$TEXT" --out "$WORK/x" --train-iters 1 --micro-batch-size 3 \
  --global-batch-size 4
expect "flags: --bf16 and --fp16 together" 2 "give --bf16 or --fp16, not both" \
  "$BIN" train --model "$MODEL" --data "$TEXT" --out "$WORK/x" --bf16 --fp16
expect "flags: an unknown option" 2 "unknown option '--bogus'" \
  "$BIN" train --model "$MODEL" --data "$TEXT" --out "$WORK/x" --bogus 1
expect "flags: --out is required" 2 "--out DIR is required" \
  "$BIN" train --model "$MODEL" --data "$TEXT"
expect "resume: a directory without a training state" 1 "train_state.safetensors" \
  "$BIN" train --resume "$MODEL" --data "$TEXT" --out "$WORK/x" --train-iters 1
printf '{"text": "fine"}\n{"text": "a\\u0000b"}\n' > "$WORK/nul.jsonl"
expect "data: a NUL in a text is refused with file and line" 1 "nul.jsonl:2: a string holds" \
  "$BIN" train --model "$MODEL" --data "$WORK/nul.jsonl" --out "$WORK/x" --train-iters 1
printf '{"prompt": "", "completion": "x"}\n' > "$WORK/emptyp.jsonl"
expect "data: an empty prompt is refused with file and line" 1 'emptyp.jsonl:1: an empty "prompt"' \
  "$BIN" train --model "$MODEL" --data "$WORK/emptyp.jsonl" --out "$WORK/x" --train-iters 1

# ---- 4b. memory: tokens held compactly, files streamed, long texts tokenized as far as needed ----
# A 4.5 MB .txt corpus (tinyshakespeare x 4) trains with a bounded growth of the peak RSS over
# the same command on a 4 KB corpus (the process alone: with the CUDA backend compiled in, its
# libraries take ~150 MiB of RSS that have nothing to do with the data): 8 bytes a byte of text
# + 32 MiB. Before: ~150 bytes a byte (670 MiB).
peak_kib() { # the peak RSS (KiB) of one command
  python3 - "$@" <<'PYEOF'
import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)  # KiB, the largest child
PYEOF
}
for _ in 1 2 3 4; do cat "$TEXT"; done > "$WORK/big.txt"
head -c 4096 "$TEXT" > "$WORK/small.txt"
base=$(peak_kib "$BIN" train --model "$MODEL" --data "$WORK/small.txt" --out "$WORK/small" --seq-length 64 \
  --train-iters 1 --threads 1)
peak=$(peak_kib "$BIN" train --model "$MODEL" --data "$WORK/big.txt" --out "$WORK/big" --seq-length 64 --train-iters 1 \
  --threads 1)
bytes=$(wc -c < "$WORK/big.txt")
[ -n "$peak" ] && [ -n "$base" ] && [ "$((peak - base))" -le $((bytes * 8 / 1024 + 32768)) ]
check "memory: a $bytes-byte corpus trains in ${peak:-?} KiB peak RSS, ${base:-?} KiB for 4 KB (growth bound $((bytes * 8 / 1024 + 32768)))" $?
# One 2.2 MB JSONL line under --seq-length 64: a bounded prefix tokenized (the log's count).
python3 -c 'import json, sys; print(json.dumps({"text": open(sys.argv[1]).read() * 2}))' "$TEXT" > "$WORK/long.jsonl"
"$BIN" train --model "$MODEL" --data "$WORK/long.jsonl" --out "$WORK/long" --seq-length 64 --train-iters 1 \
  --threads 1 2> "$WORK/long.err"
tokenized=$(sed -n 's/.* \([0-9]*\) ids tokenized.*/\1/p' "$WORK/long.err")
[ -n "$tokenized" ] && [ "$tokenized" -le 2000 ] && grep -q "1 examples, 64 tokens" "$WORK/long.err"
check "memory: a 2.2 MB line under --seq-length 64 tokenizes ${tokenized:-?} ids (at most 2000)" $?

# ---- 5. the --out directory, checkpoints kept, signals, resuming an interrupted run (issue 35) ---
# --out never overwrites the model being trained (a copy here: before the guard this replaced its
# weights), nor any other model unless --overwrite-out; identity by inode, not by string.
cp -r "$MODEL" "$WORK/base"
sum_before=$(sha256sum < "$WORK/base/model.safetensors")
expect "out: --out equal to --model is refused" 1 "is the model being trained" \
  "$BIN" train --model "$WORK/base" --data "$WORK/chat.jsonl" --out "$WORK/base" --seq-length 64 --train-iters 2 --threads 1
ln -s "$WORK/base" "$WORK/base_link"
expect "out: --out a symlink to --model is refused" 1 "is the model being trained" \
  "$BIN" train --model "$WORK/base" --data "$WORK/chat.jsonl" --out "$WORK/base_link/" --seq-length 64 --train-iters 2 \
  --threads 1 --overwrite-out
expect "out: --out inside the model's directory is refused" 1 "lies inside the model's directory" \
  "$BIN" train --model "$WORK/base" --data "$WORK/chat.jsonl" --out "$WORK/base/run" --seq-length 64 --train-iters 2 \
  --threads 1
[ "$(sha256sum < "$WORK/base/model.safetensors")" = "$sum_before" ]
check "out: the model's weights are untouched" $?
cp -r "$MODEL" "$WORK/other"
expect "out: --out holding another model is refused" 1 "already holds a model or a run" \
  "$BIN" train --model "$WORK/base" --data "$WORK/chat.jsonl" --out "$WORK/other" --seq-length 64 --train-iters 2 --threads 1
"$BIN" train --model "$WORK/base" --data "$WORK/chat.jsonl" --out "$WORK/other" --seq-length 64 --train-iters 2 \
  --threads 1 --overwrite-out 2> /dev/null
check "out: --overwrite-out replaces it" $?
# --keep-checkpoints: the latest N of the interval checkpoints.
"$BIN" train --model "$MODEL" --data "$WORK/chat.jsonl" --out "$WORK/keep" --seq-length 64 --train-iters 6 \
  --save-interval 1 --keep-checkpoints 2 --threads 1 2> /dev/null
[ "$(ls "$WORK/keep/checkpoints" 2> /dev/null | tr '\n' ' ')" = "iter_0000004 iter_0000005 " ]
check "checkpoints: --keep-checkpoints 2 keeps iter 4 and 5 of 5 ($(ls "$WORK/keep/checkpoints" 2> /dev/null | tr '\n' ' '))" $?
# --resume OUT of an interrupted run (killed between its step-5 checkpoint and the end): the
# latest complete checkpoint under OUT, and the weights of 10 straight steps, bit for bit.
mkdir "$WORK/interrupted"
cp -r "$WORK/straight/checkpoints" "$WORK/interrupted/"
mkdir "$WORK/interrupted/checkpoints/iter_0000009.tmp" # a save cut short: never chosen
grep '"loss"' "$WORK/straight/metrics.jsonl" | head -n 5 > "$WORK/interrupted/metrics.jsonl"
"$BIN" train --resume "$WORK/interrupted" --data "$TEXT" --out "$WORK/interrupted" "${COMMON[@]}" --train-iters 10 \
  2> "$WORK/interrupted.err"
check "resume: --resume OUT of an interrupted run continues in OUT" $?
grep -q "resuming from $WORK/interrupted/checkpoints/iter_0000005 (iteration 5)" "$WORK/interrupted.err" &&
  cmp -s "$WORK/straight/model.safetensors" "$WORK/interrupted/model.safetensors"
check "resume: from its latest complete checkpoint (iter 5), weights equal 10 straight steps" $?
# SIGTERM: the step in progress ends, a checkpoint is written, exit 128 + 15; --resume OUT goes on.
wait_steps() { # wait_steps METRICS N PID: until METRICS has N lines (bounded: 30 s) or PID ended
  for _ in $(seq 300); do
    [ -f "$1" ] && [ "$(grep -c '"loss"' "$1")" -ge "$2" ] && return 0
    kill -0 "$3" 2> /dev/null || return 1
    sleep 0.1
  done
  return 1
}
"$BIN" train --model "$MODEL" --data "$TEXT" --out "$WORK/sig" "${COMMON[@]}" --train-iters 1000000 \
  --log-interval 1000 2> "$WORK/sig.err" &
pid=$!
wait_steps "$WORK/sig/metrics.jsonl" 3 "$pid"
kill -TERM "$pid"
wait "$pid"
rc=$?
n=$(grep -c '"loss"' "$WORK/sig/metrics.jsonl")
it=$(printf 'iter_%07d' "$n")
[ "$rc" = 143 ] && grep -q "stopped by a signal after iteration $n of 1000000; checkpoint $WORK/sig/checkpoints/$it" \
  "$WORK/sig.err" && [ -f "$WORK/sig/checkpoints/$it/train_state.safetensors" ]
check "signal: SIGTERM ends the run after step $n with its checkpoint, exit 143 (rc $rc)" $?
"$BIN" train --resume "$WORK/sig" --data "$TEXT" --out "$WORK/sig" "${COMMON[@]}" --train-iters $((n + 2)) \
  2> "$WORK/sig2.err"
rc=$?
[ "$rc" = 0 ] && grep -q "resuming from $WORK/sig/checkpoints/$it (iteration $n)" "$WORK/sig2.err" &&
  [ "$(grep -c '"loss"' "$WORK/sig/metrics.jsonl")" = $((n + 2)) ]
check "signal: --resume OUT continues from that checkpoint (rc $rc)" $?
# Under mpirun: a signal to one rank (rank 1, not the leader) stops every rank after the same step.
# Open MPI aborts the job when a rank exits non-zero (143 here): the rank that exits second could be
# killed before it says so, whichever rank that is (a race: the CI run of 2026-12-01 night saw one
# of the two lines), so that abort is turned off and every rank ends by itself.
if command -v mpirun > /dev/null; then
  [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  mpirun --oversubscribe --mca orte_abort_on_non_zero_status 0 -n 2 "$BIN" train --model "$MODEL" --data "$TEXT" --out "$WORK/sigmpi" \
    --seq-length 64 --global-batch-size 2 --threads 1 --train-iters 1000000 --log-interval 1000 > "$WORK/sigmpi.log" 2>&1 &
  mpi=$!
  wait_steps "$WORK/sigmpi/metrics.jsonl" 3 "$mpi"
  r1=
  for c in $(ps -o pid= --ppid "$mpi"); do
    tr '\0' '\n' < "/proc/$c/environ" 2> /dev/null | grep -q '^OMPI_COMM_WORLD_RANK=1$' && r1=$c
  done
  [ -n "$r1" ] && kill -TERM "$r1"
  # (the guard's output to /dev/null: its sleep, left behind when the guard is killed, would hold
  # ctest's pipe open, and the test with it, for the rest of the 60 s)
  ( sleep 60; kill -9 "$mpi" 2> /dev/null ) > /dev/null 2>&1 &
  guard=$!
  wait "$mpi"
  kill "$guard" 2> /dev/null
  n=$(grep -c '"loss"' "$WORK/sigmpi/metrics.jsonl")
  [ -n "$r1" ] && [ "$(grep -c "stopped by a signal after iteration $n of" "$WORK/sigmpi.log")" = 2 ] &&
    [ -f "$WORK/sigmpi/checkpoints/$(printf 'iter_%07d' "$n")/train_state.safetensors" ]
  ok=$?
  check "signal: SIGTERM to rank 1 of 2 stops both ranks after step $n, checkpoint written" $ok
  if [ $ok != 0 ]; then # (failed once under load, 2026-11-29: what the ranks said, for next time)
    echo "# rank 1 pid '${r1}'; checkpoints: $(ls "$WORK/sigmpi/checkpoints" 2> /dev/null | tr '\n' ' ')"
    tail -n 20 "$WORK/sigmpi.log" | sed 's/^/# /'
  fi
else
  echo "SKIP: signal under mpirun: no mpirun"
fi

"$BIN" train --help > "$WORK/help" 2>&1
grep -q -- "--global-batch-size" "$WORK/help"
check "train --help documents the flags" $?

echo "$n_pass passed, $n_fail failed"
[ "$n_fail" = 0 ]

#!/usr/bin/env bash
# tools/gpu_paths.sh SHARDLM MODEL_DIR DATA_TXT WORK_DIR [DEVICE] - the paths of `shardlm` that
# no gpu-labelled test covers, run once on DEVICE (default cuda) by tools/gpu_check.sh:
#   speculative decoding (ngram, a draft model, an EAGLE head trained on DEVICE): greedy text the
#   same as without speculation; LoRA and EAGLE-head training on DEVICE: the first step's loss
#   against the CPU's; the HTTP front on DEVICE: /v1/completions greedy, sampled and streamed, and
#   sampled rows drawn from the device's top 64 logits equal to a server's that downloads the rows.
# One line per check, PASS or FAIL (with what was seen); exit status 1 when any check failed.
# DEVICE=cpu runs the same checks on the build machine (the script's own test).
set -u
S=$1 M=$2 DATA=$3 W=$4 DEV=${5:-cuda}
rm -rf "$W" && mkdir -p "$W"
fails=0
check() { # check OK MESSAGE
  if [ "$1" = 0 ]; then echo "PASS: $2"; else echo "FAIL: $2"; fails=$((fails + 1)); fi
}
gen() { # gen OUT ARGS...: greedy text of 96 tokens on DEVICE; stderr beside it
  local o=$1
  shift
  timeout 60 "$S" generate --model "$M" --device "$DEV" --prompt "Once upon a time" --max-tokens 96 \
    "$@" > "$W/$o.txt" 2> "$W/$o.err"
}
first_loss() { # the first "loss" of a metrics.jsonl
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "loss" in r: print("%.9f" % r["loss"]); break' "$1" 2> /dev/null
}

gen plain
check $? "generate on $DEV: $(head -c 120 "$W/plain.txt" | tr '\n' ' ')"
gen ngram --speculative ngram
cmp -s "$W/plain.txt" "$W/ngram.txt"
check $? "speculative ngram on $DEV: the same greedy text ($(grep -o '[0-9]* drafts verified, [0-9]* accepted' "$W/ngram.err"))"
gen draft --speculative draft --draft-model "$M" --spec-draft 4
cmp -s "$W/plain.txt" "$W/draft.txt"
check $? "speculative draft (the model as its own draft) on $DEV: the same greedy text ($(grep -o '[0-9]* drafts verified, [0-9]* accepted' "$W/draft.err"))"

# Training: a few steps of LoRA and of an EAGLE head, on DEVICE and on the CPU from the same seed.
train() { # train NAME DEVICE ARGS...
  local n=$1 d=$2
  shift 2
  timeout 120 "$S" train --model "$M" --data "$DATA" --out "$W/$n" --device "$d" --seq-length 128 \
    --micro-batch-size 2 --train-iters 6 --log-interval 1 --seed 7 "$@" > "$W/$n.log" 2>&1
}
for kind in lora eagle; do
  args=(--lora-rank 4 --lr 1e-3)
  [ $kind = eagle ] && args=(--eagle-head --lr 1e-3)
  train "$kind-$DEV" "$DEV" "${args[@]}"
  rc=$?
  train "$kind-cpu-ref" cpu --threads 4 "${args[@]}"
  a=$(first_loss "$W/$kind-$DEV/metrics.jsonl")
  b=$(first_loss "$W/$kind-cpu-ref/metrics.jsonl")
  ok=1
  [ "$rc" = 0 ] && [ -n "$a" ] && [ -n "$b" ] &&
    python3 -c "import sys; sys.exit(abs($a - $b) > 0.02 * max(1.0, abs($b)))" && ok=0
  check $ok "train $kind on $DEV: rc $rc, first loss ${a:-none} against the CPU's ${b:-none}$( [ "$rc" = 0 ] || tail -3 "$W/$kind-$DEV.log" | tr '\n' ' ')"
done
head=$W/eagle-$DEV/eagle_head.safetensors
if [ -f "$head" ]; then
  gen eagle --speculative eagle --draft-model "$head" --spec-draft 2
  cmp -s "$W/plain.txt" "$W/eagle.txt"
  check $? "speculative eagle (the head trained on $DEV) on $DEV: the same greedy text ($(grep -o '[0-9]* drafts verified, [0-9]* accepted' "$W/eagle.err"))"
fi

# The HTTP front on DEVICE; beside it a server that downloads every sampled row
# (SHARDLM_DEVICE_SAMPLING=0), whose seeded sampled answers must equal the first's, which draws
# them from each row's top 64 logits (and the row's mass) on the device (=1, the default on CUDA).
port=$((18000 + RANDOM % 2000))
SHARDLM_DEVICE_SAMPLING=1 SHARDLM_LOG=info "$S" serve --model "$M" --device "$DEV" --listen "127.0.0.1:$((port + 2000))" \
  --http "127.0.0.1:$port" > "$W/serve.log" 2>&1 &
pid=$!
SHARDLM_DEVICE_SAMPLING=0 "$S" serve --model "$M" --device "$DEV" --listen "127.0.0.1:$((port + 2001))" \
  --http "127.0.0.1:$((port + 1))" > "$W/serve-rows.log" 2>&1 &
pid_rows=$!
python3 - "$port" "$W/serve.log" << 'EOF'
import json, sys, time, urllib.request
port = int(sys.argv[1])
base = "http://127.0.0.1:%d" % port
def post(body, at=base):
    req = urllib.request.Request(at + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60).read().decode()
rows = "http://127.0.0.1:%d" % (port + 1)
for at in (base, rows):
    for _ in range(300):  # up (503 while the model loads): one token answered
        try:
            post({"prompt": "Once", "max_tokens": 1}, at)
            break
        except Exception:
            time.sleep(0.2)
fails = 0
def check(ok, msg):
    global fails
    print(("PASS: " if ok else "FAIL: ") + msg)
    fails += not ok
try:
    g1 = json.loads(post({"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}))
    g2 = json.loads(post({"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}))
    t = g1["choices"][0]["text"]
    check(t and t == g2["choices"][0]["text"], "HTTP /v1/completions greedy, twice the same: %r" % t[:80])
    s = [json.loads(post({"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0.9, "top_p": 0.9,
                          "top_k": 40, "seed": 11, "logprobs": 2}))["choices"][0] for _ in range(2)]
    check(s[0]["text"] == s[1]["text"] and s[0]["logprobs"] is not None,
          "HTTP sampled (temperature 0.9, top_p, top_k, seed, logprobs 2), the seed repeats: %r" % s[0]["text"][:80])
    raw = post({"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "stream": True})
    parts = [json.loads(l[6:]) for l in raw.splitlines() if l.startswith("data: {")]
    st = "".join(p["choices"][0]["text"] for p in parts if p.get("choices"))
    check(st == t and "data: [DONE]" in raw, "HTTP streamed greedy = unstreamed (%d events)" % len(parts))
    same = total = 0
    for kw in ({"top_k": 40, "top_p": 0.95, "min_p": 0.05, "temperature": 0.8}, {"top_p": 0.9, "temperature": 0.8},
               {"min_p": 0.1, "temperature": 0.9}, {"top_p": 0.999, "temperature": 1.5}, {"temperature": 1.0},
               {"temperature": 1.7}, {"temperature": 0.9, "presence_penalty": 0.6, "frequency_penalty": 0.4},
               {"temperature": 0, "repetition_penalty": 1.4}, {"temperature": 1.5, "top_p": 0.999,
                                                                "logit_bias": {"5": 8.0, "261": -100}},
               {"temperature": 0.9, "top_p": 0.95, "n": 2},
               {"temperature": 0.9, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
                   "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                   "required": ["name", "age"]}}}},
               {"temperature": 0, "response_format": {"type": "json_object"}},
               {"temperature": 0.9, "top_k": 40, "logprobs": 3}, {"temperature": 0, "logprobs": 5},
               {"temperature": 1.2, "logprobs": 0}):
        for seed in range(4):
            body = dict(kw, prompt="Once upon a time", max_tokens=48, seed=seed)
            a, b = (" | ".join(ch["text"] + json.dumps(ch.get("logprobs")) for ch in json.loads(post(body, at))["choices"])
                    for at in (base, rows))
            same, total = same + (a == b), total + 1
    log = open(sys.argv[2]).read()
    drew = ("drew from the device's top" in log and "a plain temperature row was drawn on the device" in log and
            "banned ids or penalties were applied on the device" in log and
            "a constraint's mask was applied on the device" in log and
            "log-probabilities from the device's top" in log)
    exact = "its weights are the host's bits" in log
    check(same == total and drew, "HTTP sampled from the top 64 logits or drawn on the device = every row downloaded: "
          "%d of %d equal (top_k 40, top_p alone, min_p alone, a wide nucleus, plain temperature 1 and 1.7, penalties, "
          "greedy with a repetition penalty, a logit bias, n 2, a JSON schema, a JSON object, log-probabilities sampled, "
          "greedy and drawn: texts and log-probabilities); the log says rows drew from them, were drawn, edited and "
          "masked there, and took their log-probabilities there: %s; the device's weights are the host's bits: %s"
          % (same, total, drew, exact))
except Exception as e:
    check(False, "HTTP front: %r" % e)
sys.exit(1 if fails else 0)
EOF
rc=$?
kill -TERM $pid $pid_rows 2> /dev/null
wait $pid $pid_rows 2> /dev/null
[ $rc = 0 ] || { fails=$((fails + 1)); tail -5 "$W/serve.log"; }
# Every command's output, for the record (GPU_PATHS_LOG: a file under gpu_check.sh's $OUT).
[ -n "${GPU_PATHS_LOG:-}" ] && for f in "$W"/*.log "$W"/*.err; do echo "==== $f"; tail -c 6000 "$f"; done > "$GPU_PATHS_LOG"
echo "gpu_paths: $fails failed"
[ $fails = 0 ]

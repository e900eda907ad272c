#!/usr/bin/env bash
# tests/test_cli.sh SHARDLM DATA_DIR - the shardlm command as a user meets it: generate on the
# converted stories260K (the golden fixture's), reshard round trip, and every user mistake gets
# a clear message and the right exit code (2 for usage, 1 for errors), never a crash.
set -u
shardlm=$1
data=$2
model=$data/stories260K
if [ ! -f "$model/model.safetensors" ]; then
  echo "SKIP: no converted stories260K in $data (no shared assets)"
  exit 77
fi
. "$(dirname "$0")/check.sh"
expect() { # expect NAME WANT_RC NEEDLE CMD...: exit code and a message containing NEEDLE
  local name=$1 want=$2 needle=$3
  shift 3
  "$@" > "$tmp/out" 2> "$tmp/err"
  local rc=$?
  if [ "$rc" = "$want" ] && grep -q -- "$needle" "$tmp/err"; then check "$name" 0
  else check "$name (rc $rc, stderr: $(head -c 300 "$tmp/err"))" 1; fi
}

"$shardlm" generate --model "$model" --max-tokens 30 > "$tmp/a" 2> "$tmp/a.err"
grep -q "^Once upon a time, there was a little girl named Lily" "$tmp/a"; check "generate prints the story" $?
grep -q "decode .* tok/s" "$tmp/a.err"; check "generate reports prefill and decode speed" $?
"$shardlm" generate --model "$model" --prompt "Once upon a time" --max-tokens 10 > "$tmp/b" 2>/dev/null
grep -q "^Once upon a time, there was a little girl" "$tmp/b"; check "a prompt is continued with correct spacing" $?

"$shardlm" reshard --model "$model" --out "$tmp/mega" --tp 2 --pp 1 2> /dev/null
check "reshard writes the Megatron layout" $?
[ -f "$tmp/mega/shardlm_megatron.json" ] && [ -f "$tmp/mega/mp_rank_01_000/model.safetensors" ]
check "reshard: metadata and rank folders" $?
"$shardlm" generate --model "$tmp/mega" --max-tokens 30 > "$tmp/c" 2>/dev/null
cmp -s "$tmp/a" "$tmp/c"; check "the resharded checkpoint generates the same text at tp 1" $?

# Round trip through two Megatron splits and back: every tensor of the original, bit for bit.
"$shardlm" reshard --model "$model" --out "$tmp/t2p2" --tp 2 --pp 2 2> /dev/null &&
  "$shardlm" reshard --model "$tmp/t2p2" --out "$tmp/t4p1" --tp 4 --pp 1 2> /dev/null &&
  "$shardlm" reshard --model "$tmp/t4p1" --out "$tmp/back" --format hf 2> /dev/null
check "reshard HF -> tp2 pp2 -> tp4 pp1 -> HF" $?
same_tensors() { # A.safetensors B.safetensors: the same names, dtypes, shapes and bytes
  "${PYTHON:-python3}" - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
bad = [k for k in a if k not in b or a[k] != b[k]] + [k for k in b if k not in a]
print("round trip: %d tensors, %d differ %s" % (len(a), len(bad), bad[:3]))
sys.exit(1 if bad or not a else 0)
PY
}
same_tensors "$model/model.safetensors" "$tmp/back/model.safetensors"
check "the round trip reproduces every tensor bit for bit" $?
# GPT-2 (fused, transposed Conv1D c_attn / c_proj / c_fc, learned positions, biases) the same way.
"$shardlm" reshard --model "$data/gpt2" --out "$tmp/g2p2" --tp 2 --pp 2 2> /dev/null &&
  "$shardlm" reshard --model "$tmp/g2p2" --out "$tmp/gback" --format hf 2> /dev/null &&
  same_tensors "$data/gpt2/model.safetensors" "$tmp/gback/model.safetensors"
check "GPT-2: HF -> tp2 pp2 -> HF reproduces every tensor bit for bit" $?

expect "unknown command" 2 "unknown command" "$shardlm" frobnicate
expect "generate without --model" 2 "--model" "$shardlm" generate
expect "bad --max-tokens" 2 "max-tokens" "$shardlm" generate --model "$model" --max-tokens -3
expect "non-numeric --temperature" 2 "temperature" "$shardlm" generate --model "$model" --temperature warm
expect "negative temperature" 1 "temperature" "$shardlm" generate --model "$model" --temperature -1
expect "top-p out of range" 1 "top_p" "$shardlm" generate --model "$model" --top-p 2
expect "unknown device" 1 "unknown device" "$shardlm" generate --model "$model" --device tpu
expect "missing model directory" 1 "NOT_FOUND" "$shardlm" generate --model "$tmp/nope"
expect "context exceeded" 1 "context" "$shardlm" generate --model "$model" --max-tokens 100000
expect "tp without mpirun" 1 "mpirun" "$shardlm" generate --model "$model" --tp 2
mkdir -p "$tmp/bad"
cp "$model/config.json" "$model/tokenizer.model" "$tmp/bad/"
head -c 1000 "$model/model.safetensors" > "$tmp/bad/model.safetensors"
expect "truncated weights" 1 "BAD_FORMAT" "$shardlm" generate --model "$tmp/bad"
echo '{"architectures": ["MambaForCausalLM"]}' > "$tmp/bad/config.json"
expect "unknown architecture" 1 "UNSUPPORTED" "$shardlm" generate --model "$tmp/bad"
expect "convert: missing checkpoint" 1 "NOT_FOUND" "$shardlm" convert llama2c --checkpoint "$tmp/none.bin" --tokenizer "$model/tokenizer.model" --out "$tmp/x"
head -c 100 "$model/tokenizer.model" > "$tmp/short.bin"
expect "convert: not a llama2.c file" 1 "BAD_FORMAT" "$shardlm" convert llama2c --checkpoint "$tmp/short.bin" --tokenizer "$model/tokenizer.model" --out "$tmp/x"
expect "reshard: tp that does not divide the heads" 1 "UNSUPPORTED" "$shardlm" reshard --model "$model" --out "$tmp/m3" --tp 3

# Weights that are not finite are refused at load, naming the weight; finite weights that overflow
# in the forward pass end generation with an error instead of sampling from NaN logits.
set_weight() { # set_weight DIR TENSOR VALUE [ALL]: overwrites element 5 (or every element) of TENSOR
  "${PYTHON:-python3}" - "$@" <<'PY'
import json, struct, sys
d, name, value = sys.argv[1], sys.argv[2], float(sys.argv[3])
path = d + "/model.safetensors"
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
t = h[name]
assert t["dtype"] == "F32", t
lo, hi = t["data_offsets"]
for i in (range((hi - lo) // 4) if len(sys.argv) > 4 else [5]):
    struct.pack_into("<f", b, 8 + n + lo + 4 * i, value)
open(path, "wb").write(b)
PY
}
mkdir -p "$tmp/nan"
cp "$model"/* "$tmp/nan/"
set_weight "$tmp/nan" model.layers.1.mlp.up_proj.weight nan
expect "a NaN weight is refused at load, named" 1 "weight up of layer 1 holds a NaN" "$shardlm" generate --model "$tmp/nan"
expect "train refuses it too" 1 "holds a NaN" "$shardlm" train --model "$tmp/nan" --data "$model/config.json" --out "$tmp/nan-out" --train-iters 1
cp "$model/model.safetensors" "$tmp/nan/"
set_weight "$tmp/nan" model.norm.weight 3e38 all
expect "overflowing logits end generation with an error" 1 "NaN or Inf logits" "$shardlm" generate --model "$tmp/nan" --max-tokens 5

# Bad files (issue 18): absurd or missing config fields, a random-bytes tokenizer, a bit-flipped
# safetensors header: each a clear error naming the file, exit 1, no crash, no huge allocation.
bad_config() { # bad_config NAME NEEDLE PYTHON-EXPR-ON-c
  mkdir -p "$tmp/badcfg"
  cp "$model"/* "$tmp/badcfg/"
  "${PYTHON:-python3}" -c "import json, sys; p = sys.argv[1]; c = json.load(open(p)); $3; json.dump(c, open(p, 'w'))" \
    "$tmp/badcfg/config.json"
  expect "bad config: $1" 1 "$2" timeout 60 "$shardlm" generate --model "$tmp/badcfg" --max-tokens 2
}
bad_config "10^9 layers" "n_layers = 1000000000 must be in" "c['num_hidden_layers'] = 10**9"
bad_config "negative hidden size" "d_model = -64 must be in" "c['hidden_size'] = -64"
bad_config "zero heads" "'num_attention_heads' = 0 must be > 0" "c['num_attention_heads'] = 0"
bad_config "vocabulary past 32 bits" "'vocab_size' = 4e+09 is not a 32-bit integer" "c['vocab_size'] = 4 * 10**9"
bad_config "missing hidden_size" "missing field 'hidden_size'" "del c['hidden_size']"
cp "$model"/* "$tmp/badcfg/"
head -c 3000 /dev/urandom > "$tmp/badcfg/tokenizer.model"
expect "random bytes as tokenizer.model" 1 "tokenizer.model: not a SentencePiece model" "$shardlm" generate --model "$tmp/badcfg"
cp "$model"/* "$tmp/badcfg/"
"${PYTHON:-python3}" -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[20] ^= 0x40; open(p, 'wb').write(b)" \
  "$tmp/badcfg/model.safetensors"
expect "a bit flipped in the safetensors header" 1 "BAD_FORMAT: .*badcfg/model.safetensors: " "$shardlm" generate --model "$tmp/badcfg"

# A tokenizer with more pieces than the model has rows: refused at load by generate, serve and train.
assets=${SHARDLM_ASSETS:-$(dirname "$0")/../../shared/assets}
if [ -f "$assets/llama2-tokenizer/tokenizer.model" ]; then
  mkdir -p "$tmp/bigtok"
  cp "$model"/* "$tmp/bigtok/"
  cp "$assets/llama2-tokenizer/tokenizer.model" "$tmp/bigtok/tokenizer.model"
  for cmd in generate serve train; do
    extra=()
    [ "$cmd" = serve ] && extra=(--listen 127.0.0.1:0)
    [ "$cmd" = train ] && extra=(--data "$model/config.json" --out "$tmp/bigtok-out" --train-iters 1)
    expect "$cmd: a tokenizer larger than the vocabulary" 1 "the tokenizer has 32000 pieces, the model only 512" \
      timeout 60 "$shardlm" "$cmd" --model "$tmp/bigtok" "${extra[@]}"
  done
else
  echo "SKIP tokenizer larger than the vocabulary: no $assets/llama2-tokenizer"
fi

check_summary

#!/usr/bin/env bash
# tests/test_moe_ep.sh SHARDLM GOLDEN_DIR - expert parallelism (--ep, engine/model/moe_ep.c) as a
# user meets it in `shardlm generate` under mpirun:
#   1. random Mixtral (8 experts, top 2) and Qwen 2 MoE (4 experts, top 2, shared expert)
#      checkpoints (tests/reference/make_models.py, stories260K's tok512 tokenizer): greedy
#      generation of 40 tokens at ep 2, ep 2 x pp 2 and ep 2 x tp 2 prints exactly what one rank
#      prints (ep x tp: attention tensor-parallel inside the ep group; to rounding), and
#      every rank logs its all-to-all bytes equal to what the routing says it sent;
#   2. refused by name: an --ep that does not divide the experts (both numbers named), --ep on a
#      dense model, an --ep x --tp that does not divide them, a world of the wrong size; (train --ep:
#      tests/test_train_moe_cli.sh).
# The logits against the float64 forwards at ep 2 and ep 2 x pp 2: golden_*_ep2 (test_model --ep).
# DEVICE=cuda generates on CUDA (generate_moe_ep_cuda_emu: on the CUDA emulator).
set -u
BIN=$1
TOK=$2/stories260K/tokenizer.model
here=$(cd "$(dirname "$0")" && pwd)
[ -f "$TOK" ] || { echo "SKIP: moe_ep: no stories260K tokenizer in $2"; exit 77; }
command -v mpirun > /dev/null || { echo "SKIP: moe_ep: no mpirun"; exit 77; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
n_pass=0
n_fail=0
check() { # check NAME STATUS
  if [ "$2" = 0 ]; then n_pass=$((n_pass + 1)); echo "PASS $1"; else n_fail=$((n_fail + 1)); echo "FAIL $1"; fi
}
export OMP_NUM_THREADS=1
MPI=(mpirun --oversubscribe -x OMP_NUM_THREADS)

PYTHONPATH=$here/reference python3 - "$WORK" "$TOK" <<'EOF' || { echo "FAIL: making the checkpoints"; exit 1; }
import os, shutil, sys
import make_models as MM
work, tok = sys.argv[1], sys.argv[2]
for flavor in ("mixtral", "qwen2_moe"):
    cfg = MM.moe_config(flavor, "f32")
    MM.write_checkpoint(os.path.join(work, flavor), cfg, MM.init_llama(cfg, 5), "f32", 1)
    shutil.copy(tok, os.path.join(work, flavor, "tokenizer.model"))
cfg = MM.llama_config("f32")
MM.write_checkpoint(os.path.join(work, "dense"), cfg, MM.init_llama(cfg, 5), "f32", 1)
shutil.copy(tok, os.path.join(work, "dense", "tokenizer.model"))
EOF

# ---- 1. the one-rank tokens ---------------------------------------------------------------------
GEN=(generate --prompt "Once upon a time there was a little dog" --max-tokens 40 --ignore-eos --threads 1)
# DEVICE=cuda: every rank on CUDA (SHARDLM_SHARE_GPU=1 puts them on one; the cuda_emu test runs this
# on the CUDA emulator with its NCCL, kernels/cuda_emu/README.md: the all-to-all over NCCL).
[ "${DEVICE:-cpu}" = cuda ] && GEN+=(--device cuda)
for flavor in mixtral qwen2_moe; do
  timeout 60 "$BIN" "${GEN[@]}" --model "$WORK/$flavor" > "$WORK/one" 2> /dev/null
  check "$flavor: one rank generates" $?
  for cfg in "2:--ep 2" "4:--ep 2 --pp 2" "4:--ep 2 --tp 2"; do
    n=${cfg%%:*}
    args=${cfg#*:}
    # shellcheck disable=SC2086
    timeout 120 "${MPI[@]}" -n "$n" "$BIN" "${GEN[@]}" --model "$WORK/$flavor" $args > "$WORK/many" 2> "$WORK/err"
    rc=$?
    if [ "${DEVICE:-cpu}" = cuda ] && [[ $args == *--tp* ]]; then
      # bf16 on CUDA: the tp all-reduce of partial sums rounds otherwise than one rank's product,
      # and these random models' greedy text parts after a few tokens (plain --tp 2 as well): ran.
      [ "$rc" = 0 ] && [ -s "$WORK/many" ]
      check "$flavor: mpirun -n $n generate $args on cuda generates (rc $rc; bf16 tp rounding: not compared)" $?
    else
      [ "$rc" = 0 ] && [ -s "$WORK/one" ] && cmp -s "$WORK/one" "$WORK/many"
      check "$flavor: mpirun -n $n generate $args prints what one rank prints (rc $rc)" $?
    fi
    # Every rank's all-to-all bytes (the communicator's count) equal the routing's rows x d x 4.
    python3 - "$WORK/err" "$n" <<'EOF'
import re, sys
lines = [l for l in open(sys.argv[1]) if "moe_ep: ep rank" in l]
ok = len(lines) == int(sys.argv[2])
for l in lines:
    m = re.search(r"sent (\d+) bytes .* = (\d+) expected\); its (\d+) token-layers had ([0-9.]+) of", l)
    ok &= bool(m) and m.group(1) == m.group(2) and int(m.group(3)) > 0 and 0 <= float(m.group(4)) <= 2
print("#", lines[0].strip() if lines else "no moe_ep line")
sys.exit(0 if ok else 1)
EOF
    check "$flavor: $args: every rank logs all-to-all bytes equal to the routing's" $?
  done
done

# ---- 2. refused by name -------------------------------------------------------------------------
expect() { # expect NAME NEEDLE CMD...: a non-zero exit and a message containing NEEDLE
  local name=$1 needle=$2
  shift 2
  timeout 60 "$@" > "$WORK/out" 2> "$WORK/err"
  local rc=$?
  if [ "$rc" != 0 ] && grep -q -- "$needle" "$WORK/err"; then check "$name" 0
  else check "$name (rc $rc, stderr: $(tail -c 300 "$WORK/err"))" 1; fi
}
expect "--ep 3 on 8 experts is refused naming both" "--ep 3 does not divide the 8 experts of MixtralForCausalLM" \
  "${MPI[@]}" -n 3 "$BIN" "${GEN[@]}" --model "$WORK/mixtral" --ep 3
expect "--ep on a dense model is refused" "--ep 2: LlamaForCausalLM is a dense model (0 experts)" \
  "${MPI[@]}" -n 2 "$BIN" "${GEN[@]}" --model "$WORK/dense" --ep 2
expect "--ep 3 x --tp 2 on 8 experts is refused naming both" "--ep 3 x --tp 2 (6 ranks) does not divide the 8 experts" \
  "${MPI[@]}" -n 6 "$BIN" "${GEN[@]}" --model "$WORK/mixtral" --ep 3 --tp 2
expect "generate --ep 2 --tp 2 on 2 ranks is refused" "2 ranks for --ep 2 x --tp 2 x --pp 1: launch with mpirun -n 4" \
  "${MPI[@]}" -n 2 "$BIN" "${GEN[@]}" --model "$WORK/mixtral" --ep 2 --tp 2
expect "serve --ep 2 --tp 2 on 2 ranks is refused" "2 ranks but --dp 1 x --ep 2 x --tp 2 x --pp 1 = 4" \
  "${MPI[@]}" -n 2 "$BIN" serve --model "$WORK/mixtral" --ep 2 --tp 2
expect "--ep 0 is refused" "--ep must be an integer in \[1, 64\]" "$BIN" "${GEN[@]}" --model "$WORK/mixtral" --ep 0

echo "$n_pass passed, $n_fail failed"
[ "$n_fail" = 0 ]

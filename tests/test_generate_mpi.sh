#!/usr/bin/env bash
# tests/test_generate_mpi.sh SHARDLM DATA_DIR - `shardlm generate` under mpirun prints exactly
# what one rank prints: tp 2, pp 2 (balanced), pp 2 with an uneven --pp-layers 1,4 split;
# a --pp-layers that does not sum to the layers is a clear error on every rank.
# DEVICE=cuda: all of it on GPUs (one per rank, or all on one with SHARDLM_SHARE_GPU=1).
set -u
shardlm=$1
model=$2/stories260K
dev=(--device "${DEVICE:-cpu}")
[ -f "$model/model.safetensors" ] || { echo "SKIP: no converted stories260K in $2"; exit 77; }
if [ "${DEVICE:-cpu}" = cuda ] && [ "${SHARDLM_CUDA_EMU:-0}" != 1 ] && ! nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
  echo "SKIP: no GPU"; exit 77 # (SHARDLM_CUDA_EMU=1: the CUDA emulator stands in, kernels/cuda_emu/README.md)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
check() { if [ "$2" = 0 ]; then pass=$((pass + 1)); echo "PASS $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi; }
"$shardlm" generate --model "$model" "${dev[@]}" --prompt "Once upon a time" --max-tokens 60 > "$tmp/one" 2> /dev/null
for args in "--tp 2" "--pp 2" "--pp 2 --pp-layers 1,4"; do
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 mpirun -n 2 -x OMP_NUM_THREADS "$shardlm" generate --model "$model" "${dev[@]}" \
    --prompt "Once upon a time" --max-tokens 60 $args > "$tmp/many" 2> "$tmp/err"
  cmp -s "$tmp/one" "$tmp/many"; check "mpirun -n 2 generate $args prints what one rank prints" $?
done
OMP_NUM_THREADS=1 mpirun -n 2 -x OMP_NUM_THREADS "$shardlm" generate --model "$model" "${dev[@]}" --pp 2 \
  --pp-layers 2,4 > /dev/null 2> "$tmp/err"
rc=$?
[ "$rc" != 0 ] && grep -q "pp-layers '2,4': needs 2 stages summing to the model's 5 layers" "$tmp/err"
check "a --pp-layers that does not fit the model is refused (rc $rc)" $?
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]

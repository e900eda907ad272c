#!/usr/bin/env bash
# tools/gpu_check.sh tests|bench|all - run on the lent GPU machine, in the repository root, with
# .gpu/bundle.tar.xz made by tools/gpu_bundle.sh on the build machine (carried there). Writes
# its logs and figures under $OUT (default ./gpu-out), at most 8 files:
#   paths.log     the output of every command of tools/gpu_paths.sh
#   summary.txt   the machine, the bundle's commit, one line per step with its result
#   tests.log     ctest -L gpu (every gpu-labelled test; fixtures made on the build machine) and
#                 tools/gpu_paths.sh (speculative decoding, LoRA/EAGLE training, HTTP on CUDA)
#   sanitizer.log compute-sanitizer memcheck / racecheck on the op tests
#   bench.log     bench_cuda (copy bandwidth, decode attention, matmul), bench_engine on CUDA
#                 (stories260K, and a random Llama-3.2-1B-shape model) and transformers on the
#                 same model (tools/bench_hf_gpu.py), bench_train in bf16 on it (MFU)
#   ncu.csv       Nsight Compute's time of each kernel of about two decode steps at batch 1
#   ncu_train.csv the same for a bf16 training step, attention on tensor cores (tools/ncu_summary.py
#                 groups both in bench.log)
# GPU_CHECK_CTEST_REGEX limits the tests to those names (ctest -R); GPU_CHECK_SKIP (a bash
# regex) skips the steps whose names match it.
# Each step has its own time limit (GPU_CHECK_BUDGET_S, default 540 s in all, spread over the
# steps); a step past its limit is killed and reported, and the others still run.
# docs/cuda.md: how to run it with the device tool, what ran and what did not.
set -u
mode=${1:-all}
repo=$(pwd)
OUT=${OUT:-$repo/gpu-out}
mkdir -p "$OUT"
summary=$OUT/summary.txt
rm -f "$OUT"/*.log "$OUT"/*.txt
: > "$summary"
start=$(date +%s)
budget=${GPU_CHECK_BUDGET_S:-540}
say() { echo "$*" | tee -a "$summary"; }
left() { echo $((budget - ($(date +%s) - start))); }
# step NAME LIMIT_S LOG CMD...: runs CMD with at most LIMIT_S (and what is left of the budget),
# its output appended to LOG; one summary line.
step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local l
  l=$(left)
  [ "$limit" -gt "$l" ] && limit=$l
  if [ "$limit" -lt 10 ]; then say "SKIP $name: the budget is spent"; return 0; fi
  if [ -n "${GPU_CHECK_SKIP:-}" ] && [[ $name =~ $GPU_CHECK_SKIP ]]; then say "SKIP $name: GPU_CHECK_SKIP"; return 0; fi
  echo "==== $name (limit ${limit}s): $*" >> "$log"
  local t0 rc
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  local verdict=ok
  [ "$rc" = 0 ] || verdict="FAILED rc=$rc"
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && verdict="TIMED OUT after ${limit}s"
  say "$name: $verdict ($(($(date +%s) - t0)) s)"
  return 0
}

[ -f .gpu/bundle.tar.xz ] || { say "no .gpu/bundle.tar.xz: run tools/gpu_bundle.sh and carry .gpu"; exit 1; }
G=/tmp/shardlm-gpu
rm -rf "$G" && mkdir -p "$G" && tar -C "$G" -xJf .gpu/bundle.tar.xz
B=$G/b
# shellcheck disable=SC1091
. "$B/manifest" 2> /dev/null || true
say "gpu_check $mode: bundle of commit ${commit:-?} (CUDA ${cuda:-?}, made ${made:-?}), repo $repo"
say "$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2> /dev/null || echo 'nvidia-smi: none')"
say "$(nproc) CPU cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -r)"

# CUDA's libraries from the GPU machine itself (its toolkit, or the Python wheels PyTorch uses).
cuda_dirs=$(find /usr/local /opt /usr/lib -xdev \( -name 'libcublasLt.so.13' -o -name 'libcudart.so.13' \
  -o -name 'libnccl.so.2' -o -name 'libcublas.so.13' \) 2> /dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH=$B/lib:${cuda_dirs}${LD_LIBRARY_PATH:-}
export PATH=$B/mpi/usr/bin:$PATH
export OPAL_PREFIX=$B/mpi/usr
export PMIX_INSTALL_PREFIX=$B/mpi/usr/lib/x86_64-linux-gnu/pmix2
export PMIX_MCA_pcompress_base_silence_warning=1
export PMIX_MCA_mca_base_component_path=$PMIX_INSTALL_PREFIX/lib/pmix
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
export SHARDLM_ASSETS=$B/assets
# The lazily loaded CUDA backend and NCCL (kernels/backend_lib.c): not beside the binaries here.
export SHARDLM_CUDA_LIB=$B/lib/libshardlm_cuda.so
[ -f "$B/lib/libshardlm_nccl.so" ] && export SHARDLM_NCCL_LIB=$B/lib/libshardlm_nccl.so
py=$(command -v python3)
missing=$(ldd "$B/build/cli/shardlm" | grep 'not found' | tr -s ' \t' ' ')
[ -z "$missing" ] || say "shardlm: missing libraries:$missing"
say "CUDA libraries from: ${cuda_dirs:-none found}"

# The build tree's ctest files name the build machine's paths: rewrite them to these.
rewrite=()
[ -n "${build_dir:-}" ] && rewrite+=(-e "s#${build_dir}#$B/build#g")
[ -n "${source_dir:-}" ] && rewrite+=(-e "s#${source_dir}#$repo#g")
[ -n "${python:-}" ] && rewrite+=(-e "s#${python}#$py#g")
[ -n "${mpiexec:-}" ] && rewrite+=(-e "s#${mpiexec}#$B/mpi/usr/bin/mpirun#g")
[ ${#rewrite[@]} -gt 0 ] && find "$B/build" -name CTestTestfile.cmake -exec sed -i "${rewrite[@]}" {} +

run_tests() {
  local log=$OUT/tests.log
  step "mpirun works" 30 "$log" mpirun -n 2 hostname
  # Fixtures (golden, GGUF) were made on the build machine: their setup tests are not rerun.
  (cd "$B/build" && step "ctest -L gpu" "${GPU_CHECK_CTEST_S:-300}" "$log" \
    ctest -L gpu -FS 'golden|gguf' ${GPU_CHECK_CTEST_REGEX:+-R "$GPU_CHECK_CTEST_REGEX"} -j "${GPU_CHECK_JOBS:-4}" \
    --output-on-failure --timeout 240)
  grep -E '^ *[0-9]+/[0-9]+ Test|tests passed|tests failed|Failed|\*\*\*' "$log" | tail -40 >> "$summary"
  # Training attention on CUDA cores (the tensor-core form is the default: ctest above, the
  # training tests included).
  step "test_attention_train, CUDA-core kernels" 90 "$log" env SHARDLM_CUDA_TRAIN_ATTENTION=simple \
    "$B/build/tests/test_attention_train" --backend cuda
  step "test_attention_train, tensor cores forced (head_dim 96)" 60 "$log" env SHARDLM_CUDA_TRAIN_ATTENTION=tc \
    "$B/build/tests/test_attention_train" --backend cuda --filter head_dim=96
  # The gemv kernel with each count of warps per output feature.
  local sp
  for sp in 1 2 8; do
    step "test_ops matmul, gemv split $sp" 30 "$log" env SHARDLM_CUDA_GEMV_SPLIT=$sp \
      "$B/build/tests/test_ops" --backend cuda --filter matmul
  done
  # The paths no gpu test covers: speculative decoding, LoRA and EAGLE-head training, HTTP on CUDA.
  step "gpu_paths (speculative, LoRA/EAGLE training, HTTP) on cuda" 150 "$log" env GPU_PATHS_LOG="$OUT/paths.log" bash tools/gpu_paths.sh \
    "$B/build/cli/shardlm" "$B/build/golden/stories260K" "$B/assets/datasets/tinyshakespeare.txt" /tmp/gpu-paths cuda
  grep -E '^(PASS|FAIL): ' "$log" >> "$summary"
  local slog=$OUT/sanitizer.log
  export SHARDLM_SYNC_CHECK=1
  step "memcheck test_ops (attention)" 90 "$slog" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$B/build/tests/test_ops" --backend cuda --filter attention
  # decode steps from CUDA graphs (SHARDLM_SYNC_CHECK would keep them off: a synchronize after every
  # op cannot be captured)
  step "memcheck test_model step-graph (graphs)" 90 "$slog" env -u SHARDLM_SYNC_CHECK compute-sanitizer --tool memcheck \
    --error-exitcode 9 "$B/build/tests/test_model" step-graph --device cuda "$B/build/golden/stories260K" "$B/build/golden/gemma2"
  step "memcheck test_model gpt2" 60 "$slog" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$B/build/tests/test_model" cuda "$B/build/golden" gpt2
  step "memcheck test_model gpt_oss" 60 "$slog" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$B/build/tests/test_model" cuda "$B/build/golden" gpt_oss
  step "memcheck test_model phi3_lora" 60 "$slog" compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$B/build/tests/test_model" cuda "$B/build/golden" phi3_lora
  local f # the decode-step kernels of 2026-12-04 (gemv, vector rmsnorm and argmax, rope over heads);
  # logit_mass, logit_draw, logit_edit, logit_mask and logit_lse (sampled rows' top candidates, plain
  # temperature draws and top_p nuclei past the candidates, penalties and logit bias, constraints,
  # log-probabilities; written after it)
  for f in "matmul bf16" "matmul f16" rmsnorm argmax rope logit_mass logit_draw logit_edit logit_mask logit_lse; do
    step "memcheck test_ops ($f)" 60 "$slog" compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$B/build/tests/test_ops" --backend cuda --filter "$f"
  done
  step "memcheck test_attention_train tc (packed, long)" 90 "$slog" env SHARDLM_CUDA_TRAIN_ATTENTION=tc \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$B/build/tests/test_attention_train" --backend cuda --filter bf16
  step "racecheck test_attention_train tc (packed gqa4)" 90 "$slog" env SHARDLM_CUDA_TRAIN_ATTENTION=tc \
    compute-sanitizer --tool racecheck --error-exitcode 9 "$B/build/tests/test_attention_train" --backend cuda \
    --filter "bf16 packed gqa4"
  step "racecheck test_ops (rmsnorm)" 60 "$slog" compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$B/build/tests/test_ops" --backend cuda --filter rmsnorm
  step "racecheck test_ops (logit_mass)" 60 "$slog" compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$B/build/tests/test_ops" --backend cuda --filter logit_mass
  step "racecheck test_ops (logit_draw)" 60 "$slog" compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$B/build/tests/test_ops" --backend cuda --filter logit_draw
  step "racecheck test_ops (logit_lse)" 60 "$slog" compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$B/build/tests/test_ops" --backend cuda --filter logit_lse
  step "racecheck test_ops (attention)" 90 "$slog" compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$B/build/tests/test_ops" --backend cuda --filter attention
  unset SHARDLM_SYNC_CHECK
  # The split-K decode kernel under other split policies than the default (bench's sweep).
  step "test_ops attention, split waves 16, chunk 64" 60 "$log" env SHARDLM_CUDA_SPLIT_WAVES=16 \
    SHARDLM_CUDA_SPLIT_MIN_CHUNK=64 "$B/build/tests/test_ops" --backend cuda --filter attention
  grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$slog" >> "$summary"
}

run_bench() {
  local log=$OUT/bench.log
  step "bench_cuda" 90 "$log" "$B/build/tests/bench_cuda"
  local pol
  for pol in "8 128" "8 64" "16 64" "32 64"; do # the split-K policy: waves per SM, smallest chunk
    set -- $pol
    echo "split policy: waves $1, min chunk $2" >> "$log"
    step "bench_cuda split waves $1 chunk $2" 30 "$log" env SHARDLM_CUDA_SPLIT_WAVES="$1" \
      SHARDLM_CUDA_SPLIT_MIN_CHUNK="$2" "$B/build/tests/bench_cuda" --filter "decode split"
  done
  echo "the gemv kernel with one warp per output feature (SHARDLM_CUDA_GEMV_SPLIT=1):" >> "$log"
  step "bench_cuda gemv split 1" 30 "$log" env SHARDLM_CUDA_GEMV_SPLIT=1 "$B/build/tests/bench_cuda" --filter gemv
  local bw # the device-to-device copy's bytes read + written per second: the memory's throughput
  bw=$(sed -n 's/^copy d2d.* \([0-9.]*\) GB\/s read+written.*/\1/p' "$log" | head -1)
  step "bench_engine stories260K cuda" 60 "$log" "$B/build/tests/bench_engine" --device cuda \
    --model "$B/build/golden/stories260K" --concurrency 1,16,64 --tokens 64
  local m=/tmp/llama1b
  step "make_random_model llama3.2-1b" 120 "$log" "$py" tools/make_random_model.py --preset llama3.2-1b --out "$m"
  if [ -f "$m/config.json" ]; then
    step "bench_engine llama1b cuda" 150 "$log" "$B/build/tests/bench_engine" --device cuda --model "$m" \
      --concurrency 1,16,64 --prompt 32 --tokens 64 ${bw:+--bandwidth-gbs "$bw"}
    echo "decode steps op by op, without graphs (SHARDLM_GRAPHS=0):" >> "$log"
    step "bench_engine llama1b cuda, no graphs" 60 "$log" env SHARDLM_GRAPHS=0 \
      "$B/build/tests/bench_engine" --device cuda --model "$m" --concurrency 1,16,64 --prompt 32 --tokens 64
    echo "decode products through cuBLAS, not the gemv kernel (SHARDLM_CUDA_GEMV_ROWS=0):" >> "$log"
    step "bench_engine llama1b cuda, cuBLAS gemv" 60 "$log" env SHARDLM_CUDA_GEMV_ROWS=0 \
      "$B/build/tests/bench_engine" --device cuda --model "$m" --concurrency 1,16 --prompt 32 --tokens 64
    echo "without greedy sampling on the device (SHARDLM_DEVICE_SAMPLING=0):" >> "$log"
    step "bench_engine llama1b cuda, host sampling" 60 "$log" env SHARDLM_DEVICE_SAMPLING=0 \
      "$B/build/tests/bench_engine" --device cuda --model "$m" --concurrency 1,64 --prompt 32 --tokens 64
    echo "sampled requests (temperature 0.8, top_p 0.95: each row's top 64 logits and its mass downloaded, and its nucleus drawn on the device where they cannot decide; the row where that draw lands within the tolerance of an edge):" >> "$log"
    step "bench_engine llama1b cuda, sampled" 60 "$log" "$B/build/tests/bench_engine" --device cuda --model "$m" \
      --concurrency 1,64 --prompt 32 --tokens 64 --temperature 0.8 --top-p 0.95
    echo "the same with every row downloaded (SHARDLM_DEVICE_SAMPLING=0):" >> "$log"
    step "bench_engine llama1b cuda, sampled, rows downloaded" 60 "$log" env SHARDLM_DEVICE_SAMPLING=0 \
      "$B/build/tests/bench_engine" --device cuda --model "$m" --concurrency 1,64 --prompt 32 --tokens 64 \
      --temperature 0.8 --top-p 0.95
    echo "plain temperature requests (temperature 1: each row drawn on the device, op_logit_draw; the row where the draw lands within the tolerance of its token's edge):" >> "$log"
    step "bench_engine llama1b cuda, plain temperature" 60 "$log" "$B/build/tests/bench_engine" --device cuda --model "$m" \
      --concurrency 1,64 --prompt 32 --tokens 64 --temperature 1.0 --top-p 1.0
    echo "the same with every row downloaded (SHARDLM_DEVICE_SAMPLING=0):" >> "$log"
    step "bench_engine llama1b cuda, plain temperature, rows downloaded" 60 "$log" env SHARDLM_DEVICE_SAMPLING=0 \
      "$B/build/tests/bench_engine" --device cuda --model "$m" --concurrency 1,64 --prompt 32 --tokens 64 \
      --temperature 1.0 --top-p 1.0
    echo "sampled requests with top_k 40 (temperature 0.8, top_p 0.95: each row's top 64 logits downloaded):" >> "$log"
    step "bench_engine llama1b cuda, sampled top_k 40" 60 "$log" "$B/build/tests/bench_engine" --device cuda --model "$m" \
      --concurrency 1,64 --prompt 32 --tokens 64 --temperature 0.8 --top-p 0.95 --top-k 40
    # One decode step's kernels at batch 1, each timed by Nsight Compute (the step's GPU time
    # against its wall time: launch-bound or not): ncu.csv, one row per kernel.
    local ncu
    ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2> /dev/null | head -1)
    if [ -n "$ncu" ]; then
      step "ncu decode kernels llama1b batch 1" 120 "$log" "$ncu" --metrics gpu__time_duration.sum \
        --launch-skip "${GPU_CHECK_NCU_SKIP:-6000}" --launch-count 800 --csv --log-file "$OUT/ncu.csv" \
        "$B/build/tests/bench_engine" --device cuda --model "$m" --concurrency 1 --prompt 32 --tokens 64
    else
      say "SKIP ncu: not on this machine"
    fi
    # Training in bf16 on the same shape (forward + backward): MFU against the datasheet's peak and
    # the bf16 product measured in the same run.
    local mode
    for mode in simple tc; do # training attention on CUDA cores, then on tensor cores
      echo "training attention: SHARDLM_CUDA_TRAIN_ATTENTION=$mode" >> "$log"
      step "bench_train llama1b cuda bf16, attention $mode" 120 "$log" env SHARDLM_CUDA_TRAIN_ATTENTION=$mode \
        "$B/build/tests/bench_train" --device cuda --bf16 --model "$m" --seq 1024 --micro "${GPU_CHECK_TRAIN_MICRO:-4}" --steps 3
    done
    if [ -n "$ncu" ]; then
      [ -f "$OUT/ncu.csv" ] && "$py" tools/ncu_summary.py "$OUT/ncu.csv" --step-marker argmax_kernel >> "$log" 2>&1
      # The kernels of one bf16 training step (the warm-up step alone: --steps 0), grouped by name.
      step "ncu training kernels llama1b bf16" 150 "$log" env SHARDLM_CUDA_TRAIN_ATTENTION=tc "$ncu" --metrics gpu__time_duration.sum \
        --launch-count "${GPU_CHECK_NCU_TRAIN_COUNT:-4000}" --csv --log-file "$OUT/ncu_train.csv" \
        "$B/build/tests/bench_train" --device cuda --bf16 --model "$m" --seq 1024 --micro 1 --steps 0
      [ -f "$OUT/ncu_train.csv" ] && "$py" tools/ncu_summary.py "$OUT/ncu_train.csv" >> "$log" 2>&1
    fi
    step "transformers llama1b" "${GPU_CHECK_HF_S:-200}" "$log" env PYTHONUNBUFFERED=1 "$py" tools/bench_hf_gpu.py --model "$m"
  fi
  grep -E '^(bench_cuda|copy|attention|matmul|RESULT|weight-read|model |split policy|training attention|the gemv|[0-9]+ kernels)|^  (step|MFU|the backend)' "$log" | head -120 >> "$summary"
}

case $mode in
  tests) run_tests ;;
  bench) run_bench ;;
  all) run_tests; run_bench ;;
  *) say "usage: tools/gpu_check.sh tests|bench|all"; exit 2 ;;
esac
# What the first-use checks of code that had not run on a GPU said (step graphs verified against
# op by op; prefill on the tensor cores against the simple kernel), from every log of this run.
say "first-use checks (count, message):"
grep -h -o -E "step graphs: [0-9]+ captured \([^)]*\)|graph \([0-9]+ sequences\) gave logits [^:]*|cannot run from a graph \([^)]*\)|prefill attention on the tensor cores \([^)]*\) (agreed|gave)[^:]*|the device.s sampling ops (agree|disagree)[^:(]*|draws on the device gave tokens other than the host.s|plain temperature draws on the device: [^(]*" \
  "$OUT"/*.log 2>/dev/null | sort | uniq -c | head -20 | tee -a "$summary"
say "gpu_check: done in $(($(date +%s) - start)) s"

#!/usr/bin/env bash
# tools/bench_train_parallel.sh [BUILD_DIR] - the parallel-training benchmark table of
# docs/training.md: per-rank activation memory (measured, allocated, formula) and step time for
# no / selective (each module, and mlp,layernorm) / full recomputation, with and without sequence
# parallelism, at tp 2 on the stories110M shape at sequence length 1024; then the pipeline bubble
# at pp 2 with 1, 4 and 8 micro-batches against (p - 1) / m. Rank 0's line of each run is kept
# (tp ranks hold the same sizes). About 10 minutes on 2 cores; run it on a quiet machine.
# Prints figures; never fails on them.
set -u
BUILD=${1:-build}
BENCH=$BUILD/tests/bench_train_parallel
[ -x "$BENCH" ] || { echo "no $BENCH: build first (make, or cmake --build $BUILD)"; exit 1; }
export OMP_NUM_THREADS=1
MPI="mpirun --oversubscribe"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

echo "## Activation memory at tp 2, stories110M shape (d 768, 12 layers), 1 x 1024 tokens, f32"
echo
echo "| recomputation | sp | measured MiB | allocated MiB | formula MiB | measured / formula | step s | tp calls s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
row() { # row LABEL SP ARGS...
  local label=$1 sp=$2
  shift 2
  local line
  line=$($MPI -n 2 "$BENCH" --tp 2 --seq 1024 --layers 12 --steps 2 "$@" 2> /dev/null | grep '^rank 0 ')
  if [ -z "$line" ]; then echo "| $label | $sp | failed | | | | | |"; return; fi
  echo "$line" | awk -v l="$label" -v s="$sp" '{
    for (i = 1; i <= NF; i++) {
      if ($i == "measured" && $(i+2) == "MiB,") m = $(i+1)
      if ($i == "allocated") a = $(i+1)
      if ($i == "formula" && $(i+2) == "MiB") f = $(i+1)
      if ($i == "measured/formula") r = $(i+1)
      if ($i == "step") t = $(i+1)
      if ($i == "tp" && $(i+1) == "calls") c = $(i+2)
    }
    printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", l, s, m, a, f, r, t, c }'
}
for sp in no yes; do
  flag=()
  [ "$sp" = yes ] && flag=(--sp)
  row none "$sp" "${flag[@]}"
  for mods in core_attn mlp layernorm mlp,layernorm; do
    row "selective $mods" "$sp" "${flag[@]}" --recompute selective --modules "$mods"
  done
  row "full (uniform, 1 layer)" "$sp" "${flag[@]}" --recompute full
done

echo
echo "## Pipeline bubble at pp 2 (stories110M shape, 1 x 256 tokens per micro-batch, --pp-layers 8,4)"
echo
echo "The LM head and its cross-entropy over 32,000 columns cost about 3.5 layers, so 8 + 4 layers"
echo "balance the two stages."
echo
echo "| micro-batches m | (p - 1) / (m + p - 1) | step s | pp calls s, stage 0 / 1 | idle fraction, stage 0 / 1 |"
echo "| --- | --- | --- | --- | --- |"
for m in 1 4 8; do
  out=$($MPI -n 2 "$BENCH" --pp 2 --pp-layers 8,4 --seq 256 --layers 12 --steps 2 --micro-batches "$m" 2> /dev/null)
  echo "$out" | awk -v m="$m" '
    /^rank/ { for (i = 1; i <= NF; i++) { if ($i == "step") t[$2] = $(i+1); if ($i == "pp" && $(i+1) == "calls") p[$2] = $(i+2) } }
    END { printf "| %d | %.3f | %s | %s / %s | %.3f / %.3f |\n", m, 1.0 / (m + 1), t[0], p[0], p[1], (t[0] > 0 ? p[0] / t[0] : 0), (t[1] > 0 ? p[1] / t[1] : 0) }'
done
echo
echo "Idle fraction: the share of the step a stage spends in its pipeline calls (waiting for the"
echo "other stage, and the transfers); for 1F1B with balanced stages the bubble's share of the step"
echo "is (p - 1) / (m + p - 1)."

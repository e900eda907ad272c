#!/usr/bin/env bash
# tools/bench_gguf.sh SHARDLM GGUF F32_DIR [REPS] - prefill and decode speed of `shardlm generate`
# serving a GGUF natively (quantized matrices as blocks, docs/quantization.md) against the f32
# conversion of the same file (`shardlm convert gguf`), at 1 and 2 threads: a 64-token prompt
# (BOS included), then 128 greedy tokens (--ignore-eos). Each configuration runs REPS times
# (default 3) alternating the two models; the best run's figures are printed with their peak
# RSS. A benchmark, never a test: run it on an otherwise idle machine.
set -euo pipefail
shardlm=$1
gguf=$2
f32=$3
reps=${4:-3}
# 63 tokens of text after BOS with Gemma 3's tokenizer (the script checks the count).
prompt="The history of the city begins with a small settlement on the banks of a wide river, where farmers and fishermen traded grain, salt and cloth. Over the centuries it grew into a market town, then a walled city with a cathedral, a university and a harbour that connected it to the rest of the continent and beyond"

run_one() { # run_one MODEL THREADS -> "prefill decode n_prompt rss_mib"
  "${PYTHON:-python3}" - "$shardlm" "$1" "$2" "$prompt" <<'EOF'
import re, resource, subprocess, sys
shardlm, model, threads, prompt = sys.argv[1:5]
r = subprocess.run([shardlm, "generate", "--model", model, "--prompt", prompt, "--max-tokens", "128",
                    "--ignore-eos", "--threads", threads], capture_output=True, text=True)
m = re.search(r"prompt (\d+) tokens, prefill ([\d.]+) tok/s; generated (\d+) tokens, decode ([\d.]+) tok/s", r.stderr)
if r.returncode or not m:
    sys.exit("bench_gguf: generate failed: " + r.stderr[-500:])
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
print(m.group(2), m.group(4), m.group(1), "%.0f" % rss)
EOF
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %-7s %14s %14s %10s\n' model threads "prefill tok/s" "decode tok/s" "peak RSS"
for threads in 1 2; do
  declare -A best_p=() best_d=() rss=() np=()
  for ((i = 0; i < reps; i++)); do
    for name in gguf f32; do
      model=$gguf
      [ "$name" = f32 ] && model=$f32
      read -r p d n r < <(run_one "$model" "$threads")
      np[$name]=$n
      rss[$name]=$r
      if [ -z "${best_p[$name]:-}" ] || awk "BEGIN{exit !($p > ${best_p[$name]})}"; then best_p[$name]=$p; fi
      if [ -z "${best_d[$name]:-}" ] || awk "BEGIN{exit !($d > ${best_d[$name]})}"; then best_d[$name]=$d; fi
    done
  done
  for name in gguf f32; do
    printf '%-8s %-7s %14s %14s %7s MiB   (prompt %s tokens, best of %d)\n' "$name" "$threads" "${best_p[$name]}" \
      "${best_d[$name]}" "${rss[$name]}" "${np[$name]}" "$reps"
  done
  awk "BEGIN{printf \"ratio gguf/f32 at %d thread(s): prefill %.2fx, decode %.2fx\n\", $threads, ${best_p[gguf]} / ${best_p[f32]}, ${best_d[gguf]} / ${best_d[f32]}}"
  unset best_p best_d rss np
done

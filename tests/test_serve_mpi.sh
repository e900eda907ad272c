#!/usr/bin/env bash
# tests/test_serve_mpi.sh SHARDLM DATA_DIR TP PP [DP [kill|hang]] - a multi-rank server:
# `mpirun -n DP*TP*PP shardlm serve --dp DP --tp TP --pp PP` on 127.0.0.1 (rank 0 serves, routes
# and conducts replica 0; the other replicas' first ranks run their own engines; the rest replay
# their conductor's step plans); completions equal `shardlm generate` on one rank, streamed and
# unary; a bench of concurrent streams succeeds (and, with DP > 1, reaches every replica);
# SIGTERM drains and every rank exits.
# With `kill`: rank 1 (a worker, or replica 1's leader when DP > 1) is killed (SIGKILL) in the middle of a long streamed generation;
# the client must get an error (not hang), and every rank must be gone within 20 s.
# With `hang`: a worker rank is stopped (SIGSTOP) instead; rank 0 notices after --rank-timeout
# (2 s here), names rank 1 (heartbeats: parallel_watch.c), fails the requests with UNAVAILABLE,
# goes NOT_SERVING and exits non-zero. With `hang_idle`: the same with no request running (no
# collective waits for the stopped rank: the heartbeats alone tell the idle conductor).
# SHARDLM_MPIRUN_ARGS adds mpirun options and SHARDLM_NETNS_KILL=NAMESPACE makes `kill` kill every
# process of that namespace (a whole node: tests/test_multinode.sh).
# DEVICE=cuda serves on GPUs (one per rank, or all on one with SHARDLM_SHARE_GPU=1), and the
# reference `generate` runs there too.
set -u
shardlm=$1
data=$2
tp=$3
pp=$4
dp=${5:-1}
mode=${6:-}
n=$((dp * tp * pp))
DEVICE=${DEVICE:-cpu}
model=$data/stories260K
[ -f "$model/model.safetensors" ] || { echo "SKIP: no converted stories260K in $data"; exit 77; }
command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
if [ "${DEVICE:-cpu}" = cuda ] && [ "${SHARDLM_CUDA_EMU:-0}" != 1 ] && ! nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
  echo "SKIP: no GPU"; exit 77 # (SHARDLM_CUDA_EMU=1: the CUDA emulator stands in, kernels/cuda_emu/README.md)
fi
tmp=$(mktemp -d)
pid=
# mpirun killed with SIGKILL orphans its ranks: kill them (its children) first.
cleanup() { [ -n "$pid" ] && { pkill -9 -P "$pid" 2> /dev/null; kill -9 "$pid" 2> /dev/null; }; rm -rf "$tmp"; }
trap cleanup EXIT
pass=0
fail=0
check() { if [ "$2" = 0 ]; then pass=$((pass + 1)); echo "PASS $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi; }

# SHARDLM_MPIRUN_ARGS: more mpirun options (tests/test_multinode.sh: a hostfile of "nodes").
# SHARDLM_TEST_JOB tells this job's ranks from any other test's, on whichever node they run.
export SHARDLM_TEST_JOB=$$.$RANDOM
# shellcheck disable=SC2086
OMP_NUM_THREADS=1 mpirun ${SHARDLM_MPIRUN_ARGS:-} -n "$n" -x OMP_NUM_THREADS -x SHARDLM_TEST_JOB "$shardlm" serve --model "$model" --device "$DEVICE" \
  --listen 127.0.0.1:0 --dp "$dp" --tp "$tp" --pp "$pp" --drain-timeout 5 --rank-timeout 2 > "$tmp/serve.log" 2>&1 &
pid=$!
# The server listens at once and answers UNAVAILABLE until the model is loaded ("shardlm:
# ready"), which takes seconds when ranks share one GPU: wait for both.
addr=
for _ in $(seq 1 600); do
  addr=$(sed -n 's/^shardlm: listening on \([0-9.:]*\).*/\1/p' "$tmp/serve.log" | head -1)
  [ -n "$addr" ] && grep -q '^shardlm: ready' "$tmp/serve.log" && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.1
done
[ -n "$addr" ] && grep -q '^shardlm: ready' "$tmp/serve.log"
check "mpirun -n $n serve --dp $dp --tp $tp --pp $pp listens and is ready" $?
if [ -z "$addr" ]; then cat "$tmp/serve.log"; echo "$pass passed, $fail failed"; exit 1; fi

if [ "$mode" = kill ] || [ "$mode" = hang ] || [ "$mode" = hang_idle ]; then
  client=
  if [ "$mode" != hang_idle ]; then
    # Enough streaming work to outlast the kill by far (stories260K decodes ~1,000 tok/s).
    "$shardlm" bench --server "$addr" --concurrency 8 --requests 400 --max-tokens 400 \
      > "$tmp/long" 2> "$tmp/long.err" &
    client=$!
  fi
  sleep 1.5
  # This job's rank 1 (other tests may run the same command line; on another "node" it is no
  # child of our mpirun).
  worker=$(pgrep -x shardlm | while read -r p; do
    env_of=$(tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null)
    echo "$env_of" | grep -qx OMPI_COMM_WORLD_RANK=1 && echo "$env_of" | grep -qx "SHARDLM_TEST_JOB=$SHARDLM_TEST_JOB" &&
      echo "$p"; done | head -1)
  [ -n "$worker" ]; check "found a rank to kill" $?
  if [ -n "${SHARDLM_NETNS_KILL:-}" ]; then # a whole node dies: every process in its namespace
    # shellcheck disable=SC2046
    kill -9 $(ip netns pids "$SHARDLM_NETNS_KILL") 2> /dev/null
  elif [ "$mode" = kill ]; then kill -9 "$worker" 2> /dev/null; else kill -STOP "$worker" 2> /dev/null; fi
  [ "$mode" = hang_idle ] && mode_hang=1 || mode_hang=
  [ "$mode" = hang ] && mode_hang=1
  for _ in $(seq 1 200); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
  ! kill -0 "$pid" 2> /dev/null; check "a $mode rank takes the job down within 20 s (no hang)" $?
  if [ -n "$mode_hang" ]; then
    kill -9 "$worker" 2> /dev/null
    grep -q "the engine failed" "$tmp/serve.log"; check "rank 0 detected the hung rank" $?
    # ... and named it (issue 35: the message said only "a rank is hung or gone").
    grep -Eq 'rank 1 \(silent|\(rank 1\) silent' "$tmp/serve.log"
    check "rank 0 named rank 1 ($(grep -Eo 'rank 1 \(silent[^:;)]*|\(rank 1\) silent[^:;]*' "$tmp/serve.log" | head -1))" $?
    grep -q "NOT_SERVING" "$tmp/serve.log"; check "health went NOT_SERVING" $?
  fi
  if [ "$mode" = hang_idle ]; then
    grep -q "while idle" "$tmp/serve.log"; check "the idle conductor noticed through the heartbeats" $?
  else
    wait "$client"
    crc=$?
    [ "$crc" = 1 ] && grep -q "UNAVAILABLE" "$tmp/long" "$tmp/long.err"
    check "the streaming clients end with UNAVAILABLE (bench rc $crc)" $?
  fi
  if [ "$fail" != 0 ]; then # enough to tell what happened
    [ -n "$client" ] && { echo "--- bench"; tail -12 "$tmp/long" "$tmp/long.err"; }
    echo "--- server"; tail -25 "$tmp/serve.log"
  fi
  pid=
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
  exit
fi

for prompt in "" "Once upon a time" "The cat"; do
  "$shardlm" generate --model "$model" --device "$DEVICE" --prompt "$prompt" --max-tokens 40 > "$tmp/want" 2> /dev/null
  "$shardlm" complete --server "$addr" --prompt "$prompt" --max-tokens 40 > "$tmp/got" 2> /dev/null
  cmp -s "$tmp/want" "$tmp/got"; check "unary completion of '$prompt' equals one-rank generate" $?
  cmp -s "$tmp/want" "$tmp/got" || { echo "  want: $(head -c 300 "$tmp/want")"; echo "  got:  $(head -c 300 "$tmp/got")"; }
  "$shardlm" complete --server "$addr" --prompt "$prompt" --max-tokens 40 --stream > "$tmp/got" 2> /dev/null
  cmp -s "$tmp/want" "$tmp/got"; check "streamed completion of '$prompt' equals one-rank generate" $?
done
"$shardlm" bench --server "$addr" --concurrency 4 --requests 12 --max-tokens 24 > "$tmp/bench" 2>&1
check "bench: 12 concurrent streams succeed" $?
if [ "$dp" -gt 1 ]; then
  # Routing: the bench's streams spread over every replica; a prompt seen before goes back to the
  # replica that holds its prefix (and hits that replica's prefix cache).
  long="One day, a little girl named Lily went to the park with her mom. She saw a big tree and"
  for _ in 1 2 3; do "$shardlm" complete --server "$addr" --prompt "$long" --max-tokens 8 > /dev/null 2>&1; done
  sleep 0.5 # the leaders report every 0.2 s
  "$shardlm" stats --server "$addr" > "$tmp/stats" 2>&1
  check "stats: $dp replicas listed" $([ "$(grep -c '^replica ' "$tmp/stats")" = "$dp" ]; echo $?)
  idle=$(awk '/^replica / { for (i = 1; i < NF; i++) if ($i == "routed" && $(i + 1) == 0) n++ } END { print n + 0 }' "$tmp/stats")
  check "every replica got requests" $([ "$idle" = 0 ]; echo $?)
  byprefix=$(awk '/^replica / { for (i = 1; i < NF; i++) if ($i == "routed_by_prefix") n += $(i + 1) } END { print n + 0 }' "$tmp/stats")
  hits=$(awk '/^replica / { for (i = 1; i < NF; i++) if ($i == "prefix_hit_tokens") n += $(i + 1) } END { print n + 0 }' "$tmp/stats")
  check "a repeated prompt is routed by its prefix ($byprefix) and hits the cache ($hits tokens)" \
    $([ "$byprefix" -ge 2 ] && [ "$hits" -gt 0 ]; echo $?)
  [ "$fail" = 0 ] || cat "$tmp/stats"
fi
# SIGTERM to mpirun, as an orchestrator sends it: Open MPI forwards it to every rank; rank 0
# drains and tells the workers to stop. mpirun itself then exits 1 (its convention after a
# signal), so the checks are the drain and that no rank is left behind.
kill -TERM "$pid"
for _ in $(seq 1 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
! kill -0 "$pid" 2> /dev/null; check "SIGTERM: mpirun and every rank are gone within 10 s" $?
pid=
grep -q "drained; exiting" "$tmp/serve.log"; check "SIGTERM: rank 0 drained before exiting" $?
[ "$fail" = 0 ] || { echo "---- the server's log (its last 40 lines):"; tail -40 "$tmp/serve.log"; }
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]

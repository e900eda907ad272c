#!/usr/bin/env bash
# tests/test_multinode.sh SHARDLM GOLDEN_DIR MODE - shardlm across "nodes" that talk only over
# TCP: two network namespaces on this machine, each with its own address on a bridge (veth
# pairs into a third, "switch" namespace), no loopback or shared memory between them. mpirun runs
# in node 0 with a hostfile of the two addresses; its remote shell is tests/netns_rsh.sh, which
# enters the other namespace where ssh would log into the other machine; MPI's messages go over
# the bridge (btl tcp, oob tcp restricted to the bridge's subnet). MODE:
#   serve_tp2  tests/test_serve_mpi.sh at tp 2, one rank a node (tp's all-reduces cross nodes)
#   serve_dp2  the same at dp 2 (one replica a node: the router's messages cross nodes)
#   kill       serve at tp 2, then node 1 dies mid-stream (every process in its namespace gets
#              SIGKILL): the streaming clients end with UNAVAILABLE and no rank is left
#   train      `shardlm train` at dp 2 x tp 2 with sequence parallelism and the distributed
#              optimizer, two ranks a node (tp inside a node, dp across): losses and weights
#              within 1e-5 of one rank's
# Needs root, iproute2 with netns and bridge support, and mpirun (Open MPI): SKIP otherwise.
# Everything it makes (namespaces, links) is named after this process and removed on exit.
set -u
shardlm=$1
golden=$2
mode=$3
here=$(cd "$(dirname "$0")" && pwd)
[ -f "$golden/stories260K/model.safetensors" ] || { echo "SKIP: multinode: no golden stories260K in $golden"; exit 77; }

work=$(mktemp -d)
NETNS_WORK=$work
. "$here/netns_nodes.sh"
trap 'netns_nodes_down; rm -rf "$work"' EXIT
slots=1
[ "$mode" = train ] && slots=2
netns_nodes_up "sl$$" 2 "$slots" || exit $?
nodes=("${NETNS_NODES[@]}")
export OMP_NUM_THREADS=1
# Proof that the job really spans the nodes: a shardlm rank seen running inside node 1.
netns_watch_node1
spanned() {
  netns_node1_seen && echo "PASS a rank ran inside node 1 (${nodes[1]})" || { echo "FAIL no rank ran inside node 1"; return 1; }
}

case "$mode" in
serve_tp2) in_node0 bash "$here/test_serve_mpi.sh" "$shardlm" "$golden" 2 1 && spanned ;;
serve_dp2) in_node0 bash "$here/test_serve_mpi.sh" "$shardlm" "$golden" 1 1 2 && spanned ;;
kill) SHARDLM_NETNS_KILL=${nodes[1]} in_node0 bash "$here/test_serve_mpi.sh" "$shardlm" "$golden" 2 1 1 kill && spanned ;;
train)
  assets=${SHARDLM_ASSETS:-$here/../../shared/assets}
  text=$assets/datasets/tinyshakespeare.txt
  [ -f "$text" ] || { echo "SKIP: multinode: no $text"; exit 77; }
  flags="--model $golden/stories260K --data $text --seq-length 64 --micro-batch-size 2 --global-batch-size 8
         --lr 1e-3 --adam-eps 1e-3 --threads 1 --eval-iters 0 --log-interval 100 --seed 7 --train-iters 6"
  # shellcheck disable=SC2086
  timeout 120 "$shardlm" train $flags --out "$work/one" > "$work/one.log" 2>&1 ||
    { tail -5 "$work/one.log"; echo "FAIL one rank trains"; exit 1; }
  # shellcheck disable=SC2086
  if ! in_node0 timeout 180 mpirun $SHARDLM_MPIRUN_ARGS -n 4 "$shardlm" train $flags \
       --tp 2 --sequence-parallel --use-distributed-optimizer --out "$work/multi" > "$work/multi.log" 2>&1; then
    tail -15 "$work/multi.log"
    echo "FAIL dp 2 x tp 2 across two nodes runs"
    exit 1
  fi
  echo "PASS dp 2 x tp 2 across two nodes runs"
  spanned &&
    python3 "$here/train_compare.py" losses "$work/one/metrics.jsonl" "$work/multi/metrics.jsonl" --rtol 1e-5 &&
    python3 "$here/train_compare.py" weights "$work/one" "$work/multi" --rtol 1e-5
  ;;
*) echo "usage: $0 SHARDLM GOLDEN_DIR serve_tp2|serve_dp2|kill|train" >&2; exit 2 ;;
esac

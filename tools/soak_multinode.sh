#!/usr/bin/env bash
# tools/soak_multinode.sh SHARDLM soak|restart [ARGS...] - the soaks of docs/reliability.md run
# across two "nodes" (network namespaces joined by a bridge, tests/netns_nodes.sh: MPI over TCP
# only, no shared memory), a server of 4 ranks at dp 2 x tp 2 with one replica a node (tp inside
# a node, the router's messages across), its clients in node 0:
#   soak     tools/soak.py (10,000 calls at concurrency 64 unless ARGS say otherwise)
#   restart  tools/soak_restart.py with --kill-node: node 1 dies (SIGKILL to every process of its
#            namespace) every --interval seconds, the job ends, a supervisor (the script) starts
#            it again on the same journal, and every accepted stream must complete exactly once;
#            prints the recovery time of each loss
# A benchmark-style run (minutes), not a test: needs root, iproute2 and Open MPI.
set -u
shardlm=$(readlink -f "${1:?usage: soak_multinode.sh SHARDLM soak|restart [ARGS...]}")
mode=${2:?usage: soak_multinode.sh SHARDLM soak|restart [ARGS...]}
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
NETNS_WORK=$(mktemp -d)
. "$root/tests/netns_nodes.sh"
trap 'netns_nodes_down; rm -rf "$NETNS_WORK"' EXIT
netns_nodes_up "sk$$" 2 2 || exit $?
echo "CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) cores; nodes ${NETNS_NODES[*]}"
# dp 2 x tp 2 in rank order (tp fastest): ranks 0, 1 (replica 0) on node 0, ranks 2, 3 on node 1.
launcher="mpirun $(echo $SHARDLM_MPIRUN_ARGS) --map-by slot -n 4 -x OMP_NUM_THREADS"
netns_watch_node1 # the proof that the job spans the nodes
case "$mode" in
soak) in_node0 python3 "$root/tools/soak.py" --shardlm "$shardlm" --launcher "$launcher" \
        --serve-args "--dp 2 --tp 2 --rank-timeout 10" "$@" ;;
restart) in_node0 python3 "$root/tools/soak_restart.py" --shardlm "$shardlm" --launcher "$launcher" \
           --serve-args "--dp 2 --tp 2 --rank-timeout 2" --kill-node "${NETNS_NODES[1]}" "$@" ;;
*) echo "usage: $0 SHARDLM soak|restart [ARGS...]" >&2; exit 2 ;;
esac
rc=$?
netns_node1_seen || { echo "FAIL: no rank ran inside node 1 (${NETNS_NODES[1]})"; exit 1; }
echo "a rank ran inside node 1 (${NETNS_NODES[1]})"
exit $rc

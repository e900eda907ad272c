#!/usr/bin/env bash
# tests/test_router_nodes.sh SHARDLM [CALLS] - `shardlm route` across "nodes": two network
# namespaces joined by a bridge (tests/netns_nodes.sh), one replica a node (a job of 2 ranks at
# tp 2 each: dp 2 x tp 2 as separate jobs), the router and the clients in node 0; node 1 is lost
# mid-run (tests/server/test_router.py, group nodes). CALLS unary calls in all (400; the soak of
# docs/reliability.md runs 10000 at concurrency 64: SHARDLM_ROUTER_CONCURRENCY, 8 by default). Needs root, iproute2 with netns and bridge support, and mpirun:
# SKIP otherwise.
set -u
shardlm=$(readlink -f "${1:?usage: test_router_nodes.sh SHARDLM [CALLS]}")
here=$(cd "$(dirname "$0")" && pwd)
NETNS_WORK=$(mktemp -d)
. "$here/netns_nodes.sh"
trap 'netns_nodes_down; rm -rf "$NETNS_WORK"' EXIT
netns_nodes_up "rt$$" 2 2 || exit $?
echo "CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) cores; nodes ${NETNS_NODES[*]}"
export SHARDLM_ROUTER_NODES="${NETNS_NODES[*]}" SHARDLM_ROUTER_CALLS=${2:-400} OMP_NUM_THREADS=1
in_node0 python3 "$here/server/test_router.py" --shardlm "$shardlm" nodes

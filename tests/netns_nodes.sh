# tests/netns_nodes.sh - sourced, never run: "nodes" that talk only over TCP, made of network
# namespaces on this machine (tests/test_multinode.sh, tools/soak_multinode.sh). Each node is a
# namespace with its own address (10.78.0.1, 10.78.0.2, ...) on a bridge in a third, "switch"
# namespace (veth pairs), no loopback or shared memory between them; mpirun runs in node 0 with a
# hostfile of the addresses, and its remote shell is tests/netns_rsh.sh, which enters the other
# namespace where ssh would log into another machine.
#
#   netns_nodes_up TAG N SLOTS   makes nodes ${TAG}n0..n(N-1) (array NETNS_NODES), the hostfile
#                                $NETNS_WORK/hosts (SLOTS a node), and exports SHARDLM_NETNS_MAP
#                                and SHARDLM_MPIRUN_ARGS (the mpirun options every launch needs);
#                                returns 77 (SKIP) when the machine cannot (not root, no ip, no
#                                bridge), 1 when making a node fails
#   in_node0 CMD...              runs CMD inside node 0 with node 0's own hostname
#   netns_watch_node1            starts watching for a shardlm process inside node 1 (the proof
#                                that a job spans the nodes); netns_node1_seen stops the watch and
#                                says whether one was seen
#   netns_nodes_down             kills every process of the nodes and removes them (the caller's
#                                EXIT trap)
# NETNS_WORK must name a directory before netns_nodes_up.
NETNS_NODES=()
NETNS_SWITCH=

netns_nodes_up() {
  local tag=$1 n=$2 slots=$3 i ns here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  [ "$(id -u)" = 0 ] || { echo "SKIP: netns nodes need root (ip netns)"; return 77; }
  command -v ip > /dev/null && command -v mpirun > /dev/null || { echo "SKIP: netns nodes need ip and mpirun"; return 77; }
  NETNS_SWITCH=${tag}sw
  for i in $(seq 0 $((n - 1))); do NETNS_NODES+=("${tag}n$i"); done
  # The switch: a bridge in its own namespace; each node a veth pair with one end on the bridge.
  ip netns add "$NETNS_SWITCH" 2> /dev/null || { echo "SKIP: ip netns add failed"; return 77; }
  ip -n "$NETNS_SWITCH" link add br0 type bridge && ip -n "$NETNS_SWITCH" link set br0 up ||
    { echo "SKIP: no bridge support"; return 77; }
  : > "$NETNS_WORK/hosts"
  SHARDLM_NETNS_MAP=
  for i in $(seq 0 $((n - 1))); do
    ns=${NETNS_NODES[$i]}
    ip netns add "$ns" && ip -n "$ns" link set lo up &&
      ip link add "${tag}a$i" type veth peer name "${tag}b$i" &&
      ip link set "${tag}a$i" netns "$ns" && ip link set "${tag}b$i" netns "$NETNS_SWITCH" &&
      ip -n "$ns" addr add "10.78.0.$((i + 1))/24" dev "${tag}a$i" && ip -n "$ns" link set "${tag}a$i" up &&
      ip -n "$NETNS_SWITCH" link set "${tag}b$i" master br0 && ip -n "$NETNS_SWITCH" link set "${tag}b$i" up ||
      { echo "FAIL: making node $i ($ns)"; return 1; }
    printf '10.78.0.%d slots=%d\n' $((i + 1)) "$slots" >> "$NETNS_WORK/hosts"
    SHARDLM_NETNS_MAP="$SHARDLM_NETNS_MAP 10.78.0.$((i + 1))=$ns"
  done
  export SHARDLM_NETNS_MAP
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # Both "nodes" share this machine's cores: no binding, and ranks waiting yield (mpirun counts
  # each node's slots alone and would let them spin). MPI only on the bridge's subnet.
  export SHARDLM_MPIRUN_ARGS="--hostfile $NETNS_WORK/hosts --mca plm_rsh_agent $here/netns_rsh.sh --mca btl tcp,self
  --bind-to none --mca mpi_yield_when_idle 1
  --mca btl_tcp_if_include 10.78.0.0/24 --mca oob_tcp_if_include 10.78.0.0/24 -x SHARDLM_NETNS_MAP"
}

# Node 0 gets its own hostname as netns_rsh.sh gives the others theirs: with one name for all,
# Open MPI takes them for one node and its non-blocking collectives crash (SIGSEGV in a 15-line
# MPI_Comm_split_type + MPI_Iallreduce program, Open MPI 4.1.4, 2026-11-28).
in_node0() { ip netns exec "${NETNS_NODES[0]}" unshare --uts sh -c 'hostname "$0" && exec "$@"' "${NETNS_NODES[0]}" "$@"; }

netns_watch_node1() {
  ( for _ in $(seq 1 36000); do
      for p in $(ip netns pids "${NETNS_NODES[1]}" 2> /dev/null); do
        [ "$(cat "/proc/$p/comm" 2> /dev/null)" = shardlm ] && { touch "$NETNS_WORK/seen"; exit 0; }
      done
      sleep 0.1
    done ) &
  NETNS_WATCHER=$!
}

netns_node1_seen() {
  kill "$NETNS_WATCHER" 2> /dev/null
  [ -f "$NETNS_WORK/seen" ]
}

netns_nodes_down() {
  local ns pids
  for ns in "${NETNS_NODES[@]}" $NETNS_SWITCH; do
    pids=$(ip netns pids "$ns" 2> /dev/null)
    # shellcheck disable=SC2086
    [ -n "$pids" ] && kill -9 $pids 2> /dev/null
    ip netns del "$ns" 2> /dev/null
  done
}

#!/bin/sh
# tests/netns_rsh.sh [OPTIONS] HOST COMMAND... - Open MPI's remote shell (plm_rsh_agent) for
# "nodes" that are network namespaces on this machine (tests/test_multinode.sh): runs COMMAND
# (Open MPI's orted line) inside the namespace that $SHARDLM_NETNS_MAP names for HOST, the way
# ssh would run it on another machine, with the namespace's name as its hostname. SHARDLM_NETNS_MAP: "IP=NAMESPACE IP=NAMESPACE ...".
# Options before HOST (ssh's, should Open MPI pass any) are skipped.
while [ $# -gt 0 ]; do
  case "$1" in -*) shift ;; *) break ;; esac
done
host=$1
shift
ns=
for pair in ${SHARDLM_NETNS_MAP:-}; do
  [ "${pair%%=*}" = "$host" ] && ns=${pair#*=}
done
if [ -z "$ns" ]; then
  echo "netns_rsh: no namespace for host '$host' in SHARDLM_NETNS_MAP='${SHARDLM_NETNS_MAP:-}'" >&2
  exit 255
fi
# Its own hostname too (a UTS namespace): Open MPI tells nodes apart by their names.
exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns && $*"

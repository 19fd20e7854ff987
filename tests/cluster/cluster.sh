#!/usr/bin/env bash
# An emulated cluster on one machine: each node is a network namespace with its own
# eth0 (one end of a veth pair), the other ends on a bridge in the root namespace, so
# traffic between nodes crosses a real (virtual) network link; an optional tbf rate
# limit on every node's eth0 makes that link slow like a real one.
#
#   bash tests/cluster/cluster.sh up --nodes 2 --ppn 2 [--rate 400mbit]
#   bash tests/cluster/cluster.sh rate 1gbit        # change the link rate ("none": unlimited)
#   bash tests/cluster/cluster.sh link 1 down       # take node 1's eth0 down (or up)
#   bash tests/cluster/cluster.sh status
#   bash tests/cluster/cluster.sh down              # removes every namespace, link, hosts line
#
# Jobs run on it with tests/cluster/mpiexec (a drop-in mpiexec: MPICH's hydra starts each
# node's proxy inside its namespace through tests/cluster/netns-ssh). Needs root and
# iproute2 (`up` installs iproute2 with apt-get when `ip` is missing).
#
# Names: every namespace, link and /etc/hosts line carries the prefix $HPCDP_CLUSTER_PREFIX
# (default hpcdpn: namespaces hpcdpn0..N-1, bridge hpcdpnbr, host-side veths hpcdpnv0..),
# and the addresses come from $HPCDP_CLUSTER_NET.0/24 (default 10.231.47: the bridge is .1,
# node i is .(11+i)); nothing is routed anywhere else. The cluster's description is kept in
# /run/hpcdp-cluster-<prefix>.env (read by tests/cluster/mpiexec).
# Exit status: 0; 1 when a step failed (the message says which); 2 for bad usage;
# 77 when not root (nothing was changed).
set -uo pipefail

PREFIX=${HPCDP_CLUSTER_PREFIX:-hpcdpn}
NET=${HPCDP_CLUSTER_NET:-10.231.47}
STATE=/run/hpcdp-cluster-$PREFIX.env
BRIDGE=${PREFIX}br
HOSTS_TAG="# $PREFIX emulated cluster"
HOSTS_FILE=${HPCDP_CLUSTER_HOSTS_FILE:-/etc/hosts}

die() { echo "cluster.sh: error: $2" >&2; exit "$1"; }
usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }

need_root() {
  [ "$(id -u)" = 0 ] || die 77 "must run as root (network namespaces, veths and /etc/hosts): sudo bash $0 $*"
}

need_ip() {
  command -v ip >/dev/null && command -v tc >/dev/null && return 0
  echo "cluster.sh: installing iproute2 (ip, tc)"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq update >/dev/null &&
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq install -y iproute2 >/dev/null ||
    die 1 "iproute2 is missing and apt-get could not install it: apt-get install iproute2"
}

node_name() { echo "$PREFIX$1"; }
node_addr() { echo "$NET.$((11 + $1))"; }

# /etc/hosts may be a bind mount (containers): rewrite it in place, never replace it.
hosts_remove() {
  [ -f "$HOSTS_FILE" ] || return 0
  grep -qF "$HOSTS_TAG" "$HOSTS_FILE" || return 0
  local kept
  kept=$(grep -vF "$HOSTS_TAG" "$HOSTS_FILE")
  printf '%s\n' "$kept" > "$HOSTS_FILE"
}

set_rate() {  # set_rate NODES RATE: tbf on every node's eth0 (RATE "none": no limit)
  local n=$1 rate=$2 i
  for ((i = 0; i < n; i++)); do
    ip netns exec "$(node_name "$i")" tc qdisc del dev eth0 root 2>/dev/null || true
    if [ "$rate" != none ]; then
      ip netns exec "$(node_name "$i")" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 20ms ||
        die 1 "tc could not set rate '$rate' on node $i (a tc rate such as 400mbit, 1gbit)"
    fi
  done
}

teardown() {  # everything with this prefix, whatever state it is in (idempotent)
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+$"); do
    # processes still inside a node (a job that did not end) would keep it alive
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  local link
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${PREFIX}v[0-9]+$"); do
    ip link del "$link" 2>/dev/null
  done
  ip link del "$BRIDGE" 2>/dev/null
  hosts_remove
  rm -f "$STATE"
}

cmd_up() {
  local nodes=2 ppn=2 rate=none
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=${2:-}; shift 2 || die 2 "--nodes needs a number" ;;
      --ppn) ppn=${2:-}; shift 2 || die 2 "--ppn needs a number" ;;
      --rate) rate=${2:-}; shift 2 || die 2 "--rate needs a tc rate (400mbit, 1gbit) or none" ;;
      *) die 2 "up: unknown argument '$1' (use --nodes N --ppn P --rate R)" ;;
    esac
  done
  [[ $nodes =~ ^[1-9][0-9]?$ ]] && [ "$nodes" -le 32 ] || die 2 "--nodes '$nodes': needs 1 to 32"
  [[ $ppn =~ ^[1-9][0-9]*$ ]] || die 2 "--ppn '$ppn': needs a whole number >= 1"
  need_root up
  need_ip
  if [ -f "$STATE" ] || ip netns list 2>/dev/null | grep -qE "^${PREFIX}[0-9]+( |$)"; then
    die 1 "a cluster with prefix '$PREFIX' already exists: 'bash $0 down' first, or set HPCDP_CLUSTER_PREFIX and HPCDP_CLUSTER_NET for a second one"
  fi
  # a failed step leaves nothing behind
  trap 'echo "cluster.sh: up failed; removing what it made" >&2; teardown' ERR
  set -e
  ip link add "$BRIDGE" type bridge
  ip addr add "$NET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local i ns hosts=""
  for ((i = 0; i < nodes; i++)); do
    ns=$(node_name "$i")
    ip netns add "$ns"
    ip link add "${PREFIX}v$i" type veth peer name eth0 netns "$ns"
    ip link set "${PREFIX}v$i" master "$BRIDGE" up
    ip netns exec "$ns" ip addr add "$(node_addr "$i")/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    hosts+="$(node_addr "$i") $ns $HOSTS_TAG"$'\n'
  done
  set +e
  trap - ERR
  hosts_remove
  printf '%s' "$hosts" >> "$HOSTS_FILE" || { teardown; die 1 "could not add the nodes to $HOSTS_FILE"; }
  set_rate "$nodes" "$rate"
  # every node reaches every other one over the bridge: a TCP connect to a closed port is
  # refused at once (reachable); no answer within 3 s is a timeout (status 124)
  for ((i = 1; i < nodes; i++)); do
    ip netns exec "$(node_name 0)" timeout 3 bash -c "exec 3<>/dev/tcp/$(node_addr "$i")/9" 2>/dev/null
    [ $? -ne 124 ] ||
      { teardown; die 1 "node 0 cannot reach node $i over $BRIDGE (a firewall on bridged traffic?)"; }
  done
  {
    echo "PREFIX=$PREFIX"
    echo "NODES=$nodes"
    echo "PPN=$ppn"
    echo "RATE=$rate"
    echo "BRIDGE=$BRIDGE"
    echo "HOSTS=\"$(for ((i = 0; i < nodes; i++)); do printf '%s ' "$(node_name "$i")"; done)\""
  } > "$STATE"
  echo "cluster.sh: up: $nodes node(s) (${PREFIX}0..${PREFIX}$((nodes - 1)), $NET.11-$((10 + nodes))) x $ppn rank(s), link rate $rate, bridge $BRIDGE"
}

load_state() {
  [ -f "$STATE" ] || die 1 "no emulated cluster with prefix '$PREFIX' is up: bash $0 up --nodes 2 --ppn 2"
  # shellcheck disable=SC1090
  . "$STATE"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down)
    need_root down
    command -v ip >/dev/null || { hosts_remove; rm -f "$STATE"; exit 0; }
    teardown
    echo "cluster.sh: down: no namespace, link or hosts line with prefix '$PREFIX' is left" ;;
  rate)
    need_root rate
    [ $# -eq 2 ] || die 2 "usage: rate RATE (a tc rate such as 400mbit, or none)"
    load_state
    set_rate "$NODES" "$2"
    sed -i "s/^RATE=.*/RATE=$2/" "$STATE"
    echo "cluster.sh: link rate $2 on every node" ;;
  link)
    need_root link
    [ $# -eq 3 ] && [[ $2 =~ ^[0-9]+$ ]] && [[ $3 =~ ^(up|down)$ ]] || die 2 "usage: link NODE up|down"
    load_state
    [ "$2" -lt "$NODES" ] || die 2 "node $2: the cluster has nodes 0-$((NODES - 1))"
    ip netns exec "$(node_name "$2")" ip link set eth0 "$3" || die 1 "could not set node $2's eth0 $3" ;;
  status)
    load_state
    echo "nodes: $HOSTS($NODES x $PPN rank(s)), link rate $RATE, bridge $BRIDGE"
    for ((i = 0; i < NODES; i++)); do
      ns=$(node_name "$i")
      echo "$ns: $(ip netns exec "$ns" ip -brief addr show dev eth0 2>/dev/null)"
    done ;;
  -h | --help | help) usage ;;
  *) usage >&2; exit 2 ;;
esac

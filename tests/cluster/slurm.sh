#!/usr/bin/env bash
# A real Slurm on the emulated cluster (tests/cluster/cluster.sh): slurmctld in the root
# namespace listening on the bridge's address, one slurmd per node started inside that
# node's namespace (`slurmd -N <node>`, NodeAddr = the node's address), and a munged of
# its own (its socket is a file, so every namespace reaches it). Jobs submitted to it
# really run on the nodes: a task of node 1 is a process in namespace <prefix>1.
#
#   bash tests/cluster/cluster.sh up --nodes 2 --ppn 2
#   bash tests/cluster/slurm.sh up                 # controller, one slurmd per node, munged
#   eval "$(bash tests/cluster/slurm.sh env)"      # SLURM_CONF and UCX settings for this shell
#   job=$(sbatch --parsable -N 2 --ntasks-per-node 2 jobs/train.sbatch ...)
#   bash tests/cluster/slurm.sh wait "$job" [SECONDS]   # until it ends (default 300 s)
#   bash tests/cluster/slurm.sh status
#   bash tests/cluster/slurm.sh down               # daemons, state dir (before cluster.sh down)
#
# Its own names, so that it never meets tests/slurm/local-slurm.sh's one-node Slurm
# (/etc/slurm/slurm.conf, ports 6817/6818) or another prefix's: config, state, logs and
# munge socket in /run/hpcdp-cluster-slurm-<prefix>/; SlurmctldPort 17000 + 2 x (the third
# number of $HPCDP_CLUSTER_NET) (+ 512 x (the second number - 231) mod 8), SlurmdPort the
# next one; cluster name hpcdp-<prefix>.
# The client commands find it through SLURM_CONF (the `env` lines); UCX_TLS=tcp,self and
# UCX_NET_DEVICES=eth0 make MPICH's UCX send inter-node traffic over the veth (otherwise
# it sees the peer on the same machine and uses shared memory). sbatch passes them on.
# Every wait is bounded; `up` that fails removes what it started (daemon log tails printed).
# Exit status: 0; 1 a step failed (the message says which); 2 bad usage; 3 Slurm or
# munge not installed (bash tests/slurm/install-slurm.sh); 77 not root.
set -uo pipefail

PREFIX=${HPCDP_CLUSTER_PREFIX:-hpcdpn}
NET=${HPCDP_CLUSTER_NET:-10.231.47}
CLUSTER_STATE=/run/hpcdp-cluster-$PREFIX.env
STATE=/run/hpcdp-cluster-slurm-$PREFIX
CONF=$STATE/slurm.conf
SOCK=$STATE/munge/munge.socket
SBIN=${HPCDP_SLURM_SBIN:-/usr/sbin}
octet=${NET##*.}
octet2=$(cut -d. -f2 <<< "$NET")
CTLD_PORT=$((17000 + 2 * octet + 512 * ((octet2 + 8 - 231 % 8) % 8)))
SLURMD_PORT=$((CTLD_PORT + 1))

die() { echo "slurm.sh: error: $2" >&2; exit "$1"; }
say() { echo "slurm.sh: $*"; }
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }

need_root() { [ "$(id -u)" = 0 ] || die 77 "must run as root (daemons inside network namespaces): sudo bash $0 $1"; }

export SLURM_CONF=$CONF

alive() {  # name pid: that pid runs that program
  [ -n "${2:-}" ] && [ "$(cat "/proc/$2/comm" 2>/dev/null)" = "$1" ]
}

logs() {
  local f
  for f in "$STATE"/*.log "$STATE"/munge/munged.log; do
    [ -f "$f" ] || continue
    echo "--- tail of $f"; tail -15 "$f"
  done
}

stop_daemons() {  # every daemon recorded in $STATE/pids, slurmds first, munged last
  [ -s "$STATE/pids" ] || return 0
  local name pid left
  # the job steps end with their slurmd's session: cancel what is queued first
  timeout 10 scancel --quiet --user=root 2>/dev/null
  for sig in TERM KILL; do
    while read -r name pid; do
      alive "$name" "$pid" && kill -"$sig" "$pid" 2>/dev/null
    done < <(grep -v '^munged ' "$STATE/pids")
    for _ in $(seq 1 40); do
      left=0
      while read -r name pid; do alive "$name" "$pid" && left=1; done < <(grep -v '^munged ' "$STATE/pids")
      [ $left = 0 ] && break
      sleep 0.25
    done
    [ $left = 0 ] && break
  done
  # job steps (slurmstepd) outlive slurmd: those of this Slurm name this config
  local p
  for p in $(pgrep -x slurmstepd); do
    grep -qsF "$STATE" "/proc/$p/environ" "/proc/$p/cmdline" && kill -KILL "$p" 2>/dev/null
  done
  while read -r name pid; do
    alive "$name" "$pid" && kill "$pid" 2>/dev/null
  done < <(grep '^munged ' "$STATE/pids")
  for _ in $(seq 1 20); do
    left=0
    while read -r name pid; do alive "$name" "$pid" && left=1; done < <(grep '^munged ' "$STATE/pids")
    [ $left = 0 ] && break
    sleep 0.25
  done
  : > "$STATE/pids"
}

nodes_idle() {  # all $1 nodes answer (idle, mixed, allocated, completing)
  local states
  states=$(timeout 10 sinfo -h -N -o %T 2>/dev/null) || return 1
  [ "$(grep -cE '^(idle|mixed|allocated|completing)$' <<< "$states")" -ge "$1" ]
}

write_conf() {  # nodes cpus
  local i cpus=$2 host
  host=$(hostname -s)
  {
    echo "# written by tests/cluster/slurm.sh for the emulated cluster '$PREFIX'"
    echo "ClusterName=hpcdp-$PREFIX"
    echo "SlurmctldHost=$host($NET.1)"
    echo "SlurmctldPort=$CTLD_PORT"
    echo "SlurmdPort=$SLURMD_PORT"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$SOCK"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "SchedulerType=sched/backfill"
    echo "MpiDefault=pmi2"
    # job ids that never repeat across starts (tests/slurm/local-slurm.sh says why: MPICH
    # names its /dev/shm segments after them, and killed ranks leave theirs behind)
    echo "FirstJobId=$(( $(date +%s) % 60000000 + 1000 ))"
    echo "ReturnToService=2"
    echo "SlurmdParameters=config_overrides"
    echo "SlurmdTimeout=10"
    echo "MessageTimeout=5"
    echo "KillWait=5"
    echo "StateSaveLocation=$STATE/ctld"
    echo "SlurmdSpoolDir=$STATE/d-%n"
    echo "SlurmctldPidFile=$STATE/slurmctld.pid"
    echo "SlurmdPidFile=$STATE/slurmd-%n.pid"
    echo "SlurmctldLogFile=$STATE/slurmctld.log"
    echo "SlurmdLogFile=$STATE/slurmd-%n.log"
    echo "JobCompType=jobcomp/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    for ((i = 0; i < $1; i++)); do
      echo "NodeName=$PREFIX$i NodeAddr=$NET.$((11 + i)) CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=2048 State=UNKNOWN"
    done
    echo "PartitionName=$PREFIX Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
  } > "$CONF"
}

fail() {  # a step of `up` failed: stop what it started, say why
  echo "slurm.sh: error: up: $*; stopping what it started (log tails below)" >&2
  logs >&2
  stop_daemons
  rm -rf "$STATE"
  exit 1
}

wait_pid() {  # name file: wait (10 s at most) for $STATE/file.pid, record it
  for _ in $(seq 1 40); do [ -s "$STATE/$2.pid" ] && break; sleep 0.25; done
  [ -s "$STATE/$2.pid" ] || fail "$2 wrote no pid file within 10 s"
  echo "$1 $(cat "$STATE/$2.pid")" >> "$STATE/pids"
}

cmd_up() {
  need_root up
  for p in slurmctld slurmd munged; do
    [ -x "$SBIN/$p" ] || die 3 "$SBIN/$p is missing: bash tests/slurm/install-slurm.sh"
  done
  command -v sbatch >/dev/null || die 3 "sbatch is missing: bash tests/slurm/install-slurm.sh"
  [ -f "$CLUSTER_STATE" ] || die 1 "no emulated cluster '$PREFIX' is up: bash tests/cluster/cluster.sh up --nodes 2 --ppn 2"
  # shellcheck disable=SC1090
  . "$CLUSTER_STATE"
  if [ -s "$STATE/pids" ]; then
    die 1 "a Slurm for cluster '$PREFIX' already runs ($STATE): bash $0 down first"
  fi
  local cpus=${HPCDP_SLURM_CPUS:-$(( $(nproc) > PPN ? $(nproc) : PPN ))}
  rm -rf "$STATE"
  mkdir -p "$STATE/ctld" "$STATE/munge"
  chmod 711 "$STATE/munge"
  : > "$STATE/pids"
  write_conf "$NODES" "$cpus"
  # munged: its own key and socket (any other munged on this machine is left alone)
  (umask 077; head -c 1024 /dev/urandom > "$STATE/munge/munge.key")
  "$SBIN/munged" --force --socket="$SOCK" --key-file="$STATE/munge/munge.key" \
    --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" \
    --seed-file="$STATE/munge/munged.seed" 9>&- || fail "munged did not start"
  echo "munged $(cat "$STATE/munge/munged.pid")" >> "$STATE/pids"
  "$SBIN/slurmctld" -c -f "$CONF" 9>&- || fail "slurmctld did not start"
  wait_pid slurmctld slurmctld
  local i
  for ((i = 0; i < NODES; i++)); do
    mkdir -p "$STATE/d-$PREFIX$i"
    # nsenter --net, not `ip netns exec`: that one mounts a fresh /sys without the
    # cgroup file systems slurmd looks for
    nsenter --net="/run/netns/$PREFIX$i" "$SBIN/slurmd" -f "$CONF" -N "$PREFIX$i" 9>&- ||
      fail "slurmd of node $PREFIX$i did not start"
    wait_pid slurmd "slurmd-$PREFIX$i"
  done
  local ok=0
  for _ in $(seq 1 60); do nodes_idle "$NODES" && { ok=1; break; }; sleep 0.5; done
  [ $ok = 1 ] || fail "the $NODES slurmds did not register with slurmctld within 30 s"
  # A throwaway step first: on a fresh slurmd (22.05, pmi2) the first step's MPI start-up
  # exchange can arrive garbled (tests/slurm/local-slurm.sh says more).
  timeout 60 srun -N "$NODES" -n "$NODES" -t 1 -J hpcdp-warmup true >/dev/null 2>&1 ||
    say "warning: the warm-up step 'srun -N $NODES true' failed"
  say "up: $NODES node(s) $(timeout 5 sinfo -h -o '%P %D %T %C' | head -1); slurmctld on $NET.1:$CTLD_PORT; config $CONF"
}

cmd_down() {
  need_root down
  [ -d "$STATE" ] || { say "down: no Slurm for cluster '$PREFIX' was up"; return 0; }
  stop_daemons
  rm -rf "$STATE"
  say "down: no daemon or state of the Slurm of cluster '$PREFIX' is left"
}

cmd_wait() {  # job [seconds]: poll every 0.5 s (sbatch --wait polls at 2, 10, 42 s ...)
  local job=${1:-} limit=${2:-300} line state code
  [[ $job =~ ^[0-9]+$ ]] || die 2 "usage: wait JOBID [SECONDS]"
  [[ $limit =~ ^[0-9]+$ ]] || die 2 "wait: SECONDS '$limit' must be a whole number"
  local end=$((SECONDS + limit))
  while [ $SECONDS -lt $end ]; do
    line=$(timeout 10 scontrol show job -o "$job" 2>/dev/null)
    state=$(grep -o 'JobState=[A-Z_]*' <<< "$line" | cut -d= -f2)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE)
        code=$(grep -o ' ExitCode=[0-9]*:[0-9]*' <<< "$line" | cut -d= -f2)
        say "job $job: $state (exit ${code:-?}) on $(grep -o ' NodeList=[^ ]*' <<< "$line" | cut -d= -f2)"
        [ "$state" = COMPLETED ] && return 0
        [ "${code#*:}" != 0 ] && return $((128 + ${code#*:}))
        [ "${code%%:*}" != 0 ] && return "${code%%:*}"
        return 1 ;;
      "") [ -n "$line" ] || die 1 "job $job: slurmctld does not know it (or does not answer)" ;;
    esac
    sleep 0.5
  done
  say "job $job: still ${state:-unknown} after $limit s; cancelling it" >&2
  timeout 10 scancel "$job"
  return 124
}

case ${1:-} in
  up) cmd_up ;;
  wait) shift; cmd_wait "$@"; exit $? ;;
  down) cmd_down ;;
  env)
    [ -f "$CONF" ] || die 1 "no Slurm for cluster '$PREFIX' is up: bash $0 up"
    echo "export SLURM_CONF=$CONF UCX_TLS=tcp,self UCX_NET_DEVICES=eth0" ;;
  status)
    [ -s "$STATE/pids" ] || die 1 "no Slurm for cluster '$PREFIX' is up: bash $0 up"
    timeout 10 sinfo -N -o '%N %T %C' || die 1 "slurmctld ($NET.1:$CTLD_PORT) does not answer" ;;
  -h | --help | help) usage ;;
  *) usage >&2; exit 2 ;;
esac

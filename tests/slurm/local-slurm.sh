#!/usr/bin/env bash
# hpcdp's one-node Slurm for the job-script tests: munged, slurmctld and slurmd on
# loopback, started as root without systemd (containers and CI runners have none).
#
#   bash tests/slurm/local-slurm.sh start [--holder ID]   # make sure a Slurm answers
#   bash tests/slurm/local-slurm.sh stop  [--holder ID]   # stop it if `start --holder ID` started it
#   bash tests/slurm/local-slurm.sh stop --holder any      # whoever started it (its holder died)
#   bash tests/slurm/local-slurm.sh status
#   bash tests/slurm/local-slurm.sh check                  # exit 3, naming them, if programs are missing
#
# Only one Slurm can run on a machine, and other people may be using it. So `start`
# uses a Slurm that already answers (or whose daemons are still coming up) and leaves
# it alone; only when no Slurm daemon runs does it write the config, start the daemons
# and record their pids and the holder (default: the calling process) in $STATE.
# `stop` acts only for that holder: it gives jobs still queued $STOP_WAIT seconds,
# cancels the rest, then stops exactly the recorded pids. A lock makes two `start`s
# at once agree on one Slurm.
#
# Exit status: 0 a Slurm answers (start) / done (stop); 1 the daemons did not come
# up (their log tails are printed); 3 Slurm or munge is not installed; 4 not root.
# Environment: HPCDP_SLURM_STATE (default /run/hpcdp-slurm: tmpfs, gone at reboot),
# HPCDP_SLURM_SBIN (default /usr/sbin), HPCDP_SLURM_CPUS (default: 4 or the core
# count if larger; ranks may oversubscribe), HPCDP_SLURM_STOP_WAIT (default 60).
set -uo pipefail

STATE=${HPCDP_SLURM_STATE:-/run/hpcdp-slurm}
SBIN=${HPCDP_SLURM_SBIN:-/usr/sbin}
STOP_WAIT=${HPCDP_SLURM_STOP_WAIT:-60}
CONF=/etc/slurm/slurm.conf          # where the client commands look for it
MARK="# written by hpcdp tests/slurm/local-slurm.sh"
LOCK=/run/lock/hpcdp-local-slurm.lock
# A shell set up for the emulated cluster's two-node Slurm (tests/cluster/slurm.sh env) points
# SLURM_CONF at that one; this script's Slurm is the one of /etc/slurm/slurm.conf.
case ${SLURM_CONF:-} in /run/hpcdp-cluster-slurm-*) unset SLURM_CONF ;; esac

say() { echo "local-slurm: $*"; }
# A first job id this start has to itself (seconds of the clock, below Slurm's MaxJobId)
first_job_id() { echo $(( $(date +%s) % 60000000 + 1000 )); }
die() { echo "local-slurm: $2" >&2; exit "$1"; }

cmd=${1:-}; shift || true
holder=$PPID
while [ $# -gt 0 ]; do
  case $1 in
    --holder) holder=${2:?--holder needs an id}; shift 2 ;;
    *) die 64 "unknown argument '$1' (usage: local-slurm.sh start|stop|status [--holder ID])" ;;
  esac
done

# Slurm daemons named $1 other than those of an emulated cluster's two-node Slurm
# (tests/cluster/slurm.sh starts them with SLURM_CONF=/run/hpcdp-cluster-slurm-<prefix>/...
# in their environment, which their children such as slurmctld's slurmscriptd inherit; own
# ports and munge socket: it does not collide with this one).
daemons_named() {
  local p words
  for p in $(pgrep -x "$1"); do
    words=$(cat "/proc/$p/cmdline" "/proc/$p/environ" 2>/dev/null | tr '\0' ' ')
    # empty: a zombie or gone (a daemon's parent that exited after forking it)
    [ -n "$words" ] && [[ $words != */run/hpcdp-cluster-slurm-* ]] && echo "$p"
  done
}

# The controller named by the client config runs on this machine but no slurmctld
# process does: nothing can answer, and sinfo would retry for ~9 s to find that out.
local_controller_down() {
  local conf=${SLURM_CONF:-$CONF} host
  [ -f "$conf" ] || return 0   # no config: no client command can reach anything
  host=$(awk -F'[=(]' '/^[[:space:]]*SlurmctldHost[[:space:]]*=/ {gsub(/[[:space:]]/, "", $2); print $2; exit}' "$conf")
  case $host in
    "$(hostname -s)"|"$(hostname)"|localhost|127.0.0.1) [ -z "$(daemons_named slurmctld)" ] ;;
    *) return 1 ;;
  esac
}

# A usable node: idle, mixed, allocated or completing, and responding (no '*').
answers() {
  local states
  local_controller_down && return 1
  states=$(timeout 10 sinfo -h -o %T 2>/dev/null) || return 1
  grep -Eq '^(idle|mixed|allocated|completing)$' <<< "$states"
}

daemons_running() { [ -n "$(daemons_named slurmctld)$(daemons_named slurmd)" ]; }

wait_until_answers() {  # $1 seconds
  local n=$(( $1 * 2 ))
  for _ in $(seq 1 "$n"); do answers && return 0; sleep 0.5; done
  return 1
}

missing_programs() {
  local m=()
  for p in slurmctld slurmd munged; do [ -x "$SBIN/$p" ] || m+=("$SBIN/$p"); done
  for p in sinfo squeue scancel scontrol sbatch srun; do command -v "$p" >/dev/null || m+=("$p"); done
  echo "${m[*]}"
}

# "name pid" lines of the daemons this script started
recorded() { [ -s "$STATE/pids" ] && cat "$STATE/pids"; }

alive() {  # name pid: that pid runs that program (a stale pid file never kills a stranger)
  [ "$(cat "/proc/$2/comm" 2>/dev/null)" = "$1" ]
}

logs() {
  for f in "$STATE/slurmctld.log" "$STATE/slurmd.log"; do
    echo "--- tail of $f"; tail -20 "$f" 2>/dev/null || echo "(missing)"
  done
}

write_conf() {
  local host cpus mem
  host=$(hostname -s)
  cpus=${HPCDP_SLURM_CPUS:-$(( $(nproc) > 4 ? $(nproc) : 4 ))}
  mem=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  mkdir -p /etc/slurm
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    cp -p "$CONF" "$STATE/slurm.conf.saved"   # someone's own config: put back by stop
  fi
  cat > "$CONF.hpcdp-tmp" <<EOF
$MARK
# A one-node cluster on loopback for hpcdp's job-script tests; stop restores any
# config that was here before.
ClusterName=hpcdp-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=pmi2
# Job ids that never repeat across starts: MPICH names its shared-memory segments after
# the PMI job id, and a rank killed in an earlier session (a fault test) leaves its
# segment in /dev/shm; a new job 2 then attached to the old job 2's segment and failed in
# MPI_Init ("Message truncated", every session's job 2).
FirstJobId=$(first_job_id)
ReturnToService=2
SlurmdParameters=config_overrides
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  mv "$CONF.hpcdp-tmp" "$CONF"
}

start_munge() {
  if [ -n "$(daemons_named munged)" ]; then
    return 0  # someone's munged: use it, never stop it
  fi
  mkdir -p /run/munge /etc/munge && chown munge:munge /run/munge && chmod 755 /run/munge
  if [ ! -s /etc/munge/munge.key ]; then
    (umask 077; head -c 1024 /dev/urandom > /etc/munge/munge.key)
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  runuser -u munge -- "$SBIN/munged" 9>&- || return 1
  local pid
  for _ in $(seq 1 20); do
    pid=$(cat /run/munge/munged.pid 2>/dev/null) && [ -n "$pid" ] && break
    sleep 0.25
  done
  [ -n "${pid:-}" ] && echo "munged $pid" >> "$STATE/pids"
}

start_daemons() {
  rm -rf "$STATE"
  mkdir -p "$STATE/ctld" "$STATE/d"
  echo "$holder" > "$STATE/holder"
  : > "$STATE/pids"
  write_conf
  start_munge || { say "munged did not start"; return 1; }
  "$SBIN/slurmctld" -c 9>&- || return 1   # -c: a fresh state, no jobs from an earlier run
  "$SBIN/slurmd" 9>&- || return 1
  local name
  for name in slurmctld slurmd; do
    for _ in $(seq 1 20); do [ -s "$STATE/$name.pid" ] && break; sleep 0.25; done
    echo "$name $(cat "$STATE/$name.pid" 2>/dev/null)" >> "$STATE/pids"
  done
}

do_start() {
  [ -z "$(missing_programs)" ] || die 3 "Slurm is not installed (missing: $(missing_programs)); run as root: bash tests/slurm/install-slurm.sh"
  if answers; then say "using the Slurm that already answers (not started here)"; return 0; fi
  [ "$(id -u)" -eq 0 ] || die 4 "no Slurm answers and starting one needs root: run this as root (or start your Slurm and rerun)"
  mkdir -p "$(dirname "$LOCK")"
  exec 9>"$LOCK"
  flock -w 90 9 || die 1 "waited 90 s for $LOCK (another start holds it)"
  if answers; then say "using the Slurm that already answers (started meanwhile)"; return 0; fi
  if daemons_running; then
    # Someone's Slurm is coming up (or is stuck): never start a second one.
    say "Slurm daemons run but do not answer yet; waiting up to 30 s"
    wait_until_answers 30 && { say "using the Slurm that already runs (not started here)"; return 0; }
    die 1 "Slurm daemons run here ($(pgrep -ax 'slurmctld|slurmd' | tr '\n' ';')) but no node answers; not starting a second Slurm"
  fi
  say "starting munged, slurmctld and slurmd (state and logs in $STATE)"
  if start_daemons && wait_until_answers 30; then
    # One throwaway job step first. On a freshly started slurmd (22.05, pmi2) the FIRST
    # step's MPI start-up exchange arrives garbled: MPICH's UCX aborts MPI_Init with
    # "failed to unpack address, invalid bandwidth 0.00" (or "Message truncated") on one
    # task while the other waits. Every later step is fine; a one-task step clears it.
    timeout 60 srun -n 1 -t 1 -J hpcdp-warmup true >/dev/null 2>&1 ||
      say "warning: the warm-up step 'srun -n 1 true' failed (the first test job may fail)"
    say "up: $(timeout 5 sinfo -h -o '%P %D %T %C' | head -1) (holder $holder)"
    return 0
  fi
  logs >&2
  do_stop_ours
  die 1 "the Slurm daemons did not come up (log tails above)"
}

do_stop_ours() {  # stop the recorded daemons: Slurm's first, munged last
  local name pid
  # scontrol shutdown only while our slurmctld is the one running: never someone else's.
  while read -r name pid; do
    [ "$name" = slurmctld ] && alive "$name" "$pid" && timeout 10 scontrol shutdown >/dev/null 2>&1
  done < <(recorded)
  for _ in $(seq 1 20); do
    local left=0
    while read -r name pid; do
      [ "$name" = munged ] && continue
      alive "$name" "$pid" && left=1
    done < <(recorded)
    [ $left = 0 ] && break
    sleep 0.25
  done
  while read -r name pid; do
    alive "$name" "$pid" && kill "$pid" 2>/dev/null
  done < <(recorded | sort -r)   # slurmd, slurmctld, then munged
  for _ in $(seq 1 20); do
    local left=0
    while read -r name pid; do alive "$name" "$pid" && left=1; done < <(recorded)
    [ $left = 0 ] && break
    sleep 0.25
  done
  if [ -f "$STATE/slurm.conf.saved" ]; then
    cp -p "$STATE/slurm.conf.saved" "$CONF"
  elif grep -qsF "$MARK" "$CONF"; then
    rm -f "$CONF"
  fi
  rm -f "$STATE/pids" "$STATE/holder" "$STATE/slurm.conf.saved"
}

do_stop() {
  if [ ! -s "$STATE/holder" ]; then
    say "no Slurm was started here; leaving any running Slurm alone"; return 0
  fi
  if [ "$holder" != any ] && [ "$(cat "$STATE/holder")" != "$holder" ]; then
    say "the local Slurm belongs to holder $(cat "$STATE/holder"), not $holder; leaving it running"; return 0
  fi
  exec 9>"$LOCK"
  flock -w 90 9 || die 1 "waited 90 s for $LOCK"
  # Jobs still queued: give them time, then cancel them and let their steps end while
  # munge still runs (a step that outlives munge keeps slurmd from exiting).
  local waited=0
  while [ -n "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && [ $waited -lt $(( STOP_WAIT * 2 )) ]; do
    [ $waited = 0 ] && say "waiting up to ${STOP_WAIT} s for the jobs still queued"
    sleep 0.5; waited=$(( waited + 1 ))
  done
  local left
  left=$(timeout 5 squeue -h -o %i 2>/dev/null)
  if [ -n "$left" ]; then
    say "cancelling jobs $(echo $left)"
    timeout 10 scancel $left
    for _ in $(seq 1 20); do
      [ -z "$(timeout 5 squeue -h 2>/dev/null)" ] && ! pgrep -x slurmstepd >/dev/null && break
      sleep 0.5
    done
  fi
  say "stopping the Slurm started by holder $holder"
  do_stop_ours
}

do_status() {
  if answers; then say "a Slurm answers: $(timeout 5 sinfo -h -o '%P %D %T %C' | head -1)"; else say "no Slurm answers"; fi
  if [ -s "$STATE/holder" ]; then say "started here for holder $(cat "$STATE/holder"): $(recorded | tr '\n' ' ')"; fi
  local m; m=$(missing_programs)
  [ -z "$m" ] || say "not installed: $m"
}

case $cmd in
  check)  # installed? (prints what is missing; exit 3 if anything is)
    m=$(missing_programs); [ -z "$m" ] || { echo "$m"; exit 3; } ;;
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  *) die 64 "usage: local-slurm.sh start|stop|status|check [--holder ID]" ;;
esac

#!/usr/bin/env bash
# CI: install Debian's Slurm (controller, node daemon, client) and munge for
# tests/run_slurm.sh, which starts a one-node Slurm on loopback with the starter
# scripts in ../shared/slurm (or $HPCDP_SLURM_DIR). Quiet unless something fails.
# Needs root (or sudo) and apt; skips the install when the commands are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
slurm_dir=${HPCDP_SLURM_DIR:-../shared/slurm}
sudo=""
# Not `sbatch --version`: without /etc/slurm/slurm.conf (the starter writes it) it fails.
slurm_version() { dpkg-query -W -f '${Version}' slurm-client 2>/dev/null || echo '?'; }
[ "$(id -u)" -eq 0 ] || sudo="sudo"

if command -v sbatch >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ]; then
  echo "slurm-setup: Slurm already installed ($(slurm_version))"
else
  log=$(mktemp)
  # policy-rc.d in containers stops the packages' services from starting: the
  # starter runs the daemons itself, without systemd.
  ok=0
  for attempt in 1 2 3; do  # a mirror hiccup should not fail CI: retry twice
    if { $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
         $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
           slurmctld slurmd slurm-client munge; } >"$log" 2>&1; then
      ok=1; break
    fi
    echo "slurm-setup: apt-get attempt $attempt failed; retrying" >&2; sleep $((attempt * 10))
  done
  if [ $ok != 1 ]; then
    echo "slurm-setup: apt-get failed:" >&2; tail -30 "$log" >&2; exit 1
  fi
  rm -f "$log"
  echo "slurm-setup: installed Slurm $(slurm_version)"
fi
for f in start-local-slurm stop-local-slurm slurm.conf.in; do
  [ -f "$slurm_dir/$f" ] || { echo "slurm-setup: $slurm_dir/$f missing (set HPCDP_SLURM_DIR)" >&2; exit 1; }
done
echo "slurm-setup: local Slurm starter found in $slurm_dir"

#!/usr/bin/env bash
# Install Debian's Slurm (controller, node daemon, client commands) and munge for the
# job-script tests, when they are missing. tests/run_slurm.sh runs this first; so the
# README's test command installs what it needs on a bare Debian/Ubuntu machine.
#
#   bash tests/slurm/install-slurm.sh            # as root: apt-get install when missing
#   bash tests/slurm/install-slurm.sh --dry-run  # say what would be done, change nothing
#
# Exit status: 0 installed (or already there; --dry-run: always); 1 apt-get failed
# (its last lines are printed); 3 no apt-get here; 4 missing and not root (the
# message says what to run). "Installed" is local-slurm.sh's check, honouring
# HPCDP_SLURM_SBIN and PATH.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PACKAGES=(slurmctld slurmd slurm-client munge)
# It waits up to 10 min for another apt-get (tests/run_all.sh installs the other groups'
# packages in the background) instead of failing on dpkg's lock.
LOCK="-o DPkg::Lock::Timeout=600"
APT="apt-get update -qq $LOCK && apt-get install -y -qq --no-install-recommends ${PACKAGES[*]} $LOCK"
dry=0
case ${1:-} in
  --dry-run) dry=1 ;;
  "") ;;
  *) echo "usage: install-slurm.sh [--dry-run]" >&2; exit 64 ;;
esac

say() { echo "install-slurm: $*"; }
# Not `sbatch --version`: without a slurm.conf (local-slurm.sh writes it) it fails.
version() { dpkg-query -W -f '${Version}' slurm-client 2>/dev/null || echo '?'; }

if missing=$(bash "$here/local-slurm.sh" check); then
  say "Slurm is installed ($(version))"
  exit 0
fi
say "missing: $missing"
if ! command -v apt-get >/dev/null; then
  say "no apt-get on this machine: install Slurm (slurmctld, slurmd, the client commands) and munge with its package manager, then rerun"
  exit 3
fi
if [ $dry = 1 ]; then
  say "would run (as root): $APT"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  say "installing Slurm needs root; run: sudo bash tests/slurm/install-slurm.sh   (that is: $APT), then rerun the tests"
  exit 4
fi
log=$(mktemp)
# policy-rc.d in containers keeps the packages' services from starting; fine:
# local-slurm.sh runs the daemons itself, without systemd.
for attempt in 1 2 3; do  # a mirror hiccup should not fail the run: retry twice
  if env DEBIAN_FRONTEND=noninteractive bash -c "$APT" >"$log" 2>&1; then
    rm -f "$log"
    say "installed Slurm $(version)"
    exit 0
  fi
  say "apt-get attempt $attempt of 3 failed" >&2
  [ $attempt -lt 3 ] && sleep $((attempt * 10))
done
say "apt-get failed; its last lines:" >&2
tail -30 "$log" >&2
rm -f "$log"
exit 1

#!/usr/bin/env bash
# The job-script tests (tests/slurm) on a real one-node Slurm, in under 3 minutes:
#   start the local Slurm (30 s at most) -> pytest tests/slurm (125 s) -> cancel leftover jobs and stop (25 s).
# Installs nothing: .ci/slurm-setup.sh installs Debian's Slurm and munge first.
# The starter is ../shared/slurm/start-local-slurm beside the repository, or
# $HPCDP_SLURM_DIR. A Slurm that already answers is used as is and left running;
# one started here is stopped on every exit (trap). Daemons that do not come up fail
# the run with the starter's output and the daemon logs.
# Usage: bash tests/run_slurm.sh [extra pytest args]   (env: PYTHON=.venv/bin/python)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HPCDP_SLURM_DIR=$(realpath -m "${HPCDP_SLURM_DIR:-../shared/slurm}")
export HPCDP_SLURM_REQUIRED=1   # in here, a missing Slurm is a failure, not a skip
export NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYTHONUNBUFFERED=1

fail() { echo "=== Slurm tests FAILED: $*"; exit 1; }
command -v sbatch >/dev/null || fail "Slurm is not installed (run: bash .ci/slurm-setup.sh)"
[ -f "$HPCDP_SLURM_DIR/start-local-slurm" ] || fail "no start-local-slurm in $HPCDP_SLURM_DIR (set HPCDP_SLURM_DIR)"

if timeout 10 sinfo -h -o %T 2>/dev/null | grep -q idle; then
  echo "=== using the Slurm that is already running"
else
  stop_slurm() {
    trap '' PIPE  # a closed output pipe must not cut the cleanup short
    # Every job on this Slurm is ours: cancel what is left and let the steps end
    # (10 s at most) while munge still runs, else slurmstepd hangs on to the node.
    local left
    left=$(timeout 5 squeue -h -o %i 2>/dev/null)
    [ -n "$left" ] && timeout 5 scancel $left
    for _ in $(seq 1 20); do
      [ -z "$(timeout 5 squeue -h 2>/dev/null)" ] && ! pgrep -x slurmstepd >/dev/null && break
      sleep 0.5
    done
    echo "=== stopping the local Slurm"
    timeout 10 bash "$HPCDP_SLURM_DIR/stop-local-slurm"
    # The daemons exit a moment after the stop: wait (5 s at most) so a rerun can start.
    for _ in $(seq 1 10); do
      pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || return 0
      sleep 0.5
    done
    echo "=== (Slurm daemons still exiting)"
  }
  trap stop_slurm EXIT
  trap 'exit 130' INT TERM HUP  # a signal exits through the EXIT trap as well
  echo "=== starting the local Slurm ($HPCDP_SLURM_DIR/start-local-slurm)"
  if ! timeout 30 bash "$HPCDP_SLURM_DIR/start-local-slurm"; then
    for f in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log; do
      echo "--- tail of $f"; tail -20 "$f" 2>/dev/null || echo "(missing)"
    done
    fail "the Slurm daemons did not come up (see above)"
  fi
fi

# SIGINT first: pytest then runs its teardown, which cancels jobs still in the queue.
timeout -s INT -k 10 125 "$PY" -m pytest tests/slurm -q -p no:cacheprovider --timeout=120 "$@"
rc=$?
[ $rc -eq 0 ] || fail "pytest tests/slurm exit $rc$([ $rc -eq 124 ] && echo ', timed out')"
echo "=== Slurm tests passed"

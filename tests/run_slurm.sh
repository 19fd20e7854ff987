#!/usr/bin/env bash
# The job-script tests (tests/slurm) on a real one-node Slurm, in about 5 minutes:
#   install Slurm + munge if missing (tests/slurm/install-slurm.sh; apt-get, as root)
#   -> make sure a Slurm answers (tests/slurm/local-slurm.sh start: uses one that
#      already answers, else starts munged/slurmctld/slurmd on loopback, < 1 s)
#   -> pytest tests/slurm (240 s at most) -> stop the Slurm if this run started it.
# Everything it needs is in this repository. A Slurm that already answers is used as
# is and left running. A missing Slurm is a failure with the command to run, not a skip.
# Usage: bash tests/run_slurm.sh [extra pytest args]   (env: PYTHON=.venv/bin/python)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HPCDP_SLURM_REQUIRED=1   # in here, a missing Slurm is a failure, not a skip
export NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYTHONUNBUFFERED=1

fail() { echo "=== Slurm tests FAILED: $*"; exit 1; }

bash tests/slurm/install-slurm.sh || fail "Slurm is not installed (see the line above for what to run)"

# The holder is this shell: stop acts only if this run's start started the daemons.
trap 'trap "" PIPE; timeout 120 bash tests/slurm/local-slurm.sh stop --holder $$' EXIT
trap 'exit 130' INT TERM HUP  # a signal exits through the EXIT trap as well
timeout 150 bash tests/slurm/local-slurm.sh start --holder $$ || fail "no Slurm to run the job scripts on (see above)"

# SIGINT first: pytest then runs its teardown, which cancels jobs still in the queue.
timeout -s INT -k 10 240 "$PY" -m pytest tests/slurm -q -p no:cacheprovider --timeout=235 "$@"
rc=$?
[ $rc -eq 0 ] || fail "pytest tests/slurm exit $rc$([ $rc -eq 124 ] && echo ', timed out')"
echo "=== Slurm tests passed"

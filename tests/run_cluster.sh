#!/usr/bin/env bash
# The emulated-cluster tests (tests/cluster): several nodes on this machine, each a network
# namespace joined by veth links on a bridge (tests/cluster/cluster.sh), real mpiexec jobs
# whose inter-node traffic crosses those links (tests/cluster/mpiexec), and a two-node Slurm
# on them (tests/cluster/slurm.sh). About 6 minutes on 2 cores at a load of 11-13.
# Needs root (namespaces, links, /etc/hosts lines) and iproute2 (installed with
# apt-get when missing). Every namespace, link and hosts line it made is removed at the
# end, whatever happened (also after Ctrl-C).
# Usage: bash tests/run_cluster.sh [extra pytest args]   (env: PYTHON=.venv/bin/python)
# Exit status: 0 passed; 1 failed; 77 not root (nothing was run: run it as root).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYTHONUNBUFFERED=1
if [ "$(id -u)" != 0 ]; then
  echo "=== emulated-cluster tests NOT RUN: they need root (network namespaces); run: sudo bash tests/run_cluster.sh"
  exit 77
fi
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "=== installing iproute2 (ip, tc)"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq update >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -qq install -y iproute2 >/dev/null ||
    { echo "=== emulated-cluster tests FAILED: iproute2 is missing and could not be installed (apt-get install iproute2)"; exit 1; }
fi
# the two-node Slurm's tests (tests/cluster/test_cluster_slurm.py) need Debian's Slurm and munge
bash tests/slurm/install-slurm.sh >/dev/null ||
  { echo "=== emulated-cluster tests FAILED: Slurm is missing and could not be installed (bash tests/slurm/install-slurm.sh)"; exit 1; }
# the link cut under failure.on_rank_loss = "continue" (tests/cluster/test_cluster_ulfm_link.py)
# runs Open MPI 5 from the ULFM group's venv; it is skipped, with this line's reason, only
# when that venv cannot be made
export HPCDP_ULFM_VENV=${HPCDP_ULFM_VENV:-.venv-ulfm}
bash tests/ulfm/setup_venv_ulfm.sh ||
  echo "=== the ULFM venv could not be made: the emulated cluster's link-cut test under \"continue\" is skipped"
trap 'bash tests/cluster/slurm.sh down >/dev/null 2>&1; bash tests/cluster/cluster.sh down >/dev/null 2>&1' EXIT
trap 'exit 130' INT TERM HUP  # a signal exits through the EXIT trap as well
timeout -s INT -k 20 900 "$PY" -m pytest tests/cluster -q -p no:cacheprovider --timeout=500 "$@"
rc=$?
[ $rc -eq 0 ] || { echo "=== emulated-cluster tests FAILED (pytest exit $rc$([ $rc -eq 124 ] && echo ', timed out'))"; exit 1; }
echo "=== emulated-cluster tests passed"

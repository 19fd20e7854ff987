#!/usr/bin/env bash
# The quick check (a few minutes on 2 cores), beside the full one (bash tests/run_all.sh,
# 30-55 minutes): after a change, before the full suite. Nothing installed by hand, no
# root, no Slurm, no network namespaces: the README's install when .venv is missing
# (tests/setup_venv.sh), then
#   1. the config, the run's outputs, the commands' help and the import layers, and
#      every README/docs command checked at --help level (one process)
#   2. DDP's gradients, buckets and overlap on 2 ranks under mpiexec (tests/mpi/test_ddp.py)
#   3. one real failure: rank 1 of a 2-rank job raises; the job ends with one line
# Exit status non-zero if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bash tests/setup_venv.sh || { echo "FAILED: no Python environment to test with (see above)"; exit 1; }
PY=${PYTHON:-.venv/bin/python}
export PATH="$(cd "$(dirname "$(command -v "$PY")")" && pwd):$PATH"
export NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYTHONUNBUFFERED=1
failed=()
echo "== quick: config, outputs, help, layers, documented commands (one process)"
timeout 900 "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_config.py tests/unit/test_config_applies.py \
  tests/unit/test_layers.py tests/unit/test_docs_commands.py tests/unit/test_readme_commands.py \
  tests/unit/test_run_outputs.py -k "not quick_commands and not readme_checkpoint and not another_ranks_death" \
  || failed+=(unit)
echo "== quick: DDP on 2 ranks"
PYTHON="$PY" RANKS=2 MPI_TIMEOUT=600 bash tests/run_mpi.sh tests/mpi/test_ddp.py || failed+=(mpi)
echo "== quick: one failing rank ends the job"
timeout 600 "$PY" -m pytest -q -p no:cacheprovider tests/faults/test_faults.py -k "raise and ddp" || failed+=(faults)
if [ ${#failed[@]} -gt 0 ]; then
  echo "quick check FAILED: ${failed[*]}"
  exit 1
fi
echo "quick check passed (the full suite: bash tests/run_all.sh)"

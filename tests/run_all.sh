#!/usr/bin/env bash
# Every test hpcdp has, each group under a timeout so a stuck rank cannot hang CI.
# It is the README's test command and CI's (.ci/run), and needs nothing installed by
# hand: first it makes sure .venv has hpcdp and its test extras (tests/setup_venv.sh:
# the README's install command when .venv is missing or incomplete), then:
#   1. tests/unit  - one process, no MPI launcher
#   2. tests/cuda  - the numba.cuda kernels, on the CUDA simulator unless HPCDP_REAL_GPU=1
#   3. tests/mpi   - pytest-mpi under mpiexec with 1, 2, 3 and 4 ranks (tests/run_mpi.sh)
#   4. tests/slurm - jobs/train.sbatch and train_continue.sbatch under a real local Slurm (tests/run_slurm.sh:
#                    installs Debian's Slurm + munge when missing, as root, and
#                    starts a one-node Slurm on loopback unless one answers)
#   5. tests/cluster - an emulated cluster: nodes are network namespaces joined by veth
#                    links (tests/run_cluster.sh: as root; iproute2 installed if missing;
#                    every namespace, link and hosts line removed at the end), ~3 min
#   6. parallel HDF5 - the shared-layout checkpoint tests on 2-4 ranks of Debian's
#                    Open MPI, in a second venv (.venv-phdf5) with h5py built for MPI
#                    (.ci/parallel-hdf5.sh --test: apt-get as root, ~3 min the first time)
#   7. transformers - hpcdp's GPT against transformers' GPT2LMHeadModel both ways
#                    (export, model.init_from, a BPE tokenizer) with PyTorch CPU in a third
#                    venv, test-only (tests/hf/setup_venv_hf.sh: .venv-hf, ~5 min the first time)
#   8. ULFM continue - failure.on_rank_loss = "continue": a rank killed with SIGKILL and the
#                    survivors training on (the jobs/ scripts, exact mode against a resumed
#                    smaller run, a kill mid-save, hybrid ZeRO losing a node of 3), under Open MPI 5's `mpirun --with-ft ulfm` in a
#                    fourth venv (tests/ulfm/setup_venv_ulfm.sh: .venv-ulfm, ~1 min the first time);
#                    also the scaling-study job script with that Open MPI's mpiexec
# Exit status is non-zero if any group failed; every group runs regardless.
set -uo pipefail
cd "$(dirname "$0")/.."
# Everything is also kept in a log, so the end of the run can repeat what failed: a CI
# page that shows only the last lines then still names the failing tests.
runlog=$(mktemp "${TMPDIR:-/tmp}/hpcdp-run.XXXXXX")
exec 3>&1 4>&2 > >(tee "$runlog") 2>&1
teepid=$!
echo "== test environment"
bash tests/setup_venv.sh || { echo "FAILED: no Python environment to test with (see above)"; exit 1; }
PY=${PYTHON:-.venv/bin/python}
# As an activated venv would: its mpiexec (the MPICH wheel's, the MPI mpi4py was built
# for) and hpcdp come first on PATH, before a system MPI's.
export PATH="$(cd "$(dirname "$(command -v "$PY")")" && pwd):$PATH"
# One thread per process: several ranks share the cores.
export NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYTHONUNBUFFERED=1

# Each group's header says how far into the run it starts (CI's time budget is per run).
section() { echo "== $* [at $((SECONDS / 60)) min $((SECONDS % 60)) s]"; }

# The later groups' environments (apt packages for parallel HDF5 and Slurm, an h5py built
# for MPI, the PyTorch and Open MPI 5 venvs: ~10 min on a fresh 2-core machine, mostly
# one core compiling or downloading) are prepared in the background while the unit tests
# run on the other core; the Slurm group waits for them and prints what they said.
prep_log=$(mktemp "${TMPDIR:-/tmp}/hpcdp-prep.XXXXXX")
(
  bash .ci/parallel-hdf5.sh || echo "prepare: parallel HDF5 setup failed (exit $?); its group will say why"
  [ "$(id -u)" -ne 0 ] || bash tests/slurm/install-slurm.sh || echo "prepare: Slurm install failed; its group will say why"
  bash tests/hf/setup_venv_hf.sh || echo "prepare: .venv-hf setup failed; its group will say why"
  bash tests/ulfm/setup_venv_ulfm.sh || echo "prepare: .venv-ulfm setup failed; its group will say why"
) >"$prep_log" 2>&1 </dev/null &
prep_pid=$!
echo "== preparing the other groups' environments in the background (pid $prep_pid, log $prep_log)"

failed=()
section "unit tests"
timeout 1500 "$PY" -m pytest tests/unit -q -p no:cacheprovider || failed+=(unit)

section "CUDA kernel tests"
if [ "${HPCDP_REAL_GPU:-0}" = 1 ]; then
  timeout 900 "$PY" -m pytest tests/cuda -q -p no:cacheprovider || failed+=(cuda)
else
  # The simulator runs every kernel thread in Python, one core per process: two workers
  # (pytest-xdist) use both cores of a 2-core CI machine (7.3 -> ~4 min there).
  NUMBA_ENABLE_CUDASIM=1 timeout 900 "$PY" -m pytest tests/cuda -q -p no:cacheprovider -n 2 || failed+=(cuda-sim)
fi

section "MPI tests (1, 2, 3, 4 ranks)"
PYTHON="$PY" bash tests/run_mpi.sh || failed+=(mpi)

section "fault injection (real mpiexec jobs, one rank broken)"
timeout 900 "$PY" -m pytest tests/faults -q -p no:cacheprovider || failed+=(faults)

section "the background preparation (started before the unit tests)"
wait "$prep_pid"
sed 's/^/   /' "$prep_log"; rm -f "$prep_log"

section "Slurm job-script tests (a local one-node Slurm)"
PYTHON="$PY" bash tests/run_slurm.sh || failed+=(slurm)

section "emulated cluster (network namespaces joined by veth links, real mpiexec jobs across them)"
PYTHON="$PY" bash tests/run_cluster.sh
case $? in
  0) ;;
  77) echo "   (not counted as failed: this run is not root; the line above says what to run)" ;;
  *) failed+=(cluster) ;;
esac

section "parallel HDF5 checkpoints (Open MPI + h5py mpio, a second venv)"
bash .ci/parallel-hdf5.sh --test || failed+=(parallel-hdf5)

section "transformers interop (PyTorch CPU + transformers in .venv-hf)"
{ bash tests/hf/setup_venv_hf.sh &&
  HPCDP_HF_PYTHON=.venv-hf/bin/python timeout 900 "$PY" -m pytest tests/hf -q -p no:cacheprovider; } || failed+=(transformers)

section "ULFM continue (Open MPI 5 --with-ft ulfm in .venv-ulfm: a rank killed, the survivors go on)"
{ bash tests/ulfm/setup_venv_ulfm.sh &&
  HPCDP_ULFM_VENV=.venv-ulfm timeout 600 "$PY" -m pytest tests/ulfm -q -p no:cacheprovider; } || failed+=(ulfm)

section "end"
# Back to the original output; tee gets 10 s to write the rest of the log (a daemon a
# group left running could hold its pipe open: then it is stopped, not waited for).
exec >&3 2>&4 3>&- 4>&-
for _ in $(seq 50); do kill -0 "$teepid" 2>/dev/null || break; sleep 0.2; done
kill "$teepid" 2>/dev/null
if [ ${#failed[@]} -gt 0 ]; then
  echo "what failed, as the groups above said it (FAILED / ERROR / timed out lines):"
  grep -a -E "FAILED|ERROR|timed out|Timeout" "$runlog" | grep -a -v -E "^== |^   prepare" | sort | uniq -c | tail -40
  echo "FAILED groups: ${failed[*]}"
  rm -f "$runlog"
  exit 1
fi
rm -f "$runlog"
echo "all test groups passed"

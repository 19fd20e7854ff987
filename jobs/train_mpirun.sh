#!/bin/bash
# hpcdp training with a plain mpirun/mpiexec (a workstation or a cluster without Slurm).
#
#   bash jobs/train_mpirun.sh                                  # jobs/digits_ddp.toml on 4 ranks
#   HPCDP_NP=8 HPCDP_HOSTFILE=hosts bash jobs/train_mpirun.sh --config jobs/gpt_ddp.toml --set optim.lr=0.003
#   HPCDP_CONFIG=jobs/gpt_ddp.toml HPCDP_SET="train.steps=200" bash jobs/train_mpirun.sh
#   HPCDP_PYTHON=$HOME/venvs/hpcdp/bin/python bash jobs/train_mpirun.sh   # no activated venv
#
# Script arguments:
#   --config FILE          TOML job file (default: $HPCDP_CONFIG, else jobs/digits_ddp.toml)
#   --set SECTION.KEY=V    one config override, repeatable; passed to hpcdp train as is
# Environment:
#   HPCDP_NP               number of ranks (default 4)
#   HPCDP_THREADS          threads per rank (default 1: OMP/NUMBA/OPENBLAS/MKL_NUM_THREADS)
#   HPCDP_CONFIG, HPCDP_SET, HPCDP_PYTHON, HPCDP_MPIEXEC, HPCDP_RUN_ROOT: as in jobs/train.sbatch
#   HPCDP_HOSTFILE         hosts file passed as -hostfile (MPICH and Open MPI both read it)
#   HPCDP_MPIEXEC_ARGS     extra launcher arguments, split on spaces (e.g. "--bind-to core")
#   HPCDP_TIMEOUT          seconds; kill the whole launch after this long (default: no limit)
#   HPCDP_JOB_ID           names the run directory: $HPCDP_RUN_ROOT/mpirun-<id>
#                          (default: <YYYYmmdd-HHMMSS>-<pid of this script>)
# Exit status: the launcher's (non-zero when any rank fails; 124 after HPCDP_TIMEOUT);
# 64 for a bad argument of this script, 127 when hpcdp or mpiexec cannot be found.
set -uo pipefail

die() { echo "train_mpirun.sh: error: $2" >&2; exit "$1"; }

config=${HPCDP_CONFIG:-jobs/digits_ddp.toml}
# HPCDP_SET is split on whitespace on purpose: one override per word.
read -r -a sets <<< "${HPCDP_SET:-}"
while [ $# -gt 0 ]; do
  case $1 in
    --config) [ $# -ge 2 ] || die 64 "--config needs a file"; config=$2; shift 2 ;;
    --config=*) config=${1#--config=}; shift ;;
    --set) [ $# -ge 2 ] || die 64 "--set needs SECTION.KEY=VALUE"; sets+=("$2"); shift 2 ;;
    --set=*) sets+=("${1#--set=}"); shift ;;
    *) die 64 "unknown argument '$1'; use --config FILE and --set SECTION.KEY=VALUE" ;;
  esac
done
[ -f "$config" ] || die 64 "config file '$config' not found (from $PWD); pass --config FILE or set HPCDP_CONFIG"
np=${HPCDP_NP:-4}
threads=${HPCDP_THREADS:-1}
[[ $np =~ ^[1-9][0-9]*$ ]] || die 64 "HPCDP_NP='$np': needs a whole number >= 1"
[[ $threads =~ ^[1-9][0-9]*$ ]] || die 64 "HPCDP_THREADS='$threads': needs a whole number >= 1"
[[ ${HPCDP_TIMEOUT:-1} =~ ^[1-9][0-9]*$ ]] || die 64 "HPCDP_TIMEOUT='$HPCDP_TIMEOUT': needs seconds >= 1"

export OMP_NUM_THREADS=$threads NUMBA_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
export PYTHONUNBUFFERED=1

if [ -n "${HPCDP_PYTHON:-}" ]; then
  [ -x "$HPCDP_PYTHON" ] || die 127 "HPCDP_PYTHON='$HPCDP_PYTHON' is not an executable python"
  hpcdp=("$HPCDP_PYTHON" -m hpcdp.cli)
  "$HPCDP_PYTHON" -c "import hpcdp" 2>/dev/null \
    || die 127 "$HPCDP_PYTHON cannot import hpcdp; run 'pip install -e .' in that venv"
elif command -v hpcdp >/dev/null; then
  hpcdp=(hpcdp)
else
  die 127 "no 'hpcdp' command on PATH; activate the venv or set HPCDP_PYTHON=/path/to/venv/bin/python"
fi

mpiexec=${HPCDP_MPIEXEC:-}
if [ -z "$mpiexec" ] && [ -n "${HPCDP_PYTHON:-}" ] && [ -x "$(dirname "$HPCDP_PYTHON")/mpiexec" ]; then
  mpiexec=$(dirname "$HPCDP_PYTHON")/mpiexec
fi
mpiexec=${mpiexec:-mpiexec}
command -v "$mpiexec" >/dev/null || die 127 "'$mpiexec' not found; install an MPI (pip install 'hpcdp[mpi]') or set HPCDP_MPIEXEC"

launch=("$mpiexec" -n "$np")
[ -n "${HPCDP_HOSTFILE:-}" ] && launch+=(-hostfile "$HPCDP_HOSTFILE")
# Open MPI does not forward the environment to other hosts unless told (MPICH does).
if "$mpiexec" --version 2>/dev/null | grep -q "Open MPI"; then
  for v in OMP_NUM_THREADS NUMBA_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS PYTHONUNBUFFERED PATH; do
    launch+=(-x "$v")
  done
fi
read -r -a extra <<< "${HPCDP_MPIEXEC_ARGS:-}"
launch+=("${extra[@]}")
[ -n "${HPCDP_TIMEOUT:-}" ] && launch=(timeout --kill-after=10 "$HPCDP_TIMEOUT" "${launch[@]}")

job=${HPCDP_JOB_ID:-$(date +%Y%m%d-%H%M%S)-$$}
run_dir=$(realpath -m "${HPCDP_RUN_ROOT:-runs}/mpirun-$job")
args=(train --config "$config" --set "run.out_dir=\"$run_dir\"")
for s in "${sets[@]}"; do
  case $s in run.out_dir=*) run_dir="(run.out_dir as set: ${s#run.out_dir=})" ;; esac
  args+=(--set "$s")  # later overrides win: a user's run.out_dir replaces the script's
done

echo "hpcdp: $np rank(s), $threads thread(s) per rank; run dir $run_dir"
echo "+ ${launch[*]} ${hpcdp[*]} ${args[*]}"
"${launch[@]}" "${hpcdp[@]}" "${args[@]}"
rc=$?
if [ $rc -ne 0 ]; then
  echo "hpcdp: training failed (exit $rc$([ $rc -eq 124 ] && echo ", timed out after ${HPCDP_TIMEOUT}s")); the lines above say why" >&2
fi
exit $rc

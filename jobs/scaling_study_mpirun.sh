#!/bin/bash
# The scaling study of jobs/scaling_study.sbatch with a plain mpirun/mpiexec (a workstation,
# or a cluster without Slurm): every point one mpiexec launch, every point in one results
# folder, the table and plot of `hpcdp scale` with the cost model's prediction beside each.
#
#   bash jobs/scaling_study_mpirun.sh --config jobs/gpt_ddp.toml --ranks 1,2 --profile dev-vm
#   HPCDP_HOSTFILE=hosts HPCDP_RANKS_PER_NODE=4 bash jobs/scaling_study_mpirun.sh \
#       --config jobs/gpt_ddp.toml --nodes 1,2,4
#
# Arguments: those of `hpcdp scale`, as in jobs/scaling_study.sbatch (without --profile
# the study first calibrates a profile on this machine / these hosts).
# Environment:
#   HPCDP_PYTHON, HPCDP_RUN_ROOT, HPCDP_OVERLAP   as in jobs/scaling_study.sbatch
#   HPCDP_MPIEXEC        the mpiexec to use (default: next to HPCDP_PYTHON, else on PATH)
#   HPCDP_HOSTFILE       hosts file, passed as -hostfile (MPICH and Open MPI both read it)
#   HPCDP_RANKS_PER_NODE ranks per host (also what hpcdp's hierarchical allreduce uses);
#                        with a hostfile, passed to mpiexec as -ppn (MPICH) / --npernode (Open MPI)
#   HPCDP_JOB_ID         names the results folder: $HPCDP_RUN_ROOT/scaling-<id>
#                        (default: <YYYYmmdd-HHMMSS>-<pid of this script>)
#   HPCDP_TIMEOUT        seconds for each point (default 900)
# Exit status: the study's; a study with a failed point still gets the table and plot of
# the points that finished (after a kill: hpcdp scale --collect <results folder>).
set -uo pipefail

die() { echo "scaling_study_mpirun.sh: error: $2" >&2; exit "$1"; }

if [ -n "${HPCDP_PYTHON:-}" ]; then
  [ -x "$HPCDP_PYTHON" ] || die 127 "HPCDP_PYTHON='$HPCDP_PYTHON' is not an executable python"
  hpcdp=("$HPCDP_PYTHON" -m hpcdp.cli)
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

has() { local a; for a in "${args[@]}"; do [[ $a == "$1" || $a == "$1="* ]] && return 0; done; return 1; }
args=("$@")
has --config || die 64 "--config FILE is required (the training config to study)"
has --out && die 64 "--out is set by this script (the results folder); use HPCDP_RUN_ROOT"
has --launcher && die 64 "--launcher is set by this script; use HPCDP_MPIEXEC / HPCDP_HOSTFILE"
ppn=${HPCDP_RANKS_PER_NODE:-}
[ -z "$ppn" ] || [[ $ppn =~ ^[1-9][0-9]*$ ]] || die 64 "HPCDP_RANKS_PER_NODE='$ppn': needs a whole number >= 1"
[[ ${HPCDP_TIMEOUT:-900} =~ ^[1-9][0-9]*$ ]] || die 64 "HPCDP_TIMEOUT='$HPCDP_TIMEOUT': needs seconds >= 1"
[ -n "$ppn" ] && ! has --ranks-per-node && args+=(--ranks-per-node "$ppn")
export OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1

launcher="$mpiexec -n {n}"
if [ -n "${HPCDP_HOSTFILE:-}" ]; then
  [ -f "$HPCDP_HOSTFILE" ] || die 64 "HPCDP_HOSTFILE='$HPCDP_HOSTFILE' is not a file"
  launcher+=" -hostfile $HPCDP_HOSTFILE"
  if [ -n "$ppn" ]; then
    if "$mpiexec" --version 2>/dev/null | grep -q "Open MPI"; then launcher+=" --npernode {ppn}"; else launcher+=" -ppn {ppn}"; fi
  fi
fi
results=$(realpath -m "${HPCDP_RUN_ROOT:-runs}/scaling-${HPCDP_JOB_ID:-$(date +%Y%m%d-%H%M%S)-$$}")
mkdir -p "$results"
echo "hpcdp scaling study: results in $results"
study=(scale "${args[@]}" --launcher "$launcher" --out "$results" --calibrate-first
       --overlap "${HPCDP_OVERLAP:-0}" --timeout "${HPCDP_TIMEOUT:-900}")
# hosts and ranks per host given: without --profile, calibrate the inter-node link too
[ -n "${HPCDP_HOSTFILE:-}" ] && [ -n "$ppn" ] && study+=(--inter)
echo "+ ${hpcdp[*]} ${study[*]}"
"${hpcdp[@]}" "${study[@]}"
rc=$?
[ $rc -eq 0 ] || echo "hpcdp scaling study: failed (exit $rc); the lines above say why" >&2
exit $rc

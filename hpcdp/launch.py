"""Launching child jobs: the one home of the helpers every study, benchmark and check uses.

The tools (``hpcdp scale``, ``hpcdp bench faults|soak|startup|exact|ckpt``, ``hpcdp
check-exact``) run real ``mpiexec -n N hpcdp train`` jobs as child processes. What they
share is here, with one behaviour each:

- :func:`find_mpiexec`: the mpiexec next to this Python first (the venv's MPI matches its
  mpi4py: the MPICH wheel of ``hpcdp[mpi]``), then ``mpiexec`` / ``mpirun`` on PATH;
  none: :class:`LaunchError` (a ValueError, so ``hpcdp`` prints its one line and exits 2).
- :data:`THREAD_VARS` / :data:`THREAD_ENV`: one BLAS/numba/OpenMP thread per rank;
  :data:`CLEARED_ENV`: the OpenBLAS tuning variables a benchmark unsets for every
  contender alike (docs/results.md says so with each figure).
- :func:`child_env`: the environment of a child (one thread per rank, unbuffered output,
  this process's hpcdp importable), less the variables named in ``clear``.
- :func:`hpcdp_command` / :func:`train_command`: how a child runs hpcdp.
- :func:`run_child`: run one child; a failure or timeout is a :class:`ChildFailed` (a
  RuntimeError) naming the command and the tail of its output.
- :func:`parse_ranks`: a ``--ranks 1,2,4`` list; :func:`wait_quiet` / :func:`loadavg`: a
  shared machine's load, recorded with every figure.

Nothing in the library imports this module (it is the lowest module of the tools layer,
docs/architecture.md).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
THREAD_ENV = {var: "1" for var in THREAD_VARS}
CLEARED_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


class LaunchError(ValueError):
    """A child job cannot be launched (no mpiexec, bad --ranks): one line, exit 2."""


class ChildFailed(RuntimeError):
    """A child job failed or timed out; the message holds its command and output's tail."""


RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE")


def launched_rank() -> tuple[int, int]:
    """``(rank, ranks)`` of this process as its launcher (mpiexec, srun) says, without
    initializing MPI; ``(0, 1)`` when not launched."""
    def first(names):
        for var in names:
            if os.environ.get(var, "").isdigit():
                return int(os.environ[var])
        return None
    return first(RANK_VARS) or 0, first(SIZE_VARS) or 1


def local_ranks() -> int | None:
    """How many ranks of this launch share this node, from the launcher's environment
    (MPICH's hydra, Open MPI, PMIx, Slurm's srun), without MPI; None when it does not say."""
    for var in LOCAL_SIZE_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    per_node = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
    if per_node:  # e.g. "2(x3),1": tasks of node 0, 1, 2, 3
        counts = []
        for part in per_node.split(","):
            n, _, rep = part.partition("(x")
            if not n.isdigit():
                return None
            counts += [int(n)] * (int(rep.rstrip(")")) if rep.rstrip(")").isdigit() else 1)
        node = os.environ.get("SLURM_NODEID", "0")
        return counts[int(node)] if node.isdigit() and int(node) < len(counts) else max(counts)
    return None


def find_mpiexec(what: str = "hpcdp") -> str:
    """mpiexec next to this Python first (the venv's MPI matches its mpi4py), then PATH
    (``mpiexec``, then ``mpirun``). ``what`` names the command in the error."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise LaunchError(f"{what}: no mpiexec found next to the Python interpreter "
                          f"({here.parent}) or on PATH; install an MPI (e.g. pip install 'hpcdp[mpi]')")
    return found


def package_root() -> str:
    """The folder that holds this process's ``hpcdp`` package (children import the same)."""
    return str(Path(__file__).resolve().parents[1])


def child_env(extra: dict | None = None, clear=()) -> dict:
    """A child's environment: this one, one thread per rank, unbuffered output, this
    hpcdp first on PYTHONPATH, ``extra`` on top, the variables in ``clear`` unset."""
    env = {**os.environ, **THREAD_ENV, "PYTHONUNBUFFERED": "1", **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root(), env.get("PYTHONPATH")) if p)
    for var in clear:
        env.pop(var, None)
    return env


def hpcdp_command(module: str = "hpcdp.cli") -> list[str]:
    """``python -m MODULE`` with this interpreter (the children run this hpcdp)."""
    return [sys.executable, "-m", module]


def sets_for_job(config, sets) -> list[str]:
    """``sets`` less the strategy options the job does not read: a study or check runs
    several strategies with one list of ``--set`` overrides (the user's, for whichever
    strategy reads them, and its own, e.g. DDP's bucketing variants), and ``hpcdp train``
    refuses an option given by ``--set`` that its strategy does not read
    (hpcdp.config_applies). A config that does not load is left to the job to report."""
    from hpcdp.config import load_config
    from hpcdp.config_error import ConfigError
    from hpcdp.config import parse_override

    sets = list(sets)
    try:
        unread = set(load_config(config, sets, shared_options=True).unread_options)
    except (ConfigError, OSError):
        return sets
    return [s for s in sets if ".".join(parse_override(s)[0]) not in unread]


def train_command(config=None, sets=(), resume: str | None = None, module: str = "hpcdp.cli") -> list[str]:
    """``python -m hpcdp.cli train [--config C] [--set S ...] [--resume R]``; strategy
    options in ``sets`` that the job does not read are left out (:func:`sets_for_job`)."""
    cmd = hpcdp_command(module) + ["train"]
    if config:
        cmd += ["--config", str(config)]
    for s in sets_for_job(config, sets):
        cmd += ["--set", s]
    if resume:
        cmd += ["--resume", resume]
    return cmd


def mpiexec_command(n: int, what: str = "hpcdp") -> list[str]:
    return [find_mpiexec(what), "-n", str(n)]


def run_child(cmd: list, what: str, timeout: float, env: dict | None = None,
              tail: int = 3000, **kwargs) -> subprocess.CompletedProcess:
    """Run one child job and wait for it (at most ``timeout`` seconds); a nonzero exit or
    a timeout raises :class:`ChildFailed` with ``what``, the command and the output's tail."""
    try:
        proc = subprocess.run(cmd, env=env or child_env(), capture_output=True, text=True,
                              timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"{what}: timed out after {timeout:g} s: {shlex.join(map(str, cmd))}") from None
    if proc.returncode != 0:
        raise ChildFailed(f"{what}: {shlex.join(map(str, cmd))} failed (exit {proc.returncode}):\n"
                          f"{(proc.stdout + proc.stderr)[-tail:]}")
    return proc


def launch_train(n: int, config, sets, run_dir: Path, *, timeout: float, resume: str | None = None,
                 clear_env=(), echo: bool = True, what: str = "job",
                 replace: bool = False) -> subprocess.CompletedProcess:
    """``mpiexec -n n hpcdp train`` in a fresh ``run_dir`` (``run.out_dir``), one thread per
    rank, the children importing this hpcdp; ``clear_env``: variables unset for the job.
    An existing ``run_dir`` is a :class:`LaunchError` unless ``replace`` (then it is
    deleted first). A failure or timeout is a :class:`ChildFailed` with the output's tail."""
    run_dir = Path(run_dir)
    if run_dir.exists():
        if not replace:
            raise LaunchError(f"{run_dir} already exists: it holds an earlier job's results")
        shutil.rmtree(run_dir)
    cmd = mpiexec_command(n) + train_command(config, [f'run.out_dir="{run_dir}"', *sets], resume)
    if echo:
        print(f"  $ {shlex.join(cmd)}", flush=True)
    return run_child(cmd, what, timeout, child_env(clear=clear_env), tail=2500)


def parse_ranks(text: str, what: str = "--ranks") -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (order kept, repeats dropped); anything else, or a
    count below 1, is a :class:`LaunchError`."""
    try:
        ranks = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        ranks = []
    if not ranks or min(ranks) < 1:
        raise LaunchError(f"{what} {text!r}: expected a comma-separated list of rank counts >= 1, e.g. 1,2,4")
    return list(dict.fromkeys(ranks))


def loadavg() -> list:
    """The 1, 5 and 15 minute load averages, rounded (empty where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def wait_quiet(limit: float, max_wait: float = 1800.0, poll: float = 10.0) -> None:
    """Wait (at most ``max_wait`` seconds) until the 1-minute load average is below
    ``limit`` (0: do not wait), so a shared machine is measured at its quiet moments."""
    if not limit:
        return
    deadline = time.monotonic() + max_wait
    said = False
    while os.getloadavg()[0] > limit and time.monotonic() < deadline:
        if not said:
            print(f"  waiting for load average < {limit:g} (now {os.getloadavg()[0]:.1f})", flush=True)
            said = True
        time.sleep(poll)


__all__ = ["THREAD_VARS", "THREAD_ENV", "CLEARED_ENV", "LaunchError", "ChildFailed", "find_mpiexec",
           "launched_rank", "local_ranks", "package_root", "child_env", "hpcdp_command", "train_command",
           "sets_for_job", "mpiexec_command", "run_child", "launch_train", "parse_ranks", "loadavg", "wait_quiet"]

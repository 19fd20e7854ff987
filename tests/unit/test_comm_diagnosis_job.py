"""Lazy missing-rank detection names the same rank on every rank (issue: one stalled
rank used to produce a different culprit on each rank, its ring neighbour).

Each scenario is a separately launched job (it must die). Every live rank prints
the ``missing`` list of its CollectiveTimeout, waits a little so the others can
print theirs, then aborts. Run as a script (under mpiexec) this file is that job.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 2.0


def _job(scenario: str):
    import numpy as np
    from mpi4py import MPI

    from hpcdp.comm import CollectiveTimeout, allreduce, get_context, iallreduce
    from hpcdp.failure.ranks import abort_job

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    odd = 1  # the rank that misbehaves
    get_context(comm)
    allreduce(np.ones(4), comm=comm, timeout=30)  # everyone arrives here
    buf = np.ones(1 << 15)
    try:
        if scenario == "stalled":
            # every rank arrives; rank `odd` then stops progressing (like SIGSTOP)
            req = iallreduce(buf, comm=comm, algorithm="ring", timeout=TIMEOUT)
            if rank == odd:
                time.sleep(60)
            req.wait()
        elif scenario == "polled":
            # the others only call test() and expire() at their own deadline (as DDP does)
            if rank == odd:
                time.sleep(60)
            req = iallreduce(buf, comm=comm, algorithm="ring", timeout=TIMEOUT)
            deadline = time.monotonic() + TIMEOUT
            while not req.test():
                if time.monotonic() > deadline:
                    req.expire()
        elif scenario == "lean":
            # a small call (the lean path: one MPI call + a deadline poll)
            if rank == odd:
                time.sleep(60)
            allreduce(np.ones(2), comm=comm, timeout=TIMEOUT)
        elif scenario == "late":
            # rank `odd` arrives after the others concluded: it must agree with them
            if rank == odd:
                time.sleep(TIMEOUT + 3)
            allreduce(buf, comm=comm, algorithm="recursive", timeout=30 if rank == odd else TIMEOUT)
        print(f"rank {rank} completed", flush=True)
    except CollectiveTimeout as err:
        print(f"rank {rank} missing {err.missing} waited {err.waited:.1f}: {err}", flush=True)
        time.sleep(4)  # let the other ranks print theirs
        abort_job(7)  # after the launcher has read the line above (hpcdp.failure.ranks)


@pytest.mark.parametrize("scenario,ranks", [("stalled", 4), ("polled", 3), ("lean", 3), ("late", 3)])
def test_every_rank_names_the_same_missing_rank(scenario, ranks):
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    start = time.monotonic()
    proc = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, __file__, scenario],
                          capture_output=True, text=True, timeout=120, env=env)
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    verdicts = dict(re.findall(r"rank (\d+) missing (\[[0-9, ]*\])", out))
    live = {str(r) for r in range(ranks) if r != 1}
    if scenario == "late":
        live.add("1")  # it arrives, late, and joins the others' verdict
    assert set(verdicts) == live, out
    assert set(verdicts.values()) == {"[1]"}, out
    assert "ranks [1] never arrived" in out and f"timed out after {TIMEOUT:g}s" in out, out
    assert "completed" not in out, out
    assert elapsed < 100, f"took {elapsed:.0f}s"


if __name__ == "__main__":
    _job(sys.argv[1])

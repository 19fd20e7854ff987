"""A rank that never calls a collective ends the job with CollectiveTimeout
naming it, in seconds, not minutes; the job is launched separately because it
must die. Run as a script (under mpiexec) this file is that job."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _job():
    import numpy as np
    from mpi4py import MPI

    from hpcdp.comm import CollectiveTimeout, allreduce, get_context

    from hpcdp.failure.ranks import abort_job

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    get_context(comm)  # collective setup done by everyone
    allreduce(np.ones(4), comm=comm, timeout=5)  # everyone arrives here
    # the timed collective once with everyone present: a fresh clone's first compiled
    # call compiles the engine (seconds per rank, more on a loaded machine), which is
    # not what the test times
    allreduce(np.ones(1 << 16), comm=comm, timeout=300, algorithm=sys.argv[1])
    if rank == 0:
        print(f"straggling from {time.monotonic():.3f}", flush=True)
    if rank == size - 1:
        time.sleep(60)  # the straggler never calls the next collective
    try:
        allreduce(np.ones(1 << 16), comm=comm, timeout=float(sys.argv[2]),
                  algorithm=sys.argv[1])
    except CollectiveTimeout as err:
        print(f"rank {rank} caught: {err}", flush=True)
        abort_job(7)  # after the launcher has read the line above (hpcdp.failure.ranks)


@pytest.mark.parametrize("algorithm,engine", [("ring", "python"), ("recursive", "python"),
                                              ("ring", "compiled")])
def test_rank_that_never_calls_ends_the_job(algorithm, engine):
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")  # this Python's MPI first
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1",
               HPCDP_COMM_ENGINE=engine)
    proc = subprocess.run([mpiexec, "-n", "3", sys.executable, __file__, algorithm, "2"],
                          capture_output=True, text=True, timeout=600, env=env)
    end = time.monotonic()  # (CLOCK_MONOTONIC: the job's ranks read the same clock)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "ranks [2] never arrived" in out, out
    assert "timed out after 2s" in out, out
    (start,) = re.findall(r"straggling from ([0-9.]+)", out)
    # from the moment the straggler stops calling to the job's end: the 2 s deadline,
    # the diagnosis and the abort, not the straggler's 60 s sleep
    assert end - float(start) < 40, f"took {end - float(start):.0f}s after the straggler stopped"


if __name__ == "__main__":
    _job()

"""A rank that never calls a hierarchical allreduce ends the job with CollectiveTimeout
naming it, whether the node layout is still to be built (first call) or the phases run
on sub-communicators (later calls: the ranks named are those of the whole
communicator). 4 ranks as 2 nodes x 2; the job must die, so it is launched separately.
Run as a script (under mpiexec) this file is that job."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _job(when: str):
    import numpy as np
    from mpi4py import MPI

    from hpcdp.comm import CollectiveTimeout, allreduce, get_context

    from hpcdp.failure.ranks import abort_job

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    get_context(comm)
    if when == "later":  # the layout is built by everyone first
        allreduce(np.ones(8), comm=comm, algorithm="hierarchical", timeout=20)
    if rank == size - 1:
        time.sleep(60)  # the straggler never calls the next one
    try:
        allreduce(np.ones(1 << 12), comm=comm, algorithm="hierarchical", timeout=2)
    except CollectiveTimeout as err:
        print(f"rank {rank} caught: {err}", flush=True)
        abort_job(7)  # after the launcher has read the line above (hpcdp.failure.ranks)


@pytest.mark.parametrize("when", ["first", "later"])
def test_missing_rank_is_named(when):
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    if not os.path.exists(mpiexec):
        mpiexec = shutil.which("mpiexec")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1",
               HPCDP_RANKS_PER_NODE="2")
    proc = subprocess.run([mpiexec, "-n", "4", sys.executable, __file__, when],
                          capture_output=True, text=True, timeout=90, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    caught = [line for line in out.splitlines() if " caught: " in line]
    assert caught, out
    for line in caught:  # every report names rank 3, the one that never came
        assert "ranks [3] never arrived" in line, out
    if when == "first":
        assert "topology setup" in caught[0], out  # the node layout, built by hpcdp.comm's front
    else:
        assert "collective 'allreduce'" in caught[0] and "timed out after 2s" in caught[0], out


if __name__ == "__main__":
    _job(sys.argv[1])

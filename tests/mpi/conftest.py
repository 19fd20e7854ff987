"""Multi-rank test harness for tests/mpi (run under mpiexec with --with-mpi).

Every rank runs the same tests in the same order. After each test, the ranks
agree on the outcome with a guarded exchange (each rank sends its pass/fail flag
to every other rank on a private duplicated communicator and polls, with a
deadline, for theirs):

- a test that failed on some ranks is marked failed on every rank, with a line
  naming the failing ranks (their own tracebacks are in their output; run with
  ``mpiexec -prepend-rank`` so each line says which rank wrote it);
- a rank that never reaches the end of a test (stuck) is named, and the job is
  aborted instead of hanging: ``HPCDP_TEST_AGREE_TIMEOUT`` seconds (default 90).

Collectives inside tests time out after ``HPCDP_COMM_TIMEOUT`` (set here to 20 s
unless already set), so a broken collective fails the test instead of hanging.
pytest-timeout remains the last resort.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

os.environ.setdefault("HPCDP_COMM_TIMEOUT", "20")

_STATE = {"comm": None, "count": 0}


def _agree_comm():
    from mpi4py import MPI
    if _STATE["comm"] is None:
        _STATE["comm"] = MPI.COMM_WORLD.Dup()
    return _STATE["comm"]


def _agree(failed: bool, nodeid: str) -> list[int]:
    """Exchange pass/fail flags with every rank; return the failing ranks."""
    from mpi4py import MPI
    comm = _agree_comm()
    rank, size = comm.Get_rank(), comm.Get_size()
    tag = _STATE["count"] % 30000
    _STATE["count"] += 1
    mine = np.array([1 if failed else 0], dtype=np.int32)
    theirs = np.zeros(size, dtype=np.int32)
    peers = [p for p in range(size) if p != rank]
    reqs = [comm.Isend([mine, MPI.INT], p, tag) for p in peers]
    recvs = [comm.Irecv([theirs[p:p + 1], MPI.INT], p, tag) for p in peers]
    limit = float(os.environ.get("HPCDP_TEST_AGREE_TIMEOUT", "90"))
    deadline = time.monotonic() + limit
    while not MPI.Request.Testall(recvs):
        if time.monotonic() > deadline:
            missing = [p for p, r in zip(peers, recvs) if not r.Test()]
            sys.stderr.write(f"\n[harness rank {rank}] ranks {missing} never finished test "
                             f"{nodeid} (waited {limit:g}s); aborting the job\n")
            sys.stderr.flush()
            comm.Abort(3)
        time.sleep(0.001)
    MPI.Request.Waitall(reqs)
    theirs[rank] = mine[0]
    return [p for p in range(size) if theirs[p]]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if call.when != "call" or not item.config.getoption("with_mpi", default=False):
        return
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_size() == 1:
        return
    failing = _agree(rep.failed, item.nodeid)
    rank = MPI.COMM_WORLD.Get_rank()
    if failing and not rep.failed:
        rep.outcome = "failed"
        rep.longrepr = (f"[rank {rank}] passed here, but failed on ranks {failing}: "
                        "see their tracebacks (lines prefixed with their rank)")
    elif failing:
        rep.sections.append(("hpcdp harness", f"[rank {rank}] this test failed on ranks {failing}"))


@pytest.fixture
def comm():
    """COMM_WORLD (the tests run on every rank)."""
    from mpi4py import MPI
    return MPI.COMM_WORLD

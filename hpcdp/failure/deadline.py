"""Deadlines for the MPI calls hpcdp makes outside hpcdp.comm's collectives.

Every wait here polls (``Test``) until done or until its deadline, then raises
:class:`DeadlineExceeded` saying what this rank waited for and which ranks never
delivered (where the requests say so). Polling instead of blocking also lets
Python run signal handlers (Ctrl-C, SIGTERM) while a rank waits.

MPI has no non-blocking form of ``MPI_Comm_split`` / ``split_type``: those run
under :func:`watchdog`, a timer thread that ends the job (``MPI_Abort``) when the
call has not returned by its deadline, since a thread cannot interrupt a C call.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from hpcdp.comm.core.errors import CommError

from .ranks import abort_job, fmt_ranks, say


class DeadlineExceeded(CommError):
    """A wait ran past its deadline; ``missing`` lists the ranks that never delivered."""

    def __init__(self, message: str, *, missing=()):
        super().__init__(message)
        self.missing = list(missing)


def _world_rank() -> int:
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank()


def wait(requests, timeout: float, what: str, *, sources=None) -> None:
    """Poll until every request completes; after ``timeout`` seconds raise
    :class:`DeadlineExceeded`. ``sources[i]`` is the peer of ``requests[i]`` (the
    rank it receives from or sends to), so the message names the ranks still owed."""
    from mpi4py import MPI

    reqs = list(requests)
    if not reqs or MPI.Request.Testall(reqs):
        return
    start = time.monotonic()
    n = 0
    while not MPI.Request.Testall(reqs):
        n += 1
        if n % 64 == 0:
            os.sched_yield()  # ranks may share cores: let the peer run
            waited = time.monotonic() - start
            if waited > timeout:
                pending = []
                if sources is not None:
                    pending = [s for r, s in zip(reqs, sources) if not r.Test()]
                who = f": still waiting for {fmt_ranks(pending)}" if pending else ""
                raise DeadlineExceeded(
                    f"rank {_world_rank()} waited {waited:.1f}s for {what}{who} "
                    f"(a rank is stuck, died or never got here)", missing=pending)


def idup(comm, timeout: float, what: str = "duplicating a communicator"):
    """``comm.Idup()`` completed within ``timeout`` seconds."""
    new, req = comm.Idup()
    wait([req], timeout, what)
    return new


@contextlib.contextmanager
def watchdog(timeout: float, what: str):
    """Bound a blocking MPI call that has no non-blocking form (``Split``): if it has
    not returned after ``timeout`` seconds, print why and end the job with
    ``MPI_Abort`` from a timer thread (mpi4py releases the GIL inside MPI calls)."""
    def expire():
        rank = _world_rank()
        say(f"hpcdp: error: rank {rank}: {what} did not complete within {timeout:g}s "
            "(a rank is stuck, died or never got here); ending the job")
        abort_job(1)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


__all__ = ["DeadlineExceeded", "wait", "idup", "watchdog"]

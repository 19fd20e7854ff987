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


class BlockingWatch:
    """For code that must call blocking MPI collectives (a benchmark's MPI baseline):
    a thread that ends the job when a block opened with :meth:`arm` has not been
    closed (:meth:`disarm`) within ``timeout`` + ``margin`` seconds, in one line that
    names the ranks that never answered (stopped, dead, or stuck outside MPI).

    On expiry each live rank's thread sends one small message to every peer on a
    duplicate of ``comm`` and collects theirs for a grace period (the blocked main
    threads do not take part: MPI_THREAD_MULTIPLE); every live rank names the same
    missing ranks, the lowest live one prints and aborts. ``margin`` lets hpcdp's own
    collectives inside the block time out and diagnose first. Create and
    :meth:`close` it on every rank (a collective Dup / Free)."""

    def __init__(self, comm, timeout: float, margin: float = 0.0):
        self.comm = comm.Dup()
        self.timeout, self.margin = float(timeout), float(margin)
        self._deadline: float | None = None
        self._what = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpcdp-blocking-watch", daemon=True)
        self._thread.start()

    def arm(self, what: str) -> None:
        self._what = what
        self._deadline = time.monotonic() + self.timeout + self.margin

    def disarm(self) -> None:
        self._deadline = None

    def close(self, free: bool = True) -> None:
        self._stop.set()
        self._thread.join()
        if free:
            self.comm.Free()

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            d = self._deadline
            if d is not None and time.monotonic() > d:
                self._expire(self._what)
                return

    def _expire(self, what: str) -> None:
        import numpy as np

        from hpcdp.comm import grace_s

        comm = self.comm
        rank, size = comm.Get_rank(), comm.Get_size()
        grace = grace_s(self.timeout)
        peers = [p for p in range(size) if p != rank]
        mine = np.array([rank], dtype=np.int64)
        bufs = {p: np.empty(1, dtype=np.int64) for p in peers}
        sends = [comm.Isend(mine, dest=p, tag=1) for p in peers]  # noqa: F841 - the job ends after
        recvs = {p: comm.Irecv(bufs[p], source=p, tag=1) for p in peers}
        heard: set = set()
        end = time.monotonic() + grace
        while time.monotonic() < end and len(heard) < len(peers):
            heard.update(p for p, r in recvs.items() if p not in heard and r.Test())
            time.sleep(0.01)
        missing = [p for p in peers if p not in heard]
        if rank != min(set(range(size)) - set(missing)):
            time.sleep(grace + 2.0)  # the lowest live rank reports; its abort normally ends this one
        who = (f"{fmt_ranks(missing)} never answered (stopped, dead, or stuck outside MPI)" if missing
               else "every rank answered (a deadlock or an MPI problem)")
        say(f"hpcdp: error: rank {rank} of {size}: {what} did not complete within {self.timeout:g}s; "
            f"{who}; ending the job")
        abort_job(1)


__all__ = ["DeadlineExceeded", "wait", "idup", "watchdog", "BlockingWatch"]

"""Graceful stop: SIGTERM or SIGUSR1 -> finish the step, save, exit 0.

Slurm sends SIGUSR1 before a time limit when asked (``#SBATCH --signal=USR1@120``)
and SIGTERM when it preempts or cancels a job. A signal reaches the ranks at
slightly different moments, so they must agree on the step after which they all
stop: at the end of every step each rank starts a one-number allreduce (op max) of
"the signal I have seen" on a communicator of its own and completes the previous
step's one. The decision for step s is therefore made from what every rank had seen
at the end of step s - 1: all ranks stop after the same step, one step after the
signal at most, and no step waits on a blocking collective of its own (the wait
completes a request that has had a whole step to finish).

Ranks that run no steps (dedicated parameter servers) make no decision; a signal
that reaches only such a rank must still stop the job (a preemption notice for the
server's node). Such a rank keeps the handlers, and its serve loop calls
:meth:`GracefulStop.forward`, which tells every deciding rank (one small message
each on the ``notices`` communicator, a duplicate of the world's); a deciding rank
takes any notice that has arrived at the end of its step as if the signal had
reached it, and the agreement above does the rest. The stop line then names the
rank the signal reached.

Installed only when checkpointing is configured; without it a signal keeps its
default meaning (the job ends). Where ``hpcdp.failure.signals`` exists (the job's one
place for signals), the flag is set through its graceful-stop registry
(``on_stop_signal``: return True = "taken, this run stops cleanly"); otherwise this
module installs its own handlers for the two signals and gives them back at close.
"""

from __future__ import annotations

import signal
import threading

import numpy as np

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def _registry():
    try:
        from hpcdp.failure.signals import on_stop_signal
    except ImportError:
        return None
    return on_stop_signal


TAG_NOTICE = 7301  # on the notices communicator: (signal number, world rank it reached)
_BY = 1 << 32      # the agreed number: signal * _BY + (rank the signal reached + 1, or 0)


class GracefulStop:
    """``comm``: the deciding ranks' communicator (None on a rank that decides
    nothing); ``notices``: a communicator of every rank (world ranks) on which a
    non-deciding rank tells the ranks in ``deciders`` of a signal it received."""

    def __init__(self, comm, *, timeout: float = 300.0, signals=SIGNALS, notices=None, deciders=()):
        self.comm, self.timeout, self.signals = comm, timeout, tuple(signals)
        self.notices, self.deciders = notices, tuple(deciders)
        self.received = 0
        self.by: int | None = None    # world rank a forwarded signal reached (None: this rank)
        self.decided_by: int | None = None
        self._told: list = []         # a non-deciding rank: its notices in flight
        self._told_buf = None
        self._prev: dict = {}
        self._unregister = None
        self._req = None
        self._buf = None
        register = _registry()
        if register is not None:
            self._unregister = register(self._take)
        elif threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._prev[s] = signal.signal(s, self._handler)

    def _take(self, signum) -> bool:
        """For the job's signal registry: take SIGTERM / SIGUSR1 (not SIGINT)."""
        if signum not in self.signals:
            return False
        self._handler(signum, None)
        return True

    def _handler(self, signum, _frame) -> None:
        if not self.received:
            self.received = int(signum)

    def poll(self) -> int:
        """Call once per step on every rank: the agreed signal number to stop on
        now (0: go on)."""
        from hpcdp.comm import iallreduce

        decided = 0
        if self._req is not None:
            self._req.wait()
            decided = int(self._buf[0])
        self._take_notices()
        mine = self.received * _BY + (self.by + 1 if self.by is not None and self.received else 0)
        self._buf = np.array([mine], dtype=np.int64)
        self._req = iallreduce(self._buf, comm=self.comm, op="max", timeout=self.timeout)
        if decided:
            self.decided_by = (decided % _BY) - 1 if decided % _BY else None
        return decided // _BY

    def _take_notices(self) -> None:
        """A deciding rank: take the notices non-deciding ranks sent (none waits)."""
        if self.notices is None or self.comm is None:
            return
        from mpi4py import MPI

        status = MPI.Status()
        while self.notices.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_NOTICE, status=status):
            got = np.empty(2, dtype=np.int64)
            self.notices.Recv(got, source=status.Get_source(), tag=TAG_NOTICE)
            if not self.received:
                self.received, self.by = int(got[0]), int(got[1])

    def forward(self) -> None:
        """A non-deciding rank, from its serve loop: once a signal arrived, tell every
        deciding rank (once; the sends complete in the background)."""
        if not self.received or self._told_buf is not None or self.notices is None:
            return
        self._told_buf = np.array([self.received, self.notices.Get_rank()], dtype=np.int64)
        self._told = [self.notices.Isend(self._told_buf, dest=r, tag=TAG_NOTICE) for r in self.deciders]

    def close(self, wait: bool = True) -> None:
        """Complete the request in flight (every rank started the same number) and
        give the signals back their previous handlers."""
        req, self._req = self._req, None
        try:
            if req is not None and wait:
                req.wait()
            if wait:
                self._take_notices()  # one that came after the last step: nothing to do with it
        finally:
            # a notice to a rank that had already finished its steps is never taken:
            # its small send is not waited for
            for r in self._told:
                if not r.Test():
                    r.Free()
            self._told = []
            self._restore()

    def _restore(self) -> None:
        for s, prev in self._prev.items():
            signal.signal(s, prev)
        self._prev = {}
        if self._unregister is not None:
            self._unregister()
            self._unregister = None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


__all__ = ["GracefulStop", "SIGNALS", "signal_name"]

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


class GracefulStop:
    def __init__(self, comm, *, timeout: float = 300.0, signals=SIGNALS):
        self.comm, self.timeout, self.signals = comm, timeout, tuple(signals)
        self.received = 0
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
        self._buf = np.array([self.received], dtype=np.int64)
        self._req = iallreduce(self._buf, comm=self.comm, op="max", timeout=self.timeout)
        return decided

    def close(self, wait: bool = True) -> None:
        """Complete the request in flight (every rank started the same number) and
        give the signals back their previous handlers."""
        req, self._req = self._req, None
        try:
            if req is not None and wait:
                req.wait()
        finally:
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

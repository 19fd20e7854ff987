"""The progress thread: non-blocking compiled collectives advance while the
training thread computes, without anyone polling them.

One daemon thread per process (started on the first non-blocking compiled
collective). It takes requests oldest first (every rank issues collectives in the
same order, so neighbours work on the same one) and advances each inside compiled
code that holds no GIL (hpcdp.comm.compiled.kernels, mode BACKGROUND): when a pass
finds nothing to do it sleeps (``usleep``, doubling from 1 us to
hpcdp.comm.compiled.request.BACKOFF_US), so on a machine without a spare core it
takes a few percent of one, never a busy-polled core. The thread's timer slack is
set to 1 us (``prctl(PR_SET_TIMERSLACK)``, Linux) so those short sleeps are short.
With nothing in flight it blocks on a condition variable. A request is picked up
PICKUP_DELAY_S after it started at the earliest, so a blocking call (start, then
wait at once) runs on its own thread alone.

The thread never raises: a request whose deadline passes (or that a waiting thread
takes over, see CompiledRingRequest.wait) is left to the thread that waits on it,
which runs the timeout diagnosis or completes it. MPI is initialised with
MPI_THREAD_MULTIPLE (mpi4py's default); with a lower thread level the engine keeps
requests on the calling thread (hpcdp.comm.compiled.engine).
"""

from __future__ import annotations

import collections
import ctypes
import threading
import time

from hpcdp.comm.compiled import kernels as K

PR_SET_TIMERSLACK = 29
PICKUP_DELAY_S = 50e-6


def _short_timer_slack() -> None:
    try:
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the default slack, longer sleeps
        pass


class ProgressThread:
    """The per-process progress thread (module docstring)."""

    def __init__(self):
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._thread = None
        self.passes = 0  # background calls made (benchmarks report it)

    def submit(self, req) -> None:
        with self._cond:
            self._queue.append(req)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hpcdp-progress",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        _short_timer_slack()
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                req = self._queue[0]
            if not req.done and int(req.st[K.ST_STOP]) == 0 and \
                    time.monotonic() - req.started < PICKUP_DELAY_S:
                time.sleep(PICKUP_DELAY_S)  # a blocking call waits at once: leave it alone
            wanted = not req.done and int(req.st[K.ST_STOP]) == 0
            if wanted and not req.lock.acquire(False):
                time.sleep(20e-6)  # the training thread is in its test(): retry shortly
                continue
            if wanted:
                try:
                    if not req.done:
                        self.passes += 1
                        req.background_pass(req.started + req.timeout)
                except Exception:  # noqa: BLE001 - the waiting thread raises it again
                    pass
                finally:
                    req.lock.release()
            with self._cond:
                if self._queue and self._queue[0] is req:
                    self._queue.popleft()
            req = None  # hold no finished request (its buffers) while waiting for the next

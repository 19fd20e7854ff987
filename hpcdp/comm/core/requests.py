"""Requests: progressable, waitable collectives with timeouts and byte counting.

Every hpcdp collective is a request; the blocking functions are ``start + wait``.
``test()`` advances it as far as possible without blocking and returns True when
done; ``wait()`` polls ``test()`` until done or until the timeout, then runs the
missing-rank diagnosis (hpcdp.comm.core.diagnose) and raises its
:class:`~hpcdp.comm.core.errors.CollectiveTimeout`, which names the ranks that never
arrived the same way on every rank. Callers with their own deadline (a loop over
several requests) call :meth:`Request.expire` when it passes.

Each request carries ``call``, the tuple ``(seq, name, dtype, length, root,
algorithm, op)`` the diagnosis sends as this collective's fingerprint.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from hpcdp.comm.core.debug import SPIN_POLLS, _idle
from hpcdp.comm.core.diagnose import diagnose, peer_failed
from hpcdp.comm.core.errors import mpi_error

# MPI counts are C ints: one message carries at most 2**31 - 1 elements of its
# datatype. hpcdp sends bytes, so every message is cut below 2 GiB.
MAX_MESSAGE_BYTES = (1 << 31) - 4096


def mpi_buffer(arr):
    """An MPI buffer spec for a contiguous 1-D array, as bytes (any dtype)."""
    if isinstance(arr, np.ndarray):
        return [arr.view(np.uint8), MPI.BYTE]
    if not hasattr(arr, "__cuda_array_interface__") and hasattr(arr, "_ary"):
        # numba's CUDA simulator: "device" memory is a host array
        return [np.asarray(arr._ary).view(np.uint8), MPI.BYTE]
    # device array (__cuda_array_interface__): MPI reads the device pointer
    return [arr, arr.size * arr.dtype.itemsize, MPI.BYTE]


def pieces(n: int, itemsize: int, max_bytes: int) -> list[tuple[int, int]]:
    """Cut ``n`` elements into ``(offset, length)`` pieces of at most ``max_bytes``."""
    step = max(1, max_bytes // itemsize)
    return [(o, min(step, n - o)) for o in range(0, n, step)]


class Request:
    """Base: subclasses implement ``_progress() -> bool`` (True when finished).

    ``progresses_alone``: True when something other than the caller's ``test()``
    calls advances the request (the compiled engine's progress thread), so a caller
    with several requests in flight may block in ``wait()`` on the oldest instead of
    polling them all (hpcdp.strategies.engine.BucketEngine.drain)."""

    progresses_alone = False

    def __init__(self, ctx, name: str, call, ledger, timeout, max_message_bytes=None):
        self.ctx, self.name, self.call, self.ledger = ctx, name, call, ledger
        self.timeout = ctx.timeout if timeout is None else float(timeout)
        self.max_bytes = MAX_MESSAGE_BYTES if max_message_bytes is None else int(max_message_bytes)
        if self.max_bytes < 16:
            raise ValueError(f"max_message_bytes must be >= 16, got {self.max_bytes}")
        self.seq = call[0]
        self.started = time.monotonic()
        self._polls = 0
        self.done = False
        self.done_at = None
        self.result = None
        self.sent_bytes = self.recv_bytes = self.sent_msgs = self.recv_msgs = 0
        self._recv_src: dict = {}  # id(request) -> source rank, for timeout messages
        self._scratch: list = []

    # -- message helpers (count what goes to MPI) ---------------------------
    def isend(self, arr, dest: int, tag: int, comm=None) -> list:
        """Send ``arr`` to ``dest`` in pieces below the message limit (on ``comm``, by
        default this context's data communicator), counted in this request's figures."""
        out = []
        comm = self.ctx.data if comm is None else comm
        for o, ln in pieces(arr.size, arr.dtype.itemsize, self.max_bytes):
            out.append(comm.Isend(mpi_buffer(arr[o:o + ln]), dest, tag))
            self.sent_bytes += ln * arr.dtype.itemsize
            self.sent_msgs += 1
        return out

    def irecv(self, arr, source: int, tag: int, comm=None) -> list:
        out = []
        comm = self.ctx.data if comm is None else comm
        for o, ln in pieces(arr.size, arr.dtype.itemsize, self.max_bytes):
            req = comm.Irecv(mpi_buffer(arr[o:o + ln]), source, tag)
            self._recv_src[id(req)] = (req, source)
            out.append(req)
            self.recv_bytes += ln * arr.dtype.itemsize
            self.recv_msgs += 1
        return out

    def scratch(self, n: int, dtype) -> np.ndarray:
        """A pooled numpy scratch array, returned to the pool on completion."""
        dtype = np.dtype(dtype)
        raw = self.ctx.pool.get(n * dtype.itemsize)
        self._scratch.append(raw)
        return raw[:n * dtype.itemsize].view(dtype)

    # -- public --------------------------------------------------------------
    def test(self) -> bool:
        """Advance without blocking; True when the collective is complete.

        Raises the diagnosis' CollectiveTimeout when a peer's wait timed out (checked
        every 1024 fruitless calls, so a caller that only polls still takes part), the
        communicator's error once it failed or was aborted (hpcdp.comm.abort), and an
        MPI error as hpcdp.comm.core.errors.MPIError."""
        if self.done:
            return True
        if self.ctx.failed is not None:
            raise self.ctx.failed
        try:
            finished = self._progress()
        except MPI.Exception as exc:
            raise self.mpi_failed(exc) from None
        if finished:
            self._complete()
            return True
        self._polls += 1
        if self._polls & 1023 == 0 and peer_failed(self.ctx):
            raise self._timeout(self.timeout, joined=True)
        return False

    def wait(self, timeout: float | None = None):
        """Block until complete (polling); returns the result array (or None)."""
        if self.test():
            return self.result
        limit = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        idle = 0
        while not self.test():
            idle = _idle(idle)
            if idle & 63 == 0:
                if time.monotonic() > deadline:
                    raise self._timeout(limit)
                if idle > SPIN_POLLS and peer_failed(self.ctx):
                    raise self._timeout(limit, joined=True)
        return self.result

    def mpi_failed(self, exc):
        """The MPIError of an MPI call that failed in this request; the communicator is
        marked failed with it (later collectives on it raise it at once)."""
        err = mpi_error(exc, collective=self.name, seq=self.seq, rank=self.ctx.rank)
        if self.ctx.failed is None:
            self.ctx.failed = err
        return err

    def expire(self):
        """The caller's own deadline for this request passed: raise the diagnosis'
        CollectiveTimeout (with the time really waited since the request started)."""
        raise self._timeout(self.timeout)

    # -- internals -----------------------------------------------------------
    def _progress(self) -> bool:
        raise NotImplementedError

    def _complete(self) -> None:
        self.done_at = time.monotonic()  # the in-flight interval: [started, done_at]
        self.done = True
        for raw in self._scratch:
            self.ctx.pool.put(raw)
        self._scratch = []
        self._recv_src = {}
        if self.ledger is not None:
            self.ledger.record(self.name, self.sent_bytes, self.recv_bytes,
                               self.sent_msgs, self.recv_msgs, calls=1)

    def _timeout(self, limit, joined=False):
        waiting = {src for req, src in self._recv_src.values() if not req.Test()}
        return diagnose(self.ctx, self.call, time.monotonic() - self.started, limit,
                        waiting, joined=joined)


class GenRequest(Request):
    """A request driven by a generator that yields the MPI requests it waits on."""

    def __init__(self, ctx, name, call, ledger, timeout, body, max_message_bytes=None):
        super().__init__(ctx, name, call, ledger, timeout, max_message_bytes)
        self._gen = body(self)
        self._waiting: list = []

    def _progress(self) -> bool:
        while True:
            if self._waiting and not MPI.Request.Testall(self._waiting):
                return False
            try:
                self._waiting = list(next(self._gen))
            except StopIteration as stop:
                if stop.value is not None:
                    self.result = stop.value
                return True


class DoneRequest(Request):
    """Already complete (world size 1, empty buffers)."""

    def __init__(self, ctx, name, call, ledger, result):
        super().__init__(ctx, name, call, ledger, None)
        self.result = result
        self._complete()

    def _progress(self) -> bool:
        return True

"""Messages of the parameter server, on mpi4py non-blocking point-to-point calls.

The PS talks on its own duplicate of the world communicator, so its tags never match
anyone else's messages. Three streams, each ordered per (source, tag) by MPI's
non-overtaking rule:

- ``TAG_HEADER`` worker -> server: 4 float64 ``(kind, step, version, lr)``; kind is
  ``PUSH`` (a gradient follows on ``TAG_GRAD``) or ``DONE`` (``step`` = steps pushed).
  Control traffic: not counted in the ledger (like comm's arrival tokens).
- ``TAG_GRAD`` worker -> server: the gradient shard (payload, counted as ``ps_push``).
- ``TAG_REPLY`` server -> worker: update u's result, the new parameter shard
  (server-side update) or the aggregated gradient shard (worker-side update), one
  per update in update order (payload, counted as ``ps_pull``).

Integers travel as float64 in the header: exact below 2**53 steps.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

TAG_HEADER, TAG_GRAD, TAG_REPLY = 101, 102, 103
PUSH, DONE = 0.0, 1.0
MAX_ELEMENTS = (1 << 31) - 1  # MPI counts are C ints


def header(kind: float, step: int, version: int, lr: float) -> np.ndarray:
    return np.array([kind, step, version, lr], dtype=np.float64)


def check_count(n: int) -> None:
    if n > MAX_ELEMENTS:
        raise ValueError(f"parameter server: a shard of {n} elements exceeds one MPI message "
                         f"({MAX_ELEMENTS} elements); raise parallel.ps.servers")


class Outbox:
    """Non-blocking sends in flight, with the buffers they read from kept alive.

    A buffer handed to ``Isend`` must not change or be freed until the send completes,
    so every send owns a private copy (cost: one shard copy per message)."""

    def __init__(self):
        self._items: list = []  # (request, buffer)

    def send(self, comm, buf: np.ndarray, dest: int, tag: int) -> None:
        self._items.append((comm.Isend(buf, dest=dest, tag=tag), buf))

    def poll(self) -> None:
        """Drop completed sends (also progresses them)."""
        if self._items:
            self._items = [(r, b) for r, b in self._items if not r.Test()]

    def __len__(self) -> int:
        return len(self._items)


class Waiter:
    """Poll loop helper: yields the core now and then, raises after ``timeout`` s with
    a message that says what this rank was waiting for (a hang becomes an error)."""

    def __init__(self, timeout: float, what: str):
        self.deadline = time.monotonic() + timeout
        self.timeout, self.what, self.n = timeout, what, 0

    def idle(self, detail=lambda: "") -> None:
        self.n += 1
        if self.n % 16 == 0:
            os.sched_yield()  # ranks may share cores: give it away
        if self.n % 1024 == 0 and time.monotonic() > self.deadline:
            rank = MPI.COMM_WORLD.Get_rank()
            raise TimeoutError(f"parameter server: rank {rank} waited {self.timeout:g}s for "
                               f"{self.what} ({detail()}); a peer died or stopped early")


def finish_together(comm, outboxes, timeout: float) -> None:
    """Leave only when every rank's sends are complete (non-blocking consensus).

    A send may complete at its sender only after the receiver progresses MPI once
    more (rendezvous acknowledgements), so no rank may stop progressing while a peer
    still has sends in flight. Each rank keeps polling its outboxes; once they are
    empty it joins an ``Ibarrier`` and keeps progressing until every rank has joined."""
    waiter = Waiter(timeout, "every rank's parameter-server sends to complete")
    barrier = None
    while True:
        for o in outboxes:
            o.poll()
        if barrier is None and not any(len(o) for o in outboxes):
            barrier = comm.Ibarrier()
        if barrier is not None and barrier.Test():
            return
        waiter.idle(lambda: f"{sum(len(o) for o in outboxes)} own sends in flight")


def cancel_all(requests) -> None:
    """Cancel receives that will never match, then complete them (clean shutdown)."""
    for r in requests:
        if r != MPI.REQUEST_NULL and not r.Test():
            r.Cancel()
            r.Wait()

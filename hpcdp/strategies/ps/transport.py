"""Messages of the parameter server, on mpi4py non-blocking point-to-point calls.

The PS talks on its own duplicate of the world communicator, so its tags never match
anyone else's messages. Three streams, each ordered per (source, tag) by MPI's
non-overtaking rule:

- ``TAG_HEADER`` worker -> server: 4 float64 ``(kind, step, version, lr)``; kind is
  ``PUSH`` (a gradient follows on ``TAG_GRAD``), ``DONE`` (``step`` = steps pushed) or
  ``SAVE`` (a checkpoint at the step boundary: ``(SAVE, training step, steps pushed,
  wait)``, sent by every worker to every dedicated server after all its pushed
  updates came back, see checkpoint.py). Control traffic: not counted in the ledger
  (like comm's control messages).
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
PUSH, DONE, SAVE = 0.0, 1.0, 2.0
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
        self._items: list = []  # (request, buffer, destination)

    def send(self, comm, buf: np.ndarray, dest: int, tag: int) -> None:
        self._items.append((comm.Isend(buf, dest=dest, tag=tag), buf, dest))

    def poll(self) -> None:
        """Drop completed sends (also progresses them)."""
        if self._items:
            self._items = [item for item in self._items if not item[0].Test()]

    def pending_dests(self) -> list:
        """Ranks that still have to take one of these sends."""
        return sorted({dest for _, _, dest in self._items})

    def __len__(self) -> int:
        return len(self._items)


class Waiter:
    """Poll loop helper: yields the core now and then, raises
    :class:`~hpcdp.failure.deadline.DeadlineExceeded` after ``timeout`` s with a message
    that says what this rank was waiting for and, from ``missing() -> [ranks]``, which
    ranks still owe it a message (a hang becomes an error naming the peer)."""

    def __init__(self, timeout: float, what: str, missing=None):
        self.deadline = time.monotonic() + timeout
        self.timeout, self.what, self.n = timeout, what, 0
        self.missing = missing

    def idle(self, detail=lambda: "") -> None:
        self.n += 1
        if self.n % 16 == 0:
            os.sched_yield()  # ranks may share cores: give it away
        if self.n % 1024 == 0 and time.monotonic() > self.deadline:
            from hpcdp.failure.deadline import DeadlineExceeded
            from hpcdp.failure.ranks import fmt_ranks

            rank = MPI.COMM_WORLD.Get_rank()
            ranks = self.missing() if self.missing is not None else []
            owed = f"; still waiting for {fmt_ranks(ranks)}" if ranks else ""
            raise DeadlineExceeded(f"parameter server: rank {rank} waited {self.timeout:g}s for "
                                   f"{self.what} ({detail()}){owed}; a peer is stuck, died or "
                                   "stopped early", missing=ranks)


def finish_together(comm, outboxes, timeout: float) -> None:
    """Leave only when every rank's sends are complete (non-blocking consensus).

    A send may complete at its sender only after the receiver progresses MPI once
    more (rendezvous acknowledgements), so no rank may stop progressing while a peer
    still has sends in flight. Each rank keeps polling its outboxes; once they are
    empty it joins an ``Ibarrier`` and keeps progressing until every rank has joined."""
    waiter = Waiter(timeout, "every rank's parameter-server sends to complete",
                    missing=lambda: sorted({d for o in outboxes for d in o.pending_dests()}))
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

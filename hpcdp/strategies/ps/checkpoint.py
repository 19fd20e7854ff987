"""Checkpoints of the parameter server (the protocol of :mod:`hpcdp.io.protocol`).

- ``update = "server"``: server s owns ``shard_range(numel, S, s)``; its parameter
  shard and the optimizer state of that shard live only there, so each server writes
  its shard and nobody else writes anything. On restore every worker fills the whole
  weights and each server also its shard's optimizer state (sized to the shard).
- ``update = "worker"``: every worker runs the same optimizer on the whole buffer, a
  replica like DDP: worker w writes ``shard_range(numel, W, w)``.
- ``mode = "async"``: before its pieces are taken a worker waits until every update
  it pushed is applied and installed (every shard at version = its step count), so
  all workers and servers hold the same state; then training goes on.
- Dedicated servers (``colocated = false``) do not run the training loop; the save
  reaches them through the PS protocol. At the step boundary every worker first
  waits as above, then sends a ``SAVE`` header (``transport.py``: training step,
  updates pushed, wait) to every dedicated server, and enters the save. A server
  takes the headers of its stream in order, so the request follows the worker's last
  push; when every worker's request is in (``SaveRequests``) and it has applied
  exactly the updates they pushed, it calls the run's checkpointer (``on_save``,
  given to ``ParameterServer.serve``) right there, before any later update: its
  pieces (shard and optimizer state) go into the same checkpoint through the same
  collective save, so the commit is unchanged (listed only when complete). A
  resumed run's server restores before it serves (the same collective load).

The server versions are kept as per-rank scalars (``ps_server``, ``ps_version``); a
resumed run counts versions from zero again, relative to the resumed step.
"""

from __future__ import annotations

from hpcdp.io.errors import CheckpointError
from hpcdp.io.format.names import PARAM
from hpcdp.io.protocol import (
    Piece, optimizer_buffers, optimizer_scalars, replicated_pieces, replicated_targets,
)


class SaveRequests:
    """A dedicated server's checkpoint requests: one ``SAVE`` per worker of the same
    step boundary; the last one runs ``on_save(step, wait)`` (the run's checkpointer,
    set by ``ParameterServer.serve``) after checking that every worker asked for the
    same step and that this server applied exactly the updates they pushed."""

    def __init__(self, who: str, workers):
        self.who, self.workers = who, tuple(workers)
        self.pending: dict = {}
        self.on_save = None

    def add(self, w: int, step: int, pushed: int, wait: bool, *, applied: int) -> None:
        self.pending[w] = (step, pushed, wait)
        if len(self.pending) < len(self.workers):
            return
        reqs, self.pending = self.pending, {}
        steps = sorted({r[0] for r in reqs.values()})
        counts = sorted({r[1] for r in reqs.values()})
        if len(steps) > 1 or len(counts) > 1:
            raise CheckpointError(f"{self.who}: the workers asked for checkpoints of different steps "
                                  f"{steps} after {counts} updates: they ran different schedules")
        if counts[0] != applied:
            raise CheckpointError(f"{self.who}: checkpoint of step {steps[0]} asked for after {counts[0]} "
                                  f"updates, but this server applied {applied}")
        if self.on_save is None:
            raise CheckpointError(f"{self.who}: the workers asked for a checkpoint of step {steps[0]}, "
                                  "but this server rank has no checkpointer")
        self.on_save(steps[0], any(r[2] for r in reqs.values()))


def check(ps) -> None:
    """Every PS configuration can be checkpointed (dedicated servers by ``SAVE``)."""


def dedicated(ps) -> bool:
    return not ps.roles.colocated


def begin(ps, step: int, wait: bool) -> None:
    """A worker, at the step boundary of a save: wait for its updates (async), then
    ask every dedicated server to save too."""
    quiesce(ps)
    if ps.worker is not None and dedicated(ps):
        ps.worker.request_save(step, wait)


def _shard(ps) -> tuple[int, int]:
    return ps.roles.shard(ps.flat.numel, ps.server.index)


def quiesce(ps) -> None:
    """Async: wait until every update this worker pushed is applied and installed."""
    if ps.cfg.mode == "async" and ps.worker is not None:
        ps.worker.wait_for(ps.worker.step_t, f"every update applied (version {ps.worker.step_t}) "
                                             "before a checkpoint")


def pieces(ps) -> list[Piece]:
    quiesce(ps)
    if ps.cfg.update == "worker":
        if not ps.is_worker:  # a dedicated server holds no optimizer state then
            return []
        return replicated_pieces(ps.flat, ps.optimizer, ps.dp_rank, ps.dp_size)
    if ps.server is None:
        return []
    off, size = _shard(ps)
    out = [Piece(PARAM, off, ps.server.params)]
    out += [Piece(name, off, arr) for name, arr in optimizer_buffers(ps.optimizer, size).items()]
    return [p for p in out if p.size > 0]


def targets(ps) -> list[Piece]:
    if ps.cfg.update == "worker":
        if not ps.is_worker:
            return [Piece(PARAM, 0, ps.flat.data)]
        return replicated_targets(ps.flat, ps.optimizer)
    out = [Piece(PARAM, 0, ps.flat.data)]
    if ps.server is not None:
        off, size = _shard(ps)
        out += [Piece(name, off, arr) for name, arr in optimizer_buffers(ps.optimizer, size).items()]
    return out


def restored(ps) -> None:
    """The server keeps a private copy of its parameter shard: refresh it."""
    if ps.server is not None:
        off, size = _shard(ps)
        ps.server.params[...] = ps.flat.data[off:off + size]


def scalars(ps) -> dict:
    out = optimizer_scalars(ps.optimizer)
    server = ps.server
    version = -1
    if server is not None:
        version = server.clock.version if hasattr(server, "clock") else server.updates
    out.update(ps_server=-1 if server is None else server.index, ps_version=version)
    return out


__all__ = ["SaveRequests", "check", "begin", "quiesce", "pieces", "targets", "restored", "scalars"]

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

The server versions are kept as per-rank scalars (``ps_server``, ``ps_version``); a
resumed run counts versions from zero again, relative to the resumed step.
Dedicated server ranks (``colocated = false``) do not run the training loop, so they
cannot take part in a save yet: that configuration is refused up front.
"""

from __future__ import annotations

from hpcdp.io.errors import CheckpointError
from hpcdp.io.format import PARAM
from hpcdp.io.protocol import (
    Piece, optimizer_buffers, optimizer_scalars, replicated_pieces, replicated_targets,
)


def check(ps) -> None:
    if not ps.cfg.colocated:
        raise CheckpointError("checkpoints with parallel.ps.colocated = false are not supported: "
                              "dedicated server ranks do not run the training loop and cannot take part "
                              "in a save; set parallel.ps.colocated = true or switch checkpointing off")


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
        return replicated_pieces(ps.flat, ps.optimizer, ps.dp_rank, ps.dp_size)
    if ps.server is None:
        return []
    off, size = _shard(ps)
    out = [Piece(PARAM, off, ps.server.params)]
    out += [Piece(name, off, arr) for name, arr in optimizer_buffers(ps.optimizer, size).items()]
    return [p for p in out if p.size > 0]


def targets(ps) -> list[Piece]:
    if ps.cfg.update == "worker":
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


__all__ = ["check", "quiesce", "pieces", "targets", "restored", "scalars"]

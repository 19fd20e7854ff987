"""The strategy side of checkpoints: which flat ranges a rank writes and fills.

A strategy answers in the coordinates of the model's flat buffers (the same for every
strategy and rank count): buffer ``"param"`` is ``flat.data``; ``"optim/<name>"`` is the
optimizer state buffer ``<name>`` (``m``, ``v``, ``momentum_buf``) laid out like
``flat.data``. A :class:`Piece` is one contiguous range of one buffer and the 1-D
array (host or device) that holds it on this rank. Four methods, on every strategy
(``hpcdp.strategies.base.Strategy`` documents them, docs/architecture.md too)::

    checkpoint_pieces()    -> [Piece]  what this rank WRITES. Over all ranks the
                                       pieces of a buffer tile it exactly once: no two
                                       ranks write the same bytes, no rank gathers.
    checkpoint_targets()   -> [Piece]  the arrays this rank FILLS on restore (replicas
                                       overlap: every DDP rank fills everything).
    checkpoint_restored()              after the fill: copy into private buffers
                                       (a parameter server's shard), re-derive views.
    checkpoint_scalars()   -> dict     this rank's plain numbers worth keeping
                                       (optimizer step count, PS server version).

Optional: ``checkpoint_check()`` (refuse a configuration up front, on every rank)
and ``checkpoint_begin(step, wait)`` (called first in every save, on every rank: a
parameter server's workers wait for their updates there and ask the dedicated
server ranks, which run no steps, to join the save).

The helpers below implement them for replicated strategies (none, ddp, PS with
worker-side update: rank r of N writes ``shard_range(numel, N, r)`` of each buffer
and restores whole buffers) and for strategies that hold shards described by
``owned_ranges`` (ZeRO: :class:`ShardedCheckpoint`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcdp.shard import shard_range

from .format.names import PARAM, optim_buffer


@dataclass
class Piece:
    buffer: str      # "param" or "optim/<state name>"
    offset: int      # global element offset in that buffer
    array: Any       # 1-D backend array (numpy or device) of the piece's elements

    @property
    def size(self) -> int:
        return int(self.array.shape[0])


def optimizer_buffers(optimizer, size: int | None = None) -> dict:
    """``{"optim/m": array, ...}``; with ``size`` the state is allocated (zeros) first
    when the optimizer has not taken a step yet."""
    if size is not None and getattr(optimizer, "size", None) is None and optimizer.names:
        optimizer.ensure_size(size)
    return {optim_buffer(name): arr for name, arr in optimizer.state_arrays().items()}


def replicated_pieces(flat, optimizer, rank: int, size: int) -> list[Piece]:
    """Every rank holds everything: rank ``rank`` of ``size`` writes its
    ``shard_range`` of the parameters and of each optimizer state buffer."""
    off, n = shard_range(flat.numel, size, rank)
    out = [Piece(PARAM, off, flat.data[off:off + n])]
    for name, arr in optimizer_buffers(optimizer, flat.numel).items():
        out.append(Piece(name, off, arr[off:off + n]))
    return [p for p in out if p.size > 0]


def replicated_targets(flat, optimizer) -> list[Piece]:
    """Every rank restores the whole parameters and optimizer state."""
    out = [Piece(PARAM, 0, flat.data)]
    for name, arr in optimizer_buffers(optimizer, flat.numel).items():
        out.append(Piece(name, 0, arr))
    return out


def optimizer_scalars(optimizer) -> dict:
    return {"optimizer_steps": int(getattr(optimizer, "steps", 0))}


class ReplicatedCheckpoint:
    """The four protocol methods for a strategy whose every data-parallel rank holds
    the whole parameters and optimizer state (uses ``self.flat``, ``self.optimizer``,
    ``self.dp_rank``, ``self.dp_size``). Mix in before ``Strategy``."""

    def checkpoint_pieces(self) -> list[Piece]:
        return replicated_pieces(self.flat, self.optimizer, self.dp_rank, self.dp_size)

    def checkpoint_targets(self) -> list[Piece]:
        return replicated_targets(self.flat, self.optimizer)

    def checkpoint_restored(self) -> None:
        pass

    def checkpoint_scalars(self) -> dict:
        return optimizer_scalars(self.optimizer)


def owned_pieces(buffer: str, ranges, store) -> list[Piece]:
    """The pieces of ``buffer`` for global ``ranges`` that a rank holds concatenated in
    flat order in ``store`` (a ZeRO shard buffer: :func:`hpcdp.ownership.owned_ranges`)."""
    out, pos = [], 0
    for off, size in ranges:
        out.append(Piece(buffer, int(off), store[pos:pos + size]))
        pos += size
    if pos != int(store.shape[0]):
        raise ValueError(f"checkpoint: {buffer} holds {store.shape[0]} elements here, its owned ranges "
                         f"add up to {pos}")
    return [p for p in out if p.size > 0]


def replica_part(pieces, replica: int, replicas: int) -> list[Piece]:
    """The part of each piece that replica ``replica`` of ``replicas`` (ranks holding the
    same shard) writes: ``shard_range`` of the piece, so the replicas together write
    every element once."""
    if replicas == 1:
        return pieces
    out = []
    for p in pieces:
        o, n = shard_range(p.size, replicas, replica)
        if n:
            out.append(Piece(p.buffer, p.offset + o, p.array[o:o + n]))
    return out


class ShardedCheckpoint:
    """The four protocol methods for a strategy that says what it holds with
    ``owned_ranges(kind)`` (ZeRO; ``hpcdp.ownership``). Optimizer state: the owned
    "optim" ranges, concatenated in the optimizer's buffers, written and filled as
    they are. Parameters: a replica (stages 1-2) writes ``shard_range(numel, N, r)``
    and fills everything, like DDP; a shard (stage 3) writes and fills its owned
    "params" ranges, held concatenated in ``self.param_shard()``. Gradients are
    never written. Nobody gathers. Uses ``self.flat``, ``self.optimizer``,
    ``self.dp_rank``, ``self.dp_size``."""

    def _params_replicated(self) -> bool:
        return [tuple(r) for r in self.owned_ranges("params")] == [(0, self.flat.numel)]

    def _optim_pieces(self) -> list[Piece]:
        ranges = self.owned_ranges("optim")
        size = sum(s for _, s in ranges)
        out = []
        for name, arr in optimizer_buffers(self.optimizer, size).items():
            out += owned_pieces(name, ranges, arr)
        return out

    def checkpoint_pieces(self) -> list[Piece]:
        if self._params_replicated():
            off, n = shard_range(self.flat.numel, self.dp_size, self.dp_rank)
            params = [Piece(PARAM, off, self.flat.data[off:off + n])] if n else []
        else:
            params = owned_pieces(PARAM, self.owned_ranges("params"), self.param_shard())
        if not self._params_replicated():  # shards replicated across nodes: a part each
            params = replica_part(params, *self.checkpoint_replica())
        return params + replica_part(self._optim_pieces(), *self.checkpoint_replica())

    def checkpoint_replica(self) -> tuple[int, int]:
        """(this rank's replica index, replicas) of its shard: hybrid sharding keeps one
        replica per node, and each writes its part of every piece; else (0, 1)."""
        return 0, 1

    def checkpoint_targets(self) -> list[Piece]:
        if self._params_replicated():
            params = [Piece(PARAM, 0, self.flat.data)]
        else:
            params = owned_pieces(PARAM, self.owned_ranges("params"), self.param_shard())
        return params + self._optim_pieces()

    def checkpoint_restored(self) -> None:
        pass

    def checkpoint_scalars(self) -> dict:
        return optimizer_scalars(self.optimizer)


def to_host(array, backend=None) -> np.ndarray:
    """A host (numpy) view or copy of a backend array."""
    if isinstance(array, np.ndarray):
        return array
    if backend is not None:
        return np.asarray(backend.to_numpy(array))
    return np.asarray(array.copy_to_host())  # numba device array


__all__ = ["Piece", "ReplicatedCheckpoint", "ShardedCheckpoint", "owned_pieces", "optimizer_buffers", "replicated_pieces", "replicated_targets",
           "optimizer_scalars", "to_host"]

"""One restore: every rank reads the ranges its new role needs (and only those).

The strategy names the arrays this rank fills (``checkpoint_targets``: a DDP
replica fills everything, a ZeRO or parameter-server shard only its range); each is
cut at parameter boundaries and read from the intersecting stored pieces
(:class:`~hpcdp.io.reader.Reader`), checksums checked block by block. Before any
tensor is read the index is checked against the model and optimizer: a checkpoint
of another model is refused by name. Every rank then agrees on the outcome, so one
rank's bad file stops all of them with its message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .outcome import all_ok
from .errors import CheckpointError
from .format import tensor_name
from .index import read_index
from .ranges import split_by_layout
from .reader import Reader
from .runstate import compatibility_problem


def fill_targets(ckpt_dir, index, targets, layout, backend=None, threads: int = 1) -> int:
    """Read every target piece; returns the bytes read from data files."""
    with Reader(ckpt_dir, index, threads) as reader:
        for piece in targets:
            on_host = isinstance(piece.array, np.ndarray)
            dtype = np.dtype(piece.array.dtype)
            host = piece.array if on_host else np.empty(piece.size, dtype=dtype)
            for param, span, pos in split_by_layout(layout, piece.offset, piece.size):
                name = tensor_name(piece.buffer, param)
                tid = index.tensor_id(name)
                if tid is None:
                    raise CheckpointError(f"checkpoint {ckpt_dir}: tensor {name} is not in it")
                reader.read(tid, span.offset, host[pos:pos + span.size])
            if not on_host:
                backend.copy_(piece.array, backend.asarray(host, dtype.name))
        return reader.bytes_read


def load(ckpt_dir, targets, layout, expected: dict, optimizer_kind: str | None, comm, *, backend=None,
         timeout: float = 300.0, threads: int = 1):
    """Check compatibility and fill ``targets`` on every rank; returns
    ``(index, bytes read on this rank)`` or raises the same error everywhere.
    ``optimizer_kind`` None: weights only; ``comm`` None: one process."""
    ckpt_dir = Path(ckpt_dir)

    def run():
        index = read_index(ckpt_dir)
        problem = compatibility_problem(index, expected, optimizer_kind)
        if problem:
            raise CheckpointError(f"checkpoint {ckpt_dir}: {problem}")
        return index, fill_targets(ckpt_dir, index, targets, layout, backend, threads)

    return all_ok(comm, run, timeout=timeout)


__all__ = ["load", "fill_targets"]

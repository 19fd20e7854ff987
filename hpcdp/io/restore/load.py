"""One restore: every rank reads the ranges its new role needs (and only those);
replicas read 1/M each and share (spread.py).

The strategy names the arrays this rank fills (``checkpoint_targets``: a DDP
replica fills everything, a ZeRO or parameter-server shard only its range); each is
cut at parameter boundaries and read from the intersecting stored pieces
(:class:`~hpcdp.io.restore.reader.Reader`), checksums checked block by block. Before any
tensor is read the index is checked against the model and optimizer: a checkpoint
of another model is refused by name. Every rank then agrees on the outcome, so one
rank's bad file stops all of them with its message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import AGREEMENT, CheckpointError
from ..format.names import tensor_name
from ..format.index import read_index
from ..format.ranges import split_by_layout
from .reader import Reader
from ..format.runstate import compatibility_problem
from .spread import common_targets, exchange, plan, shares


def _hosts(targets) -> list:
    """Host arrays to read into: the targets themselves, or staging for device ones."""
    return [p.array if isinstance(p.array, np.ndarray) else np.empty(p.size, dtype=np.dtype(p.array.dtype))
            for p in targets]


def _to_device(targets, hosts, backend) -> None:
    for piece, host in zip(targets, hosts):
        if host is not piece.array:
            backend.copy_(piece.array, backend.asarray(host, host.dtype.name))


def fill_targets(ckpt_dir, index, targets, layout, backend=None, threads: int = 1) -> int:
    """Read every target piece; returns the bytes read from data files."""
    hosts = _hosts(targets)
    reads = []
    for piece, host in zip(targets, hosts):
        for param, span, pos in split_by_layout(layout, piece.offset, piece.size):
            name = tensor_name(piece.buffer, param)
            tid = index.tensor_id(name)
            if tid is None:
                raise CheckpointError(f"checkpoint {ckpt_dir}: tensor {name} is not in it")
            reads.append((tid, span.offset, host[pos:pos + span.size]))
    with Reader(ckpt_dir, index, threads) as reader:
        # every piece's metadata first, with the disk idle; then few large reads
        reader.prepare([(tid, lo, out.shape[0]) for tid, lo, out in reads])
        for tid, lo, out in reads:
            reader.read(tid, lo, out, wait=False)
        reader.wait()
        _to_device(targets, hosts, backend)
        return reader.bytes_read


def load(ckpt_dir, targets, layout, expected: dict, optimizer_kind: str | None, comm, *, backend=None,
         timeout: float = 300.0, threads: int = 1, spread: bool = True):
    """Check compatibility and fill ``targets`` on every rank; returns
    ``(index, bytes read on this rank)`` or raises the same error everywhere.
    ``optimizer_kind`` None: weights only; ``comm`` None: one process. The targets
    every rank restores (a replica's) are, with ``spread``, read 1/M per rank and
    shared (spread.py); the others each rank reads alone."""
    ckpt_dir = Path(ckpt_dir)
    # decided before anything can fail: every rank takes the same path
    common = common_targets(comm, targets, timeout) if spread else []
    together = [targets[i] for i in common]            # every rank's: read 1/M, shared
    alone = [t for i, t in enumerate(targets) if i not in set(common)]   # this rank's own
    hosts = _hosts(together)

    readers: list = []   # the replica reader, made once the index is read; closed below

    def run():
        index = read_index(ckpt_dir)
        problem = compatibility_problem(index, expected, optimizer_kind)
        if problem:
            raise CheckpointError(f"checkpoint {ckpt_dir}: {problem}")
        nbytes = fill_targets(ckpt_dir, index, alone, layout, backend, threads) if alone else 0
        if not together:
            return index, nbytes, None
        segs = plan(index, together, layout, ckpt_dir)
        owners = shares(segs, together, comm.Get_size())
        readers.append(Reader(ckpt_dir, index, threads))
        # this rank's files and pieces checked before any bulk read, its reads merged
        readers[0].prepare([(segs[k][3], segs[k][4], segs[k][2]) for k in owners[comm.Get_rank()]])
        return index, nbytes, (segs, owners)

    try:
        index, nbytes, planned = AGREEMENT.all_ok(comm, run, timeout=timeout)
        if planned is not None:  # every rank has the index and the same plan: read 1/M and share it
            error = exchange(readers[0], comm, *planned, hosts, timeout)
            nbytes += readers[0].bytes_read
            AGREEMENT.agree(comm, error, timeout=timeout)
            _to_device(together, hosts, backend)
    finally:
        for reader in readers:
            reader.close()
    return index, nbytes


__all__ = ["load", "fill_targets"]

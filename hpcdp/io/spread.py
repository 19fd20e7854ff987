"""Restores of replicated state read each byte once: M ranks read 1/M, then share.

Under a replicated strategy (none, DDP, a parameter server's worker replicas) every
rank needs the whole state, and reading it on each would make the file system
serve the checkpoint M times. The targets that every rank of the checkpoint's
communicator asks for (compared by a digest of their buffer, offset, size and
dtype: one small agreement) are planned once, identically on every rank, and split:

1. the targets' elements are cut where they meet stored pieces and at the stored
   pieces' checksum blocks (``BLOCK_BYTES``), giving segments of at most one block
   each, in target order;
2. rank r takes the run of segments that starts in the r-th M-th of the bytes, so
   the ranks' shares tile the targets without overlap and no block is read (or
   hashed) twice;
3. each rank reads and verifies its share (the usual :class:`Reader`) into the
   target arrays, every rank agrees the reads went well, and each share is
   broadcast from its reader (MPI ``Ibcast`` in at most ``SHARE_BYTES`` pieces,
   all posted at once, polled against the comm timeout).

Targets that differ between ranks (ZeRO, parameter-server shards and their
optimizer state) are read as before: each rank reads only what it owns.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .checksum import block_elements
from .errors import CheckpointError
from .format import tensor_name
from .ranges import intersect, split_by_layout

SHARE_BYTES = 1 << 30   # the largest single broadcast (MPI counts are 32-bit)


def targets_digest(targets) -> np.ndarray:
    desc = repr([(p.buffer, int(p.offset), int(p.size), np.dtype(p.array.dtype).str) for p in targets])
    return np.frombuffer(hashlib.sha256(desc.encode()).digest(), dtype=np.uint8)


def common_targets(comm, targets, timeout: float) -> list[int]:
    """Indices of this rank's targets that every rank of ``comm`` (two or more) also
    restores, in an order all ranks share (by digest); [] on one rank."""
    if comm is None or comm.Get_size() == 1:
        return []
    from .outcome import allgather_rows

    mine = np.stack([targets_digest([t]) for t in targets]) if targets else np.zeros((0, 32), np.uint8)
    rows = allgather_rows(comm, mine, timeout=timeout)
    common = set.intersection(*[{bytes(d) for d in r} for r in rows])
    local = {}
    for i, d in enumerate(mine):
        local.setdefault(bytes(d), i)
    return [local[d] for d in sorted(common)]


def same_everywhere(comm, targets, timeout: float) -> bool:
    """True when every rank of ``comm`` (two or more) restores the same targets."""
    return bool(targets) and len(common_targets(comm, targets, timeout)) == len(targets)


def plan(index, targets, layout, ckpt_dir) -> list[tuple[int, int, int, int, int]]:
    """Segments ``(target, position in it, elements, tensor id, tensor element)`` that
    tile every target, none crossing a stored piece or checksum block boundary."""
    segs = []
    for j, piece in enumerate(targets):
        block = block_elements(np.dtype(piece.array.dtype).itemsize)
        for param, span, pos in split_by_layout(layout, piece.offset, piece.size):
            name = tensor_name(piece.buffer, param)
            tid = index.tensor_id(name)
            if tid is None:
                raise CheckpointError(f"checkpoint {ckpt_dir}: tensor {name} is not in it")
            for _, _, off, size in index.pieces_of(tid):
                off = int(off)
                for ov in intersect([(span.offset, span.size)], [(off, int(size))]):
                    lo = ov.offset
                    while lo < ov.end:
                        hi = min(ov.end, off + ((lo - off) // block + 1) * block)
                        segs.append((j, pos + lo - span.offset, hi - lo, tid, lo))
                        lo = hi
    return sorted(segs)  # by target, then position: a run of segments is one range


def shares(segs, targets, size: int) -> list[list[int]]:
    """Segment indices of each of ``size`` ranks: contiguous runs, by bytes."""
    nbytes = [n * np.dtype(targets[j].array.dtype).itemsize for j, _, n, _, _ in segs]
    starts = np.concatenate([[0], np.cumsum(nbytes)]).astype(np.int64)
    total = int(starts[-1])
    owner = np.minimum(starts[:-1] * size // max(1, total), size - 1) if segs else np.zeros(0, np.int64)
    return [np.nonzero(owner == r)[0].tolist() for r in range(size)]


def read_share(reader, segs, mine, hosts) -> None:
    for k in mine:
        j, pos, n, tid, lo = segs[k]
        reader.read(tid, lo, hosts[j][pos:pos + n], wait=False)
    reader.wait()


def share(comm, segs, owners, hosts, timeout: float) -> None:
    """Broadcast each rank's share of ``hosts`` from it to every other rank."""
    from hpcdp.failure.deadline import wait

    reqs, roots = [], []
    for r, mine in enumerate(owners):
        # a rank's segments of one target are adjacent: one range per (rank, target)
        ranges: dict = {}
        for k in mine:
            j, pos, n, _, _ = segs[k]
            a, b = ranges.get(j, (pos, pos))
            ranges[j] = (min(a, pos), max(b, pos + n))
        for j, (a, b) in ranges.items():
            raw = hosts[j][a:b].view(np.uint8)
            for c in range(0, raw.shape[0], SHARE_BYTES):
                reqs.append(comm.Ibcast(raw[c:c + SHARE_BYTES], root=r))
                roots.append(r)
    wait(reqs, timeout, "the checkpoint's pieces from the ranks that read them", sources=roots)


__all__ = ["common_targets", "same_everywhere", "plan", "shares", "read_share", "share", "targets_digest", "SHARE_BYTES"]

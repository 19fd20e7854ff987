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
3. every rank agrees that the index and the plan are good (one agreement), posts
   its receives of the other ranks' shares straight into its target arrays, and
   reads and verifies its own share (the usual :class:`Reader`) in chunks of about
   ``CHUNK_BYTES``: each chunk is sent (``Isend`` to every other rank, one tag of
   its own) as soon as its blocks are verified, while the next ones are read, so
   the sharing runs under the reading instead of after it; the waits poll against
   the comm timeout;
4. a rank whose read fails (a checksum mismatch, an I/O error) stops reading but
   still sends every chunk it owes, so no rank waits for it past the timeout; a
   second agreement then raises that rank's message everywhere.

Each rank sends its 1/M to M - 1 ranks and receives (M - 1)/M: the bytes an
all-gather moves, without a root and without a copy through staging buffers.

Targets that differ between ranks (ZeRO, parameter-server shards and their
optimizer state) are read as before: each rank reads only what it owns.
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import wait as futures_wait

import numpy as np

from ..format.checksum import block_elements
from ..errors import CheckpointError
from ..format.names import tensor_name
from ..format.ranges import intersect, split_by_layout
from .reader import QUEUED

CHUNK_BYTES = 16 << 20  # a share is sent in runs of about this many bytes, each once it is verified
TAG_SHARE = 4353        # point-to-point tag of the shares on the checkpoint's communicator
POLL_S = 5e-4           # the exchange's poll interval while waiting


def targets_digest(targets) -> np.ndarray:
    desc = repr([(p.buffer, int(p.offset), int(p.size), np.dtype(p.array.dtype).str) for p in targets])
    return np.frombuffer(hashlib.sha256(desc.encode()).digest(), dtype=np.uint8)


def common_targets(comm, targets, timeout: float) -> list[int]:
    """Indices of this rank's targets that every rank of ``comm`` (two or more) also
    restores, in an order all ranks share (by digest); [] on one rank."""
    if comm is None or comm.Get_size() == 1:
        return []
    from hpcdp.failure.agreement import allgather_rows

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


def chunks(segs, mine, hosts) -> list[tuple[int, int, int, list[int]]]:
    """``(target, start, end, segment indices)`` runs of one rank's share ``mine``
    (segment indices in order): adjacent segments of one target, cut after at least
    ``CHUNK_BYTES``. Every rank computes every rank's runs alike."""
    out: list = []
    for k in mine:
        j, pos, n, _, _ = segs[k]
        if out and out[-1][0] == j and out[-1][2] == pos and \
                (out[-1][2] - out[-1][1]) * hosts[j].itemsize < CHUNK_BYTES:
            t, a, _, ks = out[-1]
            out[-1] = (t, a, pos + n, ks + [k])
        else:
            out.append((j, pos, pos + n, [k]))
    return out


def exchange(reader, comm, segs, owners, hosts, timeout: float) -> str | None:
    """Read this rank's share into ``hosts`` and send it chunk by chunk as it is
    verified, while receiving every other rank's; returns None, or this rank's
    error (every chunk owed was sent all the same: see the module's step 4)."""
    from mpi4py import MPI

    from hpcdp.failure.deadline import wait

    rank, size = comm.Get_rank(), comm.Get_size()
    runs = [chunks(segs, owners[r], hosts) for r in range(size)]
    reqs, peers = [], []
    for r in range(size):
        if r != rank:
            for j, a, b, _ in runs[r]:
                reqs.append(comm.Irecv(hosts[j][a:b].view(np.uint8), source=r, tag=TAG_SHARE))
                peers.append(r)
    mine, marks, error = runs[rank], [], None

    def send(c) -> None:
        j, a, b, _ = mine[c]
        raw = hosts[j][a:b].view(np.uint8)
        for d in range(1, size):   # the next ranks first: no two ranks start on the same peer
            reqs.append(comm.Isend(raw, dest=(rank + d) % size, tag=TAG_SHARE))
            peers.append((rank + d) % size)

    sent = 0
    deadline = time.monotonic() + timeout
    try:
        while sent < len(mine):
            while len(marks) < len(mine) and reader.queued - reader.checked < QUEUED:
                for k in mine[len(marks)][3]:   # queue the next chunk's reads
                    _, pos, n, tid, lo = segs[k]
                    reader.read(tid, lo, hosts[mine[len(marks)][0]][pos:pos + n], wait=False)
                marks.append(reader.queued)
            reader.poll()
            while sent < len(marks) and reader.checked >= marks[sent]:
                send(sent)
                sent += 1
            if sent < len(mine):
                MPI.Request.Testall(reqs)   # the receives progress while this rank reads
                oldest = reader.oldest()
                if oldest is not None:
                    futures_wait([oldest], timeout=POLL_S)
                if time.monotonic() > deadline:
                    raise CheckpointError(f"rank {rank}: reading its share of the checkpoint took more than "
                                          f"{timeout:.0f} s")
    except Exception as e:   # noqa: BLE001 - every rank must still get what it is owed
        error = str(e) if isinstance(e, (CheckpointError, OSError)) else f"{type(e).__name__}: {e}"
        reader.close()       # no read still writing into a buffer about to be sent
        while sent < len(mine):
            send(sent)
            sent += 1
    while not MPI.Request.Testall(reqs):   # gently: the other ranks may still be reading
        if time.monotonic() > deadline:
            wait(reqs, 0.0, "the checkpoint's pieces from the ranks that read them", sources=peers)
        time.sleep(POLL_S)
    return error


__all__ = ["common_targets", "same_everywhere", "plan", "shares", "chunks", "exchange", "targets_digest",
           "CHUNK_BYTES", "TAG_SHARE"]

"""Bruck's all-gather: ``ceil(log2 N)`` steps for any N, no fold.

Step ``k`` (distance ``d = 2^k``): rank ``r`` holds chunks ``r .. r+d-1`` (mod N); it
sends the first ``c = min(d, N - d)`` of them to ``r - d`` and receives chunks
``r+d .. r+d+c-1`` from ``r + d``. Bruck et al. (1997) rotate the buffer so every step
is one contiguous block; here the chunks are received straight into their ring
positions (``shard_range``: the same chunk layout as the ring, ZeRO's shard contract),
so a step is at most two contiguous pieces (where the range wraps past rank N-1) and no
scratch or final rotation is needed.

Against recursive doubling (hpcdp.comm.schedules.halving) it wins when N is not a power of two:
``ceil(log2 N)`` steps instead of ``floor(log2 N) + 2`` (fold and unfold), and no rank
moves the whole buffer twice. Each rank receives every chunk but its own once (the
ring's ``n - c_r``); it sends ``sum_k |chunks r .. r+c_k-1|`` (hpcdp.comm.model.volume.
bruck_bytes), ``(N-1)/N * S`` with even chunks. Copy only: no reduction, no order.
"""

from __future__ import annotations


def _spans(at, N, first, count):
    """Element ranges of chunks ``first .. first+count-1`` (mod N): one or two pieces."""
    first %= N
    end = first + count
    if end <= N:
        return [(at(first), at(end))]
    return [(at(first), at(N)), (at(0), at(end - N))]


def bruck_steps(req, buf, at, rank: int, N: int, comm=None, step0: int = 0):
    """Generator body: in place on ``buf`` (this rank's chunk in position)."""
    d, s = 1, step0
    while d < N:
        c = min(d, N - d)
        tag = req.ctx.tag(req.seq, s)
        to, frm = (rank - d) % N, (rank + d) % N
        msgs = []
        for lo, hi in _spans(at, N, rank, c):
            msgs += req.isend(buf[lo:hi], to, tag, comm)
        for lo, hi in _spans(at, N, rank + d, c):
            msgs += req.irecv(buf[lo:hi], frm, tag, comm)
        yield msgs
        d <<= 1
        s += 1


def start_all_gather(ctx, call, ledger, timeout, *, full, result, segment_bytes,
                     max_message_bytes):
    """The registered start (hpcdp.comm.algorithms): ``full`` holds this rank's chunk."""
    from hpcdp.comm.schedules.halving import ring_offsets
    from hpcdp.comm.core.requests import GenRequest

    at = ring_offsets(full.size, ctx.size)
    body = lambda req: bruck_steps(req, full, at, ctx.rank, ctx.size)  # noqa: E731
    req = GenRequest(ctx, "all_gather", call, ledger, timeout, body, max_message_bytes)
    req.result = result
    return req


__all__ = ["bruck_steps", "start_all_gather"]

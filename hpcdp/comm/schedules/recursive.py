"""Recursive doubling: the latency-bound allreduce for small messages.

log2(p) exchange rounds of the whole buffer instead of the ring's 2(N-1) rounds
of 1/N of it: fewer, larger-per-byte messages, so it wins while per-message
latency dominates and loses once bandwidth does (each rank moves log2(p) * S
bytes instead of 2(N-1)/N * S).

Any N: with p the largest power of two <= N and rem = N - p, ranks below 2*rem
pair up first (even rank r folds its buffer into r+1 and sits out), the p
remaining ranks run recursive doubling, and each folded rank gets the result
back from its partner. Every pairwise reduction is computed as
op(lower rank's data, higher rank's data) on both partners, so all ranks end with
bitwise identical results.

Per rank: a rank that sits out sends S and receives S; its partner additionally
receives S and sends S; every one of the p ranks sends and receives log2(p) * S.
"""

from __future__ import annotations


def recursive_doubling(req, buf, op, tmp):
    """Generator body for :class:`~hpcdp.comm.core.requests.GenRequest` (in place on ``buf``)."""
    ctx = req.ctx
    N, r = ctx.size, ctx.rank
    p = 1 << (N.bit_length() - 1)
    rem = N - p

    def tag(step):
        return ctx.tag(req.seq, step)

    if r < 2 * rem and r % 2 == 0:  # fold into r+1, wait for the result
        yield req.isend(buf, r + 1, tag(0))
        yield req.irecv(buf, r + 1, tag(1))
        return None
    if r < 2 * rem:
        yield req.irecv(tmp, r - 1, tag(0))
        op.reduce(buf, tmp, buf)
        newrank = r // 2
    else:
        newrank = r - rem
    mask, step = 1, 2
    while mask < p:
        pn = newrank ^ mask
        peer = pn * 2 + 1 if pn < rem else pn + rem
        yield req.isend(buf, peer, tag(step)) + req.irecv(tmp, peer, tag(step))
        if peer < r:
            op.reduce(buf, tmp, buf)
        else:
            op.reduce(buf, buf, tmp)
        mask <<= 1
        step += 1
    op.finalize(buf, N)
    if r < 2 * rem:
        yield req.isend(buf, r - 1, tag(1))
    return None


def start_allreduce(ctx, call, ledger, timeout, *, src, work, result, op, segment_bytes, max_message_bytes):
    """The registered start of recursive doubling (hpcdp.comm.algorithms): in place on
    ``work``, with pooled scratch of its size."""
    import numpy as np

    from hpcdp.comm.core.requests import GenRequest

    if src is not work:
        work[...] = src

    def body(req):
        if isinstance(work, np.ndarray):
            tmp = req.scratch(work.size, work.dtype)
        else:
            from hpcdp.comm.core.device import device_scratch
            tmp = device_scratch(ctx, work.size, work.dtype)
        return (yield from recursive_doubling(req, work, op, tmp))

    req = GenRequest(ctx, "allreduce", call, ledger, timeout, body, max_message_bytes)
    req.result = result
    return req


def expected_bytes(n_bytes: int, N: int, rank: int) -> tuple[int, int]:
    """(sent, received) bytes of ``rank`` for an ``n_bytes`` recursive doubling
    (:func:`hpcdp.comm.model.volume.recursive_bytes`, the one formula)."""
    from hpcdp.comm.model.volume import recursive_bytes

    return recursive_bytes(n_bytes, N, rank)

"""Recursive halving reduce-scatter and recursive doubling all-gather: log2 N steps.

The ring needs N-1 steps per phase; these need ``log2 p`` (``p`` the largest power of
two <= N) plus, when N is not a power of two, one fold and one unfold, as MPICH does:
with ``rem = N - p``, the ranks below ``2 * rem`` pair up (even rank ``r`` with ``r+1``),
and the pair counts as one "virtual" rank that owns the chunks of both. Virtual rank
``i`` owns ring chunks ``[2i, 2i+2)`` if ``i < rem``, else chunk ``i + rem``: contiguous
and in order, so a window of virtual ranks is one contiguous range of the buffer.

The contract (ZeRO's shard is the ring chunk, hpcdp.ownership): rank ``r`` ends the
reduce-scatter with exactly ring chunk ``r`` (``shard_range(n, N, r)``, uneven lengths
included) and the all-gather starts from it. Chunks are given by their offsets, so the
hierarchical reduce-scatter / all-gather (hpcdp.comm.hier_shard) runs these same steps
on its own chunk layout.

- Reduce-scatter: fold (even rank ``r < 2 rem`` sends its whole buffer to ``r+1``,
  which adds it); then virtual ranks halve their window ``log2 p`` times: rank ``i``
  exchanges with ``i ^ half``, sends the half of the window it does not keep and adds
  the half it receives; finally each odd fold rank sends chunk ``r-1`` back.
- All-gather: the mirror: fold (even ranks hand their chunk to ``r+1``), windows double
  ``log2 p`` times (exchange the whole window with ``i ^ size``), unfold (odd ranks send
  everything but chunk ``r-1`` to ``r-1``).

Addition order: every pairwise step computes ``op(lower rank's data, higher rank's
data)``, so element ``k`` of chunk ``c`` is the balanced binary tree over ranks in rank
order, ``((x0 + x1) + (x2 + x3)) + ...`` (with the fold pairs as leaves): not the ring's
order (which starts after the chunk's owner), so float sums may differ from the ring's
in the last bits; integer and exact-mode payloads (integers, hpcdp.strategies.codec) are
bit-for-bit equal because integer addition is associative. Deterministic: the same
inputs give the same bits on every run.

Bytes per rank (hpcdp.comm.model.volume.halving_bytes): with ``N = 2^k`` and ``N | n``, each
phase sends and receives ``(N-1)/N * S``, the ring's volume, in ``log2 N`` messages
instead of ``N-1``. Non-powers of two add ``S`` (the fold) on the fold ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcdp.comm.model.volume import halving_steps, offsets_of


@dataclass(frozen=True)
class Peers:
    """Who talks: ``size`` ranks of ``comm`` (an MPI communicator; None: the request's
    data communicator), this one being ``rank``."""

    comm: object
    rank: int
    size: int


def reduce_scatter_steps(req, buf, at, op, tmp, peers: Peers, step0: int = 0):
    """Generator body: in place on ``buf``, this rank's chunk ``[at(r), at(r+1))``
    reduced over the ``peers`` (``at(c)``: chunk c's offset, ``at(size)`` the end).
    ``tmp``: scratch of ``at(size) - at(0)`` elements. No finalize (the caller's).
    The steps are hpcdp.comm.model.volume.halving_steps (the ledger's formula walks the same)."""
    N, r, comm = peers.size, peers.rank, peers.comm
    rem = N - (1 << (N.bit_length() - 1))
    lo_all, hi_all = at(0), at(N)

    def tag(s):
        return req.ctx.tag(req.seq, step0 + s)
    if r < 2 * rem and r % 2 == 0:  # fold into r+1, get chunk r back reduced
        yield req.isend(buf[lo_all:hi_all], r + 1, tag(0), comm)
        yield req.irecv(buf[at(r):at(r + 1)], r + 1, tag(1), comm)
        return
    if r < 2 * rem:
        t = tmp[:hi_all - lo_all]
        yield req.irecv(t, r - 1, tag(0), comm)
        op.reduce(buf[lo_all:hi_all], t, buf[lo_all:hi_all])
    for s, (peer, _, keep, give) in enumerate(halving_steps(N, r), start=2):
        k0, k1 = at(keep[0]), at(keep[1])
        t = tmp[:k1 - k0]
        yield (req.isend(buf[at(give[0]):at(give[1])], peer, tag(s), comm)
               + req.irecv(t, peer, tag(s), comm))
        out = buf[k0:k1]
        if peer < r:
            op.reduce(out, t, out)
        else:
            op.reduce(out, out, t)
    if r < 2 * rem:  # chunk r-1 back to its owner
        yield req.isend(buf[at(r - 1):at(r)], r - 1, tag(1), comm)


def all_gather_steps(req, buf, at, peers: Peers, step0: int = 0):
    """Generator body: in place on ``buf`` (this rank's chunk ``[at(r), at(r+1))`` in
    position), every chunk of the ``peers`` received into position: the halving steps
    backwards (send the window kept there, receive the one given)."""
    N, r, comm = peers.size, peers.rank, peers.comm
    rem = N - (1 << (N.bit_length() - 1))
    lo_all, hi_all = at(0), at(N)

    def tag(s):
        return req.ctx.tag(req.seq, step0 + s)
    if r < 2 * rem and r % 2 == 0:
        yield req.isend(buf[at(r):at(r + 1)], r + 1, tag(0), comm)
        yield (req.irecv(buf[lo_all:at(r)], r + 1, tag(1), comm)
               + req.irecv(buf[at(r + 1):hi_all], r + 1, tag(1), comm))
        return
    if r < 2 * rem:
        yield req.irecv(buf[at(r - 1):at(r)], r - 1, tag(0), comm)
    steps = halving_steps(N, r)
    for s, (peer, _, keep, give) in reversed(list(enumerate(steps, start=2))):
        yield (req.isend(buf[at(keep[0]):at(keep[1])], peer, tag(s), comm)
               + req.irecv(buf[at(give[0]):at(give[1])], peer, tag(s), comm))
    if r < 2 * rem:  # everything but chunk r-1 to the folded partner
        yield (req.isend(buf[lo_all:at(r - 1)], r - 1, tag(1), comm)
               + req.isend(buf[at(r):hi_all], r - 1, tag(1), comm))


def ring_offsets(n: int, N: int):
    """``at(c)`` for the ring's chunks (hpcdp.shard.shard_range), ``at(N) = n``."""
    return offsets_of(n, N)


def scratch_like(req, n, like):
    """``n`` elements of ``like``'s dtype from the request's pool: host memory for a
    NumPy ``like``, device memory for a device array."""
    if isinstance(like, np.ndarray):
        return req.scratch(n, like.dtype)
    from hpcdp.comm.core.device import device_scratch
    return device_scratch(req.ctx, n, like.dtype)


def start_reduce_scatter(ctx, call, ledger, timeout, *, src, out, in_place, result, op,
                         segment_bytes, max_message_bytes):
    """The registered start (hpcdp.comm.algorithms): ``src`` the full input, ``out``
    this rank's chunk (a view of ``src`` in place)."""
    from hpcdp.comm.core.requests import GenRequest

    N, r, n = ctx.size, ctx.rank, src.size
    at = ring_offsets(n, N)

    def body(req):
        work = src if in_place else scratch_like(req, n, src)
        if not in_place:
            work[...] = src
        tmp = scratch_like(req, n, src)
        yield from reduce_scatter_steps(req, work, at, op, tmp, Peers(None, r, N))
        chunk = work[at(r):at(r + 1)]
        op.finalize(chunk, N)
        if not in_place:
            out[...] = chunk

    req = GenRequest(ctx, "reduce_scatter", call, ledger, timeout, body, max_message_bytes)
    req.result = result
    return req


def start_all_gather(ctx, call, ledger, timeout, *, full, result, segment_bytes,
                     max_message_bytes):
    """The registered start: ``full`` holds this rank's chunk in position."""
    from hpcdp.comm.core.requests import GenRequest

    at = ring_offsets(full.size, ctx.size)
    body = lambda req: all_gather_steps(req, full, at, Peers(None, ctx.rank, ctx.size))  # noqa: E731
    req = GenRequest(ctx, "all_gather", call, ledger, timeout, body, max_message_bytes)
    req.result = result
    return req


__all__ = ["Peers", "reduce_scatter_steps", "all_gather_steps", "ring_offsets", "scratch_like",
           "start_reduce_scatter", "start_all_gather"]

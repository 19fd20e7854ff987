"""MPI's own collective as an engine: one non-blocking MPI call and a deadline poll.

``allreduce`` / ``reduce_scatter`` / ``all_gather`` start ``Iallreduce``,
``Ireduce_scatter_block`` / ``Ireduce_scatter``, ``Iallgather`` / ``Iallgatherv`` on the
context's data communicator for host numpy buffers and a built-in op, and return a
:class:`FastRequest`: the request interface (``test``, ``wait``, ``expire``, ``done``,
``result``) with ``__slots__`` and no generator, whose wait is :func:`spin`, a ``Test``
loop that looks at the clock every 64 polls. Nothing else goes on the wire; past the
deadline the missing-rank diagnosis runs as for every request (hpcdp.comm.core.diagnose).
The ledger records what ``algorithm="native"`` records
(:func:`hpcdp.comm.model.volume.native_bytes`).

Users: the front's small-message path (hpcdp.comm.fast), broadcast and barrier
(hpcdp.comm.collectives), and the node layout's agreement (hpcdp.comm.nodes).
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from hpcdp.comm.core.debug import SPIN_POLLS
from hpcdp.comm.core.diagnose import diagnose, peer_failed
from hpcdp.comm.core.errors import mpi_error
from hpcdp.comm.core.ops import mpi_datatype
from hpcdp.comm.core.requests import Request
from hpcdp.shard import shard_bounds


def _known_types(codes: str) -> dict:
    """The MPI datatype of each numpy type code this MPI has (hpcdp.comm.core.ops.mpi_datatype;
    Open MPI 4 has no float16, 'e': mpi4py cannot map it there, and importing hpcdp.comm
    must not fail)."""
    out = {}
    for c in codes:
        try:
            out[c] = mpi_datatype(np.dtype(c))
        except (KeyError, ValueError):
            pass
    return out


_TYPES = _known_types("bBhHiIlLqQefd")


def mpi_type(dtype):
    t = _TYPES.get(dtype.char)
    return t if t is not None else mpi_datatype(dtype)


def _chunk(ctx, n):
    """(offset, size, counts or None) of this rank's shard of ``n``; counts only
    when N does not divide n (MPI's v-variants need them)."""
    N = ctx.size
    if n % N == 0:
        return ctx.rank * (n // N), n // N, None
    counts, displs = _bounds(ctx, n)
    return displs[ctx.rank], counts[ctx.rank], counts


def _bounds(ctx, n):
    """(counts, displacements) of the shard rule for ``n``, cached per communicator."""
    hit = ctx.shard_cache.get(n)
    if hit is None:
        if len(ctx.shard_cache) > 4096:
            ctx.shard_cache.clear()
        b = shard_bounds(n, ctx.size)
        hit = ctx.shard_cache[n] = ([s for _, s in b], [o for o, _ in b])
    return hit


class FastRequest(Request):
    """One MPI request, polled under the timeout (see module docstring). Shares
    ``test`` and ``expire`` with :class:`~hpcdp.comm.core.requests.Request`, without its
    constructor (no message bookkeeping: one MPI call)."""

    __slots__ = ("req", "nbytes", "after")

    def __init__(self, ctx, req, call, ledger, nbytes, timeout, result, after=None):
        self.ctx, self.req, self.call, self.ledger, self.nbytes = ctx, req, call, ledger, nbytes
        self.timeout = ctx.timeout if timeout is None else float(timeout)
        self.started = time.monotonic()
        self.result, self.after, self.done, self._polls = result, after, False, 0

    @property
    def name(self) -> str:
        return self.call[1]

    @property
    def seq(self) -> int:
        return self.call[0]

    def _progress(self) -> bool:
        return self.req.Test()

    def _complete(self) -> None:
        self.done = True
        if self.after is not None:
            self.after()
        if self.ledger is not None:  # (sent, received[, sent messages, received messages])
            sent, recv, *msgs = self.nbytes
            self.ledger.record(self.call[1], sent, recv, *(msgs or (1, 1)), calls=1)

    def wait(self, timeout: float | None = None):
        if not self.done:
            if not _test(self.ctx, self.req, self.call):
                spin(self.ctx, self.req, self.call, self.timeout if timeout is None else timeout,
                     self.started)
            self._complete()
        return self.result

    def _timeout(self, limit, joined=False):
        return diagnose(self.ctx, self.call, time.monotonic() - self.started, limit, (),
                        joined=joined)


def _mean(arr, N):
    if arr.dtype.kind in "iu":
        np.floor_divide(arr, N, out=arr)
    else:
        np.true_divide(arr, arr.dtype.type(N), out=arr)


def allreduce(ctx, call, src, work, result, op, ledger, timeout):
    T = mpi_type(work.dtype)
    s = MPI.IN_PLACE if src is work else [src, T]
    req = ctx.data.Iallreduce(s, [work, T], op.mpi_op(work.dtype))
    after = (lambda: _mean(work, ctx.size)) if op.is_mean else None
    return FastRequest(ctx, req, call, ledger, (work.nbytes, work.nbytes), timeout, result, after)


def reduce_scatter(ctx, call, src, out, in_place, result, op, ledger, timeout):
    """``out``: this rank's chunk (for in place, the chunk's view inside ``src``)."""
    T = mpi_type(src.dtype)
    N, n = ctx.size, src.size
    mpi_op = op.mpi_op(src.dtype)
    target = out
    if in_place:  # MPI's in-place result lands at the buffer's start: go through scratch
        raw = ctx.pool.get(out.nbytes)
        target = raw[:out.nbytes].view(src.dtype)
    if n % N == 0:
        req = ctx.data.Ireduce_scatter_block([src, T], [target, T], mpi_op)
    else:
        req = ctx.data.Ireduce_scatter([src, T], [target, T], _bounds(ctx, n)[0], mpi_op)

    def after():
        if op.is_mean:
            _mean(target, N)
        if in_place:
            out[...] = target
            ctx.pool.put(raw)
    needs = op.is_mean or in_place
    return FastRequest(ctx, req, call, ledger, (src.nbytes, out.nbytes), timeout, result,
                       after if needs else None)


def all_gather(ctx, call, chunk, full, result, ledger, timeout):
    """``chunk`` None: in place (``full`` holds this rank's chunk at its position)."""
    T = mpi_type(full.dtype)
    N, n = ctx.size, full.size
    if n % N == 0:
        s = MPI.IN_PLACE if chunk is None else [chunk, T]
        req = ctx.data.Iallgather(s, [full, T])
        mine = n // N
    else:
        counts, displs = _bounds(ctx, n)
        s = MPI.IN_PLACE if chunk is None else [chunk, T]
        req = ctx.data.Iallgatherv(s, [full, counts, displs, T])
        mine = counts[ctx.rank]
    item = full.dtype.itemsize
    return FastRequest(ctx, req, call, ledger, (mine * item, n * item), timeout, result)


def spin(ctx, req, call, timeout, started=None) -> None:
    """Poll ``req`` until done or past the deadline (then the diagnosis' error): busy
    for SPIN_POLLS tests, then yielding the core and joining a peer's diagnosis."""
    now = time.monotonic()
    started = now if started is None else started
    limit = ctx.timeout if timeout is None else float(timeout)
    deadline = now + limit
    idle = 0
    while not _test(ctx, req, call):
        idle += 1
        if idle & 63 == 0:
            if ctx.failed is not None:  # aborted (hpcdp.comm.abort) or failed meanwhile
                raise ctx.failed
            if time.monotonic() > deadline:
                raise diagnose(ctx, call, time.monotonic() - started, limit, ())
            if idle > SPIN_POLLS:
                os.sched_yield()  # oversubscribed ranks: let the peer run
                if peer_failed(ctx):
                    raise diagnose(ctx, call, time.monotonic() - started, limit, (), joined=True)


def _test(ctx, req, call) -> bool:
    """``req.Test()``, an MPI error as MPIError (the communicator marked failed)."""
    try:
        return req.Test()
    except MPI.Exception as exc:
        err = mpi_error(exc, collective=call[1], seq=call[0], rank=ctx.rank)
        if ctx.failed is None:
            ctx.failed = err
        raise err from None


__all__ = ["FastRequest", "allreduce", "reduce_scatter", "all_gather", "mpi_type", "spin"]

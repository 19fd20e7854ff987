"""MPI's own collective as one engine: start the MPI call, count it in the ledger, poll
it under the deadline.

Every MPI collective hpcdp makes through mpi4py is posted here, one function per
collective: ``Iallreduce``, ``Ireduce_scatter_block`` / ``Ireduce_scatter`` (when N does
not divide the length), ``Iallgather`` / ``Iallgatherv`` on the context's data
communicator. Two ways in:

- the general front (hpcdp.comm.collectives), for a plan whose engine is "mpi":
  :func:`allreduce`, :func:`reduce_scatter`, :func:`all_gather` on checked buffers
  (numpy or device arrays, any op: a user op is mpi4py's user op; an allreduce is cut
  into pieces below ``max_message_bytes``, the pieces in flight together);
- the small-message path (hpcdp.comm.fast), for a plain call whose signature the
  chooser made a :func:`~hpcdp.comm.select.lean_signature` for: :func:`post_allreduce`,
  :func:`post_reduce_scatter`, :func:`post_all_gather` (the arrays themselves as MPI
  buffers where mpi4py maps them right, and for a blocking call no request object).

Either way the call is polled by :class:`FastRequest`: the request interface (``test``,
``wait``, ``expire``, ``done``, ``result``) with ``__slots__`` and no generator, whose
wait is :func:`spin`, a ``Test`` loop that looks at the clock every 64 polls. Nothing
else goes on the wire; past the deadline the missing-rank diagnosis runs as for every
request (hpcdp.comm.core.diagnose). The ledger records the bytes handed to MPI, one
message each way per piece (:func:`hpcdp.comm.model.volume.native_bytes`); what MPI
moves inside is not visible. The blocking calls' compiled twin, which posts the same
MPI call from compiled code, is hpcdp.comm.engines.compiled.lean.

Other users: broadcast and barrier (hpcdp.comm.collectives), the node layout's
agreement (hpcdp.comm.nodes).
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
from hpcdp.comm.core.requests import MAX_MESSAGE_BYTES, Request, pieces
from hpcdp.comm.engines.base import Engine
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


def known_type(dtype):
    """The MPI datatype of ``dtype``'s type code, or None (one this MPI lacks or no number)."""
    return _TYPES.get(dtype.char)


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


def divide_mean(arr, N):
    """The mean's division of MPI's sum in place: floor division for integers, one IEEE
    division by the dtype's N for floats."""
    if arr.dtype.kind in "iu":
        np.floor_divide(arr, N, out=arr)
    else:
        np.true_divide(arr, arr.dtype.type(N), out=arr)


class _Pieces:
    """An allreduce cut into pieces: their MPI requests, tested as one."""

    __slots__ = ("reqs",)

    def __init__(self, reqs):
        self.reqs = reqs

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name: FastRequest and spin call it)
        return MPI.Request.Testall(self.reqs)


def _finish(op, arr, N):
    """The mean's division after MPI's sum (None: nothing to do): numpy's for host
    arrays, the device kernel's for device arrays (hpcdp.comm.core.ops.Op.finalize)."""
    if not op.is_mean:
        return None
    if isinstance(arr, np.ndarray):
        return lambda: divide_mean(arr, N)
    return lambda: op.finalize(arr, N)


# -- the general front's calls (checked buffers, the call tuple made) ------------------

def allreduce(ctx, call, src, work, result, op, ledger, timeout, max_message_bytes=None):
    """MPI's allreduce of ``src`` into ``work`` (in place when they are one buffer), cut
    into pieces of at most ``max_message_bytes`` (default: below 2 GiB, MPI's int count)."""
    T = mpi_type(work.dtype)
    mpi_op = op.mpi_op(work.dtype)
    item = work.dtype.itemsize
    nbytes = work.size * item
    limit = MAX_MESSAGE_BYTES if max_message_bytes is None else int(max_message_bytes)
    if limit < 16:
        raise ValueError(f"max_message_bytes must be >= 16, got {limit}")
    if nbytes <= limit:
        s = MPI.IN_PLACE if src is work else [src, T]
        req, k = ctx.data.Iallreduce(s, [work, T], mpi_op), 1
    else:
        reqs = []
        for o, ln in pieces(work.size, item, limit):
            s = MPI.IN_PLACE if src is work else [src[o:o + ln], T]
            reqs.append(ctx.data.Iallreduce(s, [work[o:o + ln], T], mpi_op))
        req, k = _Pieces(reqs), len(reqs)
    return FastRequest(ctx, req, call, ledger, (nbytes, nbytes, k, k), timeout, result,
                       _finish(op, work, ctx.size))


def reduce_scatter(ctx, call, src, out, in_place, result, op, ledger, timeout):
    """``out``: this rank's chunk (for in place, the chunk's view inside ``src``)."""
    T = mpi_type(src.dtype)
    N, n = ctx.size, src.size
    mpi_op = op.mpi_op(src.dtype)
    item = src.dtype.itemsize
    target, raw = out, None
    if in_place:  # MPI's in-place result lands at the buffer's start: go through scratch
        if isinstance(src, np.ndarray):
            raw = ctx.pool.get(out.size * item)
            target = raw[:out.size * item].view(src.dtype)
        else:
            from hpcdp.comm.core.device import device_scratch
            target = device_scratch(ctx, out.size, out.dtype)
    if n % N == 0:
        req = ctx.data.Ireduce_scatter_block([src, T], [target, T], mpi_op)
    else:
        req = ctx.data.Ireduce_scatter([src, T], [target, T], _bounds(ctx, n)[0], mpi_op)
    mean = _finish(op, target, N)
    after = mean
    if in_place:
        def after():
            if mean is not None:
                mean()
            out[...] = target
            if raw is not None:
                ctx.pool.put(raw)
    return FastRequest(ctx, req, call, ledger, (n * item, out.size * item), timeout, result,
                       after)


def all_gather(ctx, call, chunk, full, result, ledger, timeout):
    """``chunk`` None: in place (``full`` holds this rank's chunk at its position)."""
    T = mpi_type(full.dtype)
    N, n = ctx.size, full.size
    s = MPI.IN_PLACE if chunk is None else [chunk, T]
    if n % N == 0:
        req = ctx.data.Iallgather(s, [full, T])
        mine = n // N
    else:
        counts, displs = _bounds(ctx, n)
        req = ctx.data.Iallgatherv(s, [full, counts, displs, T])
        mine = counts[ctx.rank]
    item = full.dtype.itemsize
    return FastRequest(ctx, req, call, ledger, (mine * item, n * item), timeout, result)


def launch(ctx, alg, plan, call, ledger, timeout, bufs, segment_bytes, max_message_bytes,
           blocking, asked):
    """MPI's own collective on checked buffers (hpcdp.comm.engines.registry's launch)."""
    c = plan.collective
    if c == "allreduce":
        return allreduce(ctx, call, bufs["src"], bufs["work"], bufs["result"], bufs["op"],
                         ledger, timeout, max_message_bytes)
    if c == "reduce_scatter":
        return reduce_scatter(ctx, call, bufs["src"], bufs["out"], bufs["in_place"],
                              bufs["result"], bufs["op"], ledger, timeout)
    return all_gather(ctx, call, bufs["chunk"], bufs["full"], bufs["result"], ledger, timeout)


# MPI's own runs "native" only; the chooser picks it for that algorithm, never by
# [comm] engine (which names who runs hpcdp's schedules)
ENGINE = Engine("mpi", runs=lambda alg: alg.name == "native", launch=launch, selectable=False)


# -- the small-message path's calls (hpcdp.comm.fast: the call's context and signature
# found, its buffers numpy arrays) -------------------------------------------------------
# Each returns a FastRequest, or for a blocking call the result; None when mpi4py refuses
# a buffer (a read-only result ...) or the buffers do not fit the call: then the general
# front takes it and says what is wrong. ``sig``: the chooser's (MPI datatype, MPI op,
# mean?, byte bound, compiled entry, raw), hpcdp.comm.select.lean_signature; ``raw``: the
# arrays themselves as MPI buffers, without a [buf, T] list (mpi4py maps their native
# format code to the same datatype).

IN_PLACE = MPI.IN_PLACE
_REFUSED = (BufferError, ValueError, TypeError)


def post_allreduce(ctx, sig, sendbuf, recvbuf, op, ledger, timeout, blocking):
    nbytes = sendbuf.nbytes
    if recvbuf is None or recvbuf is sendbuf:
        s, result = IN_PLACE, sendbuf
    elif (recvbuf.__class__ is not np.ndarray or recvbuf.nbytes != nbytes
          or (recvbuf.dtype is not sendbuf.dtype and recvbuf.dtype != sendbuf.dtype)
          or (recvbuf.ndim != 1 and not recvbuf.flags.c_contiguous)):
        return None
    else:
        s, result = sendbuf, recvbuf
    try:
        req = ctx.data.Iallreduce(s, result, sig[1]) if sig[5] else \
            ctx.data.Iallreduce(s if s is IN_PLACE else [s, sig[0]], [result, sig[0]], sig[1])
    except _REFUSED:
        return None
    after = None
    if sig[2]:
        def after():
            divide_mean(result.reshape(-1), ctx.size)
    return _started(ctx, req, "allreduce", sendbuf.dtype, sendbuf.size, op, ledger,
                    (nbytes, nbytes), timeout, result, after, blocking)


def post_reduce_scatter(ctx, sig, sendbuf, recvbuf, op, ledger, timeout, blocking):
    if not sendbuf.flags.c_contiguous:
        return None
    T, mean = sig[0], sig[2]
    n, N = sendbuf.size, ctx.size
    in_place = recvbuf is None or recvbuf is sendbuf
    off, size, counts = _chunk(ctx, n)
    if in_place:
        result = sendbuf[off:off + size]
        raw = ctx.pool.get(size * sendbuf.itemsize)  # MPI's in-place result lands at the start
        target = raw[:size * sendbuf.itemsize].view(sendbuf.dtype)
    elif (recvbuf.__class__ is not np.ndarray or recvbuf.dtype != sendbuf.dtype
          or recvbuf.size != size or not recvbuf.flags.c_contiguous):
        return None
    else:
        result = target = recvbuf
    try:
        if counts is None and sig[5]:
            req = ctx.data.Ireduce_scatter_block(sendbuf, target, sig[1])
        elif counts is None:
            req = ctx.data.Ireduce_scatter_block([sendbuf, T], [target, T], sig[1])
        else:
            req = ctx.data.Ireduce_scatter([sendbuf, T], [target, T], counts, sig[1])
    except _REFUSED:
        if in_place:
            ctx.pool.put(raw)
        return None
    after = None
    if in_place or mean:
        def after():
            if mean:
                divide_mean(target.reshape(-1), N)
            if in_place:
                result[...] = target
                ctx.pool.put(raw)
    return _started(ctx, req, "reduce_scatter", sendbuf.dtype, n, op, ledger,
                    (sendbuf.nbytes, size * sendbuf.itemsize), timeout, result, after, blocking)


def post_all_gather(ctx, sig, sendbuf, recvbuf, ledger, timeout, blocking):
    in_place = recvbuf is None or recvbuf is sendbuf
    full = sendbuf if in_place else recvbuf
    if not full.flags.c_contiguous:
        return None
    T = sig[0]
    n = full.size
    _, mine, counts = _chunk(ctx, n)
    if in_place:
        s = IN_PLACE
    elif (sendbuf.__class__ is not np.ndarray or sendbuf.dtype != full.dtype
          or sendbuf.size != mine or not sendbuf.flags.c_contiguous):
        return None
    else:
        s = sendbuf
    try:
        if counts is None:
            req = ctx.data.Iallgather(s, full)
        else:
            req = ctx.data.Iallgatherv(s if in_place else [sendbuf, T],
                                       [full, counts, _bounds(ctx, n)[1], T])
    except _REFUSED:
        return None
    item = full.itemsize
    return _started(ctx, req, "all_gather", full.dtype, n, "", ledger, (mine * item, n * item),
                    timeout, full if in_place else recvbuf, None, blocking)


def _started(ctx, req, name, dtype, n, op, ledger, nbytes, timeout, result, after, blocking):
    """MPI's call ``req`` just posted: its sequence number; a FastRequest, or for a
    blocking call its end (wait under the deadline, the call tuple built only then; the
    mean's division or the in-place copy; the ledger)."""
    seq = ctx.seq
    ctx.seq = seq + 1
    if not blocking:
        return FastRequest(ctx, req, (seq, name, dtype, n, -1, "native", op), ledger, nbytes,
                           timeout, result, after)
    if after is None and ledger is None and req.Test():
        return result  # the common small case: done at the first test
    if not req.Test():
        spin(ctx, req, (seq, name, dtype, n, -1, "native", op), timeout)
    if after is not None:
        after()
    if ledger is not None:
        ledger.count_call(name, nbytes[0], nbytes[1], 1, 1)
    return result


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


__all__ = ["FastRequest", "allreduce", "reduce_scatter", "all_gather", "post_allreduce",
           "post_reduce_scatter", "post_all_gather", "mpi_type", "spin"]

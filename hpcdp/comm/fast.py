"""The small-message path: the front's lean calls to MPI's own collective.

Below the crossovers of hpcdp.comm.auto, MPI's own collective over shared memory
or a network is latency-bound and hard to beat from Python; what hpcdp adds must
then cost as little as possible. For host numpy buffers and a built-in op, a call
here is: the argument checks (the decision for the call's signature cached on the
communicator's context, :func:`signature`), a sequence number, one MPI call (``Iallreduce``,
``Ireduce_scatter_block`` / ``Ireduce_scatter``, ``Iallgather`` / ``Iallgatherv``)
and a ``Test`` loop that looks at the clock every 64 polls. Nothing else goes on
the wire; past the deadline the missing-rank diagnosis runs as for every request
(hpcdp.comm.core.diagnose). The ledger records what ``algorithm="native"`` records
(:func:`hpcdp.comm.model.volume.native_bytes`). The engine that makes the MPI call and
polls it is hpcdp.comm.engines.mpi.

Its :class:`FastRequest` has the request interface (``test``, ``wait``, ``expire``,
``done``, ``result``) with ``__slots__`` and no generator; a blocking call makes no
request object at all. About 2 us of Python per call on top of MPI's non-blocking
call + Test (``hpcdp bench comm-overhead``); a repeated blocking call with a ready
compiled call (:class:`LeanCall`, below) skips most of the front's checks.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from hpcdp.comm.core.settings import generation
from hpcdp.comm.select import lean_bound, plans_of
from hpcdp.comm.engines.compiled import lean
from hpcdp.comm.core.context import KNOWN, known_context
from hpcdp.comm.core.diagnose import diagnose
from hpcdp.comm.core.errors import mpi_error
from hpcdp.comm.engines.mpi import _TYPES, FastRequest, _bounds, _chunk, _mean, spin
from hpcdp.shard import shard_range

# -- the lean fronts: the common call in as few Python steps as possible --------
# Each returns a FastRequest when the call is a plain one (host numpy buffers,
# C-contiguous, numeric, a built-in op named by a string, "auto" below the
# crossover or "native", no debug mode, more than one rank, a context already set
# up); otherwise None and the general path (hpcdp.comm.collectives) validates,
# explains errors and runs the call. A buffer mpi4py refuses (read-only result)
# also goes to the general path, which says what is wrong.

_SPECS = {"sum": (MPI.SUM, False), "mean": (MPI.SUM, True), "max": (MPI.MAX, False),
          "min": (MPI.MIN, False)}
_REFUSED = (BufferError, ValueError, TypeError)
IN_PLACE = MPI.IN_PLACE


def signature(ctx, collective, op, algorithm, dtype):
    """The lean path's cached decision for one call signature: ``(MPI datatype, MPI op,
    mean?, byte bound, compiled entry or None, raw)``, or None when the lean path never
    takes it (a user op, a byte-swapped or unknown dtype, an algorithm other than
    "auto"/"native", "auto" with no native rows). Checked once per (collective, op,
    algorithm, dtype, type code) and kept with the chooser's decisions on the context
    (``CommContext.plans``, key ``("sig", collective, op, algorithm, dtype, type code)``)
    until the settings change (hpcdp.comm.select.plans_of)."""
    sigs = plans_of(ctx)
    # (the type code too: numpy's uint64 'L' and 'Q' compare equal, but they are two MPI
    # datatypes, and Open MPI 4.1's MPI_UNSIGNED_LONG max/min compare signed)
    key = ("sig", collective, op, algorithm, dtype, dtype.char)
    try:
        return sigs[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable op (a callable with state): not lean
        return None
    spec = _SPECS.get(op) if op.__class__ is str else None
    if collective == "all_gather":
        spec = _SPECS["sum"]  # no op: the datatype alone matters
    T = _TYPES.get(dtype.char) if dtype.isnative else None  # MPI reads native byte order
    bound = lean_bound(ctx, collective, algorithm)  # the chooser's (hpcdp.comm.select)
    hit = None
    if spec is not None and T is not None and bound != 0:
        # the blocking calls' compiled call (hpcdp.comm.engines.compiled.lean), or None: mpi4py
        # raw: mpi4py's own mapping of the array's type code is T (see lean_allreduce)
        raw = T == MPI.Datatype.fromcode(dtype.char)
        hit = (T, spec[0], spec[1], bound, lean.entry(ctx, collective, T, spec[0], spec[1], dtype),
               raw)
    sigs[key] = hit
    return hit


# -- ready compiled calls: a repeated blocking call's checks done once ---------------
# After a blocking call ran compiled, its signature (collective, length, dtype, op,
# algorithm) keeps a LeanCall on the context (CommContext.lean_calls, one dict per
# collective keyed by length). A repeated call then checks only what can change between
# calls: the buffers (1-D ndarrays whose flags say C-contiguous, aligned, writeable, of
# the record's very dtype object), the context (debug mode, failed) and the settings'
# generation; and calls the kernel's compiled entry point (lean.Entry.direct) with
# exactly the argument types it was compiled for. What the record fixes (the byte
# bound, the MPI datatype and op, this rank's shard, the ledger's figures) was decided
# by the full front. Anything else takes the full front below.
#
# Each collective is one row of the same job, in three tiers written once: the ready
# call (:func:`ready`), the first compiled call of a signature (:func:`_compiled`), MPI's
# call through mpi4py (the collective's own post, then :func:`_started`). ``which``
# (AR, RS, AG) names the row.

AR, RS, AG = 0, 1, 2
NAMES = ("allreduce", "reduce_scatter", "all_gather")
_MAX_CALLS = 4096


class LeanCall:
    """One signature's ready blocking call: the context, the kernel's entry point, the
    lean entry (its ``I`` / ``H`` arrays and scratch), what the signature is (dtype
    object, op, algorithm, the settings' generation) and its fixed figures (this rank's
    shard ``off`` / ``size``, the ledger's sent / received bytes)."""

    __slots__ = ("ctx", "call", "e", "I", "H", "dtype", "op", "algorithm", "gen", "off", "size",
                 "sent", "recv")

    def __init__(self, ctx, call, e, dtype, op, algorithm, gen, off, size, sent, recv):
        self.ctx, self.call, self.e, self.dtype, self.op = ctx, call, e, dtype, op
        self.I, self.H, self.algorithm = e.I, e.H, algorithm  # (the entry's own arrays)
        self.gen, self.off, self.size, self.sent, self.recv = gen, off, size, sent, recv


def _remember(ctx, which, n, e, dtype, op, algorithm, off, size, sent, recv):
    """Keep the ready call of a blocking compiled call that just completed (its kernel
    is compiled for these argument types now), when it has an entry point."""
    calls = ctx.lean_calls[which]
    r = calls.get(n)
    if r is not None and r.e is e and r.dtype is dtype and r.gen == generation():
        return  # kept already (this call missed it for its buffers' flags)
    call = e.direct(dtype)
    if call is None:
        return
    if len(calls) >= _MAX_CALLS:
        calls.clear()
    calls[n] = LeanCall(ctx, call, e, dtype, op, algorithm, generation(), off, size, sent, recv)


def _ready(comm, which, buf, op, algorithm):
    """The LeanCall for ``buf`` (a 1-D ndarray: the full-length buffer) and this
    signature on ``comm``, or None (tests look here; :func:`ready` does it inline)."""
    hit = KNOWN.get(id(comm))
    if hit is None or hit[0] is not comm:
        return None
    ctx = hit[1]
    r = ctx.lean_calls[which].get(buf.size)
    if r is None or r.dtype is not buf.dtype or r.op != op or r.algorithm != algorithm \
            or r.gen != generation() or ctx.debug or ctx.failed is not None \
            or not buf.flags.carray:
        return None
    return r


def ready(which, sendbuf, recvbuf, comm, op, algorithm, ledger, timeout):
    """A repeated plain blocking call of collective ``which`` run on its LeanCall: the
    result, or None when it has none or the buffers do not fit it (then the lean call or
    the general front takes it). ``op``: "" for an all-gather."""
    in_place = recvbuf is None or recvbuf is sendbuf
    if which == AG:
        full, other = (sendbuf, None) if in_place else (recvbuf, sendbuf)
    else:
        full, other = sendbuf, (None if in_place else recvbuf)
    if full.__class__ is not np.ndarray or full.ndim != 1:
        return None
    hit = KNOWN.get(id(comm))  # (known_context inline: one call fewer)
    if hit is None or hit[0] is not comm:
        return None
    ctx = hit[1]
    r = ctx.lean_calls[which].get(full.size)
    if r is None or r.dtype is not full.dtype or r.op != op or r.algorithm != algorithm \
            or r.gen != generation() or ctx.debug or ctx.failed is not None \
            or not full.flags.carray:
        return None
    if other is not None and (other.__class__ is not np.ndarray or other.ndim != 1
                              or other.dtype is not r.dtype or not other.flags.carray):
        return None
    dst = full if which == AG or in_place else recvbuf
    seq = ctx.seq
    ctx.seq = seq + 1
    limit = ctx.timeout if timeout is None else float(timeout)
    if which == RS:
        e = r.e
        code = r.call(r.I, r.H, sendbuf, dst, e.scratch, limit)
        if code == lean.NEED_SCRATCH:
            e.grow(r.size)
            code = r.call(r.I, r.H, sendbuf, dst, e.scratch, limit)
    else:
        code = r.call(r.I, r.H, sendbuf, dst, limit)
    if code == 0:
        if ledger is not None:
            ledger.count_call(NAMES[which], r.sent, r.recv, 1, 1)
        return sendbuf[r.off:r.off + r.size] if which == RS and in_place else dst
    # refused (nothing posted: a length mismatch) falls to the full front
    return _compiled_failed(ctx, r.e, code, seq, NAMES[which], full, op, limit)


def _compiled(ctx, e, which, src, dst, op, algorithm, ledger, timeout):
    """A blocking lean call of collective ``which`` as one compiled call (the first of its
    signature, or one a ready call does not take), its ready call kept: the result, or
    None when the kernel refused it (nothing posted). ``dst``: the allreduce's result,
    the reduce-scatter's destination (``src`` in place), the all-gather's full buffer."""
    name = NAMES[which]
    seq = ctx.seq
    ctx.seq = seq + 1
    limit = ctx.timeout if timeout is None else float(timeout)
    if e.half or src.ndim != 1 or dst.ndim != 1:
        a, b = e.views(src), e.views(dst)
    else:
        a, b = src, dst
    if which == RS:
        code = e.kernel(e.I, e.H, a, b, e.scratch, limit)
        if code == lean.NEED_SCRATCH:
            e.grow(shard_range(src.size, ctx.size, ctx.rank)[1])
            code = e.kernel(e.I, e.H, a, b, e.scratch, limit)
    else:
        code = e.kernel(e.I, e.H, a, b, limit)
    buf = dst if which == AG else src  # the full-length buffer
    if code != 0:
        return _compiled_failed(ctx, e, code, seq, name, buf, op, limit)
    n, item = buf.size, buf.itemsize
    if which == AR:
        result, off, size, sent, recv = dst, 0, 0, buf.nbytes, buf.nbytes
    elif which == RS:
        off, size = shard_range(n, ctx.size, ctx.rank)
        result = src[off:off + size] if dst is src else dst
        sent, recv = buf.nbytes, result.size * item
    else:
        off, size = 0, shard_range(n, ctx.size, ctx.rank)[1]
        result, sent, recv = dst, size * item, buf.nbytes
    if e.mean_after:
        _mean(result.reshape(-1), ctx.size)
    elif src.ndim == 1 and dst.ndim == 1:
        _remember(ctx, which, n, e, buf.dtype, op, algorithm, off, size, sent, recv)
    if ledger is not None:
        ledger.count_call(name, sent, recv, 1, 1)
    return result


def _started(ctx, req, which, dtype, n, op, ledger, nbytes, timeout, result, after, blocking):
    """MPI's call ``req`` just posted through mpi4py: its sequence number; a FastRequest,
    or for a blocking call its end (wait under the deadline, the call tuple built only
    then; the mean's division or the in-place copy; the ledger)."""
    seq = ctx.seq
    ctx.seq = seq + 1
    name = NAMES[which]
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


def _compiled_failed(ctx, e, code, seq, name, buf, op, limit):
    """A compiled lean call that did not complete: None when nothing was posted (the
    general path takes the call and explains a bad buffer); else what the mpi4py path
    raises: mpi4py's MPI.Exception for an MPI error, the missing-rank diagnosis past the
    deadline or when a peer started one (as :func:`spin`)."""
    if code == lean.REFUSED:
        ctx.seq = seq
        return None
    if code == lean.FAILED:
        err = mpi_error(e.error_code(), collective=name, seq=seq, rank=ctx.rank)
        if ctx.failed is None:
            ctx.failed = err
        raise err
    if code == lean.ABORTED:
        raise ctx.failed
    call = (seq, name, buf.dtype, buf.size, -1, "native", op)
    raise diagnose(ctx, call, time.monotonic() - e.started(), limit, (),
                   joined=code == lean.PEER)


def _lean_ctx(comm, collective, op, algorithm, buf):
    """(context, signature) of a lean call on ``buf`` (the full-length buffer), or
    (None, None)."""
    ctx = known_context(comm)
    if ctx is None or ctx.debug or ctx.failed is not None or ctx.size == 1:
        return None, None
    dtype = buf.dtype
    sig = ctx.plans.get(("sig", collective, op, algorithm, dtype, dtype.char), False) \
        if ctx.plans_gen == generation() else False
    if sig is False:
        sig = signature(ctx, collective, op, algorithm, dtype)
    nbytes = buf.nbytes
    if sig is None or nbytes >= sig[3] or nbytes == 0:
        return None, None
    return ctx, sig


# -- the three rows: what differs is the buffers' checks and MPI's call ----------------

def lean_allreduce(sendbuf, recvbuf, comm, op, algorithm, ledger, timeout, blocking=False):
    if blocking:
        out = ready(AR, sendbuf, recvbuf, comm, op, algorithm, ledger, timeout)
        if out is not None:
            return out
    if op.__class__ is not str or sendbuf.__class__ is not np.ndarray \
            or (sendbuf.ndim != 1 and not sendbuf.flags.c_contiguous):
        return None  # (a strided 1-D buffer: mpi4py refuses it below)
    ctx = known_context(comm)  # (_lean_ctx inline: the most frequent call, one call fewer)
    if ctx is None or ctx.debug or ctx.failed is not None or ctx.size == 1:
        return None
    dtype = sendbuf.dtype
    sig = ctx.plans.get(("sig", "allreduce", op, algorithm, dtype, dtype.char), False) \
        if ctx.plans_gen == generation() else False
    if sig is False:
        sig = signature(ctx, "allreduce", op, algorithm, dtype)
    nbytes = sendbuf.nbytes
    if sig is None or nbytes >= sig[3] or nbytes == 0:
        return None
    e = sig[4]
    if blocking and e is not None:  # one compiled call (hpcdp.comm.engines.compiled.lean)
        if recvbuf is None:
            recvbuf = sendbuf
        elif recvbuf.__class__ is not np.ndarray or recvbuf.size != sendbuf.size \
                or (recvbuf.ndim != 1 and not recvbuf.flags.c_contiguous):
            return None
        return _compiled(ctx, e, AR, sendbuf, recvbuf, op, algorithm, ledger, timeout)
    # the arrays themselves as MPI buffers where mpi4py maps their (native) format code to
    # the same datatype as sig[0] (sig[5]), without a [buf, T] list; else with one (uint64:
    # hpcdp.comm.core.ops.mpi_datatype)
    if recvbuf is None or recvbuf is sendbuf:
        s, result = IN_PLACE, sendbuf
    elif (recvbuf.__class__ is not np.ndarray or recvbuf.nbytes != nbytes
          or (recvbuf.dtype is not dtype and recvbuf.dtype != dtype)
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
            _mean(result.reshape(-1), ctx.size)
    return _started(ctx, req, AR, dtype, sendbuf.size, op, ledger, (nbytes, nbytes), timeout,
                    result, after, blocking)


def lean_reduce_scatter(sendbuf, recvbuf, comm, op, algorithm, ledger, timeout, blocking=False):
    if blocking:
        out = ready(RS, sendbuf, recvbuf, comm, op, algorithm, ledger, timeout)
        if out is not None:
            return out
    if op.__class__ is not str or sendbuf.__class__ is not np.ndarray or sendbuf.ndim != 1:
        return None
    ctx, sig = _lean_ctx(comm, "reduce_scatter", op, algorithm, sendbuf)
    if ctx is None:
        return None
    in_place = recvbuf is None or recvbuf is sendbuf
    e = sig[4]
    if blocking and e is not None:  # one compiled call (hpcdp.comm.engines.compiled.lean)
        if in_place:
            recvbuf = sendbuf
        elif recvbuf.__class__ is not np.ndarray or recvbuf.ndim != 1:
            return None
        return _compiled(ctx, e, RS, sendbuf, recvbuf, op, algorithm, ledger, timeout)
    if not sendbuf.flags.c_contiguous:
        return None
    T, mean = sig[0], sig[2]
    n, N = sendbuf.size, ctx.size
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
        if counts is None and sig[5]:  # (arrays as buffers: see lean_allreduce)
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
                _mean(target.reshape(-1), N)
            if in_place:
                result[...] = target
                ctx.pool.put(raw)
    return _started(ctx, req, RS, sendbuf.dtype, n, op, ledger,
                    (sendbuf.nbytes, size * sendbuf.itemsize), timeout, result, after, blocking)


def lean_all_gather(sendbuf, recvbuf, comm, algorithm, ledger, timeout, blocking=False):
    if blocking:
        out = ready(AG, sendbuf, recvbuf, comm, "", algorithm, ledger, timeout)
        if out is not None:
            return out
    in_place = recvbuf is None or recvbuf is sendbuf
    full = sendbuf if in_place else recvbuf
    if full.__class__ is not np.ndarray or full.ndim != 1:
        return None
    ctx, sig = _lean_ctx(comm, "all_gather", "", algorithm, full)
    if ctx is None:
        return None
    e = sig[4]
    if blocking and e is not None:  # one compiled call (hpcdp.comm.engines.compiled.lean)
        if not in_place and (sendbuf.__class__ is not np.ndarray or sendbuf.ndim != 1):
            return None
        return _compiled(ctx, e, AG, sendbuf, full, "", algorithm, ledger, timeout)
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
        s = sendbuf  # (arrays as buffers: see lean_allreduce)
    try:
        if counts is None:
            req = ctx.data.Iallgather(s, full)
        else:
            req = ctx.data.Iallgatherv(s if in_place else [sendbuf, T],
                                       [full, counts, _bounds(ctx, n)[1], T])
    except _REFUSED:
        return None
    item = full.itemsize
    return _started(ctx, req, AG, full.dtype, n, "", ledger, (mine * item, n * item), timeout,
                    full if in_place else recvbuf, None, blocking)

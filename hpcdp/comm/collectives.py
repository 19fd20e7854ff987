"""The public collectives: allreduce, reduce_scatter, all_gather (+ non-blocking).

Buffers: contiguous numpy arrays (any shape, treated as flat) of float16, float32,
float64, int32 or int64 (other numeric dtypes work too), or device arrays (see
hpcdp.comm.core.device). ``recvbuf=None`` or ``recvbuf is sendbuf`` means in place.

- ``allreduce(buf)``: every rank gets the reduction of all ranks' ``buf``.
- ``reduce_scatter(buf, out)``: ``out`` (length ``shard_range(n, N, rank)[1]``)
  gets this rank's chunk of the reduction. In place, the chunk is left at its
  position ``buf[off:off+size]`` (the returned view) and the rest of ``buf`` is
  scratch afterwards.
- ``all_gather(chunk, full)``: ``full`` (length n) gets every rank's chunk at its
  ``shard_range`` position; ``chunk`` must have this rank's shard length. In
  place, ``buf`` is the full-length buffer holding this rank's chunk in position.

Each returns the result array; the ``i*`` variants return a request with
``test()`` / ``wait()`` (``wait`` returns the result).

``wire="float16"`` or ``"bfloat16"`` (float32 buffers only; default ``None`` =
``"float32"``, the buffers' own bytes): the messages carry 16-bit values while the
sums are accumulated in float32; the ring runs it ("auto" picks the ring, other
algorithms are refused). hpcdp.comm.engines.wire says where rounding happens.
"""

from __future__ import annotations

import threading

import numpy as np
from mpi4py import MPI

from hpcdp.comm import fast, hierarchical
from hpcdp.comm.core.context import get_context, get_context_if_any
from hpcdp.comm.core.errors import mpi_error
from hpcdp.comm.core.ops import resolve
from hpcdp.comm.core.requests import DoneRequest
from hpcdp.comm.engines import mpi as mpi_engine
from hpcdp.comm.engines.ready import AG, AR, RS, ready
from hpcdp.comm.ring import DEFAULT_SEGMENT_BYTES
from hpcdp.comm.select import decide, overlap_algorithm
from hpcdp.shard import shard_range

_KINDS = "fiu"


def is_device_array(x) -> bool:
    from hpcdp.comm.core.device import is_device_array as check
    return check(x)


def flat_view(buf, what: str):
    """A 1-D view of a contiguous buffer, or a clear error."""
    if type(buf) is np.ndarray and buf.ndim == 1 and buf.flags.c_contiguous \
            and buf.dtype.kind in _KINDS:
        return buf  # the common case, checked first
    if is_device_array(buf):
        if not buf.is_c_contiguous():
            raise ValueError(f"{what} must be a C-contiguous device array")
        return buf.reshape(buf.size) if buf.ndim != 1 else buf
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{what} must be a numpy array or a device array "
                        f"(__cuda_array_interface__), got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous; pass numpy.ascontiguousarray({what})")
    if buf.dtype.kind not in _KINDS:
        raise TypeError(f"{what} has dtype {buf.dtype}; hpcdp collectives take numeric arrays "
                        "(float16/32/64, int32/64, ...)")
    if buf.ndim != 1:
        return buf.reshape(-1)
    return buf


def _check_writeable(arr, what):
    if isinstance(arr, np.ndarray) and not arr.flags.writeable:
        raise ValueError(f"{what} is read-only; the collective writes its result there")


def _pair(sendbuf, recvbuf, what):
    src = flat_view(sendbuf, "sendbuf")
    if recvbuf is None or recvbuf is sendbuf:
        _check_writeable(src, "sendbuf (in place)")
        return src, src, sendbuf
    work = flat_view(recvbuf, "recvbuf")
    _check_writeable(work, "recvbuf")
    if work.dtype != src.dtype:
        raise TypeError(f"{what}: recvbuf dtype {work.dtype} != sendbuf dtype {src.dtype}")
    return src, work, recvbuf


def _mpi_failed(comm, name, exc):
    """An MPI call failed in a collective: the MPIError (with MPI's error class), the
    communicator marked failed with it (hpcdp.comm.core.errors)."""
    ctx = get_context_if_any(comm)
    rank = ctx.rank if ctx is not None else -1
    err = mpi_error(exc, collective=name, seq=ctx.seq - 1 if ctx is not None else -1, rank=rank)
    if ctx is not None and ctx.failed is None:
        ctx.failed = err
    return err


def _host(sendbuf, recvbuf) -> bool:
    """Host buffers: the common case, no device import on the hot path."""
    return isinstance(sendbuf, np.ndarray) and (recvbuf is None or isinstance(recvbuf, np.ndarray))


def _kind(*bufs) -> int:
    """What the chooser needs to know of the buffers (hpcdp.comm.select.decide's
    ``host``): 2 plain numpy arrays, 1 numpy arrays of a subclass, 0 device arrays."""
    kind = 2
    for b in bufs:
        if b.__class__ is not np.ndarray:
            if not isinstance(b, np.ndarray):
                return 0
            kind = 1
    return kind


def _staged(fn, sendbuf, recvbuf, comm, kwargs):
    from hpcdp.comm.core.device import maybe_stage
    return maybe_stage(fn, sendbuf, recvbuf, comm, kwargs)


def _device_scratch(ctx, like):
    from hpcdp.comm.core.device import device_scratch
    return device_scratch(ctx, like.size, like.dtype)


# A blocking front's start (the request is waited on at once): an engine may then run it
# in the caller's thread and keep a ready call for its repeats (hpcdp.comm.engines.registry).
# Thread-local, so that a collective the start runs inside (a staged device call, the
# hierarchical allreduce's first phase) knows it too.
_LOCAL = threading.local()


def blocking_call(start, *args, **kwargs):
    """``start(*args, **kwargs)`` (an ``i*`` collective) for a blocking call."""
    _LOCAL.blocking = True
    try:
        return start(*args, **kwargs)
    finally:
        _LOCAL.blocking = False


def _launch(ctx, plan, call, ledger, timeout, segment_bytes, max_message_bytes, algorithm,
            bufs):
    """Run ``plan`` (hpcdp.comm.select.Plan) on checked buffers ``bufs``: its algorithm
    (hpcdp.comm.algorithms) on its engine (hpcdp.comm.engines.registry), whose records
    the chooser resolved with the plan. ``algorithm``: the one the caller named (a
    blocking call's ready call is kept under it)."""
    engine, alg = plan.records
    return engine.launch(ctx, alg, plan, call, ledger, timeout, bufs, segment_bytes,
                         max_message_bytes, getattr(_LOCAL, "blocking", False), algorithm)


# Each collective: a repeated plain blocking call's ready call (hpcdp.comm.engines.ready:
# the plan the chooser made for that signature, replayed), MPI's own small-message call
# (hpcdp.comm.fast: the chooser's bound and plan per signature,
# hpcdp.comm.select.lean_signature), else the general front: check the arguments, ask the
# chooser (hpcdp.comm.select.decide, cached per signature), launch the plan on its engine.

# -- allreduce -----------------------------------------------------------------

def iallreduce(sendbuf, recvbuf=None, *, comm, op="sum", algorithm="auto", ledger=None,
               segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None, wire=None,
               overlap=False):
    """Start an allreduce; returns a request (``test()`` / ``wait()``). ``overlap``: the
    caller computes while it runs and polls it only now and then (DDP's buckets): "auto"
    then prefers an algorithm that progresses on its own (hpcdp.comm.select)."""
    try:
        if overlap:  # the chooser's algorithm for a call that progresses while the caller computes
            algorithm = overlap_algorithm(comm, algorithm)
        if max_message_bytes is None and (wire is None or wire == "float32"):
            req = fast.lean_allreduce(sendbuf, recvbuf, comm, op, algorithm, ledger, timeout)
            if req is not None:
                return req
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'allreduce', exc) from None
    return _general_allreduce(sendbuf, recvbuf, comm, op, algorithm, ledger, segment_bytes, timeout,
                              max_message_bytes, wire)


def _general_allreduce(sendbuf, recvbuf, comm, op, algorithm, ledger, segment_bytes, timeout,
                       max_message_bytes, wire):
    """The general front of an allreduce the small-message path did not take."""
    try:
        if not _host(sendbuf, recvbuf):
            kwargs = dict(op=op, algorithm=algorithm, ledger=ledger, segment_bytes=segment_bytes,
                          timeout=timeout, max_message_bytes=max_message_bytes, wire=wire)
            staged = _staged(iallreduce, sendbuf, recvbuf, comm, kwargs)
            if staged is not None:
                return staged
        ctx = get_context(comm)
        op = resolve(op)
        src, work, result = _pair(sendbuf, recvbuf, "allreduce")
        if work.size != src.size:
            raise ValueError(f"allreduce: recvbuf has {work.size} elements, sendbuf {src.size}; they must match")
        nbytes = work.nbytes if isinstance(work, np.ndarray) else work.size * work.dtype.itemsize
        plan = decide(ctx, "allreduce", algorithm, nbytes, work.dtype, op, wire=wire,
                      host=_kind(src, work), max_message_bytes=max_message_bytes,
                      timeout=timeout)
        call = ctx.arrive("allreduce", work.dtype, work.size, -1, plan.algorithm, op.name, timeout)
        if ctx.size == 1 or work.size == 0:
            if src is not work:
                work[...] = src
            return DoneRequest(ctx, "allreduce", call, ledger, result)
        return _launch(ctx, plan, call, ledger, timeout, segment_bytes, max_message_bytes,
                       algorithm, {"src": src, "work": work, "result": result, "op": op})
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'allreduce', exc) from None


def allreduce(sendbuf, recvbuf=None, *, comm, op="sum", algorithm="auto", ledger=None,
              segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None, wire=None):
    """Reduce ``sendbuf`` over all ranks into ``recvbuf`` (or in place); returns it."""
    try:
        if max_message_bytes is None and (wire is None or wire == "float32"):
            out = ready(AR, sendbuf, recvbuf, comm, op, algorithm, ledger, timeout, segment_bytes)
            if out is None:
                out = fast.lean_allreduce(sendbuf, recvbuf, comm, op, algorithm, ledger, timeout, True)
            if out is not None:
                return out
        return blocking_call(_general_allreduce, sendbuf, recvbuf, comm, op, algorithm, ledger,
                             segment_bytes, timeout, max_message_bytes, wire).wait()
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'allreduce', exc) from None


# -- reduce-scatter ------------------------------------------------------------

def ireduce_scatter(sendbuf, recvbuf=None, *, comm, op="sum", algorithm="auto", ledger=None,
                    segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None,
                    wire=None):
    """Start a reduce-scatter; ``wait()`` returns this rank's reduced chunk."""
    try:
        if max_message_bytes is None and (wire is None or wire == "float32"):
            req = fast.lean_reduce_scatter(sendbuf, recvbuf, comm, op, algorithm, ledger, timeout)
            if req is not None:
                return req
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'reduce_scatter', exc) from None
    return _general_reduce_scatter(sendbuf, recvbuf, comm, op, algorithm, ledger, segment_bytes, timeout,
                                   max_message_bytes, wire)


def _general_reduce_scatter(sendbuf, recvbuf, comm, op, algorithm, ledger, segment_bytes, timeout,
                            max_message_bytes, wire):
    """The general front of a reduce-scatter the small-message path did not take."""
    try:
        if not _host(sendbuf, recvbuf):
            kwargs = dict(op=op, algorithm=algorithm, ledger=ledger, segment_bytes=segment_bytes,
                          timeout=timeout, max_message_bytes=max_message_bytes, wire=wire)
            staged = _staged(ireduce_scatter, sendbuf, recvbuf, comm, kwargs)
            if staged is not None:
                return staged
        ctx = get_context(comm)
        op = resolve(op)
        src = flat_view(sendbuf, "sendbuf")
        n = src.size
        off, size = shard_range(n, ctx.size, ctx.rank)
        in_place = recvbuf is None or recvbuf is sendbuf
        if in_place:
            _check_writeable(src, "sendbuf (in place)")
            out, result = src[off:off + size], src[off:off + size]
        else:
            out = flat_view(recvbuf, "recvbuf")
            _check_writeable(out, "recvbuf")
            if out.dtype != src.dtype:
                raise TypeError(f"reduce_scatter: recvbuf dtype {out.dtype} != sendbuf dtype {src.dtype}")
            if out.size != size:
                raise ValueError(f"reduce_scatter: recvbuf must hold this rank's chunk, "
                                 f"shard_range({n}, {ctx.size}, {ctx.rank}) = {size} elements; got {out.size}")
            result = recvbuf
        plan = decide(ctx, "reduce_scatter", algorithm, n * src.dtype.itemsize, src.dtype, op,
                      wire=wire, host=_kind(src, out), max_message_bytes=max_message_bytes,
                      timeout=timeout)
        call = ctx.arrive("reduce_scatter", src.dtype, n, -1, plan.algorithm, op.name, timeout)
        if ctx.size == 1 or n == 0:
            if not in_place:
                out[...] = src
            return DoneRequest(ctx, "reduce_scatter", call, ledger, result)
        return _launch(ctx, plan, call, ledger, timeout, segment_bytes, max_message_bytes,
                       algorithm, {"src": src, "out": out, "in_place": in_place,
                                   "result": result, "op": op})
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'reduce_scatter', exc) from None


def reduce_scatter(sendbuf, recvbuf=None, *, comm, op="sum", algorithm="auto", ledger=None,
                   segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None,
                   wire=None):
    """This rank's chunk (``shard_range``) of the reduction over all ranks."""
    try:
        if max_message_bytes is None and (wire is None or wire == "float32"):
            out = ready(RS, sendbuf, recvbuf, comm, op, algorithm, ledger, timeout, segment_bytes)
            if out is None:
                out = fast.lean_reduce_scatter(sendbuf, recvbuf, comm, op, algorithm, ledger,
                                               timeout, True)
            if out is not None:
                return out
        return blocking_call(_general_reduce_scatter, sendbuf, recvbuf, comm, op, algorithm, ledger,
                             segment_bytes, timeout, max_message_bytes, wire).wait()
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'reduce_scatter', exc) from None


# -- all-gather ----------------------------------------------------------------

def iall_gather(sendbuf, recvbuf=None, *, comm, algorithm="auto", ledger=None,
                segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None, wire=None):
    """Start an all-gather; ``wait()`` returns the full buffer."""
    try:
        if max_message_bytes is None and (wire is None or wire == "float32"):
            req = fast.lean_all_gather(sendbuf, recvbuf, comm, algorithm, ledger, timeout)
            if req is not None:
                return req
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'all_gather', exc) from None
    return _general_all_gather(sendbuf, recvbuf, comm, algorithm, ledger, segment_bytes, timeout,
                               max_message_bytes, wire)


def _general_all_gather(sendbuf, recvbuf, comm, algorithm, ledger, segment_bytes, timeout,
                        max_message_bytes, wire):
    """The general front of an all-gather the small-message path did not take."""
    try:
        if not _host(sendbuf, recvbuf):
            kwargs = dict(algorithm=algorithm, ledger=ledger, segment_bytes=segment_bytes,
                          timeout=timeout, max_message_bytes=max_message_bytes, wire=wire)
            staged = _staged(iall_gather, sendbuf, recvbuf, comm, kwargs)
            if staged is not None:
                return staged
        ctx = get_context(comm)
        in_place = recvbuf is None or recvbuf is sendbuf
        if in_place:
            full = flat_view(sendbuf, "buf")
            _check_writeable(full, "buf (in place)")
            chunk, result = None, sendbuf
        else:
            chunk = flat_view(sendbuf, "sendbuf")
            full = flat_view(recvbuf, "recvbuf")
            _check_writeable(full, "recvbuf")
            if full.dtype != chunk.dtype:
                raise TypeError(f"all_gather: recvbuf dtype {full.dtype} != sendbuf dtype {chunk.dtype}")
            result = recvbuf
        n = full.size
        off, size = shard_range(n, ctx.size, ctx.rank)
        if chunk is not None and chunk.size != size:
            raise ValueError(f"all_gather: sendbuf must hold this rank's chunk of the {n}-element "
                             f"result, shard_range({n}, {ctx.size}, {ctx.rank}) = {size} elements; "
                             f"got {chunk.size}")
        plan = decide(ctx, "all_gather", algorithm, n * full.dtype.itemsize, full.dtype, None,
                      wire=wire, host=_kind(full) if chunk is None else _kind(chunk, full),
                      max_message_bytes=max_message_bytes, timeout=timeout)
        call = ctx.arrive("all_gather", full.dtype, n, -1, plan.algorithm, "", timeout)
        if ctx.size == 1 or n == 0:
            if chunk is not None:
                full[off:off + size] = chunk
            return DoneRequest(ctx, "all_gather", call, ledger, result)
        return _launch(ctx, plan, call, ledger, timeout, segment_bytes, max_message_bytes,
                       algorithm, {"chunk": chunk, "full": full, "result": result})
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'all_gather', exc) from None


def all_gather(sendbuf, recvbuf=None, *, comm, algorithm="auto", ledger=None,
               segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None, wire=None):
    """Every rank's chunk, concatenated in rank order (``shard_range`` positions)."""
    try:
        if max_message_bytes is None and (wire is None or wire == "float32"):
            out = ready(AG, sendbuf, recvbuf, comm, "", algorithm, ledger, timeout, segment_bytes)
            if out is None:
                out = fast.lean_all_gather(sendbuf, recvbuf, comm, algorithm, ledger, timeout, True)
            if out is not None:
                return out
        return blocking_call(_general_all_gather, sendbuf, recvbuf, comm, algorithm, ledger,
                             segment_bytes, timeout, max_message_bytes, wire).wait()
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'all_gather', exc) from None


# -- broadcast, barrier ----------------------------------------------------------

def ibroadcast(buf, *, comm, root: int = 0, ledger=None, timeout=None):
    """Start an in-place broadcast of ``buf`` (a contiguous numpy array) from ``root``:
    MPI's own ``Ibcast`` (its tree: log2 N rounds) under the collective's deadline and
    missing-rank diagnosis. The ledger records ``broadcast``: the buffer sent (one
    message) on the root, received on every other rank. ``wait()`` returns ``buf``."""
    try:
        ctx = get_context(comm)
        if not isinstance(buf, np.ndarray):
            raise TypeError(f"broadcast: buf must be a numpy array, got {type(buf).__name__}")
        if not buf.flags.c_contiguous:
            raise ValueError("broadcast: buf must be C-contiguous; pass numpy.ascontiguousarray(buf)")
        if not 0 <= int(root) < ctx.size:
            raise ValueError(f"broadcast: root {root} is not a rank of this {ctx.size}-rank communicator")
        flat = buf.reshape(-1)
        if ctx.rank != root:
            _check_writeable(flat, "buf (broadcast)")
        call = ctx.arrive("broadcast", flat.dtype, flat.size, int(root), "native", "", timeout)
        if ctx.size == 1 or flat.size == 0:
            return DoneRequest(ctx, "broadcast", call, ledger, buf)
        req = ctx.data.Ibcast([flat, mpi_engine.mpi_type(flat.dtype)], int(root))
        nbytes = (flat.nbytes, 0, 1, 0) if ctx.rank == root else (0, flat.nbytes, 0, 1)
        return mpi_engine.FastRequest(ctx, req, call, ledger, nbytes, timeout, buf)
    except MPI.Exception as exc:
        raise _mpi_failed(comm, "broadcast", exc) from None


def broadcast(buf, *, comm, root: int = 0, ledger=None, timeout=None):
    """Broadcast ``buf`` from ``root`` in place (:func:`ibroadcast`); returns ``buf``."""
    return ibroadcast(buf, comm=comm, root=root, ledger=ledger, timeout=timeout).wait()


def ibarrier(*, comm, timeout=None):
    """Start a barrier (MPI's ``Ibarrier``) under the deadline and diagnosis."""
    try:
        ctx = get_context(comm)
        call = ctx.arrive("barrier", np.uint8, 0, -1, "native", "", timeout)
        if ctx.size == 1:
            return DoneRequest(ctx, "barrier", call, None, None)
        return mpi_engine.FastRequest(ctx, ctx.data.Ibarrier(), call, None, (0, 0), timeout, None)
    except MPI.Exception as exc:
        raise _mpi_failed(comm, "barrier", exc) from None


def barrier(*, comm, timeout=None) -> None:
    """Every rank of ``comm`` reached this call (:func:`ibarrier`), or the diagnosis' error."""
    ibarrier(comm=comm, timeout=timeout).wait()


# the hierarchical allreduce runs its three phases as these collectives
hierarchical.use_front(ireduce_scatter, iallreduce, iall_gather)

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

import numpy as np
from mpi4py import MPI

from hpcdp.comm import fast, hierarchical
from hpcdp.comm.engines import mpi as mpi_engine
from hpcdp.comm.algorithms import get as get_algorithm
from hpcdp.comm.auto import choose, choose_allreduce
from hpcdp.comm.core.context import get_context, get_context_if_any
from hpcdp.comm.core.errors import mpi_error
from hpcdp.comm.native import native_all_gather, native_reduce_scatter
from hpcdp.comm.core.ops import resolve
from hpcdp.comm.select import configured, overlap_algorithm
from hpcdp.comm.core.requests import MAX_MESSAGE_BYTES, DoneRequest, GenRequest
from hpcdp.comm.engines.compiled import blocking
from hpcdp.comm.engines.compiled.engine import blocking_call, ring_request
from hpcdp.comm.ring import DEFAULT_SEGMENT_BYTES
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


def _staged(fn, sendbuf, recvbuf, comm, kwargs):
    from hpcdp.comm.core.device import maybe_stage
    return maybe_stage(fn, sendbuf, recvbuf, comm, kwargs)


def _byte_order(algo, algorithm, dtype, what):
    """MPI's own collectives read native byte order only: "auto" takes the ring for a
    byte-swapped dtype (NumPy adds it correctly), an explicit "native" is refused."""
    if algo != "native" or np.dtype(dtype).isnative:
        return algo
    if algorithm == "native":
        raise ValueError(f"{what}: algorithm='native' (MPI's own) needs native byte order, got "
                         f"dtype {np.dtype(dtype).str}; convert with .astype({np.dtype(dtype).name!r}) "
                         "or use algorithm='ring'")
    return "ring"


def _wire(wire, buf, algorithm, what):
    """(the 16-bit hpcdp.comm.engines.wire.Wire or None, the algorithm that carries it)."""
    if wire is None or wire == "float32":
        return None, algorithm
    from hpcdp.comm.engines.wire import wire_algorithm, wire_format
    w = wire_format(wire, getattr(buf, "dtype", None), what)
    return w, wire_algorithm(w, algorithm, what)


def _staged_wire(staged, w, what):
    if staged is None and w is not None:
        raise ValueError(f"{what}: a {w.name} wire converts on the host; with CUDA-aware MPI the "
                         "device buffers go to MPI directly: use wire='float32' or set "
                         "HPCDP_CUDA_AWARE=0 (host staging)")
    return staged


def _lean(algo, op, max_message_bytes, nbytes, buf) -> bool:
    """MPI's own collective through hpcdp.comm.fast: host buffer, built-in op,
    one message (the general native path cuts messages and runs user ops)."""
    return (algo == "native" and op.builtin and max_message_bytes is None
            and nbytes < MAX_MESSAGE_BYTES and isinstance(buf, np.ndarray))


# -- allreduce -----------------------------------------------------------------

def iallreduce(sendbuf, recvbuf=None, *, comm, op="sum", algorithm="auto", ledger=None,
               segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None, wire=None,
               overlap=False):
    """Start an allreduce; returns a request (``test()`` / ``wait()``). ``overlap``: the
    caller computes while it runs and polls it only now and then (DDP's buckets): "auto"
    then prefers an algorithm that progresses on its own (hpcdp.comm.select)."""
    try:
        if algorithm == "auto":  # what [comm] says "auto" runs
            algorithm = configured("allreduce", algorithm)
            if overlap:
                algorithm = overlap_algorithm(comm, algorithm)
        w, algorithm = _wire(wire, sendbuf, algorithm, "allreduce")
        if max_message_bytes is None and w is None:
            req = fast.lean_allreduce(sendbuf, recvbuf, comm, op, algorithm, ledger, timeout)
            if req is not None:
                return req
        if not _host(sendbuf, recvbuf):
            kwargs = dict(op=op, algorithm=algorithm, ledger=ledger, segment_bytes=segment_bytes,
                          timeout=timeout, max_message_bytes=max_message_bytes, wire=wire)
            staged = _staged_wire(_staged(iallreduce, sendbuf, recvbuf, comm, kwargs), w, "allreduce")
            if staged is not None:
                return staged
        ctx = get_context(comm)
        op = resolve(op)
        src, work, result = _pair(sendbuf, recvbuf, "allreduce")
        if work.size != src.size:
            raise ValueError(f"allreduce: recvbuf has {work.size} elements, sendbuf {src.size}; they must match")
        nbytes = work.nbytes if isinstance(work, np.ndarray) else work.size * work.dtype.itemsize
        layout = None
        if algorithm == "auto" and ctx.size > 1:
            from hpcdp.comm.nodes import auto_layout
            layout = auto_layout(ctx, timeout)  # None unless HPCDP_PROFILE names a profile
        if layout is not None:  # (profile, nodes, ranks per node): the cost model decides
            from hpcdp.comm.model.cost import fastest_allreduce
            algo = fastest_allreduce(nbytes, *layout)
        else:
            algo = choose_allreduce(nbytes, ctx.size, algorithm)
        algo = _byte_order(algo, algorithm, work.dtype, "allreduce")
        call = ctx.arrive("allreduce", work.dtype, work.size, -1, algo, op.name, timeout)
        if ctx.size == 1 or work.size == 0:
            if src is not work:
                work[...] = src
            return DoneRequest(ctx, "allreduce", call, ledger, result)
        if _lean(algo, op, max_message_bytes, nbytes, work):
            return mpi_engine.allreduce(ctx, call, src, work, result, op, ledger, timeout)
        if w is not None:  # the ring with 16-bit messages (hpcdp.comm.engines.wire)
            return ring_request(ctx, "allreduce", call, ledger, timeout, work=work, src=src, op=op,
                                phases=("rs", "ag"), segment_bytes=segment_bytes,
                                max_message_bytes=max_message_bytes, result=result, wire=w)
        # the algorithm's registered start (hpcdp.comm.algorithms: one line per algorithm)
        return get_algorithm("allreduce", algo).start(ctx, call, ledger, timeout, src=src, work=work,
                                                      result=result, op=op, segment_bytes=segment_bytes,
                                                      max_message_bytes=max_message_bytes)
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'allreduce', exc) from None


def _device_scratch(ctx, like):
    from hpcdp.comm.core.device import device_scratch
    return device_scratch(ctx, like.size, like.dtype)


def allreduce(sendbuf, recvbuf=None, *, comm, op="sum", algorithm="auto", ledger=None,
              segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None, wire=None):
    """Reduce ``sendbuf`` over all ranks into ``recvbuf`` (or in place); returns it."""
    try:
        if max_message_bytes is None and (wire is None or wire == "float32"):
            if algorithm == "ring":
                out = blocking.allreduce(sendbuf, recvbuf, comm, op, ledger, timeout, segment_bytes)
            else:
                out = fast.lean_allreduce(sendbuf, recvbuf, comm, op, algorithm, ledger, timeout, True)
            if out is not None:
                return out
        return blocking_call(iallreduce, sendbuf, recvbuf, comm=comm, op=op, algorithm=algorithm,
                             ledger=ledger, segment_bytes=segment_bytes, timeout=timeout,
                             max_message_bytes=max_message_bytes, wire=wire).wait()
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'allreduce', exc) from None


# -- reduce-scatter ------------------------------------------------------------

def _scatter_gather_algo(ctx, collective, nbytes, algorithm, timeout):
    """The reduce-scatter / all-gather algorithm: an explicit name as given; "auto" the
    cost model's pick for the node layout when ``HPCDP_PROFILE`` names a profile
    (hpcdp.comm.model.cost.fastest), else the measured size rule (hpcdp.comm.auto.choose)."""
    if algorithm == "auto" and ctx.size > 1:
        from hpcdp.comm.nodes import auto_layout
        layout = auto_layout(ctx, timeout)
        if layout is not None:
            from hpcdp.comm.model.cost import fastest
            return fastest(collective, nbytes, *layout)
    return choose(collective, nbytes, ctx.size, algorithm)



def ireduce_scatter(sendbuf, recvbuf=None, *, comm, op="sum", algorithm="auto", ledger=None,
                    segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None,
                    wire=None):
    """Start a reduce-scatter; ``wait()`` returns this rank's reduced chunk."""
    try:
        if algorithm == "auto":  # what [comm] says "auto" runs
            algorithm = configured("reduce_scatter", algorithm)
        w, algorithm = _wire(wire, sendbuf, algorithm, "reduce_scatter")
        if max_message_bytes is None and w is None:
            req = fast.lean_reduce_scatter(sendbuf, recvbuf, comm, op, algorithm, ledger, timeout)
            if req is not None:
                return req
        if not _host(sendbuf, recvbuf):
            kwargs = dict(op=op, algorithm=algorithm, ledger=ledger, segment_bytes=segment_bytes,
                          timeout=timeout, max_message_bytes=max_message_bytes, wire=wire)
            staged = _staged_wire(_staged(ireduce_scatter, sendbuf, recvbuf, comm, kwargs), w,
                                  "reduce_scatter")
            if staged is not None:
                return staged
        ctx = get_context(comm)
        op = resolve(op)
        src = flat_view(sendbuf, "sendbuf")
        n = src.size
        nbytes = n * src.dtype.itemsize
        algo = _byte_order(_scatter_gather_algo(ctx, "reduce_scatter", nbytes, algorithm, timeout),
                           algorithm, src.dtype, "reduce_scatter")
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
        call = ctx.arrive("reduce_scatter", src.dtype, n, -1, algo, op.name, timeout)
        if ctx.size == 1 or n == 0:
            if not in_place:
                out[...] = src
            return DoneRequest(ctx, "reduce_scatter", call, ledger, result)
        if _lean(algo, op, max_message_bytes, nbytes, src):
            return mpi_engine.reduce_scatter(ctx, call, src, out, in_place, result, op, ledger, timeout)
        if algo == "native":
            if in_place:
                tmp_out = np.empty(size, dtype=src.dtype) if isinstance(src, np.ndarray) else \
                    _device_scratch(ctx, out)

                def body(req):
                    yield from native_reduce_scatter(req, src, tmp_out, op)
                    out[...] = tmp_out
            else:
                body = lambda req: native_reduce_scatter(req, src, out, op)  # noqa: E731
            req = GenRequest(ctx, "reduce_scatter", call, ledger, timeout, body, max_message_bytes)
            req.result = result
            return req
        if algo != "ring":  # its registered start (hpcdp.comm.algorithms)
            return get_algorithm("reduce_scatter", algo).start(
                ctx, call, ledger, timeout, src=src, out=out, in_place=in_place, result=result, op=op,
                segment_bytes=segment_bytes, max_message_bytes=max_message_bytes)
        if in_place:
            return ring_request(ctx, "reduce_scatter", call, ledger, timeout, work=src, src=src,
                                op=op, phases=("rs",), segment_bytes=segment_bytes,
                                max_message_bytes=max_message_bytes, result=result, wire=w)
        return ring_request(ctx, "reduce_scatter", call, ledger, timeout, work=None,
                            src=src, op=op, phases=("rs",), segment_bytes=segment_bytes,
                            max_message_bytes=max_message_bytes, result=result,
                            final_out=(out, off, size), wire=w)
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'reduce_scatter', exc) from None


def reduce_scatter(sendbuf, recvbuf=None, *, comm, op="sum", algorithm="auto", ledger=None,
                   segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None,
                   wire=None):
    """This rank's chunk (``shard_range``) of the reduction over all ranks."""
    try:
        if max_message_bytes is None and (wire is None or wire == "float32"):
            if algorithm == "ring":
                out = blocking.reduce_scatter(sendbuf, recvbuf, comm, op, ledger, timeout,
                                              segment_bytes)
            else:
                out = fast.lean_reduce_scatter(sendbuf, recvbuf, comm, op, algorithm, ledger,
                                               timeout, True)
            if out is not None:
                return out
        return blocking_call(ireduce_scatter, sendbuf, recvbuf, comm=comm, op=op,
                             algorithm=algorithm, ledger=ledger, segment_bytes=segment_bytes,
                             timeout=timeout, max_message_bytes=max_message_bytes, wire=wire).wait()
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'reduce_scatter', exc) from None


# -- all-gather ----------------------------------------------------------------

def iall_gather(sendbuf, recvbuf=None, *, comm, algorithm="auto", ledger=None,
                segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None, wire=None):
    """Start an all-gather; ``wait()`` returns the full buffer."""
    try:
        if algorithm == "auto":  # what [comm] says "auto" runs
            algorithm = configured("all_gather", algorithm)
        w, algorithm = _wire(wire, sendbuf, algorithm, "all_gather")
        if max_message_bytes is None and w is None:
            req = fast.lean_all_gather(sendbuf, recvbuf, comm, algorithm, ledger, timeout)
            if req is not None:
                return req
        if not _host(sendbuf, recvbuf):
            kwargs = dict(algorithm=algorithm, ledger=ledger, segment_bytes=segment_bytes,
                          timeout=timeout, max_message_bytes=max_message_bytes, wire=wire)
            staged = _staged_wire(_staged(iall_gather, sendbuf, recvbuf, comm, kwargs), w, "all_gather")
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
        nbytes = n * full.dtype.itemsize
        algo = _byte_order(_scatter_gather_algo(ctx, "all_gather", nbytes, algorithm, timeout),
                           algorithm, full.dtype, "all_gather")
        call = ctx.arrive("all_gather", full.dtype, n, -1, algo, "", timeout)
        if algo == "native" and ctx.size > 1 and n > 0 and max_message_bytes is None \
                and nbytes < MAX_MESSAGE_BYTES and isinstance(full, np.ndarray):
            return mpi_engine.all_gather(ctx, call, chunk, full, result, ledger, timeout)
        if algo == "native" and ctx.size > 1 and n > 0:
            body = lambda req: native_all_gather(req, chunk, full, in_place)  # noqa: E731
            req = GenRequest(ctx, "all_gather", call, ledger, timeout, body, max_message_bytes)
            req.result = result
            return req
        if chunk is not None:
            full[off:off + size] = chunk
        if ctx.size == 1 or n == 0:
            return DoneRequest(ctx, "all_gather", call, ledger, result)
        if algo != "ring":
            return get_algorithm("all_gather", algo).start(
                ctx, call, ledger, timeout, full=full, result=result, segment_bytes=segment_bytes,
                max_message_bytes=max_message_bytes)
        return ring_request(ctx, "all_gather", call, ledger, timeout, work=full, src=full,
                            op=None, phases=("ag",), segment_bytes=segment_bytes,
                            max_message_bytes=max_message_bytes, result=result, wire=w)
    except MPI.Exception as exc:
        raise _mpi_failed(comm, 'all_gather', exc) from None


def all_gather(sendbuf, recvbuf=None, *, comm, algorithm="auto", ledger=None,
               segment_bytes=DEFAULT_SEGMENT_BYTES, timeout=None, max_message_bytes=None, wire=None):
    """Every rank's chunk, concatenated in rank order (``shard_range`` positions)."""
    try:
        if max_message_bytes is None and (wire is None or wire == "float32"):
            if algorithm == "ring":
                out = blocking.all_gather(sendbuf, recvbuf, comm, ledger, timeout, segment_bytes)
            else:
                out = fast.lean_all_gather(sendbuf, recvbuf, comm, algorithm, ledger, timeout, True)
            if out is not None:
                return out
        return blocking_call(iall_gather, sendbuf, recvbuf, comm=comm, algorithm=algorithm,
                             ledger=ledger, segment_bytes=segment_bytes, timeout=timeout,
                             max_message_bytes=max_message_bytes, wire=wire).wait()
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

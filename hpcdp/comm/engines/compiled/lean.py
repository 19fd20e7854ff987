"""The lean path's blocking calls in compiled code: MPI's own non-blocking collective
posted and tested to completion by one ``@njit(nogil=True, cache=True)`` call.

hpcdp.comm.fast takes a small blocking allreduce / reduce-scatter / all-gather
("auto" below its crossover, or "native") as one MPI non-blocking collective and a
deadline poll. Through mpi4py that is its Python front, mpi4py's buffer and argument
handling, and a ``Test`` per poll in Python: about 1.5 us above MPI's own blocking
call at 8 bytes. Here the same MPI call runs from compiled code: the kernel reads
the buffers' addresses itself (``arr.ctypes.data`` in Python costs about 1.5 us; an
array argument costs little), posts ``MPI_Iallreduce`` (``MPI_Ireduce_scatter_block``
/ ``MPI_Ireduce_scatter``, ``MPI_Iallgather`` / ``MPI_Iallgatherv`` when N does not
divide the length) on the context's data communicator, and tests it in a loop that
reads CLOCK_MONOTONIC every 64 polls, as hpcdp.comm.engines.mpi.spin does: past the deadline
it returns TIMEOUT, once the communicator is aborted (its flag, hpcdp.comm.abort) ABORTED; after SPIN_POLLS fruitless polls it yields the core every 64
polls and probes the control communicator for a peer's diagnosis status message
(PEER), as hpcdp.comm.engines.compiled.kernels.advance does. A failed MPI call returns
FAILED with MPI's error code in the entry (the caller raises ``MPI.Exception``, what
mpi4py raises); TIMEOUT and PEER make the caller run the missing-rank diagnosis
(hpcdp.comm.core.diagnose) exactly as the mpi4py path does. A mean is divided in the
kernel (integers: floor division, as ``np.floor_divide``; floats: one IEEE division
by the dtype's N, as ``np.true_divide``), the in-place reduce-scatter's chunk is
copied from the entry's scratch to its shard position there too; float16 travels as
its bits (uint16; MPI's float16 datatype reduces it) and its mean is NumPy's, after.
The results are MPI's own (the same call as mpi4py's path, on the same buffers),
the ledger the caller's (the same figures).

Signatures: one kernel per collective, compiled per element type of 1-D contiguous
arrays (the caller passes 1-D views): at most ten per kernel (int8..uint64,
float32, float64; float16 as uint16), compiled on first use and cached on disk
(``cache=True``). First use with an empty cache compiles for 0.8-2 s per kernel
and dtype on the loaded 2-core VM (docs/results.md, "leanc"); later processes load
it in about 10 ms. The first call compiles before it posts: peers wait for it
inside their own deadline, as for the compiled ring's first call.

Selection (the chooser's, hpcdp.comm.select.lean_tier; this module makes the entry
its plan names and runs it): this path runs whenever the MPI library can be bound
(hpcdp.comm.engines.compiled.binding), whatever ``HPCDP_COMM_ENGINE`` says. That variable
chooses who runs hpcdp's own ring; here MPI runs the collective in both cases and the
wire traffic, results and ledger are the same, and since both paths post the same MPI
call on the same communicator, ranks need not even agree on the path (one may fall
back while another runs compiled). ``HPCDP_COMM_LEAN=mpi4py`` (read when a context is
first used) or :func:`set_lean_path` per communicator runs the mpi4py path instead
(for comparison and tests). Where the MPI cannot be bound, one log line says so and
the mpi4py path runs. Non-blocking lean calls (``iallreduce`` ...) keep the mpi4py
path: their request is tested from Python anyway.

The ready calls (:class:`LeanCall`, kept in hpcdp.comm.engines.ready's table) and a
signature's first compiled call (:func:`run`) are here too: hpcdp.comm.fast calls
:func:`run` for the chooser's compiled tier.
"""

from __future__ import annotations

import logging
import time

import numpy as np
from numba import njit, types
from numba.extending import overload
from numba.np.numpy_support import as_dtype

from hpcdp.comm.core.context import KNOWN, get_context
from hpcdp.comm.core.debug import SPIN_POLLS
from hpcdp.comm.core.diagnose import diagnose
from hpcdp.comm.core.errors import mpi_error
from hpcdp.comm.core.settings import generation
from hpcdp.comm.engines.compiled.ccall import ccall, peek
from hpcdp.comm.engines.ready import AG, AR, NAMES, RS, keep, kept
from hpcdp.comm.engines.mpi import divide_mean
from hpcdp.shard import shard_range

PATHS = ("compiled", "mpi4py")
DONE, TIMEOUT, PEER, FAILED, REFUSED, NEED_SCRATCH, ABORTED = 0, -1, -2, -3, -4, -5, -6
CLOCK_MONOTONIC = 1  # Linux; time.monotonic() reads the same clock

# I (int64): the functions' addresses, the call's constants and the kernel's scratch
F_IALLREDUCE, F_IRS_BLOCK, F_IRS, F_IAG, F_IAGV, F_TEST, F_IPROBE, F_CLOCK, F_YIELD, \
    L_N, L_RANK, L_IN_PLACE, L_MEAN, L_STATUS_TAG, L_ANY, L_ERR, L_FLAG, L_PFLAG, L_T0, \
    L_TS, L_TS1, L_COUNTS, L_STATUS, L_ABORT = range(24)
L_HEAD = 24  # L_ABORT: the address of the communicator's abort flag (hpcdp.comm.abort)
# H (the ABI's handle width): data communicator, control communicator, datatype, op,
# the request
H_COMM, H_CTRL, H_TYPE, H_OP, H_REQ = range(5)

log = logging.getLogger("hpcdp.comm")


# -- compile-time facts of an argument's array type -----------------------------

def _writable(a):  # pragma: no cover - replaced in compiled code
    raise NotImplementedError


def _contiguous(a):  # pragma: no cover - replaced in compiled code
    raise NotImplementedError


def _divide(t, lo, n, N):  # pragma: no cover - replaced in compiled code
    raise NotImplementedError


def _same(a, b):  # pragma: no cover - replaced in compiled code
    raise NotImplementedError


@overload(_same)
def _same_impl(a, b):
    ok = isinstance(a, types.Array) and isinstance(b, types.Array) and a.dtype == b.dtype
    return lambda a, b: ok


@overload(_writable)
def _writable_impl(a):
    ok = isinstance(a, types.Array) and a.layout == "C" and a.mutable
    return lambda a: ok


@overload(_contiguous)
def _contiguous_impl(a):
    ok = isinstance(a, types.Array) and a.layout == "C"
    return lambda a: ok


@overload(_divide)
def _divide_impl(t, lo, n, N):
    """The mean's division of ``t[lo:lo+n]`` by N: np.true_divide(t, dtype(N)) for
    floats (one IEEE division in the dtype), np.floor_divide(t, N) for integers."""
    dt = t.dtype
    if not t.mutable:  # (never run: the kernel refuses a read-only buffer first)
        return lambda t, lo, n, N: None
    if isinstance(dt, types.Float):
        conv = as_dtype(dt).type

        def impl(t, lo, n, N):
            d = conv(N)
            for i in range(lo, lo + n):
                t[i] = t[i] / d
        return impl
    conv = np.uint64 if isinstance(dt, types.Integer) and not dt.signed else np.int64

    def impl_int(t, lo, n, N):
        d = conv(N)
        for i in range(lo, lo + n):
            t[i] = t[i] // d
    return impl_int


def _copy(dst, off, src, n):  # pragma: no cover - replaced in compiled code
    raise NotImplementedError


@overload(_copy)
def _copy_impl(dst, off, src, n):
    """``dst[off:off+n] = src[:n]``."""
    if not dst.mutable:  # (never run: the kernel refuses a read-only buffer first)
        return lambda dst, off, src, n: None

    def impl(dst, off, src, n):
        for i in range(n):
            dst[off + i] = src[i]
    return impl


@njit(nogil=True, cache=True, inline="always")
def _addr(a):
    return np.int64(a.ctypes.data)


@njit(nogil=True, cache=True, inline="always")
def _now(I):
    ccall(I[F_CLOCK], (np.int32(CLOCK_MONOTONIC), _addr(I) + 8 * L_TS))
    return I[L_TS] + I[L_TS1] * 1e-9


@njit(nogil=True, cache=True)
def _wait(I, H, limit):
    """Test the posted request until done (DONE), past ``limit`` seconds (TIMEOUT), a
    peer's diagnosis waits on the control communicator (PEER) or MPI fails (FAILED)."""
    req = _addr(H) + H_REQ * H.itemsize
    ip = _addr(I)
    flag, pflag, status = ip + 8 * L_FLAG, ip + 8 * L_PFLAG, ip + 8 * I[L_STATUS]
    t0 = _now(I)
    I[L_T0] = I[L_TS] * 1_000_000_000 + I[L_TS1]
    deadline = t0 + limit
    idle = 0
    while True:
        err = ccall(I[F_TEST], (req, flag, status))
        if err != 0:
            I[L_ERR] = err
            return FAILED
        if I[L_FLAG] != 0:  # (MPI writes the low int; the slot's other bytes stay 0)
            return DONE
        idle += 1
        if idle & 63 == 0:
            if _now(I) > deadline:
                return TIMEOUT
            if peek(I[L_ABORT]) != 0:
                return ABORTED
            if idle > SPIN_POLLS:
                ccall(I[F_YIELD], ())  # oversubscribed ranks: let the peer run
                ccall(I[F_IPROBE], (np.int32(I[L_ANY]), np.int32(I[L_STATUS_TAG]), H[H_CTRL],
                                    pflag, status))
                if I[L_PFLAG] != 0:
                    return PEER


@njit(nogil=True, cache=True, inline="always")
def _posted(I, err):
    if err != 0:
        I[L_ERR] = err
        return FAILED
    return DONE


@njit(nogil=True, cache=True)
def allreduce(I, H, src, dst, limit):
    """``dst`` = the reduction of every rank's ``src`` (in place when they are one
    buffer); a mean divided here. REFUSED (nothing posted): a buffer compiled code
    does not take as it is (read-only, not contiguous, another dtype or length)."""
    if not (_writable(dst) and _contiguous(src) and _same(src, dst)) or src.size != dst.size:
        return REFUSED
    n = dst.size
    sp, dp = _addr(src), _addr(dst)
    if sp == dp:
        sp = I[L_IN_PLACE]
    err = ccall(I[F_IALLREDUCE], (sp, dp, np.int32(n), H[H_TYPE], H[H_OP], H[H_COMM],
                                  _addr(H) + H_REQ * H.itemsize))
    code = _posted(I, err)
    if code == DONE:
        code = _wait(I, H, limit)
    if code == DONE and I[L_MEAN] != 0:
        _divide(dst, 0, n, I[L_N])
    return code


@njit(nogil=True, cache=True, inline="always")
def _counts(I, n):
    """This rank's (offset, size) of the shard rule (hpcdp.shard.shard_range), and when
    N does not divide ``n`` every rank's counts and displacements (int32) in I."""
    N, r = I[L_N], I[L_RANK]
    base, rem = n // N, n % N
    off = r * base + min(r, rem)
    size = base + (1 if r < rem else 0)
    c = I[I[L_COUNTS]:I[L_COUNTS] + N].view(np.int32)
    if rem != 0:
        pos = 0
        for p in range(N):
            k = base + (1 if p < rem else 0)
            c[p] = k
            c[N + p] = pos
            pos += k
    return off, size, rem, _addr(c)


@njit(nogil=True, cache=True)
def reduce_scatter(I, H, src, dst, scratch, limit):
    """This rank's chunk of the reduction into ``dst`` (its shard length), or in place
    (``dst`` is ``src``): MPI's result lands in ``scratch`` and is copied to the chunk's
    position in ``src``. NEED_SCRATCH (nothing posted): ``scratch`` is shorter than the
    chunk."""
    if not (_writable(dst) and _contiguous(src) and _writable(scratch) and _same(src, dst)
            and _same(src, scratch)):
        return REFUSED
    n = src.size
    off, size, rem, counts = _counts(I, n)
    sp = _addr(src)
    in_place = sp == _addr(dst)
    if in_place:
        if scratch.size < size:
            return NEED_SCRATCH
        target = scratch
    else:
        if dst.size != size:
            return REFUSED
        target = dst
    tp = _addr(target)
    if rem == 0:
        err = ccall(I[F_IRS_BLOCK], (sp, tp, np.int32(size), H[H_TYPE], H[H_OP], H[H_COMM],
                                     _addr(H) + H_REQ * H.itemsize))
    else:
        err = ccall(I[F_IRS], (sp, tp, counts, H[H_TYPE], H[H_OP], H[H_COMM],
                               _addr(H) + H_REQ * H.itemsize))
    code = _posted(I, err)
    if code == DONE:
        code = _wait(I, H, limit)
    if code == DONE:
        if I[L_MEAN] != 0:
            _divide(target, 0, size, I[L_N])
        if in_place:
            _copy(dst, off, scratch, size)
    return code


@njit(nogil=True, cache=True)
def all_gather(I, H, src, dst, limit):
    """Every rank's chunk into ``dst`` at its shard position; ``src`` this rank's chunk,
    or ``dst`` itself (in place: the chunk already in position)."""
    if not (_writable(dst) and _contiguous(src) and _same(src, dst)):
        return REFUSED
    n = dst.size
    off, size, rem, counts = _counts(I, n)
    sp, dp = _addr(src), _addr(dst)
    if sp == dp:
        sp = I[L_IN_PLACE]
    elif src.size != size:
        return REFUSED
    if rem == 0:
        err = ccall(I[F_IAG], (sp, np.int32(size), H[H_TYPE], dp, np.int32(size), H[H_TYPE],
                               H[H_COMM], _addr(H) + H_REQ * H.itemsize))
    else:
        N = I[L_N]
        err = ccall(I[F_IAGV], (sp, np.int32(size), H[H_TYPE], dp, counts, counts + 4 * N,
                                H[H_TYPE], H[H_COMM], _addr(H) + H_REQ * H.itemsize))
    code = _posted(I, err)
    if code == DONE:
        code = _wait(I, H, limit)
    return code


KERNELS = {"allreduce": allreduce, "reduce_scatter": reduce_scatter, "all_gather": all_gather}


# -- the Python side: the path's choice, the binding and one entry per signature --

def set_lean_path(comm, name: str) -> None:
    """Run ``comm``'s small blocking collectives on ``name``: ``"compiled"`` (this module)
    or ``"mpi4py"`` (mpi4py's non-blocking call and a Python Test loop). Per rank: both
    post the same MPI call, so ranks may differ."""
    if name not in PATHS:
        raise ValueError(f"lean path must be one of {PATHS}, got {name!r}")
    ctx = get_context(comm)
    ctx.lean_path = name
    ctx.plans.clear()  # (hpcdp.comm.select.lean_signature decides again)
    ctx.forget_ready()  # (and its ready calls were made for the old path)


def binding():
    """The bound MPI (hpcdp.comm.engines.compiled.binding), or None: then the reason is logged
    once per process and the mpi4py path runs."""
    from hpcdp.comm.engines.compiled.binding import bound_or_none

    return bound_or_none("lean", log, "hpcdp.comm: the compiled lean path cannot bind this MPI "
                         "(%s); small collectives run through mpi4py")


def forget() -> None:
    """Bind again on next use (tests: after changing what the binding's load sees)."""
    from hpcdp.comm.core.settings import invalidate
    from hpcdp.comm.engines.compiled import binding as compiled_binding

    compiled_binding.forget()
    invalidate()  # cached decisions made with the old binding are made again


class Entry:
    """One lean signature's compiled call: the kernel, its arrays ``I`` and ``H``
    (module constants), the in-place reduce-scatter's scratch, and whether the
    buffers travel as uint16 bits (float16: the mean is then NumPy's, after)."""

    __slots__ = ("kernel", "I", "H", "scratch", "half", "mean_after")

    def __init__(self, ctx, b, collective, mpi_type, mpi_op, mean, dtype):
        from mpi4py import MPI

        self.kernel = KERNELS[collective]
        self.half = dtype.char == "e"
        self.mean_after = bool(mean) and self.half
        N = ctx.size
        status_slots = -(-int(b.status_size) // 8)
        I = np.zeros(L_HEAD + N + status_slots, dtype=np.int64)
        I[[F_IALLREDUCE, F_IRS_BLOCK, F_IRS, F_IAG, F_IAGV, F_TEST, F_IPROBE, F_CLOCK,
           F_YIELD]] = (b.iallreduce, b.ireduce_scatter_block, b.ireduce_scatter, b.iallgather,
                        b.iallgatherv, b.test, b.iprobe, b.clock_gettime, b.sched_yield)
        I[[L_N, L_RANK, L_IN_PLACE, L_STATUS_TAG, L_ANY]] = (N, ctx.rank, b.in_place,
                                                              ctx.status_tag, b.any_source)
        I[L_MEAN] = int(bool(mean) and not self.half)
        I[L_COUNTS], I[L_STATUS] = L_HEAD, L_HEAD + N
        I[L_ABORT] = ctx.abort_flag.ctypes.data  # (the array lives as long as the context)
        self.I = I
        self.H = np.array([b.handle(ctx.data), b.handle(ctx.ctrl), b.handle(mpi_type),
                           b.handle(mpi_op), b.handle(MPI.REQUEST_NULL)], dtype=b.handle_dtype)
        self.scratch = np.empty(0, dtype=np.uint16 if self.half else dtype)

    def views(self, a):
        """``a`` as the kernel takes it: 1-D, float16 as its uint16 bits."""
        if a.ndim != 1:
            a = a.reshape(-1)
        return a.view(np.uint16) if self.half else a

    def grow(self, size: int) -> None:
        self.scratch = np.empty(max(size, 2 * self.scratch.size), dtype=self.scratch.dtype)

    def direct(self, dtype):
        """The kernel's compiled entry point for 1-D C-contiguous, aligned, writeable
        arrays of ``dtype`` (Numba's overload, without the dispatcher's per-call typing:
        the caller passes only such arrays), or None: not compiled for them yet, float16
        (it travels as its bits), or a Numba without these attributes."""
        if self.half:
            return None
        from numba import typeof

        a = np.empty(1, dtype=dtype)
        args = (self.I, self.H, a, a, self.scratch, 0.0) if self.kernel is reduce_scatter \
            else (self.I, self.H, a, a, 0.0)
        try:
            return self.kernel.overloads[tuple(typeof(x) for x in args)].entry_point
        except (AttributeError, KeyError, TypeError):
            return None

    def error_code(self) -> int:
        return int(self.I[L_ERR])

    def started(self) -> float:
        """When the kernel's wait began (time.monotonic's clock)."""
        return int(self.I[L_T0]) * 1e-9


# -- ready compiled calls: a repeated blocking call's checks done once ---------------
# After a blocking call ran compiled, its signature (collective, length, dtype, op,
# algorithm) keeps a LeanCall in the context's ready calls (hpcdp.comm.engines.ready,
# which looks it up and checks the signature). Its ``run`` then checks only the other
# buffer and calls the kernel's compiled entry point (lean.Entry.direct) with exactly
# the argument types it was compiled for. What the record fixes (the byte bound, the
# MPI datatype and op, this rank's shard, the ledger's figures) was decided by the full
# front. A signature's first compiled call is :func:`run`; MPI's call through mpi4py is
# hpcdp.comm.engines.mpi's. ``which`` (AR, RS, AG) names the collective.


class LeanCall:
    """One signature's ready blocking call: the collective (``which``), the kernel's
    entry point, the lean entry (its ``I`` / ``H`` arrays and scratch), what the
    signature is (dtype object, op, the settings' generation; the algorithm named is the
    table's key) and its fixed
    figures (this rank's shard ``off`` / ``size``, the ledger's sent / received bytes)."""

    __slots__ = ("which", "call", "e", "I", "H", "dtype", "op", "gen", "off",
                 "size", "sent", "recv")

    def __init__(self, which, call, e, dtype, op, gen, off, size, sent, recv):
        self.which, self.call, self.e, self.dtype, self.op = which, call, e, dtype, op
        self.I, self.H = e.I, e.H  # (the entry's own arrays)
        self.gen, self.off, self.size, self.sent, self.recv = gen, off, size, sent, recv

    def run(self, ctx, sendbuf, recvbuf, full, in_place, ledger, timeout, segment_bytes):
        """The call on buffers whose signature matched (hpcdp.comm.engines.ready): the
        result, or None when the other buffer does not fit (nothing posted)."""
        which = self.which
        if not in_place:
            other = sendbuf if which == AG else recvbuf
            if other.__class__ is not np.ndarray or other.ndim != 1 \
                    or other.dtype is not self.dtype or not other.flags.carray:
                return None
        dst = full if which == AG or in_place else recvbuf
        seq = ctx.seq
        ctx.seq = seq + 1
        limit = ctx.timeout if timeout is None else float(timeout)
        if which == RS:
            e = self.e
            code = self.call(self.I, self.H, sendbuf, dst, e.scratch, limit)
            if code == NEED_SCRATCH:
                e.grow(self.size)
                code = self.call(self.I, self.H, sendbuf, dst, e.scratch, limit)
        else:
            code = self.call(self.I, self.H, sendbuf, dst, limit)
        if code == 0:
            if ledger is not None:
                ledger.count_call(NAMES[which], self.sent, self.recv, 1, 1)
            return sendbuf[self.off:self.off + self.size] if which == RS and in_place else dst
        # refused (nothing posted: a length mismatch) falls to the full front
        return _compiled_failed(ctx, self.e, code, seq, NAMES[which], full, self.op, limit)


def _remember(ctx, which, n, e, dtype, op, algorithm, off, size, sent, recv):
    """Keep the ready call of a blocking compiled call that just completed (its kernel
    is compiled for these argument types now), when it has an entry point."""
    r = kept(ctx, which, algorithm, n)
    if r is not None and r.__class__ is LeanCall and r.e is e and r.dtype is dtype \
            and r.op == op and r.gen == generation():
        return  # kept already (this call missed it for its buffers' flags)
    call = e.direct(dtype)
    if call is None:
        return
    keep(ctx, which, algorithm, n,
         LeanCall(which, call, e, dtype, op, generation(), off, size, sent, recv))


def _ready(comm, which, buf, op, algorithm):
    """The LeanCall kept for ``buf`` (a 1-D ndarray: the full-length buffer) and this
    signature on ``comm``, or None (tests look here)."""
    hit = KNOWN.get(id(comm))
    if hit is None or hit[0] is not comm:
        return None
    ctx = hit[1]
    r = kept(ctx, which, algorithm, buf.size)
    if r is None or r.__class__ is not LeanCall or r.dtype is not buf.dtype or r.op != op \
            or r.gen != generation() or ctx.debug or ctx.failed is not None \
            or not buf.flags.carray:
        return None
    return r


def run(ctx, e, which, src, dst, op, algorithm, ledger, timeout):
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
        if code == NEED_SCRATCH:
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
        divide_mean(result.reshape(-1), ctx.size)
    elif src.ndim == 1 and dst.ndim == 1:
        _remember(ctx, which, n, e, buf.dtype, op, algorithm, off, size, sent, recv)
    if ledger is not None:
        ledger.count_call(name, sent, recv, 1, 1)
    return result


def _compiled_failed(ctx, e, code, seq, name, buf, op, limit):
    """A compiled lean call that did not complete: None when nothing was posted (the
    general path takes the call and explains a bad buffer); else what the mpi4py path
    raises: mpi4py's MPI.Exception for an MPI error, the missing-rank diagnosis past the
    deadline or when a peer started one (as :func:`spin`)."""
    if code == REFUSED:
        ctx.seq = seq
        return None
    if code == FAILED:
        err = mpi_error(e.error_code(), collective=name, seq=seq, rank=ctx.rank)
        if ctx.failed is None:
            ctx.failed = err
        raise err
    if code == ABORTED:
        raise ctx.failed
    call = (seq, name, buf.dtype, buf.size, -1, "native", op)
    raise diagnose(ctx, call, time.monotonic() - e.started(), limit, (),
                   joined=code == PEER)

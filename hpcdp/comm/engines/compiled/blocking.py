"""The blocking compiled ring's fast front: a repeated call runs as one compiled call.

A blocking ``allreduce`` / ``reduce_scatter`` / ``all_gather`` with
``algorithm="ring"`` on a communicator whose ring runs compiled
(hpcdp.comm.engines.compiled.engine) spends most of its time, at small sizes, in Python:
the general front's checks, the call tuple, the registered start, a request object
and its ledger record. Here a call's signature ``(collective, length, dtype,
op, in place, segment_bytes)`` is checked once by the general path: when the chooser's
plan runs it as the ring on the compiled engine (hpcdp.comm.select) and the call is
blocking, the front keeps the request's plan (hpcdp.comm.engines.compiled.request.Plan,
its code compiled by the request's first pass, outside any deadline) as a ready entry
per signature on the communicator's context (:func:`keep`, ``CommContext.blocking_plans``,
emptied by ``set_engine``). A repeated call is then: a few buffer checks, a sequence
number, a state from the plan, one compiled ``advance`` in ``BLOCK`` mode up to the
deadline, and the ledger's counters. This module makes no choice: it runs an entry the
chooser's plan made, or returns None.

Every guarantee stays: the same plan and kernel as the request path (bit-for-bit
results), the same ledger figures, the deadline (``comm.timeout`` or ``timeout=``)
and the missing-rank diagnosis when it passes or a peer starts one (the call tuple
is built only then), an MPI error from compiled code as a CommError. Anything else
returns None and takes the general path: a signature with no entry (a first call, one
the chooser does not run on the compiled ring), debug mode, a failed communicator, a
non-numpy, non-contiguous or read-only buffer, one of another dtype or length.
"""

from __future__ import annotations

from time import monotonic

import numpy as np

from hpcdp.comm.engines.compiled import kernels as K
from hpcdp.comm.engines.compiled.kernels import BLOCK, DONE, FRESH_SHIFT
from hpcdp.comm.engines.compiled.request import failure, timed_out
from hpcdp.comm.core.context import known_context
from hpcdp.shard import shard_range

_MAX_ENTRIES = 256
_COUNTS = slice(K.ST_SENT_B, K.ST_SENT_B + 4)
assert (K.ST_RECV_B, K.ST_SENT_M, K.ST_RECV_M) == tuple(range(K.ST_SENT_B + 1, K.ST_SENT_B + 4))


class Entry:
    """One signature's ready plan, the constants of its calls, its own state (a
    blocking call gives it back before it returns, so one is enough; a re-entrant call
    finding it taken uses one from the plan) and ``call``: the compiled ``advance``'s
    entry point for exactly this signature's argument types (set after the entry's
    first call through Numba's dispatcher), which skips the dispatcher's per-call type
    resolution; the front only passes it arrays of those types (:func:`_ok`: 1-D,
    C-contiguous, aligned, writeable, and the key's native dtype)."""

    __slots__ = ("plan", "engine", "half", "off", "size", "op_name", "state", "call",
                 "tag_mod", "tag_step")

    def __init__(self, plan, engine, half, off, size, op_name):
        self.plan, self.engine, self.half = plan, engine, half
        self.off, self.size, self.op_name = off, size, op_name
        self.state = None  # (taken from the plan at the first call, then kept)
        self.call = None
        self.tag_mod, self.tag_step = plan.seq_mod, plan.step_space


def _ok(buf) -> bool:
    """A host buffer compiled code takes as it is: a 1-D ndarray whose flags say
    C-contiguous, aligned and writeable (``carray``); its dtype's byte order is the
    key's (native: :func:`_entry` checks it once per signature)."""
    return buf.__class__ is np.ndarray and buf.ndim == 1 and buf.flags.carray


def keep(ctx, name, req, op, segment_bytes) -> None:
    """Keep a ready entry for the signature of ``req``, a blocking compiled ring request
    the front just launched because the chooser's plan said so (hpcdp.comm.select: the
    ring on the compiled engine, host buffers, a built-in op, no 16-bit wire, whole
    messages). Its plan's code is compiled by then (the request's first pass compiles
    it, outside any deadline). The entry takes its state from the plan at its first
    call. ``op``: the op's name ("" for an all-gather), as the caller names it."""
    plan = req.plan
    if not plan.warm:
        return
    same = req.src is req.work
    key = (name, plan.n, plan.dtype, op or None, same, segment_bytes)
    if key in ctx.blocking_plans:
        return
    off, size = shard_range(plan.n, ctx.size, ctx.rank)
    if len(ctx.blocking_plans) >= _MAX_ENTRIES:
        ctx.blocking_plans.clear()
    ctx.blocking_plans[key] = Entry(plan, req.engine, plan.dtype == np.float16, off, size,
                                    op or "")


def _bound(advance, args):
    """The compiled entry point of ``advance`` for ``args``' types (they have just
    run through the dispatcher, so that specialisation exists), or None."""
    try:
        sig = tuple(advance.typeof_pyval(a) for a in args)
        return advance.overloads[sig].entry_point
    except (AttributeError, KeyError, TypeError):  # another Numba: keep the dispatcher
        return None


def _run(ctx, name, e, work, src, dtype, n, ledger, timeout, res=None):
    """One blocking compiled ring call on a ready entry: done (its ledger figures
    counted), or the diagnosis' / the MPI error raised. ``res``: an out-of-place
    reduce-scatter's output, which the last step reduces into directly
    (kernels.P_RES_OFF); else the work buffer."""
    seq = ctx.seq
    ctx.seq = seq + 1
    state = e.state
    if state is None:  # re-entered (a call from another thread while one runs), or a
        state = e.plan.take()  # failed call kept its state (its requests may be live)
    else:
        e.state = None
    if work is None:  # out-of-place reduce-scatter: the chunks pass through the state's buffer
        work = state.work
    # BLOCK with the call's tag base + 1: advance resets the state first (kernels.P_FRESH)
    mode = BLOCK | ((seq % e.tag_mod) * e.tag_step + 1) << FRESH_SHIFT
    limit = ctx.timeout if timeout is None else float(timeout)
    if res is None:
        res = work
    if e.half:  # float16 is reduced on its bits (hpcdp.comm.engines.compiled.kernels)
        work, src, res = work.view(np.uint16), src.view(np.uint16), res.view(np.uint16)
    started = monotonic()
    call = e.call
    if call is not None:
        code = call(mode, started + limit, state.I, state.H, work, src, res, state.tmp,
                    state.div, state.X, state.stat)
    else:
        args = (mode, started + limit, state.I, state.H, work, src, res, state.tmp,
                state.div, state.X, state.stat)
        code = e.engine.advance(*args)
        e.call = _bound(e.engine.advance, args)
    st = state.st
    if code != DONE:  # the state is dropped: MPI may still hold its buffers
        if code == K.FAILED:
            raise failure(ctx, name, seq, st)
        if code == K.ABORTED:
            raise ctx.failed
        raise timed_out(ctx, (seq, name, dtype, n, -1, "ring", e.op_name), started, limit,
                        st, joined=code == K.PEER)
    if ledger is not None:  # (the four counters are adjacent: one slice, four ints)
        sent_b, recv_b, sent_m, recv_m = st[_COUNTS].tolist()
        ledger.count_call(name, sent_b, recv_b, sent_m, recv_m)
    if e.state is None:
        e.state = state
    else:
        e.plan.give(state)


def _front(comm):
    ctx = known_context(comm)
    if ctx is None or ctx.debug or ctx.failed is not None:
        return None
    return ctx


def _reducing(name, sendbuf, recvbuf, comm, op, segment_bytes):
    """(context, entry, in place) of a reducing call the front takes, or None. An
    out-of-place buffer's length is the caller's to check against the entry. The
    per-call checks are the buffers' and the context's; what an entry's key fixes
    (op, dtype, length, ranks) was checked when the entry was made."""
    if op.__class__ is not str or not _ok(sendbuf):
        return None
    ctx = _front(comm)
    if ctx is None:
        return None
    same = recvbuf is None or recvbuf is sendbuf
    dtype = sendbuf.dtype
    if not (same or (_ok(recvbuf) and recvbuf.dtype == dtype)):
        return None
    e = ctx.blocking_plans.get((name, sendbuf.size, dtype, op, same, segment_bytes))
    if e is None:
        return None
    return ctx, e, same


def allreduce(sendbuf, recvbuf, comm, op, ledger, timeout, segment_bytes):
    """A blocking ring allreduce through the fast front, or None (module docstring)."""
    hit = _reducing("allreduce", sendbuf, recvbuf, comm, op, segment_bytes)
    if hit is None:
        return None
    ctx, e, same = hit
    work = sendbuf if same else recvbuf
    if work.size != sendbuf.size:
        return None
    _run(ctx, "allreduce", e, work, sendbuf, sendbuf.dtype, sendbuf.size, ledger, timeout)
    return work


def reduce_scatter(sendbuf, recvbuf, comm, op, ledger, timeout, segment_bytes):
    """A blocking ring reduce-scatter through the fast front, or None."""
    hit = _reducing("reduce_scatter", sendbuf, recvbuf, comm, op, segment_bytes)
    if hit is None:
        return None
    ctx, e, same = hit
    if not same and recvbuf.size != e.size:
        return None
    off, size = e.off, e.size
    _run(ctx, "reduce_scatter", e, sendbuf if same else None, sendbuf, sendbuf.dtype,
         sendbuf.size, ledger, timeout, res=None if same else recvbuf)
    return sendbuf[off:off + size] if same else recvbuf


def all_gather(sendbuf, recvbuf, comm, ledger, timeout, segment_bytes):
    """A blocking ring all-gather through the fast front, or None."""
    if not _ok(sendbuf):
        return None
    ctx = _front(comm)
    if ctx is None:
        return None
    same = recvbuf is None or recvbuf is sendbuf
    full = sendbuf if same else recvbuf
    if not same and not (_ok(recvbuf) and recvbuf.dtype == sendbuf.dtype):
        return None
    dtype, n = full.dtype, full.size
    e = ctx.blocking_plans.get(("all_gather", n, dtype, None, True, segment_bytes))
    if e is None or (not same and sendbuf.size != e.size):
        return None
    if not same:
        full[e.off:e.off + e.size] = sendbuf
    _run(ctx, "all_gather", e, full, full, dtype, n, ledger, timeout)
    return full

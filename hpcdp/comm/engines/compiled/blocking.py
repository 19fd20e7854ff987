"""The blocking compiled ring's ready entries: a repeated call runs as one compiled call.

A blocking ``allreduce`` / ``reduce_scatter`` / ``all_gather`` whose plan runs the ring
on the compiled engine (hpcdp.comm.select) spends most of its time, at small sizes, in
Python: the general front's checks, the call tuple, the launch, a request object and
its ledger record. When the compiled engine launches such a call it keeps the request's
plan (hpcdp.comm.engines.compiled.request.Plan, its code compiled by the request's first
pass, outside any deadline) as an :class:`Entry` in the context's ready calls
(:func:`keep`; hpcdp.comm.engines.ready looks it up and checks the signature). A
repeated call is then: its other buffer and segment size checked, a sequence number, a
state from the plan, one compiled ``advance`` in ``BLOCK`` mode up to the deadline, and
the ledger's counters. This module makes no choice: it keeps and runs entries the
chooser's plans made.

Every guarantee stays: the same plan and kernel as the request path (bit-for-bit
results), the same ledger figures, the deadline (``comm.timeout`` or ``timeout=``)
and the missing-rank diagnosis when it passes or a peer starts one (the call tuple
is built only then), an MPI error from compiled code as a CommError. Anything that
does not fit returns None and takes the general path.
"""

from __future__ import annotations

from time import monotonic

import numpy as np

from hpcdp.comm.engines.compiled import kernels as K
from hpcdp.comm.engines.compiled.kernels import BLOCK, DONE, FRESH_SHIFT
from hpcdp.comm.engines.compiled.request import failure, timed_out
from hpcdp.comm.core.settings import generation
from hpcdp.comm.engines.ready import AG, RS, WHICH, keep as keep_ready, kept
from hpcdp.shard import shard_range
_COUNTS = slice(K.ST_SENT_B, K.ST_SENT_B + 4)
assert (K.ST_RECV_B, K.ST_SENT_M, K.ST_RECV_M) == tuple(range(K.ST_SENT_B + 1, K.ST_SENT_B + 4))


class Entry:
    """One signature's ready plan, the constants of its calls, its own state (a
    blocking call gives it back before it returns, so one is enough; a re-entrant call
    finding it taken uses one from the plan) and ``call``: the compiled ``advance``'s
    entry point for exactly this signature's argument types (set after the entry's
    first call through Numba's dispatcher), which skips the dispatcher's per-call type
    resolution; it only gets arrays of those types (:func:`_ok`: 1-D, C-contiguous,
    aligned, writeable, and the key's native dtype). The signature
    (hpcdp.comm.engines.ready, whose table is keyed by the algorithm named): ``dtype``,
    ``op``, ``gen``, and its own
    ``same`` (in place) and ``segment_bytes``."""

    __slots__ = ("plan", "engine", "half", "off", "size", "op_name", "state", "call",
                 "tag_mod", "tag_step", "which", "dtype", "op", "gen",
                 "same", "segment_bytes")

    def __init__(self, plan, engine, half, off, size, op_name, which, dtype, same, segment_bytes):
        self.plan, self.engine, self.half = plan, engine, half
        self.off, self.size, self.op_name = off, size, op_name
        self.state = None  # (taken from the plan at the first call, then kept)
        self.call = None
        self.tag_mod, self.tag_step = plan.seq_mod, plan.step_space
        self.which, self.dtype, self.op = which, dtype, op_name
        self.gen, self.same = generation(), same
        self.segment_bytes = segment_bytes

    def run(self, ctx, sendbuf, recvbuf, full, in_place, ledger, timeout, segment_bytes):
        """The call on buffers whose signature matched (hpcdp.comm.engines.ready): the
        result, or None when the rest does not fit (nothing done)."""
        which = self.which  # (an all-gather's ring runs in the full buffer either way)
        if segment_bytes != self.segment_bytes or (in_place != self.same and which != AG):
            return None
        if which == AG:
            if not in_place:
                if not _ok(sendbuf) or sendbuf.dtype is not self.dtype \
                        or sendbuf.size != self.size:
                    return None
                full[self.off:self.off + self.size] = sendbuf
            _run(ctx, "all_gather", self, full, full, full.dtype, full.size, ledger, timeout)
            return full
        if not in_place and not (_ok(recvbuf) and recvbuf.dtype is self.dtype):
            return None
        if which == RS:
            if not in_place and recvbuf.size != self.size:
                return None
            _run(ctx, "reduce_scatter", self, sendbuf if in_place else None, sendbuf,
                 sendbuf.dtype, sendbuf.size, ledger, timeout,
                 res=None if in_place else recvbuf)
            return sendbuf[self.off:self.off + self.size] if in_place else recvbuf
        work = sendbuf if in_place else recvbuf
        if work.size != sendbuf.size:
            return None
        _run(ctx, "allreduce", self, work, sendbuf, sendbuf.dtype, sendbuf.size, ledger, timeout)
        return work


def _ok(buf) -> bool:
    """A host buffer compiled code takes as it is: a 1-D ndarray whose flags say
    C-contiguous, aligned and writeable (``carray``); its dtype's byte order is the
    key's (native: :func:`_entry` checks it once per signature)."""
    return buf.__class__ is np.ndarray and buf.ndim == 1 and buf.flags.carray


def keep(ctx, name, req, op, algorithm, segment_bytes) -> None:
    """Keep a ready entry for the signature of ``req``, a blocking compiled ring request
    the compiled engine just launched from the chooser's plan (hpcdp.comm.select: the
    ring on the compiled engine, host buffers, a built-in op, no 16-bit wire, whole
    messages). Its plan's code is compiled by then (the request's first pass compiles
    it, outside any deadline). The entry takes its state from the plan at its first
    call. ``op``: the op's name ("" for an all-gather); ``algorithm``: the one the
    caller named (the ready call's key, hpcdp.comm.engines.ready)."""
    plan = req.plan
    if not plan.warm:
        return
    which = WHICH[name]
    same = req.src is req.work
    dtype = req.src.dtype
    r = kept(ctx, which, algorithm, plan.n)
    if r is not None and r.__class__ is Entry and r.dtype is dtype and r.op == op \
            and (r.same == same or which == AG) \
            and r.segment_bytes == segment_bytes and r.gen == generation() \
            and r.engine is req.engine:
        return
    off, size = shard_range(plan.n, ctx.size, ctx.rank)
    keep_ready(ctx, which, algorithm, plan.n,
               Entry(plan, req.engine, plan.dtype == np.float16, off, size, op, which, dtype,
                     same, segment_bytes))


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

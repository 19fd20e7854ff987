"""The small-message path: the front's checks before MPI's own collective as one call.

Below the crossovers of hpcdp.comm.auto, MPI's own collective over shared memory
or a network is latency-bound and hard to beat from Python; what hpcdp adds must
then cost as little as possible. For host numpy buffers and a built-in op, a call
here (after the front found no ready call, hpcdp.comm.engines.ready) is: the buffers'
inlined checks, the chooser's plan for the call's signature (hpcdp.comm.select.lean_signature, cached on the
communicator's context) and the engine that plan names: one compiled call for a
blocking call on the compiled tier (hpcdp.comm.engines.compiled.lean.run), else
mpi4py's call and its deadline poll (hpcdp.comm.engines.mpi.post_*). This module makes
no choice and no MPI call of its own.

Each function returns the result (blocking), a FastRequest (non-blocking), or None
when the call is not a plain one (a user op, device arrays, debug mode, one rank, a
context not set up yet, a size at or above the chooser's bound, buffers mpi4py refuses);
then the general front (hpcdp.comm.collectives) validates, explains errors and runs it.
About 2 us of Python per call on top of MPI's non-blocking call + Test through mpi4py
(``hpcdp bench comm-overhead``), less on the compiled tier.
"""

from __future__ import annotations

import numpy as np

from hpcdp.comm.core.context import known_context
from hpcdp.comm.core.settings import generation
from hpcdp.comm.engines import mpi as engine
from hpcdp.comm.engines.compiled.lean import AG, AR, RS, run
from hpcdp.comm.select import lean_signature


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
        sig = lean_signature(ctx, collective, op, algorithm, dtype)
    nbytes = buf.nbytes
    if sig is None or nbytes >= sig[3] or nbytes == 0:
        return None, None
    return ctx, sig


def lean_allreduce(sendbuf, recvbuf, comm, op, algorithm, ledger, timeout, blocking=False):
    if op.__class__ is not str or sendbuf.__class__ is not np.ndarray \
            or (sendbuf.ndim != 1 and not sendbuf.flags.c_contiguous):
        return None  # (a strided 1-D buffer: mpi4py refuses it)
    ctx = known_context(comm)  # (_lean_ctx inline: the most frequent call, one call fewer)
    if ctx is None or ctx.debug or ctx.failed is not None or ctx.size == 1:
        return None
    dtype = sendbuf.dtype
    sig = ctx.plans.get(("sig", "allreduce", op, algorithm, dtype, dtype.char), False) \
        if ctx.plans_gen == generation() else False
    if sig is False:
        sig = lean_signature(ctx, "allreduce", op, algorithm, dtype)
    nbytes = sendbuf.nbytes
    if sig is None or nbytes >= sig[3] or nbytes == 0:
        return None
    e = sig[4]
    if blocking and e is not None:  # the compiled tier
        if recvbuf is None:
            recvbuf = sendbuf
        elif recvbuf.__class__ is not np.ndarray or recvbuf.size != sendbuf.size \
                or (recvbuf.ndim != 1 and not recvbuf.flags.c_contiguous):
            return None
        return run(ctx, e, AR, sendbuf, recvbuf, op, algorithm, ledger, timeout)
    return engine.post_allreduce(ctx, sig, sendbuf, recvbuf, op, ledger, timeout, blocking)


def lean_reduce_scatter(sendbuf, recvbuf, comm, op, algorithm, ledger, timeout, blocking=False):
    if op.__class__ is not str or sendbuf.__class__ is not np.ndarray or sendbuf.ndim != 1:
        return None
    ctx, sig = _lean_ctx(comm, "reduce_scatter", op, algorithm, sendbuf)
    if ctx is None:
        return None
    e = sig[4]
    if blocking and e is not None:  # the compiled tier
        if recvbuf is None:
            recvbuf = sendbuf
        elif recvbuf.__class__ is not np.ndarray or recvbuf.ndim != 1:
            return None
        return run(ctx, e, RS, sendbuf, recvbuf, op, algorithm, ledger, timeout)
    return engine.post_reduce_scatter(ctx, sig, sendbuf, recvbuf, op, ledger, timeout, blocking)


def lean_all_gather(sendbuf, recvbuf, comm, algorithm, ledger, timeout, blocking=False):
    in_place = recvbuf is None or recvbuf is sendbuf
    full = sendbuf if in_place else recvbuf
    if full.__class__ is not np.ndarray or full.ndim != 1:
        return None
    ctx, sig = _lean_ctx(comm, "all_gather", "", algorithm, full)
    if ctx is None:
        return None
    e = sig[4]
    if blocking and e is not None:  # the compiled tier
        if not in_place and (sendbuf.__class__ is not np.ndarray or sendbuf.ndim != 1):
            return None
        return run(ctx, e, AG, sendbuf, full, "", algorithm, ledger, timeout)
    return engine.post_all_gather(ctx, sig, sendbuf, recvbuf, ledger, timeout, blocking)

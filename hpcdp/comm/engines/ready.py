"""Ready calls: a repeated plain blocking call replays the plan the chooser made for it.

A blocking ``allreduce`` / ``reduce_scatter`` / ``all_gather`` spends most of its time
at small sizes in Python: the front's checks, the chooser's cached plan, a request and
its ledger record. When an engine has run such a call to completion from the chooser's
plan, it may keep a *ready call* for the call's signature (:func:`keep`): MPI's one
call from compiled code (hpcdp.comm.engines.compiled.lean's ``LeanCall``), the compiled
ring (hpcdp.comm.engines.compiled.blocking's ``Entry``). They live in one table per
communicator (``CommContext.ready_calls``: per collective, the algorithm the caller
named, then the length; the last signature seen there), emptied when the engine or the small-message tier is
set again (``CommContext.forget_ready``) and by hpcdp.comm.forget.

The front's blocking calls look here first (:func:`ready`), whatever algorithm they
name. A hit checks what can change between calls: the buffers (1-D ndarrays whose flags
say C-contiguous, aligned, writeable, of the entry's very dtype object), the op and the
algorithm the caller named, the settings' generation (a plan made under older settings
is never replayed), the context (debug mode, failed); the entry's ``run`` checks its
own arguments (the other buffer, the segment size) and makes the call. Anything else
returns None and the call takes the front's usual way. This module makes no choice: an
entry exists only where the chooser's plan for that very signature made it.

An entry (kept under the algorithm the caller named) has ``dtype``, ``op`` (the op's
name, "" for an all-gather), ``gen`` and ``run(ctx, sendbuf, recvbuf, full, in_place, ledger, timeout,
segment_bytes)``, which returns the result or None (nothing done).
"""

from __future__ import annotations

import numpy as np

from hpcdp.comm.core.context import KNOWN
from hpcdp.comm.core.settings import generation

AR, RS, AG = 0, 1, 2
NAMES = ("allreduce", "reduce_scatter", "all_gather")
WHICH = {name: i for i, name in enumerate(NAMES)}
_MAX_CALLS = 4096


def keep(ctx, which: int, algorithm: str, n: int, entry) -> None:
    """Keep ``entry`` as the ready call of collective ``which`` named with ``algorithm``
    at length ``n``."""
    calls = ctx.ready_calls[which].setdefault(algorithm, {})
    if len(calls) >= _MAX_CALLS:
        calls.clear()
    calls[n] = entry


def kept(ctx, which: int, algorithm: str, n: int):
    """The entry kept for collective ``which`` named with ``algorithm`` at length ``n``,
    or None."""
    calls = ctx.ready_calls[which].get(algorithm)
    return None if calls is None else calls.get(n)


def ready(which, sendbuf, recvbuf, comm, op, algorithm, ledger, timeout, segment_bytes):
    """A repeated plain blocking call of collective ``which`` on its ready call: the
    result, or None (module docstring). ``op``: the op's name, "" for an all-gather."""
    in_place = recvbuf is None or recvbuf is sendbuf
    full = recvbuf if which == AG and not in_place else sendbuf
    if full.__class__ is not np.ndarray or full.ndim != 1 or algorithm.__class__ is not str:
        return None
    hit = KNOWN.get(id(comm))  # (known_context inline: one call fewer)
    if hit is None or hit[0] is not comm:
        return None
    ctx = hit[1]
    calls = ctx.ready_calls[which].get(algorithm)
    if calls is None:
        return None
    r = calls.get(full.size)
    if r is None or r.dtype is not full.dtype or r.op != op or r.gen != generation() \
            or ctx.debug or ctx.failed is not None or not full.flags.carray:
        return None
    return r.run(ctx, sendbuf, recvbuf, full, in_place, ledger, timeout, segment_bytes)


__all__ = ["AR", "RS", "AG", "NAMES", "WHICH", "keep", "kept", "ready"]

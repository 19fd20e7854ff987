"""The compiled engine: the process's bound MPI and progress thread, and the ring's
launch on it.

It runs the ring (reduce-scatter, all-gather, allreduce) through
hpcdp.comm.engines.compiled: bit-for-bit the Python ring's results, ledger and timeouts.
It takes host numpy buffers of native byte order and a type compiled code handles, a
built-in op and no 16-bit wire (:func:`takes`); it is available when this MPI can be
bound (hpcdp.comm.engines.compiled.binding; else one line in the log says why, once
per process, and the chooser runs the ring on the Python engine). ``[comm] engine``
(the default, ``compiled``) or ``set_engine`` asks for it (hpcdp.comm.engines.registry).

A blocking call's ring runs in the caller's thread and keeps a ready entry for its
signature (hpcdp.comm.engines.compiled.blocking); a non-blocking one is handed to the
progress thread, which moves it while the caller computes.
"""

from __future__ import annotations

import logging

from hpcdp.comm.core.settings import invalidate
from hpcdp.comm.engines.base import Engine
from hpcdp.comm.ring import ring_arguments

_OPS = {"sum": 0, "mean": 0, "max": 1, "min": 2}
log = logging.getLogger("hpcdp.comm")


class CompiledEngine:
    """The bound MPI, the compiled functions and the progress thread of this process."""

    def __init__(self, binding):
        from hpcdp.comm.engines.compiled import kernels
        from hpcdp.comm.engines.compiled.progress import ProgressThread

        from hpcdp.comm.engines.compiled.request import CompiledRingRequest

        self.binding = binding
        self.request = CompiledRingRequest  # imported once, not per call
        self.advance = kernels.advance
        self._sleep = kernels.sleep_us
        self.progress = ProgressThread(binding.usleep)

    def sleep_us(self, us: int) -> None:
        """Sleep ``us`` microseconds in compiled code without the GIL (a stand-in for a
        nogil compute kernel in tests and benchmarks)."""
        self._sleep(self.binding.usleep, int(us))

    @staticmethod
    def op_code(op) -> int:
        return _OPS[op.name]


_STATE: dict = {"engine": None}  # this process's CompiledEngine (one progress thread)


def compiled_engine():
    """The process's CompiledEngine, or None (the reason logged once) if MPI cannot
    be bound."""
    if _STATE["engine"] is None:
        from hpcdp.comm.engines.compiled.binding import bound_or_none

        b = bound_or_none("engine", log, "hpcdp.comm: the compiled engine cannot bind this MPI "
                          "(%s); collectives run on the Python ring")
        if b is not None:
            _STATE["engine"] = CompiledEngine(b)
    return _STATE["engine"]


def forget() -> None:
    """Bind again on next use (tests: after changing what hpcdp.comm.engines.compiled.binding.load
    sees)."""
    from hpcdp.comm.engines.compiled import binding

    binding.forget()
    _STATE["engine"] = None
    invalidate()  # plans that named the compiled engine are decided again


# what compiled code takes: native byte order of these type codes, a built-in op of these names
_KINDS = frozenset("bBhHiIlLqQefd")
_COMPILED_OPS = frozenset(_OPS)


def takes(dtype, op, host, wire) -> bool:
    """Host numpy buffers (not a subclass) of native byte order and a compiled type, a
    built-in op, no 16-bit wire (its per-segment conversion is not in the compiled state
    machine)."""
    return (wire is None and host == 2 and dtype.char in _KINDS and dtype.isnative
            and (op is None or (op.builtin and op.name in _COMPILED_OPS)))


def launch(ctx, alg, plan, call, ledger, timeout, bufs, segment_bytes, max_message_bytes,
           blocking, asked):
    """The ring on the compiled engine (hpcdp.comm.engines.registry's launch). A blocking
    call runs in the caller's thread (waking the progress thread per call costs a
    context switch, and on an oversubscribed machine a time slice) and keeps a ready
    entry for its signature under ``asked``, the algorithm its caller named."""
    from hpcdp.comm.engines.compiled import blocking as ready_entries

    eng = compiled_engine()
    args = ring_arguments(ctx, plan.collective, bufs)
    req = eng.request(ctx, plan.collective, call, ledger, timeout, engine=eng,
                      segment_bytes=segment_bytes, max_message_bytes=max_message_bytes,
                      background=eng.binding.multiple and not blocking, defer=blocking,
                      **args)
    if blocking and max_message_bytes is None:
        op = args["op"]
        ready_entries.keep(ctx, plan.collective, req, "" if op is None else op.name,
                           asked, segment_bytes)
    return req


ENGINE = Engine("compiled", runs=lambda alg: alg.name == "ring", launch=launch, takes=takes,
                available=lambda: compiled_engine() is not None, progresses=True)

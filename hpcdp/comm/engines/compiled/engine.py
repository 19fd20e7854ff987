"""The engine asked for per communicator, the process's compiled engine, and the
ring's launch on the engine a plan names.

``[comm] engine`` (``HPCDP_COMM_ENGINE`` overrides it: ``compiled``, the default, or
``python``; read when a communicator's context is first used) or :func:`set_engine` per
communicator says who should run hpcdp's ring. ``compiled`` runs the ring collectives
(reduce-scatter, all-gather, allreduce) through hpcdp.comm.engines.compiled: bit-for-bit
the Python ring's results, ledger and timeouts. Which calls it takes (host numpy buffers
of native byte order, a built-in op, a dtype compiled code handles, no 16-bit wire) is
the chooser's rule (hpcdp.comm.select); everything runs on the Python ring when the MPI
library cannot be bound (hpcdp.comm.engines.compiled.binding): then one line in the log
says why, once per process.

:func:`ring_request` launches the ring on the engine the chooser's plan names; it makes
no choice of its own.
"""

from __future__ import annotations

import logging

from hpcdp.comm.core.settings import ENGINES, invalidate, settings
from hpcdp.comm.ring import RingRequest

_OPS = {"sum": 0, "mean": 0, "max": 1, "min": 2}
log = logging.getLogger("hpcdp.comm")


def default_engine() -> str:
    """``[comm] engine`` (``HPCDP_COMM_ENGINE`` overrides it)."""
    return settings().engine


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


def engine_name(ctx) -> str:
    """The engine this communicator's context asked for (``set_engine`` or the env)."""
    name = ctx.engine
    if name is None:
        name = ctx.engine = default_engine()
    return name


def set_engine(comm, name: str) -> None:
    """Run ``comm``'s ring collectives on ``name`` (``"python"`` or ``"compiled"``);
    collective: every rank must pick the same (the engines' wire traffic is the same,
    but the choice should not differ between ranks)."""
    from hpcdp.comm.core.context import get_context

    if name not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {name!r}")
    ctx = get_context(comm)
    if ctx.engine != name:  # the blocking ring's entries were kept for the compiled engine
        ctx.blocking_plans.clear()
    ctx.engine = name
    ctx.plans.clear()  # (the chooser decides again: hpcdp.comm.select)


def active_engine(comm) -> str:
    """What ``comm``'s ring collectives run on now: ``compiled`` only if asked for and
    the MPI library could be bound."""
    from hpcdp.comm.core.context import get_context

    ctx = get_context(comm)
    if engine_name(ctx) == "compiled" and compiled_engine() is not None:
        return "compiled"
    return "python"


def ring_request(ctx, name, call, ledger, timeout, *, work, src, op, phases, segment_bytes,
                 max_message_bytes=None, result=None, final_out=None, wire=None,
                 engine="python", blocking=False):
    """A ring collective on ``engine`` (the plan's: hpcdp.comm.select decides "compiled"
    only for calls compiled code takes, on a bound MPI). ``final_out`` ``(out, off,
    size)``: an out-of-place reduce-scatter's last step reduces this rank's chunk
    ``[off, off+size)`` straight into ``out`` (the rest of the chunks pass through a
    scratch). ``wire``: a 16-bit hpcdp.comm.engines.wire.Wire (the Python ring only).
    ``blocking``: the caller waits on the request at once: a compiled ring is then not
    handed to the progress thread (waking it per call costs a context switch, and on an
    oversubscribed machine a time slice)."""
    if engine == "compiled":
        eng = compiled_engine()
        return eng.request(
            ctx, name, call, ledger, timeout, work=work, src=src, op=op, phases=phases,
            engine=eng, segment_bytes=segment_bytes, max_message_bytes=max_message_bytes,
            result=result, final_out=final_out,
            background=eng.binding.multiple and not blocking, defer=blocking)
    return RingRequest(ctx, name, call, ledger, timeout, work=work, src=src, op=op,
                       phases=phases, segment_bytes=segment_bytes,
                       max_message_bytes=max_message_bytes, result=result, final_out=final_out,
                       wire=wire)

"""The engines, registered once, and the engine asked for per communicator.

An engine executes a plan's algorithm (hpcdp.comm.select.Plan): it is one module, whose
``ENGINE`` (a hpcdp.comm.engines.base.Engine) says what it is, and one entry in
:func:`_builtin` below. Its record says

- ``runs(alg) -> bool``: whether it executes the registered algorithm ``alg``
  (hpcdp.comm.algorithms.Algorithm);
- ``takes(dtype, op, host, wire) -> bool``: the calls it can execute (``host``: 2 plain
  numpy buffers, 1 numpy subclasses, 0 device arrays; ``op`` a hpcdp.comm.core.ops.Op or
  None; ``wire`` a hpcdp.comm.engines.wire.Wire or None);
- ``available() -> bool``: whether this process can run it (a compiled engine that
  cannot bind this MPI says why in the log once and answers False);
- ``launch(ctx, alg, plan, call, ledger, timeout, bufs, segment_bytes, max_message_bytes,
  blocking, asked) -> Request``: start it on checked buffers (hpcdp.comm.collectives,
  once the ranks arrived). ``bufs``, a dict the engine reads and does not change: an allreduce's ``src, work, result, op``; a
  reduce-scatter's ``src, out, in_place, result, op`` (``out`` this rank's chunk, a
  view of ``src`` in place); an all-gather's ``chunk, full, result`` (``chunk`` None in
  place: ``full`` holds this rank's chunk in position). ``blocking``: the caller waits
  on it at once; it may then keep a ready call for the signature's repeats
  (hpcdp.comm.engines.ready) under ``asked``, the algorithm the caller named;
- ``progresses``: a non-blocking call moves while the caller computes without being
  polled (DDP's overlap question, hpcdp.comm.select.overlap_algorithm);
- ``selectable``: ``[comm] engine`` and :func:`set_engine` may name it (its name is then
  also in hpcdp.config.COMM_ENGINES, which parsing a config checks without importing
  comm; tests/unit/test_comm_rules.py fails until the two agree).

The chooser (hpcdp.comm.select) picks, per call signature, the engine asked for on the
communicator when it runs the algorithm, takes the call and is available, else the
first registered one that does; the front launches the plan on it. No other module
names an engine.
"""

from __future__ import annotations

from hpcdp.comm.engines.base import Engine


_REGISTRY: dict[str, Engine] = {}


def _builtin() -> None:
    """hpcdp's engines (their modules imported on first use), in the order the chooser
    falls back through them: MPI's own collective, the Python engine, the compiled ring."""
    from hpcdp.comm.engines import mpi, python
    from hpcdp.comm.engines.compiled import engine as compiled

    for e in (mpi.ENGINE, python.ENGINE, compiled.ENGINE):
        _REGISTRY[e.name] = e


def _table() -> dict[str, Engine]:
    if not _REGISTRY:
        _builtin()
    return _REGISTRY


def register(engine: Engine) -> Engine:
    """Add ``engine`` (or replace the one of its name); the chooser decides again."""
    from hpcdp.comm.core.settings import invalidate

    _table()[engine.name] = engine
    invalidate()
    return engine


def unregister(name: str) -> None:
    """Remove a registered engine (tests that register one of their own)."""
    from hpcdp.comm.core.settings import invalidate

    _table().pop(name, None)
    invalidate()


def get(name: str) -> Engine:
    table = _table()
    if name not in table:
        raise ValueError(f"engine must be one of {tuple(table)}, got {name!r}")
    return table[name]


def registered() -> list[Engine]:
    return list(_table().values())


def selectable() -> tuple[str, ...]:
    """The engines ``[comm] engine`` and :func:`set_engine` may name."""
    return tuple(e.name for e in _table().values() if e.selectable)


# -- the engine asked for per communicator ------------------------------------------

def asked(ctx) -> str:
    """The engine ``ctx``'s communicator asked for (:func:`set_engine`, else ``[comm]
    engine``, which ``HPCDP_COMM_ENGINE`` overrides; read at its first use)."""
    name = ctx.engine
    if name is None:
        from hpcdp.comm.core.settings import settings

        name = ctx.engine = settings().engine
    return name


def set_engine(comm, name: str) -> None:
    """Run ``comm``'s schedules on ``name`` where it takes the call (one of
    :func:`selectable`; the chooser falls back to the Python engine elsewhere);
    collective: every rank must pick the same (the engines' wire traffic is the same,
    but the choice should not differ between ranks)."""
    from hpcdp.comm.core.context import get_context

    if name not in selectable():
        raise ValueError(f"engine must be one of {selectable()}, got {name!r}")
    ctx = get_context(comm)
    if ctx.engine != name:  # ready calls were kept for the plans of the old engine
        ctx.forget_ready()
    ctx.engine = name
    ctx.plans.clear()  # (the chooser decides again: hpcdp.comm.select)


def active_engine(comm) -> str:
    """The engine ``comm``'s schedules run on now: the one asked for if this process
    can run it, else "python"."""
    from hpcdp.comm.core.context import get_context

    name = asked(get_context(comm))
    return name if get(name).available() else "python"


__all__ = ["Engine", "register", "unregister", "get", "registered", "selectable", "asked",
           "set_engine", "active_engine"]

"""The chooser: which algorithm, engine and wire a collective runs.

``plan(collective, nbytes, comm=...)`` answers for a call's signature what the front
would do with it: a :class:`Plan` ``(collective, algorithm, engine, wire)``. Its inputs:
the ``[comm]`` settings (hpcdp.comm.core.settings: the algorithm per collective, the
engine, the machine profile, the crossovers), the communicator (its size, its
topology when a profile asks the cost model, the engine set on it) and the call (bytes,
dtype, op, wire, and whether the caller overlaps it with compute).

Strategies ask here (through ``hpcdp.comm.plan`` / ``hpcdp.comm.prepare``) instead of
reaching into an engine or an algorithm module:

- ``overlap=True`` is DDP's bucket question: "auto" becomes the ring when the ring runs
  on the compiled engine, whose progress thread moves it while backward computes (MPI's
  own non-blocking call, auto's choice for small buffers, moves only when polled); with
  a machine profile the cost model decides as for any call.
- :func:`prepare` builds up front (collectively, outside any step) what a plan for an
  algorithm may need: the topology's sub-communicators for the hierarchical collectives
  or for "auto" with a profile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from hpcdp.comm.algorithms import get as get_algorithm
from hpcdp.comm.auto import TABLE, choose
from hpcdp.comm.core.context import get_context
from hpcdp.comm.core.requests import MAX_MESSAGE_BYTES
from hpcdp.comm.core.settings import generation, once, settings

log = logging.getLogger("hpcdp.comm")
COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")
WIRE_ALGORITHMS = ("ring",)
"""Algorithms that carry a 16-bit wire with float32 accumulation (hpcdp.comm.engines.wire)."""
_MAX_PLANS = 4096


@dataclass(frozen=True)
class Plan:
    """What one collective runs: ``algorithm`` (a registered name, never "auto",
    hpcdp.comm.algorithms), ``engine`` (a registered engine that runs it,
    hpcdp.comm.engines.registry: "mpi" for MPI's own call, "python" or "compiled" for
    hpcdp's schedules), ``wire`` ("float32" or a 16-bit wire)."""

    collective: str
    algorithm: str
    engine: str
    wire: str = "float32"
    # (the engine's and the algorithm's records, resolved once with the plan: what the
    # front launches; not part of what a plan is)
    records: tuple = field(default=(), compare=False, repr=False)


def configured(collective: str, algorithm: str) -> str:
    """``algorithm`` as given, or for "auto" what ``[comm]`` says for ``collective``."""
    if algorithm != "auto":
        return algorithm
    return settings().algorithm(collective)


def plans_of(ctx) -> dict:
    """``ctx``'s cached decisions (``CommContext.plans``: call signature -> Plan, the
    small-message bound, the small-message path's plan per signature: lean_signature), dropped
    when the settings change (``CommContext.plans_gen`` against
    hpcdp.comm.core.settings.generation), past 4096 entries, and by hpcdp.comm.forget."""
    plans = ctx.plans
    gen = generation()
    if ctx.plans_gen != gen or len(plans) > _MAX_PLANS:
        plans.clear()
        ctx.plans_gen = gen
    return plans


def overlap_algorithm(comm, algorithm: str) -> str:
    """The algorithm for non-blocking collectives that should progress while the
    caller computes (module docstring)."""
    from hpcdp.comm.engines.registry import active_engine, get as get_engine

    algorithm = configured("allreduce", algorithm)
    if algorithm != "auto" or settings().profile:
        return algorithm
    return "ring" if get_engine(active_engine(comm)).progresses else algorithm


def wire_algorithm(wire, algorithm: str, what: str = "collective") -> str:
    """The algorithm that runs a call with ``wire`` (a hpcdp.comm.engines.wire.Wire or
    None): unchanged for no wire, the ring for "auto" or "ring"; any other is refused:
    only the ring accumulates 16-bit messages in float32 (MPI's own would sum them in 16
    bits; the recursive / hierarchical ones are not built for it)."""
    if wire is None or algorithm in WIRE_ALGORITHMS:
        return algorithm
    if algorithm == "auto":
        return "ring"
    raise ValueError(f"{what}: algorithm={algorithm!r} cannot carry a {wire.name} wire (only the ring "
                     f"accumulates 16-bit messages in float32); use algorithm='ring' or 'auto' "
                     "(which then runs the ring), or wire='float32'")


def byte_order(algo: str, algorithm: str, dtype, what: str) -> str:
    """MPI's own collectives read native byte order only: "auto" takes the ring for a
    byte-swapped dtype (NumPy adds it correctly), an explicit "native" is refused."""
    if algo != "native" or np.dtype(dtype).isnative:
        return algo
    if algorithm == "native":
        raise ValueError(f"{what}: algorithm='native' (MPI's own) needs native byte order, got "
                         f"dtype {np.dtype(dtype).str}; convert with .astype({np.dtype(dtype).name!r}) "
                         "or use algorithm='ring'")
    return "ring"


def lean_bound(ctx, collective: str, algorithm: str) -> int:
    """Byte sizes below this take MPI's own collective as one call for ``algorithm``
    ("native": up to one message; "auto": the leading "native" rows of hpcdp.comm.auto's
    table capped by the crossover, 0 with a machine profile (the cost model picks every
    auto collective) or when the size rule does not pick "native" for small buffers at
    this world size; any other algorithm: 0). Cached on ``ctx``: the small-message
    path's one test (hpcdp.comm.fast). A bound cached before the settings changed is
    dropped with them (one rank must not take MPI's collective while another follows
    the cost model)."""
    plans = plans_of(ctx)
    key = ("lean", collective, algorithm)
    bound = plans.get(key)
    if bound is not None:
        return bound
    algorithm = configured(collective, algorithm)
    if algorithm == "native":
        bound = MAX_MESSAGE_BYTES
    elif algorithm == "auto" and not settings().profile:
        bound = 0
        for below, algo in TABLE[collective]:
            if algo != "native" or below is None:
                break
            bound = below
        crossover = settings().crossover.get(collective)
        bound = min(bound, TABLE[collective][-2][0] if crossover is None else crossover)
        if bound and (choose(collective, 0, ctx.size) != "native"
                      or choose(collective, bound - 1, ctx.size) != "native"):
            bound = 0
    else:
        bound = 0
    plans[key] = bound
    return bound


# -- the small-message path's plan: MPI's one call, on the compiled or the mpi4py tier ----

# a built-in op by name: (MPI op, mean?); an all-gather has no op (the datatype alone counts)
_LEAN_OPS = {"sum": (MPI.SUM, False), "mean": (MPI.SUM, True), "max": (MPI.MAX, False),
             "min": (MPI.MIN, False)}


def lean_tier(ctx) -> str:
    """Who makes MPI's one call for ``ctx``'s small blocking calls: "compiled" (one
    compiled call, hpcdp.comm.engines.compiled.lean) when asked for (``set_lean_path``,
    else ``[comm] lean``, which ``HPCDP_COMM_LEAN`` overrides; the default) and this MPI
    can be bound (else one log line and "mpi4py"); "mpi4py" (mpi4py's call and a Python
    Test loop, hpcdp.comm.engines.mpi). Per rank: both post the same MPI call."""
    from hpcdp.comm.engines.compiled import lean

    name = ctx.lean_path
    if name is None:
        name = ctx.lean_path = settings().lean
    if name == "compiled" and lean.binding() is None:
        return "mpi4py"
    return name


def lean_signature(ctx, collective, op, algorithm, dtype):
    """The small-message path's plan for one call signature: ``(MPI datatype, MPI op,
    mean?, byte bound, compiled entry or None, raw)``, or None when the path never takes
    it (a user op, a byte-swapped or unknown dtype, an algorithm other than
    "auto"/"native", "auto" with no native rows). The entry: the compiled tier's call
    for a blocking call (:func:`lean_tier`), None for the mpi4py tier; raw: mpi4py maps
    the array's type code to the same datatype (the arrays go to MPI as they are).
    Decided once per (collective, op, algorithm, dtype, type code) and kept with the
    chooser's decisions on the context (``CommContext.plans``, key ``("sig", collective,
    op, algorithm, dtype, type code)``) until the settings change (:func:`plans_of`)."""
    from hpcdp.comm.engines.compiled import lean
    from hpcdp.comm.engines.mpi import known_type

    sigs = plans_of(ctx)
    # (the type code too: numpy's uint64 'L' and 'Q' compare equal, but they are two MPI
    # datatypes, and Open MPI 4.1's MPI_UNSIGNED_LONG max/min compare signed)
    key = ("sig", collective, op, algorithm, dtype, dtype.char)
    try:
        return sigs[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable op (a callable with state): not lean
        return None
    spec = _LEAN_OPS.get(op) if op.__class__ is str else None
    if collective == "all_gather":
        spec = _LEAN_OPS["sum"]
    T = known_type(dtype) if dtype.isnative else None  # MPI reads native byte order
    bound = lean_bound(ctx, collective, algorithm)
    hit = None
    if spec is not None and T is not None and bound != 0:
        raw = T == MPI.Datatype.fromcode(dtype.char)
        e = None
        if lean_tier(ctx) == "compiled":
            e = lean.Entry(ctx, lean.binding(), collective, T, spec[0], spec[1], dtype)
        hit = (T, spec[0], spec[1], bound, e, raw)
    sigs[key] = hit
    return hit


def decide(ctx, collective: str, algorithm: str, nbytes: int, dtype, op=None, *, wire=None,
           overlap: bool = False, host: int = 2, max_message_bytes=None,
           timeout=None) -> Plan:
    """The plan of one call on ``ctx`` (module docstring), cached per signature on the
    context. ``dtype``: a numpy dtype object; ``op``: a hpcdp.comm.core.ops.Op or None
    (all-gather); ``host``: 2 plain numpy buffers, 1 numpy subclasses (not the compiled
    ring), 0 device arrays (the Python schedules or MPI's own, no 16-bit wire). Raises
    what the call asks for that cannot run (a wire on another algorithm, MPI's own on a
    byte-swapped dtype). Collective the first time a machine profile needs the
    communicator's topology."""
    op_key = None if op is None else (op.name if op.builtin else op)
    # (the dtype object: byte order counts; the type code too: numpy's uint64 'L' and 'Q'
    # compare equal)
    key = (collective, algorithm, nbytes, dtype, dtype.char, op_key, wire, overlap, host,
           max_message_bytes)
    plans = ctx.plans
    if ctx.plans_gen != generation():
        plans = plans_of(ctx)
    try:
        hit = plans.get(key)
    except TypeError:  # an unhashable user op: decided each call
        hit, key = None, None
    if hit is not None:
        return hit
    hit = _decide(ctx, collective, algorithm, nbytes, dtype, op, wire, overlap, host,
                  max_message_bytes, timeout)
    if key is not None:
        plans_of(ctx)[key] = hit  # (dropped past its size: plans_of)
    return hit


def _decide(ctx, collective, algorithm, nbytes, dtype, op, wire, overlap, host,
            max_message_bytes, timeout) -> Plan:
    from hpcdp.comm.engines.wire import wire_format

    w = wire_format(wire, dtype, collective)
    if w is not None and not host:
        raise ValueError(f"{collective}: a {w.name} wire converts on the host; with CUDA-aware MPI "
                         "the device buffers go to MPI directly: use wire='float32' or set "
                         "HPCDP_CUDA_AWARE=0 (host staging)")
    algorithm = configured(collective, algorithm)
    if w is not None:
        algorithm = wire_algorithm(w, algorithm, collective)
    elif overlap and collective == "allreduce":
        algorithm = overlap_algorithm(ctx.parent, algorithm)
    algo = algorithm
    if algorithm == "auto" and ctx.size > 1:
        from hpcdp.comm.nodes import auto_layout

        layout = auto_layout(ctx, timeout)  # None unless a machine profile is set
        if layout is not None:  # (profile, nodes, ranks per node): the cost model decides
            from hpcdp.comm.model.cost import fastest
            algo = fastest(collective, int(nbytes), *layout)
    if algo == "auto":
        algo = choose(collective, int(nbytes), ctx.size, algorithm)
    else:
        choose(collective, int(nbytes), ctx.size, algo)  # a registered name, or its error
    algo = byte_order(algo, algorithm, dtype, collective)
    alg = get_algorithm(collective, algo)
    engine = _engine(ctx, alg, dtype, op, host, w)
    return Plan(collective, algo, engine.name, "float32" if w is None else w.name,
                (engine, alg))


def _engine(ctx, alg, dtype, op, host, w):
    """The engine that runs ``alg`` for this call (hpcdp.comm.engines.registry): the one
    asked for on ``ctx`` (``set_engine``, else ``[comm] engine``) when it runs the
    algorithm, takes the call and is available in this process, else the first
    registered one that does (MPI's own for "native", the Python engine for hpcdp's
    schedules). A 16-bit wire the engine asked for does not carry runs on the Python
    ring: one info line, once per process."""
    from hpcdp.comm.engines import registry

    first = registry.get(registry.asked(ctx))
    for e in (first, *registry.registered()):
        if e.runs(alg) and e.takes(dtype, op, host, w) and e.available():
            if w is not None and e is not first and first.runs(alg) \
                    and once(("select", "wire", first.name)):
                log.info("hpcdp.comm: the %s engine carries float32 wires only; %s-wire "
                         "collectives run on the %s engine", first.name, w.name, e.name)
            return e
    raise ValueError(f"{alg.collective}: no engine runs algorithm {alg.name!r} for this call "
                     f"(dtype {dtype}, {'host' if host else 'device'} buffers)")


def plan(collective: str, nbytes: int, *, comm, dtype="float32", op="sum", algorithm="auto",
         blocking: bool = False, wire=None, overlap: bool = False, timeout=None) -> Plan:
    """The plan of one call's signature (module docstring): what the front runs for a
    call on host buffers with these arguments. Collective the first time a machine
    profile needs the communicator's topology."""
    from hpcdp.comm.core.ops import resolve

    if collective not in COLLECTIVES:
        raise ValueError(f"plan: collective must be allreduce, reduce_scatter or all_gather, "
                         f"got {collective!r}")
    ctx = get_context(comm, timeout)
    return decide(ctx, collective, algorithm, int(nbytes), np.dtype(dtype),
                  None if collective == "all_gather" else resolve(op), wire=wire,
                  overlap=overlap, timeout=timeout)


def prepare(comm, *, algorithm: str = "auto", timeout=None) -> None:
    """Build now (collectively: every rank calls it) what plans for ``algorithm`` may
    need: the topology's sub-communicators where it may run hierarchically
    ("hierarchical", or "auto" with a machine profile, which may pick it)."""
    ctx = get_context(comm, timeout)
    if ctx.size == 1:
        return
    algorithm = algorithm if algorithm != "auto" else settings().algorithm("reduce_scatter")
    if algorithm == "hierarchical" or (algorithm == "auto" and settings().profile):
        from hpcdp.comm.hier_shard import layout
        layout(ctx, timeout)


def collective_bytes(collective: str, algorithm: str, n: int, N: int, rank: int,
                     itemsize: int) -> tuple[int, int]:
    """(sent, received) bytes of one ``collective`` (allreduce, reduce_scatter,
    all_gather) with ``algorithm`` ("auto" resolved by hpcdp.comm.auto.choose, by size):
    the formula of hpcdp.comm.model.volume the algorithm registered (hpcdp.comm.algorithms)."""
    algo = choose(collective, n * itemsize, N, algorithm)
    formula = get_algorithm(collective, algo).bytes
    if formula is None:  # e.g. hierarchical: bytes per link kind, from the node layout
        raise ValueError(f"collective_bytes: the {algo} {collective} moves bytes on two link kinds; "
                         f"use {algo}_bytes (hierarchical_bytes(n, nodes, per_node, node, local_rank, "
                         "itemsize) for the hierarchical allreduce)")
    return formula(n, N, rank, itemsize)


__all__ = ["Plan", "plan", "decide", "prepare", "lean_bound", "lean_signature", "lean_tier",
           "plans_of", "overlap_algorithm", "wire_algorithm",
           "byte_order", "configured", "collective_bytes"]

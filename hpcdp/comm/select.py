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

from dataclasses import dataclass

import numpy as np

from hpcdp.comm.algorithms import get as get_algorithm
from hpcdp.comm.auto import choose
from hpcdp.comm.core.context import get_context
from hpcdp.comm.core.settings import settings


@dataclass(frozen=True)
class Plan:
    """What one collective runs: ``algorithm`` (a registered name, never "auto"),
    ``engine`` ("mpi": MPI's own call; "compiled" or "python": who runs hpcdp's
    schedule), ``wire`` ("float32" or a 16-bit wire)."""

    collective: str
    algorithm: str
    engine: str
    wire: str = "float32"


def configured(collective: str, algorithm: str) -> str:
    """``algorithm`` as given, or for "auto" what ``[comm]`` says for ``collective``."""
    if algorithm != "auto":
        return algorithm
    return settings().algorithm(collective)


def overlap_algorithm(comm, algorithm: str) -> str:
    """The algorithm for non-blocking collectives that should progress while the
    caller computes (module docstring)."""
    from hpcdp.comm.engines.compiled.engine import active_engine

    algorithm = configured("allreduce", algorithm)
    if algorithm != "auto" or settings().profile:
        return algorithm
    return "ring" if active_engine(comm) == "compiled" else algorithm


def plan(collective: str, nbytes: int, *, comm, dtype="float32", op="sum", algorithm="auto",
         blocking: bool = False, wire=None, overlap: bool = False, timeout=None) -> Plan:
    """The plan of one call's signature (module docstring). Collective the first time a
    machine profile needs the communicator's topology."""
    from hpcdp.comm.engines.compiled.engine import active_engine
    from hpcdp.comm.engines.wire import wire_algorithm, wire_format

    if collective not in ("allreduce", "reduce_scatter", "all_gather"):
        raise ValueError(f"plan: collective must be allreduce, reduce_scatter or all_gather, "
                         f"got {collective!r}")
    ctx = get_context(comm, timeout)
    w = wire_format(wire, dtype, collective)
    algorithm = configured(collective, algorithm)
    if w is not None:
        algorithm = wire_algorithm(w, algorithm, collective)
    elif overlap and collective == "allreduce":
        algorithm = overlap_algorithm(comm, algorithm)
    algo = algorithm
    if algorithm == "auto" and ctx.size > 1:
        from hpcdp.comm.nodes import auto_layout

        layout = auto_layout(ctx, timeout)
        if layout is not None:
            from hpcdp.comm.model.cost import fastest
            algo = fastest(collective, int(nbytes), *layout)
    if algo == "auto":
        algo = choose(collective, int(nbytes), ctx.size, algorithm)
    else:
        choose(collective, int(nbytes), ctx.size, algo)  # a registered name, or its error
    if algo == "native" and not np.dtype(dtype).isnative and algorithm == "auto":
        algo = "ring"  # MPI reads native byte order only (the front does the same)
    engine = {"native": "mpi"}.get(algo, "python")
    if algo == "ring" and w is None and active_engine(comm) == "compiled":
        engine = "compiled"
    return Plan(collective, algo, engine, "float32" if w is None else w.name)


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


__all__ = ["Plan", "plan", "prepare", "overlap_algorithm", "configured", "collective_bytes"]

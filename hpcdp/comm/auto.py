"""``algorithm="auto"``: pick the algorithm per collective by message size.

Each collective has a table of ``(below_bytes, algorithm)`` rows in increasing
order; the first row whose bound exceeds the buffer's byte size wins, and the last
row (bound ``None``) takes everything larger. Small messages go to MPI's own
collective through hpcdp's lean path (hpcdp.comm.fast: one non-blocking MPI call
and a deadline poll), large ones to the pipelined ring, which moves 2(N-1)/N * S
per rank with pooled scratch (no page faults per call). The crossovers were
measured with ``hpcdp bench collectives --collective all`` on the 2-core
development VM (docs/results.md, "Collectives at MPI's speed"; docs/collectives.md
states them and why). Override one per machine with ``HPCDP_<COLLECTIVE>_CROSSOVER``
(bytes, e.g. ``HPCDP_ALLREDUCE_CROSSOVER``): it moves the bound of the row before
the ring. Every rank must see the same value: the choice depends only on the
byte size and the world size, equal on all ranks.

With a machine profile (``HPCDP_PROFILE``, see docs/scaling.md) the cost model picks
instead, for the node layout: the allreduce among ring, recursive doubling and the
hierarchical allreduce, the reduce-scatter among ring, recursive halving and the
hierarchical one, the all-gather among ring, recursive doubling, Bruck and the
hierarchical one (hpcdp.comm.collectives asks :func:`hpcdp.comm.model.cost.fastest`; this
module imports no cost model); the lean path then stays off for "auto" collectives
(:func:`native_below` is 0), so every size is the model's choice.

The algorithms themselves are registered in :mod:`hpcdp.comm.algorithms` (the names
:func:`choose` accepts come from there); if auto should pick a new one by size, give it a
row in ``TABLE`` (or a world-size rule in :func:`choose`).
"""

from __future__ import annotations

from hpcdp.comm.core.settings import generation, reload, settings


# (below this many bytes, use this algorithm); None: everything larger
TABLE = {
    "allreduce": [(8 << 20, "native"), (None, "ring")],
    "reduce_scatter": [(32 << 20, "native"), (None, "ring")],
    "all_gather": [(32 << 20, "native"), (None, "ring")],
}
CROSSOVER_BYTES = TABLE["allreduce"][0][0]  # kept for callers of the single crossover


_BOUNDS: dict = {}  # collective -> bound; the environment is read once (0.3 us a lookup)


def crossover_bytes(collective: str = "allreduce") -> int:
    """The bound below which auto does not use the ring (``[comm] <name>_crossover``,
    ``HPCDP_<NAME>_CROSSOVER`` overriding it; 0: the table's)."""
    if _BOUNDS.get("generation") != generation():
        _BOUNDS.clear()
        _NATIVE_BELOW.clear()
        _BOUNDS["generation"] = generation()
    bound = _BOUNDS.get(collective)
    if bound is None:
        bound = settings().crossover.get(collective)
        if bound is None:
            bound = TABLE[collective][-2][0]
        _BOUNDS[collective] = bound
    return bound


def forget() -> None:
    """Read the settings (hpcdp.comm.core.settings: ``[comm]`` and the environment)
    again and drop every decision cached from them, on every communicator."""
    _NAMES.clear()
    reload()


_NATIVE_BELOW: dict = {}
_NAMES: dict = {}  # collective -> the names choose() accepts


def native_below(collective: str, world_size: int) -> int:
    """Byte sizes below this go to MPI's own collective under "auto": the lean
    path's one test (hpcdp.comm.fast), cached. The leading "native" rows of the
    table, capped by the crossover; 0 if :func:`choose` does not pick "native" for
    small buffers at this world size (a world-size rule added there wins)."""
    key = (collective, world_size)
    crossover_bytes(collective)  # (drops what older settings decided)
    bound = _NATIVE_BELOW.get(key)
    if bound is None:
        bound = 0
        for below, algo in TABLE[collective]:
            if algo != "native" or below is None:
                break
            bound = below
        bound = min(bound, crossover_bytes(collective))
        if settings().profile:
            bound = 0  # the cost model picks every auto collective (hpcdp.comm.model.cost.fastest)
        if bound and (choose(collective, 0, world_size) != "native"
                      or choose(collective, bound - 1, world_size) != "native"):
            bound = 0
        _NATIVE_BELOW[key] = bound
    return bound


def choose(collective: str, nbytes: int, world_size: int, algorithm: str = "auto") -> str:
    """The algorithm ``collective`` runs for a buffer of ``nbytes`` bytes."""
    if algorithm != "auto":
        allowed = _NAMES.get(collective)
        if allowed is None:  # the registered algorithms (hpcdp.comm.algorithms), looked up once
            from hpcdp.comm.algorithms import names
            allowed = _NAMES[collective] = names(collective)
        if algorithm not in allowed:
            raise ValueError(f"{collective} algorithm must be one of {allowed}, got {algorithm!r}")
        return algorithm
    rows = TABLE[collective]
    if nbytes >= crossover_bytes(collective):
        return rows[-1][1]
    for below, algo in rows[:-1]:
        if below is None or nbytes < below:
            return algo
    return rows[-2][1]


def choose_allreduce(nbytes: int, world_size: int, algorithm: str = "auto") -> str:
    """:func:`choose` for an allreduce (without a machine profile)."""
    return choose("allreduce", nbytes, world_size, algorithm)


def choose_scatter_gather(algorithm: str = "auto", nbytes: int = 1 << 62,
                          collective: str = "reduce_scatter", world_size: int = 2) -> str:
    return choose(collective, nbytes, world_size, algorithm)

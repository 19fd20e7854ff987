"""``algorithm="auto"``: pick the algorithm per collective by message size.

Each collective has a table of ``(below_bytes, algorithm)`` rows in increasing
order; the first row whose bound exceeds the buffer's byte size wins, and the last
row (bound ``None``) takes everything larger. Small messages go to MPI's own
collective as one non-blocking MPI call and a deadline poll (the bound:
hpcdp.comm.select.lean_bound), large ones to the pipelined ring, which moves 2(N-1)/N * S
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
(hpcdp.comm.select.lean_bound is 0), so every size is the model's choice.

The algorithms themselves are registered in :mod:`hpcdp.comm.algorithms` (the names
:func:`choose` accepts come from there); if auto should pick a new one by size, give it a
row in ``TABLE`` (or a world-size rule in :func:`choose`).
"""

from __future__ import annotations

from hpcdp.comm.core.settings import reload, settings


# (below this many bytes, use this algorithm); None: everything larger
TABLE = {
    "allreduce": [(8 << 20, "native"), (None, "ring")],
    "reduce_scatter": [(32 << 20, "native"), (None, "ring")],
    "all_gather": [(32 << 20, "native"), (None, "ring")],
}
CROSSOVER_BYTES = TABLE["allreduce"][0][0]  # kept for callers of the single crossover


def crossover_bytes(collective: str = "allreduce") -> int:
    """The bound below which auto does not use the ring (``[comm] <name>_crossover``,
    ``HPCDP_<NAME>_CROSSOVER`` overriding it; 0: the table's)."""
    bound = settings().crossover.get(collective)
    return TABLE[collective][-2][0] if bound is None else bound


def forget() -> None:
    """Read the settings (hpcdp.comm.core.settings: ``[comm]`` and the environment)
    again and drop every decision cached from them, on every communicator (their
    ``CommContext.plans`` compare the settings' generation)."""
    reload()


def choose(collective: str, nbytes: int, world_size: int, algorithm: str = "auto") -> str:
    """The algorithm ``collective`` runs for a buffer of ``nbytes`` bytes."""
    if algorithm != "auto":
        from hpcdp.comm.algorithms import names  # the registered algorithms

        allowed = names(collective)
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

"""``algorithm="auto"``: pick the allreduce algorithm by message size.

Below the crossover, recursive doubling (few rounds, latency-bound); from it on,
the pipelined ring (bandwidth-optimal: 2(N-1)/N * S per rank). The crossover was
measured with ``hpcdp bench collectives`` on the 2-core development VM (see
docs/results.md, "Collectives"); override it per machine with
``HPCDP_ALLREDUCE_CROSSOVER`` (bytes). Every rank must see the same value: the
choice depends only on the byte size and the world size, both equal on all ranks.
"""

from __future__ import annotations

import os

CROSSOVER_BYTES = 256 * 1024
ALLREDUCE_ALGORITHMS = ("auto", "ring", "recursive", "native")
SCATTER_GATHER_ALGORITHMS = ("auto", "ring", "native")


def crossover_bytes() -> int:
    raw = os.environ.get("HPCDP_ALLREDUCE_CROSSOVER")
    if raw is None or raw.strip() == "":
        return CROSSOVER_BYTES
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"HPCDP_ALLREDUCE_CROSSOVER must be an integer byte count, got {raw!r}") from None


def choose_allreduce(nbytes: int, world_size: int, algorithm: str = "auto") -> str:
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"allreduce algorithm must be one of {ALLREDUCE_ALGORITHMS}, got {algorithm!r}")
    if algorithm != "auto":
        return algorithm
    return "recursive" if nbytes < crossover_bytes() else "ring"


def choose_scatter_gather(algorithm: str = "auto") -> str:
    if algorithm not in SCATTER_GATHER_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {SCATTER_GATHER_ALGORITHMS}, got {algorithm!r}")
    return "ring" if algorithm == "auto" else algorithm

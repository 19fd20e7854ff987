"""The collective algorithms, registered once.

An algorithm of a collective is one module (ring.py, recursive.py, native.py,
hierarchical.py) and one :class:`Algorithm` line in :func:`_builtin` below, which says:

- ``start(ctx, call, ledger, timeout, *, src, work, result, op, segment_bytes,
  max_message_bytes) -> Request``: launch it (hpcdp.comm.collectives calls it once the
  arguments are checked and the ranks arrived); ``None`` where collectives.py still
  launches it itself (reduce-scatter and all-gather, ring and native only). A
  reduce-scatter's start takes ``src, out, in_place, result, op`` (``out``: this rank's
  ring chunk, a view of ``src`` in place), an all-gather's ``full, result`` (``full``
  holds this rank's chunk in position), each with ``segment_bytes`` and
  ``max_message_bytes``;
- ``bytes(n, N, rank, itemsize) -> (sent, received)``: its formula of hpcdp.comm.model.volume
  (``None``: its bytes run on two link kinds, see its own formula);
- ``cost(profile, nbytes, topology, itemsize) -> Cost``: its price in hpcdp.comm.model.cost
  (``None``: the model does not price it), and ``model_picks``: whether ``"auto"`` with a
  machine profile may choose it (``"always"``, ``"multi_node"``: only on 2+ nodes of 2+
  ranks, ``"never"``).

Everything that names algorithms asks here: collectives.py launches ``start``,
auto.py checks names against :func:`names`, volume.collective_bytes counts ``bytes``,
cost.allreduce prices and picks by ``cost``. A new algorithm is its module plus one line
in :func:`_builtin` (and, for a DDP/ZeRO option, its name in
hpcdp.config_parallel.AllreduceAlgorithm, which parsing a config checks without
importing comm; tests/unit/test_comm_rules.py fails until the two agree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")


@dataclass(frozen=True)
class Algorithm:
    collective: str
    name: str
    start: Callable | None = None
    bytes: Callable | None = None
    cost: Callable | None = None
    model_picks: str = "never"


_REGISTRY: dict[str, dict[str, Algorithm]] = {}


def register(alg: Algorithm) -> Algorithm:
    if alg.collective not in COLLECTIVES:
        raise ValueError(f"register: unknown collective {alg.collective!r}; one of {COLLECTIVES}")
    if alg.name == "auto":
        raise ValueError("register: 'auto' is hpcdp.comm.auto's choice, not an algorithm")
    if alg.model_picks not in ("always", "multi_node", "never"):
        raise ValueError(f"register: model_picks {alg.model_picks!r}; always, multi_node or never")
    _table()[alg.collective][alg.name] = alg
    return alg


def unregister(collective: str, name: str) -> None:
    """Remove a registered algorithm (tests that register one of their own)."""
    _table()[collective].pop(name, None)


def _table() -> dict[str, dict[str, Algorithm]]:
    if not _REGISTRY:
        _REGISTRY.update({c: {} for c in COLLECTIVES})
        _builtin()
    return _REGISTRY


def _builtin() -> None:
    """hpcdp's own algorithms (imported on first use: the modules import the registry's users)."""
    from hpcdp.comm.model import cost as C
    from hpcdp.comm import hier_shard, hierarchical, native, ring
    from hpcdp.comm.schedules import bruck, halving, recursive
    from hpcdp.comm.model import volume as V

    for alg in (
        Algorithm("allreduce", "ring", ring.start_allreduce, V.ring_allreduce_bytes, C.ring_allreduce, "always"),
        Algorithm("allreduce", "recursive", recursive.start_allreduce, V.recursive_allreduce_bytes,
                  C.recursive_allreduce, "always"),
        Algorithm("allreduce", "native", native.start_allreduce, V.native_allreduce_bytes),
        Algorithm("allreduce", "hierarchical", hierarchical.start_allreduce, None, C.hierarchical_allreduce,
                  "multi_node"),
        Algorithm("reduce_scatter", "ring", None, V.reduce_scatter_bytes, C.reduce_scatter, "always"),
        Algorithm("reduce_scatter", "native", None, V.native_reduce_scatter_bytes),
        Algorithm("reduce_scatter", "recursive", halving.start_reduce_scatter,
                  V.halving_reduce_scatter_bytes, C.halving_reduce_scatter, "always"),
        Algorithm("reduce_scatter", "hierarchical", hier_shard.start_reduce_scatter, None,
                  C.hier_reduce_scatter, "multi_node"),
        Algorithm("all_gather", "ring", None, V.all_gather_bytes, C.all_gather, "always"),
        Algorithm("all_gather", "native", None, V.native_all_gather_bytes),
        Algorithm("all_gather", "recursive", halving.start_all_gather, V.doubling_all_gather_bytes,
                  C.doubling_all_gather, "always"),
        Algorithm("all_gather", "bruck", bruck.start_all_gather, V.bruck_all_gather_bytes,
                  C.bruck_all_gather, "always"),
        Algorithm("all_gather", "hierarchical", hier_shard.start_all_gather, None,
                  C.hier_all_gather, "multi_node"),
    ):
        _REGISTRY[alg.collective][alg.name] = alg


def names(collective: str) -> tuple[str, ...]:
    """``"auto"`` and the registered algorithms of ``collective``, in registration order."""
    return ("auto", *_table()[collective])


def get(collective: str, name: str) -> Algorithm:
    algs = _table()[collective]
    if name not in algs:
        raise ValueError(f"{collective} algorithm must be one of {names(collective)}, got {name!r}")
    return algs[name]


def registered(collective: str) -> list[Algorithm]:
    return list(_table()[collective].values())


__all__ = ["Algorithm", "register", "unregister", "names", "get", "registered", "COLLECTIVES"]

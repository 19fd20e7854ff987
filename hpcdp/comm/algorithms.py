"""The collective algorithms, registered once.

An algorithm of a collective is one module (ring.py, schedules/, hierarchical.py; MPI's
own, "native", is an engine: hpcdp.comm.engines.mpi) and one :class:`Algorithm` line in
:func:`_builtin` below, which says:

- ``start(ctx, call, ledger, timeout, *, src, work, result, op, segment_bytes,
  max_message_bytes) -> Request``: run it as Python requests (the Python engine,
  hpcdp.comm.engines.python, calls it once the arguments are checked and the ranks
  arrived); ``None`` for MPI's own ("native"), which only its engine runs. Other
  engines may run an algorithm too (the compiled engine runs the ring): the chooser
  picks the engine per call (hpcdp.comm.select, hpcdp.comm.engines.registry). A
  reduce-scatter's start takes ``src, out, in_place, result, op`` (``out``: this rank's
  ring chunk, a view of ``src`` in place), an all-gather's ``full, result`` (``full``
  holds this rank's chunk in position), each with ``segment_bytes`` and
  ``max_message_bytes``; the ring's also takes ``wire`` (the only one that carries a
  16-bit wire);
- ``bytes(n, N, rank, itemsize) -> (sent, received)``: its formula of hpcdp.comm.model.volume
  (``None``: its bytes run on two link kinds, see its own formula);
- ``cost(profile, nbytes, topology, itemsize) -> Cost``: its price in hpcdp.comm.model.cost
  (``None``: the model does not price it), and ``model_picks``: whether ``"auto"`` with a
  machine profile may choose it (``"always"``, ``"multi_node"``: only on 2+ nodes of 2+
  ranks, ``"never"``). hpcdp's own take both from the model's table
  (hpcdp.comm.model.cost.PRICES); :func:`register` hands a new one's to the model.

Everything that names algorithms asks here: the front hands the plan's record to the
plan's engine,
auto.py checks names against :func:`names`, select.collective_bytes counts ``bytes``;
the cost model prices and picks from its own table, which :func:`register` keeps in
step. A new algorithm is its module plus one line in :func:`_builtin` (its price, if
the model may pick it, one line in hpcdp.comm.model.cost.PRICES; for a DDP/ZeRO
option, its name in
hpcdp.config_parallel.AllreduceAlgorithm, which parsing a config checks without
importing comm; tests/unit/test_comm_rules.py fails until the two agree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hpcdp.comm.core.settings import invalidate
from hpcdp.comm.model import cost as C

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
    C.price(alg.collective, alg.name, alg.cost, alg.model_picks)
    invalidate()  # (cached plans hold the records they launch: decided again)
    return alg


def unregister(collective: str, name: str) -> None:
    """Remove a registered algorithm (tests that register one of their own)."""
    _table()[collective].pop(name, None)
    C.unprice(collective, name)
    invalidate()


def _table() -> dict[str, dict[str, Algorithm]]:
    if not _REGISTRY:
        _REGISTRY.update({c: {} for c in COLLECTIVES})
        _builtin()
    return _REGISTRY


def _builtin() -> None:
    """hpcdp's own algorithms (imported on first use), their prices and which ones the
    model may pick from hpcdp.comm.model.cost.PRICES."""
    from functools import partial

    from hpcdp.comm import hier_shard, hierarchical, ring
    from hpcdp.comm.model import volume as V
    from hpcdp.comm.schedules import bruck, halving, recursive

    def alg(collective, name, start, formula):
        cost, picks = C.PRICES[collective].get(name, (None, "never"))
        return Algorithm(collective, name, start, formula, cost, picks)

    for a in (
        alg("allreduce", "ring", partial(ring.start, collective="allreduce"), V.ring_allreduce_bytes),
        alg("allreduce", "recursive", recursive.start_allreduce, V.recursive_allreduce_bytes),
        alg("allreduce", "native", None, V.native_allreduce_bytes),
        alg("allreduce", "hierarchical", hierarchical.start_allreduce, None),
        alg("reduce_scatter", "ring", partial(ring.start, collective="reduce_scatter"),
            V.reduce_scatter_bytes),
        alg("reduce_scatter", "native", None, V.native_reduce_scatter_bytes),
        alg("reduce_scatter", "recursive", halving.start_reduce_scatter, V.halving_reduce_scatter_bytes),
        alg("reduce_scatter", "hierarchical", hier_shard.start_reduce_scatter, None),
        alg("all_gather", "ring", partial(ring.start, collective="all_gather"), V.all_gather_bytes),
        alg("all_gather", "native", None, V.native_all_gather_bytes),
        alg("all_gather", "recursive", halving.start_all_gather, V.doubling_all_gather_bytes),
        alg("all_gather", "bruck", bruck.start_all_gather, V.bruck_all_gather_bytes),
        alg("all_gather", "hierarchical", hier_shard.start_all_gather, None),
    ):
        _REGISTRY[a.collective][a.name] = a


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

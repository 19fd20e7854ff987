"""Strategies: how replicas stay in sync (see base.py for the seam).

``build_strategy(parallel_cfg, world)`` turns ``parallel.strategy`` into a
:class:`~hpcdp.strategies.base.Strategy`. ``"none"`` is :class:`SingleRank`; any
other name ``X`` is the module ``hpcdp.strategies.X``, imported only when asked for
(so a run without MPI strategies never imports their code). Such a module provides::

    def build(parallel_cfg, world=None, comm_cfg=None) -> Strategy

Its ``[parallel.X]`` options are plain data in :mod:`hpcdp.config_parallel`
(parsing a config imports no strategy code).
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import SingleRank, Strategy

# Modules of this package that are helpers, not strategies.
_NOT_STRATEGIES = {"base", "buckets", "codec", "engine"}


def available_strategies() -> list[str]:
    """'none' plus every module here that defines ``build`` (imports each; for messages)."""
    names = ["none"]
    for mod in pkgutil.iter_modules(__path__):
        if mod.name in _NOT_STRATEGIES or mod.name.startswith("_"):
            continue
        try:
            if hasattr(importlib.import_module(f"{__name__}.{mod.name}"), "build"):
                names.append(mod.name)
        except ImportError:
            continue
    return names


def build_strategy(parallel_cfg, world=None, comm_cfg=None) -> Strategy:
    """The strategy named by ``parallel_cfg.strategy``; a clear error if there is none."""
    name = parallel_cfg.strategy
    if name == "none":
        return SingleRank()
    module = None
    if name.isidentifier() and name not in _NOT_STRATEGIES and not name.startswith("_"):
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise  # the strategy exists but one of its imports is missing
    if module is None or not hasattr(module, "build"):
        options = ", ".join(repr(n) for n in available_strategies())
        raise ValueError(f"parallel.strategy: {name!r} is not available; choose one of {options}")
    return module.build(parallel_cfg, world, comm_cfg)


__all__ = ["Strategy", "SingleRank", "available_strategies", "build_strategy"]

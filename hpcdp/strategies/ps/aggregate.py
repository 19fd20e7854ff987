"""How a server combines the W workers' gradients of one step.

An aggregation is a callable ``agg(grads) -> array`` where ``grads`` is a list of W
1-D arrays (one per worker, in worker order, all of the server's shard length and
dtype) and the result is one array of the same shape. Built in: ``"sum"`` (default:
the loss is already scaled by ``local / global`` samples, so the sum is the gradient
of the global mean loss) and ``"mean"``. Anything else is ``"module:function"``, an
importable callable, or a callable passed from Python.

What ``"module:function"`` may name (a config file is data; importing a module runs
its code): a module of hpcdp itself, or a module installed in the environment or
found on an explicit ``PYTHONPATH``. Refused: a module that would be imported from
the current directory or the launched script's directory, which Python searches
implicitly (``python -m hpcdp.cli`` puts the current directory first on
``sys.path``, so a stray ``numpy.py`` or a planted ``evil.py`` there would run).
The check looks the top-level name up without importing anything.

:func:`probe` runs the callable once on zeros at setup, so a wrong shape is a clear
error before the first training step, not a crash (or silent broadcast) mid-run.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import numpy as np


def agg_sum(grads):
    # Left-to-right in worker order: the same order on every run, so synchronous PS
    # and k = 0 asynchronous PS produce bit-identical updates.
    out = grads[0].copy()
    for g in grads[1:]:
        out += g
    return out


def agg_mean(grads):
    out = agg_sum(grads)
    out /= len(grads)
    return out


BUILTIN = {"sum": agg_sum, "mean": agg_mean}


def resolve_aggregate(spec):
    """``"sum"`` / ``"mean"`` / ``"module:function"`` / a callable -> callable."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"parallel.ps.aggregate: {spec!r} is not an aggregation; use \"sum\", "
                         f"\"mean\" or \"module:function\"")
    if spec in BUILTIN:
        return BUILTIN[spec]
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"parallel.ps.aggregate: {spec!r} is not \"sum\", \"mean\" or "
                         f"\"module:function\" (e.g. \"mypkg.aggr:trimmed_mean\")")
    check_module_origin(module)
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"parallel.ps.aggregate: cannot import module {module!r} ({e})") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ValueError(f"parallel.ps.aggregate: {module!r} has no callable {name!r}")
    return fn


def _implicit_dirs() -> set:
    """Directories Python searches without being asked: the current directory and the
    main script's, minus any listed explicitly in PYTHONPATH."""
    dirs = {os.path.realpath(os.getcwd())}
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main:
        dirs.add(os.path.realpath(os.path.dirname(main)))
    explicit = {os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return dirs - explicit


def check_module_origin(module: str) -> None:
    """Raise ValueError if ``module``'s top-level package would come from an implicitly
    searched directory (see the module docstring). Imports nothing."""
    top = module.split(".")[0]
    if top == "hpcdp" or top in sys.builtin_module_names:
        return
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    if found is None:
        return  # the import below reports "cannot import"
    if found.origin and found.origin not in ("built-in", "frozen"):
        where = os.path.dirname(found.origin)
        if found.submodule_search_locations:  # a package: its directory's parent
            where = os.path.dirname(where)
    elif found.submodule_search_locations:   # a namespace package
        where = os.path.dirname(list(found.submodule_search_locations)[0])
    else:
        return
    if os.path.realpath(where) in _implicit_dirs():
        raise ValueError(f"parallel.ps.aggregate: module {top!r} would be imported from {where}, the "
                         "current or script directory, which Python searches implicitly; hpcdp imports "
                         "aggregations only from hpcdp, installed modules or an explicit PYTHONPATH: "
                         "install the module (pip install -e ...) or add its directory to PYTHONPATH")


def check_result(result, size: int, dtype, where: str = "aggregate"):
    """Return ``result`` as a contiguous 1-D array of ``size`` elements of ``dtype``."""
    shape = getattr(result, "shape", None)
    if shape != (size,):
        raise ValueError(f"parallel.ps.aggregate: the aggregation returned shape {shape} "
                         f"({type(result).__name__}) for {where}, but it must return one "
                         f"gradient of the inputs' shape ({size},)")
    return np.ascontiguousarray(result, dtype=dtype)


def probe(fn, num_workers: int, size: int, dtype) -> None:
    """Call ``fn`` on W zero gradients of ``size`` elements; raise if the shape is wrong."""
    grads = [np.zeros(size, dtype=dtype) for _ in range(num_workers)]
    try:
        result = fn(grads)
    except Exception as e:
        raise ValueError(f"parallel.ps.aggregate: the aggregation raised {type(e).__name__}: {e} "
                         f"when probed with {num_workers} zero gradients of shape ({size},)") from e
    check_result(result, size, dtype, where=f"{num_workers} gradients of shape ({size},)")

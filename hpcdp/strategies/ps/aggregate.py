"""How a server combines the W workers' gradients of one step.

An aggregation is a callable ``agg(grads) -> array`` where ``grads`` is a list of W
1-D arrays (one per worker, in worker order, all of the server's shard length and
dtype) and the result is one array of the same shape. Built in: ``"sum"`` (default:
the loss is already scaled by ``local / global`` samples, so the sum is the gradient
of the global mean loss) and ``"mean"``. Anything else is ``"module:function"``, an
importable callable, or a callable passed from Python.

:func:`probe` runs the callable once on zeros at setup, so a wrong shape is a clear
error before the first training step, not a crash (or silent broadcast) mid-run.
"""

from __future__ import annotations

import importlib

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
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"parallel.ps.aggregate: cannot import module {module!r} ({e})") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ValueError(f"parallel.ps.aggregate: {module!r} has no callable {name!r}")
    return fn


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

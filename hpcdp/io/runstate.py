"""What a checkpoint holds besides tensors, and how a resumed run gets it back.

Stored in ``index.h5`` (root attributes and the ``/state`` group):

- the resolved config (TOML text), hpcdp's version, the format version;
- ``step`` (optimizer steps done), the data sampler's position of the next step
  (``next_epoch``, ``next_batch``; the sampler's order depends only on
  ``data.seed`` and the epoch, so the position is all it needs), the global batch,
  the training-set size;
- the learning-rate schedule position (``step`` of ``total_steps``, the schedule and
  the last learning rate used);
- the optimizer's kind and scalars (AdamW's step count for bias correction);
- every random stream the run draws from: the data order (seed + position, above)
  and each dropout layer's draw counter (``random_streams``, in module order);
- per rank scalars of the strategy (``ranks/<key>``: optimizer step count, and for
  the parameter server each server's shard index and version).
"""

from __future__ import annotations

import numpy as np

from .errors import CheckpointError
from .format import PARAM, optim_buffer, tensor_name


def hpcdp_version() -> str:
    try:
        from importlib.metadata import version
        return version("hpcdp")
    except Exception:  # not installed (running from a source tree)
        return "unknown"


def _streams(model) -> list:
    """Modules that draw random numbers and count their draws (Dropout), in order."""
    modules = getattr(model, "modules", None)
    if modules is None:
        return []
    return [m for m in modules() if hasattr(m, "next_seed") and hasattr(m, "_calls")]


def random_streams(model) -> np.ndarray:
    return np.array([m._calls for m in _streams(model)], dtype=np.int64)


def restore_random_streams(model, counters, where: str) -> None:
    mods = _streams(model)
    counters = np.asarray(counters, dtype=np.int64).reshape(-1)
    if len(mods) != counters.shape[0]:
        raise CheckpointError(f"{where}: the checkpoint has {counters.shape[0]} random streams (dropout "
                              f"layers), this model has {len(mods)}: it is a different model")
    for m, c in zip(mods, counters.tolist()):
        m._calls = int(c)


def expected_tensors(flat, optimizer) -> dict:
    """``{logical tensor: (shape, dtype name)}`` of a model's flat layout and its
    optimizer's state, in index order (parameters, then each state buffer)."""
    dtype = np.dtype(flat.dtype).name
    out = {tensor_name(PARAM, s.name): (tuple(s.shape), dtype) for s in flat.layout}
    for name in getattr(optimizer, "names", ()):
        for s in flat.layout:
            out[tensor_name(optim_buffer(name), s.name)] = (tuple(s.shape), dtype)
    return out


def compatibility_problem(index, expected: dict, optimizer_kind: str) -> str | None:
    """Why a checkpoint cannot restore this model and optimizer, or None."""
    have = {t: (s, d) for t, s, d in zip(index.tensors, index.shapes, index.dtypes)}
    params_have = {t for t in have if t.startswith(PARAM + "/")}
    params_want = {t for t in expected if t.startswith(PARAM + "/")}
    for t in sorted(params_want - params_have):
        return f"tensor {t} of this model is not in the checkpoint: it was written for another model"
    for t in sorted(params_have - params_want):
        return f"tensor {t} is in the checkpoint but not in this model: it was written for another model"
    for t in expected:
        if t in have and tuple(have[t][0]) != tuple(expected[t][0]):
            return (f"tensor {t} has shape {tuple(have[t][0])} in the checkpoint, {tuple(expected[t][0])} in "
                    "this model: it was written for another model")
        if t in have and have[t][1] != expected[t][1]:
            return (f"tensor {t} is {have[t][1]} in the checkpoint, {expected[t][1]} in this run: set "
                    f"run.dtype = \"{have[t][1]}\" to resume it")
    opt_have = {t.rpartition("/")[0] for t in have if t.startswith("optim/")}
    opt_want = {t.rpartition("/")[0] for t in expected if t.startswith("optim/")}
    if opt_have != opt_want:
        saved = index.state.get("optimizer_kind", "?")
        return (f"the checkpoint holds optimizer state {sorted(opt_have) or 'none'} (optim.kind = {saved!r}), "
                f"this run's optimizer ({optimizer_kind!r}) keeps {sorted(opt_want) or 'none'}: set optim.kind "
                "(and optim.momentum) as in the checkpoint's config")
    return None


__all__ = ["hpcdp_version", "random_streams", "restore_random_streams", "expected_tensors",
           "compatibility_problem"]

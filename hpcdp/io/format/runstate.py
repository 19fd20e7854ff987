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
- nothing more for the random streams: the data order is a function of
  ``data.seed``, the epoch and the position (above), and every dropout mask is keyed
  by (seed, step, sample, layer) (hpcdp/nn/streams.py), so no generator state exists.
  Checkpoints written before the keyed streams carry a ``random_streams`` dataset
  (the old dropout's per-layer draw counters); it is ignored when read;
- per rank scalars of the strategy (``ranks/<key>``: optimizer step count, and for
  the parameter server each server's shard index and version).
"""

from __future__ import annotations

import numpy as np

from .names import PARAM, optim_buffer, tensor_name


def hpcdp_version() -> str:
    try:
        from importlib.metadata import version
        return version("hpcdp")
    except Exception:  # not installed (running from a source tree)
        return "unknown"


def expected_tensors(flat, optimizer) -> dict:
    """``{logical tensor: (shape, dtype name)}`` of a model's flat layout and its
    optimizer's state, in index order (parameters, then each state buffer)."""
    dtype = np.dtype(flat.dtype).name
    out = {tensor_name(PARAM, s.name): (tuple(s.shape), dtype) for s in flat.layout}
    for name in getattr(optimizer, "names", ()):
        for s in flat.layout:
            out[tensor_name(optim_buffer(name), s.name)] = (tuple(s.shape), dtype)
    return out


def compatibility_problem(index, expected: dict, optimizer_kind: str | None) -> str | None:
    """Why a checkpoint cannot restore this model and optimizer, or None.
    ``optimizer_kind`` None: the weights only (the optimizer state is not compared)."""
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
    if optimizer_kind is None:
        return None
    opt_have = {t.rpartition("/")[0] for t in have if t.startswith("optim/")}
    opt_want = {t.rpartition("/")[0] for t in expected if t.startswith("optim/")}
    if opt_have != opt_want:
        saved = index.state.get("optimizer_kind", "?")
        return (f"the checkpoint holds optimizer state {sorted(opt_have) or 'none'} (optim.kind = {saved!r}), "
                f"this run's optimizer ({optimizer_kind!r}) keeps {sorted(opt_want) or 'none'}: set optim.kind "
                "(and optim.momentum) as in the checkpoint's config")
    return None


__all__ = ["hpcdp_version", "expected_tensors", "compatibility_problem"]

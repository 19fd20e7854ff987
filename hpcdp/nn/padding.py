"""Padding for sequence data: which positions count, and how much each rank's loss weighs.

The story: pad sequences on the right; give padded positions any valid input id and
the target ``model.ignore_index`` (PyTorch's ``ignore_index``; e.g. -100, or a token
id reserved for padding). Cross-entropy then averages over the counted positions
only, with zero gradient at the others (:func:`hpcdp.autograd.functional.cross_entropy`),
and causal attention keeps real positions from seeing the padding after them.

Data parallel: the loss of a global batch is the mean over all its counted positions,
so a rank's (or micro-batch's) mean must weigh ``counted here / counted in the global
batch``, not ``samples here / samples``: ranks holding more padding count less. Every
rank knows the global batch (the sampler), so each computes both counts from the
host targets, with no communication.
"""

from __future__ import annotations

import numpy as np


def counted_targets(targets, ignore_index=None) -> int:
    """Positions of host int ``targets`` that cross-entropy counts."""
    t = np.asarray(targets)
    return int(t.size if ignore_index is None else np.count_nonzero(t != ignore_index))


def slice_weight(y_slice, y_global, ignore_index=None) -> float:
    """Weight of the mean loss over ``y_slice`` in the mean over the global batch
    ``y_global`` (samples of equal length: ``len(y_slice) / len(y_global)`` without
    ignore_index). 0 when the global batch counts nothing."""
    if ignore_index is None:
        return len(y_slice) / len(y_global)
    total = counted_targets(y_global, ignore_index)
    return counted_targets(y_slice, ignore_index) / total if total else 0.0

"""Central finite-difference gradient check (a test utility, CPU arrays).

``gradcheck(fn, tensors)`` compares the autograd gradient of
``sum(fn() * R)`` (R a fixed random projection, so every output element matters)
with ``(L(t + eps) - L(t - eps)) / (2 eps)`` for each checked element of each
tensor, and returns the worst relative error
``||analytic - numeric|| / max(||analytic||, ||numeric||)`` over the tensors.
Use float64 tensors: in float32 the differences drown in rounding.
"""

from __future__ import annotations

import numpy as np

from . import ops
from .tensor import Tensor, no_grad


def _loss(fn, proj):
    out = fn()
    return ops.sum(ops.mul(out, Tensor(proj, backend=out.backend)))


def gradcheck(fn, tensors, *, eps=1e-6, max_checks=None, seed=0):
    """``fn()`` builds the output from ``tensors`` (leaves with requires_grad whose
    ``.data`` is a float64 numpy array, e.g. parameter views); ``max_checks`` limits
    the elements checked per tensor (a random subset) to keep big models fast."""
    rng = np.random.default_rng(seed)
    with no_grad():
        shape = fn().shape
    proj = rng.standard_normal(shape)
    for t in tensors:
        if t.data.dtype != np.float64:
            raise ValueError(f"gradcheck needs float64 tensors, got {t.data.dtype}")
        if t.grad is not None:
            t.grad[...] = 0.0
    _loss(fn, proj).backward()
    worst = 0.0
    for t in tensors:
        analytic = np.zeros(t.shape) if t.grad is None else np.array(t.grad, copy=True)
        flat = t.data.reshape(-1)  # a view: perturbing it perturbs the tensor
        idx = np.arange(flat.size)
        if max_checks is not None and flat.size > max_checks:
            idx = rng.choice(flat.size, size=max_checks, replace=False)
        num = np.zeros(len(idx))
        with no_grad():
            for j, i in enumerate(idx):
                orig = flat[i]
                flat[i] = orig + eps
                lp = _loss(fn, proj).item()
                flat[i] = orig - eps
                lm = _loss(fn, proj).item()
                flat[i] = orig
                num[j] = (lp - lm) / (2 * eps)
        a = analytic.reshape(-1)[idx]
        denom = max(np.linalg.norm(a), np.linalg.norm(num), 1e-30)
        worst = max(worst, float(np.linalg.norm(a - num) / denom))
    return worst

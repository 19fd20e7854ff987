"""Fused optimizer updates on flat buffers (in place, one pass over memory).

Semantics follow PyTorch's SGD and AdamW:
- SGD: g = grad + wd * p; buf = momentum * buf + g (buf starts at 0, so the first
  step gives buf = g); g = g + momentum * buf if nesterov else buf; p -= lr * g.
- AdamW: p *= 1 - lr * wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
  p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
Hyper-parameters arrive as scalars typed like the buffers (bias corrections are
computed on the host, in float64, once per step).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda

from ._util import blocks, flat_threads

TPB = 256


@lru_cache(maxsize=None)
def _kernels(dtype):
    ONE = np.dtype(dtype).type(1)

    @cuda.jit
    def sgd(p, g, buf, n, lr, mom, wd, nesterov, use_buf):
        i = cuda.grid(1)
        while i < n:
            gi = g[i] + wd * p[i]
            if use_buf:
                b = mom * buf[i] + gi
                buf[i] = b
                if nesterov:
                    gi = gi + mom * b
                else:
                    gi = b
            p[i] -= lr * gi
            i += cuda.gridsize(1)

    @cuda.jit
    def adamw(p, g, m, v, n, lr, b1, b2, eps, decay, c1, c2):
        # c1 = 1 / (1 - b1^t), c2 = 1 / (1 - b2^t), decay = 1 - lr * wd
        i = cuda.grid(1)
        while i < n:
            gi = g[i]
            mi = b1 * m[i] + (ONE - b1) * gi
            vi = b2 * v[i] + (ONE - b2) * gi * gi
            m[i] = mi
            v[i] = vi
            p[i] = p[i] * decay - lr * (mi * c1) / (math.sqrt(vi * c2) + eps)
            i += cuda.gridsize(1)

    return sgd, adamw


def _grid(n):
    tpb = flat_threads(n, TPB)
    return min(blocks(n, tpb), 65535), tpb


def sgd(p, g, buf, lr, momentum, weight_decay, nesterov):
    T = np.dtype(p.dtype).type
    n = p.size
    if n == 0:
        return
    use_buf = buf is not None and momentum != 0
    k = _kernels(np.dtype(p.dtype).str)[0]
    k[_grid(n)](p, g, buf if use_buf else p, n, T(lr), T(momentum), T(weight_decay),
                bool(nesterov), use_buf)


def adamw(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step):
    if step < 1:
        raise ValueError(f"adamw_update: step counts from 1, got {step}")
    T = np.dtype(p.dtype).type
    n = p.size
    if n == 0:
        return
    c1 = 1.0 / (1.0 - beta1 ** step)
    c2 = 1.0 / (1.0 - beta2 ** step)
    k = _kernels(np.dtype(p.dtype).str)[1]
    k[_grid(n)](p, g, m, v, n, T(lr), T(beta1), T(beta2), T(eps), T(1.0 - lr * weight_decay),
                T(c1), T(c2))

"""Float64 NumPy references for every kernel of the cuda backend.

Plain, obviously-correct NumPy: the lab and tests/cuda compare each kernel
against these (inputs are upcast to float64 first). Semantics match
``hpcdp/backend/base.py``.
"""

from __future__ import annotations

import math

import numpy as np

GELU_C = math.sqrt(2.0 / math.pi)


def f64(*xs):
    out = tuple(np.asarray(x, dtype=np.float64) for x in xs)
    return out[0] if len(out) == 1 else out


def matmul(a, b, trans_a=False, trans_b=False):
    a, b = f64(a, b)
    if trans_a:
        a = np.swapaxes(a, -1, -2)
    if trans_b:
        b = np.swapaxes(b, -1, -2)
    return a @ b


def gelu(x):
    x = f64(x)
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))


def gelu_backward(x, gy):
    x, gy = f64(x, gy)
    t = np.tanh(GELU_C * (x + 0.044715 * x ** 3))
    du = GELU_C * (1.0 + 3 * 0.044715 * x ** 2)
    return gy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)


def softmax(x):
    x = f64(x)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def causal_softmax(x, scale):
    """softmax(x * scale) over the last axis with x[..., i, j], j > i, left out (0)."""
    x = f64(x)
    t1, t2 = x.shape[-2:]
    z = np.where(np.tril(np.ones((t1, t2), dtype=bool)), x * scale, -np.inf)
    return softmax(z)


def causal_softmax_backward(y, gy, scale):
    """The gradient of causal_softmax with respect to x, y its output (0 where masked)."""
    return scale * softmax_backward(y, gy)


def log_softmax(x):
    x = f64(x)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def softmax_backward(y, gy):
    y, gy = f64(y, gy)
    return y * (gy - (gy * y).sum(-1, keepdims=True))


def log_softmax_backward(y, gy):
    y, gy = f64(y, gy)
    return gy - np.exp(y) * gy.sum(-1, keepdims=True)


def cross_entropy(logits, targets):
    x = f64(logits).reshape(-1, np.shape(logits)[-1])
    t = np.asarray(targets).reshape(-1)
    lp = log_softmax(x)
    return -lp[np.arange(len(t)), t].mean(), np.exp(lp)


def cross_entropy_backward(probs, targets, gscale):
    p = f64(probs).reshape(-1, np.shape(probs)[-1]).copy()
    t = np.asarray(targets).reshape(-1)
    p[np.arange(len(t)), t] -= 1.0
    return (p * float(gscale) / len(t)).reshape(np.shape(probs))


def layernorm(x, w, b, eps):
    x, w, b = f64(x, w, b)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    return (x - mean) * rstd * w + b, mean[..., 0], rstd[..., 0]


def layernorm_backward(gy, x, w, eps):
    gy, x, w = f64(gy, x, w)
    _, mean, rstd = layernorm(x, w, np.zeros_like(w), eps)
    xh = (x - mean[..., None]) * rstd[..., None]
    g = gy * w
    gx = rstd[..., None] * (g - g.mean(-1, keepdims=True) - xh * (g * xh).mean(-1, keepdims=True))
    axes = tuple(range(x.ndim - 1))
    return gx, (gy * xh).sum(axes), gy.sum(axes)


def embedding_backward(gy, ids, num_embeddings):
    gy = f64(gy).reshape(-1, np.shape(gy)[-1])
    out = np.zeros((num_embeddings, gy.shape[1]))
    np.add.at(out, np.asarray(ids).reshape(-1), gy)
    return out


def sgd(p, g, buf, lr, momentum, wd, nesterov):
    p, g = f64(p, g)
    d = g + wd * p
    if momentum:
        buf = momentum * f64(buf) + d
        d = d + momentum * buf if nesterov else buf
    return p - lr * d, buf


def adamw(p, g, m, v, lr, b1, b2, eps, wd, step):
    p, g, m, v = f64(p, g, m, v)
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr * (m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps)
    return p, m, v


def rel_err(out, ref) -> float:
    """max |out - ref| / max |ref| (the scale of the result, so tiny entries do
    not blow it up); NaN anywhere (an unwritten, poisoned element) gives inf."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"shape {out.shape} != reference shape {ref.shape}")
    if not np.all(np.isfinite(out)):
        return math.inf
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-30)
    return float(np.max(np.abs(out - ref))) / scale if ref.size else 0.0

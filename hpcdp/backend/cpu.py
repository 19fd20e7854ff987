"""CPU backend: NumPy/BLAS for shapes, elementwise math and matmul; numba.njit fused
kernels (cpu_kernels.py) for GELU (float32: one pass with the kernels' own SIMD exp;
float64: around NumPy's tanh), softmax, attention's scaled causal softmax,
cross-entropy, LayerNorm (float32: its own kernels, the residual stream's gradient
added in the backward's pass), a linear layer's bias + residual add, embedding
backward and the optimizer updates.

Arrays are plain ``numpy.ndarray``. Matmul passes transposes to BLAS as flags
(``a.swapaxes(-1, -2) @ b`` is a strided view, not a copy). Unlike the contract's
minimum, ``to_numpy`` returns the array itself (no copy) on this backend.
"""

from __future__ import annotations

import ctypes
import os
import platform

import numpy as np

from . import cpu_kernels as K
from . import philox as PX
from .base import Backend


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MALLOC_TUNED = False


def tune_malloc() -> bool:
    """Keep freed activation buffers in the process heap instead of returning them
    to the OS (glibc only; once per process).

    A training step allocates and frees tens of MB of arrays of the same sizes every
    step. With glibc's defaults, arrays over its (adaptive, <= 32 MiB) mmap threshold
    are mmap'ed fresh and the heap top is trimmed after the backward frees them, so
    every step page-faults its activations back in: about 5,600 minor faults and
    ~12 ms of a 75 ms small-GPT step on the 2-core VM. Raising the mmap threshold to
    its 32 MiB maximum and the trim threshold to 256 MiB makes the next step reuse the
    same pages. Cost: the process keeps up to its peak working set (plus 256 MiB of
    free heap) mapped after a step. Skipped when the user set any MALLOC_* variable
    (their setting wins) or HPCDP_MALLOC_TUNE=0. Returns whether it applied.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return True
    if os.environ.get("HPCDP_MALLOC_TUNE", "1") == "0" or any(
            k.startswith("MALLOC_") for k in os.environ):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1
    ok = (mallopt(_M_TRIM_THRESHOLD, 256 << 20) == 1) and ok
    _MALLOC_TUNED = ok
    return ok


def _ignore_args(ignore_index):
    """(ignore, use_ignore) as the cross-entropy kernels take them."""
    return (np.int64(0), False) if ignore_index is None else (np.int64(ignore_index), True)


def _gelu_mode(mode):
    if mode not in ("tanh", "exact"):
        raise ValueError(f"gelu: mode must be 'tanh' or 'exact', got {mode!r}")
    return mode


def _f32(*arrays):
    """Every array float32 (the fused float32 kernels' inputs); float64 stays on the
    composed path, which the float64 torch-oracle tests hold to."""
    return all(a.dtype == np.float32 for a in arrays)


class CPUBackend(Backend):
    name = "cpu"

    def __init__(self):
        tune_malloc()

    # -- data movement ----------------------------------------------------
    def asarray(self, x, dtype=None):
        return np.asarray(x, dtype=dtype, order="C")

    def to_numpy(self, x):
        return np.asarray(x)

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype)

    def empty(self, shape, dtype):
        return np.empty(shape, dtype=dtype)

    def copy_(self, dst, src):
        if tuple(dst.shape) != tuple(np.shape(src)):
            raise ValueError(f"copy_: shapes {tuple(dst.shape)} and {tuple(np.shape(src))} differ")
        np.copyto(dst, src)

    def fill_(self, dst, value):
        dst.fill(value)

    def add_(self, dst, src):
        np.add(dst, src, out=dst)

    def flat_view(self, flat, offset, shape):
        n = _prod(shape)
        if offset < 0 or offset + n > flat.shape[0]:
            raise ValueError(f"flat_view: [{offset}, {offset + n}) outside buffer of {flat.shape[0]}")
        return flat[offset:offset + n].reshape(shape)

    # -- shape ------------------------------------------------------------
    def reshape(self, x, shape):
        return np.reshape(x, shape)

    def transpose(self, x, axes):
        return np.ascontiguousarray(np.transpose(x, axes))

    def getitem(self, x, index):
        return np.ascontiguousarray(x[index])

    def setitem_add(self, dst, index, src):
        dst[index] += src

    def concatenate(self, xs, axis):
        return np.concatenate(xs, axis=axis)

    def sum_to_shape(self, x, shape):
        shape = tuple(shape)
        if x.shape == shape:
            return x
        lead = x.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1)
        return np.sum(x, axis=axes).reshape(shape)

    def broadcast_to(self, x, shape):
        return np.broadcast_to(x, shape).copy()

    # -- elementwise ------------------------------------------------------
    def add(self, a, b):
        return np.add(a, b)

    def sub(self, a, b):
        return np.subtract(a, b)

    def mul(self, a, b):
        return np.multiply(a, b)

    def div(self, a, b):
        return np.divide(a, b)

    def neg(self, a):
        return np.negative(a)

    def equal(self, a, b):
        return np.equal(a, b).astype(a.dtype)

    def exp(self, a):
        return np.exp(a)

    def log(self, a):
        return np.log(a)

    def sqrt(self, a):
        return np.sqrt(a)

    def tanh(self, a):
        return np.tanh(a)

    def relu(self, a):
        return np.maximum(a, 0)

    def relu_backward(self, x, gy):
        return np.multiply(gy, x > 0)

    def _gelu_tanh(self, x):
        # x flat C-contiguous; returns tanh(s (x + c x^3)) (see cpu_kernels.gelu_inner)
        t = np.empty_like(x)
        K.gelu_inner(x, t)
        np.tanh(t, out=t)
        return t

    def gelu(self, x, mode="tanh"):
        x = np.ascontiguousarray(x)
        xf = x.reshape(-1)
        if _gelu_mode(mode) == "tanh" and x.dtype == np.float32:
            y = np.empty_like(xf)
            K.gelu_f32(xf, y)  # one pass, its own SIMD exp
            return y.reshape(x.shape)
        if mode == "exact":
            y = np.empty_like(xf)
            K.gelu_exact(xf, y)
            return y.reshape(x.shape)
        t = self._gelu_tanh(xf)
        # separate output: with out aliasing an input, LLVM's runtime overlap check
        # drops the loop to scalar code (3x slower)
        y = np.empty_like(xf)
        K.gelu_outer(xf, t, y)
        return y.reshape(x.shape)

    def gelu_backward(self, x, gy, mode="tanh"):
        x = np.ascontiguousarray(x)
        gy = np.ascontiguousarray(gy, dtype=x.dtype)
        xf = x.reshape(-1)
        gx = np.empty_like(xf)
        if _gelu_mode(mode) == "tanh" and x.dtype == np.float32:
            K.gelu_bwd_f32(xf, gy.reshape(-1), gx)
            return gx.reshape(x.shape)
        if mode == "exact":
            K.gelu_exact_bwd(xf, gy.reshape(-1), gx)
            return gx.reshape(x.shape)
        t = self._gelu_tanh(xf)
        K.gelu_bwd_t(xf, t, gy.reshape(-1), gx)
        return gx.reshape(x.shape)

    def dropout_mask(self, shape, p, *, seed, step, layer, samples):
        # float32 mask: multiplying a float64 tensor by it promotes to float64.
        batch, per = PX.check_key(shape, samples, step, layer)
        k0, k1 = PX.split_seed(seed)
        out = np.empty(batch * per, dtype=np.float32)
        u = np.uint64
        K.dropout_mask(out, np.ascontiguousarray(samples, dtype=np.uint64), per, u(step), u(layer),
                       u(k0), u(k1), u(PX.threshold(p)), np.float32(1.0 / (1.0 - p)), np.float32(0.0))
        return out.reshape(shape)

    # -- reductions -------------------------------------------------------
    def sum(self, x, axis=None, keepdims=False):
        return np.asarray(np.sum(x, axis=axis, keepdims=keepdims))

    def max(self, x, axis=None, keepdims=False):
        return np.asarray(np.max(x, axis=axis, keepdims=keepdims))

    # -- linear algebra ---------------------------------------------------
    def matmul(self, a, b, trans_a=False, trans_b=False):
        # swapaxes is a strided view; numpy hands it to BLAS as a transpose flag.
        if trans_a:
            a = a.swapaxes(-1, -2)
        if trans_b:
            b = b.swapaxes(-1, -2)
        return np.matmul(a, b)

    # -- fused kernels ----------------------------------------------------
    def _rowwise(self, kernel, *arrays):
        x = arrays[0]
        ins = [K.rows(a) for a in arrays]
        out = np.empty(ins[0].shape, dtype=x.dtype)
        kernel(*ins, out)
        return out.reshape(x.shape)

    def softmax(self, x):
        x2 = K.rows(x)
        y = np.empty(x2.shape, dtype=x.dtype)
        K.shift_rows_by_max(x2, y)
        np.exp(y, out=y)
        K.normalize_rows(y)
        return y.reshape(x.shape)

    def softmax_backward(self, y, gy):
        return self._rowwise(K.softmax_bwd_rows, y, gy.astype(y.dtype, copy=False))

    def log_softmax(self, x):
        return self._rowwise(K.log_softmax_rows, x)

    def log_softmax_backward(self, y, gy):
        return self._rowwise(K.log_softmax_bwd_rows, y, gy.astype(y.dtype, copy=False))

    def causal_mask_fill(self, x, value):
        shape = x.shape
        x3 = np.ascontiguousarray(x).reshape((-1,) + tuple(shape[-2:]))
        y = np.empty(x3.shape, dtype=x.dtype)
        K.causal_fill(x3, y.dtype.type(value), y)
        return y.reshape(shape)

    def causal_softmax(self, x, scale):
        if x.dtype != np.float32 or x.ndim < 2:
            return super().causal_softmax(x, scale)
        shape = x.shape
        x3 = np.ascontiguousarray(x).reshape((-1,) + tuple(shape[-2:]))
        y = np.empty(x3.shape, dtype=x.dtype)
        K.causal_softmax_f32(x3, np.float32(scale), y)
        return y.reshape(shape)

    def causal_softmax_backward(self, y, gy, scale):
        if y.dtype != np.float32 or y.ndim < 2:
            return super().causal_softmax_backward(y, gy, scale)
        shape = y.shape
        y3 = np.ascontiguousarray(y).reshape((-1,) + tuple(shape[-2:]))
        g3 = np.ascontiguousarray(gy, dtype=y.dtype).reshape(y3.shape)
        gx = np.empty(y3.shape, dtype=y.dtype)
        K.causal_softmax_bwd_f32(y3, g3, np.float32(scale), gx)
        return gx.reshape(shape)

    def _check_targets(self, targets, n, c, ignore_index):
        if targets.ndim != 1 or targets.shape[0] != n:
            raise ValueError(f"cross_entropy: targets shape {targets.shape} does not match "
                             f"{n} rows of logits")
        kept = targets if ignore_index is None else targets[targets != ignore_index]
        if kept.size and (kept.min() < 0 or kept.max() >= c):
            bad = kept.min() if kept.min() < 0 else kept.max()
            raise ValueError(f"cross_entropy: target {bad} is out of range: targets must be in "
                             f"[0, {c})" + ("" if ignore_index is None else f" or equal ignore_index {ignore_index}"))

    def cross_entropy(self, logits, targets, ignore_index=None):
        x = K.rows(logits)
        t = np.ascontiguousarray(targets, dtype=np.int64).reshape(-1)
        self._check_targets(t, x.shape[0], x.shape[1], ignore_index)
        probs = np.empty_like(x)
        kernel = K.cross_entropy_fwd_f32 if x.dtype == np.float32 else K.cross_entropy_fwd
        loss = kernel(x, t, probs, *_ignore_args(ignore_index))
        return np.asarray(loss, dtype=x.dtype), probs

    def cross_entropy_backward(self, probs, targets, gscale, ignore_index=None):
        t = np.ascontiguousarray(targets, dtype=np.int64).reshape(-1)
        gx = np.empty_like(probs)
        K.cross_entropy_bwd(probs, t, float(gscale), gx, *_ignore_args(ignore_index))
        return gx

    def layernorm(self, x, weight, bias, eps):
        x2 = K.rows(x)
        n = x2.shape[0]
        y = np.empty_like(x2)
        mean = np.empty(n, dtype=x.dtype)
        rstd = np.empty(n, dtype=x.dtype)
        if _f32(x2, weight, bias):
            K.layernorm_fwd_f32(x2, weight, bias, np.float32(eps), y, mean, rstd)
        else:
            K.layernorm_fwd(x2, weight, bias, float(eps), y, mean, rstd)
        return y.reshape(x.shape), mean, rstd

    def layernorm_backward(self, gy, x, weight, mean, rstd):
        return self.layernorm_backward_add(gy, x, weight, mean, rstd, None)

    def layernorm_backward_add(self, gy, x, weight, mean, rstd, gres):
        x2 = K.rows(x)
        c = x2.shape[1]
        g2 = K.rows(gy.astype(x.dtype, copy=False))
        gx = np.empty_like(x2)
        if _f32(x2, weight, mean, rstd):  # float32: one pass, the residual's add in it
            gw = np.empty(c, dtype=np.float32)
            gb = np.empty(c, dtype=np.float32)
            add = gres is not None
            r2 = K.rows(gres.astype(np.float32, copy=False)) if add else g2
            K.layernorm_bwd_f32(g2, x2, weight, mean, rstd, r2, add, gx, gw, gb)
            return gx.reshape(x.shape), gw, gb
        gw = np.zeros(c, dtype=np.float64)
        gb = np.zeros(c, dtype=np.float64)
        K.layernorm_bwd(g2, x2, weight, mean, rstd, gx, gw, gb)
        gx = gx.reshape(x.shape)
        return (gx if gres is None else np.add(gres, gx)), gw.astype(x.dtype), gb.astype(x.dtype)

    def bias_residual_add_(self, z, bias, res):
        if (bias is None or not _f32(z, bias, res) or z.shape != res.shape
                or bias.shape != z.shape[-1:] or not z.flags.c_contiguous):
            return super().bias_residual_add_(z, bias, res)
        K.bias_residual_add(K.rows(z), bias, K.rows(res))

    def embedding(self, table, ids):
        return np.take(table, ids, axis=0)

    def embedding_backward(self, gy, ids, num_embeddings):
        d = gy.shape[-1]
        out = np.zeros((num_embeddings, d), dtype=gy.dtype)
        K.embedding_bwd(K.rows(gy), np.ascontiguousarray(ids, dtype=np.int64).reshape(-1), out)
        return out

    # -- optimizer updates on flat buffers (all in place) ------------------
    def sgd_update(self, param, grad, momentum_buf, lr, momentum, weight_decay, nesterov):
        if momentum:
            if momentum_buf is None:
                raise ValueError("sgd_update: momentum != 0 needs a momentum buffer")
            K.sgd_momentum(param, grad, momentum_buf, float(lr), float(momentum),
                           float(weight_decay), bool(nesterov))
        else:
            K.sgd_plain(param, grad, float(lr), float(weight_decay))

    def adamw_update(self, param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step):
        if step < 1:
            raise ValueError(f"adamw_update: step is 1-based, got {step}")
        # scalars in the buffers' dtype: float32 state updates in float32 (as PyTorch)
        t = param.dtype.type
        b1, b2 = float(beta1), float(beta2)
        K.adamw(param, grad, m, v, t(1.0 - float(lr) * float(weight_decay)),
                t(float(lr) / (1.0 - b1 ** step)), t(b1), t(1.0 - b1), t(b2), t(1.0 - b2),
                t(1.0 / (1.0 - b2 ** step)), t(float(eps)))


__all__ = ["CPUBackend"]

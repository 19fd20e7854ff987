"""CUDABackend: every primitive of ``hpcdp/backend/base.py`` on numba device arrays.

Everything stays on the device: results are new C-contiguous device arrays,
scalars the kernels need travel as kernel arguments, and nothing in a forward,
backward or optimizer step copies to the host (``to_numpy`` and ``.item()`` are
the only sync points, and the caller asks for them). All kernels go to the
default stream, so the caching allocator can reuse a freed block at once
(stream order protects it).
"""

from __future__ import annotations

import os

import numpy as np
from numba import cuda

from .. import philox as PX
from ..base import Backend
from . import elementwise as ew
from . import embedding as emb
from . import gemm, layout, optim, reduce as red, rowwise
from ._util import (FLOAT_DTYPES, broadcast_strides, contig_strides, is_device_array,
                    normalize_axes, prod)
from .device import local_rank_from_env, pool_stats, require_gpu, select_device, simulated


def _is_scalar(x) -> bool:
    return isinstance(x, (int, float, np.number)) or (isinstance(x, np.ndarray) and x.ndim == 0)


def _sh(x):
    return tuple(x.shape)


def _flat(x):
    return x.reshape(x.size) if x.ndim != 1 else x


class CUDABackend(Backend):
    name = "cuda"

    def __init__(self, local_rank: int | None = None, poison: bool | None = None):
        require_gpu()  # the clear "device='cuda' requested but ..." error
        # poison: fill every new array with NaN (ints: -1) so an element a kernel
        # forgets to write shows up in tests. Costs one fill per allocation.
        self.poison = os.environ.get("HPCDP_CUDA_POISON", "0") == "1" if poison is None else poison
        if local_rank is not None or device_unset():
            select_device(local_rank_from_env() if local_rank is None else local_rank)

    # -- allocation --------------------------------------------------------
    def _alloc(self, shape, dtype):
        a = cuda.device_array(tuple(int(s) for s in shape), dtype=np.dtype(dtype))
        if self.poison and a.size:
            ew.fill(_flat(a), np.nan if a.dtype.kind == "f" else -1)
        return a

    def _scratch(self, shape, dtype, zero=False):
        a = self._alloc(shape, dtype)
        if zero:
            ew.fill(_flat(a), 0)
        return a

    # -- data movement -------------------------------------------------------
    def asarray(self, x, dtype=None):
        if is_device_array(x):
            if dtype is None or np.dtype(dtype) == x.dtype:
                return x
            out = self._alloc(x.shape, dtype)
            ew.unary(ew.COPY, _flat(x), _flat(out))
            return out
        arr = np.array(x, dtype=dtype, order="C", copy=None)
        return cuda.to_device(arr)

    def to_numpy(self, x):
        if is_device_array(x):
            return x.copy_to_host()
        return np.asarray(x)

    def zeros(self, shape, dtype):
        a = self._alloc(_shape(shape), dtype)
        ew.fill(_flat(a), 0)
        return a

    def empty(self, shape, dtype):
        return self._alloc(_shape(shape), dtype)

    def copy_(self, dst, src):
        if tuple(dst.shape) != tuple(np.shape(src)) and not (_is_scalar(src)):
            raise ValueError(f"copy_: shapes differ: dst {tuple(dst.shape)}, src {tuple(np.shape(src))}")
        if _is_scalar(src):
            ew.fill(_flat(dst), src)
        elif is_device_array(src):
            ew.unary(ew.COPY, _flat(src), _flat(dst))
        else:
            dst.copy_to_device(np.ascontiguousarray(src, dtype=dst.dtype))
        return dst

    def fill_(self, dst, value):
        ew.fill(_flat(dst), value)
        return dst

    def add_(self, dst, src, scale=1.0):
        """In place: dst += scale * src; src broadcastable to dst."""
        if _is_scalar(src):
            ew.binary_scalar(ew.ADD, _flat(dst), float(src) * scale, _flat(dst))
            return dst
        src = self._operand(src, dst.dtype)
        if tuple(src.shape) == tuple(dst.shape):
            ew.iadd(_flat(dst), _flat(src), scale)
            return dst
        try:
            if np.broadcast_shapes(tuple(src.shape), tuple(dst.shape)) != tuple(dst.shape):
                raise ValueError
        except ValueError:
            raise ValueError(f"add_: src of shape {tuple(src.shape)} does not broadcast to dst "
                             f"of shape {tuple(dst.shape)}") from None
        if scale != 1.0:
            src = self.mul(src, scale)
        layout.strided_copy(_flat(src), 0, broadcast_strides(src.shape, dst.shape), _flat(dst), 0,
                            contig_strides(dst.shape), dst.shape, add=True)
        return dst

    def flat_view(self, flat, offset, shape):
        shape = _shape(shape)
        n = prod(shape)
        if flat.ndim != 1:
            raise ValueError(f"flat_view: buffer must be 1-D, got shape {tuple(flat.shape)}")
        if offset < 0 or offset + n > _sh(flat)[0]:
            raise ValueError(f"flat_view: [{offset}, {offset + n}) outside buffer of {_sh(flat)[0]}")
        return flat[offset:offset + n].reshape(shape)

    def synchronize(self):
        cuda.synchronize()

    def pool_stats(self):
        return pool_stats()

    # -- shape ---------------------------------------------------------------
    def reshape(self, x, shape):
        shape = _shape(shape)
        if -1 in shape:
            known = prod(s for s in shape if s != -1)
            shape = tuple(x.size // max(known, 1) if s == -1 else s for s in shape)
        if prod(shape) != x.size:
            raise ValueError(f"cannot reshape array of shape {tuple(x.shape)} into {shape}")
        return x.reshape(shape)

    def transpose(self, x, axes):
        axes = tuple(int(a) % x.ndim for a in axes) if x.ndim else ()
        if sorted(axes) != list(range(x.ndim)):
            raise ValueError(f"transpose: axes {axes} are not a permutation of {x.ndim} dims")
        out_shape = tuple(_sh(x)[a] for a in axes)
        out = self._alloc(out_shape, x.dtype)
        src = contig_strides(x.shape)
        layout.strided_copy(_flat(x), 0, [src[a] for a in axes], _flat(out), 0,
                            contig_strides(out_shape), out_shape)
        return out

    def getitem(self, x, index):
        off, shape, strides = layout.parse_basic_index(x.shape, index)
        out = self._alloc(shape, x.dtype)
        layout.strided_copy(_flat(x), off, strides, _flat(out), 0, contig_strides(shape), shape)
        return out

    def setitem_add(self, dst, index, src):
        off, shape, strides = layout.parse_basic_index(dst.shape, index)
        src = self._operand(src, dst.dtype)
        try:
            np.broadcast_shapes(tuple(src.shape), shape)
        except ValueError:
            raise ValueError(f"setitem_add: src of shape {tuple(src.shape)} does not broadcast "
                             f"to dst[index] of shape {shape}") from None
        layout.strided_copy(_flat(src), 0, broadcast_strides(src.shape, shape), _flat(dst), off,
                            strides, shape, add=True)
        return dst

    def concatenate(self, xs, axis):
        xs = list(xs)
        if not xs:
            raise ValueError("concatenate: need at least one array")
        nd = xs[0].ndim
        axis = int(axis) % nd
        for x in xs:
            if x.ndim != nd or any(_sh(x)[d] != xs[0].shape[d] for d in range(nd) if d != axis):
                raise ValueError("concatenate: shapes " + ", ".join(str(tuple(y.shape)) for y in xs)
                                 + f" differ outside axis {axis}")
        out_shape = list(xs[0].shape)
        out_shape[axis] = sum(_sh(x)[axis] for x in xs)
        out = self._alloc(out_shape, xs[0].dtype)
        ost = contig_strides(out_shape)
        pos = 0
        for x in xs:
            layout.strided_copy(_flat(x), 0, contig_strides(x.shape), _flat(out), pos * ost[axis],
                                ost, x.shape)
            pos += _sh(x)[axis]
        return out

    def broadcast_to(self, x, shape):
        shape = _shape(shape)
        x = self._operand(x)
        try:
            if np.broadcast_shapes(tuple(x.shape), shape) != shape:
                raise ValueError
        except ValueError:
            raise ValueError(f"broadcast_to: cannot broadcast {tuple(x.shape)} to {shape}") from None
        out = self._alloc(shape, x.dtype)
        layout.strided_copy(_flat(x), 0, broadcast_strides(x.shape, shape), _flat(out), 0,
                            contig_strides(shape), shape)
        return out

    def sum_to_shape(self, x, shape):
        shape = _shape(shape)
        if tuple(x.shape) == shape:
            return x
        lead = x.ndim - len(shape)
        if lead < 0 or any(n != 1 and n != _sh(x)[lead + i] for i, n in enumerate(shape)):
            raise ValueError(f"sum_to_shape: {tuple(x.shape)} does not broadcast from {shape}")
        axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape)
                                          if n == 1 and _sh(x)[lead + i] != 1)
        return self.sum(x, axes, keepdims=True).reshape(shape) if axes else x.reshape(shape)

    # -- elementwise -----------------------------------------------------------
    def _operand(self, x, dtype=None):
        if is_device_array(x):
            return x if dtype is None or x.dtype == np.dtype(dtype) else self.asarray(x, dtype)
        return self.asarray(x, dtype)

    def _binary(self, op, rop, a, b):
        sa, sb = _is_scalar(a), _is_scalar(b)
        if sa and sb:
            raise ValueError("cuda backend: binary op of two scalars; make one a backend array")
        if sb:
            a = self._operand(a)
            out = self._alloc(a.shape, a.dtype)
            ew.binary_scalar(op, _flat(a), b, _flat(out))
            return out
        if sa:
            b = self._operand(b)
            out = self._alloc(b.shape, b.dtype)
            ew.binary_scalar(rop, _flat(b), a, _flat(out))
            return out
        a, b = self._operand(a), self._operand(b)
        if a.dtype != b.dtype:
            dt = np.result_type(a.dtype, b.dtype)
            a, b = self._operand(a, dt), self._operand(b, dt)
        try:
            shape = np.broadcast_shapes(tuple(a.shape), tuple(b.shape))
        except ValueError:
            raise ValueError(f"operands could not be broadcast together: shapes "
                             f"{tuple(a.shape)} and {tuple(b.shape)}") from None
        out = self._alloc(shape, a.dtype)
        if tuple(a.shape) == tuple(b.shape):
            ew.binary_same(op, _flat(a), _flat(b), _flat(out))
        elif tuple(a.shape) == shape and _is_suffix(b.shape, shape):
            ew.binary_trailing(op, _flat(a), _flat(b), _flat(out))
        elif tuple(b.shape) == shape and _is_suffix(a.shape, shape):
            ew.binary_trailing(op, _flat(b), _flat(a), _flat(out), b_first=True)
        else:
            ew.binary_strided(op, _flat(a), broadcast_strides(a.shape, shape), _flat(b),
                              broadcast_strides(b.shape, shape), _flat(out), shape)
        return out

    def add(self, a, b):
        return self._binary(ew.ADD, ew.ADD, a, b)

    def sub(self, a, b):
        return self._binary(ew.SUB, ew.RSUB, a, b)

    def mul(self, a, b):
        return self._binary(ew.MUL, ew.MUL, a, b)

    def div(self, a, b):
        return self._binary(ew.DIV, ew.RDIV, a, b)

    def _unary(self, op, a):
        a = self._operand(a)
        out = self._alloc(a.shape, a.dtype)
        ew.unary(op, _flat(a), _flat(out))
        return out

    def neg(self, a):
        return self._unary(ew.NEG, a)

    def equal(self, a, b):
        dt = a.dtype if is_device_array(a) else None
        out = self._binary(ew.EQ, ew.EQ, a, b)
        return out if dt is None or out.dtype == dt else self.asarray(out, dt)

    def exp(self, a):
        return self._unary(ew.EXP, a)

    def log(self, a):
        return self._unary(ew.LOG, a)

    def sqrt(self, a):
        return self._unary(ew.SQRT, a)

    def tanh(self, a):
        return self._unary(ew.TANH, a)

    def relu(self, a):
        return self._unary(ew.RELU, a)

    def gelu(self, x, mode="tanh"):
        return self._unary(ew.GELU_EXACT if _gelu_mode(mode) == "exact" else ew.GELU, x)

    def _same_shape(self, what, x, gy):
        if tuple(x.shape) != tuple(gy.shape):
            raise ValueError(f"{what}: shapes differ: {tuple(x.shape)} and {tuple(gy.shape)}")

    def relu_backward(self, x, gy):
        self._same_shape("relu_backward", x, gy)
        out = self._alloc(x.shape, gy.dtype)
        ew.binary_same(ew.RELU_BWD, _flat(x), _flat(gy), _flat(out))
        return out

    def gelu_backward(self, x, gy, mode="tanh"):
        self._same_shape("gelu_backward", x, gy)
        out = self._alloc(x.shape, gy.dtype)
        op = ew.GELU_EXACT_BWD if _gelu_mode(mode) == "exact" else ew.GELU_BWD
        ew.binary_same(op, _flat(x), _flat(gy), _flat(out))
        return out

    def dropout_mask(self, shape, p, *, seed, step, layer, samples, dtype=np.float32):
        batch, per = PX.check_key(shape, samples, step, layer)
        out = self._alloc(_shape(shape), dtype)
        if batch * per:
            ids = cuda.to_device(np.ascontiguousarray(samples, dtype=np.uint64))  # B x 8 bytes
            ew.dropout(_flat(out), p, seed, step, layer, ids, per)
        return out

    # -- reductions ------------------------------------------------------------
    def _reduce(self, op, x, axis, keepdims):
        x = self._operand(x)
        axes = normalize_axes(axis, x.ndim)
        keep_shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape))
        out_shape = keep_shape if keepdims else tuple(n for d, n in enumerate(x.shape) if d not in axes)
        out = self._alloc(out_shape, x.dtype)
        if not axes:
            ew.unary(ew.COPY, _flat(x), _flat(out))
            return out
        K = prod(_sh(x)[d] for d in axes)
        if K == 0 and op == red.MAX:
            raise ValueError(f"max of an empty axis (shape {tuple(x.shape)}, axis {axis})")
        if axes == tuple(range(axes[0], axes[-1] + 1)):
            src, outer, inner = x, prod(_sh(x)[:axes[0]]), prod(_sh(x)[axes[-1] + 1:])
        else:  # bring the reduced axes together at the end (one transpose copy)
            kept = [d for d in range(x.ndim) if d not in axes]
            src, outer, inner = self.transpose(x, kept + list(axes)), prod(_sh(x)[d] for d in kept), 1
        if K == 0:
            ew.fill(_flat(out), 0)
        else:
            red.reduce3(op, _flat(src), _flat(out), outer, K, inner, x.dtype, self._alloc)
        return out

    def sum(self, x, axis=None, keepdims=False):
        return self._reduce(red.SUM, x, axis, keepdims)

    def max(self, x, axis=None, keepdims=False):
        return self._reduce(red.MAX, x, axis, keepdims)

    # -- linear algebra ------------------------------------------------------------
    def matmul(self, a, b, trans_a=False, trans_b=False):
        a, b = self._operand(a), self._operand(b)
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(f"matmul needs operands with >= 2 dims, got shapes "
                             f"{tuple(a.shape)} and {tuple(b.shape)}")
        if a.dtype != b.dtype:
            raise ValueError(f"matmul: dtypes differ: {a.dtype} and {b.dtype}")
        m, k = (_sh(a)[-1], _sh(a)[-2]) if trans_a else (_sh(a)[-2], _sh(a)[-1])
        k2, n = (_sh(b)[-1], _sh(b)[-2]) if trans_b else (_sh(b)[-2], _sh(b)[-1])
        if k != k2:
            raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not align "
                             f"(trans_a={trans_a}, trans_b={trans_b}: inner dims {k} != {k2})")
        ab, bb = tuple(_sh(a)[:-2]), tuple(_sh(b)[:-2])
        try:
            batch = np.broadcast_shapes(ab, bb)
        except ValueError:
            raise ValueError(f"matmul: batch dims of shapes {tuple(a.shape)} and {tuple(b.shape)} "
                             "do not broadcast") from None
        out = self._alloc(batch + (m, n), a.dtype)
        if not trans_a and prod(bb) == 1 and prod(ab) > 1:
            # (..., m, k) @ (k, n): fold a's batch into M, one large GEMM
            gemm.launch(_flat(a), _flat(b), _flat(out), prod(ab) * m, n, k, False, trans_b,
                        (0, 0, 0), (0, 0, 0), (1, 1, 1))
            return out
        if len(batch) > 3:
            raise ValueError(f"matmul: at most 3 batch dims are supported, got shapes "
                             f"{tuple(a.shape)} and {tuple(b.shape)}")
        pad3 = (1,) * (3 - len(batch)) + tuple(batch)
        a_bs = [s * _sh(a)[-2] * _sh(a)[-1] for s in broadcast_strides(ab, batch)]
        b_bs = [s * _sh(b)[-2] * _sh(b)[-1] for s in broadcast_strides(bb, batch)]
        a_bs = [0] * (3 - len(a_bs)) + a_bs
        b_bs = [0] * (3 - len(b_bs)) + b_bs
        gemm.launch(_flat(a), _flat(b), _flat(out), m, n, k, trans_a, trans_b, a_bs, b_bs, pad3)
        return out

    # -- fused kernels ---------------------------------------------------------------
    def _rows(self, x):
        return prod(_sh(x)[:-1]), _sh(x)[-1]

    def _softmax(self, mode, x):
        x = self._operand(x)
        out = self._alloc(x.shape, x.dtype)
        rows, C = self._rows(x)
        rowwise.launch_rows(rowwise.kernels(x.dtype)["softmax"], rows, C, mode, _flat(x),
                            _flat(out), C)
        return out

    def softmax(self, x):
        return self._softmax(rowwise.SOFTMAX, x)

    def log_softmax(self, x):
        return self._softmax(rowwise.LOG_SOFTMAX, x)

    def _softmax_bwd(self, mode, y, gy):
        self._same_shape("softmax backward", y, gy)
        out = self._alloc(y.shape, y.dtype)
        rows, C = self._rows(y)
        rowwise.launch_rows(rowwise.kernels(y.dtype)["softmax_bwd"], rows, C, mode, _flat(y),
                            _flat(gy), _flat(out), C)
        return out

    def softmax_backward(self, y, gy):
        return self._softmax_bwd(rowwise.SOFTMAX, y, gy)

    def log_softmax_backward(self, y, gy):
        return self._softmax_bwd(rowwise.LOG_SOFTMAX, y, gy)

    def causal_mask_fill(self, x, value):
        if x.ndim < 2:
            raise ValueError(f"causal_mask_fill needs >= 2 dims, got shape {tuple(x.shape)}")
        out = self._alloc(x.shape, x.dtype)
        ew.causal_fill(_flat(x), _flat(out), _sh(x)[-2], _sh(x)[-1], value)
        return out

    def _targets(self, targets, rows, what):
        t = self._operand(targets, np.int64)
        if t.size != rows:
            raise ValueError(f"{what}: {t.size} targets for {rows} rows of logits")
        return t

    def _counted(self, t, rows, ignore_index, dtype):
        """(1,) device array: rows whose target is not ``ignore_index``, at least 1
        (so a batch with none counted divides 0 by 1). Three small kernels, no sync."""
        w = self._alloc((max(rows, 1),), dtype)
        if rows:
            rowwise.kernels(dtype)["xent_counted"][ew.grid(rows)](_flat(t), np.int64(ignore_index), w, rows)
        count = self._alloc((1,), dtype)
        red.reduce3(red.SUM, w, count, 1, rows, 1, dtype, self._alloc)
        ew.binary_scalar(ew.MAXIMUM, count, 1.0, count)
        return count

    def cross_entropy(self, logits, targets, ignore_index=None):
        logits = self._operand(logits)
        rows, C = self._rows(logits)
        t = self._targets(targets, rows, "cross_entropy")
        probs = self._alloc(logits.shape, logits.dtype)
        row_loss = self._alloc((max(rows, 1),), logits.dtype)
        use = ignore_index is not None
        rowwise.launch_rows(rowwise.kernels(logits.dtype)["xent"], rows, C, _flat(logits),
                            _flat(t), _flat(probs), row_loss, C, np.int64(ignore_index if use else 0), use)
        total = self._alloc((1,), logits.dtype)
        red.reduce3(red.SUM, row_loss, total, 1, rows, 1, logits.dtype, self._alloc)
        loss = self._alloc((), logits.dtype)
        if use:
            ew.binary_same(ew.DIV, total, self._counted(t, rows, ignore_index, logits.dtype), _flat(loss))
        else:
            ew.binary_scalar(ew.MUL, total, 1.0 / max(rows, 1), _flat(loss))
        return loss, probs

    def cross_entropy_backward(self, probs, targets, gscale, ignore_index=None):
        rows, C = self._rows(probs)
        t = self._targets(targets, rows, "cross_entropy_backward")
        use = ignore_index is not None
        gx = self._alloc(probs.shape, probs.dtype)
        if is_device_array(gscale):
            g = _flat(self._operand(gscale, probs.dtype))
        else:  # a host scalar: one tiny kernel, no host-to-device copy (no sync)
            g = self._alloc((1,), probs.dtype)
            ew.fill(g, float(np.asarray(gscale)))
        T = np.dtype(probs.dtype).type
        count = self._counted(t, rows, ignore_index, probs.dtype) if use else g  # g: unread filler
        rowwise.launch_rows(rowwise.kernels(probs.dtype)["xent_bwd"], rows, C, _flat(probs),
                            _flat(t), g, _flat(gx), C, T(1.0 / max(rows, 1)), count,
                            np.int64(ignore_index if use else 0), use)
        return gx

    def layernorm(self, x, weight, bias, eps):
        x = self._operand(x)
        rows, C = self._rows(x)
        if weight.size != C or bias.size != C:
            raise ValueError(f"layernorm: weight {tuple(weight.shape)} / bias {tuple(bias.shape)} "
                             f"must have {C} elements (last dim of x {tuple(x.shape)})")
        y = self._alloc(x.shape, x.dtype)
        mean = self._alloc(_sh(x)[:-1], x.dtype)
        rstd = self._alloc(_sh(x)[:-1], x.dtype)
        T = np.dtype(x.dtype).type
        rowwise.launch_rows(rowwise.kernels(x.dtype)["ln_fwd"], rows, C, _flat(x), _flat(weight),
                            _flat(bias), _flat(y), _flat(mean), _flat(rstd), C, T(1.0 / C), T(eps))
        return y, mean, rstd

    def layernorm_backward(self, gy, x, weight, mean, rstd):
        rows, C = self._rows(x)
        k = rowwise.kernels(x.dtype)
        gx = self._alloc(x.shape, x.dtype)
        gw = self._alloc(weight.shape, x.dtype)
        gb = self._alloc(weight.shape, x.dtype)
        T = np.dtype(x.dtype).type
        rowwise.launch_rows(k["ln_bwd_x"], rows, C, _flat(gy), _flat(x), _flat(weight),
                            _flat(mean), _flat(rstd), _flat(gx), C, T(1.0 / C))
        if rows == 0:
            ew.fill(_flat(gw), 0)
            ew.fill(_flat(gb), 0)
        else:
            rowwise.launch_cols(k["ln_bwd_wb"], C, _flat(gy), _flat(x), _flat(mean), _flat(rstd),
                                _flat(gw), _flat(gb), rows, C)
        return gx, gw, gb

    def embedding(self, table, ids):
        ids = self._operand(ids, np.int64)
        V, D = table.shape
        out = self._alloc(tuple(ids.shape) + (D,), table.dtype)
        emb.lookup(_flat(table), _flat(ids), _flat(out), D)
        return out

    def embedding_backward(self, gy, ids, num_embeddings):
        ids = self._operand(ids, np.int64)
        D = _sh(gy)[-1]
        if gy.size != ids.size * D:
            raise ValueError(f"embedding_backward: gy {tuple(gy.shape)} does not match ids "
                             f"{tuple(ids.shape)} + (dim,)")
        grad = self._alloc((num_embeddings, D), gy.dtype)
        emb.backward(_flat(gy), _flat(ids), _flat(grad), num_embeddings, D, self._scratch)
        return grad

    # -- optimizer updates -------------------------------------------------------------
    def sgd_update(self, param, grad, momentum_buf, lr, momentum, weight_decay, nesterov):
        optim.sgd(_flat(param), _flat(grad), None if momentum_buf is None else _flat(momentum_buf),
                  lr, momentum, weight_decay, nesterov)

    def adamw_update(self, param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step):
        optim.adamw(_flat(param), _flat(grad), _flat(m), _flat(v), lr, beta1, beta2, eps,
                    weight_decay, step)


def _gelu_mode(mode):
    if mode not in ("tanh", "exact"):
        raise ValueError(f"gelu: mode must be 'tanh' or 'exact', got {mode!r}")
    return mode


def _shape(shape):
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def _is_suffix(small, shape) -> bool:
    """``small`` (leading 1s stripped) equals the trailing dims of ``shape``."""
    small = list(small)
    while small and small[0] == 1:
        small.pop(0)
    return len(small) <= len(shape) and tuple(small) == tuple(shape[len(shape) - len(small):])


def device_unset() -> bool:
    from .device import _state
    return _state["device"] is None and not simulated()


__all__ = ["CUDABackend", "FLOAT_DTYPES"]

"""Differentiable tensor ops: arithmetic with broadcasting, matmul, reductions, shape
ops and elementwise math. Every op computes through ``tensor.backend`` primitives and
returns ``make_result(out, backend, parents, backward)`` where ``backward(gy)`` returns
one gradient per parent (None for parents that do not require grad; those are never
computed, e.g. no input gradient for the first layer of a network).
"""

from __future__ import annotations

import builtins
from numbers import Number

from .tensor import Tensor, make_result, op


# -- helpers -------------------------------------------------------------------
def as_tensor(x, like: Tensor) -> Tensor:
    """A constant Tensor on ``like``'s backend (Tensors pass through)."""
    if isinstance(x, Tensor):
        return x
    return Tensor(x, backend=like.backend, dtype=like.dtype)


def broadcast_shapes(op: str, a: tuple, b: tuple) -> tuple:
    """NumPy broadcasting of two shapes; ValueError naming both when impossible."""
    if a == b:
        return a
    n = builtins.max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ValueError(f"{op}: shapes {a} and {b} are not broadcastable")
    return tuple(out)


def _unbroadcast(be, g, shape):
    return g if tuple(g.shape) == shape else be.sum_to_shape(g, shape)


def _norm_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} out of range for a tensor with {ndim} dims")
        out.append(a % ndim)
    return tuple(sorted(set(out)))


# -- binary arithmetic -----------------------------------------------------------
@op
def add(a, b):
    if not isinstance(a, Tensor):
        return add(b, a)
    be = a.backend
    if isinstance(b, Number):
        return make_result(be.add(a.data, b), be, (a,), lambda gy: (gy,))
    b = as_tensor(b, a)
    sa, sb = a.shape, b.shape
    broadcast_shapes("add", sa, sb)

    def backward(gy):
        return (_unbroadcast(be, gy, sa) if a.requires_grad else None,
                _unbroadcast(be, gy, sb) if b.requires_grad else None)
    return make_result(be.add(a.data, b.data), be, (a, b), backward)


@op
def sub(a, b):
    if not isinstance(a, Tensor):  # scalar - tensor
        be = b.backend
        return make_result(be.sub(a, b.data), be, (b,), lambda gy: (be.neg(gy),))
    be = a.backend
    if isinstance(b, Number):
        return make_result(be.sub(a.data, b), be, (a,), lambda gy: (gy,))
    b = as_tensor(b, a)
    sa, sb = a.shape, b.shape
    broadcast_shapes("sub", sa, sb)

    def backward(gy):
        return (_unbroadcast(be, gy, sa) if a.requires_grad else None,
                _unbroadcast(be, be.neg(gy), sb) if b.requires_grad else None)
    return make_result(be.sub(a.data, b.data), be, (a, b), backward)


@op
def mul(a, b):
    if not isinstance(a, Tensor):
        return mul(b, a)
    be = a.backend
    if isinstance(b, Number):
        return make_result(be.mul(a.data, b), be, (a,), lambda gy: (be.mul(gy, b),))
    b = as_tensor(b, a)
    sa, sb = a.shape, b.shape
    broadcast_shapes("mul", sa, sb)

    def backward(gy):
        return (_unbroadcast(be, be.mul(gy, b.data), sa) if a.requires_grad else None,
                _unbroadcast(be, be.mul(gy, a.data), sb) if b.requires_grad else None)
    return make_result(be.mul(a.data, b.data), be, (a, b), backward)


@op
def div(a, b):
    if not isinstance(a, Tensor):  # scalar / tensor: d/db = -a / b^2 = -out / b
        be = b.backend
        out = be.div(a, b.data)
        return make_result(out, be, (b,),
                           lambda gy: (be.neg(be.div(be.mul(gy, out), b.data)),))
    be = a.backend
    if isinstance(b, Number):
        return make_result(be.div(a.data, b), be, (a,), lambda gy: (be.div(gy, b),))
    b = as_tensor(b, a)
    sa, sb = a.shape, b.shape
    broadcast_shapes("div", sa, sb)
    out = be.div(a.data, b.data)

    def backward(gy):
        ga = gb = None
        if a.requires_grad:
            ga = _unbroadcast(be, be.div(gy, b.data), sa)
        if b.requires_grad:
            gb = _unbroadcast(be, be.neg(be.div(be.mul(gy, out), b.data)), sb)
        return ga, gb
    return make_result(out, be, (a, b), backward)


@op
def neg(a):
    be = a.backend
    return make_result(be.neg(a.data), be, (a,), lambda gy: (be.neg(gy),))


# -- matmul ----------------------------------------------------------------------
@op
def matmul(a, b, trans_a=False, trans_b=False):
    """(..., m, k) @ (..., k, n) with broadcast batch dims; ``trans_*`` use the
    operand with its last two axes swapped (passed to BLAS as a flag, no copy)."""
    be = a.backend
    sa, sb = a.shape, b.shape
    if len(sa) < 2 or len(sb) < 2:
        raise ValueError(f"matmul: both operands need >= 2 dims, got shapes {sa} and {sb}")
    ka = sa[-2] if trans_a else sa[-1]
    kb = sb[-1] if trans_b else sb[-2]
    if ka != kb:
        raise ValueError(f"matmul: shapes {sa}{'^T' if trans_a else ''} and "
                         f"{sb}{'^T' if trans_b else ''} do not align ({ka} != {kb})")
    broadcast_shapes("matmul (batch dims)", sa[:-2], sb[:-2])
    out = be.matmul(a.data, b.data, trans_a, trans_b)

    def backward(gy):
        ga = gb = None
        if a.requires_grad:
            if trans_a:
                ga = be.matmul(b.data, gy, trans_b, True)
            else:
                ga = be.matmul(gy, b.data, False, not trans_b)
            ga = _unbroadcast(be, ga, sa)
        if b.requires_grad:
            if len(sb) == 2 and len(sa) > 2 and not trans_a:
                # shared 2-D weight: one big GEMM over the flattened batch
                a2 = be.reshape(a.data, (-1, sa[-1]))
                g2 = be.reshape(gy, (-1, gy.shape[-1]))
                gb = be.matmul(g2, a2, True, False) if trans_b else be.matmul(a2, g2, True, False)
            else:
                if trans_b:
                    gb = be.matmul(gy, a.data, True, trans_a)
                else:
                    gb = be.matmul(a.data, gy, not trans_a, False)
                gb = _unbroadcast(be, gb, sb)
        return ga, gb
    return make_result(out, be, (a, b), backward)


# -- reductions ------------------------------------------------------------------
def _keep_shape(shape, axes):
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


@op
def sum(x, axis=None, keepdims=False):  # noqa: A001 (mirrors numpy's name)
    be, shape = x.backend, x.shape
    axes = _norm_axes(axis, len(shape))
    kshape = _keep_shape(shape, axes)

    def backward(gy):
        return (be.broadcast_to(be.reshape(gy, kshape), shape),)
    return make_result(be.sum(x.data, axis=axes, keepdims=keepdims), be, (x,), backward)


@op
def mean(x, axis=None, keepdims=False):
    be, shape = x.backend, x.shape
    axes = _norm_axes(axis, len(shape))
    kshape = _keep_shape(shape, axes)
    n = 1
    for a in axes:
        n *= shape[a]
    inv = 1.0 / n

    def backward(gy):
        return (be.broadcast_to(be.mul(be.reshape(gy, kshape), inv), shape),)
    return make_result(be.mul(be.sum(x.data, axis=axes, keepdims=keepdims), inv),
                       be, (x,), backward)


@op
def max(x, axis=None, keepdims=False):  # noqa: A001
    """Gradient goes to the maxima, split evenly among ties."""
    be, shape = x.backend, x.shape
    axes = _norm_axes(axis, len(shape))
    kshape = _keep_shape(shape, axes)
    m = be.max(x.data, axis=axes, keepdims=True)

    def backward(gy):
        mask = be.equal(x.data, m)
        share = be.div(be.reshape(gy, kshape), be.sum(mask, axis=axes, keepdims=True))
        return (be.mul(mask, share),)
    out = m if keepdims else be.reshape(m, tuple(s for i, s in enumerate(shape) if i not in axes))
    return make_result(out, be, (x,), backward)


# -- shape ops -------------------------------------------------------------------
@op
def reshape(x, *shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    be, xs = x.backend, x.shape
    n = x.size
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        if shape.count(-1) > 1 or known == 0 or n % known:
            raise ValueError(f"reshape: cannot reshape {xs} to {shape}")
        shape = tuple(n // known if s == -1 else s for s in shape)
    total = 1
    for s in shape:
        total *= s
    if total != n:
        raise ValueError(f"reshape: cannot reshape {xs} ({n} elements) to {shape}")
    return make_result(be.reshape(x.data, shape), be, (x,), lambda gy: (be.reshape(gy, xs),))


@op
def transpose(x, *axes):
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    nd = x.ndim
    if not axes:
        axes = tuple(reversed(range(nd)))
    if sorted(a % nd for a in axes) != list(range(nd)):
        raise ValueError(f"transpose: axes {axes} are not a permutation for shape {x.shape}")
    axes = tuple(a % nd for a in axes)
    inv = tuple(sorted(range(nd), key=lambda i: axes[i]))
    be = x.backend
    return make_result(be.transpose(x.data, axes), be, (x,),
                       lambda gy: (be.transpose(gy, inv),))


def _check_basic_index(index):
    items = index if isinstance(index, tuple) else (index,)
    for it in items:
        if not (isinstance(it, (int, slice)) or it is Ellipsis or it is None):
            raise TypeError(f"getitem: only basic indexing (ints, slices, ..., None) is "
                            f"differentiable here, got {type(it).__name__}; use "
                            f"embedding() for gathers by index arrays")


@op
def getitem(x, index):
    _check_basic_index(index)
    be, shape, dtype = x.backend, x.shape, x.dtype

    def backward(gy):
        gx = be.zeros(shape, dtype)
        be.setitem_add(gx, index, gy)
        return (gx,)
    return make_result(be.getitem(x.data, index), be, (x,), backward)


@op
def concatenate(tensors, axis=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("concatenate: need at least one tensor")
    be = tensors[0].backend
    nd = tensors[0].ndim
    ax = axis % nd
    ref = tensors[0].shape
    for t in tensors[1:]:
        s = t.shape
        if len(s) != nd or any(s[i] != ref[i] for i in range(nd) if i != ax):
            raise ValueError(f"concatenate: shapes {ref} and {s} differ outside axis {axis}")
    bounds, off = [], 0
    for t in tensors:
        bounds.append((off, off + t.shape[ax]))
        off += t.shape[ax]

    def backward(gy):
        out = []
        for t, (lo, hi) in zip(tensors, bounds):
            if t.requires_grad:
                idx = (slice(None),) * ax + (slice(lo, hi),)
                out.append(be.getitem(gy, idx))
            else:
                out.append(None)
        return tuple(out)
    return make_result(be.concatenate([t.data for t in tensors], ax), be, tuple(tensors), backward)


# -- elementwise math ----------------------------------------------------------
@op
def exp(x):
    be = x.backend
    y = be.exp(x.data)
    return make_result(y, be, (x,), lambda gy: (be.mul(gy, y),))


@op
def log(x):
    be = x.backend
    return make_result(be.log(x.data), be, (x,), lambda gy: (be.div(gy, x.data),))


@op
def sqrt(x):
    be = x.backend
    y = be.sqrt(x.data)
    return make_result(y, be, (x,), lambda gy: (be.div(be.mul(gy, 0.5), y),))


@op
def tanh(x):
    be = x.backend
    y = be.tanh(x.data)
    return make_result(y, be, (x,), lambda gy: (be.mul(gy, be.sub(1.0, be.mul(y, y))),))


@op
def relu(x):
    be = x.backend
    y = be.relu(x.data)
    # y > 0 exactly where x > 0, so the output serves as the mask (x can be freed)
    return make_result(y, be, (x,), lambda gy: (be.relu_backward(y, gy),))


@op
def gelu(x, mode="tanh"):
    """GELU; ``mode`` "tanh" (the approximation) or "exact" (erf)."""
    be = x.backend
    return make_result(be.gelu(x.data, mode), be, (x,), lambda gy: (be.gelu_backward(x.data, gy, mode),))


@op
def softmax(x, axis=-1):
    _last_axis_only("softmax", axis, x.ndim)
    be = x.backend
    y = be.softmax(x.data)
    return make_result(y, be, (x,), lambda gy: (be.softmax_backward(y, gy),))


@op
def log_softmax(x, axis=-1):
    _last_axis_only("log_softmax", axis, x.ndim)
    be = x.backend
    y = be.log_softmax(x.data)
    return make_result(y, be, (x,), lambda gy: (be.log_softmax_backward(y, gy),))


def _last_axis_only(op, axis, ndim):
    if axis not in (-1, ndim - 1):
        raise ValueError(f"{op}: only the last axis is supported, got axis={axis}; "
                         f"transpose first")

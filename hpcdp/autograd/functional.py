"""Neural-network ops: fused linear(+bias, +activation), cross-entropy, LayerNorm,
embedding lookup, dropout, the causal mask and causal self-attention (composed from
the ops). Fused ops keep one graph node (one Python closure) where NumPy would need
several, which is most of the per-step overhead on small layers.
"""

from __future__ import annotations

import math

import numpy as np

from . import ops
from .tensor import Tensor, make_result, op

_ACTIVATIONS = (None, "relu", "gelu", "tanh")
GELU_MODES = ("tanh", "exact")


def _int_ids(x, be, what):
    data = x.data if isinstance(x, Tensor) else x
    if isinstance(x, Tensor) and x.requires_grad:
        raise TypeError(f"{what}: index tensor must not require grad")
    data = be.asarray(data, "int64")
    return data


@op
def linear(x, w, b=None, activation=None, gelu="tanh", residual=None):
    """act(x @ w + b) for x (..., in), w (in, out), b (out,) in one graph node.
    ``gelu``: "tanh" (the approximation, GPT-2's) or "exact" (erf), when
    ``activation == "gelu"``. ``residual`` (a tensor of the output's shape): returns
    ``residual + act(x @ w + b)``, the residual stream's add in the same node (without
    activation the bias and the residual go into the GEMM output in one pass).

    Cost: one GEMM forward; backward one GEMM per operand that needs a gradient
    (none for the input of the first layer). The bias is added in place into the
    GEMM output, and ReLU's mask is read from its output, so only the pre-activation
    of GELU is kept alive for backward.
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {_ACTIVATIONS}, got {activation!r}")
    if gelu not in GELU_MODES:
        raise ValueError(f"linear: gelu must be one of {GELU_MODES}, got {gelu!r}")
    be = x.backend
    xs, ws = x.shape, w.shape
    if len(ws) != 2 or xs[-1] != ws[0]:
        raise ValueError(f"linear: input shape {xs} does not match weight shape {ws} "
                         f"(need input (..., {ws[0] if len(ws) == 2 else '?'}))")
    if b is not None and b.shape != (ws[1],):
        raise ValueError(f"linear: bias shape {b.shape} does not match weight shape {ws}")
    nin, nout = ws
    out_shape = xs[:-1] + (nout,)
    if residual is not None and residual.shape != out_shape:
        raise ValueError(f"linear: residual shape {residual.shape} does not match the output "
                         f"shape {out_shape}")
    x2 = x.data if len(xs) == 2 else be.reshape(x.data, (-1, nin))
    z = be.matmul(x2, w.data)
    r2 = None if residual is None else be.reshape(residual.data, (-1, nout))
    if activation is None and r2 is not None:
        be.bias_residual_add_(z, None if b is None else b.data, r2)
    elif b is not None:
        be.add_(z, b.data)
    if activation is None:
        y = z
    elif activation == "relu":
        y = be.relu(z)
    elif activation == "gelu":
        y = be.gelu(z, gelu)
    else:
        y = be.tanh(z)
    out = y if activation is None or r2 is None else be.add(y, r2)  # y kept for backward

    def backward(gy):
        g = gy if len(xs) == 2 else be.reshape(gy, (-1, nout))
        if activation == "relu":
            g = be.relu_backward(y, g)
        elif activation == "gelu":
            g = be.gelu_backward(z, g, gelu)
        elif activation == "tanh":
            g = be.mul(g, be.sub(1.0, be.mul(y, y)))
        gx = gw = gb = None
        if x.requires_grad:
            gx = be.matmul(g, w.data, False, True)
            if len(xs) != 2:
                gx = be.reshape(gx, xs)
        if w.requires_grad:
            gw = be.matmul(x2, g, True, False)
        if b is not None and b.requires_grad:
            gb = be.sum(g, axis=0)
        grads = (gx, gw) if b is None else (gx, gw, gb)
        return grads if residual is None else grads + (gy,)

    parents = (x, w) if b is None else (x, w, b)
    if residual is not None:
        parents += (residual,)
    y_out = out if len(xs) == 2 else be.reshape(out, out_shape)
    return make_result(y_out, be, parents, backward)


@op
def cross_entropy(logits, targets, ignore_index=None):
    """Mean negative log-likelihood of int ``targets`` (shape logits.shape[:-1])
    under softmax(logits); fused and stable (log-sum-exp with the row max).

    ``ignore_index`` (PyTorch's): positions whose target equals it are left out; the
    mean is over the counted positions and their gradient is zero. A batch with no
    counted position has loss 0 and zero gradient (PyTorch gives NaN): a data-parallel
    rank whose slice is all padding then adds nothing, as it should.
    """
    be = logits.backend
    t = _int_ids(targets, be, "cross_entropy")
    if tuple(t.shape) != logits.shape[:-1]:
        raise ValueError(f"cross_entropy: targets shape {tuple(t.shape)} does not match "
                         f"logits shape {logits.shape} (need {logits.shape[:-1]})")
    c = logits.shape[-1]
    x2 = be.reshape(logits.data, (-1, c))
    t1 = be.reshape(t, (-1,))
    if ignore_index is not None:
        ignore_index = int(ignore_index)
    loss, probs = be.cross_entropy(x2, t1, ignore_index)
    shape = logits.shape

    def backward(gy):
        return (be.reshape(be.cross_entropy_backward(probs, t1, gy, ignore_index), shape),)
    return make_result(loss, be, (logits,), backward)


def check_ids(ids, n: int, what: str, be) -> None:
    """ValueError naming an id outside [0, n) and the vocabulary size: NumPy would
    wrap -1 to the last row and raise a bare IndexError for ids >= n, a GPU kernel
    would read out of bounds. Host ids cost a min and a max; ids already on a GPU are
    copied to the host first (a sync and B*T*8 bytes, per forward)."""
    if ids.size == 0:
        return
    host = ids if isinstance(ids, np.ndarray) else be.to_numpy(ids)
    lo, hi = int(host.min()), int(host.max())
    if lo < 0 or hi >= n:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{what}: token id {bad} is out of range for vocabulary size {n}; "
                         f"ids must be in [0, {n})")


@op
def layer_norm(x, weight, bias, eps=1e-5):
    be = x.backend
    c = x.shape[-1]
    if weight.shape != (c,) or bias.shape != (c,):
        raise ValueError(f"layer_norm: input shape {x.shape} needs weight and bias of "
                         f"shape ({c},), got {weight.shape} and {bias.shape}")
    y, mean, rstd = be.layernorm(x.data, weight.data, bias.data, eps)

    def backward(gy, pending=None):
        # pending: x's gradient from its other uses so far (the residual stream in a
        # pre-LN block), added by the backend in the backward's own pass
        return be.layernorm_backward_add(gy, x.data, weight.data, mean, rstd, pending)
    backward.accumulates = 0
    return make_result(y, be, (x, weight, bias), backward)


@op
def embedding(table, ids, what="embedding", check=True):
    """table[ids] for int ids of any shape; the gradient accumulates repeated ids
    deterministically (dense (V, D) gradient, no atomics). An id outside
    [0, rows) is a ValueError naming it and the table size (``what`` names the table;
    ``check=False`` skips the check for ids the caller made itself)."""
    be = table.backend
    v = table.shape[0]
    raw = ids.data if isinstance(ids, Tensor) else ids
    idx = _int_ids(ids, be, "embedding")
    if check:  # host ids: checked before any copy
        check_ids(raw if isinstance(raw, np.ndarray) else idx, v, what, be)

    def backward(gy):
        return (be.embedding_backward(gy, idx, v),)
    return make_result(be.embedding(table.data, idx), be, (table,), backward)


@op
def dropout(x, p, key, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p).

    ``key``: the random stream, a mapping with ``seed``, ``step``, ``layer`` and
    ``samples`` (the global index of each sample along axis 0 of ``x``; see
    :class:`hpcdp.nn.streams.RandomStreams`). The mask is a pure function of the
    key and the element index, so it is the same on any rank and backend."""
    if not training or p == 0.0:
        return x
    be = x.backend
    mask = be.dropout_mask(x.shape, p, seed=key["seed"], step=key["step"], layer=key["layer"],
                           samples=key["samples"])
    return make_result(be.mul(x.data, mask), be, (x,), lambda gy: (be.mul(gy, mask),))


@op
def causal_mask_fill(x, value=float("-inf")):
    """x[..., i, j] = value for j > i; the gradient there is zero."""
    be = x.backend
    return make_result(be.causal_mask_fill(x.data, value), be, (x,),
                       lambda gy: (be.causal_mask_fill(gy, 0.0),))


def _attention(be, q, k, v, scale, dropout_p, key, training):
    """Forward on arrays (..., T, d): (out, backward(go) -> (gq, gk, gv)).

    The scale, causal mask and softmax are one backend call (a fused kernel on the
    CPU); the probabilities are the only (T, T) array kept for backward."""
    p = be.causal_softmax(be.matmul(q, k, False, True), scale)
    mask = None
    if training and dropout_p:
        mask = be.dropout_mask(p.shape, dropout_p, seed=key["seed"], step=key["step"],
                               layer=key["layer"], samples=key["samples"])
    pd = p if mask is None else be.mul(p, mask)

    def backward(go):
        gpd = be.matmul(go, v, False, True)
        gv = be.matmul(pd, go, True, False)
        gs = be.causal_softmax_backward(p, gpd if mask is None else be.mul(gpd, mask), scale)
        return be.matmul(gs, k), be.matmul(gs, q, True, False), gv
    return be.matmul(pd, v), backward


@op
def causal_self_attention(q, k, v, dropout_p=0.0, key=None, training=True):
    """softmax(q k^T / sqrt(d) masked causally) v over (B, H, T, d) tensors;
    ``key``: the attention dropout's random stream (see :func:`dropout`). One graph
    node: the scaled causal softmax is one backend call."""
    if not (q.shape == k.shape == v.shape) or q.ndim != 4:
        raise ValueError(f"causal_self_attention: q, k, v must share one (B, H, T, d) "
                         f"shape, got {q.shape}, {k.shape}, {v.shape}")
    be = q.backend
    out, bwd = _attention(be, q.data, k.data, v.data, 1.0 / math.sqrt(q.shape[-1]),
                          dropout_p, key, training)

    def backward(go):
        gq, gk, gv = bwd(go)
        return (gq if q.requires_grad else None, gk if k.requires_grad else None,
                gv if v.requires_grad else None)
    return make_result(out, be, (q, k, v), backward)


@op
def causal_self_attention_qkv(qkv, n_head, dropout_p=0.0, key=None, training=True):
    """Multi-head causal self-attention straight from the QKV projection: ``qkv``
    (B, T, 3C) laid out [q | k | v], each C = n_head * d wide, to (B, T, C) with the
    heads merged, as :func:`causal_self_attention` on the split heads followed by the
    merge, in one graph node. The heads are split by one copy to (3, B, H, T, d) and
    q, k, v are views of it; backward writes the three gradients into one buffer
    and copies it back to (B, T, 3C) once (no per-slice zero arrays and sums)."""
    if qkv.ndim != 3 or qkv.shape[-1] % (3 * n_head):
        raise ValueError(f"causal_self_attention_qkv: qkv must be (B, T, 3C) with C divisible "
                         f"by n_head = {n_head}, got shape {qkv.shape}")
    be = qkv.backend
    b, t, c3 = qkv.shape
    c = c3 // 3
    d = c // n_head
    heads = be.transpose(be.reshape(qkv.data, (b, t, 3, n_head, d)), (2, 0, 3, 1, 4))
    q, k, v = (be.getitem(heads, i) for i in range(3))
    out, bwd = _attention(be, q, k, v, 1.0 / math.sqrt(d), dropout_p, key, training)
    y = be.reshape(be.transpose(out, (0, 2, 1, 3)), (b, t, c))

    def backward(gy):
        go = be.transpose(be.reshape(gy, (b, t, n_head, d)), (0, 2, 1, 3))
        g3 = be.concatenate([be.reshape(g, (1, b, n_head, t, d)) for g in bwd(go)], 0)
        return (be.reshape(be.transpose(g3, (1, 3, 0, 2, 4)), (b, t, c3)),)
    return make_result(y, be, (qkv,), backward)

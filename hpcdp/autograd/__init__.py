"""Reverse-mode autograd over backend arrays (see tensor.py for how backward runs).

Ops are plain functions (``ops``, ``functional``); the Python operators and a few
methods on :class:`Tensor` are wired to them here.
"""

from __future__ import annotations

from . import functional, ops
from .functional import (causal_mask_fill, causal_self_attention, causal_self_attention_qkv,
                         cross_entropy, dropout, embedding, layer_norm, linear)
from .ops import (add, concatenate, div, exp, gelu, getitem, log, log_softmax, matmul, mean,
                  mul, neg, relu, reshape, softmax, sqrt, sub, tanh, transpose)
from .tensor import Parameter, Tensor, is_grad_enabled, no_grad


def _wire_tensor_methods():
    T = Tensor
    T.__add__ = lambda a, b: ops.add(a, b)
    T.__radd__ = lambda a, b: ops.add(a, b)
    T.__sub__ = lambda a, b: ops.sub(a, b)
    T.__rsub__ = lambda a, b: ops.sub(b, a)
    T.__mul__ = lambda a, b: ops.mul(a, b)
    T.__rmul__ = lambda a, b: ops.mul(a, b)
    T.__truediv__ = lambda a, b: ops.div(a, b)
    T.__rtruediv__ = lambda a, b: ops.div(b, a)
    T.__neg__ = lambda a: ops.neg(a)
    T.__matmul__ = lambda a, b: ops.matmul(a, b)
    T.__getitem__ = lambda a, idx: ops.getitem(a, idx)
    T.sum = lambda a, axis=None, keepdims=False: ops.sum(a, axis, keepdims)
    T.mean = lambda a, axis=None, keepdims=False: ops.mean(a, axis, keepdims)
    T.max = lambda a, axis=None, keepdims=False: ops.max(a, axis, keepdims)
    T.reshape = lambda a, *shape: ops.reshape(a, *shape)
    T.transpose = lambda a, *axes: ops.transpose(a, *axes)
    T.exp = lambda a: ops.exp(a)
    T.log = lambda a: ops.log(a)
    T.sqrt = lambda a: ops.sqrt(a)
    T.tanh = lambda a: ops.tanh(a)
    T.relu = lambda a: ops.relu(a)
    T.gelu = lambda a: ops.gelu(a)
    T.softmax = lambda a, axis=-1: ops.softmax(a, axis)
    T.log_softmax = lambda a, axis=-1: ops.log_softmax(a, axis)


_wire_tensor_methods()

# ops.sum / ops.max shadow builtins inside ops only; export them under clear names.
sum_ = ops.sum
max_ = ops.max

__all__ = [
    "Tensor", "Parameter", "no_grad", "is_grad_enabled", "ops", "functional",
    "add", "sub", "mul", "div", "neg", "matmul", "sum_", "mean", "max_", "reshape",
    "transpose", "getitem", "concatenate", "exp", "log", "sqrt", "tanh", "relu", "gelu",
    "softmax", "log_softmax", "linear", "cross_entropy", "layer_norm", "embedding",
    "dropout", "causal_mask_fill", "causal_self_attention", "causal_self_attention_qkv",
]

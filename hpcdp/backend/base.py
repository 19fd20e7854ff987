"""The backend seam: the primitives every op of hpcdp's autograd is built from.

autograd/ never touches numpy or numba.cuda directly for math: it calls these
methods on ``tensor.backend``. ``cpu`` implements them with NumPy/BLAS and
``numba.njit``; ``cuda`` with numba.cuda kernels on device arrays. A model written
against autograd runs on either without change.

Conventions (both backends):
- Arrays are the backend's native arrays (``numpy.ndarray`` on cpu, numba
  ``DeviceNDArray`` on cuda). Every primitive returns a new C-contiguous array
  unless it says "in place".
- Shapes follow NumPy broadcasting. ``axis`` may be an int, a tuple or None.
- Index arrays (targets, token ids) are int64 on the backend's device.
- Elementwise binary primitives (add, sub, mul, div) accept a Python scalar for
  either operand; the result keeps the array operand's dtype.
- Backward primitives take the saved forward values they need and return the
  gradient(s) of the inputs, already reduced to the inputs' shapes where noted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class Backend(ABC):
    name: str = "abstract"

    # -- data movement ----------------------------------------------------
    @abstractmethod
    def asarray(self, x, dtype=None):
        """Host array / array-like -> backend array (copy if it must)."""

    @abstractmethod
    def to_numpy(self, x):
        """Backend array -> numpy.ndarray (a host copy on cuda)."""

    @abstractmethod
    def zeros(self, shape, dtype): ...

    @abstractmethod
    def empty(self, shape, dtype): ...

    @abstractmethod
    def copy_(self, dst, src):
        """In place: dst[...] = src (same shape)."""

    @abstractmethod
    def fill_(self, dst, value):
        """In place: dst[...] = value (a Python scalar); used by zero_grad."""

    @abstractmethod
    def add_(self, dst, src):
        """In place: dst += src (src broadcastable to dst); how backward
        accumulates into existing ``.grad`` arrays (views of the flat grad buffer)."""

    # -- memory (the allocation side of the seam: backend/memory.py) ---------
    @property
    def memory(self):
        """This backend's :class:`~hpcdp.backend.memory.MemoryTracker` (per process)."""
        tracker = self.__dict__.get("_memory")
        if tracker is None:
            from .memory import MemoryTracker
            tracker = self.__dict__["_memory"] = MemoryTracker()
        return tracker

    def alloc(self, shape, dtype, tag: str, zero: bool = False):
        """A new array counted under ``tag`` ("params", "grads", "optim", "working")
        until it is freed (dropping the last reference releases it)."""
        a = self.zeros(shape, dtype) if zero else self.empty(shape, dtype)
        return self.memory.track(a, tag)

    @abstractmethod
    def flat_view(self, flat, offset, shape):
        """A view (aliasing, no copy) of ``flat[offset:offset+prod(shape)]`` with
        ``shape``; how FlatParams hands out per-parameter data/grad arrays."""

    # -- shape ------------------------------------------------------------
    @abstractmethod
    def reshape(self, x, shape): ...

    @abstractmethod
    def transpose(self, x, axes):
        """Permute axes; returns a contiguous array."""

    @abstractmethod
    def getitem(self, x, index):
        """Basic slicing (ints, slices); returns a contiguous array."""

    @abstractmethod
    def setitem_add(self, dst, index, src):
        """In place: dst[index] += src (gradient of getitem)."""

    @abstractmethod
    def concatenate(self, xs, axis): ...

    @abstractmethod
    def sum_to_shape(self, x, shape):
        """Sum ``x`` over broadcast axes so the result has ``shape`` (unbroadcast)."""

    @abstractmethod
    def broadcast_to(self, x, shape):
        """A new contiguous array: ``x`` broadcast to ``shape`` (gradient of sum)."""

    # -- elementwise ------------------------------------------------------
    @abstractmethod
    def add(self, a, b): ...

    @abstractmethod
    def sub(self, a, b): ...

    @abstractmethod
    def mul(self, a, b): ...

    @abstractmethod
    def div(self, a, b): ...

    @abstractmethod
    def neg(self, a): ...

    @abstractmethod
    def equal(self, a, b):
        """1.0 where a == b else 0.0, in a's dtype, broadcasting (gradient of max)."""

    @abstractmethod
    def exp(self, a): ...

    @abstractmethod
    def log(self, a): ...

    @abstractmethod
    def sqrt(self, a): ...

    @abstractmethod
    def tanh(self, a): ...

    @abstractmethod
    def relu(self, a): ...

    @abstractmethod
    def relu_backward(self, x, gy): ...

    @abstractmethod
    def gelu(self, x, mode="tanh"):
        """GELU. ``mode="tanh"``: the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi)
        (x + 0.044715 x^3))) (GPT-2's, PyTorch's approximate='tanh'); ``"exact"``:
        0.5 x (1 + erf(x / sqrt(2))) (PyTorch's default)."""

    @abstractmethod
    def gelu_backward(self, x, gy, mode="tanh"): ...

    @abstractmethod
    def dropout_mask(self, shape, p, *, seed, step, layer, samples):
        """float32 mask of {0, 1/(1-p)} values. Row b (axis 0) belongs to the sample
        with global index ``samples[b]``; its elements are a pure function of
        (seed, step, layer, samples[b], element index) through Philox4x32-10
        (hpcdp/backend/philox.py), identical on every backend and rank."""

    # -- reductions -------------------------------------------------------
    @abstractmethod
    def sum(self, x, axis=None, keepdims=False): ...

    @abstractmethod
    def max(self, x, axis=None, keepdims=False): ...

    # -- linear algebra ---------------------------------------------------
    @abstractmethod
    def matmul(self, a, b, trans_a=False, trans_b=False):
        """(..., m, k) @ (..., k, n) with broadcasting batch dims; trans_* swap the
        last two axes of that operand first."""

    # -- fused kernels ----------------------------------------------------
    @abstractmethod
    def softmax(self, x):
        """Softmax over the last axis."""

    @abstractmethod
    def softmax_backward(self, y, gy): ...

    @abstractmethod
    def log_softmax(self, x): ...

    @abstractmethod
    def log_softmax_backward(self, y, gy):
        """y is log_softmax(x)."""

    @abstractmethod
    def causal_mask_fill(self, x, value):
        """x[..., i, j] = value where j > i (last two axes); returns a new array."""

    def causal_softmax(self, x, scale):
        """softmax(x * scale) over the last axis with x[..., i, j] for j > i left out
        (probability 0): attention's scale, causal mask and softmax. This default
        composes the primitives; a backend may fuse them."""
        return self.softmax(self.causal_mask_fill(self.mul(x, scale), float("-inf")))

    def causal_softmax_backward(self, y, gy, scale):
        """The gradient of :meth:`causal_softmax` with respect to x, y its output."""
        return self.mul(self.causal_mask_fill(self.softmax_backward(y, gy), 0.0), scale)

    @abstractmethod
    def cross_entropy(self, logits, targets, ignore_index=None):
        """Mean negative log-likelihood of int targets over rows of (N, C) logits.
        Returns (loss as a 0-d array, probs) where probs are kept for backward.
        ``ignore_index``: rows whose target equals it are left out and the mean is
        over the other rows (PyTorch's ignore_index); no row counted gives loss 0."""

    @abstractmethod
    def cross_entropy_backward(self, probs, targets, gscale, ignore_index=None):
        """d(mean loss)/d(logits) * gscale (a Python float or a 0-d backend array);
        rows left out by ``ignore_index`` get zero gradient."""

    @abstractmethod
    def layernorm(self, x, weight, bias, eps):
        """Over the last axis. Returns (y, mean, rstd)."""

    @abstractmethod
    def layernorm_backward(self, gy, x, weight, mean, rstd):
        """Returns (gx, gweight, gbias)."""

    def layernorm_backward_add(self, gy, x, weight, mean, rstd, gres):
        """As :meth:`layernorm_backward`, with ``gres`` (None, or an array of x's
        shape: the gradient that reached x by another path, e.g. the residual stream)
        added into the input gradient. This default composes; a backend may fuse
        the add into the backward's pass."""
        gx, gw, gb = self.layernorm_backward(gy, x, weight, mean, rstd)
        return (gx if gres is None else self.add(gres, gx)), gw, gb

    def bias_residual_add_(self, z, bias, res):
        """In place: z += bias (None: no bias; broadcast over rows), then z += res
        (z's shape): a linear layer's bias and a residual stream added into its
        output. This default composes; a backend may do it in one pass."""
        if bias is not None:
            self.add_(z, bias)
        self.add_(z, res)

    @abstractmethod
    def embedding(self, table, ids):
        """table[ids] for int ids of any shape."""

    @abstractmethod
    def embedding_backward(self, gy, ids, num_embeddings):
        """Dense (num_embeddings, dim) gradient; repeated ids accumulate;
        deterministic (no floating-point atomics)."""

    # -- optimizer updates on flat buffers (all in place) ------------------
    @abstractmethod
    def sgd_update(self, param, grad, momentum_buf, lr, momentum, weight_decay, nesterov):
        """PyTorch SGD semantics: d = g + wd*p; buf = momentum*buf + d;
        d = d + momentum*buf if nesterov else buf; p -= lr*d. ``momentum_buf`` may be
        None when momentum == 0."""

    @abstractmethod
    def adamw_update(self, param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step):
        """PyTorch AdamW semantics (decoupled decay p *= 1 - lr*wd, bias-corrected
        moments); ``step`` is 1-based."""

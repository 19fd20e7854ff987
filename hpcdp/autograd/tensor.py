"""Tensor, Parameter, no_grad and the reverse-mode backward pass.

A Tensor wraps one backend array (``.data``) and, when it was produced by an op
while grad mode is on and some input requires grad, a backward closure plus its
parent tensors. The graph is the tape: nothing else is recorded.

Backward (``Tensor.backward``):
1. Walk the graph from the root, collect the op nodes and count, per leaf that
   requires grad, how many edges (uses) point at it.
2. Process op nodes in decreasing creation order (``_seq``). Creation order is a
   valid topological order, and its reverse is the reverse order of use, so
   grad-ready hooks fire in reverse order of use (what a DDP bucketer wants).
3. Gradients of intermediate nodes live in a dict only while needed; a leaf's
   gradient is added into ``leaf.grad`` **in place** when it exists (parameters'
   grads are views of the flat grad buffer; accumulation over micro-batches relies
   on this), else assigned as a fresh copy.
4. Each time a use of a leaf is processed its count drops by one; at zero the
   leaf's gradient is final and its grad-ready hooks fire.
5. A non-leaf may carry pre-backward hooks (``register_pre_backward_hook``): they
   run when backward reaches that node, just before its backward closure. Hooked
   on a block's output, this is the moment before any of the block's backward ops
   (FSDP2's ``_register_pre_backward_hook(output)``): a sharded strategy gathers
   the block's parameters there. Backward closures read ``w.data`` when they run,
   not at forward time, so storage re-bound in between is what they see.
6. A backward closure with an ``accumulates`` attribute (a parent's position i) is
   called as ``backward(gy, pending)``: ``pending`` is the gradient already gathered
   for non-leaf parent i (or None), taken out of the engine's dict, and the closure
   returns parent i's gradient with it added. A fused kernel adds it in its own pass
   (LayerNorm adds the residual stream's gradient) instead of the engine's extra add.
The graph is freed as it is consumed (saved arrays are released early), so a second
backward through the same graph raises, unless ``retain_graph=True``.
"""

from __future__ import annotations

import itertools
from functools import update_wrapper

from ..backend import Backend, get_backend

_SEQ = itertools.count(1)  # creation counter for op results (tape order)


class _GradMode:
    enabled = True


def is_grad_enabled() -> bool:
    return _GradMode.enabled


class _Profiling:
    """The op profiler in effect (an :class:`hpcdp.autograd.profile.OpProfile`) or None.

    Read once per op call (forward) and once per backward pass: the whole cost of
    profiling when it is off."""
    active = None


def active_profile():
    """The :class:`~hpcdp.autograd.profile.OpProfile` recording now, or None."""
    return _Profiling.active


def set_active_profile(profile):
    """Make ``profile`` (or None) the recording op profile; returns the previous one.
    Use :class:`hpcdp.autograd.profile.OpProfile` as a context manager instead."""
    prev, _Profiling.active = _Profiling.active, profile
    return prev


def op(fn):
    """Mark ``fn`` as a differentiable op: while an op profile records, its forward
    call is timed under ``fn.__name__`` (outermost op only: an op that calls another
    counts once). Off: one attribute read, then ``fn`` itself."""
    def call(*args, **kwargs):
        prof = _Profiling.active
        if prof is None:
            return fn(*args, **kwargs)
        return prof.forward(fn, args, kwargs)
    update_wrapper(call, fn)
    return call


class no_grad:
    """Context manager: ops inside record no graph (inference, optimizer math)."""

    def __enter__(self):
        self._prev = _GradMode.enabled
        _GradMode.enabled = False
        return self

    def __exit__(self, *exc):
        _GradMode.enabled = self._prev
        return False


def _resolve_backend(backend) -> Backend:
    if backend is None:
        return get_backend("cpu")
    if isinstance(backend, str):
        return get_backend(backend)
    return backend


def _freed(_gy):
    raise RuntimeError(
        "backward through a graph that was already consumed by an earlier backward(); "
        "run the forward again, or pass retain_graph=True to the first backward()")


class Tensor:
    """An array plus what is needed to differentiate through it.

    ``Tensor(data, requires_grad=False, backend="cpu", dtype=None)``: ``data`` may be
    a backend array or anything ``backend.asarray`` takes. Without ``dtype``, data
    that has a dtype keeps it (float64 for gradient checks) and plain Python data
    becomes float32.
    """

    __slots__ = ("data", "grad", "requires_grad", "backend", "_parents", "_backward",
                 "_seq", "_hooks", "name", "__weakref__")
    __array_priority__ = 1000  # numpy scalars on the left defer to our __radd__ etc.

    def __init__(self, data, requires_grad=False, backend=None, dtype=None):
        be = _resolve_backend(backend)
        if isinstance(data, Tensor):
            data = data.data
        if dtype is None and not hasattr(data, "dtype"):
            dtype = "float32"
        self.data = be.asarray(data, dtype)
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self.backend = be
        self._parents = ()
        self._backward = None
        self._seq = 0
        self._hooks = None
        self.name = None

    # -- properties -----------------------------------------------------------
    @property
    def shape(self):
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self):
        return len(self.data.shape)

    @property
    def size(self):
        return self.data.size

    @property
    def is_leaf(self):
        return self._backward is None

    def item(self):
        return self.backend.to_numpy(self.data).item()

    def numpy(self):
        return self.backend.to_numpy(self.data)

    def detach(self):
        return Tensor(self.data, backend=self.backend)

    def __repr__(self):
        rg = ", requires_grad=True" if self.requires_grad else ""
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}{rg})"

    def __len__(self):
        return self.data.shape[0]

    # -- backward ---------------------------------------------------------------
    def register_pre_backward_hook(self, fn):
        """Call ``fn(tensor)`` when backward reaches this (non-leaf) tensor, before
        its backward closure runs; once per backward. Returns a handle with
        ``.remove()``. Leaves take grad-ready hooks instead (Parameter)."""
        if self._backward is None:
            raise RuntimeError("register_pre_backward_hook needs a tensor produced by an op "
                               "that requires grad (a leaf has no backward to precede)")
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(fn)
        return _HookHandle(self, fn)

    def backward(self, grad=None, retain_graph=False):
        """Accumulate d(self)/d(leaf) into every leaf's ``.grad`` (see module doc)."""
        run_backward(self, grad, retain_graph)


class Parameter(Tensor):
    """A leaf Tensor that requires grad and can carry grad-ready hooks."""

    __slots__ = ()

    def __init__(self, data, backend=None, dtype=None, name=None):
        super().__init__(data, requires_grad=True, backend=backend, dtype=dtype)
        self.name = name

    def register_grad_ready_hook(self, fn):
        """Call ``fn(param)`` once per backward, when this parameter's gradient is
        final (all its uses in the graph processed). Returns a handle with
        ``.remove()``. A parameter that the graph never uses gets no call."""
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(fn)
        return _HookHandle(self, fn)

    def clear_grad_ready_hooks(self):
        self._hooks = None


class _HookHandle:
    def __init__(self, param, fn):
        self._param, self._fn = param, fn

    def remove(self):
        hooks = self._param._hooks
        if hooks and self._fn in hooks:
            hooks.remove(self._fn)


def make_result(data, backend, parents, backward):
    """Wrap an op's output array; record the graph edge only when it is needed.

    This is the hot path of every op: no conversions, no checks.
    """
    t = Tensor.__new__(Tensor)
    t.data = data
    t.grad = None
    t.backend = backend
    t._hooks = None
    t.name = None
    if _GradMode.enabled:
        for p in parents:
            if p.requires_grad:
                t.requires_grad = True
                t._parents = parents
                t._backward = backward
                t._seq = next(_SEQ)
                return t
    t.requires_grad = False
    t._parents = ()
    t._backward = None
    t._seq = 0
    return t


def _accumulate_leaf(leaf, g):
    be = leaf.backend
    if tuple(g.shape) != tuple(leaf.data.shape):
        raise RuntimeError(f"internal: gradient of shape {tuple(g.shape)} for a leaf of "
                           f"shape {tuple(leaf.data.shape)}")
    if leaf.grad is None:
        # A fresh copy: g may alias another tensor's gradient (add passes gy through).
        leaf.grad = be.empty(leaf.data.shape, leaf.data.dtype)
        be.copy_(leaf.grad, g)
    else:
        be.add_(leaf.grad, g)


def _fire(leaf):
    if leaf._hooks:
        for fn in tuple(leaf._hooks):
            fn(leaf)


def run_backward(root, grad=None, retain_graph=False):
    if not root.requires_grad:
        raise RuntimeError("backward() on a tensor that does not require grad (no input "
                           "of the computation requires grad, or it ran under no_grad)")
    be = root.backend
    if grad is None:
        if root.data.size != 1:
            raise RuntimeError(f"backward() without grad needs a scalar (one-element) "
                               f"tensor, got shape {root.shape}; pass grad=")
        grad = be.broadcast_to(be.asarray(1.0, root.data.dtype), root.data.shape)
    else:
        grad = be.asarray(grad.data if isinstance(grad, Tensor) else grad, root.data.dtype)
        if tuple(grad.shape) != root.shape:
            raise ValueError(f"backward(): grad shape {tuple(grad.shape)} does not match "
                             f"tensor shape {root.shape}")

    if root._backward is None:  # a leaf: d(root)/d(root) = grad
        _accumulate_leaf(root, grad)
        _fire(root)
        return

    # 1. collect op nodes; count uses (edges) per leaf
    nodes, uses, seen, stack = [], {}, set(), [root]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        nodes.append(t)
        for p in t._parents:
            if p.requires_grad:
                if p._backward is None:
                    uses[id(p)] = uses.get(id(p), 0) + 1
                elif id(p) not in seen:
                    stack.append(p)

    # 2. reverse creation order = reverse topological order = reverse order of use
    nodes.sort(key=lambda n: n._seq, reverse=True)
    grads = {id(root): grad}
    prof = _Profiling.active
    if prof is not None:  # profiling: the same loop, each node timed
        prof.backward_pass(nodes, grads, uses, be, retain_graph, _backward_node)
        return
    for node in nodes:
        _backward_node(node, grads, uses, be, retain_graph)


def _backward_node(node, grads, uses, be, retain_graph):
    """Backward of one op node: its pre-backward hooks, its closure, its parents'
    gradients (leaves accumulated and maybe their hooks fired)."""
    if node._hooks:  # pre-backward hooks of this non-leaf (e.g. a unit's output)
        for fn in tuple(node._hooks):
            fn(node)
    g = grads.pop(id(node), None)
    bw, parents = node._backward, node._parents
    if g is None:
        pgrads = (None,) * len(parents)
    else:
        acc = getattr(bw, "accumulates", None)
        if acc is None:
            pgrads = bw(g)
        else:  # the closure adds parent acc's pending gradient itself (see 6. above)
            p = parents[acc]
            pgrads = bw(g, grads.pop(id(p), None) if p._backward is not None else None)
    # parents in reverse: within one op (x @ w + b) the later-registered b is
    # final before w, so hooks fire in reverse registration (layout) order
    for i in range(len(parents) - 1, -1, -1):
        p, pg = parents[i], pgrads[i]
        if not p.requires_grad:
            continue
        if p._backward is None:  # leaf: accumulate, then maybe fire hooks
            if pg is not None:
                _accumulate_leaf(p, pg)
            left = uses[id(p)] - 1
            uses[id(p)] = left
            if left == 0:
                _fire(p)
        elif pg is not None:
            prev = grads.get(id(p))
            # out of place: either operand may alias a live array
            grads[id(p)] = pg if prev is None else be.add(prev, pg)
    if not retain_graph:
        node._backward = _freed
        node._parents = ()
        node._hooks = None

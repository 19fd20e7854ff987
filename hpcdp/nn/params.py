"""FlatParams: every parameter of a model in one flat data buffer and one flat grad
buffer, plus a layout (name -> offset, shape) in registration (forward) order.

Strategies, optimizers and checkpoints see only this: they move and update
``flat.data`` / ``flat.grad`` (or a shard of them, cut with ``hpcdp.shard``) and never
need to know the model. Each ``Parameter``'s ``.data`` and ``.grad`` are views into
the flat buffers, so writing into the flat buffer (allreduce result, optimizer
update, checkpoint restore) is immediately what the model computes with.

Never rebind ``flat.data`` or ``flat.grad``: copy into them (``backend.copy_``),
otherwise the parameter views would point at the old buffers.

:class:`ParamRegistry` is how models create parameters: layers ask it for
initialized parameters (host NumPy RNG seeded once, draws in registration order),
then ``finalize()`` copies everything into one backend buffer (one host->device
transfer on cuda) and binds the views.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..autograd.tensor import Parameter
from ..backend import get_backend


@dataclass(frozen=True)
class ParamSpec:
    name: str
    offset: int
    shape: tuple
    size: int


def _unbound_parameter(name, backend):
    """A Parameter whose arrays are bound later by FlatParams."""
    p = Parameter.__new__(Parameter)
    p.data = p.grad = None
    p.requires_grad = True
    p.backend = backend
    p._parents, p._backward, p._seq, p._hooks = (), None, 0, None
    p.name = name
    return p


class FlatParams:
    """One dtype, one backend; see the module docstring."""

    def __init__(self, entries, *, dtype="float32", device="cpu"):
        """``entries``: list of ``(name, host_array, parameter_or_None)`` in
        registration order. Given parameters are re-bound to views (identity kept)."""
        be = get_backend(device)
        self.backend, self.device = be, device
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
            raise ValueError(f"FlatParams: dtype must be a float type, got {self.dtype}")
        layout, seen, off = [], set(), 0
        for name, arr, _ in entries:
            if name in seen:
                raise ValueError(f"FlatParams: parameter name {name!r} registered twice")
            seen.add(name)
            shape = tuple(int(s) for s in np.shape(arr))
            size = int(np.prod(shape, dtype=np.int64))
            layout.append(ParamSpec(name, off, shape, size))
            off += size
        host = np.empty(off, dtype=self.dtype)
        for spec, (_, arr, _) in zip(layout, entries):
            host[spec.offset:spec.offset + spec.size] = np.asarray(arr).reshape(-1)
        self.layout = layout
        self.data = be.asarray(host, self.dtype)
        self.grad = be.zeros(off, self.dtype)
        self.params = {}
        for spec, (_, _, p) in zip(layout, entries):
            if p is None:
                p = _unbound_parameter(spec.name, be)
            p.data = be.flat_view(self.data, spec.offset, spec.shape)
            p.grad = be.flat_view(self.grad, spec.offset, spec.shape)
            p.name = spec.name
            self.params[spec.name] = p

    @classmethod
    def from_arrays(cls, named, *, dtype="float32", device="cpu"):
        """Build from ``[(name, host_array), ...]`` (e.g. in tests of strategies)."""
        return cls([(n, a, None) for n, a in named], dtype=dtype, device=device)

    @property
    def numel(self) -> int:
        return self.layout[-1].offset + self.layout[-1].size if self.layout else 0

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def zero_grad(self) -> None:
        """In place: views stay valid."""
        self.backend.fill_(self.grad, 0.0)

    def named_views(self):
        """``[(name, data_view, grad_view), ...]`` in layout order."""
        return [(s.name, self.params[s.name].data, self.params[s.name].grad)
                for s in self.layout]

    def spec(self, name) -> ParamSpec:
        for s in self.layout:
            if s.name == name:
                return s
        raise KeyError(f"no parameter named {name!r}; have {[s.name for s in self.layout]}")

    def __repr__(self):
        return (f"FlatParams({len(self.layout)} tensors, {self.numel} elements, "
                f"{self.dtype}, {self.device})")


class ParamRegistry:
    """Creates initialized parameters in registration order for one model."""

    def __init__(self, *, seed, dtype="float32", device="cpu"):
        self.rng = np.random.default_rng(seed)
        self.seed = int(seed)
        self.dtype, self.device = dtype, device
        self.backend = get_backend(device)
        self._entries = []
        self._streams = 0
        self.flat = None

    def _add(self, name, host):
        if self.flat is not None:
            raise RuntimeError(f"parameter {name!r} registered after finalize()")
        p = _unbound_parameter(name, self.backend)
        self._entries.append((name, host, p))
        return p

    # Draws are float64 and then cast, so float32 and float64 models start equal.
    def normal(self, name, shape, std):
        return self._add(name, self.rng.normal(0.0, std, size=shape))

    def uniform(self, name, shape, bound):
        return self._add(name, self.rng.uniform(-bound, bound, size=shape))

    def constant(self, name, shape, value):
        return self._add(name, np.full(shape, float(value)))

    def next_stream(self) -> int:
        """A distinct id per random stream (dropout layer), in construction order."""
        self._streams += 1
        return self._streams

    def finalize(self) -> FlatParams:
        self.flat = FlatParams(self._entries, dtype=self.dtype, device=self.device)
        self._entries = []
        return self.flat

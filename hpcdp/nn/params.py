"""FlatParams: every parameter of a model in one flat data buffer and one flat grad
buffer, plus a layout (name -> offset, shape) in registration (forward) order.

Strategies, optimizers and checkpoints see only this: they move and update
``flat.data`` / ``flat.grad`` (or a shard of them, cut with ``hpcdp.shard``) and never
need to know the model. Each ``Parameter``'s ``.data`` and ``.grad`` are views into
the flat buffers, so writing into the flat buffer (allreduce result, optimizer
update, checkpoint restore) is immediately what the model computes with.

Storage is bound explicitly. By default (a replicated strategy) ``flat.data`` and
``flat.grad`` hold everything and the parameters are views of them: copy into them
(``backend.copy_``) rather than assigning new arrays, and DDP reduces in place on
views of ``flat.grad`` (zero copy). A sharded strategy instead binds the storage of
one unit at a time: ``bind(offset, size, data=buf)`` points the parameters of that
range at views of ``buf`` (a gathered unit), ``release(offset, size, data=True)``
drops them (``.data`` becomes None), and likewise ``grad=`` for gradient storage.
``flat.data`` / ``flat.grad`` are None while no full buffer exists
(``drop_full_data()`` / ``drop_full_grad()``).

:class:`ParamRegistry` is how models create parameters: layers register each
parameter with an init recipe (:class:`Init`: one random stream per parameter,
seeded by the model seed and the parameter's name), then ``finalize(storage)``
builds the FlatParams, allocating the full buffers a replicated strategy needs, or
none (``storage=()``) so a sharded strategy makes only its own shards.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from ..autograd.tensor import Parameter
from ..backend import get_backend
from .streams import RandomStreams


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


class Init:
    """How one parameter's initial values are made, without making them yet.

    Every parameter draws from its own stream, seeded by (model seed, parameter
    name): its values do not depend on the other parameters, on registration order
    or on which rank asks, so a rank can build just the parameters it owns (ZeRO-3).
    Draws are float64 and then cast, so float32 and float64 models start equal.
    """

    __slots__ = ("kind", "shape", "arg", "seed", "name")

    def __init__(self, kind, shape, arg, seed, name):
        self.kind, self.shape, self.arg = kind, tuple(int(s) for s in shape), float(arg)
        self.seed, self.name = int(seed), name

    def values(self) -> np.ndarray:
        if self.kind == "constant":
            return np.full(self.shape, self.arg)
        rng = np.random.default_rng([self.seed, zlib.crc32(self.name.encode())])
        if self.kind == "normal":
            return rng.normal(0.0, self.arg, size=self.shape)
        return rng.uniform(-self.arg, self.arg, size=self.shape)


class FlatParams:
    """One dtype, one backend; see the module docstring."""

    def __init__(self, entries, *, dtype="float32", device="cpu", storage=("data", "grad")):
        """``entries``: list of ``(name, source, parameter_or_None)`` in registration
        order; ``source`` is a host array or an :class:`Init`. Given parameters are
        re-bound to views (identity kept). ``storage``: which full buffers to allocate
        now ("data", "grad"); the others stay None (see :meth:`materialize`)."""
        be = get_backend(device)
        self.backend, self.device = be, device
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
            raise ValueError(f"FlatParams: dtype must be a float type, got {self.dtype}")
        layout, seen, off = [], set(), 0
        for name, src, _ in entries:
            if name in seen:
                raise ValueError(f"FlatParams: parameter name {name!r} registered twice")
            seen.add(name)
            shape = src.shape if isinstance(src, Init) else tuple(int(x) for x in np.shape(src))
            size = int(np.prod(shape, dtype=np.int64))
            layout.append(ParamSpec(name, off, shape, size))
            off += size
        self.layout = layout
        self._sources = {spec.name: src for spec, (_, src, _) in zip(layout, entries)}
        self.data = self.grad = None
        self.params = {}
        for spec, (_, _, p) in zip(layout, entries):
            if p is None:
                p = _unbound_parameter(spec.name, be)
            p.name = spec.name
            self.params[spec.name] = p
        # Units (hpcdp.nn.units): set by a model; plain FlatParams have none.
        self.units = None
        self.units_error = "built from plain arrays (no model), so it has no units"
        self.materialize(storage)

    @classmethod
    def from_arrays(cls, named, *, dtype="float32", device="cpu"):
        """Build from ``[(name, host_array), ...]`` (e.g. in tests of strategies)."""
        return cls([(n, a, None) for n, a in named], dtype=dtype, device=device)

    def init_values(self, offset: int, size: int) -> np.ndarray:
        """The initial values of ``[offset, offset + size)`` as a host array of this
        dtype, made from the parameters' sources (each overlapping parameter is drawn
        whole and cut: a transient of one parameter, never of the whole model)."""
        out = np.empty(size, dtype=self.dtype)
        end = offset + size
        for spec in self.layout:
            lo, hi = max(spec.offset, offset), min(spec.offset + spec.size, end)
            if hi <= lo:
                continue
            src = self._sources[spec.name]
            vals = src.values() if isinstance(src, Init) else np.asarray(src)
            out[lo - offset:hi - offset] = vals.reshape(-1)[lo - spec.offset:hi - spec.offset]
        return out

    def materialize(self, storage=("data", "grad")) -> None:
        """Allocate the full buffers named in ``storage`` that do not exist yet
        ("data": initial values, tag "params"; "grad": zeros, tag "grads") and bind
        every parameter to views of them. What a replicated strategy needs; a
        sharded one materializes only its shards."""
        bad = set(storage) - {"data", "grad"}
        if bad:
            raise ValueError(f"FlatParams.materialize: unknown storage {sorted(bad)}; use 'data', 'grad'")
        be, n = self.backend, self.numel
        if "data" in storage and self.data is None:
            self.data = be.alloc(n, self.dtype, "params")
            for spec in self.layout:  # parameter by parameter: no full host copy
                be.copy_(be.flat_view(self.data, spec.offset, (spec.size,)),
                         self.init_values(spec.offset, spec.size))
            self.bind(0, n, data=self.data)
        if "grad" in storage and self.grad is None:
            self.grad = be.alloc(n, self.dtype, "grads", zero=True)
            self.bind(0, n, grad=self.grad)

    @property
    def numel(self) -> int:
        return self.layout[-1].offset + self.layout[-1].size if self.layout else 0

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def zero_grad(self) -> None:
        """In place: views stay valid. No-op while no full grad buffer exists."""
        if self.grad is not None:
            self.backend.fill_(self.grad, 0.0)

    # -- explicit storage binding (sharded strategies) -------------------------------
    def specs_in(self, offset: int, size: int) -> list:
        """Layout entries inside ``[offset, offset + size)``; a parameter that
        straddles the range's edge is an error (bind whole parameters only)."""
        end = offset + size
        out = []
        for spec in self.layout:
            lo, hi = spec.offset, spec.offset + spec.size
            if lo >= offset and hi <= end:
                out.append(spec)
            elif lo < end and hi > offset and spec.size:
                raise ValueError(f"FlatParams: range [{offset}, {end}) cuts parameter "
                                 f"{spec.name} [{lo}, {hi}); bind whole parameters (a unit)")
        return out

    def bind(self, offset: int, size: int, *, data=None, grad=None) -> None:
        """Point the parameters in ``[offset, offset + size)`` at views of ``data``
        and/or ``grad`` (1-D arrays of ``size`` elements holding that range)."""
        be = self.backend
        for buf, what in ((data, "data"), (grad, "grad")):
            if buf is not None and int(buf.shape[0]) != size:
                raise ValueError(f"FlatParams.bind: {what} has {buf.shape[0]} elements, range {size}")
        for spec in self.specs_in(offset, size):
            p = self.params[spec.name]
            if data is not None:
                p.data = be.flat_view(data, spec.offset - offset, spec.shape)
            if grad is not None:
                p.grad = be.flat_view(grad, spec.offset - offset, spec.shape)

    def release(self, offset: int, size: int, *, data: bool = False, grad: bool = False) -> None:
        """Drop the parameters' views of ``[offset, offset + size)`` (``.data`` and/or
        ``.grad`` become None) so the storage they pointed at can be freed."""
        for spec in self.specs_in(offset, size):
            p = self.params[spec.name]
            if data:
                p.data = None
            if grad:
                p.grad = None

    def drop_full_data(self) -> None:
        """Forget the full data buffer and every view of it (sharded parameters)."""
        self.release(0, self.numel, data=True)
        self.data = None

    def drop_full_grad(self) -> None:
        """Forget the full grad buffer and every view of it (sharded gradients)."""
        self.release(0, self.numel, grad=True)
        self.grad = None

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
    """Records initialized parameters in registration order for one model; the
    values are made when storage is materialized (see :class:`Init`)."""

    def __init__(self, *, seed, dtype="float32", device="cpu"):
        self.seed = int(seed)
        self.dtype, self.device = dtype, device
        self.backend = get_backend(device)
        self._entries = []
        self.streams = RandomStreams(self.seed)  # the model's draw context (nn/streams.py)
        self.flat = None

    def _add(self, name, kind, shape, arg):
        if self.flat is not None:
            raise RuntimeError(f"parameter {name!r} registered after finalize()")
        p = _unbound_parameter(name, self.backend)
        self._entries.append((name, Init(kind, shape, arg, self.seed, name), p))
        return p

    def normal(self, name, shape, std):
        return self._add(name, "normal", shape, std)

    def uniform(self, name, shape, bound):
        return self._add(name, "uniform", shape, bound)

    def constant(self, name, shape, value):
        return self._add(name, "constant", shape, value)

    def next_stream(self) -> int:
        """A distinct id per random stream (dropout layer), in construction order."""
        return self.streams.new_layer()

    def finalize(self, storage=("data", "grad")) -> FlatParams:
        """The model's FlatParams; ``storage`` as in :meth:`FlatParams.materialize`."""
        self.flat = FlatParams(self._entries, dtype=self.dtype, device=self.device, storage=storage)
        self._entries = []
        return self.flat

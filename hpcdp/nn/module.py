"""Module: the thin base of layers and models (call -> forward, train/eval mode,
forward hooks).

Parameters are not owned here: they come from a ParamRegistry and live in the
model's FlatParams (see params.py). ``parameters()`` finds the ones a module uses
(its attributes, recursively), which is how :mod:`hpcdp.nn.units` maps a block to
its range of the flat buffer.

Forward hooks are the forward side of the strategy seam (FSDP2's pre/post-forward):
``register_forward_pre_hook(fn)`` calls ``fn(module, args)`` before ``forward``;
``register_forward_hook(fn)`` calls ``fn(module, args, output)`` after it. A module
without hooks pays one attribute test per call.
"""

from __future__ import annotations

from ..autograd.tensor import Parameter


class _ModuleHookHandle:
    def __init__(self, hooks: list, fn):
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


class Module:
    training = True
    _pre_hooks: list | None = None    # per instance once a hook is registered
    _post_hooks: list | None = None

    def __call__(self, *args, **kwargs):
        if self._pre_hooks:
            for fn in tuple(self._pre_hooks):
                fn(self, args)
        out = self.forward(*args, **kwargs)
        if self._post_hooks:
            for fn in tuple(self._post_hooks):
                fn(self, args, out)
        return out

    def forward(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def register_forward_pre_hook(self, fn):
        """``fn(module, args)`` before every ``forward``; returns a handle with ``remove()``."""
        if self._pre_hooks is None:
            self._pre_hooks = []
        self._pre_hooks.append(fn)
        return _ModuleHookHandle(self._pre_hooks, fn)

    def register_forward_hook(self, fn):
        """``fn(module, args, output)`` after every ``forward``; returns a handle."""
        if self._post_hooks is None:
            self._post_hooks = []
        self._post_hooks.append(fn)
        return _ModuleHookHandle(self._post_hooks, fn)

    def children(self):
        for v in vars(self).values():
            if isinstance(v, Module):
                yield v
            elif isinstance(v, (list, tuple)):
                yield from (m for m in v if isinstance(m, Module))

    def modules(self):
        yield self
        for c in self.children():
            yield from c.modules()

    def parameters(self):
        """Every Parameter this module or a module below it holds (each once)."""
        seen = set()
        for m in self.modules():
            for v in vars(m).values():
                if isinstance(v, Parameter) and id(v) not in seen:
                    seen.add(id(v))
                    yield v

    def train(self, mode: bool = True):
        """Training mode (dropout active) for this module and all below it."""
        for m in self.modules():
            m.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

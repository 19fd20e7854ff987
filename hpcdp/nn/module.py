"""Module: the thin base of layers and models (call -> forward, train/eval mode).

Parameters are not owned here: they come from a ParamRegistry and live in the
model's FlatParams (see params.py).
"""

from __future__ import annotations


class Module:
    training = True

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

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

    def train(self, mode: bool = True):
        """Training mode (dropout active) for this module and all below it."""
        for m in self.modules():
            m.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

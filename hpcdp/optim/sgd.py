"""SGD with momentum, Nesterov and L2 weight decay on a flat buffer (PyTorch semantics).

``step(param, grad)`` updates ``param`` in place through ``backend.sgd_update``:
``d = g + wd*p; buf = momentum*buf + d; d = d + momentum*buf if nesterov else buf;
p -= lr*d``. The momentum buffer is sized to the array the optimizer is given, so
a strategy may hand it the whole flat buffer or only this rank's shard.
"""

from __future__ import annotations

from hpcdp.backend import get_backend

from .state import FlatState


class SGD(FlatState):
    kind = "sgd"

    def __init__(self, size: int | None = None, *, lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False,
                 dtype: str = "float32", device: str = "cpu"):
        if nesterov and momentum == 0.0:
            raise ValueError("SGD: nesterov needs momentum > 0")
        self.lr, self.momentum = float(lr), float(momentum)
        self.weight_decay, self.nesterov = float(weight_decay), bool(nesterov)
        super().__init__(("momentum_buf",) if momentum else (), size, dtype, get_backend(device))

    def _update(self, param, grad, state, weight_decay) -> None:
        self.backend.sgd_update(param, grad, state.get("momentum_buf"), self.lr,
                                self.momentum, weight_decay, self.nesterov)

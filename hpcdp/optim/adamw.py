"""AdamW (decoupled weight decay, bias-corrected moments) on a flat buffer.

``step(param, grad)`` updates ``param`` in place through ``backend.adamw_update``
(PyTorch semantics): ``p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)``. ``m`` and ``v`` are sized to
the array the optimizer is given (the whole buffer or a shard): 2x its bytes.
"""

from __future__ import annotations

from hpcdp.backend import get_backend

from .state import FlatState


class AdamW(FlatState):
    kind = "adamw"

    def __init__(self, size: int | None = None, *, lr: float, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0,
                 dtype: str = "float32", device: str = "cpu"):
        self.lr = float(lr)
        self.beta1, self.beta2 = (float(b) for b in betas)
        self.eps, self.weight_decay = float(eps), float(weight_decay)
        super().__init__(("m", "v"), size, dtype, get_backend(device))

    def _update(self, param, grad, state, weight_decay) -> None:
        self.backend.adamw_update(param, grad, state["m"], state["v"], self.lr,
                                  self.beta1, self.beta2, self.eps, weight_decay, self.steps)

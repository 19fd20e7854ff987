"""MLP classifier: Linear layers with a fused activation between them, logits out."""

from __future__ import annotations

from ..autograd import Tensor
from ..autograd import functional as F
from .layers import Linear
from .module import Module
from .params import ParamRegistry
from .units import attach_units

ACTIVATIONS = ("relu", "gelu", "tanh")


class MLP(Module):
    """``MLP([784, 1024, 1024, 10], "relu", seed=0)``: float inputs (B, D), logits (B, C)."""

    def __init__(self, sizes, activation="relu", *, gelu="tanh", seed=0, dtype="float32", device="cpu",
                 storage=("data", "grad")):
        sizes = [int(s) for s in sizes]
        if len(sizes) < 2 or min(sizes) < 1:
            raise ValueError(f"MLP sizes must list >= 2 positive widths (input ... classes), "
                             f"got {sizes}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"MLP activation must be one of {ACTIVATIONS}, got {activation!r}")
        if gelu not in F.GELU_MODES:
            raise ValueError(f"MLP gelu must be one of {F.GELU_MODES}, got {gelu!r}")
        self.sizes, self.activation = sizes, activation
        reg = ParamRegistry(seed=seed, dtype=dtype, device=device)
        n = len(sizes) - 1
        self.layers = [Linear(reg, f"fc{i}", sizes[i], sizes[i + 1],
                              activation=activation if i < n - 1 else None, gelu=gelu)
                       for i in range(n)]
        self.flat = reg.finalize(storage)
        attach_units(self, self.flat)
        self.backend = self.flat.backend
        self.dtype = self.flat.dtype

    def unit_modules(self):
        """One unit per layer (there is no root unit: every parameter is in a layer)."""
        return [(f"fc{i}", layer) for i, layer in enumerate(self.layers)]

    def forward(self, x):
        if not isinstance(x, Tensor):
            x = Tensor(self.backend.asarray(x, self.dtype), backend=self.backend)
        if x.ndim != 2 or x.shape[1] != self.sizes[0]:
            raise ValueError(f"MLP input must be (batch, {self.sizes[0]}), got {x.shape}")
        for layer in self.layers:
            x = layer(x)
        return x

    def loss(self, x, y):
        """Scalar mean cross-entropy of int targets y (B,)."""
        return F.cross_entropy(self(x), y)

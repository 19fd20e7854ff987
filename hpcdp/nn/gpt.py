"""GPT-style decoder: token + position embeddings, pre-LN blocks with causal
attention and a GELU MLP, final LayerNorm, tied or untied LM head.

Layout: wte, wpe, ln_f, [lm_head], then the blocks h.0 ... h.{n_layer-1} (the root
unit first, see hpcdp.nn.units). Init (GPT-2): every weight ~ N(0, 0.02), biases 0,
LayerNorm (1, 0); the two residual projections of each block (attn.c_proj, mlp.c_proj) use
0.02 / sqrt(2 * n_layer) so the residual stream's variance does not grow with depth.
"""

from __future__ import annotations

import math

from ..autograd import functional as F
from ..autograd import ops
from .layers import Block, Dropout, Embedding, LayerNorm, Linear
from .module import Module
from .params import ParamRegistry
from .units import attach_units


class GPT(Module):
    """Input int64 ids (B, T) with T <= block_size; logits (B, T, vocab_size)."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, *, tied_head=True,
                 dropout=0.0, gelu="tanh", ignore_index=None, seed=0, dtype="float32", device="cpu",
                 storage=("data", "grad")):
        for k, v in dict(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer,
                         n_head=n_head, n_embd=n_embd).items():
            if int(v) < 1:
                raise ValueError(f"GPT {k} must be >= 1, got {v}")
        if n_embd % n_head:
            raise ValueError(f"GPT n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.vocab_size, self.block_size = int(vocab_size), int(block_size)
        self.n_layer, self.n_head, self.n_embd = int(n_layer), int(n_head), int(n_embd)
        self.tied_head = bool(tied_head)
        if gelu not in F.GELU_MODES:
            raise ValueError(f"GPT gelu must be one of {F.GELU_MODES}, got {gelu!r}")
        self.gelu = gelu
        self.ignore_index = None if ignore_index is None else int(ignore_index)
        reg = ParamRegistry(seed=seed, dtype=dtype, device=device)
        proj_std = 0.02 / math.sqrt(2 * n_layer)
        # The root unit's parameters first, then the blocks: each unit is one
        # contiguous range of the flat buffer (hpcdp.nn.units).
        self.wte = Embedding(reg, "wte", vocab_size, n_embd)
        self.wpe = Embedding(reg, "wpe", block_size, n_embd)
        self.drop = Dropout(reg, dropout)
        self.ln_f = LayerNorm(reg, "ln_f", n_embd)
        self.lm_head = None if tied_head else Linear(reg, "lm_head", n_embd, vocab_size,
                                                     bias=False, std=0.02)
        self.h = [Block(reg, f"h.{i}", n_embd, n_head, proj_std=proj_std, dropout=dropout, gelu=gelu)
                  for i in range(n_layer)]
        self.flat = reg.finalize(storage)
        self.streams = reg.streams  # train_step sets (step, samples) here (nn/streams.py)
        attach_units(self, self.flat)
        self.backend = self.flat.backend
        self.dtype = self.flat.dtype

    def unit_modules(self):
        """The blocks (units); embeddings, ln_f and the head form the root unit."""
        return [(f"h.{i}", block) for i, block in enumerate(self.h)]

    def forward(self, ids):
        ids = ids.data if hasattr(ids, "requires_grad") else ids
        if not hasattr(ids, "shape"):
            ids = self.backend.asarray(ids, "int64")
        if len(ids.shape) != 2:
            raise ValueError(f"GPT input must be int ids (batch, time), got shape {tuple(ids.shape)}")
        b, t = ids.shape
        if t > self.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size {self.block_size}")
        # Positions by lookup (a copy), not a slice of wpe: a view would keep the
        # parameter's storage alive in the graph after a sharded strategy releases it.
        # Token ids are checked against vocab_size; the positions are ours (< block_size).
        x = self.wte(ids) + self.wpe(self._positions(t), check=False)   # (B,T,C) + (T,C)
        x = self.drop(x)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        if self.tied_head:
            x2 = ops.reshape(x, (b * t, self.n_embd))
            logits = ops.matmul(x2, self.wte.weight, trans_b=True)      # (B*T, V)
            return ops.reshape(logits, (b, t, self.vocab_size))
        return self.lm_head(x)

    def _positions(self, t):
        pos = getattr(self, "_pos", None)
        if pos is None or pos.shape[0] < t:
            import numpy as np
            self._pos = pos = self.backend.asarray(np.arange(self.block_size), "int64")
        return pos[:t]

    def loss(self, ids, targets):
        """Scalar mean cross-entropy over the B*T positions whose target is not
        ``ignore_index`` (all of them when it is None); targets int (B, T).

        Padding: pad sequences on the right, give the padded positions any valid
        input id and the target ``ignore_index``. Attention is causal, so a real
        position never attends to the padding after it: no attention mask is needed.
        (Left padding would need one; it is not supported.)"""
        return F.cross_entropy(self(ids), targets, self.ignore_index)
